//! The policy CLI through the real binary: the harness hook's exact answers,
//! its audit entries (digest, never arguments), failing closed, rule-file
//! errors, the two authority tiers, the owner's credential, the freeze, and
//! an audit chain that still verifies after all of it. Each test has its own
//! state directory; none needs the container engine except the frozen `run`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use tests::{make_repo, stderr, stdout, State};

const FORCE_PUSH_MAIN: &str = r#"{"remote":"origin","ref":"refs/heads/main","force":true}"#;
const PLAIN_PUSH: &str = r#"{"remote":"origin","ref":"refs/heads/feature"}"#;
const FORCE_PUSH_REASON: &str = "Force-pushing to main or master rewrites shared history; push a branch and open a pull request.";
const PUSH_ASK_REASON: &str = "Pushing leaves the sandbox: a person approves each push.";

/// Runs `cmd` with `input` on stdin. The writer is a thread of its own and
/// ignores a broken pipe: the binary may stop reading early (over-long input).
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

/// `nightshift [policy --rules DIR] policy check --actor A --tool T --args-json -`.
/// The check never makes a state (a hook must not invent one): the state
/// is made first, as the supervisor's side would have.
fn check_cmd(state: &State, rules: Option<&Path>, actor: Option<&str>, tool: &str) -> Command {
    if !state.path().join("state.db").exists() {
        let made = state.run(&["runs"]);
        assert!(made.status.success(), "{}", stderr(&made));
    }
    let mut c = state.cmd();
    c.env_remove("NIGHTSHIFT_OWNER_KEY_FILE").arg("policy");
    if let Some(dir) = rules {
        c.arg("--rules").arg(dir);
    }
    c.arg("check");
    if let Some(a) = actor {
        c.args(["--actor", a]);
    }
    c.args(["--tool", tool, "--args-json", "-"]);
    c
}

fn check(state: &State, actor: Option<&str>, tool: &str, args: &str) -> Output {
    with_stdin(check_cmd(state, None, actor, tool), args.as_bytes())
}

fn check_with_rules(state: &State, rules: &Path, tool: &str, input: &[u8]) -> Output {
    with_stdin(check_cmd(state, Some(rules), Some("agent-a"), tool), input)
}

/// `nightshift ARGS` with no owner key in the environment.
fn ns(state: &State, args: &[&str]) -> Output {
    state
        .cmd()
        .env_remove("NIGHTSHIFT_OWNER_KEY_FILE")
        .args(args)
        .output()
        .expect("running nightshift")
}

fn assert_allowed(out: &Output) {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(out));
    assert!(out.stdout.is_empty(), "stdout: {}", stdout(out));
    assert!(out.stderr.is_empty(), "stderr: {}", stderr(out));
}

/// Exit 2, nothing on stdout, and stderr is exactly one line.
fn assert_blocked(out: &Output, line: &str) {
    assert_eq!(out.status.code(), Some(2), "stderr: {}", stderr(out));
    assert!(out.stdout.is_empty(), "stdout: {}", stdout(out));
    assert_eq!(stderr(out), format!("{line}\n"));
}

/// Exit 2 with a `refused by rule <id>:` line containing `needle`.
fn assert_refused_by(out: &Output, id: &str, needle: &str) {
    assert_eq!(out.status.code(), Some(2), "stderr: {}", stderr(out));
    assert!(out.stdout.is_empty(), "stdout: {}", stdout(out));
    let err = stderr(out);
    let line = err
        .lines()
        .find(|l| l.starts_with("refused by rule "))
        .unwrap_or_else(|| panic!("no `refused by rule` line in {err:?}"));
    assert!(
        line.starts_with(&format!("refused by rule {id}: ")),
        "{line}"
    );
    assert!(line.contains(needle), "{needle:?} not in {line:?}");
}

/// The bodies of the `policy_decision` audit entries, in order.
fn decisions(state: &State) -> Vec<serde_json::Value> {
    state.audit_bodies("policy_decision")
}

