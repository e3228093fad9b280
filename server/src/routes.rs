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

use crate::api::{self, ApiError, ToolChoice};
use crate::engine::{Event, Finish, Job, TokenLogprob};
use crate::observe::{self, Trace};
use crate::prompt;
use crate::reasoning::{self, Split, Splitter};
use crate::reply_grammar::{self, Answer, Thinking};
use crate::tool_calls::{self, Parsed, ToolCall, ToolFormat, ToolStream};
use crate::{Ready, State};
use strata_runtime::constrain::Constraint;

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
        .layer(middleware::from_fn_with_state(body_limit, refuse_declared_oversize))
        .layer(middleware::from_fn(observe::observe))
        .with_state(state)
}

/// 413 at once for a body whose Content-Length is over the limit, without reading it
/// (the body limit alone reads up to the limit first, then closes on a client still sending).
async fn refuse_declared_oversize(Extract(limit): Extract<usize>, request: HttpRequest, next: Next) -> Response {
    let declared = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return ApiError::body_too_large().into_response();
    }
    next.run(request).await
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
    let Prepared { req, prompt, max_tokens, thinking, tools, constraint } = prepared?;
    let (events, rx) = unbounded_channel();
    let job = Job {
        prompt,
        max_tokens,
        sampler: req.sampler,
        stop: req.stop,
        logprobs: req.logprobs,
        constraint,
        cache_prompt: req.cache_prompt,
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
        tools: tools.map(|format| (format, req.tools, format!("call_{id}_"))),
    };
    if req.stream {
        Ok(stream(reply, rx, req.include_usage, trace).into_response())
    } else {
        whole(reply, rx, &trace).await
    }
}

/// A request read, checked and tokenized.
struct Prepared {
    req: api::Request,
    prompt: Vec<u32>,
    /// The most tokens to generate.
    max_tokens: usize,
    /// Where the reply's thinking is split off: whether the prompt opened it.
    thinking: Option<bool>,
    /// The format the reply's tool calls are read in, when tools were offered.
    tools: Option<ToolFormat>,
    /// The grammar the reply follows (`response_format`, a forced tool call).
    constraint: Option<Constraint>,
}

/// Parses and validates a request, reads its prompt into tokens (the prompt's bytes are
/// bounded before the template and the tokenizer run, its tokens after) and compiles its
/// grammar, if any. Runs on a blocking thread: tokenizing a long prompt and compiling a
/// schema take a while.
fn prepare(state: &State, body: &[u8], chat: bool) -> Result<Prepared, ApiError> {
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
    // Tools are shown to the model only when it may call them, and only where the
    // template says how it writes a call, so that the call can be read back.
    let tools = match req.tool_choice {
        ToolChoice::None => None,
        _ => Some(t.chat_template().and_then(ToolFormat::detect).ok_or_else(|| {
            ApiError::field(
                "tools",
                "this pack's chat template writes no tool calls strata can read (it knows Qwen/Hermes \
                 <tool_call> JSON, Qwen3-Coder's <function=...> blocks and Llama 3 JSON)",
            )
        })?),
    };
    let (prompt, opened) = if chat {
        let shown = if tools.is_some() { &req.tools[..] } else { &[] };
        prompt::chat_tokens(t, &req.messages, &req.template_kwargs, shown)?
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
    // The KV pool must hold the prompt and every token the request may generate.
    let (kv, most) = (ready.kv, ready.kv.most());
    if len >= most {
        return Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::field(
                param,
                format!(
                    "the prompt ({len} tokens) fills the KV cache pool, which holds {most} tokens a request (--kv-budget)"
                ),
            )
        });
    }
    let max_tokens = match req.max_tokens {
        Some(m) if len + m > n_ctx => {
            return Err(ApiError::field(
                "max_tokens",
                format!("the prompt ({len} tokens) and max_tokens ({m}) exceed the context of {n_ctx} tokens"),
            ));
        }
        Some(m) if len + m > most => {
            return Err(ApiError::field(
                "max_tokens",
                format!(
                    "the prompt ({len} tokens) and max_tokens ({m}) need {} tokens of KV cache; the pool holds {most} a request (--kv-budget)",
                    len + m
                ),
            ));
        }
        Some(m) => m,
        // Up to the slot's share of the pool, or the whole pool where the prompt needs it.
        None if len < kv.share() => kv.share() - len,
        None => most - len,
    };
    // A reasoning model thinks before the answer a grammar constrains.
    let thinking = match (chat && opened, chat && t.chat_template().is_some_and(reasoning::template_thinks)) {
        (true, _) => Thinking::Opened,
        (false, true) => Thinking::May,
        (false, false) => Thinking::None,
    };
    let constraint = constraint(ready, &req, tools, thinking)?;
    Ok(Prepared { prompt, max_tokens, thinking: thinks.then_some(opened), tools, constraint, req })
}

