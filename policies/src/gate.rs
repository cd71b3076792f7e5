//! The label gate for acts leaving a sandbox: routing and content.
//!
//! Invariants, checked in this order (the first that fails decides):
//! 1. routing is an alias, never a raw destination: text with `://`, an
//!    `@host:` (scp-style remotes), a leading `/`, `.` or `~`, or a `\` is
//!    refused by name, because an agent that can name a raw destination can
//!    send anything anywhere (`tests::raw_urls_and_paths_are_refused_by_name`);
//! 2. routing is trusted (an untrusted alias choice is refused);
//! 3. the alias is one the owner configured;
//! 4. private content goes only to a destination whose readers are private
//!    (`tests::private_content_only_to_private_readers`);
//! 5. untrusted content never goes out without a person: ask, at least
//!    (`tests::untrusted_content_needs_a_person_everywhere`).
//!
//! Otherwise the gate allows; the policy rules still apply beside it, and
//! the stricter of the two answers stands.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::evaluate::Verdict;
use crate::labels::{Label, Labelled};

/// Who can read what lands at a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Readers {
    /// Anyone (a public repository, a public channel).
    Public,
    /// Only people allowed to read private content.
    Private,
}

/// An owner-configured destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Destination {
    /// Who reads it.
    pub readers: Readers,
}

/// The owner's destination aliases.
pub type Destinations = BTreeMap<String, Destination>;

/// Why the gate answered as it did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GateReason {
    /// The routing is a URL or remote address, not an alias.
    RawUrl {
        /// What was given.
        given: String,
    },
    /// The routing is a filesystem path, not an alias.
    RawPath {
        /// What was given.
        given: String,
    },
    /// The routing was chosen under untrusted influence.
    UntrustedRouting {
        /// Its label.
        label: Label,
    },
    /// The alias is not configured.
    UnknownAlias {
        /// What was given.
        alias: String,
    },
    /// Private content to a destination with public readers.
    PrivateToPublic {
        /// The destination.
        alias: String,
    },
    /// Untrusted content goes out only with a person's approval.
    UntrustedContent,
    /// Nothing in the labels stands in the way.
    Clear,
}

impl fmt::Display for GateReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GateReason::RawUrl { given } => write!(
                f,
                "routing {given:?} is a raw URL; name a destination alias the owner configured"
            ),
            GateReason::RawPath { given } => write!(
                f,
                "routing {given:?} is a raw path; name a destination alias the owner configured"
            ),
            GateReason::UntrustedRouting { label } => {
                write!(f, "routing must be trusted, and this one is {label}")
            }
            GateReason::UnknownAlias { alias } => {
                write!(f, "no destination {alias:?} is configured by the owner")
            }
            GateReason::PrivateToPublic { alias } => write!(
                f,
                "private content may not go to {alias:?}, whose readers are public"
            ),
            GateReason::UntrustedContent => f.write_str(
                "content derived from untrusted input goes out only with a person's approval",
            ),
            GateReason::Clear => f.write_str("labels allow it"),
        }
    }
}

/// The gate's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GateVerdict {
    /// allow | ask | refuse.
    pub verdict: Verdict,
    /// Why.
    pub reason: GateReason,
}

/// If `routing` is a raw destination rather than an alias, says which kind.
pub fn raw_destination(routing: &str) -> Option<GateReason> {
    let given = routing.to_owned();
    let scp_like = routing
        .find('@')
        .is_some_and(|at| routing[at + 1..].contains(':'));
    if routing.contains("://") || scp_like {
        return Some(GateReason::RawUrl { given });
    }
    if routing.starts_with(['/', '.', '~']) || routing.contains('\\') {
        return Some(GateReason::RawPath { given });
    }
    None
}

