// Max and average pools of NHWC float32 tensors, paragraph's own (AVX-512): the window reduction
// (`pool_step`, `pool_pixel`) and the pool's forms, each chosen by timing: windows, sliding sums (3
// x 3 averages), the input's order and carried columns (max pools), with an average pool's
// per-channel scale, shift and relu fused (`Pool`).
//
// Included only by kernels.cc, the kernels' translation unit: its definitions lie in
// kernels.cc's anonymous namespace, after those of the headers it includes.
#pragma once

#include "common.h"
#include "threads.h"

namespace {

#ifdef PARAGRAPH_AVX512
// one step of a window's reduction: acc = max(acc, v), NaN once either is NaN, or acc + v.
// MAXPS returns its second operand where either is NaN, so max(v, acc) keeps a NaN acc; a
// NaN v is taken where the compare finds it (two operations a load: a NaN accumulator of its
// own, one more blend, ran the stride-2 pools 1.4-5.7% slower alone)
template <bool MAX>
__attribute__((target("avx512f"))) inline void pool_step(__m512& acc, __m512 v) {
  if (MAX) {
    acc = _mm512_mask_max_ps(v, _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v, acc);
  } else {
    acc = _mm512_add_ps(acc, v);
  }
}

template <bool MAX>
__attribute__((target("avx512f"))) inline __m512 pool_result(__m512 acc, __m512 scale) {
  return MAX ? acc : _mm512_mul_ps(acc, scale);
}

// one output pixel: the window rows [h0, h1) x columns [w0, w1) of x (at the image's first
// pixel) reduced over c channels into o; 64 channels at a time in four independent
// accumulators (one at a time, each load waited on the previous add: slower than TVM's
// kernels), then the rest a vector at a time, the last masked
template <bool MAX>
__attribute__((target("avx512f"))) void pool_pixel(const float* x, int64_t w, int64_t c,
                                                   int64_t h0, int64_t h1, int64_t w0,
                                                   int64_t w1, __m512 scale, float* o) {
  const __m512 init = MAX ? _mm512_set1_ps(-INFINITY) : _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 64 <= c; k += 64) {
    __m512 a0 = init, a1 = init, a2 = init, a3 = init;
    for (int64_t y = h0; y < h1; ++y) {
      for (int64_t z = w0; z < w1; ++z) {
        const float* p = x + (y * w + z) * c + k;
        pool_step<MAX>(a0, _mm512_loadu_ps(p));
        pool_step<MAX>(a1, _mm512_loadu_ps(p + 16));
        pool_step<MAX>(a2, _mm512_loadu_ps(p + 32));
        pool_step<MAX>(a3, _mm512_loadu_ps(p + 48));
      }
    }
    _mm512_storeu_ps(o + k, pool_result<MAX>(a0, scale));
    _mm512_storeu_ps(o + k + 16, pool_result<MAX>(a1, scale));
    _mm512_storeu_ps(o + k + 32, pool_result<MAX>(a2, scale));
    _mm512_storeu_ps(o + k + 48, pool_result<MAX>(a3, scale));
  }
  for (; k < c; k += 16) {
    const __mmask16 m = tail_mask(c - k);
    __m512 a = init;
    for (int64_t y = h0; y < h1; ++y)
      for (int64_t z = w0; z < w1; ++z)
        pool_step<MAX>(a, _mm512_maskz_loadu_ps(m, x + (y * w + z) * c + k));
    _mm512_mask_storeu_ps(o + k, m, pool_result<MAX>(a, scale));
  }
}
#endif

