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
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            return ApiError::body_too_large();
        }
        ApiError::new(status, format!("the request body could not be read: {}", rejection.body_text()), None)
    }
}

impl ApiError {
    /// 413: a body over `--body-limit`, whether its Content-Length says so or its bytes.
    pub fn body_too_large() -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "the request body is over the server's limit (--body-limit)", None)
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
    /// The function tools the model may call (`tools`), as given.
    pub tools: Vec<Value>,
    /// Whether and which tools the reply calls (`tool_choice`).
    pub tool_choice: ToolChoice,
    /// Whether a forced reply may hold several calls (`parallel_tool_calls`, default true).
    pub parallel_tool_calls: bool,
    /// The JSON schema the reply must follow (`response_format` json_object or
    /// json_schema), enforced by constrained decoding.
    pub json_schema: Option<Value>,
    /// Whether the prompt may start from a slot's cached prefix (llama.cpp's
    /// `cache_prompt`, default true; false computes it all).
    pub cache_prompt: bool,
}

/// OpenAI's `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// No tool call: the tools are not shown to the model (the default without tools).
    None,
    /// The model decides (the default with tools).
    Auto,
    /// At least one call, forced by a grammar.
    Required,
    /// One call of this function, forced by a grammar.
    Function(String),
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
const COMMON_FIELDS: [&str; 19] = [
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
    "response_format",
    "cache_prompt",
];

/// Fields strata does not act on, and why; any other unknown field is refused too, so a
/// client never gets an answer that silently ignored part of its request.
const REFUSED: [(&str, &str); 8] = [
    ("functions", "the deprecated 'functions' is not supported: use 'tools'"),
    ("function_call", "the deprecated 'function_call' is not supported: use 'tool_choice'"),
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
        &[
            "messages",
            "top_logprobs",
            "chat_template_kwargs",
            "enable_thinking",
            "reasoning_format",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
        ]
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
            messages.push(message(m, &format!("messages[{i}]"))?);
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
    let tools = if chat { tools(&o)? } else { Vec::new() };
    let tool_choice = tool_choice(&o, &tools)?;
    let parallel_tool_calls = match o.get("parallel_tool_calls") {
        None | Some(Value::Null) => true,
        _ => boolean(&o, "parallel_tool_calls")?,
    };
    let json_schema = response_format(&o)?;
    if json_schema.is_some() && matches!(tool_choice, ToolChoice::Required | ToolChoice::Function(_)) {
        return Err(ApiError::field(
            "response_format",
            "'response_format' cannot be enforced together with a forced tool call ('tool_choice')",
        ));
    }
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
        tools,
        tool_choice,
        parallel_tool_calls,
        json_schema,
        cache_prompt: o.get("cache_prompt").is_none_or(Value::is_null) || boolean(&o, "cache_prompt")?,
    })
}

/// One chat message: system (or developer), user, assistant (with `tool_calls`, whose
/// JSON `arguments` reach the template as objects) or tool (with `tool_call_id`).
fn message(m: &Value, at: &str) -> Result<Message, ApiError> {
    let role = match m.get("role").and_then(Value::as_str) {
        Some(r @ ("system" | "user" | "assistant" | "tool")) => r.to_owned(),
        Some("developer") => "system".to_owned(),
        _ => return Err(ApiError::field(at, format!("'{at}.role' must be system, user, assistant or tool"))),
    };
    let mut message = Message::new(role, content(m.get("content").unwrap_or(&Value::Null), &format!("{at}.content"))?);
    match m.get("tool_calls") {
        None | Some(Value::Null) => {}
        Some(Value::Array(calls)) if message.role == "assistant" => {
            for (j, call) in calls.iter().enumerate() {
                message.tool_calls.push(tool_call(call, &format!("{at}.tool_calls[{j}]"))?);
            }
        }
        Some(_) => {
            return Err(ApiError::field(
                &format!("{at}.tool_calls"),
                format!("'{at}.tool_calls' must be an array, on an assistant message"),
            ));
        }
    }
    if message.role == "tool" {
        let Some(Value::String(id)) = m.get("tool_call_id") else {
            return Err(ApiError::field(
                &format!("{at}.tool_call_id"),
                format!("'{at}' needs the 'tool_call_id' it answers"),
            ));
        };
        message.tool_call_id = Some(id.clone());
        message.name = m.get("name").and_then(Value::as_str).map(str::to_owned);
    }
    Ok(message)
}

