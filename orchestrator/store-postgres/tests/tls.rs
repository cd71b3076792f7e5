//! The store over TLS against real PostgreSQL servers on loopback, attacked
//! as a network attacker would: a certificate from another authority, a
//! certificate for another name, a server that offers no TLS at all. Each
//! is refused, naming the store; only the right server is used, and then
//! over TLS (the server's own `pg_stat_ssl` says so).

use std::net::TcpListener;
use std::path::Path;

use nightshift_store_postgres::testing::tcp_server_url;
use nightshift_store_postgres::{connect_client, PgStore};

struct Ca {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

fn ca(name: &str) -> Ca {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.distinguished_name.push(rcgen::DnType::CommonName, name);
    Ca {
        cert: p.self_signed(&key).unwrap(),
        key,
    }
}

/// A server certificate for `names`, signed by `ca`, written as
/// DIR/server.pem and DIR/server.key.
fn server_cert(ca: &Ca, names: &[&str], dir: &Path) {
    let key = rcgen::KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let cert = rcgen::CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &ca.cert, &ca.key)
        .unwrap();
    std::fs::write(dir.join("server.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn ssl_of(url: &str) -> bool {
    let mut c = connect_client(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    c.query_one(
        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
        &[],
    )
    .unwrap()
    .get(0)
}

#[test]
fn the_store_speaks_tls_only_to_the_server_its_url_trusts() {
    let dir = tempfile::tempdir().unwrap();
    let good = ca("the store's CA");
    let other = ca("someone else's CA");
    server_cert(&good, &["localhost"], dir.path());
    let good_pem = dir.path().join("ca.pem");
    std::fs::write(&good_pem, good.cert.pem()).unwrap();
    let other_pem = dir.path().join("other-ca.pem");
    std::fs::write(&other_pem, other.cert.pem()).unwrap();

    let port = free_port();
    tcp_server_url(port, Some(dir.path())).expect("a TLS server");
    let url = |host: &str, q: &str| format!("postgres://postgres@{host}:{port}/postgres?{q}");
    let root = |p: &Path| format!("sslrootcert={}", p.display());

    // The right authority and name: a store over TLS.
    let ok = url(
        "localhost",
        &format!("sslmode=verify-full&{}", root(&good_pem)),
    );
    assert!(ssl_of(&ok), "connected, but not over TLS");
    let state = tempfile::tempdir().unwrap();
    PgStore::connect(&ok, state.path()).expect("the store over TLS");
    // `require` verifies too (stricter than libpq's).
    assert!(ssl_of(&url(
        "localhost",
        &format!("sslmode=require&{}", root(&good_pem))
    )));

    let refused = |u: &str| -> String {
        match connect_client(u) {
            Ok(_) => panic!("{u} connected"),
            Err(e) => {
                let words = e.to_string();
                assert!(words.contains("state store"), "{words}");
                format!("{words} {:?}", std::error::Error::source(&e))
            }
        }
    };
    // Another authority's certificate, as an attacker in the middle has.
    let w = refused(&url(
        "localhost",
        &format!("sslmode=verify-full&{}", root(&other_pem)),
    ));
    assert!(
        w.to_lowercase().contains("certificate") || w.contains("UnknownIssuer"),
        "{w}"
    );
    // `require` with no roots of the URL's own: the system's, which do not
    // know this authority.
    refused(&url("localhost", "sslmode=require"));
    // The right authority, the wrong name (the certificate is localhost's).
    let w = refused(&url(
        "127.0.0.1",
        &format!("sslmode=verify-full&{}", root(&good_pem)),
    ));
    assert!(
        w.to_lowercase().contains("certificate") || w.contains("NotValidForName"),
        "{w}"
    );
    // A missing roots file is named.
    let w = refused(&url(
        "localhost",
        "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
    ));
    assert!(w.contains("/nonexistent/ca.pem"), "{w}");
    // The server rejects TCP without TLS: `prefer` (taken as no TLS) fails
    // there rather than quietly speaking in the clear.
    refused(&url("localhost", "sslmode=prefer"));
}

#[test]
fn a_server_that_offers_no_tls_is_never_used_in_the_clear() {
    let port = free_port();
    tcp_server_url(port, None).expect("a plain server");
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("ca.pem");
    std::fs::write(&pem, ca("any").cert.pem()).unwrap();
    for mode in ["require", "verify-ca", "verify-full"] {
        let u = format!(
            "postgres://postgres@localhost:{port}/postgres?sslmode={mode}&sslrootcert={}",
            pem.display()
        );
        let e = connect_client(&u)
            .err()
            .unwrap_or_else(|| panic!("{mode}: used in the clear"));
        assert!(e.to_string().contains("state store"), "{e}");
    }
    // Without asking for TLS it connects, in the clear, as asked.
    assert!(!ssl_of(&format!(
        "postgres://postgres@localhost:{port}/postgres"
    )));
}
