/* Products on a GGUF file's own blocks (Q4_K, Q6_K; Q4_0, Q5_0, Q8_0 further down), one token's row at a time.
 *
 * Weights are the file's integers, repacked (csd/runtime/kquant.py) into tiles of 16 output rows so that one
 * 512-bit register holds 4 consecutive input columns of 16 rows:
 *   Q4_K  qw[tile][superblock][pair p][i][16 rows][4 bytes]: low nibble column 64p + 4i + b (sub-block 2p),
 *         high nibble column 64p + 32 + 4i + b (sub-block 2p + 1): the file's own nibble pairing;
 *         sc, m[tile][superblock][8 sub-blocks][16 rows] (6-bit, unsigned); d, dmin[tile][superblock][16] (f16).
 *         w = d * sc * q - dmin * m.
 *   Q6_K  u = q + 32 (0..63) in 6 bits: lo[tile][superblock][chunk c][i][16 rows][4 bytes], the low 4 bits of
 *         column 64c + 4i + b (low nibble) and of column 64c + 32 + 4i + b (high nibble); hi[tile][superblock][c]
 *         [i & 3][16 rows][4 bytes], the top 2 bits of column 64c + 32h + 4i + b at bit 2 * (i >> 2) + 4h;
 *         sc[tile][superblock][16 groups of 16 columns][16 rows] (int8); d[tile][superblock][16] (f16).
 *         w = d * sc * (u - 32).
 * Activations are quantised per row and 256 columns to int8 with one float scale, as llama.cpp's Q8_K does.
 *
 * Exactness: every row of x goes through the same instructions in the same order whatever the number of rows
 * or threads (rows are taken 4 at a time, each in its own registers; threads split output tiles), so a row's
 * result depends on that row alone. A verify pass of 7 tokens gives each token what a 1-token pass gives it.
 * The builds agree too: the AVX-512 path, the AVX2 path and the plain C loops form the same integer sums and the
 * same floating-point steps in the same order (no step is left to the compiler to fuse: csd/runtime/kquant.py
 * builds with -ffp-contract=off), so a model on its blocks gives the same bits on every CPU it runs on.
 */
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define KQ_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KQ_AVX2 1           /* a CPU without AVX-512 (AMD Zen 2 and 3, older Intel): 8 rows of a tile at a time */
#endif

#define QK 256

/* Prefetching. A tile's weights are read once, front to back, and a thread's tiles lie one after another. In a
 * pass of 3 rows or more, each weight load also asks for the line KQ_PF bytes further on, so that the memory keeps
 * streaming while the rows compute: the CPU's own prefetcher, left alone, let verify passes of 5-8 rows wait on
 * memory (docs/bench/gguf-epyc5). A pass of 1 or 2 rows runs at the memory's pace anyway and is left to the CPU's
 * prefetcher, which did as well or better there. A prefetch changes no value. */
#define KQ_PF 2048
#define KQ_PF_ROWS 3        /* the fewest rows of x a pass prefetches for */

/* In a pass of NR rows, the line ``ahead`` bytes past p (a line past the end of the weights is a wasted prefetch:
 * prefetches never fault). NR is a constant at each call, so a pass of fewer rows compiles to no instruction. */
static inline __attribute__((always_inline)) void prefetch(const int NR, const uint8_t *p, int ahead) {
    if (NR >= KQ_PF_ROWS)
        __builtin_prefetch(p + ahead, 0, 3);
}

#if defined(KQ_AVX512)
/* acc += the 64 weight bytes w times the 4 activation bytes at x, broadcast by the load itself (an embedded
 * broadcast: the compiler would otherwise spend a shuffle on each). */
static inline __attribute__((always_inline)) __m512i dot4(__m512i acc, __m512i w, const int8_t *x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)x));
    return acc;
}
#endif

#if defined(KQ_AVX512)
/* the two 16-bit sums at s, s + 1 as one 32-bit word, in every lane */
static inline __attribute__((always_inline)) __m512i pair16(const int16_t *s) {
    int32_t w;
    memcpy(&w, s, 4);
    return _mm512_set1_epi32(w);
}

/* a tile's 16 bytes (one a row) of two groups a and b as 16 pairs of 16-bit integers (a[n], b[n]) */
static inline __attribute__((always_inline)) __m512i pairs_u8(const uint8_t *a, const uint8_t *b) {
    __m128i x = _mm_loadu_si128((const __m128i *)a), y = _mm_loadu_si128((const __m128i *)b);
    return _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(x, y), _mm_unpacklo_epi8(x, y)));
}

static inline __attribute__((always_inline)) __m512i pairs_i8(const int8_t *a, const int8_t *b) {
    __m128i x = _mm_loadu_si128((const __m128i *)a), y = _mm_loadu_si128((const __m128i *)b);
    return _mm512_cvtepi8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(x, y), _mm_unpacklo_epi8(x, y)));
}
#endif

#if defined(KQ_AVX2)
/* The same tiles, read as two halves of 8 output rows (32 of each 64 bytes) in 256-bit registers. Without
 * vpdpbusd, a product of 4 weight bytes (0..63) and 4 activation bytes is vpmaddubsw: two 16-bit sums a row.
 * As many of those as fit in 16 bits without saturating are added (vpaddw), then vpmaddwd widens them, by ones or
 * by the group's scale (as llama.cpp's AVX2 loops do). Every sum is the same integer the AVX-512 path forms, and
 * the floating-point steps are the same, lane for lane, so the two paths give the same bits (tests/test_kquant.py).
 *
 * Q4_K takes both halves of each 64-byte line of weights together, for a group of up to four rows of x: the tile
 * is read once, so the memory streams while the rows compute. Its running sums fill 2 x 4 of the 16 registers, so
 * each sub-block's scaled sums wait in memory and the float sums in y itself (q4k_rows2).
 * Q6_K and the blocks of 32 do so for one or two rows (NH = 2); three or four rows take the halves one after the
 * other (NH = 1), the second from the cache: Q6_K's unpacking needs more registers, and its whole-line version
 * with the sums in memory measured no faster (docs/bench/avx2-epyc7). */
#define KQ_ROWS2 4          /* 16 registers */
/* A running sum, kept as it is: GCC otherwise reorders the adds of a fully unrolled sub-block (integer adds
 * commute, so it may) into a tree of products held on the stack, and a pass of several rows ran at two thirds
 * of the speed. The empty asm changes no value. */
static inline __attribute__((always_inline)) __m256i keep(__m256i acc) {
    __asm__("" : "+x"(acc));
    return acc;
}

static inline __attribute__((always_inline)) __m256i x4(const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return _mm256_set1_epi32(v);
}

/* signed weight bytes (Q8_0's q, -128..127): |q| times x with q's sign */
static inline __attribute__((always_inline)) __m256i dot4_signed2(__m256i acc, __m256i q, const int8_t *x) {
    __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x4(x), q));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

static inline __attribute__((always_inline)) __m256i pair16_2(const int16_t *s) {
    int32_t w;
    memcpy(&w, s, 4);
    return _mm256_set1_epi32(w);
}

/* 8 bytes (one a row) of two groups a and b as 8 pairs of 16-bit integers (a[n], b[n]) */
static inline __attribute__((always_inline)) __m256i pairs_u8_2(const uint8_t *a, const uint8_t *b) {
    return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)a),
                                                  _mm_loadl_epi64((const __m128i *)b)));
}

static inline __attribute__((always_inline)) __m256i pairs_i8_2(const int8_t *a, const int8_t *b) {
    return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)a),
                                                  _mm_loadl_epi64((const __m128i *)b)));
}

/* Sum over n groups g of v[g] * sr[g], per output row of half h: v[g] is the group's 8 bytes for that half (at
 * v + 16 g + 8 h; unsigned Q4_K mins or signed Q6_K scales), sr[g] the row of x's sum over the group. Groups go in
 * pairs, one vpmaddwd a pair. */
static inline __attribute__((always_inline)) __m256i groups_dot2(const int n, const int is_signed, const void *v,
                                                                  int h, const int16_t *sr) {
    __m256i sum = _mm256_setzero_si256();
    for (int k = 0; k < n; k += 2) {
        const int8_t *a = (const int8_t *)v + k * 16 + 8 * h, *b = a + 16;
        __m256i pairs = is_signed ? pairs_i8_2(a, b) : pairs_u8_2((const uint8_t *)a, (const uint8_t *)b);
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, pair16_2(sr + k)));
    }
    return sum;
}

static inline __attribute__((always_inline)) __m256 halves_f16(const uint16_t *d) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d));
}

/* Q4_K, rows r0 .. r0 + NR - 1 of tile t, both halves of each 64-byte line of weights at once. A sub-block's
 * running sums take 2 x NR registers; its sums times the scales wait in part (one a sub-block, added up in the
 * integers when the superblock ends, so the same integer as the AVX-512 path's) and the float sums in y. */
