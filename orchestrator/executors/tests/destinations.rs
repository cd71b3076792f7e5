//! The executors against real destinations on loopback: the real
//! `git http-backend` over TLS with a test CA, a real OpenSSH server,
//! forges in GitHub's, GitLab's and Gitea's shapes over TLS, and a webhook
//! receiver that verifies the signature (tests/src/loopback.rs).

mod common;

use std::error::Error as _;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::loopback::{
    ssh_keygen, ForgeServer, ForgeShape, GitHttpServer, NotifyServer, SshServer, TestCa,
};
use common::{secret_file, Repos};
use orchestrator_executors::{
    find_pull_request, notify, open_pull_request, push, remote_ref, send, ExecError, ForgeConfig,
    ForgeKind, Message, NotifyConfig, NotifyKind, Readers, RemoteConfig,
};

const TOKEN: &str = "tok-git-https-6620";
const FORGE_TOKEN: &str = "tok-forge-tls-1187";
const HOOK_KEY: &str = "hook-key-5150";
const BRANCH: &str = "refs/heads/agent/x";

fn texts(err: &ExecError) -> Vec<String> {
    let mut out = vec![err.to_string(), format!("{err:?}"), err.audit_reason()];
    let mut source = err.source();
    while let Some(s) = source {
        out.push(s.to_string());
        source = s.source();
    }
    out
}

fn assert_no_secret(err: &ExecError, secrets: &[&str]) {
    for text in texts(err) {
        for secret in secrets {
            assert!(!text.contains(secret), "a secret leaked into {text:?}");
        }
    }
}

/// An https remote with token auth, trusting `ca_file`.
fn https_remote(repos: &Repos, server: &GitHttpServer, ca: &TestCa) -> RemoteConfig {
    RemoteConfig {
        token_file: Some(secret_file(repos.dir.path(), "git-token", TOKEN)),
        ca_file: Some(ca.write(repos.dir.path(), "ca.pem")),
        timeout_secs: Some(60),
        ..RemoteConfig::new(server.url(), Readers::Private)
    }
}

#[test]
fn https_push_with_a_token_lands_and_the_lease_is_held() {
    let repos = Repos::new();
    let first = repos.commit("a.txt", "one");
    let ca = TestCa::new("nightshift test CA");
    let server = GitHttpServer::start_tls(&repos.bare, "x-access-token", TOKEN, ca.server());
    assert!(server.url().starts_with("https://127.0.0.1:"));
    let config = https_remote(&repos, &server, &ca);

    let out = push(&config, &repos.host, &first, BRANCH, None).unwrap();
    assert!(!out.already_there);
    assert_eq!(repos.remote_ref(BRANCH).as_deref(), Some(first.as_str()));
    assert!(server
        .requests()
        .iter()
        .any(|r| r.method == "POST" && r.path.ends_with("/git-receive-pack") && r.authorized));
    assert_eq!(
        remote_ref(&config, BRANCH).unwrap().as_deref(),
        Some(first.as_str())
    );

    // Someone moves the ref after the act was approved at `first`: the push
    // under that lease is stale and overwrites nothing.
    let theirs = repos.commit("b.txt", "theirs");
    let ours = repos.commit("c.txt", "ours");
    repos.set_remote_ref(BRANCH, &theirs);
    let err = push(&config, &repos.host, &ours, BRANCH, Some(&first)).unwrap_err();
    match &err {
        ExecError::Stale {
            expected, found, ..
        } => {
            assert_eq!(expected.as_deref(), Some(first.as_str()));
            assert_eq!(found.as_deref(), Some(theirs.as_str()));
        }
        other => panic!("expected stale, got {other}"),
    }
    assert_eq!(repos.remote_ref(BRANCH).as_deref(), Some(theirs.as_str()));
    assert_no_secret(&err, &[TOKEN]);
}

