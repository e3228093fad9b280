//! Tool calls read out of generated text, for OpenAI-style `tool_calls`.
//!
//! Each model family writes its calls its own way ([`ToolFormat`], told apart by the
//! pack's chat template). [`ToolStream`] sorts a reply, piece by piece, into content and
//! calls; [`parse`] does the same for a whole reply (it runs the stream once, so the two
//! cannot disagree). A call the model wrote badly is given back as content, unchanged.

use serde_json::{Map, Value};

/// Opens a call in the tagged formats.
const OPEN: &str = "<tool_call>";
/// Closes a call in the tagged formats.
const CLOSE: &str = "</tool_call>";
/// May open a Llama reply of calls.
const PYTHON_TAG: &str = "<|python_tag|>";

/// How a model family writes its tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ToolFormat {
    /// `<tool_call>{"name": …, "arguments": {…}}</tool_call>`: Qwen2.5, Qwen3, Hermes 2/3.
    Hermes,
    /// `<tool_call><function=NAME><parameter=KEY>VALUE</parameter>…</function></tool_call>`:
    /// Qwen3-Coder.
    QwenXml,
    /// The whole reply is `{"name": …, "parameters": {…}}`, calls split by `;`: Llama 3.1–3.3.
    LlamaJson,
}

impl ToolFormat {
    /// The format a chat template teaches its model, if any: the server can only offer
    /// tools to a model whose calls it can read back.
    pub(crate) fn detect(template: &str) -> Option<ToolFormat> {
        if template.contains("<function=") {
            Some(ToolFormat::QwenXml)
        } else if template.contains(OPEN) {
            Some(ToolFormat::Hermes)
        } else if template.contains("<|start_header_id|>")
            && (template.contains("ipython") || template.contains("\"parameters\""))
        {
            Some(ToolFormat::LlamaJson)
        } else {
            None
        }
    }
}

/// One call, as an OpenAI `tool_calls` entry needs it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ToolCall {
    /// `{id_prefix}{n}`: the n-th call of the reply.
    pub id: String,
    /// A function among the request's `tools`.
    pub name: String,
    /// Compact JSON text of an object.
    pub arguments: String,
}

/// Generated text sorted into what the client reads and the calls it should make.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Parsed {
    /// Text that is no call (including calls written badly).
    pub content: String,
    /// Calls, in the order written.
    pub calls: Vec<ToolCall>,
}

impl Parsed {
    /// Adds `later`, which follows `self` in the reply.
    fn append(&mut self, later: Parsed) {
        self.content.push_str(&later.content);
        self.calls.extend(later.calls);
    }
}

/// A whole reply sorted into content and calls.
///
/// `tools`: the request's `tools` array as given (OpenAI shape:
/// `[{"type":"function","function":{"name","description","parameters"}}]`); a call to a
/// function not among them is content.
/// `id_prefix`: calls are numbered `{id_prefix}{n}` in order (e.g. "call_7_" -> call_7_0,
/// call_7_1).
pub(crate) fn parse(format: ToolFormat, text: &str, tools: &[Value], id_prefix: &str) -> Parsed {
    let mut stream = ToolStream::new(format, tools.to_vec(), id_prefix.to_owned());
    let mut parsed = stream.push(text);
    parsed.append(stream.finish());
    parsed
}

/// Where a [`ToolStream`] is in the reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Tagged formats, outside a call. `blank`: the text since the start or since the
    /// last call is whitespace so far; it is held, as it is dropped if a call follows it
    /// or ends the reply after one.
    Outside { blank: bool },
    /// Tagged formats, in a call whose opener starts at byte `at` of the held text (held
    /// blank text before it).
    InCall { at: usize },
    /// Llama, nothing but whitespace yet: calls or a plain reply?
    Undecided,
    /// Llama, a reply that may be calls: held whole until the end.
    Held,
    /// Llama, a plain reply: content as it comes.
    Plain,
}

/// Sorts a reply into content and calls as it is generated, for streamed responses.
#[derive(Debug)]
pub(crate) struct ToolStream {
    format: ToolFormat,
    tools: Vec<Value>,
    id_prefix: String,
    /// Calls given so far: the next call's number.
    calls: usize,
    /// Text read but not yet given out.
    pending: String,
    state: State,
}

impl ToolStream {
    /// A stream for one reply; `tools` and `id_prefix` as for [`parse`].
    pub(crate) fn new(format: ToolFormat, tools: Vec<Value>, id_prefix: String) -> ToolStream {
        let state = match format {
            ToolFormat::Hermes | ToolFormat::QwenXml => State::Outside { blank: true },
            ToolFormat::LlamaJson => State::Undecided,
        };
        ToolStream { format, tools, id_prefix, calls: 0, pending: String::new(), state }
    }

