//! `nightshift`: the command line. It parses, builds the ports once (the
//! store from `--store`, the engine for `lease-end`), calls the library
//! (the command API, `orchestrator::commands` for the commands that are
//! more than one API command, `orchestrator::demo`), prints, and maps
//! errors to the documented exit codes by their kind. Product logic lives
//! in the library crates.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::{Parser, Subcommand};
use orchestrator::api::{
    ActDetail, Api, ApiError, AuditState, Caller, Command as ApiCommand, KillRecord, KillTarget,
    Outcome, PolicyView, QueueView, Reply, RunView,
};
use orchestrator::commands;
use orchestrator::engine::Engine;
use orchestrator::exit;
use orchestrator::run_queue::{self, TaskRow, TaskSpec};
use orchestrator::state_store::{RunRecord, StoreUrl, Stores};
use orchestrator::store::SqliteBackend;
use orchestrator::terminal;
use orchestrator::{demo, image};

mod fast;

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
    /// Where the state store is: `sqlite:` (in the state directory, the
    /// default), `sqlite:DIR`, or `postgres://…`.
    #[arg(long, global = true, env = "NIGHTSHIFT_STORE")]
    store: Option<String>,
    /// A file holding the store's URL (a secret: the URL may hold a
    /// password), read when no --store is given.
    #[arg(long, global = true, env = "NIGHTSHIFT_STORE_FILE")]
    store_file: Option<PathBuf>,
    /// The container engine: `docker` (the default) or `podman` (rootful,
    /// nightshift's own service: scripts/podman.sh; docs/engines.md); else
    /// the configuration's `[engine] kind`. `kubernetes` refuses every run,
    /// saying what is missing (docs/kubernetes.md).
    #[arg(long, global = true, env = "NIGHTSHIFT_ENGINE", value_parser = ["docker", "podman", "kubernetes"])]
    engine: Option<String>,
    /// The OCI runtime sandboxes run with: `runsc` (gVisor, on Podman:
    /// docs/engines.md) or `runc`; else the configuration's `[sandbox]
    /// runtime`, else the engine's default. It must agree with the
    /// configuration's, which the attestation then requires.
    #[arg(long, global = true, env = "NIGHTSHIFT_RUNTIME", value_parser = ["runc", "runsc"])]
    runtime: Option<String>,
    /// Hosted mode (set in the service image): `serve` and `worker` refuse
    /// to start on a configuration a hosted deployment must not have
    /// (docs/hosted.md).
    #[arg(long, global = true, env = "NIGHTSHIFT_HOSTED", value_parser = clap::builder::FalseyValueParser::new())]
    hosted: bool,
    /// How the log on stderr is written: text for a person, json (one
    /// object a line) for a collector; what is logged is set by NIGHTSHIFT_LOG.
    #[arg(
        long,
        global = true,
        env = "NIGHTSHIFT_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum SetupCmd {
    /// Every cache entry: repository, key, size, when and on what it was built.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Remove cache entries: past the newest N of each repository, or older
    /// than a duration (each repository's newest N always stay).
    Prune {
        #[arg(long)]
        keep: Option<usize>,
        #[arg(long, value_parser = span_arg)]
        older_than: Option<std::time::Duration>,
        #[arg(long)]
        json: bool,
    },
}

/// Sandboxes as Kubernetes Pods (docs/kubernetes.md).
#[derive(Debug, Subcommand)]
enum KubeCmd {
    /// The Pod and the namespace's deny-all NetworkPolicy nightshift creates
    /// for a run, as a YAML stream of JSON documents (`kubectl apply -f -`,
    /// `podman kube play`).
    Pod(Box<KubePodArgs>),
    /// Judges a Pod as the cluster returned it (`kubectl get pod -o json`)
    /// against the Pod the same arguments make and the namespace's policies
    /// (`kubectl get networkpolicy -o json`): every property, and exit 6
    /// when one fails (docs/kubernetes.md).
    Attest(Box<KubeAttestArgs>),
    /// nightshift's seccomp profile: install it on every node as
    /// `<kubelet seccomp root>/nightshift-sandbox.json`.
    SeccompProfile,
}

#[derive(Debug, clap::Args)]
struct KubeAttestArgs {
    /// The Pod as the cluster returned it, JSON (at most 4 MiB).
    #[arg(long)]
    observed: PathBuf,
    /// The namespace's NetworkPolicies, JSON (a list or one policy).
    #[arg(long)]
    policies: Option<PathBuf>,
    #[command(flatten)]
    plan: KubePodArgs,
}