#[test]
fn https_to_a_server_of_another_ca_or_with_an_expired_certificate_is_refused() {
    let repos = Repos::new();
    let commit = repos.commit("a.txt", "one");
    let ours = TestCa::new("the CA the owner trusts");
    let theirs = TestCa::new("some other CA");

    // Signed by a CA the owner did not name.
    let server = GitHttpServer::start_tls(&repos.bare, "x-access-token", TOKEN, theirs.server());
    let config = https_remote(&repos, &server, &ours);
    let err = push(&config, &repos.host, &commit, BRANCH, None).unwrap_err();
    assert_eq!(err.class(), "tls_untrusted", "{err}: {err:?}");
    assert!(!err.retryable());
    assert!(err.to_string().contains("127.0.0.1"), "{err}");
    assert!(
        server.requests().is_empty(),
        "nothing was sent to an untrusted server"
    );
    assert_eq!(
        remote_ref(&config, BRANCH).unwrap_err().class(),
        "tls_untrusted"
    );
    // Without a ca_file only the system's roots count: refused too.
    let mut system_only = config.clone();
    system_only.ca_file = None;
    let err = push(&system_only, &repos.host, &commit, BRANCH, None).unwrap_err();
    assert_eq!(err.class(), "tls_untrusted", "{err}");
    drop(server);

    // The right CA, but the certificate expired.
    let server =
        GitHttpServer::start_tls(&repos.bare, "x-access-token", TOKEN, ours.expired_server());
    let config = https_remote(&repos, &server, &ours);
    let err = push(&config, &repos.host, &commit, BRANCH, None).unwrap_err();
    assert_eq!(err.class(), "tls_untrusted", "{err}");
    assert!(err.to_string().to_lowercase().contains("expired"), "{err}");
    assert!(server.requests().is_empty());
    assert_eq!(repos.remote_ref(BRANCH), None);
    assert_no_secret(&err, &[TOKEN]);
}

