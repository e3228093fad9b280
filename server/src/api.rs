//! The OpenAI request fields strata understands, read from JSON with one clear error per
//! bad field, and OpenAI-style error bodies.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use strata_runtime::chat::Message;
use strata_runtime::sampler::SamplerConfig;

/// An error as OpenAI reports it: a status and `{"error": {message, type, param, code}}`.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for people.
    pub message: String,
    /// The offending request field, if one.
    pub param: Option<String>,
    /// OpenAI's machine-readable code.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400 about one field.
    pub fn field(param: &str, message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), param: Some(param.into()), code: None }
    }

    /// Any status, no field.
    pub fn new(status: StatusCode, message: impl Into<String>, code: Option<&'static str>) -> ApiError {
        ApiError { status, message: message.into(), param: None, code }
    }
}

impl From<axum::extract::rejection::BytesRejection> for ApiError {
    /// A body that could not be read (over the limit: 413; stalled: 400) as a JSON error.
    fn from(rejection: axum::extract::rejection::BytesRejection) -> ApiError {
        let status = rejection.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "the request body is over the server's limit (--body-limit)".to_owned()
        } else {
            format!("the request body could not be read: {}", rejection.body_text())
        };
        ApiError::new(status, message, None)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        let body = json!({ "error": {
            "message": self.message, "type": kind, "param": self.param, "code": self.code,
        }});
        (self.status, Json(body)).into_response()
    }
}

/// A parsed completion request (chat or plain).
#[derive(Debug)]
pub struct Request {
    /// The model asked for, if named.
    pub model: Option<String>,
    /// Chat messages (chat completions).
    pub messages: Vec<Message>,
    /// The prompt (completions).
    pub prompt: String,
    /// Most tokens to generate, if given.
    pub max_tokens: Option<usize>,
    /// Sampling settings.
    pub sampler: SamplerConfig,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Stream server-sent events.
    pub stream: bool,
    /// Add a last chunk with usage when streaming.
    pub include_usage: bool,
    /// Alternatives per token to report, when log-probabilities are asked for.
    pub logprobs: Option<usize>,
    /// The request's own chat-template variables (`chat_template_kwargs`, and
    /// `enable_thinking` given at the top level).
    pub template_kwargs: Map<String, Value>,
    /// Whether a thinking block in the reply goes to `reasoning_content` (every
    /// `reasoning_format` but "none").
    pub split_reasoning: bool,
}

fn number(o: &Map<String, Value>, key: &str, min: f64, max: f64) -> Result<Option<f64>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            let v = n.as_f64().unwrap_or(f64::NAN);
            if (min..=max).contains(&v) {
                Ok(Some(v))
            } else {
                Err(ApiError::field(key, format!("'{key}' must be between {min} and {max}, not {v}")))
            }
        }
        Some(_) => Err(ApiError::field(key, format!("'{key}' must be a number"))),
    }
}

fn integer(o: &Map<String, Value>, key: &str, max: u64) -> Result<Option<u64>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v) if v <= max => Ok(Some(v)),
            _ => Err(ApiError::field(key, format!("'{key}' must be an integer from 0 to {max}, not {n}"))),
        },
        Some(_) => Err(ApiError::field(key, format!("'{key}' must be an integer"))),
    }
}

fn boolean(o: &Map<String, Value>, key: &str) -> Result<bool, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::field(key, format!("'{key}' must be true or false"))),
    }
}

/// Text of a message's `content`: a string, or text parts.
fn content(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                (Some("text"), Some(t)) => Ok(t.to_owned()),
                _ => Err(ApiError::field(at, format!("'{at}' parts must be {{\"type\": \"text\", \"text\": ...}}"))),
            })
            .collect(),
        _ => Err(ApiError::field(at, format!("'{at}' must be a string or an array of text parts"))),
    }
}

