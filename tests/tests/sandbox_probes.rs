//! Probes run inside a real sandbox: Tier 0 as the agent experiences it.

use std::net::TcpListener;

use tests::{image, make_repo, only_run, stderr, State};

const SECRET: &str = "sentinel-secret-7d1f0c2a";

/// Each probe prints `name=value`; the test reads them from the run's output.
fn probe_script(port: u16) -> String {
    format!(
        r#"
echo "interfaces=$(ls /sys/class/net | tr '\n' ' ')"
python3 - <<'PY'
import socket
try:
    socket.getaddrinfo("deb.debian.org", 80)
    print("dns=resolved")
except Exception as e:
    print("dns=failed")
for host in ["127.0.0.1", "172.17.0.1", "10.0.2.2", "8.8.8.8"]:
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((host, {port}))
        print(f"tcp-{{host}}=connected")
    except Exception as e:
        print(f"tcp-{{host}}=failed")
    finally:
        s.close()
for path in ["/var/run/docker.sock", "/run/docker.sock"]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        print(f"engine-{{path}}=connected")
    except Exception:
        print(f"engine-{{path}}=failed")
PY
if env | grep -q {SECRET}; then echo "env-secret=present"; else echo "env-secret=absent"; fi
if cat /proc/*/environ 2>/dev/null | tr '\0' '\n' | grep -q {SECRET}; then echo "proc-secret=present"; else echo "proc-secret=absent"; fi
echo "capeff=$(grep CapEff /proc/self/status | awk '{{print $2}}')"
echo "uid=$(id -u)"
for p in /etc/probe /usr/probe /probe /var/probe /run/probe; do
  if touch "$p" 2>/dev/null; then echo "write-$p=ok"; else echo "write-$p=denied"; fi
done
for p in /workspace/probe /tmp/probe "$HOME/probe"; do
  if touch "$p" 2>/dev/null; then echo "write-$p=ok"; else echo "write-$p=denied"; fi
done
rm -f /workspace/probe
echo "pid1=$(cat /proc/1/comm)"
"#
    )
}

fn probes(output: &str) -> std::collections::BTreeMap<String, String> {
    output
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

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
    assert_eq!(get("uid"), "1000");
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
    assert_eq!(get("pid1"), "docker-init");
    drop(listener);
    assert!(state.containers().is_empty());
}
