//! The matrix products of the forward pass: each input quantized once for every product that
//! reads it, and each product sent to the kernels of the model's arithmetic (nucleus's
//! interleaved ones for repacked matrices, llama.cpp's one-row or batched ones otherwise).

use crate::kernels::interleaved::{
    matmul_packed_chain, matmul_packed_each, matmul_packed_many, packed_act_type, Arithmetic,
    Chain, EachProduct, PackedActs, PackedMatrix,
};

use crate::kernels::matmul::{
    matmul_rows, PromptSlot, QuantizedActs, CLASS_UBATCH_8, CLASS_WHOLE_FOUR,
};
use crate::kernels::pool::ThreadPool;
use crate::quant::{vec_dot_type, GgmlType};

use super::weights::Matrix;
use super::Model;

/// The most tokens whose product on a matrix that waits to be packed reads the file itself
/// ([`from_file`]).
pub(super) const FILE_PASS_TOKENS: usize = 4;

/// The types whose few-token products read the file while their matrix waits to be packed
/// ([`from_file`]).
fn reads_from_file(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q3_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::IQ4_XS
    )
}

/// The types that decode faster from the file than packed, so that a pass of a few tokens
/// leaves them waiting ([`super::Model::finish_packing`]): `nucleus run -n 33`, the same text,
/// 2026-11-28 on the Cascade Lake Xeon, with them left waiting / packed at the second pass: the
/// 7B Q5_K_M shape 8.20–8.39 s / 9.92–10.20, the 7B Q4_K_M (its Q6_K) 6.67–6.70 / 7.53–8.69,
/// the 1.5B Q6_K 1.81–1.84 / 2.51–2.69, the 1.5B Q5_K_M 2.02–2.08 / 2.02–2.07; Q3_K and
/// IQ4_XS (not among them) 3.07–3.12 / 2.65–2.75 and 2.87–2.88 / 2.59–2.73.
pub(super) fn decodes_from_file(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q5_K | GgmlType::Q6_K)
}

/// Whether the product of `n` tokens on `p`, a matrix that still waits to be packed (a
/// one-shot command's first pass), computes from the file with llama.cpp's tiled kernel for its
/// type rather than packing each work item's groups as it goes: the interleaved kernels of
/// these types follow that kernel's chain (`kernels/interleaved/tests_tiled.rs`: the same bits
/// for any number of tokens), and a few tokens read the file once either way, so packing them
/// is work the first token waits for (the 7B Q5_K_M shape: half the first pass's time).
fn from_file(p: &PackedMatrix, n: usize) -> bool {
    n <= FILE_PASS_TOKENS && !p.is_packed() && reads_from_file(p.ty())
}

/// Activations quantized for the matrix products, one buffer per vec-dot type, reused until the
/// input changes (q, k and v share one quantization of the normed input; so do gate and up).
#[derive(Default)]
pub(super) struct ActsCache {
    slots: Vec<(GgmlType, u64, QuantizedActs)>,
    epoch: u64,
    /// The block sums of the Q8_0 slot for the interleaved products, and its epoch.
    packed: (u64, PackedActs),
}

impl ActsCache {
    pub(super) fn invalidate(&mut self) {
        self.epoch += 1;
    }

    fn get(
        &mut self,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        cols: usize,
        ty: GgmlType,
    ) -> &QuantizedActs {
        let i = self.quantized(pool, x, n, cols, ty);
        &self.slots[i].2
    }

    /// The index of the slot holding `x` quantized to `ty` in this epoch (quantized now if it
    /// is not yet).
    fn quantized(
        &mut self,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        cols: usize,
        ty: GgmlType,
    ) -> usize {
        let (i, epoch) = (self.slot(ty), self.epoch);
        let slot = &mut self.slots[i];
        if slot.1 != epoch {
            slot.2.quantize_in(pool, x, n, cols, ty);
            slot.1 = epoch;
        }
        i
    }