#[derive(Debug, clap::Args)]
struct KubePodArgs {
    /// The run's id (a DNS label: lowercase letters, digits and '-').
    #[arg(long)]
    run_id: String,
    #[arg(long)]
    image: String,
    #[arg(long, default_value = "nightshift-sandboxes")]
    namespace: String,
    /// The worker that owns the Pod (its sweep after a crash removes only its own).
    #[arg(long, default_value = "nightshift")]
    owner: String,
    /// `Never` for images loaded on the nodes, else `IfNotPresent` or `Always`.
    #[arg(long, default_value = "IfNotPresent")]
    image_pull_policy: String,
    /// A RuntimeClass the Pod must run under (`gvisor`).
    #[arg(long)]
    runtime_class: Option<String>,
    /// Memory cap, bytes.
    #[arg(long, default_value_t = 2 << 30)]
    memory: i64,
    /// CPU cap, millicores.
    #[arg(long, default_value_t = 2000)]
    cpu_millis: i64,
    /// Wall cap, seconds (`activeDeadlineSeconds`).
    #[arg(long, default_value_t = 4 * 3600)]
    wall_seconds: i64,
    /// The worktree volume's size cap, bytes.
    #[arg(long, default_value_t = 2 << 30)]
    max_worktree: i64,
    /// Each tmpfs volume's size, bytes.
    #[arg(long, default_value_t = 256 << 20)]
    tmpfs: i64,
    /// `KEY=VALUE` for the agent's environment (repeatable).
    #[arg(long = "env")]
    env: Vec<String>,
    /// Print the agent-sandbox project's `Sandbox` resource
    /// (`agents.x-k8s.io/v1alpha1`, the Pod as its template) in place of
    /// the Pod, for a cluster that runs its controller (`kube pod` only).
    #[arg(long = "as-sandbox-resource")]
    as_sandbox_resource: bool,
    /// The agent's command.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Sandboxes as Kubernetes Pods: the Pod spec and the nodes' seccomp
    /// profile (docs/kubernetes.md).
    Kube {
        #[command(subcommand)]
        command: KubeCmd,
    },
    /// The default sandbox image.
    Image {
        #[command(subcommand)]
        command: ImageCommand,
    },
    /// One run in the foreground.
    Run(RunArgs),
    /// The setup phase's caches (docs/setup.md).
    Setup {
        #[command(subcommand)]
        command: SetupCmd,
    },
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
    /// The state store (`--store`).
    Store {
        #[command(subcommand)]
        command: StoreCommand,
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
    /// Approve acts (needs the owner's credential); each is re-checked and carried
    /// out by the running `serve`'s executor, or at once by this command when none runs.
    Approve {
        #[arg(required = true)]
        acts: Vec<String>,
        #[arg(long, env = "NIGHTSHIFT_OWNER_KEY_FILE")]
        owner_key_file: Option<PathBuf>,
    },
    /// Run the queue's tasks and carry out approved acts, without the pages
    /// (`serve` without its dashboard): one of several workers sharing one
    /// store. Runs until SIGINT or SIGTERM, then ends its runs.
    Worker {
        /// At most this many of the queue's runs at once (counting every
        /// worker's, as the fleet's caps do).
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=1024))]
        max_parallel: u64,
        /// The length of its leases on its tasks, seconds: how long the
        /// tasks of a worker that died wait before another takes them over.
        #[arg(long, default_value_t = orchestrator::run_queue::TASK_LEASE_SECS,
              value_parser = clap::value_parser!(i64).range(1..=3600))]
        task_lease_secs: i64,
    },
    /// Carry out approved acts: one executor pass over what is executable
    /// now, or with --watch until stopped (what `serve` runs in a task).
    Execute {
        /// Keep going: pass again when woken by the next retry's time or
        /// every two seconds.
        #[arg(long)]
        watch: bool,
        /// The length of the executor's leases on acts, seconds.
        #[arg(long, default_value_t = orchestrator::acts::executor::LEASE_SECS,
              value_parser = clap::value_parser!(i64).range(1..=3600))]
        lease_secs: i64,
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
    /// Retry the import of a run whose import failed (its worktree was kept),
    /// or import the worktree this state kept of a run another worker
    /// settled as lost.
    Import { run: String },
    /// List and check the destinations (STATE/destinations.toml): alias,
    /// kind, URL (never a credential), readers. Exit 3 naming file, line and
    /// alias of every problem.
    Destinations {
        #[arg(long)]
        json: bool,
        /// Also ask each remote and forge whether it accepts the credential
        /// (a ref listing, an authenticated read), changing nothing.
        #[arg(long)]
        probe: bool,
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
    /// Continue a run its token, time, output or worktree cap ended: a new
    /// task from its result ref, with the same task and agent and these
    /// caps (the others as before); any other run is refused, saying why.
    Continue {
        run: String,
        /// Model tokens the continuation may spend.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        max_tokens: Option<u64>,
        /// Its wall-clock cap, e.g. 30m, 2h.
        #[arg(long)]
        timeout: Option<String>,
        #[arg(long)]
        json: bool,
    },
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
        /// At most this many of the queue's runs at once (counting every
        /// dispatcher's, as the fleet's caps do).
        #[arg(long, default_value_t = 2)]
        max_parallel: usize,
        /// The length of this dispatcher's leases on its tasks, seconds: how
        /// long the tasks of a dispatcher that died wait before another
        /// takes them over.
        #[arg(long, default_value_t = orchestrator::run_queue::TASK_LEASE_SECS,
              value_parser = clap::value_parser!(i64).range(1..=3600))]
        lease_secs: i64,
    },
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("task_text").args(["task", "task_file"])))]
struct EnqueueArgs {
    /// A tasks file: `[[task]]` tables (docs/api.md), started in order.
    #[arg(long, conflicts_with_all = ["repo", "task", "task_file", "image", "command", "agent", "dry_run"])]
    file: Option<PathBuf>,
    /// A dry run: acts answered as they would have been and recorded, none
    /// queued or carried out (see docs/scopes.md).
    #[arg(long)]
    dry_run: bool,
    /// A real agent by its preset (claude-code, codex, mini-swe-agent, aider,
    /// python-sdks) instead of a command; see docs/agents.md. It needs
    /// --task or --task-file: the task is what the agent is asked to do.
    #[arg(long, conflicts_with = "command", requires = "task_text")]
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
    /// The length of the run queue's leases on the tasks this serve runs,
    /// seconds: how long the tasks of a serve that died wait before
    /// another dispatcher takes them over.
    #[arg(long, default_value_t = orchestrator::run_queue::TASK_LEASE_SECS,
          value_parser = clap::value_parser!(i64).range(1..=3600))]
    task_lease_secs: i64,
    /// The owner's key, used only for an owner's decisions (default: STATE/owner.key).
    #[arg(long, env = "NIGHTSHIFT_OWNER_KEY_FILE")]
    owner_key_file: Option<PathBuf>,
    /// Walk the whole audit chain every this many seconds (Morning walks only new entries).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    chain_check_every: u64,
    /// Also serve the Prometheus metrics (`/metrics`, and nothing else)
    /// without authentication on this address of their own; a non-loopback
    /// address needs --insecure-network. On the dashboard's own address
    /// `/metrics` needs a session, as every page.
    #[arg(long)]
    metrics_addr: Option<std::net::SocketAddr>,
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
        #[arg(long, conflicts_with_all = ["service", "postgres"])]
        agent: Option<String>,
        /// Toolchains from Debian's packages on top (rust, python, node),
        /// comma-separated: the image `run --with` and `--image` take.
        #[arg(long, conflicts_with_all = ["service", "postgres"])]
        with: Option<String>,
        /// Build the service image instead (this binary, run as `serve` or
        /// `worker`, hosted; see docs/hosted.md).
        #[arg(long, conflicts_with = "postgres")]
        service: bool,
        /// Build the PostgreSQL image of deploy/compose.yaml instead.
        #[arg(long)]
        postgres: bool,
    },
    /// Print the default image's reference (or an agent image's, with
    /// --agent; with toolchains, with --with).
    Ref {
        #[arg(long)]
        agent: Option<String>,
        #[arg(long)]
        with: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum StoreCommand {
    /// Bring the store's schema up to this release's version (made when
    /// absent); a store made by a newer release is refused, left as it is.
    Migrate,
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// Exit 0 when the chain is intact; otherwise exit 1 naming the first bad entry.
    Verify {
        #[arg(long)]
        json: bool,
    },
    /// Write the chain to stdout, one entry a line (docs/audit-export.md).
    Export {
        /// Only entries from this seq on, or at or after this RFC 3339 time.
        #[arg(long, value_parser = commands::audit_export::parse_since)]
        since: Option<commands::audit_export::Since>,
        /// jsonl (docs/audit-export.schema.json) or ocsf (OCSF 1.1.0).
        #[arg(long, default_value = "jsonl", value_parser = parse_export_format)]
        format: commands::audit_export::Format,
    },
}

fn parse_export_format(text: &str) -> Result<commands::audit_export::Format, String> {
    text.parse()
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("task_text").args(["task", "task_file"])))]
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
    /// and environment; see docs/agents.md. It needs --task or
    /// --task-file: the task is what the agent is asked to do.
    #[arg(long, conflicts_with = "command", requires = "task_text")]
    agent: Option<String>,
    /// The model the preset's agent asks the gateway for.
    #[arg(long, requires = "agent")]
    model: Option<String>,
    /// Run in the image with these toolchains (rust, python, node; comma-
    /// separated) over the default or the preset's image (`image build --with`).
    #[arg(long, conflicts_with = "image")]
    with: Option<String>,
    /// The trusted setup phase for this run (docs/setup.md): a preset
    /// (rust, python, node) or a shell command, run with network on a
    /// read-only checkout of the base before the agent; its cache is
    /// mounted read-only into the sandbox. Over the configuration's
    /// `[[setup]]` command for the repository.
    #[arg(long)]
    setup: Option<String>,
    /// (internal: a continuation task's run, `nightshift continue`) the
    /// capped run this run continues; audited on both.
    #[arg(long, hide = true)]
    continues: Option<String>,
    /// The agent command and its arguments.
    #[arg(last = true, required_unless_present = "agent")]
    command: Vec<String>,
}

