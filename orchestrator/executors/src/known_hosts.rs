//! Strict host-key checking of SSH remotes against the known_hosts file the
//! owner configured: a pure decision over the file's text and the key the
//! server presented.
//!
//! Invariants:
//! - Only a key listed for the host (as `host` on port 22, `[host]:port`
//!   otherwise; plain or `|1|salt|hash` hashed names) is accepted. An
//!   unknown host, a key that differs from the listed one (changed), and a
//!   key of a type the file does not list for the host are refused, each
//!   named with the host, the key's type and its SHA256 fingerprint
//!   (`tests::only_the_listed_key_for_the_exact_host_and_port_is_known`,
//!   `tests/destinations.rs::ssh_push_with_a_key_lands_and_unknown_or_changed_host_keys_are_refused`).
//! - Markers (`@revoked`, `@cert-authority`) are never trusted: a revoked
//!   key is refused; certificate authorities are not supported
//!   (`tests::hashed_names_and_markers`).
//! - Nothing is trusted on first use, and the file is never written: the
//!   decision is a pure function of the file's text, and an unknown host
//!   stays unknown on every attempt
//!   (`tests/destinations.rs::ssh_push_with_a_key_lands_and_unknown_or_changed_host_keys_are_refused`).

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha1::Sha1;
use sha2::{Digest, Sha256};

/// What the file says about a key a server presented.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostKeyVerdict {
    /// Listed for the host.
    Known,
    /// The file lists no key at all for the host.
    Unknown,
    /// The file lists another key of the same type for the host.
    Changed,
    /// The file lists keys for the host, none of this type.
    OtherType { listed: Vec<String> },
    /// The key is marked `@revoked`.
    Revoked,
}

/// The `host` or `[host]:port` form known_hosts uses.
pub fn host_pattern(host: &str, port: u16) -> String {
    if port == 22 {
        host.to_string()
    } else {
        format!("[{host}]:{port}")
    }
}

/// The key's type name, read from its wire form (`ssh-ed25519`, ...).
pub fn key_type(blob: &[u8]) -> String {
    if blob.len() >= 4 {
        let n = u32::from_be_bytes([blob[0], blob[1], blob[2], blob[3]]) as usize;
        if let Some(name) = blob.get(4..4 + n) {
            if let Ok(s) = std::str::from_utf8(name) {
                return s.to_string();
            }
        }
    }
    "unknown".into()
}