    /// The slot of `src`'s type holds rows `rows` of `src` in this epoch: the products of this
    /// epoch that read that type take them as their input's quantization.
    pub(super) fn gathered(
        &mut self,
        src: &QuantizedActs,
        rows: impl ExactSizeIterator<Item = usize>,
    ) {
        let i = self.slot(src.ty());
        self.slots[i].2.gather(src, rows);
        self.slots[i].1 = self.epoch;
    }

    /// The index of the slot of `ty` (made if there is none).
    fn slot(&mut self, ty: GgmlType) -> usize {
        match self.slots.iter().position(|s| s.0 == ty) {
            Some(i) => i,
            None => {
                self.slots.push((ty, u64::MAX, QuantizedActs::new()));
                self.slots.len() - 1
            }
        }
    }

    /// Slot `i`'s rows (Q8_0) and their block sums, prepared once an epoch.
    fn with_sums(&mut self, i: usize) -> (&QuantizedActs, &PackedActs) {
        let q = &self.slots[i].2;
        if self.packed.0 != self.epoch {
            self.packed.1.prepare(q);
            self.packed.0 = self.epoch;
        }
        (q, &self.packed.1)
    }

    /// The Q8_0 rows of `x` and their block sums for [`matmul_packed_chain`].
    fn get_packed(
        &mut self,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        cols: usize,
    ) -> (&QuantizedActs, &PackedActs) {
        let i = self.quantized(pool, x, n, cols, GgmlType::Q8_0);
        self.with_sums(i)
    }
}

impl Model {
    /// y = W·x for each of the `n` rows of x. In llama.cpp's arithmetic `slots[t]` picks row
    /// t's kernels; in nucleus's every row is computed alike (the repacked matrices through
    /// the interleaved kernels, the others through llama.cpp's one-row kernels).
    pub(super) fn project(
        &self,
        acts: &mut ActsCache,
        w: &Matrix,
        (x, slots): (&[f32], &[PromptSlot]),
        n: usize,
        y: &mut [f32],
    ) {
        let x = &x[..n * w.cols];
        let y = &mut y[..n * w.rows];
        if let (Some(p), Arithmetic::Exact) = (&w.packed, self.arithmetic) {
            return self.project_exact(acts, w, p, (x, slots), n, y);
        }
        if let Some(p) = &w.packed {
            if from_file(p, n) {
                let q = acts.get(&self.pool, x, n, w.cols, vec_dot_type(w.info.ty));
                let batched = [PromptSlot::BATCHED; FILE_PASS_TOKENS];
                return matmul_rows(&self.pool, &w.q(&self.file), q, y, &batched[..n]);
            }
            if packed_act_type(p.ty()) == GgmlType::Q8_K {
                let q = acts.get(&self.pool, x, n, w.cols, GgmlType::Q8_K);
                let none = PackedActs::new();
                return matmul_packed_chain(&self.pool, p, q, &none, y, Chain::fast());
            }
            let (q, pa) = acts.get_packed(&self.pool, x, n, w.cols);
            return matmul_packed_chain(&self.pool, p, q, pa, y, Chain::fast());
        }
        // nucleus's arithmetic sends every row through llama.cpp's one-row kernels: one
        // arithmetic for all rows. (Its batched kernels, for every row, cost up to 2.3x more per
        // generated token here and measure the same distance from `--exact`.)
        let slots = match self.arithmetic {
            Arithmetic::Exact => slots,
            Arithmetic::Fast => &[],
        };
        let q = acts.get(&self.pool, x, n, w.cols, vec_dot_type(w.info.ty));
        matmul_rows(&self.pool, &w.q(&self.file), q, y, slots);
    }

