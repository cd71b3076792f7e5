//! The clients' side of the socket: blocking std I/O, no runtime.
//!
//! Invariants:
//! - One request per connection: connect, write the frame and then the
//!   pack it declares (exactly `pack_bytes` bytes), shut down the writing
//!   half, read exactly one response frame (its length checked from
//!   the header before its body is read), and close.
//! - Nothing waits forever: connecting, writing and reading are each bounded
//!   by the timeout ([`DoorAddress::timeout`]).
//! - The environment is read through one injectable lookup
//!   ([`DoorAddress::from_lookup`]), so tests need no process-wide state.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use thiserror::Error;

use crate::frame::{frame_len, FrameError, HEADER_LEN};
use crate::local_git::Pack;
use crate::message::{
    encode_request, parse_response, ProtocolError, Request, Response, MAX_RESPONSE_FRAME,
};

/// Where the door's socket is when `$NIGHTSHIFT_DOOR` is not set.
pub const DEFAULT_SOCKET: &str = "/run/nightshift/door.sock";
/// The variable naming the door's socket.
pub const ENV_SOCKET: &str = "NIGHTSHIFT_DOOR";
/// The variable bounding each wait, in whole seconds.
pub const ENV_TIMEOUT: &str = "NIGHTSHIFT_DOOR_TIMEOUT_SECS";
/// Each wait's bound when `$NIGHTSHIFT_DOOR_TIMEOUT_SECS` is not set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the door is and how long to wait for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoorAddress {
    /// The socket.
    pub path: PathBuf,
    /// The bound on connecting, on writing and on reading.
    pub timeout: Duration,
}

/// Talking to the door failed.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The timeout variable is not a whole number of seconds from 1.
    #[error("{ENV_TIMEOUT}={value:?} is not a whole number of seconds from 1")]
    BadTimeout {
        /// What it holds.
        value: String,
    },
    /// No door at the path.
    #[error("door unreachable at {path}: {source}")]
    Unreachable {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The door did not answer in time.
    #[error("door at {path} did not {doing} within {secs} s")]
    Timeout {
        /// The socket.
        path: PathBuf,
        /// What was waited for.
        doing: &'static str,
        /// The bound.
        secs: u64,
    },
    /// Reading or writing the socket failed.
    #[error("{doing} door at {path}: {source}")]
    Io {
        /// What was being done.
        doing: &'static str,
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The pack to send is not as long as the request declares.
    #[error("the request declares a pack of {declared} bytes but {len} are at hand")]
    PackLength {
        /// What the request says.
        declared: u64,
        /// What there is.
        len: u64,
    },
    /// The request or the answer breaks the protocol.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
}

impl DoorAddress {
    /// The address from the environment, looked up through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<OsString>) -> Result<Self, ClientError> {
        let path = get(ENV_SOCKET)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET));
        let timeout = match get(ENV_TIMEOUT) {
            None => DEFAULT_TIMEOUT,
            Some(raw) => {
                let text = raw.to_string_lossy().into_owned();
                match text.trim().parse::<u64>() {
                    Ok(secs) if secs >= 1 => Duration::from_secs(secs),
                    _ => return Err(ClientError::BadTimeout { value: text }),
                }
            }
        };
        Ok(DoorAddress { path, timeout })
    }

    /// The address from this process's environment.
    pub fn from_env() -> Result<Self, ClientError> {
        Self::from_lookup(|name| std::env::var_os(name))
    }
}

/// Prints the door's answer as a client does (one line: on standard output
/// when queued or done, on standard error otherwise) and gives the exit
/// code it means.
pub fn print_answer(response: &Response) -> i32 {
    let line = response.line();
    if response.exit_code() == 0 {
        println!("{line}");
    } else {
        eprintln!("{line}");
    }
    response.exit_code()
}

/// Sends `request` (which carries no pack) through the door and returns
/// its answer.
pub fn send(door: &DoorAddress, request: &Request) -> Result<Response, ClientError> {
    send_with_pack(door, request, None)
}

