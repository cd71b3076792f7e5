//! The core's store ports over [`PgStore`]: events become (kind, body), run
//! records JSON, and [`PgError`]s the core's [`StoreError`], their kind
//! decided by SQLSTATE ([`PgError::kind`]).

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use nightshift_core::audit_log::Event;
use nightshift_core::state_store::{
    is_final, Accounts, ActBounds, ActCounts, ActQueue, AuditLog, AuditSnapshot, PolicyStore,
    RunRecord, RunStore, StateStore, StoreError, StoredAct, StoredSession, StoredTask, StoredUser,
    TaskDecision, TaskQueue, TokenLedger,
};
use nightshift_core::tokens::{Ask, Grant, Ledger, Refusal};
use orchestrator_audit::{Checkpoint, Entry, LogId};

use crate::{Bounds, PgError, PgErrorKind, PgStore};

impl From<PgError> for StoreError {
    fn from(e: PgError) -> Self {
        let kind = e.kind();
        match e {
            PgError::Connect { url, source } => StoreError::Open {
                location: url,
                source: Box::new(source),
            },
            PgError::Tls { url, why } => StoreError::Open {
                location: url,
                source: why.into(),
            },
            PgError::Sql { doing, source } => match kind {
                PgErrorKind::Busy => StoreError::Busy {
                    doing,
                    source: Box::new(source),
                },
                PgErrorKind::DiskFull => StoreError::DiskFull {
                    doing,
                    source: Box::new(source),
                },
                PgErrorKind::Conflict => StoreError::Conflict(format!(
                    "{doing}: {}",
                    source
                        .as_db_error()
                        .map_or_else(|| source.to_string(), |d| d.message().to_string())
                )),
                PgErrorKind::Backend => StoreError::Backend {
                    doing,
                    source: Box::new(source),
                },
            },
            PgError::Bad { what, message } => StoreError::BadEntry {
                seq: 0,
                message: format!("{what}: {message}"),
            },
            e @ PgError::TooNew { .. } => StoreError::Backend {
                doing: "migrating the state store",
                source: Box::new(e),
            },
        }
    }
}

fn record_json(run: &RunRecord) -> Result<String, StoreError> {
    serde_json::to_string(run).map_err(|e| StoreError::BadEntry {
        seq: 0,
        message: format!("run {}: {e}", run.id),
    })
}

fn parse_run(id: &str, text: &str) -> Result<RunRecord, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::BadEntry {
        seq: 0,
        message: format!("run {id}: {e}"),
    })
}

fn snapshot(read: crate::AuditRead) -> AuditSnapshot {
    AuditSnapshot {
        head: read.head,
        checkpoints: read.checkpoints,
        entries: read.entries,
    }
}

impl AuditLog for PgStore {
    fn log_id(&self) -> &LogId {
        self.log()
    }
    fn fingerprint(&self) -> Option<nightshift_core::state_store::StoreFingerprint> {
        PgStore::fingerprint(self).ok()
    }
    fn append(
        &mut self,
        run: Option<&str>,
        event: &Event,
        checkpoint: bool,
    ) -> Result<Entry, StoreError> {
        let (kind, body) = event.kind_and_body();
        Ok(PgStore::append(self, run, &kind, body, checkpoint)?)
    }
    fn read_head(&self) -> Result<Option<Checkpoint>, StoreError> {
        Ok(PgStore::read_head(self)?)
    }
    fn audit_snapshot(&self) -> Result<AuditSnapshot, StoreError> {
        Ok(snapshot(self.audit_read(0)?))
    }
    fn audit_snapshot_from(&self, seq: u64) -> Result<AuditSnapshot, StoreError> {
        Ok(snapshot(self.audit_read(seq)?))
    }
    fn visit_audit(
        &self,
        from: u64,
        visitor: &mut dyn nightshift_core::state_store::AuditVisitor,
    ) -> Result<(), StoreError> {
        Ok(PgStore::visit_audit(self, from, visitor)?)
    }
    fn entries(&self) -> Result<Vec<Entry>, StoreError> {
        Ok(PgStore::entries_from(self, 0)?)
    }
    fn entries_from(&self, seq: u64) -> Result<Vec<Entry>, StoreError> {
        Ok(PgStore::entries_from(self, seq)?)
    }
    fn door_refusals(&self, run: Option<&str>) -> Result<Vec<Entry>, StoreError> {
        Ok(PgStore::door_refusals(self, run)?)
    }
    fn entries_for_run(&self, run: &str) -> Result<Vec<Entry>, StoreError> {
        Ok(PgStore::entries_for_run(self, run)?)
    }
    fn bodies_of_kind_since(
        &self,
        kind: &str,
        since: &str,
    ) -> Result<Vec<(Option<String>, serde_json::Value)>, StoreError> {
        Ok(PgStore::bodies_of_kind_since(self, kind, since)?)
    }
    fn checkpoints(&self) -> Result<Vec<Checkpoint>, StoreError> {
        Ok(PgStore::checkpoints(self)?)
    }
}

