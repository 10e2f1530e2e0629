// paragraph's own kernels for x86-64 CPUs with AVX2 and FMA but not AVX-512 (AMD's Zen 1-3,
// Intel's client cores; or `PARAGRAPH_CPU_ISA=avx2`): there every own AVX-512 form refuses
// itself (`own_avx512`) and the kernels were oneDNN's and MKL's alone. On a Zen 3 host
// MobileNetV2 ran 0.64x ONNX Runtime's speed that way, its depthwise convolutions 1.8-2.7x
// slower than ONNX Runtime's (`own_depthwise_avx2`). The activations of `apply_linear_act8`
// in registers, the others (`act_rows8`) over each tile or row just stored; the grouped
// convolution's forms (`GroupedConvAvx2`, which have no AVX-512 siblings and run on any CPU
// with AVX2) apply those over their whole output after the kernel (`act_all8`).
//
// Included only by kernels.cc, the kernels' translation unit: its definitions lie in
// kernels.cc's anonymous namespace, after those of the headers it includes.
#pragma once

#include "common.h"
#include "activations.h"
#include "threads.h"
#include "packing.h"
#include "forms.h"
#include "gemm.h"
#include "conv.h"
#include "depthwise.h"

namespace {

#ifdef PARAGRAPH_AVX512  // x86-64
// whether the own AVX2 forms may run: AVX2 and FMA, and the own AVX-512 forms may not (where
// they may, they are the faster), read once
inline bool own_avx2() {
  static const bool ok =
      !own_avx512() && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

// the lanes of an 8-float vector that ``left`` remaining elements fill, as maskload takes them
__attribute__((target("avx2"), always_inline)) inline __m256i tail_mask8(int64_t left) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(left, 8))),
                            lanes);
}

// act(v) for the piecewise-linear activations (`in_registers`), else v unchanged; a NaN stays
// NaN as in `apply_linear_act` (max and min return their second operand where one is NaN)
__attribute__((target("avx2,fma"), always_inline)) inline __m256 apply_linear_act8(__m256 v,
                                                                                   Act act) {
  const __m256 zero = _mm256_setzero_ps(), six = _mm256_set1_ps(6.0f);
  switch (act) {
    case Act::kRelu:
      return _mm256_max_ps(zero, v);
    case Act::kRelu6:
      return _mm256_min_ps(six, _mm256_max_ps(zero, v));
    case Act::kHardsigmoid:
    case Act::kHardswish: {
      const __m256 h = _mm256_mul_ps(
          _mm256_min_ps(six, _mm256_max_ps(zero, _mm256_add_ps(v, _mm256_set1_ps(3.0f)))),
          _mm256_set1_ps(1.0f / 6));
      return act == Act::kHardswish ? _mm256_mul_ps(v, h) : h;
    }
    default:
      return v;
  }
}

// 2^k for integral k in [-252, 254] (as floats): 2^(k/2) * 2^(k - k/2), each half a normal
// float built in the exponent bits (AVX2 has no scalef)
__attribute__((target("avx2"), always_inline)) inline __m256 pow2_8(__m256 k, __m256 p) {
  const __m256i ki = _mm256_cvtps_epi32(k), bias = _mm256_set1_epi32(127);
  const __m256i k1 = _mm256_srai_epi32(ki, 1), k2 = _mm256_sub_epi32(ki, k1);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

// e^(a + b) in 8 lanes, as activations.h's `exp_ps` (the same reduction and polynomial; 0 below
// float's normal range, inf past it, a NaN kept), 2^k by `pow2_8`
__attribute__((target("avx2,fma"), always_inline)) inline __m256 exp_ps8(__m256 a, __m256 b) {
  const __m256 normal = _mm256_cmp_ps(_mm256_add_ps(a, b), _mm256_set1_ps(-87.3f), _CMP_NLT_UQ);
  a = _mm256_and_ps(normal, _mm256_min_ps(_mm256_set1_ps(89.0f), a));  // NaN kept
  b = _mm256_and_ps(normal, b);
  const __m256 k =
      _mm256_round_ps(_mm256_mul_ps(_mm256_add_ps(a, b), _mm256_set1_ps(1.44269504088896341f)),
                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), a);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  r = _mm256_add_ps(r, b);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  return _mm256_and_ps(normal, pow2_8(k, p));
}

// `gelu_tanh_arg` of 4 lanes in double: -2u, clamped to +-200
__attribute__((target("avx2,fma"), always_inline)) inline __m256d gelu_tanh_arg4(__m128 x) {
  const __m256d v = _mm256_cvtps_pd(x);
  const __m256d s =
      _mm256_fmadd_pd(_mm256_mul_pd(v, v), _mm256_set1_pd(0.044715), _mm256_set1_pd(1.0));
  const __m256d d = _mm256_mul_pd(_mm256_mul_pd(v, _mm256_set1_pd(-1.5957691216057308)), s);
  return _mm256_max_pd(_mm256_set1_pd(-200.0), _mm256_min_pd(_mm256_set1_pd(200.0), d));
}

// v clamped to [lo, hi], a NaN kept (as `clamp_keep_nan`)
__attribute__((target("avx2"), always_inline)) inline __m256 clamp_keep_nan8(__m256 v, float lo,
                                                                             float hi) {
  return _mm256_max_ps(_mm256_set1_ps(lo), _mm256_min_ps(_mm256_set1_ps(hi), v));
}

// `act_transcendental` on 8 lanes: sigmoid, silu, gelu_tanh and GELU's erf form as there (the
// same functions, within the same ~5e-7), any other activation v unchanged. (GELU's erf form
// was PyTorch's after the own AVX2 forms once: applied tile by tile it took 3x the time of
// PyTorch's pass; over each row block once stored, as the others, it is within ~10% of it, and
// PyTorch's pass mapped libtorch, ~105 MiB, into a process that runs own forms alone)
__attribute__((target("avx2,fma"), always_inline)) inline __m256 act_transcendental8(__m256 x,
                                                                                     Act act) {
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  switch (act) {
    case Act::kSigmoid:
      return _mm256_div_ps(one, _mm256_add_ps(one, exp_ps8(_mm256_sub_ps(zero, x), zero)));
    case Act::kSilu:
      return _mm256_div_ps(x, _mm256_add_ps(one, exp_ps8(_mm256_sub_ps(zero, x), zero)));
    case Act::kGeluTanh: {
      const __m256d d0 = gelu_tanh_arg4(_mm256_castps256_ps128(x));
      const __m256d d1 = gelu_tanh_arg4(_mm256_extractf128_ps(x, 1));
      const __m128 h0 = _mm256_cvtpd_ps(d0), h1 = _mm256_cvtpd_ps(d1);
      const __m128 l0 = _mm256_cvtpd_ps(_mm256_sub_pd(d0, _mm256_cvtps_pd(h0)));
      const __m128 l1 = _mm256_cvtpd_ps(_mm256_sub_pd(d1, _mm256_cvtps_pd(h1)));
      return _mm256_div_ps(
          x, _mm256_add_ps(one, exp_ps8(_mm256_set_m128(h1, h0), _mm256_set_m128(l1, l0))));
    }
    case Act::kGelu: {  // as `act_transcendental`'s (Numerical Recipes' erfcc)
      const __m256 xc = clamp_keep_nan8(x, -16.0f, 16.0f), half = _mm256_set1_ps(0.5f);
      const __m256 z = _mm256_mul_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), xc),
                                     _mm256_set1_ps(0.70710678118654752f));
      const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(z, half, one));
      __m256 p = _mm256_set1_ps(0.17087277f);
      for (float c : {-0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f, -0.18628806f,
                      0.09678418f, 0.37409196f, 1.00002368f, -1.26551223f})
        p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c));
      const __m256 hi = _mm256_mul_ps(xc, xc), lo = _mm256_fmsub_ps(xc, xc, hi);
      const __m256 erfc = _mm256_mul_ps(
          t, exp_ps8(_mm256_mul_ps(hi, _mm256_set1_ps(-0.5f)), _mm256_fnmadd_ps(lo, half, p)));
      const __m256 tail = _mm256_mul_ps(erfc, half);
      const __m256 negative = _mm256_cmp_ps(xc, zero, _CMP_LT_OQ);
      return _mm256_mul_ps(x, _mm256_blendv_ps(_mm256_sub_ps(one, tail), tail, negative));
    }
    default:
      return x;
  }
}

