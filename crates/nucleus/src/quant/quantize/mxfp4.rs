//! MXFP4 as ggml writes it (`quantize_row_mxfp4_ref`, which llama-quantize's `MXFP4_MOE` mix
//! uses for the expert tensors): per block of 32, the shared exponent from the largest
//! magnitude, `e = floor(log2(amax)) − 2 + 127` (0 for a block of zeros), then each value the
//! nearest of the E2M1 table (doubled, [`KVALUES_MXFP4`]) times half the scale, the first
//! index on a tie; value `j` in the low nibble of byte `j`, value `j + 16` in its high nibble.

use crate::quant::blocks_low_bit::e8m0_to_f32_half;
use crate::quant::KVALUES_MXFP4;

/// The index of the table value nearest `x / d` (strictly nearer replaces: the first wins).
fn best_index(x: f32, d: f32) -> u8 {
    let mut best = 0;
    let mut best_err = (KVALUES_MXFP4[0] as f32 * d - x).abs();
    for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
        let err = (k as f32 * d - x).abs();
        if err < best_err {
            best = i;
            best_err = err;
        }
    }
    best as u8
}

/// One block: 32 values to 17 bytes.
pub(super) fn quantize_block_mxfp4(x: &[f32], y: &mut [u8]) {
    let amax = x
        .iter()
        .fold(0f32, |m, v| if m < v.abs() { v.abs() } else { m });
    // C converts the float to uint8_t through a 32-bit integer (x86's cvttss2si): the low byte.
    let e = if amax > 0.0 {
        (amax.log2().floor() as i32 - 2 + 127) as u8
    } else {
        0
    };
    let d = e8m0_to_f32_half(e);
    y[0] = e;
    for j in 0..16 {
        y[1 + j] = best_index(x[j], d) | best_index(x[16 + j], d) << 4;
    }
}
