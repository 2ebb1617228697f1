//! Which kernels a product runs on: AMX tiles, the 512-bit kernels or the others, chosen by
//! type and token count from measurements, and how many groups of rows make a work item.

use super::*;

/// What decides how a call's products run.
#[derive(Clone, Copy)]
pub(super) struct How {
    pub nt: usize,
    pub avx2: bool,
    pub chain: Chain,
    pub ask: TileAsk,
    pub threads: usize,
}

impl How {
    /// For `nt` tokens on `pool`'s threads, with the SIMD kernels where the CPU has AVX2 and
    /// `simd` allows them.
    pub(super) fn new(pool: &ThreadPool, nt: usize, simd: bool, chain: Chain, ask: TileAsk) -> How {
        let avx2 = simd
            && cfg!(target_arch = "x86_64")
            && crate::quant::simd_level() >= crate::quant::SimdLevel::Avx2;
        How {
            nt,
            avx2,
            chain,
            ask,
            threads: pool.n_threads(),
        }
    }
}

impl<'a> Product<'a> {
    /// Its work items.
    pub(super) fn items(&self) -> usize {
        (self.w.rows() / GROUP_ROWS).div_ceil(self.chunk_groups)
    }

    /// How `how.nt` tokens multiply `w` into `y`, its work items numbered from `first_chunk`.
    pub(super) fn new(
        w: &'a PackedMatrix,
        y: &mut [f32],
        how: How,
        first_chunk: usize,
    ) -> Product<'a> {
        let How {
            nt,
            avx2,
            chain,
            ask,
            threads,
        } = how;
        let stored = avx2
            && nt <= TILE_TOKENS
            && matches!(
                w.ty(),
                GgmlType::Q5_0
                    | GgmlType::Q8_0
                    | GgmlType::Q4_0
                    | GgmlType::IQ4_NL
                    | GgmlType::MXFP4
                    | GgmlType::Q6_K
            );
        let q8_lanes = chain == Chain::Q8Lanes && w.ty() == GgmlType::Q8_0;
        let tiles = if q8_lanes {
            TileUse::No
        } else {
            tile_use(w.ty(), nt, avx2, ask, chain)
        };
        let (tile_fn, unpack) = kernels(w.ty(), avx2, chain);
        // The 512-bit kernels' level.
        let vnni = avx2
            && cfg!(target_arch = "x86_64")
            && crate::quant::simd_level() >= crate::quant::SimdLevel::Avx512Vnni;
        let wide = vnni
            && tiles == TileUse::No
            && !q8_lanes
            && wide_min_tokens(w.ty()).is_some_and(|least| nt >= least);
        let wide_decode = vnni
            && !q8_lanes
            && matches!(
                w.ty(),
                GgmlType::Q4_K
                    | GgmlType::Q5_K
                    | GgmlType::Q3_K
                    | GgmlType::Q6_K
                    | GgmlType::IQ4_XS
                    | GgmlType::Q8_0
                    | GgmlType::Q5_0
                    | GgmlType::Q4_0
                    | GgmlType::IQ4_NL
                    | GgmlType::MXFP4
            )
            && nt <= TILE_TOKENS;
        Product {
            w,
            wide_decode,
            out: OutPtr(y.as_mut_ptr()),
            tile_fn,
            unpack,
            stored,
            tiles,
            wide,
            q4k_pairs: chain == Chain::Q4kPairs && w.ty() == GgmlType::Q4_K,
            q8_stored_tiles: avx2 && w.ty() == GgmlType::Q8_0,
            q8_lanes,
            q5_stored_many: avx2 && w.ty() == GgmlType::Q5_0 && nt <= q5_stored_most(),
            first_chunk,
            input: 0,
            chunk_groups: if tiles == TileUse::No {
                chunk_groups(w, nt, threads, wide_decode)
            } else {
                tile_chunk_groups(w, threads)
            },
            blocks: w.cols() / pack::block_len(w.ty()),
        }
    }
}

