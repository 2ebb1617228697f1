//! nucleus's own arithmetic for the products of Q8_0, Q5_0, Q4_0 and IQ4_NL weights, the
//! default; `--exact` keeps llama.cpp's (see [`super::matmul`]).
//!
//! The weights are repacked at load time, in memory only, eight rows interleaved: for each
//! block of 32 inputs, the eight rows' scales, then their values four at a time (bytes
//! `4j..4j+4` of chunk `k` are values `4k..4k+4` of row `j`), so one 256-bit register holds four
//! values of each of eight rows and one multiply-add instruction serves eight outputs. Each
//! output is
//!
//! ```text
//! acc = 0;  for every block b in order:  acc = fma(dw[b] · dx[b], isum[b], acc)
//! ```
//!
//! with `isum` the exact integer dot product of the block (weights times the activations
//! quantized to 8 bits as llama.cpp quantizes them; for IQ4_NL the weights are the values of
//! its table, `kvalues_iq4nl`, that the nibbles index), `dw · dx` rounded to f32 and one fused
//! multiply-add per block. Integer sums are exact whatever the order, and the float chain is
//! the same for every output, so an output has the same bits whether its token came alone or
//! among many, on every SIMD level and on the scalar path: the batch invariance nucleus
//! promises holds by construction.
//!
//! Q4_K matrices are repacked the same way ([`q4_k`]) with two float chains, the one-row Q4_K
//! kernel's ([`Chain::Default`], `--exact`'s for generated tokens) and llama.cpp's repacked
//! gemm's ([`Chain::Q4kPairs`], `--exact`'s for a prompt's rows in groups of four, and nucleus's
//! own arithmetic's for every token). For Q4_0 and IQ4_NL the chain
//! above is the one of llama.cpp's kernels for its repacked Q4_0 and IQ4_NL matrices, which
//! `--exact` follows: they too get the same bits in both arithmetics. Q6_K matrices ([`q6_k`]) take
//! the arithmetic of llama.cpp's tiled Q6_K kernel, one FMA per super-block, for every row, and
//! Q3_K, Q5_K and IQ4_XS matrices ([`q3_k`], [`q5_k`], [`iq4_xs`]) those of its tiled kernels
//! for them.
//!
//! With AVX-512 VNNI a prompt's K-quant and IQ4_XS products take [`wide`]'s kernels: two groups in
//! a 512-bit register, the same integers and the same float chain per row, so the same bits.

/// `$body::<VNNI, NX>(data, tile)` for `tile.nx` (1 to 4; more counts as 4) through a
/// `#[target_feature]` entry: the VNNI one where this process uses AVX-512 VNNI
/// ([`x86::uses_vnni`]), else the AVX2 one. `data` is what the kernel reads of the group: its
/// stored bytes (`&[u8]`), or its unpacked view (`&GroupView`). The dispatch of the x86 kernels
/// that have a VNNI body; expands to an `unsafe` call, under the caller's contract.
#[cfg(target_arch = "x86_64")]
macro_rules! kernel_by_level {
    ($body:ident, $data:expr, $ty:ty, $tile:expr) => {{
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn avx2<const NX: usize>(data: $ty, tile: &$crate::kernels::interleaved::Tile) {
            // SAFETY: forwarded.
            unsafe { $body::<false, NX>(data, tile) }
        }
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn vnni<const NX: usize>(data: $ty, tile: &$crate::kernels::interleaved::Tile) {
            // SAFETY: forwarded.
            unsafe { $body::<true, NX>(data, tile) }
        }
        let (data, tile): ($ty, &$crate::kernels::interleaved::Tile) = ($data, $tile);
        // SAFETY: the caller's contract; the VNNI entries only where the CPU has VNNI.
        unsafe {
            match ($crate::kernels::interleaved::x86::uses_vnni(), tile.nx) {
                (true, 1) => vnni::<1>(data, tile),
                (true, 2) => vnni::<2>(data, tile),
                (true, 3) => vnni::<3>(data, tile),
                (true, _) => vnni::<4>(data, tile),
                (false, 1) => avx2::<1>(data, tile),
                (false, 2) => avx2::<2>(data, tile),
                (false, 3) => avx2::<3>(data, tile),
                (false, _) => avx2::<4>(data, tile),
            }
        }
    }};
}

/// Rows of an AMX work item ([`amx`]): four groups, the two B tiles' sixteen rows each.
pub(crate) const ITEM_ROWS: usize = 4 * GROUP_ROWS;

