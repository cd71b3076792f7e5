//! The dashboard's request checks, as pure functions over what a request
//! carries: which `Host` may be served (no DNS rebinding), whether a
//! state-changing request comes from our own pages (CSRF), and which role
//! may do what.
//!
//! Invariants:
//! - A request whose `Host` is not on the allowlist is refused before
//!   anything else is read (a rebinding page's requests carry its own name).
//! - Every state-changing request needs the session's CSRF token, and when
//!   the browser says where it comes from (`Origin`, `Sec-Fetch-Site`), that
//!   must be this very origin.
//! - Only [`Role::Owner`] may change anything; [`Role::Viewer`] reads
//!   (`tests/tests/dashboard_api.rs::every_state_changing_endpoint_refuses_without_session_owner_or_token`).
//! - Behind a TLS proxy ([`Front`]): the configured external origin's `Host`
//!   is served only to a trusted proxy's connections, and such a request
//!   belongs to that origin (`https`: `Secure`, `__Host-` cookies); the
//!   client's address is taken from `X-Forwarded-For` only on a trusted
//!   proxy's connection, else it is the peer's
//!   (`tests::a_trusted_proxy_names_the_client_and_the_origin`,
//!   `tests/tests/dashboard_tls.rs::behind_a_tls_proxy_failed_logins_count_per_client`).

use std::net::{IpAddr, SocketAddr};

pub use nightshift_core::accounts::Role;
pub use nightshift_core::front::{ExternalOrigin, Front};

/// The `Host` values served for a bind address: the address itself and,
/// on loopback, `localhost`; plus the names the operator allowed.
pub fn default_hosts(bind: SocketAddr, extra: &[String]) -> Vec<String> {
    let port = bind.port();
    let mut hosts = vec![match bind.ip() {
        IpAddr::V4(ip) => format!("{ip}:{port}"),
        IpAddr::V6(ip) => format!("[{ip}]:{port}"),
    }];
    if bind.ip().is_loopback() {
        hosts.push(format!("localhost:{port}"));
        hosts.push(format!("127.0.0.1:{port}"));
        hosts.push(format!("[::1]:{port}"));
    }
    for h in extra {
        if h.contains(':') && !h.ends_with(']') {
            hosts.push(h.clone());
        } else {
            // A name without a port: as browsers send it for their default
            // port (a proxy in front), and with the bound port.
            hosts.push(h.clone());
            hosts.push(format!("{h}:{port}"));
        }
    }
    hosts.iter_mut().for_each(|h| h.make_ascii_lowercase());
    hosts.sort();
    hosts.dedup();
    hosts
}

/// Is `host` (the request's `Host` header) one we serve? Exact match,
/// ignoring ASCII case; a missing header is refused.
pub fn host_allowed(host: Option<&str>, allowed: &[String]) -> bool {
    match host {
        Some(h) => allowed.iter().any(|a| a.eq_ignore_ascii_case(h)),
        None => false,
    }
}

/// Why a state-changing request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrfRefusal {
    #[error("the request comes from another site (Sec-Fetch-Site: {0})")]
    CrossSite(String),
    #[error("the request's Origin {0} is not this dashboard")]
    Origin(String),
    #[error("the request carries no CSRF token")]
    NoToken,
    #[error("the request's CSRF token is not this session's")]
    WrongToken,
}

/// What a state-changing request says about where it comes from.
#[derive(Debug, Clone, Default)]
pub struct Provenance<'a> {
    /// The origin this request belongs to ([`Arrival::origin`]).
    pub expected_origin: &'a str,
    pub origin: Option<&'a str>,
    pub sec_fetch_site: Option<&'a str>,
}

/// The browser's own word on where a request comes from: when it speaks,
/// it must say "this origin".
pub fn same_origin(p: &Provenance<'_>) -> Result<(), CsrfRefusal> {
    if let Some(site) = p.sec_fetch_site {
        if site != "same-origin" {
            return Err(CsrfRefusal::CrossSite(site.to_string()));
        }
    }
    if let Some(origin) = p.origin {
        if !origin.eq_ignore_ascii_case(p.expected_origin) {
            return Err(CsrfRefusal::Origin(origin.to_string()));
        }
    }
    Ok(())
}

/// Where one request comes from, and the origin it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    /// The client's address: the peer's, or (on a trusted proxy's
    /// connection) the last address `X-Forwarded-For` names that is not a
    /// trusted proxy's.
    pub client: IpAddr,
    /// Reached over TLS (ours, or the trusted proxy's for its origin).
    pub secure: bool,
    /// `http://HOST`, `https://HOST`, or the external origin.
    pub origin: String,
}

/// Most `X-Forwarded-For` entries read (from the right).
const FORWARDED_ENTRIES: usize = 32;

