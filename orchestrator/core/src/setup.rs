//! The trusted setup phase, as data and pure decisions (issue 24,
//! docs/setup.md): what the owner declared (`[[setup]]`, `run --setup`),
//! the presets' commands and the offline environment they leave the
//! agent, the cache key, which tree setup may run on, which cached entry a
//! run may use instead, and what `setup prune` removes. The adapter that
//! carries it out is `orchestrator/supervisor/src/setup.rs`.
//!
//! Invariants:
//! - the cache key is the digest of the setup command, the image (its
//!   reference and the engine's id) and every lockfile found at the tree
//!   setup ran on (path and content digest), framed so that no two
//!   different inputs share a key, whatever order the lockfiles came in
//!   (`tests::the_key_follows_every_input_and_no_order`);
//! - setup never runs on a tree an agent wrote unless the owner allowed it
//!   for that repository: a base named under `refs/nightshift/`, or one no
//!   owner ref reaches, gets the last trusted cache of the repository or a
//!   refusal (`tests::an_agent_written_tree_never_reaches_setup_unless_allowed`);
//! - a cache entry is only ever chosen for the repository it was built
//!   for, and only a trusted one stands in for an agent-written tree
//!   (`tests::another_repositorys_cache_is_never_chosen`);
//! - a setup container starts only if the engine reports exactly its
//!   mounts (the read-only checkout, the cache, the owner's credentials and
//!   CA bundle: no door), no privilege and none of the host's namespaces
//!   (`tests::a_setup_container_is_judged_by_what_the_engine_made`);
//! - pruning keeps the newest `keep` entries of each repository and never
//!   removes an entry younger than `older_than`
//!   (`tests::prune_keeps_the_newest_of_each_repository`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::sandbox::{Caps, SandboxUser, HOME, PATH};

/// Where the cache is mounted: read-write in the setup container,
/// read-only in the agent's sandbox.
pub use crate::sandbox::SETUP_CACHE_MOUNT as CACHE_MOUNT;
/// Where the read-only checkout of the base is mounted in the setup
/// container (the agent's worktree is mounted at the same place).
pub const CHECKOUT_MOUNT: &str = crate::sandbox::WORKSPACE;
/// Where the owner's registry credential files are mounted (read-only),
/// each under its own file name.
pub const CREDENTIALS_MOUNT: &str = "/run/nightshift-setup/credentials";
/// Where the host's CA bundle is mounted (read-only) in the setup container.
pub const CA_MOUNT: &str = "/run/nightshift-setup/ca-certificates.crt";
/// The label that marks a setup container (beside the run's own labels).
pub const LABEL_SETUP: &str = "nightshift.setup";
/// The default bound of one cache entry.
pub const DEFAULT_MAX_BYTES: u64 = 2 << 30;
/// How much of the setup's output is kept (the rest is counted).
pub const MAX_SETUP_OUTPUT: u64 = 1 << 20;
/// How much of it a failed run's reason quotes (its end).
pub const REASON_TAIL: usize = 1500;
/// The longest a setup may run.
pub const MAX_SETUP_TIME: Duration = Duration::from_secs(30 * 60);
/// The lockfiles the key reads by default (file names, at any depth;
/// `requirements*.txt` is a pattern).
pub const DEFAULT_LOCKFILES: [&str; 5] = [
    "Cargo.lock",
    "requirements*.txt",
    "uv.lock",
    "poetry.lock",
    "package-lock.json",
];
/// The longest lockfile read for the key.
pub const MAX_LOCKFILE_BYTES: u64 = 64 << 20;

/// The presets: one command each, and the environment that makes the
/// agent's tools use what it fetched without the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    Rust,
    Python,
    Node,
}

impl Preset {
    pub const ALL: [Preset; 3] = [Preset::Rust, Preset::Python, Preset::Node];

