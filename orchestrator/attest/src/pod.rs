//! Tier 0 for a sandbox that is a Kubernetes Pod: a pure verdict on the Pod
//! the API server *returned* after admission (its observed spec), against
//! the Pod nightshift asked for and the NetworkPolicies of its namespace.
//!
//! Invariants:
//! - [`attest_pod`] lists every property in [`POD_PROPERTY_NAMES`] order,
//!   each exactly once, pass or fail; a property reads only its own fields,
//!   so one breakage fails its property and no other
//!   (`tests::each_breakage_fails_exactly_its_property`).
//! - What admission changed is judged, not trusted: a Pod whose containers,
//!   images, commands, volumes or init containers differ from the request,
//!   or that gained an ephemeral container, fails `admission-unchanged`, and
//!   a changed security field fails its own property as well
//!   (`tests::an_injected_sidecar_fails_admission_and_its_own_properties`).
//! - Fail closed: an absent field that Tier 0 needs set (`runAsNonRoot`,
//!   `allowPrivilegeEscalation`, `readOnlyRootFilesystem`, a memory limit, a
//!   deadline, `automountServiceAccountToken`) fails; a quantity this module
//!   cannot read fails (`tests::unreadable_quantities_fail_closed`).
//! - `observed` never holds an environment value, only names
//!   (`tests::environment_values_never_reach_a_pods_verdict`).
//! - Kubernetes has no per-Pod process limit: the node's `podPidsLimit`
//!   bounds it, which the node shows and the Pod does not
//!   (docs/kubernetes.md), so there is no `pids-limited` property here; nor
//!   host accounts or mount flags, which the kubelet owns.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, SeccompProfile, SecurityContext};
use k8s_openapi::api::networking::v1::NetworkPolicy;

use crate::attest::{Attestation, Property};
use crate::observed::EngineKind;

/// Every property a Pod is judged by, in the order [`attest_pod`] lists them.
pub const POD_PROPERTY_NAMES: [&str; 21] = [
    "network-none",
    "capabilities-dropped",
    "not-privileged",
    "no-new-privileges",
    "seccomp-profile",
    "non-root-user",
    "read-only-root",
    "mounts-only-worktree",
    "tmpfs-only-allowed",
    "private-namespaces",
    "memory-limited",
    "cpu-limited",
    "env-allowlisted",
    "labelled",
    "no-sysctls",
    "runtime-default",
    "proc-masked",
    "no-restart",
    "no-service-account-token",
    "deadline-set",
    "admission-unchanged",
];

/// The label whose value must be the run id (as on every engine).
pub const POD_RUN_LABEL: &str = crate::attest::RUN_LABEL;

/// What the Pod must be, beside the request itself.
#[derive(Debug, Clone, PartialEq)]
pub struct PodExpectations {
    pub run_id: String,
    /// The sandbox's uid and gid (never 0).
    pub uid: i64,
    pub gid: i64,
    /// The `Localhost` seccomp profile, as a path under the kubelet's
    /// seccomp root (`nightshift/sandbox.json`).
    pub seccomp_localhost_profile: String,
    /// Largest memory limit of any container, in bytes.
    pub max_memory_bytes: i64,
    /// Largest `activeDeadlineSeconds`: the run's wall cap.
    pub max_deadline_seconds: i64,
    /// The RuntimeClass the owner requires (`gvisor`); `None`: none named.
    pub runtime_class: Option<String>,
    /// Environment names and values the supervisor sets.
    pub allowed_env: BTreeMap<String, String>,
    /// The writable volumes: name → mount path. Each must be an `emptyDir`
    /// with a size limit; the worktree is one of them.
    pub volumes: BTreeMap<String, String>,
    /// Those of [`Self::volumes`] that are memory-backed (tmpfs).
    pub memory_volumes: BTreeSet<String>,
}

/// A property, its `observed` clipped as every engine's is.
fn property(name: &'static str, ok: bool, observed: String, expected: &str) -> Property {
    crate::attest::property(name, ok, observed, expected)
}

/// Every container of the Pod (init, main, ephemeral) as a name and the
/// fields Tier 0 reads.
fn all_containers(spec: &PodSpec) -> Vec<&Container> {
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .collect()
}

