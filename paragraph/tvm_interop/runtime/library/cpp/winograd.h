// Stride-1 undilated convolutions by Winograd's minimal filtering (F(2x2, 3x3), F(4x4, 3x3), F(2x2,
// 5x5), F(2, 7), F(3, 7) and the one-dimensional forms of the 3-wide ones) on the packed GEMM's
// tiles: the transforms (`F2x3` ...), the tiles' input and output transforms and GEMMs
// (`Winograd`), the weight transformed and packed once (`pack_winograd`) and the forms
// (`own_winograd`). Compiled at -O3 (this header only).
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

namespace {

// the Winograd forms at -O3: their transforms loop over small arrays of vectors, which GCC
// at -O2 may keep rolled with the vectors on the stack (the softmax's such loops took 1.5x the
// time). In one process with the same forms: Inception-v3 1.075x on one thread and 1.073x on
// two, ResNet-50 1.025x and 1.013x; the whole file at -O3 ran NASNet-A mobile 4% slower on one
// thread, so only this part
#pragma GCC push_options
#pragma GCC optimize("O3")
#ifdef PARAGRAPH_AVX512
// paragraph's own stride-1 convolutions by Winograd's minimal filtering on NHWC float32
// buffers: out = act(conv + bias + res). For a 3x3 kernel, F(m x m, 3x3): each m x m block of
// output pixels (a tile) comes from an a x a patch of the input (a = m + 2): the patch is
// transformed (B^T d B), each of its a * a positions multiplied by the transformed weight
// (G g G^T, once per weight) as a * a GEMMs over the input channels on the packed GEMM's tiles,
// and the products transformed back to the outputs (A^T m A) with the epilogue. F(2x2, 3x3): 16
// products of cin x cout per 4 output pixels against 36 for a direct convolution (2.25x fewer
// multiplies); F(4x4, 3x3): 36 per 16 (4x), with more rounding (see `F4x3`); a 5x5 kernel by
// F(2x2, 5x5), 36 per 4 against 100 (`F2x5`). A 1 x r or r x 1
// kernel the same way along its long axis, F(m, r) (Inception's 1x7 and 7x1: F(2, 7)). No
// library form here makes any of them (oneDNN and ONNX Runtime's MLAS run these convolutions
// as direct or implicit GEMMs: ResNet-50's 56x56 64 -> 64 ones ran 15-18% slower than ONNX
// Runtime's on one thread). The patches are read where they lie in the input (no padded copy);
// tiles go a block at a time, the block's transformed inputs and products in L2 between the
// three steps.
//
// The one-dimensional transforms (Lavin and Gray, "Fast Algorithms for Convolutional Neural
// Networks", 2016; Toom-Cook from the points named): F(2, 3)'s written out, the larger ones'
// as their matrices.
struct F2x3 {
  static constexpr int m = 2, r = 3, a = 4;
  static constexpr double G[a][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
  // B^T and A^T as matrices, for the AVX2 forms' generic transforms (winograd_avx2.h)
  static constexpr float BT[a][a] = {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}};
  static constexpr float AT[m][a] = {{1, 1, 1, 0}, {0, 1, -1, -1}};
  static constexpr const char* name = "winograd23";

  // r = B^T d
  __attribute__((target("avx512f"), always_inline)) static inline void input(const __m512* d,
                                                                              __m512* r) {
    r[0] = _mm512_sub_ps(d[0], d[2]);
    r[1] = _mm512_add_ps(d[1], d[2]);
    r[2] = _mm512_sub_ps(d[2], d[1]);
    r[3] = _mm512_sub_ps(d[1], d[3]);
  }

