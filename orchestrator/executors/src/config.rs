//! The owner's destinations: where approved acts may land, and where the
//! credentials for each live. docs/destinations.md has complete examples.
//!
//! ```toml
//! [remotes.origin]                  # HTTPS: system roots, plus ca_file
//! url = "https://git.example.com/owner/name.git"
//! readers = "private"
//! token_file = "/etc/nightshift/origin.token"
//! ca_file = "/etc/nightshift/example-ca.pem"           # optional
//!
//! [remotes.backup]                  # SSH: a key or the agent, known_hosts
//! url = "git@git.example.com:owner/name.git"
//! readers = "private"
//! ssh_key_file = "/etc/nightshift/id_ed25519"
//! known_hosts = "/etc/nightshift/known_hosts"
//!
//! [forges.github]
//! kind = "github"                   # or "gitlab", "gitea" (Forgejo too)
//! api = "https://api.github.com"
//! repo = "owner/name"
//! remote = "origin"                 # where its branches are pushed
//! token_file = "/etc/nightshift/github.token"
//! readers = "public"
//!
//! [notify.team-room]
//! kind = "webhook"                  # JSON, signed: X-Nightshift-Signature
//! url = "https://hooks.example.com/nightshift"
//! readers = "private"
//! secret_file = "/etc/nightshift/hook.secret"
//!
//! [summary]                         # the morning summary
//! notify = "team-room"
//! ```
//!
//! Invariants:
//! - These structs hold paths to credential files, never credentials: they
//!   may be printed and serialized. The files are read by the executors at
//!   the moment of use ([`crate::Secret`])
//!   (`tests::the_listing_shows_kinds_and_urls_without_credentials`,
//!   `tests/loopback.rs::configs_print_paths_never_secrets`).
//! - Every table refuses unknown fields; every HTTP URL is `http://` or
//!   `https://` with no user information in it (a credential never travels
//!   in a URL, and the username has its own field)
//!   (`tests::unknown_fields_are_refused_with_their_line`,
//!   `tests::bad_values_are_refused`).
//! - A credential never travels in clear over a network: one attached to a
//!   plain `http://` destination that is not loopback is refused at load,
//!   unless the owner wrote `insecure = true` for it (then every use warns)
//!   (`tests::a_credential_on_plain_http_beyond_loopback_is_refused_unless_insecure`).
//! - An SSH remote has a known_hosts file and exactly one way to
//!   authenticate (a key file or the agent); nothing is trusted on first use.
//! - Aliases are the only names an act may use; they are plain words
//!   (`[A-Za-z0-9._-]+`), so that an alias shown to a person is the alias
//!   (`tests::bad_values_are_refused`; the door refuses anything else for a
//!   destination: `sandbox-image/door/src/validate.rs::tests::urls_and_paths_are_refused_by_name`).
//! - Every problem is reported, each naming the file, the line of its table
//!   and the alias.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Default time limit of one push, in seconds.
pub const DEFAULT_PUSH_TIMEOUT_SECS: u64 = 120;
/// Default time limit of one HTTP call, in seconds.
pub const DEFAULT_HTTP_TIMEOUT_SECS: u64 = 30;

/// Every destination the owner configured, by alias.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Destinations {
    /// Git remotes that pushes may go to.
    #[serde(default)]
    pub remotes: BTreeMap<String, RemoteConfig>,
    /// Forges that pull requests may be opened on.
    #[serde(default)]
    pub forges: BTreeMap<String, ForgeConfig>,
    /// Endpoints that messages may be posted to.
    #[serde(default)]
    pub notify: BTreeMap<String, NotifyConfig>,
    /// The morning summary, if the owner wants one.
    #[serde(default)]
    pub summary: Option<SummaryConfig>,
}

/// Who may read what lands at a destination: the policy engine's one
/// [`policies::Readers`] type, so that the gate and the configuration never
/// disagree about it.
pub use policies::Readers;

/// A git remote reached over HTTPS, plain HTTP (loopback, or `insecure`),
/// SSH, or a local `file://` repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {
    /// `https://`, `http://`, `ssh://`, `user@host:path` or `file:///`
    /// location of the repository, without credentials.
    pub url: String,
    /// Who may read the remote.
    pub readers: Readers,
    /// HTTP Basic username; required with `password_file`, defaults to
    /// `x-access-token` with `token_file`. For SSH, the login (default: the
    /// URL's, else `git`).
    #[serde(default)]
    pub username: Option<String>,
    /// File holding the password.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// File holding an access token, sent as the Basic password.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// PEM file of certificate authorities trusted for this remote besides
    /// the system's (a self-hosted forge).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Allows a credential over plain `http://` to a host that is not
    /// loopback. Every use warns.
    #[serde(default)]
    pub insecure: bool,
    /// SSH: file holding the private key (unencrypted, mode 0600).
    #[serde(default)]
    pub ssh_key_file: Option<PathBuf>,
    /// SSH: authenticate through the supervisor's ssh-agent
    /// (`SSH_AUTH_SOCK`).
    #[serde(default)]
    pub ssh_agent: bool,
    /// SSH: the known_hosts file the server's key must be in.
    #[serde(default)]
    pub known_hosts: Option<PathBuf>,
    /// Time limit of one push, in seconds (default 120).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

