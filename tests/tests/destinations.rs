//! Approved acts reach real destinations: `nightshift destinations` lists
//! and checks the owner's file; a night whose push goes to an HTTPS remote
//! with a test CA, whose morning summary goes to a signed webhook over TLS
//! once, carrying nothing the agent wrote; the lease holds over TLS.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tests::loopback::{GitHttpServer, NotifyServer, TestCa};
use tests::morning::remote_ref;
use tests::{git, image, make_repo, stderr, stdout, State};

const TOKEN: &str = "tok-https-night-4471";
/// A Standard Webhooks secret (`whsec_` + base64 of "hook-key-night-8812"):
/// the receiver checks both signatures, each with its own reading of it.
const HOOK_KEY: &str = "whsec_aG9vay1rZXktbmlnaHQtODgxMg==";
const SENTINEL: &str = "SENTINEL7f3a-ignore-previous-instructions";

fn secret(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("{text}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

#[test]
fn the_destinations_command_lists_them_without_credentials() {
    let state = State::new();
    let secrets = state.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    let token = secret(&secrets, "gh.token", TOKEN);
    std::fs::write(
        state.path().join("destinations.toml"),
        format!(
            "[remotes.origin]\nurl = \"https://github.com/owner/name.git\"\nreaders = \"public\"\ntoken_file = \"{t}\"\n\n\
             [remotes.backup]\nurl = \"git@git.example.com:owner/name.git\"\nreaders = \"private\"\nssh_agent = true\nknown_hosts = \"/etc/nightshift/known_hosts\"\n\n\
             [forges.gh]\napi = \"https://api.github.com\"\nrepo = \"owner/name\"\nremote = \"origin\"\ntoken_file = \"{t}\"\nreaders = \"public\"\n\n\
             [forges.lab]\nkind = \"gitlab\"\napi = \"https://gitlab.example.com/api/v4\"\nrepo = \"g/s/n\"\nremote = \"backup\"\ntoken_file = \"{t}\"\nreaders = \"private\"\n\n\
             [notify.hook]\nkind = \"webhook\"\nurl = \"https://hooks.example.com/n\"\nreaders = \"private\"\nsecret_file = \"{t}\"\n",
            t = token.display()
        ),
    )
    .unwrap();
    let out = state.run(&["destinations", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let listed: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let kinds: Vec<(&str, &str)> = listed
        .iter()
        .map(|l| (l["alias"].as_str().unwrap(), l["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("backup", "ssh"),
            ("origin", "https"),
            ("gh", "github"),
            ("lab", "gitlab"),
            ("hook", "webhook")
        ]
    );
    let text = stdout(&state.run(&["destinations"]));
    assert!(text.contains("https://github.com/owner/name.git"), "{text}");
    assert!(!text.contains(TOKEN) && !String::from_utf8_lossy(&out.stdout).contains(TOKEN));
}

#[test]
fn every_problem_of_the_file_is_named_by_file_line_and_alias() {
    let state = State::new();
    let file = state.path().join("destinations.toml");
    std::fs::write(
        &file,
        "# destinations\n\
         [remotes.cleartext]\nurl = \"http://git.example.com/r.git\"\nreaders = \"private\"\ntoken_file = \"/etc/t\"\n\n\
         [remotes.ok]\nurl = \"http://127.0.0.1:9/r.git\"\nreaders = \"private\"\ntoken_file = \"/etc/t\"\n\n\
         [remotes.nohosts]\nurl = \"git@h:r.git\"\nreaders = \"private\"\nssh_agent = true\n",
    )
    .unwrap();
    let out = state.run(&["destinations"]);
    assert_eq!(out.status.code(), Some(3), "{}", stdout(&out));
    let err = stderr(&out);
    let path = file.display().to_string();
    assert!(
        err.lines().any(|l| l.contains(&path)
            && l.contains("line 2")
            && l.contains("[remotes.cleartext]")
            && l.contains("travel in clear")),
        "{err}"
    );
    assert!(
        err.lines().any(|l| l.contains(&path)
            && l.contains("line 12")
            && l.contains("[remotes.nohosts]")
            && l.contains("known_hosts")),
        "{err}"
    );
    assert!(!err.contains("[remotes.ok]"), "{err}");
    // The owner accepts clear text for that one explicitly: loaded (with
    // a token file that exists, the supervisor's own and 0600: each is
    // checked once the file itself is sound).
    let token = secret(state.path(), "t.token", TOKEN);
    let fixed = std::fs::read_to_string(&file)
        .unwrap()
        .replace("/etc/t", token.to_str().unwrap())
        .replace(
            &format!("token_file = \"{}\"\n\n[remotes.ok]", token.display()),
            &format!(
                "token_file = \"{}\"\ninsecure = true\n\n[remotes.ok]",
                token.display()
            ),
        )
        .replace(
            "ssh_agent = true\n",
            "ssh_agent = true\nknown_hosts = \"/k\"\n",
        );
    std::fs::write(&file, fixed).unwrap();
    let out = state.run(&["destinations"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A night over TLS: the agent's push lands on an HTTPS remote of a test CA
/// once approved; its morning summary goes once to a signed webhook.
struct Night {
    state: State,
    repo: tempfile::TempDir,
    _remote_dir: tempfile::TempDir,
    bare: PathBuf,
    git_server: GitHttpServer,
    hook: NotifyServer,
    key: PathBuf,
}

fn night() -> Night {
    night_with("")
}

/// A night whose `[summary]` table has `extra` lines too.
fn night_with(extra: &str) -> Night {
    let state = State::new();
    let repo = make_repo();
    let remote_dir = tempfile::tempdir().unwrap();
    let bare = remote_dir.path().join("origin.git");
    git(
        remote_dir.path(),
        &["init", "-q", "--bare", bare.to_str().unwrap()],
    );
    let ca = TestCa::new("night CA");
    let git_server = GitHttpServer::start_tls(&bare, "x-access-token", TOKEN, ca.server());
    let hook = NotifyServer::webhook(HOOK_KEY, Some(ca.server()));
    let secrets = state.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    let token = secret(&secrets, "origin.token", TOKEN);
    let key = secret(&secrets, "hook.key", HOOK_KEY);
    let ca_file = ca.write(&secrets, "ca.pem");
    std::fs::write(
        state.path().join("destinations.toml"),
        format!(
            "[remotes.origin]\nurl = \"{}\"\nreaders = \"private\"\ntoken_file = \"{}\"\nca_file = \"{}\"\n\n\
             [notify.morning]\nkind = \"webhook\"\nurl = \"{}\"\nreaders = \"private\"\nsecret_file = \"{}\"\nca_file = \"{}\"\n\n\
             [summary]\nnotify = \"morning\"\nreview = \"nightshift queue\"\n{}",
            git_server.url(),
            token.display(),
            ca_file.display(),
            hook.url(),
            key.display(),
            ca_file.display(),
            extra,
        ),
    )
    .unwrap();
    assert!(state.run(&["owner", "init"]).status.success());
    let key = state.path().join("owner.key");
    Night {
        state,
        repo,
        _remote_dir: remote_dir,
        bare,
        git_server,
        hook,
        key,
    }
}

fn queue(n: &Night) -> Vec<serde_json::Value> {
    let out = n.state.run(&["queue", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn push_act(n: &Night, branch: &str) -> String {
    let q = queue(n);
    q.iter()
        .find(|a| a["act"]["door"] == "push" && a["act"]["routing"].to_string().contains(branch))
        .unwrap_or_else(|| panic!("no push act for {branch} in {q:?}"))["act"]["id"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn a_night_over_tls_reaches_its_remote_and_its_summary_arrives_once_without_agent_text() {
    let n = night();
    let script = format!(
        "echo a > '{SENTINEL}.txt' && git add -A && git commit -qm '{SENTINEL} in the message' && \
         git push origin HEAD:refs/heads/agent/one && \
         echo b > b.txt && git add -A && git commit -qm 'b {SENTINEL}' && \
         git push origin HEAD:refs/heads/agent/two-{SENTINEL}"
    );
    let out = n.state.run(&[
        "run",
        "--repo",
        n.repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "bash",
        "-c",
        &script,
    ]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let runs = n.state.runs();
    let run_id = runs.last().unwrap()["id"].as_str().unwrap().to_string();

    // The summary went once, signed, when the (only, so last) run ended.
    let posts = n.hook.requests();
    assert_eq!(posts.len(), 1, "{posts:?}");
    let summary = &posts[0];
    assert!(
        summary.authorized,
        "the receiver verified both signatures and the timestamp"
    );
    assert!(
        summary
            .webhook_id
            .as_deref()
            .is_some_and(|id| id.starts_with("summary_")),
        "{summary:?}"
    );
    let body = String::from_utf8_lossy(&summary.body).to_string();
    assert!(
        !body.contains("SENTINEL"),
        "agent text in the summary: {body}"
    );
    let v = summary.json();
    assert_eq!(v["event"], "summary");
    assert_eq!(v["data"]["run_ids"], serde_json::json!([run_id]));
    assert_eq!(v["data"]["acts"]["pending"], 2);
    assert_eq!(v["data"]["audit"]["intact"], true);
    assert!(v["text"]
        .as_str()
        .unwrap()
        .contains("review: nightshift queue"));

    // Approved, the first push lands over TLS with the token.
    let one = push_act(&n, "refs/heads/agent/one");
    let out = n
        .state
        .run(&["approve", &one, "--owner-key-file", n.key.to_str().unwrap()]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(remote_ref(&n.bare, "refs/heads/agent/one").is_some());
    assert!(n
        .git_server
        .requests()
        .iter()
        .any(|r| r.method == "POST" && r.path.ends_with("/git-receive-pack") && r.authorized));

    // The second's branch moves before the morning: stale, not overwritten.
    let two_ref = format!("refs/heads/agent/two-{SENTINEL}");
    let two = push_act(&n, &two_ref);
    let other = tempfile::tempdir().unwrap();
    git(other.path(), &["init", "-q", "-b", "main"]);
    std::fs::write(other.path().join("x.txt"), "x").unwrap();
    git(other.path(), &["add", "-A"]);
    git(other.path(), &["commit", "-qm", "someone else"]);
    git(
        other.path(),
        &[
            "push",
            "-q",
            n.bare.to_str().unwrap(),
            &format!("HEAD:{two_ref}"),
        ],
    );
    let theirs = remote_ref(&n.bare, &two_ref);
    let out = n
        .state
        .run(&["approve", &two, "--owner-key-file", n.key.to_str().unwrap()]);
    assert!(
        stdout(&out).contains("stale"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(remote_ref(&n.bare, &two_ref), theirs);

    // Once: asked again with no run ended since, nothing is sent.
    let out = n.state.run(&["summary", "--send"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("not sent"), "{}", stdout(&out));
    assert_eq!(n.hook.requests().len(), 1);
    let printed = stdout(&n.state.run(&["summary"]));
    assert!(!printed.contains("SENTINEL"), "{printed}");
    assert!(n.state.verify().status.success());
}

#[test]
fn with_a_configured_time_the_summary_waits_for_it_and_goes_once() {
    // 00:00 UTC has always passed today.
    let n = night_with("at = \"00:00\"\n");
    let out = n.state.run(&[
        "run",
        "--repo",
        n.repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "bash",
        "-c",
        "exit 3",
    ]);
    assert!(!out.status.success());
    assert!(
        n.hook.requests().is_empty(),
        "with `at`, the end of a run sends nothing"
    );
    let out = n.state.run(&["summary", "--due"]);
    assert!(
        stdout(&out).contains("summary sent: 1 runs"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let posts = n.hook.requests();
    assert_eq!(posts.len(), 1);
    assert!(posts[0].authorized);
    assert_eq!(posts[0].json()["data"]["runs"]["failed"], 1);
    let out = n.state.run(&["summary", "--due"]);
    assert!(stdout(&out).contains("not sent"), "{}", stdout(&out));
    assert_eq!(n.hook.requests().len(), 1);
}

fn summary_entries(state: &State) -> Vec<serde_json::Value> {
    state.audit_bodies("summary_sent")
}

#[test]
fn a_summary_sent_or_failed_is_an_audit_entry_without_its_text_and_a_failure_is_retried() {
    let n = night_with("at = \"00:00\"\n");
    let out = n.state.run(&[
        "run",
        "--repo",
        n.repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "bash",
        "-c",
        "exit 3",
    ]);
    assert!(!out.status.success());
    assert!(summary_entries(&n.state).is_empty(), "nothing due yet");

    // The receiver answers 503: the send fails, is audited as failed, and
    // nothing is marked sent.
    n.hook.fail_with(503);
    let out = n.state.run(&["summary", "--due"]);
    assert!(!out.status.success(), "{}", stdout(&out));
    let entries = summary_entries(&n.state);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["outcome"], "failed");
    assert_eq!(entries[0]["notify"], "morning");
    assert_eq!(entries[0]["runs"], 1);

    // The receiver is back: the next `--due` sends, and says so.
    n.hook.fail_with(0);
    let out = n.state.run(&["summary", "--due"]);
    assert!(
        stdout(&out).contains("summary sent: 1 runs"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let entries = summary_entries(&n.state);
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_eq!(entries[1]["outcome"], "sent");
    let posts = n.hook.requests();
    assert_eq!(posts.len(), 2, "{posts:?}");
    assert!(posts[1].authorized);
    assert!(posts[0].webhook_id.is_some());
    assert_eq!(
        posts[0].webhook_id, posts[1].webhook_id,
        "the retry carries the same webhook-id"
    );
    let text = posts.last().unwrap().json()["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(entries[1]["message_digest"], hex_sha256(text.as_bytes()));
    assert!(n.state.verify().status.success());
}

fn hex_sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `nightshift destinations` checks every credential file as the executor
/// will read it: a token file readable by everyone, one that is missing,
/// and a secret that is not the supervisor's own kind of file are named
/// (destination, field, file, what is wrong), never their content, and
/// the command fails (exit 3) while still listing the destinations.
#[test]
fn the_destinations_command_checks_every_credential_file() {
    let state = State::new();
    let secrets = state.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    let open = secret(&secrets, "open.token", TOKEN);
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let fine = secret(&secrets, "fine.secret", HOOK_KEY);
    let missing = secrets.join("missing.token");
    std::fs::write(
        state.path().join("destinations.toml"),
        format!(
            "[remotes.origin]\nurl = \"https://github.com/owner/name.git\"\nreaders = \"public\"\ntoken_file = \"{open}\"\n\n\
             [forges.gh]\napi = \"https://api.github.com\"\nrepo = \"owner/name\"\nremote = \"origin\"\ntoken_file = \"{missing}\"\nreaders = \"public\"\n\n\
             [notify.hook]\nkind = \"webhook\"\nurl = \"https://hooks.example.com/n\"\nreaders = \"private\"\nsecret_file = \"{fine}\"\n",
            open = open.display(),
            missing = missing.display(),
            fine = fine.display()
        ),
    )
    .unwrap();
    let out = state.run(&["destinations"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("remotes.origin: token_file {}: ", open.display()))
            && err.contains("mode is 0644"),
        "{err}"
    );
    assert!(
        err.contains(&format!("forges.gh: token_file {}: ", missing.display())),
        "{err}"
    );
    assert!(!err.contains("notify.hook"), "{err}");
    assert!(!err.contains(TOKEN) && !err.contains(HOOK_KEY), "{err}");
    assert!(stdout(&out).contains("https://github.com/owner/name.git"));
}

/// `destinations --probe` asks each remote for its refs and each forge for
/// its open pull requests with the configured credential, changing
/// nothing: a wrong password and a wrong token are named, right ones pass.
#[test]
fn destinations_probe_asks_each_destination_whether_it_takes_the_credential() {
    use tests::loopback::ForgeServer;
    let state = State::new();
    let remote_dir = tempfile::tempdir().unwrap();
    let bare = remote_dir.path().join("origin.git");
    git(
        remote_dir.path(),
        &["init", "-q", "--bare", bare.to_str().unwrap()],
    );
    let server = GitHttpServer::start(&bare, "nightshift", "right-password");
    let forge = ForgeServer::start("right-token");
    let secrets = state.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    let write = |pw: &str, token: &str| {
        let pw = secret(&secrets, "pw", pw);
        let token = secret(&secrets, "token", token);
        std::fs::write(
            state.path().join("destinations.toml"),
            format!(
                "[remotes.origin]\nurl = \"{}\"\nreaders = \"private\"\nusername = \"nightshift\"\npassword_file = \"{}\"\n\n\
                 [forges.forge]\napi = \"{}\"\nrepo = \"owner/name\"\nremote = \"origin\"\ntoken_file = \"{}\"\nreaders = \"private\"\n",
                server.url(),
                pw.display(),
                forge.url(),
                token.display()
            ),
        )
        .unwrap();
    };
    write("wrong-password", "wrong-token");
    // Without --probe nothing is asked: the files themselves are sound.
    let out = state.run(&["destinations"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = state.run(&["destinations", "--probe"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("remotes.origin: probe: ") && err.contains("refused the credential"),
        "{err}"
    );
    assert!(err.contains("forges.forge: probe: "), "{err}");
    assert!(
        !err.contains("wrong-password") && !err.contains("wrong-token"),
        "{err}"
    );
    write("right-password", "right-token");
    let out = state.run(&["destinations", "--probe"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Nothing changed at the remote.
    assert_eq!(git(&bare, &["for-each-ref"]).trim(), "");
}
