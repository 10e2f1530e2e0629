// The Winograd forms of winograd.h with AVX2 (`WinogradAvx2`, `own_winograd_avx2`): the same
// transforms (F(2x2, 3x3), F(4x4, 3x3), F(2x2, 5x5) and the one-dimensional F(2, 3), F(4, 3),
// F(2, 7), F(3, 7)), from the same matrices, on 8-float vectors, and the GEMMs over the
// transformed positions on the AVX2 GEMM's 6 x 16 tiles and 16-column panels (avx2.h). Without
// AVX-512 a stride-1 3x3 convolution was oneDNN's direct form or the own implicit GEMM
// (`ConvAvx2`), each at most 70% of the two cores' FMA peak: ResNet-18 ran 0.89x ONNX
// Runtime's speed on a Zen 3 where, with the AVX-512 Winograd forms, it ran 1.64x on a Zen 4.
// Compiled at -O3.
//
// Included only by kernels.cc, the kernels' translation unit: its definitions lie in
// kernels.cc's anonymous namespace, after those of the headers it includes.
#pragma once

#include "common.h"
#include "activations.h"
#include "threads.h"
#include "packing.h"
#include "forms.h"
#include "winograd.h"
#include "avx2.h"

namespace {

#pragma GCC push_options
#pragma GCC optimize("O3")
#ifdef PARAGRAPH_AVX512  // x86-64
// out = mx in for a constant R x A matrix: the zero entries' terms dropped and the +-1 ones
// added or subtracted once the loops are unrolled (the matrices are constants)
template <int R, int A>
__attribute__((target("avx2,fma"), always_inline)) inline void apply_dense8(
    const float (&mx)[R][A], const __m256* in, __m256* out) {
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
    __m256 acc = _mm256_setzero_ps();
    bool first = true;
#pragma GCC unroll 16
    for (int j = 0; j < A; ++j) {
      const float c = mx[i][j];
      if (c == 0) continue;
      if (first) {
        acc = c == 1 ? in[j] : _mm256_mul_ps(_mm256_set1_ps(c), in[j]);
      } else if (c == 1) {
        acc = _mm256_add_ps(acc, in[j]);
      } else if (c == -1) {
        acc = _mm256_sub_ps(acc, in[j]);
      } else {
        acc = _mm256_fmadd_ps(_mm256_set1_ps(c), in[j], acc);
      }
      first = false;
    }
    out[i] = acc;
  }
}

// 8 floats at p: all of them, or the lanes of ``mask`` (a channel tail)
__attribute__((target("avx2"), always_inline)) inline __m256 load8(const float* p, bool full,
                                                                  __m256i mask) {
  return full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask);
}

__attribute__((target("avx2"), always_inline)) inline void store8(float* p, bool full,
                                                                 __m256i mask, __m256 v) {
  if (full)
    _mm256_storeu_ps(p, v);
  else
    _mm256_maskstore_ps(p, mask, v);
}

// D = 2: F(m x m, r x r) over m x m tiles; D = 1: F(m, r) along the kernel's one long axis (a
// 1 x r kernel: tiles of m pixels of a row; r x 1: of a column). As `Winograd`, the
// activations that are not piecewise-linear over each tile's pixels after its stores
template <typename F, int D>
struct WinogradAvx2 {
  static constexpr int kM = F::m, kA = F::a;
  static constexpr int kP = D == 2 ? F::a * F::a : F::a;  // positions
  const float *x, *u, *bias, *res;  // x: the input, unpadded
  float* out;
  int64_t n, h, wd, pt, pl, cin, oh, ow, cout, th, tw, block;  // th, tw: tiles down and across
  Act act;
  bool streamed;  // U does not stay in L2 (see `Winograd::range`)
  bool down;      // D = 1: tiles along a column (an r x 1 kernel)

