//! `nightshift-relay`: the model gateway's relay inside the sandbox.
//!
//! `nightshift-relay --port PORT [--socket PATH]`
//!
//! Most model clients cannot speak to a Unix socket. The relay listens on the
//! sandbox's own loopback (`127.0.0.1:PORT`; the sandbox has no other
//! interface) and forwards each connection, byte for byte in both
//! directions, to the run's model socket (`/run/nightshift/model.sock` by
//! default), where the supervisor's gateway serves it. It knows nothing of
//! HTTP, keys or models: everything that matters is decided on the
//! supervisor's side, so an agent that kills or replaces the relay gains
//! nothing it could not do by connecting to the socket itself.
//!
//! Bounds: at most [`MAX_CONNECTIONS`] connections at once (more are closed
//! at once); two threads per connection.
//!
//! The lease wrapper (`nightshift-lease --relay PORT`) starts it before the
//! agent and waits until it listens; it ends with the sandbox.

#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const DEFAULT_SOCKET: &str = "/run/nightshift/model.sock";
const MAX_CONNECTIONS: usize = 64;
const USAGE: &str = "usage: nightshift-relay --port PORT [--socket PATH]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut port = None;
    let mut bad = false;
    let mut socket = DEFAULT_SOCKET.to_string();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match (a.as_str(), it.next()) {
            ("--port", Some(p)) => port = p.parse::<u16>().ok().filter(|p| *p > 0),
            ("--socket", Some(s)) => socket = s.clone(),
            _ => bad = true,
        }
    }
    let port = if bad { None } else { port };
    let Some(port) = port else {
        eprintln!("nightshift-relay: {USAGE}");
        return ExitCode::from(2);
    };
    let listener = match TcpListener::bind(("127.0.0.1", port)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("nightshift-relay: listening on 127.0.0.1:{port}: {e}");
            return ExitCode::from(1);
        }
    };
    let open = Arc::new(AtomicUsize::new(0));
    for incoming in listener.incoming() {
        let Ok(tcp) = incoming else { continue };
        if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::SeqCst);
            drop(tcp);
            continue;
        }
        let (open, socket) = (open.clone(), socket.clone());
        std::thread::spawn(move || {
            relay(tcp, &socket);
            open.fetch_sub(1, Ordering::SeqCst);
        });
    }
    ExitCode::SUCCESS
}

/// Copies both ways until each side has ended.
fn relay(tcp: TcpStream, socket: &str) {
    let Ok(unix) = UnixStream::connect(socket) else {
        // No gateway: answer as an HTTP server would, so the client says why.
        let mut tcp = tcp;
        let body = "{\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"nightshift's model gateway is not available in this run\"}}";
        let _ = write!(
            tcp,
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        return;
    };
    let _ = tcp.set_nodelay(true);
    let (Ok(tcp_in), Ok(unix_out)) = (tcp.try_clone(), unix.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || {
        copy(tcp_in, unix_out, |s| {
            let _ = s.shutdown(Shutdown::Write);
        })
    });
    copy(unix, tcp, |s| {
        let _ = s.shutdown(Shutdown::Write);
    });
    let _ = up.join();
}

fn copy<R: Read, W: Write>(mut from: R, mut to: W, done: impl FnOnce(&W)) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    done(&to);
}
