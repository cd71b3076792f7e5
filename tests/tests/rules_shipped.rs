//! Every shipped rule means what it says: for each rule of
//! `policies/rules/default.toml`, a real door request from inside a real
//! sandbox that the rule decides, and the audit naming that rule.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use tests::loopback::{ForgeServer, GitHttpServer, NotifyServer};
use tests::{git, image, make_repo, stderr, stdout, State};

const PASSWORD: &str = "rules-door-password-77";
const TOKEN: &str = "rules-forge-token-42";

/// The shipped rules' ids, read from the file the binary embeds.
fn shipped_ids() -> BTreeSet<String> {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../policies/rules/default.toml");
    std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("id = \""))
        .map(|l| l.trim_end_matches('"').to_string())
        .collect()
}

/// The rules covered by the push tests that need the door to carry `force`
/// and `delete` (see `force_and_delete_of_main_are_refused_by_their_rules`).
const NEEDS_FORCE_AND_DELETE: [&str; 2] = ["no-force-push-to-main", "no-deleting-main"];

struct Night {
    state: State,
    repo: tempfile::TempDir,
    _remote_dir: tempfile::TempDir,
    _git_server: GitHttpServer,
    _notify: NotifyServer,
    _forge: ForgeServer,
}

fn night() -> Night {
    let state = State::new();
    let repo = make_repo();
    let remote_dir = tempfile::tempdir().unwrap();
    let bare = remote_dir.path().join("origin.git");
    git(
        remote_dir.path(),
        &["init", "-q", "--bare", bare.to_str().unwrap()],
    );
    let git_server = GitHttpServer::start(&bare, "nightshift", PASSWORD);
    let notify = NotifyServer::start();
    let forge = ForgeServer::start(TOKEN);
    let secret = |name: &str, value: &str| {
        let path = state.path().join(name);
        std::fs::write(&path, value).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    };
    let pw = secret("origin.password", PASSWORD);
    let token = secret("forge.token", TOKEN);
    std::fs::write(
        state.path().join("destinations.toml"),
        format!(
            "[remotes.origin]\nurl = \"{}\"\nreaders = \"private\"\nusername = \"nightshift\"\npassword_file = \"{}\"\n\n\
             [notify.team]\nurl = \"{}\"\nreaders = \"private\"\n\n\
             [forges.forge]\napi = \"{}\"\nrepo = \"owner/name\"\nremote = \"origin\"\ntoken_file = \"{}\"\nreaders = \"private\"\n",
            git_server.url(),
            pw.display(),
            notify.url(),
            forge.url(),
            token.display()
        ),
    )
    .unwrap();
    Night {
        state,
        repo,
        _remote_dir: remote_dir,
        _git_server: git_server,
        _notify: notify,
        _forge: forge,
    }
}

/// Runs `script` as the agent; returns the run's id and output.
fn agent(n: &Night, script: &str) -> (String, String) {
    let out = n.state.run(&[
        "run",
        "--repo",
        n.repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "bash",
        "-c",
        script,
    ]);
    assert!(
        out.status.success(),
        "agent run failed: {}{}",
        stdout(&out),
        stderr(&out)
    );
    let id = n.state.runs().last().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let log = n.state.output_log(&id);
    (id, log)
}

/// The run's `policy_decision` entries as (door, verdict, rule).
fn decisions(n: &Night, run: &str) -> Vec<(String, String, String)> {
    let show = n.state.show(run);
    show["audit"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "policy_decision")
        .map(|e| {
            let b = &e["body"];
            let s = |k: &str| b[k].as_str().unwrap_or("").to_string();
            (s("door"), s("verdict"), s("rule"))
        })
        .collect()
}

#[test]
fn every_shipped_rule_decides_a_real_door_request_and_the_audit_names_it() {
    let n = night();
    let (run, log) = agent(
        &n,
        r#"set -u
echo work > work.txt && git add work.txt && git commit -qm work
git push origin HEAD:refs/heads/agent/work 2>&1; echo "push=$?"
git branch -f agent/work HEAD
echo "Adds work.txt." > pr.txt
nightshift-act pr --remote forge --base main --head agent/work --title "Add work" --body-file pr.txt; echo "pr=$?"
echo "the build is green" > msg.txt
nightshift-act notify team --file msg.txt; echo "notify=$?"
echo "should the parser be rewritten?" > q.txt
nightshift-act ask --file q.txt; echo "ask=$?"
"#,
    );
    for k in ["push=0", "pr=0", "notify=0", "ask=0"] {
        assert!(log.lines().any(|l| l == k), "{k} not in {log}");
    }
    let got = decisions(&n, &run);
    let expect = [
        ("push", "ask-before-push"),
        ("pull_request", "ask-before-pr"),
        ("notify", "ask-before-notify"),
        ("ask", "ask-before-ask"),
    ];
    for (door, rule) in expect {
        assert!(
            got.iter()
                .any(|(d, v, r)| d == door && v == "ask" && r == rule),
            "no ask by {rule} for door {door} in {got:?}"
        );
    }
    // Every shipped rule is decided by a test here: a new rule without a
    // real request that reaches it fails this line.
    let covered: BTreeSet<String> = expect
        .iter()
        .map(|(_, r)| r.to_string())
        .chain(NEEDS_FORCE_AND_DELETE.iter().map(|r| r.to_string()))
        .collect();
    assert_eq!(shipped_ids(), covered);
    let ok = n.state.verify();
    assert!(ok.status.success(), "{}", stdout(&ok));
}

/// The door's push request carries `force` (git's `+`) and `delete`
/// (protocol 2): the locked rules on main decide them.
#[test]
fn force_and_delete_of_main_are_refused_by_their_rules() {
    let n = night();
    let (run, log) = agent(
        &n,
        r#"set -u
echo one > one.txt && git add one.txt && git commit -qm one
git push --force origin HEAD:refs/heads/main 2>&1; echo "force=$?"
git push origin :refs/heads/master 2>&1; echo "delete=$?"
"#,
    );
    assert!(log.lines().any(|l| l == "force=1"), "{log}");
    assert!(log.contains("no-force-push-to-main"), "{log}");
    assert!(log.lines().any(|l| l == "delete=1"), "{log}");
    assert!(log.contains("no-deleting-main"), "{log}");
    let got = decisions(&n, &run);
    for rule in NEEDS_FORCE_AND_DELETE {
        assert!(
            got.iter()
                .any(|(d, v, r)| d == "push" && v == "refuse" && r == rule),
            "no refusal by {rule} in {got:?}"
        );
    }
}
