//! `nightshift policy check` as a harness's pre-tool hook on the host, in
//! the setups a user hits (issue 10): each that once let a refused call
//! through is a refusal or a loud error here.
//!
//! - no state configured: exit 2 naming how to make one, and no state made;
//! - the state locked by another process: the answer (a refusal) comes
//!   while the lock is still held, within the hook's bound;
//! - `--tool Bash` with the harness's whole payload on stdin: its
//!   `tool_input` is matched (or a mismatch refused), never allowed unread;
//! - an empty rules directory: said on stderr once, and `policy list` shows
//!   that no rule binds the actor's tool calls;
//! - the audit names the tool of a `--tool -` decision.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use tests::{stderr, State};

const RM_RF: &str = r#"{"session_id":"s","transcript_path":"/t","cwd":"/workspace","hook_event_name":"PreToolUse","tool_name":"Bash","tool_input":{"command":"rm -rf /workspace/src","description":"clean"}}"#;

fn with_stdin(mut cmd: Command, input: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning nightshift");
    let mut pipe = child.stdin.take().expect("stdin pipe");
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(&input);
    });
    let out = child.wait_with_output().expect("waiting for nightshift");
    writer.join().expect("stdin writer");
    out
}

/// A state made the way the supervisor's side makes one.
fn made_state() -> State {
    let state = State::new();
    let out = state.run(&["runs"]);
    assert!(out.status.success(), "{}", stderr(&out));
    state
}

/// A rules directory with one rule refusing recursive deletes in Bash for `subject`.
fn rm_rules(dir: &Path, subject: &str) -> PathBuf {
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(
        rules.join("10-no-rm.toml"),
        format!(
            "[[rule]]\nid = \"no-recursive-delete\"\nsubject = \"{subject}\"\ntools = [\"Bash\"]\n\
             effect = \"refuse\"\nreason = \"Recursive deletes are not done by agents.\"\n\
             authority = \"test\"\nmatch = [{{ field = \"command\", matches = 'rm\\s+-[a-zA-Z]*r' }}]\n"
        ),
    )
    .unwrap();
    rules
}

fn check(state: &State, rules: &Path, actor: &str, tool: &str, input: &str) -> Output {
    let mut c = state.cmd();
    c.arg("policy").arg("--rules").arg(rules).args([
        "check",
        "--actor",
        actor,
        "--tool",
        tool,
        "--args-json",
        "-",
    ]);
    with_stdin(c, input.as_bytes())
}

fn decisions(state: &State) -> Vec<serde_json::Value> {
    state.audit_bodies("policy_decision")
}

#[test]
fn without_a_state_the_hook_refuses_naming_how_to_make_one_and_makes_none() {
    let home = tempfile::tempdir().unwrap();
    // The documented hook line, without NIGHTSHIFT_STATE_DIR in the harness's environment.
    let mut c = Command::new(tests::nightshift_bin());
    c.env_clear()
        .env("HOME", home.path())
        .env("PATH", "/usr/bin:/bin")
        .args([
            "policy",
            "check",
            "--actor",
            "agent",
            "--tool",
            "-",
            "--args-json",
            "-",
        ]);
    let out = with_stdin(c, RM_RF.as_bytes());
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.starts_with("refused by rule nightshift:hook-internal: no nightshift state at "),
        "{err}"
    );
    assert!(
        err.contains("NIGHTSHIFT_STATE_DIR") && err.contains("owner init"),
        "{err}"
    );
    // Nothing was made under the home directory.
    let made: Vec<_> = std::fs::read_dir(home.path()).unwrap().collect();
    assert!(made.is_empty(), "the hook made {made:?}");

    // A named state directory that does not exist is not made either.
    let scratch = tempfile::tempdir().unwrap();
    let absent = scratch.path().join("state");
    let mut c = Command::new(tests::nightshift_bin());
    c.env("NIGHTSHIFT_STATE_DIR", &absent).args([
        "policy",
        "check",
        "--tool",
        "Bash",
        "--args-json",
        "-",
    ]);
    let out = with_stdin(c, br#"{"command":"ls"}"#);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("no nightshift state at"));
    assert!(!absent.exists(), "the hook made {}", absent.display());
}

