//! The Tier 0 properties, each a pure check of the inspected configuration.
//!
//! Invariants:
//! - [`attest`] evaluates every property in [`PROPERTY_NAMES`] order and
//!   lists each exactly once; a property's `name` is a stable kebab-case id
//!   that audit entries and refusal messages use.
//! - Each property reads its own fields only, so breaking one setting fails
//!   the properties that setting belongs to and no others (the engine itself
//!   ties some together: `--privileged` also disables SELinux labels and the
//!   masked /proc paths, and the verdict says so)
//!   (`tests/fixtures.rs::each_breakage_fails_exactly_its_property`,
//!   `tests/fixtures.rs::recorded_privileged_fails_privileged_and_what_the_engine_unmasks_with_it`).
//! - Absent values fail where the engine always reports them (booleans such
//!   as `Privileged`, limits, the worktree mount) and pass only where absence
//!   is the engine's way of saying "empty" or "default" (lists, `PidMode`)
//!   (`tests/fixtures.rs::a_nearly_empty_document_fails_closed`,
//!   `tests/fixtures.rs::hardened_without_null_fields_still_passes`).
//! - `observed` is clipped, has control characters replaced, and never
//!   contains an environment value (`tests::clip_bounds_length_and_removes_line_breaks`,
//!   `tests/random_mutations.rs::environment_values_never_reach_the_verdict`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;

use crate::host::HostObserved;
use crate::observed::{EngineKind, ObservedSandbox, Seccomp};

/// Every property id, in the order [`attest`] lists them.
pub const PROPERTY_NAMES: [&str; 29] = [
    "network-none",
    "capabilities-dropped",
    "not-privileged",
    "no-new-privileges",
    "seccomp-confined",
    "lsm-confined",
    "non-root-user",
    "read-only-root",
    "mounts-only-worktree",
    "tmpfs-only-allowed",
    "no-devices",
    "private-namespaces",
    "memory-limited",
    "oom-killer-enabled",
    "cpu-limited",
    "pids-limited",
    "env-allowlisted",
    "init-pid1",
    "log-bounded",
    "labelled",
    "no-sysctls",
    "runtime-default",
    "proc-masked",
    "no-restart",
    "user-no-host-account",
    "workspace-nosuid-nodev",
    "seccomp-profile",
    "shm-bounded",
    "ulimits-bounded",
];

/// The label whose value must be the run id.
pub const RUN_LABEL: &str = "nightshift.run";

/// /proc and /sys paths Docker masks by default (20.10; later engines add
/// more, never fewer). A container missing any of them was started with
/// `--privileged` or `systempaths=unconfined`.
pub const DEFAULT_MASKED_PATHS: [&str; 10] = [
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
];

/// What nightshift masks beyond the engine's default: the host kernel's
/// configuration, its boot command line (which can hold secrets and names
/// the host), the crash-dump layout (kernel addresses) and the boot
/// parameters the firmware handed the kernel (the physical memory map).
/// Setting `MaskedPaths` replaces the engine's list, so the engine adapter
/// sends [`DEFAULT_MASKED_PATHS`], the later engines' powercap and these.
pub const NIGHTSHIFT_MASKED_PATHS: [&str; 4] = [
    "/proc/config.gz",
    "/proc/cmdline",
    "/sys/kernel/vmcoreinfo",
    "/sys/kernel/boot_params",
];

/// Masked by Docker since 23.0 (power readings are a side channel); sent too.
pub const LATER_ENGINE_MASKED_PATHS: [&str; 1] = ["/sys/devices/virtual/powercap"];

pub const DEFAULT_READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

const ALLOWED_RUNTIMES: [&str; 3] = ["", "runc", "io.containerd.runc.v2"];

/// Longest `observed` text kept in a property; longer is cut with `…`.
const MAX_OBSERVED_CHARS: usize = 400;