/// Judges the Pod the API server returned (`observed`) against the one
/// nightshift sent (`requested`), the namespace's NetworkPolicies and the
/// expectations.
pub fn attest_pod(
    observed: &Pod,
    requested: &Pod,
    policies: &[NetworkPolicy],
    expect: &PodExpectations,
) -> Attestation {
    let empty = PodSpec::default();
    let spec = observed.spec.as_ref().unwrap_or(&empty);
    let containers = all_containers(spec);
    let ephemeral = spec.ephemeral_containers.as_ref().map_or(0, Vec::len);
    let properties = vec![
        network_none(observed, spec, policies),
        capabilities_dropped(&containers),
        not_privileged(&containers),
        no_new_privileges(&containers),
        seccomp(spec, &containers, expect),
        non_root(spec, &containers, expect),
        read_only_root(&containers),
        mounts_only_worktree(spec, &containers, expect),
        tmpfs_only_allowed(spec, expect),
        private_namespaces(spec),
        memory_limited(&containers, expect),
        cpu_limited(&containers),
        env_allowlisted(&containers, expect),
        labelled(observed, expect),
        no_sysctls(spec),
        runtime(spec, expect),
        proc_masked(&containers),
        no_restart(spec),
        no_token(spec),
        deadline(spec, expect),
        admission_unchanged(spec, requested.spec.as_ref().unwrap_or(&empty), ephemeral),
    ];
    Attestation {
        engine: Some(EngineKind::Kubernetes),
        runtime: Some(spec.runtime_class_name.clone().unwrap_or_default()),
        properties,
    }
}

/// Whether a policy denies all ingress and egress of the Pod: it selects
/// the Pod by labels, names both policy types and allows nothing.
pub fn denies_all(policy: &NetworkPolicy, labels: &BTreeMap<String, String>) -> bool {
    let Some(spec) = policy.spec.as_ref() else {
        return false;
    };
    // No selector, or an empty one, selects every Pod of the namespace.
    let selector = spec.pod_selector.clone().unwrap_or_default();
    if selector
        .match_expressions
        .as_ref()
        .is_some_and(|e| !e.is_empty())
    {
        // Not read: only label equality selectors are judged.
        return false;
    }
    let selects = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let types: BTreeSet<&str> = spec
        .policy_types
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    selects
        && types.contains("Ingress")
        && types.contains("Egress")
        && spec.ingress.as_ref().is_none_or(Vec::is_empty)
        && spec.egress.as_ref().is_none_or(Vec::is_empty)
}

fn network_none(pod: &Pod, spec: &PodSpec, policies: &[NetworkPolicy]) -> Property {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let host = spec.host_network == Some(true);
    let host_ports = all_containers(spec)
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .any(|p| p.host_port.is_some());
    let deny = policies.iter().find(|p| denies_all(p, &labels));
    let ok = !host && !host_ports && deny.is_some();
    let observed = format!(
        "hostNetwork={host} hostPorts={host_ports} deny-all policy={}",
        deny.and_then(|p| p.metadata.name.clone())
            .unwrap_or_else(|| "none".into())
    );
    property(
        "network-none",
        ok,
        observed,
        "no host network or ports; a NetworkPolicy denying all ingress and egress selects the Pod",
    )
}

/// A property every container must hold: `broken` says whether one does
/// not; the property lists those that do not by name.
fn every_container(
    name: &'static str,
    containers: &[&Container],
    broken: impl Fn(Option<&SecurityContext>) -> bool,
    good: &str,
    bad: &str,
    expected: &str,
) -> Property {
    let failing: Vec<String> = containers
        .iter()
        .filter(|c| broken(c.security_context.as_ref()))
        .map(|c| c.name.clone())
        .collect();
    property(
        name,
        failing.is_empty() && !containers.is_empty(),
        if failing.is_empty() {
            good.to_owned()
        } else {
            format!("{bad}: {}", failing.join(", "))
        },
        expected,
    )
}

fn capabilities_dropped(containers: &[&Container]) -> Property {
    every_container(
        "capabilities-dropped",
        containers,
        |s| {
            let caps = s.and_then(|s| s.capabilities.as_ref());
            let drops_all = caps
                .and_then(|c| c.drop.as_ref())
                .is_some_and(|d| d.iter().any(|x| x == "ALL"));
            let adds = caps
                .and_then(|c| c.add.as_ref())
                .is_some_and(|a| !a.is_empty());
            !drops_all || adds
        },
        "every container drops ALL, adds none",
        "not dropping ALL or adding",
        "drop ALL, add none, in every container",
    )
}

