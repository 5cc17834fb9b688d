//! A small pure-Rust GGUF reader: header, every metadata key/value, and the
//! tensor info table (name, shape, ggml type, offset). Tensor data is not read
//! (MLX's own GGUF loader does that); we only check that it fits in the file.
//!
//! Every read is bounds-checked against the file length, so a truncated or
//! corrupt file yields an error naming the file and what was being read —
//! never a panic and never a huge allocation.

use anyhow::{anyhow, bail, Context, Result};
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

/// `GGUF` in little-endian byte order.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the tensor data section when `general.alignment` is absent.
pub const GGUF_DEFAULT_ALIGNMENT: u64 = 32;

mod value;
mod write;
pub use value::{GgufArray, GgufType, GgufValue};
pub use write::GgufWriter;

/// ggml tensor element types (the numbering of ggml.h).
pub mod ggml_type {
    pub const F32: u32 = 0;
    pub const F16: u32 = 1;
    pub const Q4_0: u32 = 2;
    pub const Q4_1: u32 = 3;
    pub const Q5_0: u32 = 6;
    pub const Q5_1: u32 = 7;
    pub const Q8_0: u32 = 8;
    pub const Q8_1: u32 = 9;
    pub const Q2_K: u32 = 10;
    pub const Q3_K: u32 = 11;
    pub const Q4_K: u32 = 12;
    pub const Q5_K: u32 = 13;
    pub const Q6_K: u32 = 14;
    pub const Q8_K: u32 = 15;
    pub const I8: u32 = 24;
    pub const I16: u32 = 25;
    pub const I32: u32 = 26;
    pub const I64: u32 = 27;
    pub const F64: u32 = 28;
    pub const BF16: u32 = 30;

    /// Name of a ggml type as ggml prints it ("q4_1", "f32", ...).
    pub fn name(t: u32) -> &'static str {
        match t {
            0 => "f32",
            1 => "f16",
            2 => "q4_0",
            3 => "q4_1",
            6 => "q5_0",
            7 => "q5_1",
            8 => "q8_0",
            9 => "q8_1",
            10 => "q2_K",
            11 => "q3_K",
            12 => "q4_K",
            13 => "q5_K",
            14 => "q6_K",
            15 => "q8_K",
            16 => "iq2_xxs",
            17 => "iq2_xs",
            18 => "iq3_xxs",
            19 => "iq1_s",
            20 => "iq4_nl",
            21 => "iq3_s",
            22 => "iq2_s",
            23 => "iq4_xs",
            24 => "i8",
            25 => "i16",
            26 => "i32",
            27 => "i64",
            28 => "f64",
            29 => "iq1_m",
            30 => "bf16",
            34 => "tq1_0",
            35 => "tq2_0",
            39 => "mxfp4",
            _ => "unknown",
        }
    }

    /// (elements per block, bytes per block) for the types whose layout we know.
    pub fn block(t: u32) -> Option<(u64, u64)> {
        Some(match t {
            F32 => (1, 4),
            F16 | BF16 => (1, 2),
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q8_1 => (32, 36),
            Q2_K => (256, 84),
            Q3_K => (256, 110),
            Q4_K => (256, 144),
            Q5_K => (256, 176),
            Q6_K => (256, 210),
            Q8_K => (256, 292),
            I8 => (1, 1),
            I16 => (1, 2),
            I32 => (1, 4),
            I64 | F64 => (1, 8),
            _ => return None,
        })
    }
}

/// One entry of the tensor info table.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in GGUF order (ne[0] first: the fastest-varying dimension).
    pub shape: Vec<u64>,
    /// ggml type id, see [`ggml_type`].
    pub ggml_type: u32,
    /// Offset of the data relative to [`GgufMeta::data_offset`].
    pub offset: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().fold(1u64, |a, &d| a.saturating_mul(d))
    }

    /// Size in bytes of the tensor data, when the ggml type's layout is known.
    pub fn n_bytes(&self) -> Option<u64> {
        let (be, bb) = ggml_type::block(self.ggml_type)?;
        let n = self.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
        n.div_ceil(be).checked_mul(bb)
    }

    pub fn type_name(&self) -> &'static str {
        ggml_type::name(self.ggml_type)
    }
}

