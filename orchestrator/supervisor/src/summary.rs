//! The morning summary: what the night did, sent once to the owner's
//! configured notify destination (`[summary]` in `STATE/destinations.toml`)
//! when the night's last run ends (no other run active), or, when the owner
//! set `at = "HH:MM"`, by `nightshift summary --due` at that time (UTC).
//!
//! Invariants:
//! - It carries counts and ids only, and the owner's own `review` text:
//!   runs by outcome, caps hit, acts waiting by state, the audit chain's
//!   state, the run ids (chosen by the supervisor). Every name in it comes
//!   from a fixed list here ([`outcome`], [`cap`], the queue's state
//!   names): nothing an agent wrote or chose (commit messages, file names,
//!   exit codes, act content) can reach it. It goes out without approval,
//!   so it must carry nothing an agent chose
//!   (`tests::outcomes_and_caps_are_fixed_names_whatever_the_status_says`,
//!   `tests/tests/destinations.rs::a_night_over_tls_reaches_its_remote_and_its_summary_arrives_once_without_agent_text`).
//! - Once: a summary covers the runs that ended after the last one sent
//!   (`STATE/summary.json`, written after the destination accepted it, under
//!   `STATE/summary.lock`); with no such run nothing is sent. Two runs that
//!   end together send one summary.
//! - Composing is pure ([`compose`], [`render`]); reading the store and
//!   posting are the thin part around it.

use std::collections::BTreeMap;
use std::path::Path;

use orchestrator_executors::{Destinations, Message};
use serde::{Deserialize, Serialize};

use nightshift_core::audit_log::Event;
use nightshift_core::state_store::{RunRecord, StateStore, Stores};

/// What a summary says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Runs that ended since the last summary, by outcome.
    pub runs: BTreeMap<&'static str, u64>,
    /// Their ids, oldest first.
    pub run_ids: Vec<String>,
    /// Caps that killed runs, by cap.
    pub caps_hit: BTreeMap<&'static str, u64>,
    /// Acts not yet final, by state (`pending` waits for a person).
    pub acts: BTreeMap<&'static str, u64>,
    /// The audit chain: intact, or where it breaks.
    pub audit: AuditState,
    /// What the reader opens to review: the owner's `review`, or
    /// `nightshift queue`.
    pub review: String,
}

/// The audit chain's state as the summary reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditState {
    pub intact: bool,
    pub entries: Option<u64>,
    pub first_bad_entry: Option<u64>,
}

/// A summary's message id: `summary_` and 32 hex digits of the digest of
/// the ids of the runs it covers.
pub fn summary_id(run_ids: &[String]) -> String {
    let digest = nightshift_core::audit_log::digest(run_ids.join("\n").as_bytes());
    format!("summary_{}", &digest[..32])
}

/// The outcome class of a run's status: a fixed name.
pub fn outcome(status: &str) -> &'static str {
    if status == "exited 0" {
        "succeeded"
    } else if status.starts_with("import failed") {
        "import_failed"
    } else if status.starts_with("exited ") {
        "failed"
    } else if status.starts_with("killed: by ") {
        "killed"
    } else if status.starts_with("killed: ") {
        "cap_hit"
    } else if status.starts_with("interrupted") {
        "interrupted"
    } else if status.starts_with("refused") {
        "refused"
    } else if status == "running" || status == "created" {
        "running"
    } else if status.starts_with("error") {
        "error"
    } else {
        "other"
    }
}

/// The cap named by a `killed: ...` status: a fixed name.
pub fn cap(status: &str) -> Option<&'static str> {
    let rest = status.strip_prefix("killed: ")?;
    const CAPS: [(&str, &str); 11] = [
        // The gateway's kills (`gateway::serve::cap_detail`, run or fleet;
        // `gateway::route::RefusedInARow`).
        ("model token cap", "tokens"),
        ("model calls refused", "model-refused"),
        ("fleet memory cap", "fleet-memory"),
        ("memory cap", "memory"),
        ("process cap", "pids"),
        ("open files cap", "open-files"),
        ("worktree cap", "worktree"),
        ("timeout", "wall-clock"),
        ("wall clock", "wall-clock"),
        ("output", "output"),
        ("token", "tokens"),
    ];
    if rest.starts_with("by ") {
        return None;
    }
    Some(
        CAPS.iter()
            .find(|(prefix, _)| rest.starts_with(prefix))
            .map(|(_, name)| *name)
            .unwrap_or("other"),
    )
}

