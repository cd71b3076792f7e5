//! Acts: the door's requests, the gate, the deferred queue's store, and the
//! carrying out of approved acts with credentials no sandbox held.
//!
//! Invariants:
//! - Every request passes, in order: the freeze, routing (the destination is
//!   an alias the owner configured), labels (agent-made content is
//!   untrusted; private content never goes to a public destination), and the
//!   policy. Every verdict is an audit entry holding digests, never content.
//! - Content agent-made is untrusted, so nothing is carried out without a
//!   person: an allowing rule still queues the act.
//! - What an act carries is bound when it is requested: a push's or pull
//!   request's commit is the one the request names, taken from the pack the
//!   agent sent with it (indexed in a scratch directory of the supervisor's,
//!   hash-checked, required to be connected to what the host holds) and
//!   copied into the host repository under `refs/nightshift/acts/<id>`; a
//!   message's body is kept in the state store and bound by its digest.
//! - Nothing here reads the run's worktree: while the sandbox runs, its
//!   tree is never opened, listed or deleted from by path. A deletion (the
//!   all-zero commit) reads nothing at all; after the policy it is refused
//!   (`nightshift:delete`), since no executor carries deletions out yet.
//! - Replies are phrased for the agent and name no host path.
//! - Every queue transition is written with its audit entry in one
//!   transaction, conditioned on the state it moves from; an approved act is
//!   re-checked immediately before it is carried out, and a changed
//!   destination or policy makes it stale instead of executing.

use std::path::{Path, PathBuf};

use deferred_queue::{Act, Content, Door, Routing, State, Target};
use orchestrator_executors::{Destinations, Readers};
use sandbox_image_door::message::{Request, Response};
use serde_json::json;

use crate::audit_log::{digest, Event};
use crate::owner;
use crate::store::{Store, StoreError};

/// Where the owner's destinations are configured.
pub fn destinations_path(store: &Store) -> PathBuf {
    store.paths().root.join("destinations.toml")
}

pub fn destinations(store: &Store) -> Result<Destinations, String> {
    let path = destinations_path(store);
    if !path.exists() {
        return Ok(Destinations::default());
    }
    Destinations::load(&path).map_err(|e| e.to_string())
}

/// The most acts one run may request; past it every request is refused.
pub const MAX_ACTS_PER_RUN: u64 = 200;
/// (pending, approval) lifetimes from the state's configuration.
fn ttls(store: &Store) -> (i64, i64) {
    crate::config::Config::load(&store.paths().root.join("config.toml"))
        .map(|c| c.queue_ttls())
        .unwrap_or((7 * 24 * 3600, 24 * 3600))
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
    /// Whether the repository's content is public (otherwise private).
    pub public_content: bool,
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
        Request::Ask { .. } => None,
    }
}

/// The pure part of the gate: routing and labels.
pub fn route_and_label(
    dest: &Destinations,
    req: &Request,
    public_content: bool,
) -> Result<(), Response> {
    let readers = match req {
        Request::Push { remote, .. } => dest.remotes.get(remote).map(|r| r.readers),
        Request::PullRequest { remote, .. } => dest.forges.get(remote).map(|f| f.readers),
        Request::Notify { destination, .. } => dest.notify.get(destination).map(|n| n.readers),
        Request::Ask { .. } => Some(Readers::Private),
    };
    let Some(readers) = readers else {
        return Err(refused(
            "nightshift:routing",
            format!(
                "{:?} is not a destination the owner configured for {}; destinations are aliases, never URLs or paths",
                destination_of(req).unwrap_or(""),
                req.door()
            ),
        ));
    };
    if !public_content && readers == Readers::Public {
        return Err(refused(
            "nightshift:labels",
            format!(
                "private content may not go to {:?}, whose readers are public",
                destination_of(req).unwrap_or("")
            ),
        ));
    }
    Ok(())
}

