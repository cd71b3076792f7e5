//! The state store as the core sees it: a narrow trait owned by the core,
//! implemented by the SQLite store (`store.rs`) and by [`fake::MemStore`], a
//! hand-written in-memory fake for unit tests of the code generic over it:
//! the door's gate (`acts::handle`), the act queue (`acts::approve`,
//! `reject`, `execute`, `rebind`, `recover`, `expire`), the run lifecycle
//! (`run::execute` through `run::Supervisor`), the owner's credential check
//! (`owner::verify`) and the run queue's adapter (`run_queue`).
//!
//! Invariants every implementation keeps (the fake too, so tests of the
//! core mean something):
//! - `append` seals each audit entry after the one before it (one chain);
//!   an error means nothing was appended.
//! - `put_act` stores the act and appends its event together or not at all;
//!   `put_act_within` does so only if the acts already stored, counted in
//!   the same transaction, pass the caller's bounds (two requests at once
//!   never both take the last place: `tests/tests/channels.rs`,
//!   `a_flood_of_acts_at_the_body_limit_keeps_the_supervisor_small`);
//!   `transition_act` moves an act only from the state it names (true when
//!   it moved), with its event, together or not at all.
//! - `move_task` is a compare-and-set: a task moves only from one of the
//!   states named, so no move happens twice.
//! - `end_run` saves a run's final record and appends its ending together,
//!   and writes nothing (`None`) over a record that is already final: a run
//!   is never ended twice. `record_imported` saves the record and marks its
//!   work safe together.
//! - Acts are carried out only on the caller's side, under the executor
//!   lock (`STATE/executor.lock` in [`StateStore::root`]): the store keeps
//!   the queue's states, never runs an executor.
//!
//! A PostgreSQL store implements this trait without touching the core.

use std::path::Path;

use orchestrator_audit::Entry;

/// The acts already requested that a new one is counted against: by its
/// run, by every run tonight, by the runs of its repository tonight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActCounts {
    pub of_run: u64,
    pub tonight: u64,
    pub of_repository: u64,
}

/// The bounds a new act must fall within: the night's start (RFC 3339),
/// the run's repository as runs record it, and the caller's pure rule,
/// which names the rule and reason of a refusal.
pub struct ActBounds<'a> {
    pub since: &'a str,
    pub repo: &'a str,
    pub refuse: &'a dyn Fn(ActCounts) -> Option<(&'static str, String)>,
}

impl std::fmt::Debug for ActBounds<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActBounds")
            .field("since", &self.since)
            .field("repo", &self.repo)
            .finish_non_exhaustive()
    }
}

use crate::audit_log::Event;
use crate::store::{RunRecord, StoreError, StoredTask};

/// An act as stored: the act, its queue state, its content.
pub type StoredAct = (serde_json::Value, serde_json::Value, Option<Vec<u8>>);