static inline __attribute__((always_inline)) void q4k_rows2(const int NR, int64_t t, int64_t r0,
        int64_t nsb, int64_t K, const uint8_t *qw, const uint8_t *sc, const uint8_t *mn, const uint16_t *d,
        const uint16_t *dmin, const int8_t *q, const float *ascale, const int16_t *s32, float *y, int64_t ldy) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    for (int r = 0; r < NR; r++)
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(y + (r0 + r) * ldy + t * 16 + 8 * h, _mm256_setzero_ps());
    for (int64_t b = 0; b < nsb; b++) {
        const int64_t tb = t * nsb + b;
        const uint8_t *w = qw + tb * 2048, *scb = sc + tb * 128, *mb = mn + tb * 128;
        __m256i part[8][2][KQ_ROWS2];
#pragma GCC unroll 1
        for (int p = 0; p < 4; p++) {
#pragma GCC unroll 2
            for (int hi = 0; hi < 2; hi++) {
                const int j = 2 * p + hi;
                /* the sub-block's products as 16-bit sums, two a row: each vpmaddubsw pair is at most 2 x 15 x 127,
                 * so eight of them (30,480) fit without saturating, and the integers are the AVX-512 path's */
                __m256i acc_j[2][KQ_ROWS2];
                for (int h = 0; h < 2; h++)
                    for (int r = 0; r < NR; r++) acc_j[h][r] = _mm256_setzero_si256();
                for (int i = 0; i < 8; i++) {
                    if (!hi) prefetch(NR, w + (p * 8 + i) * 64, KQ_PF);     /* the first read of the line */
                    for (int h = 0; h < 2; h++) {
                        __m256i wv = _mm256_loadu_si256((const __m256i *)(w + (p * 8 + i) * 64 + 32 * h));
                        __m256i wq = _mm256_and_si256(hi ? _mm256_srli_epi16(wv, 4) : wv, low);
                        for (int r = 0; r < NR; r++)
                            acc_j[h][r] = keep(_mm256_add_epi16(acc_j[h][r], _mm256_maddubs_epi16(
                                wq, x4(q + (r0 + r) * K + b * QK + 32 * j + 4 * i))));
                    }
                }
                for (int h = 0; h < 2; h++) {
                    const uint8_t *sj = scb + j * 16 + 8 * h;
                    __m256i scj = pairs_u8_2(sj, sj);
                    for (int r = 0; r < NR; r++) part[j][h][r] = _mm256_madd_epi16(acc_j[h][r], scj);
                }
            }
        }
        for (int h = 0; h < 2; h++) {
            __m256 dv = halves_f16(d + tb * 16 + 8 * h), mv = halves_f16(dmin + tb * 16 + 8 * h);
            for (int r = 0; r < NR; r++) {
                __m256i isc = _mm256_setzero_si256();
                for (int j = 0; j < 8; j++) isc = _mm256_add_epi32(isc, part[j][h][r]);
                const int16_t *sr = s32 + (r0 + r) * (K / 32) + b * 8;
                __m256i imn = groups_dot2(8, 0, mb, h, sr);
                __m256 a = _mm256_set1_ps(ascale[(r0 + r) * nsb + b]);
                float *yr = y + (r0 + r) * ldy + t * 16 + 8 * h;
                __m256 acc = _mm256_loadu_ps(yr);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isc), _mm256_mul_ps(dv, a), acc);
                acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(imn), _mm256_mul_ps(mv, a), acc);
                _mm256_storeu_ps(yr, acc);
            }
        }
    }
}

static inline __attribute__((always_inline)) __m256i top2_2(__m256i top, int shift) {
    const __m256i two = _mm256_set1_epi8(0x30);
    switch (shift) {
    case 0: return _mm256_and_si256(_mm256_slli_epi16(top, 4), two);
    case 2: return _mm256_and_si256(_mm256_slli_epi16(top, 2), two);
    case 4: return _mm256_and_si256(top, two);
    default: return _mm256_and_si256(_mm256_srli_epi16(top, 2), two);
    }
}

/* Q6_K, as q4k_rows2 but for NH halves h = h0 .. h0 + NH - 1 of the tile's output rows, its sums in registers */
static inline __attribute__((always_inline)) void q6k_rows2(const int NR, const int NH, int h0, int64_t t, int64_t r0,
        int64_t nsb, int64_t K, const uint8_t *qlo, const uint8_t *qhi, const int8_t *sc, const uint16_t *d,
        const int8_t *q, const float *ascale, const int16_t *s16, float *y, int64_t ldy) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    __m256 acc[2][KQ_ROWS2];
    for (int hh = 0; hh < NH; hh++)
        for (int r = 0; r < NR; r++) acc[hh][r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nsb; b++) {
        const int64_t tb = t * nsb + b;
        const uint8_t *wl = qlo + tb * 2048, *wh = qhi + tb * 1024;
        const int8_t *scb = sc + tb * 256;
        __m256i isc[2][KQ_ROWS2];
        for (int hh = 0; hh < NH; hh++)
            for (int r = 0; r < NR; r++) isc[hh][r] = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
#pragma GCC unroll 2
            for (int hi = 0; hi < 2; hi++) {
                __m256i p[2][KQ_ROWS2];
                for (int hh = 0; hh < NH; hh++)
                    for (int r = 0; r < NR; r++) p[hh][r] = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++) {
                    if (!h0 && !hi) prefetch(NR, wl + (c * 8 + i) * 64, KQ_PF);
                    if (!h0 && !hi && i < 4) prefetch(NR, wh + (c * 4 + i) * 64, KQ_PF / 2);
                    for (int hh = 0; hh < NH; hh++) {
                        const int h = h0 + hh;
                        __m256i nib = _mm256_loadu_si256((const __m256i *)(wl + (c * 8 + i) * 64 + 32 * h));
                        __m256i top = _mm256_loadu_si256((const __m256i *)(wh + (c * 4 + (i & 3)) * 64 + 32 * h));
                        __m256i lo4 = _mm256_and_si256(hi ? _mm256_srli_epi16(nib, 4) : nib, low);
                        __m256i u = _mm256_or_si256(lo4, top2_2(top, 2 * (i >> 2) + 4 * hi));
                        /* 16-bit sums, two a row: a vpmaddubsw pair is at most 2 x 63 x 127, so two fit */
                        for (int r = 0; r < NR; r++)
                            p[hh][r] = keep(_mm256_add_epi16(p[hh][r], _mm256_maddubs_epi16(
                                u, x4(q + (r0 + r) * K + b * QK + 64 * c + 32 * hi + 4 * i))));
                    }
                    if (i & 1) {
                        /* the group's scale (signed) in both 16-bit halves of each row's lane: one vpmaddwd adds
                         * the row's two sums times it */
                        const int g = 4 * c + 2 * hi + (i >> 2);
                        for (int hh = 0; hh < NH; hh++) {
                            const int8_t *sg = scb + g * 16 + 8 * (h0 + hh);
                            __m256i s = pairs_i8_2(sg, sg);
                            for (int r = 0; r < NR; r++) {
                                isc[hh][r] = _mm256_add_epi32(isc[hh][r], _mm256_madd_epi16(p[hh][r], s));
                                p[hh][r] = _mm256_setzero_si256();
                            }
                        }
                    }
                }
            }
        }
        for (int hh = 0; hh < NH; hh++) {
            const int h = h0 + hh;
            __m256 dv = halves_f16(d + tb * 16 + 8 * h);
            for (int r = 0; r < NR; r++) {
                const int16_t *sr = s16 + (r0 + r) * (K / 16) + b * 16;
                __m256i imn = groups_dot2(16, 1, scb, h, sr);
                __m256 a = _mm256_set1_ps(ascale[(r0 + r) * nsb + b]);
                __m256i tot = _mm256_sub_epi32(isc[hh][r], _mm256_slli_epi32(imn, 5));
                acc[hh][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), _mm256_mul_ps(dv, a), acc[hh][r]);
            }
        }
    }
    for (int hh = 0; hh < NH; hh++)
        for (int r = 0; r < NR; r++) _mm256_storeu_ps(y + (r0 + r) * ldy + t * 16 + 8 * (h0 + hh), acc[hh][r]);
}

/* Q4_0, Q5_0, Q8_0, as q4k_rows2; Q8_0's bytes are q + 128, read back as signed q, so no offset term */
static inline __attribute__((always_inline)) void b32_rows2(const int NR, const int NH, const int QT, int h0, int64_t t,
        int64_t r0, int64_t nblk, int64_t K, const uint8_t *qw, const uint8_t *hb, const uint16_t *d, const int8_t *q,
        const float *ascale, const int16_t *s32, float *y, int64_t ldy) {
    const int off = QT == 6 ? 16 : 8;
    const int64_t wbytes = QT == 8 ? 512 : 256;
    const __m256i low = _mm256_set1_epi8(0x0f), five = _mm256_set1_epi8(0x10), flip = _mm256_set1_epi8((char)0x80);
    /* the 5th bits: byte k of a half takes bit k of its 32-bit mask */
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256 acc[2][KQ_ROWS2];
    for (int hh = 0; hh < NH; hh++)
        for (int r = 0; r < NR; r++) acc[hh][r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        const int64_t tb = t * nblk + b;
        const uint8_t *w = qw + tb * wbytes;
        __m256i p[2][KQ_ROWS2], p16[2][KQ_ROWS2];
        for (int hh = 0; hh < NH; hh++)
            for (int r = 0; r < NR; r++) p[hh][r] = p16[hh][r] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            if (QT == 8) {
                if (!h0) prefetch(NR, w + i * 64, KQ_PF);
                for (int hh = 0; hh < NH; hh++) {
                    __m256i sq = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + i * 64 + 32 * (h0 + hh))),
                                                  flip);
                    for (int r = 0; r < NR; r++)
                        p[hh][r] = keep(dot4_signed2(p[hh][r], sq, q + (r0 + r) * K + b * 32 + 4 * i));
                }
                continue;
            }
            if (!h0 && i < 4) prefetch(NR, w + i * 64, KQ_PF);
            for (int hh = 0; hh < NH; hh++) {
                const int h = h0 + hh;
                __m256i nib = _mm256_loadu_si256((const __m256i *)(w + (i & 3) * 64 + 32 * h));
                __m256i u = _mm256_and_si256(i < 4 ? nib : _mm256_srli_epi16(nib, 4), low);
                if (QT == 6) {
                    uint32_t bits;
                    memcpy(&bits, hb + tb * 64 + i * 8 + 4 * h, 4);
                    __m256i m = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread), bit);
                    u = _mm256_or_si256(u, _mm256_and_si256(_mm256_cmpeq_epi8(m, bit), five));
                }
                /* 16-bit sums, two a row: a vpmaddubsw pair is at most 2 x 15 x 127 (Q4_0: eight fit in 16 bits) or
                 * 2 x 31 x 127 (Q5_0: four fit), then widened to the row's 32-bit sum */
                for (int r = 0; r < NR; r++)
                    p16[hh][r] = keep(_mm256_add_epi16(p16[hh][r],
                                                       _mm256_maddubs_epi16(u, x4(q + (r0 + r) * K + b * 32 + 4 * i))));
                if (i == 7 || (QT == 6 && i == 3))
                    for (int r = 0; r < NR; r++) {
                        p[hh][r] = _mm256_add_epi32(p[hh][r], _mm256_madd_epi16(p16[hh][r], _mm256_set1_epi16(1)));
                        p16[hh][r] = _mm256_setzero_si256();
                    }
            }
        }
        for (int hh = 0; hh < NH; hh++) {
            __m256 dv = halves_f16(d + tb * 16 + 8 * (h0 + hh));
            for (int r = 0; r < NR; r++) {
                __m256i tot = QT == 8 ? p[hh][r]
                                      : _mm256_sub_epi32(p[hh][r], _mm256_set1_epi32(off * s32[(r0 + r) * (K / 32) + b]));
                acc[hh][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot),
                                             _mm256_mul_ps(dv, _mm256_set1_ps(ascale[(r0 + r) * nblk + b])), acc[hh][r]);
            }
        }
    }
    for (int hh = 0; hh < NH; hh++)
        for (int r = 0; r < NR; r++) _mm256_storeu_ps(y + (r0 + r) * ldy + t * 16 + 8 * (h0 + hh), acc[hh][r]);
}
#endif

