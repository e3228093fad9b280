//! `strata-run serve` over a real socket, on the CPU with the default model: the
//! OpenAI-compatible routes, streaming, exact usage, stop strings, concurrency,
//! cancellation by disconnect, authentication (flag, file, environment), served model
//! names, the request log (text and JSON), latency histograms, health during load, and a
//! 4xx with an OpenAI-style error for every kind of bad input. Limits, timeouts, chat-turn forgery
//! and the graceful stop are in `serve_limits.rs`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod serve_harness;

use serve_harness::{Server, THINKING_TEMPLATE};

const PROMPT: &str = "The capital of France is";

#[test]
fn completions_chat_streaming_usage_stops_and_determinism() {
    let Some(server) = Server::start(&["--parallel", "2"], &[], "ready") else { return };
    let (status, health) = server.call("GET", "/health", None, &[]);
    assert_eq!((status, health.as_str()), (200, r#"{"status":"ok"}"#));
    let (_, models) = server.call("GET", "/v1/models", None, &[]);
    let id = serde_json::from_str::<Value>(&models).expect("JSON")["data"][0]["id"].as_str().expect("id").to_owned();
    assert_eq!(id, "SmolLM2-135M-Instruct.Q4_1");

    // Plain completion: exact usage (llama.cpp's 5 ids for this prompt), length finish.
    let req = json!({ "model": id, "prompt": PROMPT, "max_tokens": 4, "temperature": 0 });
    let (status, v) = server.post("/v1/completions", &req);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let usage = json!({ "prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9, "prompt_tokens_details": { "cached_tokens": 0 } });
    assert_eq!(v["usage"], usage);
    let text = v["choices"][0]["text"].as_str().expect("text").to_owned();
    assert!(text.starts_with(" Paris"), "{text}");

    // Temperature 0 is deterministic; the stream carries the same text, then usage, then [DONE].
    let (_, again) = server.post("/v1/completions", &req);
    assert_eq!(again["choices"][0]["text"], text.as_str());
    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({ "include_usage": true });
    let events = server.stream("/v1/completions", &streamed);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).expect("chunk")).collect();
    let joined: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(joined, text);
    let usage = chunks.last().expect("usage chunk");
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 4);
    assert_eq!(chunks[chunks.len() - 2]["choices"][0]["finish_reason"], "length");

    // A stop string ends the text before it, with finish "stop".
    let (_, v) =
        server.post("/v1/completions", &json!({ "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stop": ["."] }));
    assert_eq!(v["choices"][0]["text"], " Paris");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // Chat, not streamed and streamed, with log-probabilities.
    let chat = json!({
        "messages": [{ "role": "user", "content": [{ "type": "text", "text": "What is the capital of France?" }] }],
        "max_completion_tokens": 3, "temperature": 0, "logprobs": true, "top_logprobs": 2,
    });
    let (status, v) = server.post("/v1/chat/completions", &chat);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    let lp = v["choices"][0]["logprobs"]["content"].as_array().expect("logprobs");
    assert_eq!(lp.len(), 3);
    assert_eq!(lp[0]["top_logprobs"].as_array().map(Vec::len), Some(2));
    assert!(lp[0]["logprob"].as_f64().expect("logprob") <= 0.0);
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let events = server.stream("/v1/chat/completions", &streamed);
    let first: Value = serde_json::from_str(&events[0]).expect("chunk");
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let content: String = events[1..events.len() - 1]
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(content, v["choices"][0]["message"]["content"].as_str().expect("content"));

    // A seed makes sampling at temperature 1 repeatable.
    let sampled = json!({ "prompt": PROMPT, "max_tokens": 6, "temperature": 1.0, "seed": 42 });
    let (_, a) = server.post("/v1/completions", &sampled);
    let (_, b) = server.post("/v1/completions", &sampled);
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"], "same seed, same text");

    // logit_bias +100 on one token: every token generated is that one.
    let forced = json!({ "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "logit_bias": { "1000": 100 } });
    let (status, v) = server.post("/v1/completions", &forced);
    assert_eq!(status, 200, "{v}");
    let text = v["choices"][0]["text"].as_str().expect("text");
    assert!(!text.is_empty() && text.len() % 3 == 0, "{text:?}");
    assert_eq!(text, text[..text.len() / 3].repeat(3), "three times one token");

    let (_, metrics) = server.call("GET", "/metrics", None, &[]);
    assert!(metrics.contains("strata_completion_tokens_total"), "{metrics}");
    assert!(metrics.contains("strata_requests_running 0"), "{metrics}");
    assert!(metrics.contains("strata_expert_lookups_total 0"), "a dense pack looks up no experts: {metrics}");
}

#[test]
fn concurrent_clients_all_complete_and_a_disconnect_frees_its_slot() {
    let Some(server) = Server::start(&["--parallel", "2"], &[], "ready") else { return };
    let client = server.client;
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let s = client;
            std::thread::spawn(move || {
                let body = json!({ "prompt": format!("{PROMPT} {i}"), "max_tokens": 2, "temperature": 0 });
                s.post("/v1/completions", &body)
            })
        })
        .collect();
    for c in clients {
        let (status, v) = c.join().expect("client");
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 2);
    }

    // One slot: a long streamed request whose client goes away must not hold it.
    drop(server);
    let Some(server) = Server::start(&["--parallel", "1"], &[], "ready") else { return };
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).expect("connects");
    let body = json!({ "prompt": PROMPT, "max_tokens": 200, "temperature": 0, "stream": true }).to_string();
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("sends");
    let mut first = [0u8; 64];
    let _ = s.read(&mut first).expect("the stream starts");
    drop(s);
    let start = Instant::now();
    let (status, v) = server.post("/v1/completions", &json!({ "prompt": PROMPT, "max_tokens": 1, "temperature": 0 }));
    assert_eq!(status, 200, "{v}");
    // 200 tokens at this machine's CPU speed would take minutes; a freed slot takes seconds.
    assert!(start.elapsed() < Duration::from_secs(40), "the slot was freed after {:?}", start.elapsed());
}

