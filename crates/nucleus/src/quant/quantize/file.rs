//! GGUF in, GGUF out: the metadata copied with `general.file_type` set, the tensors in
//! llama-quantize's order and types, each converted slab by slab (never the whole tensor in
//! memory) and written to a temporary file beside the output that is renamed over it only
//! when everything is written, so that a failure leaves no partial file.

use std::borrow::Cow;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::mixes::Mix;
use super::rules::{output_order, plan_types, ModelFacts, TensorShape};
use super::{can_quantize, quantize_rows};
use crate::gguf::{gguf_header, GgufError, GgufFile, HeaderTensor, MetaValue, Metadata};
use crate::quant::{dequantize_row, GgmlType};

/// ggml's `GGML_QNT_VERSION`, written to `general.quantization_version`.
const QUANTIZATION_VERSION: u32 = 2;
/// Keys llama-quantize drops (a split file's) or writes itself.
const DROPPED_KEYS: &[&str] = &[
    "general.quantization_version",
    "general.file_type",
    "split.no",
    "split.count",
    "split.tensors.count",
];
/// Floats converted per slab and thread budget: about 32 MiB of f32 at a time.
const SLAB_VALUES: usize = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    #[error(transparent)]
    Read(#[from] GgufError),
    #[error("{0}")]
    Plan(String),
    #[error("tensor {name:?}: {problem}")]
    Tensor { name: String, problem: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// Reported before each tensor is written.
pub struct QuantizeProgress<'a> {
    pub index: usize,
    pub total: usize,
    pub name: &'a str,
    pub from: GgmlType,
    pub to: GgmlType,
}

/// What was written.
#[derive(Debug)]
pub struct QuantizeSummary {
    /// Each tensor's name and type, in file order.
    pub tensors: Vec<(String, GgmlType)>,
    /// Tensors whose row length did not fit the type the rules chose.
    pub fallbacks: usize,
    pub input_bytes: u64,
    pub output_bytes: u64,
}

/// Removes the temporary file unless it was renamed into place.
struct PartialFile {
    path: PathBuf,
    done: bool,
}

impl Drop for PartialFile {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Quantizes the GGUF at `input` to `output` with `mix`, converting with `threads` threads
/// (0 = every core). `progress` is told of each tensor before it is converted.
pub fn quantize_file(
    input: &Path,
    output: &Path,
    mix: &Mix,
    threads: usize,
    progress: &mut dyn FnMut(QuantizeProgress),
) -> Result<QuantizeSummary, QuantizeError> {
    quantize_gguf(&GgufFile::open(input)?, output, mix, threads, progress)
}

/// What [`quantize_source`] reads: a GGUF file, or a Hugging Face checkpoint presented as one
/// tensor by tensor (`crate::hf::Checkpoint`), so that it is never assembled in memory.
pub trait QuantizeSource {
    fn metadata(&self) -> &Metadata;
    /// The data alignment the output keeps.
    fn alignment(&self) -> usize;
    /// Each tensor's name, ggml dimensions and type, in the input's order.
    fn tensor_shapes(&self) -> Vec<TensorShape<'_>>;
    /// Tensor `index`'s data in its type (borrowed from a map, or converted for the call).
    fn tensor_data(&self, index: usize) -> Cow<'_, [u8]>;
    /// Called once tensor `index` is written: its input pages may go.
    fn release(&self, _index: usize) {}
    /// Bytes read, for the summary.
    fn input_bytes(&self) -> u64;
}

impl QuantizeSource for GgufFile {
    fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    fn alignment(&self) -> usize {
        self.alignment
    }

    fn tensor_shapes(&self) -> Vec<TensorShape<'_>> {
        self.tensors
            .iter()
            .map(|t| TensorShape {
                name: &t.name,
                dims: &t.dims,
                ty: t.ty,
            })
            .collect()
    }

    fn tensor_data(&self, index: usize) -> Cow<'_, [u8]> {
        Cow::Borrowed(GgufFile::tensor_data(self, &self.tensors[index]))
    }

    fn release(&self, index: usize) {
        self.release_pages(&self.tensors[index]);
    }

    fn input_bytes(&self) -> u64 {
        self.file_size() as u64
    }
}

