//! The interleaved layout: Q8_0, Q5_0, Q4_0 and IQ4_NL matrices repacked eight rows at a
//! time, the same bytes per block as in the file (the scales stay f16, the values keep their
//! bits); Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS matrices as [`super::q3_k`], [`super::q4_k`],
//! [`super::q5_k`], [`super::q6_k`] and [`super::iq4_xs`] describe.
//!
//! Per group of eight rows and block of 32 inputs (`q[j][i]`: value `i` of row `j`):
//! - Q8_0 (272 bytes): the eight f16 scales, then eight chunks of 32 bytes, chunk `k` holding
//!   `q[j][4k + m]` at byte `4j + m`;
//! - Q5_0 (176 bytes): the eight f16 scales; 128 bytes of nibbles in four chunks, chunk `c`
//!   holding the low four bits of `q[j][4c + m]` in the low nibble of byte `4j + m` and those of
//!   `q[j][4(c + 4) + m]` in its high nibble; 32 bytes of fifth bits, bit `k` of byte `4j + m`
//!   being bit 4 of `q[j][4k + m]`. Q5_0 values are kept unsigned (weight + 16, 0..=31);
//! - Q4_0, IQ4_NL and MXFP4 (144 bytes): the eight f16 scales and the 128 bytes of nibbles of
//!   Q5_0's layout, without fifth bits: the file's nibbles, Q4_0's unsigned (weight + 8),
//!   IQ4_NL's indices into `kvalues_iq4nl`, MXFP4's into `kvalues_mxfp4`. MXFP4's scale,
//!   2^(e − 128), is a power of two that f16 holds exactly from 2^-24 to 2^15 (e from 104 to
//!   143); a matrix with a block outside that range (but for blocks of zeros) is not packed.

use std::sync::{Arc, OnceLock};

use super::huge_pages::Arena;
use super::interleave::interleave_rows;
use super::{iq4_xs, q3_k, q4_k, q5_k, q6_k, GROUP_ROWS, QK};
use crate::kernels::matmul::QMatrix;
use crate::quant::{GgmlType, KVALUES_IQ4NL, KVALUES_MXFP4};

/// A weight matrix in the interleaved layout: packed, or waiting to be ([`PackedMatrix::deferred`]),
/// its products packing each work item's groups as they go, into a buffer that stays in cache.
#[derive(Debug)]
pub struct PackedMatrix {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    data: OnceLock<Store>,
    /// The file's rows of a matrix packed after its load ([`PackedMatrix::finish`]).
    source: Option<Box<dyn FileRows>>,
    /// Where [`PackedMatrix::finish`] packs it: a part of an arena shared with other matrices
    /// ([`PackedMatrix::place_in`]), or (`None`) memory of its own.
    place: Option<(Arc<Arena>, usize)>,
}

/// A matrix's bytes as the file stores them, for a [`PackedMatrix`] that waits to be packed:
/// the model's mapped file.
pub trait FileRows: Send + Sync + std::fmt::Debug {
    /// The matrix's rows in the file's layout.
    fn bytes(&self) -> &[u8];
    /// `bytes()[offset..offset + len]` has been packed: its pages may be dropped (or kept, for
    /// a matrix that other kernels read from the file too).
    fn release(&self, offset: usize, len: usize);
}

/// Where a packed matrix's bytes live: memory of its own, or a stretch of a mapped file of
/// packed weights (`model::pack_cache`), shared with the page cache.
#[derive(Debug)]
enum Store {
    Owned(Vec<u8>),
    /// A large matrix's own memory, mapped apart and advised into huge pages
    /// ([`super::huge_pages`]).
    Anon(memmap2::MmapMut),
    Mapped {
        map: Arc<memmap2::Mmap>,
        offset: usize,
    },
    /// A part of an arena in huge pages, shared with other matrices ([`Arena`]).
    Arena {
        arena: Arc<Arena>,
        offset: usize,
    },
}

impl Store {
    /// `len` zeroed bytes, fresh from the kernel: in huge pages where they are wanted
    /// ([`super::huge_pages`]).
    fn fresh(len: usize) -> Store {
        match super::huge_pages::fresh_map(len) {
            Some(map) => Store::Anon(map),
            None => Store::Owned(vec![0u8; len]),
        }
    }

