//! Acts: the door's requests, the gate, the deferred queue's store, and the
//! carrying out of approved acts with credentials no sandbox held.
//!
//! Invariants:
//! - Every request passes, in order: the freeze, routing (the destination is
//!   an alias the owner configured), labels (agent-made content is
//!   untrusted; private content never goes to a public destination), and the
//!   policy. Every verdict is an audit entry holding digests, never content
//!   (`a_freeze_refuses_and_is_audited`,
//!   `an_unconfigured_destination_is_refused_and_audited`,
//!   `a_private_repository_never_reaches_public_readers`,
//!   `tests/tests/run.rs::the_audit_holds_no_content`).
//! - Content agent-made is untrusted, so nothing is carried out without a
//!   person: an allowing rule still queues the act, unless it is an
//!   autonomy scope the owner ratified for exactly that kind of act
//!   (`policies::scopes::judge`): then the act is approved ahead of time
//!   under the scope and carried out like any approved act (re-checked by an
//!   executor holding the act's lease), its door request naming the scope as
//!   deciding rule.
//! - In a dry run nothing is queued or carried out: each request is answered
//!   as it would have been (refused, queued with a dry-run id `d...`, done)
//!   and recorded with its would-be verdict (`report::record_dry_act`).
//! - What an act carries is bound when it is requested: a push's or pull
//!   request's commit is the one the request names, taken from the pack the
//!   agent sent with it (scanned against the import limits before anything
//!   inflates it, indexed in a scratch directory of the supervisor's,
//!   hash-checked, and required to reference only objects of the pack or
//!   reachable from the run's base commit: never another branch's or
//!   anything else the host alone holds, refused with the same reply as an
//!   id nobody has) and copied into the host repository under
//!   `refs/nightshift/acts/<id>`; a message's body is kept in the state
//!   store and bound by its digest
//!   (`orchestrator/git/src/import/pack.rs::tests::a_commit_referencing_host_only_objects_is_refused_as_an_unknown_id_is`,
//!   `tests/tests/packs.rs::a_merge_onto_a_host_only_commit_is_refused_as_an_unknown_id_is`,
//!   `tests/tests/packs.rs::delta_bombs_are_refused_before_inflating_and_the_run_goes_on`).
//! - What the owner is shown of a push or pull request is every commit it
//!   would publish that the destination does not hold yet ([`publishes`]:
//!   the destination's refs read at the time), not only the change after
//!   the run's base (`tests/tests/packs.rs::queue_show_lists_every_commit_an_act_would_publish`).
//! - Nothing here reads the run's worktree: while the sandbox runs, its
//!   tree is never opened, listed or deleted from by path. A deletion (the
//!   all-zero commit) reads nothing at all; after the policy it is refused
//!   (`nightshift:delete`), since no executor carries deletions out yet
//!   (`a_deletion_is_refused_after_the_policy_and_reads_nothing`,
//!   `tests/tests/door_races.rs::a_fanout_directory_swapped_for_a_symlink_deletes_nothing_on_the_host`).
//! - Replies are phrased for the agent and name no host path.
//! - Every queue transition is written with its audit entry in one
//!   transaction, conditioned on the state it moves from. A person's
//!   decision (approve, reject, rebind) is one such transaction and carries
//!   nothing out; the executor ([`executor`]) does, holding the act's lease
//!   in the store. An approved act is re-checked by the executor immediately
//!   before it is carried out: a changed destination (the push's lease), or
//!   a rule in force that
//!   now refuses the act, makes it stale instead of executing. A rule change
//!   that does not refuse it (another run's tier-1 rule, a freeze and thaw)
//!   stales nothing; while frozen, nothing is approved or carried out.
//! - A stale act is left only by a person: rejected, or re-bound (a new
//!   pending act with the same content bound to the destination as it is
//!   now), which needs one more approval; nothing is carried out against a
//!   state nobody approved
//!   (`tests/tests/stale.rs::a_moved_remote_is_stale_shown_rebound_and_carried_out_exactly_once`,
//!   `an_act_a_rule_now_refuses_goes_stale_and_is_not_carried_out`).

pub mod dry;
pub mod executor;

use std::path::{Path, PathBuf};

use deferred_queue::{Act, Content, Door, Routing, State, Target};
use orchestrator_executors::{Destinations, Readers};
use sandbox_image_door::message::{Request, Response};
use serde_json::json;

use nightshift_core::audit_log::{digest, Event};
use nightshift_core::owner;
use nightshift_core::state_store::{StateStore, StoreError, Stores};

/// Where the owner's destinations are configured.
pub fn destinations_path<S: StateStore + ?Sized>(store: &S) -> PathBuf {
    store.root().join("destinations.toml")
}

pub fn destinations<S: StateStore + ?Sized>(store: &S) -> Result<Destinations, String> {
    let path = destinations_path(store);
    if !path.exists() {
        return Ok(Destinations::default());
    }
    Destinations::load(&path).map_err(|e| e.to_string())
}

/// The most acts one run may request; past it every request is refused.
pub const MAX_ACTS_PER_RUN: u64 = 200;
/// The queue's (pending, approval) lifetimes of this process: set once from
/// the one configuration the process loaded and checked ([`use_queue_ttls`]),
/// never read again from whatever file is at `STATE/config.toml`.
static QUEUE_TTLS: std::sync::OnceLock<(i64, i64)> = std::sync::OnceLock::new();

/// The queue's bounds of this process, set once like [`QUEUE_TTLS`].
static QUEUE_BOUNDS: std::sync::OnceLock<nightshift_core::config::QueueBounds> =
    std::sync::OnceLock::new();

/// Sets the queue's bounds from the process's configuration
/// ([`nightshift_core::config::Config::queue_bounds`]); the first call wins.
pub fn use_queue_bounds(bounds: nightshift_core::config::QueueBounds) {
    let _ = QUEUE_BOUNDS.set(bounds);
}

fn queue_bounds() -> nightshift_core::config::QueueBounds {
    *QUEUE_BOUNDS.get_or_init(|| nightshift_core::config::Config::default().queue_bounds())
}

/// The start of the night `unix_seconds` belongs to (noon UTC), RFC 3339.
pub fn night_start(unix_seconds: i64) -> String {
    let start = (unix_seconds - 12 * 3600).div_euclid(86_400) * 86_400 + 12 * 3600;
    time::OffsetDateTime::from_unix_timestamp(start)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into())
}

/// The refusal of a new act past any of its bounds: the run's
/// [`MAX_ACTS_PER_RUN`], then the queue's per night and per repository.
pub fn act_bound_refusal(
    bounds: nightshift_core::config::QueueBounds,
    counts: nightshift_core::state_store::ActCounts,
) -> Option<(&'static str, String)> {
    if counts.of_run >= MAX_ACTS_PER_RUN {
        return Some((
            "nightshift:rate-cap",
            format!(
                "this run has requested {} acts, the most one run may",
                counts.of_run
            ),
        ));
    }
    queue_bound_refusal(bounds, counts.tonight, counts.of_repository)
}

/// The refusal of a request past one of the queue's bounds, if any:
/// `tonight` acts requested tonight by every run, `of_repository` by the
/// runs of this run's repository.
pub fn queue_bound_refusal(
    bounds: nightshift_core::config::QueueBounds,
    tonight: u64,
    of_repository: u64,
) -> Option<(&'static str, String)> {
    if tonight >= bounds.per_night {
        return Some((
            "nightshift:queue-night",
            format!(
                "all runs together have requested {tonight} acts tonight, the most a night may \
                 ([queue] max_acts_per_night = {})",
                bounds.per_night
            ),
        ));
    }
    if of_repository >= bounds.per_repository {
        return Some((
            "nightshift:queue-repository",
            format!(
                "this repository's runs have requested {of_repository} acts tonight, the most one \
                 repository may ([queue] max_acts_per_repository = {})",
                bounds.per_repository
            ),
        ));
    }
    None
}

/// Sets the queue's lifetimes from the process's configuration
/// ([`nightshift_core::config::Config::queue_ttls`]); the first call wins.
pub fn use_queue_ttls(ttls: (i64, i64)) {
    let _ = QUEUE_TTLS.set(ttls);
}

