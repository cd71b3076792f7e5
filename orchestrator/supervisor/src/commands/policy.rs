//! `nightshift policy check`, the harness hook, bounded in time; and the
//! hook's input as `policy check` and `policy explain` read it.
//!
//! Invariants:
//! - The hook fails closed: any failure, a panic included, is a refusal
//!   (exit 2 with the reason); so is no answer within
//!   [`nightshift_core::policy::HOOK_BOUND`] (a locked or slow state): the
//!   check runs on a thread of its own and a late answer is never taken
//!   (`tests/tests/hook_host.rs::a_locked_state_gets_a_refusal_while_the_lock_is_still_held`).
//! - It never makes a state: without one it refuses, naming how to make
//!   one (the decision itself is `Api::policy_check`;
//!   `tests/tests/hook_host.rs::without_a_state_the_hook_refuses_naming_how_to_make_one_and_makes_none`).
//! - At most one byte past the hook's input limit is read: enough to know
//!   it is over.

use std::io::Read;
use std::path::PathBuf;
use std::sync::mpsc::RecvTimeoutError;

use crate::api::{Api, HookAnswer};

/// The tool call the hook is asked about (`policy check`'s flags).
#[derive(Debug, Clone)]
pub struct HookCall {
    /// Rule files to use in place of the configured ones.
    pub rules: Option<PathBuf>,
    pub actor: Option<String>,
    /// The tool (door) name; `-` takes the input's `tool_name`.
    pub tool: String,
    /// Where the arguments come from; only `-` (the input) is supported.
    pub args_json: String,
}

/// The hook's input from `input`, up to one byte past its limit.
pub fn read_hook_input(input: impl Read) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    input
        .take(policies::hook::MAX_HOOK_INPUT as u64 + 1)
        .read_to_end(&mut buf)?;
    Ok(buf)
}

/// The hook's answer to `call`, its input read from `input`: the decision,
/// or a refusal by `nightshift:hook-internal` for anything else (see the
/// module's note).
pub fn hook_check(api: &Api, call: HookCall, input: impl Read + Send + 'static) -> HookAnswer {
    let (tx, rx) = std::sync::mpsc::channel();
    let api = api.clone();
    let spawned = std::thread::Builder::new()
        .name("policy check".into())
        .spawn(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if call.args_json != "-" {
                    return Err(format!(
                        "--args-json {}: only - (stdin) is supported",
                        call.args_json
                    ));
                }
                let input = read_hook_input(input).map_err(|e| format!("reading stdin: {e}"))?;
                api.policy_check(
                    call.rules.as_deref(),
                    call.actor.as_deref(),
                    &call.tool,
                    &input,
                )
                .map_err(|e| e.message)
            }));
            let _ = tx.send(result);
        });
    if let Err(e) = spawned {
        return refusal(&format!("starting the policy check: {e}"));
    }
    match rx.recv_timeout(nightshift_core::policy::HOOK_BOUND) {
        Ok(Ok(Ok(answer))) => answer,
        Ok(Ok(Err(reason))) => refusal(&reason.replace('\n', " ")),
        Ok(Err(_)) | Err(RecvTimeoutError::Disconnected) => refusal("the policy check panicked"),
        Err(RecvTimeoutError::Timeout) => refusal(&format!(
            "no answer within {} s (the state is busy or slow): refused rather than answered late",
            nightshift_core::policy::HOOK_BOUND.as_secs()
        )),
    }
}

/// A refusal by the hook itself, saying `why`.
fn refusal(why: &str) -> HookAnswer {
    HookAnswer {
        code: policies::hook::EXIT_BLOCK,
        line: Some(format!("refused by rule nightshift:hook-internal: {why}")),
        warning: None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;

    fn api(dir: &std::path::Path) -> Api {
        Api::new(
            Arc::new(nightshift_store_sqlite::store::SqliteBackend::new(
                dir.to_path_buf(),
                None,
            )),
            None,
        )
    }

    fn call(args_json: &str) -> HookCall {
        HookCall {
            rules: None,
            actor: None,
            tool: "Bash".into(),
            args_json: args_json.into(),
        }
    }

    /// A reader that answers after `delay`, or panics.
    struct Slow {
        delay: Duration,
        panics: bool,
    }

    impl Read for Slow {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            std::thread::sleep(self.delay);
            assert!(!self.panics, "a reader that panics");
            Ok(0)
        }
    }

    #[test]
    fn the_input_is_read_to_one_byte_past_its_limit() {
        let limit = policies::hook::MAX_HOOK_INPUT;
        let input = vec![b'a'; limit + 100];
        assert_eq!(read_hook_input(&input[..]).unwrap().len(), limit + 1);
        assert_eq!(read_hook_input(&input[..10]).unwrap().len(), 10);
    }

    #[test]
    fn every_failure_is_a_refusal_by_the_hook_itself() {
        let dir = tempfile::tempdir().unwrap();
        let api = api(&dir.path().join("state"));
        let refused = |answer: HookAnswer, why: &str| {
            assert_eq!(answer.code, policies::hook::EXIT_BLOCK, "{answer:?}");
            let line = answer.line.unwrap();
            assert!(
                line.starts_with("refused by rule nightshift:hook-internal: ")
                    && line.contains(why),
                "{line}"
            );
        };
        refused(
            hook_check(&api, call("x.json"), std::io::empty()),
            "--args-json x.json: only - (stdin) is supported",
        );
        // No state: refused, and none is made.
        refused(
            hook_check(&api, call("-"), &b"{}"[..]),
            "no nightshift state at",
        );
        assert!(!dir.path().join("state").exists());
        let slow = Slow {
            delay: Duration::ZERO,
            panics: true,
        };
        refused(
            hook_check(&api, call("-"), slow),
            "the policy check panicked",
        );
    }

    /// An answer later than the bound is never taken: the hook refuses at
    /// the bound.
    #[test]
    fn no_answer_within_the_bound_is_a_refusal_at_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let api = api(&dir.path().join("state"));
        let bound = nightshift_core::policy::HOOK_BOUND;
        let slow = Slow {
            delay: bound + Duration::from_secs(5),
            panics: false,
        };
        let started = Instant::now();
        let answer = hook_check(&api, call("-"), slow);
        let took = started.elapsed();
        assert_eq!(answer.code, policies::hook::EXIT_BLOCK);
        assert!(
            answer.line.as_deref().unwrap().contains(&format!(
                "no answer within {} s (the state is busy or slow)",
                bound.as_secs()
            )),
            "{answer:?}"
        );
        assert!(
            took >= bound && took < bound + Duration::from_secs(1),
            "{took:?}"
        );
    }
}
