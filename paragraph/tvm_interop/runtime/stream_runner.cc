// paragraph's native CPU stream runner (built and loaded by paragraph/tvm_interop/runtime/native.py).
//
// Each executor worker calls `paragraph_stream_run` once per run for its stream and stays in C++
// (without the GIL) until the stream ends: kernels are called through TVM FFI, and a
// cross-stream wait spins on an atomic flag before sleeping on it (C++20 atomic wait, a futex on
// Linux). In Python, every blocking wait woke a sleeping thread and took the GIL back (25-30 us
// on the 2-core VM); spinning while the producer is still running removes both costs.
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace ffi = tvm::ffi;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

struct Step {
  ffi::Function fn{nullptr};  // undefined for a view
  std::vector<ffi::Any> args;
  std::vector<ffi::AnyView> views;  // over args, what CallPacked takes
  std::vector<int32_t> waits;      // flag slots to wait for
  int32_t signal;                  // flag slot to set after the step, or -1
};

// Flag states: 0 not done, 2 not done and a waiter sleeps on it, 1 done.
struct Program {
  std::vector<std::vector<Step>> streams;
  std::unique_ptr<std::atomic<int32_t>[]> flags;
  int64_t num_flags = 0;
  int64_t spin_ns = 0;
  std::atomic<int32_t> abort{0};
  std::vector<std::vector<int64_t>> times;  // per stream: start, end of every step
  std::vector<std::string> errors;  // per stream: why it failed, or ""

  void set(int32_t slot) {
    if (flags[slot].exchange(1, std::memory_order_release) == 2) flags[slot].notify_all();
  }

  void wait(int32_t slot) {
    std::atomic<int32_t>& flag = flags[slot];
    if (flag.load(std::memory_order_acquire) == 1) return;
    int64_t start = now_ns();
    for (uint32_t i = 1; flag.load(std::memory_order_acquire) != 1; ++i) {
      cpu_relax();
      if ((i & 63) == 0 && now_ns() - start > spin_ns) {
        int32_t expected = 0;
        flag.compare_exchange_strong(expected, 2, std::memory_order_acq_rel);
        for (int32_t v; (v = flag.load(std::memory_order_acquire)) != 1;) flag.wait(v);
        return;
      }
    }
  }

  void stop() {
    abort.store(1, std::memory_order_release);
    for (int64_t i = 0; i < num_flags; ++i) set(static_cast<int32_t>(i));
  }
};

Program* get(int64_t handle) { return reinterpret_cast<Program*>(handle); }

// streams: per stream, per step [fn or None, [args], [wait slots], signal slot or -1].
int64_t Build(ffi::Array<ffi::Array<ffi::Array<ffi::Any>>> streams, int64_t num_flags,
              int64_t spin_ns) {
  auto program = std::make_unique<Program>();
  program->num_flags = num_flags;
  program->spin_ns = spin_ns;
  program->flags = std::make_unique<std::atomic<int32_t>[]>(num_flags > 0 ? num_flags : 1);
  for (const auto& stream : streams) {
    std::vector<Step> steps;
    for (const auto& item : stream) {
      Step step;
      if (item[0] != nullptr) step.fn = item[0].cast<ffi::Function>();  // checked once, here
      for (const ffi::Any& a : item[1].cast<ffi::Array<ffi::Any>>()) step.args.push_back(a);
      for (const ffi::Any& a : step.args) step.views.emplace_back(a);
      for (int64_t w : item[2].cast<ffi::Array<int64_t>>()) {
        TVM_FFI_ICHECK(w >= 0 && w < num_flags) << "wait slot out of range";
        step.waits.push_back(static_cast<int32_t>(w));
      }
      int64_t signal = item[3].cast<int64_t>();
      TVM_FFI_ICHECK(signal >= -1 && signal < num_flags) << "signal slot out of range";
      step.signal = static_cast<int32_t>(signal);
      steps.push_back(std::move(step));
    }
    program->times.emplace_back(2 * steps.size(), 0);
    program->errors.emplace_back();
    program->streams.push_back(std::move(steps));
  }
  return reinterpret_cast<int64_t>(program.release());
}

void Reset(int64_t handle) {
  Program* p = get(handle);
  for (int64_t i = 0; i < p->num_flags; ++i) p->flags[i].store(0, std::memory_order_relaxed);
  p->abort.store(0, std::memory_order_release);
  for (std::string& e : p->errors) e.clear();
}

// Runs stream s; returns -1 when it finished, the index of its failing step (then `Error` says
// why and every other stream stops), or -2 when it stopped because of another stream or `Abort`.
int64_t Run(int64_t handle, int64_t s, bool profile) {
  Program* p = get(handle);
  std::vector<Step>& steps = p->streams.at(s);
  std::vector<int64_t>& times = p->times[s];
  for (size_t i = 0; i < steps.size(); ++i) {
    Step& step = steps[i];
    for (int32_t w : step.waits) p->wait(w);
    if (p->abort.load(std::memory_order_acquire)) return -2;
    if (step.fn.defined()) {
      if (profile) times[2 * i] = now_ns();
      try {
        ffi::Any result;
        step.fn.CallPacked(step.views.data(), static_cast<int32_t>(step.views.size()), &result);
      } catch (const ffi::Error& e) {
        p->errors[s] = e.kind() + ": " + e.message();
        p->stop();
        return static_cast<int64_t>(i);
      } catch (const std::exception& e) {
        p->errors[s] = std::string("error: ") + e.what();
        p->stop();
        return static_cast<int64_t>(i);
      }
      if (profile) times[2 * i + 1] = now_ns();
    }
    if (step.signal >= 0) p->set(step.signal);
  }
  return -1;
}

void Abort(int64_t handle) { get(handle)->stop(); }

ffi::String Error(int64_t handle, int64_t s) { return ffi::String(get(handle)->errors.at(s)); }

ffi::Array<int64_t> Times(int64_t handle, int64_t s) {
  const std::vector<int64_t>& t = get(handle)->times.at(s);
  return ffi::Array<int64_t>(t.begin(), t.end());
}

void Free(int64_t handle) { delete get(handle); }

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_stream_build, Build);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_stream_reset, Reset);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_stream_run, Run);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_stream_abort, Abort);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_stream_error, Error);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_stream_times, Times);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_stream_free, Free);
