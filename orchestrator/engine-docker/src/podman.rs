//! Rootful Podman as the engine (`--engine podman`, docs/engines.md): what
//! differs from Docker. Everything but creation and the extra observation
//! goes through Podman's Docker-compatible API with the same client as
//! Docker ([`crate::engine`]); a sandbox (and a run's setup container) is
//! created through Podman's own API (`/libpod/containers/create`), because the compatible one drops the
//! cgroup namespace (`CgroupnsMode`), masks nothing it is asked to
//! (`MaskedPaths`), refuses tmpfs `uid=`/`gid=`, and takes a seccomp profile
//! by path, not by its text.
//!
//! Invariants:
//! - Only a rootful service is used: a rootless one is refused when
//!   connecting (`tests::rootless_or_unknown_services_are_refused`).
//! - A sandbox is created from the same [`SandboxSpec`] as on Docker, with
//!   the same hardening; where Podman needs another spelling the request
//!   says so here: the seccomp profile as a file named by its digest in a
//!   root-only folder, the home tmpfs owned by the sandbox user through
//!   Podman's `U` option, and `/run` and `/var/tmp` (which Podman mounts on
//!   a read-only root) as sized tmpfs
//!   (`orchestrator/attest/tests/podman.rs::an_unsized_podman_run_tmpfs_fails`).
//! - A run's setup container (docs/setup.md) is made the same way, from
//!   its own `SetupSpec`: the same hardening, Podman's bridge network and
//!   only the setup's mounts (never a door or a worktree), with open-file
//!   and process limits the service can set
//!   (`tests::a_setup_request_has_the_bridge_and_its_mounts_but_no_door_or_worktree`,
//!   `tests/tests/setup.rs` under `NIGHTSHIFT_TEST_ENGINE=podman`).
//! - The container is initialised (`podman init`: the runtime's bundle is
//!   written, no process of the sandbox runs) before it is observed, and the
//!   observation hands the attestation what the runtime was given (its OCI
//!   configuration: masked paths, namespaces, the seccomp filter) beside
//!   both inspect documents
//!   (`tests/tests/attestation.rs::a_container_that_breaks_tier0_never_starts`
//!   under `NIGHTSHIFT_TEST_ENGINE=podman`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use nightshift_core::container_engine::EngineError;
use nightshift_core::sandbox::{
    Caps, SandboxSpec, DOOR_MOUNT, SECCOMP_PROFILE, SHARED_NPROC, WORKSPACE,
};
use nightshift_core::setup::{
    SetupSpec, CACHE_MOUNT as SETUP_CACHE, CA_MOUNT as SETUP_CA, CHECKOUT_MOUNT as SETUP_CHECKOUT,
};

/// Podman's own init (Debian's path), PID 1 where nightshift's lease
/// wrapper is not.
const CATATONIT: &str = "/usr/libexec/podman/catatonit";

/// Podman's own API version this adapter speaks (Podman 4.x).
const LIBPOD: &str = "/v4.0.0/libpod";

/// The tmpfs Podman mounts on a read-only root unless told otherwise, and
/// the size nightshift gives each (nothing of nightshift's is written there
/// but the door's mount point under `/run`).
pub const PODMAN_TMPFS: [(&str, &str); 2] = [
    ("/run", "rw,nosuid,nodev,noexec,size=1048576,mode=0755"),
    ("/var/tmp", "rw,nosuid,nodev,size=1048576,mode=1777"),
];

/// The folder of nightshift's Podman service and its files
/// (`scripts/podman.sh`): `NIGHTSHIFT_PODMAN_DIR`, else
/// `/run/nightshift-podman`.
pub fn podman_dir() -> PathBuf {
    std::env::var_os("NIGHTSHIFT_PODMAN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/nightshift-podman"))
}

/// The endpoint of nightshift's Podman service for a runtime: the default
/// (runc) at `NIGHTSHIFT_PODMAN_HOST`, else `podman.sock` in
/// [`podman_dir`]; gVisor (`runsc`) at its own service's `podman-runsc.sock`
/// (Podman 4.3 runs every container of a service with the service's
/// runtime; scripts/podman.sh starts both).
pub fn podman_endpoint(runtime: Option<&str>) -> String {
    match runtime {
        Some("runsc") => format!("unix://{}/podman-runsc.sock", podman_dir().display()),
        _ => std::env::var("NIGHTSHIFT_PODMAN_HOST")
            .unwrap_or_else(|_| format!("unix://{}/podman.sock", podman_dir().display())),
    }
}

