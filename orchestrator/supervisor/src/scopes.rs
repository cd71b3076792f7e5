//! Autonomy scopes, the adapter: the recorded history read from the store,
//! proposals kept as shown, and the owner's adoption or refusal. The
//! proposals and checks themselves are `policies::scopes`' (pure).
//!
//! Invariants:
//! - The history is every queued act (its outcome from its state; an act
//!   re-bound after going stale counts as stale) and every dry-run act, with
//!   the label the door recorded for it (the top label when none was:
//!   never a better label than the evidence shows:
//!   `tests::a_label_not_as_written_reads_as_the_top_label`), content-free.
//! - A proposal is kept exactly as shown (`scope_proposals`), so `scopes
//!   diff ID` and `scopes adopt ID` act on what the owner saw. Adoption is
//!   checked again against the whole history as it is now
//!   (`policies::scopes::check`), needs the owner's credential, and writes
//!   its rows (each proposed and ratified, locked) through `policy::write_row`,
//!   each with its audit entry, then a `scope_adopted` entry.
//! - A refused proposal's id is recorded and never offered again
//!   (`tests/tests/scopes.rs::a_refused_proposal_is_not_offered_again`,
//!   `policies/tests/scopes.rs::proposals_are_deterministic_and_refusal_hides_them`).

use std::collections::BTreeSet;

use policies::scopes::{self, Outcome, Proposal, Proposals, Record};
use policies::{Confidentiality, Integrity, Label, RuleSet};

use crate::acts::{act_policy_request, repository_key};
use nightshift_core::audit_log::Event;
use nightshift_core::owner::Owner;
use nightshift_core::state_store::{StateStore, Stores};

/// Was `rule` an autonomy scope when it decided (an allow the owner
/// ratified or declared; it may be retired since)?
pub fn was_scope(rules: &RuleSet, rule: &str) -> bool {
    rules
        .entries()
        .get(&policies::RuleId(rule.to_string()))
        .is_some_and(|e| {
            e.rule.effect() == policies::Effect::Allow
                && matches!(
                    e.origin,
                    policies::ruleset::Origin::Ratified(_) | policies::ruleset::Origin::Owner
                )
        })
}

/// A label as `acts::label_text` wrote it; anything else is the top label.
pub fn parse_label(text: &str) -> Label {
    let (i, c) = text.split_once(", ").unwrap_or(("untrusted", "private"));
    Label::new(
        if i == "trusted" {
            Integrity::Trusted
        } else {
            Integrity::Untrusted
        },
        if c == "public" {
            Confidentiality::Public
        } else {
            Confidentiality::Private
        },
    )
}

/// The owner's destinations with their readers, as the gate sees them.
pub fn gate_destinations(store: &dyn StateStore) -> Result<policies::Destinations, String> {
    let dest = crate::acts::destinations(store)?;
    let mut out = policies::Destinations::new();
    for (alias, r) in &dest.remotes {
        out.insert(alias.clone(), policies::Destination { readers: r.readers });
    }
    for (alias, n) in &dest.notify {
        out.insert(alias.clone(), policies::Destination { readers: n.readers });
    }
    for (alias, f) in &dest.forges {
        // A pull request lands on the forge and on its remote: the wider
        // readership counts (as at the door).
        let readers = match dest.remotes.get(&f.remote).map(|r| r.readers) {
            Some(policies::Readers::Public) => policies::Readers::Public,
            _ => f.readers,
        };
        out.insert(alias.clone(), policies::Destination { readers });
    }
    Ok(out)
}

