// Products by a constant matrix: MKL's in place (`gemm`, the ATen library's), and paragraph's
// own AVX-512 GEMM: the weight packed once into 32-column panels (`pack_panels`), register tiles
// of up to 12 x 32 with the epilogue fused and the next operands prefetched (`gemm_tile`,
// `kTiles1`, `kTiles2`), and the threads' split of rows or panels (`PackedGemm`,
// `packed_gemm`). The tiles' parts (`Prefetch`, `store_tile`, `prefetch_epilogue`,
// `accumulate`) are also the convolutions' (conv.h; winograd.h runs `kTiles1`, `kTiles2`).
//
// Included only by kernels.cc, the kernels' translation unit: its definitions lie in
// kernels.cc's anonymous namespace, after those of the headers it includes.
#pragma once

#include "common.h"
#include "activations.h"
#include "threads.h"
#include "packing.h"
#include "forms.h"
#include "aten.h"

namespace {

// rows @ weight (+ bias) into out2, then the residual and the activation, in place (MKL's, the
// ATen library's, made on the form's first call); where out2 is the residual's own buffer, the
// product is added to it (GEMM's beta = 1)
Form gemm(View out2, View rows, View weight, std::optional<View> bias,
          std::optional<View> res2, Act act, int64_t threads) {
  return deferred([=](const AtenForms& aten) {
    return aten.gemm(out2, rows, weight, bias, res2, act, threads);
  });
}

#ifdef PARAGRAPH_AVX512
// paragraph's own GEMM for a product by a constant matrix (an NHWC 1x1 convolution, a linear
// layer): out = act(a @ W + bias + res), the epilogue applied to each 12 x 32 tile while it is
// in registers. MKL's SGEMM (which packs W on every call) ran ResNet-50's and NASNet's 1x1
// convolutions 7-30% slower than ONNX Runtime's on one thread and scaled worse on two (MKL
// 1.7-1.9x, this 1.9-2.0x); its epilogue was one or two more passes over the output. W is packed
// once into panels of 32 columns ([panel][k][32], zero-padded); a 12-row tile accumulates
// over all of K in 24 registers. Threads split the panels where W is the larger operand, else
// the rows (each thread reads all of the other operand: ResNet-50's 56x56 256 -> 64 1x1
// convolution split by panels read its 3 MB input twice and ran no faster on two threads than
// on one); with W small enough to stay in L2 the tiles go row block by row block (each block
// of a read once), else panel by panel (each panel read once, the next one prefetched).
constexpr int64_t kNR = 32, kMR = 12, kKC = 1024;
// packed weights up to this size stay in L2 across row blocks: the tiles go row block by row
// block (each block of the input read once), larger ones panel by panel
constexpr int64_t kWeightInL2 = 256 << 10;

// element (n, k) of W at w[n * sn + k * sk], packed as above in panels of ``nr`` columns (the
// AVX2 GEMM's are 16 wide: avx2.h)
View pack_panels(const View& w, int64_t n, int64_t k, int64_t sn, int64_t sk,
                       int64_t nr = kNR) {
  const int64_t panels = (n + nr - 1) / nr;
  View packed = View::zeros({panels * k * nr});
  const float* src = w.data_ptr<float>();
  float* dst = packed.data_ptr<float>();
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < k; ++i) dst[((j / nr) * k + i) * nr + j % nr] = src[j * sn + i * sk];
  return packed;
}

// the tensors a packed GEMM form reads and writes as the own forms take them (this one and
// avx2.h's): contiguous float32 rows, output, bias and residual, a float32 weight, some rows
bool gemm_tensors_ok(const View& out2, const View& rows, const View& w,
                     const std::optional<View>& bias,
                     const std::optional<View>& res2) {
  return plain_float(rows) && plain_float(out2) && w.scalar_type() == kFloat &&
         (!bias || plain_float(*bias)) && (!res2 || plain_float(*res2)) && rows.size(0) > 0 &&
         rows.size(1) > 0;
}

// a share of the next panel to bring into L2 while a tile works on this one (panel by panel, W
// streams from memory: BERT's 16 MB products spent ~10% more than ONNX Runtime's waiting for
// it); each tile of a panel takes an even share, a line at a time as its K advances
struct Prefetch {
  const char* at = nullptr;
  int64_t lines = 0, credit = 0;

