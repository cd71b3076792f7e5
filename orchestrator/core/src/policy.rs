//! The policy adapter: where rule rows come from and where decisions and
//! rows are recorded. The decisions themselves are the `policies` crate's.
//!
//! Invariants:
//! - The rule set is the rule files (`--rules DIR`, else `STATE/rules/` when
//!   it exists, else the shipped defaults) followed by the rows declared at
//!   run time in the state store, replayed in order. Any error anywhere means
//!   no rule set: callers fail closed.
//! - Rule files in `STATE/rules/` (or `--rules DIR`) replace the shipped
//!   defaults, never silently: [`shipped_rules_left_out`] names each
//!   shipped rule they leave out, which `run`, `serve`, `worker` and
//!   `policy list` warn of (`tests::rules_that_replace_the_defaults_name_what_they_leave_out`).
//! - Every row written at run time is stored together with its audit entry
//!   in one transaction; every refuse and ask is audited with the request's
//!   digest, never its arguments
//!   (`orchestrator/store-postgres/tests/contract.rs::policy_rows_scopes_and_meta`,
//!   `tests/tests/policy_cli.rs::refusals_and_asks_are_audited_by_digest_never_by_arguments`).

use crate::state_store::StateStore;
use std::path::{Path, PathBuf};

use policies::{Author, Decision, Row, RuleSet, Timestamp, Verdict};

use crate::audit_log::Event;
use crate::owner::Owner;
use crate::state_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error(transparent)]
    Load(#[from] policies::LoadError),
    #[error("replaying stored policy row {index}: {message}")]
    Replay { index: usize, message: String },
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub fn now() -> Timestamp {
    Timestamp(time::OffsetDateTime::now_utc().unix_timestamp())
}

/// The rule files in force: `dir`, else `STATE/rules/`, else the defaults.
fn file_rules<S: StateStore + ?Sized>(
    store: &S,
    dir: Option<&Path>,
) -> Result<RuleSet, PolicyError> {
    if let Some(dir) = dir {
        return Ok(policies::load_dir(dir)?);
    }
    let configured = store.root().join("rules");
    if configured.is_dir() {
        return Ok(policies::load_dir(&configured)?);
    }
    Ok(policies::rulefile::rule_set_from_files([(
        Path::new("policies/rules/default.toml (built in)"),
        policies::DEFAULT_RULES,
    )])?)
}

/// The shipped default rules that the rule files in force leave out (by
/// id; `(id, locked)`): none when the defaults are in force, else each one
/// `dir` (or `STATE/rules/`) does not declare. A warning's matter: the
/// owner's files replace the defaults rather than add to them.
pub fn shipped_rules_left_out<S: StateStore + ?Sized>(
    store: &S,
    dir: Option<&Path>,
) -> Result<Vec<(String, bool)>, PolicyError> {
    let configured = store.root().join("rules");
    if dir.is_none() && !configured.is_dir() {
        return Ok(Vec::new());
    }
    let files = file_rules(store, dir)?;
    let shipped = policies::rulefile::rule_set_from_files([(
        Path::new("policies/rules/default.toml (built in)"),
        policies::DEFAULT_RULES,
    )])?;
    Ok(shipped
        .entries()
        .iter()
        .filter(|(id, _)| !files.entries().contains_key(*id))
        .map(|(id, e)| (id.to_string(), e.locked))
        .collect())
}

/// The warning for [`shipped_rules_left_out`]'s answer (`None`: nothing
/// left out), naming the rules, where from, and the fix.
pub fn left_out_warning(left_out: &[(String, bool)], source: &str) -> Option<String> {
    if left_out.is_empty() {
        return None;
    }
    let names: Vec<String> = left_out
        .iter()
        .map(|(id, locked)| match locked {
            true => format!("{id} (locked)"),
            false => id.clone(),
        })
        .collect();
    Some(format!(
        "WARNING: {source} replaces nightshift's shipped rules, and these are NOT in force: {}; \
         copy policies/rules/default.toml into that directory to keep them (docs/policy-hook.md)",
        names.join(", ")
    ))
}

/// Loads the whole rule set: files, then the stored rows.
pub fn load<S: StateStore + ?Sized>(store: &S, dir: Option<&Path>) -> Result<RuleSet, PolicyError> {
    let mut set = file_rules(store, dir)?;
    for (index, value) in store.policy_rows()?.into_iter().enumerate() {
        let row: Row = serde_json::from_value(value).map_err(|e| PolicyError::Replay {
            index: index + 1,
            message: e.to_string(),
        })?;
        set.apply(row).map_err(|e| PolicyError::Replay {
            index: index + 1,
            message: e.to_string(),
        })?;
    }
    Ok(set)
}

/// Audits a decision when it refuses or asks.
pub fn record_decision<S: StateStore + ?Sized>(
    store: &mut S,
    run: Option<&str>,
    actor: Option<&str>,
    door: &str,
    decision: &Decision,
) -> Result<(), PolicyError> {
    if decision.verdict == Verdict::Allow {
        return Ok(());
    }
    store.append(
        run,
        &Event::PolicyDecision {
            actor: actor.map(str::to_string),
            door: door.to_string(),
            verdict: verdict_name(decision.verdict).to_string(),
            rule: decision.rule.to_string(),
            escalated: decision.escalated,
            stood_aside: decision
                .stood_aside
                .iter()
                .map(|s| format!("{} ({})", s.rule, s.effect))
                .collect(),
            generation: decision.generation.to_string(),
            digest: decision.digest.to_string(),
        },
        false,
    )?;
    Ok(())
}

pub fn verdict_name(v: Verdict) -> &'static str {
    match v {
        Verdict::Allow => "allow",
        Verdict::Ask => "ask",
        Verdict::Refuse => "refuse",
    }
}

