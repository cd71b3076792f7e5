//! Validation of every field a request carries.
//!
//! Invariants:
//! - Pure, and the same code on both sides: the client refuses early with
//!   the message the door would give; the door refuses whatever a client
//!   (or anything else that reaches the socket) sends that does not pass.
//! - Routing fields are names, never locations: a destination is an alias
//!   the owner configured (`[A-Za-z0-9._-]{1,64}`, not starting with `.` or
//!   `-`), and anything that looks like a URL or a path is refused by name
//!   (`tests::urls_and_paths_are_refused_by_name`,
//!   `tests::other_malformed_aliases_are_refused`).
//! - A ref on the wire is always a full branch ref, `refs/heads/...`, that
//!   passes git's `check-ref-format` rules and is printable ASCII (so what a
//!   person approves reads as what it is: no look-alike letters, no
//!   invisible characters). Short names are normalised by the client only
//!   (`tests::ref_tricks_are_refused`, `tests::short_branch_names_are_normalised`,
//!   `tests::anything_normalize_accepts_passes_the_wire_check`).
//! - Text a person will read on one line (a title) holds no control or
//!   bidirectional-override characters; bodies may hold tab, LF and CR and
//!   no other control character.

use thiserror::Error;

/// Longest destination alias.
pub const MAX_ALIAS: usize = 64;
/// Longest full ref name, in bytes.
pub const MAX_REF: usize = 255;
/// Longest pull request title, in characters.
pub const MAX_TITLE_CHARS: usize = 256;
/// Largest message or pull request body, in bytes of UTF-8.
pub const MAX_BODY: usize = 200 * 1024;
/// Largest pack one request may declare (512 MiB): larger ones are refused
/// from the request frame alone, before any of the pack is read.
pub const MAX_PACK_BYTES: u64 = 512 << 20;
/// Largest hook payload a policy check carries, in bytes of its compact
/// JSON: with the envelope it stays well inside the request frame however
/// its strings escape (the JSON's own bytes are what is counted).
pub const MAX_HOOK_PAYLOAD: usize = 200 * 1024;
/// The id git uses for "no commit" (a deleted ref).
pub const ZERO_COMMIT: &str = "0000000000000000000000000000000000000000";
/// The prefix every ref on the wire carries.
pub const BRANCH_PREFIX: &str = "refs/heads/";

/// A field that does not pass.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ValidationError {
    /// A destination alias that is a URL or a path.
    #[error("{field} {value:?}: destinations are aliases the owner configured; a URL or path is refused")]
    NotAnAlias {
        /// Which field.
        field: &'static str,
        /// What was given (bounded, control characters escaped).
        value: String,
    },
    /// A destination alias that is malformed otherwise.
    #[error(
        "{field} {value:?}: an alias is 1 to 64 of A-Z a-z 0-9 . _ -, not starting with . or -"
    )]
    BadAlias {
        /// Which field.
        field: &'static str,
        /// What was given (bounded).
        value: String,
    },
    /// A ref that does not pass.
    #[error("{field} {value:?}: {why}")]
    BadRef {
        /// Which field.
        field: &'static str,
        /// What was given (bounded).
        value: String,
        /// The rule it breaks.
        why: &'static str,
    },
    /// A commit id that is not one.
    #[error("{field} {value:?}: a commit id is 40 (or 64) lowercase hexadecimal digits")]
    BadCommit {
        /// Which field.
        field: &'static str,
        /// What was given (bounded).
        value: String,
    },
    /// A pack declared over the limit.
    #[error("{field}: a pack of {declared} bytes is over the limit of {limit} bytes")]
    PackTooLarge {
        /// Which field.
        field: &'static str,
        /// What was declared.
        declared: u64,
        /// [`MAX_PACK_BYTES`].
        limit: u64,
    },
    /// A push whose fields contradict each other.
    #[error("{why}")]
    BadPush {
        /// The rule it breaks.
        why: &'static str,
    },
    /// Text that does not pass.
    #[error("{field}: {why}")]
    BadText {
        /// Which field.
        field: &'static str,
        /// The rule it breaks.
        why: String,
    },
}

