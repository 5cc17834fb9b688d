//! specd's own kernels against MLX: the quantized matmul against MLX's
//! `quantized_matmul` on the same arrays and against an fp32 matmul of the
//! dequantized weights; the attention against MLX's fused SDPA; and both for
//! batch invariance (row r of a k-row call is bitwise the 1-row call on row r).
use specd_mlx::kernels::Packing;
use specd_mlx::{fast, kernels, ops, Array, Dtype};

/// A small deterministic generator (splitmix64), so failures reproduce.
struct Gen(u64);
impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn f32s(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n)
            .map(|_| lo + (hi - lo) * (self.next() >> 40) as f32 / (1u64 << 24) as f32)
            .collect()
    }
    fn u32s(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.next() as u32).collect()
    }
}

struct QWeight {
    w: Array,
    s: Array,
    b: Array,
    group: i32,
    bits: i32,
}

/// Random packed weights with float16 scales and biases of the magnitudes a
/// GGUF Q4_1 / Q8_0 block has.
fn qweight(g: &mut Gen, n: usize, k: usize, group: i32, bits: i32) -> QWeight {
    let words = k * bits as usize / 32;
    let groups = k / group as usize;
    let w = Array::from_u32(&g.u32s(n * words), &[n as i32, words as i32]).unwrap();
    let smax = if bits == 4 { 0.01 } else { 0.0008 };
    let s = Array::from_f32(
        &g.f32s(n * groups, 0.0002, smax),
        &[n as i32, groups as i32],
    )
    .unwrap()
    .as_type(Dtype::Float16)
    .unwrap();
    let blim = if bits == 4 { 0.08 } else { 0.1 };
    let b = Array::from_f32(&g.f32s(n * groups, -blim, blim), &[n as i32, groups as i32])
        .unwrap()
        .as_type(Dtype::Float16)
        .unwrap();
    QWeight {
        w,
        s,
        b,
        group,
        bits,
    }
}

/// The weights dequantized to float32 `[n, k]` by MLX (the references).
fn dequantized(q: &QWeight) -> Array {
    ops::dequantize(
        &q.w,
        &q.s.as_type(Dtype::Float32).unwrap(),
        &q.b.as_type(Dtype::Float32).unwrap(),
        q.group,
        q.bits,
    )
    .unwrap()
}

fn ours(x: &Array, q: &QWeight) -> Vec<f32> {
    kernels::qmatmul(x, &q.w, &q.s, &q.b, q.group, q.bits)
        .unwrap()
        .to_vec_f32()
        .unwrap()
}

fn rows(x: &[f32], k: usize, r0: usize, r1: usize) -> Array {
    Array::from_f32(&x[r0 * k..r1 * k], &[(r1 - r0) as i32, k as i32]).unwrap()
}

/// Checks one shape for every row count 1..=16: within tolerance of MLX's
/// quantized matmul and of the fp32 product of the dequantized weights, and
/// each row bitwise equal to the same row computed alone.
fn check_qmatmul(n: usize, k: usize, group: i32, bits: i32, seed: u64) {
    let mut g = Gen(seed);
    let q = qweight(&mut g, n, k, group, bits);
    let dense = dequantized(&q);
    let xs = g.f32s(16 * k, -2.0, 2.0);
    let abs_dense: Vec<f32> = dense
        .to_vec_f32()
        .unwrap()
        .into_iter()
        .map(f32::abs)
        .collect();
    let abs_dense = Array::from_f32(&abs_dense, &[n as i32, k as i32]).unwrap();
    // One row at a time: the reference for the bitwise check.
    let singles: Vec<Vec<f32>> = (0..16).map(|r| ours(&rows(&xs, k, r, r + 1), &q)).collect();
    for m in 1..=16 {
        let x = rows(&xs, k, 0, m);
        let got = ours(&x, &q);
        assert_eq!(got.len(), m * n);
        let fp32 = ops::matmul(&x, &dense.t().unwrap())
            .unwrap()
            .to_vec_f32()
            .unwrap();
        let mlx = ops::quantized_matmul(&x, &q.w, &q.s, &q.b, true, group, bits)
            .unwrap()
            .to_vec_f32()
            .unwrap();
        // Error bound: float32 rounding over k terms, relative to sum |x w|.
        let xa: Vec<f32> = xs[..m * k].iter().map(|v| v.abs()).collect();
        let mag = ops::matmul(
            &Array::from_f32(&xa, &[m as i32, k as i32]).unwrap(),
            &abs_dense.t().unwrap(),
        )
        .unwrap()
        .to_vec_f32()
        .unwrap();
        for i in 0..m * n {
            let tol = 2e-6 * (k as f32).sqrt() * mag[i] + 1e-6;
            assert!(
                (got[i] - fp32[i]).abs() <= tol,
                "{n}x{k} g{group} {bits}-bit, {m} rows, [{}, {}]: ours {} fp32 {} (tol {tol})",
                i / n,
                i % n,
                got[i],
                fp32[i]
            );
            assert!(
                (got[i] - mlx[i]).abs() <= tol,
                "{n}x{k} g{group} {bits}-bit, {m} rows, [{}, {}]: ours {} mlx {} (tol {tol})",
                i / n,
                i % n,
                got[i],
                mlx[i]
            );
        }
        assert_rows_alone(&got, &singles, n, &format!("{n}x{k} g{group} {bits}-bit"));
    }
}

/// Each row of a many-row result bitwise equals the same row computed alone.
fn assert_rows_alone(got: &[f32], singles: &[Vec<f32>], n: usize, what: &str) {
    let m = got.len() / n;
    for (r, row) in got.chunks(n).enumerate() {
        assert!(
            row.iter()
                .zip(&singles[r])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: row {r} of {m} differs from the row alone"
        );
    }
}

#[test]
fn qmatmul_model_shapes_4bit() {
    // SmolLM2-135M: q/o 576x576, k/v 192x576, gate/up 1536x576, down
    // 576x1536, and the fused q/k/v (960x576) and gate/up (3072x576) the
    // loader packs.
    for (i, (n, k)) in [
        (576, 576),
        (192, 576),
        (1536, 576),
        (576, 1536),
        (960, 576),
        (3072, 576),
    ]
    .into_iter()
    .enumerate()
    {
        check_qmatmul(n, k, 32, 4, 10 + i as u64);
    }
}

#[test]
fn qrows_packed_are_the_dequantized_rows() {
    let mut g = Gen(45);
    for (n, k, group, bits) in [(70usize, 96usize, 32, 4), (37, 128, 64, 8)] {
        let q = qweight(&mut g, n, k, group, bits);
        let packed = kernels::qpack(&q.w, &q.s, &q.b, group, bits).unwrap();
        let dense = dequantized(&q).to_vec_f32().unwrap();
        let ids = [0u32, 5, (n - 1) as u32, 5, n as u32];
        let got = kernels::qrows_packed(
            &packed,
            &Array::from_u32(&ids, &[5]).unwrap(),
            Packing::new(n as i32, group, bits),
        )
        .unwrap();
        assert_eq!(got.shape(), vec![5, k as i32]);
        let got = got.to_vec_f32().unwrap();
        for (r, &id) in ids.iter().enumerate() {
            let row = &got[r * k..(r + 1) * k];
            if id as usize >= n {
                assert!(
                    row.iter().all(|&v| v == 0.0),
                    "an id past the table is a zero row"
                );
                continue;
            }
            let want = &dense[id as usize * k..(id as usize + 1) * k];
            for (a, b) in row.iter().zip(want) {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs().max(1e-3),
                    "row {id}: {a} vs {b}"
                );
            }
        }
    }
}

/// Packed weights are carved from shared 2 MB-aligned mappings (pages.cc),
/// and one too big to share gets its own: each keeps its words and its
/// products while the weights around it are freed and new ones are carved
/// (a mapping unmapped under a live weight would fault or read zeros).
#[test]
fn packed_weights_keep_their_words_as_neighbours_come_and_go() {
    let mut g = Gen(46);
    let (n, k) = (96usize, 256usize);
    let x = Array::from_f32(&g.f32s(3 * k, -1.0, 1.0), &[3, k as i32]).unwrap();
    let pack = |q: &QWeight| kernels::qpack(&q.w, &q.s, &q.b, q.group, q.bits).unwrap();
    let product = |p: &Array, n: usize, q: &QWeight| {
        kernels::qmatmul_packed(&x, p, Packing::new(n as i32, q.group, q.bits))
            .unwrap()
            .to_vec_f32()
            .unwrap()
    };
    let qs: Vec<QWeight> = (0..24).map(|_| qweight(&mut g, n, k, 32, 4)).collect();
    let mut packed: Vec<Option<Array>> = qs.iter().map(|q| Some(pack(q))).collect();
    let words: Vec<Vec<u32>> = packed
        .iter()
        .map(|p| p.as_ref().unwrap().to_vec_u32().unwrap())
        .collect();
    let ys: Vec<Vec<f32>> = packed
        .iter()
        .zip(&qs)
        .map(|(p, q)| product(p.as_ref().unwrap(), n, q))
        .collect();
    for (i, q) in qs.iter().enumerate() {
        assert_eq!(
            pack(q).to_vec_u32().unwrap(),
            words[i],
            "weight {i} packs the same twice"
        );
        assert_eq!(ys[i], ours(&x, q), "weight {i}: packed product");
    }
    for p in packed.iter_mut().step_by(2) {
        *p = None;
    }
    // 8192 x 2048 4-bit: over 8 MB packed, past what a shared chunk takes.
    let big = qweight(&mut g, 8192, 2048, 32, 4);
    let xb = Array::from_f32(&g.f32s(2 * 2048, -1.0, 1.0), &[2, 2048]).unwrap();
    let big_packed = pack(&big);
    let later_qs: Vec<QWeight> = (0..24).map(|_| qweight(&mut g, n, k, 32, 4)).collect();
    let later: Vec<Array> = later_qs.iter().map(pack).collect();
    for (i, p) in packed.iter().enumerate().skip(1).step_by(2) {
        let p = p.as_ref().unwrap();
        assert_eq!(
            p.to_vec_u32().unwrap(),
            words[i],
            "weight {i} after its neighbours went"
        );
        assert_eq!(
            product(p, n, &qs[i]),
            ys[i],
            "weight {i}: product after its neighbours went"
        );
    }
    let got = kernels::qmatmul_packed(&xb, &big_packed, Packing::new(8192, 32, 4))
        .unwrap()
        .to_vec_f32()
        .unwrap();
    assert_eq!(got, ours(&xb, &big), "the big weight's product");
    drop(packed);
    for (i, (p, q)) in later.iter().zip(&later_qs).enumerate() {
        assert_eq!(
            product(p, n, q),
            ours(&x, q),
            "later weight {i}, the first ones gone"
        );
    }
}

