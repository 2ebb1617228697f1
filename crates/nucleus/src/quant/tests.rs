#![allow(clippy::needless_range_loop)]
use super::blocks::f32_to_f16;
use super::dispatch::{kernels_for, DotFn, Kernels};
use super::*;
use GgmlType::*;

pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545F4914F6CDD1D)
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn byte(&mut self) -> u8 {
        (self.next_u64() >> 56) as u8
    }
}

pub(crate) const COMPUTABLE: [GgmlType; 16] = [
    F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS,
    MXFP4,
];

pub(super) fn put_f16(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
}

/// Byte offsets of the f16 scale fields (d, then dmin) in a block of the formats
/// [`random_row`] fills with random bits.
pub(super) fn scale_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        Q2_K => &[80, 82],
        Q3_K => &[108],
        IQ4_NL | IQ4_XS => &[0],
        _ => &[],
    }
}

/// A random weight row of `n` elements of type `ty` (quantized from random floats where we have
/// a quantizer, random bits with sane scales for the K- and I-quants).
pub(crate) fn random_row(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; ty.row_bytes(n).unwrap()];
    match ty {
        Q2_K | Q3_K | IQ4_NL | IQ4_XS => {
            out.iter_mut().for_each(|b| *b = rng.byte());
            for blk in out.chunks_exact_mut(ty.block_layout().1) {
                for &at in scale_fields(ty) {
                    put_f16(blk, at, 0.001 + 0.01 * rng.f32().abs());
                }
            }
        }
        MXFP4 => {
            // Random nibbles; exponents around 2^-7 (weights of about 0.05), as gpt-oss's.
            out.iter_mut().for_each(|b| *b = rng.byte());
            for blk in out.chunks_exact_mut(17) {
                blk[0] = 118 + rng.byte() % 8;
            }
        }
        Q4_K | Q5_K | Q6_K => {
            for b in out.iter_mut() {
                *b = rng.byte();
            }
            let bs = ty.block_layout().1;
            for blk in out.chunks_exact_mut(bs) {
                if ty == Q6_K {
                    put_f16(blk, 208, 0.002 + 0.01 * rng.f32().abs());
                } else {
                    put_f16(blk, 0, 0.002 + 0.01 * rng.f32().abs());
                    put_f16(blk, 2, 0.001 + 0.01 * rng.f32().abs());
                }
            }
        }
        _ => {
            let x: Vec<f32> = (0..n).map(|_| rng.f32() * 2.0).collect();
            quantize_row(ty, &x, &mut out);
        }
    }
    out
}

pub(crate) fn random_acts(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let x: Vec<f32> = (0..n).map(|_| rng.f32() * 3.0).collect();
    let mut out = vec![0u8; ty.row_bytes(n).unwrap()];
    quantize_row_act(ty, &x, &mut out);
    out
}

pub(super) fn deq(ty: GgmlType, b: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_row(ty, b, &mut y);
    y
}

// ---------------------------------------------------------------------------------------------
// Known values from hand-built blocks.

#[test]
fn dequant_q4_0_known() {
    let mut b = [0u8; 18];
    put_f16(&mut b, 0, 0.5);
    for j in 0..16 {
        b[2 + j] = (j as u8) | ((15 - j as u8) << 4);
    }
    let y = deq(Q4_0, &b, 32);
    for j in 0..16 {
        assert_eq!(y[j], 0.5 * (j as f32 - 8.0));
        assert_eq!(y[j + 16], 0.5 * (15.0 - j as f32 - 8.0));
    }
}

#[test]
fn dequant_q4_1_known() {
    let mut b = [0u8; 20];
    put_f16(&mut b, 0, 0.25);
    put_f16(&mut b, 2, -1.0);
    for j in 0..16 {
        b[4 + j] = (j as u8) | (3 << 4);
    }
    let y = deq(Q4_1, &b, 32);
    for j in 0..16 {
        assert_eq!(y[j], 0.25 * j as f32 - 1.0);
        assert_eq!(y[j + 16], 0.25 * 3.0 - 1.0);
    }
}

