use alloc::string::String;
use alloc::vec::Vec;
use serde::Deserialize;

use super::throughput::estimate_verify;
use crate::contract::{parse_config, RoundRecord, ScheduleInput, ScheduleLogic};

/// `bandit` (contract 0.2): UCB1 (Auer et al. 2002) over draft lengths.
///
/// The arms are the k in `arms` (config `{"arms": [0, 1, 2, 3, 4, 6, 8],
/// "c": 0.5}`; 0 is a plain decoding step, so a drafter that does not pay
/// can be switched off; each answer is clipped to max-draft).  Each round's
/// reward is the tokens it committed per unit of cost, in plain decoding
/// steps:
///
///     reward = (accepted + 1) / ((draft-seconds + verify-seconds) / verify(0))
///
/// with verify(0) the measured plain-step time (as `throughput` estimates
/// it), so plain decoding earns about 1 and speculation that pays earns
/// more; before any timing is known the reward is (accepted + 1) /
/// (drafted + 1).  An arm never played is played first (in order); then the
/// answer is the arm with the largest mean + c * sqrt(ln N / n).  A round's
/// reward is credited when the schedule is next asked (the last round of a
/// request is not).
///
/// It learns across requests: `carry` hands back every arm's count and
/// reward sum (format: 1 version byte, then per arm k and n as u32 LE and
/// the sum as f64 LE), which the next request's `create` resumes from when
/// its arms are the same.
#[derive(Clone, Debug)]
pub struct Bandit {
    pub arms: Vec<u32>,
    pub c: f64,
    pub plays: Vec<u32>,
    pub sums: Vec<f64>,
    /// The arm answered last round, credited at the next call.
    pub pending: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BanditConfig {
    #[serde(default = "default_arms")]
    arms: Vec<u32>,
    #[serde(default = "default_bandit_c")]
    c: f64,
}

fn default_arms() -> Vec<u32> {
    alloc::vec![0, 1, 2, 3, 4, 6, 8]
}
fn default_bandit_c() -> f64 {
    0.5
}

const BANDIT_CARRY_VERSION: u8 = 1;

impl Bandit {
    fn decode(&mut self, bytes: &[u8]) {
        let n = self.arms.len();
        if bytes.len() != 1 + n * 16 || bytes[0] != BANDIT_CARRY_VERSION {
            return;
        }
        let mut plays = Vec::with_capacity(n);
        let mut sums = Vec::with_capacity(n);
        for (i, chunk) in bytes[1..].chunks_exact(16).enumerate() {
            let k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            if k != self.arms[i] {
                return;
            }
            plays.push(u32::from_le_bytes([chunk[4], chunk[5], chunk[6], chunk[7]]));
            let mut f = [0u8; 8];
            f.copy_from_slice(&chunk[8..16]);
            let sum = f64::from_le_bytes(f);
            sums.push(if sum.is_finite() { sum } else { 0.0 });
        }
        self.plays = plays;
        self.sums = sums;
    }

    /// The reward of a finished round (see the type's docs).
    pub fn reward(&self, last: &RoundRecord, input: &ScheduleInput) -> f64 {
        let tokens = last.accepted as f64 + 1.0;
        let cost = last.draft_seconds.max(0.0) + last.verify_seconds.max(0.0);
        match estimate_verify(&input.verify_seconds_by_len, 0) {
            Some(plain) if cost.is_finite() && cost > 0.0 => tokens / (cost / plain),
            _ => tokens / (last.drafted as f64 + 1.0),
        }
    }
}

impl ScheduleLogic for Bandit {
    fn create(config: &str, carried: Option<&[u8]>) -> Result<Self, String> {
        let c: BanditConfig = parse_config(config)?;
        if c.arms.is_empty() || c.arms.len() > 32 {
            return Err("bad config: arms must list 1 to 32 draft lengths".into());
        }
        if !(c.c.is_finite() && c.c >= 0.0) {
            return Err("bad config: c must be finite and >= 0".into());
        }
        let n = c.arms.len();
        let mut b = Bandit {
            arms: c.arms,
            c: c.c,
            plays: alloc::vec![0; n],
            sums: alloc::vec![0.0; n],
            pending: None,
        };
        if let Some(bytes) = carried {
            b.decode(bytes);
        }
        Ok(b)
    }
    fn next_draft_length(&mut self, input: &ScheduleInput) -> u32 {
        if let (Some(arm), Some(last)) = (self.pending.take(), input.recent.last()) {
            let r = self.reward(last, input);
            if r.is_finite() {
                self.plays[arm] = self.plays[arm].saturating_add(1);
                self.sums[arm] += r;
            }
        }
        if input.max_draft == 0 {
            return 0;
        }
        let arm = match self.plays.iter().position(|&n| n == 0) {
            Some(i) => i,
            None => {
                let total: f64 = self.plays.iter().map(|&n| n as f64).sum();
                let ln = libm::log(total.max(1.0));
                let mut best = (0usize, f64::NEG_INFINITY);
                for i in 0..self.arms.len() {
                    let n = self.plays[i] as f64;
                    let score = self.sums[i] / n + self.c * libm::sqrt(ln / n);
                    if score > best.1 {
                        best = (i, score);
                    }
                }
                best.0
            }
        };
        self.pending = Some(arm);
        self.arms[arm].min(input.max_draft)
    }
    fn carry(&self) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(1 + self.arms.len() * 16);
        out.push(BANDIT_CARRY_VERSION);
        for i in 0..self.arms.len() {
            out.extend_from_slice(&self.arms[i].to_le_bytes());
            out.extend_from_slice(&self.plays[i].to_le_bytes());
            out.extend_from_slice(&self.sums[i].to_le_bytes());
        }
        Some(out)
    }
}
