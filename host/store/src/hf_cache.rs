//! Models in the Hugging Face hub cache, by repository:
//! `hf:ORG/NAME[@REVISION][:FILE]`.
//!
//! The cache (huggingface_hub's layout) keeps a repository as
//! `models--ORG--NAME/` with `refs/REF` (a commit hash), `snapshots/COMMIT/`
//! (the repository's files, links into `blobs/`) and `blobs/`. A snapshot
//! with `config.json` and safetensors is a Hugging Face model directory;
//! one with GGUF files gives one of them, chosen by `:FILE` (a file name or
//! a quantization such as `Q4_K_M`) where there are several.  Only read,
//! never fetched: nothing here touches the network.
use crate::names::{dir_names, find_ci, names_where, Root};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// An `hf:` name taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfName {
    /// `ORG/NAME` (or a bare `NAME`, as older repositories are).
    pub repo: String,
    pub revision: Option<String>,
    pub file: Option<String>,
}

impl HfName {
    pub fn parse(spec: &str) -> Result<HfName> {
        let (head, file) = match spec.split_once(':') {
            Some((h, f)) => (h, Some(f.to_string())),
            None => (spec, None),
        };
        let (repo, revision) = match head.split_once('@') {
            Some((r, v)) => (r, Some(v.to_string())),
            None => (head, None),
        };
        let parts: Vec<&str> = repo.split('/').collect();
        let ok = parts.len() <= 2
            && parts
                .iter()
                .all(|p| !p.is_empty() && *p != "." && *p != "..")
            && revision
                .as_deref()
                .is_none_or(|r| !r.is_empty() && !r.contains(".."))
            && file
                .as_deref()
                .is_none_or(|f| !f.is_empty() && !f.contains(".."));
        if !ok {
            bail!("hf:{spec} is not a Hugging Face model name (expected hf:ORG/NAME, hf:ORG/NAME@REVISION, hf:ORG/NAME:FILE or hf:ORG/NAME@REVISION:FILE; FILE a file name or a quantization such as Q4_K_M)");
        }
        Ok(HfName {
            repo: repo.to_string(),
            revision,
            file,
        })
    }

    /// The cache's folder name for the repository.
    pub fn folder(&self) -> String {
        format!("models--{}", self.repo.replace('/', "--"))
    }
}

/// One model a snapshot offers: the directory, or one GGUF file of it.
#[derive(Debug, Clone)]
pub struct HfModel {
    /// `hf:ORG/NAME[@REV][:FILE]`: the name that loads it.
    pub name: String,
    pub path: PathBuf,
}

/// The hub cache (read only).
#[derive(Debug, Clone)]
pub struct HfCache {
    pub root: Root,
}

impl HfCache {
    /// huggingface_hub's rule: `HF_HUB_CACHE` (or the older
    /// `HUGGINGFACE_HUB_CACHE`), else `HF_HOME/hub`, else
    /// `XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`.
    pub fn from_env() -> HfCache {
        HfCache {
            root: Root::from_env(
                &[
                    ("HF_HUB_CACHE", ""),
                    ("HUGGINGFACE_HUB_CACHE", ""),
                    ("HF_HOME", "hub"),
                    ("XDG_CACHE_HOME", "huggingface/hub"),
                ],
                ".cache/huggingface/hub",
            ),
        }
    }

    pub fn at(root: impl Into<PathBuf>) -> HfCache {
        HfCache {
            root: Root::given(root.into()),
        }
    }

    /// The path `spec` (without `hf:`) names: a model directory or a GGUF
    /// file inside the snapshot.
    pub fn resolve(&self, spec: &str) -> Result<PathBuf> {
        let n = HfName::parse(spec)?;
        let repo = find_ci(&self.root.path, &n.folder()).with_context(|| {
            format!(
                "hf:{spec} is not in the Hugging Face cache: no {} ({}; specd never downloads: `huggingface-cli download {}` fetches it)",
                self.root.path.join(n.folder()).display(),
                self.root.how(),
                n.repo
            )
        })?;
        let snap = snapshot(&repo, n.revision.as_deref().unwrap_or("main"))
            .with_context(|| format!("hf:{spec}"))?;
        pick(&snap, n.file.as_deref()).with_context(|| format!("hf:{spec}"))
    }

