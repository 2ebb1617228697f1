//! The reference kernels: the arithmetic of the module doc written out per output. The SIMD
//! kernels compute these bits.

use super::{GroupView, Tile, GROUP_ROWS, QK};

/// Q5_0 groups (unsigned five-bit values, offset 16).
///
/// # Safety
/// As [`super::TileFn`].
pub(crate) unsafe fn tile_u5(group: &GroupView, tile: &Tile) {
    unsafe { tile_scalar::<16>(group, tile) }
}

/// Q4_0 groups (unsigned four-bit values, offset 8).
///
/// # Safety
/// As [`super::TileFn`].
pub(crate) unsafe fn tile_u4(group: &GroupView, tile: &Tile) {
    unsafe { tile_scalar::<8>(group, tile) }
}

/// Q8_0 and IQ4_NL groups (signed bytes).
///
/// # Safety
/// As [`super::TileFn`].
pub(crate) unsafe fn tile_i8(group: &GroupView, tile: &Tile) {
    unsafe { tile_scalar::<0>(group, tile) }
}

/// `BIAS` 0: signed values; otherwise unsigned ones, weight + `BIAS`, whose integer sum loses
/// the block's offset (`BIAS` times the activations' sum).
unsafe fn tile_scalar<const BIAS: i32>(group: &GroupView, t: &Tile) {
    let blocks = t.blocks;
    for n in 0..t.nx {
        // SAFETY: the caller guarantees token n's activation row (`blocks` Q8_0 blocks of 34
        // bytes), its `blocks` scales and offsets, and 8 output floats.
        let (x, scales, offsets, out) = unsafe {
            (
                std::slice::from_raw_parts(t.x.add(n * t.x_stride), blocks * 34),
                std::slice::from_raw_parts(t.scales.add(n * blocks), blocks),
                std::slice::from_raw_parts(t.offsets.add(n * blocks), blocks),
                std::slice::from_raw_parts_mut(t.out.add(n * t.out_stride), GROUP_ROWS),
            )
        };
        let mut acc = [0f32; GROUP_ROWS];
        for b in 0..blocks {
            let xq = &x[34 * b + 2..34 * b + 2 + QK];
            let v = &group.values[group.stride * b..group.stride * b + 256];
            for (j, a) in acc.iter_mut().enumerate() {
                let mut isum = 0i32;
                for (i, &xi) in xq.iter().enumerate() {
                    let w = v[32 * (i / 4) + 4 * j + i % 4];
                    let w = if BIAS > 0 { w as i32 } else { w as i8 as i32 };
                    isum += w * xi as i8 as i32;
                }
                if BIAS > 0 {
                    isum -= offsets[b];
                }
                let d = group.scales[GROUP_ROWS * b + j] * scales[b];
                *a = d.mul_add(isum as f32, *a);
            }
        }
        out.copy_from_slice(&acc);
    }
}

/// Bytes of a Q8_K activation block: f32 d, 256 values, 16 i16 sums of 16.
const Q8_K_BLOCK: usize = 292;

/// The frame of the K-quant reference kernels read as stored: for each token of `t` and each
/// super-block of the group (`group_block` bytes), `row(g, xb, r, acc)` folds row `r` of the
/// group's super-block `g` against the token's Q8_K block `xb` into `acc`, the row's output.
///
/// # Safety
/// As [`super::TileFn`], the activations being Q8_K rows of `t.blocks` super-blocks.
pub(super) unsafe fn k_quant_tiles(
    group: &GroupView,
    t: &Tile,
    group_block: usize,
    row: impl Fn(&[u8], &[u8], usize, &mut f32),
) {
    for n in 0..t.nx {
        // SAFETY: the caller guarantees token n's activation row and 8 output floats.
        let (x, out) = unsafe {
            (
                std::slice::from_raw_parts(t.x.add(n * t.x_stride), t.blocks * Q8_K_BLOCK),
                std::slice::from_raw_parts_mut(t.out.add(n * t.out_stride), GROUP_ROWS),
            )
        };
        let mut acc = [0f32; GROUP_ROWS];
        for b in 0..t.blocks {
            let g = &group.values[group.stride * b..][..group_block];
            let xb = &x[Q8_K_BLOCK * b..][..Q8_K_BLOCK];
            for (r, acc) in acc.iter_mut().enumerate() {
                row(g, xb, r, acc);
            }
        }
        out.copy_from_slice(&acc);
    }
}