/// Who is writing a row: an agent (tier 1 only) or the owner (proven).
#[derive(Debug, Clone)]
pub enum Writer {
    Agent(String),
    Owner(Owner),
}

impl Writer {
    fn author(&self) -> Author {
        match self {
            Writer::Agent(a) => Author::Agent(a.clone()),
            Writer::Owner(_) => Author::Owner,
        }
    }
}

/// Applies a row to the current set (so the policy's own checks decide,
/// including the tier-1 limits) and, only if it applies, stores it with its
/// audit entry.
pub fn write_row(
    store: &mut dyn StateStore,
    dir: Option<&Path>,
    row: Row,
) -> Result<policies::Generation, PolicyError> {
    let mut set = load(store, dir)?;
    let (kind, subject, author) = describe(&row);
    let suspended = if matches!(row, Row::Freeze { .. }) {
        set.suspended().iter().map(|r| r.to_string()).collect()
    } else {
        Vec::new()
    };
    let generation = set
        .apply(row.clone())
        .map_err(|e| PolicyError::Refused(e.to_string()))?;
    let value = serde_json::to_value(&row).map_err(|e| PolicyError::Refused(e.to_string()))?;
    store.append_policy_row(
        &value,
        &Event::PolicyRow {
            row: kind,
            subject,
            author,
            generation: generation.to_string(),
            suspended,
        },
    )?;
    Ok(generation)
}

fn describe(row: &Row) -> (String, String, String) {
    let author = |a: &Author| match a {
        Author::Owner => "owner".to_string(),
        Author::Shipped => "shipped".to_string(),
        Author::Agent(name) => format!("agent:{name}"),
    };
    match row {
        Row::Declare { rule, author: a } => ("declare".into(), rule.id().to_string(), author(a)),
        Row::Retire {
            rule, author: a, ..
        } => ("retire".into(), rule.to_string(), author(a)),
        Row::Propose {
            proposal,
            author: a,
            ..
        } => ("propose".into(), proposal.clone(), author(a)),
        // The owner's gestures name who made them, as the front end
        // established it (`owner`, `dashboard:alice`: `api::Caller`).
        Row::Ratify {
            proposal,
            authority,
            ..
        } => ("ratify".into(), proposal.clone(), authority.clone()),
        Row::Reject {
            proposal,
            authority,
        } => ("reject".into(), proposal.clone(), authority.clone()),
        Row::Unlock { rule, authority } => ("unlock".into(), rule.to_string(), authority.clone()),
        Row::Freeze { authority, .. } => ("freeze".into(), "*".into(), authority.clone()),
        Row::Thaw { authority } => ("thaw".into(), "*".into(), authority.clone()),
    }
}

