//! The probes a sandbox is tested with from inside, shared by every engine's
//! suite (`tests/tests/sandbox_probes.rs` on Docker and Podman,
//! `tests/tests/kube_play.rs` for the Pod spec under `podman kube play`):
//! each prints `name=value` lines that [`probes`] reads.

/// A value the host sets in its own environment; it must never be seen inside.
pub const SECRET: &str = "sentinel-secret-7d1f0c2a";

/// The calls nightshift's seccomp profile refuses with EPERM (`errno1`).
pub const REFUSED_CALLS: [&str; 14] = [
    "io_uring_setup",
    "ptrace_attach",
    "bpf",
    "userfaultfd",
    "perf_event_open",
    "add_key",
    "keyctl",
    "personality_no_aslr",
    "unshare_user",
    "socket_vsock",
    "socket_netlink_audit",
    "socket_netlink_uevent",
    "socket_packet",
    "socket_alg",
];

/// What ordinary work needs, which the profile allows.
pub const ALLOWED_CALLS: [&str; 4] = [
    "socket_netlink_route",
    "socket_unix",
    "socket_inet",
    "socket_inet6",
];

/// Each probe prints `name=value`; the test reads them from the run's output.
pub fn probe_script(port: u16) -> String {
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

pub fn probes(output: &str) -> std::collections::BTreeMap<String, String> {
    output
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

pub fn get<'a>(p: &'a std::collections::BTreeMap<String, String>, k: &str) -> &'a str {
    p.get(k).map(String::as_str).unwrap_or("<missing>")
}

/// The syscalls nightshift's profile refuses, each tried with ctypes: the
/// errno the kernel returned (EPERM, 1, is the filter's answer), or `ok`.
pub const SYSCALL_PROBES: &str = r#"
python3 - <<'PY'
import ctypes, errno, os, socket, subprocess
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(name, nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    print(f"{name}=" + ("ok" if r >= 0 else f"errno{ctypes.get_errno()}"))
params = ctypes.create_string_buffer(120)
sc("io_uring_setup", 425, 4, ctypes.addressof(params))
child = subprocess.Popen(["sleep", "30"])
sc("ptrace_attach", 101, 16, child.pid, 0, 0)
child.kill(); child.wait()
sc("bpf", 321, 0, 0, 0)
sc("userfaultfd", 323, 0)
attr = ctypes.create_string_buffer(128)
ctypes.memmove(attr, (1).to_bytes(4, "little") + (128).to_bytes(4, "little"), 8)
sc("perf_event_open", 298, ctypes.addressof(attr), 0, -1, -1, 0)
sc("add_key", 248, ctypes.addressof(ctypes.create_string_buffer(b"user")), ctypes.addressof(ctypes.create_string_buffer(b"k")), ctypes.addressof(ctypes.create_string_buffer(b"v")), 1, -2)
sc("keyctl", 250, 0, -2, 0)
sc("personality_no_aslr", 135, 0x0040000)
sc("unshare_user", 272, 0x10000000)
def sock(name, family, kind, proto=0):
    try:
        socket.socket(family, kind, proto).close()
        print(f"{name}=ok")
    except OSError as e:
        print(f"{name}=errno{e.errno}")
sock("socket_vsock", 40, socket.SOCK_STREAM)
sock("socket_netlink_audit", socket.AF_NETLINK, socket.SOCK_RAW, 9)
sock("socket_netlink_uevent", socket.AF_NETLINK, socket.SOCK_RAW, 15)
sock("socket_netlink_route", socket.AF_NETLINK, socket.SOCK_RAW, 0)
sock("socket_unix", socket.AF_UNIX, socket.SOCK_STREAM)
sock("socket_inet", socket.AF_INET, socket.SOCK_STREAM)
sock("socket_inet6", socket.AF_INET6, socket.SOCK_DGRAM)
sock("socket_packet", 17, socket.SOCK_RAW)
sock("socket_alg", 38, socket.SOCK_SEQPACKET)
print("interfaces=" + ",".join(n for _, n in socket.if_nameindex()))
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
cli = socket.create_connection(srv.getsockname()); conn, _ = srv.accept()
cli.sendall(b"hi"); print("loopback=" + conn.recv(2).decode())
PY
cd /workspace && echo more >> README.md && git commit -qam "probe commit" && echo "git=committed"
"#;

/// The probes every Tier 0 sandbox passes whatever its engine: no name
/// resolution, no connection out, no engine socket, no capability, the
/// sandbox's own uid, no secret in its environment, no writable root.
pub fn assert_no_way_out(p: &std::collections::BTreeMap<String, String>, log: &str) {
    assert_eq!(get(p, "dns"), "failed", "{log}");
    for host in ["127.0.0.1", "172.17.0.1", "10.0.2.2", "8.8.8.8"] {
        assert_eq!(get(p, &format!("tcp-{host}")), "failed", "{log}");
    }
    assert_eq!(get(p, "engine-/var/run/docker.sock"), "failed", "{log}");
    assert_eq!(get(p, "env-secret"), "absent", "{log}");
    assert_eq!(get(p, "proc-secret"), "absent", "{log}");
    assert_eq!(get(p, "capeff"), "0000000000000000", "{log}");
    assert_eq!(get(p, "uid"), "2000000000", "{log}");
    for path in [
        "/etc/probe",
        "/usr/probe",
        "/probe",
        "/var/probe",
        "/run/probe",
    ] {
        assert_eq!(get(p, &format!("write-{path}")), "denied", "{log}");
    }
}

/// nightshift's seccomp profile as the syscall probes see it: every call it
/// refuses answered EPERM, what ordinary work needs allowed, loopback up.
pub fn assert_profile_holds(p: &std::collections::BTreeMap<String, String>, log: &str) {
    for call in REFUSED_CALLS {
        assert_eq!(get(p, call), "errno1", "{call} was not refused: {log}");
    }
    for call in ALLOWED_CALLS {
        assert_eq!(get(p, call), "ok", "{call}: {log}");
    }
    assert_eq!(get(p, "loopback"), "hi", "{log}");
}
