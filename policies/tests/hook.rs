//! The harness hook fails closed: only valid JSON that the rules allow
//! exits 0, and allow prints nothing.

use policies::hook::{hook_decide, EXIT_ALLOW, EXIT_BLOCK, MAX_HOOK_INPUT};
use policies::{Author, Effect, Request, Row, Rule, RuleSet, RuleSpec, Timestamp};
use proptest::prelude::*;
use serde_json::{json, Value};

const NOW: Timestamp = Timestamp(1_800_000_000);

fn rule(
    id: &str,
    subject: &str,
    doors: &str,
    effect: Effect,
    reason: &str,
    cmd: Option<&str>,
) -> Rule {
    Rule::compile(RuleSpec {
        id: id.into(),
        subject: subject.into(),
        scope: None,
        doors: vec![doors.into()],
        tools: Vec::new(),
        effect,
        reason: reason.into(),
        authority: "test".into(),
        locked: false,
        since: None,
        until: None,
        clauses: cmd
            .map(|p| policies::ClauseSpec {
                field: "command".into(),
                matches: Some(p.into()),
                not_matches: None,
            })
            .into_iter()
            .collect(),
    })
    .unwrap()
}

fn rules() -> RuleSet {
    RuleSet::from_rows(
        [
            rule(
                "no-rm",
                "*",
                "Bash",
                Effect::Refuse,
                "no recursive deletes",
                Some("rm -rf"),
            ),
            rule(
                "ask-push",
                "*",
                "push",
                Effect::Ask,
                "a person approves pushes",
                None,
            ),
            rule(
                "a1-no-web",
                "a1",
                "web_*",
                Effect::Refuse,
                "a1 stays offline",
                None,
            ),
        ]
        .into_iter()
        .map(|rule| Row::Declare {
            rule,
            author: Author::Shipped,
        }),
    )
    .unwrap()
}

#[test]
fn allow_exits_zero_and_prints_nothing() {
    let out = hook_decide(
        &rules(),
        Some("a1"),
        "Bash",
        br#"{"command":"ls"}"#,
        NOW,
        false,
    );
    assert_eq!(
        (out.exit_code, out.stderr.as_str(), out.verdict),
        (EXIT_ALLOW, "", Effect::Allow)
    );
}

#[test]
fn refusal_and_ask_lines_are_exact() {
    let out = hook_decide(
        &rules(),
        Some("a1"),
        "Bash",
        br#"{"command":"rm -rf /"}"#,
        NOW,
        false,
    );
    assert_eq!(out.exit_code, EXIT_BLOCK);
    assert_eq!(out.stderr, "refused by rule no-rm: no recursive deletes");
    let out = hook_decide(&rules(), Some("a1"), "push", b"{}", NOW, false);
    assert_eq!(out.exit_code, EXIT_BLOCK);
    assert_eq!(out.stderr, "asks a person: a person approves pushes");
}

#[test]
fn claude_code_shape_reads_tool_name_and_input() {
    let stdin = json!({
        "session_id": "s", "hook_event_name": "PreToolUse", "cwd": "/w",
        "tool_name": "Bash", "tool_input": {"command": "rm -rf build", "description": "clean"}
    });
    let out = hook_decide(
        &rules(),
        Some("a1"),
        "-",
        stdin.to_string().as_bytes(),
        NOW,
        false,
    );
    assert_eq!(out.stderr, "refused by rule no-rm: no recursive deletes");
    let d = out.decision.unwrap();
    let expect = Request {
        actor: Some("a1".into()),
        door: "Bash".into(),
        args: json!({"command": "rm -rf build", "description": "clean"}),
        scope: Some("/w".into()),
    };
    assert_eq!(d.digest, expect.digest());
    let ok = json!({"tool_name": "Read", "tool_input": {"file_path": "/w/x"}});
    assert_eq!(
        hook_decide(&rules(), None, "-", ok.to_string().as_bytes(), NOW, false).exit_code,
        EXIT_ALLOW
    );
}