    /// [`Self::project`] in llama.cpp's arithmetic for a matrix `--exact` repacked (Q3_K to Q6_K
    /// and IQ4_XS, `Weights::load`): each run of rows that llama.cpp computes with the same
    /// kernel goes to the interleaved kernel with that kernel's float chain, where there is one
    /// (Q4_K: the gemm's pairs for rows in whole groups of four, the gemv's chain for the
    /// others; Q3_K, Q5_K, Q6_K and IQ4_XS: the tiled kernel's for rows of a micro-batch of 8+),
    /// else to llama.cpp's one-row kernels reading the file (their generated tokens). The same bits as `matmul_rows` for
    /// every row (kernels/interleaved/tests.rs), at the interleaved kernels' speed.
    fn project_exact(
        &self,
        acts: &mut ActsCache,
        w: &Matrix,
        p: &PackedMatrix,
        (x, slots): (&[f32], &[PromptSlot]),
        n: usize,
        y: &mut [f32],
    ) {
        // One kernel for every row in llama.cpp, whose chain the interleaved kernels have:
        // MXFP4 matrices of whole groups of 8 rows take its repacked kernels, Q8_0 its one-row
        // kernel (eight lanes a block).
        let every_row = match p.ty() {
            GgmlType::MXFP4 => Some(Chain::Default),
            GgmlType::Q8_0 => Some(Chain::Q8Lanes),
            _ => None,
        };
        if let Some(chain) = every_row {
            let (q, pa) = acts.get_packed(&self.pool, x, n, w.cols);
            return matmul_packed_chain(&self.pool, p, q, pa, y, chain);
        }
        let route = |t: usize| {
            let class = slots.get(t).copied().unwrap_or_default().matmul_class();
            match p.ty() {
                GgmlType::Q4_K if class & CLASS_WHOLE_FOUR != 0 => Some(Chain::Q4kPairs),
                GgmlType::Q4_K => Some(Chain::Default),
                _ if class & CLASS_UBATCH_8 != 0 => Some(Chain::Default),
                _ => None,
            }
        };
        let ty = vec_dot_type(w.info.ty);
        let mut start = 0;
        while start < n {
            let r = route(start);
            let end = (start..n).find(|&t| route(t) != r).unwrap_or(n);
            let (xs, ys) = (
                &x[start * w.cols..end * w.cols],
                &mut y[start * w.rows..end * w.rows],
            );
            // One run (the usual case): the input as quantized for the other products.
            let mut own = QuantizedActs::new();
            let q = if end - start == n {
                acts.get(&self.pool, x, n, w.cols, ty)
            } else {
                own.quantize_in(&self.pool, xs, end - start, w.cols, ty);
                &own
            };
            match r {
                Some(chain) => matmul_packed_chain(&self.pool, p, q, &PackedActs::new(), ys, chain),
                None => {
                    let run = &slots[start.min(slots.len())..end.min(slots.len())];
                    matmul_rows(&self.pool, &w.q(&self.file), q, ys, run)
                }
            }
            start = end;
        }
    }

    /// [`Self::project`] for matrices that read the same input: in nucleus's arithmetic, when
    /// all are repacked, one pass of the thread pool for all of them (the same bits).
    pub(super) fn project_many<const N: usize>(
        &self,
        acts: &mut ActsCache,
        products: [(&Matrix, &mut [f32]); N],
        x: (&[f32], &[PromptSlot]),
        n: usize,
    ) {
        self.project_list(acts, products.into_iter().collect(), x, n);
    }

    /// [`Self::project_many`] for any number of products (a decode step's experts).
    pub(super) fn project_list(
        &self,
        acts: &mut ActsCache,
        products: Vec<(&Matrix, &mut [f32])>,
        (x, slots): (&[f32], &[PromptSlot]),
        n: usize,
    ) {
        let Some(ty) = self.shared_act_type(products.iter().map(|(w, _)| &**w), n) else {
            for (w, y) in products {
                self.project(acts, w, (x, slots), n, y);
            }
            return;
        };
        let cols = products[0].0.cols;
        let i = acts.quantized(&self.pool, &x[..n * cols], n, cols, ty);
        self.packed_list(acts, i, products, n);
    }