fn main() -> ExitCode {
    // The hook every agent tool call pays, and `--version`: answered
    // before the command tree, the runtime or anything else is built.
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    match fast::parse(&args, |k| std::env::var_os(k)) {
        Some(fast::Fast::Version) => {
            outln!("nightshift {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Some(fast::Fast::Check(check)) => return fast_check(check),
        None => {}
    }
    let cli = Cli::parse();
    // The processes this one starts (the watchdog, queued runs, a lease's
    // host end) use the same store: set before any thread is started.
    if let Some(url) = &cli.store {
        std::env::set_var("NIGHTSHIFT_STORE", url);
    }
    // Likewise the engine: `--engine`, else the configuration's.
    match engine_setting(
        &state_root(cli.state_dir.as_ref()),
        cli.config.as_deref(),
        cli.engine.as_deref(),
    ) {
        Ok(Some(kind)) => std::env::set_var("NIGHTSHIFT_ENGINE", kind),
        Ok(None) => {}
        Err(message) => {
            errln!("nightshift: {message}");
            return ExitCode::from(exit::USAGE as u8);
        }
    }
    match runtime_setting(
        &state_root(cli.state_dir.as_ref()),
        cli.config.as_deref(),
        cli.runtime.as_deref(),
    ) {
        Ok(Some(r)) => std::env::set_var("NIGHTSHIFT_RUNTIME", r),
        Ok(None) => std::env::remove_var("NIGHTSHIFT_RUNTIME"),
        Err(message) => {
            errln!("nightshift: {message}");
            return ExitCode::from(exit::USAGE as u8);
        }
    }
    install_log(cli.log_format);
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

/// `policy check` through the lean entry point (`fast`): the same steps as
/// `dispatch` takes for it (the store's setting, the store, the API, the
/// check), without the runtime `dispatch` runs on.
fn fast_check(check: fast::Check) -> ExitCode {
    if let Some(url) = &check.store {
        std::env::set_var("NIGHTSHIFT_STORE", url);
    }
    install_log(LogFormat::Text);
    let root = state_root(check.state_dir.as_ref());
    let code = (|| {
        let (setting, _) = store_setting(
            &root,
            check.config.as_deref(),
            check.store.as_ref(),
            check.store_file.as_ref(),
        )?;
        let stores = build_stores(&root, setting.as_ref().map(|s| s.value.as_str()))?;
        let api = Api::new(stores, check.config.clone());
        Ok::<i32, i32>(policy_check(
            &api,
            check.rules,
            CheckArgs {
                actor: check.actor,
                tool: check.tool,
                args_json: check.args_json,
            },
        ))
    })()
    .unwrap_or_else(|code| code);
    if code == exit::OK && orchestrator::terminal::stdout_failed() {
        return ExitCode::from(exit::INTERNAL as u8);
    }
    ExitCode::from(code as u8)
}

/// The log, to stderr, filtered by NIGHTSHIFT_LOG (default: warnings):
/// each event one line, through a writer that escapes what an agent could
/// have put in a field (see `terminal`).
fn install_log(format: LogFormat) {
    let log = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("NIGHTSHIFT_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_ansi(false);
    match format {
        LogFormat::Text => log.with_writer(|| terminal::NetStderr).init(),
        LogFormat::Json => log.json().with_writer(|| terminal::JsonStderr).init(),
    }
}

/// The state directory, made absolute against the working directory (it is
/// mounted into sandboxes and handed to child processes, which need a
/// path that means the same from anywhere).
fn state_root(state_dir: Option<&PathBuf>) -> PathBuf {
    let root = state_dir.cloned().unwrap_or_else(|| {
        directories::ProjectDirs::from("", "", "nightshift")
            .map(|d| d.data_dir().to_path_buf())
            .unwrap_or_else(|| PathBuf::from(".nightshift"))
    });
    std::path::absolute(&root).unwrap_or(root)
}

/// The store's port, built once from `--store` (or `NIGHTSHIFT_STORE`) and
/// handed to everything that reads or writes state.
fn build_stores(root: &std::path::Path, url: Option<&str>) -> Result<Stores, i32> {
    let url = match url {
        None => StoreUrl::Sqlite(None),
        Some(text) => StoreUrl::parse(text).map_err(|e| {
            errln!("nightshift: {e}");
            exit::BAD_INPUT
        })?,
    };
    match url {
        StoreUrl::Sqlite(dir) => Ok(Arc::new(SqliteBackend::new(root.to_path_buf(), dir))),
        StoreUrl::Postgres(url) => Ok(Arc::new(nightshift_store_postgres::PgBackend::new(
            &url,
            root.to_path_buf(),
        ))),
    }
}

async fn connect() -> Result<Engine, i32> {
    Engine::connect().await.map_err(|e| {
        errln!("nightshift: {e}");
        exit::ENGINE
    })
}

/// The store's setting (where `--store` / `NIGHTSHIFT_STORE`, the
/// configuration's `[store] url` or `NIGHTSHIFT_STORE_FILE` put it) and
/// the URL read from that file, if it was read: shared by the whole
/// command line and `policy check`'s lean entry point (`fast`).
/// The engine's setting: `--engine` (or `NIGHTSHIFT_ENGINE`), else the
/// configuration's `[engine] kind`; `None` for the default (Docker).
fn engine_setting(
    root: &std::path::Path,
    config: Option<&std::path::Path>,
    engine: Option<&str>,
) -> Result<Option<String>, String> {
    if let Some(e) = engine {
        return Ok(Some(e.to_owned()));
    }
    let path = config
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("config.toml"));
    let Some(kind) = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| text.parse::<toml::Table>().ok())
        .and_then(|t| t.get("engine")?.get("kind").cloned())
    else {
        return Ok(None);
    };
    match kind.as_str() {
        Some(k @ ("docker" | "podman" | "kubernetes")) => Ok(Some(k.to_owned())),
        _ => Err(format!(
            "{}: [engine] kind must be \"docker\", \"podman\" or \"kubernetes\", not {kind}",
            path.display()
        )),
    }
}

/// The OCI runtime's setting: the configuration's `[sandbox] runtime`
/// (required of every sandbox) and `--runtime` (or `NIGHTSHIFT_RUNTIME`)
/// must agree; either alone decides; `runc` is the default (no setting).
fn runtime_setting(
    root: &std::path::Path,
    config: Option<&std::path::Path>,
    runtime: Option<&str>,
) -> Result<Option<String>, String> {
    let path = config
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("config.toml"));
    let configured = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| text.parse::<toml::Table>().ok())
        .and_then(|t| t.get("sandbox")?.get("runtime").cloned());
    let configured = match configured {
        None => None,
        Some(toml::Value::String(r)) if r == "runc" || r == "runsc" => Some(r),
        Some(other) => {
            return Err(format!(
                "{}: [sandbox] runtime must be \"runc\" or \"runsc\", not {other}",
                path.display()
            ))
        }
    };
    let chosen = match (runtime, configured) {
        (Some(asked), Some(required)) if asked != required => {
            return Err(format!(
                "--runtime {asked} refused: {} requires [sandbox] runtime = \"{required}\"",
                path.display()
            ))
        }
        (Some(asked), _) => Some(asked.to_owned()),
        (None, configured) => configured,
    };
    // runc is every engine's default: no setting.
    Ok(chosen.filter(|r| r != "runc"))
}

