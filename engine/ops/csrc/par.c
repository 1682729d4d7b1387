/* par.h's regions: an OpenMP parallel region where the compiler has OpenMP, else a pool of
   POSIX threads started on first use and kept for the process's life (a forked child
   starts its own). A pool thread waits for the next region spinning a while (a decode step
   opens hundreds of regions, each a few microseconds apart), then asleep on a condition. */
#include "par.h"

#ifdef _OPENMP
#include <omp.h>

void wf_parallel(int threads, wf_body body, void *ctx) {
    if (threads <= 1 || omp_in_parallel()) {
        body(ctx, 0, 1);
        return;
    }
#pragma omp parallel num_threads(threads)
    body(ctx, omp_get_thread_num(), omp_get_num_threads());
}

void wf_barrier(void) {
#pragma omp barrier
}

int wf_pool_threads(void) { return 0; }

int wf_openmp(void) { return 1; }

#else
#include <pthread.h>
#include <sched.h>

#define MAX_POOL 255              /* threads besides the caller's */
#define THREAD_BITS 9             /* a generation's low bits: its region's threads */
#define SPINS_BEFORE_SLEEP 10000  /* a pool thread's spins for the next region (OpenMP's
                                     as thread_env.py sets it) */
#define SPINS_BEFORE_YIELD 1024   /* a barrier's spins before it yields the core */
#define STACK_BYTES (8 << 20)     /* as a Linux main thread's (macOS gives others 512 KiB) */

typedef struct {
    int threads;
    int count; /* the barrier's threads yet to arrive */
    int phase; /* barriers passed */
} Region;

static struct {
    pthread_mutex_t busy;  /* held by the thread whose region runs */
    pthread_mutex_t lock;  /* sleeping pool threads wait under it */
    pthread_cond_t wake;
    int started;
    uint64_t generation;   /* regions opened, then the last one's threads; watched */
    uint64_t born[MAX_POOL + 1]; /* the generation when each thread started */
    int pending;           /* pool threads still in the region */
    wf_body body;
    void *ctx;
    Region region;
} pool = {.busy = PTHREAD_MUTEX_INITIALIZER,
          .lock = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER};

static _Thread_local Region *current; /* the region this thread runs a body of */
static pthread_once_t fork_handler = PTHREAD_ONCE_INIT;

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static uint64_t next_region(uint64_t seen) {
    for (int i = 0; i < SPINS_BEFORE_SLEEP; i++) {
        uint64_t gen = __atomic_load_n(&pool.generation, __ATOMIC_ACQUIRE);
        if (gen != seen) return gen;
        relax();
    }
    uint64_t gen;
    pthread_mutex_lock(&pool.lock);
    while ((gen = __atomic_load_n(&pool.generation, __ATOMIC_ACQUIRE)) == seen)
        pthread_cond_wait(&pool.wake, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
    return gen;
}

static void *pool_thread(void *arg) {
    int t = (int)(intptr_t)arg;
    for (uint64_t seen = pool.born[t];;) {
        seen = next_region(seen);
        int threads = (int)(seen & ((1 << THREAD_BITS) - 1));
        if (t >= threads) continue; /* the region is read only by the threads it waits for */
        current = &pool.region;
        pool.body(pool.ctx, t, threads);
        current = NULL;
        __atomic_fetch_sub(&pool.pending, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

/* A forked child has none of its parent's pool threads: it starts its own. */
static void forked(void) {
    pthread_mutex_init(&pool.busy, NULL);
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pool.started = 0;
    current = NULL;
}

static void on_fork(void) { pthread_atfork(NULL, NULL, forked); }

/* Pool threads 1..wanted started (as many as the system gives); returns how many run. */
static int start_threads(int wanted) {
    pthread_once(&fork_handler, on_fork);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, STACK_BYTES);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    while (pool.started < wanted) {
        pthread_t id;
        int t = pool.started + 1;
        pool.born[t] = pool.generation;
        if (pthread_create(&id, &attr, pool_thread, (void *)(intptr_t)t)) break;
        pool.started = t;
    }
    pthread_attr_destroy(&attr);
    return pool.started;
}

void wf_parallel(int threads, wf_body body, void *ctx) {
    threads = threads > MAX_POOL + 1 ? MAX_POOL + 1 : threads;
    if (threads <= 1 || current || pthread_mutex_trylock(&pool.busy)) {
        body(ctx, 0, 1); /* no threads asked, a region inside another, or the pool taken */
        return;
    }
    threads = 1 + start_threads(threads - 1);
    pool.body = body;
    pool.ctx = ctx;
    pool.region = (Region){threads, threads, 0};
    pool.pending = threads - 1;
    pthread_mutex_lock(&pool.lock);
    uint64_t next = ((pool.generation >> THREAD_BITS) + 1) << THREAD_BITS | (uint64_t)threads;
    __atomic_store_n(&pool.generation, next, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    current = &pool.region;
    body(ctx, 0, threads);
    current = NULL;
    for (int i = 0; __atomic_load_n(&pool.pending, __ATOMIC_ACQUIRE); i++)
        i < SPINS_BEFORE_YIELD ? relax() : (void)sched_yield();
    pthread_mutex_unlock(&pool.busy);
}

void wf_barrier(void) {
    Region *r = current;
    if (!r || r->threads == 1) return;
    int phase = __atomic_load_n(&r->phase, __ATOMIC_ACQUIRE);
    if (__atomic_sub_fetch(&r->count, 1, __ATOMIC_ACQ_REL) == 0) {
        __atomic_store_n(&r->count, r->threads, __ATOMIC_RELAXED);
        __atomic_store_n(&r->phase, phase + 1, __ATOMIC_RELEASE);
        return;
    }
    for (int i = 0; __atomic_load_n(&r->phase, __ATOMIC_ACQUIRE) == phase; i++)
        i < SPINS_BEFORE_YIELD ? relax() : (void)sched_yield();
}

int wf_pool_threads(void) { return pool.started; }

int wf_openmp(void) { return 0; }
#endif
