//! `deploy/kubernetes/` checked against the Kubernetes API's own types
//! (k8s-openapi, API 1.33, the oldest it knows) and against what nightshift
//! demands of a hosted deployment. No cluster runs here (none can be
//! installed on this machine): this proves the manifests are well-formed
//! objects of the API with no unknown or misspelt field, that they ask for
//! least privilege, and that every flag and path they give the binary is one
//! it has; not that a cluster schedules them.
//!
//! The check is a function over the parsed documents, and
//! `the_check_catches_what_it_claims_to` breaks the shipped manifests one way
//! at a time and expects each break to be named: a check that passes
//! everything fails that test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PersistentVolumeClaim, PodSpec, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("deploy")
        .join("kubernetes")
}

/// One YAML document: the file it came from and its value.
#[derive(Debug, Clone)]
struct Doc {
    file: String,
    value: Value,
}

fn read_docs() -> (Vec<Doc>, Value) {
    let mut docs = Vec::new();
    let mut kustomization = Value::Null;
    let mut names: Vec<_> = std::fs::read_dir(dir())
        .expect("deploy/kubernetes")
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    for name in names {
        let text = std::fs::read_to_string(dir().join(&name)).unwrap();
        for de in serde_yaml::Deserializer::from_str(&text) {
            let value = <Value as serde::Deserialize>::deserialize(de)
                .unwrap_or_else(|e| panic!("{name}: not YAML: {e}"));
            if value.is_null() {
                continue;
            }
            if name == "kustomization.yaml" {
                kustomization = value;
            } else {
                docs.push(Doc {
                    file: name.clone(),
                    value,
                });
            }
        }
    }
    (docs, kustomization)
}

/// The first place two values differ, as a path.
fn first_difference(a: &Value, b: &Value, at: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                match y.get(k) {
                    None => return Some(format!("{at}.{k} (not a field of the API type)")),
                    Some(w) => {
                        if let Some(d) = first_difference(v, w, &format!("{at}.{k}")) {
                            return Some(d);
                        }
                    }
                }
            }
            y.keys()
                .find(|k| !x.contains_key(*k))
                .map(|k| format!("{at}.{k} (added by the API type)"))
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (v, w))| first_difference(v, w, &format!("{at}[{i}]"))),
        _ if a == b => None,
        _ => Some(format!("{at}: {a} read back as {b}")),
    }
}

fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(
    v: &Value,
) -> Result<(T, Value), String> {
    let t: T = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&t).map_err(|e| e.to_string())?;
    Ok((t, back))
}

/// The objects, typed.
#[derive(Default, Debug)]
struct Objects {
    namespaces: Vec<Namespace>,
    accounts: Vec<ServiceAccount>,
    deployments: Vec<Deployment>,
    budgets: Vec<PodDisruptionBudget>,
    services: Vec<Service>,
    policies: Vec<NetworkPolicy>,
    claims: Vec<PersistentVolumeClaim>,
    maps: Vec<ConfigMap>,
}

