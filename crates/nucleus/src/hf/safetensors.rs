//! The checkpoint's `*.safetensors` files, memory-mapped: one `model.safetensors`, the shards
//! `model.safetensors.index.json` lists, or (without an index) every `*.safetensors` in the
//! directory. Headers are parsed and checked by the `safetensors` crate; the data stays in
//! the maps until it is converted.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use super::HfError;

/// The element types nucleus reads from a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    BF16,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }
}

/// Where one tensor lies.
#[derive(Clone, Debug)]
pub struct StoredTensor {
    pub shard: usize,
    pub dtype: DType,
    /// Shape as PyTorch gives it: the last dimension is contiguous.
    pub shape: Vec<usize>,
    /// Byte range inside the shard's map.
    pub start: usize,
    pub end: usize,
}

pub struct Shards {
    maps: Vec<memmap2::Mmap>,
    pub paths: Vec<PathBuf>,
    pub tensors: BTreeMap<String, StoredTensor>,
}

const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";

/// The checkpoint's weight files: the shards its index lists (with the shard each tensor is
/// promised in), else `model.safetensors`, else every `*.safetensors` in `dir`.
fn shard_files(dir: &Path) -> Result<(Vec<PathBuf>, HashMap<String, String>), HfError> {
    let index_path = dir.join(INDEX);
    let mut promised: HashMap<String, String> = HashMap::new();
    let files: Vec<PathBuf> = if index_path.is_file() {
        let text = super::read_to_string(&index_path)?;
        let bad = |problem: String| HfError::BadFile {
            path: index_path.display().to_string(),
            problem,
        };
        let v: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("no \"weight_map\" object".into()))?;
        let mut names: Vec<String> = Vec::new();
        for (tensor, file) in map {
            let file = file
                .as_str()
                .ok_or_else(|| bad(format!("the shard of {tensor:?} is not a string")))?;
            // A shard is a file beside the index, never a path elsewhere.
            if file.contains('/') || file.contains('\\') || file.starts_with('.') {
                return Err(bad(format!("shard name {file:?} is not a plain file name")));
            }
            if !names.iter().any(|n| n == file) {
                names.push(file.to_string());
            }
            promised.insert(tensor.clone(), file.to_string());
        }
        names.sort();
        names.into_iter().map(|n| dir.join(n)).collect()
    } else if dir.join(SINGLE).is_file() {
        vec![dir.join(SINGLE)]
    } else {
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|source| HfError::Io {
                path: dir.display().to_string(),
                source,
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors") && p.is_file())
            .collect();
        found.sort();
        found
    };
    if files.is_empty() {
        return Err(HfError::Missing {
            path: dir.join(SINGLE).display().to_string(),
            what: "its weights as *.safetensors",
        });
    }
    Ok((files, promised))
}

impl Shards {
    /// Opens the weights of the checkpoint in `dir`.
    pub fn open(dir: &Path) -> Result<Shards, HfError> {
        let (files, promised) = shard_files(dir)?;
        let mut shards = Shards {
            maps: Vec::with_capacity(files.len()),
            paths: Vec::with_capacity(files.len()),
            tensors: BTreeMap::new(),
        };
        // Every shard before any is read: a missing one is the error to report.
        if let Some(path) = files.iter().find(|p| !p.is_file()) {
            return Err(HfError::Missing {
                path: path.display().to_string(),
                what: "every shard its index lists",
            });
        }
        for path in files {
            shards.add(path, &promised)?;
        }
        if let Some(name) = promised.keys().find(|n| !shards.tensors.contains_key(*n)) {
            return Err(HfError::BadTensor {
                name: name.clone(),
                problem: format!(
                    "the index places it in {}, which does not hold it",
                    promised[name]
                ),
            });
        }
        Ok(shards)
    }

    /// Maps the shard at `path` and lists its tensors, each where the index (if any) promised.
    fn add(&mut self, path: PathBuf, promised: &HashMap<String, String>) -> Result<(), HfError> {
        let shard = self.maps.len();
        let io = |source| HfError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(&path).map_err(io)?;
        // SAFETY: a read-only private map; as with GGUF files we assume nobody truncates or
        // rewrites the file while it is open. Every read goes through ranges the header
        // check below proved to lie inside the map.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let (header_len, meta) =
            SafeTensors::read_metadata(&map).map_err(|e| HfError::BadFile {
                path: path.display().to_string(),
                problem: format!("not a valid safetensors file: {e}"),
            })?;
        let data_start = 8 + header_len;
        let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        for (name, info) in meta.tensors() {
            if let Some(p) = promised.get(&name) {
                if Some(p) != file_name.as_ref() {
                    return Err(HfError::BadTensor {
                        name,
                        problem: format!(
                            "the index places it in {p}, but it is in {}",
                            path.display()
                        ),
                    });
                }
            }
            let dtype = match info.dtype {
                Dtype::F32 => DType::F32,
                Dtype::F16 => DType::F16,
                Dtype::BF16 => DType::BF16,
                other => {
                    return Err(HfError::UnsupportedDtype {
                        name,
                        dtype: format!("{other:?}"),
                    })
                }
            };
            let (s, e) = info.data_offsets;
            let stored = StoredTensor {
                shard,
                dtype,
                shape: info.shape.clone(),
                start: data_start + s,
                end: data_start + e,
            };
            if self.tensors.insert(name.clone(), stored).is_some() {
                return Err(HfError::BadTensor {
                    name,
                    problem: "appears in two shards".into(),
                });
            }
        }
        self.maps.push(map);
        self.paths.push(path);
        Ok(())
    }

    /// The bytes of a tensor (little-endian elements, as safetensors stores them).
    pub fn data(&self, t: &StoredTensor) -> &[u8] {
        &self.maps[t.shard][t.start..t.end]
    }

    /// Tells the kernel that the pages lying wholly inside `t`'s data are no longer needed
    /// (its converted copy is written), so that the checkpoint does not count twice in the
    /// process's memory; a later read faults them back in from the file.
    pub fn release(&self, t: &StoredTensor) {
        const PAGE: usize = 4096;
        let (a, b) = (t.start.div_ceil(PAGE) * PAGE, t.end / PAGE * PAGE);
        if b > a {
            // SAFETY: the map is private and read-only, so nothing was ever written to these
            // pages: dropping them loses nothing, and a later read faults the file's bytes back
            // in (tests/suite/hf_checkpoint.rs reads every tensor again after to_gguf released it).
            // An error (such as a page size above 4 KiB making the range unaligned) only means
            // the pages stay.
            let _ = unsafe {
                self.maps[t.shard].unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    a,
                    b - a,
                )
            };
        }
    }
}