impl ActQueue for PgStore {
    fn count_acts(&self, run: &str) -> Result<u64, StoreError> {
        Ok(PgStore::count_acts(self, run)?)
    }
    fn count_acts_since(&self, since: &str, repo: Option<&str>) -> Result<u64, StoreError> {
        Ok(PgStore::count_acts_since(self, since, repo)?)
    }
    fn put_act(
        &mut self,
        id: &str,
        run: &str,
        act: &serde_json::Value,
        state: &serde_json::Value,
        content: Option<&[u8]>,
        event: &Event,
    ) -> Result<(), StoreError> {
        let (kind, body) = event.kind_and_body();
        PgStore::put_act::<()>(self, id, run, act, state, content, &kind, body, None)?;
        Ok(())
    }
    fn put_act_within(
        &mut self,
        id: &str,
        run: &str,
        act: &serde_json::Value,
        state: &serde_json::Value,
        content: Option<&[u8]>,
        event: &Event,
        bounds: &ActBounds<'_>,
    ) -> Result<Option<(&'static str, String)>, StoreError> {
        let (kind, body) = event.kind_and_body();
        let refuse = |c: crate::Counts| {
            (bounds.refuse)(ActCounts {
                of_run: c.of_run,
                tonight: c.tonight,
                of_repository: c.of_repository,
            })
        };
        Ok(PgStore::put_act(
            self,
            id,
            run,
            act,
            state,
            content,
            &kind,
            body,
            Some(Bounds {
                since: bounds.since,
                repo: bounds.repo,
                refuse: &refuse,
            }),
        )?)
    }
    fn acts(&self, id: Option<&str>) -> Result<Vec<StoredAct>, StoreError> {
        Ok(PgStore::acts(self, id)?)
    }
    fn acts_in_states(
        &self,
        states: &[&str],
        offset: u64,
        limit: u64,
    ) -> Result<(Vec<StoredAct>, u64), StoreError> {
        Ok(PgStore::acts_in_states(self, states, offset, limit)?)
    }
    fn transition_act(
        &mut self,
        id: &str,
        run: &str,
        from: &serde_json::Value,
        to: &serde_json::Value,
        event: &Event,
    ) -> Result<bool, StoreError> {
        let (kind, body) = event.kind_and_body();
        Ok(PgStore::transition_act(
            self, id, run, from, to, &kind, body,
        )?)
    }
    fn replace_act(
        &mut self,
        id: &str,
        run: &str,
        from: &serde_json::Value,
        to: &serde_json::Value,
        event: &Event,
        new_id: &str,
        new_act: &serde_json::Value,
        new_state: &serde_json::Value,
        content: Option<&[u8]>,
        new_event: &Event,
    ) -> Result<bool, StoreError> {
        let (kind, body) = event.kind_and_body();
        let (new_kind, new_body) = new_event.kind_and_body();
        Ok(PgStore::replace_act(
            self,
            id,
            run,
            from,
            to,
            (&kind, body),
            new_id,
            new_act,
            new_state,
            content,
            (&new_kind, new_body),
        )?)
    }
    fn claim_act(
        &mut self,
        holder: &str,
        now: i64,
        lease_until: i64,
        only: Option<&str>,
    ) -> Result<Option<StoredAct>, StoreError> {
        Ok(PgStore::claim_act(self, holder, now, lease_until, only)?)
    }
    fn renew_act(
        &mut self,
        id: &str,
        holder: &str,
        _now: i64,
        lease_until: i64,
    ) -> Result<bool, StoreError> {
        Ok(PgStore::renew_act(self, id, holder, lease_until)?)
    }
    fn release_act(&mut self, id: &str, holder: &str) -> Result<(), StoreError> {
        Ok(PgStore::release_act(self, id, holder)?)
    }
    fn put_dry_act(
        &mut self,
        id: &str,
        run: &str,
        record: &serde_json::Value,
        event: &Event,
    ) -> Result<Entry, StoreError> {
        let (kind, body) = event.kind_and_body();
        Ok(PgStore::put_dry_act(self, id, run, record, &kind, body)?)
    }
    fn dry_acts(&self, run: Option<&str>) -> Result<Vec<serde_json::Value>, StoreError> {
        Ok(PgStore::dry_acts(self, run)?)
    }
    fn act_labels(&self) -> Result<HashMap<String, String>, StoreError> {
        Ok(PgStore::act_labels(self)?)
    }
}