// A(x) in place for the n floats at p + r * ld of each of ``rows`` rows, four vectors at a
// time: each function is one long chain of dependent steps (GELU's erf form, a division, nine
// FMAs and an exponential), and with two chains at a time it ran at their latency, 1.8x the
// time of PyTorch's pass
template <Act A>
__attribute__((target("avx2,fma"), always_inline)) inline void act_rows8_of(float* p,
                                                                            int64_t rows,
                                                                            int64_t ld,
                                                                            int64_t n) {
  for (int64_t r = 0; r < rows; ++r, p += ld) {
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
      const __m256 v0 = act_transcendental8(_mm256_loadu_ps(p + j), A);
      const __m256 v1 = act_transcendental8(_mm256_loadu_ps(p + j + 8), A);
      const __m256 v2 = act_transcendental8(_mm256_loadu_ps(p + j + 16), A);
      const __m256 v3 = act_transcendental8(_mm256_loadu_ps(p + j + 24), A);
      _mm256_storeu_ps(p + j, v0);
      _mm256_storeu_ps(p + j + 8, v1);
      _mm256_storeu_ps(p + j + 16, v2);
      _mm256_storeu_ps(p + j + 24, v3);
    }
    for (; j + 16 <= n; j += 16) {
      const __m256 v0 = act_transcendental8(_mm256_loadu_ps(p + j), A);
      const __m256 v1 = act_transcendental8(_mm256_loadu_ps(p + j + 8), A);
      _mm256_storeu_ps(p + j, v0);
      _mm256_storeu_ps(p + j + 8, v1);
    }
    for (; j < n; j += 8) {
      const __m256i m = tail_mask8(n - j);
      _mm256_maskstore_ps(p + j, m, act_transcendental8(_mm256_maskload_ps(p + j, m), A));
    }
  }
}

// act(x) in place over rows, as activations.h's `act_rows`, on 8 lanes: for the activations
// not `in_registers`, applied by the own AVX2 forms to what they just stored, while it is in
// L1 (PyTorch's pass over the whole output after the call, as before, read it back from L3 or
// memory)
__attribute__((target("avx2,fma"), noinline)) void act_rows8(float* p, int64_t rows,
                                                             int64_t ld, int64_t n, Act act) {
  switch (act) {
    case Act::kSigmoid:
      return act_rows8_of<Act::kSigmoid>(p, rows, ld, n);
    case Act::kSilu:
      return act_rows8_of<Act::kSilu>(p, rows, ld, n);
    case Act::kGeluTanh:
      return act_rows8_of<Act::kGeluTanh>(p, rows, ld, n);
    case Act::kGelu:
      return act_rows8_of<Act::kGelu>(p, rows, ld, n);
    default:
      return;
  }
}

// act(o) in place over the whole of a contiguous o, for an activation not `in_registers`, its
// elements split over the threads (the grouped convolution's forms, which store whole tiles
// of several groups)
void act_all8(const View& o, Act act, int64_t threads) {
  float* p = o.data_ptr<float>();
  const int64_t n = o.numel(), team = n >= (int64_t{1} << 15) ? threads : 1;
  parallel(team, [&](int64_t t, int64_t nt) {
    const int64_t begin = n * t / nt / 16 * 16, end = t + 1 == nt ? n : n * (t + 1) / nt / 16 * 16;
    if (end > begin) act_rows8(p + begin, 1, 0, end - begin, act);
  });
}

// A depthwise convolution (groups = input = output channels) on NHWC float32 buffers, out =
// act(conv + bias + res), with AVX2: each output row's pixels whose windows lie inside the
// row eight at a time (then four, two, one), every channel of them a vector of 8 at a time (the
// input window stays in L1 across the channels), one FMA chain per pixel, each tap's weight
// loaded once for the group, no check per tap; the border pixels one at a time, a tap outside
// the row reading zeros. The weight is packed [kh][kw][c], as `Depthwise`'s. (The first form
// checked every tap of groups of eight that touched a border: on 14-wide rows every group did,
// and MobileNetV2's 14 x 14 x 576 ran 4x ONNX Runtime's time in the model.)
struct DepthwiseAvx2 {
  const float *x, *w, *bias, *res;
  float* out;
  int64_t n, h, wd, c, oh, ow, kh, kw, sh, sw, pt, pl, dh, dw;
  Act act;

