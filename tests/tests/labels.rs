//! Labels are applied, not only proven: a run's content carries the join of
//! its inputs' labels (the repository's confidentiality from the owner's
//! configuration, private by default; the agent's output untrusted), the
//! door's gate uses the policy engine's label gate, and its audit entry
//! holds the label and the gate's reason.

use tests::morning::Morning;
use tests::{stderr, stdout};

const PUSH: &str = "echo a > a.txt && git add a.txt && git commit -qm a && git push origin HEAD:refs/heads/agent/x 2>&1; echo push=$?";

/// Makes `origin` a remote whose readers are public.
fn public_origin(m: &Morning) {
    let path = m.state.path().join("destinations.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace("readers = \"private\"", "readers = \"public\""),
    )
    .unwrap();
}

fn door_entries(m: &Morning, run: &str) -> Vec<serde_json::Value> {
    m.state.show(run)["audit"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "door_request")
        .cloned()
        .collect()
}

#[test]
fn a_public_repository_may_push_to_a_public_remote_and_is_asked_for() {
    let m = Morning::new();
    public_origin(&m);
    std::fs::write(
        m.state.path().join("config.toml"),
        format!(
            "[[repository]]\npath = \"{}\"\nconfidentiality = \"public\"\n",
            m.repo.path().display()
        ),
    )
    .unwrap();
    let run = m.run_agent(PUSH);
    let log = m.state.output_log(&run);
    assert!(log.contains("push=0"), "{log}");
    let q = m.queue();
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!(q[0]["status"], "pending");
    let entries = door_entries(&m, &run);
    assert_eq!(entries[0]["body"]["verdict"], "queued");
    assert_eq!(entries[0]["body"]["label"], "untrusted, public");
    assert_eq!(entries[0]["body"]["gate"], "untrusted_content");
    assert_eq!(entries[0]["body"]["rule"], "ask-before-push");
}

#[test]
fn a_private_repository_is_refused_by_labels_naming_them() {
    let m = Morning::new();
    public_origin(&m);
    let run = m.run_agent(PUSH);
    let log = m.state.output_log(&run);
    assert!(log.contains("push=1"), "{log}");
    assert!(log.contains("nightshift:labels"), "{log}");
    assert!(log.contains("untrusted, private"), "{log}");
    assert!(m.queue().is_empty());
    let entries = door_entries(&m, &run);
    assert_eq!(entries[0]["body"]["verdict"], "refused");
    assert_eq!(entries[0]["body"]["rule"], "nightshift:labels");
    assert_eq!(entries[0]["body"]["label"], "untrusted, private");
    let out = m.state.run(&["show", &run]);
    assert!(
        stdout(&out).contains("nightshift:labels"),
        "{}",
        stderr(&out)
    );
}