  void origin(int64_t t, int64_t& img, int64_t& ty, int64_t& tx) const {
    img = t / (th * tw);
    ty = t / tw % th;
    tx = t % tw;
  }
  int64_t row_of(int64_t ty) const { return D == 2 || down ? kM * ty : ty; }
  int64_t col_of(int64_t tx) const { return D == 2 || !down ? kM * tx : tx; }

  // V[xi][b] = (B^T d B)[xi] for tiles [t0, t0 + count), V[xi] at v + xi * ld ([count][cin]);
  // a pixel in the padding read from ``zeros``
  __attribute__((target("avx2,fma"))) void transform_input(int64_t t0, int64_t count, float* v,
                                                           int64_t ld,
                                                           const float* zeros) const {
    const float* at[kP];
    for (int64_t b = 0; b < count; ++b) {
      int64_t img, ty, tx;
      origin(t0 + b, img, ty, tx);
      const int64_t y0 = row_of(ty) - pt, x0 = col_of(tx) - pl;
      for (int i = 0; i < kP; ++i) {
        const int64_t y = y0 + (D == 2 ? i / kA : down ? i : 0);
        const int64_t z = x0 + (D == 2 ? i % kA : down ? 0 : i);
        at[i] = y >= 0 && y < h && z >= 0 && z < wd ? x + ((img * h + y) * wd + z) * cin : zeros;
      }
      for (int64_t c = 0; c < cin; c += 8) {
        const bool full = c + 8 <= cin;
        const __m256i mask = tail_mask8(cin - c);
        if constexpr (D == 1) {
          __m256 d[kA], r[kA];
          for (int i = 0; i < kA; ++i) d[i] = load8(at[i] + c, full, mask);
          apply_dense8<kA, kA>(F::BT, d, r);
          for (int i = 0; i < kA; ++i) store8(v + i * ld + b * cin + c, full, mask, r[i]);
        } else {
          __m256 s[kA][kA];  // s[j][i]: B^T d's row i, column j
          for (int j = 0; j < kA; ++j) {
            __m256 d[kA];
            for (int i = 0; i < kA; ++i) d[i] = load8(at[i * kA + j] + c, full, mask);
            apply_dense8<kA, kA>(F::BT, d, s[j]);
          }
          for (int i = 0; i < kA; ++i) {
            __m256 row[kA], r[kA];
            for (int j = 0; j < kA; ++j) row[j] = s[j][i];
            apply_dense8<kA, kA>(F::BT, row, r);
            float* to = v + i * kA * ld + b * cin + c;
            for (int j = 0; j < kA; ++j) store8(to + j * ld, full, mask, r[j]);
          }
        }
      }
    }
  }

