//! Run-time choice of the dot-product kernels, made once per process.

use std::sync::OnceLock;

use super::types::GgmlType;

/// One dot kernel: `out[k] = dot(w, x + k * x_stride)` for `k < nx`.
///
/// # Safety
/// `w` is readable for `row_bytes(n)` of the weight type; `x + k * x_stride` is readable for
/// `row_bytes(n)` of the vec_dot type for every `k < nx`; `out` is writable for `nx` floats;
/// `1 <= nx <= 4`; `n` is a whole number of blocks; and the CPU has the features the kernel was
/// compiled for (guaranteed by only placing a kernel in a table after detection).
pub(crate) type DotFn =
    unsafe fn(n: usize, w: *const u8, x: *const u8, x_stride: usize, nx: usize, out: *mut f32);

/// SIMD instruction-set levels, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL (256-bit kernels with EVEX encodings and 32 registers).
    Avx512,
    /// AVX-512 with VNNI (`vpdpbusd` for the 8-bit products).
    Avx512Vnni,
}

impl SimdLevel {
    /// The name `nucleus bench` reports and `NUCLEUS_SIMD` takes (`avx512` for both AVX-512
    /// levels: the environment caps, the CPU decides).
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
            SimdLevel::Avx512Vnni => "avx512-vnni",
        }
    }
}

/// Whether prompts' products run on AMX tiles here, or why not (the CPU does not list
/// AMX-INT8, the kernel refused the tile state, `NUCLEUS_AMX=0`), as `nucleus bench` reports it.
pub fn amx_status() -> &'static str {
    crate::kernels::interleaved::amx_refusal().unwrap_or("on (prompts' products on tiles)")
}

pub(crate) struct Kernels {
    #[allow(dead_code)]
    pub level: SimdLevel,
    /// Indexed by [`slot`].
    pub dots: [DotFn; 16],
    /// Q6_K with the float arithmetic of ggml's tiled kernel, which llama.cpp uses for Q6_K
    /// matrices once a batch has 8 or more rows (a prompt): each super-block's integer sum s,
    /// then acc = acc + (s·d)·dy. The default Q6_K kernel follows `ggml_vec_dot_q6_K_q8_K`,
    /// which it uses for fewer rows (decode).
    pub q6_k_batched: DotFn,
    /// Q4_0 with the arithmetic of ggml's repacked Q4_0 kernels, which llama.cpp uses on AVX2
    /// and AVX-512 CPUs for every Q4_0 matrix whose row count is a multiple of 8: each block's
    /// integer sum, then one FMA with dw·dx.
    pub q4_0_block_sums: DotFn,
    /// Q4_K with the arithmetic of ggml's repacked Q4_K gemm, which llama.cpp uses for a
    /// prompt's rows in groups of four (the rest, and decode, go through the gemv, which is the
    /// default Q4_K kernel here): one FMA per pair of sub-blocks.
    pub q4_k_gemm: DotFn,
    /// F16 as llama.cpp's sgemm computes batches of two or more rows (16-lane accumulator).
    pub f16_sgemm: DotFn,
    /// BF16 as llama.cpp's sgemm computes batches of two or more rows.
    pub bf16_sgemm: DotFn,
    /// F32 as llama.cpp's sgemm computes batches of two or more rows (16-lane accumulator).
    pub f32_sgemm: DotFn,
    /// Q4_K as ggml's `vec_dot_q4_K_q8_K`, for the one-row products of a Q4_K matrix llama.cpp
    /// does not repack (its row count is not a multiple of 8).
    pub q4_k_vec_dot: DotFn,
    /// Q4_K and Q5_K as llama.cpp's tiled kernel computes a prompt of 8 or more rows (Q4_K: of a
    /// matrix it does not repack): per block (isum·d − dmin·imin), then one FMA with dy.
    pub q4_k_tiled: DotFn,
    pub q5_k_tiled: DotFn,
    /// Q2_K as llama.cpp's AVX-512 build computes a matrix with a multiple of 8 rows, which it
    /// repacks: one row through its gemv (one FMA per block for the sums, one for the mins),
    /// a prompt's rows in groups of four through its gemm (one FMA pair per 128 values).
    pub q2_k_block_sums: DotFn,
    pub q2_k_gemm: DotFn,
    /// Q2_K (not repacked), Q3_K and IQ4_XS as llama.cpp's tiled kernel computes a prompt of
    /// 8 or more rows.
    pub q2_k_tiled: DotFn,
    pub q3_k_tiled: DotFn,
    pub iq4_xs_tiled: DotFn,
    /// IQ4_NL as llama.cpp's repacked kernels compute a matrix with a multiple of 8 rows (every
    /// row of it): each block's integer sum, then one FMA with dw·dx.
    pub iq4_nl_block_sums: DotFn,
    /// MXFP4 as llama.cpp's repacked kernels compute a matrix with a multiple of 8 rows.
    pub mxfp4_block_sums: DotFn,
}

/// Index of a computable weight type in a kernel table.
pub(crate) fn slot(ty: GgmlType) -> usize {
    use GgmlType::*;
    match ty {
        F32 => 0,
        F16 => 1,
        BF16 => 2,
        Q4_0 => 3,
        Q4_1 => 4,
        Q5_0 => 5,
        Q5_1 => 6,
        Q8_0 => 7,
        Q4_K => 8,
        Q5_K => 9,
        Q6_K => 10,
        Q2_K => 11,
        Q3_K => 12,
        IQ4_NL => 13,
        IQ4_XS => 14,
        MXFP4 => 15,
        _ => panic!("no dot kernel for {ty}: not a computable weight type"),
    }
}