    /// The bytes of memory of its own (a mapped file's are read only).
    fn owned_mut(&mut self) -> &mut [u8] {
        match self {
            Store::Owned(v) => v,
            Store::Anon(m) => m,
            Store::Mapped { .. } => unreachable!("a mapped file of packed weights is read only"),
            Store::Arena { .. } => unreachable!("an arena's part is written where it is packed"),
        }
    }
}

/// Bytes of one group-block in the packed layout.
pub(super) fn group_block_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q8_0 => 16 + 256,
        GgmlType::Q5_0 => 16 + 128 + 32,
        GgmlType::Q4_0 | GgmlType::IQ4_NL | GgmlType::MXFP4 => 16 + 128,
        GgmlType::Q4_K => q4_k::GROUP_BLOCK,
        GgmlType::Q5_K => q5_k::GROUP_BLOCK,
        GgmlType::Q6_K => q6_k::GROUP_BLOCK,
        GgmlType::IQ4_XS => iq4_xs::GROUP_BLOCK,
        GgmlType::Q3_K => q3_k::GROUP_BLOCK,
        _ => unreachable!(
            "only Q8_0, Q5_0, Q4_0, IQ4_NL, MXFP4, the K-quants from Q4_K and IQ4_XS are packed"
        ),
    }
}

/// Inputs per block of `ty` (32, or 256 for the K-quants and IQ4_XS).
pub(crate) fn block_len(ty: GgmlType) -> usize {
    if matches!(
        ty,
        GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::IQ4_XS
    ) {
        q4_k::QK_K
    } else {
        QK
    }
}