  template <bool Full>
  __attribute__((target("avx2,fma"), always_inline)) inline __m256 load(const float* p,
                                                                         __m256i m) const {
    return Full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, m);
  }

  // P output pixels j..j+P-1 of V channel vectors from k (of the last, ``left`` channels
  // are real: 8 where Full; V > 1 only where Full); Check: a tap outside the row reads zeros
  // (else every tap lies inside). P * V independent FMA chains: two FMA pipes of four cycles'
  // latency need eight, so fewer pixels take more channel vectors. No vector crosses a call:
  // its callers are not compiled for AVX2, and they would pass it as another ABI expects
  template <bool Full, int P, int V, bool Check, int KW>
  __attribute__((target("avx2,fma"))) void pixels(const float* image, int64_t k, int64_t left,
                                                  int64_t ih0, int64_t j, float* orow,
                                                  const float* rrow) const {
    const __m256i m = Full ? _mm256_set1_epi32(-1) : tail_mask8(left);
    // every loop over the accumulators unrolled, none bounded by a run-time count: an array
    // of vectors indexed at run time lives on the stack (the first version ran 2x oneDNN's)
    __m256 acc[P * V];
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      const __m256 b = bias ? load<Full>(bias + k + 8 * v, m) : _mm256_setzero_ps();
#pragma GCC unroll 8
      for (int p = 0; p < P; ++p) acc[p * V + v] = b;
    }
    const int64_t iw0 = j * sw - pl;
    alignas(32) static const float zeros[64] = {};
    // each pixel's offset from the first one's window, made once: computed per tap (an
    // integer multiply per load) the form ran at a quarter of the FMA pipes' rate
    int64_t off[P];
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) off[p] = p * sw * c;
    const int64_t tap = dw * c;
    for (int64_t ky = 0; ky < kh; ++ky) {
      const int64_t ih = ih0 + ky * dh;
      if (ih < 0 || ih >= h) continue;
      const float* xr = image + ih * wd * c + k;
      const float* wr = w + ky * kw * c + k;
      if (!Check) {  // every tap inside the row; a 3- or 5-wide kernel's taps unrolled (KW)
        const float* base = xr + iw0 * c;
        const int64_t taps = KW ? KW : kw;
#pragma GCC unroll 5
        for (int64_t kx = 0; kx < taps; ++kx, base += tap) {
#pragma GCC unroll 8
          for (int v = 0; v < V; ++v) {
            const __m256 wv = load<Full>(wr + kx * c + 8 * v, m);
#pragma GCC unroll 8
            for (int p = 0; p < P; ++p)
              acc[p * V + v] =
                  _mm256_fmadd_ps(load<Full>(base + off[p] + 8 * v, m), wv, acc[p * V + v]);
          }
        }
        continue;
      }
      for (int64_t kx = 0; kx < kw; ++kx) {
#pragma GCC unroll 8
        for (int v = 0; v < V; ++v) {
          const __m256 wv = load<Full>(wr + kx * c + 8 * v, m);
#pragma GCC unroll 8
          for (int p = 0; p < P; ++p) {
            const int64_t iw = iw0 + p * sw + kx * dw;
            const float* at = iw >= 0 && iw < wd ? xr + iw * c + 8 * v : zeros;
            acc[p * V + v] = _mm256_fmadd_ps(load<Full>(at, m), wv, acc[p * V + v]);
          }
        }
      }
    }
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) {
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) {
        const int64_t at = (j + p) * c + k + 8 * v;
        __m256 r = acc[p * V + v];
        if (rrow) r = _mm256_add_ps(r, load<Full>(rrow + at, m));
        r = apply_linear_act8(r, act);
        if (Full) {
          _mm256_storeu_ps(orow + at, r);
        } else {
          _mm256_maskstore_ps(orow + at, m, r);
        }
      }
    }
  }

  // P pixels from j, every channel vector: 8 / P vectors at a time while that many are left
  template <int P, bool Check, int KW>
  void group(const float* image, int64_t ih0, int64_t j, float* orow, const float* rrow) const {
    constexpr int V = 8 / P;
    int64_t k = 0;
    if (V > 1)
      for (; k + 8 * V <= c; k += 8 * V)
        pixels<true, P, V, Check, KW>(image, k, 8, ih0, j, orow, rrow);
    for (; k + 8 <= c; k += 8) pixels<true, P, 1, Check, KW>(image, k, 8, ih0, j, orow, rrow);
    if (k < c) pixels<false, P, 1, Check, KW>(image, k, c - k, ih0, j, orow, rrow);
  }

  void rows(int64_t r0, int64_t r1) const {
    if (kw == 3) return rows_of<3>(r0, r1);
    if (kw == 5) return rows_of<5>(r0, r1);
    return rows_of<0>(r0, r1);
  }

  template <int KW>
  void rows_of(int64_t r0, int64_t r1) const {
    // the pixels [lo, hi) whose windows lie inside the row: iw0 >= 0 and iw0 + (kw-1)*dw < wd
    const int64_t lo = std::min(ow, (pl + sw - 1) / sw);
    const int64_t last = wd - 1 - (kw - 1) * dw + pl;  // the largest j * sw allowed
    const int64_t hi = std::max(lo, last < 0 ? 0 : std::min(ow, last / sw + 1));
    for (int64_t r = r0; r < r1; ++r) {  // r = (image, output row)
      const int64_t img = r / oh, ih0 = (r % oh) * sh - pt;
      const float* image = x + img * h * wd * c;
      float* orow = out + r * ow * c;
      const float* rrow = res ? res + r * ow * c : nullptr;
      for (int64_t j = 0; j < lo; ++j) group<1, true, 0>(image, ih0, j, orow, rrow);
      int64_t j = lo;
      for (; j + 8 <= hi; j += 8) group<8, false, KW>(image, ih0, j, orow, rrow);
      if (j + 4 <= hi) group<4, false, KW>(image, ih0, j, orow, rrow), j += 4;
      if (j + 2 <= hi) group<2, false, KW>(image, ih0, j, orow, rrow), j += 2;
      if (j < hi) group<1, false, KW>(image, ih0, j, orow, rrow), ++j;
      for (j = hi; j < ow; ++j) group<1, true, 0>(image, ih0, j, orow, rrow);
      if (!in_registers(act)) act_rows8(orow, 1, 0, ow * c, act);  // the row, still in L1
    }
  }

  void operator()(int64_t threads) const {
    split_rows(n * oh, n * oh * ow * c * 4, threads,
               [this](int64_t r0, int64_t r1) { rows(r0, r1); });
  }
};

// the own AVX2 depthwise form where the CPU and the tensors allow it (see `DepthwiseAvx2`),
// else None; pads: top, left (bottom and right follow from the output's size)
std::optional<Form> own_depthwise_avx2(const View& out_buffer, const View& x_buffer,
                                       const View& w_buffer, std::optional<View> bias,
                                       std::optional<View> res_buffer, int64_t sh,
                                       int64_t sw, int64_t pt, int64_t pl, int64_t dh,
                                       int64_t dw, Act act, int64_t threads) {
  const int64_t c = x_buffer.size(3);
  if (!own_avx2() || !depthwise_tensors_ok(out_buffer, x_buffer, w_buffer, bias, res_buffer))
    return std::nullopt;
  const int64_t kh = w_buffer.size(1), kw = w_buffer.size(2);
  auto packed = packed_depthwise(w_buffer);
  DepthwiseAvx2 conv{x_buffer.data_ptr<float>(), nullptr,
                     bias ? bias->data_ptr<float>() : nullptr,
                     res_buffer ? res_buffer->data_ptr<float>() : nullptr,
                     out_buffer.data_ptr<float>(), x_buffer.size(0), x_buffer.size(1),
                     x_buffer.size(2), c, out_buffer.size(1), out_buffer.size(2), kh, kw, sh, sw,
                     pt, pl, dh, dw, act};
  // the captured tensors hold the buffers and the packed weight alive as long as the form
  return Form([conv, packed, x_buffer, out_buffer, bias, res_buffer, act, threads]() mutable {
    conv.w = packed->data();
    conv(threads);
  });
}

// paragraph's own GEMM for a product by a constant matrix (an NHWC 1x1 convolution, a linear
// layer) with AVX2: out = act(a @ W + bias + res), W packed once into panels of 16 columns
// ([panel][k][16], zero-padded), tiles of up to 6 rows x 16 columns accumulating over all of
// K in 12 of the 16 vector registers, the epilogue applied while the tile is in them. Threads
// split the rows; with W small enough to stay in L2 each thread goes row block by row block
// (each block of a read once), else panel by panel over its rows (each panel read once).
constexpr int64_t kNR8 = 16, kMR8 = 6;
// packed weights up to this size stay in L2 (3/4 of a Zen 3 core's 512 KB) across row blocks:
// the tiles go row block by row block, larger ones panel by panel (EfficientNet-B0's 14 x 14
// 672 -> 112 projection, a 301 KB weight, panel by panel reread its 527 KB input from L3 for
// each of 7 panels and ran 2x oneDNN's)
constexpr int64_t kWeightInL2Avx2 = 384 << 10;

