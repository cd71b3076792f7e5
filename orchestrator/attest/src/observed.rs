//! The engine-neutral sandbox contract: [`ObservedSandbox`] is what the
//! attestation judges, and each engine's adapter function fills it from
//! what that engine reports ([`from_docker_inspect`], [`from_podman_inspect`]).
//!
//! Invariants:
//! - An adapter only translates: it reports what the engine said, in the
//!   engine's own values where the property judges them (a `PidMode` of
//!   `host` stays `host`), and never fills in a value the engine did not
//!   report; what it cannot read stays `None` and fails closed in `attest`
//!   (`tests/fixtures.rs::hardened_fixture_passes_every_property_in_order`,
//!   `tests/podman.rs::podman_hardened_fixture_fails_only_what_podman_does_not_apply_or_report`).
//! - The observation names the engine and the runtime it saw, and the
//!   attestation carries both (`tests/podman.rs::the_attestation_names_engine_and_runtime`).
//! - Podman's compatible document says less than Docker's (no masked paths,
//!   a seccomp profile by path, capabilities as the drop list of its own
//!   default set, the runtime as `oci`): the Podman adapter reads Podman's
//!   own (libpod) document beside it for the runtime, the capability sets and
//!   the cgroup namespace, and a seccomp profile by the text of the file it
//!   names, which the engine adapter reads and hands over
//!   (`tests/podman.rs::podman_reporting_differences_are_read_from_libpod`).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::inspect::{parse_inspect, Inspected};
use crate::{seccomp_profile_digest, AttestError};

/// The engine whose report an observation was made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    Docker,
    Podman,
    /// A Pod on a cluster, judged by its own properties
    /// ([`crate::attest_pod`]).
    Kubernetes,
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Docker => "docker",
            EngineKind::Podman => "podman",
            EngineKind::Kubernetes => "kubernetes",
        }
    }
}

/// A seccomp setting as the engine reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seccomp {
    /// `seccomp=unconfined`: no filter.
    Unconfined,
    /// A profile of the owner's: the digest of its text
    /// ([`seccomp_profile_digest`]), `None` when the text could not be read
    /// or is not JSON.
    Profile { digest: Option<String> },
}

/// One mount the engine reports it made.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObservedMount {
    /// `bind`, `volume`, `tmpfs`, ...
    pub kind: Option<String>,
    pub name: Option<String>,
    pub source: Option<String>,
    pub destination: Option<String>,
    pub rw: Option<bool>,
}

/// One mount that was asked for (`--mount`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestedMount {
    pub kind: Option<String>,
    pub source: Option<String>,
    pub target: Option<String>,
    pub read_only: Option<bool>,
}

/// A resource limit (`RLIMIT_*`), by its short lowercase name (`nproc`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rlimit {
    pub name: String,
    pub soft: Option<i64>,
    pub hard: Option<i64>,
}

/// The network the sandbox was given.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObservedNetwork {
    pub mode: Option<String>,
    /// Networks the engine attached.
    pub attached: Vec<String>,
    pub published_ports: Vec<String>,
    pub publish_all: Option<bool>,
    pub links: Vec<String>,
}

/// The namespaces, by the engine's mode words (`private`, `host`,
/// `container:ID`, ...); `None` or empty: the engine's default.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObservedNamespaces {
    pub pid: Option<String>,
    pub ipc: Option<String>,
    pub uts: Option<String>,
    pub user: Option<String>,
    /// A cgroup shared with another container (`container:ID`) or the host.
    pub cgroup: Option<String>,
    /// The cgroup namespace: `private` or `host`.
    pub cgroupns: Option<String>,
}

/// The kernel-enforced limits.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObservedLimits {
    pub memory: Option<i64>,
    pub memory_swap: Option<i64>,
    pub oom_kill_disable: Option<bool>,
    pub oom_score_adj: Option<i64>,
    pub nano_cpus: Option<i64>,
    pub cpu_quota: Option<i64>,
    pub pids: Option<i64>,
    pub shm_size: Option<i64>,
    pub rlimits: Vec<Rlimit>,
}

