//! The grammar a constrained reply follows, in llguidance's Lark dialect: a
//! `response_format` schema, or forced tool calls (`tool_choice` "required" or a named
//! function) in the pack's own format ([`ToolFormat`]), each naming one of the request's
//! tools with arguments valid under its `parameters` schema; schemas embedded with
//! `%json`. A reasoning model thinks first: its `<think>` block is free text, then the
//! answer follows the grammar.

use serde_json::{Value, json};
use strata_runtime::constrain::compact_json;

use crate::tool_calls::ToolFormat;

/// What the answer must be.
pub(crate) enum Answer<'a> {
    /// One JSON value under this schema.
    Json(&'a Value),
    /// Calls to `tools` in `format` (only to `only`, when named); `several` allows more
    /// than one where the format has a way to write them.
    Calls { format: ToolFormat, tools: &'a [Value], only: Option<&'a str>, several: bool },
}

/// Where the reply starts, for a reasoning model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Thinking {
    /// No thinking block: the answer at once.
    None,
    /// The template thinks but the prompt did not open the block: the reply may open
    /// one first.
    May,
    /// The prompt opened the block: the reply thinks first.
    Opened,
}

/// The grammar of a reply: thinking as `thinking` says, then `answer`.
pub(crate) fn grammar(answer: &Answer, thinking: Thinking) -> String {
    let start = match thinking {
        Thinking::None => "start: answer",
        Thinking::May => "start: (\"<think>\" think)? answer",
        Thinking::Opened => "start: think answer",
    };
    let think = "think: thought /[ \\t\\n]{0,4}/\nthought[lazy]: /(.|\\n)*<\\/think>/\n";
    let answer = match *answer {
        Answer::Json(schema) => format!("answer: %json {}\n", compact_json(schema)),
        Answer::Calls { format, tools, only, several } => forced_calls(format, tools, only, several),
    };
    let think = if thinking == Thinking::None { "" } else { think };
    format!("{start}\n{think}{answer}")
}

/// The rules of `answer`: nothing but calls, see [`Answer::Calls`].
fn forced_calls(format: ToolFormat, tools: &[Value], only: Option<&str>, several: bool) -> String {
    let chosen: Vec<(&str, Value)> = tools
        .iter()
        .filter_map(|t| {
            let name = t["function"]["name"].as_str()?;
            let params = t["function"].get("parameters").filter(|p| p.is_object()).cloned();
            Some((name, params.unwrap_or_else(|| json!({ "type": "object" }))))
        })
        .filter(|(name, _)| only.is_none_or(|o| o == *name))
        .collect();
    let blocks = if several { "answer: block (\"\\n\" block)*" } else { "answer: block" };
    match format {
        ToolFormat::Hermes => format!(
            "{blocks}\nblock: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {}\n",
            calls(&chosen, "arguments")
        ),
        // One call: Llama's templates show a single JSON object.
        ToolFormat::LlamaJson => format!("answer: %json {}\n", calls(&chosen, "parameters")),
        ToolFormat::QwenXml => xml(blocks, &chosen),
    }
}

/// One JSON object `{"name": NAME, KEY: arguments}` for any of the tools, compact.
fn calls(tools: &[(&str, Value)], key: &str) -> Value {
    let each: Vec<Value> = tools
        .iter()
        .map(|(name, params)| {
            json!({
                "type": "object",
                "properties": { "name": { "const": name }, key: params },
                "required": ["name", key],
                "additionalProperties": false,
            })
        })
        .collect();
    let schema = match <[Value; 1]>::try_from(each) {
        Ok([one]) => one,
        Err(each) => json!({ "anyOf": each }),
    };
    compact_json(&schema)
}

