//! Tool calls and structured output over a socket, for what the client scripts of
//! `openai_clients.rs` do not reach: the Qwen3-Coder and Llama 3 call formats (a forced
//! call's grammar and the parser that reads it back must agree), calls the model writes
//! badly, and every refusal.

mod serve_harness;

use serde_json::{Value, json};
use serve_harness::Server;

/// Qwen3-Coder style: tools listed, calls as `<function=NAME>` blocks.
const CODER_TEMPLATE: &str = "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n' }}{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}{{- 'Call a function as <tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call><|im_end|>\\n' }}{%- endif %}{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// Llama 3.1 style: header turns, tools offered for JSON calls with "parameters".
const LLAMA_TEMPLATE: &str = "{%- if tools %}{{- '<|start_header_id|>system<|end_header_id|>\\n\\nEnvironment: ipython\\n' }}{%- for tool in tools %}{{- tool | tojson }}{%- endfor %}{{- 'Respond with {\"name\": function name, \"parameters\": dictionary of argument name and its value}.<|eot_id|>' }}{%- endif %}{%- for message in messages %}{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";

fn weather() -> Value {
    json!({ "type": "function", "function": { "name": "get_weather", "description": "Weather <now>", "parameters": {
        "type": "object",
        "properties": {
            "city": { "type": "string", "maxLength": 12 },
            "days": { "type": "integer", "minimum": 1, "maximum": 7 }
        },
        "required": ["city", "days"],
        "additionalProperties": false
    } } })
}

fn ask(tool_choice: Value, stream: bool) -> Value {
    json!({
        "messages": [{ "role": "user", "content": "Weather in Paris for 3 days?" }],
        "tools": [weather()],
        "tool_choice": tool_choice,
        "max_tokens": 128,
        "temperature": 0,
        "stream": stream,
    })
}

/// The one call a reply holds, checked against the tool's schema by hand.
fn check_call(call: &Value) {
    assert_eq!(call["type"], "function", "{call}");
    assert_eq!(call["function"]["name"], "get_weather", "{call}");
    assert!(call["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{call}");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().expect("a string")).expect("JSON");
    assert!(args["city"].as_str().is_some_and(|c| c.chars().count() <= 12), "{args}");
    assert!(args["days"].as_u64().is_some_and(|d| (1..=7).contains(&d)), "{args}");
}

/// A forced call in the template's own format comes back as `tool_calls`, streamed
/// (each call whole in one delta) or not, with finish reason "tool_calls".
fn forced_calls_read_back(template: &str, name: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(pack) = strata_tests::pack_with_template(&dir.path().join(name), template) else { return };
    let Some(server) = Server::start_pack(&pack, &["--parallel", "1", "--ctx", "512"], "ready") else { return };
    for choice in [json!("required"), json!({ "type": "function", "function": { "name": "get_weather" } })] {
        let (status, v) = server.post("/v1/chat/completions", &ask(choice.clone(), false));
        assert_eq!(status, 200, "{v}");
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{choice}: {v}");
        assert_eq!(c["message"]["tool_calls"].as_array().map(Vec::len), Some(1), "{v}");
        check_call(&c["message"]["tool_calls"][0]);

        let chunks: Vec<Value> = server
            .stream("/v1/chat/completions", &ask(choice.clone(), true))
            .iter()
            .filter_map(|e| serde_json::from_str(e).ok())
            .collect();
        let calls: Vec<&Value> =
            chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array()).flatten().collect();
        assert_eq!(calls.len(), 1, "{chunks:?}");
        assert_eq!(calls[0]["index"], 0);
        check_call(calls[0]);
        let last = chunks.iter().rev().find(|c| !c["choices"][0]["finish_reason"].is_null()).expect("a finish");
        assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(calls[0]["function"], c["message"]["tool_calls"][0]["function"], "greedy: streamed as whole");
    }
}

#[test]
fn qwen3_coder_calls_are_forced_and_read_back() {
    forced_calls_read_back(CODER_TEMPLATE, "coder.gguf");
}

#[test]
fn llama3_calls_are_forced_and_read_back() {
    forced_calls_read_back(LLAMA_TEMPLATE, "llama.gguf");
}

