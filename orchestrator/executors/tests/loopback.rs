//! The executors against real servers on 127.0.0.1: the real
//! `git http-backend` behind HTTP Basic auth, a GitHub-shaped forge, and a
//! webhook endpoint (tests/src/loopback.rs).

mod common;

use std::error::Error as _;

use common::loopback::{ForgeServer, GitHttpServer, NotifyServer};
use common::{secret_file, Repos};
use orchestrator_executors::{
    notify, open_pull_request, push, remote_ref, Destinations, ExecError, ForgeConfig,
    NotifyConfig, Readers, RemoteConfig,
};

const PASSWORD: &str = "pw-correct-horse-7781";
const WRONG: &str = "pw-wrong-battery-4242";
const FORGE_TOKEN: &str = "tok-forge-5512";
const HOOK_TOKEN: &str = "tok-hook-9031";
const BRANCH: &str = "refs/heads/agent/x";

/// Every text an error can end up in: its display, its chain of sources,
/// its debug form and its audit reason.
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

fn remote(repos: &Repos, server: &GitHttpServer, password: &str) -> RemoteConfig {
    RemoteConfig {
        username: Some("nightshift".into()),
        password_file: Some(secret_file(repos.dir.path(), "password", password)),
        timeout_secs: Some(60),
        ..RemoteConfig::new(server.url(), Readers::Private)
    }
}

#[test]
fn push_lands_exactly_the_commit_over_authenticated_smart_http() {
    let repos = Repos::new();
    let first = repos.commit("a.txt", "one");
    let server = GitHttpServer::start(&repos.bare, "nightshift", PASSWORD);
    let config = remote(&repos, &server, PASSWORD);

    let out = push(&config, &repos.host, &first, BRANCH, None).unwrap();
    assert_eq!(out.new, first);
    assert!(!out.already_there);
    assert_eq!(repos.remote_ref(BRANCH).as_deref(), Some(first.as_str()));
    assert_eq!(
        repos.remote_ref("refs/heads/main"),
        None,
        "only the named ref moves"
    );

    let requests = server.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.method == "POST" && r.path.ends_with("/git-receive-pack") && r.authorized),
        "{requests:?}"
    );

    // A fast-forward under the right lease; then the same again is a no-op.
    let second = repos.commit("b.txt", "two");
    let out = push(&config, &repos.host, &second, BRANCH, Some(&first)).unwrap();
    assert!(!out.already_there);
    assert_eq!(repos.remote_ref(BRANCH).as_deref(), Some(second.as_str()));
    let posts = |s: &GitHttpServer| s.requests().iter().filter(|r| r.method == "POST").count();
    let before = posts(&server);
    let again = push(&config, &repos.host, &second, BRANCH, Some(&first)).unwrap();
    assert!(again.already_there);
    assert_eq!(
        posts(&server),
        before,
        "nothing is sent when the remote already holds it"
    );
    assert_eq!(
        remote_ref(&config, BRANCH).unwrap().as_deref(),
        Some(second.as_str())
    );
    assert_eq!(remote_ref(&config, "refs/heads/absent").unwrap(), None);
}

#[test]
fn a_wrong_password_is_a_final_auth_error_that_does_not_show_it() {
    let repos = Repos::new();
    let commit = repos.commit("a.txt", "one");
    let server = GitHttpServer::start(&repos.bare, "nightshift", PASSWORD);
    let config = remote(&repos, &server, WRONG);

    let err = push(&config, &repos.host, &commit, BRANCH, None).unwrap_err();
    assert!(matches!(err, ExecError::Auth { .. }), "{err}");
    assert!(!err.retryable());
    assert_no_secret(&err, &[WRONG, PASSWORD]);
    assert_eq!(repos.remote_ref(BRANCH), None);
    let requests = server.requests();
    assert!(!requests.is_empty() && requests.iter().all(|r| !r.authorized));
    // The wrong credential was offered once, not in a loop.
    assert!(requests.len() <= 3, "{requests:?}");
}

