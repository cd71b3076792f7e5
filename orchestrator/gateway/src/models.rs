//! `STATE/models.toml`: the model endpoints the owner configured, the only
//! places the gateway forwards to (`route::tests::a_route_always_matches_family_and_glob`,
//! `tests/tests/gateway.rs::every_way_out_through_the_gateway_is_refused_and_nothing_reaches_the_endpoint`).
//!
//! Invariants:
//! - TOML into structs that refuse unknown fields; every error names the
//!   file, the line and, past the syntax, the endpoint's alias.
//! - A `base_url` is `https://`, or `http://` to a loopback address only
//!   (`127.0.0.0/8`, `::1`, `localhost`): a key never travels in clear
//!   text off the machine. It has no user info, query or fragment
//!   (`tests::base_urls`).
//! - `key_file` is a path only: the key is read from it at each use (see
//!   `gateway::key`), never here and never kept (the field is a `PathBuf`;
//!   `key::tests::a_private_key_file_is_read_and_others_are_refused_without_showing_the_key`).
//! - Model globs are `*` (any run of characters) and `?` (one character),
//!   matched in linear time ([`glob_match`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Which family of API an endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// Anthropic Messages (`/v1/messages`).
    Anthropic,
    /// OpenAI: Chat Completions (`/v1/chat/completions`) and Responses
    /// (`/v1/responses`).
    Openai,
}