/// (pending, approval) lifetimes: the process's configuration's, or the
/// documented defaults of an absent configuration when none was set (a
/// library user that loaded none).
fn ttls<S: StateStore + ?Sized>(_store: &S) -> (i64, i64) {
    *QUEUE_TTLS.get_or_init(|| nightshift_core::config::Config::default().queue_ttls())
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// What one run's door needs to decide.
#[derive(Debug, Clone)]
pub struct RunDoor {
    pub run: String,
    pub repo: PathBuf,
    pub base_commit: String,
    /// The label of everything this run's agent produces (see
    /// [`run_content_label`]).
    pub content: policies::Label,
    /// A dry run: each act is answered as it would have been and recorded
    /// with its would-be verdict, never queued or carried out.
    pub dry_run: bool,
    /// The end-of-run packer's door: where the run's result goes. `None`
    /// on an agent's door, which refuses a result (`run::packer`).
    pub result: Option<std::sync::Arc<crate::landing::Slot>>,
}

/// The repository a run works on as rules name it: its canonical path (the
/// path as given when it cannot be resolved).
pub fn repository_key(path: &Path) -> String {
    path.canonicalize()
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

/// The repository of an act's run, as [`repository_key`] names it.
pub fn act_repository<S: StateStore + ?Sized>(store: &S, act: &Act) -> String {
    store
        .run(&act.run)
        .map(|r| repository_key(Path::new(&r.repo)))
        .unwrap_or_default()
}

/// The label of what a run's agent produces: the join of its inputs'
/// labels. The repository's content has the confidentiality the owner gave
/// it and is trusted; the task text is the owner's (trusted, public); the
/// agent's own output is untrusted. Nothing improves a label: whatever the
/// agent derives from these carries at least this join.
pub fn run_content_label(repo: policies::Confidentiality) -> policies::Label {
    use policies::{Confidentiality, Integrity, Label};
    let repository = Label::new(Integrity::Trusted, repo);
    let task = Label::new(Integrity::Trusted, Confidentiality::Public);
    let agent = Label::new(Integrity::Untrusted, Confidentiality::Public);
    repository.join(task).join(agent)
}

/// What arrived with a request that carries objects: a scratch directory
/// the supervisor owns (removed by the door once the request is answered)
/// and the pack in it, if one was sent.
#[derive(Debug, Clone)]
pub struct Received {
    pub dir: PathBuf,
    pub pack: Option<PathBuf>,
}

fn refused(rule: &str, reason: impl Into<String>) -> Response {
    Response::Refused {
        rule: rule.to_string(),
        reason: reason.into(),
    }
}

fn request_digest(req: &Request) -> String {
    digest(&serde_json::to_vec(req).unwrap_or_default())
}

fn destination_of(req: &Request) -> Option<&str> {
    match req {
        Request::Push { remote, .. } | Request::PullRequest { remote, .. } => Some(remote),
        Request::Notify { destination, .. } => Some(destination),
        Request::Ask { .. } | Request::PolicyCheck { .. } | Request::Result { .. } => None,
    }
}

/// The readers of the destination a request names, when the owner
/// configured it. A pull request's commit lands on the forge and on the git
/// remote that holds its branches: the wider readership of the two counts.
/// A question stays with the owner (private readers).
fn destination_readers(dest: &Destinations, req: &Request) -> Option<Readers> {
    match req {
        Request::Push { remote, .. } => dest.remotes.get(remote).map(|r| r.readers),
        Request::PullRequest { remote, .. } => {
            dest.forges
                .get(remote)
                .map(|f| match dest.remotes.get(&f.remote).map(|r| r.readers) {
                    Some(Readers::Private) | None => f.readers,
                    Some(Readers::Public) => Readers::Public,
                })
        }
        Request::Notify { destination, .. } => dest.notify.get(destination).map(|n| n.readers),
        Request::Ask { .. } => Some(Readers::Private),
        Request::PolicyCheck { .. } | Request::Result { .. } => None,
    }
}

/// Routing and labels, through the policy engine's pure gate: the
/// destination is an owner-configured alias (its value is the owner's; the
/// agent only chooses among them, so the routing is trusted), and the run's
/// content label may flow to its readers. Returns the gate's verdict: ask
/// for untrusted content (every agent's), refuse naming the labels.
pub fn route_and_label(
    dest: &Destinations,
    req: &Request,
    content: policies::Label,
) -> Result<policies::GateVerdict, Response> {
    let alias = destination_of(req).unwrap_or("morning").to_string();
    let mut known = policies::Destinations::new();
    if let Some(readers) = destination_readers(dest, req) {
        known.insert(alias.clone(), policies::Destination { readers });
    }
    let routing = policies::Labelled::new(alias.clone(), policies::Label::BOTTOM);
    let verdict = policies::gate(&known, &routing, content);
    match &verdict.reason {
        policies::GateReason::UnknownAlias { .. }
        | policies::GateReason::RawUrl { .. }
        | policies::GateReason::RawPath { .. } => Err(refused(
            "nightshift:routing",
            format!(
                "{alias:?} is not a destination the owner configured for {}; destinations are aliases, never URLs or paths",
                req.door()
            ),
        )),
        policies::GateReason::PrivateToPublic { .. } => Err(refused(
            "nightshift:labels",
            format!(
                "content labelled {} may not go to {alias:?}, whose readers are public",
                label_text(content)
            ),
        )),
        _ if verdict.verdict == policies::Verdict::Refuse => {
            Err(refused("nightshift:labels", verdict.reason.to_string()))
        }
        _ => Ok(verdict),
    }
}

pub use nightshift_core::policy::label_text;

/// Decides one door request and, when a person must decide, queues it.
pub fn handle<S: StateStore + ?Sized>(
    store: &mut S,
    door: &RunDoor,
    req: Request,
    received: Option<&Received>,
) -> Response {
    let req_digest = request_digest(&req);
    let bytes = serde_json::to_vec(&req)
        .map(|v| v.len() as u64)
        .unwrap_or(0);
    let mut seen = Seen {
        dry_id: door
            .dry_run
            .then(|| format!("d{}", ulid::Ulid::new().to_string().to_lowercase())),
        ..Seen::default()
    };
    let answer = decide(store, door, &req, received, &mut seen);
    if let Some(dry_id) = &seen.dry_id {
        if let Err(e) = dry::record_dry_act(store, door, &req, dry_id, &seen, &answer) {
            return Response::Error {
                reason: format!("the supervisor could not record the request: {e}"),
            };
        }
    }
    let (verdict, rule, act) = match &answer {
        Response::Refused { rule, .. } => ("refused", Some(rule.clone()), None),
        Response::Asks { rule, .. } => ("asks", Some(rule.clone()), None),
        Response::Queued { act } => ("queued", seen.deciding_rule.clone(), Some(act.clone())),
        Response::Done { .. } => (
            "done",
            seen.deciding_rule.clone(),
            seen.carried.clone().or_else(|| seen.dry_id.clone()),
        ),
        Response::Error { .. } => ("error", None, None),
    };
    let audited = store.append(
        Some(&door.run),
        &Event::DoorRequest {
            door: req.door().to_string(),
            destination: destination_of(&req).map(str::to_string),
            verdict: verdict.to_string(),
            rule,
            act,
            digest: req_digest,
            bytes,
            label: Some(label_text(door.content)),
            gate: seen.gate.clone(),
            reason: matches!(answer, Response::Error { .. }).then(|| "gate_error".to_string()),
        },
        false,
    );
    if let (Ok(_), Response::Queued { act }) = (&audited, &answer) {
        tracing::info!(act = %act, run = %door.run, "act queued")
    }
    match audited {
        Ok(_) => answer,
        // An act that cannot be audited is not queued for anyone to trust.
        Err(e) => Response::Error {
            reason: format!("the supervisor could not record the request: {e}"),
        },
    }
}

/// The arguments the policy sees: every field the door schema
/// (`policies::doors::DOORS`) names for the request's door, and no content.
/// `repository` is the run's host repository ([`repository_key`]).
pub fn policy_args(req: &Request, repository: &str) -> serde_json::Value {
    let mut args = match req {
        Request::Push {
            remote,
            dst_ref,
            claimed_commit,
            force,
            delete,
            ..
        } => json!({
            "remote": remote,
            "ref": dst_ref,
            "commit": claimed_commit,
            "force": force,
            "delete": delete,
        }),
        Request::PullRequest {
            remote,
            base,
            head,
            head_commit,
            ..
        } => json!({"remote": remote, "base": base, "head": head, "commit": head_commit}),
        Request::Notify { destination, .. } => json!({"destination": destination}),
        Request::Ask { .. } | Request::PolicyCheck { .. } | Request::Result { .. } => json!({}),
    };
    if let (Some(o), true) = (args.as_object_mut(), !matches!(req, Request::Ask { .. })) {
        o.insert("repository".into(), repository.into());
    }
    args
}

/// What the gate saw of a request, for its audit entry (and, in a dry run,
/// for the dry-run record).
#[derive(Debug, Default)]
pub struct Seen {
    /// The label gate's reason (`clear`, `untrusted_content`, ...).
    pub gate: Option<String>,
    /// The policy's deciding rule of a request that was not refused.
    pub deciding_rule: Option<String>,
    /// The id this request gets in a dry run.
    pub dry_id: Option<String>,
    /// The door's whole judgement, once the policy was asked.
    pub judgement: Option<policies::scopes::Judgement>,
    /// The policy's args (routing only).
    pub args: Option<serde_json::Value>,
    /// The act carried out under an autonomy scope.
    pub carried: Option<String>,
}

fn decide<S: StateStore + ?Sized>(
    store: &mut S,
    door: &RunDoor,
    req: &Request,
    received: Option<&Received>,
    seen: &mut Seen,
) -> Response {
    if let Err(e) = req.validate() {
        return Response::Error {
            reason: e.to_string(),
        };
    }
    if matches!(req, Request::PolicyCheck { .. }) {
        // The door answers these itself (`policy_check`); never an act.
        return Response::Error {
            reason: "a policy check is a question, not an act".into(),
        };
    }
    let rules = match nightshift_core::policy::load(store, None) {
        Ok(r) => r,
        Err(e) => {
            return refused(
                "nightshift:policy",
                format!("the policy could not be read: {e}"),
            )
        }
    };
    if let Some(freeze) = rules.freeze() {
        return refused(
            "nightshift:freeze",
            format!("everything is frozen: {}", freeze.reason),
        );
    }
    // Counted here to refuse early, and again inside the transaction that
    // queues the act (`put_act_within`), so that requests at once never
    // both take the last place.
    let since = night_start(now());
    let repo = door.repo.display().to_string();
    let bounds = queue_bounds();
    let refuse =
        move |counts: nightshift_core::state_store::ActCounts| act_bound_refusal(bounds, counts);
    match (
        store.count_acts(&door.run),
        store.count_acts_since(&since, None),
        store.count_acts_since(&since, Some(&repo)),
    ) {
        (Ok(of_run), Ok(tonight), Ok(of_repository)) => {
            if let Some((rule, reason)) = refuse(nightshift_core::state_store::ActCounts {
                of_run,
                tonight,
                of_repository,
            }) {
                return refused(rule, reason);
            }
        }
        _ => {
            return Response::Error {
                reason:
                    "the supervisor could not count this run's and tonight's acts; try again later"
                        .into(),
            }
        }
    }
    let dest = match destinations(store) {
        Ok(d) => d,
        Err(e) => return refused("nightshift:routing", e),
    };
    let gate = match route_and_label(&dest, req, door.content) {
        Ok(gate) => {
            seen.gate = serde_json::to_value(&gate.reason)
                .ok()
                .and_then(|v| match v {
                    serde_json::Value::String(s) => Some(s),
                    serde_json::Value::Object(o) => o.keys().next().cloned(),
                    _ => None,
                });
            gate
        }
        Err(answer) => {
            seen.gate = Some("refused".into());
            return answer;
        }
    };
    // The policy, on the request's routing (content is never matched on);
    // the request's scope is the run's repository.
    let repository = repository_key(&door.repo);
    let args = policy_args(req, &repository);
    seen.args = Some(args.clone());
    let actor = format!("run-{}", door.run);
    let judgement = policies::scopes::judge(
        &rules,
        &policies::Request {
            actor: Some(actor.clone()),
            door: req.door().to_string(),
            args,
            scope: Some(repository),
        },
        gate,
        nightshift_core::policy::now(),
    );
    seen.judgement = Some(judgement.clone());
    let Some(decision) = judgement.decision else {
        return refused("nightshift:labels", judgement.gate.reason.to_string());
    };
    let _ = nightshift_core::policy::record_decision(
        store,
        Some(&door.run),
        Some(&actor),
        req.door(),
        &decision,
    );
    if decision.verdict == policies::Verdict::Refuse {
        return refused(&decision.rule.to_string(), decision.reason);
    }
    seen.deciding_rule = Some(decision.rule.to_string());
    if matches!(req, Request::Push { delete: true, .. }) {
        return refused(
            "nightshift:delete",
            "deleting a remote branch is not carried out by nightshift yet; ask a person instead",
        );
    }
    // Allow or ask: agent-made content is untrusted (the label gate asks),
    // so a person decides, now or ahead of time through an autonomy scope
    // the owner ratified for exactly this kind of act.
    let id = seen
        .dry_id
        .clone()
        .unwrap_or_else(|| format!("a{}", ulid::Ulid::new().to_string().to_lowercase()));
    let (door_kind, routing, content, body) = match bind(&dest, door, req, &id, received) {
        Ok(b) => b,
        Err(answer) => return answer,
    };
    if door.dry_run {
        // Answered as it would have been; nothing is queued or carried out.
        return match &judgement.scope {
            Some(scope) => Response::Done {
                detail: format!(
                    "dry run {id}: would have been carried out under autonomy scope {scope}; nothing was done"
                ),
            },
            None => Response::Queued { act: id },
        };
    }
    let created = now();
    let act = Act {
        id: id.clone(),
        run: door.run.clone(),
        actor,
        door: door_kind,
        routing,
        content,
        policy_generation: decision.generation.to_string(),
        deciding_rules: match &decision.rule {
            policies::Decider::Rule(r) => vec![r.to_string()],
            other => vec![other.to_string()],
        },
        created_at: created,
        expires_at: created + ttls(store).0,
    };
    let act_json = serde_json::to_value(&act).unwrap_or_default();
    let state_json = serde_json::to_value(State::Pending).unwrap_or_default();
    let queued = store.put_act_within(
        &id,
        &door.run,
        &act_json,
        &state_json,
        body.as_deref(),
        &Event::Act {
            act: id.clone(),
            transition: "queued".into(),
            fields: json!({
                "door": req.door(),
                "digest": deferred_queue::act_digest(&act),
                "generation": act.policy_generation,
            }),
        },
        &nightshift_core::state_store::ActBounds {
            since: &since,
            repo: &repo,
            refuse: &refuse,
        },
    );
    match (queued, &judgement.scope) {
        (Ok(Some((rule, reason))), _) => refused(rule, reason),
        (Ok(None), None) => Response::Queued { act: id },
        (Ok(None), Some(scope)) => {
            seen.carried = Some(id.clone());
            carry_under_scope(store, &id, scope)
        }
        (Err(e), _) => Response::Error {
            reason: format!("queueing the act: {e}"),
        },
    }
}

/// Carries out an act an autonomy scope allows: approved ahead of time
/// under the scope (the owner ratified it with the owner's credential), in
/// one transaction, then carried out at once by an executor pass limited to
/// it, re-checked exactly as an act a person approved. Anything short of
/// done leaves the act where a person (or `serve`'s executor) sees it.
fn carry_under_scope<S: StateStore + ?Sized>(
    store: &mut S,
    id: &str,
    scope: &policies::RuleId,
) -> Response {
    let not_done = |why: String| {
        Response::Error {
        reason: format!(
            "act {id} is allowed by autonomy scope {scope} but was not carried out ({why}); a person sees it in the queue"
        ),
    }
    };
    let row = match rows(store, Some(id)).map(|mut r| r.pop()) {
        Ok(Some(row)) => row,
        _ => return not_done("the act could not be read back".into()),
    };
    let approved = step(
        store,
        &row,
        &deferred_queue::Event::ApproveUnderScope {
            digest: deferred_queue::act_digest(&row.act),
            scope: scope.to_string(),
            now: now(),
            ttl_secs: ttls(store).1,
        },
    );
    if approved.is_err() {
        return not_done("it could not be approved under the scope".into());
    }
    match execute_now(store, &[id.to_string()], false).pop() {
        Some(d) if d.carried_out => Response::Done {
            detail: format!("act {id} carried out under autonomy scope {scope}"),
        },
        Some(_) => not_done("it is in the queue".into()),
        None => not_done("the executor failed".into()),
    }
}

/// Takes the commit a push or pull request names from the pack that came
/// with it into the host, under `refs/nightshift/acts/<id>`.
fn take_commit(
    door: &RunDoor,
    commit: &str,
    id: &str,
    received: Option<&Received>,
) -> Result<orchestrator_git::Captured, Response> {
    let Some(received) = received else {
        return Err(Response::Error {
            reason: "the request carried no objects; send it with the door's clients".into(),
        });
    };
    orchestrator_git::receive_pack(&orchestrator_git::PackSpec {
        host_repo: &door.repo,
        scratch: &received.dir.join("odb"),
        pack: received.pack.as_deref(),
        base_commit: &door.base_commit,
        commit,
        dest_ref: &format!("refs/nightshift/acts/{id}"),
        limits: orchestrator_git::ImportLimits::default(),
    })
    .map_err(|e| Response::Error {
        reason: agent_reason(commit, &e),
    })
}

/// Why a commit could not be taken, phrased for the agent: what it sent was
/// wrong, or the supervisor's own trouble (never a host path or detail).
fn agent_reason(commit: &str, e: &orchestrator_git::GitError) -> String {
    use orchestrator_git::GitError as E;
    match e {
        E::NotConnected { missing, .. } => format!(
            "commit {commit} is not connected: object {missing} is neither in the pack sent nor reachable from the commit the run started from"
        ),
        E::BadPack { why } => {
            format!("the pack sent for commit {commit} is not a valid git pack: {why}")
        }
        E::PackOverLimits { why } => {
            format!("the pack sent for commit {commit} was refused before it was indexed: {why}")
        }
        E::MissingObject { .. }
        | E::MalformedObject { .. }
        | E::TooManyObjects { .. }
        | E::ObjectTooLarge { .. }
        | E::TotalBytesExceeded { .. }
        | E::ObjectIdMismatch { .. }
        | E::InvalidCommitId { .. } => format!("commit {commit} was refused: {e}"),
        // What was sent can never pass: retrying the same objects is futile.
        E::InvalidTreeEntry { .. } | E::HostileWorktree { .. } | E::BadRef { .. } => format!(
            "commit {commit} was refused and never will be as it is: {e}; the act was not queued"
        ),
        _ => format!(
            "the supervisor could not store commit {commit}; the act was not queued, try again later"
        ),
    }
}

/// Resolves what the act carries, on the supervisor's side.
#[allow(clippy::type_complexity)]
fn bind(
    dest: &Destinations,
    door: &RunDoor,
    req: &Request,
    id: &str,
    received: Option<&Received>,
) -> Result<(Door, Routing, Content, Option<Vec<u8>>), Response> {
    match req {
        Request::Push {
            remote,
            dst_ref,
            claimed_commit,
            ..
        } => {
            // The objects are copied now: later changes in the sandbox cannot alter them.
            let captured = take_commit(door, claimed_commit, id, received)?;
            // The lease: what the remote ref holds now is what it must still
            // hold when the push is carried out.
            let config = dest.remotes.get(remote).ok_or_else(|| {
                refused(
                    "nightshift:routing",
                    format!("{remote:?} is not a configured remote"),
                )
            })?;
            // The remote's url and its error stay on the supervisor's side.
            let expected_old =
                orchestrator_executors::remote_ref(config, dst_ref).map_err(|_| {
                    Response::Error {
                        reason: format!(
                            "the supervisor could not read {dst_ref} of remote {remote:?} to bind the push; try again later"
                        ),
                    }
                })?;
            Ok((
                Door::Push,
                Routing {
                    destination: remote.clone(),
                    target: Target::Push {
                        target_ref: dst_ref.clone(),
                        expected_old,
                    },
                },
                Content::Commit {
                    commit: captured.commit,
                },
                None,
            ))
        }
        Request::PullRequest {
            remote,
            base,
            head,
            head_commit,
            title,
            body,
            ..
        } => {
            // The pull request is bound to the commit the agent's head held
            // when it asked (resolved in the sandbox, sent with its objects).
            let captured = take_commit(door, head_commit, id, received)?;
            let text =
                serde_json::to_vec(&json!({"title": title, "body": body})).unwrap_or_default();
            Ok((
                Door::PullRequest,
                Routing {
                    destination: remote.clone(),
                    target: Target::PullRequest {
                        base_ref: base.clone(),
                        head_ref: head.clone(),
                    },
                },
                Content::PullRequest {
                    head_commit: captured.commit,
                    text_digest: digest(&text),
                },
                Some(text),
            ))
        }
        Request::Notify { destination, body } => Ok((
            Door::Notify,
            Routing {
                destination: destination.clone(),
                target: Target::Message {
                    endpoint: destination.clone(),
                },
            },
            Content::Message {
                body_digest: digest(body.as_bytes()),
                size: body.len() as u64,
            },
            Some(body.as_bytes().to_vec()),
        )),
        Request::Ask { body } => Ok((
            Door::Ask,
            Routing {
                destination: "morning".into(),
                target: Target::Message {
                    endpoint: "morning".into(),
                },
            },
            Content::Message {
                body_digest: digest(body.as_bytes()),
                size: body.len() as u64,
            },
            Some(body.as_bytes().to_vec()),
        )),
        Request::PolicyCheck { .. } => Err(Response::Error {
            reason: "a policy check is a question, not an act".into(),
        }),
        Request::Result { .. } => Err(Response::Error {
            reason: "a run's result is not an act".into(),
        }),
    }
}

/// The answer to a policy check, and whether it wrote an audit entry.
#[derive(Debug, Clone)]
pub struct Checked {
    pub response: Response,
    pub audited: bool,
}

/// Answers a harness's pre-tool hook asked through the door (a question,
/// not an act): the run's rules decide the payload exactly as `nightshift
/// policy check --tool -` would (`policies::hook_decide`), with the run as
/// the actor (`run-<id>`, as for its acts). Allow: `done`, nothing written.
/// Refuse and ask: audited (`policy_decision`, with the run, the tool's
/// name and the request's digest; bad input with the payload's digest)
/// before the answer. Any failure is a refusal naming
/// `nightshift:hook-internal`: the hook fails closed.
pub fn policy_check(stores: &Stores, door: &RunDoor, payload: &serde_json::Value) -> Checked {
    let internal = |reason: String| Checked {
        response: refused("nightshift:hook-internal", reason),
        audited: false,
    };
    let mut store = match stores.connect() {
        Ok(s) => s,
        Err(_) => return internal("the supervisor's state is unavailable".into()),
    };
    let rules = match nightshift_core::policy::load(&store, None) {
        Ok(r) => r,
        Err(e) => return internal(format!("the policy could not be read: {e}")),
    };
    let bytes = serde_json::to_vec(payload).unwrap_or_default();
    let actor = format!("run-{}", door.run);
    let outcome = policies::hook_decide(
        &rules,
        Some(&actor),
        "-",
        &bytes,
        nightshift_core::policy::now(),
        false,
    );
    let tool = outcome.tool.clone().unwrap_or_else(|| "-".into());
    let written = match &outcome.decision {
        Some(decision) => nightshift_core::policy::record_decision(
            &mut store,
            Some(&door.run),
            Some(&actor),
            &tool,
            decision,
        ),
        None => store
            .append(
                Some(&door.run),
                &Event::PolicyDecision {
                    actor: Some(actor.clone()),
                    door: tool,
                    verdict: "refuse".into(),
                    rule: policies::hook::INPUT_ID.into(),
                    escalated: false,
                    stood_aside: Vec::new(),
                    generation: rules.generation().to_string(),
                    digest: digest(&bytes),
                },
                false,
            )
            .map(|_| ())
            .map_err(nightshift_core::policy::PolicyError::from),
    };
    if let Err(e) = written {
        return internal(format!("the decision could not be recorded: {e}"));
    }
    let audited = outcome.verdict != policies::Verdict::Allow;
    let response = match (&outcome.decision, outcome.verdict) {
        (_, policies::Verdict::Allow) => Response::Done {
            detail: String::new(),
        },
        (Some(d), policies::Verdict::Ask) => Response::Asks {
            rule: d.rule.to_string(),
            reason: d.reason.clone(),
        },
        (Some(d), policies::Verdict::Refuse) => Response::Refused {
            rule: match &d.rule {
                policies::Decider::NoRule => policies::hook::INPUT_ID.to_string(),
                other => other.to_string(),
            },
            reason: d.reason.clone(),
        },
        // Refused before any rule: the hook's own line says why.
        (None, _) => Response::Refused {
            rule: policies::hook::INPUT_ID.into(),
            reason: outcome
                .stderr
                .strip_prefix(&format!("refused by rule {}: ", policies::hook::INPUT_ID))
                .unwrap_or(&outcome.stderr)
                .to_string(),
        },
    };
    Checked { response, audited }
}

/// One queued act as stored.
#[derive(Debug, Clone)]
pub struct Row {
    pub act: Act,
    pub state: State,
    pub content: Option<Vec<u8>>,
}

pub fn rows<S: StateStore + ?Sized>(store: &S, id: Option<&str>) -> Result<Vec<Row>, StoreError> {
    rows_of(store.acts(id)?)
}

/// Stored acts read as rows.
pub fn rows_of(
    stored: Vec<nightshift_core::state_store::StoredAct>,
) -> Result<Vec<Row>, StoreError> {
    let mut out = Vec::new();
    for (act, state, content) in stored {
        let act: Act = serde_json::from_value(act).map_err(|e| StoreError::BadEntry {
            seq: 0,
            message: format!("act: {e}"),
        })?;
        let state: State = serde_json::from_value(state).map_err(|e| StoreError::BadEntry {
            seq: 0,
            message: format!("act state: {e}"),
        })?;
        out.push(Row {
            act,
            state,
            content,
        });
    }
    Ok(out)
}

/// The owner's credential, as the queue's state machine wants it checked,
/// and the name the decision is recorded under once it is.
struct KeyCheck<'a, S: StateStore + ?Sized>(&'a S, &'a str);

impl<S: StateStore + ?Sized> deferred_queue::CredentialCheck for KeyCheck<'_, S> {
    type Credential = Option<PathBuf>;
    type Error = owner::OwnerError;
    fn check(&self, key: &Option<PathBuf>) -> Result<String, owner::OwnerError> {
        owner::verify(self.0, key.as_deref()).map(|_| self.1.to_string())
    }
}

fn queue_policy() -> deferred_queue::QueuePolicy {
    deferred_queue::QueuePolicy {
        max_attempts: 3,
        backoff: deferred_queue::Backoff {
            base_secs: 2,
            max_secs: 60,
        },
    }
}

/// Applies one event and stores the move with its audit entry; returns the
/// new state and the effects to carry out.
fn step<S: StateStore + ?Sized>(
    store: &mut S,
    row: &Row,
    event: &deferred_queue::Event,
) -> Result<(State, Vec<deferred_queue::Effect>), String> {
    let (next, effects) = deferred_queue::apply(&row.act, &row.state, event, &queue_policy())
        .map_err(|e| format!("act {}: {e}", row.act.id))?;
    let fields: serde_json::Value = effects
        .iter()
        .find_map(|e| match e {
            deferred_queue::Effect::Audit(a) => Some(json!(a.fields)),
            _ => None,
        })
        .unwrap_or_default();
    let moved = store
        .transition_act(
            &row.act.id,
            &row.act.run,
            &serde_json::to_value(&row.state).unwrap_or_default(),
            &serde_json::to_value(&next).unwrap_or_default(),
            &Event::Act {
                act: row.act.id.clone(),
                transition: next.name().to_string(),
                fields,
            },
        )
        .map_err(|e| e.to_string())?;
    if !moved {
        return Err(format!(
            "act {} changed while it was being decided; try again",
            row.act.id
        ));
    }
    tracing::info!(act = %row.act.id, run = %row.act.run, from = row.state.name(), "act {}", next.name());
    Ok((next, effects))
}

pub fn reject<S: StateStore + ?Sized>(
    store: &mut S,
    id: &str,
    why: &str,
    key: Option<&Path>,
) -> Result<(), String> {
    reject_as(store, id, why, key, "owner")
}

/// [`reject`], recorded under `by` (the owner as a front end names them:
/// `owner`, `dashboard:alice`).
pub fn reject_as<S: StateStore + ?Sized>(
    store: &mut S,
    id: &str,
    why: &str,
    key: Option<&Path>,
    by: &str,
) -> Result<(), String> {
    let by = deferred_queue::Owner::verify(&KeyCheck(store, by), &key.map(Path::to_path_buf))
        .map_err(|e| e.to_string())?;
    let row = rows(store, Some(id))
        .map_err(|e| e.to_string())?
        .pop()
        .ok_or_else(|| format!("no act with id {id}"))?;
    step(
        store,
        &row,
        &deferred_queue::Event::Reject {
            why: why.to_string(),
            by,
        },
    )?;
    Ok(())
}

/// The policy request an act made when it was queued, rebuilt from what the
/// act binds: its door, its actor and its routing (never its content).
/// `repository` is the act's run's ([`act_repository`]).
pub fn act_policy_request(act: &Act, repository: &str) -> policies::Request {
    let mut args = match (&act.routing.target, &act.content) {
        (Target::Push { target_ref, .. }, Content::Commit { commit }) => {
            // The fields of `policy_args` (the door schema), so that the
            // rules decide the act now as they did when it was queued.
            json!({
                "remote": act.routing.destination,
                "ref": target_ref,
                "commit": commit,
                // What will be carried out: the push executor never forces
                // (fast-forward under the lease) and a deletion is never
                // queued.
                "force": false,
                "delete": false,
            })
        }
        (Target::PullRequest { base_ref, head_ref }, Content::PullRequest { head_commit, .. }) => {
            json!({
                "remote": act.routing.destination,
                "base": base_ref,
                "head": head_ref,
                "commit": head_commit,
            })
        }
        _ if act.door == Door::Ask => json!({}),
        _ => json!({"destination": act.routing.destination}),
    };
    if let (Some(o), false) = (args.as_object_mut(), act.door == Door::Ask) {
        o.insert("repository".into(), repository.into());
    }
    policies::Request {
        actor: Some(act.actor.clone()),
        door: act.door.name().to_string(),
        args,
        scope: Some(repository.to_string()),
    }
}

/// Why the rules in force now refuse an act, if they do. A freeze is not a
/// refusal of the act (it suspends everything; see [`frozen`]); neither is a
/// rule declared, retired or ratified since the act was queued, unless it now
/// refuses this very act.
fn refused_now(rules: &policies::RuleSet, act: &Act, repository: &str) -> Option<String> {
    let decision = policies::evaluate(
        rules,
        &act_policy_request(act, repository),
        nightshift_core::policy::now(),
    );
    (decision.verdict == policies::Verdict::Refuse)
        .then(|| format!("rule {} now refuses it: {}", decision.rule, decision.reason))
}

/// The freeze in force, if any, as a sentence for the owner.
pub fn frozen<S: StateStore + ?Sized>(store: &S) -> Result<Option<String>, String> {
    let rules = nightshift_core::policy::load(store, None).map_err(|e| e.to_string())?;
    Ok(rules.freeze().map(|f| f.reason.clone()))
}

/// The act's digest as it would be if created now: the remote's current ref
/// for a push. The policy generation is the act's own: a rule change moves
/// the generation but stales nothing unless the rules in force now refuse
/// this act, which makes the recomputed digest differ (so the act goes stale
/// with the rule named).
fn recompute<S: StateStore + ?Sized>(
    store: &S,
    dest: &Destinations,
    act: &Act,
) -> Result<String, String> {
    let mut now_act = act.clone();
    if let (Door::Push, Target::Push { target_ref, .. }) = (&act.door, &act.routing.target) {
        let remote = dest.remotes.get(&act.routing.destination).ok_or_else(|| {
            format!(
                "remote {:?} is no longer configured",
                act.routing.destination
            )
        })?;
        let current =
            orchestrator_executors::remote_ref(remote, target_ref).map_err(|e| e.audit_reason())?;
        if let Content::Commit { commit } = &act.content {
            if current.as_deref() != Some(commit.as_str()) {
                if let Some(why) = moves_an_opened_pull_request(
                    &rows(store, None).map_err(|e| e.to_string())?,
                    dest,
                    &act.routing.destination,
                    target_ref,
                    commit,
                    &act.id,
                )? {
                    return Err(why);
                }
            }
        }
        now_act.routing.target = Target::Push {
            target_ref: target_ref.clone(),
            expected_old: current,
        };
    }
    if let (Target::PullRequest { head_ref, .. }, Content::PullRequest { head_commit, .. }) =
        (&act.routing.target, &act.content)
    {
        let repo = store.run(&act.run).map_err(|e| e.to_string())?.repo;
        let opened = rows(store, None).map_err(|e| e.to_string())?;
        head_is_bindable(&opened, Path::new(&repo), dest, act, head_ref, head_commit)?;
    }
    let rules = nightshift_core::policy::load(store, None).map_err(|e| e.to_string())?;
    if let Some(why) = refused_now(&rules, act, &act_repository(store, act)) {
        return Err(why);
    }
    Ok(deferred_queue::act_digest(&now_act))
}

/// A pull request opens on its head branch as the forge's git remote holds
/// it. That branch must hold the approved commit already, or be absent, or
/// hold a commit the approved one extends (then the act pushes it there,
/// fast-forward only, before the request). Anything else moved the branch
/// under the act: it goes stale, and no pull request opens on another
/// commit.
fn head_is_bindable(
    opened: &[Row],
    repo: &Path,
    dest: &Destinations,
    act: &Act,
    head_ref: &str,
    head_commit: &str,
) -> Result<Option<String>, String> {
    let (forge, remote) = forge_remote(dest, act)?;
    let now = orchestrator_executors::remote_ref(remote, head_ref).map_err(|e| e.audit_reason())?;
    let Some(now) = now else {
        return Ok(None);
    };
    if now != head_commit {
        if let Some(why) = moves_an_opened_pull_request(
            opened,
            dest,
            &forge.remote,
            head_ref,
            head_commit,
            &act.id,
        )? {
            return Err(why);
        }
    }
    let extends =
        orchestrator_executors::extends(repo, head_commit, &now).map_err(|e| e.audit_reason())?;
    if extends {
        Ok(Some(now))
    } else {
        Err(format!(
            "the head branch {head_ref} now holds {now}, which the approved {head_commit} does not extend"
        ))
    }
}

/// Why moving branch `branch` of git remote `remote` (an alias) to `commit`
/// would move the head of a pull request another act (not `this`) opened,
/// naming that pull request and act; `None` when it would move none. A pull
/// request opened by nightshift is bound to the commit its owner approved:
/// a later act (another pull request on the same head, bases `main` and
/// `release`, or a push to that branch) must not move it under the
/// reviewer, so it goes stale instead.
fn moves_an_opened_pull_request(
    opened: &[Row],
    dest: &Destinations,
    remote: &str,
    branch: &str,
    commit: &str,
    this: &str,
) -> Result<Option<String>, String> {
    let branch = branch.strip_prefix("refs/heads/").unwrap_or(branch);
    for row in opened {
        if row.act.id == this {
            continue;
        }
        let (
            State::Done { outcome, .. },
            Target::PullRequest { head_ref, .. },
            Content::PullRequest { head_commit, .. },
        ) = (&row.state, &row.act.routing.target, &row.act.content)
        else {
            continue;
        };
        let same_remote = dest
            .forges
            .get(&row.act.routing.destination)
            .is_some_and(|f| f.remote == remote);
        let head = head_ref.strip_prefix("refs/heads/").unwrap_or(head_ref);
        if same_remote && head == branch && head_commit != commit {
            return Ok(Some(format!(
                "moving branch {branch} to {commit} would move the head of {} that act {} opened at {head_commit}; reject this act, or close that pull request and rebind",
                outcome.split(" (").next().unwrap_or(outcome),
                row.act.id
            )));
        }
    }
    Ok(None)
}

/// The forge of a pull-request act and the git remote that holds its branches.
fn forge_remote<'d>(
    dest: &'d Destinations,
    act: &Act,
) -> Result<
    (
        &'d orchestrator_executors::ForgeConfig,
        &'d orchestrator_executors::RemoteConfig,
    ),
    String,