/// Sends `request` and then the pack it declares through the door, and
/// returns its answer. The pack's length must be what the request says.
pub fn send_with_pack(
    door: &DoorAddress,
    request: &Request,
    pack: Option<&mut Pack>,
) -> Result<Response, ClientError> {
    let declared = request.pack_bytes();
    let len = pack.as_ref().map_or(0, |p| p.len);
    if declared != len {
        return Err(ClientError::PackLength { declared, len });
    }
    let framed = encode_request(request)?;
    let mut stream = connect(door)?;
    let io_err = |waiting_for: &'static str, doing: &'static str| {
        move |source: io::Error| {
            if matches!(
                source.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                ClientError::Timeout {
                    path: door.path.clone(),
                    doing: waiting_for,
                    secs: door.timeout.as_secs(),
                }
            } else {
                ClientError::Io {
                    doing,
                    path: door.path.clone(),
                    source,
                }
            }
        }
    };
    stream
        .set_write_timeout(Some(door.timeout))
        .and_then(|()| stream.set_read_timeout(Some(door.timeout)))
        .map_err(io_err(
            "get ready",
            "setting timeouts on the connection to the",
        ))?;
    let written = stream.write_all(&framed).and_then(|()| match pack {
        Some(pack) => {
            let copied = io::copy(&mut (&mut pack.file).take(pack.len), &mut stream)?;
            if copied != pack.len {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the pack shrank while it was sent",
                ));
            }
            stream.flush()
        }
        None => stream.flush(),
    });
    // A door that stopped reading early (it refuses a bad frame as soon as
    // it sees it) has still answered: read that answer, and report the
    // failed write only if there is none.
    let written = match written {
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ) =>
        {
            Err(io_err("take the request", "writing the request to the")(e))
        }
        other => {
            other.map_err(io_err("take the request", "writing the request to the"))?;
            Ok(())
        }
    };
    let _ = stream.shutdown(Shutdown::Write);
    match read_response(&mut stream, door) {
        Ok(response) => Ok(response),
        // Nothing came back: the failed write is the story.
        Err(
            read_error @ (ClientError::Io { .. }
            | ClientError::Protocol(ProtocolError::Truncated { have: 0, .. })),
        ) => Err(written.err().unwrap_or(read_error)),
        // Something came back and was wrong: that is the story.
        Err(read_error) => Err(read_error),
    }
}

fn read_response(stream: &mut UnixStream, door: &DoorAddress) -> Result<Response, ClientError> {
    let mut header = [0u8; HEADER_LEN];
    read_full(stream, &mut header, door).map_err(|e| e.with_need(HEADER_LEN))?;
    let len = frame_len(header, MAX_RESPONSE_FRAME).map_err(|source: FrameError| {
        ProtocolError::Frame {
            what: "response",
            source,
        }
    })?;
    let mut body = vec![0u8; len];
    read_full(stream, &mut body, door).map_err(|e| e.with_need(HEADER_LEN + len))?;
    Ok(parse_response(&body)?)
}

/// Connects, bounded by the timeout (std has no connect timeout for Unix
/// sockets, and a listener whose backlog is full makes connect block).
fn connect(door: &DoorAddress) -> Result<UnixStream, ClientError> {
    let (tx, rx) = mpsc::channel();
    let path = door.path.clone();
    // If the door never accepts, this thread stays blocked until the
    // process exits, which the timeout below makes soon.
    thread::spawn(move || {
        let _ = tx.send(UnixStream::connect(path));
    });
    match rx.recv_timeout(door.timeout) {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(source)) => Err(ClientError::Unreachable {
            path: door.path.clone(),
            source,
        }),
        Err(_) => Err(ClientError::Timeout {
            path: door.path.clone(),
            doing: "accept the connection",
            secs: door.timeout.as_secs(),
        }),
    }
}

/// A short read: how far it got, to be told against what was needed.
enum ReadFailure {
    Closed { have: usize },
    Failed(ClientError),
}

