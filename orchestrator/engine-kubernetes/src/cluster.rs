//! The controller: creates a run's Pod, judges the Pod the API server
//! returned, waits for it to end, removes it, and sweeps what a killed
//! supervisor left. Every decision is one of [`crate::pod`]'s pure
//! functions or the attestation's; this module talks to the API and
//! carries them out.
//!
//! Invariants:
//! - No Pod is left running that failed its attestation: a refused Pod is
//!   deleted before [`Cluster::create`] returns the refusal
//!   (`tests/mock_api.rs::mock_api_an_admission_that_weakens_the_pod_is_refused_and_deleted`).
//! - The namespace's isolation is checked before every creation: a missing
//!   deny-all policy is created, one that allows anything is refused, not
//!   replaced (`tests/mock_api.rs::mock_api_a_weakened_policy_is_refused`).
//! - [`Cluster::wait`] returns within its bound whatever the API does: at the
//!   bound it deletes the Pod itself (the outer kill switch beside
//!   `activeDeadlineSeconds`), and a watch that ends or breaks is re-read
//!   after a pause, never in a hot loop
//!   (`tests/mock_api.rs::mock_api_a_pod_that_never_ends_is_deleted_at_the_bound`).
//! - [`Cluster::sweep`] removes only Pods labelled with this owner whose
//!   run is not live (`tests/mock_api.rs::mock_api_orphans_of_this_owner_only_are_swept`).

use std::collections::BTreeSet;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::Client;
use orchestrator_attest::{attest_pod, denies_all, Attestation};

use crate::pod::{
    ending, expectations, pod, pod_name, sandbox_network_policy, Ending, PlanError, PodPlan,
    OWNER_LABEL, POLICY_NAME, SANDBOX_LABEL,
};

/// What went wrong talking to the cluster or judging what it returned.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("the plan: {0}")]
    Plan(#[from] PlanError),
    #[error("the Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    #[error("the Pod the cluster returned breaks Tier 0 (it was deleted): {failed}")]
    Refused {
        attestation: Box<Attestation>,
        failed: String,
    },
    #[error("NetworkPolicy {name} exists but does not deny all ingress and egress of sandboxes; nightshift does not replace it")]
    PolicyWeakened { name: String },
    #[error("the API returned a Pod without {0}")]
    Incomplete(&'static str),
}

/// A created Pod and its verdict.
#[derive(Debug, Clone)]
pub struct Created {
    pub name: String,
    pub attestation: Attestation,
}

/// How [`Cluster::wait`] saw the run end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waited {
    Ended(Ending),
    /// The Pod was deleted by someone else before it ended.
    Deleted,
    /// The bound passed first: nightshift deleted the Pod.
    KilledAtBound,
}

/// One namespace of sandboxes.
#[derive(Clone)]
pub struct Cluster {
    pods: Api<Pod>,
    policies: Api<NetworkPolicy>,
    namespace: String,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("namespace", &self.namespace)
            .finish()
    }
}

/// A watch longer than this is re-opened (servers end watches too).
const WATCH_SECONDS: u32 = 60;
/// The pause before re-reading a Pod whose watch ended without news.
const REREAD_PAUSE: Duration = Duration::from_millis(200);

impl Cluster {
    pub fn new(client: Client, namespace: &str) -> Self {
        Cluster {
            pods: Api::namespaced(client.clone(), namespace),
            policies: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
        }
    }

    /// The namespace's deny-all policy: created when missing, refused when
    /// it exists and allows anything.
    pub async fn ensure_isolation(&self) -> Result<NetworkPolicy, ClusterError> {
        let wanted = sandbox_network_policy(&self.namespace);
        let labels = wanted
            .spec
            .as_ref()
            .and_then(|s| s.pod_selector.as_ref()?.match_labels.clone())
            .unwrap_or_default();
        match self.policies.get_opt(POLICY_NAME).await? {
            Some(existing) if denies_all(&existing, &labels) => Ok(existing),
            Some(_) => Err(ClusterError::PolicyWeakened {
                name: POLICY_NAME.into(),
            }),
            None => Ok(self
                .policies
                .create(&PostParams::default(), &wanted)
                .await?),
        }
    }