fn store_setting(
    root: &std::path::Path,
    config: Option<&std::path::Path>,
    store: Option<&String>,
    store_file: Option<&PathBuf>,
) -> Result<(Option<commands::hosted::Setting>, Option<String>), i32> {
    // `--store` or `NIGHTSHIFT_STORE`, else the configuration's `[store] url`.
    let configured = match store {
        Some(_) => None,
        None => {
            // Only `[store] url` is read here: a configuration broken
            // elsewhere is reported by the commands that use it, as before.
            let path = config
                .map(PathBuf::from)
                .unwrap_or_else(|| root.join("config.toml"));
            std::fs::read_to_string(&path)
                .ok()
                .and_then(|text| text.parse::<toml::Table>().ok())
                .and_then(|t| t.get("store")?.get("url")?.as_str().map(str::to_string))
        }
    };
    let from_file = match (store, &configured, store_file) {
        (None, None, Some(file)) => match std::fs::read_to_string(file) {
            Ok(text) => Some(text.trim().to_string()),
            Err(e) => {
                errln!(
                    "nightshift: reading the store's URL from {} (NIGHTSHIFT_STORE_FILE): {e}",
                    terminal::line(&file.display().to_string())
                );
                return Err(exit::BAD_INPUT);
            }
        },
        _ => None,
    };
    let setting = match (store, &configured, &from_file) {
        (Some(url), _, _) => Some(commands::hosted::Setting {
            value: url.clone(),
            from: "--store / NIGHTSHIFT_STORE".into(),
        }),
        (None, Some(url), _) => Some(commands::hosted::Setting {
            value: url.clone(),
            from: format!(
                "[store] url in {}",
                config
                    .map(PathBuf::from)
                    .unwrap_or_else(|| root.join("config.toml"))
                    .display()
            ),
        }),
        (None, None, Some(url)) => Some(commands::hosted::Setting {
            value: url.clone(),
            from: "NIGHTSHIFT_STORE_FILE".into(),
        }),
        _ => None,
    };
    Ok((setting, from_file))
}

async fn dispatch(cli: Cli) -> i32 {
    let root = state_root(cli.state_dir.as_ref());
    let config = cli.config.clone();
    let (store_setting, from_file) = match store_setting(
        &root,
        config.as_deref(),
        cli.store.as_ref(),
        cli.store_file.as_ref(),
    ) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let stores = match build_stores(&root, store_setting.as_ref().map(|s| s.value.as_str())) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let api = Api::new(stores.clone(), config.clone());
    if cli.hosted {
        let start = match &cli.command {
            Command::Serve(args) => Some(commands::hosted::Start {
                role: commands::hosted::Role::Serve,
                store: store_setting.clone(),
                dashboard: Some(commands::hosted::Dashboard {
                    bind: args.bind,
                    tls: args.tls_cert.is_some(),
                }),
                tls_key: args.tls_key.clone(),
                store_file: from_file.as_ref().and(cli.store_file.clone()),
            }),
            Command::Worker { .. } => Some(commands::hosted::Start {
                role: commands::hosted::Role::Worker,
                store: store_setting.clone(),
                dashboard: None,
                tls_key: None,
                store_file: from_file.as_ref().and(cli.store_file.clone()),
            }),
            _ => None,
        };
        if let Some(start) = start {
            if let Err(e) = commands::hosted::check(&api, start) {
                return fail(&e);
            }
        }
    }
    let result = match cli.command {
        Command::Image { command } => image_cmd(&api, command).await,
        Command::Run(args) => run_cmd(&api, args).await,
        Command::Setup { command } => setup_cmd(&api, command),
        Command::Kube { command } => kube_cmd(command),
        Command::Runs { json } => respond(&api, ApiCommand::Runs {}, json).await,
        Command::Show { run, json } => respond(&api, ApiCommand::Show { run }, json).await,
        Command::Audit {
            command: AuditCommand::Verify { json },
        } => respond(&api, ApiCommand::AuditVerify {}, json).await,
        Command::Audit {
            command: AuditCommand::Export { since, format },
        } => audit_export_cmd(&api, since, format),
        Command::Demo => demo_cmd(&api).await,
        Command::Store {
            command: StoreCommand::Migrate,
        } => match stores.migrate() {
            Ok((from, to)) if from == to => {
                outln!("{}: at schema version {to}, up to date", stores.location());
                Ok(exit::OK)
            }
            Ok((from, to)) => {
                outln!("{}: schema version {from} -> {to}", stores.location());
                Ok(exit::OK)
            }
            Err(e) => {
                errln!("nightshift: {}: {e}", stores.location());
                Err(exit::STATE)
            }
        },
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
                    orchestrator::lease::end_on_lapse(
                        &engine,
                        &container,
                        &heartbeat,
                        bound,
                        orchestrator::lease::ENGINE_GONE_AFTER,
                    )
                    .await;
                    Ok(exit::OK)
                }
                Err(code) => Err(code),
            }
        }
        Command::Reconcile => respond(&api, ApiCommand::Reconcile {}, false).await,
        Command::Execute { watch, lease_secs } => execute_cmd(&api, watch, lease_secs).await,
        Command::Worker {
            max_parallel,
            task_lease_secs,
        } => worker_cmd(&api, max_parallel as usize, task_lease_secs).await,
        Command::Import { run } => respond(&api, ApiCommand::Import { run }, false).await,
        Command::Queue {
            command: None,
            json,
        } => respond(&api, ApiCommand::Queue {}, json).await,
        Command::Queue {
            command: Some(QueueCommand::Show { act }),
            ..
        } => respond(&api, ApiCommand::QueueShow { act }, false).await,
        Command::Report { runs, format } => orchestrator::report::cli(&stores, &runs, format),
        Command::Scopes { command } => orchestrator::scopes::cli(&stores, command),
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
        Command::Continue {
            run,
            max_tokens,
            timeout,
            json,
        } => {
            let command = ApiCommand::Continue {
                run,
                max_tokens,
                timeout,
            };
            respond(&api, command, json).await
        }
        Command::Tasks { command, json } => tasks_cmd(&api, command, json).await,
        Command::Destinations { json, probe } => {
            respond(&api, ApiCommand::Destinations { probe }, json).await
        }
        Command::Summary { send, due, json } => {
            let command = if send || due {
                ApiCommand::SummarySend { due }
            } else {
                ApiCommand::Summary {}
            };
            respond(&api, command, json).await
        }
        Command::Serve(args) => serve_cmd(&api, args).await,
        Command::Users { command } => users_cmd(&api, command).await,
    };
    match result {
        Ok(code) | Err(code) => code,
    }
}