/// The request fields both endpoints read. `user` (an end-user id for the provider's abuse
/// monitoring) is taken and has nothing to do here.
const COMMON_FIELDS: [&str; 17] = [
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "logprobs",
    "n",
    "logit_bias",
    "user",
    "max_completion_tokens",
];

/// Fields strata does not act on, and why; any other unknown field is refused too, so a
/// client never gets an answer that silently ignored part of its request.
const REFUSED: [(&str, &str); 12] = [
    ("tools", "tool calling is not supported yet"),
    ("tool_choice", "tool calling is not supported yet"),
    ("parallel_tool_calls", "tool calling is not supported yet"),
    ("functions", "function calling is not supported"),
    ("function_call", "function calling is not supported"),
    ("response_format", "structured output (response_format) is not supported yet"),
    ("echo", "echoing the prompt is not supported"),
    ("suffix", "suffixes (fill-in-the-middle) are not supported"),
    ("best_of", "best_of is not supported: strata returns one choice"),
    ("audio", "audio output is not supported"),
    ("modalities", "only text output is supported"),
    ("prediction", "predicted outputs are not supported"),
];

/// Refuses the first field of `o` this endpoint does not read, naming it.
fn refuse_unknown(o: &Map<String, Value>, chat: bool) -> Result<(), ApiError> {
    let own: &[&str] = if chat {
        &["messages", "top_logprobs", "chat_template_kwargs", "enable_thinking", "reasoning_format"]
    } else {
        &["prompt"]
    };
    for key in o.keys() {
        if COMMON_FIELDS.contains(&key.as_str()) || own.contains(&key.as_str()) {
            continue;
        }
        let why = REFUSED.iter().find(|(k, _)| k == key).map_or("strata does not support this field", |(_, why)| why);
        return Err(ApiError::field(key, format!("'{key}': {why}")));
    }
    Ok(())
}

/// `logit_bias`: token ids (as JSON object keys) to biases in -100..=100.
fn logit_bias(o: &Map<String, Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = || ApiError::field("logit_bias", "'logit_bias' must map token ids to numbers from -100 to 100");
    match o.get("logit_bias") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| {
                let id = k.parse::<u32>().map_err(|_| bad())?;
                match v.as_f64() {
                    Some(b) if (-100.0..=100.0).contains(&b) => Ok((id, b as f32)),
                    _ => Err(bad()),
                }
            })
            .collect(),
        Some(_) => Err(bad()),
    }
}

