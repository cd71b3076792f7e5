//! Autonomy scopes: from dry runs and the history of a person's decisions,
//! propose the narrowest rule changes that would let a kind of act through
//! without asking; show what each would change; and decide, for the door,
//! whether an act goes through under a scope the owner ratified.
//!
//! Invariants (each checked by the property tests in `tests/scopes.rs`):
//! - [`passage`] is the one place that says whether an act is refused,
//!   asked for, or carried out without a person. The label gate comes first
//!   (a routing the owner has not configured, or content its readers may not
//!   read, is refused whatever the rules say); only an `allow` rule the
//!   owner ratified or declared (an autonomy scope) carries an act out, and
//!   only when the gate's one objection is that the content is untrusted
//!   (`tests::only_an_owners_allow_carries_an_act_and_only_past_an_untrusted_objection`).
//! - Every proposal is a change the engine accepts under its precedence law:
//!   every `ask` that covers the acts to let through is retired (unlocked
//!   first when locked) and declared again as pieces whose clauses exclude
//!   exactly the region allowed (`W ∧ c1..c(i-1) ∧ ¬ci`), so the asks' reach
//!   outside the region is unchanged, and the `allow` is never shadowed by a
//!   wider ask. A `refuse` is never narrowed: a request a refuse covers is
//!   no evidence. A proposal is offered only if, applied to the rule set,
//!   every act of its evidence is carried out under its allow
//!   (`tests/scopes.rs::proposals_never_pass_what_a_person_blocked_or_readers_may_not_read`,
//!   `tests/scopes.rs::adopting_changes_exactly_the_diff`,
//!   `tests/scopes.rs::no_proposal_carries_a_force_push_a_deletion_or_what_a_refuse_covers`).
//! - No proposal lets through an act a person rejected, let expire or found
//!   stale, nor an act whose content its destination's readers may not read,
//!   nor one to a destination the owner has not configured: each proposal is
//!   evaluated against all of them and dropped if any would pass.
//! - The ladder goes from the narrowest rung (the literal destinations and
//!   refs seen) to broader ones (a placeholder where the history varied, a
//!   ref namespace); the narrowest is the default. A rung's delta lists every
//!   act it would let through that the history lacks, from every recorded
//!   request and near variants of its evidence; a pattern rung admits names
//!   beyond any list, so it is never safe. The narrowest rung admits only
//!   routings of its evidence, so its delta is empty by construction
//!   (`tests/scopes.rs::the_narrowest_rung_has_an_empty_delta`).
//! - Proposals are scoped to one repository, name one configured
//!   destination literally, and never match a force push or a deletion
//!   (`tests/scopes.rs::no_proposal_carries_a_force_push_a_deletion_or_what_a_refuse_covers`).
//! - Evidence is content-free: ids, counts, times; never a body, a title, a
//!   commit message
//!   (`tests/scopes.rs::no_proposal_carries_a_force_push_a_deletion_or_what_a_refuse_covers`).
//! - A proposal's id is a digest of the changes it makes, so the same
//!   proposal has the same id on another day (a refused one is not offered
//!   again) and adopting an id adopts exactly what was shown.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::canonical::canonical_json;
use crate::evaluate::{applies, evaluate, Applies, Decider, Decision};
use crate::gate::{gate, Destinations, GateReason, GateVerdict};
use crate::labels::{Label, Labelled};
use crate::request::Request;
use crate::rule::{ClauseSpec, Effect, Rule, RuleId, RuleSpec};
use crate::ruleset::{Author, Change, Origin, Row, RuleSet, Status};
use crate::timestamp::Timestamp;

/// What happens to an act at the door.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Passage {
    /// Carried out without a person, under an autonomy scope.
    Carried,
    /// Queued for a person.
    Asked,
    /// Refused.
    Refused,
}

/// The door's whole answer for one request: the gate, the policy, and what
/// the two make of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judgement {
    /// What happens.
    pub passage: Passage,
    /// The label gate's verdict.
    pub gate: GateVerdict,
    /// The policy's decision (absent when the gate refused first).
    pub decision: Option<Decision>,
    /// The scope that carries the act out, when it is carried.
    pub scope: Option<RuleId>,
}

/// May readers of this kind read content with this label?
pub fn readable(label: Label, readers: crate::gate::Readers) -> bool {
    !(label.is_private() && readers == crate::gate::Readers::Public)
}

/// Is `id` an autonomy scope in `rules`: an active `allow` rule the owner
/// ratified or declared under the owner's credential?
pub fn is_scope(rules: &RuleSet, id: &RuleId) -> bool {
    rules.entries().get(id).is_some_and(|e| {
        e.status == Status::Active
            && e.rule.effect() == Effect::Allow
            && matches!(e.origin, Origin::Ratified(_) | Origin::Owner)
    })
}

/// Decides one request: the gate on its routing and the content's label,
/// then the policy. `readers` is the destination's readership when the
/// owner configured it (`None`: not configured).
pub fn passage(
    rules: &RuleSet,
    request: &Request,
    destination: &str,
    readers: Option<crate::gate::Readers>,
    content: Label,
    clock: Timestamp,
) -> Judgement {
    let mut known = Destinations::new();
    if let Some(readers) = readers {
        known.insert(destination.to_owned(), crate::gate::Destination { readers });
    }
    let routing = Labelled::new(destination.to_owned(), Label::BOTTOM);
    let gate_verdict = gate(&known, &routing, content);
    judge(rules, request, gate_verdict, clock)
}