#[test]
fn qmatmul_head_shape_8bit() {
    // The Q8_0 embedding used as the tied head, cut to a slice of the vocab
    // (the full 49152 rows cost minutes in the fp32 reference), plus a row
    // count that is not a multiple of the thread split.
    check_qmatmul(4099, 576, 32, 8, 20);
}

#[test]
fn qmatmul_odd_shapes_and_groups() {
    for (i, (n, k, group, bits)) in [
        (1, 32, 32, 4),
        (7, 96, 32, 4),
        (13, 160, 32, 8),
        (77, 128, 64, 4),
        (33, 192, 64, 8),
        (5, 256, 128, 4),
    ]
    .into_iter()
    .enumerate()
    {
        check_qmatmul(n, k, group, bits, 30 + i as u64);
    }
}

#[test]
fn qmatmul_batched_leading_axes_and_errors() {
    let mut g = Gen(40);
    let q = qweight(&mut g, 64, 96, 32, 4);
    let xs = g.f32s(2 * 3 * 96, -1.0, 1.0);
    let x3 = Array::from_f32(&xs, &[2, 3, 96]).unwrap();
    let y = kernels::qmatmul(&x3, &q.w, &q.s, &q.b, 32, 4).unwrap();
    assert_eq!(y.shape(), vec![2, 3, 64]);
    assert_eq!(y.to_vec_f32().unwrap(), ours(&rows(&xs, 96, 0, 6), &q));
    // Strided inputs are read in place: a transposed view (column stride 6)
    // and a column slice (row stride 192) give the same bits.
    let dense6 = ours(&rows(&xs, 96, 0, 6), &q);
    let mut transposed = vec![0f32; 6 * 96];
    for r in 0..6 {
        for c in 0..96 {
            transposed[c * 6 + r] = xs[r * 96 + c];
        }
    }
    let xt = Array::from_f32(&transposed, &[96, 6]).unwrap().t().unwrap();
    assert_eq!(ours(&xt, &q), dense6);
    let mut wide = vec![0f32; 6 * 192];
    for r in 0..6 {
        wide[r * 192 + 50..r * 192 + 146].copy_from_slice(&xs[r * 96..(r + 1) * 96]);
    }
    let xw = Array::from_f32(&wide, &[6, 192])
        .unwrap()
        .slice(&[0, 50], &[6, 146])
        .unwrap();
    assert_eq!(ours(&xw, &q), dense6);
    let bad = Array::from_f32(&xs[..95], &[1, 95]).unwrap();
    assert!(kernels::qmatmul(&bad, &q.w, &q.s, &q.b, 32, 4).is_err());
    assert!(kernels::qmatmul(&x3, &q.w, &q.s, &q.b, 32, 3).is_err());
    let s32 = q.s.as_type(Dtype::Float32).unwrap();
    assert!(kernels::qmatmul(&x3, &q.w, &s32, &q.b, 32, 4).is_err());

    // Packed once: the same bits, and the residual folded in rounds exactly
    // as a separate add (odd N: a partial last column block).
    let q = qweight(&mut g, 70, 96, 32, 4);
    let packed = kernels::qpack(&q.w, &q.s, &q.b, 32, 4).unwrap();
    let y = kernels::qmatmul_packed(&x3, &packed, Packing::new(70, 32, 4)).unwrap();
    assert_eq!(
        y.to_vec_f32().unwrap(),
        kernels::qmatmul(&x3, &q.w, &q.s, &q.b, 32, 4)
            .unwrap()
            .to_vec_f32()
            .unwrap()
    );
    let r = Array::from_f32(&g.f32s(6 * 70, -3.0, 3.0), &[2, 3, 70]).unwrap();
    let fused = kernels::qmatmul_packed_add(&x3, &packed, Packing::new(70, 32, 4), &r).unwrap();
    let apart = ops::add(&r, &y).unwrap();
    assert_eq!(
        fused.to_vec_f32().unwrap(),
        apart.to_vec_f32().unwrap(),
        "fused residual"
    );
    assert!(kernels::qmatmul_packed_add(&x3, &packed, Packing::new(70, 32, 4), &x3).is_err());
    // The gated unit folded in (x holds gate and up side by side): the bits
    // of the swiglu / geglu op, then the matmul with its residual, at 1, 3
    // and 6 rows, 4-bit and 8-bit activations (the fold comes before the
    // rows are quantized).
    for act in [0, ACT_Q8] {
        for t in [1usize, 3, 6] {
            let gu_v = g.f32s(t * 192, -4.0, 4.0);
            let gu = Array::from_f32(&gu_v, &[1, t as i32, 192]).unwrap();
            let gate = gu.slice(&[0, 0, 0], &[1, t as i32, 96]).unwrap();
            let up = gu.slice(&[0, 0, 96], &[1, t as i32, 192]).unwrap();
            let r = Array::from_f32(&g.f32s(t * 70, -3.0, 3.0), &[1, t as i32, 70]).unwrap();
            for gelu in [false, true] {
                let h = if gelu {
                    kernels::geglu(&gate, &up)
                } else {
                    kernels::swiglu(&gate, &up)
                }
                .unwrap();
                let apart =
                    kernels::qmatmul_packed_add(&h, &packed, Packing::new(70, 32, 4 | act), &r)
                        .unwrap();
                let fused = kernels::qmatmul_packed_glu_add(
                    &gu,
                    &packed,
                    Packing::new(70, 32, 4 | act),
                    &r,
                    gelu,
                )
                .unwrap();
                assert_eq!(
                    fused.to_vec_f32().unwrap(),
                    apart.to_vec_f32().unwrap(),
                    "glu folded into the matmul: {t} rows, gelu {gelu}, act {act}"
                );
                // Without the residual (Gemma's post-MLP norm sits between).
                let apart =
                    kernels::qmatmul_packed(&h, &packed, Packing::new(70, 32, 4 | act)).unwrap();
                let fused =
                    kernels::qmatmul_packed_glu(&gu, &packed, Packing::new(70, 32, 4 | act), gelu)
                        .unwrap();
                assert_eq!(
                    fused.to_vec_f32().unwrap(),
                    apart.to_vec_f32().unwrap(),
                    "glu folded into the matmul, no residual: {t} rows, gelu {gelu}, act {act}"
                );
            }
        }
    }
    // A gated input is twice the weight's features.
    assert!(
        kernels::qmatmul_packed_glu_add(&x3, &packed, Packing::new(70, 32, 4), &r, false).is_err()
    );
    assert!(kernels::qmatmul_packed_glu(&x3, &packed, Packing::new(70, 32, 4), false).is_err());
    // The RMS norm folded in rounds exactly as the norm op, strided x too.
    let nw = Array::from_f32(&g.f32s(96, 0.5, 1.5), &[96]).unwrap();
    for x in [&x3, &xw] {
        let fused =
            kernels::qmatmul_packed_norm(x, &nw, 1e-5, &packed, Packing::new(70, 32, 4)).unwrap();
        let apart = kernels::qmatmul_packed(
            &kernels::rms_norm(x, &nw, 1e-5).unwrap(),
            &packed,
            Packing::new(70, 32, 4),
        )
        .unwrap();
        assert_eq!(
            fused.to_vec_f32().unwrap(),
            apart.to_vec_f32().unwrap(),
            "fused norm"
        );
    }
    assert!(
        kernels::qmatmul_packed_norm(&x3, &x3, 1e-5, &packed, Packing::new(70, 32, 4)).is_err()
    );

    // The rope folded in rotates the leading heads exactly as rope_heads
    // does (2 heads of 16 over columns 0..32, 3 positions from 7).
    let x13 = Array::from_f32(&xs[..3 * 96], &[1, 3, 96]).unwrap();
    let rope = kernels::RopeSpec {
        cols: 32,
        head_dim: 16,
        traditional: false,
        base: 10000.0,
        offset: 7,
        factors: &[],
    };
    let fused =
        kernels::qmatmul_packed_norm_rope(&x13, &nw, 1e-5, &packed, Packing::new(70, 32, 4), rope)
            .unwrap()
            .to_vec_f32()
            .unwrap();
    let plain =
        kernels::qmatmul_packed_norm(&x13, &nw, 1e-5, &packed, Packing::new(70, 32, 4)).unwrap();
    let heads = plain
        .slice(&[0, 0, 0], &[1, 3, 32])
        .unwrap()
        .reshape(&[1, 3, 2, 16])
        .unwrap();
    let roped = kernels::rope_heads(&heads, 16, false, 10000.0, 1.0, 7, &[])
        .unwrap()
        .to_vec_f32()
        .unwrap(); // [1, 2, 3, 16]
    let plain = plain.to_vec_f32().unwrap();
    for t in 0..3 {
        for c in 0..70 {
            let want = if c < 32 {
                roped[(c / 16 * 3 + t) * 16 + c % 16]
            } else {
                plain[t * 70 + c]
            };
            assert_eq!(
                fused[t * 70 + c].to_bits(),
                want.to_bits(),
                "row {t} col {c}"
            );
        }
    }
    let bad = kernels::RopeSpec { cols: 24, ..rope };
    assert!(kernels::qmatmul_packed_norm_rope(
        &x13,
        &nw,
        1e-5,
        &packed,
        Packing::new(70, 32, 4),
        bad
    )
    .is_err());
    assert!(kernels::qmatmul_packed(&x3, &packed, Packing::new(81, 32, 4)).is_err());
    assert!(kernels::qmatmul_packed(&x3, &packed, Packing::new(70, 64, 4)).is_err());
}

