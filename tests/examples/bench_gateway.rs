//! Added latency and streamed throughput of the model gateway, against
//! calling the scripted model server directly (scripts/bench-gateway.sh).
//!
//! The gateway runs in this process on a Unix socket, as in a run (its
//! ledger and audit in a fresh state directory); the client speaks raw
//! HTTP/1.1, one connection per call, to both. Figures: time to first byte
//! and total per call (p50, p99) for a non-streamed and a streamed chat
//! completion, and the throughput of one long stream; printed as one table
//! with the gateway's additions and ratios.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use serde_json::json;
use tests::model::{ModelServer, Step};

trait Conn: Read + Write {}
impl<T: Read + Write> Conn for T {}

/// One call: (time to the first response byte, time to the last).
fn call(conn: &mut dyn Conn, path: &str, body: &str) -> (Duration, Duration, usize) {
    let started = Instant::now();
    write!(
        conn,
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nauthorization: Bearer placeholder\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let mut first = None;
    let mut total = 0;
    loop {
        let n = conn.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        first.get_or_insert_with(|| started.elapsed());
        total += n;
    }
    (first.unwrap_or_default(), started.elapsed(), total)
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let n: usize = std::env::var("BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let server = ModelServer::start();
    let state = tempfile::tempdir().unwrap();
    let key = state.path().join("key");
    std::fs::write(&key, "sk-bench").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(
        state.path().join("models.toml"),
        format!(
            "[endpoints.o]\napi = \"openai\"\nbase_url = \"{}\"\nkey_file = \"{}\"\nmodels = [\"*\"]\n",
            server.url(),
            key.display()
        ),
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let models = orchestrator::gateway::load(state.path()).unwrap().unwrap();
    let door = state.path().join("doors").join("bench");
    std::fs::create_dir_all(&door).unwrap();
    let stores: orchestrator::state_store::Stores = std::sync::Arc::new(
        orchestrator::store::SqliteBackend::new(state.path().to_path_buf(), None),
    );
    let _gw = rt.block_on(async {
        orchestrator::gateway::open(
            &stores,
            orchestrator::channels::UnixChannel::bind(&door.join("model.sock")).unwrap(),
            "bench",
            orchestrator::acts::run_content_label(policies::Confidentiality::Private),
            models,
            u64::MAX / 4,
            u64::MAX / 4,
        )
    });
    let socket = door.join("model.sock");
    let direct = || -> Box<dyn Conn> {
        let s = std::net::TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        s.set_nodelay(true).unwrap();
        Box::new(s)
    };
    let gateway =
        || -> Box<dyn Conn> { Box::new(std::os::unix::net::UnixStream::connect(&socket).unwrap()) };

    println!(
        "| case | direct p50 | gateway p50 | added p50 | direct p99 | gateway p99 | added p99 |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (name, stream) in [("chat, whole", false), ("chat, streamed", true)] {
        let body = json!({"model": "m", "stream": stream, "max_completion_tokens": 100,
            "messages": [{"role": "user", "content": "hello"}]})
        .to_string();
        let mut results: Vec<[Vec<Duration>; 2]> = Vec::new();
        for connect in [&direct as &dyn Fn() -> Box<dyn Conn>, &gateway] {
            let (mut ttfb, mut total) = (Vec::new(), Vec::new());
            for i in 0..n + 20 {
                server.push(Step::text("hello from the scripted model"));
                let (f, t, _) = call(&mut *connect(), "/v1/chat/completions", &body);
                if i >= 20 {
                    ttfb.push(f);
                    total.push(t);
                }
            }
            results.push([ttfb, total]);
        }
        for (what, k) in [("first byte", 0), ("total", 1)] {
            let (mut d, mut g) = (results[0][k].clone(), results[1][k].clone());
            let (d50, g50, d99, g99) = (
                pct(&mut d, 0.5),
                pct(&mut g, 0.5),
                pct(&mut d, 0.99),
                pct(&mut g, 0.99),
            );
            println!(
                "| {name}, {what} | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs |",
                us(d50), us(g50), us(g50) - us(d50), us(d99), us(g99), us(g99) - us(d99)
            );
        }
    }
    // Throughput: one long stream (256 KiB of text, 8 characters a delta).
    let text = "abcdefgh".repeat(32 * 1024);
    let body = json!({"model": "m", "stream": true, "messages": []}).to_string();
    let mut rates = Vec::new();
    for connect in [&direct as &dyn Fn() -> Box<dyn Conn>, &gateway] {
        let mut best = 0.0f64;
        for _ in 0..3 {
            server.push(Step::text(&text));
            let (_, t, bytes) = call(&mut *connect(), "/v1/chat/completions", &body);
            best = best.max(bytes as f64 / t.as_secs_f64() / (1 << 20) as f64);
        }
        rates.push(best);
    }
    println!();
    println!(
        "| streamed throughput | direct {:.1} MiB/s | gateway {:.1} MiB/s | ratio {:.2} |",
        rates[0],
        rates[1],
        rates[1] / rates[0]
    );
    println!("\n({n} calls per case, one connection per call; client, gateway and server on one machine)");
}
