use super::*;
use serde_json::json;

#[test]
fn unknown_and_unsupported_fields_are_named() {
    let e = check(&json!({"model": "m", "bogus": 1}), &OPENAI_CHAT, "").unwrap_err();
    assert_eq!(
        e,
        FieldError::Unknown {
            field: "bogus".into(),
            api: OPENAI_CHAT.api
        }
    );
    let e = check(&json!({"logit_bias": {"42": 5}}), &OPENAI_CHAT, "").unwrap_err();
    assert!(matches!(e, FieldError::Unsupported { .. }));
    assert_eq!(e.field(), "logit_bias");
    let e = check(&json!({"mirostat": 2}), &OLLAMA_OPTIONS, "options.").unwrap_err();
    assert_eq!(e.field(), "options.mirostat");
    assert!(e.to_string().contains("mirostat"), "{e}");
}

#[test]
fn neutral_values_and_inert_fields_pass() {
    let body = json!({
        "model": "m", "messages": [], "logit_bias": {}, "logprobs": false,
        "response_format": {"type": "text"}, "tools": [], "tool_choice": "none",
        "user": "u", "metadata": {"a": "b"}, "stream_options": {"include_usage": true},
        "parallel_tool_calls": true, "n": 1, "modalities": ["text"], "audio": null,
    });
    check(&body, &OPENAI_CHAT, "").unwrap();
    let opts = json!({"num_ctx": 2048, "num_thread": 2, "typical_p": 1.0, "mirostat": 0});
    check(&opts, &OLLAMA_OPTIONS, "options.").unwrap();
    check(
        &json!({"keep_alive": "5m", "tools": [], "think": false}),
        &OLLAMA_CHAT,
        "",
    )
    .unwrap();
}

#[test]
fn what_routers_and_benchmarks_send_passes() {
    // vllm-router's rewrite of every chat request.
    let router = json!({
        "model": "m", "messages": [], "logprobs": false, "no_stop_trim": false,
        "ignore_eos": false, "continue_final_message": false,
        "skip_special_tokens": true, "separate_reasoning": true,
        "stream_reasoning": true, "return_hidden_states": false,
        "include_reasoning": true,
    });
    check(&router, &OPENAI_CHAT, "").unwrap();
    // guidellm's.
    let guidellm = json!({
        "model": "m", "messages": [], "stream": true, "ignore_eos": true,
        "max_completion_tokens": 64,
        "stream_options": {"include_usage": true, "continuous_usage_stats": true},
    });
    check(&guidellm, &OPENAI_CHAT, "").unwrap();
    check(
        &guidellm["stream_options"],
        &STREAM_OPTIONS,
        "stream_options.",
    )
    .unwrap();
    let neutral = json!({
        "prompt": "x", "add_special_tokens": true, "min_tokens": 0, "top_k": -1,
        "spaces_between_special_tokens": true, "use_beam_search": false,
        "request_id": "r1", "priority": 0, "bad_words": [], "guided_json": null,
    });
    check(&neutral, &OPENAI_COMPLETIONS, "").unwrap();
    // Non-neutral values are refused by name.
    for (body, field) in [
        (
            json!({"add_generation_prompt": false}),
            "add_generation_prompt",
        ),
        (
            json!({"continue_final_message": true}),
            "continue_final_message",
        ),
        (json!({"guided_json": {"type": "object"}}), "guided_json"),
        (json!({"use_beam_search": true}), "use_beam_search"),
        (json!({"priority": 3}), "priority"),
    ] {
        assert_eq!(check(&body, &OPENAI_CHAT, "").unwrap_err().field(), field);
    }
    let e = check(&json!({"bogus": 1}), &STREAM_OPTIONS, "stream_options.").unwrap_err();
    assert_eq!(e.field(), "stream_options.bogus");
    // Chat's extensions are not completions'.
    let e = check(
        &json!({"continue_final_message": false}),
        &OPENAI_COMPLETIONS,
        "",
    );
    assert!(matches!(e, Err(FieldError::Unknown { .. })));
}

#[test]
fn every_table_names_a_field_once() {
    for t in [
        &OPENAI_CHAT,
        &OPENAI_MESSAGE,
        &OPENAI_COMPLETIONS,
        &OPENAI_RESPONSES,
        &STREAM_OPTIONS,
        &OLLAMA_GENERATE,
        &OLLAMA_CHAT,
        &OLLAMA_MESSAGE,
        &OLLAMA_OPTIONS,
    ] {
        let mut all: Vec<_> = t.all().map(|(n, _)| n).collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "{}", t.api);
    }
}