#ifdef PARAGRAPH_AVX512
// the AVX2 window form's step (without AVX-512 every pool was ATen's, which allocates its
// result and copies it into the output, and pads a copy for uneven padding or ceil_mode):
// max(v, acc) returns acc where either is NaN, and a NaN v is taken where it is unordered
template <bool MAX>
__attribute__((target("avx2"), always_inline)) inline void pool_step8(__m256& acc, __m256 v) {
  if (MAX) {
    acc = _mm256_blendv_ps(_mm256_max_ps(v, acc), v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  } else {
    acc = _mm256_add_ps(acc, v);
  }
}

// `pool_pixel` in AVX2: 32 channels at a time in four accumulators, then 8, then one by one
template <bool MAX>
__attribute__((target("avx2"))) void pool_pixel8(const float* x, int64_t w, int64_t c,
                                                 int64_t h0, int64_t h1, int64_t w0, int64_t w1,
                                                 float scale, float* o) {
  const __m256 init = MAX ? _mm256_set1_ps(-INFINITY) : _mm256_setzero_ps();
  const __m256 s = _mm256_set1_ps(scale);
#define PARAGRAPH_RESULT(acc) (MAX ? (acc) : _mm256_mul_ps((acc), s))
  int64_t k = 0;
  for (; k + 32 <= c; k += 32) {
    __m256 a0 = init, a1 = init, a2 = init, a3 = init;
    for (int64_t y = h0; y < h1; ++y) {
      for (int64_t z = w0; z < w1; ++z) {
        const float* p = x + (y * w + z) * c + k;
        pool_step8<MAX>(a0, _mm256_loadu_ps(p));
        pool_step8<MAX>(a1, _mm256_loadu_ps(p + 8));
        pool_step8<MAX>(a2, _mm256_loadu_ps(p + 16));
        pool_step8<MAX>(a3, _mm256_loadu_ps(p + 24));
      }
    }
    _mm256_storeu_ps(o + k, PARAGRAPH_RESULT(a0));
    _mm256_storeu_ps(o + k + 8, PARAGRAPH_RESULT(a1));
    _mm256_storeu_ps(o + k + 16, PARAGRAPH_RESULT(a2));
    _mm256_storeu_ps(o + k + 24, PARAGRAPH_RESULT(a3));
  }
  for (; k + 8 <= c; k += 8) {
    __m256 a = init;
    for (int64_t y = h0; y < h1; ++y)
      for (int64_t z = w0; z < w1; ++z) pool_step8<MAX>(a, _mm256_loadu_ps(x + (y * w + z) * c + k));
    _mm256_storeu_ps(o + k, PARAGRAPH_RESULT(a));
  }
#undef PARAGRAPH_RESULT
  for (; k < c; ++k) {
    float a = MAX ? -INFINITY : 0.0f;
    for (int64_t y = h0; y < h1; ++y)
      for (int64_t z = w0; z < w1; ++z) {
        const float v = x[(y * w + z) * c + k];
        if (!MAX) a += v;
        else if (!std::isnan(a) && (std::isnan(v) || v > a)) a = v;
      }
    o[k] = MAX ? a : a * scale;
  }
}
#endif

// paragraph's max and average pools of NHWC float32 tensors (AVX-512): each output pixel
// reduces its window's valid input pixels, padding left out (max) or counted in the divisor
// (average with include_pad, PyTorch's count_include_pad); a NaN in a window gives NaN, as
// PyTorch's max pool. Rows of the output are split over the OpenMP threads, so a pool runs on
// the team of the vendor kernels around it (TVM's pool kernels ran on TVM's own thread pool,
// and the OpenMP workers fell asleep while they did).
struct Pool {
  const float* x;
  float* out;
  int64_t n, h, w, c, oh, ow, kh, kw, sh, sw, pt, pl, pb, pr;
  bool is_max, include_pad;
  // an average pool's epilogue: out = out * scale + shift per channel (both or neither), then
  // relu; applied to each block of output rows right after it is written, while in L1
  const float* scale = nullptr;
  const float* shift = nullptr;
  bool relu = false;

  bool has_epilogue() const { return scale != nullptr || relu; }

#ifdef PARAGRAPH_AVX512
  __attribute__((target("avx512f"))) void epilogue(int64_t r0, int64_t r1) const {
    float* o = out + r0 * ow * c;
    for (int64_t i = 0; i < (r1 - r0) * ow; ++i, o += c) {
      for (int64_t k = 0; k < c; k += 16) {
        const __mmask16 m = tail_mask(c - k);
        __m512 v = _mm512_maskz_loadu_ps(m, o + k);
        if (scale != nullptr)
          v = _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(m, scale + k),
                              _mm512_maskz_loadu_ps(m, shift + k));
        if (relu) v = relu_keep_nan(v);
        _mm512_mask_storeu_ps(o + k, m, v);
      }
    }
  }
#endif

#ifdef PARAGRAPH_AVX512
  // output rows four at a time, column by column: the input rows the four windows share are
  // read while still in L1 (Inception-v3's stride-2 max pool over 147 x 147 x 64: 102 -> 88 us
  // from L3, its 35 x 35 x 288 average pool 55 -> 47 us)
  static constexpr int64_t kRowBlock = 4;

  // 1 / an average's divisor for the window at input row hs, column ws (its first, padding
  // included): the padded window's size with include_pad, else its pixels inside the image
  float inverse_count(int64_t hs, int64_t ws) const {
    const int64_t count =
        include_pad ? (std::min(hs + kh, h + pb) - hs) * (std::min(ws + kw, w + pr) - ws)
                    : (std::min(hs + kh, h) - std::max<int64_t>(hs, 0)) *
                          (std::min(ws + kw, w) - std::max<int64_t>(ws, 0));
    return count > 0 ? 1.0f / count : 0.0f;
  }

  __attribute__((target("avx512f"))) void rows(int64_t r0, int64_t r1) const {
    for (int64_t rb = r0; rb < r1; rb += kRowBlock) {
      const int64_t re = std::min(rb + kRowBlock, r1);
      for (int64_t j = 0; j < ow; ++j) {
        const int64_t ws = j * sw - pl;
        const int64_t w0 = std::max<int64_t>(ws, 0), w1 = std::min(ws + kw, w);
        for (int64_t r = rb; r < re; ++r) {  // r = (image, output row)
          const int64_t img = r / oh, hs = (r % oh) * sh - pt;
          const int64_t h0 = std::max<int64_t>(hs, 0), h1 = std::min(hs + kh, h);
          const __m512 scale = _mm512_set1_ps(inverse_count(hs, ws));
          float* o = out + (r * ow + j) * c;
          (is_max ? pool_pixel<true> : pool_pixel<false>)(x + img * h * w * c, w, c, h0, h1, w0,
                                                          w1, scale, o);
        }
      }
    }
  }
#endif

#ifdef PARAGRAPH_AVX512
  // `epilogue` in AVX2 (form 4's): an Inception pool moved after its 1x1 convolution takes
  // that convolution's batch norm and relu, and without it the pool was PyTorch's alone
  // (which loaded libtorch for Inception-v3's three such pools)
  __attribute__((target("avx2,fma"))) void epilogue_avx2(int64_t r0, int64_t r1) const {
    float* o = out + r0 * ow * c;
    for (int64_t i = 0; i < (r1 - r0) * ow; ++i, o += c) {
      for (int64_t k = 0; k < c; k += 8) {
        const __m256i m = tail_mask8(c - k);
        __m256 v = _mm256_maskload_ps(o + k, m);
        if (scale != nullptr)
          v = _mm256_fmadd_ps(v, _mm256_maskload_ps(scale + k, m),
                              _mm256_maskload_ps(shift + k, m));
        if (relu) v = apply_linear_act8(v, Act::kRelu);  // (a NaN stays NaN)
        _mm256_maskstore_ps(o + k, m, v);
      }
    }
  }

  // `rows` in AVX2 (form 4: where the own AVX-512 forms do not run), its epilogue apart
  __attribute__((target("avx2"))) void rows_avx2(int64_t r0, int64_t r1) const {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t img = r / oh, hs = (r % oh) * sh - pt;
      const int64_t h0 = std::max<int64_t>(hs, 0), h1 = std::min(hs + kh, h);
      for (int64_t j = 0; j < ow; ++j) {
        const int64_t ws = j * sw - pl;
        const int64_t w0 = std::max<int64_t>(ws, 0), w1 = std::min(ws + kw, w);
        float* o = out + (r * ow + j) * c;
        (is_max ? pool_pixel8<true> : pool_pixel8<false>)(
            x + img * h * w * c, w, c, h0, h1, w0, w1, inverse_count(hs, ws), o);
      }
    }
  }
