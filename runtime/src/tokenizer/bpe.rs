//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): GPT-2's byte-to-unicode mapping,
//! the pre-tokenizer regexes llama.cpp uses for each `tokenizer.ggml.pre`, and merges
//! applied by rank.
//!
//! Token ids match llama.cpp's: the same regexes split the text (each regex splits the
//! pieces left by the previous one; text between matches is kept as its own piece), and
//! merges are applied lowest rank first, leftmost first on ties.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use fancy_regex::Regex;

use super::{TokenizerError, Vocab};

/// Bytes GPT-2 maps to the code point of the same value: printable Latin-1.
const fn printable(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// GPT-2's byte-to-unicode table: printable bytes stand for themselves, the other 68
/// bytes take U+0100 upward in byte order, so every byte is a visible character.
const BYTE_CHARS: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut extra = 0;
    let mut b = 0;
    while b < 256 {
        table[b] = if printable(b as u8) {
            b as u32
        } else {
            extra += 1;
            255 + extra
        };
        b += 1;
    }
    table
};

/// The character standing for byte `b`.
pub(super) fn byte_char(b: u8) -> char {
    char::from_u32(BYTE_CHARS[usize::from(b)]).unwrap_or('\u{FFFD}')
}

/// The byte a character of a byte-level token stands for, if it is one of the 256.
pub(super) fn char_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp < 256 && printable(cp as u8) {
        return Some(cp as u8);
    }
    if !(256..256 + 68).contains(&cp) {
        return None;
    }
    (0..=255u8).find(|&b| BYTE_CHARS[usize::from(b)] == cp)
}

/// GPT-2's pattern. llama.cpp treats it specially (hand-written matcher); the matcher
/// and the regex agree, so the regex is used here.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3's pattern, with the case-insensitive contractions spelled out as llama.cpp does.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's pattern: Llama 3's with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's pattern: Qwen2's with combining marks kept in words.
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Tekken's pattern as llama.cpp adapts it (letter case by look-ahead).
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-4o / Llama 4's pattern as llama.cpp adapts it.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// DeepSeek V3's main pattern.
const DEEPSEEK3: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;
/// Bloom / Poro / GPT3-Finnish: words with their leading space.
const BLOOM: &str = r" ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+";
/// Han and Hangul runs (DeepSeek).
const CJK_HANGUL: &str = r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+";
/// Han and kana runs (DeepSeek V3).
const CJK_KANA: &str = r"[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+";

/// How `tokenizer.ggml.pre` changes tokenization: the regexes, and the two flags
/// llama.cpp ties to the pre-tokenizer name.
pub(super) struct PreType {
    /// Applied in order, each to the pieces the previous one left.
    pub patterns: &'static [&'static str],
    /// A whole piece that is itself a token is taken as is, without merging (Llama 3).
    pub ignore_merges: bool,
    /// llama.cpp's default for `add_bos` when the pack does not say.
    pub add_bos: bool,
    /// llama.cpp drops the BOS token for this type (ChatGLM).
    pub no_bos: bool,
}

