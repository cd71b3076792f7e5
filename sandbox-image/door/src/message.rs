//! Requests and responses, their JSON envelopes, and the server-side reader.
//!
//! Invariants:
//! - Pure: bytes in, values or errors out. No I/O, no clock.
//! - Every envelope carries `"v": 3`; a different or missing version is
//!   refused with an error that names both versions, before the body is
//!   read strictly. Every struct refuses unknown fields.
//! - A decoded [`Request`] has passed [`Request::validate`]: the door never
//!   sees a URL where an alias belongs, a ref outside `refs/heads/`, a
//!   commit id that is not one, a pack declared over [`MAX_PACK_BYTES`]
//!   (refused from the request alone, before a byte of it is read), a
//!   deletion that carries a commit or a pack, or text over its limit. [`encode_request`]
//!   validates too, so our clients never send what the door would refuse
//!   for its shape (`tests::malformed_requests_are_refused_with_a_reason`,
//!   `tests::random_json_bodies_never_panic_and_never_pass_invalid`).
//! - Every valid request encodes within [`MAX_REQUEST_FRAME`] (JSON at most
//!   doubles a body: `"`, `\`, tab, LF and CR escape to two bytes, other
//!   control characters are refused), and [`encode_response`] never fails:
//!   it bounds and flattens each text field so the frame fits in
//!   [`MAX_RESPONSE_FRAME`] (`tests::the_largest_valid_request_fits`,
//!   `tests::a_hostile_response_prints_as_one_bounded_line`).
//! - One request per connection: [`RequestReader`] never buffers more than
//!   one frame, and anything sent after it is refused as out of order. The
//!   pack a request declares follows the frame; the reader never takes any
//!   of it (the door reads exactly `pack_bytes` more, see `PROTOCOL.md`)
//!   (`tests::the_reader_never_buffers_past_the_limit`,
//!   `tests::the_reader_refuses_a_second_request_and_trailing_bytes`,
//!   `tests::reading_what_the_reader_wants_never_takes_the_next_request`).

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::frame::{decode_frame, encode_frame, frame_len, FrameError, HEADER_LEN};
use crate::validate::{
    check_alias, check_body, check_branch_ref, check_commit, check_hook_payload, check_line,
    check_not_zero, check_pack_bytes, check_push_shape, check_title, one_line, ValidationError,
};

/// The protocol version this crate speaks. Version 2 carried a pack of the
/// objects a push or pull request needs after the request frame, and
/// `force` / `delete` on a push; version 3 (this one) adds the
/// `policy_check` request (a harness's pre-tool hook asking the run's
/// rules) and its `asks` answer. Requests of other versions are refused by
/// name.
pub const PROTOCOL_VERSION: u64 = 3;
/// Largest request body (the JSON), in bytes.
pub const MAX_REQUEST_FRAME: usize = 512 * 1024;
/// Largest response body (the JSON), in bytes.
pub const MAX_RESPONSE_FRAME: usize = 16 * 1024;
/// Longest text field of a response once bounded by [`encode_response`].
pub const MAX_RESPONSE_TEXT: usize = 2048;
pub use crate::validate::MAX_PACK_BYTES;

/// An act a run asks for. Routing fields are aliases and full branch refs;
/// content is carried inline (bodies) or as a commit id whose objects follow
/// the request frame as a pack of `pack_bytes` bytes (see `PROTOCOL.md`):
/// the supervisor never reads the run's `.git` to find them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "door", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Push a commit to a branch of a configured remote.
    Push {
        /// The remote's alias.
        remote: String,
        /// The branch to update, `refs/heads/...`.
        dst_ref: String,
        /// The commit pushed, resolved in the sandbox; all zeros (and only
        /// then) for a deletion.
        claimed_commit: String,
        /// git's `+`: the push may rewind the branch.
        force: bool,
        /// The branch is to be deleted (no commit, no pack).
        delete: bool,
        /// Bytes of pack that follow the request frame.
        pack_bytes: u64,
    },
    /// Open a pull request on a configured remote's forge.
    PullRequest {
        /// The remote's alias.
        remote: String,
        /// The branch to merge into, `refs/heads/...`.
        base: String,
        /// The branch proposed, `refs/heads/...`.
        head: String,
        /// The commit the head branch holds, resolved in the sandbox: the
        /// pull request is bound to it.
        head_commit: String,
        /// Bytes of pack that follow the request frame.
        pack_bytes: u64,
        /// One line.
        title: String,
        /// The description.
        body: String,
    },
    /// Post a message to a configured endpoint.
    Notify {
        /// The endpoint's alias.
        destination: String,
        /// The message.
        body: String,
    },
    /// Ask a person a question for the morning; the run goes on.
    Ask {
        /// The question.
        body: String,
    },
    /// A harness's pre-tool hook asks whether a tool call may go ahead: a
    /// question, not an act. The payload is the hook's input as the harness
    /// sent it (Claude Code's: an object with `tool_name`, `tool_input` and
    /// `cwd`); the supervisor decides it under the run's rules and answers
    /// `done` (allowed), `refused` or `asks`.
    PolicyCheck {
        /// The harness's hook payload.
        payload: serde_json::Value,
    },
    /// The run's result, sent once by the end-of-run packer
    /// (`nightshift-result`, in a sandbox of its own started after the
    /// agent's exited): the run's work as an import would make it, its
    /// objects in the pack that follows. Only a door in its result phase
    /// takes it; an agent's door refuses it.
    Result {
        /// What `refs/nightshift/runs/<run>` is to point at.
        result_commit: String,
        /// The agent's tip (the base when its history was dropped).
        agent_tip: String,
        /// The observed-state commit, when the working files differed
        /// from the tip: then it is the result, with the tip its parent.
        observed_commit: Option<String>,
        /// Where the tip was read from (one line).
        tip_source: String,
        /// Working files left out of the observed state (at most
        /// [`MAX_RESULT_SKIPS`], each path at most [`MAX_REPORTED_PATH`] bytes).
        skipped: Vec<ReportedSkip>,
        /// All of them (`skipped` lists at most [`MAX_RESULT_SKIPS`]).
        skipped_total: u64,
        /// Untracked paths `.gitignore` left out.
        ignored: u64,
        /// Why the agent's commits were left out, when they were.
        history_dropped: Option<ReportedDrop>,
        /// Bytes of pack that follow the request frame.
        pack_bytes: u64,
    },
}

