//! What a run's container must be: the Tier 0 specification, as plain data.
//!
//! Invariants:
//! - The environment is built only from the allowlist below; nothing from the
//!   supervisor's own environment is ever copied in.
//! - The worktree is the only host path mounted writable; everything else the
//!   sandbox can write is a size-limited tmpfs.
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
pub const SANDBOX_UID: u32 = 1000;
pub const SANDBOX_GID: u32 = 1000;
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Label keys that mark a container as one of ours.
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
}

impl Caps {
    /// Output past the cap is dropped; past this ceiling the run is killed.
    pub fn output_ceiling(&self) -> u64 {
        self.max_output_bytes.saturating_mul(4)
    }
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
}

impl SandboxSpec {
    /// Marks the sandbox with the supervisor that owns it.
    pub fn with_supervisor(mut self, identity: &str) -> Self {
        self.labels
            .insert(LABEL_SUPERVISOR.to_string(), identity.to_string());
        self
    }

    /// Mounts the run's door (read-only) and tells the clients where it is.
    pub fn with_door(mut self, dir: PathBuf) -> Self {
        self.door = Some(dir);
        self.env.insert(
            "NIGHTSHIFT_DOOR".to_string(),
            format!("{DOOR_MOUNT}/door.sock"),
        );
        self.env
            .insert("PATH".to_string(), format!("{DOOR_MOUNT}/bin:{PATH}"));
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
            (
                HOME.to_string(),
                format!(
                    "rw,nosuid,nodev,size={size},uid={SANDBOX_UID},gid={SANDBOX_GID},mode=0700"
                ),
            ),
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
        }
    }

    pub fn user(&self) -> String {
        format!("{SANDBOX_UID}:{SANDBOX_GID}")
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
            allowed_tmpfs: self.tmpfs.keys().cloned().collect::<BTreeSet<_>>(),
        }
    }
}

/// Makes untrusted output safe to show on a terminal: control characters
/// (escape sequences could rewrite what the person sees) become visible
/// escapes; newlines and tabs stay.
pub fn sanitize_for_terminal(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' | '\t' => out.push(c),
            c if c.is_control() => out.push_str(&c.escape_unicode().to_string()),
            c => out.push(c),
        }
    }
    out
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
    fn escape_sequences_are_made_visible() {
        let shown = sanitize_for_terminal(b"ok\x1b]0;pwned\x07\n");
        assert!(!shown.contains('\x1b'));
        assert!(shown.contains("\\u{1b}"));
        assert!(shown.ends_with('\n'));
    }
}