/// Each completion `bodies` asks for, first one at a time, then all at once: the texts
/// (each answered 200) alone and together.
fn alone_and_together(server: &Server, bodies: &[Value]) -> (Vec<String>, Vec<(String, Value)>) {
    let text = |(status, v): (u16, Value)| {
        assert_eq!(status, 200, "{v}");
        (v["choices"][0]["text"].as_str().expect("text").to_owned(), v)
    };
    let alone = bodies.iter().map(|b| text(server.post("/v1/completions", b)).0).collect();
    let client = server.client;
    let together: Vec<_> = bodies
        .iter()
        .map(|b| {
            let b = b.clone();
            std::thread::spawn(move || client.post("/v1/completions", &b))
        })
        .collect();
    (alone, together.into_iter().map(|c| text(c.join().expect("client"))).collect())
}

#[test]
fn concurrent_greedy_requests_decode_in_batches_and_each_gets_its_text_alone() {
    let Some(server) = Server::start(&["--parallel", "8"], &[], "ready") else { return };
    // Prompts and lengths that differ, so that requests join and leave the batches at
    // different rounds.
    let prompts = [
        "The capital of France is",
        "Once upon a time",
        "def fibonacci(n):",
        "The three primary colors are red, yellow and",
        "Water boils at",
        "A haiku about the sea:",
        "1, 2, 3, 4,",
        "The quick brown fox jumps over the lazy dog. The quick brown fox",
    ];
    let bodies: Vec<Value> = (0..prompts.len())
        .map(|i| json!({ "prompt": prompts[i], "max_tokens": 6 + i, "temperature": 0, "cache_prompt": false }))
        .collect();
    let (alone, together) = alone_and_together(&server, &bodies[..1]);
    assert_eq!(alone[0], together[0].0);
    assert_eq!(server.metric("decode_batches_total"), 0.0, "a request by itself decodes alone");
    let (alone, together) = alone_and_together(&server, &bodies);
    for (i, (text, v)) in together.iter().enumerate() {
        assert_eq!(*text, alone[i], "request {i}: batched vs alone");
        assert_eq!(v["usage"]["completion_tokens"].as_u64().map(|n| n <= 6 + i as u64), Some(true), "{v}");
    }
    let (batches, sequences) = (server.metric("decode_batches_total"), server.metric("decode_batched_sequences_total"));
    assert!(batches > 0.0 && sequences >= 2.0 * batches, "{batches} batches of {sequences} sequences");
}

