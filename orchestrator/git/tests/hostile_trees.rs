//! Trees git itself refuses (entries named `..`, holding `/`, naming `.git` or
//! an alias of it, a symlink and an entry through it), written as raw loose
//! objects because `git mktree` refuses them: never imported into the host,
//! and never checked out, wherever they come from.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};

use common::{git, git_raw, Fixture};
use orchestrator_git::{create_worktree, import_run, GitError, WorktreeSpec};
use sha1::{Digest, Sha1};

/// Writes a loose object into `objects` as git does (zlib of
/// `"<kind> <len>\0" + data`, named by its SHA-1) and returns its id.
fn write_loose(objects: &Path, kind: &str, data: &[u8]) -> String {
    let mut raw = format!("{kind} {}\0", data.len()).into_bytes();
    raw.extend_from_slice(data);
    let id: String = Sha1::digest(&raw)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let dir = objects.join(&id[..2]);
    std::fs::create_dir_all(&dir).unwrap();
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(&raw).unwrap();
    let path = dir.join(&id[2..]);
    if !path.exists() {
        std::fs::write(path, z.finish().unwrap()).unwrap();
    }
    id
}

fn unhex(id: &str) -> Vec<u8> {
    (0..20)
        .map(|i| u8::from_str_radix(&id[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// A raw tree of `(mode, name, id)` entries, in the order given.
fn raw_tree(entries: &[(&str, &[u8], &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (mode, name, id) in entries {
        out.extend_from_slice(mode.as_bytes());
        out.push(b' ');
        out.extend_from_slice(name);
        out.push(0);
        out.extend_from_slice(&unhex(id));
    }
    out
}

/// A raw tree entry: mode, name, id.
type RawEntry = (String, Vec<u8>, String);

/// One hostile commit: its tree's top entries, and the entry refused.
struct Case {
    what: &'static str,
    /// The name the refusal must report (escaped as in the error).
    refused: &'static str,
    build: fn(&Path, &Targets) -> Vec<RawEntry>,
}

/// Where the hostile trees aim.
struct Targets {
    decoy: PathBuf,
    hooks: PathBuf,
}

fn hook_blob(objects: &Path, decoy: &Path) -> String {
    write_loose(
        objects,
        "blob",
        format!("#!/bin/sh\ntouch {}/hook-ran\n", decoy.display()).as_bytes(),
    )
}

/// A tree holding `hooks/post-checkout`.
fn git_dir_tree(objects: &Path, t: &Targets) -> String {
    let hook = hook_blob(objects, &t.decoy);
    let hooks = write_loose(
        objects,
        "tree",
        &raw_tree(&[("100755", b"post-checkout", &hook)]),
    );
    write_loose(objects, "tree", &raw_tree(&[("40000", b"hooks", &hooks)]))
}

fn cases() -> Vec<Case> {
    fn e(mode: &str, name: &[u8], id: String) -> RawEntry {
        (mode.to_owned(), name.to_vec(), id)
    }
    vec![
        Case {
            what: "a file named ../escaped",
            refused: "../escaped",
            build: |o, _| vec![e("100644", b"../escaped", write_loose(o, "blob", b"out\n"))],
        },
        Case {
            what: "a tree named .. holding a file",
            refused: "..",
            build: |o, _| {
                let x = write_loose(o, "blob", b"out\n");
                let t = write_loose(o, "tree", &raw_tree(&[("100644", b"escaped", &x)]));
                vec![e("40000", b"..", t)]
            },
        },
        Case {
            what: "a symlink to the decoy and a file through it",
            refused: "l/x",
            build: |o, t| {
                let link = write_loose(o, "blob", t.decoy.as_os_str().as_encoded_bytes());
                let x = write_loose(o, "blob", b"through the link\n");
                vec![e("120000", b"l", link), e("100644", b"l/x", x)]
            },
        },
        Case {
            what: "a symlink to the decoy and a tree of the same name",
            refused: "l",
            build: |o, t| {
                let link = write_loose(o, "blob", t.decoy.as_os_str().as_encoded_bytes());
                let x = write_loose(o, "blob", b"through the link\n");
                let sub = write_loose(o, "tree", &raw_tree(&[("100644", b"x", &x)]));
                vec![e("120000", b"l", link), e("40000", b"l", sub)]
            },
        },
        Case {
            what: "a symlink to the host's hooks and a hook through it",
            refused: "h/post-checkout",
            build: |o, t| {
                let link = write_loose(o, "blob", t.hooks.as_os_str().as_encoded_bytes());
                let hook = hook_blob(o, &t.decoy);
                vec![
                    e("120000", b"h", link),
                    e("100755", b"h/post-checkout", hook),
                ]
            },
        },
        Case {
            what: "a .git directory with a post-checkout hook",
            refused: ".git",
            build: |o, t| vec![e("40000", b".git", git_dir_tree(o, t))],
        },
        Case {
            what: "a .GIT directory",
            refused: ".GIT",
            build: |o, t| vec![e("40000", b".GIT", git_dir_tree(o, t))],
        },
        Case {
            what: "an NTFS alias of .git",
            refused: "git~1",
            build: |o, t| vec![e("40000", b"git~1", git_dir_tree(o, t))],
        },
        Case {
            what: "an NTFS alias of .git with trailing dots and spaces",
            refused: ".git. ",
            build: |o, t| vec![e("40000", b".git. ", git_dir_tree(o, t))],
        },
        Case {
            what: "an HFS+ alias of .git",
            refused: ".g\\xe2\\x80\\x8cit",
            build: |o, t| vec![e("40000", ".g\u{200c}it".as_bytes(), git_dir_tree(o, t))],
        },
        Case {
            what: "the path .git/hooks/post-checkout as one name",
            refused: ".git/hooks/post-checkout",
            build: |o, t| {
                vec![e(
                    "100755",
                    b".git/hooks/post-checkout",
                    hook_blob(o, &t.decoy),
                )]
            },
        },
        Case {
            what: "an empty name",
            refused: "",
            build: |o, _| vec![e("100644", b"", write_loose(o, "blob", b"x\n"))],
        },
    ]
}

/// Writes the case's objects into `objects`; returns (commit, the tree holding the refused entry).
fn plant(objects: &Path, case: &Case, targets: &Targets, parent: &str) -> (String, String) {
    let entries = (case.build)(objects, targets);
    let borrowed: Vec<(&str, &[u8], &str)> = entries
        .iter()
        .map(|(m, n, i)| (m.as_str(), n.as_slice(), i.as_str()))
        .collect();
    let tree = write_loose(objects, "tree", &raw_tree(&borrowed));
    let commit = write_loose(
        objects,
        "commit",
        format!(
            "tree {tree}\nparent {parent}\nauthor a <a@example.invalid> 1 +0000\ncommitter a <a@example.invalid> 1 +0000\n\nhostile: {}\n",
            case.what
        )
        .as_bytes(),
    );
    (commit, tree)
}

/// Every path under `dir`, relative, sorted (symlinks not followed).
fn listing(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            out.push(entry.path().strip_prefix(dir).unwrap().to_owned());
            if entry.file_type().unwrap().is_dir() {
                stack.push(entry.path());
            }
        }
    }
    out.sort();
    out
}

fn targets(fx: &Fixture) -> Targets {
    let decoy = fx.path("decoy");
    std::fs::create_dir(&decoy).unwrap();
    std::fs::create_dir_all(fx.host.join(".git/hooks")).unwrap();
    Targets {
        decoy,
        hooks: fx.host.join(".git/hooks"),
    }
}

fn assert_refusal(err: &GitError, tree: &str, case: &Case) {
    match err {
        GitError::InvalidTreeEntry { tree: t, name, why } => {
            assert_eq!(t, tree, "{}: wrong tree named ({why})", case.what);
            assert_eq!(
                name, case.refused,
                "{}: wrong entry named ({why})",
                case.what
            );
        }
        other => panic!(
            "{}: not refused as an invalid tree entry: {other}",
            case.what
        ),
    }
    let message = err.to_string();
    assert!(message.contains(tree), "{message}");
}

#[test]
fn hostile_trees_are_never_imported() {
    for case in cases() {
        let fx = Fixture::new();
        let t = targets(&fx);
        let wt = fx.worktree("evil");
        let (commit, tree) = plant(&wt.path.join(".git/objects"), &case, &t, &fx.base);
        git(&wt.path, &["update-ref", &wt.branch, &commit]);
        let host_before = listing(&fx.host.join(".git/hooks"));

        let result = import_run(&fx.spec(&wt.path, "evil"));
        if let Err(err) = &result {
            assert_refusal(err, &tree, &case);
        }
        // Whatever else the import keeps (the working files, after a refusal),
        // the hostile commit and tree never enter the host repository.
        for id in [&commit, &tree] {
            let found = git_raw(&fx.host, &["cat-file", "-e", id]);
            assert!(
                !found.status.success(),
                "{}: {id} was imported into the host",
                case.what
            );
        }
        assert!(listing(&t.decoy).is_empty(), "{}", case.what);
        assert_eq!(listing(&fx.host.join(".git/hooks")), host_before);
    }
}

#[test]
fn hostile_trees_planted_in_the_host_are_never_checked_out() {
    for case in cases() {
        let fx = Fixture::new();
        let t = targets(&fx);
        let (commit, tree) = plant(&fx.host.join(".git/objects"), &case, &t, &fx.base);
        git(
            &fx.host,
            &["update-ref", "refs/nightshift/runs/evil", &commit],
        );
        let hooks_before = listing(&t.hooks);
        let top_before = listing(fx.dir.path());

        let dest = fx.path("wt-next");
        let err = create_worktree(&WorktreeSpec {
            host_repo: fx.host.clone(),
            base_commit: commit.clone(),
            run_id: "next".to_owned(),
            dest: dest.clone(),
            owner: None,
            history_cache: None,
        })
        .expect_err(case.what);
        assert_refusal(&err, &tree, &case);

        assert!(
            listing(&t.decoy).is_empty(),
            "{}: something was written through the tree: {:?}",
            case.what,
            listing(&t.decoy)
        );
        assert_eq!(listing(&t.hooks), hooks_before, "{}", case.what);
        assert!(
            !dest.exists(),
            "{}: the failed worktree was left",
            case.what
        );
        assert_eq!(listing(fx.dir.path()), top_before, "{}", case.what);
    }
}

/// The observed state never keeps a hostile tree of the tip, even when the
/// agent put a FIFO where it stands (a skipped path keeps the tip's entry).
#[test]
fn observed_state_never_keeps_a_hostile_tip_tree() {
    let fx = Fixture::new();
    let t = targets(&fx);
    // The hostile commit is in the host already (an older import), so the
    // import does not check it again: only the observed state could keep it.
    let case = cases().into_iter().nth(1).unwrap(); // `..` holding a file
    let hostile = {
        let entries = (case.build)(&fx.host.join(".git/objects"), &t);
        let borrowed: Vec<(&str, &[u8], &str)> = entries
            .iter()
            .map(|(m, n, i)| (m.as_str(), n.as_slice(), i.as_str()))
            .collect();
        write_loose(&fx.host.join(".git/objects"), "tree", &raw_tree(&borrowed))
    };
    let readme = git(&fx.host, &["rev-parse", "HEAD:README.md"]);
    let tip_tree = write_loose(
        &fx.host.join(".git/objects"),
        "tree",
        &raw_tree(&[
            ("100644", b"README.md", &readme),
            ("40000", b"sub", &hostile),
        ]),
    );
    let tip = write_loose(
        &fx.host.join(".git/objects"),
        "commit",
        format!(
            "tree {tip_tree}\nparent {}\nauthor a <a@example.invalid> 1 +0000\ncommitter a <a@example.invalid> 1 +0000\n\nhostile\n",
            fx.base
        )
        .as_bytes(),
    );
    let wt = fx.worktree("fifo");
    std::fs::write(wt.path.join(".git").join(&wt.branch), format!("{tip}\n")).unwrap();
    nix::unistd::mkfifo(
        &wt.path.join("sub"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();

    let imported = import_run(&fx.spec(&wt.path, "fifo")).expect("import");
    let tree = git(
        &fx.host,
        &[
            "ls-tree",
            "-r",
            "-t",
            "--full-tree",
            &imported.result_commit,
        ],
    );
    assert!(
        !tree.contains(&hostile),
        "the hostile tip tree was kept in the observed state:\n{tree}"
    );
    assert!(
        imported.skipped.iter().any(|s| s.path == "sub"),
        "{:?}",
        imported.skipped
    );
}