impl Api {
    pub fn name(self) -> &'static str {
        match self {
            Api::Anthropic => "anthropic",
            Api::Openai => "openai",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEndpoint {
    api: Api,
    base_url: String,
    key_file: PathBuf,
    models: Vec<String>,
    #[serde(default)]
    ca_file: Option<PathBuf>,
    #[serde(default)]
    server_tools: Vec<String>,
    #[serde(default)]
    max_choices: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    max_request: Option<nightshift_core::config::Size>,
    max_line: Option<nightshift_core::config::Size>,
    max_response: Option<nightshift_core::config::Size>,
    first_byte_timeout: Option<nightshift_core::config::Span>,
    idle_timeout: Option<nightshift_core::config::Span>,
    call_timeout: Option<nightshift_core::config::Span>,
    heartbeat: Option<nightshift_core::config::Span>,
    request_timeout: Option<nightshift_core::config::Span>,
    concurrent: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawModels {
    #[serde(default)]
    endpoints: BTreeMap<String, toml::Spanned<RawEndpoint>>,
    #[serde(default)]
    gateway: RawLimits,
}

/// The gateway's bounds on each call (`[gateway]` in `models.toml`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest request body taken from the sandbox.
    pub max_request: u64,
    /// Longest line (and event) of a streamed response.
    pub max_line: u64,
    /// Most bytes of one response (streamed or not).
    pub max_response: u64,
    /// From sending the request to the response's headers.
    pub first_byte_timeout: std::time::Duration,
    /// Longest silence between two pieces of a response.
    pub idle_timeout: std::time::Duration,
    /// Longest call, start to end.
    pub call_timeout: std::time::Duration,
    /// A silence this long in a stream gets an SSE comment.
    pub heartbeat: std::time::Duration,
    /// A request's body must arrive within this (its head within 10 s).
    pub request_timeout: std::time::Duration,
    /// Calls served at once for one run.
    pub concurrent: usize,
}

impl Default for Limits {
    fn default() -> Self {
        use std::time::Duration;
        Limits {
            max_request: 32 << 20,
            max_line: 4 << 20,
            max_response: 256 << 20,
            first_byte_timeout: Duration::from_secs(300),
            idle_timeout: Duration::from_secs(300),
            call_timeout: Duration::from_secs(3600),
            heartbeat: Duration::from_secs(15),
            request_timeout: Duration::from_secs(60),
            concurrent: 16,
        }
    }
}

/// Where an endpoint is, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// The path prefix without a trailing slash (`""` for none).
    pub path: String,
}

impl BaseUrl {
    /// The `Host` header's value.
    pub fn authority(&self) -> String {
        let default = if self.tls { 443 } else { 80 };
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == default {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

/// One configured endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub alias: String,
    pub api: Api,
    pub base_url: BaseUrl,
    pub key_file: PathBuf,
    pub models: Vec<String>,
    /// PEM certificates of authorities trusted for this endpoint only,
    /// besides the system's (a self-hosted endpoint with its own CA).
    pub ca_file: Option<PathBuf>,
    /// Server-side tools the owner lets runs with public content use here
    /// ([`SERVER_TOOLS`]; none by default). MCP is never one.
    pub server_tools: Vec<String>,
    /// Most choices (`n`) one call may ask for; 1 by default.
    pub max_choices: u64,
}

/// The server-side tools an endpoint may enable (`server_tools`), by the
/// name of their type without its date (`web_search_20250305` is
/// `web_search`).
pub const SERVER_TOOLS: &[&str] = &[
    "web_search",
    "web_fetch",
    "code_execution",
    "file_search",
    "code_interpreter",
    "image_generation",
    "tool_search_tool_regex",
    "tool_search_tool_bm25",
];

/// The whole of `models.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Models {
    pub endpoints: Vec<Endpoint>,
    pub limits: Limits,
}

#[derive(Debug, thiserror::Error)]
pub enum ModelsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: line {line}: {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{path}: line {line}: endpoint {alias:?}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        alias: String,
        message: String,
    },
}

/// The file's name under the state directory.
pub const FILE: &str = "models.toml";

impl Models {
    /// Reads `path`; `Ok(None)` when there is no such file (no gateway).
    pub fn load(path: &Path) -> Result<Option<Models>, ModelsError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Models::parse(path, &text).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(ModelsError::Read {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    pub fn parse(path: &Path, text: &str) -> Result<Models, ModelsError> {
        let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
        let raw: RawModels = toml::from_str(text).map_err(|e| ModelsError::Parse {
            path: path.to_path_buf(),
            line: e.span().map(|s| line_of(s.start)).unwrap_or(1),
            message: e.message().to_string(),
        })?;
        let mut endpoints = Vec::new();
        for (alias, spanned) in raw.endpoints {
            let line = line_of(spanned.span().start);
            let invalid = |message: String| ModelsError::Invalid {
                path: path.to_path_buf(),
                line,
                alias: alias.clone(),
                message,
            };
            let e = spanned.into_inner();
            if alias.is_empty()
                || !alias
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(invalid(
                    "an alias is letters, digits, `-` and `_` only".into(),
                ));
            }
            let base_url = parse_base_url(&e.base_url).map_err(invalid)?;
            if !e.key_file.is_absolute() {
                return Err(invalid(format!(
                    "key_file {:?} must be an absolute path",
                    e.key_file
                )));
            }
            if let Some(ca) = &e.ca_file {
                if !ca.is_absolute() {
                    return Err(invalid(format!("ca_file {ca:?} must be an absolute path")));
                }
                if !base_url.tls {
                    return Err(invalid(
                        "ca_file is for an https:// endpoint; this one is plain http".into(),
                    ));
                }
            }
            if e.models.is_empty() {
                return Err(invalid(
                    "models is empty: list the model globs the agent may ask for".into(),
                ));
            }
            for m in &e.models {
                if m.is_empty() || m.len() > 200 || m.chars().any(char::is_control) {
                    return Err(invalid(format!(
                        "model glob {m:?} must be 1-200 printable characters"
                    )));
                }
            }
            for t in &e.server_tools {
                if !SERVER_TOOLS.contains(&t.as_str()) {
                    return Err(invalid(format!(
                        "server_tools: {t:?} is not a server tool nightshift can enable (it can: {}; never MCP)",
                        SERVER_TOOLS.join(", ")
                    )));
                }
            }
            let max_choices = e.max_choices.unwrap_or(1);
            if !(1..=128).contains(&max_choices) {
                return Err(invalid(format!(
                    "max_choices = {max_choices}: it is 1 to 128"
                )));
            }
            endpoints.push(Endpoint {
                alias,
                api: e.api,
                base_url,
                key_file: e.key_file,
                models: e.models,
                ca_file: e.ca_file,
                server_tools: e.server_tools,
                max_choices,
            });
        }
        let d = Limits::default();
        let l = raw.gateway;
        let limits = Limits {
            max_request: l.max_request.map(|s| s.0).unwrap_or(d.max_request),
            max_line: l.max_line.map(|s| s.0).unwrap_or(d.max_line),
            max_response: l.max_response.map(|s| s.0).unwrap_or(d.max_response),
            first_byte_timeout: l
                .first_byte_timeout
                .map(|s| s.0)
                .unwrap_or(d.first_byte_timeout),
            idle_timeout: l.idle_timeout.map(|s| s.0).unwrap_or(d.idle_timeout),
            call_timeout: l.call_timeout.map(|s| s.0).unwrap_or(d.call_timeout),
            heartbeat: l.heartbeat.map(|s| s.0).unwrap_or(d.heartbeat),
            request_timeout: l.request_timeout.map(|s| s.0).unwrap_or(d.request_timeout),
            concurrent: l
                .concurrent
                .map(|n| n.clamp(1, 256) as usize)
                .unwrap_or(d.concurrent),
        };
        Ok(Models { endpoints, limits })
    }
}

/// Parses a base URL: `https://host[:port][/path]`, or `http://` to a
/// loopback host.
pub fn parse_base_url(url: &str) -> Result<BaseUrl, String> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(format!("base_url {url:?} must start with https://"));
    };
    if rest.contains(['?', '#', '@']) || rest.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "base_url {url:?} must have no user info, query, fragment or spaces"
        ));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("base_url {url:?}: unclosed [ in the host"))?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err(format!("base_url {url:?}: bad host")),
        };
        (h.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (authority.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err(format!("base_url {url:?} has no host"));
    }
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("base_url {url:?}: port {p:?} is not a port"))?,
        None if tls => 443,
        None => 80,
    };
    let host = host.to_ascii_lowercase();
    if !tls && !is_loopback(&host) {
        return Err(format!(
            "base_url {url:?}: plain http:// is allowed only to a loopback address (127.0.0.1, ::1, localhost); use https://"
        ));
    }
    Ok(BaseUrl {
        tls,
        host,
        port,
        path: path.to_string(),
    })
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether `name` matches `glob` (`*`: any run, `?`: one character), in
/// time linear in their lengths' product at worst and usually linear.
pub fn glob_match(glob: &str, name: &str) -> bool {
    let g: Vec<char> = glob.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut gi, mut ni) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if gi < g.len() && (g[gi] == '?' || g[gi] == n[ni]) {
            gi += 1;
            ni += 1;
        } else if gi < g.len() && g[gi] == '*' {
            star = Some((gi, ni));
            gi += 1;
        } else if let Some((sg, sn)) = star {
            gi = sg + 1;
            ni = sn + 1;
            star = Some((sg, sn + 1));
        } else {
            return false;
        }
    }
    while gi < g.len() && g[gi] == '*' {
        gi += 1;
    }
    gi == g.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EXAMPLE: &str = include_str!("../../../docs/models.example.toml");

    #[test]
    fn the_documented_example_parses() {
        let m = Models::parse(Path::new("docs/models.example.toml"), EXAMPLE).unwrap();
        let anthropic = m.endpoints.iter().find(|e| e.alias == "anthropic").unwrap();
        assert_eq!(anthropic.api, Api::Anthropic);
        assert_eq!(anthropic.base_url.host, "api.anthropic.com");
        assert!(anthropic.base_url.tls);
        assert_eq!(anthropic.models, vec!["claude-*".to_string()]);
        let openai = m.endpoints.iter().find(|e| e.alias == "openai").unwrap();
        assert_eq!(openai.api, Api::Openai);
        assert_eq!(openai.base_url.path, "");
    }

    #[test]
    fn server_tools_are_named_never_mcp_and_choices_bounded() {
        let p = Path::new("models.toml");
        let base = "[endpoints.a]\napi = \"anthropic\"\nbase_url = \"https://x\"\nkey_file = \"/k\"\nmodels = [\"c*\"]\n";
        let m = Models::parse(p, base).unwrap();
        assert!(m.endpoints[0].server_tools.is_empty());
        assert_eq!(m.endpoints[0].max_choices, 1);
        let m = Models::parse(
            p,
            &format!("{base}server_tools = [\"web_search\"]\nmax_choices = 4\n"),
        )
        .unwrap();
        assert_eq!(m.endpoints[0].server_tools, ["web_search"]);
        assert_eq!(m.endpoints[0].max_choices, 4);
        let e = Models::parse(p, &format!("{base}server_tools = [\"mcp\"]\n")).unwrap_err();
        assert!(e.to_string().contains("never MCP"), "{e}");
        assert!(Models::parse(p, &format!("{base}max_choices = 0\n")).is_err());
    }

    #[test]
    fn errors_name_the_file_line_and_alias() {
        let p = Path::new("models.toml");
        let text = "[endpoints.a]\napi = \"openai\"\nbase_url = \"https://x\"\nkey_file = \"/k\"\nmodels = [\"gpt-*\"]\n\n[endpoints.b]\napi = \"openai\"\nbase_url = \"http://example.com\"\nkey_file = \"/k\"\nmodels = [\"*\"]\n";
        let e = Models::parse(p, text).unwrap_err().to_string();
        assert!(e.starts_with("models.toml: line 7: endpoint \"b\":"), "{e}");
        assert!(e.contains("loopback"), "{e}");
        let e = Models::parse(p, "[endpoints.a]\napi = \"openai\"\nbase_url = \"https://x\"\nkey_file = \"/k\"\nmodels = [\"m\"]\nkye = 1\n").unwrap_err().to_string();
        assert!(e.starts_with("models.toml: line "), "{e}");
        assert!(e.contains("kye"), "{e}");
        let e = Models::parse(p, "[endpoints.a]\napi = \"gemini\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("models.toml: line 2:"), "{e}");
        let e = Models::parse(
            p,
            "[endpoints.a]\napi = \"openai\"\nbase_url = \"https://x\"\nkey_file = \"k\"\nmodels = [\"m\"]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("absolute"), "{e}");
    }

    #[test]
    fn base_urls() {
        let u = parse_base_url("https://api.example.com/v2/").unwrap();
        assert_eq!(
            (u.tls, u.host.as_str(), u.port, u.path.as_str()),
            (true, "api.example.com", 443, "/v2")
        );
        assert_eq!(u.authority(), "api.example.com");
        let u = parse_base_url("http://127.0.0.1:8080").unwrap();
        assert_eq!((u.tls, u.port), (false, 8080));
        assert_eq!(u.authority(), "127.0.0.1:8080");
        assert!(parse_base_url("http://[::1]:9").is_ok());
        assert!(parse_base_url("http://localhost").is_ok());
        for bad in [
            "http://10.0.0.1",
            "http://127.0.0.1.example.com",
            "ftp://x",
            "https://user:pw@x",
            "https://x?q",
            "https://:443",
            "https://x:0",
            "https://x:99999",
        ] {
            assert!(parse_base_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_ca_file_is_absolute_and_only_for_https() {
        let p = Path::new("models.toml");
        let ok = Models::parse(p, "[endpoints.a]\napi = \"openai\"\nbase_url = \"https://x\"\nkey_file = \"/k\"\nmodels = [\"m\"]\nca_file = \"/etc/ca.pem\"\n").unwrap();
        assert_eq!(
            ok.endpoints[0].ca_file.as_deref(),
            Some(Path::new("/etc/ca.pem"))
        );
        let e = Models::parse(p, "[endpoints.a]\napi = \"openai\"\nbase_url = \"https://x\"\nkey_file = \"/k\"\nmodels = [\"m\"]\nca_file = \"ca.pem\"\n").unwrap_err().to_string();
        assert!(e.contains("ca_file") && e.contains("absolute"), "{e}");
        let e = Models::parse(p, "[endpoints.a]\napi = \"openai\"\nbase_url = \"http://127.0.0.1:9\"\nkey_file = \"/k\"\nmodels = [\"m\"]\nca_file = \"/ca.pem\"\n").unwrap_err().to_string();
        assert!(e.contains("ca_file") && e.contains("https"), "{e}");
    }

    #[test]
    fn globs() {
        assert!(glob_match("claude-*", "claude-sonnet-4-5"));
        assert!(!glob_match("claude-*", "gpt-5"));
        assert!(glob_match("gpt-?o", "gpt-4o"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("a", "ab"));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(!glob_match("a*b*c", "axxbyy"));
    }

    proptest! {
        /// The matcher agrees with a regex built from the glob.
        #[test]
        fn glob_agrees_with_regex(glob in "[ab*?]{0,8}", name in "[abc]{0,10}") {
            let mut re = String::from("^");
            for c in glob.chars() {
                match c {
                    '*' => re.push_str(".*"),
                    '?' => re.push('.'),
                    c => re.push_str(&regex::escape(&c.to_string())),
                }
            }
            re.push('$');
            let re = regex::Regex::new(&re).unwrap();
            prop_assert_eq!(glob_match(&glob, &name), re.is_match(&name));
        }
    }
}