/// Everything in a GGUF file except the tensor data.
#[derive(Clone, Debug)]
pub struct GgufMeta {
    pub path: PathBuf,
    pub version: u32,
    /// Metadata in file order.
    pub kv: Vec<(String, GgufValue)>,
    index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute file offset of the tensor data section.
    pub data_offset: u64,
    pub file_size: u64,
}

/// Entry point: `GgufFile::open(path)`.
pub struct GgufFile;

impl GgufFile {
    /// Read the header, all metadata and the tensor info table of a GGUF file.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufMeta> {
        GgufMeta::open(path)
    }
}

struct Reader<R: Read> {
    r: R,
    pos: u64,
    len: u64,
}

impl<R: Read> Reader<R> {
    fn remaining(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    fn bytes(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<Vec<u8>> {
        if n > self.remaining() {
            bail!(
                "truncated or corrupt file: {} needs {} bytes at offset {} but the file has {} bytes",
                what(),
                n,
                self.pos,
                self.len
            );
        }
        let mut buf = vec![0u8; n as usize];
        self.r
            .read_exact(&mut buf)
            .with_context(|| format!("reading {} at offset {}", what(), self.pos))?;
        self.pos += n;
        Ok(buf)
    }

    fn arr<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let b = self.bytes(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(&b);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let n = self.u64(&|| format!("length of {}", what()))?;
        let b = self.bytes(n, what)?;
        // Keep going on invalid UTF-8 (some converters write raw bytes).
        Ok(match String::from_utf8(b) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    fn count(&mut self, elem: GgufType, what: &dyn Fn() -> String) -> Result<u64> {
        let n = self.u64(&|| format!("element count of {}", what()))?;
        // Reject counts that cannot fit in what is left of the file before
        // allocating anything.
        if n.checked_mul(elem.min_size())
            .is_none_or(|need| need > self.remaining())
        {
            bail!(
                "truncated or corrupt file: {} claims {} elements of type {:?} at offset {}, more than the {} bytes left",
                what(),
                n,
                elem,
                self.pos,
                self.remaining()
            );
        }
        Ok(n)
    }

    fn vtype(&mut self, what: &dyn Fn() -> String) -> Result<GgufType> {
        let at = self.pos;
        let t = self.u32(&|| format!("value type of {}", what()))?;
        GgufType::from_u32(t).ok_or_else(|| {
            anyhow!(
                "corrupt file: unknown value type {} for {} at offset {}",
                t,
                what(),
                at
            )
        })
    }

    fn value(&mut self, t: GgufType, what: &dyn Fn() -> String, depth: u32) -> Result<GgufValue> {
        Ok(match t {
            GgufType::U8 => GgufValue::U8(self.arr::<1>(what)?[0]),
            GgufType::I8 => GgufValue::I8(self.arr::<1>(what)?[0] as i8),
            GgufType::U16 => GgufValue::U16(u16::from_le_bytes(self.arr(what)?)),
            GgufType::I16 => GgufValue::I16(i16::from_le_bytes(self.arr(what)?)),
            GgufType::U32 => GgufValue::U32(self.u32(what)?),
            GgufType::I32 => GgufValue::I32(i32::from_le_bytes(self.arr(what)?)),
            GgufType::F32 => GgufValue::F32(f32::from_le_bytes(self.arr(what)?)),
            GgufType::Bool => GgufValue::Bool(self.arr::<1>(what)?[0] != 0),
            GgufType::String => GgufValue::String(self.string(what)?),
            GgufType::U64 => GgufValue::U64(self.u64(what)?),
            GgufType::I64 => GgufValue::I64(i64::from_le_bytes(self.arr(what)?)),
            GgufType::F64 => GgufValue::F64(f64::from_le_bytes(self.arr(what)?)),
            GgufType::Array => GgufValue::Array(self.array(what, depth)?),
        })
    }

    fn array(&mut self, what: &dyn Fn() -> String, depth: u32) -> Result<GgufArray> {
        if depth > 8 {
            bail!("corrupt file: arrays nested too deeply in {}", what());
        }
        let et = self.vtype(&|| format!("array element of {}", what()))?;
        let n = self.count(et, what)?;
        macro_rules! prim {
            ($variant:ident, $ty:ty, $sz:expr) => {{
                let b = self.bytes(n * $sz, what)?;
                GgufArray::$variant(
                    b.chunks_exact($sz)
                        .map(|c| <$ty>::from_le_bytes(c.try_into().unwrap()))
                        .collect(),
                )
            }};
        }
        Ok(match et {
            GgufType::U8 => GgufArray::U8(self.bytes(n, what)?),
            GgufType::I8 => {
                GgufArray::I8(self.bytes(n, what)?.into_iter().map(|b| b as i8).collect())
            }
            GgufType::Bool => {
                GgufArray::Bool(self.bytes(n, what)?.into_iter().map(|b| b != 0).collect())
            }
            GgufType::U16 => prim!(U16, u16, 2),
            GgufType::I16 => prim!(I16, i16, 2),
            GgufType::U32 => prim!(U32, u32, 4),
            GgufType::I32 => prim!(I32, i32, 4),
            GgufType::F32 => prim!(F32, f32, 4),
            GgufType::U64 => prim!(U64, u64, 8),
            GgufType::I64 => prim!(I64, i64, 8),
            GgufType::F64 => prim!(F64, f64, 8),
            GgufType::String => {
                let mut v = Vec::with_capacity(n as usize);
                for i in 0..n {
                    v.push(self.string(&|| format!("element {i} of {}", what()))?);
                }
                GgufArray::String(v)
            }
            GgufType::Array => {
                let mut v = Vec::with_capacity(n as usize);
                for i in 0..n {
                    v.push(self.array(&|| format!("element {i} of {}", what()), depth + 1)?);
                }
                GgufArray::Array(v)
            }
        })
    }
}

impl GgufMeta {
    /// Read the header, all metadata and the tensor info table of a GGUF file.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufMeta> {
        let path = path.as_ref();
        let f = File::open(path)
            .with_context(|| format!("cannot open GGUF file {}", path.display()))?;
        let len = f
            .metadata()
            .with_context(|| format!("cannot stat GGUF file {}", path.display()))?
            .len();
        Self::from_reader(BufReader::with_capacity(1 << 20, f), len, path)
            .with_context(|| format!("invalid GGUF file {}", path.display()))
    }

    /// Parse GGUF metadata from an in-memory copy of (at least the head of) a
    /// file whose full length is `bytes.len()`.
    pub fn from_bytes(bytes: &[u8], name: impl AsRef<Path>) -> Result<GgufMeta> {
        let name = name.as_ref();
        Self::from_reader(bytes, bytes.len() as u64, name)
            .with_context(|| format!("invalid GGUF file {}", name.display()))
    }

    /// Parse from a reader positioned at the start of a file of length `len`.
    pub fn from_reader<R: Read>(r: R, len: u64, path: &Path) -> Result<GgufMeta> {
        let mut r = Reader { r, pos: 0, len };
        let magic: [u8; 4] = r.arr(&|| "magic".into())?;
        if magic != GGUF_MAGIC {
            bail!("not a GGUF file (magic {:02x?}, expected \"GGUF\")", magic);
        }
        let version = r.u32(&|| "version".into())?;
        if !(2..=3).contains(&version) {
            bail!("unsupported GGUF version {version} (supported: 2, 3)");
        }
        let n_tensors = r.u64(&|| "tensor count".into())?;
        let n_kv = r.u64(&|| "metadata count".into())?;
        // Every kv needs at least 8 (key len) + 4 (type) + 1 bytes; every
        // tensor at least 8 + 4 + 4 + 8.
        if n_kv.saturating_mul(13) > r.remaining() || n_tensors.saturating_mul(24) > r.remaining() {
            bail!(
                "truncated or corrupt file: header claims {n_kv} metadata entries and {n_tensors} tensors, more than fit in {} bytes",
                len
            );
        }
        let mut kv = Vec::with_capacity(n_kv as usize);
        let mut index = HashMap::with_capacity(n_kv as usize);
        for i in 0..n_kv {
            let key = r.string(&|| format!("key of metadata entry {i}"))?;
            let t = r.vtype(&|| format!("metadata key '{key}'"))?;
            let v = r.value(t, &|| format!("value of metadata key '{key}'"), 0)?;
            // Like gguf-py: on a duplicate key the later value wins.
            if let Some(&j) = index.get(&key) {
                kv[j] = (key, v);
            } else {
                index.insert(key.clone(), kv.len());
                kv.push((key, v));
            }
        }
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = r.string(&|| format!("name of tensor {i}"))?;
            let what = || format!("tensor '{name}'");
            let n_dims = r.u32(&|| format!("dimension count of {}", what()))?;
            if n_dims > 8 {
                bail!(
                    "corrupt file: {} has {} dimensions (at most 8 allowed)",
                    what(),
                    n_dims
                );
            }
            let mut shape = Vec::with_capacity(n_dims as usize);
            for d in 0..n_dims {
                shape.push(r.u64(&|| format!("dimension {d} of {}", what()))?);
            }
            let ggml_type = r.u32(&|| format!("type of {}", what()))?;
            let offset = r.u64(&|| format!("data offset of {}", what()))?;
            if shape
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .is_none()
            {
                bail!(
                    "corrupt file: {} has an overflowing shape {:?}",
                    what(),
                    shape
                );
            }
            tensors.push(TensorInfo {
                name,
                shape,
                ggml_type,
                offset,
            });
        }
        let mut meta = GgufMeta {
            path: path.to_path_buf(),
            version,
            kv,
            index,
            tensors,
            alignment: GGUF_DEFAULT_ALIGNMENT,
            data_offset: 0,
            file_size: len,
        };
        if meta.contains("general.alignment") {
            let a = meta.get_u64("general.alignment")?;
            if a == 0 || !a.is_power_of_two() {
                bail!("corrupt file: general.alignment = {a} is not a power of two");
            }
            meta.alignment = a;
        }
        meta.data_offset = r.pos.div_ceil(meta.alignment) * meta.alignment;
        for t in &meta.tensors {
            if ggml_type::block(t.ggml_type).is_some() && t.n_bytes().is_none() {
                bail!(
                    "corrupt file: tensor '{}' of shape {:?} is too large",
                    t.name,
                    t.shape
                );
            }
            if let Some(nb) = t.n_bytes() {
                let end = meta
                    .data_offset
                    .checked_add(t.offset)
                    .and_then(|x| x.checked_add(nb));
                if end.is_none_or(|e| e > len) {
                    bail!(
                        "truncated or corrupt file: data of tensor '{}' ({} bytes at offset {}) runs past the end of the file ({} bytes)",
                        t.name,
                        nb,
                        meta.data_offset.saturating_add(t.offset),
                        len
                    );
                }
            }
        }
        Ok(meta)
    }

    fn err_ctx(&self) -> String {
        format!("GGUF file {}", self.path.display())
    }

    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.index.get(key).map(|&i| &self.kv[i].1)
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.kv.iter().map(|(k, _)| k.as_str())
    }

    fn need(&self, key: &str) -> Result<&GgufValue> {
        self.get(key)
            .ok_or_else(|| anyhow!("{}: missing metadata key '{}'", self.err_ctx(), key))
    }

    fn wrong(&self, key: &str, want: &str, v: &GgufValue) -> anyhow::Error {
        anyhow!(
            "{}: metadata key '{}' should be {} but is {:?} ({})",
            self.err_ctx(),
            key,
            want,
            v.value_type(),
            v.short()
        )
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.need(key)?;
        v.as_str().ok_or_else(|| self.wrong(key, "a string", v))
    }

    fn get_int<T: TryFrom<i128>>(&self, key: &str, tname: &str) -> Result<T> {
        let v = self.need(key)?;
        let i = v
            .as_i128()
            .ok_or_else(|| self.wrong(key, &format!("an integer ({tname})"), v))?;
        T::try_from(i).map_err(|_| {
            anyhow!(
                "{}: metadata key '{}' = {} does not fit in {}",
                self.err_ctx(),
                key,
                i,
                tname
            )
        })
    }

    /// Any integer type, checked to fit in u32.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.get_int(key, "u32")
    }

