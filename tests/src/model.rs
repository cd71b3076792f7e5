//! A scripted model server for tests: it stands in for the model endpoints
//! the gateway forwards to, on the host's loopback.
//!
//! It speaks the three request shapes the gateway serves, each streaming
//! (server-sent events framed as the real APIs frame them) and not:
//! - OpenAI Chat Completions, `POST /v1/chat/completions`: `chat.completion`
//!   objects; streamed as `data: {chat.completion.chunk}` lines ending with
//!   `data: [DONE]`, with the final usage chunk (`choices: []`) only when the
//!   request asked for it (`stream_options.include_usage`), as OpenAI does;
//! - OpenAI Responses, `POST /v1/responses`: `response` objects; streamed as
//!   `event: response.*` events ending with `response.completed` (with usage);
//! - Anthropic Messages, `POST /v1/messages`: `message` objects; streamed as
//!   `message_start` (input usage), content blocks, `message_delta`
//!   (cumulative output usage) and `message_stop`.
//!
//! It answers from a script: a queue of [`Step`]s, each a [`Turn`] (text or a
//! tool call: a Claude `tool_use`, an OpenAI chat `tool_calls` entry, a
//! Responses `function_call` item) and a [`Mode`] (normal, or hostile:
//! malformed, endless, oversized line, no usage, slow, an error status). An
//! empty script answers the text `ok`. The usage it reports never passes the
//! request's output bound (`max_tokens`, ...) per choice, as a real
//! endpoint's does not, and a chat request's `n` choices are each billed.
//! It records every request (method,
//! path, headers, body) for assertions. Nothing here is production code.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};

/// One request as the model server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRequest {
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// Every header, names lowercased, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The client's port: calls on one kept-alive connection share it.
    pub peer_port: u16,
}

impl ModelRequest {
    /// The first value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON (`Null` if it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// What the model says in one turn.
#[derive(Debug, Clone, PartialEq)]
pub enum Turn {
    /// Plain text.
    Text(String),
    /// A call of tool `name` with JSON `arguments` (e.g. `Bash` with
    /// `{"command": "ls"}`).
    ToolCall { name: String, arguments: Value },
}

/// How the server answers one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// As the real API would.
    Normal,
    /// A body that is not what the API sends: a non-JSON body, or an SSE
    /// stream of garbage lines.
    Malformed,
    /// A stream that never ends (a 1 KiB text delta every millisecond), for caps.
    Endless,
    /// A stream with one line of this many bytes before the end.
    OversizedLine(usize),
    /// A well-formed answer without any usage.
    NoUsage,
    /// Each chunk (or the whole body) after this delay.
    Slow(Duration),
    /// An error status with this JSON body.
    Status(u16, Value),
}

/// Token counts the server reports. `input` counts every input token,
/// cached ones included (Anthropic's `input_tokens` is reported as `input -
/// cached`, beside `cache_read_input_tokens`, as its API does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    pub cached: u64,
}

impl Default for Usage {
    fn default() -> Self {
        Usage {
            input: 11,
            output: 7,
            cached: 0,
        }
    }
}

/// One scripted answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub turn: Turn,
    pub mode: Mode,
    pub usage: Usage,
}

impl Step {
    pub fn text(text: &str) -> Step {
        Step {
            turn: Turn::Text(text.to_string()),
            mode: Mode::Normal,
            usage: Usage::default(),
        }
    }

    pub fn tool(name: &str, arguments: Value) -> Step {
        Step {
            turn: Turn::ToolCall {
                name: name.to_string(),
                arguments,
            },
            mode: Mode::Normal,
            usage: Usage::default(),
        }
    }

    pub fn mode(mut self, mode: Mode) -> Step {
        self.mode = mode;
        self
    }

    pub fn usage(mut self, input: u64, output: u64) -> Step {
        self.usage.input = input;
        self.usage.output = output;
        self
    }

    pub fn cached(mut self, cached: u64) -> Step {
        self.usage.cached = cached;
        self
    }
}