/// [`quantize_file`] for a GGUF already open.
pub fn quantize_gguf(
    file: &GgufFile,
    output: &Path,
    mix: &Mix,
    threads: usize,
    progress: &mut dyn FnMut(QuantizeProgress),
) -> Result<QuantizeSummary, QuantizeError> {
    quantize_source(file, output, mix, threads, progress)
}

/// [`quantize_file`] for any [`QuantizeSource`].
pub fn quantize_source(
    file: &dyn QuantizeSource,
    output: &Path,
    mix: &Mix,
    threads: usize,
    progress: &mut dyn FnMut(QuantizeProgress),
) -> Result<QuantizeSummary, QuantizeError> {
    let all = file.tensor_shapes();
    let names: Vec<&str> = all.iter().map(|t| t.name).collect();
    let order = output_order(&names);
    let shapes: Vec<TensorShape> = order
        .iter()
        .map(|&i| TensorShape {
            name: all[i].name,
            dims: all[i].dims,
            ty: all[i].ty,
        })
        .collect();
    let facts = ModelFacts::from_metadata(file.metadata());
    let (types, fallbacks) = plan_types(mix, &facts, &shapes).map_err(QuantizeError::Plan)?;
    let entries = header_entries(&shapes, &types)?;
    let metadata = output_metadata(file.metadata(), mix);
    // The input's alignment (32 unless its metadata, copied, says otherwise).
    let alignment = file.alignment();
    let (header, offsets) = gguf_header(&metadata, &entries, alignment);

    let partial = partial_path(output);
    // Errors name the output the user gave, not the temporary file.
    let write_err = |source| QuantizeError::Write {
        path: output.display().to_string(),
        source,
    };
    let handle = std::fs::File::create(&partial).map_err(write_err)?;
    let mut guard = PartialFile {
        path: partial.clone(),
        done: false,
    };
    let mut out = BufWriter::with_capacity(8 << 20, handle);
    out.write_all(&header).map_err(write_err)?;
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        threads
    };
    let mut written = 0usize;
    let mut summary = Vec::with_capacity(order.len());
    for (k, ((&i, t), entry)) in order.iter().zip(&shapes).zip(&entries).enumerate() {
        progress(QuantizeProgress {
            index: k,
            total: order.len(),
            name: t.name,
            from: t.ty,
            to: entry.ty,
        });
        // Zeros up to this tensor's aligned offset.
        out.write_all(&vec![0u8; offsets[k] - written])
            .map_err(write_err)?;
        let data = file.tensor_data(i);
        if entry.ty == t.ty {
            out.write_all(&data).map_err(write_err)?;
        } else {
            convert_tensor(t.ty, entry.ty, t.dims[0] as usize, &data, threads, &mut out).map_err(
                |e| match e {
                    ConvertError::Write(source) => write_err(source),
                    ConvertError::Quantize(problem) => QuantizeError::Tensor {
                        name: t.name.to_string(),
                        problem,
                    },
                },
            )?;
        }
        drop(data);
        file.release(i);
        written = offsets[k] + entry.size;
        summary.push((t.name.to_string(), entry.ty));
    }
    // llama-quantize pads the last tensor too.
    let end = written.div_ceil(alignment) * alignment;
    out.write_all(&vec![0u8; end - written])
        .map_err(write_err)?;
    written = end;
    let handle = out.into_inner().map_err(|e| write_err(e.into_error()))?;
    handle.sync_all().map_err(write_err)?;
    drop(handle);
    std::fs::rename(&partial, output).map_err(|source| QuantizeError::Write {
        path: output.display().to_string(),
        source,
    })?;
    guard.done = true;
    Ok(QuantizeSummary {
        tensors: summary,
        fallbacks,
        input_bytes: file.input_bytes(),
        output_bytes: (header.len() + written) as u64,
    })
}