// a tile's epilogue: act(acc + bias + res) stored into MR rows of c, ncols of the 16 real
template <int MR>
__attribute__((target("avx2,fma"), always_inline)) inline void store_tile8(
    const __m256* acc0, const __m256* acc1, float* c, int64_t ldc, int64_t ncols,
    const float* bias, const float* res, int64_t ldr, Act act) {
  const __m256i m0 = tail_mask8(ncols), m1 = tail_mask8(std::max<int64_t>(ncols - 8, 0));
  const __m256 bias0 = bias ? _mm256_maskload_ps(bias, m0) : _mm256_setzero_ps();
  const __m256 bias1 = bias ? _mm256_maskload_ps(bias + 8, m1) : _mm256_setzero_ps();
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    __m256 v0 = _mm256_add_ps(acc0[r], bias0), v1 = _mm256_add_ps(acc1[r], bias1);
    if (res) {  // read before the store: res may be c itself (a residual written in place)
      v0 = _mm256_add_ps(v0, _mm256_maskload_ps(res + r * ldr, m0));
      v1 = _mm256_add_ps(v1, _mm256_maskload_ps(res + r * ldr + 8, m1));
    }
    v0 = apply_linear_act8(v0, act);
    v1 = apply_linear_act8(v1, act);
    if (ncols == kNR8) {
      _mm256_storeu_ps(c + r * ldc, v0);
      _mm256_storeu_ps(c + r * ldc + 8, v1);
    } else {
      _mm256_maskstore_ps(c + r * ldc, m0, v0);
      _mm256_maskstore_ps(c + r * ldc + 8, m1, v1);
    }
  }
  if (!in_registers(act)) act_rows8(c, MR, ldc, ncols, act);  // the tile, in L1
}

// MR rows of a (stride lda) by one panel (ncols of its 16 columns real) over all of K
template <int MR>
__attribute__((target("avx2,fma"))) void gemm_tile8(const float* __restrict__ a, int64_t lda,
                                                    const float* __restrict__ b, int64_t k,
                                                    float* c, int64_t ldc, int64_t ncols,
                                                    const float* bias, const float* res,
                                                    int64_t ldr, Act act) {
  __m256 acc0[MR], acc1[MR];  // in registers: every loop over them unrolled (see above)
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  // K unrolled by 4: one step is 12 FMAs and 8 loads, and its address and loop arithmetic
  // (about 8 more instructions) left the FMA units idle (5-10% on ResNeXt's 1 x 1 shapes alone)
#pragma GCC unroll 4
  for (int64_t i = 0; i < k; ++i, b += kNR8) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda + i);
      acc0[r] = _mm256_fmadd_ps(av, b0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(av, b1, acc1[r]);
    }
  }
  store_tile8<MR>(acc0, acc1, c, ldc, ncols, bias, res, ldr, act);
}

using TileFn8 = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t,
                         const float*, const float*, int64_t, Act);
constexpr std::array<TileFn8, kMR8> kTiles8 = {&gemm_tile8<1>, &gemm_tile8<2>, &gemm_tile8<3>,
                                               &gemm_tile8<4>, &gemm_tile8<5>, &gemm_tile8<6>};

struct PackedGemmAvx2 {
  const float *a, *packed, *bias, *res;
  float* c;
  int64_t m, k, n;
  Act act;

  // rows [m0, m1) by panels [p0, p1). An activation that is not piecewise-linear goes over
  // each row block's panels (or each panel's row tiles) once they are stored, in L1: tile by
  // tile (12 vectors at a time after each tile's FMAs) it cost GELU 2x its time in a long run
  void range(int64_t m0, int64_t m1, int64_t p0, int64_t p1) const {
    const Act tile_act = in_registers(act) ? act : Act::kNone;
    auto tile = [&](int64_t p, int64_t r) {
      const int64_t n0 = p * kNR8;
      kTiles8[std::min(kMR8, m1 - r) - 1](a + r * k, k, packed + p * k * kNR8, k, c + r * n + n0,
                                         n, std::min(kNR8, n - n0), bias ? bias + n0 : nullptr,
                                         res ? res + r * n + n0 : nullptr, n, tile_act);
    };
    const int64_t c0 = p0 * kNR8, c1 = std::min(n, p1 * kNR8);
    if (k * n * 4 <= kWeightInL2Avx2) {
      for (int64_t r = m0; r < m1; r += kMR8) {
        for (int64_t p = p0; p < p1; ++p) tile(p, r);
        if (tile_act != act) act_rows8(c + r * n + c0, std::min(kMR8, m1 - r), n, c1 - c0, act);
      }
    } else {
      for (int64_t p = p0; p < p1; ++p) {
        for (int64_t r = m0; r < m1; r += kMR8) tile(p, r);
        if (tile_act != act)
          act_rows8(c + m0 * n + p * kNR8, m1 - m0, n, std::min(kNR8, n - p * kNR8), act);
      }
    }
  }

  // the rows split over the threads, or the panels where the rows are fewer blocks than
  // threads (an RNN's step: one row by a large W) or W is the larger operand and does not
  // stay in L2 (each thread would read all of it: EfficientNet-B0's 7 x 7 320 -> 1280, a
  // 1.6 MB weight, ran 1.2x oneDNN's split by rows)
  void operator()(int64_t threads) const {
    const int64_t blocks = (m + kMR8 - 1) / kMR8, panels = (n + kNR8 - 1) / kNR8;
    const bool by_panel = blocks < threads || (n > m && k * n * 4 > kWeightInL2Avx2);
    if (by_panel && panels < threads) threads = 1;
    parallel(threads, [&](int64_t t, int64_t nt) {
      if (by_panel) {
        range(0, m, panels * t / nt, panels * (t + 1) / nt);
      } else {
        range(blocks * t / nt * kMR8, std::min(m, blocks * (t + 1) / nt * kMR8), 0, panels);
      }
    });
  }
};

