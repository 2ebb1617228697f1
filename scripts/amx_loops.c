// What AMX tile instruction mixes cost, one thread, operands in L1 (scripts/bench_amx.sh step 3):
// G multiply-adds/s and ns per tdpbssd (16·16·64 multiply-adds each), for the loops of the tile
// kernels of crates/nucleus/src/kernels/interleaved/amx_tiles.rs and variants of them: where the
// A tiles' rows sit (64 bytes apart, as packed, or a Q8_K row apart), how often C is stored.
// Two rounds. Linux only (arch_prctl asks for the tile state).
//
//   cc -O2 -march=native scripts/amx_loops.c -o /tmp/amx_loops && taskset -c 0 /tmp/amx_loops
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

struct tilecfg { uint8_t palette, start; uint8_t res[14]; uint16_t colsb[16]; uint8_t rows[16]; };
static uint8_t A[1 << 20] __attribute__((aligned(64)));
static uint8_t Bm[1 << 16] __attribute__((aligned(64)));
static int32_t C[4096] __attribute__((aligned(64)));
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define N 200000L
#define STEP(sa, aoff, boff) \
  _tile_loadd(2, Bm + (boff), 64); _tile_loadd(3, Bm + (boff) + 1024, 64); \
  _tile_loadd(0, A + (aoff), sa); _tile_loadd(1, A + (aoff) + 16 * (sa), sa); \
  _tile_dpbssd(4, 0, 2); _tile_dpbssd(5, 0, 3); _tile_dpbssd(6, 1, 2); _tile_dpbssd(7, 1, 3);
#define STEP_IL(sa, aoff, boff) \
  _tile_loadd(0, A + (aoff), sa); _tile_loadd(2, Bm + (boff), 64); _tile_dpbssd(4, 0, 2); \
  _tile_loadd(3, Bm + (boff) + 1024, 64); _tile_dpbssd(5, 0, 3); \
  _tile_loadd(1, A + (aoff) + 16 * (sa), sa); _tile_dpbssd(6, 1, 2); _tile_dpbssd(7, 1, 3);
#define STORE _tile_stored(4, C, 64); _tile_stored(5, C + 256, 64); _tile_stored(6, C + 512, 64); _tile_stored(7, C + 768, 64);
#define ZERO _tile_zero(4); _tile_zero(5); _tile_zero(6); _tile_zero(7);

static void report(const char *what, double s, long tdps) { printf("%-58s %7.0f G MAC/s  %5.1f ns/tdp\n", what, tdps * 16384.0 / s / 1e9, s / tdps * 1e9); }

int main(void) {
  if (syscall(SYS_arch_prctl, 0x1023, 18)) { puts("no AMX"); return 1; }
  struct tilecfg cfg = {.palette = 1};
  for (int t = 0; t < 8; t++) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
  __asm__ volatile("" : : "r"(&cfg) : "memory"); // keep the stores: GCC 12 misses that ldtilecfg reads them
  _tile_loadconfig(&cfg);
  memset(A, 1, sizeof A); memset(Bm, 1, sizeof Bm);
  double t;
  for (int round = 0; round < 2; round++) {
  _tile_loadd(0, A, 64); _tile_loadd(1, A, 64); _tile_loadd(2, Bm, 64); _tile_loadd(3, Bm, 64); ZERO
  t = now(); for (long i = 0; i < N; i++) { _tile_dpbssd(4, 0, 2); _tile_dpbssd(5, 0, 3); _tile_dpbssd(6, 1, 2); _tile_dpbssd(7, 1, 3); }
  report("peak: 4 tdp, no loads", now() - t, 4 * N);
  t = now(); for (long i = 0; i < N; i++) { _tile_dpbssd(4, 0, 2); _tile_dpbssd(5, 0, 3); }
  report("2 chains (2 C tiles), no loads", now() - t, 2 * N);
  t = now(); for (long i = 0; i < N; i++) { STEP(64, 0, 0) }
  report("4 loads + 4 tdp, L1, never stored", now() - t, 4 * N);
  t = now(); for (long i = 0; i < N; i++) { STEP(64, (i & 3) * 2048, (i & 3) * 2048) }
  report("4 loads + 4 tdp, 4 steps of L1 data, never stored", now() - t, 4 * N);
  t = now(); for (long i = 0; i < N; i++) { STEP_IL(64, 0, 0) }
  report("loads interleaved with tdp, never stored", now() - t, 4 * N);
  t = now(); for (long i = 0; i < N; i++) { _tile_loadd(2, Bm, 64); _tile_loadd(3, Bm + 1024, 64); _tile_dpbssd(4, 0, 2); _tile_dpbssd(5, 0, 3); _tile_dpbssd(6, 1, 2); _tile_dpbssd(7, 1, 3); }
  report("2 B loads + 4 tdp (A kept)", now() - t, 4 * N);
  t = now(); for (long i = 0; i < N / 4; i++) { ZERO STEP(64, 0, 0) STEP(64, 64, 2048) STEP(64, 128, 4096) STEP(64, 192, 6144) STORE }
  report("zero, 4 steps, store (the planes loop)", now() - t, 16 * (N / 4));
  t = now(); for (long i = 0; i < N / 8; i++) { ZERO STEP(64, 0, 0) STEP(64, 64, 2048) STEP(64, 128, 4096) STEP(64, 192, 6144) STEP(64, 0, 0) STEP(64, 64, 2048) STEP(64, 128, 4096) STEP(64, 192, 6144) STORE }
  report("zero, 8 steps, store", now() - t, 32 * (N / 8));
  t = now(); for (long i = 0; i < N / 4; i++) { ZERO STEP_IL(64, 0, 0) STEP_IL(64, 64, 2048) STEP_IL(64, 128, 4096) STEP_IL(64, 192, 6144) STORE }
  report("zero, 4 interleaved steps, store", now() - t, 16 * (N / 4));
  t = now(); for (long i = 0; i < N / 4; i++) { ZERO STEP(4088, 0, 0) STEP(4088, 64, 2048) STEP(4088, 128, 4096) STEP(4088, 192, 6144) STORE }
  report("zero, 4 steps, store; A rows 4088 B apart", now() - t, 16 * (N / 4));
  t = now(); for (long i = 0; i < N / 4; i++) { ZERO STEP(21608, 0, 0) STEP(21608, 64, 2048) STEP(21608, 128, 4096) STEP(21608, 192, 6144) STORE }
  report("zero, 4 steps, store; A rows 21608 B apart", now() - t, 16 * (N / 4));
  t = now(); for (long i = 0; i < N / 4; i++) { ZERO STEP(64, 0, 0) STEP(64, 64, 2048) STEP(64, 128, 4096) STEP(64, 192, 6144)
      _tile_stored(4, C + 1024 * (i & 1), 64); _tile_stored(5, C + 256 + 1024 * (i & 1), 64); _tile_stored(6, C + 512 + 1024 * (i & 1), 64); _tile_stored(7, C + 768 + 1024 * (i & 1), 64);
      __m512i s = _mm512_setzero_si512(); for (int k = 0; k < 64; k++) s = _mm512_add_epi32(s, _mm512_load_si512(C + 1024 * (i & 1) + 16 * k)); _mm512_store_si512(C + 3072, s); }
  report("zero, 4 steps, store, read C back (64 loads)", now() - t, 16 * (N / 4));
  }
  _tile_release();
  return 0;
}
