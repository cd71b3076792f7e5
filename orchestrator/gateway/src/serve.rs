//! The gateway's adapter: an HTTP/1.1 server (hyper) on the run's model
//! socket, forwarding each call to its endpoint (see the module note in
//! `gateway`).
//!
//! Invariants:
//! - At most `Limits::concurrent` connections are served at once; a
//!   request's head must arrive within [`HEAD_DEADLINE`] and its body within
//!   `Limits::request_timeout`, at most `max_request` bytes: a slow or flooding
//!   client holds a bounded part of the supervisor for a bounded time.
//! - Request bodies held at once are bounded: `max_request` bytes per run
//!   and [`PROCESS_HELD_KIB`] per process, counted from before the body is
//!   read until the endpoint has taken the forwarded body; a call that finds
//!   no room within `request_timeout` gets a 429. A body is held once: the
//!   check (`request`) borrows from it and the forwarded body is slices of
//!   it ([`Pieces`]).
//! - Only what `request::check` passes is forwarded, and only the headers
//!   in [`FORWARDED`] (a beta header only with values on its list); the
//!   sandbox's `Authorization` / `x-api-key` never do: the key is the
//!   endpoint's, read from its file for this call
//!   (`tests/tests/gateway.rs::three_shapes_stream_and_not_through_the_relay_and_the_key_stays_outside`).
//! - A response is passed on as it arrives: whole events of a stream (at
//!   most `max_line` bytes held), or the pieces of a JSON body (a copy of at
//!   most `max_line` bytes kept to read its usage). Nothing else is held.
//! - Every call, forwarded or refused, ends in one audit entry, written
//!   after its settlement (the ledger is `STATE/tokens.db`, apart from the
//!   audit, so that a reservation does not wait for an audit append's
//!   fsync), off the response's path: the response has gone out before it
//!   (`tests/tests/gateway.rs::a_call_still_streaming_when_the_run_ends_is_audited_before_the_end`,
//!   `tests/tests/gateway.rs::model_calls_on_a_full_disk_are_refused_and_every_one_is_audited`).
//! - No call is made while an entry cannot be written: an entry that fails
//!   (a full disk) waits in order (at most [`MAX_UNAUDITED`]), and every
//!   call is refused (`refused:audit`, telling the agent to end the run)
//!   until the waiting entries are written, which each call tries first and
//!   [`GatewayHandle::close`] tries last.
//! - Every call ends in its audit entry before the run does:
//!   [`GatewayHandle::close`] stops accepting, tells the streams still
//!   running to end (outcome `run_ended`), and returns once every call in
//!   flight is settled and audited.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::FutureExt;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};

use super::models::{Api, Endpoint, Limits, Models};
use super::request;
use super::route::{self, Refusal, Shape};
use super::sse::{self, Prepared, Scanner, Usage};
use super::tokens::{self, Ask};
use super::upstream::Pieces;
use nightshift_core::audit_log::Event;
use nightshift_core::channel::ChannelListener;
use nightshift_core::state_store::{StateStore, StoreError, Stores, TokenLedger};

/// Audit entries kept waiting while the audit log cannot be written (the
/// calls refused meanwhile are each one).
pub const MAX_UNAUDITED: usize = 1024;
/// A request's head must arrive within this.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(10);
/// The request headers passed on to an endpoint (all others are dropped).
pub const FORWARDED: [&str; 6] = [
    "accept",
    "anthropic-version",
    "anthropic-beta",
    "openai-beta",
    "user-agent",
    "x-stainless-helper-method",
];
/// Response headers passed back to the sandbox.
const RETURNED: [&str; 4] = ["content-type", "request-id", "x-request-id", "retry-after"];
/// The Anthropic API version sent when the client names none.
const ANTHROPIC_VERSION: &str = "2023-06-01";
/// What a silence in a stream is filled with.
const HEARTBEAT: &[u8] = b": nightshift gateway keep-alive\n\n";
/// The most bytes of a response gathered from frames already received
/// before they are passed on together (`Pump`): a stream's events are
/// never held back waiting for more.
const BATCH: usize = 64 * 1024;

type Body = BoxBody<Bytes, std::io::Error>;

/// A run's gateway, open while the run lasts.
#[derive(Debug)]
pub struct GatewayHandle {
    task: tokio::task::JoinHandle<()>,
    /// Set when a budget of this run is spent.
    pub cap_reached: watch::Receiver<Option<CapReached>>,
    /// Calls not yet audited.
    in_flight: watch::Receiver<usize>,
    /// Set when the run ends: streams still running stop.
    closing: watch::Sender<bool>,
    gw: Arc<Gateway>,
}

/// A spent budget, or calls refused again and again for a reason only the
/// owner can fix (`route::RefusedInARow`): the run is to end for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapReached {
    /// `model_tokens`, or `model_refused` (`used` refusals in a row).
    pub kind: &'static str,
    pub used: u64,
    pub cap: u64,
    /// The kill's detail: `model token cap (used N of M; ...)`.
    pub detail: String,
}

