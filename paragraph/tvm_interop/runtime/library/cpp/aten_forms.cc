// The ATen library: the kernels' forms that call PyTorch (oneDNN's convolutions, MKL's products,
// ATen's concat, pools, softmax, layer norm and activations), made from the Views the kernels'
// library (kernels.cc) bound, as at::Tensors over the same memory (at::from_blob: no copy). It
// links libtorch_cpu, ~105 MiB resident, which a process that runs a deployed artifact pays only
// where one of its kernels chose one of these forms: kernels.cc loads this library (aten.h) when
// such a form first runs. Its table (aten_forms.h) is the one entry point.
//
// Built by `runtime/library/native.py` against PyTorch's headers with the same compiler and
// flags as kernels.cc.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstring>
#include <limits>

#include "aten_forms.h"
#include "finite.h"
#include "packing.h"

namespace {

at::ScalarType scalar_type(DType d) {
  switch (d) {
    case DType::kFloat:
      return at::kFloat;
    case DType::kDouble:
      return at::kDouble;
    case DType::kHalf:
      return at::kHalf;
    case DType::kBFloat16:
      return at::kBFloat16;
    case DType::kInt8:
      return at::kChar;
    case DType::kUInt8:
      return at::kByte;
    case DType::kInt16:
      return at::kShort;
    case DType::kInt32:
      return at::kInt;
    case DType::kInt64:
      return at::kLong;
    case DType::kBool:
      return at::kBool;
    default:
      throw std::invalid_argument("PyTorch's forms take no buffer of this dtype");
  }
}

// a torch view of a View's memory: the tensor's storage holds the View's keep-alive
at::Tensor aten(const View& v) {
  return at::from_blob(v.data, v.sizes(), v.strides(), [keep = v.keep](void*) {},
                       at::TensorOptions().dtype(scalar_type(v.scalar_type())));
}

c10::optional<at::Tensor> aten(const OptView& v) {
  if (!v) return c10::nullopt;
  return aten(*v);
}

// ATen's and MKL's thread count for the calling thread: kernels.cc set OpenMP's already, but
// MKL's count is its own (and per thread)
void aten_threads(int64_t n) {
  thread_local int64_t set = 0;
  if (set != n || at::get_num_threads() != n) {
    at::set_num_threads(static_cast<int>(n));
    set = n;
  }
}

// ``form`` on ATen's threads
Form on_threads(Form form, int64_t threads) {
  return [form = std::move(form), threads]() {
    aten_threads(threads);
    form();
  };
}

void memset_zero(const at::Tensor& t) {
  std::memset(t.data_ptr(), 0, t.numel() * t.element_size());
}

// zero an output before a kernel that adds into it: on several threads as a parallel region,
// which also keeps the OpenMP worker from falling asleep (its spin lasts ~30 us; one thread
// took ~35 us to zero a 3 MB output) and the kernel's own region from waking it
void zero_for(const at::Tensor& t) {
  if (at::get_num_threads() > 1) {
    at::Tensor z = t;
    z.zero_();
  } else {
    memset_zero(t);
  }
}

// o = act(o) in place, PyTorch's: after a library's call (oneDNN's fuses relu alone, MKL's none)
void activate(at::Tensor& o, Act act) {
  switch (act) {
    case Act::kNone:
      return;
    case Act::kRelu:
      o.relu_();
      return;
    case Act::kRelu6:
      at::hardtanh_(o, 0, 6);  // F.relu6's
      return;
    case Act::kHardswish:
      at::hardswish_(o);
      return;
    case Act::kHardsigmoid:
      at::hardsigmoid_(o);
      return;
    case Act::kSigmoid:
      o.sigmoid_();
      return;
    case Act::kSilu:
      at::silu_(o);
      return;
    case Act::kGelu:
    case Act::kGeluTanh:
      at::gelu_(o, act == Act::kGelu ? "none" : "tanh");
      return;
  }
}

void activate_view(const View& o, Act act) {
  at::Tensor t = aten(o);
  activate(t, act);
}

const c10::OperatorHandle& in_place_conv() {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(
      "mkldnn::_convolution_pointwise_", "binary");
  return op;
}

// out = act(conv(x, w) + bias + out), in place: out starts as zero or the residual. oneDNN
// fuses relu; any other activation is PyTorch's, after it, on out_buffer (out's storage).
// oneDNN's relu post-op is MAXPS(v, 0), which makes a NaN 0 where PyTorch, ONNX Runtime and the
// own forms keep it: relu is fused only where no NaN can arise (the weight finite,
// ``weight_finite``, a constant checked once at binding; the input, bias and residual checked
// each call, a read of what oneDNN reads anyway), else it is PyTorch's after the call
Form onednn_conv(const View& out_v, const View& x_v, std::shared_ptr<LazyPacked<at::Tensor>> packed,
                 const OptView& bias_v, const OptView& res_v, std::vector<int64_t> padding,
                 std::vector<int64_t> stride, std::vector<int64_t> dilation, int64_t groups,
                 std::vector<int64_t> pre_pad, Act act, const View& out_buffer_v,
                 bool weight_finite) {
  at::Tensor out = aten(out_v), x = aten(x_v), out_buffer = aten(out_buffer_v);
  c10::optional<at::Tensor> bias = aten(bias_v), res = aten(res_v);
  return [=]() mutable {
    const bool fuse_relu = act == Act::kRelu && weight_finite && !any_nonfinite(x_v) &&
                           !(bias_v && any_nonfinite(*bias_v)) && !(res_v && any_nonfinite(*res_v));
    at::Tensor xp = pre_pad.empty() ? x : at::constant_pad_nd(x, pre_pad);
    if (res) {
      // the memory plan may give the output the residual's buffer (written in place)
      if (res->data_ptr() != out.data_ptr()) out.copy_(*res);
    } else {
      zero_for(out_buffer);
    }
    torch::jit::Stack stack;
    stack.reserve(13);
    stack.emplace_back(out);
    stack.emplace_back(xp);
    stack.emplace_back(packed->tensor());
    stack.emplace_back(bias ? c10::IValue(*bias) : c10::IValue());
    stack.emplace_back(padding);
    stack.emplace_back(stride);
    stack.emplace_back(dilation);
    stack.emplace_back(groups);
    stack.emplace_back(std::string("add"));
    stack.emplace_back(c10::IValue());
    stack.emplace_back(fuse_relu ? c10::IValue(std::string("relu")) : c10::IValue());
    stack.emplace_back(c10::List<c10::optional<at::Scalar>>());
    stack.emplace_back(c10::IValue());
    in_place_conv().callBoxed(&stack);
    if (!fuse_relu) activate(out_buffer, act);
  };
}

std::string ints(const std::vector<int64_t>& v) {
  std::string out = "/";
  for (int64_t x : v) out += std::to_string(x) + ",";
  return out;
}

Form conv(const View& out, const View& x, const View& w_v, const OptView& bias,
          const OptView& res, const Ints& padding, const Ints& stride, const Ints& dilation,
          int64_t groups, const Ints& pre_pad, const Ints& input_size, Act act,
          const View& out_buffer, bool weight_finite, int64_t threads) {
  // the weight in oneDNN's blocked format for this input shape and thread count, once
  at::Tensor w = aten(w_v);
  auto packed = lazy_packed(
      w, "conv" + ints(padding) + ints(stride) + ints(dilation) + ints({groups}) +
             ints(input_size),
      [w, padding, stride, dilation, groups, input_size]() {
        return at::mkldnn_reorder_conv2d_weight(w.to_mkldnn(), padding, stride, dilation,
                                                groups, input_size);
      });
  return on_threads(onednn_conv(out, x, packed, bias, res, padding, stride, dilation, groups,
                                pre_pad, act, out_buffer, weight_finite),
                    threads);
}

Form linear(const View& out2, const View& rows, const View& w_v, const OptView& bias, Act act,
            bool weight_finite, int64_t threads) {
  const int64_t k = w_v.size(0), n = w_v.size(1), m = rows.size(0);
  // oneDNN's form: a 1x1 convolution over m pixels in NHWC, the weight packed once
  at::Tensor w = aten(w_v);
  auto packed = lazy_packed(w, "linear" + ints({m}), [w, n, k, m]() {
    at::Tensor w4 = w.t().contiguous().view({n, k, 1, 1});
    return at::mkldnn_reorder_conv2d_weight(w4.to_mkldnn(), {0, 0}, {1, 1}, {1, 1}, 1,
                                            {1, k, 1, m});
  });
  const View x4 = rows.view({1, m, 1, k}).permute({0, 3, 2, 1});
  const View out4 = out2.view({1, m, 1, n}).permute({0, 3, 2, 1});
  return on_threads(onednn_conv(out4, x4, packed, bias, std::nullopt, {0, 0}, {1, 1}, {1, 1}, 1,
                                {}, act, out2, weight_finite),
                    threads);
}

// rows @ weight (+ bias) into out2, then the residual and the activation, in place (MKL);
// where out2 is the residual's own buffer, the product is added to it (GEMM's beta = 1)
Form gemm(const View& out2_v, const View& rows_v, const View& weight_v, const OptView& bias_v,
          const OptView& res2_v, Act act, int64_t threads) {
  at::Tensor out2 = aten(out2_v), rows = aten(rows_v), weight = aten(weight_v);
  c10::optional<at::Tensor> bias = aten(bias_v), res2 = aten(res2_v);
  if (res2 && res2->data_ptr() == out2.data_ptr()) {
    return on_threads([=]() {
      at::Tensor o = out2;
      o.addmm_(rows, weight);
      if (bias) o.add_(*bias);
      activate(o, act);
    }, threads);
  }
  return on_threads([=]() {
    at::Tensor o = out2;
    if (bias) {
      at::addmm_out(o, *bias, rows, weight);
    } else {
      at::mm_out(o, rows, weight);
    }
    if (res2) o.add_(*res2);
    activate(o, act);
  }, threads);
}

Form bmm(const View& o3_v, const View& a3_v, const View& b3_v, Act act, int64_t threads) {
  at::Tensor o3 = aten(o3_v), a3 = aten(a3_v), b3 = aten(b3_v);
  return on_threads([a3, b3, o3, act]() {
    at::Tensor o = o3;
    at::bmm_out(o, a3, b3);
    activate(o, act);
  }, threads);
}

Form concat(const View& out_v, const std::vector<View>& parts_v, int64_t axis, bool relu,
            int64_t threads) {
  at::Tensor out = aten(out_v);
  std::vector<at::Tensor> parts;
  for (const View& v : parts_v) parts.push_back(aten(v));
  return on_threads([out, parts, axis, relu]() {
    at::Tensor o = out;
    at::cat_out(o, parts, axis);
    if (relu) o.relu_();
  }, threads);
}

// PyTorch's pools on NCHW views of the NHWC buffers; PyTorch pads evenly, so uneven padding
// (top, left, bottom, right) is a padded copy first (-inf for a max, zeros for an average,
// which without counting the padding is divided by the window's count of real elements)
Form pool2d(const View& out_buffer, const View& x_buffer, const Ints& p, bool is_max,
            bool include_pad, const OptView& scale_v, const OptView& shift_v, bool relu,
            int64_t threads) {
  at::Tensor x = aten(x_buffer).permute({0, 3, 1, 2}), out = aten(out_buffer).permute({0, 3, 1, 2});
  at::Tensor scale, shift;  // the epilogue's, (C) each
  if (scale_v) {
    scale = aten(*scale_v).reshape({-1});
    shift = aten(*shift_v).reshape({-1});
  }
  const bool even = p[4] == p[6] && p[5] == p[7];
  return on_threads([=]() {
    at::Tensor o = out;
    if (even && is_max) {
      o.copy_(at::max_pool2d(x, {p[0], p[1]}, {p[2], p[3]}, {p[4], p[5]}));
    } else if (even) {
      o.copy_(at::avg_pool2d(x, {p[0], p[1]}, {p[2], p[3]}, {p[4], p[5]}, false, include_pad));
    } else {
      const std::vector<int64_t> pads{p[5], p[7], p[4], p[6]};  // left, right, top, bottom
      if (is_max) {
        at::Tensor xp = at::constant_pad_nd(x, pads, -std::numeric_limits<double>::infinity());
        o.copy_(at::max_pool2d(xp, {p[0], p[1]}, {p[2], p[3]}, {0, 0}));
      } else {
        at::Tensor sum = at::avg_pool2d(at::constant_pad_nd(x, pads, 0), {p[0], p[1]},
                                        {p[2], p[3]}, {0, 0}, false, true);
        if (!include_pad) {
          at::Tensor real = at::constant_pad_nd(
              at::ones({1, 1, x.size(2), x.size(3)}, x.options()), pads, 0);
          sum = sum / at::avg_pool2d(real, {p[0], p[1]}, {p[2], p[3]}, {0, 0}, false, true);
        }
        o.copy_(sum);
      }
    }
    if (scale.defined()) o.copy_(at::addcmul(shift.view({-1, 1, 1}), o, scale.view({-1, 1, 1})));
    if (relu) o.relu_();
  }, threads);
}

Form softmax(const View& out_v, const View& x_v, int64_t axis, double scale, int64_t threads) {
  at::Tensor out = aten(out_v), x = aten(x_v);
  return on_threads([out, x, axis, scale]() {
    at::Tensor o = out;
    if (scale != 1.0) {  // scaled into the output, normalised there in place
      at::mul_out(o, x, at::Scalar(scale));
      at::_softmax_out(o, o, axis, false);
    } else {
      at::_softmax_out(o, x, axis, false);
    }
  }, threads);
}

// ATen's add and norm (on the schedule's threads; the sum and the statistics in buffers of
// their own, allocated once)
Form layer_norm(const View& out_v, const View& x_v, const View& gamma_v, const View& beta_v,
                const OptView& res_v, double eps, int64_t threads) {
  at::Tensor out = aten(out_v), x = aten(x_v), gamma = aten(gamma_v), beta = aten(beta_v);
  c10::optional<at::Tensor> res = aten(res_v);
  std::vector<int64_t> stat_shape = x.sizes().vec();
  stat_shape.back() = 1;
  at::Tensor mean = at::empty(stat_shape, x.options()), rstd = at::empty(stat_shape, x.options());
  at::Tensor sum = res ? at::empty_like(x) : x;
  std::vector<int64_t> normalized{x.size(-1)};
  return on_threads([=]() mutable {
    if (res) at::add_out(sum, x, *res);
    at::native_layer_norm_out(out, mean, rstd, sum, normalized, gamma, beta, eps);
  }, threads);
}

void sweep() { sweep_packed<at::Tensor>(); }

const AtenForms kForms{conv,     linear,     gemm,          bmm,   concat, pool2d,
                       softmax,  layer_norm, activate_view, sweep, packed_keys<at::Tensor>};

}  // namespace

extern "C" __attribute__((visibility("default"))) const void* paragraph_aten_forms(
    int64_t version, int64_t size) {
  if (version != kAtenFormsVersion || size != static_cast<int64_t>(sizeof(AtenForms)))
    return nullptr;
  return &kForms;
}
