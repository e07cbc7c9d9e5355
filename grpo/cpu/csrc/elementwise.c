/* grpo's fused CPU elementwise passes (float32, AVX-512) for the update: the SwiGLU MLP's activation and its
 * gradient, and the LM head's log-softmax, entropy and their gradient, row by row.
 *
 * Built with decode_gemm.c into one library by grpo/modeling/native_gemm.py and called through ctypes
 * (grpo/modeling/native_elementwise.py). Why: in the update's backward pass the SwiGLU's saved g and u come back
 * from memory and torch's elementwise operators make six temporaries of their size, each one more pass over
 * memory; the LM head's softmax ran eight passes over a [256, 32768] logits block (32 MiB, larger than L3). Here
 * each runs as one pass (SwiGLU) or as one row at a time while the row stays in L2 (the head).
 *
 * exp16 (simd_exp.h): within 2 ulp, NaN kept, 0 and infinity past float32's range.
 *
 * OpenMP: torch's own libgomp (see decode_gemm.c), static schedules: every element's value is computed the same
 * way whatever the thread count.
 */
#include <immintrin.h>
#include <math.h>

#include "simd_exp.h"

#define LANES 16
#define SPLIT 4096 /* elements per parallel chunk of the flat passes */

static inline __m512 sigmoid16(__m512 g) {
    __m512 one = _mm512_set1_ps(1.0f);
    return _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
}

static inline __mmask16 tail_mask(long left) { return left >= LANES ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u); }

/* Runs the statements after `n` once per vector of 16 of n elements (i its first element, k its lane mask, partial at
 * the tail), the elements split into SPLIT-element chunks over the threads. */
#define PARALLEL_LANES(n, ...)                                       \
    _Pragma("omp parallel for schedule(static)")                     \
    for (long c_ = 0; c_ < (n); c_ += SPLIT) {                       \
        long end_ = c_ + SPLIT < (n) ? c_ + SPLIT : (n);             \
        for (long i = c_; i < end_; i += LANES) {                    \
            __mmask16 k = tail_mask(end_ - i);                       \
            __VA_ARGS__                                              \
        }                                                            \
    }

/* exp(x[i]) for i < n (the tests' handle on exp16). */
void grpo_exp(const float *x, float *y, long n) {
    PARALLEL_LANES(n, _mm512_mask_storeu_ps(y + i, k, exp16(_mm512_maskz_loadu_ps(k, x + i)));)
}

/* a = silu(g) u = g sigmoid(g) u, n elements. */
void grpo_swiglu_forward(const float *g, const float *u, float *a, long n) {
    PARALLEL_LANES(n, __m512 gv = _mm512_maskz_loadu_ps(k, g + i), uv = _mm512_maskz_loadu_ps(k, u + i);
                   _mm512_mask_storeu_ps(a + i, k, _mm512_mul_ps(_mm512_mul_ps(gv, sigmoid16(gv)), uv));)
}

/* The SwiGLU's elementwise backward, n elements: with s = sigmoid(g), gs = g s (silu) and ga = dL/da on entry in
 * `ga`: a = gs u (the down projection's input, for its weight gradient), du = ga gs, and in place of ga
 * dg = ga u silu'(g), silu'(g) = s (1 + g (1 - s)) = gs + s - s gs. */
void grpo_swiglu_backward(const float *g, const float *u, float *ga, float *du, float *a, long n) {
    PARALLEL_LANES(n, __m512 gv = _mm512_maskz_loadu_ps(k, g + i), uv = _mm512_maskz_loadu_ps(k, u + i);
                   __m512 gav = _mm512_maskz_loadu_ps(k, ga + i);
                   __m512 s = sigmoid16(gv), gs = _mm512_mul_ps(gv, s);
                   __m512 ds = _mm512_add_ps(_mm512_fnmadd_ps(s, gs, gs), s);
                   _mm512_mask_storeu_ps(a + i, k, _mm512_mul_ps(gs, uv));
                   _mm512_mask_storeu_ps(du + i, k, _mm512_mul_ps(gav, gs));
                   _mm512_mask_storeu_ps(ga + i, k, _mm512_mul_ps(_mm512_mul_ps(gav, uv), ds));)
}