#[test]
fn claude_shape_that_is_odd_is_refused() {
    for bad in [
        json!([1, 2]),
        json!({"tool_input": {}}),
        json!({"tool_name": 3, "tool_input": {}}),
        json!({"tool_name": "", "tool_input": {}}),
        json!({"tool_name": "Bash"}),
        json!({"tool_name": "Bash", "tool_input": {}, "cwd": 7}),
    ] {
        let out = hook_decide(
            &rules(),
            Some("a1"),
            "-",
            bad.to_string().as_bytes(),
            NOW,
            false,
        );
        assert_eq!(out.exit_code, EXIT_BLOCK, "{bad}");
        assert!(
            out.stderr
                .starts_with("refused by rule nightshift:hook-input: "),
            "{}",
            out.stderr
        );
    }
}

#[test]
fn empty_actor_is_no_actor_and_a_refuse_for_a_named_actor_asks() {
    let out = hook_decide(&rules(), Some(""), "web_fetch", b"{}", NOW, false);
    assert_eq!(out.exit_code, EXIT_BLOCK);
    assert!(
        out.stderr.starts_with("asks a person: a1 stays offline"),
        "{}",
        out.stderr
    );
    assert_eq!(out.decision.unwrap().stood_aside.len(), 1);
    let out = hook_decide(&rules(), Some("a2"), "web_fetch", b"{}", NOW, false);
    assert_eq!(out.exit_code, EXIT_ALLOW);
}

#[test]
fn frozen_refuses_everything_naming_the_freeze() {
    let out = hook_decide(&rules(), Some("a1"), "Read", b"{}", NOW, true);
    assert_eq!(out.exit_code, EXIT_BLOCK);
    assert!(
        out.stderr
            .starts_with("refused by rule nightshift:freeze: "),
        "{}",
        out.stderr
    );
}

#[test]
fn huge_input_is_refused_even_if_valid() {
    let mut big = b"{\"command\":\"".to_vec();
    big.extend(std::iter::repeat_n(b'a', MAX_HOOK_INPUT));
    big.extend(b"\"}");
    let out = hook_decide(&RuleSet::new(), None, "Bash", &big, NOW, false);
    assert_eq!(out.exit_code, EXIT_BLOCK);
    assert!(out.stderr.contains("over the limit"), "{}", out.stderr);
}

#[test]
fn deep_nesting_is_refused_not_a_crash() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let out = hook_decide(&RuleSet::new(), None, "Bash", deep.as_bytes(), NOW, false);
    assert_eq!(out.exit_code, EXIT_BLOCK);
    assert!(out.stderr.contains("not JSON"), "{}", out.stderr);
}