/// `execute`: the act executor in the foreground, one pass or (`--watch`)
/// until killed. Each pass's lines are printed.
async fn execute_cmd(api: &Api, watch: bool, lease_secs: i64) -> Result<i32, i32> {
    let report = |pass: &orchestrator::acts::executor::Pass| {
        for (_, line) in &pass.lines {
            outln!("{}", terminal::line(line));
        }
    };
    commands::execute::execute(api, watch, lease_secs, report)
        .await
        .map_err(|e| fail(&e))?;
    Ok(exit::OK)
}

/// `worker`: the queue's runs and the executor until SIGINT or SIGTERM.
async fn worker_cmd(api: &Api, max_parallel: usize, lease_secs: i64) -> Result<i32, i32> {
    warn_rules_left_out(api, None);
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
    errln!(
        "nightshift worker: running the queue's tasks (at most {max_parallel} at once, leases of {lease_secs} s) on {}",
        terminal::line(&api.stores().location())
    );
    let queue = commands::serve::RunQueue {
        max_parallel,
        lease_secs,
    };
    let worked = commands::worker::work(api, queue, rx, &warn).await;
    signals.abort();
    match worked {
        Ok(()) => Ok((*signal.lock().unwrap_or_else(|p| p.into_inner())).unwrap_or(exit::OK)),
        Err(e) => {
            errln!("nightshift worker: {}", terminal::line(&e.to_string()));
            Err(match &e {
                commands::serve::QueueError::NoDispatcher(e)
                | commands::serve::QueueError::Stopped(e) => e.exit_code(),
            })
        }
    }
}

/// Where the library's warnings go: stderr, after the program's name.
fn warn(line: &str) {
    errln!("nightshift: {line}");
}

/// Warns, loudly, when the rule files in force (`rules`, else
/// `STATE/rules/`) leave out shipped rules (`policy::shipped_rules_left_out`).
fn warn_rules_left_out(api: &Api, rules: Option<&std::path::Path>) {
    let Ok(store) = api.open_state() else {
        return;
    };
    if let Ok(left) = orchestrator::policy::shipped_rules_left_out(&*store, rules) {
        let source = orchestrator::policy::rules_source(&*store, rules);
        if let Some(w) = orchestrator::policy::left_out_warning(&left, &source) {
            warn(&w);
        }
    }
}

/// Prints an error of the API and gives its exit code.
/// `audit export`: the chain streamed to stdout, one escaped line an entry.
fn audit_export_cmd(
    api: &Api,
    since: Option<commands::audit_export::Since>,
    format: commands::audit_export::Format,
) -> Result<i32, i32> {
    let store = api.open_store().map_err(|e| fail(&e))?;
    let mut out = std::io::BufWriter::new(std::io::stdout());
    let since = since.unwrap_or(commands::audit_export::Since::All);
    commands::audit_export::export(&*store, since, format, &mut out).map_err(|e| fail(&e))?;
    Ok(exit::OK)
}

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
        Reply::Continued { run, task, cap } if !json => outln!(
            "run {} (ended by its {cap} cap) continues as task {}",
            terminal::line(run),
            terminal::line(task)
        ),
        Reply::Continued { .. } => outln!("{}", terminal::json(reply, true)),
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
        Reply::Summary {
            summary,
            text,
            failures,
            more_failures,
        } => {
            if json {
                let mut doc = summary.clone();
                doc["failures"] = serde_json::json!(failures);
                doc["more_failures"] = serde_json::json!(more_failures);
                outln!("{}", terminal::json(&doc, true));
            } else {
                outln!("{}", text.trim_end());
                if !failures.is_empty() {
                    outln!("why:");
                    for f in failures {
                        outln!(
                            "  {} {}: {}",
                            f.kind,
                            terminal::line(&f.id),
                            terminal::line(&f.reason)
                        );
                    }
                    if *more_failures > 0 {
                        outln!("  ({more_failures} more)");
                    }
                }
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
        ImageCommand::Ref { agent, with } => ApiCommand::ImageRef {
            agent: agent.map(|a| agent_preset(&a).map(|_| a)).transpose()?,
            with: toolchains(with.as_deref())?
                .iter()
                .map(|t| t.name().to_string())
                .collect(),
        },
        ImageCommand::Build {
            mirror,
            service: true,
            ..
        } => return hosted_image(api, &mirror, commands::image::Hosted::Service).await,
        ImageCommand::Build {
            mirror,
            postgres: true,
            ..
        } => return hosted_image(api, &mirror, commands::image::Hosted::Postgres).await,
        ImageCommand::Build {
            mirror,
            agent,
            with,
            ..
        } => ApiCommand::ImageBuild {
            mirror,
            agent: agent.map(|a| agent_preset(&a).map(|_| a)).transpose()?,
            with: toolchains(with.as_deref())?
                .iter()
                .map(|t| t.name().to_string())
                .collect(),
        },
    };
    let reply = api
        .execute_streaming(command, &Caller::Local, &mut |line| errln!("image: {line}"))
        .await
        .map_err(|e| fail(&e))?;
    render(&reply, false);
    Ok(reply.exit_code())
}

