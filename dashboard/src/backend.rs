//! What the dashboard asks of the supervisor, as one narrow module over the
//! library (`store`, `acts`, `policy`, `killswitch`, `owner`), which the
//! HTTP layer's routes call (`lib.rs` itself also reads the store's runs
//! and starts the act executor). What changes state is a translation into
//! the supervisor's command API ([`nightshift_supervisor::api::Command`]),
//! executed for the dashboard account (`Caller::Dashboard`) so the audit
//! names who decided (`tests/tests/dashboard_api.rs::the_audit_names_the_dashboard_account_that_decided`);
//! what reads builds the pages' views from the store.
//!
//! Invariants:
//! - Nothing here decides who may do what: the caller passes a [`Role`]
//!   already checked, and every owner act passes through
//!   [`require_owner`] again (defence in depth).
//! - The owner's key file: the commands built here name the path fixed when
//!   `serve` started (a request cannot name one), and they run for an
//!   owner's session alone
//!   (`tests/tests/dashboard_api.rs::every_state_changing_endpoint_refuses_without_session_owner_or_token`).
//!   The supervisor's API reads the file; no view here holds its content.
//! - Everything returned is raw data: the pages escape it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deferred_queue::{Content, State, Target};

use super::chain;
use super::guard::Role;
use super::risky::{self, risky_path};
use nightshift_core::state_store::{RunRecord, StateStore, StoreError, Stores};
use nightshift_supervisor::acts::{self, Row};
use nightshift_supervisor::api::{
    Api, ApiError, Caller, Command, KillRecord, KillReport, KillTarget, Outcome as DecisionOutcome,
    Reply,
};

/// How often `serve` walks the whole audit chain by default.
pub const DEFAULT_CHAIN_EVERY: Duration = Duration::from_secs(60);

/// Most bytes of a diff or of a run's output shown on a page.
pub const SHOWN_BYTES: usize = 256 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("only the owner may {0}")]
    NotOwner(&'static str),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    BadInput(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Failed(String),
    /// What the supervisor's API answered.
    #[error(transparent)]
    Api(ApiError),
}

pub fn require_owner(role: Role, what: &'static str) -> Result<(), BackendError> {
    if role == Role::Owner {
        Ok(())
    } else {
        Err(BackendError::NotOwner(what))
    }
}

/// Diffs by (repository, from, to).
type DiffCache = HashMap<(String, String, String), Arc<Diff>>;

/// What acts would publish by (repository, commit, destination), and when read.
type PublishesCache = HashMap<(String, String, String), (std::time::Instant, Arc<acts::Publishes>)>;

/// How long what an act would publish is kept before the destination is read again.
const PUBLISHES_KEPT: Duration = Duration::from_secs(60);

/// What `act` would publish from `commit` that its destination lacks,
/// cached for [`PUBLISHES_KEPT`] (the destination's refs are read over the
/// network).
fn publishes(
    backend: &Backend,
    store: &dyn StateStore,
    act: &deferred_queue::Act,
    repo: &str,
    commit: &str,
) -> Option<Arc<acts::Publishes>> {
    let key = (
        repo.to_string(),
        commit.to_string(),
        act.routing.destination.clone(),
    );
    let now = std::time::Instant::now();
    {
        let cache = backend.publishes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, p)) = cache.get(&key) {
            if now.duration_since(*at) < PUBLISHES_KEPT {
                return Some(p.clone());
            }
        }
    }
    let (held, against) = match acts::destinations(store) {
        Ok(dest) => acts::destination_holds(&dest, act),
        Err(why) => (
            Vec::new(),
            format!("every commit: the destinations could not be read: {why}"),
        ),
    };
    let p = Arc::new(acts::publishes(
        std::path::Path::new(repo),
        commit,
        &held,
        against,
    )?);
    let mut cache = backend.publishes.lock().unwrap_or_else(|p| p.into_inner());
    if cache.len() > 4096 {
        cache.clear();
    }
    cache.insert(key, (now, p.clone()));
    Some(p)
}

