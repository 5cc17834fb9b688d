//! Suffix statistics over token sequences, for the `suffix` drafter.
//!
//! A [`SuffixTrie`] holds every substring of up to [`DEPTH`] tokens of the
//! sequences put into it, each node counting how often its substring
//! occurred. Counts of a node's children estimate what follows a context,
//! and how deep a context matches says how much to trust that.
//!
//! A request keeps a trie of its own prompt and output, extended a token at
//! a time. Earlier requests' outputs go into a [`SuffixCorpus`]: one trie
//! per tenant (as the prefix cache keeps one trie per tenant, so no tenant
//! drafts from another's text), all under one byte bound, least recently
//! used sequence out first.
//!
//! Contexts match by [`Keys`]: a token that is another token with a leading
//! space matches as that token, so an answer's line-opening "The" finds the
//! prompt's " The early bird" and drafts on from it. What a node drafts is
//! the token last seen there, in the form it had.
use rustc_hash::FxBuildHasher;
use std::collections::HashMap;
use std::sync::Arc;

/// Per token id, the id contexts match it by (itself, or the same token
/// without its leading space); ids past the end match as themselves.
pub type Keys = Arc<[u32]>;

/// Longest substring the tries hold. Deeper contexts rarely change the
/// prediction, and each level costs a node per token.
pub const DEPTH: usize = 24;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Node {
    /// Occurrences of this node's substring.
    count: u32,
    /// The token last seen here (the edge to it is keyed by its key).
    token: u32,
    first_child: u32,
    next_sibling: u32,
    /// The latest corpus sequence that passed through (for LRU).
    seq: u32,
}

/// A bounded-depth suffix trie with occurrence counts.
#[derive(Debug, Clone)]
pub struct SuffixTrie {
    nodes: Vec<Node>,
    /// (parent << 32 | key) -> child, so a step is one lookup even at the
    /// root, whose fan-out is the vocabulary seen.
    edges: HashMap<u64, u32, FxBuildHasher>,
    keys: Option<Keys>,
}

/// Nodes of the suffixes of a context that the trie holds, shortest first:
/// `active[i]` is the suffix of length `i + 1`. Every suffix of a held
/// substring is held too, so the list never has gaps.
pub type Active = Vec<u32>;

/// The most likely next token after a context.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Next {
    pub token: u32,
    /// Its share of the context's continuations.
    pub p: f32,
    /// How many tokens of context matched.
    pub depth: usize,
    /// The corpus sequence it came from (for LRU).
    pub seq: u32,
}

impl Default for SuffixTrie {
    fn default() -> Self {
        Self::new()
    }
}

impl SuffixTrie {
    pub fn new() -> Self {
        Self::with_keys(None)
    }

    /// A trie whose contexts match by `keys` (None: by token id).
    pub fn with_keys(keys: Option<Keys>) -> Self {
        SuffixTrie {
            nodes: vec![Node {
                count: 0,
                token: NIL,
                first_child: NIL,
                next_sibling: NIL,
                seq: NIL,
            }],
            edges: HashMap::default(),
            keys,
        }
    }

    fn edge(parent: u32, key: u32) -> u64 {
        (parent as u64) << 32 | key as u64
    }

    /// The id `token` matches by.
    fn key(&self, token: u32) -> u32 {
        match &self.keys {
            Some(k) => k.get(token as usize).copied().unwrap_or(token),
            None => token,
        }
    }

    /// The child of `node` along the edge keyed `key`.
    fn child(&self, node: u32, key: u32) -> Option<u32> {
        self.edges.get(&Self::edge(node, key)).copied()
    }

    fn child_or_insert(&mut self, parent: u32, key: u32, token: u32) -> u32 {
        if let Some(c) = self.child(parent, key) {
            self.nodes[c as usize].token = token;
            return c;
        }
        let id = self.nodes.len() as u32;
        let p = &mut self.nodes[parent as usize];
        let next_sibling = p.first_child;
        p.first_child = id;
        self.nodes.push(Node {
            count: 0,
            token,
            first_child: NIL,
            next_sibling,
            seq: NIL,
        });
        self.edges.insert(Self::edge(parent, key), id);
        id
    }

