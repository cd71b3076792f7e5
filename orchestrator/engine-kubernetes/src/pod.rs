//! What a sandbox Pod is: pure functions from a run's plan to the Pod and
//! the namespace's deny-all NetworkPolicy nightshift sends, the expectations
//! the attestation judges the returned Pod by, and how a Pod's status ends
//! a run.
//!
//! Invariants:
//! - Every Pod [`pod`] makes passes [`orchestrator_attest::attest_pod`]
//!   against itself, [`sandbox_network_policy`] and [`expectations`]
//!   (`tests::every_planned_pod_passes_its_own_attestation`, a property test).
//! - The plan is checked before any object is made: a run id that is not a
//!   DNS label, uid or gid 0, a zero or absent cap, a command that is empty
//!   are refused by name ([`PlanError`]); nothing the agent wrote is in the
//!   plan but its environment values, which are data.
//! - [`ending`] reads only the Pod's status: a terminal phase, the
//!   container's exit code, `DeadlineExceeded`, `Evicted`, `OOMKilled`;
//!   a Pod still pending or running is not ended
//!   (`tests::endings_follow_the_status`).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, Pod, PodSecurityContext, PodSpec,
    ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use orchestrator_attest::{PodExpectations, POD_RUN_LABEL};

/// The label every sandbox Pod carries, which the deny-all policy selects.
pub const SANDBOX_LABEL: &str = "nightshift.sandbox";
/// The label naming the supervisor (or worker) that made the Pod.
pub const OWNER_LABEL: &str = "nightshift.owner";
/// The NetworkPolicy that isolates every sandbox of a namespace.
pub const POLICY_NAME: &str = "nightshift-sandboxes-deny-all";
/// nightshift's seccomp profile under the kubelet's seccomp root
/// (`nightshift kube seccomp-profile` prints it; docs/kubernetes.md). A
/// plain file name: Podman's `kube play` reads no subdirectory there.
pub const SECCOMP_PROFILE: &str = "nightshift-sandbox.json";
/// The agent's container in the Pod.
pub const AGENT: &str = "agent";

/// The writable volumes: name, mount path, memory-backed.
pub const VOLUMES: [(&str, &str, bool); 3] = [
    ("workspace", "/workspace", false),
    ("tmp", "/tmp", true),
    ("home", "/home/agent", true),
];

/// One run's sandbox, as nightshift plans it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPlan {
    pub run_id: String,
    pub namespace: String,
    /// Who made it (`OWNER_LABEL`): the worker's id.
    pub owner: String,
    pub image: String,
    /// `Never` for images loaded on the node, `IfNotPresent` from a registry.
    pub image_pull_policy: String,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub uid: i64,
    pub gid: i64,
    pub memory_bytes: i64,
    pub cpu_millis: i64,
    pub wall_seconds: i64,
    /// The worktree's size cap (the `workspace` emptyDir's limit).
    pub worktree_bytes: i64,
    /// Each memory-backed volume's size.
    pub tmpfs_bytes: i64,
    /// A RuntimeClass (`gvisor`) the owner requires.
    pub runtime_class: Option<String>,
}