  // `steps` more of the tile's `total` steps are done: prefetch the lines that fall due
  // (`lines` spread evenly over the steps, without a division per step: it cost the own GEMM
  // ~10%)
  inline void step(int64_t total, int64_t steps) {
    for (credit += lines * steps; credit >= total; credit -= total, at += 64)
      _mm_prefetch(at, _MM_HINT_T1);
  }

  // all of the `floats` at `at` over one tile's steps
  static Prefetch whole(const float* at, int64_t floats) { return share(at, floats, 0, 1); }

  // tile `j` of `tiles` over a panel of `floats`, the next panel at `next` (none: null)
  static Prefetch share(const float* next, int64_t floats, int64_t j, int64_t tiles) {
    if (next == nullptr) return {};
    const int64_t lines = floats * 4 / 64, from = lines * j / tiles, to = lines * (j + 1) / tiles;
    return {reinterpret_cast<const char*>(next) + from * 64, to - from, 0};
  }
};

// the epilogue of a tile: bias, residual (read before the store: res may be c itself, a
// residual written in place), a piecewise-linear activation, masked stores; then any other
// activation over the rows stored (see `in_registers`). Always inlined: the accumulators stay
// in registers
template <int MR, int NV>
__attribute__((target("avx512f"), always_inline)) inline void store_tile(
    const __m512* acc0, const __m512* acc1, float* c, int64_t ldc, int64_t ncols,
    const float* bias, const float* res, int64_t ldr, Act act) {
  const __mmask16 m0 = tail_mask(ncols), m1 = tail_mask(std::max<int64_t>(ncols - 16, 0));
  const __m512 bias0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
  const __m512 bias1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
  for (int r = 0; r < MR; ++r) {
    __m512 v0 = _mm512_add_ps(acc0[r], bias0), v1 = _mm512_add_ps(acc1[r], bias1);
    if (res) {
      v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, res + r * ldr));
      v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, res + r * ldr + 16));
    }
    _mm512_mask_storeu_ps(c + r * ldc, m0, apply_linear_act(v0, act));
    if (NV == 2) _mm512_mask_storeu_ps(c + r * ldc + 16, m1, apply_linear_act(v1, act));
  }
  if (!in_registers(act)) act_rows(c, MR, ldc, std::min<int64_t>(ncols, NV * 16), act);
}

// the lines a tile's epilogue will write (and the residual's it will read), requested before
// its K loop, which hides their latency: from L3 (the model's 3 MB outputs) the epilogue waited
// on them at every tile, ~90 ns of a 56x56 64 -> 256 1x1 convolution's ~320 ns tiles, ~40 ns
// even from L2 (1x1 convolutions 3-10% faster alone, ResNet-50 2-3.6% in one process)
template <int MR, int NV>
__attribute__((always_inline)) inline void prefetch_epilogue(const float* c, int64_t ldc,
                                                             const float* res, int64_t ldr) {
  for (int r = 0; r < MR; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    if (NV == 2) _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16), _MM_HINT_T0);
    if (res && res != c) {  // in place, the residual's lines are the output's
      _mm_prefetch(reinterpret_cast<const char*>(res + r * ldr), _MM_HINT_T0);
      if (NV == 2) _mm_prefetch(reinterpret_cast<const char*>(res + r * ldr + 16), _MM_HINT_T0);
    }
  }
}

constexpr int kUnroll = 4;

// one K step of a tile: row r's value at[r][i] by the panel's row b
template <int MR, int NV>
__attribute__((target("avx512f,fma"), always_inline)) inline void fma_step(
    const float* const* at, int64_t i, const float* b, __m512* acc0, __m512* acc1) {
  const __m512 b0 = _mm512_loadu_ps(b);
  const __m512 b1 = NV == 2 ? _mm512_loadu_ps(b + 16) : b0;
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) {
    const __m512 av = _mm512_set1_ps(at[r][i]);
    acc0[r] = _mm512_fmadd_ps(av, b0, acc0[r]);
    if (NV == 2) acc1[r] = _mm512_fmadd_ps(av, b1, acc1[r]);
  }
}