/// What the supervisor meant to create, against which the observation is
/// judged. Paths are compared verbatim: give them as the engine reports
/// them (absolute, cleaned, no trailing slash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expectations {
    pub run_id: String,
    /// Host path of the run's worktree: the one writable host path.
    pub worktree_host_path: String,
    /// Where the worktree is mounted inside the sandbox (`/workspace`).
    pub workspace_target: String,
    /// The door, a read-only bind mount, when the run has one.
    pub door: Option<MountExpectation>,
    /// Exact `KEY → VALUE` pairs the supervisor sets.
    pub allowed_env: BTreeMap<String, String>,
    /// `KEY=VALUE` entries the image itself declares, allowed as they are.
    pub image_env: Vec<String>,
    pub max_memory_bytes: i64,
    pub max_pids: i64,
    /// Largest `nproc` ulimit: the kernel counts it per uid across the host
    /// (every sandbox runs as the same uid), so it bounds all sandboxes
    /// together; the pids cgroup (`max_pids`) is the per-run bound.
    pub max_nproc: i64,
    /// Container paths that may carry a tmpfs (e.g. `/tmp`, `/home/agent`).
    pub allowed_tmpfs: BTreeSet<String>,
    /// The digest of nightshift's seccomp profile ([`seccomp_profile_digest`]).
    pub seccomp_profile_digest: String,
    /// The largest `/dev/shm` allowed.
    pub max_shm_bytes: i64,
    /// The largest file a process may write (`RLIMIT_FSIZE`): the worktree cap.
    pub max_file_bytes: i64,
    /// The program that must be the container's PID 1 itself, without the
    /// engine's init (the lease wrapper: as its PID namespace's init it
    /// cannot be stopped or killed from inside); `None`: the engine's init.
    pub main_process: Option<String>,
    /// The repository's setup cache (docs/setup.md), a read-only bind
    /// mount, when the run has one: a writable one fails
    /// `mounts-only-worktree`.
    pub setup_cache: Option<MountExpectation>,
    /// The OCI runtime the owner requires (`[sandbox] runtime`, `--runtime`:
    /// `runsc`, gVisor); `None`: runc (or the engine's default).
    pub runtime: Option<String>,
}

/// The digest a seccomp profile is known by: sha256 of its canonical JSON
/// (object keys sorted, no whitespace), so that how the text was spaced or
/// which client compacted it does not matter, and any change of content
/// does. `None` when the text is not JSON.
pub fn seccomp_profile_digest(text: &str) -> Option<String> {
    use sha2::{Digest, Sha256};
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    let mut canonical = String::with_capacity(text.len());
    write_canonical(&value, &mut canonical);
    Some(hex::encode(Sha256::digest(canonical.as_bytes())))
}

fn write_canonical(value: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// A host path that must be bind-mounted read-only at `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountExpectation {
    pub host_path: String,
    pub target: String,
}

/// The verdict: every property with what was observed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attestation {
    /// The engine whose report was judged (`None`: nothing was read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineKind>,
    /// The OCI runtime the engine reported (empty: its default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    pub properties: Vec<Property>,
}

/// One Tier 0 property as observed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Property {
    /// Stable kebab-case id, one of [`PROPERTY_NAMES`].
    pub name: &'static str,
    pub ok: bool,
    /// The observed value, short; never an environment value.
    pub observed: String,
    pub expected: String,
}

impl Attestation {
    /// True when every property holds. An attestation that lists nothing
    /// proves nothing, so it does not pass.
    pub fn passed(&self) -> bool {
        !self.properties.is_empty() && self.properties.iter().all(|p| p.ok)
    }

    pub fn failures(&self) -> impl Iterator<Item = &Property> {
        self.properties.iter().filter(|p| !p.ok)
    }

    pub fn property(&self, name: &str) -> Option<&Property> {
        self.properties.iter().find(|p| p.name == name)
    }

    /// The refusal to start the run, naming each failed property.
    pub fn ensure_passed(&self) -> Result<(), Refused> {
        if self.passed() {
            Ok(())
        } else {
            Err(Refused {
                failed: self.failures().cloned().collect(),
            })
        }
    }
}

/// A run refused because its container broke Tier 0.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Refused {
    pub failed: Vec<Property>,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.failed.is_empty() {
            return write!(f, "tier 0 attestation checked no property");
        }
        write!(f, "tier 0 attestation failed: ")?;
        for (i, p) in self.failed.iter().enumerate() {
            if i > 0 {
                write!(f, "; ")?;
            }
            write!(
                f,
                "{} (observed {}, expected {})",
                p.name, p.observed, p.expected
            )?;
        }
        Ok(())
    }
}

/// Judges the observed configuration (the engine's inspect document and
/// what the supervisor saw on the host) against the expectations.
pub fn attest(
    observed: &ObservedSandbox,
    host: &HostObserved,
    expect: &Expectations,
) -> Attestation {
    let hc = observed;
    let properties = vec![
        network_none(observed),
        capabilities_dropped(hc),
        not_privileged(hc),
        no_new_privileges(hc),
        seccomp_confined(hc),
        lsm_confined(observed),
        non_root_user(observed),
        read_only_root(hc),
        mounts_only_worktree(observed, expect),
        tmpfs_only_allowed(hc, expect),
        no_devices(hc),
        private_namespaces(hc),
        memory_limited(hc, expect),
        oom_killer_enabled(hc),
        cpu_limited(hc),
        pids_limited(hc, expect),
        env_allowlisted(observed, expect),
        init_pid1(observed, expect),
        log_bounded(hc),
        labelled(observed, expect),
        no_sysctls(hc),
        runtime_default(hc, expect),
        proc_masked(hc),
        no_restart(hc),
        user_no_host_account(observed, host),
        workspace_nosuid_nodev(host),
        seccomp_profile(hc, expect),
        shm_bounded(hc, expect),
        ulimits_bounded(hc, expect),
    ];
    Attestation {
        engine: Some(observed.engine),
        runtime: Some(observed.runtime.clone().unwrap_or_default()),
        properties,
    }
}

