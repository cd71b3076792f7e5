//! The request check (pure): what the gateway forwards of a request body
//! from the sandbox, or why it forwards none of it.
//!
//! The provider acts on what a request names: a URL in an image source, an
//! MCP server, a server-side tool (web search, web fetch, code execution), a
//! stored response or file. Any of those is a channel from the sandbox to
//! the outside world (the agent chooses the URL and what it carries), and a
//! reference bills tokens that are not in the body. So the gateway forwards
//! only what it understands (`tests::every_way_out_is_refused_in_each_shape`,
//! `tests::unknown_fields_duplicates_and_choices_are_refused_with_their_path`).
//!
//! Invariants:
//! - [`check`] is a pure function of the shape, the body's bytes and the
//!   owner's [`Allow`]. Per shape, a request is an object whose every field,
//!   message, content block, item, content part and tool is on a typed
//!   allowlist of what the official API documents; anything else is refused
//!   with the JSON path of what was refused and why ([`Denied`]). Leaves with
//!   no power (text, tool inputs and schemas, signatures) are opaque.
//! - Refused always: URL, file-id and file sources (`image`/`document`
//!   `source.type: "url" | "file"`, chat `image_url` other than a `data:`
//!   URL, `input_image.image_url` other than `data:`, `input_file`,
//!   `file_id`), MCP (`mcp_servers`, `mcp` tools, `mcp_*` blocks and items),
//!   stored state (`previous_response_id`, `conversation`, `prompt`,
//!   `background`, `container`, `item_reference`), and server-side tools
//!   unless the owner enabled them by name for the endpoint and the run's
//!   content is public (the label gate: private content never goes to a
//!   tool that sends it to a third party)
//!   (`tests::every_way_out_is_refused_in_each_shape`,
//!   `tests::a_server_tool_passes_only_when_enabled_and_the_run_is_public`,
//!   `tests/tests/gateway.rs::an_enabled_server_tool_passes_only_for_a_public_run`).
//! - Nothing is built of the body but what routing and the budget need: the
//!   body is walked with borrowed, raw sub-values (`serde_json::RawValue`),
//!   arrays one element at a time, objects at most [`MAX_FIELDS`] fields
//!   (no field twice: what the gateway checked is what the endpoint reads),
//!   nesting within serde_json's limit of 128; no `Value` tree. The memory
//!   held is the body plus one object's field table per checked level.
//! - What is forwarded is the body's own bytes ([`Checked::forwarded`]):
//!   the top-level fields as they came, in slices of the body, except the
//!   output bound (written clamped to the reservation) and, for a chat
//!   stream, `stream_options` (forcing the usage chunk).
//! - The budget's worst case is computed here: `n` choices (at most the
//!   endpoint's `max_choices`, 1 unless the owner says), and each inline
//!   image charged [`IMAGE_TOKENS`] beyond its bytes.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use bytes::Bytes;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::route::{Refusal, Shape};

/// Most fields of any one object the gateway checks.
pub const MAX_FIELDS: usize = 64;
/// Most messages, blocks, items, parts and tools in one request.
pub const MAX_ELEMENTS: u64 = 100_000;
/// Tokens charged for each inline image beyond its bytes: the most any of
/// the three APIs bills for one image (they scale images down to bound it).
pub const IMAGE_TOKENS: u64 = 3_000;

/// `anthropic-beta` values forwarded: features that change how the model
/// answers, never what the provider fetches or stores.
pub const ANTHROPIC_BETAS: &[&str] = &[
    "claude-code-20250219",
    "interleaved-thinking-2025-05-14",
    "fine-grained-tool-streaming-2025-05-14",
    "context-management-2025-06-27",
    "context-1m-2025-08-07",
    "prompt-caching-2024-07-31",
    "token-efficient-tools-2025-02-19",
    "output-128k-2025-02-19",
    "extended-cache-ttl-2025-04-11",
    "effort-2025-11-24",
    "structured-outputs-2025-11-13",
    "structured-outputs-2025-12-15",
    "computer-use-2025-01-24",
    // Sent by Claude Code 2.1 (seen in its requests): how the model is
    // driven between turns and which tools are deferred, nothing fetched
    // (a server tool they could enable is still refused in `tools`).
    "advanced-tool-use-2025-11-20",
    "mid-conversation-tool-changes-2026-07-01",
    "mid-conversation-system-2026-04-07",
    "per-turn-control-2026-07-01",
    "thinking-token-count-2026-05-13",
    "redact-thinking-2026-02-12",
    "prompt-caching-scope-2026-01-05",
];
/// `anthropic-beta` values forwarded only when the named server tool is
/// enabled (and allowed for the run).
const TOOL_BETAS: &[(&str, &str)] = &[
    ("web-fetch-2025-09-10", "web_fetch"),
    ("code-execution-2025-05-22", "code_execution"),
    ("code-execution-2025-08-25", "code_execution"),
];
/// `openai-beta` values forwarded.
pub const OPENAI_BETAS: &[&str] = &["responses=experimental"];

/// What the owner allows beyond the fixed allowlist, for one endpoint and
/// one run.
#[derive(Debug, Clone, Copy)]
pub struct Allow<'a> {
    /// Server tools the owner enabled for the endpoint (`web_search`, ...).
    pub server_tools: &'a [String],
    /// The run's content is private: no server tool, whatever is enabled.
    pub private: bool,
    /// Most choices one call may ask for (`n`).
    pub max_choices: u64,
}

impl Allow<'static> {
    /// Nothing beyond the allowlist: no server tool, one choice.
    pub const NONE: Allow<'static> = Allow {
        server_tools: &[],
        private: true,
        max_choices: 1,
    };
}

/// Why a request is refused: where in the body, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    /// The JSON path (`messages[0].content[1].source`), empty for the body.
    pub path: String,
    pub message: String,
    /// It would have reached outside (a URL, a server tool, MCP, stored
    /// state), rather than being malformed or unknown.
    pub egress: bool,
}

impl Denied {
    fn new(path: &str, message: impl Into<String>) -> Denied {
        Denied {
            path: path.to_string(),
            message: message.into(),
            egress: false,
        }
    }

    fn egress(path: &str, message: impl Into<String>) -> Denied {
        Denied {
            egress: true,
            ..Denied::new(path, message)
        }
    }

    /// The refusal the agent reads.
    pub fn refusal(&self) -> Refusal {
        let at = if self.path.is_empty() {
            "the request body".to_string()
        } else {
            format!("`{}`", self.path)
        };
        let message: String = self.message.chars().take(400).collect();
        Refusal::new(
            if self.egress { 403 } else { 400 },
            if self.egress {
                "request_egress"
            } else {
                "request_field"
            },
            format!("refused by nightshift's model gateway: {at}: {message}"),
        )
    }
}

/// A request that passed: what routing and the budget need, and where its
/// fields are in the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub shape: Shape,
    pub model: String,
    pub stream: bool,
    /// The output bound the request names (the smallest, for chat's two).
    pub output_bound: Option<u64>,
    /// Choices asked for (`n`, 1 when absent).
    pub choices: u64,
    /// Inline images in the request.
    pub images: u64,
    /// A chat stream whose client asked for the usage chunk itself.
    pub client_wants_usage: bool,
    /// Chat: the client named `max_tokens` (the legacy bound).
    legacy_bound: bool,
    /// Chat: the client named `max_completion_tokens`.
    new_bound: bool,
    /// Chat: the client's `stream_options.include_obfuscation`.
    obfuscation: Option<bool>,
    /// The fields forwarded as they came: the key's JSON text and the
    /// value's bytes in the body.
    kept: Vec<(String, Range<usize>)>,
}

impl Checked {
    /// An upper bound of the input tokens: no token is shorter than a byte
    /// of the JSON that carries it, and each image at most
    /// [`IMAGE_TOKENS`] more.
    pub fn input_bound(&self, body_len: usize) -> u64 {
        (body_len as u64).saturating_add(self.images.saturating_mul(IMAGE_TOKENS))
    }

