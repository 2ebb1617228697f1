//! The AMX tile path ([`super::amx`]): the same bits as the vector and scalar kernels for
//! every type it takes, with the tiles emulated (any AVX-512 machine) and, where the CPU has
//! AMX, with the instructions; and a token's outputs do not depend on the others in its
//! prompt, nor on whether they came alone (decode, vector kernels) or among many (tiles).

use super::lines::Lines;
use super::tests::{acts, matrix, packed, random_q4_k, random_q6_k, wide_q8_k_acts};
use super::tests_tiled::{random_iq4_xs, random_q5_k};
use super::*;
use crate::kernels::test_rng::Rng;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// One product of `w` by `x`: `how` 0 scalar, 1 vectors or hardware tiles (as chosen for
/// this CPU), 2 emulated tiles, 3 the hardware tiles where the CPU has AMX (vectors elsewhere).
fn product(
    w: &PackedMatrix,
    x: &QuantizedActs,
    acts: &PackedActs,
    chain: Chain,
    how: u8,
) -> Vec<f32> {
    let pool = ThreadPool::new(2);
    let mut y = vec![0f32; x.n_tokens() * w.rows()];
    matmul_packed_tiles(
        &pool,
        &mut [(w, &mut y)],
        x,
        acts,
        how != 0,
        chain,
        match how {
            2 => TileAsk::Emulated,
            3 => TileAsk::Hardware,
            _ => TileAsk::Auto,
        },
    );
    y
}

/// The rows of tokens `t` alone (one-token products: the decode kernels).
fn one_at_a_time(w: &PackedMatrix, x: &QuantizedActs, chain: Chain) -> Vec<f32> {
    let (nt, cols) = (x.n_tokens(), x.cols());
    let mut out = Vec::new();
    for t in 0..nt {
        let one = x.copy_row(t);
        let mut a = PackedActs::new();
        if one.ty() == GgmlType::Q8_0 {
            a.prepare(&one);
        }
        out.extend(product(w, &one, &a, chain, 1));
        assert_eq!(one.cols(), cols);
    }
    out
}

fn check(w: &PackedMatrix, x: &QuantizedActs, acts: &PackedActs, chain: Chain, what: &str) {
    let nt = x.n_tokens();
    assert_eq!(
        tile_use(w.ty(), nt, true, TileAsk::Emulated, Chain::Default),
        TileUse::Emulated,
        "{what}: the tiles must be what is tested"
    );
    let want = bits(&product(w, x, acts, chain, 0));
    assert_eq!(
        bits(&product(w, x, acts, chain, 2)),
        want,
        "{what}: emulated tiles"
    );
    assert_eq!(
        bits(&product(w, x, acts, chain, 1)),
        want,
        "{what}: this CPU's path"
    );
    assert_eq!(
        bits(&product(w, x, acts, chain, 3)),
        want,
        "{what}: the hardware tiles (where the CPU has AMX)"
    );
    assert_eq!(
        bits(&one_at_a_time(w, x, chain)),
        want,
        "{what}: one token at a time"
    );
}

const TOKENS: [usize; 5] = [5, 16, 17, 33, 40];

#[test]
fn tiles_have_the_vector_kernels_bits_for_32_value_blocks() {
    if crate::quant::simd_level() < crate::quant::SimdLevel::Avx512 {
        eprintln!("skipped: the tile folds need AVX-512");
        return;
    }
    let mut rng = Rng(41);
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_0,
        GgmlType::IQ4_NL,
        GgmlType::MXFP4,
    ] {
        // 32×8192: a row of two slices (`tile_slices`).
        for (rows, cols) in [(8, 32), (24, 96), (64, 896), (1000, 64), (32, 8192)] {
            let data = matrix(&mut rng, ty, rows, cols);
            let w = packed(ty, &data, rows, cols);
            for nt in TOKENS {
                let (x, a) = acts(&mut rng, nt, cols);
                check(
                    &w,
                    &x,
                    &a,
                    Chain::Default,
                    &format!("{ty:?} {rows}x{cols}, {nt} tokens"),
                );
            }
        }
    }
}