/// `[1, h, t, d]` from a flat buffer.
fn heads(v: &[f32], h: usize, t: usize, d: usize) -> Array {
    Array::from_f32(v, &[1, h as i32, t as i32, d as i32]).unwrap()
}

#[test]
fn attention_matches_sdpa_and_is_row_invariant() {
    let mut g = Gen(50);
    // 9 query heads over 3 kv heads of 64, as the default model; 4 over 1
    // of 256, as Gemma 3 270M (the wide grouped path).
    for (h, hkv, d, len) in [
        (9usize, 3usize, 64usize, 1usize),
        (9, 3, 64, 7),
        (9, 3, 64, 40),
        (9, 3, 64, 300),
        (4, 1, 256, 1),
        (4, 1, 256, 40),
        (4, 1, 256, 300),
    ] {
        let kv_len = len + 16;
        let k = heads(&g.f32s(hkv * kv_len * d, -1.0, 1.0), hkv, kv_len, d);
        let v = heads(&g.f32s(hkv * kv_len * d, -1.0, 1.0), hkv, kv_len, d);
        let qs = g.f32s(h * 16 * d, -1.5, 1.5);
        let scale = 1.0 / (d as f32).sqrt();
        let q16 = heads(&qs, h, 16, d);
        // Query index i of 16 sits at position kv_len - 16 + i and sees keys
        // 0..=that position.
        let q_at = |i0: usize, i1: usize| -> Array {
            q16.slice(&[0, 0, i0 as i32, 0], &[1, h as i32, i1 as i32, d as i32])
                .unwrap()
        };
        let keys_to = |a: &Array, n: usize| -> Array {
            a.slice(&[0, 0, 0, 0], &[1, hkv as i32, n as i32, d as i32])
                .unwrap()
        };
        // Output is heads last, [1, T, H, D]: row r is one slice.
        let row =
            |y: &[f32], _t: usize, r: usize| -> Vec<f32> { y[r * h * d..(r + 1) * h * d].to_vec() };
        let singles: Vec<Vec<f32>> = (0..16)
            .map(|i| {
                let n = kv_len - 16 + i + 1;
                let y = kernels::attention(
                    &q_at(i, i + 1),
                    &keys_to(&k, n),
                    &keys_to(&v, n),
                    scale,
                    true,
                )
                .unwrap()
                .to_vec_f32()
                .unwrap();
                row(&y, 1, 0)
            })
            .collect();
        for t in 1..=16usize {
            // The last t positions as one causal call over all keys.
            let q = q_at(16 - t, 16);
            let got = kernels::attention(&q, &k, &v, scale, true).unwrap();
            assert_eq!(got.shape(), vec![1, t as i32, h as i32, d as i32]);
            let got = got.to_vec_f32().unwrap();
            let mask = if t > 1 {
                fast::Mask::Causal
            } else {
                fast::Mask::None
            };
            let want = fast::scaled_dot_product_attention(&q, &k, &v, scale, mask)
                .unwrap()
                .transpose(&[0, 2, 1, 3])
                .unwrap()
                .to_vec_f32()
                .unwrap();
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() < 2e-5,
                    "d {d} len {len} t {t} [{i}]: {a} vs {b}"
                );
            }
            for r in 0..t {
                assert!(
                    row(&got, t, r)
                        .iter()
                        .zip(&singles[16 - t + r])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "d {d} len {len}: row {r} of {t} differs from the same query alone"
                );
            }
        }
    }
}

/// At the AVX2 level the grouped attention (contiguous rows: the query
/// heads of a kv head share each key and value load) runs the float
/// operations of the per-head path (taken when q's elements are not
/// adjacent), so the two are bitwise equal. The AVX-512 grouped kernel sums
/// in 16 lanes: there the two agree to rounding. `make test` runs this file
/// with `SPECD_KERNEL_ISA=avx2` too, so an AVX-512 machine checks the AVX2
/// kernels as well.
#[test]
fn grouped_attention_is_the_per_head_path() {
    let mut g = Gen(70);
    for (h, hkv, d, t, len) in [
        (9usize, 3usize, 64usize, 1usize, 1usize),
        (9, 3, 64, 5, 40),
        (9, 3, 64, 9, 301),
        (4, 1, 256, 3, 40),
        (8, 2, 128, 2, 77),
        (6, 6, 64, 4, 20),
    ] {
        let k = heads(&g.f32s(hkv * len * d, -1.0, 1.0), hkv, len, d);
        let v = heads(&g.f32s(hkv * len * d, -1.0, 1.0), hkv, len, d);
        let qs = g.f32s(h * t * d, -1.5, 1.5);
        let q = heads(&qs, h, t, d);
        // The same values stored [1, h, d, t] and viewed as [1, h, t, d]:
        // a column stride of t, so the per-head path reads it.
        let mut qt = vec![0f32; qs.len()];
        for hh in 0..h {
            for i in 0..t {
                for j in 0..d {
                    qt[(hh * d + j) * t + i] = qs[(hh * t + i) * d + j];
                }
            }
        }
        let q_strided = Array::from_f32(&qt, &[1, h as i32, d as i32, t as i32])
            .unwrap()
            .transpose(&[0, 1, 3, 2])
            .unwrap();
        let scale = 1.0 / (d as f32).sqrt();
        let grouped = kernels::attention(&q, &k, &v, scale, true)
            .unwrap()
            .to_vec_f32()
            .unwrap();
        let per_head = kernels::attention(&q_strided, &k, &v, scale, true)
            .unwrap()
            .to_vec_f32()
            .unwrap();
        let what = format!("h {h} / {hkv}, d {d}, {t} rows over {len} keys");
        if kernels::isa() == "avx512" {
            for (a, b) in grouped.iter().zip(&per_head) {
                assert!((a - b).abs() < 1e-5, "{what}: {a} vs {b}");
            }
        } else {
            assert!(
                grouped
                    .iter()
                    .zip(&per_head)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: the grouped attention differs from the per-head path"
            );
        }
    }
}

#[test]
fn attention_reads_cache_slices_in_place() {
    // Keys as a slice of a larger buffer (what the KV cache hands over).
    let mut g = Gen(60);
    let (h, d, cap, len) = (2usize, 64usize, 64usize, 37usize);
    let kbuf = heads(&g.f32s(h * cap * d, -1.0, 1.0), h, cap, d);
    let vbuf = heads(&g.f32s(h * cap * d, -1.0, 1.0), h, cap, d);
    let end = [1, h as i32, len as i32, d as i32];
    let k = kbuf.slice(&[0, 0, 0, 0], &end).unwrap();
    let v = vbuf.slice(&[0, 0, 0, 0], &end).unwrap();
    let q = heads(&g.f32s(h * 3 * d, -1.0, 1.0), h, 3, d);
    let got = kernels::attention(&q, &k, &v, 0.125, true)
        .unwrap()
        .to_vec_f32()
        .unwrap();
    let want = kernels::attention(
        &q,
        &k.contiguous().unwrap(),
        &v.contiguous().unwrap(),
        0.125,
        true,
    )
    .unwrap()
    .to_vec_f32()
    .unwrap();
    assert_eq!(got, want);
    assert!(kernels::attention(
        &q,
        &k.slice(&[0, 0, 0, 0], &[1, h as i32, 2, d as i32]).unwrap(),
        &v,
        0.1,
        true
    )
    .is_err());
}

