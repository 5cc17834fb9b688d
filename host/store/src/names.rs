//! What the stores of other tools have in common for specd: a root found
//! from the environment the way that tool finds it (and said back in errors,
//! so a user sees where specd looked), and reading directories that may not
//! exist.
use std::path::{Path, PathBuf};

/// A store's root and how it was found.
#[derive(Debug, Clone)]
pub struct Root {
    pub path: PathBuf,
    /// The variable that gave it (`None`: the default under `$HOME`).
    pub from: Option<&'static str>,
    /// The variables that would have given it, in order (for errors).
    pub vars: Vec<&'static str>,
}

impl Root {
    /// The first of `vars` that is set and not empty (joined with its
    /// suffix), else `$HOME/default`.
    pub fn from_env(vars: &[(&'static str, &str)], default: &str) -> Root {
        let names = vars.iter().map(|(v, _)| *v).collect();
        for (var, suffix) in vars {
            if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
                let p = PathBuf::from(v);
                return Root {
                    path: if suffix.is_empty() { p } else { p.join(suffix) },
                    from: Some(var),
                    vars: names,
                };
            }
        }
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("."));
        Root {
            path: home.join(default),
            from: None,
            vars: names,
        }
    }

    /// A root given outright (tests, tools).
    pub fn given(path: PathBuf) -> Root {
        Root {
            path,
            from: None,
            vars: vec![],
        }
    }

    /// How the root was found, for an error: `from OLLAMA_MODELS` or `the
    /// default; OLLAMA_MODELS sets another`.
    pub fn how(&self) -> String {
        match (self.from, self.vars.as_slice()) {
            (Some(v), _) => format!("the store at {}, from {v}", self.path.display()),
            (None, []) => format!("the store at {}", self.path.display()),
            (None, vars) => format!(
                "the default store {}; {} sets another",
                self.path.display(),
                vars.join(" or ")
            ),
        }
    }
}

/// The names of the directories in `dir`, sorted (none if it does not
/// exist or does not read). Links to directories count.
pub fn dir_names(dir: &Path) -> Vec<String> {
    names_where(dir, |p| p.is_dir())
}

/// The names in `dir` of the entries `keep` accepts, sorted.
pub fn names_where(dir: &Path, keep: impl Fn(&Path) -> bool) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| keep(&e.path()))
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// `dir/name`, else the one entry of `dir` whose name equals `name` but
/// for case (names are case-insensitive where the tool that wrote them
/// treats them so); `None` when neither exists.
pub fn find_ci(dir: &Path, name: &str) -> Option<PathBuf> {
    let exact = dir.join(name);
    if exact.exists() {
        return Some(exact);
    }
    let mut matches = names_where(dir, |_| true)
        .into_iter()
        .filter(|n| n.eq_ignore_ascii_case(name));
    match (matches.next(), matches.next()) {
        (Some(n), None) => Some(dir.join(n)),
        _ => None,
    }
}

/// Bytes of a file, or of every file under a directory (links followed:
/// a hub-cache snapshot is links into its blobs).
pub fn size_of(p: &Path) -> u64 {
    if p.is_dir() {
        std::fs::read_dir(p)
            .map(|d| d.filter_map(|e| e.ok()).map(|e| size_of(&e.path())).sum())
            .unwrap_or(0)
    } else {
        std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
    }
}

/// A number unique within this process (temporary file names).
pub fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// A fresh empty directory under the system's temporary one, for tests.
#[cfg(test)]
pub fn test_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "specd-store-{tag}-{}-{}",
        std::process::id(),
        unique()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
