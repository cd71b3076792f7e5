//! Where a model call's time goes in the gateway, part by part, in process:
//! the token reservation and its settlement (one `STATE/tokens.db`
//! transaction each), reading the endpoint's key, and the call's audit
//! append (a synchronous commit to `state.db`), each N times on a fresh
//! state; then an HTTP/1.1 call to a loopback server over a new connection
//! each time against one kept alive (hyper-util's pooling client, as the
//! gateway's `upstream` now is). Prints markdown rows, median and p99 in
//! microseconds. Run it on the disk the state lives on (BENCH_DIR, default
//! the system's temporary directory):
//!
//!   cargo run --release -p orchestrator --example bench_gateway_parts [N]

use std::convert::Infallible;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use orchestrator::audit_log::Event;
use orchestrator::gateway::tokens::Ask;
use orchestrator::store::{SqliteTokenLedger as TokenLedger, StatePaths, Store};

fn row(label: &str, mut us: Vec<u128>) {
    us.sort_unstable();
    let n = us.len();
    println!(
        "| {label} | {} µs | {} µs |",
        us[n / 2],
        us[(n * 99 / 100).min(n - 1)]
    );
}

fn timed(n: usize, mut f: impl FnMut()) -> Vec<u128> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_micros()
        })
        .collect()
}

fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(500);
    let base = std::env::var_os("BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(base)?;
    let paths = StatePaths::new(dir.path().join("state"));
    let mut store = Store::open(paths.clone())?;
    let mut ledger = TokenLedger::open(&paths)?;
    let key = dir.path().join("key");
    std::fs::write(&key, "sk-bench\n")?;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;

    println!("| part ({n} each) | median | p99 |");
    println!("|---|---:|---:|");
    let ask = Ask {
        input_bound: 200,
        requested_output: Some(100),
        choices: 1,
    };
    row(
        "token reservation (one tokens.db transaction)",
        timed(n, || {
            ledger
                .reserve("r", "2026-12-01", u64::MAX / 4, u64::MAX / 4, ask)
                .unwrap()
                .unwrap();
        }),
    );
    row(
        "token settlement (one tokens.db transaction)",
        timed(n, || {
            ledger.settle("r", "2026-12-01", 300, Some(20)).unwrap();
        }),
    );
    row(
        "reading the endpoint's key",
        timed(n, || {
            orchestrator::gateway::key::read(&key).unwrap();
        }),
    );
    let event = Event::ModelCall {
        endpoint: Some("o".into()),
        model: Some("m".into()),
        shape: Some("chat".into()),
        stream: false,
        status: 200,
        outcome: "ok".into(),
        input_tokens: Some(11),
        output_tokens: Some(7),
        cached_tokens: Some(0),
        reserved_tokens: 300,
        charged_tokens: 18,
        run_tokens: 18,
        run_token_cap: 1000,
        latency_ms: 1,
        first_byte_ms: Some(1),
        request_bytes: 100,
        request_digest: "0".repeat(64),
        response_bytes: 300,
        response_digest: "0".repeat(64),
        label: Some("untrusted, private".into()),
    };
    row(
        "the call's audit append (synchronous commit)",
        timed(n, || {
            store.append(Some("r"), &event, false).unwrap();
        }),
    );

    // An HTTP/1.1 call to a loopback server: a new connection each time,
    // then one connection kept alive.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    rt.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(
                        b"{\"ok\":true}",
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let base = orchestrator::gateway::models::BaseUrl {
        tls: false,
        host: "127.0.0.1".into(),
        port: addr.port(),
        path: String::new(),
    };
    let request = || {
        hyper::Request::builder()
            .method("POST")
            .uri("/v1/chat/completions")
            .body(orchestrator::gateway::upstream::Pieces::new(
                vec![Bytes::from_static(b"{}")],
                (),
            ))
            .unwrap()
    };
    let call = |upstream: &orchestrator::gateway::upstream::Upstream| {
        rt.block_on(async {
            let r = upstream.send(&base, request()).await.unwrap();
            r.into_body().collect().await.unwrap();
        })
    };
    row(
        "loopback HTTP call, new connection each",
        timed(n, || {
            call(&orchestrator::gateway::upstream::Upstream::new(&[]))
        }),
    );
    let kept = orchestrator::gateway::upstream::Upstream::new(&[]);
    call(&kept);
    row(
        "loopback HTTP call, connection kept alive",
        timed(n, || call(&kept)),
    );
    std::thread::sleep(Duration::from_millis(10));
    Ok(())
}
