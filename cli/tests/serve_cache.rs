//! The slots' prompt cache over a socket: a chat's next turn reads only its new tokens
//! (`usage.prompt_tokens_details.cached_tokens`, `/metrics`) and writes the text a cold
//! request writes; another conversation meanwhile takes the other slot.

mod serve_harness;

use serde_json::{Value, json};
use serve_harness::Server;

fn ask(messages: &Value, cache: bool) -> Value {
    json!({ "messages": messages, "max_tokens": 24, "temperature": 0, "cache_prompt": cache })
}

fn reply(v: &Value) -> (String, u64, u64) {
    let text = v["choices"][0]["message"]["content"].as_str().expect("content").to_owned();
    let usage = &v["usage"];
    (
        text,
        usage["prompt_tokens"].as_u64().expect("prompt"),
        usage["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached"),
    )
}

fn cached_metric(server: &Server) -> u64 {
    let (_, metrics) = server.call("GET", "/metrics", None, &[]);
    let line = metrics.lines().find(|l| l.starts_with("strata_prompt_tokens_cached_total ")).expect("the metric");
    line.rsplit(' ').next().and_then(|n| n.parse().ok()).expect("a count")
}

#[test]
fn a_chat_turn_reads_only_its_new_tokens_and_writes_what_a_cold_request_writes() {
    let Some(server) = Server::start(&["--parallel", "2", "--ctx", "512"], &[], "ready") else { return };
    let mut chat = json!([
        { "role": "system", "content": "You are a helpful assistant." },
        { "role": "user", "content": "What is the capital of France?" },
    ]);
    let (status, v) = server.post("/v1/chat/completions", &ask(&chat, true));
    assert_eq!(status, 200, "{v}");
    let (first, p1, cached) = reply(&v);
    assert_eq!(cached, 0, "a fresh server holds nothing");

    let turn = |chat: &mut Value, answer: &str, question: &str| {
        let list = chat.as_array_mut().expect("messages");
        list.push(json!({ "role": "assistant", "content": answer }));
        list.push(json!({ "role": "user", "content": question }));
    };
    turn(&mut chat, &first, "And the capital of Italy?");
    let (_, v) = server.post("/v1/chat/completions", &ask(&chat, true));
    let (second, p2, cached) = reply(&v);
    assert!(cached >= p1, "the first turn's prompt at least is held: {cached} of {p2}, first {p1}");
    assert!(p2 - cached <= 24, "only the new turn is read: {} of {p2} tokens", p2 - cached);
    assert_eq!(cached_metric(&server), cached);

    // The same turn cold (cache_prompt false: it lands on the empty slot) writes the same.
    let (_, v) = server.post("/v1/chat/completions", &ask(&chat, false));
    let (cold, _, none) = reply(&v);
    assert_eq!(none, 0);
    assert_eq!(cold, second, "cached and cold turns agree");

    // That cold request took the other slot: the chat's third turn still finds its own.
    turn(&mut chat, &second, "Thanks!");
    let (_, v) = server.post("/v1/chat/completions", &ask(&chat, true));
    let (_, p3, cached3) = reply(&v);
    assert!(cached3 >= p2, "{cached3} of {p3}");
    assert_eq!(cached_metric(&server), cached + cached3);
}