#[test]
fn more_concurrent_requests_than_a_window_all_complete_in_wide_passes() {
    // 36 slots: batches past two of the widest windows (16) run on the prompt chunk's
    // GEMMs, whose rows may differ from decoding alone in the last bits (the runtime's
    // tests hold them to the single-sequence logits), so each request's completion is
    // checked here, and that one pass held more than 32.
    let Some(server) = Server::start(&["--parallel", "36"], &[], "ready") else { return };
    let bodies: Vec<Value> = (0..36)
        .map(|i| {
            let prompt = format!("Item {i}: the list goes on with");
            json!({ "prompt": prompt, "max_tokens": 4 + i % 5, "temperature": 0, "cache_prompt": false })
        })
        .collect();
    let client = server.client;
    let clients: Vec<_> =
        bodies.into_iter().map(|b| std::thread::spawn(move || client.post("/v1/completions", &b))).collect();
    for (i, c) in clients.into_iter().enumerate() {
        let (status, v) = c.join().expect("client");
        assert_eq!(status, 200, "{v}");
        let n = v["usage"]["completion_tokens"].as_u64().expect("a count");
        assert!((1..=4 + i as u64 % 5).contains(&n), "request {i}: {v}");
    }
    let widest = server.metric("decode_batch_widest");
    assert!(widest > 32.0 && widest <= 36.0, "the widest pass held {widest} sequences");
}

#[test]
fn a_small_step_budget_reads_a_long_prompt_in_pieces_beside_a_decoding_request() {
    // 8 tokens a round: one for the decoding request, the rest for the long prompt.
    let Some(server) = Server::start(&["--parallel", "2", "--batch-tokens", "8"], &[], "ready") else { return };
    let long = format!("{PROMPT} Paris. {}", "The river that runs through it is the Seine. ".repeat(6));
    let bodies = [(PROMPT.to_owned(), 24), (long, 4)]
        .map(|(prompt, n)| json!({ "prompt": prompt, "max_tokens": n, "temperature": 0, "cache_prompt": false }));
    let (alone, together) = alone_and_together(&server, &bodies);
    for (i, (text, _)) in together.iter().enumerate() {
        assert_eq!(*text, alone[i], "request {i}: read in budgeted pieces vs alone");
    }
}

