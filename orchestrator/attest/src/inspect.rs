//! The part of the Docker Engine container-inspect document that Tier 0
//! attestation reads (`GET /containers/{id}/json`, the object `docker
//! inspect` prints, with its PascalCase field names).
//!
//! Invariants:
//! - Only fields that a property checks are named; everything else is
//!   ignored, so an engine that adds fields still parses (the recorded
//!   documents hold many more: `tests/fixtures.rs::raw_fixture_bytes_parse_like_the_value`,
//!   `tests/fixtures.rs::hardened_fixture_passes_every_property_in_order`).
//! - `null` and an absent field both become `None`: the engine prints `null`
//!   for empty lists and bollard's serializer drops `None` fields, so the two
//!   must mean the same. Whether `None` is acceptable is decided per property
//!   in `attest`, never here (`tests/fixtures.rs::hardened_without_null_fields_still_passes`).
//! - `HostConfig` and `Config` must be objects: without them there is nothing
//!   to attest, and that is an error rather than a list of failures.
//! - A field present with the wrong JSON type is an error naming its path:
//!   such a document is not what an engine reports, and guessing its meaning
//!   could let a broken configuration pass.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::AttestError;

/// The inspected configuration of one container, as the engine reported it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Inspected {
    /// The container's main process (PID 1 unless the engine adds its init).
    pub(crate) path: Option<String>,
    pub(crate) host_config: HostConfig,
    pub(crate) config: ContainerConfig,
    /// What the engine actually mounted (as opposed to `HostConfig.Mounts`,
    /// which is what was asked for).
    pub(crate) mounts: Option<Vec<MountPoint>>,
    pub(crate) network_settings: Option<NetworkSettings>,
    pub(crate) app_armor_profile: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct HostConfig {
    pub network_mode: Option<String>,
    pub port_bindings: Option<BTreeMap<String, Value>>,
    pub publish_all_ports: Option<bool>,
    pub links: Option<Vec<String>>,
    pub cap_add: Option<Vec<String>>,
    pub cap_drop: Option<Vec<String>>,
    pub privileged: Option<bool>,
    pub security_opt: Option<Vec<String>>,
    pub group_add: Option<Vec<String>>,
    pub readonly_rootfs: Option<bool>,
    pub binds: Option<Vec<String>>,
    pub volumes_from: Option<Vec<String>>,
    pub mounts: Option<Vec<RequestedMount>>,
    pub tmpfs: Option<BTreeMap<String, String>>,
    pub devices: Option<Vec<Value>>,
    pub device_cgroup_rules: Option<Vec<String>>,
    pub device_requests: Option<Vec<Value>>,
    pub pid_mode: Option<String>,
    pub ipc_mode: Option<String>,
    #[serde(rename = "UTSMode")]
    pub uts_mode: Option<String>,
    pub userns_mode: Option<String>,
    pub cgroup: Option<String>,
    pub cgroupns_mode: Option<String>,
    pub memory: Option<i64>,
    pub memory_swap: Option<i64>,
    pub oom_kill_disable: Option<bool>,
    pub oom_score_adj: Option<i64>,
    pub nano_cpus: Option<i64>,
    pub cpu_quota: Option<i64>,
    pub pids_limit: Option<i64>,
    pub init: Option<bool>,
    pub log_config: Option<LogConfig>,
    pub sysctls: Option<BTreeMap<String, String>>,
    pub runtime: Option<String>,
    pub masked_paths: Option<Vec<String>>,
    pub readonly_paths: Option<Vec<String>>,
    pub restart_policy: Option<RestartPolicy>,
    pub shm_size: Option<i64>,
    pub ulimits: Option<Vec<Ulimit>>,
}

/// One entry of `HostConfig.Ulimits`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct Ulimit {
    pub name: Option<String>,
    pub soft: Option<i64>,
    pub hard: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ContainerConfig {
    pub hostname: Option<String>,
    pub user: Option<String>,
    pub env: Option<Vec<String>>,
    pub labels: Option<BTreeMap<String, String>>,
}

/// One entry of the top-level `Mounts`: what the engine mounted.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct MountPoint {
    #[serde(rename = "Type")]
    pub kind: Option<String>,
    pub name: Option<String>,
    pub source: Option<String>,
    pub destination: Option<String>,
    #[serde(rename = "RW")]
    pub rw: Option<bool>,
}

/// One entry of `HostConfig.Mounts`: what was asked for with `--mount`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct RequestedMount {
    #[serde(rename = "Type")]
    pub kind: Option<String>,
    pub source: Option<String>,
    pub target: Option<String>,
    pub read_only: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct NetworkSettings {
    pub networks: Option<BTreeMap<String, Value>>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct LogConfig {
    #[serde(rename = "Type")]
    pub kind: Option<String>,
    pub config: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct RestartPolicy {
    pub name: Option<String>,
}

/// Reads an inspect document already parsed as JSON (what the engine
/// adapter gets from `serde_json::to_value` of bollard's inspect response).
pub fn parse_inspect(document: &Value) -> Result<Inspected, AttestError> {
    serde_path_to_error::deserialize(document).map_err(malformed)
}

/// Reads an inspect document from its JSON text: one object, as the Engine
/// API returns it (not the one-element array that `docker inspect` prints).
pub fn parse_inspect_slice(bytes: &[u8]) -> Result<Inspected, AttestError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let inspected = serde_path_to_error::deserialize(&mut de).map_err(malformed)?;
    // Trailing bytes mean the text is not the single document we think it is.
    de.end().map_err(|source| AttestError::Malformed {
        path: ".".to_owned(),
        source,
    })?;
    Ok(inspected)
}

fn malformed(err: serde_path_to_error::Error<serde_json::Error>) -> AttestError {
    AttestError::Malformed {
        path: err.path().to_string(),
        source: err.into_inner(),
    }
}
