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
    let signals = match signals {
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
    let child = match Command::new(&invocation.command[0])
        .args(&invocation.command[1..])
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "nightshift-lease: starting {:?}: {e}",
                invocation.command[0]
            );
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
