//! `nightshift`: the command line. It parses, opens the state, calls the
//! library, prints, and maps errors to the documented exit codes.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::{Parser, Subcommand};
use orchestrator::api::{
    ActDetail, Api, ApiError, AuditState, Caller, Command as ApiCommand, KillRecord, KillTarget,
    Outcome, PolicyView, QueueView, Reply, RunView,
};
use orchestrator::engine::Engine;
use orchestrator::exit;
use orchestrator::run::{self, RunError, RunRequest, Stop, Supervisor};
use orchestrator::run_queue::{self, TaskRow, TaskSpec};
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
    /// Reject acts (needs the owner's credential); with --run, every act of
    /// that run still waiting for a person.
    Reject {
        #[arg(required_unless_present = "run", conflicts_with = "run")]
        acts: Vec<String>,
        /// Reject every pending act of this run.
        #[arg(long)]
        run: Option<String>,
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
    /// (internal) The host-side end of one sandbox's lease: kills the
    /// container when its heartbeat stops growing (see `lease.rs`).
    #[command(hide = true)]
    LeaseEnd {
        #[arg(long)]
        container: String,
        #[arg(long)]
        heartbeat: PathBuf,
        #[arg(long)]
        bound_ms: u64,
    },
    /// Find sandboxes and runs whose supervisor vanished, and settle them.
    Reconcile,
    /// Retry the import of a run whose import failed (its worktree was kept).
    Import { run: String },
    /// List and check the destinations (STATE/destinations.toml): alias,
    /// kind, URL (never a credential), readers. Exit 3 naming file, line and
    /// alias of every problem.
    Destinations {
        #[arg(long)]
        json: bool,
    },
    /// The morning summary: print it, or send it to the configured notify
    /// destination (counts and ids only).
    Summary {
        /// Send it now if runs ended since the last one sent.
        #[arg(long, conflicts_with = "due")]
        send: bool,
        /// Send it if the configured `at` time (UTC) has passed (for a timer).
        #[arg(long)]
        due: bool,
        #[arg(long)]
        json: bool,
    },
    /// End a freeze (needs the owner's credential).
    Thaw {
        #[arg(long, env = "NIGHTSHIFT_OWNER_KEY_FILE")]
        owner_key_file: Option<PathBuf>,
    },
    /// Runs, caps used against caps set, and acts grouped by door,
    /// destination and ref, refusals first (dry runs included).
    Report {
        #[arg(required = true)]
        runs: Vec<String>,
        #[arg(long, value_enum, default_value = "text")]
        format: orchestrator::report::Format,
    },
    /// Autonomy scopes: proposals from dry runs and decisions, which the owner adopts or refuses.
    Scopes {
        #[command(subcommand)]
        command: orchestrator::scopes::Command,
    },
    /// Add tasks to the run queue (one from the flags, or many from --file).
    Enqueue(EnqueueArgs),
    /// The run queue: list, cancel, or run the dispatcher in the foreground.
    Tasks {
        #[command(subcommand)]
        command: Option<TasksCommand>,
        #[arg(long)]
        json: bool,
    },
    /// The dashboard and the JSON API (/api/v1), in one long-running process.
    Serve(ServeArgs),
    /// Dashboard accounts (managed here, on the supervisor's side).
    Users {
        #[command(subcommand)]
        command: UsersCommand,
    },
}

#[derive(Debug, Subcommand)]
enum TasksCommand {
    /// Cancel a queued task.
    Cancel { task: String },
    /// Start queued tasks in order until none is queued or running (or a
    /// freeze keeps them queued); runs left going by an earlier dispatcher
    /// are adopted.
    Run {
        /// At most this many runs at once.
        #[arg(long, default_value_t = 2)]
        max_parallel: usize,
    },
}

#[derive(Debug, clap::Args)]
struct EnqueueArgs {
    /// A tasks file: `[[task]]` tables (docs/api.md), started in order.
    #[arg(long, conflicts_with_all = ["repo", "task", "task_file", "image", "command", "agent", "dry_run"])]
    file: Option<PathBuf>,
    /// A dry run: acts answered as they would have been and recorded, none
    /// queued or carried out (see docs/scopes.md).
    #[arg(long)]
    dry_run: bool,
    /// A real agent by its preset (claude-code, codex, mini-swe-agent, aider,
    /// python-sdks) instead of a command; see docs/agents.md.
    #[arg(long, conflicts_with = "command")]
    agent: Option<String>,
    /// The model the preset's agent asks the gateway for.
    #[arg(long, requires = "agent")]
    model: Option<String>,
    /// Model tokens the run may spend through the model gateway.
    #[arg(long)]
    max_tokens: Option<u64>,
    /// The repository to work on.
    #[arg(long, required_unless_present = "file")]
    repo: Option<PathBuf>,
    /// The base ref (branch, tag or commit).
    #[arg(long = "ref", default_value = "HEAD")]
    base_ref: String,
    /// A local image (default: the built default image when it starts).
    #[arg(long)]
    image: Option<String>,
    /// The task text given to the agent.
    #[arg(long, conflicts_with = "task_file")]
    task: Option<String>,
    /// Read the task text from a file (now: it is stored with the task).
    #[arg(long)]
    task_file: Option<PathBuf>,
    /// Memory cap (no swap), e.g. 256m, 2g.
    #[arg(long)]
    memory: Option<String>,
    /// CPU cap, in cores.
    #[arg(long)]
    cpus: Option<f64>,
    /// Process (and thread) cap.
    #[arg(long)]
    pids: Option<u64>,
    /// Wall-clock cap, e.g. 30s, 10m, 2h.
    #[arg(long)]
    timeout: Option<String>,
    /// Bytes of output kept.
    #[arg(long)]
    max_output: Option<String>,
    /// Disk the worktree may use.
    #[arg(long)]
    max_worktree: Option<String>,
    /// Open files per process.
    #[arg(long)]
    max_files: Option<u64>,
    /// The agent command and its arguments.
    #[arg(last = true, required_unless_present_any = ["file", "agent"])]
    command: Vec<String>,
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// The address to listen on; anything but loopback needs --insecure-network.
    #[arg(long, default_value = "127.0.0.1:8470")]
    bind: std::net::SocketAddr,
    /// Another Host name the dashboard answers to (repeatable); others are refused.
    #[arg(long = "allow-host")]
    allow_hosts: Vec<String>,
    /// Serve HTTPS: this PEM certificate chain (with --tls-key).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert (mode 0600, the supervisor's own).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serve plain HTTP on a non-loopback address (a proxy in front provides TLS).
    #[arg(long)]
    insecure_network: bool,
    /// Queued tasks (`nightshift enqueue`) run at most this many at once; 0 starts none.
    #[arg(long, default_value_t = 2)]
    max_parallel: usize,
    /// The owner's key, used only for an owner's decisions (default: STATE/owner.key).
    #[arg(long, env = "NIGHTSHIFT_OWNER_KEY_FILE")]
    owner_key_file: Option<PathBuf>,
    /// Walk the whole audit chain every this many seconds (Morning walks only new entries).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    chain_check_every: u64,
}

