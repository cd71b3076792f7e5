//! `nightshift-act`'s command line, parsed without I/O.
//!
//! Invariants: pure; any argument list gives an [`Invocation`] or a
//! [`UsageError`] that says what is wrong, never a panic
//! (`tests::any_arguments_parse_or_say_why`). Values are taken
//! as given here; they are validated (aliases, refs, text) when the request
//! is built, by the same checks the door applies.

use thiserror::Error;

/// The usage text printed by `--help` and after a usage error.
pub const USAGE: &str = "\
usage:
  nightshift-act push REMOTE [SRC:]BRANCH [--commit ID]
  nightshift-act pr --remote R --base B --head H --title T --body-file F
  nightshift-act notify DESTINATION --file F
  nightshift-act ask --file F
  nightshift-act policy-check
  nightshift-act --help | --version

Asks the run's door (a Unix socket: $NIGHTSHIFT_DOOR, else
/run/nightshift/door.sock) for an act outside the sandbox. REMOTE and
DESTINATION are aliases the owner configured, never URLs or paths. push sends
the commit SRC names (default: BRANCH itself; HEAD:BRANCH for the current
commit), resolved with `git rev-parse` unless --commit gives it; pr sends the
commit the head branch holds here. Either also sends a pack of the objects
that commit reaches (less what $NIGHTSHIFT_BASE_COMMIT reaches), made with
`git pack-objects` in the current repository. A file of - is standard input. The door answers at once:
  queued as act ID for approval   exit 0, the run goes on
  done                            exit 0
  refused by rule ID: REASON      exit 3
  error: REASON                   exit 4 (also: door unreachable, bad request)
A usage mistake exits 2. $NIGHTSHIFT_DOOR_TIMEOUT_SECS bounds the wait (30).

policy-check is a harness's pre-tool hook (Claude Code's PreToolUse): it
reads the hook's input from standard input as the harness sends it (JSON
with tool_name and tool_input), asks the run's rules through the door, and
exits 0 (nothing printed) when they allow the call; otherwise it exits 2
with the reason on standard error: refused, asks a person, or any failure
(the door unreachable, bad input). It waits at most 10 s.";

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// Print the usage.
    Help,
    /// Print the version.
    Version,
    /// `push REMOTE [SRC:]BRANCH [--commit ID]`.
    Push {
        /// The remote's alias.
        remote: String,
        /// What to resolve to a commit, when `commit` is not given.
        src: String,
        /// The destination branch, short or full.
        dst: String,
        /// The commit, if given.
        commit: Option<String>,
    },
    /// `pr ...`.
    PullRequest {
        /// The remote's alias.
        remote: String,
        /// The base branch.
        base: String,
        /// The head branch.
        head: String,
        /// The title.
        title: String,
        /// The body's file (`-`: standard input).
        body_file: String,
    },
    /// `notify DESTINATION --file F`.
    Notify {
        /// The endpoint's alias.
        destination: String,
        /// The message's file.
        file: String,
    },
    /// `ask --file F`.
    Ask {
        /// The question's file.
        file: String,
    },
    /// `policy-check`: the hook's input on standard input.
    PolicyCheck,
}

/// A command line that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UsageError {
    /// No subcommand.
    #[error("no command given")]
    NoCommand,
    /// An unknown subcommand.
    #[error("unknown command {0:?}")]
    UnknownCommand(String),
    /// An option the subcommand does not take.
    #[error("{command}: unknown option {option:?}")]
    UnknownOption {
        /// The subcommand.
        command: &'static str,
        /// The option.
        option: String,
    },
    /// An option without its value.
    #[error("{command}: option {option} needs a value")]
    MissingValue {
        /// The subcommand.
        command: &'static str,
        /// The option.
        option: &'static str,
    },
    /// An option given twice.
    #[error("{command}: option {option} given twice")]
    Repeated {
        /// The subcommand.
        command: &'static str,
        /// The option.
        option: &'static str,
    },
    /// A required option not given.
    #[error("{command}: option {option} is required")]
    Required {
        /// The subcommand.
        command: &'static str,
        /// The option.
        option: &'static str,
    },
    /// The wrong number of operands.
    #[error("{command}: expected {expected}, got {got} operand(s)")]
    Operands {
        /// The subcommand.
        command: &'static str,
        /// What it takes.
        expected: &'static str,
        /// How many were given.
        got: usize,
    },
    /// A push whose destination branch cannot be told.
    #[error("push: {0}")]
    Refspec(&'static str),
}