/// Decides whether `content` may be carried to the destination `routing`
/// names.
pub fn gate(
    destinations: &Destinations,
    routing: &Labelled<String>,
    content: Label,
) -> GateVerdict {
    let refuse = |reason| GateVerdict {
        verdict: Verdict::Refuse,
        reason,
    };
    let alias = routing.value();
    if let Some(reason) = raw_destination(alias) {
        return refuse(reason);
    }
    if !routing.label().is_trusted() {
        return refuse(GateReason::UntrustedRouting {
            label: routing.label(),
        });
    }
    let Some(dest) = destinations.get(alias) else {
        return refuse(GateReason::UnknownAlias {
            alias: alias.clone(),
        });
    };
    if content.is_private() && dest.readers == Readers::Public {
        return refuse(GateReason::PrivateToPublic {
            alias: alias.clone(),
        });
    }
    if !content.is_trusted() {
        return GateVerdict {
            verdict: Verdict::Ask,
            reason: GateReason::UntrustedContent,
        };
    }
    GateVerdict {
        verdict: Verdict::Allow,
        reason: GateReason::Clear,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::{Confidentiality as C, Integrity as I};

    fn dests() -> Destinations {
        BTreeMap::from([
            (
                "origin".to_owned(),
                Destination {
                    readers: Readers::Private,
                },
            ),
            (
                "public-mirror".to_owned(),
                Destination {
                    readers: Readers::Public,
                },
            ),
        ])
    }

    fn trusted(s: &str) -> Labelled<String> {
        Labelled::new(s.to_owned(), Label::BOTTOM)
    }

    #[test]
    fn raw_urls_and_paths_are_refused_by_name() {
        for url in [
            "https://evil.example/x.git",
            "git@github.com:me/repo.git",
            "file:///tmp/x",
        ] {
            let v = gate(&dests(), &trusted(url), Label::BOTTOM);
            assert_eq!(v.verdict, Verdict::Refuse);
            assert!(
                matches!(v.reason, GateReason::RawUrl { .. }),
                "{url}: {v:?}"
            );
        }
        for path in ["/tmp/repo", "./repo", "../x", "~/x", "C:\\x"] {
            let v = gate(&dests(), &trusted(path), Label::BOTTOM);
            assert_eq!(v.verdict, Verdict::Refuse);
            assert!(
                matches!(v.reason, GateReason::RawPath { .. }),
                "{path}: {v:?}"
            );
        }
    }

    #[test]
    fn routing_must_be_trusted() {
        let r = Labelled::new("origin".to_owned(), Label::new(I::Untrusted, C::Public));
        let v = gate(&dests(), &r, Label::BOTTOM);
        assert_eq!(v.verdict, Verdict::Refuse);
        assert!(matches!(v.reason, GateReason::UntrustedRouting { .. }));
        // Tainting a trusted routing value makes it fail too.
        let tainted = trusted("origin").taint(Label::TOP);
        assert_eq!(
            gate(&dests(), &tainted, Label::BOTTOM).verdict,
            Verdict::Refuse
        );
    }

    #[test]
    fn only_configured_aliases() {
        let v = gate(&dests(), &trusted("elsewhere"), Label::BOTTOM);
        assert!(matches!(v.reason, GateReason::UnknownAlias { .. }));
        assert_eq!(v.verdict, Verdict::Refuse);
    }

    #[test]
    fn private_content_only_to_private_readers() {
        let private = Label::new(I::Trusted, C::Private);
        let v = gate(&dests(), &trusted("public-mirror"), private);
        assert_eq!(v.verdict, Verdict::Refuse);
        assert!(matches!(v.reason, GateReason::PrivateToPublic { .. }));
        assert_eq!(
            gate(&dests(), &trusted("origin"), private).verdict,
            Verdict::Allow
        );
    }

    #[test]
    fn untrusted_content_needs_a_person_everywhere() {
        for alias in ["origin", "public-mirror"] {
            let v = gate(
                &dests(),
                &trusted(alias),
                Label::new(I::Untrusted, C::Public),
            );
            assert_eq!(v.verdict, Verdict::Ask, "{alias}");
            assert_eq!(v.reason, GateReason::UntrustedContent);
        }
        // Never better than ask, for any content label that is untrusted.
        for content in Label::ALL.into_iter().filter(|l| !l.is_trusted()) {
            for alias in ["origin", "public-mirror"] {
                assert!(gate(&dests(), &trusted(alias), content).verdict >= Verdict::Ask);
            }
        }
    }

    #[test]
    fn trusted_public_content_to_a_configured_alias_is_allowed() {
        let v = gate(&dests(), &trusted("public-mirror"), Label::BOTTOM);
        assert_eq!(
            v,
            GateVerdict {
                verdict: Verdict::Allow,
                reason: GateReason::Clear
            }
        );
    }
}
