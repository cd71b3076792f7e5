//! The engine and runtime choices end to end (docs/engines.md): a run under
//! gVisor (`--runtime runsc`, on nightshift's gVisor Podman service) has its
//! door and its runtime attested, and an owner who requires a runtime gets
//! no other. The gVisor run needs Podman (`NIGHTSHIFT_TEST_ENGINE=podman`,
//! scripts/podman.sh start); on Docker, which has no gVisor here, the run
//! is refused naming the runtime and nothing runs.

use tests::probes::{
    assert_no_way_out, assert_profile_holds, get, probe_script, probes, SYSCALL_PROBES,
};
use tests::{make_repo, on_podman, only_run, stderr, stdout, State};

#[test]
fn a_run_under_gvisor_has_its_door_and_its_runtime_attested() {
    if !on_podman() {
        // Docker here has no gVisor runtime: the run is refused, saying so,
        // and nothing runs under another runtime instead.
        let state = State::new();
        let repo = make_repo();
        let out = state.run(&[
            "--runtime",
            "runsc",
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--",
            "true",
        ]);
        assert!(!out.status.success(), "a runsc run on Docker succeeded");
        assert!(stderr(&out).contains("runsc"), "{}", stderr(&out));
        for r in state.runs() {
            assert_ne!(r["status"], "exited 0", "{r:#?}");
        }
        return;
    }
    let state = State::new();
    let repo = make_repo();
    let out = state.run(&[
        "--runtime",
        "runsc",
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "cat /proc/version; echo question > /tmp/q && nightshift-act ask --file /tmp/q; \
         echo under-gvisor > /workspace/gvisor.txt",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out) + &stderr(&out);
    // The kernel the sandbox sees is gVisor's, not the host's (its log,
    // `dmesg`, is refused by nightshift's profile, loaded inside gVisor).
    let host = std::fs::read_to_string("/proc/version").unwrap();
    assert!(text.contains("Linux version"), "{text}");
    assert!(!text.contains(host.trim()), "the host's kernel: {text}");
    // The door answered: the question is queued.
    assert!(text.contains("queued as act"), "{text}");
    let run = only_run(&state);
    let show = state.show(run["id"].as_str().unwrap());
    let att = show["audit"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "attestation")
        .unwrap();
    assert_eq!(att["body"]["passed"], true, "{}", att["body"]);
    assert_eq!(att["body"]["engine"], "podman");
    assert_eq!(att["body"]["runtime"], "runsc");
    // The work came back.
    assert!(run["result_commit"].is_string(), "{run}");
    assert!(state.containers().is_empty());
    assert!(state.verify().status.success());
}

/// Inside gVisor the sandbox probes hold as under runc, and nightshift's
/// seccomp profile is loaded in the sandbox (runsc `--oci-seccomp`, with
/// `clone3` allowed there: `nightshift_core::sandbox::seccomp_profile_for`):
/// every call the escape checkers try is refused with EPERM, as on runc.
/// Without the flag gVisor answered io_uring, ptrace, unshare and packet
/// sockets itself while the attestation read the profile in the OCI
/// configuration: this test failed so.
#[test]
fn a_gvisor_sandbox_passes_the_sandbox_probes() {
    if !on_podman() {
        eprintln!("runs in test.sh's Podman phase (NIGHTSHIFT_TEST_ENGINE=podman)");
        return;
    }
    let state = State::new();
    let repo = make_repo();
    let script = format!("{}{}", probe_script(9), SYSCALL_PROBES);
    let out = state.run(&[
        "--runtime",
        "runsc",
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--",
        "bash",
        "-c",
        &script,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run = only_run(&state);
    let log = state.output_log(run["id"].as_str().unwrap());
    let p = probes(&log);
    assert_profile_holds(&p, &log);
    assert_no_way_out(&p, &log);
    assert_eq!(get(&p, "write-/workspace/probe"), "ok", "{log}");
    assert_eq!(get(&p, "git"), "committed", "{log}");
    assert!(state.containers().is_empty());
}

/// `[sandbox] runtime = "runsc"` is a requirement: asking for runc is a
/// usage error naming the file, before anything is made.
#[test]
fn a_required_runtime_refuses_runc() {
    let state = State::new();
    std::fs::write(
        state.path().join("config.toml"),
        "[sandbox]\nruntime = \"runsc\"\n",
    )
    .unwrap();
    let repo = make_repo();
    let out = state.run(&[
        "--runtime",
        "runc",
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("--runtime runc refused") && err.contains("config.toml"),
        "{err}"
    );
    assert!(state.runs().is_empty(), "a run was made");
}
