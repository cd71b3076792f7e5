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
//! - Only [`Role::Owner`] may change anything; [`Role::Viewer`] reads.

use std::net::{IpAddr, SocketAddr};

/// An account's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Approves, rejects, ratifies, kills, freezes, thaws.
    Owner,
    /// Reads everything, changes nothing.
    Viewer,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "owner" => Some(Role::Owner),
            "viewer" => Some(Role::Viewer),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Viewer => "viewer",
        }
    }
}

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
        // A name without a port means the bound port.
        if h.contains(':') && !h.ends_with(']') {
            hosts.push(h.clone());
        } else {
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
    pub host: &'a str,
    pub tls: bool,
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
        let scheme = if p.tls { "https" } else { "http" };
        let expected = format!("{scheme}://{}", p.host);
        if !origin.eq_ignore_ascii_case(&expected) {
            return Err(CsrfRefusal::Origin(origin.to_string()));
        }
    }
    Ok(())
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

/// Compares two byte strings without stopping at the first difference.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

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
            host: "127.0.0.1:8080",
            tls: false,
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