/// Rows declaring (or proposing) every rule of a rule file, authored by `writer`.
pub fn rules_from_file(path: &Path) -> Result<Vec<policies::Rule>, PolicyError> {
    let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let rows = policies::rulefile::parse_rule_file(path, &text)?;
    let mut rules = Vec::new();
    for fr in rows {
        match fr.row {
            Row::Declare { rule, .. } => rules.push(rule),
            _ => {
                return Err(PolicyError::Refused(format!(
                    "{}: line {}: only [[rule]] tables can be declared or proposed here; retire with `nightshift policy retire`",
                    fr.file.display(),
                    fr.line
                )))
            }
        }
    }
    Ok(rules)
}

pub fn declare(
    store: &mut dyn StateStore,
    dir: Option<&Path>,
    file: &Path,
    writer: &Writer,
) -> Result<Vec<String>, PolicyError> {
    let mut done = Vec::new();
    for rule in rules_from_file(file)? {
        let id = rule.id().to_string();
        write_row(
            store,
            dir,
            Row::Declare {
                rule,
                author: writer.author(),
            },
        )?;
        done.push(id);
    }
    Ok(done)
}

pub fn propose(
    store: &mut dyn StateStore,
    dir: Option<&Path>,
    file: &Path,
    writer: &Writer,
) -> Result<Vec<String>, PolicyError> {
    let mut done = Vec::new();
    for rule in rules_from_file(file)? {
        let proposal = format!("p-{}", ulid::Ulid::new().to_string().to_lowercase());
        write_row(
            store,
            dir,
            Row::Propose {
                proposal: proposal.clone(),
                change: policies::Change::Declare {
                    rule: Box::new(rule),
                },
                author: writer.author(),
            },
        )?;
        done.push(proposal);
    }
    Ok(done)
}

pub fn retire(
    store: &mut dyn StateStore,
    dir: Option<&Path>,
    rule: &str,
    why: &str,
    writer: &Writer,
) -> Result<(), PolicyError> {
    if !policies::RuleId::is_valid(rule) {
        return Err(PolicyError::Refused(format!("{rule:?} is not a rule id")));
    }
    let id = policies::RuleId(rule.to_string());
    write_row(
        store,
        dir,
        Row::Retire {
            rule: id,
            reason: why.to_string(),
            authority: match writer {
                Writer::Owner(_) => "owner".into(),
                Writer::Agent(a) => format!("agent:{a}"),
            },
            author: writer.author(),
        },
    )?;
    Ok(())
}

fn rule_id(rule: &str) -> Result<policies::RuleId, PolicyError> {
    if !policies::RuleId::is_valid(rule) {
        return Err(PolicyError::Refused(format!("{rule:?} is not a rule id")));
    }
    Ok(policies::RuleId(rule.to_string()))
}

/// Proposes retiring a rule: inert until the owner ratifies it.
pub fn propose_retirement(
    store: &mut dyn StateStore,
    dir: Option<&Path>,
    rule: &str,
    why: &str,
    writer: &Writer,
) -> Result<String, PolicyError> {
    let proposal = format!("p-{}", ulid::Ulid::new().to_string().to_lowercase());
    write_row(
        store,
        dir,
        Row::Propose {
            proposal: proposal.clone(),
            change: policies::Change::Retire {
                rule: rule_id(rule)?,
                reason: why.to_string(),
            },
            author: writer.author(),
        },
    )?;
    Ok(proposal)
}

/// The owner unlocks a rule (a new row; the rule itself never changes).
pub fn unlock(
    store: &mut dyn StateStore,
    dir: Option<&Path>,
    rule: &str,
    _owner: &Owner,
) -> Result<(), PolicyError> {
    write_row(
        store,
        dir,
        Row::Unlock {
            rule: rule_id(rule)?,
            authority: "owner".into(),
        },
    )?;
    Ok(())
}

pub fn ratify(
    store: &mut dyn StateStore,
    dir: Option<&Path>,
    proposal: &str,
    _owner: &Owner,
) -> Result<(), PolicyError> {
    write_row(
        store,
        dir,
        Row::Ratify {
            proposal: proposal.to_string(),
            authority: "owner".into(),
            lock: true,
        },
    )?;
    Ok(())
}