int kq_simd(void) {
#if defined(KQ_AVX512)
    return 512;
#elif defined(KQ_AVX2)
    return 256;
#else
    return 0;
#endif
}

#if !defined(KQ_AVX512) && !defined(KQ_AVX2)       /* the portable loops read f16 scales themselves */
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) bits = sign;
        else {      /* subnormal */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) bits = sign | 0x7f800000u | (man << 13);
    else bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
#endif

/* ---- the threads -----------------------------------------------------------------------------------------
 * A product is cut into chunks of output tiles (an attention into its queries), spread over the threads by
 * OpenMP (torch's own runtime, loaded first, so the two share one pool of threads). Which thread computes a
 * chunk never changes what the chunk computes. */
typedef void (*kq_chunk_fn)(void *ctx, int64_t chunk);

static void parallel_chunks(kq_chunk_fn fn, void *ctx, int64_t chunks, int nthreads) {
    int nt = nthreads < 1 ? 1 : (chunks < nthreads ? (int)chunks : nthreads);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < chunks; i++) fn(ctx, i);
}

/* Elementwise and per-row steps (norms, rotations, the activations' quantisation) are split over the threads as
 * well once there is enough of them: each element or row is computed by the same instructions whichever thread
 * takes it, so the split changes no bit. */
#define KQ_SPLIT 4096        /* elements below which a step stays on one thread (a team costs microseconds) */

static inline int split_threads(int64_t work, int nthreads) {
    return work < KQ_SPLIT || nthreads < 1 ? 1 : nthreads;
}

/* one block of ``qb`` columns of one row: its int8 values and scale, and its sums of each 16 and 32 columns */
static void quantize_block(const float *xb, int64_t qb, int8_t *qr, float *scale, int16_t *s16, int16_t *s32) {
    float amax = 0.f;
    for (int64_t k = 0; k < qb; k++) {
        float a = fabsf(xb[k]);
        amax = a > amax ? a : amax;          /* what fmaxf gives, NaN included, without its library call */
    }
    float iscale = amax > 0.f ? 127.f / amax : 0.f;
    *scale = amax / 127.f;
    for (int64_t k = 0; k < qb; k++) {
        float v = nearbyintf(xb[k] * iscale);
        qr[k] = (int8_t)(v > 127.f ? 127.f : (v < -127.f ? -127.f : v));
    }
    for (int64_t g = 0; g < qb / 16; g++) {
        int32_t sum = 0;
        for (int k = 0; k < 16; k++) sum += qr[16 * g + k];
        s16[g] = (int16_t)sum;
    }
    for (int64_t g = 0; g < qb / 32; g++) s32[g] = (int16_t)(s16[2 * g] + s16[2 * g + 1]);
}

/* x (R, K) float -> q (R, K) int8 with one scale per ``qb`` columns (R, K/qb): 256 for the k-quants, as
 * llama.cpp's Q8_K, 32 for Q4_0, Q5_0 and Q8_0, as its Q8_0; sums of each 16 columns (R, K/16) and 32 (R, K/32),
 * as 16-bit integers (at most 32 * 127 in size), so that two of them are one 32-bit word for vpdpwssd. */
void kq_quantize_blocks(const float *x, int64_t R, int64_t K, int64_t qb, int8_t *q, float *scale, int16_t *s16,
                        int16_t *s32, int nthreads) {
    const int64_t nb = K / qb;
#pragma omp parallel for num_threads(split_threads(R * K, nthreads)) schedule(static)
    for (int64_t i = 0; i < R * nb; i++) {
        const int64_t r = i / nb, b = i % nb;
        quantize_block(x + r * K + b * qb, qb, q + r * K + b * qb, scale + i, s16 + r * (K / 16) + b * (qb / 16),
                       s32 + r * (K / 32) + b * (qb / 32));
    }
}

/* ---- Q4_K ---------------------------------------------------------------------------------------- */
#if defined(KQ_AVX512)
#define KQ_ROWS 8       /* rows of x taken together: a verify pass of up to 8 tokens reads each weight once */

/* Rows r0 .. r0 + NR - 1 of one output tile; NR is a constant at each call, so every row's sums stay in
 * registers (three a row: the two sub-blocks' products and their scaled sum). */
static inline __attribute__((always_inline)) void q4k_rows(const int NR, int64_t t, int64_t r0, int64_t nsb, int64_t K,
        const uint8_t *qw, const uint8_t *sc, const uint8_t *mn, const uint16_t *d, const uint16_t *dmin,
        const int8_t *q, const float *ascale, const int16_t *s32, float *y, int64_t ldy) {
    const __m512i low = _mm512_set1_epi8(0x0f);
    __m512 acc[KQ_ROWS];
    for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nsb; b++) {
        const int64_t tb = t * nsb + b;
        const uint8_t *w = qw + tb * 2048, *scb = sc + tb * 128, *mb = mn + tb * 128;
        __m512i isc[KQ_ROWS];
        for (int r = 0; r < NR; r++) isc[r] = _mm512_setzero_si512();
        /* sub-block j = 2p + h: the low nibbles of pair p (h = 0), then its high nibbles (h = 1) */
        for (int j = 0; j < 8; j++) {
            const int p = j >> 1, h = j & 1;
            __m512i acc_j[KQ_ROWS];
            for (int r = 0; r < NR; r++) acc_j[r] = _mm512_setzero_si512();
            for (int i = 0; i < 8; i++) {
                __m512i wv = _mm512_loadu_si512((const void *)(w + (p * 8 + i) * 64));
                if (!h) prefetch(NR, w + (p * 8 + i) * 64, KQ_PF);
                __m512i wq = _mm512_and_si512(h ? _mm512_srli_epi16(wv, 4) : wv, low);
                for (int r = 0; r < NR; r++)
                    acc_j[r] = dot4(acc_j[r], wq, q + (r0 + r) * K + b * QK + 32 * j + 4 * i);
            }
            __m512i scj = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(scb + j * 16)));
            for (int r = 0; r < NR; r++) isc[r] = _mm512_add_epi32(isc[r], _mm512_mullo_epi32(acc_j[r], scj));
        }
        __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d + tb * 16)));
        __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(dmin + tb * 16)));
        __m512i mp[4];              /* the mins of sub-blocks 2p and 2p + 1, paired for vpdpwssd */
        for (int p = 0; p < 4; p++) mp[p] = pairs_u8(mb + 2 * p * 16, mb + (2 * p + 1) * 16);
        for (int r = 0; r < NR; r++) {
            /* the mins: sum over the 8 sub-blocks of m * (the row's sum of those 32 activations) */
            const int16_t *sr = s32 + (r0 + r) * (K / 32) + b * 8;
            __m512i imn = _mm512_setzero_si512();
            for (int p = 0; p < 4; p++) imn = _mm512_dpwssd_epi32(imn, mp[p], pair16(sr + 2 * p));
            __m512 a = _mm512_set1_ps(ascale[(r0 + r) * nsb + b]);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isc[r]), _mm512_mul_ps(dv, a), acc[r]);
            acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(imn), _mm512_mul_ps(mv, a), acc[r]);
        }
    }
    for (int r = 0; r < NR; r++) _mm512_storeu_ps(y + (r0 + r) * ldy + t * 16, acc[r]);
}
#endif

