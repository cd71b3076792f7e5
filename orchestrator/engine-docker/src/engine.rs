//! The container-engine adapter: the only module that names bollard
//! (`scripts/check-layers.py`).
//!
//! Invariants:
//! - Every sandbox is created from a [`SandboxSpec`] by [`Engine::create`]
//!   (`network_mode: none`); there is no other way to create one here, so
//!   no call site can forget a hardening flag. A run's setup container
//!   (docs/setup.md) has its own path, [`Engine::create_setup`], from a
//!   [`SetupSpec`]: networked, never given a door, a gateway or the
//!   worktree
//!   (`tests/tests/setup.rs::setup_has_network_and_a_read_only_checkout_but_no_door_and_a_failure_stops_the_run`).
//!   Nor the lease's host-side end: a container whose lease wrapper is PID 1
//!   gets its `nightshift lease-end` process at creation, or is removed
//!   (`crate::lease::spawn_end`).
//! - Inspection hands the attestation the engine's own document (the Engine
//!   API's inspect JSON), not our request.
//! - The worktree's bind mount takes no option from here: it inherits
//!   `nosuid,nodev` from the worktree's own host mount (`hostview`), because
//!   the engine has no such option for binds.
//! - The engine keeps no copy of the output (log driver `none`): the
//!   supervisor reads it through attach and keeps its own capped log.
//! - An error says whether the engine answered: no answer (a failed or cut
//!   connection) is [`EngineError::Lost`], never taken for the container
//!   being gone; `remove` is `Ok` only for gone (`404` included), and a
//!   removal already in progress (`409`) is
//!   [`EngineError::RemovalInProgress`]
//!   (`tests::a_removal_is_ok_only_when_the_engine_says_the_container_is_gone`,
//!   `tests/tests/faults.rs::a_cut_engine_connection_loses_no_step_and_reconcile_removes_the_sandbox`).

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigCgroupnsModeEnum, HostConfigLogConfig, Mount,
    MountType, ResourcesUlimits, RestartPolicy, RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, ImportImageOptions, KillContainerOptions,
    ListContainersOptions, RemoveContainerOptions, WaitContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;

pub use nightshift_core::container_engine::{
    BoxError, EngineError, ExitState, ImageInfo, Managed, Output, OutputStream, Sample, StatsScope,
};
use nightshift_core::monitor::Observed;
use nightshift_core::sandbox::{
    SandboxSpec, DOOR_MOUNT, LABEL_MANAGED, LABEL_RUN, SECCOMP_PROFILE, WORKSPACE,
};
use nightshift_core::setup::{
    SetupSpec, CACHE_MOUNT as SETUP_CACHE, CA_MOUNT as SETUP_CA, CHECKOUT_MOUNT as SETUP_CHECKOUT,
};

/// An error of the engine's API: an answer from the engine, or none (a
/// failed or cut connection, [`EngineError::Lost`]).
fn api(doing: impl Into<String>) -> impl FnOnce(bollard::errors::Error) -> EngineError {
    let doing = doing.into();
    move |source| match source {
        bollard::errors::Error::DockerResponseServerError { .. }
        | bollard::errors::Error::DockerContainerWaitError { .. } => EngineError::Api {
            doing,
            source: Box::new(source),
        },
        source => EngineError::Lost {
            doing,
            source: Box::new(source),
        },
    }
}

pub use orchestrator_attest::EngineKind;

/// The engine chosen for this process: `NIGHTSHIFT_ENGINE` (`docker`, the
/// default, or `podman`), which the binary sets from `--engine` or the
/// configuration's `[engine]` before anything connects, so that every
/// process it starts speaks to the same engine.
pub fn chosen_engine() -> Result<EngineKind, EngineError> {
    match std::env::var("NIGHTSHIFT_ENGINE").as_deref() {
        Err(_) | Ok("") | Ok("docker") => Ok(EngineKind::Docker),
        Ok("podman") => Ok(EngineKind::Podman),
        Ok("kubernetes") => Err(EngineError::Unreachable {
            endpoint: "kubernetes".into(),
            message: KUBERNETES_NOT_YET.into(),
        }),
        Ok(other) => Err(EngineError::Unreachable {
            endpoint: other.to_owned(),
            message: "unknown engine: docker or podman".into(),
        }),
    }
}

