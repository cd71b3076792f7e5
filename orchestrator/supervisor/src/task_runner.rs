//! The run queue's runs in process (`nightshift serve`): a task becomes a
//! [`RunRequest`] and runs through the same lifecycle as `nightshift run`
//! ([`run::execute_as`]), with the process's one [`Supervisor`].
//!
//! Invariants:
//! - A task's run is what `nightshift run` with the task's flags would run:
//!   caps the task leaves out take the configuration's, an agent preset
//!   brings its image and command, the default image otherwise; the agent's
//!   output is never echoed (it is in the run's `output.log`)
//!   (`tests::a_task_is_the_run_its_flags_make_and_its_output_is_not_echoed`).
//! - Every sandbox carries the process's identity, so the process's one
//!   watchdog stops them all if it dies, and a later supervisor's
//!   reconciliation settles their runs.
//! - An error is returned with the exit code `nightshift run` gives for it,
//!   so the queue settles a task alike whichever way it ran.

use futures_util::future::BoxFuture;
use tokio::sync::watch;

use crate::run::{self, RunRequest, Stop, Supervisor};
use crate::run_queue::{RunOutcome, TaskRow, TaskRunner, TaskSpec};
use nightshift_core::config::Config;
use nightshift_core::sandbox::Caps;

/// Runs tasks in this process with one supervisor.
#[derive(Debug, Clone)]
pub struct InProcess {
    pub sup: Supervisor,
    pub config: Config,
}

/// The run a task asks for, after the configuration's defaults; an agent
/// preset's run is checked as `nightshift run`'s is (`agents::check_ready`
/// on the state directory `root`).
pub fn request(
    spec: &TaskSpec,
    config: &Config,
    root: &std::path::Path,
) -> Result<RunRequest, String> {
    let d = config.caps();
    let size = |name: &str, v: &Option<String>| -> Result<Option<u64>, String> {
        v.as_deref()
            .map(nightshift_core::config::parse_size)
            .transpose()
            .map_err(|e| format!("{name}: {e}"))
    };
    let timeout = spec
        .timeout
        .as_deref()
        .map(nightshift_core::config::parse_span)
        .transpose()
        .map_err(|e| format!("timeout: {e}"))?;
    let caps = Caps {
        memory_bytes: size("memory", &spec.memory)?
            .map(|v| v as i64)
            .unwrap_or(d.memory_bytes),
        nano_cpus: spec.cpus.map(|v| (v * 1e9) as i64).unwrap_or(d.nano_cpus),
        pids: spec.pids.map(|v| v as i64).unwrap_or(d.pids),
        open_files: spec.max_files.map(|v| v as i64).unwrap_or(d.open_files),
        timeout: timeout.unwrap_or(d.timeout),
        max_output_bytes: size("max_output", &spec.max_output)?.unwrap_or(d.max_output_bytes),
        max_worktree_bytes: size("max_worktree", &spec.max_worktree)?
            .unwrap_or(d.max_worktree_bytes),
        tmpfs_bytes: d.tmpfs_bytes,
        lease: d.lease,
        max_tokens: spec.max_tokens.unwrap_or(d.max_tokens),
        fleet_max_tokens_per_night: d.fleet_max_tokens_per_night,
    };
    let (image, command) = match &spec.agent {
        None => (spec.image.clone(), spec.command.clone()),
        Some(name) => {
            let agent = nightshift_engine_docker::image::Agent::from_name(name)?;
            let preset = crate::agents::preset(agent, spec.model.as_deref())?;
            crate::agents::check_repository(agent, &spec.repo, &spec.base_ref)?;
            crate::agents::check_ready(agent, spec.model.as_deref(), root)?;
            (spec.image.clone().or(Some(preset.image)), preset.command)
        }
    };
    Ok(RunRequest {
        repo_confidentiality: config.repository_confidentiality(&spec.repo),
        repo: spec.repo.clone(),
        base_ref: spec.base_ref.clone(),
        image: image.unwrap_or_else(nightshift_engine_docker::image::default_reference),
        task: spec.task.clone().unwrap_or_default(),
        command,
        caps,
        echo: false,
        dry_run: spec.dry_run,
        setup: config.setup_plan(&spec.repo),
        continues: spec.continues.clone(),
    })
}

impl TaskRunner for InProcess {
    fn run(
        &self,
        task: TaskRow,
        run: String,
        stop: watch::Receiver<Option<Stop>>,
    ) -> BoxFuture<'static, RunOutcome> {
        let (sup, config) = (self.sup.clone(), self.config.clone());
        Box::pin(async move {
            let req = request(&task.spec, &config, &sup.paths().root).map_err(|e| {
                (
                    nightshift_core::exit::BAD_INPUT,
                    format!("task {}: {e}", task.id),
                )
            })?;
            run::execute_as(&sup, run, req, stop)
                .await
                .map_err(|e| (crate::api::run_error_exit_code(&e), e.to_string()))
        })
    }

    fn settle(
        &self,
        run: String,
        by: String,
        status: String,
    ) -> BoxFuture<'static, Result<bool, String>> {
        let sup = self.sup.clone();
        Box::pin(async move {
            crate::killswitch::settle_abandoned(&sup, &run, &by, &status)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn sandbox_gone(&self, run: String) -> BoxFuture<'static, bool> {
        let sup = self.sup.clone();
        Box::pin(async move {
            sup.engine
                .managed(Some(&run))
                .await
                .is_ok_and(|found| found.is_empty())
        })
    }

    fn warm_run_id(&self, task: &TaskRow) -> Option<String> {
        let pool = self.sup.pool.as_ref()?;
        let req = request(&task.spec, &self.config, &self.sup.paths().root).ok()?;
        if req.setup.is_some() {
            return None;
        }
        pool.reserve(&req.image, &req.caps)
    }

    fn reconcile(&self) -> BoxFuture<'static, Result<(), String>> {
        let sup = self.sup.clone();
        Box::pin(async move {
            crate::killswitch::reconcile(&sup, None, "supervisor start")
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_is_the_run_its_flags_make_and_its_output_is_not_echoed() {
        let config = Config::default();
        let spec: TaskSpec =
            serde_json::from_str(r#"{"repo": "/r", "command": ["true"], "memory": "1G"}"#).unwrap();
        let r = request(&spec, &config, std::path::Path::new("/nonexistent")).unwrap();
        assert!(!r.echo, "a queued run echoes its agent's output");
        assert_eq!(r.caps.memory_bytes, 1 << 30);
        assert_eq!(r.caps.pids, config.caps().pids);
        assert_eq!(r.caps.timeout, config.caps().timeout);
        assert_eq!(
            r.image,
            nightshift_engine_docker::image::default_reference()
        );
        assert_eq!(r.command, ["true"]);
    }
}