    /// Every model the cache holds: per repository, the snapshot of
    /// `refs/main` (every snapshot where there is no `main`), as a
    /// directory where it has `config.json` and safetensors and as each of
    /// its GGUF files.
    pub fn list(&self) -> Vec<HfModel> {
        let mut out = Vec::new();
        for folder in dir_names(&self.root.path) {
            let Some(repo) = folder.strip_prefix("models--") else {
                continue; // datasets--, spaces--, .locks
            };
            let repo = repo.replace("--", "/");
            let dir = self.root.path.join(&folder);
            let main = std::fs::read_to_string(dir.join("refs/main"))
                .ok()
                .map(|c| c.trim().to_string())
                .filter(|c| dir.join("snapshots").join(c).is_dir());
            let snaps: Vec<(String, String)> = match main {
                Some(c) => vec![(repo.clone(), c)],
                None => dir_names(&dir.join("snapshots"))
                    .into_iter()
                    .map(|c| (format!("{repo}@{c}"), c))
                    .collect(),
            };
            for (name, commit) in snaps {
                let snap = dir.join("snapshots").join(commit);
                if is_model_dir(&snap) {
                    out.push(HfModel {
                        name: format!("hf:{name}"),
                        path: snap.clone(),
                    });
                }
                for f in gguf_files(&snap) {
                    out.push(HfModel {
                        name: format!("hf:{name}:{f}"),
                        path: snap.join(&f),
                    });
                }
            }
        }
        out
    }
}

/// The snapshot `rev` names: a ref (`main`, a branch or tag the cache
/// recorded), a commit hash, or a unique prefix of one.
fn snapshot(repo: &Path, rev: &str) -> Result<PathBuf> {
    let snaps = repo.join("snapshots");
    let commit = match std::fs::read_to_string(repo.join("refs").join(rev)) {
        Ok(c) => c.trim().to_string(),
        Err(_) => {
            let hits: Vec<String> = if rev.len() >= 4 && rev.bytes().all(|b| b.is_ascii_hexdigit())
            {
                dir_names(&snaps)
                    .into_iter()
                    .filter(|c| c.starts_with(&rev.to_ascii_lowercase()))
                    .collect()
            } else {
                vec![]
            };
            match &hits[..] {
                [c] => c.clone(),
                _ => {
                    let refs = names_where(&repo.join("refs"), |p| p.is_file());
                    bail!(
                        "no revision {rev:?} in {}: refs there: {}; snapshots: {}",
                        repo.display(),
                        list_or_none(&refs),
                        list_or_none(&dir_names(&snaps))
                    );
                }
            }
        }
    };
    let snap = snaps.join(&commit);
    if !snap.is_dir() {
        bail!(
            "{} names commit {commit}, but {} is missing (an interrupted download?)",
            repo.join("refs").join(rev).display(),
            snap.display()
        );
    }
    Ok(snap)
}

