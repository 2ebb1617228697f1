//! The weight index: which GGUF tensor plays which role, checked for shape and type at load.
//! Small vectors (norms, biases) are copied to f32; matrices stay in the mapped file.

use std::sync::Arc;

use crate::gguf::{GgufFile, TensorInfo};
use crate::kernels::interleaved::huge_pages::Arena;
use crate::kernels::interleaved::{Arithmetic, FileRows, PackedMatrix};
use crate::kernels::matmul::QMatrix;
use crate::quant::{dequantize_row, GgmlType};

use super::pack_cache::{Entry, PackCache};

use super::{HParams, ModelError, MoeParams};

#[path = "weights_layer.rs"]
mod layer;

/// A matrix in the file: `rows` outputs of `cols` inputs each.
#[derive(Clone, Debug)]
pub struct Matrix {
    pub info: TensorInfo,
    pub rows: usize,
    pub cols: usize,
    /// The matrix repacked for nucleus's own arithmetic (Q8_0, Q5_0, Q4_0, IQ4_NL, MXFP4 and Q4_K with
    /// whole groups of rows, when the model runs in [`Arithmetic::Fast`]), packed or waiting to
    /// be ([`Weights::finish_packing`]).
    pub packed: Option<Arc<PackedMatrix>>,
}

impl Matrix {
    /// What a file of packed weights says of this matrix.
    fn pack_entry(&self) -> Entry<'_> {
        Entry {
            name: &self.info.name,
            ty: self.info.ty,
            rows: self.rows,
            cols: self.cols,
        }
    }

    /// Rows `start..start + rows` of this matrix (a part of a fused matrix, such as Phi-3's
    /// q/k/v): the same bytes of the file, each row computed as it is in the whole.
    fn row_slice(&self, start: usize, rows: usize) -> Matrix {
        let row_bytes = self.info.size / self.rows;
        let mut info = self.info.clone();
        info.name = format!("{}[{start}..{}]", info.name, start + rows);
        info.dims = vec![self.cols as u64, rows as u64];
        info.offset += (start * row_bytes) as u64;
        info.size = rows * row_bytes;
        Matrix {
            info,
            rows,
            cols: self.cols,
            packed: None,
        }
    }

    pub fn q<'a>(&self, file: &'a GgufFile) -> QMatrix<'a> {
        QMatrix {
            ty: self.info.ty,
            data: file.tensor_data(&self.info),
            rows: self.rows,
            cols: self.cols,
        }
    }
}

pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub wo: Matrix,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    /// The output projection's bias (gpt-oss).
    pub bo: Option<Vec<f32>>,
    /// One attention-sink logit per query head (gpt-oss).
    pub attn_sinks: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn,
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// A layer's feed-forward network: one gated FFN, or a mixture of experts.
pub enum Ffn {
    Dense {
        gate: Matrix,
        up: Matrix,
        down: Matrix,
    },
    Moe(MoeFfn),
}

/// A mixture-of-experts FFN: the router and each expert's gated FFN.
pub struct MoeFfn {
    pub params: MoeParams,
    /// `ffn_gate_inp`: one row of `n_embd` per expert, whose product with the normed input
    /// gives the expert logits.
    pub router: Matrix,
    /// The router's bias, one per expert (gpt-oss).
    pub router_bias: Option<Vec<f32>>,
    /// The experts' biases (gpt-oss): `n_ff_exp` per expert for gate and up, `n_embd` for down,
    /// expert after expert.
    pub biases: Option<ExpertBiases>,
    /// Expert `i`'s matrices: slices of the 3-D `ffn_{gate,up,down}_exps` tensors (the same
    /// bytes of the file).
    pub experts: Vec<Expert>,
}

pub struct ExpertBiases {
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
}

pub struct Expert {
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
}

/// A matrix's rows in the model's mapped file, which a packed matrix reads until it is packed
/// ([`PackedMatrix::deferred`]).
#[derive(Debug)]
struct TensorRows {
    file: Arc<GgufFile>,
    info: TensorInfo,
    /// Whether its pages may be dropped once packed (`--exact` reads some matrices' generated
    /// tokens from the file: theirs stay).
    release: bool,
}

impl FileRows for TensorRows {
    fn bytes(&self) -> &[u8] {
        self.file.tensor_data(&self.info)
    }

    fn release(&self, offset: usize, len: usize) {
        if self.release {
            self.file.release_range(&self.info, offset, len);
        }
    }
}

