// The own products beside the packed GEMM: one row by a constant matrix, the weight streamed front
// to back (`own_gemv`, a classifier's), and batched products of two small activations without
// packing (`own_bmm`, attention's scores and context).
//
// Included only by kernels.cc, the kernels' translation unit: its definitions lie in
// kernels.cc's anonymous namespace, after those of the headers it includes.
#pragma once

#include "common.h"
#include "activations.h"
#include "threads.h"
#include "forms.h"

namespace {

#ifdef PARAGRAPH_AVX512
// acc[0, n) += a[k0, k1) @ w[k0:k1, 0:n) (w row-major, n wide): w read once, front to back,
// four rows per pass over acc (which stays in L1), so that the weight streams from memory in
// the order the hardware prefetchers follow best
__attribute__((target("avx512f"))) void gemv_share(const float* a, const float* w, int64_t n,
                                                   int64_t k0, int64_t k1, float* acc) {
  const int64_t whole = n / 16 * 16;
  const __mmask16 tail = tail_mask(n - whole);
  int64_t k = k0;
  for (; k + 4 <= k1; k += 4) {
    const __m512 a0 = _mm512_set1_ps(a[k]), a1 = _mm512_set1_ps(a[k + 1]);
    const __m512 a2 = _mm512_set1_ps(a[k + 2]), a3 = _mm512_set1_ps(a[k + 3]);
    const float* w0 = w + k * n;
    const float *w1 = w0 + n, *w2 = w1 + n, *w3 = w2 + n;
    for (int64_t j = 0; j < whole; j += 16) {
      __m512 s = _mm512_loadu_ps(acc + j);
      s = _mm512_fmadd_ps(a0, _mm512_loadu_ps(w0 + j), s);
      s = _mm512_fmadd_ps(a1, _mm512_loadu_ps(w1 + j), s);
      s = _mm512_fmadd_ps(a2, _mm512_loadu_ps(w2 + j), s);
      s = _mm512_fmadd_ps(a3, _mm512_loadu_ps(w3 + j), s);
      _mm512_storeu_ps(acc + j, s);
    }
    if (tail) {
      __m512 s = _mm512_maskz_loadu_ps(tail, acc + whole);
      s = _mm512_fmadd_ps(a0, _mm512_maskz_loadu_ps(tail, w0 + whole), s);
      s = _mm512_fmadd_ps(a1, _mm512_maskz_loadu_ps(tail, w1 + whole), s);
      s = _mm512_fmadd_ps(a2, _mm512_maskz_loadu_ps(tail, w2 + whole), s);
      s = _mm512_fmadd_ps(a3, _mm512_maskz_loadu_ps(tail, w3 + whole), s);
      _mm512_mask_storeu_ps(acc + whole, tail, s);
    }
  }
  for (; k < k1; ++k) {
    const __m512 ak = _mm512_set1_ps(a[k]);
    const float* wk = w + k * n;
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 m = tail_mask(n - j);
      _mm512_mask_storeu_ps(acc + j, m, _mm512_fmadd_ps(ak, _mm512_maskz_loadu_ps(m, wk + j),
                                                        _mm512_maskz_loadu_ps(m, acc + j)));
    }
  }
}

// o = act(o + each of the parts (n floats each, one after another))
__attribute__((target("avx512f"))) void gemv_finish(float* o, const float* parts, int64_t count,
                                                    int64_t n, Act act) {
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = tail_mask(n - j);
    __m512 v = _mm512_maskz_loadu_ps(m, o + j);
    for (int64_t t = 0; t < count; ++t)
      v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, parts + t * n + j));
    _mm512_mask_storeu_ps(o + j, m, apply_linear_act(v, act));
  }
  if (!in_registers(act)) act_rows(o, 1, 0, n, act);  // (see `in_registers`)
}

// the own one-row product out = act(a @ w + bias) for a (1, K) row and a contiguous (K, N)
// weight (a classifier's): the weight, cold in a model (Inception-v3's 8 MB), streamed front to
// back (`gemv_share`) rather than in the GEMM's panels; on two threads each streams its half of
// the rows of w into its own sums, added at the end
std::optional<Form> own_gemv(const View& out2, const View& rows, const View& w,
                             const std::optional<View>& bias, Act act, int64_t threads) {
  if (!own_avx512() || rows.size(0) != 1 || !plain_float(w) ||
      !rows.is_contiguous() || rows.scalar_type() != kFloat || !plain_float(out2) ||
      (bias && !plain_float(*bias)))
    return std::nullopt;
  const int64_t k = w.size(0), n = w.size(1);
  auto scratch = std::make_shared<std::vector<float>>(n * std::max<int64_t>(threads - 1, 0));
  return Form([out2, rows, w, bias, act, threads, k, n, scratch]() {
    const float* a = rows.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    float* o = out2.data_ptr<float>();
    const float* b = bias ? bias->data_ptr<float>() : nullptr;
    const int64_t team = k >= 64 * threads ? threads : 1;
    int64_t used = 1;  // the threads OpenMP gave: their sums are added
    parallel(team, [&](int64_t t, int64_t nt) {
      if (t == 0) used = nt;
      float* acc = t == 0 ? o : scratch->data() + (t - 1) * n;
      if (t == 0 && b)
        std::memcpy(acc, b, n * sizeof(float));
      else
        std::memset(acc, 0, n * sizeof(float));
      // shares of whole groups of four rows
      const int64_t groups = (k + 3) / 4;
      gemv_share(a, wp, n, std::min(k, groups * t / nt * 4), std::min(k, groups * (t + 1) / nt * 4),
                 acc);
    });
    gemv_finish(o, scratch->data(), used - 1, n, act);
  });
}
#endif

