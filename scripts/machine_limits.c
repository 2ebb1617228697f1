// The machine's ceilings that a matrix product can reach, to set beside nucleus's speed:
//   - DRAM read bandwidth: threads each summing its share of a buffer much larger than the last-
//     level cache (decode of a model that does not fit in cache is bound by it);
//   - int8 multiply-add throughput: `vpdpbusd` on 512-bit (AVX-512 VNNI) and 256-bit (AVX-VNNI)
//     registers, and `vpmaddubsw` + `vpmaddwd` (AVX2 without VNNI), chains independent enough to
//     keep the units busy, operands in registers (prefill is bound by it);
//   - AMX `tdpbusd` where the CPU lists AMX and the kernel grants tile data to this process
//     (arch_prctl ARCH_REQ_XCOMP_PERM); otherwise the reason it cannot run.
// Figures are best-of-reps, in GB/s (1e9 bytes) and G multiply-adds/s, for 1 thread and for
// THREADS (default: all CPUs).
//
//   cc -O3 -march=native -pthread scripts/machine_limits.c -o .bench/machine_limits
//   .bench/machine_limits [THREADS] [--json]
//
// Not run in CI (a timing). scripts/bench_real_shapes.sh builds and runs it.
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// ---- bandwidth ----
#define BUF_BYTES ((size_t)2 << 30)  // 2 GiB: four times a 480 MiB L3
static uint8_t *buf;
static int n_threads;

struct job {
    int id, n;
    int kind;
    double result;
    uint64_t sink;
};

static void *read_share(void *p) {
    struct job *j = p;
    size_t share = BUF_BYTES / j->n / 64 * 64;
    const uint8_t *b = buf + share * j->id;
#if defined(__AVX512F__)
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < share; i += 256) {
        a0 = _mm512_add_epi64(a0, _mm512_load_si512(b + i));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512(b + i + 64));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512(b + i + 128));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512(b + i + 192));
    }
    j->sink = _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
#else
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < share; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(b + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(b + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(b + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(b + i + 96)));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    j->sink = _mm256_extract_epi64(s, 0) + _mm256_extract_epi64(s, 3);
#endif
    return NULL;
}

// ---- int8 multiply-adds ----
#define ITERS 20000000L
static void *int8_units(void *p) {
    struct job *j = p;
    long macs = 0;
    switch (j->kind) {
#if defined(__AVX512VNNI__)
    case 0: {  // vpdpbusd zmm: 64 multiply-adds
        __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(5);
        __m512i c[10];
        for (int k = 0; k < 10; k++) c[k] = _mm512_set1_epi32(k);
        for (long i = 0; i < ITERS; i++)
#pragma GCC unroll 10
            for (int k = 0; k < 10; k++) c[k] = _mm512_dpbusd_epi32(c[k], x, y);
        for (int k = 1; k < 10; k++) c[0] = _mm512_add_epi32(c[0], c[k]);
        j->sink = _mm512_reduce_add_epi32(c[0]);
        macs = ITERS * 10L * 64;
        break;
    }
#endif
#if defined(__AVXVNNI__) || defined(__AVX512VNNI__) && defined(__AVX512VL__)
    case 1: {  // vpdpbusd ymm: 32 multiply-adds
        __m256i x = _mm256_set1_epi8(3), y = _mm256_set1_epi8(5);
        __m256i c[10];
        for (int k = 0; k < 10; k++) c[k] = _mm256_set1_epi32(k);
        for (long i = 0; i < ITERS; i++)
#pragma GCC unroll 10
            for (int k = 0; k < 10; k++) c[k] = _mm256_dpbusd_epi32(c[k], x, y);
        for (int k = 1; k < 10; k++) c[0] = _mm256_add_epi32(c[0], c[k]);
        j->sink = _mm256_extract_epi32(c[0], 0);
        macs = ITERS * 10L * 32;
        break;
    }
#endif
    case 2: {  // vpmaddubsw + vpmaddwd + vpaddd ymm: 32 multiply-adds
        __m256i x = _mm256_set1_epi8(3), y = _mm256_set1_epi8(5), one = _mm256_set1_epi16(1);
        __m256i c[8];
        for (int k = 0; k < 8; k++) c[k] = _mm256_set1_epi32(k);
        for (long i = 0; i < ITERS; i++)
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                c[k] = _mm256_add_epi32(c[k], _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), one));
        for (int k = 1; k < 8; k++) c[0] = _mm256_add_epi32(c[0], c[k]);
        j->sink = _mm256_extract_epi32(c[0], 0);
        macs = ITERS * 8L * 32;
        break;
    }
    }
    j->result = (double)macs;
    return NULL;
}

// ---- AMX ----
struct tilecfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((aligned(64)));

static const char *amx_state(void) {
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    if (!((d >> 24) & 1) || !((d >> 25) & 1)) return "the CPU does not list AMX (amx_tile, amx_int8)";
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0)
        return "the kernel refused tile data (arch_prctl ARCH_REQ_XCOMP_PERM failed)";
    return NULL;
}

