// paragraph's CPU vendor kernels called from C++: the same PyTorch (oneDNN / MKL) calls as
// `runtime/library/torch_kernels.py`'s bound kernels, bound once to TVM's buffers and returned
// as TVM FFI functions, so that the native stream runner calls them without the GIL. In Python
// every vendor call took the GIL twice (on entry and after the torch call) with several
// microseconds of Python around the kernel, and on two concurrent streams small kernels
// queued for it (RandWire: streams busy 40% longer than their kernels alone). Beside those
// calls, kernels of paragraph's own where the library's were slower (AVX-512, each chosen per
// shape by timing): a GEMM with a fused epilogue for 1x1 convolutions and linear layers, other
// convolutions as an implicit GEMM on its tiles, stride-1 3x3, 5x5, 1x7 and 1x3 ones (and
// the transposes) also by Winograd's minimal filtering on the same tiles, depthwise convolutions,
// a one-pass layer norm, concatenation and pools; on CPUs without AVX-512, AVX2 forms of the
// GEMM and the depthwise convolution (avx2.h).
//
// This file is the kernels' translation unit: it includes the headers of this folder, one per
// family (each after those it uses), and holds the operator entry points, which check every
// shape they are given against each other and their parameters (checks.h: a mismatch is a
// ValueError that names the entry point, never a read or write out of bounds), then bind a
// kernel's forms to TVM's buffers (as Views, view.h), and the exported functions. Everything
// but the exports lies in one anonymous namespace, as in one file. PyTorch's forms are the
// ATen library's (aten_forms.cc, a translation unit of its own that links libtorch_cpu): each
// is a deferred form at its place among a kernel's forms, and this library, which links no
// libtorch, loads that one only when such a form first runs (aten.h).
//
// Built by `runtime/library/native.py` with the system C++ compiler against TVM FFI's headers,
// this folder on the quoted include path; loaded with `tvm_ffi.load_module`.
#include "common.h"
#include "checks.h"
#include "activations.h"
#include "threads.h"
#include "packing.h"
#include "aten.h"
#include "forms.h"
#include "gemm.h"
#include "conv.h"
#include "winograd.h"
#include "depthwise.h"
#include "avx2.h"
#include "winograd_avx2.h"
#include "stem.h"
#include "products.h"
#include "concat.h"
#include "pools.h"
#include "softmax_norm.h"

