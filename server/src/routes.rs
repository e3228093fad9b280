//! HTTP routes: health, metrics, models, chat and plain completions (JSON or SSE), with
//! bearer authentication on `/v1/*` and `/metrics`, a body size limit, and every error
//! (404, 405, 413, 503 included) a JSON body in OpenAI's shape.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Extension, Path, Request as HttpRequest, State as Extract};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::State;
use crate::api::{self, ApiError};
use crate::engine::{Event, Finish, Job, TokenLogprob};
use crate::observe::{self, Trace};
use crate::prompt;
use crate::reasoning::{self, Split, Splitter};

type Shared = Arc<State>;

/// The application.
pub(crate) fn router(state: Shared, body_limit: usize) -> Router {
    let keyed = Router::new()
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&state), authorize));
    Router::new()
        .route("/health", get(health))
        .merge(keyed)
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such route", None) })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "this route does not take that method", None)
        })
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn(observe::observe))
        .with_state(state)
}

/// Whether `header` is `Bearer KEY` (the scheme in any case, as RFC 7235 has it), the
/// key compared in constant time so that timing does not reveal how much of it matched.
fn bearer_matches(header: Option<&str>, key: &str) -> bool {
    let Some((scheme, given)) = header.and_then(|h| h.trim().split_once(' ')) else { return false };
    scheme.eq_ignore_ascii_case("bearer") && bool::from(given.trim().as_bytes().ct_eq(key.as_bytes()))
}

async fn authorize(Extract(state): Extract<Shared>, request: HttpRequest, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let given = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        if !bearer_matches(given, key) {
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

fn model_json(id: &str) -> Value {
    json!({ "id": id, "object": "model", "created": 0, "owned_by": "strata" })
}

async fn models(Extract(state): Extract<Shared>) -> Response {
    let data: Vec<Value> = state.model_ids.iter().map(|id| model_json(id)).collect();
    Json(json!({ "object": "list", "data": data })).into_response()
}

/// 404 for a model this server does not serve.
fn model_not_found(state: &State, id: &str) -> ApiError {
    let served: Vec<String> = state.model_ids.iter().map(|m| format!("'{m}'")).collect();
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!("the model '{id}' does not exist; this server serves {}", served.join(", ")),
        param: Some("model".into()),
        code: Some("model_not_found"),
    }
}

async fn model(Extract(state): Extract<Shared>, Path(id): Path<String>) -> Response {
    if state.model_ids.contains(&id) {
        return Json(model_json(&id)).into_response();
    }
    model_not_found(&state, &id).into_response()
}

async fn chat_completions(
    Extract(state): Extract<Shared>,
    Extension(trace): Extension<Arc<Trace>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    complete(state, trace, body, true).await.unwrap_or_else(IntoResponse::into_response)
}

async fn completions(
    Extract(state): Extract<Shared>,
    Extension(trace): Extension<Arc<Trace>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    complete(state, trace, body, false).await.unwrap_or_else(IntoResponse::into_response)
}

/// 503 for a full queue: the client may retry after a second.
fn busy() -> Response {
    let mut response =
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is busy: every slot and queue place is taken", None)
            .into_response();
    response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    response
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Admits a request (or answers 503), then parses, validates and tokenizes it on a
/// blocking thread, queues it, and answers with JSON or SSE.
async fn complete(
    state: Shared,
    trace: Arc<Trace>,
    body: Result<Bytes, BytesRejection>,
    chat: bool,
) -> Result<Response, ApiError> {
    let body = body?;
    let Some(ready) = state.ready.get() else {
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "loading the model", None));
    };
    let Ok(admission) = Arc::clone(&state.admission).try_acquire_owned() else {
        return Ok(busy());
    };
    let shared = Arc::clone(&state);
    let prepared = tokio::task::spawn_blocking(move || prepare(&shared, &body, chat))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("preparing the request: {e}"), None))?;
    let (req, prompt, max_tokens, thinking) = prepared?;
    let (events, rx) = unbounded_channel();
    let job = Job {
        prompt,
        max_tokens,
        sampler: req.sampler,
        stop: req.stop,
        logprobs: req.logprobs,
        events,
        admission,
        received: trace.start,
    };
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
        // The name the client asked for (one of ours, or any without --served-model-name,
        // as llama.cpp echoes it); else the first.
        model: req
            .model
            .filter(|m| !state.strict_model || state.model_ids.contains(m))
            .unwrap_or_else(|| state.model_ids[0].clone()),
        created: now(),
        chat,
        logprobs: req.logprobs.is_some(),
        thinking,
    };
    if req.stream {
        Ok(stream(reply, rx, req.include_usage, trace).into_response())
    } else {
        whole(reply, rx, &trace).await
    }
}