/// How long [`GatewayHandle::close`] waits for the calls in flight to be
/// audited once told to end (each is a settlement and an append away).
pub const DRAIN: Duration = Duration::from_secs(10);

/// A handle dropped without `close` (its run's lifecycle panicked in a
/// process that goes on) still stops serving.
impl Drop for GatewayHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl GatewayHandle {
    /// Stops accepting calls, ends the streams still running, and waits
    /// (at most [`DRAIN`]) until every call is settled and audited.
    /// Returns how many calls' audit entries still could not be written.
    pub async fn close(mut self) -> usize {
        self.task.abort();
        self.closing.send_replace(true);
        let drained = tokio::time::timeout(DRAIN, self.in_flight.wait_for(|n| *n == 0))
            .await
            .is_ok_and(|r| r.is_ok());
        if !drained {
            tracing::error!(
                in_flight = *self.in_flight.borrow(),
                "model calls still in flight when the run ended: their audit entries come after it"
            );
        }
        // Entries that waited for the audit log get their last chance.
        if self.gw.audit_writable().await {
            return 0;
        }
        let waiting = self.gw.unaudited.lock().map(|w| w.len()).unwrap_or(0);
        tracing::error!(
            run = %self.gw.run,
            waiting,
            "the run ends with model calls whose audit entries could not be written"
        );
        waiting
    }
}

/// One call in flight, from its request to its audit entry.
struct InFlight(Arc<watch::Sender<usize>>);