    pub fn name(self) -> &'static str {
        match self {
            Preset::Rust => "rust",
            Preset::Python => "python",
            Preset::Node => "node",
        }
    }

    pub fn parse(name: &str) -> Option<Preset> {
        Preset::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The shell script the setup container runs (`sh -c`, in the
    /// read-only checkout).
    ///
    /// - rust: `cargo fetch --locked` into `CARGO_HOME=/cache/cargo`. Debian
    ///   bookworm's cargo 1.65 reaches crates.io's index over git from
    ///   github.com unless told to use the sparse protocol
    ///   (`index.crates.io`), which it holds behind `RUSTC_BOOTSTRAP=1`;
    ///   `cargo fetch` runs no build script.
    /// - python: `pip download --only-binary=:all:` of every
    ///   `requirements*.txt` at the root into `/cache/wheelhouse`: wheels
    ///   only, so no package's `setup.py` runs here.
    /// - node: `npm ci --ignore-scripts` of `package.json` and
    ///   `package-lock.json` (copied out of the read-only checkout) with its
    ///   cache at `/cache/npm`: no lifecycle script runs here.
    pub fn script(self) -> &'static str {
        match self {
            Preset::Rust => concat!(
                "set -e\n",
                "export CARGO_HOME=/cache/cargo\n",
                "mkdir -p \"$CARGO_HOME\"\n",
                "printf '[unstable]\\nsparse-registry = true\\n\\n[registries.crates-io]\\nprotocol = \"sparse\"\\n' > \"$CARGO_HOME/config.toml\"\n",
                "RUSTC_BOOTSTRAP=1 cargo fetch --locked\n",
            ),
            Preset::Python => concat!(
                "set -e\n",
                "mkdir -p /cache/wheelhouse\n",
                "found=0\n",
                "for f in requirements*.txt; do\n",
                "  [ -f \"$f\" ] || continue\n",
                "  found=1\n",
                "  python3 -m pip download --disable-pip-version-check --no-cache-dir --only-binary=:all: -r \"$f\" -d /cache/wheelhouse\n",
                "done\n",
                "[ \"$found\" = 1 ] || { echo 'no requirements*.txt at the root of the repository' >&2; exit 1; }\n",
            ),
            Preset::Node => concat!(
                "set -e\n",
                "mkdir -p /cache/npm /tmp/npm-setup\n",
                "cp package.json package-lock.json /tmp/npm-setup/\n",
                "cd /tmp/npm-setup\n",
                "npm ci --ignore-scripts --no-audit --no-fund --cache /cache/npm\n",
            ),
        }
    }

    /// The agent's environment for this preset's cache (mounted read-only
    /// at [`CACHE_MOUNT`]).
    pub fn offline_env(self) -> Vec<(&'static str, String)> {
        match self {
            Preset::Rust => vec![
                ("CARGO_HOME", format!("{CACHE_MOUNT}/cargo")),
                ("CARGO_NET_OFFLINE", "true".into()),
                // The index was fetched over the sparse protocol, which
                // bookworm's cargo reads only with unstable features on.
                ("RUSTC_BOOTSTRAP", "1".into()),
            ],
            Preset::Python => vec![
                ("PIP_NO_INDEX", "1".into()),
                ("PIP_FIND_LINKS", format!("{CACHE_MOUNT}/wheelhouse")),
            ],
            Preset::Node => vec![
                ("npm_config_offline", "true".into()),
                ("npm_config_cache", format!("{CACHE_MOUNT}/npm")),
            ],
        }
    }
}

/// What the setup runs: a preset, or the owner's own shell command (run as
/// `sh -c COMMAND` in the checkout, writing into `$NIGHTSHIFT_SETUP_CACHE`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetupCommand {
    Preset(Preset),
    Command(String),
}

impl SetupCommand {
    /// `run --setup WORD`: a preset's name, else a command.
    pub fn parse(text: &str) -> Result<SetupCommand, String> {
        let t = text.trim();
        if t.is_empty() {
            return Err("--setup needs a preset (rust, python, node) or a command".into());
        }
        Ok(Preset::parse(t)
            .map(SetupCommand::Preset)
            .unwrap_or_else(|| SetupCommand::Command(t.to_string())))
    }

    /// The shell script, as the key and the container see it.
    pub fn script(&self) -> &str {
        match self {
            SetupCommand::Preset(p) => p.script(),
            SetupCommand::Command(c) => c,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            SetupCommand::Preset(p) => format!("preset {}", p.name()),
            SetupCommand::Command(_) => "the owner's command".into(),
        }
    }

