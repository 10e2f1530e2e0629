// Normalisations of rows over the last axis, paragraph's own (AVX-512): softmax, several rows side
// by side with a vector exponential (`exp_avx512`, `softmax_group`, `softmax_rows`), and a one-pass
// layer norm of x (+ res) (`layer_norm_avx512`); and their AVX2 twins for CPUs without AVX-512
// (`exp_avx2`, `softmax_rows_avx2`, `layer_norm_avx2`), where ATen's forms alone ran before.
//
// Included only by kernels.cc, the kernels' translation unit: its definitions lie in
// kernels.cc's anonymous namespace, after those of the headers it includes.
#pragma once

#include "common.h"
#include "avx2.h"

namespace {

#ifdef PARAGRAPH_AVX512
// e^x in 16 lanes: x = k ln 2 + r with |r| <= ln 2 / 2 (ln 2 in two parts, so r is exact),
// e^r by its degree-6 Taylor polynomial (relative error under 2e-7), times 2^k by scalef (which
// rounds e^x below 2^-149 to 0). NaN stays NaN: the clamps return x itself where it is NaN.
__attribute__((target("avx512f"), always_inline)) inline __m512 exp_avx512(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(88.8f), x));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.42860682030941723e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
#pragma GCC unroll 8
  for (float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, k);
}

// R rows of out = softmax(s x) over their n values (x and out at the first row): each row's
// maximum, e^(x - max) written to out and summed, then scaled by 1 / sum while the rows are in
// cache. R rows side by side, so that one row's chain of latencies (the maximum's and the sum's
// reductions, the exponential's ten dependent steps) overlaps the others' work: a 128-wide row
// alone is too short to hide them (one at a time: 1.3x ONNX Runtime's time). A row with a NaN
// gives NaN throughout, one of -inf only NaN (as torch's: -inf - -inf). The loops over the R
// rows are unrolled by pragma: at -O2 GCC kept them as loops with the rows' vectors in memory
// (1.5x the time), and rows of whole vectors (Full: n a multiple of 16) run without masks,
// which cost Zen 5 another 1.3x (12 x 128 rows of 128, one thread: 63 -> 33 us, ORT 45)
template <int R, bool Full>
__attribute__((target("avx512f"))) void softmax_group(const float* __restrict__ x,
                                                      float* __restrict__ out, int64_t n,
                                                      float s) {
  const __m512 lowest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 sv = _mm512_set1_ps(s);
  __m512 m[R], top[R], sum[R], scale[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) m[r] = lowest;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = Full ? 0xFFFF : tail_mask(n - i);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      if constexpr (Full)
        m[r] = _mm512_max_ps(m[r], _mm512_mul_ps(_mm512_loadu_ps(x + r * n + i), sv));
      else
        m[r] = _mm512_mask_max_ps(m[r], mask, m[r],
                                  _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + r * n + i), sv));
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    top[r] = _mm512_set1_ps(_mm512_reduce_max_ps(m[r]));
    sum[r] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = Full ? 0xFFFF : tail_mask(n - i);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      if constexpr (Full) {
        const __m512 e = exp_avx512(_mm512_fmsub_ps(_mm512_loadu_ps(x + r * n + i), sv, top[r]));
        _mm512_storeu_ps(out + r * n + i, e);
        sum[r] = _mm512_add_ps(sum[r], e);
      } else {
        const __m512 e = exp_avx512(
            _mm512_fmsub_ps(_mm512_maskz_loadu_ps(mask, x + r * n + i), sv, top[r]));
        _mm512_mask_storeu_ps(out + r * n + i, mask, e);
        sum[r] = _mm512_mask_add_ps(sum[r], mask, sum[r], e);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) scale[r] = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum[r]));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = Full ? 0xFFFF : tail_mask(n - i);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      float* o = out + r * n + i;
      if constexpr (Full)
        _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_loadu_ps(o), scale[r]));
      else
        _mm512_mask_storeu_ps(o, mask, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, o), scale[r]));
    }
  }
}

// rows [r0, r1) of out = softmax(s x) over their n values, four at a time
__attribute__((target("avx512f"))) void softmax_rows(const float* x, float* out, int64_t r0,
                                                     int64_t r1, int64_t n, float s) {
  int64_t row = r0;
  if (n % 16 == 0) {
    for (; row + 4 <= r1; row += 4) softmax_group<4, true>(x + row * n, out + row * n, n, s);
    for (; row < r1; ++row) softmax_group<1, true>(x + row * n, out + row * n, n, s);
  } else {
    for (; row + 4 <= r1; row += 4) softmax_group<4, false>(x + row * n, out + row * n, n, s);
    for (; row < r1; ++row) softmax_group<1, false>(x + row * n, out + row * n, n, s);
  }
}
#endif