> {
    let forge = dest.forges.get(&act.routing.destination).ok_or_else(|| {
        format!(
            "forge {:?} is no longer configured",
            act.routing.destination
        )
    })?;
    let remote = dest.remotes.get(&forge.remote).ok_or_else(|| {
        format!(
            "remote {:?} of forge {:?} is no longer configured",
            forge.remote, act.routing.destination
        )
    })?;
    Ok((forge, remote))
}

/// What `approve` did with one act: a line for the owner, and whether the
/// act was carried out (anything else makes `approve` exit non-zero).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    pub line: String,
    pub carried_out: bool,
}

impl Decided {
    fn not_carried(line: String) -> Self {
        Decided {
            line,
            carried_out: false,
        }
    }
}

/// Approves an act (owner's credential) and carries it out at once (the
/// decision, then [`execute_now`]), as the command line does when no
/// `serve` runs. While nightshift is frozen nothing is approved or carried
/// out (an error, so the owner sees it); the act stays as it was.
pub fn approve<S: StateStore + ?Sized>(
    store: &mut S,
    id: &str,
    key: Option<&Path>,
) -> Result<Decided, String> {
    approve_as(store, id, key, "owner")?;
    execute_now(store, &[id.to_string()], true)
        .pop()
        .ok_or_else(|| format!("no act with id {id}"))
}

