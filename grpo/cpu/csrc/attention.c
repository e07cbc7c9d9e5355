/* grpo's causal self-attention for short sequences on the CPU (float32, AVX-512), forward and backward, for the
 * update's forward+backward passes (grpo/modeling/native_attention.py, `train.attention_kernel`).
 *
 * Why: at the update's lengths (tens to a few hundred tokens) torch's CPU flash-attention kernel ran at ~95
 * GFLOP/s on the 2-core AMD EPYC (Zen 5) host, qwen2-100m's [4, 12, 88, 64] heads, a sixth of the GEMM peak. Here a
 * task is one (batch row, key/value head) with all the query heads that share it (grouped-query attention): K and
 * V are transposed once per task into [D][S] panels, and every product is a broadcast multiply-add over 16 keys or
 * 16 head dimensions at a time, four query rows per register block.
 *
 * Layout: q [B, Hq, T, D], k / v [B, Hk, T, D] with any strides for batch, head and position (head dimension
 * contiguous); the mask, when given, is a [B, T, T] byte array (1 = may attend), else causal. Outputs: o
 * [B, T, Hq, D] contiguous (the layout the output projection reads), lse [B, Hq, T] (log-sum-exp of the scaled,
 * masked scores; +inf for a row with no allowed key, whose output and gradients are 0).
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "simd_exp.h"

#define LANES 16
#define QB 4 /* query rows per register block */

typedef struct {
    long b, hq, hk, t, d;
    long qs[3], ks[3], vs[3]; /* strides (elements) of batch, head, position */
} shape_t;

/* src rows [t][d] (row stride `stride`) -> dst [d][sp], positions past t zero. */
static void transpose_in(const float *src, long stride, long t, long d, long sp, float *dst) {
    for (long j = 0; j < sp; j++)
        for (long c = 0; c < d; c++) dst[c * sp + j] = j < t ? src[j * stride + c] : 0.0f;
}

/* Keys row i may attend: [0, *end) with allowed[j] (mask row, or NULL: causal, end = i + 1). */
static inline long key_end(long i, long t, const unsigned char *mrow) { return mrow ? t : i + 1; }

/* s[r][j] = scale q_r . k_j for rows r < rows of a block, keys j < end (end padded up to 16), masked to -inf. */
static void block_scores(const float *const *qr, int rows, long d, const float *kt, long sp, long end, float scale,
                         const unsigned char *const *mrow, const long *row_i, float *s) {
    long endp = (end + LANES - 1) / LANES * LANES;
    for (long j = 0; j < endp; j += LANES) {
        __m512 acc[QB];
        for (int r = 0; r < QB; r++) acc[r] = _mm512_setzero_ps();
        for (long c = 0; c < d; c++) {
            __m512 kv = _mm512_loadu_ps(kt + c * sp + j);
            for (int r = 0; r < rows; r++) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(qr[r][c]), kv, acc[r]);
        }
        for (int r = 0; r < rows; r++) {
            __m512 v = _mm512_mul_ps(acc[r], _mm512_set1_ps(scale));
            __mmask16 ok = 0;
            for (int l = 0; l < LANES; l++) {
                long key = j + l;
                int allowed = mrow[r] ? (key < end && mrow[r][key]) : (key <= row_i[r]);
                ok |= (__mmask16)(allowed << l);
            }
            _mm512_storeu_ps(s + r * sp + j, _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), ok, v));
        }
    }
}

static void fill_shape(shape_t *sh, const long *dims, const long *qs, const long *ks, const long *vs) {
    sh->b = dims[0]; sh->hq = dims[1]; sh->hk = dims[2]; sh->t = dims[3]; sh->d = dims[4];
    for (int i = 0; i < 3; i++) { sh->qs[i] = qs[i]; sh->ks[i] = ks[i]; sh->vs[i] = vs[i]; }
}