  // output channels [c0, c1) of tiles [t0, t0 + count) from their products (M[xi] at
  // mm + xi * ld, [count][cout]): A^T m A, then bias, residual and a piecewise-linear
  // activation; outputs past the image's edge are not written
  __attribute__((target("avx2,fma"))) void transform_output(int64_t t0, int64_t count,
                                                            const float* mm, int64_t ld,
                                                            int64_t c0, int64_t c1) const {
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t b = 0; b < count; ++b) {
      int64_t img, ty, tx;
      origin(t0 + b, img, ty, tx);
      const int64_t rows = std::min<int64_t>(D == 2 || down ? kM : 1, oh - row_of(ty));
      const int64_t cols = std::min<int64_t>(D == 2 || !down ? kM : 1, ow - col_of(tx));
      const int64_t at = ((img * oh + row_of(ty)) * ow + col_of(tx)) * cout;
      for (int64_t c = c0; c < c1; c += 8) {
        const bool full = c + 8 <= c1;
        const __m256i mask = tail_mask8(c1 - c);
        const __m256 bv = bias ? load8(bias + c, full, mask) : zero;
        if constexpr (D == 1) {
          __m256 p[kA], y[kM];
          for (int i = 0; i < kA; ++i) p[i] = load8(mm + i * ld + b * cout + c, full, mask);
          apply_dense8<kM, kA>(F::AT, p, y);
          const int64_t step = down ? ow * cout : cout, valid = down ? rows : cols;
          for (int64_t e = 0; e < valid; ++e) {
            const int64_t o = at + e * step + c;
            __m256 val = _mm256_add_ps(y[e], bv);
            if (res) val = _mm256_add_ps(val, load8(res + o, full, mask));
            store8(out + o, full, mask, apply_linear_act8(val, act));
          }
        } else {
          __m256 r[kA][kM];  // r[j][q]: A^T p's row q, column j
          for (int j = 0; j < kA; ++j) {
            __m256 p[kA];
            for (int i = 0; i < kA; ++i)
              p[i] = load8(mm + (i * kA + j) * ld + b * cout + c, full, mask);
            apply_dense8<kM, kA>(F::AT, p, r[j]);
          }
          for (int64_t q = 0; q < rows; ++q) {
            __m256 row[kA], y[kM];
            for (int j = 0; j < kA; ++j) row[j] = r[j][q];
            apply_dense8<kM, kA>(F::AT, row, y);
            for (int64_t e = 0; e < cols; ++e) {
              const int64_t o = at + (q * ow + e) * cout + c;
              __m256 val = _mm256_add_ps(y[e], bv);
              if (res) val = _mm256_add_ps(val, load8(res + o, full, mask));
              store8(out + o, full, mask, apply_linear_act8(val, act));
            }
          }
        }
      }
      if (!in_registers(act))  // the tile's rows x cols pixels (one-dimensional too), in L1
        for (int64_t q = 0; q < rows; ++q)
          act_rows8(out + at + q * ow * cout + c0, cols, cout, c1 - c0, act);
    }
  }

  // tiles [t0, t1) by panels [p0, p1), a block of tiles at a time, the block's V and M in
  // this thread's scratch, a line more than a block apart (see `Winograd::range`)
  void range(int64_t t0, int64_t t1, int64_t p0, int64_t p1) const {
    thread_local std::vector<float> scratch, zeros;
    const int64_t ldv = block * cin + 16, ldm = block * cout + 16;
    if (static_cast<int64_t>(scratch.size()) < kP * (ldv + ldm)) scratch.resize(kP * (ldv + ldm));
    if (static_cast<int64_t>(zeros.size()) < cin) zeros.resize(cin);
    float *v = scratch.data(), *mm = v + kP * ldv;
    const int64_t panels = (cout + kNR8 - 1) / kNR8;
    for (int64_t b0 = t0; b0 < t1; b0 += block) {
      const int64_t count = std::min(block, t1 - b0);
      transform_input(b0, count, v, ldv, zeros.data());
      const int64_t row_tiles = (count + kMR8 - 1) / kMR8;
      for (int64_t xi = 0; xi < kP; ++xi) {
        const float* vx = v + xi * ldv;
        float* mx = mm + xi * ldm;
        const float* ux = u + xi * panels * cin * kNR8;
        auto tile = [&](int64_t j, int64_t p) {
          const int64_t r = j * kMR8;
          kTiles8[std::min(kMR8, count - r) - 1](vx + r * cin, cin, ux + p * cin * kNR8, cin,
                                                 mx + r * cout + p * kNR8, cout,
                                                 std::min(kNR8, cout - p * kNR8), nullptr,
                                                 nullptr, 0, Act::kNone);
        };
        if (!streamed) {  // U stays in L2: each row tile of V once, by every panel
          for (int64_t j = 0; j < row_tiles; ++j)
            for (int64_t p = p0; p < p1; ++p) tile(j, p);
        } else {  // panel by panel: each panel of U read once a block
          for (int64_t p = p0; p < p1; ++p)
            for (int64_t j = 0; j < row_tiles; ++j) tile(j, p);
        }
      }
      transform_output(b0, count, mm, ldm, p0 * kNR8, std::min(cout, p1 * kNR8));
    }
  }

  void operator()(int64_t threads) const {
    const int64_t tiles = n * th * tw;
    if (!(tiles >= threads && n * oh * ow * cout * 4 >= (int64_t{64} << 10))) threads = 1;
    const int64_t panels = (cout + kNR8 - 1) / kNR8;
    parallel(threads, [&](int64_t t, int64_t nt) {
      // as `Winograd`: a streamed U ten times the transformed input split by panels
      if (streamed && panels >= nt && cout > 10 * tiles)
        range(0, tiles, panels * t / nt, panels * (t + 1) / nt);
      else
        range(tiles * t / nt, tiles * (t + 1) / nt, 0, panels);
    });
  }
};

