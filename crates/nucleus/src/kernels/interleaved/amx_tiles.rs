//! The AMX tile registers as the kernels of [`super::amx`] use them: [`Hardware`] issues the
//! instructions, [`Emulated`] computes the same sums in plain code (the tests, and
//! `NUCLEUS_AMX=emulate`).

use std::arch::asm;

use super::amx::{uses_amx, TILE_M};

/// The bytes from a K-quant unit's high plane to its low plane: four steps of two B tiles.
pub(crate) const PLANE_BYTES: usize = 8192;
/// The bytes from a step's A tiles to the next's in the packed activations (rows of 64).
const A_STEP: usize = super::amx_layout::a_step(64);

/// The tile registers: A (activations) `tmm0`, `tmm1`; B (weights) `tmm2`, `tmm3`; C (sums)
/// `tmm4 + 2a + h` for A tile `a` and B tile `h`.
///
/// # Safety
/// Every method: [`Tiles::configure`] ran on this thread first, and the pointers are valid for
/// the bytes the configured shapes read or write.
pub(crate) trait Tiles {
    /// A tile `a`: `m[a]` rows (tokens) of `k` bytes (`m[1]` may be 0: one A tile); B: `k / 4`
    /// rows of 64 bytes; C: `m[a]` rows of 16 i32.
    unsafe fn configure(&mut self, m: [usize; 2], k: usize);
    /// Every C = A·B: A tile `a` from `a[a]` (rows `a_stride` bytes apart), B tile `h` from
    /// `b + 16·k·h` (contiguous), C tile (a, h) stored to `c + 256·(2a + h)` (rows of 64 bytes).
    unsafe fn products(&mut self, a: [*const u8; 2], a_stride: usize, b: *const u8, c: *mut i32);
    /// Two planes of weights ([`super::amx_layout`]), `k` = 64: for plane `p`, every C =
    /// Σ over `steps` (at most four) of A·B, A tile `a` from `a[a] + A_STEP·s` (the packed
    /// activations' steps), B tile `h` from
    /// `b + PLANE_BYTES·p + 2048·s + 1024·h`, C tile (a, h) stored to
    /// `c + 1024·p + 256·(2a + h)`.
    unsafe fn planes(
        &mut self,
        a: [*const u8; 2],
        a_stride: usize,
        b: *const u8,
        steps: usize,
        c: *mut i32,
    );
    /// Gives the tile registers back when a thread's tile work ends; the next use configures
    /// them afresh.
    fn release(&mut self);
    /// [`Tiles::planes`] with one step (Q4_K's pairs of sub-blocks): the same sums.
    unsafe fn pair_planes(
        &mut self,
        a: [*const u8; 2],
        a_stride: usize,
        b: *const u8,
        c: *mut i32,
    ) {
        // SAFETY: the caller's contract.
        unsafe { self.planes(a, a_stride, b, 1, c) }
    }
}

/// The AMX instructions. Only where [`uses_amx`] (the tile state granted to this process).
pub(crate) struct Hardware {
    k: usize,
    two: bool,
    /// The shapes (`m`, `k`) this thread's tiles were last configured with by this value:
    /// `ldtilecfg` runs only when they change (it cost 13 % of the Q4_K kernel's time, one a
    /// job, in a profile of the 7B shape's prompt). `None` until the first configuration and
    /// after [`Tiles::release`].
    loaded: Option<([usize; 2], usize)>,
}

impl Hardware {
    pub(crate) fn new() -> Self {
        Hardware {
            k: 0,
            two: false,
            loaded: None,
        }
    }
}

impl Tiles for Hardware {
    fn release(&mut self) {
        self.loaded = None;
        release();
    }

