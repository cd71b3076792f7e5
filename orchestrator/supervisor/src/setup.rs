//! The setup phase's adapter (docs/setup.md): carries out what
//! `nightshift_core::setup` decides, before the agent's sandbox exists.
//!
//! Invariants:
//! - setup runs in a container of its own ([`ContainerEngine::create_setup`],
//!   never `create`): the engine's bridge network, no door, no model
//!   gateway, on a read-only checkout of the base commit made by the git
//!   adapter for it (never the agent's worktree), writing only into a
//!   fresh directory of the cache
//!   (`tests/tests/setup.rs::setup_has_network_and_a_read_only_checkout_but_no_door_and_a_failure_stops_the_run`);
//! - a base an agent wrote is never set up unless the owner allowed it for
//!   the repository (`an_agent_written_tree_never_reaches_setup_unless_allowed`,
//!   `tests/tests/setup.rs::a_rust_repository_tests_offline_from_its_cache_and_the_next_run_skips_setup`);
//! - a cache entry is published whole or not at all: built in
//!   `STATE/setup/<repository>/.tmp-<run>`, checked against `max_bytes`,
//!   given back to the supervisor's user, digested
//!   (`tests::the_digest_follows_content_names_and_modes`), then renamed to
//!   its key; an entry is never changed after (the agent mounts it
//!   read-only: `a_setup_cache_passes_only_read_only_and_expected`);
//! - credential files are checked by the one rule for secret files
//!   (`nightshift_core::secret_file`) and handed to the setup container as
//!   read-only copies that are removed when it ends
//!   (`tests::a_credential_open_to_others_is_refused`).

use std::io::Read as _;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use nightshift_core::audit_log::{digest, Event};
use nightshift_core::container_engine::{ContainerEngine, Output};
use nightshift_core::setup::{self as core_setup, CacheEntry, Lockfile, SetupPlan, TreeDecision};
use nightshift_core::state_store::now_rfc3339;
use tokio::io::AsyncWriteExt as _;

use nightshift_core::container_engine::EngineError;
use nightshift_core::sandbox::{Caps, SandboxUser};
use nightshift_core::state_store::{StatePaths, StoreError};

/// Why the setup phase could not be carried out (a setup that ran and
/// failed is [`Setup::Failed`], not an error).
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{0}")]
    BadInput(String),
    #[error("setup phase: {0}")]
    Host(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

type RunError = SetupError;

/// What the setup phase needs of its run's supervisor.
pub struct Ctx<'a, E> {
    pub engine: &'a E,
    pub paths: StatePaths,
    /// Appends one audit entry of the run.
    pub audit: &'a (dyn Fn(Event) -> Result<(), StoreError> + Sync),
    pub sandbox_user: SandboxUser,
    pub state_tag: &'a str,
    pub identity: &'a str,
    pub cgroup_parent: Option<String>,
    /// Whether the run was asked to stop (polled while setup runs).
    pub stopped: &'a (dyn Fn() -> bool + Sync),
}

impl<E> std::fmt::Debug for Ctx<'_, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("state", &self.paths.root)
            .field("state_tag", &self.state_tag)
            .finish_non_exhaustive()
    }
}

/// What the setup phase needs of its run's request.
#[derive(Debug)]
pub struct Order<'a> {
    pub repo: &'a Path,
    pub base_ref: &'a str,
    pub image: &'a str,
    pub caps: &'a Caps,
}

/// A cache ready for the agent's sandbox.
#[derive(Debug, Clone)]
pub struct Ready {
    pub entry: CacheEntry,
    pub path: PathBuf,
    /// `built`, `reused` or `last-trusted`.
    pub outcome: &'static str,
    /// The lockfile names of the plan (the agent's changes to them are
    /// reported).
    pub lockfiles: Vec<String>,
}

/// How the setup phase ended.
#[derive(Debug)]
pub enum Setup {
    Ready(Box<Ready>),
    /// The run ends before the agent: the reason, with the end of the
    /// setup's output when it ran.
    Failed(String),
    /// The run was asked to stop while setup ran: setup was killed.
    Stopped,
}

