//! The gateway's request parser (`orchestrator/gateway/src/request.rs`,
//! `check` and `model`): the typed allowlist a request body from the
//! sandbox must pass, per API shape, before anything is forwarded.
//!
//! Input: byte 0 picks the shape (Chat, Responses, Messages) and the
//! owner's allowance (server tools enabled or not, private content or
//! not, most choices 1 to 4); the rest is the body. Checked, beyond "no
//! panic": a body that passes forwards a JSON object whose model is the
//! one checked, whose output bound is the clamped one and (for a chat
//! stream) that forces the usage chunk; what is forwarded passes the same
//! check again with the same model, stream, choices and images (the
//! endpoint reads what the gateway checked); `model` agrees with `check`;
//! a refusal's text is bounded and names where.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use nightshift_gateway::request::{check, model, Allow};
use nightshift_gateway::route::Shape;
use serde_json::Value;

const MAX_OUTPUT: u64 = 4096;

fuzz_target!(|data: &[u8]| {
    let [how, body @ ..] = data else {
        return;
    };
    let shape = [Shape::Chat, Shape::Responses, Shape::Messages][usize::from(how % 3)];
    let tools = [
        "web_search".to_string(),
        "web_fetch".to_string(),
        "code_execution".to_string(),
    ];
    let allow = Allow {
        server_tools: if how & 0x04 != 0 { &tools } else { &[] },
        private: how & 0x08 == 0,
        max_choices: 1 + u64::from((how >> 4) & 0x03),
    };
    let checked = match check(shape, body, &allow) {
        Ok(c) => c,
        Err(denied) => {
            let refusal = denied.refusal();
            assert!(refusal.status == 400 || refusal.status == 403);
            assert!(refusal
                .message
                .starts_with("refused by nightshift's model gateway: "));
            return;
        }
    };
    assert_eq!(model(body).as_deref(), Ok(checked.model.as_str()));
    assert!(checked.choices >= 1 && checked.choices <= allow.max_choices);
    let _ = checked.input_bound(body.len());

    let whole = Bytes::copy_from_slice(body);
    let forwarded: Vec<u8> = checked
        .forwarded(&whole, MAX_OUTPUT)
        .iter()
        .flat_map(|b| b.iter().copied())
        .collect();
    let v: Value = serde_json::from_slice(&forwarded).unwrap_or_else(|e| {
        panic!(
            "the forwarded body is not JSON ({e}): {}",
            String::from_utf8_lossy(&forwarded)
        )
    });
    let obj = v.as_object().expect("the forwarded body is an object");
    assert_eq!(
        obj.get("model").and_then(Value::as_str),
        Some(checked.model.as_str())
    );
    let bound = match shape {
        Shape::Messages => "max_tokens",
        Shape::Responses => "max_output_tokens",
        Shape::Chat => {
            if obj.contains_key("max_tokens") {
                "max_tokens"
            } else {
                "max_completion_tokens"
            }
        }
    };
    assert_eq!(obj.get(bound).and_then(Value::as_u64), Some(MAX_OUTPUT));
    if shape == Shape::Chat && checked.stream {
        assert_eq!(obj["stream_options"]["include_usage"], Value::Bool(true));
    }

    let again = check(shape, &forwarded, &allow).unwrap_or_else(|d| {
        panic!(
            "what the gateway forwards does not pass its own check ({}: {}): {}",
            d.path,
            d.message,
            String::from_utf8_lossy(&forwarded)
        )
    });
    assert_eq!(again.model, checked.model);
    assert_eq!(again.stream, checked.stream);
    assert_eq!(again.choices, checked.choices);
    assert_eq!(again.images, checked.images);
    assert_eq!(again.output_bound, Some(MAX_OUTPUT));
});