/// Username sent with a `token_file` when none is configured (the
/// convention of GitHub and Gitea for tokens over Basic auth).
pub const TOKEN_USERNAME: &str = "x-access-token";

/// Where a remote's credential is, once the config is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteCredential<'a> {
    /// HTTP Basic username.
    pub username: &'a str,
    /// File holding the password or token.
    pub secret_file: &'a Path,
}

impl RemoteConfig {
    /// A remote at `url` with no credential and every option at its default.
    pub fn new(url: impl Into<String>, readers: Readers) -> RemoteConfig {
        RemoteConfig {
            url: url.into(),
            readers,
            username: None,
            password_file: None,
            token_file: None,
            ca_file: None,
            insecure: false,
            ssh_key_file: None,
            ssh_agent: false,
            known_hosts: None,
            timeout_secs: None,
        }
    }

    /// The HTTP credential to offer when the remote asks for one, if any.
    pub fn credential(&self) -> Option<RemoteCredential<'_>> {
        match (&self.password_file, &self.token_file) {
            (Some(file), _) => Some(RemoteCredential {
                username: self.username.as_deref().unwrap_or_default(),
                secret_file: file,
            }),
            (None, Some(file)) => Some(RemoteCredential {
                username: self.username.as_deref().unwrap_or(TOKEN_USERNAME),
                secret_file: file,
            }),
            (None, None) => None,
        }
    }

    /// What kind of location the URL is (`None`: not one we reach).
    pub fn location(&self) -> Result<Location, &'static str> {
        Location::parse(&self.url)
    }
}

/// The kinds of place a git remote can be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// `https://host/...`
    Https { host: String },
    /// `http://host/...`; `loopback` when the host is this machine.
    Http { host: String, loopback: bool },
    /// `ssh://[user@]host[:port]/path` or `[user@]host:path`.
    Ssh {
        user: Option<String>,
        host: String,
        port: u16,
    },
    /// `file:///absolute/path`
    File,
}

impl Location {
    /// Parses and checks a remote's URL.
    pub fn parse(url: &str) -> Result<Location, &'static str> {
        if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err("must not contain whitespace or control characters");
        }
        if let Some(path) = url.strip_prefix("file://") {
            if !path.starts_with('/') || path.split('/').any(|c| c == "..") {
                return Err("a file:// remote must name an absolute path without ..");
            }
            return Ok(Location::File);
        }
        if url.starts_with("http://") || url.starts_with("https://") {
            check_url(url)?;
            let host = url_host(url).to_string();
            return Ok(if url.starts_with("https://") {
                Location::Https { host }
            } else {
                let loopback = is_loopback(&host);
                Location::Http { host, loopback }
            });
        }
        if let Some(rest) = url.strip_prefix("ssh://") {
            let (authority, path) = rest.split_once('/').ok_or("an ssh:// URL needs a path")?;
            if path.is_empty() {
                return Err("an ssh:// URL needs a path");
            }
            let (user, hostport) = match authority.rsplit_once('@') {
                Some((u, h)) => (Some(u), h),
                None => (None, authority),
            };
            let (host, port) = split_port(hostport)?;
            return ssh_location(user, host, port);
        }
        if url.contains("://") {
            return Err(
                "must start with https://, http://, ssh:// or file://, or be user@host:path",
            );
        }
        // scp-like: [user@]host:path (git's own rule: a colon before any slash).
        let (before, path) = url
            .split_once(':')
            .ok_or("must start with https://, http://, ssh:// or file://, or be user@host:path")?;
        if before.contains('/') || path.is_empty() {
            return Err(
                "must start with https://, http://, ssh:// or file://, or be user@host:path",
            );
        }
        let (user, host) = match before.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, before),
        };
        ssh_location(user, host, 22)
    }

    /// A short name of the kind: `https`, `http`, `ssh`, `file`.
    pub fn kind(&self) -> &'static str {
        match self {
            Location::Https { .. } => "https",
            Location::Http { .. } => "http",
            Location::Ssh { .. } => "ssh",
            Location::File => "file",
        }
    }
}

fn split_port(hostport: &str) -> Result<(&str, u16), &'static str> {
    if let Some(rest) = hostport.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("an unclosed [ in the host")?;
        return match after.strip_prefix(':') {
            Some(p) => Ok((host, p.parse().map_err(|_| "the port is not a number")?)),
            None if after.is_empty() => Ok((host, 22)),
            None => Err("text after the host's ]"),
        };
    }
    match hostport.split_once(':') {
        Some((h, p)) => Ok((h, p.parse().map_err(|_| "the port is not a number")?)),
        None => Ok((hostport, 22)),
    }
}