/// At most this many skipped paths are listed in a [`Request::Result`].
pub const MAX_RESULT_SKIPS: usize = 100;
/// Longest reported reason, in bytes (one line, no control characters).
pub const MAX_REPORTED_TEXT: usize = 512;
/// Longest reported path, in bytes. A path is the agent's file name, any
/// character at all: it travels as JSON data (a control character escaped
/// as `\u00XX`, six bytes) and is shown escaped wherever a person reads it.
pub const MAX_REPORTED_PATH: usize = 256;

/// A working file a result left out (its name as it is), and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportedSkip {
    /// The path, relative to the worktree.
    pub path: String,
    /// Why.
    pub why: String,
}

/// Why a result's history was dropped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportedDrop {
    /// A stable word (`object_too_large`, `missing_object`, ...).
    pub kind: String,
    /// The object concerned, when there is one.
    pub object: Option<String>,
    /// Its size, when the reason is a limit.
    pub size: Option<u64>,
    /// The limit, when the reason is one.
    pub limit: Option<u64>,
    /// The reason in words.
    pub why: String,
}

impl Request {
    /// The door's name, as `deferred_queue::Door::name` spells it.
    pub fn door(&self) -> &'static str {
        match self {
            Request::Push { .. } => "push",
            Request::PullRequest { .. } => "pull_request",
            Request::Notify { .. } => "notify",
            Request::Ask { .. } => "ask",
            Request::PolicyCheck { .. } => "policy_check",
            Request::Result { .. } => "result",
        }
    }

    /// Bytes of pack that follow this request's frame on the connection.
    pub fn pack_bytes(&self) -> u64 {
        match self {
            Request::Push { pack_bytes, .. }
            | Request::PullRequest { pack_bytes, .. }
            | Request::Result { pack_bytes, .. } => *pack_bytes,
            Request::Notify { .. } | Request::Ask { .. } | Request::PolicyCheck { .. } => 0,
        }
    }

    /// Checks every field (see [`crate::validate`]).
    pub fn validate(&self) -> Result<(), ValidationError> {
        match self {
            Request::Push {
                remote,
                dst_ref,
                claimed_commit,
                force: _,
                delete,
                pack_bytes,
            } => {
                check_alias("remote", remote)?;
                check_branch_ref("dst_ref", dst_ref)?;
                check_commit("claimed_commit", claimed_commit)?;
                check_pack_bytes("pack_bytes", *pack_bytes)?;
                check_push_shape(claimed_commit, *delete, *pack_bytes)
            }
            Request::PullRequest {
                remote,
                base,
                head,
                head_commit,
                pack_bytes,
                title,
                body,
            } => {
                check_alias("remote", remote)?;
                check_branch_ref("base", base)?;
                check_branch_ref("head", head)?;
                check_commit("head_commit", head_commit)?;
                check_not_zero("head_commit", head_commit)?;
                check_pack_bytes("pack_bytes", *pack_bytes)?;
                check_title("title", title)?;
                check_body("body", body)
            }
            Request::Notify { destination, body } => {
                check_alias("destination", destination)?;
                check_body("body", body)
            }
            Request::Ask { body } => check_body("body", body),
            Request::PolicyCheck { payload } => check_hook_payload("payload", payload),
            Request::Result {
                result_commit,
                agent_tip,
                observed_commit,
                tip_source,
                skipped,
                skipped_total,
                ignored: _,
                history_dropped,
                pack_bytes,
            } => {
                check_commit("result_commit", result_commit)?;
                check_not_zero("result_commit", result_commit)?;
                check_commit("agent_tip", agent_tip)?;
                check_not_zero("agent_tip", agent_tip)?;
                if let Some(observed) = observed_commit {
                    check_commit("observed_commit", observed)?;
                }
                check_line("tip_source", tip_source, MAX_REPORTED_TEXT)?;
                if skipped.len() > MAX_RESULT_SKIPS {
                    return Err(ValidationError::BadText {
                        field: "skipped",
                        why: format!(
                            "lists {} paths, over the limit of {MAX_RESULT_SKIPS}",
                            skipped.len()
                        ),
                    });
                }
                if (skipped.len() as u64) > *skipped_total {
                    return Err(ValidationError::BadText {
                        field: "skipped_total",
                        why: "is less than the paths listed".into(),
                    });
                }
                for skip in skipped {
                    if skip.path.len() > MAX_REPORTED_PATH {
                        return Err(ValidationError::BadText {
                            field: "skipped.path",
                            why: format!(
                                "is {} bytes, over the limit of {MAX_REPORTED_PATH}",
                                skip.path.len()
                            ),
                        });
                    }
                    check_line("skipped.why", &skip.why, MAX_REPORTED_TEXT)?;
                }
                if let Some(drop) = history_dropped {
                    if drop.kind.is_empty()
                        || drop.kind.len() > 64
                        || !drop
                            .kind
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b == b'_')
                    {
                        return Err(ValidationError::BadText {
                            field: "history_dropped.kind",
                            why: "is 1 to 64 of a-z and _".into(),
                        });
                    }
                    if let Some(object) = &drop.object {
                        check_commit("history_dropped.object", object)?;
                    }
                    check_line("history_dropped.why", &drop.why, MAX_REPORTED_TEXT)?;
                }
                check_pack_bytes("pack_bytes", *pack_bytes)
            }
        }
    }
}

