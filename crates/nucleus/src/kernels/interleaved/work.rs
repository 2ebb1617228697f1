//! One work item of a packed product: a run of a matrix's row groups against every token,
//! one tile of tokens (decode) or many, with the group's kernel.

use super::lines::Lines;
#[cfg(target_arch = "x86_64")]
use super::{
    amx, choice::tile_slices, q6_k, q8_lanes, wide, wide_blocks, wide_stored, wide_stored_scaled,
    x86, TileUse,
};
use super::{
    is_block_type, pack, scratch_per_group, GroupView, PackedActs, Product, QuantizedActs, Tile,
    GROUP_ROWS, TILE_TOKENS, TOKEN_BLOCK,
};
use crate::quant::GgmlType;

/// The packed bytes of a work item's row groups: the matrix's own, or (a matrix waiting to be
/// packed) the item's groups packed for it alone.
#[derive(Clone, Copy)]
struct Groups<'a> {
    bytes: &'a [u8],
    /// The first group `bytes` holds.
    first: usize,
    /// Bytes per group.
    size: usize,
}

impl<'a> Groups<'a> {
    /// The packed bytes of group `g`.
    fn get(&self, g: usize) -> &'a [u8] {
        let i = g - self.first;
        &self.bytes[i * self.size..(i + 1) * self.size]
    }
}

