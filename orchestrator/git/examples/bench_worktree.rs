//! Worktree creation: ours against git's own ways of getting a checkout.
//!
//! `cargo run --release -p orchestrator-git --example bench_worktree [files] [rounds]`
//!
//! Makes a repository of `files` (default 20,000) files of a few hundred bytes
//! in nested directories, one commit, packed by `git gc`, then times each way
//! `rounds` (default 7) times in one run and prints the medians. Each checkout
//! is removed (untimed) before the next round. `BENCH_DIR` sets where the
//! repositories go (default: the system temp dir); `/dev/shm` takes the disk
//! out of the figures. `BENCH_REPO=path` takes a real repository instead
//! of the generated one (cloned here without a checkout, its HEAD the base:
//! for example a snapshot of `rust-lang/cargo`).
//!
//! To compare with an earlier version of the crate (as docs/benchmarks.md
//! does), build that version's example too and run the two in turn: each
//! reports its ratio to `git worktree add` measured in the same run.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use orchestrator_git::{create_worktree, remove_worktree, WorktreeSpec};

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        // No background auto-gc racing the explicit `git gc` below.
        .args(["-c", "gc.auto=0", "-C"])
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "bench")
        .env("GIT_AUTHOR_EMAIL", "bench@example.invalid")
        .env("GIT_COMMITTER_NAME", "bench")
        .env("GIT_COMMITTER_EMAIL", "bench@example.invalid")
        .output()
        .expect("running git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let files: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let rounds: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(7);

    let scratch = match std::env::var_os("BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .expect("tempdir");
    let host = scratch.path().join("host");
    let real = std::env::var("BENCH_REPO").ok();
    if let Some(repo) = &real {
        git(
            scratch.path(),
            &["clone", "-q", "--no-checkout", repo, host.to_str().unwrap()],
        );
    } else {
        std::fs::create_dir(&host).unwrap();
        git(&host, &["init", "-q", "-b", "main"]);
    }
    for i in 0..if real.is_some() { 0 } else { files } {
        let dir = host.join(format!("d{:02}/s{:02}", i % 50, (i / 50) % 20));
        std::fs::create_dir_all(&dir).unwrap();
        let body: String = (0..6)
            .map(|l| {
                format!(
                    "line {l} of file {i}: lorem ipsum dolor sit amet {}\n",
                    i * 7 + l
                )
            })
            .collect();
        std::fs::write(dir.join(format!("f{i}.txt")), body).unwrap();
    }
    if real.is_none() {
        git(&host, &["add", "-A"]);
        git(&host, &["commit", "-q", "-m", "bench fixture"]);
        git(&host, &["gc", "-q"]);
    }
    let base = git(&host, &["rev-parse", "HEAD"]);
    let files = git(&host, &["ls-tree", "-r", "--name-only", "HEAD"])
        .lines()
        .count();
    let pack_bytes: u64 = std::fs::read_dir(host.join(".git/objects/pack"))
        .unwrap()
        .flatten()
        .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .sum();
    let what = real.as_deref().unwrap_or("generated, one commit");
    println!("repository: {what}: {files} files, packed ({pack_bytes} bytes in objects/pack)");
    println!("rounds: {rounds} each, median reported\n");

    let out = scratch.path().join("out");
    std::fs::create_dir(&out).unwrap();

    let ours_with = |owner: Option<(u32, u32)>, history_cache: Option<std::path::PathBuf>| {
        let (base, host) = (base.clone(), host.clone());
        move |i: usize, dest: &Path| {
            create_worktree(&WorktreeSpec {
                host_repo: host.clone(),
                base_commit: base.clone(),
                run_id: format!("bench-{i}"),
                dest: dest.to_owned(),
                owner,
                history_cache: history_cache.clone(),
            })
            .expect("create_worktree");
        }
    };
    let ours = |owner: Option<(u32, u32)>| ours_with(owner, None);
    // A later worktree of the same base: the history cache holds the base
    // (one worktree made before the rounds, untimed).
    let cache = scratch.path().join("history-cache");
    let warm = out.join("warm");
    ours_with(None, Some(cache.clone()))(0, &warm);
    remove_worktree(&warm).expect("removing a checkout");
    let clone = |extra: &'static [&'static str]| {
        let (host, cwd) = (host.clone(), scratch.path().to_owned());
        move |_: usize, dest: &Path| {
            let mut args = vec!["clone", "-q", "--local"];
            args.extend_from_slice(extra);
            args.extend([host.to_str().unwrap(), dest.to_str().unwrap()]);
            git(&cwd, &args);
        }
    };
    let worktree_add = {
        let (host, base) = (host.clone(), base.clone());
        move |i: usize, dest: &Path| {
            let branch = format!("bench/{i}");
            git(
                &host,
                &[
                    "worktree",
                    "add",
                    "-q",
                    "-b",
                    &branch,
                    dest.to_str().unwrap(),
                    &base,
                ],
            );
        }
    };
    type Method = Box<dyn FnMut(usize, &Path)>;
    let mut methods: Vec<(&str, Method, Vec<Duration>)> = vec![
        ("`create_worktree` (ours)", Box::new(ours(None)), vec![]),
        (
            "`create_worktree` + chown to 1000:1000 (ours)",
            Box::new(ours(Some((1000, 1000)))),
            vec![],
        ),
        ("`git worktree add`", Box::new(worktree_add), vec![]),
        (
            "`git clone --local` (hard links)",
            Box::new(clone(&[])),
            vec![],
        ),
        (
            "`git clone --local --no-hardlinks`",
            Box::new(clone(&["--no-hardlinks"])),
            vec![],
        ),
        (
            "`create_worktree`, a later worktree of the base (history cached) (ours)",
            Box::new(ours_with(None, Some(cache.clone()))),
            vec![],
        ),
    ];
    // Rounds interleave the methods so that a burst of load on the machine
    // weighs on all of them alike. Each checkout is removed, untimed.
    let mut removals = Vec::new();
    for i in 0..rounds {
        for (m, (_, run, samples)) in methods.iter_mut().enumerate() {
            let dest = out.join(format!("m{m}-{i}"));
            let t = Instant::now();
            run(i, &dest);
            samples.push(t.elapsed());
            let t = Instant::now();
            remove_worktree(&dest).expect("removing a checkout");
            removals.push(t.elapsed());
        }
    }

    let reference = median(methods[2].2.clone());
    println!("| method | median | ratio to `git worktree add` |");
    println!("|---|---:|---:|");
    for (name, _, samples) in methods {
        let m = median(samples);
        println!(
            "| {name} | {:.1} ms | {:.2} |",
            m.as_secs_f64() * 1000.0,
            m.as_secs_f64() / reference.as_secs_f64()
        );
    }
    println!(
        "\n`remove_worktree` of one checkout: median {:.1} ms",
        median(removals).as_secs_f64() * 1000.0
    );
}