/// The process's one connection to the state, and where the owner key is.
#[derive(Debug, Clone)]
pub struct Backend {
    pub root: PathBuf,
    pub store: Arc<Mutex<Box<dyn StateStore>>>,
    pub owner_key: PathBuf,
    /// The supervisor's one command API: every state change goes through it.
    pub api: Api,
    /// Diffs by (repo, from, to): commits never change, so neither do they.
    diffs: Arc<Mutex<DiffCache>>,
    /// What an act would publish, by (repo, commit, destination), with when
    /// it was read: the destination's refs are read again after a minute.
    publishes: Arc<Mutex<PublishesCache>>,
    /// What the audit chain's checks established (`chain.rs`).
    chain: Arc<Mutex<chain::Memo>>,
    /// How often the whole chain is walked in the background.
    pub chain_every: Duration,
}

impl Backend {
    pub fn new(stores: Stores, owner_key: PathBuf) -> Result<Self, StoreError> {
        let root = stores.root().to_path_buf();
        let store = stores.connect()?;
        Ok(Backend {
            api: Api::new(stores, None),
            root,
            store: Arc::new(Mutex::new(store)),
            owner_key,
            diffs: Arc::default(),
            publishes: Arc::default(),
            chain: Arc::default(),
            chain_every: DEFAULT_CHAIN_EVERY,
        })
    }

    /// The configuration file the API reads (default `STATE/config.toml`).
    pub fn with_config(mut self, config: Option<PathBuf>) -> Self {
        self.api = Api::new(self.api.stores().clone(), config);
        self
    }

    pub fn with_store<T>(&self, f: impl FnOnce(&mut dyn StateStore) -> T) -> T {
        let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut **store)
    }
}

/// One changed file, with why something on the host might run it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ChangedFile {
    pub path: String,
    pub risky: Option<&'static str>,
}

/// The diff from a run's base to a commit: files, diffstat, patch text.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Diff {
    pub files: Vec<ChangedFile>,
    pub stat: Option<(u64, u64, u64)>,
    /// The patch as bytes (the page escapes it), cut at [`SHOWN_BYTES`].
    pub patch: Vec<u8>,
    /// The commits from the base, one `commit ID` line and the subject each.
    pub log: Vec<u8>,
    pub truncated: bool,
    pub error: Option<String>,
}

fn host_git(repo: &str) -> std::process::Command {
    let mut c = std::process::Command::new("git");
    c.arg("-C")
        .arg(repo)
        .args(["-c", "core.pager=cat", "-c", "core.quotepath=off"])
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(std::process::Stdio::null());
    c
}

/// The diff in the host repository (the host's git: no pager, no external
/// diff, no textconv; the ids are full commit ids the supervisor stored).
pub fn diff(backend: &Backend, repo: &str, from: &str, to: &str) -> Arc<Diff> {
    let key = (repo.to_string(), from.to_string(), to.to_string());
    if let Some(d) = backend
        .diffs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key)
    {
        return d.clone();
    }
    let d = Arc::new(compute_diff(repo, from, to));
    if d.error.is_none() {
        let mut cache = backend.diffs.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() > 4096 {
            cache.clear();
        }
        cache.insert(key, d.clone());
    }
    d
}

