//! `nightshift run`: one run in the foreground, from what the command line
//! asked ([`RunOrder`]) to the run's record.
//!
//! It goes in three steps, so that the binary can parse `--agent` and
//! `--model` (a usage error, exit 2) where it always did: [`prepare`] (the
//! configuration, the task's text, the caps after the configuration's
//! defaults, checked against the fleet's), then [`Prepared::with_agent`]
//! (the preset's image and command, the repository checked for what the
//! preset's agent would load), then [`run`] (the lifecycle, [`perform`]).
//!
//! Invariants:
//! - A freeze refuses a new run before the engine is asked anything, so it
//!   holds with the engine down too; `run::execute` checks it again.
//! - Before the run: the sandboxes left by a supervisor that vanished are
//!   settled (a failure is a warning), the run passes the fleet's process
//!   admission as a queued task does (`run_queue::admit_pids`), and this
//!   process's dead man's switch is started.
//! - The run is a task of the run queue, as a queued one is: added
//!   `starting` under this process's own lease before the run begins, its
//!   lease renewed while it runs, settled from the run's record when it
//!   ends; a run killed with `kill -9` leaves the task to the next
//!   dispatcher, which takes it over once the lease lapses and settles it
//!   from the run (`tests/tests/run_queue.rs::a_foreground_run_is_a_task_and_a_killed_one_is_settled_by_a_dispatcher`).
//!   A run started by a dispatcher (`of_task`) is that dispatcher's task.
//! - SIGINT and SIGTERM are the run's to handle from then on: the run ends
//!   `interrupted` (audited, sandbox removed, work imported) and the error
//!   says which signal, whose exit code is 130 or 143.

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use nightshift_core::config::Config;
use nightshift_core::sandbox::Caps;
use nightshift_core::state_store::RunRecord;
use nightshift_engine_docker::image::{Agent, ImageSpec, Toolchain};

use super::Warn;
use crate::agents::Preset;
use crate::api::{Api, ApiError, ErrorKind};
use crate::run::{RunError, RunRequest, Stop};

/// One run as the command line asks for it (`nightshift run`'s flags).
#[derive(Debug, Clone, Default)]
pub struct RunOrder {
    /// The repository to work on.
    pub repo: PathBuf,
    /// The base ref (branch, tag or commit).
    pub base_ref: String,
    /// The image; else the preset's, else the default image.
    pub image: Option<String>,
    /// The task text given to the agent; it wins over `task_file`.
    pub task: Option<String>,
    /// A file to read the task text from.
    pub task_file: Option<PathBuf>,
    /// Caps asked for; those left out are the configuration's.
    pub caps: CapsAsked,
    /// Echo the agent's output.
    pub echo: bool,
    /// A dry run (see `RunRequest::dry_run`).
    pub dry_run: bool,
    /// The agent command and its arguments (a preset replaces it).
    pub command: Vec<String>,
    /// Started by a dispatcher as one of its tasks (`tasks run`'s child):
    /// the task is the dispatcher's, so this run makes none of its own.
    pub of_task: bool,
    /// Toolchains (`--with`): the run's image is the default or the
    /// preset's image with them (`image build --with`), unless `image` is set.
    pub with: Vec<Toolchain>,
    /// `--setup PRESET|COMMAND`: this run's setup phase, over the
    /// configuration's `[[setup]]` command for the repository (its other
    /// settings kept).
    pub setup: Option<String>,
    /// The capped run this run continues (a dispatcher's child for a
    /// continuation task: `--continues`).
    pub continues: Option<String>,
}

/// The caps one run asks for.
#[derive(Debug, Clone, Copy, Default)]
pub struct CapsAsked {
    pub memory_bytes: Option<u64>,
    pub cpus: Option<f64>,
    pub pids: Option<u64>,
    pub timeout: Option<Duration>,
    pub max_output_bytes: Option<u64>,
    pub max_worktree_bytes: Option<u64>,
    pub max_files: Option<u64>,
    pub max_tokens: Option<u64>,
}

/// A run checked against the configuration, ready to start.
#[derive(Debug, Clone)]
pub struct Prepared {
    config: Config,
    order: RunOrder,
    task: String,
    caps: Caps,
    preset_image: Option<String>,
    agent: Option<Agent>,
}