fn ssh_location(user: Option<&str>, host: &str, port: u16) -> Result<Location, &'static str> {
    if host.is_empty() {
        return Err("has no host");
    }
    let word = |s: &str| {
        !s.is_empty()
            && !s.starts_with('-')
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'))
    };
    if !word(host) {
        return Err("the host must be a name or address (and never start with -)");
    }
    if let Some(u) = user {
        if !word(u) || u.contains(':') {
            return Err(
                "the SSH user must be a plain name without ':' (a password never goes in a URL)",
            );
        }
    }
    if port == 0 {
        return Err("port 0");
    }
    Ok(Location::Ssh {
        user: user.map(str::to_string),
        host: host.to_string(),
        port,
    })
}

/// The host of an `http(s)://` URL that passed [`check_url`], without port
/// or brackets.
pub(crate) fn url_host(url: &str) -> &str {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .unwrap_or(url);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next().unwrap_or_default();
    }
    authority.split(':').next().unwrap_or_default()
}

/// Whether a host name is this machine: `localhost`, 127.0.0.0/8, `::1`.
pub(crate) fn is_loopback(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    host.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// Which API a forge speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ForgeKind {
    /// GitHub's REST API (`/repos/{owner}/{repo}/pulls`).
    #[default]
    Github,
    /// GitLab's merge requests API (`/projects/{id}/merge_requests`).
    Gitlab,
    /// Gitea's and Forgejo's API (`/repos/{owner}/{repo}/pulls`).
    Gitea,
}

impl ForgeKind {
    /// Its name in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            ForgeKind::Github => "github",
            ForgeKind::Gitlab => "gitlab",
            ForgeKind::Gitea => "gitea",
        }
    }
}

/// A forge that pull (merge) requests are opened on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForgeConfig {
    /// Which API it speaks (default `github`).
    #[serde(default)]
    pub kind: ForgeKind,
    /// Base URL of the API, e.g. `https://api.github.com`,
    /// `https://gitlab.com/api/v4`, `https://gitea.example.com/api/v1`.
    pub api: String,
    /// `owner/name` of the repository (GitLab: the project's full path,
    /// `group/subgroup/name`).
    pub repo: String,
    /// The alias of the configured git remote that is this repository: a
    /// pull request's head branch is made to hold the approved commit there
    /// (fast-forward only, under a lease) before the request is sent.
    pub remote: String,
    /// File holding the API token (sent as `Authorization: Bearer`).
    pub token_file: PathBuf,
    /// Who may read the forge's repository.
    pub readers: Readers,
    /// PEM file of certificate authorities trusted besides the system's.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Allows the token over plain `http://` to a host that is not loopback.
    #[serde(default)]
    pub insecure: bool,
    /// Time limit of one call, in seconds (default 30).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

impl ForgeConfig {
    /// A GitHub-shaped forge with every option at its default.
    pub fn new(
        api: impl Into<String>,
        repo: impl Into<String>,
        remote: impl Into<String>,
        token_file: PathBuf,
        readers: Readers,
    ) -> ForgeConfig {
        ForgeConfig {
            kind: ForgeKind::Github,
            api: api.into(),
            repo: repo.into(),
            remote: remote.into(),
            token_file,
            readers,
            ca_file: None,
            insecure: false,
            timeout_secs: None,
        }
    }
}

/// The shape of what is posted to an endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NotifyKind {
    /// The message body as is (`text/plain`).
    #[default]
    Plain,
    /// A JSON object `{"source", "kind", "text"}` signed with HMAC-SHA256
    /// (header `X-Nightshift-Signature: sha256=<hex>`).
    Webhook,
    /// A Slack-compatible incoming webhook: `{"text": ...}`.
    Slack,
}

impl NotifyKind {
    /// Its name in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            NotifyKind::Plain => "plain",
            NotifyKind::Webhook => "webhook",
            NotifyKind::Slack => "slack",
        }
    }
}

/// An HTTP endpoint that messages are posted to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyConfig {
    /// The shape of the post (default `plain`).
    #[serde(default)]
    pub kind: NotifyKind,
    /// URL the message is POSTed to (or `url_file`).
    #[serde(default)]
    pub url: Option<String>,
    /// File holding the URL, for endpoints whose URL is the credential (a
    /// Slack incoming webhook). Read at use like any secret; never shown.
    #[serde(default)]
    pub url_file: Option<PathBuf>,
    /// Who may read what is posted.
    pub readers: Readers,
    /// File holding a token sent as `Authorization: Bearer`, if the endpoint
    /// wants one.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// `webhook`: file holding the HMAC-SHA256 key of the signature.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// PEM file of certificate authorities trusted besides the system's.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Allows a credential over plain `http://` to a host that is not
    /// loopback.
    #[serde(default)]
    pub insecure: bool,
    /// Time limit of one call, in seconds (default 30).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

impl NotifyConfig {
    /// A plain endpoint at `url` with every option at its default.
    pub fn new(url: impl Into<String>, readers: Readers) -> NotifyConfig {
        NotifyConfig {
            kind: NotifyKind::Plain,
            url: Some(url.into()),
            url_file: None,
            readers,
            token_file: None,
            secret_file: None,
            ca_file: None,
            insecure: false,
            timeout_secs: None,
        }
    }