pub(crate) fn property(
    name: &'static str,
    ok: bool,
    observed: String,
    expected: impl Into<String>,
) -> Property {
    Property {
        name,
        ok,
        observed: clip(&observed),
        expected: expected.into(),
    }
}

fn network_none(observed: &ObservedSandbox) -> Property {
    let net = &observed.network;
    let networks: Vec<&str> = net.attached.iter().map(String::as_str).collect();
    let ports: Vec<&str> = net.published_ports.iter().map(String::as_str).collect();
    let links = &net.links;
    let ok = net.mode.as_deref() == Some("none")
        && networks.iter().all(|n| *n == "none")
        && ports.is_empty()
        && net.publish_all == Some(false)
        && links.is_empty();
    property(
        "network-none",
        ok,
        format!(
            "mode={} networks=[{}] port-bindings=[{}] publish-all={} links=[{}]",
            opt(&net.mode),
            networks.join(","),
            ports.join(","),
            opt(&net.publish_all),
            links.join(","),
        ),
        "mode=none networks=[none] port-bindings=[] publish-all=false links=[]",
    )
}

fn capabilities_dropped(hc: &ObservedSandbox) -> Property {
    let drop = &hc.cap_drop;
    let add = &hc.cap_add;
    let ok = drop.iter().any(|c| c.eq_ignore_ascii_case("ALL")) && add.is_empty();
    property(
        "capabilities-dropped",
        ok,
        format!("drop=[{}] add=[{}]", drop.join(","), add.join(",")),
        "drop=[ALL] add=[]",
    )
}

fn not_privileged(hc: &ObservedSandbox) -> Property {
    property(
        "not-privileged",
        hc.privileged == Some(false),
        format!("privileged={}", opt(&hc.privileged)),
        "privileged=false",
    )
}

fn no_new_privileges(hc: &ObservedSandbox) -> Property {
    let values: Vec<Option<&str>> = hc.no_new_privileges.iter().map(|v| v.as_deref()).collect();
    // Any spelling other than bare or `true` could switch it back off (the
    // engine lets the last one win), so only those count.
    let ok = !values.is_empty() && values.iter().all(|v| matches!(v, None | Some("true")));
    let shown: Vec<String> = values
        .iter()
        .map(|v| match v {
            None => "no-new-privileges".to_owned(),
            Some(v) => format!("no-new-privileges={v}"),
        })
        .collect();
    property(
        "no-new-privileges",
        ok,
        format!("security-opt=[{}]", shown.join(",")),
        "security-opt=[no-new-privileges]",
    )
}

fn seccomp_confined(hc: &ObservedSandbox) -> Property {
    let mut unconfined = false;
    let mut custom = false;
    for setting in &hc.seccomp {
        match setting {
            Seccomp::Unconfined => unconfined = true,
            Seccomp::Profile { .. } => custom = true,
        }
    }
    // A custom profile is shown only as "custom": its text is long and says
    // nothing a reader of the audit needs.
    let shown = match (unconfined, custom) {
        (true, _) => "unconfined",
        (false, true) => "custom",
        (false, false) => "default",
    };
    property(
        "seccomp-confined",
        !unconfined,
        format!("seccomp={shown}"),
        "seccomp=default or a custom profile",
    )
}

fn lsm_confined(observed: &ObservedSandbox) -> Property {
    let mut bad: Vec<String> = Vec::new();
    for (key, value) in &observed.lsm_options {
        let value = value.as_str();
        let refused = match key.as_str() {
            "apparmor" => value == "unconfined",
            "label" => {
                value == "disable" || value.contains("spc_t") || value.contains("unconfined_t")
            }
            _ => false,
        };
        if refused {
            bad.push(format!("{key}={value}"));
        }
    }
    let profile = observed.apparmor_profile.as_deref().unwrap_or("");
    if profile == "unconfined" {
        bad.push("apparmor-profile=unconfined".to_owned());
    }
    let ok = bad.is_empty();
    property(
        "lsm-confined",
        ok,
        if ok {
            format!("apparmor-profile={profile:?} no unconfining option")
        } else {
            format!("unconfined by [{}]", bad.join(","))
        },
        "no apparmor=unconfined, no label=disable or privileged selinux type",
    )
}

/// A numeric id other than 0. Names are refused because what they resolve
/// to depends on files inside the image, which the inspect does not show.
fn non_root_id(s: &str) -> bool {
    matches!(s.parse::<u32>(), Ok(id) if id != 0)
}