impl PackedMatrix {
    pub fn ty(&self) -> GgmlType {
        self.ty
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Bytes held (the same as the file's tensor for the 32-value blocks but MXFP4, whose
    /// one-byte scales widen to f16: 5.9 % more; 2.8 % more for Q4_K, 2.3 % for Q5_K, 3.6 % for
    /// Q3_K and 1.5 % for IQ4_XS, their scales and mins unpacked).
    pub fn bytes(&self) -> usize {
        packed_len(self.ty, self.rows, self.cols)
    }

    /// The whole packed matrix, as a file of packed weights stores it (packed now if it
    /// waited).
    pub fn raw(&self) -> &[u8] {
        self.finish();
        self.packed_raw().expect("packed above")
    }

    /// The packed bytes, `None` while the matrix waits to be packed.
    pub(super) fn packed_raw(&self) -> Option<&[u8]> {
        Some(match self.data.get()? {
            Store::Owned(v) => v,
            Store::Anon(m) => m,
            Store::Mapped { map, offset } => &map[*offset..*offset + self.bytes()],
            // SAFETY: the part was written when the matrix was packed (the OnceLock is set),
            // and no one writes it again.
            Store::Arena { arena, offset } => unsafe { arena.part(*offset, self.bytes()) },
        })
    }

    /// Whether the matrix is packed (else its products pack the groups they read as they go).
    pub fn is_packed(&self) -> bool {
        self.data.get().is_some()
    }

    /// A matrix of `ty`, `rows` × `cols` that waits to be packed from `source` (its rows in the
    /// file's layout): it costs nothing at load, its products pack each work item's groups into
    /// a buffer of their own as they go (the same bytes, so the same kernels and the same bits),
    /// and [`Self::finish`] packs it for good. `None` when the shape does not pack, or `source`
    /// does not hold the matrix.
    pub fn deferred(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        source: Box<dyn FileRows>,
    ) -> Option<PackedMatrix> {
        let rb = ty.row_bytes(cols)?;
        if !can_pack(ty, rows, cols)
            || rows.checked_mul(rb) != Some(source.bytes().len())
            || (ty == GgmlType::MXFP4 && !mxfp4_packs(source.bytes()))
        {
            return None;
        }
        Some(PackedMatrix {
            ty,
            rows,
            cols,
            data: OnceLock::new(),
            source: Some(source),
            place: None,
        })
    }

    /// Makes a matrix that waits ([`Self::deferred`]) pack into `arena` at `offset` rather than
    /// into memory of its own; nothing for a packed matrix.
    ///
    /// # Safety
    /// The part of [`Self::bytes`] at `offset` lies in `arena` and overlaps no part that
    /// another matrix packs into or reads from ([`Arena::parts`] hands out such offsets): its
    /// packing may run on another thread beside theirs.
    pub(crate) unsafe fn place_in(&mut self, arena: Arc<Arena>, offset: usize) {
        if self.data.get().is_none() {
            self.place = Some((arena, offset));
        }
    }

    /// Packs a matrix that waits ([`Self::deferred`]) into fresh memory of its own, dropping
    /// the file's pages as they are read; nothing for one already packed. Safe to call from
    /// several threads: one packs, the others wait for it.
    pub fn finish(&self) {
        self.data.get_or_init(|| {
            let source = self
                .source
                .as_deref()
                .expect("an unpacked matrix has its rows");
            let w = self.file_rows().expect("an unpacked matrix has its rows");
            let done = |at, len| source.release(at, len);
            match &self.place {
                Some((arena, offset)) => {
                    // SAFETY: the matrix's own part, which no other matrix touches (`place_in`'s
                    // contract), written once, here (inside the OnceLock), before anyone reads
                    // it.
                    let part = unsafe { arena.part_mut(*offset, self.bytes()) };
                    fill(&w, part, &done);
                    Store::Arena {
                        arena: Arc::clone(arena),
                        offset: *offset,
                    }
                }
                None => packed_store(&w, &done),
            }
        });
    }

    /// The matrix as the file stores it, where it waits to be packed.
    pub(super) fn file_rows(&self) -> Option<QMatrix<'_>> {
        let source = self.source.as_deref()?;
        Some(QMatrix {
            ty: self.ty,
            data: source.bytes(),
            rows: self.rows,
            cols: self.cols,
        })
    }

    /// Bytes of one packed row group.
    pub(super) fn group_bytes(&self) -> usize {
        group_len(self.ty, self.cols)
    }

    /// The packed matrix of `ty`, `rows` × `cols` whose bytes lie at `offset` in `map` (written
    /// from [`Self::raw`] by this build), or `None` when the shape does not pack or the bytes
    /// do not fit in the map.
    pub fn from_map(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        map: Arc<memmap2::Mmap>,
        offset: usize,
    ) -> Option<PackedMatrix> {
        if !can_pack(ty, rows, cols) {
            return None;
        }
        let end = offset.checked_add(packed_len(ty, rows, cols))?;
        (end <= map.len()).then_some(PackedMatrix {
            ty,
            rows,
            cols,
            data: OnceLock::from(Store::Mapped { map, offset }),
            source: None,
            place: None,
        })
    }

    /// The stored bytes of row group `g` (the matrix packed first if it waited).
    #[cfg(test)]
    pub(crate) fn group(&self, g: usize) -> &[u8] {
        let gb = self.group_bytes();
        &self.raw()[g * gb..(g + 1) * gb]
    }
}

/// Bytes of a packed `rows` × `cols` matrix of `ty` (a shape [`can_pack`] takes).
fn packed_len(ty: GgmlType, rows: usize, cols: usize) -> usize {
    rows / GROUP_ROWS * group_len(ty, cols)
}

/// Bytes of one packed row group of `cols` inputs of `ty`.
fn group_len(ty: GgmlType, cols: usize) -> usize {
    (cols / block_len(ty)) * group_block_bytes(ty)
}

/// Whether a matrix can be packed: Q8_0, Q5_0, Q4_0, IQ4_NL, MXFP4, Q4_K, Q5_K, Q6_K or
/// IQ4_XS with a row count that is a multiple of eight.
pub fn can_pack(ty: GgmlType, rows: usize, cols: usize) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        Q8_0 | Q5_0 | Q4_0 | IQ4_NL | MXFP4 | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS
    ) && rows.is_multiple_of(GROUP_ROWS)
        && cols.is_multiple_of(block_len(ty))
        && rows > 0
}

/// An MXFP4 block's scale 2^(e − 128) as f16 bits, when f16 holds it exactly; 0 for a block
/// whose values are all zero (its scale multiplies nothing); `None` otherwise.
fn mxfp4_scale_f16(block: &[u8]) -> Option<u16> {
    let e = block[0] as i32;
    match e - 128 {
        // Subnormal f16: 2^k = 2^-24 · 2^(k + 24).
        k @ -24..=-15 => Some(1 << (k + 24)),
        k @ -14..=15 => Some(((k + 15) as u16) << 10),
        _ if block[1..17].iter().all(|&b| b & 0x77 == 0) => Some(0),
        _ => None,
    }
}