    /// How the endpoint is shown: its URL, or where its URL is kept.
    pub fn shown(&self) -> String {
        match (&self.url, &self.url_file) {
            (Some(url), _) => url.clone(),
            (None, Some(file)) => format!("(url in {})", file.display()),
            (None, None) => "(no url)".into(),
        }
    }
}

/// The morning summary: where it goes and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SummaryConfig {
    /// The `[notify]` alias it is posted to.
    pub notify: String,
    /// `HH:MM` (UTC): send at this time too, if runs ended since the last
    /// summary (checked by `nightshift serve` and `nightshift summary`).
    #[serde(default)]
    pub at: Option<String>,
    /// What the summary tells the reader to open: a URL of the dashboard
    /// or a command (default `nightshift queue`).
    #[serde(default)]
    pub review: Option<String>,
}

/// One problem of a destinations file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The line of the destination's table, when it can be found.
    pub line: Option<usize>,
    /// `remotes`, `forges`, `notify`, `summary`.
    pub table: &'static str,
    /// The alias (empty for `[summary]`).
    pub alias: String,
    /// What is wrong.
    pub why: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(line) = self.line {
            write!(f, "line {line}: ")?;
        }
        if self.alias.is_empty() {
            write!(f, "[{}]: {}", self.table, self.why)
        } else {
            write!(f, "[{}.{}]: {}", self.table, self.alias, self.why)
        }
    }
}

/// A destinations file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading destinations {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The source (toml's error) gives the line and column.
    #[error("parsing destinations {origin}")]
    Parse {
        origin: String,
        #[source]
        source: Box<toml::de::Error>,
    },
    #[error("checking destinations {origin}: {}", show_problems(problems))]
    Invalid {
        origin: String,
        problems: Vec<Problem>,
    },
}