    unsafe fn configure(&mut self, m: [usize; 2], k: usize) {
        (self.k, self.two) = (k, m[1] > 0);
        if self.loaded == Some((m, k)) {
            return;
        }
        self.loaded = Some((m, k));
        // Palette 1; bytes 16.. the bytes per row of tmm0..15 (u16), 48.. their rows.
        let mut cfg = [0u8; 64];
        cfg[0] = 1;
        let shapes = [
            (m[0], k),
            (m[1], k),
            (k / 4, 64),
            (k / 4, 64),
            (m[0], 64),
            (m[0], 64),
            (m[1], 64),
            (m[1], 64),
        ];
        for (t, &(rows, colsb)) in shapes.iter().enumerate() {
            let colsb = if rows == 0 { 0 } else { colsb };
            cfg[16 + 2 * t..18 + 2 * t].copy_from_slice(&(colsb as u16).to_le_bytes());
            cfg[48 + t] = rows as u8;
        }
        // SAFETY: the config is 64 valid bytes; shapes within the tile limits (m <= 16 rows,
        // k <= 64 bytes), the caller's contract.
        unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.as_ptr(), options(nostack, readonly)) };
    }

    #[inline(always)]
    unsafe fn products(&mut self, a: [*const u8; 2], a_stride: usize, b: *const u8, c: *mut i32) {
        let b1 = b.wrapping_add(16 * self.k);
        // SAFETY: the caller's contract (rows of A and B readable, C writable).
        unsafe {
            if self.two {
                asm!(
                    "tileloadd tmm2, [{b0} + {s64} * 1]",
                    "tileloadd tmm3, [{b1} + {s64} * 1]",
                    "tileloadd tmm0, [{a0} + {sa} * 1]",
                    "tileloadd tmm1, [{a1} + {sa} * 1]",
                    "tilezero tmm4",
                    "tilezero tmm5",
                    "tilezero tmm6",
                    "tilezero tmm7",
                    "tdpbssd tmm4, tmm0, tmm2",
                    "tdpbssd tmm5, tmm0, tmm3",
                    "tdpbssd tmm6, tmm1, tmm2",
                    "tdpbssd tmm7, tmm1, tmm3",
                    "tilestored [{c} + {s64} * 1], tmm4",
                    "tilestored [{c1} + {s64} * 1], tmm5",
                    "tilestored [{c2} + {s64} * 1], tmm6",
                    "tilestored [{c3} + {s64} * 1], tmm7",
                    a0 = in(reg) a[0], a1 = in(reg) a[1], sa = in(reg) a_stride,
                    b0 = in(reg) b, b1 = in(reg) b1, s64 = in(reg) 64usize,
                    c = in(reg) c, c1 = in(reg) c.add(256), c2 = in(reg) c.add(512),
                    c3 = in(reg) c.add(768),
                    options(nostack)
                );
            } else {
                asm!(
                    "tileloadd tmm2, [{b0} + {s64} * 1]",
                    "tileloadd tmm3, [{b1} + {s64} * 1]",
                    "tileloadd tmm0, [{a0} + {sa} * 1]",
                    "tilezero tmm4",
                    "tilezero tmm5",
                    "tdpbssd tmm4, tmm0, tmm2",
                    "tdpbssd tmm5, tmm0, tmm3",
                    "tilestored [{c} + {s64} * 1], tmm4",
                    "tilestored [{c1} + {s64} * 1], tmm5",
                    a0 = in(reg) a[0], sa = in(reg) a_stride,
                    b0 = in(reg) b, b1 = in(reg) b1, s64 = in(reg) 64usize,
                    c = in(reg) c, c1 = in(reg) c.add(256),
                    options(nostack)
                );
            }
        }
    }

    /// The A tiles loaded once for both planes, then per plane and B
    /// tile two products, their C tiles alternating between two sets (tmm4 and tmm6, tmm5
    /// and tmm7: the configured shapes) so that one set's stores overlap the next products;
    /// with one step per plane, zeroing, adding and storing the same four C tiles serialized
    /// the stores and the products (`tile_costs`).
    #[inline(always)]
    unsafe fn pair_planes(&mut self, a: [*const u8; 2], sa: usize, b: *const u8, c: *mut i32) {
        debug_assert!(self.k == 64);
        // SAFETY (every block): the caller's contract (rows of A and B readable, C writable).
        unsafe {
            if self.two {
                asm!(
                    "tileloadd tmm0, [{a0} + {sa} * 1]",
                    "tileloadd tmm1, [{a1} + {sa} * 1]",
                    a0 = in(reg) a[0], a1 = in(reg) a[1], sa = in(reg) sa,
                    options(nostack)
                );
                for (p, h) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                    let bt = b.add(PLANE_BYTES * p + 1024 * h);
                    let (c0, c1) = (c.add(1024 * p + 256 * h), c.add(1024 * p + 512 + 256 * h));
                    if h == 0 {
                        asm!(
                            "tileloadd tmm2, [{bt} + {s64} * 1]",
                            "tilezero tmm4",
                            "tilezero tmm6",
                            "tdpbssd tmm4, tmm0, tmm2",
                            "tdpbssd tmm6, tmm1, tmm2",
                            "tilestored [{c0} + {s64} * 1], tmm4",
                            "tilestored [{c1} + {s64} * 1], tmm6",
                            bt = in(reg) bt, c0 = in(reg) c0, c1 = in(reg) c1,
                            s64 = in(reg) 64usize,
                            options(nostack)
                        );
                    } else {
                        asm!(
                            "tileloadd tmm3, [{bt} + {s64} * 1]",
                            "tilezero tmm5",
                            "tilezero tmm7",
                            "tdpbssd tmm5, tmm0, tmm3",
                            "tdpbssd tmm7, tmm1, tmm3",
                            "tilestored [{c0} + {s64} * 1], tmm5",
                            "tilestored [{c1} + {s64} * 1], tmm7",
                            bt = in(reg) bt, c0 = in(reg) c0, c1 = in(reg) c1,
                            s64 = in(reg) 64usize,
                            options(nostack)
                        );
                    }
                }
            } else {
                asm!(
                    "tileloadd tmm0, [{a0} + {sa} * 1]",
                    a0 = in(reg) a[0], sa = in(reg) sa,
                    options(nostack)
                );
                for (p, h) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                    let bt = b.add(PLANE_BYTES * p + 1024 * h);
                    let c0 = c.add(1024 * p + 256 * h);
                    if h == 0 {
                        asm!(
                            "tileloadd tmm2, [{bt} + {s64} * 1]",
                            "tilezero tmm4",
                            "tdpbssd tmm4, tmm0, tmm2",
                            "tilestored [{c0} + {s64} * 1], tmm4",
                            bt = in(reg) bt, c0 = in(reg) c0, s64 = in(reg) 64usize,
                            options(nostack)
                        );
                    } else {
                        asm!(
                            "tileloadd tmm3, [{bt} + {s64} * 1]",
                            "tilezero tmm5",
                            "tdpbssd tmm5, tmm0, tmm3",
                            "tilestored [{c0} + {s64} * 1], tmm5",
                            bt = in(reg) bt, c0 = in(reg) c0, s64 = in(reg) 64usize,
                            options(nostack)
                        );
                    }
                }
            }
        }
    }

    unsafe fn planes(
        &mut self,
        a: [*const u8; 2],
        sa: usize,
        b: *const u8,
        steps: usize,
        c: *mut i32,
    ) {
        debug_assert!(self.k == 64 && steps <= 4);
        // SAFETY: the caller's contract, plane by plane.
        unsafe {
            self.plane(a, sa, b, steps, c);
            self.plane(a, sa, b.add(PLANE_BYTES), steps, c.add(1024));
        }
    }
}

