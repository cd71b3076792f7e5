//! The rule set: rows applied in order, and the rules active at a clock.
//!
//! Invariants:
//! - rows are only ever appended; a rule is never edited. Changing a rule is
//!   a retirement row plus a new declaration, and a rule id is never reused,
//!   even after retirement, so "which rule bound whom" stays answerable
//!   (`tests/ruleset.rs::agents_retire_only_what_tightens_on_themselves`,
//!   `tests/loading.rs::duplicate_id_is_named_at_the_second_declaration`);
//! - [`RuleSet::apply`] checks a row completely before changing anything, so
//!   a refused row leaves the set exactly as it was, and the generation
//!   moves only when a row is applied
//!   (`tests/ruleset.rs::generation_moves_only_on_applied_rows_and_names_them`,
//!   `tests/ruleset.rs::apply_all_is_all_or_nothing_and_rows_round_trip_through_json`);
//! - the generation is the number of rows applied plus a SHA-256 chain over
//!   their canonical JSON (`digest_n = sha256(digest_{n-1} || row_n)`,
//!   starting from 32 zero bytes). The count orders generations; the digest
//!   names the exact rows, so two stores that replayed different rows never
//!   share a generation
//!   (`tests/ruleset.rs::generation_moves_only_on_applied_rows_and_names_them`);
//! - an agent's declaration applies only if it is tier 1
//!   ([`crate::authority`]); everything else an agent wants goes through a
//!   proposal, inert until the owner ratifies it. Ratified rules are locked
//!   unless the ratification says otherwise; a locked rule is retired only
//!   after an unlock
//!   (`tests/ruleset.rs::a_proposal_is_inert_until_ratified_and_ratified_rules_are_locked`,
//!   `tests/properties.rs::an_agent_cannot_declare_what_loosens`);
//! - while frozen, tier-1 (agent-declared) rules are suspended: dropped from
//!   the active set, and listed by [`RuleSet::suspended`] for the audit. The
//!   freeze refuses every request, so dropping them loosens nothing.
//!
//! Owner rulings (ratify, reject, unlock, freeze, thaw) carry no author: the
//! caller applies them only under the owner's own credential
//! (`tests/tests/policy_cli.rs::a_proposal_is_inert_until_the_owner_ratifies_it_and_then_locked`,
//! `tests/tests/policy_cli.rs::a_freeze_refuses_every_door_and_every_run_until_the_owner_thaws`).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::authority::{classify_declaration, classify_retirement, NeedsOwner};
use crate::canonical::canonical_json;
use crate::rule::{Rule, RuleId};
use crate::timestamp::Timestamp;

/// Who wrote a row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Author {
    /// The owner, under the owner's credential.
    Owner,
    /// The rule files shipped with nightshift (or the owner's own files).
    Shipped,
    /// An agent, by actor name.
    Agent(String),
}

/// What a proposal would do once ratified.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum Change {
    /// Declare this rule.
    Declare {
        /// The rule.
        rule: Box<Rule>,
    },
    /// Retire this rule.
    Retire {
        /// The rule.
        rule: RuleId,
        /// Why.
        reason: String,
    },
    /// Unlock this rule.
    Unlock {
        /// The rule.
        rule: RuleId,
    },
}

/// One row of the policy's history.
// A row lives briefly (read, applied, stored), and boxing the rule would
// reach every match on `Row::Declare` for no gain.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "row", rename_all = "snake_case")]
pub enum Row {
    /// A rule takes effect now (agents: tier 1 only).
    Declare {
        /// The rule.
        rule: Rule,
        /// Who declared it.
        author: Author,
    },
    /// A rule stops binding (agents: tier 1 only).
    Retire {
        /// The rule retired.
        rule: RuleId,
        /// Why.
        reason: String,
        /// Under whose authority.
        authority: String,
        /// Who retired it.
        author: Author,
    },
    /// An inert request for the owner.
    Propose {
        /// Unique among proposals.
        proposal: String,
        /// What it would do.
        change: Change,
        /// Who proposed it.
        author: Author,
    },
    /// The owner adopts a proposal.
    Ratify {
        /// The proposal.
        proposal: String,
        /// The owner's record of it.
        authority: String,
        /// Whether a declared rule is locked (the default).
        #[serde(default = "yes")]
        lock: bool,
    },
    /// The owner refuses a proposal.
    Reject {
        /// The proposal.
        proposal: String,
        /// The owner's record of it.
        authority: String,
    },
    /// The owner unlocks a rule directly.
    Unlock {
        /// The rule.
        rule: RuleId,
        /// The owner's record of it.
        authority: String,
    },
    /// The owner freezes everything.
    Freeze {
        /// The owner's record of it.
        authority: String,
        /// Shown to every refused caller.
        reason: String,
        /// When (RFC 3339, the supervisor's clock); absent in rows written
        /// before it was recorded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at: Option<String>,
    },
    /// The owner ends a freeze.
    Thaw {
        /// The owner's record of it.
        authority: String,
    },
}

