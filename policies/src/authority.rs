//! Who may make a rule: pure classification into tier 1 or "needs the owner".
//!
//! Invariants: tier 1 only ever tightens and only binds the declaring agent
//! itself: a tier-1 declaration is a refuse or ask, whose subject is exactly
//! the agent's own actor name (not `*`, not a glob), and not locked; an
//! actor that is itself a glob (`--actor '*'`, `run-*`) names no one agent,
//! so nothing it declares or retires is tier 1 (its subject would bind every
//! actor the glob matches); a
//! tier-1 retirement removes only an unlocked *allow* that binds only that
//! agent. Everything else loosens or reaches another party (an allow, the
//! retirement of any refuse or ask, even the agent's own, an unlock, a rule
//! on another actor, a lock) and is a proposal the owner must ratify
//! (`tests::agents_may_tighten_on_themselves`,
//! `tests::a_glob_actor_is_no_one_agent_and_never_tier1`,
//! `tests::retirement_is_tier1_only_for_an_own_unlocked_allow`,
//! `tests::anything_else_needs_the_owner_and_says_so`,
//! `tests/properties.rs::an_agent_cannot_declare_what_loosens`).

use std::fmt;

use crate::glob::is_glob;
use crate::rule::{Effect, Rule, RuleId};

/// Is `actor` one agent's name (not empty, not a glob)? Only such an actor
/// can bind "only itself".
fn names_one_agent(actor: &str) -> bool {
    !actor.is_empty() && !is_glob(actor)
}

/// Proof that an act is tier 1: the agent may do it on its own say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tier1 {
    /// The rule declared or retired.
    pub rule: RuleId,
}

/// Why an act goes beyond tier 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loosening {
    /// Declaring an allow rule.
    Allow,
    /// A rule whose subject is not exactly the agent itself.
    OtherSubject {
        /// The subject as written.
        subject: String,
    },
    /// Declaring a locked rule.
    Lock,
    /// Retiring a refuse or ask rule.
    RetireRestriction {
        /// The effect of the rule being retired.
        effect: Effect,
    },
    /// Retiring a locked rule.
    RetireLocked,
    /// Unlocking a rule.
    Unlock,
}

impl fmt::Display for Loosening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loosening::Allow => f.write_str("an allow rule loosens the policy"),
            Loosening::OtherSubject { subject } => write!(
                f,
                "its subject {subject:?} binds more than the declaring agent"
            ),
            Loosening::Lock => f.write_str("locking a rule is the owner's ruling"),
            Loosening::RetireRestriction { effect } => {
                write!(f, "retiring a {effect} rule loosens the policy")
            }
            Loosening::RetireLocked => f.write_str("the rule is locked"),
            Loosening::Unlock => f.write_str("unlocking a rule is the owner's ruling"),
        }
    }
}

/// The act is tier 2: it needs the owner's ratification.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{act} rule {rule} as {actor:?}: {why}; this needs the owner: use `nightshift policy propose`"
)]
pub struct NeedsOwner {
    /// `declaring`, `retiring`, `unlocking`.
    pub act: &'static str,
    /// The rule concerned.
    pub rule: RuleId,
    /// The agent that tried.
    pub actor: String,
    /// What makes it tier 2.
    pub why: Loosening,
}

/// May agent `actor` declare `rule` on its own say?
pub fn classify_declaration(actor: &str, rule: &Rule) -> Result<Tier1, NeedsOwner> {
    let refuse = |why| NeedsOwner {
        act: "declaring",
        rule: rule.id().clone(),
        actor: actor.to_owned(),
        why,
    };
    if rule.effect() == Effect::Allow {
        return Err(refuse(Loosening::Allow));
    }
    if rule.subject() != actor || !names_one_agent(actor) {
        return Err(refuse(Loosening::OtherSubject {
            subject: rule.subject().to_owned(),
        }));
    }
    if rule.locked() {
        return Err(refuse(Loosening::Lock));
    }
    Ok(Tier1 {
        rule: rule.id().clone(),
    })
}

