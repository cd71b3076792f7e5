//! The JSON API's OpenAPI description, generated from the command API's
//! own types ([`Command`], [`Reply`], [`ApiError`]) with utoipa, so that it
//! cannot say anything the types do not. It is served at
//! `/api/v1/openapi.json` (behind the dashboard's login, and on the owner's
//! socket) and checked in as `docs/openapi.json`; a test fails when that
//! file is not what the types generate (`UPDATE_OPENAPI=1` rewrites it).
//!
//! Versioning: the path's `v1` is kept through additions (an optional
//! field, a command or a reply) and changes for a change that would break a
//! client of v1 (a field or variant removed or renamed, a meaning changed).
//! That is a rule for whoever changes the types; what a test holds is that
//! the checked-in description is what they generate
//! (`tests::the_checked_in_description_is_what_the_types_generate`).

use utoipa::OpenApi;

use super::Answer;
use super::{ApiError, Command, Reply};

/// Carry out one command of the supervisor's API. On the owner's socket
/// (`STATE/serve.sock`) only: a command line of the state's owner.
#[utoipa::path(
    post,
    path = "/api/v1/command",
    request_body = Command,
    responses(
        (status = 200, description = "Executed: `reply` holds the reply", body = Answer),
        (status = "4XX", description = "The request was wrong: `error` says how (its `kind` decides the status)", body = Answer),
        (status = "5XX", description = "The supervisor could not do it: `error` says why", body = Answer),
    )
)]
#[allow(dead_code)]
fn command() {}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "nightshift supervisor API",
        description = "One command API for every front end: the command line, over the owner's socket, and the dashboard (docs/api-http.md).",
        version = "1"
    ),
    paths(command),
    components(schemas(Command, Reply, ApiError, Answer))
)]
struct Doc;

/// The description, as JSON text (pretty, ending in a newline).
pub fn openapi_json() -> String {
    let mut text = Doc::openapi()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_checked_in_description_is_what_the_types_generate() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
        let generated = super::openapi_json();
        if std::env::var_os("UPDATE_OPENAPI").is_some() {
            std::fs::write(path, &generated).unwrap();
        }
        let checked_in = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            checked_in == generated,
            "docs/openapi.json is not what the API's types generate: run `UPDATE_OPENAPI=1 cargo test -p nightshift-supervisor --lib openapi` and commit it"
        );
        // It describes the commands and the replies, by their tags.
        let doc: serde_json::Value = serde_json::from_str(&generated).unwrap();
        let schemas = &doc["components"]["schemas"];
        let text = schemas["Command"].to_string();
        assert!(
            text.contains("\"approve\"") && text.contains("\"kill\""),
            "{text}"
        );
        assert!(schemas["Reply"].to_string().contains("\"decisions\""));
    }
}
