//! The gateway's SSE response parser (`orchestrator/gateway/src/sse.rs`,
//! `Scanner`): what an upstream model (or anything answering in its place)
//! streams back, read for its usage and passed on to the agent.
//!
//! Input: byte 0 picks the API shape (Chat, Responses, Messages) and
//! whether the client asked for the usage chunk; byte 1 the size of the
//! reads the stream arrives in; the rest is the stream. Checked, beyond
//! "no panic": the result does not depend on how the stream is cut into
//! reads; with no event over the bound, every byte is passed on except
//! (for a chat stream whose client did not ask) whole usage chunks; the
//! counters add up; and the same bytes as a whole JSON body give a usage
//! or none without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nightshift_gateway::route::Shape;
use nightshift_gateway::sse::{usage_of_json, Prepared, ScanError, Scanner, Usage};

const MAX_EVENT: usize = 1024;

fn scan(
    shape: Shape,
    prepared: Prepared,
    stream: &[u8],
    piece: usize,
) -> (Result<(), ScanError>, Vec<u8>, Option<Usage>, u64, u64) {
    let mut s = Scanner::new(shape, prepared, MAX_EVENT);
    let mut out = Vec::new();
    for chunk in stream.chunks(piece.max(1)) {
        if let Err(e) = s.feed(chunk, &mut out) {
            return (Err(e), out, s.usage(), s.forwarded, s.events);
        }
    }
    s.finish(&mut out);
    assert!(s.between_events());
    assert_eq!(s.forwarded, out.len() as u64);
    (Ok(()), out, s.usage(), s.forwarded, s.events)
}

fuzz_target!(|data: &[u8]| {
    let [how, piece, stream @ ..] = data else {
        return;
    };
    let shape = [Shape::Chat, Shape::Responses, Shape::Messages][usize::from(how % 3)];
    let prepared = Prepared {
        stream: true,
        client_wants_usage: how & 0x10 != 0,
    };
    let whole = scan(shape, prepared, stream, stream.len());
    let cut = scan(shape, prepared, stream, usize::from(*piece));
    let bytewise = scan(shape, prepared, stream, 1);
    assert_eq!(whole.0.is_ok(), cut.0.is_ok());
    assert_eq!(whole.0.is_ok(), bytewise.0.is_ok());
    if whole.0.is_ok() {
        assert_eq!(whole, cut, "the result depends on how the stream is read");
        assert_eq!(
            whole, bytewise,
            "the result depends on how the stream is read"
        );
        let stripping = shape == Shape::Chat && !prepared.client_wants_usage;
        if !stripping {
            assert_eq!(whole.1, stream, "bytes lost or changed");
        } else {
            assert!(whole.1.len() <= stream.len());
        }
        if let Some(u) = whole.2 {
            let _ = u.total();
        }
    }
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(stream) {
        for shape in [Shape::Chat, Shape::Responses, Shape::Messages] {
            let _ = usage_of_json(shape, &v);
        }
    }
});