/// Why `--engine kubernetes` runs nothing yet (docs/kubernetes.md).
pub const KUBERNETES_NOT_YET: &str = "runs on Kubernetes are not carried out yet: nightshift \
    plans, attests and watches sandbox Pods (`nightshift kube pod`, docs/kubernetes.md), but a \
    run's worktree pack and its door, model and lease channels do not reach a Pod yet; use \
    docker or podman";

/// The OCI runtime chosen for this process's sandboxes:
/// `NIGHTSHIFT_RUNTIME` (which the binary sets from `--runtime` or the
/// configuration's `[sandbox] runtime`); unset or empty: the engine's default.
pub fn chosen_runtime() -> Option<String> {
    std::env::var("NIGHTSHIFT_RUNTIME")
        .ok()
        .filter(|r| !r.is_empty())
}

#[derive(Debug, Clone)]
pub struct Engine {
    docker: Docker,
    endpoint: String,
    kind: EngineKind,
    /// The OCI runtime sandboxes run with (`NIGHTSHIFT_RUNTIME`).
    runtime: Option<String>,
    /// Podman's socket, for its own API (creation, init, its inspect).
    podman_socket: Option<std::path::PathBuf>,
}

impl Engine {
    /// Connects to the chosen engine ([`chosen_engine`]): Docker at
    /// DOCKER_HOST or the default socket, Podman at nightshift's own
    /// service (`scripts/podman.sh`), and checks that it answers.
    pub async fn connect() -> Result<Self, EngineError> {
        match chosen_engine()? {
            EngineKind::Docker => Self::connect_docker().await,
            EngineKind::Podman => Self::connect_podman().await,
            EngineKind::Kubernetes => Err(EngineError::Unreachable {
                endpoint: "kubernetes".into(),
                message: KUBERNETES_NOT_YET.into(),
            }),
        }
    }

    async fn connect_podman() -> Result<Self, EngineError> {
        let endpoint = crate::podman::podman_endpoint(chosen_runtime().as_deref());
        let unreachable = |message: String| EngineError::Unreachable {
            endpoint: endpoint.clone(),
            message,
        };
        let Some(path) = endpoint.strip_prefix("unix://") else {
            return Err(unreachable(
                "podman is spoken to on a unix:// socket".into(),
            ));
        };
        // Podman 4's compatible API answers Docker's API 1.41.
        let docker = Docker::connect_with_unix(
            path,
            120,
            &bollard::ClientVersion {
                major_version: 1,
                minor_version: 41,
            },
        )
        .map_err(|e| unreachable(e.to_string()))?;
        match tokio::time::timeout(Duration::from_secs(10), docker.ping()).await {
            Ok(Ok(_)) => {
                crate::podman::check_service(Path::new(path))
                    .await
                    .map_err(unreachable)?;
                Ok(Self {
                    docker,
                    podman_socket: Some(path.into()),
                    endpoint,
                    kind: EngineKind::Podman,
                    runtime: chosen_runtime(),
                })
            }
            Ok(Err(e)) => Err(unreachable(format!(
                "{e} (is it started? scripts/podman.sh start)"
            ))),
            Err(_) => Err(unreachable("no answer within 10 s".into())),
        }
    }