/// What an engine reports about one created container, in terms no engine
/// owns. Lists the engine reports as absent are empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedSandbox {
    pub engine: EngineKind,
    /// The OCI runtime the engine will run it with, as reported (`runc`,
    /// `io.containerd.runc.v2`, `runsc`); empty: the engine's default.
    pub runtime: Option<String>,
    /// The container's main process (PID 1 unless the engine adds its init).
    pub main_process: Option<String>,
    /// Whether the engine runs its own init as PID 1.
    pub engine_init: Option<bool>,
    /// `uid:gid` as given.
    pub user: Option<String>,
    pub extra_groups: Vec<String>,
    pub env: Vec<String>,
    /// Entries the engine itself adds to every container's environment
    /// (Podman's `container=podman`, `TERM=xterm`, and `HOSTNAME` as the
    /// container's host name), allowed as they are.
    pub engine_env: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub network: ObservedNetwork,
    /// Capabilities dropped (`ALL` when the bounding set is empty) and added.
    pub cap_drop: Vec<String>,
    pub cap_add: Vec<String>,
    pub privileged: Option<bool>,
    /// Each `no-new-privileges` setting as spelled (`None`: bare).
    pub no_new_privileges: Vec<Option<String>>,
    /// Seccomp settings; empty: the engine's default profile.
    pub seccomp: Vec<Seccomp>,
    /// LSM options (`apparmor`, `label`) as `(key, value)`.
    pub lsm_options: Vec<(String, String)>,
    pub apparmor_profile: Option<String>,
    /// `systempaths=unconfined`: nothing masked.
    pub system_paths_unconfined: bool,
    pub read_only_root: Option<bool>,
    /// What the engine mounted.
    pub mounts: Vec<ObservedMount>,
    /// `host:target[:options]` binds that were asked for.
    pub requested_binds: Vec<String>,
    pub requested_mounts: Vec<RequestedMount>,
    pub volumes_from: Vec<String>,
    /// tmpfs target → its options as the engine reports them.
    pub tmpfs: BTreeMap<String, String>,
    /// Host devices passed in, cgroup device rules, device requests.
    pub devices: Vec<String>,
    pub device_cgroup_rules: Vec<String>,
    pub device_requests: Vec<String>,
    pub namespaces: ObservedNamespaces,
    pub limits: ObservedLimits,
    pub log_driver: Option<String>,
    pub log_max_size: Option<String>,
    pub sysctls: Vec<String>,
    /// `None`: the engine does not report them.
    pub masked_paths: Option<Vec<String>>,
    pub readonly_paths: Option<Vec<String>>,
    pub restart_policy: Option<String>,
}

/// Splits a security option as the engine does: `key=value`, or the legacy
/// `key:value` when there is no `=`.
pub(crate) fn split_security_opt(opt: &str) -> (&str, Option<&str>) {
    if let Some((k, v)) = opt.split_once('=') {
        (k, Some(v))
    } else if let Some((k, v)) = opt.split_once(':') {
        (k, Some(v))
    } else {
        (opt, None)
    }
}

fn v<T: Clone>(o: &Option<Vec<T>>) -> Vec<T> {
    o.clone().unwrap_or_default()
}

/// Docker's inspect document (`GET /containers/{id}/json`) as an
/// observation. The seccomp profile is reported by its text.
pub fn from_docker_inspect(doc: &Inspected) -> ObservedSandbox {
    let mut o = common(doc, EngineKind::Docker);
    o.seccomp = seccomp_settings(doc, seccomp_profile_digest);
    o
}

/// What Podman's compatible inspect leaves out or says in its own words,
/// read from its own (`/libpod/containers/{id}/json`) document.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct PodmanExtra {
    #[serde(rename = "OCIRuntime")]
    pub oci_runtime: Option<String>,
    pub effective_caps: Option<Vec<String>>,
    pub bounding_caps: Option<Vec<String>>,
    pub host_config: Option<PodmanHostConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct PodmanHostConfig {
    /// `host` or `private`: the cgroup namespace.
    pub cgroup_mode: Option<String>,
    pub ipc_mode: Option<String>,
}

/// What the runtime was handed, from the OCI configuration Podman wrote
/// for the container (`config.json` of its bundle, after `podman init`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OciSpec {
    pub masked_paths: Option<Vec<String>>,
    pub readonly_paths: Option<Vec<String>>,
    pub namespaces: Option<Vec<OciNamespace>>,
    /// The seccomp filter as the runtime loads it (`null`: none).
    pub seccomp: Option<Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct OciNamespace {
    #[serde(rename = "type")]
    pub kind: String,
    /// A namespace joined rather than made: shared with its owner.
    pub path: Option<String>,
}

/// The tmpfs Podman mounts on a read-only root (the Podman adapter sizes
/// them): allowed on Podman as `/tmp` is.
pub const PODMAN_READ_ONLY_ROOT_TMPFS: [&str; 2] = ["/run", "/var/tmp"];