#[test]
fn a_remote_that_moved_is_stale_and_stays_as_it_was() {
    let repos = Repos::new();
    let theirs = repos.commit("a.txt", "theirs");
    let ours = repos.commit("b.txt", "ours");
    let server = GitHttpServer::start(&repos.bare, "nightshift", PASSWORD);
    let config = remote(&repos, &server, PASSWORD);
    repos.set_remote_ref(BRANCH, &theirs);

    let err = push(&config, &repos.host, &ours, BRANCH, None).unwrap_err();
    match &err {
        ExecError::Stale {
            expected, found, ..
        } => {
            assert_eq!(expected, &None);
            assert_eq!(found.as_deref(), Some(theirs.as_str()));
        }
        other => panic!("expected stale, got {other}"),
    }
    assert!(!err.retryable());
    let wrong_lease = "0".repeat(39) + "1";
    let err = push(&config, &repos.host, &ours, BRANCH, Some(&wrong_lease)).unwrap_err();
    assert_eq!(err.class(), "stale", "{err}");
    assert_eq!(repos.remote_ref(BRANCH).as_deref(), Some(theirs.as_str()));
    assert!(
        !server.requests().iter().any(|r| r.method == "POST"),
        "nothing is sent on a failed lease"
    );
}

#[test]
fn a_non_fast_forward_is_refused() {
    let repos = Repos::new();
    let base = repos.commit("a.txt", "base");
    let on_remote = repos.commit("b.txt", "remote side");
    common::git(&repos.host, &["checkout", "-q", "-b", "other", &base]);
    let sideways = repos.commit("c.txt", "sideways");
    let server = GitHttpServer::start(&repos.bare, "nightshift", PASSWORD);
    let config = remote(&repos, &server, PASSWORD);
    repos.set_remote_ref(BRANCH, &on_remote);

    let err = push(&config, &repos.host, &sideways, BRANCH, Some(&on_remote)).unwrap_err();
    assert!(matches!(err, ExecError::Rejected { .. }), "{err}");
    assert!(!err.retryable());
    assert_eq!(
        repos.remote_ref(BRANCH).as_deref(),
        Some(on_remote.as_str())
    );
}

#[test]
fn an_update_the_remote_declines_is_rejected_not_reported_done() {
    let repos = Repos::new();
    let commit = repos.commit("a.txt", "one");
    repos.pre_receive("echo 'policy says no' >&2; exit 1");
    let server = GitHttpServer::start(&repos.bare, "nightshift", PASSWORD);
    let config = remote(&repos, &server, PASSWORD);
    let err = push(&config, &repos.host, &commit, BRANCH, None).unwrap_err();
    assert!(matches!(err, ExecError::Rejected { .. }), "{err}");
    assert!(!err.retryable());
    assert_eq!(repos.remote_ref(BRANCH), None);
}

#[test]
fn a_remote_that_moves_between_listing_and_update_refuses_the_update() {
    // The hook plays someone whose push lands after our lease check: it
    // moves the ref while our update is in flight. The update names the old
    // value we listed, so the remote must refuse it.
    let repos = Repos::new();
    let theirs = repos.commit("a.txt", "theirs");
    let ours = repos.commit("b.txt", "ours");
    repos.set_remote_ref("refs/heads/theirs", &theirs);
    repos.pre_receive(&format!(
        "unset GIT_QUARANTINE_PATH; git update-ref {BRANCH} {theirs}"
    ));
    let server = GitHttpServer::start(&repos.bare, "nightshift", PASSWORD);
    let config = remote(&repos, &server, PASSWORD);
    let err = push(&config, &repos.host, &ours, BRANCH, None).unwrap_err();
    assert!(matches!(err, ExecError::Rejected { .. }), "{err}");
    assert_eq!(repos.remote_ref(BRANCH).as_deref(), Some(theirs.as_str()));
}

