//! The door's frame and message decoders (`sandbox-image/door`: `frame.rs`,
//! `message.rs`, `validate.rs`), fed what a hostile sandbox can send.
//!
//! The input is the byte stream of one connection. Checked, beyond "no
//! panic": a request that decodes has passed validation and survives a
//! re-encode; the incremental reader (fed in pieces as the supervisor's
//! adapter reads) agrees with the one-shot decoder and never takes bytes
//! past the frame; the same bytes read as a response print as one line and
//! survive a re-encode; every error's reply frames and decodes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandbox_image_door::{
    decode_request, decode_response, encode_request, encode_response, ProtocolError, Request,
    RequestReader, Response, HEADER_LEN, MAX_REQUEST_FRAME,
};

fn one_line(r: &Response) {
    let line = r.line();
    assert!(!line.contains('\n') && !line.contains('\r'), "{line:?}");
}

fn error_reply_round_trips(err: &ProtocolError) {
    let reply = Response::for_error(err);
    let framed = encode_response(&reply);
    match decode_response(&framed) {
        Ok(Some((back, used))) => {
            assert_eq!(used, framed.len());
            assert_eq!(back.line(), reply.line());
        }
        other => panic!("the reply to {err} does not decode: {other:?}"),
    }
}

fn request(data: &[u8]) {
    let whole = decode_request(data);
    match &whole {
        Ok(Some((req, used))) => {
            assert!(*used <= data.len() && *used >= HEADER_LEN);
            assert!(*used - HEADER_LEN <= MAX_REQUEST_FRAME);
            req.validate().expect("a decoded request is valid");
            let again = encode_request(req).expect("a decoded request encodes");
            let (back, n) = decode_request(&again)
                .expect("a re-encoded request decodes")
                .expect("whole");
            assert_eq!(&back, req);
            assert_eq!(n, again.len());
            assert!(req.pack_bytes() <= sandbox_image_door::MAX_PACK_BYTES);
            let _ = req.door();
        }
        Ok(None) => {}
        Err(e) => error_reply_round_trips(e),
    }

    // The adapter's way: read at most `wanted()` bytes at a time.
    let mut reader = RequestReader::new();
    let piece = 1 + data.len() % 13;
    let mut rest = data;
    let mut got: Result<Option<Request>, ProtocolError> = Ok(None);
    while !rest.is_empty() && reader.wanted() > 0 {
        let n = rest.len().min(reader.wanted()).min(piece);
        got = reader.feed(&rest[..n]);
        rest = &rest[n..];
        if !matches!(got, Ok(None)) {
            break;
        }
    }
    match (&whole, &got) {
        (Ok(Some((a, _))), Ok(Some(b))) => assert_eq!(a, b),
        (Ok(None), Ok(None)) => {
            assert!(matches!(reader.closed(), ProtocolError::Truncated { .. }));
        }
        (Err(_), Err(_)) => {}
        _ => panic!("the reader and the decoder disagree: {whole:?} / {got:?}"),
    }
    if matches!(got, Ok(Some(_))) {
        assert_eq!(reader.wanted(), 0);
        assert!(matches!(
            reader.feed(b"x"),
            Err(ProtocolError::OutOfOrder { extra: 1 })
        ));
    }
}

fn response(data: &[u8]) {
    match decode_response(data) {
        Ok(Some((resp, used))) => {
            assert!(used <= data.len());
            one_line(&resp);
            let _ = resp.exit_code();
            let framed = encode_response(&resp);
            let (back, n) = decode_response(&framed)
                .expect("a re-encoded response decodes")
                .expect("whole");
            assert_eq!(n, framed.len());
            assert_eq!(back.line(), resp.line());
        }
        Ok(None) => {}
        Err(e) => error_reply_round_trips(&e),
    }
}

fuzz_target!(|data: &[u8]| {
    request(data);
    response(data);
});