fn git_err(e: impl std::fmt::Display) -> RunError {
    SetupError::Host(e.to_string())
}

fn io_err(doing: &str, path: &Path, e: std::io::Error) -> RunError {
    SetupError::Host(format!("{doing} {}: {e}", path.display()))
}

/// The repository's canonical path, as the cache is keyed by.
pub fn repository_name(repo: &Path) -> String {
    repo.canonicalize()
        .unwrap_or_else(|_| repo.to_path_buf())
        .display()
        .to_string()
}

/// Every published entry under `root` (`STATE/setup`), all repositories.
/// An entry whose `meta.json` is missing or unreadable is left out.
pub fn entries(root: &Path) -> Vec<(PathBuf, CacheEntry)> {
    let mut out = Vec::new();
    let Ok(repos) = std::fs::read_dir(root) else {
        return out;
    };
    for repo in repos.flatten() {
        let Ok(keys) = std::fs::read_dir(repo.path()) else {
            continue;
        };
        for key in keys.flatten() {
            let name = key.file_name();
            if name.to_string_lossy().starts_with('.') {
                continue;
            }
            let meta = key.path().join("meta.json");
            let Ok(text) = read_bounded(&meta, 1 << 20) else {
                continue;
            };
            if let Ok(e) = serde_json::from_str::<CacheEntry>(&text) {
                out.push((key.path(), e));
            }
        }
    }
    out
}

/// `setup prune`: removes the entries `nightshift_core::setup::prune`
/// names (each renamed aside first, so a run never mounts half of one);
/// the removed entries. A run that already mounted one keeps its mount.
/// Also removes what a supervisor killed mid-setup left behind.
pub fn prune(
    root: &Path,
    keep: Option<usize>,
    older_than: Option<Duration>,
) -> Result<Vec<CacheEntry>, String> {
    let all = entries(root);
    let list: Vec<CacheEntry> = all.iter().map(|(_, e)| e.clone()).collect();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let gone = core_setup::prune(&list, keep, older_than, now);
    // What a supervisor killed mid-setup left: a setup runs at most
    // `MAX_SETUP_TIME`, so a `.tmp-`/`.in-` directory twice that old has no
    // setup writing it.
    let stale = core_setup::MAX_SETUP_TIME * 2;
    for repo in std::fs::read_dir(root).into_iter().flatten().flatten() {
        for left in std::fs::read_dir(repo.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = left.file_name().to_string_lossy().into_owned();
            let old = left
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > stale);
            if (name.starts_with(".tmp-") || name.starts_with(".in-")) && old {
                let p = left.path();
                let _ = orchestrator_git::remove_worktree(&p.join("checkout"));
                std::fs::remove_dir_all(&p).map_err(|err| format!("{}: {err}", p.display()))?;
            }
        }
    }
    let mut removed = Vec::new();
    for (path, e) in all {
        if !gone.contains(&(e.repository.clone(), e.key.clone())) {
            continue;
        }
        let aside = path.with_file_name(format!(".prune-{}", e.key));
        std::fs::rename(&path, &aside).map_err(|err| format!("{}: {err}", path.display()))?;
        std::fs::remove_dir_all(&aside).map_err(|err| format!("{}: {err}", aside.display()))?;
        removed.push(e);
    }
    Ok(removed)
}

fn read_bounded(path: &Path, max: u64) -> std::io::Result<String> {
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(max)
        .read_to_string(&mut text)?;
    Ok(text)
}

/// Whether the engine reports the sandbox's `/cache` mount read-only
/// (`None`: no such mount).
pub fn cache_mount_read_only(inspected: &serde_json::Value) -> Option<bool> {
    inspected["Mounts"]
        .as_array()?
        .iter()
        .find(|m| m["Destination"] == core_setup::CACHE_MOUNT)
        .map(|m| m["RW"] == serde_json::Value::Bool(false))
}

