//! Attestation of inspect documents recorded from a real engine (Docker
//! 20.10, `tests/fixtures/*.json`, see `tests/fixtures/README.md`) with
//! host observations (accounts, a recorded mount table line), and of
//! mutations of the hardened ones for the breakages not recorded.

use std::collections::{BTreeMap, BTreeSet};

use orchestrator_attest::{
    attest, from_docker_inspect, mount_of, parse_inspect, parse_inspect_slice,
    seccomp_profile_digest, Attestation, Expectations, HostAccounts, HostObserved,
    MountExpectation, PROPERTY_NAMES,
};
use serde_json::{json, Value};

const WORKTREE: &str = "/srv/nightshift/worktrees/fixture";
const DOOR: &str = "/srv/nightshift/doors/fixture";
const SECRET_VALUE: &str = "hunter2-fixture-value";

fn fixture_text(name: &str) -> String {
    let path = format!("{}/tests/fixtures/{name}.json", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

fn fixture(name: &str) -> Value {
    serde_json::from_str(&fixture_text(name)).expect("fixture is json")
}

/// nightshift's own profile, which the hardened fixtures were created with.
fn profile_digest() -> String {
    let path = format!("{}/../core/src/seccomp.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    seccomp_profile_digest(&text).expect("the profile is json")
}

const PASSWD: &str =
    "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000:Alice,,,:/home/alice:/bin/bash\n";
const GROUP: &str = "root:x:0:\nalice:x:1000:\n";
const SUBUID: &str = "alice:100000:65536\n";

/// A host with one person (alice, 1000) and the worktree on the mount
/// recorded in `mountinfo-<mounts>.txt`.
fn host_with(mounts: &str) -> HostObserved {
    let path = format!(
        "{}/tests/fixtures/mountinfo-{mounts}.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    let info = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    HostObserved {
        accounts: HostAccounts::parse(PASSWD, GROUP, SUBUID, SUBUID),
        worktree_mount: mount_of(&info, WORKTREE),
    }
}

fn host() -> HostObserved {
    host_with("protected")
}

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
        allowed_tmpfs: BTreeSet::from(["/tmp".into(), "/home/agent".into()]),
        seccomp_profile_digest: profile_digest(),
        max_shm_bytes: 8_388_608,
        max_file_bytes: 1_073_741_824,
        main_process: None,
        setup_cache: None,
        runtime: None,
    }
}

fn with_door() -> Expectations {
    Expectations {
        door: Some(MountExpectation {
            host_path: DOOR.into(),
            target: "/run/nightshift".into(),
        }),
        ..expectations()
    }
}

fn verdict_with(doc: &Value, expect: &Expectations) -> Attestation {
    let inspected = parse_inspect(doc).expect("document parses");
    attest(&from_docker_inspect(&inspected), &host(), expect)
}

fn verdict(doc: &Value) -> Attestation {
    verdict_with(doc, &expectations())
}

fn failed(att: &Attestation) -> BTreeSet<&'static str> {
    att.failures().map(|p| p.name).collect()
}

/// Asserts that exactly `names` fail, that the refusal names each of them,
/// and that the first one's observed value contains `observed`.
fn assert_fails_exactly(att: &Attestation, names: &[&str], observed: &str) {
    let want: BTreeSet<&str> = names.iter().copied().collect();
    assert_eq!(
        failed(att),
        want,
        "failures: {:#?}",
        att.failures().collect::<Vec<_>>()
    );
    assert!(!att.passed());
    let refusal = att.ensure_passed().expect_err("refused").to_string();
    for name in names {
        assert!(refusal.contains(name), "refusal {refusal:?} names {name}");
    }
    let first = att.property(names[0]).expect("listed");
    assert!(
        first.observed.contains(observed),
        "{} observed {:?}, wanted it to contain {observed:?}",
        first.name,
        first.observed
    );
}

/// Sets the value at a JSON pointer, creating the last key if absent.
fn set(doc: &mut Value, pointer: &str, value: Value) {
    let (parent, key) = pointer.rsplit_once('/').expect("pointer has a key");
    let key = key.replace("~1", "/").replace("~0", "~");
    let parent = doc.pointer_mut(parent).expect("parent exists");
    if let Some(array) = parent.as_array_mut() {
        array[key.parse::<usize>().expect("index")] = value;
    } else {
        parent
            .as_object_mut()
            .expect("parent is an object")
            .insert(key, value);
    }
}

fn remove(doc: &mut Value, pointer: &str) {
    let (parent, key) = pointer.rsplit_once('/').expect("pointer has a key");
    doc.pointer_mut(parent)
        .and_then(Value::as_object_mut)
        .expect("parent is an object")
        .remove(key)
        .expect("key existed");
}

fn push(doc: &mut Value, pointer: &str, value: Value) {
    let target = doc.pointer_mut(pointer).expect("exists");
    if target.is_null() {
        *target = json!([]);
    }
    target.as_array_mut().expect("array").push(value);
}

