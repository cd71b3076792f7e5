//! `nightshift`: the command line. It parses, opens the state, calls the
//! library, prints, and maps errors to the documented exit codes.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::{Parser, Subcommand};
use orchestrator::engine::{Engine, EngineError};
use orchestrator::exit;
use orchestrator::run::{self, RunError, RunRequest, Stop, Supervisor};
use orchestrator::sandbox::Caps;
use orchestrator::store::{RunRecord, StatePaths, Store, StoreError};
use orchestrator::terminal;
use orchestrator::{demo, image};

// Everything a command prints goes through `orchestrator::terminal` (its
// note says why): agent-made values through `line` / `block` first.
macro_rules! outln {
    () => { orchestrator::terminal::out(format_args!("\n")) };
    ($($t:tt)*) => { orchestrator::terminal::out(format_args!("{}\n", format_args!($($t)*))) };
}
macro_rules! out {
    ($($t:tt)*) => { orchestrator::terminal::out(format_args!($($t)*)) };
}
macro_rules! errln {
    ($($t:tt)*) => { orchestrator::terminal::err(format_args!("{}\n", format_args!($($t)*))) };
}

#[derive(Debug, Parser)]
#[command(
    name = "nightshift",
    version,
    about = "Runs coding agents overnight in Tier 0 sandboxes"
)]
struct Cli {
    /// Where this state lives (database, audit checkpoints, worktrees).
    #[arg(long, global = true, env = "NIGHTSHIFT_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// The configuration file (default: STATE/config.toml).
    #[arg(long, global = true, env = "NIGHTSHIFT_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The default sandbox image.
    Image {
        #[command(subcommand)]
        command: ImageCommand,
    },
    /// One run in the foreground.
    Run(RunArgs),
    /// List runs.
    Runs {
        #[arg(long)]
        json: bool,
    },
    /// One run: attestation, observed state, audit head.
    Show {
        run: String,
        #[arg(long)]
        json: bool,
    },
    /// The audit chain.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Make a demo repository and run a scripted agent on it in a real sandbox.
    Demo,
    /// The owner's credential.
    Owner {
        #[command(subcommand)]
        command: OwnerCommand,
    },
    /// Rules: the harness hook, listing, declaring, proposing, ratifying, retiring.
    Policy(PolicyArgs),
    /// Refuse every new run and every door until `thaw`.
    Freeze {
        /// Shown to everyone refused while frozen.
        #[arg(long, default_value = "frozen by the operator")]
        why: String,
    },
    /// Stop one run, or every run of this state, at once (SIGKILL through the engine).
    Kill {
        run: Option<String>,
        #[arg(long, conflicts_with = "run")]
        all: bool,
        /// Also freeze: no new run starts until `thaw`.
        #[arg(long, requires = "all")]
        freeze: bool,
    },
    /// The deferred queue: acts waiting for a person, pending first, grouped by run.
    Queue {
        #[command(subcommand)]
        command: Option<QueueCommand>,
        #[arg(long)]
        json: bool,
    },
    /// Approve acts (needs the owner's credential); each is re-checked and carried out at once.
    Approve {
        #[arg(required = true)]
        acts: Vec<String>,
        #[arg(long, env = "NIGHTSHIFT_OWNER_KEY_FILE")]
        owner_key_file: Option<PathBuf>,
    },
    /// Re-bind stale acts to their destination as it is now (owner): each
    /// becomes a new pending act with the same content, to approve again.
    Rebind {
        #[arg(required = true)]
        acts: Vec<String>,
        #[arg(long, env = "NIGHTSHIFT_OWNER_KEY_FILE")]
        owner_key_file: Option<PathBuf>,
    },
    /// Reject acts (needs the owner's credential).
    Reject {
        #[arg(required = true)]
        acts: Vec<String>,
        #[arg(long)]
        why: String,
        #[arg(long, env = "NIGHTSHIFT_OWNER_KEY_FILE")]
        owner_key_file: Option<PathBuf>,
    },
    /// (internal) The dead man's switch for one supervisor process.
    #[command(hide = true)]
    Watchdog {
        #[arg(long)]
        supervisor: String,
    },
    /// Find sandboxes and runs whose supervisor vanished, and settle them.
    Reconcile,
    /// Retry the import of a run whose import failed (its worktree was kept).
    Import { run: String },
    /// End a freeze (needs the owner's credential).
    Thaw {
        #[arg(long, env = "NIGHTSHIFT_OWNER_KEY_FILE")]
        owner_key_file: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum QueueCommand {
    /// One act in full: its diff or its content (as plain text).
    Show { act: String },
}

#[derive(Debug, Subcommand)]
enum OwnerCommand {
    /// Make the owner's key (once per state) and print where it is.
    Init,
}

#[derive(Debug, clap::Args)]
struct PolicyArgs {
    /// Use the rule files in DIR in place of the configured ones.
    #[arg(long, global = true)]
    rules: Option<PathBuf>,
    #[command(subcommand)]
    command: PolicyCommand,
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// The harness hook: exit 0 (nothing printed) when allowed, exit 2 with the reason otherwise.
    Check(CheckArgs),
    /// Print the whole decision for a request.
    Explain(CheckArgs),
    /// The rules in force, pending proposals, the freeze and the generation.
    List {
        #[arg(long)]
        json: bool,
        /// Also say which rules bind this actor's tool calls (the hook's `--actor`).
        #[arg(long)]
        actor: Option<String>,
    },
    /// Declare the rules of FILE: as an agent (tier 1: tighten-only, on itself) or as the owner.
    Declare {
        file: PathBuf,
        #[arg(long)]
        actor: Option<String>,
        #[arg(long, env = "NIGHTSHIFT_OWNER_KEY_FILE")]
        owner_key_file: Option<PathBuf>,
    },
    /// Propose the rules of FILE to the owner (inert until ratified).
    Propose {
        /// A rule file whose [[rule]] tables to propose.
        #[arg(required_unless_present = "retire")]
        file: Option<PathBuf>,
        #[arg(long)]
        actor: String,
        /// Propose retiring this rule instead (needs --why).
        #[arg(long, requires = "why", conflicts_with = "file")]
        retire: Option<String>,
        #[arg(long)]
        why: Option<String>,
    },
    /// Unlock a rule (the owner's credential), so that it can be retired.
    Unlock {
        rule: String,
        #[arg(long, env = "NIGHTSHIFT_OWNER_KEY_FILE")]
        owner_key_file: Option<PathBuf>,
    },
    /// Adopt a proposal (needs the owner's credential); the rule is locked.
    Ratify {
        proposal: String,
        #[arg(long, env = "NIGHTSHIFT_OWNER_KEY_FILE")]
        owner_key_file: Option<PathBuf>,
    },
    /// Retire a rule: as an agent (its own tier-1 rules) or as the owner.
    Retire {
        rule: String,
        #[arg(long)]
        why: String,
        #[arg(long)]
        actor: Option<String>,
        #[arg(long, env = "NIGHTSHIFT_OWNER_KEY_FILE")]
        owner_key_file: Option<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
struct CheckArgs {
    #[arg(long)]
    actor: Option<String>,
    /// The tool (door) name; `-` reads it from stdin's `tool_name` (Claude Code's hook input).
    #[arg(long)]
    tool: String,
    /// Where the arguments come from; only `-` (stdin) is supported.
    #[arg(long = "args-json", default_value = "-")]
    args_json: String,
}

#[derive(Debug, Subcommand)]
enum ImageCommand {
    /// Build the default sandbox image locally (no work if it is up to date); print its reference.
    Build {
        /// Debian mirror to take packages from.
        #[arg(long, env = "NIGHTSHIFT_DEBIAN_MIRROR", default_value = image::DEFAULT_MIRROR)]
        mirror: String,
        /// Build an agent image instead: claude-code, codex, mini-swe-agent, aider, python-sdks.
        #[arg(long)]
        agent: Option<String>,
    },
    /// Print the default image's reference (or an agent image's, with --agent).
    Ref {
        #[arg(long)]
        agent: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// Exit 0 when the chain is intact; otherwise exit 1 naming the first bad entry.
    Verify {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The repository to work on.
    #[arg(long)]
    repo: PathBuf,
    /// The base ref (branch, tag or commit).
    #[arg(long = "ref", default_value = "HEAD")]
    base_ref: String,
    /// A local image (default: the built default image).
    #[arg(long)]
    image: Option<String>,
    /// The task text given to the agent.
    #[arg(long, conflicts_with = "task_file")]
    task: Option<String>,
    /// Read the task text from a file.
    #[arg(long)]
    task_file: Option<PathBuf>,
    /// Memory cap (no swap), e.g. 256m, 2g.
    #[arg(long, value_parser = size_arg)]
    memory: Option<u64>,
    /// CPU cap, in cores (e.g. 0.5, 1).
    #[arg(long)]
    cpus: Option<f64>,
    /// Process (and thread) cap.
    #[arg(long)]
    pids: Option<u64>,
    /// Wall-clock cap, e.g. 30s, 10m, 2h.
    #[arg(long, value_parser = span_arg)]
    timeout: Option<std::time::Duration>,
    /// Bytes of output kept; past 4x this the run is killed.
    #[arg(long, value_parser = size_arg)]
    max_output: Option<u64>,
    /// Disk the worktree may use.
    #[arg(long, value_parser = size_arg)]
    max_worktree: Option<u64>,
    /// Open files per process.
    #[arg(long)]
    max_files: Option<u64>,
    #[arg(long)]
    json: bool,
    /// Run a real agent by its preset (claude-code, codex, mini-swe-agent,
    /// aider, python-sdks): its image (`image build --agent`), command line
    /// and environment; see docs/agents.md.
    #[arg(long, conflicts_with = "command")]
    agent: Option<String>,
    /// The model the preset's agent asks the gateway for.
    #[arg(long, requires = "agent")]
    model: Option<String>,
    /// The agent command and its arguments.
    #[arg(last = true, required_unless_present = "agent")]
    command: Vec<String>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("NIGHTSHIFT_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(|| orchestrator::terminal::NetStderr)
        .with_ansi(false)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            errln!("nightshift: starting the async runtime: {e}");
            return ExitCode::from(exit::INTERNAL as u8);
        }
    };
    let code = runtime.block_on(dispatch(cli));
    // Output cut short by anything but a closed pipe is not a success.
    if code == exit::OK && orchestrator::terminal::stdout_failed() {
        return ExitCode::from(exit::INTERNAL as u8);
    }
    ExitCode::from(code as u8)
}

fn state_root(cli: &Cli) -> PathBuf {
    cli.state_dir.clone().unwrap_or_else(|| {
        directories::ProjectDirs::from("", "", "nightshift")
            .map(|d| d.data_dir().to_path_buf())
            .unwrap_or_else(|| PathBuf::from(".nightshift"))
    })
}

fn open_store(root: &std::path::Path) -> Result<Store, i32> {
    Store::open(StatePaths::new(root.to_path_buf())).map_err(|e| {
        errln!("nightshift: {e}");
        exit::STATE
    })
}

async fn connect() -> Result<Engine, i32> {
    Engine::connect().await.map_err(|e| {
        errln!("nightshift: {e}");
        exit::ENGINE
    })
}

async fn dispatch(cli: Cli) -> i32 {
    let root = state_root(&cli);
    let config = cli.config.clone();
    let result = match cli.command {
        Command::Image { command } => image_cmd(&root, command).await,
        Command::Run(args) => run_cmd(&root, config.as_deref(), args).await,
        Command::Runs { json } => runs_cmd(&root, json),
        Command::Show { run, json } => show_cmd(&root, &run, json),
        Command::Audit {
            command: AuditCommand::Verify { json },
        } => verify_cmd(&root, json),
        Command::Demo => demo_cmd(&root, config.as_deref()).await,
        Command::Owner {
            command: OwnerCommand::Init,
        } => owner_init(&root),
        Command::Policy(args) => policy_cmd(&root, args),
        Command::Freeze { why } => freeze_cmd(&root, &why),
        Command::Thaw { owner_key_file } => thaw_cmd(&root, owner_key_file.as_deref()),
        Command::Kill { run, all, freeze } => kill_cmd(&root, run, all, freeze).await,
        Command::Watchdog { supervisor } => {
            watchdog_cmd(&root, config.as_deref(), &supervisor).await
        }
        Command::Reconcile => reconcile_cmd(&root, config.as_deref()).await,
        Command::Import { run } => import_cmd(&root, &run).await,
        Command::Queue { command, json } => with_queue_config(&root, config.as_deref())
            .and_then(|()| queue_cmd(&root, command, json)),
        Command::Approve {
            acts,
            owner_key_file,
        } => with_queue_config(&root, config.as_deref())
            .and_then(|()| decide_cmd(&root, &acts, owner_key_file.as_deref(), None)),
        Command::Reject {
            acts,
            why,
            owner_key_file,
        } => with_queue_config(&root, config.as_deref())
            .and_then(|()| decide_cmd(&root, &acts, owner_key_file.as_deref(), Some(&why))),
        Command::Rebind {
            acts,
            owner_key_file,
        } => with_queue_config(&root, config.as_deref())
            .and_then(|()| rebind_cmd(&root, &acts, owner_key_file.as_deref())),
    };
    match result {
        Ok(code) | Err(code) => code,
    }
}

async fn image_cmd(root: &std::path::Path, command: ImageCommand) -> Result<i32, i32> {
    match command {
        ImageCommand::Ref { agent: None } => {
            outln!("{}", image::default_reference());
            Ok(exit::OK)
        }
        ImageCommand::Ref { agent: Some(name) } => {
            outln!("{}", agent_preset(&name)?.reference());
            Ok(exit::OK)
        }
        ImageCommand::Build {
            mirror,
            agent: None,
        } => {
            let engine = connect().await?;
            let reference = build_image(&engine, root, &mirror).await?;
            outln!("{reference}");
            Ok(exit::OK)
        }
        ImageCommand::Build {
            mirror,
            agent: Some(name),
        } => {
            let agent = agent_preset(&name)?;
            let engine = connect().await?;
            let paths = StatePaths::new(root.to_path_buf());
            let reference =
                image::build_agent(&engine, &paths.image_build(), &mirror, agent, |line| {
                    errln!("image: {line}")
                })
                .await
                .map_err(|e| {
                    errln!("nightshift: building the {} image: {e}", agent.name());
                    exit::INTERNAL
                })?;
            outln!("{reference}");
            Ok(exit::OK)
        }
    }
}

fn agent_preset(name: &str) -> Result<image::Agent, i32> {
    image::Agent::from_name(name).map_err(|e| {
        errln!("nightshift: {e}");
        exit::USAGE
    })
}

async fn build_image(engine: &Engine, root: &std::path::Path, mirror: &str) -> Result<String, i32> {
    let paths = StatePaths::new(root.to_path_buf());
    image::build(engine, &paths.image_build(), mirror, |line| {
        errln!("image: {line}")
    })
    .await
    .map_err(|e| {
        errln!("nightshift: building the image: {e}");
        match e {
            image::ImageError::Engine(EngineError::Unreachable { .. }) => exit::ENGINE,
            _ => exit::INTERNAL,
        }
    })
}

fn size_arg(s: &str) -> Result<u64, String> {
    orchestrator::config::parse_size(s)
}

fn span_arg(s: &str) -> Result<std::time::Duration, String> {
    orchestrator::config::parse_span(s)
}

fn load_config(
    root: &std::path::Path,
    path: Option<&std::path::Path>,
) -> Result<orchestrator::config::Config, i32> {
    let path = path
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(|| root.join("config.toml"));
    orchestrator::config::Config::load(&path).map_err(|e| {
        errln!("nightshift: {e}");
        exit::BAD_INPUT
    })
}

/// Loads and checks the process's one configuration and gives the queue its
/// lifetimes from it: a broken file is an error, never silently defaults.
fn with_queue_config(root: &std::path::Path, path: Option<&std::path::Path>) -> Result<(), i32> {
    let config = load_config(root, path)?;
    orchestrator::acts::use_queue_ttls(config.queue_ttls());
    Ok(())
}

/// Opens the state, the engine and the fleet cgroup: what every command
/// that starts or stops sandboxes needs.
async fn supervisor(
    root: &std::path::Path,
    config: &orchestrator::config::Config,
) -> Result<Supervisor, i32> {
    let store = open_store(root)?;
    let engine = connect().await?;
    let state_tag = orchestrator::state_tag(root);
    let fleet =
        orchestrator::run::FleetHandle::ensure(&state_tag, &config.fleet()).map_err(|e| {
            errln!("nightshift: {e}");
            exit::INTERNAL
        })?;
    let identity = orchestrator::run::process_identity(std::process::id())
        .unwrap_or_else(|| format!("{}:0", std::process::id()));
    Ok(Supervisor {
        engine,
        store: Arc::new(Mutex::new(store)),
        state_tag,
        identity,
        fleet: Some(fleet),
        sandbox_user: config.sandbox_user(),
    })
}

async fn run_cmd(
    root: &std::path::Path,
    config_path: Option<&std::path::Path>,
    args: RunArgs,
) -> Result<i32, i32> {
    let config = load_config(root, config_path)?;
    // The door queues acts with this run's configuration's lifetimes.
    orchestrator::acts::use_queue_ttls(config.queue_ttls());
    let task = match (&args.task, &args.task_file) {
        (Some(t), _) => t.clone(),
        (None, Some(f)) => {
            let mut text = String::new();
            std::fs::File::open(f)
                .and_then(|mut h| h.read_to_string(&mut text))
                .map_err(|e| {
                    errln!("nightshift: reading the task file {}: {e}", f.display());
                    exit::BAD_INPUT
                })?;
            text
        }
        (None, None) => String::new(),
    };
    let defaults = config.caps();
    let fleet = config.fleet();
    if let Some(cpus) = args.cpus {
        if !(cpus > 0.0 && cpus <= fleet.cpus) {
            errln!(
                "nightshift: --cpus {cpus} must be above 0 and at most the fleet's {} cpus",
                fleet.cpus
            );
            return Err(exit::BAD_INPUT);
        }
    }
    let caps = Caps {
        memory_bytes: args
            .memory
            .map(|v| v as i64)
            .unwrap_or(defaults.memory_bytes),
        nano_cpus: args
            .cpus
            .map(|v| (v * 1e9) as i64)
            .unwrap_or(defaults.nano_cpus),
        pids: args.pids.map(|v| v as i64).unwrap_or(defaults.pids),
        open_files: args
            .max_files
            .map(|v| v as i64)
            .unwrap_or(defaults.open_files),
        timeout: args.timeout.unwrap_or(defaults.timeout),
        max_output_bytes: args.max_output.unwrap_or(defaults.max_output_bytes),
        max_worktree_bytes: args.max_worktree.unwrap_or(defaults.max_worktree_bytes),
        tmpfs_bytes: defaults.tmpfs_bytes,
        lease: defaults.lease,
    };
    let (preset_image, command) = match args.agent.as_deref() {
        None => (None, args.command),
        Some(name) => {
            let preset = orchestrator::agents::preset(agent_preset(name)?, args.model.as_deref())
                .map_err(|e| {
                errln!("nightshift: {e}");
                exit::USAGE
            })?;
            (Some(preset.image), preset.command)
        }
    };
    let req = RunRequest {
        repo_confidentiality: config.repository_confidentiality(&args.repo),
        repo: args.repo,
        base_ref: args.base_ref,
        image: args
            .image
            .or(preset_image)
            .unwrap_or_else(image::default_reference),
        task,
        command,
        caps,
        echo: !args.json,
    };
    let record = perform(root, &config, config_path, req).await?;
    if args.json {
        outln!("{}", terminal::json(&record, true));
    } else {
        print_summary(&record);
    }
    Ok(run_exit_code(&record))
}

/// A run's exit code: an import that failed or dropped the history says so
/// before the agent's own ending does (never success when work is missing).
fn run_exit_code(record: &RunRecord) -> i32 {
    match run::import_state(record) {
        run::ImportState::Failed => exit::IMPORT_FAILED,
        run::ImportState::HistoryDropped => exit::NOT_WHOLE,
        run::ImportState::Whole
            if record.exit_code == Some(0) && record.status.starts_with("exited") =>
        {
            exit::OK
        }
        run::ImportState::Whole => exit::FAILED,
    }
}

/// `nightshift import RUN`: retries a failed import (see `run::retry_import`).
async fn import_cmd(root: &std::path::Path, id: &str) -> Result<i32, i32> {
    let store = Mutex::new(open_store(root)?);
    match run::retry_import(&store, id).await {
        Ok(record) => {
            print_summary(&record);
            Ok(match run::import_state(&record) {
                run::ImportState::HistoryDropped => exit::NOT_WHOLE,
                _ => exit::OK,
            })
        }
        Err(e) => {
            errln!("nightshift: {e}");
            Err(match e {
                run::RetryError::NothingToRetry { .. } => exit::BAD_INPUT,
                run::RetryError::Store(StoreError::NoSuchRun(_)) => exit::BAD_INPUT,
                run::RetryError::Store(_) => exit::STATE,
                run::RetryError::Failed { .. } => exit::IMPORT_FAILED,
                run::RetryError::WorktreeGone { .. } | run::RetryError::Lock { .. } => {
                    exit::INTERNAL
                }
            })
        }
    }
}

/// Runs one request with signal handling; maps errors to exit codes.
async fn perform(
    root: &std::path::Path,
    config: &orchestrator::config::Config,
    config_path: Option<&std::path::Path>,
    req: RunRequest,
) -> Result<RunRecord, i32> {
    // A freeze refuses a new run before the engine is asked anything, so it
    // holds with the engine down too; `run::execute` checks it again.
    if let Ok(set) = orchestrator::policy::load(&open_store(root)?, None) {
        if let Some(freeze) = set.freeze() {
            errln!("nightshift: {}", RunError::Frozen(freeze.reason.clone()));
            return Err(exit::DENIED);
        }
    }
    let sup = supervisor(root, config).await?;
    // Sandboxes left by a supervisor that vanished are settled first.
    if let Err(e) = orchestrator::killswitch::reconcile(&sup, None, "supervisor start").await {
        errln!("nightshift: reconciling: {e}");
    }
    spawn_watchdog(root, config_path, &sup.identity);
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
    let result = run::execute(&sup, req, rx).await;
    signals.abort();
    result.map_err(|e| {
        errln!("nightshift: {e}");
        match e {
            RunError::BadInput(_) => exit::BAD_INPUT,
            RunError::Engine(EngineError::ImageMissing(_)) => exit::IMAGE_MISSING,
            RunError::Engine(EngineError::Unreachable { .. }) => exit::ENGINE,
            RunError::Engine(_) => exit::INTERNAL,
            RunError::Refused { .. } => exit::REFUSED,
            RunError::Store(_) => exit::STATE,
            RunError::Git(_) => exit::INTERNAL,
            RunError::Frozen(_) => exit::DENIED,
            RunError::Policy(_) => exit::BAD_INPUT,
            RunError::Interrupted { signal, .. } => match signal {
                Stop::Interrupt => exit::SIGINT,
                Stop::Terminate => exit::SIGTERM,
            },
        }
    })
}

/// Starts the dead man's switch for this process: a separate process, in
/// its own process group, that stops this supervisor's sandboxes if it dies.
fn spawn_watchdog(root: &std::path::Path, config: Option<&std::path::Path>, identity: &str) {
    use std::os::unix::process::CommandExt;
    let Ok(exe) = std::env::current_exe() else {
        errln!("nightshift: warning: cannot find my own executable to start the watchdog");
        return;
    };
    let mut command = std::process::Command::new(exe);
    command.arg("--state-dir").arg(root);
    // One config per process, passed on: the watchdog reads the run's.
    if let Some(config) = config {
        command.arg("--config").arg(config);
    }
    let spawned = command
        .args(["watchdog", "--supervisor", identity])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn();
    if let Err(e) = spawned {
        errln!("nightshift: warning: starting the watchdog: {e}");
    }
}

/// The kill switch. It depends on nothing that may be broken: the sandboxes
/// are stopped first, with only the engine and the state's tag (no config,
/// no database, no cgroup); then it is recorded, and when the store cannot
/// be opened in time, what was done is written to `STATE/killswitch.pending`
/// for the next reconciliation to record.
async fn kill_cmd(
    root: &std::path::Path,
    run: Option<String>,
    all: bool,
    freeze: bool,
) -> Result<i32, i32> {
    if run.is_none() && !all {
        errln!("nightshift: name a run, or --all");
        return Err(exit::BAD_INPUT);
    }
    let who = format!(
        "{} (nightshift kill)",
        std::env::var("USER").unwrap_or_else(|_| "operator".into())
    );
    let engine = connect().await?;
    let state_tag = orchestrator::state_tag(root);
    let stopped =
        orchestrator::killswitch::stop_sandboxes(&engine, &state_tag, run.as_deref(), &who, freeze)
            .await
            .map_err(|e| {
                errln!("nightshift: {e}");
                exit::ENGINE
            })?;
    outln!("killed {} sandbox(es)", stopped.containers.len());

    // Now record it, if the store answers in time.
    let paths = StatePaths::new(root.to_path_buf());
    let opened = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        tokio::task::spawn_blocking(move || Store::open(paths)),
    )
    .await;
    let store = match opened {
        Ok(Ok(Ok(store))) => Ok(store),
        Ok(Ok(Err(e))) => Err(e.to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the state store did not answer within 5 s".to_string()),
    };
    let store = match store {
        Ok(store) => store,
        Err(why) => {
            return match orchestrator::killswitch::write_pending(root, &stopped) {
                Ok(()) => {
                    errln!(
                        "nightshift: the kill is not recorded yet ({why}); it was written to {} and the next `nightshift reconcile` (or run) records it",
                        orchestrator::killswitch::pending_path(root).display()
                    );
                    Ok(exit::OK)
                }
                Err(e) => {
                    errln!(
                        "nightshift: the sandboxes were stopped, but the kill could not be recorded: {why}; writing {}: {e}",
                        orchestrator::killswitch::pending_path(root).display()
                    );
                    Err(exit::STATE)
                }
            };
        }
    };
    let identity = orchestrator::run::process_identity(std::process::id())
        .unwrap_or_else(|| format!("{}:0", std::process::id()));
    let sup = Supervisor {
        engine,
        store: Arc::new(Mutex::new(store)),
        state_tag,
        identity,
        fleet: None,
        // Only stops and settles: it creates no sandbox.
        sandbox_user: Default::default(),
    };
    match orchestrator::killswitch::record_kill(&sup, &stopped).await {
        Ok(k) => {
            outln!("recorded the kill of {} run(s)", k.runs.len());
            for r in k.runs {
                outln!("  {r}");
            }
            Ok(exit::OK)
        }
        Err(e) => {
            errln!("nightshift: {e}");
            Err(match e {
                RunError::Store(StoreError::NoSuchRun(_)) => exit::BAD_INPUT,
                RunError::Store(_) => {
                    let _ = orchestrator::killswitch::write_pending(root, &stopped);
                    exit::STATE
                }
                _ => exit::INTERNAL,
            })
        }
    }
}

async fn watchdog_cmd(
    root: &std::path::Path,
    config_path: Option<&std::path::Path>,
    watched: &str,
) -> Result<i32, i32> {
    // The supervisor's own config, checked; the watchdog creates nothing, so
    // it never touches the fleet's limits.
    let _config = load_config(root, config_path)?;
    let sup = stopping_supervisor(root).await?;
    orchestrator::killswitch::watchdog(&sup, watched, std::time::Duration::from_millis(500))
        .await
        .map(|()| exit::OK)
        .map_err(|e| {
            errln!("nightshift: watchdog: {e}");
            exit::INTERNAL
        })
}

/// What commands that only stop and settle sandboxes need: the state and
/// the engine, never the fleet cgroup (whose limits only the process that
/// creates sandboxes writes, from its own config).
async fn stopping_supervisor(root: &std::path::Path) -> Result<Supervisor, i32> {
    let store = open_store(root)?;
    let engine = connect().await?;
    let identity = orchestrator::run::process_identity(std::process::id())
        .unwrap_or_else(|| format!("{}:0", std::process::id()));
    Ok(Supervisor {
        engine,
        store: Arc::new(Mutex::new(store)),
        state_tag: orchestrator::state_tag(root),
        identity,
        fleet: None,
        // Only stops and settles: it creates no sandbox.
        sandbox_user: Default::default(),
    })
}

async fn reconcile_cmd(
    root: &std::path::Path,
    config_path: Option<&std::path::Path>,
) -> Result<i32, i32> {
    let _config = load_config(root, config_path)?;
    let sup = stopping_supervisor(root).await?;
    match orchestrator::killswitch::reconcile(&sup, None, "nightshift reconcile").await {
        Ok(settled) => {
            outln!("settled {} run(s)", settled.len());
            for r in settled {
                outln!("  {r}");
            }
            Ok(exit::OK)
        }
        Err(e) => {
            errln!("nightshift: {e}");
            Err(exit::INTERNAL)
        }
    }
}

fn print_summary(r: &RunRecord) {
    outln!(
        "run {}: {}",
        terminal::line(&r.id),
        terminal::line(&r.status)
    );
    if let Some(reason) = &r.reason {
        outln!("  reason: {}", terminal::line(reason));
    }
    if let (Some(reference), Some(commit)) = (&r.result_ref, &r.result_commit) {
        outln!(
            "  result: {} = {} ({} files changed, +{} -{})",
            terminal::line(reference),
            terminal::line(commit),
            r.files_changed.unwrap_or(0),
            r.insertions.unwrap_or(0),
            r.deletions.unwrap_or(0)
        );
    }
    if let Some(ms) = r.duration_ms {
        outln!("  duration: {:.1}s", ms as f64 / 1000.0);
    }
}

fn runs_cmd(root: &std::path::Path, json: bool) -> Result<i32, i32> {
    let store = open_store(root)?;
    let runs = store.runs().map_err(store_err)?;
    if json {
        outln!("{}", terminal::json(&runs, true));
        return Ok(exit::OK);
    }
    outln!(
        "{:<26}  {:<24}  {:>4}  {:>8}  {:>14}  REPO",
        "ID",
        "STATUS",
        "EXIT",
        "DURATION",
        "CHANGES"
    );
    for r in runs {
        let changes = match (r.files_changed, r.insertions, r.deletions) {
            (Some(f), Some(i), Some(d)) => format!("{f}f +{i} -{d}"),
            _ => "-".into(),
        };
        outln!(
            "{:<26}  {:<24}  {:>4}  {:>8}  {:>14}  {}",
            terminal::line(&r.id),
            truncate(&terminal::line(&r.status), 24),
            r.exit_code
                .map(|c| c.to_string())
                .unwrap_or_else(|| "-".into()),
            r.duration_ms
                .map(|ms| format!("{:.1}s", ms as f64 / 1000.0))
                .unwrap_or_else(|| "-".into()),
            changes,
            terminal::line(&r.repo)
        );
    }
    Ok(exit::OK)
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).chain(std::iter::once('…')).collect()
    }
}

fn store_err(e: StoreError) -> i32 {
    errln!("nightshift: {e}");
    match e {
        StoreError::NoSuchRun(_) => exit::BAD_INPUT,
        _ => exit::STATE,
    }
}

fn show_cmd(root: &std::path::Path, id: &str, json: bool) -> Result<i32, i32> {
    let store = open_store(root)?;
    let run = store.run(id).map_err(store_err)?;
    let entries = store.entries_for_run(id).map_err(store_err)?;
    let head = entries.last().map(|e| (e.seq, e.hash.clone()));
    if json {
        let doc = serde_json::json!({
            "run": run,
            "audit": entries.iter().map(|e| serde_json::json!({
                "seq": e.seq, "time": e.time, "kind": e.kind, "body": e.body, "hash": e.hash,
            })).collect::<Vec<_>>(),
        });
        outln!("{}", terminal::json(&doc, true));
        return Ok(exit::OK);
    }
    print_summary(&run);
    outln!(
        "  repo: {} at {} ({})",
        terminal::line(&run.repo),
        terminal::line(&run.base_ref),
        terminal::line(run.base_commit.as_deref().unwrap_or("-"))
    );
    outln!("  image: {}", terminal::line(&run.image));
    if let Some(mem) = run.peak_memory_bytes {
        outln!("  peak memory: {:.1} MiB", mem as f64 / (1 << 20) as f64);
    }
    if let Some(cpu) = run.cpu_ns {
        outln!("  cpu time: {:.2}s", cpu as f64 / 1e9);
    }
    if let Some(props) = run.attestation.as_ref().and_then(|a| a.as_array()) {
        outln!("  attestation:");
        for p in props {
            outln!(
                "    {} {:<22} {}",
                if p["ok"].as_bool().unwrap_or(false) {
                    "ok  "
                } else {
                    "FAIL"
                },
                terminal::line(p["name"].as_str().unwrap_or("?")),
                terminal::line(p["observed"].as_str().unwrap_or(""))
            );
        }
    }
    if let Some(skipped) = run.observed.as_ref().and_then(|o| o["skipped"].as_array()) {
        for s in skipped {
            outln!(
                "  skipped: {} ({})",
                terminal::line(s["path"].as_str().unwrap_or("?")),
                terminal::line(s["why"].as_str().unwrap_or("?"))
            );
        }
    }
    let refused = orchestrator::acts::refusals(&store, Some(id)).map_err(store_err)?;
    if !refused.is_empty() {
        outln!("  refused door requests ({}):", refused.len());
        for r in &refused {
            outln!("    {}", refusal_line(r));
        }
    }
    if let Some((seq, hash)) = head {
        outln!(
            "  audit: {} entries, last #{seq} {}",
            entries.len(),
            terminal::line(&hash)
        );
    }
    Ok(exit::OK)
}

fn verify_cmd(root: &std::path::Path, json: bool) -> Result<i32, i32> {
    let store = open_store(root)?;
    let snap = store.audit_snapshot().map_err(store_err)?;
    match orchestrator_audit::verify_with_head(
        store.log(),
        &snap.entries,
        &snap.checkpoints,
        snap.head.as_ref(),
    ) {
        Ok(v) => {
            if json {
                outln!(
                    "{}",
                    terminal::json(
                        &serde_json::json!({"intact": true, "entries": v.entries, "checkpoints": v.checkpoints, "head": v.head}),
                        false
                    )
                );
            } else {
                outln!(
                    "audit chain intact: {} entries, {} checkpoints, head {}",
                    v.entries,
                    v.checkpoints,
                    v.head
                );
            }
            Ok(exit::OK)
        }
        Err(e) => {
            if json {
                outln!(
                    "{}",
                    terminal::json(
                        &serde_json::json!({"intact": false, "first_bad_entry": e.seq(), "error": e.to_string()}),
                        false
                    )
                );
            } else {
                outln!("audit chain broken: {}", terminal::line(&e.to_string()));
            }
            Ok(exit::FAILED)
        }
    }
}

async fn demo_cmd(
    root: &std::path::Path,
    config_path: Option<&std::path::Path>,
) -> Result<i32, i32> {
    let config = load_config(root, config_path)?;
    orchestrator::acts::use_queue_ttls(config.queue_ttls());
    std::fs::create_dir_all(root).map_err(|e| {
        errln!("nightshift: creating {}: {e}", root.display());
        exit::STATE
    })?;
    let repo = demo::ensure_repo(root).map_err(|e| {
        errln!("nightshift: making the demo repository: {e}");
        exit::INTERNAL
    })?;
    let bare = demo::ensure_destination(root).map_err(|e| {
        errln!("nightshift: making the demo destination: {e}");
        exit::INTERNAL
    })?;
    {
        let store = open_store(root)?;
        orchestrator::owner::init(&store).map_err(|e| {
            errln!("nightshift: {e}");
            exit::STATE
        })?;
    }
    let engine = connect().await?;
    let reference = build_image(&engine, root, image::DEFAULT_MIRROR).await?;
    outln!("demo: repository {}", repo.display());
    outln!(
        "demo: destination origin = {} (a local bare repository)",
        bare.display()
    );
    outln!("demo: running a scripted agent in a Tier 0 sandbox ({reference})");
    let req = RunRequest {
        repo: repo.clone(),
        base_ref: "HEAD".into(),
        image: reference,
        task: demo::TASK.into(),
        command: vec!["bash".into(), "-c".into(), demo::AGENT_SCRIPT.into()],
        caps: config.caps(),
        echo: true,
        repo_confidentiality: config.repository_confidentiality(&repo),
    };
    let record = perform(root, &config, config_path, req).await?;
    print_summary(&record);
    let state = root.display();
    outln!();
    outln!("What the agent left, as the supervisor observed and imported it:");
    outln!(
        "  git -C {} log --stat {}",
        repo.display(),
        record.result_ref.as_deref().unwrap_or("-")
    );
    let store = open_store(root)?;
    let pending: Vec<_> = orchestrator::acts::rows(&store, None)
        .map_err(store_err)?
        .into_iter()
        .filter(|r| r.act.run == record.id)
        .collect();
    outln!();
    outln!("Waiting for you in the morning queue (`nightshift --state-dir {state} queue`):");
    for r in &pending {
        outln!(
            "  act {} ({}): {}",
            r.act.id,
            r.act.door.name(),
            r.state.name()
        );
    }
    if let Some(r) = pending.first() {
        let exe = std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "nightshift".into());
        outln!();
        outln!("Approve it (with the owner's key) and the commit lands in the destination:");
        outln!(
            "  {exe} --state-dir {state} approve {} --owner-key-file {state}/owner.key",
            r.act.id
        );
        outln!(
            "  git --git-dir {} log --oneline agent/greet",
            bare.display()
        );
    }
    outln!();
    outln!("  nightshift --state-dir {state} show {}", record.id);
    outln!("  nightshift --state-dir {state} audit verify");
    Ok(run_exit_code(&record))
}

fn owner_init(root: &std::path::Path) -> Result<i32, i32> {
    let store = open_store(root)?;
    match orchestrator::owner::init(&store) {
        Ok((path, true)) => {
            outln!(
                "owner key written to {} (mode 0600); keep it to yourself",
                path.display()
            );
            Ok(exit::OK)
        }
        Ok((path, false)) => {
            outln!("the owner key already exists: {}", path.display());
            Ok(exit::OK)
        }
        Err(e) => {
            errln!("nightshift: {e}");
            Err(exit::STATE)
        }
    }
}

fn owner(
    store: &Store,
    key_file: Option<&std::path::Path>,
) -> Result<orchestrator::owner::Owner, i32> {
    orchestrator::owner::verify(store, key_file).map_err(|e| {
        errln!("nightshift: {e}");
        exit::DENIED
    })
}

fn policy_err(e: orchestrator::policy::PolicyError) -> i32 {
    errln!("nightshift: {e}");
    match e {
        orchestrator::policy::PolicyError::Refused(_) => exit::DENIED,
        orchestrator::policy::PolicyError::Store(_) => exit::STATE,
        _ => exit::BAD_INPUT,
    }
}

fn read_stdin_bytes() -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    // One byte past the hook's limit is enough to know it is over.
    std::io::stdin()
        .take(policies::hook::MAX_HOOK_INPUT as u64 + 1)
        .read_to_end(&mut buf)?;
    Ok(buf)
}

/// What `policy check` decided, printed once the answer is claimed.
struct CheckAnswer {
    code: i32,
    line: Option<String>,
    warning: Option<String>,
}

/// `policy check`: fails closed. Any failure, including a panic, is exit 2
/// with the reason on stderr; so is no answer within
/// [`orchestrator::policy::HOOK_BOUND`] (a locked or slow state): a timer
/// thread claims the answer and exits 2 unless the check claimed it first.
/// It never makes a state: without one it refuses, naming how to make one.
fn policy_check(root: &std::path::Path, rules: Option<&std::path::Path>, args: &CheckArgs) -> i32 {
    use std::sync::atomic::{AtomicBool, Ordering};
    let answered = Arc::new(AtomicBool::new(false));
    {
        let answered = answered.clone();
        std::thread::spawn(move || {
            std::thread::sleep(orchestrator::policy::HOOK_BOUND);
            if !answered.swap(true, Ordering::SeqCst) {
                errln!(
                    "refused by rule nightshift:hook-internal: no answer within {} s (the state is busy or slow): refused rather than answered late",
                    orchestrator::policy::HOOK_BOUND.as_secs()
                );
                std::process::exit(policies::hook::EXIT_BLOCK);
            }
        });
    }
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        check_decide(root, rules, args)
    }));
    if answered.swap(true, Ordering::SeqCst) {
        // The timer answered (and is ending the process).
        loop {
            std::thread::park();
        }
    }
    match result {
        Ok(Ok(answer)) => {
            if let Some(warning) = answer.warning {
                errln!("{warning}");
            }
            if let Some(line) = answer.line {
                errln!("{line}");
            }
            answer.code
        }
        Ok(Err(reason)) => {
            errln!(
                "refused by rule nightshift:hook-internal: {}",
                reason.replace('\n', " ")
            );
            policies::hook::EXIT_BLOCK
        }
        Err(_) => {
            errln!("refused by rule nightshift:hook-internal: the policy check panicked");
            policies::hook::EXIT_BLOCK
        }
    }
}

