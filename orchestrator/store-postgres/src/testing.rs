//! A PostgreSQL server for tests and benchmarks, and a fresh database in it
//! per test (so tests run in parallel without seeing each other's rows).
//!
//! The server is the one `NIGHTSHIFT_TEST_PG` names (a URL, as
//! `scripts/pg.sh start` prints it), or else one this process starts
//! through `scripts/pg.sh start --for-pid <this process>`, which installs
//! Debian's PostgreSQL when it is missing and stops and removes the server
//! once this process has exited. Starting it here rather than skipping keeps
//! `cargo test` meaningful on a machine where nobody ran the script: this
//! module has no skip path, so a PostgreSQL test runs or fails.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use postgres::{Client, NoTls};

/// The variable that names a running server for the tests.
pub const TEST_SERVER_VAR: &str = "NIGHTSHIFT_TEST_PG";

static SERVER: OnceLock<Result<String, String>> = OnceLock::new();

fn pg_sh() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/pg.sh")
}

/// The URL of the test server (started on first use when none is named).
/// Panics when no server can be had: a test that needs one cannot pass.
pub fn server_url() -> String {
    SERVER
        .get_or_init(|| {
            if let Ok(url) = std::env::var(TEST_SERVER_VAR) {
                if !url.is_empty() {
                    return Ok(url);
                }
            }
            start(&[])
        })
        .clone()
        .unwrap_or_else(|e| panic!("no PostgreSQL server for the tests: {e}"))
}

/// A server of this process's own whose commits wait for the disk (for
/// benchmarks against SQLite's synchronous commits); stopped once this
/// process exits.
pub fn durable_server_url() -> String {
    start(&["--durable"]).unwrap_or_else(|e| panic!("no PostgreSQL server: {e}"))
}

/// A server of this process's own that also listens on 127.0.0.1:`port`,
/// there only over TLS with DIR/server.pem and DIR/server.key when `tls`
/// names DIR (`scripts/pg.sh start --port --tls`); stopped once this process
/// exits. Returns its socket's URL.
pub fn tcp_server_url(port: u16, tls: Option<&std::path::Path>) -> Result<String, String> {
    let port = port.to_string();
    let mut options = vec!["--port", port.as_str()];
    let dir;
    if let Some(d) = tls {
        dir = d.display().to_string();
        options.extend(["--tls", dir.as_str()]);
    }
    start(&options)
}

fn start(options: &[&str]) -> Result<String, String> {
    let out = Command::new("bash")
        .arg(pg_sh())
        .arg("start")
        .args(options)
        .args(["--for-pid", &std::process::id().to_string()])
        .output()
        .map_err(|e| format!("running {}: {e}", pg_sh().display()))?;
    if !out.status.success() {
        return Err(format!(
            "scripts/pg.sh start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `url` with its database name replaced by `db`.
pub fn with_database(url: &str, db: &str) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let prefix = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    if query.is_empty() {
        format!("{prefix}/{db}")
    } else {
        format!("{prefix}/{db}?{query}")
    }
}

/// A new, empty database in the test server; its URL.
pub fn fresh_database() -> String {
    fresh_database_on(&server_url())
}

/// A new, empty database in the server at `url`; its URL.
pub fn fresh_database_on(url: &str) -> String {
    let url = url.to_string();
    let name = format!("t_{}", ulid::Ulid::new().to_string().to_lowercase());
    // The client's own runtime may not start on a runtime's thread.
    let make = || -> Result<(), postgres::Error> {
        let mut admin = Client::connect(&url, NoTls)?;
        admin.batch_execute(&format!("CREATE DATABASE {name}"))
    };
    let made = if tokio::runtime::Handle::try_current().is_ok() {
        std::thread::scope(|s| s.spawn(make).join().expect("creating a test database"))
    } else {
        make()
    };
    made.unwrap_or_else(|e| panic!("creating the test database {name} on {url}: {e}"));
    with_database(&url, &name)
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn the_database_is_replaced_and_the_socket_kept() {
        assert_eq!(
            with_database("postgres:///postgres?host=/tmp/x&user=postgres", "t_1"),
            "postgres:///t_1?host=/tmp/x&user=postgres"
        );
        assert_eq!(
            with_database("postgres://u:p@h:5432/db", "t_1"),
            "postgres://u:p@h:5432/t_1"
        );
        assert_eq!(with_database("postgres://h", "t_1"), "postgres://h/t_1");
    }
}
