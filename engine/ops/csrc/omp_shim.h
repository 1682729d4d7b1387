/* OpenMP's calls where the compiler has OpenMP, else their one-thread values: built without
   -fopenmp (Apple's clang has none) the kernels' parallel regions and loops run on the
   calling thread alone, with the same bits (no kernel's result depends on its threads). */
#ifndef WARMFLEET_OMP_SHIM_H
#define WARMFLEET_OMP_SHIM_H

#ifdef _OPENMP
#include <omp.h>
#else
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
#endif

#endif