    /// The body forwarded, as pieces: the kept fields (slices of `body`,
    /// which must be the body checked), then the output bound clamped to
    /// `max_output` and, for a chat stream, `stream_options` with the usage
    /// chunk forced.
    pub fn forwarded(&self, body: &Bytes, max_output: u64) -> Vec<Bytes> {
        let mut pieces = Vec::with_capacity(self.kept.len() * 2 + 4);
        let mut sep = "{";
        for (key, range) in &self.kept {
            pieces.push(Bytes::from(format!("{sep}{key}:")));
            pieces.push(body.slice(range.clone()));
            sep = ",";
        }
        let mut tail = String::new();
        let mut add = |k: &str, v: String| {
            tail.push_str(sep);
            tail.push_str(&format!("\"{k}\":{v}"));
            sep = ",";
        };
        match self.shape {
            Shape::Messages => add("max_tokens", max_output.to_string()),
            Shape::Responses => add("max_output_tokens", max_output.to_string()),
            Shape::Chat => {
                if self.legacy_bound {
                    add("max_tokens", max_output.to_string());
                }
                if self.new_bound || !self.legacy_bound {
                    add("max_completion_tokens", max_output.to_string());
                }
                if self.stream {
                    let obfuscation = match self.obfuscation {
                        Some(b) => format!(",\"include_obfuscation\":{b}"),
                        None => String::new(),
                    };
                    add(
                        "stream_options",
                        format!("{{\"include_usage\":true{obfuscation}}}"),
                    );
                }
            }
        }
        tail.push('}');
        pieces.push(Bytes::from(tail));
        pieces
    }
}

/// Checks a request body of `shape` against the allowlist; see the module
/// note. A fuzz target calls this directly.
pub fn check(shape: Shape, body: &[u8], allow: &Allow) -> Result<Checked, Denied> {
    let text = std::str::from_utf8(body)
        .map_err(|e| Denied::new("", format!("the body is not UTF-8 JSON: {e}")))?;
    let top: &RawValue = serde_json::from_str(text)
        .map_err(|e| Denied::new("", format!("the body is not JSON: {e}")))?;
    check_strict(text)?;
    let fields = object(top, "")?;
    let mut walk = Walk {
        allow,
        elements: 0,
        images: 0,
    };
    let mut c = Checked {
        shape,
        model: String::new(),
        stream: false,
        output_bound: None,
        choices: 1,
        images: 0,
        client_wants_usage: false,
        legacy_bound: false,
        new_bound: false,
        obfuscation: None,
        kept: Vec::new(),
    };
    let mut model = None;
    for (key, value) in &fields {
        let key: &str = key;
        let path = key;
        // Whether the field is forwarded as it came.
        let mut keep = true;
        match (shape, key) {
            (_, "model") => model = Some(string(value, path)?.into_owned()),
            (_, "stream") => c.stream = boolean(value, path)?,
            (Shape::Messages, "max_tokens") | (Shape::Responses, "max_output_tokens") => {
                c.output_bound = Some(uint(value, path)?);
                keep = false;
            }
            (Shape::Chat, "max_tokens" | "max_completion_tokens") => {
                let n = nullable_uint(value, path)?;
                if let Some(n) = n {
                    c.output_bound = Some(c.output_bound.map_or(n, |b| b.min(n)));
                    if key == "max_tokens" {
                        c.legacy_bound = true;
                    } else {
                        c.new_bound = true;
                    }
                }
                keep = false;
            }
            (Shape::Chat, "n") => {
                let n = nullable_uint(value, path)?.unwrap_or(1);
                if n == 0 {
                    return Err(Denied::new(path, "n must be at least 1"));
                }
                if n > allow.max_choices {
                    return Err(Denied::new(
                        path,
                        format!(
                            "{n} choices in one call; the owner allows at most {} (`max_choices` in models.toml)",
                            allow.max_choices
                        ),
                    ));
                }
                c.choices = n;
            }
            (Shape::Chat, "stream_options") => {
                let (usage, obfuscation) = stream_options(value, path)?;
                c.client_wants_usage = usage;
                c.obfuscation = obfuscation;
                keep = false;
            }
            (Shape::Messages, _) => walk.messages_field(key, value)?,
            (Shape::Chat, _) => walk.chat_field(key, value)?,
            (Shape::Responses, _) => walk.responses_field(key, value)?,
        }
        if keep {
            let start = value.get().as_ptr() as usize - text.as_ptr() as usize;
            let json_key = serde_json::to_string(key).unwrap_or_default();
            c.kept.push((json_key, start..start + value.get().len()));
        }
    }
    c.model = model.ok_or_else(|| Denied::new("model", "the request names no model"))?;
    let required = match shape {
        Shape::Messages => "messages",
        Shape::Chat => "messages",
        Shape::Responses => "input",
    };
    if !fields.iter().any(|(k, _)| k == required) {
        return Err(Denied::new(required, "the request has none"));
    }
    if !c.stream && shape == Shape::Chat && c.obfuscation.is_some() {
        c.obfuscation = None;
    }
    c.images = walk.images;
    Ok(c)
}

