//! Chat templates: a pack's Hugging Face Jinja template (`tokenizer.chat_template`)
//! rendered into the prompt text the model was trained on.

use std::sync::{Arc, Mutex};

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, context};

/// One turn of a conversation, as templates read it (OpenAI's message shape).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Message {
    /// "system", "user", "assistant" or "tool" (templates may accept others).
    pub role: String,
    /// The text of the turn.
    pub content: String,
    /// An assistant turn's tool calls: `{id, type, function: {name, arguments}}` with
    /// `arguments` an object (templates index it or write it with `tojson`, as vLLM and
    /// llama.cpp hand it to them). Absent when empty, so `message.tool_calls` tests false.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<serde_json::Value>,
    /// A tool turn: the call it answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A tool turn: the function that answered (templates that name it read `name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Message {
    /// A message with this role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message { role: role.into(), content: content.into(), ..Message::default() }
    }
}

/// Why a chat template could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The template is not valid Jinja (as far as minijinja reads it).
    #[error("chat template does not parse: {0}")]
    Syntax(String),
    /// The template called `raise_exception`, e.g. for a role order it refuses.
    #[error("chat template refused the conversation: {0}")]
    Raised(String),
    /// Rendering failed: an unknown filter or method, a type error, ...
    #[error("chat template failed: {0}")]
    Render(String),
}

/// Renders a HF-style Jinja chat template with minijinja + minijinja_contrib::pycompat
/// (Python string methods such as `.strip()`, `.startswith()`, `.split()`), given
/// `messages`, `add_generation_prompt`, `bos_token`, `eos_token` and a
/// `raise_exception` function; block whitespace is trimmed as transformers does
/// (`trim_blocks`, `lstrip_blocks`). Errors name the template problem.
pub fn render(
    template: &str,
    messages: &[Message],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String, ChatError> {
    render_with(template, messages, add_generation_prompt, bos_token, eos_token, &serde_json::Map::new())
}

/// [`render`] with a request's own template variables beside the standard ones
/// (OpenAI-compatible servers' `chat_template_kwargs`, such as Qwen3's `enable_thinking`,
/// and a request's `tools`); the standard ones win a clash.
pub fn render_with(
    template: &str,
    messages: &[Message],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
    extra: &serde_json::Map<String, serde_json::Value>,
) -> Result<String, ChatError> {
    let mut env = Environment::new();
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(|e| ChatError::Syntax(describe(&e)))?;
    env.set_syntax(syntax);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", tojson);
    let raised: Arc<Mutex<Option<String>>> = Arc::default();
    let seen = Arc::clone(&raised);
    env.add_function("raise_exception", move |message: String| -> Result<String, Error> {
        if let Ok(mut slot) = seen.lock() {
            slot.get_or_insert_with(|| message.clone());
        }
        Err(Error::new(ErrorKind::InvalidOperation, message))
    });
    let tmpl = env.template_from_str(template).map_err(|e| ChatError::Syntax(describe(&e)))?;
    let ctx = context! {
        messages => minijinja::value::Serde(messages),
        add_generation_prompt => add_generation_prompt,
        bos_token => bos_token,
        eos_token => eos_token,
        ..minijinja::Value::from(minijinja::value::Serde(extra))
    };
    tmpl.render(ctx).map_err(|e| match raised.lock().ok().and_then(|mut r| r.take()) {
        Some(message) => ChatError::Raised(message),
        None => ChatError::Render(describe(&e)),
    })
}

/// `tojson` as transformers defines it for chat templates (Python's `json.dumps`): keys
/// in their order, `", "` and `": "` between items, or `indent` spaces a level; nothing
/// HTML-escaped (minijinja's own escapes `<`, which would change a tool's description).
fn tojson(value: &minijinja::Value, kwargs: minijinja::value::Kwargs) -> Result<minijinja::Value, Error> {
    use serde::Serialize;
    let indent: Option<usize> = kwargs.get("indent")?;
    // Accepted as transformers' filter accepts them; their effect is the default here.
    let _: Option<minijinja::Value> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let written = match indent {
        Some(n) => {
            let spaces = vec![b' '; n];
            let mut ser = serde_json::Serializer::with_formatter(
                &mut out,
                serde_json::ser::PrettyFormatter::with_indent(&spaces),
            );
            value.serialize(&mut ser)
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, PythonSeparators)),
    };
    written.map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(minijinja::Value::from_safe_string(String::from_utf8_lossy(&out).into_owned()))
}

/// serde_json's compact layout with Python's default separators.
struct PythonSeparators;