/// What the door's gate, the act queue and the run queue need of the state.
pub trait StateStore: Send {
    /// The state directory: rule files, destinations, scratch space.
    fn root(&self) -> &Path;
    /// Appends one audit entry.
    fn append(
        &mut self,
        run: Option<&str>,
        event: &Event,
        checkpoint: bool,
    ) -> Result<Entry, StoreError>;
    /// The stored policy rows, oldest first.
    fn policy_rows(&self) -> Result<Vec<serde_json::Value>, StoreError>;
    /// How many acts `run` has requested.
    fn count_acts(&self, run: &str) -> Result<u64, StoreError>;
    /// How many acts were requested at or after `since` (RFC 3339), by
    /// every run or by the runs of repository `repo` (as runs record it).
    fn count_acts_since(&self, since: &str, repo: Option<&str>) -> Result<u64, StoreError>;
    /// Stores a new act with its audit event.
    fn put_act(
        &mut self,
        id: &str,
        run: &str,
        act: &serde_json::Value,
        state: &serde_json::Value,
        content: Option<&[u8]>,
        event: &Event,
    ) -> Result<(), StoreError>;
    /// Stores a new act with its audit event only if the acts already
    /// stored, counted at the same moment, pass `bounds`; `Some(refusal)`
    /// (nothing written) when they do not. The default counts, then
    /// stores, through `&mut self`: atomic for a store no one else shares;
    /// a shared store overrides it with one transaction.
    #[allow(clippy::too_many_arguments)]
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
        let counts = ActCounts {
            of_run: self.count_acts(run)?,
            tonight: self.count_acts_since(bounds.since, None)?,
            of_repository: self.count_acts_since(bounds.since, Some(bounds.repo))?,
        };
        if let Some(refusal) = (bounds.refuse)(counts) {
            return Ok(Some(refusal));
        }
        self.put_act(id, run, act, state, content, event)?;
        Ok(None)
    }
    /// Acts (one, or all) oldest first.
    fn acts(&self, id: Option<&str>) -> Result<Vec<StoredAct>, StoreError>;
    /// Moves an act from `from` to `to` with its audit event.
    fn transition_act(
        &mut self,
        id: &str,
        run: &str,
        from: &serde_json::Value,
        to: &serde_json::Value,
        event: &Event,
    ) -> Result<bool, StoreError>;
    /// Every run, oldest first.
    fn runs(&self) -> Result<Vec<RunRecord>, StoreError>;
    /// Adds tasks `(id, spec)` in order, all or none.
    fn insert_tasks(&mut self, tasks: &[(String, String)], state: &str) -> Result<(), StoreError>;
    /// Every task, in the queue's order.
    fn tasks(&self) -> Result<Vec<StoredTask>, StoreError>;
    /// Compare-and-set of a task's state.
    fn move_task(
        &mut self,
        id: &str,
        from: &[&str],
        to: &str,
        progress: &str,
    ) -> Result<bool, StoreError>;
    /// Records a dry run's act with its audit event, together or not at all.
    fn put_dry_act(
        &mut self,
        id: &str,
        run: &str,
        record: &serde_json::Value,
        event: &Event,
    ) -> Result<Entry, StoreError>;
    /// A value of the store's own metadata (the owner key's digest).
    fn meta(&self, key: &str) -> Result<Option<String>, StoreError>;
    /// One run's record.
    fn run(&self, id: &str) -> Result<RunRecord, StoreError>;
    /// Saves a run's record (created or updated).
    fn put_run(&mut self, record: &RunRecord) -> Result<(), StoreError>;
    /// Who asked the kill switch to kill `run`, if anyone did.
    fn kill_request(&self, run: &str) -> Result<Option<String>, StoreError>;
    /// Saves a run whose work is safe and marks it so, together.
    fn record_imported(&mut self, record: &RunRecord) -> Result<(), StoreError>;
    /// Saves a run's final record with its ending, together; `None` (nothing
    /// written) when the stored record is already final.
    fn end_run(&mut self, record: &RunRecord, event: &Event) -> Result<Option<Entry>, StoreError>;
}