/// As [`passage`], with the gate's verdict already known (the door computes
/// it from the owner's destination file).
pub fn judge(
    rules: &RuleSet,
    request: &Request,
    gate_verdict: GateVerdict,
    clock: Timestamp,
) -> Judgement {
    if gate_verdict.verdict == Effect::Refuse {
        return Judgement {
            passage: Passage::Refused,
            gate: gate_verdict,
            decision: None,
            scope: None,
        };
    }
    let decision = evaluate(rules, request, clock);
    let gate_only_untrusted = matches!(
        gate_verdict.reason,
        GateReason::Clear | GateReason::UntrustedContent
    );
    let (passage, scope) = match (&decision.verdict, &decision.rule) {
        (Effect::Refuse, _) => (Passage::Refused, None),
        (Effect::Allow, Decider::Rule(id)) if gate_only_untrusted && is_scope(rules, id) => {
            (Passage::Carried, Some(id.clone()))
        }
        _ => (Passage::Asked, None),
    };
    Judgement {
        passage,
        gate: gate_verdict,
        decision: Some(decision),
        scope,
    }
}

/// How a recorded request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A person approved it (whether or not it was then carried out).
    Approved,
    /// A person rejected it.
    Rejected,
    /// Its window or its approval lapsed.
    Expired,
    /// What was approved no longer matched the world.
    Stale,
    /// Still waiting for a person.
    Pending,
    /// Carried out under an autonomy scope.
    Autonomous,
    /// Refused at the door.
    Refused,
    /// A dry run in which a person would have been asked.
    DryAsked,
    /// A dry run in which it would have been carried out under a scope.
    DryCarried,
    /// A dry run in which it would have been refused.
    DryRefused,
}

impl Outcome {
    /// Did a person, or the world, speak against it?
    pub fn is_blocked(self) -> bool {
        matches!(self, Outcome::Rejected | Outcome::Expired | Outcome::Stale)
    }

    /// Is it evidence that this kind of act may go through?
    fn is_support(self) -> bool {
        matches!(
            self,
            Outcome::Approved | Outcome::Autonomous | Outcome::DryAsked | Outcome::DryCarried
        )
    }

    /// Did a person approve it?
    fn person_approved(self) -> bool {
        self == Outcome::Approved
    }

    fn is_dry(self) -> bool {
        matches!(
            self,
            Outcome::DryAsked | Outcome::DryCarried | Outcome::DryRefused
        )
    }
}

/// One recorded request: an act of the queue or of a dry run. Content-free.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The act's id (or the dry-run id).
    pub id: String,
    /// Its run.
    pub run: String,
    /// When it was requested, unix seconds.
    pub at: i64,
    /// The actor the door named (`run-<id>`).
    pub actor: String,
    /// The door.
    pub door: String,
    /// The host repository the run worked on.
    pub repository: String,
    /// The destination alias.
    pub destination: String,
    /// The policy's args, as the door sent them (routing only).
    pub args: serde_json::Value,
    /// The label of the content it carried.
    pub label: Label,
    /// How it ended.
    pub outcome: Outcome,
}

impl Record {
    /// The policy request it made.
    pub fn request(&self) -> Request {
        Request {
            actor: Some(self.actor.clone()),
            door: self.door.clone(),
            args: self.args.clone(),
            scope: Some(self.repository.clone()),
        }
    }

    fn text(&self, field: &str) -> String {
        match self.args.get(field) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => canonical_json(other),
            None => String::new(),
        }
    }

    /// The field the ladder varies: a push's ref, a pull request's head.
    fn target(&self) -> String {
        match self.door.as_str() {
            "push" => self.text("ref"),
            "pull_request" => self.text("head"),
            _ => String::new(),
        }
    }

    /// What a judgement depends on: the routing and the label, and the
    /// actor and commit only when some rule could tell them apart.
    fn judge_key(&self, needs: (bool, bool)) -> String {
        let mut key = String::with_capacity(160);
        for part in [
            self.door.as_str(),
            self.repository.as_str(),
            self.destination.as_str(),
            if needs.0 { self.actor.as_str() } else { "" },
        ] {
            key.push_str(part);
            key.push('\u{1f}');
        }
        key.push_str(match (self.label.integrity, self.label.confidentiality) {
            (crate::Integrity::Trusted, crate::Confidentiality::Public) => "tp",
            (crate::Integrity::Trusted, crate::Confidentiality::Private) => "tq",
            (crate::Integrity::Untrusted, crate::Confidentiality::Public) => "up",
            (crate::Integrity::Untrusted, crate::Confidentiality::Private) => "uq",
        });
        match self.args.as_object() {
            Some(o) => {
                for (k, v) in o {
                    if k == "commit" && !needs.1 {
                        continue;
                    }
                    key.push('\u{1e}');
                    key.push_str(k);
                    key.push('\u{1f}');
                    match v {
                        serde_json::Value::String(t) => {
                            key.push('s');
                            key.push_str(t);
                        }
                        other => key.push_str(&canonical_json(other)),
                    }
                }
            }
            None => key.push_str(&canonical_json(&self.args)),
        }
        key
    }

    /// The routing: everything of the request but the commit.
    fn routing_key(&self) -> String {
        let mut args = self.args.clone();
        if let Some(o) = args.as_object_mut() {
            o.remove("commit");
        }
        canonical_json(&serde_json::json!([self.door, self.repository, args]))
    }
}

/// The field of each door the ladder varies, if any.
fn ladder_field(door: &str) -> Option<&'static str> {
    match door {
        "push" => Some("ref"),
        "pull_request" => Some("head"),
        _ => None,
    }
}