#[test]
fn hardened_fixture_passes_every_property_in_order() {
    let att = verdict(&fixture("hardened"));
    let names: Vec<&str> = att.properties.iter().map(|p| p.name).collect();
    assert_eq!(names, PROPERTY_NAMES);
    assert!(att.passed(), "{:#?}", att.failures().collect::<Vec<_>>());
    assert!(att.ensure_passed().is_ok());
    assert_eq!(
        att.property("mounts-only-worktree").unwrap().observed,
        format!("bind {WORKTREE} -> /workspace rw")
    );
}

#[test]
fn recorded_bridge_network_fails_network_none() {
    let att = verdict(&fixture("network-bridge"));
    assert_fails_exactly(&att, &["network-none"], "mode=bridge networks=[bridge]");
}

#[test]
fn recorded_added_capability_fails_capabilities_dropped() {
    let att = verdict(&fixture("cap-add-net-admin"));
    assert_fails_exactly(&att, &["capabilities-dropped"], "add=[NET_ADMIN]");
}

#[test]
fn recorded_privileged_fails_privileged_and_what_the_engine_unmasks_with_it() {
    // The engine itself adds `label=disable` and drops the masked /proc
    // paths for a privileged container; the verdict must see all three.
    // nightshift sends its masked paths and its seccomp profile, and the
    // engine still reports them, but applies neither to a privileged container.
    let att = verdict(&fixture("privileged"));
    assert_fails_exactly(
        &att,
        &[
            "not-privileged",
            "lsm-confined",
            "proc-masked",
            "seccomp-profile",
        ],
        "privileged=true",
    );
    assert!(att
        .property("lsm-confined")
        .unwrap()
        .observed
        .contains("label=disable"));
    assert!(att
        .property("proc-masked")
        .unwrap()
        .observed
        .contains("privileged (the engine masks nothing)"));
}

#[test]
fn recorded_host_account_user_fails_user_no_host_account() {
    let att = verdict(&fixture("user-host-account"));
    assert_fails_exactly(
        &att,
        &["user-no-host-account"],
        "uid 1000 is the host user \"alice\"",
    );
    assert!(att
        .property("user-no-host-account")
        .unwrap()
        .observed
        .contains("gid 1000 is the host group \"alice\""));
}

#[test]
fn a_sandbox_id_in_a_delegated_range_fails_user_no_host_account() {
    let mut doc = fixture("hardened");
    set(&mut doc, "/Config/User", json!("165535:2000000000"));
    assert_fails_exactly(&verdict(&doc), &["user-no-host-account"], "/etc/subuid");
}

#[test]
fn recorded_plain_worktree_mount_fails_workspace_nosuid_nodev() {
    let inspected = parse_inspect(&fixture("hardened")).unwrap();
    let att = attest(
        &from_docker_inspect(&inspected),
        &host_with("plain"),
        &expectations(),
    );
    assert_fails_exactly(&att, &["workspace-nosuid-nodev"], "/ rw,relatime");
    let unread = HostObserved {
        worktree_mount: None,
        ..host()
    };
    let att = attest(&from_docker_inspect(&inspected), &unread, &expectations());
    assert_fails_exactly(&att, &["workspace-nosuid-nodev"], "no host mount found");
}

#[test]
fn recorded_engine_default_seccomp_fails_seccomp_profile() {
    let att = verdict(&fixture("seccomp-default"));
    assert_fails_exactly(&att, &["seccomp-profile"], "the engine's default profile");
}

#[test]
fn recorded_other_profile_fails_seccomp_profile_by_digest() {
    let att = verdict(&fixture("seccomp-other"));
    assert_fails_exactly(&att, &["seccomp-profile"], "profiles=[sha256:");
    assert!(!att
        .property("seccomp-profile")
        .unwrap()
        .observed
        .contains(&profile_digest()[..16]));
}

#[test]
fn recorded_engine_default_shm_fails_shm_bounded() {
    let att = verdict(&fixture("shm-default"));
    assert_fails_exactly(&att, &["shm-bounded"], "shm-size=67108864");
}

#[test]
fn recorded_engine_default_ulimits_fail_ulimits_bounded() {
    let att = verdict(&fixture("ulimits-default"));
    assert_fails_exactly(
        &att,
        &["ulimits-bounded"],
        "core=unset fsize=unset nproc=unset",
    );
}

#[test]
fn recorded_engine_default_masked_paths_fail_proc_masked() {
    let att = verdict(&fixture("masked-default"));
    assert_fails_exactly(
        &att,
        &["proc-masked"],
        "/proc/config.gz,/proc/cmdline,/sys/kernel/vmcoreinfo,/sys/kernel/boot_params",
    );
}

#[test]
fn recorded_docker_socket_mount_fails_mounts_naming_it() {
    let att = verdict(&fixture("docker-socket"));
    assert_fails_exactly(
        &att,
        &["mounts-only-worktree"],
        "unexpected bind /var/run/docker.sock -> /var/run/docker.sock rw",
    );
    // The `-v` also shows in HostConfig.Binds, and that is reported too.
    assert!(att
        .property("mounts-only-worktree")
        .unwrap()
        .observed
        .contains("unexpected binds entry /var/run/docker.sock:/var/run/docker.sock"));
}