impl InFlight {
    fn start(counter: &Arc<watch::Sender<usize>>) -> InFlight {
        counter.send_modify(|n| *n += 1);
        InFlight(counter.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

#[derive(Debug)]
struct Gateway {
    models: Models,
    run: String,
    run_cap: u64,
    fleet_cap: u64,
    /// The label of every call's output (`untrusted, private`).
    label: String,
    /// The run's content is private: no server tool (the label gate).
    private: bool,
    /// Request bodies this run may hold at once, in KiB (`max_request`).
    run_held: Arc<tokio::sync::Semaphore>,
    run_held_kib: u32,
    /// The store's port: the token ledger and the audit log.
    stores: Stores,
    /// Reservations and settlements.
    ledger: Mutex<Option<Box<dyn TokenLedger>>>,
    /// Audit entries.
    auditing: Mutex<Option<Box<dyn StateStore>>>,
    /// Entries not yet written (the audit log could not be written).
    unaudited: Mutex<std::collections::VecDeque<Event>>,
    /// Set while entries wait: calls are refused.
    audit_failing: AtomicBool,
    /// The client to the endpoints, keeping connections alive between calls.
    upstream: super::upstream::Upstream,
    /// Calls not yet audited.
    in_flight: Arc<watch::Sender<usize>>,
    /// Set when the run ends.
    closing: watch::Receiver<bool>,
    cap: watch::Sender<Option<CapReached>>,
    /// Calls refused in a row for a reason only the owner can fix.
    refused_in_a_row: Mutex<route::RefusedInARow>,
}

impl Gateway {
    fn limits(&self) -> &Limits {
        &self.models.limits
    }

    /// Runs `f` on the gateway's token ledger (opened on first use), off
    /// the async threads.
    async fn with_ledger<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut dyn TokenLedger) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, String> {
        let gw = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = gw.ledger.lock().unwrap_or_else(|p| p.into_inner());
            if guard.is_none() {
                *guard = Some(gw.stores.ledger().map_err(|e| e.to_string())?);
            }
            let ledger = guard.as_mut().ok_or("no ledger")?;
            f(ledger.as_mut()).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// Appends one audit entry through the gateway's own store connection,
    /// after the entries still waiting from an earlier failure, in order.
    /// An entry that cannot be written waits (at most [`MAX_UNAUDITED`])
    /// and the gateway refuses calls until they are written.
    async fn audit(self: &Arc<Self>, event: Event) {
        if let Event::ModelCall {
            outcome,
            latency_ms,
            ..
        } = &event
        {
            nightshift_core::metrics::observe_model_call(outcome, *latency_ms as f64 / 1e3);
        }
        let gw = self.clone();
        let done = tokio::task::spawn_blocking(move || gw.append_waiting(Some(event))).await;
        if let Err(e) = done {
            tracing::error!(error = %e, "auditing a model call failed");
        }
    }

    /// Writes the entries waiting (and `event`), stopping at the first
    /// failure; true when nothing waits any more.
    fn append_waiting(&self, event: Option<Event>) -> bool {
        let mut waiting = self.unaudited.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(event) = event {
            if waiting.len() < MAX_UNAUDITED {
                waiting.push_back(event);
            } else {
                tracing::error!(
                    run = %self.run,
                    "a model call's audit entry is lost: {MAX_UNAUDITED} entries already wait for the audit log to be writable"
                );
            }
        }
        let mut guard = self.auditing.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(event) = waiting.front() {
            let written = (|| {
                if guard.is_none() {
                    *guard = Some(self.stores.connect().map_err(|e| e.to_string())?);
                }
                let store = guard.as_mut().ok_or("no store")?;
                store
                    .append(Some(&self.run), event, false)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })();
            match written {
                Ok(()) => {
                    waiting.pop_front();
                }
                Err(e) => {
                    // A connection that failed may hold a broken transaction.
                    *guard = None;
                    if !self.audit_failing.swap(true, Ordering::SeqCst) {
                        tracing::error!(
                            run = %self.run,
                            error = %e,
                            "the model gateway cannot write its audit log: calls are refused until it can"
                        );
                    }
                    return false;
                }
            }
        }
        self.audit_failing.store(false, Ordering::SeqCst);
        true
    }

    /// Whether the audit log can be written (entries waiting are written
    /// first); false while it cannot.
    async fn audit_writable(self: &Arc<Self>) -> bool {
        if !self.audit_failing.load(Ordering::SeqCst) {
            return true;
        }
        let gw = self.clone();
        tokio::task::spawn_blocking(move || gw.append_waiting(None))
            .await
            .unwrap_or(false)
    }

    fn cap_spent(&self, scope: tokens::Scope, used: u64, cap: u64, needed: u64) {
        self.cap.send_if_modified(|v| {
            if v.is_none() {
                *v = Some(CapReached {
                    kind: "model_tokens",
                    used,
                    cap,
                    detail: cap_detail(scope, used, cap, needed),
                });
                true
            } else {
                false
            }
        });
    }
}

impl Gateway {
    /// One call's end, refused (`Some`) or forwarded: after
    /// `route::HOPELESS_AFTER` refusals in a row only the owner can fix, the
    /// run is told to end (unless a budget already did).
    fn note_call(&self, refusal: Option<&Refusal>) {
        let reason = self
            .refused_in_a_row
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .note(refusal);
        if let Some(detail) = reason {
            self.cap.send_if_modified(|v| {
                if v.is_some() {
                    return false;
                }
                *v = Some(CapReached {
                    kind: "model_refused",
                    used: route::HOPELESS_AFTER as u64,
                    cap: route::HOPELESS_AFTER as u64,
                    detail,
                });
                true
            });
        }
    }
}

/// The kill's detail for a spent budget: what the refused call needed at
/// least (its worst-case reservation's floor) against what was left, so
/// that a cap "spent" at 31% is no riddle.
pub fn cap_detail(scope: tokens::Scope, used: u64, cap: u64, needed: u64) -> String {
    let which = match scope {
        tokens::Scope::Run => "model token cap",
        tokens::Scope::Fleet => "model token cap of the fleet for the night",
    };
    format!(
        "{which} (used {used} of {cap}; a call needed at least {needed}, {} were left)",
        cap.saturating_sub(used)
    )
}

/// Serves the run's model channel (`listener`: on Docker and Podman the
/// socket [`super::SOCKET`] of the run's channel directory) until the
/// handle is closed. `content` is the label of what the run's context holds
/// (`acts::run_content_label`): each call's output carries it.
pub fn open(
    stores: &Stores,
    mut listener: impl ChannelListener,
    run: &str,
    content: policies::Label,
    models: Models,
    run_cap: u64,
    fleet_cap: u64,
) -> GatewayHandle {
    let (cap, cap_reached) = watch::channel(None);
    let (in_flight, in_flight_rx) = watch::channel(0usize);
    let (closing, closing_rx) = watch::channel(false);
    let limit = Arc::new(tokio::sync::Semaphore::new(models.limits.concurrent));
    let upstream = super::upstream::Upstream::new(&models.endpoints);
    let run_held_kib =
        u32::try_from(models.limits.max_request.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
    let gw = Arc::new(Gateway {
        models,
        run: run.to_string(),
        run_cap,
        fleet_cap,
        label: nightshift_core::policy::label_text(content),
        private: content.confidentiality != policies::Confidentiality::Public,
        run_held: Arc::new(tokio::sync::Semaphore::new(run_held_kib as usize)),
        run_held_kib,
        stores: stores.clone(),
        ledger: Mutex::new(None),
        auditing: Mutex::new(None),
        unaudited: Mutex::new(Default::default()),
        audit_failing: AtomicBool::new(false),
        upstream,
        in_flight: Arc::new(in_flight),
        closing: closing_rx,
        cap,
        refused_in_a_row: Mutex::new(Default::default()),
    });
    let kept = gw.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok(permit) = limit.clone().acquire_owned().await else {
                return;
            };
            let Ok(stream) = listener.accept().await else {
                continue;
            };
            let gw = gw.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let gw = gw.clone();
                    async move { Ok::<_, Infallible>(handle(gw, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEAD_DEADLINE)
                    .max_buf_size(64 * 1024)
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
                drop(permit);
            });
        }
    });
    GatewayHandle {
        task,
        cap_reached,
        in_flight: in_flight_rx,
        closing,
        gw: kept,
    }
}

/// What the gateway knows of one call, for its audit entry.
#[derive(Debug, Default, Clone)]
struct Call {
    endpoint: Option<String>,
    model: Option<String>,
    shape: Option<Shape>,
    stream: bool,
    request_bytes: u64,
    request_digest: String,
    night: String,
    reserved: u64,
    label: String,
}

/// `text`, cut to at most `max` bytes at a character's boundary.
fn bounded(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

async fn handle(gw: Arc<Gateway>, req: Request<Incoming>) -> Response<Body> {
    let started = Instant::now();
    // Held until the call's audit entry is written: here for a refusal,
    // by the pump for a forwarded call.
    let mut in_flight = Some(InFlight::start(&gw.in_flight));
    let mut call = Call {
        night: tokens::night_of(now_unix()),
        request_digest: nightshift_core::audit_log::digest(b""),
        label: gw.label.clone(),
        ..Default::default()
    };
    let response = match forward(&gw, req, &mut call, started, &mut in_flight).await {
        Ok(response) => {
            gw.note_call(None);
            response
        }
        Err(Refused {
            refusal,
            audited: true,
        }) => {
            gw.note_call(Some(&refusal));
            let body = error_body(&refusal);
            error_response(&refusal, body)
        }
        Err(Refused { refusal, .. }) => {
            gw.note_call(Some(&refusal));
            let status = refusal.status;
            let outcome = format!("refused:{}", refusal.kind);
            let run = gw.run.clone();
            let run_cap = gw.run_cap;
            let body = error_body(&refusal);
            let response_digest = nightshift_core::audit_log::digest(&body);
            let response_bytes = body.len() as u64;
            let run_tokens = gw
                .with_ledger(move |l| l.run_tokens(&run))
                .await
                .map(|l| l.used)
                .unwrap_or(0);
            gw.audit(model_call(
                &call,
                status,
                outcome,
                None,
                0,
                run_tokens,
                run_cap,
                started.elapsed(),
                None,
                response_bytes,
                response_digest,
            ))
            .await;
            error_response(&refusal, body)
        }
    };
    drop(in_flight);
    response
}

#[allow(clippy::too_many_arguments)]
fn model_call(
    call: &Call,
    status: u16,
    outcome: String,
    usage: Option<Usage>,
    charged: u64,
    run_tokens: u64,
    run_cap: u64,
    latency: Duration,
    first_byte: Option<Duration>,
    response_bytes: u64,
    response_digest: String,
) -> Event {
    Event::ModelCall {
        endpoint: call.endpoint.clone(),
        model: call.model.clone(),
        shape: call.shape.map(|s| {
            match s {
                Shape::Chat => "chat",
                Shape::Responses => "responses",
                Shape::Messages => "messages",
            }
            .to_string()
        }),
        stream: call.stream,
        status,
        outcome,
        input_tokens: usage.map(|u| u.input),
        output_tokens: usage.map(|u| u.output),
        cached_tokens: usage.map(|u| u.cached),
        reserved_tokens: call.reserved,
        charged_tokens: charged,
        run_tokens,
        run_token_cap: run_cap,
        latency_ms: ms(latency),
        first_byte_ms: first_byte.map(ms),
        request_bytes: call.request_bytes,
        request_digest: call.request_digest.clone(),
        response_bytes,
        response_digest,
        label: Some(call.label.clone()),
    }
}

/// One JSON error body both API families' clients read (`error.message`,
/// `error.type`).
fn error_body(refusal: &Refusal) -> Vec<u8> {
    let kind = match refusal.status {
        400 | 413 => "invalid_request_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        _ => "api_error",
    };
    serde_json::json!({
        "type": "error",
        "error": {
            "type": kind,
            "code": format!("nightshift_{}", refusal.kind),
            "message": refusal.message,
        }
    })
    .to_string()
    .into_bytes()
}

fn error_response(refusal: &Refusal, body: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = StatusCode::from_u16(refusal.status).unwrap_or(StatusCode::BAD_GATEWAY);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    // The request may not have been read whole (too big, too slow): the
    // connection ends with the answer, never waits for the rest.
    r.headers_mut()
        .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    if refusal.status == 429 {
        r.headers_mut()
            .insert("retry-after", HeaderValue::from_static("1"));
    }
    r
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

/// A refusal, and whether its audit entry is written already.
#[derive(Debug)]
struct Refused {
    refusal: Refusal,
    audited: bool,
}

impl From<Refusal> for Refused {
    fn from(refusal: Refusal) -> Self {
        Refused {
            refusal,
            audited: false,
        }
    }
}

fn too_big(limits: &Limits) -> Refusal {
    Refusal::new(
        413,
        "request_size",
        format!(
            "the request is over the gateway's limit of {} bytes",
            limits.max_request
        ),
    )
}

/// Request bodies held at once by the whole process, in KiB: a few bodies
/// at the default limit, however many runs and calls there are.
pub const PROCESS_HELD_KIB: u32 = 64 * 1024;

fn process_held() -> &'static Arc<tokio::sync::Semaphore> {
    static HELD: std::sync::OnceLock<Arc<tokio::sync::Semaphore>> = std::sync::OnceLock::new();
    HELD.get_or_init(|| Arc::new(tokio::sync::Semaphore::new(PROCESS_HELD_KIB as usize)))
}

/// What a held body counts against: the run's bodies and the process's.
type Held = (
    tokio::sync::OwnedSemaphorePermit,
    tokio::sync::OwnedSemaphorePermit,
);

/// Waits (at most `request_timeout`) until a body of `declared` bytes (the
/// limit when not declared) may be held: at most `max_request` bytes of
/// bodies per run and [`PROCESS_HELD_KIB`] per process, each counted until
/// the endpoint has taken it.
async fn hold_body(gw: &Gateway, declared: Option<u64>, limits: &Limits) -> Result<Held, Refusal> {
    let bytes = declared
        .unwrap_or(limits.max_request)
        .min(limits.max_request);
    let kib = bytes.div_ceil(1024).max(1);
    let run_kib = u32::try_from(kib.min(u64::from(gw.run_held_kib))).unwrap_or(u32::MAX);
    let process_kib = u32::try_from(kib.min(u64::from(PROCESS_HELD_KIB))).unwrap_or(u32::MAX);
    let wait = async {
        let run = gw.run_held.clone().acquire_many_owned(run_kib).await.ok()?;
        let process = process_held()
            .clone()
            .acquire_many_owned(process_kib)
            .await
            .ok()?;
        Some((run, process))
    };
    match tokio::time::timeout(limits.request_timeout, wait).await {
        Ok(Some(held)) => Ok(held),
        _ => Err(Refusal::new(
            429,
            "request_busy",
            "the gateway holds as many request bodies as it may at once; retry shortly",
        )),
    }
}

/// Reads a request's body whole (at most `max_request` bytes, within
/// `request_timeout`) into one buffer.
async fn read_body(
    mut body: Incoming,
    declared: Option<u64>,
    limits: &Limits,
) -> Result<Bytes, Refusal> {
    let mut buf =
        bytes::BytesMut::with_capacity(declared.unwrap_or(0).min(limits.max_request) as usize);
    let read = async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| {
                Refusal::new(400, "request_read", "the request's body could not be read")
            })?;
            if let Ok(data) = frame.into_data() {
                if (buf.len() + data.len()) as u64 > limits.max_request {
                    return Err(too_big(limits));
                }
                buf.extend_from_slice(&data);
            }
        }
        Ok(())
    };
    match tokio::time::timeout(limits.request_timeout, read).await {
        Err(_) => Err(Refusal::new(
            408,
            "request_time",
            format!(
                "the request's body did not arrive within {} s",
                limits.request_timeout.as_secs()
            ),
        )),
        Ok(Err(r)) => Err(r),
        Ok(Ok(())) => Ok(buf.freeze()),
    }
}

