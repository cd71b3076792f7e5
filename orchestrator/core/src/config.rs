//! The supervisor's configuration: `STATE/config.toml` (or `--config FILE`),
//! TOML into structs that refuse unknown fields. Every error names the file
//! and the line.
//!
//! Invariant: every cap has a safe default, so an absent file is a valid
//! configuration; a present but broken file is an error, never ignored
//! (`tests::absent_file_is_the_defaults`,
//! `tests::unknown_fields_and_bad_values_name_the_line`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::sandbox::{Caps, SandboxUser};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: line {line}: {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// A size in bytes, written `512`, `64k`, `64m`, `2g` (powers of 1024).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

/// A duration, written `30s`, `10m`, `2h` or a number of seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span(pub Duration);

pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim().to_ascii_lowercase();
    let t = t
        .strip_suffix("ib")
        .or_else(|| t.strip_suffix('b'))
        .unwrap_or(&t);
    let (digits, mult) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('g') => (&t[..t.len() - 1], 1 << 30),
        Some('t') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let n: u64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a size (like 512, 64k, 64m, 2g)"))?;
    n.checked_mul(mult)
        .filter(|v| *v > 0)
        .ok_or_else(|| format!("{text:?} is not a positive size that fits in 64 bits"))
}

pub fn parse_span(text: &str) -> Result<Duration, String> {
    let t = text.trim().to_ascii_lowercase();
    let (digits, mult) = match t.chars().last() {
        Some('s') => (&t[..t.len() - 1], 1u64),
        Some('m') => (&t[..t.len() - 1], 60),
        Some('h') => (&t[..t.len() - 1], 3600),
        Some('d') => (&t[..t.len() - 1], 86400),
        _ => (t.as_str(), 1),
    };
    let n: u64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (like 30s, 10m, 2h, 7d)"))?;
    n.checked_mul(mult)
        .filter(|v| *v > 0)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is not a positive duration"))
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) if n > 0 => Ok(Size(n)),
            Raw::N(_) => Err(serde::de::Error::custom("a size must be positive")),
            Raw::S(s) => parse_size(&s).map(Size).map_err(serde::de::Error::custom),
        }
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) if n > 0 => Ok(Span(Duration::from_secs(n))),
            Raw::N(_) => Err(serde::de::Error::custom("a duration must be positive")),
            Raw::S(s) => parse_span(&s).map(Span).map_err(serde::de::Error::custom),
        }
    }
}

/// Where the state store is (`[store]`), when neither `--store` nor
/// `NIGHTSHIFT_STORE` says.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `sqlite:`, `sqlite:DIR` or `postgres://…` (a password here is read
    /// by whoever reads the file: prefer a `.pgpass` or a socket's peer
    /// authentication).
    pub url: Option<String>,
}

/// Which container engine runs the sandboxes (`[engine]`).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// `docker` (the default), `podman`, or `kubernetes` (accepted, and
    /// every run refused saying why: docs/kubernetes.md).
    pub kind: Option<EngineName>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineName {
    Docker,
    Podman,
    Kubernetes,
}

/// Per-run defaults (each overridable on the command line).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RunCaps {
    pub memory: Option<Size>,
    pub cpus: Option<f64>,
    pub pids: Option<u64>,
    pub timeout: Option<Span>,
    pub max_output: Option<Size>,
    pub max_worktree: Option<Size>,
    pub max_files: Option<u64>,
    /// How long a sandbox outlives its supervisor's last heartbeat (in the
    /// configuration only: not a `run` flag).
    pub lease: Option<Span>,
    /// Model tokens one run may spend through the gateway (`--max-tokens`).
    pub max_tokens: Option<u64>,
}

/// Limits on all sandboxes together.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct FleetCaps {
    pub memory: Option<Size>,
    pub cpus: Option<f64>,
    pub pids: Option<u64>,
    /// Model tokens all runs together may spend per night (noon to noon UTC).
    pub max_tokens_per_night: Option<u64>,
}

