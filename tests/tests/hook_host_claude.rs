//! `nightshift policy check` as the real Claude Code's PreToolUse hook on
//! the host (issue 10), in each setup that once let a refused call through.
//!
//! The real `claude` executable (the CLI bundled in the `claude-agent-sdk`
//! wheel, taken out of the built `nightshift-agent-claude-code` image and
//! cached by the image's content-addressed id) runs on the host with a
//! temporary HOME whose `~/.claude/settings.json` holds the hook line of
//! docs/policy-hook.md, driven by the scripted model (tests/src/model.rs) on
//! loopback through `ANTHROPIC_BASE_URL`. The model asks for one Bash call
//! that touches a sentinel file; each test asserts what the tool did (the
//! sentinel) and what the model was told (the `tool_result` of its next
//! request):
//!
//! - no state configured (no `NIGHTSHIFT_STATE_DIR`): refused, naming how to
//!   make one, and no state made under HOME;
//! - the state locked by another process: refused (naming the lock) before
//!   the harness's hook timeout, which would have run the tool;
//! - `--tool Bash` with the whole payload: the payload's `tool_input` is
//!   matched, so a rule refusing that command refuses;
//! - an empty rules directory: the call is allowed (as documented) and the
//!   warning is written once per state; Claude Code does not show an
//!   allowing hook's stderr to the model;
//! - a `--tool -` refusal is audited under the payload's tool name.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tests::model::{ModelServer, Step};
use tests::{stderr, stdout, State};

/// The documented hook line (docs/policy-hook.md, *Claude Code*).
const HOOK_LINE: &str =
    "nightshift policy check --actor \"$AGENT\" --tool - --args-json - || exit 2";

/// How long Claude Code waits for this hook before running the tool anyway
/// (the settings' `timeout`, seconds): well above the check's 2 s bound,
/// well below the 30 s a locked state once took.
const HOOK_TIMEOUT_S: u64 = 10;

/// The `claude` executable of the built agent image, copied out once per
/// image id into the target directory (`claude-code-cli/<id>/claude`).
fn claude_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    static MAKING: Mutex<()> = Mutex::new(());
    let _one = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    BIN.get_or_init(extract_claude).clone()
}

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("running docker");
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        stderr(&out).trim()
    );
    stdout(&out).trim().to_string()
}