fn list_json(state: &State) -> serde_json::Value {
    let out = ns(state, &["policy", "list", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("policy list json")
}

fn active_rule(state: &State, id: &str) -> Option<serde_json::Value> {
    list_json(state)["active"]
        .as_array()
        .expect("active rules")
        .iter()
        .find(|r| r["id"] == id)
        .cloned()
}

fn assert_audit_intact(state: &State) {
    let out = state.verify();
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("audit chain intact"),
        "{}",
        stdout(&out)
    );
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// A rule file with one rule.
fn rule_file(
    dir: &Path,
    id: &str,
    subject: &str,
    effect: &str,
    doors_or_tools: &str,
    clause: &str,
) -> PathBuf {
    write(
        dir,
        &format!("{id}.toml"),
        &format!(
            "[[rule]]\nid = \"{id}\"\nsubject = \"{subject}\"\n{doors_or_tools}\neffect = \"{effect}\"\n\
             reason = \"Rule {id} says no.\"\nauthority = \"test\"\nmatch = [{clause}]\n"
        ),
    )
}

/// `nightshift owner init`; returns the key file.
fn owner_init(state: &State) -> PathBuf {
    let out = ns(state, &["owner", "init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let key = state.path().join("owner.key");
    assert!(key.is_file());
    key
}

#[test]
fn an_allowed_call_exits_0_prints_nothing_and_is_not_audited() {
    let state = State::new();
    assert_allowed(&check(
        &state,
        Some("agent-a"),
        "Bash",
        r#"{"command":"ls"}"#,
    ));
    assert!(decisions(&state).is_empty());
    assert_audit_intact(&state);
}

#[test]
fn refuse_and_ask_answer_exit_2_with_exact_stderr() {
    let state = State::new();
    assert_blocked(
        &check(&state, Some("agent-a"), "push", FORCE_PUSH_MAIN),
        &format!("refused by rule no-force-push-to-main: {FORCE_PUSH_REASON}"),
    );
    assert_blocked(
        &check(&state, Some("agent-a"), "push", PLAIN_PUSH),
        &format!("asks a person: {PUSH_ASK_REASON}"),
    );
    // An unset $AGENT (empty actor) is no actor, not a way around the rules.
    assert_blocked(
        &check(&state, Some(""), "push", FORCE_PUSH_MAIN),
        &format!("refused by rule no-force-push-to-main: {FORCE_PUSH_REASON}"),
    );
    assert_audit_intact(&state);
}

#[test]
fn refusals_and_asks_are_audited_by_digest_never_by_arguments() {
    let state = State::new();
    let secret = "zq-distinctive-argument-7f3a9c";
    let args = format!(
        r#"{{"remote":"origin","ref":"refs/heads/main","force":true,"commit":"{secret}"}}"#
    );
    let other = args.replace(secret, "something-else");
    assert_eq!(
        check(&state, Some("agent-a"), "push", &args).status.code(),
        Some(2)
    );
    assert_eq!(
        check(&state, Some("agent-a"), "push", &other).status.code(),
        Some(2)
    );
    assert_eq!(
        check(&state, Some("agent-b"), "push", PLAIN_PUSH)
            .status
            .code(),
        Some(2)
    );

    let generation = list_json(&state)["generation"]
        .as_str()
        .unwrap()
        .to_string();
    let explain = with_stdin(
        {
            let mut c = state.cmd();
            c.args(["policy", "explain", "--actor", "agent-a", "--tool", "push"]);
            c
        },
        args.as_bytes(),
    );
    assert!(explain.status.success(), "{}", stderr(&explain));
    let explained: serde_json::Value = serde_json::from_slice(&explain.stdout).unwrap();

    let entries = decisions(&state);
    assert_eq!(entries.len(), 3, "{entries:?}");
    let refuse = &entries[0];
    assert_eq!(refuse["actor"], "agent-a");
    assert_eq!(refuse["door"], "push");
    assert_eq!(refuse["verdict"], "refuse");
    assert_eq!(refuse["rule"], "no-force-push-to-main");
    assert_eq!(refuse["generation"], generation.as_str());
    let digest = refuse["digest"].as_str().unwrap();
    assert_eq!(digest.len(), 64, "{digest}");
    assert!(digest.bytes().all(|b| b.is_ascii_hexdigit()), "{digest}");
    assert_eq!(refuse["digest"], explained["digest"]);
    // The digest is of these arguments: other arguments, another digest.
    assert_ne!(entries[1]["digest"], refuse["digest"]);
    let ask = &entries[2];
    assert_eq!(
        (&ask["actor"], &ask["verdict"], &ask["rule"]),
        (&"agent-b".into(), &"ask".into(), &"ask-before-push".into())
    );

    // The argument is nowhere in the state: not in the database, its WAL,
    // or any other file.
    let mut stack = vec![state.path().to_path_buf()];
    let mut files = 0;
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files += 1;
                let bytes = std::fs::read(&path).unwrap();
                assert!(
                    !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                    "{} holds the argument",
                    path.display()
                );
            }
        }
    }
    assert!(files > 0);
    assert_audit_intact(&state);
}

#[test]
fn the_hook_fails_closed_on_bad_input() {
    // Each input would be allowed if it were read as `{"command":"ls"}`.
    let mut huge = b"{\"command\":\"".to_vec();
    huge.resize(2 << 20, b'a');
    huge.extend_from_slice(b"\"}");
    let cases: [(&str, Vec<u8>, &str); 4] = [
        (
            "invalid UTF-8",
            b"{\"command\":\"l\xffs\"}".to_vec(),
            "not UTF-8",
        ),
        (
            "malformed JSON",
            b"{\"command\":\"ls\"".to_vec(),
            "not JSON",
        ),
        ("2 MiB", huge, "over the limit"),
        (
            "Claude shape without tool_name",
            br#"{"tool_input":{}}"#.to_vec(),
            "tool_name",
        ),
    ];
    for (what, input, needle) in cases {
        let state = State::new();
        let tool = if what.starts_with("Claude") {
            "-"
        } else {
            "Bash"
        };
        let out = with_stdin(check_cmd(&state, None, Some("agent-a"), tool), &input);
        assert_refused_by(&out, "nightshift:hook-input", needle);
        assert_eq!(stderr(&out).lines().count(), 1, "{what}: {}", stderr(&out));
        // The refusal is audited, by the digest of what was received.
        let audited = decisions(&state);
        assert_eq!(audited.len(), 1, "{what}: {audited:?}");
        assert_eq!(audited[0]["rule"], "nightshift:hook-input");
        assert_eq!(audited[0]["digest"].as_str().map(str::len), Some(64));
        assert_audit_intact(&state);
    }
}

#[test]
fn a_rule_naming_a_door_nightshift_lacks_or_a_field_it_never_sends_is_refused_at_load() {
    let state = State::new();
    let allowed = br#"{"command":"ls"}"#;
    let dir = tempfile::tempdir().unwrap();
    // The door is `pull_request`: a rule on `pr` would never match.
    let pr = rule_file(dir.path(), "ask-pr", "*", "ask", r#"doors = ["pr"]"#, "");
    let out = check_with_rules(&state, dir.path(), "Bash", allowed);
    assert_refused_by(
        &out,
        "nightshift:hook-internal",
        "ask-pr.toml: line 4: rule ask-pr: door \"pr\"",
    );
    std::fs::remove_file(&pr).unwrap();
    // A push never sends `body`: the clause's line is named.
    let clause = r#"{ field = "body", matches = 'secret' }"#;
    let body = rule_file(
        dir.path(),
        "no-secret",
        "*",
        "refuse",
        r#"doors = ["push"]"#,
        clause,
    );
    let out = check_with_rules(&state, dir.path(), "Bash", allowed);
    assert_refused_by(&out, "nightshift:hook-internal", "no-secret.toml: line 8: rule no-secret: match clause 0 tests field \"body\", which door push never sends");
    // Declaring such a rule is refused the same way, and nothing is stored.
    let key = owner_init(&state);
    let out = ns(
        &state,
        &[
            "policy",
            "declare",
            body.to_str().unwrap(),
            "--owner-key-file",
            key.to_str().unwrap(),
        ],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("which door push never sends"),
        "{}",
        stderr(&out)
    );
    assert!(active_rule(&state, "no-secret").is_none());
}

#[test]
fn the_hook_fails_closed_when_its_rules_or_state_cannot_be_read() {
    let allowed = br#"{"command":"ls"}"#;
    let scratch = tempfile::tempdir().unwrap();

    // A malformed rule file in --rules: the file is named.
    let bad = scratch.path().join("bad");
    std::fs::create_dir(&bad).unwrap();
    write(
        &bad,
        "10-ok.toml",
        &std::fs::read_to_string(shipped_rules()).unwrap(),
    );
    write(&bad, "20-bad.toml", "[[rule]]\nid = \"x\"\nsubject = \"*\"\ntools = [\"Bash\"]\neffect = \"sometimes\"\nreason = \"r\"\nauthority = \"a\"\n");
    let state = State::new();
    let out = check_with_rules(&state, &bad, "Bash", allowed);
    assert_refused_by(&out, "nightshift:hook-internal", "20-bad.toml");

    // A --rules directory that does not exist.
    let missing = scratch.path().join("no-such-rules");
    let out = check_with_rules(&state, &missing, "Bash", allowed);
    assert_refused_by(&out, "nightshift:hook-internal", "no-such-rules");

    // Arguments from anywhere but stdin.
    let mut c = state.cmd();
    c.args([
        "policy",
        "check",
        "--tool",
        "Bash",
        "--args-json",
        "/etc/hostname",
    ]);
    assert_refused_by(
        &with_stdin(c, allowed),
        "nightshift:hook-internal",
        "--args-json",
    );

    // A state directory that cannot be opened: a path under a regular file.
    let file = write(scratch.path(), "plain-file", "x");
    let out = with_stdin(
        {
            let mut c = state.cmd();
            c.env("NIGHTSHIFT_STATE_DIR", file.join("state"));
            c.args(["policy", "check", "--tool", "Bash", "--args-json", "-"]);
            c
        },
        allowed,
    );
    assert_refused_by(&out, "nightshift:hook-internal", "");

    // The same rules and state answer 0 when nothing is wrong: the refusals
    // above came from the failures, not from the request.
    let good = scratch.path().join("good");
    std::fs::create_dir(&good).unwrap();
    write(
        &good,
        "10-ok.toml",
        &std::fs::read_to_string(shipped_rules()).unwrap(),
    );
    assert_allowed(&check_with_rules(&state, &good, "Bash", allowed));
    assert_audit_intact(&state);
}

fn shipped_rules() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/rules/default.toml")
}

#[test]
fn a_look_around_pattern_is_refused_naming_file_and_line() {
    let state = State::new();
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "lookaround.toml",
        "# a comment\n[[rule]]\nid = \"no-rm-but-build\"\nsubject = \"*\"\ntools = [\"Bash\"]\n\
         effect = \"refuse\"\nreason = \"r\"\nauthority = \"a\"\nmatch = [\n  \
         { field = \"command\", matches = 'rm -rf (?!build)' },\n]\n",
    );
    let out = ns(
        &state,
        &["policy", "--rules", dir.path().to_str().unwrap(), "list"],
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(file.to_str().unwrap()), "{err}");
    assert!(err.contains("line 10"), "{err}");
    assert!(err.contains("no-rm-but-build"), "{err}");
    // And the hook refuses rather than run without the rule.
    let out = check_with_rules(&state, dir.path(), "Bash", br#"{"command":"ls"}"#);
    assert_refused_by(&out, "nightshift:hook-internal", "line 10");
}

#[test]
fn an_agent_may_only_tighten_and_only_on_itself() {
    let state = State::new();
    let dir = tempfile::tempdir().unwrap();
    let clause = r#"{ field = "ref", matches = '^refs/heads/release' }"#;
    let own = rule_file(
        dir.path(),
        "agent-a-no-release",
        "agent-a",
        "refuse",
        r#"doors = ["push"]"#,
        clause,
    );
    let out = ns(
        &state,
        &[
            "policy",
            "declare",
            own.to_str().unwrap(),
            "--actor",
            "agent-a",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "declared agent-a-no-release\n");

    let release = r#"{"remote":"origin","ref":"refs/heads/release-1"}"#;
    assert_blocked(
        &check(&state, Some("agent-a"), "push", release),
        "refused by rule agent-a-no-release: Rule agent-a-no-release says no.",
    );
    // It binds only its author: another agent still just asks.
    assert_blocked(
        &check(&state, Some("agent-b"), "push", release),
        &format!("asks a person: {PUSH_ASK_REASON}"),
    );

    let loosen = rule_file(
        dir.path(),
        "agent-a-may-push",
        "agent-a",
        "allow",
        r#"doors = ["push"]"#,
        "",
    );
    let other = rule_file(
        dir.path(),
        "agent-b-no-push",
        "agent-b",
        "refuse",
        r#"doors = ["push"]"#,
        "",
    );
    let everyone = rule_file(
        dir.path(),
        "nobody-pushes",
        "*",
        "refuse",
        r#"doors = ["push"]"#,
        "",
    );
    for (file, why) in [
        (&loosen, "an allow rule loosens the policy"),
        (&other, "binds more than the declaring agent"),
        (&everyone, "binds more than the declaring agent"),
    ] {
        let out = ns(
            &state,
            &[
                "policy",
                "declare",
                file.to_str().unwrap(),
                "--actor",
                "agent-a",
            ],
        );
        assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(why), "{err}");
        assert!(err.contains("use `nightshift policy propose`"), "{err}");
    }
    // An agent retiring a shipped refusal loosens too.
    let out = ns(
        &state,
        &[
            "policy",
            "retire",
            "no-force-push-to-main",
            "--why",
            "in the way",
            "--actor",
            "agent-a",
        ],
    );
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nightshift policy propose"),
        "{}",
        stderr(&out)
    );

    // None of the refused changes took effect.
    for id in ["agent-a-may-push", "agent-b-no-push", "nobody-pushes"] {
        assert!(active_rule(&state, id).is_none(), "{id} is active");
    }
    assert!(active_rule(&state, "no-force-push-to-main").is_some());
    assert_audit_intact(&state);
}

