//! Several `nightshift worker`s on one PostgreSQL store, each naming its
//! own host (`NIGHTSHIFT_HOST_ID`), one of them cut off from the store
//! through a TCP proxy the test owns (a partition, not a kill): the cut
//! worker stops its sandboxes before its claims lapse; the other takes its
//! tasks over only once they have, settles their runs in the store as lost
//! once their sandboxes have surely ended, and runs again the task that
//! says it may be retried; when the cut worker comes back, its fenced
//! writes change nothing. Every task ends once, no sandbox outlives its
//! claim, the audit chain verifies.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tests::queue::{tasks, wait_tasks};
use tests::{image, make_repo, stderr, State};

/// A TCP proxy from loopback to the PostgreSQL server's Unix socket that
/// the test can cut (every connection closed, new ones refused) and heal.
struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(socket: std::path::PathBuf) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (c, o) = (cut.clone(), open.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                if c.load(Ordering::SeqCst) {
                    let _ = conn.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = UnixStream::connect(&socket) else {
                    continue;
                };
                o.lock().unwrap().push(conn.try_clone().unwrap());
                let (mut cr, mut cw) = (conn.try_clone().unwrap(), conn);
                let (mut sr, mut sw) = (server.try_clone().unwrap(), server);
                std::thread::spawn(move || {
                    let _ = pump(&mut cr, &mut sw);
                    let _ = sw.shutdown(Shutdown::Both);
                });
                std::thread::spawn(move || {
                    let _ = pump(&mut sr, &mut cw);
                    let _ = cw.shutdown(Shutdown::Both);
                });
            }
        });
        Proxy { port, cut, open }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for c in self.open.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

fn pump(from: &mut impl Read, to: &mut impl Write) -> std::io::Result<()> {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        to.write_all(&buf[..n])?;
    }
}

/// The Unix socket and the database of a test database's URL
/// (`postgres:///DB?host=DIR&user=U[&port=P]`), and its user.
fn socket_of(url: &str) -> (std::path::PathBuf, String, String) {
    let rest = url.strip_prefix("postgres:///").expect("a socket URL");
    let (db, query) = rest.split_once('?').expect("a query");
    let param = |k: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .map(str::to_string)
    };
    let dir = param("host").expect("the socket's directory");
    let port = param("port").unwrap_or_else(|| "5432".into());
    let user = param("user").unwrap_or_else(|| "postgres".into());
    (
        std::path::Path::new(&dir).join(format!(".s.PGSQL.{port}")),
        db.to_string(),
        user,
    )
}

struct Worker(std::process::Child);

impl Worker {
    fn start(state: &State, host: &str, store: &str) -> Worker {
        let log = std::fs::File::create(state.path().join(format!("worker-{host}.log"))).unwrap();
        Worker(
            state
                .cmd()
                .env("NIGHTSHIFT_STORE", store)
                .env("NIGHTSHIFT_HOST_ID", host)
                .args(["worker", "--max-parallel", "3", "--task-lease-secs", "12"])
                .stdout(std::process::Stdio::null())
                .stderr(log)
                .spawn()
                .expect("starting a worker"),
        )
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The running containers of one run (its label).
fn containers_of(run: &str) -> usize {
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "-q",
            "--filter",
            &format!("label=nightshift.run={run}"),
        ])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .count()
}