#[test]
fn recorded_root_user_fails_non_root_user() {
    let att = verdict(&fixture("user-root"));
    assert_fails_exactly(&att, &["non-root-user"], "user=\"0\"");
}

#[test]
fn recorded_writable_root_fails_read_only_root() {
    let att = verdict(&fixture("writable-root"));
    assert_fails_exactly(&att, &["read-only-root"], "readonly-rootfs=false");
}

#[test]
fn recorded_extra_variable_fails_env_allowlisted_without_showing_its_value() {
    let att = verdict(&fixture("env-secret"));
    assert_fails_exactly(&att, &["env-allowlisted"], "not allowed: [SECRET]");
    let audit = serde_json::to_string(&att).unwrap();
    let refusal = att.ensure_passed().unwrap_err().to_string();
    assert!(!audit.contains(SECRET_VALUE), "{audit}");
    assert!(!refusal.contains(SECRET_VALUE), "{refusal}");
}

#[test]
fn recorded_seccomp_unconfined_fails_seccomp_confined() {
    let att = verdict(&fixture("seccomp-unconfined"));
    assert_fails_exactly(&att, &["seccomp-confined"], "seccomp=unconfined");
}

#[test]
fn recorded_host_pid_namespace_fails_private_namespaces_and_lsm() {
    // As with --privileged, the engine adds `label=disable` for --pid host.
    let att = verdict(&fixture("pid-host"));
    assert_fails_exactly(
        &att,
        &["private-namespaces", "lsm-confined"],
        "pid=\"host\"",
    );
}

#[test]
fn recorded_tmpfs_mount_fails_mounts_naming_its_target() {
    let att = verdict(&fixture("mount-tmpfs"));
    assert_fails_exactly(
        &att,
        &["mounts-only-worktree"],
        "unexpected tmpfs -> /scratch",
    );
}

#[test]
fn recorded_door_passes_only_when_expected() {
    let door = fixture("with-door");
    assert!(verdict_with(&door, &with_door()).passed());
    assert_fails_exactly(
        &verdict(&door),
        &["mounts-only-worktree"],
        &format!("unexpected bind {DOOR} -> /run/nightshift ro"),
    );
    assert_fails_exactly(
        &verdict_with(&fixture("hardened"), &with_door()),
        &["mounts-only-worktree"],
        &format!("missing door bind {DOOR} -> /run/nightshift ro"),
    );
}

/// The lease wrapper must be the container's PID 1 itself: under the
/// engine's init it is a child the agent can stop, and a document that
/// names another program, or adds the init, is refused.
#[test]
fn the_lease_wrapper_must_be_pid_1() {
    let wrapper = "/run/nightshift/bin/nightshift-lease";
    let leased = Expectations {
        main_process: Some(wrapper.into()),
        ..expectations()
    };
    let mut doc = fixture("hardened");
    assert_fails_exactly(
        &verdict_with(&doc, &leased),
        &["init-pid1"],
        "init=true path=/bin/true",
    );
    set(&mut doc, "/HostConfig/Init", json!(false));
    assert_fails_exactly(
        &verdict_with(&doc, &leased),
        &["init-pid1"],
        "init=false path=/bin/true",
    );
    set(&mut doc, "/Path", json!(wrapper));
    assert!(verdict_with(&doc, &leased).passed());
    set(&mut doc, "/HostConfig/Init", json!(true));
    assert_fails_exactly(
        &verdict_with(&doc, &leased),
        &["init-pid1"],
        &format!("init=true path={wrapper}"),
    );
    // Without a lease, the engine's init is what is asked for.
    assert!(verdict(&doc).passed());
}

#[test]
fn writable_door_fails_mounts() {
    let mut doc = fixture("with-door");
    set(&mut doc, "/Mounts/1/RW", json!(true));
    assert_fails_exactly(
        &verdict_with(&doc, &with_door()),
        &["mounts-only-worktree"],
        "door mount is rw (expected ro)",
    );
}

type Mutation = fn(&mut Value);

