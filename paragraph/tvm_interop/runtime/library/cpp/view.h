// The kernels' buffer type (`View`): a data pointer, dtype, sizes and strides in elements, and
// what keeps the memory alive (TVM's tensor, or an allocation of the View's own: packed weights,
// 64-byte aligned). It offers the part of at::Tensor's interface the own forms use (sizes,
// strides, views, a contiguous copy), so that they need no ATen: loading libtorch_cpu cost a
// process that runs a deployed artifact ~105 MiB resident. The ATen forms (aten_forms.cc) wrap
// Views with at::from_blob, without a copy.
//
// Included by both translation units (kernels.cc and aten_forms.cc), built by the same compiler
// with the same flags: a View passes between the two libraries as it is.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// the dtypes of TVM's buffers (DLPack's codes and bits); kOther: any other, which no own form
// takes and the ATen forms refuse
enum class DType : int8_t { kFloat, kDouble, kHalf, kBFloat16, kInt8, kUInt8, kInt16, kInt32,
                            kInt64, kBool, kOther };
constexpr DType kFloat = DType::kFloat;

// bytes per element, and the name a message gives (ATen's, as the checks said before)
constexpr int64_t dtype_bytes(DType d) {
  switch (d) {
    case DType::kDouble:
    case DType::kInt64:
      return 8;
    case DType::kFloat:
    case DType::kInt32:
      return 4;
    case DType::kHalf:
    case DType::kBFloat16:
    case DType::kInt16:
      return 2;
    default:
      return 1;
  }
}

inline const char* dtype_name(DType d) {
  static const char* names[] = {"float", "double", "c10::Half", "c10::BFloat16", "signed char",
                                "unsigned char", "short", "int", "long int", "bool", "other"};
  return names[static_cast<int>(d)];
}

// the (data, sizes, strides) a View takes its device from: the kernels run on CPU buffers only
// (`native.bind` binds no other); a View from another device says so and no form takes it
struct Device {
  bool cpu = true;
  bool is_cpu() const { return cpu; }
};

struct View {
  void* data = nullptr;  // the first element (null: an undefined View)
  DType type = DType::kOther;
  std::vector<int64_t> shape, step;  // sizes and strides, in elements
  std::shared_ptr<void> keep;        // holds the memory alive
  bool cpu = true;

  bool defined() const { return data != nullptr || keep != nullptr; }
  int64_t dim() const { return static_cast<int64_t>(shape.size()); }
  // dimension i, negative from the end (as ATen's)
  int64_t axis(int64_t i) const {
    const int64_t d = i < 0 ? i + dim() : i;
    if (d < 0 || d >= dim())
      throw std::out_of_range("dimension " + std::to_string(i) + " of a " +
                              std::to_string(dim()) + "-dimensional view");
    return d;
  }
  int64_t size(int64_t i) const { return shape[axis(i)]; }
  int64_t stride(int64_t i) const { return step[axis(i)]; }
  const std::vector<int64_t>& sizes() const { return shape; }
  const std::vector<int64_t>& strides() const { return step; }
  int64_t numel() const {
    return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
  }
  DType scalar_type() const { return type; }
  int64_t element_size() const { return dtype_bytes(type); }
  Device device() const { return Device{cpu}; }
  // holders of the memory (for a packed weight: whether anything but its cache holds it)
  long use_count() const { return keep.use_count(); }

  void* data_ptr() const { return data; }
  template <typename T>
  T* data_ptr() const { return static_cast<T*>(data); }

