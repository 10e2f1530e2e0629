// The activations the kernels fuse after a convolution or product (`names.EPILOGUES`), by name
// (`Act`, `kActNames`): what both libraries agree on (an ATen form's activation is named by one),
// apart from activations.h's own implementations, which only kernels.cc takes.
#pragma once

#include <array>

namespace {

enum class Act {
  kNone,
  kRelu,
  kRelu6,
  kHardswish,
  kHardsigmoid,  // (the piecewise-linear ones first: see `in_registers`)
  kSigmoid,
  kSilu,
  kGelu,
  kGeluTanh
};

// the names, as `names.EPILOGUES` (and "" for none), in Act's order
constexpr std::array<const char*, 9> kActNames = {"",          "relu",    "relu6", "hardswish",
                                                  "hardsigmoid", "sigmoid", "silu",  "gelu",
                                                  "gelu_tanh"};

}  // namespace
