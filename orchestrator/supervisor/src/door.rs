//! A run's door: served on the run's door channel (on Docker and Podman a
//! Unix socket in a directory mounted read-only into the sandbox at
//! `/run/nightshift`, beside the static door clients: `channels.rs`,
//! `orchestrator/attest/tests/fixtures.rs::writable_door_fails_mounts`, `tests/tests/acts.rs::night_to_morning`).
//!
//! Invariants:
//! - The door clients are part of this binary (built static by `build.rs`,
//!   embedded) and written into every run's channel directory (`bin/`, mode
//!   0555) when it opens; a directory whose clients cannot be written does
//!   not open, so no run starts without them (`channels.rs`). So is the lease wrapper, every sandbox's main
//!   process (`nightshift_engine_docker::lease`).
//! - One door per run: a request can only ever name its own run's acts,
//!   because the run is the door's, never the request's (a request has no
//!   field for a run, and any field it does not have is refused:
//!   `sandbox-image/door/src/message.rs::tests::malformed_requests_are_refused_with_a_reason`;
//!   a sandbox sees its own door alone: `tests/tests/acts.rs::night_to_morning`).
//! - Every connection is bounded: one request of at most the protocol's
//!   frame limit, read within a deadline; at most a few connections are
//!   served at once; a malformed, oversized or slow request gets an error
//!   reply (when the peer is still there) and never stalls the supervisor
//!   (`tests/tests/acts.rs::malformed_and_oversized_door_requests_get_an_error_and_an_audit_entry`,
//!   `tests/tests/channels.rs::a_flood_of_door_frames_keeps_the_supervisor_small_and_the_door_open`).
//! - A policy check (a harness's pre-tool hook, protocol version 3) is a
//!   question answered at once under the run's rules, never an act: an
//!   allow writes nothing; each refusal and ask is audited and counts
//!   against [`MAX_REQUESTS_PER_RUN`], so an agent cannot grow the audit
//!   without bound, while allowed checks do not use up the run's requests
//!   (`tests/tests/hook_door.rs::a_hook_payload_from_inside_a_sandbox_is_decided_by_the_runs_rules_and_fails_closed`;
//!   the count of allowed checks has no test).
//! - The objects of a push or pull request arrive as a pack after the
//!   request (protocol version 2 on): its declared size is refused over
//!   [`MAX_PACK_BYTES`] per request or [`MAX_PACK_BYTES_PER_RUN`] per run
//!   before a byte of it is read; it is read within a deadline that grows
//!   with its size, into a scratch directory the supervisor owns
//!   (`STATE/scratch/<run>/<n>`, never the worktree), and that directory is
//!   removed once the request is answered. What the pack would cost once
//!   inflated is checked from its headers before anything inflates it
//!   (`orchestrator_git::scan_pack`, called by the gate's binding), so a
//!   delta bomb is refused for the price of a 32 KiB buffer. Nothing here,
//!   nor in the gate, reads the run's worktree: the host never opens the
//!   sandbox's `.git` while the sandbox runs
//!   (`tests/tests/door_races.rs::oversized_truncated_and_unconnected_packs_are_refused_and_audited`,
//!   `tests/tests/packs.rs::delta_bombs_are_refused_before_inflating_and_the_run_goes_on`,
//!   `tests/tests/door_races.rs::a_fifo_or_a_sparse_10gb_file_for_a_loose_object_neither_blocks_nor_bloats_the_door`).
//! - A reply never holds a host path: the gate's texts are phrased for the
//!   agent, and [`without_host_paths`] replaces any path of the supervisor's
//!   (state directory, host repository) that a lower layer let through
//!   (`tests::replies_are_scrubbed_of_host_paths`,
//!   `tests/tests/door_races.rs::a_pull_requests_head_tells_nothing_about_host_files`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sandbox_image_door::message::{encode_response, Request, RequestReader, Response};
pub use sandbox_image_door::MAX_PACK_BYTES;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::Instrument as _;

use crate::acts::RunDoor;
use nightshift_core::channel::{ChannelListener, ChannelStream};
use nightshift_core::state_store::{StatePaths, Stores};