/* One row of logits z [v]: returns its maximum m (0 when infinite, as torch.logsumexp) and sets *s = sum e^(z - m),
 * *t = sum e^(z - m) (z - m) (0 terms where e^(z - m) is 0). */
static void row_sums(const float *z, long v, float *m_out, float *s_out, float *t_out) {
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (long i = 0; i < v; i += LANES) {
        __mmask16 k = tail_mask(v - i);
        mv = _mm512_mask_max_ps(mv, k, mv, _mm512_maskz_loadu_ps(k, z + i));
    }
    float m = _mm512_reduce_max_ps(mv);
    if (isinf(m)) m = 0.0f;
    __m512 mm = _mm512_set1_ps(m), sv = _mm512_setzero_ps(), tv = _mm512_setzero_ps();
    for (long i = 0; i < v; i += LANES) {
        __mmask16 k = tail_mask(v - i);
        __m512 w = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, z + i), mm);
        __m512 e = _mm512_maskz_mov_ps(k, exp16(w));
        sv = _mm512_add_ps(sv, e);
        tv = _mm512_add_ps(tv, _mm512_maskz_mul_ps(_mm512_cmp_ps_mask(e, _mm512_setzero_ps(), _CMP_NEQ_OQ), e, w));
    }
    *m_out = m;
    *s_out = _mm512_reduce_add_ps(sv);
    *t_out = _mm512_reduce_add_ps(tv);
}

/* Log-softmax rows of z [rows, v] (row-major): lse[r] = log sum_j e^z[r, j]; with `entropy` (else NULL)
 * entropy[r] = -sum_j p log p = log S - T / S (S = sum e^(z - m), T = sum e^(z - m) (z - m)); with `logp` nonzero,
 * z is overwritten by log p = z - lse. */
void grpo_log_softmax_rows(float *z, long rows, long v, float *lse, float *entropy, int logp) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        float *row = z + r * v;
        float m, s, t;
        row_sums(row, v, &m, &s, &t);
        float ls = logf(s);
        lse[r] = m + ls;
        if (entropy) entropy[r] = ls - t / s;
        if (logp) {
            __m512 l = _mm512_set1_ps(lse[r]);
            for (long i = 0; i < v; i += LANES) {
                __mmask16 k = tail_mask(v - i);
                _mm512_mask_storeu_ps(row + i, k, _mm512_sub_ps(_mm512_maskz_loadu_ps(k, row + i), l));
            }
        }
    }
}

/* The head's dL/dlogits in place, rows of dz [rows, v] that hold log p on entry (or logits, with `lse`: log p =
 * z - lse[r] first): with gy = g_logp[r], and the entropy's gradient gh = g_entropy[r] and H = entropy[r] when
 * g_entropy is not NULL,
 *     dz = -p (gy + gh (log p + H))     (without the entropy: -p gy),  then dz[y] += gy,  then dz /= tau unless
 * tau is 1, p = e^(log p), y = tokens[r] (0 <= y < v, checked by the caller). */
void grpo_head_grad_rows(float *dz, long rows, long v, const float *lse, const float *g_logp,
                         const float *g_entropy, const float *entropy, const long *tokens, float tau) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        float *row = dz + r * v;
        __m512 shift = _mm512_set1_ps(lse ? lse[r] : 0.0f), gy = _mm512_set1_ps(g_logp[r]);
        __m512 gh = _mm512_set1_ps(g_entropy ? g_entropy[r] : 0.0f), h = _mm512_set1_ps(g_entropy ? entropy[r] : 0.0f);
        for (long i = 0; i < v; i += LANES) {
            __mmask16 k = tail_mask(v - i);
            __m512 lp = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, row + i), shift);
            __m512 p = exp16(lp);
            __m512 w = g_entropy ? _mm512_fmadd_ps(gh, _mm512_add_ps(lp, h), gy) : gy;
            _mm512_mask_storeu_ps(row + i, k, _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(p, w)));
        }
        row[tokens[r]] += g_logp[r];
        if (tau != 1.0f) {
            __m512 sc = _mm512_set1_ps(tau);
            for (long i = 0; i < v; i += LANES) {
                __mmask16 k = tail_mask(v - i);
                _mm512_mask_storeu_ps(row + i, k, _mm512_div_ps(_mm512_maskz_loadu_ps(k, row + i), sc));
            }
        }
    }
}