/// Every problem with the manifests, each naming the file and the object.
fn check(docs: &[Doc], kustomization: &Value, binary: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let mut o = Objects::default();
    for d in docs {
        let kind = d.value["kind"].as_str().unwrap_or("?").to_string();
        let api = d.value["apiVersion"].as_str().unwrap_or("?").to_string();
        let name = d.value["metadata"]["name"].as_str().unwrap_or("?");
        let at = format!("{}: {kind} {name}", d.file);
        macro_rules! take {
            ($ty:ty, $into:expr) => {
                match typed::<$ty>(&d.value) {
                    Err(e) => problems.push(format!("{at}: not a {api} {kind}: {e}")),
                    Ok((t, back)) => {
                        if let Some(diff) = first_difference(&d.value, &back, "") {
                            problems.push(format!("{at}: {diff}"));
                        }
                        $into.push(t);
                    }
                }
            };
        }
        match (api.as_str(), kind.as_str()) {
            ("v1", "Namespace") => take!(Namespace, o.namespaces),
            ("v1", "ServiceAccount") => take!(ServiceAccount, o.accounts),
            ("v1", "Service") => take!(Service, o.services),
            ("v1", "PersistentVolumeClaim") => take!(PersistentVolumeClaim, o.claims),
            ("v1", "ConfigMap") => take!(ConfigMap, o.maps),
            ("apps/v1", "Deployment") => take!(Deployment, o.deployments),
            ("policy/v1", "PodDisruptionBudget") => take!(PodDisruptionBudget, o.budgets),
            ("networking.k8s.io/v1", "NetworkPolicy") => take!(NetworkPolicy, o.policies),
            (_, "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding") => problems.push(
                format!("{at}: grants Kubernetes API rights; neither serve nor a worker calls the API"),
            ),
            (_, "Secret") => problems.push(format!(
                "{at}: a Secret with its values in the repository; the operator makes them (docs/hosted.md)"
            )),
            _ => problems.push(format!("{at}: an object this check does not know ({api} {kind})")),
        }
    }

    // Every file is in the kustomization, and nothing else.
    let listed: BTreeSet<String> = kustomization["resources"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let files: BTreeSet<String> = docs.iter().map(|d| d.file.clone()).collect();
    for f in files.symmetric_difference(&listed) {
        problems.push(format!(
            "kustomization.yaml: {f} is {}",
            if listed.contains(f) {
                "listed but not a manifest here"
            } else {
                "a manifest not listed in resources"
            }
        ));
    }

    let ns_level = |ns: &str| -> Option<String> {
        o.namespaces
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(ns))
            .and_then(|n| n.metadata.labels.as_ref())
            .and_then(|l| l.get("pod-security.kubernetes.io/enforce").cloned())
    };
    for a in &o.accounts {
        if a.automount_service_account_token != Some(false) {
            problems.push(format!(
                "ServiceAccount {}: mounts an API token; set automountServiceAccountToken: false",
                a.metadata.name.as_deref().unwrap_or("?")
            ));
        }
    }
    for d in &o.deployments {
        let name = d.metadata.name.clone().unwrap_or_default();
        let ns = d.metadata.namespace.clone().unwrap_or_default();
        let at = format!("Deployment {ns}/{name}");
        if ns_level(&ns).is_none() {
            problems.push(format!(
                "{at}: its namespace is not one of these manifests' (with a Pod Security level)"
            ));
        }
        let Some(spec) = d.spec.as_ref() else {
            problems.push(format!("{at}: no spec"));
            continue;
        };
        let labels = spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone());
        let labels = labels.unwrap_or_default();
        if spec
            .selector
            .match_labels
            .as_ref()
            .is_none_or(|m| !subset(m, &labels))
        {
            problems.push(format!("{at}: its selector does not select its own pods"));
        }
        let Some(pod) = spec.template.spec.as_ref() else {
            problems.push(format!("{at}: no pod spec"));
            continue;
        };
        check_pod(&at, pod, &o, &ns, binary, &mut problems);
        // A disruption budget for it, in its namespace, selecting its pods.
        if !o.budgets.iter().any(|b| {
            b.metadata.namespace.as_deref() == Some(ns.as_str())
                && b.spec
                    .as_ref()
                    .and_then(|s| s.selector.as_ref())
                    .and_then(|s| s.match_labels.as_ref())
                    .is_some_and(|m| subset(m, &labels))
        }) {
            problems.push(format!("{at}: no PodDisruptionBudget selects its pods"));
        }
        let privileged_pod = pod.containers.iter().any(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.privileged)
                .unwrap_or(false)
        });
        let level = ns_level(&ns).unwrap_or_default();
        if name.ends_with("serve") && (privileged_pod || level != "restricted") {
            problems.push(format!(
                "{at}: serve must run unprivileged in a namespace that enforces `restricted` (is `{level}`)"
            ));
        }
        // A privileged namespace holds the workers and nothing else.
        if level == "privileged"
            && o.deployments.iter().any(|e| {
                e.metadata.namespace.as_deref() == Some(ns.as_str())
                    && e.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| !n.ends_with("worker"))
            })
        {
            problems.push(format!(
                "{at}: its privileged namespace holds something but workers"
            ));
        }
    }
    for s in &o.services {
        let sel = s
            .spec
            .as_ref()
            .and_then(|s| s.selector.clone())
            .unwrap_or_default();
        if !o.deployments.iter().any(|d| {
            d.metadata.namespace == s.metadata.namespace
                && d.spec
                    .as_ref()
                    .and_then(|s| s.template.metadata.as_ref())
                    .and_then(|m| m.labels.as_ref())
                    .is_some_and(|l| !sel.is_empty() && subset(&sel, l))
        }) {
            problems.push(format!(
                "Service {}: selects no Deployment's pods",
                s.metadata.name.as_deref().unwrap_or("?")
            ));
        }
    }
    problems
}

