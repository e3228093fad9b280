//! From a request to prompt tokens, off the async executor: the chat template rendered
//! with each message's content marked, so that only the template's own markup becomes
//! control tokens, and a bound on prompt bytes checked before any work that scales
//! with them.

use std::ops::Range;

use serde_json::{Map, Value};

use strata_runtime::chat::{self, Message};
use strata_runtime::tokenizer::Tokenizer;

use crate::api::ApiError;
use crate::reasoning;

/// Opens and closes a message's content in the rendered template: Unicode noncharacters,
/// which no text should carry (any in a message are replaced by U+FFFD first).
const OPEN: char = '\u{FDD0}';
const CLOSE: char = '\u{FDD1}';

/// The most prompt bytes that can fit `n_ctx` tokens: no token stands for more bytes
/// than the longest token text (byte-level BPE and SentencePiece texts are at least as
/// long as the bytes they encode), so a longer prompt cannot fit and is refused before
/// it is tokenized.
pub(crate) fn max_prompt_bytes(t: &Tokenizer, n_ctx: u32) -> usize {
    let longest = (0..t.vocab_size() as u32).map(|id| t.token_text(id).len()).max().unwrap_or(1).max(1);
    longest.saturating_mul(n_ctx as usize)
}

/// Refuses a prompt of more than `limit` bytes (`param` names the request field).
pub(crate) fn check_bytes(param: &str, bytes: usize, limit: usize, n_ctx: u32) -> Result<(), ApiError> {
    if bytes <= limit {
        return Ok(());
    }
    Err(ApiError {
        code: Some("context_length_exceeded"),
        ..ApiError::field(
            param,
            format!("the prompt is {bytes} bytes: more than fit the context of {n_ctx} tokens (at most {limit} bytes)"),
        )
    })
}

/// `text` between marks, any marks in it replaced.
fn mark(text: &str) -> String {
    format!("{OPEN}{}{CLOSE}", text.replace([OPEN, CLOSE], "\u{FFFD}"))
}

/// `v` with the client's free text marked: every string when `all`, else the strings
/// under `description` keys (the rest of a tool definition, names and types, is what
/// templates compare, and must stay as given).
fn mark_text(v: &Value, all: bool) -> Value {
    match v {
        Value::String(s) if all => Value::String(mark(s)),
        Value::Array(items) => Value::Array(items.iter().map(|i| mark_text(i, all)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| {
                    let text = all || (k == "description" && v.is_string());
                    (k.clone(), mark_text(v, text))
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Tokens of a chat: the template rendered with the client's text marked (contents,
/// tool-call arguments, tool descriptions), then tokenized with control tokens parsed
/// only outside it. A `<|im_start|>` written in a message is text, not a turn. `kwargs`
/// are the request's own template variables and `tools` the tools shown to the model;
/// the flag says whether the prompt leaves the reply inside a thinking block.
pub(crate) fn chat_tokens(
    t: &Tokenizer,
    messages: &[Message],
    kwargs: &Map<String, Value>,
    tools: &[Value],
) -> Result<(Vec<u32>, bool), ApiError> {
    let marked: Vec<Message> = messages
        .iter()
        .map(|m| {
            let calls = m.tool_calls.iter().map(|c| {
                let mut c = c.clone();
                c["function"]["arguments"] = mark_text(&c["function"]["arguments"], true);
                c
            });
            Message { content: mark(&m.content), tool_calls: calls.collect(), ..m.clone() }
        })
        .collect();
    let mut kwargs = kwargs.clone();
    if !tools.is_empty() {
        kwargs.insert("tools".into(), mark_text(&Value::Array(tools.to_vec()), false));
    }
    let template = t.chat_template().unwrap_or(chat::CHATML);
    let token = |id: Option<u32>| id.map(|i| t.token_text(i).to_owned()).unwrap_or_default();
    let rendered = chat::render_with(template, &marked, true, &token(t.bos()), &token(t.eos()), &kwargs)
        .map_err(|e| ApiError::field("messages", format!("the chat template failed: {e}")))?;
    let (text, plain) = unmark(&rendered).ok_or_else(|| {
        ApiError::field(
            "messages",
            "the chat template cuts message contents apart; strata cannot tell them from its markup",
        )
    })?;
    Ok((t.encode_marked(&text, true, &plain), reasoning::opens_thinking(&text)))
}

/// The rendered text without its marks, and the byte ranges the marks enclosed; `None`
/// when marks do not pair up (a template that slices contents).
fn unmark(rendered: &str) -> Option<(String, Vec<Range<usize>>)> {
    let mut text = String::with_capacity(rendered.len());
    let (mut plain, mut open) = (Vec::new(), None);
    for c in rendered.chars() {
        match (c, open) {
            (OPEN, None) => open = Some(text.len()),
            (CLOSE, Some(start)) => {
                plain.push(start..text.len());
                open = None;
            }
            (OPEN | CLOSE, _) => return None,
            _ => text.push(c),
        }
    }
    open.is_none().then_some((text, plain))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_pair_into_ranges() {
        let (text, plain) = unmark("<a>\u{FDD0}hi<a>\u{FDD1}<b>\u{FDD0}\u{FDD1}").expect("paired");
        assert_eq!(text, "<a>hi<a><b>");
        assert_eq!(plain, vec![3..8, 11..11]);
        assert!(unmark("\u{FDD0}cut").is_none());
        assert!(unmark("\u{FDD1}").is_none());
        assert!(unmark("\u{FDD0}\u{FDD0}\u{FDD1}").is_none());
    }

    #[test]
    fn only_free_text_is_marked() {
        let tool = serde_json::json!({ "type": "function", "function": {
            "name": "f", "description": "d", "parameters": { "properties": { "x": { "type": "string", "description": "e" } } } } });
        let m = mark_text(&tool, false);
        assert_eq!(m["type"], "function");
        assert_eq!(m["function"]["name"], "f");
        assert_eq!(m["function"]["description"], "\u{FDD0}d\u{FDD1}");
        assert_eq!(m["function"]["parameters"]["properties"]["x"]["type"], "string");
        assert_eq!(m["function"]["parameters"]["properties"]["x"]["description"], "\u{FDD0}e\u{FDD1}");
        let args = mark_text(&serde_json::json!({ "a": ["\u{FDD0}x", 1] }), true);
        assert_eq!(args, serde_json::json!({ "a": ["\u{FDD0}\u{FFFD}x\u{FDD1}", 1] }));
    }
}