/// `SHA256:<base64>` as ssh-keygen shows it.
pub fn fingerprint(blob: &[u8]) -> String {
    let digest = Sha256::digest(blob);
    format!(
        "SHA256:{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

fn name_matches(field: &str, pattern: &str) -> bool {
    field.split(',').any(|name| {
        if let Some(hashed) = name.strip_prefix("|1|") {
            let Some((salt, hash)) = hashed.split_once('|') else {
                return false;
            };
            let b64 = base64::engine::general_purpose::STANDARD;
            let (Ok(salt), Ok(hash)) = (b64.decode(salt), b64.decode(hash)) else {
                return false;
            };
            let Ok(mut mac) = <Hmac<Sha1> as Mac>::new_from_slice(&salt) else {
                return false;
            };
            mac.update(pattern.as_bytes());
            mac.verify_slice(&hash).is_ok()
        } else {
            // Negations and wildcards are not honoured: a name is exact.
            name == pattern
        }
    })
}

/// Checks `blob` (the server's key in wire form) for `host`:`port` against
/// the text of a known_hosts file.
pub fn check(known_hosts: &str, host: &str, port: u16, blob: &[u8]) -> HostKeyVerdict {
    let pattern = host_pattern(host, port);
    let presented_type = key_type(blob);
    let mut listed = Vec::new();
    let mut same_type_other = false;
    for line in known_hosts.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let mut first = fields.next().unwrap_or_default();
        let marker = first.strip_prefix('@').map(str::to_string);
        if marker.is_some() {
            first = fields.next().unwrap_or_default();
        }
        let (Some(kind), Some(key)) = (fields.next(), fields.next()) else {
            continue;
        };
        if !name_matches(first, &pattern) {
            continue;
        }
        let Ok(key) = base64::engine::general_purpose::STANDARD.decode(key) else {
            continue;
        };
        match marker.as_deref() {
            Some("revoked") if key == blob => return HostKeyVerdict::Revoked,
            Some(_) => continue,
            None => {}
        }
        if key == blob {
            return HostKeyVerdict::Known;
        }
        if kind == presented_type {
            same_type_other = true;
        }
        listed.push(kind.to_string());
    }
    if same_type_other {
        HostKeyVerdict::Changed
    } else if listed.is_empty() {
        HostKeyVerdict::Unknown
    } else {
        HostKeyVerdict::OtherType { listed }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(kind: &str, body: &[u8]) -> Vec<u8> {
        let mut b = (kind.len() as u32).to_be_bytes().to_vec();
        b.extend_from_slice(kind.as_bytes());
        b.extend_from_slice(body);
        b
    }

    fn line(names: &str, key: &[u8]) -> String {
        format!(
            "{names} {} {}\n",
            key_type(key),
            base64::engine::general_purpose::STANDARD.encode(key)
        )
    }

    #[test]
    fn only_the_listed_key_for_the_exact_host_and_port_is_known() {
        let ours = blob("ssh-ed25519", b"ours");
        let other = blob("ssh-ed25519", b"other");
        let rsa = blob("ssh-rsa", b"rsa");
        let file = line("git.example,10.0.0.1", &ours) + &line("[127.0.0.1]:2222", &ours);
        assert_eq!(
            check(&file, "git.example", 22, &ours),
            HostKeyVerdict::Known
        );
        assert_eq!(check(&file, "10.0.0.1", 22, &ours), HostKeyVerdict::Known);
        assert_eq!(
            check(&file, "127.0.0.1", 2222, &ours),
            HostKeyVerdict::Known
        );
        assert_eq!(
            check(&file, "127.0.0.1", 22, &ours),
            HostKeyVerdict::Unknown
        );
        assert_eq!(
            check(&file, "git.example", 22, &other),
            HostKeyVerdict::Changed
        );
        assert_eq!(
            check(&file, "git.example", 22, &rsa),
            HostKeyVerdict::OtherType {
                listed: vec!["ssh-ed25519".into()]
            }
        );
        assert_eq!(check("", "git.example", 22, &ours), HostKeyVerdict::Unknown);
        // A wildcard is not a name.
        assert_eq!(
            check(&line("*", &ours), "git.example", 22, &ours),
            HostKeyVerdict::Unknown
        );
    }

    #[test]
    fn hashed_names_and_markers() {
        let ours = blob("ssh-ed25519", b"ours");
        let salt = b"0123456789abcdef0123";
        let mut mac = <Hmac<Sha1> as Mac>::new_from_slice(salt).unwrap();
        mac.update(b"[127.0.0.1]:2222");
        let b64 = base64::engine::general_purpose::STANDARD;
        let hashed = format!(
            "|1|{}|{}",
            b64.encode(salt),
            b64.encode(mac.finalize().into_bytes())
        );
        let file = line(&hashed, &ours);
        assert_eq!(
            check(&file, "127.0.0.1", 2222, &ours),
            HostKeyVerdict::Known
        );
        assert_eq!(
            check(&file, "127.0.0.2", 2222, &ours),
            HostKeyVerdict::Unknown
        );
        let revoked = format!("@revoked {}", line("h", &ours));
        assert_eq!(check(&revoked, "h", 22, &ours), HostKeyVerdict::Revoked);
        let ca = format!("@cert-authority {}", line("h", &ours));
        assert_eq!(check(&ca, "h", 22, &ours), HostKeyVerdict::Unknown);
        assert!(fingerprint(&ours).starts_with("SHA256:"));
    }
}
