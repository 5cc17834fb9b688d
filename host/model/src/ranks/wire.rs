//! What travels between ranks, each frame as three arrays: a fixed header
//! (`[kind, words, rows]`), the frame's description as JSON in u32 words,
//! and for a step the hidden rows `[1, rows, hidden]`.
use crate::cache::CacheOp;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// The header's length in u32 words.
pub const HEADER: i32 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// Run the layers over the rows that follow.
    Step = 1,
    /// Answer back to rank 0 (the last rank does): every rank is alive.
    Ping = 2,
    /// Apply the operations, then exit: rank 0 is done.
    Stop = 3,
}

/// One sequence's part of a step: its rows, and the id of its cache in
/// each layer from `Frame::first_remote` on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seq {
    pub rows: u32,
    pub ids: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    pub kind: Kind,
    /// The cache operations rank 0 made since the last frame, in order.
    pub ops: Vec<CacheOp>,
    /// The first layer past rank 0's: `Seq::ids[0]` is that layer's.
    pub first_remote: usize,
    pub seqs: Vec<Seq>,
    /// The hidden rows' dtype code (`specd_mlx::Dtype`).
    pub dtype: u8,
}

impl Frame {
    pub fn rows(&self) -> i32 {
        self.seqs.iter().map(|s| s.rows as i32).sum()
    }

    /// The header and the description's words.
    pub fn encode(&self) -> Result<([u32; HEADER as usize], Vec<u32>)> {
        let words = to_words(&serde_json::to_vec(self)?);
        Ok((
            [self.kind as u32, words.len() as u32, self.rows() as u32],
            words,
        ))
    }

    pub fn decode(words: &[u32]) -> Result<Frame> {
        let bytes = from_words(words);
        let f: Frame = serde_json::from_slice(&bytes).context("a frame from the previous rank")?;
        Ok(f)
    }
}

/// Bytes as little-endian u32 words (what an MLX array carries), the
/// last one padded with zeros.
pub fn to_words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks(4)
        .map(|c| {
            let mut b = [0u8; 4];
            b[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(b)
        })
        .collect()
}

/// The bytes of [`to_words`] back, without the padding (text: no NULs).
pub fn from_words(words: &[u32]) -> Vec<u8> {
    let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    while bytes.last() == Some(&0) {
        bytes.pop();
    }
    bytes
}

/// The header's `(kind, words, rows)`, checked.
pub fn header(words: &[u32]) -> Result<(u32, usize, i32)> {
    match words {
        [k @ 1..=3, n, r] => Ok((*k, *n as usize, *r as i32)),
        _ => bail!("a malformed frame header from the previous rank: {words:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let f = Frame {
            kind: Kind::Step,
            ops: vec![
                CacheOp::New { id: 7, layer: 12 },
                CacheOp::Prepare {
                    id: 7,
                    offsets: vec![3, 4],
                },
                CacheOp::Take {
                    id: 7,
                    snaps: vec![],
                },
            ],
            first_remote: 11,
            seqs: vec![
                Seq {
                    rows: 3,
                    ids: vec![7, 8],
                },
                Seq {
                    rows: 1,
                    ids: vec![9, 10],
                },
            ],
            dtype: 10,
        };
        let (h, w) = f.encode().unwrap();
        assert_eq!(header(&h).unwrap(), (1, w.len(), 4));
        assert_eq!(Frame::decode(&w).unwrap(), f);
        assert!(header(&[9, 1, 1]).is_err());
    }
}