/// Groups per work item. Many tokens: a few, unpacked once for every token block. One tile
/// (decode): about 1/32 of a thread's share, so that a large matrix with short rows (an output
/// projection) is not all overhead, and at least [`DECODE_CHUNK_BYTES`] of weights: a thread
/// streams a long stretch of memory, where small items of a small matrix (an expert's) would
/// interleave the threads' reads and send each one's prefetches into the other's stretch.
fn chunk_groups(w: &PackedMatrix, nt: usize, threads: usize, pairs: bool) -> usize {
    if nt > TILE_TOKENS {
        return GROUPS_PER_CHUNK;
    }
    let groups = w.rows() / GROUP_ROWS;
    let group_bytes = w.group_bytes().max(1);
    let by_bytes = DECODE_CHUNK_BYTES.div_ceil(group_bytes);
    let most = groups.div_ceil(threads).max(GROUPS_PER_CHUNK);
    let chunk = (groups / (32 * threads))
        .max(by_bytes)
        .clamp(GROUPS_PER_CHUNK, 256)
        .min(most);
    // With `pairs` (decode's 512-bit kernels read groups two at a time) an even count: an odd
    // one leaves a group of every item to the 256-bit kernel.
    chunk + (pairs && chunk % 2 == 1) as usize
}

/// The tiles' weights of a work item's items together, at most: with a block of tokens'
/// activations they stay in L2 (2 MB a core on the Xeons with AMX) while every item goes
/// over the block.
const TILE_CHUNK_BYTES: usize = 1 << 20;

/// Groups per work item on AMX tiles: as many items of four groups (at most four) as keep
/// their weights in the tiles' layout (two bytes a value) within [`TILE_CHUNK_BYTES`], so that
/// a block of tokens' activations is read from L2 by each item of the chunk rather than from
/// L3 once per item (`tile_costs`: Q4_K at 3584 columns, 32 tokens, 290 G MAC/s with the
/// activations in L2 against 232 streaming them); and four work items a thread at least,
/// which balances the threads.
fn tile_chunk_groups(w: &PackedMatrix, threads: usize) -> usize {
    let item_bytes = 2 * ITEM_ROWS * w.cols() / tile_slices(w);
    let items = (w.rows() / ITEM_ROWS) / (4 * threads).max(1);
    GROUPS_PER_CHUNK
        * (TILE_CHUNK_BYTES / item_bytes.max(1))
            .clamp(1, 4)
            .min(items.max(1))
}

/// The most bytes of an item's weights in the tiles' layout that a block of tokens goes over
/// at once: a longer row runs in slices of its blocks (`amx::Job::slice`), so that the items'
/// slice and the tokens' part of the activations share L2 (`NUCLEUS_AMX=all MATMUL_FAST_ONLY=1
/// MATMUL_ROWS=512 matmul_bench 2 Q4_K,Q6_K`, 2026-12-06, the Xeon with AMX, G MAC/s, whole
/// rows: the rows of 18944 of a 7B's `ffn_down` 433–440 and 497–540, its rows of 3584 606–629
/// and 784–808).
const TILE_SLICE_BYTES: usize = 256 << 10;

/// How many slices of its blocks a row of `w` runs in on tiles.
pub(super) fn tile_slices(w: &PackedMatrix) -> usize {
    let blocks = w.cols() / pack::block_len(w.ty());
    (2 * ITEM_ROWS * w.cols())
        .div_ceil(TILE_SLICE_BYTES)
        .clamp(1, blocks.max(1))
}

/// Whether a product runs on AMX tiles ([`amx`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TileUse {
    No,
    Hardware,
    /// The tiles' sums computed in plain code (the tests, and `NUCLEUS_AMX=emulate`).
    Emulated,
}

/// The fewest tokens whose products run on AMX tiles in the tests (`emulate`): every path
/// of the tile kernels, down to one A tile of five tokens.
pub(super) const AMX_MIN_TOKENS: usize = TILE_TOKENS + 1;