#endif

  // a 3 x 3 stride-1 average by sliding sums: for two output rows at a time and 32 channels,
  // each input column's vertical sums (four loads per vector) are computed once and added to
  // the next two columns' (per output under two loads and four adds, against a window's nine
  // and eight). Where the pool is bound by its loads and its adds' latency rather than by
  // memory it is faster (Inception-v3's 8 x 8 x 2048 pool in the model: 35 -> 28 us; alone,
  // alternating with the window form: 28.5 -> 26.1, 17 x 17 x 768 47.6 -> 44.9); in the
  // model its other pools read their input from L3 and the per-window form stays (each
  // chosen by timing in place). Four rows of 16 channels and one row of 64 were slower.
  bool slides() const {
    return !is_max && kh == 3 && kw == 3 && sh == 1 && sw == 1 && pt <= 2 && pl <= 2;
  }

#ifdef PARAGRAPH_AVX512
  // the vertical sums of input column z (zero outside the image) of NR output rows, V vectors
  // of channels from k (masks m)
  template <int NR, int V>
  __attribute__((target("avx512f"), always_inline)) inline void slide_column(
      const float* const* rowp, int64_t z, int64_t k, const __mmask16* m, __m512* v) const {
    const bool inside = z >= 0 && z < w;
#pragma GCC unroll 8
    for (int q = 0; q < V; ++q) {
      __m512 a[NR + 2];
#pragma GCC unroll 8
      for (int i = 0; i < NR + 2; ++i)
        a[i] = inside && rowp[i] ? _mm512_maskz_loadu_ps(m[q], rowp[i] + z * c + k + 16 * q)
                                 : _mm512_setzero_ps();
#pragma GCC unroll 8
      for (int i = 0; i < NR; ++i)
        v[i * V + q] = _mm512_add_ps(_mm512_add_ps(a[i], a[i + 1]), a[i + 2]);
    }
  }

  template <int NR, int V>
  __attribute__((target("avx512f"))) void slide_rows(int64_t r, const float* scales) const {
    const int64_t img = r / oh, ys = r % oh - pt;
    const float* xi = x + img * h * w * c;
    const float* rowp[NR + 2];
    for (int i = 0; i < NR + 2; ++i)
      rowp[i] = ys + i >= 0 && ys + i < h ? xi + (ys + i) * w * c : nullptr;
    float* o = out + r * ow * c;
    for (int64_t k = 0; k < c; k += 16 * V) {
      __mmask16 m[V];
      for (int q = 0; q < V; ++q) m[q] = c - k - 16 * q > 0 ? tail_mask(c - k - 16 * q) : 0;
      __m512 left[NR * V], mid[NR * V], right[NR * V];
      slide_column<NR, V>(rowp, -pl, k, m, left);
      slide_column<NR, V>(rowp, 1 - pl, k, m, mid);
      for (int64_t j = 0; j < ow; ++j) {
        slide_column<NR, V>(rowp, j + 2 - pl, k, m, right);
#pragma GCC unroll 8
        for (int i = 0; i < NR; ++i) {
          const __m512 scale = _mm512_set1_ps(scales[i * ow + j]);
#pragma GCC unroll 8
          for (int q = 0; q < V; ++q) {
            const int e = i * V + q;
            const __m512 sum = _mm512_add_ps(_mm512_add_ps(left[e], mid[e]), right[e]);
            _mm512_mask_storeu_ps(o + (i * ow + j) * c + k + 16 * q, m[q],
                                  _mm512_mul_ps(sum, scale));
            left[e] = mid[e];
            mid[e] = right[e];
          }
        }
      }
    }
  }

  // output rows [r0, r1) by `slide_rows`, two at a time within an image
  __attribute__((target("avx512f"))) void slide(int64_t r0, int64_t r1) const {
    std::vector<float> scales(2 * ow);
    for (int64_t r = r0; r < r1;) {
      const int64_t nr = std::min({int64_t{2}, r1 - r, (r / oh + 1) * oh - r});
      for (int64_t i = 0; i < nr; ++i)
        for (int64_t j = 0; j < ow; ++j)
          scales[i * ow + j] = inverse_count((r + i) % oh - pt, j - pl);
      if (nr == 2) {
        slide_rows<2, 2>(r, scales.data());
      } else {
        slide_rows<1, 2>(r, scales.data());
      }
      r += nr;
    }
  }
