// A network's first convolution, read straight from the model's NCHW input (`Stem`,
// `own_stem`): few input channels, NHWC output, every tap a broadcast input value times a
// vector of output channels.
//
// Included only by kernels.cc, the kernels' translation unit: its definitions lie in
// kernels.cc's anonymous namespace, after those of the headers it includes.
#pragma once

#include "common.h"
#include "activations.h"
#include "threads.h"
#include "packing.h"
#include "forms.h"
#include "conv.h"

namespace {

#ifdef PARAGRAPH_AVX512
// paragraph's own stem convolution: out (NHWC) = act(conv(x) + bias + res), x the model's NCHW
// input with up to 4 channels. With so few input channels a GEMM's K (kh kw cin: 27 for a 3x3)
// is short and its operand has to be gathered from NCHW first (the implicit GEMM's padded
// copy); here each output pixel's channels are one or two vectors of accumulators, and each
// tap (ky, kx, ci) adds an input value, broadcast straight from the NCHW row, times that tap's
// packed weight vector, for eight pixels at once: one weight load (two for 32 channels) shared
// by eight broadcasts and 8-16 FMAs. The taps in the padding read zeros (checked per pixel at
// the borders only). MobileNetV2's 224 x 224 x 3 -> 32 stem: implicit GEMM 0.33 ms on one
// thread, this 0.15 (ONNX Runtime's, in the model, 0.29).
struct Stem {
  const float *x, *w, *bias, *res;  // x NCHW; w packed [ky][kx][ci][cout_pad]; bias, res or null
  float* out;
  int64_t n, cin, h, wd, cout, cpad, oh, ow, kh, kw, sh, sw, pt, pl;
  Act act;

  // eight pixels j..j+7 of output row r, channels [k, k + 16 V), the first ``count`` stored;
  // KW and S the kernel's width and stride where compiled for them (0: any, from the struct)
  template <int V, int KW, int S>
  __attribute__((target("avx512f"))) void block(int64_t r, int64_t j, int64_t k,
                                                int64_t count) const {
    const int64_t kw_ = KW ? KW : kw, sw_ = S ? S : sw, cin_ = cin, cpad_ = cpad, h_ = h,
                  wd_ = wd, kh_ = kh;
    const int64_t img = r / oh, iy0 = (r % oh) * sh - pt, ix0 = j * sw_ - pl;
    const float* __restrict xin = x + img * cin_ * h_ * wd_;
    const float* __restrict wk = w + k;
    __mmask16 m[V];
    __m512 acc[8][V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) {
      m[v] = tail_mask(cout - k - 16 * v);
      const __m512 b = bias ? _mm512_maskz_loadu_ps(m[v], bias + k + 16 * v)
                            : _mm512_setzero_ps();
#pragma GCC unroll 8
      for (int p = 0; p < 8; ++p) acc[p][v] = b;
    }
    const bool inside = ix0 >= 0 && ix0 + 7 * sw_ + kw_ - 1 < wd_;
    for (int64_t ky = 0; ky < kh_; ++ky) {
      const int64_t iy = iy0 + ky;
      if (iy < 0 || iy >= h_) continue;
      for (int64_t ci = 0; ci < cin_; ++ci) {
        const float* __restrict xr = xin + (ci * h_ + iy) * wd_ + ix0;
        const float* __restrict wt = wk + (ky * kw_ * cin_ + ci) * cpad_;
        if (inside) {
#pragma GCC unroll 8
          for (int64_t kx = 0; kx < kw_; ++kx) {
            __m512 wv[V];
#pragma GCC unroll 2
            for (int v = 0; v < V; ++v) wv[v] = _mm512_loadu_ps(wt + kx * cin_ * cpad_ + 16 * v);
#pragma GCC unroll 8
            for (int p = 0; p < 8; ++p) {
              const __m512 xv = _mm512_set1_ps(xr[kx + p * sw_]);
#pragma GCC unroll 2
              for (int v = 0; v < V; ++v) acc[p][v] = _mm512_fmadd_ps(xv, wv[v], acc[p][v]);
            }
          }
        } else {  // a border: the taps in the padding read zeros
          for (int64_t kx = 0; kx < kw_; ++kx) {
            __m512 wv[V];
#pragma GCC unroll 2
            for (int v = 0; v < V; ++v) wv[v] = _mm512_loadu_ps(wt + kx * cin_ * cpad_ + 16 * v);
#pragma GCC unroll 8
            for (int p = 0; p < 8; ++p) {
              const int64_t ix = ix0 + kx + p * sw_;
              const __m512 xv = ix >= 0 && ix < wd_ ? _mm512_set1_ps(xr[kx + p * sw_])
                                                    : _mm512_setzero_ps();
#pragma GCC unroll 2
              for (int v = 0; v < V; ++v) acc[p][v] = _mm512_fmadd_ps(xv, wv[v], acc[p][v]);
            }
          }
        }
      }
    }
    float* orow = out + r * ow * cout;
    const float* rrow = res ? res + r * ow * cout : nullptr;
#pragma GCC unroll 8
    for (int p = 0; p < 8; ++p) {
      if (p >= count) break;
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) {
        const int64_t at = (j + p) * cout + k + 16 * v;
        __m512 a = acc[p][v];
        if (rrow) a = _mm512_add_ps(a, _mm512_maskz_loadu_ps(m[v], rrow + at));
        _mm512_mask_storeu_ps(orow + at, m[v], apply_linear_act(a, act));
      }
    }
  }

