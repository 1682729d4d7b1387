/* attention.c's kernels over a float16 KV pool: wf_paged_rows_f16 and
   wf_paged_rows_with_f16, the same arguments with k and v float16 (each value widened to
   float32 as it is loaded; the same arithmetic after). */
#define KV_KIND 1
#include "attention.c"
