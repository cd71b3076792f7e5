//! Continue in the morning: a run a cap ended (tokens, wall clock, output,
//! worktree) becomes a new task of the run queue, from the capped run's
//! result ref, with the same task text and agent and the caps the owner
//! gives now (`nightshift continue RUN`, the Run page's button).
//!
//! Invariants:
//! - Only a run ended by one of [`CONTINUABLE`] caps is continued; any other
//!   run (it exited, failed, was killed by a person, hit its memory cap, is
//!   still going, has no result ref) is refused with the reason, and the
//!   dashboard shows no button for it ([`continuable`];
//!   `tests::only_runs_a_cap_ended_are_continued`).
//! - A run is continued once: a second request while a continuation is
//!   queued, running or done is refused (a double click enqueues nothing
//!   more; `tests::a_run_is_continued_once`).
//! - The decision is pure ([`continuation`]); the API enqueues its task
//!   through the queue's one path (`tasks::enqueue`) and audits the request
//!   on the capped run; the new run's creation audits the link both ways
//!   (`continues` on the new run, `continued_as` on the old;
//!   `run.rs::lifecycle`).

use nightshift_core::state_store::RunRecord;

use crate::tasks::{TaskRow, TaskSpec, TaskState};

/// The caps (as `summary::cap` names them) whose runs may be continued.
pub const CONTINUABLE: [&str; 4] = ["tokens", "wall-clock", "output", "worktree"];

/// The cap that ended `run`, when it is one a run may be continued after;
/// else why not.
pub fn continuable(run: &RunRecord) -> Result<&'static str, String> {
    let not = |why: String| {
        Err(format!(
            "run {} cannot be continued: {why}; only a run ended by its token, time, output or worktree cap can",
            run.id
        ))
    };
    if !nightshift_core::state_store::is_final(&run.status) {
        return not("it has not ended".into());
    }
    let Some(cap) = crate::summary::cap(&run.status) else {
        return not(format!(
            "it ended {}",
            match crate::summary::outcome(&run.status) {
                "succeeded" => "well (exited 0)",
                "failed" => "with a non-zero exit",
                "killed" => "by a person's kill",
                "interrupted" => "interrupted",
                "refused" => "refused before it started",
                "import_failed" => "with a failed import",
                "error" => "in an error",
                _ => "otherwise",
            }
        ));
    };
    if !CONTINUABLE.contains(&cap) {
        return not(match cap {
            "other" => "it was stopped, but not by one of its caps".into(),
            "model-refused" => "its model calls were refused again and again".into(),
            cap => format!("its {cap} cap ended it"),
        });
    }
    if run.result_ref.is_none() || run.result_commit.is_none() {
        return not(format!(
            "it has no result ref (its import did not complete; `nightshift import {}` first)",
            run.id
        ));
    }
    Ok(cap)
}

/// What the owner asks a continuation for: caps that replace the capped
/// run's (`None`: the same as before).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewCaps {
    pub max_tokens: Option<u64>,
    pub timeout: Option<String>,
}