/// Where the door directory is mounted inside the sandbox.
pub const MOUNT: &str = "/run/nightshift";
pub const SOCKET: &str = "door.sock";
const READ_DEADLINE: Duration = Duration::from_secs(10);
/// Most bytes of pack one run's door takes over the whole run.
pub const MAX_PACK_BYTES_PER_RUN: u64 = 2 << 30;
/// The slowest a pack may arrive: its deadline is [`READ_DEADLINE`] plus
/// its size at this rate (512 MiB: 266 s).
const MIN_PACK_RATE: u64 = 2 << 20;
/// What a reply says in place of a host path.
const HIDDEN_PATH: &str = "<supervisor path>";
const CONCURRENT: usize = 4;
/// Requests one run's door answers with a decision and an audit entry each;
/// past it, every request is refused at once and the flood is audited once,
/// so a flooding agent cannot grow the audit (or the disk) without bound.
pub const MAX_REQUESTS_PER_RUN: u64 = 1000;

/// The static door clients, the lease wrapper and the end-of-run packer
/// (name, executable), built by `build.rs` from `sandbox-image/door` and
/// `sandbox-image/result` and carried in this binary.
pub const CLIENTS: [(&str, &[u8]); 5] = [
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
    (
        nightshift_core::sandbox::RELAY,
        include_bytes!(concat!(env!("OUT_DIR"), "/nightshift-relay")),
    ),
    (
        PACKER,
        include_bytes!(concat!(env!("OUT_DIR"), "/nightshift-result")),
    ),
];
/// The sandbox's main process (see `sandbox_image_door::lease`), written
/// into every door's `bin/` beside the clients.
pub const LEASE_WRAPPER: &str = "nightshift-lease";
/// The end-of-run packer (`run::packer`), written into every door's `bin/`.
pub const PACKER: &str = "nightshift-result";

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
    /// `STATE/scratch/<run>`: where this door's packs are received.
    scratch: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

