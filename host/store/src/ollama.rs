//! Models in Ollama's store, by Ollama's own names: `ollama:NAME[:TAG]`.
//!
//! Ollama keeps a model as a manifest (`manifests/HOST/NAMESPACE/NAME/TAG`,
//! JSON in the OCI image layout) whose layers are content-addressed blobs
//! (`blobs/sha256-<hex>`); the layer of media type
//! `application/vnd.ollama.image.model` is the GGUF file itself, so specd
//! loads that blob where it lies.  The store is only read: the digest check's
//! result is kept under `SPECD_HOME` ([`Checks`]), never beside the blob.
use crate::names::{dir_names, find_ci, names_where, Root};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// The media type of the layer that holds the weights (a GGUF file).
pub const MODEL_LAYER: &str = "application/vnd.ollama.image.model";
const DEFAULT_HOST: &str = "registry.ollama.ai";
const DEFAULT_NAMESPACE: &str = "library";
const DEFAULT_TAG: &str = "latest";

/// An Ollama model name taken apart: `[HOST/][NAMESPACE/]MODEL[:TAG]`, as
/// Ollama reads it (`hf.co/ORG/NAME:Q4_K_M` is host `hf.co`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub host: String,
    pub namespace: String,
    pub model: String,
    pub tag: String,
}

impl Reference {
    pub fn parse(name: &str) -> Result<Reference> {
        // The tag follows the last ':' after the last '/' (a host may carry a
        // port: `localhost:5000/ns/model`).
        let slash = name.rfind('/').map_or(0, |i| i + 1);
        let (path, tag) = match name[slash..].rfind(':') {
            Some(i) => (&name[..slash + i], &name[slash + i + 1..]),
            None => (name, DEFAULT_TAG),
        };
        let parts: Vec<&str> = path.split('/').collect();
        let bad = |why: &str| -> Result<Reference> {
            bail!("ollama:{name} is not an Ollama model name ({why}; expected ollama:NAME[:TAG], ollama:NAMESPACE/NAME[:TAG] or ollama:HOST/NAMESPACE/NAME[:TAG])")
        };
        if tag.is_empty() {
            return bad("empty tag");
        }
        if parts
            .iter()
            .chain([&tag])
            .any(|p| p.is_empty() || *p == "." || *p == "..")
        {
            return bad("an empty or relative path part");
        }
        // Only a host has a ':' (its port).
        if parts.iter().rev().take(2).any(|p| p.contains(':')) {
            return bad("a ':' inside the name");
        }
        let (host, namespace, model) = match parts[..] {
            [m] => (DEFAULT_HOST, DEFAULT_NAMESPACE, m),
            [ns, m] => (DEFAULT_HOST, ns, m),
            [h, ns, m] => (h, ns, m),
            _ => return bad("too many '/'"),
        };
        Ok(Reference {
            host: host.into(),
            namespace: namespace.into(),
            model: model.into(),
            tag: tag.into(),
        })
    }

    /// The short form Ollama shows (`llama3.2:1b`, `ns/m:tag`,
    /// `hf.co/org/m:tag`), with the `ollama:` prefix specd names it by.
    pub fn display(&self) -> String {
        let path = if self.host != DEFAULT_HOST {
            format!("{}/{}/{}", self.host, self.namespace, self.model)
        } else if self.namespace != DEFAULT_NAMESPACE {
            format!("{}/{}", self.namespace, self.model)
        } else {
            self.model.clone()
        };
        format!("ollama:{path}:{}", self.tag)
    }

    fn components(&self) -> [&str; 4] {
        [&self.host, &self.namespace, &self.model, &self.tag]
    }
}

/// A model found in the store.
#[derive(Debug, Clone)]
pub struct OllamaModel {
    /// `ollama:NAME:TAG`, tag always written out.
    pub name: String,
    pub manifest: PathBuf,
    /// The GGUF blob.
    pub blob: PathBuf,
    /// The blob's sha256 as the manifest states it (lowercase hex).
    pub digest: String,
    /// Its size as the manifest states it.
    pub size: u64,
}

/// Ollama's store (read only).
#[derive(Debug, Clone)]
pub struct OllamaStore {
    pub root: Root,
}

impl OllamaStore {
    /// `OLLAMA_MODELS`, else `~/.ollama/models` (Ollama's own rule).
    pub fn from_env() -> OllamaStore {
        OllamaStore {
            root: Root::from_env(&[("OLLAMA_MODELS", "")], ".ollama/models"),
        }
    }

