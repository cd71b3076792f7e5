//! The harness hook: stdin bytes in, an exit code and one stderr line out.
//!
//! Invariants: the hook fails closed. Input over [`MAX_HOOK_INPUT`] bytes,
//! not UTF-8, not JSON (including nesting deeper than the JSON parser's
//! limit), a missing or empty tool name, control characters in the actor or
//! tool name: each is a refusal with the reason, exit 2. Only a request the
//! rules allow exits 0, and then prints nothing. The stderr line is exactly
//! `refused by rule <id>: <reason>` or `asks a person: <reason>`, on one
//! line (control characters in reasons become spaces); refusals that no
//! declared rule made name a reserved id (`nightshift:freeze`,
//! `nightshift:hook-input`), which no declared rule can have
//! (`tests/hook.rs::fuzzed_stdin_exits_2_unless_valid_json_the_rules_allow`,
//! `tests/hook.rs::allow_exits_zero_and_prints_nothing`,
//! `tests/hook.rs::huge_input_is_refused_even_if_valid`,
//! `tests/hook.rs::refusal_and_ask_lines_are_exact`,
//! `tests/loading.rs::reserved_ids_cannot_be_declared`).
//!
//! Two input shapes: with a tool name given (`--tool Bash`), stdin is the
//! tool's arguments as any JSON value; with `--tool -`, stdin is the object
//! Claude Code's `PreToolUse` hook sends: the tool name is its `tool_name`,
//! the arguments its `tool_input`, and the scope its `cwd` when present.
//! An empty actor (an unset `$AGENT`) counts as no actor.
//!
//! A harness payload given with a tool name (`--tool Bash` and Claude
//! Code's whole object on stdin) is recognised by its `tool_name` and
//! `tool_input`: when its `tool_name` is the tool given, its `tool_input`
//! (and `cwd`) are used, as with `--tool -`; when it names another tool, the
//! mismatch is refused. It is never matched as if it were the arguments,
//! where no rule's field (`command`) would be found and the call allowed
//! (`tests/hook.rs::a_harness_payload_with_a_tool_name_uses_its_tool_input_or_refuses_the_mismatch`).

use serde_json::Value;

use crate::evaluate::{evaluate, evaluate_rules, Decider, Decision, Verdict};
use crate::request::Request;
use crate::ruleset::{Freeze, RuleSet};
use crate::timestamp::Timestamp;

/// Largest stdin the hook reads, bytes.
pub const MAX_HOOK_INPUT: usize = 1 << 20;
/// The id named when the hook refuses its input itself.
pub const INPUT_ID: &str = "nightshift:hook-input";

/// Exit code for allow.
pub const EXIT_ALLOW: i32 = 0;
/// Exit code for refuse and ask (the harness blocks the call).
pub const EXIT_BLOCK: i32 = 2;

/// What the hook tells the harness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookOutcome {
    /// 0 allow, 2 otherwise.
    pub exit_code: i32,
    /// The line for stderr, without newline; empty on allow.
    pub stderr: String,
    /// The verdict.
    pub verdict: Verdict,
    /// The decision, when the input was good enough to evaluate.
    pub decision: Option<Decision>,
    /// The tool the call is for, as far as the input told it (`--tool`, or
    /// the payload's `tool_name`); `None` when stdin named none.
    pub tool: Option<String>,
}

/// Longest tool name the outcome keeps (the audit records it).
pub const MAX_TOOL_NAME: usize = 256;

fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

fn refuse_input(reason: &str) -> HookOutcome {
    HookOutcome {
        exit_code: EXIT_BLOCK,
        stderr: format!("refused by rule {INPUT_ID}: {}", one_line(reason)),
        verdict: Verdict::Refuse,
        decision: None,
        tool: None,
    }
}

/// Turns a decision into the hook's answer.
pub fn outcome_of(decision: Decision) -> HookOutcome {
    let (exit_code, stderr) = match decision.verdict {
        Verdict::Allow => (EXIT_ALLOW, String::new()),
        Verdict::Ask => (
            EXIT_BLOCK,
            format!("asks a person: {}", one_line(&decision.reason)),
        ),
        Verdict::Refuse => {
            let id = match &decision.rule {
                Decider::NoRule => INPUT_ID.to_owned(),
                other => other.to_string(),
            };
            (
                EXIT_BLOCK,
                format!(
                    "refused by rule {}: {}",
                    one_line(&id),
                    one_line(&decision.reason)
                ),
            )
        }
    };
    HookOutcome {
        exit_code,
        stderr,
        verdict: decision.verdict,
        decision: Some(decision),
        tool: None,
    }
}