#[test]
fn a_world_readable_token_file_is_refused_naming_it_and_nothing_is_sent() {
    let repos = Repos::new();
    let commit = repos.commit("a.txt", "one");
    let ca = TestCa::new("ca");
    let server = GitHttpServer::start_tls(&repos.bare, "x-access-token", TOKEN, ca.server());
    let config = https_remote(&repos, &server, &ca);
    let token = config.token_file.clone().unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = push(&config, &repos.host, &commit, BRANCH, None).unwrap_err();
    assert_eq!(err.class(), "credential_unreadable", "{err}");
    let chain = texts(&err).join(" | ");
    assert!(chain.contains(&token.display().to_string()), "{chain}");
    assert!(chain.contains("0644"), "{chain}");
    assert!(server.requests().is_empty());

    let forge = ForgeServer::shaped(ForgeShape::Github, FORGE_TOKEN, &repos.bare, ca.server());
    let mut fc = forge_config(&repos, &forge, &ca, ForgeKind::Github);
    std::fs::set_permissions(&fc.token_file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let err = open_pull_request(&fc, "agent/x", "main", &commit, "t", "b").unwrap_err();
    assert_eq!(err.class(), "credential_unreadable", "{err}");
    assert!(forge.requests().is_empty());
    fc.token_file = repos.dir.path().join("absent");
    assert_eq!(
        open_pull_request(&fc, "agent/x", "main", &commit, "t", "b")
            .unwrap_err()
            .class(),
        "credential_unreadable"
    );
}

fn forge_config(repos: &Repos, forge: &ForgeServer, ca: &TestCa, kind: ForgeKind) -> ForgeConfig {
    let (api, repo) = match kind {
        ForgeKind::Github => (forge.url(), "owner/name"),
        ForgeKind::Gitlab => (format!("{}/api/v4", forge.url()), "group/sub/name"),
        ForgeKind::Gitea => (format!("{}/api/v1", forge.url()), "owner/name"),
    };
    ForgeConfig {
        kind,
        ca_file: Some(ca.write(repos.dir.path(), "forge-ca.pem")),
        timeout_secs: Some(30),
        ..ForgeConfig::new(
            api,
            repo,
            "origin",
            secret_file(repos.dir.path(), "forge-token", FORGE_TOKEN),
            Readers::Private,
        )
    }
}

/// Opens, re-opens (an attempt whose answer was lost), and finds a pull
/// request on a forge of `shape`; returns what the forge saw.
fn forge_round(shape: ForgeShape, kind: ForgeKind) -> Vec<common::loopback::Recorded> {
    let repos = Repos::new();
    let commit = repos.commit("a.txt", "one");
    repos.set_remote_ref(BRANCH, &commit);
    let ca = TestCa::new("forge CA");
    let forge = ForgeServer::shaped(shape, FORGE_TOKEN, &repos.bare, ca.server());
    let config = forge_config(&repos, &forge, &ca, kind);

    let out = open_pull_request(
        &config,
        BRANCH,
        "refs/heads/main",
        &commit,
        "Fix it",
        "Body",
    )
    .unwrap();
    assert_eq!((out.number, out.adopted), (1, false));
    assert!(out.url.starts_with("https://127.0.0.1:"), "{}", out.url);
    // The answer of the first was lost (a crash): the same request again
    // adopts the open one instead of making a second.
    let again = open_pull_request(
        &config,
        BRANCH,
        "refs/heads/main",
        &commit,
        "Fix it",
        "Body",
    )
    .unwrap();
    assert_eq!((again.number, again.adopted), (1, true));
    assert_eq!(forge.pull_requests().len(), 1);
    let found = find_pull_request(&config, BRANCH, "main", &commit)
        .unwrap()
        .unwrap();
    assert_eq!(found.number, 1);
    // Another commit is not adopted.
    let other = "f".repeat(40);
    assert_eq!(
        find_pull_request(&config, BRANCH, "main", &other).unwrap(),
        None
    );
    // A head the forge does not have is refused as invalid, and said so.
    let err = open_pull_request(&config, "agent/absent", "main", &commit, "t", "b").unwrap_err();
    assert_eq!(err.class(), "invalid_at_destination", "{err}");
    assert!(
        err.to_string().contains("refused the request as invalid"),
        "{err}"
    );
    let requests = forge.requests();
    for r in &requests {
        assert_eq!(
            r.authorization.as_deref(),
            Some(format!("Bearer {FORGE_TOKEN}").as_str())
        );
    }
    requests
}

#[test]
fn github_pull_requests_over_tls_in_its_exact_shape() {
    let requests = forge_round(ForgeShape::Github, ForgeKind::Github);
    let r = &requests[0];
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("POST", "/repos/owner/name/pulls")
    );
    assert_eq!(
        r.json(),
        serde_json::json!({"title": "Fix it", "head": "agent/x", "base": "main", "body": "Body"})
    );
    let lookup = &requests[2];
    assert_eq!(lookup.method, "GET");
    assert_eq!(
        lookup.query.as_deref(),
        Some("head=owner%3Aagent%2Fx&base=main&state=open")
    );
}

#[test]
fn gitlab_merge_requests_over_tls_in_its_exact_shape() {
    let requests = forge_round(ForgeShape::Gitlab, ForgeKind::Gitlab);
    let r = &requests[0];
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("POST", "/api/v4/projects/group%2Fsub%2Fname/merge_requests")
    );
    assert_eq!(
        r.json(),
        serde_json::json!({"source_branch": "agent/x", "target_branch": "main", "title": "Fix it", "description": "Body"})
    );
    let lookup = &requests[2];
    assert_eq!(lookup.method, "GET");
    assert_eq!(
        lookup.query.as_deref(),
        Some("source_branch=agent%2Fx&target_branch=main&state=opened")
    );
}

#[test]
fn gitea_pull_requests_over_tls_in_its_exact_shape() {
    let requests = forge_round(ForgeShape::Gitea, ForgeKind::Gitea);
    let r = &requests[0];
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("POST", "/api/v1/repos/owner/name/pulls")
    );
    assert_eq!(
        r.json(),
        serde_json::json!({"title": "Fix it", "head": "agent/x", "base": "main", "body": "Body"})
    );
    assert_eq!(
        requests[2].query.as_deref(),
        Some("state=open&page=1&limit=50")
    );
}