/// A handle dropped without `close` (its run's lifecycle panicked in a
/// process that goes on) still stops serving.
impl Drop for DoorHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DoorHandle {
    /// Stops serving and removes the door's scratch directory (its channel
    /// is the run's channels' to close).
    pub fn close(self) {
        self.task.abort();
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// Serves the run's door on `listener` (its channel: `channels.rs`).
pub fn open(stores: &Stores, door: RunDoor, mut listener: impl ChannelListener) -> DoorHandle {
    let paths = &StatePaths::new(stores.root().to_path_buf());
    let limit = Arc::new(tokio::sync::Semaphore::new(CONCURRENT));
    let served = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let packed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let scratch = paths.root.join("scratch").join(&door.run);
    let stores = stores.clone();
    let door = Arc::new(door);
    let task = tokio::spawn(async move {
        loop {
            let Ok(stream) = listener.accept().await else {
                continue;
            };
            let Ok(permit) = limit.clone().acquire_owned().await else {
                return;
            };
            let (stores, door, served, packed) =
                (stores.clone(), door.clone(), served.clone(), packed.clone());
            // One span per request, named by the door's run (never the
            // request's: see the note above).
            let span = tracing::info_span!("door", run = %door.run);
            tokio::spawn(
                async move {
                    let _ = serve(stream, &stores, door, &served, &packed).await;
                    drop(permit);
                }
                .instrument(span),
            );
        }
    });
    DoorHandle { scratch, task }
}

/// Past the request cap: refused, the first time audited.
async fn flooded(stores: &Stores, run: &str, door: &str, first: bool) -> Response {
    let response = Response::Refused {
        rule: "nightshift:rate-cap".into(),
        reason: format!(
            "this run's door has answered {MAX_REQUESTS_PER_RUN} requests; it refuses the rest"
        ),
    };
    if first {
        audit_protocol_error(stores, run, Some(door), &response, "flood", "flood").await;
    }
    response
}

async fn serve(
    mut stream: impl ChannelStream,
    stores: &Stores,
    door: Arc<RunDoor>,
    served: &std::sync::atomic::AtomicU64,
    packed: &std::sync::atomic::AtomicU64,
) -> std::io::Result<()> {
    let paths = &StatePaths::new(stores.root().to_path_buf());
    // The door's latency, from the connection to the answer (`/metrics`).
    let began = std::time::Instant::now();
    let mut door_name = "malformed";
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
            audit_protocol_error(stores, &door.run, None, &response, "error", "too_slow").await;
            response
        }
        Ok(Err(e)) => return Err(e),
        Ok(Ok(Err(e))) => {
            let response = Response::for_error(&e);
            audit_protocol_error(stores, &door.run, None, &response, "error", e.code()).await;
            response
        }
        // The end-of-run packer's door takes its result and nothing else.
        Ok(Ok(Ok(request)))
            if door.result.is_some() && !matches!(request, Request::Result { .. }) =>
        {
            door_name = request.door();
            let response = Response::Refused {
                rule: "nightshift:result".into(),
                reason: "the end-of-run packer's door takes only the run's result".into(),
            };
            audit_protocol_error(
                stores,
                &door.run,
                Some(request.door()),
                &response,
                "refused",
                "not_a_result",
            )
            .await;
            response
        }
        // A policy check is a question, answered at once; only its refusals
        // and asks are audited, and count against the run's cap.
        Ok(Ok(Ok(Request::PolicyCheck { payload }))) => {
            door_name = "policy_check";
            tracing::debug!(door = "policy_check", "door request");
            let (stores2, door2, span) = (stores.clone(), door.clone(), tracing::Span::current());
            let checked = tokio::task::spawn_blocking(move || {
                span.in_scope(|| crate::acts::policy_check(&stores2, &door2, &payload))
            })
            .await
            .unwrap_or(crate::acts::Checked {
                response: Response::Refused {
                    rule: "nightshift:hook-internal".into(),
                    reason: "the supervisor failed to decide".into(),
                },
                audited: false,
            });
            if checked.audited {
                let n = served.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                if n > MAX_REQUESTS_PER_RUN {
                    flooded(
                        stores,
                        &door.run,
                        "policy_check",
                        n == MAX_REQUESTS_PER_RUN + 1,
                    )
                    .await
                } else {
                    checked.response
                }
            } else {
                checked.response
            }
        }
        // The run's result: only the end-of-run packer's door takes one.
        Ok(Ok(Ok(request @ Request::Result { .. }))) => {
            door_name = "result";
            tracing::info!(door = "result", "door request");
            serve_result(&mut stream, stores, &door, request, packed).await
        }
        Ok(Ok(Ok(request))) => {
            door_name = request.door();
            tracing::info!(door = request.door(), "door request");
            let n = served.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            if n > MAX_REQUESTS_PER_RUN {
                let response = flooded(
                    stores,
                    &door.run,
                    request.door(),
                    n == MAX_REQUESTS_PER_RUN + 1,
                )
                .await;
                let response = without_host_paths(&response, &[&paths.root, &door.repo]);
                log_verdict(&response);
                nightshift_core::metrics::observe_door(door_name, began.elapsed().as_secs_f64());
                stream.write_all(&encode_response(&response)).await?;
                return stream.shutdown().await;
            }
            let scratch = paths
                .root
                .join("scratch")
                .join(&door.run)
                .join(n.to_string());
            let response = match receive(&mut stream, &scratch, &request, packed).await {
                Err(response) => {
                    audit_protocol_error(
                        stores,
                        &door.run,
                        Some(request.door()),
                        &response,
                        "error",
                        "pack",
                    )
                    .await;
                    response
                }
                Ok(received) => {
                    let (stores, door) = (stores.clone(), door.clone());
                    // The gate's events in this request's span too.
                    let span = tracing::Span::current();
                    tokio::task::spawn_blocking(move || match stores.connect() {
                        Ok(mut store) => span.in_scope(|| {
                            crate::acts::handle(&mut store, &door, request, received.as_ref())
                        }),
                        Err(_) => Response::Error {
                            reason: "the supervisor's state is unavailable; try again later".into(),
                        },
                    })
                    .await
                    .unwrap_or(Response::Error {
                        reason: "the supervisor failed to decide".into(),
                    })
                }
            };
            let _ = tokio::fs::remove_dir_all(&scratch).await;
            response
        }
    };
    let response = without_host_paths(&response, &[&paths.root, &door.repo]);
    log_verdict(&response);
    nightshift_core::metrics::observe_door(door_name, began.elapsed().as_secs_f64());
    stream.write_all(&encode_response(&response)).await?;
    stream.shutdown().await
}