#[test]
fn the_serving_doc_lists_the_inert_fields() {
    let doc = include_str!("../../../../docs/serving.md");
    for t in [
        &OPENAI_CHAT,
        &OPENAI_COMPLETIONS,
        &OPENAI_RESPONSES,
        &OLLAMA_GENERATE,
        &OLLAMA_OPTIONS,
    ] {
        for (f, _) in t.all().filter(|(_, r)| matches!(r, Rule::Inert)) {
            assert!(
                doc.contains(&format!("`{f}`")),
                "docs/serving.md misses {f}"
            );
        }
    }
}

/// What a route's request structs make of a body, as text: a field
/// they read changes it, a field they ignore does not.
type Reader = fn(&Value) -> String;

fn parsed<T: serde::de::DeserializeOwned + std::fmt::Debug>(v: &Value) -> String {
    format!(
        "{:?}",
        serde_json::from_value::<T>(v.clone()).map_err(|e| e.to_string())
    )
}

/// Each table with the structs (and hand readers) its route parses a
/// body with, and the smallest body they accept.
fn readers() -> Vec<(&'static Table, Reader, Value)> {
    use super::super::{ollama, openai, responses};
    use crate::request::RequestOptions as Common;
    vec![
        (
            &OPENAI_CHAT,
            |v| {
                parsed::<openai::ChatBody>(v)
                    + &parsed::<Common>(v)
                    + &format!("{:?}", openai::read_messages(v).map_err(|e| e.message))
            },
            json!({}),
        ),
        (
            &OPENAI_MESSAGE,
            parsed::<openai::OaMessage>,
            json!({"role": "user"}),
        ),
        (
            &OPENAI_COMPLETIONS,
            |v| parsed::<openai::CompletionBody>(v) + &parsed::<Common>(v),
            json!({}),
        ),
        (&STREAM_OPTIONS, parsed::<openai::StreamOptions>, json!({})),
        (
            &OPENAI_RESPONSES,
            |v| parsed::<responses::Body>(v) + &parsed::<Common>(v),
            json!({}),
        ),
        (&OLLAMA_GENERATE, parsed::<ollama::GenerateBody>, json!({})),
        (&OLLAMA_CHAT, parsed::<ollama::ChatBody>, json!({})),
        (
            &OLLAMA_MESSAGE,
            parsed::<ollama::ChatMsg>,
            json!({"role": "user"}),
        ),
        (
            &OLLAMA_OPTIONS,
            |v| parsed::<ollama::NumPredict>(v) + &parsed::<Common>(v),
            json!({}),
        ),
    ]
}

/// A table that calls a field used where no request struct reads it
/// would let a client's field be silently ignored: each used field,
/// set to one of a few distinctive values, must change what the route
/// parses (a value of the wrong type changes it too: the parse fails).
#[test]
fn every_used_field_is_read_by_its_route() {
    let values = [
        json!(7),
        json!(0.37),
        json!("zq7"),
        json!(true),
        json!([3]),
        json!([{"role": "user", "content": "zq7"}]),
        json!({"include_usage": true}),
    ];
    let with = |base: &Value, f: &str, v: &Value| {
        let mut b = base.clone();
        b[f] = v.clone();
        b
    };
    for (table, read, base) in readers() {
        let plain = read(&base);
        // The probe tells a read field from an ignored one.
        for v in &values {
            assert_eq!(read(&with(&base, "zq_unread", v)), plain, "{}", table.api);
        }
        for (f, rule) in table.all() {
            if !matches!(rule, Rule::Used) {
                continue;
            }
            assert!(
                values.iter().any(|v| read(&with(&base, f, v)) != plain),
                "{}: `{f}` is called used but no request struct reads it",
                table.api
            );
        }
    }
}

#[test]
fn a_reason_covers_all_its_fields() {
    for f in ["guided_json", "regex", "ebnf", "structured_outputs"] {
        let e = check(&json!({ f: {"type": "object"} }), &OPENAI_CHAT, "").unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "field `{f}` is not supported: specd's structured output is \
                 `response_format` (json_object or json_schema)"
            )
        );
    }
    for f in ["width", "height", "steps"] {
        let e = check(&json!({ f: 64 }), &OLLAMA_GENERATE, "").unwrap_err();
        assert!(
            e.to_string().ends_with("specd generates text, not images"),
            "{e}"
        );
        check(&json!({ f: null }), &OLLAMA_GENERATE, "").unwrap();
    }
}
