//! GGUF tensor blocks decoded here, into the affine form the CPU kernels
//! multiply (`w = scale * q + bias` per group, `q` unsigned): MLX's GGUF
//! reader decodes only Q4_0, Q4_1 and Q8_0, and the GGUFs people download are
//! mostly K-quants.
//!
//! Every type maps onto the kernels' layout *exactly* (the dequantized
//! weights equal ggml's, `gguf.quants.dequantize`, bit for bit):
//!
//! | type | values | group | scale, bias | held as |
//! |---|---|---|---|---|
//! | Q4_0 | 4-bit | 32 | d, -8d | 4 bits, f16 scales |
//! | Q4_1 | 4-bit | 32 | d, m | 4 bits, f16 scales |
//! | Q5_0 | 5-bit | 32 | d, -16d | 8 bits, f16 scales |
//! | Q8_0 | 8-bit signed | 32 | d, -128d | 8 bits (q + 128), f16 scales |
//! | Q4_K | 4-bit | 32 | d·sc, -dmin·m | 4 bits, f32 scales |
//! | Q5_K | 5-bit | 32 | d·sc, -dmin·m | 8 bits, f32 scales |
//! | Q6_K | 6-bit | 16 | d·sc, -32·d·sc | 8 bits, f32 scales |
//!
//! A K-quant's `d·sc` (an f16 times a 6- or 8-bit integer) has up to 18
//! significant bits, which float16 cannot hold; float32 holds it and
//! `d·sc·q` exactly, so the one rounding left is ggml's own (`+ bias`).
//! 5- and 6-bit values ride in 8-bit lanes: no new unpacking code, at the
//! cost of reading 8 bits where ggml reads 5.5 or 6.56 (see docs/benchmarks.md, "GGUF
//! quantizations").
use specd_text::gguf::ggml_type as ty;
use thiserror::Error;

/// A tensor's data that cannot become weights.
#[derive(Debug, Error, PartialEq)]
pub enum GgmlError {
    #[error("tensor {name}: quantization type {ty_name} (ggml type {id}) is not supported (specd reads f32, f16, bf16, q4_0, q4_1, q5_0, q8_0, q4_K, q5_K, q6_K)")]
    UnknownType {
        name: String,
        id: u32,
        ty_name: &'static str,
    },
    #[error("tensor {name}: {ty_name} data is truncated: {want} bytes for {rows} rows of {cols}, the file has {got}")]
    Truncated {
        name: String,
        ty_name: &'static str,
        rows: usize,
        cols: usize,
        want: usize,
        got: usize,
    },
    #[error("tensor {name}: rows of {cols} values are not whole {ty_name} blocks of {block}")]
    RaggedRows {
        name: String,
        ty_name: &'static str,
        cols: usize,
        block: usize,
    },
}

/// Weights in the kernels' affine form, row-major `[rows, cols]`.
pub struct Affine {
    /// The value width the kernels unpack (4 or 8).
    pub bits: i32,
    pub group: usize,
    /// One unsigned value per weight.
    pub q: Vec<u8>,
    /// Per group, `[rows, cols / group]`.
    pub scales: Vec<f32>,
    pub biases: Vec<f32>,
    /// Scales and biases are float16 values (held as float16); else they
    /// need float32.
    pub half: bool,
}

impl Affine {
    /// `q` packed into MLX's uint32 words: value j of a word at bits
    /// `j * bits`, words in row order.
    pub fn words(&self) -> Vec<u32> {
        let per = 32 / self.bits as usize;
        self.q
            .chunks(per)
            .map(|c| {
                c.iter().enumerate().fold(0u32, |w, (j, &v)| {
                    w | (v as u32) << (j * self.bits as usize)
                })
            })
            .collect()
    }

    /// The weights as float32: `scale * q + bias`, as the kernels read them.
    pub fn dequantize(&self) -> Vec<f32> {
        self.q
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let g = i / self.group;
                self.scales[g] * v as f32 + self.biases[g]
            })
            .collect()
    }
}

/// A decoded tensor.
pub enum Decoded {
    /// Float32 values (from f32, f16, bf16).
    Dense(Vec<f32>),
    Quantized(Affine),
}

pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: value m * 2^-24, exact in f32.
            let v = m as f32 * (1.0 / 16_777_216.0);
            return if sign != 0 { -v } else { v };
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// `x` as float16 bits, rounded to nearest even (ggml's
/// `GGML_FP32_TO_FP16`); out of range: infinity.
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    // The significand with its hidden bit, and how far right it goes.
    let (m, shift) = if e <= 0 {
        if e < -10 {
            return sign;
        }
        (man | 0x80_0000, (14 - e) as u32)
    } else {
        (man, 13)
    };
    let half = 1u32 << (shift - 1);
    let rest = m & ((1 << shift) - 1);
    let mut q = m >> shift;
    if rest > half || (rest == half && q & 1 == 1) {
        q += 1; // may carry into the exponent: still the right bits
    }
    let bits = if e <= 0 { q } else { ((e as u32) << 10) + q };
    sign | bits as u16
}

