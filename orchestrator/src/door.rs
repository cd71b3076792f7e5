//! A run's door: a Unix socket in a directory mounted read-only into the
//! sandbox at `/run/nightshift`, beside the static door clients.
//!
//! Invariants:
//! - The door clients are part of this binary (built static by `build.rs`,
//!   embedded) and written into every door (`bin/`, mode 0555) when it
//!   opens; a door whose clients cannot be written does not open, so no run
//!   starts without them. So is the lease wrapper, every sandbox's main
//!   process (`crate::lease`).
//! - One door per run: a request can only ever name its own run's acts,
//!   because the run is the door's, never the request's.
//! - Every connection is bounded: one request of at most the protocol's
//!   frame limit, read within a deadline; at most a few connections are
//!   served at once; a malformed, oversized or slow request gets an error
//!   reply (when the peer is still there) and never stalls the supervisor.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sandbox_image_door::message::{encode_response, RequestReader, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use crate::acts::RunDoor;
use crate::store::{StatePaths, Store};

/// Where the door directory is mounted inside the sandbox.
pub const MOUNT: &str = "/run/nightshift";
pub const SOCKET: &str = "door.sock";
const READ_DEADLINE: Duration = Duration::from_secs(10);
const CONCURRENT: usize = 4;
/// Requests one run's door answers with a decision and an audit entry each;
/// past it, every request is refused at once and the flood is audited once,
/// so a flooding agent cannot grow the audit (or the disk) without bound.
pub const MAX_REQUESTS_PER_RUN: u64 = 1000;

/// The static door clients and the lease wrapper (name, executable), built
/// by `build.rs` from `sandbox-image/door` and carried in this binary.
pub const CLIENTS: [(&str, &[u8]); 3] = [
    (
        "nightshift-act",
        include_bytes!(concat!(env!("OUT_DIR"), "/nightshift-act")),
    ),
    (
        "git-remote-nightshift",
        include_bytes!(concat!(env!("OUT_DIR"), "/git-remote-nightshift")),
    ),
    (
        LEASE_WRAPPER,
        include_bytes!(concat!(env!("OUT_DIR"), "/nightshift-lease")),
    ),
];
/// The sandbox's main process (see `sandbox_image_door::lease`), written
/// into every door's `bin/` beside the clients.
pub const LEASE_WRAPPER: &str = "nightshift-lease";

/// Writes the door clients into `bin` (made if missing), each mode 0555,
/// replacing whatever was there; the error names the file it could not write.
pub fn write_clients(bin: &Path) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let named = |path: &Path, e: std::io::Error| {
        std::io::Error::new(
            e.kind(),
            format!("writing the door client {}: {e}", path.display()),
        )
    };
    std::fs::create_dir_all(bin).map_err(|e| named(bin, e))?;
    for (name, bytes) in CLIENTS {
        let path = bin.join(name);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(named(&path, e)),
            _ => {}
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o555)
            .open(&path)
            .and_then(|mut f| f.write_all(bytes))
            .and_then(|()| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o555)))
            .map_err(|e| named(&path, e))?;
    }
    Ok(())
}

#[derive(Debug)]
pub struct DoorHandle {
    pub dir: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl DoorHandle {
    pub fn close(self) {
        self.task.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Makes the door directory and starts serving its socket.
pub fn open(paths: &StatePaths, door: RunDoor) -> std::io::Result<DoorHandle> {
    let dir = paths.root.join("doors").join(&door.run);
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    write_clients(&dir.join("bin"))?;
    let socket = dir.join(SOCKET);
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket)?;
    // The sandbox's user must be able to connect; the directory is read-only to it.
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))?;
    let limit = Arc::new(tokio::sync::Semaphore::new(CONCURRENT));
    let served = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let paths = paths.clone();
    let door = Arc::new(door);
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let Ok(permit) = limit.clone().acquire_owned().await else {
                return;
            };
            let (paths, door, served) = (paths.clone(), door.clone(), served.clone());
            tokio::spawn(async move {
                let n = served.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                let _ = if n > MAX_REQUESTS_PER_RUN {
                    flooded(stream, &paths, &door.run, n == MAX_REQUESTS_PER_RUN + 1).await
                } else {
                    serve(stream, &paths, door).await
                };
                drop(permit);
            });
        }
    });
    Ok(DoorHandle { dir, task })
}

