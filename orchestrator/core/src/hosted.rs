//! Hosted mode: the configuration a hosted deployment must not start with,
//! decided over what was observed (pure; the binary observes, this
//! decides). Hosted mode is `--hosted` or `NIGHTSHIFT_HOSTED=1` (set in the
//! service image), for `serve` and `worker`.
//!
//! Invariants (each refusal names what was wrong and where it was set):
//! - The store is PostgreSQL; a `postgres://` URL to a host that is not
//!   local (loopback or a Unix socket) must ask for TLS (`sslmode=require`,
//!   `verify-ca` or `verify-full`)
//!   (`tests::a_remote_store_without_tls_is_refused_and_a_local_one_is_not`,
//!   `tests::store_refusal_is_exactly_remote_without_tls`).
//! - `serve`'s dashboard on an address that is not loopback serves TLS
//!   (`tests::a_plain_dashboard_off_loopback_is_refused`).
//! - `serve` has at least one owner account in the store
//!   (`tests::every_refusal_names_what_and_where`).
//! - Every secret file (the TLS key, the store URL's file, each `*_file` of
//!   the models and destinations except a `ca_file`) exists, is a regular
//!   file, is owned by the account the process runs as and is open to no
//!   one else (`tests::every_refusal_names_what_and_where`,
//!   `tests/tests/hosted.rs::the_hosted_binary_refuses_bad_configuration_naming_it`).

use std::net::SocketAddr;
use std::path::PathBuf;

/// Which process is starting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Serve,
    Worker,
}

/// A setting's value and where it came from (`NIGHTSHIFT_STORE`, a file's path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    pub value: String,
    pub from: String,
}

/// `serve`'s listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dashboard {
    pub bind: SocketAddr,
    pub tls: bool,
}

/// What was seen of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileSeen {
    /// Could not be read (missing, or the reason).
    Missing(String),
    Present {
        regular: bool,
        uid: u32,
        gid: u32,
        mode: u32,
    },
}

/// A secret file: what it is for, where it was named, its path and what was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretFile {
    pub what: String,
    pub named_in: String,
    pub path: PathBuf,
    pub seen: FileSeen,
}

/// Everything the check looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub role: Role,
    /// The store setting, if any was given.
    pub store: Option<Setting>,
    /// `serve`'s listener (`None` for a worker).
    pub dashboard: Option<Dashboard>,
    /// Owner accounts in the store (`serve` only).
    pub owner_accounts: usize,
    pub secrets: Vec<SecretFile>,
    /// The account the process runs as, and its group.
    pub euid: u32,
    pub egid: u32,
}

/// One reason not to start, as a sentence naming what and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Every reason the observed configuration must not start, in a fixed order.
pub fn refusals(o: &Observed) -> Vec<Refusal> {
    let mut out = Vec::new();
    match &o.store {
        None => out.push(Refusal(
            "no store: a hosted deployment keeps its state in PostgreSQL; set NIGHTSHIFT_STORE \
             (or NIGHTSHIFT_STORE_FILE, a file holding the URL) to postgres://…"
                .into(),
        )),
        Some(store) => {
            if let Some(r) = store_refusal(store) {
                out.push(r);
            }
        }
    }
    if let Some(d) = &o.dashboard {
        if !d.tls && !d.bind.ip().is_loopback() {
            out.push(Refusal(format!(
                "the dashboard on {} (--bind) has no TLS: give --tls-cert and --tls-key, or bind to loopback",
                d.bind
            )));
        }
    }
    if o.role == Role::Serve && o.owner_accounts == 0 {
        out.push(Refusal(format!(
            "no owner account in the store ({}): add one with `nightshift users add NAME --role owner`",
            o.store
                .as_ref()
                .map(|s| crate::state_store::redact(&s.value))
                .unwrap_or_else(|| "none".into())
        )));
    }
    for s in &o.secrets {
        if let Some(why) = secret_problem(&s.seen, o.euid, o.egid) {
            out.push(Refusal(format!(
                "{} {} (named in {}): {why}",
                s.what,
                s.path.display(),
                s.named_in
            )));
        }
    }
    out
}