    /// Feed the next piece of generated text; returns content that is certain to be content
    /// (never a prefix of a call opener that may still complete) and each call as soon as it
    /// is complete.
    pub(crate) fn push(&mut self, piece: &str) -> Parsed {
        self.pending.push_str(piece);
        let mut out = Parsed::default();
        while self.step(&mut out) {}
        out
    }

    /// End of generation: whatever is held back, as content or calls.
    pub(crate) fn finish(&mut self) -> Parsed {
        let rest = std::mem::take(&mut self.pending);
        let mut out = Parsed::default();
        match self.state {
            State::Outside { blank: true } if self.calls > 0 && rest.trim().is_empty() => {}
            State::Held => self.read_llama(&rest, &mut out),
            _ => out.content = rest,
        }
        out
    }

    /// Settles what it can of the held text; whether to step again.
    fn step(&mut self, out: &mut Parsed) -> bool {
        match self.state {
            State::Outside { blank } => self.outside(blank, out),
            State::InCall { at } => self.in_call(at, out),
            State::Undecided => self.undecided(),
            State::Held => false,
            State::Plain => {
                out.content.push_str(&self.pending);
                self.pending.clear();
                false
            }
        }
    }

    /// Outside a call: content up to an opener, or up to what may still become one.
    fn outside(&mut self, blank: bool, out: &mut Parsed) -> bool {
        if let Some(at) = self.pending.find(OPEN) {
            if blank && self.pending[..at].trim().is_empty() {
                self.state = State::InCall { at };
            } else {
                out.content.extend(self.pending.drain(..at));
                self.state = State::InCall { at: 0 };
            }
            return true;
        }
        if blank && OPEN.starts_with(self.pending.trim_start()) {
            return false; // whitespace, perhaps an opener cut short: wait
        }
        let settled = self.pending.len() - partial_suffix(&self.pending, OPEN);
        out.content.extend(self.pending.drain(..settled));
        self.state = State::Outside { blank: false };
        false
    }

    /// In a call: once it is closed, a call, or content if it does not read as one.
    fn in_call(&mut self, at: usize, out: &mut Parsed) -> bool {
        let body_start = at + OPEN.len();
        let Some(len) = self.pending[body_start..].find(CLOSE) else {
            return false;
        };
        let body = &self.pending[body_start..body_start + len];
        let read = match self.format {
            ToolFormat::QwenXml => read_xml_call(body, &self.tools),
            ToolFormat::Hermes | ToolFormat::LlamaJson => read_hermes_call(body, &self.tools),
        };
        let end = body_start + len + CLOSE.len();
        let blank = match read {
            Some((name, arguments)) => {
                let call = self.new_call(name, arguments);
                out.calls.push(call);
                true
            }
            None => {
                out.content.push_str(&self.pending[..end]);
                false
            }
        };
        self.pending.drain(..end);
        self.state = State::Outside { blank };
        true
    }

    /// Llama: a reply opening with `{` or the python tag may be calls; any other is not.
    fn undecided(&mut self) -> bool {
        let start = self.pending.trim_start();
        if start.starts_with('{') || start.starts_with(PYTHON_TAG) {
            self.state = State::Held;
            false
        } else if PYTHON_TAG.starts_with(start) {
            false // whitespace, perhaps the tag cut short: wait
        } else {
            self.state = State::Plain;
            true
        }
    }

    /// Llama: the calls of a held reply, in order; from the first that does not read, the
    /// rest is content (the whole reply if that is the first).
    fn read_llama(&mut self, text: &str, out: &mut Parsed) {
        let start = text.trim_start();
        let mut rest = start.strip_prefix(PYTHON_TAG).unwrap_or(start);
        while let Some((name, arguments, after)) = read_llama_call(rest, &self.tools) {
            let call = self.new_call(name, arguments);
            out.calls.push(call);
            rest = after.trim_start();
            match rest.strip_prefix(';') {
                Some(next) => rest = next.trim_start(),
                None => break,
            }
        }
        out.content.push_str(if out.calls.is_empty() { text } else { rest });
    }

    /// The next call of the reply, numbered.
    fn new_call(&mut self, name: String, arguments: Map<String, Value>) -> ToolCall {
        let id = format!("{}{}", self.id_prefix, self.calls);
        self.calls += 1;
        ToolCall { id, name, arguments: Value::Object(arguments).to_string() }
    }
}