fn not_privileged(containers: &[&Container]) -> Property {
    every_container(
        "not-privileged",
        containers,
        |s| s.and_then(|s| s.privileged).unwrap_or(false),
        "none privileged",
        "privileged",
        "no privileged container",
    )
}

fn no_new_privileges(containers: &[&Container]) -> Property {
    every_container(
        "no-new-privileges",
        containers,
        |s| s.and_then(|s| s.allow_privilege_escalation) != Some(false),
        "allowPrivilegeEscalation=false everywhere",
        "escalation not refused",
        "allowPrivilegeEscalation: false in every container",
    )
}

fn profile_words(p: Option<&SeccompProfile>) -> String {
    match p {
        None => "none".into(),
        Some(p) => match p.localhost_profile.as_deref() {
            Some(l) => format!("{}:{l}", p.type_),
            None => p.type_.clone(),
        },
    }
}

fn seccomp(spec: &PodSpec, containers: &[&Container], expect: &PodExpectations) -> Property {
    let pod = spec
        .security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.as_ref());
    let mut seen = BTreeSet::new();
    let mut ok = true;
    for c in containers {
        let own = c
            .security_context
            .as_ref()
            .and_then(|s| s.seccomp_profile.as_ref());
        let effective = own.or(pod);
        seen.insert(profile_words(effective));
        ok &= effective.is_some_and(|p| {
            p.type_ == "Localhost"
                && p.localhost_profile.as_deref() == Some(&expect.seccomp_localhost_profile)
        });
    }
    property(
        "seccomp-profile",
        ok && !containers.is_empty(),
        seen.into_iter().collect::<Vec<_>>().join(", "),
        &format!("Localhost:{}", expect.seccomp_localhost_profile),
    )
}

fn non_root(spec: &PodSpec, containers: &[&Container], expect: &PodExpectations) -> Property {
    let pod = spec.security_context.as_ref();
    let mut seen = BTreeSet::new();
    let mut ok = expect.uid != 0 && expect.gid != 0 && !containers.is_empty();
    for c in containers {
        let own = c.security_context.as_ref();
        let non_root = own
            .and_then(|s| s.run_as_non_root)
            .or(pod.and_then(|s| s.run_as_non_root));
        let uid = own
            .and_then(|s| s.run_as_user)
            .or(pod.and_then(|s| s.run_as_user));
        let gid = own
            .and_then(|s| s.run_as_group)
            .or(pod.and_then(|s| s.run_as_group));
        seen.insert(format!(
            "runAsNonRoot={} uid={} gid={}",
            non_root.map_or("unset".into(), |b| b.to_string()),
            uid.map_or("unset".into(), |u| u.to_string()),
            gid.map_or("unset".into(), |g| g.to_string()),
        ));
        ok &= non_root == Some(true) && uid == Some(expect.uid) && gid == Some(expect.gid);
    }
    let groups = pod
        .and_then(|s| s.supplemental_groups.as_ref())
        .is_some_and(|g| !g.is_empty());
    if groups {
        seen.insert("supplementalGroups set".into());
    }
    property(
        "non-root-user",
        ok && !groups,
        seen.into_iter().collect::<Vec<_>>().join("; "),
        &format!(
            "runAsNonRoot=true uid={} gid={}, no supplemental groups",
            expect.uid, expect.gid
        ),
    )
}

fn read_only_root(containers: &[&Container]) -> Property {
    every_container(
        "read-only-root",
        containers,
        |s| s.and_then(|s| s.read_only_root_filesystem) != Some(true),
        "readOnlyRootFilesystem everywhere",
        "writable root",
        "readOnlyRootFilesystem: true in every container",
    )
}

