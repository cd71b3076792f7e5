//! What any command prints: untrusted text made safe for a terminal, JSON
//! that a terminal cannot misread, and stdout that a closed pipe ends quietly.
//!
//! Invariants:
//! - Every character that could make a line read differently from what it
//!   is (C0 and C1 controls, DEL, bidirectional controls, zero-width and
//!   other invisible format characters: Unicode's `Cc`, `Cf`, `Zl`, `Zp`,
//!   unassigned and private-use code points, and every default-ignorable
//!   code point) is shown as a visible escape, `\u{202e}`; bytes that are not
//!   UTF-8 are shown as `\x{ff}`. Nothing else is changed, except a
//!   backslash that would itself read as the start of such an escape
//!   (`\u{` or `\x{`), which is shown as `\u{5c}`: distinct inputs never
//!   print alike ([`line`] and [`block`] are injective)
//!   (`tests::every_named_character_is_escaped`, `tests::ordinary_text_is_unchanged`,
//!   `tests::distinct_inputs_print_differently`,
//!   `tests::escape_look_alikes_do_not_collide`).
//! - [`line`] is for a value shown on one line (a file name, a branch, a
//!   reason): newlines and tabs are escaped too, so it cannot forge another
//!   line. [`block`] is for a body shown as lines (output, a message, a
//!   diff): it keeps newlines and tabs and escapes the rest.
//! - [`json`] writes every non-ASCII character (and DEL) as `\uXXXX`: still
//!   valid JSON, the same value once parsed, and pure printable ASCII, so a
//!   terminal shown it (`--json | head`) reads it as what it is.
//! - Whatever a command prints (clap's own usage text aside), and the log,
//!   goes through [`out`] / [`err`], which escape the same characters again
//!   as a net (our own words never hold them), so a value a command forgot
//!   to pass through [`line`] still cannot reach the terminal raw. A closed
//!   stdout (`| head`) ends the output quietly:
//!   no panic, no signal, the command's own exit code
//!   (`tests::no_module_prints_around_the_sanitiser`,
//!   `tests::the_net_escapes_what_a_caller_forgot`,
//!   `tests/tests/terminal.rs::no_command_prints_agent_text_raw`).
//! - The log is one event a line: the text log's writer ([`NetStderr`])
//!   escapes every hidden character of an event, newlines and tabs
//!   included, but its last newline ([`log_line`]); the JSON log's
//!   ([`JsonStderr`]) writes every character serde_json leaves raw as a
//!   `\uXXXX` escape ([`json_log_line`]), which keeps the object's value.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::LazyLock;

/// Code points escaped on top of the controls (`char::is_control`).
static HIDDEN: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(
        r"[\p{Cf}\p{Zl}\p{Zp}\p{Cn}\p{Co}\p{Default_Ignorable_Code_Point}\p{Bidi_Control}]",
    )
    .expect("the hidden-character class is a valid regex")
});

/// Whether `c` is shown as an escape rather than as itself.
pub fn is_hidden(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_control();
    }
    if c.is_control() {
        return true;
    }
    let mut buf = [0u8; 4];
    HIDDEN.is_match(c.encode_utf8(&mut buf))
}

fn escape_char(out: &mut String, c: char) {
    let _ = write!(out, "\\u{{{:x}}}", c as u32);
}

/// The one sanitiser: `keep` says which controls stay as they are.
fn sanitize(bytes: &[u8], keep: fn(char) -> bool) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        let valid = chunk.valid();
        let mut chars = valid.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '\\' {
                // Only a backslash that would read as an escape's start is escaped.
                let mut rest = chars.clone();
                let starts_escape =
                    matches!(rest.next(), Some('u' | 'x')) && matches!(rest.next(), Some('{'));
                if starts_escape {
                    escape_char(&mut out, c);
                } else {
                    out.push(c);
                }
            } else if is_hidden(c) && !keep(c) {
                escape_char(&mut out, c);
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{{{b:x}}}");
        }
    }
    out
}

/// A value shown on one line: every hidden character, newlines and tabs
/// included, is escaped.
pub fn line(text: &str) -> String {
    sanitize(text.as_bytes(), |_| false)
}

/// [`line`] for bytes that may not be UTF-8.
pub fn line_bytes(bytes: &[u8]) -> String {
    sanitize(bytes, |_| false)
}

/// A body shown as lines: newlines and tabs stay, every other hidden
/// character is escaped, so each line is shown as what it is.
pub fn block(bytes: &[u8]) -> String {
    sanitize(bytes, |c| c == '\n' || c == '\t')
}