impl Hardware {
    /// [`Tiles::planes`] for one plane: C zeroed, `steps` products added, C stored at `c`.
    #[inline(always)]
    unsafe fn plane(&self, a: [*const u8; 2], sa: usize, b: *const u8, steps: usize, c: *mut i32) {
        // SAFETY (every block): the caller's contract (rows of A and B readable, C writable).
        unsafe {
            // Only configured tiles: with one A tile, tmm6 and tmm7 have no rows, and touching
            // them faults.
            asm!("tilezero tmm4", "tilezero tmm5", options(nostack, nomem));
            if self.two {
                asm!("tilezero tmm6", "tilezero tmm7", options(nostack, nomem));
            }
            for s in 0..steps {
                let (b0, a0) = (b.add(2048 * s), a[0].wrapping_add(A_STEP * s));
                if self.two {
                    asm!(
                        "tileloadd tmm2, [{b0} + {s64} * 1]",
                        "tileloadd tmm3, [{b1} + {s64} * 1]",
                        "tileloadd tmm0, [{a0} + {sa} * 1]",
                        "tileloadd tmm1, [{a1} + {sa} * 1]",
                        "tdpbssd tmm4, tmm0, tmm2",
                        "tdpbssd tmm5, tmm0, tmm3",
                        "tdpbssd tmm6, tmm1, tmm2",
                        "tdpbssd tmm7, tmm1, tmm3",
                        a0 = in(reg) a0, a1 = in(reg) a[1].wrapping_add(A_STEP * s), sa = in(reg) sa,
                        b0 = in(reg) b0, b1 = in(reg) b0.add(1024), s64 = in(reg) 64usize,
                        options(nostack)
                    );
                } else {
                    asm!(
                        "tileloadd tmm2, [{b0} + {s64} * 1]",
                        "tileloadd tmm3, [{b1} + {s64} * 1]",
                        "tileloadd tmm0, [{a0} + {sa} * 1]",
                        "tdpbssd tmm4, tmm0, tmm2",
                        "tdpbssd tmm5, tmm0, tmm3",
                        a0 = in(reg) a0, sa = in(reg) sa,
                        b0 = in(reg) b0, b1 = in(reg) b0.add(1024), s64 = in(reg) 64usize,
                        options(nostack)
                    );
                }
            }
            asm!(
                "tilestored [{c} + {s64} * 1], tmm4",
                "tilestored [{c1} + {s64} * 1], tmm5",
                c = in(reg) c, c1 = in(reg) c.add(256), s64 = in(reg) 64usize,
                options(nostack)
            );
            if self.two {
                asm!(
                    "tilestored [{c2} + {s64} * 1], tmm6",
                    "tilestored [{c3} + {s64} * 1], tmm7",
                    c2 = in(reg) c.add(512), c3 = in(reg) c.add(768), s64 = in(reg) 64usize,
                    options(nostack)
                );
            }
        }
    }
}