/// How long acts wait for a person, and approvals for their execution.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct QueueConfig {
    pub pending_ttl: Option<Span>,
    pub approval_ttl: Option<Span>,
    /// Acts all runs together may request per night (noon to noon UTC);
    /// past it every request is refused (`nightshift:queue-night`).
    pub max_acts_per_night: Option<u64>,
    /// Acts the runs of one repository may request per night; past it that
    /// repository's requests are refused (`nightshift:queue-repository`).
    pub max_acts_per_repository: Option<u64>,
}

/// The queue's bounds after defaults: acts per night (all runs), acts per
/// repository per night.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueBounds {
    pub per_night: u64,
    pub per_repository: u64,
}

/// Default of `[queue] max_acts_per_night`: five runs' worth of the per-run
/// cap, more than a person reviews in a morning.
pub const DEFAULT_MAX_ACTS_PER_NIGHT: u64 = 1000;
/// Default of `[queue] max_acts_per_repository`.
pub const DEFAULT_MAX_ACTS_PER_REPOSITORY: u64 = 400;

/// Who a sandbox runs as. Both default to
/// [`crate::sandbox::DEFAULT_SANDBOX_ID`]; each run refuses to start when
/// either is a host account (see `hostview`).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SandboxConfig {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// The OCI runtime every sandbox must run with (`runsc`: gVisor, on
    /// Podman; docs/engines.md); the attestation refuses any other, runc
    /// included. `--runtime` must agree.
    pub runtime: Option<String>,
}

/// `[[repository]]`: what the owner says of one repository's content. A
/// repository not listed is private.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepositoryConfig {
    /// The host repository's path, as given to `nightshift run --repo`.
    pub path: PathBuf,
    /// `public` (anyone may read it) or `private`.
    pub confidentiality: policies::Confidentiality,
}

/// `[[setup]]` in the state's configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetupConfig {
    /// The host repository's path, as given to `nightshift run --repo`.
    pub repository: PathBuf,
    /// `rust`, `python` or `node`.
    pub preset: Option<String>,
    /// A shell command instead of a preset.
    pub command: Option<String>,
    /// Lockfile names the key reads (default [`DEFAULT_LOCKFILES`]).
    pub lockfiles: Option<Vec<String>>,
    /// May setup run on a tree an agent wrote (a `refs/nightshift/runs/…`
    /// base)? Default no.
    #[serde(default)]
    pub allow_agent_refs: bool,
    /// Registry credential files (absolute paths; owner-only, checked at use).
    #[serde(default)]
    pub credentials: Vec<PathBuf>,
    /// The largest cache entry (`2g` by default).
    pub max_bytes: Option<Size>,
}

impl SetupConfig {
    /// The plan it declares, or what is wrong with it.
    pub fn plan(&self) -> Result<crate::setup::SetupPlan, String> {
        let command = match (&self.preset, &self.command) {
            (Some(p), None) => crate::setup::SetupCommand::Preset(
                crate::setup::Preset::parse(p).ok_or_else(|| {
                    format!(
                        "setup for {}: unknown preset {p:?} (rust, python, node)",
                        self.repository.display()
                    )
                })?,
            ),
            (None, Some(c)) if !c.trim().is_empty() => {
                crate::setup::SetupCommand::Command(c.clone())
            }
            _ => {
                return Err(format!(
                    "setup for {}: give exactly one of preset and command",
                    self.repository.display()
                ))
            }
        };
        let mut plan = crate::setup::SetupPlan::new(command);
        if let Some(l) = &self.lockfiles {
            for name in l {
                if name.is_empty() || name.contains('/') || name == "." || name == ".." {
                    return Err(format!(
                        "setup for {}: lockfile {name:?} must be a file name (matched at any depth)",
                        self.repository.display()
                    ));
                }
            }
            plan.lockfiles = l.clone();
        }
        plan.allow_agent_refs = self.allow_agent_refs;
        let mut names = std::collections::BTreeSet::new();
        for c in &self.credentials {
            let name = c.file_name().and_then(|n| n.to_str());
            if !c.is_absolute() || name.is_none() {
                return Err(format!(
                    "setup for {}: credential {} must be an absolute path to a file",
                    self.repository.display(),
                    c.display()
                ));
            }
            if !names.insert(name.unwrap_or_default().to_string()) {
                return Err(format!(
                    "setup for {}: two credentials share the file name {}",
                    self.repository.display(),
                    name.unwrap_or_default()
                ));
            }
        }
        plan.credentials = self.credentials.clone();
        if let Some(m) = self.max_bytes {
            plan.max_bytes = m.0;
        }
        Ok(plan)
    }
}