#[test]
fn tiles_have_the_vector_kernels_bits_for_q4_k_and_q6_k() {
    if crate::quant::simd_level() < crate::quant::SimdLevel::Avx512 {
        eprintln!("skipped: the tile folds need AVX-512");
        return;
    }
    let mut rng = Rng(42);
    let none = PackedActs::new();
    // 64×4864: rows of two slices (`tile_slices`).
    for (rows, cols) in [(8, 256), (24, 768), (64, 4864), (1000, 256)] {
        for nt in TOKENS {
            let x = wide_q8_k_acts(&mut rng, nt, cols);
            let ty = GgmlType::Q4_K;
            let data = random_q4_k(&mut rng, rows, cols);
            let w = packed(ty, &data, rows, cols);
            for chain in [Chain::Default, Chain::Q4kPairs] {
                check(
                    &w,
                    &x,
                    &none,
                    chain,
                    &format!("Q4_K {chain:?} {rows}x{cols}, {nt} tokens"),
                );
            }
            let ty = GgmlType::Q6_K;
            let data = random_q6_k(&mut rng, rows, cols);
            let w = packed(ty, &data, rows, cols);
            check(
                &w,
                &x,
                &none,
                Chain::Default,
                &format!("Q6_K {rows}x{cols}, {nt} tokens"),
            );
        }
    }
}

/// Q5_K (Q4_K's planes with the fifth bits, its own chain) and IQ4_XS (Q6_K's planes and chain,
/// the table's values times signed scales); both generators put every seventh block at the
/// extremes (Q5_K: values 31 under scales and mins of 63; IQ4_XS: −127 under −32, 4064).
#[test]
fn tiles_have_the_vector_kernels_bits_for_q5_k_and_iq4_xs() {
    if crate::quant::simd_level() < crate::quant::SimdLevel::Avx512 {
        eprintln!("skipped: the tile folds need AVX-512");
        return;
    }
    let mut rng = Rng(43);
    let none = PackedActs::new();
    // 32×4864: rows of two slices (`tile_slices`).
    for (rows, cols) in [(8, 256), (24, 768), (64, 2816), (1000, 256), (32, 4864)] {
        for nt in TOKENS {
            let x = wide_q8_k_acts(&mut rng, nt, cols);
            for (ty, random) in [
                (
                    GgmlType::Q5_K,
                    random_q5_k as fn(&mut Rng, usize, usize) -> Vec<u8>,
                ),
                (GgmlType::IQ4_XS, random_iq4_xs),
            ] {
                let w = packed(ty, &random(&mut rng, rows, cols), rows, cols);
                let what = format!("{ty:?} {rows}x{cols}, {nt} tokens");
                check(&w, &x, &none, Chain::Default, &what);
            }
        }
    }
}

