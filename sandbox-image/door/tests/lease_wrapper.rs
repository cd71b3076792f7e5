//! `nightshift-lease` as a process, outside any sandbox: it passes on its
//! command's status, ends the command when the heartbeat does not grow, and
//! is kept alive only by a growing counter (never by a touched file).

use std::path::Path;
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sandbox_image_door::lease::{format_heartbeat, EXIT_EXPIRED};

fn wrapper(bound_ms: u64, heartbeat: &Path, command: &[&str]) -> ExitStatus {
    Command::new(env!("CARGO_BIN_EXE_nightshift-lease"))
        .args(["--bound-ms", &bound_ms.to_string(), "--heartbeat"])
        .arg(heartbeat)
        .arg("--")
        .args(command)
        .status()
        .expect("running nightshift-lease")
}

/// Writes a heartbeat every 100 ms until dropped: a growing counter, or the
/// same one again and again (with a fresh mtime each time).
struct Writer(Arc<AtomicBool>);

impl Writer {
    fn start(path: &Path, grow: bool) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, path) = (stop.clone(), path.to_path_buf());
        std::thread::spawn(move || {
            let mut n = 1;
            while !flag.load(Ordering::SeqCst) {
                let tmp = path.with_extension("tmp");
                std::fs::write(&tmp, format_heartbeat(n, 0)).unwrap();
                std::fs::rename(&tmp, &path).unwrap();
                if grow {
                    n += 1;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Self(stop)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn the_commands_status_passes_through() {
    let dir = tempfile::tempdir().unwrap();
    let hb = dir.path().join("heartbeat");
    let _w = Writer::start(&hb, true);
    assert_eq!(wrapper(5000, &hb, &["sh", "-c", "exit 7"]).code(), Some(7));
    assert_eq!(
        wrapper(5000, &hb, &["sh", "-c", "kill -9 $$"]).code(),
        Some(137)
    );
    assert_eq!(
        wrapper(5000, &hb, &["/nonexistent/agent"]).code(),
        Some(126)
    );
}

#[test]
fn without_a_heartbeat_the_command_is_ended() {
    let dir = tempfile::tempdir().unwrap();
    let hb = dir.path().join("heartbeat");
    assert_eq!(
        wrapper(1000, &hb, &["sleep", "120"]).code(),
        Some(EXIT_EXPIRED)
    );
}

#[test]
fn a_growing_counter_keeps_the_command_alive() {
    let dir = tempfile::tempdir().unwrap();
    let hb = dir.path().join("heartbeat");
    let _w = Writer::start(&hb, true);
    // Three bounds long: it ends by itself, with its own status.
    assert_eq!(
        wrapper(1000, &hb, &["sh", "-c", "sleep 3; exit 4"]).code(),
        Some(4)
    );
}

#[test]
fn the_same_counter_rewritten_renews_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let hb = dir.path().join("heartbeat");
    let _w = Writer::start(&hb, false);
    assert_eq!(
        wrapper(1000, &hb, &["sleep", "120"]).code(),
        Some(EXIT_EXPIRED)
    );
}

/// A warm sandbox's wrapper: started with `--command-file`, waiting.
fn warm(bound_ms: u64, heartbeat: &Path, file: &Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_nightshift-lease"))
        .args(["--bound-ms", &bound_ms.to_string(), "--heartbeat"])
        .arg(heartbeat)
        .arg("--command-file")
        .arg(file)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("running nightshift-lease")
}

/// Writes `late` as the supervisor does: whole, renamed into place.
fn hand(file: &Path, late: &[u8]) {
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, late).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

#[test]
fn a_warm_wrapper_waits_then_runs_its_command_with_the_late_environment() {
    use sandbox_image_door::lease::{format_command_file, LateCommand};
    let dir = tempfile::tempdir().unwrap();
    let (hb, file) = (dir.path().join("heartbeat"), dir.path().join("command"));
    let _w = Writer::start(&hb, true);
    let child = warm(2000, &hb, &file);
    // Longer than the bound: the renewed lease keeps it waiting.
    std::thread::sleep(Duration::from_millis(2500));
    let late = LateCommand {
        argv: vec![
            "sh".into(),
            "-c".into(),
            "printf '%s|%s' \"$NIGHTSHIFT_TASK\" \"$NIGHTSHIFT_BASE_COMMIT\"; exit 3".into(),
        ],
        env: [
            ("NIGHTSHIFT_TASK".to_string(), "fix it".to_string()),
            ("NIGHTSHIFT_BASE_COMMIT".to_string(), "abc".to_string()),
        ]
        .into(),
    };
    hand(&file, &format_command_file(&late));
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "fix it|abc");
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn a_warm_wrapper_whose_lease_lapses_ends_without_a_command() {
    let dir = tempfile::tempdir().unwrap();
    let (hb, file) = (dir.path().join("heartbeat"), dir.path().join("command"));
    let mut child = warm(1000, &hb, &file);
    assert_eq!(child.wait().unwrap().code(), Some(EXIT_EXPIRED));
}

#[test]
fn a_command_file_that_sets_other_environment_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (hb, file) = (dir.path().join("heartbeat"), dir.path().join("command"));
    let marker = dir.path().join("ran");
    let _w = Writer::start(&hb, true);
    let child = warm(5000, &hb, &file);
    let late = format!(
        r#"{{"argv": ["touch", "{}"], "env": {{"LD_PRELOAD": "/tmp/x.so"}}}}"#,
        marker.display()
    );
    hand(&file, late.as_bytes());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(126));
    assert!(!marker.exists(), "a refused command file ran its command");
}