impl serde_json::ser::Formatter for PythonSeparators {
    fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// One line: what went wrong and where in the template.
fn describe(e: &Error) -> String {
    let mut s = match e.detail() {
        Some(detail) => format!("{}: {detail}", e.kind()),
        None => e.kind().to_string(),
    };
    if let Some(line) = e.line() {
        s.push_str(&format!(" (line {line})"));
    }
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        s.push_str(&format!(": {inner}"));
        source = inner.source();
    }
    s
}

/// Fallback when a pack has no template: ChatML, the format of Qwen, SmolLM and many
/// fine-tunes, and llama.cpp's own fallback.
pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Gemma's turn format, for a Gemma pack that carries no template (the Gemma 3 270M
/// GGUF does not): `<start_of_turn>{user|model}\n{text}<end_of_turn>\n`, a system
/// message put before the first user turn's text, the generation prompt opening a
/// model turn. BOS comes from the tokenizer (`add_bos_token`), not from here.
pub const GEMMA: &str = "{% set ns = namespace(prefix='') %}{% for message in messages %}\
{% if message['role'] == 'system' %}{% set ns.prefix = message['content'] | trim ~ '\n\n' %}\
{% else %}{{ '<start_of_turn>' ~ ('model' if message['role'] == 'assistant' else message['role']) ~ '\n' ~ ns.prefix ~ (message['content'] | trim) ~ '<end_of_turn>\n' }}\
{% set ns.prefix = '' %}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma_renders_turns_with_the_system_text_in_the_first() {
        let msgs = [
            Message::new("system", "Be brief."),
            Message::new("user", " Hi "),
            Message::new("assistant", "Hello."),
            Message::new("user", "Bye"),
        ];
        assert_eq!(
            render(GEMMA, &msgs, true, "<bos>", "<eos>").unwrap(),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn chatml_renders() {
        let msgs = [Message::new("system", "Be brief."), Message::new("user", "Hi")];
        let out = render(CHATML, &msgs, true, "", "").unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn python_methods_and_raise() {
        let t = "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}\
                 {{ messages[0].content.strip().upper() }}{{ bos_token }}";
        assert_eq!(render(t, &[Message::new("user", "  hi ")], false, "<s>", "").unwrap(), "HI<s>");
        let err = render(t, &[Message::new("assistant", "x")], false, "", "").unwrap_err();
        assert!(matches!(&err, ChatError::Raised(m) if m == "first must be user"), "{err}");
        let err = render("{% for %}", &[], false, "", "").unwrap_err();
        assert!(matches!(err, ChatError::Syntax(_)), "{err}");
        let err = render("{{ messages | nosuchfilter }}", &[], false, "", "").unwrap_err();
        assert!(err.to_string().contains("nosuchfilter"), "{err}");
    }

    #[test]
    fn tools_and_tool_turns_reach_the_template_as_transformers_writes_them() {
        let t = "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}\
                 {% for m in messages %}{{ m.role }}:{% if m.tool_calls %}{% for c in m.tool_calls %}\
                 {{ c.function.name }}{{ c.function.arguments | tojson }}{% endfor %}{% else %}{{ m.content }}{% endif %}\
                 {% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %}\n{% endfor %}{{ {'b': [1, 2]} | tojson(indent=2) }}";
        let tool = serde_json::json!({ "type": "function", "function": { "name": "f", "description": "a < b" } });
        let call = serde_json::json!({ "id": "c1", "type": "function", "function": { "name": "f", "arguments": { "z": 1, "a": "x" } } });
        let msgs = [
            Message::new("user", "hi"),
            Message { tool_calls: vec![call], ..Message::new("assistant", "") },
            Message { tool_call_id: Some("c1".into()), ..Message::new("tool", "42") },
        ];
        let mut extra = serde_json::Map::new();
        extra.insert("tools".into(), serde_json::json!([tool]));
        let out = render_with(t, &msgs, false, "", "", &extra).unwrap();
        assert_eq!(
            out,
            "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"a < b\"}}\n\
             user:hiassistant:f{\"z\": 1, \"a\": \"x\"}tool:42#c1{\n  \"b\": [\n    1,\n    2\n  ]\n}"
        );
    }

    #[test]
    fn blocks_are_trimmed_like_transformers() {
        let t = "{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content }}]\n  {% endif %}\n{% endfor %}";
        assert_eq!(
            render(t, &[Message::new("user", "a"), Message::new("user", "b")], false, "", "").unwrap(),
            "[a]\n[b]\n"
        );
    }
}