static void q4k_tile(int64_t t, int64_t nsb, int64_t R, int64_t K, const uint8_t *qw, const uint8_t *sc,
                     const uint8_t *mn, const uint16_t *d, const uint16_t *dmin, const int8_t *q,
                     const float *ascale, const int16_t *s32, float *y, int64_t ldy) {
#if defined(KQ_AVX512)
    for (int64_t r0 = 0; r0 < R; r0 += KQ_ROWS) {
        switch (R - r0 < KQ_ROWS ? R - r0 : KQ_ROWS) {
#define KQ_CASE(n) case n: q4k_rows(n, t, r0, nsb, K, qw, sc, mn, d, dmin, q, ascale, s32, y, ldy); break;
        KQ_CASE(1) KQ_CASE(2) KQ_CASE(3) KQ_CASE(4) KQ_CASE(5) KQ_CASE(6) KQ_CASE(7) KQ_CASE(8)
#undef KQ_CASE
        }
    }
#elif defined(KQ_AVX2)
    /* groups of up to four rows, each reading every line of the tile whole */
    for (int64_t r0 = 0; r0 < R; r0 += KQ_ROWS2) {
        switch (R - r0 < KQ_ROWS2 ? R - r0 : KQ_ROWS2) {
#define KQ_ARGS t, r0, nsb, K, qw, sc, mn, d, dmin, q, ascale, s32, y, ldy
        case 1: q4k_rows2(1, KQ_ARGS); break;
        case 2: q4k_rows2(2, KQ_ARGS); break;
        case 3: q4k_rows2(3, KQ_ARGS); break;
        case 4: q4k_rows2(4, KQ_ARGS); break;
#undef KQ_ARGS
        }
    }
#else
    for (int64_t r = 0; r < R; r++) {
        float acc[16] = {0};
        for (int64_t b = 0; b < nsb; b++) {
            const int64_t tb = t * nsb + b;
            const uint8_t *w = qw + tb * 2048, *scb = sc + tb * 128, *mb = mn + tb * 128;
            const int8_t *xb = q + r * K + b * QK;
            const int16_t *sr = s32 + r * (K / 32) + b * 8;
            float a = ascale[r * nsb + b];
            for (int n = 0; n < 16; n++) {
                int32_t isc = 0, imn = 0;
                for (int p = 0; p < 4; p++) {
                    int32_t plo = 0, phi = 0;
                    for (int i = 0; i < 8; i++)
                        for (int c = 0; c < 4; c++) {
                            uint8_t byte = w[(p * 8 + i) * 64 + n * 4 + c];
                            plo += (byte & 15) * xb[64 * p + 4 * i + c];
                            phi += (byte >> 4) * xb[64 * p + 32 + 4 * i + c];
                        }
                    isc += plo * scb[2 * p * 16 + n] + phi * scb[(2 * p + 1) * 16 + n];
                    imn += mb[2 * p * 16 + n] * sr[2 * p] + mb[(2 * p + 1) * 16 + n] * sr[2 * p + 1];
                }
                acc[n] = fmaf((float)isc, f16_to_f32(d[tb * 16 + n]) * a, acc[n]);
                acc[n] = fmaf(-(float)imn, f16_to_f32(dmin[tb * 16 + n]) * a, acc[n]);
            }
        }
        memcpy(y + r * ldy + t * 16, acc, sizeof acc);
    }
#endif
}

/* ---- Q6_K ---------------------------------------------------------------------------------------- */
#if defined(KQ_AVX512)
/* The top 2 bits at bit ``shift`` of each byte, moved to bits 4-5 (shifts by constants: one instruction each). */
static inline __attribute__((always_inline)) __m512i top2(__m512i top, int shift) {
    const __m512i two = _mm512_set1_epi8(0x30);
    switch (shift) {
    case 0: return _mm512_and_si512(_mm512_slli_epi16(top, 4), two);
    case 2: return _mm512_and_si512(_mm512_slli_epi16(top, 2), two);
    case 4: return _mm512_and_si512(top, two);
    default: return _mm512_and_si512(_mm512_srli_epi16(top, 2), two);
    }
}

static inline __attribute__((always_inline)) void q6k_rows(const int NR, int64_t t, int64_t r0, int64_t nsb, int64_t K,
        const uint8_t *qlo, const uint8_t *qhi, const int8_t *sc, const uint16_t *d, const int8_t *q,
        const float *ascale, const int16_t *s16, float *y, int64_t ldy) {
    const __m512i low = _mm512_set1_epi8(0x0f);
    __m512 acc[KQ_ROWS];
    for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nsb; b++) {
        const int64_t tb = t * nsb + b;
        const uint8_t *wl = qlo + tb * 2048, *wh = qhi + tb * 1024;
        const int8_t *scb = sc + tb * 256;
        __m512i isc[KQ_ROWS];
        for (int r = 0; r < NR; r++) isc[r] = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m512i p[KQ_ROWS];
                for (int r = 0; r < NR; r++) p[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++) {
                    __m512i nib = _mm512_loadu_si512((const void *)(wl + (c * 8 + i) * 64));
                    if (!h) prefetch(NR, wl + (c * 8 + i) * 64, KQ_PF);
                    if (!h && i < 4) prefetch(NR, wh + (c * 4 + i) * 64, KQ_PF / 2);   /* half the bytes */
                    __m512i top = _mm512_loadu_si512((const void *)(wh + (c * 4 + (i & 3)) * 64));
                    const int shift = 2 * (i >> 2) + 4 * h;         /* where this column's top 2 bits sit */
                    __m512i lo4 = _mm512_and_si512(h ? _mm512_srli_epi16(nib, 4) : nib, low);
                    __m512i u = _mm512_or_si512(lo4, top2(top, shift));
                    for (int r = 0; r < NR; r++)
                        p[r] = dot4(p[r], u, q + (r0 + r) * K + b * QK + 64 * c + 32 * h + 4 * i);
                    if ((i & 3) == 3) {         /* a group of 16 columns done: its scale */
                        const int g = 4 * c + 2 * h + (i >> 2);
                        __m512i s = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(scb + g * 16)));
                        for (int r = 0; r < NR; r++) {
                            isc[r] = _mm512_add_epi32(isc[r], _mm512_mullo_epi32(p[r], s));
                            p[r] = _mm512_setzero_si512();
                        }
                    }
                }
            }
        }
        __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d + tb * 16)));
        __m512i sp[8];              /* the scales of groups 2k and 2k + 1, paired for vpdpwssd */
        for (int k = 0; k < 8; k++) sp[k] = pairs_i8(scb + 2 * k * 16, scb + (2 * k + 1) * 16);
        for (int r = 0; r < NR; r++) {
            /* the offset of 32: sum over the 16 groups of sc * (the row's sum of those 16 activations) */
            const int16_t *sr = s16 + (r0 + r) * (K / 16) + b * 16;
            __m512i imn = _mm512_setzero_si512();
            for (int k = 0; k < 8; k++) imn = _mm512_dpwssd_epi32(imn, sp[k], pair16(sr + 2 * k));
            __m512 a = _mm512_set1_ps(ascale[(r0 + r) * nsb + b]);
            __m512i tot = _mm512_sub_epi32(isc[r], _mm512_slli_epi32(imn, 5));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), _mm512_mul_ps(dv, a), acc[r]);
        }
    }
    for (int r = 0; r < NR; r++) _mm512_storeu_ps(y + (r0 + r) * ldy + t * 16, acc[r]);
}
#endif

static void q6k_tile(int64_t t, int64_t nsb, int64_t R, int64_t K, const uint8_t *qlo, const uint8_t *qhi,
                     const int8_t *sc, const uint16_t *d, const int8_t *q, const float *ascale, const int16_t *s16,
                     float *y, int64_t ldy) {
#if defined(KQ_AVX512)
    for (int64_t r0 = 0; r0 < R; r0 += KQ_ROWS) {
        switch (R - r0 < KQ_ROWS ? R - r0 : KQ_ROWS) {
#define KQ_CASE(n) case n: q6k_rows(n, t, r0, nsb, K, qlo, qhi, sc, d, q, ascale, s16, y, ldy); break;
        KQ_CASE(1) KQ_CASE(2) KQ_CASE(3) KQ_CASE(4) KQ_CASE(5) KQ_CASE(6) KQ_CASE(7) KQ_CASE(8)
#undef KQ_CASE
        }
    }
#elif defined(KQ_AVX2)
    /* a group of one or two rows reads each line of the tile once, both halves together; a group of three or four
     * reads the tile twice, a half at a time */
    for (int64_t r0 = 0; r0 < R; r0 += KQ_ROWS2) {
        switch (R - r0 < KQ_ROWS2 ? R - r0 : KQ_ROWS2) {
#define KQ_ARGS t, r0, nsb, K, qlo, qhi, sc, d, q, ascale, s16, y, ldy
        case 1: q6k_rows2(1, 2, 0, KQ_ARGS); break;
        case 2: q6k_rows2(2, 2, 0, KQ_ARGS); break;
        case 3: for (int h = 0; h < 2; h++) q6k_rows2(3, 1, h, KQ_ARGS); break;
        case 4: for (int h = 0; h < 2; h++) q6k_rows2(4, 1, h, KQ_ARGS); break;
#undef KQ_ARGS
        }
    }
#else
    for (int64_t r = 0; r < R; r++) {
        float acc[16] = {0};
        for (int64_t b = 0; b < nsb; b++) {
            const int64_t tb = t * nsb + b;
            const uint8_t *wl = qlo + tb * 2048, *wh = qhi + tb * 1024;
            const int8_t *scb = sc + tb * 256, *xb = q + r * K + b * QK;
            float a = ascale[r * nsb + b];
            for (int n = 0; n < 16; n++) {
                int32_t isc = 0, imn = 0;
                for (int g = 0; g < 16; g++) {
                    int32_t p = 0;
                    for (int j = 0; j < 4; j++) {       /* the four 4-column steps of group g */
                        int kg = 4 * g + j, c = kg >> 4, h = (kg >> 3) & 1, i = kg & 7;
                        int shift = 2 * (i >> 2) + 4 * h;
                        for (int e = 0; e < 4; e++) {
                            uint8_t nib = wl[(c * 8 + i) * 64 + n * 4 + e], top = wh[(c * 4 + (i & 3)) * 64 + n * 4 + e];
                            int u = ((h ? nib >> 4 : nib) & 15) | (((top >> shift) & 3) << 4);
                            p += u * xb[4 * kg + e];
                        }
                    }
                    isc += p * scb[g * 16 + n];
                    imn += scb[g * 16 + n] * s16[r * (K / 16) + b * 16 + g];
                }
                acc[n] = fmaf((float)(isc - 32 * imn), f16_to_f32(d[tb * 16 + n]) * a, acc[n]);
            }
        }
        memcpy(y + r * ldy + t * 16, acc, sizeof acc);
    }
#endif
}