/// Why a plan cannot become a Pod.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("run id {0:?} is not a DNS label (lowercase letters, digits and '-', at most 56)")]
    RunId(String),
    #[error("{0} must not be 0 (the sandbox never runs as root)")]
    Root(&'static str),
    #[error("{0} must be positive")]
    NotPositive(&'static str),
    #[error("the command is empty")]
    EmptyCommand,
    #[error("{what} {value:?} is not a valid name")]
    Name { what: &'static str, value: String },
}

fn dns_label(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The Pod's name for a run.
pub fn pod_name(run_id: &str) -> String {
    format!("ns-run-{run_id}")
}

impl PodPlan {
    /// Refuses a plan that cannot be a Tier 0 Pod, naming what is wrong.
    pub fn check(&self) -> Result<(), PlanError> {
        if !dns_label(&self.run_id, 56) {
            return Err(PlanError::RunId(self.run_id.clone()));
        }
        if !dns_label(&self.namespace, 63) {
            return Err(PlanError::Name {
                what: "namespace",
                value: self.namespace.clone(),
            });
        }
        if !dns_label(&self.owner, 63) {
            return Err(PlanError::Name {
                what: "owner",
                value: self.owner.clone(),
            });
        }
        if self.image.is_empty() || self.image.chars().any(char::is_whitespace) {
            return Err(PlanError::Name {
                what: "image",
                value: self.image.clone(),
            });
        }
        if !matches!(
            self.image_pull_policy.as_str(),
            "Never" | "IfNotPresent" | "Always"
        ) {
            return Err(PlanError::Name {
                what: "image pull policy",
                value: self.image_pull_policy.clone(),
            });
        }
        if let Some(r) = &self.runtime_class {
            if !dns_label(r, 63) {
                return Err(PlanError::Name {
                    what: "runtime class",
                    value: r.clone(),
                });
            }
        }
        for k in self.env.keys() {
            let ok = !k.is_empty()
                && !k.starts_with(|c: char| c.is_ascii_digit())
                && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !ok {
                return Err(PlanError::Name {
                    what: "environment variable",
                    value: k.clone(),
                });
            }
        }
        if self.uid == 0 {
            return Err(PlanError::Root("uid"));
        }
        if self.gid == 0 {
            return Err(PlanError::Root("gid"));
        }
        for (what, v) in [
            ("uid", self.uid),
            ("gid", self.gid),
            ("memory", self.memory_bytes),
            ("cpu", self.cpu_millis),
            ("wall time", self.wall_seconds),
            ("worktree size", self.worktree_bytes),
            ("tmpfs size", self.tmpfs_bytes),
        ] {
            if v <= 0 {
                return Err(PlanError::NotPositive(what));
            }
        }
        if self.command.is_empty() {
            return Err(PlanError::EmptyCommand);
        }
        Ok(())
    }
}

fn labels(plan: &PodPlan) -> BTreeMap<String, String> {
    BTreeMap::from([
        (POD_RUN_LABEL.to_owned(), plan.run_id.clone()),
        (SANDBOX_LABEL.to_owned(), "true".to_owned()),
        (OWNER_LABEL.to_owned(), plan.owner.clone()),
    ])
}

/// The Pod for a run: one container, nothing from the host or the cluster
/// but sized `emptyDir` volumes, every privilege refused.
pub fn pod(plan: &PodPlan) -> Result<Pod, PlanError> {
    plan.check()?;
    let limits = BTreeMap::from([
        ("memory".to_owned(), Quantity(plan.memory_bytes.to_string())),
        ("cpu".to_owned(), Quantity(format!("{}m", plan.cpu_millis))),
        (
            "ephemeral-storage".to_owned(),
            Quantity(plan.worktree_bytes.to_string()),
        ),
    ]);
    let seccomp = SeccompProfile {
        type_: "Localhost".into(),
        localhost_profile: Some(SECCOMP_PROFILE.into()),
    };
    let agent = Container {
        name: AGENT.into(),
        image: Some(plan.image.clone()),
        image_pull_policy: Some(plan.image_pull_policy.clone()),
        command: Some(plan.command.clone()),
        working_dir: Some("/workspace".into()),
        env: Some(
            plan.env
                .iter()
                .map(|(k, v)| EnvVar {
                    name: k.clone(),
                    value: Some(v.clone()),
                    value_from: None,
                })
                .collect(),
        ),
        resources: Some(ResourceRequirements {
            requests: Some(limits.clone()),
            limits: Some(limits),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            run_as_user: Some(plan.uid),
            run_as_group: Some(plan.gid),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            seccomp_profile: Some(seccomp.clone()),
            proc_mount: Some("Default".into()),
            ..Default::default()
        }),
        volume_mounts: Some(
            VOLUMES
                .iter()
                .map(|(name, path, _)| VolumeMount {
                    name: (*name).into(),
                    mount_path: (*path).into(),
                    ..Default::default()
                })
                .collect(),
        ),
        stdin: Some(false),
        tty: Some(false),
        ..Default::default()
    };
    let volumes = VOLUMES
        .iter()
        .map(|(name, _, memory)| Volume {
            name: (*name).into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: memory.then(|| "Memory".to_owned()),
                size_limit: Some(Quantity(
                    if *memory {
                        plan.tmpfs_bytes
                    } else {
                        plan.worktree_bytes
                    }
                    .to_string(),
                )),
            }),
            ..Default::default()
        })
        .collect();
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(&plan.run_id)),
            namespace: Some(plan.namespace.clone()),
            labels: Some(labels(plan)),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![agent],
            volumes: Some(volumes),
            restart_policy: Some("Never".into()),
            active_deadline_seconds: Some(plan.wall_seconds),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            host_network: Some(false),
            host_pid: Some(false),
            host_ipc: Some(false),
            share_process_namespace: Some(false),
            runtime_class_name: plan.runtime_class.clone(),
            termination_grace_period_seconds: Some(0),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(plan.uid),
                run_as_group: Some(plan.gid),
                fs_group: Some(plan.gid),
                seccomp_profile: Some(seccomp),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    })
}