type Body = BoxBody<Bytes, Infallible>;

#[derive(Debug, Default)]
struct Shared {
    script: Mutex<VecDeque<Step>>,
    log: Mutex<Vec<ModelRequest>>,
    /// Whether only requests offering tools take steps from the script.
    tool_requests_only: std::sync::atomic::AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The scripted model server: serves from a background thread until dropped.
#[derive(Debug)]
pub struct ModelServer {
    addr: SocketAddr,
    tls: bool,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl ModelServer {
    /// Starts a server on 127.0.0.1 on a free port.
    pub fn start() -> ModelServer {
        Self::start_with(None)
    }

    /// Starts a server on 127.0.0.1 that speaks HTTPS with `tls` (a
    /// certificate of a test CA, `crate::loopback::TestCa`).
    pub fn start_tls(tls: crate::loopback::ServerTls) -> ModelServer {
        Self::start_with(Some(tls))
    }

    fn start_with(tls: Option<crate::loopback::ServerTls>) -> ModelServer {
        let with_tls = tls.is_some();
        let acceptor = tls.map(|t| t.acceptor());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let addr = listener.local_addr().expect("listener address");
        let shared = Arc::new(Shared::default());
        let serving = shared.clone();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("model server runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                loop {
                    tokio::select! {
                        _ = &mut stopped => break,
                        accepted = listener.accept() => {
                            let Ok((stream, peer)) = accepted else { continue };
                            let _ = stream.set_nodelay(true);
                            let shared = serving.clone();
                            let acceptor = acceptor.clone();
                            tokio::spawn(async move {
                                match acceptor {
                                    Some(acceptor) => {
                                        // A client that refuses the certificate ends here.
                                        let Ok(tls) = acceptor.accept(stream).await else { return };
                                        serve_connection(tls, shared, peer).await;
                                    }
                                    None => serve_connection(stream, shared, peer).await,
                                }
                            });
                        }
                    }
                }
            });
            runtime.shutdown_background();
        });
        ModelServer {
            addr,
            tls: with_tls,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// From now on only requests that offer tools (a non-empty `tools`
    /// array) take steps from the script; any other request (a real
    /// agent's side calls: titles, quota probes, summaries) is answered
    /// `ok` without consuming one.
    pub fn steps_only_for_tool_requests(&self) {
        self.shared
            .tool_requests_only
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Appends a step to the script.
    pub fn push(&self, step: Step) {
        lock(&self.shared.script).push_back(step);
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `http://127.0.0.1:PORT` (`https://` when started with TLS; no
    /// trailing slash, no `/v1`).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<ModelRequest> {
        lock(&self.shared.log).clone()
    }
}

/// Serves one connection (plain or TLS) until the client closes it.
async fn serve_connection<I>(io: I, shared: Arc<Shared>, peer: SocketAddr)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(handle(&shared, req, peer.port()).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
        .await;
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Which API a request speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Chat,
    Responses,
    Messages,
}

async fn handle(
    shared: &Shared,
    req: Request<hyper::body::Incoming>,
    peer_port: u16,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let recorded = ModelRequest {
        peer_port,
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        headers: parts
            .headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: body.to_vec(),
    };
    let seq = {
        let mut log = lock(&shared.log);
        log.push(recorded.clone());
        log.len()
    };
    let shape = match (recorded.method.as_str(), recorded.path.as_str()) {
        ("POST", "/v1/chat/completions") => Shape::Chat,
        ("POST", "/v1/responses") => Shape::Responses,
        ("POST", "/v1/messages") => Shape::Messages,
        _ => {
            return json_response(
                StatusCode::NOT_FOUND,
                &json!({"error": {"type": "not_found", "message": "no such route"}}),
            )
        }
    };
    let request = recorded.json();
    let takes_step = !shared
        .tool_requests_only
        .load(std::sync::atomic::Ordering::SeqCst)
        || request["tools"].as_array().is_some_and(|t| !t.is_empty());
    let mut step = takes_step
        .then(|| lock(&shared.script).pop_front())
        .flatten()
        .unwrap_or_else(|| Step::text("ok"));
    // Each tool call has its own id, as a real endpoint's do (an agent
    // pairs each result with its call by id): `toolu_N` (Messages),
    // `call_N` (Chat Completions, and a Responses item's `call_id`, its
    // item id being `fc_N`), N the request's number.
    let tool_id = format!("toolu_{seq:04}");
    let call_id = format!("call_{seq:04}");
    // As a real endpoint does, the output stops at the request's bound.
    if let Some(bound) = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
        .iter()
        .filter_map(|f| request[*f].as_u64())
        .min()
    {
        step.usage.output = step.usage.output.min(bound);
    }
    // Chat Completions bills each of the `n` choices its output.
    if matches!(shape, Shape::Chat) {
        if let Some(n) = request["n"].as_u64() {
            step.usage.output = step.usage.output.saturating_mul(n);
        }
    }
    let model = request["model"].as_str().unwrap_or("unknown").to_string();
    let stream = request["stream"].as_bool().unwrap_or(false);
    if let Mode::Status(code, body) = &step.mode {
        return json_response(
            StatusCode::from_u16(*code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            body,
        );
    }
    if !stream {
        if let Mode::Slow(d) = step.mode {
            tokio::time::sleep(d).await;
        }
        if step.mode == Mode::Malformed {
            return bytes_response(
                "application/json",
                Bytes::from_static(b"{\"id\": \"x\", oops"),
            );
        }
        let with_usage = step.mode != Mode::NoUsage;
        let value = match shape {
            Shape::Chat => chat_whole(&model, &step, with_usage, &call_id),
            Shape::Responses => responses_whole(&model, &step, with_usage, &call_id),
            Shape::Messages => messages_whole(&model, &step, with_usage, &tool_id),
        };
        return json_response(StatusCode::OK, &value);
    }
    let include_usage = request["stream_options"]["include_usage"].as_bool() == Some(true);
    let events = match shape {
        Shape::Chat => chat_events(&model, &step, include_usage, &call_id),
        Shape::Responses => responses_events(&model, &step, &call_id),
        Shape::Messages => messages_events(&model, &step, &tool_id),
    };
    sse_response(shape, step.mode.clone(), events)
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut r = bytes_response("application/json", Bytes::from(value.to_string()));
    *r.status_mut() = status;
    r
}

fn bytes_response(content_type: &str, body: Bytes) -> Response<Body> {
    let mut r = Response::new(Full::new(body).boxed());
    r.headers_mut()
        .insert("content-type", content_type.parse().expect("content type"));
    r
}

/// One SSE event: an optional `event:` name and its JSON data (or raw data
/// such as `[DONE]`).
#[derive(Debug, Clone)]
struct Event {
    name: Option<String>,
    data: String,
}

fn frame(event: &Event) -> Bytes {
    match &event.name {
        Some(n) => Bytes::from(format!("event: {n}\ndata: {}\n\n", event.data)),
        None => Bytes::from(format!("data: {}\n\n", event.data)),
    }
}

fn named(name: &str, data: Value) -> Event {
    Event {
        name: Some(name.to_string()),
        data: data.to_string(),
    }
}

fn unnamed(data: Value) -> Event {
    Event {
        name: None,
        data: data.to_string(),
    }
}

/// Whether an event carries usage (dropped in [`Mode::NoUsage`]).
fn carries_usage(e: &Event) -> bool {
    let Ok(v) = serde_json::from_str::<Value>(&e.data) else {
        return false;
    };
    (v["usage"].is_object() && v["choices"].as_array().is_some_and(Vec::is_empty))
        || v["type"] == "response.completed"
        || v["type"] == "message_delta"
}

fn sse_response(shape: Shape, mode: Mode, events: Vec<Event>) -> Response<Body> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let send = |b: Bytes| {
            let tx = tx.clone();
            async move { tx.send(b).await.is_ok() }
        };
        match mode {
            Mode::Malformed => {
                for line in [
                    "data: {not json\n\n",
                    "event: response.completed\ndata: [1,2\n\n",
                    "data: \u{0}\u{1}garbage\n",
                    ":\n\n",
                ] {
                    if !send(Bytes::from(line)).await {
                        return;
                    }
                }
            }
            Mode::Endless => {
                if let Some(first) = events.first() {
                    if !send(frame(first)).await {
                        return;
                    }
                }
                let more = "more ".repeat(205);
                loop {
                    let more = more.as_str();
                    let delta = match shape {
                        Shape::Chat => unnamed(json!({"object": "chat.completion.chunk",
                            "choices": [{"index": 0, "delta": {"content": more}, "finish_reason": null}]})),
                        Shape::Responses => named(
                            "response.output_text.delta",
                            json!({
                            "type": "response.output_text.delta", "item_id": "msg_1",
                            "output_index": 0, "content_index": 0, "delta": more}),
                        ),
                        Shape::Messages => named(
                            "content_block_delta",
                            json!({
                            "type": "content_block_delta", "index": 0,
                            "delta": {"type": "text_delta", "text": more}}),
                        ),
                    };
                    if !send(frame(&delta)).await {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            Mode::OversizedLine(n) => {
                if let Some(first) = events.first() {
                    if !send(frame(first)).await {
                        return;
                    }
                }
                let mut line = Vec::with_capacity(n + 8);
                line.extend_from_slice(b"data: ");
                line.resize(n, b'a');
                line.extend_from_slice(b"\n\n");
                if !send(Bytes::from(line)).await {
                    return;
                }
                for e in &events[1..] {
                    if !send(frame(e)).await {
                        return;
                    }
                }
            }
            Mode::Slow(d) => {
                for e in &events {
                    tokio::time::sleep(d).await;
                    if !send(frame(e)).await {
                        return;
                    }
                }
            }
            Mode::NoUsage => {
                for e in events.iter().filter(|e| !carries_usage(e)) {
                    if !send(frame(e)).await {
                        return;
                    }
                }
            }
            Mode::Normal | Mode::Status(..) => {
                for e in &events {
                    if !send(frame(e)).await {
                        return;
                    }
                }
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    r.headers_mut().insert(
        "content-type",
        "text/event-stream; charset=utf-8".parse().expect("header"),
    );
    r.headers_mut()
        .insert("cache-control", "no-cache".parse().expect("header"));
    r
}

const CREATED: u64 = 1_764_000_000;

fn arguments_text(arguments: &Value) -> String {
    arguments.to_string()
}

// ---- OpenAI Chat Completions -------------------------------------------

fn chat_usage(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.input,
        "completion_tokens": u.output,
        "total_tokens": u.input + u.output,
        "prompt_tokens_details": {"cached_tokens": u.cached, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
            "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
    })
}

fn chat_whole(model: &str, step: &Step, with_usage: bool, call_id: &str) -> Value {
    let (message, finish) = match &step.turn {
        Turn::Text(t) => (
            json!({"role": "assistant", "content": t, "refusal": null, "annotations": []}),
            "stop",
        ),
        Turn::ToolCall { name, arguments } => (
            json!({"role": "assistant", "content": null, "refusal": null, "annotations": [],
                "tool_calls": [{"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": arguments_text(arguments)}}]}),
            "tool_calls",
        ),
    };
    let mut v = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": CREATED, "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
        "service_tier": "default", "system_fingerprint": "fp_scripted"
    });
    if with_usage {
        v["usage"] = chat_usage(&step.usage);
    }
    v
}

fn chat_events(model: &str, step: &Step, include_usage: bool, call_id: &str) -> Vec<Event> {
    let chunk = |choices: Value| {
        let mut v = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
            "created": CREATED, "model": model, "service_tier": "default",
            "system_fingerprint": "fp_scripted", "choices": choices});
        if include_usage {
            v["usage"] = Value::Null;
        }
        unnamed(v)
    };
    let mut events = Vec::new();
    let finish = match &step.turn {
        Turn::Text(t) => {
            events.push(chunk(json!([{"index": 0,
                "delta": {"role": "assistant", "content": "", "refusal": null},
                "logprobs": null, "finish_reason": null}])));
            for piece in split(t) {
                events.push(chunk(json!([{"index": 0, "delta": {"content": piece},
                    "logprobs": null, "finish_reason": null}])));
            }
            "stop"
        }
        Turn::ToolCall { name, arguments } => {
            events.push(chunk(json!([{"index": 0,
                "delta": {"role": "assistant", "content": null, "tool_calls": [{"index": 0,
                    "id": call_id, "type": "function",
                    "function": {"name": name, "arguments": ""}}]},
                "logprobs": null, "finish_reason": null}])));
            for piece in split(&arguments_text(arguments)) {
                events.push(chunk(
                    json!([{"index": 0, "delta": {"tool_calls": [{"index": 0,
                    "function": {"arguments": piece}}]}, "logprobs": null, "finish_reason": null}]),
                ));
            }
            "tool_calls"
        }
    };
    events.push(chunk(
        json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish}]),
    ));
    if include_usage {
        let mut last = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
            "created": CREATED, "model": model, "service_tier": "default",
            "system_fingerprint": "fp_scripted", "choices": []});
        last["usage"] = chat_usage(&step.usage);
        events.push(unnamed(last));
    }
    events.push(Event {
        name: None,
        data: "[DONE]".to_string(),
    });
    events
}