fn yes() -> bool {
    true
}

/// A freeze in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Freeze {
    /// The owner's record of it.
    pub authority: String,
    /// Shown to every refused caller.
    pub reason: String,
    /// When it began (RFC 3339), when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

/// The rule set's generation: rows applied, and the chain digest over them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Generation {
    /// Rows applied so far.
    pub rows: u64,
    /// SHA-256 chain over those rows.
    pub digest: [u8; 32],
}

impl Generation {
    /// The generation of an empty set.
    pub const EMPTY: Generation = Generation {
        rows: 0,
        digest: [0; 32],
    };
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.rows, hex::encode(self.digest))
    }
}

impl Serialize for Generation {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

/// Where an active rule came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// Shipped rule files.
    Shipped,
    /// Declared directly by the owner.
    Owner,
    /// Declared by an agent under tier 1 (suspended by a freeze).
    Tier1(String),
    /// A proposal the owner ratified.
    Ratified(String),
}

/// Whether a rule still binds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// It binds (when in force by time).
    Active,
    /// It was retired.
    Retired {
        /// Why.
        reason: String,
        /// Under whose authority.
        authority: String,
    },
}

/// A rule and what the rows have said about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The rule as declared.
    pub rule: Rule,
    /// Where it came from.
    pub origin: Origin,
    /// Its lock state now (unlock rows change this, never the rule).
    pub locked: bool,
    /// Active or retired.
    pub status: Status,
}

/// A proposal waiting for the owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// What it would do.
    pub change: Change,
    /// Who proposed it.
    pub author: Author,
}

/// Why a row was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// The id is taken (ids are never reused, even after retirement).
    #[error("declaring rule {rule}: a rule with this id already exists")]
    DuplicateId {
        /// The id.
        rule: RuleId,
    },
    /// A retirement, unlock or proposal naming a rule the set does not have.
    #[error("{act} rule {rule}: no such rule")]
    UnknownRule {
        /// What was being done.
        act: &'static str,
        /// The id named.
        rule: RuleId,
    },
    /// Retiring a rule that is already retired.
    #[error("retiring rule {rule}: it is already retired")]
    AlreadyRetired {
        /// The id.
        rule: RuleId,
    },
    /// Retiring a locked rule.
    #[error("retiring rule {rule}: it is locked; the owner must unlock it first")]
    Locked {
        /// The id.
        rule: RuleId,
    },
    /// Unlocking a rule that is not locked.
    #[error("unlocking rule {rule}: it is not locked")]
    NotLocked {
        /// The id.
        rule: RuleId,
    },
    /// An agent went beyond tier 1.
    #[error(transparent)]
    NeedsOwner(#[from] NeedsOwner),
    /// A proposal id that is taken.
    #[error("proposing {proposal}: a proposal with this id already exists")]
    DuplicateProposal {
        /// The id.
        proposal: String,
    },
    /// Ratifying or rejecting a proposal that is not pending.
    #[error("{act} proposal {proposal}: no such pending proposal")]
    UnknownProposal {
        /// What was being done.
        act: &'static str,
        /// The id.
        proposal: String,
    },
    /// Freezing while frozen.
    #[error("freezing: already frozen")]
    AlreadyFrozen,
    /// Thawing while not frozen.
    #[error("thawing: not frozen")]
    NotFrozen,
    /// A row that could not be encoded for the generation digest.
    #[error("encoding row for the generation digest: {message}")]
    Encode {
        /// What the encoder said.
        message: String,
    },
}