#[test]
fn dequant_q5_known() {
    // qh bit j set for even j: element j gets +16.
    let qh: u32 = 0x5555_5555;
    let mut b = [0u8; 22];
    put_f16(&mut b, 0, 2.0);
    b[2..6].copy_from_slice(&qh.to_le_bytes());
    for j in 0..16 {
        b[6 + j] = 0x7 | (0x9 << 4);
    }
    let y = deq(Q5_0, &b, 32);
    for (e, &v) in y.iter().enumerate() {
        let nib = if e < 16 { 7 } else { 9 };
        let h = if e % 2 == 0 { 16 } else { 0 };
        assert_eq!(v, 2.0 * ((nib + h) as f32 - 16.0), "element {e}");
    }
    let mut b1 = [0u8; 24];
    put_f16(&mut b1, 0, 2.0);
    put_f16(&mut b1, 2, 0.5);
    b1[4..8].copy_from_slice(&qh.to_le_bytes());
    b1[8..24].copy_from_slice(&b[6..22]);
    let y = deq(Q5_1, &b1, 32);
    for (e, &v) in y.iter().enumerate() {
        let nib = if e < 16 { 7 } else { 9 };
        let h = if e % 2 == 0 { 16 } else { 0 };
        assert_eq!(v, 2.0 * (nib + h) as f32 + 0.5, "element {e}");
    }
}

#[test]
fn dequant_q8_0_known() {
    let mut b = [0u8; 34];
    put_f16(&mut b, 0, 0.125);
    for j in 0..32 {
        b[2 + j] = (j as i8 - 16) as u8;
    }
    let y = deq(Q8_0, &b, 32);
    for j in 0..32 {
        assert_eq!(y[j], 0.125 * (j as f32 - 16.0));
    }
}

/// Packs 8 six-bit scales and mins the way ggml's Q4_K/Q5_K store them.
fn pack_k4_scales(sc: [u8; 8], mn: [u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4);
    }
    q
}

#[test]
fn dequant_q4_k_q5_k_known() {
    let sc = [1u8, 5, 17, 33, 63, 40, 2, 20];
    let mn = [0u8, 3, 9, 63, 31, 16, 48, 7];
    let packed = pack_k4_scales(sc, mn);
    let (d, dmin) = (0.5f32, 0.25f32);
    let mut b = [0u8; 144];
    put_f16(&mut b, 0, d);
    put_f16(&mut b, 2, dmin);
    b[4..16].copy_from_slice(&packed);
    for l in 0..128 {
        b[16 + l] = ((l % 16) as u8) | (((l * 7 % 16) as u8) << 4);
    }
    let y = deq(Q4_K, &b, 256);
    for e in 0..256 {
        let (j, r) = (e / 64, e % 64);
        let byte = b[16 + 32 * j + r % 32];
        let (q, sub) = if r < 32 {
            (byte & 0xF, 2 * j)
        } else {
            (byte >> 4, 2 * j + 1)
        };
        let want = d * sc[sub] as f32 * q as f32 - dmin * mn[sub] as f32;
        assert_eq!(y[e], want, "Q4_K element {e}");
    }
    // Q5_K: same scales, qh byte l has bits set in a pattern.
    let mut b5 = [0u8; 176];
    b5[0..16].copy_from_slice(&b[0..16]);
    for l in 0..32 {
        b5[16 + l] = (l as u8).wrapping_mul(37);
    }
    b5[48..176].copy_from_slice(&b[16..144]);
    let y = deq(Q5_K, &b5, 256);
    for e in 0..256 {
        let (j, r) = (e / 64, e % 64);
        let l = r % 32;
        let byte = b5[48 + 32 * j + l];
        let (q, sub) = if r < 32 {
            (byte & 0xF, 2 * j)
        } else {
            (byte >> 4, 2 * j + 1)
        };
        let h = (b5[16 + l] >> sub) & 1;
        let q = q as u32 + 16 * h as u32;
        let want = d * sc[sub] as f32 * q as f32 - dmin * mn[sub] as f32;
        assert_eq!(y[e], want, "Q5_K element {e}");
    }
}