#[test]
fn a_locked_state_gets_a_refusal_while_the_lock_is_still_held() {
    let state = made_state();
    let scratch = tempfile::tempdir().unwrap();
    let rules = rm_rules(scratch.path(), "*");
    // Another process holds the database's write lock (as a long writer would).
    let db = rusqlite::Connection::open(state.path().join("state.db")).unwrap();
    db.execute_batch("BEGIN IMMEDIATE; INSERT INTO meta(key, value) VALUES ('test-lock', 'x');")
        .unwrap();
    let mut c = state.cmd();
    c.arg("policy").arg("--rules").arg(&rules).args([
        "check",
        "--actor",
        "agent",
        "--tool",
        "-",
        "--args-json",
        "-",
    ]);
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(RM_RF.as_bytes())
        .unwrap();
    // The lock is held until the check answers, or for far longer than any
    // harness waits (Claude Code's hook timeout is 60 s; the busy wait that
    // let calls through was 30 s): the answer must come while it is held.
    let held_until = std::time::Instant::now() + std::time::Duration::from_secs(25);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() > held_until {
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    db.execute_batch("ROLLBACK").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        status.is_some(),
        "the check did not answer while the state was locked: {}",
        stderr(&out)
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.starts_with("refused by rule nightshift:hook-internal: ") && err.contains("locked"),
        "{err}"
    );
    // Unlocked, the same call is refused by its rule, and audited.
    let out = check(&state, &rules, "agent", "-", RM_RF);
    assert_eq!(
        stderr(&out),
        "refused by rule no-recursive-delete: Recursive deletes are not done by agents.\n"
    );
}

#[test]
fn a_tool_name_with_the_whole_payload_uses_its_tool_input_or_refuses_a_mismatch() {
    let state = made_state();
    let scratch = tempfile::tempdir().unwrap();
    let rules = rm_rules(scratch.path(), "*");
    let out = check(&state, &rules, "agent", "Bash", RM_RF);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        "refused by rule no-recursive-delete: Recursive deletes are not done by agents.\n"
    );
    let out = check(&state, &rules, "agent", "Edit", RM_RF);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with(
            "refused by rule nightshift:hook-input: --tool Edit was given, but stdin is a harness payload for tool Bash"
        ),
        "{}",
        stderr(&out)
    );
    // Both audited under the tool named.
    let d = decisions(&state);
    assert_eq!(d.len(), 2, "{d:?}");
    assert_eq!(d[0]["door"], "Bash");
    assert_eq!(d[0]["rule"], "no-recursive-delete");
    assert_eq!(d[1]["door"], "Edit");
    assert_eq!(d[1]["rule"], "nightshift:hook-input");
}

#[test]
fn the_audit_names_the_tool_of_a_payload_decision() {
    let state = made_state();
    let scratch = tempfile::tempdir().unwrap();
    let rules = rm_rules(scratch.path(), "*");
    let out = check(&state, &rules, "agent", "-", RM_RF);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // A malformed payload that still names its tool is audited under it.
    let out = check(
        &state,
        &rules,
        "agent",
        "-",
        r#"{"tool_name":"Write","tool_input":{},"cwd":7}"#,
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let d = decisions(&state);
    assert_eq!(d.len(), 2, "{d:?}");
    assert_eq!(d[0]["door"], "Bash", "{d:?}");
    assert_eq!(d[1]["door"], "Write", "{d:?}");
    assert_eq!(d[1]["rule"], "nightshift:hook-input");
}

#[test]
fn an_empty_rules_directory_is_said_once_and_listed_as_binding_nothing() {
    let state = made_state();
    let scratch = tempfile::tempdir().unwrap();
    let empty = scratch.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let first = check(&state, &empty, "agent", "-", RM_RF);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let err = stderr(&first);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("no rule is in force") && err.contains("every tool call is allowed"),
        "{err}"
    );
    let second = check(&state, &empty, "agent", "-", RM_RF);
    assert_eq!(second.status.code(), Some(0));
    assert!(second.stderr.is_empty(), "said twice: {}", stderr(&second));

    let list = |rules: &Path, actor: &str| {
        let out = state
            .cmd()
            .arg("policy")
            .arg("--rules")
            .arg(rules)
            .args(["list", "--actor", actor])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        tests::stdout(&out)
    };
    let text = list(&empty, "agent");
    assert!(
        text.contains("hook: no rule binds actor agent's tool calls"),
        "{text}"
    );
    // A rule on another actor binds nothing of this one; it binds its own.
    let other = rm_rules(&scratch.path().join("other"), "someone-else");
    let text = list(&other, "agent");
    assert!(
        text.contains("hook: no rule binds actor agent's tool calls"),
        "{text}"
    );
    let text = list(&other, "someone-else");
    assert!(
        text.contains("hook: 1 rule(s) bind actor someone-else's tool calls: no-recursive-delete"),
        "{text}"
    );
    let json = state
        .cmd()
        .arg("policy")
        .arg("--rules")
        .arg(&empty)
        .args(["list", "--json", "--actor", "agent"])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(doc["hook"]["binding"], serde_json::json!([]));
}

