//! `nightshift-act policy-check`: a harness's pre-tool hook inside the
//! sandbox, asking the run's rules through the door.
//!
//! Invariants:
//! - Pure: bytes in, a request or a refusal out; an answer in, an exit code
//!   and one stderr line out.
//! - Fail closed: only the door's `done` (the rules allow the call) exits
//!   0, printing nothing. A refusal, an ask, the door's error, a door that is
//!   unreachable or silent, an answer that breaks the protocol, input over
//!   [`MAX_STDIN`], not UTF-8, not a JSON object, or a payload over the
//!   protocol's limit: each exits [`EXIT_BLOCK`] (2, what pre-tool hooks
//!   treat as "block the call and show stderr to the agent") with the
//!   reason on one line. A harness treats other non-zero codes as a
//!   non-blocking error and runs the tool, so no path here exits with one
//!   (`tests::only_done_allows`, `tests::no_answer_but_done_exits_0`,
//!   `tests::bad_input_is_refused_before_anything_is_sent`,
//!   `tests::any_stdin_gives_a_request_or_a_refusal_never_a_panic`).

use crate::message::{Request, Response};
use crate::validate::one_line;

/// Exit code for an allowed call.
pub const EXIT_ALLOW: i32 = 0;
/// Exit code for a blocked call (refused, asks, or any failure).
pub const EXIT_BLOCK: i32 = 2;
/// Most bytes of stdin read (one more tells that it is over).
pub const MAX_STDIN: usize = 1 << 20;
/// The id named when the input itself is refused (as on the host).
pub const INPUT_ID: &str = "nightshift:hook-input";
/// The id named when the door could not answer.
pub const DOOR_ID: &str = "nightshift:door";
/// Longest line printed.
const MAX_LINE: usize = 2048;

/// The request for the hook's stdin, or the line refusing it.
pub fn request(stdin: &[u8]) -> Result<Request, String> {
    let refuse = |why: &str| format!("refused by rule {INPUT_ID}: {}", one_line(why, MAX_LINE));
    if stdin.len() > MAX_STDIN {
        return Err(refuse(&format!(
            "stdin is over the limit of {MAX_STDIN} bytes"
        )));
    }
    let text = std::str::from_utf8(stdin)
        .map_err(|e| refuse(&format!("stdin is not UTF-8 (at byte {})", e.valid_up_to())))?;
    let payload: serde_json::Value =
        serde_json::from_str(text).map_err(|e| refuse(&format!("stdin is not JSON: {e}")))?;
    let request = Request::PolicyCheck { payload };
    request
        .validate()
        .map_err(|e| refuse(&format!("the hook input {e}")))?;
    Ok(request)
}

/// The exit code and the stderr line (none on allow) for the door's
/// answer, or for the reason the door could not be asked.
pub fn answer(result: Result<Response, String>) -> (i32, Option<String>) {
    let line = |s: String| Some(one_line(&s, MAX_LINE));
    match result {
        Ok(Response::Done { .. }) => (EXIT_ALLOW, None),
        Ok(r @ (Response::Refused { .. } | Response::Asks { .. })) => (EXIT_BLOCK, line(r.line())),
        Ok(Response::Error { reason }) => (
            EXIT_BLOCK,
            line(format!(
                "refused by rule {DOOR_ID}: the door answered: {reason}"
            )),
        ),
        Ok(Response::Queued { act }) => (
            EXIT_BLOCK,
            line(format!(
                "refused by rule {DOOR_ID}: the door queued act {act} for a tool call"
            )),
        ),
        Err(reason) => (
            EXIT_BLOCK,
            line(format!("refused by rule {DOOR_ID}: {reason}")),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn only_done_allows() {
        assert_eq!(
            answer(Ok(Response::Done {
                detail: String::new()
            })),
            (0, None)
        );
        let blocked = [
            Ok(Response::Refused {
                rule: "no-rm".into(),
                reason: "no recursive deletes".into(),
            }),
            Ok(Response::Asks {
                rule: "ask-edit".into(),
                reason: "a person approves".into(),
            }),
            Ok(Response::Error {
                reason: "frozen".into(),
            }),
            Ok(Response::Queued { act: "a1".into() }),
            Err("door unreachable at /run/nightshift/door.sock".into()),
        ];
        let lines: Vec<_> = blocked.into_iter().map(answer).collect();
        for (code, line) in &lines {
            assert_eq!(*code, EXIT_BLOCK);
            assert!(line.as_deref().is_some_and(|l| !l.contains('\n')));
        }
        assert_eq!(
            lines[0].1.as_deref(),
            Some("refused by rule no-rm: no recursive deletes")
        );
        assert_eq!(
            lines[1].1.as_deref(),
            Some("asks a person: a person approves")
        );
        assert!(lines[4]
            .1
            .as_deref()
            .unwrap()
            .starts_with("refused by rule nightshift:door: door unreachable"));
    }

    #[test]
    fn bad_input_is_refused_before_anything_is_sent() {
        for (input, why) in [
            (&b"not json"[..], "not JSON"),
            (&b"\xff\xfe"[..], "not UTF-8"),
            (&b"[1,2]"[..], "JSON object"),
            (&b""[..], "not JSON"),
        ] {
            let err = request(input).unwrap_err();
            assert!(
                err.starts_with("refused by rule nightshift:hook-input: "),
                "{err}"
            );
            assert!(err.contains(why), "{why}: {err}");
        }
        let big = vec![b' '; MAX_STDIN + 1];
        assert!(request(&big).unwrap_err().contains("over the limit"));
        let ok = br#"{"tool_name":"Bash","tool_input":{"command":"ls"}}"#;
        assert_eq!(request(ok).unwrap().door(), "policy_check");
    }

    proptest! {
        #[test]
        fn any_stdin_gives_a_request_or_a_refusal_never_a_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..512)
        ) {
            let _ = request(&bytes);
        }

        #[test]
        fn no_answer_but_done_exits_0(reason in ".{0,300}", ok in any::<bool>()) {
            let (code, line) = answer(if ok { Err(reason) } else { Ok(Response::Error { reason }) });
            prop_assert_eq!(code, EXIT_BLOCK);
            prop_assert!(line.is_some_and(|l| !l.contains('\n')));
        }
    }
}