/// Which evidence a proposal rests on: counts, ids and times only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// The runs, sorted.
    pub runs: Vec<String>,
    /// The acts (and dry-run acts), oldest first.
    pub acts: Vec<String>,
    /// How many acts.
    pub count: usize,
    /// How many a person approved.
    pub approved: usize,
    /// How many were dry-run acts.
    pub dry_runs: usize,
    /// How many were carried out under a scope already.
    pub autonomous: usize,
    /// First seen, unix seconds.
    pub first_seen: i64,
    /// Last seen, unix seconds.
    pub last_seen: i64,
    /// How many acts a person rejected, let expire or found stale were
    /// checked against the proposal (none of them would pass).
    pub blocked_checked: usize,
}

/// One act a proposal would let through that the history lacks.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeltaItem {
    /// The door.
    pub door: String,
    /// The repository.
    pub repository: String,
    /// The destination alias.
    pub destination: String,
    /// The ref or endpoint.
    pub target: String,
    /// Where the example came from: `recorded` or `variant`.
    pub source: String,
}

/// A decision on the recorded history that a proposal changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffItem {
    /// The recorded act.
    pub act: String,
    /// Its run.
    pub run: String,
    /// The door.
    pub door: String,
    /// The destination alias.
    pub destination: String,
    /// The ref or endpoint.
    pub target: String,
    /// What happens to it now.
    pub before: Passage,
    /// The rule deciding it now.
    pub before_rule: String,
    /// What would happen under the proposal.
    pub after: Passage,
    /// The rule that would decide it.
    pub after_rule: String,
}

/// A proposed change of the autonomy scope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    /// A digest of the changes (`s` and 12 hex digits).
    pub id: String,
    /// Position on its ladder, 0 = narrowest.
    pub rung: usize,
    /// The narrowest rung of its ladder (the one offered by default).
    pub default: bool,
    /// The ladder it belongs to (the same for every rung).
    pub ladder: String,
    /// The door.
    pub door: String,
    /// The one repository it is scoped to.
    pub repository: String,
    /// The destination alias, configured by the owner.
    pub destination: String,
    /// The pattern the varying field must match (a push's ref, a pull
    /// request's head); absent for doors without one.
    pub pattern: Option<String>,
    /// The literal targets of the evidence.
    pub targets: Vec<String>,
    /// One line for the owner.
    pub summary: String,
    /// What it makes irreversible.
    pub irreversible: String,
    /// The rule changes, in the order they are applied.
    pub changes: Vec<Change>,
    /// The evidence.
    pub evidence: Evidence,
    /// Acts it would let through that the history lacks (examples).
    pub delta: Vec<DeltaItem>,
    /// Its pattern admits names beyond any list (a namespace).
    pub delta_unbounded: bool,
    /// Only when the delta is empty and bounded.
    pub safe: bool,
}

/// Why a group of acts got no proposal, for the owner (content-free).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Declined {
    /// The door.
    pub door: String,
    /// The repository.
    pub repository: String,
    /// The destination.
    pub destination: String,
    /// The namespace or target.
    pub group: String,
    /// Why.
    pub why: String,
}

/// What `propose` returns.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Proposals {
    /// Offered proposals, ladder by ladder, narrowest first.
    pub proposals: Vec<Proposal>,
    /// Groups that were not proposed, and why.
    pub declined: Vec<Declined>,
}

/// What `propose` reads.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// The rule set in force.
    pub rules: &'a RuleSet,
    /// The whole recorded history (all repositories, all outcomes).
    pub records: &'a [Record],
    /// The records proposals may rest on (a subset of `records`, e.g. since
    /// a date, some runs, one repository).
    pub evidence: &'a [Record],
    /// The owner's destinations, with their readers.
    pub destinations: &'a Destinations,
    /// Proposal ids the owner refused (never offered again).
    pub refused: &'a BTreeSet<String>,
    /// The clock.
    pub clock: Timestamp,
}

/// A short hex digest.
fn short_digest(value: &serde_json::Value, n: usize) -> String {
    let h = Sha256::digest(canonical_json(value).as_bytes());
    hex::encode(h)[..n].to_owned()
}

/// `^literal$`.
fn exact(s: &str) -> String {
    format!("^{}$", regex::escape(s))
}

fn matches(field: &str, pattern: String) -> ClauseSpec {
    ClauseSpec {
        field: field.to_owned(),
        matches: Some(pattern),
        not_matches: None,
    }
}

fn negate(c: &ClauseSpec) -> ClauseSpec {
    ClauseSpec {
        field: c.field.clone(),
        matches: c.not_matches.clone(),
        not_matches: c.matches.clone(),
    }
}

/// Is a branch (`refs/heads/x`, no `/` below heads) a protected one: shared
/// history others build on rather than an agent's namespace?
fn namespace_of(target: &str) -> Option<&str> {
    let rest = target.strip_prefix("refs/heads/").unwrap_or(target);
    let (ns, tail) = rest.split_once('/')?;
    (!ns.is_empty() && !tail.is_empty()).then_some(ns)
}

