/* Runs one of the engine's C kernels on inputs read from a file and writes its outputs, so
   that a build for another machine (aarch64 under qemu-aarch64) can be checked against the
   native build bit for bit (tests/unit/test_neon_build.py writes the inputs).

     kernel_driver matmul IN OUT   wf_matmul (the decoded quantized matrices, qmatmul.c)
     kernel_driver expert IN OUT   wf_expert_matmul_as
     kernel_driver attention IN OUT   wf_paged_rows_windowed (float32), _f16 or _q8 by the
                                      pool's kind, with a window and sinks where asked
     kernel_driver silu IN OUT        wf_silu_mul (its e^x: exp16's 4-lane form on NEON)
     kernel_driver rms_norm IN OUT    wf_rms_norm

   IN, little-endian: an int64 header, then the arrays in the order below; OUT: the float32
   outputs. Exit status 0, or 1 with a message on stderr. Prints the threads the kernels'
   own pool started (par.h: none where built with OpenMP). */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int wf_pool_threads(void);
int64_t wf_expert_matmul_as(int products, int qtype, const uint8_t *w, int64_t expert_bytes,
                            int64_t n, int64_t k, const float *x, int64_t x_stride,
                            const int64_t *rows, const int64_t *starts, int64_t num_experts,
                            float *out, int64_t out_stride, int threads);
typedef int64_t (*Rows)(const float *q, const void *k, const void *v, const int32_t *tables,
                        int64_t max_blocks, const int32_t *lengths, int64_t num_rows,
                        int64_t num_heads, int64_t num_kv_heads, int64_t dim, float scale,
                        float *out, int num_threads, int64_t window, const float *sinks);
int64_t wf_paged_rows_windowed(const float *q, const void *k, const void *v,
                               const int32_t *tables, int64_t max_blocks, const int32_t *lengths,
                               int64_t num_rows, int64_t num_heads, int64_t num_kv_heads,
                               int64_t dim, float scale, float *out, int num_threads,
                               int64_t window, const float *sinks);
int64_t wf_paged_rows_windowed_f16(const float *q, const void *k, const void *v,
                                   const int32_t *tables, int64_t max_blocks,
                                   const int32_t *lengths, int64_t num_rows, int64_t num_heads,
                                   int64_t num_kv_heads, int64_t dim, float scale, float *out,
                                   int num_threads, int64_t window, const float *sinks);
int64_t wf_paged_rows_windowed_q8(const float *q, const void *k, const void *v,
                                  const int32_t *tables, int64_t max_blocks,
                                  const int32_t *lengths, int64_t num_rows, int64_t num_heads,
                                  int64_t num_kv_heads, int64_t dim, float scale, float *out,
                                  int num_threads, int64_t window, const float *sinks);

int64_t wf_matmul(int kind, int gshift, const uint8_t *codes, const void *scale,
                  const void *offset, int64_t n_rows, int64_t k, const float *x, int64_t m_rows,
                  float *out, int64_t ldo, int num_threads);

void wf_silu_mul(const float *gate_up, int64_t rows, int64_t ffn, float *out, int threads);
void wf_rms_norm(const float *x, const float *w, float eps, int64_t rows, int64_t dim,
                 float *out, int threads);

typedef struct {
    const uint8_t *at, *end;
} Reader;

static const void *take(Reader *r, int64_t bytes) {
    if (bytes < 0 || r->end - r->at < bytes) {
        fprintf(stderr, "kernel_driver: input too short\n");
        exit(1);
    }
    const void *p = r->at;
    r->at += bytes;
    return p;
}

static int write_out(const char *path, const float *out, int64_t count) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(out, sizeof(float), count, f) != (size_t)count || fclose(f)) {
        fprintf(stderr, "kernel_driver: cannot write %s\n", path);
        return 1;
    }
    return 0;
}

/* header: kind, gshift, n, k, m_rows, threads, and the bytes of codes, scale and offset;
   then those, and x [m_rows, k] float32 */
static int matmul(Reader *r, const char *out_path) {
    const int64_t *h = take(r, 9 * 8);
    int64_t n = h[2], k = h[3], m = h[4];
    const uint8_t *codes = take(r, h[6]);
    const void *scale = take(r, h[7]), *offset = take(r, h[8]);
    const float *x = take(r, 4 * m * k);
    float *out = calloc(m * n + 1, sizeof(float));
    if (wf_matmul((int)h[0], (int)h[1], codes, scale, offset, n, k, x, m, out, n, (int)h[5])) {
        fprintf(stderr, "kernel_driver: wf_matmul refused its scratch\n");
        return 1;
    }
    return write_out(out_path, out, m * n);
}