/// A value as quoted in an error: at most 80 characters, so an error
/// message stays short whatever was sent.
fn shown(value: &str) -> String {
    let mut out: String = value.chars().take(80).collect();
    if out.len() < value.len() {
        out.push('…');
    }
    out
}

/// Checks a destination alias (a remote, a message endpoint).
pub fn check_alias(field: &'static str, value: &str) -> Result<(), ValidationError> {
    let looks_like_location = value.contains(['/', '\\', ':', '@', '~'])
        || value == "."
        || value == ".."
        || value.starts_with("./");
    if looks_like_location {
        return Err(ValidationError::NotAnAlias {
            field,
            value: shown(value),
        });
    }
    let ok = !value.is_empty()
        && value.len() <= MAX_ALIAS
        && !value.starts_with(['.', '-'])
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ValidationError::BadAlias {
            field,
            value: shown(value),
        })
    }
}

/// Turns what a person or git names as a branch (`x`, `agent/x`,
/// `refs/heads/x`) into the full ref, checked. Any other `refs/...`
/// namespace (tags, notes, remotes) is refused: the door pushes branches.
pub fn normalize_branch(field: &'static str, value: &str) -> Result<String, ValidationError> {
    let full = if value.starts_with("refs/") {
        value.to_string()
    } else {
        format!("{BRANCH_PREFIX}{value}")
    };
    check_branch_ref(field, &full).map(|()| full)
}

/// Checks a full branch ref as carried on the wire: `refs/heads/NAME` where
/// the whole passes `git check-ref-format` and NAME is a valid branch name.
pub fn check_branch_ref(field: &'static str, value: &str) -> Result<(), ValidationError> {
    let bad = |why| {
        Err(ValidationError::BadRef {
            field,
            value: shown(value),
            why,
        })
    };
    let Some(branch) = value.strip_prefix(BRANCH_PREFIX) else {
        return bad("the door pushes branches: a ref must be under refs/heads/");
    };
    if branch.is_empty() {
        return bad("the branch name is empty");
    }
    if value.len() > MAX_REF {
        return bad("a ref is at most 255 bytes");
    }
    if let Some(why) = ref_format_problem(value) {
        return bad(why);
    }
    if branch.starts_with('-') {
        return bad("a branch name may not start with -");
    }
    if branch == "HEAD" {
        return bad("HEAD is not a branch name");
    }
    Ok(())
}

/// The first `git check-ref-format` rule `name` breaks, if any (plus the
/// door's own: printable ASCII only).
fn ref_format_problem(name: &str) -> Option<&'static str> {
    if let Some(c) = name.chars().find(|c| !c.is_ascii() || c.is_ascii_control()) {
        return Some(if c.is_ascii_control() {
            "a ref may not hold control characters"
        } else {
            "a ref is printable ASCII only"
        });
    }
    if name.contains([' ', '~', '^', ':', '?', '*', '[', '\\']) {
        return Some("a ref may not hold space ~ ^ : ? * [ or \\");
    }
    if name.contains("..") {
        return Some("a ref may not hold ..");
    }
    if name.contains("@{") {
        return Some("a ref may not hold @{");
    }
    if name == "@" {
        return Some("a ref may not be @");
    }
    if name.starts_with('/') || name.ends_with('/') || name.contains("//") {
        return Some("a ref may not begin or end with / or hold an empty component");
    }
    if name.ends_with('.') {
        return Some("a ref may not end with .");
    }
    for component in name.split('/') {
        if component.starts_with('.') {
            return Some("a ref component may not begin with .");
        }
        if component.ends_with(".lock") {
            return Some("a ref component may not end with .lock");
        }
    }
    None
}

/// Checks a commit id: 40 (SHA-1) or 64 (SHA-256) lowercase hex digits.
pub fn check_commit(field: &'static str, value: &str) -> Result<(), ValidationError> {
    let ok = matches!(value.len(), 40 | 64)
        && value
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ValidationError::BadCommit {
            field,
            value: shown(value),
        })
    }
}

