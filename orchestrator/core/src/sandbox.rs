//! What a run's container must be: the Tier 0 specification, as plain data.
//!
//! Invariants:
//! - The environment is built only from the allowlist below; nothing from the
//!   supervisor's own environment is ever copied in
//!   (`tests::environment_is_the_allowlist_only`).
//! - The worktree is the only host path mounted writable (the door and a
//!   setup cache are read-only, and the attestation fails a writable one);
//!   everything else the sandbox can write is a size-limited tmpfs (`/dev/shm` included)
//!   (`tests::tmpfs_mounts_are_size_limited`,
//!   `orchestrator/attest/tests/fixtures.rs::recorded_writable_root_fails_read_only_root`,
//!   `tests/tests/sandbox_probes.rs::tier0_holds_inside_the_sandbox`).
//! - The sandbox runs as the configured [`SandboxUser`], never as the image's
//!   own user, and under nightshift's seccomp profile ([`SECCOMP_PROFILE`]),
//!   sent by content (`tests::the_user_is_the_configured_one_home_included`,
//!   `tests::the_profile_is_json_with_a_digest_and_leaves_out_what_it_must`,
//!   `tests/tests/sandbox_probes.rs::syscalls_outside_nightshifts_profile_are_refused`).
//! - A sandbox with a door runs the door's lease wrapper as its PID 1, with
//!   no engine init ([`lease_command`], [`SandboxSpec::lease_is_pid1`]),
//!   the agent's command as the wrapper's child: the sandbox ends when its
//!   supervisor stops renewing the lease, and nothing inside can stop the
//!   wrapper (a PID namespace's init gets no signal from inside that it has
//!   no handler for).
//! - `nproc` is [`SHARED_NPROC`] whatever the run asks: the kernel counts it
//!   per uid across the host, and all sandboxes share the uid.
//! - The same spec yields the engine request (in `engine`) and the
//!   attestation's expectations (here), so what we ask for and what we check
//!   cannot drift apart; the check itself runs on what the engine reports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The path the worktree is mounted at inside every sandbox.
pub const WORKSPACE: &str = "/workspace";
/// The sandbox user's home: a tmpfs, so nothing of it outlives the run.
pub const HOME: &str = "/home/agent";
/// Where the run's door is mounted (read-only) inside every sandbox.
pub const DOOR_MOUNT: &str = "/run/nightshift";
/// Where a run's setup cache is mounted (docs/setup.md): read-write in the
/// setup container, read-only in the sandbox.
pub const SETUP_CACHE_MOUNT: &str = "/cache";
/// The image's own default user (its `agent` account). Never what a sandbox
/// runs as: the spec always names the configured [`SandboxUser`].
pub const SANDBOX_UID: u32 = 1000;
pub const SANDBOX_GID: u32 = 1000;
/// The default uid and gid a sandbox runs as: an id no host account uses.
/// Debian gives people 1000-60000 and system accounts 100-999; systemd
/// reserves up to 65535 (homed, dynamic users, nobody); useradd delegates
/// subordinate ranges from 100000 to 600100000; systemd-nspawn picks
/// container ranges up to 0x6FFFFFFF and keeps 0x7FFE0000.. as its
/// "foreign" range. 2,000,000,000 lies above all of these and below 2^31,
/// which tools that hold ids as signed 32-bit numbers still read right.
/// Checked at every run start against the host's accounts anyway.
pub const DEFAULT_SANDBOX_ID: u32 = 2_000_000_000;
/// nightshift's seccomp profile: moby's default allowlist (the reference for
/// what the engine allows by default) less io_uring, ptrace and
/// process_vm_*, `name_to_handle_at` (file handles name host inodes; its
/// twin `open_by_handle_at` needs a capability), the memory protection key
/// calls `pkey_*` (Docker's own default refuses them; programs fall back
/// without them), and every rule that needs a capability (bpf,
/// perf_event_open, keyring calls, mount, namespaces, ...: nightshift grants
/// none); `socket` only for AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK with
/// NETLINK_ROUTE (no AF_VSOCK, no other netlink family); `personality` only
/// as Docker allows it.
///
/// Only each architecture's native ABI: no sub-architecture (x86's 32-bit
/// `int 0x80` and x32, arm's 32-bit, ...), so every 32-bit entry point fails
/// closed (the kernel kills the caller: SIGSYS). An argument filter cannot
/// hold there: libseccomp turns a `socket` rule into a `socketcall` rule
/// whose family it cannot see, and the 32-bit `ipc` multiplexes likewise.
/// Sent to the engine by content and attested by its digest.
pub const SECCOMP_PROFILE: &str = include_str!("seccomp.json");

