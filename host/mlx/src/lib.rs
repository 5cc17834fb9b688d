//! Safe Rust over MLX's C++ API, shaped like mlx-rs (`Array`, ops, `fast::*`)
//! so model code reads like MLX code elsewhere. The C++ side is a thin shim
//! (`shim.cc`); C++ exceptions surface as [`Exception`].
//!
//! On Linux the build links OpenBLAS ahead of the wheel's reference BLAS:
//! MLX's CPU matmul then costs ~1.5x for 8 rows instead of ~8x (see
//! `specd bench blas`).

/// Wrappers over shim functions that take arrays and plain values and
/// return an array: each hands its arguments on (an [`Array`] as its C++
/// array, see [`array::Shim`]), turns a C++ exception into [`Exception`]
/// and wraps the result, so a wrapper is its signature alone. The shim
/// function has the wrapper's name unless `as NAME` says otherwise.
macro_rules! shim_fns {
    ($( $(#[$m:meta])* pub fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(as $ffi:ident)?; )*) => {$(
        shim_fns!(@one $(#[$m])* $name ($($arg: $ty),*) [$($ffi)? $name]);
    )*};
    (@one $(#[$m:meta])* $name:ident ($($arg:ident: $ty:ty),*) [$ffi:ident $($_same:ident)?]) => {
        $(#[$m])*
        pub fn $name($($arg: $ty),*) -> $crate::Result<$crate::Array> {
            $crate::array::wrap($crate::bridge::ffi::$ffi($($crate::array::Shim::shim($arg)),*))
        }
    };
}

mod array;
mod bridge;
pub mod distributed;
pub mod fast;
pub mod io;
pub mod kernels;
pub mod memory;
pub mod ops;
pub mod random;

pub use array::{Array, Dtype, Exception, Result};
pub use io::TensorFile;

use array::list;
use bridge::ffi;

/// Evaluates several arrays together (one graph walk).
pub fn eval(xs: &[&Array]) -> Result<()> {
    Ok(ffi::eval(&list(xs.iter().copied()))?)
}

/// Starts evaluating in the background; a later `eval` or read waits for it.
pub fn async_eval(xs: &[&Array]) -> Result<()> {
    Ok(ffi::async_eval(&list(xs.iter().copied()))?)
}

/// Whether this build links an MLX that runs on a GPU (the CUDA wheel, or
/// Metal on macOS): there specd's CPU kernels do not run.
pub const GPU_BUILD: bool = cfg!(any(feature = "cuda", target_os = "macos"));

/// The memory of the GPU that is MLX's default device, in bytes; 0 when
/// the default device is the CPU (or MLX does not say).
pub fn gpu_memory() -> u64 {
    ffi::gpu_memory()
}

/// "cpu" or "gpu".
pub fn default_device() -> String {
    ffi::default_device()
}
pub fn version() -> String {
    ffi::mlx_version()
}
/// The BLAS behind MLX's CPU matmul (OpenBLAS on Linux), and its threads.
pub fn blas_config() -> String {
    ffi::blas_config()
}
pub fn blas_threads() -> i32 {
    ffi::blas_threads()
}
pub fn set_blas_threads(n: i32) {
    ffi::set_blas_threads(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_and_shapes() {
        let a = Array::from_f32(&[1., 2., 3., 4., 5., 6.], &[2, 3]).unwrap();
        let b = Array::from_f32(&[1., 0., 0., 1., 1., 1.], &[3, 2]).unwrap();
        let c = ops::matmul(&a, &b).unwrap();
        assert_eq!(c.shape(), vec![2, 2]);
        assert_eq!(c.to_vec_f32().unwrap(), vec![4., 5., 10., 11.]);
        assert_eq!(a.t().unwrap().shape(), vec![3, 2]);
        let s = a.slice(&[0, 1], &[2, 3]).unwrap();
        assert_eq!(s.to_vec_f32().unwrap(), vec![2., 3., 5., 6.]);
        // Strided views read back in logical order; a row slice where it lies.
        assert_eq!(
            a.t().unwrap().to_vec_f32().unwrap(),
            vec![1., 4., 2., 5., 3., 6.]
        );
        let row = a.slice(&[1, 0], &[2, 3]).unwrap();
        row.eval().unwrap();
        assert_eq!(row.to_vec_f32().unwrap(), vec![4., 5., 6.]);
    }

    #[test]
    fn errors_are_results() {
        let a = Array::from_f32(&[1., 2.], &[2]).unwrap();
        let b = Array::from_f32(&[1., 2., 3.], &[3]).unwrap();
        let e = ops::add(&a, &b).unwrap_err();
        assert!(e.0.contains("broadcast") || e.0.contains("shape"), "{e}");
        assert!(Array::from_f32(&[1., 2.], &[3]).is_err());
        assert!(io::load_gguf(std::path::Path::new("/nonexistent.gguf")).is_err());
    }

    #[test]
    fn softmax_argmax_take() {
        let x = Array::from_f32(&[0., 1., 3., 2.], &[1, 4]).unwrap();
        let p = ops::softmax(&x, -1, true).unwrap().to_vec_f32().unwrap();
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(
            ops::argmax(&x, -1, false).unwrap().to_vec_i32().unwrap(),
            vec![2]
        );
        let idx = Array::from_i32(&[3, 0], &[2]).unwrap();
        let t = ops::take(&x, &idx, 1).unwrap().to_vec_f32().unwrap();
        assert_eq!(t, vec![2., 0.]);
    }

    #[test]
    fn blas_is_openblas_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(blas_config().starts_with("OpenBLAS"), "{}", blas_config());
            assert!(blas_threads() >= 1);
        }
    }
}
