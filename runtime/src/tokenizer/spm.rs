//! SentencePiece BPE (`tokenizer.ggml.model = "llama"`) as llama.cpp runs it: the text's
//! characters are merged pairwise, always the adjacent pair whose merged piece has the
//! highest score (leftmost on ties), as long as the merged piece is a token; characters
//! left that are not tokens fall back to their `<0xNN>` byte tokens.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::Vocab;

/// One piece of the text being merged: a byte range and its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    /// Bytes; 0 once merged into its left neighbour.
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of `left` and `right` into a piece of `size` bytes.
struct Candidate {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Ord for Candidate {
    /// Highest score first, then leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Candidate {}

/// A SentencePiece tokenizer: the byte fallback table; pieces and scores are in the
/// vocabulary.
pub(super) struct Spm {
    /// The token of each byte: `<0xNN>`, else the byte itself as a one-character token,
    /// else the unknown token (where llama.cpp would abort).
    byte_ids: [Option<u32>; 256],
}

impl Spm {
    /// Builds the byte fallback table.
    pub(super) fn new(vocab: &Vocab, unk: Option<u32>) -> Spm {
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            let hex = format!("<0x{b:02X}>");
            let single = char::from_u32(b as u32).filter(|_| b < 0x80).map(String::from);
            *slot = vocab.id(&hex).or_else(|| single.and_then(|s| vocab.id(&s))).or(unk);
        }
        Spm { byte_ids }
    }

    /// Appends the tokens of `text` (spaces already written as `▁`) to `out`.
    pub(super) fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, (start, c)) in text.char_indices().enumerate() {
            symbols.push(Symbol { start, len: c.len_utf8(), prev: i.checked_sub(1), next: None });
            if i > 0 {
                symbols[i - 1].next = Some(i);
            }
        }
        let mut queue = BinaryHeap::new();
        let push = |queue: &mut BinaryHeap<Candidate>, symbols: &[Symbol], left: usize| {
            let Some(right) = symbols[left].next else { return };
            let size = symbols[left].len + symbols[right].len;
            let start = symbols[left].start;
            if let Some(id) = vocab.id(&text[start..start + size]) {
                queue.push(Candidate { score: vocab.score(id), left, right, size });
            }
        };
        for left in 0..symbols.len().saturating_sub(1) {
            push(&mut queue, &symbols, left);
        }
        while let Some(c) = queue.pop() {
            let (l, r) = (symbols[c.left], symbols[c.right]);
            // Stale: one side was merged away or has grown since.
            if l.len == 0 || r.len == 0 || l.len + r.len != c.size {
                continue;
            }
            symbols[c.left].len = c.size;
            symbols[c.left].next = r.next;
            symbols[c.right].len = 0;
            if let Some(next) = r.next {
                symbols[next].prev = Some(c.left);
            }
            if let Some(prev) = l.prev {
                push(&mut queue, &symbols, prev);
            }
            push(&mut queue, &symbols, c.left);
        }
        let mut at = (!symbols.is_empty()).then_some(0);
        while let Some(i) = at {
            let s = symbols[i];
            let piece = &text[s.start..s.start + s.len];
            match vocab.id(piece) {
                Some(id) => out.push(id),
                None => out.extend(piece.bytes().filter_map(|b| self.byte_ids[usize::from(b)])),
            }
            at = s.next;
        }
    }
}
