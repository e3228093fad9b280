//! The harness of the server tests: `strata-run serve` started on a free port on the CPU
//! with the default model, its log (stderr) kept line by line, and a minimal HTTP/1.1
//! client over a raw socket.

#![allow(dead_code)] // each test binary uses part of it

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A thinking template in the Qwen3 style: the generation prompt opens a `<think>` block,
/// or with `enable_thinking` false closes an empty one, as Qwen3's own template does.
pub const THINKING_TEMPLATE: &str = "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}";

/// A running server, killed on drop.
pub struct Server {
    pub child: Child,
    pub client: Client,
    /// The server's log: every line of its standard error so far.
    pub log: Log,
}

/// Lines of a server's standard error, as they come (each also echoed to the test's own
/// standard error, which the test runner shows when a test fails).
#[derive(Clone, Default)]
pub struct Log(Arc<(Mutex<Vec<String>>, Condvar)>);

impl Log {
    fn push(&self, line: String) {
        eprintln!("server: {line}");
        let (lines, more) = &*self.0;
        lines.lock().expect("log").push(line);
        more.notify_all();
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<String> {
        self.0.0.lock().expect("log").clone()
    }

    /// The first line (from the start) that satisfies `want`, waiting up to `timeout`.
    pub fn wait_line(&self, timeout: Duration, want: impl Fn(&str) -> bool) -> Option<String> {
        let (lines, more) = &*self.0;
        let deadline = Instant::now() + timeout;
        let mut lines = lines.lock().expect("log");
        loop {
            if let Some(line) = lines.iter().find(|l| want(l)) {
                return Some(line.clone());
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            lines = more.wait_timeout(lines, left).expect("log").0;
        }
    }

    /// The lines that are JSON objects (with `--log-format json`).
    pub fn json(&self) -> Vec<Value> {
        self.lines().iter().filter_map(|l| serde_json::from_str::<Value>(l).ok()).filter(Value::is_object).collect()
    }
}

/// Talks HTTP/1.1 to the server.
#[derive(Clone, Copy)]
pub struct Client {
    pub port: u16,
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
    pub fn start(extra: &[&str], env: &[(&str, &str)], wait_for: &str) -> Option<Server> {
        Server::launch(&strata_tests::smollm2()?, extra, env, wait_for)
    }

    /// [`Server::start`] on another pack.
    pub fn start_pack(model: &std::path::Path, extra: &[&str], wait_for: &str) -> Option<Server> {
        Server::launch(model, extra, &[], wait_for)
    }

    fn launch(model: &std::path::Path, extra: &[&str], env: &[(&str, &str)], wait_for: &str) -> Option<Server> {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_strata-run"));
        cmd.args(["serve", "--pack", model.to_str().expect("utf-8"), "--port", "0"])
            .args(if extra.contains(&"--backend") { &[][..] } else { strata_tests::behaviour_backend() })
            .args(if extra.contains(&"--ctx") { &[][..] } else { &["--ctx", "256"][..] })
            .args(extra)
            .env_remove("RUST_LOG")
            .env_remove("STRATA_API_KEY")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("starts");
        let stderr = child.stderr.take().expect("stderr");
        let log = Log::default();
        let writer = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                writer.push(line);
            }
        });
        let mut server = Server { child, client: Client { port: 0 }, log };
        server.wait_for("listening");
        if wait_for == "ready" {
            server.wait_for("ready");
        }
        Some(server)
    }

    /// Waits for the log line `WHAT: http://HOST:PORT...` (text or JSON) and takes its port.
    pub fn wait_for(&mut self, what: &str) {
        let marker = format!("{what}: http://");
        let line = self.log.wait_line(Duration::from_secs(120), |l| l.contains(&marker)).unwrap_or_else(|| {
            panic!("the server never logged {what}: {:?}", self.log.lines());
        });
        let url = &line[line.find(&marker).expect("marker") + marker.len()..];
        let authority: String = url.chars().take_while(|c| c.is_ascii_alphanumeric() || ".:[]".contains(*c)).collect();
        self.client.port = authority.rsplit(':').next().and_then(|p| p.parse().ok()).expect("a port");
    }
}

impl Client {
    pub fn call(&self, method: &str, path: &str, body: Option<&str>, headers: &[(&str, &str)]) -> (u16, String) {
        let (status, _, body) = self.exchange(method, path, body, headers);
        (status, body)
    }

    /// One request on its own connection: the status, the head (lowercased) and the body.
    pub fn exchange(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> (u16, String, String) {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        if let Some(b) = body {
            req.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()));
        }
        req.push_str("\r\n");
        req.push_str(body.unwrap_or(""));
        self.exchange_raw(&req)
    }

    /// Writes `request` as it is on its own connection: the status, the head (lowercased)
    /// and the body.
    pub fn exchange_raw(&self, request: &str) -> (u16, String, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connects");
        s.set_read_timeout(Some(Duration::from_secs(300))).expect("timeout");
        s.write_all(request.as_bytes()).expect("sends");
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).expect("reads");
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = raw.split_once("\r\n\r\n").expect("a response");
        let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("a status");
        let head = head.to_ascii_lowercase();
        let body = if head.contains("transfer-encoding: chunked") { dechunk(body) } else { body.into() };
        (status, head, body)
    }

    /// The value of the Prometheus metric `strata_NAME`.
    pub fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.call("GET", "/metrics", None, &[]);
        let line = text.lines().find(|l| l.starts_with(&format!("strata_{name} "))).expect(name);
        line.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("a number")
    }

    /// Polls `/metrics` until `strata_NAME` is `value` (a minute at most).
    pub fn wait_metric(&self, name: &str, value: f64) {
        let start = std::time::Instant::now();
        while self.metric(name) != value {
            assert!(start.elapsed() < Duration::from_secs(60), "strata_{name} never became {value}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends a request on a new connection and returns the connection unread.
    pub fn send(&self, path: &str, body: &Value) -> TcpStream {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connects");
        s.set_read_timeout(Some(Duration::from_secs(300))).expect("timeout");
        let body = body.to_string();
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).expect("sends");
        s
    }

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = self.call("POST", path, Some(&body.to_string()), &[]);
        (status, serde_json::from_str(&text).unwrap_or_else(|_| panic!("JSON body: {text}")))
    }

    /// The `data:` payloads of a streamed response.
    pub fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let (status, text) = self.call("POST", path, Some(&body.to_string()), &[]);
        assert_eq!(status, 200, "{text}");
        text.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_owned).collect()
    }
}

pub fn dechunk(mut body: &str) -> String {
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