/// The secret-file rule every reader of one applies (`crate::secret_file`).
fn secret_problem(seen: &FileSeen, euid: u32, egid: u32) -> Option<String> {
    match *seen {
        FileSeen::Missing(ref why) => Some(format!("cannot be read ({why})")),
        FileSeen::Present {
            regular,
            uid,
            gid,
            mode,
        } => crate::secret_file::problem(crate::secret_file::Seen {
            regular,
            uid,
            gid,
            mode,
            euid,
            egid,
        })
        .map(|p| p.to_string()),
    }
}

/// The hosts a `postgres://` URL names and its `sslmode`, or why it
/// cannot be read.
fn postgres_hosts(url: &str) -> Result<(Vec<String>, Option<String>), String> {
    let rest = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
        .ok_or("not a postgres:// URL")?;
    let (before_query, query) = match rest.split_once('?') {
        Some((a, q)) => (a, Some(q)),
        None => (rest, None),
    };
    let authority = before_query.split('/').next().unwrap_or("");
    let hostlist = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let mut hosts = Vec::new();
    for h in hostlist.split(',') {
        let h = if let Some(v6) = h.strip_prefix('[') {
            v6.split(']').next().unwrap_or("").to_string()
        } else {
            h.split(':').next().unwrap_or("").to_string()
        };
        hosts.push(percent_decode(&h)?);
    }
    let mut sslmode = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v)?;
        match k {
            "host" => hosts = v.split(',').map(str::to_string).collect(),
            "sslmode" => sslmode = Some(v),
            _ => {}
        }
    }
    Ok((hosts, sslmode))
}

fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("a bad percent escape at byte {i}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "percent escapes that are not UTF-8".to_string())
}