fn show_problems(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(Problem::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl Destinations {
    /// Reads and checks a destinations file.
    pub fn load(path: &Path) -> Result<Destinations, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Destinations::parse(&text, &path.display().to_string())
    }

    /// Parses and checks destinations from TOML text; `origin` names where
    /// the text came from, for errors.
    pub fn parse(text: &str, origin: &str) -> Result<Destinations, ConfigError> {
        let parsed: Destinations = toml::from_str(text).map_err(|source| ConfigError::Parse {
            origin: origin.to_string(),
            source: Box::new(source),
        })?;
        let mut problems = parsed.problems();
        if problems.is_empty() {
            return Ok(parsed);
        }
        for p in &mut problems {
            p.line = table_line(text, p.table, &p.alias);
        }
        Err(ConfigError::Invalid {
            origin: origin.to_string(),
            problems,
        })
    }

    /// Checks what the types cannot: aliases, URLs, credential fields.
    pub fn check(&self, origin: &str) -> Result<(), ConfigError> {
        let problems = self.problems();
        if problems.is_empty() {
            return Ok(());
        }
        Err(ConfigError::Invalid {
            origin: origin.to_string(),
            problems,
        })
    }

    /// Every problem of the destinations, in file order of tables.
    pub fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        let mut add = |table: &'static str, alias: &str, why: String| {
            out.push(Problem {
                line: None,
                table,
                alias: alias.to_string(),
                why,
            })
        };
        for (alias, remote) in &self.remotes {
            let mut bad = |why: String| add("remotes", alias, why);
            if let Err(why) = check_alias(alias) {
                bad(why.into());
            }
            if let Err(why) = check_timeout(remote.timeout_secs) {
                bad(why.into());
            }
            let location = match remote.location() {
                Ok(l) => l,
                Err(why) => {
                    bad(format!("url: {why}"));
                    continue;
                }
            };
            let http_credential = remote.password_file.is_some() || remote.token_file.is_some();
            let ssh_fields =
                remote.ssh_key_file.is_some() || remote.ssh_agent || remote.known_hosts.is_some();
            if remote.password_file.is_some() && remote.token_file.is_some() {
                bad("password_file and token_file are exclusive".into());
            }
            if remote
                .username
                .as_deref()
                .is_some_and(|u| !plain_username(u))
            {
                bad("username must be non-empty visible text without ':'".into());
            }
            match &location {
                Location::Ssh { .. } => {
                    if http_credential || remote.ca_file.is_some() || remote.insecure {
                        bad("an ssh remote takes ssh_key_file or ssh_agent and known_hosts, not password_file, token_file, ca_file or insecure".into());
                    }
                    match (&remote.ssh_key_file, remote.ssh_agent) {
                        (Some(_), true) => bad("ssh_key_file and ssh_agent are exclusive".into()),
                        (None, false) => {
                            bad("an ssh remote needs ssh_key_file or ssh_agent = true".into())
                        }
                        _ => {}
                    }
                    if remote.known_hosts.is_none() {
                        bad("an ssh remote needs known_hosts: the server's key is checked against it, never trusted on first use".into());
                    }
                }
                other => {
                    if ssh_fields {
                        bad("ssh_key_file, ssh_agent and known_hosts are for ssh remotes".into());
                    }
                    if remote.password_file.is_some() && remote.username.is_none() {
                        bad("password_file needs a username".into());
                    }
                    match other {
                        Location::Http {
                            loopback: false, ..
                        } if http_credential && !remote.insecure => bad(
                            "a credential on a plain http:// remote that is not loopback would travel in clear: use https://, or write insecure = true to accept that".into(),
                        ),
                        Location::Https { .. } => {}
                        _ if remote.ca_file.is_some() => {
                            bad("ca_file is for https:// remotes".into())
                        }
                        _ => {}
                    }
                    if matches!(other, Location::File) && http_credential {
                        bad("a file:// remote takes no credential".into());
                    }
                }
            }
        }
        for (alias, forge) in &self.forges {
            let mut bad = |why: String| add("forges", alias, why);
            if let Err(why) = check_alias(alias) {
                bad(why.into());
            }
            if let Err(why) = check_url(&forge.api) {
                bad(format!("api: {why}"));
            } else if let Err(why) = check_clear(&forge.api, true, forge.insecure) {
                bad(format!("api: {why}"));
            }
            if let Err(why) = check_timeout(forge.timeout_secs) {
                bad(why.into());
            }
            if !self.remotes.contains_key(&forge.remote) {
                bad(format!(
                    "remote {:?} is not a configured [remotes] alias: a forge names the git remote that holds its branches",
                    forge.remote
                ));
            }
            let parts: Vec<&str> = forge.repo.split('/').collect();
            let word = |p: &str| !p.is_empty() && p.bytes().all(alias_byte) && p != "..";
            let count_ok = match forge.kind {
                ForgeKind::Gitlab => parts.len() >= 2,
                _ => parts.len() == 2,
            };
            if !count_ok || !parts.iter().all(|p| word(p)) {
                bad(format!(
                    "repo {:?} is not {}",
                    forge.repo,
                    match forge.kind {
                        ForgeKind::Gitlab => "group/name (or group/subgroup/name)",
                        _ => "owner/name",
                    }
                ));
            }
        }
        for (alias, endpoint) in &self.notify {
            let mut bad = |why: String| add("notify", alias, why);
            if let Err(why) = check_alias(alias) {
                bad(why.into());
            }
            match (&endpoint.url, &endpoint.url_file) {
                (Some(url), None) => {
                    let credential =
                        endpoint.token_file.is_some() || endpoint.secret_file.is_some();
                    if let Err(why) = check_url(url) {
                        bad(format!("url: {why}"));
                    } else if let Err(why) = check_clear(url, credential, endpoint.insecure) {
                        bad(format!("url: {why}"));
                    }
                }
                (None, Some(_)) => {}
                _ => bad("exactly one of url and url_file is needed".into()),
            }
            if let Err(why) = check_timeout(endpoint.timeout_secs) {
                bad(why.into());
            }
            match endpoint.kind {
                NotifyKind::Webhook if endpoint.secret_file.is_none() => {
                    bad("a webhook needs secret_file: the key of its HMAC-SHA256 signature".into())
                }
                NotifyKind::Plain | NotifyKind::Slack if endpoint.secret_file.is_some() => {
                    bad("secret_file is for kind = \"webhook\"".into())
                }
                _ => {}
            }
        }
        if let Some(summary) = &self.summary {
            let mut bad = |why: String| add("summary", "", why);
            if !self.notify.contains_key(&summary.notify) {
                bad(format!(
                    "notify {:?} is not a configured [notify] alias",
                    summary.notify
                ));
            }
            if let Some(at) = &summary.at {
                if parse_hhmm(at).is_none() {
                    bad(format!("at {at:?} is not HH:MM (UTC)"));
                }
            }
            if summary
                .review
                .as_deref()
                .is_some_and(|r| r.is_empty() || r.chars().any(char::is_control))
            {
                bad("review must be one line of text".into());
            }
        }
        out
    }

    /// One row per destination, for `nightshift destinations`: nothing in
    /// it is a credential.
    /// Every credential file the destinations name, checked as the
    /// executor will read it (exists, readable, a regular file, the
    /// supervisor's own, mode `0600` or tighter, one line of text; a key
    /// file, at most 16 KiB): one problem each, naming the destination, the
    /// field and the file, never its content. Empty when all are usable.
    pub fn secret_problems(&self) -> Vec<String> {
        use crate::secret::Secret;
        let mut files: Vec<(String, &'static str, &Path, bool)> = Vec::new();
        for (alias, r) in &self.remotes {
            let at = format!("remotes.{alias}");
            for (field, f) in [
                ("password_file", &r.password_file),
                ("token_file", &r.token_file),
            ] {
                if let Some(f) = f {
                    files.push((at.clone(), field, f, false));
                }
            }
            if let Some(f) = &r.ssh_key_file {
                files.push((at.clone(), "ssh_key_file", f, true));
            }
        }
        for (alias, f) in &self.forges {
            files.push((
                format!("forges.{alias}"),
                "token_file",
                &f.token_file,
                false,
            ));
        }
        for (alias, n) in &self.notify {
            let at = format!("notify.{alias}");
            for (field, f) in [
                ("url_file", &n.url_file),
                ("token_file", &n.token_file),
                ("secret_file", &n.secret_file),
            ] {
                if let Some(f) = f {
                    files.push((at.clone(), field, f, false));
                }
            }
        }
        let mut problems = Vec::new();
        for (at, field, path, key) in files {
            let read = match key {
                true => Secret::read_key_file(path),
                false => Secret::read_file(path),
            };
            if let Err(e) = read {
                let mut text = e.to_string();
                if let Some(source) = std::error::Error::source(&e) {
                    text.push_str(&format!(": {source}"));
                }
                problems.push(format!("{at}: {field} {}: {text}", path.display()));
            }
        }
        problems
    }

    pub fn listing(&self) -> Vec<Listed> {
        let mut out = Vec::new();
        for (alias, r) in &self.remotes {
            out.push(Listed {
                alias: alias.clone(),
                table: "remotes",
                kind: r.location().map(|l| l.kind()).unwrap_or("invalid").into(),
                url: r.url.clone(),
                readers: r.readers,
            });
        }
        for (alias, f) in &self.forges {
            out.push(Listed {
                alias: alias.clone(),
                table: "forges",
                kind: f.kind.name().into(),
                url: format!("{} ({})", f.api, f.repo),
                readers: f.readers,
            });
        }
        for (alias, n) in &self.notify {
            out.push(Listed {
                alias: alias.clone(),
                table: "notify",
                kind: n.kind.name().into(),
                url: n.shown(),
                readers: n.readers,
            });
        }
        out
    }
}