/// Reads a request body; `chat` selects chat completions' fields.
pub fn parse(body: &[u8], chat: bool) -> Result<Request, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("the body is not valid JSON: {e}"), None))?;
    let Value::Object(o) = value else {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "the body must be a JSON object", None));
    };
    refuse_unknown(&o, chat)?;
    let model = match o.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m.clone()),
        Some(_) => return Err(ApiError::field("model", "'model' must be a string")),
    };
    if let Some(n) = integer(&o, "n", u64::MAX)?
        && n != 1
    {
        return Err(ApiError::field("n", format!("n = {n} is not supported: strata returns one choice")));
    }
    let (mut messages, mut prompt) = (Vec::new(), String::new());
    if chat {
        let Some(Value::Array(list)) = o.get("messages") else {
            return Err(ApiError::field("messages", "'messages' must be an array of messages"));
        };
        if list.is_empty() {
            return Err(ApiError::field("messages", "'messages' must not be empty"));
        }
        for (i, m) in list.iter().enumerate() {
            let at = format!("messages[{i}]");
            let role = match m.get("role").and_then(Value::as_str) {
                Some(r @ ("system" | "user" | "assistant")) => r.to_owned(),
                Some("developer") => "system".to_owned(),
                Some("tool") => {
                    return Err(ApiError::field(
                        &format!("{at}.role"),
                        "tool messages: tool calling is not supported yet",
                    ));
                }
                _ => return Err(ApiError::field(&at, format!("'{at}.role' must be system, user or assistant"))),
            };
            if m.get("tool_calls").is_some_and(|v| !v.is_null()) {
                return Err(ApiError::field(&format!("{at}.tool_calls"), "tool calling is not supported yet"));
            }
            let text = content(m.get("content").unwrap_or(&Value::Null), &format!("{at}.content"))?;
            messages.push(Message { role, content: text });
        }
    } else {
        prompt = match o.get("prompt") {
            Some(Value::String(p)) => p.clone(),
            Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => a[0].as_str().unwrap_or_default().to_owned(),
            _ => return Err(ApiError::field("prompt", "'prompt' must be a string")),
        };
    }
    let max_tokens = match integer(&o, "max_completion_tokens", u64::from(u32::MAX))? {
        Some(v) => Some(("max_completion_tokens", v)),
        None => integer(&o, "max_tokens", u64::from(u32::MAX))?.map(|v| ("max_tokens", v)),
    };
    // OpenAI rejects 0 too; generating nothing would still cost a prompt pass.
    let max_tokens = match max_tokens {
        Some((key, 0)) => return Err(ApiError::field(key, format!("'{key}' must be at least 1"))),
        other => other.map(|(_, v)| v as usize),
    };
    let stop = match o.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= 16 && a.iter().all(Value::is_string) => {
            a.iter().filter_map(Value::as_str).map(str::to_owned).collect()
        }
        Some(_) => return Err(ApiError::field("stop", "'stop' must be a string or a list of at most 16 strings")),
    };
    let defaults = SamplerConfig::default();
    let seed = integer(&o, "seed", u64::MAX)?.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
    });
    let sampler = SamplerConfig {
        temperature: number(&o, "temperature", 0.0, 2.0)?.map_or(defaults.temperature, |v| v as f32),
        top_p: number(&o, "top_p", 0.0, 1.0)?.map_or(defaults.top_p, |v| v as f32),
        top_k: integer(&o, "top_k", 1 << 20)?.map_or(defaults.top_k, |v| v as usize),
        min_p: number(&o, "min_p", 0.0, 1.0)?.map_or(defaults.min_p, |v| v as f32),
        presence_penalty: number(&o, "presence_penalty", -2.0, 2.0)?.map_or(0.0, |v| v as f32),
        frequency_penalty: number(&o, "frequency_penalty", -2.0, 2.0)?.map_or(0.0, |v| v as f32),
        seed,
        logit_bias: logit_bias(&o)?,
        ..defaults
    };
    let logprobs = if chat {
        let top = integer(&o, "top_logprobs", 20)?;
        if boolean(&o, "logprobs")? { Some(top.unwrap_or(0) as usize) } else { None }
    } else {
        integer(&o, "logprobs", 5)?.map(|k| k as usize)
    };
    let stream = boolean(&o, "stream")?;
    let include_usage = match o.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(so)) => boolean(so, "include_usage")?,
        Some(_) => return Err(ApiError::field("stream_options", "'stream_options' must be an object")),
    };
    let mut template_kwargs = match o.get("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err(ApiError::field("chat_template_kwargs", "'chat_template_kwargs' must be an object")),
    };
    if o.get("enable_thinking").is_some_and(|v| !v.is_null()) {
        template_kwargs.insert("enable_thinking".into(), Value::Bool(boolean(&o, "enable_thinking")?));
    }
    let split_reasoning = match o.get("reasoning_format") {
        None | Some(Value::Null) => true,
        Some(Value::String(f)) if f == "none" => false,
        Some(Value::String(f)) if f == "auto" || f == "deepseek" => true,
        Some(_) => {
            return Err(ApiError::field(
                "reasoning_format",
                "'reasoning_format' must be \"auto\", \"deepseek\" or \"none\"",
            ));
        }
    };
    Ok(Request {
        model,
        messages,
        prompt,
        max_tokens,
        sampler,
        stop,
        stream,
        include_usage,
        logprobs,
        template_kwargs,
        split_reasoning,
    })
}
