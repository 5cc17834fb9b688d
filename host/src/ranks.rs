//! This process as one rank of a pipeline group that `mlx.launch --backend
//! ring` started (`MLX_RANK`, `MLX_HOSTFILE`; the same binary and flags on
//! every rank). Rank 0 serves (or generates) as a single process would, its
//! model holding the embedding, the head and the first layers; every other
//! rank holds its layers and runs them over each step's rows
//! ([`specd_model::ranks`]). At start the ranks compare what shapes the
//! forward (the binary's version, the model's sha256, the weights and
//! kernels, the split) and refuse to run apart.
use crate::load::Load;
use crate::model::ranks::{stage, wire, Downstream, Group, Pipeline, Split};
use crate::model::{load_model_part, Llama};
use anyhow::{anyhow, bail, Context, Result};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A joined group and who holds which layers; on rank 0, once its model
/// is loaded ([`Joined::attach`]), its link to the other ranks. The
/// process's entry point owns it and passes it to what loads the model.
pub struct Joined {
    pub group: Group,
    pub split: Split,
    downstream: OnceLock<Arc<Downstream>>,
}

impl std::fmt::Debug for Joined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Joined")
            .field("group", &self.group)
            .field("split", &self.split)
            .finish_non_exhaustive()
    }
}

/// Whether the launcher started this process as a rank.
pub fn launched() -> bool {
    std::env::var("MLX_RANK").is_ok_and(|v| !v.is_empty())
}

/// How long ranks wait for each other at start (`SPECD_RANK_CONNECT_SECONDS`).
const CONNECT_SECONDS: u64 = 60;

/// Joins the group the environment describes, splits the model at `path`
/// (`layers`: counts in rank order, else equal weight bytes) and checks
/// that every rank runs the same thing.
pub fn join(path: &Path, layers: Option<&[usize]>, load: &Load) -> Result<Arc<Joined>> {
    let rank = std::env::var("MLX_RANK").unwrap_or_default();
    if std::env::var("MLX_HOSTFILE").is_err() {
        bail!("MLX_RANK={rank} but MLX_HOSTFILE is not set: start the ranks with `mlx.launch --backend ring` (or set both, as it does)");
    }
    let wait = std::env::var("SPECD_RANK_CONNECT_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(CONNECT_SECONDS);
    // MLX's ring backend retries a missing peer for a long time (and waits
    // on an accept with no end): give up on our own clock.
    let joined = Arc::new(AtomicBool::new(false));
    {
        let (joined, rank) = (joined.clone(), rank.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(wait));
            if !joined.load(Ordering::SeqCst) {
                eprintln!("error: rank {rank}: the other ranks did not all connect within {wait} s (the hosts in MLX_HOSTFILE)");
                std::process::exit(1);
            }
        });
    }
    let (r, n) = specd_mlx::distributed::init("ring")
        .map_err(|e| anyhow!("rank {rank}: joining the ring ({e})"))?;
    joined.store(true, Ordering::SeqCst);
    let group = Group {
        rank: r as usize,
        size: n as usize,
    };
    let split = Split::of_model(path, group.size, layers)?;
    agree(group, &fingerprint(path, load, &split)?)?;
    Ok(Arc::new(Joined {
        group,
        split,
        downstream: OnceLock::new(),
    }))
}

/// What must be equal on every rank for their layers to make one model.
fn fingerprint(path: &Path, load: &Load, split: &Split) -> Result<String> {
    let sha = if path.is_dir() {
        let mut files: Vec<_> = std::fs::read_dir(path)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        let mut all = String::new();
        for f in files {
            all += &crate::store::sha256_file(&f)?;
        }
        crate::store::sha256_hex(all.as_bytes())
    } else {
        crate::store::sha256_file(path)?
    };
    let s = load.switches;
    Ok(format!(
        "version {}; model sha256 {sha}; weights {:?}; kernels {:?}; kv-f16 {}; kv-rows {}; fused-tail {}; layers {:?}",
        env!("CARGO_PKG_VERSION"),
        load.weights,
        load.kernels,
        s.kv_f16,
        s.kv_rows,
        s.fused_tail,
        split.counts(),
    ))
}

/// Every rank's fingerprint to every rank; any difference is an error on
/// each, naming what differs.
fn agree(group: Group, mine: &str) -> Result<()> {
    const WORDS: usize = 256;
    let bytes = mine.as_bytes();
    if bytes.len() > WORDS * 4 {
        bail!("a fingerprint of {} bytes", bytes.len());
    }
    // Fixed-size: an all-gather takes the same shape from every rank.
    let mut words = wire::to_words(bytes);
    words.resize(WORDS, 0);
    let all =
        specd_mlx::distributed::all_gather(&specd_mlx::Array::from_u32(&words, &[WORDS as i32])?)?;
    let all = all
        .to_vec_u32()
        .map_err(|e| anyhow!("comparing the ranks' settings: a rank was lost ({e})"))?;
    let text = |r: usize| {
        String::from_utf8_lossy(&wire::from_words(&all[r * WORDS..(r + 1) * WORDS])).into_owned()
    };
    for r in 0..group.size {
        let theirs = text(r);
        if theirs != mine {
            let differ: Vec<String> = mine
                .split("; ")
                .zip(theirs.split("; "))
                .filter(|(a, b)| a != b)
                .map(|(a, b)| format!("rank {}: {a}, rank {r}: {b}", group.rank))
                .collect();
            bail!(
                "the ranks do not run the same model and flags ({}); start every rank with the same binary, model and flags",
                differ.join("; ")
            );
        }
    }
    Ok(())
}