impl PreType {
    /// The type for a `tokenizer.ggml.pre` value, as llama.cpp maps the names; `None`
    /// for a name strata does not know (llama.cpp refuses a name it does not know too):
    /// guessing a pattern would give ids that differ from the model's own tokenizer
    /// around digits and whitespace, without a word.
    ///
    /// An empty or missing value is llama.cpp's "default".
    pub(super) fn from_name(name: &str) -> Option<PreType> {
        let plain = |patterns| PreType { patterns, ignore_merges: false, add_bos: false, no_bos: false };
        Some(match name {
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
            | "jina-v5-nano" => PreType { patterns: &[LLAMA3], ignore_merges: true, add_bos: true, no_bos: false },
            "dbrx" | "smaug-bpe" => plain(&[LLAMA3]),
            "chatglm-bpe" => PreType { patterns: &[LLAMA3], ignore_merges: false, add_bos: false, no_bos: true },
            "glm4" | "glm5" => PreType { patterns: &[LLAMA3], ignore_merges: true, add_bos: false, no_bos: true },
            "tekken" => PreType { patterns: &[TEKKEN], ignore_merges: true, add_bos: true, no_bos: false },
            "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => plain(&[GPT4O]),
            "deepseek-llm" => plain(&[
                "[\r\n]",
                concat!(
                    r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}",
                    r"\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}",
                    r"\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}",
                    r"\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}",
                    r"\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}",
                    r"\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}",
                    r"\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}",
                    r"\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}",
                    r"\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}",
                    r"\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}",
                    r"\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+",
                ),
                r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+",
                r"\s+$",
                CJK_HANGUL,
                r"\p{N}+",
            ]),
            "deepseek-coder" => plain(&["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK_HANGUL, r"\p{N}"]),
            "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => plain(&[r"\p{N}{1,3}", CJK_KANA, DEEPSEEK3]),
            "falcon" => plain(&[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"]),
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
                plain(&[r"\p{N}", GPT2])
            }
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2" | "hunyuan" | "solar-open" => {
                plain(&[QWEN2])
            }
            "qwen35" => plain(&[QWEN35]),
            "poro-chat" | "bloom" | "gpt3-finnish" => plain(&[BLOOM]),
            "viking" => plain(&[BLOOM, r"\p{N}"]),
            "" | "default" => plain(&[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"]),
            // The names llama.cpp gives GPT-2's pattern.
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0"
            | "mellum" | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" | "exaone4" | "mpt" | "olmo"
            | "jais" | "trillion" | "granite-docling" => plain(&[GPT2]),
            _ => return None,
        })
    }
}

/// Splits `text` with each regex in turn: every piece is cut into its matches and the
/// text between them, all kept, in order.
fn pre_split<'t>(regexes: &[Regex], text: &'t str) -> Vec<&'t str> {
    let mut pieces = vec![text];
    for re in regexes {
        let mut next = Vec::with_capacity(pieces.len() * 2);
        for piece in pieces {
            let mut last = 0;
            for m in re.find_iter(piece) {
                // An error (backtracking limit) leaves the rest of the piece whole.
                let Ok(m) = m else { break };
                if m.start() > last {
                    next.push(&piece[last..m.start()]);
                }
                if m.end() > m.start() {
                    next.push(m.as_str());
                }
                last = m.end();
            }
            if last < piece.len() {
                next.push(&piece[last..]);
            }
        }
        pieces = next;
    }
    pieces
}

/// One symbol of a word being merged: a token id (none for a byte whose character is
/// not in the vocabulary) and its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    id: Option<u32>,
    prev: Option<usize>,
    next: Option<usize>,
    alive: bool,
}

/// A candidate merge: rank first, then leftmost, as llama.cpp orders them. The ids let
/// a candidate made stale by an earlier merge be recognized and skipped.
type Candidate = Reverse<(u32, usize, usize, u32, u32)>;

/// A byte-level BPE tokenizer.
pub(super) struct Bpe {
    regexes: Vec<Regex>,
    /// (left id, right id) -> (rank, merged id).
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// The token of each byte's character.
    byte_ids: [Option<u32>; 256],
    ignore_merges: bool,
}

