//! A run's channels: how its sandbox reaches its supervisor, behind one
//! port so that the engine's carrier can differ while the servers behind
//! them do not.
//!
//! A fourth, one way and once: a warm sandbox's command
//! ([`Channels::hand_command`]), written whole into what the sandbox reads
//! and cannot write, which its waiting lease wrapper then runs.
//!
//! There are three, opened by the supervisor before the sandbox is created
//! and closed once it is gone:
//! - the door (acts and policy checks: `supervisor/src/door.rs`), a
//!   connection per request;
//! - the model socket (the gateway: `orchestrator/gateway`), HTTP/1.1
//!   connections;
//! - the lease's heartbeat (`engine-docker/src/lease.rs`), one way, from the
//!   supervisor to the sandbox: a counter the sandbox's wrapper reads and
//!   never writes (`orchestrator/attest/tests/fixtures.rs::writable_door_fails_mounts`).
//!
//! The door's and the gateway's servers take any [`ChannelListener`]: they
//! read what arrives as hostile bytes, bounded, whatever carried it. A
//! carrier is a [`Channels`]: on Docker and Podman, where the sandbox
//! shares the supervisor's host, a directory mounted read-only into the
//! sandbox holding two Unix sockets and the heartbeat file
//! (`supervisor/src/channels.rs`, `HostDir`:
//! `orchestrator/supervisor/src/channels.rs::tests::the_sockets_are_the_sandbox_users_to_connect_to`);
//! a sandbox on another machine (a cluster's node, docs/kubernetes.md)
//! needs a carrier of its own (a node-local relay), not built yet.
//!
//! Invariants every carrier keeps:
//! - Only the run's own sandbox reaches its channels (on the host directory:
//!   the run's directory is mounted into its sandbox alone,
//!   `tests/tests/acts.rs::night_to_morning`).
//! - Nothing inside the sandbox can write the heartbeat, nor anything else
//!   the supervisor reads but through a connection it accepted (the
//!   directory is mounted read-only:
//!   `orchestrator/attest/tests/fixtures.rs::writable_door_fails_mounts`).
//! - A heartbeat is written whole: the sandbox reads the old counter or the
//!   new one, never part of one
//!   (`orchestrator/supervisor/src/channels.rs::tests::a_heartbeat_is_renamed_into_place_and_the_directory_goes_whole`).

use std::future::Future;
use std::io;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::sandbox::SandboxSpec;

/// A connection from inside a sandbox on one of its channels.
pub trait ChannelStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> ChannelStream for T {}

/// One channel's listening end, on the supervisor's side.
pub trait ChannelListener: Send + 'static {
    type Stream: ChannelStream;
    /// The next connection. An error is one failed accept, not the end of
    /// the channel: servers go on accepting.
    fn accept(&mut self) -> impl Future<Output = io::Result<Self::Stream>> + Send;
}

/// The carrier of one run's channels.
pub trait Channels: Send + Sync + 'static {
    type Listener: ChannelListener;
    /// Opens the door's listening end.
    fn door(&self) -> io::Result<Self::Listener>;
    /// Opens the model socket's listening end.
    fn model(&self) -> io::Result<Self::Listener>;
    /// Publishes the lease's heartbeat `counter` to the sandbox, whole.
    fn renew(&self, counter: u64) -> io::Result<()>;
    /// The sandbox's spec with what it needs to reach these channels (its
    /// mounts, its environment, its main process: the lease wrapper).
    fn attach(&self, spec: SandboxSpec) -> SandboxSpec;
    /// Hands a warm sandbox (created with [`SandboxSpec::warm`]) its command:
    /// `argv`, and `env` set on it (only the names the wrapper takes late:
    /// the task and the base commit). Written whole, once.
    fn hand_command(
        &self,
        argv: &[String],
        env: &std::collections::BTreeMap<String, String>,
    ) -> io::Result<()>;
    /// Removes what the channels left once the sandbox is gone.
    fn close(&self);
}