#[test]
fn a_worker_cut_off_from_the_store_is_fenced_and_another_settles_its_tasks_once() {
    let url = orchestrator::store_postgres::testing::fresh_database();
    let state = State {
        dir: tempfile::Builder::new()
            .prefix("nightshift-e2e-")
            .tempdir()
            .unwrap(),

        store_url: Some(url.clone()),
    };
    struct Cleanup<'a>(&'a State);
    impl Drop for Cleanup<'_> {
        fn drop(&mut self) {
            let _ = self.0.run(&["kill", "--all"]);
        }
    }
    let _cleanup = Cleanup(&state);
    eprintln!("state: {}", state.path().display());
    // Sandboxes end by themselves 5 s after their supervisor's last
    // renewal of their lease.
    std::fs::write(state.path().join("config.toml"), "[caps]\nlease = \"5s\"\n").unwrap();
    let repo = make_repo();
    let task = |retries: u32| {
        format!(
            "[[task]]\nrepo = {:?}\nimage = {:?}\nretries = {retries}\nmemory = \"128m\"\ncpus = 0.25\ncommand = [\"bash\", \"-c\", \"echo 1 > started.txt; sleep 20; echo 1 > done.txt\"]\n",
            repo.path().to_str().unwrap(),
            image()
        )
    };
    let file = state.path().join("tasks.toml");
    std::fs::write(&file, format!("{}{}{}", task(0), task(0), task(1))).unwrap();
    let out = state.run(&["enqueue", "--file", file.to_str().unwrap()]);
    assert!(out.status.success(), "enqueue: {}", stderr(&out));

    // Worker A reaches the store only through the proxy.
    let (socket, db, user) = socket_of(&url);
    let proxy = Proxy::start(socket);
    let through = format!("postgres://{user}@127.0.0.1:{}/{db}", proxy.port);
    let a = Worker::start(&state, "host-a", &through);
    wait_tasks(&state, "worker A running all three", |t| {
        t.iter().all(|t| {
            t["state"] == "running"
                && t["progress"]["dispatcher"]
                    .as_str()
                    .is_some_and(|d| d.ends_with("@host-a"))
        })
    });
    let runs_of_a: Vec<String> = tasks(&state)
        .iter()
        .map(|t| t["progress"]["run"].as_str().unwrap().to_string())
        .collect();
    // Each run's sandbox is up.
    let up = Instant::now();
    while runs_of_a.iter().any(|r| containers_of(r) == 0) {
        assert!(
            up.elapsed() < Duration::from_secs(120),
            "sandboxes never up"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let b = Worker::start(&state, "host-b", &url);

    // The fleet (three at once) is never exceeded while the workers share
    // the store: sampled until the end.
    let sampling = Arc::new(AtomicBool::new(true));
    let most = Arc::new(Mutex::new(0usize));
    let sampler = {
        let (on, most) = (sampling.clone(), most.clone());
        let state_path = state.path().to_path_buf();
        std::thread::spawn(move || {
            let tag = orchestrator::state_tag(&state_path);
            while on.load(Ordering::SeqCst) {
                let out = std::process::Command::new("docker")
                    .args([
                        "ps",
                        "-q",
                        "--filter",
                        &format!("label=nightshift.state={tag}"),
                    ])
                    .output()
                    .unwrap();
                let n = String::from_utf8_lossy(&out.stdout)
                    .split_whitespace()
                    .count();
                let mut m = most.lock().unwrap();
                *m = (*m).max(n);
                drop(m);
                std::thread::sleep(Duration::from_millis(250));
            }
        })
    };

    // Cut A off. Its claims, as the store last saw them:
    proxy.cut();
    let cut_at = unix_now();
    let store = state.stores().connect().unwrap();
    let claims: Vec<(String, i64)> = store
        .tasks()
        .unwrap()
        .into_iter()
        .map(|t| {
            let (holder, until) = t.lease.expect("a running task has a lease");
            assert!(holder.contains("@host-a"), "{holder}");
            (t.id, until)
        })
        .collect();
    // A stops every sandbox of its own before its claims lapse (a claim
    // holds through its last second).
    let lapse = claims.iter().map(|(_, u)| *u).min().unwrap();
    let gone_by = Instant::now();
    while runs_of_a.iter().any(|r| containers_of(r) > 0) {
        assert!(
            gone_by.elapsed() < Duration::from_secs(60),
            "A's sandboxes outlived the cut"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let gone_at = unix_now();
    assert!(
        gone_at <= lapse,
        "A's sandboxes were gone at {gone_at}, after its claims lapsed at {lapse} (cut at {cut_at})"
    );

    // A stopped them itself, having failed to renew (not only because its
    // runs' own writes to the store failed).
    let log = std::fs::read_to_string(state.path().join("worker-host-a.log")).unwrap();
    assert!(
        log.contains("could not renew its claim in time"),
        "worker A never fenced itself: {log}"
    );

    // B takes the tasks over once the claims lapsed, and settles them once
    // the sandboxes have surely ended: the two that may not be retried
    // fail naming their lost worker, the third runs again, on B.
    wait_tasks(&state, "A's tasks settled by B", |t| {
        t[0]["state"] == "failed"
            && t[1]["state"] == "failed"
            && t[2]["progress"]["attempt"] == 1
            && t[2]["state"] == "running"
    });
    let t = tasks(&state);
    for t in &t[..2] {
        let reason = t["progress"]["reason"].as_str().unwrap();
        assert!(reason.contains("stopped renewing its claim"), "{t:#?}");
    }
    let retried = t[2]["progress"]["run"].as_str().unwrap().to_string();
    assert!(!runs_of_a.contains(&retried), "{t:#?}");
    assert!(
        t[2]["progress"]["dispatcher"]
            .as_str()
            .unwrap()
            .ends_with("@host-b"),
        "{t:#?}"
    );
    let runs = state.runs();
    for run in &runs_of_a {
        let r = runs.iter().find(|r| r["id"] == run.as_str()).unwrap();
        assert_eq!(
            r["status"], "lost: its worker stopped renewing its claim",
            "{r:#?}"
        );
    }

    // A comes back: its fenced writes change nothing.
    proxy.heal();
    wait_tasks(&state, "the retried task done", |t| t[2]["state"] == "done");
    std::thread::sleep(Duration::from_secs(5));
    let after = tasks(&state);
    assert_eq!(after[0]["state"], "failed", "{after:#?}");
    assert_eq!(after[1]["state"], "failed", "{after:#?}");
    assert_eq!(after[2]["progress"]["run"], retried.as_str(), "{after:#?}");
    let runs = state.runs();
    assert_eq!(runs.len(), 4, "a task ran twice or not at all: {runs:#?}");
    for run in &runs_of_a {
        let r = runs.iter().find(|r| r["id"] == run.as_str()).unwrap();
        assert_eq!(
            r["status"], "lost: its worker stopped renewing its claim",
            "A's return overwrote the ending B decided: {r:#?}"
        );
    }
    let r = runs.iter().find(|r| r["id"] == retried.as_str()).unwrap();
    assert_eq!(r["status"], "exited 0", "{r:#?}");
    // Each run ended once in the audit.
    let ended = state.audit_runs_and_bodies("run_ended");
    for run in runs_of_a.iter().chain([&retried]) {
        let n = ended
            .iter()
            .filter(|(r, _)| r.as_deref() == Some(run.as_str()))
            .count();
        assert_eq!(n, 1, "run {run} ended {n} times");
    }
    sampling.store(false, Ordering::SeqCst);
    sampler.join().unwrap();
    assert!(
        *most.lock().unwrap() <= 3,
        "the fleet's three were exceeded"
    );
    drop(a);
    drop(b);
    assert!(state.verify().status.success());
}
