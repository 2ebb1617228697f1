// What llama.cpp's float chain for Q8_0 would cost nucleus's interleaved prompt kernels: the
// inner loop of a prompt's Q8_0 product on one core, weights and activations in L1/L2, in useful
// multiply-adds per second, for
//   own-ymm:  nucleus's default chain in its layout: eight rows in a 256-bit register, the
//             block's exact sum in one lane per row (eight vpdpbusd accumulating), one FMA per
//             block (the default's real kernel, with more tokens per weight load, runs faster);
//   own-zmm:  the same chain on sixteen rows (two groups) in a 512-bit register;
//   lane-zmm: llama.cpp's chain (ggml_vec_dot_q8_0_q8_0, and --exact): per row eight f32
//             lanes, each the FMA of its four-value sum per block, summed at the end; sixteen
//             rows in a 512-bit register, one accumulator per lane;
//   lane-ymm: the same on eight rows in a 256-bit register.
// The lanes' sums start from -128 times the activations' four-value sums (weights stored
// biased, as in quant/x86/q8_0_biased.rs), so each vpdpbusd gives a lane's exact integer.
// Results in docs/src/benchmarks-log.md.
//
//   gcc -O2 -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -o lane_chain_probe \
//     scripts/lane_chain_probe.c && taskset -c 0 ./lane_chain_probe
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define K 1024           /* values per row: 32 blocks */
#define NB (K / 32)
#define ROWS 64          /* rows of the product (4 pairs of groups) */
#define NT 4             /* tokens per kernel call */
static uint8_t W[ROWS / 8][NB][8][32] __attribute__((aligned(64))); /* group, block, chunk, 8 rows x 4 */
static float WS[ROWS / 8][NB][8];
static int8_t X[NT][NB][32];
static float XS[NT][NB];
static int32_t XB[NT][NB][8]; /* -128 x the lane's four activations */
static int32_t XBS[NT][NB];   /* -128 x the block's 32 activations */
static float OUT[NT][ROWS];

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static inline __m512i join(const void *a, const void *b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(a)), _mm256_loadu_si256(b), 1);
}

/* Two groups (16 rows), NT tokens, nucleus's chain. */
static void own_zmm(int g) {
  __m512 acc[NT];
  for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
  for (int b = 0; b < NB; b++) {
    __m512i w[8];
    for (int k = 0; k < 8; k++) w[k] = join(W[g][b][k], W[g + 1][b][k]);
    __m512 ws = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(WS[g][b])), _mm256_loadu_ps(WS[g + 1][b]), 1);
    for (int t = 0; t < NT; t++) {
      __m512i s = _mm512_set1_epi32(XBS[t][b]), s2 = _mm512_setzero_si512();
      for (int k = 0; k < 8; k += 2) {
        s = _mm512_dpbusd_epi32(s, w[k], _mm512_set1_epi32(*(int32_t *)&X[t][b][4 * k]));
        s2 = _mm512_dpbusd_epi32(s2, w[k + 1], _mm512_set1_epi32(*(int32_t *)&X[t][b][4 * k + 4]));
      }
      __m512 d = _mm512_mul_ps(ws, _mm512_set1_ps(XS[t][b]));
      acc[t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_add_epi32(s, s2)), acc[t]);
    }
  }
  for (int t = 0; t < NT; t++) _mm512_storeu_ps(&OUT[t][8 * g], acc[t]);
}

/* One group (8 rows), NT tokens, nucleus's chain (today's default, with VNNI). */
static void own_ymm(int g) {
  __m256 acc[NT];
  for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
  for (int b = 0; b < NB; b++) {
    __m256i w[8];
    for (int k = 0; k < 8; k++) w[k] = _mm256_loadu_si256((const void *)W[g][b][k]);
    __m256 ws = _mm256_loadu_ps(WS[g][b]);
    for (int t = 0; t < NT; t++) {
      __m256i s = _mm256_set1_epi32(XBS[t][b]), s2 = _mm256_setzero_si256();
      for (int k = 0; k < 8; k += 2) {
        s = _mm256_dpbusd_epi32(s, w[k], _mm256_set1_epi32(*(int32_t *)&X[t][b][4 * k]));
        s2 = _mm256_dpbusd_epi32(s2, w[k + 1], _mm256_set1_epi32(*(int32_t *)&X[t][b][4 * k + 4]));
      }
      __m256 d = _mm256_mul_ps(ws, _mm256_set1_ps(XS[t][b]));
      acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_add_epi32(s, s2)), acc[t]);
    }
  }
  for (int t = 0; t < NT; t++) _mm256_storeu_ps(&OUT[t][8 * g], acc[t]);
}