/// Forwards one call; a refusal for anything the gateway will not do.
async fn forward(
    gw: &Arc<Gateway>,
    req: Request<Incoming>,
    call: &mut Call,
    started: Instant,
    in_flight: &mut Option<InFlight>,
) -> Result<Response<Body>, Refused> {
    let limits = *gw.limits();
    let (parts, body) = req.into_parts();
    let shape = route::shape(parts.method.as_str(), parts.uri.path())?;
    call.shape = Some(shape);
    // A call that could not be audited is never made: while the audit log
    // cannot be written, every call is refused, and told why.
    if !gw.audit_writable().await {
        return Err(Refusal::new(
            503,
            "audit",
            "refused by nightshift: the supervisor cannot write its audit log (is the state's disk full?); model calls are refused until it can: end the run",
        )
        .into());
    }
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_request) {
        return Err(too_big(&limits).into());
    }
    let held = hold_body(gw, declared, &limits).await?;
    let body = read_body(body, declared, &limits).await?;
    call.request_bytes = body.len() as u64;
    call.request_digest = nightshift_core::audit_log::digest(&body);

    // Only what the gateway understands goes on (see `request`); what is
    // allowed beyond the fixed list is the endpoint's, for this run.
    let model = request::model(&body).map_err(|d| d.refusal())?;
    // Named in the audit even when refused: `show` says which model a
    // refused call asked for (bounded and checked by `request::model`).
    call.model = Some(bounded(&model, 256));
    let endpoint: Endpoint = route::route(&gw.models, shape, &model)?.clone();
    let allow = request::Allow {
        server_tools: &endpoint.server_tools,
        private: gw.private,
        max_choices: endpoint.max_choices,
    };
    let checked = request::check(shape, &body, &allow).map_err(|d| d.refusal())?;
    call.endpoint = Some(endpoint.alias.clone());
    call.model = Some(checked.model.clone());
    for header in ["anthropic-beta", "openai-beta"] {
        let mut values = Vec::new();
        for v in parts.headers.get_all(header) {
            values.push(v.to_str().map_err(|_| {
                Refusal::new(
                    400,
                    "request_header",
                    format!("header {header} is not text"),
                )
            })?);
        }
        request::check_betas(header, &values, shape, &allow).map_err(|d| d.refusal())?;
    }

    // Reserve the worst case against the run's and the fleet's budgets.
    let ask = Ask {
        input_bound: checked.input_bound(body.len()),
        requested_output: checked.output_bound,
        choices: checked.choices,
    };
    let (run, night, run_cap, fleet_cap) =
        (gw.run.clone(), call.night.clone(), gw.run_cap, gw.fleet_cap);
    let decision = gw
        .with_ledger(move |ledger| ledger.reserve(&run, &night, run_cap, fleet_cap, ask))
        .await
        .map_err(|_| {
            Refusal::new(
                503,
                "ledger",
                "the supervisor's token ledger is unavailable; try again later",
            )
        })?;
    let grant = match decision {
        Ok(g) => g,
        Err(refused) => {
            let status = match refused {
                tokens::Refusal::Spent {
                    scope,
                    used,
                    cap,
                    needed,
                } => {
                    gw.cap_spent(scope, used, cap, needed);
                    403
                }
                tokens::Refusal::Held { .. } => 429,
            };
            return Err(Refusal::new(status, "token_cap", refused.message()).into());
        }
    };
    call.reserved = grant.tokens;
    let prepared = Prepared {
        stream: checked.stream,
        client_wants_usage: checked.client_wants_usage,
    };
    call.stream = prepared.stream;
    let forwarded = Pieces::new(checked.forwarded(&body, grant.max_output), held);
    drop(body);

    // From here on the reservation is held: every way out settles it.
    let key = match super::key::read(&endpoint.key_file) {
        Ok(k) => k,
        Err(e) => {
            tracing::error!(endpoint = %endpoint.alias, error = %e, "the model endpoint's key cannot be used");
            return Err(settle_refused(
                gw,
                call,
                started,
                Some(0),
                Refusal::new(
                    502,
                    "key",
                    format!(
                        "the supervisor cannot use endpoint {}'s key; the owner must fix it",
                        endpoint.alias
                    ),
                ),
            )
            .await);
        }
    };
    let built = Request::builder()
        .method("POST")
        .uri(format!(
            "{}{}",
            route::upstream_path(&endpoint, shape),
            parts
                .uri
                .query()
                .map(|q| format!("?{q}"))
                .unwrap_or_default()
        ))
        .body(forwarded);
    let mut upstream = match built {
        Ok(r) => r,
        Err(_) => {
            let r = Refusal::new(
                400,
                "request_query",
                "the request's query string is not valid",
            );
            return Err(settle_refused(gw, call, started, Some(0), r).await);
        }
    };
    let headers = upstream.headers_mut();
    copy_allowed(&parts.headers, headers);
    let set = |h: &mut HeaderMap, name: &'static str, value: &str| {
        if let Ok(v) = HeaderValue::from_str(value) {
            h.insert(HeaderName::from_static(name), v);
        }
    };
    set(headers, "host", &endpoint.base_url.authority());
    set(headers, "content-type", "application/json");
    match endpoint.api {
        Api::Anthropic => {
            set(headers, "x-api-key", &key);
            if !headers.contains_key("anthropic-version") {
                set(headers, "anthropic-version", ANTHROPIC_VERSION);
            }
        }
        Api::Openai => set(headers, "authorization", &format!("Bearer {key}")),
    }
    drop(key);

    let sent = Instant::now();
    let mut closing = gw.closing.clone();
    let answered = tokio::select! {
        answered = tokio::time::timeout(
            limits.first_byte_timeout,
            gw.upstream.send(&endpoint.base_url, upstream),
        ) => Some(answered),
        // The run ended while the endpoint had not answered.
        _ = closing.wait_for(|closed| *closed) => None,
    };
    let Some(answered) = answered else {
        return Err(settle_refused(
            gw,
            call,
            started,
            None,
            Refusal::new(
                503,
                "run_ended",
                "the run ended before the endpoint answered",
            ),
        )
        .await);
    };
    let response = match answered {
        Err(_) => {
            return Err(settle_refused(
                gw,
                call,
                started,
                None,
                Refusal::new(
                    504,
                    "first_byte_timeout",
                    format!(
                        "endpoint {} did not answer within {} s",
                        endpoint.alias,
                        limits.first_byte_timeout.as_secs()
                    ),
                ),
            )
            .await)
        }
        Ok(Err(e)) => {
            tracing::warn!(endpoint = %endpoint.alias, error = %e, "model endpoint unreachable");
            let charged = if e.maybe_sent() { None } else { Some(0) };
            return Err(settle_refused(
                gw,
                call,
                started,
                charged,
                Refusal::new(
                    502,
                    "upstream",
                    format!("endpoint {} could not be reached", endpoint.alias),
                ),
            )
            .await);
        }
        Ok(Ok(r)) => r,
    };
    let first_byte = sent.elapsed();
    let (head, upstream_body) = response.into_parts();
    let is_sse = head
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    let status = head.status.as_u16();
    let pump = Pump {
        gw: gw.clone(),
        call: call.clone(),
        shape,
        status,
        started,
        first_byte,
        scanner: is_sse.then(|| Scanner::new(shape, prepared, limits.max_line as usize)),
        in_flight: in_flight.take(),
    };
    tokio::spawn(pump.run(upstream_body, tx));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::io::Error>(Frame::data(b)), rx))
    });
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    *r.status_mut() = head.status;
    for name in RETURNED {
        if let Some(v) = head.headers.get(name) {
            r.headers_mut()
                .insert(HeaderName::from_static(name), v.clone());
        }
    }
    Ok(r)
}

