//! The commands that read or change the supervisor's own configuration:
//! the rules (`policy ...`), the destinations, the morning summary, the
//! dashboard's accounts, the image references, and one act in full
//! (`queue show`). Each is a method of [`Api`] that returns data; the
//! command line renders it (`main.rs`), nothing here prints.
//!
//! Invariants:
//! - Agent-written values (act bodies, diffs, names) are returned as they
//!   are, bytes where they may not be text: the front end escapes them.
//! - The harness hook's decision ([`Api::policy_check`]) never makes a
//!   state, and audits every refusal and ask it gives, refusals of bad input
//!   too; an allow is not audited
//!   (`tests/tests/hook_host.rs::without_a_state_the_hook_refuses_naming_how_to_make_one_and_makes_none`,
//!   `tests/tests/policy_cli.rs::refusals_and_asks_are_audited_by_digest_never_by_arguments`,
//!   `tests/tests/policy_cli.rs::the_hook_fails_closed_on_bad_input`,
//!   `tests/tests/policy_cli.rs::an_allowed_call_exits_0_prints_nothing_and_is_not_audited`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{owner, Api, ApiError, ErrorKind, Reply};
use nightshift_core::state_store::{StatePaths, StateStore};

/// A password in a command: never shown by `Debug`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// The rules as `policy list` shows them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PolicyView {
    pub generation: String,
    /// The freeze in force: its reason and its authority.
    #[schema(value_type = Option<Vec<String>>)]
    pub frozen: Option<(String, String)>,
    /// When the freeze in force began (RFC 3339), when recorded.
    #[serde(default)]
    pub frozen_at: Option<String>,
    /// The active rules as rows, `locked` being the lock state now.
    pub active: Vec<serde_json::Value>,
    /// Pending proposals: id and author.
    #[schema(value_type = Vec<Vec<String>>)]
    pub pending: Vec<(String, String)>,
    /// The actor asked about (`--actor`), if any.
    pub actor: Option<String>,
    /// The rules that bind that actor's tool calls (any actor's without one).
    pub binding: Vec<String>,
    /// Each pending proposal whole, for the owner deciding it: `id`,
    /// `author`, `change` (the rule as declared: subject, doors, effect,
    /// match clauses, lock, expiry, reason), `would_change` (the recorded
    /// acts and dry-run acts its ratification would have decided otherwise,
    /// [`policies::scopes::changes`] over the history) and `error` (why it
    /// could not be ratified as things stand, when it could not).
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub proposals: Vec<serde_json::Value>,
    /// The agents' rules a freeze suspends (listed, not vanished), as rows.
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub suspended: Vec<serde_json::Value>,
}

/// Who wrote a proposal, as the owner reads it.
fn author_name(author: &policies::ruleset::Author) -> String {
    use policies::ruleset::Author;
    match author {
        Author::Owner => "the owner".into(),
        Author::Shipped => "the shipped rules".into(),
        Author::Agent(actor) => format!("agent {actor}"),
    }
}

/// A rule's author and the standing it binds under.
fn origin_names(origin: &policies::ruleset::Origin) -> (String, String) {
    use policies::ruleset::Origin;
    match origin {
        Origin::Shipped => ("the shipped rules".into(), "shipped".into()),
        Origin::Owner => ("the owner".into(), "the owner".into()),
        Origin::Tier1(actor) => (
            format!("agent {actor}"),
            "tier 1: an agent's tightening (a freeze suspends it)".into(),
        ),
        Origin::Ratified(proposal) => (
            format!("proposal {proposal}"),
            "ratified by the owner".into(),
        ),
    }
}

/// A rule's row as the views show it: the rule (its declared `authority`
/// among its fields), its lock now, its `author` and the standing it binds
/// under (`binds_as`).
fn rule_row(set: &policies::RuleSet, rule: &policies::Rule) -> serde_json::Value {
    let mut v = serde_json::to_value(rule).unwrap_or_default();
    if let Some(entry) = set.entries().get(rule.id()) {
        v["locked"] = entry.locked.into();
        // The rule's own `authority` (as declared) is kept; `binds_as`
        // says under which standing it binds.
        let (author, binds_as) = origin_names(&entry.origin);
        v["author"] = author.into();
        v["binds_as"] = binds_as.into();
    }
    v
}

