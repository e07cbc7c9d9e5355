/* Decode-step products for the CPU rollout: y[M, N] = x[M, K] W^T (+ bias), float32, few rows (M <= 64).
 *
 * Built at run time by grpo/modeling/native_gemm.py (cc -O3 -march=native -fopenmp) and called through ctypes.
 * Why: at 16 rows a decode step's products read every weight once and do 16 multiply-adds per weight, about as
 * long in arithmetic as in memory traffic. oneDNN's packed kernel on the 2-core AMD EPYC (Zen 5) host does the two
 * one after the other (the time of a decode step's products = bytes / read bandwidth + flops / peak, measured at
 * 4, 8, 16 and 32 rows); this kernel prefetches the weights far ahead of the multiply-adds so that they overlap.
 *
 * Layout: W [N, K] is packed once per rollout into panels of 16 output columns, panels[N/16][K][16] (the last one
 * zero-padded): one panel row (16 floats, 64 bytes) is one AVX-512 vector, and each thread streams its panels
 * through memory in order.
 *
 * OpenMP: torch's own libgomp (soname libgomp.so.1) is already loaded when this library is, so the parallel
 * regions below run on torch's thread pool with torch's thread count (torch.set_num_threads).
 */
#include <omp.h>
#include <stdlib.h>

#define LANES 16           /* output columns per panel: one 512-bit vector of float32 */
#define TILE_ROWS 16       /* rows per register tile: 16 accumulators */
#define PREFETCH_AHEAD 256 /* panel rows (64 bytes each) between the prefetch and the load: 16 KiB */

typedef float vec __attribute__((vector_size(64), aligned(4)));

/* W [n, k] row-major -> panels [ceil(n/16)][k][16], columns past n zero. */
void grpo_panel_pack(const float *w, long n, long k, float *panels) {
    long count = (n + LANES - 1) / LANES;
#pragma omp parallel for schedule(static)
    for (long p = 0; p < count; p++) {
        float *dst = panels + p * k * LANES;
        for (long j = 0; j < LANES; j++) {
            long col = p * LANES + j;
            if (col < n) {
                const float *src = w + col * k;
                for (long i = 0; i < k; i++) dst[i * LANES + j] = src[i];
            } else {
                for (long i = 0; i < k; i++) dst[i * LANES + j] = 0.0f;
            }
        }
    }
}

/* One tile: `rows` rows of xt (transposed: xt[i * 16 + r] = x[r, i]) times one panel, into y (row stride ldy),
 * `cols` <= 16 columns of it kept; bias (cols values) or NULL. Inlined with a constant `rows` per case below. */
static inline __attribute__((always_inline)) void tile(const float *xt, const float *panel, long k, int rows,
                                                       float *y, long ldy, long cols, const float *bias) {
    vec acc[TILE_ROWS];
    for (int r = 0; r < rows; r++) acc[r] = (vec){0};
    for (long i = 0; i < k; i++) {
        __builtin_prefetch(panel + (i + PREFETCH_AHEAD) * LANES, 0, 0);
        vec w = *(const vec *)(panel + i * LANES);
        for (int r = 0; r < rows; r++) acc[r] += xt[i * TILE_ROWS + r] * w;
    }
    if (bias) {
        vec b = (vec){0};
        for (long j = 0; j < cols; j++) b[j] = bias[j];
        for (int r = 0; r < rows; r++) acc[r] += b;
    }
    if (cols == LANES) {
        for (int r = 0; r < rows; r++) *(vec *)(y + r * ldy) = acc[r];
    } else {
        for (int r = 0; r < rows; r++)
            for (long j = 0; j < cols; j++) y[r * ldy + j] = acc[r][j];
    }
}

#define ROWS_CASE(R) case R: tile(xt, panel, k, R, out, n, cols, b); break;

/* y [m, n] = x [m, k] @ W^T (+ bias [n] or NULL), W as packed by grpo_panel_pack. Returns 0, or -1 when the
 * transposed copy of x could not be allocated. */
int grpo_panel_matmul(const float *x, long m, long k, const float *panels, long n, const float *bias, float *y) {
    static __thread float *xbuf = NULL;
    static __thread size_t xcap = 0;
    long tiles = (m + TILE_ROWS - 1) / TILE_ROWS, count = (n + LANES - 1) / LANES;
    size_t need = (size_t)tiles * (size_t)k * TILE_ROWS;
    if (need > xcap) {
        free(xbuf);
        xbuf = malloc(need * sizeof(float));
        xcap = xbuf ? need : 0;
        if (!xbuf) return -1;
    }
    float *xts = xbuf;
#pragma omp parallel
    {
        /* x transposed per tile of 16 rows (zero rows past m): a tile's 16 values of one column share a cache line */
#pragma omp for schedule(static)
        for (long t = 0; t < tiles; t++)
            for (long i = 0; i < k; i++)
                for (long r = 0; r < TILE_ROWS; r++) {
                    long row = t * TILE_ROWS + r;
                    xts[(t * k + i) * TILE_ROWS + r] = row < m ? x[row * k + i] : 0.0f;
                }
#pragma omp for schedule(static)
        for (long p = 0; p < count; p++) {
            const float *panel = panels + p * k * LANES;
            long cols = n - p * LANES < LANES ? n - p * LANES : LANES;
            const float *b = bias ? bias + p * LANES : NULL;
            for (long t = 0; t < tiles; t++) {     /* the panel stays in L1/L2 for the next tile of rows */
                int rows = m - t * TILE_ROWS < TILE_ROWS ? (int)(m - t * TILE_ROWS) : TILE_ROWS;
                const float *xt = xts + t * k * TILE_ROWS;
                float *out = y + t * TILE_ROWS * n + p * LANES;
                switch (rows) {
                    ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4) ROWS_CASE(5) ROWS_CASE(6) ROWS_CASE(7)
                    ROWS_CASE(8) ROWS_CASE(9) ROWS_CASE(10) ROWS_CASE(11) ROWS_CASE(12) ROWS_CASE(13)
                    ROWS_CASE(14) ROWS_CASE(15) ROWS_CASE(16)
                }
            }
        }
    }
    return 0;
}

/* OpenMP threads a parallel region here would use (torch's count when torch's libgomp is the one loaded). */
int grpo_panel_threads(void) {
    int n = 0;
#pragma omp parallel
    {
#pragma omp single
        n = omp_get_num_threads();
    }
    return n;
}