#[test]
fn a_glob_actor_is_no_one_agent_and_its_declaration_needs_the_owner() {
    // `--actor '*'` with `subject = "*"` (or `run-*` with `run-*`) named
    // "itself" and was taken as tier 1, binding every actor.
    let state = State::new();
    let dir = tempfile::tempdir().unwrap();
    for (n, glob) in ["*", "run-*"].into_iter().enumerate() {
        let id = format!("glob-refuses-push-{n}");
        let file = rule_file(dir.path(), &id, glob, "refuse", r#"doors = ["push"]"#, "");
        let out = ns(
            &state,
            &["policy", "declare", file.to_str().unwrap(), "--actor", glob],
        );
        assert_eq!(out.status.code(), Some(9), "{glob}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("binds more than the declaring agent"), "{err}");
        assert!(err.contains("use `nightshift policy propose`"), "{err}");
        assert!(active_rule(&state, &id).is_none(), "{id} is active");
    }
    // Another run's push still just asks.
    let release = r#"{"remote":"origin","ref":"refs/heads/release-1"}"#;
    assert_blocked(
        &check(&state, Some("run-other"), "push", release),
        &format!("asks a person: {PUSH_ASK_REASON}"),
    );
    assert_audit_intact(&state);
}

#[test]
fn a_proposal_is_inert_until_the_owner_ratifies_it_and_then_locked() {
    let state = State::new();
    let dir = tempfile::tempdir().unwrap();
    let clause = r#"{ field = "command", matches = '^curl ' }"#;
    let file = rule_file(
        dir.path(),
        "no-curl",
        "*",
        "refuse",
        r#"tools = ["Bash"]"#,
        clause,
    );
    let curl = r#"{"command":"curl https://example.com"}"#;

    let out = ns(
        &state,
        &[
            "policy",
            "propose",
            file.to_str().unwrap(),
            "--actor",
            "agent-a",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let proposal = text
        .strip_prefix("proposed ")
        .and_then(|t| t.split(':').next())
        .unwrap_or_else(|| panic!("{text}"))
        .to_string();
    assert!(
        text.contains(&format!("nightshift policy ratify {proposal}")),
        "{text}"
    );

    // Inert: pending, not active, and the check is unchanged.
    let list = list_json(&state);
    assert_eq!(list["pending"], serde_json::json!([proposal]));
    assert!(active_rule(&state, "no-curl").is_none());
    assert_allowed(&check(&state, Some("agent-a"), "Bash", curl));

    // Before `owner init` there is no credential to present.
    let out = ns(&state, &["policy", "ratify", &proposal]);
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nightshift owner init"),
        "{}",
        stderr(&out)
    );

    let key = owner_init(&state);
    let out = ns(&state, &["policy", "ratify", &proposal]);
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--owner-key-file"),
        "{}",
        stderr(&out)
    );

    let wrong = write(dir.path(), "wrong.key", &format!("{}\n", "ab".repeat(32)));
    let out = ns(
        &state,
        &[
            "policy",
            "ratify",
            &proposal,
            "--owner-key-file",
            wrong.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not the owner's credential"),
        "{}",
        stderr(&out)
    );
    assert_allowed(&check(&state, Some("agent-a"), "Bash", curl));

    // Through the environment variable, as the issue documents.
    let out = state
        .cmd()
        .env("NIGHTSHIFT_OWNER_KEY_FILE", &key)
        .args(["policy", "ratify", &proposal])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_blocked(
        &check(&state, Some("agent-b"), "Bash", curl),
        "refused by rule no-curl: Rule no-curl says no.",
    );
    let list = list_json(&state);
    assert_eq!(list["pending"], serde_json::json!([]));
    let rule = active_rule(&state, "no-curl").expect("no-curl active");
    assert_eq!(rule["locked"], true, "{rule}");

    // Ratified is locked: not even the owner retires it without an unlock.
    let key_arg = key.to_str().unwrap();
    let out = ns(
        &state,
        &[
            "policy",
            "retire",
            "no-curl",
            "--why",
            "x",
            "--owner-key-file",
            key_arg,
        ],
    );
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
    assert!(stderr(&out).contains("locked"), "{}", stderr(&out));
    assert!(active_rule(&state, "no-curl").is_some());
    // A proposal is ratified once.
    let out = ns(
        &state,
        &["policy", "ratify", &proposal, "--owner-key-file", key_arg],
    );
    assert_ne!(out.status.code(), Some(0), "{}", stdout(&out));
    assert_audit_intact(&state);
}

#[test]
fn the_owner_declares_and_retires_and_no_one_else_does() {
    let state = State::new();
    let dir = tempfile::tempdir().unwrap();
    let clause = r#"{ field = "command", matches = '^wget ' }"#;
    let file = rule_file(
        dir.path(),
        "no-wget",
        "*",
        "refuse",
        r#"tools = ["Bash"]"#,
        clause,
    );
    let wget = r#"{"command":"wget https://example.com"}"#;
    let key = owner_init(&state);
    let key_arg = key.to_str().unwrap();
    let file_arg = file.to_str().unwrap();

    // Declaring with no actor is the owner's act: it needs the key.
    let out = ns(&state, &["policy", "declare", file_arg]);
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
    assert!(active_rule(&state, "no-wget").is_none());
    let out = ns(
        &state,
        &["policy", "declare", file_arg, "--owner-key-file", key_arg],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_refused_by(
        &check(&state, Some("agent-a"), "Bash", wget),
        "no-wget",
        "says no",
    );

    let retire = ["policy", "retire", "no-wget", "--why", "wget is fine now"];
    let out = ns(&state, &retire);
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
    let out = ns(&state, &[&retire[..], &["--actor", "agent-a"]].concat());
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
    assert_refused_by(
        &check(&state, Some("agent-a"), "Bash", wget),
        "no-wget",
        "says no",
    );

    let out = ns(
        &state,
        &[&retire[..], &["--owner-key-file", key_arg]].concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "retired no-wget\n");
    assert_allowed(&check(&state, Some("agent-a"), "Bash", wget));
    assert!(active_rule(&state, "no-wget").is_none());
    assert_audit_intact(&state);
}

#[test]
fn a_freeze_refuses_every_door_and_every_run_until_the_owner_thaws() {
    let state = State::new();
    let allowed = r#"{"command":"ls"}"#;
    let why = "disks are being swapped";
    let key = owner_init(&state);
    assert_allowed(&check(&state, Some("agent-a"), "Bash", allowed));

    let out = ns(&state, &["freeze", "--why", why]);
    assert!(out.status.success(), "{}", stderr(&out));
    let frozen = format!("refused by rule nightshift:freeze: everything is frozen: {why}");
    assert_blocked(&check(&state, Some("agent-a"), "Bash", allowed), &frozen);
    assert_blocked(&check(&state, None, "push", PLAIN_PUSH), &frozen);
    assert_eq!(list_json(&state)["frozen"], why);

    // A new run is refused before anything else: with no engine it would be
    // exit 4, with a missing image exit 5.
    let repo = make_repo();
    let out = state
        .cmd()
        .env(
            "DOCKER_HOST",
            "unix:///nonexistent/nightshift-test/docker.sock",
        )
        .args(["run", "--repo", repo.path().to_str().unwrap()])
        .args(["--image", "nightshift-no-such-image:1", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("frozen ({why})")),
        "{}",
        stderr(&out)
    );
    assert!(state.runs().is_empty());

    let out = ns(&state, &["thaw"]);
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
    let wrong = state.path().join("wrong.key");
    std::fs::write(&wrong, "not the key\n").unwrap();
    let out = ns(
        &state,
        &["thaw", "--owner-key-file", wrong.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
    assert_blocked(&check(&state, Some("agent-a"), "Bash", allowed), &frozen);

    let out = ns(&state, &["thaw", "--owner-key-file", key.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_allowed(&check(&state, Some("agent-a"), "Bash", allowed));
    assert_eq!(list_json(&state)["frozen"], serde_json::Value::Null);

    let refused_by_freeze = decisions(&state)
        .iter()
        .filter(|d| d["rule"] == "nightshift:freeze")
        .count();
    assert_eq!(refused_by_freeze, 3);
    assert_audit_intact(&state);
}

#[test]
fn claude_code_hook_input_names_the_tool_arguments_and_scope() {
    let state = State::new();
    let ls = br#"{"tool_name":"Bash","tool_input":{"command":"ls"},"cwd":"/tmp"}"#;
    assert_allowed(&with_stdin(
        check_cmd(&state, None, Some("agent-a"), "-"),
        ls,
    ));

    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(shipped_rules(), dir.path().join("00-default.toml")).unwrap();
    write(
        dir.path(),
        "10-work.toml",
        "[[rule]]\nid = \"no-rm-in-work\"\nsubject = \"*\"\nscope = \"/work\"\ntools = [\"Bash\"]\n\
         effect = \"refuse\"\nreason = \"No rm under /work.\"\nauthority = \"test\"\n\
         match = [{ field = \"command\", matches = '^rm ' }]\n",
    );
    let hook = |tool_name: &str, command: &str, cwd: &str| {
        let input = serde_json::json!({
            "session_id": "s", "hook_event_name": "PreToolUse",
            "tool_name": tool_name, "tool_input": {"command": command}, "cwd": cwd,
        });
        check_with_rules(&state, dir.path(), "-", input.to_string().as_bytes())
    };
    assert_blocked(
        &hook("Bash", "rm -rf x", "/work/run-1"),
        "refused by rule no-rm-in-work: No rm under /work.",
    );
    // Each part is read from stdin: another tool, another command, another
    // scope, and the rule no longer applies.
    assert_allowed(&hook("Read", "rm -rf x", "/work/run-1"));
    assert_allowed(&hook("Bash", "ls", "/work/run-1"));
    assert_allowed(&hook("Bash", "rm -rf x", "/tmp"));
    assert_allowed(&hook("Bash", "rm -rf x", "/workshop"));
    assert_audit_intact(&state);
}

#[test]
fn a_retirement_is_proposed_ratified_and_a_locked_rule_unlocked_first() {
    let state = State::new();
    let key = owner_init(&state);
    let key = key.to_str().unwrap();
    // A plain notify asks a person under the shipped rules.
    assert_blocked(
        &check(
            &state,
            Some("agent-a"),
            "notify",
            r#"{"destination":"team"}"#,
        ),
        "asks a person: Messages reach people: a person approves each one.",
    );
    let out = ns(
        &state,
        &[
            "policy",
            "propose",
            "--actor",
            "agent-a",
            "--retire",
            "ask-before-notify",
            "--why",
            "fine",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let proposal = stdout(&out)
        .split_whitespace()
        .nth(1)
        .unwrap()
        .trim_end_matches(':')
        .to_string();
    // Inert until ratified.
    assert_blocked(
        &check(
            &state,
            Some("agent-a"),
            "notify",
            r#"{"destination":"team"}"#,
        ),
        "asks a person: Messages reach people: a person approves each one.",
    );
    let out = ns(
        &state,
        &["policy", "ratify", &proposal, "--owner-key-file", key],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_allowed(&check(
        &state,
        Some("agent-a"),
        "notify",
        r#"{"destination":"team"}"#,
    ));
    // A locked rule cannot be retired until the owner unlocks it.
    let out = ns(
        &state,
        &[
            "policy",
            "retire",
            "no-force-push-to-main",
            "--why",
            "x",
            "--owner-key-file",
            key,
        ],
    );
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
    let out = ns(&state, &["policy", "unlock", "no-force-push-to-main"]);
    assert_eq!(
        out.status.code(),
        Some(9),
        "unlock without the key: {}",
        stderr(&out)
    );
    let out = ns(
        &state,
        &[
            "policy",
            "unlock",
            "no-force-push-to-main",
            "--owner-key-file",
            key,
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = ns(
        &state,
        &[
            "policy",
            "retire",
            "no-force-push-to-main",
            "--why",
            "x",
            "--owner-key-file",
            key,
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_audit_intact(&state);
}

/// Rules in STATE/rules/ replace the shipped defaults: never silently.
/// `policy list` (as `run`, `serve` and `worker`) warns, naming each
/// shipped rule left out; a copy of the defaults beside the owner's own
/// files silences it.
#[test]
fn rules_that_replace_the_shipped_defaults_are_warned_of_loudly() {
    let state = State::new();
    let out = state.run(&["policy", "list"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("WARNING"), "{}", stderr(&out));
    let rules = state.path().join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(
        rules.join("mine.toml"),
        "[[rule]]\nid = \"no-notify\"\nsubject = \"*\"\ndoors = [\"notify\"]\neffect = \"refuse\"\nreason = \"r\"\nauthority = \"owner\"\n",
    )
    .unwrap();
    let out = state.run(&["policy", "list"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("WARNING")
            && err.contains("no-force-push-to-main (locked)")
            && err.contains("ask-before-push"),
        "{err}"
    );
    std::fs::write(rules.join("default.toml"), policies::DEFAULT_RULES).unwrap();
    let out = state.run(&["policy", "list"]);
    assert!(!stderr(&out).contains("WARNING"), "{}", stderr(&out));
}

/// `policy list` says who froze and when (the freeze row records its
/// time), in text and in JSON.
#[test]
fn policy_list_says_who_froze_and_when() {
    let state = State::new();
    let out = ns(&state, &["freeze", "--why", "incident 7"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = ns(&state, &["policy", "list"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let line = text
        .lines()
        .find(|l| l.starts_with("FROZEN: incident 7 (by nightshift freeze by "))
        .unwrap_or_else(|| panic!("no FROZEN line: {text}"));
    assert!(line.contains(" at 20"), "{line}");
    let out = ns(&state, &["policy", "list", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["frozen"], "incident 7");
    assert!(v["frozen_by"]
        .as_str()
        .unwrap()
        .starts_with("nightshift freeze by "));
    let at = v["frozen_at"].as_str().expect("frozen_at");
    assert!(
        time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).is_ok(),
        "{at}"
    );
}
