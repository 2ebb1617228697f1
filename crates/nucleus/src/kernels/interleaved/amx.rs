//! AMX tiles for a prompt's products (Intel Xeon from Sapphire Rapids on): the exact integer
//! sums of each block come from `tdpbssd`, 32 tokens by a work item's 32 rows (four groups)
//! at a time, and the float chain after them is the one every other kernel of this module
//! follows, so a token's outputs have the same bits whether its prompt ran on tiles or on
//! vectors, and whether it came alone (decode) or among many: batch invariance holds across
//! the paths.
//!
//! Per unit of work:
//! - A tiles (`tmm0`, `tmm1`): sixteen tokens' activations each (Q8_0: the 32 values of block
//!   `b`; Q8_K: 64 consecutive values of a super-block), packed once per product as the tiles
//!   load them fastest, rows of `k` bytes one after the other ([`pack_acts`]);
//! - B tiles (`tmm2`, `tmm3`): sixteen rows each, two groups' 32-byte chunks side by side (four
//!   consecutive values of each row per chunk, as `tdpbssd` wants them), copied into this
//!   layout once per work item, on cache lines ([`super::amx_layout`]);
//! - C tiles (`tmm4..=tmm7`): 16 tokens × 16 rows of exact 32-bit sums each, stored and folded
//!   with AVX-512 into the float chain.
//!
//! Blocks of 32 (Q8_0, Q5_0, Q4_0, IQ4_NL, MXFP4) take one product per block, as llama.cpp's
//! AMX kernels do; unsigned values (Q5_0 + 16, Q4_0 + 8) are positive bytes, their offsets
//! coming off as in the vector kernels. The K-quants' scales change every 32 (Q4_K, Q5_K,
//! IQ4_XS) or 16 (Q6_K) values, too often to fold a tile each time; so their weights carry
//! them: Q4_K's `sc·q` (at most 945), Q5_K's (at most 1953), Q6_K's `sc·(q − 32)` (−3968 to
//! 4096) and IQ4_XS's `(ls − 32)·kvalues[q]` (−3937 to 4064) are split into two planes of
//! signed bytes, `2^s·hi + lo`, and the tiles sum each plane over a pair of sub-blocks (Q4_K in
//! the pair chain) or a whole super-block (the others, and Q4_K in the one-row kernel's
//! chain), exactly the integers the vector kernels add in 32 bits. IQ4_XS's chain is Q6_K's,
//! so Q6_K's kernel computes it.
//!
//! The tile registers are reached through [`Tiles`]: [`Hardware`] issues the instructions,
//! [`Emulated`] computes the same sums in plain code, so that the folds, the addressing and
//! the invariance are tested on any AVX-512 machine, and the instructions themselves where
//! the CPU has AMX.

use std::arch::asm;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;
use std::sync::OnceLock;

use super::GROUP_ROWS;

/// Tokens per A tile (the rows of A and C).
pub(crate) const TILE_M: usize = 16;

/// Why this process does not use AMX, or `None` when it does.
pub fn amx_refusal() -> Option<&'static str> {
    static STATE: OnceLock<Option<&'static str>> = OnceLock::new();
    *STATE.get_or_init(|| {
        match std::env::var("NUCLEUS_AMX").as_deref() {
            Ok("0") => return Some("off (NUCLEUS_AMX=0)"),
            Ok("emulate") => return Some("emulated (NUCLEUS_AMX=emulate)"),
            _ => {}
        }
        if !avx512() {
            return Some("off (below AVX-512)");
        }
        // CPUID leaf 7 exists on every CPU with AVX-512 (checked above).
        let leaf7 = __cpuid_count(7, 0);
        if leaf7.edx & (1 << 24) == 0 || leaf7.edx & (1 << 25) == 0 {
            return Some("off (the CPU has no AMX-INT8)");
        }
        if request_tile_data() != 0 {
            return Some("off (the kernel refused the tile state)");
        }
        None
    })
}

