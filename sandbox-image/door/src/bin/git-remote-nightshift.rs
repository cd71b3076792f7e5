//! `git-remote-nightshift`: a git remote helper that turns `git push` to a
//! `nightshift::ALIAS` remote into push acts, one per ref.
//!
//! git runs it as `git-remote-nightshift REMOTE [ADDRESS]` and speaks the
//! remote-helper protocol on its standard streams (see
//! `sandbox_image_door::remote_helper`). Each pushed ref becomes one push
//! request carrying the commit (resolved here) and a pack of the objects it
//! reaches (less what `$NIGHTSHIFT_BASE_COMMIT` reaches), with git's `+` as
//! `force`; a deletion (`:DST`) is a request with `delete` and no pack, which
//! the door's policy decides like any other. Each pushed ref is answered
//! `ok DST` when the door queued or did the push, `error DST WHY` otherwise,
//! so git prints the door's answer beside the ref; the answer line also goes
//! to standard error. Exit 0 unless git sends what this helper does not
//! speak (then 1, and git reports the helper failed).

#![forbid(unsafe_code)]

use std::io::{self, BufRead, Read, Write};
use std::process::ExitCode;

use sandbox_image_door::client::{self, DoorAddress};
use sandbox_image_door::local_git::{pack_objects, resolve_commit, ENV_BASE_COMMIT};
use sandbox_image_door::remote_helper::{
    alias_from_address, error_line, ok_line, parse_command, HelperCommand, PushSpec, CAPABILITIES,
};
use sandbox_image_door::validate::ZERO_COMMIT;
use sandbox_image_door::Request;

/// Longest line accepted from git.
const MAX_LINE: u64 = 64 * 1024;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let address = args
        .get(1)
        .or_else(|| args.first())
        .cloned()
        .unwrap_or_default();
    let door = Door {
        alias: alias_from_address(&address).map_err(|e| format!("invalid request: {e}")),
        address: DoorAddress::from_env().map_err(|e| e.to_string()),
    };
    match serve(&door, io::stdin().lock(), io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("git-remote-nightshift: {message}");
            ExitCode::from(1)
        }
    }
}

struct Door {
    alias: Result<String, String>,
    address: Result<DoorAddress, String>,
}

fn serve(door: &Door, mut input: impl BufRead, mut output: impl Write) -> Result<(), String> {
    let mut batch: Vec<PushSpec> = Vec::new();
    let write = |output: &mut dyn Write, text: &str| {
        output
            .write_all(text.as_bytes())
            .and_then(|()| output.flush())
            .map_err(|e| format!("writing to git: {e}"))
    };
    loop {
        let mut raw = Vec::new();
        let read = (&mut input)
            .take(MAX_LINE)
            .read_until(b'\n', &mut raw)
            .map_err(|e| format!("reading from git: {e}"))?;
        if read == 0 {
            return Ok(());
        }
        if raw.last() != Some(&b'\n') && read as u64 == MAX_LINE {
            return Err(format!("a command from git is over {MAX_LINE} bytes"));
        }
        let line = String::from_utf8(raw).map_err(|_| "a command from git is not UTF-8")?;
        let line = line.strip_suffix('\n').unwrap_or(&line);
        match parse_command(line).map_err(|e| e.to_string())? {
            HelperCommand::Capabilities => write(&mut output, CAPABILITIES)?,
            // The sandbox cannot see the remote: every ref is new to git.
            HelperCommand::List => write(&mut output, "\n")?,
            HelperCommand::Push(spec) => batch.push(spec),
            HelperCommand::Blank if batch.is_empty() => return Ok(()),
            HelperCommand::Blank => {
                let mut replies = String::new();
                for spec in batch.drain(..) {
                    replies.push_str(&push_one(door, &spec));
                }
                replies.push('\n');
                write(&mut output, &replies)?;
            }
        }
    }
}

/// The reply line for one ref.
fn push_one(door: &Door, spec: &PushSpec) -> String {
    let refuse = |why: String| {
        eprintln!("nightshift: {}: {why}", spec.dst);
        error_line(&spec.dst, &why)
    };
    let alias = match &door.alias {
        Ok(alias) => alias.clone(),
        Err(why) => return refuse(format!("error: {why}")),
    };
    let address = match &door.address {
        Ok(address) => address,
        Err(why) => return refuse(format!("error: {why}")),
    };
    // A deletion is an act like any other: the door's policy sees it.
    if spec.src.is_empty() {
        let request = Request::Push {
            remote: alias,
            dst_ref: spec.dst.clone(),
            claimed_commit: ZERO_COMMIT.to_string(),
            force: spec.force,
            delete: true,
            pack_bytes: 0,
        };
        return answer(spec, client::send(address, &request));
    }
    let claimed_commit = match resolve_commit(&spec.src) {
        Ok(id) => id,
        Err(e) => return refuse(format!("error: {e}")),
    };
    let base = std::env::var(ENV_BASE_COMMIT).ok();
    let mut pack = match pack_objects(&claimed_commit, base.as_deref()) {
        Ok(pack) => pack,
        Err(e) => return refuse(format!("error: {e}")),
    };
    let request = Request::Push {
        remote: alias,
        dst_ref: spec.dst.clone(),
        claimed_commit,
        force: spec.force,
        delete: false,
        pack_bytes: pack.len,
    };
    answer(
        spec,
        client::send_with_pack(address, &request, Some(&mut pack)),
    )
}

/// The reply line for the door's answer (or the failure to get one).
fn answer(
    spec: &PushSpec,
    sent: Result<sandbox_image_door::Response, client::ClientError>,
) -> String {
    let refuse = |why: String| {
        eprintln!("nightshift: {}: {why}", spec.dst);
        error_line(&spec.dst, &why)
    };
    match sent {
        Ok(response) if response.exit_code() == 0 => {
            eprintln!("nightshift: {}: {}", spec.dst, response.line());
            ok_line(&spec.dst)
        }
        Ok(response) => refuse(response.line()),
        Err(e) => refuse(format!("error: {e}")),
    }
}
