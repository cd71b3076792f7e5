//! One installed binary works: `cargo install` puts `nightshift` alone in a
//! directory, and the demo's `git push` still goes through the door, because
//! the static door clients travel inside the binary and are written into
//! every door; a door whose clients cannot be written does not open.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use tests::{stderr, stdout, State};

/// The target directory this test was built in (`target/debug/deps/<test>`),
/// so that `cargo install` reuses what is already built.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.ancestors()
        .nth(3)
        .expect("target directory above target/<profile>/deps")
        .to_path_buf()
}

fn cargo() -> PathBuf {
    std::env::var_os("CARGO")
        .or_else(|| option_env!("CARGO").map(Into::into))
        .map(PathBuf::from)
        .unwrap_or_else(|| "cargo".into())
}

#[test]
fn an_installed_binary_alone_runs_the_demo() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let root = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let installed = Command::new(cargo())
        .args(["install", "--debug", "--offline", "--locked", "--quiet"])
        .arg("--path")
        .arg(workspace.join("orchestrator"))
        .arg("--root")
        .arg(root.path())
        .env("CARGO_TARGET_DIR", target_dir())
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .expect("running cargo install");
    assert!(
        installed.status.success(),
        "cargo install failed: {}",
        stderr(&installed)
    );
    // A figure for the report, never an assertion.
    eprintln!("cargo install took {:.1}s", started.elapsed().as_secs_f64());

    // The binary, alone: nothing beside it, no door-clients directory anywhere near.
    let alone = tempfile::tempdir().unwrap();
    let bin = alone.path().join("nightshift");
    std::fs::copy(root.path().join("bin").join("nightshift"), &bin).unwrap();
    drop(root);
    let state = State::new();
    let demo = Command::new(&bin)
        .arg("demo")
        .env("NIGHTSHIFT_STATE_DIR", state.path())
        .env_remove("NIGHTSHIFT_DOOR_CLIENTS")
        .current_dir(alone.path())
        .output()
        .expect("running the installed nightshift");
    let said = format!("{}{}", stdout(&demo), stderr(&demo));
    assert!(demo.status.success(), "the demo failed: {said}");
    assert!(!said.contains("is not a git command"), "{said}");

    let queue = Command::new(&bin)
        .args(["queue", "--json"])
        .env("NIGHTSHIFT_STATE_DIR", state.path())
        .output()
        .unwrap();
    assert!(queue.status.success(), "{}", stderr(&queue));
    let acts: Vec<serde_json::Value> = serde_json::from_slice(&queue.stdout).unwrap();
    assert!(
        acts.iter()
            .any(|a| a["act"]["door"] == "push" && a["status"] == "pending"),
        "no pending push act after the demo: {acts:?}\n{said}"
    );
    assert!(state.containers().is_empty(), "a sandbox survived the demo");
}

#[test]
fn door_clients_are_written_static_and_read_only_or_the_door_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    orchestrator::door::write_clients(&bin).unwrap();
    // Twice: a door written again (its files read-only) is written again.
    orchestrator::door::write_clients(&bin).unwrap();
    for (name, bytes) in orchestrator::door::CLIENTS {
        use std::os::unix::fs::PermissionsExt;
        let path = bin.join(name);
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "{name}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o555, "{name}");
        assert!(bytes.starts_with(b"\x7fELF"), "{name} is not an executable");
    }

    // Where the clients cannot be written, the error says which file.
    let blocked = tempfile::tempdir().unwrap();
    let bin = blocked.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::create_dir(bin.join("nightshift-act")).unwrap();
    let err = orchestrator::door::write_clients(&bin).unwrap_err();
    assert!(
        err.to_string().contains("writing the door client")
            && err.to_string().contains("nightshift-act"),
        "{err}"
    );
}
