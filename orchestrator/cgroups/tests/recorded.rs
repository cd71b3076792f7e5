//! `sample()` and `detect()` over recorded cgroup files: v1 files recorded on
//! a real v1 host (a container OOM-killed once under a 64 MiB limit), v2
//! files written from the kernel's documented formats.

use orchestrator_cgroups::{detect, sample, CgroupError, FakeFs, Layout, Sample};

const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn fixture(rel: &str) -> String {
    let path = format!("{}/tests/fixtures/{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn v1_host(oom_control: &str) -> FakeFs {
    let c = |h: &str, f: &str| format!("/sys/fs/cgroup/{h}/nsf/{ID}/{f}");
    FakeFs::new()
        .with_file("/proc/self/mountinfo", &fixture("v1/mountinfo.hybrid"))
        .with_file(
            c("memory", "memory.usage_in_bytes"),
            &fixture("v1/memory.usage_in_bytes"),
        )
        .with_file(
            c("memory", "memory.max_usage_in_bytes"),
            &fixture("v1/memory.max_usage_in_bytes"),
        )
        .with_file(c("memory", "memory.oom_control"), &fixture(oom_control))
        .with_file(c("cpuacct", "cpuacct.usage"), &fixture("v1/cpuacct.usage"))
        .with_file(c("pids", "pids.current"), &fixture("v1/pids.current"))
}

#[test]
fn v1_recorded_container() {
    let fs = v1_host("v1/memory.oom_control");
    let layout = detect(&fs).unwrap();
    assert_eq!(
        layout,
        Layout::V1 {
            root: "/sys/fs/cgroup".into()
        }
    );
    let s = sample(&fs, &layout, "nsf", Some(ID)).unwrap();
    assert_eq!(
        s,
        Sample {
            memory_bytes: 3_420_160,
            memory_peak_bytes: Some(67_108_864),
            cpu_ns: 183_091_572,
            pids: 1,
            oom_kills: Some(1),
        }
    );
}

#[test]
fn v1_old_kernel_has_no_oom_kill_count() {
    let fs = v1_host("v1/memory.oom_control.pre-4.13");
    let layout = detect(&fs).unwrap();
    let s = sample(&fs, &layout, "nsf", Some(ID)).unwrap();
    assert_eq!(s.oom_kills, None);
    assert_eq!(s.memory_bytes, 3_420_160);
}

fn v2_host(events: &str, with_peak: bool) -> FakeFs {
    let c = |f: &str| format!("/sys/fs/cgroup/nsf/{ID}/{f}");
    let fs = FakeFs::new()
        .with_file("/proc/self/mountinfo", &fixture("v2/mountinfo"))
        .with_file(c("memory.current"), &fixture("v2/memory.current"))
        .with_file(c("memory.events"), &fixture(events))
        .with_file(c("cpu.stat"), &fixture("v2/cpu.stat"))
        .with_file(c("pids.current"), &fixture("v2/pids.current"));
    if with_peak {
        fs.with_file(c("memory.peak"), &fixture("v2/memory.peak"))
    } else {
        fs
    }
}

#[test]
fn v2_recorded_container() {
    let fs = v2_host("v2/memory.events", true);
    let layout = detect(&fs).unwrap();
    assert_eq!(
        layout,
        Layout::V2 {
            root: "/sys/fs/cgroup".into()
        }
    );
    let s = sample(&fs, &layout, "nsf", Some(ID)).unwrap();
    assert_eq!(
        s,
        Sample {
            memory_bytes: 5_242_880,
            memory_peak_bytes: Some(209_715_200),
            cpu_ns: 183_091_000,
            pids: 3,
            oom_kills: Some(1),
        }
    );
}

#[test]
fn v2_before_memory_peak() {
    let fs = v2_host("v2/memory.events.pre-6.1", false);
    let layout = detect(&fs).unwrap();
    let s = sample(&fs, &layout, "nsf", Some(ID)).unwrap();
    assert_eq!(s.memory_peak_bytes, None);
    assert_eq!(s.oom_kills, Some(0));
}

#[test]
fn v2_cpu_stat_without_usage_is_an_error_naming_the_file() {
    let fs = v2_host("v2/memory.events", true);
    fs.set(format!("/sys/fs/cgroup/nsf/{ID}/cpu.stat"), "user_usec 1\n");
    let layout = detect(&fs).unwrap();
    let err = sample(&fs, &layout, "nsf", Some(ID)).unwrap_err();
    assert!(matches!(err, CgroupError::Parse { .. }), "{err}");
    assert!(err.to_string().contains("cpu.stat"), "{err}");
}