/// The ladder's patterns above the literal rung, for targets of one
/// namespace: a placeholder where the targets varied, then the namespace.
fn broader_patterns(targets: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    if targets.len() < 2 {
        return out;
    }
    let parts: Vec<Vec<&str>> = targets.iter().map(|t| t.split('/').collect()).collect();
    let n = parts[0].len();
    if parts.iter().all(|p| p.len() == n) {
        let pieces: Vec<String> = (0..n)
            .map(|i| {
                let first = parts[0][i];
                if parts.iter().all(|p| p[i] == first) {
                    regex::escape(first)
                } else {
                    "[^/]+".to_owned()
                }
            })
            .collect();
        out.push(format!("^{}$", pieces.join("/")));
    }
    // The longest shared directory, at least `refs/heads/<namespace>/`.
    let mut shared: Vec<&str> = Vec::new();
    for i in 0.. {
        let Some(first) = parts[0].get(i) else { break };
        if parts
            .iter()
            .all(|p| p.len() > i + 1 && p.get(i) == Some(first))
        {
            shared.push(first);
        } else {
            break;
        }
    }
    let heads_and_ns = if targets[0].starts_with("refs/heads/") {
        3
    } else {
        1
    };
    if shared.len() >= heads_and_ns {
        let p = format!("^{}/.+$", regex::escape(&shared.join("/")));
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// What a proposal makes irreversible, in a sentence.
fn irreversible(
    door: &str,
    destination: &str,
    namespace: Option<&str>,
    targets: &[String],
) -> String {
    match (door, namespace) {
        ("push", Some(ns)) => format!(
            "pushes to branches under the {ns}/ namespace of {destination:?} without a person: a deletable branch namespace, but what is pushed is read by {destination:?}'s readers at once"
        ),
        ("push", None) => format!(
            "pushes to the protected branch {} of {destination:?} without a person: history others build on, undone only by rewriting it",
            targets.join(", ")
        ),
        ("pull_request", _) => format!(
            "opens pull requests on {destination:?} without a person: visible to its readers at once, closed but never unsent"
        ),
        _ => format!("sends messages to {destination:?} without a person: a message is never taken back"),
    }
}

/// A rule whose doors and tools are all literal names can be narrowed
/// exactly; a glob could also name things the schema does not list.
fn literal_names(rule: &Rule) -> bool {
    rule.doors()
        .iter()
        .chain(rule.tools())
        .all(|d| !crate::glob::is_glob(d))
}

fn spec_of(rule: &Rule) -> RuleSpec {
    RuleSpec::from(rule.clone())
}

/// The changes that carve `region` (clauses, on `door`) out of every ask
/// in `asks` and allow it.
fn changes_for(
    rules: &RuleSet,
    asks: &[RuleId],
    door: &str,
    region: &[ClauseSpec],
    id: &str,
    summary: &str,
) -> Result<Vec<Change>, String> {
    let mut changes = Vec::new();
    let mut retirements = Vec::new();
    for (w_index, w_id) in asks.iter().enumerate() {
        let Some(entry) = rules.entries().get(w_id) else {
            return Err(format!("rule {w_id} is not in the rule set"));
        };
        let w = &entry.rule;
        if !literal_names(w) {
            return Err(format!(
                "rule {w_id} names its doors with a pattern; narrowing it could change decisions elsewhere"
            ));
        }
        // Retired last: every prefix of the changes is no looser than the
        // whole (the pieces and the allow first, shadowed by the ask until
        // it goes).
        if entry.locked {
            retirements.push(Change::Unlock { rule: w_id.clone() });
        }
        retirements.push(Change::Retire {
            rule: w_id.clone(),
            reason: format!("narrowed by autonomy scope {id}: {summary}"),
        });
        let base = spec_of(w);
        let piece =
            |suffix: String, doors: Vec<String>, tools: Vec<String>, extra: Vec<ClauseSpec>| {
                let mut s = base.clone();
                s.id = format!("{id}-ask{w_index}-{suffix}");
                s.doors = doors;
                s.tools = tools;
                s.clauses.extend(extra);
                s.reason = format!(
                    "{} (narrowed by autonomy scope {id})",
                    base.reason.trim_end_matches('.')
                );
                s.authority = format!("nightshift scopes adopt {id}; was rule {w_id}");
                s.locked = true;
                Rule::compile(s).map_err(|e| e.to_string())
            };
        // Everything the ask covered on other doors and tools stays as it was.
        let other_doors: Vec<String> = w.doors().iter().filter(|d| *d != door).cloned().collect();
        let other_tools: Vec<String> = w.tools().iter().filter(|d| *d != door).cloned().collect();
        if !other_doors.is_empty() || !other_tools.is_empty() {
            changes.push(Change::Declare {
                rule: Box::new(piece("other".into(), other_doors, other_tools, Vec::new())?),
            });
        }
        let on_door = w.doors().iter().any(|d| d == door);
        let as_tool = w.tools().iter().any(|d| d == door);
        // On this door: W ∧ c1..c(i-1) ∧ ¬ci, for each clause ci of the region.
        for i in 0..region.len() {
            let mut extra: Vec<ClauseSpec> = region[..i].to_vec();
            extra.push(negate(&region[i]));
            let (doors, tools) = match (on_door, as_tool) {
                (true, t) => (
                    vec![door.to_owned()],
                    if t { vec![door.to_owned()] } else { vec![] },
                ),
                (false, _) => (vec![], vec![door.to_owned()]),
            };
            changes.push(Change::Declare {
                rule: Box::new(piece(i.to_string(), doors, tools, extra)?),
            });
        }
    }
    let allow = Rule::compile(RuleSpec {
        id: format!("{id}-allow"),
        subject: "*".into(),
        scope: None,
        doors: vec![door.to_owned()],
        tools: Vec::new(),
        effect: Effect::Allow,
        reason: format!("autonomy scope {id}: {summary}"),
        authority: format!("nightshift scopes adopt {id}"),
        locked: true,
        since: None,
        until: None,
        clauses: region.to_vec(),
    })
    .map_err(|e| e.to_string())?;
    changes.push(Change::Declare {
        rule: Box::new(allow),
    });
    changes.extend(retirements);
    Ok(changes)
}

/// The rows that adopt a proposal: each change proposed, then ratified
/// (locked), in order. The owner's credential is the caller's to check.
pub fn adoption_rows(proposal: &Proposal) -> Vec<Row> {
    let mut rows = Vec::new();
    for (k, change) in proposal.changes.iter().enumerate() {
        let name = format!("{}.{k}", proposal.id);
        rows.push(Row::Propose {
            proposal: name.clone(),
            change: change.clone(),
            author: Author::Owner,
        });
        rows.push(Row::Ratify {
            proposal: name,
            authority: format!("owner: nightshift scopes adopt {}", proposal.id),
            lock: true,
        });
    }
    rows
}

/// The rule set as it would be after adopting `proposal`, or why it would
/// not apply.
pub fn adopted(rules: &RuleSet, proposal: &Proposal) -> Result<RuleSet, String> {
    let mut next = rules.clone();
    next.apply_all(adoption_rows(proposal))
        .map_err(|e| e.to_string())?;
    Ok(next)
}

/// Checks a proposal again before it is adopted, on the whole history as
/// it is now: the engine takes its changes, nothing a person rejected, let
/// expire or found stale would pass, no content goes to readers who may not
/// read it, and every act of its evidence still recorded goes through under
/// its allow.
pub fn check(
    rules: &RuleSet,
    proposal: &Proposal,
    records: &[Record],
    destinations: &Destinations,
    clock: Timestamp,
) -> Result<RuleSet, String> {
    let next = adopted(rules, proposal)
        .map_err(|why| format!("the rule set no longer takes it: {why}"))?;
    if !destinations.contains_key(&proposal.destination) {
        return Err(format!(
            "destination {:?} is no longer configured",
            proposal.destination
        ));
    }
    let allow = RuleId(format!("{}-allow", proposal.id));
    let evidence: BTreeSet<&str> = proposal.evidence.acts.iter().map(String::as_str).collect();
    for r in records {
        let j = judge_record(&next, destinations, r, clock);
        if r.outcome.is_blocked() && j.passage == Passage::Carried {
            return Err(format!(
                "it would let through act {}, which was {:?}",
                r.id, r.outcome
            ));
        }
        if j.passage == Passage::Carried
            && !destinations
                .get(&r.destination)
                .is_some_and(|d| readable(r.label, d.readers))
        {
            return Err(format!(
                "it would carry act {}'s content to readers who may not read it",
                r.id
            ));
        }
        if evidence.contains(r.id.as_str())
            && judge_record(rules, destinations, r, clock).passage != Passage::Refused
            && j.scope.as_ref() != Some(&allow)
        {
            return Err(format!(
                "it would not take effect for act {}: another rule still decides it",
                r.id
            ));
        }
    }
    Ok(next)
}

/// Judges a record under `rules`.
fn judge_record(
    rules: &RuleSet,
    destinations: &Destinations,
    record: &Record,
    clock: Timestamp,
) -> Judgement {
    passage(
        rules,
        &record.request(),
        &record.destination,
        destinations.get(&record.destination).map(|d| d.readers),
        record.label,
        clock,
    )
}

fn deciding(j: &Judgement) -> String {
    match &j.decision {
        None => format!("gate: {}", gate_name(&j.gate.reason)),
        Some(d) => d.rule.to_string(),
    }
}

fn gate_name(r: &GateReason) -> &'static str {
    match r {
        GateReason::RawUrl { .. } => "raw_url",
        GateReason::RawPath { .. } => "raw_path",
        GateReason::UntrustedRouting { .. } => "untrusted_routing",
        GateReason::UnknownAlias { .. } => "unknown_alias",
        GateReason::PrivateToPublic { .. } => "private_to_public",
        GateReason::UntrustedContent => "untrusted_content",
        GateReason::Clear => "clear",
    }
}

/// Every recorded decision that adopting `proposal` would change (its
/// passage or its deciding rule), oldest first.
pub fn diff(
    rules: &RuleSet,
    proposal: &Proposal,
    records: &[Record],
    destinations: &Destinations,
    clock: Timestamp,
) -> Result<Vec<DiffItem>, String> {
    let next = adopted(rules, proposal)?;
    Ok(changes(rules, &next, records, destinations, clock))
}

/// Every recorded decision that `after` decides otherwise than `before`
/// (its passage or its deciding rule), oldest first: what a change of the
/// rule set would have changed over the history (a scope's adoption, or a
/// proposed rule's ratification).
pub fn changes(
    before_rules: &RuleSet,
    after_rules: &RuleSet,
    records: &[Record],
    destinations: &Destinations,
    clock: Timestamp,
) -> Vec<DiffItem> {
    let mut out = Vec::new();
    for r in records {
        let before = judge_record(before_rules, destinations, r, clock);
        let after = judge_record(after_rules, destinations, r, clock);
        let (br, ar) = (deciding(&before), deciding(&after));
        if before.passage != after.passage || br != ar {
            out.push(DiffItem {
                act: r.id.clone(),
                run: r.run.clone(),
                door: r.door.clone(),
                destination: r.destination.clone(),
                target: r.target(),
                before: before.passage,
                before_rule: br,
                after: after.passage,
                after_rule: ar,
            });
        }
    }
    out
}

/// Near variants of a record: other names in and beside its namespace, a
/// force push, a deletion, other destinations, another repository, content
/// labelled at the top.
fn variants(r: &Record, destinations: &Destinations) -> Vec<Record> {
    let mut out = Vec::new();
    let with = |field: &str, value: serde_json::Value| {
        let mut v = r.clone();
        if let Some(o) = v.args.as_object_mut() {
            o.insert(field.to_owned(), value);
        }
        v
    };
    if let Some(field) = ladder_field(&r.door) {
        let t = r.target();
        let parent = t.rsplit_once('/').map_or("", |(p, _)| p).to_owned();
        for name in [
            format!("{t}-nightshift-variant"),
            format!("{t}/nightshift-variant"),
            format!("{parent}/nightshift-variant"),
            parent.clone(),
            "refs/heads/main".to_owned(),
            "refs/heads/master".to_owned(),
            format!(
                "refs/heads/nightshift-variant/{}",
                t.rsplit('/').next().unwrap_or("")
            ),
            format!("{t}\n"),
        ] {
            out.push(with(field, serde_json::Value::String(name)));
        }
    }
    if r.door == "push" {
        out.push(with("force", serde_json::Value::Bool(true)));
        out.push(with("delete", serde_json::Value::Bool(true)));
    }
    let dest_field = if r.door == "notify" {
        "destination"
    } else {
        "remote"
    };
    for alias in destinations
        .keys()
        .map(String::as_str)
        .chain(["nightshift-unconfigured"])
    {
        if alias != r.destination {
            let mut v = with(dest_field, serde_json::Value::String(alias.to_owned()));
            v.destination = alias.to_owned();
            out.push(v);
        }
    }
    for repo in [
        format!("{}-nightshift-variant", r.repository),
        format!("{}/sub", r.repository),
    ] {
        let mut v = with("repository", serde_json::Value::String(repo.clone()));
        v.repository = repo;
        out.push(v);
    }
    let mut top = r.clone();
    top.label = Label::TOP;
    out.push(top);
    out
}

/// Proposes autonomy-scope changes from the history. Deterministic.
pub fn propose<'a>(input: Input<'a>) -> Proposals {
    let mut out = Proposals::default();
    // Groups: door, repository, destination, and the namespace (or, for a
    // protected branch or a door without a ladder, the target itself).
    #[allow(clippy::type_complexity)]
    let mut groups: BTreeMap<(&str, &str, &str, String, bool), Vec<&Record>> = BTreeMap::new();
    for r in input.evidence {
        if !r.outcome.is_support() || r.door == "ask" {
            continue;
        }
        let target = r.target();
        let (group, ns) = match namespace_of(&target) {
            Some(ns) if ladder_field(&r.door).is_some() => (ns.to_owned(), true),
            _ => (target, false),
        };
        groups
            .entry((&r.door, &r.repository, &r.destination, group, ns))
            .or_default()
            .push(r);
    }
    // Blocked acts, by door and repository: none may pass.
    // Requests that judge alike are judged once: the same routing and label
    // (and actor and commit, when a rule names an actor or a commit).
    let needs = (
        input
            .rules
            .entries()
            .values()
            .any(|e| e.rule.subject() != "*"),
        input.rules.entries().values().any(|e| {
            e.rule
                .clauses()
                .iter()
                .any(|c| c.path().first().is_some_and(|f| f == "commit"))
        }),
    );
    let dedupe = |records: &mut dyn Iterator<Item = &'a Record>| -> Vec<&'a Record> {
        let mut seen: BTreeMap<String, &Record> = BTreeMap::new();
        for r in records {
            seen.entry(r.judge_key(needs)).or_insert(r);
        }
        seen.into_values().collect()
    };
    let blocked: Vec<&Record> =
        dedupe(&mut input.records.iter().filter(|r| r.outcome.is_blocked()));
    let mut blocked_counts: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for r in input.records.iter().filter(|r| r.outcome.is_blocked()) {
        *blocked_counts
            .entry((r.door.as_str(), r.repository.as_str()))
            .or_default() += 1;
    }
    // Every distinct recorded request.
    let distinct: Vec<&Record> = dedupe(&mut input.records.iter());
    for ((door, repository, destination, group, ns), members) in groups {
        let (door, repository, destination) = (
            door.to_owned(),
            repository.to_owned(),
            destination.to_owned(),
        );
        let decline = |why: String| Declined {
            door: door.clone(),
            repository: repository.clone(),
            destination: destination.clone(),
            group: group.clone(),
            why,
        };
        let Some(readers) = input.destinations.get(&destination).map(|d| d.readers) else {
            out.declined.push(decline(
                "the destination is not configured by the owner".into(),
            ));
            continue;
        };
        // Evidence: acts that would be asked now (not refused), whose content
        // their readers may read, never forced or deleting.
        // Judged once per distinct request.
        let mut judged: std::collections::HashMap<String, bool> = std::collections::HashMap::new();
        let mut support: Vec<&Record> = Vec::new();
        let mut uniq: Vec<&Record> = Vec::new();
        for r in &members {
            let key = r.judge_key(needs);
            let fresh = !judged.contains_key(&key);
            let ok = *judged.entry(key).or_insert_with(|| {
                let j = judge_record(input.rules, input.destinations, r, input.clock);
                let plain = r.args.get("force") != Some(&serde_json::Value::Bool(true))
                    && r.args.get("delete") != Some(&serde_json::Value::Bool(true));
                j.passage != Passage::Refused && plain && readable(r.label, readers)
            });
            if ok {
                support.push(r);
                if fresh {
                    uniq.push(r);
                }
            }
        }
        if !ns && !support.iter().any(|r| r.outcome.person_approved()) {
            if !support.is_empty() {
                out.declined.push(decline(
                    "a protected branch or a single destination: proposed only after a person approved it".into(),
                ));
            }
            continue;
        }
        // Targets a person blocked on this door, repository and destination
        // are never in the literal set.
        let blocked_here: Vec<&Record> = blocked
            .iter()
            .copied()
            .filter(|b| b.door == door && b.repository == repository)
            .collect();
        let bad_targets: BTreeSet<String> = blocked_here
            .iter()
            .filter(|b| b.destination == destination)
            .map(|b| b.target())
            .collect();
        support.retain(|r| !bad_targets.contains(&r.target()));
        uniq.retain(|r| !bad_targets.contains(&r.target()));
        if support.is_empty() {
            out.declined.push(decline(
                "every act of this kind was rejected, expired or went stale at least once".into(),
            ));
            continue;
        }
        // The asks that cover the evidence; a refuse is never narrowed.
        let mut asks: BTreeSet<RuleId> = BTreeSet::new();
        for r in &uniq {
            let req = r.request();
            for rule in input.rules.active(input.clock) {
                if rule.effect() == Effect::Ask
                    && matches!(
                        applies(rule, &req),
                        Applies::Yes(_) | Applies::StandsAside(..)
                    )
                {
                    asks.insert(rule.id().clone());
                }
            }
        }
        let asks: Vec<RuleId> = asks.into_iter().collect();
        let evidence = evidence_of(
            &support,
            blocked_counts
                .get(&(door.as_str(), repository.as_str()))
                .copied()
                .unwrap_or(0),
        );
        let targets: Vec<String> = support
            .iter()
            .map(|r| r.target())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        // The region's fixed clauses.
        let mut fixed = vec![matches("repository", exact(&repository))];
        match door.as_str() {
            "push" => {
                fixed.push(matches("remote", exact(&destination)));
                fixed.push(matches("force", "^false$".into()));
                fixed.push(matches("delete", "^false$".into()));
            }
            "pull_request" => {
                fixed.push(matches("remote", exact(&destination)));
                let bases: BTreeSet<String> = support.iter().map(|r| r.text("base")).collect();
                let alts: Vec<String> = bases.iter().map(|b| regex::escape(b)).collect();
                fixed.push(matches("base", format!("^(?:{})$", alts.join("|"))));
            }
            _ => fixed.push(matches("destination", exact(&destination))),
        }
        let mut patterns: Vec<Option<String>> = Vec::new();
        if ladder_field(&door).is_some() {
            let alts: Vec<String> = targets.iter().map(|t| regex::escape(t)).collect();
            patterns.push(Some(format!("^(?:{})$", alts.join("|"))));
            if ns {
                patterns.extend(broader_patterns(&targets).into_iter().map(Some));
            }
        } else {
            patterns.push(None);
        }
        let ladder = short_digest(
            &serde_json::json!([door, repository, destination, group]),
            12,
        );
        let mut rung = 0usize;
        for pattern in patterns {
            let mut region = fixed.clone();
            if let (Some(p), Some(field)) = (&pattern, ladder_field(&door)) {
                region.push(matches(field, p.clone()));
            }
            let shown = pattern.clone().unwrap_or_else(|| destination.clone());
            let summary = format!(
                "{door} to {destination:?} matching {shown} in repository {repository} without asking"
            );
            let id = format!(
                "s{}",
                short_digest(
                    &serde_json::json!([door, repository, destination, region, asks]),
                    12
                )
            );
            if input.refused.contains(&id) {
                continue;
            }
            let changes = match changes_for(input.rules, &asks, &door, &region, &id, &summary) {
                Ok(c) => c,
                Err(why) => {
                    out.declined.push(decline(why));
                    break;
                }
            };
            let mut proposal = Proposal {
                id: id.clone(),
                rung,
                default: rung == 0,
                ladder: ladder.clone(),
                door: door.clone(),
                repository: repository.clone(),
                destination: destination.clone(),
                pattern: pattern.clone(),
                targets: targets.clone(),
                summary,
                irreversible: irreversible(
                    &door,
                    &destination,
                    ns.then_some(group.as_str()),
                    &targets,
                ),
                changes,
                evidence: evidence.clone(),
                delta: Vec::new(),
                delta_unbounded: rung > 0,
                safe: false,
            };
            let next = match adopted(input.rules, &proposal) {
                Ok(n) => n,
                Err(why) => {
                    out.declined
                        .push(decline(format!("the engine would not take it: {why}")));
                    break;
                }
            };
            // Every act of the evidence goes through under its allow.
            let allow_id = RuleId(format!("{id}-allow"));
            let takes_effect = uniq.iter().all(|r| {
                judge_record(&next, input.destinations, r, input.clock)
                    .scope
                    .as_ref()
                    == Some(&allow_id)
            });
            if !takes_effect {
                out.declined.push(decline(format!(
                    "rung {rung} would not take effect: another rule still decides some of its acts"
                )));
                break;
            }
            // Nothing blocked passes; a broader rung that would let one
            // through is not offered (nor anything above it).
            // Only the new allow can newly carry an act: what it does not
            // apply to is decided as before.
            let Some(allow_rule) = next.entries().get(&allow_id).map(|e| e.rule.clone()) else {
                break;
            };
            let newly = |r: &Record| !matches!(applies(&allow_rule, &r.request()), Applies::No);
            let passes_blocked = blocked.iter().filter(|b| newly(b)).any(|b| {
                judge_record(&next, input.destinations, b, input.clock).passage == Passage::Carried
            });
            if passes_blocked {
                out.declined.push(decline(format!(
                    "rung {rung} would let through an act a person rejected, let expire or found stale"
                )));
                break;
            }
            // The delta: every recorded routing and near variant that would
            // newly be carried out and that the evidence does not contain.
            let known: BTreeSet<String> = uniq.iter().map(|r| r.routing_key()).collect();
            let mut delta: BTreeSet<DeltaItem> = BTreeSet::new();
            let mut candidates: Vec<(Record, &str)> = distinct
                .iter()
                .map(|r| ((*r).clone(), "recorded"))
                .collect();
            for r in &uniq {
                candidates.extend(
                    variants(r, input.destinations)
                        .into_iter()
                        .map(|v| (v, "variant")),
                );
            }
            let mut unsafe_label = false;
            for (c, source) in candidates.iter().filter(|(c, _)| newly(c)) {
                let after = judge_record(&next, input.destinations, c, input.clock);
                if after.passage != Passage::Carried {
                    continue;
                }
                let readers_ok = input
                    .destinations
                    .get(&c.destination)
                    .is_some_and(|d| readable(c.label, d.readers));
                if !readers_ok {
                    unsafe_label = true;
                }
                let before = judge_record(input.rules, input.destinations, c, input.clock);
                if before.passage != Passage::Carried && !known.contains(&c.routing_key()) {
                    delta.insert(DeltaItem {
                        door: c.door.clone(),
                        repository: c.repository.clone(),
                        destination: c.destination.clone(),
                        target: c.target(),
                        source: (*source).to_owned(),
                    });
                }
            }
            if unsafe_label {
                out.declined.push(decline(format!(
                    "rung {rung} would carry content to readers who may not read it"
                )));
                break;
            }
            proposal.delta = delta.into_iter().collect();
            proposal.safe = proposal.delta.is_empty() && !proposal.delta_unbounded;
            out.proposals.push(proposal);
            rung += 1;
        }
    }
    out
}