impl Joined {
    /// Whether this process shares its model with other ranks (a group
    /// of one runs as a single process).
    pub fn pipelined(&self) -> bool {
        self.group.size > 1
    }

    /// Rank 0's model: its layers, the embedding and head, and the link
    /// to the other ranks.
    pub fn attach(&self, model: Llama) -> Pipeline {
        let per_layer = model.kv_bytes_per_token() / model.layer_count().max(1);
        let d = self.downstream.get_or_init(|| {
            Arc::new(Downstream::new(
                self.group,
                self.split.clone(),
                &model.config,
                per_layer,
            ))
        });
        // The remote caches count the KV bytes this model's flags make
        // (the link may have been made for an earlier model).
        d.set_token_bytes(per_layer);
        // Off only to measure what micro-batches give (bench_ranks.py).
        let halves = std::env::var("SPECD_RANK_MICRO_BATCHES").as_deref() != Ok("0");
        d.micro_batches.store(halves, Ordering::Relaxed);
        self.report(&model);
        Pipeline {
            model,
            downstream: Some(d.clone()),
        }
    }

    fn report(&self, model: &Llama) {
        eprintln!(
            "rank {}/{}: layers {}..{} of {}, {} weight bytes held",
            self.group.rank,
            self.group.size,
            model.first_layer,
            model.local_end(),
            model.layer_count(),
            weight_bytes(model)
        );
    }

    /// A rank after 0: loads its layers and runs them until rank 0 is done.
    pub fn run_stage(&self, path: &Path, load: &Load) -> Result<()> {
        let rank = self.group.rank;
        let part = self.split.ranges[rank].clone();
        let flags = load.switches.flags();
        let (model, _) = load_model_part(path, load.weights, Some(part), flags)
            .with_context(|| format!("rank {rank}: loading its layers of {}", path.display()))?;
        specd_mlx::memory::clear_cache();
        self.report(&model);
        // A launcher passes Ctrl-C / SIGTERM to every rank: this one ends when
        // rank 0 tells it to (after rank 0's drain), or when rank 0 is gone,
        // so a draining rank 0 can still finish what runs.
        // SAFETY: setting a signal's disposition to ignore, before any thread
        // of ours waits on signals.
        unsafe {
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
            libc::signal(libc::SIGINT, libc::SIG_IGN);
        }
        let t = stage::serve(&model, self.group).with_context(|| format!("rank {rank}"))?;
        eprintln!(
            "rank {rank}: stopped after {} frames: waiting {:.3} s, receiving rows {:.3} s, its layers {:.3} s, sending {:.3} s; {} rotating-cache restores",
            t.frames,
            t.wait_seconds,
            t.recv_seconds,
            t.compute_seconds,
            t.send_seconds,
            crate::cache::rotating::restores()
        );
        Ok(())
    }

    /// Whether a peer of the group was lost: nothing more can run.
    pub fn broken(&self) -> bool {
        self.downstream.get().is_some_and(|d| d.broken())
    }

    /// An idle moment on rank 0: a round trip around the ring (the
    /// pending cache operations go with it), so a lost rank is found
    /// while nothing runs too. Errors once a peer is lost.
    pub fn idle_tick(&self) -> Result<()> {
        match self.downstream.get() {
            Some(d) if !d.broken() => d.ping(),
            _ => Ok(()),
        }
    }

    /// Rank 0 is done: the other ranks exit (nothing to do elsewhere).
    pub fn finish(&self) {
        let Some(d) = self.downstream.get() else {
            return;
        };
        if d.broken() {
            return;
        }
        let t = d.timings();
        eprintln!(
            "rank 0: {} frames through the ring: its layers {:.3} s, sending {:.3} s, waiting for the rows back {:.3} s",
            t.frames, t.local_seconds, t.send_seconds, t.recv_seconds
        );
        if let Err(e) = d.stop() {
            eprintln!("warning: telling the other ranks to stop: {e:#}");
        }
    }

    /// On a server's rank 0: once a peer is lost, `lost` is called (the
    /// server's `/health` then answers 503) and the process exits with an
    /// error shortly after, so a router stops sending to it first.
    pub fn exit_when_broken(self: &Arc<Self>, lost: impl Fn() + Send + 'static) {
        let me = self.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(100));
            if me.broken() {
                lost();
                eprintln!(
                    "error: a rank of the pipeline group was lost; failing what runs and exiting"
                );
                std::thread::sleep(Duration::from_secs(2));
                std::process::exit(1);
            }
        });
    }
}

/// Weight bytes `model` holds.
pub fn weight_bytes(model: &Llama) -> usize {
    model.weights().iter().map(|a| a.nbytes()).sum()
}