/// Refuses what the raw walk does not decode in opaque leaves but parsers
/// read differently: a `\\u` escape of a lone UTF-16 surrogate, and a
/// number past f64's range (one parser refuses it, another reads
/// infinity). `text` is JSON already. What the endpoint reads must be what
/// was checked.
fn check_strict(text: &str) -> Result<(), Denied> {
    let b = text.as_bytes();
    let unit = |at: usize| -> Option<u16> {
        let hex = b.get(at..at + 4)?;
        u16::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
    };
    let lone = || Denied::new("", "the body holds a lone UTF-16 surrogate escape");
    let mut i = 0;
    let mut in_string = false;
    while i < b.len() {
        let c = b[i];
        if !in_string {
            if c == b'"' {
                in_string = true;
                i += 1;
            } else if c == b'-' || c.is_ascii_digit() {
                let start = i;
                while i < b.len() && matches!(b[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
                {
                    i += 1;
                }
                let finite = text[start..i].parse::<f64>().is_ok_and(f64::is_finite);
                if !finite {
                    return Err(Denied::new("", "the body holds a number out of range"));
                }
            } else {
                i += 1;
            }
            continue;
        }
        if c == b'"' {
            in_string = false;
            i += 1;
            continue;
        }
        if c != b'\\' {
            i += 1;
            continue;
        }
        if b.get(i + 1) != Some(&b'u') {
            i += 2;
            continue;
        }
        let u = unit(i + 2).ok_or_else(lone)?;
        i += 6;
        match u {
            0xd800..=0xdbff => {
                let low = (b.get(i..i + 2) == Some(b"\\u"))
                    .then(|| unit(i + 2))
                    .flatten();
                match low {
                    Some(0xdc00..=0xdfff) => i += 6,
                    _ => return Err(lone()),
                }
            }
            0xdc00..=0xdfff => return Err(lone()),
            _ => {}
        }
    }
    Ok(())
}

/// The model a body names (to route it before [`check`], whose allowance
/// is the route's endpoint's).
pub fn model(body: &[u8]) -> Result<String, Denied> {
    let text = std::str::from_utf8(body)
        .map_err(|e| Denied::new("", format!("the body is not UTF-8 JSON: {e}")))?;
    let top: &RawValue = serde_json::from_str(text)
        .map_err(|e| Denied::new("", format!("the body is not JSON: {e}")))?;
    let fields = object(top, "")?;
    match fields.iter().find(|(k, _)| k == "model") {
        Some((_, v)) => Ok(string(v, "model")?.into_owned()),
        None => Err(Denied::new("model", "the request names no model")),
    }
}

/// The beta headers of a request: each value must be on its list.
pub fn check_betas(
    header: &str,
    values: &[&str],
    shape: Shape,
    allow: &Allow,
) -> Result<(), Denied> {
    let path = format!("header {header}");
    for value in values {
        for beta in value.split(',').map(str::trim).filter(|b| !b.is_empty()) {
            let ok = match header {
                "anthropic-beta" if shape == Shape::Messages => {
                    ANTHROPIC_BETAS.contains(&beta)
                        || TOOL_BETAS
                            .iter()
                            .any(|(b, tool)| *b == beta && server_tool_allowed(allow, tool).is_ok())
                }
                "openai-beta" if shape != Shape::Messages => OPENAI_BETAS.contains(&beta),
                _ => false,
            };
            if !ok {
                let egress = beta.contains("mcp")
                    || beta.contains("web-")
                    || beta.contains("files-api")
                    || beta.contains("code-execution");
                let message = format!(
                    "{:?} is not a beta nightshift forwards (it forwards: {})",
                    beta.chars().take(100).collect::<String>(),
                    if header == "anthropic-beta" {
                        ANTHROPIC_BETAS.join(", ")
                    } else {
                        OPENAI_BETAS.join(", ")
                    }
                );
                return Err(if egress {
                    Denied::egress(&path, message)
                } else {
                    Denied::new(&path, message)
                });
            }
        }
    }
    Ok(())
}

/// A server tool's name from its versioned type: `web_search_20250305` and
/// `web_search_preview_2025_03_11` are `web_search`.
pub fn server_tool_name(kind: &str) -> &str {
    let mut name = kind;
    let bytes = name.as_bytes();
    // `_YYYYMMDD`
    if bytes.len() > 9
        && bytes[bytes.len() - 9] == b'_'
        && bytes[bytes.len() - 8..].iter().all(u8::is_ascii_digit)
    {
        name = &name[..name.len() - 9];
    }
    // `_YYYY_MM_DD`
    let b = name.as_bytes();
    if b.len() > 11
        && b[b.len() - 11] == b'_'
        && b[b.len() - 10..b.len() - 6].iter().all(u8::is_ascii_digit)
        && b[b.len() - 6] == b'_'
        && b[b.len() - 3] == b'_'
    {
        name = &name[..name.len() - 11];
    }
    name.strip_suffix("_preview").unwrap_or(name)
}

/// Whether the server tool `name` may be used by this run on this endpoint.
fn server_tool_allowed(allow: &Allow, name: &str) -> Result<(), String> {
    if name.contains("mcp") {
        return Err("MCP reaches servers the agent names; nightshift never forwards it".into());
    }
    if !super::models::SERVER_TOOLS.contains(&name) {
        return Err(format!(
            "a tool or block of type {:?} is unknown to nightshift's gateway: it may make the provider reach outside the sandbox, so it is not forwarded",
            name.chars().take(100).collect::<String>()
        ));
    }
    if !allow.server_tools.iter().any(|t| t == name) {
        return Err(format!(
            "the server-side tool {name:?} makes the provider reach outside the sandbox; it is not enabled for this endpoint (`server_tools` in models.toml)"
        ));
    }
    if allow.private {
        return Err(format!(
            "the server-side tool {name:?} sends what it is given to a third party, and this run's content is private"
        ));
    }
    Ok(())
}

// ---- the walk ---------------------------------------------------------------

struct Walk<'x, 'a> {
    allow: &'x Allow<'a>,
    elements: u64,
    images: u64,
}

type Fields<'a> = Vec<(Cow<'a, str>, &'a RawValue)>;

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn unknown(path: &str, what: &str, key: &str, allowed: &[&str]) -> Denied {
    Denied::new(
        &join(path, key),
        format!(
            "{what} has no field {:?} that nightshift forwards (it forwards: {})",
            key.chars().take(100).collect::<String>(),
            allowed.join(", ")
        ),
    )
}

/// The value's first byte: what kind of JSON it is.
fn lead(raw: &RawValue) -> u8 {
    raw.get().as_bytes().first().copied().unwrap_or(b' ')
}

fn is_null(raw: &RawValue) -> bool {
    raw.get() == "null"
}

fn string<'a>(raw: &'a RawValue, path: &str) -> Result<Cow<'a, str>, Denied> {
    serde_json::from_str::<Key<'a>>(raw.get())
        .map(|k| k.0)
        .map_err(|_| Denied::new(path, "must be a string (of at most 256 bytes)"))
}

fn boolean(raw: &RawValue, path: &str) -> Result<bool, Denied> {
    serde_json::from_str::<bool>(raw.get()).map_err(|_| Denied::new(path, "must be true or false"))
}

fn uint(raw: &RawValue, path: &str) -> Result<u64, Denied> {
    serde_json::from_str::<u64>(raw.get())
        .map_err(|_| Denied::new(path, "must be a whole number of tokens"))
}

fn nullable_uint(raw: &RawValue, path: &str) -> Result<Option<u64>, Denied> {
    if is_null(raw) {
        Ok(None)
    } else {
        uint(raw, path).map(Some)
    }
}

/// Chat's `stream_options`: (include_usage, include_obfuscation).
fn stream_options(raw: &RawValue, path: &str) -> Result<(bool, Option<bool>), Denied> {
    if is_null(raw) {
        return Ok((false, None));
    }
    let mut usage = false;
    let mut obfuscation = None;
    for (k, v) in object(raw, path)? {
        match &*k {
            "include_usage" => usage = boolean(v, &join(path, &k))?,
            "include_obfuscation" => obfuscation = Some(boolean(v, &join(path, &k))?),
            _ => {
                return Err(unknown(
                    path,
                    "stream_options",
                    &k,
                    &["include_usage", "include_obfuscation"],
                ))
            }
        }
    }
    Ok((usage, obfuscation))
}

/// A `data:` URL (the image's bytes inline), never one the provider fetches.
fn data_url(raw: &RawValue, path: &str) -> Result<(), Denied> {
    let url = serde_json::from_str::<UrlHead>(raw.get())
        .map_err(|_| Denied::new(path, "must be a string"))?;
    if url.0 {
        Ok(())
    } else {
        Err(Denied::egress(
            path,
            "only an inline `data:` URL is forwarded: a URL the provider fetches is a channel out of the sandbox",
        ))
    }
}

impl Walk<'_, '_> {
    fn count(&mut self, path: &str) -> Result<(), Denied> {
        self.elements += 1;
        if self.elements > MAX_ELEMENTS {
            return Err(Denied::new(
                path,
                format!(
                    "more than {MAX_ELEMENTS} messages, blocks, items and tools in one request"
                ),
            ));
        }
        Ok(())
    }

    fn server_tool(&self, path: &str, kind: &str) -> Result<(), Denied> {
        server_tool_allowed(self.allow, server_tool_name(kind)).map_err(|m| Denied::egress(path, m))
    }

    // ---- Anthropic Messages -------------------------------------------------

    fn messages_field(&mut self, key: &str, value: &RawValue) -> Result<(), Denied> {
        const OPAQUE: &[&str] = &[
            "temperature",
            "top_k",
            "top_p",
            "stop_sequences",
            "metadata",
            "tool_choice",
            "thinking",
            "service_tier",
            "context_management",
            "output_config",
            "output_format",
        ];
        let path = key;
        match key {
            "messages" => each(value, path, |i, m| {
                let p = format!("{path}[{i}]");
                self.count(&p)?;
                self.anthropic_message(m, &p)
            }),
            "system" => self.anthropic_content(value, path, &["text"]),
            "tools" => each(value, path, |i, t| {
                let p = format!("{path}[{i}]");
                self.count(&p)?;
                self.anthropic_tool(t, &p)
            }),
            "mcp_servers" => Err(Denied::egress(
                path,
                "MCP servers are reached by the provider at URLs the agent names; nightshift never forwards them",
            )),
            "container" if !is_null(value) => Err(Denied::egress(
                path,
                "a container is state stored at the provider; nightshift never forwards a reference to it",
            )),
            "container" => Ok(()),
            k if OPAQUE.contains(&k) => Ok(()),
            _ => {
                let mut all = vec!["model", "messages", "max_tokens", "stream", "system", "tools"];
                all.extend_from_slice(OPAQUE);
                Err(unknown("", "a Messages request", key, &all))
            }
        }
    }