/// Soft-capped attention (Gemma 2's `attn_logit_softcapping`) against a
/// float64 reference of `softmax(cap tanh(scale q.k / cap)) v`, causal;
/// each row of a many-row call bitwise the row alone; at the AVX2 level the
/// grouped kernel bitwise the per-head path, as uncapped; cap 0 bitwise the
/// plain attention. A cap of 1 moves the output far beyond the bound, so
/// an ignored cap fails.
#[test]
fn softcapped_attention_matches_its_formula() {
    let mut g = Gen(80);
    for (h, hkv, d, t, len) in [
        (8usize, 4usize, 256usize, 5usize, 40usize),
        (9, 3, 64, 7, 33),
        (4, 1, 128, 3, 9),
        (2, 2, 16, 4, 12),
    ] {
        let (kf, vf, qf) = (
            g.f32s(hkv * len * d, -1.0, 1.0),
            g.f32s(hkv * len * d, -1.0, 1.0),
            g.f32s(h * t * d, -1.5, 1.5),
        );
        let (k, v, q) = (
            heads(&kf, hkv, len, d),
            heads(&vf, hkv, len, d),
            heads(&qf, h, t, d),
        );
        let (scale, cap) = (1.0 / (d as f32).sqrt(), 1.0f32);
        let what = format!("h {h} / {hkv}, d {d}, {t} rows over {len} keys");
        let capped = |q: &Array, cap: f32| {
            kernels::attention_capped(q, &k, &v, scale, true, cap)
                .unwrap()
                .to_vec_f32()
                .unwrap()
        };
        let got = capped(&q, cap);
        // Reference: output [t, h, d], heads last.
        let mut want = vec![0f64; t * h * d];
        for hh in 0..h {
            let kvh = hh / (h / hkv);
            for r in 0..t {
                let n = len - t + r + 1;
                let qr = &qf[(hh * t + r) * d..(hh * t + r + 1) * d];
                let s: Vec<f64> = (0..n)
                    .map(|j| {
                        let kr = &kf[(kvh * len + j) * d..(kvh * len + j + 1) * d];
                        let dot: f64 = qr.iter().zip(kr).map(|(a, b)| *a as f64 * *b as f64).sum();
                        cap as f64 * (dot * scale as f64 / cap as f64).tanh()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (j, p) in e.iter().enumerate() {
                    for c in 0..d {
                        want[(r * h + hh) * d + c] += p / sum * vf[(kvh * len + j) * d + c] as f64;
                    }
                }
            }
        }
        let err = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (*a as f64 - b).abs())
            .fold(0.0, f64::max);
        assert!(err < 2e-5, "{what}: max |diff| {err}");
        let plain = kernels::attention(&q, &k, &v, scale, true)
            .unwrap()
            .to_vec_f32()
            .unwrap();
        let moved = plain
            .iter()
            .zip(&want)
            .map(|(a, b)| (*a as f64 - b).abs())
            .fold(0.0, f64::max);
        assert!(
            moved > 1e-3,
            "{what}: the cap moved the output by {moved} only"
        );
        assert_eq!(
            capped(&q, 0.0)
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>(),
            plain.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{what}: cap 0 is the plain attention"
        );
        // Row r of the t-row call is the row alone, over its own keys.
        for r in 0..t {
            let n = (len - t + r + 1) as i32;
            let keys = |a: &Array| {
                a.slice(&[0, 0, 0, 0], &[1, hkv as i32, n, d as i32])
                    .unwrap()
            };
            let qr = q
                .slice(&[0, 0, r as i32, 0], &[1, h as i32, r as i32 + 1, d as i32])
                .unwrap();
            let alone = kernels::attention_capped(&qr, &keys(&k), &keys(&v), scale, true, cap)
                .unwrap()
                .to_vec_f32()
                .unwrap();
            assert!(
                alone
                    .iter()
                    .zip(&got[r * h * d..(r + 1) * h * d])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: row {r} differs from the row alone"
            );
        }
        // q viewed with a column stride: the per-head path.
        let mut qt = vec![0f32; qf.len()];
        for hh in 0..h {
            for i in 0..t {
                for j in 0..d {
                    qt[(hh * d + j) * t + i] = qf[(hh * t + i) * d + j];
                }
            }
        }
        let q_strided = Array::from_f32(&qt, &[1, h as i32, d as i32, t as i32])
            .unwrap()
            .transpose(&[0, 1, 3, 2])
            .unwrap();
        let per_head = capped(&q_strided, cap);
        if kernels::isa() == "avx512" {
            for (a, b) in got.iter().zip(&per_head) {
                assert!((a - b).abs() < 1e-5, "{what}: {a} vs {b}");
            }
        } else {
            assert!(
                got.iter()
                    .zip(&per_head)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: the grouped attention differs from the per-head path"
            );
        }
    }
}

/// Rows of a `[rows, d]` result computed alone are bitwise the same rows of
/// a batched call.
fn assert_row_invariant(name: &str, rows: usize, d: usize, f: impl Fn(usize, usize) -> Vec<f32>) {
    let all = f(0, rows);
    for r in 0..rows {
        let one = f(r, r + 1);
        assert!(
            all[r * d..(r + 1) * d]
                .iter()
                .zip(&one)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: row {r} of {rows} differs from the row alone"
        );
    }
}

#[test]
fn rms_norm_matches_mlx_and_is_row_invariant() {
    let mut g = Gen(70);
    for d in [576usize, 64, 33] {
        let xs = g.f32s(16 * d, -3.0, 3.0);
        let w = Array::from_f32(&g.f32s(d, 0.5, 1.5), &[d as i32]).unwrap();
        let x = Array::from_f32(&xs, &[1, 16, d as i32]).unwrap();
        let got = kernels::rms_norm(&x, &w, 1e-5)
            .unwrap()
            .to_vec_f32()
            .unwrap();
        let want = fast::rms_norm(&x, &w, 1e-5).unwrap().to_vec_f32().unwrap();
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
        }
        assert_row_invariant("rms_norm", 16, d, |r0, r1| {
            let x = Array::from_f32(&xs[r0 * d..r1 * d], &[1, (r1 - r0) as i32, d as i32]).unwrap();
            kernels::rms_norm(&x, &w, 1e-5)
                .unwrap()
                .to_vec_f32()
                .unwrap()
        });
    }
    let x = Array::from_f32(&[1.0; 8], &[2, 4]).unwrap();
    let w = Array::from_f32(&[1.0; 3], &[3]).unwrap();
    assert!(kernels::rms_norm(&x, &w, 1e-5).is_err());
}

#[test]
fn rope_frequency_factors_match_mlx() {
    // Divisors as Llama 3's scaling makes them: 1 at high frequencies, 8 at
    // low ones, others in between. Specd's op against MLX's rope with
    // periods, and against no factors (they must bite).
    let (h, d) = (2usize, 16usize);
    let factors: Vec<f32> = (0..d / 2)
        .map(|i| match i {
            0..=2 => 1.0,
            3..=4 => 2.5 + i as f32,
            _ => 8.0,
        })
        .collect();
    let mut g = Gen(81);
    let xs = g.f32s(4 * h * d, -2.0, 2.0);
    let x = Array::from_f32(&xs, &[1, 4, h as i32, d as i32]).unwrap();
    for traditional in [true, false] {
        let got = kernels::rope_heads(&x, d as i32, traditional, 500000.0, 1.0, 300, &factors)
            .unwrap()
            .to_vec_f32()
            .unwrap();
        let xt = x.transpose(&[0, 2, 1, 3]).unwrap();
        let want = fast::rope(&xt, d as i32, traditional, 500000.0, 1.0, 300, &factors)
            .unwrap()
            .to_vec_f32()
            .unwrap();
        let plain = fast::rope(&xt, d as i32, traditional, 500000.0, 1.0, 300, &[])
            .unwrap()
            .to_vec_f32()
            .unwrap();
        let max = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max)
        };
        assert!(max(&got, &want) < 1e-4, "{}", max(&got, &want));
        assert!(max(&got, &plain) > 0.1, "the factors changed nothing");
    }
    let bad = kernels::rope_heads(&x, d as i32, false, 1e4, 1.0, 0, &factors[..3]);
    assert!(bad.is_err());
}

#[test]
fn rope_matches_mlx_at_every_offset_and_is_row_invariant() {
    let mut g = Gen(80);
    let (h, d) = (3usize, 64usize);
    for traditional in [true, false] {
        for offset in [0, 1, 37, 1000, 8000] {
            let xs = g.f32s(16 * h * d, -2.0, 2.0);
            let x = Array::from_f32(&xs, &[1, 16, h as i32, d as i32]).unwrap();
            let got =
                kernels::rope_heads(&x, d as i32, traditional, 10000.0, 1.0, offset, &[]).unwrap();
            assert_eq!(got.shape(), vec![1, h as i32, 16, d as i32]);
            let got = got.to_vec_f32().unwrap();
            let want = fast::rope(
                &x.transpose(&[0, 2, 1, 3]).unwrap(),
                d as i32,
                traditional,
                10000.0,
                1.0,
                offset,
                &[],
            )
            .unwrap()
            .to_vec_f32()
            .unwrap();
            // Angles up to ~8000 rad: float32 rounding of the angle itself
            // dominates, as in MLX.
            let tol = if offset > 100 { 2e-3 } else { 2e-5 };
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= tol,
                    "trad {traditional} offset {offset} [{i}]: {a} vs {b}"
                );
            }
            // Row t of 16 at offset equals the single row at offset + t.
            for t in 0..16usize {
                let one =
                    Array::from_f32(&xs[t * h * d..(t + 1) * h * d], &[1, 1, h as i32, d as i32])
                        .unwrap();
                let one = kernels::rope_heads(
                    &one,
                    d as i32,
                    traditional,
                    10000.0,
                    1.0,
                    offset + t as i32,
                    &[],
                )
                .unwrap()
                .to_vec_f32()
                .unwrap();
                for hh in 0..h {
                    let row = &got[(hh * 16 + t) * d..(hh * 16 + t + 1) * d];
                    assert!(
                        row.iter()
                            .zip(&one[hh * d..(hh + 1) * d])
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "rope row {t} head {hh} differs from the row alone"
                    );
                }
            }
        }
    }
}

#[test]
fn swiglu_matches_silu_times_up() {
    let mut g = Gen(90);
    let n = 3 * 1536;
    let gs = Array::from_f32(&g.f32s(n, -8.0, 8.0), &[1, 3, 1536]).unwrap();
    let us = Array::from_f32(&g.f32s(n, -2.0, 2.0), &[1, 3, 1536]).unwrap();
    let got = kernels::swiglu(&gs, &us).unwrap().to_vec_f32().unwrap();
    let want = ops::multiply(&ops::silu(&gs).unwrap(), &us)
        .unwrap()
        .to_vec_f32()
        .unwrap();
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
    }
    let short = Array::from_f32(&[1.0; 4], &[1, 4]).unwrap();
    assert!(kernels::swiglu(&gs, &short).is_err());
}