  // y = A^T p
  __attribute__((target("avx512f"), always_inline)) static inline void output(const __m512* p,
                                                                               __m512* y) {
    y[0] = _mm512_add_ps(_mm512_add_ps(p[0], p[1]), p[2]);
    y[1] = _mm512_sub_ps(_mm512_sub_ps(p[1], p[2]), p[3]);
  }
};

// out = mx in (R x A constant matrices: the compiler drops the zero entries' terms)
template <int R, int A>
__attribute__((target("avx512f,fma"), always_inline)) inline void apply_dense(
    const float (&mx)[R][A], const __m512* in, __m512* out) {
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
    __m512 acc = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int j = 0; j < A; ++j)
      if (mx[i][j] != 0) acc = _mm512_fmadd_ps(_mm512_set1_ps(mx[i][j]), in[j], acc);
    out[i] = acc;
  }
}

// F(4x4, 3x3) from the points 0, 1, -1, 2, -1/2 and infinity rather than Lavin's 0, +-1, +-2:
// in float32 its largest error over random 64-channel sums was 4.3e-6 of the output's
// magnitude against 1.6e-5 (a residual convolution of a small test network missed the
// outputs' 1e-4 by 17% with those)
struct F4x3 {
  static constexpr int m = 4, r = 3, a = 6;
  static constexpr double G[a][r] = {{1, 0, 0},
                                     {-1.0 / 3, -1.0 / 3, -1.0 / 3},
                                     {1.0 / 3, -1.0 / 3, 1.0 / 3},
                                     {1.0 / 15, 2.0 / 15, 4.0 / 15},
                                     {-16.0 / 15, 8.0 / 15, -4.0 / 15},
                                     {0, 0, 1}};
  static constexpr float BT[a][a] = {{1, 1.5f, -2, -1.5f, 1, 0},    {0, -1, -2.5f, -0.5f, 1, 0},
                                     {0, 1, 0.5f, -2.5f, 1, 0},     {0, -0.5f, -1, 0.5f, 1, 0},
                                     {0, 2, -1, -2, 1, 0},          {0, 1, 1.5f, -2, -1.5f, 1}};
  static constexpr float AT[m][a] = {{1, 1, 1, 1, 1, 0},
                                     {0, 1, -1, 2, -0.5f, 0},
                                     {0, 1, 1, 4, 0.25f, 0},
                                     {0, 1, -1, 8, -0.125f, 1}};
  static constexpr const char* name = "winograd43";

  __attribute__((target("avx512f,fma"), always_inline)) static inline void input(const __m512* d,
                                                                                  __m512* r) {
    apply_dense<a, a>(BT, d, r);
  }

  __attribute__((target("avx512f,fma"), always_inline)) static inline void output(const __m512* p,
                                                                                   __m512* y) {
    apply_dense<m, a>(AT, p, y);
  }
};

// F(2x2, 5x5) for Inception's 5x5 convolutions (36 products per 4 outputs against 100), from
// F(4x4, 3x3)'s points, so with its input transform
struct F2x5 {
  static constexpr int m = 2, r = 5, a = 6;
  static constexpr double G[a][r] = {{1, 0, 0, 0, 0},
                                     {-1.0 / 3, -1.0 / 3, -1.0 / 3, -1.0 / 3, -1.0 / 3},
                                     {1.0 / 3, -1.0 / 3, 1.0 / 3, -1.0 / 3, 1.0 / 3},
                                     {1.0 / 15, 2.0 / 15, 4.0 / 15, 8.0 / 15, 16.0 / 15},
                                     {-16.0 / 15, 8.0 / 15, -4.0 / 15, 2.0 / 15, -1.0 / 15},
                                     {0, 0, 0, 0, 1}};
  static constexpr const float (&BT)[a][a] = F4x3::BT;
  static constexpr float AT[m][a] = {{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -0.5f, 1}};
  static constexpr const char* name = "winograd25";

  __attribute__((target("avx512f,fma"), always_inline)) static inline void input(const __m512* d,
                                                                                  __m512* r) {
    apply_dense<a, a>(F4x3::BT, d, r);
  }

  __attribute__((target("avx512f,fma"), always_inline)) static inline void output(const __m512* p,
                                                                                   __m512* y) {
    apply_dense<m, a>(AT, p, y);
  }
};