fn subset(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> bool {
    a.iter().all(|(k, v)| b.get(k) == Some(v))
}

/// Which flags `nightshift SUB --help` lists.
fn flags_of(binary: &Path, sub: &str) -> BTreeSet<String> {
    let out = Command::new(binary)
        .args([sub, "--help"])
        .output()
        .expect("nightshift --help");
    String::from_utf8_lossy(&out.stdout)
        .split(|c: char| c.is_whitespace() || c == ',' || c == '=')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(String::from)
        .collect()
}

fn check_pod(
    at: &str,
    pod: &PodSpec,
    o: &Objects,
    ns: &str,
    binary: &Path,
    problems: &mut Vec<String>,
) {
    match pod.service_account_name.as_deref() {
        Some(sa)
            if o.accounts.iter().any(|a| {
                a.metadata.name.as_deref() == Some(sa)
                    && a.metadata.namespace.as_deref() == Some(ns)
            }) => {}
        other => problems.push(format!(
            "{at}: its ServiceAccount {other:?} is not one of these manifests' in {ns}"
        )),
    }
    if pod.automount_service_account_token != Some(false) {
        problems.push(format!("{at}: the pod mounts an API token"));
    }
    let volumes = pod.volumes.clone().unwrap_or_default();
    let secret_mounts: BTreeSet<String> = volumes
        .iter()
        .filter(|v| v.secret.is_some())
        .map(|v| v.name.clone())
        .collect();
    for v in &volumes {
        if let Some(s) = &v.secret {
            // 0400; the kubelet adds group read when the pod has an fsGroup.
            if s.default_mode != Some(0o400) {
                problems.push(format!(
                    "{at}: secret volume {} has mode {:?}, not 0400 (256)",
                    v.name,
                    s.default_mode.map(|m| format!("{m:o}"))
                ));
            }
        }
    }
    let unprivileged = !at.ends_with("worker");
    if unprivileged {
        let psc = pod.security_context.clone().unwrap_or_default();
        if psc.run_as_non_root != Some(true) {
            problems.push(format!("{at}: runAsNonRoot is not set"));
        }
        if psc.seccomp_profile.as_ref().map(|p| p.type_.as_str()) != Some("RuntimeDefault") {
            problems.push(format!(
                "{at}: the pod's seccomp profile is not RuntimeDefault"
            ));
        }
        if volumes.iter().any(|v| v.host_path.is_some()) {
            problems.push(format!("{at}: an unprivileged pod mounts a host path"));
        }
        if pod.host_network == Some(true)
            || pod.host_pid == Some(true)
            || pod.host_ipc == Some(true)
        {
            problems.push(format!("{at}: shares a host namespace"));
        }
    }
    for c in &pod.containers {
        let cat = format!("{at} container {}", c.name);
        check_container(&cat, c, unprivileged, &secret_mounts, binary, problems);
    }
}

fn check_container(
    at: &str,
    c: &Container,
    unprivileged: bool,
    secret_volumes: &BTreeSet<String>,
    binary: &Path,
    problems: &mut Vec<String>,
) {
    if c.image.as_deref() != Some("nightshift-service") {
        problems.push(format!(
            "{at}: image {:?}, not nightshift-service (kustomization.yaml sets the reference)",
            c.image
        ));
    }
    let res = c.resources.clone().unwrap_or_default();
    let has =
        |m: &Option<BTreeMap<String, _>>, k: &str| m.as_ref().is_some_and(|m| m.contains_key(k));
    for k in ["cpu", "memory"] {
        if !has(&res.requests, k) || !has(&res.limits, k) {
            problems.push(format!("{at}: no {k} request and limit"));
        }
    }
    if c.liveness_probe.is_none() {
        problems.push(format!("{at}: no liveness probe"));
    }
    let sc = c.security_context.clone().unwrap_or_default();
    if unprivileged {
        if c.readiness_probe.is_none() {
            problems.push(format!("{at}: no readiness probe"));
        }
        if sc.allow_privilege_escalation != Some(false) {
            problems.push(format!("{at}: allowPrivilegeEscalation is not false"));
        }
        if sc.privileged == Some(true) {
            problems.push(format!("{at}: privileged"));
        }
        if sc.read_only_root_filesystem != Some(true) {
            problems.push(format!("{at}: its root filesystem is writable"));
        }
        let caps = sc.capabilities.clone().unwrap_or_default();
        if caps.drop.as_deref() != Some(&["ALL".to_string()][..]) || caps.add.is_some() {
            problems.push(format!(
                "{at}: does not drop every capability (or adds some)"
            ));
        }
    }
    // Secrets only as files (hosted mode checks their owner and mode), never
    // in the environment.
    let env = c.env.clone().unwrap_or_default();
    for e in &env {
        if e.value_from
            .as_ref()
            .is_some_and(|v| v.secret_key_ref.is_some())
        {
            problems.push(format!(
                "{at}: {} comes from a Secret through the environment",
                e.name
            ));
        }
    }
    let mounts = c.volume_mounts.clone().unwrap_or_default();
    let secret_dirs: Vec<&str> = mounts
        .iter()
        .filter(|m| secret_volumes.contains(&m.name))
        .map(|m| m.mount_path.as_str())
        .collect();
    let env_of = |k: &str| {
        env.iter()
            .find(|e| e.name == k)
            .and_then(|e| e.value.clone())
    };
    match env_of("NIGHTSHIFT_STORE_FILE") {
        Some(f) if secret_dirs.iter().any(|d| f.starts_with(&format!("{d}/"))) => {}
        other => problems.push(format!(
            "{at}: NIGHTSHIFT_STORE_FILE {other:?} is not a file of a mounted Secret"
        )),
    }
    let args = c.args.clone().unwrap_or_default();
    let Some(sub) = args.first() else {
        problems.push(format!("{at}: no nightshift command in args"));
        return;
    };
    let known = flags_of(binary, sub);
    if known.is_empty() {
        problems.push(format!("{at}: `nightshift {sub}` is not a command"));
    }
    for a in args.iter().filter(|a| a.starts_with("--")) {
        if !known.contains(a.as_str()) {
            problems.push(format!("{at}: `nightshift {sub}` has no flag {a}"));
        }
    }
    // Files the command is given live on a mounted Secret.
    for w in args.windows(2) {
        if matches!(w[0].as_str(), "--tls-cert" | "--tls-key")
            && !secret_dirs
                .iter()
                .any(|d| w[1].starts_with(&format!("{d}/")))
        {
            problems.push(format!(
                "{at}: {} {} is not on a mounted Secret",
                w[0], w[1]
            ));
        }
    }
    // A worker's state is the same path on the node and in the container
    // (the node's engine mounts worktrees and doors by it), and its
    // liveness probe reads the dispatcher's alive file in it.
    if sub == "worker" {
        let state = env_of("NIGHTSHIFT_STATE_DIR").unwrap_or_default();
        let mounted_same = mounts.iter().any(|m| m.mount_path == state);
        if state.is_empty() || !mounted_same {
            problems.push(format!(
                "{at}: NIGHTSHIFT_STATE_DIR {state:?} is not a mounted host path"
            ));
        }
        let probe = c
            .liveness_probe
            .as_ref()
            .and_then(|p| p.exec.as_ref())
            .and_then(|e| e.command.clone())
            .unwrap_or_default()
            .join(" ");
        let alive = format!("{state}/{}", orchestrator::run_queue::ALIVE_FILE);
        if !probe.contains(&alive) {
            problems.push(format!("{at}: its liveness probe does not read {alive}"));
        }
    }
}

#[test]
fn the_manifests_are_api_objects_asking_for_least_privilege() {
    let (docs, kustomization) = read_docs();
    assert!(
        docs.len() >= 10,
        "deploy/kubernetes holds {} objects",
        docs.len()
    );
    let problems = check(&docs, &kustomization, &tests::nightshift_bin());
    assert!(
        problems.is_empty(),
        "deploy/kubernetes:\n{}",
        problems.join("\n")
    );
}

/// Each break of the shipped manifests, and words its problem must contain.
#[test]
fn the_check_catches_what_it_claims_to() {
    let (docs, kustomization) = read_docs();
    let bin = tests::nightshift_bin();
    type Break = fn(&mut Value);
    let deployment = |docs: &mut [Doc], name: &str| -> usize {
        docs.iter()
            .position(|d| d.value["kind"] == "Deployment" && d.value["metadata"]["name"] == name)
            .unwrap()
    };
    let breaks: Vec<(&str, &str, Break, &str)> = vec![
        (
            "nightshift-serve",
            "a misspelt field",
            |v| {
                v["spec"]["template"]["spec"]["containers"][0]["securityContext"]
                    ["readOnlyRootFileSystem"] = true.into();
            },
            "not a field of the API type",
        ),
        (
            "nightshift-serve",
            "a wrongly typed field",
            |v| {
                v["spec"]["replicas"] = "one".into();
            },
            "not a apps/v1 Deployment",
        ),
        (
            "nightshift-serve",
            "privileged serve",
            |v| {
                v["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] =
                    true.into();
            },
            "privileged",
        ),
        (
            "nightshift-serve",
            "a capability kept",
            |v| {
                v["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]
                    ["add"] = serde_json::json!(["NET_ADMIN"]);
            },
            "capabilit",
        ),
        (
            "nightshift-serve",
            "a token mounted",
            |v| {
                v["spec"]["template"]["spec"]["automountServiceAccountToken"] = true.into();
            },
            "API token",
        ),
        (
            "nightshift-serve",
            "a secret in the environment",
            |v| {
                v["spec"]["template"]["spec"]["containers"][0]["env"][0] = serde_json::json!({
                    "name": "NIGHTSHIFT_STORE",
                    "valueFrom": {"secretKeyRef": {"name": "nightshift-serve", "key": "store-url"}}
                });
            },
            "through the environment",
        ),
        (
            "nightshift-serve",
            "an open secret mode",
            |v| {
                v["spec"]["template"]["spec"]["volumes"][0]["secret"]["defaultMode"] = 0o644.into();
            },
            "not 0400",
        ),
        (
            "nightshift-serve",
            "a flag the binary lacks",
            |v| {
                v["spec"]["template"]["spec"]["containers"][0]["args"][1] = "--listen".into();
            },
            "has no flag --listen",
        ),
        (
            "nightshift-serve",
            "no memory limit",
            |v| {
                v["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
                    .as_object_mut()
                    .unwrap()
                    .remove("memory");
            },
            "no memory request and limit",
        ),
        (
            "nightshift-serve",
            "no readiness probe",
            |v| {
                v["spec"]["template"]["spec"]["containers"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("readinessProbe");
            },
            "no readiness probe",
        ),
        (
            "nightshift-worker",
            "a probe of another file",
            |v| {
                v["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["exec"]
                    ["command"][2] = "true".into();
            },
            "liveness probe does not read",
        ),
        (
            "nightshift-worker",
            "state at another path in the container",
            |v| {
                v["spec"]["template"]["spec"]["containers"][0]["env"][1]["value"] =
                    "/var/lib/elsewhere".into();
            },
            "NIGHTSHIFT_STATE_DIR",
        ),
        (
            "nightshift-worker",
            "pods its budget does not select",
            |v| {
                v["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] =
                    "other".into();
            },
            "selector does not select",
        ),
    ];
    for (name, what, f, words) in breaks {
        let mut broken = docs.clone();
        let i = deployment(&mut broken, name);
        f(&mut broken[i].value);
        let problems = check(&broken, &kustomization, &bin);
        assert!(
            problems.iter().any(|p| p.contains(words)),
            "{what} in {name} was not caught (wanted {words:?}): {problems:#?}"
        );
    }
    // An RBAC grant, and a file the kustomization does not list.
    let mut broken = docs.clone();
    broken.push(Doc {
        file: "rbac.yaml".into(),
        value: serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "r", "namespace": "nightshift"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}]}),
    });
    let problems = check(&broken, &kustomization, &bin);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("grants Kubernetes API rights")),
        "{problems:#?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("rbac.yaml is a manifest not listed")),
        "{problems:#?}"
    );
}

/// What the worker's liveness probe reads is real: a running worker
/// touches its alive file again and again, and a stopped one does not.
#[test]
fn a_running_worker_keeps_touching_the_file_its_probe_reads() {
    let state = tests::State::new();
    let alive = state.path().join(orchestrator::run_queue::ALIVE_FILE);
    let mut worker = state
        .cmd()
        .args(["worker", "--max-parallel", "1", "--task-lease-secs", "3"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting a worker");
    let mtime = || std::fs::metadata(&alive).and_then(|m| m.modified()).ok();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while mtime().is_none() && std::time::Instant::now() < deadline {
        if let Some(status) = worker.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(worker.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!(
                "the worker ended ({status}) before touching {}: {err}",
                alive.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let first = mtime().unwrap_or_else(|| panic!("{} never appeared", alive.display()));
    // Touched at most once a second: wait until it moves on.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while mtime() == Some(first) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let second = mtime().unwrap();
    assert!(
        second > first,
        "the worker touched {} once and never again",
        alive.display()
    );
    worker.kill().unwrap();
    worker.wait().unwrap();
    let dead = mtime().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert_eq!(mtime(), Some(dead), "a killed worker's file moved on");
}