/// The owner's approval of one act, recorded under `by` (the owner as a
/// front end names them: `owner`, `dashboard:alice`): one transaction
/// (`Pending` to `Approved`, with its audit entry) that carries nothing
/// out; an executor does ([`executor`]). An act approved already (or being
/// carried out, or awaiting a retry) is left to the executor as it is; a
/// stale one is named with what to do. Returns the decision's line.
pub fn approve_as<S: StateStore + ?Sized>(
    store: &mut S,
    id: &str,
    key: Option<&Path>,
    by: &str,
) -> Result<Decided, String> {
    let by = deferred_queue::Owner::verify(&KeyCheck(store, by), &key.map(Path::to_path_buf))
        .map_err(|e| e.to_string())?;
    if let Some(why) = frozen(store)? {
        return Err(format!(
            "nightshift is frozen ({why}): act {id} was neither approved nor carried out; thaw first"
        ));
    }
    let row = rows(store, Some(id))
        .map_err(|e| e.to_string())?
        .pop()
        .ok_or_else(|| format!("no act with id {id}"))?;
    match &row.state {
        // Approved before: the executor carries it out (or finds out what
        // became of the attempt a crash interrupted).
        State::Approved { .. }
        | State::Executing { .. }
        | State::AwaitingRetry { .. }
        | State::OutcomeUnknown { .. } => {
            return Ok(Decided::not_carried(line_of(&row)));
        }
        State::Stale { .. } => return Ok(Decided::not_carried(line_of(&row))),
        _ => {}
    }
    let (state, _) = step(
        store,
        &row,
        &deferred_queue::Event::Approve {
            digest: deferred_queue::act_digest(&row.act),
            by,
            now: now(),
            ttl_secs: ttls(store).1,
        },
    )?;
    executor::wake();
    Ok(Decided::not_carried(line_of(&Row { state, ..row })))
}

