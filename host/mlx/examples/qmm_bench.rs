//! Times specd's quantized matmul on the default model's shapes against
//! MLX's quantized_matmul and an fp32 matmul of the dequantized weights:
//! `cargo run --release -p specd-mlx --example qmm_bench [-- ROWS...]`
//! (row counts, 1 4 8 16 by default).
//!
//! `cold us` is our kernel with its weights read from memory, as in a
//! model's forward (whose 30 layers do not fit any cache): the calls cycle
//! through copies of the weights that together exceed the last-level
//! cache. Where it is near `ours us`, the kernel is bound by its FMAs, not
//! by memory.
use specd_mlx::kernels::Packing;
use specd_mlx::{kernels, ops, Array, Dtype};
use std::time::Instant;

/// The fastest of `3 * reps` calls, in microseconds: on a shared machine
/// the fastest call is the one nothing else interrupted.
fn time(reps: usize, f: impl Fn() -> Array) -> f64 {
    f().eval().unwrap();
    let mut best = f64::MAX;
    for _ in 0..3 * reps {
        let t = Instant::now();
        f().eval().unwrap();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best * 1e6
}

/// Bytes of weight copies the cold column cycles through: past the 32 MB
/// last-level cache of the machines measured here.
const COLD_BYTES: usize = 96 << 20;

/// The mean call over one pass through every copy, the fastest of 3
/// passes, in microseconds.
fn time_cold(copies: &[Array], f: impl Fn(&Array) -> Array) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        for w in copies {
            f(w).eval().unwrap();
        }
        best = best.min(t.elapsed().as_secs_f64() / copies.len() as f64);
    }
    best * 1e6
}

fn main() {
    let mut row_counts: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("row counts are positive integers"))
        .collect();
    if row_counts.is_empty() {
        row_counts = vec![1, 4, 8, 16];
    }
    println!("isa {} threads {}", kernels::isa(), kernels::threads());
    println!(
        "{:>12} {:>4} {:>5} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9}",
        "shape",
        "bits",
        "rows",
        "ours us",
        "cold us",
        "int8 us",
        "int8 cold",
        "mlx-q us",
        "f32 us",
        "cold GB/s"
    );
    for (n, k, bits) in [
        (1536, 576, 4),
        (576, 1536, 4),
        (576, 576, 4),
        (192, 576, 4),
        (49152, 576, 8),
    ] {
        let words = k * bits / 32;
        let groups = k / 32;
        let w: Vec<u32> = (0..n * words)
            .map(|i| (i as u32).wrapping_mul(2654435761))
            .collect();
        let w = Array::from_u32(&w, &[n as i32, words as i32]).unwrap();
        let s = Array::from_f32(&vec![0.01; n * groups], &[n as i32, groups as i32])
            .unwrap()
            .as_type(Dtype::Float16)
            .unwrap();
        let b = Array::from_f32(&vec![-0.05; n * groups], &[n as i32, groups as i32])
            .unwrap()
            .as_type(Dtype::Float16)
            .unwrap();
        specd_mlx::eval(&[&w, &s, &b]).unwrap();
        let dense = ops::dequantize(
            &w,
            &s.as_type(Dtype::Float32).unwrap(),
            &b.as_type(Dtype::Float32).unwrap(),
            32,
            bits as i32,
        )
        .unwrap()
        .t()
        .unwrap();
        dense.eval().unwrap();
        let bytes = n * k * bits / 8 + n * groups * 4;
        // Distinct copies (the same values): a copy's bytes are only in
        // cache if the cycle came round before they were evicted.
        let copies: Vec<Array> = (0..COLD_BYTES.div_ceil(bytes).max(2))
            .map(|_| {
                let p = kernels::qpack(&w, &s, &b, 32, bits as i32).unwrap();
                p.eval().unwrap();
                p
            })
            .collect();
        let packed = &copies[0];
        for &rows in &row_counts {
            let x = Array::from_f32(&vec![0.5; rows * k], &[rows as i32, k as i32]).unwrap();
            x.eval().unwrap();
            let reps = if n > 10000 { 20 } else { 200 };
            let ours = time(reps, || {
                kernels::qmatmul_packed(&x, packed, Packing::new(n as i32, 32, bits as i32))
                    .unwrap()
            });
            let cold = time_cold(&copies, |p| {
                kernels::qmatmul_packed(&x, p, Packing::new(n as i32, 32, bits as i32)).unwrap()
            });
            // The same weights with 8-bit activations (`--weights int8`).
            let int8 = time(reps, || {
                kernels::qmatmul_packed(&x, packed, Packing::new(n as i32, 32, bits as i32 | 512))
                    .unwrap()
            });
            let int8_cold = time_cold(&copies, |p| {
                kernels::qmatmul_packed(&x, p, Packing::new(n as i32, 32, bits as i32 | 512))
                    .unwrap()
            });
            let mlxq = time(reps, || {
                ops::quantized_matmul(&x, &w, &s, &b, true, 32, bits as i32).unwrap()
            });
            let f32 = time(reps, || ops::matmul(&x, &dense).unwrap());
            println!(
                "{:>12} {:>4} {:>5} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>9.1}",
                format!("{n}x{k}"),
                bits,
                rows,
                ours,
                cold,
                int8,
                int8_cold,
                mlxq,
                f32,
                bytes as f64 / cold / 1e3
            );
        }
    }
}
