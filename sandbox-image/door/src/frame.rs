//! Framing: a 4-byte big-endian length, then that many bytes of body.
//!
//! Invariants:
//! - Pure: no I/O. The reader on either side feeds what it has received and
//!   learns whether a whole frame is there, how long it is, or why it is bad.
//! - A declared length over the limit is refused from the 4-byte header
//!   alone, before anything of that size is allocated or read: a peer cannot
//!   make the other side buffer more than `limit` bytes of body.
//! - No input panics: every length is checked before it is used to index.

use thiserror::Error;

/// Bytes in a frame's length prefix.
pub const HEADER_LEN: usize = 4;

/// A frame that cannot be accepted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FrameError {
    /// The length prefix declares more than the limit.
    #[error("frame declares {declared} bytes, over the limit of {limit}")]
    Oversized {
        /// The declared body length.
        declared: u64,
        /// The limit in force.
        limit: usize,
    },
    /// A frame to send is over the limit.
    #[error("frame of {len} bytes to send is over the limit of {limit}")]
    TooLargeToSend {
        /// The body length.
        len: usize,
        /// The limit in force.
        limit: usize,
    },
}

/// The body length a header declares, refused if over `limit`.
pub fn frame_len(header: [u8; HEADER_LEN], limit: usize) -> Result<usize, FrameError> {
    let declared = u32::from_be_bytes(header);
    match usize::try_from(declared) {
        Ok(len) if len <= limit => Ok(len),
        _ => Err(FrameError::Oversized {
            declared: u64::from(declared),
            limit,
        }),
    }
}

/// Decodes one frame from the front of `buf`.
///
/// `Ok(None)`: not all of it is there yet (the header, if present, has
/// already been checked against `limit`). `Ok(Some((body, used)))`: the
/// body, and how many bytes of `buf` the frame took (header included).
pub fn decode_frame(buf: &[u8], limit: usize) -> Result<Option<(&[u8], usize)>, FrameError> {
    let Some(header) = buf.first_chunk::<HEADER_LEN>() else {
        return Ok(None);
    };
    let len = frame_len(*header, limit)?;
    let rest = &buf[HEADER_LEN..];
    match rest.get(..len) {
        Some(body) => Ok(Some((body, HEADER_LEN + len))),
        None => Ok(None),
    }
}

/// Frames `body`, refused if it is over `limit`.
pub fn encode_frame(body: &[u8], limit: usize) -> Result<Vec<u8>, FrameError> {
    let too_large = || FrameError::TooLargeToSend {
        len: body.len(),
        limit,
    };
    if body.len() > limit {
        return Err(too_large());
    }
    let len = u32::try_from(body.len()).map_err(|_| too_large())?;
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(body);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_frame_round_trips_and_reports_its_length() {
        let framed = encode_frame(b"hello", 16).unwrap();
        assert_eq!(framed, b"\0\0\0\x05hello");
        let mut more = framed.clone();
        more.extend_from_slice(b"next");
        assert_eq!(decode_frame(&more, 16).unwrap(), Some((&b"hello"[..], 9)));
    }

    #[test]
    fn a_partial_frame_asks_for_more() {
        let framed = encode_frame(b"hello", 16).unwrap();
        for cut in 0..framed.len() {
            assert_eq!(decode_frame(&framed[..cut], 16).unwrap(), None, "cut {cut}");
        }
    }

    #[test]
    fn the_limit_itself_is_accepted_and_one_more_is_not() {
        assert_eq!(frame_len(8u32.to_be_bytes(), 8), Ok(8));
        assert_eq!(
            frame_len(9u32.to_be_bytes(), 8),
            Err(FrameError::Oversized {
                declared: 9,
                limit: 8
            })
        );
        assert!(encode_frame(&[0; 9], 8).is_err());
        assert!(encode_frame(&[0; 8], 8).is_ok());
    }

    #[test]
    fn an_oversized_header_is_refused_with_nothing_after_it() {
        let header = u32::MAX.to_be_bytes();
        assert!(matches!(
            decode_frame(&header, 1024),
            Err(FrameError::Oversized { declared, .. }) if declared == u64::from(u32::MAX)
        ));
    }

    proptest! {
        #[test]
        fn decoding_random_bytes_never_panics_and_stays_within_the_limit(
            buf in proptest::collection::vec(any::<u8>(), 0..600),
            limit in 0usize..512,
        ) {
            match decode_frame(&buf, limit) {
                Ok(Some((body, used))) => {
                    prop_assert!(body.len() <= limit);
                    prop_assert_eq!(used, HEADER_LEN + body.len());
                    prop_assert!(used <= buf.len());
                }
                Ok(None) => {
                    // Either no whole header, or a header within the limit
                    // whose body has not all arrived.
                    if buf.len() >= HEADER_LEN {
                        let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
                        prop_assert!(len <= limit && buf.len() < HEADER_LEN + len);
                    }
                }
                Err(FrameError::Oversized { declared, .. }) => {
                    prop_assert!(declared > limit as u64);
                }
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
        }

        #[test]
        fn an_oversized_prefix_is_refused_from_the_header_alone(
            declared in any::<u32>(),
            limit in 0usize..1 << 20,
        ) {
            let header = declared.to_be_bytes();
            let verdict = decode_frame(&header, limit);
            if declared as usize > limit {
                prop_assert!(verdict.is_err());
            } else if declared == 0 {
                prop_assert_eq!(verdict, Ok(Some((&b""[..], HEADER_LEN))));
            } else {
                prop_assert_eq!(verdict, Ok(None));
            }
        }
    }
}