// F(2, 7) for Inception's 1x7 and 7x1 convolutions (one-dimensional: 8 products per 2
// outputs against 14), from the points 0, +-1, +-2, +-1/2 and infinity
struct F2x7 {
  static constexpr int m = 2, r = 7, a = 8;
  static constexpr double G[a][r] = {
      {-1, 0, 0, 0, 0, 0, 0},
      {-2.0 / 9, -2.0 / 9, -2.0 / 9, -2.0 / 9, -2.0 / 9, -2.0 / 9, -2.0 / 9},
      {-2.0 / 9, 2.0 / 9, -2.0 / 9, 2.0 / 9, -2.0 / 9, 2.0 / 9, -2.0 / 9},
      {1.0 / 90, 1.0 / 45, 2.0 / 45, 4.0 / 45, 8.0 / 45, 16.0 / 45, 32.0 / 45},
      {1.0 / 90, -1.0 / 45, 2.0 / 45, -4.0 / 45, 8.0 / 45, -16.0 / 45, 32.0 / 45},
      {32.0 / 45, 16.0 / 45, 8.0 / 45, 4.0 / 45, 2.0 / 45, 1.0 / 45, 1.0 / 90},
      {32.0 / 45, -16.0 / 45, 8.0 / 45, -4.0 / 45, 2.0 / 45, -1.0 / 45, 1.0 / 90},
      {0, 0, 0, 0, 0, 0, 1}};
  static constexpr float BT[a][a] = {{-1, 0, 5.25f, 0, -5.25f, 0, 1, 0},
                                     {0, 1, 1, -4.25f, -4.25f, 1, 1, 0},
                                     {0, -1, 1, 4.25f, -4.25f, -1, 1, 0},
                                     {0, 0.5f, 0.25f, -2.5f, -1.25f, 2, 1, 0},
                                     {0, -0.5f, 0.25f, 2.5f, -1.25f, -2, 1, 0},
                                     {0, 2, 4, -2.5f, -5, 0.5f, 1, 0},
                                     {0, -2, 4, 2.5f, -5, -0.5f, 1, 0},
                                     {0, -1, 0, 5.25f, 0, -5.25f, 0, 1}};
  static constexpr float AT[m][a] = {{1, 1, 1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0.5f, -0.5f, 1}};
  static constexpr const char* name = "winograd27";

  __attribute__((target("avx512f,fma"), always_inline)) static inline void input(const __m512* d,
                                                                                  __m512* r) {
    apply_dense<a, a>(BT, d, r);
  }

  __attribute__((target("avx512f,fma"), always_inline)) static inline void output(const __m512* p,
                                                                                   __m512* y) {
    apply_dense<m, a>(AT, p, y);
  }
};

