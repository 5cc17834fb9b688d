//! Stop strings across streamed text chunks. Text that might be the start of
//! a stop string is held back until it is known not to be; nothing at or
//! after a stop string is ever released.

/// What one `push` produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopOutput {
    /// Text safe to emit now.
    pub text: String,
    /// The stop string that ended the stream, if one did (index into the
    /// list given to [`StopMatcher::new`]).
    pub stopped: Option<usize>,
}

#[derive(Clone, Debug)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: Option<usize>,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new<S: Into<String>>(stops: impl IntoIterator<Item = S>) -> Self {
        StopMatcher {
            stops: stops.into_iter().map(Into::into).collect(),
            held: String::new(),
            stopped: None,
        }
    }

    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// The stop string that matched, once one has.
    pub fn stopped(&self) -> Option<&str> {
        self.stopped.map(|i| self.stops[i].as_str())
    }

    /// Text currently held back.
    pub fn held(&self) -> &str {
        &self.held
    }

    /// Feed the next chunk of generated text.
    pub fn push(&mut self, chunk: &str) -> StopOutput {
        if self.stopped.is_some() {
            return StopOutput {
                text: String::new(),
                stopped: self.stopped,
            };
        }
        self.held.push_str(chunk);
        // Earliest stop occurrence (longest stop on a tie).
        let mut best: Option<(usize, usize)> = None;
        for (i, s) in self.stops.iter().enumerate() {
            if s.is_empty() {
                continue;
            }
            if let Some(pos) = self.held.find(s.as_str()) {
                let better = match best {
                    None => true,
                    Some((bp, bi)) => pos < bp || (pos == bp && s.len() > self.stops[bi].len()),
                };
                if better {
                    best = Some((pos, i));
                }
            }
        }
        if let Some((pos, i)) = best {
            let text = self.held[..pos].to_string();
            self.held.clear();
            self.stopped = Some(i);
            return StopOutput {
                text,
                stopped: Some(i),
            };
        }
        // Hold back the longest suffix that is a proper prefix of a stop.
        let mut hold = 0;
        for s in &self.stops {
            for k in (1..s.len()).rev() {
                if k <= hold {
                    break;
                }
                if s.is_char_boundary(k) && self.held.ends_with(&s[..k]) {
                    hold = k;
                    break;
                }
            }
        }
        let cut = self.held.len() - hold;
        let text = self.held[..cut].to_string();
        self.held.drain(..cut);
        StopOutput {
            text,
            stopped: None,
        }
    }

    /// End of generation without a stop: release the held-back text.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], chunks: &[&str]) -> (String, Option<usize>) {
        let mut m = StopMatcher::new(stops.iter().copied());
        let mut out = String::new();
        for c in chunks {
            let o = m.push(c);
            out.push_str(&o.text);
            if o.stopped.is_some() {
                return (out, o.stopped);
            }
        }
        out.push_str(&m.flush());
        (out, None)
    }

    #[test]
    fn a_stop_string_split_across_chunks_is_found() {
        assert_eq!(
            run(&["END"], &["hello E", "N", "D world"]),
            ("hello ".into(), Some(0))
        );
        assert_eq!(
            run(&["END"], &["hello E", "N", "d world"]),
            ("hello ENd world".into(), None)
        );
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), Some(0)));
        assert_eq!(run(&["xx", "b"], &["aab", "xx"]), ("aa".into(), Some(1)));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), None));
        assert_eq!(run(&[""], &["a", "b"]), ("ab".into(), None));
        assert_eq!(run(&["Ü!"], &["aÜ", "Ü", "!z"]), ("aÜ".into(), Some(0)));
    }

    #[test]
    fn holds_back_only_possible_prefixes() {
        let mut m = StopMatcher::new(["<|end|>"]);
        let o = m.push("abc<|e");
        assert_eq!(o.text, "abc");
        assert_eq!(m.held(), "<|e");
        let o = m.push("x");
        assert_eq!(o.text, "<|ex");
        assert_eq!(m.held(), "");
    }

    #[test]
    fn never_emits_past_a_stop_any_split() {
        let text = "The answer is 42.\nUser: next question\nAssistant:";
        let stops = ["User:", "\nAss"];
        for a in 0..=text.len() {
            for b in a..=text.len() {
                if !(text.is_char_boundary(a) && text.is_char_boundary(b)) {
                    continue;
                }
                let (out, st) = run(&stops, &[&text[..a], &text[a..b], &text[b..]]);
                assert_eq!(out, "The answer is 42.\n");
                assert_eq!(st, Some(0));
            }
        }
    }
}
