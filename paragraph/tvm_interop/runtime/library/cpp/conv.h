// Convolutions with groups = 1: oneDNN's in place on a weight it packed once (`onednn_conv`, the
// ATen library's; also the form of depthwise and grouped convolutions), and paragraph's own as
// an implicit GEMM on the packed GEMM's panels and tile parts (`conv_tile`, `ImplicitConv`,
// `own_conv`), its input padded or reordered from NCHW into a scratch buffer of the calling
// thread (`padded_input`, `nhwc_row`).
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
#include "finite.h"
#include "aten.h"

namespace {

// ``form`` where the weight (``weight_finite``, a constant checked once), the input, the bias
// and the residual hold no NaN or infinity, else ``exact``, whose every output reads its own
// window alone: for a form that would spread one (a Winograd tile mixes its inputs, so one
// infinity makes NaN of outputs whose window does not hold it, and one NaN the whole tile's)
Form finite_only(Form form, Form exact, View x, std::optional<View> bias,
                 std::optional<View> res, bool weight_finite) {
  if (!weight_finite) return exact;
  return [=]() {
    if (any_nonfinite(x) || (bias && any_nonfinite(*bias)) || (res && any_nonfinite(*res)))
      exact();
    else
      form();
  };
}

// out = act(conv(x, w) + bias + out), in place (out starts as zero or the residual), oneDNN's on
// the weight w packed once for ``input_size`` (the padded input's): the ATen library's form
// (aten_forms.cc), made on its first call; x, w and out NCHW / OIHW views, out_buffer out's
// storage
Form onednn_conv(View out, View x, View w, std::optional<View> bias, std::optional<View> res,
                 std::vector<int64_t> padding, std::vector<int64_t> stride,
                 std::vector<int64_t> dilation, int64_t groups, std::vector<int64_t> pre_pad,
                 std::vector<int64_t> input_size, Act act, View out_buffer, bool weight_finite,
                 int64_t threads) {
  return deferred([=](const AtenForms& aten) {
    return aten.conv(out, x, w, bias, res, padding, stride, dilation, groups, pre_pad,
                     input_size, act, out_buffer, weight_finite, threads);
  });
}

#ifdef PARAGRAPH_AVX512
// a convolution's tile: MR output pixels, pixel r's input at rows[r] (its window's origin),
// by a panel, accumulated over the kernel's taps (tap t: kc = cin inputs at rows[r] + taps[t],
// against the panel's next kc rows); pixels of different output rows may share a tile
template <int MR, int NV>
__attribute__((target("avx512f,fma"))) void conv_tile(
    const float* const* rows, const int64_t* taps, int64_t ntaps, int64_t kc,
    const float* __restrict__ b, float* c, int64_t ldc, int64_t ncols, const float* bias,
    const float* res, int64_t ldr, Act act, Prefetch pf) {
  __m512 acc0[MR], acc1[MR];
  for (int r = 0; r < MR; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  prefetch_epilogue<MR, NV>(c, ldc, res, ldr);
  for (int64_t t = 0; t < ntaps; ++t, b += kc * kNR) {
    const float* at[MR];
    for (int r = 0; r < MR; ++r) at[r] = rows[r] + taps[t];
    accumulate<MR, NV>(at, kc, b, pf, ntaps * kc, acc0, acc1);
  }
  store_tile<MR, NV>(acc0, acc1, c, ldc, ncols, bias, res, ldr, act);
}

using ConvTileFn = void (*)(const float* const*, const int64_t*, int64_t, int64_t, const float*,
                            float*, int64_t, int64_t, const float*, const float*, int64_t, Act,
                            Prefetch);
template <int NV, int... R>
constexpr std::array<ConvTileFn, sizeof...(R)> conv_tiles(std::integer_sequence<int, R...>) {
  return {&conv_tile<R + 1, NV>...};
}
const auto kConvTiles1 = conv_tiles<1>(std::make_integer_sequence<int, kMR>{});
const auto kConvTiles2 = conv_tiles<2>(std::make_integer_sequence<int, kMR>{});

// paragraph's own convolution (groups = 1, any kernel, stride, dilation and padding) on NHWC
// float32 buffers: out = act(conv + bias + res) as an implicit GEMM on the packed GEMM's tiles.
// The weight (cout, kh, kw, cin) is packed once into 32-column panels over K = kh * kw * cin;
// a tile is 12 consecutive output pixels (across rows and images), each tap a GEMM step over
// the kc inputs that lie side by side in NHWC where the pixel's window has that tap: a kernel
// row's kw * cin where the width is undilated, else one position's cin (no im2col).
// Padding is a zero-bordered copy of the input in a buffer of the calling thread (one pass over
// the input: oneDNN's form zero-fills the output and adds into it instead). oneDNN's 3x3 and
// 7x1 convolutions ran Inception-v3 and ResNet-50 7-9% slower than ONNX Runtime's on one
// thread and scaled worse on two (Xeon host).
struct ImplicitConv {
  const float *x, *packed, *bias, *res;  // x: the (padded) input, [n][hp][wp][cin]
  float* out;
  int64_t n, hp, wp, cin, oh, ow, cout, sh, sw;
  int64_t kc;                 // inputs per tap: a kernel row's (kw * cin, contiguous) or cin
  std::vector<int64_t> taps;  // each tap's offset into x from a pixel's window origin
  Act act;

  // tiles [t0, t1) of kMR output pixels (image-major, row-major) by panels [p0, p1)
  void range(int64_t t0, int64_t t1, int64_t p0, int64_t p1) const {
    const int64_t k = kc * static_cast<int64_t>(taps.size()), pixels = n * oh * ow;
    const float* rows[kMR];
    int64_t at = -1;  // the tile whose pixels `rows` holds
    auto tile = [&](int64_t q, int64_t p, Prefetch pf) {
      const int64_t n0 = p * kNR, ncols = std::min(kNR, cout - n0);
      const int64_t q0 = q * kMR, count = std::min(kMR, pixels - q0);
      if (at != q) {  // one division per tile, not three per pixel: a stem's K is only 27
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
      (ncols > 16 ? kConvTiles2 : kConvTiles1)[count - 1](
          rows, taps.data(), static_cast<int64_t>(taps.size()), kc, packed + p * k * kNR,
          out + q0 * cout + n0, cout, ncols, bias ? bias + n0 : nullptr,
          res ? res + q0 * cout + n0 : nullptr, cout, act, pf);
    };
    if (k * cout * 4 <= kWeightInL2) {
      for (int64_t q = t0; q < t1; ++q)
        for (int64_t p = p0; p < p1; ++p)  // the first tile brings in W, as the GEMM's
          tile(q, p,
               q == t0 && p + 1 < p1 ? Prefetch::whole(packed + (p + 1) * k * kNR, k * kNR)
                                     : Prefetch{});
    } else {
      for (int64_t p = p0; p < p1; ++p) {
        const float* next = p + 1 < p1 ? packed + (p + 1) * k * kNR : nullptr;
        for (int64_t q = t0; q < t1; ++q)
          tile(q, p, Prefetch::share(next, k * kNR, q - t0, t1 - t0));
      }
    }
  }

  void operator()(int64_t threads) const {
    const int64_t panels = (cout + kNR - 1) / kNR, tiles = (n * oh * ow + kMR - 1) / kMR;
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

// pixels j..w of an NHWC row from NCHW planes, one float at a time (compiled for no ISA beyond
// the build's: `nhwc_row`'s callers without AVX-512 come here for the whole row)
__attribute__((noinline)) void nhwc_tail(float* d, const float* s, int64_t j, int64_t w,
                                         int64_t c, int64_t plane) {
  for (; j < w; ++j)
    for (int64_t k = 0; k < c; ++k) d[j * c + k] = s[k * plane + j];
}

// one row of w NHWC pixels of c channels at d from an NCHW image's row at s (channel planes
// ``plane`` apart): the model's input read where it lies, as ONNX Runtime's first convolution
// reorders it, instead of a transpose kernel before the convolution. Three channels (an RGB
// image) 16 pixels at a time: three loads, interleaved by two-source permutes into 48 floats
__attribute__((target("avx512f"))) void nhwc_row(float* d, const float* s, int64_t w,
                                                 int64_t c, int64_t plane) {
  int64_t j = 0;
  if (c == 3 && own_avx512()) {
    // output float o of a 48-float block is channel o % 3 of pixel o / 3; its index into
    // the pair (r, g) is pixel + 16 * channel, and b follows in a second permute
    alignas(64) int32_t i0[16], i1[16], i2[16];
    alignas(64) int32_t b0[16], b1[16], b2[16];
    for (int o = 0; o < 48; ++o) {
      const int pix = o / 3, ch = o % 3, lane = o % 16;
      int32_t* rg = o < 16 ? i0 : o < 32 ? i1 : i2;
      int32_t* bl = o < 16 ? b0 : o < 32 ? b1 : b2;
      rg[lane] = ch < 2 ? pix + 16 * ch : 0;   // r or g from the pair
      bl[lane] = ch == 2 ? 16 + pix : lane;    // b from the second source, else keep
    }
    const __m512i r0 = _mm512_load_si512(i0), r1 = _mm512_load_si512(i1),
                  r2 = _mm512_load_si512(i2), c0 = _mm512_load_si512(b0),
                  c1 = _mm512_load_si512(b1), c2 = _mm512_load_si512(b2);
    for (; j + 16 <= w; j += 16) {
      const __m512 r = _mm512_loadu_ps(s + j), g = _mm512_loadu_ps(s + plane + j),
                   b = _mm512_loadu_ps(s + 2 * plane + j);
      float* o = d + j * 3;
      _mm512_storeu_ps(o, _mm512_permutex2var_ps(_mm512_permutex2var_ps(r, r0, g), c0, b));
      _mm512_storeu_ps(o + 16,
                       _mm512_permutex2var_ps(_mm512_permutex2var_ps(r, r1, g), c1, b));
      _mm512_storeu_ps(o + 32,
                       _mm512_permutex2var_ps(_mm512_permutex2var_ps(r, r2, g), c2, b));
    }
  }
  nhwc_tail(d, s, j, w, c, plane);
}

// the input with zero borders (top, left, bottom, right) in the calling thread's scratch
// buffer, rows copied over the team; the buffer lives as long as the thread (the stream). x is
// NHWC, contiguous or a view of a contiguous NCHW tensor (reordered as it is copied)
const float* padded_input(const View& x, int64_t pt, int64_t pl, int64_t pb, int64_t pr,
                          int64_t threads) {
  thread_local std::vector<float> scratch;
  const int64_t n = x.size(0), h = x.size(1), w = x.size(2), c = x.size(3);
  const int64_t hp = h + pt + pb, wp = w + pl + pr;
  if (static_cast<int64_t>(scratch.size()) < n * hp * wp * c) scratch.resize(n * hp * wp * c);
  float* dst = scratch.data();
  const float* src = x.data_ptr<float>();
  const bool planes = !x.is_contiguous();  // checked by the caller: an NCHW tensor's view
  split_rows(n * hp, n * hp * wp * c * 4, threads, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t img = r / hp, y = r % hp - pt;
      float* d = dst + r * wp * c;
      if (y < 0 || y >= h) {
        std::memset(d, 0, wp * c * 4);
        continue;
      }
      std::memset(d, 0, pl * c * 4);
      if (planes) {
        const float* row = src + img * c * h * w + y * w;
        if (own_avx512()) {
          nhwc_row(d + pl * c, row, w, c, h * w);
        } else {  // no AVX-512 instruction may run (the AVX2 forms' input)
          nhwc_tail(d + pl * c, row, 0, w, c, h * w);
        }
      } else {
        std::memcpy(d + pl * c, src + (img * h + y) * w * c, w * c * 4);
      }
      std::memset(d + (pl + w) * c, 0, pr * c * 4);
    }
  });
  return dst;
}

// x (NHWC sizes) is a view of a contiguous NCHW float32 CPU tensor
bool nchw_view(const View& x) {
  return x.scalar_type() == kFloat && x.device().is_cpu() && x.dim() == 4 &&
         x.permute({0, 3, 1, 2}).is_contiguous();
}

// whether an own implicit-GEMM convolution (AVX-512 or AVX2) takes these tensors: float32 NHWC
// buffers (the input may be an NCHW tensor's view), a (cout, kh, kw, cin / groups) weight
bool conv_tensors_ok(const View& out_buffer, const View& x_buffer,
                     const View& w_buffer, const std::optional<View>& bias,
                     const std::optional<View>& res_buffer, int64_t groups = 1) {
  const int64_t cin = x_buffer.size(3), cout = out_buffer.size(3);
  return groups >= 1 && cin % groups == 0 && cout % groups == 0 &&
         (plain_float(x_buffer) || nchw_view(x_buffer)) && plain_float(out_buffer) &&
         w_buffer.scalar_type() == kFloat && w_buffer.dim() == 4 &&
         w_buffer.size(0) == cout && w_buffer.size(3) * groups == cin &&
         out_buffer.size(0) == x_buffer.size(0) && (!bias || plain_float(*bias)) &&
         (!res_buffer || plain_float(*res_buffer)) && out_buffer.numel() != 0 && cin != 0;
}

// the own convolution's form where the CPU and the tensors allow it (see `ImplicitConv`), else
// None; pads: top, left, bottom, right
std::optional<Form> own_conv(const View& out_buffer, const View& x_buffer,
                             const View& w_buffer, std::optional<View> bias,
                             std::optional<View> res_buffer, int64_t sh, int64_t sw,
                             std::array<int64_t, 4> pads, int64_t dh, int64_t dw, Act act,
                             int64_t threads) {
  const int64_t cin = x_buffer.size(3), cout = out_buffer.size(3);
  if (!own_avx512() || !conv_tensors_ok(out_buffer, x_buffer, w_buffer, bias, res_buffer))
    return std::nullopt;
  const int64_t kh = w_buffer.size(1), kw = w_buffer.size(2), k = kh * kw * cin;
  // (cout, kh, kw, cin) is W's (n, k) at n * k + k: one packing shared with the 1x1 GEMM's
  auto packed = lazy_packed(w_buffer, "panels",
                            [w_buffer, cout, k]() { return pack_panels(w_buffer, cout, k, k, 1); });
  const auto [pt, pl, pb, pr] = pads;
  // an NCHW input is reordered as it is copied, padding or not
  const bool padded = pt || pl || pb || pr || !x_buffer.is_contiguous();
  const int64_t hp = x_buffer.size(1) + pt + pb, wp = x_buffer.size(2) + pl + pr;
  ImplicitConv conv{nullptr, nullptr, bias ? bias->data_ptr<float>() : nullptr,
                    res_buffer ? res_buffer->data_ptr<float>() : nullptr,
                    out_buffer.data_ptr<float>(), x_buffer.size(0), hp, wp, cin,
                    out_buffer.size(1), out_buffer.size(2), cout, sh, sw, cin, {}, act};
  // undilated along the width, a kernel row's inputs lie side by side in NHWC, as its weights
  // in K: one tap per row (a stem's 3 input channels: 7 taps of 21, not 49 of 3)
  if (dw == 1) conv.kc = kw * cin;
  for (int64_t ky = 0; ky < kh; ++ky)
    for (int64_t kx = 0; kx < (dw == 1 ? 1 : kw); ++kx)
      conv.taps.push_back((ky * dh * wp + kx * dw) * cin);
  return Form([conv, packed, x_buffer, out_buffer, bias, res_buffer, pads, padded,
               threads]() mutable {
    conv.packed = packed->data();
    conv.x = padded ? padded_input(x_buffer, pads[0], pads[1], pads[2], pads[3], threads)
                    : x_buffer.data_ptr<float>();
    conv(threads);
  });
}
#endif

}  // namespace