/// `[serve]`: a TLS proxy in front of `nightshift serve --insecure-network`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    /// The origin browsers use, `https://NAME[:PORT]`.
    pub external_origin: Option<String>,
    /// The proxies' addresses: only their connections may use the external
    /// origin, and only their `X-Forwarded-For` names the client.
    #[serde(default)]
    pub trusted_proxies: Vec<std::net::IpAddr>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub caps: RunCaps,
    #[serde(default)]
    pub repository: Vec<RepositoryConfig>,
    #[serde(default)]
    pub sandbox: SandboxConfig,
    #[serde(default)]
    pub fleet: FleetCaps,
    #[serde(default)]
    pub queue: QueueConfig,
    #[serde(default)]
    pub serve: ServeConfig,
    #[serde(default)]
    pub store: StoreConfig,
    /// `[engine]`: the container engine (docs/engines.md); `--engine` and
    /// `NIGHTSHIFT_ENGINE` come first.
    #[serde(default)]
    pub engine: EngineConfig,
    /// `[[setup]]`: each repository's trusted setup phase (docs/setup.md).
    #[serde(default)]
    pub setup: Vec<SetupConfig>,
    /// `[pool]`: warm sandboxes `serve` keeps ready (docs/pool.md).
    #[serde(default)]
    pub pool: PoolConfig,
}

/// `[pool]`: how many warm sandboxes `serve` keeps ready per image, made
/// with the configuration's caps (`[caps]`); none unless asked for.
#[derive(Debug, Clone, Deserialize, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Warm sandboxes per image (0: no pool). At most [`MAX_POOL_SIZE`].
    #[serde(default)]
    pub size: usize,
    /// The images kept warm; the default image when empty.
    #[serde(default)]
    pub images: Vec<String>,
}

/// The most warm sandboxes `[pool] size` may ask for per image.
pub const MAX_POOL_SIZE: usize = 16;

/// The fleet's limits after defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fleet {
    pub memory_bytes: u64,
    pub cpus: f64,
    pub pids: u64,
}

impl Config {
    /// The confidentiality the owner gave `repo` (compared by canonical
    /// path); private when the owner said nothing.
    pub fn repository_confidentiality(&self, repo: &Path) -> policies::Confidentiality {
        let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        let repo = canonical(repo);
        self.repository
            .iter()
            .find(|r| canonical(&r.path) == repo)
            .map(|r| r.confidentiality)
            .unwrap_or(policies::Confidentiality::Private)
    }