fn is_full_id(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn compute_diff(repo: &str, from: &str, to: &str) -> Diff {
    if !is_full_id(from) || !is_full_id(to) {
        return Diff {
            error: Some("no commit to compare".into()),
            ..Diff::default()
        };
    }
    let names = host_git(repo)
        .args([
            "diff",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
            "--no-renames",
            "-z",
            "--name-only",
            from,
            to,
        ])
        .output();
    let files: Vec<ChangedFile> = match names {
        Ok(out) if out.status.success() => out
            .stdout
            .split(|b| *b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| {
                let path = String::from_utf8_lossy(p).into_owned();
                ChangedFile {
                    risky: risky_path(&path),
                    path,
                }
            })
            .collect(),
        Ok(out) => {
            return Diff {
                error: Some(format!(
                    "git diff failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )),
                ..Diff::default()
            }
        }
        Err(e) => {
            return Diff {
                error: Some(format!("running git: {e}")),
                ..Diff::default()
            }
        }
    };
    // A dev container definition is read as the act would publish it: an
    // `initializeCommand` in it runs on the host itself (`risky_content`).
    let mut files = files;
    for f in files.iter_mut().filter(|f| risky::is_devcontainer(&f.path)) {
        let blob = host_git(repo)
            .args(["cat-file", "blob", &format!("{to}:{}", f.path)])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| o.stdout)
            .unwrap_or_default();
        if let Some(why) = risky::risky_content(&f.path, &blob[..blob.len().min(1 << 20)]) {
            f.risky = Some(why);
        }
    }
    let stat = orchestrator_git::diffstat_between(Path::new(repo), from, to).ok();
    let patch = host_git(repo)
        .args([
            "diff",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
            "--no-renames",
            "-p",
            from,
            to,
        ])
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    let truncated = patch.len() > SHOWN_BYTES;
    let log = host_git(repo)
        .args([
            "log",
            "--no-decorate",
            "--no-color",
            "--format=commit %H%n    %s",
            &format!("{from}..{to}"),
        ])
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    Diff {
        files,
        stat,
        log: log[..log.len().min(SHOWN_BYTES)].to_vec(),
        patch: patch[..patch.len().min(SHOWN_BYTES)].to_vec(),
        truncated,
        error: None,
    }
}

/// The outcome groups of the Morning page.
pub fn outcome(r: &RunRecord) -> &'static str {
    let s = r.status.as_str();
    if !nightshift_core::state_store::is_final(s) {
        "running"
    } else if matches!(
        nightshift_supervisor::run::import_state(r),
        nightshift_supervisor::run::ImportState::Failed
    ) {
        "import failed"
    } else if s.starts_with("killed") || s.contains("cap") || s.starts_with("timed out") {
        "killed"
    } else if s.starts_with("exited") && r.exit_code == Some(0) {
        "finished"
    } else {
        "failed"
    }
}

pub use super::chain::ChainState;

/// The audit chain's state for a Morning load: the entries appended since
/// the last check walked now, the whole chain in the background
/// ([`watch_chain`]); see `chain.rs`.
pub fn chain_state(backend: &Backend, store: &dyn StateStore) -> ChainState {
    chain::check_on_load(&backend.chain, store, backend.chain_every.as_secs())
}

/// Walks the whole chain every `backend.chain_every`, on a store handle of
/// its own, until the process ends.
pub async fn watch_chain(backend: Backend) {
    let store = match backend.api.stores().connect() {
        Ok(s) => Arc::new(Mutex::new(s)),
        Err(e) => {
            tracing::warn!(error = %e, "no background check of the audit chain");
            return;
        }
    };
    loop {
        let (memo, store2) = (backend.chain.clone(), store.clone());
        let _ = tokio::task::spawn_blocking(move || {
            let store = store2.lock().unwrap_or_else(|p| p.into_inner());
            chain::check_whole(&memo, &**store);
        })
        .await;
        tokio::time::sleep(backend.chain_every).await;
    }
}

/// The freeze in force, if any: its reason.
/// The freeze in force, as the banner says it: its reason and who froze.
pub fn freeze_state(store: &dyn StateStore) -> Result<Option<String>, BackendError> {
    let rules = nightshift_core::policy::load(store, None)
        .map_err(|e| BackendError::Failed(e.to_string()))?;
    Ok(rules
        .freeze()
        .map(|f| frozen_line(&f.reason, &f.authority, f.at.as_deref())))
}

/// A freeze's reason, authority (who froze: `dashboard:NAME`, `nightshift
/// freeze by USER`) and time, on one line.
pub fn frozen_line(reason: &str, authority: &str, at: Option<&str>) -> String {
    match at {
        Some(at) => format!("{reason} (frozen by {authority} at {at})"),
        None => format!("{reason} (frozen by {authority})"),
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Morning {
    pub since: String,
    pub runs: Vec<(String, RunRecord)>,
    pub by_outcome: Vec<(String, usize)>,
    pub acts_waiting: u64,
    pub acts_done: usize,
    pub refusals: Vec<RefusalView>,
    pub chain: ChainState,
    pub frozen: Option<String>,
    /// Model tokens since `since`, all runs together and per run (the
    /// runs with calls, most charged first).
    pub tokens: nightshift_gateway::CallsSummary,
    pub tokens_by_run: Vec<(String, nightshift_gateway::CallsSummary)>,
    /// Acts each run queued since `since` (its door requests answered
    /// `queued`), for the night's picture.
    pub acts_by_run: std::collections::BTreeMap<String, usize>,
    /// The runs a cap ended that may be continued, listed first with that
    /// choice (`continuation.rs`).
    pub capped: Vec<Capped>,
}

/// A run a continuable cap ended, as Morning lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Capped {
    pub run: String,
    pub task: Option<String>,
    pub status: String,
    /// The cap (a fixed name: `tokens`, `wall-clock`, `output`, `worktree`).
    pub cap: &'static str,
    /// Why it may not be continued now (already continued), else `None`:
    /// the choice is offered.
    pub not_now: Option<String>,
}

/// A run's continuation, as its page shows it: the choice (or why there
/// is none) and the links the audit holds both ways.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ContinueView {
    /// The cap that ended it, when it may be continued now.
    pub offer: Option<&'static str>,
    /// Why not, otherwise.
    pub why_not: Option<String>,
    /// The run this one continues.
    pub continues: Option<String>,
    /// The runs that continue this one.
    pub continued_as: Vec<String>,
    /// Continuation tasks queued for it (`continue_queued`), by id.
    pub queued: Vec<String>,
}

/// The continuation of `run`, given the queue's tasks and its audit
/// entries (kind, body): pure.
pub fn continue_view(
    run: &RunRecord,
    tasks: &[nightshift_supervisor::tasks::TaskRow],
    entries: &[(String, serde_json::Map<String, serde_json::Value>)],
) -> ContinueView {
    use nightshift_supervisor::continuation::{continuation, NewCaps};
    let named = |kind: &str, field: &str| -> Vec<String> {
        entries
            .iter()
            .filter(|(k, _)| k == kind)
            .filter_map(|(_, b)| b.get(field)?.as_str().map(str::to_string))
            .collect()
    };
    let (offer, why_not) = match continuation(run, tasks, &NewCaps::default()) {
        Ok((_, cap)) => (Some(cap), None),
        Err(why) => (None, Some(why)),
    };
    ContinueView {
        offer,
        why_not,
        continues: named("continues", "run").into_iter().next(),
        continued_as: named("continued_as", "run"),
        queued: named("continue_queued", "task"),
    }
}

/// The command that continues `run` with the caps the form gave (an empty
/// field: as before).
pub fn continue_run(
    run: &str,
    max_tokens: Option<&str>,
    timeout: Option<&str>,
) -> Result<Command, BackendError> {
    let max_tokens = match max_tokens.map(str::trim).filter(|t| !t.is_empty()) {
        None => None,
        Some(t) => Some(
            t.parse::<u64>()
                .map_err(|_| BackendError::BadInput(format!("max_tokens {t:?} is not a number")))?,
        ),
    };
    Ok(Command::Continue {
        run: run.to_string(),
        max_tokens,
        timeout: timeout
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string),
    })
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct RefusalView {
    pub run: String,
    pub time: String,
    pub door: String,
    pub destination: Option<String>,
    pub verdict: String,
    pub rule: Option<String>,
    /// Who or what refused it, in words (`Refusal::by`).
    pub by: String,
}

fn refusal_views(
    store: &dyn StateStore,
    run: Option<&str>,
    since: &str,
) -> Result<Vec<RefusalView>, BackendError> {
    Ok(acts::refusals(store, run)?
        .into_iter()
        .filter(|r| r.time.as_str() >= since)
        .map(|r| RefusalView {
            by: r.by(),
            run: r.run,
            time: r.time,
            door: r.door,
            destination: r.destination,
            verdict: r.verdict,
            rule: r.rule,
        })
        .collect())
}

/// RFC 3339 of `hours` ago.
pub fn hours_ago(hours: i64) -> String {
    let t = time::OffsetDateTime::now_utc() - time::Duration::hours(hours);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

pub fn morning(
    backend: &Backend,
    store: &dyn StateStore,
    since: &str,
) -> Result<Morning, BackendError> {
    let runs: Vec<RunRecord> = store
        .runs()?
        .into_iter()
        .filter(|r| {
            r.created_at.as_str() >= since || !nightshift_core::state_store::is_final(&r.status)
        })
        .collect();
    let mut counts: Vec<(String, usize)> = Vec::new();
    for r in &runs {
        let o = outcome(r);
        match counts.iter_mut().find(|(k, _)| k == o) {
            Some((_, n)) => *n += 1,
            None => counts.push((o.to_string(), 1)),
        }
    }
    let (_, waiting) = store.acts_in_states(&["pending", "stale"], 0, 0)?;
    let (_, done) = store.acts_in_states(&["done"], 0, 0)?;
    let calls = store.bodies_of_kind_since("model_call", since)?;
    let tokens = nightshift_gateway::summarize(calls.iter().map(|(_, b)| b));
    let mut per_run: std::collections::BTreeMap<String, Vec<&serde_json::Value>> =
        std::collections::BTreeMap::new();
    for (run, body) in &calls {
        per_run
            .entry(run.clone().unwrap_or_default())
            .or_default()
            .push(body);
    }
    let mut tokens_by_run: Vec<(String, nightshift_gateway::CallsSummary)> = per_run
        .into_iter()
        .map(|(run, bodies)| (run, nightshift_gateway::summarize(bodies)))
        .collect();
    tokens_by_run.sort_by_key(|t| std::cmp::Reverse(t.1.charged_tokens));
    let mut acts_by_run = std::collections::BTreeMap::new();
    for (run, body) in store.bodies_of_kind_since("door_request", since)? {
        if body["verdict"] == "queued" {
            *acts_by_run.entry(run.unwrap_or_default()).or_insert(0) += 1;
        }
    }
    let tasks = nightshift_supervisor::tasks::list(store).unwrap_or_default();
    let capped = runs
        .iter()
        .filter_map(|r| {
            let cap = nightshift_supervisor::continuation::continuable(r).ok()?;
            let not_now =
                nightshift_supervisor::continuation::continuation(r, &tasks, &Default::default())
                    .err();
            Some(Capped {
                run: r.id.clone(),
                task: r.task.clone(),
                status: r.status.clone(),
                cap,
                not_now,
            })
        })
        .collect();
    Ok(Morning {
        capped,
        acts_by_run,
        tokens,
        tokens_by_run,
        since: since.to_string(),
        runs: runs
            .into_iter()
            .map(|r| (outcome(&r).to_string(), r))
            .collect(),
        by_outcome: counts,
        acts_waiting: waiting,
        acts_done: done as usize,
        refusals: refusal_views(store, None, since)?,
        chain: chain_state(backend, store),
        frozen: freeze_state(store)?,
    })
}

/// One act as the Queue and Run pages show it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ActView {
    pub id: String,
    pub run: String,
    pub door: &'static str,
    pub state: String,
    /// The state's detail: why stale, rejected (and by whom), the outcome.
    pub detail: Option<String>,
    pub destination: String,
    pub target: String,
    pub commit: Option<String>,
    pub rules: Vec<String>,
    pub label: Option<String>,
    /// Pull request title and body, or a message body: shown whole.
    pub text: Option<String>,
    #[serde(skip)]
    pub diff: Option<Arc<Diff>>,
    /// A push or pull request: every commit it would publish that the
    /// destination does not hold yet.
    #[serde(skip)]
    pub publishes: Option<Arc<acts::Publishes>>,
    /// When it was queued and when its approval window closes, unix seconds.
    pub queued_at: i64,
    pub expires_at: i64,
    /// The same, as the page says them now ("queued 3 h 5 min ago",
    /// "expires in 20 h 55 min").
    pub age: String,
    pub expiry: String,
}

/// A span of seconds as a person reads it: `3 h 5 min`, `12 min`, `40 s`.
pub fn span(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min", s / 60),
        3600..=86_399 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

/// An act's age and expiry at `now`, as [`ActView::age`] and
/// [`ActView::expiry`] say them.
pub fn age_and_expiry(queued_at: i64, expires_at: i64, now: i64) -> (String, String) {
    let age = format!("queued {} ago", span(now - queued_at));
    let expiry = if expires_at > now {
        format!("expires in {}", span(expires_at - now))
    } else {
        format!("approval window closed {} ago", span(now - expires_at))
    };
    (age, expiry)
}

fn state_detail(s: &State) -> Option<String> {
    match s {
        State::Stale { why } => Some(why.clone()),
        State::Rejected { why, by } => Some(format!("{why} (by {by})")),
        State::Expired { why } => Some(why.clone()),
        State::Done { outcome, .. } => Some(outcome.clone()),
        State::Failed { reason, .. } => Some(reason.clone()),
        State::AwaitingRetry { last_failure, .. } => Some(last_failure.clone()),
        _ => None,
    }
}

pub fn act_view(backend: &Backend, store: &dyn StateStore, row: &Row, with_diff: bool) -> ActView {
    let (target, commit) = match (&row.act.routing.target, &row.act.content) {
        (Target::Push { target_ref, .. }, Content::Commit { commit }) => {
            (target_ref.clone(), Some(commit.clone()))
        }
        (Target::PullRequest { base_ref, head_ref }, Content::PullRequest { head_commit, .. }) => (
            format!("{head_ref} into {base_ref}"),
            Some(head_commit.clone()),
        ),
        (Target::Message { endpoint }, _) => (endpoint.clone(), None),
        _ => (String::new(), None),
    };
    let text = match &row.act.content {
        Content::PullRequest { .. } => {
            let v: serde_json::Value =
                serde_json::from_slice(row.content.as_deref().unwrap_or_default())
                    .unwrap_or_default();
            Some(format!(
                "title: {}\n\n{}",
                v["title"].as_str().unwrap_or_default(),
                v["body"].as_str().unwrap_or_default()
            ))
        }
        Content::Message { .. } => {
            let view = acts::body_view(row.content.as_deref().unwrap_or_default());
            Some(view.shown.join("\n"))
        }
        Content::Commit { .. } => None,
    };
    let diff = match (&commit, with_diff) {
        (Some(c), true) => store
            .run(&row.act.run)
            .ok()
            .and_then(|run| run.base_commit.clone().map(|b| (run.repo, b)))
            .map(|(repo, base)| diff(backend, &repo, &base, c)),
        _ => None,
    };
    let publishes = match (&commit, with_diff) {
        (Some(c), true) => store
            .run(&row.act.run)
            .ok()
            .and_then(|run| publishes(backend, store, &row.act, &run.repo, c)),
        _ => None,
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    let (age, expiry) = age_and_expiry(row.act.created_at, row.act.expires_at, now);
    ActView {
        queued_at: row.act.created_at,
        expires_at: row.act.expires_at,
        age,
        expiry,
        id: row.act.id.clone(),
        run: row.act.run.clone(),
        door: row.act.door.name(),
        state: row.state.name().to_string(),
        detail: state_detail(&row.state),
        destination: row.act.routing.destination.clone(),
        target,
        commit,
        rules: row.act.deciding_rules.clone(),
        label: None,
        text,
        diff,
        publishes,
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct QueuePage {
    pub page: u64,
    pub per_page: u64,
    pub total: u64,
    pub acts: Vec<ActView>,
}

/// Pending and stale acts, oldest first, one page.
pub fn queue(
    backend: &Backend,
    store: &dyn StateStore,
    page: u64,
    per_page: u64,
) -> Result<QueuePage, BackendError> {
    let per_page = per_page.clamp(1, 200);
    let offset = page
        .checked_mul(per_page)
        .filter(|o| i64::try_from(*o).is_ok())
        .ok_or_else(|| {
            BackendError::BadInput(format!("page {page}: past any page there can be"))
        })?;
    let (rows, total) = store.acts_in_states(&["pending", "stale"], offset, per_page)?;
    let mut acts = Vec::new();
    for (act, state, content) in rows {
        let row = Row {
            act: serde_json::from_value(act)
                .map_err(|e| BackendError::Failed(format!("act: {e}")))?,
            state: serde_json::from_value(state)
                .map_err(|e| BackendError::Failed(format!("act state: {e}")))?,
            content,
        };
        acts.push(act_view(backend, store, &row, true));
    }
    Ok(QueuePage {
        page,
        per_page,
        total,
        acts,
    })
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct RunView {
    pub run: RunRecord,
    /// The run's model calls and tokens against its cap.
    pub model: nightshift_gateway::CallsSummary,
    pub acts: Vec<ActView>,
    pub refusals: Vec<RefusalView>,
    pub audit: Vec<serde_json::Value>,
    #[serde(skip)]
    pub diff: Option<Arc<Diff>>,
    #[serde(skip)]
    pub output: Vec<u8>,
    pub output_truncated: bool,
    /// Its continuation: the choice and the links both ways.
    pub continuation: ContinueView,
}

pub fn output_path(store: &dyn StateStore, run: &str) -> PathBuf {
    nightshift_core::state_store::StatePaths::new(store.root().to_path_buf())
        .run_dir(run)
        .join("output.log")
}

/// The last [`SHOWN_BYTES`] of a run's output, and whether there was more.
pub fn output_tail(path: &Path) -> (Vec<u8>, bool) {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return (Vec::new(), false);
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(SHOWN_BYTES as u64);
    let mut buf = Vec::new();
    if f.seek(SeekFrom::Start(start)).is_ok() {
        let _ = f.take(SHOWN_BYTES as u64).read_to_end(&mut buf);
    }
    (buf, start > 0)
}

pub fn run_view(
    backend: &Backend,
    store: &dyn StateStore,
    id: &str,
) -> Result<RunView, BackendError> {
    let run = match store.run(id) {
        Ok(r) => r,
        Err(StoreError::NoSuchRun(_)) => {
            return Err(BackendError::NotFound(format!("no run with id {id}")))
        }
        Err(e) => return Err(e.into()),
    };
    let acts = acts::rows(store, None)?
        .iter()
        .filter(|r| r.act.run == id)
        .map(|r| act_view(backend, store, r, false))
        .collect();
    let entries = store.entries_for_run(id)?;
    let calls: Vec<serde_json::Value> = entries
        .iter()
        .filter(|e| e.kind == "model_call")
        .map(|e| serde_json::Value::Object(e.body.clone()))
        .collect();
    let model = nightshift_gateway::summarize(&calls);
    let continuation = continue_view(
        &run,
        &nightshift_supervisor::tasks::list(store).unwrap_or_default(),
        &entries
            .iter()
            .map(|e| (e.kind.clone(), e.body.clone()))
            .collect::<Vec<_>>(),
    );
    let audit = entries
        .iter()
        .map(|e| serde_json::json!({"seq": e.seq, "time": e.time, "kind": e.kind, "body": e.body, "hash": e.hash}))
        .collect();
    let diff = match (&run.base_commit, &run.result_commit) {
        (Some(b), Some(c)) => Some(diff(backend, &run.repo, b, c)),
        _ => None,
    };
    let (output, output_truncated) = output_tail(&output_path(store, id));
    Ok(RunView {
        model,
        refusals: refusal_views(store, Some(id), "")?,
        run,
        acts,
        audit,
        diff,
        output,
        output_truncated,
        continuation,
    })
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct PolicyView {
    pub generation: String,
    pub frozen: Option<String>,
    pub active: Vec<serde_json::Value>,
    pub pending: Vec<(String, String)>,
    /// Each pending proposal whole, with what it would change
    /// (`api::PolicyView::proposals`).
    pub proposals: Vec<serde_json::Value>,
    /// The agents' rules a freeze suspends.
    pub suspended: Vec<serde_json::Value>,
}

/// The Policy page's view: `policy list`'s, as the command API builds it.
pub fn policy_view(store: &dyn StateStore) -> Result<PolicyView, BackendError> {
    let v = nightshift_supervisor::api::policy_view(store, None, None)
        .map_err(|e| BackendError::Failed(e.to_string()))?;
    Ok(PolicyView {
        generation: v.generation,
        frozen: v
            .frozen
            .map(|(reason, by)| frozen_line(&reason, &by, v.frozen_at.as_deref())),
        active: v.active,
        pending: v.pending,
        proposals: v.proposals,
        suspended: v.suspended,
    })
}

/// The result of one decision, as the page shows it without reloading.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outcome {
    pub act: String,
    pub ok: bool,
    pub state: String,
    pub line: String,
}

/// One act's state as a decision's outcome shows it (`GET
/// /api/v1/acts/{id}`): the page follows an approved act this way until
/// serve's executor has carried it out.
pub fn act_outcome(store: &dyn StateStore, id: &str) -> Result<Outcome, BackendError> {
    let row = acts::rows(store, Some(id))?
        .pop()
        .ok_or_else(|| BackendError::NotFound(format!("no act with id {id}")))?;
    Ok(Outcome {
        act: id.to_string(),
        state: row.state.name().to_string(),
        ok: !matches!(
            row.state,
            deferred_queue::State::Failed { .. }
                | deferred_queue::State::Expired { .. }
                | deferred_queue::State::Stale { .. }
        ),
        line: acts::line_of(&row),
    })
}

fn state_of(store: &dyn StateStore, id: &str) -> String {
    acts::rows(store, Some(id))
        .ok()
        .and_then(|mut r| r.pop())
        .map(|r| r.state.name().to_string())
        .unwrap_or_default()
}

/// Carries out one command of the supervisor's API for a dashboard
/// account, recorded under its name (`dashboard:NAME`). On a blocking
/// thread with its own executor: the kill switch's futures hold a store
/// across awaits, so they are not `Send`.
pub async fn execute(
    backend: &Backend,
    role: Role,
    user: &str,
    what: &'static str,
    command: Command,
) -> Result<Reply, BackendError> {
    require_owner(role, what)?;
    let api = backend.api.clone();
    let caller = Caller::Dashboard {
        user: user.to_string(),
    };
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || handle.block_on(api.execute_as(command, &caller)))
        .await
        .map_err(|e| BackendError::Failed(e.to_string()))?
        .map_err(BackendError::Api)
}

/// The command that approves `acts` with the owner's key of this `serve`.
pub fn approve(backend: &Backend, acts: Vec<String>) -> Command {
    Command::Approve {
        acts,
        owner_key_file: Some(backend.owner_key.clone()),
    }
}

/// The command that rejects `acts`; a rejection needs a reason.
pub fn reject(backend: &Backend, acts: Vec<String>, why: &str) -> Result<Command, BackendError> {
    if why.trim().is_empty() {
        return Err(BackendError::BadInput("a rejection needs a reason".into()));
    }
    Ok(Command::Reject {
        acts,
        why: why.to_string(),
        owner_key_file: Some(backend.owner_key.clone()),
    })
}

/// The command that approves every pending act carrying exactly `commit`.
pub fn approve_commit(backend: &Backend, commit: &str) -> Command {
    Command::ApproveCommit {
        commit: commit.to_string(),
        owner_key_file: Some(backend.owner_key.clone()),
    }
}

/// The command that freezes, with a reason (one is given when none is).
pub fn freeze(why: &str) -> Command {
    let why = if why.trim().is_empty() {
        "frozen from the dashboard"
    } else {
        why
    };
    Command::Freeze {
        why: why.to_string(),
    }
}

pub fn thaw(backend: &Backend) -> Command {
    Command::Thaw {
        owner_key_file: Some(backend.owner_key.clone()),
    }
}

pub fn ratify(backend: &Backend, proposal: &str) -> Command {
    Command::Ratify {
        proposal: proposal.to_string(),
        owner_key_file: Some(backend.owner_key.clone()),
        rules: None,
    }
}

/// Each decision of a reply, with the act's state after it.
pub fn outcomes(store: &dyn StateStore, reply: Reply) -> Result<Vec<Outcome>, BackendError> {
    let Reply::Decisions { decisions } = reply else {
        return Err(BackendError::Failed(format!(
            "the supervisor answered a decision with {reply:?}"
        )));
    };
    Ok(decisions
        .into_iter()
        .map(|d| {
            let (ok, line) = match d.outcome {
                DecisionOutcome::Done { line, carried_out } => (carried_out, line),
                DecisionOutcome::Error(e) => (false, e.message),
            };
            Outcome {
                state: state_of(store, &d.act),
                act: d.act,
                ok,
                line,
            }
        })
        .collect())
}

/// The kill switch from the dashboard: every sandbox of this state (or one
/// run's) stopped through the engine, then recorded under the account's
/// name and the reason; with `freeze_too`, no new run starts.
pub async fn kill(
    backend: &Backend,
    role: Role,
    user: &str,
    run: Option<&str>,
    freeze_too: bool,
    why: &str,
) -> Result<Vec<String>, BackendError> {
    let by = format!("dashboard:{user}: {why}");
    let target = match run {
        Some(r) => KillTarget::Run(r.to_string()),
        None => KillTarget::All,
    };
    // The freeze first (with the account's reason): nothing new starts
    // while the sandboxes are being stopped.
    if freeze_too {
        execute(backend, role, user, "freeze", freeze(why)).await?;
    }
    let command = Command::Kill {
        freeze: false,
        target,
        by,
    };
    let reply = execute(backend, role, user, "use the kill switch", command).await?;
    let runs = match reply {
        Reply::Killed(KillReport {
            record: KillRecord::Recorded { runs },
            ..
        }) => runs,
        Reply::Killed(KillReport {
            record: KillRecord::Pending { .. },
            ..
        }) => Vec::new(),
        Reply::Killed(KillReport {
            record: KillRecord::NotRecorded(e),
            ..
        }) => return Err(BackendError::Api(e)),
        other => {
            return Err(BackendError::Failed(format!(
                "the supervisor answered the kill switch with {other:?}"
            )))
        }
    };
    Ok(runs)
}