    /// Appends `token` to a sequence being put into the trie, whose
    /// suffixes so far are `active`, counting each new occurrence.
    pub fn extend(&mut self, active: &mut Active, token: u32, seq: u32) {
        let prev = std::mem::take(active);
        let key = self.key(token);
        let mut parents = std::iter::once(0).chain(prev.into_iter().take(DEPTH - 1));
        for parent in &mut parents {
            let c = self.child_or_insert(parent, key, token);
            let n = &mut self.nodes[c as usize];
            n.count = n.count.saturating_add(1);
            n.seq = seq;
            active.push(c);
        }
    }

    /// Moves `active` on by `token` for a context that is not being put
    /// into the trie (another request's, or a draft).
    pub fn follow(&self, active: &mut Active, token: u32) {
        let prev = std::mem::take(active);
        let key = self.key(token);
        for parent in std::iter::once(0).chain(prev.into_iter().take(DEPTH - 1)) {
            match self.child(parent, key) {
                Some(c) => active.push(c),
                // Gone at this length: gone at every longer one.
                None => break,
            }
        }
    }

    /// The suffixes of `context`'s last [`DEPTH`] tokens that the trie holds.
    pub fn active_for(&self, context: &[u32]) -> Active {
        let mut active = Active::new();
        for &t in &context[context.len().saturating_sub(DEPTH)..] {
            self.follow(&mut active, t);
        }
        active
    }

    /// The most frequent continuation of the deepest suffix in `active` that
    /// has any; ties go to the lower token id.
    pub fn next(&self, active: &Active) -> Option<Next> {
        for (i, &node) in active.iter().enumerate().rev() {
            let (mut best, mut best_count, mut total) = (NIL, 0u32, 0u64);
            let mut c = self.nodes[node as usize].first_child;
            while c != NIL {
                let n = &self.nodes[c as usize];
                total += n.count as u64;
                if best == NIL
                    || n.count > best_count
                    || (n.count == best_count && n.token < self.nodes[best as usize].token)
                {
                    (best, best_count) = (c, n.count);
                }
                c = n.next_sibling;
            }
            if best != NIL && total > 0 {
                let b = &self.nodes[best as usize];
                return Some(Next {
                    token: b.token,
                    p: best_count as f32 / total as f32,
                    depth: i + 1,
                    seq: b.seq,
                });
            }
        }
        None
    }

    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Heap bytes held (node array and edge table, by capacity).
    pub fn bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>()
            // hashbrown: key + value + one control byte per bucket.
            + self.edges.capacity() * (std::mem::size_of::<(u64, u32)>() + 1)
    }
}

/// A sequence in the corpus.
#[derive(Debug, Clone)]
struct Seq {
    tenant: String,
    tokens: Vec<u32>,
    last_used: u64,
}

/// Earlier requests' outputs, one trie per tenant, under one byte bound.
#[derive(Debug, Default)]
pub struct SuffixCorpus {
    tries: HashMap<String, SuffixTrie>,
    seqs: HashMap<u32, Seq>,
    next_id: u32,
    clock: u64,
    limit_bytes: usize,
    keys: Option<Keys>,
}

impl SuffixCorpus {
    pub fn new(limit_bytes: usize) -> Self {
        SuffixCorpus {
            limit_bytes,
            ..Default::default()
        }
    }

    /// Sets what its tries match contexts by, once: the first call's
    /// `make` decides (sequences only come from drafters made after it).
    pub fn keys_or_init(&mut self, make: impl FnOnce() -> Keys) -> Keys {
        self.keys.get_or_insert_with(make).clone()
    }

    /// What its tries match contexts by (a request's own trie takes the same).
    pub fn keys(&self) -> Option<Keys> {
        self.keys.clone()
    }

    pub fn limit_bytes(&self) -> usize {
        self.limit_bytes
    }

    pub fn trie(&self, tenant: &str) -> Option<&SuffixTrie> {
        self.tries.get(tenant)
    }

    /// Bytes held: every trie, the sequences kept to rebuild them, and the
    /// keys (one id per token of the vocabulary, shared with every
    /// request's own trie) once set.
    pub fn bytes(&self) -> usize {
        self.sequence_bytes()
            + self
                .keys
                .as_ref()
                .map_or(0, |k| std::mem::size_of_val(&**k))
    }

