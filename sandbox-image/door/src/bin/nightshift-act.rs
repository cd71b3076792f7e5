//! `nightshift-act`: asks the run's door for an act (see `--help`).
//!
//! Exit codes: 0 queued or done, 2 usage mistake (nothing sent), 3 refused
//! by a rule, 4 error (invalid request, door unreachable, protocol error,
//! the door's error reply). The door's answer is one line: on standard
//! output when queued or done, on standard error otherwise.
//!
//! `policy-check` (a harness's pre-tool hook) answers as hooks expect
//! instead: 0 allowed, 2 anything else, panics included
//! (`sandbox_image_door::hook`).

#![forbid(unsafe_code)]

use std::process::ExitCode;

use sandbox_image_door::cli::{self, Invocation, USAGE};
use sandbox_image_door::client::{self, read_body_file, DoorAddress};
use sandbox_image_door::local_git::{pack_objects, resolve_commit, Pack, ENV_BASE_COMMIT};
use sandbox_image_door::validate::{check_alias, normalize_branch, MAX_BODY};
use sandbox_image_door::{Request, Response, EXIT_ERROR, EXIT_USAGE};

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn main() -> ExitCode {
    let args: Result<Vec<String>, _> = std::env::args_os()
        .skip(1)
        .map(|a| a.into_string())
        .collect();
    let Ok(args) = args else {
        eprintln!("nightshift-act: arguments must be UTF-8\n\n{USAGE}");
        return exit(EXIT_USAGE);
    };
    if args.first().map(String::as_str) == Some("policy-check") {
        return policy_check(&args);
    }
    let invocation = match cli::parse(&args) {
        Ok(invocation) => invocation,
        Err(e) => {
            eprintln!("nightshift-act: {e}\n\n{USAGE}");
            return exit(EXIT_USAGE);
        }
    };
    let request = match invocation {
        Invocation::Help => {
            println!("{USAGE}");
            return exit(0);
        }
        Invocation::Version => {
            println!(
                "nightshift-act {} (door protocol {})",
                env!("CARGO_PKG_VERSION"),
                sandbox_image_door::PROTOCOL_VERSION
            );
            return exit(0);
        }
        other => build_request(other),
    };
    let answer = request.and_then(|(request, mut pack)| {
        let door = DoorAddress::from_env().map_err(|e| e.to_string())?;
        client::send_with_pack(&door, &request, pack.as_mut()).map_err(|e| e.to_string())
    });
    match answer {
        Ok(response) => exit(client::print_answer(&response)),
        Err(reason) => {
            eprintln!("{}", Response::Error { reason }.line());
            exit(EXIT_ERROR)
        }
    }
}

/// Longest a policy check waits for the door, whatever
/// `$NIGHTSHIFT_DOOR_TIMEOUT_SECS` says: harnesses run the tool when a
/// hook outlives their own timeout.
const POLICY_CHECK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// `policy-check`: exit 0 only when the door says the rules allow the call;
/// exit 2 with one line on standard error for everything else.
fn policy_check(args: &[String]) -> ExitCode {
    use sandbox_image_door::hook;
    let run = || -> (i32, Option<String>) {
        if let Err(e) = cli::parse(args) {
            return hook::answer(Err(format!("usage: {e}")));
        }
        let mut stdin = Vec::new();
        let read = std::io::Read::read_to_end(
            &mut std::io::Read::take(std::io::stdin().lock(), hook::MAX_STDIN as u64 + 1),
            &mut stdin,
        );
        if let Err(e) = read {
            return hook::answer(Err(format!("reading the hook's input: {e}")));
        }
        let request = match hook::request(&stdin) {
            Ok(r) => r,
            Err(line) => return (hook::EXIT_BLOCK, Some(line)),
        };
        let answer = DoorAddress::from_env()
            .map(|mut door| {
                door.timeout = door.timeout.min(POLICY_CHECK_WAIT);
                door
            })
            .map_err(|e| e.to_string())
            .and_then(|door| client::send(&door, &request).map_err(|e| e.to_string()));
        hook::answer(answer)
    };
    let (code, line) = std::panic::catch_unwind(run).unwrap_or((
        hook::EXIT_BLOCK,
        Some(format!(
            "refused by rule {}: the hook client failed",
            hook::DOOR_ID
        )),
    ));
    if let Some(line) = line {
        eprintln!("{line}");
    }
    exit(code)
}

/// The pack of what `commit` reaches, less what the run's base reaches.
fn pack_for(commit: &str) -> Result<Pack, String> {
    let base = std::env::var(ENV_BASE_COMMIT).ok();
    pack_objects(commit, base.as_deref()).map_err(|e| e.to_string())
}

/// The request an invocation asks for, with files read, names checked and
/// the pack it declares made.
fn build_request(invocation: Invocation) -> Result<(Request, Option<Pack>), String> {
    let body = |file: &str| read_body_file(file, MAX_BODY).map_err(|e| e.to_string());
    let invalid = |e: sandbox_image_door::ValidationError| format!("invalid request: {e}");
    Ok(match invocation {
        Invocation::Help | Invocation::Version | Invocation::PolicyCheck => {
            return Err("nothing to send".into());
        }
        Invocation::Push {
            remote,
            src,
            dst,
            commit,
        } => {
            check_alias("remote", &remote).map_err(invalid)?;
            let dst_ref = normalize_branch("branch", &dst).map_err(invalid)?;
            let claimed_commit = match commit {
                Some(commit) => commit,
                None => resolve_commit(&src).map_err(|e| e.to_string())?,
            };
            sandbox_image_door::validate::check_commit("--commit", &claimed_commit)
                .and_then(|()| {
                    sandbox_image_door::validate::check_not_zero("--commit", &claimed_commit)
                })
                .map_err(invalid)?;
            let pack = pack_for(&claimed_commit)?;
            (
                Request::Push {
                    remote,
                    dst_ref,
                    claimed_commit,
                    force: false,
                    delete: false,
                    pack_bytes: pack.len,
                },
                Some(pack),
            )
        }
        Invocation::PullRequest {
            remote,
            base,
            head,
            title,
            body_file,
        } => {
            let head = normalize_branch("head", &head).map_err(invalid)?;
            let base = normalize_branch("base", &base).map_err(invalid)?;
            let body = body(&body_file)?;
            check_alias("remote", &remote).map_err(invalid)?;
            sandbox_image_door::validate::check_title("title", &title).map_err(invalid)?;
            sandbox_image_door::validate::check_body("body", &body).map_err(invalid)?;
            let head_commit = resolve_commit(&head).map_err(|e| e.to_string())?;
            let pack = pack_for(&head_commit)?;
            (
                Request::PullRequest {
                    base,
                    head,
                    head_commit,
                    pack_bytes: pack.len,
                    body,
                    remote,
                    title,
                },
                Some(pack),
            )
        }
        Invocation::Notify { destination, file } => (
            Request::Notify {
                body: body(&file)?,
                destination,
            },
            None,
        ),
        Invocation::Ask { file } => (Request::Ask { body: body(&file)? }, None),
    })
}