fn copy_allowed(from: &HeaderMap, to: &mut HeaderMap) {
    for name in FORWARDED {
        if let Some(v) = from.get(name) {
            to.insert(HeaderName::from_static(name), v.clone());
        }
    }
}

/// Settles a reservation for a call that got no response, audits it, and
/// returns the refusal to send.
async fn settle_refused(
    gw: &Arc<Gateway>,
    call: &Call,
    started: Instant,
    charged: Option<u64>,
    refusal: Refusal,
) -> Refused {
    let body = error_body(&refusal);
    let digest = nightshift_core::audit_log::digest(&body);
    let outcome = format!("refused:{}", refusal.kind);
    settle(
        gw,
        call.clone(),
        refusal.status,
        outcome,
        None,
        charged,
        started.elapsed(),
        None,
        body.len() as u64,
        digest,
    )
    .await;
    Refused {
        refusal,
        audited: true,
    }
}

#[allow(clippy::too_many_arguments)]
async fn settle(
    gw: &Arc<Gateway>,
    call: Call,
    status: u16,
    outcome: String,
    usage: Option<Usage>,
    charged: Option<u64>,
    latency: Duration,
    first_byte: Option<Duration>,
    response_bytes: u64,
    response_digest: String,
) {
    let (run, run_cap, fleet_cap) = (gw.run.clone(), gw.run_cap, gw.fleet_cap);
    let reserved = call.reserved;
    let charged_tokens = charged.unwrap_or(reserved);
    let night = call.night.clone();
    let settled = gw
        .with_ledger(move |ledger| ledger.settle(&run, &night, reserved, charged))
        .await;
    let run_tokens = settled.as_ref().map(|(r, _)| r.used).unwrap_or(0);
    gw.audit(model_call(
        &call,
        status,
        outcome,
        usage,
        charged_tokens,
        run_tokens,
        run_cap,
        latency,
        first_byte,
        response_bytes,
        response_digest,
    ))
    .await;
    match settled {
        Ok((run_ledger, fleet_ledger)) => {
            if tokens::spent(run_ledger, run_cap) {
                // Spent by this settlement: no call of the smallest size
                // (2 tokens, `tokens::spent`) fits any more.
                gw.cap_spent(tokens::Scope::Run, run_ledger.used, run_cap, 2);
            } else if tokens::spent(fleet_ledger, fleet_cap) {
                gw.cap_spent(tokens::Scope::Fleet, fleet_ledger.used, fleet_cap, 2);
            }
        }
        Err(e) => tracing::error!(error = %e, "settling a model call failed"),
    }
}