fn mounts_only_worktree(
    spec: &PodSpec,
    containers: &[&Container],
    expect: &PodExpectations,
) -> Property {
    let mut bad = Vec::new();
    for v in spec.volumes.iter().flatten() {
        let empty_dir = v.empty_dir.as_ref();
        // Exactly one source may be set; any other than emptyDir is a way
        // in from the host or the cluster (hostPath, secrets, projected
        // tokens, claims, CSI, ...).
        let other = serde_json::to_value(v)
            .ok()
            .and_then(|j| j.as_object().map(|o| o.len()))
            .unwrap_or(usize::MAX)
            > 2;
        if empty_dir.is_none() || other {
            bad.push(format!("{}: not an emptyDir", v.name));
        } else if !expect.volumes.contains_key(&v.name) {
            bad.push(format!("{}: not nightshift's", v.name));
        } else if empty_dir.and_then(|e| e.size_limit.as_ref()).is_none() {
            bad.push(format!("{}: no sizeLimit", v.name));
        }
    }
    for c in containers {
        if c.volume_devices.as_ref().is_some_and(|d| !d.is_empty()) {
            bad.push(format!("{}: volumeDevices", c.name));
        }
        for m in c.volume_mounts.iter().flatten() {
            let want = expect.volumes.get(&m.name);
            if want != Some(&m.mount_path) {
                bad.push(format!("{}: {} at {}", c.name, m.name, m.mount_path));
            }
            if m.sub_path.is_some() || m.sub_path_expr.is_some() {
                bad.push(format!("{}: subPath on {}", c.name, m.name));
            }
            if m.mount_propagation.as_deref().is_some_and(|p| p != "None") {
                bad.push(format!("{}: propagation on {}", c.name, m.name));
            }
        }
    }
    property(
        "mounts-only-worktree",
        bad.is_empty(),
        if bad.is_empty() {
            format!(
                "emptyDir only: {}",
                expect
                    .volumes
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            bad.join("; ")
        },
        "only nightshift's sized emptyDir volumes, at their paths",
    )
}

fn tmpfs_only_allowed(spec: &PodSpec, expect: &PodExpectations) -> Property {
    let mut bad = Vec::new();
    let mut seen = Vec::new();
    for v in spec.volumes.iter().flatten() {
        let Some(e) = v.empty_dir.as_ref() else {
            continue;
        };
        let memory = e.medium.as_deref() == Some("Memory");
        if memory {
            seen.push(v.name.clone());
            if !expect.memory_volumes.contains(&v.name) {
                bad.push(format!("{}: memory-backed", v.name));
            }
        }
        if e.medium
            .as_deref()
            .is_some_and(|m| !m.is_empty() && m != "Memory")
        {
            bad.push(format!(
                "{}: medium {}",
                v.name,
                e.medium.as_deref().unwrap_or("")
            ));
        }
    }
    property(
        "tmpfs-only-allowed",
        bad.is_empty(),
        if bad.is_empty() {
            format!("memory-backed: {}", seen.join(", "))
        } else {
            bad.join("; ")
        },
        "memory-backed emptyDir only where nightshift puts tmpfs",
    )
}

fn private_namespaces(spec: &PodSpec) -> Property {
    let pid = spec.host_pid == Some(true);
    let ipc = spec.host_ipc == Some(true);
    let shared = spec.share_process_namespace == Some(true);
    property(
        "private-namespaces",
        !pid && !ipc && !shared,
        format!("hostPID={pid} hostIPC={ipc} shareProcessNamespace={shared}"),
        "no host PID or IPC namespace, no shared process namespace",
    )
}

/// A resource quantity in its base unit (bytes, or millicores when `milli`),
/// `None` when it cannot be read.
pub fn quantity(text: &str, milli: bool) -> Option<i64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    if number.is_empty() || number.matches('.').count() > 1 {
        return None;
    }
    let factor: f64 = match suffix {
        "" => 1.0,
        "m" => 0.001,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let value = number.parse::<f64>().ok()? * factor * if milli { 1000.0 } else { 1.0 };
    (value.is_finite() && (0.0..9.0e18).contains(&value)).then_some(value.ceil() as i64)
}

fn limit(c: &Container, key: &str, milli: bool) -> Option<i64> {
    let q = c.resources.as_ref()?.limits.as_ref()?.get(key)?;
    quantity(&q.0, milli)
}

fn memory_limited(containers: &[&Container], expect: &PodExpectations) -> Property {
    let mut seen = Vec::new();
    let mut ok = !containers.is_empty();
    for c in containers {
        let m = limit(c, "memory", false);
        seen.push(format!(
            "{}={}",
            c.name,
            m.map_or("unset".into(), |m| m.to_string())
        ));
        ok &= m.is_some_and(|m| m > 0 && m <= expect.max_memory_bytes);
    }
    property(
        "memory-limited",
        ok,
        seen.join(" "),
        &format!(
            "a memory limit ≤ {} bytes on every container",
            expect.max_memory_bytes
        ),
    )
}

fn cpu_limited(containers: &[&Container]) -> Property {
    let mut seen = Vec::new();
    let mut ok = !containers.is_empty();
    for c in containers {
        let m = limit(c, "cpu", true);
        seen.push(format!(
            "{}={}",
            c.name,
            m.map_or("unset".into(), |m| format!("{m}m"))
        ));
        ok &= m.is_some_and(|m| m > 0);
    }
    property(
        "cpu-limited",
        ok,
        seen.join(" "),
        "a CPU limit on every container",
    )
}

fn env_allowlisted(containers: &[&Container], expect: &PodExpectations) -> Property {
    let mut bad = BTreeSet::new();
    for c in containers {
        if c.env_from.as_ref().is_some_and(|e| !e.is_empty()) {
            bad.insert(format!("{}: envFrom", c.name));
        }
        for e in c.env.iter().flatten() {
            if e.value_from.is_some() {
                bad.insert(format!("{} (from a reference)", e.name));
            } else if expect.allowed_env.get(&e.name) != Some(&e.value.clone().unwrap_or_default())
            {
                bad.insert(e.name.clone());
            }
        }
    }
    property(
        "env-allowlisted",
        bad.is_empty(),
        if bad.is_empty() {
            "only nightshift's variables".into()
        } else {
            format!(
                "not allowed: {}",
                bad.into_iter().collect::<Vec<_>>().join(", ")
            )
        },
        "only the variables nightshift sets, by value, no references",
    )
}

fn labelled(pod: &Pod, expect: &PodExpectations) -> Property {
    let got = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(POD_RUN_LABEL))
        .cloned();
    property(
        "labelled",
        got.as_deref() == Some(expect.run_id.as_str()),
        format!("{POD_RUN_LABEL}={}", got.unwrap_or_else(|| "unset".into())),
        &format!("{POD_RUN_LABEL}={}", expect.run_id),
    )
}