// the AVX2 Winograd form of a stride-1 undilated convolution where the CPU, the tensors and
// the kernel's shape allow it (see `own_winograd`, whose checks and blocks these are), else
// None; pads: top, left, bottom, right
template <typename F, int D>
std::optional<Form> own_winograd_avx2(const View& out_buffer, const View& x_buffer,
                                      const View& w_buffer, std::optional<View> bias,
                                      std::optional<View> res_buffer,
                                      std::array<int64_t, 4> pads, Act act, int64_t threads) {
  constexpr int64_t kM = F::m, kR = F::r;
  const int64_t cin = x_buffer.size(3), cout = out_buffer.size(3);
  const int64_t oh = out_buffer.size(1), ow = out_buffer.size(2);
  if (w_buffer.dim() != 4) return std::nullopt;
  const int64_t kh = w_buffer.size(1), kw = w_buffer.size(2);
  const bool down = D == 1 && kh == kR && kw == 1;
  if (!(D == 2 ? kh == kR && kw == kR : down || (kh == 1 && kw == kR)) || !own_avx2() ||
      !plain_float(x_buffer) || !plain_float(out_buffer) ||
      w_buffer.scalar_type() != kFloat || w_buffer.size(0) != cout ||
      w_buffer.size(3) != cin || out_buffer.size(0) != x_buffer.size(0) ||
      (bias && !plain_float(*bias)) || (res_buffer && !plain_float(*res_buffer)) ||
      out_buffer.numel() == 0 || cin == 0 || oh != x_buffer.size(1) + pads[0] + pads[2] - kh + 1 ||
      ow != x_buffer.size(2) + pads[1] + pads[3] - kw + 1)
    return std::nullopt;
  auto packed = lazy_packed(w_buffer, F::name + std::string(D == 1 ? "/1d" : "") + "/16",
                            [w_buffer, cout, cin]() {
                              return pack_winograd<F, D, kNR8>(w_buffer, cout, cin);
                            });
  const bool across = D == 2 || !down, along = D == 2 || down;
  const int64_t th = along ? (oh + kM - 1) / kM : oh, tw = across ? (ow + kM - 1) / kM : ow;
  const bool streamed = winograd_packed_bytes<F, D, kNR8>(cout, cin) > kWinogradStreamed;
  const int64_t per_tile = WinogradAvx2<F, D>::kP * 4 * (cin + cout);
  const int64_t bytes = streamed ? kWinogradStreamedBlock : kWinogradBlock;
  const int64_t block = std::max(kMR8, bytes / per_tile / kMR8 * kMR8);
  WinogradAvx2<F, D> conv{x_buffer.data_ptr<float>(), nullptr,
                          bias ? bias->data_ptr<float>() : nullptr,
                          res_buffer ? res_buffer->data_ptr<float>() : nullptr,
                          out_buffer.data_ptr<float>(), x_buffer.size(0), x_buffer.size(1),
                          x_buffer.size(2), pads[0], pads[1], cin, oh, ow, cout, th, tw, block,
                          act, streamed, down};
  return Form([conv, packed, x_buffer, out_buffer, bias, res_buffer, act, threads]() mutable {
    conv.u = packed->data();
    conv(threads);
  });
}
#endif

#pragma GCC pop_options

}  // namespace
