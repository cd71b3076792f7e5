//! `nightshift serve --tls-cert --tls-key` serves the dashboard over HTTPS
//! (rustls): a client that trusts the certificate logs in and gets a
//! `Secure`, `__Host-` session cookie; plain HTTP to that port gets no page;
//! without TLS a non-loopback bind is refused, naming the TLS flags; a
//! private key readable by others is refused, naming the file.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;

use tests::browser::{add_accounts, Serve, OWNER, OWNER_PASSWORD};
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
