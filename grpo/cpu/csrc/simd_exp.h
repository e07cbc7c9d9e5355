/* exp of 16 float32 lanes (AVX-512), shared by grpo's native kernels (elementwise.c, attention.c).
 *
 * exp(x) = 2^n e^r, n = round(x log2 e), r = x - n ln 2 in two parts (Cody & Waite), e^r by its Taylor polynomial of
 * degree 7 (|r| <= ln2 / 2: truncation below 1e-8 relative), 2^n applied by VSCALEFPS, which gives 0 and infinity past
 * float32's range; NaN stays NaN, +-inf give inf and 0. Within 2 ulp of the exact value (tests/modeling/
 * test_native_elementwise.py).
 */
#ifndef GRPO_SIMD_EXP_H
#define GRPO_SIMD_EXP_H
#include <immintrin.h>

static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x); /* second operand kept when NaN: NaN stays NaN */
    x = _mm512_min_ps(_mm512_set1_ps(104.0f), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

#endif