#endif

#ifdef PARAGRAPH_AVX512
  // a max pool read in the input's own order: each input row, front to back, is reduced over
  // every window's columns once, and that row maximum merged into each output row whose window
  // holds the input row (stored by the window's first row), software-prefetched ahead. Where
  // the input comes from memory (a stem pool after its ~2 ms convolution) the windows form,
  // reading 2 x 4 + 1 rows at once, ran 3-5x slower than a plain read of its input: in
  // Inception-v3 its 71 x 71 x 192 pool took 122 -> 75 us, ResNet-50's 127 -> 80 (one thread)
  template <int V>
  __attribute__((target("avx512f"), always_inline)) inline void stream_pixel(
      const float* row, int64_t z0, int64_t z1, int64_t k, const __mmask16* m, float* const* o,
      const bool* first, int64_t no) const {
    __m512 a[V];
#pragma GCC unroll 4
    for (int q = 0; q < V; ++q) a[q] = _mm512_set1_ps(-INFINITY);
    for (int64_t z = z0; z < z1; ++z) {
#pragma GCC unroll 4
      for (int q = 0; q < V; ++q)
        pool_step<true>(a[q], _mm512_maskz_loadu_ps(m[q], row + z * c + k + 16 * q));
    }
    for (int64_t i = 0; i < no; ++i) {
#pragma GCC unroll 4
      for (int q = 0; q < V; ++q) {
        __m512 v = a[q];
        if (!first[i]) pool_step<true>(v, _mm512_maskz_loadu_ps(m[q], o[i] + k + 16 * q));
        _mm512_mask_storeu_ps(o[i] + k + 16 * q, m[q], v);
      }
    }
  }

  // how far ahead of its reads `stream` prefetches (the hardware prefetchers did not follow
  // it): from memory, Inception-v3's 71 x 71 x 192 pool took 326 us without, 117 with 4 KB,
  // 112 with 8 KB and 130 with 16 KB ahead (its input in cache: 59-60 us in each)
  static constexpr int64_t kPrefetch = 8192;

  __attribute__((target("avx512f"))) void stream(int64_t r0, int64_t r1) const {
    for (int64_t r = r0; r < r1;) {
      const int64_t img = r / oh, i0 = r % oh, i1 = std::min(oh, i0 + (r1 - r));
      const float* xi = x + img * h * w * c;
      float* oi = out + img * oh * ow * c;
      const int64_t y0 = std::max<int64_t>(i0 * sh - pt, 0);
      const int64_t y1 = std::min((i1 - 1) * sh - pt + kh, h);
      for (int64_t y = y0; y < y1; ++y) {
        // the output rows [ia, ib] of [i0, i1) whose windows hold input row y
        const int64_t lo = y + pt - kh + 1;
        const int64_t ia = std::max(i0, lo <= 0 ? int64_t{0} : (lo + sh - 1) / sh);
        const int64_t ib = std::min(i1 - 1, (y + pt) / sh);
        float* o[kStreamRows];
        bool first[kStreamRows];
        int64_t no = 0;
        for (int64_t i = ia; i <= ib; ++i, ++no) {
          o[no] = oi + i * ow * c;
          first[no] = y == std::max<int64_t>(i * sh - pt, 0);
        }
        const float* row = xi + y * w * c;
        for (int64_t j = 0; j < ow; ++j) {
          const int64_t ws = j * sw - pl;
          const int64_t z0 = std::max<int64_t>(ws, 0), z1 = std::min(ws + kw, w);
          // the lines kPrefetch bytes past the columns this window adds (past a row's end: the
          // next row's, read next)
          const char* pf = reinterpret_cast<const char*>(row + z1 * c) + kPrefetch;
          const char* pf_end = reinterpret_cast<const char*>(row + std::min(z1 + sw, w) * c);
          for (; pf < pf_end + kPrefetch; pf += 64) _mm_prefetch(pf, _MM_HINT_T0);
          float* oj[kStreamRows];
          for (int64_t i = 0; i < no; ++i) oj[i] = o[i] + j * c;
          int64_t k = 0;
          const __mmask16 full[4] = {0xffff, 0xffff, 0xffff, 0xffff};
          for (; k + 64 <= c; k += 64) stream_pixel<4>(row, z0, z1, k, full, oj, first, no);
          for (; k < c; k += 16) {
            const __mmask16 m[1] = {tail_mask(c - k)};
            stream_pixel<1>(row, z0, z1, k, m, oj, first, no);
          }
        }
      }
      r += i1 - i0;
    }
  }