impl StateStore for crate::store::Store {
    fn put_dry_act(
        &mut self,
        id: &str,
        run: &str,
        record: &serde_json::Value,
        event: &Event,
    ) -> Result<Entry, StoreError> {
        crate::store::Store::put_dry_act(self, id, run, record, event)
    }
    fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        crate::store::Store::get_meta(self, key)
    }
    fn run(&self, id: &str) -> Result<RunRecord, StoreError> {
        crate::store::Store::run(self, id)
    }
    fn put_run(&mut self, record: &RunRecord) -> Result<(), StoreError> {
        crate::store::Store::put_run(self, record)
    }
    fn kill_request(&self, run: &str) -> Result<Option<String>, StoreError> {
        crate::store::Store::kill_request(self, run)
    }
    fn record_imported(&mut self, record: &RunRecord) -> Result<(), StoreError> {
        crate::store::Store::record_imported(self, record)
    }
    fn end_run(&mut self, record: &RunRecord, event: &Event) -> Result<Option<Entry>, StoreError> {
        crate::store::Store::end_run(self, record, event)
    }
    fn root(&self) -> &Path {
        &self.paths().root
    }
    fn append(
        &mut self,
        run: Option<&str>,
        event: &Event,
        checkpoint: bool,
    ) -> Result<Entry, StoreError> {
        crate::store::Store::append(self, run, event, checkpoint)
    }
    fn policy_rows(&self) -> Result<Vec<serde_json::Value>, StoreError> {
        crate::store::Store::policy_rows(self)
    }
    fn count_acts(&self, run: &str) -> Result<u64, StoreError> {
        crate::store::Store::count_acts(self, run)
    }
    fn count_acts_since(&self, since: &str, repo: Option<&str>) -> Result<u64, StoreError> {
        crate::store::Store::count_acts_since(self, since, repo)
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
        crate::store::Store::put_act(self, id, run, act, state, content, event)
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
        crate::store::Store::put_act_within(self, id, run, act, state, content, event, bounds)
    }
    fn acts(&self, id: Option<&str>) -> Result<Vec<StoredAct>, StoreError> {
        crate::store::Store::acts(self, id)
    }
    fn transition_act(
        &mut self,
        id: &str,
        run: &str,
        from: &serde_json::Value,
        to: &serde_json::Value,
        event: &Event,
    ) -> Result<bool, StoreError> {
        crate::store::Store::transition_act(self, id, run, from, to, event)
    }
    fn runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        crate::store::Store::runs(self)
    }
    fn insert_tasks(&mut self, tasks: &[(String, String)], state: &str) -> Result<(), StoreError> {
        crate::store::Store::insert_tasks(self, tasks, state)
    }
    fn tasks(&self) -> Result<Vec<StoredTask>, StoreError> {
        crate::store::Store::tasks(self)
    }
    fn move_task(
        &mut self,
        id: &str,
        from: &[&str],
        to: &str,
        progress: &str,
    ) -> Result<bool, StoreError> {
        crate::store::Store::move_task(self, id, from, to, progress)
    }
}