// the own AVX2 GEMM's form of out2 = act(rows @ W + bias + res2), W's element (n, k) at
// w[n * sn + k * sk]; None where the CPU or the tensors do not allow it
std::optional<Form> packed_gemm_avx2(View out2, View rows, const View& w,
                                     int64_t sn, int64_t sk, std::optional<View> bias,
                                     std::optional<View> res2, Act act, int64_t threads) {
  const int64_t m = rows.size(0), k = rows.size(1), n = out2.size(1);
  if (!own_avx2() || !gemm_tensors_ok(out2, rows, w, bias, res2)) return std::nullopt;
  auto packed = lazy_packed(w, "panels16", [w, n, k, sn, sk]() {
    return pack_panels(w, n, k, sn, sk, kNR8);
  });
  return Form([=]() {
    PackedGemmAvx2{rows.data_ptr<float>(), packed->data(),
                   bias ? bias->data_ptr<float>() : nullptr,
                   res2 ? res2->data_ptr<float>() : nullptr, out2.data_ptr<float>(), m, k, n,
                   act}(threads);
  });
}
// the own AVX2 GEMM's form followed by PyTorch's pass of GELU's erf form over its output: a
// form of PyTorch's (it loads libtorch), beside the own GEMM with the own GELU, the faster by
// timing. The own erf form (a division, nine FMAs and an exponential) took about 2 ns an
// element on a Zen 3 core, PyTorch's about 1: over ViT-B/16's 197 x 3072 outputs, on two
// threads, 0.6 ms against 0.3 of a 6 ms product. None for any other activation.
std::optional<Form> packed_gemm_avx2_torch_gelu(View out2, View rows, const View& w,
                                                int64_t sn, int64_t sk,
                                                std::optional<View> bias,
                                                std::optional<View> res2, Act act,
                                                int64_t threads) {
  if (act != Act::kGelu) return std::nullopt;
  auto plain = packed_gemm_avx2(out2, rows, w, sn, sk, bias, res2, Act::kNone, threads);
  if (!plain) return std::nullopt;
  return deferred([plain = *plain, out2](const AtenForms& aten) -> Form {
    const AtenForms* table = &aten;  // the library's, loaded for the process's life
    return [plain, out2, table]() {
      plain();
      table->activate(out2, Act::kGelu);
    };
  });
}

// a convolution's tile with AVX2: MR output pixels (pixel r's window origin at rows[r]) by
// one 16-column panel, accumulated tap by tap (tap t: kc inputs at rows[r] + taps[t] against
// the panel's next kc rows), as the AVX-512 `conv_tile`
template <int MR>
__attribute__((target("avx2,fma"))) void conv_tile8(const float* const* rows,
                                                    const int64_t* taps, int64_t ntaps,
                                                    int64_t kc, const float* __restrict__ b,
                                                    float* c, int64_t ldc, int64_t ncols,
                                                    const float* bias, const float* res,
                                                    int64_t ldr, Act act) {
  __m256 acc0[MR], acc1[MR];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  for (int64_t t = 0; t < ntaps; ++t) {
    const float* at[MR];
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) at[r] = rows[r] + taps[t];
#pragma GCC unroll 4
    for (int64_t i = 0; i < kc; ++i, b += kNR8) {
      const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
      for (int r = 0; r < MR; ++r) {
        const __m256 av = _mm256_broadcast_ss(at[r] + i);
        acc0[r] = _mm256_fmadd_ps(av, b0, acc0[r]);
        acc1[r] = _mm256_fmadd_ps(av, b1, acc1[r]);
      }
    }
  }
  store_tile8<MR>(acc0, acc1, c, ldc, ncols, bias, res, ldr, act);
}

using ConvTileFn8 = void (*)(const float* const*, const int64_t*, int64_t, int64_t,
                             const float*, float*, int64_t, int64_t, const float*,
                             const float*, int64_t, Act);
constexpr std::array<ConvTileFn8, kMR8> kConvTiles8 = {&conv_tile8<1>, &conv_tile8<2>,
                                                       &conv_tile8<3>, &conv_tile8<4>,
                                                       &conv_tile8<5>, &conv_tile8<6>};

// paragraph's own convolution (groups = 1, any kernel, stride, dilation and padding) on NHWC
// float32 buffers with AVX2: the AVX-512 `ImplicitConv`'s implicit GEMM on the AVX2 GEMM's
// 6 x 16 tiles and 16-column panels over K = kh * kw * cin (one packing with the 1 x 1
// GEMM's). Without AVX-512 every convolution of kernel 3 x 3 and larger was oneDNN's: on a Zen
// 3, SqueezeNet's 54 x 54 16 -> 64 3 x 3 ran 722 us against ONNX Runtime's 339, and
// Inception-v3 whole ran 0.57x ONNX Runtime's speed.
struct ConvAvx2 {
  const float *x, *packed, *bias, *res;  // x: the (padded) input, [n][hp][wp][cin]
  float* out;
  int64_t n, hp, wp, cin, oh, ow, cout, sh, sw;
  int64_t kc;                 // inputs per tap: a kernel row's (kw * cin, contiguous) or cin
  std::vector<int64_t> taps;  // each tap's offset into x from a pixel's window origin
  Act act;

  // tiles [t0, t1) of kMR8 output pixels (image-major, row-major) by panels [p0, p1)
  void range(int64_t t0, int64_t t1, int64_t p0, int64_t p1) const {
    const int64_t k = kc * static_cast<int64_t>(taps.size()), pixels = n * oh * ow;
    const float* rows[kMR8];
    int64_t at = -1;  // the tile whose pixels `rows` holds
    auto tile = [&](int64_t q, int64_t p) {
      const int64_t n0 = p * kNR8, q0 = q * kMR8, count = std::min(kMR8, pixels - q0);
      if (at != q) {
        int64_t img = q0 / (oh * ow), y = q0 / ow % oh, j = q0 % ow;
        for (int64_t r = 0; r < count; ++r) {
          rows[r] = x + ((img * hp + y * sh) * wp + j * sw) * cin;
          if (++j == ow) {
            j = 0;
            if (++y == oh) y = 0, ++img;
          }
        }
        at = q;
      }
      kConvTiles8[count - 1](rows, taps.data(), static_cast<int64_t>(taps.size()), kc,
                             packed + p * k * kNR8, out + q0 * cout + n0, cout,
                             std::min(kNR8, cout - n0), bias ? bias + n0 : nullptr,
                             res ? res + q0 * cout + n0 : nullptr, cout, act);
    };
    if (k * cout * 4 <= kWeightInL2Avx2) {
      for (int64_t q = t0; q < t1; ++q)
        for (int64_t p = p0; p < p1; ++p) tile(q, p);
    } else {
      for (int64_t p = p0; p < p1; ++p)
        for (int64_t q = t0; q < t1; ++q) tile(q, p);
    }
  }

  void operator()(int64_t threads) const {
    const int64_t panels = (cout + kNR8 - 1) / kNR8, tiles = (n * oh * ow + kMR8 - 1) / kMR8;
    const int64_t k = kc * static_cast<int64_t>(taps.size());
    const bool by_panel = k * cout > n * hp * wp * cin;
    parallel(threads, [&](int64_t t, int64_t nt) {
      if (by_panel) {
        panel_share(panels, tiles, t, nt, [&](int64_t q0, int64_t q1, int64_t p0, int64_t p1) {
          range(q0, q1, p0, p1);
        });
      } else {
        range(tiles * t / nt, tiles * (t + 1) / nt, 0, panels);
      }
    });
  }
};