    pub fn at(root: impl Into<PathBuf>) -> OllamaStore {
        OllamaStore {
            root: Root::given(root.into()),
        }
    }

    fn manifests(&self) -> PathBuf {
        self.root.path.join("manifests")
    }

    /// The model `name` names (without `ollama:`): its manifest read, the
    /// blob there and of the manifest's size. Its digest is not checked here
    /// ([`Checks::verify`]).
    pub fn find(&self, name: &str) -> Result<OllamaModel> {
        let r = Reference::parse(name)?;
        let mut dir = self.manifests();
        for (i, c) in r.components().into_iter().enumerate() {
            match find_ci(&dir, c) {
                Some(p) => dir = p,
                None => {
                    let wanted = self.manifests().join(r.components().join("/"));
                    let mut msg = format!(
                        "{} is not in Ollama's store: no manifest {} ({})",
                        r.display(),
                        wanted.display(),
                        self.root.how()
                    );
                    // The model is there under other tags: name them.
                    let tags = if i == 3 {
                        names_where(&dir, |p| p.is_file())
                    } else {
                        vec![]
                    };
                    if !tags.is_empty() {
                        msg += &format!("; its tags there: {}", tags.join(", "));
                    }
                    bail!("{msg}");
                }
            }
        }
        self.read(&r, &dir)
    }

    fn read(&self, r: &Reference, manifest: &Path) -> Result<OllamaModel> {
        let text = std::fs::read_to_string(manifest)
            .with_context(|| format!("reading Ollama manifest {}", manifest.display()))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("Ollama manifest {} is not JSON", manifest.display()))?;
        let layers = v["layers"]
            .as_array()
            .with_context(|| format!("Ollama manifest {} has no layers", manifest.display()))?;
        let layer = layers
            .iter()
            .find(|l| l["mediaType"] == MODEL_LAYER)
            .with_context(|| {
                format!(
                    "{} has no model layer (media type {MODEL_LAYER}) in {}",
                    r.display(),
                    manifest.display()
                )
            })?;
        let digest = layer["digest"].as_str().unwrap_or_default();
        let hex = digest
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .with_context(|| {
                format!(
                    "{}: the model layer's digest {digest:?} is not sha256:<64 hex digits>",
                    manifest.display()
                )
            })?
            .to_ascii_lowercase();
        let size = layer["size"].as_u64().unwrap_or(0);
        let blobs = self.root.path.join("blobs");
        // `sha256-<hex>` today; older Ollama wrote `sha256:<hex>`.
        let blob = [format!("sha256-{hex}"), format!("sha256:{hex}")]
            .iter()
            .map(|n| blobs.join(n))
            .find(|p| p.is_file())
            .with_context(|| {
                format!(
                    "{}: its manifest {} names blob sha256:{hex}, but {} is missing (`ollama pull` fetches it again)",
                    r.display(),
                    manifest.display(),
                    blobs.join(format!("sha256-{hex}")).display()
                )
            })?;
        let len = std::fs::metadata(&blob)
            .with_context(|| format!("reading {}", blob.display()))?
            .len();
        if size != 0 && len != size {
            bail!(
                "{}: blob {} is {len} bytes, its manifest {} says {size} (a partial or corrupt download; `ollama pull` fetches it again)",
                r.display(),
                blob.display(),
                manifest.display()
            );
        }
        Ok(OllamaModel {
            name: r.display(),
            manifest: manifest.to_path_buf(),
            blob,
            digest: hex,
            size: len,
        })
    }

    /// Every model in the store with a model layer (`HOST/NAMESPACE/NAME/TAG`
    /// under `manifests/`), by name; a manifest that does not read is
    /// listed with its problem.
    pub fn list(&self) -> Vec<(String, Result<OllamaModel>)> {
        let mut out = Vec::new();
        let m = self.manifests();
        for host in dir_names(&m) {
            for ns in dir_names(&m.join(&host)) {
                for model in dir_names(&m.join(&host).join(&ns)) {
                    let dir = m.join(&host).join(&ns).join(&model);
                    for tag in names_where(&dir, |p| p.is_file()) {
                        let r = Reference {
                            host: host.clone(),
                            namespace: ns.clone(),
                            model: model.clone(),
                            tag,
                        };
                        let path = dir.join(&r.tag);
                        out.push((r.display(), self.read(&r, &path)));
                    }
                }
            }
        }
        out
    }
}