/// Every recorded request: queued acts and dry-run acts.
pub fn history(store: &dyn StateStore, rules: &RuleSet) -> Result<Vec<Record>, String> {
    use deferred_queue::State as S;
    let labels = store.act_labels().map_err(|e| e.to_string())?;
    let mut repos = std::collections::HashMap::new();
    for run in store.runs().map_err(|e| e.to_string())? {
        repos.insert(
            run.id.clone(),
            repository_key(std::path::Path::new(&run.repo)),
        );
    }
    let mut out = Vec::new();
    for row in crate::acts::rows(store, None).map_err(|e| e.to_string())? {
        let repository = repos.get(&row.act.run).cloned().unwrap_or_default();
        let autonomous = row
            .act
            .deciding_rules
            .first()
            .is_some_and(|r| was_scope(rules, r));
        let outcome = match &row.state {
            S::Pending => Outcome::Pending,
            S::Stale { .. } => Outcome::Stale,
            S::Rejected { why, .. } if why.starts_with("re-bound as act ") => Outcome::Stale,
            S::Rejected { .. } => Outcome::Rejected,
            S::Expired { .. } => Outcome::Expired,
            _ if autonomous => Outcome::Autonomous,
            _ => Outcome::Approved,
        };
        let request = act_policy_request(&row.act, &repository);
        out.push(Record {
            id: row.act.id.clone(),
            run: row.act.run.clone(),
            at: row.act.created_at,
            actor: row.act.actor.clone(),
            door: row.act.door.name().to_string(),
            repository,
            destination: row.act.routing.destination.clone(),
            args: request.args,
            label: labels
                .get(&row.act.id)
                .map(|l| parse_label(l))
                .unwrap_or(Label::TOP),
            outcome,
        });
    }
    for d in store.dry_acts(None).map_err(|e| e.to_string())? {
        let text = |k: &str| {
            d.get(k)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        let outcome = match text("would").as_str() {
            "asked" => Outcome::DryAsked,
            "carried" => Outcome::DryCarried,
            _ => Outcome::DryRefused,
        };
        out.push(Record {
            id: text("id"),
            run: text("run"),
            at: d.get("at").and_then(|v| v.as_i64()).unwrap_or_default(),
            actor: text("actor"),
            door: text("door"),
            repository: text("repository"),
            destination: text("destination"),
            args: d.get("args").cloned().unwrap_or_default(),
            label: parse_label(&text("label")),
            outcome,
        });
    }
    Ok(out)
}

/// Which records a proposal may rest on.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only these runs (all when empty).
    pub runs: Vec<String>,
    /// Only records at or after this unix second.
    pub since: Option<i64>,
    /// Only this repository (as [`repository_key`] names it).
    pub repo: Option<String>,
}

impl Filter {
    fn keeps(&self, r: &Record) -> bool {
        (self.runs.is_empty() || self.runs.contains(&r.run))
            && self.since.is_none_or(|s| r.at >= s)
            && self.repo.as_ref().is_none_or(|p| &r.repository == p)
    }
}

