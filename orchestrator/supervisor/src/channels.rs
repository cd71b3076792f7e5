//! The host directory, the carrier of a run's channels
//! (`nightshift_core::channel`) on an engine whose sandboxes share the
//! supervisor's host (Docker, Podman): `STATE/doors/<run>`, mounted
//! read-only into the run's sandbox alone at `/run/nightshift`, holding the
//! door's socket (`door.sock`), the model socket (`model.sock`), the lease's
//! heartbeat (`heartbeat`), and the static door clients and lease wrapper
//! in `bin/` (`door::CLIENTS`)
//! (`orchestrator/attest/tests/fixtures.rs::writable_door_fails_mounts`,
//! `tests/tests/acts.rs::night_to_morning`).
//!
//! Invariants:
//! - The directory is made with its clients or not at all: a directory
//!   whose clients cannot be written is an error, so no run starts without
//!   them (`door::write_clients`).
//! - The sockets are the sandbox user's to connect to (mode 0666) in a
//!   directory it cannot write (mounted read-only:
//!   `orchestrator/attest/tests/fixtures.rs::writable_door_fails_mounts`).
//! - Each heartbeat is written whole to a temporary name beside the
//!   directory (`STATE/doors/.<run>.heartbeat.tmp`), never in it, and renamed
//!   over the last: the wrapper reads the old counter or the new one
//!   (`tests::a_heartbeat_is_renamed_into_place_and_the_directory_goes_whole`).
//! - [`Channels::close`] removes the directory and the temporary name.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use nightshift_core::channel::{ChannelListener, Channels};
use nightshift_core::sandbox::SandboxSpec;
use nightshift_core::state_store::StatePaths;
use sandbox_image_door::lease;
use tokio::net::{UnixListener, UnixStream};

/// A run's channels in a directory of the state.
#[derive(Debug)]
pub struct HostDir {
    dir: PathBuf,
}

/// A Unix socket of the host directory, listening.
#[derive(Debug)]
pub struct UnixChannel(UnixListener);

impl UnixChannel {
    /// Binds a Unix socket at `path` (replacing one there) that the
    /// sandbox's user may connect to (mode 0666).
    pub fn bind(path: &Path) -> std::io::Result<UnixChannel> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
        Ok(UnixChannel(listener))
    }
}

impl ChannelListener for UnixChannel {
    type Stream = UnixStream;
    async fn accept(&mut self) -> std::io::Result<UnixStream> {
        self.0.accept().await.map(|(stream, _)| stream)
    }
}

impl HostDir {
    /// Makes `STATE/doors/<run>` (mode 0755) with the clients in `bin/`.
    pub fn open(paths: &StatePaths, run: &str) -> std::io::Result<HostDir> {
        let dir = paths.root.join("doors").join(run);
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        crate::door::write_clients(&dir.join("bin"))?;
        Ok(HostDir { dir })
    }

    /// [`HostDir::open`], and the sandbox's lease renewed through it from
    /// now on, by this process only (`nightshift_engine_docker::lease`):
    /// what every sandbox of a run (cold, warm, the end-of-run packer)
    /// starts with. When the lease cannot start, the directory is closed.
    pub fn open_leased(
        paths: &StatePaths,
        run: &str,
        bound: std::time::Duration,
    ) -> std::io::Result<(
        std::sync::Arc<HostDir>,
        nightshift_engine_docker::lease::Heartbeat,
    )> {
        let dir = std::sync::Arc::new(HostDir::open(paths, run)?);
        let renewing = dir.clone();
        match nightshift_engine_docker::lease::start(move |counter| renewing.renew(counter), bound)
        {
            Ok(heartbeat) => Ok((dir, heartbeat)),
            Err(e) => {
                dir.close();
                Err(std::io::Error::new(
                    e.kind(),
                    format!("starting the sandbox's lease: {e}"),
                ))
            }
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A socket of the directory: the sandbox's user may connect to it, in
    /// a directory that is read-only to it.
    fn bind(&self, name: &str) -> std::io::Result<UnixChannel> {
        UnixChannel::bind(&self.dir.join(name))
    }

    /// Where a heartbeat is written before it is renamed into the
    /// directory: beside it, so the sandbox never sees a half-written one.
    fn heartbeat_tmp(&self) -> PathBuf {
        self.beside(lease::HEARTBEAT)
    }

    /// A temporary name beside the directory for the file `file` of it.
    fn beside(&self, file: &str) -> PathBuf {
        match (self.dir.parent(), self.dir.file_name()) {
            (Some(parent), Some(name)) => {
                parent.join(format!(".{}.{file}.tmp", name.to_string_lossy()))
            }
            _ => self.dir.join(format!("{file}.tmp")),
        }
    }

    /// Writes `bytes` to a temporary name beside the directory, then
    /// renames it to `file` in it: the sandbox sees all of it or nothing.
    fn publish(&self, file: &str, bytes: &[u8], what: &str) -> std::io::Result<()> {
        let tmp = self.beside(file);
        let path = self.dir.join(file);
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| {
                std::io::Error::new(e.kind(), format!("writing {what} {}: {e}", path.display()))
            })
    }
}

impl Channels for HostDir {
    type Listener = UnixChannel;

    fn door(&self) -> std::io::Result<UnixChannel> {
        self.bind(crate::door::SOCKET)
    }

    fn model(&self) -> std::io::Result<UnixChannel> {
        self.bind(nightshift_gateway::SOCKET)
    }

