//! The Pod spec nightshift generates (`nightshift kube pod`), run for real
//! with `podman kube play`, passes the sandbox probes a Docker run passes
//! (`tests/src/probes.rs`). No Kubernetes cluster can run here; Podman
//! plays the Pod on this machine. Runs in test.sh's "tests on Podman" phase
//! (`NIGHTSHIFT_TEST_ENGINE=podman`, the image in Podman's store).
//!
//! Where `kube play` is not a kubelet, the test says so and stands in:
//! - Podman does not enforce NetworkPolicies: `--network none` stands for
//!   the deny-all policy the manifest carries (on a cluster the attestation
//!   requires the policy: `orchestrator/attest/src/pod.rs`).
//! - Podman 4.3 ignores `securityContext.seccompProfile` and reads the older
//!   annotation: the test adds `seccomp.security.alpha.kubernetes.io/pod`
//!   naming the same `Localhost` profile, from `nightshift kube
//!   seccomp-profile`, under `--seccomp-profile-root`.
//! - Podman makes an `emptyDir` a directory on disk copied up from the
//!   image's (its owner, no size, no tmpfs, no `fsGroup`), where a kubelet
//!   makes a world-writable one: the workspace write probe is the one probe
//!   not asserted, and the test checks it is Podman's doing (the directory
//!   is not the sandbox user's).
//! - Podman's default ulimits exceed this host's hard limits: a
//!   `containers.conf` of the test's own lowers them.
//! - Podman 4.3 refuses a manifest holding a string that begins with a line
//!   break ("unable to sort kube kinds", in JSON or YAML form alike): the
//!   probe script is handed over with its leading blank line trimmed.

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};
use tests::probes::{
    assert_no_way_out, assert_profile_holds, get, probe_script, probes, REFUSED_CALLS, SECRET,
    SYSCALL_PROBES,
};
use tests::{image, nightshift_bin, on_podman, stderr, stdout};

fn podman(conf: &Path, args: &[&str]) -> std::process::Output {
    Command::new("podman")
        .env("CONTAINERS_CONF", conf)
        .args(args)
        .output()
        .expect("running podman")
}

/// One play at a time: Podman 4.3's `kube play` of two Pods at once was
/// seen to fail one of them (its pause image and pod bookkeeping).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Plays the documents under Podman and returns the agent container's output.
fn play(dir: &Path, name: &str, docs: &[Value]) -> String {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let conf = dir.join("containers.conf");
    std::fs::write(
        &conf,
        "[containers]\ndefault_ulimits = [\"nofile=1024:1024\", \"nproc=4096:4096\"]\n",
    )
    .unwrap();
    let file = dir.join(format!("{name}.yaml"));
    let text: Vec<String> = docs
        .iter()
        .map(|d| serde_json::to_string_pretty(d).unwrap())
        .collect();
    std::fs::write(&file, format!("---\n{}\n", text.join("\n---\n"))).unwrap();
    let file = file.to_str().unwrap();
    let root = dir.join("seccomp");
    let played = podman(
        &conf,
        &[
            "kube",
            "play",
            "--network",
            "none",
            "--seccomp-profile-root",
            root.to_str().unwrap(),
            file,
        ],
    );
    let container = format!("ns-run-{name}-agent");
    let waited = podman(&conf, &["wait", &container]);
    let logs = podman(&conf, &["logs", &container]);
    let down = podman(&conf, &["kube", "down", file]);
    assert!(played.status.success(), "kube play: {}", stderr(&played));
    assert!(waited.status.success(), "wait: {}", stderr(&waited));
    assert!(down.status.success(), "kube down: {}", stderr(&down));
    format!("{}{}", stdout(&logs), stderr(&logs))
}

/// `nightshift kube pod` for a run of the test image, as its documents,
/// with the seccomp annotation Podman reads added to the Pod's metadata.
fn pod_docs(run: &str, script: &str) -> Vec<Value> {
    pod_docs_as(run, script, &[])
}