fn non_root_user(observed: &ObservedSandbox) -> Property {
    let user = observed.user.as_deref().unwrap_or("");
    // A uid alone is refused too: its group then comes from the image's
    // /etc/passwd, and is 0 when the uid has no entry there.
    let user_ok = match user.split_once(':') {
        Some((uid, gid)) => non_root_id(uid) && non_root_id(gid),
        None => false,
    };
    let groups = &observed.extra_groups;
    let groups_ok = groups.iter().all(|g| non_root_id(g));
    property(
        "non-root-user",
        user_ok && groups_ok,
        format!("user={user:?} group-add=[{}]", groups.join(",")),
        "numeric uid:gid, both non-zero; group-add numeric, non-zero",
    )
}

fn read_only_root(hc: &ObservedSandbox) -> Property {
    property(
        "read-only-root",
        hc.read_only_root == Some(true),
        format!("readonly-rootfs={}", opt(&hc.read_only_root)),
        "readonly-rootfs=true",
    )
}

struct WantedMount<'a> {
    what: &'static str,
    source: &'a str,
    target: &'a str,
    rw: bool,
}

fn rw_word(rw: bool) -> &'static str {
    if rw {
        "rw"
    } else {
        "ro"
    }
}

fn mounts_only_worktree(observed: &ObservedSandbox, expect: &Expectations) -> Property {
    let hc = observed;
    let mut wanted = vec![WantedMount {
        what: "worktree",
        source: &expect.worktree_host_path,
        target: &expect.workspace_target,
        rw: true,
    }];
    if let Some(door) = &expect.door {
        wanted.push(WantedMount {
            what: "door",
            source: &door.host_path,
            target: &door.target,
            rw: false,
        });
    }
    if let Some(cache) = &expect.setup_cache {
        wanted.push(WantedMount {
            what: "setup cache",
            source: &cache.host_path,
            target: &cache.target,
            rw: false,
        });
    }
    let find = |source: &str, target: &str| {
        wanted
            .iter()
            .position(|w| w.source == source && w.target == target)
    };

    let mut problems: Vec<String> = Vec::new();
    let mut seen = vec![false; wanted.len()];
    let mut shown: Vec<String> = Vec::new();

    // The engine's own list of what it mounted is the observation that
    // counts; the requested lists below only catch additions it hides.
    for m in &observed.mounts {
        let kind = m.kind.as_deref().unwrap_or("");
        let source = m.source.as_deref().unwrap_or("");
        let dest = m.destination.as_deref().unwrap_or("");
        let rw = m.rw;
        let desc = match kind {
            "volume" => format!(
                "volume {} -> {dest} {}",
                m.name.as_deref().unwrap_or(source),
                rw.map_or("rw?", rw_word)
            ),
            "tmpfs" => format!("tmpfs -> {dest}"),
            _ => format!("{kind} {source} -> {dest} {}", rw.map_or("rw?", rw_word)),
        };
        shown.push(desc.clone());
        match (kind, find(source, dest)) {
            ("bind", Some(i)) if !seen[i] => {
                seen[i] = true;
                if rw != Some(wanted[i].rw) {
                    problems.push(format!(
                        "{} mount is {} (expected {})",
                        wanted[i].what,
                        rw.map_or("rw?", rw_word),
                        rw_word(wanted[i].rw)
                    ));
                }
            }
            _ => problems.push(format!("unexpected {desc}")),
        }
    }
    for (w, seen) in wanted.iter().zip(&seen) {
        if !seen {
            problems.push(format!(
                "missing {} bind {} -> {} {}",
                w.what,
                w.source,
                w.target,
                rw_word(w.rw)
            ));
        }
    }
    for bind in &hc.requested_binds {
        let mut parts = bind.splitn(3, ':');
        let source = parts.next().unwrap_or("");
        let target = parts.next().unwrap_or("");
        let ro = parts
            .next()
            .is_some_and(|o| o.split(',').any(|o| o == "ro"));
        match find(source, target) {
            Some(i) if wanted[i].rw != ro => {}
            _ => problems.push(format!("unexpected binds entry {bind}")),
        }
    }
    for m in &hc.requested_mounts {
        let kind = m.kind.as_deref().unwrap_or("");
        let source = m.source.as_deref().unwrap_or("");
        let target = m.target.as_deref().unwrap_or("");
        let rw = !m.read_only.unwrap_or(false);
        match find(source, target) {
            Some(i) if kind == "bind" && wanted[i].rw == rw => {}
            _ => problems.push(format!(
                "unexpected requested {kind} {source} -> {target} {}",
                rw_word(rw)
            )),
        }
    }
    for from in &hc.volumes_from {
        problems.push(format!("volumes-from {from}"));
    }

    let mut expected = match &expect.door {
        None => format!(
            "only bind {} -> {} rw",
            expect.worktree_host_path, expect.workspace_target
        ),
        Some(door) => format!(
            "only bind {} -> {} rw and bind {} -> {} ro",
            expect.worktree_host_path, expect.workspace_target, door.host_path, door.target
        ),
    };
    if let Some(cache) = &expect.setup_cache {
        expected.push_str(&format!(
            " and setup cache bind {} -> {} ro",
            cache.host_path, cache.target
        ));
    }
    let ok = problems.is_empty();
    let observed = if ok {
        shown.join("; ")
    } else {
        problems.join("; ")
    };
    property("mounts-only-worktree", ok, observed, expected)
}