/// One breakage of the hardened document per row: the property it must
/// fail (and no other), and what its observed value must show.
const BREAKAGES: &[(&str, Mutation, &str)] = &[
    // network-none
    (
        "network-none",
        |d| set(d, "/HostConfig/NetworkMode", json!("host")),
        "mode=host",
    ),
    (
        "network-none",
        |d| set(d, "/HostConfig/NetworkMode", json!("container:abc")),
        "mode=container:abc",
    ),
    (
        "network-none",
        |d| set(d, "/NetworkSettings/Networks/bridge", json!({})),
        "networks=[bridge]",
    ),
    (
        "network-none",
        |d| {
            set(
                d,
                "/HostConfig/PortBindings",
                json!({"22/tcp": [{"HostIp": "", "HostPort": "2222"}]}),
            )
        },
        "port-bindings=[22/tcp]",
    ),
    (
        "network-none",
        |d| set(d, "/HostConfig/PublishAllPorts", json!(true)),
        "publish-all=true",
    ),
    (
        "network-none",
        |d| remove(d, "/HostConfig/PublishAllPorts"),
        "publish-all=absent",
    ),
    (
        "network-none",
        |d| set(d, "/HostConfig/Links", json!(["/db:/nsfx/db"])),
        "links=[/db:/nsfx/db]",
    ),
    // capabilities-dropped
    (
        "capabilities-dropped",
        |d| set(d, "/HostConfig/CapDrop", Value::Null),
        "drop=[]",
    ),
    (
        "capabilities-dropped",
        |d| set(d, "/HostConfig/CapDrop", json!(["NET_RAW"])),
        "drop=[NET_RAW]",
    ),
    // not-privileged
    (
        "not-privileged",
        |d| remove(d, "/HostConfig/Privileged"),
        "privileged=absent",
    ),
    // no-new-privileges
    (
        "no-new-privileges",
        |d| {
            let opts = d["HostConfig"]["SecurityOpt"].as_array_mut().unwrap();
            opts.remove(0);
        },
        "security-opt=[]",
    ),
    (
        "no-new-privileges",
        |d| {
            push(
                d,
                "/HostConfig/SecurityOpt",
                json!("no-new-privileges=false"),
            )
        },
        "no-new-privileges=false",
    ),
    // seccomp-confined
    (
        "seccomp-confined",
        |d| push(d, "/HostConfig/SecurityOpt", json!("seccomp:unconfined")),
        "seccomp=unconfined",
    ),
    // lsm-confined
    (
        "lsm-confined",
        |d| push(d, "/HostConfig/SecurityOpt", json!("apparmor=unconfined")),
        "apparmor=unconfined",
    ),
    (
        "lsm-confined",
        |d| set(d, "/AppArmorProfile", json!("unconfined")),
        "apparmor-profile=unconfined",
    ),
    (
        "lsm-confined",
        |d| push(d, "/HostConfig/SecurityOpt", json!("label=disable")),
        "label=disable",
    ),
    (
        "lsm-confined",
        |d| push(d, "/HostConfig/SecurityOpt", json!("label=type:spc_t")),
        "label=type:spc_t",
    ),
    // non-root-user
    (
        "non-root-user",
        |d| set(d, "/Config/User", json!("agent")),
        "user=\"agent\"",
    ),
    (
        "non-root-user",
        |d| set(d, "/Config/User", json!("2000000000")),
        "user=\"2000000000\"",
    ),
    (
        "non-root-user",
        |d| set(d, "/Config/User", json!("2000000000:0")),
        "user=\"2000000000:0\"",
    ),
    (
        "non-root-user",
        |d| set(d, "/Config/User", json!("")),
        "user=\"\"",
    ),
    (
        "non-root-user",
        |d| set(d, "/HostConfig/GroupAdd", json!(["0"])),
        "group-add=[0]",
    ),
    (
        "non-root-user",
        |d| set(d, "/HostConfig/GroupAdd", json!(["docker"])),
        "group-add=[docker]",
    ),
    // read-only-root
    (
        "read-only-root",
        |d| remove(d, "/HostConfig/ReadonlyRootfs"),
        "readonly-rootfs=absent",
    ),
    // mounts-only-worktree
    (
        "mounts-only-worktree",
        |d| {
            push(
                d,
                "/Mounts",
                json!({"Type": "volume", "Name": "cache", "Source": "/var/lib/docker/volumes/cache/_data", "Destination": "/cache", "RW": true}),
            )
        },
        "unexpected volume cache -> /cache rw",
    ),
    (
        "mounts-only-worktree",
        |d| set(d, "/Mounts/0/RW", json!(false)),
        "worktree mount is ro (expected rw)",
    ),
    (
        "mounts-only-worktree",
        |d| set(d, "/Mounts/0/Source", json!("/home/me")),
        "unexpected bind /home/me -> /workspace rw",
    ),
    (
        "mounts-only-worktree",
        |d| set(d, "/Mounts", Value::Null),
        "missing worktree bind",
    ),
    (
        "mounts-only-worktree",
        |d| set(d, "/HostConfig/Binds", json!(["/etc:/host-etc:ro"])),
        "unexpected binds entry /etc:/host-etc:ro",
    ),
    (
        "mounts-only-worktree",
        |d| {
            push(
                d,
                "/HostConfig/Mounts",
                json!({"Type": "bind", "Source": "/", "Target": "/host"}),
            )
        },
        "unexpected requested bind / -> /host rw",
    ),
    (
        "mounts-only-worktree",
        |d| set(d, "/HostConfig/VolumesFrom", json!(["other"])),
        "volumes-from other",
    ),
    // tmpfs-only-allowed
    (
        "tmpfs-only-allowed",
        |d| set(d, "/HostConfig/Tmpfs/~1var~1tmp", json!("size=1m")),
        "/var/tmp size=1m (not allowed)",
    ),
    (
        "tmpfs-only-allowed",
        |d| set(d, "/HostConfig/Tmpfs/~1tmp", json!("rw,noexec")),
        "/tmp size=none",
    ),
    (
        "tmpfs-only-allowed",
        |d| set(d, "/HostConfig/Tmpfs/~1tmp", json!("size=0")),
        "/tmp size=0",
    ),
    (
        "tmpfs-only-allowed",
        |d| set(d, "/HostConfig/Tmpfs/~1tmp", json!("size=50%")),
        "/tmp size=50%",
    ),
    (
        "tmpfs-only-allowed",
        |d| set(d, "/HostConfig/Tmpfs/~1tmp", json!("size=1m,size=0")),
        "/tmp size=0",
    ),
    // no-devices
    (
        "no-devices",
        |d| {
            set(
                d,
                "/HostConfig/Devices",
                json!([{"PathOnHost": "/dev/kvm", "PathInContainer": "/dev/kvm", "CgroupPermissions": "rwm"}]),
            )
        },
        "devices=[/dev/kvm]",
    ),
    (
        "no-devices",
        |d| set(d, "/HostConfig/DeviceCgroupRules", json!(["c 10:200 rwm"])),
        "cgroup-rules=[c 10:200 rwm]",
    ),
    (
        "no-devices",
        |d| {
            set(
                d,
                "/HostConfig/DeviceRequests",
                json!([{"Driver": "nvidia", "Count": -1}]),
            )
        },
        "requests=[nvidia]",
    ),
    // private-namespaces
    (
        "private-namespaces",
        |d| set(d, "/HostConfig/IpcMode", json!("host")),
        "ipc=\"host\"",
    ),
    (
        "private-namespaces",
        |d| set(d, "/HostConfig/IpcMode", json!("container:abc")),
        "ipc=\"container:abc\"",
    ),
    (
        "private-namespaces",
        |d| set(d, "/HostConfig/UTSMode", json!("host")),
        "uts=\"host\"",
    ),
    (
        "private-namespaces",
        |d| set(d, "/HostConfig/UsernsMode", json!("host")),
        "userns=\"host\"",
    ),
    (
        "private-namespaces",
        |d| set(d, "/HostConfig/Cgroup", json!("container:abc")),
        "cgroup=\"container:abc\"",
    ),
    (
        "private-namespaces",
        |d| set(d, "/HostConfig/CgroupnsMode", json!("host")),
        "cgroupns=host",
    ),
    (
        "private-namespaces",
        |d| remove(d, "/HostConfig/CgroupnsMode"),
        "cgroupns=absent",
    ),
    // memory-limited
    (
        "memory-limited",
        |d| {
            set(d, "/HostConfig/Memory", json!(0));
            set(d, "/HostConfig/MemorySwap", json!(0))
        },
        "memory=0 swap=0",
    ),
    (
        "memory-limited",
        |d| {
            set(d, "/HostConfig/Memory", json!(536_870_913_i64));
            set(d, "/HostConfig/MemorySwap", json!(536_870_913_i64))
        },
        "memory=536870913",
    ),
    (
        "memory-limited",
        |d| set(d, "/HostConfig/MemorySwap", json!(-1)),
        "swap=-1",
    ),
    (
        "memory-limited",
        |d| set(d, "/HostConfig/MemorySwap", json!(1_073_741_824_i64)),
        "swap=1073741824",
    ),
    (
        "memory-limited",
        |d| remove(d, "/HostConfig/Memory"),
        "memory=absent",
    ),
    // oom-killer-enabled
    (
        "oom-killer-enabled",
        |d| set(d, "/HostConfig/OomKillDisable", json!(true)),
        "oom-kill-disable=true",
    ),
    (
        "oom-killer-enabled",
        |d| set(d, "/HostConfig/OomScoreAdj", json!(-500)),
        "oom-score-adj=-500",
    ),
    // cpu-limited
    (
        "cpu-limited",
        |d| set(d, "/HostConfig/NanoCpus", json!(0)),
        "nano-cpus=0 cpu-quota=0",
    ),
    (
        "cpu-limited",
        |d| remove(d, "/HostConfig/NanoCpus"),
        "nano-cpus=absent",
    ),
    // pids-limited
    (
        "pids-limited",
        |d| set(d, "/HostConfig/PidsLimit", Value::Null),
        "pids-limit=absent",
    ),
    (
        "pids-limited",
        |d| set(d, "/HostConfig/PidsLimit", json!(-1)),
        "pids-limit=-1",
    ),
    (
        "pids-limited",
        |d| set(d, "/HostConfig/PidsLimit", json!(0)),
        "pids-limit=0",
    ),
    (
        "pids-limited",
        |d| set(d, "/HostConfig/PidsLimit", json!(257)),
        "pids-limit=257",
    ),
    // env-allowlisted
    (
        "env-allowlisted",
        |d| set(d, "/Config/Env/1", json!("PATH=/tmp/evil:/usr/bin")),
        "not allowed: [PATH]",
    ),
    (
        "env-allowlisted",
        |d| push(d, "/Config/Env", json!("LD_PRELOAD")),
        "not allowed: [LD_PRELOAD]",
    ),
    (
        "env-allowlisted",
        |d| push(d, "/Config/Env", json!("LANG=C.UTF-8")),
        "not allowed: [LANG]",
    ),
    // init-pid1
    (
        "init-pid1",
        |d| set(d, "/HostConfig/Init", json!(false)),
        "init=false",
    ),
    (
        "init-pid1",
        |d| remove(d, "/HostConfig/Init"),
        "init=absent",
    ),
    // log-bounded
    (
        "log-bounded",
        |d| {
            set(
                d,
                "/HostConfig/LogConfig",
                json!({"Type": "json-file", "Config": {}}),
            )
        },
        "driver=json-file max-size=none",
    ),
    (
        "log-bounded",
        |d| {
            set(
                d,
                "/HostConfig/LogConfig",
                json!({"Type": "syslog", "Config": {"max-size": "1m"}}),
            )
        },
        "driver=syslog",
    ),
    (
        "log-bounded",
        |d| set(d, "/HostConfig/LogConfig", Value::Null),
        "driver=absent",
    ),
    // labelled
    (
        "labelled",
        |d| set(d, "/Config/Labels", Value::Null),
        "nightshift.run=absent",
    ),
    (
        "labelled",
        |d| set(d, "/Config/Labels/nightshift.run", json!("other")),
        "nightshift.run=other",
    ),
    // no-sysctls
    (
        "no-sysctls",
        |d| {
            set(
                d,
                "/HostConfig/Sysctls",
                json!({"net.ipv4.ip_unprivileged_port_start": "0"}),
            )
        },
        "sysctls=[net.ipv4.ip_unprivileged_port_start]",
    ),
    // runtime-default
    (
        "runtime-default",
        |d| set(d, "/HostConfig/Runtime", json!("nvidia")),
        "runtime=\"nvidia\"",
    ),
    // proc-masked
    (
        "proc-masked",
        |d| set(d, "/HostConfig/MaskedPaths", Value::Null),
        "/proc/kcore",
    ),
    (
        "proc-masked",
        |d| set(d, "/HostConfig/ReadonlyPaths", json!(["/proc/bus"])),
        "/proc/sys",
    ),
    (
        "proc-masked",
        |d| {
            push(
                d,
                "/HostConfig/SecurityOpt",
                json!("systempaths=unconfined"),
            )
        },
        "systempaths=unconfined",
    ),
    // user-no-host-account
    (
        "user-no-host-account",
        |d| set(d, "/Config/User", json!("2000000000:1000")),
        "gid 1000 is the host group \"alice\"",
    ),
    // seccomp-profile
    (
        "seccomp-profile",
        |d| set(d, "/HostConfig/SecurityOpt/1", json!("seccomp={not json")),
        "profiles=[unreadable]",
    ),
    (
        "seccomp-profile",
        |d| {
            push(
                d,
                "/HostConfig/SecurityOpt",
                json!("seccomp={\"defaultAction\":\"SCMP_ACT_ALLOW\"}"),
            )
        },
        "profiles=[sha256:",
    ),
    // shm-bounded
    (
        "shm-bounded",
        |d| set(d, "/HostConfig/ShmSize", json!(8_388_609)),
        "shm-size=8388609",
    ),
    (
        "shm-bounded",
        |d| set(d, "/HostConfig/ShmSize", json!(0)),
        "shm-size=0",
    ),
    (
        "shm-bounded",
        |d| remove(d, "/HostConfig/ShmSize"),
        "shm-size=absent",
    ),
    // ulimits-bounded
    (
        "ulimits-bounded",
        |d| set(d, "/HostConfig/Ulimits/1/Hard", json!(-1)),
        "core=0/-1",
    ),
    (
        "ulimits-bounded",
        |d| {
            set(d, "/HostConfig/Ulimits/2/Hard", json!(1_073_741_825_i64));
            set(d, "/HostConfig/Ulimits/2/Soft", json!(1_073_741_825_i64))
        },
        "fsize=1073741825/1073741825",
    ),
    (
        "ulimits-bounded",
        |d| set(d, "/HostConfig/Ulimits/3/Hard", json!(-1)),
        "nproc=256/-1",
    ),
    (
        "ulimits-bounded",
        |d| set(d, "/HostConfig/Ulimits/3/Soft", json!(257)),
        "nproc=257/256",
    ),
    (
        "ulimits-bounded",
        |d| {
            push(
                d,
                "/HostConfig/Ulimits",
                json!({"Name": "core", "Soft": -1, "Hard": -1}),
            )
        },
        "core=-1/-1",
    ),
    // proc-masked (nightshift's own additions)
    (
        "proc-masked",
        |d| {
            let masked = d.pointer_mut("/HostConfig/MaskedPaths").unwrap();
            masked
                .as_array_mut()
                .unwrap()
                .retain(|p| p != "/proc/cmdline");
        },
        "not masked: [/proc/cmdline]",
    ),
    // no-restart
    (
        "no-restart",
        |d| {
            set(
                d,
                "/HostConfig/RestartPolicy",
                json!({"Name": "always", "MaximumRetryCount": 0}),
            )
        },
        "restart=\"always\"",
    ),
    (
        "no-restart",
        |d| set(d, "/HostConfig/RestartPolicy/Name", json!("unless-stopped")),
        "restart=\"unless-stopped\"",
    ),
];