#[test]
fn dequant_q6_k_known() {
    // Build from explicit 6-bit values q[e] (0..64) and 16 scales.
    let q: Vec<u8> = (0..256).map(|e| ((e * 13 + 5) % 64) as u8).collect();
    let scales: [i8; 16] = [
        1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12, 13, -14, 127, -128,
    ];
    let d = 0.0625f32;
    let mut b = [0u8; 210];
    for h in 0..2 {
        for l in 0..32 {
            let e = 128 * h;
            let (a, bb, c, dd) = (q[e + l], q[e + l + 32], q[e + l + 64], q[e + l + 96]);
            b[64 * h + l] = (a & 0xF) | ((c & 0xF) << 4);
            b[64 * h + l + 32] = (bb & 0xF) | ((dd & 0xF) << 4);
            b[128 + 32 * h + l] = (a >> 4) | ((bb >> 4) << 2) | ((c >> 4) << 4) | ((dd >> 4) << 6);
        }
    }
    for (i, s) in scales.iter().enumerate() {
        b[192 + i] = *s as u8;
    }
    put_f16(&mut b, 208, d);
    let y = deq(Q6_K, &b, 256);
    for e in 0..256 {
        // Element e belongs to 16-element group e / 16.
        let want = d * scales[e / 16] as f32 * (q[e] as f32 - 32.0);
        assert_eq!(y[e], want, "Q6_K element {e}");
    }
}

#[test]
fn float_roundtrips() {
    let x = [1.0f32, -2.5, 65504.0, 1e-8, 3.140625, -0.0];
    let mut b = vec![0u8; 12];
    quantize_row(F16, &x, &mut b);
    let y = deq(F16, &b, 6);
    assert_eq!(
        &y[..5],
        &[
            1.0,
            -2.5,
            65504.0,
            half::f16::from_f32(1e-8).to_f32(),
            3.140625
        ]
    );
    quantize_row(BF16, &x, &mut b);
    let y = deq(BF16, &b, 6);
    assert_eq!(y[0], 1.0);
    assert_eq!(y[1], -2.5);
    assert_eq!(y[4], 3.140625);
    // bf16 round to nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 → 1.
    let mut b2 = [0u8; 2];
    quantize_row(BF16, &[1.0 + 1.0 / 256.0], &mut b2);
    assert_eq!(deq(BF16, &b2, 1)[0], 1.0);
}

// ---------------------------------------------------------------------------------------------
// SIMD kernels against the scalar reference: the same bits.

/// Picks one kernel from a table.
pub(super) type Pick<'a> = &'a dyn Fn(&Kernels) -> DotFn;

/// Runs `kernel`, a kernel for weight type `ty`, on `out.len()` activation rows `stride` bytes
/// apart, after checking the lengths its [`DotFn`] contract asks for.
pub(super) fn run_kernel(
    kernel: DotFn,
    ty: GgmlType,
    w: &[u8],
    acts: &[u8],
    stride: usize,
    n: usize,
    out: &mut [f32],
) {
    let nx = out.len();
    let xb = vec_dot_type(ty).row_bytes(n).unwrap();
    assert!((1..=4).contains(&nx));
    assert_eq!(w.len(), ty.row_bytes(n).unwrap());
    assert!(stride >= xb && acts.len() >= (nx - 1) * stride + xb);
    // SAFETY: the lengths were checked just above, and `kernels_for` only hands out tables
    // whose CPU features were detected.
    unsafe { kernel(n, w.as_ptr(), acts.as_ptr(), stride, nx, out.as_mut_ptr()) }
}

