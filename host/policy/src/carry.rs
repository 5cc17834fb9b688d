//! State a schedule carries across requests (HF's `heuristic` keeps its k),
//! kept per (policy hash, model key, canonical config) as the bytes the
//! resource hands back at the end of a request.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// (policy sha256, model key, canonical config).
pub(crate) type CarryKey = (String, String, String);

pub(crate) struct Carried {
    map: Mutex<HashMap<CarryKey, Vec<u8>>>,
    /// Largest state kept (`HostConfig::carried_state_limit_bytes`).
    limit_bytes: usize,
}

impl Carried {
    pub fn new(limit_bytes: usize) -> Self {
        Carried {
            map: Mutex::default(),
            limit_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<CarryKey, Vec<u8>>> {
        // Every critical section inserts or removes whole entries: a panic
        // elsewhere cannot leave the map half-updated.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn get(&self, key: &CarryKey) -> Option<Vec<u8>> {
        self.lock().get(key).cloned()
    }

    /// Forgets the state of policies no longer registered.
    pub fn retain_hashes(&self, live: &[String]) {
        self.lock().retain(|(h, _, _), _| live.contains(h));
    }

    /// Stores (or clears) carried state at the end of a request.
    pub fn store(&self, key: CarryKey, bytes: Option<Vec<u8>>) {
        let mut map = self.lock();
        match bytes {
            Some(b) if b.len() <= self.limit_bytes => {
                map.insert(key, b);
            }
            Some(b) => {
                tracing::warn!(sha256 = %key.0, len = b.len(), "carried state over the cap; dropped");
                map.remove(&key);
            }
            None => {
                map.remove(&key);
            }
        }
    }
}

/// A request's policy config: JSON text (`""` means `{}`), or JSON a caller
/// already parsed (the engine's request options), which is not parsed again.
#[derive(Clone, Copy, Debug)]
pub enum PolicyConfig<'a> {
    Text(&'a str),
    Json(&'a serde_json::Value),
}

impl<'a> From<&'a str> for PolicyConfig<'a> {
    fn from(s: &'a str) -> Self {
        PolicyConfig::Text(s)
    }
}

impl<'a> From<&'a String> for PolicyConfig<'a> {
    fn from(s: &'a String) -> Self {
        PolicyConfig::Text(s)
    }
}

impl<'a> From<&'a serde_json::Value> for PolicyConfig<'a> {
    fn from(v: &'a serde_json::Value) -> Self {
        PolicyConfig::Json(v)
    }
}

impl PolicyConfig<'_> {
    /// The canonical text (sorted keys, no spaces) the policy's constructor
    /// gets and carried state is keyed by.
    pub(crate) fn canonical(self) -> Result<String, String> {
        match self {
            PolicyConfig::Text(t) if t.trim().is_empty() => Ok("{}".into()),
            PolicyConfig::Text(t) => serde_json::from_str::<serde_json::Value>(t)
                .map(|v| sorted(&v).to_string())
                .map_err(|e| format!("config is not JSON: {e}")),
            PolicyConfig::Json(v) => Ok(sorted(v).to_string()),
        }
    }
}

/// `v` with every object's keys in sorted order. serde_json keeps insertion
/// order when a crate in the build enables its `preserve_order` feature (the
/// grammar engine does), so the order is made explicit here.
fn sorted(v: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&m[k])))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        x => x.clone(),
    }
}
