//! `specd bench`: decode speed, BLAS scaling, speculation.
use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// MLX matmul of 1 row vs 8 rows against a 2048x2048 float32 matrix.
    Blas {
        #[arg(long, default_value_t = 50)]
        iters: usize,
    },
}

pub fn run(cmd: BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Blas { iters } => blas(iters),
    }
}

fn blas(iters: usize) -> Result<()> {
    use specd_mlx::{ops, Array};
    let n = 2048;
    let w: Vec<f32> = (0..n * n)
        .map(|i| ((i % 97) as f32 - 48.0) / 97.0)
        .collect();
    let w = Array::from_f32(&w, &[n as i32, n as i32])?;
    w.eval()?;
    let time_rows = |rows: usize| -> Result<f64> {
        let x: Vec<f32> = (0..rows * n).map(|i| (i % 13) as f32 / 13.0).collect();
        let x = Array::from_f32(&x, &[rows as i32, n as i32])?;
        for _ in 0..3 {
            ops::matmul(&x, &w)?.eval()?;
        }
        let t = std::time::Instant::now();
        for _ in 0..iters {
            ops::matmul(&x, &w)?.eval()?;
        }
        Ok(t.elapsed().as_secs_f64() / iters as f64)
    };
    let t1 = time_rows(1)?;
    let t8 = time_rows(8)?;
    println!("blas: {}", specd_mlx::blas_config());
    println!("matmul [1x{n}]x[{n}x{n}]: {:.3} ms", t1 * 1e3);
    println!("matmul [8x{n}]x[{n}x{n}]: {:.3} ms", t8 * 1e3);
    println!("8 rows / 1 row: {:.2}x", t8 / t1);
    Ok(())
}