/// Checks that a commit id is not the all-zero id (git's "no commit").
pub fn check_not_zero(field: &'static str, value: &str) -> Result<(), ValidationError> {
    if value.bytes().all(|b| b == b'0') {
        return Err(ValidationError::BadCommit {
            field,
            value: shown(value),
        });
    }
    Ok(())
}

/// Checks a declared pack size against [`MAX_PACK_BYTES`].
pub fn check_pack_bytes(field: &'static str, declared: u64) -> Result<(), ValidationError> {
    if declared > MAX_PACK_BYTES {
        return Err(ValidationError::PackTooLarge {
            field,
            declared,
            limit: MAX_PACK_BYTES,
        });
    }
    Ok(())
}

/// A push is either a deletion (the all-zero commit, no pack) or an update
/// (a real commit id); never a mix.
pub fn check_push_shape(
    commit: &str,
    delete: bool,
    pack_bytes: u64,
) -> Result<(), ValidationError> {
    let zero = commit.bytes().all(|b| b == b'0');
    match (delete, zero) {
        (true, false) => Err(ValidationError::BadPush {
            why: "a deletion carries the all-zero commit id",
        }),
        (true, true) if pack_bytes != 0 => Err(ValidationError::BadPush {
            why: "a deletion carries no pack",
        }),
        (false, true) => Err(ValidationError::BadPush {
            why: "the all-zero commit id names no commit; a deletion says \"delete\": true",
        }),
        _ => Ok(()),
    }
}

/// Characters that reorder how text is displayed (the "trojan source"
/// family): refused wherever a person reads a line as a whole.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}')
}

/// Checks a title: non-blank, one line, at most 256 characters, no control
/// or bidirectional-override characters.
pub fn check_title(field: &'static str, value: &str) -> Result<(), ValidationError> {
    let bad = |why: String| Err(ValidationError::BadText { field, why });
    if value.trim().is_empty() {
        return bad("is empty".into());
    }
    let chars = value.chars().count();
    if chars > MAX_TITLE_CHARS {
        return bad(format!(
            "is {chars} characters, over the limit of {MAX_TITLE_CHARS}"
        ));
    }
    if let Some(c) = value
        .chars()
        .find(|c| c.is_control() || is_bidi_control(*c))
    {
        return bad(format!(
            "must be one line without control characters (found {:?})",
            c
        ));
    }
    Ok(())
}

/// Checks one line of reported text (a path, a reason): at most
/// `max_bytes` bytes, no control or bidirectional-override characters
/// (the sender escapes them, see [`one_line`]).
pub fn check_line(
    field: &'static str,
    value: &str,
    max_bytes: usize,
) -> Result<(), ValidationError> {
    let bad = |why: String| Err(ValidationError::BadText { field, why });
    if value.len() > max_bytes {
        return bad(format!(
            "is {} bytes, over the limit of {max_bytes}",
            value.len()
        ));
    }
    if let Some(c) = value
        .chars()
        .find(|c| c.is_control() || is_bidi_control(*c))
    {
        return bad(format!(
            "must be one line without control characters (found {c:?})"
        ));
    }
    Ok(())
}