// kc K steps of a tile (row r's values from at[r], the panel's rows from b), four at a time
// and then the rest one by one, the prefetch advanced once per four over the tile's `total`
// steps: the loop's own instructions took issue slots from the FMAs (4-7% of ResNet-50 and
// Inception-v3); a prefetch per step, not per convolution tap (a tap's share at once stalled
// the tile)
template <int MR, int NV>
__attribute__((target("avx512f,fma"), always_inline)) inline void accumulate(
    const float* const* at, int64_t kc, const float* b, Prefetch& pf, int64_t total,
    __m512* acc0, __m512* acc1) {
  int64_t i = 0;
  for (; i + kUnroll <= kc; i += kUnroll) {
    pf.step(total, kUnroll);
#pragma GCC unroll 4
    for (int u = 0; u < kUnroll; ++u) fma_step<MR, NV>(at, i + u, b + (i + u) * kNR, acc0, acc1);
  }
  for (; i < kc; ++i) {
    pf.step(total, 1);
    fma_step<MR, NV>(at, i, b + i * kNR, acc0, acc1);
  }
}

// one tile: MR rows of a (stride lda) by a panel of NV x 16 columns (ncols of them real), over
// k of K; a later share of K adds to what c holds (``more``), and only the last (``last``)
// applies the epilogue
template <int MR, int NV>
__attribute__((target("avx512f,fma"))) void gemm_tile(
    const float* __restrict__ a, int64_t lda, const float* __restrict__ b, int64_t k, float* c,
    int64_t ldc, int64_t ncols, const float* bias, const float* res, int64_t ldr, Act act,
    Prefetch pf, bool more, bool last) {
  __m512 acc0[MR], acc1[MR];
  const __mmask16 m0 = tail_mask(ncols), m1 = tail_mask(std::max<int64_t>(ncols - 16, 0));
  for (int r = 0; r < MR; ++r) {
    acc0[r] = more ? _mm512_maskz_loadu_ps(m0, c + r * ldc) : _mm512_setzero_ps();
    acc1[r] = more && NV == 2 ? _mm512_maskz_loadu_ps(m1, c + r * ldc + 16) : _mm512_setzero_ps();
  }
  const float* at[MR];
  for (int r = 0; r < MR; ++r) at[r] = a + r * lda;
  if (last) prefetch_epilogue<MR, NV>(c, ldc, res, ldr);
  accumulate<MR, NV>(at, k, b, pf, k, acc0, acc1);
  if (last) return store_tile<MR, NV>(acc0, acc1, c, ldc, ncols, bias, res, ldr, act);
  for (int r = 0; r < MR; ++r) {
    _mm512_mask_storeu_ps(c + r * ldc, m0, acc0[r]);
    if (NV == 2) _mm512_mask_storeu_ps(c + r * ldc + 16, m1, acc1[r]);
  }
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t,
                        const float*, const float*, int64_t, Act, Prefetch, bool, bool);
template <int NV, int... R>
constexpr std::array<TileFn, sizeof...(R)> tiles(std::integer_sequence<int, R...>) {
  return {&gemm_tile<R + 1, NV>...};
}
const auto kTiles1 = tiles<1>(std::make_integer_sequence<int, kMR>{});  // by rows - 1
const auto kTiles2 = tiles<2>(std::make_integer_sequence<int, kMR>{});

struct PackedGemm {
  const float *a, *packed, *bias, *res;
  float* c;
  int64_t m, k, n;
  Act act;