/// The command line's executor after its decisions, when no `serve` runs:
/// one pass over everything executable now (with `whole_queue`; the door
/// under an autonomy scope passes over its own act only), then each of
/// `ids` followed
/// until it settles (done, failed, stale, expired, rejected): a retry it
/// owes is waited for until its time (holding nothing), an act another
/// executor holds is waited for until that one finishes or its lease
/// lapses. Returns one line per act, as `approve` prints it.
pub fn execute_now<S: StateStore + ?Sized>(
    store: &mut S,
    ids: &[String],
    whole_queue: bool,
) -> Vec<Decided> {
    let effects = match RealEffects::load(store) {
        Ok(e) => e,
        Err(e) => {
            return ids
                .iter()
                .map(|id| Decided::not_carried(format!("act {id}: not carried out: {e}")))
                .collect()
        }
    };
    let clock = now;
    let exec = executor::Executor {
        holder: executor::new_holder(),
        lease_secs: executor::LEASE_SECS,
        effects: &effects,
        now: &clock,
    };
    if whole_queue {
        if let Err(e) = exec.pass(store, None) {
            tracing::warn!("the command line's executor pass failed: {e}");
        }
    }
    // Bounded: the longest backoff's retries, and a lapsed lease, twice.
    let deadline = std::time::Instant::now()
        + std::time::Duration::from_secs(
            (queue_policy().max_attempts as u64 * queue_policy().backoff.max_secs as u64)
                + 2 * executor::LEASE_SECS as u64
                + 10,
        );
    ids.iter()
        .map(|id| loop {
            let _ = exec.pass(store, Some(id));
            let row = match rows(store, Some(id)).map(|mut r| r.pop()) {
                Ok(Some(row)) => row,
                Ok(None) => return Decided::not_carried(format!("no act with id {id}")),
                Err(e) => return Decided::not_carried(format!("act {id}: {e}")),
            };
            let wait = match &row.state {
                State::AwaitingRetry { not_before, .. } => {
                    std::time::Duration::from_secs((*not_before - now()).clamp(0, 120) as u64)
                        .max(std::time::Duration::from_millis(200))
                }
                State::Approved { .. } | State::Executing { .. } | State::OutcomeUnknown { .. } => {
                    std::time::Duration::from_millis(500)
                }
                _ => std::time::Duration::ZERO,
            };
            let frozen_now = matches!(frozen(store), Ok(Some(_)));
            if wait.is_zero() || frozen_now || std::time::Instant::now() + wait > deadline {
                return Decided {
                    line: line_of(&row),
                    carried_out: matches!(row.state, State::Done { .. }),
                };
            }
            std::thread::sleep(wait);
        })
        .collect()
}

/// One executor pass as `holder` over everything executable now, at the
/// owner's destinations, with leases of `lease_secs` (`serve`'s executor
/// task and `nightshift execute`).
pub fn pass<S: StateStore + ?Sized>(
    store: &mut S,
    holder: &str,
    lease_secs: i64,
) -> Result<executor::Pass, String> {
    let effects = RealEffects::load(store)?;
    let clock = now;
    executor::Executor {
        holder: holder.to_string(),
        lease_secs,
        effects: &effects,
        now: &clock,
    }
    .pass(store, None)
}

/// Passes over one connection to the store, as one holder (a new one)
/// with leases of `lease_secs`; each pass that succeeds is told to
/// `report`. What [`executor::run`] repeats (`serve`'s executor task,
/// `nightshift execute --watch`) and `nightshift execute` runs once.
pub fn passes(
    store: Box<dyn StateStore>,
    lease_secs: i64,
    report: impl Fn(&executor::Pass) + Send + Sync + 'static,
) -> impl Fn() -> Result<executor::Pass, String> + Send + Sync + 'static {
    let store = std::sync::Mutex::new(store);
    let holder = executor::new_holder();
    move || {
        let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
        let done = pass(&mut **store, &holder, lease_secs);
        if let Ok(p) = &done {
            report(p);
        }
        done
    }
}

/// What the owner is told of an act's state: `act ID: STATE (why)`.
pub fn line_of(row: &Row) -> String {
    let id = &row.act.id;
    match &row.state {
        State::Done { outcome, .. } => format!("act {id}: done ({outcome})"),
        State::Failed { reason, .. } => format!("act {id}: failed ({reason})"),
        State::Stale { why } => format!(
            "act {id}: stale ({why}); see `nightshift queue show {id}`, then `nightshift rebind {id}` to bind it to the destination as it is now"
        ),
        State::Expired { why } => format!("act {id}: expired ({why})"),
        State::Rejected { why, .. } => format!("act {id}: rejected ({why})"),
        State::AwaitingRetry {
            attempts,
            not_before,
            last_failure,
            ..
        } => format!(
            "act {id}: awaiting_retry (attempt {attempts} failed: {last_failure}; next attempt at {not_before})"
        ),
        state => format!("act {id}: {}", state.name()),
    }
}

/// The executor's effects at the owner's configured destinations
/// (`destinations.toml`, read once per pass).
#[derive(Debug)]
pub struct RealEffects {
    dest: Destinations,
}

impl RealEffects {
    pub fn load<S: StateStore + ?Sized>(store: &S) -> Result<Self, String> {
        Ok(RealEffects {
            dest: destinations(store)?,
        })
    }
}

/// One attempt's work, read from the store beforehand.
#[derive(Debug)]
pub struct RealJob {
    row: Row,
    repo: Result<PathBuf, String>,
    opened: Result<Vec<Row>, String>,
}

impl executor::Effects for RealEffects {
    type Job = RealJob;
    fn recompute<S: StateStore + ?Sized>(&self, store: &S, act: &Act) -> String {
        match recompute(store, &self.dest, act) {
            Ok(d) => d,
            Err(why) => format!("unverifiable: {why}"),
        }
    }
    fn prepare<S: StateStore + ?Sized>(&self, store: &S, row: &Row) -> RealJob {
        RealJob {
            row: row.clone(),
            repo: store
                .run(&row.act.run)
                .map(|r| PathBuf::from(r.repo))
                .map_err(|e| e.to_string()),
            opened: rows(store, None).map_err(|e| e.to_string()),
        }
    }
    fn carry_out(&self, job: RealJob) -> Result<String, executor::Failure> {
        let opened = job.opened.map_err(|why| executor::Failure {
            // Nothing was attempted: as safe to retry as a refused connection.
            reason: format!("the act queue could not be read: {why}"),
            retryable: true,
        })?;
        carry_out(&self.dest, &job.row, &job.repo, &opened).map_err(|e| executor::Failure {
            reason: e.audit_reason(),
            retryable: e.retryable(),
        })
    }
    fn check(&self, act: &Act) -> deferred_queue::Found {
        check_destination(&self.dest, act)
    }
}

/// What changed under a stale act, for the owner: the lease it was bound to
/// and what the destination holds now (pushes), and whether the rules in
/// force still let it through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleView {
    pub why: String,
    /// A push's lease: what it was bound to and what the remote holds now.
    pub lease: Option<LeaseView>,
    pub refused_now: Option<String>,
}

/// A push's remote ref: the value the act was bound to, and the value now
/// (or why it could not be read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    pub bound: Option<String>,
    pub now: Result<Option<String>, String>,
}

pub fn stale_view<S: StateStore + ?Sized>(store: &S, row: &Row) -> Option<StaleView> {
    let State::Stale { why } = &row.state else {
        return None;
    };
    let lease = match &row.act.routing.target {
        Target::Push {
            target_ref,
            expected_old,
        } => {
            let current = destinations(store).and_then(|dest| {
                let remote = dest
                    .remotes
                    .get(&row.act.routing.destination)
                    .ok_or_else(|| "the remote is no longer configured".to_string())?;
                orchestrator_executors::remote_ref(remote, target_ref).map_err(|e| e.audit_reason())
            });
            Some(LeaseView {
                bound: expected_old.clone(),
                now: current,
            })
        }
        _ => None,
    };
    let refused_now = nightshift_core::policy::load(store, None)
        .map_err(|e| e.to_string())
        .map(|rules| refused_now(&rules, &row.act, &act_repository(store, &row.act)))
        .unwrap_or_else(|e| Some(format!("the policy could not be read: {e}")));
    Some(StaleView {
        why: why.clone(),
        lease,
        refused_now,
    })
}

/// Re-binds a stale act to the destination as it is now (owner's
/// credential): a new pending act with the same content and routing, bound
/// to the remote ref's current value and the rules in force, which needs one
/// more approval; the stale act is closed (rejected, naming the new one).
/// Never carries anything out. Returns the new act's id and a line.
pub fn rebind<S: StateStore + ?Sized>(
    store: &mut S,
    id: &str,
    key: Option<&Path>,
) -> Result<(String, String), String> {
    let by = deferred_queue::Owner::verify(&KeyCheck(store, "owner"), &key.map(Path::to_path_buf))
        .map_err(|e| e.to_string())?;
    let row = rows(store, Some(id))
        .map_err(|e| e.to_string())?
        .pop()
        .ok_or_else(|| format!("no act with id {id}"))?;
    if !matches!(row.state, State::Stale { .. }) {
        return Err(format!(
            "act {id} is {}, not stale: only a stale act is re-bound",
            row.state.name()
        ));
    }
    let rules = nightshift_core::policy::load(store, None).map_err(|e| e.to_string())?;
    if let Some(freeze) = rules.freeze() {
        return Err(format!(
            "nightshift is frozen ({}): thaw first",
            freeze.reason
        ));
    }
    let decision = policies::evaluate(
        &rules,
        &act_policy_request(&row.act, &act_repository(store, &row.act)),
        nightshift_core::policy::now(),
    );
    if decision.verdict == policies::Verdict::Refuse {
        return Err(format!(
            "act {id} cannot be re-bound: rule {} now refuses it: {}",
            decision.rule, decision.reason
        ));
    }
    let dest = destinations(store)?;
    let mut act = row.act.clone();
    let mut change = String::new();
    if let Target::Push {
        target_ref,
        expected_old,
    } = &row.act.routing.target
    {
        let remote = dest.remotes.get(&act.routing.destination).ok_or_else(|| {
            format!(
                "remote {:?} is no longer configured",
                act.routing.destination
            )
        })?;
        let current =
            orchestrator_executors::remote_ref(remote, target_ref).map_err(|e| e.audit_reason())?;
        if let Content::Commit { commit } = &act.content {
            if current.as_deref() != Some(commit.as_str()) {
                if let Some(why) = moves_an_opened_pull_request(
                    &rows(store, None).map_err(|e| e.to_string())?,
                    &dest,
                    &act.routing.destination,
                    target_ref,
                    commit,
                    &act.id,
                )? {
                    return Err(why);
                }
            }
        }
        change = format!(
            "; lease {} -> {}",
            expected_old.as_deref().unwrap_or("(absent)"),
            current.as_deref().unwrap_or("(absent)")
        );
        act.routing.target = Target::Push {
            target_ref: target_ref.clone(),
            expected_old: current,
        };
    }
    let new_id = format!("a{}", ulid::Ulid::new().to_string().to_lowercase());
    let created = now();
    act.id = new_id.clone();
    act.policy_generation = decision.generation.to_string();
    act.deciding_rules = match &decision.rule {
        policies::Decider::Rule(r) => vec![r.to_string()],
        other => vec![other.to_string()],
    };
    act.created_at = created;
    act.expires_at = created + ttls(store).0;
    // The new act and the stale one's closing in one transaction: both or
    // neither, and only if the stale act is still stale.
    let (closed, effects) = deferred_queue::apply(
        &row.act,
        &row.state,
        &deferred_queue::Event::Reject {
            why: format!("re-bound as act {new_id}"),
            by,
        },
        &queue_policy(),
    )
    .map_err(|e| format!("act {id}: {e}"))?;
    let fields: serde_json::Value = effects
        .iter()
        .find_map(|e| match e {
            deferred_queue::Effect::Audit(a) => Some(json!(a.fields)),
            _ => None,
        })
        .unwrap_or_default();
    let replaced = store
        .replace_act(
            id,
            &row.act.run,
            &serde_json::to_value(&row.state).unwrap_or_default(),
            &serde_json::to_value(&closed).unwrap_or_default(),
            &Event::Act {
                act: id.to_string(),
                transition: closed.name().to_string(),
                fields,
            },
            &new_id,
            &serde_json::to_value(&act).unwrap_or_default(),
            &serde_json::to_value(State::Pending).unwrap_or_default(),
            row.content.as_deref(),
            &Event::Act {
                act: new_id.clone(),
                transition: "queued".into(),
                fields: json!({
                    "door": act.door.name(),
                    "digest": deferred_queue::act_digest(&act),
                    "generation": act.policy_generation,
                    "rebinds": id,
                }),
            },
        )
        .map_err(|e| format!("queueing the re-bound act: {e}"))?;
    if !replaced {
        return Err(format!(
            "act {id} changed while it was being re-bound; try again"
        ));
    }
    Ok((
        new_id.clone(),
        format!("act {id}: re-bound as act {new_id}{change}; approve {new_id} to carry it out"),
    ))
}