namespace {

// a convolution on TVM's buffers; params: stride (2), padding (2 or 4), dilation (2), groups
ffi::Function Conv2d(ffi::Tensor out_t, ffi::Tensor x_t, ffi::Tensor w_t,
                     ffi::Optional<ffi::Tensor> bias_t, ffi::Optional<ffi::Tensor> res_t,
                     ffi::Array<int64_t> params, ffi::String layout, ffi::String act,
                     int64_t threads) {
  // NCHW2NHWC: an NCHW input (the model's), the weight and output NHWC as "NHWC"'s; x_buffer
  // is then the input's NHWC view
  const bool nchw_in = std::string(layout) == "NCHW2NHWC";
  const bool nhwc = nchw_in || std::string(layout) == "NHWC";
  View out_buffer = to_view(out_t), x_buffer = to_view(x_t), w_buffer = to_view(w_t);
  // ranks first: the views below permute four dimensions
  check_rank("paragraph_vendor_conv2d", "the input", x_buffer, 4);
  check_rank("paragraph_vendor_conv2d", "the weight", w_buffer, 4);
  check_rank("paragraph_vendor_conv2d", "the output", out_buffer, 4);
  if (nchw_in) x_buffer = x_buffer.permute({0, 2, 3, 1});
  View out = nhwc ? nchw(out_buffer) : out_buffer;
  View x = nhwc ? nchw(x_buffer) : x_buffer;
  View w = nhwc ? nchw(w_buffer) : w_buffer;
  std::optional<View> bias, res, res_buffer;
  if (bias_t.has_value()) bias = to_view(bias_t.value());
  if (res_t.has_value()) {
    res_buffer = to_view(res_t.value());
    check_rank("paragraph_vendor_conv2d", "the residual", *res_buffer, 4);
    res = nhwc ? nchw(*res_buffer) : *res_buffer;
  }
  std::vector<int64_t> p(params.begin(), params.end());
  check_conv2d(out, x, w, bias, res, p);
  std::vector<int64_t> stride{p[0], p[1]}, padding, pre_pad;
  size_t at_dil = 2;
  if (p.size() == 7) {
    padding = {p[2], p[3]};
    at_dil = 4;
  } else {  // TF-style padding: (top, left, bottom, right) padded per call, as a copy
    padding = {0, 0};
    pre_pad = {p[3], p[5], p[2], p[4]};
    at_dil = 6;
  }
  std::vector<int64_t> dilation{p[at_dil], p[at_dil + 1]};
  int64_t groups = p[at_dil + 2];
  use_threads(threads);
  std::vector<int64_t> input_size = x.sizes();
  if (!pre_pad.empty()) {
    input_size[2] += pre_pad[2] + pre_pad[3];
    input_size[3] += pre_pad[0] + pre_pad[1];
  }
  std::string a(act);
  const Act fused = act_of(a);  // (an unknown name is an error here, at binding)
  const bool weight_finite = !any_nonfinite(w);  // (a constant: packed once)
  // oneDNN's, on the weight in its blocked format for this input shape and thread count
  Form onednn = onednn_conv(out, x, w, bias, res, padding, stride, dilation, groups, pre_pad,
                            input_size, fused, out_buffer, weight_finite, threads);
  // the key of a timed choice among this convolution's forms of ``family``
  auto key = [&](const std::string& family) {
    return family + (nchw_in ? "c" : "") + std::to_string(threads) + a + ints(p) +
           shape_key({x_buffer, w_buffer, out_buffer}) + (res ? "r" : "") +
           (res && res_buffer->data_ptr() == out_buffer.data_ptr() ? "i" : "") +
           (bias ? "b" : "");
  };
  bool gemm_form = nhwc && w_buffer.size(1) == 1 && w_buffer.size(2) == 1 && p[0] == 1 &&
                   p[1] == 1 && pre_pad.empty() && padding[0] == 0 && padding[1] == 0 &&
                   dilation[0] == 1 && dilation[1] == 1 && groups == 1 &&
                   x_buffer.is_contiguous() && out_buffer.is_contiguous();
  if (!gemm_form) {
#ifdef PARAGRAPH_AVX512
    const int64_t pt = pre_pad.empty() ? padding[0] : p[2];
    const int64_t pl = pre_pad.empty() ? padding[1] : p[3];
    const int64_t pb = pre_pad.empty() ? padding[0] : p[4];
    const int64_t pr = pre_pad.empty() ? padding[1] : p[5];
    // a regular convolution: oneDNN's and the own implicit GEMM, the faster by timing
    if (nhwc && groups == 1) {
      if (auto own = own_conv(out_buffer, x_buffer, w_buffer, bias, res_buffer, p[0], p[1],
                              {pt, pl, pb, pr}, dilation[0], dilation[1], fused, threads)) {
        std::vector<Form> forms{onednn, *own};
        // the streamed forms in small blocks after all the others (whose indices stay)
        if (p[0] == 1 && p[1] == 1 && dilation[0] == 1 && dilation[1] == 1 && !nchw_in)
          for (bool small_blocks : {false, true})
            for (auto wino : {own_winograd<F2x3, 2>, own_winograd<F4x3, 2>,
                              own_winograd<F2x3, 1>, own_winograd<F4x3, 1>,
                              own_winograd<F2x7, 1>, own_winograd<F2x5, 2>,
                              own_winograd<F3x7, 1>})
              if (auto form = wino(out_buffer, x_buffer, w_buffer, bias, res_buffer,
                                   {pt, pl, pb, pr}, fused, threads, small_blocks))
                forms.push_back(
                    finite_only(*form, *own, x_buffer, bias, res_buffer, weight_finite));
        // a stem on the model's NCHW input: the direct form after all the others
        if (nchw_in)
          if (auto stem = own_stem(out_buffer, x_buffer, w_buffer, bias, res_buffer, p[0], p[1],
                                   pt, pl, dilation[0], dilation[1], fused, threads))
            forms.push_back(*stem);
        return fastest_of(forms, key("conv_kxk"), threads);
      }
      // without AVX-512: oneDNN's, the own AVX2 implicit GEMM and, stride 1 and undilated, the
      // AVX2 Winograd forms (a non-finite input to the implicit GEMM), the fastest by timing
      if (auto own = own_conv_avx2(out_buffer, x_buffer, w_buffer, bias, res_buffer, p[0], p[1],
                                   {pt, pl, pb, pr}, dilation[0], dilation[1], fused, threads)) {
        std::vector<Form> forms{onednn, *own};
        if (p[0] == 1 && p[1] == 1 && dilation[0] == 1 && dilation[1] == 1 && !nchw_in)
          for (auto wino : {own_winograd_avx2<F2x3, 2>, own_winograd_avx2<F4x3, 2>,
                            own_winograd_avx2<F2x3, 1>, own_winograd_avx2<F4x3, 1>,
                            own_winograd_avx2<F2x7, 1>, own_winograd_avx2<F2x5, 2>,
                            own_winograd_avx2<F3x7, 1>})
            if (auto form = wino(out_buffer, x_buffer, w_buffer, bias, res_buffer,
                                 {pt, pl, pb, pr}, fused, threads))
              forms.push_back(
                  finite_only(*form, *own, x_buffer, bias, res_buffer, weight_finite));
        return fastest_of(std::move(forms), key("conv_avx2_"), threads);
      }
    }
    // a depthwise convolution: the own eight-pixel form where it applies, else oneDNN's and
    // the own form, the faster by timing. Timed in a model, oneDNN's form won MobileNetV2's
    // 56 x 56 x 144 (250 against 290 us, forms alternating run by run) and then ran 518 us a
    // call, the next kernel 264 instead of 150, where the own form ran 170 (ONNX Runtime 145):
    // 0.23 ms of the model's 4.9 lost to a timing that cannot see the neighbours
    const bool depthwise = nhwc && groups > 1 && groups == x_buffer.size(3) &&
                           groups == out_buffer.size(3) && w_buffer.size(3) == 1;
    if (depthwise) {
      if (auto own = own_depthwise(out_buffer, x_buffer, w_buffer, bias, res_buffer, p[0], p[1],
                                   pt, pl, dilation[0], dilation[1], fused, threads)) {
        if (Depthwise::eight_for(w_buffer.size(2), p[1], dilation[1]) != nullptr)
          return single_form(*own, threads);
        return fastest_of({onednn, *own}, key("depthwise"), threads);
      }
      // without AVX-512: oneDNN's and the own AVX2 form, the faster by timing (on a Zen 3 the
      // own form ran MobileNetV2's stride-2 and 112 x 112 ones 5-35% faster in the model,
      // oneDNN's the 5 x 5 stride-1 ones at 14 x 14 and 28 x 28 1.2-1.5x faster)
      if (auto own = own_depthwise_avx2(out_buffer, x_buffer, w_buffer, bias, res_buffer, p[0],
                                        p[1], pt, pl, dilation[0], dilation[1], fused, threads))
        return fastest_of({onednn, *own}, key("depthwise2"), threads);
    }
    // a grouped convolution: oneDNN's and the own AVX2 forms (no AVX-512 sibling: on any CPU
    // with AVX2), on panels of 16 and of 8 columns, the fastest by timing
    if (nhwc && groups > 1 && !depthwise) {
      std::vector<Form> forms{onednn};
      for (int64_t nr : {16, 8})
        if (auto own = own_grouped_conv_avx2(out_buffer, x_buffer, w_buffer, bias, res_buffer,
                                             p[0], p[1], pt, pl, dilation[0], dilation[1],
                                             groups, fused, onednn, nr, threads))
          forms.push_back(*own);
      if (forms.size() > 1) return fastest_of(std::move(forms), key("grouped2_"), threads);
    }
#endif
    return single_form(onednn, threads);
  }
  int64_t cin = x_buffer.size(3), cout = out_buffer.size(3);
  std::optional<View> res2;
  if (res_buffer) res2 = res_buffer->reshape({-1, cout});
  Form mkl = gemm(out_buffer.view({-1, cout}), x_buffer.view({-1, cin}),
                  w_buffer.reshape({cout, cin}).t(), bias, res2, fused, threads);
  std::vector<Form> forms{onednn, mkl};
#ifdef PARAGRAPH_AVX512
  if (auto own = packed_gemm(out_buffer.view({-1, cout}), x_buffer.view({-1, cin}), w_buffer,
                             cin, 1, bias, res2, fused, threads))
    forms.push_back(*own);
  if (auto own = packed_gemm_avx2(out_buffer.view({-1, cout}), x_buffer.view({-1, cin}),
                                  w_buffer, cin, 1, bias, res2, fused, threads))
    forms.push_back(*own);
#endif
  return fastest_of(std::move(forms), key("conv2d"), threads);
}

// (..., K) @ W (K, N) with a constant W, optional bias and activation, on TVM's buffers
ffi::Function Linear(ffi::Tensor out_t, ffi::Tensor a_t, ffi::Tensor w_t,
                     ffi::Optional<ffi::Tensor> bias_t, ffi::String act, int64_t threads) {
  View out = to_view(out_t), a = to_view(a_t), w = to_view(w_t);
  std::optional<View> bias;
  if (bias_t.has_value()) bias = to_view(bias_t.value());
  check_linear("paragraph_vendor_linear", out, a, w, bias);
  int64_t k = w.size(0), n = w.size(1);
  View rows = a.reshape({-1, k}), out2 = out.view({-1, n});
  std::string act_s(act);
  const Act fused = act_of(act_s);
  use_threads(threads);
  // oneDNN's form: a 1x1 convolution over the rows as pixels in NHWC, the weight packed once
  const bool weight_finite = !any_nonfinite(w);  // (a constant: packed once)
  Form onednn = deferred([=](const AtenForms& aten) {
    return aten.linear(out2, rows, w, bias, fused, weight_finite, threads);
  });
  Form mkl = gemm(out2, rows, w, bias, std::nullopt, fused, threads);
  std::vector<Form> forms{onednn, mkl};
#ifdef PARAGRAPH_AVX512
  // the own GEMM (an RNN's steps: the SRU's 1 x 1024 x 1024 products 1.5x faster end to end;
  // with the next panel prefetched, BERT's 64-row products too)
  if (w.is_contiguous()) {
    if (auto own = packed_gemm(out2, rows, w, 1, n, bias, std::nullopt, fused, threads))
      forms.push_back(*own);
    if (auto own = packed_gemm_avx2(out2, rows, w, 1, n, bias, std::nullopt, fused, threads))
      forms.push_back(*own);
  }
  if (auto own = own_gemv(out2, rows, w, bias, fused, threads)) forms.push_back(*own);
  // (last: the forms before it keep their indices, which artifacts name)
  if (w.is_contiguous())
    if (auto gelu = packed_gemm_avx2_torch_gelu(out2, rows, w, 1, n, bias, std::nullopt, fused,
                                                threads))
      forms.push_back(*gelu);
#endif
  return fastest_of(std::move(forms),
                    "linear" + std::to_string(threads) + act_s + shape_key({rows, w}) +
                        (bias ? "b" : ""),
                    threads);
}

// a product of two activations: (..., K) @ (K, N) as one GEMM over the flattened rows, or a
// batched product (B..., M, K) @ (B..., K, N) (attention's scores and context): MKL in place,
// and the own batched product beside it (AVX-512's or AVX2's; the GEMM as a batch of one), the
// faster by timing
ffi::Function Product(ffi::Tensor out_t, ffi::Tensor a_t, ffi::Tensor b_t,
                      ffi::Optional<ffi::Tensor> bias_t, ffi::String act, int64_t threads) {
  View out = to_view(out_t), a = to_view(a_t), b = to_view(b_t);
  std::optional<View> bias;
  if (bias_t.has_value()) bias = to_view(bias_t.value());
  check_product(out, a, b, bias);
  std::string act_s(act);
  const Act fused = act_of(act_s);
  if (b.dim() == 2) {
    View a2 = a.reshape({-1, a.size(-1)}), o2 = out.view({-1, b.size(1)});
    Form mm = gemm(o2, a2, b, bias, std::nullopt, fused, threads);
    // the own batched product's, as a batch of one (MKL's alone mapped libtorch without
    // AVX-512)
    View a3 = a2.view({1, a2.size(0), a2.size(1)}), b3 = b.view({1, b.size(0), b.size(1)});
    View o3 = o2.view({1, o2.size(0), o2.size(1)});
    std::optional<Form> own;
#ifdef PARAGRAPH_AVX512
    if (!bias) own = own_bmm(o3, a3, b3, fused, threads);
    if (!own) own = own_bmm_avx2(o3, a3, b3, bias, fused, threads);
#endif
    if (!own) return single_form(mm, threads);
    return fastest_of({mm, *own},
                      "mm" + std::to_string(threads) + act_s + shape_key({a2, b}) +
                          (bias ? "b" : ""),
                      threads);
  }
  View a3 = a.reshape({-1, a.size(-2), a.size(-1)});
  View b3 = b.reshape({-1, b.size(-2), b.size(-1)});
  View o3 = out.view({-1, out.size(-2), out.size(-1)});
  Form mkl = deferred([=](const AtenForms& aten) { return aten.bmm(o3, a3, b3, fused, threads); });
  auto own = own_bmm(o3, a3, b3, fused, threads);  // the activation in its tiles' stores
#ifdef PARAGRAPH_AVX512
  if (!own) own = own_bmm_avx2(o3, a3, b3, std::nullopt, fused, threads);
#endif
  if (!own) return wrap(mkl);
  return fastest_of({mkl, *own}, "bmm" + std::to_string(threads) + act_s + shape_key({a3, b3}),
                    threads);
}

// tensors joined along ``axis`` into out (then relu): the own concat and PyTorch's, the faster
ffi::Function Concat(ffi::Tensor out_t, ffi::Array<ffi::Tensor> parts_t, int64_t axis,
                     ffi::String act, int64_t threads) {
  View out = to_view(out_t);
  std::vector<View> parts;
  for (const ffi::Tensor& t : parts_t) parts.push_back(to_view(t));
  std::string act_s(act);
  // a join fuses relu alone (its copy is all the work it does: an activation with an
  // exponential would be a kernel's worth of its own)
  const Act fused = act_of(act_s);
  if (fused != Act::kNone && fused != Act::kRelu)
    TVM_FFI_THROW(ValueError) << "paragraph's vendor concat fuses relu alone, not '" << act_s
                              << "'";
  check_concat(out, parts, axis);
  const bool relu = fused == Act::kRelu;
  Form torch_cat = deferred(
      [=](const AtenForms& aten) { return aten.concat(out, parts, axis, relu, threads); });
  auto own = own_concat(out, parts, axis, relu, threads);
  if (!own) {
    return single_form(torch_cat, threads);
  }
  std::vector<Form> forms{torch_cat, *own};
  // and on the calling thread alone: in a model a join reads what its producers just wrote,
  // half of it in the other core's cache, and NASNet-A mobile's joins ran 1.5-3.5x slower
  // split over two threads than on one
  if (threads > 1) forms.push_back(*own_concat(out, parts, axis, relu, 1));
  return fastest_of(std::move(forms),
                    "concat" + std::to_string(threads) + act_s + std::to_string(axis) +
                        shape_key(parts) + shape_key({out}),
                    threads);
}

// a max (is_max) or average pool on TVM's NHWC buffers; params: window (2), stride (2),
// padding (top, left, bottom, right)
ffi::Function Pool2d(ffi::Tensor out_t, ffi::Tensor x_t, ffi::Array<int64_t> params,
                     bool is_max, bool include_pad, ffi::Optional<ffi::Tensor> scale_t,
                     ffi::Optional<ffi::Tensor> shift_t, bool relu, int64_t threads) {
  View out_buffer = to_view(out_t), x_buffer = to_view(x_t);
  std::vector<int64_t> p(params.begin(), params.end());
  std::optional<View> given_scale, given_shift;
  if (scale_t.has_value()) given_scale = to_view(scale_t.value());
  if (shift_t.has_value()) given_shift = to_view(shift_t.value());
  check_pool2d(out_buffer, x_buffer, p, given_scale, given_shift);
  View scale, shift;  // the epilogue's, (C) each
  if (given_scale) {
    scale = given_scale->reshape({-1});
    shift = given_shift->reshape({-1});
  }
  // PyTorch's pools on NCHW views of the NHWC buffers (uneven padding a padded copy first):
  // without AVX-512 this form is the only one, and it refused uneven padding
  Form aten = deferred([=](const AtenForms& forms) {
    return forms.pool2d(out_buffer, x_buffer, p, is_max, include_pad, given_scale, given_shift,
                        relu, threads);
  });
#ifdef PARAGRAPH_AVX512
  const bool plain = plain_float(x_buffer) && plain_float(out_buffer) &&
                     x_buffer.size(0) == out_buffer.size(0) &&
                     x_buffer.size(3) == out_buffer.size(3) &&
                     (!scale.defined() || (plain_float(scale) && plain_float(shift)));
  const bool own_ok = own_avx512() && plain;
  // without AVX-512: ATen's and the own windows in AVX2 (with the epilogue), the faster by
  // timing
  const bool avx2_ok = !own_ok && plain && __builtin_cpu_supports("avx2") &&
                       __builtin_cpu_supports("fma");
#else
  const bool own_ok = false, avx2_ok = false;
#endif
  if (!own_ok && !avx2_ok) {
    return single_form(aten, threads);
  }
  Pool pool{x_buffer.data_ptr<float>(), out_buffer.data_ptr<float>(), x_buffer.size(0),
            x_buffer.size(1), x_buffer.size(2), x_buffer.size(3), out_buffer.size(1),
            out_buffer.size(2), p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], is_max,
            include_pad, scale.defined() ? scale.data_ptr<float>() : nullptr,
            shift.defined() ? shift.data_ptr<float>() : nullptr, relu};
  // pool form ``f`` (see `Pool::operator()`); the views hold TVM's buffers alive as long as
  // the function
  auto form = [=](int f) -> Form {
    return [pool, x_buffer, out_buffer, scale, shift, threads, f]() { pool(threads, f); };
  };
  const std::string key = (is_max ? "maxpool" : "avgpool3") + std::to_string(threads) + ints(p) +
                          (include_pad ? "i" : "") + (pool.has_epilogue() ? "e" : "") +
                          shape_key({x_buffer});
  if (avx2_ok) return fastest_of({aten, form(4)}, key + "avx2", threads);
  // forms by index: windows, then the sliding sums, the input's order or the carried columns
  // where they apply
  std::vector<Form> forms{form(0)};
  if (pool.slides()) forms.push_back(form(1));
  if (pool.streams()) forms.push_back(form(2));
  if (pool.carries()) forms.push_back(form(3));
  if (forms.size() == 1) return wrap(forms[0]);
  return fastest_of(std::move(forms), key, threads);
}