/// Each pending proposal whole, and what ratifying it would have changed
/// over the recorded history (see [`PolicyView::proposals`]).
fn proposals_view(store: &dyn StateStore, set: &policies::RuleSet) -> Vec<serde_json::Value> {
    if set.pending().is_empty() {
        return Vec::new();
    }
    let now = nightshift_core::policy::now();
    let history = crate::scopes::history(store, set)
        .and_then(|h| crate::scopes::gate_destinations(store).map(|d| (h, d)));
    set.pending()
        .iter()
        .map(|(id, p)| {
            let mut v = serde_json::json!({
                "id": id,
                "author": author_name(&p.author),
                "change": serde_json::to_value(&p.change).unwrap_or_default(),
                "would_change": [],
            });
            let mut next = set.clone();
            let ratified = next.apply(policies::ruleset::Row::Ratify {
                proposal: id.clone(),
                authority: "owner".into(),
                lock: true,
            });
            match (ratified, &history) {
                (Err(e), _) => v["error"] = format!("it would not apply: {e}").into(),
                (Ok(_), Err(e)) => v["error"] = format!("reading the history: {e}").into(),
                (Ok(_), Ok((records, destinations))) => {
                    let items = policies::scopes::changes(set, &next, records, destinations, now);
                    v["would_change"] = serde_json::to_value(items).unwrap_or_default();
                }
            }
            v
        })
        .collect()
}

/// The harness hook's answer: its exit code, the line it says on stderr
/// when it refuses, and a warning said once per state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HookAnswer {
    pub code: i32,
    pub line: Option<String>,
    pub warning: Option<String>,
}

/// One account of the dashboard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UserRow {
    pub name: String,
    pub role: String,
    pub created_at: String,
}

/// A stale act's state as `queue show` explains it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StaleDetail {
    pub why: String,
    /// A push's lease: the remote ref's value it was bound to, and now (or
    /// why it could not be read).
    pub lease: Option<Lease>,
    /// Why it cannot be re-bound now, if it cannot.
    pub refused_now: Option<String>,
}

/// A push's lease: the remote ref's value the act was bound to, and its
/// value now (or why it could not be read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Lease {
    pub bound: Option<String>,
    #[schema(value_type = Object)]
    pub now: Result<Option<String>, String>,
}

/// One act in full, as `queue show` gives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ActDetail {
    #[schema(value_type = Object)]
    pub act: deferred_queue::Act,
    #[schema(value_type = Object)]
    pub state: deferred_queue::State,
    /// The act's content as stored (agent-written).
    pub content: Option<Vec<u8>>,
    pub stale: Option<StaleDetail>,
    /// A stale push: what the destination gained since the act was bound,
    /// from its new commit to the act's (`git diff --stat`), when those
    /// objects are in the repository: (the new commit, the stat or `None`).
    #[schema(value_type = Option<Object>)]
    pub gained: Option<(String, Option<Vec<u8>>)>,
    /// From the run's base to the act's commit: the commits (`git log`).
    pub log: Option<Vec<u8>>,
    /// A push or pull request: every commit it would publish that the
    /// destination does not hold yet (not only those after the run's base).
    #[schema(value_type = Option<Object>)]
    pub publishes: Option<crate::acts::Publishes>,
    /// ... and the diff (`git diff --stat -p`).
    pub diff: Option<Vec<u8>>,
    /// A message: its body's shape and the lines shown.
    pub body: Option<BodyDetail>,
    /// A message: the repository's files holding one of its distinctive lines.
    pub repeated: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BodyDetail {
    pub bytes: usize,
    pub lines: usize,
    pub shown: Vec<String>,
}

fn policy_error(e: nightshift_core::policy::PolicyError) -> ApiError {
    e.into()
}