#ifdef PARAGRAPH_AVX512
// R rows x 32 columns (j, masks m0 and m1) of one product C = act(A @ B) of row-major float32
// matrices, all of K accumulated in 2R registers: a broadcast of A's element and two loads of
// B's row per step, no packing (B's rows are read where they lie)
template <int R>
__attribute__((target("avx512f"))) void bmm_tile(const float* a, const float* b, float* c,
                                                 int64_t k_len, int64_t n, int64_t j,
                                                 __mmask16 m0, __mmask16 m1, Act act) {
  __m512 acc[R][2];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < k_len; ++k) {
    const __m512 b0 = _mm512_maskz_loadu_ps(m0, b + k * n + j);
    const __m512 b1 = _mm512_maskz_loadu_ps(m1, b + k * n + j + 16);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * k_len + k]);
      acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(c + r * n + j, m0, apply_linear_act(acc[r][0], act));
    _mm512_mask_storeu_ps(c + r * n + j + 16, m1, apply_linear_act(acc[r][1], act));
  }
  if (!in_registers(act)) act_rows(c + j, R, n, std::min<int64_t>(32, n - j), act);
}

// ``rows`` rows (at most 12; a, c at the first) of one product, all columns, by the widest
// tiles that fit
__attribute__((target("avx512f"))) void bmm_rows(const float* a, const float* b, float* c,
                                                 int64_t rows, int64_t k_len, int64_t n, Act act) {
  for (int64_t j = 0; j < n; j += 32) {
    const __mmask16 m0 = tail_mask(n - j), m1 = n - j > 16 ? tail_mask(n - j - 16) : 0;
    int64_t i = 0;
    for (; i + 12 <= rows; i += 12)
      bmm_tile<12>(a + i * k_len, b, c + i * n, k_len, n, j, m0, m1, act);
    for (; i + 4 <= rows; i += 4)
      bmm_tile<4>(a + i * k_len, b, c + i * n, k_len, n, j, m0, m1, act);
    for (; i < rows; ++i) bmm_tile<1>(a + i * k_len, b, c + i * n, k_len, n, j, m0, m1, act);
  }
}
#endif

// paragraph's own batched product of small matrices (attention's scores and context): MKL's
// batched GEMM took 24 us for four heads of 64 x 64 x 64 (a small encoder's, one thread),
// ONNX Runtime 12-13; here each 12-row block of each product is one task, the tasks split
// over the threads, the activation applied as each tile is stored. None where a tensor is not
// contiguous float32 or the CPU lacks AVX-512.
std::optional<Form> own_bmm(View o3, View a3, View b3, Act act,
                            int64_t threads) {
#ifdef PARAGRAPH_AVX512
  if (!own_avx512() || !plain_float(o3) || !plain_float(a3) ||
      !plain_float(b3) || o3.numel() == 0 || a3.size(2) == 0)
    return std::nullopt;
  return Form([o3, a3, b3, act, threads]() {
    const int64_t batch = a3.size(0), m = a3.size(1), k_len = a3.size(2), n = b3.size(2);
    const int64_t blocks = (m + 11) / 12, tasks = batch * blocks;
    const float *a = a3.data_ptr<float>(), *b = b3.data_ptr<float>();
    float* c = o3.data_ptr<float>();
    // below 2^18 multiply-adds (a few microseconds) the calling thread alone
    const int64_t nt = batch * m * n * k_len >= (int64_t{1} << 18) ? threads : 1;
    parallel(nt, [&](int64_t t, int64_t count) {
      for (int64_t task = tasks * t / count; task < tasks * (t + 1) / count; ++task) {
        const int64_t q = task / blocks, i = task % blocks * 12;
        bmm_rows(a + (q * m + i) * k_len, b + q * k_len * n, c + (q * m + i) * n,
                 std::min<int64_t>(12, m - i), k_len, n, act);
      }
    });
  });
#else
  return std::nullopt;
#endif
}

}  // namespace