#if defined(__AMX_INT8__)
static void *amx_units(void *p) {
    struct job *j = p;
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) return NULL;
    struct tilecfg cfg = {.palette = 1};
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    static int8_t src[1024] __attribute__((aligned(64)));
    // GCC does not see that `ldtilecfg` reads the config, and drops the stores of the shapes
    // above as dead (then the first tile load faults with SIGILL: seen with Debian's gcc on an
    // Emerald Rapids guest, 2026-11-28); the barrier keeps them.
    __asm__ volatile("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
    _tile_loadd(4, src, 64);
    _tile_loadd(5, src, 64);
    _tile_loadd(6, src, 64);
    _tile_loadd(7, src, 64);
    long iters = ITERS / 4;
    for (long i = 0; i < iters; i++) {
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 4, 7);
        _tile_dpbusd(2, 5, 6);
        _tile_dpbusd(3, 5, 7);
    }
    _tile_release();
    j->result = (double)iters * 4 * 16 * 16 * 64;
    return NULL;
}
#endif

static double run(void *(*f)(void *), int n, int kind, int reps) {
    double best = 0;
    for (int r = 0; r < reps; r++) {
        pthread_t th[256];
        struct job jobs[256];
        double t0 = now();
        for (int i = 0; i < n; i++) {
            jobs[i] = (struct job){.id = i, .n = n, .kind = kind};
            pthread_create(&th[i], NULL, f, &jobs[i]);
        }
        double work = 0;
        for (int i = 0; i < n; i++) {
            pthread_join(th[i], NULL);
            work += jobs[i].result;
        }
        double rate = work / (now() - t0);
        if (rate > best) best = rate;
    }
    return best;
}

static void *bw_job(void *p) {
    read_share(p);
    struct job *j = p;
    j->result = (double)(BUF_BYTES / j->n / 64 * 64);
    return NULL;
}

int main(int argc, char **argv) {
    n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else n_threads = atoi(argv[i]);
    }
    if (n_threads < 1 || n_threads > 256) n_threads = 1;
    // The same reads from 4 KiB pages (what a plain allocation gets where transparent huge
    // pages are "madvise", the usual default) and from 2 MiB pages (asked for with
    // MADV_HUGEPAGE; 0 where the kernel gave none): on a VM each TLB miss walks two page
    // tables, which costs streaming reads a few percent.
    // The first touch of the fresh buffer is timed too: packing weights at load writes fresh
    // memory, whose cost the kernel (zeroing) and a VM's host (backing) set.
    double bw1 = 0, bwn = 0, huge1 = 0, hugen = 0, touch = 0, touch_huge = 0;
    for (int huge = 0; huge < 2; huge++) {
        buf = aligned_alloc(2 << 20, BUF_BYTES);
        if (!buf) {
            fprintf(stderr, "cannot allocate %zu bytes\n", BUF_BYTES);
            return 1;
        }
        if (madvise(buf, BUF_BYTES, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) != 0 && huge) {
            free(buf);
            break;
        }
        double t0 = now();
        memset(buf, 1, BUF_BYTES);  // fault every page in before timing
        double touched = BUF_BYTES / (now() - t0) / 1e9;
        if (huge) touch_huge = touched;
        else touch = touched;
        double one = run(bw_job, 1, 0, 5) / 1e9, all = run(bw_job, n_threads, 0, 5) / 1e9;
        if (huge) huge1 = one, hugen = all;
        else bw1 = one, bwn = all;
        free(buf);
    }
    double v512 = 0, v256 = 0, avx2 = run(int8_units, n_threads, 2, 3) / 1e9;
#if defined(__AVX512VNNI__)
    v512 = run(int8_units, n_threads, 0, 3) / 1e9;
#endif
#if defined(__AVXVNNI__) || defined(__AVX512VNNI__) && defined(__AVX512VL__)
    v256 = run(int8_units, n_threads, 1, 3) / 1e9;
#endif
    const char *amx_why = amx_state();
    double amx = 0;
#if defined(__AMX_INT8__)
    if (!amx_why) amx = run(amx_units, n_threads, 0, 3) / 1e9;
#else
    if (!amx_why) amx_why = "this build has no AMX (compile with -march=native on an AMX machine)";
#endif
    if (json) {
        printf("{\"threads\":%d,\"read_gb_s_1\":%.2f,\"read_gb_s\":%.2f,\"read_gb_s_huge_1\":%.2f,"
               "\"read_gb_s_huge\":%.2f,\"first_touch_gb_s\":%.2f,\"first_touch_gb_s_huge\":%.2f,\"vnni512_gmac_s\":%.1f,\"vnni256_gmac_s\":%.1f,"
               "\"avx2_gmac_s\":%.1f,\"amx_gmac_s\":%.1f,\"amx\":\"%s\"}\n",
               n_threads, bw1, bwn, huge1, hugen, touch, touch_huge, v512, v256, avx2, amx, amx_why ? amx_why : "ran");
    } else {
        printf("DRAM read bandwidth: %.1f GB/s (1 thread), %.1f GB/s (%d threads); from 2 MiB pages "
               "%.1f and %.1f\n", bw1, bwn, n_threads, huge1, hugen);
        printf("Fresh memory written the first time (1 thread): %.2f GB/s in 4 KiB pages, %.2f in "
               "2 MiB pages\n", touch, touch_huge);
        printf("int8 multiply-adds (%d threads): vpdpbusd zmm %.0f G/s, vpdpbusd ymm %.0f G/s, "
               "vpmaddubsw ymm %.0f G/s\n", n_threads, v512, v256, avx2);
        if (amx_why) printf("AMX: not run: %s\n", amx_why);
        else printf("AMX tdpbusd: %.0f G multiply-adds/s\n", amx);
    }
    return 0;
}