/// One destination as `nightshift destinations` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listed {
    pub alias: String,
    /// `remotes`, `forges` or `notify`.
    pub table: &'static str,
    /// `https`, `ssh`, `github`, `webhook`, ...
    pub kind: String,
    /// The URL (never holding a credential: the check refuses those).
    pub url: String,
    pub readers: Readers,
}

/// `HH:MM` as minutes after midnight.
pub fn parse_hhmm(at: &str) -> Option<u32> {
    let (h, m) = at.split_once(':')?;
    if h.len() != 2 || m.len() != 2 {
        return None;
    }
    let (h, m): (u32, u32) = (h.parse().ok()?, m.parse().ok()?);
    (h < 24 && m < 60).then_some(h * 60 + m)
}

/// The line of `[table.alias]` in the text, if it is written as a header.
fn table_line(text: &str, table: &str, alias: &str) -> Option<usize> {
    let want = if alias.is_empty() {
        format!("[{table}]")
    } else {
        format!("[{table}.{alias}]")
    };
    text.lines()
        .position(|line| {
            let line = line.split('#').next().unwrap_or_default();
            let norm: String = line
                .chars()
                .filter(|c| !c.is_whitespace() && *c != '"' && *c != '\'')
                .collect();
            norm == want
        })
        .map(|i| i + 1)
}

/// Refuses a credential on a plain `http://` URL that is not loopback,
/// unless `insecure`.
fn check_clear(url: &str, credential: bool, insecure: bool) -> Result<(), &'static str> {
    if credential && url.starts_with("http://") && !is_loopback(url_host(url)) && !insecure {
        return Err("a credential on a plain http:// URL that is not loopback would travel in clear: use https://, or write insecure = true to accept that");
    }
    Ok(())
}

/// Whether a credential goes over plain `http://` to a host that is not
/// loopback (allowed only with `insecure`; every use warns).
pub(crate) fn warn_if_clear(url: &str, what: &str) {
    if url.starts_with("http://") && !is_loopback(url_host(url)) {
        tracing::warn!(
            destination = what,
            "insecure = true: a credential is sent in clear over plain http"
        );
    }
}

fn alias_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

fn check_alias(alias: &str) -> Result<(), &'static str> {
    if alias.is_empty() || !alias.bytes().all(alias_byte) {
        return Err("an alias is one or more of A-Z a-z 0-9 . _ -");
    }
    Ok(())
}

fn plain_username(u: &str) -> bool {
    !u.is_empty() && !u.contains(':') && !u.chars().any(|c| c.is_control() || c.is_whitespace())
}

fn check_timeout(secs: Option<u64>) -> Result<(), &'static str> {
    match secs {
        Some(0) => Err("timeout_secs must be at least 1"),
        Some(s) if s > 3600 => Err("timeout_secs must be at most 3600"),
        _ => Ok(()),
    }
}

/// Checks a git remote's URL (see [`Location::parse`]).
pub(crate) fn check_remote_url(url: &str) -> Result<(), &'static str> {
    Location::parse(url).map(|_| ())
}