/// Splits the arguments after a subcommand into operands and the values of
/// the options `known` (each `--name VALUE` or `--name=VALUE`, at most once).
fn split(
    command: &'static str,
    args: &[String],
    known: &[&'static str],
) -> Result<(Vec<String>, Vec<Option<String>>), UsageError> {
    let mut operands = Vec::new();
    let mut values: Vec<Option<String>> = vec![None; known.len()];
    let mut iter = args.iter();
    let mut only_operands = false;
    while let Some(arg) = iter.next() {
        if only_operands || !arg.starts_with("--") {
            operands.push(arg.clone());
            continue;
        }
        if arg == "--" {
            only_operands = true;
            continue;
        }
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) => (name, Some(value.to_string())),
            None => (arg.as_str(), None),
        };
        let Some(index) = known.iter().position(|k| *k == name) else {
            return Err(UsageError::UnknownOption {
                command,
                option: arg.chars().take(80).collect(),
            });
        };
        let option = known[index];
        let value = match inline {
            Some(value) => value,
            None => iter
                .next()
                .cloned()
                .ok_or(UsageError::MissingValue { command, option })?,
        };
        if values[index].replace(value).is_some() {
            return Err(UsageError::Repeated { command, option });
        }
    }
    Ok((operands, values))
}

fn required(
    command: &'static str,
    option: &'static str,
    value: Option<String>,
) -> Result<String, UsageError> {
    value.ok_or(UsageError::Required { command, option })
}

fn operands<const N: usize>(
    command: &'static str,
    expected: &'static str,
    got: Vec<String>,
) -> Result<[String; N], UsageError> {
    let count = got.len();
    got.try_into().map_err(|_| UsageError::Operands {
        command,
        expected,
        got: count,
    })
}