impl Bpe {
    /// Builds the tokenizer from the vocabulary, the `"left right"` merge lines in rank
    /// order, and the pre-tokenizer type.
    pub(super) fn new(vocab: &Vocab, merges: &[String], pre: &PreType) -> Result<Bpe, TokenizerError> {
        let regexes = pre
            .patterns
            .iter()
            .map(|p| {
                Regex::new(p).map_err(|e| TokenizerError::Invalid {
                    key: "tokenizer.ggml.pre".into(),
                    what: format!("pattern {p:?} does not compile: {e}"),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut table = HashMap::with_capacity(merges.len());
        for (rank, line) in merges.iter().enumerate() {
            let invalid = |what: String| TokenizerError::Invalid {
                key: "tokenizer.ggml.merges".into(),
                what: format!("entry {rank} {line:?}: {what}"),
            };
            // The separator is the first space after the first character (a piece may
            // itself be a space in non-byte-level vocabularies).
            let split = line.char_indices().nth(1).and_then(|(i, _)| line[i..].find(' ').map(|j| i + j));
            let Some(split) = split else { return Err(invalid("expected two pieces separated by a space".into())) };
            let (left, right) = (&line[..split], &line[split + 1..]);
            let id =
                |piece: &str| vocab.id(piece).ok_or_else(|| invalid(format!("{piece:?} is not in the vocabulary")));
            let (l, r) = (id(left)?, id(right)?);
            let joined = format!("{left}{right}");
            let merged = vocab
                .id(&joined)
                .ok_or_else(|| invalid(format!("the merged piece {joined:?} is not in the vocabulary")))?;
            let rank = u32::try_from(rank).map_err(|_| invalid("too many merges".into()))?;
            // llama.cpp keeps the first rank of a repeated pair.
            table.entry((l, r)).or_insert((rank, merged));
        }
        let mut byte_ids = [None; 256];
        let mut buf = [0u8; 4];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = vocab.id(byte_char(b as u8).encode_utf8(&mut buf));
        }
        Ok(Bpe { regexes, merges: table, byte_ids, ignore_merges: pre.ignore_merges })
    }

    /// Appends the tokens of `text` (a fragment without special tokens) to `out`.
    pub(super) fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        let mut encoded = String::new();
        for word in pre_split(&self.regexes, text) {
            if self.ignore_merges {
                encoded.clear();
                encoded.extend(word.bytes().map(byte_char));
                if let Some(id) = vocab.id(&encoded) {
                    out.push(id);
                    continue;
                }
            }
            self.encode_word(word.as_bytes(), out);
        }
    }

    /// Merges the bytes of one pre-tokenized word.
    fn encode_word(&self, word: &[u8], out: &mut Vec<u32>) {
        let n = word.len();
        let mut symbols: Vec<Symbol> = word
            .iter()
            .enumerate()
            .map(|(i, &b)| Symbol {
                id: self.byte_ids[usize::from(b)],
                prev: i.checked_sub(1),
                next: (i + 1 < n).then_some(i + 1),
                alive: true,
            })
            .collect();
        let mut queue: BinaryHeap<Candidate> = BinaryHeap::new();
        let push = |queue: &mut BinaryHeap<Candidate>, symbols: &[Symbol], left: usize| {
            let Some(right) = symbols[left].next else { return };
            let (Some(l), Some(r)) = (symbols[left].id, symbols[right].id) else { return };
            if let Some(&(rank, _)) = self.merges.get(&(l, r)) {
                queue.push(Reverse((rank, left, right, l, r)));
            }
        };
        for left in 0..n.saturating_sub(1) {
            push(&mut queue, &symbols, left);
        }
        while let Some(Reverse((_, left, right, l, r))) = queue.pop() {
            let (ls, rs) = (symbols[left], symbols[right]);
            if !ls.alive || !rs.alive || ls.next != Some(right) || ls.id != Some(l) || rs.id != Some(r) {
                continue;
            }
            let Some(&(_, merged)) = self.merges.get(&(l, r)) else { continue };
            symbols[left].id = Some(merged);
            symbols[left].next = rs.next;
            symbols[right].alive = false;
            if let Some(next) = rs.next {
                symbols[next].prev = Some(left);
            }
            if let Some(prev) = ls.prev {
                push(&mut queue, &symbols, prev);
            }
            push(&mut queue, &symbols, left);
        }
        // A byte whose character is not a token is dropped, as llama.cpp does (its
        // fallback looks the character's bytes up one by one, which finds nothing).
        let mut at = (n > 0).then_some(0);
        while let Some(i) = at {
            out.extend(symbols[i].id);
            at = symbols[i].next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_gpt2s() {
        assert_eq!(byte_char(b'a'), 'a');
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
        assert_eq!(byte_char(0), 'Ā');
        assert_eq!(byte_char(0xAD), 'Ń');
        for b in 0..=255u8 {
            assert_eq!(char_byte(byte_char(b)), Some(b));
        }
        assert_eq!(char_byte('é'), Some(0xE9));
        assert_eq!(char_byte('€'), None);
    }

    #[test]
    fn every_pattern_compiles() {
        for name in [
            "default",
            "gpt-2",
            "llama-bpe",
            "dbrx",
            "chatglm-bpe",
            "tekken",
            "gpt-4o",
            "deepseek-llm",
            "deepseek-coder",
            "deepseek-v3",
            "falcon",
            "smollm",
            "qwen2",
            "qwen35",
            "bloom",
            "viking",
        ] {
            for p in PreType::from_name(name).expect("known").patterns {
                if let Err(e) = Regex::new(p) {
                    panic!("{name}: {p}: {e:?}");
                }
            }
        }
    }

    #[test]
    fn splitting_keeps_text_between_matches() {
        let re = [Regex::new(r"\p{N}").unwrap(), Regex::new(GPT2).unwrap()];
        assert_eq!(pre_split(&re, "ab 12  cd\n"), vec!["ab", " ", "1", "2", " ", " cd", "\n"]);
        assert_eq!(pre_split(&re, "I'm  ok"), vec!["I", "'m", " ", " ok"]);
    }
}