/// Whether the filter the runtime loads is the profile's: the same default
/// action, every rule's syscalls with an action the profile gives them,
/// and every rule of the profile that holds on every architecture present.
/// (Podman converts a profile for the host's architecture, so its text,
/// and so its digest, differ from the profile's.)
pub fn oci_seccomp_matches(profile_text: &str, oci: &Value) -> bool {
    use std::collections::BTreeSet;
    let Ok(profile) = serde_json::from_str::<Value>(profile_text) else {
        return false;
    };
    if profile.get("defaultAction") != oci.get("defaultAction") {
        return false;
    }
    let rules = |v: &Value| -> Vec<(BTreeSet<String>, String, bool)> {
        v.get("syscalls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|r| {
                let names = r
                    .get("names")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|n| n.as_str().map(str::to_owned))
                    .collect();
                let action = r
                    .get("action")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                let conditional = ["includes", "excludes"].iter().any(|k| {
                    r.get(*k)
                        .and_then(Value::as_object)
                        .is_some_and(|o| !o.is_empty())
                });
                (names, action, conditional)
            })
            .collect()
    };
    let mine = rules(&profile);
    let loaded = rules(oci);
    if loaded.is_empty() {
        return false;
    }
    let allowed = |name: &str, action: &str| {
        mine.iter()
            .any(|(names, a, _)| a == action && names.contains(name))
    };
    let every_loaded_is_mine = loaded
        .iter()
        .all(|(names, action, _)| names.iter().all(|n| allowed(n, action)));
    let every_unconditional_is_loaded = mine.iter().filter(|(_, _, c)| !c).all(|(names, a, _)| {
        names
            .iter()
            .all(|n| loaded.iter().any(|(ln, la, _)| la == a && ln.contains(n)))
    });
    every_loaded_is_mine && every_unconditional_is_loaded
}

/// The entries Podman adds to every container's environment.
pub const PODMAN_ENV: [&str; 2] = ["container=podman", "TERM=xterm"];