/// A tmpfs `size=` value the kernel treats as a bound: a positive byte
/// count with an optional k/m/g suffix. `0` means unlimited to tmpfs, and a
/// percentage is relative to the host's memory, so both are refused.
fn bounded_size(value: &str) -> bool {
    let digits = value.trim_end_matches(['k', 'K', 'm', 'M', 'g', 'G']);
    if value.len() - digits.len() > 1 {
        return false;
    }
    matches!(digits.parse::<u64>(), Ok(n) if n > 0)
}

fn tmpfs_only_allowed(hc: &ObservedSandbox, expect: &Expectations) -> Property {
    let mut shown = Vec::new();
    let mut ok = true;
    for (target, options) in &hc.tmpfs {
        // The kernel applies the last `size=`, so that is the one to judge.
        let size = options
            .split(',')
            .filter_map(|o| o.strip_prefix("size="))
            .next_back();
        let allowed = expect.allowed_tmpfs.contains(target);
        let bounded = size.is_some_and(bounded_size);
        ok &= allowed && bounded;
        shown.push(format!(
            "{target} size={}{}",
            size.unwrap_or("none"),
            if allowed { "" } else { " (not allowed)" }
        ));
    }
    let allowed: Vec<&str> = expect.allowed_tmpfs.iter().map(String::as_str).collect();
    property(
        "tmpfs-only-allowed",
        ok,
        format!("[{}]", shown.join(", ")),
        format!("tmpfs only at [{}], each with a size", allowed.join(",")),
    )
}

fn no_devices(hc: &ObservedSandbox) -> Property {
    let devices = &hc.devices;
    let rules = &hc.device_cgroup_rules;
    let requests = &hc.device_requests;
    let ok = devices.is_empty() && rules.is_empty() && requests.is_empty();
    property(
        "no-devices",
        ok,
        format!(
            "devices=[{}] cgroup-rules=[{}] requests=[{}]",
            devices.join(","),
            rules.join(","),
            requests.join(",")
        ),
        "devices=[] cgroup-rules=[] requests=[]",
    )
}

fn private_namespaces(hc: &ObservedSandbox) -> Property {
    let shared = |mode: &Option<String>| {
        mode.as_deref()
            .is_some_and(|m| m == "host" || m.starts_with("container:"))
    };
    let ns = &hc.namespaces;
    let ok = !shared(&ns.pid)
        && !shared(&ns.ipc)
        && !shared(&ns.uts)
        && !shared(&ns.user)
        && !shared(&ns.cgroup)
        && ns.cgroupns.as_deref() == Some("private");
    // Empty means the engine's default, which is private for all of these.
    let show = |m: &Option<String>| m.as_deref().unwrap_or("").to_owned();
    property(
        "private-namespaces",
        ok,
        format!(
            "pid={:?} ipc={:?} uts={:?} userns={:?} cgroup={:?} cgroupns={}",
            show(&ns.pid),
            show(&ns.ipc),
            show(&ns.uts),
            show(&ns.user),
            show(&ns.cgroup),
            opt(&ns.cgroupns),
        ),
        "no host or container: namespace; cgroupns=private",
    )
}

fn memory_limited(o: &ObservedSandbox, expect: &Expectations) -> Property {
    let hc = &o.limits;
    let ok = match (hc.memory, hc.memory_swap) {
        (Some(m), Some(swap)) => m > 0 && m <= expect.max_memory_bytes && swap == m,
        _ => false,
    };
    property(
        "memory-limited",
        ok,
        format!("memory={} swap={}", opt(&hc.memory), opt(&hc.memory_swap)),
        format!(
            "0 < memory <= {} and swap == memory",
            expect.max_memory_bytes
        ),
    )
}

fn oom_killer_enabled(o: &ObservedSandbox) -> Property {
    let hc = &o.limits;
    // `null` is how the engine says the setting was never made: enabled.
    let ok = hc.oom_kill_disable != Some(true) && hc.oom_score_adj.unwrap_or(0) >= 0;
    property(
        "oom-killer-enabled",
        ok,
        format!(
            "oom-kill-disable={} oom-score-adj={}",
            opt(&hc.oom_kill_disable),
            opt(&hc.oom_score_adj)
        ),
        "oom-kill-disable not true, oom-score-adj >= 0",
    )
}

