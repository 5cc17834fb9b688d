//! Times specd's attention kernel alone on the default model's heads (9
//! query heads over 3 kv heads of 64): T query rows over L keys, the
//! fastest of many calls, in microseconds. One forward runs it once per
//! layer (30). `cargo run --release -p specd-mlx --example attn_bench`.
use specd_mlx::{kernels, Array};
use std::time::Instant;

fn main() {
    println!("isa {}", kernels::isa());
    println!("{:>5} {:>6} {:>10}", "rows", "keys", "us");
    for (t, l) in [
        (1, 64),
        (1, 256),
        (1, 1024),
        (4, 256),
        (8, 256),
        (8, 512),
        (8, 1024),
        (64, 64),
        (190, 190),
    ] {
        let (h, hkv, d) = (9i32, 3i32, 64i32);
        let fill = |n: i32, s: u32| -> Vec<f32> {
            (0..n as u32)
                .map(|i| ((i.wrapping_mul(2654435761) ^ s) % 2001) as f32 / 1000.0 - 1.0)
                .collect()
        };
        let q = Array::from_f32(&fill(h * t * d, 1), &[1, h, t, d]).unwrap();
        let k = Array::from_f32(&fill(hkv * l * d, 2), &[1, hkv, l, d]).unwrap();
        let v = Array::from_f32(&fill(hkv * l * d, 3), &[1, hkv, l, d]).unwrap();
        let scale = 1.0 / (d as f32).sqrt();
        let mut best = f64::MAX;
        for _ in 0..300 {
            let s = Instant::now();
            kernels::attention(&q, &k, &v, scale, true)
                .unwrap()
                .eval()
                .unwrap();
            best = best.min(s.elapsed().as_secs_f64());
        }
        println!("{t:>5} {l:>6} {:>10.1}", best * 1e6);
    }
}