/// A host is local when it is a Unix socket's folder (an absolute path, or
/// none: the default socket), `localhost` or a loopback address.
fn is_local(host: &str) -> bool {
    host.is_empty()
        || host.starts_with('/')
        || host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn store_refusal(store: &Setting) -> Option<Refusal> {
    let shown = crate::state_store::redact(&store.value);
    if !(store.value.starts_with("postgres://") || store.value.starts_with("postgresql://")) {
        return Some(Refusal(format!(
            "store {shown:?} ({}): a hosted deployment keeps its state in PostgreSQL (postgres://…)",
            store.from
        )));
    }
    let (hosts, sslmode) = match postgres_hosts(&store.value) {
        Ok(found) => found,
        Err(why) => {
            return Some(Refusal(format!(
                "store {shown:?} ({}): cannot be read: {why}",
                store.from
            )))
        }
    };
    let remote: Vec<&String> = hosts.iter().filter(|h| !is_local(h)).collect();
    let tls = matches!(
        sslmode.as_deref(),
        Some("require" | "verify-ca" | "verify-full")
    );
    if remote.is_empty() || tls {
        return None;
    }
    Some(Refusal(format!(
        "store {shown:?} ({}): host {} is not local and the URL does not ask for TLS \
         (sslmode={}); add sslmode=verify-full, or reach PostgreSQL on its Unix socket",
        store.from,
        remote
            .iter()
            .map(|h| h.as_str())
            .collect::<Vec<_>>()
            .join(","),
        sslmode.as_deref().unwrap_or("prefer, the default")
    )))
}

/// The secret files a TOML configuration names: every string under a key
/// ending in `_file` except `ca_file` (an authority is not a secret), with
/// the dotted key it is under.
pub fn secret_paths(toml_text: &str) -> Result<Vec<(String, PathBuf)>, String> {
    let value: toml::Value = toml::from_str(toml_text).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    walk(&value, String::new(), &mut out);
    Ok(out)
}

fn walk(v: &toml::Value, at: String, out: &mut Vec<(String, PathBuf)>) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let here = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                match v {
                    toml::Value::String(s) if k.ends_with("_file") && k != "ca_file" => {
                        out.push((here, PathBuf::from(s)))
                    }
                    _ => walk(v, here, out),
                }
            }
        }
        toml::Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                walk(v, format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn good() -> Observed {
        Observed {
            role: Role::Serve,
            store: Some(Setting {
                value: "postgres://ns:pw@%2Frun%2Fpostgresql/nightshift".into(),
                from: "NIGHTSHIFT_STORE".into(),
            }),
            dashboard: Some(Dashboard {
                bind: "0.0.0.0:8470".parse().unwrap(),
                tls: true,
            }),
            owner_accounts: 1,
            secrets: vec![SecretFile {
                what: "the TLS key".into(),
                named_in: "--tls-key".into(),
                path: "/run/secrets/tls.key".into(),
                seen: FileSeen::Present {
                    regular: true,
                    uid: 10001,
                    gid: 10001,
                    mode: 0o100600,
                },
            }],
            euid: 10001,
            egid: 10001,
        }
    }

    fn store(url: &str) -> Observed {
        Observed {
            store: Some(Setting {
                value: url.into(),
                from: "NIGHTSHIFT_STORE".into(),
            }),
            ..good()
        }
    }

    #[test]
    fn a_good_configuration_starts() {
        assert_eq!(refusals(&good()), vec![]);
        let worker = Observed {
            role: Role::Worker,
            dashboard: None,
            owner_accounts: 0,
            ..good()
        };
        assert_eq!(refusals(&worker), vec![]);
    }

    #[test]
    fn a_remote_store_without_tls_is_refused_and_a_local_one_is_not() {
        for url in [
            "postgres://ns:pw@db.example:5432/ns",
            "postgres://ns@db.example/ns?sslmode=prefer",
            "postgres://ns@db.example/ns?sslmode=disable",
            "postgresql://ns@10.0.0.5/ns",
            "postgres://ns@localhost,db.example/ns",
            "postgres://ns@[2001:db8::1]:5432/ns",
            "postgres://ns@%2Frun%2Fpg/ns?host=db.example",
        ] {
            let r = refusals(&store(url));
            assert_eq!(r.len(), 1, "{url}: {r:?}");
            assert!(r[0].0.contains("is not local"), "{url}: {}", r[0]);
            assert!(r[0].0.contains("NIGHTSHIFT_STORE"), "{}", r[0]);
            assert!(!r[0].0.contains("pw@"), "the password shown: {}", r[0]);
        }
        for url in [
            "postgres://ns:pw@db.example:5432/ns?sslmode=require",
            "postgres://ns@db.example/ns?connect_timeout=5&sslmode=verify-full",
            "postgres://ns@localhost/ns",
            "postgres://ns@127.0.0.1:5432/ns",
            "postgres://ns@[::1]/ns",
            "postgres://ns@%2Frun%2Fpostgresql/ns",
            "postgres://ns@/ns?host=/run/postgresql",
        ] {
            assert_eq!(refusals(&store(url)), vec![], "{url}");
        }
        for url in ["sqlite:", "sqlite:/var/lib/x"] {
            let r = refusals(&store(url));
            assert!(r[0].0.contains("PostgreSQL"), "{url}: {r:?}");
        }
    }

    proptest! {
        /// A store is refused exactly when one of its hosts is not local
        /// and its sslmode asks for no TLS.
        #[test]
        fn store_refusal_is_exactly_remote_without_tls(
            hosts in proptest::collection::vec(
                prop_oneof![
                    Just("localhost".to_string()),
                    Just("127.0.0.1".to_string()),
                    Just("%2Frun%2Fpg".to_string()),
                    "[a-z]{1,8}\\.example",
                    Just("10.1.2.3".to_string()),
                ],
                1..4,
            ),
            sslmode in prop_oneof![
                Just(None),
                Just(Some("disable")),
                Just(Some("prefer")),
                Just(Some("require")),
                Just(Some("verify-ca")),
                Just(Some("verify-full")),
            ],
        ) {
            let mut url = format!("postgres://ns:secret@{}/ns", hosts.join(","));
            if let Some(m) = sslmode {
                url.push_str(&format!("?sslmode={m}"));
            }
            let remote = hosts.iter().any(|h| h.ends_with(".example") || h == "10.1.2.3");
            let tls = matches!(sslmode, Some("require" | "verify-ca" | "verify-full"));
            let refused = !refusals(&store(&url)).is_empty();
            prop_assert_eq!(refused, remote && !tls, "{}", url);
        }
    }

    #[test]
    fn a_plain_dashboard_off_loopback_is_refused() {
        let mut o = good();
        o.dashboard = Some(Dashboard {
            bind: "0.0.0.0:8470".parse().unwrap(),
            tls: false,
        });
        let r = refusals(&o);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(
            r[0].0.contains("0.0.0.0:8470") && r[0].0.contains("TLS"),
            "{}",
            r[0]
        );
        for bind in ["127.0.0.1:8470", "[::1]:8470"] {
            o.dashboard = Some(Dashboard {
                bind: bind.parse().unwrap(),
                tls: false,
            });
            assert_eq!(refusals(&o), vec![], "{bind}");
        }
    }

    #[test]
    fn every_refusal_names_what_and_where() {
        let mut o = good();
        o.owner_accounts = 0;
        o.store = None;
        o.secrets = vec![
            SecretFile {
                what: "the TLS key".into(),
                named_in: "--tls-key".into(),
                path: "/s/open".into(),
                seen: FileSeen::Present {
                    regular: true,
                    uid: 10001,
                    gid: 10001,
                    mode: 0o100644,
                },
            },
            SecretFile {
                what: "a secret".into(),
                named_in: "/etc/nightshift/models.toml endpoints.a.key_file".into(),
                path: "/s/root".into(),
                seen: FileSeen::Present {
                    regular: true,
                    uid: 0,
                    gid: 0,
                    mode: 0o100600,
                },
            },
            SecretFile {
                what: "a secret".into(),
                named_in: "NIGHTSHIFT_STORE_FILE".into(),
                path: "/s/gone".into(),
                seen: FileSeen::Missing("No such file or directory".into()),
            },
            SecretFile {
                what: "a secret".into(),
                named_in: "x".into(),
                path: "/s/dir".into(),
                seen: FileSeen::Present {
                    regular: false,
                    uid: 10001,
                    gid: 10001,
                    mode: 0o040700,
                },
            },
        ];
        let r: Vec<String> = refusals(&o).into_iter().map(|r| r.0).collect();
        assert_eq!(r.len(), 6, "{r:#?}");
        assert!(r[0].starts_with("no store"), "{}", r[0]);
        assert!(r[1].starts_with("no owner account"), "{}", r[1]);
        assert!(r[2].contains("/s/open") && r[2].contains("0644") && r[2].contains("--tls-key"));
        assert!(r[3].contains("/s/root") && r[3].contains("uid 0") && r[3].contains("models.toml"));
        assert!(r[4].contains("/s/gone") && r[4].contains("NIGHTSHIFT_STORE_FILE"));
        assert!(r[5].contains("/s/dir") && r[5].contains("not a regular file"));
        // A worker has no dashboard and needs no owner account.
        o.role = Role::Worker;
        assert!(!refusals(&o).iter().any(|r| r.0.contains("owner account")));
    }

    #[test]
    fn secret_paths_are_every_file_key_but_a_ca() {
        let found = secret_paths(
            r#"
[endpoints.a]
key_file = "/k/a"
url = "https://x"
[remotes.origin]
token_file = "/k/t"
ca_file = "/k/ca"
[[notify]]
secret_file = "/k/s"
"#,
        )
        .unwrap();
        let mut names: Vec<String> = found
            .iter()
            .map(|(k, p)| format!("{k}={}", p.display()))
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "endpoints.a.key_file=/k/a",
                "notify[0].secret_file=/k/s",
                "remotes.origin.token_file=/k/t"
            ]
        );
        assert!(secret_paths("not toml [").is_err());
    }
}