fn cpu_limited(o: &ObservedSandbox) -> Property {
    let hc = &o.limits;
    let ok = hc.nano_cpus.is_some_and(|n| n > 0) || hc.cpu_quota.is_some_and(|q| q > 0);
    property(
        "cpu-limited",
        ok,
        format!(
            "nano-cpus={} cpu-quota={}",
            opt(&hc.nano_cpus),
            opt(&hc.cpu_quota)
        ),
        "nano-cpus > 0 or cpu-quota > 0",
    )
}

fn pids_limited(o: &ObservedSandbox, expect: &Expectations) -> Property {
    let hc = &o.limits;
    let ok = hc.pids.is_some_and(|p| p > 0 && p <= expect.max_pids);
    property(
        "pids-limited",
        ok,
        format!("pids-limit={}", opt(&hc.pids)),
        format!("0 < pids-limit <= {}", expect.max_pids),
    )
}

/// An environment key as it may be shown: restricted to the characters
/// keys are made of, so a value pasted where a key should be cannot leak
/// whole.
fn shown_key(key: &str) -> String {
    if key.is_empty() {
        return "(empty)".to_owned();
    }
    key.chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '?'
            }
        })
        .collect()
}

fn env_allowlisted(observed: &ObservedSandbox, expect: &Expectations) -> Property {
    let env = &observed.env;
    let mut offending: Vec<String> = Vec::new();
    for entry in env {
        let allowed_pair = entry
            .split_once('=')
            .is_some_and(|(k, v)| expect.allowed_env.get(k).is_some_and(|want| want == v));
        if !(allowed_pair
            || expect.image_env.contains(entry)
            || observed.engine_env.contains(entry))
        {
            let key = entry.split_once('=').map_or(entry.as_str(), |(k, _)| k);
            let key = shown_key(key);
            if !offending.contains(&key) {
                offending.push(key);
            }
        }
    }
    let ok = offending.is_empty();
    let keys: Vec<&str> = expect.allowed_env.keys().map(String::as_str).collect();
    property(
        "env-allowlisted",
        ok,
        if ok {
            format!("{} entries, all allowed", env.len())
        } else {
            format!("not allowed: [{}]", offending.join(","))
        },
        format!(
            "only the supervisor's values for [{}] and the image's own entries",
            keys.join(",")
        ),
    )
}

fn init_pid1(observed: &ObservedSandbox, expect: &Expectations) -> Property {
    let init = observed.engine_init;
    let path = observed.main_process.as_deref();
    let shown = format!("init={} path={}", opt(&init), path.unwrap_or("<none>"));
    match &expect.main_process {
        // The engine's init would be PID 1 and the wrapper its child, which
        // the agent (its sibling's parent, same uid) could stop.
        Some(main) => property(
            "init-pid1",
            init != Some(true) && path == Some(main.as_str()),
            shown,
            format!("init=false path={main}"),
        ),
        None => property("init-pid1", init == Some(true), shown, "init=true"),
    }
}

fn log_bounded(hc: &ObservedSandbox) -> Property {
    let kind = hc.log_driver.as_deref();
    let max_size = hc.log_max_size.as_deref();
    let ok = match kind {
        Some("none") => true,
        Some("json-file" | "local") => max_size.is_some(),
        _ => false,
    };
    property(
        "log-bounded",
        ok,
        format!(
            "driver={} max-size={}",
            kind.unwrap_or("absent"),
            max_size.unwrap_or("none")
        ),
        "driver=none, or json-file/local with a max-size",
    )
}

fn labelled(observed: &ObservedSandbox, expect: &Expectations) -> Property {
    let value = observed.labels.get(RUN_LABEL);
    property(
        "labelled",
        value == Some(&expect.run_id),
        format!("{RUN_LABEL}={}", value.map_or("absent", String::as_str)),
        format!("{RUN_LABEL}={}", expect.run_id),
    )
}

fn no_sysctls(hc: &ObservedSandbox) -> Property {
    let keys: Vec<&str> = hc.sysctls.iter().map(String::as_str).collect();
    property(
        "no-sysctls",
        keys.is_empty(),
        format!("sysctls=[{}]", keys.join(",")),
        "sysctls=[]",
    )
}

fn runtime_default(hc: &ObservedSandbox, expect: &Expectations) -> Property {
    let runtime = hc.runtime.as_deref().unwrap_or("");
    match &expect.runtime {
        // The owner requires this one: nothing else, runc included.
        Some(required) => property(
            "runtime-default",
            runtime == required,
            format!("runtime={runtime:?}"),
            format!("runtime {required} (required)"),
        ),
        None => property(
            "runtime-default",
            ALLOWED_RUNTIMES.contains(&runtime),
            format!("runtime={runtime:?}"),
            "runtime runc (or the engine default)",
        ),
    }
}

