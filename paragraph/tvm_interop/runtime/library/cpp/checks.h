// The entry points' checks of what they are given: every tensor's rank, sizes and dtype against
// the others and the call's parameters (a convolution's and a pool's output height and width
// from the input's, the window, stride, padding and dilation), before anything is bound. The
// own kernels read and write by these sizes with raw pointers, so a shape that does not follow
// would read or write outside a buffer; instead the call is refused with a ValueError that
// names the entry point and the mismatch (TVM FFI raises it in Python as a ValueError, which
// `runtime/library/native.py`'s `bind` turns into a `KernelShapeError`).
//
// Included only by kernels.cc, the kernels' translation unit: its definitions lie in
// kernels.cc's anonymous namespace, after those of the headers it includes.
#pragma once

#include "common.h"

namespace {

// "(1, 3, 224, 224) float": a tensor as a message shows it
std::string described(const View& t) {
  std::string text = "(";
  for (int64_t i = 0; i < t.dim(); ++i) text += (i ? ", " : "") + std::to_string(t.size(i));
  return text + (t.dim() == 1 ? ",) " : ") ") + std::string(dtype_name(t.scalar_type()));
}

// the sizes of a window's output along one axis: floor((in + pads - dilation (k - 1) - 1) /
// stride) + 1, or a negative count where the window does not fit the padded input once
int64_t window_outputs(int64_t in, int64_t pad_before, int64_t pad_after, int64_t k,
                       int64_t stride, int64_t dilation) {
  const int64_t span = in + pad_before + pad_after - dilation * (k - 1) - 1;
  return span < 0 ? -1 : span / stride + 1;
}

// refuse (ValueError, naming ``kernel``) unless ``ok``
#define PARAGRAPH_REQUIRE(ok, kernel, message)                                  \
  do {                                                                          \
    if (!(ok)) TVM_FFI_THROW(ValueError) << (kernel) << ": " << message;        \
  } while (0)

void check_rank(const char* kernel, const char* what, const View& t, int64_t rank) {
  PARAGRAPH_REQUIRE(t.dim() == rank, kernel,
                    what << " must have " << rank << " dimensions, got " << described(t));
}

void check_dtype(const char* kernel, const char* what, const View& t,
                 const View& like) {
  PARAGRAPH_REQUIRE(t.scalar_type() == like.scalar_type(), kernel,
                    what << " is " << described(t) << ", not of the output's dtype "
                         << dtype_name(like.scalar_type()));
}

void check_same_sizes(const char* kernel, const char* what, const View& t,
                      const View& like, const char* like_what) {
  PARAGRAPH_REQUIRE(t.sizes() == like.sizes(), kernel,
                    what << " " << described(t) << " does not match " << like_what << " "
                         << described(like));
}

// an operand of one element per channel (a bias, a pool's scale or shift, a norm's gamma or
// beta): ``count`` elements, one per ``each``
void check_per_channel(const char* kernel, const char* what, const View& t, int64_t count,
                       const char* each, const View& out) {
  PARAGRAPH_REQUIRE(t.numel() == count, kernel,
                    what << " " << described(t) << " has " << t.numel() << " elements, not "
                         << count << " (one per " << each << ")");
  check_dtype(kernel, what, t, out);
}

// the spatial sizes of a window's output: height ``oh`` and width ``ow`` of an input of height
// ``h`` and width ``w`` under the window, stride, padding (top, left, bottom, right) and
// dilation given
void check_window(const char* kernel, int64_t h, int64_t w, int64_t oh, int64_t ow,
                  int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                  const std::array<int64_t, 4>& pads, int64_t dh, int64_t dw) {
  PARAGRAPH_REQUIRE(kh >= 1 && kw >= 1, kernel, "the window is " << kh << " x " << kw);
  PARAGRAPH_REQUIRE(sh >= 1 && sw >= 1, kernel, "the stride is " << sh << " x " << sw);
  PARAGRAPH_REQUIRE(dh >= 1 && dw >= 1, kernel, "the dilation is " << dh << " x " << dw);
  PARAGRAPH_REQUIRE(pads[0] >= 0 && pads[1] >= 0 && pads[2] >= 0 && pads[3] >= 0, kernel,
                    "the padding (top, left, bottom, right) is (" << pads[0] << ", " << pads[1]
                        << ", " << pads[2] << ", " << pads[3] << ")");
  const int64_t want_h = window_outputs(h, pads[0], pads[2], kh, sh, dh);
  const int64_t want_w = window_outputs(w, pads[1], pads[3], kw, sw, dw);
  PARAGRAPH_REQUIRE(want_h >= 1 && want_w >= 1, kernel,
                    "a " << kh << " x " << kw << " window (dilation " << dh << " x " << dw
                         << ") does not fit the " << h << " x " << w << " input padded by ("
                         << pads[0] << ", " << pads[1] << ", " << pads[2] << ", " << pads[3]
                         << ")");
  PARAGRAPH_REQUIRE(oh == want_h && ow == want_w, kernel,
                    "the output is " << oh << " x " << ow << ", but a " << h << " x " << w
                         << " input with a " << kh << " x " << kw << " window, stride " << sh
                         << " x " << sw << ", padding (" << pads[0] << ", " << pads[1] << ", "
                         << pads[2] << ", " << pads[3] << ") and dilation " << dh << " x " << dw
                         << " gives " << want_h << " x " << want_w);
}

// a convolution: x, w and out as logical NCHW / OIHW views (whatever the buffers' layout),
// params as the entry point takes them (stride, padding 2 or 4, dilation, groups)
void check_conv2d(const View& out, const View& x, const View& w,
                  const std::optional<View>& bias, const std::optional<View>& res,
                  const std::vector<int64_t>& p) {
  const char* kernel = "paragraph_vendor_conv2d";
  PARAGRAPH_REQUIRE(p.size() == 7 || p.size() == 9, kernel,
                    "7 or 9 parameters (stride 2, padding 2 or 4, dilation 2, groups), got "
                        << p.size());
  check_rank(kernel, "the input", x, 4);
  check_rank(kernel, "the weight", w, 4);
  check_rank(kernel, "the output", out, 4);
  check_dtype(kernel, "the input", x, out);
  check_dtype(kernel, "the weight", w, out);
  const bool four = p.size() == 9;
  const std::array<int64_t, 4> pads = four ? std::array<int64_t, 4>{p[2], p[3], p[4], p[5]}
                                           : std::array<int64_t, 4>{p[2], p[3], p[2], p[3]};
  const size_t at_dil = four ? 6 : 4;
  const int64_t groups = p[at_dil + 2];
  const int64_t n = x.size(0), c = x.size(1), o = w.size(0);
  PARAGRAPH_REQUIRE(groups >= 1 && c % groups == 0 && o % groups == 0, kernel,
                    groups << " groups do not divide the input's " << c << " and the weight's "
                           << o << " channels");
  PARAGRAPH_REQUIRE(w.size(1) * groups == c, kernel,
                    "the weight " << described(w) << " (OIHW) takes " << w.size(1) * groups
                                  << " input channels in " << groups << " group(s); the input "
                                  << described(x) << " (NCHW) has " << c);
  PARAGRAPH_REQUIRE(out.size(0) == n && out.size(1) == o, kernel,
                    "the output " << described(out) << " (NCHW) must have batch " << n
                                  << " and the weight's " << o << " channels");
  check_window(kernel, x.size(2), x.size(3), out.size(2), out.size(3), w.size(2), w.size(3),
               p[0], p[1], pads, p[at_dil], p[at_dil + 1]);
  if (bias) check_per_channel(kernel, "the bias", *bias, o, "output channel", out);
  if (res) {
    check_same_sizes(kernel, "the residual", *res, out, "the output");
    check_dtype(kernel, "the residual", *res, out);
  }
}

// (..., K) @ W (K, N) into (..., N): every dimension of the output but the last the input's
void check_linear(const char* kernel, const View& out, const View& a,
                  const View& w, const std::optional<View>& bias) {
  check_rank(kernel, "the weight", w, 2);
  PARAGRAPH_REQUIRE(a.dim() >= 1 && out.dim() == a.dim(), kernel,
                    "the input " << described(a) << " and the output " << described(out)
                                 << " must have one rank, at least 1");
  check_dtype(kernel, "the input", a, out);
  check_dtype(kernel, "the weight", w, out);
  const int64_t k = w.size(0), n = w.size(1);
  PARAGRAPH_REQUIRE(a.size(-1) == k, kernel,
                    "the input " << described(a) << " has " << a.size(-1)
                                 << " columns; the weight " << described(w) << " takes " << k);
  PARAGRAPH_REQUIRE(out.size(-1) == n, kernel,
                    "the output " << described(out) << " has " << out.size(-1)
                                  << " columns; the weight " << described(w) << " gives " << n);
  for (int64_t i = 0; i + 1 < a.dim(); ++i)
    PARAGRAPH_REQUIRE(out.size(i) == a.size(i), kernel,
                      "the output " << described(out) << " and the input " << described(a)
                                    << " differ in dimension " << i);
  if (bias) check_per_channel(kernel, "the bias", *bias, n, "output column", out);
}

// a product of two activations: (..., K) @ (K, N) (then as a linear layer), or (B..., M, K)
// @ (B..., K, N) into (B..., M, N) with the same batch dimensions
void check_product(const View& out, const View& a, const View& b,
                   const std::optional<View>& bias) {
  const char* kernel = "paragraph_vendor_product";
  if (b.dim() == 2) {
    check_linear(kernel, out, a, b, bias);
    return;
  }
  PARAGRAPH_REQUIRE(!bias, kernel, "a batched product takes no bias");
  PARAGRAPH_REQUIRE(b.dim() >= 3 && a.dim() == b.dim() && out.dim() == b.dim(), kernel,
                    "a batched product takes operands and an output of one rank, at least 3: "
                        << described(a) << " @ " << described(b) << " into " << described(out));
  check_dtype(kernel, "the left operand", a, out);
  check_dtype(kernel, "the right operand", b, out);
  const int64_t r = a.dim();
  for (int64_t i = 0; i + 2 < r; ++i)
    PARAGRAPH_REQUIRE(a.size(i) == b.size(i) && out.size(i) == a.size(i), kernel,
                      "batch dimension " << i << " differs: " << described(a) << " @ "
                                         << described(b) << " into " << described(out));
  PARAGRAPH_REQUIRE(a.size(r - 1) == b.size(r - 2), kernel,
                    described(a) << " @ " << described(b) << ": " << a.size(r - 1)
                                 << " columns against " << b.size(r - 2) << " rows");
  PARAGRAPH_REQUIRE(out.size(r - 2) == a.size(r - 2) && out.size(r - 1) == b.size(r - 1),
                    kernel,
                    "the output " << described(out) << " is not " << a.size(r - 2) << " x "
                                  << b.size(r - 1) << " per batch");
}

// parts joined along ``axis`` (negative: from the end) into out
void check_concat(const View& out, const std::vector<View>& parts, int64_t axis) {
  const char* kernel = "paragraph_vendor_concat";
  PARAGRAPH_REQUIRE(!parts.empty(), kernel, "nothing to join");
  PARAGRAPH_REQUIRE(axis >= -out.dim() && axis < out.dim(), kernel,
                    "axis " << axis << " of the output " << described(out));
  const int64_t at_axis = axis < 0 ? axis + out.dim() : axis;
  int64_t total = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const View& part = parts[i];
    const std::string what = "part " + std::to_string(i);
    PARAGRAPH_REQUIRE(part.dim() == out.dim(), kernel,
                      what << " " << described(part) << " and the output " << described(out)
                           << " differ in rank");
    check_dtype(kernel, what.c_str(), part, out);
    for (int64_t d = 0; d < out.dim(); ++d)
      PARAGRAPH_REQUIRE(d == at_axis || part.size(d) == out.size(d), kernel,
                        what << " " << described(part) << " differs from the output "
                             << described(out) << " in dimension " << d << ", not the axis "
                             << at_axis);
    total += part.size(at_axis);
  }
  PARAGRAPH_REQUIRE(total == out.size(at_axis), kernel,
                    "the parts join to " << total << " along axis " << at_axis
                                         << "; the output " << described(out) << " has "
                                         << out.size(at_axis));
}

