//! One refusal through the real engine: an image that declares a VOLUME gets
//! an anonymous engine volume mounted, a writable host path that is not the
//! worktree. The attestation sees it in the inspected container and refuses.
//!
//! Whether a container started is asked of the engine itself (its event
//! log), not of what nightshift recorded: the probe sees a start however
//! the supervisor records or cleans up after it.

use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use tests::{audit_kinds, engine_cli, image, make_repo, on_podman, only_run, stderr, State};

fn volume_image() -> String {
    let tag = format!("nightshift-test-volume:{}", &image().replace(':', "-"));
    let exists = Command::new(engine_cli())
        .args(["image", "inspect", &tag])
        .output()
        .unwrap()
        .status
        .success();
    if !exists {
        // A build context of one file (Podman reads no Dockerfile on stdin).
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("Dockerfile"),
            format!("FROM {}\nVOLUME /data\n", image()),
        )
        .unwrap();
        let built = Command::new(engine_cli())
            .args(["build", "-q", "-t", &tag])
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(built.success(), "{} build failed", engine_cli());
    }
    tag
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The containers of this state the engine started since `since` (unix
/// seconds), from the engine's event log, one id per start.
fn engine_starts(state: &State, since: u64) -> Vec<String> {
    let tag = orchestrator::state_tag(state.path());
    let out = Command::new(engine_cli())
        .args([
            "events",
            "--since",
            &since.saturating_sub(1).to_string(),
            "--until",
            &(unix_now() + 1).to_string(),
            "--filter",
            "type=container",
            "--filter",
            "event=start",
            "--filter",
            &format!("label=nightshift.state={tag}"),
            "--format",
            "{{.ID}}",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "events: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn a_container_that_breaks_tier0_never_starts() {
    let state = State::new();
    let repo = make_repo();
    let image = volume_image();
    let since = unix_now();
    let out = state.run(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--image",
        &image,
        "--",
        "touch",
        "/workspace/agent-ran",
    ]);
    // The engine never started it (asked before anything else: whatever
    // nightshift recorded, a start shows here).
    let run = only_run(&state);
    let container = run["container_id"].as_str().unwrap_or_default().to_string();
    assert!(!container.is_empty(), "no container was created: {run}");
    assert_eq!(
        engine_starts(&state, since),
        Vec::<String>::new(),
        "the engine started the refused container {container}"
    );
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("mounts-only-worktree"),
        "refusal does not name the property: {err}"
    );
    assert_eq!(run["status"], "refused: attestation");
    assert!(run["started_at"].is_null(), "the agent was started");
    assert!(run["result_commit"].is_null());
    let kinds = audit_kinds(&state, run["id"].as_str().unwrap());
    assert!(kinds.contains(&"attestation".to_string()));
    assert!(!kinds.contains(&"started".to_string()));
    let show = state.show(run["id"].as_str().unwrap());
    let att = show["audit"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "attestation")
        .unwrap();
    assert_eq!(att["body"]["passed"], false);
    assert!(
        state.containers().is_empty(),
        "the refused container was left behind"
    );
    assert!(state.verify().status.success());
}

/// A real sandbox's attestation names and passes each property nightshift
/// holds beyond the engine's defaults, with what the supervisor observed.
#[test]
fn the_attestation_of_a_real_sandbox_covers_the_hardening() {
    let state = State::new();
    let repo = make_repo();
    let since = unix_now();
    let out = state.run(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "true",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run = only_run(&state);
    // The probe the refusal test relies on sees a start when there is one.
    let container = run["container_id"].as_str().unwrap();
    // The run's sandbox, then the end-of-run packer's (audited with its
    // container), and nothing else.
    let mut expected = vec![container.to_string()];
    expected.extend(
        state
            .audit_bodies("result_packed")
            .iter()
            .map(|b| b["container"].as_str().unwrap().to_string()),
    );
    // Podman writes its event log after the fact: read it again, bounded,
    // until the starts are there.
    let asked = std::time::Instant::now();
    let mut starts = engine_starts(&state, since);
    while starts.len() < expected.len() && asked.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(200));
        starts = engine_starts(&state, since);
    }
    assert_eq!(starts, expected);
    let show = state.show(run["id"].as_str().unwrap());
    let att = show["audit"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "attestation")
        .unwrap();
    // The attestation names the engine it observed and its runtime.
    assert_eq!(
        att["body"]["engine"],
        if on_podman() { "podman" } else { "docker" }
    );
    assert!(
        ["runc", "io.containerd.runc.v2", ""].contains(&att["body"]["runtime"].as_str().unwrap()),
        "{}",
        att["body"]
    );
    let props = att["body"]["properties"].as_array().unwrap();
    let observed = |name: &str| {
        let p = props
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("{name} not attested: {props:?}"));
        assert_eq!(p["ok"], true, "{p}");
        p["observed"].as_str().unwrap().to_string()
    };
    assert!(
        observed("user-no-host-account").starts_with("2000000000:2000000000 is no host account")
    );
    let mount = observed("workspace-nosuid-nodev");
    assert!(
        mount.contains("nosuid") && mount.contains("nodev"),
        "{mount}"
    );
    assert!(observed("seccomp-profile").starts_with("profiles=[sha256:"));
    assert_eq!(observed("shm-bounded"), format!("shm-size={}", 32 << 20));
    assert!(observed("ulimits-bounded").starts_with("core=0/0 fsize="));
    observed("proc-masked");
    // The lease wrapper is PID 1 itself (no engine init between it and the
    // agent), and the shared nproc limit is the fixed one, not the run's cap.
    assert_eq!(
        observed("init-pid1"),
        "init=false path=/run/nightshift/bin/nightshift-lease"
    );
    let nproc = orchestrator::sandbox::SHARED_NPROC;
    assert!(
        observed("ulimits-bounded").contains(&format!("nproc={nproc}/{nproc}")),
        "{}",
        observed("ulimits-bounded")
    );
    assert!(state.verify().status.success());
}