fn plain(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// Where a request comes from (see [`Arrival`]); `forwarded_for` are the
/// `X-Forwarded-For` header's values in the order received. A refusal says
/// why, for a `421` (the Host) or a `400` (the header).
pub fn arrival(
    front: &Front,
    tls: bool,
    peer: IpAddr,
    host: &str,
    forwarded_for: &[&str],
) -> Result<Arrival, String> {
    let peer = plain(peer);
    let trusted = |ip: IpAddr| front.trusted_proxies.iter().any(|t| plain(*t) == ip);
    let via_proxy = trusted(peer);
    let mut client = peer;
    if via_proxy {
        let entries = forwarded_for
            .iter()
            .rev()
            .flat_map(|v| v.rsplit(','))
            .map(str::trim)
            .take(FORWARDED_ENTRIES);
        for entry in entries {
            let ip = entry
                .parse::<IpAddr>()
                .map(plain)
                .map_err(|_| format!("X-Forwarded-For names {entry:?}, which is not an address"))?;
            client = ip;
            if !trusted(ip) {
                break;
            }
        }
    }
    let external = front
        .external
        .as_ref()
        .filter(|e| e.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)));
    match external {
        Some(_) if !via_proxy => Err(format!(
            "the Host {host} is served only through the configured proxy"
        )),
        Some(e) => Ok(Arrival {
            client,
            secure: true,
            origin: e.origin.clone(),
        }),
        None => Ok(Arrival {
            client,
            secure: tls,
            origin: format!(
                "{}://{}",
                if tls { "https" } else { "http" },
                host.to_ascii_lowercase()
            ),
        }),
    }
}