/// Parses the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Invocation, UsageError> {
    let Some((command, rest)) = args.split_first() else {
        return Err(UsageError::NoCommand);
    };
    match command.as_str() {
        "--help" | "-h" | "help" => Ok(Invocation::Help),
        "--version" | "-V" => Ok(Invocation::Version),
        "policy-check" => {
            let (ops, _) = split("policy-check", rest, &[])?;
            operands::<0>("policy-check", "no operands", ops)?;
            Ok(Invocation::PolicyCheck)
        }
        "push" => {
            let (ops, values) = split("push", rest, &["--commit"])?;
            let [remote, refspec] = operands("push", "REMOTE [SRC:]BRANCH", ops)?;
            let [commit] = <[Option<String>; 1]>::try_from(values).unwrap_or_default();
            let (src, dst) = match refspec.split_once(':') {
                Some((src, dst)) => (src.to_string(), dst.to_string()),
                None => (refspec.clone(), refspec),
            };
            if dst.is_empty() {
                return Err(UsageError::Refspec(
                    "no destination branch (deleting a branch is not an act)",
                ));
            }
            if dst == "HEAD" {
                return Err(UsageError::Refspec(
                    "name the destination branch: HEAD:BRANCH",
                ));
            }
            if src.is_empty() && commit.is_none() {
                return Err(UsageError::Refspec("no source: SRC:BRANCH or --commit ID"));
            }
            Ok(Invocation::Push {
                remote,
                src,
                dst,
                commit,
            })
        }
        "pr" => {
            let known = ["--remote", "--base", "--head", "--title", "--body-file"];
            let (ops, values) = split("pr", rest, &known)?;
            operands::<0>("pr", "no operands", ops)?;
            let mut values = values.into_iter();
            let mut next = |option| required("pr", option, values.next().flatten());
            Ok(Invocation::PullRequest {
                remote: next("--remote")?,
                base: next("--base")?,
                head: next("--head")?,
                title: next("--title")?,
                body_file: next("--body-file")?,
            })
        }
        "notify" => {
            let (ops, values) = split("notify", rest, &["--file"])?;
            let [destination] = operands("notify", "DESTINATION", ops)?;
            let file = required("notify", "--file", values.into_iter().next().flatten())?;
            Ok(Invocation::Notify { destination, file })
        }
        "ask" => {
            let (ops, values) = split("ask", rest, &["--file"])?;
            operands::<0>("ask", "no operands", ops)?;
            let file = required("ask", "--file", values.into_iter().next().flatten())?;
            Ok(Invocation::Ask { file })
        }
        other => Err(UsageError::UnknownCommand(other.chars().take(80).collect())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn args(line: &str) -> Vec<String> {
        line.split(' ').map(str::to_string).collect()
    }

    #[test]
    fn every_command_parses() {
        assert_eq!(
            parse(&args("push origin agent/x")),
            Ok(Invocation::Push {
                remote: "origin".into(),
                src: "agent/x".into(),
                dst: "agent/x".into(),
                commit: None
            })
        );
        assert_eq!(
            parse(&args("push origin HEAD:refs/heads/x --commit abc")),
            Ok(Invocation::Push {
                remote: "origin".into(),
                src: "HEAD".into(),
                dst: "refs/heads/x".into(),
                commit: Some("abc".into())
            })
        );
        assert_eq!(
            parse(&args(
                "pr --remote origin --base main --head agent/x --title=T --body-file -"
            )),
            Ok(Invocation::PullRequest {
                remote: "origin".into(),
                base: "main".into(),
                head: "agent/x".into(),
                title: "T".into(),
                body_file: "-".into()
            })
        );
        assert_eq!(
            parse(&args("notify chat --file m.txt")),
            Ok(Invocation::Notify {
                destination: "chat".into(),
                file: "m.txt".into()
            })
        );
        assert_eq!(
            parse(&args("ask --file q.txt")),
            Ok(Invocation::Ask {
                file: "q.txt".into()
            })
        );
        assert_eq!(parse(&args("--help")), Ok(Invocation::Help));
        assert_eq!(parse(&args("--version")), Ok(Invocation::Version));
    }

    #[test]
    fn a_title_with_spaces_is_one_value() {
        let mut a = args("pr --remote o --base main --head x --body-file f --title");
        a.push("Fix the --flaky test".into());
        assert!(
            matches!(parse(&a), Ok(Invocation::PullRequest { title, .. }) if title == "Fix the --flaky test")
        );
    }

    #[test]
    fn usage_mistakes_are_named() {
        let cases = [
            ("", UsageError::UnknownCommand(String::new())),
            ("deploy prod", UsageError::UnknownCommand("deploy".into())),
            (
                "push origin",
                UsageError::Operands {
                    command: "push",
                    expected: "REMOTE [SRC:]BRANCH",
                    got: 1,
                },
            ),
            (
                "push origin HEAD",
                UsageError::Refspec("name the destination branch: HEAD:BRANCH"),
            ),
            (
                "push origin :x",
                UsageError::Refspec("no source: SRC:BRANCH or --commit ID"),
            ),
            (
                "push origin x:",
                UsageError::Refspec("no destination branch (deleting a branch is not an act)"),
            ),
            (
                "push origin x --force",
                UsageError::UnknownOption {
                    command: "push",
                    option: "--force".into(),
                },
            ),
            (
                "push origin x --commit",
                UsageError::MissingValue {
                    command: "push",
                    option: "--commit",
                },
            ),
            (
                "push origin x --commit a --commit b",
                UsageError::Repeated {
                    command: "push",
                    option: "--commit",
                },
            ),
            (
                "pr --remote o --base b --head h --title t",
                UsageError::Required {
                    command: "pr",
                    option: "--body-file",
                },
            ),
            (
                "pr x --remote o",
                UsageError::Operands {
                    command: "pr",
                    expected: "no operands",
                    got: 1,
                },
            ),
            (
                "notify --file f",
                UsageError::Operands {
                    command: "notify",
                    expected: "DESTINATION",
                    got: 0,
                },
            ),
            (
                "ask",
                UsageError::Required {
                    command: "ask",
                    option: "--file",
                },
            ),
        ];
        for (line, expected) in cases {
            assert_eq!(parse(&args(line)), Err(expected), "{line}");
        }
        assert_eq!(parse(&[]), Err(UsageError::NoCommand));
    }

    proptest! {
        #[test]
        fn any_arguments_parse_or_say_why(a in proptest::collection::vec("(--)?[a-z=:-]{0,8}|\\PC{0,8}", 0..8)) {
            let _ = parse(&a);
        }
    }
}