#[test]
fn a_commit_missing_from_the_host_is_refused_before_connecting() {
    let repos = Repos::new();
    repos.commit("a.txt", "one");
    let server = GitHttpServer::start(&repos.bare, "nightshift", PASSWORD);
    let config = remote(&repos, &server, PASSWORD);
    let absent = "ab".repeat(20);
    let err = push(&config, &repos.host, &absent, BRANCH, None).unwrap_err();
    assert_eq!(err.class(), "missing_commit", "{err}");
    assert!(server.requests().is_empty());
}

#[test]
fn servers_that_are_down_give_retryable_errors() {
    // Port 1 of loopback: nothing listens there (a dropped test server's
    // port could be taken by another test's server at once).
    const DOWN: &str = "http://127.0.0.1:1";
    let repos = Repos::new();
    let commit = repos.commit("a.txt", "one");
    let git_server = GitHttpServer::start(&repos.bare, "nightshift", PASSWORD);
    let mut config = remote(&repos, &git_server, PASSWORD);
    config.url = format!("{DOWN}/origin.git");
    let err = push(&config, &repos.host, &commit, BRANCH, None).unwrap_err();
    assert!(err.retryable(), "{err}: {err:?}");
    assert_no_secret(&err, &[PASSWORD]);

    let config = forge_config(&repos, DOWN);
    let err = open_pull_request(&config, "agent/x", "main", &commit, "t", "b").unwrap_err();
    assert!(err.retryable(), "{err}: {err:?}");
    assert_no_secret(&err, &[FORGE_TOKEN]);

    let config = notify_config(&repos, &format!("{DOWN}/hook"), true);
    let err = notify(&config, "act-1", b"hello", "text/plain").unwrap_err();
    assert!(err.retryable(), "{err}: {err:?}");
    assert_no_secret(&err, &[HOOK_TOKEN]);
}

fn forge_config(repos: &Repos, api: &str) -> ForgeConfig {
    ForgeConfig {
        timeout_secs: Some(30),
        ..ForgeConfig::new(
            api,
            "own/repo",
            "origin",
            secret_file(repos.dir.path(), "forge-token", FORGE_TOKEN),
            Readers::Public,
        )
    }
}

fn notify_config(repos: &Repos, url: &str, with_token: bool) -> NotifyConfig {
    NotifyConfig {
        token_file: with_token.then(|| secret_file(repos.dir.path(), "hook-token", HOOK_TOKEN)),
        timeout_secs: Some(30),
        ..NotifyConfig::new(url, Readers::Private)
    }
}

#[test]
fn a_pull_request_reaches_the_forge_as_approved() {
    let repos = Repos::new();
    let commit = repos.commit("a.txt", "one");
    let forge = ForgeServer::start(FORGE_TOKEN);
    let config = forge_config(&repos, &forge.url());

    let out = open_pull_request(
        &config,
        BRANCH,
        "refs/heads/main",
        &commit,
        "Fix it",
        "Body\nlines",
    )
    .unwrap();
    assert_eq!(out.number, 1);
    assert!(out.url.ends_with("/own/repo/pull/1"), "{}", out.url);
    let requests = forge.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("POST", "/repos/own/repo/pulls")
    );
    assert_eq!(
        r.authorization.as_deref(),
        Some(format!("Bearer {FORGE_TOKEN}").as_str())
    );
    assert_eq!(r.content_type.as_deref(), Some("application/json"));
    assert_eq!(
        r.json(),
        serde_json::json!({"title": "Fix it", "head": "agent/x", "base": "main", "body": "Body\nlines"})
    );
    let next = open_pull_request(&config, "agent/y", "main", &commit, "t", "").unwrap();
    assert_eq!(next.number, 2);
}

