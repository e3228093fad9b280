//! HTTP routes: health, metrics, models, chat and plain completions (JSON or SSE), with
//! bearer authentication on `/v1/*` and a body size limit.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request as HttpRequest, State as Extract};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use strata_runtime::chat;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::State;
use crate::api::{self, ApiError};
use crate::engine::{Event, Finish, Job, TokenLogprob};

type Shared = Arc<State>;

/// The application.
pub(crate) fn router(state: Shared, body_limit: usize) -> Router {
    let v1 = Router::new()
        .route("/models", get(models))
        .route("/chat/completions", post(chat_completions))
        .route("/completions", post(completions))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&state), authorize));
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .nest("/v1", v1)
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such route", None) })
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

async fn authorize(Extract(state): Extract<Shared>, request: HttpRequest, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let given = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        if given.and_then(|v| v.strip_prefix("Bearer ")) != Some(key.as_str()) {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "a valid API key is required (Authorization: Bearer KEY)",
                Some("invalid_api_key"),
            )
            .into_response();
        }
    }
    next.run(request).await
}

async fn health(Extract(state): Extract<Shared>) -> Response {
    if state.ready.get().is_some() {
        Json(json!({ "status": "ok" })).into_response()
    } else {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "loading the model", None).into_response()
    }
}

async fn metrics(Extract(state): Extract<Shared>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render()).into_response()
}

async fn models(Extract(state): Extract<Shared>) -> Response {
    Json(json!({ "object": "list", "data": [{
        "id": state.model_id, "object": "model", "created": 0, "owned_by": "strata",
    }]}))
    .into_response()
}

async fn chat_completions(Extract(state): Extract<Shared>, body: Bytes) -> Response {
    complete(state, body, true).await.unwrap_or_else(IntoResponse::into_response)
}

async fn completions(Extract(state): Extract<Shared>, body: Bytes) -> Response {
    complete(state, body, false).await.unwrap_or_else(IntoResponse::into_response)
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Parses, validates, tokenizes and queues a request; answers with JSON or SSE.
async fn complete(state: Shared, body: Bytes, chat: bool) -> Result<Response, ApiError> {
    let Some(ready) = state.ready.get() else {
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "loading the model", None));
    };
    let req = api::parse(&body, chat)?;
    if let Some(m) = &req.model
        && *m != state.model_id
    {
        return Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("the model '{m}' does not exist; this server serves '{}'", state.model_id),
            param: Some("model".into()),
            code: Some("model_not_found"),
        });
    }
    let t = &ready.tokenizer;
    let text = if chat {
        let template = t.chat_template().unwrap_or(chat::CHATML);
        let token = |id: Option<u32>| id.map(|i| t.token_text(i).to_owned()).unwrap_or_default();
        chat::render(template, &req.messages, true, &token(t.bos()), &token(t.eos()))
            .map_err(|e| ApiError::field("messages", format!("the chat template failed: {e}")))?
    } else {
        req.prompt.clone()
    };
    let prompt = t.encode(&text, true);
    let (n_ctx, len) = (ready.n_ctx as usize, prompt.len());
    if prompt.is_empty() {
        return Err(ApiError::field(if chat { "messages" } else { "prompt" }, "the prompt has no tokens"));
    }
    let max_tokens = match req.max_tokens {
        Some(m) if len + m > n_ctx => {
            return Err(ApiError::field(
                "max_tokens",
                format!("the prompt ({len} tokens) and max_tokens ({m}) exceed the context of {n_ctx} tokens"),
            ));
        }
        Some(m) => m,
        None if len >= n_ctx => {
            return Err(ApiError::field(
                "messages",
                format!("the prompt ({len} tokens) fills the context of {n_ctx} tokens"),
            ));
        }
        None => n_ctx - len,
    };
    let (events, rx) = unbounded_channel();
    let job = Job { prompt, max_tokens, sampler: req.sampler, stop: req.stop, logprobs: req.logprobs, events };
    ready
        .jobs
        .lock()
        .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the engine is gone", None))?
        .send(job)
        .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the engine has stopped", None))?;
    state.metrics.request();
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    let reply = Reply {
        id: if chat { format!("chatcmpl-{id}") } else { format!("cmpl-{id}") },
        model: state.model_id.clone(),
        created: now(),
        chat,
        logprobs: req.logprobs.is_some(),
    };
    if req.stream { Ok(stream(reply, rx, req.include_usage).into_response()) } else { whole(reply, rx).await }
}