    fn renew(&self, counter: u64) -> std::io::Result<()> {
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        self.publish(
            lease::HEARTBEAT,
            lease::format_heartbeat(counter, unix_ms).as_bytes(),
            "the lease's heartbeat",
        )
    }

    fn hand_command(
        &self,
        argv: &[String],
        env: &std::collections::BTreeMap<String, String>,
    ) -> std::io::Result<()> {
        let late = lease::LateCommand {
            argv: argv.to_vec(),
            env: env.clone(),
        };
        let bytes = lease::format_command_file(&late);
        // What the wrapper would refuse is refused here, before it is sent.
        lease::parse_command_file(&bytes)
            .map_err(|why| std::io::Error::new(std::io::ErrorKind::InvalidInput, why))?;
        self.publish(lease::COMMAND_FILE, &bytes, "the warm sandbox's command")
    }

    fn attach(&self, spec: SandboxSpec) -> SandboxSpec {
        spec.with_door(self.dir.clone())
    }

    fn close(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        // Left only by a write that failed half-way.
        let _ = std::fs::remove_file(self.heartbeat_tmp());
        let _ = std::fs::remove_file(self.beside(lease::COMMAND_FILE));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_is_renamed_into_place_and_the_directory_goes_whole() {
        let state = tempfile::tempdir().unwrap();
        let paths = StatePaths::new(state.path().to_path_buf());
        let channels = HostDir::open(&paths, "r1").unwrap();
        channels.renew(1).unwrap();
        channels.renew(2).unwrap();
        let beat = std::fs::read(channels.dir().join(lease::HEARTBEAT)).unwrap();
        assert_eq!(lease::parse_heartbeat(&beat), Some(2));
        // Nothing but the heartbeat and the clients in the directory: the
        // temporary name is beside it.
        let mut names: Vec<String> = std::fs::read_dir(channels.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["bin", lease::HEARTBEAT]);
        for (name, _) in crate::door::CLIENTS {
            let mode = std::fs::metadata(channels.dir().join("bin").join(name))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o555, "{name}");
        }
        // A temporary heartbeat left by a failed write goes with the rest.
        std::fs::write(channels.heartbeat_tmp(), b"half").unwrap();
        channels.close();
        assert!(!channels.dir().exists());
        assert!(!channels.heartbeat_tmp().exists());
        assert_eq!(
            std::fs::read_dir(state.path().join("doors"))
                .unwrap()
                .count(),
            0
        );
    }

    #[test]
    fn a_warm_sandboxs_command_is_renamed_into_place_and_checked_first() {
        let state = tempfile::tempdir().unwrap();
        let paths = StatePaths::new(state.path().to_path_buf());
        let channels = HostDir::open(&paths, "r1").unwrap();
        let env = [("NIGHTSHIFT_TASK".to_string(), "t".to_string())].into();
        channels.hand_command(&["true".to_string()], &env).unwrap();
        let written = std::fs::read(channels.dir().join(lease::COMMAND_FILE)).unwrap();
        let late = lease::parse_command_file(&written).unwrap();
        assert_eq!(late.argv, ["true"]);
        assert_eq!(late.env, env);
        assert!(!channels.beside(lease::COMMAND_FILE).exists());
        // What the wrapper refuses is never written.
        let bad = [("PATH".to_string(), "/tmp".to_string())].into();
        std::fs::remove_file(channels.dir().join(lease::COMMAND_FILE)).unwrap();
        assert!(channels.hand_command(&["true".to_string()], &bad).is_err());
        assert!(!channels.dir().join(lease::COMMAND_FILE).exists());
        // The wrapper looks where the spec tells it to.
        assert_eq!(
            nightshift_core::sandbox::WARM_COMMAND_FILE,
            lease::COMMAND_FILE_IN_SANDBOX
        );
        let spec = SandboxSpec::new(
            "r1",
            "t",
            "img",
            &[],
            PathBuf::from("/w"),
            "",
            &nightshift_core::sandbox::Caps::default(),
        );
        let warm = channels.attach(spec).with_model_gateway(7878).warm();
        let args: Vec<String> = warm.command[1..].to_vec();
        let parsed = lease::parse_args(&args).unwrap();
        assert_eq!(
            parsed.command_file.as_deref(),
            Some(lease::COMMAND_FILE_IN_SANDBOX)
        );
        assert_eq!(parsed.relay, Some(7878));
        assert!(warm.lease_is_pid1());
    }

    #[tokio::test]
    async fn the_sockets_are_the_sandbox_users_to_connect_to() {
        let state = tempfile::tempdir().unwrap();
        let paths = StatePaths::new(state.path().to_path_buf());
        let channels = HostDir::open(&paths, "r1").unwrap();
        let mut door = channels.door().unwrap();
        let _model = channels.model().unwrap();
        for name in [crate::door::SOCKET, nightshift_gateway::SOCKET] {
            let mode = std::fs::metadata(channels.dir().join(name))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o666, "{name}");
        }
        let path = channels.dir().join(crate::door::SOCKET);
        let client = tokio::spawn(async move { UnixStream::connect(path).await.map(drop) });
        door.accept().await.unwrap();
        client.await.unwrap().unwrap();
        // The spec mounts the directory and runs under the lease wrapper.
        let spec = SandboxSpec::new(
            "r1",
            "t",
            "img",
            &["true".to_string()],
            PathBuf::from("/w"),
            "task",
            &nightshift_core::sandbox::Caps::default(),
        );
        let spec = channels.attach(spec);
        assert_eq!(spec.door.as_deref(), Some(channels.dir()));
        assert!(spec.lease_is_pid1());
    }
}