fn carry_out(
    dest: &Destinations,
    row: &Row,
    repo: &Result<PathBuf, String>,
    opened: &[Row],
) -> Result<String, orchestrator_executors::ExecError> {
    let invalid = |why: &str| orchestrator_executors::ExecError::InvalidRequest {
        action: format!("carrying out act {}", row.act.id),
        why: why.to_string(),
    };
    // The stored content must still be what was bound by digest.
    let stored = digest(row.content.as_deref().unwrap_or_default());
    match &row.act.content {
        Content::Message { body_digest: d, .. } | Content::PullRequest { text_digest: d, .. }
            if *d != stored =>
        {
            return Err(invalid("the stored content no longer matches its digest"));
        }
        _ => {}
    }
    match (&row.act.door, &row.act.routing.target, &row.act.content) {
        (
            Door::Push,
            Target::Push {
                target_ref,
                expected_old,
            },
            Content::Commit { commit },
        ) => {
            let remote = dest
                .remotes
                .get(&row.act.routing.destination)
                .ok_or_else(|| invalid("the remote is no longer configured"))?;
            let repo = repo.as_ref().map_err(|e| invalid(e))?;
            let out = orchestrator_executors::push(
                remote,
                repo,
                commit,
                target_ref,
                expected_old.as_deref(),
            )?;
            Ok(format!("{target_ref} = {}", out.new))
        }
        (Door::Notify, _, Content::Message { .. }) => {
            let endpoint = dest
                .notify
                .get(&row.act.routing.destination)
                .ok_or_else(|| invalid("the endpoint is no longer configured"))?;
            let body = row.content.clone().unwrap_or_default();
            let out = orchestrator_executors::notify(
                endpoint,
                &row.act.id,
                &body,
                "text/plain; charset=utf-8",
            )?;
            Ok(format!("HTTP {}", out.status))
        }
        (
            Door::PullRequest,
            Target::PullRequest { base_ref, head_ref },
            Content::PullRequest { head_commit, .. },
        ) => {
            let (forge, remote) = forge_remote(dest, &row.act).map_err(|why| invalid(&why))?;
            // The head branch holds the approved commit before the request
            // (pushed fast-forward only, under the lease read just now).
            let repo = repo.as_ref().map_err(|e| invalid(e))?;
            let now = head_is_bindable(opened, repo, dest, &row.act, head_ref, head_commit)
                .map_err(|why| invalid(&why))?;
            if now.as_deref() != Some(head_commit.as_str()) {
                orchestrator_executors::push(remote, repo, head_commit, head_ref, now.as_deref())?;
            }
            let text: serde_json::Value =
                serde_json::from_slice(row.content.as_deref().unwrap_or_default())
                    .map_err(|_| invalid("the stored title and body are unreadable"))?;
            let out = orchestrator_executors::open_pull_request(
                forge,
                head_ref,
                base_ref,
                head_commit,
                text["title"].as_str().unwrap_or_default(),
                text["body"].as_str().unwrap_or_default(),
            )?;
            Ok(if out.adopted {
                format!("pull request #{} (found open, adopted)", out.number)
            } else {
                format!("pull request #{}", out.number)
            })
        }
        (Door::Ask, _, _) => Ok("answered in the morning".to_string()),
        _ => Err(invalid("this kind of act has no executor yet")),
    }
}

/// Moves every act whose time has passed to `expired` (a pending act past its
/// window, an approval past its own). Expiry refuses; it never proceeds.
pub fn expire<S: StateStore + ?Sized>(store: &mut S) -> Result<Vec<String>, String> {
    let mut lines = Vec::new();
    let now = now();
    for row in rows(store, None).map_err(|e| e.to_string())? {
        if row.state.is_final() {
            continue;
        }
        let (next, effects) = deferred_queue::apply(
            &row.act,
            &row.state,
            &deferred_queue::Event::Tick { now },
            &queue_policy(),
        )
        .map_err(|e| format!("act {}: {e}", row.act.id))?;
        if next != row.state && !effects.is_empty() {
            let (state, _) = step(store, &row, &deferred_queue::Event::Tick { now })?;
            lines.push(format!("act {}: {}", row.act.id, state.name()));
        }
    }
    Ok(lines)
}

/// Is the effect of an attempt whose outcome is unknown there?
fn check_destination(dest: &Destinations, act: &Act) -> deferred_queue::Found {
    use deferred_queue::Found;
    match (&act.routing.target, &act.content) {
        (
            Target::Push {
                target_ref,
                expected_old,
            },
            Content::Commit { commit },
        ) => {
            let Some(remote) = dest.remotes.get(&act.routing.destination) else {
                return Found::CannotTell {
                    why: "the remote is no longer configured".into(),
                };
            };
            match orchestrator_executors::remote_ref(remote, target_ref) {
                Ok(Some(now)) if &now == commit => Found::Applied {
                    outcome: format!("{target_ref} = {now}"),
                },
                Ok(now) if now == *expected_old => Found::NotApplied,
                Ok(_) => Found::CannotTell {
                    why: "the remote ref moved to something else".into(),
                },
                Err(e) => Found::CannotTell {
                    why: e.audit_reason(),
                },
            }
        }
        (Target::PullRequest { base_ref, head_ref }, Content::PullRequest { head_commit, .. }) => {
            let Some(forge) = dest.forges.get(&act.routing.destination) else {
                return Found::CannotTell {
                    why: "the forge is no longer configured".into(),
                };
            };
            match orchestrator_executors::find_pull_request(forge, head_ref, base_ref, head_commit)
            {
                Ok(Some(pr)) => Found::Applied {
                    outcome: format!("pull request #{} (found open, adopted)", pr.number),
                },
                Ok(None) => Found::NotApplied,
                Err(e) => Found::CannotTell {
                    why: e.audit_reason(),
                },
            }
        }
        _ => Found::CannotTell {
            why: "this destination keeps no record to check".into(),
        },
    }
}

/// The reason codes of a request that never became one, with what each
/// says: the audit records the code, the pages and `show` say the words.
pub const REASONS: [(&str, &str); 12] = [
    ("flood", "the run's door had answered its limit of requests"),
    ("oversized", "its frame was over the size limit"),
    ("malformed_json", "it was not the JSON the protocol expects"),
    ("no_version", "it carried no protocol version"),
    ("wrong_version", "it spoke another protocol version"),
    ("invalid_field", "a field did not pass validation"),
    ("empty_response", "it named nothing"),
    (
        "out_of_order",
        "bytes followed the one request of its connection",
    ),
    (
        "truncated",
        "the connection closed before the whole request arrived",
    ),
    ("too_slow", "it did not arrive in time"),
    ("pack", "its pack was refused, cut short or too slow"),
    (
        "gate_error",
        "the supervisor could not take or bind it (its pack, its commit, the state)",
    ),
];

/// The words for a reason code; an unknown code (an older entry) says so.
pub fn reason_words(code: &str) -> &'static str {
    REASONS
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, w)| *w)
        .unwrap_or("a malformed request")
}

/// A door request the gate refused (or could not decide), as the audit
/// recorded it: content-free.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Refusal {
    pub run: String,
    pub time: String,
    pub door: String,
    pub destination: Option<String>,
    /// `refused` or `error`.
    pub verdict: String,
    /// The deciding rule (`nightshift:routing`, `nightshift:labels`, a rule id).
    pub rule: Option<String>,
    /// Why a request that never became one was refused: its code (one of
    /// [`REASONS`]; older entries have none).
    #[serde(default)]
    pub reason: Option<String>,
}

impl Refusal {
    /// Who or what refused it, in words: the deciding rule, or the door's
    /// reason for a request that never became one.
    pub fn by(&self) -> String {
        match (&self.rule, &self.reason) {
            (Some(rule), _) => rule.clone(),
            (None, Some(code)) => format!("the door: {} ({code})", reason_words(code)),
            (None, None) => "the door (a malformed request)".to_string(),
        }
    }
}

/// The refused door requests of one run, or of every run, oldest first.
pub fn refusals(store: &dyn StateStore, run: Option<&str>) -> Result<Vec<Refusal>, StoreError> {
    Ok(store
        .door_refusals(run)?
        .into_iter()
        .map(|e| {
            let text = |k: &str| e.body.get(k).and_then(|v| v.as_str()).map(str::to_string);
            Refusal {
                run: e.run.clone().unwrap_or_default(),
                time: e.time.clone(),
                door: text("door").unwrap_or_default(),
                destination: text("destination"),
                verdict: text("verdict").unwrap_or_default(),
                rule: text("rule"),
                // A fixed code: anything else (an entry not of ours) is not shown.
                reason: text("reason").filter(|c| REASONS.iter().any(|(known, _)| known == c)),
            }
        })
        .collect())
}

/// Most commits [`publishes`] lists (all are counted).
pub const MAX_LISTED_COMMITS: u64 = 1000;

/// What a push or pull request would publish that its destination does not
/// hold yet: every commit reachable from the act's commit and from none of
/// the destination's refs (not only the change against the run's base or a
/// first parent: a merge's other parents, and a base the destination never
/// had, are listed too).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Publishes {
    /// `commit ID` and subject lines, newest first, at most
    /// [`MAX_LISTED_COMMITS`] of them (the host's git log; agent-written:
    /// escape before showing).
    pub log: Vec<u8>,
    /// How many commits in all.
    pub count: u64,
    /// What the destination was taken to hold (supervisor-written).
    pub against: String,
}

/// The commits the destination holds, as far as can be told now: the ids
/// of every ref the remote advertises (for a pull request, the forge's
/// remote), or, when it cannot be read, the ref the push was bound to.
/// Returns the ids and a line saying which.
pub fn destination_holds(dest: &Destinations, act: &Act) -> (Vec<String>, String) {
    let alias = &act.routing.destination;
    let remote_alias = match &act.routing.target {
        Target::PullRequest { .. } => dest.forges.get(alias).map(|f| f.remote.as_str()),
        _ => Some(alias.as_str()),
    };
    let bound = match &act.routing.target {
        Target::Push {
            target_ref,
            expected_old,
        } => Some((target_ref.clone(), expected_old.clone())),
        _ => None,
    };
    let read = remote_alias
        .and_then(|a| dest.remotes.get(a).map(|r| (a, r)))
        .ok_or_else(|| "it is no longer configured".to_string())
        .and_then(|(a, r)| {
            orchestrator_executors::remote_heads(r)
                .map(|heads| (a, heads))
                .map_err(|e| e.audit_reason())
        });
    match (read, bound) {
        (Ok((a, heads)), _) => (
            heads.into_iter().map(|(_, id)| id).collect(),
            format!("not on any ref of remote {a} now"),
        ),
        (Err(why), Some((target_ref, Some(old)))) => (
            vec![old.clone()],
            format!(
                "not in {target_ref} as bound ({old}); the destination could not be read now: {why}"
            ),
        ),
        (Err(why), _) => (
            Vec::new(),
            format!("every commit: the destination could not be read now: {why}"),
        ),
    }
}