    /// Creates the run's Pod and judges the Pod the API server returned
    /// (after admission) against the request and the namespace's policies;
    /// a Pod that fails is deleted and the refusal returned.
    pub async fn create(&self, plan: &PodPlan) -> Result<Created, ClusterError> {
        let requested = pod(plan)?;
        self.ensure_isolation().await?;
        let returned = self.pods.create(&PostParams::default(), &requested).await?;
        let name = returned
            .metadata
            .name
            .clone()
            .ok_or(ClusterError::Incomplete("a name"))?;
        let policies = self.policies.list(&ListParams::default()).await?.items;
        let attestation = attest_pod(&returned, &requested, &policies, &expectations(plan));
        if let Err(refused) = attestation.ensure_passed() {
            self.remove(&plan.run_id).await?;
            return Err(ClusterError::Refused {
                attestation: Box::new(attestation),
                failed: refused.to_string(),
            });
        }
        Ok(Created { name, attestation })
    }

    /// Waits for the run's Pod to end, at most `bound`; at the bound the Pod
    /// is deleted.
    pub async fn wait(&self, run_id: &str, bound: Duration) -> Result<Waited, ClusterError> {
        match tokio::time::timeout(bound, self.follow(run_id)).await {
            Ok(result) => result,
            Err(_) => {
                self.remove(run_id).await?;
                Ok(Waited::KilledAtBound)
            }
        }
    }

    async fn follow(&self, run_id: &str) -> Result<Waited, ClusterError> {
        let name = pod_name(run_id);
        loop {
            let Some(current) = self.pods.get_opt(&name).await? else {
                return Ok(Waited::Deleted);
            };
            if let Some(end) = ending(&current) {
                return Ok(Waited::Ended(end));
            }
            let version = current
                .metadata
                .resource_version
                .clone()
                .unwrap_or_default();
            let params = WatchParams::default()
                .fields(&format!("metadata.name={name}"))
                .timeout(WATCH_SECONDS);
            let mut events = match self.pods.watch(&params, &version).await {
                Ok(events) => events.boxed(),
                Err(_) => {
                    // Re-read rather than fail: the API may be restarting.
                    tokio::time::sleep(REREAD_PAUSE).await;
                    continue;
                }
            };
            while let Some(event) = events.next().await {
                match event {
                    Ok(WatchEvent::Added(p)) | Ok(WatchEvent::Modified(p)) => {
                        if let Some(end) = ending(&p) {
                            return Ok(Waited::Ended(end));
                        }
                    }
                    Ok(WatchEvent::Deleted(p)) => {
                        return Ok(match ending(&p) {
                            Some(end) => Waited::Ended(end),
                            None => Waited::Deleted,
                        });
                    }
                    // A bookmark, or an error event (an expired version):
                    // re-read from the top.
                    Ok(_) | Err(_) => break,
                }
            }
            // The watch ended without an ending: re-read, but never in a
            // hot loop against a server that ends every watch at once.
            tokio::time::sleep(REREAD_PAUSE).await;
        }
    }

    /// Deletes the run's Pod at once; one already gone is fine.
    pub async fn remove(&self, run_id: &str) -> Result<(), ClusterError> {
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        match self.pods.delete(&pod_name(run_id), &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes this owner's sandbox Pods whose runs are not live (what a
    /// supervisor killed with `kill -9` left); returns their run ids.
    pub async fn sweep(
        &self,
        owner: &str,
        live: &BTreeSet<String>,
    ) -> Result<Vec<String>, ClusterError> {
        let params =
            ListParams::default().labels(&format!("{SANDBOX_LABEL}=true,{OWNER_LABEL}={owner}"));
        let mut swept = Vec::new();
        for p in self.pods.list(&params).await?.items {
            let labels = p.metadata.labels.clone().unwrap_or_default();
            // The server filtered by label; checked again here, so a server
            // that ignores the selector cannot make us delete others' Pods.
            if labels.get(OWNER_LABEL).map(String::as_str) != Some(owner)
                || labels.get(SANDBOX_LABEL).map(String::as_str) != Some("true")
            {
                continue;
            }
            let Some(run) = labels.get(orchestrator_attest::POD_RUN_LABEL) else {
                continue;
            };
            if !live.contains(run) {
                self.remove(run).await?;
                swept.push(run.clone());
            }
        }
        Ok(swept)
    }
}