/// Decides one door request and, when a person must decide, queues it.
pub fn handle(
    store: &mut Store,
    door: &RunDoor,
    req: Request,
    received: Option<&Received>,
) -> Response {
    let req_digest = request_digest(&req);
    let bytes = serde_json::to_vec(&req)
        .map(|v| v.len() as u64)
        .unwrap_or(0);
    let answer = decide(store, door, &req, received);
    let (verdict, rule, act) = match &answer {
        Response::Refused { rule, .. } => ("refused", Some(rule.clone()), None),
        Response::Queued { act } => ("queued", None, Some(act.clone())),
        Response::Done { .. } => ("done", None, None),
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
        },
        false,
    );
    match audited {
        Ok(_) => answer,
        // An act that cannot be audited is not queued for anyone to trust.
        Err(e) => Response::Error {
            reason: format!("the supervisor could not record the request: {e}"),
        },
    }
}

fn decide(
    store: &mut Store,
    door: &RunDoor,
    req: &Request,
    received: Option<&Received>,
) -> Response {
    if let Err(e) = req.validate() {
        return Response::Error {
            reason: e.to_string(),
        };
    }
    let rules = match crate::policy::load(store, None) {
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
    match store.count_acts(&door.run) {
        Ok(n) if n >= MAX_ACTS_PER_RUN => {
            return refused(
                "nightshift:rate-cap",
                format!("this run has requested {n} acts, the most one run may"),
            )
        }
        Err(_) => {
            return Response::Error {
                reason: "the supervisor could not count this run's acts; try again later".into(),
            }
        }
        _ => {}
    }
    let dest = match destinations(store) {
        Ok(d) => d,
        Err(e) => return refused("nightshift:routing", e),
    };
    if let Err(answer) = route_and_label(&dest, req, door.public_content) {
        return answer;
    }
    // The policy, on the request's routing (content is never matched on).
    let args = match req {
        Request::Push {
            remote, dst_ref, ..
        } => json!({"remote": remote, "ref": dst_ref}),
        Request::PullRequest {
            remote, base, head, ..
        } => json!({"remote": remote, "base": base, "head": head}),
        Request::Notify { destination, .. } => json!({"destination": destination}),
        Request::Ask { .. } => json!({}),
    };
    let actor = format!("run-{}", door.run);
    let decision = policies::evaluate(
        &rules,
        &policies::Request {
            actor: Some(actor.clone()),
            door: req.door().to_string(),
            args,
            scope: None,
        },
        crate::policy::now(),
    );
    let _ =
        crate::policy::record_decision(store, Some(&door.run), Some(&actor), req.door(), &decision);
    if decision.verdict == policies::Verdict::Refuse {
        return refused(&decision.rule.to_string(), decision.reason);
    }
    if matches!(req, Request::Push { delete: true, .. }) {
        return refused(
            "nightshift:delete",
            "deleting a remote branch is not carried out by nightshift yet; ask a person instead",
        );
    }
    // Allow or ask: agent-made content is untrusted, so a person decides.
    let id = format!("a{}", ulid::Ulid::new().to_string().to_lowercase());
    let (door_kind, routing, content, body) = match bind(&dest, door, req, &id, received) {
        Ok(b) => b,
        Err(answer) => return answer,
    };
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
    let queued = store.put_act(
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
    );
    match queued {
        Ok(()) => Response::Queued { act: id },
        Err(e) => Response::Error {
            reason: format!("queueing the act: {e}"),
        },
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
            "commit {commit} is not connected: object {missing} is neither in the pack sent nor in the repository the run started from"
        ),
        E::BadPack { why } => {
            format!("the pack sent for commit {commit} is not a valid git pack: {why}")
        }
        E::MissingObject { .. }
        | E::MalformedObject { .. }
        | E::TooManyObjects { .. }
        | E::ObjectTooLarge { .. }
        | E::TotalBytesExceeded { .. }
        | E::ObjectIdMismatch { .. }
        | E::InvalidCommitId { .. } => format!("commit {commit} was refused: {e}"),
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
    }
}