    /// The agent's environment: the preset's, or for an owner's command
    /// where the cache is and every tool's offline switch.
    pub fn offline_env(&self) -> BTreeMap<String, String> {
        let mut env = BTreeMap::from([(
            "NIGHTSHIFT_SETUP_CACHE".to_string(),
            CACHE_MOUNT.to_string(),
        )]);
        match self {
            SetupCommand::Preset(p) => {
                env.extend(p.offline_env().into_iter().map(|(k, v)| (k.to_string(), v)))
            }
            SetupCommand::Command(_) => {
                for (k, v) in [
                    ("CARGO_NET_OFFLINE", "true"),
                    ("PIP_NO_INDEX", "1"),
                    ("npm_config_offline", "true"),
                ] {
                    env.insert(k.to_string(), v.to_string());
                }
            }
        }
        env
    }
}

/// The setup of one run, after the configuration and `--setup`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupPlan {
    pub command: SetupCommand,
    /// Lockfile names (a `*` matches any run of characters).
    pub lockfiles: Vec<String>,
    pub allow_agent_refs: bool,
    /// Host files mounted read-only at [`CREDENTIALS_MOUNT`]`/NAME`.
    pub credentials: Vec<PathBuf>,
    pub max_bytes: u64,
}

impl SetupPlan {
    pub fn new(command: SetupCommand) -> SetupPlan {
        SetupPlan {
            command,
            lockfiles: DEFAULT_LOCKFILES.iter().map(|s| s.to_string()).collect(),
            allow_agent_refs: false,
            credentials: Vec::new(),
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// Does `name` (a file name) match `pattern` (`*` any run of characters)?
pub fn name_matches(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match p.split_first() {
            None => n.is_empty(),
            Some((b'*', rest)) => (0..=n.len()).any(|i| go(rest, &n[i..])),
            Some((c, rest)) => n.first() == Some(c) && go(rest, &n[1..]),
        }
    }
    go(pattern.as_bytes(), name.as_bytes())
}

/// Is `path` (any depth) a lockfile by one of `patterns`?
pub fn is_lockfile(patterns: &[String], path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    patterns.iter().any(|p| name_matches(p, name))
}

/// Is `path` a lockfile by the default names? (The risky-path review flags
/// it: the agent changed what the next setup fetches.)
pub fn is_default_lockfile(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    DEFAULT_LOCKFILES
        .iter()
        .any(|p| name_matches(&p.to_ascii_lowercase(), &name.to_ascii_lowercase()))
}

/// One lockfile as the key reads it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Lockfile {
    pub path: String,
    /// Hex sha256 of its content.
    pub digest: String,
}

/// The cache key: hex sha256 over the framed inputs.
pub fn cache_key(script: &str, image: &str, image_id: &str, lockfiles: &[Lockfile]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    field(b"nightshift-setup-key-v1");
    field(script.as_bytes());
    field(image.as_bytes());
    field(image_id.as_bytes());
    let mut sorted: Vec<&Lockfile> = lockfiles.iter().collect();
    sorted.sort();
    sorted.dedup();
    field(&(sorted.len() as u64).to_be_bytes());
    for l in sorted {
        field(l.path.as_bytes());
        field(l.digest.as_bytes());
    }
    hex::encode(h.finalize())
}

/// The repository's directory name under `STATE/setup/`: a digest of its
/// canonical path.
pub fn repository_id(canonical_path: &str) -> String {
    crate::audit_log::digest(canonical_path.as_bytes())[..20].to_string()
}

/// A base that names a run's result (or anything nightshift keeps under
/// `refs/nightshift/`): agent-written.
pub fn is_agent_ref(base_ref: &str) -> bool {
    let r = base_ref.trim();
    r.starts_with("refs/nightshift/") || r.starts_with("nightshift/")
}

/// One published cache entry (`STATE/setup/<repository>/<key>/meta.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheEntry {
    /// The repository's canonical path.
    pub repository: String,
    pub key: String,
    /// Hex sha256 of the setup script.
    pub command_digest: String,
    pub image: String,
    pub image_id: String,
    /// The commit setup ran on.
    pub commit: String,
    /// Built on a tree no agent wrote.
    pub trusted: bool,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// Unix seconds of the same moment (what prune compares).
    pub created_unix: i64,
    pub bytes: u64,
    /// Hex sha256 over every path, kind, mode and content in the entry.
    pub digest: String,
    pub lockfiles: Vec<Lockfile>,
    /// The agent's offline environment for this cache.
    pub env: BTreeMap<String, String>,
}