/// The key a client's login failures are counted under: its address, or
/// for IPv6 its /64 (one host commonly holds a whole /64).
pub fn client_key(ip: IpAddr) -> IpAddr {
    match plain(ip) {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

/// The full check of a state-changing request made within a session.
pub fn state_change_allowed(
    p: &Provenance<'_>,
    presented: Option<&str>,
    session_token: &str,
) -> Result<(), CsrfRefusal> {
    same_origin(p)?;
    let presented = presented.ok_or(CsrfRefusal::NoToken)?;
    if constant_time_eq(presented.as_bytes(), session_token.as_bytes()) {
        Ok(())
    } else {
        Err(CsrfRefusal::WrongToken)
    }
}

pub use nightshift_core::accounts::constant_time_eq;

/// A bind that is not loopback carries passwords and sessions over a
/// network: refused unless served with TLS or explicitly allowed.
pub fn bind_allowed(bind: SocketAddr, tls: bool, insecure_network: bool) -> Result<(), String> {
    if bind.ip().is_loopback() || tls || insecure_network {
        Ok(())
    } else {
        Err(format!(
            "refusing to serve plain HTTP on {bind}, which is not a loopback address: give --tls-cert and --tls-key, or --insecure-network if something in front of it provides TLS"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p<'a>(origin: Option<&'a str>, site: Option<&'a str>) -> Provenance<'a> {
        Provenance {
            expected_origin: "http://127.0.0.1:8080",
            origin,
            sec_fetch_site: site,
        }
    }

    #[test]
    fn hosts_of_a_loopback_bind() {
        let hosts = default_hosts("127.0.0.1:8080".parse().unwrap(), &["Dash.Example".into()]);
        assert!(host_allowed(Some("localhost:8080"), &hosts));
        assert!(host_allowed(Some("127.0.0.1:8080"), &hosts));
        assert!(host_allowed(Some("dash.example:8080"), &hosts));
        assert!(!host_allowed(Some("evil.example:8080"), &hosts));
        assert!(!host_allowed(Some("localhost:8081"), &hosts));
        assert!(!host_allowed(Some("localhost"), &hosts));
        assert!(!host_allowed(None, &hosts));
        // A name given without a port is also served as browsers send it
        // through a proxy on their default port.
        assert!(host_allowed(Some("dash.example"), &hosts));
    }

    #[test]
    fn external_origins_parse_strictly() {
        let e = ExternalOrigin::parse("https://Dash.Example").unwrap();
        assert_eq!(e.origin, "https://dash.example");
        assert_eq!(e.hosts, ["dash.example", "dash.example:443"]);
        let e = ExternalOrigin::parse("https://dash.example:8443/").unwrap();
        assert_eq!(e.origin, "https://dash.example:8443");
        assert_eq!(e.hosts, ["dash.example:8443", "dash.example"]);
        let e = ExternalOrigin::parse("https://[::1]:9").unwrap();
        assert_eq!(e.hosts, ["[::1]:9", "[::1]"]);
        for bad in [
            "http://dash.example",
            "dash.example",
            "https://",
            "https://dash.example/path",
            "https://user@dash.example",
            "https://dash.example:0",
            "https://dash.example:99999",
            "https://dash.example?x",
            "https://[nonsense]",
        ] {
            assert!(ExternalOrigin::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_trusted_proxy_names_the_client_and_the_origin() {
        let proxy: IpAddr = "10.0.0.1".parse().unwrap();
        let front = Front {
            external: Some(ExternalOrigin::parse("https://dash.example").unwrap()),
            trusted_proxies: vec![proxy],
        };
        // Through the proxy, for its origin.
        let a = arrival(&front, false, proxy, "dash.example", &["6.6.6.6, 1.2.3.4"]).unwrap();
        assert_eq!(a.client, "1.2.3.4".parse::<IpAddr>().unwrap());
        assert!(a.secure);
        assert_eq!(a.origin, "https://dash.example");
        // A client's own X-Forwarded-For is the left part the proxy appends to.
        let a = arrival(
            &front,
            false,
            proxy,
            "dash.example",
            &["1.2.3.4", "10.0.0.1"],
        )
        .unwrap();
        assert_eq!(a.client, "1.2.3.4".parse::<IpAddr>().unwrap());
        // Anyone else: the peer, whatever it claims, and never the proxy's origin.
        let stranger: IpAddr = "5.5.5.5".parse().unwrap();
        let a = arrival(&front, false, stranger, "127.0.0.1:80", &["1.2.3.4"]).unwrap();
        assert_eq!(a.client, stranger);
        assert!(!a.secure);
        assert_eq!(a.origin, "http://127.0.0.1:80");
        assert!(arrival(&front, false, stranger, "dash.example", &[]).is_err());
        assert!(arrival(&front, false, proxy, "dash.example", &["not-an-ip"]).is_err());
        // No header: the proxy is the client.
        let a = arrival(&front, false, proxy, "dash.example:443", &[]).unwrap();
        assert_eq!(a.client, proxy);
        // Under serve's own TLS.
        let a = arrival(&Front::default(), true, stranger, "h:1", &["1.2.3.4"]).unwrap();
        assert_eq!(
            (a.client, a.secure, a.origin.as_str()),
            (stranger, true, "https://h:1")
        );
    }

    #[test]
    fn ipv6_clients_are_counted_by_their_64() {
        let a: IpAddr = "2001:db8:1:2:3:4:5:6".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::1".parse().unwrap();
        assert_eq!(client_key(a), client_key(b));
        let v4: IpAddr = "1.2.3.4".parse().unwrap();
        let mapped: IpAddr = "::ffff:1.2.3.4".parse().unwrap();
        assert_eq!(client_key(mapped), v4);
    }

    #[test]
    fn cross_site_requests_are_refused() {
        assert!(state_change_allowed(&p(None, None), Some("t"), "t").is_ok());
        assert!(state_change_allowed(
            &p(Some("http://127.0.0.1:8080"), Some("same-origin")),
            Some("t"),
            "t"
        )
        .is_ok());
        assert_eq!(
            state_change_allowed(&p(None, Some("cross-site")), Some("t"), "t"),
            Err(CsrfRefusal::CrossSite("cross-site".into()))
        );
        assert_eq!(
            state_change_allowed(&p(None, Some("same-site")), Some("t"), "t"),
            Err(CsrfRefusal::CrossSite("same-site".into()))
        );
        assert_eq!(
            state_change_allowed(&p(Some("http://evil.example"), None), Some("t"), "t"),
            Err(CsrfRefusal::Origin("http://evil.example".into()))
        );
        assert_eq!(
            state_change_allowed(&p(Some("null"), None), Some("t"), "t"),
            Err(CsrfRefusal::Origin("null".into()))
        );
        assert_eq!(
            state_change_allowed(&p(Some("https://127.0.0.1:8080"), None), Some("t"), "t"),
            Err(CsrfRefusal::Origin("https://127.0.0.1:8080".into()))
        );
        assert_eq!(
            state_change_allowed(&p(None, None), None, "t"),
            Err(CsrfRefusal::NoToken)
        );
        assert_eq!(
            state_change_allowed(&p(None, None), Some("u"), "t"),
            Err(CsrfRefusal::WrongToken)
        );
    }

    #[test]
    fn plain_http_only_on_loopback() {
        assert!(bind_allowed("127.0.0.1:1".parse().unwrap(), false, false).is_ok());
        assert!(bind_allowed("[::1]:1".parse().unwrap(), false, false).is_ok());
        assert!(bind_allowed("0.0.0.0:1".parse().unwrap(), false, false).is_err());
        assert!(bind_allowed("10.0.0.1:1".parse().unwrap(), true, false).is_ok());
        assert!(bind_allowed("10.0.0.1:1".parse().unwrap(), false, true).is_ok());
    }

    proptest! {
        /// Only the session's exact token passes.
        #[test]
        fn only_the_exact_token_passes(a in "[0-9a-f]{0,70}", b in "[0-9a-f]{0,70}") {
            let ok = state_change_allowed(&p(None, None), Some(&a), &b).is_ok();
            prop_assert_eq!(ok, a == b);
        }

        /// No Host outside the allowlist is served, whatever its spelling.
        #[test]
        fn no_host_outside_the_list(h in "[a-zA-Z0-9.:\\[\\]-]{0,40}") {
            let hosts = default_hosts("127.0.0.1:8080".parse().unwrap(), &[]);
            let ok = host_allowed(Some(&h), &hosts);
            prop_assert_eq!(ok, hosts.iter().any(|a| a.eq_ignore_ascii_case(&h)));
        }
    }
}