/// The kill switch's brake: anyone on the supervisor's side may pull it.
pub fn freeze(
    store: &mut dyn StateStore,
    dir: Option<&Path>,
    why: &str,
) -> Result<(), PolicyError> {
    let who = std::env::var("USER").unwrap_or_else(|_| "operator".into());
    write_row(
        store,
        dir,
        Row::Freeze {
            authority: format!("nightshift freeze by {who}"),
            reason: why.to_string(),
            at: Some(crate::state_store::now_rfc3339()),
        },
    )?;
    Ok(())
}

/// Releasing the brake loosens everything at once: the owner's alone.
pub fn thaw(
    store: &mut dyn StateStore,
    dir: Option<&Path>,
    _owner: &Owner,
) -> Result<(), PolicyError> {
    write_row(
        store,
        dir,
        Row::Thaw {
            authority: "owner".into(),
        },
    )?;
    Ok(())
}

/// The most time `nightshift policy check` (the harness hook) takes: it
/// answers within it or refuses. Harnesses run the tool when a hook outlives
/// their own timeout (Claude Code's is far longer, but a hook that waits on a
/// locked state for its whole busy timeout would pass it), so a late answer
/// would be an allow.
pub const HOOK_BOUND: std::time::Duration = std::time::Duration::from_secs(2);
/// How long the hook waits for a lock another process holds on the state.
pub const HOOK_BUSY: std::time::Duration = std::time::Duration::from_millis(1500);

/// The active rules that can bind a tool call of `actor` (any actor when
/// `None`): those naming a tool whose subject is `*` or matches the actor.
pub fn rules_binding_tool_calls<'a>(
    set: &'a RuleSet,
    actor: Option<&str>,
    clock: Timestamp,
) -> Vec<&'a policies::Rule> {
    set.active(clock)
        .filter(|r| !r.tools().is_empty())
        .filter(|r| match actor {
            None => true,
            Some(a) => r.subject() == "*" || policies::glob::glob_matches(r.subject(), a),
        })
        .collect()
}

/// Where the rules came from, for messages: `--rules DIR`, `STATE/rules`,
/// or the shipped defaults.
pub fn rules_source(store: &dyn StateStore, dir: Option<&Path>) -> String {
    match dir {
        Some(d) => format!("the rules directory {}", d.display()),
        None => {
            let configured = store.root().join("rules");
            if configured.is_dir() {
                format!("the rules directory {}", configured.display())
            } else {
                "the shipped rules".to_string()
            }
        }
    }
}

/// A label as the owner reads it: `untrusted, private`.
pub fn label_text(label: policies::Label) -> String {
    let integrity = match label.integrity {
        policies::Integrity::Trusted => "trusted",
        policies::Integrity::Untrusted => "untrusted",
    };
    let confidentiality = match label.confidentiality {
        policies::Confidentiality::Public => "public",
        policies::Confidentiality::Private => "private",
    };
    format!("{integrity}, {confidentiality}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_that_replace_the_defaults_name_what_they_leave_out() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::state_store::fake::MemStore::new(dir.path());
        // No STATE/rules: the defaults are in force, nothing to say.
        assert!(shipped_rules_left_out(&store, None).unwrap().is_empty());
        std::fs::create_dir(dir.path().join("rules")).unwrap();
        std::fs::write(
            dir.path().join("rules/mine.toml"),
            "[[rule]]\nid = \"ask-before-push\"\nsubject = \"*\"\ndoors = [\"push\"]\neffect = \"ask\"\nreason = \"r\"\nauthority = \"owner\"\n",
        )
        .unwrap();
        let left = shipped_rules_left_out(&store, None).unwrap();
        assert!(
            left.contains(&("no-force-push-to-main".to_string(), true)),
            "{left:?}"
        );
        assert!(
            left.contains(&("no-deleting-main".to_string(), true)),
            "{left:?}"
        );
        assert!(
            !left.iter().any(|(id, _)| id == "ask-before-push"),
            "{left:?}"
        );
        let w = left_out_warning(&left, "the rules directory X").unwrap();
        assert!(
            w.contains("no-force-push-to-main (locked)") && w.contains("NOT in force"),
            "{w}"
        );
        // A copy of the defaults leaves nothing out.
        std::fs::write(dir.path().join("rules/mine.toml"), policies::DEFAULT_RULES).unwrap();
        assert!(shipped_rules_left_out(&store, None).unwrap().is_empty());
    }
}
