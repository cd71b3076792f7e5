//! The responses' usage (pure): read incrementally from a stream of
//! server-sent events, or from a whole JSON body (the request rewrite that
//! makes a chat stream report it is `request::Checked::forwarded`).
//!
//! Invariants:
//! - The scanner holds at most one event (at most `max_event` bytes): a
//!   longer line or event is an error, never a larger buffer. Events are
//!   passed on whole as soon as their closing blank line arrives, so the
//!   stream is never buffered beyond one event, and anything inserted
//!   between events (heartbeat comments) never splits one
//!   (`tests::an_over_long_line_is_an_error_not_a_buffer`,
//!   `tests::any_split_gives_the_same_result`, `tests::hostile_bytes_stay_bounded`).
//! - Usage is taken from where each API puts it: Chat Completions' usage
//!   chunk (the gateway (`request`) forces `stream_options.include_usage` and removes
//!   that chunk again when the client had not asked for it); Responses'
//!   `response.completed` / `.incomplete` / `.failed`; Anthropic's
//!   `message_start` (input) and the last, cumulative `message_delta`
//!   (output). A stream without it reports none ([`Scanner::usage`] is
//!   `None`), and the reservation is kept.

use serde::Serialize;
use serde_json::Value;

use super::route::Shape;

/// Tokens a response reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Usage {
    /// Input tokens, cached and cache-written ones included.
    pub input: u64,
    pub output: u64,
    /// Of the input, read from a cache.
    pub cached: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.input.saturating_add(self.output)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScanError {
    #[error("the model's response has an event over {limit} bytes")]
    TooLong { limit: usize },
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// Usage of OpenAI's `usage` objects (chat: prompt/completion; responses:
/// input/output).
fn openai_usage(u: &Value) -> Option<Usage> {
    if !u.is_object() {
        return None;
    }
    let input = u.get("prompt_tokens").or_else(|| u.get("input_tokens"))?;
    let output = u
        .get("completion_tokens")
        .or_else(|| u.get("output_tokens"))?;
    let cached = u
        .get("prompt_tokens_details")
        .or_else(|| u.get("input_tokens_details"))
        .and_then(|d| d.get("cached_tokens"))
        .map(n)
        .unwrap_or(0);
    Some(Usage {
        input: n(input),
        output: n(output),
        cached,
    })
}

/// Anthropic's input: uncached + cache written + cache read.
fn anthropic_input(u: &Value) -> Option<(u64, u64)> {
    let plain = u.get("input_tokens").and_then(Value::as_u64)?;
    let written = u.get("cache_creation_input_tokens").map(n).unwrap_or(0);
    let read = u.get("cache_read_input_tokens").map(n).unwrap_or(0);
    Some((plain.saturating_add(written).saturating_add(read), read))
}

/// The usage of a whole (not streamed) JSON response.
pub fn usage_of_json(shape: Shape, body: &Value) -> Option<Usage> {
    let u = body.get("usage")?;
    match shape {
        Shape::Chat | Shape::Responses => openai_usage(u),
        Shape::Messages => {
            let (input, cached) = anthropic_input(u)?;
            Some(Usage {
                input,
                output: u.get("output_tokens").and_then(Value::as_u64)?,
                cached,
            })
        }
    }
}

/// What the client asked of a request (see `request::Checked`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prepared {
    pub stream: bool,
    /// A chat stream whose client asked for the usage chunk itself.
    pub client_wants_usage: bool,
}

/// Reads a stream of server-sent events incrementally: passes whole events
/// on, notes the usage, drops the chat usage chunk the client did not ask
/// for.
#[derive(Debug)]
pub struct Scanner {
    shape: Shape,
    strip_usage_chunk: bool,
    max_event: usize,
    /// The current event's bytes so far.
    event: Vec<u8>,
    /// Where the current line starts in `event`.
    line_start: usize,
    usage: Option<Usage>,
    /// Anthropic: input seen in `message_start`, waiting for a `message_delta`.
    anthropic_start: Option<Usage>,
    /// Bytes passed on.
    pub forwarded: u64,
    /// Events seen.
    pub events: u64,
}

