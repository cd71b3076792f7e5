//! Helpers for the dashboard's tests: a `nightshift serve` of a test's
//! state, a raw HTTP client (so a test can send any `Host`, `Origin` or
//! cookie it likes), and a real headless Chromium driven over WebDriver
//! (`chromedriver`, Debian's `chromium-driver`) with fantoccini.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::State;

pub const OWNER: &str = "olivia";
pub const OWNER_PASSWORD: &str = "owner password of the test";
pub const VIEWER: &str = "victor";
pub const VIEWER_PASSWORD: &str = "viewer password of the test";

/// Adds the test's owner and viewer accounts to `state`.
pub fn add_accounts(state: &State) {
    for (name, role, pw) in [
        (OWNER, "owner", OWNER_PASSWORD),
        (VIEWER, "viewer", VIEWER_PASSWORD),
    ] {
        let mut child = state
            .cmd()
            .args(["users", "add", name, "--role", role])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("nightshift users add");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(pw.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "users add: {}", crate::stderr(&out));
    }
}

/// A running `nightshift serve`, stopped (SIGTERM, then SIGKILL) on drop.
#[derive(Debug)]
pub struct Serve {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Serve {
    pub fn start(state: &State, extra: &[&str]) -> Serve {
        let mut child = state
            .cmd()
            .args(["serve", "--bind", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("nightshift serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .rsplit("://")
            .next()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("serve did not say where it listens: {line:?}"));
        Serve { child, addr }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn host(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP response, read whole.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The session cookie's `name=value`, if one was set.
    pub fn session_cookie(&self) -> Option<String> {
        self.header("set-cookie")
            .and_then(|c| c.split(';').next())
            .map(str::to_string)
    }
}

/// Sends one HTTP/1.1 request as written, headers verbatim (`Host` too).
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Response {
    let mut s = TcpStream::connect(addr).expect("connecting to serve");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Response {
        status,
        headers,
        body: body.to_string(),
    }
}

/// A logged-in API client.
#[derive(Debug, Clone)]
pub struct Client {
    pub addr: SocketAddr,
    pub cookie: String,
    pub csrf: String,
}

impl Client {
    pub fn login(serve: &Serve, name: &str, password: &str) -> Client {
        let body = serde_json::json!({"name": name, "password": password}).to_string();
        let r = request(
            serve.addr,
            "POST",
            "/api/v1/login",
            &[
                ("Host", &serve.host()),
                ("Content-Type", "application/json"),
            ],
            &body,
        );
        assert_eq!(r.status, 200, "login as {name}: {}", r.body);
        Client {
            addr: serve.addr,
            cookie: r.session_cookie().expect("a session cookie"),
            csrf: r.json()["csrf"].as_str().unwrap().to_string(),
        }
    }

    pub fn get(&self, path: &str) -> Response {
        let host = self.addr.to_string();
        request(
            self.addr,
            "GET",
            path,
            &[
                ("Host", &host),
                ("Cookie", &self.cookie),
                ("Accept", "application/json"),
            ],
            "",
        )
    }

    /// A JSON POST with the session and its CSRF token.
    pub fn post(&self, path: &str, body: &serde_json::Value) -> Response {
        let host = self.addr.to_string();
        request(
            self.addr,
            "POST",
            path,
            &[
                ("Host", &host),
                ("Cookie", &self.cookie),
                ("X-CSRF-Token", &self.csrf),
                ("Content-Type", "application/json"),
            ],
            &body.to_string(),
        )
    }
}

/// A chromedriver on a free port, killed on drop.
#[derive(Debug)]
pub struct Driver {
    child: Child,
    pub port: u16,
}

impl Driver {
    pub fn start() -> Driver {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        use std::os::unix::process::CommandExt;
        // Its own process group: the browsers it starts end with it, even
        // when a test panics before closing its session.
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver; scripts/lib.sh installs it)");
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "chromedriver did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Driver { child, port }
    }

    /// A headless Chromium session; every request the browser makes to any
    /// host but the dashboard is sent to a closed port (so a fetch elsewhere fails).
    pub async fn browser(&self) -> fantoccini::Client {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1400,1000", "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>;127.0.0.1"],
            }),
        );
        fantoccini::ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .expect("a WebDriver session")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where screenshots go: `target/screenshots/` beside the binary.
pub fn screenshot_dir() -> PathBuf {
    let bin = crate::nightshift_bin();
    let dir = bin
        .parent()
        .and_then(Path::parent)
        .map(|t| t.join("screenshots"))
        .unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
