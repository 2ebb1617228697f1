use super::metadata::MetaValue;
use super::{DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::quant::GgmlType;

/// Builds a GGUF (version 3) file in memory: metadata, then tensors with aligned data.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add_meta(&mut self, key: &str, value: MetaValue) -> &mut Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds a tensor; `dims` in ggml order (`dims[0]` is the row length). `data` must already be
    /// in `ty`'s block format.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> &mut Self {
        self.tensors
            .push((name.to_string(), dims.to_vec(), ty, data));
        self
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let alignment = self
            .metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_i64())
            .map(|a| a as usize)
            .unwrap_or(DEFAULT_ALIGNMENT);
        let entries: Vec<HeaderTensor> = self
            .tensors
            .iter()
            .map(|(name, dims, ty, data)| HeaderTensor {
                name,
                dims,
                ty: *ty,
                size: data.len(),
            })
            .collect();
        let (mut out, offsets) = gguf_header(&self.metadata, &entries, alignment);
        let data_start = out.len();
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize(data_start + off, 0);
            out.extend_from_slice(data);
        }
        out
    }
}

/// A tensor's entry in a GGUF header: its data (`size` bytes) is written later.
pub struct HeaderTensor<'a> {
    pub name: &'a str,
    /// ggml order: `dims[0]` is the row length.
    pub dims: &'a [u64],
    pub ty: GgmlType,
    pub size: usize,
}

/// A GGUF (version 3) header: metadata, then the tensor table with each tensor's data at the
/// next multiple of `alignment`, padded with zeros up to the data section. Returns the bytes
/// and each tensor's offset in the data section (for writers that stream the data).
pub fn gguf_header(
    metadata: &[(String, MetaValue)],
    tensors: &[HeaderTensor],
    alignment: usize,
) -> (Vec<u8>, Vec<usize>) {
    let mut out = Vec::new();
    out.extend_from_slice(&GGUF_MAGIC.to_le_bytes());
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        write_str(&mut out, key);
        out.extend_from_slice(&(value.meta_type() as u32).to_le_bytes());
        write_value(&mut out, value);
    }
    let mut offset = 0usize;
    let mut offsets = Vec::with_capacity(tensors.len());
    for t in tensors {
        write_str(&mut out, t.name);
        out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in t.dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&(t.ty as u32).to_le_bytes());
        out.extend_from_slice(&(offset as u64).to_le_bytes());
        offsets.push(offset);
        offset = (offset + t.size).div_ceil(alignment) * alignment;
    }
    let data_start = out.len().div_ceil(alignment) * alignment;
    out.resize(data_start, 0);
    (out, offsets)
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.push(*x as u8),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(*x as u8),
        MetaValue::String(s) => write_str(out, s),
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Array(elem, items) => {
            out.extend_from_slice(&(*elem as u32).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                debug_assert_eq!(item.meta_type(), *elem);
                write_value(out, item);
            }
        }
    }
}