fn api_err(doing: &str, e: impl std::error::Error + Send + Sync + 'static) -> EngineError {
    EngineError::Lost {
        doing: doing.to_owned(),
        source: Box::new(e),
    }
}

#[derive(Debug, thiserror::Error)]
#[error("podman answered {status}: {message}")]
struct Answer {
    status: u16,
    message: String,
}

/// One call to Podman's own API over its Unix socket.
pub(crate) async fn call(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&Value>,
    doing: &str,
) -> Result<Value, EngineError> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| api_err(doing, e))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| api_err(doing, e))?;
    tokio::spawn(conn);
    let bytes = body.map(|b| b.to_string()).unwrap_or_default();
    let request = Request::builder()
        .method(method)
        .uri(format!("{LIBPOD}{path}"))
        .header("Host", "podman")
        .header("Content-Type", "application/json")
        .body(Full::new(Bytes::from(bytes)))
        .map_err(|e| api_err(doing, e))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| api_err(doing, e))?;
    let status = response.status().as_u16();
    let collected = response
        .into_body()
        .collect()
        .await
        .map_err(|e| api_err(doing, e))?
        .to_bytes();
    let value: Value = serde_json::from_slice(&collected).unwrap_or(Value::Null);
    if status >= 300 {
        let message = value
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("no message")
            .to_owned();
        return Err(EngineError::Api {
            doing: doing.to_owned(),
            source: Box::new(Answer { status, message }),
        });
    }
    Ok(value)
}

/// Why a Podman service is refused, from the uid of the process that
/// answers on its socket (the kernel's peer credentials): a rootless one
/// cannot meet Tier 0 (docs/engines.md, "Podman (rootless)").
pub fn refusal(service_uid: u32) -> Option<String> {
    (service_uid != 0).then(|| {
        format!(
            "rootless podman is refused (its service runs as uid {service_uid}): its sandbox \
             user would be an id delegated to a host account, and the worktree's nosuid,nodev \
             mount and the fleet's cgroup need root (docs/engines.md)"
        )
    })
}

/// Asks the kernel who serves the socket ([`refusal`]): cheaper than
/// Podman's `/info`, which gathers the whole host's.
pub(crate) async fn check_service(socket: &Path) -> Result<(), String> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
    let cred = stream
        .peer_cred()
        .map_err(|e| format!("reading who serves {}: {e}", socket.display()))?;
    match refusal(cred.uid()) {
        None => Ok(()),
        Some(why) => Err(why),
    }
}

/// Writes a seccomp profile (the sandbox's: `SandboxSpec::seccomp_profile`)
/// where Podman reads it: a file named by the digest of its text in the
/// root-only `seccomp/` folder, written once (a no-op when it is there with
/// that content).
pub fn seccomp_file(profile: &str) -> Result<PathBuf, EngineError> {
    let dir = podman_dir().join("seccomp");
    let digest = hex::encode(Sha256::digest(profile.as_bytes()));
    let path = dir.join(format!("{digest}.json"));
    let io = |e: std::io::Error| EngineError::Api {
        doing: format!("writing the seccomp profile {}", path.display()),
        source: Box::new(e),
    };
    if std::fs::read(&path).is_ok_and(|b| b == profile.as_bytes()) {
        return Ok(path);
    }
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io)?;
    }
    let tmp = dir.join(format!(".{digest}.{}", std::process::id()));
    std::fs::write(&tmp, profile).map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    Ok(path)
}

/// Options of a tmpfs as Podman takes them: `uid=`/`gid=` become Podman's
/// `U` (owned by the container's user).
fn tmpfs_options(options: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut owned = false;
    for o in options.split(',').filter(|o| !o.is_empty()) {
        if o.starts_with("uid=") || o.starts_with("gid=") {
            owned = true;
        } else {
            out.push(o.to_owned());
        }
    }
    if owned {
        out.push("U".into());
    }
    out
}

/// A bind mount in a libpod request.
fn bind(source: &Path, target: &str, rw: bool) -> Value {
    json!({
        "destination": target,
        "type": "bind",
        "source": source.to_string_lossy(),
        "options": ["rbind", if rw { "rw" } else { "ro" }],
    })
}