/* ---- Q4_0, Q5_0 and Q8_0: blocks of 32 columns, one f16 scale each --------------------------------------
 *   Q8_0  qw[tile][block][i][16 rows][4 bytes] = q + 128 (0..255), column 4i + b; w = d * q.
 *   Q5_0  lo[tile][block][i < 4][16 rows][4 bytes]: the low 4 bits of column 4i + b (low nibble) and of column
 *         16 + 4i + b (high nibble); hi[tile][block][j][64 bits]: the 5th bit of column 4j + b of row n at bit
 *         4n + b; u = q + 16 (0..31); w = d * (u - 16).
 *   Q4_0  lo as Q5_0's, no 5th bits; u = q + 8 (0..15); w = d * (u - 8).
 *   d[tile][block][16] (f16). The activations: one scale per 32 columns (llama.cpp's Q8_0). */
#if defined(KQ_AVX512)
/* Rows r0 .. r0 + NR - 1 of one output tile; NR and QT are constants at each call (b32_tile's switch), so every
 * row's sums stay in registers and no type test runs inside the loop. */
static inline __attribute__((always_inline)) void b32_rows(const int NR, const int QT, int64_t t, int64_t r0,
        int64_t nblk, int64_t K, const uint8_t *qw, const uint8_t *hb, const uint16_t *d, const int8_t *q,
        const float *ascale, const int16_t *s32, float *y, int64_t ldy) {
    const int off = QT == 8 ? 128 : QT == 6 ? 16 : 8;
    const int64_t wbytes = QT == 8 ? 512 : 256;
    const __m512i low = _mm512_set1_epi8(0x0f), five = _mm512_set1_epi8(0x10);
    __m512 acc[KQ_ROWS];
    for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        const int64_t tb = t * nblk + b;
        const uint8_t *w = qw + tb * wbytes;
        __m512i p[KQ_ROWS];
        for (int r = 0; r < NR; r++) p[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            __m512i u;
            if (QT == 8) {
                u = _mm512_loadu_si512((const void *)(w + i * 64));
                prefetch(NR, w + i * 64, KQ_PF);
            } else {
                if (i < 4) prefetch(NR, w + i * 64, KQ_PF);
                __m512i nib = _mm512_loadu_si512((const void *)(w + (i & 3) * 64));
                u = _mm512_and_si512(i < 4 ? nib : _mm512_srli_epi16(nib, 4), low);
                if (QT == 6) {
                    uint64_t bits;
                    memcpy(&bits, hb + tb * 64 + i * 8, 8);
                    u = _mm512_or_si512(u, _mm512_maskz_mov_epi8((__mmask64)bits, five));
                }
            }
            for (int r = 0; r < NR; r++) p[r] = dot4(p[r], u, q + (r0 + r) * K + b * 32 + 4 * i);
        }
        __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d + tb * 16)));
        for (int r = 0; r < NR; r++) {
            __m512i tot = _mm512_sub_epi32(p[r], _mm512_set1_epi32(off * s32[(r0 + r) * (K / 32) + b]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot),
                                     _mm512_mul_ps(dv, _mm512_set1_ps(ascale[(r0 + r) * nblk + b])), acc[r]);
        }
    }
    for (int r = 0; r < NR; r++) _mm512_storeu_ps(y + (r0 + r) * ldy + t * 16, acc[r]);
}
#endif

static void b32_tile(int qtype, int64_t t, int64_t nblk, int64_t R, int64_t K, const uint8_t *qw, const uint8_t *hb,
                     const uint16_t *d, const int8_t *q, const float *ascale, const int16_t *s32, float *y,
                     int64_t ldy) {
#if defined(KQ_AVX512)
    for (int64_t r0 = 0; r0 < R; r0 += KQ_ROWS) {
        const int nr = (int)(R - r0 < KQ_ROWS ? R - r0 : KQ_ROWS);
        switch (qtype * 16 + nr) {
#define KQ_CASE(qt, n) case qt * 16 + n: b32_rows(n, qt, t, r0, nblk, K, qw, hb, d, q, ascale, s32, y, ldy); break;
#define KQ_TYPE(qt) KQ_CASE(qt, 1) KQ_CASE(qt, 2) KQ_CASE(qt, 3) KQ_CASE(qt, 4) KQ_CASE(qt, 5) KQ_CASE(qt, 6) \
                    KQ_CASE(qt, 7) KQ_CASE(qt, 8)
        KQ_TYPE(2) KQ_TYPE(6) KQ_TYPE(8)
#undef KQ_TYPE
#undef KQ_CASE
        }
    }
#elif defined(KQ_AVX2)
    /* a group of one or two rows reads each line of the tile once, both halves together; a group of three or four
     * reads the tile twice, a half at a time */
    for (int64_t r0 = 0; r0 < R; r0 += KQ_ROWS2) {
        const int nr = (int)(R - r0 < KQ_ROWS2 ? R - r0 : KQ_ROWS2);
        switch (qtype * 16 + nr) {
#define KQ_ARGS t, r0, nblk, K, qw, hb, d, q, ascale, s32, y, ldy
#define KQ_TYPE(qt) \
        case qt * 16 + 1: b32_rows2(1, 2, qt, 0, KQ_ARGS); break; \
        case qt * 16 + 2: b32_rows2(2, 2, qt, 0, KQ_ARGS); break; \
        case qt * 16 + 3: for (int h = 0; h < 2; h++) b32_rows2(3, 1, qt, h, KQ_ARGS); break; \
        case qt * 16 + 4: for (int h = 0; h < 2; h++) b32_rows2(4, 1, qt, h, KQ_ARGS); break;
        KQ_TYPE(2) KQ_TYPE(6) KQ_TYPE(8)
#undef KQ_TYPE
#undef KQ_ARGS
        }
    }
#else
    const int off = qtype == 8 ? 128 : qtype == 6 ? 16 : 8;
    const int64_t wbytes = qtype == 8 ? 512 : 256;
    for (int64_t r = 0; r < R; r++) {
        float acc[16] = {0};
        for (int64_t b = 0; b < nblk; b++) {
            const int64_t tb = t * nblk + b;
            const uint8_t *w = qw + tb * wbytes;
            const int8_t *xb = q + r * K + b * 32;
            for (int n = 0; n < 16; n++) {
                int32_t p = 0;
                for (int i = 0; i < 8; i++)
                    for (int e = 0; e < 4; e++) {
                        int u;
                        if (qtype == 8) u = w[i * 64 + n * 4 + e];
                        else if (qtype == 2) {
                            uint8_t nib = w[(i & 3) * 64 + n * 4 + e];
                            u = (i < 4 ? nib : nib >> 4) & 15;
                        } else {
                            uint8_t nib = w[(i & 3) * 64 + n * 4 + e];
                            uint64_t bits;
                            memcpy(&bits, hb + tb * 64 + i * 8, 8);
                            u = ((i < 4 ? nib : nib >> 4) & 15) | (int)(((bits >> (4 * n + e)) & 1) << 4);
                        }
                        p += u * xb[4 * i + e];
                    }
                float dn = f16_to_f32(d[tb * 16 + n]) * ascale[r * nblk + b];
                acc[n] = fmaf((float)(p - off * s32[r * (K / 32) + b]), dn, acc[n]);
            }
        }
        memcpy(y + r * ldy + t * 16, acc, sizeof acc);
    }
#endif
}

/* ---- one call a fused product: activations quantised once, every part's tiles in one parallel loop ---- */
typedef struct {
    int32_t qtype;              /* ggml's numbers: 2 Q4_0, 6 Q5_0, 8 Q8_0, 12 Q4_K, 14 Q6_K */
    int64_t n;                  /* output rows, a multiple of 16 */
    int64_t col;                /* its first column in y */
    const void *qw, *sc, *mn, *d, *dmin;   /* Q6_K: qw its low 4 bits, mn its top 2; Q5_0: mn its 5th bits */
    const float *bias;          /* n values or NULL */
} kq_part;

typedef struct {
    const kq_part *parts;
    int64_t R, K, ldy, per, tiles;
    const int8_t *q;
    const float *ascale;
    const int16_t *s16, *s32;
    float *y;
} linear_job;

static void linear_tile(const linear_job *j, int64_t g) {
    int64_t t = g;
    int i = 0;
    while (t >= j->parts[i].n / 16) t -= j->parts[i++].n / 16;
    const kq_part *p = &j->parts[i];
    const int64_t R = j->R, K = j->K, ldy = j->ldy;
    float *yp = j->y + p->col;
    if (p->qtype == 2 || p->qtype == 6 || p->qtype == 8)
        b32_tile(p->qtype, t, K / 32, R, K, (const uint8_t *)p->qw, (const uint8_t *)p->mn, (const uint16_t *)p->d,
                 j->q, j->ascale, j->s32, yp, ldy);
    else if (p->qtype == 12)
        q4k_tile(t, K / QK, R, K, (const uint8_t *)p->qw, (const uint8_t *)p->sc, (const uint8_t *)p->mn,
                 (const uint16_t *)p->d, (const uint16_t *)p->dmin, j->q, j->ascale, j->s32, yp, ldy);
    else
        q6k_tile(t, K / QK, R, K, (const uint8_t *)p->qw, (const uint8_t *)p->mn, (const int8_t *)p->sc,
                 (const uint16_t *)p->d, j->q, j->ascale, j->s16, yp, ldy);
    if (p->bias)
        for (int64_t r = 0; r < R; r++)
            for (int k = 0; k < 16; k++) yp[r * ldy + t * 16 + k] += p->bias[t * 16 + k];
}

