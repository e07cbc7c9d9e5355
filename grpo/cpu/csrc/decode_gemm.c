/* grpo's CPU GEMMs (float32, AVX-512): decode-step products for the rollout, y[M, N] = x[M, K] W^T (+ bias) for few
 * rows (M <= 64), and weight gradients added in place, dW += dY^T X (grpo_grad_accumulate, below).
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

/* ---- weight gradients: target[N, K] += a[M, N]^T b[M, K], both operands read in place (row-major) ---- */

#define GRAD_ROWS 14  /* target rows per register tile (a's columns, broadcast) */
#define GRAD_COLS 32  /* target columns per register tile: two vectors */

/* One tile: target rows n0..n0+rows-1, columns k0..k0+31, summed over all m in order, then added to
 * target (or, with `overwrite`, stored: the same values as adding to zeros, without the zero fill). */
static inline __attribute__((always_inline)) void grad_tile(const float *a, long lda, const float *b, long ldb,
                                                            long m, int rows, float *t, long ldt,
                                                            int overwrite) {
    vec lo[GRAD_ROWS], hi[GRAD_ROWS];
    for (int r = 0; r < rows; r++) {   /* the target's lines (a gradient, often cold) arrive while the sums run */
        if (!overwrite) {
            __builtin_prefetch(t + r * ldt, 1, 3);
            __builtin_prefetch(t + r * ldt + LANES, 1, 3);
        }
        lo[r] = hi[r] = (vec){0};
    }
    for (long i = 0; i < m; i++) {
        vec b0 = *(const vec *)(b + i * ldb), b1 = *(const vec *)(b + i * ldb + LANES);
        const float *ai = a + i * lda;
        for (int r = 0; r < rows; r++) {
            lo[r] += ai[r] * b0;
            hi[r] += ai[r] * b1;
        }
    }
    if (overwrite) {
        for (int r = 0; r < rows; r++) {
            *(vec *)(t + r * ldt) = lo[r];
            *(vec *)(t + r * ldt + LANES) = hi[r];
        }
    } else {
        for (int r = 0; r < rows; r++) {
            *(vec *)(t + r * ldt) += lo[r];
            *(vec *)(t + r * ldt + LANES) += hi[r];
        }
    }
}

#define GRAD_CASE(R) case R: grad_tile(a + n0, n, b + k0, k, m, R, target + n0 * k + k0, k, overwrite); break;

/* target [n, k] += a [m, n]^T b [m, k] (`overwrite`: target = a^T b): each element summed over m in order by one
 * thread, then added (results do not depend on the thread count). a's columns go in blocks of about
 * GRAD_BLOCK_BYTES (m x columns x 4 bytes) that stay in L2 while every 32-column panel of b is multiplied by them:
 * a [256, 32768] LM-head gradient read a whole for each panel came from memory 24 times. Columns of b past the last
 * multiple of 32 are summed in plain loops. m = 0 with `overwrite` leaves target to the caller (to zero). */
#define GRAD_BLOCK_BYTES (1L << 20)

void grpo_grad_accumulate(float *target, const float *a, const float *b, long m, long n, long k, int overwrite) {
    long panels = k / GRAD_COLS;
    long block = GRAD_BLOCK_BYTES / (4 * (m > 0 ? m : 1)) / GRAD_ROWS * GRAD_ROWS;
    if (block < GRAD_ROWS) block = GRAD_ROWS;
#pragma omp parallel
    {
        for (long start = 0; start < n; start += block) {
            long stop = start + block < n ? start + block : n;
            long tiles = (stop - start + GRAD_ROWS - 1) / GRAD_ROWS;
#pragma omp for schedule(static) collapse(2)
            for (long p = 0; p < panels; p++)
                for (long t = 0; t < tiles; t++) {
                    long k0 = p * GRAD_COLS, n0 = start + t * GRAD_ROWS;
                    int rows = stop - n0 < GRAD_ROWS ? (int)(stop - n0) : GRAD_ROWS;
                    switch (rows) {
                        GRAD_CASE(1) GRAD_CASE(2) GRAD_CASE(3) GRAD_CASE(4) GRAD_CASE(5) GRAD_CASE(6) GRAD_CASE(7)
                        GRAD_CASE(8) GRAD_CASE(9) GRAD_CASE(10) GRAD_CASE(11) GRAD_CASE(12) GRAD_CASE(13)
                        GRAD_CASE(14)
                    }
                }
        }
        if (panels * GRAD_COLS < k) {
#pragma omp for schedule(static)
            for (long r = 0; r < n; r++)
                for (long c = panels * GRAD_COLS; c < k; c++) {
                    float s = 0.0f;
                    for (long i = 0; i < m; i++) s += a[i * n + r] * b[i * k + c];
                    target[r * k + c] = overwrite ? s : target[r * k + c] + s;
                }
        }
    }
}
