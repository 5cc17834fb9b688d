//! One policy registry for many replicas (`--policy-store DIR`): this
//! replica mirrors the store's names into its policy host (polling every
//! [`POLL`]; compiled code stays per replica), and `NAME@sha256:HEX` pins
//! resolve to exactly those bytes or are refused naming both hashes.
use super::State;
use specd_policy::{PolicyHost, PolicySource, PolicyStore};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// How often a replica reads the store's index: an upload or a delete on
/// one replica is seen by the others within this plus a compile (the
/// bound docs/serving.md states: 2 s for the policies that ship).
pub const POLL: Duration = Duration::from_millis(500);

/// Brings the host's store-sourced policies in line with the store once.
pub fn sync(store: &PolicyStore, host: &PolicyHost) {
    let entries = match store.entries() {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!("reading the policy store {}: {e}", store.dir().display());
            return;
        }
    };
    let local = host.list();
    for (name, e) in &entries {
        let current = local.iter().find(|p| &p.name == name);
        if current.is_some_and(|p| p.sha256 == e.sha256 || p.builtin) {
            continue;
        }
        let added = store
            .blob(&e.sha256)
            .map_err(|err| err.to_string())
            .and_then(|bytes| {
                host.add_from(name, &bytes, PolicySource::Store)
                    .map_err(|err| err.to_string())
            });
        if let Err(err) = added {
            tracing::warn!(policy = %name, sha256 = %e.sha256, "cannot load from the policy store: {err}");
        }
    }
    let gone: BTreeSet<String> = local
        .into_iter()
        .filter(|p| p.source == PolicySource::Store && !entries.contains_key(&p.name))
        .map(|p| p.name)
        .collect();
    for name in gone {
        if let Err(e) = host.remove(&name) {
            tracing::warn!(policy = %name, "cannot drop a deleted store policy: {e}");
        }
        host.remove_pins(&name);
    }
}

/// Mirrors the store into `host` until the process ends.
pub fn spawn(store: Arc<PolicyStore>, host: Arc<PolicyHost>) {
    sync(&store, &host);
    let r = std::thread::Builder::new()
        .name("specd-store-sync".into())
        .spawn(move || loop {
            std::thread::sleep(POLL);
            sync(&store, &host);
        });
    if let Err(e) = r {
        tracing::warn!("cannot start the policy store's sync thread: {e}");
    }
}

/// Why a pin cannot run.
#[derive(Debug)]
pub enum PinError {
    /// Not a pin's shape (400).
    Malformed(String),
    /// No such version of the name here (404).
    NotFound(String),
    /// The store could not be read (500).
    Store(String),
}

/// `NAME@sha256:HEX` split; `None` for a plain name or hash.
fn parse_pin(s: &str) -> Option<(&str, &str)> {
    let (name, hash) = s.split_once("@sha256:")?;
    Some((name, hash))
}

/// Makes a pinned policy name runnable: it runs exactly the bytes of `HEX`
/// if `NAME` means them now, or (with a store) if they were once uploaded
/// as `NAME`; anything else is a 404 naming both hashes.
pub async fn pin(state: &State, spec: &str) -> Result<(), PinError> {
    let Some((name, want)) = parse_pin(spec) else {
        return Ok(());
    };
    let want = want.to_ascii_lowercase();
    if want.len() != 64 || !want.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(PinError::Malformed(format!(
            "policy {spec:?}: a pin is NAME@sha256:HEX with the 64 hex digits of the component's sha256"
        )));
    }
    let host = state.policies.clone();
    if host.has(spec) {
        return Ok(());
    }
    let current = host.hash_of(name);
    let bytes = if current.as_deref() == Some(want.as_str()) {
        None
    } else {
        match &state.store {
            Some(store) if store.has_version(name, &want) => {
                Some(store.blob(&want).map_err(|e| {
                    PinError::Store(format!(
                        "reading policy {name} sha256:{want} from the store: {e}"
                    ))
                })?)
            }
            _ => {
                return Err(PinError::NotFound(match current {
                        Some(cur) => format!(
                            "policy {name} is sha256:{cur} here; no version sha256:{want} was ever uploaded as {name}"
                        ),
                    None => format!(
                        "no policy named {name} (asked for its version sha256:{want})"
                    ),
                }))
            }
        }
    };
    let spec = spec.to_string();
    let name = name.to_string();
    tokio::task::spawn_blocking(move || host.pin(&spec, &name, bytes.as_deref()))
        .await
        .map_err(|e| PinError::Store(format!("pin task: {e}")))?
        .map_err(|e| PinError::NotFound(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_split_at_the_hash() {
        assert_eq!(parse_pin("p@sha256:ab"), Some(("p", "ab")));
        assert_eq!(parse_pin("p"), None);
        assert_eq!(parse_pin("sha256:abcdef01"), None);
    }
}
