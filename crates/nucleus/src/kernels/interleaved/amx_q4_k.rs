//! Q4_K on AMX tiles ([`super::amx`]), in its two chains: the one-row kernels' one fused
//! multiply-add per super-block (nucleus's arithmetic where the tiles run), and llama.cpp's
//! gemm chain of one per pair of sub-blocks (`--exact`). The weights carry their sub-blocks'
//! scales (two planes, [`ItemWeights::q4_k`]), so the tiles give a super-block's `Σ sc·Σ q·x`
//! (the pairs chain: each pair of sub-blocks' part of it, one product of 64 values per plane),
//! exact, as the vector kernels add it in 32 bits; the mins come from the activations' sums.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::amx::{
    d_dmin, plane_sum, write_out, Acc, ItemWeights, Job, Mins, Sums, Tiles, ITEM_TOKENS,
};

/// Q4_K: the chain of [`q4_k::tile_scalar`] (`PAIRS`: of `tile_scalar_pairs`).
///
/// # Safety
/// As [`super::amx::block32`], the activations being Q8_K rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn q4_k<T: Tiles, const PAIRS: bool>(tiles: &mut T, w: &ItemWeights, job: &Job) {
    let mut local = MaybeUninit::uninit();
    // SAFETY: the caller's contract.
    unsafe {
        tiles.configure(job.rows(), 64);
        if PAIRS {
            pairs(tiles, w, job, job.acc_place::<2>(&mut local));
        } else {
            one_fma(tiles, w, job, job.acc_place::<2>(&mut local));
        }
        if !job.ends() {
            return;
        }
        // The tokens' accumulators, written over the whole row (the others' are not).
        let accs = job.acc_place::<2>(&mut local);
        for t in 0..job.m {
            for h in 0..2 {
                (*accs)[0][t][h] = _mm512_sub_ps((*accs)[0][t][h], (*accs)[1][t][h]);
            }
        }
        let out = std::ptr::addr_of!((*accs)[0]) as *const [__m512; 2];
        write_out(std::slice::from_raw_parts(out, job.m), job, w.groups);
    }
}

/// The one-FMA chain over the job's slice: per super-block, `acc += Σ sc·Σ q·x · (d·dy)` and
/// `acc_min += Σ m·Σ x · (dmin·dy)` (`accs`: the two), the products `d·dy` and `dmin·dy`
/// computed where they are used (storing them per token first cost a pass over 8 KB). A row's
/// first super-block adds to zeros without reading the accumulators, which need not be cleared
/// first (clearing 8 KB a call, in `memset`, cost 3 % of the product).
///
/// # Safety
/// As [`q4_k`], the tiles configured for the job; `accs` valid for writes, and past a row's
/// first block, holding the slice before's.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn one_fma<T: Tiles>(tiles: &mut T, w: &ItemWeights, job: &Job, accs: *mut [Acc; 2]) {
    let mut c = Sums::new();
    let mut mins = Mins::new();
    // SAFETY: the caller's contract; tokens below job.m only.
    unsafe {
        for b in job.slice.clone() {
            mins.load(w, job, b);
            let b_at = w.b.as_ptr().add(16384 * b);
            tiles.planes(job.a_tiles(4 * b, 64), 64, b_at, 4, c.as_mut_ptr());
            if b == 0 {
                fold::<true>(&c, &mins, w, job, b, accs);
            } else {
                fold::<false>(&c, &mins, w, job, b, accs);
            }
        }
    }
}

/// [`one_fma`]'s folds of super-block `b` (`FIRST`: the row's first, onto zeros).
///
/// # Safety
/// As [`one_fma`]; the tiles stored `b`'s sums in `c`, and `mins` holds `b`'s.
#[inline(always)]
unsafe fn fold<const FIRST: bool>(
    c: &Sums,
    mins: &Mins,
    w: &ItemWeights,
    job: &Job,
    b: usize,
    accs: *mut [Acc; 2],
) {
    // SAFETY: the caller's contract; tokens below job.m only.
    unsafe {
        let [dw, dmw] = d_dmin(w, b);
        let zero = _mm512_setzero_ps();
        for t in 0..job.m {
            let dy = job.dy(t, b);
            for h in 0..2 {
                let sum = _mm512_cvtepi32_ps(plane_sum::<5>(c, t, h));
                let min = _mm512_cvtepi32_ps(mins.all(t, h));
                let (acc, acc_min) = if FIRST {
                    (zero, zero)
                } else {
                    ((*accs)[0][t][h], (*accs)[1][t][h])
                };
                (*accs)[0][t][h] = _mm512_fmadd_ps(sum, _mm512_mul_ps(dw[h], dy), acc);
                (*accs)[1][t][h] = _mm512_fmadd_ps(min, _mm512_mul_ps(dmw[h], dy), acc_min);
            }
        }
    }
}

/// Q4_K's pairs of sub-blocks whose products run before their folds (their sums side by
/// side, each token's accumulators loaded once for them).
const PAIRS_AT_ONCE: usize = 2;