#[derive(Debug, Subcommand)]
enum UsersCommand {
    /// Add an account (or replace its role and password); the password is read from stdin.
    Add {
        name: String,
        #[arg(long, value_parser = ["owner", "viewer"])]
        role: String,
    },
    /// List the accounts.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Remove an account (its sessions end).
    Remove { name: String },
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
    /// Model tokens the run may spend through the model gateway.
    #[arg(long)]
    max_tokens: Option<u64>,
    #[arg(long)]
    json: bool,
    /// Answer each act as it would have been and record it with its
    /// would-be verdict; queue and carry out nothing.
    #[arg(long)]
    dry_run: bool,
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

/// The state directory, made absolute against the working directory (it is
/// mounted into sandboxes and handed to child processes, which need a
/// path that means the same from anywhere).
fn state_root(cli: &Cli) -> PathBuf {
    let root = cli.state_dir.clone().unwrap_or_else(|| {
        directories::ProjectDirs::from("", "", "nightshift")
            .map(|d| d.data_dir().to_path_buf())
            .unwrap_or_else(|| PathBuf::from(".nightshift"))
    });
    std::path::absolute(&root).unwrap_or(root)
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
    let api = Api::new(root.clone(), config.clone());
    let result = match cli.command {
        Command::Image { command } => image_cmd(&api, command).await,
        Command::Run(args) => run_cmd(&root, config.as_deref(), args).await,
        Command::Runs { json } => respond(&api, ApiCommand::Runs {}, json).await,
        Command::Show { run, json } => respond(&api, ApiCommand::Show { run }, json).await,
        Command::Audit {
            command: AuditCommand::Verify { json },
        } => respond(&api, ApiCommand::AuditVerify {}, json).await,
        Command::Demo => demo_cmd(&api, &root, config.as_deref()).await,
        Command::Owner {
            command: OwnerCommand::Init,
        } => respond(&api, ApiCommand::OwnerInit {}, false).await,
        Command::Policy(args) => policy_cmd(&api, args).await,
        Command::Freeze { why } => respond(&api, ApiCommand::Freeze { why }, false).await,
        Command::Thaw { owner_key_file } => {
            respond(&api, ApiCommand::Thaw { owner_key_file }, false).await
        }
        Command::Kill { run, all, freeze } => {
            let target = match (run, all) {
                (Some(run), _) => KillTarget::Run(run),
                (None, true) => KillTarget::All,
                (None, false) => {
                    errln!("nightshift: name a run, or --all");
                    return exit::BAD_INPUT;
                }
            };
            let by = format!(
                "{} (nightshift kill)",
                std::env::var("USER").unwrap_or_else(|_| "operator".into())
            );
            respond(&api, ApiCommand::Kill { target, freeze, by }, false).await
        }
        Command::Watchdog { supervisor } => watchdog_cmd(&api, &supervisor).await,
        Command::LeaseEnd {
            container,
            heartbeat,
            bound_ms,
        } => {
            let bound = std::time::Duration::from_millis(bound_ms);
            match connect().await {
                Ok(engine) => {
                    orchestrator::lease::end_on_lapse(&engine, &container, &heartbeat, bound).await;
                    Ok(exit::OK)
                }
                Err(code) => Err(code),
            }
        }
        Command::Reconcile => respond(&api, ApiCommand::Reconcile {}, false).await,
        Command::Import { run } => respond(&api, ApiCommand::Import { run }, false).await,
        Command::Queue {
            command: None,
            json,
        } => respond(&api, ApiCommand::Queue {}, json).await,
        Command::Queue {
            command: Some(QueueCommand::Show { act }),
            ..
        } => respond(&api, ApiCommand::QueueShow { act }, false).await,
        Command::Report { runs, format } => orchestrator::report::cli(&root, &runs, format),
        Command::Scopes { command } => orchestrator::scopes::cli(&root, command),
        Command::Approve {
            acts,
            owner_key_file,
        } => {
            let command = ApiCommand::Approve {
                acts,
                owner_key_file,
            };
            respond(&api, command, false).await
        }
        Command::Reject {
            acts,
            run,
            why,
            owner_key_file,
        } => {
            let command = match run {
                Some(run) => ApiCommand::RejectRun {
                    run,
                    why,
                    owner_key_file,
                },
                None => ApiCommand::Reject {
                    acts,
                    why,
                    owner_key_file,
                },
            };
            respond(&api, command, false).await
        }
        Command::Rebind {
            acts,
            owner_key_file,
        } => {
            let command = ApiCommand::Rebind {
                acts,
                owner_key_file,
            };
            respond(&api, command, false).await
        }
        Command::Enqueue(args) => enqueue_cmd(&api, args).await,
        Command::Tasks { command, json } => tasks_cmd(&api, command, json).await,
        Command::Destinations { json } => respond(&api, ApiCommand::Destinations {}, json).await,
        Command::Summary { send, due, json } => {
            let command = if send || due {
                ApiCommand::SummarySend { due }
            } else {
                ApiCommand::Summary {}
            };
            respond(&api, command, json).await
        }
        Command::Serve(args) => serve_cmd(&api, &root, config.as_deref(), args).await,
        Command::Users { command } => users_cmd(&api, command).await,
    };
    match result {
        Ok(code) | Err(code) => code,
    }
}

/// Prints an error of the API and gives its exit code.
fn fail(e: &ApiError) -> i32 {
    errln!("nightshift: {e}");
    e.exit_code()
}

/// One command through the API: its reply rendered, its exit code returned.
async fn respond(api: &Api, command: ApiCommand, json: bool) -> Result<i32, i32> {
    let reply = execute(api, command).await.map_err(|e| fail(&e))?;
    render(&reply, json);
    Ok(reply.exit_code())
}

/// Executes a command: a state-changing one through the running `serve`
/// of this state when one answers on its socket, else (and always with an
/// explicit `--config`, which that `serve` may not share) in this process.
async fn execute(api: &Api, command: ApiCommand) -> Result<Reply, ApiError> {
    if api.config_path().is_none() && command.goes_through_serve() {
        // The kill switch waits for no one: past this, it acts itself
        // (stopping what is already stopped is harmless).
        let bound =
            matches!(command, ApiCommand::Kill { .. }).then_some(std::time::Duration::from_secs(3));
        let sent = command.clone().absolutized();
        if let Some(answer) = orchestrator::serve::socket::send(api.root(), &sent, bound).await {
            return answer;
        }
    }
    api.execute(command).await
}

/// What the command line prints for each reply.
fn render(reply: &Reply, json: bool) {
    match reply {
        Reply::Runs { runs } => render_runs(runs, json),
        Reply::Run(view) => render_show(view, json),
        Reply::Audit(state) => render_verify(state, json),
        Reply::OwnerKey {
            path,
            created: true,
        } => outln!(
            "owner key written to {} (mode 0600); keep it to yourself",
            path.display()
        ),
        Reply::OwnerKey {
            path,
            created: false,
        } => outln!("the owner key already exists: {}", path.display()),
        Reply::Frozen => {
            outln!("frozen: no run starts and every door refuses until `nightshift thaw`")
        }
        Reply::Thawed => outln!("thawed"),
        Reply::Killed(report) => {
            outln!("killed {} sandbox(es)", report.sandboxes);
            match &report.record {
                KillRecord::Recorded { runs } => {
                    outln!("recorded the kill of {} run(s)", runs.len());
                    for r in runs {
                        outln!("  {r}");
                    }
                }
                KillRecord::Pending { why, path } => errln!(
                    "nightshift: the kill is not recorded yet ({why}); it was written to {} and the next `nightshift reconcile` (or run) records it",
                    path.display()
                ),
                KillRecord::NotRecorded(e) => errln!("nightshift: {e}"),
            }
        }
        Reply::Reconciled { settled } => {
            outln!("settled {} run(s)", settled.len());
            for r in settled {
                outln!("  {r}");
            }
        }
        Reply::Imported { run } => print_summary(run),
        Reply::Queue(view) => render_queue(view, json),
        Reply::Decisions { decisions } => {
            for d in decisions {
                match &d.outcome {
                    Outcome::Done { line, .. } => outln!("{line}"),
                    Outcome::Error(e) => errln!("nightshift: {e}"),
                }
            }
        }
        Reply::Enqueued { tasks } => {
            for t in tasks {
                outln!("queued {}", terminal::line(t));
            }
        }
        Reply::Tasks { tasks } => render_tasks(tasks, json),
        Reply::Cancelled { task } => outln!("cancelled {}", terminal::line(task)),
        Reply::Ratified { proposal } => outln!("ratified {proposal} (locked)"),
        Reply::Act {
            detail,
            expire_error,
        } => {
            if let Some(e) = expire_error {
                errln!("nightshift: {e}");
            }
            render_act(detail);
        }
        Reply::Policy(view) => render_policy(view, json),
        Reply::Explained {
            decision: Some(d), ..
        } => outln!("{}", terminal::json(d, true)),
        Reply::Explained {
            decision: None,
            refusal,
        } => outln!("{}", terminal::block(refusal.as_bytes())),
        // The hook's answer is said by `policy_check` (it fails closed).
        Reply::Hook(_) => {}
        Reply::Declared { rules } => {
            for id in rules {
                outln!("declared {id}");
            }
        }
        Reply::Proposed { proposals } => {
            for id in proposals {
                outln!("proposed {id}: inert until the owner runs `nightshift policy ratify {id}`");
            }
        }
        Reply::Unlocked { rule } => outln!("unlocked {rule}"),
        Reply::Retired { rule } => outln!("retired {rule}"),
        Reply::ImageRef { reference } => outln!("{reference}"),
        Reply::Destinations {
            path,
            listed,
            problems,
        } => render_destinations(path, listed.as_deref(), problems, json),
        Reply::Summary { summary, text } => {
            if json {
                outln!("{}", terminal::json(summary, true));
            } else {
                outln!("{}", text.trim_end());
            }
        }
        Reply::SummarySent { runs } => outln!("summary sent: {runs} runs"),
        Reply::SummarySkipped { why } => outln!("summary not sent: {why}"),
        Reply::UserSaved { name, role } => {
            outln!("account {} ({role}) saved", terminal::line(name))
        }
        Reply::Users { users } => {
            if json {
                outln!("{}", terminal::json(users, true));
            } else {
                for u in users {
                    outln!(
                        "{:<24} {:<7} {}",
                        terminal::line(&u.name),
                        u.role,
                        terminal::line(&u.created_at)
                    );
                }
            }
        }
        Reply::UserRemoved { name } => outln!("account {} removed", terminal::line(name)),
    }
}

async fn image_cmd(api: &Api, command: ImageCommand) -> Result<i32, i32> {
    let command = match command {
        ImageCommand::Ref { agent } => ApiCommand::ImageRef {
            agent: agent.map(|a| agent_preset(&a).map(|_| a)).transpose()?,
        },
        ImageCommand::Build { mirror, agent } => ApiCommand::ImageBuild {
            mirror,
            agent: agent.map(|a| agent_preset(&a).map(|_| a)).transpose()?,
        },
    };
    let reply = api
        .execute_streaming(command, &Caller::Local, &mut |line| errln!("image: {line}"))
        .await
        .map_err(|e| fail(&e))?;
    render(&reply, false);
    Ok(reply.exit_code())
}

fn agent_preset(name: &str) -> Result<image::Agent, i32> {
    image::Agent::from_name(name).map_err(|e| {
        errln!("nightshift: {e}");
        exit::USAGE
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
    orchestrator::acts::use_queue_bounds(config.queue_bounds());
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
        max_tokens: args.max_tokens.unwrap_or(defaults.max_tokens),
        fleet_max_tokens_per_night: defaults.fleet_max_tokens_per_night,
    };
    // No run asks for more than the whole fleet (see `run_queue::within_fleet`).
    let need = orchestrator::run_queue::Need {
        memory_bytes: caps.memory_bytes.max(0) as u64,
        milli_cpus: (caps.nano_cpus.max(0) / 1_000_000) as u64,
        pids: caps.pids.max(0) as u64,
    };
    if let Err(e) =
        orchestrator::run_queue::within_fleet(need, orchestrator::run_queue::fleet_need(&config))
    {
        errln!("nightshift: {e}");
        return Err(exit::BAD_INPUT);
    }
    let (preset_image, command) = match args.agent.as_deref() {
        None => (None, args.command),
        Some(name) => {
            let agent = agent_preset(name)?;
            let preset =
                orchestrator::agents::preset(agent, args.model.as_deref()).map_err(|e| {
                    errln!("nightshift: {e}");
                    exit::USAGE
                })?;
            orchestrator::agents::check_repository(agent, &args.repo, &args.base_ref).map_err(
                |e| {
                    errln!("nightshift: {e}");
                    exit::BAD_INPUT
                },
            )?;
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
        dry_run: args.dry_run,
    };
    let record = perform(root, &config, config_path, req).await?;
    if args.json {
        outln!("{}", terminal::json(&record, true));
    } else {
        print_summary(&record);
    }
    Ok(orchestrator::api::run_exit_code(&record))
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
    // Admission, as for a queued task: the fleet's processes are shared by
    // every sandbox, so this run starts only if they hold room for it.
    let fleet_pids = config.fleet().pids;
    let running = orchestrator::run_queue::running_pids(&sup.engine, &sup.state_tag, fleet_pids)
        .await
        .map_err(|e| {
            errln!("nightshift: {e}");
            exit::ENGINE
        })?;
    if let Err(e) =
        orchestrator::run_queue::admit_pids(req.caps.pids.max(0) as u64, &running, fleet_pids)
    {
        errln!("nightshift: {e}");
        return Err(exit::DENIED);
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
        orchestrator::api::run_error_exit_code(&e)
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

async fn watchdog_cmd(api: &Api, watched: &str) -> Result<i32, i32> {
    // The supervisor's own config, checked; the watchdog creates nothing, so
    // it never touches the fleet's limits.
    api.load_config().map_err(|e| fail(&e))?;
    let sup = api.stopping_supervisor().await.map_err(|e| fail(&e))?;
    orchestrator::killswitch::watchdog(&sup, watched, std::time::Duration::from_millis(500))
        .await
        .map(|()| exit::OK)
        .map_err(|e| {
            errln!("nightshift: watchdog: {e}");
            exit::INTERNAL
        })
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

fn render_runs(runs: &[RunRecord], json: bool) {
    if json {
        outln!("{}", terminal::json(&runs, true));
        return;
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
}

fn render_show(view: &RunView, json: bool) {
    let RunView {
        run,
        audit: entries,
        refusals: refused,
    } = view;
    let model_calls: Vec<(u64, serde_json::Value)> = entries
        .iter()
        .filter(|e| e.kind == "model_call")
        .map(|e| (e.seq, serde_json::Value::Object(e.body.clone())))
        .collect();
    let model = orchestrator::gateway::summarize(model_calls.iter().map(|(_, b)| b));
    if json {
        let doc = serde_json::json!({
            "run": run,
            "model": model,
            "audit": entries.iter().map(|e| serde_json::json!({
                "seq": e.seq, "time": e.time, "kind": e.kind, "body": e.body, "hash": e.hash,
            })).collect::<Vec<_>>(),
        });
        outln!("{}", terminal::json(&doc, true));
        return;
    }
    print_summary(run);
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
    if !refused.is_empty() {
        outln!("  refused door requests ({}):", refused.len());
        for r in refused {
            outln!("    {}", refusal_line(r));
        }
    }
    if model.calls > 0 {
        outln!(
            "  model calls: {} ({} refused, {} without usage); tokens {} of {} (input {}, output {}, cached {})",
            model.calls,
            model.refused,
            model.without_usage,
            model.charged_tokens,
            model
                .token_cap
                .map(|c| c.to_string())
                .unwrap_or_else(|| "-".into()),
            model.input_tokens,
            model.output_tokens,
            model.cached_tokens
        );
        for (seq, b) in &model_calls {
            let text = |k: &str| terminal::line(b[k].as_str().unwrap_or("-"));
            let num = |k: &str| {
                b[k].as_u64()
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "-".into())
            };
            outln!(
                "    #{} {} {} {}{} {} {}: in {} out {} cached {}, charged {}, {} ms, label {}",
                seq,
                text("endpoint"),
                text("model"),
                text("shape"),
                if b["stream"].as_bool() == Some(true) {
                    " (stream)"
                } else {
                    ""
                },
                num("status"),
                text("outcome"),
                num("input_tokens"),
                num("output_tokens"),
                num("cached_tokens"),
                num("charged_tokens"),
                num("latency_ms"),
                text("label")
            );
        }
    }
    if let Some(last) = entries.last() {
        outln!(
            "  audit: {} entries, last #{} {}",
            entries.len(),
            last.seq,
            terminal::line(&last.hash)
        );
    }
}

fn render_verify(state: &AuditState, json: bool) {
    match state {
        AuditState::Intact {
            entries,
            checkpoints,
            head,
        } => {
            if json {
                outln!(
                    "{}",
                    terminal::json(
                        &serde_json::json!({"intact": true, "entries": entries, "checkpoints": checkpoints, "head": head}),
                        false
                    )
                );
            } else {
                outln!(
                    "audit chain intact: {} entries, {} checkpoints, head {}",
                    entries,
                    checkpoints,
                    head
                );
            }
        }
        AuditState::Broken {
            first_bad_entry,
            error,
        } => {
            if json {
                outln!(
                    "{}",
                    terminal::json(
                        &serde_json::json!({"intact": false, "first_bad_entry": first_bad_entry, "error": error}),
                        false
                    )
                );
            } else {
                outln!("audit chain broken: {}", terminal::line(error));
            }
        }
    }
}

async fn enqueue_cmd(api: &Api, args: EnqueueArgs) -> Result<i32, i32> {
    let tasks = match args.file {
        Some(file) => run_queue::read_task_file(&file).map_err(|e| fail(&e))?,
        None => vec![TaskSpec {
            repo: args.repo.unwrap_or_default(),
            base_ref: args.base_ref,
            image: args.image,
            task: args.task,
            task_file: args.task_file,
            memory: args.memory,
            cpus: args.cpus,
            pids: args.pids,
            timeout: args.timeout,
            max_output: args.max_output,
            max_worktree: args.max_worktree,
            max_files: args.max_files,
            max_tokens: args.max_tokens,
            agent: args.agent,
            model: args.model,
            dry_run: args.dry_run,
            command: args.command,
        }],
    };
    respond(api, ApiCommand::Enqueue { tasks }, false).await
}

async fn tasks_cmd(api: &Api, command: Option<TasksCommand>, json: bool) -> Result<i32, i32> {
    match command {
        None => respond(api, ApiCommand::Tasks {}, json).await,
        Some(TasksCommand::Cancel { task }) => {
            respond(api, ApiCommand::CancelTask { task }, false).await
        }
        Some(TasksCommand::Run { max_parallel }) => dispatch_cmd(api, max_parallel).await,
    }
}

/// `tasks run`: the dispatcher in the foreground. SIGINT / SIGTERM stop it
/// from starting more; the runs it started go on and the next dispatcher
/// adopts them.
async fn dispatch_cmd(api: &Api, max_parallel: usize) -> Result<i32, i32> {
    let exe = std::env::current_exe().map_err(|e| {
        errln!("nightshift: finding my own executable to start runs: {e}");
        exit::INTERNAL
    })?;
    let (tx, rx) = tokio::sync::watch::channel(false);
    let signal = Arc::new(Mutex::new(None));
    let seen = signal.clone();
    let signals = tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return;
        };
        let code = tokio::select! {
            _ = int.recv() => exit::SIGINT,
            _ = term.recv() => exit::SIGTERM,
        };
        *seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(code);
        let _ = tx.send(true);
    });
    let options = run_queue::DispatchOptions {
        max_parallel,
        runner: run_queue::Runner::Child { exe },
        poll: std::time::Duration::from_millis(500),
        until_empty: true,
    };
    let summary = run_queue::dispatch_loop(api, &options, rx).await;
    signals.abort();
    let summary = summary.map_err(|e| fail(&e))?;
    for id in &summary.adopted {
        outln!("adopted {}", terminal::line(id));
    }
    for id in &summary.started {
        outln!("started {}", terminal::line(id));
    }
    for (id, state) in &summary.settled {
        outln!("{} {}", terminal::line(state.name()), terminal::line(id));
    }
    if summary.stopped {
        outln!(
            "stopped: {} task(s) still queued; runs under way go on and the next `nightshift tasks run` adopts them",
            summary.left_queued
        );
        let code = *signal.lock().unwrap_or_else(|p| p.into_inner());
        return Ok(code.unwrap_or(exit::SIGINT));
    }
    if let Some(why) = &summary.frozen {
        errln!(
            "nightshift: frozen ({}): {} task(s) stay queued until `nightshift thaw`",
            terminal::line(why),
            summary.left_queued
        );
        return Ok(exit::DENIED);
    }
    Ok(exit::OK)
}

fn render_tasks(tasks: &[TaskRow], json: bool) {
    if json {
        outln!("{}", terminal::json(&tasks, true));
        return;
    }
    outln!(
        "{:<31}  {:<9}  {:<26}  {:<24}  REPO",
        "ID",
        "STATE",
        "RUN",
        "STATUS"
    );
    for t in tasks {
        let status = t
            .progress
            .status
            .as_deref()
            .or(t.progress.reason.as_deref())
            .unwrap_or("-");
        outln!(
            "{:<31}  {:<9}  {:<26}  {:<24}  {} at {}",
            terminal::line(&t.id),
            t.state.name(),
            terminal::line(t.progress.run.as_deref().unwrap_or("-")),
            truncate(&terminal::line(status), 24),
            terminal::line(&t.spec.repo.to_string_lossy()),
            terminal::line(&t.spec.base_ref)
        );
    }
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

async fn demo_cmd(
    api: &Api,
    root: &std::path::Path,
    config_path: Option<&std::path::Path>,
) -> Result<i32, i32> {
    let config = load_config(root, config_path)?;
    orchestrator::acts::use_queue_ttls(config.queue_ttls());
    orchestrator::acts::use_queue_bounds(config.queue_bounds());
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
    let build = ApiCommand::ImageBuild {
        mirror: image::DEFAULT_MIRROR.into(),
        agent: None,
    };
    let reference = match api
        .execute_streaming(build, &Caller::Local, &mut |line| errln!("image: {line}"))
        .await
    {
        Ok(Reply::ImageRef { reference }) => reference,
        Ok(other) => {
            errln!("nightshift: building the image answered {other:?}");
            return Err(exit::INTERNAL);
        }
        Err(e) => return Err(fail(&e)),
    };
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
        dry_run: false,
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
    Ok(orchestrator::api::run_exit_code(&record))
}

fn read_stdin_bytes() -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    // One byte past the hook's limit is enough to know it is over.
    std::io::stdin()
        .take(policies::hook::MAX_HOOK_INPUT as u64 + 1)
        .read_to_end(&mut buf)?;
    Ok(buf)
}

/// `policy check`: fails closed. Any failure, including a panic, is exit 2
/// with the reason on stderr; so is no answer within
/// [`orchestrator::policy::HOOK_BOUND`] (a locked or slow state): a timer
/// thread claims the answer and exits 2 unless the check claimed it first.
/// It never makes a state: without one it refuses, naming how to make one
/// (the decision itself is `Api::policy_check`).
fn policy_check(api: &Api, rules: Option<&std::path::Path>, args: &CheckArgs) -> i32 {
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
        if args.args_json != "-" {
            return Err(format!(
                "--args-json {}: only - (stdin) is supported",
                args.args_json
            ));
        }
        let stdin = read_stdin_bytes().map_err(|e| format!("reading stdin: {e}"))?;
        api.policy_check(rules, args.actor.as_deref(), &args.tool, &stdin)
            .map_err(|e| e.message)
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

async fn policy_cmd(api: &Api, args: PolicyArgs) -> Result<i32, i32> {
    let rules = args.rules;
    let command = match args.command {
        PolicyCommand::Check(check) => return Ok(policy_check(api, rules.as_deref(), &check)),
        PolicyCommand::Explain(check) => {
            let input = read_stdin_bytes().map_err(|e| {
                errln!("nightshift: reading stdin: {e}");
                exit::BAD_INPUT
            })?;
            ApiCommand::PolicyExplain {
                rules,
                actor: check.actor,
                tool: check.tool,
                input,
            }
        }
        PolicyCommand::List { json, actor } => {
            return respond(api, ApiCommand::PolicyList { rules, actor }, json).await
        }
        PolicyCommand::Declare {
            file,
            actor,
            owner_key_file,
        } => ApiCommand::PolicyDeclare {
            rules,
            file,
            actor,
            owner_key_file,
        },
        PolicyCommand::Unlock {
            rule,
            owner_key_file,
        } => ApiCommand::PolicyUnlock {
            rules,
            rule,
            owner_key_file,
        },
        PolicyCommand::Propose {
            file,
            actor,
            retire,
            why,
        } => ApiCommand::PolicyPropose {
            rules,
            file,
            actor,
            retire,
            why,
        },
        PolicyCommand::Ratify {
            proposal,
            owner_key_file,
        } => ApiCommand::Ratify {
            proposal,
            owner_key_file,
            rules,
        },
        PolicyCommand::Retire {
            rule,
            why,
            actor,
            owner_key_file,
        } => ApiCommand::PolicyRetire {
            rules,
            rule,
            why,
            actor,
            owner_key_file,
        },
    };
    respond(api, command, false).await
}

fn render_policy(view: &PolicyView, json: bool) {
    if json {
        let doc = serde_json::json!({
            "generation": view.generation,
            "frozen": view.frozen.as_ref().map(|(reason, _)| reason),
            // `locked` is the lock state now (ratified rules are locked), not as declared.
            "active": view.active,
            "pending": view.pending.iter().map(|(id, _)| id).collect::<Vec<_>>(),
            // The rules that bind the hook's tool calls (of `--actor`, if given).
            "hook": {
                "actor": view.actor,
                "binding": view.binding,
            },
        });
        outln!("{}", terminal::json(&doc, true));
        return;
    }
    outln!("generation {}", view.generation);
    if let Some((reason, authority)) = &view.frozen {
        outln!(
            "FROZEN: {} ({})",
            terminal::line(reason),
            terminal::line(authority)
        );
    }
    for v in &view.active {
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
    for (id, author) in &view.pending {
        outln!(
            "pending proposal {} by {}",
            terminal::line(id),
            terminal::line(author)
        );
    }
    let whose = view
        .actor
        .as_deref()
        .map(|a| format!("actor {}'s", terminal::line(a)))
        .unwrap_or_else(|| "any actor's".to_string());
    if view.binding.is_empty() {
        outln!("hook: no rule binds {whose} tool calls: `policy check` allows every one");
    } else {
        outln!(
            "hook: {} rule(s) bind {whose} tool calls: {}",
            view.binding.len(),
            terminal::line(&view.binding.join(", "))
        );
    }
}

/// `queue show ACT`: the act in full, as `Api` gives it.
fn render_act(d: &ActDetail) {
    outln!(
        "act {} ({}), run {}: {}",
        terminal::line(&d.act.id),
        terminal::line(d.act.door.name()),
        terminal::line(&d.act.run),
        terminal::line(d.state.name())
    );
    outln!(
        "destination: {}",
        terminal::line(&d.act.routing.destination)
    );
    if let Some(stale) = &d.stale {
        outln!("stale: {}", terminal::block(stale.why.as_bytes()));
        if let Some(orchestrator::api::Lease { bound, now }) = &stale.lease {
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
                d.act.id
            ),
        }
    }
    match (&d.act.routing.target, &d.act.content) {
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
            match &d.gained {
                Some((now, Some(stat))) => {
                    outln!("from the remote's new {now} to this act's commit:");
                    out!("{}", terminal::block(stat));
                }
                Some((_, None)) => outln!(
                    "  (the remote's new commit is not in the repository: fetch it to see what changed)"
                ),
                None => {}
            }
            print_diff(d);
        }
        (
            deferred_queue::Target::PullRequest { base_ref, head_ref },
            deferred_queue::Content::PullRequest { head_commit, .. },
        ) => {
            outln!(
                "pull request from {head_ref} at {head_commit} into {base_ref} (the head branch is pushed there first, fast-forward only, if it does not hold that commit)"
            );
            let text: serde_json::Value =
                serde_json::from_slice(d.content.as_deref().unwrap_or_default())
                    .unwrap_or_default();
            let title = text["title"].as_str().unwrap_or_default();
            let body = text["body"].as_str().unwrap_or_default();
            outln!("title: {}", terminal::block(title.as_bytes()));
            outln!("body ({} bytes, shown as plain text):", body.len());
            outln!("{}", terminal::block(body.as_bytes()));
            print_diff(d);
        }
        _ => {
            if let Some(view) = &d.body {
                outln!(
                    "content ({} bytes, {} lines, shown whole as plain text; long blank runs collapsed):",
                    view.bytes,
                    view.lines
                );
                if !d.repeated.is_empty() {
                    outln!(
                        "WARNING: this message repeats lines of the repository's files: {}",
                        d.repeated
                            .iter()
                            .map(|p| terminal::line(p))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                outln!("-----");
                for line in &view.shown {
                    outln!("{}", terminal::line(line));
                }
                outln!("-----");
            }
        }
    }
}

/// The commits the act would publish that the destination lacks, then the
/// diff from the run's base to the act's commit, escaped.
fn print_diff(d: &ActDetail) {
    match &d.publishes {
        Some(p) => {
            outln!(
                "commits it would publish ({}, {}):",
                p.count,
                terminal::line(&p.against)
            );
            out!("{}", terminal::block(&p.log));
            let listed = p.count.min(orchestrator::acts::MAX_LISTED_COMMITS);
            if p.count > listed {
                outln!("... and {} more commits", p.count - listed);
            }
        }
        None => {
            outln!("commits after the run's base (what it would publish could not be listed):");
            if let Some(log) = &d.log {
                out!("{}", terminal::block(log));
            }
        }
    }
    if let Some(diff) = &d.diff {
        out!("{}", terminal::block(diff));
    }
}

fn render_queue(view: &QueueView, json: bool) {
    if let Some(e) = &view.expire_error {
        errln!("nightshift: {e}");
    }
    if json {
        let doc: Vec<_> = view
            .acts
            .iter()
            .map(|r| serde_json::json!({"act": r.act, "state": r.state, "status": r.status}))
            .collect();
        outln!("{}", terminal::json(&doc, true));
        return;
    }
    // What the gate refused comes first: an attempt to reach an unconfigured
    // destination at 3 am is the first thing the owner should see.
    let refused = &view.refusals;
    if !refused.is_empty() {
        outln!("refused door requests ({}), by run:", refused.len());
        let mut last = String::new();
        for r in refused {
            if r.run != last {
                last = r.run.clone();
                outln!("run {}", terminal::line(&last));
            }
            outln!("  {}", refusal_line(r));
        }
        outln!();
    }
    let mut run = String::new();
    for r in &view.acts {
        if r.act.run != run {
            run = r.act.run.clone();
            outln!("run {}", terminal::line(&run));
        }
        let what = match (&r.act.routing.target, &r.act.content) {
            (
                deferred_queue::Target::Push { target_ref, .. },
                deferred_queue::Content::Commit { commit },
            ) => {
                let stat = r
                    .diffstat
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
                let preview = r
                    .preview
                    .as_deref()
                    .map(terminal::line_bytes)
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
            terminal::line(&r.status)
        );
    }
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

fn render_destinations(
    path: &std::path::Path,
    listed: Option<&[serde_json::Value]>,
    problems: &[String],
    json: bool,
) {
    for p in problems {
        errln!("nightshift: {}", terminal::line(p));
    }
    if !problems.is_empty() {
        return;
    }
    let Some(listed) = listed else {
        if json {
            outln!("[]");
        } else {
            outln!("no destinations: {} does not exist", path.display());
        }
        return;
    };
    if json {
        outln!("{}", terminal::json(&listed, true));
        return;
    }
    outln!(
        "{:<20}  {:<8}  {:<8}  {:<8}  URL",
        "ALIAS",
        "TABLE",
        "KIND",
        "READERS"
    );
    let text = |v: &serde_json::Value, k: &str| v[k].as_str().unwrap_or_default().to_string();
    for l in listed {
        outln!(
            "{:<20}  {:<8}  {:<8}  {:<8}  {}",
            terminal::line(&text(l, "alias")),
            text(l, "table"),
            terminal::line(&text(l, "kind")),
            text(l, "readers"),
            terminal::line(&text(l, "url"))
        );
    }
}

/// `nightshift serve`: the dashboard and JSON API (orchestrator::serve),
/// with one watchdog for the whole process.
async fn serve_cmd(
    api: &Api,
    root: &std::path::Path,
    config_path: Option<&std::path::Path>,
    args: ServeArgs,
) -> Result<i32, i32> {
    let config = load_config(root, config_path)?;
    orchestrator::acts::use_queue_ttls(config.queue_ttls());
    orchestrator::acts::use_queue_bounds(config.queue_bounds());
    open_store(root)?;
    let identity = orchestrator::run::process_identity(std::process::id())
        .unwrap_or_else(|| format!("{}:0", std::process::id()));
    spawn_watchdog(root, config_path, &identity);
    // Checked when the configuration was read; a second look costs nothing.
    let front = config.front().map_err(|e| {
        errln!("nightshift: {e}");
        exit::BAD_INPUT
    })?;
    let opts = orchestrator::serve::ServeOptions {
        front,
        config: config_path.map(std::path::Path::to_path_buf),
        bind: args.bind,
        allow_hosts: args.allow_hosts,
        insecure_network: args.insecure_network,
        owner_key: args
            .owner_key_file
            .unwrap_or_else(|| root.join("owner.key")),
        chain_every: std::time::Duration::from_secs(args.chain_check_every),
        tls: match (args.tls_cert, args.tls_key) {
            (Some(cert), Some(key)) => Some(orchestrator::serve::TlsFiles { cert, key }),
            _ => None,
        },
    };
    // The run queue's dispatcher runs beside the pages, on this runtime,
    // until the server stops; its runs are then stopped and waited for.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let dispatcher = async {
        if args.max_parallel == 0 {
            return;
        }
        // Runs in this process, with this process's identity on every
        // sandbox: the one watchdog above covers them all.
        let sup = match api.creating_supervisor(&config).await {
            Ok(sup) => sup,
            Err(e) => {
                errln!(
                    "nightshift serve: no dispatcher ({})",
                    terminal::line(&e.to_string())
                );
                return;
            }
        };
        let runner = orchestrator::task_runner::InProcess {
            sup,
            config: config.clone(),
        };
        let options = run_queue::DispatchOptions {
            max_parallel: args.max_parallel,
            runner: run_queue::Runner::InProcess(Arc::new(runner)),
            poll: std::time::Duration::from_millis(500),
            until_empty: false,
        };
        if let Err(e) = run_queue::dispatch_loop(api, &options, stopped).await {
            errln!(
                "nightshift serve: the run queue's dispatcher stopped: {}",
                terminal::line(&e.to_string())
            );
        }
    };
    let scheme = if opts.tls.is_some() { "https" } else { "http" };
    let server = async {
        let served = orchestrator::serve::serve(root.to_path_buf(), opts, |addr| {
            outln!("nightshift serve: listening on {scheme}://{addr}")
        })
        .await;
        let _ = stop.send(true);
        served
    };
    let (served, ()) = tokio::join!(server, dispatcher);
    served.map(|()| exit::OK).map_err(|e| {
        errln!("nightshift: {e}");
        match e {
            orchestrator::serve::ServeError::Bind(_) => exit::BAD_INPUT,
            orchestrator::serve::ServeError::Store(_) => exit::STATE,
            _ => exit::INTERNAL,
        }
    })
}

/// `nightshift users`: dashboard accounts; a password only ever from stdin.
async fn users_cmd(api: &Api, command: UsersCommand) -> Result<i32, i32> {
    let (command, json) = match command {
        UsersCommand::Add { name, role } => {
            let mut password = String::new();
            std::io::stdin()
                .read_to_string(&mut password)
                .map_err(|e| {
                    errln!("nightshift: reading the password from stdin: {e}");
                    exit::BAD_INPUT
                })?;
            let password = password
                .strip_suffix('\n')
                .map(|p| p.strip_suffix('\r').unwrap_or(p))
                .unwrap_or(&password)
                .to_string();
            let password = orchestrator::api::Secret(password);
            (
                ApiCommand::UsersAdd {
                    name,
                    role,
                    password,
                },
                false,
            )
        }
        UsersCommand::List { json } => (ApiCommand::UsersList {}, json),
        UsersCommand::Remove { name } => (ApiCommand::UsersRemove { name }, false),
    };
    respond(api, command, json).await
}