#[test]
fn tool_turns_render_and_free_text_is_content_never_a_500() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(pack) = strata_tests::pack_with_template(&dir.path().join("coder.gguf"), CODER_TEMPLATE) else { return };
    let Some(server) = Server::start_pack(&pack, &["--parallel", "1", "--ctx", "512"], "ready") else { return };
    // The model's own (random) text under tool_choice auto: content, not calls.
    let mut req = ask(json!("auto"), false);
    let call = json!({ "id": "call_1", "type": "function", "function": { "name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 3}" } });
    req["messages"].as_array_mut().expect("messages").extend([
        json!({ "role": "assistant", "content": null, "tool_calls": [call] }),
        json!({ "role": "tool", "tool_call_id": "call_1", "content": "sunny" }),
    ]);
    let (status, v) = server.post("/v1/chat/completions", &req);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
    assert!(v["choices"][0]["message"].get("tool_calls").is_none(), "{v}");
    // tool_choice none: no tools shown, no calls read.
    let (status, v) = server.post("/v1/chat/completions", &ask(json!("none"), false));
    assert_eq!((status, &v["choices"][0]["finish_reason"]), (200, &json!("length")), "{v}");
}

#[test]
fn structured_output_on_completions_too() {
    let Some(server) = Server::start(&["--parallel", "1"], &[], "ready") else { return };
    let schema = json!({ "type": "object", "properties": { "n": { "type": "integer", "minimum": 0, "maximum": 9 } }, "required": ["n"], "additionalProperties": false });
    let req = json!({ "prompt": "A number:", "max_tokens": 32, "temperature": 1, "seed": 3,
        "response_format": { "type": "json_schema", "json_schema": { "name": "n", "schema": schema } } });
    let (status, v) = server.post("/v1/completions", &req);
    assert_eq!(status, 200, "{v}");
    let out: Value = serde_json::from_str(v["choices"][0]["text"].as_str().expect("text")).expect("JSON");
    assert!(out["n"].as_u64().is_some_and(|n| n <= 9), "{out}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
}

#[test]
fn every_refusal_names_its_field() {
    // SmolLM2's template writes no tool calls.
    let Some(server) = Server::start(&["--parallel", "1"], &[], "ready") else { return };
    let user = json!([{ "role": "user", "content": "hi" }]);
    let tool = weather();
    let cases = [
        (json!({ "tools": [tool] }), "tools", "writes no tool calls"),
        (json!({ "tools": [tool], "tool_choice": "none" }), "", ""),
        (json!({ "tool_choice": "auto" }), "tool_choice", "needs 'tools'"),
        (
            json!({ "tools": [tool], "tool_choice": { "type": "function", "function": { "name": "nope" } } }),
            "tool_choice",
            "'nope'",
        ),
        (json!({ "tools": [tool], "tool_choice": "sometimes" }), "tool_choice", "must be"),
        (json!({ "tools": [{ "type": "retrieval" }] }), "tools[0]", "only functions"),
        (
            json!({ "tools": [{ "type": "function", "function": { "name": "bad name" } }] }),
            "tools[0].function.name",
            "letters",
        ),
        (json!({ "functions": [] }), "functions", "use 'tools'"),
        (json!({ "response_format": { "type": "yaml" } }), "response_format", "must be"),
        (
            json!({ "response_format": { "type": "json_schema", "json_schema": { "name": "x" } } }),
            "response_format",
            "schema",
        ),
        (
            json!({ "response_format": { "type": "json_schema", "json_schema": { "name": "x", "schema": { "type": "nosuchtype" } } } }),
            "response_format",
            "nosuchtype",
        ),
        (json!({ "messages": [{ "role": "tool", "content": "x" }] }), "messages[0].tool_call_id", "tool_call_id"),
        (
            json!({ "messages": [{ "role": "user", "content": "x", "tool_calls": [] }] }),
            "messages[0].tool_calls",
            "assistant",
        ),
        (
            json!({ "messages": [{ "role": "assistant", "content": "", "tool_calls": [{ "id": "a" }] }] }),
            "messages[0].tool_calls[0]",
            "function",
        ),
    ];
    for (extra, param, says) in cases {
        let mut req = json!({ "messages": user, "max_tokens": 2 });
        req.as_object_mut().expect("object").extend(extra.as_object().expect("object").clone());
        let (status, v) = server.post("/v1/chat/completions", &req);
        if param.is_empty() {
            assert_eq!(status, 200, "{extra}: {v}");
            continue;
        }
        assert_eq!((status, v["error"]["param"].as_str()), (400, Some(param)), "{extra}: {v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains(says)), "{extra}: {v}");
    }
}
