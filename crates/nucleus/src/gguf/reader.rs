use std::path::Path;

use super::metadata::{MetaType, MetaValue, Metadata};
use super::{DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
use crate::quant::GgmlType;

/// Why a GGUF file could not be read. Every variant names the problem so that the user can
/// tell a truncated download from a file of another format.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot open {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("not a GGUF file: bad magic {0:#010x} (expected \"GGUF\")")]
    BadMagic(u32),
    #[error("GGUF version {0} is not supported (only versions 2 and 3)")]
    UnsupportedVersion(u32),
    #[error("truncated file: needed {needed} bytes at offset {offset} for {what}, but the file has {len}")]
    Truncated {
        what: String,
        offset: usize,
        needed: usize,
        len: usize,
    },
    #[error("absurd {what} count {count}: the remaining {remaining} bytes cannot hold that many")]
    AbsurdCount {
        what: String,
        count: u64,
        remaining: usize,
    },
    #[error("metadata key {key:?} has unknown value type {ty}")]
    UnknownMetaType { key: String, ty: u32 },
    #[error("metadata key {0:?} appears twice")]
    DuplicateKey(String),
    #[error("metadata arrays nested too deeply at key {0:?}")]
    NestedTooDeep(String),
    #[error("general.alignment {0} is not a power of two")]
    BadAlignment(u64),
    #[error("tensor {name:?}: {problem}")]
    BadTensor { name: String, problem: String },
    #[error("tensor {name:?} has unknown element type {ty}")]
    UnknownTensorType { name: String, ty: u32 },
    #[error("tensor name {0:?} appears twice")]
    DuplicateTensor(String),
}

/// Where a tensor lives and what it holds.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the contiguous (row) length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Bytes of data.
    pub size: usize,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A file on disk as it was when opened: its path and what changes when it is rewritten
/// (size, modification time, device and inode), so that something derived from it (a file of
/// its packed weights) can tell whether it still belongs to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub path: std::path::PathBuf,
    pub len: u64,
    pub modified_ns: u64,
    pub dev: u64,
    pub ino: u64,
}

impl Source {
    #[cfg(unix)]
    fn of(path: &Path, file: &std::fs::File) -> Option<Source> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata().ok()?;
        Some(Source {
            path: std::fs::canonicalize(path).ok()?,
            len: m.len(),
            modified_ns: (m.mtime() as u64)
                .wrapping_mul(1_000_000_000)
                .wrapping_add(m.mtime_nsec() as u64),
            dev: m.dev(),
            ino: m.ino(),
        })
    }

    #[cfg(not(unix))]
    fn of(_: &Path, _: &std::fs::File) -> Option<Source> {
        None
    }
}

enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file. Tensor data stays in the (memory-mapped) file.
pub struct GgufFile {
    backing: Backing,
    /// What the file was opened from (`None` for files held in memory).
    source: Option<Source>,
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: usize,
    data_offset: usize,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens and parses a file through a read-only memory map.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process. Like every mmap-based model
        // loader we assume nobody truncates or rewrites the file while it is open; all reads
        // through the map are bounds-checked against its length.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let mut parsed = Self::parse(Backing::Mmap(mmap))?;
        parsed.source = Source::of(path, &file);
        Ok(parsed)
    }

    /// The file this was opened from, when it was opened from one.
    pub fn source(&self) -> Option<&Source> {
        self.source.as_ref()
    }

    /// Parses a file held in memory (tests, and files built on the fly).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::parse(Backing::Owned(bytes))
    }

    fn parse(backing: Backing) -> Result<Self, GgufError> {
        let bytes = backing.bytes();
        let mut r = Cursor { bytes, pos: 0 };
        let magic = r.u32("magic")?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic(magic));
        }
        let version = r.u32("version")?;
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = r.u64("tensor count")?;
        let n_kv = r.u64("metadata count")?;
        // A key/value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at
        // least 8 + 4 + 4 + 8.
        let n_kv = r.bounded_count(n_kv, 13, "metadata")?;
        let n_tensors = r.bounded_count(n_tensors, 24, "tensor")?;

        let metadata = read_metadata(&mut r, n_kv)?;
        let alignment = alignment(&metadata)?;
        let mut tensors = Vec::with_capacity(n_tensors);
        let mut names = std::collections::HashSet::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            let t = read_tensor_info(&mut r, alignment)?;
            if !names.insert(t.name.clone()) {
                return Err(GgufError::DuplicateTensor(t.name));
            }
            tensors.push(t);
        }
        let data_offset = r.pos.div_ceil(alignment) * alignment;
        check_tensor_ranges(&tensors, bytes.len().saturating_sub(data_offset))?;

        Ok(GgufFile {
            backing,
            source: None,
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
        })
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The bytes of a tensor (checked against the file at parse time).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = self.data_offset + info.offset as usize;
        &self.backing.bytes()[start..start + info.size]
    }

    /// Tells the kernel that this process no longer needs the pages lying wholly inside
    /// tensor `info`'s data: a repacked copy in memory replaces them, and this keeps the tensor
    /// from counting twice in the process's memory. Should they be read again, they are read
    /// back from the file on demand. Files held in memory are left as they are.
    pub fn release_pages(&self, info: &TensorInfo) {
        self.release_range(info, 0, info.size);
    }

    /// [`Self::release_pages`] for bytes `offset..offset + len` of the tensor only (the pages
    /// wholly inside them).
    pub fn release_range(&self, info: &TensorInfo, offset: usize, len: usize) {
        const PAGE: usize = 4096;
        if let Backing::Mmap(m) = &self.backing {
            let len = len.min(info.size.saturating_sub(offset));
            let start = self.data_offset + info.offset as usize + offset;
            let (a, b) = (start.div_ceil(PAGE) * PAGE, (start + len) / PAGE * PAGE);
            if b > a {
                // SAFETY: the map is private and read-only, so nothing was ever written to
                // these pages: dropping them loses nothing, and a later read faults the file's
                // bytes back in. No reference into the range is used across the call in a way
                // that depends on residency. An error (such as a page size larger than 4 KiB
                // making the range unaligned) only means the pages stay.
                let _ = unsafe {
                    m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, a, b - a)
                };
            }
        }
    }

    /// The whole file's size in bytes.
    pub fn file_size(&self) -> usize {
        self.backing.bytes().len()
    }

    /// Architecture name (`general.architecture`).
    pub fn architecture(&self) -> Option<&str> {
        self.metadata.get_str("general.architecture")
    }
}

/// Bytes of a tensor of the given shape, with every multiplication checked.
fn tensor_size(name: &str, dims: &[u64], ty: GgmlType) -> Result<usize, GgufError> {
    let bad = |problem: String| GgufError::BadTensor {
        name: name.to_string(),
        problem,
    };
    if dims.contains(&0) {
        return Err(bad(format!("a dimension is zero: {dims:?}")));
    }
    let (block, _) = ty.block_layout();
    let row_len = usize::try_from(dims[0]).map_err(|_| bad("row length overflows".into()))?;
    if row_len % block != 0 {
        return Err(bad(format!(
            "row length {row_len} is not a multiple of the {} block size {block}",
            ty.name()
        )));
    }
    let mut size = ty
        .row_bytes(row_len)
        .ok_or_else(|| bad("row size overflows".into()))?;
    for &d in &dims[1..] {
        let d = usize::try_from(d).map_err(|_| bad("dimension overflows".into()))?;
        size = size
            .checked_mul(d)
            .ok_or_else(|| bad(format!("size of shape {dims:?} overflows")))?;
    }
    Ok(size)
}

