//! Toolchain images (`nightshift image build --with rust,python`): a run
//! `--with` them gets that image and its tools work inside Tier 0, and
//! cannot reach PyPI or crates.io from there. The image is built by scripts/test.sh when missing.

use tests::{make_repo, only_run, stderr, stdout, State};

fn image_ref(args: &[&str]) -> String {
    let mut all = vec!["image", "ref"];
    all.extend_from_slice(args);
    let out = State::new().run(&all);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out).trim().to_string()
}

#[test]
fn a_run_with_rust_and_python_gets_their_image_and_builds_offline() {
    let state = State::new();
    let repo = make_repo();
    // /tmp is noexec: what is built runs from the worktree, as a
    // repository's tests do.
    let script = "cargo new --vcs none -q probe && cd probe \
         && printf 'fn main() { println!(\"built {}\", 6 * 7); }' > src/main.rs \
         && cargo run --offline -q && cargo --version \
         && python3 -m pip --version | cut -d' ' -f1 \
         && for host in pypi.org files.pythonhosted.org index.crates.io static.crates.io; do \
              python3 -c \"import socket,sys; socket.create_connection((sys.argv[1], 443), 5)\" $host \
              2>/dev/null && echo reached-$host; done; echo probed";
    let out = state.run(&[
        "run",
        "--with",
        "python,rust",
        "--repo",
        repo.path().to_str().unwrap(),
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let run = only_run(&state);
    let image = image_ref(&["--with", "rust,python"]);
    assert!(
        image.starts_with("nightshift-sandbox-with-python-rust:"),
        "{image}"
    );
    assert_eq!(run["image"], image.as_str());
    let log = state.output_log(run["id"].as_str().unwrap());
    assert!(log.contains("built 42"), "{log}");
    assert!(log.contains("cargo 1."), "{log}");
    assert!(log.lines().any(|l| l.trim() == "pip"), "{log}");
    // The registries the image's tools would fetch from are out of reach:
    // Tier 0 has no network (the setup phase is what may fetch).
    assert!(log.contains("probed") && !log.contains("reached-"), "{log}");
    assert!(state.containers().is_empty());
}

#[test]
fn an_unknown_toolchain_is_a_usage_error_naming_it_and_with_excludes_image() {
    let state = State::new();
    let out = state.run(&["image", "ref", "--with", "rust,go"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no toolchain \"go\"") && stderr(&out).contains("node, python, rust"),
        "{}",
        stderr(&out)
    );
    let repo = make_repo();
    let out = state.run(&[
        "run",
        "--with",
        "rust",
        "--image",
        "x:1",
        "--repo",
        repo.path().to_str().unwrap(),
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(state.runs().is_empty());
    // An agent's image with a toolchain is its own reference.
    let codex = image_ref(&["--agent", "codex", "--with", "node"]);
    assert!(
        codex.starts_with("nightshift-agent-codex-with-node:"),
        "{codex}"
    );
}
