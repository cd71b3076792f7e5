//! Stale is a state the owner can leave, and nothing unrelated makes an act
//! stale: a freeze and thaw between queueing and approval, or a rule another
//! run declared for itself, change nothing about this act; a remote that
//! really moved makes it stale, shows what changed, and one more approval
//! after `rebind` carries it out exactly once. `approve` exits non-zero
//! whenever a named act was not carried out.

use tests::morning::Morning;
use tests::{stderr, stdout};

const PUSH: &str =
    "echo a > a.txt && git add a.txt && git commit -qm a && git push -q origin HEAD:refs/heads/agent/x";

/// The one act in the queue: (id, commit it carries).
fn the_push(m: &Morning) -> (String, String) {
    let q = m.queue();
    assert_eq!(q.len(), 1, "expected one act: {q:?}");
    (
        q[0]["act"]["id"].as_str().unwrap().to_string(),
        q[0]["act"]["content"]["commit"]
            .as_str()
            .unwrap()
            .to_string(),
    )
}

#[test]
fn freeze_and_thaw_between_queueing_and_approval_stale_nothing() {
    let m = Morning::new();
    m.run_agent(PUSH);
    let (act, commit) = the_push(&m);

    let out = m.state.run(&["kill", "--all", "--freeze"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // While frozen nothing is approved or carried out, and the owner is told.
    let out = m.as_owner(&["approve", &act]);
    assert_eq!(
        out.status.code(),
        Some(9),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stderr(&out).contains("frozen"), "{}", stderr(&out));
    assert_eq!(m.act(&act)["status"], "pending");
    assert_eq!(m.remote_ref("refs/heads/agent/x"), None);

    let out = m.as_owner(&["thaw"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = m.as_owner(&["approve", &act]);
    assert!(
        out.status.success(),
        "approve after thaw: {}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(m.act(&act)["status"], "done");
    assert_eq!(
        m.remote_ref("refs/heads/agent/x").as_deref(),
        Some(commit.as_str())
    );
    assert!(m.state.verify().status.success());
}

#[test]
fn a_rule_another_run_declared_for_itself_stales_nothing() {
    let m = Morning::new();
    m.run_agent(PUSH);
    let (act, commit) = the_push(&m);

    // Another run tightens its own rules (tier 1): a new policy generation.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("other.toml");
    std::fs::write(
        &file,
        "[[rule]]\nid = \"run-other-no-push\"\nsubject = \"run-other\"\ndoors = [\"push\"]\n\
         effect = \"refuse\"\nreason = \"the other run may not push\"\nauthority = \"run-other\"\n",
    )
    .unwrap();
    let out = m.state.run(&[
        "policy",
        "declare",
        file.to_str().unwrap(),
        "--actor",
        "run-other",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));

    let out = m.as_owner(&["approve", &act]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(m.act(&act)["status"], "done");
    assert_eq!(
        m.remote_ref("refs/heads/agent/x").as_deref(),
        Some(commit.as_str())
    );
}

#[test]
fn a_rule_that_now_refuses_the_act_makes_it_stale_naming_the_rule() {
    let m = Morning::new();
    let run = m.run_agent(PUSH);
    let (act, _) = the_push(&m);
    // The run's own actor now refuses its pushes (tier 1 may tighten on itself).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("own.toml");
    std::fs::write(
        &file,
        format!(
            "[[rule]]\nid = \"no-push-now\"\nsubject = \"run-{run}\"\ndoors = [\"push\"]\n\
             effect = \"refuse\"\nreason = \"no pushes after all\"\nauthority = \"run-{run}\"\n"
        ),
    )
    .unwrap();
    let out = m.state.run(&[
        "policy",
        "declare",
        file.to_str().unwrap(),
        "--actor",
        &format!("run-{run}"),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = m.as_owner(&["approve", &act]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stdout(&out).contains("no-push-now"), "{}", stdout(&out));
    assert_eq!(m.act(&act)["status"], "stale");
    assert_eq!(m.remote_ref("refs/heads/agent/x"), None);
    // It cannot be re-bound while the rule refuses it.
    let out = m.as_owner(&["rebind", &act]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no-push-now"), "{}", stderr(&out));
}

#[test]
fn a_moved_remote_is_stale_shown_rebound_and_carried_out_exactly_once() {
    let m = Morning::new();
    m.run_agent(PUSH);
    let (act, commit) = the_push(&m);

    // Someone pushes the same branch before the morning (the base commit,
    // so that the act's commit is still a fast-forward of it).
    tests::git(
        m.repo.path(),
        &[
            "push",
            "-q",
            m.bare.to_str().unwrap(),
            "main:refs/heads/agent/x",
        ],
    );
    let theirs = m.remote_ref("refs/heads/agent/x").unwrap();

    // Not carried out: approve says so, and exits non-zero.
    let out = m.as_owner(&["approve", &act]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stdout(&out).contains("stale"), "{}", stdout(&out));
    assert_eq!(
        m.remote_ref("refs/heads/agent/x").as_deref(),
        Some(theirs.as_str())
    );
    // Approving it again does nothing either.
    let out = m.as_owner(&["approve", &act]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stdout(&out).contains("rebind"), "{}", stdout(&out));

    // What changed is shown: the lease it was bound to and the remote's value now.
    let out = m.state.run(&["queue", "show", &act]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = stdout(&out);
    assert!(shown.contains("stale"), "{shown}");
    assert!(shown.contains("(absent)"), "{shown}");
    assert!(shown.contains(&theirs), "{shown}");
    assert!(
        shown.contains(&format!("nightshift rebind {act}")),
        "{shown}"
    );

    // Re-bound: a new pending act bound to their commit; nothing is pushed yet.
    let before = m.pushes_received();
    let out = m.as_owner(&["rebind", &act]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let line = stdout(&out);
    let new = line
        .split_whitespace()
        .skip_while(|w| *w != "as")
        .nth(2)
        .unwrap()
        .trim_end_matches([';', ','])
        .to_string();
    assert_ne!(new, act);
    assert_eq!(m.act(&act)["status"], "rejected");
    let rebound = m.act(&new);
    assert_eq!(rebound["status"], "pending");
    assert_eq!(rebound["act"]["content"]["commit"], commit.as_str());
    assert_eq!(
        rebound["act"]["routing"]["target"]["expected_old"],
        theirs.as_str()
    );
    assert_eq!(m.pushes_received(), before, "re-binding pushed something");

    let out = m.as_owner(&["approve", &new]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(
        m.remote_ref("refs/heads/agent/x").as_deref(),
        Some(commit.as_str())
    );
    assert_eq!(
        m.pushes_received(),
        before + 1,
        "carried out more than once"
    );
    // Neither act can be carried out again.
    for id in [&act, &new] {
        let out = m.as_owner(&["approve", id]);
        assert!(!out.status.success(), "{}", stdout(&out));
    }
    assert_eq!(m.pushes_received(), before + 1);
    assert!(m.state.verify().status.success());
}
