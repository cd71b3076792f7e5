//! `nightshift-lease`: every sandbox's main process. It starts the agent's
//! command as its child and ends the sandbox when the run's supervisor stops
//! renewing the lease (see `sandbox_image_door::lease`).
//!
//! `nightshift-lease --bound-ms N [--heartbeat PATH] -- COMMAND [ARG...]`
//!
//! It is the container's PID 1 itself (the engine adds no init of its own,
//! see `orchestrator::sandbox::SandboxSpec::lease_is_pid1`, and the
//! attestation checks it), and exiting ends the sandbox: the kernel then
//! kills every process left in the PID namespace. So:
//! - when the command exits, this exits with its status (128 + signal when a
//!   signal ended it);
//! - when the heartbeat's counter has not grown for longer than the bound
//!   (or there was none for a bound after the start), this kills the command
//!   and exits with 125: the whole sandbox is gone;
//! - nothing inside the sandbox can stop it: the kernel delivers to a PID
//!   namespace's init no signal sent from inside that it has no handler for,
//!   SIGSTOP and SIGKILL included (it installs none: termination signals
//!   are blocked and read from a signalfd, then passed on to the command);
//! - it makes itself non-dumpable first, so that the agent (same uid, no
//!   capability) can neither ptrace it nor read or write its memory through
//!   `/proc/1/mem`, nor open its other `/proc` files;
//! - as init it reaps every child that ends, orphans included (they are
//!   re-parented to it; `reap` waits on any pid), so zombies do not pile
//!   up in the run's pids cgroup.
//!
//! A warm sandbox's wrapper (`--command-file PATH`, started ahead of its
//! run by a pool) has no command at first: it holds the lease as above
//! (a sandbox whose supervisor is gone ends within its bound, waiting or
//! not) and waits for the supervisor to write the command file into the
//! read-only door, then runs what it names
//! (`sandbox_image_door::lease::parse_command_file`: the command and only
//! the task and base commit of its environment; anything else in it
//! starts nothing: `tests/lease_wrapper.rs::a_command_file_that_sets_other_environment_starts_nothing`,
//! `tests/lease_wrapper.rs::a_warm_wrapper_whose_lease_lapses_ends_without_a_command`).
//!
//! The host has a second end that needs neither this process nor the
//! supervisor nor the watchdog: `nightshift lease-end` (see
//! `orchestrator::lease`) kills the container through the engine when the
//! same heartbeat has not grown for the bound plus a margin.

#![forbid(unsafe_code)]

use std::io::Read;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use sandbox_image_door::lease::{self, Lease, Verdict};