/// The configuration (the act queue gets its lifetimes and bounds from
/// it), the task's text, and the caps after the configuration's defaults,
/// which no run may ask beyond the whole fleet's.
pub fn prepare(api: &Api, order: RunOrder) -> Result<Prepared, ApiError> {
    let config = api.load_config()?;
    // The door queues acts with this run's configuration's lifetimes.
    crate::acts::use_queue_ttls(config.queue_ttls());
    crate::acts::use_queue_bounds(config.queue_bounds());
    let task = match (&order.task, &order.task_file) {
        (Some(t), _) => t.clone(),
        (None, Some(f)) => {
            let mut text = String::new();
            std::fs::File::open(f)
                .and_then(|mut h| h.read_to_string(&mut text))
                .map_err(|e| {
                    ApiError::caused(ErrorKind::BadInput, e)
                        .doing(format!("reading the task file {}", f.display()))
                })?;
            text
        }
        (None, None) => String::new(),
    };
    let caps = caps(&config, &order.caps)?;
    if let Some(s) = &order.setup {
        nightshift_core::setup::SetupCommand::parse(s)
            .map_err(|e| ApiError::new(ErrorKind::BadInput, e))?;
    }
    Ok(Prepared {
        config,
        order,
        task,
        caps,
        preset_image: None,
        agent: None,
    })
}

/// `asked` after the configuration's defaults, within the fleet's.
fn caps(config: &Config, asked: &CapsAsked) -> Result<Caps, ApiError> {
    let defaults = config.caps();
    let fleet = config.fleet();
    if let Some(cpus) = asked.cpus {
        if !(cpus > 0.0 && cpus <= fleet.cpus) {
            return Err(ApiError::new(
                ErrorKind::BadInput,
                format!(
                    "--cpus {cpus} must be above 0 and at most the fleet's {} cpus",
                    fleet.cpus
                ),
            ));
        }
    }
    let caps = Caps {
        memory_bytes: asked
            .memory_bytes
            .map(|v| v as i64)
            .unwrap_or(defaults.memory_bytes),
        nano_cpus: asked
            .cpus
            .map(|v| (v * 1e9) as i64)
            .unwrap_or(defaults.nano_cpus),
        pids: asked.pids.map(|v| v as i64).unwrap_or(defaults.pids),
        open_files: asked
            .max_files
            .map(|v| v as i64)
            .unwrap_or(defaults.open_files),
        timeout: asked.timeout.unwrap_or(defaults.timeout),
        max_output_bytes: asked.max_output_bytes.unwrap_or(defaults.max_output_bytes),
        max_worktree_bytes: asked
            .max_worktree_bytes
            .unwrap_or(defaults.max_worktree_bytes),
        tmpfs_bytes: defaults.tmpfs_bytes,
        lease: defaults.lease,
        max_tokens: asked.max_tokens.unwrap_or(defaults.max_tokens),
        fleet_max_tokens_per_night: defaults.fleet_max_tokens_per_night,
    };
    // No run asks for more than the whole fleet (see `run_queue::within_fleet`).
    let need = crate::run_queue::Need {
        memory_bytes: caps.memory_bytes.max(0) as u64,
        milli_cpus: (caps.nano_cpus.max(0) / 1_000_000) as u64,
        pids: caps.pids.max(0) as u64,
    };
    crate::run_queue::within_fleet(need, crate::run_queue::fleet_need(config))
        .map_err(|e| ApiError::new(ErrorKind::BadInput, e))?;
    Ok(caps)
}

impl Prepared {
    /// The run of `agent`'s preset: its image (unless one was asked for)
    /// and its command, refused when the repository's base holds what the
    /// preset's agent would load as its own configuration, or when the
    /// agent could reach no model (`agents::check_ready`: no
    /// `models.toml`, no endpoint for its model, an unusable key).
    pub fn with_agent(
        mut self,
        api: &Api,
        agent: Agent,
        model: Option<&str>,
        preset: Preset,
    ) -> Result<Self, ApiError> {
        crate::agents::check_repository(agent, &self.order.repo, &self.order.base_ref)
            .map_err(|e| ApiError::new(ErrorKind::BadInput, e))?;
        crate::agents::check_ready(agent, model, api.root())
            .map_err(|e| ApiError::new(ErrorKind::BadInput, e))?;
        self.preset_image = Some(preset.image);
        self.agent = Some(agent);
        self.order.command = preset.command;
        Ok(self)
    }

