// The activations the kernels fuse after a convolution or product (`names.EPILOGUES`): their
// names (act.h's `Act`; `act_of`, which refuses any other) and the own kernels' on 16 lanes:
// the piecewise-linear ones in the epilogue's registers (`in_registers`, `apply_linear_act`),
// the others, with a vector exponential (`exp_ps`, `act_transcendental`), over what an
// epilogue stored (`act_rows`). PyTorch's, in place after a library's call, are the ATen
// library's (aten.h's `activate`).
//
//   relu         max(x, 0)                relu6      min(max(x, 0), 6)
//   hardsigmoid  relu6(x + 3) / 6         hardswish  x * relu6(x + 3) / 6
//   sigmoid      1 / (1 + e^-x)           silu       x * sigmoid(x)
//   gelu         x * Phi(x) (erf's)       gelu_tanh  x (1 + tanh(sqrt(2/pi) (x + 0.044715x^3))) / 2
//
// A NaN input gives NaN, as torch's. The own forms are within ~5e-7 of each function's exact
// value (relative, over float's normal range; a result below it is 0); PyTorch's float32
// GELUs, whose 1 + erf and 1 + tanh cancel for negative x, are less exact there.
//
// Included only by kernels.cc, the kernels' translation unit: its definitions lie in
// kernels.cc's anonymous namespace, after those of the headers it includes.
#pragma once

#include "common.h"
#include "act.h"

namespace {

// the activation named ``name`` ("" for none); any other name is an error, not a silent
// identity: a kernel bound with a name it does not know would return the wrong values
Act act_of(const std::string& name) {
  for (size_t i = 0; i < kActNames.size(); ++i)
    if (name == kActNames[i]) return static_cast<Act>(i);
  std::string known;
  for (size_t i = 1; i < kActNames.size(); ++i)
    known += (i > 1 ? ", " : "") + std::string(kActNames[i]);
  TVM_FFI_THROW(ValueError) << "paragraph's vendor kernels know no activation '" << name
                            << "' (they fuse " << known << ")";
}

#ifdef PARAGRAPH_AVX512
// v clamped to [lo, hi], a NaN kept: max and min return their second operand where one is NaN
__attribute__((target("avx512f"), always_inline)) inline __m512 clamp_keep_nan(__m512 v, float lo,
                                                                               float hi) {
  return _mm512_max_ps(_mm512_set1_ps(lo), _mm512_min_ps(_mm512_set1_ps(hi), v));
}

// e^(a + b) in 16 lanes, b a small correction to a (|b| < 2: the rounding of an argument
// computed as a sum). Cephes' expf: a + b = k ln 2 + r with |r| <= ln 2 / 2 (k ln 2 taken from
// a, exact by FMA, and ln 2 in two parts), e^r by its degree-7 polynomial (relative error
// 1.1e-9 before rounding), times 2^k by scalef. Past float's range the result is inf (a is
// clamped to 89 first, so that a huge or infinite one reduces to no NaN); below its normal
// range (e^-87.3) it is 0, not a denormal: arithmetic on denormals takes microcode assists
// (GELU of values spread over +-30 took 1.5x the time). A NaN stays NaN.
__attribute__((target("avx512f"), always_inline)) inline __m512 exp_ps(__m512 a, __m512 b) {
  // (unordered: a NaN counts as normal, and stays)
  const __mmask16 normal =
      _mm512_cmp_ps_mask(_mm512_add_ps(a, b), _mm512_set1_ps(-87.3f), _CMP_NLT_UQ);
  a = _mm512_maskz_mov_ps(normal, _mm512_min_ps(_mm512_set1_ps(89.0f), a));  // NaN kept
  b = _mm512_maskz_mov_ps(normal, b);
  const __m512 k = _mm512_roundscale_ps(
      _mm512_mul_ps(_mm512_add_ps(a, b), _mm512_set1_ps(1.44269504088896341f)),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), a);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  r = _mm512_add_ps(r, b);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(normal, _mm512_scalef_ps(p, k));
}