/// The door's answer, given at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case", deny_unknown_fields)]
pub enum Response {
    /// A rule refused the act.
    Refused {
        /// The deciding rule's id.
        rule: String,
        /// The rule's reason.
        reason: String,
    },
    /// The act waits for a person.
    Queued {
        /// The act's id.
        act: String,
    },
    /// A policy check's call waits for a person's approval: the harness
    /// blocks it (answered only to `policy_check`).
    Asks {
        /// The deciding rule's id.
        rule: String,
        /// The rule's reason.
        reason: String,
    },
    /// The act was carried out (a rule allowed it).
    Done {
        /// What was done; may be empty.
        detail: String,
    },
    /// The request could not be taken (malformed, oversized, out of order,
    /// or the door's own trouble).
    Error {
        /// Why.
        reason: String,
    },
}

/// Exit code of a client when the act was queued or done.
pub const EXIT_OK: i32 = 0;
/// Exit code of a client for a usage mistake (nothing was sent).
pub const EXIT_USAGE: i32 = 2;
/// Exit code of a client when a rule refused the act.
pub const EXIT_REFUSED: i32 = 3;
/// Exit code of a client for an error: invalid request, protocol error,
/// door unreachable, or the door's error reply.
pub const EXIT_ERROR: i32 = 4;

impl Response {
    /// Exactly the one line a client prints for this answer.
    pub fn line(&self) -> String {
        let t = |s: &str| one_line(s, MAX_RESPONSE_TEXT);
        match self {
            Response::Refused { rule, reason } => {
                format!("refused by rule {}: {}", t(rule), t(reason))
            }
            Response::Queued { act } => format!("queued as act {} for approval", t(act)),
            Response::Asks { reason, .. } => format!("asks a person: {}", t(reason)),
            Response::Done { detail } if detail.is_empty() => "done".to_string(),
            Response::Done { detail } => format!("done: {}", t(detail)),
            Response::Error { reason } => format!("error: {}", t(reason)),
        }
    }

    /// The exit code a client ends with for this answer.
    pub fn exit_code(&self) -> i32 {
        match self {
            Response::Queued { .. } | Response::Done { .. } => EXIT_OK,
            Response::Refused { .. } | Response::Asks { .. } => EXIT_REFUSED,
            Response::Error { .. } => EXIT_ERROR,
        }
    }

    /// The error reply for a request that could not be taken.
    pub fn for_error(err: &ProtocolError) -> Response {
        Response::Error {
            reason: err.to_string(),
        }
    }

    /// Each text field bounded and flattened to one line.
    fn bounded(&self) -> Response {
        let t = |s: &str| one_line(s, MAX_RESPONSE_TEXT);
        match self {
            Response::Refused { rule, reason } => Response::Refused {
                rule: t(rule),
                reason: t(reason),
            },
            Response::Queued { act } => Response::Queued { act: t(act) },
            Response::Asks { rule, reason } => Response::Asks {
                rule: t(rule),
                reason: t(reason),
            },
            Response::Done { detail } => Response::Done { detail: t(detail) },
            Response::Error { reason } => Response::Error { reason: t(reason) },
        }
    }
}

/// A message that cannot be taken.
#[derive(Debug, Error)]
pub enum ProtocolError {
    /// The frame is bad (oversized).
    #[error("{what}: {source}")]
    Frame {
        /// `request` or `response`.
        what: &'static str,
        /// The framing problem.
        #[source]
        source: FrameError,
    },
    /// The body is not the JSON this version expects.
    #[error("{what} is malformed: {source}")]
    Json {
        /// `request` or `response`.
        what: &'static str,
        /// The parser's complaint.
        #[source]
        source: serde_json::Error,
    },
    /// The envelope has no version.
    #[error("{what} has no protocol version field \"v\" (this side speaks {PROTOCOL_VERSION})")]
    MissingVersion {
        /// `request` or `response`.
        what: &'static str,
    },
    /// The envelope's version is not ours.
    #[error("{what} speaks protocol version {found}; this side speaks {PROTOCOL_VERSION}")]
    Version {
        /// `request` or `response`.
        what: &'static str,
        /// The version it carries.
        found: u64,
    },
    /// A field does not pass validation.
    #[error("invalid request: {source}")]
    Invalid {
        /// The field's problem.
        #[source]
        source: ValidationError,
    },
    /// A response that names nothing.
    #[error("response {field} is empty")]
    EmptyResponse {
        /// The empty field.
        field: &'static str,
    },
    /// Bytes after the one request of a connection.
    #[error("{extra} bytes after the request: one request per connection, then read the answer")]
    OutOfOrder {
        /// How many bytes (at least) came after the frame.
        extra: usize,
    },
    /// The connection closed before a whole frame arrived.
    #[error("{what} cut short: the connection closed after {have} of {need} bytes")]
    Truncated {
        /// `request` or `response`.
        what: &'static str,
        /// Bytes received.
        have: usize,
        /// Bytes needed (header, then header and body).
        need: usize,
    },
}

impl ProtocolError {
    /// A fixed code for the error, safe to record and show (the message
    /// may quote what the peer sent; the code never does).
    pub fn code(&self) -> &'static str {
        match self {
            ProtocolError::Frame { .. } => "oversized",
            ProtocolError::Json { .. } => "malformed_json",
            ProtocolError::MissingVersion { .. } => "no_version",
            ProtocolError::Version { .. } => "wrong_version",
            ProtocolError::Invalid { .. } => "invalid_field",
            ProtocolError::EmptyResponse { .. } => "empty_response",
            ProtocolError::OutOfOrder { .. } => "out_of_order",
            ProtocolError::Truncated { .. } => "truncated",
        }
    }
}

impl From<ValidationError> for ProtocolError {
    fn from(source: ValidationError) -> Self {
        ProtocolError::Invalid { source }
    }
}

#[derive(Deserialize)]
struct VersionProbe {
    v: Option<u64>,
}

#[derive(Serialize)]
#[serde(deny_unknown_fields)]
struct RequestOut<'a> {
    v: u64,
    request: &'a Request,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestIn {
    #[allow(dead_code)] // checked by the probe; present so it is not unknown
    v: u64,
    request: Request,
}

