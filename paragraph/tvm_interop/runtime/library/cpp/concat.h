// Concatenation of contiguous parts, paragraph's own: each output row its parts' rows one after
// another, copied (through the relu where fused) a vector at a time with AVX-512
// (`concat_rows_avx512`), else by memcpy or `copy_relu` (`own_concat`).
//
// Included only by kernels.cc, the kernels' translation unit: its definitions lie in
// kernels.cc's anonymous namespace, after those of the headers it includes.
#pragma once

#include "common.h"
#include "threads.h"
#include "forms.h"

namespace {

// dst = relu(src) over n floats in one pass; NaN stays NaN, as in torch's relu: the concat's
// copy where the CPU has no AVX-512 (with it, `concat_rows_avx512` copies float parts)
void copy_relu(float* dst, const float* src, int64_t n) {
  for (int64_t j = 0; j < n; ++j) dst[j] = src[j] < 0.f ? 0.f : src[j];
}

#ifdef PARAGRAPH_AVX512
// rows [r0, r1) of a float concat: each part's row (counts[i] floats at parts[i] + r *
// counts[i]) copied in turn (through the relu), a vector at a time inline: NASNet's NHWC joins
// copy rows of 11-176 floats per pixel, where a memcpy or `copy_relu` call per part and pixel
// cost as much as the copy. A part's last few floats are stored as a whole vector where the
// parts after it in the row (``rest`` floats) take the overrun, which they then overwrite: a
// masked store cost more (NASNet's joins: 3-4% of the copy)
__attribute__((target("avx512f"))) void concat_rows_avx512(float* dst,
                                                           const std::vector<const float*>& parts,
                                                           const std::vector<int64_t>& counts,
                                                           int64_t row, bool relu, int64_t r0,
                                                           int64_t r1) {
  const size_t np = parts.size();
  std::vector<int64_t> rest(np, 0);  // floats after part i in a row
  for (size_t i = np - 1; i > 0; --i) rest[i - 1] = rest[i] + counts[i];
  for (int64_t r = r0; r < r1; ++r) {
    float* d = dst + r * row;
    for (size_t i = 0; i < np; ++i) {
      const int64_t n = counts[i];
      const float* src = parts[i] + r * n;
      int64_t j = 0;
      if (relu) {
        for (; j + 16 <= n; j += 16) _mm512_storeu_ps(d + j, relu_keep_nan(_mm512_loadu_ps(src + j)));
      } else {
        for (; j + 16 <= n; j += 16) _mm512_storeu_ps(d + j, _mm512_loadu_ps(src + j));
      }
      if (j < n) {
        const __mmask16 m = tail_mask(n - j);
        __m512 v = _mm512_maskz_loadu_ps(m, src + j);
        if (relu) v = relu_keep_nan(v);
        if (rest[i] >= 16 - (n - j)) {
          _mm512_storeu_ps(d + j, v);
        } else {
          _mm512_mask_storeu_ps(d + j, m, v);
        }
      }
      d += n;
    }
  }
}
#endif

// paragraph's own concat of contiguous parts: each row of the output (its dimensions before
// ``axis``) is its parts' rows one after another, copied with memcpy (or through the relu, in
// the same pass); rows split over the threads. PyTorch's cat_out copied the channel slices of
// NHWC tensors (Inception-v3's eleven joins) 10-30% slower than ONNX Runtime's concat on one
// thread and on two, and its relu was a second pass over the output (NASNet's joins: 2x).
// None where a part is not contiguous or of another dtype (cat_out takes those).
std::optional<Form> own_concat(View out, std::vector<View> parts, int64_t axis,
                               bool relu, int64_t threads) {
  if (!out.is_contiguous() || !out.device().is_cpu() || axis < 0 || axis >= out.dim() ||
      (relu && out.scalar_type() != kFloat))
    return std::nullopt;
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= out.size(d);
  const int64_t esize = out.element_size();
  std::vector<std::pair<const char*, int64_t>> src;  // a part's data and its row in bytes
  int64_t row = 0;
  for (const View& t : parts) {
    if (!t.is_contiguous() || t.scalar_type() != out.scalar_type() || !t.device().is_cpu())
      return std::nullopt;
    const int64_t bytes = outer ? t.numel() / outer * esize : 0;
    src.emplace_back(static_cast<const char*>(t.data_ptr()), bytes);
    row += bytes;
  }
  if (row * outer != out.numel() * esize) return std::nullopt;
  char* dst = static_cast<char*>(out.data_ptr());
  // the tensors held as long as the form: the forms not chosen are dropped (`keep_chosen`),
  // and with them PyTorch's, which had held them; a caller that kept the function but not
  // its buffers had the copies write freed memory
  parts.push_back(out);
  auto held = std::make_shared<const std::vector<View>>(std::move(parts));
#ifdef PARAGRAPH_AVX512
  if (out.scalar_type() == kFloat && own_avx512()) {
    std::vector<const float*> fparts;
    std::vector<int64_t> counts;
    for (const auto& [data, bytes] : src) {
      fparts.push_back(reinterpret_cast<const float*>(data));
      counts.push_back(bytes / 4);
    }
    float* fdst = reinterpret_cast<float*>(dst);
    return Form([=]() {
      (void)held;
      split_rows(outer, row * outer, threads, [&](int64_t r0, int64_t r1) {
        concat_rows_avx512(fdst, fparts, counts, row / 4, relu, r0, r1);
      });
    });
  }
#endif
  return Form([=]() {
    (void)held;
    auto rows = [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        char* d = dst + r * row;
        for (const auto& [data, bytes] : src) {
          if (relu) {
            copy_relu(reinterpret_cast<float*>(d),
                      reinterpret_cast<const float*>(data + r * bytes), bytes / 4);
          } else {
            std::memcpy(d, data + r * bytes, bytes);
          }
          d += bytes;
        }
      }
    };
    split_rows(outer, row * outer, threads, rows);
  });
}

}  // namespace