/// The pairs chain over the job's slice: per pair of sub-blocks, `acc += sum·(d·dy)` and
/// `acc_min += min·(dmin·dy)` (`accs`: the two; a row's first pair adds to zeros).
///
/// # Safety
/// As [`one_fma`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn pairs<T: Tiles>(tiles: &mut T, w: &ItemWeights, job: &Job, accs: *mut [Acc; 2]) {
    let mut pair_sums: [Sums; PAIRS_AT_ONCE] = std::array::from_fn(|_| Sums::new());
    let mut sb = SuperBlock::new();
    // SAFETY: the caller's contract; tokens below job.m only.
    unsafe {
        for b in job.slice.clone() {
            sb.load(w, job, b);
            for p0 in (0..4).step_by(PAIRS_AT_ONCE) {
                for (i, c) in pair_sums.iter_mut().enumerate() {
                    let b_at = w.b.as_ptr().add(16384 * b + 2048 * (p0 + i));
                    let a = job.a_tiles(4 * b + p0 + i, 64);
                    tiles.pair_planes(a, 64, b_at, c.as_mut_ptr());
                }
                if b == 0 && p0 == 0 {
                    fold_pairs::<true>(&pair_sums, &sb, job, p0, accs);
                } else {
                    fold_pairs::<false>(&pair_sums, &sb, job, p0, accs);
                }
            }
        }
    }
}

/// [`pairs`]' folds of pairs `p0..p0 + PAIRS_AT_ONCE` (`FIRST`: the row's first, onto zeros;
/// a choice inside one loop became a `memset` of the accumulators).
///
/// # Safety
/// As [`pairs`]; the tiles stored the pairs' sums, `sb` holds their super-block's numbers,
/// and `accs` the job's tokens' accumulators unless `FIRST`.
#[inline(always)]
unsafe fn fold_pairs<const FIRST: bool>(
    pair_sums: &[Sums; PAIRS_AT_ONCE],
    sb: &SuperBlock,
    job: &Job,
    p0: usize,
    accs: *mut [Acc; 2],
) {
    // SAFETY: the caller's contract; tokens below job.m only.
    unsafe {
        for t in 0..job.m {
            for h in 0..2 {
                let (acc, acc_min) = (&raw mut (*accs)[0][t][h], &raw mut (*accs)[1][t][h]);
                let (mut a, mut am) = if FIRST {
                    (_mm512_setzero_ps(), _mm512_setzero_ps())
                } else {
                    (*acc, *acc_min)
                };
                for (i, c) in pair_sums.iter().enumerate() {
                    let (sum, min) = (plane_sum::<5>(c, t, h), sb.mins.pair(t, h, p0 + i));
                    sb.fold(&mut a, &mut am, (t, h), sum, min);
                }
                (*acc, *acc_min) = (a, am);
            }
        }
    }
}

/// One Q4_K super-block's numbers for the pairs chain's folds (which use each `d·dy` four
/// times), per token and half of the item's rows.
struct SuperBlock {
    /// `d·dy` and `dmin·dy`, rounded as the vector kernels round them: written for the job's
    /// tokens by [`SuperBlock::load`] before the folds read them (clearing 8 KB a job cost a
    /// `memset`).
    dv: MaybeUninit<[[__m512; 2]; ITEM_TOKENS]>,
    dminv: MaybeUninit<[[__m512; 2]; ITEM_TOKENS]>,
    mins: Mins,
}

impl SuperBlock {
    #[target_feature(enable = "avx512f")]
    fn new() -> Self {
        SuperBlock {
            dv: MaybeUninit::uninit(),
            dminv: MaybeUninit::uninit(),
            mins: Mins::new(),
        }
    }

    /// Super-block `b`'s numbers.
    #[inline(always)]
    unsafe fn load(&mut self, w: &ItemWeights, job: &Job, b: usize) {
        // SAFETY: the caller's contract: `w` holds d, dmin and the mins of `b`; tokens below
        // job.m have Q8_K rows of `blocks` super-blocks (f32 d at 0).
        unsafe {
            let [dw, dmw] = d_dmin(w, b);
            self.mins.load(w, job, b);
            for t in 0..job.m {
                let dy = job.dy(t, b);
                for h in 0..2 {
                    (*self.dv.as_mut_ptr())[t][h] = _mm512_mul_ps(dw[h], dy);
                    (*self.dminv.as_mut_ptr())[t][h] = _mm512_mul_ps(dmw[h], dy);
                }
            }
        }
    }

    /// `acc += sum·(d·dy)`, `acc_min += min·(dmin·dy)` for token `t`, rows `16h..`: the one
    /// FMA per pair of the vector kernels' chain.
    ///
    /// # Safety
    /// [`SuperBlock::load`] ran for a job with token `t`.
    #[inline(always)]
    unsafe fn fold(
        &self,
        acc: &mut __m512,
        acc_min: &mut __m512,
        (t, h): (usize, usize),
        sum: __m512i,
        min: __m512i,
    ) {
        // SAFETY: the caller's contract: token t's numbers are written.
        unsafe {
            let (dv, dminv) = ((*self.dv.as_ptr())[t][h], (*self.dminv.as_ptr())[t][h]);
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), dv, *acc);
            *acc_min = _mm512_fmadd_ps(_mm512_cvtepi32_ps(min), dminv, *acc_min);
        }
    }
}