    fn anthropic_message(&mut self, raw: &RawValue, path: &str) -> Result<(), Denied> {
        let mut role = false;
        for (k, v) in object(raw, path)? {
            let p = join(path, &k);
            match &*k {
                "role" => {
                    let r = string(v, &p)?;
                    // `system`: Claude Code's instructions between turns.
                    if r != "user" && r != "assistant" && r != "system" {
                        return Err(Denied::new(
                            &p,
                            "must be \"user\", \"assistant\" or \"system\"",
                        ));
                    }
                    role = true;
                }
                "content" => self.anthropic_content(v, &p, ANTHROPIC_BLOCKS)?,
                // Claude Code's per-turn effort.
                "output_config" => {}
                _ => {
                    return Err(unknown(
                        path,
                        "a message",
                        &k,
                        &["role", "content", "output_config"],
                    ))
                }
            }
        }
        if !role {
            return Err(Denied::new(path, "a message needs a role"));
        }
        Ok(())
    }

    /// A string, or an array of blocks of the `allowed` types.
    fn anthropic_content(
        &mut self,
        raw: &RawValue,
        path: &str,
        allowed: &[&str],
    ) -> Result<(), Denied> {
        match lead(raw) {
            b'"' => Ok(()),
            b'[' => each(raw, path, |i, b| {
                let p = format!("{path}[{i}]");
                self.count(&p)?;
                self.anthropic_block(b, &p, allowed)
            }),
            _ => Err(Denied::new(path, "must be a string or an array of blocks")),
        }
    }