/// Whether every MXFP4 block of `data` has a scale [`mxfp4_scale_f16`] takes.
fn mxfp4_packs(data: &[u8]) -> bool {
    data.chunks_exact(17).all(|b| mxfp4_scale_f16(b).is_some())
}

/// Repacks `w`, or `None` when [`can_pack`] says no.
pub fn pack(w: &QMatrix) -> Option<PackedMatrix> {
    if !can_pack(w.ty, w.rows, w.cols) || (w.ty == GgmlType::MXFP4 && !mxfp4_packs(w.data)) {
        return None;
    }
    Some(PackedMatrix {
        ty: w.ty,
        rows: w.rows,
        cols: w.cols,
        data: OnceLock::from(packed_store(w, &|_, _| {})),
        source: None,
        place: None,
    })
}

/// `w` packed into memory of its own, calling `done(offset, len)` as each stretch of `w.data`
/// has been read (so that a caller may drop a large matrix's file pages as it goes, instead of
/// holding both copies).
fn packed_store(w: &QMatrix, done: &(dyn Fn(usize, usize) + Sync)) -> Store {
    // Zeroed pages, fresh from the kernel: every packing below writes a byte before it reads
    // it (a read first would map the zero page and make the write a copy-on-write fault with
    // a TLB flush on every core: it was most of a 7B file's load time).
    let mut store = Store::fresh(packed_len(w.ty, w.rows, w.cols));
    fill(w, store.owned_mut(), done);
    store
}

/// Packs `w` into `data` (its packed length), calling `done` as [`packed_store`] says.
fn fill(w: &QMatrix, data: &mut [u8], done: &(dyn Fn(usize, usize) + Sync)) {
    let rb =
        w.ty.row_bytes(w.cols)
            .expect("a packed shape has whole blocks");
    let group_bytes = group_len(w.ty, w.cols);
    let pack_group = |g: usize, out: &mut [u8]| pack_group(w, g, out);
    // A large matrix (an output projection: 145–180 MB) is spread over the cores; the layers'
    // matrices are already packed several at a time (`Weights::pack`).
    let threads = if data.len() >= 1 << 24 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        1
    };
    let groups = w.rows / GROUP_ROWS;
    let per = groups.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (i, part) in data.chunks_mut(per * group_bytes).enumerate() {
            let pack_group = &pack_group;
            let mut run = move || {
                // Source rows are released in stretches of 64 groups (512 rows).
                let mut from = i * per;
                let n = part.len() / group_bytes;
                for (k, out) in part.chunks_exact_mut(group_bytes).enumerate() {
                    let g = i * per + k;
                    pack_group(g, out);
                    if g + 1 - from == 64 || k + 1 == n {
                        let row = from * GROUP_ROWS;
                        done(row * rb, (g + 1 - from) * GROUP_ROWS * rb);
                        from = g + 1;
                    }
                }
            };
            if threads == 1 {
                run();
            } else {
                s.spawn(run);
            }
        }
    });
}

/// Row group `g` of `w` (as the file stores it) into `out`, its packed bytes.
fn pack_group(w: &QMatrix, g: usize, out: &mut [u8]) {
    let rb =
        w.ty.row_bytes(w.cols)
            .expect("a packed shape has whole blocks");
    let rows: [&[u8]; GROUP_ROWS] =
        std::array::from_fn(|j| &w.data[(g * GROUP_ROWS + j) * rb..][..rb]);
    #[cfg(target_arch = "x86_64")]
    if super::pack_small::pack_group(w.ty, rows, out) {
        return;
    }
    pack_group_by_blocks(w.ty, rows, out);
}

