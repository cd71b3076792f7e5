//! Hosted mode (`NIGHTSHIFT_HOSTED=1`, set in the service image): `serve`
//! and `worker` refuse to start on a configuration a hosted deployment must
//! not have, each refusal naming what and where, and start once it is
//! right. The decisions are `nightshift_core::hosted`'s (unit and property
//! tested there); this drives the real binary.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;

use orchestrator::exit;
use tests::{stderr, State};

fn hosted(state: &State) -> std::process::Command {
    let mut c = state.cmd();
    c.env("NIGHTSHIFT_HOSTED", "1")
        .env_remove("NIGHTSHIFT_STORE_FILE");
    c
}

fn write(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A self-signed certificate for 127.0.0.1 (the key 0600).
fn certificate(dir: &Path) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    write(&dir.join("tls.pem"), &cert.pem(), 0o644);
    write(&dir.join("tls.key"), &key.serialize_pem(), 0o600);
}

#[test]
fn the_hosted_binary_refuses_bad_configuration_naming_it() {
    let state = State::new();
    let files = tempfile::tempdir().unwrap();
    let dir = files.path();

    // Nothing configured, plain HTTP off loopback: every refusal at once.
    let out = hosted(&state)
        .env_remove("NIGHTSHIFT_STORE")
        .args(["serve", "--bind", "0.0.0.0:0", "--insecure-network"])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(exit::BAD_INPUT), "{err}");
    assert!(err.contains("no store"), "{err}");
    assert!(err.contains("0.0.0.0:0 (--bind) has no TLS"), "{err}");
    assert!(err.contains("no owner account"), "{err}");

    // Without hosted mode the same command is not checked (and listens).
    // (Not started here: that is the dashboard's own tests.)

    // A worker: a store on another host without TLS, its URL from a file
    // open to everyone, and a model key file that is not there.
    let url_file = dir.join("store-url");
    write(
        &url_file,
        "postgres://ns:hunter2@db.example:5432/ns\n",
        0o644,
    );
    write(
        &state.path().join("models.toml"),
        &format!(
            "[endpoints.a]\nshape = \"openai-chat\"\nurl = \"https://api.example\"\nkey_file = \"{}\"\n",
            dir.join("missing.key").display()
        ),
        0o600,
    );
    let out = hosted(&state)
        .env_remove("NIGHTSHIFT_STORE")
        .env("NIGHTSHIFT_STORE_FILE", &url_file)
        .args(["worker"])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(exit::BAD_INPUT), "{err}");
    assert!(
        err.contains("host db.example is not local") && err.contains("(NIGHTSHIFT_STORE_FILE)"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "{} (named in NIGHTSHIFT_STORE_FILE): has mode 0644",
            url_file.display()
        )),
        "{err}"
    );
    assert!(
        err.contains("missing.key") && err.contains("models.toml endpoints.a.key_file"),
        "{err}"
    );
    assert!(
        !err.contains("hunter2"),
        "the store's password shown: {err}"
    );
    assert!(!err.contains("owner account"), "a worker needs none: {err}");
    std::fs::remove_file(state.path().join("models.toml")).unwrap();

    // A local store (PostgreSQL on loopback or its socket), TLS on, but no
    // owner account and a key open to others.
    let url = state
        .store_url
        .clone()
        .unwrap_or_else(orchestrator::store_postgres::testing::fresh_database);
    certificate(dir);
    std::fs::set_permissions(dir.join("tls.key"), std::fs::Permissions::from_mode(0o640)).unwrap();
    let serve = |state: &State| {
        let mut c = hosted(state);
        c.env("NIGHTSHIFT_STORE", &url).args([
            "serve",
            "--bind",
            "0.0.0.0:0",
            "--max-parallel",
            "0",
            "--tls-cert",
            dir.join("tls.pem").to_str().unwrap(),
            "--tls-key",
            dir.join("tls.key").to_str().unwrap(),
        ]);
        c
    };
    let out = serve(&state).output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(exit::BAD_INPUT), "{err}");
    assert!(err.contains("no owner account"), "{err}");
    assert!(
        err.contains("the TLS key") && err.contains("(named in --tls-key): has mode 0640"),
        "{err}"
    );
    assert!(!err.contains("no TLS"), "{err}");

    // Put right, it starts: it listens on TLS.
    std::fs::set_permissions(dir.join("tls.key"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut add = state
        .cmd()
        .env("NIGHTSHIFT_STORE", &url)
        .args(["users", "add", "morgan", "--role", "owner"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    add.stdin
        .take()
        .unwrap()
        .write_all(b"a long enough password\n")
        .unwrap();
    assert!(add.wait().unwrap().success());
    let mut child = serve(&state)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        line.contains("listening on https://0.0.0.0:"),
        "serve did not start: {line:?}"
    );
}
