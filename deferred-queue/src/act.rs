//! Acts and their digest.
//!
//! Invariants:
//! - An [`Act`] is immutable once queued: its routing and content are what a
//!   person approves. Anything that would change them is a new act.
//! - [`act_digest`] is a function of exactly the bound fields: door, routing,
//!   content digests, actor, run, policy generation and the deciding rules
//!   (as a set). The act's id and its times are not bound: the id is the
//!   row's handle and the times govern when the act may be approved, not
//!   what it does; binding them would not protect anything and would make a
//!   recomputation before execution differ for no reason.
//! - The encoding behind the digest is injective (see [`act_digest`]), so two
//!   acts that differ in any bound field never share a digest short of a
//!   SHA-256 collision (`tests::shifting_bytes_between_adjacent_fields_moves_the_digest`,
//!   `tests::every_bound_field_of_a_push_moves_the_digest`).
//! - Nothing here holds content: a message travels as its digest and size,
//!   a pull request's title and body as one digest.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

/// The kind of effect an act asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Door {
    /// Push a commit to a ref of a configured remote.
    Push,
    /// Open a pull request on a configured forge.
    PullRequest,
    /// Post a message to a configured endpoint.
    Notify,
    /// Ask a person a question through a configured endpoint.
    Ask,
}

impl Door {
    /// The door's stable name, as used in the digest and the audit.
    pub fn name(self) -> &'static str {
        match self {
            Door::Push => "push",
            Door::PullRequest => "pull_request",
            Door::Notify => "notify",
            Door::Ask => "ask",
        }
    }
}

/// Where the effect lands. Trusted: every name here is one the owner
/// configured or the supervisor observed, never one an agent supplied raw.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Routing {
    /// The destination alias from the owner's configuration.
    pub destination: String,
    /// The door-specific part.
    pub target: Target,
}

/// The door-specific part of [`Routing`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Target {
    /// For [`Door::Push`].
    Push {
        /// The ref to update on the remote, e.g. `refs/heads/agent/x`.
        target_ref: String,
        /// The commit the remote ref must hold when the push happens;
        /// `None` means the ref must not exist yet. Bound so that a remote
        /// that moved since approval makes the act stale.
        expected_old: Option<String>,
    },
    /// For [`Door::PullRequest`].
    PullRequest {
        /// The branch the pull request merges into.
        base_ref: String,
        /// The branch the pull request proposes.
        head_ref: String,
    },
    /// For [`Door::Notify`] and [`Door::Ask`].
    Message {
        /// The endpoint alias from the owner's configuration.
        endpoint: String,
    },
}

/// What is carried, by digest. May be untrusted: it is bound, not believed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Content {
    /// For [`Door::Push`].
    Commit {
        /// The commit id to push.
        commit: String,
    },
    /// For [`Door::PullRequest`].
    PullRequest {
        /// The commit the head ref must point at.
        head_commit: String,
        /// Digest of the title and body together.
        text_digest: String,
    },
    /// For [`Door::Notify`] and [`Door::Ask`].
    Message {
        /// Digest of the body.
        body_digest: String,
        /// Size of the body in bytes.
        size: u64,
    },
}

/// A request from a run for an effect outside Tier 0, as queued.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Act {
    /// The act's id (not bound: a handle, not a meaning).
    pub id: String,
    /// The run that asked.
    pub run: String,
    /// The agent (actor) that asked.
    pub actor: String,
    /// What kind of effect.
    pub door: Door,
    /// Where it lands.
    pub routing: Routing,
    /// What it carries, by digest.
    pub content: Content,
    /// The rule set's generation the verdict *ask* was reached under
    /// (`policies::Generation` in its display form).
    pub policy_generation: String,
    /// Ids of the rules that decided the verdict. Bound as a set: order and
    /// repetition do not matter.
    pub deciding_rules: Vec<String>,
    /// When the act was queued, unix seconds.
    pub created_at: i64,
    /// The end of the approval window, unix seconds: an act still waiting
    /// at this instant expires.
    pub expires_at: i64,
}

/// An act whose parts do not fit together.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ActError {
    /// The routing or content is of another door's kind.
    #[error("act {id}: {part} is not of the {door} door's kind")]
    DoorMismatch {
        /// The act.
        id: String,
        /// The act's door.
        door: &'static str,
        /// `routing` or `content`.
        part: &'static str,
    },
    /// A field that names something is empty.
    #[error("act {id}: {field} is empty")]
    Empty {
        /// The act.
        id: String,
        /// The field.
        field: &'static str,
    },
    /// The approval window closes before it opens.
    #[error(
        "act {id}: approval window closes at {expires_at}, not after it opened at {created_at}"
    )]
    EmptyWindow {
        /// The act.
        id: String,
        /// When it was queued.
        created_at: i64,
        /// When its window closes.
        expires_at: i64,
    },
}

