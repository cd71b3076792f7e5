//! Guarantee 9 at the HTTP layer, against the real `nightshift serve`:
//! every state-changing endpoint refuses without a session, without the
//! owner's role, without the session's CSRF token, and from another origin;
//! a forged `Host` is refused; sessions are strict cookies, rotated at
//! login and ended at logout; logins are rate-limited; every page carries a
//! Content-Security-Policy without inline script. What the dashboard
//! decides goes through the supervisor's one command API and is recorded
//! under the account that decided.

use serde_json::json;
use tests::browser::{
    add_accounts, request, request_from, Client, Serve, OWNER, OWNER_PASSWORD, VIEWER,
    VIEWER_PASSWORD,
};
use tests::{stderr, State};

fn setup() -> (State, Serve) {
    let state = State::new();
    assert!(state.run(&["owner", "init"]).status.success());
    add_accounts(&state);
    let serve = Serve::start(&state, &[]);
    (state, serve)
}

/// Every state-changing endpoint, with a body that would do something.
fn changing() -> Vec<(&'static str, serde_json::Value)> {
    vec![
        ("/api/v1/acts/approve", json!({"act": ["01ACT"]})),
        (
            "/api/v1/acts/reject",
            json!({"act": ["01ACT"], "why": "no"}),
        ),
        (
            "/api/v1/acts/approve-commit",
            json!({"commit": "0123456789012345678901234567890123456789"}),
        ),
        (
            "/api/v1/kill",
            json!({"confirm": "yes", "why": "test", "freeze": "true"}),
        ),
        ("/api/v1/freeze", json!({"why": "from a forged request"})),
        ("/api/v1/thaw", json!({})),
        ("/api/v1/policy/ratify", json!({"proposal": "p"})),
        ("/api/v1/runs/01run/continue", json!({"max_tokens": "10"})),
    ]
}