/// The commits reachable from `commit` and from none of `held` in the host
/// repository `repo` (the host's git; ids the host lacks are ignored, so
/// their commits are listed: never fewer than would be published). `None`
/// when git could not say.
pub fn publishes(repo: &Path, commit: &str, held: &[String], against: String) -> Option<Publishes> {
    let is_id = |s: &str| s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !is_id(commit) {
        return None;
    }
    let mut revs = format!("{commit}\n");
    for id in held.iter().filter(|id| is_id(id)) {
        revs.push_str(&format!("^{id}\n"));
    }
    let git = |args: &[&str]| -> Option<Vec<u8>> {
        use std::io::Write;
        let mut child = std::process::Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(["-c", "core.pager=cat"])
            .args(args)
            .args(["--ignore-missing", "--stdin"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let mut stdin = child.stdin.take()?;
        let written = stdin.write_all(revs.as_bytes());
        drop(stdin);
        let out = child.wait_with_output().ok()?;
        (written.is_ok() && out.status.success()).then_some(out.stdout)
    };
    let count = git(&["rev-list", "--count"])?;
    let count = String::from_utf8_lossy(&count).trim().parse().ok()?;
    let log = git(&[
        "log",
        "--no-decorate",
        "--no-color",
        &format!("--max-count={MAX_LISTED_COMMITS}"),
        "--format=commit %H%n    %s",
    ])?;
    Some(Publishes {
        log,
        count,
        against,
    })
}

/// A message body as the owner reads it in `queue show`: whole, line by
/// line, with runs of three or more blank lines collapsed into one visible
/// `[N blank lines]` marker (so nothing can hide below a harmless preview),
/// and its size and line count. Pure; the lines are returned unescaped (the
/// caller escapes them for the terminal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyView {
    pub bytes: usize,
    pub lines: usize,
    pub shown: Vec<String>,
}

pub fn body_view(body: &[u8]) -> BodyView {
    let text = String::from_utf8_lossy(body);
    let all: Vec<&str> = text.split('\n').collect();
    // A trailing newline ends the last line; it does not start another.
    let all = match all.split_last() {
        Some((&"", rest)) => rest.to_vec(),
        _ => all,
    };
    let mut shown = Vec::new();
    let mut blank = 0usize;
    let flush = |blank: &mut usize, shown: &mut Vec<String>| {
        match *blank {
            0 => {}
            n if n < 3 => shown.extend(std::iter::repeat_n(String::new(), n)),
            n => shown.push(format!("[{n} blank lines]")),
        }
        *blank = 0;
    };
    for line in &all {
        if line.trim().is_empty() {
            blank += 1;
        } else {
            flush(&mut blank, &mut shown);
            shown.push((*line).to_string());
        }
    }
    flush(&mut blank, &mut shown);
    BodyView {
        bytes: body.len(),
        lines: all.len(),
        shown,
    }
}

/// The lines of a body worth looking for in the repository: long enough to
/// be more than a common word or brace, each once.
pub fn distinctive_lines(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(body);
    let mut out: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| l.chars().count() >= 16)
        .map(str::to_string)
        .collect();
    out.sort();
    out.dedup();
    out.truncate(2000);
    out
}

#[cfg(test)]
mod label_tests {
    use super::*;
    use policies::{Confidentiality, Integrity, Label};
    use proptest::prelude::*;

    fn label() -> impl Strategy<Value = Label> {
        prop::sample::select(Label::ALL.to_vec())
    }

    fn confidentiality() -> impl Strategy<Value = Confidentiality> {
        prop::sample::select(vec![Confidentiality::Public, Confidentiality::Private])
    }

    proptest! {
        /// Along a run's flow (its content label, then any values derived
        /// from it and from other inputs), a label never improves: every
        /// derived value's label is at least the run's, and never trusted.
        #[test]
        fn labels_along_a_run_never_improve(
            repo in confidentiality(),
            inputs in prop::collection::vec(label(), 0..8),
        ) {
            let start = run_content_label(repo);
            prop_assert_eq!(start.integrity, Integrity::Untrusted);
            prop_assert_eq!(start.confidentiality, repo);
            let mut current = start;
            for input in inputs {
                let next = current.join(input);
                prop_assert!(current.flows_to(next));
                prop_assert!(start.flows_to(next));
                prop_assert!(!next.is_trusted());
                current = next;
            }
        }
    }

    #[test]
    fn a_private_repository_never_reaches_public_readers() {
        let mut dest = Destinations::default();
        dest.remotes.insert(
            "origin".into(),
            orchestrator_executors::RemoteConfig::new("http://127.0.0.1:1/r.git", Readers::Public),
        );
        let push = Request::Push {
            remote: "origin".into(),
            dst_ref: "refs/heads/x".into(),
            claimed_commit: "a".repeat(40),
            force: false,
            delete: false,
            pack_bytes: 0,
        };
        let private = run_content_label(Confidentiality::Private);
        let Err(Response::Refused { rule, reason }) = route_and_label(&dest, &push, private) else {
            panic!("private content to public readers was not refused");
        };
        assert_eq!(rule, "nightshift:labels");
        assert!(reason.contains("untrusted, private"), "{reason}");
        let public = run_content_label(Confidentiality::Public);
        let verdict = route_and_label(&dest, &push, public).unwrap();
        assert_eq!(verdict.verdict, policies::Verdict::Ask);
    }
}

#[cfg(test)]
mod policy_args_tests {
    use super::*;

    /// One request of each door.
    fn every_request() -> Vec<Request> {
        vec![
            Request::Push {
                remote: "origin".into(),
                dst_ref: "refs/heads/main".into(),
                claimed_commit: "a".repeat(40),
                force: true,
                delete: false,
                pack_bytes: 0,
            },
            Request::PullRequest {
                remote: "origin".into(),
                base: "refs/heads/main".into(),
                head: "refs/heads/x".into(),
                head_commit: "b".repeat(40),
                pack_bytes: 0,
                title: "t".into(),
                body: "b".into(),
            },
            Request::Notify {
                destination: "team".into(),
                body: "b".into(),
            },
            Request::Ask { body: "b".into() },
        ]
    }

    #[test]
    fn the_policy_sees_exactly_the_fields_the_door_schema_names() {
        for req in every_request() {
            let schema = policies::doors::door(req.door())
                .unwrap_or_else(|| panic!("door {} is not in the schema", req.door()));
            let args = policy_args(&req, "/repo");
            let mut keys: Vec<&str> = args
                .as_object()
                .map(|m| m.keys().map(String::as_str).collect())
                .unwrap_or_default();
            let mut want: Vec<&str> = schema.fields.to_vec();
            keys.sort_unstable();
            want.sort_unstable();
            assert_eq!(keys, want, "door {}", req.door());
        }
    }
}

/// The door's gate on the in-memory fake store: each step that refuses is
/// audited, a request that cannot be audited is never trusted, and a
/// question is queued exactly once.
#[cfg(test)]
mod gate_tests {
    use super::*;
    use nightshift_core::state_store::fake::MemStore;

    fn door() -> RunDoor {
        RunDoor {
            run: "r1".into(),
            repo: PathBuf::from("/nonexistent"),
            base_commit: "0".repeat(40),
            content: run_content_label(policies::Confidentiality::Private),
            dry_run: false,
            result: None,
        }
    }

    fn ask() -> Request {
        Request::Ask {
            body: "may I?".into(),
        }
    }

    /// (verdict, rule) of each door request the store audited.
    fn audited(store: &MemStore) -> Vec<(String, Option<String>)> {
        store
            .audit
            .iter()
            .filter(|e| e.kind == "door_request")
            .map(|e| {
                (
                    e.body["verdict"].as_str().unwrap_or_default().to_string(),
                    e.body["rule"].as_str().map(str::to_string),
                )
            })
            .collect()
    }

    fn refused_by(answer: &Response) -> &str {
        match answer {
            Response::Refused { rule, .. } => rule,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn a_question_is_queued_once_and_audited() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MemStore::new(dir.path());
        let answer = handle(&mut store, &door(), ask(), None);
        let Response::Queued { act } = answer else {
            panic!("not queued: {answer:?}");
        };
        assert_eq!(store.acts.len(), 1);
        assert_eq!(store.acts[0].0, act);
        assert_eq!(store.acts[0].4.as_deref(), Some(&b"may I?"[..]));
        let door_requests = audited(&store);
        assert_eq!(door_requests.len(), 1);
        assert_eq!(door_requests[0].0, "queued");
        assert!(store.kinds().contains(&"act"));
        orchestrator_audit::verify(&store.log, &store.audit, &[]).unwrap();
    }

    #[test]
    fn an_unconfigured_destination_is_refused_and_audited() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MemStore::new(dir.path());
        // An alias the owner never configured: refused by routing.
        let req = Request::Notify {
            destination: "team-room".into(),
            body: "hello".into(),
        };
        let answer = handle(&mut store, &door(), req, None);
        assert_eq!(refused_by(&answer), "nightshift:routing");
        // A raw URL: not even a well-formed request.
        let req = Request::Notify {
            destination: "https://evil.example/hook".into(),
            body: "hello".into(),
        };
        let answer = handle(&mut store, &door(), req, None);
        assert!(matches!(answer, Response::Error { .. }), "{answer:?}");
        assert!(store.acts.is_empty());
        let routing = Some("nightshift:routing".to_string());
        assert_eq!(
            audited(&store),
            [
                ("refused".to_string(), routing),
                ("error".to_string(), None)
            ]
        );
    }

    #[test]
    fn a_freeze_refuses_and_is_audited() {
        let dir = tempfile::tempdir().unwrap();
        // The freeze's policy row, as the real store writes it.
        let mut real = nightshift_store_sqlite::store::Store::open(
            nightshift_core::state_store::StatePaths::new(dir.path().join("real")),
        )
        .unwrap();
        nightshift_core::policy::freeze(&mut real, None, "night off").unwrap();
        let mut store = MemStore::new(dir.path());
        store.policy_rows = real.policy_rows().unwrap();
        let answer = handle(&mut store, &door(), ask(), None);
        assert_eq!(refused_by(&answer), "nightshift:freeze");
        assert!(store.acts.is_empty());
        assert_eq!(audited(&store)[0].0, "refused");
    }

    #[test]
    fn an_unreadable_policy_refuses_and_is_audited() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MemStore::new(dir.path());
        store.policy_rows = vec![serde_json::json!({"not": "a row"})];
        let answer = handle(&mut store, &door(), ask(), None);
        assert_eq!(refused_by(&answer), "nightshift:policy");
        assert_eq!(audited(&store).len(), 1);
        assert!(store.acts.is_empty());
    }

    #[test]
    fn the_act_cap_refuses_and_is_audited() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MemStore::new(dir.path());
        for n in 0..MAX_ACTS_PER_RUN {
            store.acts.push((
                format!("a{n}"),
                "r1".into(),
                serde_json::Value::Null,
                serde_json::Value::Null,
                None,
            ));
        }
        let answer = handle(&mut store, &door(), ask(), None);
        assert_eq!(refused_by(&answer), "nightshift:rate-cap");
        assert_eq!(store.acts.len() as u64, MAX_ACTS_PER_RUN);
        assert_eq!(audited(&store)[0].0, "refused");
    }

    #[test]
    fn a_store_that_cannot_count_answers_an_error_that_is_audited() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MemStore::new(dir.path());
        store.fail_counts = true;
        let answer = handle(&mut store, &door(), ask(), None);
        assert!(matches!(answer, Response::Error { .. }), "{answer:?}");
        assert_eq!(audited(&store), [("error".to_string(), None)]);
    }

    #[test]
    fn a_request_whose_audit_fails_is_answered_as_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MemStore::new(dir.path());
        store.fail_appends = true;
        let answer = handle(&mut store, &door(), ask(), None);
        let Response::Error { reason } = answer else {
            panic!("answered as if audited: {answer:?}");
        };
        assert!(reason.contains("could not record"), "{reason}");
        assert!(audited(&store).is_empty());
    }

    #[test]
    fn a_dry_act_is_recorded_once_without_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MemStore::new(dir.path());
        let door = RunDoor {
            dry_run: true,
            ..door()
        };
        let body = "SECRET-BODY-OF-THE-AGENT";
        let answer = handle(&mut store, &door, Request::Ask { body: body.into() }, None);
        assert!(matches!(answer, Response::Queued { .. }), "{answer:?}");
        assert_eq!(store.dry_acts.len(), 1);
        assert_eq!(audited(&store).len(), 1);
        let recorded = format!("{:?} {:?}", store.dry_acts, store.audit);
        assert!(!recorded.contains(body), "content recorded: {recorded}");
    }

    #[test]
    fn a_deletion_is_refused_after_the_policy_and_reads_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("destinations.toml"),
            "[remotes.origin]\nurl = \"http://127.0.0.1:1/r.git\"\nreaders = \"private\"\n",
        )
        .unwrap();
        let mut store = MemStore::new(dir.path());
        // The door's repository does not exist: anything that read it would fail otherwise.
        let delete = Request::Push {
            remote: "origin".into(),
            dst_ref: "refs/heads/agent/x".into(),
            claimed_commit: "0".repeat(40),
            force: false,
            delete: true,
            pack_bytes: 0,
        };
        let answer = handle(&mut store, &door(), delete, None);
        assert_eq!(refused_by(&answer), "nightshift:delete");
        assert!(store.acts.is_empty());
        assert_eq!(audited(&store)[0].0, "refused");
    }
}

