//! Arrays, dtypes and MLX errors.

use crate::bridge::ffi;
use std::fmt;

/// An error thrown by MLX (shape mismatch, unreadable file, ...).
#[derive(Debug, Clone, thiserror::Error)]
#[error("mlx: {0}")]
pub struct Exception(pub String);

impl From<cxx::Exception> for Exception {
    fn from(e: cxx::Exception) -> Self {
        Exception(e.what().to_string())
    }
}

pub type Result<T> = std::result::Result<T, Exception>;

/// MLX dtypes, in the order of `mlx::core::Dtype::Val`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Dtype {
    Bool = 0,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Float16,
    Float32,
    Float64,
    Bfloat16,
    Complex64,
}

impl Dtype {
    fn from_code(c: u8) -> Dtype {
        use Dtype::*;
        const ALL: [Dtype; 14] = [
            Bool, Uint8, Uint16, Uint32, Uint64, Int8, Int16, Int32, Int64, Float16, Float32,
            Float64, Bfloat16, Complex64,
        ];
        ALL.get(c as usize).copied().unwrap_or(Complex64)
    }

    /// The dtype of a code `dtype as u8` gave; `None` for any other.
    pub fn from_u8(c: u8) -> Option<Dtype> {
        (c <= Dtype::Complex64 as u8).then(|| Dtype::from_code(c))
    }
}

/// A lazily evaluated MLX array (reference counted on the C++ side; cloning
/// is cheap and shares the buffer).
pub struct Array(pub(crate) cxx::UniquePtr<ffi::Array>);

// An mlx::core::array is a shared_ptr (atomic refcount) to data that is
// immutable once evaluated. specd shares evaluated weights between threads
// (Arc<Llama>) and runs one generation at a time, so no graph is built or
// evaluated from two threads at once.
unsafe impl Send for Array {}
unsafe impl Sync for Array {}

impl Clone for Array {
    fn clone(&self) -> Self {
        Array(ffi::clone_array(&self.0))
    }
}

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Array({:?}, {:?})", self.shape(), self.dtype())
    }
}

pub(crate) fn wrap(
    r: std::result::Result<cxx::UniquePtr<ffi::Array>, cxx::Exception>,
) -> Result<Array> {
    Ok(Array(r?))
}

/// An argument as the shim takes it: an [`Array`] as its C++ array, plain
/// values as they are ([`shim_fns`]).
pub(crate) trait Shim {
    type Ffi;
    fn shim(self) -> Self::Ffi;
}

impl<'a> Shim for &'a Array {
    type Ffi = &'a ffi::Array;
    fn shim(self) -> &'a ffi::Array {
        &self.0
    }
}

macro_rules! shim_as_is {
    ($($t:ty),*) => {$(
        impl Shim for $t {
            type Ffi = $t;
            fn shim(self) -> $t {
                self
            }
        }
    )*};
}
shim_as_is!(i32, f32, bool, ffi::Packing);

impl<'a> Shim for &'a [f32] {
    type Ffi = &'a [f32];
    fn shim(self) -> &'a [f32] {
        self
    }
}

impl<'a> Shim for &'a [i32] {
    type Ffi = &'a [i32];
    fn shim(self) -> &'a [i32] {
        self
    }
}

/// Several arrays handed to MLX at once (eval, concatenate).
pub(crate) fn list<'a>(xs: impl IntoIterator<Item = &'a Array>) -> cxx::UniquePtr<ffi::ArrayList> {
    let mut l = ffi::new_list();
    for x in xs {
        ffi::list_push(l.pin_mut(), &x.0);
    }
    l
}