#endif

#ifdef PARAGRAPH_AVX512
  // the maximum over the window rows rowp[0, nrows) of input column z (-inf outside the image)
  template <int V>
  __attribute__((target("avx512f"), always_inline)) inline void carry_column(
      const float* const* rowp, int64_t nrows, int64_t z, const __mmask16* m, __m512* v) const {
#pragma GCC unroll 4
    for (int q = 0; q < V; ++q) v[q] = _mm512_set1_ps(-INFINITY);
    if (z < 0 || z >= w) return;
    for (int64_t i = 0; i < nrows; ++i) {
#pragma GCC unroll 4
      for (int q = 0; q < V; ++q)
        pool_step<true>(v[q], _mm512_maskz_loadu_ps(m[q], rowp[i] + z * c + 16 * q));
    }
  }

  // a 3-wide, column-stride-2 max pool over at most 64 channels (the stem pools after a
  // 64-channel convolution): per output row, each input column's maximum over the window rows
  // once, the window's third column carried in registers to the next output's first (six loads
  // an output where the windows form makes nine), the output written once (the input-order
  // form merges each input row into it: read and written three times); the rows new to this
  // output row are prefetched ahead in software, past a row's end into the next output row's
  template <int V>
  __attribute__((target("avx512f"))) void carry_rows(int64_t r0, int64_t r1) const {
    __mmask16 m[V];
    for (int q = 0; q < V; ++q) m[q] = tail_mask(c - 16 * q);
    const int64_t row_bytes = w * c * 4, step_bytes = sw * c * 4;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t img = r / oh, hs = (r % oh) * sh - pt;
      const int64_t h0 = std::max<int64_t>(hs, 0), h1 = std::min(hs + kh, h);
      const float* xi = x + img * h * w * c;
      const float* rowp[kStreamRows];
      for (int64_t y = h0; y < h1; ++y) rowp[y - h0] = xi + y * w * c;
      const int64_t nrows = h1 - h0, fresh = std::max(h0, h1 - sh);
      float* o = out + r * ow * c;
      __m512 c0[V], c1[V], c2[V];
      carry_column<V>(rowp, nrows, -pl, m, c0);
      for (int64_t j = 0; j < ow; ++j) {
        const int64_t ws = j * sw - pl;
        const int64_t ahead = (ws + kw) * c * 4 + kPrefetch;
        for (int64_t y = fresh; y < h1; ++y) {
          const char* row = reinterpret_cast<const char*>(xi + y * w * c);
          const char* pf =
              ahead < row_bytes ? row + ahead : row + sh * row_bytes + (ahead - row_bytes);
          for (int64_t b = 0; b < step_bytes; b += 64) _mm_prefetch(pf + b, _MM_HINT_T0);
        }
        carry_column<V>(rowp, nrows, ws + 1, m, c1);
        carry_column<V>(rowp, nrows, ws + 2, m, c2);
#pragma GCC unroll 4
        for (int q = 0; q < V; ++q) {
          __m512 v = c0[q];
          pool_step<true>(v, c1[q]);
          pool_step<true>(v, c2[q]);
          _mm512_mask_storeu_ps(o + j * c + 16 * q, m[q], v);
          c0[q] = c2[q];
        }
      }
    }
  }

  __attribute__((target("avx512f"))) void carry(int64_t r0, int64_t r1) const {
    switch ((c + 15) / 16) {
      case 1: carry_rows<1>(r0, r1); break;
      case 2: carry_rows<2>(r0, r1); break;
      case 3: carry_rows<3>(r0, r1); break;
      default: carry_rows<4>(r0, r1); break;
    }
  }
