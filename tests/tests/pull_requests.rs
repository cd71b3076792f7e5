//! A pull request opens on exactly the approved commit: its head branch is
//! made to hold that commit (fast-forward only) before the forge is asked;
//! a head branch that moved to something else makes the act stale and no
//! pull request opens; a crash after the forge accepted the request leaves
//! exactly one pull request, found and adopted on recovery.

use tests::morning::Morning;
use tests::{stderr, stdout};

const PR: &str = r#"echo "feature" > feature.txt && git add feature.txt && git commit -qm "agent: feature"
git branch agent/pr
echo "Adds feature.txt." > pr.txt
nightshift-act pr --remote forge --base main --head agent/pr --title "Add feature" --body-file pr.txt"#;

/// The one act in the queue: (id, head commit it is bound to).
fn the_pr(m: &Morning) -> (String, String) {
    let q = m.queue();
    assert_eq!(q.len(), 1, "expected one act: {q:?}");
    assert_eq!(q[0]["act"]["door"], "pull_request");
    (
        q[0]["act"]["id"].as_str().unwrap().to_string(),
        q[0]["act"]["content"]["head_commit"]
            .as_str()
            .unwrap()
            .to_string(),
    )
}

fn forge_posts(m: &Morning) -> usize {
    m.forge
        .as_ref()
        .unwrap()
        .requests()
        .iter()
        .filter(|r| r.method == "POST")
        .count()
}

#[test]
fn a_pull_request_pushes_its_head_and_opens_on_the_approved_commit() {
    let m = Morning::with_forge();
    m.run_agent(PR);
    let (act, commit) = the_pr(&m);

    // The owner sees what would leave: the commits and the diff, title, body.
    let out = m.state.run(&["queue", "show", &act]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = stdout(&out);
    for expected in [
        "feature.txt",
        "agent: feature",
        "Add feature",
        "Adds feature.txt.",
        &commit,
    ] {
        assert!(shown.contains(expected), "{expected:?} not in {shown}");
    }

    let out = m.as_owner(&["approve", &act]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(
        m.remote_ref("refs/heads/agent/pr").as_deref(),
        Some(commit.as_str())
    );
    let prs = m.forge.as_ref().unwrap().pull_requests();
    assert_eq!(prs.len(), 1, "{prs:?}");
    assert_eq!(prs[0].sha.as_deref(), Some(commit.as_str()));
    assert_eq!(
        (prs[0].head.as_str(), prs[0].base.as_str()),
        ("agent/pr", "main")
    );
    assert!(m.state.verify().status.success());
}

#[test]
fn a_head_branch_moved_after_queueing_opens_no_pull_request() {
    let m = Morning::with_forge();
    m.run_agent(PR);
    let (act, commit) = the_pr(&m);

    // Someone pushes something else to the head branch before the morning.
    let other = tempfile::tempdir().unwrap();
    tests::git(other.path(), &["init", "-q", "-b", "main"]);
    std::fs::write(other.path().join("x.txt"), "x").unwrap();
    tests::git(other.path(), &["add", "-A"]);
    tests::git(other.path(), &["commit", "-qm", "someone else"]);
    tests::git(
        other.path(),
        &[
            "push",
            "-q",
            m.bare.to_str().unwrap(),
            "HEAD:refs/heads/agent/pr",
        ],
    );
    let theirs = m.remote_ref("refs/heads/agent/pr").unwrap();

    let out = m.as_owner(&["approve", &act]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stdout(&out).contains("stale"), "{}", stdout(&out));
    assert_eq!(m.act(&act)["status"], "stale");
    assert_eq!(forge_posts(&m), 0, "a pull request was asked for");
    assert!(m.forge.as_ref().unwrap().pull_requests().is_empty());
    assert_eq!(
        m.remote_ref("refs/heads/agent/pr").as_deref(),
        Some(theirs.as_str())
    );
    assert_ne!(theirs, commit);
}

#[test]
fn kill_9_after_the_forge_accepted_leaves_exactly_one_pull_request() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;

    let m = Morning::with_forge();
    m.run_agent(PR);
    let (act, commit) = the_pr(&m);
    let forge = m.forge.as_ref().unwrap();
    // The forge records the pull request, then holds its answer: the
    // approver dies before it learns the number.
    forge.hold_answers(std::time::Duration::from_secs(120));
    let child = m
        .state
        .cmd()
        .args(["approve", &act, "--owner-key-file", m.key.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while forge.pull_requests().is_empty() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the forge never received the pull request"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    let _ = child.wait_with_output();
    forge.hold_answers(std::time::Duration::ZERO);
    assert_eq!(m.act(&act)["status"], "executing");

    // Recovery looks the pull request up and adopts it: no second one.
    let out = m.as_owner(&["approve", &act]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("adopted"), "{}", stdout(&out));
    assert_eq!(m.act(&act)["status"], "done");
    let prs = forge.pull_requests();
    assert_eq!(prs.len(), 1, "{prs:?}");
    assert_eq!(prs[0].sha.as_deref(), Some(commit.as_str()));
    assert_eq!(forge_posts(&m), 1);
    assert!(m.state.verify().status.success());
}

#[test]
fn an_act_that_would_move_the_head_of_an_opened_pull_request_goes_stale_naming_it() {
    // Two pull requests on one head branch (bases main and release), the
    // second's commit on top of the first's. Approving both moved pull
    // request #1, approved at C1, to C2.
    let m = Morning::with_forge();
    m.run_agent(
        r#"echo one > one.txt && git add one.txt && git commit -qm "agent: one"
git branch agent/pr
echo "First." > pr.txt
nightshift-act pr --remote forge --base main --head agent/pr --title "One" --body-file pr.txt
echo two > two.txt && git add two.txt && git commit -qm "agent: two"
git branch -f agent/pr
nightshift-act pr --remote forge --base release --head agent/pr --title "Two" --body-file pr.txt"#,
    );
    let q = m.queue();
    assert_eq!(q.len(), 2, "{q:?}");
    let of = |base: &str| {
        let a = q
            .iter()
            .find(|a| {
                a["act"]["routing"]["target"]["base_ref"] == format!("refs/heads/{base}").as_str()
            })
            .unwrap_or_else(|| panic!("no act on {base}: {q:?}"));
        (
            a["act"]["id"].as_str().unwrap().to_string(),
            a["act"]["content"]["head_commit"]
                .as_str()
                .unwrap()
                .to_string(),
        )
    };
    let ((first, c1), (second, c2)) = (of("main"), of("release"));
    assert_ne!(c1, c2);

    let out = m.as_owner(&["approve", &first]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(
        m.remote_ref("refs/heads/agent/pr").as_deref(),
        Some(c1.as_str())
    );

    let out = m.as_owner(&["approve", &second]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let said = stdout(&out);
    assert!(said.contains("stale"), "{said}");
    assert!(
        said.contains("pull request #1") && said.contains(&first),
        "the pull request it would move is not named: {said}"
    );
    assert_eq!(m.act(&second)["status"], "stale");
    // `queue show` names it too.
    let out = m.state.run(&["queue", "show", &second]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("pull request #1"), "{}", stdout(&out));
    // Pull request #1 still proposes exactly what was approved.
    assert_eq!(
        m.remote_ref("refs/heads/agent/pr").as_deref(),
        Some(c1.as_str())
    );
    let prs = m.forge.as_ref().unwrap().pull_requests();
    assert_eq!(prs.len(), 1, "{prs:?}");
    assert_eq!(prs[0].sha.as_deref(), Some(c1.as_str()));
    assert!(m.state.verify().status.success());
}
