/* The kernels' parallel regions: `wf_parallel(threads, body, ctx)` runs body(ctx, t,
   threads) on `threads` threads at once, t = 0 on the calling thread. Built with OpenMP
   it opens an OpenMP parallel region; built without (Apple's clang has none) it hands the
   body to a pool of threads of the kernels' own (par.c). Either way no kernel's bits depend
   on its threads: a body splits its work by `wf_share` (fixed shares) or `wf_take` (the
   next piece of a shared counter), and `wf_barrier` waits for the region's other threads.

   A region opened inside another, or while another thread of the process holds the pool,
   runs its body on the calling thread alone (threads = 1). */
#ifndef WARMFLEET_PAR_H
#define WARMFLEET_PAR_H

#include <stdint.h>

typedef void (*wf_body)(void *ctx, int t, int threads);

void wf_parallel(int threads, wf_body body, void *ctx);
void wf_barrier(void); /* inside a body: every thread of the region reaches it first */
int wf_pool_threads(void); /* threads the pool started (0 in an OpenMP build) */
int wf_openmp(void);       /* 1 where built with OpenMP, 0 on the pool */

/* [*lo, *hi): thread t's share of n items, contiguous, the first n % threads one longer */
static inline void wf_share(int64_t n, int t, int threads, int64_t *lo, int64_t *hi) {
    int64_t q = n / threads, r = n % threads;
    *lo = t * q + (t < r ? t : r);
    *hi = *lo + q + (t < r);
}

/* The first of the next `chunk` items of a counter the region's threads share (set to 0
   before the region); at or past the end once they are all taken. */
static inline int64_t wf_take(int64_t *next, int64_t chunk) {
    return __atomic_fetch_add(next, chunk, __ATOMIC_RELAXED);
}

#endif