/// Bytes at the end of `text` that may begin `tag` (ASCII), cut off by the piece's end.
fn partial_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len()).rev().find(|&n| text.ends_with(&tag[..n])).unwrap_or(0)
}

/// The `function` object of the tool called `name`.
fn find_tool<'a>(tools: &'a [Value], name: &str) -> Option<&'a Value> {
    tools.iter().filter_map(|tool| tool.get("function")).find(|function| function["name"] == name)
}

/// Name and arguments of a JSON call object whose arguments are under the first of
/// `keys` present; `None` unless it is a well-formed call to one of `tools`.
fn call_from_json(value: Value, keys: &[&str], tools: &[Value]) -> Option<(String, Map<String, Value>)> {
    let Value::Object(mut object) = value else { return None };
    let name = object.get("name")?.as_str()?.to_owned();
    find_tool(tools, &name)?;
    match keys.iter().find_map(|key| object.remove(*key))? {
        Value::Object(arguments) => Some((name, arguments)),
        _ => None,
    }
}

/// Hermes: the JSON between the tags.
fn read_hermes_call(body: &str, tools: &[Value]) -> Option<(String, Map<String, Value>)> {
    call_from_json(serde_json::from_str(body).ok()?, &["arguments"], tools)
}

/// Llama: the call object `text` starts with, and the text after it.
fn read_llama_call<'a>(text: &'a str, tools: &[Value]) -> Option<(String, Map<String, Value>, &'a str)> {
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let value = values.next()?.ok()?;
    let after = &text[values.byte_offset()..];
    let (name, arguments) = call_from_json(value, &["parameters", "arguments"], tools)?;
    Some((name, arguments, after))
}

/// Qwen3-Coder: `<function=NAME>` and its `<parameter=KEY>` blocks between the tags, each
/// value typed by the tool's schema.
fn read_xml_call(body: &str, tools: &[Value]) -> Option<(String, Map<String, Value>)> {
    let inner = body.trim().strip_prefix("<function=")?.strip_suffix("</function>")?;
    let (name, mut params) = inner.split_once('>')?;
    let name = name.trim();
    let function = find_tool(tools, name)?;
    let mut arguments = Map::new();
    loop {
        params = params.trim_start();
        if params.is_empty() {
            return Some((name.to_owned(), arguments));
        }
        let (key, after) = params.strip_prefix("<parameter=")?.split_once('>')?;
        let (raw, after) = after.split_once("</parameter>")?;
        let key = key.trim();
        let schema = function.get("parameters").and_then(|p| p.get("properties")).and_then(|p| p.get(key));
        arguments.insert(key.to_owned(), xml_value(raw, schema));
        params = after;
    }
}