/// The door's answer to a result request: only the end-of-run packer's
/// door takes one, once (`run::packer`).
async fn serve_result(
    stream: &mut impl ChannelStream,
    stores: &Stores,
    door: &Arc<RunDoor>,
    request: Request,
    packed: &std::sync::atomic::AtomicU64,
) -> Response {
    let refuse = |reason: &str| Response::Refused {
        rule: "nightshift:result".into(),
        reason: reason.into(),
    };
    let Some(slot) = door.result.clone() else {
        let response = refuse(
            "a run's result is made by nightshift after its agent exits; the agent's door takes none",
        );
        audit_protocol_error(
            stores,
            &door.run,
            Some("result"),
            &response,
            "refused",
            "result_from_the_run",
        )
        .await;
        return response;
    };
    if !slot.begin() {
        return refuse("this run's result was already sent");
    }
    let Request::Result {
        result_commit,
        agent_tip,
        observed_commit,
        tip_source: _,
        skipped,
        skipped_total: _,
        ignored: _,
        history_dropped,
        pack_bytes,
    } = request.clone()
    else {
        slot.end(Err(("internal", "not a result".into())));
        return Response::Error {
            reason: "not a result".into(),
        };
    };
    let paths = StatePaths::new(stores.root().to_path_buf());
    let scratch = paths.root.join("scratch").join(&door.run).join("result");
    let _ = tokio::fs::remove_dir_all(&scratch).await;
    let received = match receive(stream, &scratch, &request, packed).await {
        Ok(Some(received)) => received,
        Ok(None) => {
            slot.end(Err(("result_refused", "it carried no pack".into())));
            return Response::Error {
                reason: "a result carries a pack".into(),
            };
        }
        Err(response) => {
            slot.end(Err(("result_refused", response.line())));
            let _ = tokio::fs::remove_dir_all(&scratch).await;
            return response;
        }
    };
    let (repo, run, base) = (
        door.repo.clone(),
        door.run.clone(),
        door.base_commit.clone(),
    );
    let claim = (
        result_commit.clone(),
        agent_tip.clone(),
        observed_commit.clone(),
    );
    let taken = tokio::task::spawn_blocking(move || {
        orchestrator_git::take_result(
            &repo,
            &received.dir,
            received.pack.as_deref(),
            &run,
            &base,
            &orchestrator_git::ResultClaim {
                result_commit: &claim.0,
                agent_tip: &claim.1,
                observed_commit: claim.2.as_deref(),
            },
            orchestrator_git::ImportLimits::default(),
        )
    })
    .await;
    let _ = tokio::fs::remove_dir_all(&scratch).await;
    match taken {
        Ok(Ok(captured)) => {
            slot.end(Ok((
                crate::landing::Landed {
                    agent_tip,
                    observed_commit,
                    result_commit: captured.commit,
                    tree: captured.tree,
                    files_changed: captured.files_changed,
                    insertions: captured.insertions,
                    deletions: captured.deletions,
                    skipped: skipped
                        .iter()
                        .map(|s| serde_json::json!({"path": s.path, "why": s.why}))
                        .collect(),
                    dropped: history_dropped.map(|h| crate::landing::Dropped {
                        kind: h.kind,
                        object: h.object,
                        size: h.size,
                        limit: h.limit,
                        why: h.why,
                    }),
                },
                pack_bytes,
            )));
            Response::Done {
                detail: "the result was taken".into(),
            }
        }
        Ok(Err(e)) => {
            let why = chain(&e);
            slot.end(Err((
                orchestrator_git::import_failure_kind(&e),
                why.clone(),
            )));
            Response::Error { reason: why }
        }
        Err(e) => {
            slot.end(Err(("internal", e.to_string())));
            Response::Error {
                reason: "the supervisor failed to take the result".into(),
            }
        }
    }
}

