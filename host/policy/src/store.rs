//! A policy registry that several replicas share (`specd serve
//! --policy-store DIR`, e.g. a ReadWriteMany volume): content-addressed
//! blobs and a name index, every change one atomic rename, so a reader
//! never sees half of one.
//!
//! ```text
//! DIR/blobs/HEX.wasm              a component, named by its sha256
//! DIR/names/NAME/current          {"sha256", "uploaded_at", "key_id"}: what NAME means now
//! DIR/names/NAME/versions/HEX     empty: HEX was once uploaded as NAME (pins)
//! ```
//!
//! Two uploads racing for one name both rename their `current` into place;
//! the later rename wins and every replica that reads the index sees that
//! one. A delete renames `names/NAME` away first, so it disappears at once.
//! Blobs are never deleted (a pin may still name one); they are small.
use crate::cache::sha256_hex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What a name means in the store now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreEntry {
    pub sha256: String,
    /// RFC 3339, UTC.
    pub uploaded_at: String,
    /// The uploading key's id, `None` when no key was needed.
    pub key_id: Option<String>,
}

pub struct PolicyStore {
    dir: PathBuf,
}

/// A name no other writer uses at the same moment: the process id, the
/// time and a random number (replicas on several machines share the
/// directory, so the process id alone is not enough).
fn unique() -> String {
    use std::hash::{BuildHasher, Hasher};
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("{}-{nanos}-{random:016x}", std::process::id())
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.chars().all(|c| c.is_ascii_hexdigit())
}

impl PolicyStore {
    /// Opens (creating) the store at `dir`.
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        use anyhow::Context;
        for sub in ["blobs", "names"] {
            std::fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("creating the policy store {}", dir.display()))?;
        }
        Ok(PolicyStore {
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn blob_path(&self, sha256: &str) -> PathBuf {
        self.dir.join("blobs").join(format!("{sha256}.wasm"))
    }

    fn name_dir(&self, name: &str) -> PathBuf {
        self.dir.join("names").join(name)
    }

    /// Writes `bytes` to a unique temporary file beside `path`, then renames
    /// it over `path`.
    fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let tmp = dir.join(format!(".tmp-{}", unique()));
        let r = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if r.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        r
    }

    /// Makes `name` mean `bytes` (whose sha256 is `entry.sha256`): the
    /// blob, the version marker, then the index entry.
    pub fn put(&self, name: &str, bytes: &[u8], entry: &StoreEntry) -> std::io::Result<()> {
        let blob = self.blob_path(&entry.sha256);
        if !blob.exists() {
            Self::write_atomic(&blob, bytes)?;
        }
        let versions = self.name_dir(name).join("versions");
        std::fs::create_dir_all(&versions)?;
        std::fs::File::create(versions.join(&entry.sha256))?;
        let text = serde_json::to_vec_pretty(entry).map_err(std::io::Error::other)?;
        Self::write_atomic(&self.name_dir(name).join("current"), &text)
    }

    /// Removes `name` and its version markers; whether it was there.
    pub fn delete(&self, name: &str) -> std::io::Result<bool> {
        let d = self.name_dir(name);
        if !d.exists() {
            return Ok(false);
        }
        let gone = self
            .dir
            .join("names")
            .join(format!(".deleted-{name}-{}", unique()));
        match std::fs::rename(&d, &gone) {
            Ok(()) => {}
            // Another replica deleted it first.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        }
        std::fs::remove_dir_all(&gone)?;
        Ok(true)
    }

    /// Every name and what it means now.
    pub fn entries(&self) -> std::io::Result<BTreeMap<String, StoreEntry>> {
        let mut out = BTreeMap::new();
        for e in std::fs::read_dir(self.dir.join("names"))? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            // A name being written or deleted right now: skip it this time.
            let Ok(text) = std::fs::read(e.path().join("current")) else {
                continue;
            };
            if let Ok(entry) = serde_json::from_slice::<StoreEntry>(&text) {
                if is_hex64(&entry.sha256) {
                    out.insert(name, entry);
                }
            }
        }
        Ok(out)
    }

    /// Whether `sha256` was once uploaded as `name` (and its blob is here).
    pub fn has_version(&self, name: &str, sha256: &str) -> bool {
        is_hex64(sha256)
            && self.name_dir(name).join("versions").join(sha256).exists()
            && self.blob_path(sha256).exists()
    }

    /// The versions of `name` ever uploaded (full hashes).
    pub fn versions(&self, name: &str) -> Vec<String> {
        std::fs::read_dir(self.name_dir(name).join("versions"))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|h| is_hex64(h))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A blob's bytes, checked against its name (a corrupt blob is an
    /// error, never other bytes run under that hash).
    pub fn blob(&self, sha256: &str) -> std::io::Result<Vec<u8>> {
        let bytes = std::fs::read(self.blob_path(sha256))?;
        if sha256_hex(&bytes) != sha256 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("blob {sha256} does not hash to its name"),
            ));
        }
        Ok(bytes)
    }

    /// The names now in the store besides `except`, and their components'
    /// bytes together: what the quotas count.
    pub fn usage(&self, except: &str) -> std::io::Result<(usize, u64)> {
        let mut count = 0;
        let mut bytes = 0;
        for (name, e) in self.entries()? {
            if name == except {
                continue;
            }
            count += 1;
            bytes += std::fs::metadata(self.blob_path(&e.sha256)).map_or(0, |m| m.len());
        }
        Ok((count, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(bytes: &[u8]) -> StoreEntry {
        StoreEntry {
            sha256: sha256_hex(bytes),
            uploaded_at: "2026-12-06T00:00:00Z".into(),
            key_id: None,
        }
    }

    #[test]
    fn names_versions_and_deletes() {
        let dir = std::env::temp_dir().join(format!("specd-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = PolicyStore::open(&dir).unwrap();
        let b = PolicyStore::open(&dir).unwrap();
        let (v1, v2) = (b"one".as_slice(), b"two".as_slice());
        a.put("p", v1, &entry(v1)).unwrap();
        assert_eq!(b.entries().unwrap()["p"].sha256, sha256_hex(v1));
        // A newer upload wins; the older stays pinnable.
        b.put("p", v2, &entry(v2)).unwrap();
        assert_eq!(a.entries().unwrap()["p"].sha256, sha256_hex(v2));
        assert!(a.has_version("p", &sha256_hex(v1)) && a.has_version("p", &sha256_hex(v2)));
        assert!(!a.has_version("q", &sha256_hex(v1)));
        assert_eq!(a.blob(&sha256_hex(v1)).unwrap(), v1);
        assert_eq!(a.usage("").unwrap(), (1, 3));
        assert_eq!(a.usage("p").unwrap(), (0, 0));
        // A corrupted blob is refused, not run.
        std::fs::write(a.blob_path(&sha256_hex(v1)), b"evil").unwrap();
        assert!(a.blob(&sha256_hex(v1)).is_err());
        assert!(b.delete("p").unwrap());
        assert!(!a.delete("p").unwrap());
        assert!(a.entries().unwrap().is_empty() && !a.has_version("p", &sha256_hex(v2)));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
