//! The decision: which verdict a request gets under a rule set.
//!
//! Invariants (the precedence law, each checked by property tests):
//! - the most restrictive applicable rule wins, `refuse > ask > allow`;
//!   specificity only chooses which rule of that verdict is *named*
//!   (`tests/properties.rs::refuse_beats_everything`,
//!   `tests/properties.rs::specificity_only_chooses_the_name`);
//! - no applicable rule means allow;
//! - a rule that needs a name the request lacks (a specific subject and no
//!   actor; a scope and no scope) *stands aside*: it is listed in
//!   `stood_aside`, and a standing-aside refuse counts as ask, never as
//!   nothing. A field missing from the args is not a missing name: the args
//!   are all there is, so the clause just fails (`matches`) or holds
//!   (`not_matches`), see [`crate::rule::Clause::holds`]
//!   (`tests/properties.rs::standing_aside_is_counted_and_a_refuse_escalates_to_ask`,
//!   `rule::tests::absent_field_fails_matches_and_holds_not_matches`);
//! - a freeze refuses everything and names itself;
//! - the decision is a function of the *set* of rules: order and duplicates
//!   do not change it (ties are broken by rule id, lists are sorted);
//! - nothing here reads a clock: `since`/`until` are compared with the
//!   timestamp passed in.

use std::cmp::Ordering;
use std::fmt;

use serde::Serialize;

use crate::glob::{glob_matches, is_glob};
use crate::request::{Request, RequestDigest};
use crate::rule::{Effect, Rule, RuleId};
use crate::ruleset::{Freeze, Generation, RuleSet};
use crate::timestamp::Timestamp;

/// The answer: `Allow < Ask < Refuse`, as for [`Effect`].
pub type Verdict = Effect;

/// Reserved name for the freeze in places that expect a rule id.
pub const FREEZE_ID: &str = "nightshift:freeze";

/// What decided: a rule, the freeze, or nothing (default allow).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decider {
    /// No rule applied: allow.
    NoRule,
    /// This rule is named.
    Rule(RuleId),
    /// A freeze is in force.
    Freeze,
}

impl fmt::Display for Decider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decider::NoRule => f.write_str("no rule"),
            Decider::Rule(id) => write!(f, "{id}"),
            Decider::Freeze => f.write_str(FREEZE_ID),
        }
    }
}

/// A name the request lacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Missing {
    /// The rule's subject names an actor; the request has none.
    Actor,
    /// The rule has a scope; the request has none.
    Scope,
}

/// A rule that would have applied but for a missing name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoodAside {
    /// The rule.
    pub rule: RuleId,
    /// Its effect (a refuse here made the decision at least ask).
    pub effect: Effect,
    /// What the request lacked, sorted.
    pub missing: Vec<Missing>,
}

/// The outcome of [`evaluate`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    /// allow | ask | refuse.
    pub verdict: Verdict,
    /// Who decided.
    pub rule: Decider,
    /// The sentence shown to the caller.
    pub reason: String,
    /// The named rule is a refuse that stood aside and was turned into ask.
    pub escalated: bool,
    /// Rules that stood aside, sorted by id.
    pub stood_aside: Vec<StoodAside>,
    /// The rule set's generation the decision was made under.
    pub generation: Generation,
    /// The request's digest, for the audit in place of its arguments.
    pub digest: RequestDigest,
}

/// How a rule relates to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applies {
    /// The rule does not concern this request.
    No,
    /// The rule applies, with this specificity.
    Yes(Specificity),
    /// The rule would apply but the request lacks these names.
    StandsAside(Vec<Missing>, Specificity),
}

/// How narrowly a rule fits a request; only used to choose which rule of
/// the winning verdict is named. Compared field by field, in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Specificity {
    /// 2 exact actor, 1 actor glob, 0 `*`.
    pub subject: u8,
    /// Number of match clauses.
    pub clauses: usize,
    /// Length of the scope prefix (0 when none).
    pub scope: usize,
    /// The best matching door is exact (not a glob).
    pub door_exact: bool,
    /// Literal characters in the best matching door.
    pub door_literal: usize,
}

/// Lexically normalises a path: collapses `//` and `.`, resolves `..`,
/// so `/repo/x/../etc` is seen as `/etc` and cannot slip out of a scope.
pub fn normalize_path(path: &str) -> String {
    let absolute = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|p| *p != "..") {
                    parts.pop();
                } else if !absolute {
                    parts.push("..");
                }
            }
            s => parts.push(s),
        }
    }
    let joined = parts.join("/");
    if absolute {
        format!("/{joined}")
    } else {
        joined
    }
}

