//! Chat templates: a pack's Hugging Face Jinja template (`tokenizer.chat_template`)
//! rendered into the prompt text the model was trained on.

use std::sync::{Arc, Mutex};

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, context};

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Message {
    /// "system", "user" or "assistant" (templates may accept others).
    pub role: String,
    /// The text of the turn.
    pub content: String,
}

impl Message {
    /// A message with this role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message { role: role.into(), content: content.into() }
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
/// (OpenAI-compatible servers' `chat_template_kwargs`, such as Qwen3's `enable_thinking`);
/// the standard ones win a clash.
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn blocks_are_trimmed_like_transformers() {
        let t = "{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content }}]\n  {% endif %}\n{% endfor %}";
        assert_eq!(
            render(t, &[Message::new("user", "a"), Message::new("user", "b")], false, "", "").unwrap(),
            "[a]\n[b]\n"
        );
    }
}