/// The fewest tokens for which a Q4_K product in the one-FMA chain ([`Chain::fast`] where
/// the tiles run) runs on them: `NUCLEUS_AMX=all|0 MATMUL_CHAIN=default MATMUL_FAST_ONLY=1
/// MATMUL_SHAPE=... matmul_bench 2 Q4_K`, 2026-12-06 (the Xeon with AMX, two rounds), G MAC/s
/// tiles / vectors at 16, 32, 48, 64, 512 tokens: 3584×18944 196/253, 295/296, 307/326,
/// 324/299, 428/373 and 193/256, 294/304, 323/334, 345/328, 444/394; 18944×3584 216/256,
/// 334/321, 431/344, 447/293, 636/373 and 218/258, 357/327, 437/347, 514/318, 692/376.
const Q4K_ONE_FMA_MIN_TOKENS: usize = 64;

/// The fewest tokens for which a matrix of `ty` runs on AMX tiles, where the CPU has them
/// (`None`: never). Below, the vector kernels are faster: copying a work item's weights into
/// the tiles' layout costs a pass over them per product. Measured with `matmul_bench`
/// (`NUCLEUS_AMX=all` against `NUCLEUS_AMX=0`, 2 threads pinned, the lent device machine's
/// Xeon with AMX, against the 512-bit vector kernels; G MAC/s on tiles / on vectors, at 32,
/// 128 and 512 tokens, `scripts/bench_amx.sh`), since the tiles read aligned weights and
/// activations packed for them (2026-11-27, 08:40–08:49; the machine's figures moved by up to
/// a third between identical runs):
/// - Q4_K in the gemm chain (nucleus's), two rounds: 3584×18944 118/144, 161/204, 203/193 and
///   135/171, 232/250, 253/221; 18944×3584 120/147, 196/191, 248/208 and 173/172, 243/220,
///   263/234: faster from 512, mixed at 128. In the one-FMA chain (`--exact`'s for some rows)
///   3584×18944 148/148, 183/236, 275/274 and 181/170, 304/243, 365/262.
/// - Q6_K, 3584×18944, at 32, 64, 128: 117/140, 181/165, 240/168; at 512 332/267.
/// - Q8_0 at 32, 64, 128: 232/116, 295/113, 251/119; at 512 209/126.
/// - Before (2026-11-26 evening): IQ4_NL 175/93, 292/101, 280/86; Q4_0 174/158, 280/177,
///   337/160 (an earlier run: 146/188 at 32, 164/202 at 64); Q5_0 (an earlier run) no faster
///   than the vectors, 163/166 at 512, 143/169 at 128, so on them; MXFP4 (2026-11-27 morning)
///   143/71, 228/79, 264/62.
/// - Q5_K (2026-11-28, 01:26–01:33), 3584×18944 at 32, 64, 128, 256, 512: 99/170, 222/243,
///   178/225, 347/229, 316/243; 18944×3584 at 32, 128, 512: 153/177, 322/228, 333/231.
/// - IQ4_XS (the same runs), 3584×18944: 184/132, 233/168, 362/190, 441/202, 500/238;
///   18944×3584 at 32, 128, 512: 129/143, 249/191, 393/193.
fn amx_min_tokens(ty: GgmlType, chain: Chain) -> Option<usize> {
    match ty {
        GgmlType::Q4_K if chain == Chain::Default => Some(Q4K_ONE_FMA_MIN_TOKENS),
        GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::MXFP4 => Some(32),
        GgmlType::Q6_K => Some(64),
        GgmlType::Q4_0 | GgmlType::IQ4_XS => Some(128),
        GgmlType::Q5_K => Some(256),
        GgmlType::Q4_K => Some(512),
        _ => None,
    }
}

