// Whether a View holds a NaN or an infinity (`any_nonfinite`): the own Winograd forms fall back
// on an exact form where one would spread (conv.h's `finite_only`), and oneDNN's relu is fused
// only where none can arise (aten_forms.cc). Included by both translation units.
#pragma once

#include "view.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

// whether any of n floats (as bits) is NaN or infinite, its exponent field all ones: four
// vectors a step with AVX2, else one at a time (on a Zen 3, 0.8 MB already in cache: 15 us
// against the scalar loop's 126, which cost ResNet-50 5% end to end before it)
#if defined(__x86_64__)
// the lanes of the 8 floats at u whose exponent field is all ones
__attribute__((target("avx2"), always_inline)) inline __m256i nonfinite_lanes(const uint32_t* u) {
  const __m256i e = _mm256_set1_epi32(0x7f800000);
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u));
  return _mm256_cmpeq_epi32(_mm256_and_si256(v, e), e);
}

__attribute__((target("avx2"))) bool nonfinite_avx2(const uint32_t* u, int64_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_or_si256(a0, nonfinite_lanes(u + i));
    a1 = _mm256_or_si256(a1, nonfinite_lanes(u + i + 8));
    a2 = _mm256_or_si256(a2, nonfinite_lanes(u + i + 16));
    a3 = _mm256_or_si256(a3, nonfinite_lanes(u + i + 24));
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_or_si256(a0, nonfinite_lanes(u + i));
  const __m256i all = _mm256_or_si256(_mm256_or_si256(a0, a1), _mm256_or_si256(a2, a3));
  bool bad = !_mm256_testz_si256(all, all);
  for (; i < n; ++i) bad |= (u[i] & 0x7f800000u) == 0x7f800000u;
  return bad;
}
#endif

bool nonfinite_bits(const uint32_t* u, int64_t n) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return nonfinite_avx2(u, n);
#endif
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) bad |= (u[i] & 0x7f800000u) == 0x7f800000u;
  return bad;
}

// whether the element at p (of dtype d) is NaN or infinite: its exponent field all ones (an
// integer or bool never is)
bool nonfinite_element(const char* p, DType d) {
  switch (d) {
    case DType::kFloat: {
      uint32_t u;
      std::memcpy(&u, p, 4);
      return (u & 0x7f800000u) == 0x7f800000u;
    }
    case DType::kDouble: {
      uint64_t u;
      std::memcpy(&u, p, 8);
      return (u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
    }
    case DType::kHalf:
    case DType::kBFloat16: {
      uint16_t u;
      std::memcpy(&u, p, 2);
      const uint16_t e = d == DType::kHalf ? 0x7c00 : 0x7f80;
      return (u & e) == e;
    }
    default:
      return false;
  }
}

// whether any of t's values is NaN or infinite: one pass over a float32 tensor whose elements
// lie in one dense block, shared by the calling thread's OpenMP team where it is large
// (256 KB and more); element by element, by index, for any other tensor
bool any_nonfinite(const View& t) {
  if (t.scalar_type() != kFloat || !t.device().is_cpu() || !t.is_non_overlapping_and_dense()) {
    const int64_t n = t.numel(), d = t.dim(), es = t.element_size();
    std::vector<int64_t> index(d, 0);
    for (int64_t e = 0; e < n; ++e) {
      int64_t at = 0;
      for (int64_t i = 0; i < d; ++i) at += index[i] * t.stride(i);
      if (nonfinite_element(static_cast<const char*>(t.data_ptr()) + at * es, t.scalar_type()))
        return true;
      for (int64_t i = d - 1; i >= 0 && ++index[i] == t.size(i); --i) index[i] = 0;
    }
    return false;
  }
  const int64_t n = t.numel();
  const uint32_t* u = static_cast<const uint32_t*>(t.data_ptr());
#ifdef _OPENMP
  if (n >= (1 << 16) && omp_get_max_threads() > 1) {
    const int64_t parts = omp_get_max_threads(), step = (n + parts - 1) / parts;
    int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static)
    for (int64_t p = 0; p < parts; ++p)
      bad |= nonfinite_bits(u + p * step, std::max<int64_t>(0, std::min(step, n - p * step)));
    return bad != 0;
  }
#endif
  return nonfinite_bits(u, n);
}

}  // namespace
