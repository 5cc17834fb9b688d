//! Writing GGUF files (version 3), as `specd debug random-model --gguf`
//! does: the metadata and the tensor table first, then each tensor's bytes
//! as the caller makes them, in table order (a 1B model's weights never all
//! live at once). The reader ([`super::GgufMeta`]) reads back what this
//! writes.
use super::{ggml_type, GgufArray, GgufValue, TensorInfo, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC};
use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// A GGUF file being written: the header is out, the tensors' bytes follow.
pub struct GgufWriter {
    path: PathBuf,
    out: BufWriter<File>,
    tensors: Vec<TensorInfo>,
    /// The next tensor to write.
    next: usize,
    /// Bytes of the data section written so far.
    written: u64,
}

fn string(out: &mut impl Write, s: &str) -> std::io::Result<()> {
    out.write_all(&(s.len() as u64).to_le_bytes())?;
    out.write_all(s.as_bytes())
}

fn array(out: &mut impl Write, a: &GgufArray) -> std::io::Result<()> {
    out.write_all(&(a.elem_type() as u32).to_le_bytes())?;
    out.write_all(&(a.len() as u64).to_le_bytes())?;
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                out.write_all(&x.to_le_bytes())?;
            }
        };
    }
    match a {
        GgufArray::U8(v) => each!(v),
        GgufArray::I8(v) => each!(v),
        GgufArray::U16(v) => each!(v),
        GgufArray::I16(v) => each!(v),
        GgufArray::U32(v) => each!(v),
        GgufArray::I32(v) => each!(v),
        GgufArray::F32(v) => each!(v),
        GgufArray::U64(v) => each!(v),
        GgufArray::I64(v) => each!(v),
        GgufArray::F64(v) => each!(v),
        GgufArray::Bool(v) => each!(v.iter().map(|&b| b as u8)),
        GgufArray::String(v) => {
            for s in v {
                string(out, s)?;
            }
        }
        GgufArray::Array(v) => {
            for x in v {
                array(out, x)?;
            }
        }
    }
    Ok(())
}

fn value(out: &mut impl Write, v: &GgufValue) -> std::io::Result<()> {
    out.write_all(&(v.value_type() as u32).to_le_bytes())?;
    match v {
        GgufValue::U8(x) => out.write_all(&x.to_le_bytes()),
        GgufValue::I8(x) => out.write_all(&x.to_le_bytes()),
        GgufValue::U16(x) => out.write_all(&x.to_le_bytes()),
        GgufValue::I16(x) => out.write_all(&x.to_le_bytes()),
        GgufValue::U32(x) => out.write_all(&x.to_le_bytes()),
        GgufValue::I32(x) => out.write_all(&x.to_le_bytes()),
        GgufValue::F32(x) => out.write_all(&x.to_le_bytes()),
        GgufValue::U64(x) => out.write_all(&x.to_le_bytes()),
        GgufValue::I64(x) => out.write_all(&x.to_le_bytes()),
        GgufValue::F64(x) => out.write_all(&x.to_le_bytes()),
        GgufValue::Bool(x) => out.write_all(&[*x as u8]),
        GgufValue::String(s) => string(out, s),
        GgufValue::Array(a) => array(out, a),
    }
}

fn pad(out: &mut impl Write, at: u64) -> std::io::Result<u64> {
    let n = at.next_multiple_of(GGUF_DEFAULT_ALIGNMENT) - at;
    out.write_all(&vec![0u8; n as usize])?;
    Ok(n)
}