// Rows [0, rows) of out = layer_norm(x + res) over their n values (res may be null), in one
// pass over the inputs: the sum is written to out and normalised there while the row is in
// cache. AVX-512 (the caller checks the CPU has it); single-threaded (one row is 4 KB: a
// parallel region would cost more than it saves).
#ifdef PARAGRAPH_AVX512
__attribute__((target("avx512f"))) void layer_norm_avx512(
    const float* __restrict__ x, const float* __restrict__ res, const float* __restrict__ gamma,
    const float* __restrict__ beta, float* __restrict__ out, int64_t rows, int64_t n,
    float eps) {
  const int64_t vec = n - n % 16;
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict__ xr = x + r * n;
    const float* __restrict__ rr = res ? res + r * n : nullptr;
    float* __restrict__ o = out + r * n;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < vec; i += 16) {
      __m512 v = _mm512_loadu_ps(xr + i);
      if (rr) v = _mm512_add_ps(v, _mm512_loadu_ps(rr + i));
      _mm512_storeu_ps(o + i, v);
      acc = _mm512_add_ps(acc, v);
    }
    float sum = _mm512_reduce_add_ps(acc);
    for (int64_t i = vec; i < n; ++i) {
      o[i] = xr[i] + (rr ? rr[i] : 0.0f);
      sum += o[i];
    }
    const float mean = sum / static_cast<float>(n);
    const __m512 m = _mm512_set1_ps(mean);
    __m512 sq = _mm512_setzero_ps();
    for (int64_t i = 0; i < vec; i += 16) {
      __m512 d = _mm512_sub_ps(_mm512_loadu_ps(o + i), m);
      sq = _mm512_fmadd_ps(d, d, sq);
    }
    float var = _mm512_reduce_add_ps(sq);
    for (int64_t i = vec; i < n; ++i) var += (o[i] - mean) * (o[i] - mean);
    const float rstd = 1.0f / std::sqrt(var / static_cast<float>(n) + eps);
    const __m512 rs = _mm512_set1_ps(rstd);
    for (int64_t i = 0; i < vec; i += 16) {
      __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(o + i), m), rs);
      _mm512_storeu_ps(o + i, _mm512_fmadd_ps(v, _mm512_loadu_ps(gamma + i),
                                              _mm512_loadu_ps(beta + i)));
    }
    for (int64_t i = vec; i < n; ++i) o[i] = (o[i] - mean) * rstd * gamma[i] + beta[i];
  }
}
#endif

#ifdef PARAGRAPH_AVX512  // x86-64
// e^x in 8 lanes, as `exp_avx512`: x = k ln 2 + r, e^r by the same polynomial, times 2^k as
// 2^(k/2) * 2^(k - k/2) built in the exponent bits (AVX2 has no scalef; each half is a normal
// float, and the product rounds e^x below 2^-149 to 0 as scalef does). NaN stays NaN.
__attribute__((target("avx2,fma"), always_inline)) inline __m256 exp_avx2(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-104.0f), _mm256_min_ps(_mm256_set1_ps(88.8f), x));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.42860682030941723e-6f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
#pragma GCC unroll 8
  for (float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  const __m256i ki = _mm256_cvtps_epi32(k), bias = _mm256_set1_epi32(127);
  const __m256i k1 = _mm256_srai_epi32(ki, 1), k2 = _mm256_sub_epi32(ki, k1);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

__attribute__((target("avx2"), always_inline)) inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

__attribute__((target("avx2"), always_inline)) inline float hsum8(__m256 v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  m = _mm_add_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// R rows of out = softmax(s x), as `softmax_group` on 8-float vectors: whole vectors, then
// (Full false) the row's last n % 8 values in one masked vector, whose lanes past the row's end
// read as -inf for the maximum and add nothing to the sum. Only that one vector is masked:
// AMD's Zen 3 runs a masked store as microcode, and with every vector masked ViT's rows of 197
// took 1.6x ATen's time
template <int R, bool Full>
__attribute__((target("avx2,fma"))) void softmax_group8(const float* __restrict__ x,
                                                       float* __restrict__ out, int64_t n,
                                                       float s) {
  const __m256 lowest = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const __m256 sv = _mm256_set1_ps(s);
  const int64_t whole = n - n % 8;
  const __m256i mask = tail_mask8(n - whole);
  const __m256 maskf = _mm256_castsi256_ps(mask);
  __m256 m[R], top[R], sum[R], scale[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) m[r] = lowest;
  for (int64_t i = 0; i < whole; i += 8) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      m[r] = _mm256_max_ps(m[r], _mm256_mul_ps(_mm256_loadu_ps(x + r * n + i), sv));
  }
  if constexpr (!Full) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 v = _mm256_mul_ps(_mm256_maskload_ps(x + r * n + whole, mask), sv);
      m[r] = _mm256_max_ps(m[r], _mm256_blendv_ps(lowest, v, maskf));
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    top[r] = _mm256_set1_ps(hmax8(m[r]));
    sum[r] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < whole; i += 8) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 e = exp_avx2(_mm256_fmsub_ps(_mm256_loadu_ps(x + r * n + i), sv, top[r]));
      _mm256_storeu_ps(out + r * n + i, e);
      sum[r] = _mm256_add_ps(sum[r], e);
    }
  }
  __m256 tail[R];  // (Full false) the last vector's exponentials, stored once scaled
  if constexpr (!Full) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      tail[r] = _mm256_and_ps(
          exp_avx2(_mm256_fmsub_ps(_mm256_maskload_ps(x + r * n + whole, mask), sv, top[r])),
          maskf);
      sum[r] = _mm256_add_ps(sum[r], tail[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) scale[r] = _mm256_set1_ps(1.0f / hsum8(sum[r]));
  for (int64_t i = 0; i < whole; i += 8) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      float* o = out + r * n + i;
      _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_loadu_ps(o), scale[r]));
    }
  }
  if constexpr (!Full) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      _mm256_maskstore_ps(out + r * n + whole, mask, _mm256_mul_ps(tail[r], scale[r]));
  }
}

