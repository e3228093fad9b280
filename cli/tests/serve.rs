//! `strata-run serve` over a real socket, on the CPU with the default model: the
//! OpenAI-compatible routes, streaming, exact usage, stop strings, concurrency,
//! cancellation by disconnect, authentication, health during load, and a 4xx with an
//! OpenAI-style error for every kind of bad input.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A running server, killed on drop.
struct Server {
    child: Child,
    client: Client,
    lines: std::sync::mpsc::Receiver<String>,
}

/// Talks HTTP/1.1 to the server.
#[derive(Clone, Copy)]
struct Client {
    port: u16,
}

impl std::ops::Deref for Server {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts `strata-run serve` on a free port and waits for `wait_for` (`listening` or `ready`).
    fn start(extra: &[&str], env: &[(&str, &str)], wait_for: &str) -> Option<Server> {
        let model = strata_tests::smollm2()?;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_strata-run"));
        cmd.args([
            "serve",
            "--pack",
            model.to_str().expect("utf-8"),
            "--backend",
            "cpu",
            "--port",
            "0",
            "--ctx",
            "256",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("starts");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut server = Server { child, client: Client { port: 0 }, lines };
        server.wait_for("listening");
        if wait_for == "ready" {
            server.wait_for("ready");
        }
        Some(server)
    }

    fn wait_for(&mut self, what: &str) {
        let line = self.lines.recv_timeout(Duration::from_secs(120)).expect("the server says what it does");
        assert!(line.starts_with(what), "expected {what}, got {line}");
        let port = line.rsplit(':').next().and_then(|p| p.trim_end_matches("/v1").parse().ok()).expect("a port");
        self.client.port = port;
    }
}

impl Client {
    fn call(&self, method: &str, path: &str, body: Option<&str>, headers: &[(&str, &str)]) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connects");
        s.set_read_timeout(Some(Duration::from_secs(300))).expect("timeout");
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        if let Some(b) = body {
            req.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()));
        }
        req.push_str("\r\n");
        req.push_str(body.unwrap_or(""));
        s.write_all(req.as_bytes()).expect("sends");
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).expect("reads");
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = raw.split_once("\r\n\r\n").expect("a response");
        let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("a status");
        let body =
            if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(body) } else { body.into() };
        (status, body)
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = self.call("POST", path, Some(&body.to_string()), &[]);
        (status, serde_json::from_str(&text).unwrap_or_else(|_| panic!("JSON body: {text}")))
    }

    /// The `data:` payloads of a streamed response.
    fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let (status, text) = self.call("POST", path, Some(&body.to_string()), &[]);
        assert_eq!(status, 200, "{text}");
        text.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_owned).collect()
    }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

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
    assert_eq!(v["usage"], json!({ "prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9 }));
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
        ("/v1/completions", json!({ "prompt": PROMPT, "model": "gpt-9" }).to_string(), 404, "does not exist"),
        ("/v1/nothing", "{}".into(), 404, "no such route"),
    ];
    for (path, body, want, says) in cases {
        let (status, text) = server.call("POST", path, Some(&body), &[]);
        assert_eq!(status, want, "{path} {body}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{body}: JSON error body, got {text}"));
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{body}: {message}");
        assert!(v["error"]["type"].is_string(), "{text}");
    }
    let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(5 << 20));
    let (status, _) = server.call("POST", "/v1/completions", Some(&big), &[]);
    assert_eq!(status, 413, "a body over the limit");
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
}
