//! `deploy/compose.yaml` for real, with Debian's `docker-compose`: the
//! service and PostgreSQL images (`image build --service` / `--postgres`,
//! content-addressed; their Debian root filesystems kept in
//! /var/tmp/nightshift-hosted-images, so a new binary costs a copy), one
//! `serve` over TLS, two workers. Tasks are enqueued through the HTTP API
//! (a login, its CSRF token), one worker is `docker kill`ed while it runs
//! them, and every task still ends: the other worker finishes the night.
//! Then the morning in headless Chromium through serve's own TLS (the
//! mounted certificate): the login, a `__Host-` secure session cookie, every
//! finished run of the night on the Morning page.
//! Each task also looks, from inside its sandbox, for what a worker holds
//! (the store's and the engine's sockets, the secrets) and finds none.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tests::{git, nightshift_bin, stderr};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_rustls::rustls;

const IMAGE_CACHE: &str = "/var/tmp/nightshift-hosted-images";

fn build_image(flag: &str) -> String {
    let out = Command::new(nightshift_bin())
        .env("NIGHTSHIFT_STATE_DIR", IMAGE_CACHE)
        .args(["image", "build", flag])
        .output()
        .unwrap();
    assert!(out.status.success(), "image build {flag}: {}", stderr(&out));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The compose project: its files, and `down` (volumes too) when dropped.
struct Project {
    dir: PathBuf,
    name: String,
    env: PathBuf,
    state: PathBuf,
}

impl Project {
    fn compose(&self) -> Command {
        let mut c = Command::new("docker-compose");
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/compose.yaml");
        c.current_dir(&self.dir).args([
            "--env-file",
            self.env.to_str().unwrap(),
            "-p",
            &self.name,
            "-f",
            file.to_str().unwrap(),
        ]);
        c
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.compose().args(args).output().unwrap();
        assert!(
            out.status.success(),
            "docker-compose {args:?}: {}",
            stderr(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn tasks(&self) -> Vec<serde_json::Value> {
        let out = self.ok(&["exec", "-T", "serve", "nightshift", "tasks", "--json"]);
        serde_json::from_str::<Vec<serde_json::Value>>(&out)
            .unwrap_or_else(|e| panic!("tasks --json: {e}: {out}"))
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        let _ = self
            .compose()
            .args(["down", "--volumes", "--timeout", "5"])
            .output();
        let _ = Command::new("umount").arg("-l").arg(&self.state).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn write(path: &Path, text: &str, mode: u32, owner: Option<u32>) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    if let Some(uid) = owner {
        std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
    }
}

/// One HTTPS request to 127.0.0.1:`port`, trusting `ca` only; the response.
fn https(ca: &rustls::pki_types::CertificateDer<'static>, port: u16, request: String) -> String {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let Ok(tcp) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
                return String::new();
            };
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let Ok(mut tls) = tokio_rustls::TlsConnector::from(Arc::new(config))
                .connect(name, tcp)
                .await
            else {
                return String::new();
            };
            tls.write_all(request.as_bytes()).await.unwrap();
            let mut out = Vec::new();
            let _ = tls.read_to_end(&mut out).await;
            String::from_utf8_lossy(&out).into_owned()
        })
}

fn post(port: u16, path: &str, extra: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[test]
fn a_compose_night_on_two_workers_survives_a_killed_worker() {
    let service = build_image("--service");
    let postgres = build_image("--postgres");

    let dir = tempfile::Builder::new()
        .prefix("nightshift-compose-")
        .tempdir_in("/var/tmp")
        .unwrap()
        .keep();
    let secrets = dir.join("secrets");
    for d in ["secrets/serve", "secrets/worker", "state", "repos"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o700)).unwrap();
    let state = dir.join("state");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let project = Project {
        name: format!("nsdeploytest{}", std::process::id()),
        env: dir.join("env"),
        state: state.clone(),
        dir: dir.clone(),
    };
    // The workers' state folder: a shared mount, so that the worktrees a
    // worker mounts there are seen by the host's engine.
    for args in [
        vec!["--bind", state.to_str().unwrap(), state.to_str().unwrap()],
        vec!["--make-rshared", state.to_str().unwrap()],
    ] {
        assert!(Command::new("mount")
            .args(&args)
            .status()
            .unwrap()
            .success());
    }

    let password: String = (0..32)
        .map(|i| char::from(b"0123456789abcdef"[(std::process::id() as usize * 7 + i * 13) % 16]))
        .collect();
    write(&secrets.join("pg-password"), &password, 0o444, None);
    let url = format!("postgres://nightshift:{password}@%2Frun%2Fpostgresql/nightshift\n");
    write(&secrets.join("serve/store-url"), &url, 0o600, Some(10001));
    write(&secrets.join("worker/store-url"), &url, 0o600, None);
    // A test CA's certificate for 127.0.0.1: the HTTP client trusts the
    // CA, the browser the server key (Chromium's SPKI list).
    let cert = tests::browser::TestCert::new(&["127.0.0.1"]);
    write(
        &secrets.join("serve/tls.pem"),
        &cert.cert_pem,
        0o644,
        Some(10001),
    );
    write(
        &secrets.join("serve/tls.key"),
        &cert.key_pem,
        0o600,
        Some(10001),
    );
    let ca = cert.ca.clone();
    let repos = dir.join("repos");
    let repo = repos.join("r");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("README"), "hello\n").unwrap();
    git(&repo, &["add", "README"]);
    git(&repo, &["commit", "-q", "-m", "first"]);
    std::fs::write(
        &project.env,
        format!(
            "NIGHTSHIFT_SERVICE_IMAGE={service}\nNIGHTSHIFT_POSTGRES_IMAGE={postgres}\n\
             NIGHTSHIFT_SECRETS={}\nNIGHTSHIFT_WORKER_STATE={}\nNIGHTSHIFT_REPOS={}\n\
             NIGHTSHIFT_PORT={port}\nNIGHTSHIFT_TASK_LEASE_SECS=5\n",
            secrets.display(),
            state.display(),
            repos.display()
        ),
    )
    .unwrap();

    // PostgreSQL first (healthy), then the owner's account, then serve and
    // two workers.
    project.ok(&["up", "-d", "postgres"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = Command::new("docker")
            .args([
                "inspect",
                "-f",
                "{{.State.Health.Status}}",
                &format!("{}_postgres_1", project.name),
            ])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&out.stdout).trim() == "healthy" {
            break;
        }
        assert!(Instant::now() < deadline, "PostgreSQL never became healthy");
        std::thread::sleep(Duration::from_millis(300));
    }
    let mut add = project
        .compose()
        .args([
            "run",
            "--rm",
            "-T",
            "--no-deps",
            "serve",
            "users",
            "add",
            "owner",
            "--role",
            "owner",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        add.stdin
            .take()
            .unwrap()
            .write_all(b"a long enough password\n")
            .unwrap();
    }
    let added = add.wait_with_output().unwrap();
    assert!(added.status.success(), "users add: {}", stderr(&added));
    project.ok(&["up", "-d", "--scale", "worker=2", "serve", "worker"]);

    // Log in over TLS (the certificate is the one mounted into serve).
    let body = r#"{"name":"owner","password":"a long enough password"}"#;
    let deadline = Instant::now() + Duration::from_secs(60);
    let login = loop {
        let answer = https(&ca, port, post(port, "/api/v1/login", "", body));
        if answer.starts_with("HTTP/1.1 200") {
            break answer;
        }
        assert!(
            Instant::now() < deadline,
            "serve never answered a login: {answer:?}\n{}",
            project.ok(&["logs", "--tail", "30", "serve"])
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let cookie = login
        .lines()
        .find_map(|l| {
            l.strip_prefix("set-cookie: ")
                .or_else(|| l.strip_prefix("Set-Cookie: "))
        })
        .and_then(|c| c.split(';').next())
        .expect("a session cookie")
        .to_string();
    assert!(
        cookie.starts_with("__Host-"),
        "not a secure cookie: {cookie}"
    );
    let json: serde_json::Value =
        serde_json::from_str(login.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    let csrf = json["csrf"].as_str().unwrap().to_string();

    // A short night: six tasks, each a few seconds in its sandbox. Each
    // also looks for what the workers hold and a sandbox must not: the
    // store's socket, the engine's socket, the secrets (exit 9 if found).
    let task = serde_json::json!({
        "repo": repo,
        "command": ["sh", "-c", "sleep 4; for p in /run/postgresql/.s.PGSQL.5432 /var/run/docker.sock /run/secrets/store-url; do test -e $p && exit 9; done; echo done > done.txt"],
    });
    let body = serde_json::json!({ "task": vec![task; 6] }).to_string();
    let answer = https(
        &ca,
        port,
        post(
            port,
            "/api/v1/tasks",
            &format!("Cookie: {cookie}\r\nX-CSRF-Token: {csrf}\r\n"),
            &body,
        ),
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"enqueued\""), "{answer}");

    // Kill one worker once runs are going.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !project.tasks().iter().any(|t| t["state"] == "running") {
        assert!(
            Instant::now() < deadline,
            "no task started: {:?}",
            project.tasks()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let killed = format!("{}_worker_1", project.name);
    let out = Command::new("docker")
        .args(["kill", &killed])
        .output()
        .unwrap();
    assert!(out.status.success(), "docker kill: {}", stderr(&out));

    // The other worker finishes the night: every task ends.
    let deadline = Instant::now() + Duration::from_secs(90);
    let tasks = loop {
        let tasks = project.tasks();
        if tasks.len() == 6
            && tasks.iter().all(|t| {
                ["done", "failed", "cancelled"].contains(&t["state"].as_str().unwrap_or(""))
            })
        {
            break tasks;
        }
        assert!(
            Instant::now() < deadline,
            "the night did not end: {tasks:#?}\n{}",
            project.ok(&["logs", "--tail", "40", "worker"])
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    // Each task's run exited 0 (none saw what it must not), except those
    // the killed worker held, settled as lost.
    let status = |t: &serde_json::Value| t["progress"]["status"].as_str().unwrap_or("").to_string();
    for t in &tasks {
        let s = status(t);
        assert!(
            s == "exited 0" || s.starts_with("lost"),
            "task {} ended {s:?} (exited 9: a sandbox saw a worker's socket or secret): {tasks:#?}",
            t["id"]
        );
    }
    let ok = tasks.iter().filter(|t| status(t) == "exited 0").count();
    assert!(ok >= 4, "only {ok} of 6 ran to the end: {tasks:#?}");
    // The morning, in a real browser, through serve's own TLS: the login
    // page, a secure session cookie, the night's runs on Morning.
    let runs: Vec<String> = tasks
        .iter()
        .filter(|t| status(t) == "exited 0")
        .filter_map(|t| t["progress"]["run"].as_str().map(str::to_string))
        .collect();
    assert!(!runs.is_empty(), "{tasks:#?}");
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(morning_in_a_browser(port, &cert.spki_sha256, &runs));
    let survivor = format!("{}_worker_2", project.name);
    let running = Command::new("docker")
        .args(["inspect", "-f", "{{.State.Running}}", &survivor])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&running.stdout).trim(), "true");
    // No sandbox of the night outlives it (the killed worker's end by their lease).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = Command::new("docker")
            .args([
                "ps",
                "-q",
                "--filter",
                &format!("label=nightshift.state={}", orchestrator::state_tag(&state)),
            ])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&out.stdout).trim().is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "sandboxes left running");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Logs in to the compose night's `serve` at `https://127.0.0.1:PORT` in
/// headless Chromium (trusting only the mounted certificate's key beyond
/// its own roots), and finds every run of `runs` on the Morning page.
async fn morning_in_a_browser(port: u16, spki: &str, runs: &[String]) {
    use fantoccini::Locator;
    let driver = tests::browser::Driver::start();
    let c = driver
        .browser_with(
            &[format!("--ignore-certificate-errors-spki-list={spki}")],
            "127.0.0.1",
        )
        .await;
    let origin = format!("https://127.0.0.1:{port}");
    tests::browser::log_in(&c, &origin, "owner", "a long enough password").await;
    let page = c
        .find(Locator::Css("section#runs"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for run in runs {
        assert!(
            page.contains(run.as_str()),
            "run {run} is not on Morning: {page}"
        );
    }
    c.close().await.unwrap();
}
