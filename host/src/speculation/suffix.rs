//! Suffix decoding (`--drafter suffix`): drafts what followed the longest
//! earlier occurrence of the context, from the request's own prompt and
//! output and from earlier requests' outputs ([`SuffixCorpus`]).
//!
//! Each draft token is the most frequent continuation of the deepest
//! matching context; drafting stops when the product of those frequencies
//! (the chance, by the counts, that every draft so far is right) falls
//! under [`MIN_PATH_P`], or past [`LENGTH_PER_MATCH`] times the first
//! match's length: a long, frequent match drafts far, a short or contested
//! one little. That product is the per-token `confidence` of the draft. A
//! context that matches only in its last token ([`MIN_MATCH`]) drafts
//! nothing: such a match is mostly chance, and a round that drafts and loses
//! costs more than a plain step. For acceptance it is a point-mass drafter
//! (q = 1), as `ngram` is.
//!
//! Where the tokens match nothing, the request's text may
//! ([`SuffixDrafter::with_text`]): byte-level BPE spells the same text in
//! other tokens after other characters (a prompt's " Madrid" is an
//! answer's `"Mad` + `rid`), so an answer that copies a word the prompt
//! has shares no token with it until the word is over. The text drafter
//! finds the longest earlier occurrence of the text's last bytes and
//! drafts the tokens of what followed it ([`SuffixDrafter::text_draft`]).
use super::draft::{Draft, DraftProb};
use super::drafter::{DraftReq, Drafter};
use crate::cache::suffix::{Active, Keys, Next, SuffixCorpus, SuffixTrie};
use anyhow::Result;
use specd_text::Tokenizer;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Stop once the draft's estimated chance of being all right is below this.
pub const MIN_PATH_P: f32 = 0.1;
/// Draft at most this many tokens per token of matched context.
pub const LENGTH_PER_MATCH: f32 = 2.0;
/// Tokens of context the first draft token's match needs. Measured on the
/// bench suites (int8 and quantized, replayed over the plain outputs):
/// with 1, the first draft token was kept in 22-65% of rounds and open chat
/// lost to plain decoding; 2 keeps the copy runs and drops most losing
/// rounds; 3 drops copy runs too. Also measured: one-token matches whose
/// continuation was settled (seen twice or more, at least half the time)
/// took 1-2.5% fewer rounds with `constant` k = 4, but under `throughput`
/// half of them were rejected on the code suite, its acceptance estimate
/// fell, and it cut the long copy runs short: code 1.72x -> 1.52x.
pub const MIN_MATCH: usize = 2;
/// Prompt tokens put into the corpus before a request's output: the turn
/// header a chat template ends a prompt with ("<|im_start|>assistant\n"),
/// so the next request's first round already matches what earlier answers
/// began with. Without it an output's opening tokens had no context in the
/// corpus and its first rounds drafted nothing.
pub const PROMPT_CONTEXT: usize = 8;
/// Bytes of text a text match needs when the text ends mid-word against
/// its source (the answer's last token stops inside a word the source
/// goes on with: a tokenization that drifted, the match's best case).
pub const TEXT_MIN_MATCH: usize = 3;
/// Bytes a text match needs otherwise (it ends where a word ends): a
/// shorter one is mostly a common word, whose continuation is chance.
pub const TEXT_WORD_MATCH: usize = 8;
/// Most tokens one text match drafts.
pub const TEXT_DRAFT_MAX: usize = 4;
/// The per-token confidence of a text draft (no counts to derive it from).
pub const TEXT_MATCH_P: f32 = 0.5;
/// Bytes after a match that are tokenized for its draft.
const TEXT_LOOKAHEAD: usize = 48;
/// Longest match (bytes) looked for, and how far back the text is searched.
const TEXT_MAX_MATCH: usize = 64;
const TEXT_WINDOW: usize = 1 << 16;
/// What a special token (a turn marker) is in the text: a continuation
/// ends there.
const TEXT_BREAK: u8 = 0;