/// Where setup may run, or what stands in for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeDecision {
    /// Run (or reuse by key) on the base commit.
    Base,
    /// The base is agent-written and the owner did not allow it: the last
    /// trusted cache of the repository instead; setup does not run.
    LastTrusted(Box<CacheEntry>),
    /// Neither: the run is refused with this reason.
    Refuse(String),
}

/// Which tree setup may run on. `agent_written`: the base is named under
/// `refs/nightshift/` or no owner ref reaches it. `entries`: the caches
/// already published (of every repository: only `repository`'s count).
pub fn tree_for_setup(
    repository: &str,
    base_ref: &str,
    agent_written: bool,
    allow_agent_refs: bool,
    command_digest: &str,
    image_id: &str,
    entries: &[CacheEntry],
) -> TreeDecision {
    if !agent_written || allow_agent_refs {
        return TreeDecision::Base;
    }
    match last_trusted(repository, command_digest, image_id, entries) {
        Some(e) => TreeDecision::LastTrusted(Box::new(e.clone())),
        None => TreeDecision::Refuse(format!(
            "the base {base_ref} is a tree an agent wrote, and setup runs on it only if the owner allows it ([[setup]] allow_agent_refs = true for this repository); no trusted setup cache of this repository for this command and image exists to use instead (run once on an owner's branch first)"
        )),
    }
}

/// The newest trusted entry of `repository` made by the same command and
/// image.
pub fn last_trusted<'a>(
    repository: &str,
    command_digest: &str,
    image_id: &str,
    entries: &'a [CacheEntry],
) -> Option<&'a CacheEntry> {
    entries
        .iter()
        .filter(|e| {
            e.repository == repository
                && e.trusted
                && e.command_digest == command_digest
                && e.image_id == image_id
        })
        .max_by(|a, b| {
            (a.created_unix, &a.created_at, &a.key).cmp(&(b.created_unix, &b.created_at, &b.key))
        })
}

/// The entry of `repository` with `key`, if published.
pub fn find<'a>(repository: &str, key: &str, entries: &'a [CacheEntry]) -> Option<&'a CacheEntry> {
    entries
        .iter()
        .find(|e| e.repository == repository && e.key == key)
}

/// What `setup prune` removes: `(repository, key)` of each entry past the
/// newest `keep` of its repository, or older than `older_than` (both when
/// both are given: an entry goes when either says so, except that the
/// newest `keep` always stay).
pub fn prune(
    entries: &[CacheEntry],
    keep: Option<usize>,
    older_than: Option<Duration>,
    now_unix: i64,
) -> Vec<(String, String)> {
    let mut by_repo: BTreeMap<&str, Vec<&CacheEntry>> = BTreeMap::new();
    for e in entries {
        by_repo.entry(&e.repository).or_default().push(e);
    }
    let mut out = Vec::new();
    for (repo, mut list) in by_repo {
        list.sort_by(|a, b| (b.created_unix, &b.key).cmp(&(a.created_unix, &a.key)));
        for (i, e) in list.iter().enumerate() {
            let kept_by_count = keep.is_some_and(|k| i < k);
            let past_count = keep.is_some_and(|k| i >= k);
            let too_old = older_than.is_some_and(|d| {
                now_unix.saturating_sub(e.created_unix)
                    > i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
            });
            if !kept_by_count && (past_count || too_old) {
                out.push((repo.to_string(), e.key.clone()));
            }
        }
    }
    out
}

/// Everything the engine needs to create a setup container: not a
/// sandbox. It has network (the engine's default bridge: plain network,
/// not an allowlist), no door, no model gateway; its only host paths are
/// the read-only checkout of the base, the cache being built (read-write),
/// the owner's credential files and the host's CA bundle (read-only).
#[derive(Debug, Clone, PartialEq)]
pub struct SetupSpec {
    pub run_id: String,
    pub name: String,
    pub image: String,
    pub command: Vec<String>,
    pub checkout: PathBuf,
    pub cache: PathBuf,
    /// (host file, container path), read-only.
    pub credentials: Vec<(PathBuf, String)>,
    pub ca_bundle: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    pub tmpfs: BTreeMap<String, String>,
    pub caps: Caps,
    pub user: SandboxUser,
    pub cgroup_parent: Option<String>,
}