fn frozen(state: &State) -> serde_json::Value {
    let out = state.run(&["policy", "list", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["frozen"].clone()
}

#[test]
fn every_state_changing_endpoint_refuses_without_session_owner_or_token() {
    let (state, serve) = setup();
    let owner = Client::login(&serve, OWNER, OWNER_PASSWORD);
    let viewer = Client::login(&serve, VIEWER, VIEWER_PASSWORD);
    let host = serve.host();
    for (path, body) in changing() {
        let body = body.to_string();
        let send = |extra: &[(&str, &str)]| {
            let mut h: Vec<(&str, &str)> =
                vec![("Host", &host), ("Content-Type", "application/json")];
            h.extend_from_slice(extra);
            request(serve.addr, "POST", path, &h, &body)
        };
        let r = send(&[]);
        assert_eq!(r.status, 401, "{path} without a session: {}", r.body);
        let r = send(&[("Cookie", &viewer.cookie), ("X-CSRF-Token", &viewer.csrf)]);
        assert_eq!(r.status, 403, "{path} as a viewer: {}", r.body);
        let r = send(&[("Cookie", &owner.cookie)]);
        assert_eq!(r.status, 403, "{path} without a token: {}", r.body);
        assert!(r.body.contains("CSRF"), "{}", r.body);
        let r = send(&[("Cookie", &owner.cookie), ("X-CSRF-Token", &viewer.csrf)]);
        assert_eq!(
            r.status, 403,
            "{path} with another session's token: {}",
            r.body
        );
        let r = send(&[
            ("Cookie", &owner.cookie),
            ("X-CSRF-Token", &owner.csrf),
            ("Origin", "http://evil.example"),
        ]);
        assert_eq!(r.status, 403, "{path} from another origin: {}", r.body);
        let r = send(&[
            ("Cookie", &owner.cookie),
            ("X-CSRF-Token", &owner.csrf),
            ("Sec-Fetch-Site", "cross-site"),
        ]);
        assert_eq!(r.status, 403, "{path} cross-site: {}", r.body);
        // A form post carries the token in the body: the same checks.
        let r = request(
            serve.addr,
            "POST",
            path,
            &[
                ("Host", &host),
                ("Cookie", &owner.cookie),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            "csrf=wrong&why=x",
        );
        assert_eq!(r.status, 403, "{path} with a wrong form token: {}", r.body);
    }
    // Nothing of it happened.
    assert!(
        frozen(&state).is_null(),
        "a refused request froze nightshift"
    );
    // And the owner, with the token, from this origin, can: freeze and thaw.
    let r = owner.post("/api/v1/freeze", &json!({"why": "owner's freeze"}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(frozen(&state), "owner's freeze");
    let r = request(
        serve.addr,
        "POST",
        "/api/v1/thaw",
        &[
            ("Host", &host),
            ("Cookie", &owner.cookie),
            ("X-CSRF-Token", &owner.csrf),
            ("Origin", &format!("http://{host}")),
            ("Sec-Fetch-Site", "same-origin"),
            ("Content-Type", "application/json"),
        ],
        "{}",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(frozen(&state).is_null());
}

#[test]
fn a_forged_host_is_refused() {
    let (_state, serve) = setup();
    let port = serve.addr.port();
    let evil = format!("evil.example:{port}");
    let ok = request(serve.addr, "GET", "/login", &[("Host", &serve.host())], "");
    assert_eq!(ok.status, 200);
    let local = format!("localhost:{port}");
    let ok = request(serve.addr, "GET", "/login", &[("Host", &local)], "");
    assert_eq!(ok.status, 200);
    for path in ["/login", "/", "/api/v1/runs", "/assets/app.js"] {
        let r = request(serve.addr, "GET", path, &[("Host", &evil)], "");
        assert_eq!(r.status, 421, "{path}: {}", r.body);
    }
    let r = request(serve.addr, "GET", "/login", &[], "");
    assert_eq!(r.status, 421, "no Host at all: {}", r.body);
    // A rebinding page that learnt a session still gets nothing.
    let owner = Client::login(&serve, OWNER, OWNER_PASSWORD);
    let r = request(
        serve.addr,
        "POST",
        "/api/v1/freeze",
        &[
            ("Host", &evil),
            ("Cookie", &owner.cookie),
            ("X-CSRF-Token", &owner.csrf),
            ("Content-Type", "application/json"),
        ],
        "{\"why\":\"x\"}",
    );
    assert_eq!(r.status, 421, "{}", r.body);
    let r = request(
        serve.addr,
        "POST",
        "/api/v1/login",
        &[("Host", &evil), ("Content-Type", "application/json")],
        &json!({"name": OWNER, "password": OWNER_PASSWORD}).to_string(),
    );
    assert_eq!(r.status, 421);
    assert!(r.session_cookie().is_none());
}

#[test]
fn unauthenticated_visits_go_to_the_login_page() {
    let (_state, serve) = setup();
    let host = serve.host();
    for path in ["/", "/runs", "/queue", "/policy", "/stop", "/runs/01X"] {
        let r = request(
            serve.addr,
            "GET",
            path,
            &[("Host", &host), ("Accept", "text/html")],
            "",
        );
        assert_eq!(r.status, 303, "{path}");
        assert_eq!(r.header("location"), Some("/login"), "{path}");
    }
    for path in [
        "/api/v1/runs",
        "/api/v1/queue",
        "/api/v1/morning",
        "/api/v1/session",
    ] {
        let r = request(serve.addr, "GET", path, &[("Host", &host)], "");
        assert_eq!(r.status, 401, "{path}: {}", r.body);
    }
    // A made-up cookie is no session.
    let r = request(
        serve.addr,
        "GET",
        "/api/v1/runs",
        &[
            ("Host", &host),
            ("Cookie", &format!("nightshift_session={}", "a".repeat(64))),
        ],
        "",
    );
    assert_eq!(r.status, 401);
}

#[test]
fn sessions_are_strict_cookies_rotated_at_login_and_ended_at_logout() {
    let (_state, serve) = setup();
    let host = serve.host();
    let body = json!({"name": OWNER, "password": OWNER_PASSWORD}).to_string();
    let first = request(
        serve.addr,
        "POST",
        "/api/v1/login",
        &[("Host", &host), ("Content-Type", "application/json")],
        &body,
    );
    let set = first.header("set-cookie").unwrap().to_string();
    assert!(set.contains("HttpOnly"), "{set}");
    assert!(set.contains("SameSite=Strict"), "{set}");
    assert!(!set.contains("Secure"), "plain HTTP on loopback: {set}");
    let old = first.session_cookie().unwrap();
    // Logging in again while presenting the old session rotates it.
    let second = request(
        serve.addr,
        "POST",
        "/api/v1/login",
        &[
            ("Host", &host),
            ("Content-Type", "application/json"),
            ("Cookie", &old),
        ],
        &body,
    );
    assert_eq!(second.status, 200, "{}", second.body);
    let new = second.session_cookie().unwrap();
    assert_ne!(old, new);
    let with = |cookie: &str| {
        request(
            serve.addr,
            "GET",
            "/api/v1/session",
            &[("Host", &host), ("Cookie", cookie)],
            "",
        )
    };
    assert_eq!(with(&old).status, 401, "the old session survived the login");
    assert_eq!(with(&new).status, 200);
    assert_eq!(with(&new).json()["role"], "owner");
    let csrf = second.json()["csrf"].as_str().unwrap().to_string();
    let out = request(
        serve.addr,
        "POST",
        "/api/v1/logout",
        &[
            ("Host", &host),
            ("Cookie", &new),
            ("X-CSRF-Token", &csrf),
            ("Content-Type", "application/json"),
        ],
        "{}",
    );
    assert_eq!(out.status, 200, "{}", out.body);
    assert_eq!(with(&new).status, 401, "the session survived the logout");
}

#[test]
fn a_removed_account_loses_its_sessions() {
    let (state, serve) = setup();
    let viewer = Client::login(&serve, VIEWER, VIEWER_PASSWORD);
    assert_eq!(viewer.get("/api/v1/runs").status, 200);
    assert!(state.run(&["users", "remove", VIEWER]).status.success());
    assert_eq!(viewer.get("/api/v1/runs").status, 401);
}

#[test]
fn logins_are_rate_limited() {
    let (_state, serve) = setup();
    let host = serve.host();
    let mut statuses = Vec::new();
    for _ in 0..12 {
        let r = request(
            serve.addr,
            "POST",
            "/api/v1/login",
            &[("Host", &host), ("Content-Type", "application/json")],
            &json!({"name": OWNER, "password": "guess guess guess"}).to_string(),
        );
        statuses.push(r.status);
    }
    assert!(
        statuses.iter().all(|s| *s == 401 || *s == 429),
        "{statuses:?}"
    );
    assert!(
        statuses.contains(&429),
        "12 wrong logins in a row were never limited: {statuses:?}"
    );
    // While limited, even the right password does not get in.
    let r = request(
        serve.addr,
        "POST",
        "/api/v1/login",
        &[("Host", &host), ("Content-Type", "application/json")],
        &json!({"name": OWNER, "password": OWNER_PASSWORD}).to_string(),
    );
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(r.session_cookie().is_none());
}

#[test]
fn every_response_carries_a_strict_content_security_policy() {
    let (_state, serve) = setup();
    let owner = Client::login(&serve, OWNER, OWNER_PASSWORD);
    for path in ["/login", "/", "/queue", "/api/v1/runs", "/nowhere"] {
        let r = owner.get(path);
        let csp = r
            .header("content-security-policy")
            .unwrap_or_else(|| panic!("{path}: no CSP"));
        assert!(csp.contains("default-src 'none'"), "{csp}");
        assert!(csp.contains("script-src 'self'"), "{csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert!(
            !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
            "{csp}"
        );
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    }
}

#[test]
fn plain_http_off_loopback_is_refused_and_passwords_come_from_stdin() {
    let state = State::new();
    let out = state.run(&["serve", "--bind", "0.0.0.0:0"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not a loopback address"),
        "{}",
        stderr(&out)
    );
    // No password argument exists.
    let out = state.run(&["users", "add", "x", "--role", "owner", "--password", "p"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // Too short a password from stdin is refused.
    let mut child = state
        .cmd()
        .args(["users", "add", "x", "--role", "owner"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"short\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    add_accounts(&state);
    let out = state.run(&["users", "list", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list[0]["name"], OWNER);
    assert_eq!(list[0]["role"], "owner");
    assert_eq!(list[1]["role"], "viewer");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("argon2"));
}

#[test]
fn the_live_output_stream_names_only_known_runs() {
    let (state, serve) = setup();
    std::fs::create_dir_all(state.path().join("x")).unwrap();
    std::fs::write(state.path().join("x/output.log"), "not a run's output").unwrap();
    let owner = Client::login(&serve, OWNER, OWNER_PASSWORD);
    for path in [
        "/api/v1/runs/..%2Fx/output",
        "/api/v1/runs/%2E%2E%2Fx/output",
        "/api/v1/runs/nosuchrun/output",
    ] {
        let r = owner.get(path);
        assert_eq!(r.status, 404, "{path}: {}", r.body);
        assert!(!r.body.contains("not a run's output"));
    }
}

/// The audit bodies of `kind`, oldest first, read from the state's database.
fn audit_bodies(state: &State, kind: &str) -> Vec<serde_json::Value> {
    state.audit_bodies(kind)
}

#[test]
fn the_audit_names_the_dashboard_account_that_decided() {
    let m = tests::morning::Morning::new();
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
            .unwrap_or_else(|| panic!("no push act to agent/{r}: {:?}", m.queue()))["act"]["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (one, two) = (act_to("one"), act_to("two"));
    let mut child = m
        .state
        .cmd()
        .args(["users", "add", "alice", "--role", "owner"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"alice's password").unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
    let serve = Serve::start(&m.state, &[]);
    let alice = Client::login(&serve, "alice", "alice's password");

    let r = alice.post("/api/v1/acts/approve", &json!({"act": [one]}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["ok"], true, "{}", r.body);
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
    let r = alice.post(
        "/api/v1/acts/reject",
        &json!({"act": [two], "why": "not this one"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["outcomes"][0]["state"], "rejected", "{}", r.body);
    let r = alice.post("/api/v1/freeze", &json!({"why": "alice stops the night"}));
    assert_eq!(r.status, 200, "{}", r.body);

    // Each decision's audit entry names alice's account, not just "owner".
    let decided_by = |act: &str, transition: &str| {
        audit_bodies(&m.state, "act")
            .into_iter()
            .find(|b| b["act"] == act && b["transition"] == transition)
            .unwrap_or_else(|| panic!("no {transition} entry for act {act}"))["fields"]["by"]
            .clone()
    };
    assert_eq!(decided_by(&one, "approved"), "dashboard:alice");
    assert_eq!(decided_by(&two, "rejected"), "dashboard:alice");
    let freeze = audit_bodies(&m.state, "policy_row")
        .into_iter()
        .find(|b| b["row"] == "freeze")
        .expect("no freeze row in the audit");
    assert_eq!(freeze["author"], "dashboard:alice", "{freeze}");
    assert_eq!(frozen(&m.state), "alice stops the night");
}

#[test]
fn the_openapi_description_is_served_to_a_session_only() {
    let (_state, serve) = setup();
    let r = request(
        serve.addr,
        "GET",
        "/api/v1/openapi.json",
        &[("Host", &serve.host())],
        "",
    );
    assert_eq!(r.status, 401, "{}", r.body);
    let viewer = Client::login(&serve, VIEWER, VIEWER_PASSWORD);
    let r = viewer.get("/api/v1/openapi.json");
    assert_eq!(r.status, 200, "{}", r.body);
    let checked_in =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json"))
            .unwrap();
    assert!(r.body == checked_in, "served: {}", r.body);
}

fn chain_of(client: &Client) -> serde_json::Value {
    let r = client.get("/api/v1/morning");
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["chain"].clone()
}

/// Morning walks only the entries appended since its last check, and a
/// whole walk in the background finds an OLD entry rewritten, without a
/// restart (a check of new entries alone never would: the rewritten entry
/// lies before every entry it walks).
#[test]
fn morning_reports_an_old_entry_rewritten_under_a_running_serve() {
    let state = State::new();
    if state.sqlite_only("an entry rewritten in state.db under a running serve") {
        return;
    }
    assert!(state.run(&["owner", "init"]).status.success());
    add_accounts(&state);
    for why in ["one", "two"] {
        let out = state.run(&["freeze", "--why", why]);
        assert!(out.status.success(), "{}", stderr(&out));
        let key = state.path().join("owner.key");
        let out = state.run(&["thaw", "--owner-key-file", key.to_str().unwrap()]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let serve = Serve::start(&state, &["--chain-check-every", "1"]);
    let owner = Client::login(&serve, OWNER, OWNER_PASSWORD);
    let first = chain_of(&owner);
    assert_eq!(first["intact"], true, "{first}");
    let through = first["entries"].as_u64().unwrap();
    assert!(through >= 4, "{first}");

    // New entries: the next load walks them (and the last verified entry).
    let out = state.run(&["freeze", "--why", "three"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let later = chain_of(&owner);
    assert_eq!(later["intact"], true, "{later}");
    assert!(later["entries"].as_u64().unwrap() > through, "{later}");
    // From the last entry verified before it (by the previous load, or
    // by a background walk in between), to the end.
    assert_eq!(later["walked"], "new entries", "{later}");
    let from = later["walked_from"].as_u64().unwrap();
    assert!(from >= through, "{later}");
    assert_eq!(
        later["walked_entries"].as_u64().unwrap(),
        later["entries"].as_u64().unwrap() - from + 1,
        "{later}"
    );
    assert!(later["whole_at"].is_string(), "{later}");
    assert_eq!(later["whole_every"], 1, "{later}");

    // An old entry rewritten in place (same seq, same stored hash).
    let db = rusqlite::Connection::open(state.path().join("state.db")).unwrap();
    let changed = db
        .execute(
            "UPDATE audit SET body = json_set(body, '$.forged', 1) WHERE seq = 2",
            [],
        )
        .unwrap();
    assert_eq!(changed, 1);
    drop(db);
    let started = std::time::Instant::now();
    let broken = loop {
        let c = chain_of(&owner);
        if c["intact"] == false {
            break c;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "a rewritten old entry never showed on Morning: {c}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let error = broken["error"].as_str().unwrap();
    assert!(error.starts_with("audit entry 2:"), "{broken}");
    assert!(error.contains("altered"), "{broken}");
    assert!(broken["broken_at"].is_string(), "{broken}");
    // The page says so too, and keeps saying so on later loads.
    let page = request(
        serve.addr,
        "GET",
        "/",
        &[("Host", &serve.host()), ("Cookie", &owner.cookie)],
        "",
    );
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("BROKEN: audit entry 2:"),
        "{}",
        page.body
    );
    assert_eq!(chain_of(&owner)["intact"], false);
    assert!(!state.verify().status.success());
}

/// Morning and the Run page show the night's model tokens: charged, the
/// run's cap, the calls, from the gateway's `model_call` entries.
#[test]
fn morning_and_the_run_page_show_model_token_spend() {
    use tests::model::{ModelServer, Step};
    let server = ModelServer::start();
    server.push(Step::text("one").usage(30, 9));
    server.push(Step::text("two").usage(20, 7));
    let state = tests::agents::state_with_models(&server);
    assert!(state.run(&["owner", "init"]).status.success());
    add_accounts(&state);
    let repo = tests::make_repo();
    let call = r#"
import json, os, urllib.request
for _ in range(2):
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "content-type": "application/json"})
    urllib.request.urlopen(req, timeout=60).read()
"#;
    let out = state.run(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--image",
        &tests::image(),
        "--max-tokens",
        "100000",
        "--",
        "python3",
        "-c",
        call,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run = tests::only_run(&state)["id"].as_str().unwrap().to_string();

    let serve = Serve::start(&state, &[]);
    let viewer = Client::login(&serve, VIEWER, VIEWER_PASSWORD);
    let m = viewer.get("/api/v1/morning");
    assert_eq!(m.status, 200, "{}", m.body);
    let tokens = &m.json()["tokens"];
    assert_eq!(tokens["calls"], 2, "{tokens}");
    assert_eq!(tokens["input_tokens"], 50, "{tokens}");
    assert_eq!(tokens["output_tokens"], 16, "{tokens}");
    assert_eq!(tokens["charged_tokens"], 66, "{tokens}");
    assert_eq!(m.json()["tokens_by_run"][0][0], run.as_str());
    let page = viewer.get("/");
    assert!(
        page.body.contains("id=\"tokens-charged\">66<"),
        "{}",
        page.body
    );
    let page = viewer.get(&format!("/runs/{run}"));
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("66 charged of 100000 over 2 calls"),
        "{}",
        page.body
    );
}

/// The Policy page shows what `policy list` shows: the generation and every
/// rule in force (both built by the command API).
#[test]
fn the_policy_page_shows_the_rules_policy_list_shows() {
    let (state, serve) = setup();
    let out = state.run(&["policy", "list", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let viewer = Client::login(&serve, VIEWER, VIEWER_PASSWORD);
    let page = viewer.get("/policy");
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body
            .contains(list["generation"].as_str().expect("a generation")),
        "{}",
        page.body
    );
    let active = list["active"].as_array().expect("active rules");
    assert!(!active.is_empty(), "{list}");
    for rule in active {
        let id = rule["id"].as_str().expect("a rule id");
        assert!(page.body.contains(id), "rule {id} missing: {}", page.body);
    }
}

fn login_from(serve: &Serve, from: &str, name: &str, password: &str) -> tests::browser::Response {
    request_from(
        from.parse().unwrap(),
        serve.addr,
        "POST",
        "/api/v1/login",
        &[
            ("Host", &serve.host()),
            ("Content-Type", "application/json"),
        ],
        &json!({"name": name, "password": password}).to_string(),
    )
}

/// Someone guessing the owner's password from another address cannot lock
/// the owner out: failures count per address and per (account, address).
/// An address spraying many names is limited too.
#[test]
fn a_guesser_elsewhere_never_locks_the_owner_out() {
    let (_state, serve) = setup();
    let guesses: Vec<u16> = (0..8)
        .map(|_| login_from(&serve, "127.0.0.2", OWNER, "guess guess guess").status)
        .collect();
    assert!(
        guesses.iter().all(|s| *s == 401 || *s == 429),
        "{guesses:?}"
    );
    assert!(
        guesses.contains(&429),
        "8 guesses never limited: {guesses:?}"
    );
    // The owner, from an address that has not failed: in, at once.
    let r = login_from(&serve, "127.0.0.1", OWNER, OWNER_PASSWORD);
    assert_eq!(r.status, 200, "the owner was locked out: {}", r.body);
    assert!(r.session_cookie().is_some());
    // The guesser's address stays limited for that account, right password or not.
    let r = login_from(&serve, "127.0.0.2", OWNER, OWNER_PASSWORD);
    assert_eq!(r.status, 429, "{}", r.body);
    // Spraying names from one address: limited per address.
    let sprayed: Vec<u16> = (0..12)
        .map(|i| {
            login_from(
                &serve,
                "127.0.0.3",
                &format!("user{i}"),
                "guess guess guess",
            )
            .status
        })
        .collect();
    assert!(
        sprayed.contains(&429),
        "12 names never limited: {sprayed:?}"
    );
    // And the viewer, from yet another address, is not affected.
    let r = login_from(&serve, "127.0.0.4", VIEWER, VIEWER_PASSWORD);
    assert_eq!(r.status, 200, "{}", r.body);
}

/// Every page parameter is checked: a page whose offset would not fit is
/// refused with an error naming it, never wrapped or a panic.
#[test]
fn page_parameters_past_any_page_are_refused_clearly() {
    let (_state, serve) = setup();
    let owner = Client::login(&serve, OWNER, OWNER_PASSWORD);
    for page in [
        "18446744073709551615",
        "368934881474191033",
        "184467440737095517",
        "-1",
        "x",
        "99999999999999999999999",
    ] {
        let r = owner.get(&format!("/api/v1/queue?page={page}"));
        assert_eq!(r.status, 400, "page {page}: {}", r.body);
        assert!(
            r.json()["error"].as_str().unwrap().contains("page"),
            "page {page}: {}",
            r.body
        );
        let r = request(
            serve.addr,
            "GET",
            &format!("/queue?page={page}"),
            &[
                ("Host", &serve.host()),
                ("Cookie", &owner.cookie),
                ("Accept", "text/html"),
            ],
            "",
        );
        assert_eq!(r.status, 400, "page {page}: {}", r.body);
    }
    // The last page there can be, and an ordinary one, answer (empty).
    for page in ["0", "1", "184467440737095516"] {
        let r = owner.get(&format!("/api/v1/queue?page={page}"));
        assert_eq!(r.status, 200, "page {page}: {}", r.body);
        assert_eq!(r.json()["acts"], json!([]), "{}", r.body);
    }
}

/// A browser sends every cookie of one name it holds (another path or a
/// sibling domain's): the live session among them is taken.
#[test]
fn a_duplicated_session_cookie_takes_the_live_session() {
    let (_state, serve) = setup();
    let owner = Client::login(&serve, OWNER, OWNER_PASSWORD);
    let host = serve.host();
    let dead = format!("nightshift_session={}", "0".repeat(64));
    for cookie in [
        format!("nightshift_session=zz; {}", owner.cookie),
        format!("{dead}; {}", owner.cookie),
        format!("{}; {dead}", owner.cookie),
    ] {
        let r = request(
            serve.addr,
            "GET",
            "/api/v1/session",
            &[("Host", &host), ("Cookie", &cookie)],
            "",
        );
        assert_eq!(r.status, 200, "{cookie}: {}", r.body);
        assert_eq!(r.json()["user"], OWNER);
    }
    // Only dead or malformed ones: no session.
    let r = request(
        serve.addr,
        "GET",
        "/api/v1/session",
        &[
            ("Host", &host),
            ("Cookie", &format!("nightshift_session=zz; {dead}")),
        ],
        "",
    );
    assert_eq!(r.status, 401, "{}", r.body);
    // Plain HTTP on loopback: no Strict-Transport-Security.
    assert!(r.header("strict-transport-security").is_none());
}

/// The README's first steps: `serve` on a state whose audit log is empty.
/// Morning shows the chain intact, and still after entries are appended
/// while serve runs (and after background whole walks).
#[test]
fn morning_on_a_fresh_state_shows_the_chain_intact() {
    let state = State::new();
    add_accounts(&state);
    let serve = Serve::start(&state, &["--chain-check-every", "1", "--max-parallel", "0"]);
    let owner = Client::login(&serve, OWNER, OWNER_PASSWORD);
    let first = chain_of(&owner);
    assert_eq!(first["intact"], true, "{first}");
    assert_eq!(first["entries"], 0, "the log was not empty: {first}");
    // Reloads of the empty log, across background walks.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let again = chain_of(&owner);
    assert_eq!(again["intact"], true, "{again}");
    // Entries appended while serve runs.
    let r = owner.post("/api/v1/freeze", &json!({"why": "first entry"}));
    assert_eq!(r.status, 200, "{}", r.body);
    let later = chain_of(&owner);
    assert_eq!(later["intact"], true, "{later}");
    assert!(later["entries"].as_u64().unwrap() >= 1, "{later}");
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert!(state.run(&["owner", "init"]).status.success());
    let key = state.path().join("owner.key");
    let out = state.run(&["thaw", "--owner-key-file", key.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let last = chain_of(&owner);
    assert_eq!(last["intact"], true, "{last}");
    assert!(
        last["entries"].as_u64().unwrap() > later["entries"].as_u64().unwrap(),
        "{last}"
    );
}

/// The supervisor's peak resident memory (`VmHWM`), in KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Logins flooding in from many addresses at once: each password check
/// holds 19 MiB (Argon2id), and only two run at once; the others wait.
/// The supervisor's peak memory grows by the two, not by the flood.
#[test]
fn a_login_flood_holds_the_memory_of_two_password_checks() {
    let (_state, serve) = setup();
    // Warm: the dummy hash is made, one check has run.
    Client::login(&serve, OWNER, OWNER_PASSWORD);
    let pid = serve.child.id();
    let before = peak_kib(pid);
    let flood: Vec<_> = (1..=48u8)
        .map(|i| {
            let (addr, host) = (serve.addr, serve.host());
            std::thread::spawn(move || {
                request_from(
                    std::net::IpAddr::from([127, 0, 1, i]),
                    addr,
                    "POST",
                    "/api/v1/login",
                    &[("Host", &host), ("Content-Type", "application/json")],
                    &json!({"name": format!("nobody{i}"), "password": "guess guess guess"})
                        .to_string(),
                )
                .status
            })
        })
        .collect();
    let statuses: Vec<u16> = flood.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(statuses.iter().all(|s| *s == 401), "{statuses:?}");
    let grown = peak_kib(pid).saturating_sub(before);
    eprintln!("serve's peak memory: {before} KiB before the flood, grew {grown} KiB");
    // Two checks of 19 MiB and room for the 48 connections; 48 checks at
    // once would be over 900 MiB.
    assert!(
        grown < 64 * 1024,
        "the flood grew serve's peak by {grown} KiB"
    );
}

/// Continue in the morning over HTTP: only an owner's session with its
/// CSRF token continues a run, only a run a cap ended, and the pages offer
/// the choice for exactly those runs (Morning lists them first).
#[test]
fn only_the_owner_continues_and_only_a_capped_run() {
    use orchestrator::state_store::RunRecord;
    let (state, serve) = setup();
    let repo = tests::make_repo();
    let head = tests::git(repo.path(), &["rev-parse", "HEAD"])
        .trim()
        .to_string();
    let record = |id: &str, status: &str| {
        let result = format!("refs/nightshift/runs/{id}");
        tests::git(repo.path(), &["update-ref", &result, &head]);
        RunRecord {
            id: id.into(),
            created_at: "2026-01-01T00:00:00Z".into(),
            ended_at: Some("2026-01-01T01:00:00Z".into()),
            repo: repo.path().display().to_string(),
            base_ref: "main".into(),
            base_commit: Some(head.clone()),
            image: "no-such-image:1".into(),
            command: vec!["true".into()],
            status: status.into(),
            result_ref: Some(result),
            result_commit: Some(head.clone()),
            task: Some("<b>the task</b>".into()),
            ..Default::default()
        }
    };
    {
        let mut store = state.stores().connect().unwrap();
        store
            .put_run(&record("01capped", "killed: timeout 2s"))
            .unwrap();
        store.put_run(&record("01fine", "exited 0")).unwrap();
    }
    let owner = Client::login(&serve, OWNER, OWNER_PASSWORD);
    let viewer = Client::login(&serve, VIEWER, VIEWER_PASSWORD);
    let host = serve.host();
    let path = "/api/v1/runs/01capped/continue";

    // The pages: the choice for the capped run only, never to a viewer.
    let page = owner.get("/runs/01capped");
    assert!(
        page.body
            .contains("action=\"/api/v1/runs/01capped/continue\""),
        "{}",
        page.body
    );
    assert!(
        page.body.contains("Its wall-clock cap ended it"),
        "{}",
        page.body
    );
    let page = owner.get("/runs/01fine");
    assert!(!page.body.contains("/continue\""), "{}", page.body);
    let page = viewer.get("/runs/01capped");
    assert!(!page.body.contains("/continue\""), "{}", page.body);
    let morning = owner.get("/?since=2025-01-01T00:00:00Z");
    let capped_at = morning
        .body
        .find("id=\"capped\"")
        .expect("a capped section");
    let night_at = morning.body.find("id=\"night-picture\"").unwrap();
    assert!(capped_at < night_at, "capped runs are not listed first");
    assert!(
        morning.body[capped_at..night_at].contains("/api/v1/runs/01capped/continue"),
        "{}",
        morning.body
    );
    assert!(!morning.body[capped_at..night_at].contains("01fine"));

    // Without the CSRF token (a form post with none, a JSON post with a
    // wrong one): refused, nothing queued.
    let r = request(
        serve.addr,
        "POST",
        path,
        &[
            ("Host", &host),
            ("Cookie", &owner.cookie),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        "max_tokens=10",
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("CSRF"), "{}", r.body);
    let r = viewer.post(path, &json!({}));
    assert_eq!(r.status, 403, "a viewer: {}", r.body);
    assert!(state.audit_bodies("continue_queued").is_empty());

    // A run no cap ended: refused, saying why.
    let r = owner.post("/api/v1/runs/01fine/continue", &json!({}));
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("cannot be continued: it ended well"),
        "{}",
        r.body
    );
    let r = owner.post("/api/v1/runs/01none/continue", &json!({}));
    assert_eq!(r.status, 404, "{}", r.body);
    let r = owner.post(path, &json!({"max_tokens": "lots"}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(state.audit_bodies("continue_queued").is_empty());

    // The owner, with the token: a continuation task, audited under the
    // account's name.
    let r = owner.post(path, &json!({"max_tokens": "5000", "timeout": "30m"}));
    assert_eq!(r.status, 200, "{}", r.body);
    let task = r.json()["task"].as_str().unwrap().to_string();
    assert_eq!(r.json()["cap"], "wall-clock");
    let queued = state.audit_bodies("continue_queued");
    assert_eq!(queued.len(), 1, "{queued:?}");
    assert_eq!(queued[0]["task"], task.as_str());
    assert_eq!(queued[0]["by"], format!("dashboard:{OWNER}").as_str());
    let page = owner.get("/runs/01capped");
    assert!(
        page.body
            .contains(&format!("Continuation queued as task <code>{task}</code>")),
        "{}",
        page.body
    );
}

/// Checks an exposition strictly, line by line, as the text format
/// (OpenMetrics 1.0) defines it: metadata lines, samples of
/// `name{label="value",...} number`, and one `# EOF` at the end. Returns
/// the samples.
/// One sample of an exposition: its name, labels and value.
type Sample = (String, Vec<(String, String)>, f64);

fn parse_exposition(text: &str) -> Vec<Sample> {
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            && !n.starts_with(|c: char| c.is_ascii_digit())
    };
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "no # EOF at the end: {text}");
    let mut samples = Vec::new();
    for line in &lines[..lines.len() - 1] {
        if let Some(meta) = line.strip_prefix("# ") {
            let mut parts = meta.splitn(3, ' ');
            let kind = parts.next().unwrap();
            assert!(
                ["HELP", "TYPE", "UNIT"].contains(&kind),
                "bad metadata: {line}"
            );
            assert!(name_ok(parts.next().unwrap_or("")), "bad name: {line}");
            if kind == "TYPE" {
                let t = parts.next().unwrap_or("");
                assert!(
                    ["counter", "gauge", "histogram"].contains(&t),
                    "bad type: {line}"
                );
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect(line);
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value: {line}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, Vec::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').expect(line);
                let labels = body
                    .split(',')
                    .filter(|l| !l.is_empty())
                    .map(|l| {
                        let (k, v) = l.split_once('=').expect(line);
                        assert!(name_ok(k), "bad label name: {line}");
                        let v = v
                            .strip_prefix('"')
                            .and_then(|v| v.strip_suffix('"'))
                            .expect(line);
                        assert!(
                            !v.contains(['"', '\\', '\n']),
                            "label value needing escapes: {line}"
                        );
                        (k.to_string(), v.to_string())
                    })
                    .collect();
                (name, labels)
            }
        };
        assert!(name_ok(name), "bad metric name: {line}");
        samples.push((name.to_string(), labels, value));
    }
    samples
}

fn sample(samples: &[Sample], name: &str, label: (&str, &str)) -> f64 {
    samples
        .iter()
        .find(|(n, l, _)| n == name && l.iter().any(|(k, v)| k == label.0 && v == label.1))
        .unwrap_or_else(|| panic!("no {name}{{{}={}}}", label.0, label.1))
        .2
}

#[test]
fn metrics_are_scraped_behind_authentication_or_on_their_own_address() {
    use orchestrator::state_store::RunRecord;
    let state = State::new();
    assert!(state.run(&["owner", "init"]).status.success());
    add_accounts(&state);
    {
        let mut store = state.stores().connect().unwrap();
        for (id, status) in [
            ("01a", "exited 0"),
            ("01b", "killed: timeout 2s"),
            ("01c", "killed: memory cap 96 MiB (peak 96 MiB, OOM)"),
            ("01d", "killed: by \"} 1\nnightshift_forged{x=\"y\"} 9"),
        ] {
            store
                .put_run(&RunRecord {
                    id: id.into(),
                    created_at: "2026-01-01T00:00:00Z".into(),
                    status: status.into(),
                    ..Default::default()
                })
                .unwrap();
        }
    }
    // A free port for the metrics' own address.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let serve = Serve::start(&state, &["--metrics-addr", &metrics_addr]);
    let host = serve.host();

    // Unauthenticated on the dashboard's address: refused.
    let r = request(serve.addr, "GET", "/metrics", &[("Host", &host)], "");
    assert_eq!(r.status, 401, "{}", r.body);
    assert!(!r.body.contains("nightshift_runs"));

    // With a session (a viewer's too: it only reads).
    let viewer = Client::login(&serve, VIEWER, VIEWER_PASSWORD);
    let r = viewer.get("/metrics");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.header("content-type")
            .unwrap_or("")
            .starts_with("application/openmetrics-text"),
        "{:?}",
        r.headers
    );
    let samples = parse_exposition(&r.body);
    assert_eq!(
        sample(&samples, "nightshift_runs", ("outcome", "succeeded")),
        1.0
    );
    assert_eq!(
        sample(&samples, "nightshift_runs", ("outcome", "cap_hit")),
        2.0
    );
    assert_eq!(
        sample(&samples, "nightshift_runs", ("outcome", "killed")),
        1.0
    );
    assert_eq!(
        sample(&samples, "nightshift_cap_kills", ("cap", "wall-clock")),
        1.0
    );
    assert_eq!(
        sample(&samples, "nightshift_cap_kills", ("cap", "memory")),
        1.0
    );
    assert_eq!(
        sample(&samples, "nightshift_acts", ("state", "pending")),
        0.0
    );
    assert_eq!(
        sample(
            &samples,
            "nightshift_model_tokens_total",
            ("kind", "charged")
        ),
        0.0
    );
    assert!(r
        .body
        .contains("# TYPE nightshift_door_request_duration_seconds histogram"));
    assert!(r
        .body
        .contains("# TYPE nightshift_model_call_duration_seconds histogram"));
    assert!(
        !r.body.contains("forged"),
        "a run's text became a series: {}",
        r.body
    );

    // The metrics' own address: no session needed, nothing else there.
    let addr: std::net::SocketAddr = metrics_addr.parse().unwrap();
    let r = request(addr, "GET", "/metrics", &[("Host", &metrics_addr)], "");
    assert_eq!(r.status, 200, "{}", r.body);
    let own = parse_exposition(&r.body);
    assert_eq!(
        sample(&own, "nightshift_runs", ("outcome", "succeeded")),
        1.0
    );
    let r = request(addr, "GET", "/", &[("Host", &metrics_addr)], "");
    assert_eq!(r.status, 404, "{}", r.body);
    let r = request(addr, "GET", "/api/v1/runs", &[("Host", &metrics_addr)], "");
    assert_eq!(r.status, 404, "{}", r.body);
    drop(serve);

    // Off loopback, unauthenticated metrics need --insecure-network.
    let out = state.run(&[
        "serve",
        "--bind",
        "127.0.0.1:0",
        "--metrics-addr",
        "0.0.0.0:0",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("refusing to serve the metrics without authentication"),
        "{}",
        stderr(&out)
    );
}