/// Qwen3-Coder's blocks: `<function=NAME>` then each parameter as
/// `<parameter=KEY>\nVALUE\n</parameter>` in the schema's order (the required ones
/// always, the others optionally). A string value is text without `<` (so that it cannot
/// run into the closing tag), at most `maxLength` characters; any other value is JSON
/// under its schema.
fn xml(blocks: &str, tools: &[(&str, Value)]) -> String {
    let mut rules = vec![blocks.to_owned()];
    let functions: Vec<String> = (0..tools.len()).map(|i| format!("f{i}")).collect();
    rules.push(format!("block: \"<tool_call>\\n\" ({}) \"</tool_call>\"", functions.join(" | ")));
    for (i, (name, params)) in tools.iter().enumerate() {
        let required: Vec<&str> =
            params["required"].as_array().map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        let mut body = format!("f{i}: \"<function={name}>\\n\"");
        for (j, (key, schema)) in params["properties"].as_object().into_iter().flatten().enumerate() {
            // Text ends at the first closing tag (a lazy rule: text may hold newlines).
            let close = "\\n<\\/parameter>\\n";
            let value = match (schema.get("type").and_then(Value::as_str), schema["maxLength"].as_u64()) {
                (None | Some("string"), Some(most)) => format!("[lazy]: /[^<]{{0,{most}}}{close}/"),
                (None | Some("string"), None) => format!("[lazy]: /[^<]*{close}/"),
                (Some(_), _) => format!(": %json {} \"\\n</parameter>\\n\"", compact_json(schema)),
            };
            rules.push(format!("p{i}_{j}: \"<parameter={}>\\n\" v{i}_{j}", lark_text(key)));
            rules.push(format!("v{i}_{j}{value}"));
            let optional = if required.contains(&key.as_str()) { "" } else { "?" };
            body.push_str(&format!(" p{i}_{j}{optional}"));
        }
        body.push_str(" \"</function>\\n\"");
        rules.push(body);
    }
    rules.join("\n") + "\n"
}