/// A parameter's raw text (less one newline each side) as JSON: a string where the schema
/// wants one or says nothing, else the text read as JSON (a string if it does not read).
fn xml_value(raw: &str, schema: Option<&Value>) -> Value {
    let text = raw.strip_prefix('\n').unwrap_or(raw);
    let text = text.strip_suffix('\n').unwrap_or(text);
    let wants_string = match schema.and_then(|s| s.get("type")) {
        Some(Value::String(kind)) => kind == "string",
        Some(Value::Array(kinds)) => kinds.iter().any(|kind| kind == "string"),
        _ => true,
    };
    if wants_string {
        return Value::String(text.to_owned());
    }
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A weather tool (string and integer parameters) and one of every other JSON type.
    fn tools() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                "parameters": {"type": "object", "properties": {
                    "city": {"type": "string"}, "days": {"type": "integer"}}}}}),
            json!({"type": "function", "function": {"name": "configure", "parameters": {"type": "object",
                "properties": {"on": {"type": "boolean"}, "opts": {"type": "object"},
                    "tags": {"type": "array"}, "ratio": {"type": "number"}, "nothing": {"type": "null"},
                    "note": {"type": ["string", "null"]}}}}}),
        ]
    }

    /// A call as expected.
    fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
        ToolCall { id: id.into(), name: name.into(), arguments: arguments.into() }
    }

    fn whole(format: ToolFormat, text: &str) -> Parsed {
        parse(format, text, &tools(), "call_")
    }

    /// Streams `pieces` and joins the output.
    fn streamed(format: ToolFormat, pieces: &[&str]) -> Parsed {
        let mut stream = ToolStream::new(format, tools(), "call_".into());
        let mut out = Parsed::default();
        for piece in pieces {
            out.append(stream.push(piece));
        }
        out.append(stream.finish());
        out
    }

    /// Streaming gives what `parse` gives, cut in two anywhere and char by char.
    fn assert_cuts_agree(format: ToolFormat, text: &str) {
        let want = whole(format, text);
        for at in (0..=text.len()).filter(|&at| text.is_char_boundary(at)) {
            assert_eq!(streamed(format, &[&text[..at], &text[at..]]), want, "{format:?} cut at {at}: {text:?}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(streamed(format, &pieces), want, "{format:?} char by char: {text:?}");
    }

    /// Content only, unchanged: whole and char by char.
    fn assert_content(format: ToolFormat, text: &str) {
        let want = Parsed { content: text.into(), calls: vec![] };
        assert_eq!(whole(format, text), want, "{format:?}: {text:?}");
        assert_cuts_agree(format, text);
    }

    const HERMES_TWO: &str = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \
        {\"city\": \"Zürich\", \"days\": 2}}\n</tool_call>\n<tool_call>{\"arguments\": {\"city\": \"Oslo\"}, \
        \"name\": \"get_weather\"}</tool_call>\n";

    const XML_ONE: &str = "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n\
        <parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

    const LLAMA_TWO: &str = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; \
        {\"name\": \"get_weather\", \"arguments\": {\"days\": 1}}";

    #[test]
    fn hermes_calls_and_content() {
        let want = Parsed {
            content: "Let me check.\n".into(),
            calls: vec![
                call("call_0", "get_weather", r#"{"city":"Zürich","days":2}"#),
                call("call_1", "get_weather", r#"{"city":"Oslo"}"#),
            ],
        };
        assert_eq!(whole(ToolFormat::Hermes, HERMES_TWO), want);
        // Text after the calls stays; blank text between them goes.
        let text = "\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>\n\nDone.";
        let want = Parsed { content: "\n\nDone.".into(), calls: vec![call("call_0", "get_weather", "{}")] };
        assert_eq!(whole(ToolFormat::Hermes, text), want);
    }

    #[test]
    fn qwen_xml_values_follow_the_schema() {
        let want = Parsed {
            content: String::new(),
            calls: vec![call("call_0", "get_weather", r#"{"city":"New\nYork","days":3}"#)],
        };
        assert_eq!(whole(ToolFormat::QwenXml, XML_ONE), want);

        let text = "<tool_call>\n<function=configure>\n<parameter=nothing>\nnull\n</parameter>\n\
            <parameter=note>\n42\n</parameter>\n<parameter=on>\ntrue\n</parameter>\n\
            <parameter=opts>\n{\"a\": [1]}\n</parameter>\n<parameter=ratio>\nabout half\n</parameter>\n\
            <parameter=tags>\n[\"x\", \"y\"]\n</parameter>\n<parameter=extra>\n\n two \n\n</parameter>\n\
            </function>\n</tool_call>";
        let arguments = json!({"extra": "\n two \n", "nothing": null, "note": "42", "on": true,
            "opts": {"a": [1]}, "ratio": "about half", "tags": ["x", "y"]});
        let got = whole(ToolFormat::QwenXml, text);
        assert_eq!(got.calls.len(), 1);
        let parsed: Value = serde_json::from_str(&got.calls[0].arguments).expect("arguments are JSON");
        assert_eq!(parsed, arguments);
    }

    #[test]
    fn llama_calls_and_plain_replies() {
        let want = Parsed {
            content: String::new(),
            calls: vec![
                call("call_0", "get_weather", r#"{"city":"Paris"}"#),
                call("call_1", "get_weather", r#"{"days":1}"#),
            ],
        };
        assert_eq!(whole(ToolFormat::LlamaJson, LLAMA_TWO), want);
        let text = " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}\n";
        assert_eq!(whole(ToolFormat::LlamaJson, text).calls, vec![call("call_0", "get_weather", r#"{"city":"Rome"}"#)]);

        // A plain reply streams at once; one that may be calls waits for the end.
        let mut stream = ToolStream::new(ToolFormat::LlamaJson, tools(), "c".into());
        assert_eq!(stream.push(" The").content, " The");
        assert_eq!(stream.push(" {x}").content, " {x}");
        let mut stream = ToolStream::new(ToolFormat::LlamaJson, tools(), "c".into());
        assert_eq!(stream.push(" {\"name\"").content, "");
    }

    #[test]
    fn a_good_call_after_a_bad_one_is_still_a_call() {
        let text = "<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>\n\
            <tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>";
        let want = Parsed {
            content: "<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>\n".into(),
            calls: vec![call("call_0", "get_weather", "{}")],
        };
        assert_eq!(whole(ToolFormat::Hermes, text), want);
        // Llama: from the first bad call on, the rest is content.
        let text = "{\"name\": \"get_weather\", \"parameters\": {}}; {\"name\": \"nope\", \"parameters\": {}}";
        let want = Parsed {
            content: "{\"name\": \"nope\", \"parameters\": {}}".into(),
            calls: vec![call("call_0", "get_weather", "{}")],
        };
        assert_eq!(whole(ToolFormat::LlamaJson, text), want);
    }

    #[test]
    fn bad_calls_are_content_unchanged() {
        let hermes = [
            "<tool_call>{\"name\": \"get_weather\", \"arguments\": {</tool_call>", // invalid JSON
            "Sure. <tool_call>{\"name\": \"get_weather\", \"arguments\": {}}",     // unclosed
            "<tool_call>{\"name\": \"delete_all\", \"arguments\": {}}</tool_call>", // unknown name
            "<tool_call>{\"name\": \"get_weather\", \"arguments\": \"{}\"}</tool_call>", // not an object
            "<tool_call>{\"arguments\": {}}</tool_call>",                          // no name
            "<tool_call>[1, 2]</tool_call> and <tool_",                            // not an object, cut opener
        ];
        for text in hermes {
            assert_content(ToolFormat::Hermes, text);
        }
        let xml = [
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</tool_call>",
            "<tool_call>\n<function=rm>\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n</function>\n",
            "<tool_call>\n<function=get_weather>\nstray text\n</function>\n</tool_call>",
        ];
        for text in xml {
            assert_content(ToolFormat::QwenXml, text);
        }
        let llama = [
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": }",
            "{\"name\": \"rm\", \"parameters\": {}}",
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": [1]}",
            "{\"answer\": 42}",
            "  <|python_tag|>",
            "<|python",
            "   ",
        ];
        for text in llama {
            assert_content(ToolFormat::LlamaJson, text);
        }
    }

    #[test]
    fn a_cut_opener_is_held_until_settled() {
        let mut stream = ToolStream::new(ToolFormat::Hermes, tools(), "c".into());
        assert_eq!(stream.push("Hi <tool").content, "Hi ");
        assert_eq!(stream.push("box>").content, "<toolbox>");
        assert_eq!(stream.push("<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}").content, "");
        let out = stream.push("</tool_call>");
        assert_eq!(out.calls, vec![call("c0", "get_weather", "{}")]);
        assert_eq!(stream.finish(), Parsed::default());
    }

    #[test]
    fn streaming_matches_parse_wherever_the_text_is_cut() {
        let hermes = [
            HERMES_TWO,
            "Plain answer, é ✓, a < b.",
            "\n <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Köln\"}}</tool_call> \n",
            "<tool_call>{\"name\": \"x\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"get_weather\", \
             \"arguments\": {}}</tool_call>\n<tool_call>{\"name",
        ];
        for text in hermes {
            assert_cuts_agree(ToolFormat::Hermes, text);
        }
        for text in [
            XML_ONE,
            "Doing it: ✓\n<tool_call>\n<function=configure>\n<parameter=on>\nfalse\n</parameter>\n</function>\n</tool_call>",
        ] {
            assert_cuts_agree(ToolFormat::QwenXml, text);
        }
        for text in [LLAMA_TWO, "It is ☀ in Paris.", "\n{\"name\": \"get_weather\", \"parameters\": {}};"] {
            assert_cuts_agree(ToolFormat::LlamaJson, text);
        }
    }

    #[test]
    fn formats_from_templates() {
        let qwen = "{%- if tools %}{{- '<|im_start|>system\\n' }}# Tools\\n<tools>{% for tool in tools %}\
            {{- tool | tojson }}{% endfor %}</tools>\\nReturn each call within <tool_call></tool_call> tags:\\n\
            <tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>{% endif %}";
        let coder = "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{%- for name, value in \
            tool_call.arguments | items %}{{- '<parameter=' + name + '>\\n' }}{%- endfor %}";
        let llama = "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}Respond in the format \
            {\"name\": function name, \"parameters\": dictionary of argument name and its value}.\
            {%- if message.role == 'ipython' %}{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}{% endif %}";
        let llama3 = "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}";
        assert_eq!(ToolFormat::detect(qwen), Some(ToolFormat::Hermes));
        assert_eq!(ToolFormat::detect(coder), Some(ToolFormat::QwenXml));
        assert_eq!(ToolFormat::detect(llama), Some(ToolFormat::LlamaJson));
        assert_eq!(ToolFormat::detect(llama3), None);
        assert_eq!(ToolFormat::detect(strata_runtime::chat::CHATML), None);
    }
}