/// The profile a sandbox is given on `runtime`: [`SECCOMP_PROFILE`], except
/// under gVisor (`runsc`, which loads it inside the sandbox with
/// `--oci-seccomp`: scripts/podman.sh). gVisor 2022-12 answers a rule's
/// `errnoRet` with EPERM, so the profile's `clone3` → ENOSYS (which makes
/// libc fall back to `clone`, whose flags the profile can check) becomes
/// EPERM there and every `posix_spawn` fails; under gVisor `clone3` is
/// allowed instead (a namespace it makes is the sentry's, never the host's),
/// and every other rule stays (`tests::gvisor_differs_only_in_clone3`).
pub fn seccomp_profile_for(runtime: Option<&str>) -> std::borrow::Cow<'static, str> {
    if runtime != Some("runsc") {
        return std::borrow::Cow::Borrowed(SECCOMP_PROFILE);
    }
    let Ok(mut profile) = serde_json::from_str::<serde_json::Value>(SECCOMP_PROFILE) else {
        return std::borrow::Cow::Borrowed(SECCOMP_PROFILE);
    };
    if let Some(rules) = profile.get_mut("syscalls").and_then(|r| r.as_array_mut()) {
        for rule in rules.iter_mut() {
            let clone3 = rule
                .get("names")
                .and_then(|n| n.as_array())
                .is_some_and(|n| n.len() == 1 && n[0] == "clone3");
            if clone3 {
                if let Some(o) = rule.as_object_mut() {
                    o.insert("action".into(), "SCMP_ACT_ALLOW".into());
                    o.remove("errnoRet");
                }
            }
        }
    }
    std::borrow::Cow::Owned(profile.to_string())
}
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The sandbox's main process: the lease wrapper in the door's `bin/`.
pub const LEASE_WRAPPER: &str = "/run/nightshift/bin/nightshift-lease";

/// The container's command for the agent's `command` under a lease of
/// `bound`: the wrapper runs it as its child (see `nightshift_engine_docker::lease`).
pub fn lease_command(bound: Duration, command: &[String]) -> Vec<String> {
    let mut wrapped = vec![
        LEASE_WRAPPER.to_string(),
        "--bound-ms".to_string(),
        bound.as_millis().to_string(),
        "--".to_string(),
    ];
    wrapped.extend_from_slice(command);
    wrapped
}

/// Where a warm sandbox's lease wrapper finds its command once its run is
/// bound to it (`sandbox_image_door::lease::COMMAND_FILE_IN_SANDBOX`).
pub const WARM_COMMAND_FILE: &str = "/run/nightshift/command";

/// Label keys that mark a container as one of ours.
/// The `nproc` ulimit of every sandbox: processes of the sandbox uid on the
/// whole host, all sandboxes together (see [`SandboxSpec::ulimits`]).
pub const SHARED_NPROC: i64 = 16384;

pub const LABEL_RUN: &str = "nightshift.run";
pub const LABEL_STATE: &str = "nightshift.state";
pub const LABEL_MANAGED: &str = "nightshift.managed";
pub const LABEL_SUPERVISOR: &str = "nightshift.supervisor";
/// The longest task text passed to the sandbox (through its environment).
pub const MAX_TASK_BYTES: usize = 64 * 1024;

/// Per-run limits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Caps {
    pub memory_bytes: i64,
    pub nano_cpus: i64,
    pub pids: i64,
    pub open_files: i64,
    pub timeout: Duration,
    pub max_output_bytes: u64,
    pub max_worktree_bytes: u64,
    pub tmpfs_bytes: i64,
    /// How long the sandbox outlives its supervisor's last heartbeat
    /// (`nightshift_engine_docker::lease`). Absent from records made before the lease.
    #[serde(default = "default_lease")]
    pub lease: Duration,
    /// Model tokens the run may spend through the gateway.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u64,
    /// The fleet's model token budget per night (all runs together), as it
    /// stood when this run started.
    #[serde(default = "default_fleet_tokens")]
    pub fleet_max_tokens_per_night: u64,
}