/// The request's text, for text matches: its tokens' bytes, and where
/// each run of [`TEXT_MIN_MATCH`] bytes occurs, so a round looks only at the
/// places that can match instead of scanning the text.
#[derive(Default)]
struct TextIndex {
    bytes: Vec<u8>,
    /// By a run's bytes (as an integer), the positions where it ends, in
    /// order.
    ends: HashMap<u32, Vec<u32>>,
}

/// A run of [`TEXT_MIN_MATCH`] bytes as an index key.
fn run_key(run: &[u8]) -> u32 {
    run.iter().fold(0, |k, &b| k << 8 | b as u32)
}

impl TextIndex {
    fn push(&mut self, tok: &Tokenizer, id: u32) {
        let from = self.bytes.len();
        if tok.is_special(id) {
            self.bytes.push(TEXT_BREAK);
        } else {
            tok.push_token_bytes(id, &mut self.bytes);
        }
        self.index_from(from);
    }

    /// Indexes the runs that end past `from`.
    fn index_from(&mut self, from: usize) {
        for end in (from + 1).max(TEXT_MIN_MATCH)..=self.bytes.len() {
            let key = run_key(&self.bytes[end - TEXT_MIN_MATCH..end]);
            self.ends.entry(key).or_default().push(end as u32);
        }
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }

    /// The text's last `window` bytes.
    fn window(&self, window: usize) -> &[u8] {
        &self.bytes[self.bytes.len().saturating_sub(window)..]
    }

    /// The longest earlier occurrence of the text's last bytes (at least
    /// [`TEXT_MIN_MATCH`], at most [`TEXT_MAX_MATCH`]) within
    /// [`TextIndex::window`], the latest of equally long ones: (bytes
    /// matched, where the occurrence ends, before the text's end),
    /// positions counted from the window's start.
    fn longest_earlier(&self, window: usize) -> Option<(usize, usize)> {
        let text = &self.bytes;
        let n = text.len();
        let tail = &text[n.checked_sub(TEXT_MIN_MATCH)?..];
        let from = n - self.window(window).len();
        let mut best: Option<(usize, usize)> = None;
        for &end in self.ends.get(&run_key(tail))? {
            let end = end as usize;
            if end < from + TEXT_MIN_MATCH || end >= n {
                continue;
            }
            let mut len = TEXT_MIN_MATCH;
            while len < TEXT_MAX_MATCH
                && len < end - from
                && text[end - len - 1] == text[n - len - 1]
            {
                len += 1;
            }
            if best.is_none_or(|(l, _)| len >= l) {
                best = Some((len, end - from));
            }
        }
        best
    }
}

/// The request's text, for text matches.
struct Text {
    tok: Arc<Tokenizer>,
    index: TextIndex,
}

impl Text {
    fn push(&mut self, id: u32) {
        self.index.push(&self.tok, id);
    }
}

/// The corpus, locked. It is only statistics: a panic elsewhere cannot
/// make it wrong enough to matter, so a poisoned lock is used as it is.
fn lock(corpus: &Mutex<SuffixCorpus>) -> std::sync::MutexGuard<'_, SuffixCorpus> {
    corpus.lock().unwrap_or_else(|p| p.into_inner())
}

/// A byte of a word (letters, digits, `_`, any byte of a non-ASCII char).
fn word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80
}

pub struct SuffixDrafter {
    corpus: Arc<Mutex<SuffixCorpus>>,
    tenant: String,
    /// The corpus's keys, for the request's own trie.
    keys: Option<Keys>,
    /// The request's prompt and output so far.
    local: SuffixTrie,
    local_active: Active,
    /// Tokens of the log put into `local`.
    seen: Vec<u32>,
    /// Log length at the first round: the prompt.
    prompt_len: Option<usize>,
    /// The log's text, where text matches are on.
    text: Option<Text>,
}

impl SuffixDrafter {
    /// A drafter over `corpus` whose keys are those the corpus has.
    pub fn new(corpus: Arc<Mutex<SuffixCorpus>>, tenant: &str) -> Self {
        let keys = lock(&corpus).keys();
        Self::with_keys(corpus, tenant, keys)
    }