/// A bounds-checked little-endian reader.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        match end {
            Some(end) => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(GgufError::Truncated {
                what: what.to_string(),
                offset: self.pos,
                needed: n,
                len: self.bytes.len(),
            }),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        Ok(self
            .take(N, what)?
            .try_into()
            .expect("take returns N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// Accepts a count only if `count` items of at least `min_size` bytes fit in what remains.
    fn bounded_count(&self, count: u64, min_size: usize, what: &str) -> Result<usize, GgufError> {
        let fits = count
            .checked_mul(min_size as u64)
            .is_some_and(|b| b <= self.remaining() as u64);
        if !fits {
            return Err(GgufError::AbsurdCount {
                what: what.to_string(),
                count,
                remaining: self.remaining(),
            });
        }
        Ok(count as usize)
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let len = self.bounded_count(len, 1, what)?;
        let raw = self.take(len, what)?;
        // Vocabulary entries are almost always UTF-8; keep going on the rare file that is not.
        Ok(String::from_utf8_lossy(raw).into_owned())
    }

    fn value(&mut self, ty: MetaType, key: &str, depth: usize) -> Result<MetaValue, GgufError> {
        let what = key;
        Ok(match ty {
            MetaType::U8 => MetaValue::U8(self.array::<1>(what)?[0]),
            MetaType::I8 => MetaValue::I8(self.array::<1>(what)?[0] as i8),
            MetaType::U16 => MetaValue::U16(u16::from_le_bytes(self.array(what)?)),
            MetaType::I16 => MetaValue::I16(i16::from_le_bytes(self.array(what)?)),
            MetaType::U32 => MetaValue::U32(self.u32(what)?),
            MetaType::I32 => MetaValue::I32(i32::from_le_bytes(self.array(what)?)),
            MetaType::F32 => MetaValue::F32(f32::from_le_bytes(self.array(what)?)),
            MetaType::Bool => MetaValue::Bool(self.array::<1>(what)?[0] != 0),
            MetaType::String => MetaValue::String(self.string(what)?),
            MetaType::U64 => MetaValue::U64(self.u64(what)?),
            MetaType::I64 => MetaValue::I64(i64::from_le_bytes(self.array(what)?)),
            MetaType::F64 => MetaValue::F64(f64::from_le_bytes(self.array(what)?)),
            MetaType::Array => {
                if depth >= 4 {
                    return Err(GgufError::NestedTooDeep(key.to_string()));
                }
                let elem = self.u32(what)?;
                let elem = MetaType::from_u32(elem).ok_or_else(|| GgufError::UnknownMetaType {
                    key: key.to_string(),
                    ty: elem,
                })?;
                let n = self.u64(what)?;
                let n = self.bounded_count(n, elem.min_size(), &format!("{key} array element"))?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                MetaValue::Array(elem, items)
            }
        })
    }
}

/// `n_kv` key/value pairs, each key once.
fn read_metadata(r: &mut Cursor, n_kv: usize) -> Result<Metadata, GgufError> {
    let mut metadata = Metadata::default();
    for _ in 0..n_kv {
        let key = r.string("metadata key")?;
        let ty = r.u32("metadata value type")?;
        let ty = MetaType::from_u32(ty).ok_or_else(|| GgufError::UnknownMetaType {
            key: key.clone(),
            ty,
        })?;
        let value = r.value(ty, &key, 0)?;
        if !metadata.insert(key.clone(), value) {
            return Err(GgufError::DuplicateKey(key));
        }
    }
    Ok(metadata)
}

/// `general.alignment`: a power of two up to 1 MiB, 32 when absent.
fn alignment(metadata: &Metadata) -> Result<usize, GgufError> {
    match metadata.get("general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(v) => {
            let a = v.as_i64().unwrap_or(-1);
            if a <= 0 || !(a as u64).is_power_of_two() || a > 1 << 20 {
                return Err(GgufError::BadAlignment(a.max(0) as u64));
            }
            Ok(a as usize)
        }
    }
}

/// One tensor's name, shape, type and offset, its size checked to fit a usize and its offset
/// to be aligned.
fn read_tensor_info(r: &mut Cursor, alignment: usize) -> Result<TensorInfo, GgufError> {
    let name = r.string("tensor name")?;
    let n_dims = r.u32("tensor dimension count")? as usize;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(GgufError::BadTensor {
            name,
            problem: format!("{n_dims} dimensions (1 to {MAX_DIMS} allowed)"),
        });
    }
    let mut dims = Vec::with_capacity(n_dims);
    for _ in 0..n_dims {
        dims.push(r.u64("tensor dimension")?);
    }
    let ty_raw = r.u32("tensor type")?;
    let offset = r.u64("tensor offset")?;
    let ty = GgmlType::from_u32(ty_raw).ok_or_else(|| GgufError::UnknownTensorType {
        name: name.clone(),
        ty: ty_raw,
    })?;
    let size = tensor_size(&name, &dims, ty)?;
    if offset % alignment as u64 != 0 {
        return Err(GgufError::BadTensor {
            name,
            problem: format!("offset {offset} is not a multiple of the alignment {alignment}"),
        });
    }
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset,
        size,
    })
}

/// Every tensor's data inside the `data_len` bytes of the data section.
fn check_tensor_ranges(tensors: &[TensorInfo], data_len: usize) -> Result<(), GgufError> {
    for t in tensors {
        let end = t.offset.checked_add(t.size as u64);
        if end.is_none_or(|end| end > data_len as u64) {
            return Err(GgufError::BadTensor {
                name: t.name.clone(),
                problem: format!(
                    "data [{}, +{}) lies outside the {} bytes of the data section (truncated file?)",
                    t.offset, t.size, data_len
                ),
            });
        }
    }
    Ok(())
}
