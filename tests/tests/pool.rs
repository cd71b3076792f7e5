//! Warm sandboxes (`[pool]` under `nightshift serve`): a queued task's run
//! begins in a sandbox made and started before the task was enqueued, with
//! the run's own worktree, task and base commit, attested as the run's;
//! no warm sandbox serves two runs; the pool refills; a stopped `serve`
//! removes its warm sandboxes, and a killed one's are swept (containers,
//! worktrees and their mounts, doors, markers) by its watchdog.

use std::path::Path;
use std::time::Duration;

use tests::browser::Serve;
use tests::queue::{tasks, wait_tasks};
use tests::{engine_cli, image, make_repo, stderr, stdout, wait_until, State};

/// Ends every sandbox of the state even when the test fails.
struct Cleanup<'a>(&'a State);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = self.0.run(&["kill", "--all"]);
    }
}

fn write_config(state: &State, size: usize) {
    std::fs::write(
        state.path().join("config.toml"),
        format!("[pool]\nsize = {size}\nimages = [\"{}\"]\n", image()),
    )
    .unwrap();
}

/// The warm sandboxes' markers (`STATE/pool/<id>`).
fn markers(state: &State) -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(state.path().join("pool"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    ids.sort();
    ids
}

/// The running containers labelled as run `id`'s.
fn running_containers_of(id: &str) -> Vec<String> {
    let out = std::process::Command::new(engine_cli())
        .args(["ps", "-q", "--no-trunc", "--filter"])
        .arg(format!("label=nightshift.run={id}"))
        .output()
        .unwrap();
    stdout(&out)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Waits for `n` warm sandboxes, each running; their ids.
fn warm_sandboxes(state: &State, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    wait_until(
        &format!("{n} warm sandboxes running"),
        Duration::from_secs(120),
        || {
            ids = markers(state);
            ids.len() == n && ids.iter().all(|id| running_containers_of(id).len() == 1)
        },
    );
    ids
}

fn mounted(path: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == path.to_str())
}

fn enqueue(state: &State, repo: &Path, task: &str) {
    let out = state.run(&[
        "enqueue",
        "--repo",
        repo.to_str().unwrap(),
        "--ref",
        "main",
        "--image",
        &image(),
        "--task",
        task,
        "--",
        "bash",
        "-c",
        "printf '%s' \"$NIGHTSHIFT_TASK\" > task.txt; printf '%s' \"$NIGHTSHIFT_BASE_COMMIT\" > base.txt; \
         tr '\\0' ' ' < /proc/1/cmdline > pid1.txt; \
         if echo '{\"argv\":[\"true\"],\"env\":{}}' > /run/nightshift/command 2>/dev/null; \
         then echo written > attack.txt; else echo refused > attack.txt; fi; \
         git add -A && git -c user.name=a -c user.email=a@b commit -qm warm",
    ]);
    assert!(out.status.success(), "enqueue: {}", stderr(&out));
}

#[test]
fn warm_runs_begin_in_sandboxes_made_before_them_and_none_is_used_twice() {
    let state = State::new();
    let _cleanup = Cleanup(&state);
    let repo = make_repo();
    let base = tests::git(repo.path(), &["rev-parse", "main"])
        .trim()
        .to_string();
    write_config(&state, 1);
    let serve = Serve::start(&state, &["--max-parallel", "1"]);

    let mut used_ids = Vec::new();
    let mut used_containers = Vec::new();
    for n in 0..2 {
        // A warm sandbox, running before its task exists.
        let warm = warm_sandboxes(&state, 1).remove(0);
        let container = running_containers_of(&warm).remove(0);
        assert!(
            !used_ids.contains(&warm),
            "a warm sandbox came back: {warm}"
        );
        let task = format!("warm task {n}");
        enqueue(&state, repo.path(), &task);
        wait_tasks(&state, "the task done", |t| {
            t.len() == n + 1 && t[n]["state"] == "done"
        });

        // Its run is that sandbox, bound to this run.
        let t = &tasks(&state)[n];
        let run = t["progress"]["run"].as_str().unwrap().to_string();
        assert_eq!(run, warm, "the run did not take the warm sandbox: {t:#?}");
        let r = &state.show(&run)["run"];
        assert_eq!(r["status"], "exited 0", "{r:#?}");
        assert!(
            container.starts_with(r["container_id"].as_str().unwrap()),
            "another container ran the task: {r:#?} vs {container}"
        );
        let result = r["result_ref"].as_str().expect("imported");
        let show = |file: &str| tests::git(repo.path(), &["show", &format!("{result}:{file}")]);
        assert_eq!(show("task.txt"), task);
        assert_eq!(show("base.txt"), base);
        // Its PID 1 is the wrapper that waited for it, and the agent cannot
        // hand the wrapper (or anything) another command.
        assert!(
            show("pid1.txt").contains("--command-file"),
            "{}",
            show("pid1.txt")
        );
        assert_eq!(show("attack.txt").trim(), "refused");
        // Attested as the run's before its command was handed over, and
        // its sandbox removed at its ending like any run's.
        let kinds = tests::audit_kinds(&state, &run);
        let at = |k: &str| {
            kinds
                .iter()
                .position(|x| x == k)
                .unwrap_or_else(|| panic!("{k} missing: {kinds:?}"))
        };
        assert!(at("worktree_created") < at("attestation"), "{kinds:?}");
        assert!(at("attestation") < at("started"), "{kinds:?}");
        let attested = state
            .audit_runs_and_bodies("attestation")
            .into_iter()
            .find(|(r, _)| r.as_deref() == Some(run.as_str()))
            .expect("the run's attestation")
            .1;
        assert_eq!(attested["passed"], true, "{attested:#?}");
        wait_until("the used sandbox removed", Duration::from_secs(30), || {
            running_containers_of(&run).is_empty()
        });
        assert!(!state.path().join("worktrees").join(&run).exists());
        used_ids.push(run);
        used_containers.push(container);
    }
    assert_ne!(used_containers[0], used_containers[1]);

    // A stopped serve removes its warm sandbox and everything of it.
    let warm = warm_sandboxes(&state, 1).remove(0);
    drop(serve);
    wait_until("the warm sandbox removed", Duration::from_secs(60), || {
        running_containers_of(&warm).is_empty() && markers(&state).is_empty()
    });
    assert!(!mounted(&state.path().join("worktrees").join(&warm)));
    assert!(!state.path().join("worktrees").join(&warm).exists());
    assert!(!state.path().join("doors").join(&warm).exists());
    assert!(state.containers().is_empty(), "{:?}", state.containers());
}

#[test]
fn a_killed_serves_warm_sandboxes_are_swept() {
    let state = State::new();
    let _cleanup = Cleanup(&state);
    write_config(&state, 2);
    let mut serve = Serve::start(&state, &["--max-parallel", "1"]);
    let warm = warm_sandboxes(&state, 2);
    for id in &warm {
        assert!(mounted(&state.path().join("worktrees").join(id)));
    }
    serve.child.kill().unwrap();
    serve.child.wait().unwrap();
    // Its watchdog finds it gone and sweeps what it had made.
    wait_until(
        "the killed serve's warm sandboxes swept",
        Duration::from_secs(90),
        || markers(&state).is_empty() && state.containers().is_empty(),
    );
    for id in &warm {
        let worktree = state.path().join("worktrees").join(id);
        assert!(!mounted(&worktree), "{id}'s worktree still mounted");
        assert!(!worktree.exists());
        assert!(!state.path().join("doors").join(id).exists());
    }
    // Nothing of them is a run.
    assert!(state.runs().is_empty(), "{:#?}", state.runs());
}

#[test]
fn a_frozen_state_keeps_no_warm_sandbox_and_a_kill_ends_them() {
    let state = State::new();
    let _cleanup = Cleanup(&state);
    assert!(state.run(&["owner", "init"]).status.success());
    let key = state.path().join("owner.key");
    write_config(&state, 1);
    let _serve = Serve::start(&state, &["--max-parallel", "1"]);
    let first = warm_sandboxes(&state, 1).remove(0);
    // The kill switch ends it; the pool removes it and makes another.
    let out = state.run(&["kill", "--all"]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_until(
        "a new warm sandbox after the kill",
        Duration::from_secs(60),
        || {
            let now = markers(&state);
            now.len() == 1 && now[0] != first && running_containers_of(&now[0]).len() == 1
        },
    );
    assert!(!state.path().join("worktrees").join(&first).exists());
    // Frozen: none kept, none made.
    let out = state.run(&["freeze", "--why", "no warm sandboxes tonight"]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_until(
        "no warm sandbox while frozen",
        Duration::from_secs(60),
        || markers(&state).is_empty() && state.containers().is_empty(),
    );
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        markers(&state).is_empty(),
        "a warm sandbox made while frozen"
    );
    // Thawed: the pool fills again.
    let out = state.run(&["thaw", "--owner-key-file", key.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    warm_sandboxes(&state, 1);
}

#[test]
fn a_warm_sandbox_that_no_longer_fits_is_removed_and_the_run_begins_cold() {
    use std::os::unix::fs::PermissionsExt;
    let state = State::new();
    let _cleanup = Cleanup(&state);
    let repo = make_repo();
    write_config(&state, 1);
    let serve = Serve::start(&state, &["--max-parallel", "1"]);
    let warm = warm_sandboxes(&state, 1).remove(0);
    let container = running_containers_of(&warm).remove(0);
    // A model gateway configured after the sandbox was made without one:
    // the sandbox no longer fits (no relay in it), the run must begin cold.
    let key = state.path().join("model.key");
    std::fs::write(&key, "k\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(
        state.path().join("models.toml"),
        format!(
            "[endpoints.oai]\napi = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nkey_file = \"{}\"\nmodels = [\"gpt-5*\"]\n",
            key.display()
        ),
    )
    .unwrap();
    enqueue(&state, repo.path(), "cold after all");
    wait_tasks(&state, "the task done", |t| {
        t.len() == 1 && t[0]["state"] == "done"
    });
    let t = &tasks(&state)[0];
    let run = t["progress"]["run"].as_str().unwrap().to_string();
    let r = &state.show(&run)["run"];
    assert_eq!(r["status"], "exited 0", "{r:#?}");
    // The pool does not look at models.toml: the sandbox was reserved for
    // this run, found unfit at its beginning, and removed before the run
    // began cold under its id; it did not run in that sandbox ...
    assert_eq!(run, warm, "{t:#?}");
    assert!(
        !container.starts_with(r["container_id"].as_str().unwrap()),
        "the run ran in a warm sandbox that does not fit: {r:#?}"
    );
    let result = r["result_ref"].as_str().expect("imported");
    let task = tests::git(repo.path(), &["show", &format!("{result}:task.txt")]);
    assert_eq!(task, "cold after all");
    // ... and nothing of either is left (the run's ending removed its own).
    wait_until(
        "the unfit warm sandbox removed",
        Duration::from_secs(30),
        || running_containers_of(&warm).is_empty(),
    );
    assert!(!state.path().join("worktrees").join(&warm).exists());
    assert!(!state.path().join("doors").join(&warm).exists());
    drop(serve);
}
