/* attention.c's forms for AVX2 and NEON, where its 16-lane vectors are pairs or quarters of
   registers: scores, masks and value weighing by 8-lane halves (AVX2) or 4-lane quarters
   (NEON). Part of attention.c, included once per KV kind after its loaders (KV8, KV4). */

#if WF_AVX2
/* AVX2 (16 registers of 8 lanes; a 16-lane vector is two and the forms below spilled:
   attention 4-5x slower than built for AVX-512). Every 16-lane accumulator is two 8-lane
   halves, each lane on its own: the same multiplies and multiply-adds per lane in the same
   order, and the lanes joined by the same tree (lo + hi is its first level), so the same
   bits as the 16-lane forms (test_avx2_build). */

/* 8 keys' scores from their accumulators' lo + hi: the rest of hsum's tree (lane i + 4,
   then i + 2, then i + 1) for the 8 at once, in key order. */
INLINE __m256 tree8(const __m256 t[8]) {
    __m256 u[4], v[2];
    for (int i = 0; i < 4; i++)
        u[i] = _mm256_add_ps(_mm256_permute2f128_ps(t[2 * i], t[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(t[2 * i], t[2 * i + 1], 0x31));
    for (int i = 0; i < 2; i++) /* 128-bit lane l: keys 4i + l and 4i + l + 2 */
        v[i] = _mm256_add_ps(_mm256_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 r = _mm256_add_ps(_mm256_shuffle_ps(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm256_shuffle_ps(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* keep_scores on the 16 scores at sc, by 8-lane halves: the same masks, maxima and stores
   (its 16-lane form went through the stack piece by piece here). */
INLINE void keep_scores8(const float *sc, int64_t j, int64_t b, int64_t nb, int64_t n,
                         int64_t lo, v16f *top, float *p, int64_t padded) {
    float *t = (float *)(top + j), *to = p + j * padded + b * BLOCK;
    for (int h = 0; h < 2; h++) {
        __m256 s = _mm256_loadu_ps(sc + 8 * h);
        __m256i key = _mm256_add_epi32(_mm256_set1_epi32((int32_t)(b * BLOCK) + 8 * h),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        if (b == nb - 1) /* keys past the row's length */
            s = _mm256_blendv_ps(s, _mm256_set1_ps(-INFINITY), _mm256_castsi256_ps(
                _mm256_cmpgt_epi32(key, _mm256_set1_epi32((int32_t)n - 1))));
        if (b * BLOCK < lo) /* keys the window has left behind */
            s = _mm256_blendv_ps(s, _mm256_set1_ps(-INFINITY), _mm256_castsi256_ps(
                _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)lo), key)));
        _mm256_storeu_ps(t + 8 * h, _mm256_max_ps(s, _mm256_loadu_ps(t + 8 * h)));
        _mm256_storeu_ps(to + 8 * h, s);
    }
}

/* One head's scores of the 16 keys at kb (its scaled query at qj, D = 16 nv floats) into
   sc: 4 keys at a time, their accumulators' halves in 8 registers, each part of the query
   loaded once for the 4; the first part a product, the rest multiply-adds, as score_block.
   Not inlined, with nv a variable: one copy (inlined in every specialised task the build
   took minutes, past the library's compile timeout). */
static __attribute__((noinline)) void head_scores(const float *qj, const kv_t *kb, int64_t nv,
                                                  float *sc) {
    int64_t row = ROW(16 * nv);
    __m256 t[16];
    for (int s0 = 0; s0 < 16; s0 += 4) {
        const kv_t *key = kb + s0 * row;
        __m256 lo[4], hi[4], ql = _mm256_loadu_ps(qj), qh = _mm256_loadu_ps(qj + 8);
        for (int s = 0; s < 4; s++) {
            lo[s] = _mm256_mul_ps(ql, KV8(key + s * row, 0));
            hi[s] = _mm256_mul_ps(qh, KV8(key + s * row, 1));
        }
        for (int64_t c = 1; c < nv; c++) {
            ql = _mm256_loadu_ps(qj + 16 * c);
            qh = _mm256_loadu_ps(qj + 16 * c + 8);
            for (int s = 0; s < 4; s++) {
                lo[s] = _mm256_fmadd_ps(ql, KV8(key + s * row, 2 * c), lo[s]);
                hi[s] = _mm256_fmadd_ps(qh, KV8(key + s * row, 2 * c + 1), hi[s]);
            }
        }
        for (int s = 0; s < 4; s++) t[s0 + s] = _mm256_add_ps(lo[s], hi[s]);
    }
    _mm256_storeu_ps(sc, tree8(t));
    _mm256_storeu_ps(sc + 8, tree8(t + 8));
}

/* n (a constant) 8-float pieces, from piece0 on, of one head's accumulator += values s0 ..
   keys - 1 (vectors stride kv_t apart at v) weighted by w[s]: the pieces in registers,
   each weight broadcast once for them; each lane's multiply-adds in key order, as
   weigh_block's. */
INLINE void weigh_pieces(int n, float *acc, const kv_t *v, int64_t piece0, int64_t stride,
                         int64_t s0, int64_t keys, const float *w) {
    __m256 a[8];
    for (int u = 0; u < n; u++) a[u] = _mm256_loadu_ps(acc + 8 * u);
    for (int64_t s = s0; s < keys; s++) {
        __m256 ws = _mm256_set1_ps(w[s]);
        for (int u = 0; u < n; u++)
            a[u] = _mm256_fmadd_ps(ws, KV8(v + s * stride, piece0 + u), a[u]);
    }
    for (int u = 0; u < n; u++) _mm256_storeu_ps(acc + 8 * u, a[u]);
}

#define LANES 8  /* a piece's floats */
#define PIECES 8 /* pieces weigh_head keeps in registers */
#elif WF_NEON
/* NEON (32 registers of 4 lanes; a 16-lane vector is four and the forms below spilled):
   every 16-lane accumulator is four 4-lane quarters, each lane on its own: the same
   multiplies and multiply-adds per lane in the same order, and the lanes joined by the same
   tree (quarters 0 + 2 and 1 + 3, then their sum, then lanes 0 + 2 and 1 + 3, then theirs),
   so the same bits as the 16-lane forms (test_neon_build). */

/* One head's scores of the 16 keys at kb (its scaled query at qj, D = 16 nv floats) into
   sc: 4 keys at a time, their accumulators' quarters in 16 registers, each quarter of the
   query loaded once for the 4; the first part a product, the rest multiply-adds, as
   score_block. Not inlined, with nv a variable: one copy, as AVX2's. */
static __attribute__((noinline)) void head_scores(const float *qj, const kv_t *kb, int64_t nv,
                                                  float *sc) {
    int64_t row = ROW(16 * nv);
    for (int s0 = 0; s0 < 16; s0 += 4) {
        const kv_t *key = kb + s0 * row;
        float32x4_t a[4][4];
        for (int q = 0; q < 4; q++) {
            float32x4_t qq = vld1q_f32(qj + 4 * q);
            for (int s = 0; s < 4; s++) a[s][q] = vmulq_f32(qq, KV4(key + s * row, q));
        }
        for (int64_t c = 1; c < nv; c++)
            for (int q = 0; q < 4; q++) {
                float32x4_t qq = vld1q_f32(qj + 16 * c + 4 * q);
                for (int s = 0; s < 4; s++)
                    a[s][q] = vfmaq_f32(a[s][q], qq, KV4(key + s * row, 4 * c + q));
            }
        for (int s = 0; s < 4; s++) {
            float32x4_t t = vaddq_f32(vaddq_f32(a[s][0], a[s][2]), vaddq_f32(a[s][1], a[s][3]));
            sc[s0 + s] = (vgetq_lane_f32(t, 0) + vgetq_lane_f32(t, 2)) +
                         (vgetq_lane_f32(t, 1) + vgetq_lane_f32(t, 3));
        }
    }
}

/* n (a constant) 4-float pieces, from piece0 on, of one head's accumulator += values s0 ..
   keys - 1 (vectors stride kv_t apart at v) weighted by w[s], as AVX2's weigh_pieces. */
INLINE void weigh_pieces(int n, float *acc, const kv_t *v, int64_t piece0, int64_t stride,
                         int64_t s0, int64_t keys, const float *w) {
    float32x4_t a[16];
    for (int u = 0; u < n; u++) a[u] = vld1q_f32(acc + 4 * u);
    for (int64_t s = s0; s < keys; s++) {
        float32x4_t ws = vdupq_n_f32(w[s]);
        for (int u = 0; u < n; u++) a[u] = vfmaq_f32(a[u], ws, KV4(v + s * stride, piece0 + u));
    }
    for (int u = 0; u < n; u++) vst1q_f32(acc + 4 * u, a[u]);
}

#define LANES 4  /* a piece's floats */
#define PIECES 16 /* pieces weigh_head keeps in registers */
#endif
#if WF_AVX2 || WF_NEON
/* One head's accumulator (16 nv floats at acc) += values s0 .. keys - 1 at vb weighted by
   w[s], PIECES pieces at a time (a multiple of a quarter of them: D is a multiple of 16). */
static __attribute__((noinline)) void weigh_head(float *acc, const kv_t *vb, int64_t s0,
                                                 int64_t keys, const float *w, int64_t nv) {
    int64_t pieces = 16 / LANES * nv, stride = ROW(16 * nv);
    for (int64_t u = 0; u < pieces; u += PIECES) {
        float *at = acc + LANES * u;
        switch (pieces - u < PIECES ? pieces - u : PIECES) {
        case PIECES: weigh_pieces(PIECES, at, vb, u, stride, s0, keys, w); break;
        case 3 * PIECES / 4: weigh_pieces(3 * PIECES / 4, at, vb, u, stride, s0, keys, w); break;
        case PIECES / 2: weigh_pieces(PIECES / 2, at, vb, u, stride, s0, keys, w); break;
        default: weigh_pieces(PIECES / 4, at, vb, u, stride, s0, keys, w);
        }
    }
}

#if WF_AVX2
/* H heads x P 8-float pieces (from piece u0) of accumulators in registers (a head's
   acc_stride floats after the last's, its weights w_stride after), += values s0 .. keys - 1
   weighted: each value piece loaded, and widened, once for the H heads, where weigh_head
   loads it once per head. Per lane the same multiply-adds in key order. */
INLINE void weigh_tile(int H, int P, float *acc, int64_t acc_stride, const float *w,
                       int64_t w_stride, const kv_t *v, int64_t u0, int64_t stride, int64_t s0,
                       int64_t keys) {
    __m256 a[12];
    for (int h = 0; h < H; h++)
        for (int q = 0; q < P; q++) a[h * P + q] = _mm256_loadu_ps(acc + h * acc_stride + 8 * (u0 + q));
    for (int64_t s = s0; s < keys; s++)
        for (int q = 0; q < P; q++) {
            __m256 value = KV8(v + s * stride, u0 + q);
            for (int h = 0; h < H; h++)
                a[h * P + q] = _mm256_fmadd_ps(_mm256_broadcast_ss(w + h * w_stride + s), value,
                                               a[h * P + q]);
        }
    for (int h = 0; h < H; h++)
        for (int q = 0; q < P; q++) _mm256_storeu_ps(acc + h * acc_stride + 8 * (u0 + q), a[h * P + q]);
}

/* weigh_head for m heads (as weigh_tile lays them out), up to 12 accumulators at once: 12
   heads x 1 piece, 6 x 2, 3 x 4 or 2 x 4; a head left alone, or pieces that do not divide,
   by weigh_head. */
static __attribute__((noinline)) void weigh_heads(int64_t m, float *acc, int64_t acc_stride,
                                                  const float *w, int64_t w_stride,
                                                  const kv_t *vb, int64_t s0, int64_t keys,
                                                  int64_t nv) {
    int64_t pieces = 2 * nv, stride = ROW(16 * nv);
    for (int64_t h = 0; h < m;) {
        int64_t left = m - h;
        int H = left >= 12 ? 12 : left >= 6 ? 6 : left >= 3 ? 3 : left >= 2 ? 2 : 1;
        int P = H == 12 ? 1 : H == 6 ? 2 : 4;
        float *at = acc + h * acc_stride;
        const float *wt = w + h * w_stride;
        if (H == 1 || pieces % P) {
            for (int i = 0; i < H; i++)
                weigh_head(at + i * acc_stride, vb, s0, keys, wt + i * w_stride, nv);
        } else {
            for (int64_t u = 0; u < pieces; u += P) switch (H) {
                case 12: weigh_tile(12, 1, at, acc_stride, wt, w_stride, vb, u, stride, s0, keys); break;
                case 6: weigh_tile(6, 2, at, acc_stride, wt, w_stride, vb, u, stride, s0, keys); break;
                case 3: weigh_tile(3, 4, at, acc_stride, wt, w_stride, vb, u, stride, s0, keys); break;
                default: weigh_tile(2, 4, at, acc_stride, wt, w_stride, vb, u, stride, s0, keys);
                }
        }
        h += H;
    }
}
#endif
#endif