    /// The lifecycle's request.
    fn request(self) -> (Config, RunRequest) {
        let order = self.order;
        let preset_image = match order.with.is_empty() {
            true => self.preset_image,
            false => Some(ImageSpec::new(self.agent, &order.with).reference()),
        };
        let configured = self.config.setup_plan(&order.repo);
        let setup = match (&order.setup, configured) {
            (Some(text), configured) => {
                // Checked in `prepare`.
                let command =
                    nightshift_core::setup::SetupCommand::parse(text).unwrap_or_else(|_| {
                        nightshift_core::setup::SetupCommand::Command(text.clone())
                    });
                Some(match configured {
                    Some(plan) => nightshift_core::setup::SetupPlan { command, ..plan },
                    None => nightshift_core::setup::SetupPlan::new(command),
                })
            }
            (None, configured) => configured,
        };
        let req = RunRequest {
            setup,
            repo_confidentiality: self.config.repository_confidentiality(&order.repo),
            repo: order.repo,
            base_ref: order.base_ref,
            image: order
                .image
                .or(preset_image)
                .unwrap_or_else(nightshift_engine_docker::image::default_reference),
            task: self.task,
            command: order.command,
            caps: self.caps,
            echo: order.echo,
            dry_run: order.dry_run,
            continues: order.continues,
        };
        (self.config, req)
    }
}

/// Runs a prepared run in the foreground until it ends.
pub async fn run(api: &Api, prepared: Prepared, warn: Warn<'_>) -> Result<RunRecord, ApiError> {
    let own_task = !prepared.order.of_task;
    let (config, req) = prepared.request();
    perform(api, &config, req, own_task, warn).await
}