    async fn connect_docker() -> Result<Self, EngineError> {
        let endpoint =
            std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".into());
        let docker =
            Docker::connect_with_local_defaults().map_err(|e| EngineError::Unreachable {
                endpoint: endpoint.clone(),
                message: e.to_string(),
            })?;
        match tokio::time::timeout(Duration::from_secs(10), docker.ping()).await {
            Ok(Ok(_)) => Ok(Self {
                docker,
                endpoint,
                kind: EngineKind::Docker,
                runtime: chosen_runtime(),
                podman_socket: None,
            }),
            Ok(Err(e)) => Err(EngineError::Unreachable {
                endpoint,
                message: e.to_string(),
            }),
            Err(_) => Err(EngineError::Unreachable {
                endpoint,
                message: "no answer within 10 s".into(),
            }),
        }
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn kind(&self) -> EngineKind {
        self.kind
    }

    pub async fn image(&self, reference: &str) -> Result<Option<ImageInfo>, EngineError> {
        match self.docker.inspect_image(reference).await {
            Ok(img) => Ok(Some(ImageInfo {
                id: img.id.unwrap_or_default(),
                env: img.config.and_then(|c| c.env).unwrap_or_default(),
            })),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(None),
            Err(e) => Err(api(format!("inspecting image {reference}"))(e)),
        }
    }

    pub async fn require_image(&self, reference: &str) -> Result<ImageInfo, EngineError> {
        self.image(reference)
            .await?
            .ok_or_else(|| EngineError::ImageMissing(reference.to_string()))
    }

    /// Creates (does not start) the run's container.
    pub async fn create(&self, spec: &SandboxSpec) -> Result<String, EngineError> {
        let id = match &self.podman_socket {
            Some(socket) => crate::podman::create(socket, spec).await?,
            None => self.create_docker(spec).await?,
        };
        // The lease's host-side end, with the container: no call site can
        // forget it (see `crate::lease`). Without it, no container.
        if let (true, Some(door)) = (spec.lease_is_pid1(), spec.door.as_ref()) {
            if let Err(e) = crate::lease::spawn_end(&id, door, spec.caps.lease) {
                let _ = self.remove(&id).await;
                return Err(EngineError::Api {
                    doing: format!("starting the lease's host-side end for {}", spec.name),
                    source: Box::new(e),
                });
            }
        }
        // Podman writes the runtime's bundle at init: observed before start.
        if let Some(socket) = &self.podman_socket {
            if let Err(e) = crate::podman::init(socket, &id).await {
                let _ = self.remove(&id).await;
                return Err(e);
            }
        }
        Ok(id)
    }

    async fn create_docker(&self, spec: &SandboxSpec) -> Result<String, EngineError> {
        let host = HostConfig {
            network_mode: Some("none".into()),
            cap_drop: Some(vec!["ALL".into()]),
            cap_add: Some(vec![]),
            privileged: Some(false),
            security_opt: Some(vec![
                "no-new-privileges:true".into(),
                // By content: the engine keeps (and reports) this text, so
                // the attestation can check its digest.
                format!("seccomp={}", spec.seccomp_profile()),
            ]),
            masked_paths: Some(spec.masked_paths()),
            shm_size: Some(spec.caps.shm_bytes()),
            readonly_rootfs: Some(true),
            tmpfs: Some(spec.tmpfs.clone().into_iter().collect()),
            mounts: Some(
                std::iter::once(Mount {
                    target: Some(WORKSPACE.into()),
                    source: Some(spec.worktree_host.to_string_lossy().into_owned()),
                    typ: Some(MountType::BIND),
                    read_only: Some(false),
                    ..Default::default()
                })
                .chain(spec.door.as_ref().map(|dir| Mount {
                    target: Some(DOOR_MOUNT.into()),
                    source: Some(dir.to_string_lossy().into_owned()),
                    typ: Some(MountType::BIND),
                    read_only: Some(true),
                    ..Default::default()
                }))
                .chain(spec.setup_cache.as_ref().map(|dir| Mount {
                    target: Some(SETUP_CACHE.into()),
                    source: Some(dir.to_string_lossy().into_owned()),
                    typ: Some(MountType::BIND),
                    read_only: Some(true),
                    ..Default::default()
                }))
                .collect(),
            ),
            memory: Some(spec.caps.memory_bytes),
            memory_swap: Some(spec.caps.memory_bytes),
            nano_cpus: Some(spec.caps.nano_cpus),
            pids_limit: Some(spec.caps.pids),
            ulimits: Some(
                spec.ulimits()
                    .into_iter()
                    .map(|u| ResourcesUlimits {
                        name: Some(u.name.into()),
                        soft: Some(u.soft),
                        hard: Some(u.hard),
                    })
                    .collect(),
            ),
            cgroupns_mode: Some(HostConfigCgroupnsModeEnum::PRIVATE),
            ipc_mode: Some("private".into()),
            // The lease wrapper is PID 1 itself (it reaps; see
            // `SandboxSpec::lease_is_pid1`); without it, the engine's init.
            init: Some(!spec.lease_is_pid1()),
            log_config: Some(HostConfigLogConfig {
                typ: Some("none".into()),
                config: Some(HashMap::new()),
            }),
            auto_remove: Some(false),
            cgroup_parent: spec.cgroup_parent.clone(),
            restart_policy: Some(RestartPolicy {
                name: Some(RestartPolicyNameEnum::NO),
                maximum_retry_count: None,
            }),
            // Docker knows only the runtimes its daemon registers: another
            // is refused by the engine, naming it.
            runtime: spec.runtime.clone(),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: Some(spec.command.clone()),
            entrypoint: Some(vec![]),
            user: Some(spec.user()),
            working_dir: Some(WORKSPACE.into()),
            env: Some(spec.env_list()),
            labels: Some(spec.labels.clone().into_iter().collect()),
            network_disabled: Some(true),
            attach_stdin: Some(false),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            open_stdin: Some(false),
            tty: Some(false),
            host_config: Some(host),
            ..Default::default()
        };
        let options = CreateContainerOptions {
            name: Some(spec.name.clone()),
            ..Default::default()
        };
        let created = self
            .docker
            .create_container(Some(options), body)
            .await
            .map_err(api(format!("creating container {}", spec.name)))?;
        Ok(created.id)
    }

    /// Creates (does not start) a run's setup container: a separate path
    /// from [`Engine::create`], so nothing of it can reach a sandbox. It
    /// keeps the sandbox's hardening (no capability, no new privileges,
    /// nightshift's seccomp profile, a read-only root, the run's memory,
    /// CPU and process caps, the sandbox user) but has the engine's bridge
    /// network (plain network: no egress allowlist), no door (so no lease
    /// wrapper and no model gateway), and mounts only the read-only
    /// checkout, the cache being built, the owner's credential files and
    /// the host's CA bundle (`tests/tests/setup.rs`).
    pub async fn create_setup(&self, spec: &SetupSpec) -> Result<String, EngineError> {
        if let Some(socket) = &self.podman_socket {
            return crate::podman::create_setup(socket, spec).await;
        }
        let bind = |source: &Path, target: &str, read_only: bool| Mount {
            target: Some(target.into()),
            source: Some(source.to_string_lossy().into_owned()),
            typ: Some(MountType::BIND),
            read_only: Some(read_only),
            ..Default::default()
        };
        let mut mounts = vec![
            bind(&spec.checkout, SETUP_CHECKOUT, true),
            bind(&spec.cache, SETUP_CACHE, false),
        ];
        mounts.extend(
            spec.credentials
                .iter()
                .map(|(host, target)| bind(host, target, true)),
        );
        if let Some(ca) = &spec.ca_bundle {
            mounts.push(bind(ca, SETUP_CA, true));
        }
        let host = HostConfig {
            network_mode: Some("bridge".into()),
            cap_drop: Some(vec!["ALL".into()]),
            cap_add: Some(vec![]),
            privileged: Some(false),
            security_opt: Some(vec![
                "no-new-privileges:true".into(),
                format!("seccomp={SECCOMP_PROFILE}"),
            ]),
            readonly_rootfs: Some(true),
            tmpfs: Some(spec.tmpfs.clone().into_iter().collect()),
            mounts: Some(mounts),
            memory: Some(spec.caps.memory_bytes),
            memory_swap: Some(spec.caps.memory_bytes),
            nano_cpus: Some(spec.caps.nano_cpus),
            pids_limit: Some(spec.caps.pids),
            cgroupns_mode: Some(HostConfigCgroupnsModeEnum::PRIVATE),
            ipc_mode: Some("private".into()),
            init: Some(true),
            log_config: Some(HostConfigLogConfig {
                typ: Some("none".into()),
                config: Some(HashMap::new()),
            }),
            auto_remove: Some(false),
            cgroup_parent: spec.cgroup_parent.clone(),
            restart_policy: Some(RestartPolicy {
                name: Some(RestartPolicyNameEnum::NO),
                maximum_retry_count: None,
            }),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: Some(spec.command.clone()),
            entrypoint: Some(vec![]),
            user: Some(spec.user()),
            working_dir: Some(SETUP_CHECKOUT.into()),
            env: Some(spec.env_list()),
            labels: Some(spec.labels.clone().into_iter().collect()),
            attach_stdin: Some(false),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            open_stdin: Some(false),
            tty: Some(false),
            host_config: Some(host),
            ..Default::default()
        };
        let options = CreateContainerOptions {
            name: Some(spec.name.clone()),
            ..Default::default()
        };
        let created = self
            .docker
            .create_container(Some(options), body)
            .await
            .map_err(api(format!("creating setup container {}", spec.name)))?;
        Ok(created.id)
    }

    /// The container's state as the engine names it (`created`, `running`,
    /// `exited`, ...), or `None` when it is gone.
    pub async fn status(&self, id: &str) -> Result<Option<String>, EngineError> {
        if let Some(socket) = &self.podman_socket {
            return crate::podman::status(socket, id).await;
        }
        match self.docker.inspect_container(id, None).await {
            Ok(c) => Ok(Some(
                c.state
                    .and_then(|s| s.status)
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
            )),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(None),
            Err(e) => Err(api(format!("inspecting container {id}"))(e)),
        }
    }

    /// The engine's inspect document for a container, as JSON.
    pub async fn inspect_json(&self, id: &str) -> Result<serde_json::Value, EngineError> {
        let inspected = self
            .docker
            .inspect_container(id, None)
            .await
            .map_err(api(format!("inspecting container {id}")))?;
        let mut doc = serde_json::to_value(inspected).unwrap_or(serde_json::Value::Null);
        if let Some(socket) = &self.podman_socket {
            crate::podman::observe_extra(socket, id, &mut doc).await?;
        }
        Ok(doc)
    }

    pub async fn attach(&self, id: &str) -> Result<OutputStream, EngineError> {
        let options = AttachContainerOptions {
            stdout: true,
            stderr: true,
            stream: true,
            logs: false,
            stdin: false,
            detach_keys: None,
        };
        let attached = self
            .docker
            .attach_container(id, Some(options))
            .await
            .map_err(api(format!("attaching to container {id}")))?;
        let stream = attached.output.filter_map(|item| async move {
            match item {
                Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
                    Some(Ok(Output::Stdout(message)))
                }
                Ok(LogOutput::StdErr { message }) => Some(Ok(Output::Stderr(message))),
                Ok(LogOutput::StdIn { .. }) => None,
                Err(e) => Some(Err(api("reading sandbox output")(e))),
            }
        });
        Ok(Box::pin(stream))
    }