pub(crate) use sandbox_image_door::validate::error_chain as chain;

/// The door's answer as a log event: the verdict and its rule or act. The
/// reasons are the gate's words about agent-made values; they go to the log
/// as fields, which its writer escapes (`terminal::NetStderr`, `JsonStderr`).
fn log_verdict(response: &Response) {
    match response {
        Response::Refused { rule, reason } => {
            tracing::info!(verdict = "refused", rule = %rule, reason = %reason, "door verdict")
        }
        Response::Asks { rule, reason } => {
            tracing::info!(verdict = "asks", rule = %rule, reason = %reason, "door verdict")
        }
        Response::Queued { act } => tracing::info!(verdict = "queued", act = %act, "door verdict"),
        Response::Done { detail } => {
            tracing::info!(verdict = "done", detail = %detail, "door verdict")
        }
        Response::Error { reason } => {
            tracing::info!(verdict = "error", reason = %reason, "door verdict")
        }
    }
}

/// Reads the pack a request declares into `scratch` (made here, 0700).
/// `Ok(None)` for a request that carries no objects (notify, ask, a
/// deletion); an error reply for a pack over the run's budget, cut short,
/// or too slow.
pub(crate) async fn receive(
    stream: &mut impl ChannelStream,
    scratch: &Path,
    request: &Request,
    packed: &std::sync::atomic::AtomicU64,
) -> Result<Option<crate::acts::Received>, Response> {
    use std::sync::atomic::Ordering;
    let carries_objects = match request {
        Request::Push { delete, .. } => !delete,
        Request::PullRequest { .. } | Request::Result { .. } => true,
        Request::Notify { .. } | Request::Ask { .. } | Request::PolicyCheck { .. } => false,
    };
    if !carries_objects {
        return Ok(None);
    }
    let declared = request.pack_bytes();
    // The per-request cap was checked when the request was decoded; the
    // run's budget is checked here, from the request alone.
    let before = packed.fetch_add(declared, Ordering::SeqCst);
    if before.saturating_add(declared) > MAX_PACK_BYTES_PER_RUN {
        return Err(Response::Error {
            reason: format!(
                "this run's door has taken {before} bytes of packs; a pack of {declared} more would pass the run's limit of {MAX_PACK_BYTES_PER_RUN}"
            ),
        });
    }
    let trouble = |why: &str| Response::Error {
        reason: format!("the supervisor could not take the pack: {why}; try again later"),
    };
    tokio::fs::create_dir_all(scratch)
        .await
        .map_err(|_| trouble("making its scratch directory failed"))?;
    let _ = tokio::fs::set_permissions(scratch, std::fs::Permissions::from_mode(0o700)).await;
    if declared == 0 {
        return Ok(Some(crate::acts::Received {
            dir: scratch.to_path_buf(),
            pack: None,
        }));
    }
    let path = scratch.join("received.pack");
    let mut file = tokio::fs::File::create(&path)
        .await
        .map_err(|_| trouble("making its file failed"))?;
    let deadline = READ_DEADLINE + Duration::from_secs(declared / MIN_PACK_RATE);
    let mut got: u64 = 0;
    let mut buf = vec![0u8; 256 * 1024];
    let copy = async {
        while got < declared {
            let want = usize::try_from(declared - got)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            let n = stream.read(&mut buf[..want]).await?;
            if n == 0 {
                break;
            }
            file.write_all(&buf[..n]).await?;
            got += n as u64;
        }
        file.flush().await
    };
    match tokio::time::timeout(deadline, copy).await {
        Err(_) => Err(Response::Error {
            reason: format!(
                "the pack did not arrive within {} s ({got} of {declared} bytes came)",
                deadline.as_secs()
            ),
        }),
        Ok(Err(_)) => Err(Response::Error {
            reason: format!("the pack could not be read ({got} of {declared} bytes came)"),
        }),
        Ok(Ok(())) if got < declared => Err(Response::Error {
            reason: format!(
                "the pack was cut short: the connection closed after {got} of {declared} bytes"
            ),
        }),
        Ok(Ok(())) => Ok(Some(crate::acts::Received {
            dir: scratch.to_path_buf(),
            pack: Some(path),
        })),
    }
}