    /// A drafter over `corpus` whose keys are the corpus's, made by `make`
    /// (under the same lock) where the corpus has none yet.
    pub fn keyed(
        corpus: Arc<Mutex<SuffixCorpus>>,
        tenant: &str,
        make: impl FnOnce() -> Keys,
    ) -> Self {
        let keys = lock(&corpus).keys_or_init(make);
        Self::with_keys(corpus, tenant, Some(keys))
    }

    fn with_keys(corpus: Arc<Mutex<SuffixCorpus>>, tenant: &str, keys: Option<Keys>) -> Self {
        SuffixDrafter {
            corpus,
            tenant: tenant.to_string(),
            local: SuffixTrie::with_keys(keys.clone()),
            keys,
            local_active: Active::new(),
            seen: Vec::new(),
            prompt_len: None,
            text: None,
        }
    }

    /// Drafts from text matches too ([`SuffixDrafter::text_draft`]), with
    /// `tok` the model's tokenizer, where the tokens match nothing.
    pub fn with_text(mut self, tok: Arc<Tokenizer>) -> Self {
        self.text = Some(Text {
            tok,
            index: TextIndex::default(),
        });
        self
    }

    /// The tokens of what followed the longest earlier occurrence of the
    /// text's last bytes (at most `limit`, and [`TEXT_DRAFT_MAX`]): where
    /// the text ends inside a word its source goes on with, a match of
    /// [`TEXT_MIN_MATCH`] bytes; else of [`TEXT_WORD_MATCH`]. Of equally
    /// long matches the latest. The continuation is tokenized on its own:
    /// how the model goes on from a token boundary, mostly; the verify
    /// decides. Nothing where the text is off, or nothing matches.
    pub fn text_draft(&self, limit: usize) -> Vec<u32> {
        let Some(t) = &self.text else {
            return Vec::new();
        };
        let text = t.index.window(TEXT_WINDOW);
        let n = text.len();
        if n <= TEXT_MIN_MATCH || limit == 0 || text[n - 1] == TEXT_BREAK {
            return Vec::new();
        }
        let Some((len, end)) = t.index.longest_earlier(TEXT_WINDOW) else {
            return Vec::new();
        };
        // The text's last word, and whether the match is the drift case:
        // that word whole, not after a space, going on in the source.
        let word = text.iter().rev().take_while(|&&b| word_byte(b)).count();
        let drift = word > 0
            && len >= word
            && word_byte(text[end])
            && (word == n || text[n - word - 1] != b' ');
        if !drift && len < TEXT_WORD_MATCH {
            return Vec::new();
        }
        let mut cont = &text[end..n.min(end + TEXT_LOOKAHEAD)];
        let mut whole = end + cont.len() == n;
        if let Some(i) = cont.iter().position(|&b| b == TEXT_BREAK) {
            (cont, whole) = (&cont[..i], true);
        }
        // A drifted word is a value copied into other surroundings (a name
        // into JSON): what the source says after its clause is over (", 27
        // years old") is not what follows here.
        if drift {
            let clause_end = |i: usize| {
                let b = cont[i];
                !word_byte(b)
                    && b.is_ascii_punctuation()
                    && cont.get(i + 1).map_or(whole, |c| c.is_ascii_whitespace())
            };
            if let Some(i) = (0..cont.len()).find(|&i| clause_end(i)) {
                (cont, whole) = (&cont[..i], true);
            }
        }
        // A continuation cut inside a char keeps its whole chars.
        let cont = match std::str::from_utf8(cont) {
            Ok(s) => s,
            Err(e) => {
                whole = false;
                std::str::from_utf8(&cont[..e.valid_up_to()]).unwrap_or_default()
            }
        };
        let Ok(mut ids) = t.tok.encode(cont, false) else {
            return Vec::new();
        };
        // The last token of a cut continuation may be part of a longer one.
        if !whole {
            ids.pop();
        }
        ids.truncate(limit.min(TEXT_DRAFT_MAX));
        ids
    }