// F(3, 7), the same from the points 0, +-1, +-2, +-1/2, 4 and infinity: 9 products per 3
// outputs (a 17-pixel row in 6 tiles against F(2, 7)'s 9); in float32 its median error over
// random 192-channel sums was 2.7e-6 of the output's magnitude against F(2, 7)'s 1.3e-6
struct F3x7 {
  static constexpr int m = 3, r = 7, a = 9;
  static constexpr double G[a][r] = {
      {1.0 / 4, 0, 0, 0, 0, 0, 0},
      {2.0 / 27, 2.0 / 27, 2.0 / 27, 2.0 / 27, 2.0 / 27, 2.0 / 27, 2.0 / 27},
      {2.0 / 45, -2.0 / 45, 2.0 / 45, -2.0 / 45, 2.0 / 45, -2.0 / 45, 2.0 / 45},
      {-1.0 / 180, -1.0 / 90, -1.0 / 45, -2.0 / 45, -4.0 / 45, -8.0 / 45, -16.0 / 45},
      {-1.0 / 540, 1.0 / 270, -1.0 / 135, 2.0 / 135, -4.0 / 135, 8.0 / 135, -16.0 / 135},
      {-64.0 / 315, -32.0 / 315, -16.0 / 315, -8.0 / 315, -4.0 / 315, -2.0 / 315, -1.0 / 315},
      {-64.0 / 405, 32.0 / 405, -16.0 / 405, 8.0 / 405, -4.0 / 405, 2.0 / 405, -1.0 / 405},
      {1.0 / 11340, 1.0 / 2835, 4.0 / 2835, 16.0 / 2835, 64.0 / 2835, 256.0 / 2835,
       1024.0 / 2835},
      {0, 0, 0, 0, 0, 0, 1}};
  static constexpr float BT[a][a] = {{4, -1, -21, 5.25f, 21, -5.25f, -4, 1, 0},
                                     {0, -4, -3, 18, 12.75f, -8.25f, -3, 1, 0},
                                     {0, 4, -5, -16, 21.25f, -0.25f, -5, 1, 0},
                                     {0, -2, -0.5f, 10.25f, 2.5f, -9.25f, -2, 1, 0},
                                     {0, 2, -1.5f, -9.75f, 7.5f, 6.75f, -6, 1, 0},
                                     {0, -8, -14, 14, 17.5f, -7, -3.5f, 1, 0},
                                     {0, 8, -18, -6, 22.5f, -3, -4.5f, 1, 0},
                                     {0, -1, 0, 5.25f, 0, -5.25f, 0, 1, 0},
                                     {0, 4, -1, -21, 5.25f, 21, -5.25f, -4, 1}};
  static constexpr float AT[m][a] = {{1, 1, 1, 1, 1, 1, 1, 1, 0},
                                     {0, 1, -1, 2, -2, 0.5f, -0.5f, 4, 0},
                                     {0, 1, 1, 4, 4, 0.25f, 0.25f, 16, 1}};
  static constexpr const char* name = "winograd37";

  __attribute__((target("avx512f,fma"), always_inline)) static inline void input(const __m512* d,
                                                                                  __m512* r) {
    apply_dense<a, a>(BT, d, r);
  }

  __attribute__((target("avx512f,fma"), always_inline)) static inline void output(const __m512* p,
                                                                                   __m512* y) {
    apply_dense<m, a>(AT, p, y);
  }
};

// D = 2: F(m x m, r x r) over m x m tiles; D = 1: F(m, r) along the kernel's one long axis (a
// 1 x r kernel: tiles of m pixels of a row; r x 1: of a column)
template <typename F, int D>
struct Winograd {
  static constexpr int kM = F::m, kA = F::a;
  static constexpr int kP = D == 2 ? F::a * F::a : F::a;  // positions
  const float *x, *u, *bias, *res;  // x: the input, unpadded
  float* out;
  int64_t n, h, wd, pt, pl, cin, oh, ow, cout, th, tw, block;  // th, tw: tiles down and across
  Act act;
  bool streamed;  // streamed: U does not stay in L2 (see `range`)
  bool down;            // D = 1: tiles along a column (an r x 1 kernel)

  // tile t's image, tile row and column
  void origin(int64_t t, int64_t& img, int64_t& ty, int64_t& tx) const {
    img = t / (th * tw);
    ty = t / tw % th;
    tx = t % tw;
  }

  // a tile's first pixel's row and column (its patch's, in the input padded)
  int64_t row_of(int64_t ty) const { return D == 2 || down ? kM * ty : ty; }
  int64_t col_of(int64_t tx) const { return D == 2 || !down ? kM * tx : tx; }

