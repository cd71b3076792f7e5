//! Several `nightshift worker`s on one PostgreSQL store, each naming its
//! own host (`NIGHTSHIFT_HOST_ID`), one of them cut off from the store
//! through a TCP proxy the test owns (a partition, not a kill): the cut
//! worker stops its sandboxes before its claims lapse; the other takes its
//! tasks over only once they have, settles their runs in the store as lost
//! once their sandboxes have surely ended, and runs again the task that
//! says it may be retried; when the cut worker comes back, its fenced
//! writes change nothing, and the worktrees it kept of those runs are
//! imported (each lost run gains its result). Every task ends once, no
//! sandbox outlives its claim, the audit chain verifies.

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
    let out = std::process::Command::new(tests::engine_cli())
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
                let out = std::process::Command::new(tests::engine_cli())
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
    // What A's agents wrote before the cut, kept in A's worktrees, is
    // imported once A reaches the store again: each lost run gains its
    // result (holding the file its agent wrote) and keeps B's decision.
    let imported_by = Instant::now();
    let runs = loop {
        let runs = state.runs();
        let of_a: Vec<&serde_json::Value> = runs
            .iter()
            .filter(|r| runs_of_a.iter().any(|a| r["id"] == a.as_str()))
            .collect();
        if of_a.iter().all(|r| r["result_ref"].is_string()) {
            break runs;
        }
        assert!(
            imported_by.elapsed() < Duration::from_secs(60),
            "A's kept worktrees were never imported: {of_a:#?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    for run in &runs_of_a {
        let r = runs.iter().find(|r| r["id"] == run.as_str()).unwrap();
        assert_eq!(
            r["status"], "lost: its worker stopped renewing its claim",
            "{r:#?}"
        );
        assert!(
            r["reason"]
                .as_str()
                .is_some_and(|w| w.contains("imported when the worker reached the store again")),
            "{r:#?}"
        );
        let result = r["result_ref"].as_str().unwrap();
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(repo.path())
            .args(["cat-file", "-e", &format!("{result}:started.txt")])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "run {run}'s result lacks what its agent wrote: {}",
            stderr(&out)
        );
    }
    assert!(
        !state
            .path()
            .join("worktrees")
            .read_dir()
            .is_ok_and(|mut d| d.next().is_some()),
        "a kept worktree is left after its import"
    );
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

/// A network namespace with one veth pair to the host: the host's end at
/// 10.77.N.1, the namespace's at 10.77.N.2. Removed when dropped.
struct NetNs {
    name: String,
    host_if: String,
    host_addr: String,
}