#[test]
fn each_breakage_fails_exactly_its_property() {
    for (i, (name, mutate, observed)) in BREAKAGES.iter().enumerate() {
        let mut doc = fixture("hardened");
        mutate(&mut doc);
        let att = verdict(&doc);
        let failed = failed(&att);
        assert_eq!(
            failed,
            BTreeSet::from([*name]),
            "breakage #{i} ({name}): {:#?}",
            att.failures().collect::<Vec<_>>()
        );
        let p = att.property(name).unwrap();
        assert!(
            p.observed.contains(observed),
            "breakage #{i} ({name}): observed {:?} lacks {observed:?}",
            p.observed
        );
        assert!(att.ensure_passed().unwrap_err().to_string().contains(name));
    }
}

#[test]
fn every_property_is_broken_by_some_breakage() {
    let recorded = [
        "network-none",
        "capabilities-dropped",
        "not-privileged",
        "seccomp-confined",
        "private-namespaces",
        "mounts-only-worktree",
        "non-root-user",
        "read-only-root",
        "env-allowlisted",
        "workspace-nosuid-nodev",
    ];
    let covered: BTreeSet<&str> = BREAKAGES
        .iter()
        .map(|(name, _, _)| *name)
        .chain(recorded)
        .collect();
    let all: BTreeSet<&str> = PROPERTY_NAMES.iter().copied().collect();
    assert_eq!(covered, all);
}

