//! The activations' per-block numbers that the packed kernels read beside the quantized rows,
//! made once per product call.

use super::{q4_k, ACT_BLOCK, QK};
use crate::kernels::matmul::QuantizedActs;
use crate::quant::GgmlType;

/// Activations quantized for [`matmul_packed`](super::matmul_packed): the Q8_0 rows of [`QuantizedActs`], plus each
/// block's scale as f32 and 16 and 8 times the sum of its values (Q5_0 and Q4_0 weights are
/// kept unsigned, weight + 16 or + 8: the kernels take these offsets off their integer sums,
/// ready to subtract, which saves a multiply and a broadcast from a register per block and
/// token). For Q8_K rows, only [`Self::min_pairs`].
#[derive(Debug, Default)]
pub struct PackedActs {
    pub(super) scales: Vec<f32>,
    pub(super) offsets16: Vec<i32>,
    pub(super) offsets8: Vec<i32>,
    /// −128·Σx per block: the 512-bit kernels of the signed types (Q8_0, IQ4_NL, MXFP4) make
    /// their weights unsigned (w + 128), and start each block's sum from this.
    pub(super) neg_offsets128: Vec<i32>,
    /// Q8_K rows: per block, four i32 that each hold two sums of a sub-block of 32 as i16
    /// (sub-block 2p in the low half, 2p + 1 in the high), what the Q4_K and Q5_K mins
    /// multiply. Made once per product call ([`Self::prepare_q8_k`]), so that a kernel reads
    /// each pair with a broadcast rather than adding and shuffling the block's sums of 16 for
    /// every group of rows.
    pub(super) min_pairs: Vec<i32>,
}

impl PackedActs {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads the block scales and sums of `x` (Q8_0 rows).
    pub fn prepare(&mut self, x: &QuantizedActs) {
        assert_eq!(
            x.ty(),
            GgmlType::Q8_0,
            "PackedActs: activations must be Q8_0"
        );
        let nb = x.cols() / QK;
        let n = x.n_tokens() * nb;
        self.scales.clear();
        self.offsets16.clear();
        self.offsets8.clear();
        self.neg_offsets128.clear();
        self.scales.reserve(n);
        self.offsets16.reserve(n);
        self.offsets8.reserve(n);
        self.neg_offsets128.reserve(n);
        for t in 0..x.n_tokens() {
            for block in x.row(t).chunks_exact(ACT_BLOCK) {
                let d = half::f16::from_bits(u16::from_le_bytes([block[0], block[1]]));
                self.scales.push(d.to_f32());
                let sum: i32 = block[2..].iter().map(|&q| q as i8 as i32).sum();
                self.offsets16.push(16 * sum);
                self.offsets8.push(8 * sum);
                self.neg_offsets128.push(-128 * sum);
            }
        }
    }

    /// Reads the sub-blocks' sums of `x` (Q8_K rows) into [`Self::min_pairs`].
    pub(super) fn prepare_q8_k(&mut self, x: &QuantizedActs) {
        assert_eq!(
            x.ty(),
            GgmlType::Q8_K,
            "PackedActs: activations must be Q8_K"
        );
        self.min_pairs.clear();
        self.min_pairs.reserve(x.n_tokens() * x.cols() / 64);
        for t in 0..x.n_tokens() {
            for block in x.row(t).chunks_exact(q4_k::ACT_BLOCK) {
                // The block's sixteen i16 sums of 16 values, after its f32 d and 256 values.
                let sums: &[u8; 32] = block[260..].try_into().expect("a Q8_K block");
                let sum16 = |i: usize| i16::from_le_bytes([sums[2 * i], sums[2 * i + 1]]);
                // Two sums of 16 make a sub-block's; |sum| <= 32 * 127 fits in an i16.
                let sub = |j: usize| sum16(2 * j).wrapping_add(sum16(2 * j + 1)) as u16 as u32;
                self.min_pairs
                    .extend((0..4).map(|p| (sub(2 * p) | sub(2 * p + 1) << 16) as i32));
            }
        }
    }
}