fn check_decide(
    root: &std::path::Path,
    rules: Option<&std::path::Path>,
    args: &CheckArgs,
) -> Result<CheckAnswer, String> {
    if args.args_json != "-" {
        return Err(format!(
            "--args-json {}: only - (stdin) is supported",
            args.args_json
        ));
    }
    let stdin = read_stdin_bytes().map_err(|e| format!("reading stdin: {e}"))?;
    let busy = |e: &orchestrator::store::StoreError| {
        if Store::is_busy(e) {
            format!(
                "the state at {} is locked by another process past the hook's wait of {} ms: {e}",
                root.display(),
                orchestrator::policy::HOOK_BUSY.as_millis()
            )
        } else {
            e.to_string()
        }
    };
    let mut store = Store::open_existing(
        StatePaths::new(root.to_path_buf()),
        orchestrator::policy::HOOK_BUSY,
    )
    .map_err(|e| busy(&e))?
    .ok_or_else(|| {
        format!(
            "no nightshift state at {}: a hook never makes its own; set NIGHTSHIFT_STATE_DIR (or --state-dir) in the harness's environment to the supervisor's state, or make one with `nightshift --state-dir DIR owner init`",
            root.display()
        )
    })?;
    let set = orchestrator::policy::load(&store, rules).map_err(|e| e.to_string())?;
    let now = orchestrator::policy::now();
    let outcome =
        policies::hook_decide(&set, args.actor.as_deref(), &args.tool, &stdin, now, false);
    // The tool the call was for: the payload's `tool_name` with `--tool -`.
    let tool = outcome.tool.clone().unwrap_or_else(|| args.tool.clone());
    match &outcome.decision {
        Some(decision) => orchestrator::policy::record_decision(
            &mut store,
            None,
            args.actor.as_deref(),
            &tool,
            decision,
        )
        .map_err(|e| match e {
            orchestrator::policy::PolicyError::Store(e) => {
                format!("auditing the decision: {}", busy(&e))
            }
            e => format!("auditing the decision: {e}"),
        })?,
        // Refused before any rule was consulted (bad input): audited
        // too, with the digest of the bytes received.
        None => {
            store
                .append(
                    None,
                    &orchestrator::audit_log::Event::PolicyDecision {
                        actor: args.actor.clone(),
                        door: tool,
                        verdict: "refuse".into(),
                        rule: "nightshift:hook-input".into(),
                        escalated: false,
                        stood_aside: Vec::new(),
                        generation: set.generation().to_string(),
                        digest: orchestrator::audit_log::digest(&stdin),
                    },
                    false,
                )
                .map_err(|e| format!("auditing the refusal: {}", busy(&e)))?;
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
                    orchestrator::policy::rules_source(&store, rules)
                )
            })
    } else {
        None
    };
    Ok(CheckAnswer {
        code: outcome.exit_code,
        line: (outcome.exit_code != 0).then_some(outcome.stderr),
        warning,
    })
}