impl NetNs {
    fn make(n: u8) -> NetNs {
        let tag = std::process::id() % 10_000;
        let name = format!("ns-w{n}-{tag}");
        let host_if = format!("vh{n}-{tag}");
        let ns_if = format!("vn{n}-{tag}");
        let host_addr = format!("10.77.{n}.1");
        let ip = |args: &[&str]| {
            let out = std::process::Command::new("ip")
                .args(args)
                .output()
                .expect("ip");
            assert!(
                out.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &name])
            .output();
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &host_if])
            .output();
        ip(&["netns", "add", &name]);
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
        ]);
        ip(&["link", "set", &ns_if, "netns", &name]);
        ip(&["addr", "add", &format!("{host_addr}/24"), "dev", &host_if]);
        ip(&["link", "set", &host_if, "up"]);
        let ns_addr = format!("10.77.{n}.2/24");
        ip(&["-n", &name, "addr", "add", &ns_addr, "dev", &ns_if]);
        ip(&["-n", &name, "link", "set", &ns_if, "up"]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        // Each side knows the other's address for good, so that a partition
        // is silence (no neighbour lookup fails, no error comes back): a
        // blackhole, not a refusal.
        let mac_of = |args: &[&str]| {
            let out = std::process::Command::new("ip")
                .args(args)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            text.split_whitespace()
                .skip_while(|w| *w != "link/ether")
                .nth(1)
                .expect("a MAC address")
                .to_string()
        };
        let host_mac = mac_of(&["link", "show", &host_if]);
        let ns_mac = mac_of(&["-n", &name, "link", "show", &ns_if]);
        ip(&[
            "neigh",
            "replace",
            &format!("10.77.{n}.2"),
            "lladdr",
            &ns_mac,
            "dev",
            &host_if,
            "nud",
            "permanent",
        ]);
        ip(&[
            "-n",
            &name,
            "neigh",
            "replace",
            &host_addr,
            "lladdr",
            &host_mac,
            "dev",
            &ns_if,
            "nud",
            "permanent",
        ]);
        NetNs {
            name,
            host_if,
            host_addr,
        }
    }

    /// Packets between the namespace and the host dropped from now on: no
    /// reset, no refusal (a partition, as a cut cable or a dead switch).
    fn partition(&self) {
        let out = std::process::Command::new("ip")
            .args(["link", "set", &self.host_if, "down"])
            .output()
            .unwrap();
        assert!(out.status.success());
    }

    fn heal(&self) {
        let out = std::process::Command::new("ip")
            .args(["link", "set", &self.host_if, "up"])
            .output()
            .unwrap();
        assert!(out.status.success());
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.host_if])
            .output();
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A proxy as [`Proxy`], listening on `addr` (a namespace's host end).
fn proxy_on(addr: &str, socket: std::path::PathBuf) -> (u16, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind(format!("{addr}:0")).unwrap();
    let port = listener.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let Ok(server) = UnixStream::connect(&socket) else {
                continue;
            };
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
    (port, h)
}

/// A worker in network namespace `ns` (only its network: its mounts,
/// cgroups and the engine's socket are the host's, as a worker on its own
/// host with its own engine would have).
fn worker_in(state: &State, ns: &NetNs, host: &str, store: &str) -> Worker {
    let log = std::fs::File::create(state.path().join(format!("worker-{host}.log"))).unwrap();
    Worker(
        std::process::Command::new("nsenter")
            .arg(format!("--net=/var/run/netns/{}", ns.name))
            .arg("--")
            .arg(tests::nightshift_bin())
            .env("NIGHTSHIFT_STATE_DIR", state.path())
            .env("NIGHTSHIFT_STORE", store)
            .env("NIGHTSHIFT_HOST_ID", host)
            .args(["worker", "--max-parallel", "3", "--task-lease-secs", "12"])
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting a worker in its namespace"),
    )
}

/// Three workers, each in a network namespace of its own reaching the one
/// PostgreSQL over TCP, run 60 tasks that each push through the door. One
/// is killed with SIGKILL mid-night; another is partitioned from the store
/// (its packets dropped, no reset) for longer than its lease, then healed.
/// Every task ends exactly once, every act the door queued is in the store
/// and none twice, no sandbox outlives its lease (the partitioned worker's
/// are gone before its claims lapse), the worktrees kept of runs settled as
/// lost are imported once a worker reaches the store, the fleet's memory is
/// never exceeded (sampled), and the audit verifies.
#[test]
fn three_workers_in_their_own_networks_lose_nothing_to_a_kill_and_a_partition() {
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
    // Sandboxes end 5 s after their supervisor's last renewal; the fleet
    // holds four 256 MiB sandboxes at once, across every worker.
    std::fs::write(
        state.path().join("config.toml"),
        "[caps]\nlease = \"5s\"\n\n[fleet]\nmemory = \"1g\"\n",
    )
    .unwrap();
    // The acts' remote: a bare repository the workers read to bind each
    // push (never written: no act is approved).
    let remote = tempfile::tempdir().unwrap();
    let bare = remote.path().join("origin.git");
    tests::git(
        remote.path(),
        &["init", "-q", "--bare", bare.to_str().unwrap()],
    );
    std::fs::write(
        state.path().join("destinations.toml"),
        format!(
            "[remotes.origin]\nurl = \"file://{}\"\nreaders = \"private\"\n",
            bare.display()
        ),
    )
    .unwrap();
    let repo = make_repo();
    let mut file = String::new();
    for i in 0..60 {
        file.push_str(&format!(
            "[[task]]\nrepo = {:?}\nimage = {:?}\nretries = 1\nmemory = \"256m\"\ncpus = 0.25\n\
             command = [\"bash\", \"-c\", \"echo {i} > w.txt && git add w.txt && git commit -qm w{i} && git push origin HEAD:refs/heads/agent/t{i}; echo push=$?; sleep 3\"]\n\n",
            repo.path().to_str().unwrap(),
            image()
        ));
    }
    let tasks_file = state.path().join("tasks.toml");
    std::fs::write(&tasks_file, file).unwrap();
    let out = state.run(&["enqueue", "--file", tasks_file.to_str().unwrap()]);
    assert!(out.status.success(), "enqueue: {}", stderr(&out));

    let (socket, db, user) = socket_of(&url);
    let nets: Vec<NetNs> = (1..=3).map(NetNs::make).collect();
    let mut workers: Vec<Option<Worker>> = nets
        .iter()
        .enumerate()
        .map(|(i, ns)| {
            let (port, _) = proxy_on(&ns.host_addr, socket.clone());
            let store = format!("postgres://{user}@{}:{port}/{db}", ns.host_addr);
            Some(worker_in(&state, ns, &format!("host-{i}"), &store))
        })
        .collect();

    let sampling = Arc::new(AtomicBool::new(true));
    let most = Arc::new(Mutex::new(0usize));
    let sampler = {
        let (on, most) = (sampling.clone(), most.clone());
        let tag = orchestrator::state_tag(state.path());
        std::thread::spawn(move || {
            while on.load(Ordering::SeqCst) {
                let out = std::process::Command::new(tests::engine_cli())
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

    let running_on = |t: &[serde_json::Value], host: &str| {
        t.iter()
            .filter(|t| {
                t["state"] == "running"
                    && t["progress"]["dispatcher"]
                        .as_str()
                        .is_some_and(|d| d.ends_with(&format!("@{host}")))
            })
            .count()
    };
    // Mid-night: worker 0 and worker 1 each running something.
    wait_tasks(&state, "workers 0 and 1 both running tasks", |t| {
        running_on(t, "host-0") > 0 && running_on(t, "host-1") > 0
    });
    // Kill worker 0 outright.
    if let Some(mut w) = workers[0].take() {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(w.0.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let _ = w.0.wait();
    }
    // Partition worker 1 from the store: its claims as the store saw them.
    wait_tasks(&state, "worker 1 running tasks", |t| {
        running_on(t, "host-1") > 0
    });
    let store = state.stores().connect().unwrap();
    let claims_of_1: Vec<(String, i64)> = store
        .tasks()
        .unwrap()
        .into_iter()
        .filter_map(|t| {
            let (holder, until) = t.lease?;
            (holder.contains("@host-1") && t.state == "running").then_some((t.id, until))
        })
        .collect();
    let runs_of_1: Vec<String> = tasks(&state)
        .iter()
        .filter(|t| claims_of_1.iter().any(|(id, _)| t["id"] == id.as_str()))
        .filter_map(|t| t["progress"]["run"].as_str().map(String::from))
        .collect();
    nets[1].partition();
    let lapse = claims_of_1.iter().map(|(_, u)| *u).min();
    let gone_by = Instant::now();
    while runs_of_1.iter().any(|r| containers_of(r) > 0) {
        assert!(
            gone_by.elapsed() < Duration::from_secs(90),
            "the partitioned worker's sandboxes outlived the partition"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let gone_at = unix_now();
    if let Some(lapse) = lapse {
        assert!(
            gone_at <= lapse,
            "worker 1's sandboxes were gone at {gone_at}, after its claims lapsed at {lapse}"
        );
    }
    // Its loop noticed: its store calls failed within seconds of the
    // silence (not hanging for the kernel's minutes with its loop stuck).
    // Its runs ended before its claims lapsed (above): stopped by its fence,
    // or ended first by their own failed store writes, whichever came
    // first; both are logged by the worker.
    let fenced = Instant::now();
    loop {
        let log = std::fs::read_to_string(state.path().join("worker-host-1.log")).unwrap();
        if log.contains("could not renew its claim in time")
            || log.contains("the run queue's dispatcher, trying again")
        {
            break;
        }
        assert!(
            fenced.elapsed() < Duration::from_secs(30),
            "the partitioned worker's loop never noticed the partition: {log}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Longer than its lease, then healed.
    std::thread::sleep(Duration::from_secs(15));
    nets[1].heal();

    // Every task ends.
    let started = Instant::now();
    loop {
        let t = tasks(&state);
        if t.iter()
            .all(|t| t["state"] == "done" || t["state"] == "failed")
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the night never ended: {:#?}",
            t.iter()
                .filter(|t| t["state"] != "done")
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    sampling.store(false, Ordering::SeqCst);
    sampler.join().unwrap();
    // The worktrees kept of runs settled as lost (the killed worker's, and
    // the partitioned one's whose ends it could not write) are imported by
    // a live worker once it reaches the store: none is left, and each such
    // run carries its result beside the settler's decision.
    let worktrees = state.path().join("worktrees");
    let imported_by = Instant::now();
    while std::fs::read_dir(&worktrees).is_ok_and(|mut d| d.next().is_some()) {
        assert!(
            imported_by.elapsed() < Duration::from_secs(60),
            "kept worktrees were never imported: {:?}",
            std::fs::read_dir(&worktrees)
                .unwrap()
                .flatten()
                .map(|e| e.file_name())
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Each run settled as lost whose agent had started (its worktree then
    // held its work) has its result.
    let started: Vec<Option<String>> = state
        .audit_runs_and_bodies("started")
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    let lost_and_kept: Vec<serde_json::Value> = state
        .runs()
        .into_iter()
        .filter(|r| {
            started.iter().any(|s| s.as_deref() == r["id"].as_str())
                && r["status"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("lost: its worker"))
        })
        .collect();
    for r in &lost_and_kept {
        assert!(
            r["result_ref"].is_string(),
            "a lost run's kept work was not imported: {r:#?}"
        );
        assert!(
            r["reason"]
                .as_str()
                .is_some_and(|w| w.contains("imported when the worker reached the store again")),
            "{r:#?}"
        );
    }
    eprintln!(
        "{} runs settled as lost after their agent started: each imported",
        lost_and_kept.len()
    );
    let t = tasks(&state);
    assert_eq!(t.len(), 60);
    let runs = state.runs();
    // Each task's runs: one, or two when the first was lost with its
    // worker (retries = 1); never two at once, never one ended twice.
    let ended = state.audit_runs_and_bodies("run_ended");
    for run in &runs {
        let id = run["id"].as_str().unwrap();
        let n = ended
            .iter()
            .filter(|(r, _)| r.as_deref() == Some(id))
            .count();
        assert_eq!(n, 1, "run {id} ended {n} times: {run:#?}");
    }
    let done = t.iter().filter(|t| t["state"] == "done").count();
    assert!(done >= 55, "only {done} of 60 tasks done: {t:#?}");
    assert!(runs.len() <= 60 + 60, "{} runs for 60 tasks", runs.len());
    // Every act the door queued is in the store, once.
    let acts = store.acts(None).unwrap();
    let queued: Vec<String> = state
        .audit_bodies("door_request")
        .into_iter()
        .filter_map(|b| b["act"].as_str().map(String::from))
        .collect();
    // ...and every push the agent was told was queued (its `git push`
    // exited 0) is among them: a run cut off from the store may have been
    // refused its push (the agent saw the error), never told yes and lost.
    let mut told_yes = 0;
    for run in &runs {
        let id = run["id"].as_str().unwrap();
        if state.output_log(id).contains("push=0") {
            told_yes += 1;
            let n = acts
                .iter()
                .filter(|a| a.0["actor"] == format!("run-{id}").as_str())
                .count();
            assert_eq!(
                n, 1,
                "run {id} was told its push was queued; {n} acts are in the store"
            );
        }
    }
    assert!(
        told_yes >= 50,
        "only {told_yes} pushes were queued: {runs:#?}"
    );
    for id in &queued {
        let n = acts.iter().filter(|a| a.0["id"] == id.as_str()).count();
        assert_eq!(n, 1, "act {id} is in the store {n} times");
    }
    // No sandbox of the night is left.
    let tag = orchestrator::state_tag(state.path());
    let out = std::process::Command::new(tests::engine_cli())
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=nightshift.state={tag}"),
        ])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).trim().is_empty(),
        "sandboxes outlived the night"
    );
    assert!(*most.lock().unwrap() <= 4, "the fleet's four were exceeded");
    drop(workers);
    assert!(
        state.verify().status.success(),
        "{}",
        stderr(&state.verify())
    );
}