/// The signals passed on to the command (how the engine and people ask a
/// container to stop); blocked here, read from a signalfd.
const FORWARDED: [Signal; 4] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// Reaps every child that has ended (orphans included: this is init);
/// `Some(status)` once the command itself has ended.
fn reap(command: Pid) -> Result<Option<i32>, Errno> {
    loop {
        match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == command => {
                return Ok(Some(lease::exit_status(Some(code), None)))
            }
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == command => {
                return Ok(Some(lease::exit_status(None, Some(signal as i32))))
            }
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return Ok(None),
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// How often the child's exit is checked (the command's exit reaches the
/// engine at most this late).
const TICK: Duration = Duration::from_millis(50);
/// How often the heartbeat is read.
const READ_EVERY: Duration = Duration::from_millis(500);

/// The longest a warm sandbox's wrapper sleeps between looks for its
/// command file when no inotify event wakes it (a runtime whose inotify
/// does not see the host's writes, such as gVisor's). Inside a Docker
/// container on this host (loaded), the rename to the command's first
/// output took 5–38 ms with a 20 ms look and the watch, 4–12 ms with a
/// 1 ms look alone: the watch did not always wake it. 5 ms bounds that wait
/// and costs an idle warm sandbox about 0.4% of a core (1 ms: 1.8%).
const WAIT_LOOK_EVERY: Duration = Duration::from_millis(5);

/// Reads the command file at `path`, when it is there (bounded).
fn read_command_file(path: &str) -> Option<Result<lease::LateCommand, String>> {
    let file = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::new();
    if let Err(e) = file
        .take(lease::MAX_COMMAND_FILE as u64 + 1)
        .read_to_end(&mut bytes)
    {
        return Some(Err(format!("reading {path}: {e}")));
    }
    Some(lease::parse_command_file(&bytes))
}

/// Waits, under the lease, until the command file at `path` appears; the
/// exit status to end with when the lease expires, a termination signal
/// comes, or the file names no command.
fn wait_for_command(
    path: &str,
    heartbeat: &str,
    held: &mut Lease,
    started: Instant,
    signals: &mut SignalFd,
) -> Result<lease::LateCommand, i32> {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    use std::os::fd::AsFd;
    // Woken at once where the kernel's inotify sees the host's rename;
    // looked for every WAIT_LOOK_EVERY otherwise.
    let dir = std::path::Path::new(path)
        .parent()
        .unwrap_or(std::path::Path::new("/"));
    let watch = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
        .ok()
        .filter(|i| {
            i.add_watch(
                dir,
                AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_CLOSE_WRITE,
            )
            .is_ok()
        });
    let mut next_read = Instant::now();
    loop {
        match read_command_file(path) {
            Some(Ok(late)) => return Ok(late),
            Some(Err(why)) => {
                eprintln!("nightshift-lease: the warm sandbox's command: {why}");
                return Err(lease::EXIT_CANNOT_START);
            }
            None => {}
        }
        if let Ok(Some(info)) = signals.read_signal() {
            return Err(lease::exit_status(None, Some(info.ssi_signo as i32)));
        }
        let now = Instant::now();
        if now >= next_read {
            next_read = now + READ_EVERY;
            if let Verdict::Expired { since_renewal } =
                held.observe(now - started, read_heartbeat(heartbeat))
            {
                eprintln!(
                    "nightshift-lease: the supervisor has not renewed the lease for {}s (bound {}s): ending the warm sandbox",
                    since_renewal.as_secs(),
                    held.bound().as_secs()
                );
                return Err(lease::EXIT_EXPIRED);
            }
        }
        match &watch {
            Some(inotify) => {
                let timeout = nix::poll::PollTimeout::try_from(WAIT_LOOK_EVERY)
                    .unwrap_or(nix::poll::PollTimeout::NONE);
                let mut fds = [nix::poll::PollFd::new(
                    inotify.as_fd(),
                    nix::poll::PollFlags::POLLIN,
                )];
                let _ = nix::poll::poll(&mut fds, timeout);
                // Drained; what changed is looked at above.
                while let Ok(events) = inotify.read_events() {
                    if events.is_empty() {
                        break;
                    }
                }
            }
            None => std::thread::sleep(WAIT_LOOK_EVERY),
        }
    }
}

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn read_heartbeat(path: &str) -> Option<u64> {
    let file = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::with_capacity(lease::MAX_HEARTBEAT + 1);
    file.take(lease::MAX_HEARTBEAT as u64 + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    lease::parse_heartbeat(&bytes)
}

/// Starts `nightshift-relay` (beside this executable) on `port` and waits
/// until it listens. It ends with the sandbox: when this process exits, the
/// kernel kills everything left in the sandbox's PID namespace.
fn start_relay(port: u16) -> Result<std::process::Child, String> {
    let me = std::env::current_exe().map_err(|e| format!("finding the door's bin/: {e}"))?;
    let relay = me.with_file_name("nightshift-relay");
    let mut child = Command::new(&relay)
        .args(["--port", &port.to_string()])
        .stdin(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: {e}", relay.display()))?;
    let started = Instant::now();
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(child);
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("it exited ({status}) before listening"));
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            return Err(format!("it did not listen on 127.0.0.1:{port} within 10 s"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn main() -> ExitCode {
    let args: Result<Vec<String>, _> = std::env::args_os()
        .skip(1)
        .map(|a| a.into_string())
        .collect();
    let invocation = match args
        .map_err(|_| "arguments must be UTF-8".to_string())
        .and_then(|a| lease::parse_args(&a))
    {
        Ok(i) => i,
        Err(why) => {
            eprintln!("nightshift-lease: {why}\n{}", lease::USAGE);
            return exit(lease::EXIT_USAGE);
        }
    };
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("nightshift-lease: making the lease non-dumpable: {e}");
        return exit(lease::EXIT_CANNOT_START);
    }
    // No handler for anything: termination signals wait in a signalfd (the
    // command starts with an empty mask: std resets it in the child).
    let mut mask = SigSet::empty();
    for s in FORWARDED {
        mask.add(s);
    }
    let signals = mask
        .thread_block()
        .and_then(|()| SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC));
    let mut signals = match signals {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("nightshift-lease: taking termination signals: {e}");
            return exit(lease::EXIT_CANNOT_START);
        }
    };
    let started = Instant::now();
    let mut held = Lease::new(invocation.bound);
    // Read before the command starts: a sandbox whose lease is already gone
    // runs nothing past the grace.
    let _ = held.observe(Duration::ZERO, read_heartbeat(&invocation.heartbeat));
    // The model gateway's relay first: the agent's clients find it listening.
    let _relay = match invocation.relay {
        Some(port) => match start_relay(port) {
            Ok(child) => Some(child),
            Err(why) => {
                eprintln!("nightshift-lease: starting the model gateway's relay: {why}");
                return exit(lease::EXIT_CANNOT_START);
            }
        },
        None => None,
    };
    // A warm sandbox's command comes later, from the supervisor.
    let (argv, late_env) = match &invocation.command_file {
        None => (invocation.command.clone(), Default::default()),
        Some(path) => match wait_for_command(
            path,
            &invocation.heartbeat,
            &mut held,
            started,
            &mut signals,
        ) {
            Ok(late) => (late.argv, late.env),
            Err(code) => return exit(code),
        },
    };
    let child = match Command::new(&argv[0])
        .args(&argv[1..])
        .envs(&late_env)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("nightshift-lease: starting {:?}: {e}", argv[0]);
            return exit(lease::EXIT_CANNOT_START);
        }
    };
    let command = Pid::from_raw(child.id() as i32);
    let mut next_read = started + READ_EVERY;
    loop {
        match reap(command) {
            Ok(Some(status)) => return exit(status),
            Ok(None) => {}
            Err(e) => {
                eprintln!("nightshift-lease: waiting for the command: {e}");
                let _ = kill(command, Signal::SIGKILL);
                return exit(lease::EXIT_CANNOT_START);
            }
        }
        while let Ok(Some(info)) = signals.read_signal() {
            if let Ok(signal) = Signal::try_from(info.ssi_signo as i32) {
                let _ = kill(command, signal);
            }
        }
        let now = Instant::now();
        if now >= next_read {
            next_read = now + READ_EVERY;
            let counter = read_heartbeat(&invocation.heartbeat);
            if let Verdict::Expired { since_renewal } = held.observe(now - started, counter) {
                eprintln!(
                    "nightshift-lease: the supervisor has not renewed the lease for {}s (bound {}s): ending the sandbox",
                    since_renewal.as_secs(),
                    held.bound().as_secs()
                );
                // Exiting ends the sandbox (the kernel kills the rest of
                // the PID namespace); the command goes first.
                let _ = kill(command, Signal::SIGKILL);
                return exit(lease::EXIT_EXPIRED);
            }
        }
        std::thread::sleep(TICK);
    }
}