#endif

  // the carried form's condition: a max pool of 3-wide windows two columns apart, at most 64
  // channels, at most kStreamRows rows a window
  bool carries() const { return is_max && kw == 3 && sw == 2 && c <= 64 && kh <= kStreamRows; }

  // the streamed form's condition: a max pool whose input rows are each in the windows of at
  // most kStreamRows output rows
  static constexpr int64_t kStreamRows = 8;
  bool streams() const { return is_max && (kh + sh - 1) / sh <= kStreamRows; }

  // form 0: windows (`rows`), 1: sliding sums (`slide`), 2: the input's order (`stream`),
  // 3: columns carried (`carry`), 4: windows in AVX2 (`rows_avx2`, `epilogue_avx2`)
  void operator()(int64_t threads, int form = 0) const {
#ifdef PARAGRAPH_AVX512
    split_rows(n * oh, n * oh * ow * c * 4, threads, [this, form](int64_t r0, int64_t r1) {
      // with an epilogue, kRowBlock rows at a time (each form's own block or a multiple of it)
      const int64_t step = has_epilogue() ? kRowBlock : r1 - r0;
      for (int64_t rb = r0; rb < r1; rb += step) {
        const int64_t re = std::min(rb + step, r1);
        if (form == 4) {
          rows_avx2(rb, re);
        } else if (form == 1) {
          slide(rb, re);
        } else if (form == 2) {
          stream(rb, re);
        } else if (form == 3) {
          carry(rb, re);
        } else {
          rows(rb, re);
        }
        if (has_epilogue() && form == 4) {
          epilogue_avx2(rb, re);
        } else if (has_epilogue()) {
          epilogue(rb, re);
        }
      }
    });
#endif
  }
};

}  // namespace