impl Scanner {
    pub fn new(shape: Shape, prepared: Prepared, max_event: usize) -> Scanner {
        Scanner {
            shape,
            strip_usage_chunk: shape == Shape::Chat && !prepared.client_wants_usage,
            max_event,
            event: Vec::new(),
            line_start: 0,
            usage: None,
            anthropic_start: None,
            forwarded: 0,
            events: 0,
        }
    }

    /// The usage seen so far (final once the stream has ended).
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Whether the scanner is between events (nothing of one held).
    pub fn between_events(&self) -> bool {
        self.event.is_empty()
    }

    /// Feeds bytes; appends to `out` every event completed by them.
    pub fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<u8>) -> Result<(), ScanError> {
        while !bytes.is_empty() {
            match bytes.iter().position(|b| *b == b'\n') {
                Some(i) => {
                    self.push(&bytes[..=i])?;
                    bytes = &bytes[i + 1..];
                    let line = &self.event[self.line_start..];
                    let blank = line == b"\n" || line == b"\r\n";
                    if blank {
                        // The event's buffer is kept for the next one.
                        let event = std::mem::take(&mut self.event);
                        self.line_start = 0;
                        self.finish_event(&event, out);
                        self.event = event;
                        self.event.clear();
                    } else {
                        self.line_start = self.event.len();
                    }
                }
                None => {
                    self.push(bytes)?;
                    bytes = &[];
                }
            }
        }
        Ok(())
    }

    /// The stream ended: an unterminated last event is passed on as it is.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if !self.event.is_empty() {
            let event = std::mem::take(&mut self.event);
            self.line_start = 0;
            self.finish_event(&event, out);
        }
    }

    fn push(&mut self, bytes: &[u8]) -> Result<(), ScanError> {
        if self.event.len() + bytes.len() > self.max_event {
            return Err(ScanError::TooLong {
                limit: self.max_event,
            });
        }
        self.event.extend_from_slice(bytes);
        Ok(())
    }

    fn finish_event(&mut self, event: &[u8], out: &mut Vec<u8>) {
        self.events += 1;
        let keep = self.observe(event);
        if keep {
            self.forwarded += event.len() as u64;
            out.extend_from_slice(event);
        }
    }

    /// Notes the usage an event carries; false when it must not be passed on.
    fn observe(&mut self, event: &[u8]) -> bool {
        if !contains(event, b"usage") || only_null_usage(event) {
            return true;
        }
        self.observe_parsed(event)
    }

    /// [`Self::observe`] by parsing the event's data, whatever it holds.
    fn observe_parsed(&mut self, event: &[u8]) -> bool {
        // The event's data: its `data:` lines joined by newlines.
        let mut data = Vec::new();
        for line in event.split(|b| *b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(rest) = line.strip_prefix(b"data:") {
                if !data.is_empty() {
                    data.push(b'\n');
                }
                data.extend_from_slice(rest.strip_prefix(b" ").unwrap_or(rest));
            }
        }
        let Ok(v) = serde_json::from_slice::<Value>(&data) else {
            return true;
        };
        match self.shape {
            Shape::Chat => {
                if let Some(u) = v.get("usage").and_then(openai_usage) {
                    self.usage = Some(u);
                    let usage_only = v
                        .get("choices")
                        .and_then(Value::as_array)
                        .is_some_and(Vec::is_empty);
                    if usage_only && self.strip_usage_chunk {
                        return false;
                    }
                }
            }
            Shape::Responses => {
                let kind = v.get("type").and_then(Value::as_str).unwrap_or_default();
                if matches!(
                    kind,
                    "response.completed" | "response.incomplete" | "response.failed"
                ) {
                    if let Some(u) = v
                        .get("response")
                        .and_then(|r| r.get("usage"))
                        .and_then(openai_usage)
                    {
                        self.usage = Some(u);
                    }
                }
            }
            Shape::Messages => match v.get("type").and_then(Value::as_str) {
                Some("message_start") => {
                    if let Some((input, cached)) = v
                        .get("message")
                        .and_then(|m| m.get("usage"))
                        .and_then(anthropic_input)
                    {
                        self.anthropic_start = Some(Usage {
                            input,
                            output: 0,
                            cached,
                        });
                    }
                }
                Some("message_delta") => {
                    if let Some(u) = v.get("usage") {
                        let mut usage = self.anthropic_start.unwrap_or_default();
                        if let Some((input, cached)) = anthropic_input(u) {
                            // Newer streams repeat the (cumulative) input here.
                            usage.input = usage.input.max(input);
                            usage.cached = usage.cached.max(cached);
                        }
                        if let Some(out) = u.get("output_tokens").and_then(Value::as_u64) {
                            usage.output = out;
                            if self.anthropic_start.is_some() || usage.input > 0 {
                                self.usage = Some(usage);
                            }
                        }
                    }
                }
                _ => {}
            },
        }
        true
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    find(hay, needle).is_some()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}