mod acts;
#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
#[cfg(target_arch = "x86_64")]
mod amx_layout;
#[cfg(target_arch = "x86_64")]
mod amx_q4_k;
#[cfg(target_arch = "x86_64")]
mod amx_tiles;
mod arithmetic;
mod choice;
mod each;
pub mod huge_pages;
mod interleave;
mod iq4_xs;
mod lines;
mod pack;
#[cfg(target_arch = "x86_64")]
mod pack_small;
mod q3_k;
mod q4_k;
mod q5_k;
mod q6_k;
mod q8_lanes;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod wide;
#[cfg(target_arch = "x86_64")]
mod wide_blocks;
#[cfg(target_arch = "x86_64")]
mod wide_stored;
#[cfg(target_arch = "x86_64")]
mod wide_stored_scaled;
mod work;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_q5_0;

#[cfg(test)]
mod tests;
#[cfg(all(test, target_arch = "x86_64"))]
mod tests_amx;
#[cfg(test)]
mod tests_deferred;
#[cfg(test)]
mod tests_tiled;
#[cfg(test)]
mod tests_wide;

pub use acts::PackedActs;
#[cfg(target_arch = "x86_64")]
pub use amx::{amx_refusal, uses_amx};
pub use arithmetic::{Arithmetic, Chain};
#[cfg(test)]
use choice::tile_use;
use choice::{How, TileAsk, TileUse};
pub use each::{matmul_packed_each, EachProduct};
pub use pack::{pack, repack_into, FileRows, PackedMatrix};

/// Why prompts do not run on AMX tiles here (always, on other architectures).
#[cfg(not(target_arch = "x86_64"))]
pub fn amx_refusal() -> Option<&'static str> {
    Some("off (not x86-64)")
}

use std::sync::atomic::{AtomicUsize, Ordering};

use super::matmul::QuantizedActs;
use super::pool::{OutPtr, ThreadPool};
use crate::quant::GgmlType;

/// How far ahead, in bytes, the decode kernels ask for the weights they stream: into L1 two
/// Q4_K group-blocks ahead (about 2 KB), into L2 three. Farther into L2 only competes with the
/// hardware's own streamer. `nucleus bench` on the 7B Q4_K_M shape (decode, 2 threads, weights
/// in huge pages, Xeon with 30.4 GB/s of DRAM read from 2 MiB pages, 2026-12-06), L2 distance
/// in Q4_K group-blocks: 10 (the distance before), 5.84–5.96 tok/s; 5, 5.86–5.91; 4, 6.06; 3,
/// 6.24–6.46 (27.3–28.2 GB/s of weights, 90–93 %); on the 8B shape 10: 5.46–5.50, 3:
/// 6.01–6.10. `decode_stream` (18944×3584, the same machine): Q6_K's one-row product 86–88 %
/// of the read at 10, 93–95 % at 3; Q4_K's 88–91 % and 94–96 %. (2026-11-26 on a machine of
/// the same kind, whose DRAM read 30.7 GB/s: one block ahead into L1 only, 5.11–5.14 tok/s; two,
/// 5.34–5.38; two into L1 and 8–12 into L2, 6.05–6.14; 16–32 into L2, 5.94–6.03. Three into L2
/// was not tried then.)
pub(crate) const PREFETCH_L1: usize = 2 * q4_k::GROUP_BLOCK;
pub(crate) const PREFETCH_L2: usize = 3 * q4_k::GROUP_BLOCK;

/// Rows interleaved in one group.
pub const GROUP_ROWS: usize = 8;
/// Inputs per block.
const QK: usize = 32;
/// Bytes of a Q8_0 activation block: an f16 scale, then 32 signed values.
const ACT_BLOCK: usize = 34;
/// Token rows per kernel call.
const TILE_TOKENS: usize = 4;

/// What a kernel call reads: `nx` token rows of quantized activations starting at `x` (stride
/// `x_stride` bytes), their `blocks` scales and offsets each at `scales`/`offsets` (stride
/// `blocks`; the offset of an unsigned type's block: its bias times the sum of the block's
/// activations; for Q8_K rows no scales, and at `offsets` their blocks' four
/// [`PackedActs::min_pairs`], stride `4 * blocks`), and writes eight floats per token at `out`
/// (stride `out_stride` floats).
#[derive(Clone, Copy)]
pub(crate) struct Tile {
    pub blocks: usize,
    pub x: *const u8,
    pub x_stride: usize,
    pub scales: *const f32,
    pub offsets: *const i32,
    pub nx: usize,
    pub out: *mut f32,
    pub out_stride: usize,
}

