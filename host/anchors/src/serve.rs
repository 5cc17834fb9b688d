//! The `specd bench serve --anchor` row set: mlx-lm's own server
//! (`python -m mlx_lm.server`, its continuous batching) on the weights
//! `specd convert` writes, driven at the same concurrencies with the same
//! request texts (`specd_tools::serve_bench::request_text`), the same token budget
//! and greedy decoding, and measured the way `bench serve` measures specd:
//! aggregate tok/s from submission to the last token, decode tok/s from the
//! first first piece to the last piece, p50/p99 time to first piece and
//! between pieces.
//!
//! The client is a plain HTTP/1.1 one over `std::net` (one thread per
//! request, `stream: true`, server-sent events): no HTTP crate, and nothing
//! of it in the server binary.
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use specd_tools::latency::Latency;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One concurrency's result, in the latency fields of `bench serve`'s rows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServeAnchorRow {
    pub engine: String,
    #[serde(flatten)]
    pub latency: Latency,
}

/// specd's rows as `bench serve --json` writes them.
pub use specd_tools::serve_bench::ServeRow as OursRow;

pub struct ServeOptions {
    pub python: PathBuf,
    /// A Hugging Face directory mlx-lm loads.
    pub model_dir: PathBuf,
    pub concurrency: Vec<usize>,
    pub max_tokens: usize,
    pub threads: usize,
    /// Preloaded into the server (the wheel's own BLAS is reference BLAS).
    pub blas: Option<PathBuf>,
}

/// The server process; killed (and reaped) when dropped. Its stderr (a line
/// per request) goes to `log`, shown only when it fails.
struct Server {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Server {
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

fn start(o: &ServeOptions) -> Result<Server> {
    let port = free_port()?;
    let log = std::env::temp_dir().join(format!("specd-mlx-lm-server-{}.log", std::process::id()));
    let t = o.threads.to_string();
    let mut c = Command::new(&o.python);
    c.args(["-m", "mlx_lm.server", "--host", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .arg("--model")
        .arg(&o.model_dir)
        .args(["--temp", "0", "--max-tokens"])
        .arg(o.max_tokens.to_string())
        .args(["--log-level", "WARNING"])
        .env("OPENBLAS_NUM_THREADS", &t)
        .env("OMP_NUM_THREADS", &t)
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?,
        ));
    if let Some(b) = &o.blas {
        c.env("LD_PRELOAD", b);
    }
    let child = c.spawn().with_context(|| {
        format!(
            "starting mlx_lm.server with {} (pip install mlx-lm)",
            o.python.display()
        )
    })?;
    let mut s = Server { child, port, log };
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if let Some(status) = s.child.try_wait()? {
            bail!(
                "mlx_lm.server exited before it answered ({status}):\n{}",
                s.log_tail()
            );
        }
        if let Ok((200, _)) = get(port, "/health") {
            return Ok(s);
        }
        if Instant::now() > deadline {
            bail!(
                "mlx_lm.server did not answer /health within 180 s:\n{}",
                s.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn get(port: u16, path: &str) -> Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, text))
}

/// One streamed request's timing: seconds from `t0` to each non-empty piece,
/// and the completion tokens the server counted.
#[derive(Debug, Default)]
struct Stream {
    pieces: Vec<f64>,
    tokens: usize,
}

fn stream_completion(port: u16, prompt: &str, max_tokens: usize, t0: Instant) -> Result<Stream> {
    let body = serde_json::json!({
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string();
    let mut s = TcpStream::connect(("127.0.0.1", port)).context("connecting to mlx_lm.server")?;
    s.set_read_timeout(Some(Duration::from_secs(600)))?;
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status)?;
    if !status.contains(" 200") {
        let mut rest = String::new();
        let _ = r.read_to_string(&mut rest);
        bail!("mlx_lm.server answered {}: {}", status.trim(), rest.trim());
    }
    let mut out = Stream::default();
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            break;
        }
        // Headers, blank lines and chunk sizes carry no "data: " prefix.
        let Some(data) = line.trim_end().strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let v: serde_json::Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(_) => continue,
        };
        let text = v["choices"][0]["text"].as_str().unwrap_or("");
        if !text.is_empty() {
            out.pieces.push(t0.elapsed().as_secs_f64());
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            out.tokens = n as usize;
        }
    }
    if out.tokens == 0 {
        out.tokens = out.pieces.len();
    }
    Ok(out)
}