/// Whether every `usage` in an event is the member `"usage":null` (or
/// `"usage": null`): a Chat stream asked to report usage says so in every
/// chunk but the last, and such an event has no usage to read, so it is
/// passed on without being parsed. Inside a JSON string a quote is escaped,
/// so this text can only be a member; anything else (`usage` in text, an
/// object, a malformed event) takes the parse
/// (`tests::null_usage_events_read_as_the_parse_reads_them`).
fn only_null_usage(event: &[u8]) -> bool {
    let mut rest = event;
    let mut seen = false;
    while let Some(i) = find(rest, b"usage") {
        let quoted = i > 0 && rest[i - 1] == b'"';
        let after = &rest[i + 5..];
        if !(quoted && (after.starts_with(b"\":null") || after.starts_with(b"\": null"))) {
            return false;
        }
        seen = true;
        rest = after;
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn chat_stream(with_usage: bool) -> Vec<u8> {
        let mut s = String::new();
        s.push_str(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n",
        );
        s.push_str("data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n");
        if with_usage {
            s.push_str("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n");
        }
        s.push_str("data: [DONE]\n\n");
        s.into_bytes()
    }

    fn scan(
        shape: Shape,
        prepared: Prepared,
        stream: &[u8],
        pieces: usize,
    ) -> (Vec<u8>, Option<Usage>) {
        let mut s = Scanner::new(shape, prepared, 1 << 16);
        let mut out = Vec::new();
        let step = (stream.len() / pieces.max(1)).max(1);
        for chunk in stream.chunks(step) {
            s.feed(chunk, &mut out).unwrap();
        }
        s.finish(&mut out);
        (out, s.usage())
    }

    #[test]
    fn chat_usage_is_read_and_its_chunk_stripped_unless_asked_for() {
        let stream = chat_stream(true);
        let asked = Prepared {
            stream: true,
            client_wants_usage: true,
        };
        let (out, u) = scan(Shape::Chat, asked, &stream, 7);
        assert_eq!(out, stream);
        assert_eq!(
            u,
            Some(Usage {
                input: 12,
                output: 5,
                cached: 4
            })
        );
        let unasked = Prepared {
            stream: true,
            client_wants_usage: false,
        };
        let (out, u) = scan(Shape::Chat, unasked, &stream, 3);
        assert_eq!(out, chat_stream(false));
        assert_eq!(u.unwrap().total(), 17);
        let (_, u) = scan(Shape::Chat, unasked, &chat_stream(false), 3);
        assert_eq!(u, None);
    }

    #[test]
    fn responses_and_messages_usage() {
        let r = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n\
                 event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":30,\"input_tokens_details\":{\"cached_tokens\":10},\"output_tokens\":9}}}\n\n";
        let p = Prepared {
            stream: true,
            client_wants_usage: false,
        };
        let (out, u) = scan(Shape::Responses, p, r.as_bytes(), 5);
        assert_eq!(out, r.as_bytes());
        assert_eq!(
            u,
            Some(Usage {
                input: 30,
                output: 9,
                cached: 10
            })
        );
        let m = "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"cache_creation_input_tokens\":3,\"cache_read_input_tokens\":7,\"output_tokens\":1}}}\r\n\r\n\
                 event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":4}}\n\n\
                 event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":11}}\n\n";
        let (_, u) = scan(Shape::Messages, p, m.as_bytes(), 9);
        assert_eq!(
            u,
            Some(Usage {
                input: 30,
                output: 11,
                cached: 7
            })
        );
        // message_start alone is not a whole usage.
        let (_, u) = scan(
            Shape::Messages,
            p,
            m.split("event: message_delta").next().unwrap().as_bytes(),
            1,
        );
        assert_eq!(u, None);
    }

    #[test]
    fn whole_bodies() {
        assert_eq!(
            usage_of_json(
                Shape::Chat,
                &json!({"usage": {"prompt_tokens": 3, "completion_tokens": 4}})
            ),
            Some(Usage {
                input: 3,
                output: 4,
                cached: 0
            })
        );
        assert_eq!(
            usage_of_json(
                Shape::Messages,
                &json!({"usage": {"input_tokens": 3, "output_tokens": 4, "cache_read_input_tokens": 2}})
            ),
            Some(Usage {
                input: 5,
                output: 4,
                cached: 2
            })
        );
        assert_eq!(
            usage_of_json(Shape::Responses, &json!({"usage": null})),
            None
        );
        assert_eq!(usage_of_json(Shape::Responses, &json!({})), None);
    }

    #[test]
    fn an_over_long_line_is_an_error_not_a_buffer() {
        let mut s = Scanner::new(
            Shape::Chat,
            Prepared {
                stream: true,
                client_wants_usage: false,
            },
            100,
        );
        let mut out = Vec::new();
        s.feed(b"data: short\n\n", &mut out).unwrap();
        let long = vec![b'a'; 101];
        assert_eq!(
            s.feed(&long, &mut out),
            Err(ScanError::TooLong { limit: 100 })
        );
        assert!(s.event.capacity() <= 200);
    }

    proptest! {
        /// However the stream is cut into reads, the same bytes come out and
        /// the same usage is seen (when the client asked for the chunk).
        #[test]
        fn any_split_gives_the_same_result(cuts in proptest::collection::vec(1..40usize, 0..30)) {
            let stream = chat_stream(true);
            let p = Prepared { stream: true, client_wants_usage: true };
            let mut s = Scanner::new(Shape::Chat, p, 1 << 16);
            let mut out = Vec::new();
            let mut rest: &[u8] = &stream;
            for c in cuts {
                let c = c.min(rest.len());
                s.feed(&rest[..c], &mut out).unwrap();
                rest = &rest[c..];
            }
            s.feed(rest, &mut out).unwrap();
            s.finish(&mut out);
            prop_assert_eq!(out, stream);
            prop_assert_eq!(s.usage().map(|u| u.total()), Some(17));
        }

        /// Arbitrary bytes never make the scanner hold more than its bound.
        #[test]
        fn null_usage_events_read_as_the_parse_reads_them(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just("\"usage\":null".to_string()),
                    Just("\"usage\": null".to_string()),
                    Just("\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}".to_string()),
                    Just("\"content\":\"\\\"usage\\\":null\"".to_string()),
                    Just("\"choices\":[]".to_string()),
                    Just("\"choices\":[{\"delta\":{\"content\":\"usage\"}}]".to_string()),
                    "[a-z\":{} ,\\\\]{0,12}",
                ],
                0..5,
            ),
            with_usage in any::<bool>(),
        ) {
            // One event of any of these members, read with the fast path and
            // by the parse alone: the same usage, the same bytes passed on.
            let event = format!("data: {{{}}}\n\n", parts.join(","));
            let prepared = Prepared { stream: true, client_wants_usage: with_usage };
            let mut fast = Scanner::new(Shape::Chat, prepared, 1 << 16);
            let mut out_fast = Vec::new();
            fast.feed(event.as_bytes(), &mut out_fast).unwrap();
            let mut slow = Scanner::new(Shape::Chat, prepared, 1 << 16);
            let keep = slow.observe_parsed(event.as_bytes());
            prop_assert_eq!(fast.usage(), slow.usage());
            prop_assert_eq!(out_fast.is_empty(), !keep);
        }

        #[test]
        fn hostile_bytes_stay_bounded(bytes in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let mut s = Scanner::new(Shape::Messages, Prepared { stream: true, client_wants_usage: false }, 64);
            let mut out = Vec::new();
            let _ = s.feed(&bytes, &mut out);
            prop_assert!(s.event.len() <= 64);
        }
    }
}