  template <int KW, int S>
  __attribute__((target("avx512f"))) void row_blocks(int64_t r) const {
    for (int64_t j = 0; j < ow; j += 8) {
      const int64_t count = std::min<int64_t>(8, ow - j);
      int64_t k = 0;
      for (; k + 16 < cout; k += 32) block<2, KW, S>(r, j, k, count);
      if (k < cout) block<1, KW, S>(r, j, k, count);
    }
  }

  __attribute__((target("avx512f"))) void rows(int64_t r0, int64_t r1) const {
    for (int64_t r = r0; r < r1; ++r) {
      if (kw == 3 && sw == 2)  // the usual stem, compiled for its sizes
        row_blocks<3, 2>(r);
      else
        row_blocks<0, 0>(r);
      if (!in_registers(act)) act_rows(out + r * ow * cout, 1, 0, ow * cout, act);
    }
  }

  void operator()(int64_t threads) const {
    split_rows(n * oh, n * oh * ow * cout * 4, threads,
               [this](int64_t r0, int64_t r1) { rows(r0, r1); });
  }
};

// the own stem form for an NCHW input (x_buffer its NHWC view) of up to 4 channels, undilated,
// where the CPU and tensors allow it (see `Stem`), else None; pads: top, left (bottom and right
// follow from the output's size)
std::optional<Form> own_stem(const View& out_buffer, const View& x_buffer,
                             const View& w_buffer, std::optional<View> bias,
                             std::optional<View> res_buffer, int64_t sh, int64_t sw,
                             int64_t pt, int64_t pl, int64_t dh, int64_t dw, Act act,
                             int64_t threads) {
  const int64_t cin = x_buffer.size(3), cout = out_buffer.size(3);
  if (!own_avx512() || !nchw_view(x_buffer) || !plain_float(out_buffer) || cin > 4 ||
      cin == 0 || dh != 1 || dw != 1 || w_buffer.scalar_type() != kFloat ||
      w_buffer.dim() != 4 || w_buffer.size(0) != cout || w_buffer.size(3) != cin ||
      out_buffer.size(0) != x_buffer.size(0) || out_buffer.numel() == 0 ||
      (bias && !plain_float(*bias)) || (res_buffer && !plain_float(*res_buffer)))
    return std::nullopt;
  const int64_t kh = w_buffer.size(1), kw = w_buffer.size(2), cpad = (cout + 15) / 16 * 16;
  auto packed = lazy_packed(w_buffer, "stem", [w_buffer, kh, kw, cin, cout, cpad]() {
    // OHWI -> [ky][kx][ci][cout], the output channels zero-padded to whole vectors
    View p = View::zeros({kh, kw, cin, cpad});
    View head = p;  // its first cout channels
    head.shape[3] = cout;
    w_buffer.permute({1, 2, 3, 0}).copy_into(head);
    return p;
  });
  Stem conv{x_buffer.data_ptr<float>(), nullptr,
            bias ? bias->data_ptr<float>() : nullptr,
            res_buffer ? res_buffer->data_ptr<float>() : nullptr, out_buffer.data_ptr<float>(),
            x_buffer.size(0), cin, x_buffer.size(1), x_buffer.size(2), cout, cpad,
            out_buffer.size(1), out_buffer.size(2), kh, kw, sh, sw, pt, pl, act};
  return Form([conv, packed, x_buffer, out_buffer, bias, res_buffer, threads]() mutable {
    conv.w = packed->data();
    conv(threads);
  });
}
#endif

}  // namespace