/* Two groups, two tokens at a time (eight accumulators each), llama.cpp's chain. */
static void lane_zmm(int g) {
  for (int t0 = 0; t0 < NT; t0 += 2) {
    __m512 acc[2][8];
    for (int t = 0; t < 2; t++)
      for (int k = 0; k < 8; k++) acc[t][k] = _mm512_setzero_ps();
    for (int b = 0; b < NB; b++) {
      __m512 ws = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(WS[g][b])), _mm256_loadu_ps(WS[g + 1][b]), 1);
      for (int k = 0; k < 8; k++) {
        __m512i w = join(W[g][b][k], W[g + 1][b][k]);
        for (int t = 0; t < 2; t++) {
          __m512 d = _mm512_mul_ps(ws, _mm512_set1_ps(XS[t0 + t][b]));
          __m512i p = _mm512_dpbusd_epi32(_mm512_set1_epi32(XB[t0 + t][b][k]), w,
                                          _mm512_set1_epi32(*(int32_t *)&X[t0 + t][b][4 * k]));
          acc[t][k] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc[t][k]);
        }
      }
    }
    for (int t = 0; t < 2; t++) {
      __m512 a = _mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][4]), _mm512_add_ps(acc[t][2], acc[t][6]));
      __m512 c = _mm512_add_ps(_mm512_add_ps(acc[t][1], acc[t][5]), _mm512_add_ps(acc[t][3], acc[t][7]));
      _mm512_storeu_ps(&OUT[t0 + t][8 * g], _mm512_add_ps(a, c));
    }
  }
}

/* One group, two tokens at a time, llama.cpp's chain in 256-bit registers. */
static void lane_ymm(int g) {
  for (int t0 = 0; t0 < NT; t0 += 2) {
    __m256 acc[2][8];
    for (int t = 0; t < 2; t++)
      for (int k = 0; k < 8; k++) acc[t][k] = _mm256_setzero_ps();
    for (int b = 0; b < NB; b++) {
      __m256 ws = _mm256_loadu_ps(WS[g][b]);
      for (int k = 0; k < 8; k++) {
        __m256i w = _mm256_loadu_si256((const void *)W[g][b][k]);
        for (int t = 0; t < 2; t++) {
          __m256 d = _mm256_mul_ps(ws, _mm256_set1_ps(XS[t0 + t][b]));
          __m256i p = _mm256_dpbusd_epi32(_mm256_set1_epi32(XB[t0 + t][b][k]), w,
                                          _mm256_set1_epi32(*(int32_t *)&X[t0 + t][b][4 * k]));
          acc[t][k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[t][k]);
        }
      }
    }
    for (int t = 0; t < 2; t++) {
      __m256 a = _mm256_add_ps(_mm256_add_ps(acc[t][0], acc[t][4]), _mm256_add_ps(acc[t][2], acc[t][6]));
      __m256 c = _mm256_add_ps(_mm256_add_ps(acc[t][1], acc[t][5]), _mm256_add_ps(acc[t][3], acc[t][7]));
      _mm256_storeu_ps(&OUT[t0 + t][8 * g], _mm256_add_ps(a, c));
    }
  }
}

static void run(const char *name, void (*f)(int), int step) {
  int reps = 20000;
  double best = 0;
  for (int round = 0; round < 3; round++) {
    double t0 = now();
    for (int r = 0; r < reps; r++)
      for (int g = 0; g < ROWS / 8; g += step) f(g);
    double rate = (double)reps * ROWS * K * NT / (now() - t0) / 1e9;
    if (rate > best) best = rate;
  }
  printf("%-9s %6.1f G multiply-adds/s (best of 3), out %g\n", name, best, OUT[1][5]);
}

int main(void) {
  uint32_t s = 12345;
  for (int g = 0; g < ROWS / 8; g++)
    for (int b = 0; b < NB; b++) {
      for (int k = 0; k < 8; k++)
        for (int i = 0; i < 32; i++) W[g][b][k][i] = (uint8_t)((s = s * 1103515245 + 12345) >> 16);
      for (int r = 0; r < 8; r++) WS[g][b][r] = 0.001f * (1 + (r + b) % 5);
    }
  for (int t = 0; t < NT; t++)
    for (int b = 0; b < NB; b++) {
      XS[t][b] = 0.01f;
      for (int i = 0; i < 32; i++) X[t][b][i] = (int8_t)((s = s * 1103515245 + 12345) >> 16) / 2;
      XBS[t][b] = 0;
      for (int k = 0; k < 8; k++) {
        XB[t][b][k] = -128 * (X[t][b][4 * k] + X[t][b][4 * k + 1] + X[t][b][4 * k + 2] + X[t][b][4 * k + 3]);
        XBS[t][b] += XB[t][b][k];
      }
    }
  run("own-ymm", own_ymm, 1);
  run("own-zmm", own_zmm, 2);
  run("lane-zmm", lane_zmm, 2);
  run("lane-ymm", lane_ymm, 1);
  return 0;
}
