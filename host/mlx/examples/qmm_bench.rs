//! Times specd's quantized matmul on the default model's shapes against
//! MLX's quantized_matmul and an fp32 matmul of the dequantized weights:
//! `cargo run --release -p specd-mlx --example qmm_bench`.
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

fn main() {
    println!("isa {} threads {}", kernels::isa(), kernels::threads());
    println!(
        "{:>12} {:>4} {:>5} {:>10} {:>10} {:>10} {:>10} {:>8}",
        "shape", "bits", "rows", "ours us", "int8 us", "mlx-q us", "f32 us", "GB/s"
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
        let packed = kernels::qpack(&w, &s, &b, 32, bits as i32).unwrap();
        for rows in [1usize, 4, 8, 16] {
            let x = Array::from_f32(&vec![0.5; rows * k], &[rows as i32, k as i32]).unwrap();
            x.eval().unwrap();
            let reps = if n > 10000 { 20 } else { 200 };
            let ours = time(reps, || {
                kernels::qmatmul_packed(&x, &packed, n as i32, 32, bits as i32).unwrap()
            });
            // The same weights with 8-bit activations (`--weights int8`).
            let int8 = time(reps, || {
                kernels::qmatmul_packed(&x, &packed, n as i32, 32, bits as i32 | 512).unwrap()
            });
            let mlxq = time(reps, || {
                ops::quantized_matmul(&x, &w, &s, &b, true, 32, bits as i32).unwrap()
            });
            let f32 = time(reps, || ops::matmul(&x, &dense).unwrap());
            let bytes = (n * k * bits / 8 + n * groups * 4) as f64;
            println!(
                "{:>12} {:>4} {:>5} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>8.1}",
                format!("{n}x{k}"),
                bits,
                rows,
                ours,
                int8,
                mlxq,
                f32,
                bytes / ours / 1e3
            );
        }
    }
}