#[test]
fn a_short_prompt_arriving_behind_a_long_one_is_answered_while_the_long_one_is_read() {
    // 8 tokens a round: a prompt of about 1300 tokens takes a round of it 160 times; a
    // short prompt arriving meanwhile is read within a few rounds (shortest first), not
    // after the long one (its first token's wait measured 2 s behind a 16k prompt).
    let args = ["--parallel", "2", "--batch-tokens", "8", "--ctx", "2048"];
    let Some(server) = Server::start(&args, &[], "ready") else { return };
    let long = format!("{PROMPT} {}", "The river that runs through it is the Seine. ".repeat(120));
    let body = |prompt: &str| json!({ "prompt": prompt, "max_tokens": 1, "temperature": 0, "cache_prompt": false });
    let mut pending = server.send("/v1/completions", &body(&long));
    server.wait_metric("requests_running", 1.0);
    let (status, short) = server.post("/v1/completions", &body(PROMPT));
    assert_eq!(status, 200, "{short}");
    assert_eq!(server.metric("requests_running"), 1.0, "the long prompt was read before the short one was answered");
    let mut reply = String::new();
    pending.read_to_string(&mut reply).expect("the long prompt's reply");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

#[test]
fn speculative_serving_keeps_greedy_text_and_reports_acceptance() {
    let Some(server) = Server::start(&["--parallel", "2", "--spec", "4"], &[], "ready") else { return };
    // A pattern the n-gram drafter continues; with log-probabilities asked for, the
    // same request decodes a token at a time, which gives the reference text.
    let prompt = "1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2,";
    let req = json!({ "prompt": prompt, "max_tokens": 12, "temperature": 0 });
    let (status, fast) = server.post("/v1/completions", &req);
    assert_eq!(status, 200, "{fast}");
    let mut plain = req.clone();
    plain["logprobs"] = json!(1);
    let (_, plain) = server.post("/v1/completions", &plain);
    assert_eq!(fast["choices"][0]["text"], plain["choices"][0]["text"]);
    assert_eq!(fast["usage"]["completion_tokens"], 12);
    let (_, metrics) = server.call("GET", "/metrics", None, &[]);
    let value = |name: &str| -> f64 {
        let line = metrics.lines().find(|l| l.starts_with(&format!("strata_{name} "))).expect(name);
        line.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("a number")
    };
    assert!(value("spec_verify_passes_total") > 0.0, "{metrics}");
    assert!(value("spec_accepted_tokens_total") > 0.0, "{metrics}");
    assert!(value("spec_acceptance_ratio") > 0.0 && value("spec_acceptance_ratio") <= 1.0, "{metrics}");
}

#[test]
fn bad_input_gets_an_openai_style_4xx() {
    let Some(server) = Server::start(&["--parallel", "1"], &[], "ready") else { return };
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("/v1/chat/completions", "{not json".into(), 400, "not valid JSON"),
        ("/v1/chat/completions", "[1, 2]".into(), 400, "JSON object"),
        ("/v1/chat/completions", json!({ "messages": [] }).to_string(), 400, "must not be empty"),
        ("/v1/chat/completions", json!({ "messages": "hi" }).to_string(), 400, "array of messages"),
        ("/v1/chat/completions", json!({ "messages": [{ "role": "robot", "content": "x" }] }).to_string(), 400, "role"),
        ("/v1/chat/completions", json!({ "messages": [{ "role": "user", "content": 5 }] }).to_string(), 400, "content"),
        ("/v1/completions", json!({ "prompt": PROMPT, "max_tokens": -1 }).to_string(), 400, "max_tokens"),
        (
            "/v1/completions",
            json!({ "prompt": PROMPT, "max_tokens": 0 }).to_string(),
            400,
            "'max_tokens' must be at least 1",
        ),
        (
            "/v1/chat/completions",
            json!({ "messages": [{ "role": "user", "content": "hi" }], "max_completion_tokens": 0 }).to_string(),
            400,
            "'max_completion_tokens' must be at least 1",
        ),
        // Too many tokens for the context, and (before any tokenizing) too many bytes.
        ("/v1/completions", json!({ "prompt": "a ".repeat(300) }).to_string(), 400, "fills the context of 256"),
        ("/v1/completions", json!({ "prompt": "a".repeat(1 << 20) }).to_string(), 400, "more than fit the context"),
        (
            "/v1/chat/completions",
            json!({ "messages": [{ "role": "user", "content": "a".repeat(1 << 20) }] }).to_string(),
            400,
            "more than fit the context",
        ),
        ("/v1/completions", json!({ "prompt": PROMPT, "temperature": "hot" }).to_string(), 400, "temperature"),
        ("/v1/completions", json!({ "prompt": PROMPT, "temperature": 9 }).to_string(), 400, "between 0 and 2"),
        ("/v1/completions", json!({ "prompt": PROMPT, "n": 2 }).to_string(), 400, "n = 2 is not supported"),
        ("/v1/completions", json!({ "prompt": PROMPT, "stop": 3 }).to_string(), 400, "stop"),
        ("/v1/completions", json!({ "prompt": 7 }).to_string(), 400, "prompt"),
        (
            "/v1/completions",
            json!({ "prompt": PROMPT, "max_tokens": 300 }).to_string(),
            400,
            "exceed the context of 256",
        ),
        ("/v1/nothing", "{}".into(), 404, "no such route"),
        // Fields strata does not act on are refused by name, not ignored.
        (
            "/v1/chat/completions",
            json!({ "messages": [{ "role": "user", "content": "hi" }], "functions": [] }).to_string(),
            400,
            "'functions': the deprecated",
        ),
        (
            "/v1/completions",
            json!({ "prompt": PROMPT, "tools": [] }).to_string(),
            400,
            "'tools': strata does not support",
        ),
        (
            "/v1/completions",
            json!({ "prompt": PROMPT, "frobnicate": 1 }).to_string(),
            400,
            "'frobnicate': strata does not support",
        ),
        ("/v1/completions", json!({ "prompt": PROMPT, "messages": [] }).to_string(), 400, "'messages'"),
        (
            "/v1/chat/completions",
            json!({ "messages": [{ "role": "tool", "content": "4" }] }).to_string(),
            400,
            "needs the 'tool_call_id'",
        ),
        ("/v1/completions", json!({ "prompt": PROMPT, "logit_bias": { "12": 101 } }).to_string(), 400, "-100 to 100"),
        ("/v1/completions", json!({ "prompt": PROMPT, "logit_bias": { "x": 1 } }).to_string(), 400, "token ids"),
        (
            "/v1/completions",
            json!({ "prompt": PROMPT, "logit_bias": { "99999999": 1 } }).to_string(),
            400,
            "not in the vocabulary",
        ),
    ];
    let error = |body: &str, text: &str| -> Value {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|_| panic!("{body}: JSON error body, got {text}"));
        assert!(v["error"]["type"].is_string(), "{text}");
        v["error"].clone()
    };
    for (path, body, want, says) in cases {
        let (status, text) = server.call("POST", path, Some(&body), &[]);
        let short = &body[..body.len().min(200)];
        assert_eq!(status, want, "{path} {short}: {text}");
        let e = error(short, &text);
        let message = e["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{short}: {message}");
        if let Some(field) = says.strip_prefix('\'').and_then(|s| s.split('\'').next()) {
            assert_eq!(e["param"], field, "{text}");
        }
        if message.contains("context") && !message.contains("max_tokens") {
            // Prompt-size errors name the field that holds the prompt.
            let field = if path == "/v1/completions" { "prompt" } else { "messages" };
            assert_eq!(e["param"], field, "{text}");
            assert_eq!(e["code"], "context_length_exceeded", "{text}");
        }
    }
    // A body over the limit is refused from its Content-Length, before it is read: the
    // client sends the head alone (as one waiting on `Expect: 100-continue` would), since
    // writing 5 MiB into a connection the server has already answered and closed races
    // with the close (a broken pipe, or a reset that drops the answer).
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        5 << 20
    );
    let (status, _, text) = server.exchange_raw(&head);
    assert_eq!(status, 413, "a body over the limit");
    assert!(error("5 MiB", &text)["message"].as_str().unwrap_or_default().contains("limit"), "{text}");
    for (method, path) in [("GET", "/v1/completions"), ("DELETE", "/v1/models"), ("POST", "/health")] {
        let (status, text) = server.call(method, path, None, &[]);
        assert_eq!(status, 405, "{method} {path}: {text}");
        error(path, &text);
    }
    let (status, text) = server.call("GET", "/v1/models/SmolLM2-135M-Instruct.Q4_1", None, &[]);
    assert_eq!(status, 200, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).expect("JSON")["id"], "SmolLM2-135M-Instruct.Q4_1");
    let (status, text) = server.call("GET", "/v1/models/gpt-9", None, &[]);
    assert_eq!(status, 404, "{text}");
    assert_eq!(error("gpt-9", &text)["code"], "model_not_found");
    let (status, _) = server.call("GET", "/health", None, &[]);
    assert_eq!(status, 200, "still serving after all that");
}