#[test]
fn geglu_matches_gelu_tanh_times_up() {
    let mut g = Gen(91);
    // A row length that leaves a tail past the 8-lane loop.
    let d = 2051;
    let n = 3 * d;
    let gs = Array::from_f32(&g.f32s(n, -12.0, 12.0), &[1, 3, d as i32]).unwrap();
    let us = Array::from_f32(&g.f32s(n, -2.0, 2.0), &[1, 3, d as i32]).unwrap();
    let got = kernels::geglu(&gs, &us).unwrap().to_vec_f32().unwrap();
    // gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), in f64.
    let (gv, uv) = (gs.to_vec_f32().unwrap(), us.to_vec_f32().unwrap());
    for i in 0..n {
        let x = gv[i] as f64;
        let want = 0.5
            * x
            * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
            * uv[i] as f64;
        let a = got[i] as f64;
        assert!(
            (a - want).abs() <= 2e-6 * want.abs().max(1.0),
            "at {i}: {a} vs {want} (g {x})"
        );
    }
    // Row by row: a row alone gives bitwise the same values.
    let row = gs.slice(&[0, 1, 0], &[1, 2, d as i32]).unwrap();
    let urow = us.slice(&[0, 1, 0], &[1, 2, d as i32]).unwrap();
    let alone = kernels::geglu(&row, &urow).unwrap().to_vec_f32().unwrap();
    assert!(alone
        .iter()
        .zip(&got[d..2 * d])
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    let short = Array::from_f32(&[1.0; 4], &[1, 4]).unwrap();
    assert!(kernels::geglu(&gs, &short).is_err());
}

#[test]
fn kernel_config_is_reported() {
    assert!(kernels::threads() >= 1);
    assert!(["avx512", "avx2", "scalar"].contains(&kernels::isa().as_str()));
}

/// The float32-scale layout (GGUF K-quants: `bits | 256`) and groups of 16
/// (Q6_K): against an fp32 product of the weights dequantized here, rows
/// bitwise equal to the row alone, and embedding rows equal to `s * q + b`.
#[test]
fn qmatmul_float32_scales_and_groups_of_16() {
    for (i, (n, k, group, bits)) in [
        (40, 256, 16, 8),
        (33, 96, 16, 4),
        (21, 128, 32, 4),
        (17, 64, 32, 8),
    ]
    .into_iter()
    .enumerate()
    {
        let mut g = Gen(70 + i as u64);
        let words = k * bits as usize / 32;
        let groups = k / group as usize;
        let wv = g.u32s(n * words);
        // Scales with more significant bits than float16 holds (d * sc).
        let sv: Vec<f32> = g
            .f32s(n * groups, 0.0002, 0.01)
            .iter()
            .map(|s| s * 1.000_123)
            .collect();
        let bv = g.f32s(n * groups, -0.1, 0.1);
        let w = Array::from_u32(&wv, &[n as i32, words as i32]).unwrap();
        let s = Array::from_f32(&sv, &[n as i32, groups as i32]).unwrap();
        let b = Array::from_f32(&bv, &[n as i32, groups as i32]).unwrap();
        let per = 32 / bits as usize;
        let mask = (1u32 << bits) - 1;
        let dense: Vec<f32> = (0..n * k)
            .map(|e| {
                let (r, c) = (e / k, e % k);
                let q = (wv[r * words + c / per] >> ((c % per) as u32 * bits as u32)) & mask;
                let gi = r * groups + c / group as usize;
                sv[gi] * q as f32 + bv[gi]
            })
            .collect();
        let packed = kernels::qpack(&w, &s, &b, group, bits).unwrap();
        let flag = bits | 256;
        let ids = Array::from_u32(&(0..n as u32).collect::<Vec<_>>(), &[n as i32]).unwrap();
        let back = kernels::qrows_packed(&packed, &ids, Packing::new(n as i32, group, flag))
            .unwrap()
            .to_vec_f32()
            .unwrap();
        assert_eq!(back, dense, "{n}x{k} g{group} {bits}-bit: packed rows");
        let dense_a = Array::from_f32(&dense, &[n as i32, k as i32]).unwrap();
        // 40 rows: past kernels' panel threshold (qmm.h kPanelRows), so every
        // row of the many-row path is checked against the row alone.
        let m = 40;
        let xs = g.f32s(m * k, -2.0, 2.0);
        let single: Vec<Vec<f32>> = (0..m)
            .map(|r| {
                kernels::qmatmul_packed(
                    &rows(&xs, k, r, r + 1),
                    &packed,
                    Packing::new(n as i32, group, flag),
                )
                .unwrap()
                .to_vec_f32()
                .unwrap()
            })
            .collect();
        let x = rows(&xs, k, 0, m);
        let got = kernels::qmatmul_packed(&x, &packed, Packing::new(n as i32, group, flag))
            .unwrap()
            .to_vec_f32()
            .unwrap();
        // The unpacked entry point packs with the same layout.
        assert_eq!(
            ours(
                &x,
                &QWeight {
                    w: w.clone(),
                    s: s.clone(),
                    b: b.clone(),
                    group,
                    bits
                }
            ),
            got
        );
        let fp32 = ops::matmul(&x, &dense_a.t().unwrap())
            .unwrap()
            .to_vec_f32()
            .unwrap();
        for (j, (a, e)) in got.iter().zip(&fp32).enumerate() {
            assert!(
                (a - e).abs() <= 1e-4 * (1.0 + e.abs()),
                "{n}x{k} g{group}: [{j}] {a} vs {e}"
            );
        }
        for r in 0..m {
            assert_eq!(
                got[r * n..(r + 1) * n],
                single[r][..],
                "row {r} differs from the row alone"
            );
        }
        // The wrong flag is a clear error, not a misread.
        assert!(kernels::qmatmul_packed(&x, &packed, Packing::new(n as i32, group, bits)).is_err());
    }
}

/// One sequence's data for the fused attention over per-sequence caches.
struct KvSeq {
    off: usize,
    rows: usize,
    old_k: Vec<f32>, // [hkv, off, d]
    old_v: Vec<f32>,
    q: Vec<f32>, // [rows, h, d]
    k: Vec<f32>, // [rows, hkv, d]
    v: Vec<f32>,
}

fn attn_shape(heads: i32, kv_heads: i32, head_dim: i32, scale: f32) -> kernels::AttnShape {
    kernels::AttnShape {
        heads,
        kv_heads,
        head_dim,
        scale,
    }
}

/// `kernels::attention_kv_rows` over several sequences, each at its own
/// offset, against `kernels::attention` of each sequence alone on its
/// concatenated keys: bitwise, whichever sequences share the call. Run for
/// the default model's heads (the grouped AVX-512 path) and an odd head size
/// (the per-row path).
#[test]
fn attention_kv_rows_is_each_sequence_alone() {
    for (h, hkv, d) in [(9usize, 3usize, 64usize), (4, 2, 24)] {
        let mut g = Gen(70 + d as u64);
        let shape = [(0usize, 3usize), (5, 1), (300, 4), (17, 2)];
        let seqs: Vec<KvSeq> = shape
            .iter()
            .map(|&(off, rows)| KvSeq {
                off,
                rows,
                old_k: g.f32s(hkv * off * d, -1.0, 1.0),
                old_v: g.f32s(hkv * off * d, -1.0, 1.0),
                q: g.f32s(rows * h * d, -1.5, 1.5),
                k: g.f32s(rows * hkv * d, -1.0, 1.0),
                v: g.f32s(rows * hkv * d, -1.0, 1.0),
            })
            .collect();
        let scale = 1.0 / (d as f32).sqrt();
        // Each sequence's keys and values after its new rows, [hkv, off + rows, d].
        let full = |s: &KvSeq, old: &[f32], new: &[f32]| -> Vec<f32> {
            let n = s.off + s.rows;
            let mut out = vec![0.0; hkv * n * d];
            for hh in 0..hkv {
                for j in 0..n {
                    let src = if j < s.off {
                        &old[(hh * s.off + j) * d..][..d]
                    } else {
                        &new[((j - s.off) * hkv + hh) * d..][..d]
                    };
                    out[(hh * n + j) * d..][..d].copy_from_slice(src);
                }
            }
            out
        };
        // Reference: each sequence alone through the plain attention kernel.
        let want: Vec<Vec<f32>> = seqs
            .iter()
            .map(|s| {
                let n = (s.off + s.rows) as i32;
                let kv = |o: &[f32], x: &[f32]| {
                    Array::from_f32(&full(s, o, x), &[1, hkv as i32, n, d as i32]).unwrap()
                };
                let q = Array::from_f32(&s.q, &[1, s.rows as i32, h as i32, d as i32])
                    .unwrap()
                    .transpose(&[0, 2, 1, 3])
                    .unwrap();
                kernels::attention(&q, &kv(&s.old_k, &s.k), &kv(&s.old_v, &s.v), scale, true)
                    .unwrap()
                    .to_vec_f32()
                    .unwrap()
            })
            .collect();
        // The step's rows: q, k, v of each row side by side.
        let run = |which: &[usize]| -> (Vec<f32>, Vec<(Array, Array)>) {
            let mut y = Vec::new();
            for &i in which {
                let s = &seqs[i];
                for r in 0..s.rows {
                    y.extend_from_slice(&s.q[r * h * d..][..h * d]);
                    y.extend_from_slice(&s.k[r * hkv * d..][..hkv * d]);
                    y.extend_from_slice(&s.v[r * hkv * d..][..hkv * d]);
                }
            }
            let t: usize = which.iter().map(|&i| seqs[i].rows).sum();
            let y = Array::from_f32(&y, &[1, t as i32, ((h + 2 * hkv) * d) as i32]).unwrap();
            let bufs: Vec<(Array, Array)> = which
                .iter()
                .map(|&i| {
                    let s = &seqs[i];
                    let cap = (s.off + s.rows).div_ceil(256) as i32 * 256;
                    let alloc = |old: &[f32]| {
                        let o = (s.off > 0).then(|| {
                            Array::from_f32(old, &[1, hkv as i32, s.off as i32, d as i32]).unwrap()
                        });
                        kernels::kv_alloc(
                            o.as_ref(),
                            s.off as i32,
                            hkv as i32,
                            cap,
                            d as i32,
                            false,
                        )
                        .unwrap()
                    };
                    (alloc(&s.old_k), alloc(&s.old_v))
                })
                .collect();
            let rows: Vec<kernels::KvRows> = which
                .iter()
                .zip(&bufs)
                .map(|(&i, (k, v))| kernels::KvRows {
                    keys: k,
                    values: v,
                    offset: seqs[i].off as i32,
                    rows: seqs[i].rows as i32,
                })
                .collect();
            let (o, kv) = kernels::attention_kv_rows(
                &y,
                &rows,
                attn_shape(h as i32, hkv as i32, d as i32, scale),
            )
            .unwrap();
            assert_eq!(o.shape(), vec![1, t as i32, (h * d) as i32]);
            (o.to_vec_f32().unwrap(), kv)
        };
        for which in [vec![0, 1, 2, 3], vec![2], vec![3, 0], vec![1]] {
            let (got, kv) = run(&which);
            let mut at = 0;
            for (&i, (k, v)) in which.iter().zip(&kv) {
                let s = &seqs[i];
                let n = s.rows * h * d;
                assert!(
                    got[at..at + n]
                        .iter()
                        .zip(&want[i])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "d {d}: sequence {i} in {which:?} differs from it alone"
                );
                at += n;
                // The cache now holds the old rows and the new ones.
                let len = (s.off + s.rows) as i32;
                let held = |a: &Array| {
                    a.slice(&[0, 0, 0, 0], &[1, hkv as i32, len, d as i32])
                        .unwrap()
                        .to_vec_f32()
                        .unwrap()
                };
                assert_eq!(held(k), full(s, &s.old_k, &s.k), "d {d}: keys of {i}");
                assert_eq!(held(v), full(s, &s.old_v, &s.v), "d {d}: values of {i}");
            }
        }
    }
}

/// Every kernel output starts on a cache line (MLX's own allocations sit 8
/// bytes past malloc's 16-byte alignment, which split every 64-byte load of
/// a cache row in two), whatever its size, and holds what it should.
#[test]
fn kernel_outputs_start_on_a_cache_line() {
    let mut g = Gen(71);
    let (hkv, dim) = (3usize, 64usize);
    for len in [1usize, 3, 17, 100, 301] {
        let old = g.f32s(hkv * len * dim, -1.0, 1.0);
        let old_a = heads(&old, hkv, len, dim);
        let cap = len + 5;
        let cache = kernels::kv_alloc(
            Some(&old_a),
            len as i32,
            hkv as i32,
            cap as i32,
            dim as i32,
            false,
        )
        .unwrap();
        let got = cache.to_vec_f32().unwrap();
        assert_eq!(cache.data_address() % 64, 0, "a cache of {cap} rows");
        for h in 0..hkv {
            let row = |t: usize| &got[(h * cap + t) * dim..(h * cap + t + 1) * dim];
            for t in 0..cap {
                let want: &[f32] = if t < len {
                    &old[(h * len + t) * dim..(h * len + t + 1) * dim]
                } else {
                    &[0.0; 64]
                };
                assert_eq!(row(t), want, "head {h} row {t} of {cap}");
            }
        }
        let q = heads(&g.f32s(9 * len * dim, -1.0, 1.0), 9, len, dim);
        let o = kernels::attention(&q, &cache, &cache, 0.125, false).unwrap();
        o.eval().unwrap();
        assert_eq!(o.data_address() % 64, 0, "attention over {len} rows");
        let w = Array::from_f32(&g.f32s(dim, 0.5, 1.5), &[dim as i32]).unwrap();
        let x =
            Array::from_f32(&g.f32s(len * dim, -1.0, 1.0), &[1, len as i32, dim as i32]).unwrap();
        let n = kernels::rms_norm(&x, &w, 1e-5).unwrap();
        n.eval().unwrap();
        assert_eq!(n.data_address() % 64, 0, "a norm of {len} rows");
    }
}

/// A write in place is ordered: a second call on the caches the first one
/// returned runs the first (never evaluated on its own) before it reads.
#[test]
fn attention_kv_rows_orders_writes() {
    let (h, hkv, d) = (2i32, 1i32, 64i32);
    let mut g = Gen(90);
    let scale = 0.125;
    let k0 = kernels::kv_alloc(None, 0, hkv, 256, d, false).unwrap();
    let v0 = kernels::kv_alloc(None, 0, hkv, 256, d, false).unwrap();
    let row = |g: &mut Gen| {
        Array::from_f32(
            &g.f32s(((h + 2 * hkv) * d) as usize, -1.0, 1.0),
            &[1, 1, (h + 2 * hkv) * d],
        )
        .unwrap()
    };
    let (y1, y2) = (row(&mut g), row(&mut g));
    let one = |y: &Array, k: &Array, v: &Array, offset: i32| {
        let s = [kernels::KvRows {
            keys: k,
            values: v,
            offset,
            rows: 1,
        }];
        kernels::attention_kv_rows(y, &s, attn_shape(h, hkv, d, scale)).unwrap()
    };
    let (_, kv1) = one(&y1, &k0, &v0, 0);
    let (o2, _) = one(&y2, &kv1[0].0, &kv1[0].1, 1);
    // Both rows at once, as a sequence of two: the second row's output.
    let both = ops::concatenate(&[&y1, &y2], 1).unwrap();
    let (k, v) = (
        kernels::kv_alloc(None, 0, hkv, 256, d, false).unwrap(),
        kernels::kv_alloc(None, 0, hkv, 256, d, false).unwrap(),
    );
    let s = [kernels::KvRows {
        keys: &k,
        values: &v,
        offset: 0,
        rows: 2,
    }];
    let (o, _) = kernels::attention_kv_rows(&both, &s, attn_shape(h, hkv, d, scale)).unwrap();
    let o = o.to_vec_f32().unwrap();
    assert_eq!(o2.to_vec_f32().unwrap(), o[(h * d) as usize..].to_vec());
    // Rows that do not fit the cache are refused.
    let s = [kernels::KvRows {
        keys: &k,
        values: &v,
        offset: 255,
        rows: 2,
    }];
    assert!(kernels::attention_kv_rows(&both, &s, attn_shape(h, hkv, d, scale)).is_err());
}

/// The kernels' flag for 8-bit activations (`qmm.h` `kActQ8`).
const ACT_Q8: i32 = 512;

/// 8-bit activations: within the bound the activations' rounding allows of
/// the fp32 product (each x moves by at most half its block's step,
/// max |x| / 254), and every row bitwise equal to the row alone.
fn check_int8(n: usize, k: usize, group: i32, bits: i32, seed: u64) {
    let mut g = Gen(seed);
    let q = qweight(&mut g, n, k, group, bits);
    let dense = dequantized(&q);
    let mut xs = g.f32s(16 * k, -2.0, 2.0);
    // Blocks of very different scales, and one all zero.
    for (i, v) in xs.iter_mut().enumerate() {
        *v *= [1.0, 0.01, 30.0, 0.0][(i / 32) % 4];
    }
    let int8 = |x: &Array| -> Vec<f32> {
        kernels::qmatmul(x, &q.w, &q.s, &q.b, q.group, q.bits | ACT_Q8)
            .unwrap()
            .to_vec_f32()
            .unwrap()
    };
    let abs_dense: Vec<f32> = dense
        .to_vec_f32()
        .unwrap()
        .iter()
        .map(|v| v.abs())
        .collect();
    let abs_dense = Array::from_f32(&abs_dense, &[n as i32, k as i32]).unwrap();
    let singles: Vec<Vec<f32>> = (0..16).map(|r| int8(&rows(&xs, k, r, r + 1))).collect();
    for m in [1, 2, 3, 4, 7, 8, 9, 16] {
        let x = rows(&xs, k, 0, m);
        let got = int8(&x);
        let fp32 = ops::matmul(&x, &dense.t().unwrap())
            .unwrap()
            .to_vec_f32()
            .unwrap();
        // Per element: half a quantization step, max |x| / 254 over its block.
        let step: Vec<f32> = xs[..m * k]
            .chunks(32)
            .flat_map(|b| {
                let amax = b.iter().fold(0f32, |a, v| a.max(v.abs()));
                std::iter::repeat_n(amax / 254.0, 32)
            })
            .collect();
        let xa: Vec<f32> = xs[..m * k].iter().map(|v| v.abs()).collect();
        let bound = |v: &[f32]| {
            ops::matmul(
                &Array::from_f32(v, &[m as i32, k as i32]).unwrap(),
                &abs_dense.t().unwrap(),
            )
            .unwrap()
            .to_vec_f32()
            .unwrap()
        };
        let (qerr, mag) = (bound(&step), bound(&xa));
        for i in 0..m * n {
            let tol = 1.001 * qerr[i] + 4e-6 * (k as f32).sqrt() * mag[i] + 1e-6;
            assert!(
                (got[i] - fp32[i]).abs() <= tol,
                "{n}x{k} g{group} {bits}-bit int8, {m} rows, [{}, {}]: ours {} fp32 {} (tol {tol})",
                i / n,
                i % n,
                got[i],
                fp32[i]
            );
        }
        assert_rows_alone(
            &got,
            &singles,
            n,
            &format!("{n}x{k} g{group} {bits}-bit int8"),
        );
    }
}

#[test]
fn qmatmul_int8_activations() {
    check_int8(1536, 576, 32, 4, 41);
    check_int8(576, 1536, 32, 4, 42);
    check_int8(200, 576, 64, 4, 43);
    check_int8(49, 256, 32, 8, 44);
    check_int8(300, 640, 128, 8, 45);
}

/// The quantized matmul's formulas written out in Rust, from MLX's layout:
/// the kernels must give exactly these bits. Per group a partial sum t, then
/// acc = fma(t, scale, acc) and acc = fma(bias, the group's sum of x, acc).
/// t is one fma chain over the values in order (float activations,
/// `qmm_simd.h`), or with `int8` each 32-value block's exact integer sum
/// times its scale (`qmm_vnni.cc`), and the sum of x that of the 8-bit x
/// (`kernels_qmm.cc` `q8_group_sums`).
fn formula_reference(x: &[f32], m: usize, q: &QWeight, int8: bool) -> Vec<f32> {
    let (bits, group) = (q.bits as usize, q.group as usize);
    let w = q.w.to_vec_u32().unwrap();
    let f = |a: &Array| a.as_type(Dtype::Float32).unwrap().to_vec_f32().unwrap();
    let (s, b) = (f(&q.s), f(&q.b));
    let n = q.w.dim(0) as usize;
    let k = x.len() / m;
    let (per, groups) = (32 / bits, k / group);
    let mut y = vec![0f32; m * n];
    for r in 0..m {
        let xr = &x[r * k..(r + 1) * k];
        // Blocks of 32: round(x * 127 / max) and max / 127.
        let (mut xq, mut xd) = (vec![0i32; k], vec![0f32; k / 32]);
        for (blk, xb) in xr.chunks(32).enumerate() {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            xd[blk] = amax / 127.0;
            for (i, v) in xb.iter().enumerate() {
                xq[blk * 32 + i] = (v * inv).round_ties_even() as i32;
            }
        }
        for col in 0..n {
            let value = |i: usize| {
                let word = w[col * k * bits / 32 + i / per];
                (word >> ((i % per) * bits)) & ((1 << bits) - 1)
            };
            let mut acc = 0f32;
            for g in 0..groups {
                let mut t = 0f32;
                let (g0, g1) = (g * group, (g + 1) * group);
                if int8 {
                    for (blk, d) in (g0 / 32..g1 / 32).zip(&xd[g0 / 32..g1 / 32]) {
                        let isum: i32 = (blk * 32..blk * 32 + 32)
                            .map(|i| value(i) as i32 * xq[i])
                            .sum();
                        t = (isum as f32).mul_add(*d, t);
                    }
                } else {
                    for (i, xi) in (g0..g1).zip(&xr[g0..g1]) {
                        t = xi.mul_add(value(i) as f32, t);
                    }
                }
                // The sum the bias multiplies: of x itself, or with `int8`
                // of the 8-bit x, block by block (each block's exact
                // integer sum times its scale), as llama.cpp's Q8_1 `s`.
                let xsum = match int8 {
                    false => xr[g0..g1].iter().fold(0f32, |a, v| a + v),
                    true => (g0 / 32..g1 / 32).fold(0f32, |a, blk| {
                        let qsum: i32 = xq[blk * 32..blk * 32 + 32].iter().sum();
                        (qsum as f32).mul_add(xd[blk], a)
                    }),
                };
                acc = t.mul_add(s[col * groups + g], acc);
                acc = b[col * groups + g].mul_add(xsum, acc);
            }
            y[r * n + col] = acc;
        }
    }
    y
}

/// `kernels::qmatmul` (with `act` in its bits) against [`formula_reference`],
/// bit for bit, on each (n, k, group, bits, seed) at each row count.
fn check_formula(cases: &[(usize, usize, i32, i32, u64)], rows: &[usize], act: i32) {
    for &(n, k, group, bits, seed) in cases {
        let mut g = Gen(seed);
        let q = qweight(&mut g, n, k, group, bits);
        for &m in rows {
            let mut xs = g.f32s(m * k, -3.0, 3.0);
            if m == 3 {
                // A row so small that x * 2^-24 would be subnormal: the
                // AVX2 path that pre-scales x must not take it.
                xs[k..2 * k].iter_mut().for_each(|v| *v *= 1e-32);
            }
            let x = Array::from_f32(&xs, &[m as i32, k as i32]).unwrap();
            let got = kernels::qmatmul(&x, &q.w, &q.s, &q.b, group, bits | act)
                .unwrap()
                .to_vec_f32()
                .unwrap();
            let want = formula_reference(&xs, m, &q, act == ACT_Q8);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{} act {act} {n}x{k} g{group} {bits}-bit, {m} rows, [{}, {}]: {a} vs {b}",
                    kernels::isa(),
                    i / n,
                    i % n
                );
            }
        }
    }
}