/// The group whose rows are `rows` packed into `out` one block at a time (what
/// `pack_small`'s packings are tested against).
pub(super) fn pack_group_by_blocks(ty: GgmlType, rows: [&[u8]; GROUP_ROWS], out: &mut [u8]) {
    let gbb = group_block_bytes(ty);
    let bb = rows[0].len() / (out.len() / gbb);
    for (b, dst) in out.chunks_exact_mut(gbb).enumerate() {
        let at = b * bb;
        prefetch_ahead(rows, at, bb);
        pack_block(ty, |j| &rows[j][at..at + bb], dst);
    }
}

/// How far ahead of the block it packs the packing asks for each row's bytes.
const PREFETCH_AHEAD: usize = 512;

/// Asks for the cache lines that start within the `bytes` at [`PREFETCH_AHEAD`] past `at` in
/// each of `rows` (each line once as the blocks go by, however small they are): eight rows read
/// side by side are eight streams, more than the hardware's prefetchers follow well (the
/// packing of a 7B file's first pass waited on its rows' loads).
#[inline(always)]
pub(super) fn prefetch_ahead(rows: [&[u8]; GROUP_ROWS], at: usize, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    for row in rows {
        let from = row.as_ptr().wrapping_add(at + PREFETCH_AHEAD);
        let mut l = from.align_offset(64);
        while l < bytes {
            // SAFETY: SSE is part of x86-64; a prefetch dereferences nothing (`wrapping_add`:
            // past the row's end it is a hint that may read nothing).
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    from.wrapping_add(l).cast(),
                )
            };
            l += 64;
        }
    }
    let _ = (rows, at, bytes);
}

/// Row groups `gs` of `w` (as the file stores it) packed into the start of `buf`, grown to
/// hold them (never shrunk, so that it is zeroed once): the bytes a packed matrix holds for
/// these groups.
pub(super) fn pack_groups<'b>(
    w: &QMatrix,
    gs: std::ops::Range<usize>,
    buf: &'b mut Vec<u8>,
) -> &'b [u8] {
    let gb = group_len(w.ty, w.cols);
    let len = gs.len() * gb;
    if buf.len() < len {
        buf.resize(len, 0);
    }
    for (g, dst) in gs.zip(buf[..len].chunks_exact_mut(gb)) {
        pack_group(w, g, dst);
    }
    &buf[..len]
}

/// Packs `w` again into `into`'s memory, a packed matrix of `w`'s type and shape that owns its
/// bytes (for `examples/pack_bench.rs`: the packing's own cost, without fresh pages'); `None`
/// when the two differ, or `into` is mapped from a file or waits to be packed.
pub fn repack_into(w: &QMatrix, mut into: PackedMatrix) -> Option<PackedMatrix> {
    if (into.ty, into.rows, into.cols) != (w.ty, w.rows, w.cols) {
        return None;
    }
    let store = into
        .data
        .get_mut()
        .filter(|s| matches!(s, Store::Owned(_) | Store::Anon(_)))?;
    fill(w, store.owned_mut(), &|_, _| {});
    Some(into)
}