fn default_max_tokens() -> u64 {
    crate::tokens::DEFAULT_RUN_CAP
}

fn default_fleet_tokens() -> u64 {
    crate::tokens::DEFAULT_FLEET_CAP
}

/// The lease's default bound: 30 s.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

fn default_lease() -> Duration {
    DEFAULT_LEASE
}

impl Caps {
    /// Output past the cap is dropped; past this ceiling the run is killed.
    pub fn output_ceiling(&self) -> u64 {
        self.max_output_bytes.saturating_mul(4)
    }

    /// The size of `/dev/shm`: an eighth of the tmpfs cap or of the memory
    /// cap, whichever is smaller (32 MiB by default, half of Docker's 64 MiB),
    /// and at least 1 MiB. Like every tmpfs its pages are charged to the run's
    /// memory cgroup; sizing it from the caps keeps it a bounded part of them.
    pub fn shm_bytes(&self) -> i64 {
        (self.tmpfs_bytes.min(self.memory_bytes) / 8).max(1 << 20)
    }
}

/// The uid and gid a sandbox runs as, and owns its worktree as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxUser {
    pub uid: u32,
    pub gid: u32,
}

impl Default for SandboxUser {
    fn default() -> Self {
        Self {
            uid: DEFAULT_SANDBOX_ID,
            gid: DEFAULT_SANDBOX_ID,
        }
    }
}

fn home_tmpfs(size: i64, user: SandboxUser) -> String {
    format!(
        "rw,nosuid,nodev,size={size},uid={},gid={},mode=0700",
        user.uid, user.gid
    )
}

/// One resource limit as the engine takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ulimit {
    pub name: &'static str,
    pub soft: i64,
    pub hard: i64,
}

impl Default for Caps {
    fn default() -> Self {
        Self {
            memory_bytes: 2 << 30,
            nano_cpus: 1_000_000_000,
            pids: 512,
            open_files: 4096,
            timeout: Duration::from_secs(2 * 3600),
            max_output_bytes: 16 << 20,
            max_worktree_bytes: 2 << 30,
            tmpfs_bytes: 256 << 20,
            lease: DEFAULT_LEASE,
            max_tokens: default_max_tokens(),
            fleet_max_tokens_per_night: default_fleet_tokens(),
        }
    }
}

/// Everything the engine needs to create one run's container.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxSpec {
    pub run_id: String,
    pub name: String,
    pub image: String,
    pub command: Vec<String>,
    pub worktree_host: PathBuf,
    pub env: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    pub tmpfs: BTreeMap<String, String>,
    pub caps: Caps,
    /// The fleet's parent cgroup (`/name`), when the supervisor manages one.
    pub cgroup_parent: Option<String>,
    /// The run's door directory, mounted read-only at `/run/nightshift`.
    pub door: Option<PathBuf>,
    pub user: SandboxUser,
    /// The repository's setup cache (docs/setup.md), mounted read-only at
    /// [`SETUP_CACHE_MOUNT`].
    pub setup_cache: Option<PathBuf>,
    /// The OCI runtime to run it with (`runsc`: gVisor), when not the
    /// engine's default; the attestation then requires it.
    pub runtime: Option<String>,
}

impl SandboxSpec {
    /// Marks the sandbox with the supervisor that owns it.
    pub fn with_supervisor(mut self, identity: &str) -> Self {
        self.labels
            .insert(LABEL_SUPERVISOR.to_string(), identity.to_string());
        self
    }

    /// Mounts the run's door (read-only), tells the clients where it is, and
    /// runs the command under the door's lease wrapper ([`LEASE_WRAPPER`]),
    /// which ends the sandbox when the supervisor stops renewing its lease.
    pub fn with_door(mut self, dir: PathBuf) -> Self {
        self.door = Some(dir);
        self.command = lease_command(self.caps.lease, &self.command);
        self.env.insert(
            "NIGHTSHIFT_DOOR".to_string(),
            format!("{DOOR_MOUNT}/door.sock"),
        );
        self.env
            .insert("PATH".to_string(), format!("{DOOR_MOUNT}/bin:{PATH}"));
        self
    }