/// `image build --service` / `--postgres`: the reference on stdout.
async fn hosted_image(api: &Api, mirror: &str, which: commands::image::Hosted) -> Result<i32, i32> {
    let reference =
        commands::image::build_hosted(api, mirror, which, &mut |line| errln!("image: {line}"))
            .await
            .map_err(|e| fail(&e))?;
    outln!("{reference}");
    Ok(exit::OK)
}

fn agent_preset(name: &str) -> Result<image::Agent, i32> {
    image::Agent::from_name(name).map_err(|e| {
        errln!("nightshift: {e}");
        exit::USAGE
    })
}

/// The toolchains of `--with` (a usage error, exit 2, names the unknown one).
fn toolchains(with: Option<&str>) -> Result<Vec<image::Toolchain>, i32> {
    match with {
        None => Ok(Vec::new()),
        Some(list) => image::Toolchain::parse_list(list).map_err(|e| {
            errln!("nightshift: {e}");
            exit::USAGE
        }),
    }
}

fn size_arg(s: &str) -> Result<u64, String> {
    orchestrator::config::parse_size(s)
}

fn span_arg(s: &str) -> Result<std::time::Duration, String> {
    orchestrator::config::parse_span(s)
}

/// `run`: the flags become a [`commands::run::RunOrder`]; `--agent` and
/// `--model` are parsed into a preset here (a usage error, exit 2), after
/// the order is checked against the configuration, as they always were.
async fn run_cmd(api: &Api, args: RunArgs) -> Result<i32, i32> {
    warn_rules_left_out(api, None);
    let json = args.json;
    let agent = args.agent.map(|name| (name, args.model));
    let with = toolchains(args.with.as_deref())?;
    let order = commands::run::RunOrder {
        repo: args.repo,
        base_ref: args.base_ref,
        image: args.image,
        task: args.task,
        task_file: args.task_file,
        caps: commands::run::CapsAsked {
            memory_bytes: args.memory,
            cpus: args.cpus,
            pids: args.pids,
            timeout: args.timeout,
            max_output_bytes: args.max_output,
            max_worktree_bytes: args.max_worktree,
            max_files: args.max_files,
            max_tokens: args.max_tokens,
        },
        echo: !json,
        dry_run: args.dry_run,
        command: args.command,
        // A dispatcher's child (`tasks run`) carries its task's id.
        of_task: std::env::var_os("NIGHTSHIFT_TASK").is_some(),
        with,
        setup: args.setup,
        continues: args.continues,
    };
    let mut prepared = commands::run::prepare(api, order).map_err(|e| fail(&e))?;
    if let Some((name, model)) = agent {
        let agent = agent_preset(&name)?;
        let preset = orchestrator::agents::preset(agent, model.as_deref()).map_err(|e| {
            errln!("nightshift: {e}");
            exit::USAGE
        })?;
        prepared = prepared
            .with_agent(api, agent, model.as_deref(), preset)
            .map_err(|e| fail(&e))?;
    }
    let record = commands::run::run(api, prepared, &warn)
        .await
        .map_err(|e| fail(&e))?;
    if json {
        outln!("{}", terminal::json(&record, true));
    } else {
        print_summary(&record);
        // What the run left for the morning: its acts and refused requests.
        match api
            .execute(ApiCommand::Show {
                run: record.id.clone(),
            })
            .await
        {
            Ok(Reply::Run(view)) => {
                print_setup(&view.audit);
                print_acts_and_refusals(
                    &record.id,
                    &view.acts,
                    &view.refusals,
                    Some(RUN_LISTS_AT_MOST),
                )
            }
            Ok(_) => {}
            Err(e) => warn(&format!("listing the run's acts: {e}")),
        }
    }
    Ok(orchestrator::api::run_exit_code(&record))
}