#[test]
fn a_refused_forge_token_is_a_final_error_that_does_not_show_it() {
    let repos = Repos::new();
    let commit = repos.commit("a.txt", "one");
    let forge = ForgeServer::start("tok-the-forge-wants");
    let config = forge_config(&repos, &forge.url());
    let err = open_pull_request(&config, "agent/x", "main", &commit, "t", "b").unwrap_err();
    assert!(matches!(err, ExecError::Auth { .. }), "{err}");
    assert!(!err.retryable());
    assert_no_secret(&err, &[FORGE_TOKEN, "tok-the-forge-wants"]);
    assert!(!forge.requests()[0].authorized);
}

#[test]
fn notify_posts_exactly_the_body() {
    let repos = Repos::new();
    let hook = NotifyServer::start();
    let body: &[u8] = b"line one\nline two \xff\x00 end";
    let out = notify(
        &notify_config(&repos, &hook.url(), false),
        "act-1",
        body,
        "application/octet-stream",
    )
    .unwrap();
    assert_eq!(out.status, 204);
    let out = notify(
        &notify_config(&repos, &hook.url(), true),
        "act-2",
        b"{\"x\":1}",
        "application/json",
    )
    .unwrap();
    assert_eq!(out.status, 204);
    let requests = hook.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].body, body);
    assert_eq!(
        requests[0].content_type.as_deref(),
        Some("application/octet-stream")
    );
    assert_eq!(requests[0].authorization, None);
    assert_eq!(requests[1].body, b"{\"x\":1}");
    assert_eq!(
        requests[1].authorization.as_deref(),
        Some(format!("Bearer {HOOK_TOKEN}").as_str())
    );
}

#[test]
fn configs_print_paths_never_secrets() {
    let repos = Repos::new();
    let dir = repos.dir.path();
    secret_file(dir, "password", PASSWORD);
    secret_file(dir, "forge-token", FORGE_TOKEN);
    secret_file(dir, "hook-token", HOOK_TOKEN);
    let text = format!(
        "[remotes.origin]\nurl = \"http://127.0.0.1:1/r.git\"\nreaders = \"private\"\n\
         username = \"u\"\npassword_file = \"{d}/password\"\n\
         [forges.f]\napi = \"http://127.0.0.1:1\"\nrepo = \"o/r\"\nremote = \"origin\"\ntoken_file = \"{d}/forge-token\"\nreaders = \"public\"\n\
         [notify.n]\nurl = \"http://127.0.0.1:1/h\"\nreaders = \"private\"\ntoken_file = \"{d}/hook-token\"\n",
        d = dir.display()
    );
    let destinations = Destinations::parse(&text, "test").unwrap();
    let shown = format!("{destinations:?} {destinations:#?}");
    for secret in [PASSWORD, FORGE_TOKEN, HOOK_TOKEN] {
        assert!(!shown.contains(secret), "{shown}");
    }
    assert!(shown.contains("forge-token"), "the path is shown: {shown}");
}

/// The host repository's own config names another place for the remote's
/// URL (`insteadOf`, `pushInsteadOf`): the push still goes where the
/// owner's destination says.
#[test]
fn the_host_repositorys_config_cannot_redirect_a_push() {
    let repos = Repos::new();
    let commit = repos.commit("a.txt", "one");
    let url = format!("file://{}", repos.bare.display());
    let decoy = repos.dir.path().join("decoy.git");
    common::git(
        repos.dir.path(),
        &["init", "-q", "--bare", decoy.to_str().unwrap()],
    );
    let decoy_url = format!("file://{}", decoy.display());
    for key in ["insteadOf", "pushInsteadOf"] {
        common::git(
            &repos.host,
            &["config", &format!("url.{decoy_url}.{key}"), &url],
        );
    }
    let config = RemoteConfig::new(url, Readers::Private);
    push(&config, &repos.host, &commit, BRANCH, None).unwrap();
    assert_eq!(repos.remote_ref(BRANCH).as_deref(), Some(commit.as_str()));
    let decoy_refs = common::git(
        repos.dir.path(),
        &["--git-dir", decoy.to_str().unwrap(), "for-each-ref"],
    );
    assert_eq!(decoy_refs, "", "the push went to the decoy");
}