/// Past the request cap: refused without reading, the first time audited.
async fn flooded(
    mut stream: UnixStream,
    paths: &StatePaths,
    run: &str,
    first: bool,
) -> std::io::Result<()> {
    let response = Response::Refused {
        rule: "nightshift:rate-cap".into(),
        reason: format!(
            "this run's door has answered {MAX_REQUESTS_PER_RUN} requests; it refuses the rest"
        ),
    };
    if first {
        audit_protocol_error(paths, run, &response, "flood").await;
    }
    stream.write_all(&encode_response(&response)).await?;
    stream.shutdown().await
}

async fn serve(
    mut stream: UnixStream,
    paths: &StatePaths,
    door: Arc<RunDoor>,
) -> std::io::Result<()> {
    let mut reader = RequestReader::new();
    let mut buf = vec![0u8; 64 * 1024];
    let read = async {
        loop {
            let want = reader.wanted().clamp(1, buf.len());
            let n = stream.read(&mut buf[..want]).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(Err(reader.closed()));
            }
            match reader.feed(&buf[..n]) {
                Ok(Some(request)) => return Ok(Ok(request)),
                Ok(None) => continue,
                Err(e) => return Ok(Err(e)),
            }
        }
    };
    let response = match tokio::time::timeout(READ_DEADLINE, read).await {
        Err(_) => {
            let response = Response::Error {
                reason: "the request did not arrive in time".into(),
            };
            audit_protocol_error(paths, &door.run, &response, "error").await;
            response
        }
        Ok(Err(e)) => return Err(e),
        Ok(Ok(Err(e))) => {
            let response = Response::for_error(&e);
            audit_protocol_error(paths, &door.run, &response, "error").await;
            response
        }
        Ok(Ok(Ok(request))) => {
            let (paths, door) = (paths.clone(), door.clone());
            tokio::task::spawn_blocking(move || match Store::open(paths) {
                Ok(mut store) => crate::acts::handle(&mut store, &door, request),
                Err(e) => Response::Error {
                    reason: format!("the supervisor's state is unavailable: {e}"),
                },
            })
            .await
            .unwrap_or(Response::Error {
                reason: "the supervisor failed to decide".into(),
            })
        }
    };
    stream.write_all(&encode_response(&response)).await?;
    stream.shutdown().await
}

/// A request that never became one (malformed, oversized, out of order, too
/// slow) is audited too: the door, the verdict and the reason's digest.
async fn audit_protocol_error(paths: &StatePaths, run: &str, response: &Response, verdict: &str) {
    let (paths, run, line, verdict) = (
        paths.clone(),
        run.to_string(),
        response.line(),
        verdict.to_string(),
    );
    let _ = tokio::task::spawn_blocking(move || {
        if let Ok(mut store) = Store::open(paths) {
            let _ = store.append(
                Some(&run),
                &crate::audit_log::Event::DoorRequest {
                    door: "unknown".into(),
                    destination: None,
                    verdict,
                    rule: None,
                    act: None,
                    digest: crate::audit_log::digest(line.as_bytes()),
                    bytes: 0,
                },
                false,
            );
        }
    })
    .await;
}

/// Points the worktree's `origin` at the door (through the git remote helper).
pub fn configure_worktree(worktree: &Path) -> std::io::Result<()> {
    use std::io::Write;
    let mut config = std::fs::OpenOptions::new()
        .append(true)
        .open(worktree.join(".git").join("config"))?;
    write!(
        config,
        "[remote \"origin\"]\n\turl = nightshift::origin\n\tpushurl = nightshift::origin\n"
    )
}