async fn watchdog_cmd(api: &Api, watched: &str) -> Result<i32, i32> {
    commands::watchdog::watch(api, watched)
        .await
        .map_err(|e| fail(&e))?;
    Ok(exit::OK)
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

/// `kube pod`'s documents: the Pod, or the `Sandbox` resource holding it.
fn kube_manifest(
    args: KubePodArgs,
) -> Result<Result<String, nightshift_engine_kubernetes::PlanError>, i32> {
    let as_sandbox = args.as_sandbox_resource;
    let plan = kube_plan(args)?;
    Ok(if as_sandbox {
        nightshift_engine_kubernetes::sandbox_manifest(&plan)
    } else {
        nightshift_engine_kubernetes::manifest(&plan)
    })
}

fn kube_cmd(command: KubeCmd) -> Result<i32, i32> {
    match command {
        KubeCmd::SeccompProfile => {
            outln!("{}", nightshift_core::sandbox::SECCOMP_PROFILE.trim_end());
            Ok(0)
        }
        KubeCmd::Pod(args) => match kube_manifest(*args)? {
            Ok(yaml) => {
                // JSON documents: every string quoted and escaped; block() keeps it so.
                out!("{}", terminal::block(yaml.as_bytes()));
                Ok(0)
            }
            Err(e) => {
                errln!("nightshift: kube pod: {}", terminal::line(&e.to_string()));
                Err(exit::USAGE)
            }
        },
        KubeCmd::Attest(args) => {
            let KubeAttestArgs {
                observed,
                policies,
                plan,
            } = *args;
            let plan = kube_plan(plan)?;
            let read = |path: &std::path::Path| -> Result<Vec<u8>, i32> {
                use std::io::Read as _;
                let mut bytes = Vec::new();
                std::fs::File::open(path)
                    .and_then(|f| {
                        f.take(nightshift_engine_kubernetes::MAX_DOCUMENT as u64 + 1)
                            .read_to_end(&mut bytes)
                    })
                    .map_err(|e| {
                        errln!(
                            "nightshift: kube attest: reading {}: {e}",
                            terminal::line(&path.display().to_string())
                        );
                        exit::BAD_INPUT
                    })?;
                Ok(bytes)
            };
            let observed = read(&observed)?;
            let policies = policies.as_deref().map(read).transpose()?;
            let attestation =
                nightshift_engine_kubernetes::judge(&plan, &observed, policies.as_deref())
                    .map_err(|e| {
                        errln!(
                            "nightshift: kube attest: {}",
                            terminal::line(&e.to_string())
                        );
                        exit::BAD_INPUT
                    })?;
            for p in &attestation.properties {
                outln!(
                    "{:<6} {:<26} {} (expected {})",
                    if p.ok { "ok" } else { "FAILED" },
                    p.name,
                    terminal::line(&p.observed),
                    terminal::line(&p.expected)
                );
            }
            Ok(if attestation.passed() {
                0
            } else {
                exit::REFUSED
            })
        }
    }
}

/// A run's Pod plan from `kube pod`'s arguments.
fn kube_plan(args: KubePodArgs) -> Result<nightshift_engine_kubernetes::PodPlan, i32> {
    let mut env = std::collections::BTreeMap::new();
    for kv in &args.env {
        let Some((k, v)) = kv.split_once('=') else {
            errln!("nightshift: --env {}: not KEY=VALUE", terminal::line(kv));
            return Err(exit::USAGE);
        };
        env.insert(k.to_owned(), v.to_owned());
    }
    let id = nightshift_core::sandbox::DEFAULT_SANDBOX_ID as i64;
    Ok(nightshift_engine_kubernetes::PodPlan {
        run_id: args.run_id,
        namespace: args.namespace,
        owner: args.owner,
        image: args.image,
        image_pull_policy: args.image_pull_policy,
        command: args.command,
        env,
        uid: id,
        gid: id,
        memory_bytes: args.memory,
        cpu_millis: args.cpu_millis,
        wall_seconds: args.wall_seconds,
        worktree_bytes: args.max_worktree,
        tmpfs_bytes: args.tmpfs,
        runtime_class: args.runtime_class,
    })
}

fn setup_cmd(api: &Api, command: SetupCmd) -> Result<i32, i32> {
    let root = orchestrator::state_store::StatePaths::new(api.root().to_path_buf()).setup();
    let show = |entries: &[orchestrator::setup::CacheEntry], json: bool, verb: &str| {
        if json {
            outln!("{}", terminal::json(&entries, true));
            return;
        }
        if entries.is_empty() {
            outln!("no setup cache {verb}");
        }
        for e in entries {
            outln!(
                "{} {} {:.1} MiB {} on {}{}",
                terminal::line(&e.repository),
                terminal::line(&e.key[..e.key.len().min(16)]),
                e.bytes as f64 / (1 << 20) as f64,
                terminal::line(&e.created_at),
                terminal::line(&e.commit[..e.commit.len().min(12)]),
                if e.trusted {
                    ""
                } else {
                    " (agent-written base)"
                }
            );
        }
    };
    match command {
        SetupCmd::List { json } => {
            let entries: Vec<_> = orchestrator::setup_phase::entries(&root)
                .into_iter()
                .map(|(_, e)| e)
                .collect();
            show(&entries, json, "");
        }
        SetupCmd::Prune {
            keep,
            older_than,
            json,
        } => {
            if keep.is_none() && older_than.is_none() {
                errln!("nightshift: setup prune needs --keep N or --older-than DURATION");
                return Err(exit::USAGE);
            }
            let removed =
                orchestrator::setup_phase::prune(&root, keep, older_than).map_err(|e| {
                    errln!("nightshift: pruning setup caches: {}", terminal::line(&e));
                    exit::FAILED
                })?;
            show(&removed, json, "removed");
        }
    }
    Ok(exit::OK)
}

/// The run's setup phase and the lockfiles its agent changed, from its
/// audit entries (docs/setup.md).
fn print_setup(entries: &[orchestrator_audit::Entry]) {
    for e in entries {
        let b = &e.body;
        let text = |k: &str| terminal::line(b.get(k).and_then(|v| v.as_str()).unwrap_or("-"));
        match e.kind.as_str() {
            "setup" => {
                let outcome = b.get("outcome").and_then(|v| v.as_str()).unwrap_or("");
                let what = match outcome {
                    "built" => "ran (cache built)",
                    "reused" => "skipped: the cache for this key exists (reused)",
                    "last-trusted" => {
                        "skipped: the base is agent-written; the repository's last trusted cache is used"
                    }
                    "failed" => "failed",
                    "refused" => "refused: the base is agent-written",
                    "interrupted" => "interrupted: the run was stopped while setup ran",
                    _ => "?",
                };
                outln!("  setup: {what} ({})", text("command"));
                if b.get("key").is_some_and(|k| !k.is_null()) {
                    outln!(
                        "    cache {} digest {} ({} bytes, built on {})",
                        text("key"),
                        text("digest"),
                        b.get("bytes").and_then(|v| v.as_u64()).unwrap_or(0),
                        text("commit")
                    );
                }
                if let Some(ms) = b.get("duration_ms").and_then(|v| v.as_i64()) {
                    outln!("    setup phase: {:.1}s", ms as f64 / 1000.0);
                }
            }
            "dependencies_changed" => {
                let paths: Vec<String> = b
                    .get("paths")
                    .and_then(|v| v.as_array())
                    .map(|a| {
                        a.iter()
                            .map(|p| terminal::line(p.as_str().unwrap_or("?")))
                            .collect()
                    })
                    .unwrap_or_default();
                outln!(
                    "  dependencies changed by the agent: {} (the setup cache was not refreshed tonight)",
                    paths.join(", ")
                );
            }
            _ => {}
        }
    }
}

fn render_show(view: &RunView, json: bool) {
    let RunView {
        run,
        audit: entries,
        refusals: refused,
        acts,
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
    print_setup(entries);
    if let Some(task) = &run.task {
        outln!("  task:");
        for l in terminal::block(task.as_bytes()).lines() {
            outln!("    {l}");
        }
    }
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
    print_acts_and_refusals(&run.id, acts, refused, None);
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
            retries: 0,
            command: args.command,
            continues: None,
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
        Some(TasksCommand::Run {
            max_parallel,
            lease_secs,
        }) => dispatch_cmd(api, max_parallel, lease_secs).await,
    }
}

/// `tasks run`: the dispatcher in the foreground. SIGINT / SIGTERM stop it
/// from starting more (the signal's exit code); the runs it started go on
/// and the next dispatcher adopts them.
async fn dispatch_cmd(api: &Api, max_parallel: usize, lease_secs: i64) -> Result<i32, i32> {
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
    let summary = commands::dispatch::foreground(api, max_parallel, lease_secs, rx).await;
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

/// `demo`: what the library makes and runs, said step by step.
async fn demo_cmd(api: &Api) -> Result<i32, i32> {
    let setup = demo::prepare(api, &mut |line| errln!("image: {line}"))
        .await
        .map_err(|e| fail(&e))?;
    outln!("demo: repository {}", setup.repo.display());
    outln!(
        "demo: destination origin = {} (a local bare repository)",
        setup.destination.display()
    );
    outln!(
        "demo: running a scripted agent in a Tier 0 sandbox ({})",
        setup.image
    );
    let record = demo::run(api, &setup, &warn).await.map_err(|e| fail(&e))?;
    print_summary(&record);
    let state = api.root().display();
    outln!();
    outln!("What the agent left, as the supervisor observed and imported it:");
    outln!(
        "  git -C {} log --stat {}",
        setup.repo.display(),
        record.result_ref.as_deref().unwrap_or("-")
    );
    let pending = demo::pending(api, &record).map_err(|e| fail(&e))?;
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
            setup.destination.display()
        );
    }
    outln!();
    outln!("  nightshift --state-dir {state} show {}", record.id);
    outln!("  nightshift --state-dir {state} audit verify");
    Ok(orchestrator::api::run_exit_code(&record))
}