impl Ffn {
    /// Every matrix of the FFN.
    fn matrices(&self) -> Vec<&Matrix> {
        match self {
            Ffn::Dense { gate, up, down } => vec![gate, up, down],
            Ffn::Moe(m) => m
                .experts
                .iter()
                .flat_map(|x| [&x.gate, &x.up, &x.down])
                .collect(),
        }
    }

    /// Every matrix of the FFN, for repacking.
    fn matrices_mut(&mut self) -> Vec<&mut Matrix> {
        match self {
            Ffn::Dense { gate, up, down } => vec![gate, up, down],
            Ffn::Moe(m) => m
                .experts
                .iter_mut()
                .flat_map(|x| [&mut x.gate, &mut x.up, &mut x.down])
                .collect(),
        }
    }
}

pub struct Weights {
    pub token_embd: Matrix,
    pub output_norm: Vec<f32>,
    /// The output projection; the token embedding when the model ties them.
    pub output: Matrix,
    pub rope_freqs: Option<Vec<f32>>,
    pub layers: Vec<Layer>,
}

struct Loader<'a> {
    file: &'a GgufFile,
}

impl Loader<'_> {
    fn info(&self, name: &str) -> Result<&TensorInfo, ModelError> {
        self.file
            .tensor(name)
            .ok_or_else(|| ModelError::Invalid(format!("missing tensor {name}")))
    }

    fn matrix(&self, name: &str, cols: usize, rows: usize) -> Result<Matrix, ModelError> {
        let info = self.info(name)?;
        let want = [cols as u64, rows as u64];
        if info.dims != want {
            return Err(ModelError::Invalid(format!(
                "tensor {name} has shape {:?}, expected {want:?}",
                info.dims
            )));
        }
        if !info.ty.is_computable() {
            return Err(ModelError::UnsupportedTensorType {
                name: name.to_string(),
                ty: info.ty,
            });
        }
        Ok(Matrix {
            info: info.clone(),
            rows,
            cols,
            packed: None,
        })
    }

    /// A 3-D tensor of `n` matrices of `rows` × `cols` (`ffn_*_exps`), as one matrix per
    /// expert. `why` names the metadata the expected shape comes from.
    fn experts(
        &self,
        name: &str,
        (cols, rows, n): (usize, usize, usize),
        why: &str,
    ) -> Result<Vec<Matrix>, ModelError> {
        let info = self.info(name)?;
        let want = [cols as u64, rows as u64, n as u64];
        if info.dims != want {
            return Err(ModelError::Invalid(format!(
                "tensor {name} has shape {:?}, expected {want:?} ({why})",
                info.dims
            )));
        }
        if !info.ty.is_computable() || info.ty.row_bytes(cols).is_none() {
            return Err(ModelError::UnsupportedTensorType {
                name: name.to_string(),
                ty: info.ty,
            });
        }
        let all = Matrix {
            info: info.clone(),
            rows: rows * n,
            cols,
            packed: None,
        };
        Ok((0..n).map(|i| all.row_slice(i * rows, rows)).collect())
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let info = self.info(name)?;
        if info.n_elements() != len as u64 {
            return Err(ModelError::Invalid(format!(
                "tensor {name} has shape {:?}, expected [{len}]",
                info.dims
            )));
        }
        if !matches!(info.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            return Err(ModelError::UnsupportedTensorType {
                name: name.to_string(),
                ty: info.ty,
            });
        }
        let mut out = vec![0f32; len];
        dequantize_row(info.ty, self.file.tensor_data(info), &mut out);
        Ok(out)
    }

    fn opt_vector(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>, ModelError> {
        match self.file.tensor(name) {
            None => Ok(None),
            Some(_) => self.vector(name, len).map(Some),
        }
    }
}

impl Weights {
    /// The weight index of `file`, the matrices the arithmetic computes from a repacked copy
    /// repacked (in memory; the file is never written): with [`Arithmetic::Fast`] every one
    /// that [`PackedMatrix`] takes; with [`Arithmetic::Exact`] the Q3_K, Q4_K, Q5_K, Q6_K, Q8_0 and
    /// IQ4_XS layer matrices of a dense model, a mixture's Q4_K and Q8_0 experts and every MXFP4 matrix, for which the interleaved
    /// kernels have llama.cpp's bits (see `Model::project_exact`). Without a file of packed
    /// weights they wait to be packed ([`Self::finish_packing`]), so that a load costs no
    /// packing: the first forward pass packs each work item's groups as it goes.
    pub fn load(
        file: &Arc<GgufFile>,
        hp: &HParams,
        arithmetic: Arithmetic,
    ) -> Result<Weights, ModelError> {
        let mut w = Self::index(file, hp)?;
        w.pack(file, arithmetic);
        Ok(w)
    }