/// Gives the tile registers back (their state no longer saved on context switches).
pub(crate) fn release() {
    if uses_amx() {
        // SAFETY: `tilerelease` only resets the tile state, which this process may use.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// The same sums in plain code, for the tests and `NUCLEUS_AMX=emulate`.
#[derive(Default)]
pub(crate) struct Emulated {
    m: [usize; 2],
    k: usize,
}

impl Tiles for Emulated {
    fn release(&mut self) {}

    unsafe fn configure(&mut self, m: [usize; 2], k: usize) {
        assert!((1..=TILE_M).contains(&m[0]) && m[1] <= TILE_M && [32, 64].contains(&k));
        (self.m, self.k) = (m, k);
    }

    unsafe fn planes(
        &mut self,
        a: [*const u8; 2],
        sa: usize,
        b: *const u8,
        steps: usize,
        c: *mut i32,
    ) {
        assert!(self.k == 64 && steps <= 4);
        let mut sums = [0i32; 1024];
        for p in 0..2 {
            sums.fill(0);
            for s in 0..steps {
                let mut one = [0i32; 1024];
                let a = a.map(|a| a.wrapping_add(A_STEP * s));
                // SAFETY: the caller's contract, step by step.
                unsafe {
                    self.products(a, sa, b.add(PLANE_BYTES * p + 2048 * s), one.as_mut_ptr())
                };
                for (sum, v) in sums.iter_mut().zip(one) {
                    *sum += v;
                }
            }
            // SAFETY: the caller's contract: 1024 sums per plane at c.
            unsafe { std::ptr::copy_nonoverlapping(sums.as_ptr(), c.add(1024 * p), 1024) };
        }
    }

    unsafe fn products(&mut self, a: [*const u8; 2], a_stride: usize, b: *const u8, c: *mut i32) {
        for (ta, &rows) in self.m.iter().enumerate() {
            for h in 0..2 {
                for i in 0..rows {
                    for n in 0..16 {
                        let mut sum = 0i32;
                        for kk in 0..self.k {
                            // SAFETY: the caller's contract.
                            let (x, w) = unsafe {
                                (
                                    *a[ta].add(i * a_stride + kk) as i8,
                                    *b.add(16 * self.k * h + 64 * (kk / 4) + 4 * n + kk % 4) as i8,
                                )
                            };
                            sum += x as i32 * w as i32;
                        }
                        // SAFETY: the caller's contract.
                        unsafe { *c.add(256 * (2 * ta + h) + 16 * i + n) = sum };
                    }
                }
            }
        }
    }
}
