//! Routing (pure): which configured endpoint a request from the sandbox goes
//! to, or why it goes nowhere.
//!
//! Invariants:
//! - Only `POST` to one of the three shapes' paths is forwarded; the shape
//!   fixes the API family, and the request's `model` must match one of the
//!   globs of an endpoint of that family. The first such endpoint (in alias
//!   order) is the route. Anything else is a [`Refusal`] whose text the
//!   agent reads (it names what it asked for and what is configured, never a
//!   key or a host path) (`tests::other_paths_methods_and_bodies_are_refused_readably`,
//!   `tests::a_route_always_matches_family_and_glob`,
//!   `tests/tests/gateway.rs::unconfigured_paths_methods_and_models_are_refused_readably`).
//! - The agent never names a host: the upstream URL is the endpoint's
//!   `base_url` joined with the shape's fixed path ([`upstream_path`]), so a
//!   request cannot reach any other host or path
//!   (`tests::each_shape_goes_to_its_family_and_model`,
//!   `tests/tests/gateway.rs::every_way_out_through_the_gateway_is_refused_and_nothing_reaches_the_endpoint`).

use super::models::{glob_match, Api, Endpoint, Models};

/// The request shapes the gateway serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// OpenAI Chat Completions, `/v1/chat/completions`.
    Chat,
    /// OpenAI Responses, `/v1/responses`.
    Responses,
    /// Anthropic Messages, `/v1/messages`.
    Messages,
}

impl Shape {
    pub fn path(self) -> &'static str {
        match self {
            Shape::Chat => "/v1/chat/completions",
            Shape::Responses => "/v1/responses",
            Shape::Messages => "/v1/messages",
        }
    }

    pub fn api(self) -> Api {
        match self {
            Shape::Chat | Shape::Responses => Api::Openai,
            Shape::Messages => Api::Anthropic,
        }
    }

    pub fn from_path(path: &str) -> Option<Shape> {
        [Shape::Chat, Shape::Responses, Shape::Messages]
            .into_iter()
            .find(|s| s.path() == path)
    }
}

/// Why a request is not forwarded: an HTTP status and a text for the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    /// A short kind for the audit (`path`, `method`, `model`, ...).
    pub kind: &'static str,
    pub message: String,
}

impl Refusal {
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            kind,
            message: message.into(),
        }
    }
}

/// The shape of a request from its method and path (without the query).
pub fn shape(method: &str, path: &str) -> Result<Shape, Refusal> {
    let Some(shape) = Shape::from_path(path) else {
        return Err(Refusal::new(
            404,
            "path",
            format!(
                "nightshift's model gateway serves only POST /v1/chat/completions, /v1/responses and /v1/messages; {} is not served",
                printable(path)
            ),
        ));
    };
    if method != "POST" {
        return Err(Refusal::new(
            405,
            "method",
            format!(
                "nightshift's model gateway serves {} with POST only, not {}",
                shape.path(),
                printable(method)
            ),
        ));
    }
    Ok(shape)
}

/// The endpoint for a request of `shape` for `model`.
pub fn route<'m>(models: &'m Models, shape: Shape, model: &str) -> Result<&'m Endpoint, Refusal> {
    let family: Vec<&Endpoint> = models
        .endpoints
        .iter()
        .filter(|e| e.api == shape.api())
        .collect();
    if let Some(e) = family
        .iter()
        .find(|e| e.models.iter().any(|g| glob_match(g, model)))
    {
        return Ok(e);
    }
    let offered: Vec<&str> = family
        .iter()
        .flat_map(|e| e.models.iter().map(String::as_str))
        .collect();
    Err(Refusal::new(
        403,
        "model",
        if offered.is_empty() {
            format!(
                "nightshift's model gateway has no {} endpoint configured; {} is not served",
                shape.api().name(),
                shape.path()
            )
        } else {
            format!(
                "model {} is not configured for {}; the models served are: {}",
                printable(model),
                shape.path(),
                offered.join(", ")
            )
        },
    ))
}

/// The path on the endpoint: its base path, then the shape's path (a base
/// that already ends in `/v1` takes the rest after `/v1`).
pub fn upstream_path(endpoint: &Endpoint, shape: Shape) -> String {
    let base = &endpoint.base_url.path;
    match base.strip_suffix("/v1") {
        Some(_) => format!("{base}{}", &shape.path()["/v1".len()..]),
        None => format!("{base}{}", shape.path()),
    }
}

/// At most 200 characters of agent text, controls escaped, for a refusal.
fn printable(text: &str) -> String {
    let cut: String = text.chars().take(200).collect();
    format!("{:?}", cut)
}

/// Refusals in a row after which a run is ended: its agent cannot get
/// past them by retrying (the model is not configured, the key cannot be
/// used), and would otherwise spend the night until its timeout.
pub const HOPELESS_AFTER: u32 = 5;

