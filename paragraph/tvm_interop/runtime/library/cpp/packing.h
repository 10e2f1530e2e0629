// Packed weights shared between kernels: one packed copy per weight buffer, packing and thread
// count, held while a binding holds it (`shared_packed`, `sweep_packed`), and their keys for tests
// (`packed_keys`; kernels.cc's `PackedKeys` exports both libraries'). Over a tensor type T: the
// own forms' Views (kernels.cc) and oneDNN's packed at::Tensors (aten_forms.cc), each library a
// cache of its own.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

// the calling thread's team size, which a packing is blocked for (ATen's count is OpenMP's)
inline int64_t team_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// oneDNN's packed weights, shared by every binding of the same weight buffer with the same
// packing: an RNN calls one matrix at every step, and a packed copy per call (the SRU: 30
// copies of 4 MB) put 120 MB between the cores and memory where 12 MB stayed in cache
// (4.8 ms a run against 1.6). Keyed by the buffer's address, shape and strides and the
// packing; each entry also holds the weight it was packed from, so while the entry lives no
// other weight can have that address. An entry no binding holds any more is swept.
template <typename T>
struct PackedCache {
  std::mutex mutex;
  std::map<std::string, std::pair<std::shared_ptr<const T>, T>> entries;  // packed, source

  // drop the entries no binding holds any more (mutex held)
  void sweep() {
    for (auto it = entries.begin(); it != entries.end();) {
      if (it->second.first.use_count() == 1) {
        it = entries.erase(it);
      } else {
        ++it;
      }
    }
  }
};

template <typename T>
PackedCache<T>& packed_cache() {
  static PackedCache<T> cache;
  return cache;
}

template <typename T>
void sweep_packed() {
  PackedCache<T>& cache = packed_cache<T>();
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.sweep();
}

// The key also holds the calling thread's thread count: oneDNN blocks a weight for the threads
// that will run it (the Python kernels saw 1-thread calls on a 2-thread blocking run 3x
// slower), and two kernels sharing a weight may run on different counts (`kernel_threads`).
template <typename T, typename Make>
std::shared_ptr<const T> shared_packed(const T& w, const std::string& packing, Make make) {
  std::string key = std::to_string(reinterpret_cast<uintptr_t>(w.data_ptr())) + packing;
  for (int64_t d : w.sizes()) key += "," + std::to_string(d);
  for (int64_t d : w.strides()) key += ";" + std::to_string(d);
  key += "@" + std::to_string(team_threads());
  PackedCache<T>& cache = packed_cache<T>();
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.sweep();
  auto found = cache.entries.find(key);
  if (found != cache.entries.end()) return found->second.first;
  auto packed = std::make_shared<const T>(make());
  cache.entries.emplace(key, std::make_pair(packed, w));
  return packed;
}

// A weight packed on its form's first call (`shared_packed` then): a form that never runs packs
// nothing. A kernel's forms each pack their own copy (oneDNN's blocks, the own panels, up to
// seven Winograd transforms, 4x a 3x3 weight each): packed at binding, ResNet-18's 45 MB of
// weights took 360 MB before the first run; a kernel bound with its form already chosen (an
// artifact's choices, `ChooseForm`) runs and packs that one only.
template <typename T>
struct LazyPacked {
  std::function<std::shared_ptr<const T>()> make;
  std::shared_ptr<const T> packed;
  std::once_flag once;

  const T& tensor() {
    std::call_once(once, [this]() {
      packed = make();
      make = nullptr;  // drops the source weight it held
    });
    return *packed;
  }
  float* data() { return tensor().template data_ptr<float>(); }
};

// the weight ``w`` packed as ``make`` does, shared (`shared_packed`), made on first use; ``make``
// must own what it reads (captured by value)
template <typename T, typename Make>
std::shared_ptr<LazyPacked<T>> lazy_packed(const T& w, std::string packing, Make make) {
  auto lazy = std::make_shared<LazyPacked<T>>();
  lazy->make = [w, packing = std::move(packing), make]() {
    return shared_packed(w, packing, make);
  };
  return lazy;
}

// the keys of the packed weights held now (address, packing, shape, strides, @threads): for
// tests of what is shared
template <typename T>
std::vector<std::string> packed_keys() {
  PackedCache<T>& cache = packed_cache<T>();
  std::lock_guard<std::mutex> lock(cache.mutex);
  std::vector<std::string> keys;
  for (const auto& entry : cache.entries) keys.push_back(entry.first);
  return keys;
}

}  // namespace