  // V[xi][b] = (B^T d B)[xi] for tiles [t0, t0 + count), V[xi] at v + xi * ld ([count][cin]).
  // The patches are read where they lie in the input, a pixel in the padding from ``zeros``
  // (cin of them): a zero-bordered copy of the input took a sixth of a 56x56 convolution
  __attribute__((target("avx512f,fma"))) void transform_input(int64_t t0, int64_t count,
                                                              float* v, int64_t ld,
                                                              const float* zeros) const {
    const float* at[kP];  // the patch's pixels: at[i * kA + j] (D = 1: at[i])
    for (int64_t b = 0; b < count; ++b) {
      int64_t img, ty, tx;
      origin(t0 + b, img, ty, tx);
      const int64_t y0 = row_of(ty) - pt, x0 = col_of(tx) - pl;
      for (int i = 0; i < kP; ++i) {
        const int64_t y = y0 + (D == 2 ? i / kA : down ? i : 0);
        const int64_t z = x0 + (D == 2 ? i % kA : down ? 0 : i);
        at[i] = y >= 0 && y < h && z >= 0 && z < wd ? x + ((img * h + y) * wd + z) * cin : zeros;
      }
      for (int64_t c = 0; c < cin; c += 16) {
        const __mmask16 mask = tail_mask(cin - c);
        if constexpr (D == 1) {
          __m512 d[kA], r[kA];
          for (int i = 0; i < kA; ++i) d[i] = _mm512_maskz_loadu_ps(mask, at[i] + c);
          F::input(d, r);
          for (int i = 0; i < kA; ++i) _mm512_mask_storeu_ps(v + i * ld + b * cin + c, mask, r[i]);
        } else {
          __m512 s[kA][kA];  // s[j][i]: B^T d's row i, column j
          for (int j = 0; j < kA; ++j) {
            __m512 d[kA];
            for (int i = 0; i < kA; ++i) d[i] = _mm512_maskz_loadu_ps(mask, at[i * kA + j] + c);
            F::input(d, s[j]);
          }
          for (int i = 0; i < kA; ++i) {
            __m512 row[kA], r[kA];
            for (int j = 0; j < kA; ++j) row[j] = s[j][i];
            F::input(row, r);
            float* at = v + i * kA * ld + b * cin + c;
            for (int j = 0; j < kA; ++j) _mm512_mask_storeu_ps(at + j * ld, mask, r[j]);
          }
        }
      }
    }
  }

