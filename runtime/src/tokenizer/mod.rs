//! The tokenizer stored in a pack's `tokenizer.*` keys, giving the token ids llama.cpp
//! gives for the same pack: byte-level BPE (`gpt2`, in `bpe.rs`) and SentencePiece BPE
//! (`llama`, in `spm.rs`), special-token splitting, BOS/EOS rules, end-of-generation
//! tokens, and printing tokens back to bytes.

mod bpe;
mod spm;
mod stream;

pub use stream::StreamDecoder;

use std::collections::{HashMap, HashSet};

use strata_compiler::pack::{Array, Metadata, Pack, PackErrorKind, Value};

/// Why a pack's tokenizer cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A required key is absent.
    #[error("tokenizer: missing key {0}")]
    Missing(&'static str),
    /// A key holds the wrong type or an unusable value.
    #[error("tokenizer: key {key}: {what}")]
    Invalid {
        /// The key.
        key: String,
        /// What was found and what was expected.
        what: String,
    },
    /// A key's value has the wrong type (reported by the pack's typed accessors).
    #[error("tokenizer: {0}")]
    Metadata(#[from] PackErrorKind),
    /// `tokenizer.ggml.model` names a tokenizer that is not implemented.
    #[error("tokenizer: tokenizer.ggml.model {0:?} is not supported (expected \"gpt2\" or \"llama\")")]
    UnsupportedModel(String),
}

/// Token attributes, as llama.cpp derives them from `tokenizer.ggml.token_type` (and
/// adjusts by token text). Bit flags, since a token can be e.g. normal and control.
mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    pub const RSTRIP: u16 = 1 << 6;

    /// The attribute of a `token_type` value (0 and unknown values: none).
    pub fn from_type(t: i32) -> u16 {
        match t {
            1 => NORMAL,
            2 => UNKNOWN,
            3 => CONTROL,
            4 => USER_DEFINED,
            5 => UNUSED,
            6 => BYTE,
            _ => 0,
        }
    }
}

/// Token texts that llama.cpp makes end-of-generation (and control) wherever they occur.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Texts llama.cpp looks for when a pack does not give its EOT token.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Fill-in-the-middle tokens llama.cpp finds by text when their key is absent (made
/// control; the pad, repo and file-separator ones also end generation).
const FIM_PRE: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP: &[&str] = &["<|file_sep|>"];
/// Each FIM token's key and the texts that stand for it when the key is absent.
const FIM: [(&str, &[&str]); 6] = [
    ("tokenizer.ggml.fim_pre_token_id", FIM_PRE),
    ("tokenizer.ggml.fim_suf_token_id", FIM_SUF),
    ("tokenizer.ggml.fim_mid_token_id", FIM_MID),
    ("tokenizer.ggml.fim_pad_token_id", FIM_PAD),
    ("tokenizer.ggml.fim_rep_token_id", FIM_REP),
    ("tokenizer.ggml.fim_sep_token_id", FIM_SEP),
];

/// The vocabulary: texts, attributes, scores, and the text-to-id index.
pub(crate) struct Vocab {
    texts: Vec<String>,
    attrs: Vec<u16>,
    scores: Vec<f32>,
    index: HashMap<String, u32>,
}

impl Vocab {
    /// The id of the token with this exact text (the last one, if repeated).
    pub(crate) fn id(&self, text: &str) -> Option<u32> {
        self.index.get(text).copied()
    }

    /// The token's score (SentencePiece merge priority).
    pub(crate) fn score(&self, id: u32) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }

    fn attr(&self, id: u32) -> u16 {
        self.attrs.get(id as usize).copied().unwrap_or(0)
    }
}

/// The tokenizing algorithm of the pack.
enum Model {
    Bpe(bpe::Bpe),
    Spm(spm::Spm),
}

/// A piece of the input: raw text, or a special token written in it.
enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// A pack's tokenizer.
pub struct Tokenizer {
    vocab: Vocab,
    model: Model,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    eog: HashSet<u32>,
    /// Control, user-defined and unknown tokens, longest text first: matched in the
    /// input before tokenizing the text around them.
    specials: Vec<u32>,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.model {
            Model::Bpe(_) => "byte-level BPE",
            Model::Spm(_) => "SentencePiece",
        };
        f.debug_struct("Tokenizer").field("kind", &kind).field("vocab", &self.vocab.texts.len()).finish()
    }
}