// softmax of scale * x along ``axis`` into out (an attention's 1 / sqrt(d) absorbed): ATen's,
// and along the last axis an own AVX-512 (or, without it, AVX2) form (rows split over the
// threads), the faster by timing (ATen's took BERT's 128-wide attention rows 1.7x as long as
// ONNX Runtime's on one thread)
ffi::Function Softmax(ffi::Tensor out_t, ffi::Tensor x_t, int64_t axis, double scale,
                      int64_t threads) {
  View out = to_view(out_t), x = to_view(x_t);
  check_softmax(out, x, axis);
  Form aten = deferred(
      [=](const AtenForms& forms) { return forms.softmax(out, x, axis, scale, threads); });
#ifdef PARAGRAPH_AVX512
  const int64_t last = x.dim() - 1;
  if ((own_avx512() || own_avx2()) && x.dim() >= 1 && (axis == last || axis == -1) &&
      x.size(last) > 0 && plain_float(x) && plain_float(out) && out.sizes() == x.sizes()) {
    const int64_t n = x.size(last), rows = x.numel() / n;
    // the views hold TVM's buffers alive as long as the form
    const float s = static_cast<float>(scale);
    const bool wide = own_avx512();  // else the AVX2 twin (ATen's alone ran before)
    auto own = [x, out, rows, n, s, wide](int64_t team) -> Form {
      return [x, out, rows, n, s, team, wide]() {
        const float* src = x.data_ptr<float>();
        float* dst = out.data_ptr<float>();
        split_rows(rows, rows * n * 4, team, [&](int64_t r0, int64_t r1) {
          if (wide)
            softmax_rows(src, dst, r0, r1, n, s);
          else
            softmax_rows_avx2(src, dst, r0, r1, n, s);
        });
      };
    };
    // and the own form on this thread alone: after a kernel that left the other threads
    // asleep (a TVM kernel), waking them cost more than the rows (137 against 39 us alone for
    // 12 x 128 rows of 128 on two threads)
    std::vector<Form> forms{own(threads), aten};
    if (threads > 1) forms.push_back(own(1));
    return fastest_of(forms, "softmax" + std::to_string(threads) + shape_key({x}), threads);
  }
#endif
  return single_form(aten, threads);
}