// rows [r0, r1) of out = softmax(s x) over their n values, four at a time
__attribute__((target("avx2,fma"))) void softmax_rows_avx2(const float* x, float* out,
                                                           int64_t r0, int64_t r1, int64_t n,
                                                           float s) {
  int64_t row = r0;
  if (n % 8 == 0) {
    for (; row + 4 <= r1; row += 4) softmax_group8<4, true>(x + row * n, out + row * n, n, s);
    for (; row < r1; ++row) softmax_group8<1, true>(x + row * n, out + row * n, n, s);
  } else {
    for (; row + 4 <= r1; row += 4) softmax_group8<4, false>(x + row * n, out + row * n, n, s);
    for (; row < r1; ++row) softmax_group8<1, false>(x + row * n, out + row * n, n, s);
  }
}

// `layer_norm_avx512` on 8-float vectors (one thread, one pass over the inputs)
__attribute__((target("avx2,fma"))) void layer_norm_avx2(
    const float* __restrict__ x, const float* __restrict__ res, const float* __restrict__ gamma,
    const float* __restrict__ beta, float* __restrict__ out, int64_t rows, int64_t n,
    float eps) {
  const int64_t vec = n - n % 8;
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict__ xr = x + r * n;
    const float* __restrict__ rr = res ? res + r * n : nullptr;
    float* __restrict__ o = out + r * n;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < vec; i += 8) {
      __m256 v = _mm256_loadu_ps(xr + i);
      if (rr) v = _mm256_add_ps(v, _mm256_loadu_ps(rr + i));
      _mm256_storeu_ps(o + i, v);
      acc = _mm256_add_ps(acc, v);
    }
    float sum = hsum8(acc);
    for (int64_t i = vec; i < n; ++i) {
      o[i] = xr[i] + (rr ? rr[i] : 0.0f);
      sum += o[i];
    }
    const float mean = sum / static_cast<float>(n);
    const __m256 m = _mm256_set1_ps(mean);
    __m256 sq = _mm256_setzero_ps();
    for (int64_t i = 0; i < vec; i += 8) {
      const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(o + i), m);
      sq = _mm256_fmadd_ps(d, d, sq);
    }
    float var = hsum8(sq);
    for (int64_t i = vec; i < n; ++i) var += (o[i] - mean) * (o[i] - mean);
    const float rstd = 1.0f / std::sqrt(var / static_cast<float>(n) + eps);
    const __m256 rs = _mm256_set1_ps(rstd);
    for (int64_t i = 0; i < vec; i += 8) {
      const __m256 v = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(o + i), m), rs);
      _mm256_storeu_ps(o + i, _mm256_fmadd_ps(v, _mm256_loadu_ps(gamma + i),
                                              _mm256_loadu_ps(beta + i)));
    }
    for (int64_t i = vec; i < n; ++i) o[i] = (o[i] - mean) * rstd * gamma[i] + beta[i];
  }
}
#endif

}  // namespace
