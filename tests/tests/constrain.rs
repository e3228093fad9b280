//! Constrained decoding on SmolLM2's real vocabulary: whatever the logits say, a masked
//! draw writes output that parses under its schema or grammar, and ends with an
//! end-of-generation token exactly when the output is complete.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};
use strata_compiler::pack::Pack;
use strata_runtime::constrain::{self, Constraint, Grammars};
use strata_runtime::sampler::{Sampler, SamplerConfig};
use strata_runtime::tokenizer::Tokenizer;

fn tokenizer() -> Option<Tokenizer> {
    let pack = Pack::open(&strata_tests::smollm2()?).expect("the SmolLM2 pack opens");
    Some(Tokenizer::from_pack(&pack).expect("a tokenizer"))
}

/// Draws from random logits (temperature 1), masked, until an end-of-generation token;
/// returns the text, or panics after `limit` tokens.
fn run(t: &Tokenizer, c: &mut Constraint, seed: u64, limit: usize) -> String {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed,
        ..SamplerConfig::default()
    });
    let mut out = Vec::new();
    for _ in 0..limit {
        let mut logits: Vec<f32> = (0..t.vocab_size()).map(|_| rng.random_range(-4.0..4.0)).collect();
        c.mask(&mut logits).expect("a mask");
        let token = sampler.sample(&logits, &[]);
        if t.is_eog(token) {
            assert!(c.is_finished(), "ended before the grammar did: {}", t.decode(&out));
            return t.decode(&out);
        }
        c.accept(token).expect("the grammar takes the token it allowed");
        out.push(token);
    }
    panic!("no end after {limit} tokens: {}", t.decode(&out));
}

#[test]
fn random_logits_write_json_that_validates() {
    let Some(t) = tokenizer() else { return };
    let grammars = Grammars::new(&t).expect("the vocabulary reads");
    let schema = json!({
        "type": "object",
        "properties": {
            "name": { "type": "string", "maxLength": 12 },
            "age": { "type": "integer", "minimum": 0, "maximum": 120 },
            "role": { "enum": ["admin", "user"] },
            "tags": { "type": "array", "items": { "type": "string", "maxLength": 6 }, "maxItems": 3 }
        },
        "required": ["name", "age", "role"],
        "additionalProperties": false
    });
    for seed in 0..10 {
        let mut c = grammars.json_schema(&schema).expect("the schema compiles");
        let text = run(&t, &mut c, seed, 400);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        let o = v.as_object().expect("an object");
        assert!(o.keys().all(|k| ["name", "age", "role", "tags"].contains(&k.as_str())), "{text}");
        assert!(o["name"].as_str().is_some_and(|s| s.chars().count() <= 12), "{text}");
        assert!(o["age"].as_u64().is_some_and(|a| a <= 120), "{text}");
        assert!(["admin", "user"].contains(&o["role"].as_str().expect("role")), "{text}");
        if let Some(tags) = o.get("tags") {
            let tags = tags.as_array().expect("tags");
            assert!(
                tags.len() <= 3 && tags.iter().all(|s| s.as_str().is_some_and(|s| s.chars().count() <= 6)),
                "{text}"
            );
        }
    }
}

#[test]
fn a_lark_grammar_and_its_embedded_schema() {
    let Some(t) = tokenizer() else { return };
    let grammars = Grammars::new(&t).expect("the vocabulary reads");
    let call = json!({
        "type": "object",
        "properties": {
            "name": { "const": "get_weather" },
            "arguments": { "type": "object", "properties": { "city": { "type": "string", "maxLength": 8 } }, "required": ["city"], "additionalProperties": false }
        },
        "required": ["name", "arguments"],
        "additionalProperties": false
    });
    // Compact, as the server embeds schemas: llguidance's %json allows free whitespace.
    let lark =
        format!("start: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {}\n", constrain::compact_json(&call));
    for seed in 0..5 {
        let mut c = grammars.lark(&lark).expect("the grammar compiles");
        let text = run(&t, &mut c, seed, 200);
        let body = text
            .strip_prefix("<tool_call>\n")
            .and_then(|r| r.strip_suffix("\n</tool_call>"))
            .unwrap_or_else(|| panic!("{text:?}"));
        let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
        assert_eq!(v["name"], "get_weather", "{text}");
        assert!(v["arguments"]["city"].is_string(), "{text}");
    }
}

#[test]
fn bad_schemas_and_grammars_are_refused_with_the_reason() {
    let Some(t) = tokenizer() else { return };
    let grammars = Grammars::new(&t).expect("the vocabulary reads");
    let err = grammars.json_schema(&json!({ "type": "nosuchtype" })).err().expect("refused").to_string();
    assert!(err.contains("nosuchtype"), "{err}");
    let err = grammars.lark("start: missing_rule").err().expect("refused").to_string();
    assert!(err.contains("missing_rule"), "{err}");
}