/// Composes the summary of the runs that ended after `since` (RFC 3339;
/// `None`: every ended run), the acts' states, and the audit's state.
pub fn compose(
    runs: &[RunRecord],
    since: Option<&str>,
    act_states: &[&'static str],
    audit: AuditState,
    review: Option<&str>,
) -> Summary {
    let mut ended: Vec<&RunRecord> = runs
        .iter()
        .filter(|r| outcome(&r.status) != "running")
        .filter(|r| match (since, r.ended_at.as_deref()) {
            (Some(since), Some(at)) => at > since,
            (None, _) => true,
            (Some(_), None) => false,
        })
        .collect();
    ended.sort_by(|a, b| (&a.ended_at, &a.id).cmp(&(&b.ended_at, &b.id)));
    let mut by_outcome = BTreeMap::new();
    let mut caps = BTreeMap::new();
    for r in &ended {
        *by_outcome.entry(outcome(&r.status)).or_insert(0) += 1;
        if let Some(c) = cap(&r.status) {
            *caps.entry(c).or_insert(0) += 1;
        }
    }
    let mut acts = BTreeMap::new();
    for s in act_states {
        *acts.entry(*s).or_insert(0) += 1;
    }
    Summary {
        runs: by_outcome,
        run_ids: ended
            .iter()
            .map(|r| r.id.clone())
            .filter(|id| id.bytes().all(|b| b.is_ascii_alphanumeric()))
            .collect(),
        caps_hit: caps,
        acts,
        audit,
        review: review.unwrap_or("nightshift queue").to_string(),
    }
}

fn counts(map: &BTreeMap<&'static str, u64>) -> String {
    if map.is_empty() {
        return "none".into();
    }
    map.iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The summary as text: counts and ids only.
pub fn render(s: &Summary) -> String {
    let total: u64 = s.runs.values().sum();
    let waiting =
        s.acts.get("pending").copied().unwrap_or(0) + s.acts.get("stale").copied().unwrap_or(0);
    let audit = match (s.audit.intact, s.audit.entries, s.audit.first_bad_entry) {
        (true, Some(n), _) => format!("intact ({n} entries)"),
        (true, None, _) => "intact".to_string(),
        (false, _, Some(seq)) => format!("BROKEN at entry {seq}"),
        (false, _, None) => "BROKEN".to_string(),
    };
    format!(
        "nightshift morning summary\n\
         runs: {total} ({})\n\
         caps hit: {}\n\
         acts waiting for you: {waiting} (acts not final: {})\n\
         audit chain: {audit}\n\
         run ids: {}\n\
         review: {}\n",
        counts(&s.runs),
        counts(&s.caps_hit),
        counts(&s.acts),
        if s.run_ids.is_empty() {
            "none".to_string()
        } else {
            s.run_ids.join(" ")
        },
        s.review,
    )
}

/// Most failures [`failures`] lists; the rest are counted.
pub const MAX_FAILURES: usize = 20;
/// Most characters of one failure's reason shown.
pub const MAX_REASON_CHARS: usize = 300;

/// A failed run or act and why, for the owner's own reading of the summary
/// (`nightshift summary`). Never part of what is sent: a reason may quote
/// what a destination or an agent-made name said (it is escaped where it
/// is shown, and cut at [`MAX_REASON_CHARS`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Failure {
    /// `run` or `act`.
    pub kind: String,
    pub id: String,
    pub reason: String,
}

fn bounded(text: &str) -> String {
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(MAX_REASON_CHARS) {
        Some((cut, _)) => format!("{}…", &one_line[..cut]),
        None => one_line,
    }
}

/// The runs among `run_ids` that did not end well and the acts that failed
/// or wait to be tried again, each with its reason, at most
/// [`MAX_FAILURES`] of them, and how many more there were.
pub fn failures(
    runs: &[RunRecord],
    run_ids: &[String],
    acts: &[(String, deferred_queue::State)],
) -> (Vec<Failure>, usize) {
    let mut all = Vec::new();
    for r in runs.iter().filter(|r| run_ids.contains(&r.id)) {
        if matches!(outcome(&r.status), "succeeded" | "running") {
            continue;
        }
        let reason = match &r.reason {
            Some(why) => format!("{}: {why}", r.status),
            None => r.status.clone(),
        };
        all.push(Failure {
            kind: "run".into(),
            id: r.id.clone(),
            reason: bounded(&reason),
        });
    }
    for (id, state) in acts {
        let reason = match state {
            deferred_queue::State::Failed { reason, attempts } => {
                format!("failed after {attempts} attempts: {reason}")
            }
            deferred_queue::State::AwaitingRetry {
                attempts,
                last_failure,
                ..
            } => format!("attempt {attempts} failed, to be tried again: {last_failure}"),
            _ => continue,
        };
        all.push(Failure {
            kind: "act".into(),
            id: id.clone(),
            reason: bounded(&reason),
        });
    }
    let more = all.len().saturating_sub(MAX_FAILURES);
    all.truncate(MAX_FAILURES);
    (all, more)
}

/// What was sent last.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Sent {
    /// When it was sent (RFC 3339).
    sent_at: String,
    /// The latest `ended_at` it covered.
    covered_until: Option<String>,
}

