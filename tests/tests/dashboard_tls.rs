//! `nightshift serve --tls-cert --tls-key` serves the dashboard over HTTPS
//! (rustls): a client that trusts the certificate logs in and gets a
//! `Secure`, `__Host-` session cookie, and every answer carries
//! `Strict-Transport-Security`; plain HTTP to that port gets no page;
//! without TLS a non-loopback bind is refused, naming the TLS flags; a
//! private key readable by others is refused, naming the file. Behind a TLS
//! proxy (`[serve] external_origin`, `trusted_proxies`): the external
//! origin logs in with a `Secure`, `__Host-` cookie, only through the
//! proxy, and failed logins count per client the proxy names.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;

use tests::browser::{
    add_accounts, https_from, request, request_from, Serve, TestCert, TlsProxy, OWNER,
    OWNER_PASSWORD, VIEWER, VIEWER_PASSWORD,
};
use tests::{stderr, State};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_rustls::rustls;

/// A CA and a certificate for 127.0.0.1 signed by it, written as PEM files
/// (the key 0600); returns the CA's certificate.
fn certificate(dir: &Path) -> rustls::pki_types::CertificateDer<'static> {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "dashboard test CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca_cert, &ca_key)
        .unwrap();
    std::fs::write(dir.join("serve.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("serve.key"), key.serialize_pem()).unwrap();
    std::fs::set_permissions(
        dir.join("serve.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    ca_cert.der().clone()
}

/// One HTTPS request; the whole response as text.
fn https(
    ca: &rustls::pki_types::CertificateDer<'static>,
    addr: std::net::SocketAddr,
    request: &str,
) -> String {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let request = request.to_string();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
                .connect(name, tcp)
                .await
                .expect("TLS handshake with serve");
            tls.write_all(request.as_bytes()).await.unwrap();
            let mut out = Vec::new();
            let _ = tls.read_to_end(&mut out).await;
            String::from_utf8_lossy(&out).into_owned()
        })
}

#[test]
fn the_dashboard_over_tls_logs_in_with_a_secure_cookie_and_refuses_plain_http() {
    let state = State::new();
    add_accounts(&state);
    let ca = certificate(state.path());
    let cert = state.path().join("serve.pem");
    let key = state.path().join("serve.key");
    let serve = Serve::start(
        &state,
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--max-parallel",
            "0",
        ],
    );
    let host = serve.host();
    let body = serde_json::json!({"name": OWNER, "password": OWNER_PASSWORD}).to_string();
    let answer = https(
        &ca,
        serve.addr,
        &format!(
            "POST /api/v1/login HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let cookie = answer
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap_or_else(|| panic!("no session cookie: {answer}"));
    assert!(cookie.contains("__Host-"), "{cookie}");
    assert!(cookie.contains("; Secure"), "{cookie}");
    assert!(cookie.contains("HttpOnly"), "{cookie}");

    // Plain HTTP to the TLS port is no page.
    let mut tcp = std::net::TcpStream::connect(serve.addr).unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let _ = tcp.write_all(format!("GET /login HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes());
    let mut got = Vec::new();
    let _ = std::io::Read::read_to_end(&mut tcp, &mut got);
    assert!(
        !String::from_utf8_lossy(&got).contains("<html"),
        "a page over plain HTTP"
    );
    drop(serve);

    // Without TLS a non-loopback bind is refused.
    let out = state
        .cmd()
        .args(["serve", "--bind", "0.0.0.0:0", "--max-parallel", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("--tls-cert"), "{}", stderr(&out));

    // A key readable by others is refused, naming it.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = state
        .cmd()
        .args(["serve", "--bind", "127.0.0.1:0", "--max-parallel", "0"])
        .args(["--tls-cert", cert.to_str().unwrap()])
        .args(["--tls-key", key.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("serve.key"), "{}", stderr(&out));
}

fn status(answer: &str) -> u16 {
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn header<'a>(answer: &'a str, name: &str) -> Option<&'a str> {
    let head = answer.split("\r\n\r\n").next().unwrap_or("");
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
}

#[test]
fn every_answer_over_tls_carries_strict_transport_security() {
    let state = State::new();
    add_accounts(&state);
    let ca = certificate(state.path());
    let cert = state.path().join("serve.pem");
    let key = state.path().join("serve.key");
    let serve = Serve::start(
        &state,
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--max-parallel",
            "0",
        ],
    );
    let host = serve.host();
    let port = serve.addr.port();
    for (path, host) in [
        ("/login", host.clone()),
        ("/api/v1/runs", host.clone()),
        ("/no/such/page", host.clone()),
        ("/login", format!("evil.example:{port}")),
    ] {
        let answer = https(
            &ca,
            serve.addr,
            &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        );
        let hsts = header(&answer, "strict-transport-security")
            .unwrap_or_else(|| panic!("{path} for {host}: no HSTS: {answer}"));
        assert!(hsts.starts_with("max-age="), "{hsts}");
        let age: u64 = hsts["max-age=".len()..].parse().unwrap();
        assert!(age >= 180 * 24 * 3600, "{hsts}");
    }
}

const PROXY_SOURCE: &str = "127.0.0.9";

/// A state configured for a TLS proxy at `dash.test`, its serve, and the
/// proxy (connecting to serve from [`PROXY_SOURCE`]).
fn behind_a_proxy() -> (State, Serve, TlsProxy, TestCert, String) {
    let state = State::new();
    assert!(state.run(&["owner", "init"]).status.success());
    add_accounts(&state);
    let cert = TestCert::new(&["dash.test"]);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let origin = format!("https://dash.test:{port}");
    std::fs::write(
        state.path().join("config.toml"),
        format!(
            "[serve]\nexternal_origin = \"{origin}\"\ntrusted_proxies = [\"{PROXY_SOURCE}\"]\n"
        ),
    )
    .unwrap();
    let serve = Serve::start(&state, &["--max-parallel", "0"]);
    let proxy = TlsProxy::start(
        listener,
        cert.server_config(),
        PROXY_SOURCE.parse().unwrap(),
        serve.addr,
    );
    (state, serve, proxy, cert, origin)
}

fn post(host: &str, origin: &str, path: &str, extra: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nOrigin: {origin}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[test]
fn behind_a_tls_proxy_the_external_origin_logs_in_with_a_secure_cookie() {
    let (state, serve, proxy, cert, origin) = behind_a_proxy();
    let host = origin.trim_start_matches("https://").to_string();
    let via = |from: &str, request: &str| {
        https_from(
            from.parse().unwrap(),
            &cert.ca,
            proxy.addr,
            "dash.test",
            request,
        )
    };
    let login = serde_json::json!({"name": OWNER, "password": OWNER_PASSWORD}).to_string();
    let answer = via(
        "127.0.0.1",
        &post(&host, &origin, "/api/v1/login", "", &login),
    );
    assert_eq!(status(&answer), 200, "{answer}");
    let set = header(&answer, "set-cookie").unwrap_or_else(|| panic!("{answer}"));
    assert!(set.starts_with("__Host-nightshift_session="), "{set}");
    assert!(set.contains("; Secure"), "{set}");
    assert!(
        header(&answer, "strict-transport-security").is_some(),
        "{answer}"
    );
    let cookie = set.split(';').next().unwrap().to_string();
    let body = answer.split("\r\n\r\n").nth(1).unwrap();
    let csrf = serde_json::from_str::<serde_json::Value>(body).unwrap()["csrf"]
        .as_str()
        .unwrap()
        .to_string();
    // A state change from the external origin, with the session.
    let extra =
        format!("Cookie: {cookie}\r\nX-CSRF-Token: {csrf}\r\nSec-Fetch-Site: same-origin\r\n");
    let answer = via(
        "127.0.0.1",
        &post(
            &host,
            &origin,
            "/api/v1/freeze",
            &extra,
            "{\"why\":\"via the proxy\"}",
        ),
    );
    assert_eq!(status(&answer), 200, "{answer}");
    // The plain-HTTP origin is not this one.
    let answer = via(
        "127.0.0.1",
        &post(
            &host,
            &format!("http://{host}"),
            "/api/v1/thaw",
            &extra,
            "{}",
        ),
    );
    assert_eq!(status(&answer), 403, "{answer}");
    // A proxy that passes the name alone (nginx's `$host`).
    let answer = via(
        "127.0.0.1",
        &post("dash.test", &origin, "/api/v1/login", "", &login),
    );
    assert_eq!(status(&answer), 200, "{answer}");

    // Not through the proxy: the external origin is not served, and
    // X-Forwarded-For is not believed.
    let r = request_from(
        "127.0.0.2".parse().unwrap(),
        serve.addr,
        "POST",
        "/api/v1/login",
        &[
            ("Host", &host),
            ("Origin", &origin),
            ("Content-Type", "application/json"),
        ],
        &login,
    );
    assert_eq!(r.status, 421, "{}", r.body);
    // The bound address still serves its own (plain, loopback) origin.
    let r = request(serve.addr, "GET", "/login", &[("Host", &serve.host())], "");
    assert_eq!(r.status, 200);
    assert!(r.header("strict-transport-security").is_none());
    drop(state);
}

/// Everyone comes through the proxy's one address: failures are counted
/// per client the proxy names, so a guesser does not lock the owner out,
/// and a client cannot name itself someone else.
#[test]
fn behind_a_tls_proxy_failed_logins_count_per_client() {
    let (_state, _serve, proxy, cert, origin) = behind_a_proxy();
    let host = origin.trim_start_matches("https://").to_string();
    let via = |from: &str, extra: &str, name: &str, password: &str| {
        let body = serde_json::json!({"name": name, "password": password}).to_string();
        status(&https_from(
            from.parse().unwrap(),
            &cert.ca,
            proxy.addr,
            "dash.test",
            &post(&host, &origin, "/api/v1/login", extra, &body),
        ))
    };
    // The guesser, claiming to be others: still counted as itself.
    let guesses: Vec<u16> = (0..8)
        .map(|i| {
            let claim = format!("X-Forwarded-For: 10.0.0.{i}\r\n");
            via("127.0.0.2", &claim, OWNER, "guess guess guess")
        })
        .collect();
    assert!(guesses.contains(&429), "never limited: {guesses:?}");
    assert_eq!(via("127.0.0.2", "", OWNER, OWNER_PASSWORD), 429);
    // The owner and the viewer, from their own addresses: in.
    assert_eq!(via("127.0.0.1", "", OWNER, OWNER_PASSWORD), 200);
    assert_eq!(via("127.0.0.3", "", VIEWER, VIEWER_PASSWORD), 200);
}