// the own AVX2 convolution's form where the CPU and the tensors allow it (see `ConvAvx2`),
// else None; pads: top, left, bottom, right
std::optional<Form> own_conv_avx2(const View& out_buffer, const View& x_buffer,
                                  const View& w_buffer, std::optional<View> bias,
                                  std::optional<View> res_buffer, int64_t sh, int64_t sw,
                                  std::array<int64_t, 4> pads, int64_t dh, int64_t dw, Act act,
                                  int64_t threads) {
  const int64_t cin = x_buffer.size(3), cout = out_buffer.size(3);
  if (!own_avx2() || !conv_tensors_ok(out_buffer, x_buffer, w_buffer, bias, res_buffer))
    return std::nullopt;
  const int64_t kh = w_buffer.size(1), kw = w_buffer.size(2), k = kh * kw * cin;
  auto packed = lazy_packed(w_buffer, "panels16", [w_buffer, cout, k]() {
    return pack_panels(w_buffer, cout, k, k, 1, kNR8);
  });
  const auto [pt, pl, pb, pr] = pads;
  const bool padded = pt || pl || pb || pr || !x_buffer.is_contiguous();
  const int64_t hp = x_buffer.size(1) + pt + pb, wp = x_buffer.size(2) + pl + pr;
  ConvAvx2 conv{nullptr, nullptr, bias ? bias->data_ptr<float>() : nullptr,
                res_buffer ? res_buffer->data_ptr<float>() : nullptr,
                out_buffer.data_ptr<float>(), x_buffer.size(0), hp, wp, cin,
                out_buffer.size(1), out_buffer.size(2), cout, sh, sw, cin, {}, act};
  if (dw == 1) conv.kc = kw * cin;  // a kernel row's inputs side by side (see ImplicitConv)
  for (int64_t ky = 0; ky < kh; ++ky)
    for (int64_t kx = 0; kx < (dw == 1 ? 1 : kw); ++kx)
      conv.taps.push_back((ky * dh * wp + kx * dw) * cin);
  return Form([conv, packed, x_buffer, out_buffer, bias, res_buffer, pads, padded, act,
               threads]() mutable {
    conv.packed = packed->data();
    conv.x = padded ? padded_input(x_buffer, pads[0], pads[1], pads[2], pads[3], threads)
                    : x_buffer.data_ptr<float>();
    conv(threads);
  });
}
// R rows x 16 columns (from j; Full: all 16 real, else the lanes of m0 and m1) of one product
// C = act(A @ B + bias) of row-major float32 matrices, all of K accumulated in 2R registers:
// a broadcast of A's element and two loads of B's row per step, no packing (B's rows are read
// where they lie), as the AVX-512 `bmm_tile`
template <int R, bool Full>
__attribute__((target("avx2,fma"))) void bmm_tile8(const float* a, const float* b, float* c,
                                                   int64_t k_len, int64_t n, int64_t j,
                                                   __m256i m0, __m256i m1, const float* bias,
                                                   Act act) {
  __m256 acc0[R], acc1[R];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  const float* bj = b + j;
#pragma GCC unroll 2
  for (int64_t k = 0; k < k_len; ++k, bj += n) {
    const __m256 b0 = Full ? _mm256_loadu_ps(bj) : _mm256_maskload_ps(bj, m0);
    const __m256 b1 = Full ? _mm256_loadu_ps(bj + 8) : _mm256_maskload_ps(bj + 8, m1);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * k_len + k);
      acc0[r] = _mm256_fmadd_ps(av, b0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(av, b1, acc1[r]);
    }
  }
  __m256 bias0 = _mm256_setzero_ps(), bias1 = _mm256_setzero_ps();
  if (bias) {
    bias0 = Full ? _mm256_loadu_ps(bias + j) : _mm256_maskload_ps(bias + j, m0);
    bias1 = Full ? _mm256_loadu_ps(bias + j + 8) : _mm256_maskload_ps(bias + j + 8, m1);
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    const __m256 v0 = apply_linear_act8(_mm256_add_ps(acc0[r], bias0), act);
    const __m256 v1 = apply_linear_act8(_mm256_add_ps(acc1[r], bias1), act);
    if (Full) {
      _mm256_storeu_ps(c + r * n + j, v0);
      _mm256_storeu_ps(c + r * n + j + 8, v1);
    } else {
      _mm256_maskstore_ps(c + r * n + j, m0, v0);
      _mm256_maskstore_ps(c + r * n + j + 8, m1, v1);
    }
  }
  if (!in_registers(act)) act_rows8(c + j, R, n, std::min<int64_t>(16, n - j), act);
}

using BmmTile8 = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t, __m256i,
                          __m256i, const float*, Act);
// by [Full][rows - 1]
constexpr BmmTile8 kBmmTiles8[2][6] = {
    {&bmm_tile8<1, false>, &bmm_tile8<2, false>, &bmm_tile8<3, false>, &bmm_tile8<4, false>,
     &bmm_tile8<5, false>, &bmm_tile8<6, false>},
    {&bmm_tile8<1, true>, &bmm_tile8<2, true>, &bmm_tile8<3, true>, &bmm_tile8<4, true>,
     &bmm_tile8<5, true>, &bmm_tile8<6, true>}};

// rows of one product per task with AVX2: four tiles of 6 rows, each 16-column strip of B read
// from L1 by all of them
constexpr int64_t kBmmRows8 = 24;

// ``rows`` rows (at most kBmmRows8; a, c at the first) of one product, all columns, strip by
// strip of 16 columns, tiles of 6 rows (the last fewer)
__attribute__((target("avx2,fma"))) void bmm_rows8(const float* a, const float* b, float* c,
                                                   int64_t rows, int64_t k_len, int64_t n,
                                                   const float* bias, Act act) {
  for (int64_t j = 0; j < n; j += 16) {
    const bool full = n - j >= 16;
    const __m256i m0 = tail_mask8(n - j), m1 = tail_mask8(std::max<int64_t>(n - j - 8, 0));
    for (int64_t i = 0; i < rows; i += kMR8)
      kBmmTiles8[full][std::min(kMR8, rows - i) - 1](a + i * k_len, b, c + i * n, k_len, n, j,
                                                      m0, m1, bias, act);
  }
}

// the own batched product o3 = act(a3 @ b3 + bias) with AVX2 (attention's scores and context,
// and a product of two activations as a batch of one), as the AVX-512 `own_bmm`: each block of
// rows of each product one task, the tasks split over the threads, the activation applied as
// each tile is stored. None where the CPU allows the AVX-512 form (or lacks AVX2) or a tensor
// is not contiguous float32. PyTorch's (MKL's) was the only form without AVX-512, so that
// DistilBERT's and GPT-2's artifacts mapped libtorch, ~105 MiB, for their attention alone.
std::optional<Form> own_bmm_avx2(View o3, View a3, View b3, std::optional<View> bias, Act act,
                                 int64_t threads) {
  if (!own_avx2() || !plain_float(o3) || !plain_float(a3) || !plain_float(b3) ||
      (bias && (!plain_float(*bias) || bias->numel() != b3.size(2))) || o3.numel() == 0 ||
      a3.size(2) == 0)
    return std::nullopt;
  return Form([o3, a3, b3, bias, act, threads]() {
    const int64_t batch = a3.size(0), m = a3.size(1), k_len = a3.size(2), n = b3.size(2);
    const int64_t blocks = (m + kBmmRows8 - 1) / kBmmRows8, tasks = batch * blocks;
    const float *a = a3.data_ptr<float>(), *b = b3.data_ptr<float>();
    const float* bp = bias ? bias->data_ptr<float>() : nullptr;
    float* c = o3.data_ptr<float>();
    // below 2^18 multiply-adds (a few microseconds) the calling thread alone
    const int64_t nt = batch * m * n * k_len >= (int64_t{1} << 18) ? threads : 1;
    parallel(nt, [&](int64_t t, int64_t count) {
      for (int64_t task = tasks * t / count; task < tasks * (t + 1) / count; ++task) {
        const int64_t q = task / blocks, i = task % blocks * kBmmRows8;
        bmm_rows8(a + (q * m + i) * k_len, b + q * k_len * n, c + (q * m + i) * n,
                  std::min(kBmmRows8, m - i), k_len, n, bp, act);
      }
    });
  });
}