#[test]
fn qmatmul_int8_is_its_formula_exactly() {
    let cases = [
        (40, 256, 32, 4, 51),
        (33, 192, 64, 8, 52),
        (17, 128, 128, 4, 53),
        (24, 96, 32, 8, 54),
    ];
    // Every row tile and tail of the 8-bit-activation kernels: the VNNI
    // kernel's tiles of 1-8 rows (and 8 + 3, 8 + 7), the AVX2 ones with
    // 8-bit values from 3 rows, one column vector at a time.
    check_formula(&cases, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 15, 17, 40], ACT_Q8);
}

/// The float32-scale layout (`bits | 256`, GGUF K-quants) with 8-bit
/// activations: the same formula, bit for bit, at every row tile (the VNNI
/// kernel runs 4-bit groups of one 32-value block in a tile of their own).
#[test]
fn qmatmul_int8_float32_scales_is_its_formula_exactly() {
    for (i, (n, k, group, bits)) in [(40, 256, 32, 4), (33, 192, 64, 4), (24, 96, 32, 8)]
        .into_iter()
        .enumerate()
    {
        let mut g = Gen(90 + i as u64);
        let (words, groups) = (k * bits as usize / 32, k / group as usize);
        let dims = [n as i32, groups as i32];
        let scales: Vec<f32> = g
            .f32s(n * groups, 0.0002, 0.01)
            .iter()
            .map(|s| s * 1.000_123)
            .collect();
        let q = QWeight {
            w: Array::from_u32(&g.u32s(n * words), &[n as i32, words as i32]).unwrap(),
            s: Array::from_f32(&scales, &dims).unwrap(),
            b: Array::from_f32(&g.f32s(n * groups, -0.1, 0.1), &dims).unwrap(),
            group,
            bits,
        };
        let packed = kernels::qpack(&q.w, &q.s, &q.b, group, bits).unwrap();
        for m in [1, 2, 3, 5, 7, 8, 9, 11, 15, 17, 40] {
            let xs = g.f32s(m * k, -3.0, 3.0);
            let x = Array::from_f32(&xs, &[m as i32, k as i32]).unwrap();
            let got = kernels::qmatmul_packed(
                &x,
                &packed,
                Packing::new(n as i32, group, bits | 256 | ACT_Q8),
            )
            .unwrap()
            .to_vec_f32()
            .unwrap();
            let want = formula_reference(&xs, m, &q, true);
            for (j, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{} {n}x{k} g{group} {bits}-bit f32 scales, {m} rows, [{}, {}]: {a} vs {b}",
                    kernels::isa(),
                    j / n,
                    j % n
                );
            }
        }
    }
}