impl Act {
    /// Checks that routing and content are of the door's kind, that every
    /// name is non-empty, and that the approval window is not empty.
    pub fn check(&self) -> Result<(), ActError> {
        let id = || self.id.clone();
        let routing_fits = matches!(
            (self.door, &self.routing.target),
            (Door::Push, Target::Push { .. })
                | (Door::PullRequest, Target::PullRequest { .. })
                | (Door::Notify | Door::Ask, Target::Message { .. })
        );
        if !routing_fits {
            return Err(ActError::DoorMismatch {
                id: id(),
                door: self.door.name(),
                part: "routing",
            });
        }
        let content_fits = matches!(
            (self.door, &self.content),
            (Door::Push, Content::Commit { .. })
                | (Door::PullRequest, Content::PullRequest { .. })
                | (Door::Notify | Door::Ask, Content::Message { .. })
        );
        if !content_fits {
            return Err(ActError::DoorMismatch {
                id: id(),
                door: self.door.name(),
                part: "content",
            });
        }
        let mut names: Vec<(&'static str, &str)> = vec![
            ("id", &self.id),
            ("run", &self.run),
            ("actor", &self.actor),
            ("routing.destination", &self.routing.destination),
            ("policy_generation", &self.policy_generation),
        ];
        match &self.routing.target {
            Target::Push {
                target_ref,
                expected_old,
            } => {
                names.push(("routing.target_ref", target_ref));
                if let Some(old) = expected_old {
                    names.push(("routing.expected_old", old));
                }
            }
            Target::PullRequest { base_ref, head_ref } => {
                names.push(("routing.base_ref", base_ref));
                names.push(("routing.head_ref", head_ref));
            }
            Target::Message { endpoint } => names.push(("routing.endpoint", endpoint)),
        }
        match &self.content {
            Content::Commit { commit } => names.push(("content.commit", commit)),
            Content::PullRequest {
                head_commit,
                text_digest,
            } => {
                names.push(("content.head_commit", head_commit));
                names.push(("content.text_digest", text_digest));
            }
            Content::Message { body_digest, .. } => {
                names.push(("content.body_digest", body_digest))
            }
        }
        if let Some((field, _)) = names.iter().find(|(_, v)| v.is_empty()) {
            return Err(ActError::Empty { id: id(), field });
        }
        if self.deciding_rules.iter().any(String::is_empty) {
            return Err(ActError::Empty {
                id: id(),
                field: "deciding_rules",
            });
        }
        if self.expires_at <= self.created_at {
            return Err(ActError::EmptyWindow {
                id: id(),
                created_at: self.created_at,
                expires_at: self.expires_at,
            });
        }
        Ok(())
    }
}

/// Domain tag that starts every encoding; a new encoding gets a new tag.
const DIGEST_DOMAIN: &str = "nightshift/deferred-queue/act/v1";

/// Appends items so that the item sequence can be read back unambiguously:
/// every string is its byte length (u64, big-endian) then its bytes; every
/// option is one tag byte (0 none, 1 some) then the value; numbers are u64
/// big-endian.
struct Encoder(Sha256);

impl Encoder {
    fn str(&mut self, s: &str) {
        self.0.update((s.len() as u64).to_be_bytes());
        self.0.update(s.as_bytes());
    }

    fn u64(&mut self, n: u64) {
        self.0.update(n.to_be_bytes());
    }

    fn opt(&mut self, s: Option<&str>) {
        match s {
            None => self.0.update([0u8]),
            Some(s) => {
                self.0.update([1u8]);
                self.str(s);
            }
        }
    }
}

