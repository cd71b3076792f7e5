//! The controller against a MOCK Kubernetes API: kube-rs's client over
//! tower-test's mock service, answered by an in-memory API server written
//! here (Pods and NetworkPolicies by name, label-selected lists, watches
//! that replay scripted events). No cluster runs on this machine; every
//! test's name starts with `mock_api_` to say so. What only a real cluster
//! can show is listed in docs/kubernetes.md.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodStatus,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::client::Body;
use kube::Client;
use nightshift_engine_kubernetes::pod::{OWNER_LABEL, POLICY_NAME, SANDBOX_LABEL};
use nightshift_engine_kubernetes::{pod_name, Cluster, ClusterError, Ending, PodPlan, Waited};
use serde_json::{json, Value};

const NS: &str = "nightshift-sandboxes";

fn plan(run: &str) -> PodPlan {
    PodPlan {
        run_id: run.into(),
        namespace: NS.into(),
        owner: "worker-1".into(),
        image: "nightshift-sandbox:test".into(),
        image_pull_policy: "IfNotPresent".into(),
        command: vec!["/bin/true".into()],
        env: BTreeMap::from([("HOME".into(), "/home/agent".into())]),
        uid: 2_000_000_000,
        gid: 2_000_000_000,
        memory_bytes: 1 << 30,
        cpu_millis: 1000,
        wall_seconds: 600,
        worktree_bytes: 1 << 30,
        tmpfs_bytes: 64 << 20,
        runtime_class: None,
    }
}

/// What admission does to a created Pod (a mutating webhook, defaults).
type Admission = Box<dyn Fn(&mut Pod) + Send>;

#[derive(Default)]
struct Server {
    pods: BTreeMap<String, Pod>,
    policies: BTreeMap<String, NetworkPolicy>,
    admission: Option<Admission>,
    /// Each watch request takes the next list of events (none: an empty
    /// watch that ends at once).
    watches: VecDeque<Vec<(String, Pod)>>,
    /// Lists ignore the label selector (a broken or hostile server).
    ignore_selectors: bool,
    /// Every request as `METHOD path?query`.
    log: Vec<String>,
    version: u64,
}

type Shared = Arc<Mutex<Server>>;

fn status(code: u16, reason: &str) -> Response<Body> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": reason, "reason": reason, "code": code});
    Response::builder()
        .status(code)
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}

fn ok(code: StatusCode, value: &impl serde::Serialize) -> Response<Body> {
    Response::builder()
        .status(code)
        .body(Body::from(serde_json::to_vec(value).unwrap()))
        .unwrap()
}

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items})
}

fn selected(labels: &BTreeMap<String, String>, query: &str) -> bool {
    let Some(sel) = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("labelSelector="))
    else {
        return true;
    };
    let sel = sel.replace("%3D", "=").replace("%2C", ",");
    sel.split(',').all(|kv| {
        let (k, v) = kv.split_once('=').unwrap();
        labels.get(k).map(String::as_str) == Some(v)
    })
}

async fn answer(server: Shared, req: Request<Body>) -> Response<Body> {
    use http_body_util::BodyExt as _;
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let mut s = server.lock().unwrap();
    s.log.push(format!("{method} {path}?{query}"));
    let pods = format!("/api/v1/namespaces/{NS}/pods");
    let policies = format!("/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies");
    s.version += 1;
    let version = s.version.to_string();
    if path == pods && method == "POST" {
        let mut pod: Pod = serde_json::from_slice(&body).unwrap();
        if let Some(admit) = &s.admission {
            admit(&mut pod);
        }
        pod.metadata.resource_version = Some(version);
        pod.status = Some(PodStatus {
            phase: Some("Pending".into()),
            ..Default::default()
        });
        let name = pod.metadata.name.clone().unwrap();
        s.pods.insert(name, pod.clone());
        return ok(StatusCode::CREATED, &pod);
    }
    if path == pods && method == "GET" && query.contains("watch=true") {
        let events = s.watches.pop_front().unwrap_or_default();
        let mut text = String::new();
        for (kind, pod) in events {
            if kind == "MODIFIED" {
                s.pods
                    .insert(pod.metadata.name.clone().unwrap(), pod.clone());
            }
            text.push_str(&serde_json::to_string(&json!({"type": kind, "object": pod})).unwrap());
            text.push('\n');
        }
        return Response::builder()
            .status(200)
            .body(Body::from(text.into_bytes()))
            .unwrap();
    }
    if path == pods && method == "GET" {
        let ignore = s.ignore_selectors;
        let items = s
            .pods
            .values()
            .filter(|p| ignore || selected(&p.metadata.labels.clone().unwrap_or_default(), &query))
            .map(|p| serde_json::to_value(p).unwrap())
            .collect();
        return ok(StatusCode::OK, &list("PodList", items));
    }
    if let Some(name) = path.strip_prefix(&format!("{pods}/")) {
        return match method.as_str() {
            "GET" => match s.pods.get(name) {
                Some(p) => ok(StatusCode::OK, p),
                None => status(404, "NotFound"),
            },
            "DELETE" => match s.pods.remove(name) {
                Some(p) => ok(StatusCode::OK, &p),
                None => status(404, "NotFound"),
            },
            _ => status(405, "MethodNotAllowed"),
        };
    }
    if path == policies && method == "POST" {
        let p: NetworkPolicy = serde_json::from_slice(&body).unwrap();
        s.policies
            .insert(p.metadata.name.clone().unwrap(), p.clone());
        return ok(StatusCode::CREATED, &p);
    }
    if path == policies && method == "GET" {
        let items = s
            .policies
            .values()
            .map(|p| serde_json::to_value(p).unwrap())
            .collect();
        return ok(StatusCode::OK, &list("NetworkPolicyList", items));
    }
    if let Some(name) = path.strip_prefix(&format!("{policies}/")) {
        return match s.policies.get(name) {
            Some(p) => ok(StatusCode::OK, p),
            None => status(404, "NotFound"),
        };
    }
    status(404, "NotFound")
}

