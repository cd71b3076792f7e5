//! Requests to act, and their content-free digest.
//!
//! Invariants: the digest is SHA-256 over the canonical JSON of
//! `["nightshift.request.v1", actor, door, scope, args]` (absent actor or
//! scope is `null`), so it is the same for equal requests whatever the key
//! order of their args, differs when any part differs, and lets the audit
//! name a request without holding its arguments.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::canonical::canonical_json;

/// A request from an actor to pass through a door.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Who asks, when the door knows.
    pub actor: Option<String>,
    /// The door or tool name (`push`, `Bash`, `github_create_pr`).
    pub door: String,
    /// The arguments, as JSON.
    pub args: serde_json::Value,
    /// The path the act is about (a worktree, a file), when known.
    pub scope: Option<String>,
}

/// SHA-256 of a request's canonical encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestDigest(pub [u8; 32]);

impl fmt::Display for RequestDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl Serialize for RequestDigest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl Request {
    /// A request with no actor and no scope.
    pub fn new(door: impl Into<String>, args: serde_json::Value) -> Self {
        Self {
            actor: None,
            door: door.into(),
            args,
            scope: None,
        }
    }

    /// The canonical bytes the digest is taken over.
    pub fn canonical(&self) -> String {
        let opt = |o: &Option<String>| match o {
            Some(s) => serde_json::Value::String(s.clone()),
            None => serde_json::Value::Null,
        };
        canonical_json(&serde_json::Value::Array(vec![
            "nightshift.request.v1".into(),
            opt(&self.actor),
            self.door.clone().into(),
            opt(&self.scope),
            self.args.clone(),
        ]))
    }

    /// The request's digest.
    pub fn digest(&self) -> RequestDigest {
        RequestDigest(Sha256::digest(self.canonical().as_bytes()).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn digest_ignores_key_order_and_sees_every_part() {
        let a = Request {
            actor: Some("agent-1".into()),
            door: "push".into(),
            args: serde_json::from_str(r#"{"ref":"main","remote":"origin"}"#).unwrap(),
            scope: Some("/w".into()),
        };
        let mut b = a.clone();
        b.args = serde_json::from_str(r#"{"remote":"origin","ref":"main"}"#).unwrap();
        assert_eq!(a.digest(), b.digest());
        for change in [
            |r: &mut Request| r.actor = None,
            |r: &mut Request| r.door = "pr".into(),
            |r: &mut Request| r.scope = None,
            |r: &mut Request| r.args = json!({"ref": "main"}),
        ] {
            let mut c = a.clone();
            change(&mut c);
            assert_ne!(a.digest(), c.digest());
        }
        // An actor named "null" is not the absent actor.
        let mut n = a.clone();
        n.actor = Some("null".into());
        let mut m = a.clone();
        m.actor = None;
        assert_ne!(n.digest(), m.digest());
        assert_eq!(a.digest().to_string().len(), 64);
    }
}