/// Whether `NUCLEUS_AMX=emulate` asks for the tile path with [`Emulated`] tiles: slow, but it
/// runs the path (its addressing and folds) in whole models on any AVX-512 machine.
pub(crate) fn emulation_requested() -> bool {
    static ASKED: OnceLock<bool> = OnceLock::new();
    *ASKED.get_or_init(|| std::env::var("NUCLEUS_AMX").is_ok_and(|v| v == "emulate"))
}

/// Whether `NUCLEUS_AMX=emulate` runs the tile path here: asked, on a CPU with AVX-512.
pub(crate) fn emulation_runs() -> bool {
    emulation_requested() && avx512()
}

/// Whether this process runs a prompt's products on tiles, the hardware's or emulated.
pub(crate) fn tiles_run() -> bool {
    uses_amx() || emulation_runs()
}

/// Whether the CPU has what the tile kernels' folds need.
pub(crate) fn avx512() -> bool {
    crate::quant::simd_level() >= crate::quant::SimdLevel::Avx512
}

/// Whether `NUCLEUS_AMX=all` asks for the tiles for every type with a tile kernel and every
/// many-token product, whatever the thresholds of `choice.rs` say: for timing the tiles against
/// the vectors (`scripts/bench_amx.sh`).
pub(crate) fn all_requested() -> bool {
    static ASKED: OnceLock<bool> = OnceLock::new();
    *ASKED.get_or_init(|| std::env::var("NUCLEUS_AMX").is_ok_and(|v| v == "all"))
}

/// Whether prompts run on AMX tiles here.
pub fn uses_amx() -> bool {
    amx_refusal().is_none()
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: Linux enables the tile registers
/// for a process only on request (the first tile instruction faults otherwise). 0 or −errno.
fn request_tile_data() -> i64 {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: the system call changes which xsave features this process may use and touches
    // none of its memory; `syscall` clobbers rcx and r11, declared here.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack)
        );
    }
    ret
}

use super::amx_layout::token_numbers_at;
pub(crate) use super::amx_layout::{a_step, pack_acts, ItemWeights, ITEM_ROWS, ITEM_TOKENS};
pub(crate) use super::amx_q4_k::q4_k;
pub(crate) use super::amx_tiles::{Emulated, Hardware, Tiles};

/// What a kernel call reads and writes: `m` (1 to 32) tokens, packed for the A tiles at `a`
/// ([`pack_acts`], Q8_K rows with the per-super-block numbers the folds read), their per-block
/// scales and offsets (stride `blocks`; Q8_0 activations only), and eight outputs per group of
/// the item per token at `out` (rows `out_stride` floats apart). A long row's product runs in
/// slices of its blocks (`slice`), item after item over each slice before the next, so that a
/// slice of the items' weights stays in L2: each job goes on with the chains where the slice
/// before left them in `carry`, in the same order, so the same bits.
pub(crate) struct Job {
    pub blocks: usize,
    pub slice: std::ops::Range<usize>,
    /// The floats a slice leaves for the next ([`Job::acc_place`]): as many [`Acc`] as the kernel
    /// keeps; null where the slice is the whole row.
    pub carry: *mut Acc,
    pub m: usize,
    pub a: *const u8,
    pub scales: *const f32,
    pub offsets: *const i32,
    pub out: *mut f32,
    pub out_stride: usize,
}

/// A job's float accumulators: per token, its item's 32 rows as two halves of 16.
pub(crate) type Acc = [[__m512; 2]; ITEM_TOKENS];

impl Job {
    /// The `N` accumulators this job works in (Q4_K keeps its mins' apart): `carry`'s where
    /// the row runs in slices, so that each slice goes on where the one before left them
    /// without a copy, else `local`'s. Not cleared: uninitialized at a row's first block,
    /// where the kernels start their chains onto zeros without reading them (clearing 4–8 KB
    /// a call, in `memset`, cost 3 % of a Q4_K product and 7 % of a Q8_0 prompt).
    ///
    /// # Safety
    /// Where `carry` is not null, it has room for `N` accumulators, aligned, used by no one
    /// else while the accumulators are in use, and past a row's first block it holds what the
    /// slice before left there; where it is null, the slice starts at block 0.
    #[inline(always)]
    pub(super) fn acc_place<const N: usize>(
        &self,
        local: &mut MaybeUninit<[Acc; N]>,
    ) -> *mut [Acc; N] {
        if self.carry.is_null() {
            local.as_mut_ptr()
        } else {
            self.carry as *mut [Acc; N]
        }
    }