/// The reply with every occurrence of a supervisor path (and anything
/// below it) replaced: the agent learns nothing of the host's layout.
pub fn without_host_paths(response: &Response, hidden: &[&Path]) -> Response {
    let scrub = |text: &str| {
        let mut out = text.to_string();
        for path in hidden {
            // The canonical form too: a lower layer may have resolved it.
            let forms = [
                Some(path.to_string_lossy().into_owned()),
                std::fs::canonicalize(path)
                    .ok()
                    .map(|p| p.to_string_lossy().into_owned()),
            ];
            for form in forms.into_iter().flatten() {
                let form = form.trim_end_matches('/');
                if form.len() > 1 {
                    out = out.replace(form, HIDDEN_PATH);
                }
            }
        }
        out
    };
    match response {
        Response::Refused { rule, reason } => Response::Refused {
            rule: scrub(rule),
            reason: scrub(reason),
        },
        Response::Queued { act } => Response::Queued { act: scrub(act) },
        Response::Asks { rule, reason } => Response::Asks {
            rule: scrub(rule),
            reason: scrub(reason),
        },
        Response::Done { detail } => Response::Done {
            detail: scrub(detail),
        },
        Response::Error { reason } => Response::Error {
            reason: scrub(reason),
        },
    }
}

/// A request that never became one (malformed, oversized, out of order, too
/// slow, its pack refused or cut short) is audited too: the door (when the
/// request decoded), the verdict `error`, the reason's code (one of
/// [`crate::acts::REASONS`]) and the reason's digest.
pub(crate) async fn audit_protocol_error(
    stores: &Stores,
    run: &str,
    door: Option<&str>,
    response: &Response,
    verdict: &str,
    code: &'static str,
) {
    let (stores, run, line, verdict, door) = (
        stores.clone(),
        run.to_string(),
        response.line(),
        verdict.to_string(),
        door.unwrap_or("unknown").to_string(),
    );
    let _ = tokio::task::spawn_blocking(move || {
        if let Ok(mut store) = stores.connect() {
            let _ = store.append(
                Some(&run),
                &nightshift_core::audit_log::Event::DoorRequest {
                    door,
                    destination: None,
                    verdict,
                    rule: None,
                    act: None,
                    digest: nightshift_core::audit_log::digest(line.as_bytes()),
                    bytes: 0,
                    label: None,
                    gate: None,
                    reason: Some(code.to_string()),
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

/// Removes a run's door directory (`STATE/doors/<run>`), if any: every
/// ending does (the run's own, a refusal, reconciliation), so no door of a
/// settled run stays. Best effort; a missing directory is fine.
pub fn remove_dir(paths: &StatePaths, run: &str) {
    // A run id is a ULID: never a path of its own.
    if run.is_empty() || !run.chars().all(|c| c.is_ascii_alphanumeric()) {
        return;
    }
    let _ = std::fs::remove_dir_all(paths.root.join("doors").join(run));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_scrubbed_of_host_paths() {
        let state = tempfile::tempdir().unwrap();
        let repo = tempfile::tempdir().unwrap();
        let s = state.path().display().to_string();
        let r = repo.path().display().to_string();
        let replies = [
            Response::Error {
                reason: format!("reading worktree {s}/worktrees/x/.git/objects: refused"),
            },
            Response::Refused {
                rule: "nightshift:policy".into(),
                reason: format!("the policy could not be read: {s}/rules/a.toml: line 1"),
            },
            Response::Error {
                reason: format!("opening {r} as a git repository and {r}/.git"),
            },
            Response::Done { detail: s.clone() },
        ];
        for reply in replies {
            let line = without_host_paths(&reply, &[state.path(), repo.path()]).line();
            assert!(!line.contains(&s) && !line.contains(&r), "{line}");
            assert!(line.contains(HIDDEN_PATH), "{line}");
        }
        // A reply without paths is left as it is.
        let plain = Response::Queued { act: "a1".into() };
        assert_eq!(without_host_paths(&plain, &[state.path()]), plain);
    }
}