  // row-major strides of ``sizes``
  static std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
    std::vector<int64_t> s(sizes.size());
    int64_t at = 1;
    for (size_t i = sizes.size(); i-- > 0;) {
      s[i] = at;
      at *= std::max<int64_t>(sizes[i], 1);
    }
    return s;
  }

  // as ATen's: dimensions of size 1 may have any stride, an empty view is contiguous
  bool is_contiguous() const {
    if (numel() == 0) return true;
    int64_t at = 1;
    for (size_t i = shape.size(); i-- > 0;) {
      if (shape[i] == 1) continue;
      if (step[i] != at) return false;
      at *= shape[i];
    }
    return true;
  }

  // the elements fill one block without gaps or overlap, in some order of the dimensions
  bool is_non_overlapping_and_dense() const {
    if (is_contiguous()) return true;
    std::vector<size_t> order(shape.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return shape[a] < 2 || (shape[b] >= 2 && step[a] < step[b]);
    });
    int64_t at = 1;
    for (size_t i : order) {
      if (shape[i] == 1) continue;
      if (step[i] != at) return false;
      at *= shape[i];
    }
    return true;
  }

  View permute(const std::vector<int64_t>& dims) const {
    View v = *this;
    for (size_t i = 0; i < dims.size(); ++i) {
      v.shape[i] = size(dims[i]);
      v.step[i] = stride(dims[i]);
    }
    return v;
  }

  View t() const { return permute({1, 0}); }  // a matrix's transpose

  // the same memory as ``sizes`` (one may be -1: the rest), as ATen's view: where the new
  // dimensions split or merge old ones whose strides allow it; throws where they do not
  View view(std::vector<int64_t> sizes) const {
    std::vector<int64_t> strides;
    if (!view_strides(sizes, strides))
      throw std::invalid_argument("a view of sizes that do not fit its strides");
    View v = *this;
    v.shape = std::move(sizes);
    v.step = std::move(strides);
    return v;
  }

  // a view where the strides allow it, else a contiguous copy's (as ATen's)
  View reshape(std::vector<int64_t> sizes) const {
    std::vector<int64_t> strides;
    if (!view_strides(sizes, strides)) return contiguous().view(std::move(sizes));
    View v = *this;
    v.shape = std::move(sizes);
    v.step = std::move(strides);
    return v;
  }

  // a new zeroed buffer of ``sizes``, 64-byte aligned (whole vectors, a line per panel)
  static View zeros(const std::vector<int64_t>& sizes, DType type = kFloat) {
    View v;
    v.type = type;
    v.shape = sizes;
    v.step = contiguous_strides(sizes);
    const size_t bytes = static_cast<size_t>(v.numel() * dtype_bytes(type));
    const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, rounded);
    v.data = p;
    v.keep = std::shared_ptr<void>(p, std::free);
    return v;
  }

  // this view where it is contiguous, else a contiguous copy of it
  View contiguous() const {
    if (is_contiguous()) return *this;
    View out = zeros(shape, type);
    copy_into(out);
    return out;
  }

  // copy this view's elements into ``out`` (the same sizes and dtype) element by element, by
  // their indices: for packing, once
  void copy_into(const View& out) const {
    const int64_t n = numel(), es = element_size(), d = dim();
    std::vector<int64_t> index(d, 0);
    const char* src = static_cast<const char*>(data);
    char* dst = static_cast<char*>(out.data);
    for (int64_t e = 0; e < n; ++e) {
      int64_t from = 0, to = 0;
      for (int64_t i = 0; i < d; ++i) {
        from += index[i] * step[i];
        to += index[i] * out.step[i];
      }
      std::memcpy(dst + to * es, src + from * es, static_cast<size_t>(es));
      for (int64_t i = d - 1; i >= 0 && ++index[i] == shape[i]; --i) index[i] = 0;
    }
  }

 private:
  // the strides of ``sizes`` (a -1 resolved in it) over this view's memory where they exist
  // (ATen's rule: each run of old dimensions that is contiguous within itself may be split or
  // merged), else false
  bool view_strides(std::vector<int64_t>& sizes, std::vector<int64_t>& out) const {
    const int64_t n = numel();
    int64_t known = 1, infer = -1;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] == -1) {
        if (infer >= 0) return false;
        infer = static_cast<int64_t>(i);
      } else {
        known *= sizes[i];
      }
    }
    if (infer >= 0) {
      if (known == 0 || n % known != 0) return false;
      sizes[infer] = n / known;
    } else if (known != n) {
      return false;
    }
    out.assign(sizes.size(), 1);
    if (n == 0) {
      out = contiguous_strides(sizes);
      return true;
    }
    // the old dimensions (those of size 1 dropped) in runs that step evenly, each as (its
    // count, its innermost stride): a new dimension must lie within one run
    std::vector<std::pair<int64_t, int64_t>> runs;
    for (int64_t d = 0; d < dim(); ++d) {
      if (shape[d] == 1) continue;
      if (!runs.empty() && runs.back().second == shape[d] * step[d]) {
        runs.back().first *= shape[d];
        runs.back().second = step[d];
      } else {
        runs.emplace_back(shape[d], step[d]);
      }
    }
    size_t r = 0;
    int64_t left = runs.empty() ? 1 : runs[0].first;  // the current run's elements not yet taken
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] == 1) continue;
      if (r == runs.size() || left % sizes[i] != 0) return false;
      left /= sizes[i];
      out[i] = left * runs[r].second;
      if (left == 1 && ++r < runs.size()) left = runs[r].first;
    }
    return r == runs.size();
  }
};

}  // namespace