/// Applying the n-th row of a batch failed; nothing of the batch was kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("applying row {index}: {source}")]
pub struct ApplyAtError {
    /// Position of the row in the batch, from 0.
    pub index: usize,
    /// Why it was refused.
    #[source]
    pub source: ApplyError,
}

/// Every rule ever declared, the pending proposals, the freeze, and the
/// generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSet {
    entries: BTreeMap<RuleId, Entry>,
    pending: BTreeMap<String, Pending>,
    freeze: Option<Freeze>,
    generation: Generation,
}

impl Default for RuleSet {
    fn default() -> Self {
        Self::new()
    }
}

impl RuleSet {
    /// An empty set: every request is allowed.
    pub fn new() -> Self {
        Self {
            entries: BTreeMap::new(),
            pending: BTreeMap::new(),
            freeze: None,
            generation: Generation::EMPTY,
        }
    }

    /// Applies `rows` in order, all or nothing.
    pub fn from_rows(rows: impl IntoIterator<Item = Row>) -> Result<Self, ApplyAtError> {
        let mut set = Self::new();
        set.apply_all(rows)?;
        Ok(set)
    }

    /// Applies `rows` in order; on the first refusal the set is unchanged.
    pub fn apply_all(&mut self, rows: impl IntoIterator<Item = Row>) -> Result<(), ApplyAtError> {
        let mut next = self.clone();
        for (index, row) in rows.into_iter().enumerate() {
            next.apply(row)
                .map_err(|source| ApplyAtError { index, source })?;
        }
        *self = next;
        Ok(())
    }

    /// The generation decisions are made under.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// The freeze in force, if any.
    pub fn freeze(&self) -> Option<&Freeze> {
        self.freeze.as_ref()
    }

    /// Every rule ever declared, by id.
    pub fn entries(&self) -> &BTreeMap<RuleId, Entry> {
        &self.entries
    }

    /// Proposals waiting for the owner, by id.
    pub fn pending(&self) -> &BTreeMap<String, Pending> {
        &self.pending
    }