pub mod fake {
    //! An in-memory [`StateStore`] for unit tests: everything in vectors,
    //! the audit chain sealed as the real store seals it, and switches that
    //! make a write fail, to test what the core does then.

    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};

    use orchestrator_audit::{Entry, LogId};

    use super::{StateStore, StoredAct};
    use crate::audit_log::Event;
    use crate::store::{RunRecord, StoreError, StoredTask};

    /// (id, run, act, state, content)
    pub type FakeAct = (
        String,
        String,
        serde_json::Value,
        serde_json::Value,
        Option<Vec<u8>>,
    );

    #[derive(Debug)]
    pub struct MemStore {
        pub root: PathBuf,
        pub log: LogId,
        pub audit: Vec<Entry>,
        pub policy_rows: Vec<serde_json::Value>,
        pub acts: Vec<FakeAct>,
        pub runs: Vec<RunRecord>,
        pub tasks: Vec<StoredTask>,
        pub meta: BTreeMap<String, String>,
        /// run -> who asked the kill switch to kill it.
        pub kill_requests: BTreeMap<String, String>,
        /// Runs whose work was marked safe, in order.
        pub imported: Vec<String>,
        /// Dry runs' acts: (id, run, record).
        pub dry_acts: Vec<(String, String, serde_json::Value)>,
        /// When true, every audit append of its own fails (`append`; an
        /// act's writes with their event still succeed).
        pub fail_appends: bool,
        /// When true, counting acts fails.
        pub fail_counts: bool,
    }

    impl MemStore {
        /// An empty state whose files (rules, destinations) live in `root`.
        pub fn new(root: &Path) -> Self {
            Self {
                root: root.to_path_buf(),
                log: LogId("fake".into()),
                audit: Vec::new(),
                policy_rows: Vec::new(),
                acts: Vec::new(),
                runs: Vec::new(),
                tasks: Vec::new(),
                meta: BTreeMap::new(),
                kill_requests: BTreeMap::new(),
                imported: Vec::new(),
                dry_acts: Vec::new(),
                fail_appends: false,
                fail_counts: false,
            }
        }

        /// The kinds of the audit entries, in order.
        pub fn kinds(&self) -> Vec<&str> {
            self.audit.iter().map(|e| e.kind.as_str()).collect()
        }

        fn seal(&self, run: Option<&str>, event: &Event) -> Result<Entry, StoreError> {
            let (kind, body) = event.kind_and_body();
            let body = match body {
                serde_json::Value::Object(map) => map,
                other => serde_json::Map::from_iter([("value".to_string(), other)]),
            };
            orchestrator_audit::seal(
                &self.log,
                self.audit.last(),
                &crate::store::now_rfc3339(),
                &kind,
                run,
                body,
            )
            .map_err(|e| StoreError::BadEntry {
                seq: self.audit.len() as i64 + 1,
                message: e.to_string(),
            })
        }
    }

    impl StateStore for MemStore {
        fn root(&self) -> &Path {
            &self.root
        }
        fn append(
            &mut self,
            run: Option<&str>,
            event: &Event,
            _checkpoint: bool,
        ) -> Result<Entry, StoreError> {
            if self.fail_appends {
                return Err(StoreError::BadEntry {
                    seq: self.audit.len() as i64 + 1,
                    message: "the fake store refuses this append".into(),
                });
            }
            let entry = self.seal(run, event)?;
            self.audit.push(entry.clone());
            Ok(entry)
        }
        fn policy_rows(&self) -> Result<Vec<serde_json::Value>, StoreError> {
            Ok(self.policy_rows.clone())
        }
        fn count_acts(&self, run: &str) -> Result<u64, StoreError> {
            if self.fail_counts {
                return Err(StoreError::BadEntry {
                    seq: 0,
                    message: "the fake store cannot count".into(),
                });
            }
            Ok(self.acts.iter().filter(|a| a.1 == run).count() as u64)
        }
        /// The fake keeps no times: every act counts as tonight's.
        fn count_acts_since(&self, _since: &str, repo: Option<&str>) -> Result<u64, StoreError> {
            if self.fail_counts {
                return Err(StoreError::BadEntry {
                    seq: 0,
                    message: "the fake store cannot count".into(),
                });
            }
            let of_repo = |run: &str| {
                repo.is_none_or(|repo| self.runs.iter().any(|r| r.id == run && r.repo == repo))
            };
            Ok(self.acts.iter().filter(|a| of_repo(&a.1)).count() as u64
                + self.dry_acts.iter().filter(|a| of_repo(&a.1)).count() as u64)
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
            let entry = self.seal(Some(run), event)?;
            self.audit.push(entry);
            self.acts.push((
                id.into(),
                run.into(),
                act.clone(),
                state.clone(),
                content.map(<[u8]>::to_vec),
            ));
            Ok(())
        }
        fn acts(&self, id: Option<&str>) -> Result<Vec<StoredAct>, StoreError> {
            Ok(self
                .acts
                .iter()
                .filter(|a| id.is_none_or(|id| a.0 == id))
                .map(|a| (a.2.clone(), a.3.clone(), a.4.clone()))
                .collect())
        }
        fn transition_act(
            &mut self,
            id: &str,
            run: &str,
            from: &serde_json::Value,
            to: &serde_json::Value,
            event: &Event,
        ) -> Result<bool, StoreError> {
            let Some(i) = self.acts.iter().position(|a| a.0 == id && &a.3 == from) else {
                return Ok(false);
            };
            let entry = self.seal(Some(run), event)?;
            self.audit.push(entry);
            self.acts[i].3 = to.clone();
            Ok(true)
        }
        fn put_dry_act(
            &mut self,
            id: &str,
            run: &str,
            record: &serde_json::Value,
            event: &Event,
        ) -> Result<Entry, StoreError> {
            let entry = self.seal(Some(run), event)?;
            self.audit.push(entry.clone());
            self.dry_acts.push((id.into(), run.into(), record.clone()));
            Ok(entry)
        }
        fn runs(&self) -> Result<Vec<RunRecord>, StoreError> {
            Ok(self.runs.clone())
        }
        fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
            Ok(self.meta.get(key).cloned())
        }
        fn run(&self, id: &str) -> Result<RunRecord, StoreError> {
            self.runs
                .iter()
                .find(|r| r.id == id)
                .cloned()
                .ok_or_else(|| StoreError::NoSuchRun(id.to_string()))
        }
        fn put_run(&mut self, record: &RunRecord) -> Result<(), StoreError> {
            match self.runs.iter_mut().find(|r| r.id == record.id) {
                Some(r) => *r = record.clone(),
                None => self.runs.push(record.clone()),
            }
            Ok(())
        }
        fn kill_request(&self, run: &str) -> Result<Option<String>, StoreError> {
            Ok(self.kill_requests.get(run).cloned())
        }
        fn record_imported(&mut self, record: &RunRecord) -> Result<(), StoreError> {
            self.put_run(record)?;
            if !self.imported.contains(&record.id) {
                self.imported.push(record.id.clone());
            }
            Ok(())
        }
        fn end_run(
            &mut self,
            record: &RunRecord,
            event: &Event,
        ) -> Result<Option<Entry>, StoreError> {
            let already = self
                .runs
                .iter()
                .any(|r| r.id == record.id && crate::store::is_final(&r.status));
            if already {
                return Ok(None);
            }
            let entry = self.seal(Some(&record.id), event)?;
            self.audit.push(entry.clone());
            self.put_run(record)?;
            Ok(Some(entry))
        }
        fn insert_tasks(
            &mut self,
            tasks: &[(String, String)],
            state: &str,
        ) -> Result<(), StoreError> {
            let now = crate::store::now_rfc3339();
            for (id, _) in tasks {
                if self.tasks.iter().any(|t| &t.id == id) {
                    return Err(StoreError::BadEntry {
                        seq: 0,
                        message: format!("task {id} exists"),
                    });
                }
            }
            for (id, spec) in tasks {
                let seq = self.tasks.last().map(|t| t.seq + 1).unwrap_or(1);
                self.tasks.push(StoredTask {
                    seq,
                    id: id.clone(),
                    state: state.into(),
                    spec: spec.clone(),
                    progress: "{}".into(),
                    created_at: now.clone(),
                    updated_at: now.clone(),
                });
            }
            Ok(())
        }
        fn tasks(&self) -> Result<Vec<StoredTask>, StoreError> {
            Ok(self.tasks.clone())
        }
        fn move_task(
            &mut self,
            id: &str,
            from: &[&str],
            to: &str,
            progress: &str,
        ) -> Result<bool, StoreError> {
            let Some(t) = self
                .tasks
                .iter_mut()
                .find(|t| t.id == id && from.contains(&t.state.as_str()))
            else {
                return Ok(false);
            };
            t.state = to.into();
            t.progress = progress.into();
            t.updated_at = crate::store::now_rfc3339();
            Ok(true)
        }
    }

    /// One [`MemStore`] held by several parties at once, as two supervisors
    /// share one database: every call takes the lock for itself alone, so
    /// calls from threads interleave as they would on a real store.
    #[derive(Debug, Clone)]
    pub struct SharedMemStore {
        root: PathBuf,
        pub inner: std::sync::Arc<std::sync::Mutex<MemStore>>,
    }

    impl SharedMemStore {
        pub fn new(store: MemStore) -> Self {
            Self {
                root: store.root.clone(),
                inner: std::sync::Arc::new(std::sync::Mutex::new(store)),
            }
        }

        pub fn lock(&self) -> std::sync::MutexGuard<'_, MemStore> {
            self.inner.lock().unwrap_or_else(|p| p.into_inner())
        }
    }

    impl StateStore for SharedMemStore {
        fn root(&self) -> &Path {
            &self.root
        }
        fn append(
            &mut self,
            run: Option<&str>,
            event: &Event,
            checkpoint: bool,
        ) -> Result<Entry, StoreError> {
            self.lock().append(run, event, checkpoint)
        }
        fn policy_rows(&self) -> Result<Vec<serde_json::Value>, StoreError> {
            self.lock().policy_rows()
        }
        fn count_acts(&self, run: &str) -> Result<u64, StoreError> {
            self.lock().count_acts(run)
        }
        fn count_acts_since(&self, since: &str, repo: Option<&str>) -> Result<u64, StoreError> {
            self.lock().count_acts_since(since, repo)
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
            self.lock().put_act(id, run, act, state, content, event)
        }
        fn put_act_within(
            &mut self,
            id: &str,
            run: &str,
            act: &serde_json::Value,
            state: &serde_json::Value,
            content: Option<&[u8]>,
            event: &Event,
            bounds: &super::ActBounds<'_>,
        ) -> Result<Option<(&'static str, String)>, StoreError> {
            self.lock()
                .put_act_within(id, run, act, state, content, event, bounds)
        }
        fn acts(&self, id: Option<&str>) -> Result<Vec<StoredAct>, StoreError> {
            self.lock().acts(id)
        }
        fn transition_act(
            &mut self,
            id: &str,
            run: &str,
            from: &serde_json::Value,
            to: &serde_json::Value,
            event: &Event,
        ) -> Result<bool, StoreError> {
            self.lock().transition_act(id, run, from, to, event)
        }
        fn runs(&self) -> Result<Vec<RunRecord>, StoreError> {
            self.lock().runs()
        }
        fn insert_tasks(
            &mut self,
            tasks: &[(String, String)],
            state: &str,
        ) -> Result<(), StoreError> {
            self.lock().insert_tasks(tasks, state)
        }
        fn tasks(&self) -> Result<Vec<StoredTask>, StoreError> {
            self.lock().tasks()
        }
        fn move_task(
            &mut self,
            id: &str,
            from: &[&str],
            to: &str,
            progress: &str,
        ) -> Result<bool, StoreError> {
            self.lock().move_task(id, from, to, progress)
        }
        fn put_dry_act(
            &mut self,
            id: &str,
            run: &str,
            record: &serde_json::Value,
            event: &Event,
        ) -> Result<Entry, StoreError> {
            self.lock().put_dry_act(id, run, record, event)
        }
        fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
            self.lock().meta(key)
        }
        fn run(&self, id: &str) -> Result<RunRecord, StoreError> {
            self.lock().run(id)
        }
        fn put_run(&mut self, record: &RunRecord) -> Result<(), StoreError> {
            self.lock().put_run(record)
        }
        fn kill_request(&self, run: &str) -> Result<Option<String>, StoreError> {
            self.lock().kill_request(run)
        }
        fn record_imported(&mut self, record: &RunRecord) -> Result<(), StoreError> {
            self.lock().record_imported(record)
        }
        fn end_run(
            &mut self,
            record: &RunRecord,
            event: &Event,
        ) -> Result<Option<Entry>, StoreError> {
            self.lock().end_run(record, event)
        }
    }
}