/// `s` as the inside of a Lark string literal: a parameter name is the client's text.
fn lark_text(s: &str) -> String {
    let quoted = serde_json::to_string(s).unwrap_or_default();
    quoted.trim_matches('"').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<Value> {
        vec![
            json!({ "type": "function", "function": { "name": "get_weather", "parameters": {
                "type": "object",
                "properties": { "city": { "type": "string", "maxLength": 9 }, "days": { "type": "integer" } },
                "required": ["city"] } } }),
            json!({ "type": "function", "function": { "name": "now" } }),
        ]
    }

    #[test]
    fn hermes_offers_every_tool_or_the_named_one() {
        let g = forced_calls(ToolFormat::Hermes, &tools(), None, true);
        assert!(g.starts_with("answer: block (\"\\n\" block)*\nblock: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {\"anyOf\":"), "{g}");
        assert!(g.contains("\"const\":\"get_weather\"") && g.contains("\"const\":\"now\""), "{g}");
        let g = forced_calls(ToolFormat::Hermes, &tools(), Some("now"), false);
        assert!(g.starts_with("answer: block\n") && !g.contains("get_weather") && !g.contains("anyOf"), "{g}");
    }

    #[test]
    fn llama_writes_parameters_and_one_call() {
        let g = forced_calls(ToolFormat::LlamaJson, &tools(), Some("get_weather"), true);
        assert!(g.starts_with("answer: %json {"), "{g}");
        assert!(g.contains("\"required\":[\"name\",\"parameters\"]"), "{g}");
    }

    /// Grammars over a byte-level vocabulary (token `b` is byte `b`; 256 ends), so that
    /// a text's tokens are its bytes.
    fn grammars() -> strata_runtime::constrain::Grammars {
        use strata_compiler::quant::GgmlType;
        use strata_compiler::synth::{self, Preset, Tokenizer, Types};
        let shape = synth::Shape { vocab: None, ..Preset::TinyQwen3.shape() };
        let types = Types { weights: vec![GgmlType::Q8_0], embedding: GgmlType::Q8_0, output: GgmlType::Q8_0 };
        let planned = synth::plan(&shape, &types, &Tokenizer::byte_level(), "bytes").expect("planned");
        let bytes = planned.writer.to_bytes(|i, out| planned.fill(1, i, out));
        let pack = strata_compiler::pack::Pack::from_bytes("bytes", bytes).expect("a pack");
        let t = strata_runtime::tokenizer::Tokenizer::from_pack(&pack).expect("a tokenizer");
        strata_runtime::constrain::Grammars::new(&t).expect("the vocabulary reads")
    }

    /// Whether the grammar takes `text`, byte by byte, and then its end.
    fn accepts(grammar: &str, text: &str) -> bool {
        let mut c = grammars().lark(grammar).unwrap_or_else(|e| panic!("{e}: {grammar}"));
        let allowed = |c: &mut strata_runtime::constrain::Constraint, token: usize| {
            let mut logits = vec![0.0f32; 257];
            c.mask(&mut logits).expect("a mask");
            logits[token].is_finite()
        };
        for b in text.bytes() {
            if !allowed(&mut c, usize::from(b)) {
                return false;
            }
            c.accept(u32::from(b)).expect("allowed");
        }
        allowed(&mut c, 256)
    }

    #[test]
    fn the_grammars_take_what_the_formats_write() {
        let (tools, weather) = (tools(), "{\"city\": \"Paris\"}");
        let hermes = |only, several| {
            grammar(&Answer::Calls { format: ToolFormat::Hermes, tools: &tools, only, several }, Thinking::None)
        };
        let call = format!("<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {weather}}}\n</tool_call>");
        let now = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        assert!(accepts(&hermes(None, true), &call));
        assert!(accepts(&hermes(None, true), &format!("{call}\n{now}")));
        assert!(!accepts(&hermes(None, false), &format!("{call}\n{now}")), "one call");
        assert!(!accepts(&hermes(Some("now"), false), &call), "only the named one");
        assert!(!accepts(&hermes(None, true), &call.replace("Paris", "\"")), "bad arguments");

        let llama = grammar(
            &Answer::Calls { format: ToolFormat::LlamaJson, tools: &tools, only: None, several: true },
            Thinking::None,
        );
        assert!(accepts(&llama, &format!("{{\"name\": \"get_weather\", \"parameters\": {weather}}}")));

        let xml = grammar(
            &Answer::Calls { format: ToolFormat::QwenXml, tools: &tools, only: None, several: false },
            Thinking::None,
        );
        let city = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n";
        assert!(accepts(&xml, &format!("{city}</function>\n</tool_call>")));
        assert!(accepts(&xml, &format!("{city}<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")));
        assert!(!accepts(&xml, "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>"), "city is required");
        assert!(!accepts(&xml, &city.replace("Paris", "Saint-Germain-des-Prés")), "longer than maxLength");

        let schema = json!({ "type": "object", "properties": { "a": { "type": "integer" } }, "required": ["a"] });
        let json = |thinking| grammar(&Answer::Json(&schema), thinking);
        assert!(accepts(&json(Thinking::None), "{\"a\": 1}"));
        assert!(!accepts(&json(Thinking::None), "{\"a\":1}"), "Python's separators");
        assert!(accepts(&json(Thinking::May), "{\"a\": 1}"));
        assert!(accepts(&json(Thinking::May), "<think>hm, {\"a\": 0}?</think>\n\n{\"a\": 1}"));
        assert!(accepts(&json(Thinking::Opened), "Easy.</think>\n{\"a\": 1}"));
        assert!(!accepts(&json(Thinking::Opened), "{\"a\": 1}"), "the block must close first");
    }

    #[test]
    fn thinking_comes_first_when_the_prompt_opened_it_or_may() {
        let schema = json!({ "type": "object" });
        let answer = Answer::Json(&schema);
        let plain = grammar(&answer, Thinking::None);
        assert_eq!(plain, format!("start: answer\nanswer: %json {}\n", compact_json(&schema)));
        let opened = grammar(&answer, Thinking::Opened);
        assert!(opened.starts_with("start: think answer\nthink: thought "), "{opened}");
        assert!(opened.contains("thought[lazy]: /(.|\\n)*<\\/think>/"), "{opened}");
        assert!(grammar(&answer, Thinking::May).starts_with("start: (\"<think>\" think)? answer\n"));
    }

    #[test]
    fn xml_parameters_in_order_required_ones_always() {
        let g = forced_calls(ToolFormat::QwenXml, &tools(), None, false);
        assert!(g.contains("block: \"<tool_call>\\n\" (f0 | f1) \"</tool_call>\""), "{g}");
        assert!(g.contains("f0: \"<function=get_weather>\\n\" p0_0 p0_1? \"</function>\\n\""), "{g}");
        assert!(g.contains("v0_0[lazy]: /[^<]{0,9}\\n<\\/parameter>\\n/") && g.contains("v0_1: %json {"), "{g}");
        assert!(g.contains("f1: \"<function=now>\\n\" \"</function>\\n\""), "{g}");
    }
}