/// Bytes under `root` (files and symlinks as stored, directories as
/// entries), never following a symlink.
pub fn tree_bytes(root: &Path) -> std::io::Result<u64> {
    let mut total = 0u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = entry.path().symlink_metadata()?;
            total = total.saturating_add(meta.len());
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Ok(total)
}

/// Hex sha256 over every path (sorted), its kind, mode and content (a
/// symlink's target) under `root`.
pub fn tree_digest(root: &Path) -> std::io::Result<String> {
    use sha2::{Digest as _, Sha256};
    let mut paths = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in std::fs::read_dir(root.join(&rel))? {
            let entry = entry?;
            let r = rel.join(entry.file_name());
            if entry.path().symlink_metadata()?.is_dir() {
                stack.push(r.clone());
            }
            paths.push(r);
        }
    }
    paths.sort();
    let mut h = Sha256::new();
    for rel in paths {
        let path = root.join(&rel);
        let meta = path.symlink_metadata()?;
        let name = rel.to_string_lossy();
        h.update((name.len() as u64).to_be_bytes());
        h.update(name.as_bytes());
        h.update((meta.mode() & 0o170777).to_be_bytes());
        if meta.is_file() {
            let mut f = std::fs::File::open(&path)?;
            h.update(meta.len().to_be_bytes());
            std::io::copy(&mut f, &mut h)?;
        } else if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&path)?;
            let t = target.to_string_lossy();
            h.update((t.len() as u64).to_be_bytes());
            h.update(t.as_bytes());
        }
    }
    Ok(hex::encode(h.finalize()))
}

/// Gives everything under `root` to `uid:gid` without following a symlink,
/// and takes write permission from group and others.
fn give_back(root: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        std::os::unix::fs::lchown(&dir, Some(uid), Some(gid))?;
        let mode = dir.symlink_metadata()?.mode();
        std::fs::set_permissions(
            &dir,
            std::fs::Permissions::from_mode((mode & 0o755) | 0o755),
        )?;
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            let meta = path.symlink_metadata()?;
            std::os::unix::fs::lchown(&path, Some(uid), Some(gid))?;
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() {
                std::fs::set_permissions(
                    &path,
                    std::fs::Permissions::from_mode(meta.mode() & 0o755),
                )?;
            }
        }
    }
    Ok(())
}

/// Checks a credential file (regular, the supervisor's user's, not open to
/// group or others) and copies it into `dir` for `uid:gid`, read-only.
fn stage_credential(file: &Path, dir: &Path, uid: u32, gid: u32) -> Result<PathBuf, String> {
    let named = |why: String| format!("setup credential {}: {why}", file.display());
    let handle = std::fs::File::open(file).map_err(|e| named(e.to_string()))?;
    let meta = handle.metadata().map_err(|e| named(e.to_string()))?;
    // The one rule for secret files (`nightshift_core::secret_file`).
    if let Some(problem) = nightshift_core::secret_file::problem_of(&meta) {
        return Err(named(problem.to_string()));
    }
    if meta.len() > 1 << 20 {
        return Err(named("over 1 MiB".into()));
    }
    let name = file
        .file_name()
        .ok_or_else(|| named("no file name".into()))?;
    let copy = dir.join(name);
    let mut bytes = Vec::new();
    handle
        .take(1 << 20)
        .read_to_end(&mut bytes)
        .map_err(|e| named(e.to_string()))?;
    std::fs::write(&copy, bytes).map_err(|e| named(e.to_string()))?;
    std::os::unix::fs::lchown(&copy, Some(uid), Some(gid)).map_err(|e| named(e.to_string()))?;
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o400))
        .map_err(|e| named(e.to_string()))?;
    Ok(copy)
}

/// The host's CA bundle, when it has one (`SSL_CERT_FILE`, else Debian's).
fn host_ca_bundle() -> Option<PathBuf> {
    std::env::var_os("SSL_CERT_FILE")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from("/etc/ssl/certs/ca-certificates.crt")])
        .find(|p| p.is_file())
}