    fn corpus(&self) -> std::sync::MutexGuard<'_, SuffixCorpus> {
        lock(&self.corpus)
    }

    /// Puts the log's new tokens into the request's trie.
    fn ingest(&mut self, log: &[u32]) {
        if !log.starts_with(&self.seen) {
            // Not a continuation (never in the round): start over.
            self.local = SuffixTrie::with_keys(self.keys.clone());
            self.local_active.clear();
            self.seen.clear();
            self.prompt_len = None;
            if let Some(t) = &mut self.text {
                t.index.clear();
            }
        }
        self.prompt_len.get_or_insert(log.len());
        for &t in &log[self.seen.len()..] {
            self.local.extend(&mut self.local_active, t, 0);
            if let Some(text) = &mut self.text {
                text.push(t);
            }
        }
        self.seen.extend_from_slice(&log[self.seen.len()..]);
    }
}

/// The keys a suffix trie matches `tok`'s tokens by: a token whose text is
/// a space and then another token's text (" The", "The") matches as that
/// token. An answer often opens a line with a word the prompt has
/// mid-sentence, and byte-level BPE spells the two differently, so the
/// answer's first tokens matched nothing in the prompt and its first
/// rounds drafted nothing.
pub fn space_keys(tok: &Tokenizer) -> Keys {
    // Control tokens have no text to match by.
    let texts: Vec<Option<Vec<u8>>> = (0..tok.vocab_size() as u32)
        .map(|id| (!tok.is_special(id)).then(|| tok.token_bytes(id)))
        .collect();
    let mut by_text: HashMap<&[u8], u32> = HashMap::new();
    for (id, b) in texts.iter().enumerate() {
        if let Some(b) = b.as_deref().filter(|b| !b.is_empty()) {
            by_text.entry(b).or_insert(id as u32);
        }
    }
    let key = |b: &[u8]| by_text.get(b.strip_prefix(b" ")?).copied();
    texts
        .iter()
        .enumerate()
        .map(|(id, b)| b.as_deref().and_then(key).unwrap_or(id as u32))
        .collect()
}

/// The better of two predictions: the deeper match; the request's own on a tie.
fn better(own: Option<Next>, corpus: Option<Next>) -> Option<(Next, bool)> {
    match (own, corpus) {
        (Some(a), Some(b)) if b.depth > a.depth => Some((b, true)),
        (Some(a), _) => Some((a, false)),
        (None, Some(b)) => Some((b, true)),
        (None, None) => None,
    }
}

impl Drafter for SuffixDrafter {
    fn name(&self) -> String {
        "suffix".into()
    }

    fn draft_one(&mut self, req: &mut DraftReq<'_>) -> Result<()> {
        req.draft = self.lookup(req.log, req.k);
        Ok(())
    }

    fn commit(&mut self, _: usize, _: usize, _: usize) -> Result<()> {
        Ok(())
    }
}

impl SuffixDrafter {
    /// Up to `k` tokens continuing `log`, walked from where its tail is in
    /// the request's own text and the corpus.
    pub fn lookup(&mut self, log: &[u32], k: usize) -> Draft {
        self.ingest(log);
        let mut draft = Draft::default();
        if k == 0 {
            return draft;
        }
        let corpus = self.corpus.clone();
        let mut corpus = lock(&corpus);
        let trie = corpus.trie(&self.tenant);
        // Where the log's tail is in the corpus: found afresh each round
        // (DEPTH^2 lookups at most), since other requests change the corpus
        // and eviction renumbers its nodes.
        let mut other = trie.map(|t| t.active_for(log)).unwrap_or_default();
        let mut own = self.local_active.clone();
        let (mut path_p, mut limit) = (1.0f32, k);
        let mut used = Vec::new();
        while draft.tokens.len() < limit {
            let Some((next, from_corpus)) =
                better(self.local.next(&own), trie.and_then(|t| t.next(&other)))
            else {
                break;
            };
            if draft.tokens.is_empty() {
                if next.depth < MIN_MATCH {
                    break;
                }
                limit = limit.min((LENGTH_PER_MATCH * next.depth as f32).ceil() as usize);
            }
            path_p *= next.p;
            if path_p < MIN_PATH_P {
                break;
            }
            if from_corpus {
                used.push(next.seq);
            }
            draft.tokens.push(next.token);
            draft.q.push(DraftProb::PointMass);
            draft.confidence.push(path_p);
            self.local.follow(&mut own, next.token);
            if let Some(t) = trie {
                t.follow(&mut other, next.token);
            }
        }
        used.dedup();
        for seq in used {
            corpus.touch(seq);
        }
        drop(corpus);
        if draft.tokens.is_empty() {
            for t in self.text_draft(k) {
                draft.tokens.push(t);
                draft.q.push(DraftProb::PointMass);
                draft.confidence.push(TEXT_MATCH_P);
            }
        }
        draft
    }
}