fn policy_cmd(root: &std::path::Path, args: PolicyArgs) -> Result<i32, i32> {
    let rules = args.rules.as_deref();
    match args.command {
        PolicyCommand::Check(check) => Ok(policy_check(root, rules, &check)),
        PolicyCommand::Explain(check) => {
            let stdin = read_stdin_bytes().map_err(|e| {
                errln!("nightshift: reading stdin: {e}");
                exit::BAD_INPUT
            })?;
            let store = open_store(root)?;
            let set = orchestrator::policy::load(&store, rules).map_err(policy_err)?;
            let outcome = policies::hook_decide(
                &set,
                check.actor.as_deref(),
                &check.tool,
                &stdin,
                orchestrator::policy::now(),
                false,
            );
            match outcome.decision {
                Some(d) => outln!(
                    "{}",
                    terminal::json(
                        &serde_json::json!({
                            "verdict": orchestrator::policy::verdict_name(d.verdict),
                            "rule": d.rule.to_string(),
                            "reason": d.reason,
                            "escalated": d.escalated,
                            "stood_aside": d.stood_aside.iter().map(|s| serde_json::json!({
                                "rule": s.rule.to_string(), "effect": s.effect.to_string(),
                                "missing": format!("{:?}", s.missing),
                            })).collect::<Vec<_>>(),
                            "generation": d.generation.to_string(),
                            "digest": d.digest.to_string(),
                        }),
                        true
                    )
                ),
                None => outln!("{}", terminal::block(outcome.stderr.as_bytes())),
            }
            Ok(exit::OK)
        }
        PolicyCommand::List { json, actor } => {
            let store = open_store(root)?;
            let set = orchestrator::policy::load(&store, rules).map_err(policy_err)?;
            let now = orchestrator::policy::now();
            let active: Vec<_> = set.active(now).collect();
            let actor = actor.filter(|a| !a.is_empty());
            let binding: Vec<String> =
                orchestrator::policy::rules_binding_tool_calls(&set, actor.as_deref(), now)
                    .iter()
                    .map(|r| r.id().to_string())
                    .collect();
            if json {
                let doc = serde_json::json!({
                    "generation": set.generation().to_string(),
                    "frozen": set.freeze().map(|f| f.reason.clone()),
                    // `locked` is the lock state now (ratified rules are locked), not as declared.
                    "active": active.iter().map(|r| {
                        let mut v = serde_json::to_value(r).unwrap_or_default();
                        if let Some(entry) = set.entries().get(r.id()) {
                            v["locked"] = entry.locked.into();
                        }
                        v
                    }).collect::<Vec<_>>(),
                    "pending": set.pending().keys().collect::<Vec<_>>(),
                    // The rules that bind the hook's tool calls (of `--actor`, if given).
                    "hook": {
                        "actor": actor,
                        "binding": binding,
                    },
                });
                outln!("{}", terminal::json(&doc, true));
                return Ok(exit::OK);
            }
            outln!("generation {}", set.generation());
            if let Some(f) = set.freeze() {
                outln!(
                    "FROZEN: {} ({})",
                    terminal::line(&f.reason),
                    terminal::line(&f.authority.to_string())
                );
            }
            for r in &active {
                let v = serde_json::to_value(r).unwrap_or_default();
                let named = |k: &str| v.get(k).map(|d| format!("{k}={d} ")).unwrap_or_default();
                outln!(
                    "{:<7} {:<32} {}{}subject={}  {}",
                    terminal::line(v["effect"].as_str().unwrap_or("?")),
                    terminal::line(v["id"].as_str().unwrap_or("?")),
                    terminal::line(&named("doors")),
                    terminal::line(&named("tools")),
                    terminal::line(v["subject"].as_str().unwrap_or("?")),
                    terminal::line(v["reason"].as_str().unwrap_or(""))
                );
            }
            for (id, p) in set.pending() {
                outln!(
                    "pending proposal {} by {}",
                    terminal::line(id),
                    terminal::line(&format!("{:?}", p.author))
                );
            }
            let whose = actor
                .as_deref()
                .map(|a| format!("actor {}'s", terminal::line(a)))
                .unwrap_or_else(|| "any actor's".to_string());
            if binding.is_empty() {
                outln!("hook: no rule binds {whose} tool calls: `policy check` allows every one");
            } else {
                outln!(
                    "hook: {} rule(s) bind {whose} tool calls: {}",
                    binding.len(),
                    terminal::line(&binding.join(", "))
                );
            }
            Ok(exit::OK)
        }
        PolicyCommand::Declare {
            file,
            actor,
            owner_key_file,
        } => {
            let mut store = open_store(root)?;
            let writer = match actor {
                Some(a) => orchestrator::policy::Writer::Agent(a),
                None => {
                    orchestrator::policy::Writer::Owner(owner(&store, owner_key_file.as_deref())?)
                }
            };
            let ids = orchestrator::policy::declare(&mut store, rules, &file, &writer)
                .map_err(policy_err)?;
            for id in ids {
                outln!("declared {id}");
            }
            Ok(exit::OK)
        }
        PolicyCommand::Unlock {
            rule,
            owner_key_file,
        } => {
            let mut store = open_store(root)?;
            let who = owner(&store, owner_key_file.as_deref())?;
            orchestrator::policy::unlock(&mut store, rules, &rule, &who).map_err(policy_err)?;
            outln!("unlocked {rule}");
            Ok(exit::OK)
        }
        PolicyCommand::Propose {
            file,
            actor,
            retire,
            why,
        } => {
            let mut store = open_store(root)?;
            let writer = orchestrator::policy::Writer::Agent(actor);
            let ids = match (file, retire) {
                (Some(file), None) => {
                    orchestrator::policy::propose(&mut store, rules, &file, &writer)
                }
                (None, Some(rule)) => orchestrator::policy::propose_retirement(
                    &mut store,
                    rules,
                    &rule,
                    why.as_deref().unwrap_or_default(),
                    &writer,
                )
                .map(|id| vec![id]),
                _ => {
                    errln!("nightshift: name a rule file or --retire RULE");
                    return Err(exit::BAD_INPUT);
                }
            }
            .map_err(policy_err)?;
            for id in ids {
                outln!("proposed {id}: inert until the owner runs `nightshift policy ratify {id}`");
            }
            Ok(exit::OK)
        }
        PolicyCommand::Ratify {
            proposal,
            owner_key_file,
        } => {
            let mut store = open_store(root)?;
            let who = owner(&store, owner_key_file.as_deref())?;
            orchestrator::policy::ratify(&mut store, rules, &proposal, &who).map_err(policy_err)?;
            outln!("ratified {proposal} (locked)");
            Ok(exit::OK)
        }
        PolicyCommand::Retire {
            rule,
            why,
            actor,
            owner_key_file,
        } => {
            let mut store = open_store(root)?;
            let writer = match actor {
                Some(a) => orchestrator::policy::Writer::Agent(a),
                None => {
                    orchestrator::policy::Writer::Owner(owner(&store, owner_key_file.as_deref())?)
                }
            };
            orchestrator::policy::retire(&mut store, rules, &rule, &why, &writer)
                .map_err(policy_err)?;
            outln!("retired {rule}");
            Ok(exit::OK)
        }
    }
}