static void linear_chunk(void *ctx, int64_t c) {
    const linear_job *j = (const linear_job *)ctx;
    int64_t end = (c + 1) * j->per < j->tiles ? (c + 1) * j->per : j->tiles;
    for (int64_t g = c * j->per; g < end; g++) linear_tile(j, g);
}

/* tiles a chunk holds: 8 chunks a thread (a chunk's tiles are neighbours in memory) */
static int64_t chunk_tiles(int64_t tiles, int nthreads) {
    int64_t want = 8 * (int64_t)(nthreads < 1 ? 1 : nthreads);
    return tiles <= want ? 1 : (tiles + want - 1) / want;
}

void kq_linear(const float *x, int64_t R, int64_t K, const kq_part *parts, int nparts, float *y, int64_t ldy,
               int nthreads) {
    const int kquant = parts[0].qtype == 12 || parts[0].qtype == 14;    /* a product's parts share one family */
    int64_t qb = kquant ? QK : 32, tiles = 0;
    for (int i = 0; i < nparts; i++) tiles += parts[i].n / 16;
    int8_t *q = (int8_t *)malloc((size_t)(R * K));
    float *ascale = (float *)malloc(sizeof(float) * (size_t)(R * (K / qb)));
    int16_t *s16 = (int16_t *)malloc(sizeof(int16_t) * (size_t)(R * (K / 16)));
    int16_t *s32 = (int16_t *)malloc(sizeof(int16_t) * (size_t)(R * (K / 32)));
    kq_quantize_blocks(x, R, K, qb, q, ascale, s16, s32, nthreads);
    linear_job job = {parts, R, K, ldy, chunk_tiles(tiles, nthreads), tiles, q, ascale, s16, s32, y};
    parallel_chunks(linear_chunk, &job, (tiles + job.per - 1) / job.per, nthreads);
    free(q); free(ascale); free(s16); free(s32);
}

/* ---- attention, each query on its own ------------------------------------------------------------------
 * q (H, T, D) of T new tokens at positions start .. start + T - 1; k, v (KV, cap, D) a layer's cache, already
 * holding those tokens; out (T, H, D). Query t of head h attends keys 0 .. start + t of KV head h / (H / KV):
 * dot products in a fixed order, the softmax, then the weighted sum of values, the same instructions for a
 * query whether it comes alone or with others, so a verify pass attends as 1-token steps do. */
/* a . b over D floats: 16 running sums (element i goes to sum i % 16), each an FMA a step, then folded in halves:
 * sum k gets sum k + 8, then k + 4, k + 2, k + 1 (``fold16``). Every build (AVX-512, AVX2, plain C) forms the same
 * 16 sums and folds them the same way, so an attention gives the same bits on every CPU (a reduction left to each
 * instruction set would add its lanes in its own order). */
static float fold16(float part[16]) {
    for (int w = 8; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) part[k] = part[k] + part[k + w];
    return part[0];
}

static float dot_d(const float *a, const float *b, int64_t D) {
    float s = 0.f;
    if (D % 16 == 0) {
        float part[16];
#if defined(KQ_AVX512)
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < D; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
        _mm512_storeu_ps(part, acc);
#elif defined(KQ_AVX2)
        __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
        for (int64_t i = 0; i < D; i += 16) {
            lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), lo);
            hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), hi);
        }
        _mm256_storeu_ps(part, lo);
        _mm256_storeu_ps(part + 8, hi);
#else
        for (int k = 0; k < 16; k++) part[k] = 0.f;
        for (int64_t i = 0; i < D; i += 16)
            for (int k = 0; k < 16; k++) part[k] = fmaf(a[i + k], b[i + k], part[k]);
#endif
        return fold16(part);
    }
    for (int64_t i = 0; i < D; i++) s = fmaf(a[i], b[i], s);
    return s;
}

/* out[i] = dot_d(a, b + i * D, D) for the n keys at b: the same sums folded the same way, 8 keys at a time so that
 * their chains of FMAs overlap, and their folds are done in vector registers for the 8 together (each add of a fold
 * adds the same two numbers fold16 adds, only more of them at once). */
#define KQ_KEYS 8
static void dots(const float *a, const float *b, int64_t D, int64_t n, float *out) {
    int64_t i = 0;
    if (D % 16 == 0) {
        for (; i + KQ_KEYS <= n; i += KQ_KEYS) {
            const float *bk = b + i * D;
#if defined(KQ_AVX512)
            __m512 acc[KQ_KEYS];
            for (int g = 0; g < KQ_KEYS; g++) acc[g] = _mm512_setzero_ps();
            for (int64_t e = 0; e < D; e += 16) {
                const __m512 av = _mm512_loadu_ps(a + e);
                for (int g = 0; g < KQ_KEYS; g++) acc[g] = _mm512_fmadd_ps(av, _mm512_loadu_ps(bk + g * D + e), acc[g]);
            }
            /* k + 8: keys g and g + 1 side by side, each in one half */
            __m512 f8[4], f4[2];
            for (int g = 0; g < 4; g++)
                f8[g] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * g], acc[2 * g + 1], 0x44),
                                      _mm512_shuffle_f32x4(acc[2 * g], acc[2 * g + 1], 0xEE));
            /* k + 4: one key a quarter, keys 0-3 in f4[0], 4-7 in f4[1] */
            for (int g = 0; g < 2; g++)
                f4[g] = _mm512_add_ps(_mm512_shuffle_f32x4(f8[2 * g], f8[2 * g + 1], 0x88),
                                      _mm512_shuffle_f32x4(f8[2 * g], f8[2 * g + 1], 0xDD));
            /* k + 2: quarter q holds key q's two sums, then key q + 4's */
            const __m512 f2 = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(f4[0]),
                                                                                _mm512_castps_pd(f4[1]))),
                                            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(f4[0]),
                                                                                _mm512_castps_pd(f4[1]))));
            /* k + 1: quarter q's lanes 0 and 1 hold keys q and q + 4 */
            const __m512 f1 = _mm512_add_ps(_mm512_shuffle_ps(f2, f2, 0x88), _mm512_shuffle_ps(f2, f2, 0xDD));
            const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
            _mm256_storeu_ps(out + i, _mm512_castps512_ps256(_mm512_permutexvar_ps(order, f1)));
#elif defined(KQ_AVX2)
            __m256 lo[KQ_KEYS], hi[KQ_KEYS];
            for (int g = 0; g < KQ_KEYS; g++) lo[g] = hi[g] = _mm256_setzero_ps();
            for (int64_t e = 0; e < D; e += 16) {
                const __m256 al = _mm256_loadu_ps(a + e), ah = _mm256_loadu_ps(a + e + 8);
                for (int g = 0; g < KQ_KEYS; g++) {
                    lo[g] = _mm256_fmadd_ps(al, _mm256_loadu_ps(bk + g * D + e), lo[g]);
                    hi[g] = _mm256_fmadd_ps(ah, _mm256_loadu_ps(bk + g * D + e + 8), hi[g]);
                }
            }
            __m256 f8[KQ_KEYS], f4[4], f2[2];
            for (int g = 0; g < KQ_KEYS; g++) f8[g] = _mm256_add_ps(lo[g], hi[g]);                  /* k + 8 */
            for (int g = 0; g < 4; g++)                          /* k + 4: keys 2g and 2g + 1, one a half each */
                f4[g] = _mm256_add_ps(_mm256_permute2f128_ps(f8[2 * g], f8[2 * g + 1], 0x20),
                                      _mm256_permute2f128_ps(f8[2 * g], f8[2 * g + 1], 0x31));
            for (int g = 0; g < 2; g++)                          /* k + 2: halves hold keys 4g, 4g + 2 | 4g + 1, 4g + 3 */
                f2[g] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(f4[2 * g]),
                                                                          _mm256_castps_pd(f4[2 * g + 1]))),
                                      _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(f4[2 * g]),
                                                                          _mm256_castps_pd(f4[2 * g + 1]))));
            /* k + 1: keys 0, 2, 4, 6 | 1, 3, 5, 7 */
            const __m256 f1 = _mm256_add_ps(_mm256_shuffle_ps(f2[0], f2[1], 0x88), _mm256_shuffle_ps(f2[0], f2[1], 0xDD));
            _mm256_storeu_ps(out + i, _mm256_permutevar8x32_ps(f1, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
#else
            for (int g = 0; g < KQ_KEYS; g++) out[i + g] = dot_d(a, bk + g * D, D);
#endif
        }
    }
    for (; i < n; i++) out[i] = dot_d(a, b + i * D, D);
}

/* o[e] = sum over the n values v[i] of c[i] * v[i][e], each element's FMAs in the order of i (as a loop over i
 * around a loop over e would make them), a block of the row held in registers across all of i. ``first``: o starts
 * at zero; else the sums go on from what o holds, so that values taken in spans, one after the other, give the
 * same bits as all of them at once. */
static void weighted_sum(const float *c, const float *v, int64_t D, int64_t n, float *o, int first) {
    int64_t e0 = 0;
#if defined(KQ_AVX512)
    for (; e0 + 64 <= D; e0 += 64) {
        __m512 acc[4];
        for (int k = 0; k < 4; k++) acc[k] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(o + e0 + 16 * k);
        for (int64_t i = 0; i < n; i++) {
            const __m512 ci = _mm512_set1_ps(c[i]);
            for (int k = 0; k < 4; k++) acc[k] = _mm512_fmadd_ps(ci, _mm512_loadu_ps(v + i * D + e0 + 16 * k), acc[k]);
        }
        for (int k = 0; k < 4; k++) _mm512_storeu_ps(o + e0 + 16 * k, acc[k]);
    }
#elif defined(KQ_AVX2)
    for (; e0 + 32 <= D; e0 += 32) {
        __m256 acc[4];
        for (int k = 0; k < 4; k++) acc[k] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(o + e0 + 8 * k);
        for (int64_t i = 0; i < n; i++) {
            const __m256 ci = _mm256_set1_ps(c[i]);
            for (int k = 0; k < 4; k++) acc[k] = _mm256_fmadd_ps(ci, _mm256_loadu_ps(v + i * D + e0 + 8 * k), acc[k]);
        }
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(o + e0 + 8 * k, acc[k]);
    }
#endif
    if (first)
        for (int64_t e = e0; e < D; e++) o[e] = 0.f;
    for (int64_t i = 0; i < n; i++)
        for (int64_t e = e0; e < D; e++) o[e] = fmaf(c[i], v[i * D + e], o[e]);
}