    /// The rules that bind at `clock`: active, in force, and not suspended.
    pub fn active(&self, clock: Timestamp) -> impl Iterator<Item = &Rule> + '_ {
        let frozen = self.freeze.is_some();
        self.entries
            .values()
            .filter(move |e| {
                e.status == Status::Active
                    && e.rule.in_force(clock)
                    && !(frozen && matches!(e.origin, Origin::Tier1(_)))
            })
            .map(|e| &e.rule)
    }

    /// The tier-1 rules a freeze in force suspends (empty when not frozen).
    pub fn suspended(&self) -> Vec<RuleId> {
        if self.freeze.is_none() {
            return Vec::new();
        }
        self.entries
            .values()
            .filter(|e| e.status == Status::Active && matches!(e.origin, Origin::Tier1(_)))
            .map(|e| e.rule.id().clone())
            .collect()
    }

    /// Applies one row, or refuses it and changes nothing.
    pub fn apply(&mut self, row: Row) -> Result<Generation, ApplyError> {
        let encoded = serde_json::to_value(&row)
            .map(|v| canonical_json(&v))
            .map_err(|e| ApplyError::Encode {
                message: e.to_string(),
            })?;
        match row {
            Row::Declare { rule, author } => {
                let origin = match author {
                    Author::Owner => Origin::Owner,
                    Author::Shipped => Origin::Shipped,
                    Author::Agent(actor) => {
                        classify_declaration(&actor, &rule)?;
                        Origin::Tier1(actor)
                    }
                };
                self.declare(rule, origin, None)?;
            }
            Row::Retire {
                rule,
                reason,
                authority,
                author,
            } => {
                let entry = self.known(&rule, "retiring")?;
                if let Author::Agent(actor) = &author {
                    classify_retirement(actor, &entry.rule, entry.locked)?;
                }
                self.retirable(&rule)?;
                self.retire(&rule, reason, authority);
            }
            Row::Propose {
                proposal,
                change,
                author,
            } => {
                if self.pending.contains_key(&proposal) {
                    return Err(ApplyError::DuplicateProposal { proposal });
                }
                match &change {
                    Change::Declare { rule } => self.check_new_id(rule.id())?,
                    Change::Retire { rule, .. } => {
                        self.known(rule, "proposing to retire")?;
                    }
                    Change::Unlock { rule } => {
                        self.known(rule, "proposing to unlock")?;
                    }
                }
                self.pending.insert(proposal, Pending { change, author });
            }
            Row::Ratify {
                proposal,
                authority,
                lock,
            } => {
                let pending = self
                    .pending
                    .get(&proposal)
                    .ok_or_else(|| ApplyError::UnknownProposal {
                        act: "ratifying",
                        proposal: proposal.clone(),
                    })?
                    .clone();
                match pending.change {
                    Change::Declare { rule } => {
                        self.declare(*rule, Origin::Ratified(proposal.clone()), Some(lock))?;
                    }
                    Change::Retire { rule, reason } => {
                        self.retirable(&rule)?;
                        self.retire(&rule, reason, authority);
                    }
                    Change::Unlock { rule } => self.unlock(&rule)?,
                }
                self.pending.remove(&proposal);
            }
            Row::Reject { proposal, .. } => {
                if self.pending.remove(&proposal).is_none() {
                    return Err(ApplyError::UnknownProposal {
                        act: "rejecting",
                        proposal,
                    });
                }
            }
            Row::Unlock { rule, .. } => self.unlock(&rule)?,
            Row::Freeze {
                authority,
                reason,
                at,
            } => {
                if self.freeze.is_some() {
                    return Err(ApplyError::AlreadyFrozen);
                }
                self.freeze = Some(Freeze {
                    authority,
                    reason,
                    at,
                });
            }
            Row::Thaw { .. } => {
                if self.freeze.take().is_none() {
                    return Err(ApplyError::NotFrozen);
                }
            }
        }
        let mut h = Sha256::new();
        h.update(self.generation.digest);
        h.update(encoded.as_bytes());
        self.generation = Generation {
            rows: self.generation.rows.saturating_add(1),
            digest: h.finalize().into(),
        };
        Ok(self.generation)
    }

    fn check_new_id(&self, id: &RuleId) -> Result<(), ApplyError> {
        let pending_same = self
            .pending
            .values()
            .any(|p| matches!(&p.change, Change::Declare { rule } if rule.id() == id));
        if self.entries.contains_key(id) || pending_same {
            return Err(ApplyError::DuplicateId { rule: id.clone() });
        }
        Ok(())
    }

    fn known(&self, id: &RuleId, act: &'static str) -> Result<&Entry, ApplyError> {
        self.entries.get(id).ok_or_else(|| ApplyError::UnknownRule {
            act,
            rule: id.clone(),
        })
    }

    fn declare(
        &mut self,
        rule: Rule,
        origin: Origin,
        lock: Option<bool>,
    ) -> Result<(), ApplyError> {
        if self.entries.contains_key(rule.id()) {
            return Err(ApplyError::DuplicateId {
                rule: rule.id().clone(),
            });
        }
        let locked = lock.unwrap_or(rule.locked());
        self.entries.insert(
            rule.id().clone(),
            Entry {
                rule,
                origin,
                locked,
                status: Status::Active,
            },
        );
        Ok(())
    }

    fn retirable(&self, id: &RuleId) -> Result<&Entry, ApplyError> {
        let entry = self.known(id, "retiring")?;
        if entry.status != Status::Active {
            return Err(ApplyError::AlreadyRetired { rule: id.clone() });
        }
        if entry.locked {
            return Err(ApplyError::Locked { rule: id.clone() });
        }
        Ok(entry)
    }

    fn retire(&mut self, id: &RuleId, reason: String, authority: String) {
        if let Some(e) = self.entries.get_mut(id) {
            e.status = Status::Retired { reason, authority };
        }
    }

    fn unlock(&mut self, id: &RuleId) -> Result<(), ApplyError> {
        let entry = self.known(id, "unlocking")?;
        if !entry.locked {
            return Err(ApplyError::NotLocked { rule: id.clone() });
        }
        if let Some(e) = self.entries.get_mut(id) {
            e.locked = false;
        }
        Ok(())
    }
}