/// One group's weights ready for the kernels: the eight rows' scales per block as f32
/// (`8 * blocks`), and their values, 256 bytes per block `stride` bytes apart, interleaved as
/// described above: unsigned values for Q5_0 (weight + 16) and Q4_0 (weight + 8) and signed
/// table values for IQ4_NL, unpacked; signed 8-bit values for Q8_0, read where they are stored.
pub(crate) struct GroupView<'a> {
    pub scales: &'a [f32],
    pub values: &'a [u8],
    pub stride: usize,
}

impl<'a> GroupView<'a> {
    /// The view of stored group `src` of `ty`, unpacking what needs it into `scales` and
    /// `unpacked` with `unpack`.
    fn new(
        ty: GgmlType,
        blocks: usize,
        src: &'a [u8],
        scales: &'a mut [f32],
        unpacked: &'a mut [u8],
        unpack: UnpackFn,
    ) -> GroupView<'a> {
        unpack(ty, blocks, src, scales, unpacked);
        match ty {
            // Read as stored, a group-block at a time.
            GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::IQ4_XS => GroupView {
                scales,
                values: src,
                stride: pack::group_block_bytes(ty),
            },
            GgmlType::Q6_K => GroupView {
                scales,
                values: unpacked,
                stride: q6_k::UNPACKED_BLOCK,
            },
            GgmlType::Q8_0 => GroupView {
                scales,
                values: &src[16..],
                stride: 272,
            },
            _ => GroupView {
                scales,
                values: unpacked,
                stride: 256,
            },
        }
    }
}

/// Unpacks a stored group: the f32 scales and (all types but Q8_0) the values, a byte each.
type UnpackFn = fn(ty: GgmlType, blocks: usize, src: &[u8], scales: &mut [f32], values: &mut [u8]);

/// A kernel: the eight rows of a group against up to four token rows.
///
/// # Safety
/// `tile`'s pointers are valid for what [`Tile`] says, `1 <= tile.nx <= 4`, the group holds
/// `tile.blocks` blocks, and the CPU has the kernel's features.
pub(crate) type TileFn = unsafe fn(group: &GroupView, tile: &Tile);

/// The kernels for `ty`: the AVX2 ones when `avx2`, else the scalar ones (same bits).
fn kernels(ty: GgmlType, avx2: bool, chain: Chain) -> (TileFn, UnpackFn) {
    let pairs = chain == Chain::Q4kPairs && ty == GgmlType::Q4_K;
    if chain == Chain::Q8Lanes && ty == GgmlType::Q8_0 {
        // (With AVX2 the groups are read as stored, `q8_lanes::tile_stored`.)
        return (q8_lanes::tile_scalar, pack::unpack_group_scalar);
    }
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        return match ty {
            GgmlType::Q4_K if pairs => (q4_k::tile_avx2_pairs, pack::unpack_group_scalar),
            GgmlType::Q4_K => (q4_k::tile_avx2, pack::unpack_group_scalar),
            GgmlType::Q5_K => (q5_k::tile_avx2, pack::unpack_group_scalar),
            GgmlType::IQ4_XS => (iq4_xs::tile_avx2, pack::unpack_group_scalar),
            GgmlType::Q3_K => (q3_k::tile_avx2, pack::unpack_group_scalar),
            GgmlType::Q6_K => (q6_k::tile_unpacked, |_, blocks, src, _, values| {
                q6_k::unpack_group(blocks, src, values)
            }),
            GgmlType::Q5_0 => (x86::tile_u5, x86::unpack_group),
            GgmlType::Q4_0 => (x86::tile_u4, x86::unpack_group),
            _ => (x86::tile_i8, x86::unpack_group),
        };
    }
    let _ = avx2;
    if ty == GgmlType::Q6_K {
        return (q6_k::tile_scalar, |_, blocks, src, _, values| {
            q6_k::unpack_group_scalar(blocks, src, values)
        });
    }
    let tile: TileFn = match ty {
        GgmlType::Q4_K if pairs => q4_k::tile_scalar_pairs,
        GgmlType::Q4_K => q4_k::tile_scalar,
        GgmlType::Q5_K => q5_k::tile_scalar,
        GgmlType::IQ4_XS => iq4_xs::tile_scalar,
        GgmlType::Q3_K => q3_k::tile_scalar,
        GgmlType::Q5_0 => scalar::tile_u5,
        GgmlType::Q4_0 => scalar::tile_u4,
        _ => scalar::tile_i8,
    };
    (tile, pack::unpack_group_scalar)
}