/// Checks that the kernel `pick` takes from a table computes the scalar table's bits at every
/// level this CPU has, for 1..=4 activation rows, on the weight row `w` (type `ty`, `n`
/// elements) and four random activation rows.
pub(super) fn check_exact(name: &str, ty: GgmlType, pick: Pick, w: &[u8], n: usize) {
    let mut rng = Rng::new(n as u64 ^ ((w.len() as u64) << 32));
    let vt = vec_dot_type(ty);
    let xb = vt.row_bytes(n).unwrap();
    let stride = xb + 5; // odd stride: rows are not aligned
    let mut acts = vec![0u8; stride * 4];
    for k in 0..4 {
        let a = random_acts(&mut rng, vt, n);
        acts[k * stride..k * stride + xb].copy_from_slice(&a);
    }
    check_exact_acts(name, ty, pick, w, &acts, stride, n);
}

/// [`check_exact`] with given activation rows.
pub(super) fn check_exact_acts(
    name: &str,
    ty: GgmlType,
    pick: Pick,
    w: &[u8],
    acts: &[u8],
    stride: usize,
    n: usize,
) {
    let scalar = pick(kernels_for(SimdLevel::Scalar).unwrap());
    let mut want = [0f32; 4];
    run_kernel(scalar, ty, w, acts, stride, n, &mut want);
    for level in available_levels() {
        let kernel = pick(kernels_for(level).unwrap());
        for nx in 1..=4 {
            let mut got = [0f32; 4];
            run_kernel(kernel, ty, w, acts, stride, n, &mut got[..nx]);
            for k in 0..nx {
                assert_eq!(
                    got[k].to_bits(),
                    want[k].to_bits(),
                    "{name} ({ty}) n={n} {level:?} nx={nx} k={k}: {} vs scalar {}",
                    got[k],
                    want[k]
                );
            }
        }
    }
}

/// Row lengths to test for weight type `ty` whose length must be a multiple of `multiple`.
pub(super) fn test_sizes(ty: GgmlType, multiple: usize) -> Vec<usize> {
    let bs = ty
        .block_size()
        .max(vec_dot_type(ty).block_size())
        .max(multiple);
    if bs == 1 {
        vec![1, 7, 8, 15, 16, 24, 33, 64, 100, 896, 4864]
    } else {
        [1, 2, 3, 4, 5, 7, 12, 19].map(|b| b * bs).to_vec()
    }
}

#[test]
fn simd_matches_scalar() {
    let mut rng = Rng::new(3);
    eprintln!("testing levels {:?}", available_levels());
    for &ty in &COMPUTABLE {
        for n in test_sizes(ty, 1) {
            let w = random_row(&mut rng, ty, n);
            check_exact("dot", ty, &|k| k.dot_fn(ty), &w, n);
        }
    }
}

/// The kernels for a prompt's rows (not reachable through `vec_dot_nx`) give the same bits at
/// every level too.
#[test]
fn simd_matches_scalar_batched_kernels() {
    let mut rng = Rng::new(4);
    let cases: [(&str, GgmlType, usize, Pick); 9] = [
        ("q6_k_batched", Q6_K, 1, &|k| k.q6_k_batched),
        ("q4_0_block_sums", Q4_0, 1, &|k| k.q4_0_block_sums),
        ("q4_k_gemm", Q4_K, 1, &|k| k.q4_k_gemm),
        ("f16_sgemm", F16, 16, &|k| k.f16_sgemm),
        ("bf16_sgemm", BF16, 32, &|k| k.bf16_sgemm),
        ("f32_sgemm", F32, 16, &|k| k.f32_sgemm),
        ("q4_k_vec_dot", Q4_K, 1, &|k| k.q4_k_vec_dot),
        ("q4_k_tiled", Q4_K, 1, &|k| k.q4_k_tiled),
        ("q5_k_tiled", Q5_K, 1, &|k| k.q5_k_tiled),
    ];
    for (name, ty, multiple, pick) in cases {
        for n in test_sizes(ty, multiple) {
            let w = random_row(&mut rng, ty, n);
            check_exact(name, ty, pick, &w, n);
        }
    }
}

