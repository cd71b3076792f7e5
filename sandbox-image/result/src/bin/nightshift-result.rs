//! `nightshift-result`: the end-of-run packer. The supervisor starts it, in
//! a sandbox of its own made like the run's, on the run's worktree once the
//! agent's container is gone:
//!
//! `nightshift-result --run-id ID --base COMMIT [--leave-out GLOB]...`
//!
//! It imports the worktree (`/workspace`) as the supervisor's import would,
//! into a scratch repository in its tmpfs standing on the base's objects the
//! supervisor wrote into the door (`/run/nightshift/base`), packs what that
//! import wrote,
//! and sends the result and the pack through the door
//! (`orchestrator_git::pack_result`; `Request::Result`). Nothing it sends
//! is trusted: the supervisor takes the pack through the act's checked
//! path and checks the claim (`orchestrator_git::take_result`).
//!
//! Exit codes: 0 the door took the result, 2 a usage mistake, 3 the door
//! refused it, 4 no result could be made or sent (the reason on standard
//! error, one line).

#![forbid(unsafe_code)]

use std::process::ExitCode;

use orchestrator_git::{pack_result, HistoryDropped, ImportLimits, ResultSpec, TipSource};
use sandbox_image_door::client::{self, DoorAddress};
use sandbox_image_door::local_git::Pack;
use sandbox_image_door::validate::{error_chain as chain, one_line};
use sandbox_image_door::{
    ReportedDrop, ReportedSkip, Request, Response, EXIT_ERROR, EXIT_USAGE, MAX_PACK_BYTES,
    MAX_REPORTED_PATH, MAX_REPORTED_TEXT, MAX_RESULT_SKIPS,
};

const USAGE: &str = "usage: nightshift-result --run-id ID --base COMMIT [--leave-out GLOB]...";
/// Where the run's worktree is mounted (`nightshift_core::sandbox::WORKSPACE`).
const WORKTREE: &str = "/workspace";
/// The scratch repository's folder, in the sandbox's own tmpfs.
const SCRATCH: &str = "/tmp/nightshift-result";
/// The base's objects, written by the supervisor into the read-only door.
const BASE_OBJECTS: &str = "/run/nightshift/base/objects";

struct Args {
    run_id: String,
    base: String,
    leave_out: Vec<String>,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let (mut run_id, mut base, mut leave_out) = (None, None, Vec::new());
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value"))?
            .clone();
        match flag.as_str() {
            "--run-id" => run_id = Some(value),
            "--base" => base = Some(value),
            "--leave-out" => leave_out.push(value),
            other => return Err(format!("unknown argument {:?}", one_line(other, 80))),
        }
    }
    Ok(Args {
        run_id: run_id.ok_or("--run-id is required")?,
        base: base.ok_or("--base is required")?,
        leave_out,
    })
}

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn main() -> ExitCode {
    let args: Result<Vec<String>, _> = std::env::args_os()
        .skip(1)
        .map(|a| a.into_string())
        .collect();
    let args = match args
        .map_err(|_| "arguments must be UTF-8".to_string())
        .and_then(|a| parse(&a))
    {
        Ok(args) => args,
        Err(why) => {
            eprintln!("nightshift-result: {why}\n{USAGE}");
            return exit(EXIT_USAGE);
        }
    };
    match run(&args) {
        Ok(response) => exit(client::print_answer(&response)),
        Err(why) => {
            eprintln!("nightshift-result: {}", one_line(&why, 2048));
            exit(EXIT_ERROR)
        }
    }
}

/// A file name as it is, cut on a character boundary to `max` bytes (the
/// last three of them `…` when cut).
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Text for the door: one line, escaped, within its limit.
fn line(text: &str) -> String {
    one_line(text, MAX_REPORTED_TEXT)
}

fn run(args: &Args) -> Result<Response, String> {
    let scratch = std::path::Path::new(SCRATCH);
    let _ = std::fs::remove_dir_all(scratch);
    std::fs::create_dir_all(scratch).map_err(|e| format!("making {SCRATCH}: {e}"))?;
    let leave_out: Vec<&str> = args.leave_out.iter().map(String::as_str).collect();
    let packed = pack_result(&ResultSpec {
        worktree: std::path::Path::new(WORKTREE),
        scratch,
        base_objects: std::path::Path::new(BASE_OBJECTS),
        run_id: &args.run_id,
        base_commit: &args.base,
        limits: ImportLimits::default(),
        committer: ("nightshift", "nightshift@localhost"),
        leave_out: &leave_out,
    })
    .map_err(|e| format!("making the run's result: {}", chain(&e)))?;
    if packed.pack_bytes > MAX_PACK_BYTES {
        return Err(format!(
            "the result's pack is {} bytes, over the door's limit of {MAX_PACK_BYTES}",
            packed.pack_bytes
        ));
    }
    let imported = &packed.imported;
    let request = Request::Result {
        result_commit: imported.result_commit.clone(),
        agent_tip: imported.agent_tip.clone(),
        observed_commit: imported.observed_commit.clone(),
        tip_source: line(&match &imported.tip_source {
            TipSource::HeadBranch(branch) => format!("head_branch {branch}"),
            TipSource::RunBranch => "run_branch".into(),
            TipSource::Base => "base".into(),
        }),
        skipped: imported
            .skipped
            .iter()
            .take(MAX_RESULT_SKIPS)
            .map(|s| ReportedSkip {
                path: cut(&s.path, MAX_REPORTED_PATH),
                why: line(&format!("{:?}", s.why)),
            })
            .collect(),
        skipped_total: imported.skipped_total.max(imported.skipped.len() as u64),
        ignored: imported.ignored,
        history_dropped: imported.history_dropped.as_ref().map(dropped),
        pack_bytes: packed.pack_bytes,
    };
    let file = std::fs::File::open(&packed.pack).map_err(|e| format!("reading the pack: {e}"))?;
    let mut pack = Pack {
        file,
        len: packed.pack_bytes,
    };
    let door = DoorAddress::from_env().map_err(|e| e.to_string())?;
    client::send_with_pack(&door, &request, Some(&mut pack)).map_err(|e| e.to_string())
}

fn dropped(h: &HistoryDropped) -> ReportedDrop {
    let (size, limit) = h.figures();
    ReportedDrop {
        kind: h.kind().to_string(),
        object: h.object().map(str::to_string),
        size,
        limit,
        why: line(&h.to_string()),
    }
}
