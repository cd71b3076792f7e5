//! Probes run inside a real sandbox: Tier 0 as the agent experiences it.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tests::probes::{
    get, probe_script, probes, ALLOWED_CALLS, REFUSED_CALLS, SECRET, SYSCALL_PROBES,
};
use tests::{git, image, make_repo, only_run, stderr, stdout, State};

/// The id a sandbox runs as by default (no host account has it).
const SANDBOX_ID: &str = "2000000000";

#[test]
fn tier0_holds_inside_the_sandbox() {
    let listener = TcpListener::bind("0.0.0.0:0").expect("host listener");
    let port = listener.local_addr().unwrap().port();
    let state = State::new();
    let repo = make_repo();
    let out = state
        .cmd()
        .env("NIGHTSHIFT_SENTINEL", SECRET)
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .args([
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--image",
            &image(),
            "--",
            "bash",
            "-c",
            &probe_script(port),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "probe run failed: {}", stderr(&out));
    let run = only_run(&state);
    let log = state.output_log(run["id"].as_str().unwrap());
    let p = probes(&log);
    let get = |k: &str| p.get(k).map(String::as_str).unwrap_or("<missing>");

    assert_eq!(get("interfaces"), "lo", "{log}");
    assert_eq!(get("dns"), "failed");
    for host in ["127.0.0.1", "172.17.0.1", "10.0.2.2", "8.8.8.8"] {
        assert_eq!(get(&format!("tcp-{host}")), "failed", "reached {host}");
    }
    assert_eq!(get("engine-/var/run/docker.sock"), "failed");
    assert_eq!(get("engine-/run/docker.sock"), "failed");
    assert_eq!(get("env-secret"), "absent");
    assert_eq!(get("proc-secret"), "absent");
    assert_eq!(get("capeff"), "0000000000000000");
    assert_ne!(get("uid"), "0");
    assert_eq!(get("uid"), SANDBOX_ID);
    for p in [
        "/etc/probe",
        "/usr/probe",
        "/probe",
        "/var/probe",
        "/run/probe",
    ] {
        assert_eq!(get(&format!("write-{p}")), "denied", "could write {p}");
    }
    assert_eq!(get("write-/workspace/probe"), "ok");
    assert_eq!(get("write-/tmp/probe"), "ok");
    assert_eq!(get("write-/home/agent/probe"), "ok");
    // The lease wrapper itself (its name cut to 15 bytes), not the engine's init.
    assert_eq!(get("pid1"), "nightshift-leas");
    drop(listener);
    assert!(state.containers().is_empty());
}

/// Runs `script` (bash) in a sandbox of a fresh state and returns the state,
/// the run's `name=value` probes and its whole output.
fn probe_run(
    extra: &[&str],
    script: &str,
) -> (
    State,
    std::collections::BTreeMap<String, String>,
    String,
    serde_json::Value,
) {
    let state = State::new();
    let repo = make_repo();
    let img = image();
    let mut args = vec![
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--image",
        &img,
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "bash", "-c", script]);
    let out = state.run(&args);
    assert!(out.status.success(), "probe run failed: {}", stderr(&out));
    let run = only_run(&state);
    let log = state.output_log(run["id"].as_str().unwrap());
    let p = probes(&log);
    assert!(state.containers().is_empty());
    assert!(mounts_under(state.path()).is_empty());
    (state, p, log, run)
}

/// Mount points under `dir` in this process's mount table.
fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let prefix = format!("{}/", dir.display());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
        .filter(|mp| mp.starts_with(&prefix))
        .collect()
}

#[test]
fn syscalls_outside_nightshifts_profile_are_refused() {
    let (state, p, log, run) = probe_run(&[], SYSCALL_PROBES);
    let eperm = "errno1";
    for call in REFUSED_CALLS {
        assert_eq!(
            get(&p, call),
            eperm,
            "{call} was not refused by the filter: {log}"
        );
    }
    // What ordinary work needs still works: glibc's netlink, sockets, git.
    for call in ALLOWED_CALLS {
        assert_eq!(get(&p, call), "ok", "{call}: {log}");
    }
    assert_eq!(get(&p, "interfaces"), "lo", "{log}");
    assert_eq!(get(&p, "loopback"), "hi", "{log}");
    assert_eq!(get(&p, "git"), "committed", "{log}");
    let id = run["id"].as_str().unwrap();
    let show = state.show(id);
    let att = show["audit"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "attestation")
        .unwrap();
    let props = att["body"]["properties"].as_array().unwrap();
    let profile = props.iter().find(|p| p["name"] == "seccomp-profile");
    assert_eq!(
        profile.map(|p| p["ok"].clone()),
        Some(serde_json::json!(true)),
        "{props:?}"
    );
}

