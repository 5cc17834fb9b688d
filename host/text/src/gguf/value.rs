//! GGUF metadata values: their types, typed arrays, and accessors.

/// Element type of a GGUF metadata value or array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgufType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl GgufType {
    pub(super) fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::U8,
            1 => Self::I8,
            2 => Self::U16,
            3 => Self::I16,
            4 => Self::U32,
            5 => Self::I32,
            6 => Self::F32,
            7 => Self::Bool,
            8 => Self::String,
            9 => Self::Array,
            10 => Self::U64,
            11 => Self::I64,
            12 => Self::F64,
            _ => return None,
        })
    }

    /// Smallest number of bytes one element of this type occupies on disk.
    pub(super) fn min_size(self) -> u64 {
        match self {
            Self::U8 | Self::I8 | Self::Bool => 1,
            Self::U16 | Self::I16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 | Self::String => 8,
            Self::Array => 12,
        }
    }
}

/// The [`GgufType`] of an array's elements or of a value: both enums have
/// one variant per type, of the same name.
macro_rules! type_of {
    ($v:expr) => {
        match $v {
            Self::U8(_) => GgufType::U8,
            Self::I8(_) => GgufType::I8,
            Self::U16(_) => GgufType::U16,
            Self::I16(_) => GgufType::I16,
            Self::U32(_) => GgufType::U32,
            Self::I32(_) => GgufType::I32,
            Self::F32(_) => GgufType::F32,
            Self::Bool(_) => GgufType::Bool,
            Self::String(_) => GgufType::String,
            Self::Array(_) => GgufType::Array,
            Self::U64(_) => GgufType::U64,
            Self::I64(_) => GgufType::I64,
            Self::F64(_) => GgufType::F64,
        }
    };
}

/// A typed GGUF array (arrays are homogeneous; nested arrays are allowed).
#[derive(Clone, Debug, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<GgufArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl GgufArray {
    pub fn len(&self) -> usize {
        match self {
            Self::U8(v) => v.len(),
            Self::I8(v) => v.len(),
            Self::U16(v) => v.len(),
            Self::I16(v) => v.len(),
            Self::U32(v) => v.len(),
            Self::I32(v) => v.len(),
            Self::F32(v) => v.len(),
            Self::Bool(v) => v.len(),
            Self::String(v) => v.len(),
            Self::Array(v) => v.len(),
            Self::U64(v) => v.len(),
            Self::I64(v) => v.len(),
            Self::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn elem_type(&self) -> GgufType {
        type_of!(self)
    }

    /// Integer elements widened to i128 (None for non-integer arrays).
    pub(super) fn ints(&self) -> Option<Vec<i128>> {
        Some(match self {
            Self::U8(v) => v.iter().map(|&x| x as i128).collect(),
            Self::I8(v) => v.iter().map(|&x| x as i128).collect(),
            Self::U16(v) => v.iter().map(|&x| x as i128).collect(),
            Self::I16(v) => v.iter().map(|&x| x as i128).collect(),
            Self::U32(v) => v.iter().map(|&x| x as i128).collect(),
            Self::I32(v) => v.iter().map(|&x| x as i128).collect(),
            Self::U64(v) => v.iter().map(|&x| x as i128).collect(),
            Self::I64(v) => v.iter().map(|&x| x as i128).collect(),
            Self::Bool(v) => v.iter().map(|&x| x as i128).collect(),
            _ => return None,
        })
    }
}

/// One GGUF metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(GgufArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    pub fn value_type(&self) -> GgufType {
        type_of!(self)
    }

    /// Any integer (or bool) value, widened.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Self::U8(x) => x as i128,
            Self::I8(x) => x as i128,
            Self::U16(x) => x as i128,
            Self::I16(x) => x as i128,
            Self::U32(x) => x as i128,
            Self::I32(x) => x as i128,
            Self::U64(x) => x as i128,
            Self::I64(x) => x as i128,
            Self::Bool(x) => x as i128,
            _ => return None,
        })
    }

    /// Any float or integer value as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(x) => Some(x as f64),
            Self::F64(x) => Some(x),
            _ => self.as_i128().map(|x| x as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    pub(super) fn short(&self) -> String {
        match self {
            Self::String(s) if s.len() > 60 => format!("{:?}...", &s[..floor_char(s, 60)]),
            Self::String(s) => format!("{s:?}"),
            Self::Array(a) => format!("[{:?}; {}]", a.elem_type(), a.len()),
            other => format!("{other:?}"),
        }
    }
}

fn floor_char(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}