    pub async fn start(&self, id: &str) -> Result<(), EngineError> {
        self.docker
            .start_container(id, None)
            .await
            .map_err(api(format!("starting container {id}")))
    }

    /// Waits for the container to stop and returns its exit code.
    pub async fn wait(&self, id: &str) -> Result<i64, EngineError> {
        let options = WaitContainerOptions {
            condition: "not-running".into(),
        };
        let mut stream = self.docker.wait_container(id, Some(options));
        match stream.next().await {
            Some(Ok(r)) => Ok(r.status_code),
            Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => Ok(code),
            Some(Err(e)) => Err(api(format!("waiting for container {id}"))(e)),
            None => Ok(self.exit_state(id).await?.exit_code.unwrap_or(-1)),
        }
    }

    pub async fn exit_state(&self, id: &str) -> Result<ExitState, EngineError> {
        let inspected = self
            .docker
            .inspect_container(id, None)
            .await
            .map_err(api(format!("inspecting container {id}")))?;
        let state = inspected.state.unwrap_or_default();
        Ok(ExitState {
            exit_code: state.exit_code,
            oom_killed: state.oom_killed.unwrap_or(false),
            running: state.running.unwrap_or(false),
        })
    }

    /// SIGKILL through the engine. A container that already stopped is not an error.
    pub async fn kill(&self, id: &str) -> Result<(), EngineError> {
        let options = KillContainerOptions {
            signal: "SIGKILL".into(),
        };
        match self.docker.kill_container(id, Some(options)).await {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404 | 409,
                ..
            }) => Ok(()),
            Err(e) => Err(api(format!("killing container {id}"))(e)),
        }
    }

    /// Removes the container whatever its state. Already gone is not an
    /// error; a removal already in progress (`409`) is
    /// [`EngineError::RemovalInProgress`]: not gone yet.
    pub async fn remove(&self, id: &str) -> Result<(), EngineError> {
        let options = RemoveContainerOptions {
            force: true,
            v: true,
            link: false,
        };
        match self.docker.remove_container(id, Some(options)).await {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 409, ..
            }) => Err(EngineError::RemovalInProgress(id.to_string())),
            Err(e) => Err(api(format!("removing container {id}"))(e)),
        }
    }

    /// Containers carrying our label, optionally only those of one run.
    pub async fn managed(&self, run: Option<&str>) -> Result<Vec<Managed>, EngineError> {
        let label = match run {
            Some(r) => format!("{LABEL_RUN}={r}"),
            None => format!("{LABEL_MANAGED}=1"),
        };
        // Podman's compatible list names states Docker has no word for
        // (`stopped`), which the client refuses: its own list instead.
        if let Some(socket) = &self.podman_socket {
            return crate::podman::managed(socket, &label).await;
        }
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([("label".to_string(), vec![label])])),
            ..Default::default()
        };
        let list = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(api("listing nightshift containers"))?;
        Ok(list
            .into_iter()
            .filter_map(|c| {
                let labels = c.labels.unwrap_or_default();
                Some(Managed {
                    id: c.id?,
                    run: labels.get(LABEL_RUN).cloned(),
                    running: c.state.map(|s| s.to_string() == "running").unwrap_or(false),
                    labels,
                })
            })
            .collect())
    }

    /// Loads an image archive (the `docker save` layout) into the engine.
    pub async fn load_image(&self, archive: &Path) -> Result<(), EngineError> {
        let file = tokio::fs::File::open(archive)
            .await
            .map_err(|e| EngineError::Api {
                doing: format!("opening image archive {}", archive.display()),
                source: Box::new(e),
            })?;
        let stream = tokio_util::io::ReaderStream::new(file);
        let mut progress = self.docker.import_image_stream(
            ImportImageOptions {
                quiet: true,
                ..Default::default()
            },
            stream,
            None,
        );
        while let Some(item) = progress.next().await {
            item.map_err(api("loading the image into the engine"))?;
        }
        Ok(())
    }
}