/// Checks a body: non-blank, at most 200 KiB of UTF-8, no control
/// characters but tab, LF and CR.
pub fn check_body(field: &'static str, value: &str) -> Result<(), ValidationError> {
    let bad = |why: String| Err(ValidationError::BadText { field, why });
    if value.len() > MAX_BODY {
        return bad(format!(
            "is {} bytes, over the limit of {MAX_BODY}",
            value.len()
        ));
    }
    if value.trim().is_empty() {
        return bad("is empty".into());
    }
    if let Some((at, c)) = value
        .char_indices()
        .find(|(_, c)| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
    {
        return bad(format!(
            "holds control character {c:?} at byte {at} (only tab, LF and CR are allowed)"
        ));
    }
    Ok(())
}

/// Checks a policy check's payload: an object, at most
/// [`MAX_HOOK_PAYLOAD`] bytes as compact JSON. What it holds is the
/// supervisor's to judge (the hook decision refuses what it cannot read).
pub fn check_hook_payload(
    field: &'static str,
    value: &serde_json::Value,
) -> Result<(), ValidationError> {
    let bad = |why: String| Err(ValidationError::BadText { field, why });
    if !value.is_object() {
        return bad("must be the harness's hook input, a JSON object".into());
    }
    let len = serde_json::to_vec(value)
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if len > MAX_HOOK_PAYLOAD {
        return bad(format!(
            "is {len} bytes of JSON, over the limit of {MAX_HOOK_PAYLOAD} (a tool call that large is refused; write large files in parts)"
        ));
    }
    Ok(())
}

/// An error and its causes, on one line (`error: cause: cause`).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// `text` made safe to print as one line: control and bidirectional
/// characters escaped, at most `max_bytes` bytes (cut on a character
/// boundary, marked with `…`).
pub fn one_line(text: &str, max_bytes: usize) -> String {
    let mut out = String::new();
    for c in text.chars() {
        let piece: String = if c.is_control() || is_bidi_control(c) {
            c.escape_default().collect()
        } else {
            c.to_string()
        };
        if out.len() + piece.len() > max_bytes.saturating_sub('…'.len_utf8()) {
            out.push('…');
            return out;
        }
        out.push_str(&piece);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn configured_aliases_pass() {
        for ok in [
            "origin",
            "github",
            "team-chat",
            "a",
            "x.y_z-1",
            &"a".repeat(64),
        ] {
            assert_eq!(check_alias("remote", ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn urls_and_paths_are_refused_by_name() {
        for hostile in [
            "https://x",
            "http://evil.example/repo.git",
            "git@host:x",
            "ssh://git@host/x",
            "file:///srv/repo",
            "/srv/repo",
            "../x",
            "./x",
            "..",
            ".",
            "~/repo",
            "C:\\repo",
            "host:repo",
            "user@host",
        ] {
            let err = check_alias("remote", hostile).unwrap_err();
            assert!(
                matches!(err, ValidationError::NotAnAlias { .. }),
                "{hostile}: {err:?}"
            );
            assert!(
                err.to_string().contains(
                    "destinations are aliases the owner configured; a URL or path is refused"
                ),
                "{err}"
            );
        }
    }

    #[test]
    fn other_malformed_aliases_are_refused() {
        for hostile in [
            "",
            "-uorigin",
            "--upload-pack=x",
            ".hidden",
            "a b",
            "a\nb",
            "a\0b",
            "orígin",
            &"a".repeat(65),
        ] {
            assert!(
                matches!(
                    check_alias("remote", hostile),
                    Err(ValidationError::BadAlias { .. })
                ),
                "{hostile:?}"
            );
        }
    }

    #[test]
    fn short_branch_names_are_normalised() {
        assert_eq!(normalize_branch("ref", "x").unwrap(), "refs/heads/x");
        assert_eq!(
            normalize_branch("ref", "agent/fix-1").unwrap(),
            "refs/heads/agent/fix-1"
        );
        assert_eq!(
            normalize_branch("ref", "refs/heads/agent/x").unwrap(),
            "refs/heads/agent/x"
        );
    }

    #[test]
    fn ref_tricks_are_refused() {
        for hostile in [
            "refs/tags/v1",
            "refs/remotes/origin/main",
            "refs/notes/x",
            "refs/heads/",
            "refs/heads/a..b",
            "refs/heads/a/../b",
            "refs/heads/.hidden",
            "refs/heads/a/.b",
            "refs/heads/x.lock",
            "refs/heads/x.lock/y",
            "refs/heads/x.",
            "refs/heads/x/",
            "refs/heads//x",
            "refs/heads/a@{1}",
            "refs/heads/a b",
            "refs/heads/a~1",
            "refs/heads/a^",
            "refs/heads/a:b",
            "refs/heads/a?",
            "refs/heads/a*",
            "refs/heads/a[",
            "refs/heads/a\\b",
            "refs/heads/a\nb",
            "refs/heads/a\tb",
            "refs/heads/a\u{7f}",
            "refs/heads/a\0",
            "refs/heads/\u{1b}[31mred",
            "refs/heads/fіx",
            "refs/heads/a\u{202e}b",
            "refs/heads/-x",
            "refs/heads/HEAD",
            "heads/x",
            "x",
        ] {
            assert!(
                check_branch_ref("ref", hostile).is_err(),
                "{hostile:?} passed"
            );
        }
        assert!(check_branch_ref("ref", &format!("refs/heads/{}", "a".repeat(245))).is_err());
        assert!(check_branch_ref("ref", &format!("refs/heads/{}", "a".repeat(244))).is_ok());
        for hostile in [
            "",
            "refs/tags/v1",
            "a..b",
            "@{u}",
            "x.lock",
            "-f",
            "HEAD",
            "a b",
        ] {
            assert!(normalize_branch("ref", hostile).is_err(), "{hostile:?}");
        }
    }

    #[test]
    fn commit_ids_are_full_lowercase_hex() {
        assert!(check_commit("commit", &"a".repeat(40)).is_ok());
        assert!(check_commit("commit", &"0123456789abcdef".repeat(4)).is_ok());
        for hostile in [
            String::new(),
            "a".repeat(39),
            "a".repeat(41),
            "A".repeat(40),
            "g".repeat(40),
            "HEAD".into(),
            format!("{}\n", "a".repeat(39)),
            "a".repeat(63),
        ] {
            assert!(check_commit("commit", &hostile).is_err(), "{hostile:?}");
        }
    }

    #[test]
    fn titles_are_one_short_clean_line() {
        assert!(check_title("title", "Fix the flaky test").is_ok());
        assert!(check_title("title", &"é".repeat(256)).is_ok());
        for hostile in [
            String::new(),
            "   ".into(),
            "two\nlines".into(),
            "carriage\rreturn".into(),
            "tab\there".into(),
            "\u{1b}[2Jclear".into(),
            "nul\0".into(),
            "c1\u{85}".into(),
            "rtl \u{202e}txt.exe".into(),
            "é".repeat(257),
        ] {
            assert!(check_title("title", &hostile).is_err(), "{hostile:?}");
        }
    }

    #[test]
    fn bodies_are_bounded_text() {
        assert!(check_body("body", "line one\n\tline two\r\n").is_ok());
        assert!(check_body("body", &"x".repeat(MAX_BODY)).is_ok());
        for hostile in [
            String::new(),
            "\n\n".into(),
            "bell\u{7}".into(),
            "escape \u{1b}[31m".into(),
            "nul\0".into(),
            "x".repeat(MAX_BODY + 1),
        ] {
            assert!(
                check_body("body", &hostile).is_err(),
                "{:?}",
                &hostile[..hostile.len().min(20)]
            );
        }
    }

    #[test]
    fn errors_quote_at_most_a_short_excerpt() {
        let long = format!("https://{}", "x".repeat(10_000));
        assert!(check_alias("remote", &long).unwrap_err().to_string().len() < 300);
    }

    #[test]
    fn one_line_escapes_and_bounds() {
        assert_eq!(one_line("a\nb\u{1b}c", 100), "a\\nb\\u{1b}c");
        let cut = one_line(&"é".repeat(100), 11);
        assert!(cut.len() <= 11 && cut.ends_with('…'), "{cut}");
    }

    proptest! {
        #[test]
        fn anything_normalize_accepts_passes_the_wire_check(s in "\\PC{0,40}") {
            if let Ok(full) = normalize_branch("ref", &s) {
                prop_assert!(check_branch_ref("ref", &full).is_ok());
                prop_assert!(full.starts_with(BRANCH_PREFIX));
            }
        }

        #[test]
        fn one_line_is_one_line_within_bounds(s in any::<String>(), max in 4usize..64) {
            let line = one_line(&s, max);
            prop_assert!(line.len() <= max);
            prop_assert!(!line.chars().any(|c| c.is_control()));
        }

        #[test]
        fn validators_never_panic(s in any::<String>()) {
            let _ = check_alias("a", &s);
            let _ = normalize_branch("r", &s);
            let _ = check_commit("c", &s);
            let _ = check_title("t", &s);
            let _ = check_body("b", &s);
        }
    }
}
