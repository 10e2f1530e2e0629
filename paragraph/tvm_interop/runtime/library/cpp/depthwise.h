// Depthwise convolutions (groups = input = output channels), paragraph's own on NHWC float32
// buffers: four output pixels a channel vector at a time, the taps in the padding skipped
// (`Depthwise`, `own_depthwise`).
//
// Included only by kernels.cc, the kernels' translation unit: its definitions lie in
// kernels.cc's anonymous namespace, after those of the headers it includes.
#pragma once

#include "common.h"
#include "activations.h"
#include "threads.h"
#include "packing.h"
#include "forms.h"

namespace {

#ifdef PARAGRAPH_AVX512
// paragraph's own depthwise convolution (groups = input = output channels) on NHWC float32
// buffers: out = act(conv + bias + res). The weight, (C, kh, kw, 1) in OHWI, is packed once as
// [kh][kw][C] so that a vector of 16 channels of one tap is one load; each output row goes a
// channel vector at a time, four output pixels side by side (four independent FMA chains that
// share each tap's load), the taps that fall in the padding skipped (TF-style uneven padding
// needs no padded copy of the input). oneDNN's depthwise convolutions ran NASNet-A mobile's
// 9.8 ms against ONNX Runtime's 6.9 on one thread (Xeon host).
struct Depthwise {
  const float *x, *w, *bias, *res;  // w packed [kh][kw][c]; bias and res may be null
  float* out;
  int64_t n, h, wd, c, oh, ow, kh, kw, sh, sw, pt, pl, dh, dw;
  Act act;
  void (Depthwise::*eight)(const float*, int64_t, __mmask16, __m512, int64_t, int64_t, int64_t,
                           float*, const float*) const;  // `eight_for`'s