impl GgufWriter {
    /// Creates `path` with the metadata `kv` and a table of `tensors`
    /// (shapes in GGUF order, the fastest dimension first; offsets are
    /// set here).
    pub fn create(
        path: &Path,
        kv: &[(String, GgufValue)],
        tensors: Vec<(String, Vec<u64>, u32)>,
    ) -> Result<GgufWriter> {
        let mut infos = Vec::with_capacity(tensors.len());
        let mut offset = 0u64;
        for (name, shape, ggml_type) in tensors {
            let t = TensorInfo {
                name,
                shape,
                ggml_type,
                offset,
            };
            let n = t.n_bytes().with_context(|| {
                format!(
                    "tensor {}: {} values are not whole {} blocks",
                    t.name,
                    t.n_elements(),
                    ggml_type::name(t.ggml_type)
                )
            })?;
            let block = ggml_type::block(t.ggml_type).map_or(1, |b| b.0);
            if t.shape.first().copied().unwrap_or(1) % block != 0 {
                bail!(
                    "tensor {}: rows are not whole {} blocks",
                    t.name,
                    t.type_name()
                );
            }
            offset = (offset + n).next_multiple_of(GGUF_DEFAULT_ALIGNMENT);
            infos.push(t);
        }
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut out = BufWriter::new(file);
        let io = |e: std::io::Error| anyhow::anyhow!("writing {}: {e}", path.display());
        let mut head = Vec::new();
        head.extend(GGUF_MAGIC);
        head.extend(3u32.to_le_bytes());
        head.extend((infos.len() as u64).to_le_bytes());
        head.extend((kv.len() as u64).to_le_bytes());
        for (k, v) in kv {
            string(&mut head, k).map_err(io)?;
            value(&mut head, v).map_err(io)?;
        }
        for t in &infos {
            string(&mut head, &t.name).map_err(io)?;
            head.extend((t.shape.len() as u32).to_le_bytes());
            for d in &t.shape {
                head.extend(d.to_le_bytes());
            }
            head.extend(t.ggml_type.to_le_bytes());
            head.extend(t.offset.to_le_bytes());
        }
        out.write_all(&head).map_err(io)?;
        pad(&mut out, head.len() as u64).map_err(io)?;
        Ok(GgufWriter {
            path: path.to_path_buf(),
            out,
            tensors: infos,
            next: 0,
            written: 0,
        })
    }

    /// The bytes of tensor `name`, the next one of the table.
    pub fn tensor(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let Some(t) = self.tensors.get(self.next) else {
            bail!(
                "tensor {name}: the table holds {} tensors",
                self.tensors.len()
            );
        };
        if t.name != name {
            bail!("tensor {name} written where the table has {}", t.name);
        }
        let want = t.n_bytes().unwrap_or(0);
        if bytes.len() as u64 != want {
            bail!(
                "tensor {name}: {} bytes, its shape and type take {want}",
                bytes.len()
            );
        }
        let io = |e: std::io::Error| anyhow::anyhow!("writing {}: {e}", self.path.display());
        self.out.write_all(bytes).map_err(io)?;
        self.written += want;
        self.written += pad(&mut self.out, self.written).map_err(io)?;
        self.next += 1;
        Ok(())
    }

    /// Flushes the file; every tensor of the table must have been written.
    pub fn finish(mut self) -> Result<()> {
        if self.next != self.tensors.len() {
            bail!(
                "{}: {} of {} tensors written",
                self.path.display(),
                self.next,
                self.tensors.len()
            );
        }
        self.out
            .flush()
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufMeta;

    #[test]
    fn what_is_written_reads_back() {
        let dir = std::env::temp_dir().join(format!("specd-gguf-write-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.gguf");
        let kv = vec![
            (
                "general.architecture".to_string(),
                GgufValue::String("llama".into()),
            ),
            ("llama.block_count".to_string(), GgufValue::U32(2)),
            ("llama.rope.freq_base".to_string(), GgufValue::F32(5e5)),
            (
                "tokenizer.ggml.tokens".to_string(),
                GgufValue::Array(GgufArray::String(vec!["a".into(), "b".into()])),
            ),
        ];
        let tensors = vec![
            ("a.weight".to_string(), vec![3, 2], ggml_type::F32),
            ("b.weight".to_string(), vec![32, 1], ggml_type::Q8_0),
        ];
        let mut w = GgufWriter::create(&path, &kv, tensors).unwrap();
        assert!(w.tensor("b.weight", &[0; 34]).is_err(), "out of order");
        w.tensor("a.weight", &[1; 24]).unwrap();
        assert!(w.tensor("b.weight", &[0; 33]).is_err(), "wrong size");
        w.tensor("b.weight", &[2; 34]).unwrap();
        w.finish().unwrap();
        let m = GgufMeta::open(&path).unwrap();
        assert_eq!(m.architecture().unwrap(), "llama");
        assert_eq!(m.get_u32("llama.block_count").unwrap(), 2);
        assert_eq!(m.get_f32("llama.rope.freq_base").unwrap(), 5e5);
        assert_eq!(
            m.get_str_array("tokenizer.ggml.tokens").unwrap(),
            ["a", "b"]
        );
        assert_eq!(m.tensors.len(), 2);
        assert_eq!(
            (m.tensors[1].shape.clone(), m.tensors[1].offset),
            (vec![32, 1], 32)
        );
        let bytes = std::fs::read(&path).unwrap();
        let at = (m.data_offset + m.tensors[1].offset) as usize;
        assert_eq!(&bytes[at..at + 34], &[2; 34]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