/// The setup phase of run `id` on `base_commit`: a cache to mount, or why
/// the run ends before the agent. Audited as one `setup` entry.
pub async fn prepare<E: ContainerEngine>(
    sup: &Ctx<'_, E>,
    id: &str,
    req: &Order<'_>,
    plan: &SetupPlan,
    base_commit: &str,
    image_id: &str,
) -> Result<Setup, RunError> {
    let started = Instant::now();
    let paths = sup.paths.clone();
    let repository = repository_name(req.repo);
    let root = paths.setup();
    nightshift_core::state_store::create_private_dir(&root)?;
    let repo_dir = root.join(core_setup::repository_id(&repository));
    nightshift_core::state_store::create_private_dir(&repo_dir)?;
    let script = plan.command.script().to_string();
    let command_digest = digest(script.as_bytes());
    let known: Vec<CacheEntry> = entries(&root).into_iter().map(|(_, e)| e).collect();

    let (repo, commit) = (req.repo.to_path_buf(), base_commit.to_string());
    let reaches =
        tokio::task::spawn_blocking(move || orchestrator_git::owner_reaches(&repo, &commit))
            .await
            .map_err(git_err)?
            .map_err(git_err)?;
    let agent_written = core_setup::is_agent_ref(req.base_ref) || !reaches;
    let audit = |outcome: &str, entry: Option<&CacheEntry>, extra: Extra| {
        (sup.audit)(Event::Setup {
            outcome: outcome.to_string(),
            repository: repository.clone(),
            command: plan.command.describe(),
            key: entry.map(|e| e.key.clone()),
            digest: entry.map(|e| e.digest.clone()),
            bytes: entry.map(|e| e.bytes),
            commit: entry
                .map(|e| e.commit.clone())
                .or(Some(base_commit.to_string())),
            trusted: entry.map(|e| e.trusted),
            container: extra.container,
            exit_code: extra.exit_code,
            duration_ms: Some(started.elapsed().as_millis() as i64),
            output_bytes: extra.output_bytes,
        })
    };
    let ready = |entry: CacheEntry, outcome: &'static str| {
        let path = repo_dir.join(&entry.key);
        Setup::Ready(Box::new(Ready {
            entry,
            path,
            outcome,
            lockfiles: plan.lockfiles.clone(),
        }))
    };
    match core_setup::tree_for_setup(
        &repository,
        req.base_ref,
        agent_written,
        plan.allow_agent_refs,
        &command_digest,
        image_id,
        &known,
    ) {
        TreeDecision::Refuse(why) => {
            audit("refused", None, Extra::default())?;
            return Ok(Setup::Failed(format!("setup refused: {why}")));
        }
        TreeDecision::LastTrusted(entry) => {
            audit("last-trusted", Some(&entry), Extra::default())?;
            tracing::info!(key = %entry.key, "setup skipped: the base is agent-written; the repository's last trusted cache is used");
            return Ok(ready(*entry, "last-trusted"));
        }
        TreeDecision::Base => {}
    }

    // The key: the command, the image, the lockfiles at the base.
    let (repo, commit, patterns) = (
        req.repo.to_path_buf(),
        base_commit.to_string(),
        plan.lockfiles.clone(),
    );
    let found = tokio::task::spawn_blocking(move || {
        orchestrator_git::lockfiles_at(
            &repo,
            &commit,
            &|p| core_setup::is_lockfile(&patterns, p),
            core_setup::MAX_LOCKFILE_BYTES,
        )
    })
    .await
    .map_err(git_err)?
    .map_err(git_err)?;
    let lockfiles: Vec<Lockfile> = found
        .iter()
        .map(|(path, bytes)| Lockfile {
            path: path.clone(),
            digest: digest(bytes),
        })
        .collect();
    let key = core_setup::cache_key(&script, req.image, image_id, &lockfiles);
    if let Some(entry) = core_setup::find(&repository, &key, &known) {
        audit("reused", Some(entry), Extra::default())?;
        tracing::info!(key = %key, "setup skipped: the cache for this key exists");
        return Ok(ready(entry.clone(), "reused"));
    }

    // Build: a checkout of the base, a fresh directory, the container.
    let user = sup.sandbox_user;
    let tmp = repo_dir.join(format!(".tmp-{id}"));
    let staging = repo_dir.join(format!(".in-{id}"));
    let checkout = staging.join("checkout");
    let creds = staging.join("credentials");
    let cleanup = |tmp_too: bool| {
        let _ = orchestrator_git::remove_worktree(&checkout);
        let _ = std::fs::remove_dir_all(&staging);
        if tmp_too {
            let _ = std::fs::remove_dir_all(&tmp);
        }
    };
    cleanup(true);
    let made = (|| -> Result<Vec<PathBuf>, RunError> {
        std::fs::create_dir(&staging).map_err(|e| io_err("creating", &staging, e))?;
        std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| io_err("setting the mode of", &staging, e))?;
        std::fs::create_dir(&tmp).map_err(|e| io_err("creating", &tmp, e))?;
        std::os::unix::fs::lchown(&tmp, Some(user.uid), Some(user.gid))
            .map_err(|e| io_err("giving the setup", &tmp, e))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io_err("setting the mode of", &tmp, e))?;
        let mut staged = Vec::new();
        if !plan.credentials.is_empty() {
            std::fs::create_dir(&creds).map_err(|e| io_err("creating", &creds, e))?;
            for c in &plan.credentials {
                staged.push(
                    stage_credential(c, &creds, user.uid, user.gid)
                        .map_err(SetupError::BadInput)?,
                );
            }
        }
        Ok(staged)
    })();
    let staged = match made {
        Ok(s) => s,
        Err(e) => {
            cleanup(true);
            return Err(e);
        }
    };
    let wt = orchestrator_git::WorktreeSpec {
        host_repo: req.repo.to_path_buf(),
        base_commit: base_commit.to_string(),
        run_id: id.to_string(),
        dest: checkout.clone(),
        owner: None,
        history_cache: None,
    };
    if let Err(e) = tokio::task::spawn_blocking(move || orchestrator_git::create_worktree(&wt))
        .await
        .map_err(git_err)
        .and_then(|r| r.map_err(git_err))
    {
        cleanup(true);
        return Err(e);
    }
    let mut spec = core_setup::SetupSpec::new(
        id,
        sup.state_tag,
        sup.identity,
        req.image,
        &script,
        checkout.clone(),
        tmp.clone(),
        req.caps,
        user,
    )
    .with_credentials(&staged);
    spec.cgroup_parent = sup.cgroup_parent.clone();
    if let Some(ca) = host_ca_bundle() {
        spec = spec.with_ca_bundle(ca);
    }
    let ran = run_container(
        sup,
        id,
        &spec,
        req.caps.timeout.min(core_setup::MAX_SETUP_TIME),
    )
    .await;
    cleanup(false);
    let (container, code, output_bytes, ended) = match ran {
        Ok(r) => r,
        Err(e) => {
            cleanup(true);
            return Err(e);
        }
    };
    let extra = || Extra {
        container: Some(container.clone()),
        exit_code: Some(code),
        output_bytes: Some(output_bytes),
    };
    let log = paths.run_dir(id).join("setup.log");
    let tail = || {
        let text = read_tail(&log, core_setup::REASON_TAIL as u64 * 4);
        let t = core_setup::reason_tail(text.trim_end()).to_string();
        if t.is_empty() {
            "(no output)".to_string()
        } else {
            t
        }
    };
    if ended == Ended::Stopped {
        cleanup(true);
        audit("interrupted", None, extra())?;
        return Ok(Setup::Stopped);
    }
    if ended == Ended::TimedOut || code != 0 {
        cleanup(true);
        audit("failed", None, extra())?;
        let why = match ended {
            Ended::TimedOut => format!(
                "it ran past its {}s bound and was killed",
                req.caps.timeout.min(core_setup::MAX_SETUP_TIME).as_secs()
            ),
            _ => format!("it exited {code}"),
        };
        return Ok(Setup::Failed(format!(
            "setup failed ({}): {why}, before the agent started; its output is in {} and ends: {}",
            plan.command.describe(),
            log.display(),
            tail()
        )));
    }
    let bytes = tree_bytes(&tmp).map_err(|e| io_err("measuring", &tmp, e))?;
    if bytes > plan.max_bytes {
        cleanup(true);
        audit("failed", None, extra())?;
        return Ok(Setup::Failed(format!(
            "setup failed ({}): its cache is {bytes} bytes, over max_bytes ({}); it was deleted before the agent started",
            plan.command.describe(),
            plan.max_bytes
        )));
    }
    let (uid, gid) = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    if let Err(e) = give_back(&tmp, uid, gid) {
        cleanup(true);
        return Err(io_err("taking back", &tmp, e));
    }
    let entry_digest = match tree_digest(&tmp) {
        Ok(d) => d,
        Err(e) => {
            cleanup(true);
            return Err(io_err("digesting", &tmp, e));
        }
    };
    let now = time::OffsetDateTime::now_utc();
    let entry = CacheEntry {
        repository: repository.clone(),
        key: key.clone(),
        command_digest,
        image: req.image.to_string(),
        image_id: image_id.to_string(),
        commit: base_commit.to_string(),
        trusted: !agent_written,
        created_at: now_rfc3339(),
        created_unix: now.unix_timestamp(),
        bytes,
        digest: entry_digest,
        lockfiles,
        env: plan.command.offline_env(),
    };
    let meta = tmp.join("meta.json");
    let written = serde_json::to_vec_pretty(&entry)
        .map_err(std::io::Error::other)
        .and_then(|b| std::fs::write(&meta, b));
    if let Err(e) = written {
        cleanup(true);
        return Err(io_err("writing", &meta, e));
    }
    let dest = repo_dir.join(&key);
    match std::fs::rename(&tmp, &dest) {
        Ok(()) => {
            audit("built", Some(&entry), extra())?;
            Ok(ready(entry, "built"))
        }
        Err(_) if dest.join("meta.json").is_file() => {
            // Another run published the same key meanwhile: the same inputs.
            cleanup(true);
            let existing: CacheEntry = read_bounded(&dest.join("meta.json"), 1 << 20)
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .ok_or_else(|| SetupError::Host(format!("reading {}", dest.display())))?;
            audit("reused", Some(&existing), extra())?;
            Ok(ready(existing, "reused"))
        }
        Err(e) => {
            cleanup(true);
            Err(io_err("publishing", &dest, e))
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Exited,
    TimedOut,
    Stopped,
}

#[derive(Default)]
struct Extra {
    container: Option<String>,
    exit_code: Option<i64>,
    output_bytes: Option<u64>,
}

fn read_tail(path: &Path, max: u64) -> String {
    use std::io::{Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
    let mut bytes = Vec::new();
    let _ = f.take(max).read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Creates, starts and waits for the setup container; its output (bounded)
/// into `STATE/runs/<id>/setup.log`. The container is removed here (and by
/// the run's ending, which removes every container of the run, if this is
/// cut short). Returns (container, exit code, output bytes, how it ended).
async fn run_container<E: ContainerEngine>(
    sup: &Ctx<'_, E>,
    id: &str,
    spec: &core_setup::SetupSpec,
    bound: Duration,
) -> Result<(String, i64, u64, Ended), RunError> {
    let container = sup.engine.create_setup(spec).await?;
    // Judged by what the engine made, before it starts.
    let inspected = sup.engine.inspect_json(&container).await?;
    if let Err(why) = core_setup::check_setup_container(&inspected, spec) {
        let _ = sup.engine.remove_confirmed(&container).await;
        return Err(SetupError::Host(format!(
            "the setup container {container} is not what was asked for: {why}; it was removed before it started"
        )));
    }
    let log_path = sup.paths.run_dir(id).join("setup.log");
    let mut log = tokio::fs::File::create(&log_path)
        .await
        .map_err(|e| io_err("creating", &log_path, e))?;
    let mut output = sup.engine.attach(&container).await?;
    sup.engine.start(&container).await?;
    let drain = async {
        let (mut seen, mut kept) = (0u64, 0u64);
        while let Some(Ok(chunk)) = output.next().await {
            let bytes = match &chunk {
                Output::Stdout(b) | Output::Stderr(b) => b,
            };
            seen += bytes.len() as u64;
            let take = (bytes.len() as u64).min(core_setup::MAX_SETUP_OUTPUT.saturating_sub(kept));
            if take > 0 {
                let _ = log.write_all(&bytes[..take as usize]).await;
                kept += take;
            }
        }
        let _ = log.flush().await;
        seen
    };
    let waited = async {
        let (code, seen) = tokio::join!(sup.engine.wait(&container), drain);
        (code, seen)
    };
    // A stop asked of the run (a signal, a lost claim) ends the setup too.
    let asked_to_stop = async {
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            if (sup.stopped)() {
                break;
            }
        }
    };
    let (code, seen, ended) = tokio::select! {
        r = tokio::time::timeout(bound, waited) => match r {
            Ok((code, seen)) => (code?, seen, Ended::Exited),
            Err(_) => {
                let _ = sup.engine.kill(&container).await;
                (-1, 0, Ended::TimedOut)
            }
        },
        _ = asked_to_stop => {
            let _ = sup.engine.kill(&container).await;
            (-1, 0, Ended::Stopped)
        }
    };
    sup.engine.remove_confirmed(&container).await?;
    (sup.audit)(Event::ContainerRemoved {
        container: container.clone(),
    })?;
    Ok((container, code, seen, ended))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_follows_content_names_and_modes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("a")).unwrap();
        std::fs::write(root.join("a/f"), b"one").unwrap();
        let first = tree_digest(root).unwrap();
        assert_eq!(first, tree_digest(root).unwrap());
        std::fs::write(root.join("a/f"), b"two").unwrap();
        let second = tree_digest(root).unwrap();
        assert_ne!(first, second);
        std::fs::set_permissions(root.join("a/f"), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_ne!(second, tree_digest(root).unwrap());
        assert!(tree_bytes(root).unwrap() >= 3);
    }

    #[test]
    fn a_credential_open_to_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("token");
        std::fs::write(&f, b"secret").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        let me = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        let e = stage_credential(&f, &out, me.0, me.1).unwrap_err();
        assert!(e.contains("make it 0600"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let copy = stage_credential(&f, &out, me.0, me.1).unwrap();
        assert_eq!(std::fs::read(&copy).unwrap(), b"secret");
        assert_eq!(copy.metadata().unwrap().mode() & 0o777, 0o400);
    }

    #[test]
    fn prune_removes_what_a_killed_setup_left_but_not_a_running_one() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("r");
        for d in [".tmp-old", ".in-old", ".tmp-new"] {
            std::fs::create_dir_all(repo.join(d).join("x")).unwrap();
        }
        let hours_ago = std::time::SystemTime::now() - Duration::from_secs(2 * 3600);
        for d in [".tmp-old", ".in-old"] {
            std::fs::File::open(repo.join(d))
                .unwrap()
                .set_modified(hours_ago)
                .unwrap();
        }
        assert!(prune(dir.path(), Some(1), None).unwrap().is_empty());
        assert!(!repo.join(".tmp-old").exists() && !repo.join(".in-old").exists());
        assert!(repo.join(".tmp-new").exists(), "a setup may still write it");
    }

    #[test]
    fn only_a_read_only_cache_mount_counts_as_read_only() {
        let doc = |rw: bool| serde_json::json!({"Mounts": [{"Destination": "/cache", "RW": rw}]});
        assert_eq!(cache_mount_read_only(&doc(false)), Some(true));
        assert_eq!(cache_mount_read_only(&doc(true)), Some(false));
        assert_eq!(
            cache_mount_read_only(&serde_json::json!({"Mounts": []})),
            None
        );
    }
}