#[test]
fn api_key_and_health_while_loading() {
    let delay = [("STRATA_TEST_LOAD_DELAY_MS", "3000")];
    let Some(mut server) = Server::start(&["--api-key", "sesame"], &delay, "listening") else { return };
    let (status, body) = server.call("GET", "/health", None, &[]);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("loading"), "{body}");
    server.wait_for("ready");
    let (status, _) = server.call("GET", "/health", None, &[]);
    assert_eq!(status, 200);
    let (status, body) = server.call("GET", "/v1/models", None, &[]);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("invalid_api_key"), "{body}");
    let (status, _) = server.call("GET", "/v1/models", None, &[("Authorization", "Bearer wrong")]);
    assert_eq!(status, 401);
    let (status, _) = server.call("GET", "/v1/models", None, &[("Authorization", "Bearer sesame")]);
    assert_eq!(status, 200);
    // The scheme in any case; the key exactly.
    for scheme in ["bearer", "BEARER", "BeArEr"] {
        let auth = format!("{scheme} sesame");
        let (status, _) = server.call("GET", "/v1/models", None, &[("Authorization", &auth)]);
        assert_eq!(status, 200, "{auth}");
    }
    for wrong in ["Bearer Sesame", "Bearer sesame2", "Bearer sesam", "Basic sesame", "sesame", "Bearer"] {
        let (status, _) = server.call("GET", "/v1/models", None, &[("Authorization", wrong)]);
        assert_eq!(status, 401, "{wrong}");
    }
    // /metrics is behind the key; /health is not.
    let (status, body) = server.call("GET", "/metrics", None, &[]);
    assert_eq!(status, 401, "{body}");
    let (status, body) = server.call("GET", "/metrics", None, &[("Authorization", "Bearer sesame")]);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("strata_requests_total"), "{body}");
    let (status, _) = server.call("GET", "/v1/models/SmolLM2-135M-Instruct.Q4_1", None, &[]);
    assert_eq!(status, 401);
}

#[test]
fn a_public_address_without_a_key_is_warned_about() {
    let Some(server) = Server::start(&["--host", "0.0.0.0"], &[], "listening") else { return };
    let warned =
        server.log.wait_line(Duration::from_secs(60), |l| l.contains("WARN") && l.contains("without --api-key"));
    assert!(warned.is_some(), "no warning about serving 0.0.0.0 without a key");
}

/// `serve --backend auto` that lands on the CPU logs why CUDA and HIP were not used, as
/// the other commands print it.
#[test]
fn auto_backend_logs_why_each_gpu_backend_was_passed_over() {
    let Some(server) = Server::start(&["--backend", "auto"], &[], "ready") else { return };
    let lines = server.log.lines();
    let device = lines.iter().find(|l| l.contains("INFO device: ")).expect("the device is logged");
    if !device.ends_with(", cpu)") {
        return; // this machine has a GPU that auto chose
    }
    for backend in ["CUDA", "HIP"] {
        let want = format!("--backend auto: {backend} not used: ");
        assert!(lines.iter().any(|l| l.contains("WARN") && l.contains(&want)), "no {want:?} in {lines:#?}");
    }
}