    /// The matrices `arithmetic` computes repacked, in a fixed order: with [`Arithmetic::Fast`]
    /// every layer matrix and the output projection, with [`Arithmetic::Exact`] the Q3_K, Q4_K,
    /// Q5_K, Q6_K, Q8_0 and IQ4_XS layer matrices of a dense model, a mixture's Q4_K and Q8_0
    /// experts and every MXFP4 one. (Those whose
    /// shape or type [`PackedMatrix`] does not take stay as they are.)
    fn pack_targets(&mut self, arithmetic: Arithmetic) -> Vec<&mut Matrix> {
        let exact = arithmetic == Arithmetic::Exact;
        let mut targets: Vec<&mut Matrix> = self
            .layers
            .iter_mut()
            .flat_map(|l| {
                let mut m = vec![&mut l.wq, &mut l.wk, &mut l.wv, &mut l.wo];
                let moe = matches!(l.ffn, Ffn::Moe(_));
                m.extend(
                    l.ffn
                        .matrices_mut()
                        .into_iter()
                        // An expert's rows are one-row products in llama.cpp (`mul_mat_id`),
                        // Q4_K's in its repacked gemv's chain, which the interleaved kernels
                        // have (`Chain::Default`), Q8_0's in `Chain::Q8Lanes`; its other
                        // K-quants' chains they lack.
                        .filter(|m| {
                            !exact
                                || !moe
                                || matches!(
                                    m.info.ty,
                                    GgmlType::MXFP4 | GgmlType::Q4_K | GgmlType::Q8_0
                                )
                        }),
                );
                m
            })
            .filter(|m| {
                !exact
                    || matches!(
                        m.info.ty,
                        GgmlType::Q3_K
                            | GgmlType::Q4_K
                            | GgmlType::Q5_K
                            | GgmlType::Q6_K
                            | GgmlType::IQ4_XS
                            | GgmlType::MXFP4
                            | GgmlType::Q8_0
                    )
            })
            .collect();
        if !exact {
            targets.push(&mut self.output);
        }
        targets
    }

    /// Sets the matrices `arithmetic` computes repacked to wait to be packed from the file, or
    /// maps them from the file of packed weights that `NUCLEUS_PACK_CACHE` asks for
    /// ([`PackCache`]), packing them now and writing that file when it is missing or stale.
    fn pack(&mut self, file: &Arc<GgufFile>, arithmetic: Arithmetic) {
        let Some(cache) = PackCache::for_file(file, arithmetic) else {
            return self.defer(file, arithmetic);
        };
        let mut targets = self.pack_targets(arithmetic);
        let entries: Vec<Entry> = targets.iter().map(|m| m.pack_entry()).collect();
        match cache.load(&entries) {
            Ok(packed) => {
                for (m, p) in targets.iter_mut().zip(packed) {
                    m.packed = p.map(Arc::new);
                }
                return;
            }
            Err(why) if cache.path().exists() => eprintln!(
                "nucleus: not using {} ({why}): packing the model again",
                cache.path().display()
            ),
            Err(_) => {}
        }
        drop(entries);
        self.defer(file, arithmetic);
        self.finish_packing();
        let targets = self.pack_targets(arithmetic);
        let entries: Vec<(Entry, Option<&PackedMatrix>)> = targets
            .iter()
            .map(|m| (m.pack_entry(), m.packed.as_deref()))
            .collect();
        match cache.store(&entries) {
            Ok(size) => eprintln!(
                "nucleus: packed weights written to {} ({:.2} GB)",
                cache.path().display(),
                size as f64 / 1e9
            ),
            Err(e) => eprintln!(
                "nucleus: could not write packed weights to {}: {e}",
                cache.path().display()
            ),
        }
    }