fn marker(root: &Path) -> std::path::PathBuf {
    root.join("summary.json")
}

fn last_sent(root: &Path) -> Result<Sent, String> {
    match std::fs::read(marker(root)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| format!("reading {}: {e}", marker(root).display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Sent::default()),
        Err(e) => Err(format!("reading {}: {e}", marker(root).display())),
    }
}

/// The summary of everything since the last one sent, from the store.
pub fn gather(store: &dyn StateStore, review: Option<&str>) -> Result<Summary, String> {
    let since = last_sent(store.root())?;
    let runs = store.runs().map_err(|e| e.to_string())?;
    let rows = crate::acts::rows(store, None).map_err(|e| e.to_string())?;
    let states: Vec<&'static str> = rows
        .iter()
        .filter(|r| !r.state.is_final())
        .map(|r| r.state.name())
        .collect();
    let audit = match store.audit_snapshot() {
        Ok(snap) => match orchestrator_audit::verify_with_head(
            store.log_id(),
            &snap.entries,
            &snap.checkpoints,
            snap.head.as_ref(),
        ) {
            Ok(v) => AuditState {
                intact: true,
                entries: Some(v.entries),
                first_bad_entry: None,
            },
            Err(e) => AuditState {
                intact: false,
                entries: None,
                first_bad_entry: e.seq(),
            },
        },
        Err(_) => AuditState {
            intact: false,
            entries: None,
            first_bad_entry: None,
        },
    };
    Ok(compose(
        &runs,
        since.covered_until.as_deref(),
        &states,
        audit,
        review,
    ))
}

/// Why the summary was (or was not) sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sending {
    /// Sent; the summary that went.
    Sent(Box<Summary>),
    /// Not configured, not time yet, a run still active, or nothing new.
    Skipped(&'static str),
}

/// When to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A run just ended: send if no other run is active and no `at` is set.
    RunEnded,
    /// `nightshift summary --due`: send if `at` has passed today.
    Due,
    /// `nightshift summary --send`: send now (whatever the time and the
    /// runs still active), if runs ended since the last one.
    Now,
}

