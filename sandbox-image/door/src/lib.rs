//! The door: the one way a run asks for anything outside its sandbox.
//!
//! Each sandbox sees a Unix socket in a read-only mount
//! (`/run/nightshift/door.sock`; `orchestrator/attest/tests/fixtures.rs::writable_door_fails_mounts`) and two static clients beside it
//! (`tests/tests/install.rs::door_clients_are_written_static_and_read_only_or_the_door_refuses`):
//! `nightshift-act` (push, pull request, notify, ask, and `policy-check`,
//! a harness's pre-tool hook asking the run's rules) and
//! `git-remote-nightshift` (so that `git push` to a `nightshift::ALIAS`
//! remote becomes push acts). This crate is both sides' protocol and the
//! clients; the supervisor serves the socket.
//!
//! Wire format (version 3; `PROTOCOL.md` beside this crate has it in full):
//! one request per connection, then one response; each is a frame, a 4-byte
//! big-endian length then that many bytes of JSON,
//! `{"v":3,"request":{"door":"push",...,"pack_bytes":N}}` (then N bytes of
//! git pack) / `{"v":3,"response":{"verdict":"queued","act":"..."}}`.
//!
//! Invariants:
//! - [`frame`], [`message`], [`validate`], [`cli`], [`hook`] and [`remote_helper`] are
//!   pure: no I/O, no clock, no panic on any input. Only [`client`],
//!   [`local_git`] and the binaries touch sockets, files, processes and the
//!   environment (`tests::the_pure_modules_name_no_io_and_no_clock`; no
//!   panic: `frame::tests::decoding_random_bytes_never_panics_and_stays_within_the_limit`,
//!   `message::tests::random_bytes_never_panic_the_decoders`,
//!   `validate::tests::validators_never_panic`,
//!   `cli::tests::any_arguments_parse_or_say_why`,
//!   `hook::tests::any_stdin_gives_a_request_or_a_refusal_never_a_panic`,
//!   `remote_helper::tests::any_line_parses_or_is_refused`).
//! - Limits are checked before allocation: a request frame is at most
//!   [`MAX_REQUEST_FRAME`] bytes of JSON, a response at most
//!   [`MAX_RESPONSE_FRAME`], and a length prefix over the limit is refused
//!   from the 4-byte header alone; a pack is at most [`MAX_PACK_BYTES`],
//!   refused from the request that declares it.
//! - A request that decodes has passed validation: destinations are aliases
//!   (never URLs or paths), refs are full `refs/heads/` branch refs that
//!   pass git's rules, commit ids are full hex ids, text is bounded
//!   (`message::tests::random_json_bodies_never_panic_and_never_pass_invalid`).
//! - Every answer prints as exactly one line ([`Response::line`]) with a
//!   documented exit code ([`Response::exit_code`]).

#![forbid(unsafe_code)]

pub mod cli;
pub mod client;
pub mod frame;
pub mod hook;
pub mod lease;
pub mod local_git;
pub mod message;
pub mod remote_helper;
pub mod validate;

pub use frame::{decode_frame, encode_frame, frame_len, FrameError, HEADER_LEN};
pub use message::{
    decode_request, decode_response, encode_request, encode_response, parse_request,
    parse_response, ProtocolError, ReportedDrop, ReportedSkip, Request, RequestReader, Response,
    EXIT_ERROR, EXIT_OK, EXIT_REFUSED, EXIT_USAGE, MAX_PACK_BYTES, MAX_REPORTED_PATH,
    MAX_REPORTED_TEXT, MAX_REQUEST_FRAME, MAX_RESPONSE_FRAME, MAX_RESULT_SKIPS, PROTOCOL_VERSION,
};
pub use validate::ValidationError;

#[cfg(test)]
mod tests {
    /// Reads the pure modules' code (before their tests, comments left
    /// out): none names a socket, a file, a process, the environment, a
    /// thread or a clock.
    #[test]
    fn the_pure_modules_name_no_io_and_no_clock() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for module in [
            "frame",
            "message",
            "validate",
            "cli",
            "hook",
            "remote_helper",
            "lease",
        ] {
            let text = std::fs::read_to_string(src.join(format!("{module}.rs"))).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap();
            for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
                for word in [
                    "std::fs",
                    "std::net",
                    "std::os",
                    "std::process",
                    "std::env",
                    "std::io",
                    "std::thread",
                    "Instant",
                    "SystemTime",
                    "File::",
                    "OpenOptions",
                    "Command::new",
                    "stdin()",
                    "stdout()",
                    "stderr()",
                ] {
                    assert!(!line.contains(word), "{module}.rs names {word}: {line}");
                }
            }
        }
    }
}