/// The scratch one group of `ty` needs in [`GroupView::new`] (f32 scales, unpacked value
/// bytes): Q3_K, Q4_K, Q5_K and IQ4_XS are read as stored, Q8_0 needs its scales widened, the
/// others (Q6_K too) their values.
fn scratch_per_group(ty: GgmlType, blocks: usize) -> (usize, usize) {
    match ty {
        GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::IQ4_XS => (0, 0),
        GgmlType::Q6_K => (0, q6_k::UNPACKED_BLOCK * blocks),
        GgmlType::Q8_0 => (GROUP_ROWS * blocks, 0),
        _ => (GROUP_ROWS * blocks, GROUP_ROWS * QK * blocks),
    }
}

/// The types of blocks of 32 values with one scale each, whose products read Q8_0
/// activations.
fn is_block_type(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q4_0 | GgmlType::IQ4_NL | GgmlType::MXFP4
    )
}

/// The activation type a packed matrix of `ty` reads (the one-row kernels' vec-dot type).
pub fn packed_act_type(ty: GgmlType) -> GgmlType {
    if matches!(
        ty,
        GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::IQ4_XS
    ) {
        GgmlType::Q8_K
    } else {
        GgmlType::Q8_0
    }
}

/// Most tokens for which Q5_0 groups are read as stored ([`x86::tile_q5_many`]); more read
/// groups unpacked once for every token block. `matmul_bench` (4864×896, 2 threads, AMD AVX2):
/// reading them as stored is 5–25 % faster from 5 to 64 tokens, as fast at 128, 4 % slower at
/// 512.
const Q5_STORED_MOST: usize = 128;
/// [`Q5_STORED_MOST`] where the kernels take their VNNI bodies: there the unpacked tiles lose
/// the `vpmaddubsw` sums' extra instructions and overtake reading as stored sooner
/// (`matmul_bench`, Intel AVX-512 VNNI: 12–24 % faster as stored at 5 to 12 tokens, about as
/// fast at 16, 11–16 % slower from 24 to 128).
const Q5_STORED_MOST_VNNI: usize = 16;

/// The most tokens for which this process reads Q5_0 groups as stored.
fn q5_stored_most() -> usize {
    #[cfg(target_arch = "x86_64")]
    if x86::uses_vnni() {
        return Q5_STORED_MOST_VNNI;
    }
    Q5_STORED_MOST
}

/// Groups per work item.
const GROUPS_PER_CHUNK: usize = 4;
/// The least weight bytes of a decode work item (see `matmul_packed_with`): each item's start
/// is a cold start of a thread's stream, where the rows of a small matrix (a 1.5B's, 1,536
/// values) made many items (`nucleus bench qwen2.5-1.5b-q4_k_m-random.gguf -t 2 -p 16 -g 128`,
/// 2026-12-07, the Xeon with AMX, four alternating rounds: 20.3–23.3 tok/s with 256 KiB,
/// 21.3–23.7 with 512 KiB; 1 MiB in two of them 23.5–23.7; the 7B's, the 30B-A3B's and the
/// catalog models' decode unchanged).
const DECODE_CHUNK_BYTES: usize = 512 << 10;
/// Tokens per pass over a work item's groups.
const TOKEN_BLOCK: usize = 32;

/// `y[t * w.rows + r] = W[r] · x[t]` for every token `t` and row `r`, in the arithmetic
/// described at the top of this module. `x` holds rows of [`packed_act_type`]; for Q8_0 rows
/// `acts` was prepared from it (Q8_K rows need no preparation: pass an empty one).
pub fn matmul_packed(
    pool: &ThreadPool,
    w: &PackedMatrix,
    x: &QuantizedActs,
    acts: &PackedActs,
    y: &mut [f32],
) {
    matmul_packed_with(pool, &mut [(w, y)], x, acts, true, Chain::Default)
}

/// [`matmul_packed`] with the float chain `chain` (`--exact`'s choice for a prompt's rows).
pub fn matmul_packed_chain(
    pool: &ThreadPool,
    w: &PackedMatrix,
    x: &QuantizedActs,
    acts: &PackedActs,
    y: &mut [f32],
    chain: Chain,
) {
    matmul_packed_with(pool, &mut [(w, y)], x, acts, true, chain)
}