/// One block of a group into `dst`, in the group layout: `row(j)` is the block's bytes in row
/// `j` of the group. Every byte of `dst` is written before any is read (fresh memory: see
/// [`packed_store`]).
#[inline]
fn pack_block<'a>(ty: GgmlType, row: impl Fn(usize) -> &'a [u8], dst: &mut [u8]) {
    match ty {
        GgmlType::Q4_K => q4_k::pack_group_block(std::array::from_fn(&row), dst),
        GgmlType::Q5_K => q5_k::pack_group_block(std::array::from_fn(&row), dst),
        GgmlType::IQ4_XS => iq4_xs::pack_group_block(std::array::from_fn(&row), dst),
        GgmlType::Q3_K => q3_k::pack_group_block(std::array::from_fn(&row), dst),
        GgmlType::Q6_K => q6_k::pack_group_block(std::array::from_fn(&row), dst),
        GgmlType::Q8_0 => {
            // Eight rows' words at a time: this is most of the load time of a large output
            // projection.
            let rows: [&[u8]; GROUP_ROWS] = std::array::from_fn(|j| &row(j)[2..]);
            for j in 0..GROUP_ROWS {
                dst[2 * j..2 * j + 2].copy_from_slice(&row(j)[..2]);
            }
            interleave_rows(rows, QK / 4, &mut dst[16..]);
        }
        GgmlType::Q4_0 | GgmlType::IQ4_NL | GgmlType::MXFP4 => {
            // The file's byte i holds values i and i + 16, which the layout puts in one
            // byte too (chunk i / 4, place 4j + i % 4): four bytes at a time.
            let at = if ty == GgmlType::MXFP4 { 1 } else { 2 };
            for j in 0..GROUP_ROWS {
                let src = row(j);
                let d = match ty {
                    GgmlType::MXFP4 => mxfp4_scale_f16(src).unwrap_or(0),
                    _ => u16::from_le_bytes([src[0], src[1]]),
                };
                dst[2 * j..2 * j + 2].copy_from_slice(&d.to_le_bytes());
            }
            interleave_rows(std::array::from_fn(|j| &row(j)[at..]), 4, &mut dst[16..]);
        }
        GgmlType::Q5_0 => {
            // ggml's block_q5_0: d, qh (bit i: value i's fifth bit), qs (byte i: values i and
            // i + 16, the nibbles as Q4_0 holds them, which the layout keeps). The fifth bits:
            // byte 4j + m of the stretch after the nibbles, bit k holding value 4k + m's.
            for j in 0..GROUP_ROWS {
                let src = row(j);
                dst[2 * j..2 * j + 2].copy_from_slice(&src[..2]);
                let qh = u32::from_le_bytes([src[2], src[3], src[4], src[5]]);
                dst[16 + 128 + 4 * j..][..4].copy_from_slice(&q5_0_fifth_bits(qh));
            }
            interleave_rows(std::array::from_fn(|j| &row(j)[6..]), 4, &mut dst[16..]);
        }
        _ => unreachable!("{ty:?} is not packed"),
    }
}

/// A Q5_0 block's fifth bits (`qh`, bit i for value i) in the layout's four bytes: byte `m`,
/// bit `k` holds value 4k + m's (bits m, m + 4, …, m + 28 of `qh` gathered).
#[inline(always)]
pub(super) fn q5_0_fifth_bits(qh: u32) -> [u8; 4] {
    std::array::from_fn(|m| {
        let y = (qh >> m) & 0x1111_1111;
        let y = (y | y >> 3) & 0x0303_0303;
        let y = (y | y >> 6) & 0x000F_000F;
        ((y | y >> 12) & 0xFF) as u8
    })
}

/// Unpacks one stored group into f32 scales (`8 * blocks`) and, but for Q8_0, 256 value bytes
/// per block in the kernels' order (chunk `k` at bytes `32k..32k+32` of the block): Q5_0's
/// five-bit values whole, Q4_0's nibbles, IQ4_NL's table values (signed bytes). Q8_0 values are
/// read where they are stored. (`x86::unpack_group` computes the same with AVX2.)
pub(crate) fn unpack_group_scalar(
    ty: GgmlType,
    blocks: usize,
    src: &[u8],
    scales: &mut [f32],
    values: &mut [u8],
) {
    if matches!(
        ty,
        GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::IQ4_XS
    ) {
        return; // read as stored
    }
    let gbb = group_block_bytes(ty);
    assert!(src.len() >= blocks * gbb && scales.len() >= 8 * blocks);
    assert!(ty == GgmlType::Q8_0 || values.len() >= 256 * blocks);
    for b in 0..blocks {
        let s = &src[b * gbb..(b + 1) * gbb];
        for j in 0..GROUP_ROWS {
            scales[8 * b + j] =
                half::f16::from_bits(u16::from_le_bytes([s[2 * j], s[2 * j + 1]])).to_f32();
        }
        match ty {
            GgmlType::Q8_0 => {}
            _ => {
                let v = &mut values[256 * b..256 * (b + 1)];
                for k in 0..8 {
                    for l in 0..32 {
                        let nib = (s[16 + 32 * (k % 4) + l] >> (4 * (k / 4))) & 0x0F;
                        v[32 * k + l] = match ty {
                            GgmlType::Q5_0 => nib | ((s[16 + 128 + l] >> k) & 1) << 4,
                            GgmlType::IQ4_NL => KVALUES_IQ4NL[nib as usize] as u8,
                            GgmlType::MXFP4 => KVALUES_MXFP4[nib as usize] as u8,
                            _ => nib,
                        };
                    }
                }
            }
        }
    }
}