/// Builds `tests/probes/socket_entry_points.c` static and non-PIE with the
/// host's gcc into `dir/probe`.
#[cfg(target_arch = "x86_64")]
fn build_socket_probe(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("probes/socket_entry_points.c");
    let out = dir.join("probe");
    let built = Command::new("gcc")
        .args(["-O1", "-static", "-no-pie", "-o"])
        .arg(&out)
        .arg(&source)
        .output()
        .expect("running gcc");
    assert!(built.status.success(), "gcc: {}", stderr(&built));
    out
}

/// Every socket family the profile refuses, tried through every entry
/// point from inside a real sandbox by a static probe: the 64-bit call,
/// `int 0x80`'s `socketcall(SYS_SOCKET)` and 32-bit `socket`, and x32. The
/// 32-bit entry points fail for every family (the profile lists no 32-bit
/// ABI: the kernel kills the caller), the 64-bit call for the refused
/// families only.
#[cfg(target_arch = "x86_64")]
#[test]
fn refused_socket_families_stay_refused_through_every_entry_point() {
    let state = State::new();
    let repo = make_repo();
    let probe = build_socket_probe(repo.path());
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o755)).unwrap();
    git(repo.path(), &["add", "probe"]);
    git(repo.path(), &["commit", "-q", "-m", "socket probe"]);
    let out = state.run(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "bash",
        "-c",
        "chmod +x probe && ./probe",
    ]);
    assert!(out.status.success(), "probe run failed: {}", stderr(&out));
    let run = only_run(&state);
    let log = state.output_log(run["id"].as_str().unwrap());
    let p = probes(&log);
    let refused = [
        "vsock",
        "netlink_audit",
        "netlink_sock_diag",
        "netlink_uevent",
        "netlink_generic",
        "netlink_netfilter",
        "netlink_xfrm",
        "packet",
        "alg",
    ];
    for family in refused.iter().chain(&["netlink_route", "inet"]) {
        for entry in ["socketcall", "i386", "x32"] {
            let got = get(&p, &format!("sock-{entry}-{family}"));
            assert!(
                got == "refused" || got.starts_with("killed"),
                "{family} through {entry}: {got}\n{log}"
            );
        }
    }
    for family in refused {
        assert_eq!(
            get(&p, &format!("sock-native-{family}")),
            "refused",
            "{log}"
        );
    }
    // The probe itself works: what the profile allows is created.
    assert_eq!(get(&p, "sock-native-netlink_route"), "created", "{log}");
    assert_eq!(get(&p, "sock-native-inet"), "created", "{log}");
}

#[test]
fn the_sandbox_runs_as_no_host_account_and_owns_its_worktree() {
    let (_state, p, log, _) = probe_run(
        &[],
        r#"echo "ids=$(id -u):$(id -g)"; echo "owner=$(stat -c %u:%g /workspace /workspace/README.md | sort -u | tr '\n' ' ')""#,
    );
    assert_eq!(
        get(&p, "ids"),
        format!("{SANDBOX_ID}:{SANDBOX_ID}"),
        "{log}"
    );
    assert_eq!(
        get(&p, "owner"),
        format!("{SANDBOX_ID}:{SANDBOX_ID}"),
        "{log}"
    );
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    assert!(!passwd
        .lines()
        .any(|l| l.split(':').nth(2) == Some(SANDBOX_ID)));
}