/// The refusals only the owner can fix: an unconfigured model, an
/// unusable key.
pub fn hopeless(kind: &str) -> bool {
    matches!(kind, "model" | "key")
}

/// Counts a run's calls refused in a row for a reason only the owner can
/// fix (pure; `serve` feeds it each call's end).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RefusedInARow {
    count: u32,
}

impl RefusedInARow {
    /// One call ended, refused with `refusal` or forwarded (`None`).
    /// `Some(reason)` when the run is to end: [`HOPELESS_AFTER`] hopeless
    /// refusals in a row; the reason names the last one and the fix.
    pub fn note(&mut self, refusal: Option<&Refusal>) -> Option<String> {
        match refusal {
            Some(r) if hopeless(r.kind) => {
                self.count += 1;
                (self.count == HOPELESS_AFTER).then(|| {
                    format!(
                        "model calls refused {HOPELESS_AFTER} times in a row, none forwarded (last: {}); \
                         the owner must fix STATE/models.toml or its key file (docs/models.md)",
                        r.message
                    )
                })
            }
            // A refusal the agent can get past (a bad body, a full budget
            // for a moment) neither counts nor clears the row.
            Some(_) => None,
            None => {
                self.count = 0;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::Models;
    use proptest::prelude::*;
    use std::path::Path;

    fn models() -> Models {
        Models::parse(
            Path::new("m.toml"),
            "[endpoints.a]\napi = \"anthropic\"\nbase_url = \"https://api.anthropic.com\"\nkey_file = \"/k\"\nmodels = [\"claude-*\"]\n\
             [endpoints.o]\napi = \"openai\"\nbase_url = \"https://api.openai.com/v1\"\nkey_file = \"/k\"\nmodels = [\"gpt-5*\"]\n",
        )
        .unwrap()
    }

    #[test]
    fn each_shape_goes_to_its_family_and_model() {
        let m = models();
        let s = shape("POST", "/v1/messages").unwrap();
        assert_eq!(route(&m, s, "claude-x").unwrap().alias, "a");
        let s = shape("POST", "/v1/responses").unwrap();
        let e = route(&m, s, "gpt-5-codex").unwrap();
        assert_eq!(e.alias, "o");
        assert_eq!(upstream_path(e, s), "/v1/responses");
        assert_eq!(
            upstream_path(
                m.endpoints.iter().find(|e| e.alias == "a").unwrap(),
                Shape::Messages
            ),
            "/v1/messages"
        );
        // A Claude model asked for through an OpenAI shape is refused.
        let s = shape("POST", "/v1/chat/completions").unwrap();
        let r = route(&m, s, "claude-x").unwrap_err();
        assert_eq!((r.status, r.kind), (403, "model"));
        assert!(r.message.contains("gpt-5*"), "{}", r.message);
    }

    #[test]
    fn other_paths_methods_and_bodies_are_refused_readably() {
        let m = models();
        assert_eq!(shape("POST", "/v1/embeddings").unwrap_err().status, 404);
        assert_eq!(shape("GET", "/v1/messages").unwrap_err().status, 405);
        assert_eq!(shape("POST", "/v1/messages/../x").unwrap_err().status, 404);
        let r = route(&m, Shape::Messages, "x\u{1b}[2J").unwrap_err();
        assert!(!r.message.contains('\u{1b}'), "{}", r.message);
    }

    proptest! {
        /// Whatever the agent sends, a route is a configured endpoint of the
        /// shape's family whose globs match the model it named.
        #[test]
        fn a_route_always_matches_family_and_glob(path in "/v1/[a-z/.]{0,20}", model in "[a-z0-9.-]{0,12}") {
            let m = models();
            if let Ok(s) = shape("POST", &path) {
                if let Ok(e) = route(&m, s, &model) {
                    prop_assert_eq!(e.api, s.api());
                    prop_assert!(e.models.iter().any(|g| glob_match(g, &model)));
                }
            }
        }
    }

    #[test]
    fn a_run_ends_after_refusals_in_a_row_only_the_owner_can_fix() {
        let model = Refusal::new(403, "model", "model \"gpt-4.1\" is not configured");
        let key = Refusal::new(502, "key", "the supervisor cannot use endpoint o's key");
        let body = Refusal::new(400, "request_body", "bad");
        let mut row = RefusedInARow::default();
        for _ in 1..HOPELESS_AFTER {
            assert_eq!(row.note(Some(&model)), None);
            assert_eq!(row.note(Some(&body)), None);
        }
        // A forwarded call clears the row.
        assert_eq!(row.note(None), None);
        for _ in 1..HOPELESS_AFTER {
            assert_eq!(row.note(Some(&key)), None);
        }
        let reason = row.note(Some(&model)).expect("the run ends");
        assert!(
            reason.contains("refused 5 times in a row")
                && reason.contains("gpt-4.1")
                && reason.contains("docs/models.md"),
            "{reason}"
        );
        // Told once.
        assert_eq!(row.note(Some(&model)), None);
    }
}
