//! The n-gram drafter: the sequence so far predicts itself. Where its last tokens occurred
//! before (code being edited, a quoted passage, a list that repeats), what followed them
//! then is proposed now. It needs no model and costs a scan of the history.

/// `max` draft tokens after `history`: the continuation of the most recent earlier
/// occurrence of its last `n` tokens, trying `n` down to 2 (to 1 where `n` is 1), read on
/// periodically past the history's end (text that repeats, repeats on); none where no
/// suffix of those lengths occurred before.
pub fn propose(history: &[u32], n: usize, max: usize) -> Vec<u32> {
    if max == 0 {
        return Vec::new();
    }
    for len in (n.clamp(1, 2)..=n).rev() {
        if len >= history.len() {
            continue;
        }
        let suffix = &history[history.len() - len..];
        // The most recent match whose continuation is not the suffix itself.
        let found = (0..history.len() - len).rev().find(|&start| &history[start..start + len] == suffix);
        if let Some(start) = found {
            // What followed the match, up to the end of the history and then again: a
            // match that overlaps the suffix means the text repeats with this period.
            let from = start + len;
            let period = history.len() - from;
            return (0..max).map(|k| history[from + k % period]).collect();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::propose;

    #[test]
    fn continues_the_most_recent_match_of_the_longest_suffix() {
        // The 3-gram "6 2 3" never occurred before; the 2-gram "2 3" did, most recently
        // followed by "5 6 2 3".
        let h = [1, 2, 3, 4, 9, 2, 3, 5, 6, 2, 3];
        assert_eq!(propose(&h, 3, 4), vec![5, 6, 2, 3]);
        assert_eq!(propose(&h, 3, 6), vec![5, 6, 2, 3, 5, 6], "on past the end, periodically");
        // A 3-gram match wins over a more recent 2-gram one.
        let h = [7, 2, 3, 8, 1, 2, 3, 4, 0, 7, 2, 3];
        assert_eq!(propose(&h, 3, 2), vec![8, 1]);
        assert_eq!(propose(&h, 2, 2), vec![4, 0]);
    }

    #[test]
    fn proposes_nothing_without_a_match_or_room() {
        assert!(propose(&[1, 2, 3, 4], 3, 4).is_empty());
        assert!(propose(&[1, 2, 1, 2], 2, 0).is_empty());
        assert!(propose(&[], 3, 4).is_empty());
        assert!(propose(&[5], 1, 4).is_empty());
        // A one-token suffix only where asked for.
        assert!(propose(&[1, 2, 3, 1], 2, 4).is_empty());
        assert_eq!(propose(&[1, 2, 3, 1], 1, 4), vec![2, 3, 1, 2]);
    }

    #[test]
    fn repetition_continues_past_the_end_of_the_history() {
        // A run of one token predicts more of it, and a cycle its next turns.
        assert_eq!(propose(&[4, 4, 4, 4], 2, 5), vec![4; 5]);
        assert_eq!(propose(&[7, 1, 2, 1, 2, 1], 3, 5), vec![2, 1, 2, 1, 2]);
    }
}