impl nightshift_core::container_engine::ContainerEngine for Engine {
    fn kind(&self) -> EngineKind {
        self.kind
    }
    fn runtime(&self) -> Option<String> {
        self.runtime.clone()
    }
    fn image(
        &self,
        reference: &str,
    ) -> impl Future<Output = Result<Option<ImageInfo>, EngineError>> + Send {
        Engine::image(self, reference)
    }
    fn create(
        &self,
        spec: &SandboxSpec,
    ) -> impl Future<Output = Result<String, EngineError>> + Send {
        Engine::create(self, spec)
    }
    fn create_setup(
        &self,
        spec: &SetupSpec,
    ) -> impl Future<Output = Result<String, EngineError>> + Send {
        Engine::create_setup(self, spec)
    }
    fn inspect_json(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<serde_json::Value, EngineError>> + Send {
        Engine::inspect_json(self, id)
    }
    fn attach(&self, id: &str) -> impl Future<Output = Result<OutputStream, EngineError>> + Send {
        Engine::attach(self, id)
    }
    fn start(&self, id: &str) -> impl Future<Output = Result<(), EngineError>> + Send {
        Engine::start(self, id)
    }
    fn wait(&self, id: &str) -> impl Future<Output = Result<i64, EngineError>> + Send {
        Engine::wait(self, id)
    }
    fn exit_state(&self, id: &str) -> impl Future<Output = Result<ExitState, EngineError>> + Send {
        Engine::exit_state(self, id)
    }
    fn status(&self, id: &str) -> impl Future<Output = Result<Option<String>, EngineError>> + Send {
        Engine::status(self, id)
    }
    fn managed(
        &self,
        run: Option<&str>,
    ) -> impl Future<Output = Result<Vec<Managed>, EngineError>> + Send {
        Engine::managed(self, run)
    }
    fn kill(&self, id: &str) -> impl Future<Output = Result<(), EngineError>> + Send {
        Engine::kill(self, id)
    }
    fn remove(&self, id: &str) -> impl Future<Output = Result<(), EngineError>> + Send {
        Engine::remove(self, id)
    }
    fn sandbox_cgroup_parent(&self, fleet_parent: &str, run: &str) -> String {
        crate::stats::sandbox_cgroup_parent(self.kind, fleet_parent, run)
    }
    fn stats(
        &self,
        scope: &StatsScope,
        run: &str,
        container: &str,
    ) -> impl Future<Output = Observed> + Send {
        crate::stats::stats(self.kind, scope, run, container)
    }
    fn final_stats(
        &self,
        scope: &StatsScope,
        run: &str,
        container: &str,
        ended: &ExitState,
        memory_cap: u64,
    ) -> impl Future<Output = Observed> + Send {
        crate::stats::final_stats(self.kind, scope, run, container, ended, memory_cap)
    }
    fn release_stats(&self, scope: &StatsScope, run: &str) -> impl Future<Output = ()> + Send {
        crate::stats::release(self.kind, scope, run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An engine on a Unix socket that answers every request with `status`,
    /// or (`None`) closes each connection unanswered.
    async fn engine_answering(path: &Path, status: Option<u16>) -> Engine {
        let listener = tokio::net::UnixListener::bind(path).unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = vec![0u8; 64 << 10];
                let _ = conn.read(&mut buf).await;
                if let Some(status) = status {
                    let body = r#"{"message":"scripted"}"#;
                    let reply = format!(
                        "HTTP/1.1 {status} Scripted\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = conn.write_all(reply.as_bytes()).await;
                }
            }
        });
        let docker =
            Docker::connect_with_unix(path.to_str().unwrap(), 5, bollard::API_DEFAULT_VERSION)
                .unwrap();
        Engine {
            docker,
            endpoint: path.display().to_string(),
            kind: EngineKind::Docker,
            runtime: None,
            podman_socket: None,
        }
    }

    #[tokio::test]
    async fn a_removal_is_ok_only_when_the_engine_says_the_container_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let mut n = 0;
        let mut remove = |status: Option<u16>| {
            n += 1;
            let path = dir.path().join(format!("engine-{n}.sock"));
            async move { engine_answering(&path, status).await.remove("c1").await }
        };
        assert!(remove(Some(204)).await.is_ok());
        assert!(remove(Some(404)).await.is_ok(), "gone already");
        assert!(matches!(
            remove(Some(409)).await,
            Err(EngineError::RemovalInProgress(_))
        ));
        let e = remove(Some(500)).await.unwrap_err();
        assert!(matches!(e, EngineError::Api { .. }), "{e}");
        assert!(!e.is_unreachable());
        // No answer: lost, never taken for gone.
        let e = remove(None).await.unwrap_err();
        assert!(matches!(e, EngineError::Lost { .. }), "{e}");
        assert!(e.is_unreachable());
    }
}