/// BF16 dots over tiny values: denormal inputs, products and sums, which `vdpbf16ps` flushes
/// to zero, and which the scalar emulation must flush at the same places as the SIMD one.
#[test]
fn simd_matches_scalar_bf16_denormals() {
    let mut rng = Rng::new(6);
    // Random signs and mantissas, exponents 0..=80 (values below 2^-46, products from normal
    // down to far below the denormals), every few values a denormal or a zero.
    let mut row = |n: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                let r = rng.next_u64();
                let exp = if r.is_multiple_of(5) {
                    0
                } else {
                    (r >> 8) % 81
                } as u16;
                let bits = ((r >> 32) as u16 & 0x807f) | (exp << 7);
                bits.to_le_bytes()
            })
            .collect()
    };
    for n in [32, 64, 96, 100, 128, 200, 320, 4864] {
        let w = row(n);
        let stride = 2 * n + 3;
        let mut acts = vec![0u8; 4 * stride];
        for k in 0..4 {
            acts[k * stride..k * stride + 2 * n].copy_from_slice(&row(n));
        }
        check_exact_acts("dot", BF16, &|k| k.dot_fn(BF16), &w, &acts, stride, n);
        if n.is_multiple_of(32) {
            check_exact_acts("bf16_sgemm", BF16, &|k| k.bf16_sgemm, &w, &acts, stride, n);
        }
    }
}

/// The other arithmetic of each K-quant (llama.cpp's other kernels for it) computes the same
/// dot product, to rounding.
#[test]
fn k_quant_kernel_variants_agree() {
    let mut rng = Rng::new(8);
    let scalar = kernels_for(SimdLevel::Scalar).expect("the scalar kernels are always there");
    let cases: [(GgmlType, Pick); 5] = [
        (Q4_K, &|k| k.q4_k_vec_dot),
        (Q4_K, &|k| k.q4_k_tiled),
        (Q4_K, &|k| k.q4_k_gemm),
        (Q5_K, &|k| k.q5_k_tiled),
        (Q6_K, &|k| k.q6_k_batched),
    ];
    for (ty, pick) in cases {
        let n = 1024;
        let w = random_row(&mut rng, ty, n);
        let x = random_acts(&mut rng, vec_dot_type(ty), n);
        let want = vec_dot(ty, &w, &x, n);
        let mut got = [0f32];
        // SAFETY: `w` and `x` are whole rows of `n` values of their types; one output.
        unsafe { pick(scalar)(n, w.as_ptr(), x.as_ptr(), x.len(), 1, got.as_mut_ptr()) };
        assert!(
            (got[0] - want).abs() <= want.abs() * 1e-5 + 1e-4,
            "{ty}: {} vs {want}",
            got[0]
        );
    }
}

#[test]
fn scalar_dot_matches_dequantized() {
    let mut rng = Rng::new(5);
    for &ty in &COMPUTABLE {
        let vt = vec_dot_type(ty);
        let n = 512;
        let w = random_row(&mut rng, ty, n);
        let a = random_acts(&mut rng, vt, n);
        let wd = deq(ty, &w, n);
        let xd = deq(vt, &a, n);
        let exact: f64 = wd.iter().zip(&xd).map(|(a, b)| *a as f64 * *b as f64).sum();
        let mag: f64 = wd
            .iter()
            .zip(&xd)
            .map(|(a, b)| (*a as f64 * *b as f64).abs())
            .sum();
        let got = vec_dot(ty, &w, &a, n) as f64;
        // Q4_1/Q5_1 use s = f16(d·Σq) for the min term.
        let rel = if matches!(ty, Q4_1 | Q5_1) {
            2e-3
        } else {
            1e-5
        };
        assert!(
            (got - exact).abs() <= rel * mag + 1e-6,
            "{ty}: {got} vs {exact}"
        );
    }
}