/// The output's tensors: each shape with its planned type and size; an error names a tensor
/// nucleus cannot convert.
fn header_entries<'a>(
    shapes: &[TensorShape<'a>],
    types: &[GgmlType],
) -> Result<Vec<HeaderTensor<'a>>, QuantizeError> {
    let mut entries = Vec::with_capacity(shapes.len());
    for (t, &to) in shapes.iter().zip(types) {
        let bad = |problem: String| QuantizeError::Tensor {
            name: t.name.to_string(),
            problem,
        };
        if to != t.ty && !t.ty.is_computable() {
            return Err(bad(format!(
                "nucleus cannot read {} tensors to convert them to {to}",
                t.ty
            )));
        }
        if to != t.ty && !can_quantize(to) {
            return Err(bad(format!("nucleus cannot write {to}")));
        }
        let size = tensor_bytes(t.dims, to).map_err(bad)?;
        entries.push(HeaderTensor {
            name: t.name,
            dims: t.dims,
            ty: to,
            size,
        });
    }
    Ok(entries)
}

/// The input's metadata less what no longer holds, with the quantization's version and the
/// mixture's file type.
fn output_metadata(input: &Metadata, mix: &Mix) -> Vec<(String, MetaValue)> {
    let mut metadata: Vec<(String, MetaValue)> = input
        .iter()
        .filter(|(k, _)| !DROPPED_KEYS.contains(k))
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    metadata.push((
        "general.quantization_version".into(),
        MetaValue::U32(QUANTIZATION_VERSION),
    ));
    metadata.push(("general.file_type".into(), MetaValue::U32(mix.ftype)));
    metadata
}

/// `.NAME.partial-PID` in the output's directory (a rename within one file system is atomic).
fn partial_path(output: &Path) -> PathBuf {
    let name = output
        .file_name()
        .map_or_else(|| "out.gguf".into(), |n| n.to_string_lossy().into_owned());
    let partial = format!(".{name}.partial-{}", std::process::id());
    match output.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join(partial),
        _ => PathBuf::from(partial),
    }
}

fn tensor_bytes(dims: &[u64], ty: GgmlType) -> Result<usize, String> {
    let cols = dims[0] as usize;
    let row = ty.row_bytes(cols).ok_or_else(|| {
        format!(
            "its rows of {cols} are not a whole number of {ty} blocks ({})",
            ty.block_size()
        )
    })?;
    dims[1..]
        .iter()
        .try_fold(row, |acc, &d| acc.checked_mul(d as usize))
        .ok_or_else(|| "its size overflows".to_string())
}

enum ConvertError {
    Write(std::io::Error),
    Quantize(String),
}

/// Dequantizes and quantizes `data` (rows of `cols` values of type `from`) to `to`, slab by
/// slab, the rows of a slab shared among `threads` threads, and writes the result.
fn convert_tensor(
    from: GgmlType,
    to: GgmlType,
    cols: usize,
    data: &[u8],
    threads: usize,
    out: &mut impl Write,
) -> Result<(), ConvertError> {
    let (src_row, dst_row) = (
        from.row_bytes(cols)
            .expect("checked when the file was read"),
        to.row_bytes(cols).expect("checked when planned"),
    );
    let rows = data.len() / src_row;
    let slab_rows = (SLAB_VALUES * threads / cols).clamp(1, rows.max(1));
    let mut dst = vec![0u8; slab_rows * dst_row];
    for first in (0..rows).step_by(slab_rows) {
        let n = slab_rows.min(rows - first);
        let src = &data[first * src_row..(first + n) * src_row];
        let dst = &mut dst[..n * dst_row];
        let per_thread = n.div_ceil(threads);
        let results: Vec<Result<(), String>> = std::thread::scope(|s| {
            let jobs: Vec<_> = src
                .chunks(per_thread * src_row)
                .zip(dst.chunks_mut(per_thread * dst_row))
                .map(|(src, dst)| {
                    s.spawn(move || {
                        let mut f32s = vec![0f32; src.len() / src_row * cols];
                        for (row, vals) in
                            src.chunks_exact(src_row).zip(f32s.chunks_exact_mut(cols))
                        {
                            dequantize_row(from, row, vals);
                        }
                        quantize_rows(to, &f32s, cols, dst)
                    })
                })
                .collect();
            jobs.into_iter()
                .map(|j| {
                    j.join()
                        .unwrap_or_else(|_| Err("a quantizing thread panicked".into()))
                })
                .collect()
        });
        for r in results {
            r.map_err(ConvertError::Quantize)?;
        }
        out.write_all(dst).map_err(ConvertError::Write)?;
    }
    Ok(())
}