/// The rules in force as the owner reads them (`policy list`, the
/// dashboard's Policy page): generation, freeze, active rules with their
/// lock state, pending proposals, and which rules bind `actor`'s tool calls.
pub fn policy_view(
    store: &dyn StateStore,
    rules: Option<&Path>,
    actor: Option<String>,
) -> Result<PolicyView, nightshift_core::policy::PolicyError> {
    let set = nightshift_core::policy::load(store, rules)?;
    let now = nightshift_core::policy::now();
    let actor = actor.filter(|a| !a.is_empty());
    let binding = nightshift_core::policy::rules_binding_tool_calls(&set, actor.as_deref(), now)
        .iter()
        .map(|r| r.id().to_string())
        .collect();
    let active = set.active(now).map(|r| rule_row(&set, r)).collect();
    let suspended = set
        .suspended()
        .iter()
        .filter_map(|id| set.entries().get(id))
        .map(|e| rule_row(&set, &e.rule))
        .collect();
    let proposals = proposals_view(store, &set);
    Ok(PolicyView {
        generation: set.generation().to_string(),
        frozen: set
            .freeze()
            .map(|f| (f.reason.clone(), f.authority.to_string())),
        frozen_at: set.freeze().and_then(|f| f.at.clone()),
        active,
        pending: set
            .pending()
            .iter()
            .map(|(id, p)| (id.to_string(), format!("{:?}", p.author)))
            .collect(),
        actor,
        binding,
        proposals,
        suspended,
    })
}

impl Api {
    pub(super) fn policy_list(
        &self,
        rules: Option<&Path>,
        actor: Option<String>,
    ) -> Result<Reply, ApiError> {
        let store = self.open_store()?;
        Ok(Reply::Policy(Box::new(
            policy_view(&store, rules, actor).map_err(policy_error)?,
        )))
    }

    pub(super) fn policy_explain(
        &self,
        rules: Option<&Path>,
        actor: Option<&str>,
        tool: &str,
        input: &[u8],
    ) -> Result<Reply, ApiError> {
        let store = self.open_store()?;
        let set = nightshift_core::policy::load(&store, rules).map_err(policy_error)?;
        let outcome = policies::hook_decide(
            &set,
            actor,
            tool,
            input,
            nightshift_core::policy::now(),
            false,
        );
        Ok(Reply::Explained {
            decision: outcome.decision.map(|d| {
                serde_json::json!({
                    "verdict": nightshift_core::policy::verdict_name(d.verdict),
                    "rule": d.rule.to_string(),
                    "reason": d.reason,
                    "escalated": d.escalated,
                    "stood_aside": d.stood_aside.iter().map(|s| serde_json::json!({
                        "rule": s.rule.to_string(), "effect": s.effect.to_string(),
                        "missing": format!("{:?}", s.missing),
                    })).collect::<Vec<_>>(),
                    "generation": d.generation.to_string(),
                    "digest": d.digest.to_string(),
                })
            }),
            refusal: outcome.stderr,
        })
    }