/// A typed array under `key`, or a one-line error naming the key and what it holds.
fn array<'a, T>(
    md: &'a Metadata,
    key: &str,
    expected: &str,
    pick: impl Fn(&'a Array) -> Option<T>,
) -> Result<Option<T>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::Array(a)) => pick(a).map(Some).ok_or_else(|| TokenizerError::Invalid {
            key: key.into(),
            what: format!("expected {expected}, found an array of {}", a.element_type().name()),
        }),
        Some(v) => Err(TokenizerError::Invalid {
            key: key.into(),
            what: format!("expected {expected}, found {} {}", v.value_type().name(), v.display(4)),
        }),
    }
}

/// The key holding the vocabulary.
const TOKENS: &str = "tokenizer.ggml.tokens";

/// Checks that a per-token array covers every token.
fn covers(key: &str, len: usize, n: usize) -> Result<(), TokenizerError> {
    if len < n {
        return Err(TokenizerError::Invalid { key: key.into(), what: format!("has {len} entries for {n} tokens") });
    }
    Ok(())
}

impl Tokenizer {
    /// Reads the tokenizer from the pack's metadata, following llama.cpp's defaults for
    /// whatever the pack leaves out.
    ///
    /// The vocabulary is checked against the embedding first: an id past
    /// `token_embd.weight`'s rows has no embedding to look up, and a corrupt count (30 M
    /// empty tokens) would otherwise be expanded into names and an index before any
    /// other check could refuse it.
    pub fn from_pack(pack: &Pack) -> Result<Tokenizer, TokenizerError> {
        if let (Some(embd), Ok(Some(tokens))) = (pack.tensor("token_embd.weight"), pack.metadata().array(TOKENS)) {
            let rows = embd.shape.get(1).copied().unwrap_or(0);
            if tokens.len() as u64 > rows {
                return Err(TokenizerError::Invalid {
                    key: TOKENS.into(),
                    what: format!(
                        "holds {} tokens, but token_embd.weight has only {rows} rows (at most {rows} tokens)",
                        tokens.len()
                    ),
                });
            }
        }
        Self::from_metadata(pack.metadata())
    }

    fn from_metadata(md: &Metadata) -> Result<Tokenizer, TokenizerError> {
        let model_name = md.str("tokenizer.ggml.model")?.ok_or(TokenizerError::Missing("tokenizer.ggml.model"))?;
        let is_bpe = match model_name {
            "gpt2" => true,
            "llama" => false,
            other => return Err(TokenizerError::UnsupportedModel(other.into())),
        };
        let tokens = array(md, "tokenizer.ggml.tokens", "an array of strings", |a| match a {
            Array::String(v) => Some(v),
            _ => None,
        })?
        .ok_or(TokenizerError::Missing("tokenizer.ggml.tokens"))?;
        let n = tokens.len();
        if n == 0 || u32::try_from(n).is_err() {
            return Err(TokenizerError::Invalid {
                key: "tokenizer.ggml.tokens".into(),
                what: format!("holds {n} tokens, expected 1 to 2^32-1"),
            });
        }
        let types = array(md, "tokenizer.ggml.token_type", "an array of i32", |a| match a {
            Array::I32(v) => Some(v),
            _ => None,
        })?;
        if let Some(t) = types {
            covers("tokenizer.ggml.token_type", t.len(), n)?;
        }
        let scores: Vec<f32> = match array(md, "tokenizer.ggml.scores", "an array of f32 or i32", |a| match a {
            Array::F32(v) => Some(v.clone()),
            Array::I32(v) => Some(v.iter().map(|&s| s as f32).collect()),
            _ => None,
        })? {
            Some(s) => {
                covers("tokenizer.ggml.scores", s.len(), n)?;
                s
            }
            None => vec![0.0; n],
        };

        let mut texts = Vec::with_capacity(n);
        let mut index = HashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            // llama.cpp renames empty tokens so they can never match.
            let text = if t.is_empty() { format!("[EMPTY_{i}]") } else { t.clone() };
            index.insert(text.clone(), i as u32);
            texts.push(text);
        }
        let attrs = match types {
            Some(t) => t[..n].iter().map(|&t| attr::from_type(t)).collect(),
            None => vec![attr::NORMAL; n],
        };
        let mut vocab = Vocab { texts, attrs, scores, index };