/// The agent-sandbox project's resource (`agents.x-k8s.io/v1alpha1`,
/// `Sandbox`), for a cluster that runs its controller: the Pod [`pod`]
/// makes as its `podTemplate` (its labels, annotations and spec, whole),
/// one replica, no Service (the sandbox takes no traffic), deleted with
/// what it made when it ends. The controller makes the Pod from the
/// template; that Pod is judged as any (`nightshift kube attest`), so
/// nothing the controller adds goes unseen
/// (`tests::a_sandbox_resource_carries_the_pod_whole`).
pub fn sandbox_resource(plan: &PodPlan) -> Result<serde_json::Value, PlanError> {
    let pod = pod(plan)?;
    let mut template_meta = serde_json::Map::new();
    if let Some(labels) = &pod.metadata.labels {
        template_meta.insert("labels".into(), serde_json::json!(labels));
    }
    if let Some(annotations) = &pod.metadata.annotations {
        template_meta.insert("annotations".into(), serde_json::json!(annotations));
    }
    Ok(serde_json::json!({
        "apiVersion": SANDBOX_API_VERSION,
        "kind": "Sandbox",
        "metadata": {
            "name": pod.metadata.name,
            "namespace": pod.metadata.namespace,
            "labels": pod.metadata.labels,
        },
        "spec": {
            "podTemplate": {
                "metadata": template_meta,
                "spec": pod.spec,
            },
            "replicas": 1,
            "service": false,
            "shutdownPolicy": "Delete",
        },
    }))
}

/// The agent-sandbox resource's API version.
pub const SANDBOX_API_VERSION: &str = "agents.x-k8s.io/v1alpha1";

/// The policy that denies every sandbox of the namespace all ingress and
/// egress (the model gateway and the door arrive by the node-local relay,
/// not the Pod network).
pub fn sandbox_network_policy(namespace: &str) -> NetworkPolicy {
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(POLICY_NAME.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    SANDBOX_LABEL.to_owned(),
                    "true".to_owned(),
                )])),
                match_expressions: None,
            }),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: None,
            egress: None,
        }),
    }
}

/// What the returned Pod is judged against.
pub fn expectations(plan: &PodPlan) -> PodExpectations {
    PodExpectations {
        run_id: plan.run_id.clone(),
        uid: plan.uid,
        gid: plan.gid,
        seccomp_localhost_profile: SECCOMP_PROFILE.into(),
        max_memory_bytes: plan.memory_bytes,
        max_deadline_seconds: plan.wall_seconds,
        runtime_class: plan.runtime_class.clone(),
        allowed_env: plan.env.clone(),
        volumes: VOLUMES
            .iter()
            .map(|(n, p, _)| ((*n).to_owned(), (*p).to_owned()))
            .collect(),
        memory_volumes: VOLUMES
            .iter()
            .filter(|(_, _, m)| *m)
            .map(|(n, _, _)| (*n).to_owned())
            .collect::<BTreeSet<_>>(),
    }
}