impl ReadFailure {
    fn with_need(self, need: usize) -> ClientError {
        match self {
            ReadFailure::Closed { have } => ClientError::Protocol(ProtocolError::Truncated {
                what: "response",
                have,
                need,
            }),
            ReadFailure::Failed(e) => e,
        }
    }
}

fn read_full(
    stream: &mut UnixStream,
    buf: &mut [u8],
    door: &DoorAddress,
) -> Result<(), ReadFailure> {
    let mut have = 0;
    while have < buf.len() {
        match stream.read(&mut buf[have..]) {
            Ok(0) => return Err(ReadFailure::Closed { have }),
            Ok(n) => have += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(ReadFailure::Failed(ClientError::Timeout {
                    path: door.path.clone(),
                    doing: "answer",
                    secs: door.timeout.as_secs(),
                }))
            }
            Err(source) => {
                return Err(ReadFailure::Failed(ClientError::Io {
                    doing: "reading the answer from the",
                    path: door.path.clone(),
                    source,
                }))
            }
        }
    }
    Ok(())
}

/// Reads a body file (`-`: standard input) of at most `limit` bytes of
/// UTF-8, without reading more than one byte past the limit.
pub fn read_body_file(file: &str, limit: usize) -> Result<String, BodyFileError> {
    let shown = || file.to_string();
    let mut bytes = Vec::new();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    let result = if file == "-" {
        io::stdin().lock().take(cap).read_to_end(&mut bytes)
    } else {
        std::fs::File::open(file).and_then(|f| f.take(cap).read_to_end(&mut bytes))
    };
    result.map_err(|source| BodyFileError::Read {
        file: shown(),
        source,
    })?;
    if bytes.len() > limit {
        return Err(BodyFileError::TooLarge {
            file: shown(),
            limit,
        });
    }
    String::from_utf8(bytes).map_err(|e| BodyFileError::NotUtf8 {
        file: shown(),
        at: e.utf8_error().valid_up_to(),
    })
}

/// A body file that cannot be sent.
#[derive(Debug, Error)]
pub enum BodyFileError {
    /// Reading it failed.
    #[error("reading {file}: {source}")]
    Read {
        /// The file.
        file: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// It is over the limit.
    #[error("{file} is over the limit of {limit} bytes")]
    TooLarge {
        /// The file.
        file: String,
        /// The limit.
        limit: usize,
    },
    /// It is not UTF-8.
    #[error("{file} is not UTF-8 (from byte {at})")]
    NotUtf8 {
        /// The file.
        file: String,
        /// The first bad byte.
        at: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_comes_from_the_lookup() {
        let none = DoorAddress::from_lookup(|_| None).unwrap();
        assert_eq!(none.path, PathBuf::from(DEFAULT_SOCKET));
        assert_eq!(none.timeout, DEFAULT_TIMEOUT);
        let set = DoorAddress::from_lookup(|name| match name {
            ENV_SOCKET => Some("/tmp/d.sock".into()),
            ENV_TIMEOUT => Some("5".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(set.path, PathBuf::from("/tmp/d.sock"));
        assert_eq!(set.timeout, Duration::from_secs(5));
        for bad in ["0", "-1", "soon", ""] {
            assert!(
                DoorAddress::from_lookup(|name| (name == ENV_TIMEOUT).then(|| bad.into())).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn body_files_are_bounded_and_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
        std::fs::write(path("ok"), "hello\n").unwrap();
        std::fs::write(path("big"), "x".repeat(11)).unwrap();
        std::fs::write(path("bin"), b"ab\xff").unwrap();
        assert_eq!(read_body_file(&path("ok"), 10).unwrap(), "hello\n");
        assert!(matches!(
            read_body_file(&path("big"), 10),
            Err(BodyFileError::TooLarge { .. })
        ));
        assert!(matches!(
            read_body_file(&path("bin"), 10),
            Err(BodyFileError::NotUtf8 { at: 2, .. })
        ));
        assert!(matches!(
            read_body_file(&path("missing"), 10),
            Err(BodyFileError::Read { .. })
        ));
    }
}