    /// The harness hook's decision for one tool call, audited. Every error
    /// is a refusal to the caller (`policy check` fails closed).
    pub fn policy_check(
        &self,
        rules: Option<&Path>,
        actor: Option<&str>,
        tool: &str,
        input: &[u8],
    ) -> Result<HookAnswer, ApiError> {
        let root = &self.root;
        let refuse = |m: String| ApiError::new(ErrorKind::Denied, m);
        let busy = |e: &nightshift_core::state_store::StoreError| {
            if e.is_busy() {
                format!(
                    "the state at {} is locked by another process past the hook's wait of {} ms: {e}",
                    root.display(),
                    nightshift_core::policy::HOOK_BUSY.as_millis()
                )
            } else {
                e.to_string()
            }
        };
        let mut store =
            self.stores.connect_existing(nightshift_core::policy::HOOK_BUSY)
                .map_err(|e| refuse(busy(&e)))?
                .ok_or_else(|| {
                    refuse(format!(
                        "no nightshift state at {}: a hook never makes its own; set NIGHTSHIFT_STATE_DIR (or --state-dir) in the harness's environment to the supervisor's state, or make one with `nightshift --state-dir DIR owner init`",
                        root.display()
                    ))
                })?;
        let set =
            nightshift_core::policy::load(&store, rules).map_err(|e| refuse(e.to_string()))?;
        let now = nightshift_core::policy::now();
        let outcome = policies::hook_decide(&set, actor, tool, input, now, false);
        // The tool the call was for: the payload's `tool_name` with `--tool -`.
        let tool = outcome.tool.clone().unwrap_or_else(|| tool.to_string());
        match &outcome.decision {
            Some(decision) => {
                nightshift_core::policy::record_decision(&mut store, None, actor, &tool, decision)
                    .map_err(|e| match e {
                    nightshift_core::policy::PolicyError::Store(e) => {
                        refuse(format!("auditing the decision: {}", busy(&e)))
                    }
                    e => refuse(format!("auditing the decision: {e}")),
                })?
            }
            // Refused before any rule was consulted (bad input): audited
            // too, with the digest of the bytes received.
            None => {
                store
                    .append(
                        None,
                        &nightshift_core::audit_log::Event::PolicyDecision {
                            actor: actor.map(str::to_string),
                            door: tool,
                            verdict: "refuse".into(),
                            rule: "nightshift:hook-input".into(),
                            escalated: false,
                            stood_aside: Vec::new(),
                            generation: set.generation().to_string(),
                            digest: nightshift_core::audit_log::digest(input),
                        },
                        false,
                    )
                    .map_err(|e| refuse(format!("auditing the refusal: {}", busy(&e))))?;
            }
        }
        // No rule in force at all (an empty rules directory): every call is
        // allowed. Said once per state, so the harness's log is not flooded.
        let warning = if set.active(now).next().is_none() && set.freeze().is_none() {
            let marker = root.join("hook-no-rules.warned");
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&marker)
                .ok()
                .map(|_| {
                    format!(
                        "nightshift policy check: no rule is in force ({} holds none): every tool call is allowed; `nightshift policy list` shows the rules (said once per state)",
                        nightshift_core::policy::rules_source(&store, rules)
                    )
                })
        } else {
            None
        };
        Ok(HookAnswer {
            code: outcome.exit_code,
            line: (outcome.exit_code != 0).then_some(outcome.stderr),
            warning,
        })
    }

    /// The writer of a rule change: the agent named, or the owner by key.
    fn writer(
        &self,
        store: &dyn StateStore,
        actor: Option<String>,
        key: Option<&Path>,
    ) -> Result<nightshift_core::policy::Writer, ApiError> {
        Ok(match actor {
            Some(a) => nightshift_core::policy::Writer::Agent(a),
            None => nightshift_core::policy::Writer::Owner(owner(store, key)?),
        })
    }

    pub(super) fn policy_declare(
        &self,
        rules: Option<&Path>,
        file: &Path,
        actor: Option<String>,
        key: Option<&Path>,
    ) -> Result<Reply, ApiError> {
        let mut store = self.open_store()?;
        let writer = self.writer(&store, actor, key)?;
        let ids = nightshift_core::policy::declare(&mut store, rules, file, &writer)?;
        Ok(Reply::Declared {
            rules: ids.iter().map(ToString::to_string).collect(),
        })
    }

    pub(super) fn policy_propose(
        &self,
        rules: Option<&Path>,
        file: Option<&Path>,
        actor: String,
        retire: Option<&str>,
        why: Option<&str>,
    ) -> Result<Reply, ApiError> {
        let mut store = self.open_store()?;
        let writer = nightshift_core::policy::Writer::Agent(actor);
        let ids = match (file, retire) {
            (Some(file), None) => {
                nightshift_core::policy::propose(&mut store, rules, file, &writer)?
            }
            (None, Some(rule)) => vec![nightshift_core::policy::propose_retirement(
                &mut store,
                rules,
                rule,
                why.unwrap_or_default(),
                &writer,
            )?],
            _ => {
                return Err(ApiError::new(
                    ErrorKind::BadInput,
                    "name a rule file or --retire RULE",
                ))
            }
        };
        Ok(Reply::Proposed {
            proposals: ids.iter().map(ToString::to_string).collect(),
        })
    }

    pub(super) fn policy_unlock(
        &self,
        rules: Option<&Path>,
        rule: &str,
        key: Option<&Path>,
    ) -> Result<Reply, ApiError> {
        let mut store = self.open_store()?;
        let who = owner(&store, key)?;
        nightshift_core::policy::unlock(&mut store, rules, rule, &who)?;
        Ok(Reply::Unlocked {
            rule: rule.to_string(),
        })
    }

    pub(super) fn policy_retire(
        &self,
        rules: Option<&Path>,
        rule: &str,
        why: &str,
        actor: Option<String>,
        key: Option<&Path>,
    ) -> Result<Reply, ApiError> {
        let mut store = self.open_store()?;
        let writer = self.writer(&store, actor, key)?;
        nightshift_core::policy::retire(&mut store, rules, rule, why, &writer)?;
        Ok(Reply::Retired {
            rule: rule.to_string(),
        })
    }

    pub(super) fn image_ref(
        &self,
        agent: Option<&str>,
        with: &[String],
    ) -> Result<Reply, ApiError> {
        let reference = image_spec(agent, with)?.reference();
        Ok(Reply::ImageRef { reference })
    }

    /// Builds the default image (or an agent's, with toolchains or
    /// without), saying each step to `progress`.
    pub(super) async fn image_build(
        &self,
        mirror: &str,
        agent: Option<&str>,
        with: &[String],
        progress: &mut (dyn FnMut(&str) + Send),
    ) -> Result<Reply, ApiError> {
        let spec = image_spec(agent, with)?;
        let engine = nightshift_engine_docker::engine::Engine::connect().await?;
        let paths = StatePaths::new(self.root.clone());
        let reference = nightshift_engine_docker::image::build_image(
            &engine,
            &paths.image_build(),
            mirror,
            &spec,
            |l| progress(l),
        )
        .await
        .map_err(|e| ApiError::of(e).doing(format!("building the image {}", spec.reference())))?;
        Ok(Reply::ImageRef { reference })
    }

    pub(super) fn destinations(&self, probe: bool) -> Result<Reply, ApiError> {
        use orchestrator_executors::{ConfigError, Destinations};
        let path = self.root.join("destinations.toml");
        if !path.exists() {
            return Ok(Reply::Destinations {
                path,
                listed: None,
                problems: Vec::new(),
            });
        }
        let (listed, problems) = match Destinations::load(&path) {
            // Each credential file is checked as the executor will read it:
            // a token file readable by everyone fails now, not in the morning.
            Ok(dest) => {
                let mut problems = dest.secret_problems();
                // Probing sends a credential: only once every file is sound.
                if probe && problems.is_empty() {
                    problems.extend(probe_destinations(&dest));
                }
                (
                    Some(
                        dest.listing()
                            .iter()
                            .map(|l| serde_json::to_value(l).unwrap_or_default())
                            .collect(),
                    ),
                    problems,
                )
            }
            Err(ConfigError::Invalid { origin, problems }) => (
                None,
                problems.iter().map(|p| format!("{origin}: {p}")).collect(),
            ),
            Err(e) => {
                let mut text = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    text.push_str(&format!(": {s}"));
                    source = s.source();
                }
                (None, vec![text])
            }
        };
        Ok(Reply::Destinations {
            path,
            listed,
            problems,
        })
    }

    pub(super) fn summary(&self) -> Result<Reply, ApiError> {
        let store = self.open_store()?;
        let review =
            orchestrator_executors::Destinations::load(&self.root.join("destinations.toml"))
                .ok()
                .and_then(|d| d.summary)
                .and_then(|s| s.review);
        let s = crate::summary::gather(&store, review.as_deref())
            .map_err(|e| ApiError::new(ErrorKind::State, nightshift_core::terminal::line(&e)))?;
        let runs = store.runs()?;
        let acts: Vec<(String, deferred_queue::State)> = crate::acts::rows(&store, None)?
            .into_iter()
            .map(|r| (r.act.id, r.state))
            .collect();
        let (failures, more_failures) = crate::summary::failures(&runs, &s.run_ids, &acts);
        Ok(Reply::Summary {
            text: crate::summary::render(&s),
            summary: serde_json::to_value(&s).unwrap_or_default(),
            failures,
            more_failures,
        })
    }

    pub(super) fn summary_send(&self, due: bool) -> Result<Reply, ApiError> {
        use crate::summary::{Sending, Trigger};
        let trigger = if due { Trigger::Due } else { Trigger::Now };
        match crate::summary::send(&self.stores, trigger) {
            Ok(Sending::Sent(s)) => Ok(Reply::SummarySent {
                runs: s.run_ids.len(),
            }),
            Ok(Sending::Skipped(why)) => Ok(Reply::SummarySkipped {
                why: why.to_string(),
            }),
            Err(e) => Err(ApiError::new(
                ErrorKind::Failed,
                nightshift_core::terminal::line(&e),
            )),
        }
    }

    pub(super) fn users_add(
        &self,
        name: &str,
        role: &str,
        password: &str,
    ) -> Result<Reply, ApiError> {
        use nightshift_core::accounts as users;
        let mut store = self.open_store()?;
        users::add(&mut store, name, role, password)?;
        Ok(Reply::UserSaved {
            name: name.to_string(),
            role: role.to_string(),
        })
    }

    pub(super) fn users_list(&self) -> Result<Reply, ApiError> {
        let users = self
            .open_store()?
            .users()?
            .into_iter()
            .map(|(name, role, created_at)| UserRow {
                name,
                role,
                created_at,
            })
            .collect();
        Ok(Reply::Users { users })
    }

    pub(super) fn users_remove(&self, name: &str) -> Result<Reply, ApiError> {
        if self.open_store()?.remove_user(name)? {
            Ok(Reply::UserRemoved {
                name: name.to_string(),
            })
        } else {
            Err(ApiError::new(
                ErrorKind::NotFound,
                format!("no account named {}", nightshift_core::terminal::line(name)),
            ))
        }
    }

    /// `queue show ACT`: the act, its state explained, and what it would
    /// carry (a push's diff, a pull request's text and diff, a message's body).
    pub(super) fn act_detail(&self, id: &str) -> Result<Reply, ApiError> {
        use deferred_queue::{Content, Target};
        self.with_queue_config()?;
        let mut store = self.open_store()?;
        // What has run out of time is shown as expired, never as waiting.
        let expire_error = crate::acts::expire(&mut store)
            .err()
            .map(|e| format!("expiring acts: {e}"));
        let row = crate::acts::rows(&store, None)?
            .into_iter()
            .find(|r| r.act.id == id)
            .ok_or_else(|| ApiError::new(ErrorKind::NotFound, format!("no act with id {id}")))?;
        let stale = crate::acts::stale_view(&store, &row).map(|s| StaleDetail {
            why: s.why,
            lease: s.lease.map(|l| Lease {
                bound: l.bound,
                now: l.now,
            }),
            refused_now: s.refused_now,
        });
        let mut detail = ActDetail {
            act: row.act.clone(),
            state: row.state.clone(),
            content: row.content.clone(),
            stale,
            gained: None,
            log: None,
            publishes: None,
            diff: None,
            body: None,
            repeated: Vec::new(),
        };
        match (&row.act.routing.target, &row.act.content) {
            (Target::Push { .. }, Content::Commit { commit }) => {
                let run = store.run(&row.act.run)?;
                if let Some(StaleDetail {
                    lease:
                        Some(Lease {
                            now: Ok(Some(now)), ..
                        }),
                    ..
                }) = &detail.stale
                {
                    let out = host_git(&run.repo)
                        .args([
                            "diff",
                            "--no-color",
                            "--no-ext-diff",
                            "--no-textconv",
                            "--stat",
                            now,
                            commit,
                        ])
                        .output();
                    detail.gained = Some((
                        now.clone(),
                        match out {
                            Ok(out) if out.status.success() => Some(out.stdout),
                            _ => None,
                        },
                    ));
                }
                let base = run.base_commit.unwrap_or_default();
                (detail.log, detail.diff) = diff(&run.repo, &base, commit);
                detail.publishes = publishes(&store, &row.act, &run.repo, commit);
            }
            (Target::PullRequest { .. }, Content::PullRequest { head_commit, .. }) => {
                let run = store.run(&row.act.run)?;
                let base = run.base_commit.unwrap_or_default();
                (detail.log, detail.diff) = diff(&run.repo, &base, head_commit);
                detail.publishes = publishes(&store, &row.act, &run.repo, head_commit);
            }
            _ => {
                let body = row.content.as_deref().unwrap_or_default();
                let view = crate::acts::body_view(body);
                detail.body = Some(BodyDetail {
                    bytes: view.bytes,
                    lines: view.lines,
                    shown: view.shown,
                });
                if let Ok(run) = store.run(&row.act.run) {
                    let base = run.base_commit.unwrap_or_default();
                    detail.repeated = repeated_repo_lines(&run.repo, &base, body);
                }
            }
        }
        Ok(Reply::Act {
            detail: Box::new(detail),
            expire_error,
        })
    }
}