  __attribute__((target("avx512f"))) void rows(int64_t r0, int64_t r1) const {
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t r = r0; r < r1; ++r) {  // r = (image, output row)
      const int64_t img = r / oh, ih0 = (r % oh) * sh - pt;
      const float* image = x + img * h * wd * c;
      float* orow = out + r * ow * c;
      const float* rrow = res ? res + r * ow * c : nullptr;
      if (eight != nullptr) {  // every channel of eight pixels at a time (see `eight_pixels`)
        // the input rows the next output row reads first, brought into L2 while this row
        // works (a pixel's channels a vector at a time, as they are read): in a model the
        // input comes from memory, and three or more rows of a stream are too many for the
        // hardware's prefetch. MobileNetV2's 112 x 112 x 96 stride-2 depthwise: 300 -> 128
        // us in the model (ONNX Runtime's 151); its 56 x 56 x 144: 188 -> 169
        const int64_t nh0 = ih0 + kh, nh1 = std::min(ih0 + kh + sh, h);
        const bool pfx = r + 1 < r1;
        for (int64_t j = 0; j < ow; j += 8) {
          const int64_t w0 = std::max<int64_t>(j * sw - pl, 0),
                        w1 = std::min<int64_t>((j + 8) * sw - pl, wd);  // its columns
          for (int64_t k = 0; k < c; k += 16) {
            const __mmask16 m = tail_mask(c - k);
            const __m512 b = bias ? _mm512_maskz_loadu_ps(m, bias + k) : zero;
            if (pfx)
              for (int64_t ih = std::max<int64_t>(nh0, 0); ih < nh1; ++ih)
                for (int64_t iw = w0; iw < w1; ++iw)
                  _mm_prefetch(reinterpret_cast<const char*>(image + (ih * wd + iw) * c + k),
                               _MM_HINT_T1);
            (this->*eight)(image, k, m, b, ih0, j, std::min<int64_t>(8, ow - j), orow, rrow);
          }
        }
        if (!in_registers(act)) act_rows(orow, 1, 0, ow * c, act);
        continue;
      }
      for (int64_t k = 0; k < c; k += 16) {
        const __mmask16 m = tail_mask(c - k);
        const __m512 b = bias ? _mm512_maskz_loadu_ps(m, bias + k) : zero;
        int64_t j = 0;
        // four pixels at a time where all their taps are inside the row (no checks per tap)
        for (; j + 4 <= ow; j += 4) {
          const int64_t iw0 = j * sw - pl, iw3 = (j + 3) * sw - pl + (kw - 1) * dw;
          if (iw0 < 0 || iw3 >= wd) {
            for (int64_t q = j; q < j + 4; ++q)
              finish(pixel(image, k, m, b, ih0, q), orow, rrow, q * c + k, m);
            continue;
          }
          __m512 a0 = b, a1 = b, a2 = b, a3 = b;
          for (int64_t ky = 0; ky < kh; ++ky) {
            const int64_t ih = ih0 + ky * dh;
            if (ih < 0 || ih >= h) continue;
            const float* xr = image + (ih * wd + iw0) * c + k;
            const float* wr = w + ky * kw * c + k;
            for (int64_t kx = 0; kx < kw; ++kx) {
              const __m512 wv = _mm512_maskz_loadu_ps(m, wr + kx * c);
              const float* xp = xr + kx * dw * c;
              a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, xp), wv, a0);
              a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, xp + sw * c), wv, a1);
              a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, xp + 2 * sw * c), wv, a2);
              a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, xp + 3 * sw * c), wv, a3);
            }
          }
          finish(a0, orow, rrow, (j + 0) * c + k, m);
          finish(a1, orow, rrow, (j + 1) * c + k, m);
          finish(a2, orow, rrow, (j + 2) * c + k, m);
          finish(a3, orow, rrow, (j + 3) * c + k, m);
        }
        for (; j < ow; ++j) finish(pixel(image, k, m, b, ih0, j), orow, rrow, j * c + k, m);
      }
      if (!in_registers(act)) act_rows(orow, 1, 0, ow * c, act);  // the row, still in L1
    }
  }

  // eight output pixels j..j+7 of one channel vector (the first ``count`` stored), undilated
  // along the row: each input vector of a kernel row is loaded once and kept in a register
  // for the KW taps (and S-strided pixels) that read it, zero where it lies in the padding,
  // and each tap's weight loaded once for the eight pixels. Eight independent FMA chains where
  // the four of the general loop left the FMA pipes half idle, (P - 1) S + KW loads a kernel
  // row instead of 5 KW, and no check per tap at the borders. MnasNet's 112 x 112 depthwise
  // convolution: 0.32 ms in the general loop, oneDNN's 0.135, this 0.11 (one thread, alone).
  // A row goes eight pixels at a time, every channel of them: the input rows they read stay
  // in L1, where a pass along the row per channel vector read them from L2 for each vector
  // (MobileNetV2's 56 x 56 x 144: 0.21 ms a call in the model, ONNX Runtime's 0.10)
  template <int KW, int S>
  __attribute__((target("avx512f"))) void eight_pixels(const float* image, int64_t k,
                                                       __mmask16 m, __m512 b, int64_t ih0,
                                                       int64_t j, int64_t count, float* orow,
                                                       const float* rrow) const {
    constexpr int P = 8, N = (P - 1) * S + KW;
    __m512 acc[P];
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p) acc[p] = b;
    const int64_t iw0 = j * S - pl;
    const bool inside = iw0 >= 0 && iw0 + N <= wd;
    for (int64_t ky = 0; ky < kh; ++ky) {
      const int64_t ih = ih0 + ky * dh;
      if (ih < 0 || ih >= h) continue;
      const float* xr = image + ih * wd * c + k;
      const float* wr = w + ky * KW * c + k;
      __m512 in[N];
      if (inside) {
#pragma GCC unroll 32
        for (int t = 0; t < N; ++t) in[t] = _mm512_maskz_loadu_ps(m, xr + (iw0 + t) * c);
      } else {  // a border: the taps in the padding read zeros
#pragma GCC unroll 32
        for (int t = 0; t < N; ++t) {
          const int64_t iw = iw0 + t;
          in[t] = iw >= 0 && iw < wd ? _mm512_maskz_loadu_ps(m, xr + iw * c)
                                     : _mm512_setzero_ps();
        }
      }
#pragma GCC unroll 16
      for (int kx = 0; kx < KW; ++kx) {
        const __m512 wv = _mm512_maskz_loadu_ps(m, wr + kx * c);
#pragma GCC unroll 16
        for (int p = 0; p < P; ++p) acc[p] = _mm512_fmadd_ps(in[p * S + kx], wv, acc[p]);
      }
    }
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p)
      if (p < count) finish(acc[p], orow, rrow, (j + p) * c + k, m);
  }

  using Eight = void (Depthwise::*)(const float*, int64_t, __mmask16, __m512, int64_t, int64_t,
                                    int64_t, float*, const float*) const;
  // `eight_pixels` for this kernel width and stride, where one is compiled (its inputs,
  // accumulators and weight fit the 32 vector registers), else null
  static Eight eight_for(int64_t kw, int64_t sw, int64_t dw) {
    if (dw != 1) return nullptr;
    switch (kw * 10 + sw) {
      case 31: return &Depthwise::eight_pixels<3, 1>;
      case 32: return &Depthwise::eight_pixels<3, 2>;
      case 51: return &Depthwise::eight_pixels<5, 1>;
      case 52: return &Depthwise::eight_pixels<5, 2>;
      case 71: return &Depthwise::eight_pixels<7, 1>;
      case 72: return &Depthwise::eight_pixels<7, 2>;
      case 91: return &Depthwise::eight_pixels<9, 1>;
      default: return nullptr;
    }
  }

  // the epilogue of one channel vector of one pixel at ``at`` in the row: residual, a
  // piecewise-linear activation (any other over the whole row after it: see `in_registers`),
  // store
  __attribute__((target("avx512f"), always_inline)) void finish(__m512 acc, float* orow,
                                                                const float* rrow, int64_t at,
                                                                __mmask16 m) const {
    if (rrow) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(m, rrow + at));
    _mm512_mask_storeu_ps(orow + at, m, apply_linear_act(acc, act));
  }

  // one output pixel's channel vector, every tap checked against the borders
  __attribute__((target("avx512f"))) __m512 pixel(const float* image, int64_t k, __mmask16 m,
                                                  __m512 acc, int64_t ih0, int64_t j) const {
    const int64_t iw0 = j * sw - pl;
    for (int64_t ky = 0; ky < kh; ++ky) {
      const int64_t ih = ih0 + ky * dh;
      if (ih < 0 || ih >= h) continue;
      for (int64_t kx = 0; kx < kw; ++kx) {
        const int64_t iw = iw0 + kx * dw;
        if (iw < 0 || iw >= wd) continue;
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, image + (ih * wd + iw) * c + k),
                              _mm512_maskz_loadu_ps(m, w + (ky * kw + kx) * c + k), acc);
      }
    }
    return acc;
  }

  void operator()(int64_t threads) const {
    split_rows(n * oh, n * oh * ow * c * 4, threads,
               [this](int64_t r0, int64_t r1) { rows(r0, r1); });
  }
};