/// Splits text into a few pieces, the way deltas arrive.
fn split(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    if chars.is_empty() {
        return vec![String::new()];
    }
    chars.chunks(8).map(|c| c.iter().collect()).collect()
}

// ---- OpenAI Responses ---------------------------------------------------

fn responses_usage(u: &Usage) -> Value {
    json!({
        "input_tokens": u.input,
        "input_tokens_details": {"cached_tokens": u.cached},
        "output_tokens": u.output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.input + u.output
    })
}

/// The id of a Responses `function_call` item answering with `call_id`.
fn item_id(call_id: &str) -> String {
    call_id.replacen("call_", "fc_", 1)
}

fn responses_item(step: &Step, call_id: &str) -> Value {
    match &step.turn {
        Turn::Text(t) => json!({"type": "message", "id": "msg_1", "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": t, "annotations": [], "logprobs": []}]}),
        Turn::ToolCall { name, arguments } => json!({"type": "function_call",
            "id": item_id(call_id), "call_id": call_id, "name": name,
            "arguments": arguments_text(arguments),
            "status": "completed"}),
    }
}

fn response_object(model: &str, status: &str, output: Value, usage: Option<Value>) -> Value {
    json!({
        "id": "resp_1", "object": "response", "created_at": CREATED, "status": status,
        "background": false, "error": null, "incomplete_details": null, "instructions": null,
        "max_output_tokens": null, "model": model, "output": output,
        "parallel_tool_calls": true, "previous_response_id": null,
        "reasoning": {"effort": null, "summary": null}, "store": false, "temperature": 1.0,
        "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [], "top_p": 1.0,
        "truncation": "disabled", "usage": usage, "user": null, "metadata": {}
    })
}