fn freeze_cmd(root: &std::path::Path, why: &str) -> Result<i32, i32> {
    let mut store = open_store(root)?;
    orchestrator::policy::freeze(&mut store, None, why).map_err(policy_err)?;
    outln!("frozen: no run starts and every door refuses until `nightshift thaw`");
    Ok(exit::OK)
}

fn thaw_cmd(root: &std::path::Path, key: Option<&std::path::Path>) -> Result<i32, i32> {
    let mut store = open_store(root)?;
    let who = owner(&store, key)?;
    orchestrator::policy::thaw(&mut store, None, &who).map_err(policy_err)?;
    outln!("thawed");
    Ok(exit::OK)
}

fn queue_cmd(
    root: &std::path::Path,
    command: Option<QueueCommand>,
    json: bool,
) -> Result<i32, i32> {
    let mut store = open_store(root)?;
    // What has run out of time is shown as expired, never as waiting.
    if let Err(e) = orchestrator::acts::expire(&mut store) {
        errln!("nightshift: expiring acts: {e}");
    }
    let rows = orchestrator::acts::rows(&store, None).map_err(store_err)?;
    if let Some(QueueCommand::Show { act }) = command {
        let row = rows.iter().find(|r| r.act.id == act).ok_or_else(|| {
            errln!("nightshift: no act with id {act}");
            exit::BAD_INPUT
        })?;
        outln!(
            "act {} ({}), run {}: {}",
            terminal::line(&row.act.id),
            terminal::line(row.act.door.name()),
            terminal::line(&row.act.run),
            terminal::line(row.state.name())
        );
        outln!(
            "destination: {}",
            terminal::line(&row.act.routing.destination)
        );
        if let Some(stale) = orchestrator::acts::stale_view(&store, row) {
            outln!("stale: {}", terminal::block(stale.why.as_bytes()));
            if let Some(orchestrator::acts::LeaseView { bound, now }) = &stale.lease {
                outln!(
                    "  bound to the remote ref at: {}",
                    bound.as_deref().unwrap_or("(absent)")
                );
                match now {
                    Ok(now) => outln!(
                        "  the remote ref is now at:   {}",
                        now.as_deref().unwrap_or("(absent)")
                    ),
                    Err(e) => outln!(
                        "  the remote ref cannot be read now: {}",
                        terminal::block(e.as_bytes())
                    ),
                }
            }
            match &stale.refused_now {
                Some(why) => outln!(
                    "  it cannot be re-bound: {}",
                    terminal::block(why.as_bytes())
                ),
                None => outln!(
                    "  re-bind it to the destination as it is now (then approve again): nightshift rebind {}",
                    row.act.id
                ),
            }
        }
        match (&row.act.routing.target, &row.act.content) {
            (
                deferred_queue::Target::Push {
                    target_ref,
                    expected_old,
                },
                deferred_queue::Content::Commit { commit },
            ) => {
                outln!(
                    "push {} to {} (remote now at {})",
                    terminal::line(commit),
                    terminal::line(target_ref),
                    terminal::line(expected_old.as_deref().unwrap_or("nothing"))
                );
                let run = store.run(&row.act.run).map_err(store_err)?;
                if let Some(orchestrator::acts::StaleView {
                    lease:
                        Some(orchestrator::acts::LeaseView {
                            now: Ok(Some(now)), ..
                        }),
                    ..
                }) = orchestrator::acts::stale_view(&store, row)
                {
                    // What the destination gained since the act was bound,
                    // when those objects are in the repository.
                    let out = std::process::Command::new("git")
                        .arg("-C")
                        .arg(&run.repo)
                        .args([
                            "-c",
                            "core.pager=cat",
                            "diff",
                            "--no-color",
                            "--no-ext-diff",
                            "--no-textconv",
                            "--stat",
                            &now,
                            commit,
                        ])
                        .output();
                    match out {
                        Ok(out) if out.status.success() => {
                            outln!("from the remote's new {now} to this act's commit:");
                            out!(
                                "{}",
                                terminal::block(&out.stdout)
                            );
                        }
                        _ => outln!(
                            "  (the remote's new commit is not in the repository: fetch it to see what changed)"
                        ),
                    }
                }
                let base = run.base_commit.unwrap_or_default();
                print_diff(&run.repo, &base, commit);
            }
            (
                deferred_queue::Target::PullRequest { base_ref, head_ref },
                deferred_queue::Content::PullRequest { head_commit, .. },
            ) => {
                outln!(
                    "pull request from {head_ref} at {head_commit} into {base_ref} (the head branch is pushed there first, fast-forward only, if it does not hold that commit)"
                );
                let text: serde_json::Value =
                    serde_json::from_slice(row.content.as_deref().unwrap_or_default())
                        .unwrap_or_default();
                let title = text["title"].as_str().unwrap_or_default();
                let body = text["body"].as_str().unwrap_or_default();
                outln!("title: {}", terminal::block(title.as_bytes()));
                outln!("body ({} bytes, shown as plain text):", body.len());
                outln!("{}", terminal::block(body.as_bytes()));
                let run = store.run(&row.act.run).map_err(store_err)?;
                let base = run.base_commit.unwrap_or_default();
                print_diff(&run.repo, &base, head_commit);
            }
            _ => {
                let body = row.content.as_deref().unwrap_or_default();
                let view = orchestrator::acts::body_view(body);
                outln!(
                    "content ({} bytes, {} lines, shown whole as plain text; long blank runs collapsed):",
                    view.bytes,
                    view.lines
                );
                if let Ok(run) = store.run(&row.act.run) {
                    let base = run.base_commit.unwrap_or_default();
                    let repeated = repeated_repo_lines(&run.repo, &base, body);
                    if !repeated.is_empty() {
                        outln!(
                            "WARNING: this message repeats lines of the repository's files: {}",
                            repeated
                                .iter()
                                .map(|p| terminal::line(p))
                                .collect::<Vec<_>>()
                                .join(", ")
                        );
                    }
                }
                outln!("-----");
                for line in &view.shown {
                    outln!("{}", terminal::line(line));
                }
                outln!("-----");
            }
        }
        return Ok(exit::OK);
    }
    let table: Vec<deferred_queue::ActRow> = rows
        .iter()
        .map(|r| deferred_queue::ActRow {
            act: r.act.clone(),
            state: r.state.clone(),
        })
        .collect();
    let ordered = deferred_queue::order_for_listing(&table);
    if json {
        let doc: Vec<_> = ordered
            .iter()
            .map(|r| serde_json::json!({"act": r.act, "state": r.state, "status": r.state.name()}))
            .collect();
        outln!("{}", terminal::json(&doc, true));
        return Ok(exit::OK);
    }
    // What the gate refused comes first: an attempt to reach an unconfigured
    // destination at 3 am is the first thing the owner should see.
    let refused = orchestrator::acts::refusals(&store, None).map_err(store_err)?;
    if !refused.is_empty() {
        outln!("refused door requests ({}), by run:", refused.len());
        let mut last = String::new();
        for r in &refused {
            if r.run != last {
                last = r.run.clone();
                outln!("run {}", terminal::line(&last));
            }
            outln!("  {}", refusal_line(r));
        }
        outln!();
    }
    let contents: std::collections::HashMap<&str, &Option<Vec<u8>>> = rows
        .iter()
        .map(|r| (r.act.id.as_str(), &r.content))
        .collect();
    let mut run = String::new();
    for r in ordered {
        if r.act.run != run {
            run = r.act.run.clone();
            outln!("run {}", terminal::line(&run));
        }
        let what = match (&r.act.routing.target, &r.act.content) {
            (
                deferred_queue::Target::Push { target_ref, .. },
                deferred_queue::Content::Commit { commit },
            ) => {
                let stat = store
                    .run(&r.act.run)
                    .ok()
                    .and_then(|run| {
                        orchestrator_git::diffstat_between(
                            std::path::Path::new(&run.repo),
                            run.base_commit.as_deref()?,
                            commit,
                        )
                        .ok()
                    })
                    .map(|(f, i, d)| format!(" ({f} files, +{i} -{d})"))
                    .unwrap_or_default();
                format!(
                    "push {} to {} {}{stat}",
                    terminal::line(commit.get(..12).unwrap_or(commit)),
                    terminal::line(&r.act.routing.destination),
                    terminal::line(target_ref)
                )
            }
            (deferred_queue::Target::PullRequest { base_ref, head_ref }, _) => {
                format!(
                    "pull request on {}: {} into {}",
                    terminal::line(&r.act.routing.destination),
                    terminal::line(head_ref),
                    terminal::line(base_ref)
                )
            }
            _ => {
                let preview = contents
                    .get(r.act.id.as_str())
                    .and_then(|c| c.as_deref())
                    .map(|b| terminal::line_bytes(&b[..b.len().min(60)]))
                    .unwrap_or_default();
                format!(
                    "{} to {}: {preview}",
                    terminal::line(r.act.door.name()),
                    terminal::line(&r.act.routing.destination)
                )
            }
        };
        outln!(
            "  {}  {:<10} {what}",
            terminal::line(&r.act.id),
            terminal::line(r.state.name())
        );
    }
    Ok(exit::OK)
}