/// The task that continues `run`: its own task's spec when the queue holds
/// it (agent preset, model, caps), else one made from the run's record,
/// started from the run's result ref, with `caps` over the old ones; or
/// why it may not be continued. `tasks`: the queue, to find the run's task
/// and a continuation already asked for.
pub fn continuation(
    run: &RunRecord,
    tasks: &[TaskRow],
    caps: &NewCaps,
) -> Result<(TaskSpec, &'static str), String> {
    let cap = continuable(run)?;
    if let Some(t) = tasks.iter().find(|t| {
        t.spec.continues.as_deref() == Some(run.id.as_str())
            && !matches!(t.state, TaskState::Cancelled | TaskState::Failed)
    }) {
        return Err(format!(
            "run {} is already continued by task {} ({})",
            run.id,
            t.id,
            t.state.name()
        ));
    }
    let mut spec = match tasks
        .iter()
        .find(|t| t.progress.run.as_deref() == Some(run.id.as_str()))
    {
        Some(t) => t.spec.clone(),
        None => TaskSpec {
            repo: run.repo.clone().into(),
            base_ref: run.base_ref.clone(),
            image: Some(run.image.clone()),
            task: None,
            task_file: None,
            memory: None,
            cpus: None,
            pids: None,
            timeout: None,
            max_output: None,
            max_worktree: None,
            max_files: None,
            max_tokens: None,
            agent: None,
            model: None,
            retries: 0,
            dry_run: run.dry_run,
            command: run.command.clone(),
            continues: None,
        },
    };
    // The text as the run kept it (a task file was read when enqueued).
    spec.task = run.task.clone().or(spec.task);
    spec.task_file = None;
    spec.base_ref = run.result_ref.clone().unwrap_or_default();
    spec.continues = Some(run.id.clone());
    if caps.max_tokens.is_some() {
        spec.max_tokens = caps.max_tokens;
    }
    if caps.timeout.is_some() {
        spec.timeout = caps.timeout.clone();
    }
    Ok((spec, cap))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::Progress;

    fn run(status: &str) -> RunRecord {
        RunRecord {
            id: "r1".into(),
            repo: "/repo".into(),
            base_ref: "main".into(),
            image: "img".into(),
            command: vec!["agent".into()],
            status: status.into(),
            result_ref: Some("refs/nightshift/runs/r1".into()),
            result_commit: Some("c".repeat(40)),
            task: Some("fix the bug".into()),
            ..Default::default()
        }
    }

    fn task(id: &str, state: TaskState, spec: TaskSpec, run: Option<&str>) -> TaskRow {
        TaskRow {
            id: id.into(),
            seq: 1,
            state,
            spec,
            progress: Progress {
                run: run.map(str::to_string),
                ..Default::default()
            },
            created_at: String::new(),
            updated_at: String::new(),
        }
    }

    #[test]
    fn only_runs_a_cap_ended_are_continued() {
        for (status, cap) in [
            ("killed: timeout 2s", "wall-clock"),
            (
                "killed: model token cap 1000 (spent 990; the call needed 500)",
                "tokens",
            ),
            ("killed: output cap 16 MiB", "output"),
            ("killed: worktree cap 2 GiB", "worktree"),
        ] {
            assert_eq!(continuable(&run(status)), Ok(cap), "{status}");
        }
        for status in [
            "exited 0",
            "exited 1",
            "killed: by dashboard:alice: stop",
            "killed: memory cap 96 MiB (peak 96 MiB, OOM)",
            "killed: process cap 48 (48)",
            "killed: lease lapsed",
            "interrupted (SIGINT)",
            "running",
            "refused: attestation",
        ] {
            let why = continuable(&run(status)).unwrap_err();
            assert!(why.contains("cannot be continued"), "{status}: {why}");
        }
        let mut no_ref = run("killed: timeout 2s");
        no_ref.result_ref = None;
        assert!(continuable(&no_ref).unwrap_err().contains("no result ref"));
    }

    #[test]
    fn the_continuation_starts_from_the_result_with_the_same_task_and_new_caps() {
        let mut own: TaskSpec = serde_json::from_str(
            r#"{"repo": "/repo", "agent": "codex", "model": "m", "task": "old", "max_tokens": 10, "timeout": "1h", "memory": "1g"}"#,
        )
        .unwrap();
        own.task_file = Some("/tmp/t.txt".into());
        let tasks = vec![task("task-a", TaskState::Done, own, Some("r1"))];
        let caps = NewCaps {
            max_tokens: Some(5000),
            timeout: None,
        };
        let (spec, cap) = continuation(&run("killed: timeout 1h"), &tasks, &caps).unwrap();
        assert_eq!(cap, "wall-clock");
        assert_eq!(spec.base_ref, "refs/nightshift/runs/r1");
        assert_eq!(spec.agent.as_deref(), Some("codex"));
        assert_eq!(spec.model.as_deref(), Some("m"));
        assert_eq!(spec.task.as_deref(), Some("fix the bug"));
        assert_eq!(spec.task_file, None);
        assert_eq!(spec.max_tokens, Some(5000));
        assert_eq!(spec.timeout.as_deref(), Some("1h"));
        assert_eq!(spec.memory.as_deref(), Some("1g"));
        assert_eq!(spec.continues.as_deref(), Some("r1"));
        // Without its task in the queue: the record's image and command.
        let (spec, _) = continuation(&run("killed: timeout 1h"), &[], &NewCaps::default()).unwrap();
        assert_eq!(spec.image.as_deref(), Some("img"));
        assert_eq!(spec.command, vec!["agent".to_string()]);
    }

    #[test]
    fn a_run_is_continued_once() {
        let capped = run("killed: timeout 2s");
        let (spec, _) = continuation(&capped, &[], &NewCaps::default()).unwrap();
        for (state, refused) in [
            (TaskState::Queued, true),
            (TaskState::Running, true),
            (TaskState::Done, true),
            (TaskState::Cancelled, false),
            (TaskState::Failed, false),
        ] {
            let tasks = vec![task("task-b", state, spec.clone(), None)];
            let r = continuation(&capped, &tasks, &NewCaps::default());
            assert_eq!(r.is_err(), refused, "{state:?}: {r:?}");
            if let Err(why) = r {
                assert!(why.contains("already continued by task task-b"), "{why}");
            }
        }
    }
}