/// Serialises `value` as JSON whose every non-ASCII character (and DEL) is
/// a `\uXXXX` escape; pretty-printed when `pretty`.
pub fn json<T: serde::Serialize + ?Sized>(value: &T, pretty: bool) -> String {
    let mut buf = Vec::new();
    let written = if pretty {
        let mut ser = serde_json::Serializer::with_formatter(
            &mut buf,
            AsciiFormatter(serde_json::ser::PrettyFormatter::new()),
        );
        value.serialize(&mut ser)
    } else {
        let mut ser =
            serde_json::Serializer::with_formatter(&mut buf, AsciiFormatter(CompactFormatter));
        value.serialize(&mut ser)
    };
    match written {
        // The formatter writes ASCII only.
        Ok(()) => String::from_utf8(buf).unwrap_or_default(),
        Err(e) => format!(
            "{{\"error\":{}}}",
            json(&format!("serialising: {e}"), false)
        ),
    }
}

#[derive(Debug, Clone, Copy)]
struct CompactFormatter;
impl serde_json::ser::Formatter for CompactFormatter {}

/// A formatter that escapes what serde_json would write raw.
#[derive(Debug)]
struct AsciiFormatter<F>(F);

macro_rules! delegate {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {
        $(fn $name<W: ?Sized + std::io::Write>(&mut self, writer: &mut W $(, $arg: $ty)*) -> std::io::Result<()> {
            self.0.$name(writer $(, $arg)*)
        })*
    };
}

impl<F: serde_json::ser::Formatter> serde_json::ser::Formatter for AsciiFormatter<F> {
    delegate! {
        begin_array();
        end_array();
        begin_array_value(first: bool);
        end_array_value();
        begin_object();
        end_object();
        begin_object_key(first: bool);
        end_object_key();
        begin_object_value();
        end_object_value();
    }

    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            if c.is_ascii() && c != '\x7f' {
                continue;
            }
            writer.write_all(&fragment.as_bytes()[start..i])?;
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                write!(writer, "\\u{unit:04x}")?;
            }
            start = i + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }
}

const OPEN: u8 = 0;
const CLOSED_PIPE: u8 = 1;
const FAILED: u8 = 2;
static STDOUT: AtomicU8 = AtomicU8::new(OPEN);

/// The net under everything printed: hidden characters other than newline
/// and tab escaped (no backslash rule: what it gets is already shown text).
fn net(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| is_hidden(c) && c != '\n' && c != '\t') {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_hidden(c) && c != '\n' && c != '\t' {
            escape_char(&mut out, c);
        } else {
            out.push(c);
        }
    }
    out.into()
}

/// Prints to stdout (through the net). Once the reader has gone (a closed
/// pipe), the rest of the output is dropped quietly; any other write error
/// is said once on stderr and makes [`stdout_failed`] true.
pub fn out(args: std::fmt::Arguments<'_>) {
    if STDOUT.load(Ordering::Relaxed) != OPEN {
        return;
    }
    let text = std::fmt::format(args);
    let mut stdout = std::io::stdout().lock();
    let written = stdout
        .write_all(net(&text).as_bytes())
        .and_then(|()| stdout.flush());
    if let Err(e) = written {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            STDOUT.store(CLOSED_PIPE, Ordering::Relaxed);
        } else {
            STDOUT.store(FAILED, Ordering::Relaxed);
            err(format_args!("nightshift: writing to stdout: {e}\n"));
        }
    }
}

/// Prints to stderr (through the net); a failure to write there is ignored
/// (there is nowhere left to say it).
pub fn err(args: std::fmt::Arguments<'_>) {
    let text = std::fmt::format(args);
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(net(&text).as_bytes());
}

/// Whether writing to stdout failed for a reason other than a closed pipe
/// (the output is incomplete: the command must not report success).
pub fn stdout_failed() -> bool {
    STDOUT.load(Ordering::Relaxed) == FAILED
}

/// One event of the text log, as one line: every hidden character,
/// newlines and tabs included, escaped but the event's final newline, so an
/// agent-made value in a field (a refusal's reason, a branch name) can
/// neither colour the terminal nor forge another log line.
pub fn log_line(event: &str) -> String {
    let (body, end) = match event.strip_suffix('\n') {
        Some(body) => (body, "\n"),
        None => (event, ""),
    };
    let mut out = String::with_capacity(event.len() + 16);
    for c in body.chars() {
        if is_hidden(c) {
            escape_char(&mut out, c);
        } else {
            out.push(c);
        }
    }
    out.push_str(end);
    out
}

/// One event of the JSON log, as one line of printable ASCII: every
/// character serde_json writes raw (non-ASCII, DEL) becomes a `\uXXXX`
/// escape. Such a character can only stand inside a JSON string, where the
/// escape means the same character: the line parses to the same value.
pub fn json_log_line(event: &str) -> String {
    let (body, end) = match event.strip_suffix('\n') {
        Some(body) => (body, "\n"),
        None => (event, ""),
    };
    let mut out = String::with_capacity(event.len() + 16);
    for c in body.chars() {
        if c.is_ascii() && !c.is_ascii_control() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        }
    }
    out.push_str(end);
    out
}

