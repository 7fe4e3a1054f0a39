/* Weight-only quantized matmuls on the CPU, called through ctypes (engine/kernels/cpu/build.py).

   A quantized weight [N, K] is three planes: integer codes u, and per group of G inputs a
   float32 scale s and offset o, so w[n][k] = s[n][k/G] * u[n][k] + o[n][k/G]. Codes are 4-bit
   (two per byte; in every run of 32 values byte j holds value j in its low nibble and value
   j+16 in its high one, as GGUF's Q4_0/Q4_1 blocks do) or 8-bit. G is a multiple of 32 for
   4-bit codes and of 16 for 8-bit ones.

   y[m][n] = sum_g s_g * (sum_{k in g} u_k x_k) + o_g * (sum_{k in g} x_k): the codes are turned
   into floats in registers and multiplied with float32 activations (no int8 rounding of x),
   so the result is the float32 product with the dequantized weight up to summation order.
   Activations' group sums are made once per call. Output rows are split over OpenMP threads;
   each thread's weight rows are decoded once per tile of up to 8 activation rows.
   Built with -march=native: the AVX-512 path where the compiler targets it, else plain C. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define MAX_TILE 8

int sy_kernel_version(void) { return 1; }

int sy_simd_width(void) {
#ifdef __AVX512F__
    return 16;
#else
    return 1;
#endif
}

/* Group sums of every activation row: xs[m][g] = sum of x[m][g*G .. g*G+G). */
static void group_sums(int M, int K, int G, const float *x, float *xs) {
    int groups = K / G;
    for (int m = 0; m < M; m++) {
        const float *row = x + (size_t)m * K;
        for (int g = 0; g < groups; g++) {
            float sum = 0.0f;
            for (int k = 0; k < G; k++) sum += row[g * G + k];
            xs[(size_t)m * groups + g] = sum;
        }
    }
}

/* The code of value k of a row (scalar path and dequantization). */
static inline int code_at(const uint8_t *codes, int bits, int k) {
    if (bits == 8) return codes[k];
    int run = k >> 5, j = k & 31;
    uint8_t byte = codes[run * 16 + (j & 15)];
    return j < 16 ? (byte & 0x0F) : (byte >> 4);
}

#ifdef __AVX512F__
static inline __m512 widen_scaled(__m128i bytes, __m512 scale) {
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)), scale);
}

/* One output row n against R activation rows; R is a compile-time constant in each copy
   (TILE_FUNCTION below), so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void row_tile_avx512(
    const int R, int K, int G, int bits, const uint8_t *codes, const float *scales,
    const float *offsets, const float *x, const float *xs, float *y, int N, int n) {
    __m512 acc[MAX_TILE];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    int groups = K / G;
    const __m128i mask = _mm_set1_epi8(0x0F);
    for (int g = 0; g < groups; g++) {
        __m512 scale = _mm512_set1_ps(scales[g]);
        if (bits == 4) {
            for (int k = g * G; k < g * G + G; k += 32) {
                __m128i bytes = _mm_loadu_si128((const __m128i *)(codes + k / 2));
                __m512 w0 = widen_scaled(_mm_and_si128(bytes, mask), scale);
                __m512 w1 = widen_scaled(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask), scale);
                for (int r = 0; r < R; r++) {
                    const float *xr = x + (size_t)r * K + k;
                    acc[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr), acc[r]);
                    acc[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr + 16), acc[r]);
                }
            }
        } else {
            for (int k = g * G; k < g * G + G; k += 16) {
                __m512 w = widen_scaled(_mm_loadu_si128((const __m128i *)(codes + k)), scale);
                for (int r = 0; r < R; r++)
                    acc[r] = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + (size_t)r * K + k), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        float sum = _mm512_reduce_add_ps(acc[r]);
        const float *xsr = xs + (size_t)r * groups;
        for (int g = 0; g < groups; g++) sum += offsets[g] * xsr[g];
        y[(size_t)r * N + n] = sum;
    }
}

#define TILE_FUNCTION(R)                                                                    \
    static void row_tile_##R(int K, int G, int bits, const uint8_t *codes,                  \
                             const float *scales, const float *offsets, const float *x,     \
                             const float *xs, float *y, int N, int n) {                     \
        row_tile_avx512(R, K, G, bits, codes, scales, offsets, x, xs, y, N, n);             \
    }
TILE_FUNCTION(1)
TILE_FUNCTION(2)
TILE_FUNCTION(4)
TILE_FUNCTION(8)

/* Rows of any count in tiles of 8, 4, 2 and 1. */
static void row_tiles(int rows, int K, int G, int bits, const uint8_t *codes, const float *scales,
                      const float *offsets, const float *x, const float *xs, float *y, int N,
                      int n) {
    int groups = K / G;
    while (rows > 0) {
        int r = rows >= 8 ? 8 : rows >= 4 ? 4 : rows >= 2 ? 2 : 1;
        if (r == 8) row_tile_8(K, G, bits, codes, scales, offsets, x, xs, y, N, n);
        else if (r == 4) row_tile_4(K, G, bits, codes, scales, offsets, x, xs, y, N, n);
        else if (r == 2) row_tile_2(K, G, bits, codes, scales, offsets, x, xs, y, N, n);
        else row_tile_1(K, G, bits, codes, scales, offsets, x, xs, y, N, n);
        rows -= r;
        x += (size_t)r * K;
        xs += (size_t)r * groups;
        y += (size_t)r * N;
    }
}
#endif

