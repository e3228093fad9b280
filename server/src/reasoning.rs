//! A reasoning model's thinking (`<think>…</think>`, Qwen3 and DeepSeek-R1 style) split
//! from its answer as generated text streams in, for OpenAI-style `reasoning_content`.
//! Pure text: tags may arrive cut across pieces, so a possible tag start is held back
//! until the next piece settles it.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Where the splitter is in the reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: the reply may still open with `<think>`.
    Start,
    /// Inside the thinking block.
    Thinking,
    /// Past it (or there was none): everything is answer.
    Answer,
}

/// Text of one piece sorted into the two parts of a reply.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Split {
    /// Thinking text.
    pub reasoning: String,
    /// Answer text.
    pub content: String,
}

/// Sorts a reply's text, piece by piece, into thinking and answer.
#[derive(Debug)]
pub struct Splitter {
    state: State,
    pending: String,
    /// At the start of a part: its leading whitespace is dropped (the newlines around
    /// the tags are the template's, not the model's words).
    trim: bool,
}

impl Splitter {
    /// `opened`: the prompt itself ends inside a thinking block (a template whose
    /// generation prompt ends with `<think>`), so the reply starts thinking.
    pub fn new(opened: bool) -> Splitter {
        Splitter { state: if opened { State::Thinking } else { State::Start }, pending: String::new(), trim: true }
    }

    /// The text of `piece` that is settled, by part.
    pub fn push(&mut self, piece: &str) -> Split {
        self.pending.push_str(piece);
        let mut out = Split::default();
        loop {
            match self.state {
                State::Start => {
                    let rest = self.pending.trim_start();
                    if let Some(after) = rest.strip_prefix(OPEN) {
                        self.pending = after.to_owned();
                        self.state = State::Thinking;
                        self.trim = true;
                    } else if OPEN.starts_with(rest) {
                        return out; // all whitespace, or a tag cut short: wait
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Thinking => {
                    if self.trim {
                        self.pending = self.pending.trim_start().to_owned();
                        self.trim = self.pending.is_empty();
                    }
                    if let Some(at) = self.pending.find(CLOSE) {
                        out.reasoning.push_str(&self.pending[..at]);
                        self.pending = self.pending[at + CLOSE.len()..].to_owned();
                        self.state = State::Answer;
                        self.trim = true;
                    } else {
                        let keep = held_back(&self.pending, CLOSE);
                        let settled = self.pending.len() - keep;
                        out.reasoning.push_str(&self.pending[..settled]);
                        self.pending.drain(..settled);
                        return out;
                    }
                }
                State::Answer => {
                    if self.trim {
                        self.pending = self.pending.trim_start().to_owned();
                        self.trim = self.pending.is_empty();
                    }
                    out.content.push_str(&self.pending);
                    self.pending.clear();
                    return out;
                }
            }
        }
    }

    /// What is left at the end of the reply: held-back text goes to the part it was in.
    pub fn finish(&mut self) -> Split {
        let rest = std::mem::take(&mut self.pending);
        match self.state {
            State::Thinking => Split { reasoning: rest, content: String::new() },
            State::Start | State::Answer => Split { reasoning: String::new(), content: rest },
        }
    }
}

/// Bytes at the end of `text` that could begin `tag` (a tag cut across pieces).
fn held_back(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

/// Whether rendered prompt text leaves the reply inside a thinking block.
pub fn opens_thinking(prompt: &str) -> bool {
    prompt.trim_end().ends_with(OPEN)
}

/// Whether a chat template knows thinking blocks at all.
pub fn template_thinks(template: &str) -> bool {
    template.contains(OPEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` one by one and joins each part's output.
    fn run(opened: bool, pieces: &[&str]) -> (String, String) {
        let mut s = Splitter::new(opened);
        let (mut reasoning, mut content) = (String::new(), String::new());
        for p in pieces {
            let out = s.push(p);
            reasoning.push_str(&out.reasoning);
            content.push_str(&out.content);
        }
        let out = s.finish();
        (reasoning + &out.reasoning, content + &out.content)
    }

    #[test]
    fn thinking_then_answer_whatever_the_cuts() {
        let text = "<think>\nLet me add: 2 + 2 = 4.\n</think>\n\nThe answer is 4.";
        let want = ("Let me add: 2 + 2 = 4.\n".to_owned(), "The answer is 4.".to_owned());
        assert_eq!(run(false, &[text]), want);
        // Every cut into two pieces, and one character at a time.
        for at in (0..text.len()).filter(|&i| text.is_char_boundary(i)) {
            assert_eq!(run(false, &[&text[..at], &text[at..]]), want, "cut at {at}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(run(false, &pieces), want);
    }

    #[test]
    fn no_thinking_is_all_answer() {
        assert_eq!(run(false, &["Paris", " is the capital."]), (String::new(), "Paris is the capital.".into()));
        // A reply that starts like the tag but is not it.
        assert_eq!(run(false, &["<th", "ink about it>"]), (String::new(), "<think about it>".into()));
        assert_eq!(run(false, &["<", "b>bold</b>"]), (String::new(), "<b>bold</b>".into()));
        assert_eq!(run(false, &["  "]), (String::new(), "  ".into()));
    }

    #[test]
    fn an_opened_block_and_an_unfinished_one() {
        // The prompt opened the block: no tag in the reply.
        assert_eq!(run(true, &["hmm, 4", "</thi", "nk>4"]), ("hmm, 4".into(), "4".into()));
        // Cut off while thinking: all of it is reasoning, the held-back tag start too.
        assert_eq!(run(false, &["<think>still going </th"]), ("still going </th".into(), String::new()));
        // A '<' inside the thinking that is no tag is kept.
        assert_eq!(run(true, &["a < b", " so", "</think>yes"]), ("a < b so".into(), "yes".into()));
    }

    #[test]
    fn prompts_and_templates() {
        assert!(opens_thinking("<|im_start|>assistant\n<think>\n"));
        assert!(!opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(template_thinks("{% if enable_thinking is false %}<think>\n\n</think>{% endif %}"));
        assert!(!template_thinks(strata_runtime::chat::CHATML));
    }
}