    /// Sets [`Self::pack_targets`] to wait to be packed from `file`: where huge pages are
    /// wanted, into parts of one arena in them ([`Arena`]), so that matrices too small for huge
    /// pages of their own (a mixture's experts) get them too.
    fn defer(&mut self, file: &Arc<GgufFile>, arithmetic: Arithmetic) {
        let exact = arithmetic == Arithmetic::Exact;
        let mut targets = self.pack_targets(arithmetic);
        let mut waiting = Vec::with_capacity(targets.len());
        for m in &targets {
            // `--exact` computes a Q3_K, Q5_K, Q6_K or IQ4_XS matrix's generated tokens from
            // the file (llama.cpp's one-row kernel): its pages stay. A tied embedding keeps
            // reading its rows from the file (dropping pages only drops what is resident).
            let keeps_file = exact
                && matches!(
                    m.info.ty,
                    GgmlType::Q3_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::IQ4_XS
                );
            let rows = TensorRows {
                file: Arc::clone(file),
                info: m.info.clone(),
                release: !keeps_file,
            };
            waiting.push(PackedMatrix::deferred(
                m.info.ty,
                m.rows,
                m.cols,
                Box::new(rows),
            ));
        }
        let lens: Vec<usize> = waiting.iter().flatten().map(|p| p.bytes()).collect();
        if let Some((arena, offsets)) = Arena::parts(&lens) {
            for (p, offset) in waiting.iter_mut().flatten().zip(offsets) {
                // SAFETY: `parts` laid the parts side by side, one per matrix, none overlapping.
                unsafe { p.place_in(Arc::clone(&arena), offset) };
            }
        }
        for (m, p) in targets.iter_mut().zip(waiting) {
            m.packed = p.map(Arc::new);
        }
    }

    /// Whether a matrix waits to be packed.
    pub fn packing_left(&self) -> bool {
        !self.waiting().is_empty()
    }

    /// The packed matrices that wait to be packed, the layers' in order, then the output
    /// projection.
    fn waiting(&self) -> Vec<&PackedMatrix> {
        let layers = self.layers.iter().flat_map(|l| {
            let mut m = vec![&l.wq, &l.wk, &l.wv, &l.wo];
            m.extend(l.ffn.matrices());
            m
        });
        layers
            .chain([&self.output])
            .filter_map(|m| m.packed.as_deref())
            .filter(|p| !p.is_packed())
            .collect()
    }

    /// Packs every matrix that waits, spread over the cores, each into memory of its own (the
    /// file's pages dropped as they are read, so that memory never holds both copies).
    /// Products running meanwhile on other threads are not disturbed: a matrix is either
    /// read packed or packed by the work item that reads it, with the same bits.
    pub fn finish_packing(&self) {
        self.finish_packing_where(|_| true);
    }

    /// [`Self::finish_packing`] for the waiting matrices that `pick` picks; whether some
    /// matrix still waits (one it passed over).
    pub(super) fn finish_packing_where(&self, pick: impl Fn(&PackedMatrix) -> bool) -> bool {
        let mut todo = self.waiting();
        // The output projection (not `--exact`'s) is packed last, on every core (`finish`
        // spreads one matrix this large over the cores): its decode tiles read the groups as
        // stored, as fast as llama.cpp's one-row kernel streams the matrix for one row and 1.7x
        // as fast for four (`MATMUL_SHAPE=151936,896 matmul_bench 2 Q8_0`), which is what a
        // verification pass of speculation and a batch of decoding sequences ask of it.
        let out = self.output.packed.as_deref().filter(|p| !p.is_packed());
        if out.is_some() {
            todo.pop();
        }
        let waiting = todo.len() + usize::from(out.is_some());
        todo.retain(|p| pick(p));
        let out = out.filter(|p| pick(p));
        let passed_over = waiting > todo.len() + usize::from(out.is_some());
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per = todo.len().div_ceil(threads).max(1);
        std::thread::scope(|s| {
            for part in todo.chunks(per) {
                s.spawn(move || part.iter().for_each(|p| p.finish()));
            }
        });
        if let Some(out) = out {
            out.finish();
        }
        passed_over
    }

    fn index(file: &GgufFile, hp: &HParams) -> Result<Weights, ModelError> {
        let l = Loader { file };
        let (e, v) = (hp.n_embd, hp.n_vocab);
        let token_embd = l.matrix("token_embd.weight", e, v)?;
        let output = if file.tensor("output.weight").is_some() {
            l.matrix("output.weight", e, v)?
        } else {
            token_embd.clone()
        };
        for name in ["rope_factors_long.weight", "rope_factors_short.weight"] {
            if file.tensor(name).is_some() {
                return Err(ModelError::Invalid(format!(
                    "tensor {name}: LongRoPE scaling (Phi-3 128k, Phi-3.5) is not supported yet"
                )));
            }
        }
        let layers = (0..hp.n_layers)
            .map(|i| l.layer(i, hp))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Weights {
            token_embd,
            output_norm: l.vector("output_norm.weight", e)?,
            output,
            rope_freqs: l.opt_vector("rope_freqs.weight", hp.rope_dim / 2)?,
            layers,
        })
    }
}