/// The `request` events of a JSON log for `route`.
fn request_events(server: &Server, route: &str) -> Vec<Value> {
    server.log.json().into_iter().filter(|v| v["message"] == "request" && v["route"] == route).collect()
}

#[test]
fn json_request_log_request_ids_latency_histograms_and_any_model_name() {
    let Some(server) = Server::start(&["--parallel", "1", "--log-format", "json"], &[], "ready") else { return };
    let ready = server.log.wait_line(Duration::from_secs(1), |l| l.contains("ready: http://")).expect("ready");
    let ready: Value = serde_json::from_str(&ready).expect("the start-up lines are JSON too");
    assert_eq!(ready["level"], "INFO", "{ready}");

    // Without --served-model-name any model name is answered (and echoed back).
    let body = json!({ "model": "gpt-4o", "prompt": PROMPT, "max_tokens": 3, "temperature": 0 }).to_string();
    let (status, head, text) =
        server.exchange("POST", "/v1/completions", Some(&body), &[("X-Request-Id", "client-req-1")]);
    assert_eq!(status, 200, "{text}");
    assert!(head.contains("x-request-id: client-req-1\r\n"), "the client's id comes back: {head}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(v["model"], "gpt-4o");
    assert_eq!(v["usage"]["completion_tokens"], 3);

    // A streamed chat request, logged when its stream ends; an insane client id is replaced.
    let chat = json!({
        "messages": [{ "role": "user", "content": "Hi" }], "max_tokens": 4, "temperature": 0, "stream": true,
        "stream_options": { "include_usage": true },
    });
    let (status, head, text) =
        server.exchange("POST", "/v1/chat/completions", Some(&chat.to_string()), &[("x-request-id", "bad id\"")]);
    assert_eq!(status, 200, "{text}");
    let id = head.split("x-request-id: ").nth(1).and_then(|r| r.split("\r\n").next()).expect("an id").to_owned();
    assert!(id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()), "a generated id: {id}");
    let usage: Value = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|c| c["usage"].is_object())
        .expect("a usage chunk");
    let (chat_prompt, chat_done) = (&usage["usage"]["prompt_tokens"], &usage["usage"]["completion_tokens"]);

    // A request that fails validation is logged with its status and no tokens.
    let (status, _) = server.call("POST", "/v1/completions", Some("{not json"), &[]);
    assert_eq!(status, 400);
    let (status, _) = server.call("GET", "/v1/models", None, &[]);
    assert_eq!(status, 200);

    let wait = |route: &str, n: usize| {
        let start = Instant::now();
        loop {
            let events = request_events(&server, route);
            if events.len() >= n {
                return events;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "{n} request events for {route}: {events:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let completions = wait("/v1/completions", 2);
    assert_eq!(completions.len(), 2, "{completions:?}");
    let ok = completions.iter().find(|e| e["status"] == 200).expect("the 200");
    assert_eq!(ok["request_id"], "client-req-1", "{ok}");
    assert_eq!(ok["method"], "POST", "{ok}");
    assert_eq!(ok["level"], "INFO", "{ok}");
    assert_eq!(ok["prompt_tokens"], 5, "{ok}");
    assert_eq!(ok["completion_tokens"], 3, "{ok}");
    assert_eq!(ok["finish"], "length", "{ok}");
    let (ttft, total) = (ok["ttft_ms"].as_f64().expect("ttft_ms"), ok["duration_ms"].as_f64().expect("duration_ms"));
    assert!(ttft > 0.0 && ttft <= total, "{ok}");
    let bad = completions.iter().find(|e| e["status"] == 400).expect("the 400");
    assert!(bad.get("prompt_tokens").is_none() && bad.get("ttft_ms").is_none(), "{bad}");
    let streamed = wait("/v1/chat/completions", 1);
    assert_eq!(streamed.len(), 1, "{streamed:?}");
    let e = &streamed[0];
    assert_eq!((&e["request_id"], &e["status"]), (&json!(id), &json!(200)), "{e}");
    assert_eq!((&e["prompt_tokens"], &e["completion_tokens"]), (chat_prompt, chat_done), "{e}");
    assert!(e["ttft_ms"].as_f64() > Some(0.0), "{e}");
    assert_eq!(wait("/v1/models", 1)[0]["status"], 200);

    // The histograms count one first token per request and one gap per later token.
    let later = 2 + chat_done.as_u64().expect("completion tokens") - 1;
    assert_eq!(server.metric("time_to_first_token_seconds_count"), 2.0);
    assert_eq!(server.metric("inter_token_latency_seconds_count"), later as f64);
    let (_, metrics) = server.call("GET", "/metrics", None, &[]);
    assert!(metrics.contains("# TYPE strata_time_to_first_token_seconds histogram"), "{metrics}");
    assert!(metrics.contains("strata_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"), "{metrics}");
    assert!(metrics.contains(&format!("strata_inter_token_latency_seconds_bucket{{le=\"+Inf\"}} {later}\n")));
    assert!(server.metric("time_to_first_token_seconds_sum") > 0.0);
}

#[test]
fn text_request_log_served_model_names_and_an_api_key_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, "  filekey \nnot the key\n").expect("writes");
    let key_path = key_file.to_str().expect("utf-8");
    let args = ["--parallel", "1", "--api-key-file", key_path, "--served-model-name", "alias-a,alias-b"];
    let Some(server) = Server::start(&[&args[..], &["--served-model-name", "alias-c"][..]].concat(), &[], "ready")
    else {
        return;
    };
    let auth = [("Authorization", "Bearer filekey")];
    let (status, _) = server.call("GET", "/v1/models", None, &[("Authorization", "Bearer wrong")]);
    assert_eq!(status, 401);
    let (status, text) = server.call("GET", "/v1/models", None, &auth);
    assert_eq!(status, 200, "{text}");
    let listed: Vec<Value> = serde_json::from_str::<Value>(&text).expect("JSON")["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(listed, [json!("alias-a"), json!("alias-b"), json!("alias-c")]);
    let (status, _) = server.call("GET", "/v1/models/alias-c", None, &auth);
    assert_eq!(status, 200);

    let complete = |model: Option<&str>| {
        let mut body = json!({ "prompt": PROMPT, "max_tokens": 1, "temperature": 0 });
        if let Some(m) = model {
            body["model"] = json!(m);
        }
        let (status, text) = server.call("POST", "/v1/completions", Some(&body.to_string()), &auth);
        (status, serde_json::from_str::<Value>(&text).unwrap_or_else(|_| panic!("JSON: {text}")))
    };
    let (status, v) = complete(Some("alias-b"));
    assert_eq!((status, &v["model"]), (200, &json!("alias-b")), "{v}");
    let (status, v) = complete(None);
    assert_eq!((status, &v["model"]), (200, &json!("alias-a")), "{v}");
    for other in ["SmolLM2-135M-Instruct.Q4_1", "alias", "gpt-4o"] {
        let (status, v) = complete(Some(other));
        assert_eq!(status, 404, "{other}: {v}");
        assert_eq!(v["error"]["code"], "model_not_found", "{v}");
        assert!(v["error"]["message"].as_str().unwrap_or_default().contains("'alias-a', 'alias-b', 'alias-c'"));
    }

    // Text log: one line per request with route, status and token counts; never the key.
    let logged = |status: u16| {
        server.log.wait_line(Duration::from_secs(30), |l| {
            l.contains(" INFO request ")
                && l.contains("route=/v1/completions")
                && l.contains(&format!("status={status} "))
                && (status != 200 || (l.contains("prompt_tokens=5 ") && l.contains("completion_tokens=1 ")))
        })
    };
    assert!(logged(200).is_some(), "{:?}", server.log.lines());
    assert!(logged(404).is_some(), "{:?}", server.log.lines());
    // Five completions: two answered, three refused.
    let is_completion = |l: &str| l.contains(" INFO request ") && l.contains("route=/v1/completions");
    let start = Instant::now();
    while server.log.lines().iter().filter(|l| is_completion(l)).count() < 5 {
        assert!(start.elapsed() < Duration::from_secs(30), "{:?}", server.log.lines());
        std::thread::sleep(Duration::from_millis(20));
    }
    let lines = server.log.lines();
    assert_eq!(lines.iter().filter(|l| is_completion(l)).count(), 5, "{lines:?}");
    assert!(lines.iter().any(|l| l.contains("INFO") && l.contains("ready: http://")), "{lines:?}");
    assert!(!lines.iter().any(|l| l.contains("filekey")), "the key is never logged: {lines:?}");
}

#[test]
fn api_key_from_the_environment_and_its_precedence() {
    let env = [("STRATA_API_KEY", "envkey")];
    let Some(server) = Server::start(&[], &env, "listening") else { return };
    for (key, want) in [("envkey", 200), ("wrong", 401)] {
        let (status, _) = server.call("GET", "/v1/models", None, &[("Authorization", &format!("Bearer {key}"))]);
        assert_eq!(status, want, "{key}");
    }
    drop(server);
    // --api-key beats the file, which beats the environment.
    let dir = tempfile::tempdir().expect("tempdir");
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, "filekey").expect("writes");
    let file = key_file.to_str().expect("utf-8");
    let cases: [(&[&str], &str); 2] =
        [(&["--api-key-file", file], "filekey"), (&["--api-key", "flagkey", "--api-key-file", file], "flagkey")];
    for (args, good) in cases {
        let Some(server) = Server::start(args, &env, "listening") else { return };
        for key in ["envkey", "filekey", "flagkey"] {
            let (status, _) = server.call("GET", "/v1/models", None, &[("Authorization", &format!("Bearer {key}"))]);
            assert_eq!(status, if key == good { 200 } else { 401 }, "{args:?}: {key}");
        }
    }

    // An empty or unreadable key file, or an empty variable, is an error, not an open server.
    let Some(model) = strata_tests::smollm2() else { return };
    std::fs::write(&key_file, " \n").expect("writes");
    let missing = dir.path().join("missing");
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 3] = [
        (&["--api-key-file", file], &[], "is empty"),
        (&["--api-key-file", missing.to_str().expect("utf-8")], &[], "reading the API key file"),
        (&[], &[("STRATA_API_KEY", "")], "STRATA_API_KEY is set but empty"),
    ];
    for (args, env, says) in cases {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_strata-run"))
            .args(["serve", "--pack", model.to_str().expect("utf-8"), "--port", "0"])
            .args(strata_tests::behaviour_backend())
            .args(args)
            .envs(env.iter().copied())
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} {env:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?} {env:?}: {stderr}");
    }
}