impl RunStore for PgStore {
    fn runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        PgStore::runs(self)?
            .iter()
            .map(|t| parse_run("in the list", t))
            .collect()
    }
    fn run(&self, id: &str) -> Result<RunRecord, StoreError> {
        let text = PgStore::run(self, id)?.ok_or_else(|| StoreError::NoSuchRun(id.into()))?;
        parse_run(id, &text)
    }
    fn put_run(&mut self, record: &RunRecord) -> Result<(), StoreError> {
        let json = record_json(record)?;
        Ok(PgStore::put_run(
            self,
            &record.id,
            &record.created_at,
            &json,
        )?)
    }
    fn request_kill(&mut self, run: &str, by: &str) -> Result<bool, StoreError> {
        Ok(PgStore::request_kill(self, run, by)?)
    }
    fn kill_request(&self, run: &str) -> Result<Option<String>, StoreError> {
        Ok(PgStore::kill_request(self, run)?)
    }
    fn claim_settle(
        &mut self,
        run: &str,
        by: &str,
        claimer: &str,
        gone: &dyn Fn(&str) -> bool,
    ) -> Result<bool, StoreError> {
        Ok(PgStore::claim_settle(self, run, by, claimer, gone)?)
    }
    fn release_settle(&mut self, run: &str, claimer: &str) -> Result<(), StoreError> {
        Ok(PgStore::release_settle(self, run, claimer)?)
    }
    fn record_imported(&mut self, record: &RunRecord) -> Result<(), StoreError> {
        let json = record_json(record)?;
        Ok(PgStore::record_imported(
            self,
            &record.id,
            &record.created_at,
            &json,
        )?)
    }
    fn imported(&self, run: &str) -> Result<bool, StoreError> {
        Ok(PgStore::imported(self, run)?)
    }
    fn end_run(&mut self, record: &RunRecord, event: &Event) -> Result<Option<Entry>, StoreError> {
        let json = record_json(record)?;
        let (kind, body) = event.kind_and_body();
        let stored_is_final =
            |text: &str| serde_json::from_str::<RunRecord>(text).is_ok_and(|r| is_final(&r.status));
        Ok(PgStore::end_run(
            self,
            &record.id,
            &record.created_at,
            &json,
            &kind,
            body,
            &stored_is_final,
        )?)
    }
}

impl TaskQueue for PgStore {
    fn insert_tasks(&mut self, tasks: &[(String, String)], state: &str) -> Result<(), StoreError> {
        Ok(PgStore::insert_tasks(self, tasks, state)?)
    }
    fn tasks(&self) -> Result<Vec<StoredTask>, StoreError> {
        Ok(PgStore::tasks(self)?)
    }
    fn move_task(
        &mut self,
        id: &str,
        from: &[&str],
        to: &str,
        progress: &str,
        fence: Option<&nightshift_core::state_store::TaskFence>,
    ) -> Result<bool, StoreError> {
        Ok(PgStore::move_task(self, id, from, to, progress, fence)?)
    }
    fn start_tasks(
        &mut self,
        holder: &str,
        until: i64,
        decide: TaskDecision<'_>,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        Ok(PgStore::start_tasks(self, holder, until, decide)?)
    }
    fn insert_started_task(
        &mut self,
        id: &str,
        spec: &str,
        progress: &str,
        holder: &str,
        until: i64,
        admit: &mut dyn FnMut(&[StoredTask]) -> bool,
    ) -> Result<bool, StoreError> {
        Ok(PgStore::insert_started_task(
            self, id, spec, progress, holder, until, admit,
        )?)
    }
    fn renew_tasks(
        &mut self,
        holder: &str,
        ids: &[String],
        until: i64,
    ) -> Result<Vec<String>, StoreError> {
        Ok(PgStore::renew_tasks(self, holder, ids, until)?)
    }
    fn claim_lapsed_tasks(
        &mut self,
        holder: &str,
        now: i64,
        until: i64,
    ) -> Result<Vec<StoredTask>, StoreError> {
        Ok(PgStore::claim_lapsed_tasks(self, holder, now, until)?)
    }
}

