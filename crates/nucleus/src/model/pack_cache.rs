//! A file of a model's packed weights, so that a later load maps them instead of packing the
//! model again. Opt-in: `NUCLEUS_PACK_CACHE=DIR` names the directory (it costs the disk space
//! of the model's packed matrices, about the model's size).
//!
//! Packing a model (`Weights::pack`) writes every packed byte into fresh anonymous memory, and
//! on a virtual machine the first touch of fresh memory can cost more than the packing (an 8B
//! Q4_K_M file's load took 4.9, 5.1 and 5.9 s in three runs in a row). A load that finds this
//! file maps it read-only instead: the packed matrices come from the page cache, shared with
//! every process that maps them, and the model file's packed tensors are never read.
//!
//! The file is named after its model file (canonical path, size, modification time, device,
//! inode), the arithmetic (which matrices are packed) and [`FORMAT`], and repeats them in its
//! header with each matrix's name and shape: a file that does not match in every field, or
//! does not hold what its header says, is rebuilt, never used. It is written to a temporary
//! name and renamed, so a reader sees a whole file or none. Like the model file, it must not be
//! rewritten in place while a process maps it.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;

use crate::gguf::{GgufFile, Source};
use crate::kernels::interleaved::{Arithmetic, PackedMatrix};
use crate::quant::GgmlType;

const MAGIC: &[u8; 8] = b"NUCPACK\0";
/// The version of the packed layouts and of the choice of matrices: bump it when either
/// changes, so that older files are rebuilt.
const FORMAT: u32 = 2; // 2: Q3_K, Q5_K and IQ4_XS matrices packed
/// Each matrix starts on a page.
const ALIGN: u64 = 4096;

/// What the file holds for one matrix of the model, in `Weights::pack`'s order.
pub(super) struct Entry<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
}

/// The packed-weights file of one model file in one arithmetic.
pub(super) struct PackCache {
    path: PathBuf,
    source: Source,
    arithmetic: Arithmetic,
}

impl PackCache {
    /// The file for `file` in `arithmetic` under `NUCLEUS_PACK_CACHE`, when that names a
    /// directory and `file` was opened from disk.
    pub fn for_file(file: &GgufFile, arithmetic: Arithmetic) -> Option<PackCache> {
        let dir = std::env::var_os("NUCLEUS_PACK_CACHE").filter(|v| !v.is_empty())?;
        Some(Self::in_dir(PathBuf::from(dir), file.source()?, arithmetic))
    }

    fn in_dir(dir: PathBuf, source: &Source, arithmetic: Arithmetic) -> PackCache {
        let stem = source
            .path
            .file_stem()
            .map_or("model".into(), |s| s.to_string_lossy());
        let key = fnv1a(&identity(source, arithmetic));
        PackCache {
            path: dir.join(format!("{stem}-{key:016x}.nucpack")),
            source: source.clone(),
            arithmetic,
        }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The packed matrices of `want` (`None` for those the file says were not packed), mapped
    /// from the file; an error says why the file cannot serve (absent, another model, another
    /// build, damaged).
    pub fn load(&self, want: &[Entry]) -> Result<Vec<Option<PackedMatrix>>, String> {
        let file = File::open(&self.path).map_err(|e| e.to_string())?;
        // SAFETY: read-only and private; like the model file's map, this assumes that nobody
        // truncates or rewrites the file while it is mapped (it is only ever replaced by a
        // rename). Every read below is bounds-checked against the map's length.
        let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.map_err(|e| e.to_string())?);
        let mut r = Reader { bytes: &map, at: 0 };
        if r.take(8)? != MAGIC || r.u32()? != FORMAT {
            return Err("not a packed-weights file of this build".into());
        }
        let id = identity(&self.source, self.arithmetic);
        if r.take(id.len())? != id.as_slice() {
            return Err("made from another model file or arithmetic".into());
        }
        if r.u64()? != want.len() as u64 {
            return Err("another list of matrices".into());
        }
        let mut out = Vec::with_capacity(want.len());
        for w in want {
            let name_len = r.u32()? as usize;
            let same = r.take(name_len)? == w.name.as_bytes()
                && r.u32()? == w.ty as u32
                && r.u64()? == w.rows as u64
                && r.u64()? == w.cols as u64;
            if !same {
                return Err(format!("no entry for {} as this model has it", w.name));
            }
            let (packed, offset) = (r.u8()?, r.u64()?);
            out.push(match packed {
                0 => None,
                _ => {
                    let offset = usize::try_from(offset).map_err(|e| e.to_string())?;
                    let m = PackedMatrix::from_map(w.ty, w.rows, w.cols, map.clone(), offset);
                    Some(m.ok_or_else(|| format!("{}: bytes past the end", w.name))?)
                }
            });
        }
        Ok(out)
    }

    /// Writes the file: `entries` and their packed matrices, in order. Returns its size.
    pub fn store(&self, entries: &[(Entry, Option<&PackedMatrix>)]) -> std::io::Result<u64> {
        let mut header = Vec::new();
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&FORMAT.to_le_bytes());
        header.extend_from_slice(&identity(&self.source, self.arithmetic));
        header.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        // Each entry's offset is written once the header's length is known.
        let mut offset_at = Vec::with_capacity(entries.len());
        for (e, m) in entries {
            header.extend_from_slice(&(e.name.len() as u32).to_le_bytes());
            header.extend_from_slice(e.name.as_bytes());
            header.extend_from_slice(&(e.ty as u32).to_le_bytes());
            header.extend_from_slice(&(e.rows as u64).to_le_bytes());
            header.extend_from_slice(&(e.cols as u64).to_le_bytes());
            header.push(m.is_some() as u8);
            offset_at.push(header.len());
            header.extend_from_slice(&0u64.to_le_bytes());
        }
        let header_len = header.len() as u64;
        let mut at = header_len.next_multiple_of(ALIGN);
        let mut offsets = Vec::with_capacity(entries.len());
        for ((_, m), &field) in entries.iter().zip(&offset_at) {
            header[field..field + 8].copy_from_slice(&at.to_le_bytes());
            offsets.push(at);
            if let Some(m) = m {
                at = (at + m.bytes() as u64).next_multiple_of(ALIGN);
            }
        }
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = self
            .path
            .with_extension(format!("tmp{}", std::process::id()));
        let written = (|| {
            let mut f = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
            f.write_all(&header)?;
            let mut pos = header_len;
            for ((_, m), off) in entries.iter().zip(offsets) {
                if let Some(m) = m {
                    f.write_all(&vec![0u8; (off - pos) as usize])?;
                    f.write_all(m.raw())?;
                    pos = off + m.bytes() as u64;
                }
            }
            f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            Ok(pos)
        })();
        match written {
            Ok(size) => std::fs::rename(&tmp, &self.path).map(|_| size),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
    }
}

/// The bytes that tie a file to its model file and arithmetic.
fn identity(s: &Source, arithmetic: Arithmetic) -> Vec<u8> {
    let path = s.path.to_string_lossy();
    let mut v = Vec::with_capacity(48 + path.len());
    v.push(arithmetic as u8);
    for x in [s.len, s.modified_ns, s.dev, s.ino, path.len() as u64] {
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.extend_from_slice(path.as_bytes());
    v
}

/// 64-bit FNV-1a: a stable name for the file (a collision only costs a rebuild: the header
/// holds the whole identity).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Reads the header, every read checked against the end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or("truncated header")?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
}
