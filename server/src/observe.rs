//! Request ids and the request log: every request gets an id (the client's `x-request-id`
//! when it is sane, else a new one), returned as `x-request-id`, and one `info` event
//! with target `strata_server::request` when it is over: id, method, route, status, and
//! for generations the engine's token counts, time to first token and finish reason. A
//! streamed response is logged when its stream ends (the event's `duration_ms` is then
//! the whole stream's).

use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

/// The request id header.
pub(crate) static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// One request, logged when the last reference to it is dropped: by the middleware once
/// the response is built, or by a stream's task once the stream has ended.
pub(crate) struct Trace {
    /// The request id.
    pub id: String,
    method: Method,
    route: String,
    /// When the request arrived.
    pub start: Instant,
    outcome: Mutex<Outcome>,
}

#[derive(Default)]
struct Outcome {
    status: Option<u16>,
    prompt_tokens: Option<usize>,
    completion_tokens: Option<usize>,
    ttft: Option<Duration>,
    finish: Option<&'static str>,
}

impl Trace {
    /// The engine's closing counts of a generation.
    pub fn done(&self, prompt_tokens: usize, completion_tokens: usize, ttft: Option<Duration>, finish: &'static str) {
        if let Ok(mut o) = self.outcome.lock() {
            o.prompt_tokens = Some(prompt_tokens);
            o.completion_tokens = Some(completion_tokens);
            o.ttft = ttft;
            o.finish = Some(finish);
        }
    }

    /// How a generation ended when it did not end with the engine's counts (`error`).
    pub fn finish(&self, finish: &'static str) {
        if let Ok(mut o) = self.outcome.lock() {
            o.finish = Some(finish);
        }
    }

    fn status(&self, status: StatusCode) {
        if let Ok(mut o) = self.outcome.lock() {
            o.status = Some(status.as_u16());
        }
    }
}

/// Milliseconds, to the microsecond.
fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

impl Drop for Trace {
    fn drop(&mut self) {
        let o = self.outcome.get_mut().map(std::mem::take).unwrap_or_default();
        tracing::info!(
            target: "strata_server::request",
            request_id = %self.id,
            method = %self.method,
            route = %self.route,
            status = o.status,
            prompt_tokens = o.prompt_tokens,
            completion_tokens = o.completion_tokens,
            ttft_ms = o.ttft.map(ms),
            duration_ms = ms(self.start.elapsed()),
            finish = o.finish,
            "request"
        );
    }
}

/// Whether a client's request id can be used as ours: 1 to 128 characters from a
/// conservative set, so that it cannot forge log lines or headers.
fn sane(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:/+=@".contains(&b))
}

/// A new request id: 16 hex digits, random per process and distinct per request.
fn new_id() -> String {
    static SEED: OnceLock<RandomState> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut h = SEED.get_or_init(RandomState::new).build_hasher();
    h.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
    format!("{:016x}", h.finish())
}

/// The middleware: gives the request its [`Trace`] (as an extension) and the response
/// its `x-request-id`.
pub(crate) async fn observe(mut request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|id| sane(id))
        .map_or_else(new_id, str::to_owned);
    let route = match request.extensions().get::<MatchedPath>() {
        Some(matched) => matched.as_str().to_owned(),
        // No route matched: the path as asked for, bounded.
        None => request.uri().path().chars().take(100).collect(),
    };
    let trace = Arc::new(Trace {
        id,
        method: request.method().clone(),
        route,
        start: Instant::now(),
        outcome: Mutex::default(),
    });
    request.extensions_mut().insert(Arc::clone(&trace));
    let mut response = next.run(request).await;
    trace.status(response.status());
    if let Ok(value) = HeaderValue::from_str(&trace.id) {
        response.headers_mut().insert(REQUEST_ID.clone(), value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_are_taken_only_when_sane() {
        assert!(sane("req-42_a.b:c"));
        assert!(!sane(""));
        assert!(!sane(&"a".repeat(129)));
        assert!(!sane("a b"));
        assert!(!sane("a\"b"));
        assert!(!sane("é"));
        let (a, b) = (new_id(), new_id());
        assert_ne!(a, b);
        assert_eq!(a.len(), 16);
        assert!(sane(&a));
    }
}