/// `policy check`: the hook's answer (it fails closed: see
/// `commands::policy`), said on stderr; its code is the exit code.
fn policy_check(api: &Api, rules: Option<PathBuf>, args: CheckArgs) -> i32 {
    let call = commands::policy::HookCall {
        rules,
        actor: args.actor,
        tool: args.tool,
        args_json: args.args_json,
    };
    let answer = commands::policy::hook_check(api, call, std::io::stdin());
    if let Some(warning) = answer.warning {
        errln!("{warning}");
    }
    if let Some(line) = answer.line {
        errln!("{line}");
    }
    answer.code
}

async fn policy_cmd(api: &Api, args: PolicyArgs) -> Result<i32, i32> {
    let rules = args.rules;
    let command = match args.command {
        PolicyCommand::Check(check) => return Ok(policy_check(api, rules, check)),
        PolicyCommand::Explain(check) => {
            let input = commands::policy::read_hook_input(std::io::stdin()).map_err(|e| {
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
            warn_rules_left_out(api, rules.as_deref());
            return respond(api, ApiCommand::PolicyList { rules, actor }, json).await;
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
            "frozen_by": view.frozen.as_ref().map(|(_, by)| by),
            "frozen_at": view.frozen_at,
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
            "FROZEN: {} (by {}{})",
            terminal::line(reason),
            terminal::line(authority),
            view.frozen_at
                .as_deref()
                .map(|at| format!(" at {}", terminal::line(at)))
                .unwrap_or_default()
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
    // Why it failed, in the destination's own words where it gave some
    // (sanitised and bounded by the executor: `ExecError::audit_reason`).
    match &d.state {
        deferred_queue::State::Failed { reason, attempts } => {
            outln!(
                "failed after {attempts} attempt(s): {}",
                terminal::line(reason)
            )
        }
        deferred_queue::State::AwaitingRetry {
            last_failure,
            attempts,
            ..
        } => outln!(
            "attempt {attempts} failed, retrying: {}",
            terminal::line(last_failure)
        ),
        _ => {}
    }
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

/// How many acts and refused requests `run` lists after a run: the rest
/// are counted and left to `nightshift show` (an agent can make hundreds).
const RUN_LISTS_AT_MOST: usize = 20;

/// A run's queued acts and refused door requests, as `run` (at most
/// `limit` of each, the rest counted) and `show` (all) print them (each
/// value escaped).
fn print_acts_and_refusals(
    run: &str,
    acts: &[orchestrator::api::RunAct],
    refused: &[orchestrator::acts::Refusal],
    limit: Option<usize>,
) {
    let limit = limit.unwrap_or(usize::MAX);
    let more = |n: usize| {
        if n > limit {
            outln!(
                "    ... and {} more: nightshift show {}",
                n - limit,
                terminal::line(run)
            );
        }
    };
    if !acts.is_empty() {
        outln!("  acts queued ({}; review: nightshift queue):", acts.len());
        for a in acts.iter().take(limit) {
            outln!(
                "    {}  {:<10} {} to {}{}",
                terminal::line(&a.id),
                terminal::line(&a.status),
                terminal::line(&a.door),
                terminal::line(&a.destination),
                a.target
                    .as_deref()
                    .map(|t| format!(" {}", terminal::line(t)))
                    .unwrap_or_default()
            );
        }
        more(acts.len());
    }
    if !refused.is_empty() {
        outln!("  refused door requests ({}):", refused.len());
        for r in refused.iter().take(limit) {
            outln!("    {}", refusal_line(r));
        }
        more(refused.len());
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
        terminal::line(&r.by())
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
    // The listing still shows when only credential files failed their check.
    if !problems.is_empty() && listed.is_none() {
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
/// the run queue in process and the act executor beside it, with one
/// watchdog for the whole process (`commands::serve`).
async fn serve_cmd(api: &Api, args: ServeArgs) -> Result<i32, i32> {
    warn_rules_left_out(api, None);
    let prepared = commands::serve::prepare(api, &warn).map_err(|e| fail(&e))?;
    let opts = orchestrator::serve::ServeOptions {
        front: prepared.front,
        config: api.config_path().map(std::path::Path::to_path_buf),
        bind: args.bind,
        allow_hosts: args.allow_hosts,
        insecure_network: args.insecure_network,
        metrics_addr: args.metrics_addr,
        owner_key: args
            .owner_key_file
            .unwrap_or_else(|| api.root().join("owner.key")),
        chain_every: std::time::Duration::from_secs(args.chain_check_every),
        tls: match (args.tls_cert, args.tls_key) {
            (Some(cert), Some(key)) => Some(orchestrator::serve::TlsFiles { cert, key }),
            _ => None,
        },
    };
    let queue = commands::serve::RunQueue {
        max_parallel: args.max_parallel,
        lease_secs: args.task_lease_secs,
    };
    let scheme = if opts.tls.is_some() { "https" } else { "http" };
    orchestrator::serve::serve_with_queue(
        api,
        &prepared.config,
        opts,
        queue,
        |addr, metrics| {
            outln!("nightshift serve: listening on {scheme}://{addr}");
            if let Some(m) = metrics {
                outln!("nightshift serve: metrics on http://{m}/metrics");
            }
        },
        |e| match e {
            commands::serve::QueueError::NoDispatcher(e) => errln!(
                "nightshift serve: no dispatcher ({})",
                terminal::line(&e.to_string())
            ),
            commands::serve::QueueError::Stopped(e) => errln!(
                "nightshift serve: the run queue's dispatcher stopped: {}",
                terminal::line(&e.to_string())
            ),
        },
    )
    .await
    .map_err(|e| fail(&ApiError::of(e)))?;
    Ok(exit::OK)
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