    /// Gives the run the model gateway (after [`Self::with_door`]): the lease
    /// wrapper starts the relay on `port` before the command, and the
    /// environment points the usual clients at it with a placeholder key
    /// (`crate::sandbox::sandbox_env`).
    pub fn with_model_gateway(mut self, port: u16) -> Self {
        if self.command.first().map(String::as_str) == Some(LEASE_WRAPPER) {
            self.command
                .splice(1..1, ["--relay".to_string(), port.to_string()]);
        }
        for (k, v) in crate::sandbox::sandbox_env(port) {
            self.env.insert(k.to_string(), v);
        }
        self
    }

    /// Tells the door clients the run's base commit: the packs they send
    /// leave out what it reaches (the host already holds it).
    pub fn with_base_commit(mut self, commit: &str) -> Self {
        self.env
            .insert("NIGHTSHIFT_BASE_COMMIT".to_string(), commit.to_string());
        self
    }

    pub fn with_cgroup_parent(mut self, parent: Option<String>) -> Self {
        self.cgroup_parent = parent;
        self
    }

    /// Runs the sandbox as `user` (and gives it its tmpfs home).
    pub fn with_user(mut self, user: SandboxUser) -> Self {
        self.user = user;
        self.tmpfs
            .insert(HOME.to_string(), home_tmpfs(self.caps.tmpfs_bytes, user));
        self
    }

    pub fn new(
        run_id: &str,
        state_tag: &str,
        image: &str,
        command: &[String],
        worktree_host: PathBuf,
        task: &str,
        caps: &Caps,
    ) -> Self {
        let env = BTreeMap::from([
            ("PATH".to_string(), PATH.to_string()),
            ("HOME".to_string(), HOME.to_string()),
            ("LANG".to_string(), "C.UTF-8".to_string()),
            ("NIGHTSHIFT_RUN_ID".to_string(), run_id.to_string()),
            ("NIGHTSHIFT_TASK".to_string(), task.to_string()),
        ]);
        let labels = BTreeMap::from([
            (LABEL_RUN.to_string(), run_id.to_string()),
            (LABEL_STATE.to_string(), state_tag.to_string()),
            (LABEL_MANAGED.to_string(), "1".to_string()),
        ]);
        let size = caps.tmpfs_bytes;
        let tmpfs = BTreeMap::from([
            (
                "/tmp".to_string(),
                format!("rw,nosuid,nodev,size={size},mode=1777"),
            ),
            (HOME.to_string(), home_tmpfs(size, SandboxUser::default())),
        ]);
        Self {
            run_id: run_id.to_string(),
            name: format!("nightshift-{run_id}"),
            image: image.to_string(),
            command: command.to_vec(),
            worktree_host,
            env,
            labels,
            tmpfs,
            caps: caps.clone(),
            cgroup_parent: None,
            door: None,
            user: SandboxUser::default(),
            setup_cache: None,
            runtime: None,
        }
    }

    /// Mounts a published setup cache read-only and gives the agent the
    /// environment that makes its tools use it offline.
    pub fn with_setup_cache(
        mut self,
        cache: PathBuf,
        env: &std::collections::BTreeMap<String, String>,
    ) -> Self {
        self.setup_cache = Some(cache);
        for (k, v) in env {
            self.env.insert(k.clone(), v.clone());
        }
        self
    }

    /// A warm sandbox (a pool's, created and started before its run is
    /// known): its lease wrapper (after [`Self::with_door`], with no
    /// command) waits for the command in [`WARM_COMMAND_FILE`] instead of
    /// running one. Unchanged when the sandbox has no door.
    pub fn warm(mut self) -> Self {
        if self.lease_is_pid1() && self.command.last().map(String::as_str) == Some("--") {
            self.command.pop();
            self.command
                .extend(["--command-file".to_string(), WARM_COMMAND_FILE.to_string()]);
        }
        self
    }

    /// Whether the lease wrapper is the container's PID 1 itself (no engine
    /// init): every sandbox with a door. As its PID namespace's init it
    /// receives no signal from inside that it has no handler for, SIGSTOP
    /// and SIGKILL included, and the kernel ends the namespace when it exits.
    pub fn lease_is_pid1(&self) -> bool {
        self.command.first().map(String::as_str) == Some(LEASE_WRAPPER)
    }

    pub fn user(&self) -> String {
        format!("{}:{}", self.user.uid, self.user.gid)
    }