/* Forward. dims = {B, Hq, Hk, T, D}. Returns 0, or -1 when a work buffer could not be allocated. */
int grpo_attention_forward(const float *q, const float *k, const float *v, const long *dims, const long *qs,
                           const long *ks, const long *vs, const unsigned char *mask, float scale, float *o,
                           float *lse) {
    shape_t sh;
    fill_shape(&sh, dims, qs, ks, vs);
    long t = sh.t, d = sh.d, sp = (t + LANES - 1) / LANES * LANES, group = sh.hq / sh.hk;
    int failed = 0;
#pragma omp parallel
    {
        float *kt = malloc(sizeof(float) * (size_t)(d * sp + QB * sp));
        if (!kt) failed = 1;
#pragma omp for schedule(static) collapse(2)
        for (long b = 0; b < sh.b; b++)
            for (long hk = 0; hk < sh.hk; hk++) {
                if (!kt) continue;
                float *s = kt + d * sp;
                transpose_in(k + b * sh.ks[0] + hk * sh.ks[1], sh.ks[2], t, d, sp, kt);
                const float *vb = v + b * sh.vs[0] + hk * sh.vs[1];
                for (long hq = hk * group; hq < (hk + 1) * group; hq++) {
                    const float *qb = q + b * sh.qs[0] + hq * sh.qs[1];
                    for (long i0 = 0; i0 < t; i0 += QB) {
                        int rows = t - i0 < QB ? (int)(t - i0) : QB;
                        const float *qr[QB];
                        const unsigned char *mr[QB];
                        long ri[QB], end = 0;
                        for (int r = 0; r < QB; r++) {
                            long i = i0 + (r < rows ? r : 0);
                            qr[r] = qb + i * sh.qs[2];
                            mr[r] = mask ? mask + (b * t + i) * t : NULL;
                            ri[r] = i;
                            long e = key_end(i, t, mr[r]);
                            if (e > end) end = e;
                        }
                        block_scores(qr, rows, d, kt, sp, end, scale, mr, ri, s);
                        for (int r = 0; r < rows; r++) {
                            float *sr = s + r * sp;
                            long i = i0 + r;
                            float m = -INFINITY;
                            for (long j = 0; j < end; j++) m = sr[j] > m ? sr[j] : m;
                            float *out = o + ((b * t + i) * sh.hq + hq) * d;
                            if (m == -INFINITY) {               /* no key allowed: output 0 */
                                memset(out, 0, sizeof(float) * d);
                                lse[(b * sh.hq + hq) * t + i] = INFINITY;
                                continue;
                            }
                            __m512 mv = _mm512_set1_ps(m), sum = _mm512_setzero_ps();
                            long endp = (end + LANES - 1) / LANES * LANES;
                            for (long j = 0; j < endp; j += LANES) {
                                __m512 p = exp16(_mm512_sub_ps(_mm512_loadu_ps(sr + j), mv));
                                _mm512_storeu_ps(sr + j, p);
                                sum = _mm512_add_ps(sum, p);
                            }
                            float l = _mm512_reduce_add_ps(sum);
                            lse[(b * sh.hq + hq) * t + i] = m + logf(l);
                            float inv = 1.0f / l;
                            for (long c = 0; c < d; c += LANES) {
                                __mmask16 km = d - c >= LANES ? 0xFFFF : (__mmask16)((1u << (d - c)) - 1u);
                                __m512 acc = _mm512_setzero_ps();
                                for (long j = 0; j < end; j++)
                                    acc = _mm512_fmadd_ps(_mm512_set1_ps(sr[j]),
                                                          _mm512_maskz_loadu_ps(km, vb + j * sh.vs[2] + c), acc);
                                _mm512_mask_storeu_ps(out + c, km, _mm512_mul_ps(acc, _mm512_set1_ps(inv)));
                            }
                        }
                    }
                }
            }
        free(kt);
    }
    return failed ? -1 : 0;
}