impl Array {
    pub fn from_f32(data: &[f32], shape: &[i32]) -> Result<Array> {
        check_len(data.len(), shape)?;
        wrap(ffi::from_f32(data, shape))
    }
    pub fn from_i32(data: &[i32], shape: &[i32]) -> Result<Array> {
        check_len(data.len(), shape)?;
        wrap(ffi::from_i32(data, shape))
    }
    pub fn from_u32(data: &[u32], shape: &[i32]) -> Result<Array> {
        check_len(data.len(), shape)?;
        wrap(ffi::from_u32(data, shape))
    }
    pub fn scalar(v: f32) -> Result<Array> {
        wrap(ffi::scalar_f32(v))
    }
    pub fn zeros(shape: &[i32], dtype: Dtype) -> Result<Array> {
        wrap(ffi::zeros(shape, dtype as u8))
    }
    pub fn arange(start: i32, stop: i32) -> Result<Array> {
        wrap(ffi::arange_i32(start, stop))
    }
    pub fn shape(&self) -> Vec<i32> {
        ffi::shape(&self.0)
    }
    pub fn dim(&self, axis: i32) -> i32 {
        let s = self.shape();
        let i = if axis < 0 {
            s.len() as i32 + axis
        } else {
            axis
        };
        s[i as usize]
    }
    pub fn ndim(&self) -> usize {
        self.shape().len()
    }
    pub fn size(&self) -> usize {
        self.shape().iter().map(|&d| d as usize).product()
    }
    pub fn dtype(&self) -> Dtype {
        Dtype::from_code(ffi::dtype(&self.0))
    }
    pub fn nbytes(&self) -> usize {
        ffi::nbytes(&self.0)
    }
    /// The address of the first element once evaluated (0 before).
    pub fn data_address(&self) -> usize {
        ffi::data_address(&self.0)
    }
    /// Evaluates and copies out as f32 (converting if needed).
    pub fn to_vec_f32(&self) -> Result<Vec<f32>> {
        let mut v = vec![0f32; self.size()];
        ffi::to_f32(&self.0, &mut v)?;
        Ok(v)
    }
    pub fn to_vec_i32(&self) -> Result<Vec<i32>> {
        let mut v = vec![0i32; self.size()];
        ffi::to_i32(&self.0, &mut v)?;
        Ok(v)
    }
    pub fn to_vec_u32(&self) -> Result<Vec<u32>> {
        let mut v = vec![0u32; self.size()];
        ffi::to_u32(&self.0, &mut v)?;
        Ok(v)
    }
    pub fn item_f32(&self) -> Result<f32> {
        Ok(self.to_vec_f32()?.first().copied().unwrap_or(f32::NAN))
    }
    pub fn eval(&self) -> Result<()> {
        Ok(ffi::eval_one(&self.0)?)
    }
    pub fn as_type(&self, dtype: Dtype) -> Result<Array> {
        wrap(ffi::astype(&self.0, dtype as u8))
    }
    pub fn reshape(&self, shape: &[i32]) -> Result<Array> {
        wrap(ffi::reshape(&self.0, shape))
    }
    pub fn transpose(&self, axes: &[i32]) -> Result<Array> {
        wrap(ffi::transpose(&self.0, axes))
    }
    pub fn swapaxes(&self, a: i32, b: i32) -> Result<Array> {
        wrap(ffi::swapaxes(&self.0, a, b))
    }
    /// The matrix transpose of a 2-D array.
    pub fn t(&self) -> Result<Array> {
        self.transpose(&[1, 0])
    }
    pub fn expand_dims(&self, axis: i32) -> Result<Array> {
        wrap(ffi::expand_dims(&self.0, axis))
    }
    pub fn squeeze(&self, axis: i32) -> Result<Array> {
        wrap(ffi::squeeze(&self.0, axis))
    }
    pub fn slice(&self, start: &[i32], stop: &[i32]) -> Result<Array> {
        wrap(ffi::slice(&self.0, start, stop))
    }
    /// Returns a copy of `self` with `[start, stop)` replaced by `update`.
    pub fn slice_update(&self, update: &Array, start: &[i32], stop: &[i32]) -> Result<Array> {
        wrap(ffi::slice_update(&self.0, &update.0, start, stop))
    }
    pub fn contiguous(&self) -> Result<Array> {
        wrap(ffi::contiguous(&self.0))
    }
}

fn check_len(len: usize, shape: &[i32]) -> Result<()> {
    let want: i64 = shape.iter().map(|&d| d as i64).product();
    if want != len as i64 || shape.iter().any(|&d| d < 0) {
        return Err(Exception(format!(
            "{len} elements do not fill shape {shape:?}"
        )));
    }
    Ok(())
}