    /// Resource limits per process: open files; no core dumps (a dump of
    /// the agent is written where the host may read it, and can be large);
    /// no file larger than the worktree cap; processes bounded by
    /// [`SHARED_NPROC`], whatever the run's caps (the kernel counts `nproc`
    /// per uid across the host, and every sandbox runs as the same uid: a
    /// figure that followed one run's cap would let that sandbox starve the
    /// others' forks). The pids cgroup is the per-run bound, each run's cap
    /// is at most the fleet's, the fleet's at most [`SHARED_NPROC`]
    /// (`config`), and admission keeps the running caps' sum within the
    /// fleet's: one state's sandboxes together never reach it;
    /// a bounded stack (8 MiB soft, as Linux's default; never unlimited,
    /// which would also switch off the randomised mmap layout).
    pub fn ulimits(&self) -> Vec<Ulimit> {
        let c = &self.caps;
        let fsize = i64::try_from(c.max_worktree_bytes).unwrap_or(i64::MAX);
        vec![
            Ulimit {
                name: "nofile",
                soft: c.open_files,
                hard: c.open_files,
            },
            Ulimit {
                name: "core",
                soft: 0,
                hard: 0,
            },
            Ulimit {
                name: "fsize",
                soft: fsize,
                hard: fsize,
            },
            Ulimit {
                name: "nproc",
                soft: SHARED_NPROC,
                hard: SHARED_NPROC,
            },
            Ulimit {
                name: "stack",
                soft: (8 << 20).min(c.memory_bytes),
                hard: c.memory_bytes,
            },
        ]
    }

    /// The /proc and /sys paths masked: the engine's own list (setting
    /// the list replaces it), later engines' additions, and nightshift's.
    pub fn masked_paths(&self) -> Vec<String> {
        orchestrator_attest::DEFAULT_MASKED_PATHS
            .iter()
            .chain(orchestrator_attest::LATER_ENGINE_MASKED_PATHS.iter())
            .chain(orchestrator_attest::NIGHTSHIFT_MASKED_PATHS.iter())
            .map(|p| p.to_string())
            .collect()
    }

    pub fn env_list(&self) -> Vec<String> {
        self.env.iter().map(|(k, v)| format!("{k}={v}")).collect()
    }

    /// What the attestation holds the inspected container to.
    pub fn expectations(&self, image_env: Vec<String>) -> orchestrator_attest::Expectations {
        orchestrator_attest::Expectations {
            run_id: self.run_id.clone(),
            worktree_host_path: self.worktree_host.to_string_lossy().into_owned(),
            workspace_target: WORKSPACE.to_string(),
            door: self
                .door
                .as_ref()
                .map(|d| orchestrator_attest::MountExpectation {
                    host_path: d.to_string_lossy().into_owned(),
                    target: DOOR_MOUNT.to_string(),
                }),
            allowed_env: self.env.clone(),
            image_env,
            max_memory_bytes: self.caps.memory_bytes,
            max_pids: self.caps.pids,
            max_nproc: SHARED_NPROC,
            allowed_tmpfs: self.tmpfs.keys().cloned().collect::<BTreeSet<_>>(),
            seccomp_profile_digest: orchestrator_attest::seccomp_profile_digest(
                &self.seccomp_profile(),
            )
            .unwrap_or_default(),
            max_shm_bytes: self.caps.shm_bytes(),
            max_file_bytes: i64::try_from(self.caps.max_worktree_bytes).unwrap_or(i64::MAX),
            main_process: self.lease_is_pid1().then(|| LEASE_WRAPPER.to_string()),
            setup_cache: self
                .setup_cache
                .as_ref()
                .map(|c| orchestrator_attest::MountExpectation {
                    host_path: c.to_string_lossy().into_owned(),
                    target: SETUP_CACHE_MOUNT.to_string(),
                }),
            runtime: self.runtime.clone(),
        }
    }

    /// The seccomp profile its runtime is given ([`seccomp_profile_for`]).
    pub fn seccomp_profile(&self) -> std::borrow::Cow<'static, str> {
        seccomp_profile_for(self.runtime.as_deref())
    }

    /// Runs it with the OCI runtime `runtime` (`None`: the engine's default).
    pub fn with_runtime(mut self, runtime: Option<String>) -> Self {
        self.runtime = runtime;
        self
    }
}

/// The port the relay listens on inside every sandbox (on 127.0.0.1).
pub const RELAY_PORT: u16 = 7878;
/// The key every client in the sandbox is given: SDKs refuse to start
/// without one. It opens nothing; the gateway drops it.
pub const PLACEHOLDER_KEY: &str = "nightshift-model-gateway";
/// The relay's name in the door's `bin/`.
pub const RELAY: &str = "nightshift-relay";