/// [`matmul_packed_chain`] for several matrices that read the same input (q, k and v; gate and
/// up), in one pass of the thread pool: the same bits as one call each.
pub fn matmul_packed_many(
    pool: &ThreadPool,
    products: &mut [(&PackedMatrix, &mut [f32])],
    x: &QuantizedActs,
    acts: &PackedActs,
    chain: Chain,
) {
    matmul_packed_with(pool, products, x, acts, true, chain)
}

/// One matrix of a [`matmul_packed_with`] call, as its work items see it.
struct Product<'a> {
    w: &'a PackedMatrix,
    out: OutPtr,
    tile_fn: TileFn,
    unpack: UnpackFn,
    /// Q5_0, Q8_0, Q4_0, IQ4_NL or Q6_K with at most one tile of tokens on AVX2: read as
    /// stored, unpacked in registers (decode).
    stored: bool,
    /// Q8_0 on AVX2: read as stored for many tokens too.
    q8_stored_tiles: bool,
    /// Q8_0 in [`Chain::Q8Lanes`].
    q8_lanes: bool,
    /// Q5_0 on AVX2 with up to [`q5_stored_most`] tokens: read as stored for many tokens too,
    /// up to [`x86::MANY_TOKENS`] a call.
    q5_stored_many: bool,
    /// Whether (and how) the many-token products run on AMX tiles.
    tiles: TileUse,
    /// Q4_K with [`Chain::Q4kPairs`].
    q4k_pairs: bool,
    /// Q3_K to Q6_K or IQ4_XS, many tokens, AVX-512 VNNI, off the tiles: pairs of groups in 512-bit
    /// registers ([`wide`]).
    wide: bool,
    /// Q4_K, Q5_K, Q3_K, Q6_K or IQ4_XS, at most one tile of tokens (decode), AVX-512 VNNI:
    /// pairs of groups read as stored in 512-bit registers ([`wide_stored`],
    /// [`wide_stored_scaled`]).
    wide_decode: bool,
    /// The first work item of this matrix among all of the call's.
    first_chunk: usize,
    /// Which of the call's inputs it reads (0 where all read one: [`matmul_packed_each`]).
    input: usize,
    /// Groups per work item.
    chunk_groups: usize,
    /// Blocks per row (of 32 inputs, or 256 for the K-quants and IQ4_XS).
    blocks: usize,
}

impl Product<'_> {
    /// Whether `nt` tokens read this matrix as stored, with no unpacked group views (and so
    /// no scratch).
    fn reads_stored(&self, nt: usize) -> bool {
        if self.tiles != TileUse::No {
            false
        } else if nt <= TILE_TOKENS {
            self.stored
        } else {
            self.q8_stored_tiles || self.q5_stored_many
        }
    }

    /// How many groups of a work item `nt` tokens unpack into the shared scratch at once: none
    /// when the kernels read the groups as stored, only an odd last group for the 512-bit
    /// kernels of the super-block types (which unpack pairs into a buffer of their own), else
    /// the item's groups.
    fn scratch_groups(&self, nt: usize) -> usize {
        if self.reads_stored(nt) {
            0
        } else if self.wide && !is_block_type(self.w.ty()) {
            1
        } else {
            GROUPS_PER_CHUNK
        }
    }
}

/// The products, with the SIMD kernels or (`simd` false) the scalar ones.
fn matmul_packed_with(
    pool: &ThreadPool,
    products: &mut [(&PackedMatrix, &mut [f32])],
    x: &QuantizedActs,
    acts: &PackedActs,
    simd: bool,
    chain: Chain,
) {
    matmul_packed_tiles(pool, products, x, acts, simd, chain, TileAsk::Auto)
}