fn extract_claude() -> PathBuf {
    let state = State::new();
    let out = state.run(&["image", "ref", "--agent", "claude-code"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let image = stdout(&out).trim().to_string();
    let id = Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", &image])
        .output()
        .expect("docker image inspect");
    assert!(
        id.status.success(),
        "the image {image} is missing: build it with `nightshift image build --agent claude-code` (scripts/test.sh does)"
    );
    let id = stdout(&id).trim().trim_start_matches("sha256:").to_string();
    let target = tests::nightshift_bin()
        .parent()
        .expect("target profile directory")
        .join("claude-code-cli");
    let dir = target.join(&id);
    let bin = dir.join("claude");
    if bin.exists() {
        return bin;
    }
    std::fs::create_dir_all(&target).unwrap();
    // Copied into a fresh directory, renamed into place whole: another test
    // process copying at once leaves one complete copy.
    let scratch = tempfile::tempdir_in(&target).unwrap();
    let container = docker(&["create", &image, "/bin/true"]);
    let link = scratch.path().join("link");
    docker(&[
        "cp",
        &format!("{container}:/usr/local/bin/claude"),
        link.to_str().unwrap(),
    ]);
    let real = std::fs::read_link(&link)
        .map(|t| t.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "/usr/local/bin/claude".into());
    let copied = scratch.path().join("claude");
    docker(&[
        "cp",
        &format!("{container}:{real}"),
        copied.to_str().unwrap(),
    ]);
    docker(&["rm", &container]);
    std::fs::remove_file(&link).ok();
    let scratch = scratch.keep();
    if std::fs::rename(&scratch, &dir).is_err() {
        // Another process put its copy there first.
        std::fs::remove_dir_all(&scratch).ok();
    }
    assert!(bin.exists(), "{} was not copied", bin.display());
    bin
}

/// One try: a temporary HOME and working directory, the hook installed,
/// `nightshift` on the PATH, the scripted model asking for one Bash call
/// that touches the sentinel.
struct Setup {
    home: tempfile::TempDir,
    work: tempfile::TempDir,
    bin: tempfile::TempDir,
    server: ModelServer,
}

impl Setup {
    /// The model asks for `touches` Bash calls touching the sentinel, then
    /// ends with text.
    fn new(hook_command: &str, matcher: &str, touches: usize) -> Setup {
        let home = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let bin = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(tests::nightshift_bin(), bin.path().join("nightshift")).unwrap();
        std::fs::create_dir(home.path().join(".claude")).unwrap();
        let settings = json!({"hooks": {"PreToolUse": [{"matcher": matcher, "hooks": [
            {"type": "command", "command": hook_command, "timeout": HOOK_TIMEOUT_S}]}]}});
        std::fs::write(
            home.path().join(".claude").join("settings.json"),
            settings.to_string(),
        )
        .unwrap();
        let server = ModelServer::start();
        server.steps_only_for_tool_requests();
        let setup = Setup {
            home,
            work,
            bin,
            server,
        };
        for _ in 0..touches {
            setup.server.push(Step::tool(
                "Bash",
                json!({"command": format!("touch {}", setup.sentinel().display()),
                    "description": "Touch the sentinel"}),
            ));
        }
        setup.server.push(Step::text("Done."));
        setup
    }

    fn debug_log(&self) -> PathBuf {
        self.home.path().join("claude-debug.log")
    }

    fn sentinel(&self) -> PathBuf {
        self.work.path().join("sentinel")
    }

    /// Runs Claude Code headless on the host; `state` becomes the hook's
    /// `NIGHTSHIFT_STATE_DIR` when given.
    fn run(&self, state: Option<&Path>) -> Output {
        let mut c = Command::new(claude_bin());
        c.args([
            "-p",
            "Touch the sentinel file.",
            "--dangerously-skip-permissions",
            "--output-format",
            "text",
            "--model",
            "claude-sonnet-4-5",
        ])
        // Claude Code's own log, where it keeps what a hook said on stderr.
        .arg("--debug-file")
        .arg(self.debug_log())
        .env_clear()
        .env("HOME", self.home.path())
        .env(
            "PATH",
            format!("{}:/usr/local/bin:/usr/bin:/bin", self.bin.path().display()),
        )
        .env("AGENT", "agent")
        .env("ANTHROPIC_BASE_URL", self.server.url())
        .env("ANTHROPIC_API_KEY", "sk-placeholder")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_ERROR_REPORTING", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("IS_SANDBOX", "1")
        .current_dir(self.work.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        if let Some(state) = state {
            c.env("NIGHTSHIFT_STATE_DIR", state);
        }
        let mut child = c.spawn().expect("spawning claude");
        // A guard against a hung agent, not an assertion on its speed.
        let give_up = Instant::now() + Duration::from_secs(180);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > give_up {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "claude: {:?}\n{}{}",
            out.status,
            stdout(&out),
            stderr(&out)
        );
        out
    }

    /// The `tool_result` Claude Code sent back for the one Bash call.
    fn tool_result(&self) -> String {
        let results = tool_results(&self.server);
        assert_eq!(results.len(), 1, "{results:?}");
        results[0].clone()
    }
}

/// The text of every distinct `tool_result` the agent sent back, in order.
fn tool_results(server: &ModelServer) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for r in server.requests() {
        let body = r.json();
        for m in body["messages"].as_array().into_iter().flatten() {
            for block in m["content"].as_array().into_iter().flatten() {
                if block["type"] != "tool_result" {
                    continue;
                }
                let id = block["tool_use_id"].as_str().unwrap_or("").to_string();
                if ids.contains(&id) {
                    continue;
                }
                ids.push(id);
                out.push(match &block["content"] {
                    Value::String(s) => s.clone(),
                    Value::Array(parts) => parts
                        .iter()
                        .filter_map(|p| p["text"].as_str())
                        .collect::<Vec<_>>()
                        .join("\n"),
                    other => other.to_string(),
                });
            }
        }
    }
    out
}

/// A state made the way the supervisor's side makes one, with `rules` as
/// its `STATE/rules/` (none: an empty directory).
fn state_with_rules(rules: &[&str]) -> State {
    let state = State::new();
    let out = state.run(&["runs"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let dir = state.path().join("rules");
    std::fs::create_dir_all(&dir).unwrap();
    for (i, rule) in rules.iter().enumerate() {
        std::fs::write(dir.join(format!("{i:02}.toml")), rule).unwrap();
    }
    state
}

const NO_TOUCH: &str = r#"[[rule]]
id = "no-touch"
subject = "*"
tools = ["Bash"]
effect = "refuse"
reason = "Touching files is not done by agents here."
authority = "test"
match = [{ field = "command", matches = '^touch ' }]
"#;

fn decisions(state: &State) -> Vec<Value> {
    state.audit_bodies("policy_decision")
}

#[test]
fn without_a_state_claude_codes_call_is_refused_and_no_state_is_made() {
    let setup = Setup::new(HOOK_LINE, "*", 1);
    setup.run(None);
    assert!(!setup.sentinel().exists(), "the tool ran");
    let result = setup.tool_result();
    assert!(
        result.contains("refused by rule nightshift:hook-internal: no nightshift state at")
            && result.contains("owner init"),
        "{result}"
    );
    let default_state = setup.home.path().join(".local/share/nightshift");
    assert!(
        !default_state.exists(),
        "the hook made {}",
        default_state.display()
    );
}

#[test]
fn a_locked_state_refuses_claude_codes_call_before_its_hook_timeout() {
    // A refusal is audited before it is answered, so it needs the lock
    // (an allow only reads, which a writer does not block).
    let state = state_with_rules(&[NO_TOUCH]);
    let setup = Setup::new(HOOK_LINE, "*", 1);
    // Another process holds the database's write lock for the whole session.
    let db = rusqlite::Connection::open(state.path().join("state.db")).unwrap();
    db.execute_batch("BEGIN IMMEDIATE; INSERT INTO meta(key, value) VALUES ('test-lock', 'x');")
        .unwrap();
    setup.run(Some(state.path()));
    db.execute_batch("ROLLBACK").unwrap();
    assert!(!setup.sentinel().exists(), "the tool ran");
    let result = setup.tool_result();
    assert!(
        result.contains("refused by rule nightshift:hook-internal: ") && result.contains("locked"),
        "{result}"
    );
}

#[test]
fn a_tool_name_with_claude_codes_whole_payload_matches_its_tool_input() {
    let state = state_with_rules(&[NO_TOUCH]);
    let setup = Setup::new(
        "nightshift policy check --actor \"$AGENT\" --tool Bash --args-json - || exit 2",
        "Bash",
        1,
    );
    setup.run(Some(state.path()));
    assert!(!setup.sentinel().exists(), "the tool ran");
    let result = setup.tool_result();
    assert!(
        result.contains("refused by rule no-touch: Touching files is not done by agents here."),
        "{result}"
    );
}

#[test]
fn a_payload_refusal_reaches_the_model_and_the_audit_names_the_tool() {
    let state = state_with_rules(&[NO_TOUCH]);
    let setup = Setup::new(HOOK_LINE, "*", 1);
    setup.run(Some(state.path()));
    assert!(!setup.sentinel().exists(), "the tool ran");
    let result = setup.tool_result();
    assert!(
        result.contains("refused by rule no-touch: Touching files is not done by agents here."),
        "{result}"
    );
    let d = decisions(&state);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0]["door"], "Bash", "{d:?}");
    assert_eq!(d[0]["actor"], "agent", "{d:?}");
    assert_eq!(d[0]["rule"], "no-touch", "{d:?}");
    assert!(state.verify().status.success());
}

#[test]
fn an_empty_rules_directory_allows_and_says_so_once() {
    let state = state_with_rules(&[]);
    // Two calls, so the hook runs twice against the same state.
    let setup = Setup::new(HOOK_LINE, "*", 2);
    setup.run(Some(state.path()));
    // Allowed, as documented: no rule is in force.
    assert!(setup.sentinel().exists(), "an allowed call did not run");
    // Claude Code keeps an allowing hook's stderr in its debug log (the
    // model is not shown it): the warning is there once, for two checks.
    let log = std::fs::read_to_string(setup.debug_log()).expect("claude's debug log");
    let checks = log
        .lines()
        .filter(|l| {
            l.contains("PreToolUse:Bash [nightshift policy check")
                && l.contains("finished with status 0")
        })
        .count();
    assert_eq!(checks, 2, "{log}");
    let said = log.matches("no rule is in force").count();
    assert_eq!(said, 1, "{log}");
    assert!(
        log.contains("every tool call is allowed; `nightshift policy list` shows the rules"),
        "{log}"
    );
    for result in tool_results(&setup.server) {
        assert!(!result.contains("no rule is in force"), "{result}");
    }
}