/// May agent `actor` retire `target` (with its current lock state) on its
/// own say?
pub fn classify_retirement(actor: &str, target: &Rule, locked: bool) -> Result<Tier1, NeedsOwner> {
    let refuse = |why| NeedsOwner {
        act: "retiring",
        rule: target.id().clone(),
        actor: actor.to_owned(),
        why,
    };
    if target.effect() != Effect::Allow {
        return Err(refuse(Loosening::RetireRestriction {
            effect: target.effect(),
        }));
    }
    if locked {
        return Err(refuse(Loosening::RetireLocked));
    }
    if target.subject() != actor || !names_one_agent(actor) {
        return Err(refuse(Loosening::OtherSubject {
            subject: target.subject().to_owned(),
        }));
    }
    Ok(Tier1 {
        rule: target.id().clone(),
    })
}

/// An agent may never unlock on its own say.
pub fn classify_unlock(actor: &str, target: &Rule) -> Result<Tier1, NeedsOwner> {
    Err(NeedsOwner {
        act: "unlocking",
        rule: target.id().clone(),
        actor: actor.to_owned(),
        why: Loosening::Unlock,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::RuleSpec;

    fn rule(subject: &str, effect: Effect, locked: bool) -> Rule {
        Rule::compile(RuleSpec {
            id: "r".into(),
            subject: subject.into(),
            scope: None,
            doors: vec!["push".into()],
            tools: Vec::new(),
            effect,
            reason: "because".into(),
            authority: "a".into(),
            locked,
            since: None,
            until: None,
            clauses: vec![],
        })
        .unwrap()
    }

    #[test]
    fn agents_may_tighten_on_themselves() {
        for effect in [Effect::Refuse, Effect::Ask] {
            assert!(classify_declaration("a1", &rule("a1", effect, false)).is_ok());
        }
    }

    #[test]
    fn anything_else_needs_the_owner_and_says_so() {
        let cases = [
            (rule("a1", Effect::Allow, false), "allow"),
            (rule("*", Effect::Refuse, false), "binds more"),
            (rule("a*", Effect::Refuse, false), "binds more"),
            (rule("a2", Effect::Ask, false), "binds more"),
            (rule("a1", Effect::Refuse, true), "locking"),
        ];
        for (r, why) in cases {
            let e = classify_declaration("a1", &r).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(why), "{msg}");
            assert!(
                msg.contains("needs the owner: use `nightshift policy propose`"),
                "{msg}"
            );
        }
    }

    #[test]
    fn retirement_is_tier1_only_for_an_own_unlocked_allow() {
        assert!(classify_retirement("a1", &rule("a1", Effect::Allow, false), false).is_ok());
        assert!(classify_retirement("a1", &rule("a1", Effect::Allow, false), true).is_err());
        assert!(classify_retirement("a1", &rule("*", Effect::Allow, false), false).is_err());
        for effect in [Effect::Refuse, Effect::Ask] {
            let e = classify_retirement("a1", &rule("a1", effect, false), false).unwrap_err();
            assert!(matches!(e.why, Loosening::RetireRestriction { .. }));
        }
        assert!(classify_unlock("a1", &rule("a1", Effect::Refuse, true)).is_err());
    }

    #[test]
    fn a_glob_actor_is_no_one_agent_and_never_tier1() {
        for actor in ["*", "run-*", "*-a", "a*b"] {
            for effect in [Effect::Refuse, Effect::Ask] {
                let e = classify_declaration(actor, &rule(actor, effect, false)).unwrap_err();
                assert!(matches!(e.why, Loosening::OtherSubject { .. }), "{e}");
                assert!(e
                    .to_string()
                    .contains("binds more than the declaring agent"));
            }
            let e =
                classify_retirement(actor, &rule(actor, Effect::Allow, false), false).unwrap_err();
            assert!(matches!(e.why, Loosening::OtherSubject { .. }), "{e}");
        }
    }
}