/// The image an agent preset's name and toolchain names ask for.
fn image_spec(
    agent: Option<&str>,
    with: &[String],
) -> Result<nightshift_engine_docker::image::ImageSpec, ApiError> {
    use nightshift_engine_docker::image::{ImageSpec, Toolchain};
    let agent = agent.map(agent_preset).transpose()?;
    let mut toolchains = Vec::new();
    for list in with {
        toolchains.extend(
            Toolchain::parse_list(list).map_err(|e| ApiError::new(ErrorKind::BadInput, e))?,
        );
    }
    Ok(ImageSpec::new(agent, &toolchains))
}

fn agent_preset(name: &str) -> Result<nightshift_engine_docker::image::Agent, ApiError> {
    nightshift_engine_docker::image::Agent::from_name(name)
        .map_err(|e| ApiError::new(ErrorKind::BadInput, e))
}

fn host_git(repo: &str) -> std::process::Command {
    let mut c = std::process::Command::new("git");
    c.arg("-C").arg(repo).args(["-c", "core.pager=cat"]);
    c
}

/// What the act would publish that its destination does not hold yet.
fn publishes(
    store: &dyn StateStore,
    act: &deferred_queue::Act,
    repo: &str,
    commit: &str,
) -> Option<crate::acts::Publishes> {
    let (held, against) = match crate::acts::destinations(store) {
        Ok(dest) => crate::acts::destination_holds(&dest, act),
        Err(why) => (
            Vec::new(),
            format!("every commit: the destinations could not be read: {why}"),
        ),
    };
    crate::acts::publishes(Path::new(repo), commit, &held, against)
}