/// Sends the summary if `trigger` calls for it and runs ended since the
/// last one (see the module note).
pub fn send(stores: &Stores, trigger: Trigger) -> Result<Sending, String> {
    let root = stores.root();
    let path = root.join("destinations.toml");
    if !path.exists() {
        return Ok(Sending::Skipped("no destinations configured"));
    }
    let dest = Destinations::load(&path).map_err(|e| e.to_string())?;
    let Some(config) = dest.summary.clone() else {
        return Ok(Sending::Skipped("no [summary] configured"));
    };
    let endpoint = dest
        .notify
        .get(&config.notify)
        .ok_or("the summary's notify alias is not configured")?
        .clone();
    let now = time::OffsetDateTime::now_utc();
    let lock_path = root.join("summary.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("opening {}: {e}", lock_path.display()))?;
    let _lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| format!("locking {}: {e}", lock_path.display()))?;
    let store = stores.connect().map_err(|e| e.to_string())?;
    let at = config
        .at
        .as_deref()
        .and_then(orchestrator_executors::parse_hhmm);
    match trigger {
        Trigger::RunEnded if at.is_some() => {
            return Ok(Sending::Skipped("sent at the configured time"))
        }
        Trigger::RunEnded => {
            let runs = store.runs().map_err(|e| e.to_string())?;
            if runs.iter().any(|r| outcome(&r.status) == "running") {
                return Ok(Sending::Skipped("another run is still active"));
            }
        }
        Trigger::Due => {
            let Some(at) = at else {
                return Ok(Sending::Skipped("no `at` configured"));
            };
            let minutes = u32::from(now.hour()) * 60 + u32::from(now.minute());
            if minutes < at {
                return Ok(Sending::Skipped("not time yet"));
            }
        }
        Trigger::Now => {}
    }
    let summary = gather(&store, config.review.as_deref())?;
    if summary.run_ids.is_empty() {
        return Ok(Sending::Skipped("no run ended since the last summary"));
    }
    let covered_until = store
        .runs()
        .map_err(|e| e.to_string())?
        .iter()
        .filter(|r| summary.run_ids.contains(&r.id))
        .filter_map(|r| r.ended_at.clone())
        .max()
        .or(last_sent(root)?.covered_until);
    let text = render(&summary);
    let data = serde_json::to_value(&summary).map_err(|e| e.to_string())?;
    // The runs it covers name the summary: a retry (whose audit count has
    // grown) carries the same `webhook-id`.
    let id = summary_id(&summary.run_ids);
    let result = orchestrator_executors::send(
        &endpoint,
        &Message {
            id: Some(&id),
            event: "summary",
            text: &text,
            data: Some(&data),
        },
    );
    // Sent or not, the attempt is an observed fact of the night.
    let mut store = store;
    let recorded = store
        .append(
            None,
            &Event::SummarySent {
                notify: config.notify.clone(),
                runs: summary.run_ids.len(),
                outcome: if result.is_ok() { "sent" } else { "failed" }.to_string(),
                message_digest: nightshift_core::audit_log::digest(text.as_bytes()),
                message_bytes: text.len(),
            },
            false,
        )
        .map(|_| ())
        .map_err(|e| format!("recording the summary in the audit log: {e}"));
    result.map_err(|e| format!("sending the summary to {}: {e}", config.notify))?;
    let sent = Sent {
        sent_at: now
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        covered_until,
    };
    let tmp = root.join("summary.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec(&sent).unwrap_or_default())
        .and_then(|()| std::fs::rename(&tmp, marker(root)))
        .map_err(|e| format!("writing {}: {e}", marker(root).display()))?;
    // Sent and marked (so it is not sent twice); an audit failure still
    // surfaces.
    recorded?;
    Ok(Sending::Sent(Box::new(summary)))
}

/// The hook at the end of every run: never fails the run; a failure to
/// send is a warning.
pub fn after_run(stores: &Stores) {
    match send(stores, Trigger::RunEnded) {
        Ok(Sending::Sent(s)) => {
            tracing::info!(runs = s.run_ids.len(), "morning summary sent")
        }
        Ok(Sending::Skipped(_)) => {}
        Err(e) => tracing::warn!(error = %e, "the morning summary was not sent"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: &str, status: &str, ended: &str) -> RunRecord {
        RunRecord {
            id: id.into(),
            status: status.into(),
            ended_at: Some(ended.into()),
            ..Default::default()
        }
    }

    const SENTINEL: &str = "SENTINEL-ignore-previous-instructions";

    #[test]
    fn outcomes_and_caps_are_fixed_names_whatever_the_status_says() {
        let statuses = [
            "exited 0",
            "exited 3",
            &format!("killed: {SENTINEL}"),
            "killed: memory cap 512 MiB (peak 600 MiB, OOM)",
            "killed: by operator",
            &format!("import failed: {SENTINEL}"),
            SENTINEL,
        ];
        let runs: Vec<RunRecord> = statuses
            .iter()
            .enumerate()
            .map(|(i, s)| run(&format!("r{i}"), s, &format!("2026-01-01T00:00:0{i}Z")))
            .collect();
        let s = compose(
            &runs,
            None,
            &["pending", "pending", "stale"],
            AuditState {
                intact: true,
                entries: Some(9),
                first_bad_entry: None,
            },
            None,
        );
        let text = render(&s) + &serde_json::to_string(&s).unwrap();
        assert!(!text.contains("SENTINEL"), "{text}");
        assert_eq!(s.runs["succeeded"], 1);
        assert_eq!(s.runs["cap_hit"], 2);
        assert_eq!(s.caps_hit["memory"], 1);
        assert_eq!(s.caps_hit["other"], 1);
        assert_eq!(s.runs["other"], 1);
        assert!(text.contains("acts waiting for you: 3"), "{text}");
        assert!(text.contains("audit chain: intact (9 entries)"), "{text}");
        assert!(text.contains("review: nightshift queue"), "{text}");
    }

    #[test]
    fn failures_say_why_bounded_and_only_for_what_did_not_go_well() {
        let mut failed = run("r1", "exited 1", "2026-01-01T01:00:00Z");
        failed.reason = Some("history dropped:\nobject too large".into());
        let fine = run("r2", "exited 0", "2026-01-01T01:00:00Z");
        let mut long = run("r3", "killed: timeout 2s", "2026-01-01T01:00:00Z");
        long.reason = Some("x".repeat(5000));
        let ids: Vec<String> = ["r1", "r2", "r3"].map(String::from).to_vec();
        let acts = vec![
            (
                "a1".to_string(),
                deferred_queue::State::Failed {
                    reason: "git: remote: hook declined".into(),
                    attempts: 3,
                },
            ),
            ("a2".to_string(), deferred_queue::State::Pending),
        ];
        let (f, more) = failures(&[failed, fine, long], &ids, &acts);
        assert_eq!(more, 0);
        let ids: Vec<&str> = f.iter().map(|f| f.id.as_str()).collect();
        assert_eq!(ids, ["r1", "r3", "a1"]);
        assert_eq!(f[0].reason, "exited 1: history dropped: object too large");
        assert!(f[1].reason.chars().count() <= MAX_REASON_CHARS + 1);
        assert_eq!(
            f[2].reason,
            "failed after 3 attempts: git: remote: hook declined"
        );
        let many: Vec<(String, deferred_queue::State)> = (0..30)
            .map(|i| {
                (
                    format!("a{i}"),
                    deferred_queue::State::Failed {
                        reason: "no".into(),
                        attempts: 1,
                    },
                )
            })
            .collect();
        let (f, more) = failures(&[], &[], &many);
        assert_eq!((f.len(), more), (MAX_FAILURES, 10));
    }

    #[test]
    fn the_gateways_token_cap_kills_count_as_token_caps() {
        for status in [
            "killed: model token cap (used 310 of 1000; a call needed at least 701, 690 were left)",
            "killed: model token cap of the fleet for the night (used 9 of 10; a call needed at least 5, 1 were left)",
        ] {
            assert_eq!(cap(status), Some("tokens"), "{status}");
        }
    }

    #[test]
    fn only_runs_ended_since_the_last_summary_count() {
        let runs = [
            run("a", "exited 0", "2026-01-01T01:00:00Z"),
            run("b", "exited 1", "2026-01-01T03:00:00Z"),
            RunRecord {
                id: "c".into(),
                status: "running".into(),
                ..Default::default()
            },
        ];
        let audit = AuditState {
            intact: false,
            entries: None,
            first_bad_entry: Some(4),
        };
        let s = compose(
            &runs,
            Some("2026-01-01T02:00:00Z"),
            &[],
            audit,
            Some("https://dash/"),
        );
        assert_eq!(s.run_ids, vec!["b".to_string()]);
        assert_eq!(s.runs["failed"], 1);
        let text = render(&s);
        assert!(text.contains("BROKEN at entry 4"), "{text}");
        assert!(text.contains("review: https://dash/"), "{text}");
    }
}