/// What every response of one request shares.
struct Reply {
    id: String,
    model: String,
    created: u64,
    chat: bool,
    logprobs: bool,
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.chat, chunk) {
            (true, true) => "chat.completion.chunk",
            (true, false) => "chat.completion",
            (false, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({ "id": self.id, "object": self.object(chunk), "created": self.created, "model": self.model, "choices": choices })
    }

    /// One streamed piece of text (and its log-probabilities).
    fn chunk(&self, text: &str, logprobs: &[TokenLogprob], finish: Option<Finish>) -> Value {
        let finish = finish.map(Finish::name);
        let lp = self.logprobs.then(|| logprobs_json(self.chat, logprobs));
        let choice = if self.chat {
            let delta = if finish.is_some() && text.is_empty() { json!({}) } else { json!({ "content": text }) };
            json!({ "index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish })
        } else {
            json!({ "index": 0, "text": text, "logprobs": lp, "finish_reason": finish })
        };
        self.envelope(true, json!([choice]))
    }
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({ "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion })
}

fn logprobs_json(chat: bool, lps: &[TokenLogprob]) -> Value {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    if chat {
        let content: Vec<Value> = lps
            .iter()
            .map(|l| {
                let top: Vec<Value> =
                    l.top.iter().map(|(b, lp)| json!({ "token": text(b), "logprob": lp, "bytes": b })).collect();
                json!({ "token": text(&l.bytes), "logprob": l.logprob, "bytes": l.bytes, "top_logprobs": top })
            })
            .collect();
        json!({ "content": content })
    } else {
        let top: Vec<Value> =
            lps.iter().map(|l| Value::Object(l.top.iter().map(|(b, lp)| (text(b), json!(lp))).collect())).collect();
        json!({
            "tokens": lps.iter().map(|l| text(&l.bytes)).collect::<Vec<_>>(),
            "token_logprobs": lps.iter().map(|l| l.logprob).collect::<Vec<_>>(),
            "top_logprobs": top,
        })
    }
}

/// Waits for the whole generation and answers with one JSON object.
async fn whole(reply: Reply, mut rx: UnboundedReceiver<Event>) -> Result<Response, ApiError> {
    let (mut text, mut lps) = (String::new(), Vec::new());
    while let Some(event) = rx.recv().await {
        match event {
            Event::Token { text: piece, logprob } => {
                text.push_str(&piece);
                lps.extend(logprob);
            }
            Event::Done { finish, prompt_tokens, completion_tokens } => {
                let lp = reply.logprobs.then(|| logprobs_json(reply.chat, &lps));
                let choice = if reply.chat {
                    json!({ "index": 0, "message": { "role": "assistant", "content": text }, "logprobs": lp, "finish_reason": finish.name() })
                } else {
                    json!({ "index": 0, "text": text, "logprobs": lp, "finish_reason": finish.name() })
                };
                let mut body = reply.envelope(false, json!([choice]));
                body["usage"] = usage(prompt_tokens, completion_tokens);
                return Ok(Json(body).into_response());
            }
            Event::Error(e) => return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e, None)),
        }
    }
    Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the engine dropped the request", None))
}

/// Streams the generation as server-sent events ending with `[DONE]`. A client that
/// goes away closes the stream, which drops the engine's channel and so the request.
fn stream(reply: Reply, mut rx: UnboundedReceiver<Event>, include_usage: bool) -> impl IntoResponse {
    let (tx, out) = unbounded_channel::<Result<SseEvent, Infallible>>();
    tokio::spawn(async move {
        let send = |v: Value| tx.send(Ok(SseEvent::default().data(v.to_string()))).is_ok();
        if reply.chat {
            let first = reply.envelope(
                true,
                json!([{ "index": 0, "delta": { "role": "assistant", "content": "" }, "logprobs": null, "finish_reason": null }]),
            );
            if !send(first) {
                return;
            }
        }
        loop {
            let event = tokio::select! {
                e = rx.recv() => e,
                () = tx.closed() => return,
            };
            match event {
                Some(Event::Token { text, logprob }) => {
                    if (!text.is_empty() || logprob.is_some()) && !send(reply.chunk(&text, logprob.as_slice(), None)) {
                        return;
                    }
                }
                Some(Event::Done { finish, prompt_tokens, completion_tokens }) => {
                    send(reply.chunk("", &[], Some(finish)));
                    if include_usage {
                        let mut last = reply.envelope(true, json!([]));
                        last["usage"] = usage(prompt_tokens, completion_tokens);
                        send(last);
                    }
                    break;
                }
                Some(Event::Error(e)) => {
                    send(json!({ "error": { "message": e, "type": "server_error", "param": null, "code": null } }));
                    break;
                }
                None => break,
            }
        }
        let _ = tx.send(Ok(SseEvent::default().data("[DONE]")));
    });
    Sse::new(UnboundedReceiverStream::new(out))
}