/// Rows of float32 values as ggml Q8_0 blocks (32 values: an f16 scale
/// `d = max|x| / 127`, then `round(x / d)` as int8), as ggml's
/// `quantize_row_q8_0_ref`. `x.len()` is whole blocks.
pub fn encode_q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 32 * 34);
    for b in x.chunks_exact(32) {
        let amax = b.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f32_to_f16(d).to_le_bytes());
        out.extend(b.iter().map(|v| (v * id).round() as i8 as u8));
    }
    out
}

/// Rows of float32 values as ggml Q4_1 blocks (32 values: f16 `d =
/// (max - min) / 15` and `m = min`, then 4-bit `round((x - m) / d)`, value
/// j in the low nibble of byte j and value j + 16 in its high nibble), as
/// ggml's `quantize_row_q4_1_ref`.
pub fn encode_q4_1(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 32 * 20);
    for b in x.chunks_exact(32) {
        let (min, max) = b
            .iter()
            .fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f32_to_f16(d).to_le_bytes());
        out.extend(f32_to_f16(min).to_le_bytes());
        let q = |v: f32| (((v - min) * id + 0.5) as u8).min(15);
        out.extend((0..16).map(|j| q(b[j]) | (q(b[j + 16]) << 4)));
    }
    out
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Q4_K's and Q5_K's packed 6-bit (scale, min) of sub-block j.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Decodes `rows` rows of `cols` values of ggml type `id` from `data`.
pub fn decode(
    name: &str,
    id: u32,
    data: &[u8],
    rows: usize,
    cols: usize,
) -> Result<Decoded, GgmlError> {
    let ty_name = ty::name(id);
    let supported = matches!(
        id,
        ty::F32 | ty::F16 | ty::BF16 | ty::Q4_0 | ty::Q4_1 | ty::Q5_0 | ty::Q8_0
    ) || matches!(id, ty::Q4_K | ty::Q5_K | ty::Q6_K);
    let Some((be, bb)) = ty::block(id).filter(|_| supported) else {
        return Err(GgmlError::UnknownType {
            name: name.into(),
            id,
            ty_name,
        });
    };
    let (be, bb) = (be as usize, bb as usize);
    if !cols.is_multiple_of(be) {
        return Err(GgmlError::RaggedRows {
            name: name.into(),
            ty_name,
            cols,
            block: be,
        });
    }
    let n = rows * cols;
    let want = n / be * bb;
    if data.len() < want {
        return Err(GgmlError::Truncated {
            name: name.into(),
            ty_name,
            rows,
            cols,
            want,
            got: data.len(),
        });
    }
    let blocks = data[..want].chunks_exact(bb);
    Ok(match id {
        ty::F32 => Decoded::Dense(
            blocks
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        ),
        ty::F16 => Decoded::Dense(blocks.map(|b| f16_at(b, 0)).collect()),
        ty::BF16 => Decoded::Dense(
            blocks
                .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
                .collect(),
        ),
        _ => Decoded::Quantized(affine(id, blocks, n)),
    })
}

