// Where an AMX prompt kernel's time goes: variants of the tile kernels' inner loop on one core,
// 32 tokens x 32 rows per item, K = 3584 values per row, in useful multiply-adds per second:
// tile products alone (K = 32 or 64 bytes a product), with their sums stored, with Q8_0's
// float fold, the K-quants folded per sub-block (one product each) or carried in the weights
// as two planes of bytes (amx_layout.rs). Results in docs/src/benchmarks-log.md.
//
//   gcc -O2 -static -mavx512f -mavx512bw -mavx512vl -mamx-tile -mamx-int8 \
//     -o amx_probe scripts/amx_probe.c && taskset -c 0 ./amx_probe   # on a CPU with AMX
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define K 3584
#define NT 32
#define AST (K + K / 32 * 2 + 64) /* activation row stride: like Q8_0 rows (34 B per 32) */
struct cfg { uint8_t palette, start_row, res[14]; uint16_t colsb[16]; uint8_t rows[16]; } __attribute__((aligned(64)));
static int8_t A[NT * AST + 4096] __attribute__((aligned(64)));
static int8_t B[2 * 32 * K + 4096] __attribute__((aligned(64)));
static int32_t C[2][1024] __attribute__((aligned(64)));
static float out[NT * 32];
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void conf(int k) {
  struct cfg c = {.palette = 1};
  for (int t = 0; t < 2; t++) c.colsb[t] = k, c.rows[t] = 16;        // A
  for (int t = 2; t < 4; t++) c.colsb[t] = 64, c.rows[t] = k / 4;    // B
  for (int t = 4; t < 8; t++) c.colsb[t] = 64, c.rows[t] = 16;       // C
  __asm__ volatile("" : : "r"(&c) : "memory"); // keep the stores: GCC 12 misses that ldtilecfg reads them
  _tile_loadconfig(&c);
}
#define STORE4(c) do { _tile_stored(4, (c), 64); _tile_stored(5, (c) + 256, 64); _tile_stored(6, (c) + 512, 64); _tile_stored(7, (c) + 768, 64); } while (0)
#define ZERO4() do { _tile_zero(4); _tile_zero(5); _tile_zero(6); _tile_zero(7); } while (0)
#define TDP4() do { _tile_dpbssd(4, 0, 2); _tile_dpbssd(5, 0, 3); _tile_dpbssd(6, 1, 2); _tile_dpbssd(7, 1, 3); } while (0)

static __m512 acc[NT][2], acc2[NT][2];
static __m512i isum[NT][2];