/// [`pod_docs`], with `extra` flags for `kube pod`.
fn pod_docs_as(run: &str, script: &str, extra: &[&str]) -> Vec<Value> {
    let out = Command::new(nightshift_bin())
        .args(["kube", "pod"])
        .args(extra)
        .args([
            "--run-id",
            run,
            "--image",
            &image(),
            "--image-pull-policy",
            "Never",
            "--memory",
            "536870912",
            "--env",
            "HOME=/home/agent",
            "--",
            "bash",
            "-c",
            script.trim_start(),
        ])
        .env("NIGHTSHIFT_SENTINEL", SECRET)
        .output()
        .unwrap();
    assert!(out.status.success(), "kube pod: {}", stderr(&out));
    let mut docs: Vec<Value> = stdout(&out)
        .split("---\n")
        .filter(|d| !d.trim().is_empty())
        .map(|d| serde_json::from_str(d).expect("a JSON document"))
        .collect();
    if let Some(sandbox) = docs.iter_mut().find(|d| d["kind"] == "Sandbox") {
        // The agent-sandbox controller's part, done here: its template
        // made the Pod.
        let template = sandbox["spec"]["podTemplate"].clone();
        *sandbox = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": sandbox["metadata"]["name"],
                "namespace": sandbox["metadata"]["namespace"],
                "labels": template["metadata"]["labels"],
            },
            "spec": template["spec"],
        });
    }
    let pod = docs.iter_mut().find(|d| d["kind"] == "Pod").expect("a Pod");
    assert_eq!(
        pod["spec"]["securityContext"]["seccompProfile"]["localhostProfile"],
        "nightshift-sandbox.json"
    );
    // Podman's stand-in for the field it ignores (see the note above).
    pod["metadata"]["annotations"] = json!({
        "seccomp.security.alpha.kubernetes.io/pod": "localhost/nightshift-sandbox.json"
    });
    docs
}