/// The fewest tokens for which a matrix of `ty` runs on the 512-bit kernels of [`wide`]
/// (`None`: never), where the CPU has AVX-512 VNNI. Below, unpacking the weights costs more
/// than the wider registers save. `matmul_bench` (2 threads, Xeon with AVX-512 VNNI,
/// 2026-11-26, 18944×3584 and 3584×18944), G MAC/s wide / 256-bit: Q4_K 130/182 and 104/190
/// at 8 tokens, 189/193 and 159/192 at 16, 238/196 and 216/188 at 32, 325/200 and 332/188 at
/// 512; Q6_K 136/124 and 140/128 at 8, 289/187 and 297/195 at 512. Q5_K (the Cascade Lake
/// Xeon, 2026-11-27, 8960×1536): 68/98 at 8, 102/101 at 16, 131/104 at 32, 187/112 at 512;
/// IQ4_XS there: 57/110 at 8, 86/111 at 16, 116/113 at 32, 158/113 at 128, 183/115 at 512;
/// Q3_K: 88/82 at 8, 120/81 at 16, 177/84 at 512. Q4_K again after its 512-bit kernel's
/// later changes (2026-12-07, the Xeon without AMX, `MATMUL_FAST_ONLY=1 MATMUL_SHAPE=R,C
/// MATMUL_ROWS=5,8,12,16,24,31 matmul_bench 2 Q4_K`), wide / 256-bit at 8, 12, 16, 24 tokens:
/// 768×2048 (a Qwen3-30B-A3B expert's gate) 148/185, 175/188, 200/192, 224/194; 2048×768
/// 167/176, 178/180, 194/183, 213/186; 3584×18944 144/162, 176/154, 201/157, 226/160: from 16
/// on (a mixture of experts' prompt gives many experts fewer than 32 tokens).
fn wide_min_tokens(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q4_K => Some(16),
        GgmlType::Q5_K => Some(16),
        GgmlType::IQ4_XS => Some(32),
        GgmlType::Q3_K => Some(TILE_TOKENS + 1),
        GgmlType::Q6_K => Some(TILE_TOKENS + 1),
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::IQ4_NL | GgmlType::MXFP4 => {
            Some(TILE_TOKENS + 1)
        }
        // Up to q5_stored_most tokens Q5_0 is read as stored (`x86::tile_q5_many`).
        GgmlType::Q5_0 => Some(q5_stored_most() + 1),
        _ => None,
    }
}

/// What a caller asks of the tiles: [`TileAsk::Auto`] everywhere but in the tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TileAsk {
    /// The hardware where the CPU has AMX, for the types and token counts where it is faster.
    Auto,
    /// Emulated tiles on any AVX-512 machine, for every type and token count the tiles take.
    Emulated,
    /// The hardware where the CPU has AMX, for every type and token count the tiles take.
    Hardware,
}

/// How `nt` tokens multiply a matrix of `ty`: on tiles when the CPU has AMX (or emulated, in
/// the tests) for the types [`amx`] has kernels for.
pub(super) fn tile_use(ty: GgmlType, nt: usize, simd: bool, ask: TileAsk, chain: Chain) -> TileUse {
    let typed = matches!(
        ty,
        GgmlType::Q8_0
            | GgmlType::Q5_0
            | GgmlType::Q4_0
            | GgmlType::IQ4_NL
            | GgmlType::MXFP4
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::IQ4_XS
    );
    if !simd || !typed || nt < AMX_MIN_TOKENS {
        return TileUse::No;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if (ask == TileAsk::Emulated && amx::avx512()) || amx::emulation_runs() {
            return TileUse::Emulated;
        }
        let wanted = ask == TileAsk::Hardware
            || amx::all_requested()
            || amx_min_tokens(ty, chain).is_some_and(|least| nt >= least);
        if amx::uses_amx() && wanted {
            return TileUse::Hardware;
        }
    }
    let _ = ask;
    TileUse::No
}

#[cfg(test)]
mod tests {
    use super::super::tests::{packed, random_q4_k};
    use super::*;
    use crate::kernels::test_rng::Rng;

    /// Decode's work items hold an even number of groups where the 512-bit kernels read them
    /// in pairs (an odd one would leave a group of every item to the 256-bit kernel).
    #[test]
    fn decode_items_pair_their_groups() {
        let (rows, cols) = (112, 256); // 14 groups: 7 a thread of two
        let w = packed(
            GgmlType::Q4_K,
            &random_q4_k(&mut Rng(3), rows, cols),
            rows,
            cols,
        );
        assert_eq!(chunk_groups(&w, 1, 2, false), 7);
        assert_eq!(chunk_groups(&w, 1, 2, true), 8);
        assert_eq!(chunk_groups(&w, 40, 2, true), GROUPS_PER_CHUNK);
    }
}