/// `n` requests at once, as `bench serve` submits its batch.
fn one(port: u16, n: usize, max_tokens: usize) -> Result<ServeAnchorRow> {
    let t0 = Instant::now();
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let text = specd_tools::serve_bench::request_text(i);
            std::thread::spawn(move || stream_completion(port, &text, max_tokens, t0))
        })
        .collect();
    let mut streams = Vec::new();
    for h in handles {
        streams.push(
            h.join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))??,
        );
    }
    let seconds = t0.elapsed().as_secs_f64();
    let tokens: usize = streams.iter().map(|s| s.tokens).sum();
    let pieces: Vec<Vec<f64>> = streams.into_iter().map(|s| s.pieces).collect();
    Ok(ServeAnchorRow {
        engine: "mlx-lm".into(),
        latency: Latency::of(n, tokens, seconds, &pieces),
    })
}

/// Starts mlx-lm's server, warms it up, and runs every concurrency.
pub fn run(o: &ServeOptions, progress: &mut dyn FnMut(&str)) -> Result<Vec<ServeAnchorRow>> {
    if !o.model_dir.join("config.json").exists() {
        bail!("{} is not a Hugging Face directory", o.model_dir.display());
    }
    progress(&format!(
        "mlx-lm server on {} ({} threads)",
        o.model_dir.display(),
        o.threads
    ));
    let server = start(o)?;
    let fail = |e: anyhow::Error| e.context(format!("mlx_lm.server's log:\n{}", server.log_tail()));
    // Warm-up, as bench serve warms specd: first-touch allocations, compiles.
    one(server.port, 2, 8).map_err(fail)?;
    let mut rows = Vec::new();
    for &n in &o.concurrency {
        progress(&format!("mlx-lm server: N={n}"));
        rows.push(one(server.port, n, o.max_tokens).map_err(fail)?);
    }
    Ok(rows)
}

/// The mlx-lm rows, and specd's greedy plain-decoding row at each N with
/// the ratio specd / mlx-lm, when `ours` has it.
pub fn table(rows: &[ServeAnchorRow], ours: &[OursRow]) -> String {
    let mut s = String::from(
        "\nanchor: mlx-lm's server (mlx_lm.server, its batching), greedy, same request texts and token budget\n",
    );
    s += &format!(
        "{:<8} {:>4} {:>7} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9}   {:>12} {:>12}\n",
        "ENGINE",
        "N",
        "TOKENS",
        "tok/s",
        "decode t/s",
        "ttft p50",
        "ttft p99",
        "itl p50",
        "itl p99",
        "specd tok/s",
        "specd/mlx-lm"
    );
    for row in rows {
        let r = &row.latency;
        let o = ours.iter().map(|x| (x, &x.latency)).find(|(x, l)| {
            x.mode == "greedy" && x.drafter == "none" && l.concurrency == r.concurrency
        });
        let (ot, ratio) = match o {
            Some((_, o)) if r.tokens_per_second > 0.0 => (
                format!("{:.1}", o.tokens_per_second),
                format!("{:.2}x", o.tokens_per_second / r.tokens_per_second),
            ),
            _ => ("-".into(), "-".into()),
        };
        s += &format!(
            "{:<8} {:>4} {:>7} {:>9.1} {:>10.1} {:>8.0}ms {:>8.0}ms {:>8.1}ms {:>8.1}ms   {:>12} {:>12}\n",
            row.engine,
            r.concurrency,
            r.tokens,
            r.tokens_per_second,
            r.decode_tokens_per_second,
            r.ttft_p50 * 1e3,
            r.ttft_p99 * 1e3,
            r.itl_p50 * 1e3,
            r.itl_p99 * 1e3,
            ot,
            ratio
        );
    }
    s
}

/// specd's rows from `bench serve`'s JSON.
pub fn read_ours(path: &Path) -> Result<Vec<OursRow>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not bench serve's rows", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_puts_specd_next_to_mlx_lm_per_n() {
        let row = |n, tps| ServeAnchorRow {
            engine: "mlx-lm".into(),
            latency: Latency {
                concurrency: n,
                tokens: 48 * n,
                seconds: 1.0,
                tokens_per_second: tps,
                decode_tokens_per_second: tps,
                ttft_p50: 0.1,
                ttft_p99: 0.2,
                itl_p50: 0.01,
                itl_p99: 0.02,
            },
        };
        let ours: Vec<OursRow> = serde_json::from_str(
            r#"[{"mode":"greedy","drafter":"none","concurrency":1,"tokens_per_second":50.0,
                 "decode_tokens_per_second":60.0,"ttft_p50":0.01,"itl_p50":0.02,"tokens":48},
                {"mode":"greedy","drafter":"ngram","concurrency":2,"tokens_per_second":999.0,
                 "decode_tokens_per_second":60.0,"ttft_p50":0.01,"itl_p50":0.02}]"#,
        )
        .unwrap();
        let t = table(&[row(1, 10.0), row(2, 20.0)], &ours);
        assert!(t.contains("5.00x"), "{t}");
        // No greedy plain-decoding row at N = 2: no ratio, not the ngram one.
        assert!(!t.contains("49.95x"), "{t}");
    }
}