// whether the CPU runs AVX2 and FMA code (the own grouped forms', which have no AVX-512
// siblings and compete with oneDNN's by timing on any such CPU), read once
inline bool cpu_avx2_fma() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

// A grouped convolution's tile: MR output pixels by NV vectors of 8 columns (MR x NV <= 12
// accumulators), accumulated tap by tap: tap t's kc inputs of pixel r at table[t * 8 + r] +
// shift (a row of the input, or a row of zeros where the tap lies in the padding) against the
// panel's next kc rows of 8 * NV weights. Epilogue as `store_tile8`'s; returns whether a value
// computed (a column beyond ncols too) is NaN. KC > 0: kc is KC, known when compiled (a group's
// 8 or two groups' 16 inputs: the loop over them unrolled, every offset a constant).
template <int MR, int NV, int KC = 0>
__attribute__((target("avx2,fma"))) bool grouped_tile(const float* const* table, int64_t ntaps,
                                                      int64_t shift, int64_t kc,
                                                      const float* __restrict__ b, float* c,
                                                      int64_t ldc, int64_t ncols,
                                                      const float* bias, const float* res,
                                                      int64_t ldr, Act act) {
  __m256 acc[MR * NV];  // in registers: every loop over them unrolled (see `DepthwiseAvx2`)
#pragma GCC unroll 16
  for (int a = 0; a < MR * NV; ++a) acc[a] = _mm256_setzero_ps();
  for (int64_t t = 0; t < ntaps; ++t) {
    const float* at[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) at[r] = table[t * 8 + r] + shift;
#pragma GCC unroll 16
    for (int64_t i = 0; i < (KC > 0 ? KC : kc); ++i, b += 8 * NV) {
      __m256 w[NV];
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) w[v] = _mm256_loadu_ps(b + 8 * v);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256 av = _mm256_broadcast_ss(at[r] + i);
#pragma GCC unroll 2
        for (int v = 0; v < NV; ++v) acc[r * NV + v] = _mm256_fmadd_ps(av, w[v], acc[r * NV + v]);
      }
    }
  }
  __m256i m[NV];
  __m256 bias_v[NV];
#pragma GCC unroll 2
  for (int v = 0; v < NV; ++v) {
    m[v] = tail_mask8(std::max<int64_t>(ncols - 8 * v, 0));
    bias_v[v] = bias ? _mm256_maskload_ps(bias + 8 * v, m[v]) : _mm256_setzero_ps();
  }
  __m256 nan = _mm256_setzero_ps();
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      __m256 x = _mm256_add_ps(acc[r * NV + v], bias_v[v]);
      if (res) x = _mm256_add_ps(x, _mm256_maskload_ps(res + r * ldr + 8 * v, m[v]));
      x = apply_linear_act8(x, act);
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
      if (ncols == 8 * NV) {
        _mm256_storeu_ps(c + r * ldc + 8 * v, x);
      } else {
        _mm256_maskstore_ps(c + r * ldc + 8 * v, m[v], x);
      }
    }
  }
  return _mm256_movemask_ps(nan) != 0;
}

using GroupedTileFn = bool (*)(const float* const*, int64_t, int64_t, int64_t, const float*,
                               float*, int64_t, int64_t, const float*, const float*, int64_t,
                               Act);
// [count - 1]: 6 x 16 tiles and 8 x 8 tiles
constexpr std::array<GroupedTileFn, 6> kGroupedTiles16 = {
    &grouped_tile<1, 2>, &grouped_tile<2, 2>, &grouped_tile<3, 2>,
    &grouped_tile<4, 2>, &grouped_tile<5, 2>, &grouped_tile<6, 2>};
constexpr std::array<GroupedTileFn, 8> kGroupedTiles8 = {
    &grouped_tile<1, 1>, &grouped_tile<2, 1>, &grouped_tile<3, 1>, &grouped_tile<4, 1>,
    &grouped_tile<5, 1>, &grouped_tile<6, 1>, &grouped_tile<7, 1>, &grouped_tile<8, 1>};
// the same where a tap's inputs are 16 (6 x 16 tiles) or 8 (8 x 8 tiles): groups of 4 and 8
constexpr std::array<GroupedTileFn, 6> kGroupedTiles16K16 = {
    &grouped_tile<1, 2, 16>, &grouped_tile<2, 2, 16>, &grouped_tile<3, 2, 16>,
    &grouped_tile<4, 2, 16>, &grouped_tile<5, 2, 16>, &grouped_tile<6, 2, 16>};
constexpr std::array<GroupedTileFn, 8> kGroupedTiles8K8 = {
    &grouped_tile<1, 1, 8>, &grouped_tile<2, 1, 8>, &grouped_tile<3, 1, 8>,
    &grouped_tile<4, 1, 8>, &grouped_tile<5, 1, 8>, &grouped_tile<6, 1, 8>,
    &grouped_tile<7, 1, 8>, &grouped_tile<8, 1, 8>};

// paragraph's own grouped convolution (1 < groups < channels: ResNeXt's 32 groups of 4-32
// channels, RegNet's groups of 8) on NHWC float32 buffers with AVX2: each panel of outputs
// reads only the input channels of the groups it covers: one group's where a group fills the
// panel, else the span of the groups in it, the weight block-diagonal there (zeros across
// groups). Two forms, timed: 6 x 16 tiles (2x the multiply-adds for groups of 8, 4x for groups
// of 4) and 8 x 8 tiles (none for groups of 8, 2x for 4, but a broadcast per FMA). The
// padding is read as zeros where a tap lies in it (a padded copy of the input took 9-17% of
// the time of ResNeXt's and RegNet's). oneDNN's form, the only one before, ran ResNeXt-50's
// 56 x 56 x 128 in 32 groups 1.3x ONNX Runtime's time and its stride-2 ones 2-2.3x,
// RegNetY-400MF's 1.5-2x (`kernel_classes.py`, Zen 3, 2 threads). Tile by tile: panel by
// panel (each panel's weights staying in L1) ran 1.1-2x slower on ResNeXt's shapes, its
// inputs read a group's slice at a time. A zero weight times an infinite or NaN input is NaN
// where the grouped convolution has none, so the tiles watch for a NaN computed and such a
// call is done again by oneDNN's form: NaN and infinities where it has them, and only there.
struct GroupedConvAvx2 {
  const float *x, *packed, *bias, *res;  // x: the input, [n][h][w][cin]
  float* out;
  int64_t n, h, w, cin, oh, ow, cout, sh, sw, pt, pl, kh, kw, dh, dw;
  std::vector<int64_t> in0, span, boff;  // per panel: first input channel, count, packed at
  Act act;
  int64_t nr, mr;  // a panel's columns (16 or 8) and a tile's pixels (6 or 8)