/// The tiles take full-range values without saturating: weights and activations of −128 and
/// 127 (Q8_0), the largest Q6_K scales.
#[test]
fn tiles_take_extreme_values() {
    if crate::quant::simd_level() < crate::quant::SimdLevel::Avx512 {
        return;
    }
    let (rows, cols, nt) = (16, 256, 20);
    let mut data = vec![0u8; rows * cols / 32 * 34];
    for (i, b) in data.chunks_exact_mut(34).enumerate() {
        b[0..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        for (k, v) in b[2..].iter_mut().enumerate() {
            *v = if (i + k) % 3 == 0 { 0x80 } else { 0x7F };
        }
    }
    let w = packed(GgmlType::Q8_0, &data, rows, cols);
    let xf: Vec<f32> = (0..nt * cols)
        .map(|i| if i % 5 == 0 { -1.0 } else { 1.0 })
        .collect();
    let mut x = QuantizedActs::new();
    x.quantize(&xf, nt, cols, GgmlType::Q8_0);
    let mut a = PackedActs::new();
    a.prepare(&x);
    check(&w, &x, &a, Chain::Default, "Q8_0 at ±127/−128");
}

/// The two planes of the K-quant tiles hold the largest products: Q6_K's `sc·(q − 32)` of
/// 4096 (−128·−32) and −4064, Q4_K's 63·15, against activations of full range.
#[test]
fn tiles_take_extreme_k_quant_values() {
    if crate::quant::simd_level() < crate::quant::SimdLevel::Avx512 {
        return;
    }
    let (rows, cols, nt) = (16, 512, 20);
    let xf: Vec<f32> = (0..nt * cols)
        .map(|i| if i % 5 == 0 { -1.0 } else { 1.0 })
        .collect();
    let mut x = QuantizedActs::new();
    x.quantize(&xf, nt, cols, GgmlType::Q8_K);
    let none = PackedActs::new();
    let mut q6 = vec![0u8; rows * cols / 256 * 210];
    for (i, b) in q6.chunks_exact_mut(210).enumerate() {
        // q = 0 under scales of −128, or q = 63 under 127 and −128 alternating.
        let (bits, scales) = if i % 2 == 0 {
            (0x00, [0x80, 0x80])
        } else {
            (0xFF, [0x7F, 0x80])
        };
        b[..192].fill(bits);
        for (k, s) in b[192..208].iter_mut().enumerate() {
            *s = scales[k % 2];
        }
        b[208..210].copy_from_slice(&half::f16::from_f32(0.0003).to_le_bytes());
    }
    let w = packed(GgmlType::Q6_K, &q6, rows, cols);
    check(&w, &x, &none, Chain::Default, "Q6_K at its extremes");
    let mut q4 = vec![0u8; rows * cols / 256 * 144];
    for (i, b) in q4.chunks_exact_mut(144).enumerate() {
        b[0..2].copy_from_slice(&half::f16::from_f32(0.001).to_le_bytes());
        b[2..4].copy_from_slice(&half::f16::from_f32(0.0005).to_le_bytes());
        b[4..16].fill(0xFF); // every scale and min 63
        b[16..].fill(if i % 3 == 0 { 0x0F } else { 0xFF });
    }
    let w = packed(GgmlType::Q4_K, &q4, rows, cols);
    for chain in [Chain::Default, Chain::Q4kPairs] {
        check(
            &w,
            &x,
            &none,
            chain,
            &format!("Q4_K {chain:?} at its extremes"),
        );
    }
}

/// What `nucleus bench` reports: on this CPU, the tiles run exactly when the CPU lists
/// AMX-INT8 and the kernel grants the tile state (or are off by `NUCLEUS_AMX=0`).
#[test]
fn amx_is_used_only_where_the_cpu_has_it() {
    #[cfg(target_arch = "x86_64")]
    {
        let cpu_has = std::arch::x86_64::__cpuid_count(7, 0).edx & (1 << 25) != 0;
        if !cpu_has {
            assert!(!amx::uses_amx());
            assert!(amx::amx_refusal().is_some());
        }
        let on = if amx::uses_amx() {
            TileUse::Hardware
        } else {
            TileUse::No
        };
        let (pairs, one_fma) = (Chain::Q4kPairs, Chain::Default);
        for (ty, nt, chain, want) in [
            (GgmlType::Q6_K, 512, pairs, on),
            (GgmlType::Q8_0, 32, pairs, on),
            (GgmlType::Q4_K, 512, pairs, on),
            (GgmlType::Q4_K, 256, pairs, TileUse::No),
            (GgmlType::Q4_K, 64, one_fma, on),
            (GgmlType::Q4_K, 48, one_fma, TileUse::No),
            (GgmlType::Q5_K, 256, pairs, on),
            (GgmlType::Q5_K, 128, pairs, TileUse::No),
            (GgmlType::IQ4_XS, 128, pairs, on),
            (GgmlType::IQ4_XS, 64, pairs, TileUse::No),
            (GgmlType::Q8_0, 4, pairs, TileUse::No),
            (GgmlType::F16, 32, pairs, TileUse::No),
        ] {
            // `NUCLEUS_AMX=emulate` runs every typed product of a few tokens on emulated tiles,
            // whatever the thresholds (so that the tests reach the tile kernels).
            let want = if !amx::emulation_runs() {
                want
            } else if ty != GgmlType::F16 && nt >= choice::AMX_MIN_TOKENS {
                TileUse::Emulated
            } else {
                TileUse::No
            };
            let got = tile_use(ty, nt, true, TileAsk::Auto, chain);
            assert_eq!(got, want, "{ty:?} at {nt} tokens in {chain:?}");
        }
        // The tiles take Q4_K in the one-FMA chain, and decode follows them.
        let want = if amx::tiles_run() { one_fma } else { pairs };
        assert_eq!(Chain::fast(), want);
        eprintln!("AMX: {}", amx::amx_refusal().unwrap_or("on"));
    }
}

/// How long copying a work item's weights into the tiles' layout takes (`cargo test --release
/// -p nucleus --lib prep_speed -- --ignored --nocapture`): a cost paid once per item and
/// product, against the tiles' work for each 32 tokens.
#[test]
#[ignore = "a timing, not a check"]
fn prep_speed() {
    if crate::quant::simd_level() < crate::quant::SimdLevel::Avx512 {
        return;
    }
    let mut rng = Rng(7);
    let (rows, cols) = (32, 18944);
    let blocks = cols / 256;
    let mut item = amx::ItemWeights::default();
    let q4 = packed(
        GgmlType::Q4_K,
        &random_q4_k(&mut rng, rows, cols),
        rows,
        cols,
    );
    let groups: Vec<&[u8]> = (0..4).map(|g| q4.group(g)).collect();
    let reps = 1000;
    let t = std::time::Instant::now();
    for _ in 0..reps {
        item.q4_k(&groups, blocks);
    }
    let ns = t.elapsed().as_secs_f64() * 1e9 / (reps * rows * cols) as f64;
    eprintln!("Q4_K: {ns:.3} ns per weight");
    let q6 = packed(
        GgmlType::Q6_K,
        &random_q6_k(&mut rng, rows, cols),
        rows,
        cols,
    );
    let (sl, ul) = scratch_per_group(GgmlType::Q6_K, blocks);
    let (mut scales, mut values) = (vec![0f32; 4 * sl], vec![0u8; 4 * ul]);
    let (_, unpack) = kernels(GgmlType::Q6_K, true, Chain::Default);
    let t = std::time::Instant::now();
    for _ in 0..reps {
        let (mut s_rest, mut u_rest) = (&mut scales[..], &mut values[..]);
        let mut views = Vec::new();
        for g in 0..4 {
            let (s, s_next) = std::mem::take(&mut s_rest).split_at_mut(sl);
            let (u, u_next) = std::mem::take(&mut u_rest).split_at_mut(ul);
            (s_rest, u_rest) = (s_next, u_next);
            views.push(GroupView::new(
                GgmlType::Q6_K,
                blocks,
                q6.group(g),
                s,
                u,
                unpack,
            ));
        }
        let views: Vec<&GroupView> = views.iter().collect();
        item.q6_k(&views, blocks);
    }
    let ns = t.elapsed().as_secs_f64() * 1e9 / (reps * rows * cols) as f64;
    eprintln!("Q6_K (unpack and layout): {ns:.3} ns per weight");
}

/// Tiles that do nothing: the folds' cost alone ([`tile_costs`]).
struct Skip;

impl amx::Tiles for Skip {
    fn release(&mut self) {}
    unsafe fn configure(&mut self, _: [usize; 2], _: usize) {}
    unsafe fn products(&mut self, _: [*const u8; 2], _: usize, _: *const u8, _: *mut i32) {}
    unsafe fn planes(&mut self, _: [*const u8; 2], _: usize, _: *const u8, _: usize, _: *mut i32) {}
}

/// Where the K-quant tile kernels' time goes, on the hardware tiles (`cargo test --release -p
/// nucleus --lib tile_costs -- --ignored --nocapture`, a machine with AMX; elsewhere the folds
/// alone are timed, the AVX-512 instructions that AMX machines run after the tiles, and the
/// rest runs once on emulated tiles, untimed): G MAC/s of one thread for 32 tokens by a work
/// item's 32 rows, the whole kernel, its folds alone (tiles skipped) and its tile products
/// alone (folds skipped), with the operands hot (one item, one block of tokens, repeated), the
/// activations streaming (16 blocks of tokens: 512 tokens, as a prompt's product reads them)
/// and the weights streaming (16 items).
#[test]
#[ignore = "a timing, not a check"]
fn tile_costs() {
    if amx::uses_amx() {
        tile_costs_on(&mut amx::Hardware::new(), [5, 5]);
    } else if amx::avx512() {
        eprintln!("folds only, the rest emulated: {:?}", amx::amx_refusal());
        tile_costs_on(&mut amx::Emulated::default(), [0, 5]);
    }
}

/// `rounds`: of the whole kernel and the tiles alone, and of the folds alone (0: untimed).
fn tile_costs_on<T: amx::Tiles>(tiles: &mut T, [rounds, fold_rounds]: [usize; 2]) {
    let mut rng = Rng(11);
    for cols in [256, 1024, 3584, 18944] {
        let blocks = cols / 256;
        let q4 = packed(GgmlType::Q4_K, &random_q4_k(&mut rng, 512, cols), 512, cols);
        let q6 = packed(GgmlType::Q6_K, &random_q6_k(&mut rng, 512, cols), 512, cols);
        let x = wide_q8_k_acts(&mut rng, 512, cols);
        let (sl, ul) = scratch_per_group(GgmlType::Q6_K, blocks);
        let (mut scales, mut values) = (vec![0f32; sl], vec![0u8; ul]);
        let (_, unpack) = kernels(GgmlType::Q6_K, true, Chain::Default);
        // Per item, Q4_K's four groups and Q6_K's first (the others zeros: the same work).
        let items: Vec<[amx::ItemWeights; 2]> = (0..16)
            .map(|i| {
                let mut it: [amx::ItemWeights; 2] = Default::default();
                let groups: Vec<&[u8]> = (4 * i..4 * i + 4).map(|g| q4.group(g)).collect();
                it[0].q4_k(&groups, blocks);
                let (s, u) = (&mut scales[..], &mut values[..]);
                let v = GroupView::new(GgmlType::Q6_K, blocks, q6.group(4 * i), s, u, unpack);
                it[1].q6_k(&[&v], blocks);
                it
            })
            .collect();
        let mut out = vec![0f32; 32 * 32];
        let packed_x: Vec<Lines> = (0..16)
            .map(|chunk| {
                let mut lines = Lines::default();
                amx::pack_acts(&x, 32 * chunk, 32, 64, &mut lines);
                lines
            })
            .collect();
        let jobs: Vec<amx::Job> = (0..16)
            .map(|chunk| amx::Job {
                blocks,
                slice: 0..blocks,
                carry: std::ptr::null_mut(),
                m: 32,
                a: packed_x[chunk].as_ptr(),
                scales: std::ptr::null(),
                offsets: std::ptr::null(),
                out: out.as_mut_ptr(),
                out_stride: 32,
            })
            .collect();
        let macs = (32 * 32 * cols) as f64;
        let mut c = vec![0i32; 2048];
        for (ty, k) in [("Q4_K", 0), ("Q4_K pairs", 2), ("Q6_K", 1)] {
            let mut line = format!("{ty} {cols:5}:");
            for (what, kind) in [("whole", 0), ("folds", 1), ("tiles", 2)] {
                for (name, stream_x, stream_w) in [
                    ("hot", false, false),
                    ("x", true, false),
                    ("w", false, true),
                ] {
                    let mut call = |i: usize| {
                        let job = &jobs[if stream_x { i % 16 } else { 0 }];
                        let item = &items[if stream_w { i % 16 } else { 0 }][k % 2];
                        // SAFETY: the item holds `blocks` super-blocks of four groups; the job's
                        // 32 tokens are rows of x; out holds 32 × 32 floats; the tiles are the
                        // hardware only where AMX is granted.
                        unsafe {
                            match (kind, k) {
                                (0, 0) => amx::q4_k::<_, false>(tiles, item, job),
                                (0, 2) => amx::q4_k::<_, true>(tiles, item, job),
                                (0, _) => amx::q6_k(tiles, item, job),
                                (1, 0) => amx::q4_k::<_, false>(&mut Skip, item, job),
                                (1, 2) => amx::q4_k::<_, true>(&mut Skip, item, job),
                                (1, _) => amx::q6_k(&mut Skip, item, job),
                                (_, 2) => {
                                    tiles.configure(job.rows(), 64);
                                    for b in 0..4 * blocks {
                                        let a = job.a_tiles(b, 64);
                                        let w = item.b.as_ptr().add(2048 * b + 14336 * (b / 4));
                                        tiles.pair_planes(a, 64, w, c.as_mut_ptr());
                                    }
                                }
                                _ => {
                                    tiles.configure(job.rows(), 64);
                                    for b in 0..blocks {
                                        let a = job.a_tiles(4 * b, 64);
                                        let w = item.b.as_ptr().add(16384 * b);
                                        tiles.planes(a, 64, w, 4, c.as_mut_ptr());
                                    }
                                }
                            }
                        }
                    };
                    let rounds = if kind == 1 { fold_rounds } else { rounds };
                    if rounds == 0 {
                        call(0);
                        call(17);
                        continue;
                    }
                    let reps = 64;
                    let mut best = f64::INFINITY;
                    for _ in 0..rounds {
                        let t = std::time::Instant::now();
                        for i in 0..reps {
                            call(i);
                        }
                        best = best.min(t.elapsed().as_secs_f64() / reps as f64);
                    }
                    line += &format!(" {what}/{name} {:.0}", macs / best / 1e9);
                }
            }
            eprintln!("{line}");
        }
        tiles.release();
    }
}