/* Backward. o and do_ [B, T, Hq, D] contiguous; dq [B, Hq, T, D], dk / dv [B, Hk, T, D] contiguous (written). */
int grpo_attention_backward(const float *q, const float *k, const float *v, const long *dims, const long *qs,
                            const long *ks, const long *vs, const unsigned char *mask, float scale, const float *o,
                            const float *do_, const float *lse, float *dq, float *dk, float *dv) {
    shape_t sh;
    fill_shape(&sh, dims, qs, ks, vs);
    long t = sh.t, d = sh.d, sp = (t + LANES - 1) / LANES * LANES, group = sh.hq / sh.hk;
    int failed = 0;
#pragma omp parallel
    {
        float *kt = malloc(sizeof(float) * (size_t)(2 * d * sp + 2 * QB * sp + QB));
        if (!kt) failed = 1;
#pragma omp for schedule(static) collapse(2)
        for (long b = 0; b < sh.b; b++)
            for (long hk = 0; hk < sh.hk; hk++) {
                if (!kt) continue;
                float *vt = kt + d * sp, *p = vt + d * sp, *dp = p + QB * sp, *delta = dp + QB * sp;
                const float *kb = k + b * sh.ks[0] + hk * sh.ks[1];
                transpose_in(kb, sh.ks[2], t, d, sp, kt);
                transpose_in(v + b * sh.vs[0] + hk * sh.vs[1], sh.vs[2], t, d, sp, vt);
                float *dkb = dk + (b * sh.hk + hk) * t * d, *dvb = dv + (b * sh.hk + hk) * t * d;
                memset(dkb, 0, sizeof(float) * t * d);
                memset(dvb, 0, sizeof(float) * t * d);
                for (long hq = hk * group; hq < (hk + 1) * group; hq++) {
                    const float *qb = q + b * sh.qs[0] + hq * sh.qs[1];
                    float *dqb = dq + (b * sh.hq + hq) * t * d;
                    for (long i0 = 0; i0 < t; i0 += QB) {
                        int rows = t - i0 < QB ? (int)(t - i0) : QB;
                        const float *qr[QB], *dor[QB];
                        const unsigned char *mr[QB];
                        long ri[QB], end = 0;
                        for (int r = 0; r < QB; r++) {
                            long i = i0 + (r < rows ? r : 0);
                            qr[r] = qb + i * sh.qs[2];
                            dor[r] = do_ + ((b * t + i) * sh.hq + hq) * d;
                            mr[r] = mask ? mask + (b * t + i) * t : NULL;
                            ri[r] = i;
                            long e = key_end(i, t, mr[r]);
                            if (e > end) end = e;
                            const float *orow = o + ((b * t + i) * sh.hq + hq) * d;
                            float dl = 0.0f;
                            for (long c = 0; c < d; c++) dl += dor[r][c] * orow[c];
                            delta[r] = dl;
                        }
                        long endp = (end + LANES - 1) / LANES * LANES;
                        block_scores(qr, rows, d, kt, sp, end, scale, mr, ri, p);     /* scores */
                        block_scores(dor, rows, d, vt, sp, end, 1.0f, mr, ri, dp);   /* dP = dO V^T (masked) */
                        for (int r = 0; r < rows; r++) {             /* P = e^(s - lse), dS = P (dP - delta) scale */
                            float l = lse[(b * sh.hq + hq) * t + i0 + r];
                            __m512 lv = _mm512_set1_ps(isinf(l) ? INFINITY : l), dl = _mm512_set1_ps(delta[r]);
                            for (long j = 0; j < endp; j += LANES) {
                                __m512 pv = isinf(l) ? _mm512_setzero_ps()
                                                     : exp16(_mm512_sub_ps(_mm512_loadu_ps(p + r * sp + j), lv));
                                __m512 dpv = _mm512_loadu_ps(dp + r * sp + j);
                                /* masked keys: s = -inf gives p = 0; dP there is -inf, so use p's zero */
                                __mmask16 live = _mm512_cmp_ps_mask(pv, _mm512_setzero_ps(), _CMP_NEQ_OQ);
                                __m512 ds = _mm512_maskz_mul_ps(live, pv, _mm512_sub_ps(dpv, dl));
                                _mm512_storeu_ps(p + r * sp + j, pv);
                                _mm512_storeu_ps(dp + r * sp + j, _mm512_mul_ps(ds, _mm512_set1_ps(scale)));
                            }
                        }
                        for (int r = 0; r < rows; r++) {             /* dQ_i = sum_j dS_ij K_j */
                            float *out = dqb + (i0 + r) * d;
                            for (long c = 0; c < d; c += LANES) {
                                __mmask16 km = d - c >= LANES ? 0xFFFF : (__mmask16)((1u << (d - c)) - 1u);
                                __m512 acc = _mm512_setzero_ps();
                                for (long j = 0; j < end; j++)
                                    acc = _mm512_fmadd_ps(_mm512_set1_ps(dp[r * sp + j]),
                                                          _mm512_maskz_loadu_ps(km, kb + j * sh.ks[2] + c), acc);
                                _mm512_mask_storeu_ps(out + c, km, acc);
                            }
                        }
                        for (long j = 0; j < end; j++) {             /* dK_j += dS_ij Q_i, dV_j += P_ij dO_i */
                            for (long c = 0; c < d; c += LANES) {
                                __mmask16 km = d - c >= LANES ? 0xFFFF : (__mmask16)((1u << (d - c)) - 1u);
                                __m512 ak = _mm512_maskz_loadu_ps(km, dkb + j * d + c);
                                __m512 av = _mm512_maskz_loadu_ps(km, dvb + j * d + c);
                                for (int r = 0; r < rows; r++) {
                                    ak = _mm512_fmadd_ps(_mm512_set1_ps(dp[r * sp + j]),
                                                         _mm512_maskz_loadu_ps(km, qr[r] + c), ak);
                                    av = _mm512_fmadd_ps(_mm512_set1_ps(p[r * sp + j]),
                                                         _mm512_maskz_loadu_ps(km, dor[r] + c), av);
                                }
                                _mm512_mask_storeu_ps(dkb + j * d + c, km, ak);
                                _mm512_mask_storeu_ps(dvb + j * d + c, km, av);
                            }
                        }
                    }
                }
            }
        free(kt);
    }
    return failed ? -1 : 0;
}