  // output channels [c0, c1) of tiles [t0, t0 + count) from their products (M[xi] at
  // mm + xi * ld, [count][cout]): A^T m A, then bias, residual and a piecewise-linear
  // activation (any other over each pixel's channels after them: see `in_registers`); outputs
  // past the image's edge are not written
  __attribute__((target("avx512f,fma"))) void transform_output(int64_t t0, int64_t count,
                                                               const float* mm, int64_t ld,
                                                               int64_t c0, int64_t c1) const {
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t b = 0; b < count; ++b) {
      int64_t img, ty, tx;
      origin(t0 + b, img, ty, tx);
      const int64_t rows = std::min<int64_t>(D == 2 || down ? kM : 1, oh - row_of(ty));
      const int64_t cols = std::min<int64_t>(D == 2 || !down ? kM : 1, ow - col_of(tx));
      const int64_t at = ((img * oh + row_of(ty)) * ow + col_of(tx)) * cout;
      for (int64_t c = c0; c < c1; c += 16) {
        const __mmask16 mask = tail_mask(c1 - c);
        if constexpr (D == 1) {
          __m512 p[kA], y[kM];
          for (int i = 0; i < kA; ++i)
            p[i] = _mm512_maskz_loadu_ps(mask, mm + i * ld + b * cout + c);
          F::output(p, y);
          const __m512 bv = bias ? _mm512_maskz_loadu_ps(mask, bias + c) : zero;
          const int64_t step = down ? ow * cout : cout, valid = down ? rows : cols;
          for (int64_t e = 0; e < valid; ++e) {
            const int64_t o = at + e * step + c;
            __m512 val = _mm512_add_ps(y[e], bv);
            if (res) val = _mm512_add_ps(val, _mm512_maskz_loadu_ps(mask, res + o));
            _mm512_mask_storeu_ps(out + o, mask, apply_linear_act(val, act));
          }
        } else {
          __m512 r[kA][kM];  // r[j][q]: A^T p's row q, column j
          for (int j = 0; j < kA; ++j) {
            __m512 p[kA];
            for (int i = 0; i < kA; ++i)
              p[i] = _mm512_maskz_loadu_ps(mask, mm + (i * kA + j) * ld + b * cout + c);
            F::output(p, r[j]);
          }
          const __m512 bv = bias ? _mm512_maskz_loadu_ps(mask, bias + c) : zero;
          for (int64_t q = 0; q < rows; ++q) {
            __m512 row[kA], y[kM];
            for (int j = 0; j < kA; ++j) row[j] = r[j][q];
            F::output(row, y);
            for (int64_t e = 0; e < cols; ++e) {
              const int64_t o = at + (q * ow + e) * cout + c;
              __m512 val = _mm512_add_ps(y[e], bv);
              if (res) val = _mm512_add_ps(val, _mm512_maskz_loadu_ps(mask, res + o));
              _mm512_mask_storeu_ps(out + o, mask, apply_linear_act(val, act));
            }
          }
        }
      }
      if (!in_registers(act))  // (a tile's rows x cols pixels, the one-dimensional ones too)
        for (int64_t q = 0; q < rows; ++q)
          act_rows(out + at + q * ow * cout + c0, cols, cout, c1 - c0, act);
    }
  }

  // tiles [t0, t1) by panels [p0, p1), a block of tiles at a time, the block's V and M in
  // this thread's scratch. The matrices of each lie a line more than a block apart: at a
  // multiple of 4 KB (96 tiles of 64 channels) the 16 rows that one tile's transform writes or
  // reads fell in one set of L1 (12 ways), and the input transform took as long as a third of
  // the GEMMs
  void range(int64_t t0, int64_t t1, int64_t p0, int64_t p1) const {
    thread_local std::vector<float> scratch, zeros;
    const int64_t ldv = block * cin + 16, ldm = block * cout + 16;
    if (static_cast<int64_t>(scratch.size()) < kP * (ldv + ldm)) scratch.resize(kP * (ldv + ldm));
    if (static_cast<int64_t>(zeros.size()) < cin) zeros.resize(cin);
    float *v = scratch.data(), *mm = v + kP * ldv;
    const int64_t panels = (cout + kNR - 1) / kNR;
    for (int64_t b0 = t0; b0 < t1; b0 += block) {
      const int64_t count = std::min(block, t1 - b0);
      transform_input(b0, count, v, ldv, zeros.data());
      const int64_t row_tiles = (count + kMR - 1) / kMR;
      for (int64_t xi = 0; xi < kP; ++xi) {
        const float* vx = v + xi * ldv;
        float* mx = mm + xi * ldm;
        auto tile = [&](int64_t j, int64_t p, Prefetch pf) {
          const int64_t r = j * kMR, rows = std::min(kMR, count - r);
          const int64_t ncols = std::min(kNR, cout - p * kNR);
          (ncols > 16 ? kTiles2 : kTiles1)[rows - 1](
              vx + r * cin, cin, u + (xi * panels + p) * cin * kNR, cin, mx + r * cout + p * kNR,
              cout, ncols, nullptr, nullptr, 0, Act::kNone, pf, false, true);
        };
        if (!streamed) {  // U stays in L2: each row tile of V once, by every panel
          for (int64_t j = 0; j < row_tiles; ++j)
            for (int64_t p = p0; p < p1; ++p) tile(j, p, Prefetch{});
          continue;
        }
        // U streams from memory (once per block: a small image's tiles are one block):
        // panel by panel, the next one (the next position's first) prefetched over the row
        // tiles, as the GEMM's panels
        for (int64_t p = p0; p < p1; ++p) {
          const float* next = p + 1 < p1    ? u + (xi * panels + p + 1) * cin * kNR
                              : xi + 1 < kP ? u + ((xi + 1) * panels + p0) * cin * kNR
                                            : nullptr;
          for (int64_t j = 0; j < row_tiles; ++j)
            tile(j, p, Prefetch::share(next, cin * kNR, j, row_tiles));
        }
      }
      transform_output(b0, count, mm, ldm, p0 * kNR, std::min(cout, p1 * kNR));
    }
  }

  void operator()(int64_t threads) const {
    const int64_t tiles = n * th * tw;
    // (as `split_rows`: below ~64 KB of output a parallel region costs more than it saves)
    if (!(tiles >= threads && n * oh * ow * cout * 4 >= (int64_t{64} << 10))) threads = 1;
    const int64_t panels = (cout + kNR - 1) / kNR;
    parallel(threads, [&](int64_t t, int64_t nt) {
      // a streamed U ten times the size of the transformed input is split by panels (each
      // thread reads its share of U and transforms all of the input: 7x7 512 -> 512 ran 1.5x
      // slower with each thread reading all 17 MB); otherwise the tiles are split (a 14x14
      // 256 -> 256 convolution by panels ran 1.25x slower)
      if (streamed && panels >= nt && cout > 10 * tiles)
        range(0, tiles, panels * t / nt, panels * (t + 1) / nt);
      else
        range(tiles * t / nt, tiles * (t + 1) / nt, 0, panels);
    });
  }
};