/// The files of the repository at `base` that hold a distinctive line of
/// `body` (16 characters or more) (the host's git, fixed strings read from a
/// file: the body is data, never a pattern or an argument).
fn repeated_repo_lines(repo: &str, base: &str, body: &[u8]) -> Vec<String> {
    let lines = orchestrator::acts::distinctive_lines(body);
    if lines.is_empty() || base.is_empty() {
        return Vec::new();
    }
    let child = std::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        .args([
            "-c",
            "core.pager=cat",
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
    let out = child.wait_with_output();
    let Ok(out) = out else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.strip_prefix(&format!("{base}:")).unwrap_or(l).to_string())
        .take(10)
        .collect()
}

/// One refused door request on one line: when, which door, where to, and
/// the rule (or label check) that refused it.
fn refusal_line(r: &orchestrator::acts::Refusal) -> String {
    format!(
        "{}  {} to {}: {} by {}",
        terminal::line(&r.time),
        terminal::line(&r.door),
        terminal::line(r.destination.as_deref().unwrap_or("(no destination)")),
        terminal::line(&r.verdict),
        terminal::line(
            r.rule
                .as_deref()
                .unwrap_or("the door (a malformed request)")
        )
    )
}

/// The commits and diff from `from` to `to` in the host repository, as
/// escaped text (the host's git, no pager, no external diff, no textconv).
fn print_diff(repo: &str, from: &str, to: &str) {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        .args([
            "-c",
            "core.pager=cat",
            "log",
            "--no-decorate",
            "--no-color",
            "--format=commit %H%n    %s",
            &format!("{from}..{to}"),
        ])
        .output();
    if let Ok(out) = out {
        out!("{}", terminal::block(&out.stdout));
    }
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        .args([
            "-c",
            "core.pager=cat",
            "diff",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
            "--stat",
            "-p",
            from,
            to,
        ])
        .output();
    if let Ok(out) = out {
        out!("{}", terminal::block(&out.stdout));
    }
}

fn rebind_cmd(
    root: &std::path::Path,
    acts: &[String],
    key: Option<&std::path::Path>,
) -> Result<i32, i32> {
    let mut store = open_store(root)?;
    let mut code = exit::OK;
    for id in acts {
        match orchestrator::acts::rebind(&mut store, id, key) {
            Ok((_, line)) => outln!("{line}"),
            Err(e) => {
                errln!("nightshift: {e}");
                code = if e.contains("credential") || e.contains("frozen") {
                    exit::DENIED
                } else {
                    exit::FAILED
                };
            }
        }
    }
    Ok(code)
}

fn decide_cmd(
    root: &std::path::Path,
    acts: &[String],
    key: Option<&std::path::Path>,
    reject_why: Option<&str>,
) -> Result<i32, i32> {
    let mut store = open_store(root)?;
    let mut code = exit::OK;
    for id in acts {
        let result = match reject_why {
            Some(why) => orchestrator::acts::reject(&mut store, id, why, key).map(|()| {
                orchestrator::acts::Decided {
                    line: format!("act {id}: rejected"),
                    carried_out: true,
                }
            }),
            None => orchestrator::acts::approve(&mut store, id, key),
        };
        match result {
            Ok(decided) => {
                outln!("{}", decided.line);
                // An approval that was not carried out is not a success.
                if !decided.carried_out && code == exit::OK {
                    code = exit::FAILED;
                }
            }
            Err(e) => {
                errln!("nightshift: {e}");
                code = if e.contains("credential") || e.contains("frozen") {
                    exit::DENIED
                } else {
                    exit::FAILED
                };
            }
        }
    }
    Ok(code)
}