/// Checks that a URL is `http(s)://host[:port][/path]` with no user
/// information, no whitespace and no control character.
pub(crate) fn check_url(url: &str) -> Result<(), &'static str> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or("must start with http:// or https://")?;
    if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err("must not contain whitespace or control characters");
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.is_empty() {
        return Err("has no host");
    }
    if authority.contains('@') {
        return Err("must not carry user information; use username and a credential file");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../destinations.example.toml");

    #[test]
    fn the_example_parses() {
        let d = Destinations::parse(EXAMPLE, "destinations.example.toml").unwrap();
        let origin = &d.remotes["origin"];
        assert_eq!(origin.readers, Readers::Private);
        let cred = origin.credential().unwrap();
        assert_eq!(cred.username, "nightshift");
        assert_eq!(d.forges["github"].repo, "owner/name");
        assert_eq!(d.notify["team-room"].readers, Readers::Private);
        assert_eq!(
            d.remotes["mirror"].credential().unwrap().username,
            TOKEN_USERNAME
        );
        assert!(d.notify["public-log"].token_file.is_none());
    }

    #[test]
    fn unknown_fields_are_refused_with_their_line() {
        let text =
            "[remotes.origin]\nurl = \"http://h/r.git\"\nreaders = \"public\"\npassword = \"x\"\n";
        let err = Destinations::parse(text, "d.toml").unwrap_err();
        let chain = format!("{err}: {}", std::error::Error::source(&err).unwrap());
        assert!(chain.contains("d.toml"), "{chain}");
        assert!(chain.contains("line 4"), "{chain}");
        assert!(chain.contains("password"), "{chain}");
    }

    #[test]
    fn bad_values_are_refused() {
        let cases = [
            ("[remotes.o]\nurl = \"http://u:p@h/r.git\"\nreaders = \"public\"\n", "user information"),
            ("[remotes.o]\nurl = \"ftp://h/r.git\"\nreaders = \"public\"\n", "http://"),
            ("[remotes.o]\nurl = \"file://r.git\"\nreaders = \"public\"\n", "absolute path"),
            ("[remotes.o]\nurl = \"file:///srv/../etc\"\nreaders = \"public\"\n", "absolute path"),
            ("[notify.n]\nurl = \"file:///tmp/x\"\nreaders = \"public\"\n", "http://"),
            ("[remotes.o]\nurl = \"http://h/r\"\nreaders = \"public\"\npassword_file = \"/p\"\n", "needs a username"),
            ("[remotes.o]\nurl = \"http://h/r\"\nreaders = \"public\"\nusername = \"u\"\npassword_file = \"/p\"\ntoken_file = \"/t\"\n", "exclusive"),
            ("[remotes.\"a b\"]\nurl = \"http://h/r\"\nreaders = \"public\"\n", "alias"),
            ("[remotes.o]\nurl = \"http://h/r\"\nreaders = \"public\"\n[forges.f]\napi = \"http://h\"\nrepo = \"justname\"\nremote = \"o\"\ntoken_file = \"/t\"\nreaders = \"public\"\n", "owner/name"),
            ("[forges.f]\napi = \"http://h\"\nrepo = \"o/n\"\nremote = \"nowhere\"\ntoken_file = \"/t\"\nreaders = \"public\"\n", "not a configured [remotes] alias"),
            ("[notify.n]\nurl = \"http://h/x\"\nreaders = \"public\"\ntimeout_secs = 0\n", "timeout_secs"),
        ];
        for (text, expect) in cases {
            let err = Destinations::parse(text, "d.toml").unwrap_err().to_string();
            assert!(err.contains(expect), "{text}: {err}");
        }
        // An owner-named local repository is a valid remote.
        assert!(Destinations::parse(
            "[remotes.o]\nurl = \"file:///srv/r.git\"\nreaders = \"private\"\n",
            "d.toml"
        )
        .is_ok());
        let readers = "[notify.n]\nurl = \"http://h/x\"\nreaders = \"everyone\"\n";
        assert!(matches!(
            Destinations::parse(readers, "d.toml"),
            Err(ConfigError::Parse { .. })
        ));
    }

    #[test]
    fn a_credential_on_plain_http_beyond_loopback_is_refused_unless_insecure() {
        let remote = |url: &str, extra: &str| {
            format!(
                "[remotes.o]\nurl = \"{url}\"\nreaders = \"public\"\ntoken_file = \"/t\"\n{extra}"
            )
        };
        let err = Destinations::parse(&remote("http://git.example.com/r.git", ""), "d.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("travel in clear") && err.contains("[remotes.o]"),
            "{err}"
        );
        assert!(err.contains("line 1"), "{err}");
        for ok in [
            remote("http://127.0.0.1:8080/r.git", ""),
            remote("http://localhost/r.git", ""),
            remote("http://[::1]:9/r.git", ""),
            remote("https://git.example.com/r.git", ""),
            remote("http://git.example.com/r.git", "insecure = true\n"),
            // No credential: nothing travels in clear.
            "[remotes.o]\nurl = \"http://git.example.com/r.git\"\nreaders = \"public\"\n".into(),
        ] {
            assert!(Destinations::parse(&ok, "d.toml").is_ok(), "{ok}");
        }
        let forge = "[remotes.o]\nurl = \"https://h/r\"\nreaders = \"public\"\n\
                     [forges.f]\napi = \"http://api.example.com\"\nrepo = \"o/n\"\nremote = \"o\"\ntoken_file = \"/t\"\nreaders = \"public\"\n";
        let err = Destinations::parse(forge, "d.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("[forges.f]: api") && err.contains("line 4"),
            "{err}"
        );
        let hook = "[notify.n]\nkind = \"webhook\"\nurl = \"http://hooks.example.com/x\"\nreaders = \"public\"\nsecret_file = \"/s\"\n";
        let err = Destinations::parse(hook, "d.toml").unwrap_err().to_string();
        assert!(err.contains("travel in clear"), "{err}");
    }

    #[test]
    fn ssh_remotes_need_known_hosts_and_one_way_to_authenticate() {
        let ssh = |url: &str, extra: &str| {
            format!("[remotes.s]\nurl = \"{url}\"\nreaders = \"private\"\n{extra}")
        };
        let good = "ssh_key_file = \"/k\"\nknown_hosts = \"/kh\"\n";
        for url in [
            "git@github.com:owner/name.git",
            "ssh://git@127.0.0.1:2222/srv/r.git",
            "ssh://host/r.git",
            "host.example:r.git",
        ] {
            let d = Destinations::parse(&ssh(url, good), "d.toml").unwrap();
            assert_eq!(d.remotes["s"].location().unwrap().kind(), "ssh", "{url}");
        }
        assert_eq!(
            Location::parse("ssh://git@127.0.0.1:2222/srv/r.git").unwrap(),
            Location::Ssh {
                user: Some("git".into()),
                host: "127.0.0.1".into(),
                port: 2222
            }
        );
        let cases = [
            (ssh("git@h:r.git", "ssh_key_file = \"/k\"\n"), "known_hosts"),
            (ssh("git@h:r.git", "known_hosts = \"/kh\"\n"), "ssh_agent"),
            (
                ssh(
                    "git@h:r.git",
                    "ssh_agent = true\nssh_key_file = \"/k\"\nknown_hosts = \"/kh\"\n",
                ),
                "exclusive",
            ),
            (
                ssh(
                    "git@h:r.git",
                    "token_file = \"/t\"\nssh_agent = true\nknown_hosts = \"/kh\"\n",
                ),
                "not password_file",
            ),
            (ssh("-oProxyCommand=x:r.git", good), "never start with -"),
            (ssh("ssh://h:x/r", good), "port"),
            (
                ssh("https://h/r", "known_hosts = \"/kh\"\n"),
                "for ssh remotes",
            ),
        ];
        for (text, expect) in cases {
            let err = Destinations::parse(&text, "d.toml")
                .unwrap_err()
                .to_string();
            assert!(err.contains(expect), "{text}: {err}");
        }
    }

    #[test]
    fn every_problem_is_reported_with_its_file_line_and_alias() {
        let text = "# owner's destinations\n\
                    [remotes.good]\nurl = \"https://h/r\"\nreaders = \"public\"\n\n\
                    [remotes.bad]\nurl = \"ftp://h/r\"\nreaders = \"public\"\n\n\
                    [notify.\"hook\"]\nkind = \"webhook\"\nurl = \"https://h/x\"\nreaders = \"public\"\n\n\
                    [summary]\nnotify = \"nowhere\"\nat = \"25:00\"\n";
        let err = Destinations::parse(text, "/etc/d.toml").unwrap_err();
        let ConfigError::Invalid { origin, problems } = &err else {
            panic!("{err}");
        };
        assert_eq!(origin, "/etc/d.toml");
        let shown: Vec<String> = problems.iter().map(Problem::to_string).collect();
        assert_eq!(problems.len(), 4, "{shown:?}");
        assert!(
            shown[0].starts_with("line 6: [remotes.bad]: url"),
            "{shown:?}"
        );
        assert!(
            shown[1].starts_with("line 10: [notify.hook]: a webhook needs secret_file"),
            "{shown:?}"
        );
        assert!(
            shown[2].starts_with("line 15: [summary]: notify"),
            "{shown:?}"
        );
        assert!(shown[3].contains("HH:MM"), "{shown:?}");
        assert!(err.to_string().contains("/etc/d.toml"));
    }

    #[test]
    fn the_listing_shows_kinds_and_urls_without_credentials() {
        let d = Destinations::parse(EXAMPLE, "destinations.example.toml").unwrap();
        let listed = d.listing();
        let shown = serde_json::to_string(&listed).unwrap();
        assert!(!shown.contains("token"), "{shown}");
        let origin = listed.iter().find(|l| l.alias == "origin").unwrap();
        assert_eq!(origin.table, "remotes");
        assert!(listed.iter().any(|l| l.kind == "ssh"), "{shown}");
        assert!(listed.iter().any(|l| l.kind == "gitlab"), "{shown}");
    }
}