/// Every instruction set computes the same bits (`make test` runs this file
/// again at `SPECD_KERNEL_ISA=avx2` and `scalar`), so a model's output does
/// not depend on the machine's SIMD level.
#[test]
fn qmatmul_is_its_formula_exactly() {
    let cases = [
        (40, 256, 32, 4, 61),
        (33, 192, 64, 8, 62),
        (70, 128, 128, 4, 63),
        (24, 96, 32, 8, 64),
    ];
    // 32, 40 and 67 rows: the panel path (qmm.h kPanelRows), its 6-row
    // tiles and every tail.
    check_formula(&cases, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 15, 32, 40, 67], 0);
}

/// The host's greedy scan (`argmax_margin` in the host crate, which this
/// crate sits below, so the reference is its own copy): what
/// `row_top2` must keep, bit for bit. Returns (argmax, top, second).
fn scan_top2(row: &[f32]) -> (u32, f32, f32) {
    let (mut best, mut b1, mut b2) = (0usize, f32::NEG_INFINITY, f32::NEG_INFINITY);
    for (i, &x) in row.iter().enumerate() {
        if x > b1 {
            b2 = b1;
            b1 = x;
            best = i;
        } else if x > b2 {
            b2 = x;
        }
    }
    (best as u32, b1, b2)
}

/// `row_top2` of `logits` (rows of `v` values, in `flat`) against the scan,
/// row by row: argmax, top and runner-up bitwise, and the NaN flag.
fn check_top2(logits: &Array, flat: &[f32], v: usize, what: &str) {
    let got = kernels::row_top2(logits).unwrap().to_vec_f32().unwrap();
    assert_top2(&got, flat, v, what);
}

/// Statistics `got` (four a row) against the scan of the rows in `flat`.
fn assert_top2(got: &[f32], flat: &[f32], v: usize, what: &str) {
    assert_eq!(got.len(), flat.len() / v * 4, "{what}: four values a row");
    for (r, (row, g)) in flat.chunks(v).zip(got.chunks(4)).enumerate() {
        let (argmax, top, second) = scan_top2(row);
        assert_eq!(g[0], argmax as f32, "{what} row {r}: argmax");
        assert_eq!(g[1].to_bits(), top.to_bits(), "{what} row {r}: top");
        assert_eq!(g[2].to_bits(), second.to_bits(), "{what} row {r}: second");
        let exact = if row.iter().any(|x| x.is_nan()) {
            0.0
        } else {
            1.0
        };
        assert_eq!(g[3], exact, "{what} row {r}: the NaN flag");
    }
}