/// How a Pod ended a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The agent's process exited with this code.
    Exited(i32),
    /// `activeDeadlineSeconds` passed: the wall cap.
    Deadline,
    /// The kubelet killed the container at its memory limit.
    OutOfMemory,
    /// The node evicted the Pod (pressure, drain); its message.
    Evicted(String),
    /// Failed for another reason the kubelet named.
    Failed(String),
}

/// The Pod's ending, or `None` while it may still run.
pub fn ending(pod: &Pod) -> Option<Ending> {
    let status = pod.status.as_ref()?;
    let phase = status.phase.as_deref().unwrap_or("");
    let reason = status.reason.clone().unwrap_or_default();
    let message = status.message.clone().unwrap_or_default();
    let terminated = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == AGENT)
        .and_then(|c| c.state.as_ref()?.terminated.clone());
    match phase {
        "Succeeded" | "Failed" => {}
        _ => return None,
    }
    if reason == "DeadlineExceeded" {
        return Some(Ending::Deadline);
    }
    if reason == "Evicted" {
        return Some(Ending::Evicted(message));
    }
    match terminated {
        Some(t) if t.reason.as_deref() == Some("OOMKilled") => Some(Ending::OutOfMemory),
        Some(t) => Some(Ending::Exited(t.exit_code)),
        None if phase == "Succeeded" => Some(Ending::Exited(0)),
        None => Some(Ending::Failed(if reason.is_empty() {
            "failed without a container status".into()
        } else {
            reason
        })),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #[test]
    fn a_sandbox_resource_carries_the_pod_whole() {
        let plan = plan();
        let pod = pod(&plan).unwrap();
        let sandbox = sandbox_resource(&plan).unwrap();
        assert_eq!(sandbox["apiVersion"], SANDBOX_API_VERSION);
        assert_eq!(sandbox["kind"], "Sandbox");
        assert_eq!(
            sandbox["metadata"]["name"],
            serde_json::json!(pod.metadata.name)
        );
        assert_eq!(
            sandbox["metadata"]["namespace"],
            serde_json::json!(pod.metadata.namespace)
        );
        let template = &sandbox["spec"]["podTemplate"];
        assert_eq!(template["spec"], serde_json::to_value(&pod.spec).unwrap());
        assert_eq!(
            template["metadata"]["labels"],
            serde_json::json!(pod.metadata.labels)
        );
        assert_eq!(
            template["metadata"]["annotations"],
            serde_json::json!(pod.metadata.annotations)
        );
        // The template, made a Pod again, passes the Pod's own attestation.
        let again: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": pod.metadata.name,
                "namespace": pod.metadata.namespace,
                "labels": template["metadata"]["labels"],
                "annotations": template["metadata"]["annotations"],
            },
            "spec": template["spec"],
        }))
        .unwrap();
        let attestation = attest_pod(
            &pod,
            &again,
            &[sandbox_network_policy(&plan.namespace)],
            &expectations(&plan),
        );
        assert!(attestation.passed(), "{attestation:?}");
        assert_eq!(sandbox["spec"]["replicas"], 1);
        assert_eq!(sandbox["spec"]["service"], false);
        // A plan refused as a Pod is refused as a Sandbox.
        let mut bad = plan.clone();
        bad.command.clear();
        assert!(sandbox_resource(&bad).is_err());
    }

    use super::*;
    use orchestrator_attest::{attest_pod, POD_PROPERTY_NAMES};
    use proptest::prelude::*;

    pub(crate) fn plan() -> PodPlan {
        PodPlan {
            run_id: "r-1".into(),
            namespace: "sandboxes".into(),
            owner: "worker-1".into(),
            image: "nightshift-sandbox:abc".into(),
            image_pull_policy: "Never".into(),
            command: vec!["bash".into(), "-c".into(), "echo hi".into()],
            env: BTreeMap::from([("HOME".into(), "/home/agent".into())]),
            uid: 2_000_000_000,
            gid: 2_000_000_000,
            memory_bytes: 1 << 30,
            cpu_millis: 1500,
            wall_seconds: 3600,
            worktree_bytes: 2 << 30,
            tmpfs_bytes: 64 << 20,
            runtime_class: None,
        }
    }

    proptest! {
        #[test]
        fn every_planned_pod_passes_its_own_attestation(
            run in "[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?",
            uid in 1i64..4_000_000_000,
            gid in 1i64..4_000_000_000,
            memory in 1i64..(1 << 40),
            cpu in 1i64..64_000,
            wall in 1i64..1_000_000,
            gvisor in any::<bool>(),
            env in proptest::collection::btree_map("[A-Z_][A-Z0-9_]{0,8}", ".{0,20}", 0..5),
        ) {
            let p = PodPlan {
                run_id: run,
                uid,
                gid,
                memory_bytes: memory,
                cpu_millis: cpu,
                wall_seconds: wall,
                runtime_class: gvisor.then(|| "gvisor".to_owned()),
                env,
                ..plan()
            };
            let made = pod(&p).unwrap();
            let att = attest_pod(&made, &made, &[sandbox_network_policy(&p.namespace)], &expectations(&p));
            prop_assert!(att.passed(), "{:?}", att.failures().collect::<Vec<_>>());
            let names: Vec<&str> = att.properties.iter().map(|p| p.name).collect();
            prop_assert_eq!(names, POD_PROPERTY_NAMES.to_vec());
        }
    }

    #[test]
    fn without_the_policy_the_network_is_not_none() {
        let p = plan();
        let made = pod(&p).unwrap();
        let att = attest_pod(&made, &made, &[], &expectations(&p));
        let failed: Vec<&str> = att.failures().map(|p| p.name).collect();
        assert_eq!(failed, ["network-none"]);
    }

    #[test]
    fn plans_that_cannot_be_tier0_are_refused_by_name() {
        type Breakage = fn(&mut PodPlan);
        let cases: [(Breakage, PlanError); 6] = [
            (
                |p| p.run_id = "Run_1".into(),
                PlanError::RunId("Run_1".into()),
            ),
            (|p| p.uid = 0, PlanError::Root("uid")),
            (|p| p.gid = 0, PlanError::Root("gid")),
            (|p| p.memory_bytes = 0, PlanError::NotPositive("memory")),
            (|p| p.command.clear(), PlanError::EmptyCommand),
            (
                |p| {
                    p.env.insert("A=B".into(), "x".into());
                },
                PlanError::Name {
                    what: "environment variable",
                    value: "A=B".into(),
                },
            ),
        ];
        for (breakage, want) in cases {
            let mut p = plan();
            breakage(&mut p);
            assert_eq!(pod(&p).unwrap_err(), want);
        }
    }

    #[test]
    fn endings_follow_the_status() {
        use k8s_openapi::api::core::v1::{
            ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus,
        };
        let status = |phase: &str, reason: Option<&str>, term: Option<(i32, &str)>| {
            let mut p = pod(&plan()).unwrap();
            p.status = Some(PodStatus {
                phase: Some(phase.into()),
                reason: reason.map(Into::into),
                message: Some("m".into()),
                container_statuses: term.map(|(code, r)| {
                    vec![ContainerStatus {
                        name: AGENT.into(),
                        state: Some(ContainerState {
                            terminated: Some(ContainerStateTerminated {
                                exit_code: code,
                                reason: Some(r.into()),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            });
            ending(&p)
        };
        assert_eq!(status("Pending", None, None), None);
        assert_eq!(status("Running", None, None), None);
        assert_eq!(status("Unknown", None, None), None);
        assert_eq!(
            status("Succeeded", None, Some((0, "Completed"))),
            Some(Ending::Exited(0))
        );
        assert_eq!(
            status("Failed", None, Some((2, "Error"))),
            Some(Ending::Exited(2))
        );
        assert_eq!(
            status("Failed", None, Some((137, "OOMKilled"))),
            Some(Ending::OutOfMemory)
        );
        assert_eq!(
            status("Failed", Some("DeadlineExceeded"), None),
            Some(Ending::Deadline)
        );
        assert_eq!(
            status("Failed", Some("Evicted"), None),
            Some(Ending::Evicted("m".into()))
        );
        assert_eq!(
            status("Failed", Some("NodeLost"), None),
            Some(Ending::Failed("NodeLost".into()))
        );
        assert_eq!(ending(&pod(&plan()).unwrap()), None);
    }
}