/// A harness payload's parts: tool name, arguments, scope.
type Parts = (String, Value, Option<String>);

/// Why a harness payload was refused, and the tool it named (if any).
struct BadPayload {
    reason: &'static str,
    tool: Option<String>,
}

/// The parts of a harness payload (Claude Code's `PreToolUse` object).
fn payload_parts(json: Value) -> Result<Parts, BadPayload> {
    let bad = |reason, tool| Err(BadPayload { reason, tool });
    let Value::Object(mut map) = json else {
        return bad(
            "with --tool -, stdin must be an object with tool_name and tool_input",
            None,
        );
    };
    let door = match map.remove("tool_name") {
        Some(Value::String(s)) => s,
        _ => return bad("with --tool -, stdin must have a string tool_name", None),
    };
    let Some(args) = map.remove("tool_input") else {
        return bad("with --tool -, stdin must have tool_input", Some(door));
    };
    let scope = match map.remove("cwd") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(_) => return bad("cwd in stdin must be a string", Some(door)),
    };
    Ok((door, args, scope))
}

/// Whether `json` is a harness payload rather than a tool's arguments.
fn is_harness_payload(json: &Value) -> bool {
    json.as_object().is_some_and(|m| {
        m.get("tool_name").is_some_and(Value::is_string) && m.contains_key("tool_input")
    })
}

/// A tool name as the audit may keep it: bounded, on one line.
fn kept_name(name: &str) -> String {
    one_line(&name.chars().take(MAX_TOOL_NAME).collect::<String>())
}

/// Decides a harness's pre-tool call. `tool` is the tool name, or `-` to
/// read it from stdin's `tool_name` (Claude Code's hook shape). `frozen`
/// is a freeze from outside the rule set (the kill switch); the set's own
/// freeze applies too.
pub fn hook_decide(
    rules: &RuleSet,
    actor: Option<&str>,
    tool: &str,
    stdin: &[u8],
    clock: Timestamp,
    frozen: bool,
) -> HookOutcome {
    if stdin.len() > MAX_HOOK_INPUT {
        return refuse_input(&format!(
            "stdin is {} bytes, over the limit of {MAX_HOOK_INPUT}",
            stdin.len()
        ));
    }
    let text = match std::str::from_utf8(stdin) {
        Ok(t) => t,
        Err(e) => {
            return refuse_input(&format!("stdin is not UTF-8 (at byte {})", e.valid_up_to()))
        }
    };
    let json: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return refuse_input(&format!("stdin is not JSON: {e}")),
    };
    let actor = actor.filter(|a| !a.is_empty());
    if actor.is_some_and(|a| a.chars().any(char::is_control)) {
        return refuse_input("the actor name has control characters");
    }
    let named = |mut outcome: HookOutcome, tool: Option<String>| {
        outcome.tool = tool.as_deref().map(kept_name);
        outcome
    };
    let (door, args, scope) = if tool == "-" {
        match payload_parts(json) {
            Ok(parts) => parts,
            Err(b) => return named(refuse_input(b.reason), b.tool),
        }
    } else if is_harness_payload(&json) {
        match payload_parts(json) {
            Ok((found, args, scope)) if found == tool => (found, args, scope),
            Ok((found, _, _)) => {
                return named(
                    refuse_input(&format!(
                        "--tool {} was given, but stdin is a harness payload for tool {}: pass --tool - to take the tool from the payload",
                        kept_name(tool),
                        kept_name(&found)
                    )),
                    Some(tool.to_owned()),
                )
            }
            Err(b) => return named(refuse_input(b.reason), b.tool),
        }
    } else {
        (tool.to_owned(), json, None)
    };
    if door.is_empty() || door.chars().any(char::is_control) {
        return named(
            refuse_input("the tool name is empty or has control characters"),
            Some(door),
        );
    }
    let tool_name = kept_name(&door);
    let request = Request {
        actor: actor.map(str::to_owned),
        door,
        args,
        scope,
    };
    let decision = if frozen {
        let kill = Freeze {
            authority: "kill switch".to_owned(),
            reason: "the kill switch is on".to_owned(),
            at: None,
        };
        evaluate_rules(
            rules.active(clock),
            Some(rules.freeze().unwrap_or(&kill)),
            rules.generation(),
            &request,
            clock,
        )
    } else {
        evaluate(rules, &request, clock)
    };
    named(outcome_of(decision), Some(tool_name))
}