// -2u = -2 sqrt(2/pi) (x + 0.044715 x^3) of 8 lanes in double (clamped: e^-2u saturates well
// within +-200, and the float parts of a larger one would be inf - inf)
__attribute__((target("avx512f"), always_inline)) inline __m512d gelu_tanh_arg8(__m256 x) {
  const __m512d v = _mm512_cvtps_pd(x);
  const __m512d s =
      _mm512_fmadd_pd(_mm512_mul_pd(v, v), _mm512_set1_pd(0.044715), _mm512_set1_pd(1.0));
  const __m512d d = _mm512_mul_pd(_mm512_mul_pd(v, _mm512_set1_pd(-1.5957691216057308)), s);
  return _mm512_max_pd(_mm512_set1_pd(-200.0), _mm512_min_pd(_mm512_set1_pd(200.0), d));
}

// 8 lanes a, then 8 lanes b
__attribute__((target("avx512f"), always_inline)) inline __m512 join_halves(__m256 a, __m256 b) {
  return _mm512_castpd_ps(
      _mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(a)), _mm256_castps_pd(b), 1));
}

// the same of 16 lanes as float hi + lo (hi the nearest float, lo the rest): in float its
// rounding, times |2u|, cost up to 1.3e-6 of the result
__attribute__((target("avx512f"), always_inline)) inline void gelu_tanh_arg(__m512 x, __m512& hi,
                                                                            __m512& lo) {
  const __m512d d0 = gelu_tanh_arg8(_mm512_castps512_ps256(x));
  const __m512d d1 =
      gelu_tanh_arg8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  const __m256 h0 = _mm512_cvtpd_ps(d0), h1 = _mm512_cvtpd_ps(d1);
  const __m256 l0 = _mm512_cvtpd_ps(_mm512_sub_pd(d0, _mm512_cvtps_pd(h0)));
  const __m256 l1 = _mm512_cvtpd_ps(_mm512_sub_pd(d1, _mm512_cvtps_pd(h1)));
  hi = join_halves(h0, h1);
  lo = join_halves(l0, l1);
}

// an activation with an exponential (inlined only in `act_rows`, once per activation)
__attribute__((target("avx512f"), always_inline)) inline __m512 act_transcendental(__m512 x,
                                                                                   Act act) {
  const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
  switch (act) {
    case Act::kSigmoid:  // as torch's, 1 / (1 + e^-x): 0 where e^-x overflows
      return _mm512_div_ps(one, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(zero, x), zero)));
    case Act::kSilu:  // as torch's, x / (1 + e^-x): -0 for a large negative x, not -x * 0 = NaN
      return _mm512_div_ps(x, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(zero, x), zero)));
    case Act::kGeluTanh: {  // 0.5 x (1 + tanh u) = x / (1 + e^-2u): no cancellation for x < 0
      __m512 hi, lo;
      gelu_tanh_arg(x, hi, lo);
      return _mm512_div_ps(x, _mm512_add_ps(one, exp_ps(hi, lo)));
    }
    case Act::kGelu: {
      // x Phi(x), Phi(x) = erfc(-x / sqrt 2) / 2 for x < 0, else 1 - erfc(x / sqrt 2) / 2:
      // erfc(z) = t e^(-z^2 + P(t)), t = 1 / (1 + z / 2) (Numerical Recipes' erfcc: relative
      // error under 1.2e-7 for every z >= 0), z^2 = x^2 / 2 exactly as hi + lo (in float, the
      // rounding of z^2 cost up to 6e-6 at x = -10). Past |x| = 16 Phi is 0 or 1 in float.
      const __m512 xc = clamp_keep_nan(x, -16.0f, 16.0f), half = _mm512_set1_ps(0.5f);
      const __m512 z = _mm512_mul_ps(_mm512_abs_ps(xc), _mm512_set1_ps(0.70710678118654752f));
      const __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(z, half, one));
      __m512 p = _mm512_set1_ps(0.17087277f);
      for (float c : {-0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f, -0.18628806f,
                      0.09678418f, 0.37409196f, 1.00002368f, -1.26551223f})
        p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(c));
      const __m512 hi = _mm512_mul_ps(xc, xc), lo = _mm512_fmsub_ps(xc, xc, hi);
      const __m512 erfc =
          _mm512_mul_ps(t, exp_ps(_mm512_mul_ps(hi, _mm512_set1_ps(-0.5f)),
                                  _mm512_fnmadd_ps(lo, half, p)));
      const __m512 tail = _mm512_mul_ps(erfc, half);
      const __mmask16 negative = _mm512_cmp_ps_mask(xc, zero, _CMP_LT_OQ);
      return _mm512_mul_ps(x, _mm512_mask_blend_ps(negative, _mm512_sub_ps(one, tail), tail));
    }
    default:
      return x;  // (the others are apply_linear_act's)
  }
}