impl Kernels {
    pub fn vec_dot_nx(
        &self,
        ty: GgmlType,
        w: &[u8],
        x: &[u8],
        x_stride: usize,
        n: usize,
        out: &mut [f32],
    ) {
        let nx = out.len();
        assert!(
            (1..=4).contains(&nx),
            "vec_dot_nx: 1..=4 activation rows, got {nx}"
        );
        let wb = ty
            .row_bytes(n)
            .expect("vec_dot: n is not a whole number of blocks");
        let xb = super::vec_dot_type(ty)
            .row_bytes(n)
            .expect("vec_dot: bad n");
        assert_eq!(
            w.len(),
            wb,
            "vec_dot: weight row has {} bytes, expected {wb}",
            w.len()
        );
        let need = (nx - 1) * x_stride + xb;
        assert!(
            x.len() >= need,
            "vec_dot: activations have {} bytes, need {need}",
            x.len()
        );
        assert!(
            nx == 1 || x_stride >= xb,
            "vec_dot: activation rows overlap"
        );
        let f = self.dots[slot(ty)];
        // SAFETY: lengths were checked just above (weight row exactly `wb` bytes, every
        // activation row inside `x`, `nx` outputs), and the table only holds kernels whose
        // CPU features were detected (see `kernels_for`).
        unsafe { f(n, w.as_ptr(), x.as_ptr(), x_stride, nx, out.as_mut_ptr()) }
    }

    /// The raw kernel for `ty` (callers uphold [`DotFn`]'s contract).
    #[inline]
    pub fn dot_fn(&self, ty: GgmlType) -> DotFn {
        self.dots[slot(ty)]
    }
}

static SCALAR: Kernels = Kernels {
    level: SimdLevel::Scalar,
    dots: super::scalar::DOTS,
    q6_k_batched: super::scalar::Q6_K_BATCHED,
    q4_0_block_sums: super::scalar::Q4_0_BLOCK_SUMS,
    q4_k_gemm: super::scalar::Q4_K_GEMM,
    f16_sgemm: super::scalar::F16_SGEMM,
    bf16_sgemm: super::scalar::BF16_SGEMM,
    f32_sgemm: super::scalar::F32_SGEMM,
    q4_k_vec_dot: super::scalar::Q4_K_VEC_DOT,
    q4_k_tiled: super::scalar::Q4_K_TILED,
    q5_k_tiled: super::scalar::Q5_K_TILED,
    q2_k_block_sums: super::scalar_low_bit::Q2_K_BLOCK_SUMS,
    q2_k_gemm: super::scalar_low_bit::Q2_K_GEMM,
    q2_k_tiled: super::scalar_low_bit::Q2_K_TILED,
    q3_k_tiled: super::scalar_low_bit::Q3_K_TILED,
    iq4_xs_tiled: super::scalar_low_bit::IQ4_XS_TILED,
    iq4_nl_block_sums: super::scalar_low_bit::IQ4_NL_BLOCK_SUMS,
    mxfp4_block_sums: super::scalar_low_bit::MXFP4_BLOCK_SUMS,
};

fn detect() -> SimdLevel {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        let avx512 = avx2
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl");
        let vnni = avx512 && is_x86_feature_detected!("avx512vnni");
        if vnni {
            SimdLevel::Avx512Vnni
        } else if avx512 {
            SimdLevel::Avx512
        } else if avx2 {
            SimdLevel::Avx2
        } else {
            SimdLevel::Scalar
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        SimdLevel::Scalar
    }
}

fn hw_level() -> SimdLevel {
    static HW: OnceLock<SimdLevel> = OnceLock::new();
    *HW.get_or_init(detect)
}

/// The SIMD level the kernels use: the best this CPU has, capped by `NUCLEUS_SIMD`
/// (`scalar`, `avx2`, `avx512`) when set. Decided once per process.
pub fn simd_level() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let hw = hw_level();
        let cap = match std::env::var("NUCLEUS_SIMD").ok().as_deref().map(str::trim) {
            Some("scalar") => SimdLevel::Scalar,
            Some("avx2") => SimdLevel::Avx2,
            Some("avx512") => SimdLevel::Avx512Vnni,
            _ => SimdLevel::Avx512Vnni,
        };
        hw.min(cap)
    })
}

/// Every level this CPU can run, lowest first.
pub fn available_levels() -> Vec<SimdLevel> {
    let hw = hw_level();
    [
        SimdLevel::Scalar,
        SimdLevel::Avx2,
        SimdLevel::Avx512,
        SimdLevel::Avx512Vnni,
    ]
    .into_iter()
    .filter(|l| *l <= hw)
    .collect()
}

/// The kernel table for `level`, or `None` when this CPU lacks it.
pub(crate) fn kernels_for(level: SimdLevel) -> Option<&'static Kernels> {
    if level > hw_level() {
        return None;
    }
    match level {
        SimdLevel::Scalar => Some(&SCALAR),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => Some(&super::x86::AVX2),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => Some(&super::x86::AVX512),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni => Some(&super::x86::AVX512VNNI),
        #[cfg(not(target_arch = "x86_64"))]
        _ => None,
    }
}

/// The kernel table chosen for this process ([`simd_level`]).
pub(crate) fn kernels() -> &'static Kernels {
    static K: OnceLock<&'static Kernels> = OnceLock::new();
    K.get_or_init(|| kernels_for(simd_level()).unwrap_or(&SCALAR))
}