/// A client whose every request the in-memory server answers.
fn mock_cluster(server: &Shared) -> Cluster {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = server.clone();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            send.send_response(answer(server.clone(), req).await);
        }
    });
    Cluster::new(Client::new(service, NS), NS)
}

fn ended(pod: &Pod, phase: &str, reason: Option<&str>, exit: Option<(i32, &str)>) -> Pod {
    let mut p = pod.clone();
    p.status = Some(PodStatus {
        phase: Some(phase.into()),
        reason: reason.map(str::to_owned),
        message: reason.map(|r| format!("the node said {r}")),
        container_statuses: exit.map(|(code, why)| {
            vec![ContainerStatus {
                name: "agent".into(),
                state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: code,
                        reason: Some(why.into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]
        }),
        ..Default::default()
    });
    p
}

#[tokio::test]
async fn mock_api_create_attests_and_a_watch_sees_the_exit() {
    let server = Shared::default();
    let cluster = mock_cluster(&server);
    let created = cluster.create(&plan("r1")).await.unwrap();
    assert!(created.attestation.passed(), "{:?}", created.attestation);
    assert_eq!(created.name, pod_name("r1"));
    // The policy was missing: nightshift made it.
    assert!(server.lock().unwrap().policies.contains_key(POLICY_NAME));
    let pod = server.lock().unwrap().pods[&pod_name("r1")].clone();
    // The first watch ends without news (the server ended it); the second
    // carries the exit.
    server.lock().unwrap().watches.push_back(vec![]);
    server.lock().unwrap().watches.push_back(vec![
        ("MODIFIED".into(), ended(&pod, "Running", None, None)),
        (
            "MODIFIED".into(),
            ended(&pod, "Failed", None, Some((3, "Error"))),
        ),
    ]);
    let waited = cluster.wait("r1", Duration::from_secs(30)).await.unwrap();
    assert_eq!(waited, Waited::Ended(Ending::Exited(3)));
    let watches = server
        .lock()
        .unwrap()
        .log
        .iter()
        .filter(|l| l.contains("watch=true"))
        .count();
    assert_eq!(watches, 2, "{:?}", server.lock().unwrap().log);
    cluster.remove("r1").await.unwrap();
    assert!(server.lock().unwrap().pods.is_empty());
    // Removing what is already gone is not an error.
    cluster.remove("r1").await.unwrap();
}

#[tokio::test]
async fn mock_api_deadline_eviction_and_oom_end_the_run_by_name() {
    for (phase, reason, exit, want) in [
        ("Failed", Some("DeadlineExceeded"), None, Ending::Deadline),
        (
            "Failed",
            Some("Evicted"),
            None,
            Ending::Evicted("the node said Evicted".into()),
        ),
        (
            "Failed",
            None,
            Some((137, "OOMKilled")),
            Ending::OutOfMemory,
        ),
        ("Succeeded", None, Some((0, "Completed")), Ending::Exited(0)),
    ] {
        let server = Shared::default();
        let cluster = mock_cluster(&server);
        cluster.create(&plan("r2")).await.unwrap();
        let pod = server.lock().unwrap().pods[&pod_name("r2")].clone();
        server
            .lock()
            .unwrap()
            .watches
            .push_back(vec![("MODIFIED".into(), ended(&pod, phase, reason, exit))]);
        let waited = cluster.wait("r2", Duration::from_secs(30)).await.unwrap();
        assert_eq!(waited, Waited::Ended(want));
    }
}

#[tokio::test]
async fn mock_api_a_pod_deleted_by_someone_else_is_reported_deleted() {
    let server = Shared::default();
    let cluster = mock_cluster(&server);
    cluster.create(&plan("r3")).await.unwrap();
    let pod = server.lock().unwrap().pods[&pod_name("r3")].clone();
    server
        .lock()
        .unwrap()
        .watches
        .push_back(vec![("DELETED".into(), pod)]);
    assert_eq!(
        cluster.wait("r3", Duration::from_secs(30)).await.unwrap(),
        Waited::Deleted
    );
}

#[tokio::test(start_paused = true)]
async fn mock_api_a_pod_that_never_ends_is_deleted_at_the_bound() {
    let server = Shared::default();
    let cluster = mock_cluster(&server);
    cluster.create(&plan("r4")).await.unwrap();
    // Every watch ends at once without news: the controller re-reads
    // forever until its bound.
    let waited = cluster.wait("r4", Duration::from_secs(5)).await.unwrap();
    assert_eq!(waited, Waited::KilledAtBound);
    // Re-read after a pause each time, not in a hot loop: about 25 in 5 s.
    let reads = server
        .lock()
        .unwrap()
        .log
        .iter()
        .filter(|l| l.starts_with("GET") && l.contains("watch=true"))
        .count();
    assert!((10..=30).contains(&reads), "{reads} watches in 5 s");
    assert!(
        server.lock().unwrap().pods.is_empty(),
        "the Pod was not deleted"
    );
}

#[tokio::test]
async fn mock_api_an_admission_that_weakens_the_pod_is_refused_and_deleted() {
    type Mutation = fn(&mut Pod);
    let mutations: [(&str, Mutation); 4] = [
        ("admission-unchanged", |p| {
            // A sidecar injected by a mutating webhook.
            p.spec.as_mut().unwrap().containers.push(Container {
                name: "proxy".into(),
                image: Some("mesh/proxy:1".into()),
                ..Default::default()
            });
        }),
        ("no-service-account-token", |p| {
            p.spec.as_mut().unwrap().automount_service_account_token = None;
        }),
        ("seccomp-profile", |p| {
            let spec = p.spec.as_mut().unwrap();
            spec.security_context.as_mut().unwrap().seccomp_profile = None;
            spec.containers[0]
                .security_context
                .as_mut()
                .unwrap()
                .seccomp_profile = None;
        }),
        ("runtime-default", |p| {
            p.spec.as_mut().unwrap().runtime_class_name = Some("runc-fast".into());
        }),
    ];
    for (property, mutate) in mutations {
        let server = Shared::default();
        server.lock().unwrap().admission = Some(Box::new(mutate));
        let cluster = mock_cluster(&server);
        let err = cluster.create(&plan("r5")).await.unwrap_err();
        let ClusterError::Refused {
            attestation,
            failed,
        } = err
        else {
            panic!("{property}: not refused: {err}");
        };
        let failures: Vec<&str> = attestation.failures().map(|p| p.name).collect();
        assert!(failures.contains(&property), "{property}: {failures:?}");
        assert!(failed.contains(property), "{failed}");
        assert!(
            server.lock().unwrap().pods.is_empty(),
            "{property}: a refused Pod was left"
        );
    }
}

#[tokio::test]
async fn mock_api_a_weakened_policy_is_refused() {
    let server = Shared::default();
    let mut policy = nightshift_engine_kubernetes::sandbox_network_policy(NS);
    // Someone allowed egress to the world.
    policy.spec.as_mut().unwrap().egress = Some(vec![Default::default()]);
    server
        .lock()
        .unwrap()
        .policies
        .insert(POLICY_NAME.into(), policy);
    let cluster = mock_cluster(&server);
    let err = cluster.create(&plan("r6")).await.unwrap_err();
    assert!(matches!(err, ClusterError::PolicyWeakened { .. }), "{err}");
    assert!(server.lock().unwrap().pods.is_empty());
}

#[tokio::test]
async fn mock_api_orphans_of_this_owner_only_are_swept() {
    let server = Shared::default();
    // The server ignores label selectors: the sweep must still never touch
    // another owner's Pods.
    server.lock().unwrap().ignore_selectors = true;
    let cluster = mock_cluster(&server);
    for run in ["live", "dead1", "dead2"] {
        cluster.create(&plan(run)).await.unwrap();
    }
    let mut other = plan("theirs");
    other.owner = "worker-2".into();
    cluster.create(&other).await.unwrap();
    // After a kill -9 the worker knows only its live runs.
    let live = BTreeSet::from(["live".to_owned()]);
    let mut swept = cluster.sweep("worker-1", &live).await.unwrap();
    swept.sort();
    assert_eq!(swept, ["dead1", "dead2"]);
    let left: BTreeSet<String> = server.lock().unwrap().pods.keys().cloned().collect();
    assert_eq!(left, BTreeSet::from([pod_name("live"), pod_name("theirs")]));
    let owners: BTreeSet<String> = server
        .lock()
        .unwrap()
        .pods
        .values()
        .map(|p| p.metadata.labels.as_ref().unwrap()[OWNER_LABEL].clone())
        .collect();
    assert_eq!(owners.len(), 2);
    assert!(server
        .lock()
        .unwrap()
        .pods
        .values()
        .all(|p| p.metadata.labels.as_ref().unwrap()[SANDBOX_LABEL] == "true"));
}