  // rows [m0, m1) by panels [p0, p1)
  void range(int64_t m0, int64_t m1, int64_t p0, int64_t p1) const {
    // rows [r, r + 12) by panel p over K's [k0, k0 + kc)
    auto tile = [&](int64_t p, int64_t r, int64_t k0, int64_t kc, Prefetch pf) {
      const int64_t n0 = p * kNR, ncols = std::min(kNR, n - n0), rows = std::min(kMR, m1 - r);
      (ncols > 16 ? kTiles2 : kTiles1)[rows - 1](
          a + r * k + k0, k, packed + (p * k + k0) * kNR, kc, c + r * n + n0, n, ncols,
          bias ? bias + n0 : nullptr, res ? res + r * n + n0 : nullptr, n, act, pf, k0 > 0,
          k0 + kc == k);
    };
    if (k * n * 4 <= kWeightInL2) {
      // W stays in L2; the next row block of a is brought in while this one works, a share
      // per panel (a 35x35 288->64 1x1 convolution ran 545 us with its input from memory,
      // 305 with it in cache)
      for (int64_t r = m0; r < m1; r += kMR) {
        const int64_t next = std::min(kMR, m1 - r - kMR);
        // the first row block brings in W: each tile the next panel (cold in a model, where
        // ~100 MB of weights pass between two calls), its last tile the next rows; later
        // blocks' tiles each a share of the next rows
        const float* rows = next > 0 ? a + (r + kMR) * k : nullptr;
        for (int64_t p = p0; p < p1; ++p) {
          Prefetch pf = r > m0      ? Prefetch::share(rows, next * k, p - p0, p1 - p0)
                        : p + 1 < p1 ? Prefetch::whole(packed + (p + 1) * k * kNR, k * kNR)
                                     : Prefetch::whole(rows, next * k);
          tile(p, r, 0, k, pf);
        }
      }
      return;
    }
    // panel by panel, each panel's share of K (kKC rows, 128 KB) at a time over every row
    // block, the next share prefetched; the rows' share of a stays in L2 across the panels
    // (with all of K at once, BERT's 64 x 4096 rows, a 512 KB panel and the next one filled
    // the 2 MB L2)
    const int64_t tiles = (m1 - m0 + kMR - 1) / kMR;
    const int64_t share = res == c ? k : kKC;  // c would hold partial sums over its residual
    for (int64_t k0 = 0; k0 < k; k0 += share) {
      const int64_t kc = std::min(share, k - k0);
      for (int64_t p = p0; p < p1; ++p) {
        const float* next = p + 1 < p1           ? packed + ((p + 1) * k + k0) * kNR
                            : k0 + kc < k ? packed + (p0 * k + k0 + kc) * kNR
                                                 : nullptr;
        const int64_t next_kc = p + 1 < p1 ? kc : std::min(share, k - k0 - kc);
        for (int64_t j = 0; j < tiles; ++j)
          tile(p, m0 + j * kMR, k0, kc, Prefetch::share(next, next_kc * kNR, j, tiles));
      }
    }
  }

  void operator()(int64_t threads) const {
    const int64_t panels = (n + kNR - 1) / kNR;
    // each thread reads all of what is not split: split W where it is the larger operand and
    // does not stay in L2, or where the rows are too few to share. Split by rows, each thread
    // reads the rows its core wrote in the kernel before (a model's kernels split rows alike)
    // and writes those the next reads; split by panels, half of each comes from the other
    // core, about 3x slower than from its own (MnasNet's 14 x 14 80 -> 480 and 96 -> 576
    // expansions: 125 -> 110 us in the model)
    const int64_t blocks = (m + kMR - 1) / kMR;
    const bool by_panel = n > m && (k * n * 4 > kWeightInL2 || blocks < threads);
    parallel(threads, [&](int64_t t, int64_t nt) {
      if (by_panel) {
        panel_share(panels, blocks, t, nt, [&](int64_t q0, int64_t q1, int64_t p0, int64_t p1) {
          range(q0 * kMR, std::min(m, q1 * kMR), p0, p1);
        });
      } else {
        range(blocks * t / nt * kMR, std::min(m, blocks * (t + 1) / nt * kMR), 0, panels);
      }
    });
  }
};

// the packed form of out2 = act(rows @ W + bias + res2), W's element (n, k) at
// w[n * sn + k * sk]; None where the CPU or the tensors do not allow it
std::optional<Form> packed_gemm(View out2, View rows, const View& w,
                                int64_t sn, int64_t sk, std::optional<View> bias,
                                std::optional<View> res2, Act act, int64_t threads) {
  const int64_t m = rows.size(0), k = rows.size(1), n = out2.size(1);
  if (!own_avx512() || !gemm_tensors_ok(out2, rows, w, bias, res2)) return std::nullopt;
  auto packed = lazy_packed(w, "panels", [w, n, k, sn, sk]() { return pack_panels(w, n, k, sn, sk); });
  return Form([=]() {
    PackedGemm{rows.data_ptr<float>(), packed->data(),
               bias ? bias->data_ptr<float>() : nullptr, res2 ? res2->data_ptr<float>() : nullptr,
               out2.data_ptr<float>(), m, k, n, act}(threads);
  });
}
#endif

}  // namespace