#[test]
fn a_sandbox_user_that_is_a_host_account_is_refused() {
    // The first account in the host's /etc/passwd that is not root.
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let (name, uid) = passwd
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some((f.first()?.to_string(), f.get(2)?.parse::<u32>().ok()?))
        })
        .find(|(_, uid)| *uid != 0)
        .expect("a host account other than root");
    let state = State::new();
    std::fs::write(
        state.path().join("config.toml"),
        format!("[sandbox]\nuid = {uid}\ngid = 2000000000\n"),
    )
    .unwrap();
    let repo = make_repo();
    let out = state.run(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("uid {uid} is the host user \"{name}\"")),
        "{err}"
    );
    assert!(state.runs().is_empty(), "a run was created");
    assert!(state.containers().is_empty());
}

#[test]
fn the_workspace_is_nosuid_nodev_and_a_setuid_bit_there_gains_nothing() {
    let state = State::new();
    let repo = make_repo();
    let img = image();
    // The agent reports its mount, then waits while the host tries a setuid
    // file in the worktree.
    let script = r#"
echo "mountopts=$(awk '$5 == "/workspace" {print $6}' /proc/self/mountinfo)"
python3 -c 'import os; f = os.statvfs("/workspace").f_flag; print("statvfs-nosuid=%d" % bool(f & os.ST_NOSUID)); print("statvfs-nodev=%d" % bool(f & os.ST_NODEV))'
cp /usr/bin/id /workspace/own-suid && chmod 4755 /workspace/own-suid && echo "own-suid-mode=$(stat -c %a /workspace/own-suid)"
touch /workspace/.ready
for i in $(seq 600); do [ -e /workspace/.done ] && break; sleep 0.1; done
rm -f /workspace/own-suid /workspace/suid-id /workspace/.ready /workspace/.done
"#;
    let child = state
        .cmd()
        .args([
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--image",
            &img,
            "--",
            "bash",
            "-c",
            script,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let worktree = wait_for_worktree_file(&state, ".ready");
    // The host's own `id`, made setuid to the sandbox's user, run as nobody
    // through the worktree's path: on a nosuid mount it stays nobody.
    let suid = worktree.join("suid-id");
    std::fs::copy("/usr/bin/id", &suid).unwrap();
    let sandbox_id: u32 = SANDBOX_ID.parse().unwrap();
    nix::unistd::chown(
        &suid,
        Some(nix::unistd::Uid::from_raw(sandbox_id)),
        Some(nix::unistd::Gid::from_raw(sandbox_id)),
    )
    .unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let euid = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&suid)
        .arg("-u")
        .output()
        .unwrap();
    std::fs::write(worktree.join(".done"), "").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&euid).trim(), "65534", "the setuid bit took effect");
    let run = only_run(&state);
    let log = state.output_log(run["id"].as_str().unwrap());
    let p = probes(&log);
    let opts: Vec<&str> = get(&p, "mountopts").split(',').collect();
    assert!(
        opts.contains(&"nosuid") && opts.contains(&"nodev"),
        "/workspace mounted {opts:?}"
    );
    assert_eq!(get(&p, "statvfs-nosuid"), "1", "{log}");
    assert_eq!(get(&p, "statvfs-nodev"), "1", "{log}");
    // The bit itself is kept (the file is the agent's); the mount voids it.
    assert_eq!(get(&p, "own-suid-mode"), "4755", "{log}");
    assert!(mounts_under(state.path()).is_empty());
    assert!(state.containers().is_empty());
}