/// The commits and the diff from `from` to `to` in the host repository
/// (the host's git, no pager, no external diff, no textconv), as bytes.
fn diff(repo: &str, from: &str, to: &str) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    let log = host_git(repo)
        .args([
            "log",
            "--no-decorate",
            "--no-color",
            "--format=commit %H%n    %s",
            &format!("{from}..{to}"),
        ])
        .output()
        .ok()
        .map(|o| o.stdout);
    let diff = host_git(repo)
        .args([
            "diff",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
            "--stat",
            "-p",
            from,
            to,
        ])
        .output()
        .ok()
        .map(|o| o.stdout);
    (log, diff)
}

/// The files of the repository at `base` that hold a distinctive line of
/// `body` (16 characters or more) (the host's git, fixed strings read from a
/// file: the body is data, never a pattern or an argument).
fn repeated_repo_lines(repo: &str, base: &str, body: &[u8]) -> Vec<String> {
    let lines = crate::acts::distinctive_lines(body);
    if lines.is_empty() || base.is_empty() {
        return Vec::new();
    }
    let child = host_git(repo)
        .args([
            "grep",
            "--no-color",
            "-I",
            "-l",
            "-F",
            "-f",
            "-",
            base,
            "--",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        return Vec::new();
    };
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        let _ = stdin.write_all(format!("{}\n", lines.join("\n")).as_bytes());
    }
    let Ok(out) = child.wait_with_output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.strip_prefix(&format!("{base}:")).unwrap_or(l).to_string())
        .take(10)
        .collect()
}

/// A path as the caller meant it: relative to the caller's directory, made
/// absolute before a command leaves its process (`serve` has another).
pub fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Asks each remote for its refs and each forge for its open pull requests
/// (reads only, with the configured credential): one problem for each
/// that refuses or cannot be reached. Messages are not probed: sending one
/// is the only way to try a webhook.
fn probe_destinations(dest: &orchestrator_executors::Destinations) -> Vec<String> {
    let mut problems = Vec::new();
    for (alias, remote) in &dest.remotes {
        if let Err(e) = orchestrator_executors::remote_heads(remote) {
            problems.push(format!("remotes.{alias}: probe: {e}"));
        }
    }
    for (alias, forge) in &dest.forges {
        let probe = orchestrator_executors::find_pull_request(
            forge,
            "nightshift/probe",
            "nightshift/probe",
            "0000000000000000000000000000000000000000",
        );
        if let Err(e) = probe {
            problems.push(format!("forges.{alias}: probe: {e}"));
        }
    }
    problems
}
