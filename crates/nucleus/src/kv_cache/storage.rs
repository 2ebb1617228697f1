//! The bytes of the cache: for every layer a K and a V plane laid out
//! `[block][kv_head][slot][row]`, each row one head's key or value in the cache's
//! [`KvType`]: f16 (the default, as llama.cpp's), or Q8_0/Q4_0 blocks of 32 values
//! (`--kv-type`, llama.cpp's `-ctk/-ctv`), which attention reads directly, row by row.

use std::fmt;
use std::str::FromStr;

use half::f16;

use crate::quant::{dequantize_row, quantize_row, quantize_row_act, GgmlType};

/// How keys and values are stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvType {
    #[default]
    F16,
    Q8_0,
    Q4_0,
}

impl KvType {
    pub fn ggml(self) -> GgmlType {
        match self {
            KvType::F16 => GgmlType::F16,
            KvType::Q8_0 => GgmlType::Q8_0,
            KvType::Q4_0 => GgmlType::Q4_0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    /// Bytes of one row of `dim` values (`dim` a multiple of 32 for the block types).
    pub fn row_bytes(self, dim: usize) -> usize {
        self.ggml()
            .row_bytes(dim)
            .expect("head dimension checked by KvConfig::check")
    }

    /// Whether rows of `dim` values can be stored.
    pub fn fits(self, dim: usize) -> bool {
        self.ggml().row_bytes(dim).is_some()
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            "q4_0" => Ok(KvType::Q4_0),
            _ => Err(format!(
                "unknown KV cache type {s:?} (expected f16, q8_0 or q4_0)"
            )),
        }
    }
}

/// One layer's keys or values.
pub(super) enum Plane {
    F16(Vec<f16>),
    /// Rows of quantized blocks.
    Blocks(Vec<u8>),
}

impl Plane {
    /// A plane of `rows` rows of `dim` values.
    pub fn new(ty: KvType, rows: usize, dim: usize) -> Plane {
        match ty {
            KvType::F16 => Plane::F16(vec![f16::ZERO; rows * dim]),
            _ => Plane::Blocks(vec![0u8; rows * ty.row_bytes(dim)]),
        }
    }

    /// Bytes the plane takes.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        match self {
            Plane::F16(v) => 2 * v.len(),
            Plane::Blocks(v) => v.len(),
        }
    }

    /// Stores `src` as row `row` (rows of `src.len()` values), converted as llama.cpp's CPU
    /// backend converts f32 into the type when it copies into its cache (`from_float`: the
    /// x86 Q8_0 quantizer, the reference Q4_0 one).
    pub fn write_row(&mut self, ty: KvType, row: usize, src: &[f32]) {
        let dim = src.len();
        match self {
            Plane::F16(v) => {
                for (d, s) in v[row * dim..(row + 1) * dim].iter_mut().zip(src) {
                    *d = f16::from_f32(*s);
                }
            }
            Plane::Blocks(v) => {
                let rb = ty.row_bytes(dim);
                let dst = &mut v[row * rb..(row + 1) * rb];
                match ty {
                    KvType::Q8_0 => quantize_row_act(GgmlType::Q8_0, src, dst),
                    _ => quantize_row(ty.ggml(), src, dst),
                }
            }
        }
    }

    /// Row `row` (of `dst.len()` values) as f32.
    pub fn read_row(&self, ty: KvType, row: usize, dst: &mut [f32]) {
        let dim = dst.len();
        match self {
            Plane::F16(v) => {
                for (d, s) in dst.iter_mut().zip(&v[row * dim..(row + 1) * dim]) {
                    *d = s.to_f32();
                }
            }
            Plane::Blocks(v) => {
                let rb = ty.row_bytes(dim);
                dequantize_row(ty.ggml(), &v[row * rb..(row + 1) * rb], dst);
            }
        }
    }

    /// Rows `[from, from + n)` of `dim` values as f16 (an f16 plane only).
    pub fn f16_rows(&self, from: usize, n: usize, dim: usize) -> &[f16] {
        match self {
            Plane::F16(v) => &v[from * dim..(from + n) * dim],
            Plane::Blocks(_) => panic!("f16 rows of a quantized KV cache"),
        }
    }

    /// The bytes of row `row` of `dim` values (a quantized plane only).
    pub fn block_row(&self, ty: KvType, row: usize, dim: usize) -> &[u8] {
        match self {
            Plane::Blocks(v) => {
                let rb = ty.row_bytes(dim);
                &v[row * rb..(row + 1) * rb]
            }
            Plane::F16(_) => panic!("quantized rows of an f16 KV cache"),
        }
    }

    /// Copies rows `[from, from + n)` over rows `[to, to + n)` (rows of `dim` values).
    pub fn copy_rows(&mut self, ty: KvType, from: usize, to: usize, n: usize, dim: usize) {
        match self {
            Plane::F16(v) => v.copy_within(from * dim..(from + n) * dim, to * dim),
            Plane::Blocks(v) => {
                let rb = ty.row_bytes(dim);
                v.copy_within(from * rb..(from + n) * rb, to * rb)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_unknown_ones_are_errors() {
        for t in [KvType::F16, KvType::Q8_0, KvType::Q4_0] {
            assert_eq!(t.name().parse::<KvType>(), Ok(t));
        }
        let e = "q5_k".parse::<KvType>().unwrap_err();
        assert!(e.contains("q5_k") && e.contains("q8_0"), "{e}");
        assert_eq!(KvType::Q8_0.row_bytes(64), 68);
        assert_eq!(KvType::Q4_0.row_bytes(256), 144);
        assert!(!KvType::Q8_0.fits(48) && KvType::F16.fits(48));
    }

    /// A row written and read back is within the format's rounding: half a step of the
    /// block's scale for Q8_0 (amax / 127), a step for Q4_0 (amax / 8), f16's for f16.
    #[test]
    fn rows_round_trip_within_the_format_error() {
        let src: Vec<f32> = (0..64)
            .map(|i| ((i * 29 % 64) as f32 * 0.21).sin() * 3.0)
            .collect();
        // Q4_0 maps the block onto [-8, 7] steps of amax / 8: the far end can be off by a step.
        for (ty, step) in [
            (KvType::F16, 0.0),
            (KvType::Q8_0, 0.5 / 127.0),
            (KvType::Q4_0, 1.0 / 8.0),
        ] {
            let mut p = Plane::new(ty, 3, 64);
            p.write_row(ty, 1, &src);
            let mut back = vec![0f32; 64];
            p.read_row(ty, 1, &mut back);
            for (blk, (a, b)) in src.chunks(32).zip(back.chunks(32)).enumerate() {
                let amax = a.iter().fold(0f32, |m, x| m.max(x.abs()));
                let tol = if ty == KvType::F16 {
                    amax / 1024.0
                } else {
                    amax * step * 1.01 + 1e-3
                };
                for (x, y) in a.iter().zip(b) {
                    assert!((x - y).abs() <= tol, "{ty} block {blk}: {x} -> {y}");
                }
            }
            // The other rows are untouched.
            p.read_row(ty, 0, &mut back);
            assert!(back.iter().all(|&x| x == 0.0));
        }
    }
}
