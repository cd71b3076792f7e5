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
//! `nightshift:hook-input`), which no declared rule can have.
//!
//! Two input shapes: with a tool name given (`--tool Bash`), stdin is the
//! tool's arguments as any JSON value; with `--tool -`, stdin is the object
//! Claude Code's `PreToolUse` hook sends: the tool name is its `tool_name`,
//! the arguments its `tool_input`, and the scope its `cwd` when present.
//! An empty actor (an unset `$AGENT`) counts as no actor.

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
}

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
    }
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
    let (door, args, scope) = if tool == "-" {
        let Value::Object(mut map) = json else {
            return refuse_input(
                "with --tool -, stdin must be an object with tool_name and tool_input",
            );
        };
        let door = match map.remove("tool_name") {
            Some(Value::String(s)) => s,
            _ => return refuse_input("with --tool -, stdin must have a string tool_name"),
        };
        let Some(args) = map.remove("tool_input") else {
            return refuse_input("with --tool -, stdin must have tool_input");
        };
        let scope = match map.remove("cwd") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s),
            Some(_) => return refuse_input("cwd in stdin must be a string"),
        };
        (door, args, scope)
    } else {
        (tool.to_owned(), json, None)
    };
    if door.is_empty() || door.chars().any(char::is_control) {
        return refuse_input("the tool name is empty or has control characters");
    }
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
    outcome_of(decision)
}