// the weight transformed and packed as GEMM operands of cin x cout in the GEMM's panels,
// [position][panel][cin][NR], zero-padded: D = 2, (cout, r, r, cin) by G g G^T per output and
// input channel; D = 1, (cout, r, 1, cin) or (cout, 1, r, cin) by G g
// the bytes `pack_winograd` makes, known before it runs; NR: the panels' width (the AVX2
// forms' are 16: winograd_avx2.h)
template <typename F, int D, int64_t NR = kNR>
int64_t winograd_packed_bytes(int64_t cout, int64_t cin) {
  constexpr int64_t kP = D == 2 ? F::a * F::a : F::a;
  return kP * ((cout + NR - 1) / NR) * cin * NR * 4;
}

template <typename F, int D, int64_t NR = kNR>
View pack_winograd(const View& w, int64_t cout, int64_t cin) {
  constexpr int kA = F::a, kR = F::r, kP = D == 2 ? kA * kA : kA;
  const int64_t panels = (cout + NR - 1) / NR;
  View packed = View::zeros({winograd_packed_bytes<F, D, NR>(cout, cin) / 4});
  const View wc = w.contiguous();
  const float* src = wc.data_ptr<float>();
  float* dst = packed.data_ptr<float>();
  auto put = [&](int64_t xi, int64_t o, int64_t i, double value) {
    dst[((xi * panels + o / NR) * cin + i) * NR + o % NR] = static_cast<float>(value);
  };
  for (int64_t o = 0; o < cout; ++o)
    for (int64_t i = 0; i < cin; ++i) {
      if constexpr (D == 1) {
        for (int xi = 0; xi < kA; ++xi) {
          double value = 0;
          for (int k = 0; k < kR; ++k) value += F::G[xi][k] * src[(o * kR + k) * cin + i];
          put(xi, o, i, value);
        }
        continue;
      }
      double g[kR][kR], gg[kA][kR];
      for (int r = 0; r < kR; ++r)
        for (int q = 0; q < kR; ++q) g[r][q] = src[((o * kR + r) * kR + q) * cin + i];
      for (int xi = 0; xi < kA; ++xi)
        for (int q = 0; q < kR; ++q) {
          gg[xi][q] = 0;
          for (int r = 0; r < kR; ++r) gg[xi][q] += F::G[xi][r] * g[r][q];
        }
      for (int xi = 0; xi < kA; ++xi)
        for (int yj = 0; yj < kA; ++yj) {
          double value = 0;
          for (int q = 0; q < kR; ++q) value += gg[xi][q] * F::G[yj][q];
          put(xi * kA + yj, o, i, value);
        }
    }
  return packed;
}

// tiles per block: the block's transformed inputs and products (a * a * 4 bytes per tile and
// channel) within kWinogradBlock bytes, a whole number of GEMM row tiles
constexpr int64_t kWinogradBlock = 384 << 10;
// a transformed weight over this size is streamed (see `Winograd::range`), in blocks of up to
// this size, or of the smaller size in a form of its own
constexpr int64_t kWinogradStreamed = 1 << 20, kWinogradStreamedBlock = 3 << 20,
                  kWinogradSmallBlock = 1 << 20;