/// An assistant message's tool call, `arguments` parsed (a string that is not JSON stays
/// a string: the model wrote it so).
fn tool_call(call: &Value, at: &str) -> Result<Value, ApiError> {
    let bad = || {
        ApiError::field(
            at,
            format!("'{at}' must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}"),
        )
    };
    let function = call.get("function").ok_or_else(bad)?;
    let name = function.get("name").and_then(Value::as_str).ok_or_else(bad)?;
    let arguments = match function.get("arguments") {
        Some(Value::String(text)) => serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.clone())),
        None | Some(Value::Null) => json!({}),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => return Err(bad()),
    };
    let id = call.get("id").and_then(Value::as_str).unwrap_or_default();
    Ok(json!({ "id": id, "type": "function", "function": { "name": name, "arguments": arguments } }))
}

/// `tools`: function tools, each `{"type": "function", "function": {name, description?,
/// parameters?, strict?}}`, names as OpenAI allows them (letters, digits, `_`, `-`, `.`,
/// at most 64), so that they can stand in a grammar unquoted.
fn tools(o: &Map<String, Value>) -> Result<Vec<Value>, ApiError> {
    let list = match o.get("tools") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(ApiError::field("tools", "'tools' must be an array of function tools")),
    };
    for (i, tool) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::field(&at, format!("'{at}.type' must be \"function\": strata calls only functions")));
        }
        let Some(Value::Object(f)) = tool.get("function") else {
            return Err(ApiError::field(&at, format!("'{at}.function' must be an object")));
        };
        let named = f.get("name").and_then(Value::as_str).is_some_and(|n| {
            (1..=64).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
        });
        if !named {
            return Err(ApiError::field(
                &format!("{at}.function.name"),
                format!("'{at}.function.name' must be 1 to 64 letters, digits, '_', '-' or '.'"),
            ));
        }
        if f.get("parameters").is_some_and(|p| !p.is_object() && !p.is_null()) {
            return Err(ApiError::field(
                &format!("{at}.function.parameters"),
                format!("'{at}.function.parameters' must be a JSON schema object"),
            ));
        }
    }
    Ok(list.clone())
}

/// `tool_choice`: "none", "auto", "required" or `{"type": "function", "function":
/// {"name"}}` naming one of `tools`; by default auto with tools, none without.
fn tool_choice(o: &Map<String, Value>, tools: &[Value]) -> Result<ToolChoice, ApiError> {
    let named = |name: &str| tools.iter().any(|t| t["function"]["name"] == name);
    let choice = match o.get("tool_choice") {
        None | Some(Value::Null) if tools.is_empty() => ToolChoice::None,
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(c)) if c == "none" => ToolChoice::None,
        Some(Value::String(c)) if c == "auto" => ToolChoice::Auto,
        Some(Value::String(c)) if c == "required" => ToolChoice::Required,
        Some(v) => match v["function"]["name"].as_str() {
            Some(name) if v["type"] == "function" && named(name) => ToolChoice::Function(name.to_owned()),
            Some(name) if v["type"] == "function" => {
                return Err(ApiError::field(
                    "tool_choice",
                    format!("'tool_choice' names '{name}', which is not among 'tools'"),
                ));
            }
            _ => {
                return Err(ApiError::field(
                    "tool_choice",
                    "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ));
            }
        },
    };
    if tools.is_empty() && choice != ToolChoice::None {
        return Err(ApiError::field("tool_choice", "'tool_choice' needs 'tools' to choose from"));
    }
    Ok(choice)
}

/// `response_format`: text (no constraint), json_object (any object) or json_schema
/// (its `schema`; `strict` or not, the schema is enforced).
fn response_format(o: &Map<String, Value>) -> Result<Option<Value>, ApiError> {
    let format = match o.get("response_format") {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => v,
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({ "type": "object" }))),
        Some("json_schema") => match format.get("json_schema").and_then(|j| j.get("schema")) {
            Some(schema @ (Value::Object(_) | Value::Bool(true))) => Ok(Some(schema.clone())),
            _ => Err(ApiError::field(
                "response_format",
                "'response_format.json_schema.schema' must be a JSON schema object",
            )),
        },
        _ => Err(ApiError::field(
            "response_format",
            "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"",
        )),
    }
}