#[test]
fn a_pull_request_whose_answer_was_lost_is_found_and_adopted() {
    let repos = Repos::new();
    let commit = repos.commit("a.txt", "one");
    repos.set_remote_ref(BRANCH, &commit);
    let ca = TestCa::new("forge CA");
    for (shape, kind) in [
        (ForgeShape::Gitlab, ForgeKind::Gitlab),
        (ForgeShape::Gitea, ForgeKind::Gitea),
    ] {
        let forge = ForgeServer::shaped(shape, FORGE_TOKEN, &repos.bare, ca.server());
        let mut config = forge_config(&repos, &forge, &ca, kind);
        config.timeout_secs = Some(1);
        forge.hold_answers(Duration::from_secs(5));
        let err = open_pull_request(&config, BRANCH, "main", &commit, "t", "b").unwrap_err();
        assert_eq!(err.class(), "timed_out", "{err}");
        assert!(!err.retryable(), "the request may have been acted on");
        let found = find_pull_request(&config, BRANCH, "main", &commit)
            .unwrap()
            .expect("the request the forge recorded is found");
        assert_eq!((found.number, found.adopted), (1, true));
    }
}

#[test]
fn webhooks_are_signed_and_the_receiver_verifies_them() {
    let repos = Repos::new();
    let ca = TestCa::new("hook CA");
    let hook = NotifyServer::webhook(HOOK_KEY, Some(ca.server()));
    let mut config = NotifyConfig {
        kind: NotifyKind::Webhook,
        secret_file: Some(secret_file(repos.dir.path(), "hook-key", HOOK_KEY)),
        ca_file: Some(ca.write(repos.dir.path(), "ca.pem")),
        ..NotifyConfig::new(hook.url(), Readers::Private)
    };
    assert_eq!(
        notify(&config, "act-1", b"the build is green", "text/plain")
            .unwrap()
            .status,
        204
    );
    let data = serde_json::json!({"runs": 2});
    send(
        &config,
        &Message {
            id: None,
            event: "summary",
            text: "2 runs",
            data: Some(&data),
        },
    )
    .unwrap();
    let requests = hook.requests();
    assert_eq!(requests.len(), 2);
    assert!(
        requests.iter().all(|r| r.authorized),
        "both signatures verify, the timestamp within 5 minutes"
    );
    // The act's id is the Standard Webhooks message id.
    assert_eq!(requests[0].webhook_id.as_deref(), Some("act-1"));
    assert!(requests[1]
        .webhook_id
        .as_deref()
        .is_some_and(|id| id.starts_with("msg_")));
    assert_eq!(requests[0].json()["text"], "the build is green");
    assert_eq!(requests[0].json()["event"], "message");
    assert_eq!(requests[1].json()["data"]["runs"], 2);
    assert_eq!(
        requests[0].content_type.as_deref(),
        Some("application/json")
    );

    // A sender with another key is caught by the receiver.
    config.secret_file = Some(secret_file(repos.dir.path(), "wrong-key", "not-the-key"));
    let err = notify(&config, "act-2", b"forged", "text/plain").unwrap_err();
    assert_eq!(err.class(), "auth_refused", "{err}");
    assert!(!hook.requests()[2].authorized);
    assert_no_secret(&err, &[HOOK_KEY, "not-the-key"]);

    // Without the CA the receiver's certificate is not trusted.
    config.ca_file = None;
    let err = notify(&config, "act-3", b"x", "text/plain").unwrap_err();
    assert_eq!(err.class(), "tls_untrusted", "{err}");
    assert_eq!(hook.requests().len(), 3);
}

#[test]
fn a_slack_compatible_hook_gets_text_and_its_url_stays_secret() {
    let repos = Repos::new();
    let hook = NotifyServer::start();
    let url = format!("{}/services/T000/B000/XXSECRETXX", hook.url());
    let config = NotifyConfig {
        kind: NotifyKind::Slack,
        url: None,
        url_file: Some(secret_file(repos.dir.path(), "slack.url", &url)),
        ..NotifyConfig::new("unused", Readers::Private)
    };
    send(
        &config,
        &Message {
            id: None,
            event: "summary",
            text: "3 runs ended",
            data: None,
        },
    )
    .unwrap();
    let r = &hook.requests()[0];
    assert_eq!(r.path, "/hook/services/T000/B000/XXSECRETXX");
    assert_eq!(r.json(), serde_json::json!({"text": "3 runs ended"}));
    drop(hook);
    // The endpoint is down: the error names the file, never the URL.
    let err = send(
        &config,
        &Message {
            id: None,
            event: "summary",
            text: "x",
            data: None,
        },
    )
    .unwrap_err();
    assert_no_secret(&err, &["XXSECRETXX"]);
    assert!(err.to_string().contains("slack.url"), "{err}");
}