impl SetupSpec {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        run_id: &str,
        state_tag: &str,
        supervisor: &str,
        image: &str,
        script: &str,
        checkout: PathBuf,
        cache: PathBuf,
        caps: &Caps,
        user: SandboxUser,
    ) -> SetupSpec {
        let env = BTreeMap::from([
            ("PATH".to_string(), PATH.to_string()),
            ("HOME".to_string(), HOME.to_string()),
            ("LANG".to_string(), "C.UTF-8".to_string()),
            (
                "NIGHTSHIFT_SETUP_CACHE".to_string(),
                CACHE_MOUNT.to_string(),
            ),
        ]);
        let labels = BTreeMap::from([
            (crate::sandbox::LABEL_RUN.to_string(), run_id.to_string()),
            (
                crate::sandbox::LABEL_STATE.to_string(),
                state_tag.to_string(),
            ),
            (crate::sandbox::LABEL_MANAGED.to_string(), "1".to_string()),
            (
                crate::sandbox::LABEL_SUPERVISOR.to_string(),
                supervisor.to_string(),
            ),
            (LABEL_SETUP.to_string(), "1".to_string()),
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
                    "rw,nosuid,nodev,size={size},uid={},gid={},mode=0700",
                    user.uid, user.gid
                ),
            ),
        ]);
        SetupSpec {
            run_id: run_id.to_string(),
            name: format!("nightshift-setup-{run_id}"),
            image: image.to_string(),
            command: vec!["sh".into(), "-c".into(), script.to_string()],
            checkout,
            cache,
            credentials: Vec::new(),
            ca_bundle: None,
            env,
            labels,
            tmpfs,
            caps: caps.clone(),
            user,
            cgroup_parent: None,
        }
    }

    /// Gives the container the host's CA bundle and points the usual
    /// clients at it (a TLS-inspecting proxy in front of the host).
    pub fn with_ca_bundle(mut self, bundle: PathBuf) -> SetupSpec {
        self.ca_bundle = Some(bundle);
        for k in [
            "SSL_CERT_FILE",
            "PIP_CERT",
            "REQUESTS_CA_BUNDLE",
            "CARGO_HTTP_CAINFO",
            "GIT_SSL_CAINFO",
            "NODE_EXTRA_CA_CERTS",
            "npm_config_cafile",
        ] {
            self.env.insert(k.to_string(), CA_MOUNT.to_string());
        }
        self
    }

    /// Mounts each credential file at [`CREDENTIALS_MOUNT`]`/NAME`.
    pub fn with_credentials(mut self, files: &[PathBuf]) -> SetupSpec {
        self.credentials = files
            .iter()
            .map(|f| {
                let name = f
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                (f.clone(), format!("{CREDENTIALS_MOUNT}/{name}"))
            })
            .collect();
        self
    }

    pub fn user(&self) -> String {
        format!("{}:{}", self.user.uid, self.user.gid)
    }

    pub fn env_list(&self) -> Vec<String> {
        self.env.iter().map(|(k, v)| format!("{k}={v}")).collect()
    }
}

/// Checks the engine's inspect document of a created setup container
/// against its spec before it starts: the engine's own report, not our
/// request. Its mounts must be exactly the checkout (read-only), the cache
/// (read-write), the credentials and the CA bundle (read-only), with no
/// door among them; no privilege, no capability added, not the host's
/// network, PID or IPC namespace. The first problem found, else `Ok`.
pub fn check_setup_container(
    inspected: &serde_json::Value,
    spec: &SetupSpec,
) -> Result<(), String> {
    let mut wanted: Vec<(String, String, bool)> = vec![
        (
            spec.checkout.display().to_string(),
            CHECKOUT_MOUNT.to_string(),
            false,
        ),
        (
            spec.cache.display().to_string(),
            CACHE_MOUNT.to_string(),
            true,
        ),
    ];
    wanted.extend(
        spec.credentials
            .iter()
            .map(|(h, t)| (h.display().to_string(), t.clone(), false)),
    );
    if let Some(ca) = &spec.ca_bundle {
        wanted.push((ca.display().to_string(), CA_MOUNT.to_string(), false));
    }
    let mounts = inspected["Mounts"]
        .as_array()
        .ok_or("the engine reports no mount list")?;
    let mut seen = Vec::new();
    for m in mounts {
        let (kind, source, dest) = (
            m["Type"].as_str().unwrap_or(""),
            m["Source"].as_str().unwrap_or(""),
            m["Destination"].as_str().unwrap_or(""),
        );
        let rw = m["RW"].as_bool().unwrap_or(true);
        match wanted.iter().find(|(s, d, _)| s == source && d == dest) {
            Some((_, _, want_rw)) if kind == "bind" && rw == *want_rw => {
                seen.push(dest.to_string())
            }
            _ => {
                return Err(format!(
                    "unexpected mount {kind} {source} -> {dest} {}",
                    if rw { "rw" } else { "ro" }
                ))
            }
        }
    }
    if let Some((_, d, _)) = wanted.iter().find(|(_, d, _)| !seen.contains(d)) {
        return Err(format!("missing mount at {d}"));
    }
    let hc = &inspected["HostConfig"];
    if hc["Privileged"] != serde_json::Value::Bool(false) {
        return Err("privileged (or not reported)".into());
    }
    if hc["CapAdd"].as_array().is_some_and(|a| !a.is_empty()) {
        return Err(format!("capabilities added: {}", hc["CapAdd"]));
    }
    for (key, what) in [
        ("NetworkMode", "network"),
        ("PidMode", "pid"),
        ("IpcMode", "ipc"),
    ] {
        if hc[key] == "host" {
            return Err(format!("the host's {what} namespace"));
        }
    }
    Ok(())
}