fn proc_masked(hc: &ObservedSandbox) -> Property {
    let masked = list(&hc.masked_paths);
    let readonly = list(&hc.readonly_paths);
    let missing: Vec<&str> = DEFAULT_MASKED_PATHS
        .iter()
        .chain(NIGHTSHIFT_MASKED_PATHS.iter())
        .filter(|p| !masked.iter().any(|m| m == *p))
        .chain(
            DEFAULT_READONLY_PATHS
                .iter()
                .filter(|p| !readonly.iter().any(|r| r == *p)),
        )
        .copied()
        .collect();
    let unconfined = hc.system_paths_unconfined;
    // A privileged container is masked nothing, whatever its list says.
    let privileged = hc.privileged == Some(true);
    let ok = missing.is_empty() && !unconfined && !privileged;
    property(
        "proc-masked",
        ok,
        if ok {
            format!("masked={} read-only={} paths", masked.len(), readonly.len())
        } else {
            format!(
                "not masked: [{}]{}{}",
                missing.join(","),
                if unconfined {
                    " systempaths=unconfined"
                } else {
                    ""
                },
                if privileged {
                    " privileged (the engine masks nothing)"
                } else {
                    ""
                }
            )
        },
        "the engine's default masked and read-only /proc and /sys paths, and /proc/config.gz, /proc/cmdline, /sys/kernel/vmcoreinfo, /sys/kernel/boot_params masked",
    )
}

fn no_restart(hc: &ObservedSandbox) -> Property {
    // A restart policy would bring a killed sandbox back behind the
    // supervisor's (and the kill switch's) back.
    let name = hc.restart_policy.as_deref().unwrap_or("");
    property(
        "no-restart",
        name.is_empty() || name == "no",
        format!("restart={name:?}"),
        "restart=no",
    )
}

fn user_no_host_account(observed: &ObservedSandbox, host: &HostObserved) -> Property {
    let user = observed.user.as_deref().unwrap_or("");
    let ids = user
        .split_once(':')
        .and_then(|(u, g)| Some((u.parse::<u32>().ok()?, g.parse::<u32>().ok()?)));
    // Root and names are `non-root-user`'s to refuse; this one judges the
    // non-zero numeric ids against the host.
    let (ok, shown) = match ids {
        None => (
            true,
            format!("user={user:?}: no numeric uid:gid to look up"),
        ),
        Some((0, _) | (_, 0)) => (true, format!("user={user:?}: root is not looked up")),
        Some((uid, gid)) => {
            let clashes = host.accounts.clashes(uid, gid);
            if clashes.is_empty() {
                (
                    true,
                    format!(
                        "{uid}:{gid} is no host account ({} users, {} groups, {} delegated ranges read)",
                        host.accounts.users.len(),
                        host.accounts.groups.len(),
                        host.accounts.sub_uids.len() + host.accounts.sub_gids.len()
                    ),
                )
            } else {
                let shown: Vec<String> = clashes.iter().map(ToString::to_string).collect();
                (false, shown.join("; "))
            }
        }
    };
    property(
        "user-no-host-account",
        ok,
        shown,
        "a uid and gid that no host user, group or delegated id range has",
    )
}

fn workspace_nosuid_nodev(host: &HostObserved) -> Property {
    // runc bind-mounts the worktree with no options of its own, so the
    // sandbox's mount carries the flags of the host mount it is a copy of.
    let (ok, shown) = match &host.worktree_mount {
        None => (false, "no host mount found for the worktree".to_owned()),
        Some(m) => (
            m.has("nosuid") && m.has("nodev"),
            format!("{} {}", m.mount_point, m.options.join(",")),
        ),
    };
    property(
        "workspace-nosuid-nodev",
        ok,
        shown,
        "the host mount the worktree lies on is nosuid,nodev",
    )
}

fn seccomp_profile(hc: &ObservedSandbox, expect: &Expectations) -> Property {
    // `seccomp-confined` judges `unconfined`; this one judges content.
    let profiles: Vec<Option<String>> = hc
        .seccomp
        .iter()
        .filter_map(|s| match s {
            Seccomp::Unconfined => None,
            Seccomp::Profile { digest } => Some(digest.clone()),
        })
        .collect();
    // The engine applies no profile at all to a privileged container.
    let privileged = hc.privileged == Some(true);
    let ok = !privileged
        && !profiles.is_empty()
        && profiles
            .iter()
            .all(|d| d.as_deref() == Some(expect.seccomp_profile_digest.as_str()));
    let shown: Vec<String> = profiles
        .iter()
        .map(|d| match d {
            Some(d) => format!("sha256:{}", &d[..16.min(d.len())]),
            None => "unreadable".to_owned(),
        })
        .collect();
    property(
        "seccomp-profile",
        ok,
        match (privileged, profiles.is_empty()) {
            (true, _) => "privileged: the engine applies no profile".to_owned(),
            (false, true) => "the engine's default profile".to_owned(),
            (false, false) => format!("profiles=[{}]", shown.join(",")),
        },
        format!(
            "nightshift's profile, sha256:{}",
            &expect.seccomp_profile_digest[..16.min(expect.seccomp_profile_digest.len())]
        ),
    )
}

