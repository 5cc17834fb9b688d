use anyhow::Result;
fn main() -> Result<()> {
    let path = std::env::args().nth(1).unwrap();
    let t0 = std::time::Instant::now();
    let (m, _) = specd::model::load_model(std::path::Path::new(&path))?;
    eprintln!("loaded in {:?}", t0.elapsed());
    let mut caches = m.new_caches();
    // "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n" ids unknown yet: use some ids
    let mut toks: Vec<u32> = vec![1, 4093, 198];
    let logits = m.forward(&toks, &mut caches, specd::model::Logits::Last)?;
    let mut next = specd_mlx::ops::argmax(&logits, -1, false)?.to_vec_u32()?[0];
    let t1 = std::time::Instant::now();
    for _ in 0..32 {
        toks.push(next);
        let logits = m.forward(&[next], &mut caches, specd::model::Logits::Last)?;
        next = specd_mlx::ops::argmax(&logits, -1, false)?.to_vec_u32()?[0];
    }
    eprintln!("{:?} tok/s {:.1}", toks, 32.0 / t1.elapsed().as_secs_f64());
    Ok(())
}
