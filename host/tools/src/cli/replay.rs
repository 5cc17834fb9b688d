//! `specd replay FILE`: feeds recorded rounds to other policies, no model.
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// A trace file written by `--record`.
    pub file: PathBuf,
    /// Schedule(s) to replay (repeatable; NAME or NAME:{json config};
    /// default: the recorded one).
    #[arg(long)]
    pub schedule: Vec<String>,
    /// JSON config of the schedule at the same position (repeatable).
    #[arg(long)]
    pub schedule_config: Vec<String>,
    /// Acceptance polic(ies) to replay (repeatable; NAME or NAME:{json
    /// config}; default: the recorded one).
    #[arg(long)]
    pub acceptance: Vec<String>,
    /// JSON config of the acceptance policy at the same position (repeatable).
    #[arg(long)]
    pub acceptance_config: Vec<String>,
    /// The schedule config the trace was recorded with, for the baseline
    /// row and the reproduction check [default: the first request's, as its
    /// header keeps it; traces written before headers kept configs have none].
    #[arg(long)]
    pub recorded_schedule_config: Option<String>,
    /// The acceptance config the trace was recorded with [default: as for
    /// the schedule].
    #[arg(long)]
    pub recorded_acceptance_config: Option<String>,
    /// Draft limit (default: inferred from the trace).
    #[arg(long)]
    pub draft_max: Option<usize>,
    /// Directory of user policy components.
    #[arg(long)]
    pub policy_dir: Option<PathBuf>,
    /// Write the reports (with per-round answers) as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw draft length and accepted drafts per round (SVG).
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

fn paired(
    names: &[String],
    configs: &[String],
    what: &str,
) -> Result<Vec<(Option<String>, String)>> {
    if configs.len() > names.len().max(1) {
        bail!("more --{what}-config than --{what} values");
    }
    if names.is_empty() {
        return Ok(vec![(None, configs.first().cloned().unwrap_or_default())]);
    }
    names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            // NAME:{json} carries its own config.
            Ok(match specd::options::policy_with_config(n)? {
                (name, Some(config)) => (Some(name), config.to_string()),
                (name, None) => (Some(name), configs.get(i).cloned().unwrap_or_default()),
            })
        })
        .collect()
}

pub fn run(a: ReplayArgs) -> Result<()> {
    let recs = specd::trace::read(&a.file)?;
    if recs.is_empty() {
        bail!("{}: no recorded requests", a.file.display());
    }
    let rounds: usize = recs.iter().map(|r| r.rounds.len()).sum();
    let h = &recs[0].header;
    eprintln!(
        "{}: {} request(s), {rounds} rounds; recorded model {}, drafter {}, schedule {}, acceptance {}",
        a.file.display(),
        recs.len(),
        h.model,
        h.drafter,
        h.schedule,
        h.acceptance
    );
    let timing = crate::replay::TimingModel::from_rounds(recs.iter().flat_map(|r| &r.rounds))?;
    eprintln!(
        "timing model: plain step {:.3} ms{}, draft {:.3} ms/token, verify by drafts {}",
        timing.plain_step_seconds * 1e3,
        if timing.plain_step_measured {
            ""
        } else {
            " (not recorded: extrapolated, speedups understated)"
        },
        timing.draft_seconds_per_token * 1e3,
        timing
            .verify_seconds_by_len
            .iter()
            .enumerate()
            .filter(|(_, t)| **t > 0.0)
            .map(|(j, t)| format!("{j}:{:.2}ms", t * 1e3))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let schedules = paired(&a.schedule, &a.schedule_config, "schedule")?;
    let acceptances = paired(&a.acceptance, &a.acceptance_config, "acceptance")?;
    // The recorded policies first (the baseline, and the reproduction check).
    // The recorded configs as the (first) header keeps them, unless told.
    let recorded = |told: &Option<String>, kept: &Option<serde_json::Value>| {
        told.clone()
            .or_else(|| kept.as_ref().map(|c| c.to_string()))
            .unwrap_or_default()
    };
    let rsc = recorded(&a.recorded_schedule_config, &h.schedule_config);
    let rac = recorded(&a.recorded_acceptance_config, &h.acceptance_config);
    let mut variants = vec![crate::replay::ReplayPolicies {
        schedule_config: rsc.clone(),
        acceptance_config: rac.clone(),
        draft_max: a.draft_max,
        ..Default::default()
    }];
    for (s, sc) in &schedules {
        for (ac, acc) in &acceptances {
            let v = crate::replay::ReplayPolicies {
                schedule: s.clone(),
                // The recorded policy keeps its recorded config unless told.
                schedule_config: if s.is_none() && sc.is_empty() {
                    rsc.clone()
                } else {
                    sc.clone()
                },
                acceptance: ac.clone(),
                acceptance_config: if ac.is_none() && acc.is_empty() {
                    rac.clone()
                } else {
                    acc.clone()
                },
                draft_max: a.draft_max,
            };
            let same_as_recorded = v.schedule_config == rsc
                && v.acceptance_config == rac
                && v.schedule.as_deref().is_none_or(|x| x == h.schedule)
                && v.acceptance.as_deref().is_none_or(|x| x == h.acceptance);
            if !same_as_recorded {
                variants.push(v);
            }
        }
    }
    let keep = a.json.is_some() || a.svg.is_some();
    let mut reports = Vec::new();
    for v in &variants {
        // A fresh host per variant: schedules that carry state across
        // requests start as they did in the recording.
        let host = specd::cli::policy_host(a.policy_dir.as_deref())?;
        reports.push(crate::replay::replay(&host, &recs, v, &timing, keep)?);
    }
    print!("{}", crate::replay::table(&reports));
    let base = &reports[0];
    if base.recorded_policies {
        if base.matches_recording {
            println!(
                "replay with the recorded policies reproduces every recorded decision ({} rounds: k and acceptance)",
                base.rounds
            );
        } else {
            println!(
                "replay with the recorded policies differs from the recording in {} round(s); first: {} \
                 (a --recorded-*-config other than the recording's, a trace from before headers kept \
                 configs, or carried schedule state?)",
                base.decision_mismatches,
                base.first_mismatch.as_deref().unwrap_or("-")
            );
        }
    }
    for r in &reports {
        if r.truncated_rounds > 0 {
            println!(
                "note: {} {}: k exceeded the recorded drafts in {} of {} rounds and was truncated to them (positions past the recording are unknown)",
                r.schedule, r.schedule_config, r.truncated_rounds, r.rounds
            );
        }
        for f in &r.policy_failures {
            println!("policy failure ({} / {}): {f}", r.schedule, r.acceptance);
        }
    }
    if let Some(p) = &a.json {
        let v = serde_json::json!({ "trace": a.file, "timing": timing, "reports": reports });
        std::fs::write(p, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("writing {}", p.display()))?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &a.svg {
        std::fs::write(p, crate::replay::charts::rounds_svg(&reports)?)
            .with_context(|| format!("writing {}", p.display()))?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}