// layer norm over the last axis of x (+ res) into out. Two forms, the faster chosen by
// `Fastest`: ATen's add and norm (on the schedule's threads; the sum and the statistics in
// buffers of their own, allocated once), and, for contiguous float32 tensors of one shape,
// `layer_norm_avx512` (one thread, one pass; `layer_norm_avx2` without AVX-512): BERT's 64 x
// 1024 residual norms took 96 us each in the model with ATen's two kernels, where ONNX Runtime's
// fused one takes 37.
ffi::Function LayerNorm(ffi::Tensor out_t, ffi::Tensor x_t, ffi::Tensor gamma_t,
                        ffi::Tensor beta_t, ffi::Optional<ffi::Tensor> res_t, double eps,
                        int64_t threads) {
  View out = to_view(out_t), x = to_view(x_t), gamma = to_view(gamma_t), beta = to_view(beta_t);
  std::optional<View> res;
  if (res_t.has_value()) res = to_view(res_t.value());
  check_layer_norm(out, x, gamma, beta, res);
  Form aten = deferred([=](const AtenForms& forms) {
    return forms.layer_norm(out, x, gamma, beta, res, eps, threads);
  });
#ifdef PARAGRAPH_AVX512
  const bool fused_ok =
      (own_avx512() || own_avx2()) && x.dim() >= 1 && x.size(-1) > 0 && plain_float(x) &&
      plain_float(out) && plain_float(gamma) && plain_float(beta) && out.sizes() == x.sizes() &&
      gamma.numel() == x.size(-1) && beta.numel() == x.size(-1) &&
      (!res || (plain_float(*res) && res->sizes() == x.sizes()));
#else
  const bool fused_ok = false;
#endif
  if (!fused_ok) {
    return single_form(aten, threads);
  }
  const int64_t n = x.size(-1), rows = x.numel() / n;
  const float feps = static_cast<float>(eps);
  // the views hold TVM's buffers alive as long as the form
  Form fused = [x, res, gamma, beta, out, rows, n, feps]() {
#ifdef PARAGRAPH_AVX512
    (own_avx512() ? layer_norm_avx512 : layer_norm_avx2)(
        x.data_ptr<float>(), res ? res->data_ptr<float>() : nullptr, gamma.data_ptr<float>(),
        beta.data_ptr<float>(), out.data_ptr<float>(), rows, n, feps);
#endif
  };
  return fastest_of({fused, aten},
                    "layer_norm" + std::to_string(threads) + (res ? "res" : "") + shape_key({x}),
                    threads);
}

