//! The slots' prompt cache over a socket: a chat's next turn reads only its new tokens
//! (`usage.prompt_tokens_details.cached_tokens`, `/metrics`) and writes the text a cold
//! request writes; another conversation meanwhile takes the other slot. And the paged KV
//! pool under them (`--kv-budget`): requests wait for pages, one the pool cannot hold is
//! refused, and a client that goes away gives its pages back.

mod serve_harness;

use std::io::Read;
use std::net::TcpStream;

use serde_json::{Value, json};
use serve_harness::Server;

const PROMPT: &str = "The capital of France is";

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

/// Reads a streamed response until its first token's event: the request holds a slot
/// and has read its prompt. A chat stream's first event only names the role and comes
/// before the prompt is read, so there it is the second (a test that sent a request
/// after the first event lost the race to a slow prompt under a loaded CPU).
fn first_token(s: &mut TcpStream, chat: bool) {
    let events = if chat { 2 } else { 1 };
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while String::from_utf8_lossy(&seen).matches("data: {").count() < events {
        let n = s.read(&mut buf).expect("the stream goes on");
        assert!(n > 0, "the stream ended early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn a_small_kv_pool_refuses_what_it_cannot_hold_queues_what_must_wait_and_gets_pages_back() {
    // 2 MiB: a few 16-position pages of SmolLM2's 30 layers, less than one context of 256.
    let Some(server) = Server::start(&["--parallel", "2", "--kv-budget", "2"], &[], "ready") else { return };
    let (total, block) = (server.metric("kv_pages_total"), server.metric("kv_page_positions"));
    let ready = server.log.lines().into_iter().find(|l| l.contains("ready: ")).expect("a ready line");
    assert!(ready.contains(&format!("KV pool of {} positions in {total} pages", total * block)), "{ready}");
    assert!(total >= 3.0 && total * block < 256.0, "{total} pages of {block}");
    assert_eq!(server.metric("kv_pages_free"), total, "nothing is held yet");

    // More than the whole pool: a 400 that names the sizes.
    let over = (total * block) as u64;
    let (status, v) = server.post("/v1/completions", &json!({ "prompt": "Hi", "max_tokens": over, "temperature": 0 }));
    assert_eq!(status, 400, "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("KV cache") && message.contains("--kv-budget"), "{message}");
    assert_eq!(v["error"]["param"], "max_tokens", "{v}");

    // A client that goes away mid-stream gives its pages back.
    let mut s = server
        .send("/v1/completions", &json!({ "prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stream": true }));
    first_token(&mut s, false);
    assert!(server.metric("kv_pages_reserved") > 0.0);
    drop(s);
    server.wait_metric("kv_pages_reserved", 0.0);
    server.wait_metric("kv_pages_free", total);

    // Each of these reserves more than half the pool: the second waits for the first's
    // pages, though a slot is free, then writes what it writes alone.
    let half = ((total / 2.0).floor() * block) as u64;
    let body = move |prompt: &str| json!({ "prompt": prompt, "max_tokens": half + 1, "temperature": 0, "cache_prompt": false });
    let (status, v) = server.post("/v1/completions", &body("Once upon a time"));
    assert_eq!(status, 200, "{v}");
    let alone = v["choices"][0]["text"].clone();
    let mut s = server.send(
        "/v1/completions",
        &json!({ "prompt": PROMPT, "max_tokens": half + 1, "temperature": 0, "stream": true }),
    );
    first_token(&mut s, false);
    let client = server.client;
    let second = std::thread::spawn(move || client.post("/v1/completions", &body("Once upon a time")));
    server.wait_metric("requests_waiting", 1.0);
    let mut rest = String::new();
    s.read_to_string(&mut rest).expect("the first stream ends");
    assert!(rest.contains("[DONE]"), "{rest}");
    let (status, v) = second.join().expect("the second client");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], alone, "queued and alone agree");
    assert_eq!(server.metric("kv_pages_reserved"), 0.0);
}

#[test]
fn a_request_starts_from_the_pages_of_a_prefix_a_running_request_holds() {
    let Some(server) = Server::start(&["--parallel", "2", "--ctx", "512"], &[], "ready") else { return };
    let system = "You are a helpful assistant. Answer in one short sentence, plainly, without lists.";
    let chat =
        |question: &str| json!([{ "role": "system", "content": system }, { "role": "user", "content": question }]);
    // The first conversation runs in one slot while the second arrives: the second takes
    // the other slot, starting from the whole pages of the system prompt the first holds.
    let first = json!({ "messages": chat("Tell me a long story about a dragon."), "max_tokens": 40, "temperature": 0, "stream": true });
    let mut s = server.send("/v1/chat/completions", &first);
    first_token(&mut s, true);
    let (status, v) = server.post("/v1/chat/completions", &ask(&chat("What is the capital of France?"), true));
    assert_eq!(status, 200, "{v}");
    let (warm, prompt, cached) = reply(&v);
    assert!(
        cached >= 16 && cached % 16 == 0 && cached < prompt,
        "whole pages of the shared prefix: {cached} of {prompt}"
    );
    drop(s);
    // The same request cold writes the same.
    let (status, v) = server.post("/v1/chat/completions", &ask(&chat("What is the capital of France?"), false));
    assert_eq!(status, 200, "{v}");
    let (cold, _, none) = reply(&v);
    assert_eq!(none, 0);
    assert_eq!(cold, warm, "a borrowed prefix and a cold read agree");
}