// the Winograd form of a stride-1 undilated convolution where the CPU, the tensors and the
// kernel's shape allow it (see `Winograd`: D = 2, r x r and F(m x m, r x r); D = 1, 1 x r or r x 1
// and F(m, r)), else None; pads: top, left, bottom, right. With ``small_blocks``, the form
// whose streamed weight is read once per kWinogradSmallBlock of tiles (None where the weight
// is not streamed or the blocks would be the same): a block's transformed input and products
// then stay in L2 beside the weight's panels, at the cost of reading the weight more often
// (Inception-v3 1.4-1.8% faster with only these blocks, ResNet-50 0.7-2% slower: so a form
// of its own, chosen by timing)
template <typename F, int D>
std::optional<Form> own_winograd(const View& out_buffer, const View& x_buffer,
                                 const View& w_buffer, std::optional<View> bias,
                                 std::optional<View> res_buffer,
                                 std::array<int64_t, 4> pads, Act act, int64_t threads,
                                 bool small_blocks = false) {
  constexpr int64_t kM = F::m, kR = F::r;
  const int64_t cin = x_buffer.size(3), cout = out_buffer.size(3);
  const int64_t oh = out_buffer.size(1), ow = out_buffer.size(2);
  if (w_buffer.dim() != 4) return std::nullopt;
  const int64_t kh = w_buffer.size(1), kw = w_buffer.size(2);
  const bool down = D == 1 && kh == kR && kw == 1;  // r x 1: tiles along a column
  if (!(D == 2 ? kh == kR && kw == kR : down || (kh == 1 && kw == kR)) ||
      !own_avx512() || !plain_float(x_buffer) || !plain_float(out_buffer) ||
      w_buffer.scalar_type() != kFloat || w_buffer.size(0) != cout ||
      w_buffer.size(3) != cin || out_buffer.size(0) != x_buffer.size(0) ||
      (bias && !plain_float(*bias)) || (res_buffer && !plain_float(*res_buffer)) ||
      out_buffer.numel() == 0 || cin == 0 || oh != x_buffer.size(1) + pads[0] + pads[2] - kh + 1 ||
      ow != x_buffer.size(2) + pads[1] + pads[3] - kw + 1)
    return std::nullopt;
  auto packed = lazy_packed(w_buffer, F::name + std::string(D == 1 ? "/1d" : ""),
                            [w_buffer, cout, cin]() { return pack_winograd<F, D>(w_buffer, cout, cin); });
  const bool across = D == 2 || !down, along = D == 2 || down;  // tiled across, down
  const int64_t th = along ? (oh + kM - 1) / kM : oh, tw = across ? (ow + kM - 1) / kM : ow;
  // U larger than L2 is read once per block, so blocks are as large as L2 allows (all the
  // tiles of a small image: the threads then split U)
  const bool streamed = winograd_packed_bytes<F, D>(cout, cin) > kWinogradStreamed;
  const int64_t per_tile = Winograd<F, D>::kP * 4 * (cin + cout);
  auto block_of = [&](int64_t bytes) { return std::max(kMR, bytes / per_tile / kMR * kMR); };
  int64_t block = block_of(streamed ? kWinogradStreamedBlock : kWinogradBlock);
  if (small_blocks) {
    const int64_t tiles = x_buffer.size(0) * th * tw, small = block_of(kWinogradSmallBlock);
    if (!streamed || (tiles + small - 1) / small == (tiles + block - 1) / block)
      return std::nullopt;
    block = small;
  }
  Winograd<F, D> conv{x_buffer.data_ptr<float>(), nullptr,
                      bias ? bias->data_ptr<float>() : nullptr,
                      res_buffer ? res_buffer->data_ptr<float>() : nullptr,
                      out_buffer.data_ptr<float>(), x_buffer.size(0), x_buffer.size(1),
                      x_buffer.size(2), pads[0], pads[1], cin, oh, ow, cout, th, tw, block,
                      act, streamed, down};
  return Form([conv, packed, x_buffer, out_buffer, bias, res_buffer, threads]() mutable {
    conv.u = packed->data();
    conv(threads);
  });
}
#endif

#pragma GCC pop_options

}  // namespace
