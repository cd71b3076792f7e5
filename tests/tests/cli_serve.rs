//! The command line talks to a running `nightshift serve` through its
//! owner's socket (`STATE/serve.sock`, mode 0600), and works alone where
//! none runs: with `serve` killed with `kill -9`, its socket left behind
//! answers nobody, and the command line executes the command itself.

use std::os::unix::fs::PermissionsExt;

use tests::browser::Serve;
use tests::morning::Morning;
use tests::{stderr, stdout};

/// The audit bodies of `kind`, oldest first, read from the state's database.
fn audit_bodies(m: &Morning, kind: &str) -> Vec<serde_json::Value> {
    m.state.audit_bodies(kind)
}

fn decided_by(m: &Morning, act: &str, transition: &str) -> serde_json::Value {
    audit_bodies(m, "act")
        .into_iter()
        .find(|b| b["act"] == act && b["transition"] == transition)
        .unwrap_or_else(|| panic!("no {transition} entry for act {act}"))["fields"]["by"]
        .clone()
}

#[test]
fn the_command_line_goes_through_a_running_serve_and_works_alone_after_kill_9() {
    let m = Morning::new();
    m.run_agent(
        "echo a > a.txt && git add a.txt && git commit -qm a && git push -q origin HEAD:refs/heads/agent/one; \
         echo b > b.txt && git add b.txt && git commit -qm b && git push -q origin HEAD:refs/heads/agent/two; true",
    );
    let act_to = |r: &str| {
        m.queue()
            .into_iter()
            .find(|a| {
                a["act"]["routing"]["target"]["target_ref"] == format!("refs/heads/agent/{r}")
            })
            .unwrap_or_else(|| panic!("no push act to agent/{r}"))["act"]["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (one, two) = (act_to("one"), act_to("two"));
    let mut serve = Serve::start(&m.state, &[]);
    let socket = m.state.path().join("serve.sock");
    assert_eq!(
        std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777,
        0o600,
        "the owner's socket is the owner's alone"
    );

    // Through serve: the supervisor decided, and the audit says so.
    let out = m.as_owner(&["approve", &one]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains(&format!("act {one}: ")),
        "{}",
        stdout(&out)
    );
    assert_eq!(decided_by(&m, &one, "approved"), "owner via serve");
    // The decision returned at once; serve's executor carries it out.
    let started = std::time::Instant::now();
    while m.remote_ref("refs/heads/agent/one").is_none()
        && started.elapsed() < std::time::Duration::from_secs(30)
    {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        m.remote_ref("refs/heads/agent/one").is_some(),
        "serve's executor did not carry the approved act out"
    );
    // An error comes back with its exit code: an act that does not exist.
    let out = m.as_owner(&["approve", "01NOSUCHACT"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no act with id 01NOSUCHACT"),
        "{}",
        stderr(&out)
    );

    // serve killed with SIGKILL leaves its socket behind, answering nobody.
    serve.child.kill().unwrap();
    serve.child.wait().unwrap();
    assert!(
        socket.exists(),
        "the stale socket is what this test is about"
    );
    // (Liveness, not speed: a command line stuck on the dead socket is
    // stopped after a minute and the test fails.)
    let mut child = m
        .state
        .cmd()
        .args(["reject", &two, "--why", "not this one"])
        .args(["--owner-key-file", m.key.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the command line hung on a dead serve's socket");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(decided_by(&m, &two, "rejected"), "owner");

    // A new serve replaces the stale socket and answers on it again.
    let _serve = Serve::start(&m.state, &[]);
    let out = m.state.run(&["freeze", "--why", "through the new serve"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let freeze = audit_bodies(&m, "policy_row")
        .into_iter()
        .find(|b| b["row"] == "freeze")
        .expect("no freeze row in the audit");
    assert!(
        freeze["author"].as_str().unwrap().ends_with(" via serve"),
        "{freeze}"
    );
}