/// The environment that points the usual clients at the relay.
pub fn sandbox_env(port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("OPENAI_BASE_URL", format!("http://127.0.0.1:{port}/v1")),
        ("OPENAI_API_KEY", PLACEHOLDER_KEY.to_string()),
        ("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{port}")),
        ("ANTHROPIC_API_KEY", PLACEHOLDER_KEY.to_string()),
        ("ANTHROPIC_AUTH_TOKEN", PLACEHOLDER_KEY.to_string()),
        (
            "NIGHTSHIFT_MODEL_GATEWAY",
            format!("http://127.0.0.1:{port}"),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SandboxSpec {
        SandboxSpec::new(
            "r1",
            "st",
            "img",
            &["true".to_string()],
            PathBuf::from("/s/w"),
            "do it",
            &Caps::default(),
        )
    }

    #[test]
    fn the_profile_is_json_with_a_digest_and_leaves_out_what_it_must() {
        let digest = orchestrator_attest::seccomp_profile_digest(SECCOMP_PROFILE);
        assert_eq!(digest.map(|d| d.len()), Some(64));
        let profile: serde_json::Value = serde_json::from_str(SECCOMP_PROFILE).unwrap();
        let rules = profile["syscalls"].as_array().unwrap();
        for rule in rules {
            assert!(rule["includes"]["caps"].is_null(), "{rule}");
        }
        let allowed = |name: &str| {
            rules.iter().any(|r| {
                r["action"] == "SCMP_ACT_ALLOW"
                    && r["names"].as_array().unwrap().iter().any(|n| n == name)
            })
        };
        for name in [
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "bpf",
            "userfaultfd",
            "perf_event_open",
            "keyctl",
            "add_key",
            "request_key",
            "socketcall",
            "unshare",
            "setns",
            "mount",
        ] {
            assert!(!allowed(name), "{name} is allowed");
        }
        for name in ["read", "write", "execve", "clone", "socket", "personality"] {
            assert!(allowed(name), "{name} is not allowed");
        }
        // Every socket rule names its family.
        for rule in rules.iter().filter(|r| r["names"][0] == "socket") {
            assert_eq!(rule["args"][0]["index"], 0, "{rule}");
            assert_eq!(rule["args"][0]["op"], "SCMP_CMP_EQ", "{rule}");
        }
        for name in [
            "name_to_handle_at",
            "open_by_handle_at",
            "pkey_alloc",
            "pkey_free",
            "pkey_mprotect",
        ] {
            assert!(!allowed(name), "{name} is allowed");
        }
    }

    /// An argument filter holds only on the native ABI: a 32-bit entry point
    /// (`int 0x80`'s `socketcall`, x32, arm's 32-bit) reaches the same
    /// kernel code with arguments the filter cannot see. So the profile
    /// lists each architecture alone, and none of the 32-bit ones at all.
    #[test]
    fn the_profile_lists_only_native_architectures() {
        let profile: serde_json::Value = serde_json::from_str(SECCOMP_PROFILE).unwrap();
        assert!(
            profile["architectures"].is_null(),
            "{}",
            profile["architectures"]
        );
        let natives = [
            "SCMP_ARCH_X86_64",
            "SCMP_ARCH_AARCH64",
            "SCMP_ARCH_MIPS64",
            "SCMP_ARCH_MIPSEL64",
            "SCMP_ARCH_S390X",
            "SCMP_ARCH_RISCV64",
            "SCMP_ARCH_LOONGARCH64",
        ];
        let map = profile["archMap"].as_array().unwrap();
        assert!(!map.is_empty());
        for entry in map {
            let arch = entry["architecture"].as_str().unwrap();
            assert!(natives.contains(&arch), "{arch} is not a native 64-bit ABI");
            let subs = entry["subArchitectures"].as_array().map_or(0, Vec::len);
            assert_eq!(subs, 0, "{arch} lists sub-architectures: {entry}");
        }
    }

    #[test]
    fn with_a_door_the_lease_wrapper_runs_the_command() {
        let plain = spec();
        let doored = spec().with_door(PathBuf::from("/state/doors/r1"));
        assert_eq!(doored.command[0], LEASE_WRAPPER);
        assert_eq!(
            doored.command[1..4],
            ["--bound-ms".to_string(), "30000".into(), "--".into()]
        );
        assert_eq!(doored.command[4..], plain.command[..]);
    }

    #[test]
    fn the_user_is_the_configured_one_home_included() {
        let user = SandboxUser { uid: 7, gid: 8 };
        let s = spec().with_user(user);
        assert_eq!(s.user(), "7:8");
        assert!(s.tmpfs[HOME].contains("uid=7,gid=8"), "{}", s.tmpfs[HOME]);
        assert_eq!(spec().user(), "2000000000:2000000000");
    }

    #[test]
    fn shm_and_limits_follow_the_caps() {
        let caps = Caps::default();
        assert_eq!(caps.shm_bytes(), 32 << 20);
        let small = Caps {
            memory_bytes: 64 << 20,
            ..Caps::default()
        };
        assert_eq!(small.shm_bytes(), 8 << 20);
        let limits = spec().ulimits();
        let get = |n: &str| limits.iter().find(|u| u.name == n).unwrap();
        assert_eq!((get("core").soft, get("core").hard), (0, 0));
        assert_eq!(get("fsize").hard, caps.max_worktree_bytes as i64);
        assert_eq!(get("nproc").hard, SHARED_NPROC);
        // Never the run's own cap: one run asking for more cannot raise the
        // limit every sandbox shares.
        let greedy = SandboxSpec {
            caps: Caps {
                pids: 4 * SHARED_NPROC,
                ..Caps::default()
            },
            ..spec()
        };
        let limits = greedy.ulimits();
        let nproc = limits.iter().find(|u| u.name == "nproc").unwrap();
        assert_eq!((nproc.soft, nproc.hard), (SHARED_NPROC, SHARED_NPROC));
        assert_eq!(greedy.expectations(vec![]).max_nproc, SHARED_NPROC);
        let masked = spec().masked_paths();
        for p in [
            "/proc/kcore",
            "/proc/cmdline",
            "/proc/config.gz",
            "/sys/kernel/vmcoreinfo",
            "/sys/kernel/boot_params",
        ] {
            assert!(masked.iter().any(|m| m == p), "{p}");
        }
    }

    #[test]
    fn environment_is_the_allowlist_only() {
        // A variable in the supervisor's environment must not reach the spec.
        std::env::set_var("NIGHTSHIFT_SENTINEL_SECRET", "hunter2");
        let s = spec();
        let keys: Vec<_> = s.env.keys().cloned().collect();
        assert_eq!(
            keys,
            [
                "HOME",
                "LANG",
                "NIGHTSHIFT_RUN_ID",
                "NIGHTSHIFT_TASK",
                "PATH"
            ]
        );
        assert!(!s.env_list().iter().any(|e| e.contains("hunter2")));
    }

    #[test]
    fn tmpfs_mounts_are_size_limited() {
        for opts in spec().tmpfs.values() {
            assert!(opts.contains("size="), "{opts}");
        }
    }

    #[test]
    fn gvisor_differs_only_in_clone3() {
        use serde_json::Value;
        assert_eq!(seccomp_profile_for(None), SECCOMP_PROFILE);
        assert_eq!(seccomp_profile_for(Some("runc")), SECCOMP_PROFILE);
        let ours: Value = serde_json::from_str(SECCOMP_PROFILE).unwrap();
        let gvisor: Value = serde_json::from_str(&seccomp_profile_for(Some("runsc"))).unwrap();
        assert_ne!(ours, gvisor);
        let rules = |v: &Value| v["syscalls"].as_array().unwrap().clone();
        let (a, b) = (rules(&ours), rules(&gvisor));
        assert_eq!(a.len(), b.len());
        let mut changed = 0;
        for (x, y) in a.iter().zip(&b) {
            if x != y {
                changed += 1;
                assert_eq!(x["names"], serde_json::json!(["clone3"]));
                assert_eq!(x["errnoRet"], 38);
                assert_eq!(y["action"], "SCMP_ACT_ALLOW");
            }
        }
        assert_eq!(changed, 1);
        assert_eq!(ours["defaultAction"], gvisor["defaultAction"]);
        let spec = spec().with_runtime(Some("runsc".into()));
        assert_eq!(
            spec.expectations(vec![]).seccomp_profile_digest,
            orchestrator_attest::seccomp_profile_digest(&seccomp_profile_for(Some("runsc")))
                .unwrap()
        );
    }
}