fn seccomp_root(dir: &Path) {
    let out = Command::new(nightshift_bin())
        .args(["kube", "seccomp-profile"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::create_dir_all(dir.join("seccomp")).unwrap();
    std::fs::write(dir.join("seccomp/nightshift-sandbox.json"), out.stdout).unwrap();
}

#[test]
fn the_generated_pod_passes_the_sandbox_probes_under_podman_kube_play() {
    if !on_podman() {
        eprintln!("runs in test.sh's Podman phase (NIGHTSHIFT_TEST_ENGINE=podman)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    seccomp_root(dir.path());
    let run = format!("kp{}", std::process::id());
    let script = format!(
        "{}{}\necho workspace-owner=$(stat -c %u /workspace)\n",
        probe_script(9),
        SYSCALL_PROBES
    );
    let log = play(dir.path(), &run, &pod_docs(&run, &script));
    let p = probes(&log);
    // Tier 0 as the agent experiences it, as on Docker, under nightshift's
    // own seccomp profile (not Podman's default).
    assert_eq!(get(&p, "interfaces"), "lo", "{log}");
    assert_no_way_out(&p, &log);
    assert_profile_holds(&p, &log);
    // The one probe not asserted: Podman's emptyDir is the image's
    // directory copied up (its owner, the image's user), not the sandbox's.
    assert_ne!(get(&p, "workspace-owner"), "2000000000", "{log}");
    assert_eq!(get(&p, "write-/workspace/probe"), "denied", "{log}");
}

/// The agent-sandbox `Sandbox` resource (`kube pod --as-sandbox-resource`)
/// carries the same Pod as its template: the Pod its controller would make
/// from it is the generated Pod, and passes the same probes when played.
/// (No agent-sandbox controller runs here: the template is made a Pod by
/// the test, as that controller would.)
#[test]
fn the_sandbox_resources_template_is_the_probed_pod() {
    let run = format!("ks{}", std::process::id());
    let script = format!("{}{}\n", probe_script(9), SYSCALL_PROBES);
    let as_pod = pod_docs(&run, &script);
    let from_template = pod_docs_as(&run, &script, &["--as-sandbox-resource"]);
    assert_eq!(as_pod, from_template);
    if !on_podman() {
        eprintln!("played in test.sh's Podman phase (NIGHTSHIFT_TEST_ENGINE=podman)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    seccomp_root(dir.path());
    let log = play(dir.path(), &run, &from_template);
    let p = probes(&log);
    assert_eq!(get(&p, "interfaces"), "lo", "{log}");
    assert_no_way_out(&p, &log);
    assert_profile_holds(&p, &log);
}

/// The probes can fail: the same spec as root with a writable root file
/// system and the runtime's default seccomp profile shows the write, the
/// uid and the calls nightshift refuses.
#[test]
fn the_probes_see_a_weakened_pod_under_podman_kube_play() {
    if !on_podman() {
        eprintln!("runs in test.sh's Podman phase (NIGHTSHIFT_TEST_ENGINE=podman)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    seccomp_root(dir.path());
    let run = format!("kw{}", std::process::id());
    let script = format!("{}{}", probe_script(9), SYSCALL_PROBES);
    let mut docs = pod_docs(&run, &script);
    let pod = docs.iter_mut().find(|d| d["kind"] == "Pod").unwrap();
    for path in [
        "/spec/securityContext",
        "/spec/containers/0/securityContext",
    ] {
        let ctx = pod.pointer_mut(path).unwrap();
        ctx["runAsNonRoot"] = json!(false);
        ctx["runAsUser"] = json!(0);
    }
    pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = json!(false);
    pod["metadata"]["annotations"] =
        json!({"seccomp.security.alpha.kubernetes.io/pod": "runtime/default"});
    let log = play(dir.path(), &run, &docs);
    let p = probes(&log);
    assert_eq!(get(&p, "uid"), "0", "{log}");
    assert_eq!(get(&p, "write-/etc/probe"), "ok", "{log}");
    let allowed: Vec<&str> = REFUSED_CALLS
        .into_iter()
        .filter(|c| get(&p, c) != "errno1")
        .collect();
    assert!(
        !allowed.is_empty(),
        "the runtime's default refused every call nightshift's profile refuses: {log}"
    );
}

/// `--engine kubernetes` refuses a run, saying what is missing, and starts
/// nothing (runs on a cluster are not carried out yet: docs/kubernetes.md).
#[test]
fn the_kubernetes_engine_refuses_a_run_and_says_why() {
    let state = tests::State::new();
    let repo = tests::make_repo();
    let out = state.run(&[
        "--engine",
        "kubernetes",
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--",
        "true",
    ]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("runs on Kubernetes are not carried out yet"),
        "{err}"
    );
    assert!(err.contains("docs/kubernetes.md"), "{err}");
    assert!(state.runs().is_empty(), "{:?}", state.runs());
}

/// `nightshift kube attest` judges a Pod as a cluster returns it against
/// the Pod the same arguments make: the manifest's own Pod passes every
/// property, one an admission changed fails by name with exit 6, and a
/// document that is not a Pod is bad input (exit 3).
#[test]
fn kube_attest_judges_a_returned_pod_by_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    let plan = ["--run-id", "ka1", "--image", "img:1", "--", "true"];
    let out = Command::new(nightshift_bin())
        .args(["kube", "pod"])
        .args(plan)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let docs: Vec<Value> = stdout(&out)
        .split("---\n")
        .filter(|d| !d.trim().is_empty())
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let mut pod = docs.iter().find(|d| d["kind"] == "Pod").unwrap().clone();
    let policy = docs.iter().find(|d| d["kind"] == "NetworkPolicy").unwrap();
    let policies = dir.path().join("policies.json");
    std::fs::write(&policies, json!({"items": [policy]}).to_string()).unwrap();
    let attest = |pod: &Value| {
        let file = dir.path().join("pod.json");
        std::fs::write(&file, pod.to_string()).unwrap();
        Command::new(nightshift_bin())
            .args(["kube", "attest", "--observed"])
            .arg(&file)
            .arg("--policies")
            .arg(&policies)
            .args(plan)
            .output()
            .unwrap()
    };
    let out = attest(&pod);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(
        stdout(&out)
            .lines()
            .filter(|l| l.starts_with("ok "))
            .count(),
        21
    );
    pod["spec"]["hostPID"] = json!(true);
    let out = attest(&pod);
    assert_eq!(out.status.code(), Some(6), "{}", stdout(&out));
    let text = stdout(&out);
    let failed: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("FAILED"))
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(failed, ["private-namespaces"]);
    let out = attest(&json!("not a pod"));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not a Pod document"),
        "{}",
        stderr(&out)
    );
}