/// Spellings and settings that keep Tier 0 and must not be refused.
const ACCEPTED: &[Mutation] = &[
    |d| set(d, "/HostConfig/CapDrop", json!(["all"])),
    |d| set(d, "/HostConfig/SecurityOpt/0", json!("no-new-privileges")),
    |d| {
        set(
            d,
            "/HostConfig/SecurityOpt/0",
            json!("no-new-privileges=true"),
        )
    },
    // The same profile spaced differently has the same digest.
    |d| {
        let opt = d["HostConfig"]["SecurityOpt"][1]
            .as_str()
            .unwrap()
            .to_owned();
        let json: Value = serde_json::from_str(&opt["seccomp=".len()..]).unwrap();
        set(
            d,
            "/HostConfig/SecurityOpt/1",
            json!(format!("seccomp={json}")),
        )
    },
    |d| {
        push(
            d,
            "/HostConfig/SecurityOpt",
            json!("apparmor=docker-default"),
        )
    },
    |d| set(d, "/AppArmorProfile", json!("docker-default")),
    |d| {
        set(
            d,
            "/HostConfig/LogConfig",
            json!({"Type": "json-file", "Config": {"max-size": "10m"}}),
        )
    },
    |d| {
        set(
            d,
            "/HostConfig/LogConfig",
            json!({"Type": "local", "Config": {"max-size": "10m"}}),
        )
    },
    |d| set(d, "/HostConfig/IpcMode", json!("shareable")),
    |d| set(d, "/HostConfig/IpcMode", json!("none")),
    |d| set(d, "/HostConfig/PidsLimit", json!(1)),
    |d| set(d, "/HostConfig/OomKillDisable", Value::Null),
    |d| remove(d, "/HostConfig/Runtime"),
    |d| set(d, "/HostConfig/Runtime", json!("io.containerd.runc.v2")),
    |d| {
        set(d, "/HostConfig/NanoCpus", json!(0));
        set(d, "/HostConfig/CpuQuota", json!(50_000))
    },
    |d| set(d, "/HostConfig/Tmpfs/~1tmp", json!("rw,size=64m")),
    |d| set(d, "/HostConfig/Tmpfs", Value::Null),
    |d| set(d, "/HostConfig/RestartPolicy/Name", json!("")),
    |d| set(d, "/HostConfig/GroupAdd", json!(["1001"])),
    |d| {
        set(
            d,
            "/HostConfig/Binds",
            json!([format!("{WORKTREE}:/workspace:rw")]),
        )
    },
    |d| {
        push(
            d,
            "/HostConfig/MaskedPaths",
            json!("/sys/devices/virtual/powercap"),
        )
    },
];