fn list_or_none(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// A Hugging Face model directory: `config.json` and safetensors weights.
fn is_model_dir(snap: &Path) -> bool {
    snap.join("config.json").is_file()
        && !names_where(snap, |p| {
            p.extension().is_some_and(|x| x == "safetensors") && p.is_file()
        })
        .is_empty()
}

/// The GGUF files of a snapshot, top level and one folder down (repositories
/// that keep each quantization in its own folder), as relative paths.
fn gguf_files(snap: &Path) -> Vec<String> {
    let is_gguf = |p: &Path| {
        p.is_file()
            && p.extension()
                .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
    };
    let mut v = names_where(snap, is_gguf);
    for d in dir_names(snap) {
        v.extend(
            names_where(&snap.join(&d), is_gguf)
                .into_iter()
                .map(|f| format!("{d}/{f}")),
        );
    }
    v.sort();
    v
}

/// Whether `query` appears in `file` (case aside) as a whole part: bounded
/// by the ends or by `-`, `.`, `/` (so `Q4_K` is not `Q4_K_M`).
fn names_quant(file: &str, query: &str) -> bool {
    let (f, q) = (file.to_ascii_lowercase(), query.to_ascii_lowercase());
    let edge = |c: Option<char>| c.is_none_or(|c| matches!(c, '-' | '.' | '/' | ' '));
    f.match_indices(&q)
        .any(|(i, _)| edge(f[..i].chars().next_back()) && edge(f[i + q.len()..].chars().next()))
}

/// What a snapshot gives for `file` (a path in it, or a quantization), or
/// without one: the model directory, else its one GGUF file.
fn pick(snap: &Path, file: Option<&str>) -> Result<PathBuf> {
    let ggufs = gguf_files(snap);
    let listing = || {
        if ggufs.is_empty() {
            format!(
                "it holds no GGUF file (files: {})",
                list_or_none(&names_where(snap, |_| true))
            )
        } else {
            format!("its GGUF files: {}", ggufs.join(", "))
        }
    };
    match file {
        Some(f) => {
            if snap.join(f).exists() {
                return Ok(snap.join(f));
            }
            let hits: Vec<&String> = ggufs
                .iter()
                .filter(|g| g.eq_ignore_ascii_case(f) || names_quant(g, f))
                .collect();
            match &hits[..] {
                [one] => Ok(snap.join(one)),
                [] => bail!(
                    "no file or quantization {f:?} in the snapshot {}: {}",
                    snap.display(),
                    listing()
                ),
                _ => bail!(
                    "{f:?} matches several files in the snapshot {}: {} (name one)",
                    snap.display(),
                    hits.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                ),
            }
        }
        None if is_model_dir(snap) => Ok(snap.to_path_buf()),
        None => match &ggufs[..] {
            [one] => Ok(snap.join(one)),
            [] => bail!(
                "the snapshot {} is neither a model directory (config.json and safetensors) nor holds a GGUF file (files: {})",
                snap.display(),
                list_or_none(&names_where(snap, |_| true))
            ),
            _ => bail!(
                "the snapshot {} holds several GGUF files: {}; choose one with :FILE (a file name or a quantization such as Q4_K_M)",
                snap.display(),
                ggufs.join(", ")
            ),
        },
    }
}

/// The sha256 of a snapshot's file where the cache names its blob by it
/// (large files: the link target's name is their sha256).
pub fn blob_digest(path: &Path) -> Option<String> {
    let target = std::fs::read_link(path).ok()?;
    let name = target.file_name()?.to_str()?;
    (name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit())).then(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::test_dir;

    /// A repository in the cache at `root` whose `main` is commit `c`,
    /// holding `files` (links into `blobs/`, as huggingface_hub makes them).
    fn repo(root: &Path, repo: &str, c: &str, files: &[&str]) -> PathBuf {
        let r = root.join(format!("models--{}", repo.replace('/', "--")));
        let snap = r.join("snapshots").join(c);
        std::fs::create_dir_all(r.join("refs")).unwrap();
        std::fs::create_dir_all(r.join("blobs")).unwrap();
        std::fs::write(r.join("refs/main"), c).unwrap();
        for f in files {
            let hex = crate::sha256_hex(f.as_bytes());
            std::fs::write(r.join("blobs").join(&hex), f.as_bytes()).unwrap();
            let link = snap.join(f);
            std::fs::create_dir_all(link.parent().unwrap()).unwrap();
            let up = "../".repeat(f.matches('/').count() + 2);
            std::os::unix::fs::symlink(format!("{up}blobs/{hex}"), &link).unwrap();
        }
        snap
    }

    #[test]
    fn names_parse() {
        let n = HfName::parse("Org/Name@v1.0:Q4_K_M").unwrap();
        assert_eq!(
            (n.repo.as_str(), n.revision.as_deref(), n.file.as_deref()),
            ("Org/Name", Some("v1.0"), Some("Q4_K_M"))
        );
        assert_eq!(n.folder(), "models--Org--Name");
        let n = HfName::parse("gpt2").unwrap();
        assert_eq!(
            (n.folder().as_str(), n.revision, n.file),
            ("models--gpt2", None, None)
        );
        for bad in ["", "a/b/c", "a/../b", "a/b@", "a/b:", "a/b:../x"] {
            assert!(HfName::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_snapshot_is_a_model_directory_or_the_gguf_chosen() {
        let root = test_dir("hf");
        let c = "0123abcd".repeat(5);
        let dir = repo(
            &root,
            "org/tiny",
            &c,
            &["config.json", "model.safetensors", "tokenizer.json"],
        );
        let gg = repo(
            &root,
            "org/tiny-GGUF",
            "ffff0000ffff0000ffff0000ffff0000ffff0000",
            &[
                "tiny-Q4_K_M.gguf",
                "tiny-Q4_K_S.gguf",
                "tiny-Q8_0.gguf",
                "README.md",
            ],
        );
        let one = repo(
            &root,
            "org/one",
            "1111111111111111111111111111111111111111",
            &["q8/one-Q8_0.gguf"],
        );
        let cache = HfCache::at(&root);
        assert_eq!(cache.resolve("org/tiny").unwrap(), dir);
        assert_eq!(cache.resolve(&format!("org/tiny@{c}")).unwrap(), dir);
        assert_eq!(cache.resolve("org/tiny@0123abc").unwrap(), dir);
        assert_eq!(
            cache.resolve("org/tiny-GGUF:q4_k_m").unwrap(),
            gg.join("tiny-Q4_K_M.gguf")
        );
        assert_eq!(
            cache.resolve("org/tiny-GGUF:tiny-Q8_0.gguf").unwrap(),
            gg.join("tiny-Q8_0.gguf")
        );
        assert_eq!(
            cache.resolve("org/one").unwrap(),
            one.join("q8/one-Q8_0.gguf")
        );
        let e = format!("{:#}", cache.resolve("org/tiny-GGUF").unwrap_err());
        assert!(
            e.contains("several GGUF files: tiny-Q4_K_M.gguf, tiny-Q4_K_S.gguf, tiny-Q8_0.gguf"),
            "{e}"
        );
        // Q4_K is not Q4_K_M: a whole part of the name or nothing.
        let e = format!("{:#}", cache.resolve("org/tiny-GGUF:Q4_K").unwrap_err());
        assert!(
            e.contains("no file or quantization \"Q4_K\"") && e.contains("tiny-Q8_0.gguf"),
            "{e}"
        );
        let e = format!("{:#}", cache.resolve("org/tiny-GGUF:tiny").unwrap_err());
        assert!(e.contains("matches several"), "{e}");
        let names: Vec<String> = cache.list().into_iter().map(|m| m.name).collect();
        assert_eq!(
            names,
            [
                "hf:org/one:q8/one-Q8_0.gguf",
                "hf:org/tiny",
                "hf:org/tiny-GGUF:tiny-Q4_K_M.gguf",
                "hf:org/tiny-GGUF:tiny-Q4_K_S.gguf",
                "hf:org/tiny-GGUF:tiny-Q8_0.gguf",
            ]
        );
        let q8 = gg.join("tiny-Q8_0.gguf");
        assert_eq!(
            blob_digest(&q8).unwrap(),
            crate::sha256_hex(b"tiny-Q8_0.gguf")
        );
    }

    #[test]
    fn missing_repositories_and_revisions_say_where_they_looked() {
        let root = test_dir("hf-missing");
        repo(
            &root,
            "org/tiny",
            "abcdef0123456789abcdef0123456789abcdef01",
            &["config.json"],
        );
        let cache = HfCache::at(&root);
        let e = format!("{:#}", cache.resolve("org/nope").unwrap_err());
        assert!(
            e.contains(&root.join("models--org--nope").display().to_string()),
            "{e}"
        );
        let e = format!("{:#}", cache.resolve("org/tiny@v2").unwrap_err());
        assert!(
            e.contains("no revision \"v2\"") && e.contains("refs there: main"),
            "{e}"
        );
        assert!(
            e.contains("abcdef0123456789abcdef0123456789abcdef01"),
            "{e}"
        );
        let e = format!("{:#}", cache.resolve("org/tiny").unwrap_err());
        assert!(
            e.contains("neither a model directory") && e.contains("config.json"),
            "{e}"
        );
    }
}