/// `policy check` is answered by the binary's lean entry point (no clap
/// tree, no runtime: `orchestrator/src/fast.rs`) when its command line is
/// plain, and by the full command line otherwise (here forced by writing
/// the flags `--flag=value`): over generated calls, both give the same exit
/// code, the same output and the same audit entries.
#[test]
fn the_lean_entry_point_and_the_full_command_line_answer_alike() {
    let state = made_state();
    let scratch = tempfile::tempdir().unwrap();
    let rules = rm_rules(scratch.path(), "agent-*");
    let actors = ["agent-a", "other", "agent-b/x"];
    let tools = ["Bash", "-", "push", "Write"];
    let inputs = [
        RM_RF.to_string(),
        r#"{"command":"ls -la"}"#.to_string(),
        r#"{"command":"rm -rf /"}"#.to_string(),
        r#"{"remote":"origin","ref":"refs/heads/main","force":true}"#.to_string(),
        r#"{"remote":"origin","ref":"refs/heads/feature"}"#.to_string(),
        "not json".to_string(),
        String::new(),
        format!(r#"{{"command":"{}"}}"#, "x".repeat(300_000)),
    ];
    // A small linear congruential walk over the combinations.
    let mut x: u64 = 0x5eed;
    let mut seen_codes = std::collections::BTreeSet::new();
    for case in 0..40 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let actor = actors[(x >> 33) as usize % actors.len()];
        let tool = tools[(x >> 40) as usize % tools.len()];
        let input = &inputs[(x >> 48) as usize % inputs.len()];
        let with_rules = !(x >> 20).is_multiple_of(3);
        let run = |lean: bool| {
            let before = decisions(&state).len();
            let mut c = state.cmd();
            c.arg("policy");
            if with_rules {
                if lean {
                    c.arg("--rules").arg(&rules);
                } else {
                    c.arg(format!("--rules={}", rules.display()));
                }
            }
            c.arg("check");
            if lean {
                c.args(["--actor", actor, "--tool", tool, "--args-json", "-"]);
            } else {
                c.args([
                    format!("--actor={actor}"),
                    format!("--tool={tool}"),
                    "--args-json=-".into(),
                ]);
            }
            let out = with_stdin(c, input.as_bytes());
            let audited: Vec<_> = decisions(&state).split_off(before);
            let err = stderr(&out);
            (out.status.code(), out.stdout, err, audited)
        };
        let lean = run(true);
        let full = run(false);
        assert_eq!(
            lean, full,
            "case {case}: actor {actor}, tool {tool}, rules {with_rules}, input {:.80}",
            input
        );
        seen_codes.insert(lean.0);
    }
    // Both answers were seen: allowed and refused.
    assert!(
        seen_codes.contains(&Some(0)) && seen_codes.contains(&Some(2)),
        "{seen_codes:?}"
    );
}