#[test]
fn reasons_stay_on_one_line() {
    let set = RuleSet::from_rows([Row::Declare {
        rule: rule(
            "multi",
            "*",
            "x",
            Effect::Refuse,
            "line one\nline two\r",
            None,
        ),
        author: Author::Shipped,
    }])
    .unwrap();
    let out = hook_decide(&set, None, "x", b"null", NOW, false);
    assert_eq!(out.stderr, "refused by rule multi: line one line two ");
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        prop_oneof![
            Just("rm -rf /".to_owned()),
            Just("ls".to_owned()),
            "\\PC{0,12}"
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![Just("command".to_owned()), "[a-z]{1,6}"],
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Stdin of every kind: random bytes, valid JSON, JSON cut short, JSON
/// with an invalid UTF-8 byte spliced in.
fn stdin() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..64),
        json_value().prop_map(|v| v.to_string().into_bytes()),
        (json_value(), any::<prop::sample::Index>()).prop_map(|(v, i)| {
            let mut b = v.to_string().into_bytes();
            b.truncate(i.index(b.len().max(1)));
            b
        }),
        (json_value(), any::<prop::sample::Index>(), 0x80u8..=0xff).prop_map(|(v, i, bad)| {
            let mut b = v.to_string().into_bytes();
            let at = i.index(b.len() + 1);
            b.insert(at, bad);
            b
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn fuzzed_stdin_exits_2_unless_valid_json_the_rules_allow(
        bytes in stdin(),
        tool in prop_oneof![Just("Bash"), Just("push"), Just("web_get"), Just("-")],
        actor in prop_oneof![Just(None), Just(Some("a1")), Just(Some(""))],
    ) {
        let set = rules();
        let out = hook_decide(&set, actor, tool, &bytes, NOW, false);
        prop_assert!(out.exit_code == EXIT_ALLOW || out.exit_code == EXIT_BLOCK);
        let parsed = std::str::from_utf8(&bytes).ok().and_then(|t| serde_json::from_str::<Value>(t).ok());
        let expect_allow = match (&parsed, tool) {
            (None, _) => false,
            (Some(v), "-") => match (v.get("tool_name"), v.get("tool_input")) {
                (Some(Value::String(name)), Some(args)) if !name.is_empty()
                    && v.get("cwd").is_none_or(|c| c.is_string() || c.is_null()) => {
                    let req = Request { actor: actor.filter(|a| !a.is_empty()).map(Into::into), door: name.clone(), args: args.clone(), scope: None };
                    policies::evaluate(&set, &req, NOW).verdict == Effect::Allow
                }
                _ => false,
            },
            (Some(v), t) => {
                let req = Request { actor: actor.filter(|a| !a.is_empty()).map(Into::into), door: t.into(), args: v.clone(), scope: None };
                policies::evaluate(&set, &req, NOW).verdict == Effect::Allow
            }
        };
        if expect_allow {
            prop_assert_eq!(out.exit_code, EXIT_ALLOW);
            prop_assert_eq!(out.stderr.as_str(), "");
        } else {
            prop_assert_eq!(out.exit_code, EXIT_BLOCK);
            prop_assert!(
                out.stderr.starts_with("refused by rule ") || out.stderr.starts_with("asks a person: "),
                "{}", out.stderr
            );
            prop_assert!(!out.stderr.contains('\n'));
        }
        if parsed.is_none() {
            prop_assert!(out.stderr.starts_with("refused by rule nightshift:hook-input: "), "{}", out.stderr);
        }
    }
}

#[test]
fn a_harness_payload_with_a_tool_name_uses_its_tool_input_or_refuses_the_mismatch() {
    let payload = json!({
        "session_id": "s", "hook_event_name": "PreToolUse", "cwd": "/w",
        "tool_name": "Bash", "tool_input": {"command": "rm -rf build"}
    })
    .to_string();
    // `--tool Bash` with the whole payload: its tool_input is matched.
    let out = hook_decide(&rules(), Some("a1"), "Bash", payload.as_bytes(), NOW, false);
    assert_eq!(out.exit_code, EXIT_BLOCK);
    assert_eq!(out.stderr, "refused by rule no-rm: no recursive deletes");
    assert_eq!(out.tool.as_deref(), Some("Bash"));
    // `--tool Read` with a payload for Bash: the mismatch is refused.
    let out = hook_decide(&rules(), Some("a1"), "Read", payload.as_bytes(), NOW, false);
    assert_eq!(out.exit_code, EXIT_BLOCK);
    assert!(
        out.stderr
            .starts_with("refused by rule nightshift:hook-input: --tool Read was given, but stdin is a harness payload for tool Bash"),
        "{}",
        out.stderr
    );
    // Plain arguments are still the arguments.
    let out = hook_decide(
        &rules(),
        Some("a1"),
        "Bash",
        br#"{"command":"rm -rf /"}"#,
        NOW,
        false,
    );
    assert_eq!(out.exit_code, EXIT_BLOCK);
}

#[test]
fn the_outcome_names_the_tool_the_payload_named() {
    let payload = json!({"tool_name": "Bash", "tool_input": {"command": "ls"}}).to_string();
    let out = hook_decide(&rules(), Some("a1"), "-", payload.as_bytes(), NOW, false);
    assert_eq!(out.exit_code, EXIT_ALLOW);
    assert_eq!(out.tool.as_deref(), Some("Bash"));
    let odd = json!({"tool_name": "Bash", "tool_input": {}, "cwd": 7}).to_string();
    let out = hook_decide(&rules(), Some("a1"), "-", odd.as_bytes(), NOW, false);
    assert_eq!(out.tool.as_deref(), Some("Bash"));
    let out = hook_decide(&rules(), Some("a1"), "-", b"[1]", NOW, false);
    assert_eq!(out.tool, None);
}