        let pre_name = md.str("tokenizer.ggml.pre")?.unwrap_or("");
        // llama.cpp reads the pre-tokenizer of byte-level BPE only.
        let pre =
            bpe::PreType::from_name(if is_bpe { pre_name } else { "" }).ok_or_else(|| TokenizerError::Invalid {
                key: "tokenizer.ggml.pre".into(),
                what: format!("pre-tokenizer {pre_name:?} is not supported (README: supported models)"),
            })?;
        // Defaults per tokenizer model, as llama.cpp sets them before reading the keys.
        let (mut bos, mut eos, mut unk) = if is_bpe { (Some(11), Some(11), None) } else { (Some(1), Some(2), Some(0)) };
        let (mut add_bos, mut add_space_prefix) = if is_bpe { (pre.add_bos, false) } else { (true, true) };
        if is_bpe && pre.no_bos {
            bos = None;
        }
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let id_key = |key: &str, default: Option<u32>| -> Result<Option<u32>, TokenizerError> {
            // An id past the vocabulary keeps the default, as llama.cpp does.
            Ok(in_range(md.u32(key)?).or(in_range(default)))
        };
        bos = id_key("tokenizer.ggml.bos_token_id", bos)?;
        eos = id_key("tokenizer.ggml.eos_token_id", eos)?;
        unk = id_key("tokenizer.ggml.unknown_token_id", unk)?;
        let mut eot = id_key("tokenizer.ggml.eot_token_id", None)?;
        let mut eom = id_key("tokenizer.ggml.eom_token_id", None)?;
        add_bos = md.bool("tokenizer.ggml.add_bos_token")?.unwrap_or(add_bos);
        let add_eos = md.bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        add_space_prefix = md.bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(add_space_prefix);

        // Tokens found by text: llama.cpp takes one per kind (here the lowest id) and
        // makes it control.
        let find = |vocab: &Vocab, candidates: &[&str]| candidates.iter().filter_map(|t| vocab.id(t)).min();
        let mark_control = |vocab: &mut Vocab, id: Option<u32>| {
            if let Some(id) = id {
                vocab.attrs[id as usize] |= attr::CONTROL;
            }
        };
        if eot.is_none() {
            eot = find(&vocab, EOT_TEXTS);
            mark_control(&mut vocab, eot);
        }
        if eom.is_none() {
            eom = find(&vocab, &["<|eom_id|>"]);
            mark_control(&mut vocab, eom);
        }
        let mut fim_ids = [None; 6];
        for (slot, (key, texts)) in fim_ids.iter_mut().zip(FIM) {
            *slot = match id_key(key, None)? {
                Some(id) => Some(id),
                None => {
                    let found = find(&vocab, texts);
                    mark_control(&mut vocab, found);
                    found
                }
            };
        }