/// Parses and validates a request and reads its prompt into tokens: the prompt's bytes
/// are bounded before the template and the tokenizer run, its tokens after. Returns the
/// request, the prompt tokens, the most tokens to generate and, where the reply's thinking
/// is split off, whether the prompt opened it. Runs on a blocking thread: tokenizing a
/// long prompt takes a while.
fn prepare(state: &State, body: &[u8], chat: bool) -> Result<(api::Request, Vec<u32>, usize, Option<bool>), ApiError> {
    let Some(ready) = state.ready.get() else {
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "loading the model", None));
    };
    let req = api::parse(body, chat)?;
    if let Some(m) = &req.model
        && state.strict_model
        && !state.model_ids.contains(m)
    {
        return Err(model_not_found(state, m));
    }
    let t = &ready.tokenizer;
    if let Some((id, _)) = req.sampler.logit_bias.iter().find(|(id, _)| *id as usize >= t.vocab_size()) {
        return Err(ApiError::field(
            "logit_bias",
            format!("token {id} is not in the vocabulary of {} tokens", t.vocab_size()),
        ));
    }
    let param = if chat { "messages" } else { "prompt" };
    let bytes = if chat { req.messages.iter().map(|m| m.content.len()).sum() } else { req.prompt.len() };
    prompt::check_bytes(param, bytes, ready.max_prompt_bytes, ready.n_ctx)?;
    let (prompt, opened) = if chat {
        prompt::chat_tokens(t, &req.messages, &req.template_kwargs)?
    } else {
        (t.encode(&req.prompt, state.parse_special), false)
    };
    let thinks = chat && req.split_reasoning && t.chat_template().is_some_and(reasoning::template_thinks);
    let (n_ctx, len) = (ready.n_ctx as usize, prompt.len());
    if prompt.is_empty() {
        return Err(ApiError::field(param, "the prompt has no tokens"));
    }
    if len >= n_ctx {
        return Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::field(param, format!("the prompt ({len} tokens) fills the context of {n_ctx} tokens"))
        });
    }
    let max_tokens = match req.max_tokens {
        Some(m) if len + m > n_ctx => {
            return Err(ApiError::field(
                "max_tokens",
                format!("the prompt ({len} tokens) and max_tokens ({m}) exceed the context of {n_ctx} tokens"),
            ));
        }
        Some(m) => m,
        None => n_ctx - len,
    };
    Ok((req, prompt, max_tokens, thinks.then_some(opened)))
}

/// What every response of one request shares.
struct Reply {
    id: String,
    model: String,
    created: u64,
    chat: bool,
    logprobs: bool,
    /// Thinking split off into `reasoning_content`: whether the prompt opened it.
    thinking: Option<bool>,
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

    /// One streamed piece of text (a chat reply's thinking and answer) and its
    /// log-probabilities.
    fn chunk(&self, split: &Split, logprobs: &[TokenLogprob], finish: Option<Finish>) -> Value {
        let (text, finish) = (split.content.as_str(), finish.map(Finish::name));
        let lp = self.logprobs.then(|| logprobs_json(self.chat, logprobs));
        let choice = if self.chat {
            let mut delta = json!({});
            if !split.reasoning.is_empty() {
                delta["reasoning_content"] = json!(split.reasoning);
            }
            if !text.is_empty() || (finish.is_none() && split.reasoning.is_empty()) {
                delta["content"] = json!(text);
            }
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
async fn whole(reply: Reply, mut rx: UnboundedReceiver<Event>, trace: &Trace) -> Result<Response, ApiError> {
    trace.finish("disconnected"); // logged so if the client goes away before the answer
    let (mut text, mut lps) = (String::new(), Vec::new());
    while let Some(event) = rx.recv().await {
        match event {
            Event::Token { text: piece, logprob } => {
                text.push_str(&piece);
                lps.extend(logprob);
            }
            Event::Done { finish, prompt_tokens, completion_tokens, ttft } => {
                trace.done(prompt_tokens, completion_tokens, ttft, finish.name());
                let lp = reply.logprobs.then(|| logprobs_json(reply.chat, &lps));
                let choice = if reply.chat {
                    let mut message = json!({ "role": "assistant", "content": text });
                    if let Some(opened) = reply.thinking {
                        let mut splitter = Splitter::new(opened);
                        let (head, tail) = (splitter.push(&text), splitter.finish());
                        message["content"] = json!(head.content + &tail.content);
                        let reasoning = head.reasoning + &tail.reasoning;
                        if !reasoning.is_empty() {
                            message["reasoning_content"] = json!(reasoning);
                        }
                    }
                    json!({ "index": 0, "message": message, "logprobs": lp, "finish_reason": finish.name() })
                } else {
                    json!({ "index": 0, "text": text, "logprobs": lp, "finish_reason": finish.name() })
                };
                let mut body = reply.envelope(false, json!([choice]));
                body["usage"] = usage(prompt_tokens, completion_tokens);
                return Ok(Json(body).into_response());
            }
            Event::Error(e) => {
                trace.finish("error");
                return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e, None));
            }
        }
    }
    Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the engine dropped the request", None))
}

/// Streams the generation as server-sent events ending with `[DONE]`. A client that
/// goes away closes the stream, which drops the engine's channel and so the request.
/// The request is logged when the task ends (it holds the last reference to `trace`).
fn stream(reply: Reply, mut rx: UnboundedReceiver<Event>, include_usage: bool, trace: Arc<Trace>) -> impl IntoResponse {
    let (tx, out) = unbounded_channel::<Result<SseEvent, Infallible>>();
    tokio::spawn(async move {
        let send = |v: Value| tx.send(Ok(SseEvent::default().data(v.to_string()))).is_ok();
        trace.finish("disconnected"); // until the engine says otherwise
        let mut splitter = reply.thinking.map(Splitter::new);
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
                    let split = match splitter.as_mut() {
                        Some(s) => s.push(&text),
                        None => Split { reasoning: String::new(), content: text },
                    };
                    let some = !split.reasoning.is_empty() || !split.content.is_empty() || logprob.is_some();
                    if some && !send(reply.chunk(&split, logprob.as_slice(), None)) {
                        return;
                    }
                }
                Some(Event::Done { finish, prompt_tokens, completion_tokens, ttft }) => {
                    trace.done(prompt_tokens, completion_tokens, ttft, finish.name());
                    let rest = splitter.as_mut().map(Splitter::finish).unwrap_or_default();
                    send(reply.chunk(&rest, &[], Some(finish)));
                    if include_usage {
                        let mut last = reply.envelope(true, json!([]));
                        last["usage"] = usage(prompt_tokens, completion_tokens);
                        send(last);
                    }
                    break;
                }
                Some(Event::Error(e)) => {
                    trace.finish("error");
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
