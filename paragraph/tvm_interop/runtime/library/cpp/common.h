// What every family of the kernels uses: the system and TVM FFI includes (and PARAGRAPH_AVX512
// on x86-64, where the own AVX-512 kernels are compiled), TVM's buffers as Views (view.h:
// `to_view`, `nchw`; no ATen here: aten.h), the tensors the own kernels take (`plain_float`),
// the text of packing and choice keys (`ints`, `shape_key`), a kernel's body as a TVM FFI
// function (`wrap`), the AVX-512 tail masks
// (`tail_mask`) and the NaN-keeping relu of the concat's and pools' epilogues (`relu_keep_nan`;
// the convolutions' and products' activations are activations.h's).
//
// Included only by kernels.cc, the kernels' translation unit: its definitions lie in
// kernels.cc's anonymous namespace, after those of the headers it includes.
#pragma once

#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>
#include <tvm/ffi/string.h>

#include <atomic>

#if defined(__x86_64__)
#include <immintrin.h>
#define PARAGRAPH_AVX512 1
#endif
#ifdef _OPENMP
#include <omp.h>
#endif
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <utility>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <optional>
#include <vector>

#include "view.h"

namespace ffi = tvm::ffi;

namespace {

// whether paragraph's own AVX-512 kernels may run: the CPU has AVX-512F and PARAGRAPH_CPU_ISA
// does not hold paragraph to AVX2 (`paragraph.machine.forced_isa`, which checks its value),
// read once; every own form asks this before it offers itself
inline bool own_avx512() {
  static const bool ok = [] {
    const char* isa = std::getenv("PARAGRAPH_CPU_ISA");
    std::string value = isa ? isa : "";
    for (auto& c : value) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return __builtin_cpu_supports("avx512f") && value != "avx2";
  }();
  return ok;
}

// a View of TVM's buffer, which the View holds alive
View to_view(const ffi::Tensor& t) {
  View v;
  const DLDataType d = t.dtype();
  const int bits = d.bits * d.lanes;
  if (d.code == kDLFloat && bits == 32) v.type = DType::kFloat;
  else if (d.code == kDLFloat && bits == 64) v.type = DType::kDouble;
  else if (d.code == kDLFloat && bits == 16) v.type = DType::kHalf;
  else if (d.code == kDLBfloat && bits == 16) v.type = DType::kBFloat16;
  else if (d.code == kDLInt && bits == 8) v.type = DType::kInt8;
  else if (d.code == kDLUInt && bits == 8) v.type = DType::kUInt8;
  else if (d.code == kDLInt && bits == 16) v.type = DType::kInt16;
  else if (d.code == kDLInt && bits == 32) v.type = DType::kInt32;
  else if (d.code == kDLInt && bits == 64) v.type = DType::kInt64;
  else if (d.code == kDLBool || (d.code == kDLUInt && bits == 1)) v.type = DType::kBool;
  const DLTensor* dl = t.GetDLTensorPtr();
  v.data = static_cast<char*>(dl->data) + dl->byte_offset;
  v.shape.assign(dl->shape, dl->shape + dl->ndim);
  if (dl->strides != nullptr)
    v.step.assign(dl->strides, dl->strides + dl->ndim);
  else
    v.step = View::contiguous_strides(v.shape);
  v.keep = std::make_shared<ffi::Tensor>(t);
  v.cpu = t.device().device_type == kDLCPU;
  return v;
}

View nchw(const View& t) { return t.permute({0, 3, 1, 2}); }  // NHWC -> NCHW view

// a contiguous float32 CPU tensor: what the AVX-512 kernels read and write
bool plain_float(const View& t) {
  return t.scalar_type() == kFloat && t.is_contiguous() && t.device().is_cpu();
}

std::string ints(const std::vector<int64_t>& v) {
  std::string out = "/";
  for (int64_t x : v) out += std::to_string(x) + ",";
  return out;
}

std::string shape_key(const std::vector<View>& ts) {
  std::string key;
  for (const View& t : ts) {
    key += "(";
    for (int64_t d : t.sizes()) key += std::to_string(d) + ",";
    key += ")";
  }
  return key;
}

ffi::Function wrap(std::function<void()> body) {
  // the ATen library's (torch's) errors become TVM FFI errors, which the stream runner reports
  // by kernel
  return ffi::Function::FromTyped([body = std::move(body)]() {
    try {
      body();
    } catch (const ffi::Error&) {
      throw;
    } catch (const std::exception& e) {
      TVM_FFI_THROW(RuntimeError) << e.what();
    }
  });
}

#ifdef PARAGRAPH_AVX512
// the lanes of a 16-float vector that ``left`` remaining elements fill (none for 0)
constexpr __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
}

// relu that keeps NaN, as torch's does: a lane is zeroed only where it compares below zero
__attribute__((target("avx512f"))) inline __m512 relu_keep_nan(__m512 v) {
  const __m512 zero = _mm512_setzero_ps();
  return _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ), zero);
}
#endif

}  // namespace