        let mut eog: HashSet<u32> = fim_ids[3..].iter().flatten().copied().collect();
        for text in EOG_TEXTS {
            if let Some(id) = vocab.id(text) {
                eog.insert(id);
                vocab.attrs[id as usize] |= attr::CONTROL;
            }
        }
        // gpt-oss: these are always printed.
        for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = vocab.id(text) {
                vocab.attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        let eog_has = |text: &str| vocab.id(text).is_some_and(|id| eog.contains(&id));
        // gpt-oss and solar-open: "<|end|>" ends a message, not the generation.
        let end = vocab.id("<|end|>").filter(|id| eog.contains(id)).filter(|_| {
            (eog_has("<|call|>") || eog_has("<|calls|>")) && (eog_has("<|return|>") || eog_has("<|flush|>"))
        });
        // Gemma 4 and PLaMo: "</s>" is an ordinary token.
        let plain_s = vocab
            .id("</s>")
            .filter(|id| eog.contains(id))
            .filter(|_| eog_has("<|tool_response>") || eog_has("<|plamo:eos|>"));
        if let Some(end) = end {
            eog.remove(&end);
            vocab.attrs[end as usize] = attr::USER_DEFINED;
        }
        if let Some(s) = plain_s {
            eog.remove(&s);
            vocab.attrs[s as usize] = attr::NORMAL;
        }

        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&id| vocab.attr(id) & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
            .collect();
        specials.sort_by_key(|&id| std::cmp::Reverse(vocab.texts[id as usize].len()));

        // Phi-3: special tokens swallow the whitespace after them (llama.cpp sets this by
        // model name; no other per-model strip rule applies to the two supported models).
        let name = md.str("general.name").ok().flatten().unwrap_or("").to_lowercase();
        if name.contains("phi-3") || name.contains("phi3") {
            for &id in &specials {
                vocab.attrs[id as usize] |= attr::RSTRIP;
            }
            for (text, on) in [("</s>", true), ("<unk>", false), ("<s>", false), ("<|endoftext|>", false)] {
                if let Some(id) = vocab.id(text) {
                    let a = &mut vocab.attrs[id as usize];
                    *a = if on { *a | attr::RSTRIP } else { *a & !attr::RSTRIP };
                }
            }
        }

        let model = if is_bpe {
            let merges = array(md, "tokenizer.ggml.merges", "an array of strings", |a| match a {
                Array::String(v) => Some(v),
                _ => None,
            })?
            .ok_or(TokenizerError::Missing("tokenizer.ggml.merges"))?;
            Model::Bpe(bpe::Bpe::new(&vocab, merges, &pre)?)
        } else {
            Model::Spm(spm::Spm::new(&vocab, unk))
        };
        // A Gemma vocabulary without a template gets Gemma's turn format, not ChatML.
        let gemma_turns = vocab.id("<start_of_turn>").is_some() && vocab.id("<end_of_turn>").is_some();
        let chat_template = match md.str("tokenizer.chat_template")? {
            Some(t) => Some(t.to_owned()),
            None => gemma_turns.then(|| crate::chat::GEMMA.to_owned()),
        };
        Ok(Tokenizer { vocab, model, bos, eos, add_bos, add_eos, add_space_prefix, eog, specials, chat_template })
    }