fn responses_whole(model: &str, step: &Step, with_usage: bool, call_id: &str) -> Value {
    response_object(
        model,
        "completed",
        json!([responses_item(step, call_id)]),
        with_usage.then(|| responses_usage(&step.usage)),
    )
}

fn responses_events(model: &str, step: &Step, call_id: &str) -> Vec<Event> {
    let mut seq = 0u64;
    let mut ev = |name: &str, mut data: Value| {
        data["type"] = json!(name);
        data["sequence_number"] = json!(seq);
        seq += 1;
        named(name, data)
    };
    let mut events = vec![
        ev(
            "response.created",
            json!({"response": response_object(model, "in_progress", json!([]), None)}),
        ),
        ev(
            "response.in_progress",
            json!({"response": response_object(model, "in_progress", json!([]), None)}),
        ),
    ];
    let item = responses_item(step, call_id);
    let fc = item_id(call_id);
    match &step.turn {
        Turn::Text(t) => {
            events.push(ev(
                "response.output_item.added",
                json!({"output_index": 0,
                "item": {"type": "message", "id": "msg_1", "status": "in_progress",
                    "role": "assistant", "content": []}}),
            ));
            events.push(ev(
                "response.content_part.added",
                json!({"item_id": "msg_1",
                "output_index": 0, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}),
            ));
            for piece in split(t) {
                events.push(ev(
                    "response.output_text.delta",
                    json!({"item_id": "msg_1",
                    "output_index": 0, "content_index": 0, "delta": piece, "logprobs": []}),
                ));
            }
            events.push(ev(
                "response.output_text.done",
                json!({"item_id": "msg_1",
                "output_index": 0, "content_index": 0, "text": t, "logprobs": []}),
            ));
            events.push(ev(
                "response.content_part.done",
                json!({"item_id": "msg_1",
                "output_index": 0, "content_index": 0,
                "part": {"type": "output_text", "text": t, "annotations": [], "logprobs": []}}),
            ));
        }
        Turn::ToolCall { name, arguments } => {
            events.push(ev(
                "response.output_item.added",
                json!({"output_index": 0,
                "item": {"type": "function_call", "id": fc, "call_id": call_id,
                    "name": name, "arguments": "", "status": "in_progress"}}),
            ));
            let args = arguments_text(arguments);
            for piece in split(&args) {
                events.push(ev(
                    "response.function_call_arguments.delta",
                    json!({"item_id": fc, "output_index": 0, "delta": piece}),
                ));
            }
            events.push(ev(
                "response.function_call_arguments.done",
                json!({"item_id": fc, "output_index": 0, "arguments": args}),
            ));
        }
    }
    events.push(ev(
        "response.output_item.done",
        json!({"output_index": 0, "item": item.clone()}),
    ));
    events.push(ev(
        "response.completed",
        json!({"response": response_object(model, "completed", json!([item]),
            Some(responses_usage(&step.usage)))}),
    ));
    events
}