#[derive(Serialize)]
#[serde(deny_unknown_fields)]
struct ResponseOut<'a> {
    v: u64,
    response: &'a Response,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResponseIn {
    #[allow(dead_code)] // checked by the probe; present so it is not unknown
    v: u64,
    response: Response,
}

fn check_version(what: &'static str, body: &[u8]) -> Result<(), ProtocolError> {
    let probe: VersionProbe =
        serde_json::from_slice(body).map_err(|source| ProtocolError::Json { what, source })?;
    match probe.v {
        None => Err(ProtocolError::MissingVersion { what }),
        Some(PROTOCOL_VERSION) => Ok(()),
        Some(found) => Err(ProtocolError::Version { what, found }),
    }
}

/// Parses and validates a request's body (the JSON inside the frame).
pub fn parse_request(body: &[u8]) -> Result<Request, ProtocolError> {
    let what = "request";
    check_version(what, body)?;
    let envelope: RequestIn =
        serde_json::from_slice(body).map_err(|source| ProtocolError::Json { what, source })?;
    envelope.request.validate()?;
    Ok(envelope.request)
}

/// Parses a response's body (the JSON inside the frame).
pub fn parse_response(body: &[u8]) -> Result<Response, ProtocolError> {
    let what = "response";
    check_version(what, body)?;
    let envelope: ResponseIn =
        serde_json::from_slice(body).map_err(|source| ProtocolError::Json { what, source })?;
    match &envelope.response {
        Response::Refused { rule, .. } | Response::Asks { rule, .. } if rule.is_empty() => {
            Err(ProtocolError::EmptyResponse { field: "rule" })
        }
        Response::Queued { act } if act.is_empty() => {
            Err(ProtocolError::EmptyResponse { field: "act" })
        }
        _ => Ok(envelope.response),
    }
}

/// Decodes one request frame from the front of `buf`: `Ok(None)` while it
/// is incomplete; otherwise the request and the bytes it took.
pub fn decode_request(buf: &[u8]) -> Result<Option<(Request, usize)>, ProtocolError> {
    let what = "request";
    match decode_frame(buf, MAX_REQUEST_FRAME)
        .map_err(|source| ProtocolError::Frame { what, source })?
    {
        None => Ok(None),
        Some((body, used)) => Ok(Some((parse_request(body)?, used))),
    }
}

/// Decodes one response frame from the front of `buf`.
pub fn decode_response(buf: &[u8]) -> Result<Option<(Response, usize)>, ProtocolError> {
    let what = "response";
    match decode_frame(buf, MAX_RESPONSE_FRAME)
        .map_err(|source| ProtocolError::Frame { what, source })?
    {
        None => Ok(None),
        Some((body, used)) => Ok(Some((parse_response(body)?, used))),
    }
}

/// Validates and frames a request.
pub fn encode_request(request: &Request) -> Result<Vec<u8>, ProtocolError> {
    request.validate()?;
    let body = serde_json::to_vec(&RequestOut {
        v: PROTOCOL_VERSION,
        request,
    })
    .map_err(|source| ProtocolError::Json {
        what: "request",
        source,
    })?;
    encode_frame(&body, MAX_REQUEST_FRAME).map_err(|source| ProtocolError::Frame {
        what: "request",
        source,
    })
}