/// The setup's output kept for the record: its last [`REASON_TAIL`]
/// characters, cut at a character boundary.
pub fn reason_tail(output: &str) -> &str {
    if output.len() <= REASON_TAIL {
        return output;
    }
    let mut start = output.len() - REASON_TAIL;
    while !output.is_char_boundary(start) {
        start += 1;
    }
    &output[start..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(repo: &str, key: &str, trusted: bool, at: i64) -> CacheEntry {
        CacheEntry {
            repository: repo.into(),
            key: key.into(),
            command_digest: "c".into(),
            image: "img".into(),
            image_id: "sha256:i".into(),
            commit: "0".repeat(40),
            trusted,
            created_at: format!("t{at}"),
            created_unix: at,
            bytes: 1,
            digest: "d".into(),
            lockfiles: vec![],
            env: BTreeMap::new(),
        }
    }

    fn lock(path: &str, digest: &str) -> Lockfile {
        Lockfile {
            path: path.into(),
            digest: digest.into(),
        }
    }

    proptest! {
        #[test]
        fn the_key_follows_every_input_and_no_order(
            script in "[a-z ]{0,12}",
            image in "[a-z:]{0,8}",
            id in "[a-f0-9]{0,8}",
            files in proptest::collection::btree_map("[a-z./]{1,8}", "[a-f0-9]{1,6}", 0..5),
            change in 0usize..4,
            extra in "[a-z]{1,3}",
        ) {
            let locks: Vec<Lockfile> = files.iter().map(|(p, d)| lock(p, d)).collect();
            let key = cache_key(&script, &image, &id, &locks);
            let mut reversed = locks.clone();
            reversed.reverse();
            prop_assert_eq!(&key, &cache_key(&script, &image, &id, &reversed));
            let changed = match change {
                0 => cache_key(&format!("{script}{extra}"), &image, &id, &locks),
                1 => cache_key(&script, &format!("{image}{extra}"), &id, &locks),
                2 => cache_key(&script, &image, &format!("{id}{extra}"), &locks),
                _ => {
                    let mut more = locks.clone();
                    match more.first_mut() {
                        Some(l) => l.digest.push_str(&extra),
                        None => more.push(lock(&extra, "0")),
                    }
                    cache_key(&script, &image, &id, &more)
                }
            };
            prop_assert_ne!(&key, &changed);
            // Moving bytes from one field to the next never collides.
            if !script.is_empty() {
                let (a, b) = script.split_at(script.len() - 1);
                prop_assert_ne!(&key, &cache_key(a, &format!("{b}{image}"), &id, &locks));
            }
        }

        #[test]
        fn an_agent_written_tree_never_reaches_setup_unless_allowed(
            agent in any::<bool>(),
            allow in any::<bool>(),
            trusted in proptest::collection::vec((any::<bool>(), 0i64..100, 0usize..2), 0..6),
        ) {
            let entries: Vec<CacheEntry> = trusted
                .iter()
                .enumerate()
                .map(|(i, (t, at, repo))| entry(["/r", "/other"][*repo], &format!("k{i}"), *t, *at))
                .collect();
            let d = tree_for_setup("/r", "refs/nightshift/runs/x", agent, allow, "c", "sha256:i", &entries);
            match d {
                TreeDecision::Base => prop_assert!(!agent || allow),
                TreeDecision::LastTrusted(e) => {
                    prop_assert!(agent && !allow);
                    prop_assert!(e.trusted);
                    prop_assert_eq!(&e.repository, "/r");
                    // The newest trusted one of the repository.
                    let newest = entries.iter().filter(|x| x.trusted && x.repository == "/r").map(|x| x.created_unix).max();
                    prop_assert_eq!(Some(e.created_unix), newest);
                }
                TreeDecision::Refuse(why) => {
                    prop_assert!(agent && !allow);
                    prop_assert!(!entries.iter().any(|x| x.trusted && x.repository == "/r"));
                    prop_assert!(why.contains("allow_agent_refs"));
                }
            }
        }

        #[test]
        fn another_repositorys_cache_is_never_chosen(
            keys in proptest::collection::vec(("[ab]", 0usize..2, any::<bool>()), 0..8),
            want in "[ab]",
        ) {
            let entries: Vec<CacheEntry> = keys
                .iter()
                .enumerate()
                .map(|(i, (k, repo, t))| entry(["/r", "/other"][*repo], k, *t, i as i64))
                .collect();
            if let Some(e) = find("/r", &want, &entries) {
                prop_assert_eq!(&e.repository, "/r");
                prop_assert_eq!(&e.key, &want);
            }
            if let Some(e) = last_trusted("/r", "c", "sha256:i", &entries) {
                prop_assert_eq!(&e.repository, "/r");
                prop_assert!(e.trusted);
            }
            prop_assert!(last_trusted("/r", "c", "sha256:other-image", &entries).is_none());
        }

        #[test]
        fn prune_keeps_the_newest_of_each_repository(
            ages in proptest::collection::vec((0usize..3, 0i64..1000), 0..12),
            keep in proptest::option::of(0usize..4),
            older in proptest::option::of(0u64..1000),
        ) {
            let entries: Vec<CacheEntry> = ages
                .iter()
                .enumerate()
                .map(|(i, (repo, at))| entry(["/a", "/b", "/c"][*repo], &format!("k{i}"), true, *at))
                .collect();
            let now = 1000;
            let gone = prune(&entries, keep, older.map(Duration::from_secs), now);
            for repo in ["/a", "/b", "/c"] {
                let mut mine: Vec<&CacheEntry> = entries.iter().filter(|e| e.repository == repo).collect();
                mine.sort_by(|a, b| (b.created_unix, &b.key).cmp(&(a.created_unix, &a.key)));
                for (i, e) in mine.iter().enumerate() {
                    let removed = gone.contains(&(repo.to_string(), e.key.clone()));
                    if let Some(k) = keep {
                        if i < k { prop_assert!(!removed, "one of the newest {} removed", k); }
                    }
                    if let Some(o) = older {
                        let young = now - e.created_unix <= o as i64;
                        if young && keep.is_none_or(|k| i < k) { prop_assert!(!removed); }
                        if !young && keep.is_none_or(|k| i >= k) { prop_assert!(removed); }
                    }
                    if keep.is_none() && older.is_none() { prop_assert!(!removed); }
                }
            }
        }
    }

    #[test]
    fn a_setup_container_is_judged_by_what_the_engine_made() {
        let spec = SetupSpec::new(
            "r1",
            "st",
            "sup",
            "img",
            "true",
            "/s/checkout".into(),
            "/s/cache".into(),
            &Caps::default(),
            SandboxUser::default(),
        );
        let doc = |extra: Option<serde_json::Value>, privileged: bool| {
            let mut mounts = vec![
                serde_json::json!({"Type": "bind", "Source": "/s/checkout", "Destination": "/workspace", "RW": false}),
                serde_json::json!({"Type": "bind", "Source": "/s/cache", "Destination": "/cache", "RW": true}),
            ];
            mounts.extend(extra);
            serde_json::json!({"Mounts": mounts, "HostConfig": {"Privileged": privileged, "CapAdd": null, "NetworkMode": "bridge"}})
        };
        assert_eq!(check_setup_container(&doc(None, false), &spec), Ok(()));
        let door = serde_json::json!({"Type": "bind", "Source": "/s/doors/r1", "Destination": "/run/nightshift", "RW": false});
        assert!(check_setup_container(&doc(Some(door), false), &spec)
            .unwrap_err()
            .contains("/run/nightshift"));
        assert!(check_setup_container(&doc(None, true), &spec).is_err());
        let mut writable = doc(None, false);
        writable["Mounts"][0]["RW"] = serde_json::Value::Bool(true);
        assert!(check_setup_container(&writable, &spec)
            .unwrap_err()
            .contains("/workspace rw"));
        let mut host_net = doc(None, false);
        host_net["HostConfig"]["NetworkMode"] = "host".into();
        assert!(check_setup_container(&host_net, &spec).is_err());
        assert!(check_setup_container(&serde_json::json!({}), &spec).is_err());
    }

    #[test]
    fn presets_parse_and_others_are_commands() {
        assert_eq!(
            SetupCommand::parse("rust").unwrap(),
            SetupCommand::Preset(Preset::Rust)
        );
        assert_eq!(
            SetupCommand::parse("make deps").unwrap(),
            SetupCommand::Command("make deps".into())
        );
        assert!(SetupCommand::parse("  ").is_err());
        // npm's lifecycle scripts never run in the networked phase, and pip
        // takes wheels only (no setup.py runs).
        assert!(Preset::Node.script().contains("--ignore-scripts"));
        assert!(Preset::Python.script().contains("--only-binary=:all:"));
        assert!(Preset::Rust.script().contains("cargo fetch --locked"));
        let env = SetupCommand::Preset(Preset::Python).offline_env();
        assert_eq!(env["PIP_NO_INDEX"], "1");
        assert_eq!(env["PIP_FIND_LINKS"], "/cache/wheelhouse");
        let env = SetupCommand::Preset(Preset::Rust).offline_env();
        assert_eq!(env["CARGO_NET_OFFLINE"], "true");
        assert_eq!(env["CARGO_HOME"], "/cache/cargo");
        let env = SetupCommand::Preset(Preset::Node).offline_env();
        assert_eq!(env["npm_config_offline"], "true");
    }

    #[test]
    fn lockfiles_match_at_any_depth() {
        let d: Vec<String> = DEFAULT_LOCKFILES.iter().map(|s| s.to_string()).collect();
        for p in [
            "Cargo.lock",
            "crates/x/Cargo.lock",
            "requirements.txt",
            "requirements-dev.txt",
            "app/package-lock.json",
            "uv.lock",
            "poetry.lock",
        ] {
            assert!(is_lockfile(&d, p), "{p}");
            assert!(is_default_lockfile(p), "{p}");
        }
        for p in [
            "Cargo.toml",
            "requirements.md",
            "src/lock.rs",
            "package.json",
        ] {
            assert!(!is_lockfile(&d, p), "{p}");
        }
        assert!(is_default_lockfile("CARGO.LOCK"));
        assert!(name_matches("a*b*c", "aXXbYc"));
        assert!(!name_matches("a*b", "ab/c"[..3].as_ref()));
    }

    #[test]
    fn agent_refs_are_named_under_nightshift() {
        assert!(is_agent_ref("refs/nightshift/runs/01abc"));
        assert!(is_agent_ref("nightshift/runs/01abc"));
        assert!(!is_agent_ref("main"));
        assert!(!is_agent_ref("refs/heads/nightshift-ish"));
    }

    #[test]
    fn the_setup_container_is_marked_and_its_env_is_its_own() {
        std::env::set_var("NIGHTSHIFT_SENTINEL_SETUP", "hunter2");
        let s = SetupSpec::new(
            "r1",
            "st",
            "sup",
            "img",
            Preset::Rust.script(),
            "/c".into(),
            "/k".into(),
            &Caps::default(),
            SandboxUser::default(),
        )
        .with_ca_bundle("/etc/ssl/certs/ca-certificates.crt".into())
        .with_credentials(&["/home/o/.cargo/credentials.toml".into()]);
        assert_eq!(s.labels[LABEL_SETUP], "1");
        assert_eq!(s.name, "nightshift-setup-r1");
        assert!(!s.env_list().iter().any(|e| e.contains("hunter2")));
        assert_eq!(s.env["SSL_CERT_FILE"], CA_MOUNT);
        assert_eq!(
            s.credentials[0].1,
            "/run/nightshift-setup/credentials/credentials.toml"
        );
        assert!(reason_tail(&"é".repeat(2000)).len() <= REASON_TAIL);
    }
}