/// Where specd keeps the results of digest checks of files it does not own
/// (`SPECD_HOME/checked/`): one record per digest, holding the path, size
/// and modification time of the file that hashed to it, so a later load of
/// the same unchanged file skips re-hashing.
#[derive(Debug, Clone)]
pub struct Checks {
    pub dir: PathBuf,
}

/// How [`Checks::verify`] knew the file was right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verified {
    /// Hashed now (and recorded).
    Hashed,
    /// Hashed before, the file unchanged since (path, size, mtime).
    Recorded,
}

impl Checks {
    pub fn new(dir: PathBuf) -> Checks {
        Checks { dir }
    }

    fn record_path(&self, hex: &str) -> PathBuf {
        self.dir.join(format!("sha256-{hex}"))
    }

    /// What identifies this very file as it is now.
    fn stamp(path: &Path) -> Result<String> {
        let m = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
        let mtime = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        Ok(format!("{}\n{}\n{mtime}\n", abs.display(), m.len()))
    }

    /// Checks that `path` hashes to `hex` (sha256), unless a record says
    /// this file, unchanged, already did. A mismatch is an error naming
    /// both digests.
    pub fn verify(&self, path: &Path, hex: &str, what: &str) -> Result<Verified> {
        let stamp = Self::stamp(path)?;
        let record = self.record_path(hex);
        if std::fs::read_to_string(&record).is_ok_and(|r| r == stamp) {
            return Ok(Verified::Recorded);
        }
        let got = crate::sha256_file(path)?;
        if got != hex {
            bail!(
                "{what}: blob {} has sha256 {got}, but its manifest says {hex}: the file is corrupt or was changed (`ollama pull` fetches it again)",
                path.display()
            );
        }
        // Best effort: a home we cannot write only costs a re-hash next time.
        let _ = self.write(&record, &stamp);
        Ok(Verified::Hashed)
    }