fn no_sysctls(spec: &PodSpec) -> Property {
    let n = spec
        .security_context
        .as_ref()
        .and_then(|s| s.sysctls.as_ref())
        .map_or(0, Vec::len);
    property("no-sysctls", n == 0, format!("{n} sysctls"), "none")
}

fn runtime(spec: &PodSpec, expect: &PodExpectations) -> Property {
    let got = spec.runtime_class_name.clone();
    property(
        "runtime-default",
        got == expect.runtime_class,
        got.unwrap_or_else(|| "the cluster's default".into()),
        &expect
            .runtime_class
            .clone()
            .unwrap_or_else(|| "the cluster's default".into()),
    )
}

fn proc_masked(containers: &[&Container]) -> Property {
    every_container(
        "proc-masked",
        containers,
        |s| {
            s.and_then(|s| s.proc_mount.as_deref())
                .is_some_and(|p| p != "Default")
        },
        "procMount Default",
        "procMount unmasked",
        "procMount Default (the runtime's masked paths)",
    )
}

fn no_restart(spec: &PodSpec) -> Property {
    let got = spec.restart_policy.clone().unwrap_or_default();
    property(
        "no-restart",
        got == "Never",
        if got.is_empty() { "unset".into() } else { got },
        "Never",
    )
}

fn no_token(spec: &PodSpec) -> Property {
    let automount = spec.automount_service_account_token;
    let projected = spec
        .volumes
        .iter()
        .flatten()
        .any(|v| v.projected.is_some() || v.secret.is_some());
    property(
        "no-service-account-token",
        automount == Some(false) && !projected,
        format!(
            "automountServiceAccountToken={} projected or secret volume={projected}",
            automount.map_or("unset".into(), |b| b.to_string())
        ),
        "automountServiceAccountToken: false, no token volume",
    )
}

fn deadline(spec: &PodSpec, expect: &PodExpectations) -> Property {
    let got = spec.active_deadline_seconds;
    property(
        "deadline-set",
        got.is_some_and(|d| d > 0 && d <= expect.max_deadline_seconds),
        got.map_or("unset".into(), |d| format!("{d} s")),
        &format!("activeDeadlineSeconds ≤ {}", expect.max_deadline_seconds),
    )
}

/// What admission may not change: each container's name, image, command
/// and arguments, the init containers, and the volumes' names.
fn shape(spec: &PodSpec) -> Vec<String> {
    let mut out = Vec::new();
    for (kind, list) in [
        ("init", spec.init_containers.as_deref().unwrap_or_default()),
        ("container", spec.containers.as_slice()),
    ] {
        for c in list {
            out.push(format!(
                "{kind} {} image={} command={:?} args={:?}",
                c.name,
                c.image.as_deref().unwrap_or(""),
                c.command.as_deref().unwrap_or_default(),
                c.args.as_deref().unwrap_or_default()
            ));
        }
    }
    for v in spec.volumes.iter().flatten() {
        out.push(format!("volume {}", v.name));
    }
    out
}