    /// Token ids of `text`; special/control tokens written in the text are parsed as
    /// tokens when `parse_special` (user-defined ones always are, as in llama.cpp); a BOS
    /// is prepended only where the pack asks for one (`add_bos_token`, else llama.cpp's
    /// default for the tokenizer), EOS appended if `add_eos_token`.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        self.encode_marked(text, parse_special, &[])
    }

    /// [`Tokenizer::encode`], except that no control token is parsed from text inside
    /// the byte ranges `plain`: a chat prompt marks its messages' contents so that only
    /// the template's own markup becomes control tokens, while text across a range's
    /// edge is still encoded as one piece (the same ids as unmarked text otherwise).
    pub fn encode_marked(&self, text: &str, parse_special: bool, plain: &[std::ops::Range<usize>]) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if self.add_bos
            && let Some(bos) = self.bos
        {
            out.push(bos);
        }
        let fragments = self.partition(text, parse_special, plain);
        match &self.model {
            Model::Bpe(bpe) => {
                for f in fragments {
                    match f {
                        Fragment::Text(t) => bpe.encode(&self.vocab, t, &mut out),
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
            Model::Spm(spm) => {
                // The space prefix goes before the first text and before text that follows a
                // special token, as llama.cpp does.
                let mut after_special = true;
                for f in fragments {
                    match f {
                        Fragment::Text(t) => {
                            let prefix = if self.add_space_prefix && after_special { " " } else { "" };
                            let escaped = format!("{prefix}{t}").replace(' ', "\u{2581}");
                            spm.encode(&self.vocab, &escaped, &mut out);
                            after_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                    }
                }
            }
        }
        if self.add_eos
            && let Some(eos) = self.eos
        {
            out.push(eos);
        }
        out
    }

    /// Splits `text` at special tokens, longest token first, each at every occurrence
    /// left to right. Without `parse_special` only user-defined tokens are matched; a
    /// control or unknown token's text overlapping a range of `plain` stays text.
    fn partition<'t>(&self, text: &'t str, parse_special: bool, plain: &[std::ops::Range<usize>]) -> Vec<Fragment<'t>> {
        let base = text.as_ptr() as usize;
        let mut fragments = if text.is_empty() { Vec::new() } else { vec![Fragment::Text(text)] };
        for &id in &self.specials {
            let a = self.vocab.attr(id);
            let control = a & (attr::CONTROL | attr::UNKNOWN) != 0;
            if !parse_special && control {
                continue;
            }
            let pattern = self.vocab.texts[id as usize].as_str();
            if pattern.is_empty() || !fragments.iter().any(|f| matches!(f, Fragment::Text(t) if t.contains(pattern))) {
                continue;
            }
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for f in fragments {
                let Fragment::Text(mut rest) = f else {
                    next.push(f);
                    continue;
                };
                let mut from = 0;
                while let Some(found) = rest[from..].find(pattern) {
                    let at = from + found;
                    // Fragments are slices of `text`: this is the match's offset in it.
                    let start = rest.as_ptr() as usize - base + at;
                    if control && plain.iter().any(|r| start < r.end && r.start < start + pattern.len()) {
                        from = at + rest[at..].chars().next().map_or(1, char::len_utf8);
                        continue;
                    }
                    from = 0;
                    if at > 0 {
                        next.push(Fragment::Text(&rest[..at]));
                    }
                    next.push(Fragment::Token(id));
                    rest = &rest[at + pattern.len()..];
                    if a & attr::RSTRIP != 0 {
                        // C isspace: space, \t, \n, \v, \f, \r.
                        rest = rest.trim_start_matches([' ', '\t', '\n', '\u{b}', '\u{c}', '\r']);
                    }
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            fragments = next;
        }
        fragments
    }

    /// Bytes a token stands for when printed: byte-level BPE decoded back to bytes,
    /// SentencePiece `▁` as a space and `<0xNN>` as its byte; control and unknown tokens
    /// give nothing (they are never printed); user-defined tokens give their text.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let a = self.vocab.attr(id);
        let Some(text) = self.vocab.texts.get(id as usize) else { return Vec::new() };
        if a & (attr::CONTROL | attr::UNKNOWN) != 0 {
            return Vec::new();
        }
        if a & attr::USER_DEFINED != 0 {
            return text.as_bytes().to_vec();
        }
        if a & attr::NORMAL != 0 {
            return match self.model {
                Model::Spm(_) => text.replace('\u{2581}', " ").into_bytes(),
                Model::Bpe(_) => {
                    let mut out = Vec::with_capacity(text.len());
                    for c in text.chars() {
                        match bpe::char_byte(c) {
                            Some(b) => out.push(b),
                            // A character outside GPT-2's table: llama.cpp prints this marker.
                            None => {
                                out.extend_from_slice(b"[UNK_BYTE_0x");
                                let mut buf = [0u8; 4];
                                for b in c.encode_utf8(&mut buf).bytes() {
                                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                                }
                                out.extend_from_slice(text.as_bytes());
                                out.push(b']');
                            }
                        }
                    }
                    out
                }
            };
        }
        if a & attr::BYTE != 0 {
            // "<0xNN>"
            return text.get(3..5).and_then(|h| u8::from_str_radix(h, 16).ok()).map_or_else(Vec::new, |b| vec![b]);
        }
        // Unused and undefined tokens print nothing.
        Vec::new()
    }

    /// Whether the token is control or unknown markup (`<|im_end|>`, `<s>`): it prints
    /// nothing, so text can never spell it; constrained decoding keeps it apart.
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab.attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0
    }

    /// The text of `ids`: their bytes concatenated, invalid UTF-8 replaced.
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids.iter().flat_map(|&id| self.token_bytes(id)).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.vocab.texts.len()
    }

    /// The beginning-of-sequence token, if the pack has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token, if the pack has one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-generation: eos, eot, eom, and control tokens llama.cpp treats as EOG (e.g.
    /// "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>").
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// The token's text as stored in the vocabulary (for chat templates' `bos_token` /
    /// `eos_token`); empty for an id outside the vocabulary.
    pub fn token_text(&self, id: u32) -> &str {
        self.vocab.texts.get(id as usize).map_or("", String::as_str)
    }

    /// The pack's Jinja chat template, if it has one (a Gemma vocabulary without one:
    /// [`crate::chat::GEMMA`]).
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
}
