// CUDA C++ run on the CPU, for tests (tests/cuda_emu): the built-ins engine/ops/csrc/*.cu
// use, over one OS thread. Each CUDA thread of a block is a fiber with a stack of its own
// (started by makecontext, switched by _setjmp/_longjmp: no system call a switch); a
// block's fibers run until each finishes or waits at a barrier, and a barrier lets its
// fibers go on once every fiber it concerns is there. __syncthreads() concerns the block's
// fibers still running; a warp shuffle the lanes of its warp still running (each lane's
// value is posted, then read once all are). Blocks run one after another, so a kernel's
// __shared__ arrays are its function's statics. What CUDA would refuse is an error the
// launch returns (wf_emu_error): a grid or block past the hardware's limits, fibers
// waiting at different barriers (a deadlock on a GPU), lanes at different shuffles, or a
// shuffle reading a lane that has returned.
#pragma once

#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

namespace wf_emu {

struct Dim3 {
    unsigned x, y, z;
};

enum State { FRESH, READY, AT_BLOCK, AT_WARP, DONE };

using Jump = jmp_buf;

constexpr int MAX_THREADS = 1024;
constexpr size_t STACK_BYTES = 128 * 1024;

// The fibers, a block's threads, by index: what each switch touches in arrays of their own
// (a few cache lines for a warp), the rest apart.
inline State state[MAX_THREADS];
inline int shuffles[MAX_THREADS];  // posted so far: shuffle k posts to slot k % 2
inline int site[MAX_THREADS];      // the source line of the shuffle it waits at
inline Dim3 tid[MAX_THREADS];
inline Jump at[MAX_THREADS];  // where it waits
inline ucontext_t start[MAX_THREADS];  // its first entry (then it runs block after block)
inline char* stack[MAX_THREADS];

inline Dim3 grid_dim{1, 1, 1}, block_dim{1, 1, 1}, block_idx{0, 0, 0};
inline int current = 0, count = 0;
inline int running = 0, at_block = 0;  // the block's fibers not done, and those waiting
inline int warp_running[MAX_THREADS / 32], at_warp[MAX_THREADS / 32];
inline Jump scheduler;
inline const std::function<void()>* body = nullptr;
inline std::string error;
inline uint32_t slots[2][MAX_THREADS];
inline bool deadlock = false;

inline void fail(const std::string& why) {
    if (error.empty()) error = why;
}

inline void release(int lo, int hi, State from) {
    for (int i = lo; i < hi; ++i)
        if (state[i] == from) state[i] = READY;
}

// Release what the fibers' states allow: the block's barrier once every running fiber is
// there, a warp's once every running lane of it is.
inline void settle(int warp) {
    if (at_warp[warp] && at_warp[warp] == warp_running[warp]) {
        int lo = warp * 32, hi = std::min(lo + 32, count), first = -1;
        for (int i = lo; i < hi; ++i) {
            if (state[i] != AT_WARP) continue;
            if (first < 0) first = i;
            if (shuffles[i] != shuffles[first] || site[i] != site[first])
                fail("lanes of one warp at different shuffles (lines " +
                     std::to_string(site[first]) + " and " + std::to_string(site[i]) + ")");
        }
        release(lo, hi, AT_WARP);
        at_warp[warp] = 0;
    }
    if (at_block && at_block == running) {
        release(0, count, AT_BLOCK);
        at_block = 0;
    }
}

// From a fiber that waits or is done: on to the next ready fiber, round robin, or back to
// the scheduler when none is (the block done, or a deadlock).
[[noreturn]] inline void dispatch() {
    for (int step = 1; step <= count; ++step) {
        int i = current + step < count ? current + step : current + step - count;
        if (state[i] == READY || state[i] == FRESH) {
            current = i;
            if (state[i] == FRESH) {
                state[i] = READY;
                setcontext(&start[i]);
            }
            _longjmp(at[i], 1);
        }
    }
    deadlock = running > 0;
    _longjmp(scheduler, 1);
}

inline void wait(State barrier) {  // in a fiber: until the barrier releases it
    int f = current;
    state[f] = barrier;
    if (barrier == AT_WARP)
        ++at_warp[f / 32];
    else
        ++at_block;
    settle(f / 32);
    if (!_setjmp(at[f])) dispatch();
}

inline void fiber_main() {
    for (;;) {
        (*body)();
        int f = current;
        state[f] = DONE;
        --running;
        --warp_running[f / 32];
        settle(f / 32);
        if (!_setjmp(at[f])) dispatch();  // back here for the next block
    }
}

inline void restart(int f) {  // its next run starts at fiber_main
    getcontext(&start[f]);
    start[f].uc_stack.ss_sp = stack[f];
    start[f].uc_stack.ss_size = STACK_BYTES;
    start[f].uc_link = nullptr;
    makecontext(&start[f], fiber_main, 0);
    state[f] = FRESH;
}

inline void ready_fibers() {
    for (int i = 0; i < count; ++i) {
        if (!stack[i]) {
            stack[i] = static_cast<char*>(std::malloc(STACK_BYTES));
            restart(i);
        } else if (state[i] != FRESH) {
            state[i] = READY;
        }
        tid[i] = {i % block_dim.x, (i / block_dim.x) % block_dim.y, i / (block_dim.x * block_dim.y)};
        shuffles[i] = 0;
    }
    running = count;
    at_block = 0;
    for (int w = 0; w * 32 < count; ++w) {
        warp_running[w] = std::min(32, count - w * 32);
        at_warp[w] = 0;
    }
}

inline bool run_block() {
    ready_fibers();
    current = count - 1;  // dispatch starts at fiber 0
    deadlock = false;
    if (!_setjmp(scheduler)) dispatch();
    if (!deadlock) return true;
    fail("a deadlock: threads wait at different barriers (__syncthreads or a shuffle) that "
         "cannot all be passed");
    for (int i = 0; i < count; ++i)  // those stuck start over in the next launch
        if (state[i] != DONE) restart(i);
    return false;
}

// Runs `kernel` (a call of the kernel with its arguments) over the grid; 0 or 1 (error).
inline int launch(const unsigned* dims, const std::function<void()>& kernel) {
    error.clear();
    grid_dim = {dims[0], dims[1], dims[2]};
    block_dim = {dims[3], dims[4], dims[5]};
    long long threads = (long long)block_dim.x * block_dim.y * block_dim.z;
    if (threads < 1 || threads > MAX_THREADS || block_dim.z > 64)
        fail("a block of " + std::to_string(threads) + " threads (CUDA: 1 to 1024, z <= 64)");
    if (grid_dim.x < 1 || grid_dim.y < 1 || grid_dim.z < 1 || grid_dim.x > 2147483647u ||
        grid_dim.y > 65535 || grid_dim.z > 65535)
        fail("a grid of (" + std::to_string(grid_dim.x) + ", " + std::to_string(grid_dim.y) +
             ", " + std::to_string(grid_dim.z) + ") blocks (CUDA: y and z at most 65535)");
    if (!error.empty()) return 1;
    count = (int)threads;
    body = &kernel;
    for (unsigned z = 0; z < grid_dim.z; ++z)
        for (unsigned y = 0; y < grid_dim.y; ++y)
            for (unsigned x = 0; x < grid_dim.x; ++x) {
                block_idx = {x, y, z};
                if (!run_block()) return 1;
            }
    return error.empty() ? 0 : 1;
}

inline float half_to_float(unsigned short h) {
    _Float16 v;
    std::memcpy(&v, &h, 2);
    return (float)v;
}

inline unsigned short float_to_half(float f) {  // to nearest, ties to even (cvt.rn)
    _Float16 v = (_Float16)f;
    unsigned short h;
    std::memcpy(&h, &v, 2);
    return h;
}

template <typename T>
inline T shfl_xor(int line, T v, int lane_mask, int width = 32) {
    static_assert(sizeof(T) == 4, "a shuffle of 4-byte values only");
    if (width != 32) fail("a shuffle narrower than the warp (not emulated)");
    int f = current;
    int parity = shuffles[f] & 1;
    std::memcpy(&slots[parity][f], &v, 4);
    ++shuffles[f];
    site[f] = line;
    wait(AT_WARP);
    int src = (f & ~31) | ((f & 31) ^ (lane_mask & 31));
    bool posted = src < count && shuffles[src] >= shuffles[f];
    if (!posted) fail("a shuffle read a lane that returned before it");
    T out;
    std::memcpy(&out, &slots[parity][posted ? src : f], 4);
    return out;
}

}  // namespace wf_emu

struct alignas(8) uint2 {
    unsigned int x, y;
};
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};

#define __global__
#define __device__ static
#define __forceinline__ inline
#define __shared__ static
#define __constant__ static const
#define threadIdx (wf_emu::tid[wf_emu::current])
#define blockIdx (wf_emu::block_idx)
#define blockDim (wf_emu::block_dim)
#define gridDim (wf_emu::grid_dim)

inline void __syncthreads() { wf_emu::wait(wf_emu::AT_BLOCK); }

// the line it is called on: lanes of a warp at shuffles of two lines are an error
#define __shfl_xor_sync(mask, ...) wf_emu::shfl_xor(__LINE__, __VA_ARGS__)

inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}

inline float __uint_as_float(unsigned int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}

template <typename A, typename B>
inline std::common_type_t<A, B> min(A a, B b) {
    return b < a ? b : a;
}

template <typename A, typename B>
inline std::common_type_t<A, B> max(A a, B b) {
    return a < b ? b : a;
}