/// Frames a response, each text field bounded to [`MAX_RESPONSE_TEXT`]
/// bytes on one line, so that it always fits.
pub fn encode_response(response: &Response) -> Vec<u8> {
    let bounded = response.bounded();
    let body = serde_json::to_vec(&ResponseOut {
        v: PROTOCOL_VERSION,
        response: &bounded,
    })
    .unwrap_or_default();
    // The bounds above keep the body far below the limit (two fields of at
    // most 2 KiB, each at most doubled by escaping); the fallback is only
    // there so that no input can make this panic.
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// The door's side of one connection: fed what arrives, it yields the one
/// request or the reason to refuse, never buffering more than one frame.
#[derive(Debug, Default)]
pub struct RequestReader {
    buf: Vec<u8>,
    /// Header plus body, once the header is in and checked.
    frame_len: Option<usize>,
    done: bool,
}

impl RequestReader {
    /// A reader that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// At most how many more bytes to read: the adapter reads no more than
    /// this, so it never takes bytes past the frame. 0 once a request has
    /// been returned.
    pub fn wanted(&self) -> usize {
        if self.done {
            return 0;
        }
        match self.frame_len {
            Some(total) => total - self.buf.len(),
            None => HEADER_LEN - self.buf.len(),
        }
    }

    /// Takes `bytes` that arrived. `Ok(Some(request))` once the frame is
    /// whole; an error for an oversized, malformed or invalid request, or
    /// for bytes past the frame (out of order).
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<Option<Request>, ProtocolError> {
        if self.done {
            return if bytes.is_empty() {
                Ok(None)
            } else {
                Err(ProtocolError::OutOfOrder { extra: bytes.len() })
            };
        }
        if self.frame_len.is_none() {
            let take = bytes.len().min(HEADER_LEN - self.buf.len());
            self.buf.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            let Some(header) = self.buf.first_chunk::<HEADER_LEN>() else {
                return Ok(None);
            };
            let len =
                frame_len(*header, MAX_REQUEST_FRAME).map_err(|source| ProtocolError::Frame {
                    what: "request",
                    source,
                })?;
            self.frame_len = Some(HEADER_LEN + len);
        }
        let wanted = self.wanted();
        if bytes.len() > wanted {
            return Err(ProtocolError::OutOfOrder {
                extra: bytes.len() - wanted,
            });
        }
        self.buf.extend_from_slice(bytes);
        match decode_request(&self.buf)? {
            None => Ok(None),
            Some((request, _)) => {
                self.done = true;
                self.buf = Vec::new();
                Ok(Some(request))
            }
        }
    }

    /// The error for a connection that closed now.
    pub fn closed(&self) -> ProtocolError {
        ProtocolError::Truncated {
            what: "request",
            have: self.buf.len(),
            need: self.frame_len.unwrap_or(HEADER_LEN),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::MAX_BODY;
    use proptest::prelude::*;

    fn commit() -> String {
        "0123456789abcdef0123456789abcdef01234567".into()
    }

    fn every_request() -> Vec<Request> {
        vec![
            Request::Push {
                remote: "origin".into(),
                dst_ref: "refs/heads/agent/x".into(),
                claimed_commit: commit(),
                force: false,
                delete: false,
                pack_bytes: 1234,
            },
            Request::PullRequest {
                remote: "origin".into(),
                base: "refs/heads/main".into(),
                head: "refs/heads/agent/x".into(),
                head_commit: commit(),
                pack_bytes: 0,
                title: "Fix \"the\" test ✓".into(),
                body: "Line\n\tmore \\ \"quoted\"\r\n".into(),
            },
            Request::Notify {
                destination: "team-chat".into(),
                body: "build is green".into(),
            },
            Request::Ask {
                body: "May I bump the MSRV?".into(),
            },
            Request::PolicyCheck {
                payload: serde_json::json!({
                    "hook_event_name": "PreToolUse", "cwd": "/workspace",
                    "tool_name": "Bash", "tool_input": {"command": "rm -rf \u{1b}x"}
                }),
            },
            Request::Result {
                result_commit: commit(),
                agent_tip: commit(),
                observed_commit: None,
                tip_source: "run_branch".into(),
                skipped: vec![ReportedSkip {
                    path: "big.bin".into(),
                    why: "TooLarge { size: 1, limit: 0 }".into(),
                }],
                skipped_total: 3,
                ignored: 1,
                history_dropped: None,
                pack_bytes: 12,
            },
        ]
    }

    fn every_response() -> Vec<Response> {
        vec![
            Response::Refused {
                rule: "r-12".into(),
                reason: "pushes to main need a person".into(),
            },
            Response::Queued {
                act: "01J0ACT".into(),
            },
            Response::Done {
                detail: String::new(),
            },
            Response::Done {
                detail: "pushed".into(),
            },
            Response::Error {
                reason: "frozen".into(),
            },
            Response::Asks {
                rule: "ask-before-edit".into(),
                reason: "a person approves edits".into(),
            },
        ]
    }

    #[test]
    fn every_request_round_trips() {
        for request in every_request() {
            let framed = encode_request(&request).unwrap();
            assert_eq!(
                decode_request(&framed).unwrap(),
                Some((request.clone(), framed.len()))
            );
        }
    }

    #[test]
    fn every_response_round_trips() {
        for response in every_response() {
            let framed = encode_response(&response);
            assert_eq!(
                decode_response(&framed).unwrap(),
                Some((response.clone(), framed.len()))
            );
        }
    }

    #[test]
    fn the_wire_format_is_as_documented() {
        let framed = encode_request(&every_request()[0]).unwrap();
        let body = std::str::from_utf8(&framed[4..]).unwrap();
        assert_eq!(
            body,
            r#"{"v":3,"request":{"door":"push","remote":"origin","dst_ref":"refs/heads/agent/x","claimed_commit":"0123456789abcdef0123456789abcdef01234567","force":false,"delete":false,"pack_bytes":1234}}"#
        );
        assert_eq!(&framed[..4], &(body.len() as u32).to_be_bytes());
        let framed = encode_response(&Response::Queued { act: "a1".into() });
        assert_eq!(
            std::str::from_utf8(&framed[4..]).unwrap(),
            r#"{"v":3,"response":{"verdict":"queued","act":"a1"}}"#
        );
    }

    #[test]
    fn lines_are_what_the_issue_says() {
        let lines: Vec<String> = every_response().iter().map(Response::line).collect();
        assert_eq!(
            lines,
            [
                "refused by rule r-12: pushes to main need a person",
                "queued as act 01J0ACT for approval",
                "done",
                "done: pushed",
                "error: frozen",
                "asks a person: a person approves edits",
            ]
        );
        let codes: Vec<i32> = every_response().iter().map(Response::exit_code).collect();
        assert_eq!(codes, [3, 0, 0, 0, 4, 3]);
    }

    #[test]
    fn a_hostile_response_prints_as_one_bounded_line() {
        let response = Response::Refused {
            rule: "r\n1".into(),
            reason: format!("\u{1b}[2J{}", "x".repeat(100_000)),
        };
        let line = response.line();
        assert!(!line.contains(['\n', '\u{1b}']), "{line:?}");
        assert!(line.len() < 2 * MAX_RESPONSE_TEXT + 32);
        // And it still encodes within the limit, readable on the other side.
        let framed = encode_response(&response);
        assert!(framed.len() <= HEADER_LEN + MAX_RESPONSE_FRAME);
        assert!(decode_response(&framed).unwrap().is_some());
    }

    fn frame_json(json: &str) -> Vec<u8> {
        encode_frame(json.as_bytes(), MAX_REQUEST_FRAME).unwrap()
    }

    #[test]
    fn malformed_requests_are_refused_with_a_reason() {
        let cases = [
            (
                r#"{"v":1,"request":{"door":"ask","body":"x"}}"#,
                "speaks protocol version 1; this side speaks 3",
            ),
            (
                r#"{"v":1,"request":{"door":"push","remote":"origin","dst_ref":"refs/heads/x","claimed_commit":"0123456789abcdef0123456789abcdef01234567"}}"#,
                "speaks protocol version 1",
            ),
            (
                r#"{"request":{"door":"ask","body":"x"}}"#,
                "no protocol version",
            ),
            (
                r#"{"v":"3","request":{"door":"ask","body":"x"}}"#,
                "malformed",
            ),
            (
                r#"{"v":3,"request":{"door":"ask","body":"x"},"x":1}"#,
                "unknown field",
            ),
            (
                r#"{"v":3,"request":{"door":"ask","body":"x","sudo":true}}"#,
                "unknown field",
            ),
            (
                r#"{"v":3,"request":{"door":"deploy","body":"x"}}"#,
                "unknown variant",
            ),
            (r#"{"v":3,"request":{"door":"ask"}}"#, "missing field"),
            (
                r#"{"v":3,"response":{"verdict":"done","detail":""}}"#,
                "unknown field",
            ),
            ("not json", "malformed"),
            ("", "malformed"),
            (
                &format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000)),
                "malformed",
            ),
            (
                r#"{"v":3,"request":{"door":"push","remote":"https://evil","dst_ref":"refs/heads/x","claimed_commit":"0123456789abcdef0123456789abcdef01234567","force":false,"delete":false,"pack_bytes":0}}"#,
                "a URL or path is refused",
            ),
            (
                r#"{"v":3,"request":{"door":"push","remote":"origin","dst_ref":"refs/heads/x","claimed_commit":"0123456789abcdef0123456789abcdef01234567"}}"#,
                "missing field",
            ),
            (
                r#"{"v":3,"request":{"door":"push","remote":"origin","dst_ref":"refs/heads/x","claimed_commit":"0123456789abcdef0123456789abcdef01234567","force":false,"delete":false,"pack_bytes":536870913}}"#,
                "a pack of 536870913 bytes is over the limit of 536870912 bytes",
            ),
            (
                r#"{"v":3,"request":{"door":"push","remote":"origin","dst_ref":"refs/heads/x","claimed_commit":"0000000000000000000000000000000000000000","force":false,"delete":false,"pack_bytes":0}}"#,
                "the all-zero commit id names no commit",
            ),
            (
                r#"{"v":3,"request":{"door":"push","remote":"origin","dst_ref":"refs/heads/x","claimed_commit":"0123456789abcdef0123456789abcdef01234567","force":true,"delete":true,"pack_bytes":0}}"#,
                "a deletion carries the all-zero commit id",
            ),
            (
                r#"{"v":3,"request":{"door":"push","remote":"origin","dst_ref":"refs/heads/x","claimed_commit":"0000000000000000000000000000000000000000","force":false,"delete":true,"pack_bytes":10}}"#,
                "a deletion carries no pack",
            ),
            (
                r#"{"v":3,"request":{"door":"pull_request","remote":"origin","base":"refs/heads/main","head":"refs/heads/x","head_commit":"0000000000000000000000000000000000000000","pack_bytes":0,"title":"t","body":"b"}}"#,
                "head_commit",
            ),
            (
                r#"{"v":3,"request":{"door":"push","remote":"origin","dst_ref":"x","claimed_commit":"0123456789abcdef0123456789abcdef01234567","force":false,"delete":false,"pack_bytes":0}}"#,
                "under refs/heads/",
            ),
            (
                r#"{"v":3,"request":{"door":"notify","destination":"chat","body":"\u001b[31m"}}"#,
                "control character",
            ),
        ];
        for (json, expected) in cases {
            let err = decode_request(&frame_json(json)).unwrap_err();
            let reply = Response::for_error(&err);
            assert!(
                reply.line().contains(expected),
                "{json:.60}: {}",
                reply.line()
            );
        }
    }

    #[test]
    fn the_largest_valid_request_fits() {
        // Every byte of the body and title escapes to two.
        let request = Request::PullRequest {
            remote: "r".repeat(64),
            base: format!("refs/heads/{}", "b".repeat(244)),
            head: format!("refs/heads/{}", "h".repeat(244)),
            head_commit: "f".repeat(64),
            pack_bytes: MAX_PACK_BYTES,
            title: "\"".repeat(256),
            body: "\\".repeat(MAX_BODY),
        };
        let framed = encode_request(&request).unwrap();
        assert!(framed.len() > 2 * MAX_BODY);
        assert_eq!(decode_request(&framed).unwrap().unwrap().0, request);
        // A result listing every skipped path it may, each escaping whole
        // (a control character to six bytes, a backslash to two).
        let text = "\\".repeat(MAX_REPORTED_TEXT);
        let path = "\u{1}".repeat(MAX_REPORTED_PATH);
        let result = Request::Result {
            result_commit: "f".repeat(64),
            agent_tip: "e".repeat(64),
            observed_commit: Some("f".repeat(64)),
            tip_source: text.clone(),
            skipped: vec![
                ReportedSkip {
                    path: path.clone(),
                    why: text.clone(),
                };
                MAX_RESULT_SKIPS
            ],
            skipped_total: u64::MAX,
            ignored: u64::MAX,
            history_dropped: Some(ReportedDrop {
                kind: "k".repeat(64),
                object: Some("a".repeat(64)),
                size: Some(u64::MAX),
                limit: Some(u64::MAX),
                why: text.clone(),
            }),
            pack_bytes: MAX_PACK_BYTES,
        };
        let framed = encode_request(&result).unwrap();
        assert!(framed.len() > MAX_RESULT_SKIPS * (6 * MAX_REPORTED_PATH + 2 * MAX_REPORTED_TEXT));
        assert_eq!(decode_request(&framed).unwrap().unwrap().0, result);
    }

    #[test]
    fn a_result_that_lists_too_much_or_hides_a_control_character_is_refused() {
        // A file name is the agent's, any character at all: data.
        let named = Request::Result {
            result_commit: "f".repeat(40),
            agent_tip: "e".repeat(40),
            observed_commit: None,
            tip_source: "run_branch".into(),
            skipped: vec![ReportedSkip {
                path: "fifo-\u{1b}]0;pwned\u{7}".into(),
                why: "SpecialFile".into(),
            }],
            skipped_total: 1,
            ignored: 0,
            history_dropped: None,
            pack_bytes: 0,
        };
        let framed = encode_request(&named).unwrap();
        assert!(!framed.contains(&0x1b), "a raw escape in the frame");
        assert_eq!(decode_request(&framed).unwrap().unwrap().0, named);
        let ok = || Request::Result {
            result_commit: "f".repeat(40),
            agent_tip: "e".repeat(40),
            observed_commit: None,
            tip_source: "run_branch".into(),
            skipped: vec![],
            skipped_total: 0,
            ignored: 0,
            history_dropped: None,
            pack_bytes: 0,
        };
        assert_eq!(ok().validate(), Ok(()));
        let skip = |path: &str| ReportedSkip {
            path: path.into(),
            why: "TooLarge".into(),
        };
        let mut cases = Vec::new();
        let mut r = ok();
        if let Request::Result {
            skipped,
            skipped_total,
            ..
        } = &mut r
        {
            *skipped = vec![skip("a"); MAX_RESULT_SKIPS + 1];
            *skipped_total = u64::MAX;
        }
        cases.push(("skipped", r));
        let mut r = ok();
        if let Request::Result { skipped, .. } = &mut r {
            *skipped = vec![skip("a")];
        }
        cases.push(("skipped_total", r));
        let mut r = ok();
        if let Request::Result {
            skipped,
            skipped_total,
            ..
        } = &mut r
        {
            *skipped = vec![ReportedSkip {
                path: "a".into(),
                why: "x\u{1b}[2Jy".into(),
            }];
            *skipped_total = 1;
        }
        cases.push(("skipped.why", r));
        let mut r = ok();
        if let Request::Result {
            skipped,
            skipped_total,
            ..
        } = &mut r
        {
            *skipped = vec![skip(&"p".repeat(MAX_REPORTED_PATH + 1))];
            *skipped_total = 1;
        }
        cases.push(("skipped.path", r));
        let mut r = ok();
        if let Request::Result { result_commit, .. } = &mut r {
            *result_commit = "0".repeat(40);
        }
        cases.push(("result_commit", r));
        let mut r = ok();
        if let Request::Result {
            history_dropped, ..
        } = &mut r
        {
            *history_dropped = Some(ReportedDrop {
                kind: "Object Too Large".into(),
                object: None,
                size: None,
                limit: None,
                why: "x".into(),
            });
        }
        cases.push(("history_dropped.kind", r));
        for (field, request) in cases {
            let err = request.validate().unwrap_err();
            assert!(err.to_string().starts_with(field), "{field}: {err}");
            assert!(encode_request(&request).is_err());
        }
    }

    #[test]
    fn the_reader_takes_one_request_in_any_pieces() {
        let framed = encode_request(&every_request()[1]).unwrap();
        for piece in [1, 3, 4, 7, framed.len()] {
            let mut reader = RequestReader::new();
            let mut got = None;
            for chunk in framed.chunks(piece) {
                if let Some(request) = reader.feed(chunk).unwrap() {
                    got = Some(request);
                }
            }
            assert_eq!(got.as_ref(), Some(&every_request()[1]));
            assert_eq!(reader.wanted(), 0);
        }
    }

    #[test]
    fn reading_what_the_reader_wants_never_takes_the_next_request() {
        // An adapter reads at most `wanted()` bytes at a time from a peer
        // that sent two requests back to back.
        let framed = encode_request(&every_request()[0]).unwrap();
        let mut stream = framed.repeat(2);
        let mut reader = RequestReader::new();
        let mut got = None;
        while got.is_none() {
            let n = reader.wanted().min(stream.len());
            assert!(n > 0);
            let chunk: Vec<u8> = stream.drain(..n).collect();
            got = reader.feed(&chunk).unwrap();
        }
        assert_eq!(got.as_ref(), Some(&every_request()[0]));
        assert_eq!(stream, framed, "the second request was left unread");
    }

    #[test]
    fn the_reader_refuses_a_second_request_and_trailing_bytes() {
        let framed = encode_request(&every_request()[3]).unwrap();
        let mut two = framed.clone();
        two.extend_from_slice(&framed);
        assert!(matches!(
            RequestReader::new().feed(&two),
            Err(ProtocolError::OutOfOrder { extra }) if extra == framed.len()
        ));
        let mut reader = RequestReader::new();
        assert!(reader.feed(&framed).unwrap().is_some());
        assert!(matches!(
            reader.feed(b"x"),
            Err(ProtocolError::OutOfOrder { extra: 1 })
        ));
    }

    #[test]
    fn the_reader_refuses_an_oversized_header_before_any_body() {
        let mut reader = RequestReader::new();
        let header = ((MAX_REQUEST_FRAME + 1) as u32).to_be_bytes();
        assert!(matches!(
            reader.feed(&header),
            Err(ProtocolError::Frame {
                source: FrameError::Oversized { .. },
                ..
            })
        ));
    }

    #[test]
    fn a_closed_connection_says_how_far_it_got() {
        let mut reader = RequestReader::new();
        reader.feed(&[0, 0]).unwrap();
        assert_eq!(
            reader.closed().to_string(),
            "request cut short: the connection closed after 2 of 4 bytes"
        );
        reader.feed(&[0, 9, b'{']).unwrap();
        assert_eq!(
            reader.closed().to_string(),
            "request cut short: the connection closed after 5 of 13 bytes"
        );
    }

    #[test]
    fn door_names_match_the_deferred_queue() {
        use deferred_queue::Door;
        let doors = [Door::Push, Door::PullRequest, Door::Notify, Door::Ask];
        for (request, door) in every_request().iter().zip(doors) {
            assert_eq!(request.door(), door.name());
        }
        // A policy check is a question, not an act: the queue has no door for it.
        assert_eq!(every_request()[4].door(), "policy_check");
    }

    #[test]
    fn a_policy_check_carries_an_object_of_bounded_size() {
        let big = "x".repeat(crate::validate::MAX_HOOK_PAYLOAD);
        for (payload, why) in [
            (serde_json::json!([1]), "a JSON object"),
            (serde_json::json!("Bash"), "a JSON object"),
            (
                serde_json::json!({"tool_name": "Write", "tool_input": {"content": big}}),
                "over the limit",
            ),
        ] {
            let err = encode_request(&Request::PolicyCheck { payload }).unwrap_err();
            assert!(err.to_string().contains(why), "{err}");
        }
        // The largest payload, all of it escaped, still fits the frame.
        let escapes = "\u{1}".repeat(crate::validate::MAX_HOOK_PAYLOAD / 6 - 10);
        let payload = serde_json::json!({"tool_name": "Write", "tool_input": {"c": escapes}});
        let framed = encode_request(&Request::PolicyCheck { payload }).unwrap();
        assert!(framed.len() <= MAX_REQUEST_FRAME);
        let (back, _) = decode_request(&framed).unwrap().unwrap();
        assert_eq!(back.door(), "policy_check");
    }

    fn alias() -> impl Strategy<Value = String> {
        "[A-Za-z0-9_][A-Za-z0-9._-]{0,63}"
    }
    fn branch() -> impl Strategy<Value = String> {
        "[a-z0-9_]{1,20}(/[a-z0-9_]{1,20}){0,3}".prop_map(|b| format!("refs/heads/{b}"))
    }
    fn text() -> impl Strategy<Value = String> {
        "[^\\p{Cc}]{0,200}[a-z][\t\n\r\"\\\\]{0,5}"
    }
    fn title() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9 \"\\\\é✓]{0,200}[a-z]"
    }
    fn request() -> impl Strategy<Value = Request> {
        prop_oneof![
            (
                alias(),
                branch(),
                "[1-9a-f][0-9a-f]{39}",
                any::<bool>(),
                0..=MAX_PACK_BYTES
            )
                .prop_map(|(remote, dst_ref, claimed_commit, force, pack_bytes)| {
                    Request::Push {
                        remote,
                        dst_ref,
                        claimed_commit,
                        force,
                        delete: false,
                        pack_bytes,
                    }
                }),
            (alias(), branch(), any::<bool>()).prop_map(|(remote, dst_ref, force)| Request::Push {
                remote,
                dst_ref,
                claimed_commit: crate::validate::ZERO_COMMIT.into(),
                force,
                delete: true,
                pack_bytes: 0,
            }),
            (
                alias(),
                branch(),
                branch(),
                "[1-9a-f][0-9a-f]{39}",
                title(),
                text()
            )
                .prop_map(|(remote, base, head, head_commit, title, body)| {
                    Request::PullRequest {
                        remote,
                        base,
                        head,
                        head_commit,
                        pack_bytes: 7,
                        title,
                        body,
                    }
                }),
            (alias(), text()).prop_map(|(destination, body)| Request::Notify { destination, body }),
            text().prop_map(|body| Request::Ask { body }),
        ]
    }
    fn response() -> impl Strategy<Value = Response> {
        let t = "[^\\p{C}]{0,100}";
        prop_oneof![
            ("[a-z0-9-]{1,20}", t).prop_map(|(rule, reason)| Response::Refused { rule, reason }),
            "[A-Z0-9]{1,26}".prop_map(|act| Response::Queued { act }),
            t.prop_map(|detail| Response::Done { detail }),
            t.prop_map(|reason| Response::Error { reason }),
        ]
    }

    proptest! {
        #[test]
        fn valid_requests_round_trip(request in request()) {
            let framed = encode_request(&request).unwrap();
            prop_assert_eq!(decode_request(&framed).unwrap(), Some((request, framed.len())));
        }

        #[test]
        fn printable_responses_round_trip(response in response()) {
            let framed = encode_response(&response);
            prop_assert_eq!(decode_response(&framed).unwrap(), Some((response, framed.len())));
        }

        #[test]
        fn random_bytes_never_panic_the_decoders(buf in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = decode_request(&buf);
            let _ = decode_response(&buf);
            let mut reader = RequestReader::new();
            for chunk in buf.chunks(5) {
                if reader.feed(chunk).is_err() {
                    break;
                }
            }
        }

        #[test]
        fn the_reader_never_buffers_past_the_limit(
            declared in prop_oneof![any::<u32>(), 0u32..64, (MAX_REQUEST_FRAME as u32 - 2)..(MAX_REQUEST_FRAME as u32 + 2)],
            rest in proptest::collection::vec(any::<u8>(), 0..256),
            piece in 1usize..64,
        ) {
            let mut stream = declared.to_be_bytes().to_vec();
            stream.extend_from_slice(&rest);
            let mut reader = RequestReader::new();
            let mut fed = 0;
            for chunk in stream.chunks(piece) {
                let verdict = reader.feed(chunk);
                fed += chunk.len();
                prop_assert!(reader.buf.len() <= HEADER_LEN + MAX_REQUEST_FRAME);
                if declared as usize > MAX_REQUEST_FRAME && fed >= HEADER_LEN {
                    // Refused as soon as the header is whole, body unread.
                    prop_assert!(
                        matches!(verdict, Err(ProtocolError::Frame { .. })),
                        "oversized header accepted"
                    );
                    prop_assert_eq!(reader.buf.len(), HEADER_LEN);
                }
                if verdict.is_err() {
                    break;
                }
            }
        }

        #[test]
        fn random_json_bodies_never_panic_and_never_pass_invalid(
            body in "\\{\"v\":1,\"request\":\\{\"door\":\"(push|ask|notify|pull_request)\"(,\"[a-z_]{1,14}\":\"[^\"]{0,30}\"){0,5}\\}\\}"
        ) {
            let framed = frame_json(&body);
            if let Ok(Some((request, _))) = decode_request(&framed) {
                prop_assert!(request.validate().is_ok());
            }
        }

        #[test]
        fn a_request_frame_cut_anywhere_is_incomplete_not_an_error(request in request(), cut in any::<prop::sample::Index>()) {
            let framed = encode_request(&request).unwrap();
            let at = cut.index(framed.len());
            prop_assert_eq!(decode_request(&framed[..at]).unwrap(), None);
        }
    }
}
