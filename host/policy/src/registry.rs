//! The registry: policy names (built-in, from files, uploaded) and the
//! loaded component behind each content hash.

use crate::compile::Loaded;
use crate::{PolicyInfo, PolicySource};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Names to content hashes, and the loaded component of each hash.
#[derive(Default)]
pub(crate) struct Registry {
    pub by_hash: HashMap<String, Arc<Loaded>>,
    pub names: BTreeMap<String, NameEntry>,
}

#[derive(Clone)]
pub(crate) struct NameEntry {
    pub hash: String,
    pub builtin: bool,
    pub source: PolicySource,
}

/// 1-64 characters of `a-z 0-9 . _ -`, and not a 64-digit hash.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'))
        && !(name.len() == 64 && name.chars().all(|c| c.is_ascii_hexdigit()))
}

impl Registry {
    /// A full hash, `sha256:HASH`, or a unique prefix of >= 8 hex digits.
    pub fn resolve_hash(&self, s: &str) -> Option<String> {
        let s = s.strip_prefix("sha256:").unwrap_or(s);
        if s.len() < 8 || !s.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        let s = s.to_ascii_lowercase();
        let mut found = self.by_hash.keys().filter(|h| h.starts_with(&s));
        let first = found.next()?;
        if found.next().is_some() {
            return None;
        }
        Some(first.clone())
    }

    /// The component a name or hash refers to.
    pub fn lookup(&self, name_or_hash: &str) -> Option<Arc<Loaded>> {
        let hash = match self.names.get(name_or_hash) {
            Some(e) => e.hash.clone(),
            None => self.resolve_hash(name_or_hash)?,
        };
        self.by_hash.get(&hash).cloned()
    }

    /// Every name, with what `list` shows of it.
    pub fn infos(&self) -> Vec<PolicyInfo> {
        self.names
            .iter()
            .filter(|(_, e)| e.source != PolicySource::Pinned)
            .filter_map(|(n, e)| self.by_hash.get(&e.hash).map(|l| info_of(n, e, l)))
            .collect()
    }

    /// User policies (not built-in) other than `except`: how many, and
    /// their component bytes together.
    pub fn user_usage(&self, except: &str) -> (usize, u64) {
        self.names
            .iter()
            .filter(|(n, e)| !e.builtin && e.source != PolicySource::Pinned && n.as_str() != except)
            .fold((0, 0), |(count, bytes), (_, e)| {
                let size = self.by_hash.get(&e.hash).map_or(0, |l| l.size as u64);
                (count + 1, bytes + size)
            })
    }

    /// Drops a compiled component no name refers to any more.
    pub fn gc(&mut self, hash: &str) {
        if !self.names.values().any(|e| e.hash == hash) {
            self.by_hash.remove(hash);
        }
    }
}

pub(crate) fn info_of(name: &str, e: &NameEntry, l: &Loaded) -> PolicyInfo {
    PolicyInfo {
        name: name.to_string(),
        sha256: l.sha256.clone(),
        exports: l.exports,
        builtin: e.builtin,
        source: e.source.clone(),
        imports_wasi: l.imports_wasi,
        size_bytes: l.size,
        conformance: l.verdict.get().and_then(|v| {
            v.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        }),
    }
}