fn evidence_of(support: &[&Record], blocked_checked: usize) -> Evidence {
    let mut acts: Vec<(i64, String)> = support.iter().map(|r| (r.at, r.id.clone())).collect();
    acts.sort();
    Evidence {
        runs: support
            .iter()
            .map(|r| r.run.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect(),
        count: acts.len(),
        approved: support
            .iter()
            .filter(|r| r.outcome.person_approved())
            .count(),
        dry_runs: support.iter().filter(|r| r.outcome.is_dry()).count(),
        autonomous: support
            .iter()
            .filter(|r| r.outcome == Outcome::Autonomous)
            .count(),
        first_seen: acts.first().map_or(0, |a| a.0),
        last_seen: acts.last().map_or(0, |a| a.0),
        acts: acts.into_iter().map(|a| a.1).collect(),
        blocked_checked,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broader_patterns_keep_the_namespace() {
        let t = vec![
            "refs/heads/agent/a".to_owned(),
            "refs/heads/agent/b".to_owned(),
        ];
        assert_eq!(
            broader_patterns(&t),
            vec![
                "^refs/heads/agent/[^/]+$".to_owned(),
                "^refs/heads/agent/.+$".to_owned()
            ]
        );
        assert!(broader_patterns(&t[..1]).is_empty());
    }

    fn allow(id: &str) -> Rule {
        Rule::compile(RuleSpec {
            id: id.into(),
            subject: "*".into(),
            scope: None,
            doors: vec!["push".into()],
            tools: Vec::new(),
            effect: Effect::Allow,
            reason: "r".into(),
            authority: "t".into(),
            locked: false,
            since: None,
            until: None,
            clauses: vec![],
        })
        .unwrap()
    }

    #[test]
    fn only_an_owners_allow_carries_an_act_and_only_past_an_untrusted_objection() {
        use crate::gate::Readers;
        let request = Request::new(
            "push",
            serde_json::json!({"remote": "origin", "ref": "refs/heads/agent/x"}),
        );
        let clock = Timestamp(1_800_000_000);
        let with = |author: Author| {
            let mut set = RuleSet::new();
            set.apply(Row::Declare {
                rule: allow("allow-push"),
                author,
            })
            .unwrap();
            set
        };
        // A shipped allow is not a scope: untrusted content is asked for.
        let shipped = with(Author::Shipped);
        let j = passage(
            &shipped,
            &request,
            "origin",
            Some(Readers::Private),
            Label::TOP,
            clock,
        );
        assert_eq!(j.passage, Passage::Asked);
        assert_eq!(j.scope, None);
        // The owner's allow carries it, when untrusted content is the gate's one objection.
        let owner = with(Author::Owner);
        let j = passage(
            &owner,
            &request,
            "origin",
            Some(Readers::Private),
            Label::TOP,
            clock,
        );
        assert_eq!(j.passage, Passage::Carried);
        assert_eq!(j.scope, Some(RuleId("allow-push".into())));
        // Not past any other objection: private content to public readers,
        // or a destination the owner has not configured.
        for readers in [Some(Readers::Public), None] {
            let j = passage(&owner, &request, "origin", readers, Label::TOP, clock);
            assert_eq!(j.passage, Passage::Refused, "{readers:?}");
        }
    }

    #[test]
    fn negation_is_the_complement() {
        let c = matches("ref", "^a$".into());
        let n = negate(&c);
        assert_eq!(n.not_matches.as_deref(), Some("^a$"));
        assert_eq!(negate(&n), c);
    }
}