/// stderr for the text log (`tracing_subscriber`'s writer): each event
/// through [`log_line`]. The subscriber writes an event whole, in one call.
#[derive(Debug, Clone, Copy, Default)]
pub struct NetStderr;

impl std::io::Write for NetStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        err(format_args!("{}", log_line(&String::from_utf8_lossy(buf))));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// stderr for the JSON log (`--log-format json`): each event through
/// [`json_log_line`], so it stays one JSON object a line.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonStderr;

impl std::io::Write for JsonStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let line = json_log_line(&String::from_utf8_lossy(buf));
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Shows a run's output as it arrives (the supervisor's echo): [`block`],
/// to stdout or stderr; a closed or failing stream never stops the run.
pub fn echo(bytes: &[u8], to_stderr: bool) {
    let shown = block(bytes);
    if to_stderr {
        err(format_args!("{shown}"));
    } else {
        out(format_args!("{shown}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_event_is_one_line_whatever_its_fields_hold() {
        let event = "INFO door verdict reason=no\nERROR forged\t\u{1b}[31m \u{202e}x\n";
        let shown = log_line(event);
        assert_eq!(shown.matches('\n').count(), 1, "{shown}");
        assert!(shown.ends_with('\n'));
        assert!(
            !shown.trim_end_matches('\n').chars().any(is_hidden),
            "{shown}"
        );
        assert!(
            shown.contains(r"reason=no\u{a}ERROR forged\u{9}\u{1b}[31m \u{202e}x"),
            "{shown}"
        );
        assert_eq!(log_line("no newline"), "no newline");
    }

    #[test]
    fn a_json_log_event_stays_one_json_object_a_line() {
        let value = serde_json::json!({
            "fields": {"reason": "a\nb \u{202e} \u{85} \u{7f} \u{e9} \u{1f600} \\u{5c}"},
            "span": {"run": "r\u{200b}1"},
        });
        let event = format!("{}\n", serde_json::to_string(&value).unwrap());
        let shown = json_log_line(&event);
        assert!(
            shown
                .bytes()
                .all(|b| (0x20..0x7f).contains(&b) || b == b'\n'),
            "{shown}"
        );
        assert_eq!(shown.matches('\n').count(), 1, "{shown}");
        let parsed: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(parsed, value);
    }
    use proptest::prelude::*;

    /// The inverse of the sanitiser, to show that it loses nothing.
    fn decode(shown: &str) -> Vec<u8> {
        let mut out = Vec::new();
        let mut rest = shown;
        while let Some(c) = rest.chars().next() {
            if c == '\\' && (rest[1..].starts_with("u{") || rest[1..].starts_with("x{")) {
                let end = rest.find('}').expect("an escape is closed");
                let value = u32::from_str_radix(&rest[3..end], 16).expect("hex escape");
                if rest.as_bytes()[1] == b'u' {
                    let mut buf = [0u8; 4];
                    let c = char::from_u32(value).expect("a char");
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                } else {
                    out.push(value as u8);
                }
                rest = &rest[end + 1..];
            } else {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                rest = &rest[c.len_utf8()..];
            }
        }
        out
    }

    const NAMED: &[char] = &[
        '\u{1b}',
        '\u{7}',
        '\u{0}',
        '\r',
        '\u{7f}',
        '\u{85}',
        '\u{9b}',
        '\u{61c}',
        '\u{200e}',
        '\u{200f}',
        '\u{202a}',
        '\u{202b}',
        '\u{202c}',
        '\u{202d}',
        '\u{202e}',
        '\u{2066}',
        '\u{2067}',
        '\u{2068}',
        '\u{2069}',
        '\u{200b}',
        '\u{200c}',
        '\u{200d}',
        '\u{2060}',
        '\u{2061}',
        '\u{2062}',
        '\u{2063}',
        '\u{2064}',
        '\u{feff}',
        '\u{180e}',
        '\u{ad}',
        '\u{2028}',
        '\u{2029}',
        '\u{e0041}',
        '\u{fe0f}',
        '\u{115f}',
        '\u{3164}',
        '\u{e000}',
    ];

    /// Characters an attacker would pick, mixed with ordinary ones and the
    /// sanitiser's own escape syntax.
    fn hostile_text() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            prop::sample::select(NAMED).prop_map(|c| c.to_string()),
            prop::sample::select(vec![
                "\\", "u", "x", "{", "}", "\\u{1b}", "\n", "\t", "é", "a"
            ])
            .prop_map(str::to_string),
            any::<char>().prop_map(|c| c.to_string()),
        ];
        let bytes = prop_oneof![
            piece.prop_map(String::into_bytes),
            any::<u8>().prop_map(|b| vec![b]),
        ];
        prop::collection::vec(bytes, 0..24).prop_map(|v| v.concat())
    }

    #[test]
    fn every_named_character_is_escaped() {
        for &c in NAMED {
            assert!(is_hidden(c), "{:x}", c as u32);
            let shown = line(&format!("a{c}b"));
            assert_eq!(shown, format!("a\\u{{{:x}}}b", c as u32));
        }
    }

    #[test]
    fn ordinary_text_is_unchanged() {
        let text = "fn main() { println!(\"\\x1b \\u00e9 \\n\"); } // café — ok ✓ 日本";
        assert_eq!(line(text), text);
        assert_eq!(block(b"two\n\tlines\n"), "two\n\tlines\n");
        assert_eq!(line("two\nlines\t"), "two\\u{a}lines\\u{9}");
    }

    #[test]
    fn escape_sequences_are_made_visible() {
        let shown = block(b"ok\x1b]0;pwned\x07\x1b[2J\n");
        assert!(!shown.contains('\x1b'));
        assert_eq!(shown, "ok\\u{1b}]0;pwned\\u{7}\\u{1b}[2J\n");
    }

    #[test]
    fn escape_look_alikes_do_not_collide() {
        assert_ne!(line("\u{202e}"), line("\\u{202e}"));
        assert_eq!(line("\\u{202e}"), "\\u{5c}u{202e}");
        assert_ne!(line_bytes(b"\xff"), line("\\x{ff}"));
        assert_ne!(line_bytes(b"\xef\xbf\xbd"), line_bytes(b"\xff"));
    }

    #[test]
    fn json_is_ascii_and_parses_back() {
        let value = serde_json::json!({"path": "a\u{202e}b\u{1b}c\u{7f}\u{1f600}\u{200b}", "n": 1});
        for pretty in [false, true] {
            let text = json(&value, pretty);
            assert!(
                text.bytes()
                    .all(|b| (0x20..0x7f).contains(&b) || b == b'\n'),
                "{text}"
            );
            assert!(
                text.contains("\\u202e") && text.contains("\\ud83d\\ude00"),
                "{text}"
            );
            let back: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(back, value);
        }
    }

    #[test]
    fn the_net_escapes_what_a_caller_forgot() {
        assert_eq!(net("plain\n"), "plain\n");
        assert_eq!(net("x\u{1b}[2J\u{202e}\n"), "x\\u{1b}[2J\\u{202e}\n");
    }

    #[test]
    fn no_module_prints_around_the_sanitiser() {
        // Every crate of the product: the binary's and the libraries'.
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut dirs: Vec<std::path::PathBuf> = [
            "orchestrator/src",
            "orchestrator/core/src",
            "orchestrator/store-sqlite/src",
            "orchestrator/engine-docker/src",
            "orchestrator/gateway/src",
            "orchestrator/supervisor/src",
            "dashboard/src",
        ]
        .iter()
        .map(|d| root.join(d))
        .collect();
        let mut checked = 0;
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("terminal.rs") {
                    checked += 1;
                    let text = std::fs::read_to_string(&path).unwrap();
                    for banned in ["println!", "print!(", "eprintln!", "eprint!("] {
                        assert!(
                            !text.contains(banned),
                            "{} uses {banned}: print through terminal::out / terminal::err",
                            path.display()
                        );
                    }
                }
            }
        }
        assert!(checked > 40, "only {checked} files were checked");
    }

    proptest! {
        #[test]
        fn nothing_hidden_is_printed_and_nothing_is_lost(input in hostile_text()) {
            let shown = line_bytes(&input);
            prop_assert!(shown.chars().all(|c| !is_hidden(c)), "{shown:?}");
            prop_assert!(!shown.chars().any(|c| NAMED.contains(&c) || c == '\n' || c == '\t'));
            prop_assert_eq!(decode(&shown), input.clone());
            let body = block(&input);
            prop_assert!(body.chars().all(|c| !is_hidden(c) || c == '\n' || c == '\t'));
            prop_assert_eq!(decode(&body), input);
        }

        #[test]
        fn distinct_inputs_print_differently(a in hostile_text(), b in hostile_text()) {
            prop_assume!(a != b);
            prop_assert_ne!(line_bytes(&a), line_bytes(&b));
            prop_assert_ne!(block(&a), block(&b));
        }

        #[test]
        fn json_keeps_every_string(s in any::<String>()) {
            let text = json(&s, false);
            prop_assert!(text.bytes().all(|b| (0x20..0x7f).contains(&b)));
            prop_assert_eq!(serde_json::from_str::<String>(&text).unwrap(), s);
        }
    }
}