/* exp(x), as every build computes it: x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2 (ln2 in two
 * parts, Cody and Waite's), exp(r) by Cephes' expf polynomial, then times 2^n set in the exponent's bits. Each step
 * is one IEEE operation (an FMA rounds once) in the same order in the AVX-512, AVX2 and plain C builds, so the three
 * give the same bits, where the C library's expf might not on another CPU or library version. Below -87, where
 * exp(x) < 1.7e-38 is nothing beside a softmax's largest term (exp(0) = 1), and for a NaN, it gives 0. Within
 * 2 ulp of the exact value (tests/test_kquant.py checks it against the C library's). */
#define KQ_EXP_MIN (-87.f)
#define KQ_LOG2E 1.44269504088896341f
#define KQ_ROUND 12582912.f               /* 1.5 * 2^23: x + it rounds x to an integer, held in the low bits */
#define KQ_LN2_HI 0.693359375f
#define KQ_LN2_LO (-2.12194440e-4f)
static const float KQ_EXP_P[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f,
                                  1.6666665459e-1f, 5.0000001201e-1f};

static inline float exp_one(float x) {
    if (!(x >= KQ_EXP_MIN)) return 0.f;
    const float n = fmaf(x, KQ_LOG2E, KQ_ROUND) - KQ_ROUND;
    const float r = fmaf(n, -KQ_LN2_LO, fmaf(n, -KQ_LN2_HI, x)), z = r * r;
    float p = KQ_EXP_P[0];
    for (int k = 1; k < 6; k++) p = fmaf(p, r, KQ_EXP_P[k]);
    union { uint32_t u; float f; } two = {(uint32_t)((int32_t)n + 127) << 23};
    return (fmaf(p, z, r) + 1.f) * two.f;
}

#if defined(KQ_AVX512)
static inline __m512 exp16(__m512 x) {
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(KQ_EXP_MIN), _CMP_GE_OQ);
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(KQ_LOG2E), _mm512_set1_ps(KQ_ROUND)),
                                   _mm512_set1_ps(KQ_ROUND));
    const __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-KQ_LN2_LO),
                                     _mm512_fmadd_ps(n, _mm512_set1_ps(-KQ_LN2_HI), x));
    const __m512 z = _mm512_mul_ps(r, r);
    __m512 p = _mm512_set1_ps(KQ_EXP_P[0]);
    for (int k = 1; k < 6; k++) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KQ_EXP_P[k]));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, z, r), _mm512_set1_ps(1.f));
    return _mm512_maskz_mov_ps(live, _mm512_mul_ps(y, _mm512_castsi512_ps(e)));
}
#elif defined(KQ_AVX2)
static inline __m256 exp8(__m256 x) {
    const __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(KQ_EXP_MIN), _CMP_GE_OQ);
    const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(KQ_LOG2E), _mm256_set1_ps(KQ_ROUND)),
                                   _mm256_set1_ps(KQ_ROUND));
    const __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-KQ_LN2_LO),
                                     _mm256_fmadd_ps(n, _mm256_set1_ps(-KQ_LN2_HI), x));
    const __m256 z = _mm256_mul_ps(r, r);
    __m256 p = _mm256_set1_ps(KQ_EXP_P[0]);
    for (int k = 1; k < 6; k++) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KQ_EXP_P[k]));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, z, r), _mm256_set1_ps(1.f));
    return _mm256_and_ps(live, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}
#endif

/* y = exp(x) for n floats, as the softmax computes it (exported for the tests). */
void kq_exp(const float *x, float *y, int64_t n) {
    int64_t i = 0;
#if defined(KQ_AVX512)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, exp16(_mm512_loadu_ps(x + i)));
#elif defined(KQ_AVX2)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
#endif
    for (; i < n; i++) y[i] = exp_one(x[i]);
}

/* One query's softmax over its n scores, in place: each score times ``scale``, the largest taken away, exp, and
 * each divided by the sum. That sum is kept as 16 running sums (score i goes to sum i % 16), then added from the
 * first to the last, the same in every build, so every build gives the same bits. The largest score is the same
 * whichever order finds it. */
static void softmax(float *w, int64_t n, float scale) {
    float m = -INFINITY, part[16], sum = 0.f;
    int64_t i = 0;
#if defined(KQ_AVX512)
    __m512 top = _mm512_set1_ps(-INFINITY), acc = _mm512_setzero_ps();
    const __m512 sc = _mm512_set1_ps(scale);
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(w + i), sc);
        _mm512_storeu_ps(w + i, x);
        top = _mm512_max_ps(x, top);                 /* x where x > top, else top: a NaN is passed over */
    }
    _mm512_storeu_ps(part, top);
#elif defined(KQ_AVX2)
    __m256 top[2] = {_mm256_set1_ps(-INFINITY), _mm256_set1_ps(-INFINITY)}, acc[2];
    const __m256 sc = _mm256_set1_ps(scale);
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 2; k++) {
            const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(w + i + 8 * k), sc);
            _mm256_storeu_ps(w + i + 8 * k, x);
            top[k] = _mm256_max_ps(x, top[k]);
        }
    _mm256_storeu_ps(part, top[0]);
    _mm256_storeu_ps(part + 8, top[1]);
#else
    for (int k = 0; k < 16; k++) part[k] = -INFINITY;
#endif
    for (int k = 0; k < 16; k++) m = part[k] > m ? part[k] : m;
    for (; i < n; i++) {
        w[i] *= scale;
        m = w[i] > m ? w[i] : m;                     /* fmaxf's result without its library call */
    }
    i = 0;
#if defined(KQ_AVX512)
    const __m512 mv = _mm512_set1_ps(m);
    for (; i + 16 <= n; i += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(w + i), mv));
        _mm512_storeu_ps(w + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    _mm512_storeu_ps(part, acc);
#elif defined(KQ_AVX2)
    const __m256 mv = _mm256_set1_ps(m);
    acc[0] = acc[1] = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 2; k++) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(w + i + 8 * k), mv));
            _mm256_storeu_ps(w + i + 8 * k, e);
            acc[k] = _mm256_add_ps(acc[k], e);
        }
    _mm256_storeu_ps(part, acc[0]);
    _mm256_storeu_ps(part + 8, acc[1]);
#else
    for (int k = 0; k < 16; k++) part[k] = 0.f;
#endif
    for (; i < n; i++) {
        w[i] = exp_one(w[i] - m);
        part[i % 16] += w[i];
    }
    for (int k = 0; k < 16; k++) sum += part[k];
    const float inv = 1.f / sum;
    i = 0;
#if defined(KQ_AVX512)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(w + i, _mm512_mul_ps(_mm512_loadu_ps(w + i), _mm512_set1_ps(inv)));
#endif
    for (; i < n; i++) w[i] *= inv;
}

/* The queries of one or more sequences: sequence s holds rows off[s] .. off[s + 1] - 1, its queries at q + off[s]
 * * H * D as (H, n_s, D), its cache k[s], v[s] (KV, cap[s], D) for this layer, its first new token at position
 * start[s]; out (rows, H, D).
 *
 * A job takes the queries of up to KQ_QROWS rows of one sequence and of the heads that share one KV head (or a part
 * of them, where there would be fewer jobs than threads), and reads its keys, then its values, KQ_SPAN at a time
 * for all those queries together: the 6 or 7 heads of a group and the rows of a verify pass read each key once
 * from memory instead of once each. Every query's dot products, softmax and weighted sum are still its own, in
 * the same order, so which job, thread or pass takes a query changes nothing it computes. */
#define KQ_QROWS 8
#define KQ_SPAN 64          /* 64 keys of 128 floats: 32 KB, held in the L1 cache while each query reads them */

typedef struct {
    const float *q;
    const float *const *k, *const *v;
    float *out;
    int64_t H, KV, D, nseq;
    const int64_t *off, *cap, *start;
    float scale;
    int64_t parts;          /* the jobs each group of heads is cut into */
    const int64_t *first;   /* sequence s's jobs are first[s] .. first[s + 1] - 1 */
} attend_job;

static int64_t row_blocks(int64_t rows) {
    return (rows + KQ_QROWS - 1) / KQ_QROWS;
}