#[test]
fn thinking_comes_back_as_reasoning_content_streamed_or_not_and_can_be_turned_off() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(pack) = strata_tests::pack_with_template(&dir.path().join("thinking.gguf"), THINKING_TEMPLATE) else {
        return;
    };
    let Some(server) = Server::start_pack(&pack, &["--parallel", "1"], "ready") else { return };
    let ask = |extra: Value| {
        let mut req =
            json!({ "messages": [{ "role": "user", "content": "2 + 2?" }], "max_tokens": 8, "temperature": 0 });
        req.as_object_mut().expect("object").extend(extra.as_object().expect("object").clone());
        req
    };
    // The prompt opened the block, and random weights never close it: all reasoning.
    let (status, v) = server.post("/v1/chat/completions", &ask(json!({})));
    assert_eq!(status, 200, "{v}");
    let message = &v["choices"][0]["message"];
    let reasoning = message["reasoning_content"].as_str().expect("reasoning_content").to_owned();
    assert!(!reasoning.is_empty(), "{v}");
    assert_eq!(message["content"], "", "{v}");

    // Streamed: the same text in reasoning_content deltas, no content.
    let streamed = ask(json!({ "stream": true }));
    let deltas: Vec<Value> = server
        .stream("/v1/chat/completions", &streamed)
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .map(|c| c["choices"][0]["delta"].clone())
        .collect();
    let joined: String = deltas.iter().filter_map(|d| d["reasoning_content"].as_str()).collect();
    assert_eq!(joined, reasoning);
    let content: String = deltas.iter().filter_map(|d| d["content"].as_str()).collect();
    assert_eq!(content, "", "{deltas:?}");

    // enable_thinking false reaches the template: the block is closed in the prompt, so
    // the reply is content; so it is with reasoning_format "none" (the text as written).
    for off in [json!({ "chat_template_kwargs": { "enable_thinking": false } }), json!({ "enable_thinking": false })] {
        let (status, v) = server.post("/v1/chat/completions", &ask(off.clone()));
        assert_eq!(status, 200, "{v}");
        assert!(v["choices"][0]["message"].get("reasoning_content").is_none(), "{off}: {v}");
        assert!(!v["choices"][0]["message"]["content"].as_str().unwrap_or_default().is_empty(), "{off}: {v}");
    }
    let (_, v) = server.post("/v1/chat/completions", &ask(json!({ "reasoning_format": "none" })));
    assert!(v["choices"][0]["message"].get("reasoning_content").is_none(), "{v}");
    let raw = v["choices"][0]["message"]["content"].as_str().expect("content");
    assert_eq!(raw.trim_start(), reasoning, "the same text, untouched");
    let (status, v) = server.post("/v1/chat/completions", &ask(json!({ "reasoning_format": "yes" })));
    assert_eq!((status, v["error"]["param"].as_str()), (400, Some("reasoning_format")), "{v}");
}