/// The grammar a request's reply must follow: its `response_format` schema, or its
/// forced tool calls in the template's format; after the thinking block, if any.
fn constraint(
    ready: &Ready,
    req: &api::Request,
    tools: Option<ToolFormat>,
    thinking: Thinking,
) -> Result<Option<Constraint>, ApiError> {
    let only = match &req.tool_choice {
        ToolChoice::Function(name) => Some(name.as_str()),
        _ => None,
    };
    let (param, answer) = match (&req.json_schema, &req.tool_choice, tools) {
        (Some(schema), ..) => ("response_format", Answer::Json(schema)),
        (None, ToolChoice::Required | ToolChoice::Function(_), Some(format)) => {
            let several = req.parallel_tool_calls && only.is_none();
            ("tool_choice", Answer::Calls { format, tools: &req.tools, only, several })
        }
        _ => return Ok(None),
    };
    let Some(grammars) = &ready.grammars else {
        return Err(ApiError::field(
            param,
            format!("'{param}' cannot be enforced: this pack has no end-of-generation token"),
        ));
    };
    let grammar = reply_grammar::grammar(&answer, thinking);
    let built = grammars.lark(&grammar);
    built.map(Some).map_err(|e| ApiError::field(param, format!("'{param}' cannot be enforced: {e}")))
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
    /// Tool calls read out of the reply: their format, the request's tools and the prefix
    /// of the calls' ids.
    tools: Option<(ToolFormat, Vec<Value>, String)>,
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

    /// A stream that reads this reply's tool calls, if tools were offered.
    fn tool_stream(&self) -> Option<ToolStream> {
        self.tools.as_ref().map(|(format, tools, prefix)| ToolStream::new(*format, tools.clone(), prefix.clone()))
    }

    /// One streamed piece of a reply (a chat reply's thinking, answer and tool calls, the
    /// first of them numbered `first_call`) and its log-probabilities; `finish` is the
    /// OpenAI name.
    fn chunk(
        &self,
        split: &Split,
        calls: &[ToolCall],
        first_call: usize,
        logprobs: &[TokenLogprob],
        finish: Option<&str>,
    ) -> Value {
        let text = split.content.as_str();
        let lp = self.logprobs.then(|| logprobs_json(self.chat, logprobs));
        let choice = if self.chat {
            let mut delta = json!({});
            if !split.reasoning.is_empty() {
                delta["reasoning_content"] = json!(split.reasoning);
            }
            if !text.is_empty() || (finish.is_none() && split.reasoning.is_empty() && calls.is_empty()) {
                delta["content"] = json!(text);
            }
            if !calls.is_empty() {
                let calls: Vec<Value> =
                    calls.iter().enumerate().map(|(i, c)| call_json(c, Some(first_call + i))).collect();
                delta["tool_calls"] = json!(calls);
            }
            json!({ "index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish })
        } else {
            json!({ "index": 0, "text": text, "logprobs": lp, "finish_reason": finish })
        };
        self.envelope(true, json!([choice]))
    }
}

/// An OpenAI `tool_calls` entry (with its `index` in a streamed delta).
fn call_json(call: &ToolCall, index: Option<usize>) -> Value {
    let mut v =
        json!({ "id": call.id, "type": "function", "function": { "name": call.name, "arguments": call.arguments } });
    if let Some(i) = index {
        v["index"] = json!(i);
    }
    v
}

/// OpenAI's finish reason: "tool_calls" when a reply that ended by itself called tools.
fn finish_name(finish: Finish, called: bool) -> &'static str {
    if called && finish == Finish::Stop { "tool_calls" } else { finish.name() }
}

/// OpenAI's `usage`, with the prompt tokens a slot's cache held (`cached_tokens`).
fn usage(prompt: usize, cached: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": { "cached_tokens": cached },
    })
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
            Event::Done { finish, prompt_tokens, cached_tokens, completion_tokens, ttft } => {
                trace.done(prompt_tokens, completion_tokens, ttft, finish.name());
                let lp = reply.logprobs.then(|| logprobs_json(reply.chat, &lps));
                let choice = if reply.chat {
                    let (mut content, mut reasoning) = (text, String::new());
                    if let Some(opened) = reply.thinking {
                        let mut splitter = Splitter::new(opened);
                        let (head, tail) = (splitter.push(&content), splitter.finish());
                        content = head.content + &tail.content;
                        reasoning = head.reasoning + &tail.reasoning;
                    }
                    let Parsed { content, calls } = match &reply.tools {
                        Some((format, tools, prefix)) => tool_calls::parse(*format, &content, tools, prefix),
                        None => Parsed { content, calls: Vec::new() },
                    };
                    let mut message = json!({ "role": "assistant", "content": content });
                    if !reasoning.is_empty() {
                        message["reasoning_content"] = json!(reasoning);
                    }
                    if !calls.is_empty() {
                        if content.is_empty() {
                            message["content"] = Value::Null;
                        }
                        message["tool_calls"] = calls.iter().map(|c| call_json(c, None)).collect();
                    }
                    let finish = finish_name(finish, !calls.is_empty());
                    json!({ "index": 0, "message": message, "logprobs": lp, "finish_reason": finish })
                } else {
                    json!({ "index": 0, "text": text, "logprobs": lp, "finish_reason": finish.name() })
                };
                let mut body = reply.envelope(false, json!([choice]));
                body["usage"] = usage(prompt_tokens, cached_tokens, completion_tokens);
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

/// The tool calls in a streamed piece's content, when tools were offered (`end`: the
/// reply is over, so nothing is held back).
fn read_calls(tools: Option<&mut ToolStream>, split: Split, end: bool) -> (Split, Vec<ToolCall>) {
    let Some(stream) = tools else { return (split, Vec::new()) };
    let mut parsed = stream.push(&split.content);
    if end {
        let rest = stream.finish();
        parsed.content.push_str(&rest.content);
        parsed.calls.extend(rest.calls);
    }
    (Split { reasoning: split.reasoning, content: parsed.content }, parsed.calls)
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
        let mut tools = reply.tool_stream();
        let mut called = 0;
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
                    let (split, calls) = read_calls(tools.as_mut(), split, false);
                    let some = !split.reasoning.is_empty() || !split.content.is_empty() || !calls.is_empty();
                    if (some || logprob.is_some())
                        && !send(reply.chunk(&split, &calls, called, logprob.as_slice(), None))
                    {
                        return;
                    }
                    called += calls.len();
                }
                Some(Event::Done { finish, prompt_tokens, cached_tokens, completion_tokens, ttft }) => {
                    trace.done(prompt_tokens, completion_tokens, ttft, finish.name());
                    let rest = splitter.as_mut().map(Splitter::finish).unwrap_or_default();
                    let (rest, calls) = read_calls(tools.as_mut(), rest, true);
                    let finish = finish_name(finish, called + calls.len() > 0);
                    send(reply.chunk(&rest, &calls, called, &[], Some(finish)));
                    if include_usage {
                        let mut last = reply.envelope(true, json!([]));
                        last["usage"] = usage(prompt_tokens, cached_tokens, completion_tokens);
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
