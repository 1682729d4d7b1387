/* attention.c's kernels over a q8_0 KV pool (kv_q8.h): wf_paged_rows_q8 and
   wf_paged_rows_with_q8, the same arguments with k and v blocks of 32 values (each value
   widened to float32, d * q, as it is loaded; the same arithmetic after). */
#define KV_KIND 2
#include "attention.c"