/* header: products, qtype, experts, expert_bytes, n, k, x_rows, pairs, threads; then the
   weights, x [x_rows, k] float32, rows [pairs] int64, starts [experts + 1] int64 */
static int expert(Reader *r, const char *out_path) {
    const int64_t *h = take(r, 9 * 8);
    int64_t e = h[2], eb = h[3], n = h[4], k = h[5], x_rows = h[6], pairs = h[7];
    const uint8_t *w = take(r, e * eb);
    const float *x = take(r, 4 * x_rows * k);
    const int64_t *rows = take(r, 8 * pairs), *starts = take(r, 8 * (e + 1));
    float *out = calloc(pairs * n + 1, sizeof(float));
    int64_t done = wf_expert_matmul_as((int)h[0], (int)h[1], w, eb, n, k, x, k, rows, starts,
                                       e, out, n, (int)h[8]);
    if (done) {
        fprintf(stderr, "kernel_driver: wf_expert_matmul_as returned %lld\n", (long long)done);
        return 1;
    }
    return write_out(out_path, out, pairs * n);
}

/* header: kind (0 float32, 1 float16, 2 q8_0), rows, heads, kv_heads, dim, max_blocks,
   pool_bytes (each of k and v), threads, scale (a float32 in the low half); then q [rows,
   heads * dim] float32, k and v pools, tables [rows, max_blocks] int32, lengths [rows] int32 */
static int attention(Reader *r, const char *out_path) {
    const int64_t *h = take(r, 11 * 8); /* h[8]: the scale; h[9] the window, h[10] sinks */
    int64_t rows = h[1], heads = h[2], kv_heads = h[3], dim = h[4], max_blocks = h[5];
    float scale;
    memcpy(&scale, h + 8, sizeof scale);
    const float *q = take(r, 4 * rows * heads * dim);
    const void *k = take(r, h[6]), *v = take(r, h[6]);
    const int32_t *tables = take(r, 4 * rows * max_blocks), *lengths = take(r, 4 * rows);
    const float *sinks = h[10] ? take(r, 4 * heads) : NULL;
    float *out = calloc(rows * heads * dim + 1, sizeof(float));
    Rows fn = h[0] == 0   ? wf_paged_rows_windowed
              : h[0] == 1 ? wf_paged_rows_windowed_f16
                          : wf_paged_rows_windowed_q8;
    if (fn(q, k, v, tables, max_blocks, lengths, rows, heads, kv_heads, dim, scale, out,
           (int)h[7], h[9], sinks)) {
        fprintf(stderr, "kernel_driver: the attention kernel refused its scratch\n");
        return 1;
    }
    return write_out(out_path, out, rows * heads * dim);
}

/* header: rows, ffn; then gate_up [rows, 2 * ffn] float32 */
static int silu(Reader *r, const char *out_path) {
    const int64_t *h = take(r, 2 * 8);
    const float *gate_up = take(r, 4 * 2 * h[0] * h[1]);
    float *out = calloc(h[0] * h[1] + 1, sizeof(float));
    wf_silu_mul(gate_up, h[0], h[1], out, 2); /* a long chunk's rows split */
    return write_out(out_path, out, h[0] * h[1]);
}

/* header: rows, dim; then x [rows, dim] and w [dim] float32 (eps 1e-5) */
static int rms_norm(Reader *r, const char *out_path) {
    const int64_t *h = take(r, 2 * 8);
    const float *x = take(r, 4 * h[0] * h[1]), *w = take(r, 4 * h[1]);
    float *out = calloc(h[0] * h[1] + 1, sizeof(float));
    wf_rms_norm(x, w, 1e-5f, h[0], h[1], out, 2);
    return write_out(out_path, out, h[0] * h[1]);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: kernel_driver matmul|expert|attention|silu|rms_norm IN OUT\n");
        return 1;
    }
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        fprintf(stderr, "kernel_driver: cannot read %s\n", argv[2]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *data = malloc(size + 1);
    if (!data || fread(data, 1, size, f) != (size_t)size) return 1;
    fclose(f);
    Reader r = {data, data + size};
    int status = !strcmp(argv[1], "matmul")      ? matmul(&r, argv[3])
                 : !strcmp(argv[1], "expert")    ? expert(&r, argv[3])
                 : !strcmp(argv[1], "attention") ? attention(&r, argv[3])
                 : !strcmp(argv[1], "silu")      ? silu(&r, argv[3])
                 : !strcmp(argv[1], "rms_norm")  ? rms_norm(&r, argv[3])
                                                 : -1;
    if (status < 0) {
        fprintf(stderr, "kernel_driver: unknown kernel %s\n", argv[1]);
        return 1;
    }
    printf("pool threads: %d\n", wf_pool_threads());
    return status;
}