#[test]
fn equivalent_safe_spellings_still_pass() {
    for (i, mutate) in ACCEPTED.iter().enumerate() {
        let mut doc = fixture("hardened");
        mutate(&mut doc);
        let att = verdict(&doc);
        assert!(
            att.passed(),
            "accepted #{i}: {:#?}",
            att.failures().collect::<Vec<_>>()
        );
    }
}

#[test]
fn image_declared_variables_pass_as_declared_only() {
    let mut doc = fixture("hardened");
    push(&mut doc, "/Config/Env", json!("LANG=C.UTF-8"));
    let expect = Expectations {
        image_env: vec!["LANG=C.UTF-8".into()],
        ..expectations()
    };
    assert!(verdict_with(&doc, &expect).passed());
    set(&mut doc, "/Config/Env/3", json!("LANG=en_US.UTF-8"));
    assert_fails_exactly(
        &verdict_with(&doc, &expect),
        &["env-allowlisted"],
        "not allowed: [LANG]",
    );
}

/// bollard drops `None` fields when it serializes, so the adapter's document
/// has absent keys where the engine printed `null`.
#[test]
fn hardened_without_null_fields_still_passes() {
    fn strip_nulls(v: &mut Value) {
        match v {
            Value::Object(map) => {
                map.retain(|_, v| !v.is_null());
                map.values_mut().for_each(strip_nulls);
            }
            Value::Array(items) => items.iter_mut().for_each(strip_nulls),
            _ => {}
        }
    }
    let mut doc = fixture("hardened");
    strip_nulls(&mut doc);
    assert!(doc["HostConfig"].get("Binds").is_none());
    assert!(verdict(&doc).passed());
}