/// The fake keeps the trait's invariants, so tests of the core on it mean
/// what they say.
#[cfg(test)]
mod fake_tests {
    use super::fake::MemStore;
    use super::StateStore;
    use crate::audit_log::Event;
    use crate::store::RunRecord;

    fn ended(status: &str) -> Event {
        Event::RunEnded {
            status: status.into(),
            reason: None,
        }
    }

    #[test]
    fn a_run_is_ended_once_and_acts_move_only_from_the_state_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MemStore::new(dir.path());
        let mut run = RunRecord {
            id: "r1".into(),
            status: "running".into(),
            ..Default::default()
        };
        store.put_run(&run).unwrap();
        run.status = "exited 0".into();
        assert!(store.end_run(&run, &ended("exited 0")).unwrap().is_some());
        run.status = "killed: by someone".into();
        assert!(store.end_run(&run, &ended("killed")).unwrap().is_none());
        assert_eq!(store.run("r1").unwrap().status, "exited 0");
        assert_eq!(store.kinds(), ["run_ended"]);

        let (pending, done) = (serde_json::json!("pending"), serde_json::json!("done"));
        let event = ended("x");
        store
            .put_act("a1", "r1", &serde_json::json!({}), &pending, None, &event)
            .unwrap();
        assert!(store
            .transition_act("a1", "r1", &pending, &done, &event)
            .unwrap());
        assert!(!store
            .transition_act("a1", "r1", &pending, &done, &event)
            .unwrap());
        assert_eq!(
            store.audit.len(),
            3,
            "a move that did not happen was audited"
        );
        orchestrator_audit::verify(&store.log, &store.audit, &[]).unwrap();
    }
}
