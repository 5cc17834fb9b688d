//! MLX's distributed backend, as pipeline ranks use it: join the group the
//! launcher described (`MLX_RANK`, `MLX_HOSTFILE` for the ring backend),
//! then point-to-point sends and receives and one all-gather. Every op is
//! lazy like any other; an evaluation that loses its peer fails with MLX's
//! error ("[ring] connection to a peer was lost").
use crate::array::{wrap, Array, Dtype, Result};
use crate::bridge::ffi;

/// Joins the group (once per process; later calls return the same):
/// `(rank, size)`. Blocks until every rank has connected, or fails.
pub fn init(backend: &str) -> Result<(i32, i32)> {
    let v = ffi::dist_init(backend)?;
    Ok((v[0], v[1]))
}

/// Sends `x` to rank `dst` when evaluated.
pub fn send(x: &Array, dst: i32) -> Result<Array> {
    wrap(ffi::dist_send(&x.0, dst))
}

/// An array of `shape` and `dtype` received from rank `src` when evaluated.
pub fn recv(shape: &[i32], dtype: Dtype, src: i32) -> Result<Array> {
    wrap(ffi::dist_recv(shape, dtype as u8, src))
}

/// Every rank's `x`, concatenated along the first axis in rank order.
pub fn all_gather(x: &Array) -> Result<Array> {
    wrap(ffi::dist_all_gather(&x.0))
}
