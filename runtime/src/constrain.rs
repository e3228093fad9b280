//! Constrained decoding: a JSON schema or a Lark grammar, compiled by llguidance over the
//! pack's vocabulary, masks each step's logits so that only tokens that keep the output
//! inside the grammar can be drawn. The output then parses by construction, however weak
//! the model: what OpenAI's `response_format` (strict) and a forced tool call promise.
//!
//! The vocabulary is read once per tokenizer ([`Grammars::new`]): every token's bytes,
//! control tokens marked apart (text can never spell `<|im_end|>`), and the
//! end-of-generation tokens as the grammar's end. A [`Constraint`] follows one request:
//! [`Constraint::mask`] before each draw, [`Constraint::accept`] after it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};

use crate::tokenizer::Tokenizer;

/// Why a grammar could not be built or followed.
#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    /// The schema or grammar does not compile (llguidance's message, which names the part).
    #[error("{0}")]
    Grammar(String),
    /// The pack has no end-of-generation token to finish a constrained output with.
    #[error("the pack's tokenizer has no end-of-generation token")]
    NoEnd,
    /// The grammar refused a token or failed mid-way (llguidance's message).
    #[error("constrained decoding failed: {0}")]
    Step(String),
}

/// The pack's vocabulary as llguidance reads it; builds each request's [`Constraint`].
/// Building it walks the whole vocabulary (milliseconds): once per server or run.
pub struct Grammars {
    factory: ParserFactory,
}

impl Grammars {
    /// Reads `t`'s vocabulary: each token's bytes; control tokens behind llguidance's
    /// special-token marker, so that no grammar text matches them; the end-of-generation
    /// tokens as the end of a finished grammar.
    pub fn new(t: &Tokenizer) -> Result<Grammars, ConstraintError> {
        let n = t.vocab_size() as u32;
        let words: Vec<Vec<u8>> = (0..n)
            .map(|id| {
                if t.is_control(id) {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(t.token_text(id).as_bytes());
                    w
                } else {
                    t.token_bytes(id)
                }
            })
            .collect();
        let ends: Vec<u32> = (0..n).filter(|&id| t.is_eog(id)).collect();
        let first = t.eos().filter(|&e| t.is_eog(e)).or(ends.first().copied()).ok_or(ConstraintError::NoEnd)?;
        let info = TokRxInfo { tok_bos: t.bos(), ..TokRxInfo::new(n, first) };
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&ends);
        let env: llguidance::toktrie::TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Grammar(e.to_string()))?;
        factory.quiet();
        Ok(Grammars { factory })
    }

    /// Output that is one JSON value valid under `schema` (JSON Schema; `{"type":
    /// "object"}` for any object), written as [`compact_json`] says.
    pub fn json_schema(&self, schema: &serde_json::Value) -> Result<Constraint, ConstraintError> {
        self.build(TopLevelGrammar::from_json_schema(compact_json(schema)))
    }

    /// Output in the language of a Lark grammar (llguidance's dialect: `%json {...}`
    /// embeds a schema).
    pub fn lark(&self, grammar: &str) -> Result<Constraint, ConstraintError> {
        self.build(TopLevelGrammar::from_lark(grammar.to_owned()))
    }

    fn build(&self, grammar: TopLevelGrammar) -> Result<Constraint, ConstraintError> {
        let parser = self.factory.create_parser(grammar).map_err(|e| ConstraintError::Grammar(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstraintError::Grammar(e));
        }
        Ok(Constraint { matcher, allowed: None, spent: Duration::ZERO, masks: 0 })
    }
}

/// `schema` with llguidance's layout options set: no free whitespace (a model that
/// prefers newlines could otherwise pad forever before the next key) and Python's
/// `json.dumps` separators, `", "` and `": "`, the layout chat models see tool calls in.
/// Embed the result in a Lark grammar's `%json` for the same layout there.
pub fn compact_json(schema: &serde_json::Value) -> serde_json::Value {
    let mut schema = schema.clone();
    if let Some(o) = schema.as_object_mut() {
        let layout = serde_json::json!({ "item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false });
        o.insert("x-guidance".into(), layout);
    }
    schema
}

/// One request's place in its grammar.
pub struct Constraint {
    matcher: Matcher,
    /// The tokens allowed next, once computed for this step.
    allowed: Option<SimpleVob>,
    /// Time spent computing masks, and how many.
    spent: Duration,
    masks: u32,
}

impl Constraint {
    /// Computes which tokens may come next (the costly part, from a few microseconds to a
    /// millisecond): call it while the device computes the logits, so that [`mask`]
    /// finds it done. Idempotent until the next [`accept`].
    ///
    /// [`mask`]: Constraint::mask
    /// [`accept`]: Constraint::accept
    pub fn prepare(&mut self) -> Result<(), ConstraintError> {
        if self.allowed.is_none() {
            let start = Instant::now();
            let allowed = self.matcher.compute_mask_or_eos().map_err(|e| ConstraintError::Step(e.to_string()))?;
            self.spent += start.elapsed();
            self.masks += 1;
            self.allowed = Some(allowed);
        }
        Ok(())
    }

    /// Sets the logit of every token the grammar forbids next to minus infinity.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError> {
        self.prepare()?;
        if let Some(allowed) = &self.allowed {
            for (id, l) in logits.iter_mut().enumerate() {
                if !allowed.is_allowed(id as u32) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        Ok(())
    }

    /// Moves past `token`, which a masked draw chose.
    pub fn accept(&mut self, token: u32) -> Result<(), ConstraintError> {
        self.allowed = None;
        self.matcher.consume_token(token).map_err(|e| ConstraintError::Step(e.to_string()))
    }

    /// The mean time one mask took to compute, and how many were: the grammar's cost a
    /// token (hidden where the device computes the logits meanwhile).
    pub fn mask_cost(&self) -> (Duration, u32) {
        (self.spent.checked_div(self.masks).unwrap_or_default(), self.masks)
    }

    /// Whether the output is complete: the grammar allows nothing but its end.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}