// the tensors a depthwise form reads and writes as the own forms take them (this one and
// avx2.h's): contiguous float32, the weight (C, kh, kw, 1) of the input's channels
bool depthwise_tensors_ok(const View& out_buffer, const View& x_buffer,
                          const View& w_buffer, const std::optional<View>& bias,
                          const std::optional<View>& res_buffer) {
  const int64_t c = x_buffer.size(3);
  return plain_float(x_buffer) && plain_float(out_buffer) &&
         w_buffer.scalar_type() == kFloat && w_buffer.dim() == 4 && w_buffer.size(0) == c &&
         w_buffer.size(3) == 1 && out_buffer.size(3) == c &&
         out_buffer.size(0) == x_buffer.size(0) && (!bias || plain_float(*bias)) &&
         (!res_buffer || plain_float(*res_buffer));
}

// the depthwise weight packed [kh][kw][C] on first use, shared by the own forms
std::shared_ptr<LazyPacked<View>> packed_depthwise(const View& w_buffer) {
  const int64_t c = w_buffer.size(0), kh = w_buffer.size(1), kw = w_buffer.size(2);
  return lazy_packed(w_buffer, "depthwise", [w_buffer, c, kh, kw]() {
    return w_buffer.reshape({c, kh * kw}).t().contiguous();  // [kh * kw][c]
  });
}

// the own depthwise form where the CPU and the tensors allow it (see `Depthwise`), else None;
// pads: top, left (bottom and right follow from the output's size)
std::optional<Form> own_depthwise(const View& out_buffer, const View& x_buffer,
                                  const View& w_buffer, std::optional<View> bias,
                                  std::optional<View> res_buffer, int64_t sh, int64_t sw,
                                  int64_t pt, int64_t pl, int64_t dh, int64_t dw, Act act,
                                  int64_t threads) {
  const int64_t c = x_buffer.size(3);
  if (!own_avx512() || !depthwise_tensors_ok(out_buffer, x_buffer, w_buffer, bias, res_buffer))
    return std::nullopt;
  const int64_t kh = w_buffer.size(1), kw = w_buffer.size(2);
  auto packed = packed_depthwise(w_buffer);
  Depthwise conv{x_buffer.data_ptr<float>(), nullptr,
                 bias ? bias->data_ptr<float>() : nullptr,
                 res_buffer ? res_buffer->data_ptr<float>() : nullptr, out_buffer.data_ptr<float>(),
                 x_buffer.size(0), x_buffer.size(1), x_buffer.size(2), c, out_buffer.size(1),
                 out_buffer.size(2), kh, kw, sh, sw, pt, pl, dh, dw, act,
                 Depthwise::eight_for(kw, sw, dw)};
  // the captured tensors hold the buffers and the packed weight alive as long as the form
  return Form([conv, packed, x_buffer, out_buffer, bias, res_buffer, threads]() mutable {
    conv.w = packed->data();
    conv(threads);
  });
}
#endif

}  // namespace