    /// Bytes that grow with the sequences held: the tries and the tokens.
    fn sequence_bytes(&self) -> usize {
        self.tries.values().map(SuffixTrie::bytes).sum::<usize>()
            + self
                .seqs
                .values()
                .map(|s| s.tokens.len() * 4)
                .sum::<usize>()
    }

    pub fn sequences(&self) -> usize {
        self.seqs.len()
    }

    /// Marks the sequence a draft came from as used.
    pub fn touch(&mut self, seq: u32) {
        self.clock += 1;
        if let Some(s) = self.seqs.get_mut(&seq) {
            s.last_used = self.clock;
        }
    }

    /// Adds one request's output for `tenant`, then evicts least recently
    /// used sequences until the corpus fits its bound.
    pub fn add(&mut self, tenant: &str, tokens: &[u32]) {
        if tokens.len() < 2 || self.limit_bytes == 0 {
            return;
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        self.clock += 1;
        let keys = &self.keys;
        let trie = self
            .tries
            .entry(tenant.to_string())
            .or_insert_with(|| SuffixTrie::with_keys(keys.clone()));
        let mut active = Active::new();
        for &t in tokens {
            trie.extend(&mut active, t, id);
        }
        self.seqs.insert(
            id,
            Seq {
                tenant: tenant.to_string(),
                tokens: tokens.to_vec(),
                last_used: self.clock,
            },
        );
        while self.bytes() > self.limit_bytes && !self.seqs.is_empty() {
            self.evict();
        }
    }

    /// Drops least recently used sequences down to 3/4 of the bound (so a
    /// rebuild is not paid on every add once full), then rebuilds the tries
    /// they were in.
    fn evict(&mut self) {
        let mut order: Vec<(u64, u32)> =
            self.seqs.iter().map(|(&id, s)| (s.last_used, id)).collect();
        order.sort_unstable();
        let target = self.limit_bytes / 4 * 3;
        let mut touched = Vec::new();
        // Tries shrink only when rebuilt: estimate from the tokens dropped,
        // each of which held up to DEPTH nodes.
        let per_token = self.sequence_bytes() as f64
            / self
                .seqs
                .values()
                .map(|s| s.tokens.len())
                .sum::<usize>()
                .max(1) as f64;
        let mut estimate = self.bytes() as f64;
        for (_, id) in order {
            if estimate <= target as f64 {
                break;
            }
            if let Some(s) = self.seqs.remove(&id) {
                estimate -= per_token * s.tokens.len() as f64;
                if !touched.contains(&s.tenant) {
                    touched.push(s.tenant);
                }
            }
        }
        for tenant in touched {
            let mut trie = SuffixTrie::with_keys(self.keys.clone());
            let mut ids: Vec<u32> = self
                .seqs
                .iter()
                .filter(|(_, s)| s.tenant == tenant)
                .map(|(&id, _)| id)
                .collect();
            ids.sort_unstable();
            for id in ids {
                let mut active = Active::new();
                for &t in &self.seqs[&id].tokens {
                    trie.extend(&mut active, t, id);
                }
            }
            if trie.nodes() > 1 {
                self.tries.insert(tenant, trie);
            } else {
                self.tries.remove(&tenant);
            }
        }
    }

    /// Forgets everything (with the prefix cache).
    pub fn clear(&mut self) {
        self.tries.clear();
        self.seqs.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trie_of(seq: &[u32]) -> SuffixTrie {
        let mut t = SuffixTrie::new();
        let mut a = Active::new();
        for &x in seq {
            t.extend(&mut a, x, 0);
        }
        t
    }

    #[test]
    fn predicts_the_most_frequent_continuation_of_the_longest_context() {
        // After "1 2" comes 3 twice and 4 once; after "9 1 2" only 4.
        let t = trie_of(&[1, 2, 3, 1, 2, 3, 9, 1, 2, 4, 7]);
        let n = t.next(&t.active_for(&[5, 1, 2])).unwrap();
        assert_eq!((n.token, n.depth), (3, 2));
        assert!((n.p - 2.0 / 3.0).abs() < 1e-6);
        let n = t.next(&t.active_for(&[9, 1, 2])).unwrap();
        assert_eq!((n.token, n.depth, n.p), (4, 3, 1.0));
        // Nothing follows 7, nor anything never seen.
        assert_eq!(t.next(&t.active_for(&[7])), None);
        assert_eq!(t.next(&t.active_for(&[42])), None);
    }

    #[test]
    fn follow_matches_extend() {
        let seq = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4];
        let t = trie_of(&seq);
        let mut a = Active::new();
        for (i, &x) in seq.iter().enumerate() {
            t.follow(&mut a, x);
            assert_eq!(a, t.active_for(&seq[..=i]));
            assert_eq!(a.len(), (i + 1).min(DEPTH));
        }
    }

    #[test]
    fn keys_match_two_spellings_and_draft_the_one_last_seen() {
        // Token 11 is 1 with a leading space: they match as one key.
        let keys: Keys = (0..16).map(|t| if t == 11 { 1 } else { t }).collect();
        let mut t = SuffixTrie::with_keys(Some(keys));
        let mut a = Active::new();
        for x in [5, 11, 2, 3, 9] {
            t.extend(&mut a, x, 0);
        }
        // "1 2" (the context's own spelling) matches "11 2": two deep.
        let n = t.next(&t.active_for(&[7, 1, 2])).unwrap();
        assert_eq!((n.token, n.depth), (3, 2));
        // After 5 came 11, and 11 is what it drafts.
        assert_eq!(t.next(&t.active_for(&[5])).unwrap().token, 11);
        // Without keys the two do not meet.
        let plain = trie_of(&[5, 11, 2, 3, 9]);
        assert_eq!(plain.next(&plain.active_for(&[7, 1, 2])).unwrap().depth, 1);
    }

    #[test]
    fn depth_is_bounded() {
        let seq: Vec<u32> = (0..100).collect();
        let t = trie_of(&seq);
        // Each position starts at most DEPTH nodes.
        assert!(t.nodes() <= 1 + seq.len() * DEPTH);
        assert_eq!(t.active_for(&seq).len(), DEPTH);
    }

    #[test]
    fn corpus_stays_under_its_bound_and_drops_the_least_recently_used() {
        let limit = 1 << 20;
        let mut c = SuffixCorpus::new(limit);
        // Keys for a vocabulary of 16k: 64 KB of the bound, counted in it.
        let keys = c.keys_or_init(|| (0..16_384).collect());
        assert_eq!(c.bytes(), 4 * keys.len());
        let seq = |i: u32| -> Vec<u32> { (0..200).map(|j| i * 1000 + j).collect() };
        c.add("", &seq(0));
        c.add("", &seq(1));
        // Keep drafting from sequence 0 while others arrive: sequence 1 is
        // never used again, so it goes before 0 does.
        for i in 2..40 {
            let t = c.trie("").unwrap();
            let n = t
                .next(&t.active_for(&[5, 6]))
                .expect("sequence 0 still there");
            assert_eq!(n.token, 7);
            c.touch(n.seq);
            c.add("", &seq(i));
            assert!(c.bytes() <= limit, "{} > {limit}", c.bytes());
            assert!(c.bytes() > 4 * keys.len() + c.trie("").unwrap().bytes());
        }
        let t = c.trie("").unwrap();
        assert!(
            t.next(&t.active_for(&[5, 6])).is_some(),
            "recently used sequence kept"
        );
        assert!(
            t.next(&t.active_for(&[1005, 1006])).is_none(),
            "least recently used dropped"
        );
        assert!(c.sequences() < 40);
    }

    #[test]
    fn tenants_do_not_see_each_other() {
        let mut c = SuffixCorpus::new(1 << 20);
        c.add("a", &[1, 2, 3, 4]);
        assert!(c.trie("b").is_none());
        let t = c.trie("a").unwrap();
        assert_eq!(t.next(&t.active_for(&[2, 3])).unwrap().token, 4);
        c.clear();
        assert!(c.trie("a").is_none());
        assert_eq!(c.bytes(), 0);
    }
}