    /// The setup the owner declared for `repo` (compared by canonical path).
    pub fn setup_plan(&self, repo: &Path) -> Option<crate::setup::SetupPlan> {
        let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        let repo = canonical(repo);
        self.setup
            .iter()
            .find(|s| canonical(&s.repository) == repo)
            .and_then(|s| s.plan().ok())
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        Self::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            line: e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
                .unwrap_or(1),
            message: e.message().to_string(),
        })?;
        for (key, id) in [
            ("sandbox.uid", config.sandbox.uid),
            ("sandbox.gid", config.sandbox.gid),
        ] {
            if id == Some(0) {
                return Err(ConfigError::Invalid {
                    path: path.to_path_buf(),
                    message: format!("{key} = 0 is root; a sandbox never runs as root"),
                });
            }
        }
        if config.pool.size > MAX_POOL_SIZE {
            return Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                message: format!(
                    "pool.size = {} is more than {MAX_POOL_SIZE} warm sandboxes per image",
                    config.pool.size
                ),
            });
        }
        if let Some(bad) = config.pool.images.iter().find(|i| i.trim().is_empty()) {
            return Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                message: format!("pool.images holds an empty image name ({bad:?})"),
            });
        }
        let mut seen = std::collections::BTreeSet::new();
        for s in &config.setup {
            s.plan().map_err(|message| ConfigError::Invalid {
                path: path.to_path_buf(),
                message,
            })?;
            if !seen.insert(s.repository.clone()) {
                return Err(ConfigError::Invalid {
                    path: path.to_path_buf(),
                    message: format!("two [[setup]] tables for {}", s.repository.display()),
                });
            }
        }
        config.front().map_err(|message| ConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        })?;
        let fleet = config.fleet();
        // The sandboxes' shared `nproc` limit must stay above every process
        // the fleet may hold (see `SandboxSpec::ulimits`).
        if fleet.pids > crate::sandbox::SHARED_NPROC as u64 {
            return Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                message: format!(
                    "fleet.pids = {} is more than the {} processes all sandboxes share (their nproc limit)",
                    fleet.pids,
                    crate::sandbox::SHARED_NPROC
                ),
            });
        }
        if let Some(pids) = config.caps.pids {
            if pids > fleet.pids {
                return Err(ConfigError::Invalid {
                    path: path.to_path_buf(),
                    message: format!(
                        "caps.pids = {pids} is more than fleet.pids ({})",
                        fleet.pids
                    ),
                });
            }
        }
        if let Some(cpus) = config.caps.cpus {
            if !(cpus > 0.0 && cpus <= fleet.cpus) {
                return Err(ConfigError::Invalid {
                    path: path.to_path_buf(),
                    message: format!(
                        "caps.cpus = {cpus} must be above 0 and at most fleet.cpus ({})",
                        fleet.cpus
                    ),
                });
            }
        }
        Ok(config)
    }

    /// The per-run caps after defaults.
    /// A run's caps never exceed the fleet's: memory and processes are at
    /// most the fleet's (a small fleet lowers the built-in defaults).
    pub fn caps(&self) -> Caps {
        let d = Caps::default();
        let c = &self.caps;
        let fleet = self.fleet();
        let at_most = |v: i64, limit: u64| v.min(i64::try_from(limit).unwrap_or(i64::MAX));
        Caps {
            memory_bytes: at_most(
                c.memory.map(|s| s.0 as i64).unwrap_or(d.memory_bytes),
                fleet.memory_bytes,
            ),
            nano_cpus: c.cpus.map(|v| (v * 1e9) as i64).unwrap_or(d.nano_cpus),
            pids: at_most(c.pids.map(|v| v as i64).unwrap_or(d.pids), fleet.pids),
            open_files: c.max_files.map(|v| v as i64).unwrap_or(d.open_files),
            timeout: c.timeout.map(|s| s.0).unwrap_or(d.timeout),
            max_output_bytes: c.max_output.map(|s| s.0).unwrap_or(d.max_output_bytes),
            max_worktree_bytes: c.max_worktree.map(|s| s.0).unwrap_or(d.max_worktree_bytes),
            tmpfs_bytes: d.tmpfs_bytes,
            lease: c.lease.map(|s| s.0).unwrap_or(d.lease),
            max_tokens: c.max_tokens.unwrap_or(d.max_tokens),
            fleet_max_tokens_per_night: self
                .fleet
                .max_tokens_per_night
                .unwrap_or(d.fleet_max_tokens_per_night),
        }
    }

    /// What stands in front of `serve` (`[serve]`): an external origin and
    /// the proxies trusted for it, both or neither.
    pub fn front(&self) -> Result<crate::front::Front, String> {
        let s = &self.serve;
        let external = s
            .external_origin
            .as_deref()
            .map(crate::front::ExternalOrigin::parse)
            .transpose()
            .map_err(|e| format!("serve.external_origin: {e}"))?;
        if external.is_some() == s.trusted_proxies.is_empty() {
            return Err(
                "serve.external_origin and serve.trusted_proxies go together: the origin browsers use and the addresses of the proxies that serve it"
                    .into(),
            );
        }
        Ok(crate::front::Front {
            external,
            trusted_proxies: s.trusted_proxies.clone(),
        })
    }

    /// The user sandboxes run as, after defaults.
    pub fn sandbox_user(&self) -> SandboxUser {
        let d = SandboxUser::default();
        SandboxUser {
            uid: self.sandbox.uid.unwrap_or(d.uid),
            gid: self.sandbox.gid.unwrap_or(d.gid),
        }
    }

    /// (pending, approval) lifetimes in seconds.
    pub fn queue_ttls(&self) -> (i64, i64) {
        (
            self.queue
                .pending_ttl
                .map(|s| s.0.as_secs() as i64)
                .unwrap_or(7 * 24 * 3600),
            self.queue
                .approval_ttl
                .map(|s| s.0.as_secs() as i64)
                .unwrap_or(24 * 3600),
        )
    }

    /// The queue's bounds, the defaults for what the file leaves out.
    pub fn queue_bounds(&self) -> QueueBounds {
        QueueBounds {
            per_night: self
                .queue
                .max_acts_per_night
                .unwrap_or(DEFAULT_MAX_ACTS_PER_NIGHT),
            per_repository: self
                .queue
                .max_acts_per_repository
                .unwrap_or(DEFAULT_MAX_ACTS_PER_REPOSITORY),
        }
    }

    pub fn fleet(&self) -> Fleet {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get() as f64)
            .unwrap_or(1.0);
        Fleet {
            memory_bytes: self.fleet.memory.map(|s| s.0).unwrap_or(8 << 30),
            cpus: self.fleet.cpus.unwrap_or(cores),
            pids: self.fleet.pids.unwrap_or(4096),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_spans() {
        assert_eq!(parse_size("64m").unwrap(), 64 << 20);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("512").unwrap(), 512);
        assert!(parse_size("0").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999999t").is_err());
        assert_eq!(parse_span("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_span("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_span("2h").unwrap(), Duration::from_secs(7200));
        assert!(parse_span("soon").is_err());
    }

    #[test]
    fn the_example_config_parses() {
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/config.example.toml"
        ));
        let text = std::fs::read_to_string(path).unwrap();
        let c = Config::parse(path, &text).unwrap();
        assert_eq!(c.caps().memory_bytes, 2 << 30);
        assert_eq!(c.fleet().pids, 4096);
        assert_eq!(c.sandbox_user(), SandboxUser::default());
    }

    #[test]
    fn the_sandbox_user_is_configurable_but_never_root() {
        let p = Path::new("x.toml");
        let c = Config::parse(p, "[sandbox]\nuid = 3000000000\ngid = 3000000001\n").unwrap();
        assert_eq!(
            c.sandbox_user(),
            SandboxUser {
                uid: 3_000_000_000,
                gid: 3_000_000_001
            }
        );
        let e = Config::parse(p, "[sandbox]\nuid = 0\n").unwrap_err();
        assert!(e.to_string().contains("sandbox.uid = 0 is root"), "{e}");
        let e = Config::parse(p, "[sandbox]\nuid = -1\n").unwrap_err();
        assert!(e.to_string().starts_with("x.toml: line 2:"), "{e}");
        let e = Config::parse(p, "[sandbox]\nuser = 5\n").unwrap_err();
        assert!(e.to_string().starts_with("x.toml: line 2:"), "{e}");
    }

    #[test]
    fn unknown_fields_and_bad_values_name_the_line() {
        let p = Path::new("x.toml");
        let e = Config::parse(p, "[caps]\nmemory = \"2g\"\nmemroy = \"1g\"\n").unwrap_err();
        assert!(e.to_string().starts_with("x.toml: line 3:"), "{e}");
        let e = Config::parse(p, "[caps]\n\ntimeout = \"soon\"\n").unwrap_err();
        assert!(e.to_string().starts_with("x.toml: line 3:"), "{e}");
        let e = Config::parse(p, "[fleet]\ncpus = 1.0\n[caps]\ncpus = 2.0\n").unwrap_err();
        assert!(e.to_string().contains("fleet.cpus"), "{e}");
    }

    #[test]
    fn no_cap_exceeds_the_fleet_nor_the_fleet_the_shared_nproc() {
        let p = Path::new("/x/config.toml");
        let e = Config::parse(p, "[fleet]\npids = 600\n[caps]\npids = 601\n").unwrap_err();
        assert!(e.to_string().contains("caps.pids = 601"), "{e}");
        assert!(Config::parse(p, "[fleet]\npids = 600\n[caps]\npids = 600\n").is_ok());
        let e = Config::parse(p, "[fleet]\npids = 20000\n").unwrap_err();
        assert!(e.to_string().contains("fleet.pids = 20000"), "{e}");
        // A small fleet lowers the defaults to its own.
        let small = Config::parse(p, "[fleet]\npids = 100\nmemory = \"300m\"\n").unwrap();
        assert_eq!(small.caps().pids, 100);
        assert_eq!(small.caps().memory_bytes, 300 << 20);
    }

    #[test]
    fn the_lease_is_configurable_and_thirty_seconds_by_default() {
        let p = Path::new("x.toml");
        assert_eq!(Config::default().caps().lease, Duration::from_secs(30));
        let c = Config::parse(p, "[caps]\nlease = \"2m\"\n").unwrap();
        assert_eq!(c.caps().lease, Duration::from_secs(120));
        let e = Config::parse(p, "[caps]\n\nlease = \"0s\"\n").unwrap_err();
        assert!(e.to_string().starts_with("x.toml: line 3:"), "{e}");
    }

    #[test]
    fn token_caps_are_configurable() {
        let p = Path::new("x.toml");
        let c = Config::parse(
            p,
            "[caps]\nmax_tokens = 5000\n[fleet]\nmax_tokens_per_night = 90000\n",
        )
        .unwrap();
        assert_eq!(c.caps().max_tokens, 5000);
        assert_eq!(c.caps().fleet_max_tokens_per_night, 90000);
        let e = Config::parse(p, "[fleet]\nmax_tokens_per_night = -1\n").unwrap_err();
        assert!(e.to_string().starts_with("x.toml: line 2:"), "{e}");
    }

    #[test]
    fn a_proxy_in_front_needs_its_origin_and_addresses() {
        let p = Path::new("x.toml");
        let c = Config::parse(
            p,
            "[serve]\nexternal_origin = \"https://dash.example\"\ntrusted_proxies = [\"127.0.0.1\"]\n",
        )
        .unwrap();
        let front = c.front().unwrap();
        assert_eq!(front.external.unwrap().origin, "https://dash.example");
        assert_eq!(front.trusted_proxies.len(), 1);
        let e =
            Config::parse(p, "[serve]\nexternal_origin = \"https://dash.example\"\n").unwrap_err();
        assert!(e.to_string().contains("go together"), "{e}");
        let e = Config::parse(
            p,
            "[serve]\nexternal_origin = \"http://dash.example\"\ntrusted_proxies = [\"::1\"]\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("serve.external_origin"), "{e}");
        let e = Config::parse(p, "[serve]\ntrusted_proxies = [\"proxy\"]\n").unwrap_err();
        assert!(e.to_string().starts_with("x.toml: line 2:"), "{e}");
    }

    #[test]
    fn a_config_names_exactly_one_command_and_absolute_credentials() {
        let parse = |t: &str| toml::from_str::<SetupConfig>(t).unwrap().plan();
        assert!(parse("repository = \"/r\"\npreset = \"rust\"\n").is_ok());
        assert!(parse("repository = \"/r\"\n")
            .unwrap_err()
            .contains("exactly one"));
        assert!(parse("repository = \"/r\"\npreset = \"rust\"\ncommand = \"x\"\n").is_err());
        assert!(parse("repository = \"/r\"\npreset = \"go\"\n")
            .unwrap_err()
            .contains("unknown preset"));
        assert!(
            parse("repository = \"/r\"\ncommand = \"x\"\ncredentials = [\"rel\"]\n")
                .unwrap_err()
                .contains("absolute")
        );
        assert!(parse(
            "repository = \"/r\"\ncommand = \"x\"\ncredentials = [\"/a/n\", \"/b/n\"]\n"
        )
        .unwrap_err()
        .contains("share"));
        let plan = parse("repository = \"/r\"\npreset = \"python\"\nmax_bytes = \"1m\"\nallow_agent_refs = true\n").unwrap();
        assert_eq!(plan.max_bytes, 1 << 20);
        assert!(plan.allow_agent_refs);
    }

    #[test]
    fn absent_file_is_the_defaults() {
        let c = Config::load(Path::new("/nonexistent/nightshift.toml")).unwrap();
        assert_eq!(c.caps(), Caps::default());
    }
}