/// The tmpfs mounts of a request: the spec's, and Podman's own (`/run`,
/// `/var/tmp`) sized unless the spec names them.
fn tmpfs_mounts(spec_tmpfs: &BTreeMap<String, String>) -> Vec<Value> {
    let mut tmpfs = spec_tmpfs.clone();
    for (target, options) in PODMAN_TMPFS {
        tmpfs
            .entry(target.to_owned())
            .or_insert_with(|| options.to_owned());
    }
    tmpfs
        .iter()
        .map(|(target, options)| {
            json!({
                "destination": target,
                "type": "tmpfs",
                "source": "tmpfs",
                "options": tmpfs_options(options),
            })
        })
        .collect()
}

/// `KEY=value` lines as libpod's map.
fn env_map(list: Vec<String>) -> BTreeMap<String, String> {
    list.into_iter()
        .filter_map(|e| e.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect()
}

/// What a container nightshift makes on Podman is, whatever it is for.
struct Container<'a> {
    name: &'a str,
    image: &'a str,
    command: &'a [String],
    user: String,
    work_dir: &'a str,
    env: Vec<String>,
    labels: &'a BTreeMap<String, String>,
    caps: &'a Caps,
    cgroup_parent: Option<&'a String>,
}

/// A [`Container`] from a sandbox's or a setup's spec (the fields both
/// have), working in `work_dir`.
macro_rules! container_of {
    ($spec:expr, $work_dir:expr) => {
        Container {
            name: &$spec.name,
            image: &$spec.image,
            command: &$spec.command,
            user: $spec.user(),
            work_dir: $work_dir,
            env: $spec.env_list(),
            labels: &$spec.labels,
            caps: &$spec.caps,
            cgroup_parent: $spec.cgroup_parent.as_ref(),
        }
    };
}

/// The hardening and caps every container nightshift makes on Podman
/// shares, sandbox or setup: no capability, no new privileges, the seccomp
/// profile by path, a read-only root, private namespaces but the network,
/// the memory (swap included), CPU and process caps, no log, no restart.
fn hardened(c: Container<'_>, seccomp: &Path) -> Value {
    let period: i64 = 100_000;
    let quota = c.caps.nano_cpus * period / 1_000_000_000;
    let mut request = json!({
        "name": c.name,
        "image": c.image,
        "command": c.command,
        "entrypoint": [],
        "user": c.user,
        "work_dir": c.work_dir,
        "env": env_map(c.env),
        "labels": c.labels,
        "terminal": false,
        "stdin": false,
        "read_only_filesystem": true,
        "privileged": false,
        "cap_drop": ["ALL"],
        "cap_add": [],
        "no_new_privileges": true,
        "seccomp_profile_path": seccomp.to_string_lossy(),
        // What Podman shows as `seccomp=` in its inspect (as it records a
        // profile given to its compatible API).
        "annotations": {"io.podman.annotations.seccomp": seccomp.to_string_lossy()},
        "pidns": {"nsmode": "private"},
        "ipcns": {"nsmode": "private"},
        "utsns": {"nsmode": "private"},
        "cgroupns": {"nsmode": "private"},
        "resource_limits": {
            "memory": {"limit": c.caps.memory_bytes, "swap": c.caps.memory_bytes},
            "cpu": {"quota": quota, "period": period},
            "pids": {"limit": c.caps.pids},
        },
        // conmon stays in the service's cgroup: under the run's, only the
        // container's (the run's memory figures are the container's).
        "cgroups_mode": "no-conmon",
        "log_configuration": {"driver": "none"},
        "restart_policy": "no",
    });
    if let Some(parent) = c.cgroup_parent {
        request["cgroup_parent"] = json!(parent);
    }
    request
}

/// Adds `fields` to a request object.
fn with(mut request: Value, fields: Value) -> Value {
    if let (Some(r), Value::Object(f)) = (request.as_object_mut(), fields) {
        r.extend(f);
    }
    request
}