    /// Whether this job ends its rows' chains (and writes their outputs).
    pub(super) fn ends(&self) -> bool {
        self.slice.end == self.blocks
    }

    /// The two A tiles of step `j`, rows of `k` bytes.
    pub(crate) fn a_tiles(&self, j: usize, k: usize) -> [*const u8; 2] {
        let a = self.a.wrapping_add(a_step(k) * j);
        [a, a.wrapping_add(TILE_M * k)]
    }
    pub(crate) fn rows(&self) -> [usize; 2] {
        [self.m.min(TILE_M), self.m.saturating_sub(TILE_M)]
    }
    /// Super-block `b`'s token numbers (Q8_K activations, [`pack_acts`]): the tokens' `d`
    /// and sub-block sums.
    fn token_numbers(&self, b: usize) -> *const u8 {
        self.a.wrapping_add(token_numbers_at(self.blocks, b))
    }

    /// Token `t`'s `d` of super-block `b` (Q8_K activations), in all lanes.
    ///
    /// # Safety
    /// The activations at `a` are packed Q8_K rows of `blocks` super-blocks ([`pack_acts`]),
    /// `b` < `blocks`, `t` below the job's tokens.
    #[inline(always)]
    pub(super) unsafe fn dy(&self, t: usize, b: usize) -> __m512 {
        // SAFETY: the caller's contract: inside super-block b's token numbers.
        unsafe { _mm512_set1_ps((self.token_numbers(b) as *const f32).add(t).read()) }
    }
}

/// The C tiles of one unit: `[a][h]` 16 tokens × 16 rows, for each of up to two planes (or,
/// for blocks of 32, each of two blocks). On
/// cache lines: `tilestored` writes rows of 64 bytes, and the folds read them back in 512-bit
/// loads; four-byte alignment split each row over two lines (`matmul_bench`, 512 tokens on the
/// 3584×18944 shape, a Xeon with AMX, four alternating rounds: Q4_K 198–255 G MAC/s against
/// 152–221, Q6_K 318–411 against 200–406).
///
/// Not cleared: the tiles store every sum that the folds read (the rows of tokens below the
/// job's `m`) before they read it; clearing 8 KB a call cost as much as a super-block's folds.
#[repr(C, align(64))]
pub(super) struct Sums(MaybeUninit<[i32; 2 * 4 * 256]>);

impl Sums {
    pub(super) fn new() -> Self {
        Sums(MaybeUninit::uninit())
    }

    /// Where the tiles store plane 0's C tiles (plane 1's 1024 sums on).
    pub(super) fn as_mut_ptr(&mut self) -> *mut i32 {
        self.0.as_mut_ptr() as *mut i32
    }
}

/// Plane `plane`'s sums of token `t`, rows `16h..`.
#[inline(always)]
unsafe fn load_c(c: &Sums, plane: usize, t: usize, h: usize) -> __m512i {
    // SAFETY: plane < 2, t < 32, h < 2: inside the 8 KB of sums, which the tiles stored
    // (the caller's contract).
    unsafe {
        _mm512_loadu_si512(
            (c.0.as_ptr() as *const i32)
                .add(1024 * plane + 256 * (2 * (t / TILE_M) + h) + 16 * (t % TILE_M))
                as *const _,
        )
    }
}

/// Writes `acc` (per token, 32 rows) to the item's real groups: masked stores (a call of
/// `memcpy` a token, with its `vzeroupper`, cost 3 % of a Q4_K product).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn write_out(acc: &[[__m512; 2]], job: &Job, groups: usize) {
    let n = GROUP_ROWS * groups;
    let mask = |h: usize| (((1u32 << n.saturating_sub(16 * h).min(16)) - 1) & 0xFFFF) as u16;
    let (m0, m1) = (mask(0), mask(1));
    for (t, v) in acc.iter().enumerate().take(job.m) {
        // SAFETY: the caller's contract: 8·groups floats per token at out, the masked lanes
        // past them neither read nor written.
        unsafe {
            let out = job.out.add(t * job.out_stride);
            _mm512_mask_storeu_ps(out, m0, v[0]);
            _mm512_mask_storeu_ps(out.add(16), m1, v[1]);
        }
    }
}

