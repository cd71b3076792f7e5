//! What stands in front of `serve`: a TLS proxy's external origin and the
//! addresses its connections come from (`[serve]` in the configuration;
//! the dashboard's guard checks requests against it).

use std::net::IpAddr;

/// The origin browsers use when a TLS proxy in front serves the dashboard
/// (`[serve] external_origin`): `https://NAME` or `https://NAME:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalOrigin {
    /// `https://name[:port]`, lowercase, the port left out when 443.
    pub origin: String,
    /// The `Host` values that name it: `name` and `name:443`, or
    /// `name:port` and `name` (a proxy may pass the name alone).
    pub hosts: Vec<String>,
}

impl ExternalOrigin {
    pub fn parse(text: &str) -> Result<ExternalOrigin, String> {
        let bad = |why: &str| {
            format!("external origin {text:?}: {why}; give https://NAME or https://NAME:PORT")
        };
        let lower = text.to_ascii_lowercase();
        let rest = lower
            .strip_prefix("https://")
            .ok_or_else(|| bad("not https"))?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        // `[v6]` or `name`, then maybe `:port`.
        let split = match rest.find(']') {
            Some(end) if rest.starts_with('[') => {
                let (n, p) = rest.split_at(end + 1);
                (n, p.strip_prefix(':').or(Some(p).filter(|p| !p.is_empty())))
            }
            _ => match rest.rsplit_once(':') {
                Some((n, p)) => (n, Some(p)),
                None => (rest, None),
            },
        };
        let (name, port) = match split {
            (n, Some(p)) => {
                let port: u16 = p
                    .parse()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| bad("the port is not 1 to 65535"))?;
                (n, port)
            }
            (n, None) => (n, 443),
        };
        let name_ok = if let Some(v6) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
            v6.parse::<std::net::Ipv6Addr>().is_ok()
        } else {
            !name.is_empty()
                && name.len() <= 253
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        };
        if !name_ok {
            return Err(bad("not a host name (no path, user or query)"));
        }
        Ok(if port == 443 {
            ExternalOrigin {
                origin: format!("https://{name}"),
                hosts: vec![name.to_string(), format!("{name}:443")],
            }
        } else {
            ExternalOrigin {
                origin: format!("https://{name}:{port}"),
                // A proxy may pass the name alone (nginx's `$host`).
                hosts: vec![format!("{name}:{port}"), name.to_string()],
            }
        })
    }
}

/// What stands in front of `serve`: a TLS proxy's external origin and the
/// addresses its connections come from (both or neither).
#[derive(Debug, Clone, Default)]
pub struct Front {
    pub external: Option<ExternalOrigin>,
    pub trusted_proxies: Vec<IpAddr>,
}