/// Proposes from the history and keeps what it shows.
pub fn propose(store: &mut dyn StateStore, filter: &Filter) -> Result<Proposals, String> {
    let rules = nightshift_core::policy::load(store, None).map_err(|e| e.to_string())?;
    if rules.freeze().is_some() {
        return Err("nightshift is frozen: nothing is proposed until `nightshift thaw`".into());
    }
    let records = history(store, &rules)?;
    let evidence: Vec<Record> = records
        .iter()
        .filter(|r| filter.keeps(r))
        .cloned()
        .collect();
    let destinations = gate_destinations(store)?;
    let refused = store.refused_scopes().map_err(|e| e.to_string())?;
    let out = scopes::propose(scopes::Input {
        rules: &rules,
        records: &records,
        evidence: &evidence,
        destinations: &destinations,
        refused: &refused,
        clock: nightshift_core::policy::now(),
    });
    for p in &out.proposals {
        let value = serde_json::to_value(p).map_err(|e| e.to_string())?;
        store
            .put_scope_proposal(&p.id, &value)
            .map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// A proposal as it was shown.
pub fn load(store: &dyn StateStore, id: &str) -> Result<Proposal, String> {
    let value = store
        .scope_proposal(id)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no scope proposal {id}; `nightshift scopes propose` lists them"))?;
    serde_json::from_value(value).map_err(|e| format!("scope proposal {id} is unreadable: {e}"))
}

/// Every recorded decision the proposal would change.
pub fn diff(store: &dyn StateStore, id: &str) -> Result<(Proposal, Vec<scopes::DiffItem>), String> {
    let proposal = load(store, id)?;
    let rules = nightshift_core::policy::load(store, None).map_err(|e| e.to_string())?;
    let records = history(store, &rules)?;
    let destinations = gate_destinations(store)?;
    let items = scopes::diff(
        &rules,
        &proposal,
        &records,
        &destinations,
        nightshift_core::policy::now(),
    )?;
    Ok((proposal, items))
}

/// Adopts a proposal under the owner's credential: checked again on the
/// whole history, its rows written (ratified, locked), audited. Returns the
/// rules it declared and retired.
pub fn adopt(
    store: &mut dyn StateStore,
    id: &str,
    _owner: &Owner,
) -> Result<(Vec<String>, Vec<String>), String> {
    let proposal = load(store, id)?;
    if store
        .refused_scopes()
        .map_err(|e| e.to_string())?
        .contains(id)
    {
        return Err(format!("scope proposal {id} was refused"));
    }
    let rules = nightshift_core::policy::load(store, None).map_err(|e| e.to_string())?;
    if rules.freeze().is_some() {
        return Err("nightshift is frozen: thaw first".into());
    }
    let records = history(store, &rules)?;
    let destinations = gate_destinations(store)?;
    scopes::check(
        &rules,
        &proposal,
        &records,
        &destinations,
        nightshift_core::policy::now(),
    )
    .map_err(|why| format!("scope proposal {id} cannot be adopted now: {why}"))?;
    let mut generation = String::new();
    for row in scopes::adoption_rows(&proposal) {
        generation = nightshift_core::policy::write_row(store, None, row)
            .map_err(|e| format!("adopting scope proposal {id}: {e}"))?
            .to_string();
    }
    let mut declared = Vec::new();
    let mut retired = Vec::new();
    for c in &proposal.changes {
        match c {
            policies::Change::Declare { rule } => declared.push(rule.id().to_string()),
            policies::Change::Retire { rule, .. } => retired.push(rule.to_string()),
            policies::Change::Unlock { .. } => {}
        }
    }
    store
        .append(
            None,
            &Event::ScopeAdopted {
                proposal: id.to_string(),
                door: proposal.door.clone(),
                repository: proposal.repository.clone(),
                destination: proposal.destination.clone(),
                pattern: proposal.pattern.clone(),
                retired: retired.clone(),
                declared: declared.clone(),
                evidence_acts: proposal.evidence.count,
                evidence_approved: proposal.evidence.approved,
                delta: proposal.delta.len(),
                generation,
            },
            true,
        )
        .map_err(|e| e.to_string())?;
    Ok((declared, retired))
}

/// Records the owner's refusal: the proposal is not offered again.
pub fn refuse(
    store: &mut dyn StateStore,
    id: &str,
    why: &str,
    _owner: &Owner,
) -> Result<(), String> {
    load(store, id)?;
    store
        .refuse_scope(
            id,
            why,
            &Event::ScopeRefused {
                proposal: id.to_string(),
                why: why.to_string(),
            },
        )
        .map_err(|e| e.to_string())
}

/// The set of refused proposal ids (for tests and listings).
pub fn refused(store: &dyn StateStore) -> Result<BTreeSet<String>, String> {
    store.refused_scopes().map_err(|e| e.to_string())
}

/// `nightshift scopes ...`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Propose rule changes from dry runs and the decision history (narrowest first).
    Propose {
        /// Only these runs' acts as evidence (all checks still see every act).
        #[arg(long, num_args = 1..)]
        runs: Vec<String>,
        /// Only acts this recent as evidence, e.g. 7d, 24h.
        #[arg(long)]
        since: Option<String>,
        /// Only this repository's acts as evidence.
        #[arg(long)]
        repo: Option<std::path::PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Every recorded decision a proposal would change.
    Diff {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Adopt a proposal (the owner's credential): its rule rows are written ratified and locked.
    Adopt {
        id: String,
        #[arg(long, env = "NIGHTSHIFT_OWNER_KEY_FILE")]
        owner_key_file: Option<std::path::PathBuf>,
    },
    /// Refuse a proposal (the owner's credential): it is not offered again.
    Refuse {
        id: String,
        #[arg(long)]
        why: String,
        #[arg(long, env = "NIGHTSHIFT_OWNER_KEY_FILE")]
        owner_key_file: Option<std::path::PathBuf>,
    },
}

fn say(text: String) {
    nightshift_core::terminal::out(format_args!("{text}\n"));
}

fn fail(code: i32, e: &dyn std::fmt::Display) -> i32 {
    nightshift_core::terminal::err(format_args!("nightshift: {e}\n"));
    code
}

fn when(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| unix.to_string())
}

fn show(p: &Proposal) {
    use nightshift_core::terminal::line;
    say(format!(
        "{} (rung {}{}): {}",
        p.id,
        p.rung,
        if p.default { ", default" } else { "" },
        line(&p.summary)
    ));
    let e = &p.evidence;
    say(format!(
        "  evidence: {} act(s) in {} run(s), {} approved by a person, {} from dry runs, {} under a scope; first {} last {}; none of {} rejected, expired or stale act(s) would pass",
        e.count,
        e.runs.len(),
        e.approved,
        e.dry_runs,
        e.autonomous,
        when(e.first_seen),
        when(e.last_seen),
        e.blocked_checked
    ));
    say(format!("  makes irreversible: {}", line(&p.irreversible)));
    if p.delta.is_empty() && !p.delta_unbounded {
        say("  delta: none (it lets through only what the evidence holds)".into());
    } else {
        say(format!(
            "  delta: NOT SAFE: {}{} act(s) beyond the evidence, for example:",
            if p.delta_unbounded {
                "its pattern admits refs never seen; "
            } else {
                ""
            },
            p.delta.len()
        ));
        for d in p.delta.iter().take(8) {
            say(format!(
                "    {} to {} {} ({})",
                line(&d.door),
                line(&d.destination),
                line(&d.target),
                d.source
            ));
        }
    }
    for c in &p.changes {
        match c {
            policies::Change::Declare { rule } => say(format!(
                "  declare {} {} ({} clause(s))",
                rule.effect(),
                rule.id(),
                rule.clauses().len()
            )),
            policies::Change::Retire { rule, .. } => say(format!("  retire {rule}")),
            policies::Change::Unlock { rule } => say(format!("  unlock {rule}")),
        }
    }
}

/// Runs one `scopes` subcommand.
pub fn cli(stores: &Stores, command: Command) -> Result<i32, i32> {
    let _root = stores.root();
    let mut store = stores
        .connect()
        .map_err(|e| fail(nightshift_core::exit::STATE, &e))?;
    match command {
        Command::Propose {
            runs,
            since,
            repo,
            json,
        } => {
            let since = match since {
                Some(s) => {
                    let span = nightshift_core::config::parse_span(&s).map_err(|e| {
                        fail(nightshift_core::exit::BAD_INPUT, &format!("--since: {e}"))
                    })?;
                    Some(time::OffsetDateTime::now_utc().unix_timestamp() - span.as_secs() as i64)
                }
                None => None,
            };
            let filter = Filter {
                runs,
                since,
                repo: repo.as_deref().map(repository_key),
            };
            let out = propose(&mut *store, &filter)
                .map_err(|e| fail(nightshift_core::exit::STATE, &e))?;
            if json {
                say(nightshift_core::terminal::json(&out, true));
                return Ok(nightshift_core::exit::OK);
            }
            if out.proposals.is_empty() {
                say("no proposals".into());
            }
            for p in &out.proposals {
                show(p);
            }
            for d in &out.declined {
                say(format!(
                    "not proposed: {} to {} {} in {}: {}",
                    nightshift_core::terminal::line(&d.door),
                    nightshift_core::terminal::line(&d.destination),
                    nightshift_core::terminal::line(&d.group),
                    nightshift_core::terminal::line(&d.repository),
                    nightshift_core::terminal::line(&d.why)
                ));
            }
            Ok(nightshift_core::exit::OK)
        }
        Command::Diff { id, json } => {
            let (p, items) =
                diff(&store, &id).map_err(|e| fail(nightshift_core::exit::BAD_INPUT, &e))?;
            if json {
                say(nightshift_core::terminal::json(
                    &serde_json::json!({"proposal": p, "changes": items}),
                    true,
                ));
                return Ok(nightshift_core::exit::OK);
            }
            show(&p);
            say(format!(
                "{} recorded decision(s) would change:",
                items.len()
            ));
            for i in &items {
                say(format!(
                    "  {} (run {}): {} to {} {}: {:?} by {} -> {:?} by {}",
                    i.act,
                    i.run,
                    nightshift_core::terminal::line(&i.door),
                    nightshift_core::terminal::line(&i.destination),
                    nightshift_core::terminal::line(&i.target),
                    i.before,
                    nightshift_core::terminal::line(&i.before_rule),
                    i.after,
                    nightshift_core::terminal::line(&i.after_rule)
                ));
            }
            Ok(nightshift_core::exit::OK)
        }
        Command::Adopt { id, owner_key_file } => {
            let who = nightshift_core::owner::verify(&store, owner_key_file.as_deref())
                .map_err(|e| fail(nightshift_core::exit::DENIED, &e))?;
            let (declared, retired) = adopt(&mut store, &id, &who)
                .map_err(|e| fail(nightshift_core::exit::DENIED, &e))?;
            say(format!(
                "adopted {id}: declared {}; retired {}",
                declared.join(", "),
                if retired.is_empty() {
                    "nothing".to_string()
                } else {
                    retired.join(", ")
                }
            ));
            Ok(nightshift_core::exit::OK)
        }
        Command::Refuse {
            id,
            why,
            owner_key_file,
        } => {
            let who = nightshift_core::owner::verify(&store, owner_key_file.as_deref())
                .map_err(|e| fail(nightshift_core::exit::DENIED, &e))?;
            refuse(&mut store, &id, &why, &who)
                .map_err(|e| fail(nightshift_core::exit::BAD_INPUT, &e))?;
            say(format!("refused {id}: it is not offered again"));
            Ok(nightshift_core::exit::OK)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_not_as_written_reads_as_the_top_label() {
        assert_eq!(parse_label("trusted, public"), Label::BOTTOM);
        assert_eq!(
            parse_label("trusted, private"),
            Label::new(Integrity::Trusted, Confidentiality::Private)
        );
        assert_eq!(
            parse_label("untrusted, public"),
            Label::new(Integrity::Untrusted, Confidentiality::Public)
        );
        for text in [
            "",
            "trusted",
            "Trusted, Public",
            "trusted,public",
            "public, trusted",
        ] {
            // However close, anything else is the top label, never a better one.
            assert_eq!(parse_label(text), Label::TOP, "{text:?}");
        }
    }
}