/// Q8_0, Q5_0, Q4_0, IQ4_NL and MXFP4: per block `acc = fma(dw·dx, isum, acc)`, as
/// [`super::scalar::tile_u5`] and its siblings (`BIAS` > 0: unsigned values, whose offsets
/// come off the sum; 0: signed).
///
/// # Safety
/// `w` holds `job.blocks` units; the job's pointers as [`Job`] says; the CPU has AVX-512F, and
/// `tiles` is [`Hardware`] only where [`uses_amx`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn block32<T: Tiles, const BIAS: i32>(tiles: &mut T, w: &ItemWeights, job: &Job) {
    let mut c = Sums::new();
    let end = job.slice.end;
    let mut local = MaybeUninit::uninit();
    let accs = job.acc_place::<1>(&mut local);
    // SAFETY: the caller's contract; tokens below job.m only, their accumulators written at
    // the row's first block (onto zeros) before any is read.
    unsafe {
        tiles.configure(job.rows(), 32);
        // Two blocks' products (their sums in the two halves of `c`), then their folds, each
        // token's accumulators loaded and stored once for both, in the chain's order.
        for b0 in job.slice.clone().step_by(2) {
            let n = (end - b0).min(2);
            for i in 0..n {
                let b_at = w.b.as_ptr().add(1024 * (b0 + i));
                tiles.products(
                    job.a_tiles(b0 + i, 32),
                    32,
                    b_at,
                    c.as_mut_ptr().add(1024 * i),
                );
            }
            // (A last block alone loads its scales twice: the second copy is not used.)
            let dw: [[__m512; 2]; 2] = std::array::from_fn(|i| {
                let at = ITEM_ROWS * (b0 + i).min(end - 1);
                [
                    _mm512_loadu_ps(w.d.as_ptr().add(at)),
                    _mm512_loadu_ps(w.d.as_ptr().add(at + 16)),
                ]
            });
            if b0 == 0 {
                fold_blocks::<true, BIAS>(&c, &dw[..n], job, b0, accs);
            } else {
                fold_blocks::<false, BIAS>(&c, &dw[..n], job, b0, accs);
            }
        }
        finish(&raw const (*accs)[0], job, w.groups);
    }
}

/// [`block32`]'s folds of blocks `b0..b0 + dw.len()` (`FIRST`: the row's first, onto zeros:
/// a choice inside one loop became a `memset` of the accumulators and 7 % of a Q8_0 prompt).
///
/// # Safety
/// As [`block32`]; the tiles stored the blocks' sums in `c`; `accs` holds the job's tokens'
/// accumulators unless `FIRST`.
#[inline(always)]
unsafe fn fold_blocks<const FIRST: bool, const BIAS: i32>(
    c: &Sums,
    dw: &[[__m512; 2]],
    job: &Job,
    b0: usize,
    accs: *mut [Acc; 1],
) {
    // SAFETY: the caller's contract; tokens below job.m only.
    unsafe {
        for t in 0..job.m {
            let acc = &raw mut (*accs)[0][t];
            let mut a = if FIRST {
                [_mm512_setzero_ps(); 2]
            } else {
                *acc
            };
            for (i, dw) in dw.iter().enumerate() {
                let at = t * job.blocks + b0 + i;
                let dx = _mm512_set1_ps(*job.scales.add(at));
                let off = _mm512_set1_epi32(if BIAS > 0 { *job.offsets.add(at) } else { 0 });
                for h in 0..2 {
                    let isum = _mm512_sub_epi32(load_c(c, i, t, h), off);
                    a[h] =
                        _mm512_fmadd_ps(_mm512_mul_ps(dw[h], dx), _mm512_cvtepi32_ps(isum), a[h]);
                }
            }
            *acc = a;
        }
    }
}