// the activations the own epilogues apply in registers (piecewise linear: a few instructions,
// no call); the others (an exponential each) are a pass of their own over what the epilogue
// stored, while it is in L1 (`act_rows`): with a call in the epilogue for them, the own GEMM
// ran 13% and the depthwise form 1.7x slower even without an activation (one A/B in a process)
constexpr bool in_registers(Act act) { return act <= Act::kHardsigmoid; }

// act(v) where `in_registers(act)`, else v unchanged (`act_rows` applies those). relu's
// max(0, v) keeps a NaN: max returns its second operand where one is NaN. hardswish is
// v * hardsigmoid(v): relu6(v + 3) / 6 rounds to exactly 1 from v = 3 on, so that it is v
// there, as torch's
__attribute__((target("avx512f"), always_inline)) inline __m512 apply_linear_act(__m512 v,
                                                                                 Act act) {
  const __m512 zero = _mm512_setzero_ps(), six = _mm512_set1_ps(6.0f);
  switch (act) {
    case Act::kRelu:
      return _mm512_max_ps(zero, v);
    case Act::kRelu6:
      return _mm512_min_ps(six, _mm512_max_ps(zero, v));
    case Act::kHardsigmoid:
    case Act::kHardswish: {
      const __m512 h = _mm512_mul_ps(
          _mm512_min_ps(six, _mm512_max_ps(zero, _mm512_add_ps(v, _mm512_set1_ps(3.0f)))),
          _mm512_set1_ps(1.0f / 6));
      return act == Act::kHardswish ? _mm512_mul_ps(v, h) : h;
    }
    default:
      return v;
  }
}

// A(x) in place for the n floats at p + r * ld of each of ``rows`` rows, two vectors at a time
// (their chains overlap: 11% faster than one)
template <Act A>
__attribute__((target("avx512f"), always_inline)) inline void act_rows_of(float* p, int64_t rows,
                                                                          int64_t ld, int64_t n) {
  for (int64_t r = 0; r < rows; ++r, p += ld) {
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
      const __m512 v0 = act_transcendental(_mm512_loadu_ps(p + j), A);
      const __m512 v1 = act_transcendental(_mm512_loadu_ps(p + j + 16), A);
      _mm512_storeu_ps(p + j, v0);
      _mm512_storeu_ps(p + j + 16, v1);
    }
    for (; j < n; j += 16) {
      const __mmask16 m = tail_mask(n - j);
      _mm512_mask_storeu_ps(p + j, m, act_transcendental(_mm512_maskz_loadu_ps(m, p + j), A));
    }
  }
}

// act(x) in place for the n floats at p + r * ld of each of ``rows`` rows, for an activation
// not `in_registers` (the others: nothing)
__attribute__((target("avx512f"), noinline)) void act_rows(float* p, int64_t rows, int64_t ld,
                                                           int64_t n, Act act) {
  switch (act) {
    case Act::kSigmoid:
      return act_rows_of<Act::kSigmoid>(p, rows, ld, n);
    case Act::kSilu:
      return act_rows_of<Act::kSilu>(p, rows, ld, n);
    case Act::kGelu:
      return act_rows_of<Act::kGelu>(p, rows, ld, n);
    case Act::kGeluTanh:
      return act_rows_of<Act::kGeluTanh>(p, rows, ld, n);
    default:
      return;
  }
}

#endif

}  // namespace