/// [`matmul_packed_with`], the many-token products on tiles as `ask` says.
fn matmul_packed_tiles(
    pool: &ThreadPool,
    products: &mut [(&PackedMatrix, &mut [f32])],
    x: &QuantizedActs,
    acts: &PackedActs,
    simd: bool,
    chain: Chain,
    ask: TileAsk,
) {
    let nt = x.n_tokens();
    let blocks32 = x.cols() / QK;
    if x.ty() == GgmlType::Q8_0 {
        assert_eq!(
            acts.scales.len(),
            nt * blocks32,
            "matmul_packed: acts not prepared"
        );
    }
    let how = How::new(pool, nt, simd, chain, ask);
    let mut n_chunks = 0;
    let mut list = Vec::with_capacity(products.len());
    for (w, y) in products.iter_mut() {
        assert_eq!(x.cols(), w.cols(), "matmul_packed: activation width");
        assert_eq!(
            x.ty(),
            packed_act_type(w.ty()),
            "matmul_packed: activation type"
        );
        assert_eq!(y.len(), nt * w.rows(), "matmul_packed: output size");
        let p = Product::new(w, y, how, n_chunks);
        n_chunks += p.items();
        list.push(p);
    }
    if nt == 0 || n_chunks == 0 {
        return;
    }
    thread_local! {
        static TILE_ACTS: std::cell::RefCell<Vec<lines::Lines>> = Default::default();
        static Q8_K_ACTS: std::cell::RefCell<PackedActs> = Default::default();
    }
    TILE_ACTS.with_borrow_mut(|tile_acts| {
        pack_tile_acts(&list, x, tile_acts);
        // Only the 512-bit Q4_K/Q5_K prompt kernels read the min pairs: decode's calls and
        // the others' skip making them.
        let min_pairs = list
            .iter()
            .any(|p| p.wide && matches!(p.w.ty(), GgmlType::Q4_K | GgmlType::Q5_K));
        if x.ty() != GgmlType::Q8_K || !min_pairs {
            return run_products(pool, &list, n_chunks, (&[(x, acts)], tile_acts));
        }
        Q8_K_ACTS.with_borrow_mut(|k_acts| {
            k_acts.prepare_q8_k(x);
            run_products(pool, &list, n_chunks, (&[(x, k_acts)], tile_acts));
        });
    });
}

/// The activations packed for the AMX tiles, 32 tokens a buffer ([`amx::pack_acts`]), where
/// some product of `list` runs on them (else left as they are). The buffers are kept from
/// call to call: allocating megabytes afresh costs their pages' first touch each time.
fn pack_tile_acts(list: &[Product], x: &QuantizedActs, tile_acts: &mut Vec<lines::Lines>) {
    #[cfg(target_arch = "x86_64")]
    if list.iter().any(|p| p.tiles != TileUse::No) {
        let k = if x.ty() == GgmlType::Q8_K { 64 } else { 32 };
        let nt = x.n_tokens();
        tile_acts.resize_with(nt.div_ceil(amx::ITEM_TOKENS), Default::default);
        for (i, chunk) in tile_acts.iter_mut().enumerate() {
            let t0 = i * amx::ITEM_TOKENS;
            amx::pack_acts(x, t0, (nt - t0).min(amx::ITEM_TOKENS), k, chunk);
        }
    }
    let _ = (list, x, tile_acts);
}

/// The work items of `list` on the pool's threads, each taking the next; each product reads
/// its input of `inputs` (all of the same number of tokens).
fn run_products(
    pool: &ThreadPool,
    list: &[Product],
    n_chunks: usize,
    (inputs, tile_acts): (&[(&QuantizedActs, &PackedActs)], &[lines::Lines]),
) {
    let nt = inputs[0].0.n_tokens();
    let next = AtomicUsize::new(0);
    let work = |_: usize, _: usize| {
        // Scratch for the groups of one work item, as much as its largest product needs.
        let (most_s, most_u) = list
            .iter()
            .map(|p| {
                let (s, u) = scratch_per_group(p.w.ty(), p.blocks);
                (p.scratch_groups(nt) * s, p.scratch_groups(nt) * u)
            })
            .fold((0, 0), |(a, b), (s, u)| (a.max(s), b.max(u)));
        let mut scales = vec![0f32; most_s];
        let mut unpacked = vec![0u8; most_u];
        loop {
            let c = next.fetch_add(1, Ordering::Relaxed);
            if c >= n_chunks {
                break;
            }
            let p = &list[list.partition_point(|p| p.first_chunk <= c) - 1];
            let (x, acts) = inputs[p.input];
            p.run_chunk(
                c - p.first_chunk,
                (x, acts, tile_acts),
                (&mut scales, &mut unpacked),
            );
        }
    };
    let macs: usize = list.iter().map(|p| nt * p.w.rows() * p.w.cols()).sum();
    if macs < (1 << 15) {
        work(0, 1);
    } else {
        pool.run(work);
    }
}