/* ---- RMSNorm (grpo.modeling.lean_layers.RMSNormFn): rows of x [rows, h] ---- */

static inline float row_dot(const float *a, const float *b, long h) {
    __m512 acc = _mm512_setzero_ps();
    for (long i = 0; i < h; i += LANES) {
        __mmask16 k = tail_mask(h - i);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + i), _mm512_maskz_loadu_ps(k, b + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* r[row] = 1 / sqrt(mean(x^2) + eps), y = w * (x r). */
void grpo_rms_norm_forward(const float *x, const float *w, float *y, float *r, long rows, long h, float eps) {
#pragma omp parallel for schedule(static)
    for (long row = 0; row < rows; row++) {
        const float *xr = x + row * h;
        float inv = 1.0f / sqrtf(row_dot(xr, xr, h) / (float)h + eps);
        r[row] = inv;
        __m512 iv = _mm512_set1_ps(inv);
        for (long i = 0; i < h; i += LANES) {
            __mmask16 k = tail_mask(h - i);
            __m512 hv = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, xr + i), iv);
            _mm512_mask_storeu_ps(y + row * h + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, w + i), hv));
        }
    }
}

#define NORM_COLS 64 /* weight-gradient columns per parallel block: four vectors of sums */

/* With hn = x r and gh = gy w: gx = r (gh - hn mean(gh hn)) per row (gx NULL: skipped), and gw = sum over rows, in
 * row order, of gy hn (gw NULL: skipped); each column's sum is one thread's, whatever the thread count. */
void grpo_rms_norm_backward(const float *gy, const float *x, const float *w, const float *r, float *gx, float *gw,
                            long rows, long h) {
#pragma omp parallel
    {
        if (gx) {
#pragma omp for schedule(static)
            for (long row = 0; row < rows; row++) {
                const float *xr = x + row * h, *gr = gy + row * h;
                __m512 iv = _mm512_set1_ps(r[row]), acc = _mm512_setzero_ps();
                for (long i = 0; i < h; i += LANES) {       /* sum gh hn */
                    __mmask16 k = tail_mask(h - i);
                    __m512 gh = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, gr + i), _mm512_maskz_loadu_ps(k, w + i));
                    acc = _mm512_fmadd_ps(gh, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, xr + i), iv), acc);
                }
                __m512 mean = _mm512_set1_ps(_mm512_reduce_add_ps(acc) / (float)h);
                for (long i = 0; i < h; i += LANES) {
                    __mmask16 k = tail_mask(h - i);
                    __m512 gh = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, gr + i), _mm512_maskz_loadu_ps(k, w + i));
                    __m512 hn = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, xr + i), iv);
                    _mm512_mask_storeu_ps(gx + row * h + i, k, _mm512_mul_ps(iv, _mm512_fnmadd_ps(hn, mean, gh)));
                }
            }
        }
        if (gw) {
#pragma omp for schedule(static)
            for (long c = 0; c < h; c += NORM_COLS) {
                __m512 acc[NORM_COLS / LANES];
                for (int j = 0; j < NORM_COLS / LANES; j++) acc[j] = _mm512_setzero_ps();
                for (long row = 0; row < rows; row++) {
                    __m512 iv = _mm512_set1_ps(r[row]);
                    for (int j = 0; j < NORM_COLS / LANES; j++) {
                        long i = c + j * LANES;
                        if (i >= h) break;
                        __mmask16 k = tail_mask(h - i);
                        __m512 hn = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + row * h + i), iv);
                        acc[j] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, gy + row * h + i), hn, acc[j]);
                    }
                }
                for (int j = 0; j < NORM_COLS / LANES; j++) {
                    long i = c + j * LANES;
                    if (i < h) _mm512_mask_storeu_ps(gw + i, tail_mask(h - i), acc[j]);
                }
            }
        }
    }
}
