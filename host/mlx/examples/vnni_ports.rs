//! What bounds the int8 tiles at many rows: `vpdpbusd` (zmm) alone against
//! `vpdpbusd` with the per-block epilogue of `qmm_vnni.cc` (per output and
//! 32-value block: 8 `vpdpbusd`, one conversion, three FMAs), on one core, in
//! registers (no memory). Where the FMAs share the pipes of `vpdpbusd`, each
//! adds a cycle to every block and no tile with that epilogue passes
//! 8 / (8 + 3) `vpdpbusd` a cycle. Run both at once on every core to see
//! whether they share a core's units.
//! `cargo run --release -p specd-mlx --example vnni_ports`.
#[cfg(target_arch = "x86_64")]
mod ports {
    use std::arch::x86_64::*;
    use std::time::Instant;

    /// Independent accumulator chains: well past `vpdpbusd`'s latency.
    const CHAINS: usize = 12;

    /// Nanoseconds per `vpdpbusd` when every 8 of each chain are followed by
    /// `fmas` FMAs (on the converted sum where `cvt`).
    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn run(iters: usize, fmas: usize, cvt: bool) -> f64 {
        let mut acc = [_mm512_set1_epi32(1); CHAINS];
        let mut f = [_mm512_set1_ps(0.5); CHAINS];
        let (mut w, x) = (
            _mm512_set1_epi32(0x0102_0304),
            _mm512_set1_epi32(0x0506_0708),
        );
        let s = _mm512_set1_ps(1.0001);
        let t0 = Instant::now();
        for it in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm512_dpbusd_epi32(*a, w, x);
            }
            if it % 8 == 7 {
                for (a, f) in acc.iter().zip(f.iter_mut()) {
                    let t = if cvt { _mm512_cvtepi32_ps(*a) } else { *f };
                    for _ in 0..fmas {
                        *f = _mm512_fmadd_ps(t, s, *f);
                    }
                }
            }
            // Keeps the weights opaque, so the loop is not folded.
            w = std::hint::black_box(w);
        }
        let ns = t0.elapsed().as_secs_f64() * 1e9 / (iters * CHAINS) as f64;
        let sum: i64 = acc
            .iter()
            .map(|a| _mm512_reduce_add_epi32(*a) as i64)
            .sum::<i64>()
            + f.iter()
                .map(|f| _mm512_reduce_add_ps(*f) as i64)
                .sum::<i64>();
        std::hint::black_box(sum);
        ns
    }

    /// Core clock in GHz from a chain of dependent adds (one a cycle).
    fn clock_ghz() -> f64 {
        let n = 1_000_000_000u64;
        let t0 = Instant::now();
        let mut v = 0u64;
        for _ in 0..n {
            // SAFETY: one register add, no memory.
            unsafe { std::arch::asm!("add {0}, 1", inout(reg) v, options(nomem, nostack)) };
        }
        std::hint::black_box(v);
        n as f64 / t0.elapsed().as_secs_f64() / 1e9
    }

    pub fn main() {
        if !is_x86_feature_detected!("avx512vnni") {
            println!("this CPU has no AVX-512 VNNI");
            return;
        }
        let ghz = clock_ghz();
        println!("clock about {ghz:.2} GHz (dependent adds)");
        println!(
            "{:<36} {:>12} {:>14}",
            "per 8 vpdpbusd of a chain", "ns each", "cycles per 8"
        );
        for (name, fmas, cvt) in [
            ("nothing else", 0, false),
            ("conversion", 0, true),
            ("conversion + 2 FMAs", 2, true),
            ("conversion + 3 FMAs (the tile's)", 3, true),
        ] {
            let best = (0..3)
                // SAFETY: the CPU has AVX-512 F and VNNI (checked above).
                .map(|_| unsafe { run(20_000_000, fmas, cvt) })
                .fold(f64::MAX, f64::min);
            println!("{name:<36} {best:>12.4} {:>14.2}", best * ghz * 8.0);
        }
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    ports::main();
    #[cfg(not(target_arch = "x86_64"))]
    println!("x86-64 only");
}