    fn anthropic_block(
        &mut self,
        raw: &RawValue,
        path: &str,
        allowed: &[&str],
    ) -> Result<(), Denied> {
        let fields = object(raw, path)?;
        let kind = kind_of(&fields, path)?;
        let kind: &str = &kind;
        let server_results: &[(&str, &str)] = &[
            ("web_search_tool_result", "web_search"),
            ("web_fetch_tool_result", "web_fetch"),
            ("code_execution_tool_result", "code_execution"),
            ("bash_code_execution_tool_result", "code_execution"),
            ("text_editor_code_execution_tool_result", "code_execution"),
        ];
        if let Some((_, tool)) = server_results.iter().find(|(k, _)| *k == kind) {
            return self.server_tool(path, tool);
        }
        if kind == "server_tool_use" {
            let name = fields
                .iter()
                .find(|(k, _)| k == "name")
                .map(|(_, v)| string(v, &join(path, "name")))
                .transpose()?
                .unwrap_or_default();
            return self.server_tool(path, &name);
        }
        if kind.starts_with("mcp_") || kind == "container_upload" {
            return Err(Denied::egress(
                path,
                format!(
                    "a {kind:?} block reaches outside the sandbox; nightshift never forwards it"
                ),
            ));
        }
        if !allowed.contains(&kind) {
            return Err(Denied::new(
                &join(path, "type"),
                format!(
                    "a block of type {:?} is not forwarded here (forwarded: {})",
                    kind.chars().take(100).collect::<String>(),
                    allowed.join(", ")
                ),
            ));
        }
        let keys: &[&str] = match kind {
            "text" => &["type", "text", "cache_control", "citations"],
            "image" => &["type", "source", "cache_control"],
            "document" => &[
                "type",
                "source",
                "title",
                "context",
                "citations",
                "cache_control",
            ],
            "tool_use" => &["type", "id", "name", "input", "cache_control"],
            "tool_result" => &[
                "type",
                "tool_use_id",
                "content",
                "is_error",
                "cache_control",
            ],
            "thinking" => &["type", "thinking", "signature"],
            "redacted_thinking" => &["type", "data"],
            _ => &["type"],
        };
        for (k, v) in &fields {
            let p = join(path, k);
            if !keys.contains(&&**k) {
                return Err(unknown(path, &format!("a {kind:?} block"), k, keys));
            }
            match (kind, &**k) {
                ("image", "source") => self.anthropic_source(v, &p, false)?,
                ("document", "source") => self.anthropic_source(v, &p, true)?,
                ("tool_result", "content") => {
                    self.anthropic_content(v, &p, &["text", "image", "document"])?
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn anthropic_source(
        &mut self,
        raw: &RawValue,
        path: &str,
        document: bool,
    ) -> Result<(), Denied> {
        let fields = object(raw, path)?;
        let kind = kind_of(&fields, path)?;
        let keys: &[&str] = match (&*kind, document) {
            ("base64", false) => {
                self.images += 1;
                &["type", "media_type", "data"]
            }
            ("text", true) => &["type", "media_type", "data"],
            ("content", true) => &["type", "content"],
            ("base64", true) => {
                return Err(Denied::new(
                    path,
                    "a base64 (PDF) document bills tokens per page that the gateway cannot bound before the call; send its text instead",
                ))
            }
            ("url", _) => {
                return Err(Denied::egress(
                    path,
                    "a `url` source makes the provider fetch a URL the agent chose: a channel out of the sandbox; send the bytes inline (base64)",
                ))
            }
            ("file", _) => {
                return Err(Denied::egress(
                    path,
                    "a `file` source names a file stored at the provider; nightshift forwards only inline content",
                ))
            }
            (other, _) => {
                return Err(Denied::new(
                    &join(path, "type"),
                    format!(
                        "a source of type {:?} is not forwarded",
                        other.chars().take(100).collect::<String>()
                    ),
                ))
            }
        };
        for (k, v) in &fields {
            if !keys.contains(&&**k) {
                return Err(unknown(path, "a source", k, keys));
            }
            if &**k == "content" {
                self.anthropic_content(v, &join(path, k), &["text", "image"])?;
            }
        }
        Ok(())
    }

    fn anthropic_tool(&mut self, raw: &RawValue, path: &str) -> Result<(), Denied> {
        let fields = object(raw, path)?;
        let kind = match fields.iter().find(|(k, _)| k == "type") {
            Some((_, v)) => string(v, &join(path, "type"))?,
            None => Cow::Borrowed("custom"),
        };
        let kind: &str = &kind;
        if kind == "custom" {
            let keys = [
                "type",
                "name",
                "description",
                "input_schema",
                "cache_control",
                "strict",
                "defer_loading",
                "input_examples",
            ];
            for (k, _) in &fields {
                if !keys.contains(&&**k) {
                    return Err(unknown(path, "a tool", k, &keys));
                }
            }
            return Ok(());
        }
        // Anthropic-defined tools the client runs itself.
        let client = ["bash_", "text_editor_", "computer_", "memory_"];
        if client.iter().any(|p| kind.starts_with(p)) {
            return Ok(());
        }
        self.server_tool(&join(path, "type"), kind)
    }

    // ---- OpenAI Chat Completions -------------------------------------------

    fn chat_field(&mut self, key: &str, value: &RawValue) -> Result<(), Denied> {
        const OPAQUE: &[&str] = &[
            "tool_choice",
            "parallel_tool_calls",
            "temperature",
            "top_p",
            "frequency_penalty",
            "presence_penalty",
            "stop",
            "seed",
            "logit_bias",
            "logprobs",
            "top_logprobs",
            "response_format",
            "reasoning_effort",
            "verbosity",
            "user",
            "safety_identifier",
            "prompt_cache_key",
            "prompt_cache_retention",
            "metadata",
            "service_tier",
            "store",
            "function_call",
        ];
        let path = key;
        match key {
            "messages" => each(value, path, |i, m| {
                let p = format!("{path}[{i}]");
                self.count(&p)?;
                self.chat_message(m, &p)
            }),
            "tools" => each(value, path, |i, t| {
                let p = format!("{path}[{i}]");
                self.count(&p)?;
                self.chat_tool(t, &p)
            }),
            "functions" => each(value, path, |i, _| self.count(&format!("{path}[{i}]"))),
            "web_search_options" => Err(Denied::egress(
                path,
                "web search makes the provider reach outside the sandbox; nightshift never forwards it on chat completions",
            )),
            "audio" | "modalities" | "prediction" if is_null(value) => Ok(()),
            k if OPAQUE.contains(&k) => Ok(()),
            _ => {
                let mut all = vec![
                    "model",
                    "messages",
                    "stream",
                    "stream_options",
                    "max_tokens",
                    "max_completion_tokens",
                    "n",
                    "tools",
                    "functions",
                ];
                all.extend_from_slice(OPAQUE);
                Err(unknown("", "a chat completions request", key, &all))
            }
        }
    }

    fn chat_message(&mut self, raw: &RawValue, path: &str) -> Result<(), Denied> {
        const KEYS: &[&str] = &[
            "role",
            "content",
            "name",
            "tool_calls",
            "tool_call_id",
            "function_call",
            "refusal",
            "audio",
            // An earlier answer sent back as litellm returned it
            // (mini-swe-agent does): data the provider acts on no more
            // than on text.
            "annotations",
            "provider_specific_fields",
            "reasoning_content",
            "thinking_blocks",
            "images",
        ];
        let mut role = false;
        for (k, v) in object(raw, path)? {
            let p = join(path, &k);
            match &*k {
                "role" => {
                    let r = string(v, &p)?;
                    let roles = ["system", "developer", "user", "assistant", "tool", "function"];
                    if !roles.contains(&&*r) {
                        return Err(Denied::new(&p, format!("must be one of {}", roles.join(", "))));
                    }
                    role = true;
                }
                "content" => match lead(v) {
                    b'"' | b'n' => {}
                    b'[' => each(v, &p, |i, part| {
                        let pp = format!("{p}[{i}]");
                        self.count(&pp)?;
                        self.chat_part(part, &pp)
                    })?,
                    _ => return Err(Denied::new(&p, "must be a string or an array of parts")),
                },
                // An assistant's earlier audio is a reference to stored output.
                "audio" if !is_null(v) => {
                    return Err(Denied::egress(
                        &p,
                        "an audio reference names output stored at the provider; nightshift never forwards it",
                    ))
                }
                // Images an earlier answer generated: URLs, never forwarded.
                "images" if !is_null(v) && v.get() != "[]" => {
                    return Err(Denied::egress(
                        &p,
                        "images of an earlier answer are URLs the provider would fetch; nightshift forwards only inline images in user content",
                    ))
                }
                k if KEYS.contains(&k) => {}
                _ => return Err(unknown(path, "a message", &k, KEYS)),
            }
        }
        if !role {
            return Err(Denied::new(path, "a message needs a role"));
        }
        Ok(())
    }

    fn chat_part(&mut self, raw: &RawValue, path: &str) -> Result<(), Denied> {
        let fields = object(raw, path)?;
        let kind = kind_of(&fields, path)?;
        let keys: &[&str] = match &*kind {
            "text" => &["type", "text"],
            "refusal" => &["type", "refusal"],
            "image_url" => &["type", "image_url"],
            "file" => {
                return Err(Denied::egress(
                    path,
                    "a `file` part names a stored file or carries a PDF whose tokens cannot be bounded; nightshift does not forward it",
                ))
            }
            other => {
                return Err(Denied::new(
                    &join(path, "type"),
                    format!(
                        "a part of type {:?} is not forwarded (forwarded: text, refusal, image_url)",
                        other.chars().take(100).collect::<String>()
                    ),
                ))
            }
        };
        for (k, v) in &fields {
            if !keys.contains(&&**k) {
                return Err(unknown(path, "a content part", k, keys));
            }
            if &**k == "image_url" {
                let p = join(path, k);
                let mut url = false;
                for (ik, iv) in object(v, &p)? {
                    match &*ik {
                        "url" => {
                            data_url(iv, &join(&p, &ik))?;
                            url = true;
                        }
                        "detail" => {}
                        _ => return Err(unknown(&p, "an image_url", &ik, &["url", "detail"])),
                    }
                }
                if !url {
                    return Err(Denied::new(&p, "an image_url needs a url"));
                }
                self.images += 1;
            }
        }
        Ok(())
    }

    fn chat_tool(&mut self, raw: &RawValue, path: &str) -> Result<(), Denied> {
        let fields = object(raw, path)?;
        let kind = kind_of(&fields, path)?;
        let keys: &[&str] = match &*kind {
            "function" => &["type", "function"],
            "custom" => &["type", "custom"],
            other => {
                return Err(Denied::egress(
                    &join(path, "type"),
                    format!(
                        "a tool of type {:?} is not forwarded on chat completions (forwarded: function, custom)",
                        other.chars().take(100).collect::<String>()
                    ),
                ))
            }
        };
        for (k, _) in &fields {
            if !keys.contains(&&**k) {
                return Err(unknown(path, "a tool", k, keys));
            }
        }
        Ok(())
    }

    // ---- OpenAI Responses ---------------------------------------------------

    fn responses_field(&mut self, key: &str, value: &RawValue) -> Result<(), Denied> {
        const OPAQUE: &[&str] = &[
            "stream_options",
            "max_tool_calls",
            "metadata",
            "parallel_tool_calls",
            "prompt_cache_key",
            "prompt_cache_retention",
            "reasoning",
            "safety_identifier",
            "service_tier",
            "store",
            "temperature",
            "text",
            "tool_choice",
            "top_logprobs",
            "top_p",
            "truncation",
            "user",
            "include",
            "client_metadata",
        ];
        let path = key;
        match key {
            "input" | "instructions" => match lead(value) {
                b'"' => Ok(()),
                b'n' if key == "instructions" => Ok(()),
                b'[' => each(value, path, |i, item| {
                    let p = format!("{path}[{i}]");
                    self.count(&p)?;
                    self.responses_item(item, &p)
                }),
                _ => Err(Denied::new(path, "must be a string or an array of items")),
            },
            "tools" => each(value, path, |i, t| {
                let p = format!("{path}[{i}]");
                self.count(&p)?;
                self.responses_tool(t, &p)
            }),
            "previous_response_id" | "conversation" | "prompt" | "background"
                if is_null(value) || value.get() == "false" =>
            {
                Ok(())
            }
            "previous_response_id" | "conversation" | "prompt" | "background" => {
                Err(Denied::egress(
                    path,
                    "this names state stored at the provider (a stored response, conversation or prompt); nightshift forwards only what the request itself carries",
                ))
            }
            k if OPAQUE.contains(&k) => Ok(()),
            _ => {
                let mut all = vec![
                    "model",
                    "input",
                    "instructions",
                    "stream",
                    "max_output_tokens",
                    "tools",
                ];
                all.extend_from_slice(OPAQUE);
                Err(unknown("", "a responses request", key, &all))
            }
        }
    }

    fn responses_item(&mut self, raw: &RawValue, path: &str) -> Result<(), Denied> {
        let fields = object(raw, path)?;
        let kind = match fields.iter().find(|(k, _)| k == "type") {
            Some((_, v)) => string(v, &join(path, "type"))?,
            None => Cow::Borrowed("message"),
        };
        let kind: &str = &kind;
        let keys: &[&str] = match kind {
            "message" => &["type", "id", "role", "content", "status"],
            "function_call" => &["type", "id", "call_id", "name", "arguments", "status"],
            "function_call_output" => &["type", "id", "call_id", "output", "status"],
            "custom_tool_call" => &["type", "id", "call_id", "name", "input", "status"],
            "custom_tool_call_output" => &["type", "id", "call_id", "output"],
            "reasoning" => &["type", "id", "summary", "content", "encrypted_content", "status"],
            "local_shell_call" => &["type", "id", "call_id", "action", "status"],
            "local_shell_call_output" => &["type", "id", "output", "status"],
            "shell_call" => &["type", "id", "call_id", "action", "status"],
            "shell_call_output" => &["type", "id", "call_id", "output", "max_output_length"],
            "apply_patch_call" => &["type", "id", "call_id", "operation", "status"],
            "apply_patch_call_output" => &["type", "id", "call_id", "output", "status"],
            "item_reference" => {
                return Err(Denied::egress(
                    path,
                    "an item reference names an item stored at the provider; nightshift forwards only what the request carries",
                ))
            }
            "web_search_call" => return self.server_tool(path, "web_search"),
            other => {
                return Err(Denied::egress(
                    &join(path, "type"),
                    format!(
                        "an item of type {:?} is not forwarded (it is a server-side tool's, or unknown to nightshift)",
                        other.chars().take(100).collect::<String>()
                    ),
                ))
            }
        };
        for (k, v) in &fields {
            let p = join(path, k);
            if !keys.contains(&&**k) {
                return Err(unknown(path, &format!("a {kind:?} item"), k, keys));
            }
            match (kind, &**k) {
                ("message", "content")
                | ("function_call_output", "output")
                | ("custom_tool_call_output", "output") => match lead(v) {
                    b'"' => {}
                    b'[' => each(v, &p, |i, part| {
                        let pp = format!("{p}[{i}]");
                        self.count(&pp)?;
                        self.responses_part(part, &pp)
                    })?,
                    _ => return Err(Denied::new(&p, "must be a string or an array of parts")),
                },
                ("message", "role") => {
                    let r = string(v, &p)?;
                    let roles = ["user", "assistant", "system", "developer"];
                    if !roles.contains(&&*r) {
                        return Err(Denied::new(
                            &p,
                            format!("must be one of {}", roles.join(", ")),
                        ));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn responses_part(&mut self, raw: &RawValue, path: &str) -> Result<(), Denied> {
        let fields = object(raw, path)?;
        let kind = kind_of(&fields, path)?;
        let keys: &[&str] = match &*kind {
            "input_text" => &["type", "text"],
            "output_text" => &["type", "text", "annotations", "logprobs"],
            "refusal" => &["type", "refusal"],
            "summary_text" | "reasoning_text" => &["type", "text"],
            "input_image" => &["type", "image_url", "detail", "file_id"],
            "input_file" | "input_audio" => {
                return Err(Denied::egress(
                    path,
                    format!(
                        "an {kind} part names a stored file or URL, or carries content whose tokens cannot be bounded; nightshift does not forward it"
                    ),
                ))
            }
            other => {
                return Err(Denied::new(
                    &join(path, "type"),
                    format!(
                        "a part of type {:?} is not forwarded",
                        other.chars().take(100).collect::<String>()
                    ),
                ))
            }
        };
        let mut image = false;
        for (k, v) in &fields {
            let p = join(path, k);
            if !keys.contains(&&**k) {
                return Err(unknown(path, "a content part", k, keys));
            }
            match &**k {
                "image_url" => {
                    data_url(v, &p)?;
                    image = true;
                }
                "file_id" if !is_null(v) => {
                    return Err(Denied::egress(
                        &p,
                        "a file id names a file stored at the provider; nightshift forwards only inline images",
                    ))
                }
                _ => {}
            }
        }
        if &*kind == "input_image" {
            if !image {
                return Err(Denied::new(
                    path,
                    "an input_image needs an inline image_url",
                ));
            }
            self.images += 1;
        }
        Ok(())
    }

    fn responses_tool(&mut self, raw: &RawValue, path: &str) -> Result<(), Denied> {
        let fields = object(raw, path)?;
        let kind = kind_of(&fields, path)?;
        let keys: &[&str] = match &*kind {
            "function" => &["type", "name", "description", "parameters", "strict"],
            "custom" => &["type", "name", "description", "format"],
            "local_shell" | "shell" | "apply_patch" => &["type"],
            // A group of function tools (Codex's sub-agent tools).
            "namespace" => &["type", "name", "description", "tools"],
            other => return self.server_tool(&join(path, "type"), other),
        };
        if &*kind == "namespace" {
            if let Some((_, tools)) = fields.iter().find(|(k, _)| k == "tools") {
                let p = join(path, "tools");
                each(tools, &p, |i, t| {
                    let pp = format!("{p}[{i}]");
                    self.count(&pp)?;
                    let inner = object(t, &pp)?;
                    let kind = kind_of(&inner, &pp)?;
                    if &*kind != "function" {
                        return Err(Denied::egress(
                            &join(&pp, "type"),
                            "a namespace holds function tools only",
                        ));
                    }
                    self.responses_tool(t, &pp)
                })?;
            }
        }
        for (k, _) in &fields {
            if !keys.contains(&&**k) {
                return Err(unknown(path, &format!("a {kind:?} tool"), k, keys));
            }
        }
        Ok(())
    }
}

/// Block types a Messages request's message content may hold.
const ANTHROPIC_BLOCKS: &[&str] = &[
    "text",
    "image",
    "document",
    "tool_use",
    "tool_result",
    "thinking",
    "redacted_thinking",
];

/// The `type` of an object (required).
fn kind_of<'a>(fields: &Fields<'a>, path: &str) -> Result<Cow<'a, str>, Denied> {
    match fields.iter().find(|(k, _)| k == "type") {
        Some((_, v)) => string(v, &join(path, "type")),
        None => Err(Denied::new(path, "needs a string field `type`")),
    }
}

// ---- streaming JSON pieces --------------------------------------------------

/// An object's fields, borrowed from its text: at most [`MAX_FIELDS`], none
/// twice.
fn object<'a>(raw: &'a RawValue, path: &str) -> Result<Fields<'a>, Denied> {
    serde_json::from_str::<Obj<'a>>(raw.get())
        .map(|o| o.0)
        .map_err(|e| {
            let text = e.to_string();
            let text = text.split(" at line ").next().unwrap_or(&text).to_string();
            Denied::new(path, text)
        })
}

/// Calls `f` on each element of an array, one at a time (never collected).
fn each<'a>(
    raw: &'a RawValue,
    path: &str,
    mut f: impl FnMut(usize, &'a RawValue) -> Result<(), Denied>,
) -> Result<(), Denied> {
    if lead(raw) != b'[' {
        return Err(Denied::new(path, "must be an array"));
    }
    let mut denied = None;
    let mut de = serde_json::Deserializer::from_str(raw.get());
    let seed = Each {
        f: &mut f,
        denied: &mut denied,
    };
    let parsed = seed.deserialize(&mut de);
    match (parsed, denied) {
        (_, Some(d)) => Err(d),
        (Err(e), None) => Err(Denied::new(path, e.to_string())),
        (Ok(()), None) => Ok(()),
    }
}

struct Each<'f, 'a> {
    f: &'f mut dyn FnMut(usize, &'a RawValue) -> Result<(), Denied>,
    denied: &'f mut Option<Denied>,
}

impl<'de, 'f> DeserializeSeed<'de> for Each<'f, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, 'f> Visitor<'de> for Each<'f, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0usize;
        while let Some(el) = seq.next_element::<&'de RawValue>()? {
            if let Err(d) = (self.f)(i, el) {
                *self.denied = Some(d);
                return Err(de::Error::custom("refused"));
            }
            i += 1;
        }
        Ok(())
    }
}

struct Obj<'a>(Fields<'a>);

