//! The git remote-helper protocol, as much of it as turns `git push` into
//! push acts, parsed without I/O.
//!
//! git runs `git-remote-nightshift REMOTE ADDRESS` for a remote whose url is
//! `nightshift::ALIAS` (ADDRESS is then `ALIAS`) or `nightshift://ALIAS`
//! (ADDRESS is the whole url), and talks on its standard streams:
//! `capabilities` (we answer `push`), `list` / `list for-push` (we answer an
//! empty list: the sandbox cannot see the remote, so every ref is new to
//! git), then batches of `push [+]SRC:DST` ended by a blank line, answered
//! per ref with `ok DST` or `error DST WHY` and a blank line.
//!
//! Invariants: pure; any line gives a [`HelperCommand`] or a
//! [`HelperError`], never a panic. The alias comes from the url's address,
//! never from the remote's local name, and passes the same check as every
//! other destination, so a url that smuggles a location is refused. A reply
//! is always exactly one line (`tests::any_line_parses_or_is_refused`,
//! `tests::the_alias_comes_from_the_address`,
//! `tests::replies_are_always_one_line`).

use thiserror::Error;

use crate::validate::{check_alias, one_line, ValidationError};

/// What we can do.
pub const CAPABILITIES: &str = "push\n\n";

/// One command from git.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelperCommand {
    /// `capabilities`.
    Capabilities,
    /// `list` or `list for-push`.
    List,
    /// `push [+]SRC:DST`.
    Push(PushSpec),
    /// A blank line: ends a batch, or (outside one) the session.
    Blank,
}

/// One ref to push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushSpec {
    /// Whether git asked to force (`+`); carried to the door as `force`, so
    /// the policy can tell a rewind from a fast-forward request.
    pub force: bool,
    /// What to push, as git names it; empty for a deletion.
    pub src: String,
    /// The remote ref, as git names it (a full ref).
    pub dst: String,
}

/// A line from git that we do not take.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HelperError {
    /// A command we do not know (we advertise only `push`).
    #[error("unsupported remote-helper command {0:?}: the door only pushes")]
    Unsupported(String),
    /// A `push` line without `SRC:DST`.
    #[error("malformed push command {0:?}")]
    MalformedPush(String),
}

/// Parses one line from git (without its newline).
pub fn parse_command(line: &str) -> Result<HelperCommand, HelperError> {
    let shown = || line.chars().take(80).collect::<String>();
    match line {
        "" => Ok(HelperCommand::Blank),
        "capabilities" => Ok(HelperCommand::Capabilities),
        "list" | "list for-push" => Ok(HelperCommand::List),
        _ => {
            let Some(spec) = line.strip_prefix("push ") else {
                return Err(HelperError::Unsupported(shown()));
            };
            let (force, spec) = match spec.strip_prefix('+') {
                Some(rest) => (true, rest),
                None => (false, spec),
            };
            let Some((src, dst)) = spec.split_once(':') else {
                return Err(HelperError::MalformedPush(shown()));
            };
            if dst.is_empty() || dst.contains(':') {
                return Err(HelperError::MalformedPush(shown()));
            }
            Ok(HelperCommand::Push(PushSpec {
                force,
                src: src.to_string(),
                dst: dst.to_string(),
            }))
        }
    }
}

/// The destination alias from the address git passes (the url less
/// `nightshift::`, or the whole `nightshift://ALIAS` url).
pub fn alias_from_address(address: &str) -> Result<String, ValidationError> {
    let alias = address
        .strip_prefix("nightshift://")
        .or_else(|| address.strip_prefix("nightshift::"))
        .unwrap_or(address);
    check_alias("remote", alias)?;
    Ok(alias.to_string())
}

/// The reply for a ref the door took.
pub fn ok_line(dst: &str) -> String {
    format!("ok {}\n", one_line(dst, 512))
}

/// The reply for a ref refused, with the reason git shows beside it.
pub fn error_line(dst: &str, why: &str) -> String {
    format!("error {} {}\n", one_line(dst, 512), one_line(why, 4096))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn git_commands_parse() {
        assert_eq!(
            parse_command("capabilities"),
            Ok(HelperCommand::Capabilities)
        );
        assert_eq!(parse_command("list for-push"), Ok(HelperCommand::List));
        assert_eq!(parse_command("list"), Ok(HelperCommand::List));
        assert_eq!(parse_command(""), Ok(HelperCommand::Blank));
        assert_eq!(
            parse_command("push HEAD:refs/heads/x"),
            Ok(HelperCommand::Push(PushSpec {
                force: false,
                src: "HEAD".into(),
                dst: "refs/heads/x".into()
            }))
        );
        assert_eq!(
            parse_command("push +refs/heads/a:refs/heads/b"),
            Ok(HelperCommand::Push(PushSpec {
                force: true,
                src: "refs/heads/a".into(),
                dst: "refs/heads/b".into()
            }))
        );
        assert_eq!(
            parse_command("push :refs/heads/gone"),
            Ok(HelperCommand::Push(PushSpec {
                force: false,
                src: String::new(),
                dst: "refs/heads/gone".into()
            }))
        );
    }

    #[test]
    fn other_commands_are_refused() {
        for line in [
            "fetch abc refs/heads/x",
            "import refs/heads/x",
            "option verbosity 1",
            "connect git-upload-pack",
            "push",
            "push x",
            "push x:",
            "push a:b:c",
        ] {
            assert!(parse_command(line).is_err(), "{line}");
        }
    }

    #[test]
    fn the_alias_comes_from_the_address() {
        assert_eq!(alias_from_address("origin").unwrap(), "origin");
        assert_eq!(alias_from_address("nightshift://origin").unwrap(), "origin");
        assert_eq!(alias_from_address("nightshift::origin").unwrap(), "origin");
        for hostile in [
            "https://evil/x",
            "nightshift://git@host:x",
            "/srv/repo",
            "nightshift::../x",
            "",
        ] {
            assert!(alias_from_address(hostile).is_err(), "{hostile}");
        }
    }

    #[test]
    fn replies_are_one_line() {
        assert_eq!(ok_line("refs/heads/x"), "ok refs/heads/x\n");
        assert_eq!(
            error_line("refs/heads/x", "refused by rule r1: no\nmore"),
            "error refs/heads/x refused by rule r1: no\\nmore\n"
        );
    }

    proptest! {
        #[test]
        fn any_line_parses_or_is_refused(line in "\\PC{0,40}") {
            let _ = parse_command(&line);
        }

        #[test]
        fn replies_are_always_one_line(dst in any::<String>(), why in any::<String>()) {
            for reply in [ok_line(&dst), error_line(&dst, &why)] {
                prop_assert_eq!(reply.matches('\n').count(), 1);
                prop_assert!(reply.ends_with('\n'));
            }
        }
    }
}
