//! Trace files (`--record FILE`): JSON lines. The first line is a header
//! `{"specd_trace": 1, "model", "drafter", "schedule", "acceptance",
//! "params", "stats"}`, with `schedule_config` / `acceptance_config` where
//! the request gave its policies one; every further line is one round
//! ([`RoundTrace`](crate::speculation::RoundTrace)): the schedule's input and
//! answer k, the drafted positions as the acceptance policy saw them (token,
//! p, q, target argmax, entropy, uniform), its decision, the committed
//! tokens, and the measured draft / verify / policy seconds.
use crate::engine::Engine;
use crate::options::SpecOptions;
use crate::sequence::{Finished, Settings};
use crate::speculation::RoundTrace;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::Path;

pub const TRACE_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Header {
    pub specd_trace: u32,
    pub model: String,
    pub drafter: String,
    pub schedule: String,
    pub acceptance: String,
    /// The configs the request handed its schedule and acceptance policy
    /// (absent: the policy's own defaults); replay starts from them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_config: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptance_config: Option<serde_json::Value>,
    pub params: crate::sampling::SamplingParams,
    pub stats: serde_json::Value,
}

pub fn header(
    engine: &Engine,
    settings: &Settings,
    spec: &SpecOptions,
    fin: &Finished,
) -> Result<Header> {
    Ok(Header {
        specd_trace: TRACE_VERSION,
        model: engine.name.clone(),
        drafter: fin.stats.drafter.clone(),
        schedule: fin.stats.schedule.clone(),
        acceptance: fin.stats.acceptance.clone(),
        schedule_config: spec.schedule_config.clone(),
        acceptance_config: spec.acceptance_config.clone(),
        params: settings.params.clone(),
        stats: serde_json::to_value(&fin.stats)?,
    })
}

/// Writes (or appends to, for several requests) a trace file: `spec` is
/// what the request asked of speculation (its policies' configs).
pub fn write(
    path: &Path,
    engine: &Engine,
    settings: &Settings,
    spec: &SpecOptions,
    fin: &Finished,
) -> Result<()> {
    let mut f = std::io::BufWriter::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?,
    );
    writeln!(
        f,
        "{}",
        serde_json::to_string(&header(engine, settings, spec, fin)?)?
    )?;
    for r in &fin.trace {
        writeln!(f, "{}", serde_json::to_string(r)?)?;
    }
    f.flush()?;
    Ok(())
}

/// One recorded request.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub header: Header,
    pub rounds: Vec<RoundTrace>,
}

/// Reads every request of a trace file.
pub fn read(path: &Path) -> Result<Vec<Recorded>> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut out: Vec<Recorded> = Vec::new();
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&line)
            .with_context(|| format!("{}:{}: not JSON", path.display(), i + 1))?;
        if v.get("specd_trace").is_some() {
            let header: Header = serde_json::from_value(v)
                .with_context(|| format!("{}:{}: bad header", path.display(), i + 1))?;
            if header.specd_trace != TRACE_VERSION {
                bail!(
                    "{}: trace version {} (this specd reads {TRACE_VERSION})",
                    path.display(),
                    header.specd_trace
                );
            }
            out.push(Recorded {
                header,
                rounds: Vec::new(),
            });
        } else {
            let r: RoundTrace = serde_json::from_value(v)
                .with_context(|| format!("{}:{}: bad round", path.display(), i + 1))?;
            out.last_mut()
                .with_context(|| {
                    format!("{}:{}: a round before any header", path.display(), i + 1)
                })?
                .rounds
                .push(r);
        }
    }
    Ok(out)
}