impl Product<'_> {
    /// The tile of tokens `t..t + nx` against group `g`: their activation rows and prepared
    /// scales and offsets (none for Q8_K activations, which carry their scales in their
    /// blocks), and row `8g` of token `t`'s output.
    fn tile(&self, x: &QuantizedActs, acts: &PackedActs, g: usize, t: usize, nx: usize) -> Tile {
        let (blocks, rows) = (self.blocks, self.w.rows());
        // Q4_0's weights carry a bias of 8, Q5_0's of 16, the signed types' (Q8_0, IQ4_NL,
        // MXFP4) 128 in the 512-bit kernels, which start their sums from the negated offset
        // (the other signed kernels ignore it).
        let offsets = match self.w.ty() {
            GgmlType::Q4_0 => &acts.offsets8,
            GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::MXFP4 => &acts.neg_offsets128,
            _ => &acts.offsets16,
        };
        let (scales, offsets) = if !acts.min_pairs.is_empty() {
            (std::ptr::null(), acts.min_pairs[t * 4 * blocks..].as_ptr())
        } else if acts.scales.is_empty() {
            (std::ptr::null(), std::ptr::null())
        } else {
            (
                acts.scales[t * blocks..].as_ptr(),
                offsets[t * blocks..].as_ptr(),
            )
        };
        Tile {
            blocks,
            x: x.row(t).as_ptr(),
            x_stride: x.row_bytes(),
            scales,
            offsets,
            nx,
            out: self.out.at(t * rows + g * GROUP_ROWS),
            out_stride: rows,
        }
    }

    /// Work item `c` (groups `c·chunk_groups..`) for every token of `x` (`acts`: their Q8_0
    /// numbers; `tile_acts`: them packed for the AMX tiles, where this product runs on them),
    /// `scratch` (scales, values) holding room for the groups it unpacks.
    pub(super) fn run_chunk(
        &self,
        c: usize,
        inputs: (&QuantizedActs, &PackedActs, &[Lines]),
        scratch: (&mut [f32], &mut [u8]),
    ) {
        thread_local! {
            static PACKED_HERE: std::cell::RefCell<Vec<u8>> = Default::default();
        }
        let groups = self.w.rows() / GROUP_ROWS;
        let (g0, g1) = (
            c * self.chunk_groups,
            ((c + 1) * self.chunk_groups).min(groups),
        );
        let size = self.w.group_bytes();
        if let Some(bytes) = self.w.packed_raw() {
            let src = Groups {
                bytes,
                first: 0,
                size,
            };
            return self.run_groups(g0..g1, src, inputs, scratch);
        }
        // Packed here, into a buffer that stays in cache: the same bytes as the matrix's own
        // will be, read by the same kernels.
        PACKED_HERE.with_borrow_mut(|buf| {
            let rows = self.w.file_rows().expect("an unpacked matrix has its rows");
            let src = Groups {
                bytes: pack::pack_groups(&rows, g0..g1, buf),
                first: g0,
                size,
            };
            self.run_groups(g0..g1, src, inputs, scratch)
        })
    }

    /// [`Self::run_chunk`] for groups `gs`, whose packed bytes `src` holds.
    fn run_groups(
        &self,
        gs: std::ops::Range<usize>,
        src: Groups,
        (x, acts, tile_acts): (&QuantizedActs, &PackedActs, &[Lines]),
        scratch: (&mut [f32], &mut [u8]),
    ) {
        let (g0, g1) = (gs.start, gs.end);
        if x.n_tokens() <= TILE_TOKENS {
            return self.decode_groups(g0..g1, src, x, acts, scratch);
        }
        #[cfg(target_arch = "x86_64")]
        match self.tiles {
            TileUse::Hardware => {
                let mut tiles = amx::Hardware::new();
                return self.tiles_on(g0..g1, src, (x, acts, tile_acts), scratch, &mut tiles);
            }
            TileUse::Emulated => {
                let mut tiles = amx::Emulated::default();
                return self.tiles_on(g0..g1, src, (x, acts, tile_acts), scratch, &mut tiles);
            }
            TileUse::No => {}
        }
        #[cfg(target_arch = "x86_64")]
        if self.wide {
            return self.wide_tiles(g0..g1, src, x, acts, scratch);
        }
        #[cfg(target_arch = "x86_64")]
        if self.q5_stored_many {
            let nt = x.n_tokens();
            for tb in (0..nt).step_by(x86::MANY_TOKENS) {
                for g in g0..g1 {
                    let tile = self.tile(x, acts, g, tb, (nt - tb).min(x86::MANY_TOKENS));
                    // SAFETY: as for the tiles of `token_tiles`, with tokens tb..tb + nx, nx
                    // at most MANY_TOKENS; `q5_stored_many` implies AVX2 and F16C.
                    unsafe { x86::tile_q5_many(src.get(g), &tile) };
                }
            }
            return;
        }
        self.token_tiles(g0..g1, src, x, acts, scratch)
    }

    /// One tile of tokens (decode) against groups `gs`, a group at a time.
    fn decode_groups(
        &self,
        gs: std::ops::Range<usize>,
        src: Groups,
        x: &QuantizedActs,
        acts: &PackedActs,
        (scales, unpacked): (&mut [f32], &mut [u8]),
    ) {
        let (w, blocks) = (self.w, self.blocks);
        let (sl, ul) = scratch_per_group(w.ty(), blocks);
        // Pairs of groups first where the 512-bit decode kernel runs (x86 only).
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut gs = gs;
        #[cfg(target_arch = "x86_64")]
        while self.wide_decode && gs.len() >= 2 {
            let g = gs.start;
            let tile = self.tile(x, acts, g, 0, x.n_tokens());
            let (a, b) = (src.get(g), src.get(g + 1));
            // SAFETY: tokens 0..nt (nt <= 4) are rows of `x`; outputs 8g..8g+16 of each token
            // lie in this product's `y` (g + 1 < gs.end), written by this thread only;
            // `wide_decode` implies AVX-512 VNNI (and FMA, F16C).
            unsafe {
                use wide_stored_scaled as scaled;
                match w.ty() {
                    GgmlType::Q4_K => wide_stored::q4_k_pair(a, b, &tile, self.q4k_pairs),
                    GgmlType::Q5_K => wide_stored::q5_k_pair(a, b, &tile),
                    GgmlType::Q3_K => scaled::q3_k_pair(a, b, &tile),
                    GgmlType::Q6_K => scaled::q6_k_pair(a, b, &tile),
                    GgmlType::IQ4_XS => scaled::iq4_xs_pair(a, b, &tile),
                    ty => wide_blocks::stored_pair(a, b, &tile, ty),
                }
            };
            gs.start += 2;
        }
        for g in gs {
            let tile = self.tile(x, acts, g, 0, x.n_tokens());
            // Unpacked in registers, never stored.
            #[cfg(target_arch = "x86_64")]
            if self.stored {
                // SAFETY: tokens 0..nt (nt <= 4) are rows of `x` and `acts`; the stored
                // group g holds `blocks` blocks; outputs 8g..8g+8 of each token lie in
                // this product's `y`, written by this thread only; `stored` implies
                // AVX2 (and F16C, part of our AVX2 level).
                let stored = src.get(g);
                match w.ty() {
                    GgmlType::Q5_0 => unsafe { x86::tile_q5_stored(stored, &tile) },
                    GgmlType::Q4_0 => unsafe { x86::tile_q4_stored(stored, &tile) },
                    GgmlType::IQ4_NL => unsafe { x86::tile_iq4nl_stored(stored, &tile) },
                    GgmlType::MXFP4 => unsafe { x86::tile_mxfp4_stored(stored, &tile) },
                    GgmlType::Q6_K => unsafe { q6_k::tile_stored(stored, &tile) },
                    _ => unsafe { self.q8_stored(stored, &tile) },
                }
                continue;
            }
            let (s, u) = (&mut scales[..sl], &mut unpacked[..ul]);
            let view = GroupView::new(w.ty(), blocks, src.get(g), s, u, self.unpack);
            // SAFETY: as for the tiles of `token_tiles`, with tokens 0..nt.
            unsafe { (self.tile_fn)(&view, &tile) };
        }
    }

    /// A stored Q8_0 group against a tile of tokens, in this product's chain.
    ///
    /// # Safety
    /// As [`x86::tile_q8_stored`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn q8_stored(&self, stored: &[u8], tile: &Tile) {
        // SAFETY: the caller's contract, which both kernels share.
        unsafe {
            if self.q8_lanes {
                q8_lanes::tile_stored(stored, tile)
            } else {
                x86::tile_q8_stored(stored, tile)
            }
        }
    }

    /// The views of groups `gs`, each unpacked into its share of `scales` and `unpacked`
    /// ([`scratch_per_group`] each).
    fn views<'s>(
        &'s self,
        gs: std::ops::Range<usize>,
        src: Groups<'s>,
        scales: &'s mut [f32],
        unpacked: &'s mut [u8],
    ) -> Vec<GroupView<'s>> {
        let (w, blocks) = (self.w, self.blocks);
        let (sl, ul) = scratch_per_group(w.ty(), blocks);
        let (mut s_rest, mut u_rest) = (scales, unpacked);
        let mut views = Vec::with_capacity(gs.len());
        for g in gs {
            let (s, s_next) = std::mem::take(&mut s_rest).split_at_mut(sl);
            let (u, u_next) = std::mem::take(&mut u_rest).split_at_mut(ul);
            (s_rest, u_rest) = (s_next, u_next);
            views.push(GroupView::new(
                w.ty(),
                blocks,
                src.get(g),
                s,
                u,
                self.unpack,
            ));
        }
        views
    }

    /// Many tokens against groups `gs`: each group unpacked once (Q8_0 on AVX2 read as stored:
    /// widening its scales in registers costs less than a pass that stores them,
    /// `matmul_bench`: 16 to 512 tokens, 93–95 G MAC/s with the pass), then tokens a block at
    /// a time, so that their activations stay in cache while every group goes over them.
    fn token_tiles(
        &self,
        gs: std::ops::Range<usize>,
        src: Groups,
        x: &QuantizedActs,
        acts: &PackedActs,
        (scales, unpacked): (&mut [f32], &mut [u8]),
    ) {
        let nt = x.n_tokens();
        let stored_tiles = self.q8_stored_tiles;
        let views = if stored_tiles {
            Vec::new()
        } else {
            self.views(gs.clone(), src, scales, unpacked)
        };
        for tb in (0..nt).step_by(TOKEN_BLOCK) {
            let te = (tb + TOKEN_BLOCK).min(nt);
            for g in gs.clone() {
                let mut t = tb;
                while t < te {
                    let nx = (te - t).min(TILE_TOKENS);
                    let tile = self.tile(x, acts, g, t, nx);
                    // SAFETY: tokens t..t+nx < nt are rows of `x` (stride row_bytes) and
                    // of `acts` (stride `blocks`, sizes checked by `matmul_packed_with`); the
                    // view holds `blocks` blocks; outputs t·rows + 8g .. +8 lie inside this
                    // product's `y` (size checked) and no other thread writes group g of it;
                    // the kernel matches the CPU (`kernels`).
                    #[cfg(target_arch = "x86_64")]
                    if stored_tiles {
                        // SAFETY: as above, the stored group g holding `blocks` blocks;
                        // `q8_stored_tiles` implies AVX2 and F16C.
                        unsafe { self.q8_stored(src.get(g), &tile) };
                        t += nx;
                        continue;
                    }
                    unsafe { (self.tile_fn)(&views[g - gs.start], &tile) };
                    t += nx;
                }
            }
        }
    }

    /// Many tokens against groups `gs` with the 512-bit kernels ([`wide`]): each pair of
    /// groups unpacked once, then tokens a block at a time as in `token_tiles`; an odd last
    /// group goes through `token_tiles`.
    #[cfg(target_arch = "x86_64")]
    fn wide_tiles(
        &self,
        gs: std::ops::Range<usize>,
        src: Groups,
        x: &QuantizedActs,
        acts: &PackedActs,
        scratch: (&mut [f32], &mut [u8]),
    ) {
        thread_local! {
            static UNPACKED: std::cell::RefCell<Vec<u8>> = Default::default();
        }
        if is_block_type(self.w.ty()) {
            return self.wide_blocks_tiles(gs, src, x, acts, scratch);
        }
        let (w, blocks, nt) = (self.w, self.blocks, x.n_tokens());
        let pairs = gs.len() / 2;
        let pair_bytes = blocks * wide::WIDE_BLOCK;
        UNPACKED.with_borrow_mut(|buf| {
            buf.resize(pairs * pair_bytes, 0);
            for (p, dst) in buf.chunks_exact_mut(pair_bytes).enumerate() {
                let g = gs.start + 2 * p;
                let pair = [src.get(g), src.get(g + 1)];
                wide::unpack(w.ty(), blocks, pair, dst);
            }
            for tb in (0..nt).step_by(TOKEN_BLOCK) {
                let te = (tb + TOKEN_BLOCK).min(nt);
                for (p, unpacked) in buf.chunks_exact(pair_bytes).enumerate() {
                    let mut t = tb;
                    while t < te {
                        let nx = (te - t).min(wide::WIDE_TOKENS);
                        let tile = self.tile(x, acts, gs.start + 2 * p, t, nx);
                        // SAFETY: tokens t..t + nx < nt are rows of `x` (checked by
                        // `matmul_packed_with`); `unpacked` holds `blocks` super-blocks of
                        // groups g, g + 1, whose outputs t·rows + 8g .. + 16 lie inside this
                        // product's `y` and are written by this thread only; `wide` implies
                        // AVX-512 VNNI (and FMA, F16C).
                        unsafe {
                            match w.ty() {
                                GgmlType::Q4_K => wide::q4_k(unpacked, &tile, self.q4k_pairs),
                                GgmlType::Q5_K => wide::q5_k(unpacked, &tile),
                                ty => wide::offset_values(unpacked, &tile, ty),
                            }
                        }
                        t += nx;
                    }
                }
            }
        });
        if gs.len() % 2 == 1 {
            self.token_tiles(gs.end - 1..gs.end, src, x, acts, scratch);
        }
    }

    /// [`Self::wide_tiles`] for the 32-value block types ([`wide_blocks`]): Q8_0's pairs of
    /// groups read as stored, the others' groups unpacked once into the item's scratch; then
    /// tokens a block at a time; an odd last group goes through `token_tiles`.
    #[cfg(target_arch = "x86_64")]
    fn wide_blocks_tiles(
        &self,
        gs: std::ops::Range<usize>,
        src: Groups,
        x: &QuantizedActs,
        acts: &PackedActs,
        (scales, unpacked): (&mut [f32], &mut [u8]),
    ) {
        let (nt, ty) = (x.n_tokens(), self.w.ty());
        let paired = gs.start..gs.end - gs.len() % 2;
        let views = if ty == GgmlType::Q8_0 {
            Vec::new()
        } else {
            self.views(paired.clone(), src, &mut *scales, &mut *unpacked)
        };
        let signed = matches!(ty, GgmlType::IQ4_NL | GgmlType::MXFP4);
        for tb in (0..nt).step_by(TOKEN_BLOCK) {
            let te = (tb + TOKEN_BLOCK).min(nt);
            for g in paired.clone().step_by(2) {
                let mut t = tb;
                while t < te {
                    let nx = (te - t).min(wide::WIDE_TOKENS);
                    let tile = self.tile(x, acts, g, t, nx);
                    let i = g - paired.start;
                    // SAFETY: tokens t..t + nx < nt are rows of `x` and of `acts` (sizes
                    // checked by `matmul_packed_with`), their offsets the ones `tile` picks
                    // for the type; groups g, g + 1 hold `blocks` blocks each (stored or
                    // unpacked), and their outputs t·rows + 8g .. + 16 lie inside this
                    // product's `y`, written by this thread only; `wide` implies AVX-512 VNNI
                    // (and FMA, F16C).
                    unsafe {
                        if views.is_empty() {
                            wide_blocks::q8_0_pair(src.get(g), src.get(g + 1), &tile)
                        } else {
                            wide_blocks::unpacked_pair(&views[i], &views[i + 1], &tile, signed)
                        }
                    };
                    t += nx;
                }
            }
        }
        drop(views);
        if gs.len() % 2 == 1 {
            self.token_tiles(gs.end - 1..gs.end, src, x, acts, (scales, unpacked));
        }
    }

    /// Many tokens against groups `gs` on AMX tiles (or their emulation): the groups copied
    /// into the tiles' layout, four at a time (an item), then 32 tokens at a time against
    /// every item, so that the tokens' activations stay in cache while the items go over them;
    /// a long row in slices of its blocks ([`tile_slices`]), each over every block of tokens
    /// before the next, so that the items' slice stays in cache too.
    #[cfg(target_arch = "x86_64")]
    fn tiles_on<T: amx::Tiles>(
        &self,
        gs: std::ops::Range<usize>,
        src: Groups,
        (x, acts, tile_acts): (&QuantizedActs, &PackedActs, &[Lines]),
        (scales, unpacked): (&mut [f32], &mut [u8]),
        tiles: &mut T,
    ) {
        thread_local! {
            static ITEMS: std::cell::RefCell<Vec<amx::ItemWeights>> = Default::default();
            static CARRY: std::cell::RefCell<Vec<amx::Acc>> = Default::default();
        }
        const ITEM_GROUPS: usize = amx::ITEM_ROWS / GROUP_ROWS;
        let (w, blocks, nt) = (self.w, self.blocks, x.n_tokens());
        ITEMS.with_borrow_mut(|items| {
            let n_items = gs.len().div_ceil(ITEM_GROUPS);
            if items.len() < n_items {
                items.resize_with(n_items, Default::default);
            }
            for (i, item) in items.iter_mut().enumerate().take(n_items) {
                let g0 = gs.start + ITEM_GROUPS * i;
                self.lay_out_item(
                    item,
                    g0..(g0 + ITEM_GROUPS).min(gs.end),
                    src,
                    scales,
                    unpacked,
                );
            }
            let offsets = if w.ty() == GgmlType::Q4_0 {
                &acts.offsets8
            } else {
                &acts.offsets16
            };
            let slices = tile_slices(w);
            // Q4_K's two accumulators (its mins' apart), per block of tokens and item.
            let carry_len = if slices > 1 {
                2 * n_items * nt.div_ceil(amx::ITEM_TOKENS)
            } else {
                0
            };
            let mut carry = CARRY.take();
            // SAFETY: zeros are valid floats.
            carry.resize_with(carry_len, || unsafe { std::mem::zeroed() });
            for s in 0..slices {
                let slice = blocks * s / slices..blocks * (s + 1) / slices;
                for tb in (0..nt).step_by(amx::ITEM_TOKENS) {
                    let m = (nt - tb).min(amx::ITEM_TOKENS);
                    let (scales, offsets) = if acts.scales.is_empty() {
                        (std::ptr::null(), std::ptr::null())
                    } else {
                        (
                            acts.scales[tb * blocks..].as_ptr(),
                            offsets[tb * blocks..].as_ptr(),
                        )
                    };
                    for (i, item) in items.iter().enumerate().take(n_items) {
                        let g0 = gs.start + ITEM_GROUPS * i;
                        let at = 2 * (n_items * (tb / amx::ITEM_TOKENS) + i);
                        let job = amx::Job {
                            blocks,
                            slice: slice.clone(),
                            carry: carry
                                .get_mut(at)
                                .map_or(std::ptr::null_mut(), |c| c as *mut _),
                            m,
                            a: tile_acts[tb / amx::ITEM_TOKENS].as_ptr(),
                            scales,
                            offsets,
                            out: self.out.at(tb * w.rows() + g0 * GROUP_ROWS),
                            out_stride: w.rows(),
                        };
                        // SAFETY: tokens tb..tb + m are rows of `x` and `acts` (sizes checked by
                        // `matmul_packed_with`); `item` holds `blocks` blocks of the groups from
                        // g0 (at most four, inside `gs`); outputs t·rows + 8·g0 .. + 8·item.groups
                        // lie inside this product's `y`, and no other thread writes these groups;
                        // `tiles` is the hardware only where `uses_amx` (`tile_use`), and the
                        // kernels need AVX-512F, which `tile_use` checked; with slices, `carry`
                        // has two accumulators at `at` for this block of tokens and item, used
                        // by this call only, which the slice before wrote (slices run in order,
                        // all on this thread); without, `carry` is empty and the pointer null.
                        unsafe { self.run_item(tiles, item, &job) };
                    }
                }
            }
            CARRY.set(carry);
        });
        tiles.release();
    }

    /// Writes `item`, the AMX layout of groups `g` (at most four, whose packed bytes `src`
    /// holds), unpacking the types that need it into `scales` and `unpacked`.
    #[cfg(target_arch = "x86_64")]
    fn lay_out_item(
        &self,
        item: &mut amx::ItemWeights,
        g: std::ops::Range<usize>,
        src: Groups,
        scales: &mut [f32],
        unpacked: &mut [u8],
    ) {
        let blocks = self.blocks;
        // The views unpack into the scratch of one item's groups (`scratch_groups`).
        let views = self.views(g.clone(), src, scales, unpacked);
        let views: Vec<&GroupView> = views.iter().collect();
        let stored = || -> Vec<&[u8]> { g.clone().map(|g| src.get(g)).collect() };
        match self.w.ty() {
            GgmlType::Q4_K => item.q4_k(&stored(), blocks),
            GgmlType::Q5_K => item.q5_k(&stored(), blocks),
            GgmlType::IQ4_XS => item.iq4_xs(&stored(), blocks),
            GgmlType::Q6_K => item.q6_k(&views, blocks),
            _ => item.block32(&views, blocks),
        }
    }

    /// One item's products for one block of tokens on `tiles`, with this matrix's kernel.
    ///
    /// # Safety
    /// As the kernels of [`amx`]: `job` describes tokens, outputs and a carry valid for
    /// `item` (see [`Self::tiles_on`]), and `tiles` runs where the CPU allows it.
    #[cfg(target_arch = "x86_64")]
    unsafe fn run_item<T: amx::Tiles>(
        &self,
        tiles: &mut T,
        item: &amx::ItemWeights,
        job: &amx::Job,
    ) {
        // SAFETY: the caller's contract.
        unsafe {
            match self.w.ty() {
                GgmlType::Q4_K if self.q4k_pairs => amx::q4_k::<T, true>(tiles, item, job),
                GgmlType::Q4_K => amx::q4_k::<T, false>(tiles, item, job),
                GgmlType::Q5_K => amx::q5_k(tiles, item, job),
                // IQ4_XS's chain is Q6_K's, on planes laid out as Q6_K's.
                GgmlType::Q6_K | GgmlType::IQ4_XS => amx::q6_k(tiles, item, job),
                GgmlType::Q5_0 => amx::block32::<T, 16>(tiles, item, job),
                GgmlType::Q4_0 => amx::block32::<T, 8>(tiles, item, job),
                _ => amx::block32::<T, 0>(tiles, item, job),
            }
        }
    }
}