    /// The repacked `products`, all reading the type of `acts`'s slot `i`, on its rows, in one
    /// pass of the thread pool.
    fn packed_list(
        &self,
        acts: &mut ActsCache,
        i: usize,
        products: Vec<(&Matrix, &mut [f32])>,
        n: usize,
    ) {
        let mut list: Vec<(&PackedMatrix, &mut [f32])> = products
            .into_iter()
            .map(|(w, y)| {
                let p = w.packed.as_deref().expect("a repacked matrix");
                (p, &mut y[..n * w.rows])
            })
            .collect();
        if acts.slots[i].0 == GgmlType::Q8_K {
            let none = PackedActs::new();
            let q = &acts.slots[i].2;
            return matmul_packed_many(&self.pool, &mut list, q, &none, Chain::fast());
        }
        let (q, pa) = acts.with_sums(i);
        matmul_packed_many(&self.pool, &mut list, q, pa, Chain::fast());
    }

    /// The activation type every one of `matrices` reads in one pass of [`Self::project_list`]
    /// for `n` tokens (for any number: 1), where there is one: in nucleus's arithmetic, all
    /// repacked, none waiting to be read from the file, all reading one type.
    pub(super) fn shared_act_type<'a>(
        &self,
        mut matrices: impl Iterator<Item = &'a Matrix>,
        n: usize,
    ) -> Option<GgmlType> {
        let ty = |w: &Matrix| match w.packed.as_deref() {
            Some(p) if !from_file(p, n) => Some(packed_act_type(p.ty())),
            _ => None,
        };
        let first = ty(matrices.next()?)?;
        let all = matrices.all(|w| ty(w) == Some(first));
        (self.arithmetic == Arithmetic::Fast && all).then_some(first)
    }

    /// [`Self::project_list`] of matrices of [`Self::shared_act_type`] `ty`, whose input's
    /// quantization this epoch's slot of `ty` holds already ([`ActsCache::gathered`]).
    pub(super) fn project_gathered(
        &self,
        acts: &mut ActsCache,
        ty: GgmlType,
        products: Vec<(&Matrix, &mut [f32])>,
        n: usize,
    ) {
        let i = acts.slot(ty);
        assert_eq!(
            acts.slots[i].1, acts.epoch,
            "project_gathered: nothing gathered"
        );
        assert_eq!(
            acts.slots[i].2.n_tokens(),
            n,
            "project_gathered: token count"
        );
        self.packed_list(acts, i, products, n);
    }

    /// [`Self::project`] of each matrix by its own input row (a decode step's experts' down
    /// products), `own` holding the inputs' quantizations: where they have a
    /// [`Self::shared_act_type`], one pass of the thread pool for all of them (the same bits:
    /// each input quantized as `project` would).
    pub(super) fn project_each(
        &self,
        acts: &mut ActsCache,
        own: &mut Vec<(QuantizedActs, PackedActs)>,
        products: Vec<(&Matrix, &[f32], &mut [f32])>,
    ) {
        let Some(ty) = self.shared_act_type(products.iter().map(|(w, _, _)| &**w), 1) else {
            for (w, x, y) in products {
                acts.invalidate();
                self.project(acts, w, (x, &[]), 1, y);
            }
            return;
        };
        own.resize_with(own.len().max(products.len()), Default::default);
        for ((w, x, _), (q, pa)) in products.iter().zip(own.iter_mut()) {
            q.quantize_in(&self.pool, &x[..w.cols], 1, w.cols, ty);
            if ty == GgmlType::Q8_0 {
                pa.prepare(q);
            }
        }
        let mut list: Vec<EachProduct> = products
            .into_iter()
            .zip(own.iter())
            .map(|((w, _, y), (q, pa))| EachProduct {
                w: w.packed.as_deref().expect("checked above"),
                x: q,
                acts: pa,
                y: &mut y[..w.rows],
            })
            .collect();
        matmul_packed_each(&self.pool, &mut list, Chain::fast());
    }
}