/// The quantized types' blocks in affine form (the layouts of ggml-quants.c,
/// indexed as ggml's reference dequantizers are, to be checked against them).
#[allow(clippy::needless_range_loop)]
fn affine<'a>(id: u32, blocks: impl Iterator<Item = &'a [u8]>, n: usize) -> Affine {
    let (bits, group, half) = match id {
        ty::Q4_0 | ty::Q4_1 => (4, 32, true),
        ty::Q5_0 | ty::Q8_0 => (8, 32, true),
        ty::Q4_K => (4, 32, false),
        ty::Q5_K => (8, 32, false),
        _ => (8, 16, false), // Q6_K
    };
    let mut a = Affine {
        bits,
        group,
        q: Vec::with_capacity(n),
        scales: Vec::with_capacity(n / group),
        biases: Vec::with_capacity(n / group),
        half,
    };
    for b in blocks {
        match id {
            ty::Q4_0 | ty::Q4_1 => {
                let d = f16_at(b, 0);
                let (bias, qs) = if id == ty::Q4_0 {
                    (-8.0 * d, &b[2..18])
                } else {
                    (f16_at(b, 2), &b[4..20])
                };
                a.q.extend(qs.iter().map(|v| v & 0xf));
                a.q.extend(qs.iter().map(|v| v >> 4));
                a.scales.push(d);
                a.biases.push(bias);
            }
            ty::Q5_0 => {
                let d = f16_at(b, 0);
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                let qs = &b[6..22];
                for (j, v) in qs.iter().enumerate() {
                    a.q.push((v & 0xf) | (((qh >> j) << 4) & 0x10) as u8);
                }
                for (j, v) in qs.iter().enumerate() {
                    a.q.push((v >> 4) | ((qh >> (j + 12)) & 0x10) as u8);
                }
                a.scales.push(d);
                a.biases.push(-16.0 * d);
            }
            ty::Q8_0 => {
                let d = f16_at(b, 0);
                a.q.extend(b[2..34].iter().map(|&v| (v as i8 as i16 + 128) as u8));
                a.scales.push(d);
                a.biases.push(-128.0 * d);
            }
            ty::Q4_K | ty::Q5_K => {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let sc = &b[4..16];
                let (qh, ql) = if id == ty::Q5_K {
                    (Some(&b[16..48]), &b[48..176])
                } else {
                    (None, &b[16..144])
                };
                // Four chunks of 64: low nibbles are sub-block 2j, high 2j + 1.
                for j in 0..4 {
                    let q = &ql[32 * j..32 * j + 32];
                    for (half_, shift) in [(0, 0), (1, 4)] {
                        let (s, m) = scale_min_k4(2 * j + half_, sc);
                        let hbit = 2 * j + half_;
                        for l in 0..32 {
                            let mut v = (q[l] >> shift) & 0xf;
                            if let Some(qh) = qh {
                                v |= ((qh[l] >> hbit) & 1) << 4;
                            }
                            a.q.push(v);
                        }
                        a.scales.push(d * s as f32);
                        a.biases.push(-(dmin * m as f32));
                    }
                }
            }
            _ => {
                // Q6_K: ql[128], qh[64], int8 scales[16], f16 d.
                let (ql, qh, sc, d) = (&b[0..128], &b[128..192], &b[192..208], f16_at(b, 208));
                let start = a.q.len();
                a.q.resize(start + 256, 0);
                let y = &mut a.q[start..];
                for n in 0..2 {
                    let (ql, qh, y) = (&ql[64 * n..], &qh[32 * n..], &mut y[128 * n..]);
                    for l in 0..32 {
                        y[l] = (ql[l] & 0xf) | (qh[l] & 3) << 4;
                        y[l + 32] = (ql[l + 32] & 0xf) | ((qh[l] >> 2) & 3) << 4;
                        y[l + 64] = (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4;
                        y[l + 96] = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4;
                    }
                }
                for &s in sc {
                    let s = d * (s as i8) as f32;
                    a.scales.push(s);
                    a.biases.push(-32.0 * s);
                }
            }
        }
    }
    // d * -128 past float16's range (never in practice): float32 holds it.
    if a.half && a.biases.iter().any(|b| b.abs() > 65504.0) {
        a.half = false;
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_to_f16_inverts_f16_to_f32_and_rounds_to_nearest() {
        for h in (0u16..0x7c00).chain(0x8000..0xfc00) {
            assert_eq!(f32_to_f16(f16_to_f32(h)), h, "{h:#x}");
        }
        // One f16 step above 1 is 4 / 4096.
        assert_eq!(f32_to_f16(1.0 + 2.0 / 4096.0), 0x3c00, "a tie goes to even");
        assert_eq!(f32_to_f16(1.0 + 6.0 / 4096.0), 0x3c02, "a tie goes to even");
        assert_eq!(f32_to_f16(1.0 + 3.0 / 4096.0), 0x3c01);
        assert_eq!(f32_to_f16(1e6), 0x7c00);
    }

    #[test]
    fn q8_0_and_q4_1_blocks_decode_to_the_values_within_a_step() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) / 7.0)
            .collect();
        for (id, bytes, step) in [
            (ty::Q8_0, encode_q8_0(&x), 2.0 / 127.0),
            (ty::Q4_1, encode_q4_1(&x), 4.0 / 15.0),
        ] {
            let Decoded::Quantized(a) = decode("t", id, &bytes, 2, 32).unwrap() else {
                panic!("quantized")
            };
            let y = a.dequantize();
            for (u, v) in x.iter().zip(&y) {
                assert!((u - v).abs() <= step / 2.0 + 1e-3, "{id}: {u} vs {v}");
            }
        }
    }

    #[test]
    fn f16_conversion_covers_normals_subnormals_and_signs() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert!(f16_to_f32(0x7c00).is_infinite());
    }

    #[test]
    fn q8_0_block_decodes_to_d_times_q() {
        let mut b = vec![0x00, 0x3c]; // d = 1
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let Decoded::Quantized(a) = decode("t", ty::Q8_0, &b, 1, 32).unwrap() else {
            panic!("quantized")
        };
        let want: Vec<f32> = (0..32).map(|i| (i - 16) as f32).collect();
        assert_eq!(a.dequantize(), want);
        assert_eq!(a.words().len(), 8);
    }

    #[test]
    fn a_truncated_k_quant_block_and_an_unknown_type_are_named() {
        let e = decode("blk.0.ffn_down.weight", ty::Q6_K, &[0u8; 300], 2, 256)
            .err()
            .unwrap();
        assert!(
            matches!(
                e,
                GgmlError::Truncated {
                    want: 420,
                    got: 300,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("blk.0.ffn_down.weight"), "{e}");
        let e = decode("w", ty::Q2_K, &[0u8; 84], 1, 256).err().unwrap();
        assert!(e.to_string().contains("q2_K"), "{e}");
        let e = decode("w", 99, &[], 1, 1).err().unwrap();
        assert!(matches!(e, GgmlError::UnknownType { id: 99, .. }), "{e}");
    }
}