/// Writes a job's outputs where it ends its rows' chains (else its accumulator stays in the
/// carry for the next slice).
///
/// # Safety
/// As [`write_out`]; `acc` holds the job's tokens' accumulators, written.
#[inline(always)]
pub(super) unsafe fn finish(acc: *const Acc, job: &Job, groups: usize) {
    if job.ends() {
        // SAFETY: the caller's contract: the first job.m tokens' accumulators are written.
        unsafe {
            let acc = std::slice::from_raw_parts(acc as *const [__m512; 2], job.m);
            write_out(acc, job, groups)
        };
    }
}

/// The exact sum `2^SHIFT·hi + lo` of the two planes' C tiles for token `t`, rows `16h..`.
#[inline(always)]
pub(super) unsafe fn plane_sum<const SHIFT: u32>(c: &Sums, t: usize, h: usize) -> __m512i {
    // SAFETY: t < 32, h < 2 (the callers' loops).
    unsafe {
        let (hi, lo) = (load_c(c, 0, t, h), load_c(c, 1, t, h));
        _mm512_add_epi32(_mm512_slli_epi32::<SHIFT>(hi), lo)
    }
}

/// Q5_K: the chain of [`super::q5_k::tile_scalar`], `r = fma(−dmin, imin, isum·d)`, then
/// `acc = fma(r, dy, acc)` per super-block. The weights carry their sub-blocks' scales as
/// Q4_K's do (two planes, [`ItemWeights::q4_k`] with the fifth bits), so four products of 64
/// values per plane give `isum` exactly; `imin` comes from the activations' sums.
///
/// # Safety
/// As [`block32`], the activations being Q8_K rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn q5_k<T: Tiles>(tiles: &mut T, w: &ItemWeights, job: &Job) {
    let mut c = Sums::new();
    let mut mins = Mins::new();
    let mut local = MaybeUninit::uninit();
    let accs = job.acc_place::<1>(&mut local);
    // SAFETY: the caller's contract; tokens below job.m only, their accumulators written at
    // the row's first block (onto zeros) before any is read.
    unsafe {
        tiles.configure(job.rows(), 64);
        for b in job.slice.clone() {
            mins.load(w, job, b);
            let [d, dmin] = d_dmin(w, b);
            let b_at = w.b.as_ptr().add(16384 * b);
            tiles.planes(job.a_tiles(4 * b, 64), 64, b_at, 4, c.as_mut_ptr());
            for t in 0..job.m {
                let dy = job.dy(t, b);
                for h in 0..2 {
                    let acc = &raw mut (*accs)[0][t][h];
                    let isum = _mm512_cvtepi32_ps(plane_sum::<5>(&c, t, h));
                    let imin = _mm512_cvtepi32_ps(mins.all(t, h));
                    let r = _mm512_fnmadd_ps(dmin[h], imin, _mm512_mul_ps(isum, d[h]));
                    let prev = if b == 0 { _mm512_setzero_ps() } else { *acc };
                    *acc = _mm512_fmadd_ps(r, dy, prev);
                }
            }
        }
        finish(&raw const (*accs)[0], job, w.groups);
    }
}

/// Super-block `b`'s d and dmin of the item's rows (Q4_K, Q5_K), each as two halves of 16.
///
/// # Safety
/// `w` holds d and dmin of `b` ([`ItemWeights::q4_k`]); AVX-512F.
#[inline(always)]
pub(super) unsafe fn d_dmin(w: &ItemWeights, b: usize) -> [[__m512; 2]; 2] {
    // SAFETY: the caller's contract: 2·32 floats for super-block b.
    unsafe {
        let dd = w.d.as_ptr().add(2 * ITEM_ROWS * b);
        let half = |at: usize| {
            [
                _mm512_loadu_ps(dd.add(at)),
                _mm512_loadu_ps(dd.add(at + 16)),
            ]
        };
        [half(0), half(ITEM_ROWS)]
    }
}

/// One super-block's mins (Q4_K, Q5_K) and the tokens' activation sums they multiply.
pub(super) struct Mins {
    /// Per token, the sums of each pair of sub-blocks' 32 activations as two i16 in an i32,
    /// 16 bytes a token ([`pack_acts`]'s token numbers).
    pair_sums: *const i32,
    /// Per pair, the rows' two mins as two i16.
    mins: [[__m512i; 2]; 4],
}

