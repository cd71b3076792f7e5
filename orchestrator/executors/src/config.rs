//! The owner's destinations: where approved acts may land, and where the
//! credentials for each live.
//!
//! ```toml
//! [remotes.origin]
//! url = "http://127.0.0.1:8080/repo.git"
//! readers = "private"
//! username = "nightshift"
//! password_file = "/etc/nightshift/origin.password"   # or token_file
//!
//! [forges.github]
//! api = "http://127.0.0.1:8081"
//! repo = "owner/name"
//! remote = "origin"                                    # where its branches are pushed
//! token_file = "/etc/nightshift/github.token"
//! readers = "public"
//!
//! [notify.team-room]
//! url = "http://127.0.0.1:8082/hook"
//! readers = "private"
//! token_file = "/etc/nightshift/hook.token"           # optional
//! ```
//!
//! Invariants:
//! - These structs hold paths to credential files, never credentials: they
//!   may be printed and serialized. The files are read by the executors at
//!   the moment of use ([`crate::Secret`]).
//! - Every table refuses unknown fields; every URL is `http://` or
//!   `https://` with no user information in it (a credential never travels
//!   in a URL, and the username has its own field).
//! - Aliases are the only names an act may use; they are plain words
//!   (`[A-Za-z0-9._-]+`), so that an alias shown to a person is the alias.

use std::collections::BTreeMap;
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
}

/// Who may read what lands at a destination: the policy engine's one
/// [`policies::Readers`] type, so that the gate and the configuration never
/// disagree about it.
pub use policies::Readers;

/// A git remote reached over smart HTTP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {
    /// `http://` or `https://` URL of the repository, without credentials.
    pub url: String,
    /// Who may read the remote.
    pub readers: Readers,
    /// HTTP Basic username; required with `password_file`, defaults to
    /// `x-access-token` with `token_file`.
    #[serde(default)]
    pub username: Option<String>,
    /// File holding the password.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// File holding an access token, sent as the Basic password.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
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
    /// The credential to offer when the remote asks for one, if any.
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
}

/// A forge with a GitHub-shaped REST API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForgeConfig {
    /// Base URL of the API, e.g. `https://api.github.com`.
    pub api: String,
    /// `owner/name` of the repository pull requests are opened on.
    pub repo: String,
    /// The alias of the configured git remote that is this repository: a
    /// pull request's head branch is made to hold the approved commit there
    /// (fast-forward only, under a lease) before the request is sent.
    pub remote: String,
    /// File holding the API token (sent as `Authorization: Bearer`).
    pub token_file: PathBuf,
    /// Who may read the forge's repository.
    pub readers: Readers,
    /// Time limit of one call, in seconds (default 30).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

/// An HTTP endpoint that messages are posted to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyConfig {
    /// URL the message body is POSTed to.
    pub url: String,
    /// Who may read what is posted.
    pub readers: Readers,
    /// File holding a token sent as `Authorization: Bearer`, if the endpoint
    /// wants one.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Time limit of one call, in seconds (default 30).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
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
    #[error("checking destinations {origin}: [{table}.{alias}]: {why}")]
    Invalid {
        origin: String,
        table: &'static str,
        alias: String,
        why: String,
    },
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
        parsed.check(origin)?;
        Ok(parsed)
    }

    /// Checks what the types cannot: aliases, URLs, credential fields.
    pub fn check(&self, origin: &str) -> Result<(), ConfigError> {
        let invalid = |table: &'static str, alias: &str, why: String| ConfigError::Invalid {
            origin: origin.to_string(),
            table,
            alias: alias.to_string(),
            why,
        };
        for (alias, remote) in &self.remotes {
            check_alias(alias).map_err(|why| invalid("remotes", alias, why.into()))?;
            check_remote_url(&remote.url)
                .map_err(|why| invalid("remotes", alias, format!("url: {why}")))?;
            check_timeout(remote.timeout_secs)
                .map_err(|why| invalid("remotes", alias, why.into()))?;
            if remote.password_file.is_some() && remote.token_file.is_some() {
                return Err(invalid(
                    "remotes",
                    alias,
                    "password_file and token_file are exclusive".into(),
                ));
            }
            if remote.password_file.is_some() && remote.username.is_none() {
                return Err(invalid(
                    "remotes",
                    alias,
                    "password_file needs a username".into(),
                ));
            }
            if remote
                .username
                .as_deref()
                .is_some_and(|u| !plain_username(u))
            {
                return Err(invalid(
                    "remotes",
                    alias,
                    "username must be non-empty visible text without ':'".into(),
                ));
            }
        }
        for (alias, forge) in &self.forges {
            check_alias(alias).map_err(|why| invalid("forges", alias, why.into()))?;
            check_url(&forge.api).map_err(|why| invalid("forges", alias, format!("api: {why}")))?;
            check_timeout(forge.timeout_secs)
                .map_err(|why| invalid("forges", alias, why.into()))?;
            if !self.remotes.contains_key(&forge.remote) {
                return Err(invalid(
                    "forges",
                    alias,
                    format!(
                        "remote {:?} is not a configured [remotes] alias: a forge names the git remote that holds its branches",
                        forge.remote
                    ),
                ));
            }
            let parts: Vec<&str> = forge.repo.split('/').collect();
            let word = |p: &str| !p.is_empty() && p.bytes().all(alias_byte);
            if parts.len() != 2 || !parts.iter().all(|p| word(p)) {
                return Err(invalid(
                    "forges",
                    alias,
                    format!("repo {:?} is not owner/name", forge.repo),
                ));
            }
        }
        for (alias, endpoint) in &self.notify {
            check_alias(alias).map_err(|why| invalid("notify", alias, why.into()))?;
            check_url(&endpoint.url)
                .map_err(|why| invalid("notify", alias, format!("url: {why}")))?;
            check_timeout(endpoint.timeout_secs)
                .map_err(|why| invalid("notify", alias, why.into()))?;
        }
        Ok(())
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

/// Checks that a URL is `http(s)://host[:port][/path]` with no user
/// information, no whitespace and no control character.
/// A git remote may also be a local repository the owner named by
/// `file:///absolute/path` (the demo's destination); HTTP endpoints may not.
pub(crate) fn check_remote_url(url: &str) -> Result<(), &'static str> {
    match url.strip_prefix("file://") {
        Some(path) => {
            if !path.starts_with('/') || path.split('/').any(|c| c == "..") {
                return Err("a file:// remote must name an absolute path without ..");
            }
            if url.chars().any(|c| c.is_control()) {
                return Err("must not contain control characters");
            }
            Ok(())
        }
        None => check_url(url),
    }
}

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
}