// ---- Anthropic Messages -------------------------------------------------

fn messages_whole(model: &str, step: &Step, with_usage: bool, tool_id: &str) -> Value {
    let (content, stop) = match &step.turn {
        Turn::Text(t) => (json!([{"type": "text", "text": t}]), "end_turn"),
        Turn::ToolCall { name, arguments } => (
            json!([{"type": "tool_use", "id": tool_id, "name": name, "input": arguments}]),
            "tool_use",
        ),
    };
    let mut v = json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": stop, "stop_sequence": null
    });
    if with_usage {
        v["usage"] = json!({"input_tokens": step.usage.input.saturating_sub(step.usage.cached),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": step.usage.cached,
            "output_tokens": step.usage.output, "service_tier": "standard"});
    }
    v
}

fn messages_events(model: &str, step: &Step, tool_id: &str) -> Vec<Event> {
    let mut events = vec![named(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": step.usage.input.saturating_sub(step.usage.cached),
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": step.usage.cached, "output_tokens": 1,
                "service_tier": "standard"}}}),
    )];
    let stop = match &step.turn {
        Turn::Text(t) => {
            events.push(named(
                "content_block_start",
                json!({"type": "content_block_start",
                "index": 0, "content_block": {"type": "text", "text": ""}}),
            ));
            events.push(named("ping", json!({"type": "ping"})));
            for piece in split(t) {
                events.push(named(
                    "content_block_delta",
                    json!({"type": "content_block_delta",
                    "index": 0, "delta": {"type": "text_delta", "text": piece}}),
                ));
            }
            "end_turn"
        }
        Turn::ToolCall { name, arguments } => {
            events.push(named(
                "content_block_start",
                json!({"type": "content_block_start",
                "index": 0, "content_block": {"type": "tool_use", "id": tool_id,
                    "name": name, "input": {}}}),
            ));
            events.push(named("ping", json!({"type": "ping"})));
            for piece in split(&arguments_text(arguments)) {
                events.push(named(
                    "content_block_delta",
                    json!({"type": "content_block_delta",
                    "index": 0, "delta": {"type": "input_json_delta", "partial_json": piece}}),
                ));
            }
            "tool_use"
        }
    };
    events.push(named(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    events.push(named(
        "message_delta",
        json!({"type": "message_delta",
        "delta": {"stop_reason": stop, "stop_sequence": null},
        "usage": {"output_tokens": step.usage.output}}),
    ));
    events.push(named("message_stop", json!({"type": "message_stop"})));
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn post(server: &ModelServer, path: &str, body: &Value) -> String {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        let body = body.to_string();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn each_shape_answers_streaming_and_not_and_is_recorded() {
        let server = ModelServer::start();
        server.push(Step::text("hello there, world").usage(5, 3));
        let out = post(
            &server,
            "/v1/chat/completions",
            &json!({"model": "m", "stream": true,
            "stream_options": {"include_usage": true}}),
        );
        assert!(out.contains("chat.completion.chunk"), "{out}");
        assert!(out.contains("\"prompt_tokens\":5"), "{out}");
        assert!(out.contains("data: [DONE]"), "{out}");
        let out = post(
            &server,
            "/v1/chat/completions",
            &json!({"model": "m", "stream": true}),
        );
        assert!(!out.contains("prompt_tokens"), "{out}");
        server.push(Step::tool("Bash", json!({"command": "ls"})));
        let out = post(
            &server,
            "/v1/messages",
            &json!({"model": "c", "stream": true}),
        );
        assert!(out.contains("event: message_start"), "{out}");
        assert!(out.contains("input_json_delta"), "{out}");
        let out = post(&server, "/v1/responses", &json!({"model": "g"}));
        assert!(out.contains("\"output_text\""), "{out}");
        let out = post(
            &server,
            "/v1/responses",
            &json!({"model": "g", "stream": true}),
        );
        assert!(out.contains("event: response.completed"), "{out}");
        let out = post(&server, "/v1/nope", &json!({}));
        assert!(out.starts_with("HTTP/1.1 404"), "{out}");
        let reqs = server.requests();
        assert_eq!(reqs.len(), 6);
        assert_eq!(reqs[2].path, "/v1/messages");
        assert_eq!(reqs[2].header("content-type"), Some("application/json"));
        assert_eq!(reqs[0].json()["model"], "m");
    }

    #[test]
    fn no_usage_drops_usage_events() {
        let server = ModelServer::start();
        server.push(Step::text("x").mode(Mode::NoUsage));
        let out = post(
            &server,
            "/v1/messages",
            &json!({"model": "c", "stream": true}),
        );
        assert!(!out.contains("message_delta"), "{out}");
        assert!(out.contains("message_stop"), "{out}");
    }

    #[test]
    fn side_calls_skip_the_script_and_each_tool_use_has_its_own_id() {
        let server = ModelServer::start();
        server.steps_only_for_tool_requests();
        server.push(Step::tool("Bash", json!({"command": "ls"})));
        server.push(Step::tool("Bash", json!({"command": "pwd"})));
        let tools = json!([{"name": "Bash", "input_schema": {"type": "object"}}]);
        let out = post(&server, "/v1/messages", &json!({"model": "c"}));
        assert!(out.contains("\"text\":\"ok\""), "{out}");
        let first = post(
            &server,
            "/v1/messages",
            &json!({"model": "c", "tools": tools}),
        );
        let second = post(
            &server,
            "/v1/messages",
            &json!({"model": "c", "tools": tools}),
        );
        assert!(first.contains("\"id\":\"toolu_0002\""), "{first}");
        assert!(second.contains("\"id\":\"toolu_0003\""), "{second}");
        assert!(second.contains("pwd"), "{second}");
    }
}