impl Mins {
    #[target_feature(enable = "avx512f")]
    pub(super) fn new() -> Self {
        Mins {
            pair_sums: std::ptr::null(),
            mins: [[_mm512_setzero_si512(); 2]; 4],
        }
    }

    /// Super-block `b`'s.
    #[inline(always)]
    pub(super) unsafe fn load(&mut self, w: &ItemWeights, job: &Job, b: usize) {
        // SAFETY: the caller's contract: `w` holds the mins of `b`; the job's activations are
        // packed Q8_K rows of `blocks` super-blocks, with their token numbers.
        unsafe {
            for (p, mins) in self.mins.iter_mut().enumerate() {
                for (h, m) in mins.iter_mut().enumerate() {
                    *m = _mm512_loadu_si512(
                        w.mins.as_ptr().add(ITEM_ROWS * (4 * b + p) + 16 * h) as *const _
                    );
                }
            }
            self.pair_sums = job.token_numbers(b).add(4 * ITEM_TOKENS) as *const i32;
        }
    }

    /// Token `t`'s `Σ min·sum` of pair `p`, rows `16h..`.
    ///
    /// # Safety
    /// [`Mins::load`] ran for a job with token `t`; `p` < 4.
    #[inline(always)]
    pub(super) unsafe fn pair(&self, t: usize, h: usize, p: usize) -> __m512i {
        // SAFETY: the caller's contract: token t's 16 bytes of sums.
        let sums = unsafe { self.pair_sums.add(4 * t + p).read() };
        _mm512_madd_epi16(self.mins[p][h], _mm512_set1_epi32(sums))
    }

    /// Token `t`'s `Σ min·sum` over the super-block, rows `16h..`.
    #[inline(always)]
    pub(super) unsafe fn all(&self, t: usize, h: usize) -> __m512i {
        // SAFETY: AVX-512 (the callers' target features).
        unsafe {
            _mm512_add_epi32(
                _mm512_add_epi32(self.pair(t, h, 0), self.pair(t, h, 1)),
                _mm512_add_epi32(self.pair(t, h, 2), self.pair(t, h, 3)),
            )
        }
    }
}

/// Q6_K: the chain of [`super::q6_k::tile_scalar`]. The weights carry `sc·(q − 32)` (two
/// planes, [`ItemWeights::q6_k`]), so four products of 64 values per plane give a super-block's
/// `Σ sc·Σ (q − 32)·x`, exact, as the vector kernels add it in 32 bits. IQ4_XS too, whose
/// chain ([`super::iq4_xs::tile_scalar`]) is this one: its planes from [`ItemWeights::iq4_xs`].
///
/// # Safety
/// As [`block32`], the activations being Q8_K rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn q6_k<T: Tiles>(tiles: &mut T, w: &ItemWeights, job: &Job) {
    let mut c = Sums::new();
    let mut local = MaybeUninit::uninit();
    let accs = job.acc_place::<1>(&mut local);
    // SAFETY: the caller's contract; tokens below job.m only, their accumulators written at
    // the row's first block (onto zeros) before any is read.
    unsafe {
        tiles.configure(job.rows(), 64);
        for b in job.slice.clone() {
            tiles.planes(
                job.a_tiles(4 * b, 64),
                64,
                w.b.as_ptr().add(16384 * b),
                4,
                c.as_mut_ptr(),
            );
            for t in 0..job.m {
                let dy = job.dy(t, b);
                for h in 0..2 {
                    let acc = &raw mut (*accs)[0][t][h];
                    let d = _mm512_loadu_ps(w.d.as_ptr().add(ITEM_ROWS * b + 16 * h));
                    let scaled = _mm512_mul_ps(_mm512_cvtepi32_ps(plane_sum::<6>(&c, t, h)), d);
                    let prev = if b == 0 { _mm512_setzero_ps() } else { *acc };
                    *acc = _mm512_fmadd_ps(scaled, dy, prev);
                }
            }
        }
        finish(&raw const (*accs)[0], job, w.groups);
    }
}