impl Drop for SuffixDrafter {
    /// The request's output (what the rounds saw of it), after the
    /// prompt's last [`PROMPT_CONTEXT`] tokens, goes into the corpus for the
    /// tenant's later requests.
    fn drop(&mut self) {
        if let Some(p) = self.prompt_len.filter(|&p| self.seen.len() > p) {
            let output = self.seen[p.saturating_sub(PROMPT_CONTEXT)..].to_vec();
            let tenant = std::mem::take(&mut self.tenant);
            self.corpus().add(&tenant, &output);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn propose(d: &mut SuffixDrafter, log: &[u32], k: usize) -> Draft {
        d.lookup(log, k)
    }

    #[test]
    fn drafts_from_its_own_prompt_with_falling_confidence() {
        let corpus = Arc::new(Mutex::new(SuffixCorpus::new(1 << 20)));
        let mut d = SuffixDrafter::new(corpus, "");
        // "1 2 3 4 5" occurred; the context ends in "1 2": draft "3 4 5 ...",
        // at most 2 per matched token (here 2 matched: 4 tokens).
        let log = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2];
        let draft = propose(&mut d, &log, 16);
        assert_eq!(draft.tokens, vec![3, 4, 5, 6]);
        assert!(draft.q.iter().all(|q| matches!(q, DraftProb::PointMass)));
        assert_eq!(draft.confidence, vec![1.0; 4]);
        // k bounds it.
        assert_eq!(propose(&mut d, &log, 1).tokens, vec![3]);
        // A contested context: after 7 came 8 once and 1 once: p = 1/2, and
        // the next step (after "7 8"/"7 1") multiplies in.
        let log = [7, 8, 2, 7, 1, 3, 7];
        let mut d = SuffixDrafter::new(Arc::new(Mutex::new(SuffixCorpus::new(1 << 20))), "");
        let draft = propose(&mut d, &log, 8);
        assert_eq!(
            draft.tokens,
            Vec::<u32>::new(),
            "one token of context: no draft"
        );
        // The same contest two tokens deep: "5 7" was followed by 8 and by 1.
        let log = [5, 7, 8, 2, 5, 7, 1, 3, 5, 7];
        let mut d = SuffixDrafter::new(Arc::new(Mutex::new(SuffixCorpus::new(1 << 20))), "");
        let draft = propose(&mut d, &log, 8);
        assert_eq!(draft.tokens[0], 1, "ties go to the lower token id");
        assert_eq!(draft.confidence[0], 0.5);
    }

    /// The index finds what scanning the whole window finds: the longest
    /// match, the latest of equally long ones, never past the window.
    #[test]
    fn the_text_index_finds_what_a_scan_finds() {
        fn scan(text: &[u8]) -> Option<(usize, usize)> {
            let n = text.len();
            let tail = &text[n.checked_sub(TEXT_MIN_MATCH)?..];
            let mut best: Option<(usize, usize)> = None;
            for end in TEXT_MIN_MATCH..n {
                if &text[end - TEXT_MIN_MATCH..end] != tail {
                    continue;
                }
                let mut len = TEXT_MIN_MATCH;
                while len < TEXT_MAX_MATCH && len < end && text[end - len - 1] == text[n - len - 1]
                {
                    len += 1;
                }
                if best.is_none_or(|(l, _)| len >= l) {
                    best = Some((len, end));
                }
            }
            best
        }
        let mut x = 12345u64;
        let mut index = TextIndex::default();
        let mut found = 0;
        for step in 0..3000 {
            // Bytes from a small alphabet, with copied runs: long and
            // contested matches.
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let from = index.bytes.len();
            if x >> 60 == 0 && from > 80 {
                let at = (x >> 20) as usize % (from - 70);
                let run = index.bytes[at..at + 70].to_vec();
                index.bytes.extend(run);
            } else {
                index.bytes.push(b'a' + (x >> 33) as u8 % 4);
            }
            index.index_from(from);
            for window in [64, 500, 1 << 16] {
                let n = index.bytes.len();
                let want = scan(&index.bytes[n.saturating_sub(window)..]);
                assert_eq!(
                    index.longest_earlier(window),
                    want,
                    "step {step}, window {window}"
                );
                found += want.is_some_and(|(l, _)| l == TEXT_MAX_MATCH) as usize;
            }
        }
        assert!(found > 100, "long matches were tested: {found}");
    }

    #[test]
    fn a_match_of_one_token_drafts_nothing_a_longer_one_drafts() {
        let corpus = Arc::new(Mutex::new(SuffixCorpus::new(1 << 20)));
        let mut d = SuffixDrafter::new(corpus, "");
        // 9 occurred once, followed by 4 5 6; the context ends in "8 9",
        // which never occurred: only the last token matches.
        let log = [1, 9, 4, 5, 6, 8, 9];
        assert!(propose(&mut d, &log, 8).tokens.is_empty());
        // "1 9" matches two tokens deep: draft what followed (up to 2 x 2).
        let log = [1, 9, 4, 5, 6, 8, 9, 7, 1, 9];
        assert_eq!(propose(&mut d, &log, 8).tokens, vec![4, 5, 6, 8]);
    }

    #[test]
    fn an_answer_is_remembered_after_its_prompts_last_tokens() {
        let corpus = Arc::new(Mutex::new(SuffixCorpus::new(1 << 20)));
        // A prompt ending in a turn header (50 51 52), then its answer.
        let header = [50, 51, 52];
        let mut first = SuffixDrafter::new(corpus.clone(), "");
        let prompt: Vec<u32> = [1, 2, 3].iter().chain(&header).copied().collect();
        assert!(propose(&mut first, &prompt, 8).tokens.is_empty());
        let mut log = prompt.clone();
        log.extend([60, 61, 62, 63]);
        propose(&mut first, &log, 8);
        drop(first);
        // Another prompt with the same header drafts the answer's opening
        // at its first round, before it has output anything.
        let mut next = SuffixDrafter::new(corpus.clone(), "");
        let prompt: Vec<u32> = [7, 8].iter().chain(&header).copied().collect();
        assert_eq!(propose(&mut next, &prompt, 4).tokens, vec![60, 61, 62, 63]);
        // A request that output nothing adds nothing.
        drop(next);
        assert_eq!(corpus.lock().unwrap().sequences(), 1);
    }

    #[test]
    fn a_finished_request_teaches_the_next_one_of_its_tenant_only() {
        let corpus = Arc::new(Mutex::new(SuffixCorpus::new(1 << 20)));
        let prompt = [100, 101];
        let mut first = SuffixDrafter::new(corpus.clone(), "a");
        assert!(propose(&mut first, &prompt, 8).tokens.is_empty());
        // The request went on to output 10 11 12 13 14.
        let log = [100, 101, 10, 11, 12, 13, 14];
        propose(&mut first, &log, 8);
        drop(first);
        assert_eq!(corpus.lock().unwrap().sequences(), 1);
        // A later request of the same tenant that reaches "10 11" drafts on.
        let mut same = SuffixDrafter::new(corpus.clone(), "a");
        assert_eq!(
            propose(&mut same, &[200, 10, 11], 3).tokens,
            vec![12, 13, 14]
        );
        // ... and on, round after round, as its log grows.
        assert_eq!(
            propose(&mut same, &[200, 10, 11, 12], 3).tokens,
            vec![13, 14]
        );
        // Another tenant learned nothing.
        let mut other = SuffixDrafter::new(corpus.clone(), "b");
        assert!(propose(&mut other, &[200, 10, 11], 3).tokens.is_empty());
    }
}