/// The libpod `SpecGenerator` for a sandbox: the Docker adapter's request,
/// spelled for Podman.
pub(crate) fn sandbox_request(spec: &SandboxSpec, seccomp: &Path) -> Value {
    let mut mounts = vec![bind(&spec.worktree_host, WORKSPACE, true)];
    if let Some(door) = &spec.door {
        mounts.push(bind(door, DOOR_MOUNT, false));
    }
    if let Some(cache) = &spec.setup_cache {
        mounts.push(bind(cache, SETUP_CACHE, false));
    }
    mounts.extend(tmpfs_mounts(&spec.tmpfs));
    let container = container_of!(spec, WORKSPACE);
    let mut request = with(
        hardened(container, seccomp),
        json!({
            "init": !spec.lease_is_pid1(),
            "mounts": mounts,
            "mask": spec.masked_paths(),
            "netns": {"nsmode": "none"},
            "r_limits": spec.ulimits().iter().map(|u| json!({
                "type": u.name, "soft": u.soft, "hard": u.hard,
            })).collect::<Vec<_>>(),
            "shm_size": spec.caps.shm_bytes(),
        }),
    );
    // The runtime is the service's (Podman 4.3 takes no runtime per
    // container): gVisor's service is another socket ([`podman_endpoint`]).
    if !spec.lease_is_pid1() {
        request["init_path"] = json!(CATATONIT);
    }
    request
}

/// The libpod `SpecGenerator` for a run's setup container (docs/setup.md):
/// the Docker adapter's [`crate::engine::Engine::create_setup`], spelled
/// for Podman. The same hardening as a sandbox's, but Podman's bridge
/// network, the engine's init, and only the read-only checkout, the cache
/// being built, the credentials and the CA bundle mounted (no door, no
/// worktree).
pub(crate) fn setup_request(spec: &SetupSpec, seccomp: &Path) -> Value {
    let mut mounts = vec![
        bind(&spec.checkout, SETUP_CHECKOUT, false),
        bind(&spec.cache, SETUP_CACHE, true),
    ];
    mounts.extend(
        spec.credentials
            .iter()
            .map(|(host, target)| bind(host, target, false)),
    );
    if let Some(ca) = &spec.ca_bundle {
        mounts.push(bind(ca, SETUP_CA, false));
    }
    mounts.extend(tmpfs_mounts(&spec.tmpfs));
    let container = container_of!(spec, SETUP_CHECKOUT);
    with(
        hardened(container, seccomp),
        json!({
            "init": true,
            "init_path": CATATONIT,
            "mounts": mounts,
            "netns": {"nsmode": "bridge"},
            // Podman's defaults (a million open files and four million
            // processes) are above the service's own hard limits, which
            // the runtime then fails to set: the sandbox's open files and
            // shared process limit, no core dumps.
            "r_limits": [
                {"type": "nofile", "soft": spec.caps.open_files, "hard": spec.caps.open_files},
                {"type": "nproc", "soft": SHARED_NPROC, "hard": SHARED_NPROC},
                {"type": "core", "soft": 0, "hard": 0},
            ],
        }),
    )
}

/// Creates (never starts) a run's setup container through Podman's own
/// API; its id.
pub(crate) async fn create_setup(socket: &Path, spec: &SetupSpec) -> Result<String, EngineError> {
    let seccomp = seccomp_file(SECCOMP_PROFILE)?;
    let doing = format!("creating setup container {} in podman", spec.name);
    created_id(
        call(
            socket,
            "POST",
            "/containers/create",
            Some(&setup_request(spec, &seccomp)),
            &doing,
        )
        .await?,
        doing,
    )
}

/// The container id in a create's answer.
fn created_id(created: Value, doing: String) -> Result<String, EngineError> {
    let id = created
        .get("Id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if id.is_empty() {
        return Err(EngineError::Api {
            doing,
            source: Box::new(Answer {
                status: 200,
                message: "no container id in the answer".into(),
            }),
        });
    }
    Ok(id)
}

/// Creates and initialises (never starts) a sandbox through Podman's own
/// API; its id.
pub(crate) async fn create(socket: &Path, spec: &SandboxSpec) -> Result<String, EngineError> {
    let seccomp = seccomp_file(&spec.seccomp_profile())?;
    let doing = format!("creating container {} in podman", spec.name);
    let created = call(
        socket,
        "POST",
        "/containers/create",
        Some(&sandbox_request(spec, &seccomp)),
        &doing,
    )
    .await?;
    created_id(created, doing)
}