/// Podman's compatible inspect document, with its own document (`libpod`)
/// and the text of each seccomp profile file the compatible document names
/// (`path → text`, read by the engine adapter; a path missing here is
/// unreadable and fails `seccomp-profile`).
pub fn from_podman_inspect(
    compat: &Inspected,
    libpod: Option<&PodmanExtra>,
    seccomp_files: &BTreeMap<String, String>,
    oci: Option<&OciSpec>,
) -> ObservedSandbox {
    let mut o = common(compat, EngineKind::Podman);
    o.seccomp = seccomp_settings(compat, |path| {
        let text = seccomp_files.get(path)?;
        // Where the runtime's filter is known, it must be the profile's.
        if let Some(oci) = oci {
            if !oci
                .seccomp
                .as_ref()
                .is_some_and(|f| oci_seccomp_matches(text, f))
            {
                return None;
            }
        }
        seccomp_profile_digest(text)
    });
    if let Some(oci) = oci {
        if oci.seccomp.is_none() {
            // No filter handed to the runtime, whatever the inspect says.
            o.seccomp = vec![Seccomp::Unconfined];
        }
        o.masked_paths = oci.masked_paths.clone();
        o.readonly_paths = oci.readonly_paths.clone();
    }
    o.engine_env = PODMAN_ENV.iter().map(|s| (*s).to_owned()).collect();
    // Podman's compatible document leaves `Init` out when false (`omitempty`).
    o.engine_init = Some(o.engine_init.unwrap_or(false));
    // Podman's own API sets `HOSTNAME` to the container's host name.
    if let Some(host) = compat.config.hostname.as_deref().filter(|h| !h.is_empty()) {
        o.engine_env.push(format!("HOSTNAME={host}"));
    }
    // Podman names limits `RLIMIT_NOFILE`.
    for r in &mut o.limits.rlimits {
        if let Some(short) = r.name.strip_prefix("RLIMIT_") {
            r.name = short.to_ascii_lowercase();
        }
    }
    // Without its own document, the compatible one's words stand: the
    // runtime `oci` and a drop list without ALL, which fail.
    let Some(libpod) = libpod else {
        return o;
    };
    o.runtime = libpod.oci_runtime.clone().or(o.runtime);
    // Podman lists the capabilities it dropped from its own default set,
    // never `ALL`; the bounding set (`null`: empty) says what is left.
    let bounding = libpod.bounding_caps.clone().unwrap_or_default();
    let effective = libpod.effective_caps.clone().unwrap_or_default();
    if bounding.is_empty() && effective.is_empty() {
        o.cap_drop = vec!["ALL".into()];
    } else {
        o.cap_drop = vec![];
        o.cap_add = bounding
            .into_iter()
            .chain(effective)
            .map(|c| c.trim_start_matches("CAP_").to_owned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
    }
    let hc = libpod.host_config.clone().unwrap_or_default();
    o.namespaces.cgroupns = hc.cgroup_mode;
    if hc.ipc_mode.is_some() {
        o.namespaces.ipc = hc.ipc_mode;
    }
    // The runtime's own list decides: a namespace it is not told to make is
    // the host's, one it joins by path is shared.
    if let Some(namespaces) = oci.and_then(|s| s.namespaces.as_ref()) {
        let mode = |kind: &str| match namespaces.iter().find(|n| n.kind == kind) {
            None => "host".to_owned(),
            Some(OciNamespace { path: Some(p), .. }) if !p.is_empty() => {
                format!("container:{p}")
            }
            Some(_) => "private".to_owned(),
        };
        o.namespaces.cgroupns = Some(mode("cgroup"));
        for (kind, slot) in [
            ("pid", &mut o.namespaces.pid),
            ("ipc", &mut o.namespaces.ipc),
            ("uts", &mut o.namespaces.uts),
        ] {
            let m = mode(kind);
            if m != "private" {
                *slot = Some(m);
            }
        }
    }
    // `MaskedPaths` is `null` in both documents (not reported): kept
    // `None`, which fails `proc-masked`.
    o
}

/// Reads Podman's combined document (what the Podman engine adapter hands
/// over: the compatible inspect object with `Libpod` and `SeccompFiles`
/// beside its fields).
pub fn parse_podman_inspect(document: &Value) -> Result<ObservedSandbox, AttestError> {
    let compat = parse_inspect(document)?;
    let libpod: Option<PodmanExtra> = match document.get("Libpod") {
        Some(l) => {
            Some(
                serde_path_to_error::deserialize(l).map_err(|e| AttestError::Malformed {
                    path: format!("Libpod.{}", e.path()),
                    source: e.into_inner(),
                })?,
            )
        }
        None => None,
    };
    let files: BTreeMap<String, String> = match document.get("SeccompFiles") {
        Some(f) => serde_path_to_error::deserialize(f).map_err(|e| AttestError::Malformed {
            path: format!("SeccompFiles.{}", e.path()),
            source: e.into_inner(),
        })?,
        None => BTreeMap::new(),
    };
    let oci: Option<OciSpec> = match document.get("OciSpec") {
        Some(f) => {
            Some(
                serde_path_to_error::deserialize(f).map_err(|e| AttestError::Malformed {
                    path: format!("OciSpec.{}", e.path()),
                    source: e.into_inner(),
                })?,
            )
        }
        None => None,
    };
    Ok(from_podman_inspect(
        &compat,
        libpod.as_ref(),
        &files,
        oci.as_ref(),
    ))
}

/// Reads an engine's inspect document into an observation.
pub fn observe(engine: EngineKind, document: &Value) -> Result<ObservedSandbox, AttestError> {
    match engine {
        EngineKind::Docker => Ok(from_docker_inspect(&parse_inspect(document)?)),
        EngineKind::Podman => parse_podman_inspect(document),
        EngineKind::Kubernetes => Err(AttestError::NotAContainer),
    }
}

fn seccomp_settings(doc: &Inspected, digest: impl Fn(&str) -> Option<String>) -> Vec<Seccomp> {
    v(&doc.host_config.security_opt)
        .iter()
        .map(|o| split_security_opt(o))
        .filter(|(k, _)| *k == "seccomp")
        .map(|(_, value)| match value {
            Some("unconfined") => Seccomp::Unconfined,
            Some(text) => Seccomp::Profile {
                digest: digest(text),
            },
            None => Seccomp::Profile { digest: None },
        })
        .collect()
}

fn common(doc: &Inspected, engine: EngineKind) -> ObservedSandbox {
    let hc = &doc.host_config;
    let opts = v(&hc.security_opt);
    let split: Vec<(String, Option<String>)> = opts
        .iter()
        .map(|o| {
            let (k, v) = split_security_opt(o);
            (k.to_owned(), v.map(str::to_owned))
        })
        .collect();
    ObservedSandbox {
        engine,
        runtime: hc.runtime.clone(),
        main_process: doc.path.clone(),
        engine_init: hc.init,
        user: doc.config.user.clone(),
        extra_groups: v(&hc.group_add),
        env: v(&doc.config.env),
        engine_env: vec![],
        labels: doc.config.labels.clone().unwrap_or_default(),
        network: ObservedNetwork {
            mode: hc.network_mode.clone(),
            attached: doc
                .network_settings
                .as_ref()
                .and_then(|n| n.networks.as_ref())
                .map(|n| n.keys().cloned().collect())
                .unwrap_or_default(),
            published_ports: hc
                .port_bindings
                .as_ref()
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default(),
            publish_all: hc.publish_all_ports,
            links: v(&hc.links),
        },
        cap_drop: v(&hc.cap_drop),
        cap_add: v(&hc.cap_add),
        privileged: hc.privileged,
        no_new_privileges: split
            .iter()
            .filter(|(k, _)| k == "no-new-privileges")
            .map(|(_, v)| v.clone())
            .collect(),
        seccomp: vec![],
        lsm_options: split
            .iter()
            .filter(|(k, _)| k == "apparmor" || k == "label")
            .map(|(k, v)| (k.clone(), v.clone().unwrap_or_default()))
            .collect(),
        apparmor_profile: doc.app_armor_profile.clone(),
        system_paths_unconfined: split
            .iter()
            .any(|(k, v)| k == "systempaths" && v.as_deref() == Some("unconfined")),
        read_only_root: hc.readonly_rootfs,
        mounts: doc
            .mounts
            .iter()
            .flatten()
            .map(|m| ObservedMount {
                kind: m.kind.clone(),
                name: m.name.clone(),
                source: m.source.clone(),
                destination: m.destination.clone(),
                rw: m.rw,
            })
            .collect(),
        requested_binds: v(&hc.binds),
        requested_mounts: hc
            .mounts
            .iter()
            .flatten()
            .map(|m| RequestedMount {
                kind: m.kind.clone(),
                source: m.source.clone(),
                target: m.target.clone(),
                read_only: m.read_only,
            })
            .collect(),
        volumes_from: v(&hc.volumes_from),
        tmpfs: hc.tmpfs.clone().unwrap_or_default(),
        devices: hc
            .devices
            .iter()
            .flatten()
            .map(|d| {
                d.get("PathOnHost")
                    .and_then(|p| p.as_str())
                    .unwrap_or("?")
                    .to_owned()
            })
            .collect(),
        device_cgroup_rules: v(&hc.device_cgroup_rules),
        device_requests: hc
            .device_requests
            .iter()
            .flatten()
            .map(|r| {
                r.get("Driver")
                    .and_then(|p| p.as_str())
                    .filter(|d| !d.is_empty())
                    .unwrap_or("request")
                    .to_owned()
            })
            .collect(),
        namespaces: ObservedNamespaces {
            pid: hc.pid_mode.clone(),
            ipc: hc.ipc_mode.clone(),
            uts: hc.uts_mode.clone(),
            user: hc.userns_mode.clone(),
            cgroup: hc.cgroup.clone(),
            cgroupns: hc.cgroupns_mode.clone(),
        },
        limits: ObservedLimits {
            memory: hc.memory,
            memory_swap: hc.memory_swap,
            oom_kill_disable: hc.oom_kill_disable,
            oom_score_adj: hc.oom_score_adj,
            nano_cpus: hc.nano_cpus,
            cpu_quota: hc.cpu_quota,
            pids: hc.pids_limit,
            shm_size: hc.shm_size,
            rlimits: hc
                .ulimits
                .iter()
                .flatten()
                .map(|u| Rlimit {
                    name: u.name.clone().unwrap_or_default(),
                    soft: u.soft,
                    hard: u.hard,
                })
                .collect(),
        },
        log_driver: hc.log_config.as_ref().and_then(|l| l.kind.clone()),
        log_max_size: hc
            .log_config
            .as_ref()
            .and_then(|l| l.config.as_ref())
            .and_then(|c| c.get("max-size"))
            .filter(|s| !s.is_empty())
            .cloned(),
        sysctls: hc
            .sysctls
            .iter()
            .flatten()
            .map(|(k, _)| k.clone())
            .collect(),
        masked_paths: hc.masked_paths.clone(),
        readonly_paths: hc.readonly_paths.clone(),
        restart_policy: hc.restart_policy.as_ref().and_then(|r| r.name.clone()),
    }
}