impl Accounts for PgStore {
    fn put_user(&mut self, name: &str, role: &str, phc: &str) -> Result<(), StoreError> {
        Ok(PgStore::put_user(self, name, role, phc)?)
    }
    fn user(&self, name: &str) -> Result<Option<StoredUser>, StoreError> {
        Ok(PgStore::user(self, name)?)
    }
    fn users(&self) -> Result<Vec<(String, String, String)>, StoreError> {
        Ok(PgStore::users(self)?)
    }
    fn remove_user(&mut self, name: &str) -> Result<bool, StoreError> {
        Ok(PgStore::remove_user(self, name)?)
    }
    fn put_session(
        &mut self,
        id_sha256: &str,
        user: &str,
        csrf: &str,
        now: i64,
        expires_at: i64,
    ) -> Result<(), StoreError> {
        Ok(PgStore::put_session(
            self, id_sha256, user, csrf, now, expires_at,
        )?)
    }
    fn session(&self, id_sha256: &str, now: i64) -> Result<Option<StoredSession>, StoreError> {
        Ok(PgStore::session(self, id_sha256, now)?)
    }
    fn delete_session(&mut self, id_sha256: &str) -> Result<(), StoreError> {
        Ok(PgStore::delete_session(self, id_sha256)?)
    }
}

impl PolicyStore for PgStore {
    fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(PgStore::meta(self, key)?)
    }
    fn set_meta(&mut self, key: &str, value: Option<&str>) -> Result<(), StoreError> {
        Ok(PgStore::set_meta(self, key, value)?)
    }
    fn append_policy_row(
        &mut self,
        row: &serde_json::Value,
        event: &Event,
    ) -> Result<Entry, StoreError> {
        let (kind, body) = event.kind_and_body();
        Ok(PgStore::append_policy_row(self, row, &kind, body)?)
    }
    fn policy_rows(&self) -> Result<Vec<serde_json::Value>, StoreError> {
        Ok(PgStore::policy_rows(self)?)
    }
    fn put_scope_proposal(
        &mut self,
        id: &str,
        proposal: &serde_json::Value,
    ) -> Result<(), StoreError> {
        Ok(PgStore::put_scope_proposal(self, id, proposal)?)
    }
    fn scope_proposal(&self, id: &str) -> Result<Option<serde_json::Value>, StoreError> {
        Ok(PgStore::scope_proposal(self, id)?)
    }
    fn refuse_scope(&mut self, id: &str, why: &str, event: &Event) -> Result<(), StoreError> {
        let (kind, body) = event.kind_and_body();
        Ok(PgStore::refuse_scope(self, id, why, &kind, body)?)
    }
    fn refused_scopes(&self) -> Result<BTreeSet<String>, StoreError> {
        Ok(PgStore::refused_scopes(self)?)
    }
}

impl StateStore for PgStore {
    fn root(&self) -> &Path {
        PgStore::root(self)
    }
}

impl TokenLedger for PgStore {
    fn reserve(
        &mut self,
        run: &str,
        night: &str,
        run_cap: u64,
        fleet_cap: u64,
        ask: Ask,
    ) -> Result<Result<Grant, Refusal>, StoreError> {
        Ok(self.reserve_tokens(run, night, run_cap, fleet_cap, ask)?)
    }
    fn settle(
        &mut self,
        run: &str,
        night: &str,
        reserved: u64,
        actual: Option<u64>,
    ) -> Result<(Ledger, Ledger), StoreError> {
        Ok(self.settle_tokens(run, night, reserved, actual)?)
    }
    fn run_tokens(&self, run: &str) -> Result<Ledger, StoreError> {
        Ok(PgStore::run_tokens(self, run)?)
    }
}
