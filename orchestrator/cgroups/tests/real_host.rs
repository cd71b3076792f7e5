//! Against this host's real cgroups and container engine (as root): the
//! fleet's limits hold across containers started under it with
//! `--cgroup-parent`, and `sample()` reads their figures.
//!
//! Skipped, with a message on stderr, only when `docker info` fails or the
//! cgroup filesystem is not writable; and never where the host is meant to
//! run them: with `NIGHTSHIFT_REQUIRE_HOST_TESTS=1` (set by
//! `scripts/test.sh`, so in CI) a skip is a failure naming what is missing.
//! Every container and cgroup made here is removed, also when a test fails
//! (the guard's `Drop`).

use std::io::Write as _;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::sleep;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use orchestrator_cgroups::{
    detect, ensure_fleet, remove_fleet, sample, CgroupError, CgroupFs, Fleet, FleetLimits, Layout,
    RealFs,
};

const MIB: u64 = 1024 * 1024;
const POLL: Duration = Duration::from_millis(100);

fn say(msg: &str) {
    // Straight to stderr: libtest's capture would hide a println! of a pass.
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// This host cannot run `test`: said on stderr, or a failure where the
/// host is required to run it (`NIGHTSHIFT_REQUIRE_HOST_TESTS=1`).
fn skip(test: &str, why: &str) {
    if std::env::var("NIGHTSHIFT_REQUIRE_HOST_TESTS").as_deref() == Ok("1") {
        panic!("{test} cannot run here, and NIGHTSHIFT_REQUIRE_HOST_TESTS=1 requires it: {why}");
    }
    say(&format!("SKIPPED {test}: {why}"));
}

fn docker(args: &[&str]) -> Result<String> {
    let out = Command::new("docker")
        .args(args)
        .output()
        .context("running docker")?;
    if !out.status.success() {
        bail!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The layout, or `None` (said why) when this host cannot run these tests.
fn host(test: &str) -> Option<Layout> {
    if let Err(e) = docker(&["info", "--format", "{{.ServerVersion}}"]) {
        skip(test, &format!("`docker info` failed: {e:#}"));
        return None;
    }
    let layout = match detect(&RealFs) {
        Ok(l) => l,
        Err(e) => {
            skip(test, &format!("no cgroup filesystem: {e}"));
            return None;
        }
    };
    let probe = match &layout {
        Layout::V1 { root } => root.join("pids"),
        Layout::V2 { root } => root.clone(),
    }
    .join(format!("nightshift-probe-{}", std::process::id()));
    match RealFs.create_dir(&probe) {
        Ok(()) => {
            let _ = RealFs.remove_dir(&probe);
            Some(layout)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Some(layout),
        Err(e) => {
            skip(
                test,
                &format!("cgroup filesystem not writable ({}: {e})", probe.display()),
            );
            None
        }
    }
}

/// The sandbox image to run (it has python3): NIGHTSHIFT_TEST_IMAGE, else
/// any `nightshift-sandbox:*` the engine holds.
fn image() -> Result<String> {
    if let Ok(image) = std::env::var("NIGHTSHIFT_TEST_IMAGE") {
        return Ok(image);
    }
    let listed = docker(&[
        "images",
        "nightshift-sandbox",
        "--format",
        "{{.Repository}}:{{.Tag}}",
    ])?;
    listed
        .lines()
        .next()
        .map(str::to_string)
        .context("no nightshift-sandbox image: build it first (`nightshift image build`) or set NIGHTSHIFT_TEST_IMAGE")
}

fn fleet_name(test: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "nightshift-test-{test}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Removes the containers, then the fleet's cgroups, however the test ends.
struct Guard {
    layout: Layout,
    fleet: String,
    containers: Vec<String>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        for id in &self.containers {
            let _ = docker(&["rm", "-f", id]);
        }
        // The engine removes a container's cgroup shortly after the
        // container; keep trying for a while rather than leak the fleet.
        let mut last = None;
        for _ in 0..100 {
            match remove_fleet(&RealFs, &self.layout, &self.fleet) {
                Ok(()) => return,
                Err(e) => last = Some(e),
            }
            sleep(POLL);
        }
        if let Some(e) = last {
            say(&format!("could not remove test fleet {}: {e}", self.fleet));
        }
    }
}

impl Guard {
    fn new(layout: &Layout, fleet: &str) -> Self {
        Self {
            layout: layout.clone(),
            fleet: fleet.to_string(),
            containers: Vec::new(),
        }
    }

    fn run(&mut self, fleet: &Fleet, image: &str, cmd: &[&str]) -> Result<String> {
        let parent = fleet.cgroup_parent();
        let mut args = vec![
            "run",
            "-d",
            "--network",
            "none",
            "--cgroup-parent",
            &parent,
            image,
        ];
        args.extend_from_slice(cmd);
        let id = docker(&args)?;
        self.containers.push(id.clone());
        Ok(id)
    }
}

/// The fleet's directories still present in any hierarchy of the host.
fn leftovers(layout: &Layout, fleet: &str) -> Result<Vec<std::path::PathBuf>> {
    let mut found = Vec::new();
    let hierarchies: Vec<_> = match layout {
        Layout::V1 { root } => std::fs::read_dir(root)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()?,
        Layout::V2 { root } => vec![root.clone()],
    };
    for h in hierarchies {
        if h.join(fleet).exists() {
            found.push(h.join(fleet));
        }
    }
    Ok(found)
}

/// Ends the test: removes everything and checks that nothing is left.
fn finish(guard: Guard) -> Result<()> {
    let (layout, fleet) = (guard.layout.clone(), guard.fleet.clone());
    drop(guard);
    let left = leftovers(&layout, &fleet)?;
    assert!(left.is_empty(), "left behind: {left:?}");
    Ok(())
}

fn running(id: &str) -> Result<bool> {
    Ok(docker(&["inspect", "-f", "{{.State.Running}}", id])? == "true")
}

/// The fleet's memory limit as the kernel reports it.
fn memory_limit(layout: &Layout, fleet: &str) -> Result<String> {
    let path = match layout {
        Layout::V1 { root } => root
            .join("memory")
            .join(fleet)
            .join("memory.limit_in_bytes"),
        Layout::V2 { root } => root.join(fleet).join("memory.max"),
    };
    Ok(RealFs.read(&path)?.trim().to_string())
}

#[test]
fn fleet_memory_limit_holds_across_containers() -> Result<()> {
    let Some(layout) = host("fleet_memory_limit_holds_across_containers") else {
        return Ok(());
    };
    let image = image()?;
    let name = fleet_name("mem");
    let mut guard = Guard::new(&layout, &name);
    let limit = 256 * MIB;
    let limits = |memory| FleetLimits {
        memory_bytes: Some(memory),
        cpus: Some(2.0),
        pids: Some(64),
    };
    // Up then down again: the kernel accepts the write order both ways.
    ensure_fleet(&RealFs, &layout, &name, limits(limit))?;
    ensure_fleet(&RealFs, &layout, &name, limits(2 * limit))?;
    assert_eq!(memory_limit(&layout, &name)?, (2 * limit).to_string());
    let fleet = ensure_fleet(&RealFs, &layout, &name, limits(limit))?;
    assert_eq!(memory_limit(&layout, &name)?, limit.to_string());

    // Each alone fits; together they cannot. Each holds its 200 MiB for a
    // minute, so that the two overlap however slowly the second starts; once
    // one has ended (the OOM killer's choice), the other is stopped.
    let hog = "import time; b = b'x' * (200 * 1024 * 1024); time.sleep(60)";
    let a = guard.run(&fleet, &image, &["python3", "-c", hog])?;
    let b = guard.run(&fleet, &image, &["python3", "-c", hog])?;

    let mut most_seen = 0;
    let mut polls = 0;
    loop {
        let (ra, rb) = (running(&a)?, running(&b)?);
        if !ra && !rb {
            break;
        }
        if ra != rb {
            let other = if ra { &a } else { &b };
            // It may end on its own meanwhile: a failed kill is no failure.
            let _ = docker(&["kill", other]);
        }
        most_seen = most_seen.max(sample(&RealFs, &layout, &name, None)?.memory_bytes);
        polls += 1;
        if polls > 1200 {
            bail!("the containers did not end within two minutes");
        }
        sleep(POLL);
    }
    let fleet_sample = sample(&RealFs, &layout, &name, None)?;
    let peak = fleet_sample.memory_peak_bytes.unwrap_or(most_seen);
    say(&format!(
        "fleet {name}: limit {limit}, peak {peak}, most sampled {most_seen}, {fleet_sample:?}"
    ));
    assert!(most_seen <= limit, "sampled {most_seen} > limit {limit}");
    assert!(peak <= limit, "peak {peak} > limit {limit}");
    assert!(
        peak >= 200 * MIB,
        "the hogs never pressed the limit: peak {peak}"
    );

    let mut killed = Vec::new();
    for id in [&a, &b] {
        let state = docker(&[
            "inspect",
            "-f",
            "{{.State.OOMKilled}} {{.State.ExitCode}}",
            id,
        ])?;
        say(&format!("container {id}: OOMKilled, exit code = {state}"));
        if state == "true 137" {
            killed.push(id.clone());
        }
    }
    assert!(!killed.is_empty(), "no container was OOM-killed");
    finish(guard)
}

#[test]
fn sample_reads_a_running_container_and_its_fleet() -> Result<()> {
    let Some(layout) = host("sample_reads_a_running_container_and_its_fleet") else {
        return Ok(());
    };
    let image = image()?;
    let name = fleet_name("sample");
    let mut guard = Guard::new(&layout, &name);
    let fleet = ensure_fleet(
        &RealFs,
        &layout,
        &name,
        FleetLimits {
            memory_bytes: Some(512 * MIB),
            cpus: None,
            pids: Some(64),
        },
    )?;
    let script = "import time; b = b'x' * (32 * 1024 * 1024); time.sleep(60)";
    let id = guard.run(&fleet, &image, &["python3", "-c", script])?;

    let mut polls = 0;
    let s = loop {
        match sample(&RealFs, &layout, &name, Some(&id)) {
            Ok(s) if s.memory_bytes >= 32 * MIB => break s,
            Ok(_) | Err(CgroupError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        polls += 1;
        if polls > 600 || !running(&id)? {
            bail!("the container never held 32 MiB");
        }
        sleep(POLL);
    };
    let whole = sample(&RealFs, &layout, &name, None)?;
    say(&format!("container {s:?}\nfleet {whole:?}"));
    assert!(s.cpu_ns > 0, "{s:?}");
    assert!(s.pids >= 1, "{s:?}");
    assert!(
        s.memory_peak_bytes.is_none_or(|p| p >= s.memory_bytes),
        "{s:?}"
    );
    assert!(s.oom_kills.is_none_or(|k| k == 0), "{s:?}");
    // The fleet's figures include its container's.
    assert!(whole.memory_bytes >= s.memory_bytes, "{whole:?} vs {s:?}");
    assert!(whole.cpu_ns >= s.cpu_ns, "{whole:?} vs {s:?}");
    assert!(whole.pids >= s.pids, "{whole:?} vs {s:?}");

    docker(&["rm", "-f", &id])?;
    let mut polls = 0;
    loop {
        match sample(&RealFs, &layout, &name, Some(&id)) {
            Err(CgroupError::NotFound { .. }) => break,
            // Read errors while the engine tears the cgroup down.
            Ok(_) | Err(CgroupError::Read { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        polls += 1;
        if polls > 300 {
            bail!("the removed container's cgroup stayed");
        }
        sleep(POLL);
    }
    finish(guard)
}

#[test]
fn fleet_pids_limit_holds() -> Result<()> {
    let Some(layout) = host("fleet_pids_limit_holds") else {
        return Ok(());
    };
    let image = image()?;
    let name = fleet_name("pids");
    let mut guard = Guard::new(&layout, &name);
    let fleet = ensure_fleet(
        &RealFs,
        &layout,
        &name,
        FleetLimits {
            memory_bytes: None,
            cpus: None,
            pids: Some(16),
        },
    )?;
    // Tries to hold 40 processes at once; prints how many forks succeeded.
    let script = "import os, time\n\
                  n = 0\n\
                  try:\n    \
                      while n < 40:\n        \
                          if os.fork() == 0:\n            \
                              time.sleep(30); os._exit(0)\n        \
                          n += 1\n\
                  except OSError:\n    \
                      pass\n\
                  print(n, flush=True)\n\
                  time.sleep(30)\n";
    let id = guard.run(&fleet, &image, &["python3", "-c", script])?;
    let mut polls = 0;
    let forked: u64 = loop {
        let logs = docker(&["logs", &id])?;
        if let Ok(n) = logs.trim().parse() {
            break n;
        }
        polls += 1;
        if polls > 600 || !running(&id)? {
            bail!("the container never reported its forks: {logs:?}");
        }
        sleep(POLL);
    };
    let whole = sample(&RealFs, &layout, &name, None)?;
    say(&format!("forked {forked} of 40; fleet {whole:?}"));
    assert!(forked < 40, "all 40 forks succeeded under a limit of 16");
    assert!(whole.pids <= 16, "{whole:?}");
    assert!(whole.pids >= 10, "the fork loop did not run: {whole:?}");
    finish(guard)
}