/// An ssh remote to a bare repository behind a real sshd.
fn ssh_remote(
    repos: &Repos,
    server: &SshServer,
    key: &std::path::Path,
    known_hosts: &str,
) -> RemoteConfig {
    let kh = repos.dir.path().join("known_hosts");
    std::fs::write(&kh, known_hosts).unwrap();
    RemoteConfig {
        ssh_key_file: Some(key.to_path_buf()),
        known_hosts: Some(kh),
        timeout_secs: Some(60),
        ..RemoteConfig::new(server.url(&repos.bare), Readers::Private)
    }
}

#[test]
fn ssh_push_with_a_key_lands_and_unknown_or_changed_host_keys_are_refused() {
    let repos = Repos::new();
    let first = repos.commit("a.txt", "one");
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("id_ed25519");
    ssh_keygen(&key);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let public = std::fs::read_to_string(keys.path().join("id_ed25519.pub")).unwrap();
    let server = SshServer::start(&public);

    let config = ssh_remote(&repos, &server, &key, &server.known_hosts_line());
    let out = push(&config, &repos.host, &first, BRANCH, None).unwrap();
    assert!(!out.already_there);
    assert_eq!(repos.remote_ref(BRANCH).as_deref(), Some(first.as_str()));
    assert_eq!(
        remote_ref(&config, BRANCH).unwrap().as_deref(),
        Some(first.as_str())
    );
    // The lease holds over SSH too.
    let theirs = repos.commit("b.txt", "theirs");
    let ours = repos.commit("c.txt", "ours");
    repos.set_remote_ref(BRANCH, &theirs);
    let err = push(&config, &repos.host, &ours, BRANCH, Some(&first)).unwrap_err();
    assert_eq!(err.class(), "stale", "{err}");
    assert_eq!(repos.remote_ref(BRANCH).as_deref(), Some(theirs.as_str()));

    let host = format!("[127.0.0.1]:{}", server.port());
    // A known_hosts that does not list this server: unknown, named.
    let unknown = ssh_remote(&repos, &server, &key, "# nothing yet\n");
    let err = push(&unknown, &repos.host, &ours, BRANCH, Some(&theirs)).unwrap_err();
    assert_eq!(err.class(), "host_key_refused", "{err}");
    let shown = err.to_string();
    assert!(
        shown.contains("unknown host key") && shown.contains(&host),
        "{shown}"
    );
    assert!(
        shown.contains("ssh-ed25519") && shown.contains("SHA256:"),
        "{shown}"
    );
    assert_eq!(
        remote_ref(&unknown, BRANCH).unwrap_err().class(),
        "host_key_refused"
    );

    // Another key listed for it: changed, named.
    let other = keys.path().join("other");
    ssh_keygen(&other);
    let other_pub = std::fs::read_to_string(keys.path().join("other.pub")).unwrap();
    let mut f = other_pub.split_whitespace();
    let line = format!("{host} {} {}\n", f.next().unwrap(), f.next().unwrap());
    let changed = ssh_remote(&repos, &server, &key, &line);
    let err = push(&changed, &repos.host, &ours, BRANCH, Some(&theirs)).unwrap_err();
    assert_eq!(err.class(), "host_key_refused", "{err}");
    assert!(err.to_string().contains("CHANGED"), "{err}");
    assert_eq!(repos.remote_ref(BRANCH).as_deref(), Some(theirs.as_str()));

    // A key file open to others is refused before connecting.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = push(&config, &repos.host, &ours, BRANCH, Some(&theirs)).unwrap_err();
    assert_eq!(err.class(), "credential_unreadable", "{err}");
}