    /// Any integer type, checked to fit in u64.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.get_int(key, "u64")
    }

    /// Any integer type, checked to fit in i64.
    pub fn get_i64(&self, key: &str) -> Result<i64> {
        self.get_int(key, "i64")
    }

    /// f32/f64 (or an integer) as f32.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.need(key)?;
        v.as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| self.wrong(key, "a number", v))
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        match self.need(key)? {
            GgufValue::Bool(b) => Ok(*b),
            v => Err(self.wrong(key, "a bool", v)),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<&GgufArray> {
        match self.need(key)? {
            GgufValue::Array(a) => Ok(a),
            v => Err(self.wrong(key, "an array", v)),
        }
    }

    pub fn get_str_array(&self, key: &str) -> Result<&[String]> {
        match self.get_array(key)? {
            GgufArray::String(s) => Ok(s),
            a => Err(anyhow!(
                "{}: metadata key '{}' should be an array of strings but is an array of {:?}",
                self.err_ctx(),
                key,
                a.elem_type()
            )),
        }
    }

    /// Array of any integer type, each checked to fit in i32.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        let a = self.get_array(key)?;
        let ints = a.ints().ok_or_else(|| {
            anyhow!(
                "{}: metadata key '{}' should be an array of integers but is an array of {:?}",
                self.err_ctx(),
                key,
                a.elem_type()
            )
        })?;
        ints.into_iter()
            .enumerate()
            .map(|(i, x)| {
                i32::try_from(x).map_err(|_| {
                    anyhow!(
                        "{}: element {} of metadata key '{}' = {} does not fit in i32",
                        self.err_ctx(),
                        i,
                        key,
                        x
                    )
                })
            })
            .collect()
    }

    /// Array of f32/f64 (or integers) as f32.
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        let a = self.get_array(key)?;
        match a {
            GgufArray::F32(v) => Ok(v.clone()),
            GgufArray::F64(v) => Ok(v.iter().map(|&x| x as f32).collect()),
            other => other
                .ints()
                .map(|v| v.into_iter().map(|x| x as f32).collect())
                .ok_or_else(|| {
                    anyhow!(
                        "{}: metadata key '{}' should be an array of numbers but is an array of {:?}",
                        self.err_ctx(),
                        key,
                        other.elem_type()
                    )
                }),
        }
    }

    /// `general.architecture` (e.g. "llama").
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