/// The act's digest: lowercase hex SHA-256 of its canonical encoding.
///
/// The encoding is this sequence of items, each written as described on
/// `Encoder` (strings length-prefixed, options tagged, numbers fixed-width),
/// so that no two different sequences share bytes:
///
/// 1. the domain tag `nightshift/deferred-queue/act/v1`;
/// 2. `run`, `actor`, the door's name ([`Door::name`]);
/// 3. `routing.destination`, then the target's kind (`push`,
///    `pull_request`, `message`) and its fields in declaration order:
///    push: `target_ref`, `expected_old` (option); pull request:
///    `base_ref`, `head_ref`; message: `endpoint`;
/// 4. the content's kind (`commit`, `pull_request`, `message`) and its
///    fields in declaration order: commit: `commit`; pull request:
///    `head_commit`, `text_digest`; message: `body_digest`, `size` (u64);
/// 5. `policy_generation`;
/// 6. the deciding rules sorted by bytes and deduplicated: their count
///    (u64), then each id.
///
/// Kinds are written as strings although the door already implies them, so
/// that an act whose parts disagree still has a well-defined digest (and
/// [`Act::check`] refuses it before it can be approved).
pub fn act_digest(act: &Act) -> String {
    let mut e = Encoder(Sha256::new());
    e.str(DIGEST_DOMAIN);
    e.str(&act.run);
    e.str(&act.actor);
    e.str(act.door.name());
    e.str(&act.routing.destination);
    match &act.routing.target {
        Target::Push {
            target_ref,
            expected_old,
        } => {
            e.str("push");
            e.str(target_ref);
            e.opt(expected_old.as_deref());
        }
        Target::PullRequest { base_ref, head_ref } => {
            e.str("pull_request");
            e.str(base_ref);
            e.str(head_ref);
        }
        Target::Message { endpoint } => {
            e.str("message");
            e.str(endpoint);
        }
    }
    match &act.content {
        Content::Commit { commit } => {
            e.str("commit");
            e.str(commit);
        }
        Content::PullRequest {
            head_commit,
            text_digest,
        } => {
            e.str("pull_request");
            e.str(head_commit);
            e.str(text_digest);
        }
        Content::Message { body_digest, size } => {
            e.str("message");
            e.str(body_digest);
            e.u64(*size);
        }
    }
    e.str(&act.policy_generation);
    let mut rules: Vec<&str> = act.deciding_rules.iter().map(String::as_str).collect();
    rules.sort_unstable();
    rules.dedup();
    e.u64(rules.len() as u64);
    for rule in rules {
        e.str(rule);
    }
    hex::encode(e.0.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push() -> Act {
        Act {
            id: "act-1".into(),
            run: "run-1".into(),
            actor: "agent-a".into(),
            door: Door::Push,
            routing: Routing {
                destination: "origin".into(),
                target: Target::Push {
                    target_ref: "refs/heads/agent/x".into(),
                    expected_old: Some("1111".into()),
                },
            },
            content: Content::Commit {
                commit: "abc123".into(),
            },
            policy_generation: "3:00ff".into(),
            deciding_rules: vec!["ask-push".into(), "agent-branches".into()],
            created_at: 100,
            expires_at: 200,
        }
    }

    fn pr() -> Act {
        Act {
            door: Door::PullRequest,
            routing: Routing {
                destination: "forge".into(),
                target: Target::PullRequest {
                    base_ref: "main".into(),
                    head_ref: "agent/x".into(),
                },
            },
            content: Content::PullRequest {
                head_commit: "abc123".into(),
                text_digest: "d1".into(),
            },
            ..push()
        }
    }

    fn notify() -> Act {
        Act {
            door: Door::Notify,
            routing: Routing {
                destination: "chat".into(),
                target: Target::Message {
                    endpoint: "team-room".into(),
                },
            },
            content: Content::Message {
                body_digest: "b1".into(),
                size: 42,
            },
            ..push()
        }
    }

    /// Asserts that `change` moves the digest of `base`.
    fn moves(base: &Act, what: &str, change: impl FnOnce(&mut Act)) {
        let mut changed = base.clone();
        change(&mut changed);
        assert_ne!(changed, *base, "{what}: the change must change the act");
        assert_ne!(
            act_digest(&changed),
            act_digest(base),
            "{what} is not bound"
        );
    }

    #[test]
    fn digest_is_lowercase_hex_sha256_and_stable() {
        let d = act_digest(&push());
        assert_eq!(d.len(), 64);
        assert!(d
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_eq!(d, act_digest(&push()));
    }

    #[test]
    fn every_bound_field_of_a_push_moves_the_digest() {
        let a = push();
        moves(&a, "run", |a| a.run.push('x'));
        moves(&a, "actor", |a| a.actor.push('x'));
        moves(&a, "door", |a| a.door = Door::PullRequest);
        moves(&a, "destination", |a| a.routing.destination.push('x'));
        moves(&a, "target_ref", |a| {
            a.routing.target = Target::Push {
                target_ref: "refs/heads/main".into(),
                expected_old: Some("1111".into()),
            }
        });
        moves(&a, "expected_old value", |a| {
            a.routing.target = Target::Push {
                target_ref: "refs/heads/agent/x".into(),
                expected_old: Some("2222".into()),
            }
        });
        moves(&a, "expected_old presence", |a| {
            a.routing.target = Target::Push {
                target_ref: "refs/heads/agent/x".into(),
                expected_old: None,
            }
        });
        moves(&a, "commit", |a| {
            a.content = Content::Commit {
                commit: "abc124".into(),
            }
        });
        moves(&a, "policy_generation", |a| {
            a.policy_generation = "4:00ff".into()
        });
        moves(&a, "a deciding rule added", |a| {
            a.deciding_rules.push("r3".into())
        });
        moves(&a, "a deciding rule removed", |a| {
            a.deciding_rules.pop();
        });
        moves(&a, "a deciding rule renamed", |a| {
            a.deciding_rules[0] = "other".into()
        });
    }

    #[test]
    fn every_bound_field_of_a_pull_request_moves_the_digest() {
        let a = pr();
        let target = |base: &str, head: &str| Target::PullRequest {
            base_ref: base.into(),
            head_ref: head.into(),
        };
        moves(&a, "base_ref", |a| {
            a.routing.target = target("dev", "agent/x")
        });
        moves(&a, "head_ref", |a| {
            a.routing.target = target("main", "agent/y")
        });
        let content = |c: &str, t: &str| Content::PullRequest {
            head_commit: c.into(),
            text_digest: t.into(),
        };
        moves(&a, "head_commit", |a| a.content = content("abc124", "d1"));
        moves(&a, "text_digest", |a| a.content = content("abc123", "d2"));
    }

    #[test]
    fn every_bound_field_of_a_message_moves_the_digest() {
        let a = notify();
        moves(&a, "endpoint", |a| {
            a.routing.target = Target::Message {
                endpoint: "other-room".into(),
            }
        });
        moves(&a, "body_digest", |a| {
            a.content = Content::Message {
                body_digest: "b2".into(),
                size: 42,
            }
        });
        moves(&a, "size", |a| {
            a.content = Content::Message {
                body_digest: "b1".into(),
                size: 43,
            }
        });
        moves(&a, "notify vs ask", |a| a.door = Door::Ask);
    }

    #[test]
    fn unbound_fields_and_rule_order_leave_the_digest_alone() {
        let a = push();
        let mut b = a.clone();
        b.id = "act-2".into();
        b.created_at = 1;
        b.expires_at = 9_999;
        b.deciding_rules.reverse();
        b.deciding_rules.push("ask-push".into());
        assert_eq!(act_digest(&a), act_digest(&b));
    }

    #[test]
    fn shifting_bytes_between_adjacent_fields_moves_the_digest() {
        // Without length prefixes these two would encode the same bytes.
        let mut a = push();
        a.run = "ab".into();
        a.actor = "c".into();
        let mut b = push();
        b.run = "a".into();
        b.actor = "bc".into();
        assert_ne!(act_digest(&a), act_digest(&b));
        let mut c = push();
        c.deciding_rules = vec!["ab".into()];
        let mut d = push();
        d.deciding_rules = vec!["a".into(), "b".into()];
        assert_ne!(act_digest(&c), act_digest(&d));
    }

    #[test]
    fn check_accepts_each_well_formed_door() {
        for act in [
            push(),
            pr(),
            notify(),
            Act {
                door: Door::Ask,
                ..notify()
            },
        ] {
            assert_eq!(act.check(), Ok(()), "{:?}", act.door);
        }
    }

    #[test]
    fn check_refuses_parts_of_another_door() {
        let mut a = push();
        a.routing = notify().routing;
        assert!(matches!(
            a.check(),
            Err(ActError::DoorMismatch {
                part: "routing",
                ..
            })
        ));
        let mut b = push();
        b.content = pr().content;
        assert!(matches!(
            b.check(),
            Err(ActError::DoorMismatch {
                part: "content",
                ..
            })
        ));
    }

    #[test]
    fn check_refuses_empty_names_and_empty_windows() {
        let mut a = push();
        a.routing.destination.clear();
        assert_eq!(
            a.check(),
            Err(ActError::Empty {
                id: "act-1".into(),
                field: "routing.destination"
            })
        );
        let mut b = pr();
        b.content = Content::PullRequest {
            head_commit: "abc".into(),
            text_digest: String::new(),
        };
        assert!(matches!(
            b.check(),
            Err(ActError::Empty {
                field: "content.text_digest",
                ..
            })
        ));
        let mut c = push();
        c.deciding_rules.push(String::new());
        assert!(matches!(
            c.check(),
            Err(ActError::Empty {
                field: "deciding_rules",
                ..
            })
        ));
        let mut d = push();
        d.expires_at = d.created_at;
        assert!(matches!(d.check(), Err(ActError::EmptyWindow { .. })));
    }

    #[test]
    fn acts_round_trip_through_json_and_refuse_unknown_fields() {
        for act in [push(), pr(), notify()] {
            let text = serde_json::to_string(&act).unwrap();
            let back: Act = serde_json::from_str(&text).unwrap();
            assert_eq!(back, act);
        }
        let mut v = serde_json::to_value(push()).unwrap();
        v["extra"] = serde_json::json!(1);
        assert!(serde_json::from_value::<Act>(v).is_err());
    }
}