/// One queued act as stored.
#[derive(Debug, Clone)]
pub struct Row {
    pub act: Act,
    pub state: State,
    pub content: Option<Vec<u8>>,
}

pub fn rows(store: &Store, id: Option<&str>) -> Result<Vec<Row>, StoreError> {
    let mut out = Vec::new();
    for (act, state, content) in store.acts(id)? {
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

/// The owner's credential, as the queue's state machine wants it checked.
struct KeyCheck<'a>(&'a Store);

impl deferred_queue::CredentialCheck for KeyCheck<'_> {
    type Credential = Option<PathBuf>;
    type Error = owner::OwnerError;
    fn check(&self, key: &Option<PathBuf>) -> Result<String, owner::OwnerError> {
        owner::verify(self.0, key.as_deref()).map(|_| "owner".to_string())
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
fn step(
    store: &mut Store,
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
    Ok((next, effects))
}

pub fn reject(store: &mut Store, id: &str, why: &str, key: Option<&Path>) -> Result<(), String> {
    let by = deferred_queue::Owner::verify(&KeyCheck(store), &key.map(Path::to_path_buf))
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

/// The act's digest as it would be if created now: the remote's current
/// ref for a push, the policy's current generation.
fn recompute(store: &Store, dest: &Destinations, act: &Act) -> Result<String, String> {
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
        now_act.routing.target = Target::Push {
            target_ref: target_ref.clone(),
            expected_old: current,
        };
    }
    let rules = crate::policy::load(store, None).map_err(|e| e.to_string())?;
    if rules.freeze().is_some() {
        return Err("nightshift is frozen".into());
    }
    now_act.policy_generation = rules.generation().to_string();
    Ok(deferred_queue::act_digest(&now_act))
}

/// Approves an act (owner's credential) and carries it out at once.
pub fn approve(store: &mut Store, id: &str, key: Option<&Path>) -> Result<String, String> {
    let by = deferred_queue::Owner::verify(&KeyCheck(store), &key.map(Path::to_path_buf))
        .map_err(|e| e.to_string())?;
    let lock = executor_lock(store)?;
    recover(store, &lock)?;
    let row = rows(store, Some(id))
        .map_err(|e| e.to_string())?
        .pop()
        .ok_or_else(|| format!("no act with id {id}"))?;
    // Approved before a crash, never carried out: carry it out now.
    if matches!(row.state, State::Approved { .. }) {
        return execute(store, &row);
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
    let row = Row { state, ..row };
    execute(store, &row)
}

/// Re-checks and carries out an approved act; the outcome is stored.
pub fn execute(store: &mut Store, row: &Row) -> Result<String, String> {
    let dest = destinations(store)?;
    let recomputed = match recompute(store, &dest, &row.act) {
        Ok(d) => d,
        Err(why) => format!("unverifiable: {why}"),
    };
    let (state, effects) = step(
        store,
        row,
        &deferred_queue::Event::BeginExecution {
            recomputed_digest: recomputed,
            now: now(),
        },
    )?;
    let Some(attempt) = effects.iter().find_map(|e| match e {
        deferred_queue::Effect::Execute { attempt, .. } => Some(*attempt),
        _ => None,
    }) else {
        return Ok(format!("act {}: {}", row.act.id, state.name()));
    };
    let row = Row {
        state,
        ..row.clone()
    };
    let result = carry_out(store, &dest, &row);
    let event = match &result {
        Ok(outcome) => deferred_queue::Event::Succeeded {
            attempt,
            outcome: outcome.clone(),
        },
        Err(e) => deferred_queue::Event::AttemptFailed {
            attempt,
            reason: e.audit_reason(),
            retryable: e.retryable(),
            now: now(),
        },
    };
    let (state, _) = step(store, &row, &event)?;
    // A failure known not to have taken effect is retried after its backoff,
    // a bounded number of times (the queue's policy); then it is `failed`.
    if let State::AwaitingRetry { not_before, .. } = &state {
        let wait = (*not_before - now()).clamp(0, 120) as u64;
        std::thread::sleep(std::time::Duration::from_secs(wait));
        let row = Row { state, ..row };
        return execute(store, &row);
    }
    let why = match &state {
        State::Failed { reason, .. } => format!(" ({reason})"),
        _ => String::new(),
    };
    Ok(format!("act {}: {}{why}", row.act.id, state.name()))
}

fn carry_out(
    store: &Store,
    dest: &Destinations,
    row: &Row,
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
            let run = store
                .run(&row.act.run)
                .map_err(|e| invalid(&e.to_string()))?;
            let out = orchestrator_executors::push(
                remote,
                Path::new(&run.repo),
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
            let out = orchestrator_executors::notify(endpoint, &body, "text/plain; charset=utf-8")?;
            Ok(format!("HTTP {}", out.status))
        }
        (
            Door::PullRequest,
            Target::PullRequest { base_ref, head_ref },
            Content::PullRequest { head_commit, .. },
        ) => {
            let forge = dest
                .forges
                .get(&row.act.routing.destination)
                .ok_or_else(|| invalid("the forge is no longer configured"))?;
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
            Ok(format!("pull request #{}", out.number))
        }
        (Door::Ask, _, _) => Ok("answered in the morning".to_string()),
        _ => Err(invalid("this kind of act has no executor yet")),
    }
}

/// Held while acts are carried out or recovered: one executor at a time per
/// state, so recovery never mistakes a live attempt for a crashed one.
pub struct ExecutorLock {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl std::fmt::Debug for ExecutorLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExecutorLock")
    }
}

pub fn executor_lock(store: &Store) -> Result<ExecutorLock, String> {
    let path = store.paths().root.join("executor.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("opening {}: {e}", path.display()))?;
    let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| format!("locking {}: {e}", path.display()))?;
    Ok(ExecutorLock { _lock: lock })
}

/// After a crash: every act found executing (its executor is gone, since we
/// hold the lock) has an unknown outcome; the destination is checked, never
/// blindly written again. Then retries that are due are carried out.
/// Returns one line per act it moved.
pub fn recover(store: &mut Store, _lock: &ExecutorLock) -> Result<Vec<String>, String> {
    let mut lines = expire(store)?;
    let dest = destinations(store)?;
    for row in rows(store, None).map_err(|e| e.to_string())? {
        let row = if matches!(row.state, State::Executing { .. }) {
            let (state, _) = step(store, &row, &deferred_queue::Event::Recover)?;
            lines.push(format!(
                "act {}: {} (after a crash)",
                row.act.id,
                state.name()
            ));
            Row { state, ..row }
        } else {
            row
        };
        if let State::OutcomeUnknown { attempt, .. } = row.state {
            let found = check_destination(&dest, &row.act);
            let (state, _) = step(
                store,
                &row,
                &deferred_queue::Event::Resolve {
                    attempt,
                    found,
                    now: now(),
                },
            )?;
            lines.push(format!(
                "act {}: {} (destination checked)",
                row.act.id,
                state.name()
            ));
            let row = Row { state, ..row };
            if matches!(row.state, State::AwaitingRetry { .. }) {
                lines.push(execute(store, &row)?);
            }
        } else if let State::AwaitingRetry { not_before, .. } = row.state {
            if not_before <= now() {
                lines.push(execute(store, &row)?);
            }
        }
    }
    Ok(lines)
}

/// Moves every act whose time has passed to `expired` (a pending act past its
/// window, an approval past its own). Expiry refuses; it never proceeds.
pub fn expire(store: &mut Store) -> Result<Vec<String>, String> {
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
        _ => Found::CannotTell {
            why: "this destination keeps no record to check".into(),
        },
    }
}
