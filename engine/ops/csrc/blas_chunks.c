/* Long prefill chunks' products through the process's BLAS, called from the kernels' own
   threads (engine/ops/blas.py finds the library's sgemm and holds its thread pool to one).

   Built for AVX2 or NEON, a chunk longer than the kernels take (engine/ops/chunks.py) is
   multiplied by BLAS against the weights expanded to float32. Called from Python, BLAS
   runs on a thread pool of its own, the kernels on OpenMP's: each product then handed the
   cores from one pool to the other and back, and each pool's idle thread had fallen
   asleep by then (a wake-up costs ~0.4 ms on a VM; 8 hand-overs a layer took 14% of a
   512-token prefill here). Here each of the kernels' threads expands its share of the
   weight rows (multiples of 16) and multiplies every chunk by them, one sgemm call per
   chunk on that thread: one pool does all the work.

   Batch invariance: a chunk's rows go through calls of their own (a chunk's product
   depends on the chunk only, as when each was a BLAS call of its own), the weight rows
   split the same way for a given thread count. */
#include <stdint.h>
#include <stdlib.h>

#include "par.h"

void wf_dequant_row(int kind, int gshift, const uint8_t *codes, const void *scale,
                    const void *offset, int64_t k, int64_t n, float *dst, float *scratch);
int64_t wf_dequant_room(int kind, int gshift, int64_t k);

/* CBLAS's sgemm, with the library's integers: 64-bit (ILP64) or 32-bit. */
typedef void (*sgemm64_fn)(int order, int trans_a, int trans_b, int64_t m, int64_t n,
                           int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                           int64_t ldb, float beta, float *c, int64_t ldc);
typedef void (*sgemm32_fn)(int order, int trans_a, int trans_b, int32_t m, int32_t n,
                           int32_t k, float alpha, const float *a, int32_t lda, const float *b,
                           int32_t ldb, float beta, float *c, int32_t ldc);
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 }; /* CBLAS's values */
#define SHARE_ROWS 16 /* weight rows a thread's share is a multiple of */
#define NO_DEQUANT -1 /* kind: float32 weight rows, used where they are */

typedef struct {
    int kind, gshift;
    const uint8_t *codes;
    const void *scale, *offset;
    int64_t k, num, room, num_chunks, ldo;
    const int64_t *rows, *chunks;
    const float *x;
    float *out, *slab, *scratch;
    void *sgemm;
    int ilp64;
} Chunks;

/* c [m, n] (row stride ldc) = a [m, k] @ b [n, k]^T */
static void sgemm_nt(const Chunks *c, int64_t m, int64_t n, const float *a, const float *b,
                     float *out) {
    int64_t k = c->k;
    if (c->ilp64)
        ((sgemm64_fn)c->sgemm)(ROW_MAJOR, NO_TRANS, TRANS, m, n, k, 1.0f, a, k, b, k, 0.0f, out,
                               c->ldo);
    else
        ((sgemm32_fn)c->sgemm)(ROW_MAJOR, NO_TRANS, TRANS, (int32_t)m, (int32_t)n, (int32_t)k,
                               1.0f, a, (int32_t)k, b, (int32_t)k, 0.0f, out, (int32_t)c->ldo);
}

static void chunks_share(void *ctx, int t, int threads) {
    const Chunks *c = ctx;
    int64_t lo, hi, k = c->k;
    wf_share((c->num + SHARE_ROWS - 1) / SHARE_ROWS, t, threads, &lo, &hi);
    int64_t r0 = lo * SHARE_ROWS, r1 = hi * SHARE_ROWS < c->num ? hi * SHARE_ROWS : c->num;
    if (r0 >= r1) return;
    const float *w = (const float *)c->codes + r0 * k;
    if (c->kind != NO_DEQUANT) {
        float *groups = c->scratch ? c->scratch + t * c->room : NULL;
        for (int64_t i = r0; i < r1; i++)
            wf_dequant_row(c->kind, c->gshift, c->codes, c->scale, c->offset, k, c->rows[i],
                           c->slab + i * k, groups);
        w = c->slab + r0 * k;
    }
    for (int64_t j = 0; j < c->num_chunks; j++) {
        int64_t start = c->chunks[2 * j], stop = c->chunks[2 * j + 1];
        sgemm_nt(c, stop - start, r1 - r0, c->x + start * k, w, c->out + start * c->ldo + r0);
    }
}

/* out[start:stop, i] = x[start:stop] . (weight row rows[i]) for i < num, for each chunk
   (start, stop) in chunks ([num_chunks, 2]): x [*, k] and out (row stride ldo) float32.
   kind NO_DEQUANT: codes are float32 rows [num, k] and rows, scale, offset, slab unused;
   else the rows are expanded into slab [num, k]. sgemm: CBLAS's, whose own threads are
   held to one (ilp64: its integers are 64-bit). 0, or the bytes it could not allocate
   (nothing done). */
int64_t wf_blas_chunks(int kind, int gshift, const uint8_t *codes, const void *scale,
                       const void *offset, int64_t k, const int64_t *rows, int64_t num,
                       const float *x, const int64_t *chunks, int64_t num_chunks, float *out,
                       int64_t ldo, float *slab, void *sgemm, int ilp64, int num_threads) {
    int64_t room = kind == NO_DEQUANT ? 0 : wf_dequant_room(kind, gshift, k);
    int64_t bytes = sizeof(float) * room * num_threads;
    float *scratch = NULL;
    if (bytes && !(scratch = malloc(bytes))) return bytes;
    Chunks c = {kind, gshift, codes, scale, offset, k, num, room, num_chunks, ldo, rows,
                chunks, x, out, slab, scratch, sgemm, ilp64};
    wf_parallel(num_threads, chunks_share, &c);
    free(scratch);
    return 0;
}