fn admission_unchanged(observed: &PodSpec, requested: &PodSpec, ephemeral: usize) -> Property {
    let got = shape(observed);
    let want = shape(requested);
    let added: Vec<&String> = got.iter().filter(|s| !want.contains(s)).collect();
    let removed: Vec<&String> = want.iter().filter(|s| !got.contains(s)).collect();
    let ok = added.is_empty() && removed.is_empty() && ephemeral == 0 && !want.is_empty();
    let observed = if ok {
        format!("{} containers and volumes as requested", want.len())
    } else {
        let mut parts: Vec<String> = added.iter().map(|s| format!("added {s}")).collect();
        parts.extend(removed.iter().map(|s| format!("removed {s}")));
        if ephemeral > 0 {
            parts.push(format!("{ephemeral} ephemeral containers"));
        }
        parts.join("; ")
    };
    property(
        "admission-unchanged",
        ok,
        observed,
        "containers, images, commands and volumes as nightshift requested them",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A hardened sandbox Pod as the API server returns it (defaults filled).
    fn hardened() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "ns-run-r1", "namespace": "s",
                "labels": {"nightshift.run": "r1", "nightshift.sandbox": "true"}},
            "spec": {
                "restartPolicy": "Never", "activeDeadlineSeconds": 600,
                "automountServiceAccountToken": false, "enableServiceLinks": false,
                "hostNetwork": false, "hostPID": false, "hostIPC": false,
                "shareProcessNamespace": false, "dnsPolicy": "ClusterFirst",
                "schedulerName": "default-scheduler",
                "securityContext": {"runAsNonRoot": true, "runAsUser": 2000, "runAsGroup": 2000,
                    "fsGroup": 2000,
                    "seccompProfile": {"type": "Localhost", "localhostProfile": "nightshift/sandbox.json"}},
                "volumes": [
                    {"name": "workspace", "emptyDir": {"sizeLimit": "1Gi"}},
                    {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}}
                ],
                "containers": [{
                    "name": "agent", "image": "img:1", "command": ["bash", "-c", "x"],
                    "env": [{"name": "HOME", "value": "/home/agent"}],
                    "resources": {"limits": {"memory": "512Mi", "cpu": "1500m"},
                                  "requests": {"memory": "512Mi", "cpu": "1500m"}},
                    "securityContext": {"allowPrivilegeEscalation": false, "privileged": false,
                        "readOnlyRootFilesystem": true, "runAsNonRoot": true,
                        "capabilities": {"drop": ["ALL"]}, "procMount": "Default"},
                    "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"},
                                     {"name": "tmp", "mountPath": "/tmp"}],
                    "terminationMessagePath": "/dev/termination-log",
                    "imagePullPolicy": "IfNotPresent"
                }]
            }
        }))
        .unwrap()
    }

    fn policy() -> NetworkPolicy {
        serde_json::from_value(json!({
            "metadata": {"name": "deny"},
            "spec": {"podSelector": {"matchLabels": {"nightshift.sandbox": "true"}},
                     "policyTypes": ["Ingress", "Egress"]}
        }))
        .unwrap()
    }

    fn expect() -> PodExpectations {
        PodExpectations {
            run_id: "r1".into(),
            uid: 2000,
            gid: 2000,
            seccomp_localhost_profile: "nightshift/sandbox.json".into(),
            max_memory_bytes: 1 << 30,
            max_deadline_seconds: 3600,
            runtime_class: None,
            allowed_env: BTreeMap::from([("HOME".into(), "/home/agent".into())]),
            volumes: BTreeMap::from([
                ("workspace".into(), "/workspace".into()),
                ("tmp".into(), "/tmp".into()),
            ]),
            memory_volumes: BTreeSet::from(["tmp".into()]),
        }
    }

    fn failures(observed: &Pod, requested: &Pod) -> Vec<&'static str> {
        attest_pod(observed, requested, &[policy()], &expect())
            .failures()
            .map(|p| p.name)
            .collect()
    }

    #[test]
    fn the_hardened_pod_passes_every_property_in_order() {
        let p = hardened();
        let att = attest_pod(&p, &p, &[policy()], &expect());
        assert!(att.passed(), "{:?}", att.failures().collect::<Vec<_>>());
        let names: Vec<&str> = att.properties.iter().map(|p| p.name).collect();
        assert_eq!(names, POD_PROPERTY_NAMES);
        assert_eq!(att.engine, Some(EngineKind::Kubernetes));
    }

    fn edit(f: impl Fn(&mut serde_json::Value)) -> Pod {
        let mut v = serde_json::to_value(hardened()).unwrap();
        f(&mut v);
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn each_breakage_fails_exactly_its_property() {
        type Edit = fn(&mut serde_json::Value);
        let cases: Vec<(&str, Edit)> = vec![
            ("network-none", |v| v["spec"]["hostNetwork"] = json!(true)),
            ("network-none", |v| {
                v["spec"]["containers"][0]["ports"] = json!([{"containerPort": 80, "hostPort": 80}])
            }),
            ("capabilities-dropped", |v| {
                v["spec"]["containers"][0]["securityContext"]["capabilities"] =
                    json!({"drop": ["ALL"], "add": ["NET_RAW"]})
            }),
            ("capabilities-dropped", |v| {
                v["spec"]["containers"][0]["securityContext"]["capabilities"] = json!({})
            }),
            ("not-privileged", |v| {
                v["spec"]["containers"][0]["securityContext"]["privileged"] = json!(true)
            }),
            ("no-new-privileges", |v| {
                v["spec"]["containers"][0]["securityContext"]
                    .as_object_mut()
                    .unwrap()
                    .remove("allowPrivilegeEscalation");
            }),
            ("seccomp-profile", |v| {
                v["spec"]["containers"][0]["securityContext"]["seccompProfile"] =
                    json!({"type": "Unconfined"})
            }),
            ("seccomp-profile", |v| {
                v["spec"]["securityContext"]["seccompProfile"] = json!({"type": "RuntimeDefault"})
            }),
            ("non-root-user", |v| {
                v["spec"]["containers"][0]["securityContext"]["runAsUser"] = json!(0)
            }),
            ("non-root-user", |v| {
                v["spec"]["securityContext"]["supplementalGroups"] = json!([0])
            }),
            ("read-only-root", |v| {
                v["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] =
                    json!(false)
            }),
            ("mounts-only-worktree", |v| {
                v["spec"]["volumes"][0] = json!({"name": "workspace",
                    "hostPath": {"path": "/var/lib/docker"}});
            }),
            ("mounts-only-worktree", |v| {
                v["spec"]["containers"][0]["volumeMounts"][0]["subPath"] = json!("../..")
            }),
            ("mounts-only-worktree", |v| {
                v["spec"]["volumes"][0]["emptyDir"] = json!({})
            }),
            ("tmpfs-only-allowed", |v| {
                v["spec"]["volumes"][0]["emptyDir"]["medium"] = json!("Memory")
            }),
            ("private-namespaces", |v| v["spec"]["hostPID"] = json!(true)),
            ("private-namespaces", |v| {
                v["spec"]["shareProcessNamespace"] = json!(true)
            }),
            ("memory-limited", |v| {
                v["spec"]["containers"][0]["resources"]["limits"]["memory"] = json!("2Gi")
            }),
            ("cpu-limited", |v| {
                v["spec"]["containers"][0]["resources"]["limits"]
                    .as_object_mut()
                    .unwrap()
                    .remove("cpu");
            }),
            ("env-allowlisted", |v| {
                v["spec"]["containers"][0]["env"] = json!([{"name": "TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}])
            }),
            ("env-allowlisted", |v| {
                v["spec"]["containers"][0]["envFrom"] = json!([{"secretRef": {"name": "s"}}])
            }),
            ("labelled", |v| {
                v["metadata"]["labels"]["nightshift.run"] = json!("other")
            }),
            ("no-sysctls", |v| {
                v["spec"]["securityContext"]["sysctls"] =
                    json!([{"name": "net.ipv4.ip_forward", "value": "1"}])
            }),
            ("runtime-default", |v| {
                v["spec"]["runtimeClassName"] = json!("kata")
            }),
            ("proc-masked", |v| {
                v["spec"]["containers"][0]["securityContext"]["procMount"] = json!("Unmasked")
            }),
            ("no-restart", |v| {
                v["spec"]["restartPolicy"] = json!("Always")
            }),
            ("no-service-account-token", |v| {
                v["spec"]["automountServiceAccountToken"] = json!(true)
            }),
            ("deadline-set", |v| {
                v["spec"]
                    .as_object_mut()
                    .unwrap()
                    .remove("activeDeadlineSeconds");
            }),
            ("admission-unchanged", |v| {
                v["spec"]["ephemeralContainers"] = json!([{"name": "debug", "image": "busybox"}])
            }),
        ];
        let requested = hardened();
        for (want, e) in cases {
            let observed = edit(e);
            assert_eq!(failures(&observed, &requested), [want], "breaking {want}");
        }
    }

    #[test]
    fn an_injected_sidecar_fails_admission_and_its_own_properties() {
        let observed = edit(|v| {
            let sidecar = json!({"name": "proxy", "image": "mesh:1",
                "securityContext": {"privileged": true}});
            v["spec"]["containers"]
                .as_array_mut()
                .unwrap()
                .push(sidecar);
        });
        let failed = failures(&observed, &hardened());
        for p in [
            "admission-unchanged",
            "not-privileged",
            "capabilities-dropped",
            "no-new-privileges",
            "read-only-root",
            "memory-limited",
        ] {
            assert!(failed.contains(&p), "{p} not in {failed:?}");
        }
        // An image swapped by admission, nothing else changed.
        let observed = edit(|v| v["spec"]["containers"][0]["image"] = json!("evil:1"));
        assert_eq!(failures(&observed, &hardened()), ["admission-unchanged"]);
    }

    #[test]
    fn unreadable_quantities_fail_closed() {
        for q in ["", "1Xi", "1..5Gi", "-1", "Gi", "1e400"] {
            assert_eq!(quantity(q, false), None, "{q}");
        }
        assert_eq!(quantity("512Mi", false), Some(512 << 20));
        assert_eq!(quantity("1500m", true), Some(1500));
        assert_eq!(quantity("2", true), Some(2000));
        assert_eq!(quantity("0.5", true), Some(500));
        let observed =
            edit(|v| v["spec"]["containers"][0]["resources"]["limits"]["memory"] = json!("lots"));
        assert_eq!(failures(&observed, &hardened()), ["memory-limited"]);
    }

    #[test]
    fn environment_values_never_reach_a_pods_verdict() {
        let secret = "sk-live-9f8e7d6c5b4a";
        for env in [
            json!([{"name": "TOKEN", "value": secret}]),
            json!([{"name": "HOME", "value": secret}]),
            json!([{"name": secret, "value": secret}]),
        ] {
            let observed = edit(|v| v["spec"]["containers"][0]["env"] = env.clone());
            let att = attest_pod(&observed, &hardened(), &[policy()], &expect());
            assert!(!att.passed());
            for p in &att.properties {
                assert!(
                    !p.observed.contains("9f8e7d6c5b4a") || p.name == "env-allowlisted",
                    "{}: {}",
                    p.name,
                    p.observed
                );
            }
            // A variable's name is shown; a value is not, even as a name's
            // look-alike: only where the name itself is the secret.
            let env_prop = att.property("env-allowlisted").unwrap();
            if env[0]["name"] != secret {
                assert!(!env_prop.observed.contains(secret), "{}", env_prop.observed);
            }
        }
    }

    #[test]
    fn a_policy_that_allows_anything_does_not_count() {
        let labels = BTreeMap::from([("nightshift.sandbox".to_owned(), "true".to_owned())]);
        assert!(denies_all(&policy(), &labels));
        for e in [
            json!({"spec": {"podSelector": {"matchLabels": {"nightshift.sandbox": "true"}},
                "policyTypes": ["Ingress"]}}),
            json!({"spec": {"podSelector": {"matchLabels": {"nightshift.sandbox": "true"}},
                "policyTypes": ["Ingress", "Egress"], "egress": [{}]}}),
            json!({"spec": {"podSelector": {"matchLabels": {"app": "web"}},
                "policyTypes": ["Ingress", "Egress"]}}),
            json!({"spec": {"podSelector": {"matchExpressions": [{"key": "x", "operator": "Exists"}]},
                "policyTypes": ["Ingress", "Egress"]}}),
        ] {
            let p: NetworkPolicy = serde_json::from_value(e.clone()).unwrap();
            assert!(!denies_all(&p, &labels), "{e}");
        }
    }
}