/// The act queue on the fake store: approvals, rejections and staleness
/// against a real loopback endpoint that counts what reaches it.
#[cfg(test)]
mod queue_tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;
    use nightshift_core::state_store::fake::{MemStore, SharedMemStore};

    /// An HTTP endpoint on loopback that answers 200 and counts the posts
    /// that reached it.
    fn endpoint() -> (String, Arc<AtomicUsize>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let posts = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&posts);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let mut reader = BufReader::new(&stream);
                let (mut first, mut length) = (String::new(), 0usize);
                let _ = reader.read_line(&mut first);
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some((name, value)) = line.split_once(':') {
                        if name.eq_ignore_ascii_case("content-length") {
                            length = value.trim().parse().unwrap_or(0);
                        }
                    }
                }
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                if first.starts_with("POST ") {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
                let _ = (&stream).write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
            }
        });
        (url, posts)
    }

    struct Queue {
        _dir: tempfile::TempDir,
        store: MemStore,
        key: PathBuf,
        posts: Arc<AtomicUsize>,
        act: String,
    }

    fn door() -> RunDoor {
        RunDoor {
            run: "r1".into(),
            repo: PathBuf::from("/nonexistent"),
            base_commit: "0".repeat(40),
            content: run_content_label(policies::Confidentiality::Private),
            dry_run: false,
            result: None,
        }
    }

    /// A state with the owner's key, one notify destination on a counting
    /// endpoint, and one message the run asked to send, queued.
    fn queue() -> Queue {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("state");
        std::fs::create_dir(&root).unwrap();
        let (url, posts) = endpoint();
        std::fs::write(
            root.join("destinations.toml"),
            format!("[notify.room]\nurl = \"{url}\"\nreaders = \"private\"\n"),
        )
        .unwrap();
        let mut store = MemStore::new(&root);
        let key = dir.path().join("owner.key");
        std::fs::write(&key, "the-owner\n").unwrap();
        store
            .meta
            .insert(owner::META_KEY.to_string(), digest("the-owner".as_bytes()));
        let answer = handle(
            &mut store,
            &door(),
            Request::Notify {
                destination: "room".into(),
                body: "the night went well".into(),
            },
            None,
        );
        let Response::Queued { act } = answer else {
            panic!("not queued: {answer:?}");
        };
        Queue {
            _dir: dir,
            store,
            key,
            posts,
            act,
        }
    }

    fn state<S: StateStore + ?Sized>(store: &S, act: &str) -> State {
        rows(store, Some(act)).unwrap().pop().unwrap().state
    }

    /// Audit entries that moved `act` to `transition`.
    fn moves(store: &MemStore, act: &str, transition: &str) -> usize {
        store
            .audit
            .iter()
            .filter(|e| e.kind == "act" && e.body["act"] == act)
            .filter(|e| e.body["transition"] == transition)
            .count()
    }

    #[test]
    fn an_approved_act_is_carried_out_once_however_often_it_is_approved() {
        let mut q = queue();
        let key = Some(q.key.as_path());
        let first = approve(&mut q.store, &q.act, key).unwrap();
        assert!(first.carried_out, "{first:?}");
        assert_eq!(q.posts.load(Ordering::SeqCst), 1);
        // Approved again: nothing more happens.
        let again = approve(&mut q.store, &q.act, key);
        assert!(!again.as_ref().is_ok_and(|d| d.carried_out), "{again:?}");
        assert_eq!(q.posts.load(Ordering::SeqCst), 1);
        assert!(matches!(state(&q.store, &q.act), State::Done { .. }));
        assert_eq!(moves(&q.store, &q.act, "done"), 1);
        orchestrator_audit::verify(&q.store.log, &q.store.audit, &[]).unwrap();
    }

    #[test]
    fn two_executors_at_once_carry_an_approval_out_once() {
        // The approval only decides; two executors then race for the act:
        // one holds its lease, the other finds nothing to claim.
        let mut q = queue();
        let decided = approve_as(&mut q.store, &q.act, Some(&q.key), "owner").unwrap();
        assert!(!decided.carried_out, "{decided:?}");
        assert_eq!(
            q.posts.load(Ordering::SeqCst),
            0,
            "approving carried it out"
        );
        let shared = SharedMemStore::new(q.store);
        let start = Arc::new(std::sync::Barrier::new(2));
        let racers: Vec<_> = (0..2)
            .map(|i| {
                let (mut store, start) = (shared.clone(), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    pass(&mut store, &format!("executor {i}"), 30)
                })
            })
            .collect();
        for r in racers {
            r.join().unwrap().unwrap();
        }
        assert_eq!(q.posts.load(Ordering::SeqCst), 1);
        assert_eq!(moves(&shared.lock(), &q.act, "done"), 1);
        assert_eq!(moves(&shared.lock(), &q.act, "executing"), 1);
    }

    #[test]
    fn two_approvals_racing_on_one_act_carry_it_out_once() {
        let q = queue();
        let shared = SharedMemStore::new(q.store);
        let start = Arc::new(std::sync::Barrier::new(2));
        let racers: Vec<_> = (0..2)
            .map(|_| {
                let (mut store, start) = (shared.clone(), Arc::clone(&start));
                let (act, key) = (q.act.clone(), q.key.clone());
                std::thread::spawn(move || {
                    start.wait();
                    approve(&mut store, &act, Some(&key))
                })
            })
            .collect();
        let outcomes: Vec<_> = racers.into_iter().map(|r| r.join().unwrap()).collect();
        // One approval decided, the other found it decided; each approver
        // then waits for the act to settle, so both may report it done,
        // but the message went out once.
        assert!(
            outcomes
                .iter()
                .any(|o| o.as_ref().is_ok_and(|d| d.carried_out)),
            "{outcomes:?}"
        );
        assert_eq!(q.posts.load(Ordering::SeqCst), 1);
        assert_eq!(moves(&shared.lock(), &q.act, "approved"), 1);
        assert_eq!(moves(&shared.lock(), &q.act, "done"), 1);
    }

    #[test]
    fn a_rejected_act_is_never_carried_out() {
        let mut q = queue();
        let key = Some(q.key.as_path());
        reject(&mut q.store, &q.act, "not tonight", key).unwrap();
        let later = approve(&mut q.store, &q.act, key);
        assert!(!later.as_ref().is_ok_and(|d| d.carried_out), "{later:?}");
        assert_eq!(q.posts.load(Ordering::SeqCst), 0);
        assert!(matches!(state(&q.store, &q.act), State::Rejected { .. }));
        assert_eq!(moves(&q.store, &q.act, "done"), 0);
    }

    #[test]
    fn rejecting_needs_the_owners_key() {
        let mut q = queue();
        let dir = tempfile::tempdir().unwrap();
        let wrong = dir.path().join("wrong.key");
        std::fs::write(&wrong, "someone-else\n").unwrap();
        assert!(reject(&mut q.store, &q.act, "no", Some(&wrong)).is_err());
        assert!(approve(&mut q.store, &q.act, Some(&wrong)).is_err());
        assert!(approve(&mut q.store, &q.act, None).is_err());
        assert_eq!(state(&q.store, &q.act), State::Pending);
        assert_eq!(q.posts.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn an_act_a_rule_now_refuses_goes_stale_and_is_not_carried_out() {
        let mut q = queue();
        // The run's own actor refuses its messages after the act was queued.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("own.toml");
        std::fs::write(
            &file,
            "[[rule]]\nid = \"no-notify-now\"\nsubject = \"run-r1\"\ndoors = [\"notify\"]\n\
             effect = \"refuse\"\nreason = \"no messages after all\"\nauthority = \"run-r1\"\n",
        )
        .unwrap();
        let mut real = nightshift_store_sqlite::store::Store::open(
            nightshift_core::state_store::StatePaths::new(dir.path().join("real")),
        )
        .unwrap();
        nightshift_core::policy::declare(
            &mut real,
            None,
            &file,
            &nightshift_core::policy::Writer::Agent("run-r1".into()),
        )
        .unwrap();
        q.store.policy_rows = real.policy_rows().unwrap();
        let key = Some(q.key.as_path());
        let decided = approve(&mut q.store, &q.act, key).unwrap();
        assert!(!decided.carried_out, "{decided:?}");
        let State::Stale { why } = state(&q.store, &q.act) else {
            panic!("not stale: {:?}", state(&q.store, &q.act));
        };
        assert!(why.contains("no-notify-now"), "{why}");
        assert_eq!(q.posts.load(Ordering::SeqCst), 0);
        // Approving it again carries nothing out either.
        let again = approve(&mut q.store, &q.act, key).unwrap();
        assert!(!again.carried_out, "{again:?}");
        assert_eq!(q.posts.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_dry_run_records_the_would_be_verdict_and_queues_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MemStore::new(dir.path());
        let door = RunDoor {
            dry_run: true,
            ..door()
        };
        let answer = handle(
            &mut store,
            &door,
            Request::Ask {
                body: "may I?".into(),
            },
            None,
        );
        let Response::Queued { act } = answer else {
            panic!("not answered as queued: {answer:?}");
        };
        assert!(act.starts_with('d'), "{act}");
        assert!(store.acts.is_empty(), "a dry run queued {:?}", store.acts);
        assert_eq!(store.dry_acts.len(), 1);
        assert_eq!(store.dry_acts[0].0, act);
        assert_eq!(
            store.dry_acts[0].2["would"], "asked",
            "{:?}",
            store.dry_acts[0].2
        );
        let verdicts: Vec<_> = store
            .audit
            .iter()
            .filter(|e| e.kind == "door_request")
            .map(|e| e.body["verdict"].clone())
            .collect();
        assert_eq!(verdicts.len(), 1, "{:?}", store.kinds());
    }
}

#[cfg(test)]
mod reason_tests {
    use super::agent_reason;
    use orchestrator_git::GitError;

    /// A tree that can never pass says so; the supervisor's own trouble
    /// asks for a retry.
    #[test]
    fn a_permanent_refusal_never_says_try_again() {
        let c = "0123456789012345678901234567890123456789";
        let bad = agent_reason(
            c,
            &GitError::InvalidTreeEntry {
                tree: "ab".repeat(20),
                name: ".git".into(),
                why: "a reserved name",
            },
        );
        assert!(!bad.contains("try again"), "{bad}");
        assert!(bad.contains("never will be"), "{bad}");
        assert!(bad.contains("refused entry \".git\""), "{bad}");
        let trouble = agent_reason(
            c,
            &GitError::Io {
                action: "writing",
                path: "/nowhere".into(),
                source: std::io::Error::other("disk full"),
            },
        );
        assert!(trouble.contains("try again later"), "{trouble}");
    }
}

#[cfg(test)]
mod bound_tests {
    use super::*;
    use nightshift_core::config::QueueBounds;
    use proptest::prelude::*;

    #[test]
    fn nights_start_at_noon_utc() {
        // 2026-12-05 22:00 UTC and 2026-12-06 11:59 UTC: the night of the 5th.
        assert_eq!(night_start(1_796_508_000), "2026-12-05T12:00:00Z");
        assert_eq!(night_start(1_796_558_340), "2026-12-05T12:00:00Z");
        assert_eq!(night_start(1_796_558_400), "2026-12-06T12:00:00Z");
    }

    #[test]
    fn past_a_bound_the_refusal_names_it() {
        let b = QueueBounds {
            per_night: 10,
            per_repository: 4,
        };
        assert_eq!(queue_bound_refusal(b, 9, 3), None);
        let (rule, why) = queue_bound_refusal(b, 10, 0).unwrap();
        assert_eq!(rule, "nightshift:queue-night");
        assert!(why.contains("max_acts_per_night = 10"), "{why}");
        let (rule, why) = queue_bound_refusal(b, 5, 4).unwrap();
        assert_eq!(rule, "nightshift:queue-repository");
        assert!(why.contains("max_acts_per_repository = 4"), "{why}");
    }

    proptest! {
        #[test]
        fn a_request_passes_only_under_both_bounds(
            night in 0u64..50, repo in 0u64..50, tonight in 0u64..60, of_repo in 0u64..60,
        ) {
            let b = QueueBounds { per_night: night, per_repository: repo };
            let passes = queue_bound_refusal(b, tonight, of_repo).is_none();
            prop_assert_eq!(passes, tonight < night && of_repo < repo);
        }

        #[test]
        fn a_moment_lies_in_the_day_after_its_night_starts(t in 0i64..4_000_000_000) {
            let start = time::OffsetDateTime::parse(
                &night_start(t),
                &time::format_description::well_known::Rfc3339,
            )
            .unwrap()
            .unix_timestamp();
            prop_assert!(start <= t && t < start + 86_400);
            prop_assert_eq!(start.rem_euclid(86_400), 12 * 3600);
        }
    }
}