/// Is `path` the same as `prefix` or below it (whole components only)?
pub fn scope_covers(prefix: &str, path: &str) -> bool {
    let prefix = normalize_path(prefix);
    let path = normalize_path(path);
    if prefix == "/" {
        return path.starts_with('/');
    }
    path == prefix
        || path
            .strip_prefix(prefix.as_str())
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Decides how `rule` relates to `request` (ignoring time).
pub fn applies(rule: &Rule, request: &Request) -> Applies {
    let Some((door_exact, door_literal)) = rule
        .doors()
        .iter()
        .chain(rule.tools())
        .filter(|d| glob_matches(d, &request.door))
        .map(|d| (!is_glob(d), d.chars().filter(|c| *c != '*').count()))
        .max()
    else {
        return Applies::No;
    };
    if !rule.clauses().iter().all(|c| c.holds(&request.args)) {
        return Applies::No;
    }
    let mut scope_missing = false;
    if let Some(prefix) = rule.scope() {
        match &request.scope {
            None => scope_missing = true,
            Some(path) if !scope_covers(prefix, path) => return Applies::No,
            Some(_) => {}
        }
    }
    let subject = rule.subject();
    let mut actor_missing = false;
    if subject != "*" {
        match &request.actor {
            None => actor_missing = true,
            Some(actor) if !glob_matches(subject, actor) => return Applies::No,
            Some(_) => {}
        }
    }
    let missing: Vec<Missing> = [
        (actor_missing, Missing::Actor),
        (scope_missing, Missing::Scope),
    ]
    .into_iter()
    .filter_map(|(m, what)| m.then_some(what))
    .collect();
    let spec = Specificity {
        subject: match subject {
            "*" => 0,
            s if is_glob(s) => 1,
            _ => 2,
        },
        clauses: rule.clauses().len(),
        scope: rule.scope().map_or(0, |s| normalize_path(s).len()),
        door_exact,
        door_literal,
    };
    if missing.is_empty() {
        Applies::Yes(spec)
    } else {
        Applies::StandsAside(missing, spec)
    }
}

/// A rule's claim on the decision.
struct Claim<'a> {
    verdict: Verdict,
    escalated: bool,
    spec: Specificity,
    rule: &'a Rule,
}

impl Claim<'_> {
    /// Higher wins: verdict, then a rule that applied outright over an
    /// escalated one, then specificity, then the smaller id (so the answer
    /// does not depend on the order rules arrive in).
    fn rank(&self, other: &Self) -> Ordering {
        self.verdict
            .cmp(&other.verdict)
            .then(other.escalated.cmp(&self.escalated))
            .then(self.spec.cmp(&other.spec))
            .then(other.rule.id().cmp(self.rule.id()))
            .then(other.rule.reason().cmp(self.rule.reason()))
    }
}

/// Evaluates a request against a rule set's active rules at `clock`.
pub fn evaluate(rules: &RuleSet, request: &Request, clock: Timestamp) -> Decision {
    evaluate_rules(
        rules.active(clock),
        rules.freeze(),
        rules.generation(),
        request,
        clock,
    )
}

/// Evaluates a request against any collection of rules. Rules not in force
/// at `clock` are skipped here, so callers may pass every rule they hold.
pub fn evaluate_rules<'a, I>(
    rules: I,
    freeze: Option<&Freeze>,
    generation: Generation,
    request: &Request,
    clock: Timestamp,
) -> Decision
where
    I: IntoIterator<Item = &'a Rule>,
{
    let digest = request.digest();
    if let Some(freeze) = freeze {
        return Decision {
            verdict: Effect::Refuse,
            rule: Decider::Freeze,
            reason: format!("everything is frozen: {}", freeze.reason),
            escalated: false,
            stood_aside: Vec::new(),
            generation,
            digest,
        };
    }
    let mut best: Option<Claim<'_>> = None;
    let mut stood_aside = Vec::new();
    for rule in rules {
        if !rule.in_force(clock) {
            continue;
        }
        let claim = match applies(rule, request) {
            Applies::No => continue,
            Applies::Yes(spec) => Claim {
                verdict: rule.effect(),
                escalated: false,
                spec,
                rule,
            },
            Applies::StandsAside(missing, spec) => {
                stood_aside.push(StoodAside {
                    rule: rule.id().clone(),
                    effect: rule.effect(),
                    missing,
                });
                if rule.effect() != Effect::Refuse {
                    continue;
                }
                Claim {
                    verdict: Effect::Ask,
                    escalated: true,
                    spec,
                    rule,
                }
            }
        };
        if best
            .as_ref()
            .is_none_or(|b| claim.rank(b) == Ordering::Greater)
        {
            best = Some(claim);
        }
    }
    stood_aside.sort_by(|a, b| a.rule.cmp(&b.rule).then(a.missing.cmp(&b.missing)));
    stood_aside.dedup();
    let (verdict, rule, reason, escalated) = match best {
        None => (
            Effect::Allow,
            Decider::NoRule,
            "no rule applies".to_owned(),
            false,
        ),
        Some(c) if c.escalated => (
            Effect::Ask,
            Decider::Rule(c.rule.id().clone()),
            format!(
                "{} (rule {} refuses this but cannot tell who or where from the request, so a person decides)",
                c.rule.reason(),
                c.rule.id()
            ),
            true,
        ),
        Some(c) => (
            c.verdict,
            Decider::Rule(c.rule.id().clone()),
            c.rule.reason().to_owned(),
            false,
        ),
    };
    Decision {
        verdict,
        rule,
        reason,
        escalated,
        stood_aside,
        generation,
        digest,
    }
}