// Copy ``bytes`` from address ``src`` to ``dst`` (not overlapping) over the calling thread's
// OpenMP team of ``threads``, each thread a contiguous share of whole cache lines: the
// executor's copy of a model's input into its buffer, which on one thread took 60 us of a
// 1.1 ms MobileNetV3-small run (the image, 600 KB, cold in cache after a run)
void CopyBytes(int64_t dst, int64_t src, int64_t bytes, int64_t threads) {
  TVM_FFI_ICHECK(bytes >= 0 && threads >= 1) << "a copy of " << bytes << " bytes on "
                                              << threads << " threads";
  use_threads(threads);
  char* d = reinterpret_cast<char*>(dst);
  const char* s = reinterpret_cast<const char*>(src);
  const int64_t lines = (bytes + 63) / 64;
  parallel(threads, [&](int64_t t, int64_t nt) {
    const int64_t a = std::min(bytes, lines * t / nt * 64);
    const int64_t b = std::min(bytes, lines * (t + 1) / nt * 64);
    if (b > a) std::memcpy(d + a, s + a, static_cast<size_t>(b - a));
  });
}

// the keys of the packed weights held now, the own forms' and (where it is loaded) the ATen
// library's (address, packing, shape, strides, @threads): for tests of what is shared
ffi::Array<ffi::String> PackedKeys() {
  std::vector<std::string> keys = packed_keys<View>();
  if (const AtenForms* aten = aten_if_loaded())
    for (std::string& key : aten->packed_keys()) keys.push_back(std::move(key));
  ffi::Array<ffi::String> out;
  for (const std::string& key : keys) out.push_back(ffi::String(key));
  return out;
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_bind_team, BindTeam);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_copy_bytes, CopyBytes);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_choose_form, ChooseForm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_force_form, ForceForm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_most_forms, MostForms);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_chosen_forms, ChosenForms);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_timing_calls, TimingCalls);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_timing_kernels, TimingKernels);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_packed_keys, PackedKeys);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_set_aten_library, SetAtenLibrary);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_conv2d, Conv2d);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_linear, Linear);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_product, Product);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_concat, Concat);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_softmax, Softmax);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_pool2d, Pool2d);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_layer_norm, LayerNorm);