impl fmt::Display for GgufMeta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: GGUF v{}, {} metadata keys, {} tensors, data at {}",
            self.path.display(),
            self.version,
            self.kv.len(),
            self.tensors.len(),
            self.data_offset
        )?;
        for (k, v) in &self.kv {
            writeln!(f, "  {k} = {}", v.short())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push_str(b: &mut Vec<u8>, s: &str) {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    }

    /// A synthetic file exercising every value type.
    pub(crate) fn synthetic() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(b"GGUF");
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes()); // tensors
        b.extend(15u64.to_le_bytes()); // kvs
        let kv = |b: &mut Vec<u8>, k: &str, t: u32, v: &[u8]| {
            push_str(b, k);
            b.extend(t.to_le_bytes());
            b.extend(v);
        };
        kv(&mut b, "u8", 0, &[7]);
        kv(&mut b, "i8", 1, &[0xff]);
        kv(&mut b, "u16", 2, &500u16.to_le_bytes());
        kv(&mut b, "i16", 3, &(-500i16).to_le_bytes());
        kv(&mut b, "u32", 4, &70000u32.to_le_bytes());
        kv(&mut b, "i32", 5, &(-70000i32).to_le_bytes());
        kv(&mut b, "f32", 6, &1.5f32.to_le_bytes());
        kv(&mut b, "bool", 7, &[1]);
        let mut s = Vec::new();
        push_str(&mut s, "héllo");
        kv(&mut b, "str", 8, &s);
        kv(&mut b, "u64", 10, &(1u64 << 40).to_le_bytes());
        kv(&mut b, "i64", 11, &(-5i64).to_le_bytes());
        kv(&mut b, "f64", 12, &2.25f64.to_le_bytes());
        let mut a = Vec::new();
        a.extend(8u32.to_le_bytes());
        a.extend(2u64.to_le_bytes());
        push_str(&mut a, "a");
        push_str(&mut a, "<|im_end|>");
        kv(&mut b, "strs", 9, &a);
        let mut a = Vec::new();
        a.extend(5u32.to_le_bytes());
        a.extend(3u64.to_le_bytes());
        for x in [1i32, -2, 3] {
            a.extend(x.to_le_bytes());
        }
        kv(&mut b, "i32s", 9, &a);
        let mut a = Vec::new();
        a.extend(9u32.to_le_bytes());
        a.extend(1u64.to_le_bytes());
        a.extend(6u32.to_le_bytes());
        a.extend(2u64.to_le_bytes());
        a.extend(0.5f32.to_le_bytes());
        a.extend(0.25f32.to_le_bytes());
        kv(&mut b, "nested", 9, &a);
        // tensor: 4x2 f32 at offset 0
        push_str(&mut b, "w");
        b.extend(2u32.to_le_bytes());
        b.extend(4u64.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        while b.len() % 32 != 0 {
            b.push(0);
        }
        b.extend([0u8; 32]);
        b
    }

    #[test]
    fn parses_every_type() {
        let b = synthetic();
        let m = GgufMeta::from_bytes(&b, "synthetic.gguf").unwrap();
        assert_eq!(m.get_u32("u8").unwrap(), 7);
        assert_eq!(m.get_i64("i8").unwrap(), -1);
        assert!(m.get_u32("i8").is_err());
        assert_eq!(m.get_u32("u16").unwrap(), 500);
        assert_eq!(m.get_i64("i16").unwrap(), -500);
        assert_eq!(m.get_u64("u32").unwrap(), 70000);
        assert_eq!(m.get_i64("i32").unwrap(), -70000);
        assert_eq!(m.get_f32("f32").unwrap(), 1.5);
        assert!(m.get_bool("bool").unwrap());
        assert_eq!(m.get_str("str").unwrap(), "héllo");
        assert_eq!(m.get_u64("u64").unwrap(), 1 << 40);
        assert!(m.get_u32("u64").is_err());
        assert_eq!(m.get_f32("f64").unwrap(), 2.25);
        assert_eq!(m.get_str_array("strs").unwrap(), &["a", "<|im_end|>"]);
        assert_eq!(m.get_i32_array("i32s").unwrap(), vec![1, -2, 3]);
        assert_eq!(m.get_f32_array("i32s").unwrap(), vec![1.0, -2.0, 3.0]);
        match m.get_array("nested").unwrap() {
            GgufArray::Array(v) => assert_eq!(v[0], GgufArray::F32(vec![0.5, 0.25])),
            other => panic!("{other:?}"),
        }
        assert_eq!(m.tensors.len(), 1);
        assert_eq!(m.tensors[0].shape, vec![4, 2]);
        assert_eq!(m.tensors[0].n_bytes(), Some(32));
        assert_eq!(m.data_offset % 32, 0);
        let e = m.get_str("u32").unwrap_err().to_string();
        assert!(e.contains("synthetic.gguf") && e.contains("'u32'"), "{e}");
        let e = m.get_str("nope").unwrap_err().to_string();
        assert!(e.contains("missing") && e.contains("'nope'"), "{e}");
    }

    #[test]
    fn every_truncation_is_an_error() {
        let b = synthetic();
        for n in 0..b.len() {
            let e = GgufMeta::from_bytes(&b[..n], "cut.gguf");
            let e = e.expect_err(&format!("truncation at {n} parsed"));
            let msg = format!("{e:#}");
            assert!(msg.contains("cut.gguf"), "{msg}");
        }
    }

    #[test]
    fn byte_corruption_never_panics() {
        let b = synthetic();
        // Deterministic xorshift "fuzz": flip bytes, set them to extremes.
        let mut s = 0x9e3779b97f4a7c15u64;
        for _ in 0..4000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let mut c = b.clone();
            let i = (s % c.len() as u64) as usize;
            c[i] = match (s >> 32) % 3 {
                0 => 0xff,
                1 => c[i] ^ (1 << ((s >> 40) % 8)),
                _ => (s >> 48) as u8,
            };
            let _ = GgufMeta::from_bytes(&c, "fuzz.gguf");
        }
    }
}
