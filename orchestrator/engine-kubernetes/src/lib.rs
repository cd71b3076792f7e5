//! Sandboxes as Kubernetes Pods (docs/kubernetes.md): what the Pod is
//! ([`pod`], pure), how the Pod the cluster returned is judged
//! (`orchestrator_attest::attest_pod`), and the controller that creates,
//! watches, deletes and sweeps them ([`cluster`], over kube-rs).
//!
//! Invariants:
//! - Only this crate names kube-rs (`scripts/check-layers.py`); the
//!   attestation reads k8s-openapi's types as data.
//! - What reaches the cluster is built by [`pod::pod`] from a checked plan;
//!   the documents [`manifest`] prints are that same object
//!   (`tests::the_manifest_is_json_documents_of_the_planned_objects`).

#![forbid(unsafe_code)]

pub mod cluster;
pub mod pod;

pub use cluster::{Cluster, ClusterError, Created, Waited};
pub use pod::{
    ending, expectations, pod, pod_name, sandbox_network_policy, Ending, PlanError, PodPlan,
};

/// The largest Pod or policy document [`judge`] reads.
pub const MAX_DOCUMENT: usize = 4 << 20;

/// Why a returned Pod could not be judged.
#[derive(Debug, thiserror::Error)]
pub enum JudgeError {
    #[error("the plan: {0}")]
    Plan(#[from] PlanError),
    #[error("{what} is larger than {MAX_DOCUMENT} bytes")]
    TooLarge { what: &'static str },
    #[error("{what} is not a {kind} document: {source}")]
    Malformed {
        what: &'static str,
        kind: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

/// Judges a Pod as a cluster returned it (`kubectl get pod -o json`)
/// against the Pod `plan` makes and the namespace's policies (a
/// `NetworkPolicyList` or one `NetworkPolicy`, as `kubectl get
/// networkpolicy -o json` prints them): the same verdict the controller
/// reaches after creating a Pod (`nightshift kube attest`).
pub fn judge(
    plan: &PodPlan,
    observed: &[u8],
    policies: Option<&[u8]>,
) -> Result<orchestrator_attest::Attestation, JudgeError> {
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    let requested = pod::pod(plan)?;
    if observed.len() > MAX_DOCUMENT {
        return Err(JudgeError::TooLarge { what: "the Pod" });
    }
    let observed: Pod =
        serde_json::from_slice(observed).map_err(|source| JudgeError::Malformed {
            what: "the Pod",
            kind: "Pod",
            source,
        })?;
    let mut list = Vec::new();
    if let Some(bytes) = policies {
        if bytes.len() > MAX_DOCUMENT {
            return Err(JudgeError::TooLarge {
                what: "the policies",
            });
        }
        let malformed = |source| JudgeError::Malformed {
            what: "the policies",
            kind: "NetworkPolicy or NetworkPolicyList",
            source,
        };
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(malformed)?;
        match value.get("items") {
            Some(items) => {
                list = serde_json::from_value(items.clone()).map_err(malformed)?;
            }
            None => list.push(serde_json::from_value::<NetworkPolicy>(value).map_err(malformed)?),
        }
    }
    Ok(orchestrator_attest::attest_pod(
        &observed,
        &requested,
        &list,
        &pod::expectations(plan),
    ))
}

/// The Pod and the namespace's deny-all policy for a plan, as one YAML
/// stream (`kubectl apply -f -`, `podman kube play`) of JSON documents:
/// JSON is YAML that every reader reads alike (Go's YAML parser, which
/// kubectl and Podman use, refuses some block scalars other emitters
/// write for a command with leading blank lines), and every string in it
/// is quoted and escaped.
pub fn manifest(plan: &PodPlan) -> Result<String, PlanError> {
    let pod = pod::pod(plan)?;
    documents(plan, with_kind(serde_json::to_value(&pod), "v1", "Pod"))
}

/// As [`manifest`], with the agent-sandbox project's `Sandbox` resource
/// ([`pod::sandbox_resource`]) in place of the Pod, for a cluster that runs
/// its controller.
pub fn sandbox_manifest(plan: &PodPlan) -> Result<String, PlanError> {
    documents(plan, pod::sandbox_resource(plan)?)
}

/// The namespace's deny-all policy, then `sandbox`, as JSON documents.
fn documents(plan: &PodPlan, sandbox: serde_json::Value) -> Result<String, PlanError> {
    let policy = pod::sandbox_network_policy(&plan.namespace);
    let mut out = String::new();
    for value in [
        with_kind(
            serde_json::to_value(&policy),
            "networking.k8s.io/v1",
            "NetworkPolicy",
        ),
        sandbox,
    ] {
        out.push_str("---\n");
        // A serde_json value always serialises.
        out.push_str(&serde_json::to_string_pretty(&value).unwrap_or_default());
        out.push('\n');
    }
    Ok(out)
}

fn with_kind(
    value: Result<serde_json::Value, serde_json::Error>,
    api: &str,
    kind: &str,
) -> serde_json::Value {
    let mut value = value.unwrap_or_default();
    if let Some(o) = value.as_object_mut() {
        // apiVersion and kind first, as people read manifests.
        let mut ordered = serde_json::Map::new();
        ordered.insert("apiVersion".into(), api.into());
        ordered.insert("kind".into(), kind.into());
        ordered.extend(std::mem::take(o));
        *o = ordered;
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `judge` reaches the controller's verdict on documents as kubectl
    /// prints them, and refuses what it cannot read by name.
    #[test]
    fn a_returned_pod_is_judged_from_its_documents() {
        let plan = pod::tests::plan();
        let made = serde_json::to_vec(&pod::pod(&plan).unwrap()).unwrap();
        let policy = serde_json::to_value(pod::sandbox_network_policy(&plan.namespace)).unwrap();
        let list = serde_json::to_vec(&serde_json::json!({"items": [policy]})).unwrap();
        let one = serde_json::to_vec(&policy).unwrap();
        for policies in [&list, &one] {
            assert!(judge(&plan, &made, Some(policies)).unwrap().passed());
        }
        let att = judge(&plan, &made, None).unwrap();
        let failed: Vec<&str> = att.failures().map(|p| p.name).collect();
        assert_eq!(failed, ["network-none"]);
        let mut weakened: serde_json::Value = serde_json::from_slice(&made).unwrap();
        weakened["spec"]["automountServiceAccountToken"] = serde_json::json!(true);
        let weakened = serde_json::to_vec(&weakened).unwrap();
        let att = judge(&plan, &weakened, Some(&list)).unwrap();
        let failed: Vec<&str> = att.failures().map(|p| p.name).collect();
        assert_eq!(failed, ["no-service-account-token"]);
        assert!(matches!(
            judge(&plan, b"[1,2]", None),
            Err(JudgeError::Malformed {
                what: "the Pod",
                ..
            })
        ));
        assert!(matches!(
            judge(&plan, &vec![b' '; MAX_DOCUMENT + 1], None),
            Err(JudgeError::TooLarge { .. })
        ));
    }

    /// Every document of the manifest is JSON (so YAML everywhere) and the
    /// Pod in it is the one `pod` makes.
    #[test]
    fn the_manifest_is_json_documents_of_the_planned_objects() {
        let mut plan = pod::tests::plan();
        plan.command = vec!["bash".into(), "-c".into(), "\n  echo \"x\"\n\tdone".into()];
        let text = manifest(&plan).unwrap();
        let docs: Vec<serde_json::Value> = text
            .split("---\n")
            .filter(|d| !d.trim().is_empty())
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0]["kind"], "NetworkPolicy");
        assert_eq!(docs[1]["kind"], "Pod");
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(docs[1].clone()).unwrap();
        assert_eq!(pod, pod::pod(&plan).unwrap());
        for d in &docs {
            let yaml: serde_json::Value =
                serde_yaml::from_str(&serde_json::to_string_pretty(d).unwrap()).unwrap();
            assert_eq!(&yaml, d);
        }
    }
}