  // tiles [q0, q1) of mr output pixels (image-major, row-major) by panels [p0, p1), tile by
  // tile; whether a NaN was computed
  bool range(int64_t q0, int64_t q1, int64_t p0, int64_t p1) const {
    bool nan = false;
    const int64_t pixels = n * oh * ow;
    thread_local std::vector<float> zeros;  // a row of the padding (every span lies in cin)
    if (static_cast<int64_t>(zeros.size()) < cin) zeros.assign(cin, 0.0f);
    std::vector<const float*> table(kh * kw * 8);
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t first = q * mr, count = std::min(mr, pixels - first);
      int64_t img = first / (oh * ow), y = first / ow % oh, j = first % ow;
      for (int64_t r = 0; r < count; ++r) {
        for (int64_t ky = 0; ky < kh; ++ky) {
          const int64_t iy = y * sh - pt + ky * dh;
          for (int64_t kx = 0; kx < kw; ++kx) {
            const int64_t ix = j * sw - pl + kx * dw;
            table[(ky * kw + kx) * 8 + r] = iy >= 0 && iy < h && ix >= 0 && ix < w
                                                ? x + ((img * h + iy) * w + ix) * cin
                                                : zeros.data();
          }
        }
        if (++j == ow) {
          j = 0;
          if (++y == oh) y = 0, ++img;
        }
      }
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t n0 = p * nr;
        const int64_t c = count - 1;
        const GroupedTileFn tile_fn =
            nr == 16 ? (span[p] == 16 ? kGroupedTiles16K16[c] : kGroupedTiles16[c])
                     : (span[p] == 8 ? kGroupedTiles8K8[c] : kGroupedTiles8[c]);
        nan |= tile_fn(
            table.data(), kh * kw, in0[p], span[p], packed + boff[p], out + first * cout + n0,
            cout, std::min(nr, cout - n0), bias ? bias + n0 : nullptr,
            res ? res + first * cout + n0 : nullptr, cout, act);
      }
    }
    return nan;
  }

  // whether a NaN was computed
  bool operator()(int64_t threads) const {
    const int64_t tiles = (n * oh * ow + mr - 1) / mr;
    const int64_t panels = static_cast<int64_t>(in0.size());
    std::atomic<bool> nan{false};
    parallel(threads, [&](int64_t t, int64_t nt) {
      bool seen = false;
      if (tiles < 4 * nt) {  // few tiles (7 x 7 outputs): shares of the tiles x panels grid
        panel_share(panels, tiles, t, nt, [&](int64_t q0, int64_t q1, int64_t p0, int64_t p1) {
          seen |= range(q0, q1, p0, p1);
        });
      } else {
        seen = range(tiles * t / nt, tiles * (t + 1) / nt, 0, panels);
      }
      if (seen) nan.store(true, std::memory_order_relaxed);
    });
    return nan.load();
  }
};

// the own grouped convolution's form with panels of ``nr`` (16 or 8) columns where the CPU and
// the tensors allow it (see `GroupedConvAvx2`), else None; ``exact``: the form that redoes a
// call where a NaN was computed (its output is rewritten whole, so no residual written in
// place: it would be read again); w_buffer: (cout, kh, kw, cin / groups); pads: top, left
// (bottom and right follow from the output's size)
std::optional<Form> own_grouped_conv_avx2(const View& out_buffer,
                                          const View& x_buffer, const View& w_buffer,
                                          std::optional<View> bias,
                                          std::optional<View> res_buffer, int64_t sh,
                                          int64_t sw, int64_t pt, int64_t pl, int64_t dh,
                                          int64_t dw, int64_t groups, Act act, Form exact,
                                          int64_t nr, int64_t threads) {
  const int64_t cin = x_buffer.size(3), cout = out_buffer.size(3);
  // the input NHWC itself (the taps' table reads it where it lies), no residual in place
  if (!cpu_avx2_fma() || groups < 2 || !plain_float(x_buffer) ||
      !conv_tensors_ok(out_buffer, x_buffer, w_buffer, bias, res_buffer, groups) ||
      (res_buffer && res_buffer->data_ptr() == out_buffer.data_ptr()))
    return std::nullopt;
  const int64_t kh = w_buffer.size(1), kw = w_buffer.size(2), ntaps = kh * kw;
  const int64_t cin_g = cin / groups, cout_g = cout / groups;
  const int64_t panels = (cout + nr - 1) / nr;
  std::vector<int64_t> in0(panels), span(panels), boff(panels);
  int64_t total = 0;
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t o0 = p * nr, o1 = std::min(cout, o0 + nr);
    const int64_t g0 = o0 / cout_g, g1 = (o1 - 1) / cout_g;
    in0[p] = g0 * cin_g;
    span[p] = (g1 - g0 + 1) * cin_g;
    boff[p] = total;
    total += ntaps * span[p] * nr;
  }
  auto packed = lazy_packed(w_buffer, "grouped" + std::to_string(nr),
                            [w_buffer, in0, span, boff, total, cout, ntaps, cin_g, cout_g, nr]() {
    View out = View::zeros({total});
    const View w = w_buffer.contiguous();
    const float* src = w.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    const int64_t panels = static_cast<int64_t>(in0.size());
    for (int64_t p = 0; p < panels; ++p)
      for (int64_t o = p * nr; o < std::min(cout, (p + 1) * nr); ++o) {
        const int64_t g = o / cout_g;
        for (int64_t t = 0; t < ntaps; ++t)
          for (int64_t ci = 0; ci < cin_g; ++ci)  // the group's inputs; the others stay zero
            dst[boff[p] + (t * span[p] + g * cin_g + ci - in0[p]) * nr + o - p * nr] =
                src[(o * ntaps + t) * cin_g + ci];
      }
    return out;
  });
  GroupedConvAvx2 conv{x_buffer.data_ptr<float>(), nullptr,
                       bias ? bias->data_ptr<float>() : nullptr,
                       res_buffer ? res_buffer->data_ptr<float>() : nullptr,
                       out_buffer.data_ptr<float>(), x_buffer.size(0), x_buffer.size(1),
                       x_buffer.size(2), cin, out_buffer.size(1), out_buffer.size(2), cout, sh, sw,
                       pt, pl, kh, kw, dh, dw, in0, span, boff, act, nr, nr == 16 ? 6 : 8};
  // the captured tensors hold the buffers and the packed weight alive as long as the form
  return Form([conv, packed, x_buffer, out_buffer, bias, res_buffer, act, exact,
               threads]() mutable {
    conv.packed = packed->data();
    if (conv(threads)) {
      exact();
      return;
    }
    if (!in_registers(act)) act_all8(out_buffer, act, threads);  // over the whole output
  });
}
#endif

}  // namespace