fn shm_bounded(hc: &ObservedSandbox, expect: &Expectations) -> Property {
    let ok = hc
        .limits
        .shm_size
        .is_some_and(|s| s > 0 && s <= expect.max_shm_bytes);
    property(
        "shm-bounded",
        ok,
        format!("shm-size={}", opt(&hc.limits.shm_size)),
        format!("0 < shm-size <= {}", expect.max_shm_bytes),
    )
}

fn ulimits_bounded(hc: &ObservedSandbox, expect: &Expectations) -> Property {
    let limit = |name: &str| {
        hc.limits
            .rlimits
            .iter()
            .filter(|u| u.name == name)
            .map(|u| (u.soft, u.hard))
            .next_back()
    };
    // The engine applies the last entry of a name; soft may not exceed hard.
    let within = |name: &str, max: i64, min: i64| matches!(limit(name), Some((Some(soft), Some(hard))) if hard >= min && hard <= max && soft <= hard && soft >= 0);
    let ok = within("core", 0, 0)
        && within("fsize", expect.max_file_bytes, 1)
        && within("nproc", expect.max_nproc, 1);
    let show = |name: &str| match limit(name) {
        None => format!("{name}=unset"),
        Some((soft, hard)) => format!("{name}={}/{}", opt(&soft), opt(&hard)),
    };
    property(
        "ulimits-bounded",
        ok,
        format!("{} {} {}", show("core"), show("fsize"), show("nproc")),
        format!(
            "core=0/0, 0 < fsize <= {}, 0 < nproc <= {}",
            expect.max_file_bytes, expect.max_nproc
        ),
    )
}

fn list(v: &Option<Vec<String>>) -> &[String] {
    v.as_deref().unwrap_or_default()
}

fn opt<T: fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "absent".to_owned(), T::to_string)
}

/// Keeps `observed` a short single line: audit entries are small, and an
/// engine value must not be able to forge extra lines in a log.
fn clip(s: &str) -> String {
    let mut out: String = s
        .chars()
        .take(MAX_OBSERVED_CHARS)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if s.chars().nth(MAX_OBSERVED_CHARS).is_some() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::observed::split_security_opt;

    #[test]
    fn security_opts_split_like_the_engine() {
        assert_eq!(
            split_security_opt("seccomp=unconfined"),
            ("seccomp", Some("unconfined"))
        );
        assert_eq!(
            split_security_opt("seccomp:unconfined"),
            ("seccomp", Some("unconfined"))
        );
        assert_eq!(
            split_security_opt("no-new-privileges"),
            ("no-new-privileges", None)
        );
        assert_eq!(
            split_security_opt("label=type:spc_t"),
            ("label", Some("type:spc_t"))
        );
    }

    #[test]
    fn tmpfs_sizes_must_be_positive_absolute_bounds() {
        assert!(bounded_size("67108864"));
        assert!(bounded_size("64m"));
        assert!(bounded_size("1G"));
        assert!(!bounded_size("0"));
        assert!(!bounded_size("50%"));
        assert!(!bounded_size(""));
        assert!(!bounded_size("64mm"));
        assert!(!bounded_size("-1"));
    }

    #[test]
    fn only_numeric_non_zero_ids_count_as_non_root() {
        assert!(non_root_id("1000"));
        assert!(!non_root_id("0"));
        assert!(!non_root_id("agent"));
        assert!(!non_root_id(""));
        assert!(!non_root_id("-1"));
    }

    #[test]
    fn clip_bounds_length_and_removes_line_breaks() {
        let long = "a\n".repeat(MAX_OBSERVED_CHARS);
        let clipped = clip(&long);
        assert!(!clipped.contains('\n'));
        assert_eq!(clipped.chars().count(), MAX_OBSERVED_CHARS + 1);
        assert!(clipped.ends_with('…'));
        assert_eq!(clip("short"), "short");
    }

    #[test]
    fn shown_keys_cannot_carry_arbitrary_text() {
        assert_eq!(shown_key("SECRET_TOKEN"), "SECRET_TOKEN");
        assert_eq!(shown_key("a b/c"), "a?b?c");
        assert_eq!(shown_key(""), "(empty)");
        assert_eq!(shown_key(&"K".repeat(100)).len(), 64);
    }

    #[test]
    fn names_are_unique_kebab_case_ids() {
        let unique: BTreeSet<&str> = PROPERTY_NAMES.iter().copied().collect();
        assert_eq!(unique.len(), PROPERTY_NAMES.len());
        for name in PROPERTY_NAMES {
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{name}"
            );
        }
    }

    #[test]
    fn an_empty_attestation_does_not_pass() {
        let empty = Attestation {
            engine: None,
            runtime: None,
            properties: vec![],
        };
        assert!(!empty.passed());
        assert!(empty.ensure_passed().is_err());
    }
}
