// Packed weights shared between kernels: one packed copy per weight buffer, packing and thread
// count, held while a binding holds it (`shared_packed`, `sweep_packed`), and their keys for tests
// (`PackedKeys`, exported by kernels.cc).
//
// Included only by kernels.cc, the one translation unit of the kernels: its definitions lie in
// kernels.cc's anonymous namespace, after those of the headers it includes.
#pragma once

#include "common.h"

namespace {

// oneDNN's packed weights, shared by every binding of the same weight buffer with the same
// packing: an RNN calls one matrix at every step, and a packed copy per call (the SRU: 30
// copies of 4 MB) put 120 MB between the cores and memory where 12 MB stayed in cache
// (4.8 ms a run against 1.6). Keyed by the buffer's address, shape and strides and the
// packing; each entry also holds the weight it was packed from, so while the entry lives no
// other weight can have that address. An entry no binding holds any more is swept.
std::mutex packed_mutex;
std::map<std::string, std::pair<at::Tensor, at::Tensor>> packed_weights;  // packed, source

// drop the entries no binding holds any more (packed_mutex held)
void sweep_packed() {
  for (auto it = packed_weights.begin(); it != packed_weights.end();) {
    if (it->second.first.use_count() == 1) {
      it = packed_weights.erase(it);
    } else {
      ++it;
    }
  }
}

// The key also holds the calling thread's thread count: oneDNN blocks a weight for the threads
// that will run it (the Python kernels saw 1-thread calls on a 2-thread blocking run 3x
// slower), and two kernels sharing a weight may run on different counts (`kernel_threads`).
template <typename Make>
at::Tensor shared_packed(const at::Tensor& w, const std::string& packing, Make make) {
  std::string key = std::to_string(reinterpret_cast<uintptr_t>(w.data_ptr())) + packing;
  for (int64_t d : w.sizes()) key += "," + std::to_string(d);
  for (int64_t d : w.strides()) key += ";" + std::to_string(d);
  key += "@" + std::to_string(at::get_num_threads());
  std::lock_guard<std::mutex> lock(packed_mutex);
  sweep_packed();
  auto found = packed_weights.find(key);
  if (found != packed_weights.end()) return found->second.first;
  at::Tensor packed = make();
  packed_weights.emplace(key, std::make_pair(packed, w));
  return packed;
}

// A weight packed on its form's first call (`shared_packed` then): a form that never runs packs
// nothing. A kernel's forms each pack their own copy (oneDNN's blocks, the own panels, up to
// seven Winograd transforms, 4x a 3x3 weight each): packed at binding, ResNet-18's 45 MB of
// weights took 360 MB before the first run; a kernel bound with its form already chosen (an
// artifact's choices, `ChooseForm`) runs and packs that one only.
struct LazyPacked {
  std::function<at::Tensor()> make;
  at::Tensor packed;
  std::once_flag once;

  const at::Tensor& tensor() {
    std::call_once(once, [this]() {
      packed = make();
      make = nullptr;  // drops the source weight it held
    });
    return packed;
  }
  float* data() { return tensor().data_ptr<float>(); }
};

// the weight ``w`` packed as ``make`` does, shared (`shared_packed`), made on first use; ``make``
// must own what it reads (captured by value)
template <typename Make>
std::shared_ptr<LazyPacked> lazy_packed(const at::Tensor& w, std::string packing, Make make) {
  auto lazy = std::make_shared<LazyPacked>();
  lazy->make = [w, packing = std::move(packing), make]() {
    return shared_packed(w, packing, make);
  };
  return lazy;
}

// the keys of the packed weights held now (address, packing, shape, strides, @threads): for
// tests of what is shared
ffi::Array<ffi::String> PackedKeys() {
  std::lock_guard<std::mutex> lock(packed_mutex);
  ffi::Array<ffi::String> keys;
  for (const auto& entry : packed_weights) keys.push_back(ffi::String(entry.first));
  return keys;
}

}  // namespace