// variant: 0 tdp only (K=32), 1 +zero/store, 2 +Q8_0 fold, 3 Q8_0 fold with A unaligned,
// 4 Q4_K as now (mullo per sub-block, float per pair), 5 Q4_K two planes (K=64 per pair),
// 6 Q6_K two planes (K=256 per fold), 7 tdp only K=64
static void item(int v) {
  int k = (v >= 5) ? 64 : 32;
  if (v == 7) k = 64;
  conf(k);
  const float dw = 0.5f;
  if (v <= 4 || v == 7) {
    int step = k;
    for (int b = 0; b < K / step; b++) {
      int aoff = (v == 3) ? 34 * b + 2 : step * b;
      _tile_loadd(0, A + aoff, AST);
      _tile_loadd(1, A + 16 * AST + aoff, AST);
      _tile_loadd(2, B + 32 * step * b, 64);
      _tile_loadd(3, B + 32 * step * b + 16 * step, 64);
      if (v == 0 || v == 7) { TDP4(); continue; }
      ZERO4(); TDP4(); STORE4(C[0]);
      if (v == 1) continue;
      if (v == 2 || v == 3) {
        __m512 d = _mm512_set1_ps(dw);
        for (int t = 0; t < NT; t++) {
          __m512 dx = _mm512_set1_ps(out[t]);
          for (int h = 0; h < 2; h++) {
            __m512i c = _mm512_load_si512(C[0] + 256 * (2 * (t / 16) + h) + 16 * (t % 16));
            acc[t][h] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(c), acc[t][h]);
          }
        }
      } else { // v == 4
        __m512i sc = _mm512_set1_epi32(b & 63);
        for (int t = 0; t < NT; t++)
          for (int h = 0; h < 2; h++) {
            __m512i c = _mm512_load_si512(C[0] + 256 * (2 * (t / 16) + h) + 16 * (t % 16));
            isum[t][h] = _mm512_add_epi32(isum[t][h], _mm512_mullo_epi32(sc, c));
          }
        if (b & 1) {
          __m512 d = _mm512_set1_ps(dw);
          for (int t = 0; t < NT; t++)
            for (int h = 0; h < 2; h++) {
              acc[t][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t][h]), d, acc[t][h]);
              isum[t][h] = _mm512_setzero_si512();
            }
        }
      }
    }
  } else if (v == 5) { // per pair (64 values): two planes
    for (int p = 0; p < K / 64; p++) {
      _tile_loadd(0, A + 64 * p, AST);
      _tile_loadd(1, A + 16 * AST + 64 * p, AST);
      for (int pl = 0; pl < 2; pl++) {
        const int8_t *bp = B + pl * 32 * K + 32 * 64 * p;
        _tile_loadd(2, bp, 64);
        _tile_loadd(3, bp + 1024, 64);
        ZERO4(); TDP4(); STORE4(C[pl]);
      }
      __m512 d = _mm512_set1_ps(dw);
      for (int t = 0; t < NT; t++)
        for (int h = 0; h < 2; h++) {
          int at = 256 * (2 * (t / 16) + h) + 16 * (t % 16);
          __m512i s = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(C[0] + at), 5), _mm512_load_si512(C[1] + at));
          acc[t][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, acc[t][h]);
        }
    }
  } else { // v == 6: per super-block of 256, two planes
    for (int sb = 0; sb < K / 256; sb++) {
      for (int pl = 0; pl < 2; pl++) {
        ZERO4();
        for (int ks = 0; ks < 4; ks++) {
          int off = 256 * sb + 64 * ks;
          _tile_loadd(0, A + off, AST);
          _tile_loadd(1, A + 16 * AST + off, AST);
          const int8_t *bp = B + pl * 32 * K + 32 * off;
          _tile_loadd(2, bp, 64);
          _tile_loadd(3, bp + 1024, 64);
          TDP4();
        }
        STORE4(C[pl]);
      }
      __m512 d = _mm512_set1_ps(dw);
      for (int t = 0; t < NT; t++) {
        __m512 dy = _mm512_set1_ps(out[t]);
        for (int h = 0; h < 2; h++) {
          int at = 256 * (2 * (t / 16) + h) + 16 * (t % 16);
          __m512i s = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(C[0] + at), 6), _mm512_load_si512(C[1] + at));
          acc[t][h] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), d), dy, acc[t][h]);
        }
      }
    }
  }
}

int main(void) {
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) { puts("no tile data"); return 1; }
  for (size_t i = 0; i < sizeof A; i++) A[i] = (int8_t)(i * 7);
  for (size_t i = 0; i < sizeof B; i++) B[i] = (int8_t)(i * 13 & 15);
  for (int t = 0; t < NT * 32; t++) out[t] = 1.0f / (t + 1);
  const char *names[] = {"tdp K=32 only", "tdp K=32 + zero/store", "Q8_0 fold (A aligned)", "Q8_0 fold (A at 34b+2)",
                         "Q4_K now: mullo/sub-block", "Q4_K planes: K=64/pair", "Q6_K planes: K=256/fold", "tdp K=64 only"};
  for (int v = 0; v < 8; v++) {
    double best = 0;
    for (int r = 0; r < 5; r++) {
      int iters = 200;
      double t0 = now();
      for (int i = 0; i < iters; i++) item(v);
      double dt = now() - t0;
      double macs = (double)iters * NT * 32 * K;
      if (macs / dt > best) best = macs / dt;
    }
    printf("%-28s %7.0f G MAC/s per core\n", names[v], best / 1e9);
  }
  float s = 0; for (int t = 0; t < NT; t++) s += ((float *)&acc[t][0])[0];
  printf("(checksum %g)\n", s);
  _tile_release();
  return 0;
}
