//! Attestation of inspect documents recorded from rootful Podman 4.3.1's
//! Docker-compatible API (`tests/fixtures/podman/*.json`, recorded by
//! `ENGINE=podman tests/fixtures/record.py`), read by the Podman adapter
//! function: the same requests as the Docker fixtures, as the Podman engine
//! adapter sends them, and the same per-property breakages.

use std::collections::{BTreeMap, BTreeSet};

use orchestrator_attest::{
    attest, mount_of, parse_podman_inspect, seccomp_profile_digest, Attestation, EngineKind,
    Expectations, HostAccounts, HostObserved, MountExpectation,
};
use serde_json::Value;

const WORKTREE: &str = "/srv/nightshift/worktrees/fixture";
const DOOR: &str = "/srv/nightshift/doors/fixture";

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/podman/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    serde_json::from_str(&text).expect("fixture is json")
}

fn profile_digest() -> String {
    let path = format!("{}/../core/src/seccomp.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    seccomp_profile_digest(&text).expect("the profile is json")
}

fn host() -> HostObserved {
    let path = format!(
        "{}/tests/fixtures/mountinfo-protected.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    let info = std::fs::read_to_string(&path).unwrap();
    HostObserved {
        accounts: HostAccounts::parse(
            "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000:Alice,,,:/home/alice:/bin/bash\n",
            "root:x:0:\nalice:x:1000:\n",
            "alice:100000:65536\n",
            "alice:100000:65536\n",
        ),
        worktree_mount: mount_of(&info, WORKTREE),
    }
}

/// The Docker fixtures' expectations, with the two tmpfs Podman mounts on
/// a read-only root (`/run`, `/var/tmp`), sized by the adapter.
fn expectations() -> Expectations {
    Expectations {
        run_id: "fixture".into(),
        worktree_host_path: WORKTREE.into(),
        workspace_target: "/workspace".into(),
        door: None,
        allowed_env: BTreeMap::from([
            ("HOME".into(), "/home/agent".into()),
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
            ("NIGHTSHIFT_RUN_ID".into(), "fixture".into()),
        ]),
        image_env: vec![],
        max_memory_bytes: 536_870_912,
        max_pids: 256,
        max_nproc: 16384,
        allowed_tmpfs: BTreeSet::from([
            "/tmp".into(),
            "/home/agent".into(),
            "/run".into(),
            "/var/tmp".into(),
        ]),
        seccomp_profile_digest: profile_digest(),
        max_shm_bytes: 8_388_608,
        max_file_bytes: 1_073_741_824,
        main_process: None,
        setup_cache: None,
        runtime: None,
    }
}

fn verdict_with(doc: &Value, expect: &Expectations) -> Attestation {
    attest(
        &parse_podman_inspect(doc).expect("document parses"),
        &host(),
        expect,
    )
}

fn verdict(doc: &Value) -> Attestation {
    verdict_with(doc, &expectations())
}

fn failed(att: &Attestation) -> BTreeSet<&'static str> {
    att.failures().map(|p| p.name).collect()
}

/// What Podman 4.3.1's compatible API does not apply or does not report,
/// whatever nightshift asks: the host's cgroup namespace (`CgroupnsMode`
/// is not applied: `CgroupMode: host`, the container's cgroup namespace is
/// the host's), and no masked paths reported (`MaskedPaths: null`: the
/// `mask=` option is applied but never shown, so it cannot be attested).
const PODMAN_FAILS: [&str; 2] = ["private-namespaces", "proc-masked"];

#[test]
fn podman_hardened_fixture_fails_only_what_podman_does_not_apply_or_report() {
    let att = verdict(&fixture("hardened"));
    let want: BTreeSet<&str> = PODMAN_FAILS.into_iter().collect();
    assert_eq!(
        failed(&att),
        want,
        "{:#?}",
        att.failures().collect::<Vec<_>>()
    );
    let ns = att.property("private-namespaces").unwrap();
    assert!(ns.observed.contains("cgroupns=host"), "{}", ns.observed);
    // Fail closed, and a refusal names both.
    let refusal = att.ensure_passed().unwrap_err().to_string();
    assert!(refusal.contains("private-namespaces") && refusal.contains("proc-masked"));
}

#[test]
fn the_attestation_names_engine_and_runtime() {
    let att = verdict(&fixture("hardened"));
    assert_eq!(att.engine, Some(EngineKind::Podman));
    assert_eq!(att.runtime.as_deref(), Some("runc"));
    let value = serde_json::to_value(&att).unwrap();
    assert_eq!(value["engine"], "podman");
    assert_eq!(value["runtime"], "runc");
}

#[test]
fn podman_reporting_differences_are_read_from_libpod() {
    let doc = fixture("hardened");
    // The compatible document says `oci` and lists a drop of Podman's own
    // default set, never ALL; the libpod document says runc and empty sets.
    assert_eq!(doc["HostConfig"]["Runtime"], "oci");
    assert!(!doc["HostConfig"]["CapDrop"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c == "ALL"));
    let att = verdict(&doc);
    assert!(att.property("capabilities-dropped").unwrap().ok);
    assert!(att.property("runtime-default").unwrap().ok);
    assert!(att.property("seccomp-profile").unwrap().ok);
    assert!(att.property("ulimits-bounded").unwrap().ok);
    assert!(att.property("env-allowlisted").unwrap().ok);

    // Without the libpod document the runtime and capabilities are not
    // known: `oci` is no runtime name nightshift accepts.
    let mut bare = doc.clone();
    bare.as_object_mut().unwrap().remove("Libpod");
    bare["HostConfig"]["CapDrop"] = serde_json::json!(["CHOWN"]);
    let att = verdict(&bare);
    assert!(!att.property("runtime-default").unwrap().ok);
    // Without the profile's text the digest is unreadable.
    let mut unread = doc.clone();
    unread["SeccompFiles"] = serde_json::json!({});
    let att = verdict(&unread);
    let p = att.property("seccomp-profile").unwrap();
    assert!(!p.ok && p.observed.contains("unreadable"), "{}", p.observed);
}

/// Each recorded breakage fails its property (beyond what Podman always
/// fails), as on Docker.
#[test]
fn each_recorded_podman_breakage_fails_its_property() {
    let cases: [(&str, &[&str]); 14] = [
        ("network-bridge", &["network-none"]),
        ("cap-add-net-admin", &["capabilities-dropped"]),
        (
            "privileged",
            &["not-privileged", "capabilities-dropped", "seccomp-profile"],
        ),
        ("docker-socket", &["mounts-only-worktree"]),
        ("user-root", &["non-root-user"]),
        ("user-host-account", &["user-no-host-account"]),
        ("writable-root", &["read-only-root"]),
        ("env-secret", &["env-allowlisted"]),
        // Podman reports a tmpfs `--mount` among its tmpfs, not its mounts.
        ("mount-tmpfs", &["tmpfs-only-allowed"]),
        // Podman keeps the last seccomp option only: no profile is left.
        (
            "seccomp-unconfined",
            &["seccomp-confined", "seccomp-profile"],
        ),
        ("seccomp-default", &["seccomp-profile"]),
        ("seccomp-other", &["seccomp-profile"]),
        ("shm-default", &["shm-bounded"]),
        ("ulimits-default", &["ulimits-bounded"]),
    ];
    for (name, names) in cases {
        let att = verdict(&fixture(name));
        let got = failed(&att);
        for want in names {
            assert!(got.contains(want), "{name}: {want} passed: {got:?}");
        }
        let extra: Vec<&&str> = got
            .iter()
            .filter(|n| !names.contains(n) && !PODMAN_FAILS.contains(n))
            .collect();
        assert!(extra.is_empty(), "{name}: also failed {extra:?}");
    }
    // The door passes only when expected.
    let door = fixture("with-door");
    assert!(failed(&verdict(&door)).contains("mounts-only-worktree"));
    let expect = Expectations {
        door: Some(MountExpectation {
            host_path: DOOR.into(),
            target: "/run/nightshift".into(),
        }),
        ..expectations()
    };
    let got = failed(&verdict_with(&door, &expect));
    assert!(!got.contains("mounts-only-worktree"), "{got:?}");
}

/// An unsized `/run` (Podman's own on a read-only root, as it mounts it
/// unless the adapter sizes it) fails `tmpfs-only-allowed`.
#[test]
fn an_unsized_podman_run_tmpfs_fails() {
    let mut doc = fixture("hardened");
    doc["HostConfig"]["Tmpfs"]["/run"] = "rw,rprivate,nosuid,nodev,tmpcopyup".into();
    assert!(failed(&verdict(&doc)).contains("tmpfs-only-allowed"));
}

/// What nightshift's own sandbox on Podman looks like: the combined
/// document the Podman engine adapter handed the attestation for a real run
/// (`nightshift --engine podman run -- sleep 8`, recorded while it ran; the
/// run id, worktree, door and supervisor replaced by fixture names), with
/// Podman's own document, the seccomp file and the runtime's OCI
/// configuration beside the compatible inspect.
fn sandbox_expectations() -> Expectations {
    let env = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    Expectations {
        run_id: "fixture".into(),
        worktree_host_path: WORKTREE.into(),
        workspace_target: "/workspace".into(),
        door: Some(MountExpectation {
            host_path: DOOR.into(),
            target: "/run/nightshift".into(),
        }),
        allowed_env: env(&[
            ("HOME", "/home/agent"),
            ("LANG", "C.UTF-8"),
            ("NIGHTSHIFT_RUN_ID", "fixture"),
            ("NIGHTSHIFT_TASK", "fixture"),
            ("NIGHTSHIFT_DOOR", "/run/nightshift/door.sock"),
            (
                "NIGHTSHIFT_BASE_COMMIT",
                "d09582b11f46fbd44d59cc619bb0581c0b302689",
            ),
            (
                "PATH",
                "/run/nightshift/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            ),
        ]),
        image_env: vec![],
        max_memory_bytes: 2 << 30,
        max_pids: 512,
        max_nproc: 16384,
        allowed_tmpfs: BTreeSet::from([
            "/tmp".into(),
            "/home/agent".into(),
            "/run".into(),
            "/var/tmp".into(),
        ]),
        seccomp_profile_digest: profile_digest(),
        max_shm_bytes: 32 << 20,
        max_file_bytes: 2 << 30,
        main_process: Some("/run/nightshift/bin/nightshift-lease".into()),
        setup_cache: None,
        runtime: None,
    }
}

#[test]
fn a_recorded_nightshift_sandbox_on_podman_passes_every_property() {
    let att = verdict_with(&fixture("nightshift-sandbox"), &sandbox_expectations());
    assert!(att.passed(), "{:#?}", att.failures().collect::<Vec<_>>());
    assert_eq!(att.engine, Some(EngineKind::Podman));
    assert_eq!(att.runtime.as_deref(), Some("runc"));
}

/// What the runtime was handed decides, whatever the inspect documents say.
#[test]
fn the_runtimes_own_configuration_breaks_its_properties() {
    type Mutation = fn(&mut Value);
    let cases: [(&str, Mutation, &[&str]); 6] = [
        (
            "the host's cgroup namespace",
            |d| {
                let ns = d["OciSpec"]["namespaces"].as_array_mut().unwrap();
                ns.retain(|n| n["type"] != "cgroup");
            },
            &["private-namespaces"],
        ),
        (
            "a joined IPC namespace",
            |d| {
                let ns = d["OciSpec"]["namespaces"].as_array_mut().unwrap();
                for n in ns.iter_mut().filter(|n| n["type"] == "ipc") {
                    n["path"] = "/proc/1/ns/ipc".into();
                }
            },
            &["private-namespaces"],
        ),
        (
            "no seccomp filter handed to the runtime",
            |d| d["OciSpec"]["seccomp"] = Value::Null,
            &["seccomp-confined", "seccomp-profile"],
        ),
        (
            "a filter that allows one more syscall",
            |d| {
                let rules = d["OciSpec"]["seccomp"]["syscalls"].as_array_mut().unwrap();
                rules[0]["names"]
                    .as_array_mut()
                    .unwrap()
                    .push("io_uring_setup".into());
            },
            &["seccomp-profile"],
        ),
        (
            "/proc/cmdline not masked",
            |d| {
                let masked = d["OciSpec"]["maskedPaths"].as_array_mut().unwrap();
                masked.retain(|p| p != "/proc/cmdline");
            },
            &["proc-masked"],
        ),
        (
            "a capability in the bounding set",
            |d| d["Libpod"]["BoundingCaps"] = serde_json::json!(["CAP_SYS_ADMIN"]),
            &["capabilities-dropped"],
        ),
    ];
    for (what, mutate, names) in cases {
        let mut doc = fixture("nightshift-sandbox");
        mutate(&mut doc);
        let att = verdict_with(&doc, &sandbox_expectations());
        let want: BTreeSet<&str> = names.iter().copied().collect();
        assert_eq!(failed(&att), want, "{what}");
    }
}

/// An owner who requires gVisor (`[sandbox] runtime = "runsc"`) gets no
/// runc sandbox: the same recorded sandbox fails `runtime-default` alone.
#[test]
fn a_required_runtime_refuses_runc() {
    let expect = Expectations {
        runtime: Some("runsc".into()),
        ..sandbox_expectations()
    };
    let att = verdict_with(&fixture("nightshift-sandbox"), &expect);
    assert_eq!(failed(&att), BTreeSet::from(["runtime-default"]));
    let p = att.property("runtime-default").unwrap();
    assert_eq!(p.observed, "runtime=\"runc\"");
    // And a sandbox that reports runsc passes only where runsc is required.
    let mut doc = fixture("nightshift-sandbox");
    doc["Libpod"]["OCIRuntime"] = "runsc".into();
    assert!(verdict_with(&doc, &expect).passed());
    assert_eq!(
        failed(&verdict_with(&doc, &sandbox_expectations())),
        BTreeSet::from(["runtime-default"])
    );
}