/// Percent-encodes a query value (RFC 3986 unreserved characters kept).
fn query_value(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Containers carrying `label` (`key=value`), from Podman's own list: its
/// compatible list names states (`stopped`) Docker's client refuses.
pub(crate) async fn managed(
    socket: &Path,
    label: &str,
) -> Result<Vec<nightshift_core::container_engine::Managed>, EngineError> {
    let filters = json!({ "label": [label] }).to_string();
    let list = call(
        socket,
        "GET",
        &format!(
            "/containers/json?all=true&filters={}",
            query_value(&filters)
        ),
        None,
        "listing nightshift containers in podman",
    )
    .await?;
    Ok(list
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            let labels: std::collections::HashMap<String, String> = c
                .get("Labels")
                .and_then(|l| serde_json::from_value(l.clone()).ok())
                .unwrap_or_default();
            Some(nightshift_core::container_engine::Managed {
                id: c.get("Id")?.as_str()?.to_owned(),
                run: labels.get(nightshift_core::sandbox::LABEL_RUN).cloned(),
                running: c.get("State").and_then(Value::as_str) == Some("running"),
                labels,
            })
        })
        .collect())
}

/// A container's state from Podman's own inspect, in Docker's words
/// (`initialized` is `created`, `stopped` is `exited`), or `None` when it
/// is gone.
pub(crate) async fn status(socket: &Path, id: &str) -> Result<Option<String>, EngineError> {
    match call(
        socket,
        "GET",
        &format!("/containers/{id}/json"),
        None,
        &format!("inspecting container {id} in podman"),
    )
    .await
    {
        // In Docker's words, as the port names them.
        Ok(doc) => Ok(Some(
            match doc
                .pointer("/State/Status")
                .and_then(Value::as_str)
                .unwrap_or_default()
            {
                "configured" | "initialized" => "created",
                "stopped" => "exited",
                other => other,
            }
            .to_owned(),
        )),
        Err(EngineError::Api { source, .. })
            if source
                .downcast_ref::<Answer>()
                .is_some_and(|a| a.status == 404) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Initialises a created container: the runtime's bundle (its OCI
/// configuration) is written and its process made, stopped before the
/// command runs.
pub(crate) async fn init(socket: &Path, id: &str) -> Result<(), EngineError> {
    call(
        socket,
        "POST",
        &format!("/containers/{id}/init"),
        None,
        &format!("initialising container {id}"),
    )
    .await
    .map(|_| ())
}

/// The most read of a file the engine names (a seccomp profile, the
/// runtime's OCI configuration): a larger one is not read, and what it
/// would have shown fails closed in the attestation.
const MAX_OBSERVED_FILE: u64 = 4 << 20;

fn read_bounded(path: &Path) -> Option<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut text = String::new();
    file.take(MAX_OBSERVED_FILE + 1)
        .read_to_string(&mut text)
        .ok()?;
    (text.len() as u64 <= MAX_OBSERVED_FILE).then_some(text)
}

/// What Podman's compatible inspect leaves out, added beside its fields for
/// the attestation (`orchestrator_attest::parse_podman_inspect`): `Libpod`
/// (runtime, capability sets, cgroup and IPC modes from Podman's own
/// document), `SeccompFiles` (the text of each profile file named) and
/// `OciSpec` (what the runtime was handed: masked and read-only paths,
/// namespaces, the seccomp filter), read from the bundle Podman wrote.
pub(crate) async fn observe_extra(
    socket: &Path,
    id: &str,
    compat: &mut Value,
) -> Result<(), EngineError> {
    let libpod = call(
        socket,
        "GET",
        &format!("/containers/{id}/json"),
        None,
        &format!("inspecting container {id} in podman"),
    )
    .await?;
    let hc = libpod.get("HostConfig").cloned().unwrap_or(Value::Null);
    compat["Libpod"] = json!({
        "OCIRuntime": libpod.get("OCIRuntime"),
        "EffectiveCaps": libpod.get("EffectiveCaps"),
        "BoundingCaps": libpod.get("BoundingCaps"),
        "HostConfig": {"CgroupMode": hc.get("CgroupMode"), "IpcMode": hc.get("IpcMode")},
    });
    let mut files = serde_json::Map::new();
    let opts: Vec<String> = compat["HostConfig"]["SecurityOpt"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o.as_str().map(str::to_owned))
        .collect();
    for o in opts {
        if let Some(path) = o.strip_prefix("seccomp=") {
            if path != "unconfined" {
                if let Some(text) = read_bounded(Path::new(path)) {
                    files.insert(path.to_owned(), Value::String(text));
                }
            }
        }
    }
    compat["SeccompFiles"] = Value::Object(files);
    if let Some(config) = libpod.get("OCIConfigPath").and_then(Value::as_str) {
        if let Some(text) = read_bounded(Path::new(config)) {
            if let Ok(oci) = serde_json::from_str::<Value>(&text) {
                let linux = oci.get("linux").cloned().unwrap_or(Value::Null);
                compat["OciSpec"] = json!({
                    "maskedPaths": linux.get("maskedPaths"),
                    "readonlyPaths": linux.get("readonlyPaths"),
                    "namespaces": linux.get("namespaces"),
                    "seccomp": linux.get("seccomp"),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rootless_or_unknown_services_are_refused() {
        assert_eq!(refusal(0), None);
        let why = refusal(1000).unwrap();
        assert!(why.contains("rootless podman is refused"), "{why}");
        assert!(why.contains("uid 1000"), "{why}");
    }

    /// The check asks the kernel: a socket served by this (root) test
    /// process passes; the uid is the server's, not the caller's.
    #[tokio::test]
    async fn the_service_is_known_by_its_peer_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move { while listener.accept().await.is_ok() {} });
        let me = nix::unistd::geteuid().as_raw();
        assert_eq!(check_service(&path).await.is_ok(), me == 0);
        assert!(check_service(&dir.path().join("none.sock")).await.is_err());
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(
            query_value(r#"{"label":["nightshift.run=a b"]}"#),
            "%7B%22label%22%3A%5B%22nightshift.run%3Da%20b%22%5D%7D"
        );
    }

    #[test]
    fn tmpfs_owner_options_become_podmans_u() {
        assert_eq!(
            tmpfs_options("rw,nosuid,nodev,size=64,uid=7,gid=8,mode=0700"),
            ["rw", "nosuid", "nodev", "size=64", "mode=0700", "U"]
        );
        assert_eq!(tmpfs_options("rw,size=1"), ["rw", "size=1"]);
    }

    #[test]
    fn the_request_sizes_podmans_own_tmpfs_and_keeps_the_hardening() {
        let spec = SandboxSpec::new(
            "r1",
            "tag",
            "img",
            &["true".to_string()],
            PathBuf::from("/wt"),
            "task",
            &Default::default(),
        );
        let r = sandbox_request(&spec, Path::new("/p.json"));
        let mounts = r["mounts"].as_array().unwrap();
        for target in ["/run", "/var/tmp", "/tmp", "/home/agent"] {
            let m = mounts
                .iter()
                .find(|m| m["destination"] == target)
                .unwrap_or_else(|| panic!("{target} mounted"));
            assert!(
                m["options"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|o| o.as_str().unwrap().starts_with("size=")),
                "{target} sized"
            );
        }
        assert_eq!(r["cap_drop"], json!(["ALL"]));
        assert_eq!(r["cgroupns"]["nsmode"], "private");
        assert_eq!(r["ipcns"]["nsmode"], "private");
        assert_eq!(r["netns"]["nsmode"], "none");
        assert_eq!(r["read_only_filesystem"], true);
        assert_eq!(r["seccomp_profile_path"], "/p.json");
    }

    #[test]
    fn a_setup_request_has_the_bridge_and_its_mounts_but_no_door_or_worktree() {
        let spec = SetupSpec::new(
            "r1",
            "tag",
            "sup",
            "img",
            "true",
            PathBuf::from("/checkout"),
            PathBuf::from("/cache"),
            &Default::default(),
            Default::default(),
        );
        let r = setup_request(&spec, Path::new("/p.json"));
        assert_eq!(r["netns"]["nsmode"], "bridge");
        let binds: Vec<(String, String, String)> = r["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["type"] == "bind")
            .map(|m| {
                (
                    m["source"].as_str().unwrap().to_owned(),
                    m["destination"].as_str().unwrap().to_owned(),
                    m["options"][1].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert_eq!(
            binds,
            [
                ("/checkout".into(), SETUP_CHECKOUT.into(), "ro".into()),
                ("/cache".into(), SETUP_CACHE.into(), "rw".into()),
            ]
        );
        assert_eq!(r["cap_drop"], json!(["ALL"]));
        assert_eq!(r["no_new_privileges"], true);
        assert_eq!(r["read_only_filesystem"], true);
        assert_eq!(r["privileged"], false);
        assert_eq!(r["seccomp_profile_path"], "/p.json");
        assert_eq!(r["init_path"], CATATONIT);
        assert!(r["resource_limits"]["memory"]["limit"].as_i64().unwrap() > 0);
    }
}
