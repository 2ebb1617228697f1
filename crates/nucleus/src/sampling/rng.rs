//! A small seeded PRNG (xoshiro256**, seeded through SplitMix64).
//!
//! Written by hand rather than taken from a crate so that "same seed, same settings, same text"
//! holds across dependency upgrades: the stream of numbers is fixed by this file alone.

/// xoshiro256** by Blackman and Vigna: 256 bits of state, period 2^256 - 1, passes BigCrush.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

/// SplitMix64 step: used to spread a 64-bit seed over the 256-bit state (never all zero).
fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let s = [
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
        ];
        Rng { s }
    }

    /// Stream `stream` of `seed`: the generator seeded with `seed` and then jumped `stream`
    /// times by 2^128 steps ([`jump`](Self::jump)). Stream 0 is [`Rng::new`]`(seed)`; the
    /// streams of one seed are non-overlapping stretches of one sequence (each 2^128 numbers
    /// long), and different seeds start at unrelated points of the 2^256 − 1 period. Choice
    /// `i` of a request with a seed draws from stream `i`, so requests with neighbouring seeds
    /// share no samples (they did when choice `i` used seed `seed + i`).
    pub fn for_stream(seed: u64, stream: u64) -> Self {
        let mut r = Rng::new(seed);
        for _ in 0..stream {
            r.jump();
        }
        r
    }

    /// Advances the state by 2^128 steps: the published jump polynomial of xoshiro256
    /// (Blackman and Vigna's reference `jump()`).
    pub fn jump(&mut self) {
        const JUMP: [u64; 4] = [
            0x180e_c6d3_3cfd_0aba,
            0xd5a6_1266_f0c9_392c,
            0xa958_2618_e03f_c9aa,
            0x39ab_dc45_29b1_661c,
        ];
        let mut acc = [0u64; 4];
        for word in JUMP {
            for bit in 0..64 {
                if word & (1u64 << bit) != 0 {
                    for (a, s) in acc.iter_mut().zip(&self.s) {
                        *a ^= s;
                    }
                }
                self.next_u64();
            }
        }
        self.s = acc;
    }

    /// A seed from the clock and an address, for `seed: None` (not reproducible by design).
    pub fn from_entropy() -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let local = 0u8;
        let addr = &local as *const u8 as u64;
        Rng::new(t ^ addr.rotate_left(32))
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        let mut c = Rng::new(43);
        let va: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let vb: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        let vc: Vec<u64> = (0..8).map(|_| c.next_u64()).collect();
        assert_eq!(va, vb);
        assert_ne!(va, vc);
    }

    // xoshiro256** seeded by SplitMix64(0), checked against an independent implementation
    // of the reference algorithm. If this changes, seeded generations change.
    const GOLDEN: [u64; 3] = [
        11_091_344_671_253_066_420,
        13_793_997_310_169_335_082,
        1_900_383_378_846_508_768,
    ];

    #[test]
    fn known_first_outputs() {
        // Pin the stream: if this changes, seeded generations change; bump it only on purpose.
        let mut r = Rng::new(0);
        let first: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        assert_eq!(first, GOLDEN);
        // SplitMix64(0) first output is a published constant.
        let mut x = 0u64;
        assert_eq!(splitmix64(&mut x), 0xE220_A839_7B1D_CDAF);
    }

    type State = [u64; 4];

    /// One step of the state (the output is dropped).
    fn step(s: State) -> State {
        let mut r = Rng { s };
        r.next_u64();
        r.s
    }

    /// `m` is a 256×256 matrix over GF(2) stored as its columns (column j = image of bit j).
    fn apply(m: &[State], v: &State) -> State {
        let mut out = [0u64; 4];
        for (j, col) in m.iter().enumerate() {
            if v[j / 64] >> (j % 64) & 1 == 1 {
                for (o, c) in out.iter_mut().zip(col) {
                    *o ^= c;
                }
            }
        }
        out
    }

    fn square(m: &[State]) -> Vec<State> {
        m.iter().map(|c| apply(m, c)).collect()
    }

    /// The transition T of xoshiro256 (linear over GF(2)), built from `next_u64` itself.
    fn transition() -> Vec<State> {
        (0..256)
            .map(|j| {
                let mut e = [0u64; 4];
                e[j / 64] = 1u64 << (j % 64);
                step(e)
            })
            .collect()
    }

    /// `jump()` is T^(2^128), computed independently of the published jump polynomial by
    /// squaring the transition matrix 128 times (checked first against 1,024 plain steps).
    #[test]
    fn jump_is_two_to_the_128_steps() {
        let mut m = transition();
        for _ in 0..10 {
            m = square(&m);
        }
        let start = Rng::new(5).s;
        let mut stepped = start;
        for _ in 0..1024 {
            stepped = step(stepped);
        }
        assert_eq!(apply(&m, &start), stepped);
        for _ in 10..128 {
            m = square(&m);
        }
        for seed in [0u64, 1, 42, u64::MAX] {
            let mut r = Rng::new(seed);
            let want = apply(&m, &r.s);
            r.jump();
            assert_eq!(r.s, want, "seed {seed}");
        }
    }

    /// The jump against an independent implementation of the same generator (the
    /// `rand_xoshiro` crate), from the same state.
    #[test]
    fn jump_matches_an_independent_implementation() {
        use rand_xoshiro::rand_core::{Rng as _, SeedableRng};
        let mut ours = Rng::new(12345);
        let mut bytes = [0u8; 32];
        for (chunk, s) in bytes.chunks_exact_mut(8).zip(&ours.s) {
            chunk.copy_from_slice(&s.to_le_bytes());
        }
        let mut theirs = rand_xoshiro::Xoshiro256StarStar::from_seed(bytes);
        assert_eq!(ours.next_u64(), theirs.next_u64(), "same generator");
        for _ in 0..3 {
            ours.jump();
            theirs.jump();
            for _ in 0..4 {
                assert_eq!(ours.next_u64(), theirs.next_u64());
            }
        }
    }

    /// Stream 0 is the seed's own stream (what `n = 1` always drew), and a stream never
    /// starts where another seed's or stream's does.
    #[test]
    fn streams_of_neighbouring_seeds_are_unrelated() {
        let first = |seed, stream| {
            let mut r = Rng::for_stream(seed, stream);
            (0..4).map(|_| r.next_u64()).collect::<Vec<_>>()
        };
        let mut plain = Rng::new(9);
        assert_eq!(
            first(9, 0),
            (0..4).map(|_| plain.next_u64()).collect::<Vec<_>>()
        );
        assert_ne!(first(9, 1), first(10, 0));
        assert_ne!(first(9, 1), first(9, 2));
        assert_eq!(first(9, 3), first(9, 3), "reproducible");
    }

    #[test]
    fn uniform_in_unit_interval_and_mean_half() {
        let mut r = Rng::new(7);
        let n = 100_000;
        let mut sum = 0.0;
        for _ in 0..n {
            let u = r.next_f64();
            assert!((0.0..1.0).contains(&u));
            sum += u;
        }
        let mean = sum / n as f64;
        // sd of the mean = sqrt(1/12 / n) ≈ 0.0009; 5 sd.
        assert!((mean - 0.5).abs() < 0.0046, "mean {mean}");
    }
}
