//! The prefix cache: a trie over token ids whose nodes hold cache states
//! from earlier requests, so a request sharing a prefix prefills only what
//! is new. Only committed tokens are ever stored (the pipeline hands over
//! the caches rewound to what it emitted). Bounded by bytes, evicting the
//! least recently used entry.
use super::LayerCache;
use std::collections::HashMap;

struct Entry {
    caches: Vec<Box<dyn LayerCache>>,
    len: usize,
    bytes: usize,
    last_used: u64,
}

#[derive(Default)]
struct Node {
    children: HashMap<u32, usize>,
    /// Entries stored at exactly this depth.
    entry: Option<Entry>,
    parent: usize,
    token: u32,
    /// The root of a tenant's trie (never pruned).
    root: bool,
}

/// One trie per tenant under one byte bound: a tenant's lookups see only
/// what that tenant stored (the server's tenants are API keys). The tenant
/// `""` is node 0, the one every caller without a tenant shares.
pub struct PrefixCache {
    /// Tenant roots other than `""` (node 0).
    tenants: HashMap<String, usize>,
    nodes: Vec<Node>,
    free: Vec<usize>,
    limit_bytes: usize,
    used_bytes: usize,
    clock: u64,
}

/// A hit: caches holding the first `len` tokens of the prompt.
pub struct Hit {
    pub caches: Vec<Box<dyn LayerCache>>,
    pub len: usize,
}

fn bytes_of(caches: &[Box<dyn LayerCache>]) -> usize {
    caches.iter().map(|c| c.held_bytes()).sum()
}

impl PrefixCache {
    pub fn new(limit_bytes: usize) -> Self {
        PrefixCache {
            tenants: HashMap::new(),
            nodes: vec![Node {
                root: true,
                ..Node::default()
            }],
            free: Vec::new(),
            limit_bytes,
            used_bytes: 0,
            clock: 0,
        }
    }

    pub fn limit_bytes(&self) -> usize {
        self.limit_bytes
    }

    pub fn used_bytes(&self) -> usize {
        self.used_bytes
    }

    pub fn entries(&self) -> usize {
        self.nodes.iter().filter(|n| n.entry.is_some()).count()
    }

    /// The root node of `tenant`'s trie (made when `create`).
    fn root(&mut self, tenant: &str, create: bool) -> Option<usize> {
        if tenant.is_empty() {
            return Some(0);
        }
        if let Some(&r) = self.tenants.get(tenant) {
            return Some(r);
        }
        if !create {
            return None;
        }
        let r = self.alloc(Node {
            root: true,
            ..Node::default()
        });
        self.tenants.insert(tenant.to_string(), r);
        Some(r)
    }

    /// [`lookup_in`](Self::lookup_in) the shared tenant `""`.
    pub fn lookup(&mut self, tokens: &[u32]) -> Option<Hit> {
        self.lookup_in("", tokens)
    }

    /// The deepest state `tenant` stored sharing a prefix with `tokens`,
    /// rewound to the shared length (never longer than `tokens.len() - 1`,
    /// so the last prompt token is always forwarded).
    pub fn lookup_in(&mut self, tenant: &str, tokens: &[u32]) -> Option<Hit> {
        self.clock += 1;
        let root = self.root(tenant, false)?;
        let max = tokens.len().saturating_sub(1);
        // Walk down the trie along `tokens`.
        let mut path = vec![root];
        let mut node = root;
        for &t in &tokens[..max] {
            match self.nodes[node].children.get(&t) {
                Some(&c) => {
                    node = c;
                    path.push(c);
                }
                None => break,
            }
        }
        let depth = path.len() - 1;
        // Any entry below the deepest node holds that prefix; a plain KV
        // cache rewinds to it in place. Try the subtree, then ancestors.
        for (d, &n) in path.iter().enumerate().rev() {
            if d == 0 {
                break;
            }
            let candidates = self.subtree_entries(n);
            for e in candidates {
                let entry = self.nodes[e].entry.as_mut().expect("listed");
                let want = d.min(depth);
                let mut caches: Vec<Box<dyn LayerCache>> =
                    entry.caches.iter().map(|c| c.boxed_clone()).collect();
                if caches.iter_mut().all(|c| c.rewind(want)) {
                    entry.last_used = self.clock;
                    return Some(Hit { caches, len: want });
                }
            }
        }
        None
    }

    fn subtree_entries(&self, root: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let mut stack = vec![root];
        while let Some(n) = stack.pop() {
            if self.nodes[n].entry.is_some() {
                out.push(n);
            }
            stack.extend(self.nodes[n].children.values().copied());
        }
        out
    }

    /// [`store_in`](Self::store_in) the shared tenant `""`.
    pub fn store(&mut self, tokens: &[u32], caches: Vec<Box<dyn LayerCache>>) {
        self.store_in("", tokens, caches)
    }

    /// Stores the state after `tokens` for `tenant` (the caches must hold
    /// exactly them).
    pub fn store_in(&mut self, tenant: &str, tokens: &[u32], caches: Vec<Box<dyn LayerCache>>) {
        if tokens.is_empty() || caches.iter().any(|c| c.offset() != tokens.len()) {
            return;
        }
        self.clock += 1;
        let bytes = bytes_of(&caches);
        if bytes > self.limit_bytes {
            return;
        }
        let Some(mut node) = self.root(tenant, true) else {
            return;
        };
        for &t in tokens {
            node = match self.nodes[node].children.get(&t) {
                Some(&c) => c,
                None => {
                    let id = self.alloc(Node {
                        parent: node,
                        token: t,
                        ..Default::default()
                    });
                    self.nodes[node].children.insert(t, id);
                    id
                }
            };
        }
        if let Some(old) = self.nodes[node].entry.take() {
            self.used_bytes -= old.bytes;
        }
        self.nodes[node].entry = Some(Entry {
            caches,
            len: tokens.len(),
            bytes,
            last_used: self.clock,
        });
        self.used_bytes += bytes;
        // An entry makes its ancestors' entries redundant for rewindable
        // caches, but not for others; keep them and let LRU decide.
        while self.used_bytes > self.limit_bytes {
            if !self.evict_one(node) {
                break;
            }
        }
    }

    fn alloc(&mut self, n: Node) -> usize {
        if let Some(i) = self.free.pop() {
            self.nodes[i] = n;
            i
        } else {
            self.nodes.push(n);
            self.nodes.len() - 1
        }
    }

    /// Evicts the least recently used entry other than `keep`.
    fn evict_one(&mut self, keep: usize) -> bool {
        let victim = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, n)| *i != keep && n.entry.is_some())
            .min_by_key(|(_, n)| n.entry.as_ref().map(|e| e.last_used))
            .map(|(i, _)| i);
        let Some(v) = victim else { return false };
        let e = self.nodes[v].entry.take().expect("victim has an entry");
        self.used_bytes -= e.bytes;
        debug_assert!(e.len > 0);
        self.prune(v);
        true
    }

    /// Frees nodes that hold nothing and lead nowhere.
    fn prune(&mut self, mut n: usize) {
        while !self.nodes[n].root
            && self.nodes[n].entry.is_none()
            && self.nodes[n].children.is_empty()
        {
            let (parent, token) = (self.nodes[n].parent, self.nodes[n].token);
            self.nodes[parent].children.remove(&token);
            self.nodes[n] = Node::default();
            self.free.push(n);
            n = parent;
        }
    }
}