#[test]
fn raw_fixture_bytes_parse_like_the_value() {
    let text = fixture_text("hardened");
    let from_bytes = parse_inspect_slice(text.as_bytes()).unwrap();
    let from_value = parse_inspect(&fixture("hardened")).unwrap();
    assert_eq!(from_bytes, from_value);
}

#[test]
fn malformed_documents_are_errors_naming_the_field() {
    let cases: Vec<(Value, &str)> = vec![
        (json!([]), "."),
        (json!("container"), "."),
        (json!({"Config": {}}), "."),
        (json!({"HostConfig": null, "Config": {}}), "HostConfig"),
        (
            json!({"HostConfig": {"Privileged": "false"}, "Config": {}}),
            "HostConfig.Privileged",
        ),
        (
            json!({"HostConfig": {}, "Config": {"Env": [1]}}),
            "Config.Env[0]",
        ),
        (
            json!({"HostConfig": {"Memory": 1.5}, "Config": {}}),
            "HostConfig.Memory",
        ),
        (
            json!({"HostConfig": {}, "Config": {}, "Mounts": [{"RW": "yes"}]}),
            "Mounts[0].RW",
        ),
    ];
    for (doc, path) in cases {
        let err = parse_inspect(&doc).expect_err(&doc.to_string());
        let shown = err.to_string();
        assert!(
            shown.starts_with("reading container inspect document at "),
            "{shown}"
        );
        assert!(shown.ends_with(&format!(" at {path}")), "{doc}: {shown}");
    }
}

#[test]
fn malformed_text_is_an_error() {
    let hardened = fixture_text("hardened");
    let array = format!("[{hardened}]");
    let trailing = format!("{hardened} {{}}");
    for bad in [
        &b"not json"[..],
        b"",
        b"{",
        array.as_bytes(),
        trailing.as_bytes(),
    ] {
        assert!(
            parse_inspect_slice(bad).is_err(),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn a_nearly_empty_document_fails_closed() {
    let att = verdict(&json!({"HostConfig": {}, "Config": {}}));
    assert_eq!(att.properties.len(), PROPERTY_NAMES.len());
    let failed = failed(&att);
    for name in [
        "network-none",
        "capabilities-dropped",
        "not-privileged",
        "no-new-privileges",
        "non-root-user",
        "read-only-root",
        "mounts-only-worktree",
        "private-namespaces",
        "memory-limited",
        "cpu-limited",
        "pids-limited",
        "init-pid1",
        "log-bounded",
        "labelled",
        "proc-masked",
        "seccomp-profile",
        "shm-bounded",
        "ulimits-bounded",
    ] {
        assert!(failed.contains(name), "{name} passed on an empty document");
    }
}

#[test]
fn the_verdict_serializes_for_the_audit() {
    let att = verdict(&fixture("writable-root"));
    let value = serde_json::to_value(&att).unwrap();
    let p = value["properties"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "read-only-root")
        .unwrap();
    assert_eq!(p["ok"], json!(false));
    assert_eq!(p["observed"], json!("readonly-rootfs=false"));
    assert_eq!(p["expected"], json!("readonly-rootfs=true"));
}

/// A setup cache (docs/setup.md) passes only read-only, where expected: a
/// writable one (in the engine's list or in the request) fails, and so
/// does one mounted into a run that was not given it.
#[test]
fn a_setup_cache_passes_only_read_only_and_expected() {
    const CACHE: &str = "/srv/nightshift/setup/repo/key";
    let expect = Expectations {
        setup_cache: Some(MountExpectation {
            host_path: CACHE.into(),
            target: "/cache".into(),
        }),
        ..expectations()
    };
    let with_cache = |rw: bool| {
        let mut doc = fixture("hardened");
        push(
            &mut doc,
            "/Mounts",
            json!({"Type": "bind", "Source": CACHE, "Destination": "/cache", "Mode": "", "RW": rw, "Propagation": "rprivate"}),
        );
        push(
            &mut doc,
            "/HostConfig/Mounts",
            json!({"Type": "bind", "Source": CACHE, "Target": "/cache", "ReadOnly": !rw}),
        );
        doc
    };
    assert!(verdict_with(&with_cache(false), &expect).passed());
    assert_fails_exactly(
        &verdict_with(&with_cache(true), &expect),
        &["mounts-only-worktree"],
        "setup cache mount is rw (expected ro)",
    );
    assert_fails_exactly(
        &verdict(&with_cache(false)),
        &["mounts-only-worktree"],
        &format!("unexpected bind {CACHE} -> /cache ro"),
    );
    assert_fails_exactly(
        &verdict_with(&fixture("hardened"), &expect),
        &["mounts-only-worktree"],
        &format!("missing setup cache bind {CACHE} -> /cache ro"),
    );
}