/// Carries one response from the endpoint to the sandbox.
struct Pump {
    gw: Arc<Gateway>,
    call: Call,
    shape: Shape,
    status: u16,
    started: Instant,
    first_byte: Duration,
    /// Some for a stream of events; None for a body passed through.
    scanner: Option<Scanner>,
    /// Released once the call is audited.
    in_flight: Option<InFlight>,
}

impl Pump {
    /// Takes one piece of the response: counts it against `max_response`,
    /// and appends to `out` what is passed on (the events it completes, or
    /// the piece itself), keeping a bounded copy of a JSON body. The error
    /// is the call's outcome.
    fn take(
        &mut self,
        data: &Bytes,
        out: &mut Vec<u8>,
        copy: &mut Option<Vec<u8>>,
        received: &mut u64,
        limits: &Limits,
    ) -> Result<(), &'static str> {
        *received += data.len() as u64;
        if *received > limits.max_response {
            return Err("response_too_large");
        }
        match &mut self.scanner {
            Some(scanner) => scanner.feed(data, out).map_err(|_| "line_too_long"),
            None => {
                if let Some(c) = copy {
                    if (c.len() + data.len()) as u64 <= limits.max_line {
                        c.extend_from_slice(data);
                    } else {
                        *copy = None;
                    }
                }
                out.extend_from_slice(data);
                Ok(())
            }
        }
    }

    /// At the stream's end: an unterminated last event, passed on as it is.
    fn unfinished_event(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(scanner) = &mut self.scanner {
            scanner.finish(&mut out);
        }
        out
    }

    async fn run(mut self, mut body: Incoming, tx: mpsc::Sender<Bytes>) {
        let limits = *self.gw.limits();
        let deadline = self.started + limits.call_timeout;
        let mut hasher = Sha256::new();
        let mut sent: u64 = 0;
        let mut received: u64 = 0;
        // A copy of a JSON body, to read its usage (at most `max_line`).
        let mut copy: Option<Vec<u8>> = self.scanner.is_none().then(Vec::new);
        let mut last_piece = Instant::now();
        let mut outcome: &str = "ok";
        let mut closing = self.gw.closing.clone();
        let send = |bytes: Vec<u8>, hasher: &mut Sha256, sent: &mut u64| {
            hasher.update(&bytes);
            *sent += bytes.len() as u64;
            let tx = tx.clone();
            async move { tx.send(Bytes::from(bytes)).await.is_ok() }
        };
        loop {
            let now = Instant::now();
            if now >= deadline {
                outcome = "call_timeout";
                break;
            }
            let idle_left = limits.idle_timeout.saturating_sub(now - last_piece);
            if idle_left.is_zero() {
                outcome = "idle_timeout";
                break;
            }
            let wait = limits.heartbeat.min(idle_left).min(deadline - now);
            if *closing.borrow_and_update() {
                outcome = "run_ended";
                break;
            }
            let next = tokio::select! {
                next = tokio::time::timeout(wait, body.frame()) => next,
                // Told to end, or the handle is gone: the run is over.
                changed = closing.changed() => match changed {
                    Ok(()) => continue,
                    Err(_) => {
                        outcome = "run_ended";
                        break;
                    }
                },
            };
            match next {
                Err(_) => {
                    // A silence: fill it between events so clients and
                    // proxies keep the stream open.
                    let quiet = Instant::now() - last_piece >= limits.heartbeat;
                    if let Some(scanner) = &self.scanner {
                        if quiet
                            && scanner.between_events()
                            && !send(HEARTBEAT.to_vec(), &mut hasher, &mut sent).await
                        {
                            outcome = "client_gone";
                            break;
                        }
                    }
                }
                Ok(None) => {
                    let out = self.unfinished_event();
                    if !out.is_empty() {
                        send(out, &mut hasher, &mut sent).await;
                    }
                    break;
                }
                Ok(Some(Err(_))) => {
                    outcome = "upstream_broken";
                    break;
                }
                Ok(Some(Ok(frame))) => {
                    // The frames already received go out together: one
                    // send (and one write to the client) per batch of at
                    // most [`BATCH`] bytes, not per upstream chunk.
                    let mut out = Vec::new();
                    let mut frame = Some(frame);
                    let mut ending: Option<&'static str> = None;
                    let mut finished = false;
                    while let Some(f) = frame.take() {
                        if let Ok(data) = f.into_data() {
                            last_piece = Instant::now();
                            let kept = out.len();
                            if let Err(why) =
                                self.take(&data, &mut out, &mut copy, &mut received, &limits)
                            {
                                // What this frame completed is not passed on
                                // (as when frames went out one by one).
                                out.truncate(kept);
                                ending = Some(why);
                                break;
                            }
                        }
                        if out.len() >= BATCH {
                            break;
                        }
                        match body.frame().now_or_never() {
                            Some(Some(Ok(next))) => frame = Some(next),
                            Some(Some(Err(_))) => ending = Some("upstream_broken"),
                            Some(None) => finished = true,
                            None => {}
                        }
                    }
                    if !out.is_empty() && !send(out, &mut hasher, &mut sent).await {
                        outcome = "client_gone";
                        break;
                    }
                    if let Some(why) = ending {
                        outcome = why;
                        break;
                    }
                    if finished {
                        let out = self.unfinished_event();
                        if !out.is_empty() {
                            send(out, &mut hasher, &mut sent).await;
                        }
                        break;
                    }
                }
            }
        }
        drop(body);
        drop(tx);
        let ok = (200..300).contains(&self.status);
        let usage = match &self.scanner {
            Some(scanner) => scanner.usage(),
            None => copy
                .as_deref()
                .and_then(|c| serde_json::from_slice::<Value>(c).ok())
                .and_then(|v| sse::usage_of_json(self.shape, &v)),
        };
        let charged = match usage {
            Some(u) => Some(u.total()),
            // An endpoint's refusal costs nothing; a success without usage
            // keeps its whole reservation.
            None if !ok && outcome == "ok" => Some(0),
            None => None,
        };
        let outcome = match (outcome, usage) {
            ("ok", None) if ok => "no_usage".to_string(),
            ("ok", _) if !ok => format!("endpoint_status_{}", self.status),
            (o, _) => o.to_string(),
        };
        settle(
            &self.gw,
            self.call.clone(),
            self.status,
            outcome,
            usage,
            charged,
            self.started.elapsed(),
            Some(self.first_byte),
            sent,
            hex::encode(hasher.finalize()),
        )
        .await;
        drop(self.in_flight);
    }
}