#[test]
fn row_top2_keeps_what_the_host_scan_keeps() {
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    // Small rows: ties (the first index wins; the runner-up equals the top),
    // signed zeros (which zero is kept decides the margin's sign), NaN,
    // +-inf, rows with nothing above -inf, and a row of one value.
    let small: [[f32; 5]; 12] = [
        [0.5, 2.0, 1.0, -3.0, 1.5],
        [1.0, 3.0, 0.5, 3.0, 0.0],
        [nan, 1.0, 2.0, 0.0, 1.5],
        [-1.0, -2.0, -0.5, -0.25, -4.0],
        [-inf, 0.0, inf, 1.0, inf],
        [-inf, -inf, -inf, -inf, -inf],
        [nan, nan, nan, nan, nan],
        [nan, -inf, nan, -inf, nan],
        [-0.0, 0.0, -0.0, 0.0, -1.0],
        [0.0, -0.0, 0.0, -0.0, -1.0],
        [-1.0, -0.0, 0.0, 5.0, -0.0],
        [2.0, 2.0, 2.0, 2.0, 2.0],
    ];
    let flat: Vec<f32> = small.iter().flatten().copied().collect();
    check_top2(
        &Array::from_f32(&flat, &[12, 5]).unwrap(),
        &flat,
        5,
        "small",
    );
    check_top2(
        &Array::from_f32(&[-0.0], &[1, 1]).unwrap(),
        &[-0.0],
        1,
        "one value",
    );

    // Model-sized rows (vocab 49152 and one past a multiple of the SIMD
    // width and of the threads' pieces), values drawn from a few hundred
    // levels so the top and runner-up are tied across lanes and pieces;
    // some rows salted with NaN, infinities and signed zeros.
    let mut g = Gen(77);
    for (rows, v) in [(1usize, 49152usize), (5, 49152), (9, 49169), (3, 16385)] {
        let mut flat: Vec<f32> = (0..rows * v)
            .map(|_| ((g.next() % 400) as f32 - 200.0) / 8.0)
            .collect();
        for r in 0..rows {
            let row = &mut flat[r * v..(r + 1) * v];
            match r % 4 {
                1 => row[(g.next() as usize) % v] = nan,
                2 => {
                    // The largest value twice, far apart (different pieces).
                    row[v - 3] = 99.0;
                    row[7] = 99.0;
                }
                3 => {
                    for x in row.iter_mut() {
                        *x = if *x > 0.0 { -0.0 } else { x.min(0.0) };
                    }
                    row[v / 2] = 0.0;
                    row[v - 1] = inf;
                }
                _ => {}
            }
        }
        let a = Array::from_f32(&flat, &[rows as i32, v as i32]).unwrap();
        check_top2(&a, &flat, v, &format!("{rows}x{v}"));
    }

    // Strided rows (a transposed array: values not adjacent) take the
    // kernel's scalar scan; leading axes are rows too.
    let (n, v) = (6usize, 3000usize);
    let cols: Vec<f32> = (0..n * v)
        .map(|_| ((g.next() % 50) as f32) - 25.0)
        .collect();
    let t = Array::from_f32(&cols, &[v as i32, n as i32])
        .unwrap()
        .t()
        .unwrap();
    let flat: Vec<f32> = (0..n)
        .flat_map(|r| (0..v).map(move |c| (r, c)))
        .map(|(r, c)| cols[c * n + r])
        .collect();
    check_top2(&t, &flat, v, "transposed");
    let three = Array::from_f32(&flat, &[2, 3, v as i32]).unwrap();
    let got = kernels::row_top2(&three).unwrap();
    assert_eq!(got.shape(), vec![2, 3, 4]);
    check_top2(&three, &flat, v, "leading axes");

    // A row of each row count gives what it gives alone.
    let alone: Vec<f32> = (0..n)
        .flat_map(|r| {
            let row = rows(&flat, v, r, r + 1);
            kernels::row_top2(&row).unwrap().to_vec_f32().unwrap()
        })
        .collect();
    let all = kernels::row_top2(&rows(&flat, v, 0, n))
        .unwrap()
        .to_vec_f32()
        .unwrap();
    assert_eq!(
        alone.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        all.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );

    let empty = Array::zeros(&[2, 0], Dtype::Float32).unwrap();
    assert!(kernels::row_top2(&empty).is_err(), "a row of no values");
}

/// `row_top2_list` over slices of one array (as a batched step's parts
/// are) gives each slice's rows as `row_top2` does, in order.
#[test]
fn row_top2_list_is_each_array_in_turn() {
    let mut g = Gen(78);
    let v = 20000usize;
    let flat: Vec<f32> = (0..14 * v)
        .map(|_| ((g.next() % 300) as f32) / 4.0)
        .collect();
    let all = Array::from_f32(&flat, &[14, v as i32]).unwrap();
    let cuts = [(0, 1), (1, 5), (5, 6), (6, 14)];
    let parts: Vec<Array> = cuts
        .iter()
        .map(|&(a, b)| all.slice(&[a, 0], &[b, v as i32]).unwrap())
        .collect();
    let refs: Vec<&Array> = parts.iter().collect();
    let got = kernels::row_top2_list(&refs).unwrap();
    assert_eq!(got.shape(), vec![14, 4]);
    let want: Vec<u32> = parts
        .iter()
        .flat_map(|p| kernels::row_top2(p).unwrap().to_vec_f32().unwrap())
        .map(f32::to_bits)
        .collect();
    let got: Vec<u32> = got
        .to_vec_f32()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect();
    assert_eq!(got, want);
    let list = kernels::row_top2_list(&refs).unwrap().to_vec_f32().unwrap();
    assert_top2(&list, &flat, v, "the list's rows");

    let narrow = Array::from_f32(&[1.0, 2.0], &[1, 2]).unwrap();
    assert!(
        kernels::row_top2_list(&[&parts[0], &narrow]).is_err(),
        "rows of two widths"
    );
    assert!(kernels::row_top2_list(&[]).is_err(), "no arrays");
}

/// f32 values as MLX rounds them to f16, back in f32.
fn rounded_to_f16(x: &[f32]) -> Vec<f32> {
    Array::from_f32(x, &[x.len() as i32])
        .unwrap()
        .as_type(Dtype::Float16)
        .unwrap()
        .to_vec_f32()
        .unwrap()
}

/// A 16-bit cache: the rows written are MLX's f16 rounding of them (ties,
/// subnormals, overflow and NaN included), and attention over it is
/// bitwise attention over a float32 cache holding those rounded values, on
/// the grouped kernel's head dims and the per-head path's, for sequences
/// with and without held rows.
#[test]
fn attention_over_a_16_bit_cache_is_over_its_rounded_values() {
    let (h, hkv) = (6usize, 2usize);
    let scale = 0.125;
    for d in [64usize, 48] {
        let mut g = Gen(7 + d as u64);
        // (held, new rows) per sequence.
        let shape = [(0usize, 5usize), (37, 1), (300, 3)];
        let seqs: Vec<_> = shape
            .iter()
            .map(|&(off, rows)| {
                let kv = |g: &mut Gen, n: usize| g.f32s(n * hkv * d, -2.0, 2.0);
                let (old_k, old_v) = (kv(&mut g, off), kv(&mut g, off));
                let (k, v) = (kv(&mut g, rows), kv(&mut g, rows));
                (
                    off,
                    rows,
                    old_k,
                    old_v,
                    g.f32s(rows * h * d, -1.0, 1.0),
                    k,
                    v,
                )
            })
            .collect();
        let run = |half: bool, round: bool| {
            let r = |x: &[f32]| if round { rounded_to_f16(x) } else { x.to_vec() };
            let mut y = Vec::new();
            for (_, rows, _, _, q, k, v) in &seqs {
                let (k, v) = (r(k), r(v));
                for i in 0..*rows {
                    y.extend_from_slice(&q[i * h * d..][..h * d]);
                    y.extend_from_slice(&k[i * hkv * d..][..hkv * d]);
                    y.extend_from_slice(&v[i * hkv * d..][..hkv * d]);
                }
            }
            let t: usize = seqs.iter().map(|s| s.1).sum();
            let y = Array::from_f32(&y, &[1, t as i32, ((h + 2 * hkv) * d) as i32]).unwrap();
            let bufs: Vec<(Array, Array)> = seqs
                .iter()
                .map(|(off, rows, old_k, old_v, ..)| {
                    let cap = (off + rows).div_ceil(256) as i32 * 256;
                    let alloc = |old: &[f32]| {
                        let o = (*off > 0).then(|| {
                            Array::from_f32(&r(old), &[1, hkv as i32, *off as i32, d as i32])
                                .unwrap()
                        });
                        kernels::kv_alloc(o.as_ref(), *off as i32, hkv as i32, cap, d as i32, half)
                            .unwrap()
                    };
                    (alloc(old_k), alloc(old_v))
                })
                .collect();
            let parts: Vec<kernels::KvRows> = seqs
                .iter()
                .zip(&bufs)
                .map(|(s, (k, v))| kernels::KvRows {
                    keys: k,
                    values: v,
                    offset: s.0 as i32,
                    rows: s.1 as i32,
                })
                .collect();
            let (o, kv) = kernels::attention_kv_rows(
                &y,
                &parts,
                attn_shape(h as i32, hkv as i32, d as i32, scale),
            )
            .unwrap();
            let held: Vec<Vec<f32>> = kv
                .iter()
                .zip(&seqs)
                .flat_map(|((k, v), s)| {
                    let end = [1, hkv as i32, (s.0 + s.1) as i32, d as i32];
                    [k, v].map(|a| a.slice(&[0, 0, 0, 0], &end).unwrap().to_vec_f32().unwrap())
                })
                .collect();
            assert_eq!(
                kv[0].0.dtype(),
                if half { Dtype::Float16 } else { Dtype::Float32 }
            );
            (o.to_vec_f32().unwrap(), held)
        };
        let (o16, held16) = run(true, false);
        let (o32, held32) = run(false, true);
        assert!(
            o16.iter()
                .zip(&o32)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "d {d}: attention over the 16-bit cache differs"
        );
        assert_eq!(held16, held32, "d {d}: the 16-bit cache holds other values");
    }
    // The rounding of rows as they are written, at its edges.
    let (h, hkv, d) = (1i32, 1i32, 64usize);
    let mut edges = vec![
        0.0,
        -0.0,
        65504.0,
        65519.99,
        65520.0,
        -1e6,
        f32::INFINITY,
        f32::NAN,
        6.1035156e-5,
        6.097555e-5,
        5.9604645e-8,
        2.9802322e-8,
        2.9802326e-8,
        1.0 + 1.0 / 2048.0,
        1.0 + 3.0 / 2048.0,
        -(1.0 + 1.0 / 4096.0),
        1e-40,
        3.5762787e-7,
    ];
    let mut g = Gen(3);
    edges.extend(g.f32s(d - edges.len(), -1e-4, 1e-4));
    let mut y = vec![0.0; (h as usize) * d];
    y.extend_from_slice(&edges);
    y.extend(vec![0.5; d]);
    let y = Array::from_f32(&y, &[1, 1, ((h + 2 * hkv) as usize * d) as i32]).unwrap();
    let (k, v) = (
        kernels::kv_alloc(None, 0, hkv, 256, d as i32, true).unwrap(),
        kernels::kv_alloc(None, 0, hkv, 256, d as i32, true).unwrap(),
    );
    let s = [kernels::KvRows {
        keys: &k,
        values: &v,
        offset: 0,
        rows: 1,
    }];
    let (_, kv) = kernels::attention_kv_rows(&y, &s, attn_shape(h, hkv, d as i32, 0.125)).unwrap();
    let got = kv[0]
        .0
        .slice(&[0, 0, 0, 0], &[1, 1, 1, d as i32])
        .unwrap()
        .to_vec_f32()
        .unwrap();
    let want = rounded_to_f16(&edges);
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!(
            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
            "{} rounds to {a} in the cache, {b} by MLX",
            edges[i]
        );
    }
}