/// Polls until the only run's worktree holds `name`; returns the worktree.
fn wait_for_worktree_file(state: &State, name: &str) -> PathBuf {
    let started = Instant::now();
    loop {
        let runs = state.runs();
        if let Some(id) = runs.first().and_then(|r| r["id"].as_str()) {
            let wt = state.path().join("worktrees").join(id);
            if wt.join(name).exists() {
                return wt;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the agent never wrote {name}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn shm_and_resource_limits_follow_the_caps() {
    let (_state, p, log, _) = probe_run(
        &["--max-worktree", "64m", "--pids", "100"],
        r#"
echo "shm=$(df -B1 --output=size /dev/shm | tail -1 | tr -d ' ')"
if head -c 40M /dev/zero > /dev/shm/fill 2>/dev/null; then echo "shm-40m=ok"; else echo "shm-40m=refused"; fi
rm -f /dev/shm/fill
python3 - <<'PY'
import resource
for name in ["CORE", "FSIZE", "NPROC", "STACK"]:
    soft, hard = resource.getrlimit(getattr(resource, "RLIMIT_" + name))
    print(f"{name.lower()}={soft}/{hard}")
PY
if head -c 65M /dev/zero > /tmp/big 2>/dev/null; then echo "file-65m=ok"; else echo "file-65m=refused"; fi
rm -f /tmp/big
"#,
    );
    // An eighth of the smaller of the tmpfs cap (256 MiB) and memory (2 GiB).
    assert_eq!(get(&p, "shm"), (32u64 << 20).to_string(), "{log}");
    assert_eq!(get(&p, "shm-40m"), "refused", "{log}");
    assert_eq!(get(&p, "core"), "0/0", "{log}");
    let fsize = 64u64 << 20;
    assert_eq!(get(&p, "fsize"), format!("{fsize}/{fsize}"), "{log}");
    assert_eq!(get(&p, "file-65m"), "refused", "{log}");
    // nproc is per uid across the host (all sandboxes share the uid): a
    // shared bound, never unlimited; the pids cgroup is the per-run bound.
    let shared = orchestrator::sandbox::SHARED_NPROC;
    assert_eq!(get(&p, "nproc"), format!("{shared}/{shared}"), "{log}");
    assert_ne!(get(&p, "stack").split('/').nth(1), Some("-1"), "{log}");
}

#[test]
fn kernel_details_of_the_host_are_masked() {
    let (_state, p, log, _) = probe_run(
        &[],
        r#"
for f in /proc/cmdline /proc/config.gz /sys/kernel/vmcoreinfo /proc/kcore /sys/kernel/boot_params/data; do
  echo "bytes-$f=$(cat "$f" 2>/dev/null | wc -c)"
done
"#,
    );
    for f in [
        "/proc/cmdline",
        "/proc/config.gz",
        "/sys/kernel/vmcoreinfo",
        "/proc/kcore",
        "/sys/kernel/boot_params/data",
    ] {
        assert_eq!(get(&p, &format!("bytes-{f}")), "0", "{f} readable: {log}");
    }
}

fn start_sleeper(state: &State, repo: &Path) -> Child {
    state
        .cmd()
        .args([
            "run",
            "--repo",
            repo.to_str().unwrap(),
            "--image",
            &image(),
            "--",
            "bash",
            "-c",
            "echo kept > /workspace/kept.txt; touch /workspace/.ready; sleep 600",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn watchdogs(state: &State) -> Vec<i32> {
    let out = Command::new("pgrep")
        .args(["-f", &format!("{} watchdog", state.path().display())])
        .output()
        .unwrap();
    stdout(&out)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn wait_settled(state: &State) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let run = only_run(state);
        let status = run["status"].as_str().unwrap_or_default().to_string();
        if status != "running" && status != "created" && state.containers().is_empty() {
            return run;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the run was never settled: {run}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// After `kill -9` of the supervisor, whoever settles the run (its watchdog,
/// or `nightshift reconcile` when the watchdog died too) releases the
/// worktree's mount, removes the worktree and keeps the work.
#[test]
fn no_ending_leaves_the_worktree_mount_behind() {
    for watchdog_too in [false, true] {
        let state = State::new();
        let repo = make_repo();
        let mut child = start_sleeper(&state, repo.path());
        let worktree = wait_for_worktree_file(&state, ".ready");
        assert_eq!(mounts_under(state.path()).len(), 1, "no worktree mount");
        if watchdog_too {
            let pids = watchdogs(&state);
            assert!(!pids.is_empty(), "no watchdog running");
            for p in pids {
                kill(Pid::from_raw(p), Signal::SIGKILL).unwrap();
            }
        }
        kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
        let _ = child.wait();
        if watchdog_too {
            let out = state.run(&["reconcile"]);
            assert!(out.status.success(), "{}", stderr(&out));
        }
        let run = wait_settled(&state);
        assert!(
            mounts_under(state.path()).is_empty(),
            "a mount was left: {:?}",
            mounts_under(state.path())
        );
        assert!(!worktree.exists(), "the worktree was not removed");
        let reference = run["result_ref"].as_str().expect("work imported");
        let kept = git(repo.path(), &["show", &format!("{reference}:kept.txt")]);
        assert_eq!(kept, "kept\n");
    }
}