static void attend_block(void *ctx, int64_t job) {
    const attend_job *j = (const attend_job *)ctx;
    const int64_t D = j->D, H = j->H, group = j->H / j->KV, parts = j->parts;
    int64_t s = 0;
    while (job >= j->first[s + 1]) s++;
    const int64_t rows = j->off[s + 1] - j->off[s], start = j->start[s], local = job - j->first[s];
    /* the last rows (the most keys) first: the threads take jobs as they free up, the longest early */
    const int64_t b = row_blocks(rows) - 1 - local / (j->KV * parts), kvh = local / parts % j->KV, p = local % parts;
    const int64_t h0 = kvh * group + p * group / parts, h1 = kvh * group + (p + 1) * group / parts;
    const int64_t t0 = b * KQ_QROWS, t1 = t0 + KQ_QROWS < rows ? t0 + KQ_QROWS : rows;
    const int64_t nt = t1 - t0, width = start + t1;           /* the keys the last row attends */
    const float *kh = j->k[s] + kvh * j->cap[s] * D, *vh = j->v[s] + kvh * j->cap[s] * D;
    float *w = (float *)malloc(sizeof(float) * (size_t)((h1 - h0) * nt * width));
#define KQ_QUERY(h, t) (w + (((h) - h0) * nt + (t) - t0) * width)
    for (int64_t i0 = 0; i0 < width; i0 += KQ_SPAN)
        for (int64_t h = h0; h < h1; h++)
            for (int64_t t = t0; t < t1; t++) {
                const int64_t n = start + t + 1, len = n - i0 < KQ_SPAN ? n - i0 : KQ_SPAN;
                if (len > 0) dots(j->q + (H * j->off[s] + h * rows + t) * D, kh + i0 * D, D, len, KQ_QUERY(h, t) + i0);
            }
    for (int64_t h = h0; h < h1; h++)
        for (int64_t t = t0; t < t1; t++) softmax(KQ_QUERY(h, t), start + t + 1, j->scale);
    for (int64_t i0 = 0; i0 < width; i0 += KQ_SPAN)
        for (int64_t h = h0; h < h1; h++)
            for (int64_t t = t0; t < t1; t++) {
                const int64_t n = start + t + 1, len = n - i0 < KQ_SPAN ? n - i0 : KQ_SPAN;
                if (len > 0)
                    weighted_sum(KQ_QUERY(h, t) + i0, vh + i0 * D, D, len, j->out + ((j->off[s] + t) * H + h) * D,
                                 i0 == 0);
            }
#undef KQ_QUERY
    free(w);
}

static void attend(attend_job *job, int nthreads) {
    int64_t first[job->nseq + 1], blocks = 0;
    for (int64_t s = 0; s < job->nseq; s++) blocks += row_blocks(job->off[s + 1] - job->off[s]);
    /* a group's heads are cut into parts only where whole groups would not give each thread a job */
    const int64_t group = job->H / job->KV, whole = blocks * job->KV;
    job->parts = 1;
    if (whole < nthreads) job->parts = (nthreads + whole - 1) / whole;
    if (job->parts > group) job->parts = group;
    first[0] = 0;
    for (int64_t s = 0; s < job->nseq; s++)
        first[s + 1] = first[s] + row_blocks(job->off[s + 1] - job->off[s]) * job->KV * job->parts;
    job->first = first;
    const int64_t jobs = first[job->nseq];
    const int nt = nthreads < 1 ? 1 : (jobs < nthreads ? (int)jobs : nthreads);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t i = 0; i < jobs; i++) attend_block(job, i);
}

/* q (H, T, D) of T new tokens at positions start .. start + T - 1 of one sequence; k, v (KV, cap, D) a layer's
 * cache, already holding those tokens; out (T, H, D). */
void kq_attend(const float *q, const float *k, const float *v, float *out, int64_t H, int64_t KV, int64_t T,
               int64_t D, int64_t cap, int64_t start, float scale, int nthreads) {
    const int64_t off[2] = {0, T};
    attend_job job = {q, &k, &v, out, H, KV, D, 1, off, &cap, &start, scale, 1, NULL};
    attend(&job, nthreads);
}

/* ---- a whole decoder layer (Qwen2 / Llama), for one or more sequences in one pass ----------------------
 * x (T, hidden) is updated in place: x += o(attention(rope(qkv(rms(x))))); x += down(silu(gate) * up) of
 * rms(x). Every step is per row (per token) in a fixed order, the products and the attention as above, so a
 * token's row does not depend on the others in the pass. Sequence s holds rows off[s] .. off[s + 1] - 1 at
 * positions start[s] ..., its keys and values written into its own cache (KV, cap[s], D) for this layer. */
typedef struct {
    const float *ln1, *ln2;
    const kq_part *qkv, *o, *gu, *down;
    int32_t n_qkv, n_o, n_gu, n_down;
} kq_layer_w;

static void rms_rows(const float *x, const float *w, float *y, int64_t T, int64_t n, float eps, int nthreads) {
#pragma omp parallel for num_threads(split_threads(T * n, nthreads)) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *xr = x + t * n;
        double ss = 0.0;
        for (int64_t i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
        for (int64_t i = 0; i < n; i++) y[t * n + i] = xr[i] * inv * w[i];
    }
}

/* the model's last norm, before its output layer: the layers' own, so that it too gives the same bits everywhere */
void kq_rms(const float *x, const float *w, float *y, int64_t T, int64_t n, float eps) {
    rms_rows(x, w, y, T, n, eps, 1);
}

/* x[i] += y[i] */
static void add_rows(float *x, const float *y, int64_t n, int nthreads) {
#pragma omp parallel for num_threads(split_threads(n, nthreads)) schedule(static)
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

/* g = silu(gate) * up, row by row, from gu (T, 2 * inter) = [gate | up] */
static void silu_rows(const float *gu, float *g, int64_t T, int64_t inter, int nthreads) {
#pragma omp parallel for num_threads(split_threads(T * inter, nthreads)) schedule(static)
    for (int64_t i = 0; i < T * inter; i++) {
        const int64_t t = i / inter, c = i % inter;
        float a = gu[t * 2 * inter + c], b = gu[t * 2 * inter + inter + c];
        g[i] = a / (1.f + expf(-a)) * b;
    }
}

/* Each new row's queries and keys rotated (NEOX halves: element i with i + D / 2) at its position, its keys and
 * values written into its sequence's cache, and its queries laid out (H, n_s, D) per sequence for ``attend``. The
 * angles' cosines and sines are taken once a row for all heads. */
static void rope_rows(float *qkv, float *q, int64_t T, int64_t H, int64_t KV, int64_t D, int nseq, const int64_t *off,
                      const int64_t *start, float *const *kc, float *const *vc, const int64_t *cap,
                      const float *inv_freq, int nthreads) {
    const int64_t qs = H * D, ks = KV * D, width = qs + 2 * ks;
#pragma omp parallel for num_threads(split_threads(T * width, nthreads)) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        int s = 0;
        while (t >= off[s + 1]) s++;
        const int64_t pos = start[s] + t - off[s], rows = off[s + 1] - off[s];
        float *row = qkv + t * width;
        float c[D / 2], sn[D / 2];
        for (int64_t i = 0; i < D / 2; i++) {
            float f = (float)pos * inv_freq[i];
            c[i] = cosf(f);
            sn[i] = sinf(f);
        }
        for (int64_t head = 0; head < H + KV; head++) {
            float *v = row + head * D;
            for (int64_t i = 0; i < D / 2; i++) {
                float a = v[i], b = v[i + D / 2];
                v[i] = a * c[i] - b * sn[i];
                v[i + D / 2] = b * c[i] + a * sn[i];
            }
        }
        for (int64_t kh = 0; kh < KV; kh++) {
            memcpy(kc[s] + (kh * cap[s] + pos) * D, row + qs + kh * D, sizeof(float) * (size_t)D);
            memcpy(vc[s] + (kh * cap[s] + pos) * D, row + qs + ks + kh * D, sizeof(float) * (size_t)D);
        }
        for (int64_t head = 0; head < H; head++)
            memcpy(q + (H * off[s] + head * rows + t - off[s]) * D, row + head * D, sizeof(float) * (size_t)D);
    }
}

void kq_layer(float *x, int64_t T, int64_t hidden, const kq_layer_w *lw, int64_t H, int64_t KV, int64_t D,
              int64_t inter, int nseq, const int64_t *off, const int64_t *start, float *const *kbase,
              float *const *vbase, const int64_t *cap, int64_t layer, const float *inv_freq, float eps, float scale,
              int nthreads) {
    int64_t qs = H * D, ks = KV * D, width = qs + 2 * ks;
    float *kc[nseq], *vc[nseq];             /* this layer's block of each sequence's cache (layers, KV, cap, D) */
    for (int s = 0; s < nseq; s++) {
        kc[s] = kbase[s] + layer * KV * cap[s] * D;
        vc[s] = vbase[s] + layer * KV * cap[s] * D;
    }
    float *h = (float *)malloc(sizeof(float) * (size_t)(T * (hidden > 2 * inter ? hidden : 2 * inter)));
    float *qkv = (float *)malloc(sizeof(float) * (size_t)(T * width));
    float *q = (float *)malloc(sizeof(float) * (size_t)(T * qs));
    float *att = (float *)malloc(sizeof(float) * (size_t)(T * qs));
    float *g = (float *)malloc(sizeof(float) * (size_t)(T * inter));
    /* attention block */
    rms_rows(x, lw->ln1, h, T, hidden, eps, nthreads);
    kq_linear(h, T, hidden, lw->qkv, lw->n_qkv, qkv, width, nthreads);
    rope_rows(qkv, q, T, H, KV, D, nseq, off, start, kc, vc, cap, inv_freq, nthreads);
    attend_job job = {q, (const float *const *)kc, (const float *const *)vc, att, H, KV, D, nseq, off, cap, start,
                      scale, 1, NULL};
    attend(&job, nthreads);
    kq_linear(att, T, qs, lw->o, lw->n_o, h, hidden, nthreads);
    add_rows(x, h, T * hidden, nthreads);
    /* feed-forward block */
    rms_rows(x, lw->ln2, h, T, hidden, eps, nthreads);
    float *gu = (float *)malloc(sizeof(float) * (size_t)(T * 2 * inter));
    kq_linear(h, T, hidden, lw->gu, lw->n_gu, gu, 2 * inter, nthreads);
    silu_rows(gu, g, T, inter, nthreads);
    kq_linear(g, T, inter, lw->down, lw->n_down, h, hidden, nthreads);
    add_rows(x, h, T * hidden, nthreads);
    free(h); free(qkv); free(q); free(att); free(g); free(gu);
}