/// Runs `req` in this process, under `config`, with this process's
/// supervisor and watchdog and its signals handled (see the module's note).
pub async fn perform(
    api: &Api,
    config: &Config,
    req: RunRequest,
    own_task: bool,
    warn: Warn<'_>,
) -> Result<RunRecord, ApiError> {
    // A freeze refuses a new run before the engine is asked anything.
    if let Ok(set) = nightshift_core::policy::load(&*api.open_state()?, None) {
        if let Some(freeze) = set.freeze() {
            return Err(RunError::Frozen(freeze.reason.clone()).into());
        }
    }
    let sup = api.creating_supervisor(config).await?;
    // Sandboxes left by a supervisor that vanished are settled first.
    if let Err(e) = crate::killswitch::reconcile(&sup, None, "supervisor start").await {
        warn(&format!("reconciling: {e}"));
    }
    // Admission, as for a queued task: the fleet's processes are shared by
    // every sandbox, so this run starts only if they hold room for it.
    let fleet_pids = config.fleet().pids;
    let running = crate::run_queue::running_pids(&sup.engine, &sup.state_tag, fleet_pids)
        .await
        .map_err(|e| ApiError::caused(ErrorKind::Engine, e))?;
    crate::run_queue::admit_pids(req.caps.pids.max(0) as u64, &running, fleet_pids)
        .map_err(|e| ApiError::new(ErrorKind::Denied, e))?;
    super::watchdog::spawn(api.root(), api.config_path(), &sup.identity, warn);
    let (tx, rx) = tokio::sync::watch::channel(None);
    let signals = tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return;
        };
        let stop = tokio::select! {
            _ = int.recv() => Stop::Interrupt,
            _ = term.recv() => Stop::Terminate,
        };
        let _ = tx.send(Some(stop));
    });
    // The run is a task of the queue, as a queued one is (unless it is
    // already one: a dispatcher's child), from before it begins.
    let id = ulid::Ulid::new().to_string().to_lowercase();
    let task = match own_task {
        true => Some(crate::run_queue::begin_foreground(
            api,
            &req,
            &id,
            crate::run_queue::TASK_LEASE_SECS,
        )?),
        false => None,
    };
    let result = crate::run::execute_as(&sup, id, req, rx).await;
    signals.abort();
    let result: Result<RunRecord, ApiError> = result.map_err(Into::into);
    if let Some(task) = task {
        let ended = match &result {
            Ok(record) => Ok(record),
            Err(e) => Err((e.exit_code(), e.to_string())),
        };
        if let Err(e) = task.end(api, ended) {
            warn(&format!("settling the run's task: {e}"));
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn caps_left_out_are_the_configurations_and_asked_ones_win() {
        let config = config("[caps]\nmemory = \"1g\"\npids = 300\n");
        let defaults = config.caps();
        let asked = CapsAsked {
            pids: Some(64),
            max_tokens: Some(1000),
            ..CapsAsked::default()
        };
        let caps = caps(&config, &asked).unwrap();
        assert_eq!(caps.memory_bytes, 1 << 30);
        assert_eq!(caps.pids, 64);
        assert_eq!(caps.max_tokens, 1000);
        assert_eq!(caps.timeout, defaults.timeout);
        assert_eq!(caps.nano_cpus, defaults.nano_cpus);
    }

    #[test]
    fn cpus_are_above_zero_and_within_the_fleets() {
        let config = config("[fleet]\ncpus = 2.0\n");
        for cpus in [0.0, -1.0, 2.5] {
            let asked = CapsAsked {
                cpus: Some(cpus),
                ..CapsAsked::default()
            };
            let e = caps(&config, &asked).unwrap_err();
            assert_eq!(e.kind, ErrorKind::BadInput);
            assert_eq!(
                e.message,
                format!("--cpus {cpus} must be above 0 and at most the fleet's 2 cpus")
            );
        }
        let asked = CapsAsked {
            cpus: Some(2.0),
            ..CapsAsked::default()
        };
        assert_eq!(caps(&config, &asked).unwrap().nano_cpus, 2_000_000_000);
    }

    #[test]
    fn a_run_asking_more_than_the_whole_fleet_is_refused() {
        let config = config("[fleet]\npids = 100\n");
        let asked = CapsAsked {
            pids: Some(101),
            ..CapsAsked::default()
        };
        let e = caps(&config, &asked).unwrap_err();
        assert_eq!(e.kind, ErrorKind::BadInput, "{e}");
        let asked = CapsAsked {
            pids: Some(100),
            ..CapsAsked::default()
        };
        assert!(caps(&config, &asked).is_ok());
    }

    #[test]
    fn the_task_text_wins_over_its_file_and_an_unreadable_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let api = Api::new(
            std::sync::Arc::new(nightshift_store_sqlite::store::SqliteBackend::new(
                dir.path().join("state"),
                None,
            )),
            None,
        );
        let file = dir.path().join("task.txt");
        std::fs::write(&file, "from the file").unwrap();
        let order = |task: Option<&str>, task_file: PathBuf| RunOrder {
            repo: dir.path().join("repo"),
            base_ref: "HEAD".into(),
            task: task.map(str::to_string),
            task_file: Some(task_file),
            command: vec!["true".into()],
            ..RunOrder::default()
        };
        let (_, req) = prepare(&api, order(Some("given"), file.clone()))
            .unwrap()
            .request();
        assert_eq!(req.task, "given");
        let (_, req) = prepare(&api, order(None, file)).unwrap().request();
        assert_eq!(req.task, "from the file");
        assert_eq!(
            req.image,
            nightshift_engine_docker::image::default_reference()
        );
        let missing = dir.path().join("missing.txt");
        let e = prepare(&api, order(None, missing.clone())).unwrap_err();
        assert_eq!(e.kind, ErrorKind::BadInput);
        assert!(
            e.message
                .starts_with(&format!("reading the task file {}: ", missing.display())),
            "{e}"
        );
    }

    /// `--with` picks the image holding the toolchains over the default
    /// image or the preset's; `--image` wins over it.
    #[test]
    fn with_toolchains_picks_their_image_over_the_default_or_the_presets() {
        let dir = tempfile::tempdir().unwrap();
        let api = Api::new(
            std::sync::Arc::new(nightshift_store_sqlite::store::SqliteBackend::new(
                dir.path().join("state"),
                None,
            )),
            None,
        );
        let order = |with: Vec<Toolchain>, image: Option<&str>| RunOrder {
            repo: dir.path().join("repo"),
            base_ref: "HEAD".into(),
            command: vec!["true".into()],
            with,
            image: image.map(str::to_string),
            ..RunOrder::default()
        };
        let (_, req) = prepare(&api, order(vec![Toolchain::Rust], None))
            .unwrap()
            .request();
        assert_eq!(
            req.image,
            ImageSpec::new(None, &[Toolchain::Rust]).reference()
        );
        assert!(req.image.starts_with("nightshift-sandbox-with-rust:"));
        let mut prepared = prepare(&api, order(vec![Toolchain::Python], None)).unwrap();
        prepared.preset_image = Some(Agent::Codex.reference());
        prepared.agent = Some(Agent::Codex);
        let (_, req) = prepared.request();
        assert!(
            req.image.starts_with("nightshift-agent-codex-with-python:"),
            "{}",
            req.image
        );
        let (_, req) = prepare(&api, order(vec![Toolchain::Rust], Some("mine:1")))
            .unwrap()
            .request();
        assert_eq!(req.image, "mine:1");
    }
}