    fn write(&self, record: &Path, stamp: &str) -> Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!(
            ".{}.{}",
            std::process::id(),
            crate::names::unique()
        ));
        std::fs::write(&tmp, stamp)?;
        std::fs::rename(&tmp, record)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::test_dir;

    /// A store holding `bytes` as the model layer of `manifest` (a path
    /// under `manifests/`), with the digest `digest` (its own when `None`).
    fn store_with(root: &Path, manifest: &str, bytes: &[u8], digest: Option<&str>) -> String {
        let hex = digest.map_or_else(|| crate::sha256_hex(bytes), str::to_string);
        let blobs = root.join("blobs");
        std::fs::create_dir_all(&blobs).unwrap();
        std::fs::write(blobs.join(format!("sha256-{hex}")), bytes).unwrap();
        let m = root.join("manifests").join(manifest);
        std::fs::create_dir_all(m.parent().unwrap()).unwrap();
        let json = serde_json::json!({
            "schemaVersion": 2,
            "layers": [
                {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:00", "size": 1},
                {"mediaType": MODEL_LAYER, "digest": format!("sha256:{hex}"), "size": bytes.len()},
            ],
        });
        std::fs::write(&m, json.to_string()).unwrap();
        hex
    }

    #[test]
    fn names_parse_as_ollama_reads_them() {
        let r = Reference::parse("llama3.2").unwrap();
        assert_eq!(
            r.components(),
            ["registry.ollama.ai", "library", "llama3.2", "latest"]
        );
        assert_eq!(r.display(), "ollama:llama3.2:latest");
        let r = Reference::parse("me/tiny:q4").unwrap();
        assert_eq!(r.components(), ["registry.ollama.ai", "me", "tiny", "q4"]);
        assert_eq!(r.display(), "ollama:me/tiny:q4");
        let r = Reference::parse("hf.co/bartowski/Llama-3.2-1B-GGUF:Q4_K_M").unwrap();
        assert_eq!(
            r.components(),
            ["hf.co", "bartowski", "Llama-3.2-1B-GGUF", "Q4_K_M"]
        );
        assert_eq!(
            r.display(),
            "ollama:hf.co/bartowski/Llama-3.2-1B-GGUF:Q4_K_M"
        );
        let r = Reference::parse("localhost:5000/ns/m").unwrap();
        assert_eq!(r.components(), ["localhost:5000", "ns", "m", "latest"]);
        for bad in ["", "m:", "a/b/c/d", "../x", "a//b", "m::x", "ns:1/m"] {
            let e = Reference::parse(bad).unwrap_err().to_string();
            assert!(e.contains("not an Ollama model name"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_model_is_its_manifests_model_layer_and_listed_by_name() {
        let root = test_dir("ollama");
        let hex = store_with(
            &root,
            "registry.ollama.ai/library/tiny/1b",
            b"GGUF tiny",
            None,
        );
        store_with(&root, "hf.co/Org/Tiny-GGUF/Q8_0", b"GGUF other", None);
        let s = OllamaStore::at(&root);
        let m = s.find("tiny:1b").unwrap();
        assert_eq!(m.name, "ollama:tiny:1b");
        assert_eq!(m.blob, root.join(format!("blobs/sha256-{hex}")));
        assert_eq!((m.digest.as_str(), m.size), (hex.as_str(), 9));
        // Case aside, as Ollama treats names.
        assert_eq!(s.find("hf.co/org/tiny-gguf:q8_0").unwrap().size, 10);
        let names: Vec<String> = s.list().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["ollama:hf.co/Org/Tiny-GGUF:Q8_0", "ollama:tiny:1b"]);
    }

    #[test]
    fn a_missing_name_says_where_it_looked_and_which_tags_exist() {
        let root = test_dir("ollama-missing");
        store_with(&root, "registry.ollama.ai/library/tiny/1b", b"x", None);
        let s = OllamaStore::at(&root);
        let e = s.find("tiny").unwrap_err().to_string();
        let wanted = root.join("manifests/registry.ollama.ai/library/tiny/latest");
        assert!(e.contains(&wanted.display().to_string()), "{e}");
        assert!(e.contains("its tags there: 1b"), "{e}");
        let e = s.find("nope:7b").unwrap_err().to_string();
        assert!(e.contains("ollama:nope:7b is not in Ollama's store"), "{e}");
        assert!(!e.contains("tags there"), "{e}");
    }

    #[test]
    fn a_blob_that_is_not_its_digest_is_an_error_and_a_checked_one_is_not_rehashed() {
        let root = test_dir("ollama-digest");
        let home = test_dir("checks");
        let checks = Checks::new(home.join("checked"));
        store_with(
            &root,
            "registry.ollama.ai/library/good/latest",
            b"right bytes",
            None,
        );
        let fake = "ab".repeat(32);
        store_with(
            &root,
            "registry.ollama.ai/library/bad/latest",
            b"wrong bytes",
            Some(&fake),
        );
        let s = OllamaStore::at(&root);
        let good = s.find("good").unwrap();
        assert_eq!(
            checks.verify(&good.blob, &good.digest, &good.name).unwrap(),
            Verified::Hashed
        );
        assert_eq!(
            checks.verify(&good.blob, &good.digest, &good.name).unwrap(),
            Verified::Recorded
        );
        // A change the record's stamp sees (size, mtime) is hashed again.
        std::fs::write(&good.blob, b"right bytes!").unwrap();
        let e = checks
            .verify(&good.blob, &good.digest, &good.name)
            .unwrap_err()
            .to_string();
        assert!(e.contains("corrupt"), "{e}");
        let bad = s.find("bad").unwrap();
        let e = checks
            .verify(&bad.blob, &bad.digest, &bad.name)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&fake) && e.contains(&crate::sha256_hex(b"wrong bytes")),
            "{e}"
        );
        // Nothing was written into the store.
        let blobs = names_in(&root.join("blobs"));
        assert_eq!(blobs.len(), 2, "{blobs:?}");
    }

    #[test]
    fn a_blob_of_another_size_than_its_manifest_says_is_an_error() {
        let root = test_dir("ollama-size");
        let hex = store_with(
            &root,
            "registry.ollama.ai/library/cut/latest",
            b"0123456789",
            None,
        );
        std::fs::write(root.join(format!("blobs/sha256-{hex}")), b"01234").unwrap();
        let e = OllamaStore::at(&root).find("cut").unwrap_err().to_string();
        assert!(
            e.contains("is 5 bytes, its manifest") && e.contains("says 10"),
            "{e}"
        );
    }

    fn names_in(d: &Path) -> Vec<String> {
        crate::names::names_where(d, |_| true)
    }
}
