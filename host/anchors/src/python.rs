//! The anchor script (`scripts/anchors.py`): one Python process per engine
//! and command, its package checked (and installed once, when allowed),
//! its one JSON object read back.
use crate::options::{Decode, Options, Prefill};
use serde::Deserialize;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// The anchor script, run with `python -c`.
pub const SCRIPT: &str = include_str!("../../../scripts/anchors.py");

/// The anchor script with `args`, threads pinned through the environment.
pub fn script(o: &Options, engine: &str, cmd: &str) -> Command {
    let mut c = Command::new(&o.python);
    c.arg("-c").arg(SCRIPT).arg(cmd).arg(engine);
    let t = o.threads.to_string();
    c.env("OPENBLAS_NUM_THREADS", &t)
        .env("OMP_NUM_THREADS", &t)
        .env("PYTHONUNBUFFERED", "1");
    if engine == "mlx-lm" {
        if let Some(blas) = &o.mlx_lm_blas {
            c.env("LD_PRELOAD", blas);
        }
    }
    c
}

/// Our stderr as a child's stdout (pip's progress must not reach `--json`'s stdout).
pub fn stderr_stdio() -> Stdio {
    use std::os::fd::AsFd;
    match std::io::stderr().as_fd().try_clone_to_owned() {
        Ok(fd) => Stdio::from(fd),
        Err(_) => Stdio::null(),
    }
}

#[derive(Deserialize)]
pub struct ScriptError {
    pub error: String,
    pub install: Option<String>,
}

fn install_hint(o: &Options, engine: &str) -> String {
    let pkgs = match engine {
        "llama.cpp" => "llama-cpp-python==0.3.16  (it compiles llama.cpp: needs cmake and a C++ compiler, e.g. apt-get install cmake g++)",
        _ => "mlx[cpu]==0.32.4 mlx-lm==0.32.2",
    };
    format!("{} -m pip install {pkgs}", o.python.display())
}

/// Checks that `engine` imports, installing it once when allowed.
/// `Err((error, install hint))` when it cannot run.
pub fn ensure(
    o: &Options,
    engine: &str,
    progress: &mut dyn FnMut(&str),
) -> std::result::Result<(), (String, String)> {
    let check = || -> std::result::Result<(), (String, String)> {
        let out = script(o, engine, "check")
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|err| {
                (
                    format!(
                        "cannot run the anchors' python {}: {err}",
                        o.python.display()
                    ),
                    "create the venv (make venv) or point SPECD_PYTHON at a python 3 with pip"
                        .into(),
                )
            })?;
        if out.status.success() {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&out.stdout);
        match text
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str::<ScriptError>(l).ok())
        {
            Some(se) => Err((
                se.error,
                se.install.unwrap_or_else(|| install_hint(o, engine)),
            )),
            None => Err((
                format!(
                    "the anchor script failed in {} ({}): {}",
                    o.python.display(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                install_hint(o, engine),
            )),
        }
    };
    match check() {
        Ok(()) => Ok(()),
        Err(missing) if o.install && missing.0.contains("not importable") => {
            progress(&format!(
                "{engine} is not installed in {}: installing it now ({}){}",
                o.python.display(),
                missing.1,
                if engine == "llama.cpp" {
                    "; pip compiles llama.cpp, which takes minutes on 2 cores"
                } else {
                    ""
                }
            ));
            let status = script(o, engine, "install")
                .stdin(Stdio::null())
                .stdout(stderr_stdio())
                .status();
            match status {
                Ok(s) if s.success() => check(),
                Ok(s) => Err((
                    format!("installing {engine} failed ({s}): see pip's output above"),
                    missing.1,
                )),
                Err(err) => Err((format!("installing {engine}: {err}"), missing.1)),
            }
        }
        Err(e) => Err(e),
    }
}

#[derive(Deserialize)]
pub struct ScriptRun {
    pub version: String,
    pub load_seconds: f64,
    pub prefill: Prefill,
    pub decode: Decode,
    pub tokens: Vec<u32>,
    /// How the engine was run where it departs from its defaults.
    #[serde(default)]
    pub backend_note: Option<String>,
}

/// One anchor in its own Python process.
pub fn run_anchor(
    o: &Options,
    engine: &str,
    model: &Path,
    cfg: &serde_json::Value,
) -> std::result::Result<ScriptRun, (String, Option<String>)> {
    let mut child = script(o, engine, "run")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|err| (format!("cannot run {}: {err}", o.python.display()), None))?;
    let mut cfg = cfg.clone();
    cfg["model"] = model.display().to_string().into();
    {
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin
            .write_all(cfg.to_string().as_bytes())
            .map_err(|err| (format!("writing the anchor's config: {err}"), None))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|err| (format!("waiting for {engine}: {err}"), None))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().rev().find(|l| l.trim_start().starts_with('{'));
    if let Some(l) = last {
        if out.status.success() {
            if let Ok(r) = serde_json::from_str::<ScriptRun>(l) {
                return Ok(r);
            }
        }
        if let Ok(se) = serde_json::from_str::<ScriptError>(l) {
            return Err((se.error, se.install));
        }
    }
    Err((
        format!(
            "{engine} gave no result ({}); its output: {}",
            out.status,
            text.trim()
        ),
        None,
    ))
}