static inline void row_tile_scalar(int rows, int K, int G, int bits, const uint8_t *codes,
                            const float *scales, const float *offsets, const float *x,
                            const float *xs, float *y, int N, int n) {
    int groups = K / G;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * K;
        float sum = 0.0f;
        for (int g = 0; g < groups; g++) {
            float dot = 0.0f;
            for (int k = g * G; k < g * G + G; k++) dot += (float)code_at(codes, bits, k) * xr[k];
            sum += scales[g] * dot + offsets[g] * xs[(size_t)r * groups + g];
        }
        y[(size_t)r * N + n] = sum;
    }
}

/* y[M, N] = x[M, K] @ w[N, K]^T for the quantized w described at the top. Returns 0, or -1
   when the shape does not fit the layout. `threads`: OpenMP threads (1: none started). */
int sy_qlinear(int M, int N, int K, int G, int bits, const float *x, const uint8_t *codes,
               const float *scales, const float *offsets, float *y, int threads) {
    if (M <= 0 || N <= 0 || K <= 0 || G <= 0 || K % G) return -1;
    if (!((bits == 4 && G % 32 == 0) || (bits == 8 && G % 16 == 0))) return -1;
    int groups = K / G;
    size_t row_bytes = bits == 4 ? (size_t)K / 2 : (size_t)K;
    float *xs = malloc(sizeof(float) * (size_t)M * groups);
    if (!xs) return -1;
    group_sums(M, K, G, x, xs);
    if (threads < 1) threads = 1;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int n = 0; n < N; n++) {
        const uint8_t *wn = codes + (size_t)n * row_bytes;
        const float *sn = scales + (size_t)n * groups;
        const float *on = offsets + (size_t)n * groups;
#ifdef __AVX512F__
        row_tiles(M, K, G, bits, wn, sn, on, x, xs, y, N, n);
#else
        row_tile_scalar(M, K, G, bits, wn, sn, on, x, xs, y, N, n);
#endif
    }
    free(xs);
    return 0;
}

/* out[i] = the float32 weight row rows[i] (rows == NULL: row i), for lookups and for
   dequantize-then-sgemm. */
int sy_dequantize(int count, const int64_t *rows, int K, int G, int bits, const uint8_t *codes,
                  const float *scales, const float *offsets, float *out, int threads) {
    if (threads < 1) threads = 1;
    if (count < 0 || K <= 0 || G <= 0 || K % G) return -1;
    int groups = K / G;
    size_t row_bytes = bits == 4 ? (size_t)K / 2 : (size_t)K;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int i = 0; i < count; i++) {
        int64_t n = rows ? rows[i] : i;
        const uint8_t *wn = codes + (size_t)n * row_bytes;
        const float *sn = scales + (size_t)n * groups;
        const float *on = offsets + (size_t)n * groups;
        float *dst = out + (size_t)i * K;
        for (int g = 0; g < groups; g++) {
            int k = g * G;
#ifdef __AVX512F__
            __m512 scale = _mm512_set1_ps(sn[g]), offset = _mm512_set1_ps(on[g]);
            const __m128i mask = _mm_set1_epi8(0x0F);
            for (; k < g * G + G; k += bits == 4 ? 32 : 16) {
                /* s * u + o as two roundings, never fused: the reference's exact values */
                if (bits == 4) {
                    __m128i bytes = _mm_loadu_si128((const __m128i *)(wn + k / 2));
                    __m512 lo = widen_scaled(_mm_and_si128(bytes, mask), scale);
                    __m512 hi = widen_scaled(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask), scale);
                    _mm512_storeu_ps(dst + k, _mm512_add_ps(lo, offset));
                    _mm512_storeu_ps(dst + k + 16, _mm512_add_ps(hi, offset));
                } else {
                    __m512 w = widen_scaled(_mm_loadu_si128((const __m128i *)(wn + k)), scale);
                    _mm512_storeu_ps(dst + k, _mm512_add_ps(w, offset));
                }
            }
#endif
            for (; k < g * G + G; k++) dst[k] = sn[g] * (float)code_at(wn, bits, k) + on[g];
        }
    }
    return 0;
}