impl<'de> Deserialize<'de> for Obj<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Obj<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Obj<'de>, A::Error> {
                let mut fields: Fields<'de> = Vec::new();
                while let Some(Key(k)) = map.next_key::<Key<'de>>()? {
                    if fields.len() >= MAX_FIELDS {
                        return Err(de::Error::custom(format!(
                            "more than {MAX_FIELDS} fields in one object"
                        )));
                    }
                    if fields.iter().any(|(seen, _)| *seen == k) {
                        return Err(de::Error::custom(format!(
                            "the field {:?} appears twice",
                            k.chars().take(100).collect::<String>()
                        )));
                    }
                    let v: &'de RawValue = map.next_value()?;
                    fields.push((k, v));
                }
                Ok(Obj(fields))
            }
        }
        d.deserialize_map(V)
    }
}

/// A short string (a key, a type, a role, a model): borrowed from the body
/// when it has no escapes; at most 256 bytes.
struct Key<'a>(Cow<'a, str>);

const MAX_KEY: usize = 256;

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "a string of at most {MAX_KEY} bytes")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                if v.len() > MAX_KEY {
                    return Err(E::custom(format!("a name over {MAX_KEY} bytes")));
                }
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                if v.len() > MAX_KEY {
                    return Err(E::custom(format!("a name over {MAX_KEY} bytes")));
                }
                Ok(Key(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

/// Whether a string is a `data:` URL (read without keeping it).
struct UrlHead(bool);

impl<'de> Deserialize<'de> for UrlHead {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = UrlHead;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a URL")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<UrlHead, E> {
                let head = v.get(..5).unwrap_or("");
                Ok(UrlHead(head.eq_ignore_ascii_case("data:")))
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(shape: Shape, body: serde_json::Value) -> Checked {
        check(shape, body.to_string().as_bytes(), &Allow::NONE)
            .unwrap_or_else(|d| panic!("{body}: {d:?}"))
    }

    fn denied(shape: Shape, body: serde_json::Value) -> Denied {
        match check(shape, body.to_string().as_bytes(), &Allow::NONE) {
            Ok(c) => panic!("{body} passed: {c:?}"),
            Err(d) => d,
        }
    }

    fn forwarded(c: &Checked, body: &[u8], max: u64) -> serde_json::Value {
        let b = Bytes::copy_from_slice(body);
        let all: Vec<u8> = c.forwarded(&b, max).concat();
        serde_json::from_slice(&all).expect("forwarded body is JSON")
    }

    #[test]
    fn the_usual_requests_pass_and_are_forwarded_with_the_bound_clamped() {
        let body = json!({"model": "claude-x", "max_tokens": 4096, "stream": true,
            "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "hi"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0"}}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"}]}],
            "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}],
            "thinking": {"type": "enabled", "budget_tokens": 1024}});
        let text = body.to_string();
        let c = ok(Shape::Messages, body.clone());
        assert_eq!(
            (c.model.as_str(), c.stream, c.output_bound, c.images),
            ("claude-x", true, Some(4096), 1)
        );
        let f = forwarded(&c, text.as_bytes(), 100);
        assert_eq!(f["max_tokens"], 100);
        assert_eq!(f["messages"], body["messages"]);

        let body = json!({"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}], "stream": true, "n": 1});
        let c = ok(Shape::Chat, body.clone());
        let f = forwarded(&c, body.to_string().as_bytes(), 77);
        assert_eq!(f["max_completion_tokens"], 77);
        assert_eq!(f["stream_options"], json!({"include_usage": true}));
        assert!(!c.client_wants_usage);
        assert!(f.get("max_tokens").is_none());

        let body = json!({"model": "gpt-5", "max_tokens": 50, "messages": []});
        let c = ok(Shape::Chat, body.clone());
        let f = forwarded(&c, body.to_string().as_bytes(), 20);
        assert_eq!(
            (f["max_tokens"].clone(), f.get("max_completion_tokens")),
            (json!(20), None)
        );

        let body = json!({"model": "gpt-5-codex", "instructions": "x", "store": false,
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                      {"type": "reasoning", "summary": [], "encrypted_content": "abc"},
                      {"type": "function_call", "call_id": "c", "name": "exec_command", "arguments": "{}"},
                      {"type": "function_call_output", "call_id": "c", "output": "ok"}],
            "tools": [{"type": "function", "name": "exec_command", "parameters": {}, "strict": false},
                      {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}}],
            "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "low"}, "stream": true});
        let c = ok(Shape::Responses, body.clone());
        let f = forwarded(&c, body.to_string().as_bytes(), 999);
        assert_eq!(f["max_output_tokens"], 999);
        assert_eq!(f["input"], body["input"]);
    }

    /// What Claude Code 2.1 and Codex 0.163 send (read from their requests
    /// through the gateway) passes.
    #[test]
    fn what_the_real_agents_send_passes() {
        ok(
            Shape::Messages,
            json!({"model": "claude-opus-5-5", "max_tokens": 128000, "stream": true,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "system", "content": [{"type": "text", "text": "env", "cache_control": {"type": "ephemeral"}}],
                 "output_config": {"effort": "medium"}}],
            "system": [{"type": "text", "text": "x"}],
            "tools": [{"name": "Bash", "description": "d", "input_schema": {}, "defer_loading": true}],
            "metadata": {"user_id": "u"}, "thinking": {"type": "adaptive", "display": "omitted"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "medium"}}),
        );
        let betas = "claude-code-20250219,advanced-tool-use-2025-11-20,mid-conversation-tool-changes-2026-07-01,per-turn-control-2026-07-01,thinking-token-count-2026-05-13,effort-2025-11-24,interleaved-thinking-2025-05-14,context-management-2025-06-27";
        assert!(check_betas("anthropic-beta", &[betas], Shape::Messages, &Allow::NONE).is_ok());
        ok(
            Shape::Responses,
            json!({"model": "gpt-5-codex", "stream": true, "store": false,
            "input": [{"type": "message", "id": "msg_1", "role": "developer", "content": [{"type": "input_text", "text": "x"}]}],
            "tools": [{"type": "function", "name": "exec_command", "description": "d", "strict": false, "parameters": {}},
                {"type": "namespace", "name": "multi_agent_v1", "description": "d",
                 "tools": [{"type": "function", "name": "close_agent", "description": "d", "strict": false, "parameters": {}}]}],
            "tool_choice": "auto", "parallel_tool_calls": true, "reasoning": {"summary": "auto"},
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k", "client_metadata": {"session_id": "s"}}),
        );
        // An answer sent back as litellm returns it (mini-swe-agent).
        ok(
            Shape::Chat,
            json!({"model": "gpt-5-mini", "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "function_call": null, "refusal": null, "annotations": [],
             "provider_specific_fields": {"refusal": null},
             "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "ok"}],
            "tools": [{"type": "function", "function": {"name": "bash", "parameters": {}}}]}),
        );
        // Codex's default live web search is refused (its preset turns it off).
        let d = denied(
            Shape::Responses,
            json!({"model": "g", "input": "hi",
            "tools": [{"type": "web_search", "external_web_access": true}]}),
        );
        assert!(d.egress);
    }

    #[test]
    fn every_way_out_is_refused_in_each_shape() {
        let m = |content: serde_json::Value| json!({"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": content}]});
        for body in [
            json!({"model": "c", "max_tokens": 5, "messages": [], "mcp_servers": [{"type": "url", "url": "https://x"}]}),
            json!({"model": "c", "max_tokens": 5, "messages": [], "tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}),
            json!({"model": "c", "max_tokens": 5, "messages": [], "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            m(json!([{"type": "image", "source": {"type": "url", "url": "https://x/?secret"}}])),
            m(json!([{"type": "document", "source": {"type": "url", "url": "https://x/"}}])),
            m(json!([{"type": "image", "source": {"type": "file", "file_id": "f"}}])),
            m(
                json!([{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {"type": "url", "url": "https://x"}}]}]),
            ),
            m(
                json!([{"type": "mcp_tool_use", "id": "x", "name": "y", "server_name": "z", "input": {}}]),
            ),
        ] {
            let d = denied(Shape::Messages, body.clone());
            assert!(d.egress, "{body}: {d:?}");
        }
        let c = |content: serde_json::Value| json!({"model": "g", "messages": [{"role": "user", "content": content}]});
        for body in [
            c(json!([{"type": "image_url", "image_url": {"url": "https://x/?secret"}}])),
            c(json!([{"type": "file", "file": {"file_id": "f"}}])),
            json!({"model": "g", "messages": [], "web_search_options": {}}),
            json!({"model": "g", "messages": [], "tools": [{"type": "web_search"}]}),
        ] {
            let d = denied(Shape::Chat, body.clone());
            assert!(d.egress, "{body}: {d:?}");
        }
        let r = |input: serde_json::Value| json!({"model": "g", "input": input});
        for body in [
            json!({"model": "g", "input": "hi", "tools": [{"type": "mcp", "server_label": "x", "server_url": "https://x"}]}),
            json!({"model": "g", "input": "hi", "tools": [{"type": "web_search"}]}),
            json!({"model": "g", "input": "hi", "tools": [{"type": "web_search_preview_2025_03_11"}]}),
            json!({"model": "g", "input": "hi", "previous_response_id": "resp_1"}),
            json!({"model": "g", "input": "hi", "conversation": "conv_1"}),
            r(
                json!([{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/?s"}]}]),
            ),
            r(json!([{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}])),
            r(
                json!([{"role": "user", "content": [{"type": "input_file", "file_url": "https://x"}]}]),
            ),
            r(json!([{"type": "item_reference", "id": "msg_1"}])),
            r(
                json!([{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image", "image_url": "http://x"}]}]),
            ),
        ] {
            let d = denied(Shape::Responses, body.clone());
            assert!(d.egress, "{body}: {d:?}");
        }
    }

    #[test]
    fn unknown_fields_duplicates_and_choices_are_refused_with_their_path() {
        let d = denied(
            Shape::Chat,
            json!({"model": "g", "messages": [], "best_of": 3}),
        );
        assert_eq!(d.path, "best_of");
        let d = denied(Shape::Chat, json!({"model": "g", "messages": [], "n": 128}));
        assert!(d.message.contains("max_choices"), "{d:?}");
        let allow = Allow {
            max_choices: 200,
            ..Allow::NONE
        };
        let c = check(
            Shape::Chat,
            br#"{"model":"g","messages":[],"n":128}"#,
            &allow,
        )
        .unwrap();
        assert_eq!(c.choices, 128);
        let d = check(
            Shape::Messages,
            br#"{"model":"c","max_tokens":1,"messages":[],"model":"d"}"#,
            &Allow::NONE,
        )
        .unwrap_err();
        assert!(d.message.contains("twice"), "{d:?}");
        let d = denied(
            Shape::Messages,
            json!({"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "url": "y"}]}]}),
        );
        assert_eq!(d.path, "messages[0].content[0].url");
        let d = check(Shape::Chat, b"[0,0,0]", &Allow::NONE).unwrap_err();
        assert_eq!(d.path, "");
    }

    #[test]
    fn a_server_tool_passes_only_when_enabled_and_the_run_is_public() {
        let tools = vec!["web_search".to_string()];
        let body = br#"{"model":"c","max_tokens":5,"messages":[],"tools":[{"type":"web_search_20250305","name":"web_search"}]}"#;
        let public = Allow {
            server_tools: &tools,
            private: false,
            max_choices: 1,
        };
        assert!(check(Shape::Messages, body, &public).is_ok());
        let private = Allow {
            private: true,
            ..public
        };
        let d = check(Shape::Messages, body, &private).unwrap_err();
        assert!(d.message.contains("private"), "{d:?}");
        assert_eq!(
            server_tool_name("web_search_preview_2025_03_11"),
            "web_search"
        );
        assert_eq!(
            server_tool_name("code_execution_20250825"),
            "code_execution"
        );
    }

    #[test]
    fn betas_are_on_a_list() {
        assert!(check_betas(
            "anthropic-beta",
            &["interleaved-thinking-2025-05-14, claude-code-20250219"],
            Shape::Messages,
            &Allow::NONE
        )
        .is_ok());
        let d = check_betas(
            "anthropic-beta",
            &["mcp-client-2025-04-04"],
            Shape::Messages,
            &Allow::NONE,
        )
        .unwrap_err();
        assert!(d.egress);
        assert!(check_betas(
            "openai-beta",
            &["responses=experimental"],
            Shape::Responses,
            &Allow::NONE
        )
        .is_ok());
        assert!(check_betas("openai-beta", &["assistants=v2"], Shape::Chat, &Allow::NONE).is_err());
    }

    /// Found by the `gateway_request` fuzz target: a lone UTF-16 surrogate
    /// escape in an opaque leaf passed the check (the raw walk does not
    /// decode such strings) and was forwarded, a body a strict parser
    /// refuses and a lenient one reads as something else.
    #[test]
    fn a_lone_surrogate_escape_is_refused_anywhere() {
        for body in [
            r#"{"model":"c","max_tokens":5,"messages":[],"tools":[{"name":"x\uDEEDy","input_schema":{}}]}"#,
            r#"{"model":"c","max_tokens":5,"messages":[],"tools":[{"name":"x\uD83Dy","input_schema":{}}]}"#,
            r#"{"model":"c","max_tokens":5,"messages":[],"tools":[{"name":"x\uD83D","input_schema":{}}]}"#,
        ] {
            let d = check(Shape::Messages, body.as_bytes(), &Allow::NONE).unwrap_err();
            assert!(d.message.contains("surrogate"), "{body}: {d:?}");
        }
        // A pair, and an escaped backslash before `u`, are fine.
        for body in [
            r#"{"model":"c","max_tokens":5,"messages":[],"tools":[{"name":"x\uD83D\uDE00","input_schema":{}}]}"#,
            r#"{"model":"c","max_tokens":5,"messages":[],"tools":[{"name":"x\\uDEED","input_schema":{}}]}"#,
        ] {
            check(Shape::Messages, body.as_bytes(), &Allow::NONE)
                .unwrap_or_else(|d| panic!("{body}: {d:?}"));
        }
    }

    /// Found by the `gateway_request` fuzz target: a number past f64's
    /// range in an opaque leaf passed and was forwarded (one parser refuses
    /// it, another reads infinity).
    #[test]
    fn a_number_out_of_range_is_refused_anywhere() {
        let body = r#"{"model":"c","max_tokens":5,"messages":[],"tools":[{"name":"t","input_schema":{"x":184467440731e9991615}}]}"#;
        let d = check(Shape::Messages, body.as_bytes(), &Allow::NONE).unwrap_err();
        assert!(d.message.contains("out of range"), "{d:?}");
        let fine = r#"{"model":"c","max_tokens":5,"messages":[],"tools":[{"name":"1e999","input_schema":{"x":-1.5e300}}]}"#;
        check(Shape::Messages, fine.as_bytes(), &Allow::NONE).unwrap();
    }

    proptest::proptest! {
        /// Whatever bytes come, the check answers (never panics), and a
        /// body it passes is forwarded as JSON.
        #[test]
        fn any_bytes_get_an_answer(body in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            for shape in [Shape::Chat, Shape::Responses, Shape::Messages] {
                if let Ok(c) = check(shape, &body, &Allow::NONE) {
                    let b = Bytes::copy_from_slice(&body);
                    let all: Vec<u8> = c.forwarded(&b, 1).concat();
                    proptest::prop_assert!(serde_json::from_slice::<serde_json::Value>(&all).is_ok());
                }
            }
        }
    }
}