void check_softmax(const View& out, const View& x, int64_t axis) {
  const char* kernel = "paragraph_vendor_softmax";
  PARAGRAPH_REQUIRE(x.dim() >= 1 && axis >= -x.dim() && axis < x.dim(), kernel,
                    "axis " << axis << " of the input " << described(x));
  check_same_sizes(kernel, "the output", out, x, "the input");
  check_dtype(kernel, "the input", x, out);
}

// a pool on NHWC buffers; params: window (2), stride (2), padding (top, left, bottom, right)
void check_pool2d(const View& out, const View& x, const std::vector<int64_t>& p,
                  const std::optional<View>& scale, const std::optional<View>& shift) {
  const char* kernel = "paragraph_vendor_pool2d";
  PARAGRAPH_REQUIRE(p.size() == 8, kernel,
                    "8 parameters (window 2, stride 2, padding 4), got " << p.size());
  check_rank(kernel, "the input", x, 4);
  check_rank(kernel, "the output", out, 4);
  check_dtype(kernel, "the input", x, out);
  PARAGRAPH_REQUIRE(out.size(0) == x.size(0) && out.size(3) == x.size(3), kernel,
                    "the output " << described(out) << " (NHWC) must have the input's "
                                  << described(x) << " batch and channels");
  check_window(kernel, x.size(1), x.size(2), out.size(1), out.size(2), p[0], p[1], p[2], p[3],
               {p[4], p[5], p[6], p[7]}, 1, 1);
  PARAGRAPH_REQUIRE(scale.has_value() == shift.has_value(), kernel,
                    "an epilogue takes a scale and a shift, or neither");
  if (scale) {
    check_per_channel(kernel, "the scale", *scale, out.size(3), "channel", out);
    check_per_channel(kernel, "the shift", *shift, out.size(3), "channel", out);
  }
}

void check_layer_norm(const View& out, const View& x, const View& gamma,
                      const View& beta, const std::optional<View>& res) {
  const char* kernel = "paragraph_vendor_layer_norm";
  PARAGRAPH_REQUIRE(x.dim() >= 1, kernel, "the input " << described(x) << " has no axis");
  check_same_sizes(kernel, "the output", out, x, "the input");
  check_dtype(kernel, "the input", x, out);
  check_per_channel(kernel, "gamma", gamma, x.size(-1), "element of the last axis", out);
  check_per_channel(kernel, "beta", beta, x.size(-1), "element of the last axis", out);
  if (res) {
    check_same_sizes(kernel, "the residual", *res, x, "the input");
    check_dtype(kernel, "the residual", *res, out);
  }
}

#undef PARAGRAPH_REQUIRE

}  // namespace
