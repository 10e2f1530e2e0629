// The boundary between the two libraries: the forms of PyTorch's oneDNN and MKL calls that the
// ATen library (aten_forms.cc, which links libtorch_cpu) makes from Views (`AtenForms`), found by
// the kernels' library (aten.h) through one C function, `paragraph_aten_forms`, only when a
// kernel first runs one of them. Each takes the same Views and parameters its form took when
// it was built in kernels.cc, and returns the form, which sets ATen's thread count (and MKL's)
// to ``threads`` before each call.
//
// Both libraries are built by the same compiler with the same flags (native.py), so the C++
// types here pass between them as they are; `kAtenFormsVersion` and the table's size, checked by
// `paragraph_aten_forms`, refuse a library of another build.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "act.h"
#include "view.h"

namespace {

using Form = std::function<void()>;
using Ints = std::vector<int64_t>;
using OptView = std::optional<View>;

constexpr int64_t kAtenFormsVersion = 1;

struct AtenForms {
  // oneDNN's convolution out = act(conv(x, w) + bias + out) in place (out: zero or the
  // residual first) on the weight packed once for ``input_size`` (the padded input's) and
  // the calling thread count; x, w and out NCHW / OIHW views, out_buffer out's storage
  Form (*conv)(const View& out, const View& x, const View& w, const OptView& bias,
               const OptView& res, const Ints& padding, const Ints& stride,
               const Ints& dilation, int64_t groups, const Ints& pre_pad, const Ints& input_size,
               Act act, const View& out_buffer, bool weight_finite, int64_t threads);
  // oneDNN's form of a linear layer out2 = act(rows @ w + bias): a 1x1 convolution over the
  // rows as pixels, w (K, N) packed once
  Form (*linear)(const View& out2, const View& rows, const View& w, const OptView& bias,
                 Act act, bool weight_finite, int64_t threads);
  // MKL's out2 = act(rows @ weight + bias + res2), in place
  Form (*gemm)(const View& out2, const View& rows, const View& weight, const OptView& bias,
               const OptView& res2, Act act, int64_t threads);
  // MKL's batched product o3 = act(a3 @ b3)
  Form (*bmm)(const View& o3, const View& a3, const View& b3, Act act, int64_t threads);
  // PyTorch's cat_out of ``parts`` along ``axis`` into out, then relu
  Form (*concat)(const View& out, const std::vector<View>& parts, int64_t axis, bool relu,
                 int64_t threads);
  // PyTorch's pool on NHWC buffers (params: window 2, stride 2, padding 4), then the epilogue
  // out * scale + shift and relu
  Form (*pool2d)(const View& out_buffer, const View& x_buffer, const Ints& p, bool is_max,
                 bool include_pad, const OptView& scale, const OptView& shift, bool relu,
                 int64_t threads);
  // ATen's softmax of scale * x along ``axis`` into out
  Form (*softmax)(const View& out, const View& x, int64_t axis, double scale, int64_t threads);
  // ATen's add and layer norm over the last axis of x (+ res) into out
  Form (*layer_norm)(const View& out, const View& x, const View& gamma, const View& beta,
                     const OptView& res, double eps, int64_t threads);
  // PyTorch's activation of o in place (after the own AVX2 GEMM: `packed_gemm_avx2_torch_gelu`)
  void (*activate)(const View& o, Act act);
  // the packed weights: those no form holds any more dropped, the keys of those left
  void (*sweep_packed)();
  std::vector<std::string> (*packed_keys)();
};

}  // namespace

// the table of the ATen library's forms where ``version`` and ``size`` are its own (the two
// libraries of one build), else null
extern "C" const void* paragraph_aten_forms(int64_t version, int64_t size);
