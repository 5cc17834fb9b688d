//! The KV rules, in one place: what a token of a request takes
//! ([`KvRates`]), what a request holds, what it reserves to start, and
//! what a step may reach before requests are preempted. The scheduler
//! admits and preempts by them; the server's validation refuses a prompt
//! by them before it queues.
use super::BatchLimits;
use crate::engine::Engine;
use crate::options::DrafterSpec;
use crate::speculation::Speculation;

/// What the served model's KV caches take a token, read once from the
/// engine: the target's, and each draft model's. A request's bytes a token
/// ([`KvRates::per_token`]) is the one rule the scheduler and the server's
/// validation before the queue both use.
#[derive(Debug, Clone)]
pub struct KvRates {
    target: usize,
    layers: usize,
    drafts: Vec<(String, usize)>,
    /// Each draft head's (`""`: the shipped one).
    heads: Vec<(String, usize)>,
}

impl KvRates {
    pub fn of(engine: &Engine) -> KvRates {
        KvRates {
            target: engine.model.kv_bytes_per_token(),
            layers: engine.model.config.num_hidden_layers,
            drafts: engine
                .drafts
                .iter()
                .map(|(n, m)| (n.clone(), m.kv_bytes_per_token()))
                .collect(),
            heads: engine
                .heads
                .iter()
                .map(|(n, h)| (n.clone(), h.kv_bytes_per_token()))
                .collect(),
        }
    }

    /// Bytes a token of a request with `drafter`: the target's, plus the
    /// drafter's own cache where it keeps one (`self:N`: the target's
    /// first N layers'; a draft model or an MTP head: its own). Model-free
    /// drafters (n-gram, suffix) and no drafter hold no KV.
    pub fn per_token(&self, drafter: &DrafterSpec) -> usize {
        let draft = match drafter {
            DrafterSpec::SelfLayers(n) => self.target * (*n).min(self.layers) / self.layers.max(1),
            DrafterSpec::Model(name) => self
                .drafts
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0, |(_, b)| *b),
            DrafterSpec::Mtp(name) | DrafterSpec::SuffixMtp(name) => {
                let name = name.as_deref().unwrap_or("");
                self.heads
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or(0, |(_, b)| *b)
            }
            DrafterSpec::None | DrafterSpec::Ngram { .. } | DrafterSpec::Suffix => 0,
        };
        self.target + draft
    }
}

/// What a request's drafter was built from ([`DrafterSpec::None`] without
/// speculation).
pub fn drafter_of(spec: &Option<Speculation>) -> &DrafterSpec {
    spec.as_ref()
        .map_or(&DrafterSpec::None, |s| &s.drafter_spec)
}

/// Whether `drafter` holds a KV cache of its own (counted in
/// [`KvRates::per_token`]).
pub fn drafter_holds_kv(drafter: &DrafterSpec) -> bool {
    matches!(
        drafter,
        DrafterSpec::SelfLayers(_)
            | DrafterSpec::Model(_)
            | DrafterSpec::Mtp(_)
            | DrafterSpec::SuffixMtp(_)
    )
}

/// The default KV budget: a quarter of the memory the caches live in, the
/// GPU's where MLX runs on one (CUDA, Metal builds), else the machine's
/// (4 GiB where it cannot be read).
pub fn default_kv_budget() -> usize {
    let gpu = specd_mlx::gpu_memory() as usize;
    if gpu > 0 {
        return gpu / 4;
    }
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
            .map(|kb| kb * 1024)
    });
    total.map_or(4 << 30, |t| t / 4)
}

/// Bytes a request whose caches hold `tokens` holds or has reserved: one
/// more row than it holds (the next token's), at `per_token` bytes each.
pub fn held_bytes(tokens: usize, per_token: usize) -> usize {
    (tokens + 1) * per_token
}

/// Bytes a request whose caches hold `tokens` may reach in a step that
/// forwards `rows` more.
pub fn step_peak_bytes(tokens: usize, rows: usize, per_token: usize) -> usize {
    (tokens + rows) * per_token
}

/// The budget rules of one scheduler: its `--kv-budget`, shared by up to
/// `--max-sequences` requests.
#[derive(Debug, Clone)]
pub struct KvBudget {
    pub rates: KvRates,
    budget: Option<usize>,
    max_sequences: usize,
}

impl KvBudget {
    pub fn new(rates: KvRates, limits: &BatchLimits) -> KvBudget {
        KvBudget {
            rates,
            budget: limits.kv_budget,
            max_sequences: limits.max_sequences.max(1),
        }
    }

    /// Tokens of KV a request reserves besides its own: a share of the
    /// budget, so admission does not fill it with prompts alone.
    fn share_tokens(&self) -> usize {
        self.budget.map_or(0, |b| {
            b / (2 * self.max_sequences * self.rates.target.max(1))
        })
    }

    /// Bytes a request of `tokens` tokens (its prompt, or its log and one
    /// round's rows when it resumes) reserves to start: its own and a
    /// share of the budget.
    pub fn to_start(&self, tokens: usize, per_token: usize) -> usize {
        tokens * per_token + self.share_tokens() * self.rates.target
    }

    /// Whether `more` bytes fit beside the `held` ones.
    pub fn fits(&self, held: usize, more: usize) -> bool {
        self.budget.is_none_or(|b| held + more <= b)
    }

    /// Whether a step whose requests may reach `peak` bytes passes the
    /// budget (then the newest is preempted).
    pub fn passed_by(&self, peak: usize) -> bool {
        self.budget.is_some_and(|b| peak > b)
    }

    pub fn bounded(&self) -> bool {
        self.budget.is_some()
    }
}
