// paragraph's CPU vendor kernels called from C++: the same PyTorch (oneDNN / MKL) calls as
// `vendor/runtime.py`'s bound kernels, bound once to TVM's buffers and returned as TVM FFI
// functions, so that the native stream runner calls them without the GIL. In Python every
// vendor call took the GIL twice (on entry and after the torch call) with several
// microseconds of Python around the kernel, and on two concurrent streams small kernels
// queued for it (RandWire: streams busy 40% longer than their kernels alone). Beside those
// calls, kernels of paragraph's own where the library's were slower (AVX-512, each chosen per
// shape by timing): a GEMM with a fused epilogue for 1x1 convolutions and linear layers, other
// convolutions as an implicit GEMM on its tiles, stride-1 3x3, 5x5, 1x7 and 1x3 ones (and
// the transposes) also by Winograd's minimal filtering on the same tiles, depthwise convolutions,
// a one-pass layer norm, concatenation and pools.
//
// Built by `vendor/native.py` with the system C++ compiler against PyTorch's and TVM FFI's
// headers; loaded with `tvm_ffi.load_module`.
#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
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
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ffi = tvm::ffi;

namespace {

// timed calls per form before choosing (the first is discarded); `measure.SETTLE_RUNS` warms a
// program up past them (up to six forms: 30 calls; `TimingCalls` says how many this process's
// kernels need)
constexpr int kTrials = 4;
constexpr double kMargin = 0.97;  // a later form's median against the earlier best's

at::Tensor to_aten(const ffi::Tensor& t) {
  // a torch view of TVM's buffer: the DLPack capsule keeps the TVM tensor alive
  return at::fromDLPack(t.ToDLPack());
}

at::Tensor nchw(const at::Tensor& t) { return t.permute({0, 3, 1, 2}); }  // NHWC -> NCHW view

void use_threads(int64_t n) {
  if (at::get_num_threads() != n) at::set_num_threads(static_cast<int>(n));
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

using Form = std::function<void()>;

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

std::string ints(const std::vector<int64_t>& v) {
  std::string out = "/";
  for (int64_t x : v) out += std::to_string(x) + ",";
  return out;
}

// forms chosen once per (kernel, shapes, threads) in the process: executors bound later start
// with the choice (as `runtime._CHOSEN`)
std::mutex chosen_mutex;
std::map<std::string, int> chosen_forms;

// the kernels alive that have not chosen their form yet (see `TimingKernels`)
std::atomic<int64_t> timing_kernels{0};

// One kernel with several forms on the same buffers, in order of preference: the first calls
// alternate between them, timed, then the fastest by median runs, a later form only where it
// is 3% faster than the earlier ones (see `runtime._Fastest`).
struct Fastest {
  std::vector<Form> forms;
  std::string key;
  int64_t threads;
  int chosen = -1;
  std::vector<std::vector<double>> samples;
  bool timing = true;  // counted in timing_kernels until a form is chosen

  Fastest() { ++timing_kernels; }
  ~Fastest() {
    if (timing) --timing_kernels;
  }

  void operator()() {
    use_threads(threads);
    if (chosen < 0) {
      {
        std::lock_guard<std::mutex> lock(chosen_mutex);
        auto it = chosen_forms.find(key);  // a form another build chose may not exist here
        if (it != chosen_forms.end() && it->second < static_cast<int>(forms.size()))
          chosen = it->second;
      }
      if (chosen >= 0) keep_chosen();
    }
    if (chosen >= 0) {
      forms[chosen]();
      return;
    }
    if (samples.empty()) samples.resize(forms.size());
    size_t i = 0;
    for (size_t j = 1; j < samples.size(); ++j)
      if (samples[j].size() < samples[i].size()) i = j;
    auto start = std::chrono::steady_clock::now();
    forms[i]();
    samples[i].push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    for (const auto& s : samples)
      if (static_cast<int>(s.size()) <= kTrials) return;
    double best_time = 0;
    for (size_t j = 0; j < samples.size(); ++j) {
      std::vector<double> s(samples[j].begin() + 1, samples[j].end());
      std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
      // a later form must win by a margin: forms within the host's noise of each other were
      // chosen by it (BERT's 64 x 1024 x 4096 products took the own GEMM, 4% slower)
      if (chosen < 0 || s[s.size() / 2] < kMargin * best_time) {
        chosen = static_cast<int>(j);
        best_time = s[s.size() / 2];
      }
    }
    {
      std::lock_guard<std::mutex> lock(chosen_mutex);
      chosen_forms[key] = chosen;
    }
    keep_chosen();
  }

  // release the forms not chosen and the packed weights only they held: each form packs its
  // own copy of a weight (BERT's 384 MB of weights would be held three times over)
  void keep_chosen() {
    if (timing) {
      timing = false;
      --timing_kernels;
    }
    for (size_t j = 0; j < forms.size(); ++j)
      if (static_cast<int>(j) != chosen) forms[j] = Form();
    samples.clear();
    std::lock_guard<std::mutex> lock(packed_mutex);
    sweep_packed();
  }
};

std::string shape_key(const std::vector<at::Tensor>& ts) {
  std::string key;
  for (const at::Tensor& t : ts) {
    key += "(";
    for (int64_t d : t.sizes()) key += std::to_string(d) + ",";
    key += ")";
  }
  return key;
}

ffi::Function wrap(std::function<void()> body) {
  // torch's errors become TVM FFI errors, which the stream runner reports by kernel
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

// the most forms of any kernel bound in this process (see `TimingCalls`)
std::atomic<int64_t> most_forms{1};

// a kernel that runs the fastest of ``forms`` (see `Fastest`), chosen once per ``key`` (the
// form family, fusions and shapes)
ffi::Function fastest_of(std::vector<Form> forms, std::string key, int64_t threads) {
  for (int64_t seen = most_forms.load(), now = static_cast<int64_t>(forms.size());
       now > seen && !most_forms.compare_exchange_weak(seen, now);)
    continue;
  auto fastest = std::make_shared<Fastest>();
  fastest->forms = std::move(forms);
  fastest->threads = threads;
  fastest->key = std::move(key);
  return wrap([fastest]() { (*fastest)(); });
}

const c10::OperatorHandle& in_place_conv() {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(
      "mkldnn::_convolution_pointwise_", "binary");
  return op;
}

// out = act(conv(x, w) + bias + out), in place: out starts as zero or the residual
Form onednn_conv(at::Tensor out, at::Tensor x, at::Tensor packed, c10::optional<at::Tensor> bias,
                 c10::optional<at::Tensor> res, std::vector<int64_t> padding,
                 std::vector<int64_t> stride, std::vector<int64_t> dilation, int64_t groups,
                 std::vector<int64_t> pre_pad, std::string act, at::Tensor out_buffer) {
  return [=]() {
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
    stack.emplace_back(packed);
    stack.emplace_back(bias ? c10::IValue(*bias) : c10::IValue());
    stack.emplace_back(padding);
    stack.emplace_back(stride);
    stack.emplace_back(dilation);
    stack.emplace_back(groups);
    stack.emplace_back(std::string("add"));
    stack.emplace_back(c10::IValue());
    stack.emplace_back(act.empty() ? c10::IValue() : c10::IValue(act));
    stack.emplace_back(c10::List<c10::optional<at::Scalar>>());
    stack.emplace_back(c10::IValue());
    in_place_conv().callBoxed(&stack);
  };
}

void activate(at::Tensor& o, const std::string& act);

// rows @ weight (+ bias) into out2, then the residual and the activation, in place (MKL);
// where out2 is the residual's own buffer, the product is added to it (GEMM's beta = 1)
Form gemm(at::Tensor out2, at::Tensor rows, at::Tensor weight, c10::optional<at::Tensor> bias,
          c10::optional<at::Tensor> res2, std::string act) {
  if (res2 && res2->data_ptr() == out2.data_ptr()) {
    return [=]() {
      at::Tensor o = out2;
      o.addmm_(rows, weight);
      if (bias) o.add_(*bias);
      activate(o, act);
    };
  }
  return [=]() {
    at::Tensor o = out2;
    if (bias) {
      at::addmm_out(o, *bias, rows, weight);
    } else {
      at::mm_out(o, rows, weight);
    }
    if (res2) o.add_(*res2);
    activate(o, act);
  };
}

// a contiguous float32 CPU tensor: what the AVX-512 kernels read and write
bool plain_float(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu();
}

// share(t, nt) for each thread t of a team of ``threads`` OpenMP threads (nt as OpenMP gave);
// share(0, 1) on the calling thread alone for one thread or a build without OpenMP (the
// `vendor.native` build warned)
template <typename Share>
void parallel(int64_t threads, const Share& share) {
#ifdef _OPENMP
  if (threads > 1) {
#pragma omp parallel num_threads(static_cast<int>(threads))
    share(omp_get_thread_num(), omp_get_num_threads());
    return;
  }
#endif
  share(0, 1);
}

// rows(r0, r1) over [0, total), split evenly over ``threads`` threads where the work
// (``bytes`` of output) is worth a parallel region: below ~64 KB one costs more than it saves
template <typename Rows>
void split_rows(int64_t total, int64_t bytes, int64_t threads, const Rows& rows) {
  if (!(total >= threads && bytes >= (int64_t{64} << 10))) threads = 1;
  parallel(threads, [&](int64_t t, int64_t nt) { rows(total * t / nt, total * (t + 1) / nt); });
}

// share t of nt of a grid of panels x tiles taken panel by panel, as range(q0, q1, p0, p1)
// calls over tiles [q0, q1) of panels [p0, p1): every share the same number of tiles, where
// whole panels each split 2:3 (Inception-v3's 160-channel convolutions: five panels) and
// scaled 1.46x on two threads
template <typename Range>
void panel_share(int64_t panels, int64_t tiles, int64_t t, int64_t nt, const Range& range) {
  int64_t f0 = panels * tiles * t / nt;
  const int64_t f1 = panels * tiles * (t + 1) / nt;
  if (f0 % tiles != 0 && f0 < f1) {  // the end of a panel begun by the share before
    const int64_t p = f0 / tiles, end = std::min(f1, (p + 1) * tiles);
    range(f0 - p * tiles, end - p * tiles, p, p + 1);
    f0 = end;
  }
  if (f1 / tiles > f0 / tiles) range(0, tiles, f0 / tiles, f1 / tiles);  // whole panels
  if (f1 % tiles != 0 && f1 / tiles * tiles >= f0)  // the start of one the next share ends
    range(0, f1 % tiles, f1 / tiles, f1 / tiles + 1);
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

#ifdef PARAGRAPH_AVX512
// paragraph's own GEMM for a product by a constant matrix (an NHWC 1x1 convolution, a linear
// layer): out = act(a @ W + bias + res), the epilogue applied to each 12 x 32 tile while it is
// in registers. MKL's SGEMM (which packs W on every call) ran ResNet-50's and NASNet's 1x1
// convolutions 7-30% slower than ONNX Runtime's on one thread and scaled worse on two (MKL
// 1.7-1.9x, this 1.9-2.0x); its epilogue was one or two more passes over the output. W is packed
// once into panels of 32 columns ([panel][k][32], zero-padded); a 12-row tile accumulates
// over all of K in 24 registers. Threads split the panels where W is the larger operand, else
// the rows (each thread reads all of the other operand: ResNet-50's 56x56 256 -> 64 1x1
// convolution split by panels read its 3 MB input twice and ran no faster on two threads than
// on one); with W small enough to stay in L2 the tiles go row block by row block (each block
// of a read once), else panel by panel (each panel read once, the next one prefetched).
constexpr int64_t kNR = 32, kMR = 12, kKC = 1024;
// packed weights up to this size stay in L2 across row blocks: the tiles go row block by row
// block (each block of the input read once), larger ones panel by panel
constexpr int64_t kWeightInL2 = 256 << 10;

// element (n, k) of W at w[n * sn + k * sk], packed as above
at::Tensor pack_panels(const at::Tensor& w, int64_t n, int64_t k, int64_t sn, int64_t sk) {
  const int64_t panels = (n + kNR - 1) / kNR;
  at::Tensor packed = at::zeros({panels * k * kNR}, w.options().dtype(at::kFloat));
  const float* src = w.data_ptr<float>();
  float* dst = packed.data_ptr<float>();
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < k; ++i) dst[((j / kNR) * k + i) * kNR + j % kNR] = src[j * sn + i * sk];
  return packed;
}

// a share of the next panel to bring into L2 while a tile works on this one (panel by panel, W
// streams from memory: BERT's 16 MB products spent ~10% more than ONNX Runtime's waiting for
// it); each tile of a panel takes an even share, a line at a time as its K advances
struct Prefetch {
  const char* at = nullptr;
  int64_t lines = 0, credit = 0;

  // `steps` more of the tile's `total` steps are done: prefetch the lines that fall due
  // (`lines` spread evenly over the steps, without a division per step: it cost the own GEMM
  // ~10%)
  inline void step(int64_t total, int64_t steps) {
    for (credit += lines * steps; credit >= total; credit -= total, at += 64)
      _mm_prefetch(at, _MM_HINT_T1);
  }

  // all of the `floats` at `at` over one tile's steps
  static Prefetch whole(const float* at, int64_t floats) { return share(at, floats, 0, 1); }

  // tile `j` of `tiles` over a panel of `floats`, the next panel at `next` (none: null)
  static Prefetch share(const float* next, int64_t floats, int64_t j, int64_t tiles) {
    if (next == nullptr) return {};
    const int64_t lines = floats * 4 / 64, from = lines * j / tiles, to = lines * (j + 1) / tiles;
    return {reinterpret_cast<const char*>(next) + from * 64, to - from, 0};
  }
};

// the epilogue of a tile: bias, residual (read before the store: res may be c itself, a
// residual written in place), relu (max(0, v) keeps a NaN, as torch's relu), masked stores
template <int MR, int NV>
__attribute__((target("avx512f"))) inline void store_tile(
    const __m512* acc0, const __m512* acc1, float* c, int64_t ldc, int64_t ncols,
    const float* bias, const float* res, int64_t ldr, bool relu) {
  const __mmask16 m0 = tail_mask(ncols), m1 = tail_mask(std::max<int64_t>(ncols - 16, 0));
  const __m512 bias0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
  const __m512 bias1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
  const __m512 zero = _mm512_setzero_ps();
  for (int r = 0; r < MR; ++r) {
    __m512 v0 = _mm512_add_ps(acc0[r], bias0), v1 = _mm512_add_ps(acc1[r], bias1);
    if (res) {
      v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, res + r * ldr));
      v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, res + r * ldr + 16));
    }
    if (relu) {
      v0 = _mm512_max_ps(zero, v0);
      v1 = _mm512_max_ps(zero, v1);
    }
    _mm512_mask_storeu_ps(c + r * ldc, m0, v0);
    if (NV == 2) _mm512_mask_storeu_ps(c + r * ldc + 16, m1, v1);
  }
}

// the lines a tile's epilogue will write (and the residual's it will read), requested before
// its K loop, which hides their latency: from L3 (the model's 3 MB outputs) the epilogue waited
// on them at every tile, ~90 ns of a 56x56 64 -> 256 1x1 convolution's ~320 ns tiles, ~40 ns
// even from L2 (1x1 convolutions 3-10% faster alone, ResNet-50 2-3.6% in one process)
template <int MR, int NV>
__attribute__((always_inline)) inline void prefetch_epilogue(const float* c, int64_t ldc,
                                                             const float* res, int64_t ldr) {
  for (int r = 0; r < MR; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    if (NV == 2) _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16), _MM_HINT_T0);
    if (res && res != c) {  // in place, the residual's lines are the output's
      _mm_prefetch(reinterpret_cast<const char*>(res + r * ldr), _MM_HINT_T0);
      if (NV == 2) _mm_prefetch(reinterpret_cast<const char*>(res + r * ldr + 16), _MM_HINT_T0);
    }
  }
}

constexpr int kUnroll = 4;

// one K step of a tile: row r's value at[r][i] by the panel's row b
template <int MR, int NV>
__attribute__((target("avx512f,fma"), always_inline)) inline void fma_step(
    const float* const* at, int64_t i, const float* b, __m512* acc0, __m512* acc1) {
  const __m512 b0 = _mm512_loadu_ps(b);
  const __m512 b1 = NV == 2 ? _mm512_loadu_ps(b + 16) : b0;
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) {
    const __m512 av = _mm512_set1_ps(at[r][i]);
    acc0[r] = _mm512_fmadd_ps(av, b0, acc0[r]);
    if (NV == 2) acc1[r] = _mm512_fmadd_ps(av, b1, acc1[r]);
  }
}

// kc K steps of a tile (row r's values from at[r], the panel's rows from b), four at a time
// and then the rest one by one, the prefetch advanced once per four over the tile's `total`
// steps: the loop's own instructions took issue slots from the FMAs (4-7% of ResNet-50 and
// Inception-v3); a prefetch per step, not per convolution tap (a tap's share at once stalled
// the tile)
template <int MR, int NV>
__attribute__((target("avx512f,fma"), always_inline)) inline void accumulate(
    const float* const* at, int64_t kc, const float* b, Prefetch& pf, int64_t total,
    __m512* acc0, __m512* acc1) {
  int64_t i = 0;
  for (; i + kUnroll <= kc; i += kUnroll) {
    pf.step(total, kUnroll);
#pragma GCC unroll 4
    for (int u = 0; u < kUnroll; ++u) fma_step<MR, NV>(at, i + u, b + (i + u) * kNR, acc0, acc1);
  }
  for (; i < kc; ++i) {
    pf.step(total, 1);
    fma_step<MR, NV>(at, i, b + i * kNR, acc0, acc1);
  }
}

// one tile: MR rows of a (stride lda) by a panel of NV x 16 columns (ncols of them real), over
// k of K; a later share of K adds to what c holds (``more``), and only the last (``last``)
// applies the epilogue
template <int MR, int NV>
__attribute__((target("avx512f,fma"))) void gemm_tile(
    const float* __restrict__ a, int64_t lda, const float* __restrict__ b, int64_t k, float* c,
    int64_t ldc, int64_t ncols, const float* bias, const float* res, int64_t ldr, bool relu,
    Prefetch pf, bool more, bool last) {
  __m512 acc0[MR], acc1[MR];
  const __mmask16 m0 = tail_mask(ncols), m1 = tail_mask(std::max<int64_t>(ncols - 16, 0));
  for (int r = 0; r < MR; ++r) {
    acc0[r] = more ? _mm512_maskz_loadu_ps(m0, c + r * ldc) : _mm512_setzero_ps();
    acc1[r] = more && NV == 2 ? _mm512_maskz_loadu_ps(m1, c + r * ldc + 16) : _mm512_setzero_ps();
  }
  const float* at[MR];
  for (int r = 0; r < MR; ++r) at[r] = a + r * lda;
  if (last) prefetch_epilogue<MR, NV>(c, ldc, res, ldr);
  accumulate<MR, NV>(at, k, b, pf, k, acc0, acc1);
  if (last) return store_tile<MR, NV>(acc0, acc1, c, ldc, ncols, bias, res, ldr, relu);
  for (int r = 0; r < MR; ++r) {
    _mm512_mask_storeu_ps(c + r * ldc, m0, acc0[r]);
    if (NV == 2) _mm512_mask_storeu_ps(c + r * ldc + 16, m1, acc1[r]);
  }
}

// a convolution's tile: MR output pixels, pixel r's input at rows[r] (its window's origin),
// by a panel, accumulated over the kernel's taps (tap t: kc = cin inputs at rows[r] + taps[t],
// against the panel's next kc rows); pixels of different output rows may share a tile
template <int MR, int NV>
__attribute__((target("avx512f,fma"))) void conv_tile(
    const float* const* rows, const int64_t* taps, int64_t ntaps, int64_t kc,
    const float* __restrict__ b, float* c, int64_t ldc, int64_t ncols, const float* bias,
    const float* res, int64_t ldr, bool relu, Prefetch pf) {
  __m512 acc0[MR], acc1[MR];
  for (int r = 0; r < MR; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  prefetch_epilogue<MR, NV>(c, ldc, res, ldr);
  for (int64_t t = 0; t < ntaps; ++t, b += kc * kNR) {
    const float* at[MR];
    for (int r = 0; r < MR; ++r) at[r] = rows[r] + taps[t];
    accumulate<MR, NV>(at, kc, b, pf, ntaps * kc, acc0, acc1);
  }
  store_tile<MR, NV>(acc0, acc1, c, ldc, ncols, bias, res, ldr, relu);
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t,
                        const float*, const float*, int64_t, bool, Prefetch, bool, bool);
template <int NV, int... R>
constexpr std::array<TileFn, sizeof...(R)> tiles(std::integer_sequence<int, R...>) {
  return {&gemm_tile<R + 1, NV>...};
}
const auto kTiles1 = tiles<1>(std::make_integer_sequence<int, kMR>{});  // by rows - 1
const auto kTiles2 = tiles<2>(std::make_integer_sequence<int, kMR>{});

using ConvTileFn = void (*)(const float* const*, const int64_t*, int64_t, int64_t, const float*,
                            float*, int64_t, int64_t, const float*, const float*, int64_t, bool,
                            Prefetch);
template <int NV, int... R>
constexpr std::array<ConvTileFn, sizeof...(R)> conv_tiles(std::integer_sequence<int, R...>) {
  return {&conv_tile<R + 1, NV>...};
}
const auto kConvTiles1 = conv_tiles<1>(std::make_integer_sequence<int, kMR>{});
const auto kConvTiles2 = conv_tiles<2>(std::make_integer_sequence<int, kMR>{});

struct PackedGemm {
  const float *a, *packed, *bias, *res;
  float* c;
  int64_t m, k, n;
  bool relu;

  // rows [m0, m1) by panels [p0, p1)
  void range(int64_t m0, int64_t m1, int64_t p0, int64_t p1) const {
    // rows [r, r + 12) by panel p over K's [k0, k0 + kc)
    auto tile = [&](int64_t p, int64_t r, int64_t k0, int64_t kc, Prefetch pf) {
      const int64_t n0 = p * kNR, ncols = std::min(kNR, n - n0), rows = std::min(kMR, m1 - r);
      (ncols > 16 ? kTiles2 : kTiles1)[rows - 1](
          a + r * k + k0, k, packed + (p * k + k0) * kNR, kc, c + r * n + n0, n, ncols,
          bias ? bias + n0 : nullptr, res ? res + r * n + n0 : nullptr, n, relu, pf, k0 > 0,
          k0 + kc == k);
    };
    if (k * n * 4 <= kWeightInL2) {
      // W stays in L2; the next row block of a is brought in while this one works, a share
      // per panel (a 35x35 288->64 1x1 convolution ran 545 us with its input from memory,
      // 305 with it in cache)
      for (int64_t r = m0; r < m1; r += kMR) {
        const int64_t next = std::min(kMR, m1 - r - kMR);
        // the first row block brings in W: each tile the next panel (cold in a model, where
        // ~100 MB of weights pass between two calls), its last tile the next rows; later
        // blocks' tiles each a share of the next rows
        const float* rows = next > 0 ? a + (r + kMR) * k : nullptr;
        for (int64_t p = p0; p < p1; ++p) {
          Prefetch pf = r > m0      ? Prefetch::share(rows, next * k, p - p0, p1 - p0)
                        : p + 1 < p1 ? Prefetch::whole(packed + (p + 1) * k * kNR, k * kNR)
                                     : Prefetch::whole(rows, next * k);
          tile(p, r, 0, k, pf);
        }
      }
      return;
    }
    // panel by panel, each panel's share of K (kKC rows, 128 KB) at a time over every row
    // block, the next share prefetched; the rows' share of a stays in L2 across the panels
    // (with all of K at once, BERT's 64 x 4096 rows, a 512 KB panel and the next one filled
    // the 2 MB L2)
    const int64_t tiles = (m1 - m0 + kMR - 1) / kMR;
    const int64_t share = res == c ? k : kKC;  // c would hold partial sums over its residual
    for (int64_t k0 = 0; k0 < k; k0 += share) {
      const int64_t kc = std::min(share, k - k0);
      for (int64_t p = p0; p < p1; ++p) {
        const float* next = p + 1 < p1           ? packed + ((p + 1) * k + k0) * kNR
                            : k0 + kc < k ? packed + (p0 * k + k0 + kc) * kNR
                                                 : nullptr;
        const int64_t next_kc = p + 1 < p1 ? kc : std::min(share, k - k0 - kc);
        for (int64_t j = 0; j < tiles; ++j)
          tile(p, m0 + j * kMR, k0, kc, Prefetch::share(next, next_kc * kNR, j, tiles));
      }
    }
  }

  void operator()(int64_t threads) const {
    const int64_t panels = (n + kNR - 1) / kNR;
    // each thread reads all of what is not split: split W where it is the larger operand
    const bool by_panel = n > m;
    const int64_t blocks = (m + kMR - 1) / kMR;
    parallel(threads, [&](int64_t t, int64_t nt) {
      if (by_panel) {
        panel_share(panels, blocks, t, nt, [&](int64_t q0, int64_t q1, int64_t p0, int64_t p1) {
          range(q0 * kMR, std::min(m, q1 * kMR), p0, p1);
        });
      } else {
        range(blocks * t / nt * kMR, std::min(m, blocks * (t + 1) / nt * kMR), 0, panels);
      }
    });
  }
};

// the packed form of out2 = act(rows @ W + bias + res2), W's element (n, k) at
// w[n * sn + k * sk]; None where the CPU or the tensors do not allow it
c10::optional<Form> packed_gemm(at::Tensor out2, at::Tensor rows, const at::Tensor& w,
                                int64_t sn, int64_t sk, c10::optional<at::Tensor> bias,
                                c10::optional<at::Tensor> res2, std::string act,
                                int64_t threads) {
  const int64_t m = rows.size(0), k = rows.size(1), n = out2.size(1);
  if (!__builtin_cpu_supports("avx512f") || !plain_float(rows) || !plain_float(out2) ||
      w.scalar_type() != at::kFloat || (bias && !plain_float(*bias)) ||
      (res2 && !plain_float(*res2)) || m == 0 || k == 0)
    return c10::nullopt;
  at::Tensor packed = shared_packed(w, "panels", [&]() { return pack_panels(w, n, k, sn, sk); });
  const bool relu = act == "relu";
  return Form([=]() {
    PackedGemm{rows.data_ptr<float>(), packed.data_ptr<float>(),
               bias ? bias->data_ptr<float>() : nullptr, res2 ? res2->data_ptr<float>() : nullptr,
               out2.data_ptr<float>(), m, k, n, relu}(threads);
    if (!relu && !act.empty()) {
      at::Tensor o = out2;
      activate(o, act);
    }
  });
}
#endif

#ifdef PARAGRAPH_AVX512
// paragraph's own convolution (groups = 1, any kernel, stride, dilation and padding) on NHWC
// float32 buffers: out = act(conv + bias + res) as an implicit GEMM on the packed GEMM's tiles.
// The weight (cout, kh, kw, cin) is packed once into 32-column panels over K = kh * kw * cin;
// a tile is 12 consecutive output pixels (across rows and images), each tap a GEMM step over
// the kc inputs that lie side by side in NHWC where the pixel's window has that tap: a kernel
// row's kw * cin where the width is undilated, else one position's cin (no im2col).
// Padding is a zero-bordered copy of the input in a buffer of the calling thread (one pass over
// the input: oneDNN's form zero-fills the output and adds into it instead). oneDNN's 3x3 and
// 7x1 convolutions ran Inception-v3 and ResNet-50 7-9% slower than ONNX Runtime's on one
// thread and scaled worse on two (Xeon host).
struct ImplicitConv {
  const float *x, *packed, *bias, *res;  // x: the (padded) input, [n][hp][wp][cin]
  float* out;
  int64_t n, hp, wp, cin, oh, ow, cout, sh, sw;
  int64_t kc;                 // inputs per tap: a kernel row's (kw * cin, contiguous) or cin
  std::vector<int64_t> taps;  // each tap's offset into x from a pixel's window origin
  bool relu;

  // tiles [t0, t1) of kMR output pixels (image-major, row-major) by panels [p0, p1)
  void range(int64_t t0, int64_t t1, int64_t p0, int64_t p1) const {
    const int64_t k = kc * static_cast<int64_t>(taps.size()), pixels = n * oh * ow;
    const float* rows[kMR];
    int64_t at = -1;  // the tile whose pixels `rows` holds
    auto tile = [&](int64_t q, int64_t p, Prefetch pf) {
      const int64_t n0 = p * kNR, ncols = std::min(kNR, cout - n0);
      const int64_t q0 = q * kMR, count = std::min(kMR, pixels - q0);
      if (at != q) {  // one division per tile, not three per pixel: a stem's K is only 27
        int64_t img = q0 / (oh * ow), y = q0 / ow % oh, j = q0 % ow;
        for (int64_t r = 0; r < count; ++r) {
          rows[r] = x + ((img * hp + y * sh) * wp + j * sw) * cin;
          if (++j == ow) {
            j = 0;
            if (++y == oh) y = 0, ++img;
          }
        }
        at = q;
      }
      (ncols > 16 ? kConvTiles2 : kConvTiles1)[count - 1](
          rows, taps.data(), static_cast<int64_t>(taps.size()), kc, packed + p * k * kNR,
          out + q0 * cout + n0, cout, ncols, bias ? bias + n0 : nullptr,
          res ? res + q0 * cout + n0 : nullptr, cout, relu, pf);
    };
    if (k * cout * 4 <= kWeightInL2) {
      for (int64_t q = t0; q < t1; ++q)
        for (int64_t p = p0; p < p1; ++p)  // the first tile brings in W, as the GEMM's
          tile(q, p,
               q == t0 && p + 1 < p1 ? Prefetch::whole(packed + (p + 1) * k * kNR, k * kNR)
                                     : Prefetch{});
    } else {
      for (int64_t p = p0; p < p1; ++p) {
        const float* next = p + 1 < p1 ? packed + (p + 1) * k * kNR : nullptr;
        for (int64_t q = t0; q < t1; ++q)
          tile(q, p, Prefetch::share(next, k * kNR, q - t0, t1 - t0));
      }
    }
  }

  void operator()(int64_t threads) const {
    const int64_t panels = (cout + kNR - 1) / kNR, tiles = (n * oh * ow + kMR - 1) / kMR;
    const int64_t k = kc * static_cast<int64_t>(taps.size());
    const bool by_panel = k * cout > n * hp * wp * cin;
    parallel(threads, [&](int64_t t, int64_t nt) {
      if (by_panel) {
        panel_share(panels, tiles, t, nt, [&](int64_t q0, int64_t q1, int64_t p0, int64_t p1) {
          range(q0, q1, p0, p1);
        });
      } else {
        range(tiles * t / nt, tiles * (t + 1) / nt, 0, panels);
      }
    });
  }
};

// one row of w NHWC pixels of c channels at d from an NCHW image's row at s (channel planes
// ``plane`` apart): the model's input read where it lies, as ONNX Runtime's first convolution
// reorders it, instead of a transpose kernel before the convolution. Three channels (an RGB
// image) 16 pixels at a time: three loads, interleaved by two-source permutes into 48 floats
__attribute__((target("avx512f"))) void nhwc_row(float* d, const float* s, int64_t w,
                                                 int64_t c, int64_t plane) {
  int64_t j = 0;
  if (c == 3) {
    // output float o of a 48-float block is channel o % 3 of pixel o / 3; its index into
    // the pair (r, g) is pixel + 16 * channel, and b follows in a second permute
    alignas(64) int32_t i0[16], i1[16], i2[16];
    alignas(64) int32_t b0[16], b1[16], b2[16];
    for (int o = 0; o < 48; ++o) {
      const int pix = o / 3, ch = o % 3, lane = o % 16;
      int32_t* rg = o < 16 ? i0 : o < 32 ? i1 : i2;
      int32_t* bl = o < 16 ? b0 : o < 32 ? b1 : b2;
      rg[lane] = ch < 2 ? pix + 16 * ch : 0;   // r or g from the pair
      bl[lane] = ch == 2 ? 16 + pix : lane;    // b from the second source, else keep
    }
    const __m512i r0 = _mm512_load_si512(i0), r1 = _mm512_load_si512(i1),
                  r2 = _mm512_load_si512(i2), c0 = _mm512_load_si512(b0),
                  c1 = _mm512_load_si512(b1), c2 = _mm512_load_si512(b2);
    for (; j + 16 <= w; j += 16) {
      const __m512 r = _mm512_loadu_ps(s + j), g = _mm512_loadu_ps(s + plane + j),
                   b = _mm512_loadu_ps(s + 2 * plane + j);
      float* o = d + j * 3;
      _mm512_storeu_ps(o, _mm512_permutex2var_ps(_mm512_permutex2var_ps(r, r0, g), c0, b));
      _mm512_storeu_ps(o + 16,
                       _mm512_permutex2var_ps(_mm512_permutex2var_ps(r, r1, g), c1, b));
      _mm512_storeu_ps(o + 32,
                       _mm512_permutex2var_ps(_mm512_permutex2var_ps(r, r2, g), c2, b));
    }
  }
  for (; j < w; ++j)
    for (int64_t k = 0; k < c; ++k) d[j * c + k] = s[k * plane + j];
}

// the input with zero borders (top, left, bottom, right) in the calling thread's scratch
// buffer, rows copied over the team; the buffer lives as long as the thread (the stream). x is
// NHWC, contiguous or a view of a contiguous NCHW tensor (reordered as it is copied)
const float* padded_input(const at::Tensor& x, int64_t pt, int64_t pl, int64_t pb, int64_t pr,
                          int64_t threads) {
  thread_local std::vector<float> scratch;
  const int64_t n = x.size(0), h = x.size(1), w = x.size(2), c = x.size(3);
  const int64_t hp = h + pt + pb, wp = w + pl + pr;
  if (static_cast<int64_t>(scratch.size()) < n * hp * wp * c) scratch.resize(n * hp * wp * c);
  float* dst = scratch.data();
  const float* src = x.data_ptr<float>();
  const bool planes = !x.is_contiguous();  // checked by the caller: an NCHW tensor's view
  split_rows(n * hp, n * hp * wp * c * 4, threads, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t img = r / hp, y = r % hp - pt;
      float* d = dst + r * wp * c;
      if (y < 0 || y >= h) {
        std::memset(d, 0, wp * c * 4);
        continue;
      }
      std::memset(d, 0, pl * c * 4);
      if (planes) {
        nhwc_row(d + pl * c, src + img * c * h * w + y * w, w, c, h * w);
      } else {
        std::memcpy(d + pl * c, src + (img * h + y) * w * c, w * c * 4);
      }
      std::memset(d + (pl + w) * c, 0, pr * c * 4);
    }
  });
  return dst;
}

// x (NHWC sizes) is a view of a contiguous NCHW float32 CPU tensor
bool nchw_view(const at::Tensor& x) {
  return x.scalar_type() == at::kFloat && x.device().is_cpu() && x.dim() == 4 &&
         x.permute({0, 3, 1, 2}).is_contiguous();
}

// the own convolution's form where the CPU and the tensors allow it (see `ImplicitConv`), else
// None; pads: top, left, bottom, right
c10::optional<Form> own_conv(const at::Tensor& out_buffer, const at::Tensor& x_buffer,
                             const at::Tensor& w_buffer, c10::optional<at::Tensor> bias,
                             c10::optional<at::Tensor> res_buffer, int64_t sh, int64_t sw,
                             std::array<int64_t, 4> pads, int64_t dh, int64_t dw,
                             const std::string& act, int64_t threads) {
  const int64_t cin = x_buffer.size(3), cout = out_buffer.size(3);
  if (!__builtin_cpu_supports("avx512f") || !(plain_float(x_buffer) || nchw_view(x_buffer)) ||
      !plain_float(out_buffer) || w_buffer.scalar_type() != at::kFloat || w_buffer.dim() != 4 ||
      w_buffer.size(0) != cout || w_buffer.size(3) != cin ||
      out_buffer.size(0) != x_buffer.size(0) || (bias && !plain_float(*bias)) ||
      (res_buffer && !plain_float(*res_buffer)) || out_buffer.numel() == 0 || cin == 0)
    return c10::nullopt;
  const int64_t kh = w_buffer.size(1), kw = w_buffer.size(2), k = kh * kw * cin;
  // (cout, kh, kw, cin) is W's (n, k) at n * k + k: one packing shared with the 1x1 GEMM's
  at::Tensor packed = shared_packed(w_buffer, "panels",
                                    [&]() { return pack_panels(w_buffer, cout, k, k, 1); });
  const auto [pt, pl, pb, pr] = pads;
  // an NCHW input is reordered as it is copied, padding or not
  const bool padded = pt || pl || pb || pr || !x_buffer.is_contiguous();
  const int64_t hp = x_buffer.size(1) + pt + pb, wp = x_buffer.size(2) + pl + pr;
  ImplicitConv conv{nullptr, packed.data_ptr<float>(), bias ? bias->data_ptr<float>() : nullptr,
                    res_buffer ? res_buffer->data_ptr<float>() : nullptr,
                    out_buffer.data_ptr<float>(), x_buffer.size(0), hp, wp, cin,
                    out_buffer.size(1), out_buffer.size(2), cout, sh, sw, cin, {}, act == "relu"};
  // undilated along the width, a kernel row's inputs lie side by side in NHWC, as its weights
  // in K: one tap per row (a stem's 3 input channels: 7 taps of 21, not 49 of 3)
  if (dw == 1) conv.kc = kw * cin;
  for (int64_t ky = 0; ky < kh; ++ky)
    for (int64_t kx = 0; kx < (dw == 1 ? 1 : kw); ++kx)
      conv.taps.push_back((ky * dh * wp + kx * dw) * cin);
  return Form([conv, packed, x_buffer, out_buffer, bias, res_buffer, pads, padded, act,
               threads]() mutable {
    conv.x = padded ? padded_input(x_buffer, pads[0], pads[1], pads[2], pads[3], threads)
                    : x_buffer.data_ptr<float>();
    conv(threads);
    if (!act.empty() && act != "relu") {
      at::Tensor o = out_buffer;
      activate(o, act);
    }
  });
}

// the Winograd forms at -O3: their transforms loop over small arrays of vectors, which GCC
// at -O2 may keep rolled with the vectors on the stack (the softmax's such loops took 1.5x the
// time). In one process with the same forms: Inception-v3 1.075x on one thread and 1.073x on
// two, ResNet-50 1.025x and 1.013x; the whole file at -O3 ran NASNet-A mobile 4% slower on one
// thread, so only this part
#pragma GCC push_options
#pragma GCC optimize("O3")
// paragraph's own stride-1 convolutions by Winograd's minimal filtering on NHWC float32
// buffers: out = act(conv + bias + res). For a 3x3 kernel, F(m x m, 3x3): each m x m block of
// output pixels (a tile) comes from an a x a patch of the input (a = m + 2): the patch is
// transformed (B^T d B), each of its a * a positions multiplied by the transformed weight
// (G g G^T, once per weight) as a * a GEMMs over the input channels on the packed GEMM's tiles,
// and the products transformed back to the outputs (A^T m A) with the epilogue. F(2x2, 3x3): 16
// products of cin x cout per 4 output pixels against 36 for a direct convolution (2.25x fewer
// multiplies); F(4x4, 3x3): 36 per 16 (4x), with more rounding (see `F4x3`); a 5x5 kernel by
// F(2x2, 5x5), 36 per 4 against 100 (`F2x5`). A 1 x r or r x 1
// kernel the same way along its long axis, F(m, r) (Inception's 1x7 and 7x1: F(2, 7)). No
// library form here makes any of them (oneDNN and ONNX Runtime's MLAS run these convolutions
// as direct or implicit GEMMs: ResNet-50's 56x56 64 -> 64 ones ran 15-18% slower than ONNX
// Runtime's on one thread). The patches are read where they lie in the input (no padded copy);
// tiles go a block at a time, the block's transformed inputs and products in L2 between the
// three steps.
//
// The one-dimensional transforms (Lavin and Gray, "Fast Algorithms for Convolutional Neural
// Networks", 2016; Toom-Cook from the points named): F(2, 3)'s written out, the larger ones'
// as their matrices.
struct F2x3 {
  static constexpr int m = 2, r = 3, a = 4;
  static constexpr double G[a][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
  static constexpr const char* name = "winograd23";

  // r = B^T d
  __attribute__((target("avx512f"), always_inline)) static inline void input(const __m512* d,
                                                                              __m512* r) {
    r[0] = _mm512_sub_ps(d[0], d[2]);
    r[1] = _mm512_add_ps(d[1], d[2]);
    r[2] = _mm512_sub_ps(d[2], d[1]);
    r[3] = _mm512_sub_ps(d[1], d[3]);
  }

  // y = A^T p
  __attribute__((target("avx512f"), always_inline)) static inline void output(const __m512* p,
                                                                               __m512* y) {
    y[0] = _mm512_add_ps(_mm512_add_ps(p[0], p[1]), p[2]);
    y[1] = _mm512_sub_ps(_mm512_sub_ps(p[1], p[2]), p[3]);
  }
};

// out = mx in (R x A constant matrices: the compiler drops the zero entries' terms)
template <int R, int A>
__attribute__((target("avx512f,fma"), always_inline)) inline void apply_dense(
    const float (&mx)[R][A], const __m512* in, __m512* out) {
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
    __m512 acc = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int j = 0; j < A; ++j)
      if (mx[i][j] != 0) acc = _mm512_fmadd_ps(_mm512_set1_ps(mx[i][j]), in[j], acc);
    out[i] = acc;
  }
}

// F(4x4, 3x3) from the points 0, 1, -1, 2, -1/2 and infinity rather than Lavin's 0, +-1, +-2:
// in float32 its largest error over random 64-channel sums was 4.3e-6 of the output's
// magnitude against 1.6e-5 (a residual convolution of a small test network missed the
// outputs' 1e-4 by 17% with those)
struct F4x3 {
  static constexpr int m = 4, r = 3, a = 6;
  static constexpr double G[a][r] = {{1, 0, 0},
                                     {-1.0 / 3, -1.0 / 3, -1.0 / 3},
                                     {1.0 / 3, -1.0 / 3, 1.0 / 3},
                                     {1.0 / 15, 2.0 / 15, 4.0 / 15},
                                     {-16.0 / 15, 8.0 / 15, -4.0 / 15},
                                     {0, 0, 1}};
  static constexpr float BT[a][a] = {{1, 1.5f, -2, -1.5f, 1, 0},    {0, -1, -2.5f, -0.5f, 1, 0},
                                     {0, 1, 0.5f, -2.5f, 1, 0},     {0, -0.5f, -1, 0.5f, 1, 0},
                                     {0, 2, -1, -2, 1, 0},          {0, 1, 1.5f, -2, -1.5f, 1}};
  static constexpr float AT[m][a] = {{1, 1, 1, 1, 1, 0},
                                     {0, 1, -1, 2, -0.5f, 0},
                                     {0, 1, 1, 4, 0.25f, 0},
                                     {0, 1, -1, 8, -0.125f, 1}};
  static constexpr const char* name = "winograd43";

  __attribute__((target("avx512f,fma"), always_inline)) static inline void input(const __m512* d,
                                                                                  __m512* r) {
    apply_dense<a, a>(BT, d, r);
  }

  __attribute__((target("avx512f,fma"), always_inline)) static inline void output(const __m512* p,
                                                                                   __m512* y) {
    apply_dense<m, a>(AT, p, y);
  }
};

// F(2x2, 5x5) for Inception's 5x5 convolutions (36 products per 4 outputs against 100), from
// F(4x4, 3x3)'s points, so with its input transform
struct F2x5 {
  static constexpr int m = 2, r = 5, a = 6;
  static constexpr double G[a][r] = {{1, 0, 0, 0, 0},
                                     {-1.0 / 3, -1.0 / 3, -1.0 / 3, -1.0 / 3, -1.0 / 3},
                                     {1.0 / 3, -1.0 / 3, 1.0 / 3, -1.0 / 3, 1.0 / 3},
                                     {1.0 / 15, 2.0 / 15, 4.0 / 15, 8.0 / 15, 16.0 / 15},
                                     {-16.0 / 15, 8.0 / 15, -4.0 / 15, 2.0 / 15, -1.0 / 15},
                                     {0, 0, 0, 0, 1}};
  static constexpr float AT[m][a] = {{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -0.5f, 1}};
  static constexpr const char* name = "winograd25";

  __attribute__((target("avx512f,fma"), always_inline)) static inline void input(const __m512* d,
                                                                                  __m512* r) {
    apply_dense<a, a>(F4x3::BT, d, r);
  }

  __attribute__((target("avx512f,fma"), always_inline)) static inline void output(const __m512* p,
                                                                                   __m512* y) {
    apply_dense<m, a>(AT, p, y);
  }
};

// F(2, 7) for Inception's 1x7 and 7x1 convolutions (one-dimensional: 8 products per 2
// outputs against 14), from the points 0, +-1, +-2, +-1/2 and infinity
struct F2x7 {
  static constexpr int m = 2, r = 7, a = 8;
  static constexpr double G[a][r] = {
      {-1, 0, 0, 0, 0, 0, 0},
      {-2.0 / 9, -2.0 / 9, -2.0 / 9, -2.0 / 9, -2.0 / 9, -2.0 / 9, -2.0 / 9},
      {-2.0 / 9, 2.0 / 9, -2.0 / 9, 2.0 / 9, -2.0 / 9, 2.0 / 9, -2.0 / 9},
      {1.0 / 90, 1.0 / 45, 2.0 / 45, 4.0 / 45, 8.0 / 45, 16.0 / 45, 32.0 / 45},
      {1.0 / 90, -1.0 / 45, 2.0 / 45, -4.0 / 45, 8.0 / 45, -16.0 / 45, 32.0 / 45},
      {32.0 / 45, 16.0 / 45, 8.0 / 45, 4.0 / 45, 2.0 / 45, 1.0 / 45, 1.0 / 90},
      {32.0 / 45, -16.0 / 45, 8.0 / 45, -4.0 / 45, 2.0 / 45, -1.0 / 45, 1.0 / 90},
      {0, 0, 0, 0, 0, 0, 1}};
  static constexpr float BT[a][a] = {{-1, 0, 5.25f, 0, -5.25f, 0, 1, 0},
                                     {0, 1, 1, -4.25f, -4.25f, 1, 1, 0},
                                     {0, -1, 1, 4.25f, -4.25f, -1, 1, 0},
                                     {0, 0.5f, 0.25f, -2.5f, -1.25f, 2, 1, 0},
                                     {0, -0.5f, 0.25f, 2.5f, -1.25f, -2, 1, 0},
                                     {0, 2, 4, -2.5f, -5, 0.5f, 1, 0},
                                     {0, -2, 4, 2.5f, -5, -0.5f, 1, 0},
                                     {0, -1, 0, 5.25f, 0, -5.25f, 0, 1}};
  static constexpr float AT[m][a] = {{1, 1, 1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0.5f, -0.5f, 1}};
  static constexpr const char* name = "winograd27";

  __attribute__((target("avx512f,fma"), always_inline)) static inline void input(const __m512* d,
                                                                                  __m512* r) {
    apply_dense<a, a>(BT, d, r);
  }

  __attribute__((target("avx512f,fma"), always_inline)) static inline void output(const __m512* p,
                                                                                   __m512* y) {
    apply_dense<m, a>(AT, p, y);
  }
};

// F(3, 7), the same from the points 0, +-1, +-2, +-1/2, 4 and infinity: 9 products per 3
// outputs (a 17-pixel row in 6 tiles against F(2, 7)'s 9); in float32 its median error over
// random 192-channel sums was 2.7e-6 of the output's magnitude against F(2, 7)'s 1.3e-6
struct F3x7 {
  static constexpr int m = 3, r = 7, a = 9;
  static constexpr double G[a][r] = {
      {1.0 / 4, 0, 0, 0, 0, 0, 0},
      {2.0 / 27, 2.0 / 27, 2.0 / 27, 2.0 / 27, 2.0 / 27, 2.0 / 27, 2.0 / 27},
      {2.0 / 45, -2.0 / 45, 2.0 / 45, -2.0 / 45, 2.0 / 45, -2.0 / 45, 2.0 / 45},
      {-1.0 / 180, -1.0 / 90, -1.0 / 45, -2.0 / 45, -4.0 / 45, -8.0 / 45, -16.0 / 45},
      {-1.0 / 540, 1.0 / 270, -1.0 / 135, 2.0 / 135, -4.0 / 135, 8.0 / 135, -16.0 / 135},
      {-64.0 / 315, -32.0 / 315, -16.0 / 315, -8.0 / 315, -4.0 / 315, -2.0 / 315, -1.0 / 315},
      {-64.0 / 405, 32.0 / 405, -16.0 / 405, 8.0 / 405, -4.0 / 405, 2.0 / 405, -1.0 / 405},
      {1.0 / 11340, 1.0 / 2835, 4.0 / 2835, 16.0 / 2835, 64.0 / 2835, 256.0 / 2835,
       1024.0 / 2835},
      {0, 0, 0, 0, 0, 0, 1}};
  static constexpr float BT[a][a] = {{4, -1, -21, 5.25f, 21, -5.25f, -4, 1, 0},
                                     {0, -4, -3, 18, 12.75f, -8.25f, -3, 1, 0},
                                     {0, 4, -5, -16, 21.25f, -0.25f, -5, 1, 0},
                                     {0, -2, -0.5f, 10.25f, 2.5f, -9.25f, -2, 1, 0},
                                     {0, 2, -1.5f, -9.75f, 7.5f, 6.75f, -6, 1, 0},
                                     {0, -8, -14, 14, 17.5f, -7, -3.5f, 1, 0},
                                     {0, 8, -18, -6, 22.5f, -3, -4.5f, 1, 0},
                                     {0, -1, 0, 5.25f, 0, -5.25f, 0, 1, 0},
                                     {0, 4, -1, -21, 5.25f, 21, -5.25f, -4, 1}};
  static constexpr float AT[m][a] = {{1, 1, 1, 1, 1, 1, 1, 1, 0},
                                     {0, 1, -1, 2, -2, 0.5f, -0.5f, 4, 0},
                                     {0, 1, 1, 4, 4, 0.25f, 0.25f, 16, 1}};
  static constexpr const char* name = "winograd37";

  __attribute__((target("avx512f,fma"), always_inline)) static inline void input(const __m512* d,
                                                                                  __m512* r) {
    apply_dense<a, a>(BT, d, r);
  }

  __attribute__((target("avx512f,fma"), always_inline)) static inline void output(const __m512* p,
                                                                                   __m512* y) {
    apply_dense<m, a>(AT, p, y);
  }
};

// D = 2: F(m x m, r x r) over m x m tiles; D = 1: F(m, r) along the kernel's one long axis (a
// 1 x r kernel: tiles of m pixels of a row; r x 1: of a column)
template <typename F, int D>
struct Winograd {
  static constexpr int kM = F::m, kA = F::a;
  static constexpr int kP = D == 2 ? F::a * F::a : F::a;  // positions
  const float *x, *u, *bias, *res;  // x: the input, unpadded
  float* out;
  int64_t n, h, wd, pt, pl, cin, oh, ow, cout, th, tw, block;  // th, tw: tiles down and across
  bool relu, streamed;  // streamed: U does not stay in L2 (see `range`)
  bool down;            // D = 1: tiles along a column (an r x 1 kernel)

  // tile t's image, tile row and column
  void origin(int64_t t, int64_t& img, int64_t& ty, int64_t& tx) const {
    img = t / (th * tw);
    ty = t / tw % th;
    tx = t % tw;
  }

  // a tile's first pixel's row and column (its patch's, in the input padded)
  int64_t row_of(int64_t ty) const { return D == 2 || down ? kM * ty : ty; }
  int64_t col_of(int64_t tx) const { return D == 2 || !down ? kM * tx : tx; }

  // V[xi][b] = (B^T d B)[xi] for tiles [t0, t0 + count), V[xi] at v + xi * ld ([count][cin]).
  // The patches are read where they lie in the input, a pixel in the padding from ``zeros``
  // (cin of them): a zero-bordered copy of the input took a sixth of a 56x56 convolution
  __attribute__((target("avx512f,fma"))) void transform_input(int64_t t0, int64_t count,
                                                              float* v, int64_t ld,
                                                              const float* zeros) const {
    const float* at[kP];  // the patch's pixels: at[i * kA + j] (D = 1: at[i])
    for (int64_t b = 0; b < count; ++b) {
      int64_t img, ty, tx;
      origin(t0 + b, img, ty, tx);
      const int64_t y0 = row_of(ty) - pt, x0 = col_of(tx) - pl;
      for (int i = 0; i < kP; ++i) {
        const int64_t y = y0 + (D == 2 ? i / kA : down ? i : 0);
        const int64_t z = x0 + (D == 2 ? i % kA : down ? 0 : i);
        at[i] = y >= 0 && y < h && z >= 0 && z < wd ? x + ((img * h + y) * wd + z) * cin : zeros;
      }
      for (int64_t c = 0; c < cin; c += 16) {
        const __mmask16 mask = tail_mask(cin - c);
        if constexpr (D == 1) {
          __m512 d[kA], r[kA];
          for (int i = 0; i < kA; ++i) d[i] = _mm512_maskz_loadu_ps(mask, at[i] + c);
          F::input(d, r);
          for (int i = 0; i < kA; ++i) _mm512_mask_storeu_ps(v + i * ld + b * cin + c, mask, r[i]);
        } else {
          __m512 s[kA][kA];  // s[j][i]: B^T d's row i, column j
          for (int j = 0; j < kA; ++j) {
            __m512 d[kA];
            for (int i = 0; i < kA; ++i) d[i] = _mm512_maskz_loadu_ps(mask, at[i * kA + j] + c);
            F::input(d, s[j]);
          }
          for (int i = 0; i < kA; ++i) {
            __m512 row[kA], r[kA];
            for (int j = 0; j < kA; ++j) row[j] = s[j][i];
            F::input(row, r);
            float* at = v + i * kA * ld + b * cin + c;
            for (int j = 0; j < kA; ++j) _mm512_mask_storeu_ps(at + j * ld, mask, r[j]);
          }
        }
      }
    }
  }

  // output channels [c0, c1) of tiles [t0, t0 + count) from their products (M[xi] at
  // mm + xi * ld, [count][cout]): A^T m A, then bias, residual and relu; outputs past the
  // image's edge are not written
  __attribute__((target("avx512f,fma"))) void transform_output(int64_t t0, int64_t count,
                                                               const float* mm, int64_t ld,
                                                               int64_t c0, int64_t c1) const {
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t b = 0; b < count; ++b) {
      int64_t img, ty, tx;
      origin(t0 + b, img, ty, tx);
      const int64_t rows = std::min<int64_t>(D == 2 || down ? kM : 1, oh - row_of(ty));
      const int64_t cols = std::min<int64_t>(D == 2 || !down ? kM : 1, ow - col_of(tx));
      const int64_t at = ((img * oh + row_of(ty)) * ow + col_of(tx)) * cout;
      for (int64_t c = c0; c < c1; c += 16) {
        const __mmask16 mask = tail_mask(c1 - c);
        if constexpr (D == 1) {
          __m512 p[kA], y[kM];
          for (int i = 0; i < kA; ++i)
            p[i] = _mm512_maskz_loadu_ps(mask, mm + i * ld + b * cout + c);
          F::output(p, y);
          const __m512 bv = bias ? _mm512_maskz_loadu_ps(mask, bias + c) : zero;
          const int64_t step = down ? ow * cout : cout, valid = down ? rows : cols;
          for (int64_t e = 0; e < valid; ++e) {
            const int64_t o = at + e * step + c;
            __m512 val = _mm512_add_ps(y[e], bv);
            if (res) val = _mm512_add_ps(val, _mm512_maskz_loadu_ps(mask, res + o));
            if (relu) val = relu_keep_nan(val);
            _mm512_mask_storeu_ps(out + o, mask, val);
          }
        } else {
          __m512 r[kA][kM];  // r[j][q]: A^T p's row q, column j
          for (int j = 0; j < kA; ++j) {
            __m512 p[kA];
            for (int i = 0; i < kA; ++i)
              p[i] = _mm512_maskz_loadu_ps(mask, mm + (i * kA + j) * ld + b * cout + c);
            F::output(p, r[j]);
          }
          const __m512 bv = bias ? _mm512_maskz_loadu_ps(mask, bias + c) : zero;
          for (int64_t q = 0; q < rows; ++q) {
            __m512 row[kA], y[kM];
            for (int j = 0; j < kA; ++j) row[j] = r[j][q];
            F::output(row, y);
            for (int64_t e = 0; e < cols; ++e) {
              const int64_t o = at + (q * ow + e) * cout + c;
              __m512 val = _mm512_add_ps(y[e], bv);
              if (res) val = _mm512_add_ps(val, _mm512_maskz_loadu_ps(mask, res + o));
              if (relu) val = relu_keep_nan(val);
              _mm512_mask_storeu_ps(out + o, mask, val);
            }
          }
        }
      }
    }
  }

  // tiles [t0, t1) by panels [p0, p1), a block of tiles at a time, the block's V and M in
  // this thread's scratch. The matrices of each lie a line more than a block apart: at a
  // multiple of 4 KB (96 tiles of 64 channels) the 16 rows that one tile's transform writes or
  // reads fell in one set of L1 (12 ways), and the input transform took as long as a third of
  // the GEMMs
  void range(int64_t t0, int64_t t1, int64_t p0, int64_t p1) const {
    thread_local std::vector<float> scratch, zeros;
    const int64_t ldv = block * cin + 16, ldm = block * cout + 16;
    if (static_cast<int64_t>(scratch.size()) < kP * (ldv + ldm)) scratch.resize(kP * (ldv + ldm));
    if (static_cast<int64_t>(zeros.size()) < cin) zeros.resize(cin);
    float *v = scratch.data(), *mm = v + kP * ldv;
    const int64_t panels = (cout + kNR - 1) / kNR;
    for (int64_t b0 = t0; b0 < t1; b0 += block) {
      const int64_t count = std::min(block, t1 - b0);
      transform_input(b0, count, v, ldv, zeros.data());
      const int64_t row_tiles = (count + kMR - 1) / kMR;
      for (int64_t xi = 0; xi < kP; ++xi) {
        const float* vx = v + xi * ldv;
        float* mx = mm + xi * ldm;
        auto tile = [&](int64_t j, int64_t p, Prefetch pf) {
          const int64_t r = j * kMR, rows = std::min(kMR, count - r);
          const int64_t ncols = std::min(kNR, cout - p * kNR);
          (ncols > 16 ? kTiles2 : kTiles1)[rows - 1](
              vx + r * cin, cin, u + (xi * panels + p) * cin * kNR, cin, mx + r * cout + p * kNR,
              cout, ncols, nullptr, nullptr, 0, false, pf, false, true);
        };
        if (!streamed) {  // U stays in L2: each row tile of V once, by every panel
          for (int64_t j = 0; j < row_tiles; ++j)
            for (int64_t p = p0; p < p1; ++p) tile(j, p, Prefetch{});
          continue;
        }
        // U streams from memory (once per block: a small image's tiles are one block):
        // panel by panel, the next one (the next position's first) prefetched over the row
        // tiles, as the GEMM's panels
        for (int64_t p = p0; p < p1; ++p) {
          const float* next = p + 1 < p1    ? u + (xi * panels + p + 1) * cin * kNR
                              : xi + 1 < kP ? u + ((xi + 1) * panels + p0) * cin * kNR
                                            : nullptr;
          for (int64_t j = 0; j < row_tiles; ++j)
            tile(j, p, Prefetch::share(next, cin * kNR, j, row_tiles));
        }
      }
      transform_output(b0, count, mm, ldm, p0 * kNR, std::min(cout, p1 * kNR));
    }
  }

  void operator()(int64_t threads) const {
    const int64_t tiles = n * th * tw;
    // (as `split_rows`: below ~64 KB of output a parallel region costs more than it saves)
    if (!(tiles >= threads && n * oh * ow * cout * 4 >= (int64_t{64} << 10))) threads = 1;
    const int64_t panels = (cout + kNR - 1) / kNR;
    parallel(threads, [&](int64_t t, int64_t nt) {
      // a streamed U ten times the size of the transformed input is split by panels (each
      // thread reads its share of U and transforms all of the input: 7x7 512 -> 512 ran 1.5x
      // slower with each thread reading all 17 MB); otherwise the tiles are split (a 14x14
      // 256 -> 256 convolution by panels ran 1.25x slower)
      if (streamed && panels >= nt && cout > 10 * tiles)
        range(0, tiles, panels * t / nt, panels * (t + 1) / nt);
      else
        range(tiles * t / nt, tiles * (t + 1) / nt, 0, panels);
    });
  }
};

// the weight transformed and packed as GEMM operands of cin x cout in the GEMM's panels,
// [position][panel][cin][32], zero-padded: D = 2, (cout, r, r, cin) by G g G^T per output and
// input channel; D = 1, (cout, r, 1, cin) or (cout, 1, r, cin) by G g
template <typename F, int D>
at::Tensor pack_winograd(const at::Tensor& w, int64_t cout, int64_t cin) {
  constexpr int kA = F::a, kR = F::r, kP = D == 2 ? kA * kA : kA;
  const int64_t panels = (cout + kNR - 1) / kNR;
  at::Tensor packed = at::zeros({kP * panels * cin * kNR}, w.options().dtype(at::kFloat));
  const at::Tensor wc = w.contiguous();
  const float* src = wc.data_ptr<float>();
  float* dst = packed.data_ptr<float>();
  auto put = [&](int64_t xi, int64_t o, int64_t i, double value) {
    dst[((xi * panels + o / kNR) * cin + i) * kNR + o % kNR] = static_cast<float>(value);
  };
  for (int64_t o = 0; o < cout; ++o)
    for (int64_t i = 0; i < cin; ++i) {
      if constexpr (D == 1) {
        for (int xi = 0; xi < kA; ++xi) {
          double value = 0;
          for (int k = 0; k < kR; ++k) value += F::G[xi][k] * src[(o * kR + k) * cin + i];
          put(xi, o, i, value);
        }
        continue;
      }
      double g[kR][kR], gg[kA][kR];
      for (int r = 0; r < kR; ++r)
        for (int q = 0; q < kR; ++q) g[r][q] = src[((o * kR + r) * kR + q) * cin + i];
      for (int xi = 0; xi < kA; ++xi)
        for (int q = 0; q < kR; ++q) {
          gg[xi][q] = 0;
          for (int r = 0; r < kR; ++r) gg[xi][q] += F::G[xi][r] * g[r][q];
        }
      for (int xi = 0; xi < kA; ++xi)
        for (int yj = 0; yj < kA; ++yj) {
          double value = 0;
          for (int q = 0; q < kR; ++q) value += gg[xi][q] * F::G[yj][q];
          put(xi * kA + yj, o, i, value);
        }
    }
  return packed;
}

// tiles per block: the block's transformed inputs and products (a * a * 4 bytes per tile and
// channel) within kWinogradBlock bytes, a whole number of GEMM row tiles
constexpr int64_t kWinogradBlock = 384 << 10;
// a transformed weight over this size is streamed (see `Winograd::range`), in blocks of up to
// this size, or of the smaller size in a form of its own
constexpr int64_t kWinogradStreamed = 1 << 20, kWinogradStreamedBlock = 3 << 20,
                  kWinogradSmallBlock = 1 << 20;

// the Winograd form of a stride-1 undilated convolution where the CPU, the tensors and the
// kernel's shape allow it (see `Winograd`: D = 2, r x r and F(m x m, r x r); D = 1, 1 x r or r x 1
// and F(m, r)), else None; pads: top, left, bottom, right. With ``small_blocks``, the form
// whose streamed weight is read once per kWinogradSmallBlock of tiles (None where the weight
// is not streamed or the blocks would be the same): a block's transformed input and products
// then stay in L2 beside the weight's panels, at the cost of reading the weight more often
// (Inception-v3 1.4-1.8% faster with only these blocks, ResNet-50 0.7-2% slower: so a form
// of its own, chosen by timing)
template <typename F, int D>
c10::optional<Form> own_winograd(const at::Tensor& out_buffer, const at::Tensor& x_buffer,
                                 const at::Tensor& w_buffer, c10::optional<at::Tensor> bias,
                                 c10::optional<at::Tensor> res_buffer,
                                 std::array<int64_t, 4> pads, const std::string& act,
                                 int64_t threads, bool small_blocks = false) {
  constexpr int64_t kM = F::m, kR = F::r;
  const int64_t cin = x_buffer.size(3), cout = out_buffer.size(3);
  const int64_t oh = out_buffer.size(1), ow = out_buffer.size(2);
  if (w_buffer.dim() != 4) return c10::nullopt;
  const int64_t kh = w_buffer.size(1), kw = w_buffer.size(2);
  const bool down = D == 1 && kh == kR && kw == 1;  // r x 1: tiles along a column
  if (!(D == 2 ? kh == kR && kw == kR : down || (kh == 1 && kw == kR)) ||
      !__builtin_cpu_supports("avx512f") || !plain_float(x_buffer) || !plain_float(out_buffer) ||
      w_buffer.scalar_type() != at::kFloat || w_buffer.size(0) != cout ||
      w_buffer.size(3) != cin || out_buffer.size(0) != x_buffer.size(0) ||
      (bias && !plain_float(*bias)) || (res_buffer && !plain_float(*res_buffer)) ||
      out_buffer.numel() == 0 || cin == 0 || oh != x_buffer.size(1) + pads[0] + pads[2] - kh + 1 ||
      ow != x_buffer.size(2) + pads[1] + pads[3] - kw + 1)
    return c10::nullopt;
  at::Tensor packed = shared_packed(w_buffer, F::name + std::string(D == 1 ? "/1d" : ""),
                                    [&]() { return pack_winograd<F, D>(w_buffer, cout, cin); });
  const bool across = D == 2 || !down, along = D == 2 || down;  // tiled across, down
  const int64_t th = along ? (oh + kM - 1) / kM : oh, tw = across ? (ow + kM - 1) / kM : ow;
  // U larger than L2 is read once per block, so blocks are as large as L2 allows (all the
  // tiles of a small image: the threads then split U)
  const bool streamed = packed.numel() * 4 > kWinogradStreamed;
  const int64_t per_tile = Winograd<F, D>::kP * 4 * (cin + cout);
  auto block_of = [&](int64_t bytes) { return std::max(kMR, bytes / per_tile / kMR * kMR); };
  int64_t block = block_of(streamed ? kWinogradStreamedBlock : kWinogradBlock);
  if (small_blocks) {
    const int64_t tiles = x_buffer.size(0) * th * tw, small = block_of(kWinogradSmallBlock);
    if (!streamed || (tiles + small - 1) / small == (tiles + block - 1) / block)
      return c10::nullopt;
    block = small;
  }
  Winograd<F, D> conv{x_buffer.data_ptr<float>(), packed.data_ptr<float>(),
                      bias ? bias->data_ptr<float>() : nullptr,
                      res_buffer ? res_buffer->data_ptr<float>() : nullptr,
                      out_buffer.data_ptr<float>(), x_buffer.size(0), x_buffer.size(1),
                      x_buffer.size(2), pads[0], pads[1], cin, oh, ow, cout, th, tw, block,
                      act == "relu", streamed, down};
  return Form([conv, packed, x_buffer, out_buffer, bias, res_buffer, act, threads]() {
    conv(threads);
    if (!act.empty() && act != "relu") {
      at::Tensor o = out_buffer;
      activate(o, act);
    }
  });
}
#endif

#pragma GCC pop_options

#ifdef PARAGRAPH_AVX512
// paragraph's own depthwise convolution (groups = input = output channels) on NHWC float32
// buffers: out = act(conv + bias + res). The weight, (C, kh, kw, 1) in OHWI, is packed once as
// [kh][kw][C] so that a vector of 16 channels of one tap is one load; each output row goes a
// channel vector at a time, four output pixels side by side (four independent FMA chains that
// share each tap's load), the taps that fall in the padding skipped (TF-style uneven padding
// needs no padded copy of the input). oneDNN's depthwise convolutions ran NASNet-A mobile's
// 9.8 ms against ONNX Runtime's 6.9 on one thread (Xeon host).
struct Depthwise {
  const float *x, *w, *bias, *res;  // w packed [kh][kw][c]; bias and res may be null
  float* out;
  int64_t n, h, wd, c, oh, ow, kh, kw, sh, sw, pt, pl, dh, dw;
  bool relu;

  __attribute__((target("avx512f"))) void rows(int64_t r0, int64_t r1) const {
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t r = r0; r < r1; ++r) {  // r = (image, output row)
      const int64_t img = r / oh, ih0 = (r % oh) * sh - pt;
      const float* image = x + img * h * wd * c;
      float* orow = out + r * ow * c;
      const float* rrow = res ? res + r * ow * c : nullptr;
      for (int64_t k = 0; k < c; k += 16) {
        const __mmask16 m = tail_mask(c - k);
        const __m512 b = bias ? _mm512_maskz_loadu_ps(m, bias + k) : zero;
        int64_t j = 0;
        // four pixels at a time where all their taps are inside the row (no checks per tap)
        for (; j + 4 <= ow; j += 4) {
          const int64_t iw0 = j * sw - pl, iw3 = (j + 3) * sw - pl + (kw - 1) * dw;
          if (iw0 < 0 || iw3 >= wd) {
            for (int64_t q = j; q < j + 4; ++q)
              finish(pixel(image, k, m, b, ih0, q), orow, rrow, q * c + k, m);
            continue;
          }
          __m512 a0 = b, a1 = b, a2 = b, a3 = b;
          for (int64_t ky = 0; ky < kh; ++ky) {
            const int64_t ih = ih0 + ky * dh;
            if (ih < 0 || ih >= h) continue;
            const float* xr = image + (ih * wd + iw0) * c + k;
            const float* wr = w + ky * kw * c + k;
            for (int64_t kx = 0; kx < kw; ++kx) {
              const __m512 wv = _mm512_maskz_loadu_ps(m, wr + kx * c);
              const float* xp = xr + kx * dw * c;
              a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, xp), wv, a0);
              a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, xp + sw * c), wv, a1);
              a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, xp + 2 * sw * c), wv, a2);
              a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, xp + 3 * sw * c), wv, a3);
            }
          }
          finish(a0, orow, rrow, (j + 0) * c + k, m);
          finish(a1, orow, rrow, (j + 1) * c + k, m);
          finish(a2, orow, rrow, (j + 2) * c + k, m);
          finish(a3, orow, rrow, (j + 3) * c + k, m);
        }
        for (; j < ow; ++j) finish(pixel(image, k, m, b, ih0, j), orow, rrow, j * c + k, m);
      }
    }
  }

  // the epilogue of one channel vector of one pixel at ``at`` in the row: residual, relu, store
  __attribute__((target("avx512f"))) void finish(__m512 acc, float* orow, const float* rrow,
                                                 int64_t at, __mmask16 m) const {
    if (rrow) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(m, rrow + at));
    if (relu) acc = relu_keep_nan(acc);
    _mm512_mask_storeu_ps(orow + at, m, acc);
  }

  // one output pixel's channel vector, every tap checked against the borders
  __attribute__((target("avx512f"))) __m512 pixel(const float* image, int64_t k, __mmask16 m,
                                                  __m512 acc, int64_t ih0, int64_t j) const {
    const int64_t iw0 = j * sw - pl;
    for (int64_t ky = 0; ky < kh; ++ky) {
      const int64_t ih = ih0 + ky * dh;
      if (ih < 0 || ih >= h) continue;
      for (int64_t kx = 0; kx < kw; ++kx) {
        const int64_t iw = iw0 + kx * dw;
        if (iw < 0 || iw >= wd) continue;
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, image + (ih * wd + iw) * c + k),
                              _mm512_maskz_loadu_ps(m, w + (ky * kw + kx) * c + k), acc);
      }
    }
    return acc;
  }

  void operator()(int64_t threads) const {
    split_rows(n * oh, n * oh * ow * c * 4, threads,
               [this](int64_t r0, int64_t r1) { rows(r0, r1); });
  }
};

// the own depthwise form where the CPU and the tensors allow it (see `Depthwise`), else None;
// pads: top, left (bottom and right follow from the output's size)
c10::optional<Form> own_depthwise(const at::Tensor& out_buffer, const at::Tensor& x_buffer,
                                  const at::Tensor& w_buffer, c10::optional<at::Tensor> bias,
                                  c10::optional<at::Tensor> res_buffer, int64_t sh, int64_t sw,
                                  int64_t pt, int64_t pl, int64_t dh, int64_t dw,
                                  const std::string& act, int64_t threads) {
  const int64_t c = x_buffer.size(3);
  if (!__builtin_cpu_supports("avx512f") || !plain_float(x_buffer) || !plain_float(out_buffer) ||
      w_buffer.scalar_type() != at::kFloat || w_buffer.dim() != 4 || w_buffer.size(0) != c ||
      w_buffer.size(3) != 1 || out_buffer.size(3) != c || out_buffer.size(0) != x_buffer.size(0) ||
      (bias && !plain_float(*bias)) || (res_buffer && !plain_float(*res_buffer)) ||
      (!act.empty() && act != "relu"))
    return c10::nullopt;
  const int64_t kh = w_buffer.size(1), kw = w_buffer.size(2);
  at::Tensor packed = shared_packed(w_buffer, "depthwise", [&]() {
    return w_buffer.reshape({c, kh * kw}).t().contiguous();  // [kh * kw][c]
  });
  Depthwise conv{x_buffer.data_ptr<float>(), packed.data_ptr<float>(),
                 bias ? bias->data_ptr<float>() : nullptr,
                 res_buffer ? res_buffer->data_ptr<float>() : nullptr, out_buffer.data_ptr<float>(),
                 x_buffer.size(0), x_buffer.size(1), x_buffer.size(2), c, out_buffer.size(1),
                 out_buffer.size(2), kh, kw, sh, sw, pt, pl, dh, dw, act == "relu"};
  // the captured tensors hold the buffers and the packed weight alive as long as the form
  return Form([conv, packed, x_buffer, out_buffer, bias, res_buffer, threads]() {
    conv(threads);
  });
}
#endif

// a convolution on TVM's buffers; params: stride (2), padding (2 or 4), dilation (2), groups
ffi::Function Conv2d(ffi::Tensor out_t, ffi::Tensor x_t, ffi::Tensor w_t,
                     ffi::Optional<ffi::Tensor> bias_t, ffi::Optional<ffi::Tensor> res_t,
                     ffi::Array<int64_t> params, ffi::String layout, ffi::String act,
                     int64_t threads) {
  // NCHW2NHWC: an NCHW input (the model's), the weight and output NHWC as "NHWC"'s; x_buffer
  // is then the input's NHWC view
  const bool nchw_in = std::string(layout) == "NCHW2NHWC";
  const bool nhwc = nchw_in || std::string(layout) == "NHWC";
  at::Tensor out_buffer = to_aten(out_t), x_buffer = to_aten(x_t), w_buffer = to_aten(w_t);
  if (nchw_in) x_buffer = x_buffer.permute({0, 2, 3, 1});
  at::Tensor out = nhwc ? nchw(out_buffer) : out_buffer;
  at::Tensor x = nhwc ? nchw(x_buffer) : x_buffer;
  at::Tensor w = nhwc ? nchw(w_buffer) : w_buffer;
  c10::optional<at::Tensor> bias, res, res_buffer;
  if (bias_t.has_value()) bias = to_aten(bias_t.value());
  if (res_t.has_value()) {
    res_buffer = to_aten(res_t.value());
    res = nhwc ? nchw(*res_buffer) : *res_buffer;
  }
  std::vector<int64_t> p(params.begin(), params.end());
  TVM_FFI_ICHECK(p.size() == 7 || p.size() == 9) << "conv2d: 7 or 9 parameters";
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
  std::vector<int64_t> input_size = x.sizes().vec();
  if (!pre_pad.empty()) {
    input_size[2] += pre_pad[2] + pre_pad[3];
    input_size[3] += pre_pad[0] + pre_pad[1];
  }
  // the weight in oneDNN's blocked format for this input shape and thread count, once
  at::Tensor packed = shared_packed(
      w, "conv" + ints(padding) + ints(stride) + ints(dilation) + ints({groups}) +
             ints(input_size),
      [&]() {
        return at::mkldnn_reorder_conv2d_weight(w.to_mkldnn(), padding, stride, dilation,
                                                groups, input_size);
      });
  std::string a(act);
  Form onednn = onednn_conv(out, x, packed, bias, res, padding, stride, dilation, groups,
                            pre_pad, a, out_buffer);
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
                              {pt, pl, pb, pr}, dilation[0], dilation[1], a, threads)) {
        std::vector<Form> forms{onednn, *own};
        // the streamed forms in small blocks after all the others (whose indices stay)
        if (p[0] == 1 && p[1] == 1 && dilation[0] == 1 && dilation[1] == 1 && !nchw_in)
          for (bool small_blocks : {false, true})
            for (auto wino : {own_winograd<F2x3, 2>, own_winograd<F4x3, 2>,
                              own_winograd<F2x3, 1>, own_winograd<F4x3, 1>,
                              own_winograd<F2x7, 1>, own_winograd<F2x5, 2>,
                              own_winograd<F3x7, 1>})
              if (auto form = wino(out_buffer, x_buffer, w_buffer, bias, res_buffer,
                                   {pt, pl, pb, pr}, a, threads, small_blocks))
                forms.push_back(*form);
        return fastest_of(forms, key("conv_kxk"), threads);
      }
    }
    // a depthwise convolution: oneDNN's and the own form, the faster by timing
    const bool depthwise = nhwc && groups > 1 && groups == x_buffer.size(3) &&
                           groups == out_buffer.size(3) && w_buffer.size(3) == 1;
    if (depthwise) {
      if (auto own = own_depthwise(out_buffer, x_buffer, w_buffer, bias, res_buffer, p[0], p[1],
                                   pt, pl, dilation[0], dilation[1], a, threads)) {
        return fastest_of({onednn, *own}, key("depthwise"), threads);
      }
    }
#endif
    return wrap([onednn, threads]() {
      use_threads(threads);
      onednn();
    });
  }
  int64_t cin = x_buffer.size(3), cout = out_buffer.size(3);
  c10::optional<at::Tensor> res2;
  if (res_buffer) res2 = res_buffer->reshape({-1, cout});
  Form mkl = gemm(out_buffer.view({-1, cout}), x_buffer.view({-1, cin}),
                  w_buffer.reshape({cout, cin}).t(), bias, res2, a);
  std::vector<Form> forms{onednn, mkl};
#ifdef PARAGRAPH_AVX512
  if (auto own = packed_gemm(out_buffer.view({-1, cout}), x_buffer.view({-1, cin}), w_buffer,
                             cin, 1, bias, res2, a, threads))
    forms.push_back(*own);
#endif
  return fastest_of(std::move(forms), key("conv2d"), threads);
}

// (..., K) @ W (K, N) with a constant W, optional bias and activation, on TVM's buffers
#ifdef PARAGRAPH_AVX512
// acc[0, n) += a[k0, k1) @ w[k0:k1, 0:n) (w row-major, n wide): w read once, front to back,
// four rows per pass over acc (which stays in L1), so that the weight streams from memory in
// the order the hardware prefetchers follow best
__attribute__((target("avx512f"))) void gemv_share(const float* a, const float* w, int64_t n,
                                                   int64_t k0, int64_t k1, float* acc) {
  const int64_t whole = n / 16 * 16;
  const __mmask16 tail = tail_mask(n - whole);
  int64_t k = k0;
  for (; k + 4 <= k1; k += 4) {
    const __m512 a0 = _mm512_set1_ps(a[k]), a1 = _mm512_set1_ps(a[k + 1]);
    const __m512 a2 = _mm512_set1_ps(a[k + 2]), a3 = _mm512_set1_ps(a[k + 3]);
    const float* w0 = w + k * n;
    const float *w1 = w0 + n, *w2 = w1 + n, *w3 = w2 + n;
    for (int64_t j = 0; j < whole; j += 16) {
      __m512 s = _mm512_loadu_ps(acc + j);
      s = _mm512_fmadd_ps(a0, _mm512_loadu_ps(w0 + j), s);
      s = _mm512_fmadd_ps(a1, _mm512_loadu_ps(w1 + j), s);
      s = _mm512_fmadd_ps(a2, _mm512_loadu_ps(w2 + j), s);
      s = _mm512_fmadd_ps(a3, _mm512_loadu_ps(w3 + j), s);
      _mm512_storeu_ps(acc + j, s);
    }
    if (tail) {
      __m512 s = _mm512_maskz_loadu_ps(tail, acc + whole);
      s = _mm512_fmadd_ps(a0, _mm512_maskz_loadu_ps(tail, w0 + whole), s);
      s = _mm512_fmadd_ps(a1, _mm512_maskz_loadu_ps(tail, w1 + whole), s);
      s = _mm512_fmadd_ps(a2, _mm512_maskz_loadu_ps(tail, w2 + whole), s);
      s = _mm512_fmadd_ps(a3, _mm512_maskz_loadu_ps(tail, w3 + whole), s);
      _mm512_mask_storeu_ps(acc + whole, tail, s);
    }
  }
  for (; k < k1; ++k) {
    const __m512 ak = _mm512_set1_ps(a[k]);
    const float* wk = w + k * n;
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 m = tail_mask(n - j);
      _mm512_mask_storeu_ps(acc + j, m, _mm512_fmadd_ps(ak, _mm512_maskz_loadu_ps(m, wk + j),
                                                        _mm512_maskz_loadu_ps(m, acc + j)));
    }
  }
}

// o += each of the parts (n floats each, one after another), then relu where asked
__attribute__((target("avx512f"))) void gemv_finish(float* o, const float* parts, int64_t count,
                                                    int64_t n, bool relu) {
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = tail_mask(n - j);
    __m512 v = _mm512_maskz_loadu_ps(m, o + j);
    for (int64_t t = 0; t < count; ++t)
      v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, parts + t * n + j));
    _mm512_mask_storeu_ps(o + j, m, relu ? relu_keep_nan(v) : v);
  }
}

// the own one-row product out = act(a @ w + bias) for a (1, K) row and a contiguous (K, N)
// weight (a classifier's): the weight, cold in a model (Inception-v3's 8 MB), streamed front to
// back (`gemv_share`) rather than in the GEMM's panels; on two threads each streams its half of
// the rows of w into its own sums, added at the end
c10::optional<Form> own_gemv(const at::Tensor& out2, const at::Tensor& rows, const at::Tensor& w,
                             const c10::optional<at::Tensor>& bias, const std::string& act,
                             int64_t threads) {
  if (!__builtin_cpu_supports("avx512f") || rows.size(0) != 1 || !plain_float(w) ||
      !rows.is_contiguous() || rows.scalar_type() != at::kFloat || !plain_float(out2) ||
      (bias && !plain_float(*bias)) || (act != "" && act != "relu"))
    return c10::nullopt;
  const int64_t k = w.size(0), n = w.size(1);
  auto scratch = std::make_shared<std::vector<float>>(n * std::max<int64_t>(threads - 1, 0));
  return Form([out2, rows, w, bias, act, threads, k, n, scratch]() {
    const float* a = rows.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    float* o = out2.data_ptr<float>();
    const float* b = bias ? bias->data_ptr<float>() : nullptr;
    const int64_t team = k >= 64 * threads ? threads : 1;
    int64_t used = 1;  // the threads OpenMP gave: their sums are added
    parallel(team, [&](int64_t t, int64_t nt) {
      if (t == 0) used = nt;
      float* acc = t == 0 ? o : scratch->data() + (t - 1) * n;
      if (t == 0 && b)
        std::memcpy(acc, b, n * sizeof(float));
      else
        std::memset(acc, 0, n * sizeof(float));
      // shares of whole groups of four rows
      const int64_t groups = (k + 3) / 4;
      gemv_share(a, wp, n, std::min(k, groups * t / nt * 4), std::min(k, groups * (t + 1) / nt * 4),
                 acc);
    });
    gemv_finish(o, scratch->data(), used - 1, n, act == "relu");
  });
}
#endif

ffi::Function Linear(ffi::Tensor out_t, ffi::Tensor a_t, ffi::Tensor w_t,
                     ffi::Optional<ffi::Tensor> bias_t, ffi::String act, int64_t threads) {
  at::Tensor out = to_aten(out_t), a = to_aten(a_t), w = to_aten(w_t);
  c10::optional<at::Tensor> bias;
  if (bias_t.has_value()) bias = to_aten(bias_t.value());
  int64_t k = w.size(0), n = w.size(1);
  at::Tensor rows = a.reshape({-1, k}), out2 = out.view({-1, n});
  int64_t m = rows.size(0);
  std::string act_s(act);
  use_threads(threads);
  // oneDNN's form: a 1x1 convolution over m pixels in NHWC, the weight packed once
  at::Tensor packed = shared_packed(w, "linear" + ints({m}), [&]() {
    at::Tensor w4 = w.t().contiguous().view({n, k, 1, 1});
    return at::mkldnn_reorder_conv2d_weight(w4.to_mkldnn(), {0, 0}, {1, 1}, {1, 1}, 1,
                                            {1, k, 1, m});
  });
  at::Tensor x4 = rows.view({1, m, 1, k}).permute({0, 3, 2, 1});
  at::Tensor out4 = out2.view({1, m, 1, n}).permute({0, 3, 2, 1});
  std::string fused = act_s == "relu" ? "relu" : "";
  Form conv = onednn_conv(out4, x4, packed, bias, c10::nullopt, {0, 0}, {1, 1}, {1, 1}, 1, {},
                          fused, out2);
  Form onednn = [conv, out2, act_s]() {
    conv();
    at::Tensor o = out2;
    if (act_s != "relu") activate(o, act_s);  // oneDNN fused only relu
  };
  Form mkl = gemm(out2, rows, w, bias, c10::nullopt, act_s);
  std::vector<Form> forms{onednn, mkl};
#ifdef PARAGRAPH_AVX512
  // the own GEMM (an RNN's steps: the SRU's 1 x 1024 x 1024 products 1.5x faster end to end;
  // with the next panel prefetched, BERT's 64-row products too)
  if (w.is_contiguous()) {
    if (auto own = packed_gemm(out2, rows, w, 1, n, bias, c10::nullopt, act_s, threads))
      forms.push_back(*own);
  }
  if (auto own = own_gemv(out2, rows, w, bias, act_s, threads)) forms.push_back(*own);
#endif
  return fastest_of(std::move(forms),
                    "linear" + std::to_string(threads) + act_s + shape_key({rows, w}) +
                        (bias ? "b" : ""),
                    threads);
}

void activate(at::Tensor& o, const std::string& act) {
  if (act == "relu") {
    o.relu_();
  } else if (act == "gelu" || act == "gelu_tanh") {
    at::gelu_(o, act == "gelu" ? "none" : "tanh");
  }
}

#ifdef PARAGRAPH_AVX512
// R rows x 32 columns (j, masks m0 and m1) of one product C = A @ B of row-major float32
// matrices, all of K accumulated in 2R registers: a broadcast of A's element and two loads of
// B's row per step, no packing (B's rows are read where they lie)
template <int R>
__attribute__((target("avx512f"))) void bmm_tile(const float* a, const float* b, float* c,
                                                 int64_t k_len, int64_t n, int64_t j,
                                                 __mmask16 m0, __mmask16 m1) {
  __m512 acc[R][2];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < k_len; ++k) {
    const __m512 b0 = _mm512_maskz_loadu_ps(m0, b + k * n + j);
    const __m512 b1 = _mm512_maskz_loadu_ps(m1, b + k * n + j + 16);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * k_len + k]);
      acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(c + r * n + j, m0, acc[r][0]);
    _mm512_mask_storeu_ps(c + r * n + j + 16, m1, acc[r][1]);
  }
}

// ``rows`` rows (at most 12; a, c at the first) of one product, all columns, by the widest
// tiles that fit
__attribute__((target("avx512f"))) void bmm_rows(const float* a, const float* b, float* c,
                                                 int64_t rows, int64_t k_len, int64_t n) {
  for (int64_t j = 0; j < n; j += 32) {
    const __mmask16 m0 = tail_mask(n - j), m1 = n - j > 16 ? tail_mask(n - j - 16) : 0;
    int64_t i = 0;
    for (; i + 12 <= rows; i += 12) bmm_tile<12>(a + i * k_len, b, c + i * n, k_len, n, j, m0, m1);
    for (; i + 4 <= rows; i += 4) bmm_tile<4>(a + i * k_len, b, c + i * n, k_len, n, j, m0, m1);
    for (; i < rows; ++i) bmm_tile<1>(a + i * k_len, b, c + i * n, k_len, n, j, m0, m1);
  }
}
#endif

// paragraph's own batched product of small matrices (attention's scores and context): MKL's
// batched GEMM took 24 us for four heads of 64 x 64 x 64 (a small encoder's, one thread),
// ONNX Runtime 12-13; here each 12-row block of each product is one task, the tasks split
// over the threads. None where a tensor is not contiguous float32 or the CPU lacks AVX-512.
c10::optional<Form> own_bmm(at::Tensor o3, at::Tensor a3, at::Tensor b3, int64_t threads) {
#ifdef PARAGRAPH_AVX512
  if (!__builtin_cpu_supports("avx512f") || !plain_float(o3) || !plain_float(a3) ||
      !plain_float(b3) || o3.numel() == 0 || a3.size(2) == 0)
    return c10::nullopt;
  return Form([o3, a3, b3, threads]() {
    const int64_t batch = a3.size(0), m = a3.size(1), k_len = a3.size(2), n = b3.size(2);
    const int64_t blocks = (m + 11) / 12, tasks = batch * blocks;
    const float *a = a3.data_ptr<float>(), *b = b3.data_ptr<float>();
    float* c = o3.data_ptr<float>();
    // below 2^18 multiply-adds (a few microseconds) the calling thread alone
    const int64_t nt = batch * m * n * k_len >= (int64_t{1} << 18) ? threads : 1;
    parallel(nt, [&](int64_t t, int64_t count) {
      for (int64_t task = tasks * t / count; task < tasks * (t + 1) / count; ++task) {
        const int64_t q = task / blocks, i = task % blocks * 12;
        bmm_rows(a + (q * m + i) * k_len, b + q * k_len * n, c + (q * m + i) * n,
                 std::min<int64_t>(12, m - i), k_len, n);
      }
    });
  });
#else
  return c10::nullopt;
#endif
}

// a product of two activations: (..., K) @ (K, N) as one GEMM over the flattened rows, or a
// batched product (B..., M, K) @ (B..., K, N) (attention's scores and context): MKL in place,
// and for the batched product the own kernel beside it, the faster by timing
ffi::Function Product(ffi::Tensor out_t, ffi::Tensor a_t, ffi::Tensor b_t,
                      ffi::Optional<ffi::Tensor> bias_t, ffi::String act, int64_t threads) {
  at::Tensor out = to_aten(out_t), a = to_aten(a_t), b = to_aten(b_t);
  c10::optional<at::Tensor> bias;
  if (bias_t.has_value()) bias = to_aten(bias_t.value());
  std::string act_s(act);
  if (b.dim() == 2) {
    Form mm = gemm(out.view({-1, b.size(1)}), a.reshape({-1, a.size(-1)}), b, bias,
                   c10::nullopt, act_s);
    return wrap([mm, threads]() {
      use_threads(threads);
      mm();
    });
  }
  TVM_FFI_ICHECK(!bias) << "a batched product has no bias";
  at::Tensor a3 = a.reshape({-1, a.size(-2), a.size(-1)});
  at::Tensor b3 = b.reshape({-1, b.size(-2), b.size(-1)});
  at::Tensor o3 = out.view({-1, out.size(-2), out.size(-1)});
  Form mkl = [a3, b3, o3, act_s, threads]() {
    use_threads(threads);
    at::Tensor o = o3;
    at::bmm_out(o, a3, b3);
    activate(o, act_s);
  };
  auto own = own_bmm(o3, a3, b3, threads);
  if (!own) return wrap(mkl);
  Form own_act = [form = *own, o3, act_s]() {
    form();
    if (!act_s.empty()) {
      at::Tensor o = o3;
      activate(o, act_s);
    }
  };
  return fastest_of({mkl, own_act}, "bmm" + std::to_string(threads) + act_s + shape_key({a3, b3}),
                    threads);
}

// dst = relu(src) over n floats in one pass; NaN stays NaN, as in torch's relu: the concat's
// copy where the CPU has no AVX-512 (with it, `concat_rows_avx512` copies float parts)
void copy_relu(float* dst, const float* src, int64_t n) {
  for (int64_t j = 0; j < n; ++j) dst[j] = src[j] < 0.f ? 0.f : src[j];
}

#ifdef PARAGRAPH_AVX512
// rows [r0, r1) of a float concat: each part's row (counts[i] floats at parts[i] + r *
// counts[i]) copied in turn (through the relu), a vector at a time inline: NASNet's NHWC joins
// copy rows of 11-176 floats per pixel, where a memcpy or `copy_relu` call per part and pixel
// cost as much as the copy. A part's last few floats are stored as a whole vector where the
// parts after it in the row (``rest`` floats) take the overrun, which they then overwrite: a
// masked store cost more (NASNet's joins: 3-4% of the copy)
__attribute__((target("avx512f"))) void concat_rows_avx512(float* dst,
                                                           const std::vector<const float*>& parts,
                                                           const std::vector<int64_t>& counts,
                                                           int64_t row, bool relu, int64_t r0,
                                                           int64_t r1) {
  const size_t np = parts.size();
  std::vector<int64_t> rest(np, 0);  // floats after part i in a row
  for (size_t i = np - 1; i > 0; --i) rest[i - 1] = rest[i] + counts[i];
  for (int64_t r = r0; r < r1; ++r) {
    float* d = dst + r * row;
    for (size_t i = 0; i < np; ++i) {
      const int64_t n = counts[i];
      const float* src = parts[i] + r * n;
      int64_t j = 0;
      if (relu) {
        for (; j + 16 <= n; j += 16) _mm512_storeu_ps(d + j, relu_keep_nan(_mm512_loadu_ps(src + j)));
      } else {
        for (; j + 16 <= n; j += 16) _mm512_storeu_ps(d + j, _mm512_loadu_ps(src + j));
      }
      if (j < n) {
        const __mmask16 m = tail_mask(n - j);
        __m512 v = _mm512_maskz_loadu_ps(m, src + j);
        if (relu) v = relu_keep_nan(v);
        if (rest[i] >= 16 - (n - j)) {
          _mm512_storeu_ps(d + j, v);
        } else {
          _mm512_mask_storeu_ps(d + j, m, v);
        }
      }
      d += n;
    }
  }
}
#endif

// paragraph's own concat of contiguous parts: each row of the output (its dimensions before
// ``axis``) is its parts' rows one after another, copied with memcpy (or through the relu, in
// the same pass); rows split over the threads. PyTorch's cat_out copied the channel slices of
// NHWC tensors (Inception-v3's eleven joins) 10-30% slower than ONNX Runtime's concat on one
// thread and on two, and its relu was a second pass over the output (NASNet's joins: 2x).
// None where a part is not contiguous or of another dtype (cat_out takes those).
c10::optional<Form> own_concat(at::Tensor out, std::vector<at::Tensor> parts, int64_t axis,
                               bool relu, int64_t threads) {
  if (!out.is_contiguous() || !out.device().is_cpu() || axis < 0 || axis >= out.dim() ||
      (relu && out.scalar_type() != at::kFloat))
    return c10::nullopt;
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= out.size(d);
  const int64_t esize = out.element_size();
  std::vector<std::pair<const char*, int64_t>> src;  // a part's data and its row in bytes
  int64_t row = 0;
  for (const at::Tensor& t : parts) {
    if (!t.is_contiguous() || t.scalar_type() != out.scalar_type() || !t.device().is_cpu())
      return c10::nullopt;
    const int64_t bytes = outer ? t.numel() / outer * esize : 0;
    src.emplace_back(static_cast<const char*>(t.data_ptr()), bytes);
    row += bytes;
  }
  if (row * outer != out.numel() * esize) return c10::nullopt;
  char* dst = static_cast<char*>(out.data_ptr());
  // the tensors held as long as the form: the forms not chosen are dropped (`keep_chosen`),
  // and with them PyTorch's, which had held them; a caller that kept the function but not
  // its buffers had the copies write freed memory
  parts.push_back(out);
  auto held = std::make_shared<const std::vector<at::Tensor>>(std::move(parts));
#ifdef PARAGRAPH_AVX512
  if (out.scalar_type() == at::kFloat && __builtin_cpu_supports("avx512f")) {
    std::vector<const float*> fparts;
    std::vector<int64_t> counts;
    for (const auto& [data, bytes] : src) {
      fparts.push_back(reinterpret_cast<const float*>(data));
      counts.push_back(bytes / 4);
    }
    float* fdst = reinterpret_cast<float*>(dst);
    return Form([=]() {
      (void)held;
      split_rows(outer, row * outer, threads, [&](int64_t r0, int64_t r1) {
        concat_rows_avx512(fdst, fparts, counts, row / 4, relu, r0, r1);
      });
    });
  }
#endif
  return Form([=]() {
    (void)held;
    auto rows = [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        char* d = dst + r * row;
        for (const auto& [data, bytes] : src) {
          if (relu) {
            copy_relu(reinterpret_cast<float*>(d),
                      reinterpret_cast<const float*>(data + r * bytes), bytes / 4);
          } else {
            std::memcpy(d, data + r * bytes, bytes);
          }
          d += bytes;
        }
      }
    };
    split_rows(outer, row * outer, threads, rows);
  });
}

// tensors joined along ``axis`` into out (then relu): the own concat and PyTorch's, the faster
ffi::Function Concat(ffi::Tensor out_t, ffi::Array<ffi::Tensor> parts_t, int64_t axis,
                     ffi::String act, int64_t threads) {
  at::Tensor out = to_aten(out_t);
  std::vector<at::Tensor> parts;
  for (const ffi::Tensor& t : parts_t) parts.push_back(to_aten(t));
  std::string act_s(act);
  Form torch_cat = [out, parts, axis, act_s]() {
    at::Tensor o = out;
    at::cat_out(o, parts, axis);
    activate(o, act_s);
  };
  auto own = own_concat(out, parts, axis, act_s == "relu", threads);
  if (!own || (!act_s.empty() && act_s != "relu")) {
    return wrap([torch_cat, threads]() {
      use_threads(threads);
      torch_cat();
    });
  }
  std::vector<Form> forms{torch_cat, *own};
  // and on the calling thread alone: in a model a join reads what its producers just wrote,
  // half of it in the other core's cache, and NASNet-A mobile's joins ran 1.5-3.5x slower
  // split over two threads than on one
  if (threads > 1) forms.push_back(*own_concat(out, parts, axis, act_s == "relu", 1));
  return fastest_of(std::move(forms),
                    "concat" + std::to_string(threads) + act_s + std::to_string(axis) +
                        shape_key(parts) + shape_key({out}),
                    threads);
}

#ifdef PARAGRAPH_AVX512
// one step of a window's reduction: acc = max(acc, v), NaN once either is NaN, or acc + v.
// MAXPS returns its second operand where either is NaN, so max(v, acc) keeps a NaN acc; a
// NaN v is taken where the compare finds it (two operations a load: a NaN accumulator of its
// own, one more blend, ran the stride-2 pools 1.4-5.7% slower alone)
template <bool MAX>
__attribute__((target("avx512f"))) inline void pool_step(__m512& acc, __m512 v) {
  if (MAX) {
    acc = _mm512_mask_max_ps(v, _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v, acc);
  } else {
    acc = _mm512_add_ps(acc, v);
  }
}

template <bool MAX>
__attribute__((target("avx512f"))) inline __m512 pool_result(__m512 acc, __m512 scale) {
  return MAX ? acc : _mm512_mul_ps(acc, scale);
}

// one output pixel: the window rows [h0, h1) x columns [w0, w1) of x (at the image's first
// pixel) reduced over c channels into o; 64 channels at a time in four independent
// accumulators (one at a time, each load waited on the previous add: slower than TVM's
// kernels), then the rest a vector at a time, the last masked
template <bool MAX>
__attribute__((target("avx512f"))) void pool_pixel(const float* x, int64_t w, int64_t c,
                                                   int64_t h0, int64_t h1, int64_t w0,
                                                   int64_t w1, __m512 scale, float* o) {
  const __m512 init = MAX ? _mm512_set1_ps(-INFINITY) : _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 64 <= c; k += 64) {
    __m512 a0 = init, a1 = init, a2 = init, a3 = init;
    for (int64_t y = h0; y < h1; ++y) {
      for (int64_t z = w0; z < w1; ++z) {
        const float* p = x + (y * w + z) * c + k;
        pool_step<MAX>(a0, _mm512_loadu_ps(p));
        pool_step<MAX>(a1, _mm512_loadu_ps(p + 16));
        pool_step<MAX>(a2, _mm512_loadu_ps(p + 32));
        pool_step<MAX>(a3, _mm512_loadu_ps(p + 48));
      }
    }
    _mm512_storeu_ps(o + k, pool_result<MAX>(a0, scale));
    _mm512_storeu_ps(o + k + 16, pool_result<MAX>(a1, scale));
    _mm512_storeu_ps(o + k + 32, pool_result<MAX>(a2, scale));
    _mm512_storeu_ps(o + k + 48, pool_result<MAX>(a3, scale));
  }
  for (; k < c; k += 16) {
    const __mmask16 m = tail_mask(c - k);
    __m512 a = init;
    for (int64_t y = h0; y < h1; ++y)
      for (int64_t z = w0; z < w1; ++z)
        pool_step<MAX>(a, _mm512_maskz_loadu_ps(m, x + (y * w + z) * c + k));
    _mm512_mask_storeu_ps(o + k, m, pool_result<MAX>(a, scale));
  }
}
#endif

// paragraph's max and average pools of NHWC float32 tensors (AVX-512): each output pixel
// reduces its window's valid input pixels, padding left out (max) or counted in the divisor
// (average with include_pad, PyTorch's count_include_pad); a NaN in a window gives NaN, as
// PyTorch's max pool. Rows of the output are split over the OpenMP threads, so a pool runs on
// the team of the vendor kernels around it (TVM's pool kernels ran on TVM's own thread pool,
// and the OpenMP workers fell asleep while they did).
struct Pool {
  const float* x;
  float* out;
  int64_t n, h, w, c, oh, ow, kh, kw, sh, sw, pt, pl, pb, pr;
  bool is_max, include_pad;
  // an average pool's epilogue: out = out * scale + shift per channel (both or neither), then
  // relu; applied to each block of output rows right after it is written, while in L1
  const float* scale = nullptr;
  const float* shift = nullptr;
  bool relu = false;

  bool has_epilogue() const { return scale != nullptr || relu; }

#ifdef PARAGRAPH_AVX512
  __attribute__((target("avx512f"))) void epilogue(int64_t r0, int64_t r1) const {
    float* o = out + r0 * ow * c;
    for (int64_t i = 0; i < (r1 - r0) * ow; ++i, o += c) {
      for (int64_t k = 0; k < c; k += 16) {
        const __mmask16 m = tail_mask(c - k);
        __m512 v = _mm512_maskz_loadu_ps(m, o + k);
        if (scale != nullptr)
          v = _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(m, scale + k),
                              _mm512_maskz_loadu_ps(m, shift + k));
        if (relu) v = relu_keep_nan(v);
        _mm512_mask_storeu_ps(o + k, m, v);
      }
    }
  }
#endif

#ifdef PARAGRAPH_AVX512
  // output rows four at a time, column by column: the input rows the four windows share are
  // read while still in L1 (Inception-v3's stride-2 max pool over 147 x 147 x 64: 102 -> 88 us
  // from L3, its 35 x 35 x 288 average pool 55 -> 47 us)
  static constexpr int64_t kRowBlock = 4;

  // 1 / an average's divisor for the window at input row hs, column ws (its first, padding
  // included): the padded window's size with include_pad, else its pixels inside the image
  float inverse_count(int64_t hs, int64_t ws) const {
    const int64_t count =
        include_pad ? (std::min(hs + kh, h + pb) - hs) * (std::min(ws + kw, w + pr) - ws)
                    : (std::min(hs + kh, h) - std::max<int64_t>(hs, 0)) *
                          (std::min(ws + kw, w) - std::max<int64_t>(ws, 0));
    return count > 0 ? 1.0f / count : 0.0f;
  }

  __attribute__((target("avx512f"))) void rows(int64_t r0, int64_t r1) const {
    for (int64_t rb = r0; rb < r1; rb += kRowBlock) {
      const int64_t re = std::min(rb + kRowBlock, r1);
      for (int64_t j = 0; j < ow; ++j) {
        const int64_t ws = j * sw - pl;
        const int64_t w0 = std::max<int64_t>(ws, 0), w1 = std::min(ws + kw, w);
        for (int64_t r = rb; r < re; ++r) {  // r = (image, output row)
          const int64_t img = r / oh, hs = (r % oh) * sh - pt;
          const int64_t h0 = std::max<int64_t>(hs, 0), h1 = std::min(hs + kh, h);
          const __m512 scale = _mm512_set1_ps(inverse_count(hs, ws));
          float* o = out + (r * ow + j) * c;
          (is_max ? pool_pixel<true> : pool_pixel<false>)(x + img * h * w * c, w, c, h0, h1, w0,
                                                          w1, scale, o);
        }
      }
    }
  }
#endif

  // a 3 x 3 stride-1 average by sliding sums: for two output rows at a time and 32 channels,
  // each input column's vertical sums (four loads per vector) are computed once and added to
  // the next two columns' (per output under two loads and four adds, against a window's nine
  // and eight). Where the pool is bound by its loads and its adds' latency rather than by
  // memory it is faster (Inception-v3's 8 x 8 x 2048 pool in the model: 35 -> 28 us; alone,
  // alternating with the window form: 28.5 -> 26.1, 17 x 17 x 768 47.6 -> 44.9); in the
  // model its other pools read their input from L3 and the per-window form stays (each
  // chosen by timing in place). Four rows of 16 channels and one row of 64 were slower.
  bool slides() const {
    return !is_max && kh == 3 && kw == 3 && sh == 1 && sw == 1 && pt <= 2 && pl <= 2;
  }

#ifdef PARAGRAPH_AVX512
  // the vertical sums of input column z (zero outside the image) of NR output rows, V vectors
  // of channels from k (masks m)
  template <int NR, int V>
  __attribute__((target("avx512f"), always_inline)) inline void slide_column(
      const float* const* rowp, int64_t z, int64_t k, const __mmask16* m, __m512* v) const {
    const bool inside = z >= 0 && z < w;
#pragma GCC unroll 8
    for (int q = 0; q < V; ++q) {
      __m512 a[NR + 2];
#pragma GCC unroll 8
      for (int i = 0; i < NR + 2; ++i)
        a[i] = inside && rowp[i] ? _mm512_maskz_loadu_ps(m[q], rowp[i] + z * c + k + 16 * q)
                                 : _mm512_setzero_ps();
#pragma GCC unroll 8
      for (int i = 0; i < NR; ++i)
        v[i * V + q] = _mm512_add_ps(_mm512_add_ps(a[i], a[i + 1]), a[i + 2]);
    }
  }

  template <int NR, int V>
  __attribute__((target("avx512f"))) void slide_rows(int64_t r, const float* scales) const {
    const int64_t img = r / oh, ys = r % oh - pt;
    const float* xi = x + img * h * w * c;
    const float* rowp[NR + 2];
    for (int i = 0; i < NR + 2; ++i)
      rowp[i] = ys + i >= 0 && ys + i < h ? xi + (ys + i) * w * c : nullptr;
    float* o = out + r * ow * c;
    for (int64_t k = 0; k < c; k += 16 * V) {
      __mmask16 m[V];
      for (int q = 0; q < V; ++q) m[q] = c - k - 16 * q > 0 ? tail_mask(c - k - 16 * q) : 0;
      __m512 left[NR * V], mid[NR * V], right[NR * V];
      slide_column<NR, V>(rowp, -pl, k, m, left);
      slide_column<NR, V>(rowp, 1 - pl, k, m, mid);
      for (int64_t j = 0; j < ow; ++j) {
        slide_column<NR, V>(rowp, j + 2 - pl, k, m, right);
#pragma GCC unroll 8
        for (int i = 0; i < NR; ++i) {
          const __m512 scale = _mm512_set1_ps(scales[i * ow + j]);
#pragma GCC unroll 8
          for (int q = 0; q < V; ++q) {
            const int e = i * V + q;
            const __m512 sum = _mm512_add_ps(_mm512_add_ps(left[e], mid[e]), right[e]);
            _mm512_mask_storeu_ps(o + (i * ow + j) * c + k + 16 * q, m[q],
                                  _mm512_mul_ps(sum, scale));
            left[e] = mid[e];
            mid[e] = right[e];
          }
        }
      }
    }
  }

  // output rows [r0, r1) by `slide_rows`, two at a time within an image
  __attribute__((target("avx512f"))) void slide(int64_t r0, int64_t r1) const {
    std::vector<float> scales(2 * ow);
    for (int64_t r = r0; r < r1;) {
      const int64_t nr = std::min({int64_t{2}, r1 - r, (r / oh + 1) * oh - r});
      for (int64_t i = 0; i < nr; ++i)
        for (int64_t j = 0; j < ow; ++j)
          scales[i * ow + j] = inverse_count((r + i) % oh - pt, j - pl);
      if (nr == 2) {
        slide_rows<2, 2>(r, scales.data());
      } else {
        slide_rows<1, 2>(r, scales.data());
      }
      r += nr;
    }
  }
#endif

#ifdef PARAGRAPH_AVX512
  // a max pool read in the input's own order: each input row, front to back, is reduced over
  // every window's columns once, and that row maximum merged into each output row whose window
  // holds the input row (stored by the window's first row), software-prefetched ahead. Where
  // the input comes from memory (a stem pool after its ~2 ms convolution) the windows form,
  // reading 2 x 4 + 1 rows at once, ran 3-5x slower than a plain read of its input: in
  // Inception-v3 its 71 x 71 x 192 pool took 122 -> 75 us, ResNet-50's 127 -> 80 (one thread)
  template <int V>
  __attribute__((target("avx512f"), always_inline)) inline void stream_pixel(
      const float* row, int64_t z0, int64_t z1, int64_t k, const __mmask16* m, float* const* o,
      const bool* first, int64_t no) const {
    __m512 a[V];
#pragma GCC unroll 4
    for (int q = 0; q < V; ++q) a[q] = _mm512_set1_ps(-INFINITY);
    for (int64_t z = z0; z < z1; ++z) {
#pragma GCC unroll 4
      for (int q = 0; q < V; ++q)
        pool_step<true>(a[q], _mm512_maskz_loadu_ps(m[q], row + z * c + k + 16 * q));
    }
    for (int64_t i = 0; i < no; ++i) {
#pragma GCC unroll 4
      for (int q = 0; q < V; ++q) {
        __m512 v = a[q];
        if (!first[i]) pool_step<true>(v, _mm512_maskz_loadu_ps(m[q], o[i] + k + 16 * q));
        _mm512_mask_storeu_ps(o[i] + k + 16 * q, m[q], v);
      }
    }
  }

  // how far ahead of its reads `stream` prefetches (the hardware prefetchers did not follow
  // it): from memory, Inception-v3's 71 x 71 x 192 pool took 326 us without, 117 with 4 KB,
  // 112 with 8 KB and 130 with 16 KB ahead (its input in cache: 59-60 us in each)
  static constexpr int64_t kPrefetch = 8192;

  __attribute__((target("avx512f"))) void stream(int64_t r0, int64_t r1) const {
    for (int64_t r = r0; r < r1;) {
      const int64_t img = r / oh, i0 = r % oh, i1 = std::min(oh, i0 + (r1 - r));
      const float* xi = x + img * h * w * c;
      float* oi = out + img * oh * ow * c;
      const int64_t y0 = std::max<int64_t>(i0 * sh - pt, 0);
      const int64_t y1 = std::min((i1 - 1) * sh - pt + kh, h);
      for (int64_t y = y0; y < y1; ++y) {
        // the output rows [ia, ib] of [i0, i1) whose windows hold input row y
        const int64_t lo = y + pt - kh + 1;
        const int64_t ia = std::max(i0, lo <= 0 ? int64_t{0} : (lo + sh - 1) / sh);
        const int64_t ib = std::min(i1 - 1, (y + pt) / sh);
        float* o[kStreamRows];
        bool first[kStreamRows];
        int64_t no = 0;
        for (int64_t i = ia; i <= ib; ++i, ++no) {
          o[no] = oi + i * ow * c;
          first[no] = y == std::max<int64_t>(i * sh - pt, 0);
        }
        const float* row = xi + y * w * c;
        for (int64_t j = 0; j < ow; ++j) {
          const int64_t ws = j * sw - pl;
          const int64_t z0 = std::max<int64_t>(ws, 0), z1 = std::min(ws + kw, w);
          // the lines kPrefetch bytes past the columns this window adds (past a row's end: the
          // next row's, read next)
          const char* pf = reinterpret_cast<const char*>(row + z1 * c) + kPrefetch;
          const char* pf_end = reinterpret_cast<const char*>(row + std::min(z1 + sw, w) * c);
          for (; pf < pf_end + kPrefetch; pf += 64) _mm_prefetch(pf, _MM_HINT_T0);
          float* oj[kStreamRows];
          for (int64_t i = 0; i < no; ++i) oj[i] = o[i] + j * c;
          int64_t k = 0;
          const __mmask16 full[4] = {0xffff, 0xffff, 0xffff, 0xffff};
          for (; k + 64 <= c; k += 64) stream_pixel<4>(row, z0, z1, k, full, oj, first, no);
          for (; k < c; k += 16) {
            const __mmask16 m[1] = {tail_mask(c - k)};
            stream_pixel<1>(row, z0, z1, k, m, oj, first, no);
          }
        }
      }
      r += i1 - i0;
    }
  }
#endif

#ifdef PARAGRAPH_AVX512
  // the maximum over the window rows rowp[0, nrows) of input column z (-inf outside the image)
  template <int V>
  __attribute__((target("avx512f"), always_inline)) inline void carry_column(
      const float* const* rowp, int64_t nrows, int64_t z, const __mmask16* m, __m512* v) const {
#pragma GCC unroll 4
    for (int q = 0; q < V; ++q) v[q] = _mm512_set1_ps(-INFINITY);
    if (z < 0 || z >= w) return;
    for (int64_t i = 0; i < nrows; ++i) {
#pragma GCC unroll 4
      for (int q = 0; q < V; ++q)
        pool_step<true>(v[q], _mm512_maskz_loadu_ps(m[q], rowp[i] + z * c + 16 * q));
    }
  }

  // a 3-wide, column-stride-2 max pool over at most 64 channels (the stem pools after a
  // 64-channel convolution): per output row, each input column's maximum over the window rows
  // once, the window's third column carried in registers to the next output's first (six loads
  // an output where the windows form makes nine), the output written once (the input-order
  // form merges each input row into it: read and written three times); the rows new to this
  // output row are prefetched ahead in software, past a row's end into the next output row's
  template <int V>
  __attribute__((target("avx512f"))) void carry_rows(int64_t r0, int64_t r1) const {
    __mmask16 m[V];
    for (int q = 0; q < V; ++q) m[q] = tail_mask(c - 16 * q);
    const int64_t row_bytes = w * c * 4, step_bytes = sw * c * 4;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t img = r / oh, hs = (r % oh) * sh - pt;
      const int64_t h0 = std::max<int64_t>(hs, 0), h1 = std::min(hs + kh, h);
      const float* xi = x + img * h * w * c;
      const float* rowp[kStreamRows];
      for (int64_t y = h0; y < h1; ++y) rowp[y - h0] = xi + y * w * c;
      const int64_t nrows = h1 - h0, fresh = std::max(h0, h1 - sh);
      float* o = out + r * ow * c;
      __m512 c0[V], c1[V], c2[V];
      carry_column<V>(rowp, nrows, -pl, m, c0);
      for (int64_t j = 0; j < ow; ++j) {
        const int64_t ws = j * sw - pl;
        const int64_t ahead = (ws + kw) * c * 4 + kPrefetch;
        for (int64_t y = fresh; y < h1; ++y) {
          const char* row = reinterpret_cast<const char*>(xi + y * w * c);
          const char* pf =
              ahead < row_bytes ? row + ahead : row + sh * row_bytes + (ahead - row_bytes);
          for (int64_t b = 0; b < step_bytes; b += 64) _mm_prefetch(pf + b, _MM_HINT_T0);
        }
        carry_column<V>(rowp, nrows, ws + 1, m, c1);
        carry_column<V>(rowp, nrows, ws + 2, m, c2);
#pragma GCC unroll 4
        for (int q = 0; q < V; ++q) {
          __m512 v = c0[q];
          pool_step<true>(v, c1[q]);
          pool_step<true>(v, c2[q]);
          _mm512_mask_storeu_ps(o + j * c + 16 * q, m[q], v);
          c0[q] = c2[q];
        }
      }
    }
  }

  __attribute__((target("avx512f"))) void carry(int64_t r0, int64_t r1) const {
    switch ((c + 15) / 16) {
      case 1: carry_rows<1>(r0, r1); break;
      case 2: carry_rows<2>(r0, r1); break;
      case 3: carry_rows<3>(r0, r1); break;
      default: carry_rows<4>(r0, r1); break;
    }
  }
#endif

  // the carried form's condition: a max pool of 3-wide windows two columns apart, at most 64
  // channels, at most kStreamRows rows a window
  bool carries() const { return is_max && kw == 3 && sw == 2 && c <= 64 && kh <= kStreamRows; }

  // the streamed form's condition: a max pool whose input rows are each in the windows of at
  // most kStreamRows output rows
  static constexpr int64_t kStreamRows = 8;
  bool streams() const { return is_max && (kh + sh - 1) / sh <= kStreamRows; }

  // form 0: windows (`rows`), 1: sliding sums (`slide`), 2: the input's order (`stream`),
  // 3: columns carried (`carry`)
  void operator()(int64_t threads, int form = 0) const {
#ifdef PARAGRAPH_AVX512
    split_rows(n * oh, n * oh * ow * c * 4, threads, [this, form](int64_t r0, int64_t r1) {
      // with an epilogue, kRowBlock rows at a time (each form's own block or a multiple of it)
      const int64_t step = has_epilogue() ? kRowBlock : r1 - r0;
      for (int64_t rb = r0; rb < r1; rb += step) {
        const int64_t re = std::min(rb + step, r1);
        if (form == 1) {
          slide(rb, re);
        } else if (form == 2) {
          stream(rb, re);
        } else if (form == 3) {
          carry(rb, re);
        } else {
          rows(rb, re);
        }
        if (has_epilogue()) epilogue(rb, re);
      }
    });
#endif
  }
};

// a max (is_max) or average pool on TVM's NHWC buffers; params: window (2), stride (2),
// padding (top, left, bottom, right)
ffi::Function Pool2d(ffi::Tensor out_t, ffi::Tensor x_t, ffi::Array<int64_t> params,
                     bool is_max, bool include_pad, ffi::Optional<ffi::Tensor> scale_t,
                     ffi::Optional<ffi::Tensor> shift_t, bool relu, int64_t threads) {
  at::Tensor out_buffer = to_aten(out_t), x_buffer = to_aten(x_t);
  std::vector<int64_t> p(params.begin(), params.end());
  TVM_FFI_ICHECK(p.size() == 8) << "pool2d: 8 parameters";
  TVM_FFI_ICHECK(x_buffer.dim() == 4 && out_buffer.dim() == 4) << "pool2d: NHWC tensors";
  TVM_FFI_ICHECK(scale_t.has_value() == shift_t.has_value()) << "pool2d: scale and shift";
  at::Tensor scale, shift;  // the epilogue's, (C) each
  if (scale_t.has_value()) {
    scale = to_aten(scale_t.value()).reshape({-1});
    shift = to_aten(shift_t.value()).reshape({-1});
    TVM_FFI_ICHECK(scale.numel() == out_buffer.size(3) && shift.numel() == out_buffer.size(3))
        << "pool2d: a scale and shift per channel";
  }
  at::Tensor x = nchw(x_buffer), out = nchw(out_buffer);
  Form aten = [=]() {  // PyTorch's pools (symmetric padding) on NCHW views of the NHWC buffers
    at::Tensor o = out;
    if (is_max) {
      o.copy_(at::max_pool2d(x, {p[0], p[1]}, {p[2], p[3]}, {p[4], p[5]}));
    } else {
      o.copy_(at::avg_pool2d(x, {p[0], p[1]}, {p[2], p[3]}, {p[4], p[5]}, false, include_pad));
    }
    if (scale.defined()) o.copy_(at::addcmul(shift.view({-1, 1, 1}), o, scale.view({-1, 1, 1})));
    if (relu) o.relu_();
  };
#ifdef PARAGRAPH_AVX512
  const bool own_ok = __builtin_cpu_supports("avx512f") && plain_float(x_buffer) &&
                      plain_float(out_buffer) && x_buffer.size(0) == out_buffer.size(0) &&
                      x_buffer.size(3) == out_buffer.size(3) &&
                      (!scale.defined() || (plain_float(scale) && plain_float(shift)));
#else
  const bool own_ok = false;
#endif
  if (!own_ok) {
    return wrap([aten, threads]() {
      use_threads(threads);
      aten();
    });
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
  // forms by index: windows, then the sliding sums, the input's order or the carried columns
  // where they apply
  std::vector<Form> forms{form(0)};
  if (pool.slides()) forms.push_back(form(1));
  if (pool.streams()) forms.push_back(form(2));
  if (pool.carries()) forms.push_back(form(3));
  if (forms.size() == 1) return wrap(forms[0]);
  return fastest_of(std::move(forms),
                    (is_max ? "maxpool" : "avgpool3") + std::to_string(threads) + ints(p) +
                        (include_pad ? "i" : "") + (pool.has_epilogue() ? "e" : "") +
                        shape_key({x_buffer}),
                    threads);
}

#ifdef PARAGRAPH_AVX512
// e^x in 16 lanes: x = k ln 2 + r with |r| <= ln 2 / 2 (ln 2 in two parts, so r is exact),
// e^r by its degree-6 Taylor polynomial (relative error under 2e-7), times 2^k by scalef (which
// rounds e^x below 2^-149 to 0). NaN stays NaN: the clamps return x itself where it is NaN.
__attribute__((target("avx512f"), always_inline)) inline __m512 exp_avx512(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(88.8f), x));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.42860682030941723e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
#pragma GCC unroll 8
  for (float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, k);
}

// R rows of out = softmax(s x) over their n values (x and out at the first row): each row's
// maximum, e^(x - max) written to out and summed, then scaled by 1 / sum while the rows are in
// cache. R rows side by side, so that one row's chain of latencies (the maximum's and the sum's
// reductions, the exponential's ten dependent steps) overlaps the others' work: a 128-wide row
// alone is too short to hide them (one at a time: 1.3x ONNX Runtime's time). A row with a NaN
// gives NaN throughout, one of -inf only NaN (as torch's: -inf - -inf). The loops over the R
// rows are unrolled by pragma: at -O2 GCC kept them as loops with the rows' vectors in memory
// (1.5x the time), and rows of whole vectors (Full: n a multiple of 16) run without masks,
// which cost Zen 5 another 1.3x (12 x 128 rows of 128, one thread: 63 -> 33 us, ORT 45)
template <int R, bool Full>
__attribute__((target("avx512f"))) void softmax_group(const float* __restrict__ x,
                                                      float* __restrict__ out, int64_t n,
                                                      float s) {
  const __m512 lowest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 sv = _mm512_set1_ps(s);
  __m512 m[R], top[R], sum[R], scale[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) m[r] = lowest;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = Full ? 0xFFFF : tail_mask(n - i);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      if constexpr (Full)
        m[r] = _mm512_max_ps(m[r], _mm512_mul_ps(_mm512_loadu_ps(x + r * n + i), sv));
      else
        m[r] = _mm512_mask_max_ps(m[r], mask, m[r],
                                  _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + r * n + i), sv));
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    top[r] = _mm512_set1_ps(_mm512_reduce_max_ps(m[r]));
    sum[r] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = Full ? 0xFFFF : tail_mask(n - i);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      if constexpr (Full) {
        const __m512 e = exp_avx512(_mm512_fmsub_ps(_mm512_loadu_ps(x + r * n + i), sv, top[r]));
        _mm512_storeu_ps(out + r * n + i, e);
        sum[r] = _mm512_add_ps(sum[r], e);
      } else {
        const __m512 e = exp_avx512(
            _mm512_fmsub_ps(_mm512_maskz_loadu_ps(mask, x + r * n + i), sv, top[r]));
        _mm512_mask_storeu_ps(out + r * n + i, mask, e);
        sum[r] = _mm512_mask_add_ps(sum[r], mask, sum[r], e);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) scale[r] = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum[r]));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = Full ? 0xFFFF : tail_mask(n - i);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      float* o = out + r * n + i;
      if constexpr (Full)
        _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_loadu_ps(o), scale[r]));
      else
        _mm512_mask_storeu_ps(o, mask, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, o), scale[r]));
    }
  }
}

// rows [r0, r1) of out = softmax(s x) over their n values, four at a time
__attribute__((target("avx512f"))) void softmax_rows(const float* x, float* out, int64_t r0,
                                                     int64_t r1, int64_t n, float s) {
  int64_t row = r0;
  if (n % 16 == 0) {
    for (; row + 4 <= r1; row += 4) softmax_group<4, true>(x + row * n, out + row * n, n, s);
    for (; row < r1; ++row) softmax_group<1, true>(x + row * n, out + row * n, n, s);
  } else {
    for (; row + 4 <= r1; row += 4) softmax_group<4, false>(x + row * n, out + row * n, n, s);
    for (; row < r1; ++row) softmax_group<1, false>(x + row * n, out + row * n, n, s);
  }
}
#endif

// softmax of scale * x along ``axis`` into out (an attention's 1 / sqrt(d) absorbed): ATen's,
// and along the last axis an own AVX-512 form (rows split over the threads), the faster by
// timing (ATen's took BERT's 128-wide attention rows 1.7x as long as ONNX Runtime's on one
// thread)
ffi::Function Softmax(ffi::Tensor out_t, ffi::Tensor x_t, int64_t axis, double scale,
                      int64_t threads) {
  at::Tensor out = to_aten(out_t), x = to_aten(x_t);
  Form aten = [out, x, axis, scale]() {
    at::Tensor o = out;
    if (scale != 1.0) {  // scaled into the output, normalised there in place
      at::mul_out(o, x, at::Scalar(scale));
      at::_softmax_out(o, o, axis, false);
    } else {
      at::_softmax_out(o, x, axis, false);
    }
  };
#ifdef PARAGRAPH_AVX512
  const int64_t last = x.dim() - 1;
  if (__builtin_cpu_supports("avx512f") && x.dim() >= 1 && (axis == last || axis == -1) &&
      x.size(last) > 0 && plain_float(x) && plain_float(out) && out.sizes() == x.sizes()) {
    const int64_t n = x.size(last), rows = x.numel() / n;
    // the views hold TVM's buffers alive as long as the form
    const float s = static_cast<float>(scale);
    auto own = [x, out, rows, n, s](int64_t team) -> Form {
      return [x, out, rows, n, s, team]() {
        const float* src = x.data_ptr<float>();
        float* dst = out.data_ptr<float>();
        split_rows(rows, rows * n * 4, team,
                   [&](int64_t r0, int64_t r1) { softmax_rows(src, dst, r0, r1, n, s); });
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
  return wrap([aten, threads]() {
    use_threads(threads);
    aten();
  });
}

// Rows [0, rows) of out = layer_norm(x + res) over their n values (res may be null), in one
// pass over the inputs: the sum is written to out and normalised there while the row is in
// cache. AVX-512 (the caller checks the CPU has it); single-threaded (one row is 4 KB: a
// parallel region would cost more than it saves).
#ifdef PARAGRAPH_AVX512
__attribute__((target("avx512f"))) void layer_norm_avx512(
    const float* __restrict__ x, const float* __restrict__ res, const float* __restrict__ gamma,
    const float* __restrict__ beta, float* __restrict__ out, int64_t rows, int64_t n,
    float eps) {
  const int64_t vec = n - n % 16;
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict__ xr = x + r * n;
    const float* __restrict__ rr = res ? res + r * n : nullptr;
    float* __restrict__ o = out + r * n;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < vec; i += 16) {
      __m512 v = _mm512_loadu_ps(xr + i);
      if (rr) v = _mm512_add_ps(v, _mm512_loadu_ps(rr + i));
      _mm512_storeu_ps(o + i, v);
      acc = _mm512_add_ps(acc, v);
    }
    float sum = _mm512_reduce_add_ps(acc);
    for (int64_t i = vec; i < n; ++i) {
      o[i] = xr[i] + (rr ? rr[i] : 0.0f);
      sum += o[i];
    }
    const float mean = sum / static_cast<float>(n);
    const __m512 m = _mm512_set1_ps(mean);
    __m512 sq = _mm512_setzero_ps();
    for (int64_t i = 0; i < vec; i += 16) {
      __m512 d = _mm512_sub_ps(_mm512_loadu_ps(o + i), m);
      sq = _mm512_fmadd_ps(d, d, sq);
    }
    float var = _mm512_reduce_add_ps(sq);
    for (int64_t i = vec; i < n; ++i) var += (o[i] - mean) * (o[i] - mean);
    const float rstd = 1.0f / std::sqrt(var / static_cast<float>(n) + eps);
    const __m512 rs = _mm512_set1_ps(rstd);
    for (int64_t i = 0; i < vec; i += 16) {
      __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(o + i), m), rs);
      _mm512_storeu_ps(o + i, _mm512_fmadd_ps(v, _mm512_loadu_ps(gamma + i),
                                              _mm512_loadu_ps(beta + i)));
    }
    for (int64_t i = vec; i < n; ++i) o[i] = (o[i] - mean) * rstd * gamma[i] + beta[i];
  }
}
#endif

// layer norm over the last axis of x (+ res) into out. Two forms, the faster chosen by
// `Fastest`: ATen's add and norm (on the schedule's threads; the sum and the statistics in
// buffers of their own, allocated once), and, for contiguous float32 tensors of one shape on
// an AVX-512 CPU, `layer_norm_avx512` (one thread, one pass): BERT's 64 x 1024 residual norms
// took 96 us each in the model with ATen's two kernels, where ONNX Runtime's fused one takes 37.
ffi::Function LayerNorm(ffi::Tensor out_t, ffi::Tensor x_t, ffi::Tensor gamma_t,
                        ffi::Tensor beta_t, ffi::Optional<ffi::Tensor> res_t, double eps,
                        int64_t threads) {
  at::Tensor out = to_aten(out_t), x = to_aten(x_t), gamma = to_aten(gamma_t),
             beta = to_aten(beta_t);
  c10::optional<at::Tensor> res;
  if (res_t.has_value()) res = to_aten(res_t.value());
  std::vector<int64_t> stat_shape = x.sizes().vec();
  stat_shape.back() = 1;
  at::Tensor mean = at::empty(stat_shape, x.options()), rstd = at::empty(stat_shape, x.options());
  at::Tensor sum = res ? at::empty_like(x) : x;
  std::vector<int64_t> normalized{x.size(-1)};
  Form aten = [=]() mutable {
    if (res) at::add_out(sum, x, *res);
    at::native_layer_norm_out(out, mean, rstd, sum, normalized, gamma, beta, eps);
  };
#ifdef PARAGRAPH_AVX512
  const bool fused_ok =
      __builtin_cpu_supports("avx512f") && x.dim() >= 1 && x.size(-1) > 0 && plain_float(x) &&
      plain_float(out) && plain_float(gamma) && plain_float(beta) && out.sizes() == x.sizes() &&
      gamma.numel() == x.size(-1) && beta.numel() == x.size(-1) &&
      (!res || (plain_float(*res) && res->sizes() == x.sizes()));
#else
  const bool fused_ok = false;
#endif
  if (!fused_ok) {
    return wrap([aten, threads]() {
      use_threads(threads);
      aten();
    });
  }
  const int64_t n = x.size(-1), rows = x.numel() / n;
  const float feps = static_cast<float>(eps);
  // the views hold TVM's buffers alive as long as the form
  Form fused = [x, res, gamma, beta, out, rows, n, feps]() {
#ifdef PARAGRAPH_AVX512
    layer_norm_avx512(x.data_ptr<float>(), res ? res->data_ptr<float>() : nullptr,
                      gamma.data_ptr<float>(), beta.data_ptr<float>(), out.data_ptr<float>(),
                      rows, n, feps);
#endif
  };
  return fastest_of({fused, aten},
                    "layer_norm" + std::to_string(threads) + (res ? "res" : "") + shape_key({x}),
                    threads);
}

// the keys of the packed weights held now (address, packing, shape, strides, @threads): for
// tests of what is shared
ffi::Array<ffi::String> PackedKeys() {
  std::lock_guard<std::mutex> lock(packed_mutex);
  ffi::Array<ffi::String> keys;
  for (const auto& entry : packed_weights) keys.push_back(ffi::String(entry.first));
  return keys;
}

// the calls the kernels bound so far in this process may spend timing their forms before
// each runs only its chosen one (the most forms of any, each timed kTrials + 1 times)
int64_t TimingCalls() { return most_forms.load() * (kTrials + 1); }

// the kernels bound and alive in this process that have not yet chosen their form: 0 once
// every one runs only its chosen form (a kernel whose form an earlier binding chose counts
// until its first call)
int64_t TimingKernels() { return timing_kernels.load(); }

// the forms chosen so far, as "key=index" (index into the kernel's forms, in their order of
// preference): for tests and for finding where a library's form lost
ffi::Array<ffi::String> ChosenForms() {
  std::lock_guard<std::mutex> lock(chosen_mutex);
  ffi::Array<ffi::String> out;
  for (const auto& entry : chosen_forms)
    out.push_back(ffi::String(entry.first + "=" + std::to_string(entry.second)));
  return out;
}

// choose form ``index`` for the kernels of ``key`` (as `ChosenForms` lists them) bound from now
// on, or timed but not yet chosen: to run two builds of these kernels with the same forms
// (`benchmarks/ab.py`)
void ChooseForm(ffi::String key, int64_t index) {
  TVM_FFI_ICHECK(index >= 0) << "a form's index is at least 0";
  std::lock_guard<std::mutex> lock(chosen_mutex);
  chosen_forms[std::string(key)] = static_cast<int>(index);
}

// Bind the calling thread's OpenMP team (the one its torch, oneDNN and own-GEMM regions use) one
// thread per CPU of ``cpus``, the caller on the first (`threads.stream_teams`): unbound, after a
// pause the OS often woke the worker on the caller's core and kept the two there.
void BindTeam(ffi::Array<int64_t> cpus) {
  std::vector<int> cores;
  for (int64_t c : cpus) cores.push_back(static_cast<int>(c));
  if (cores.empty()) return;
  auto bind = [&cores](int i) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cores[static_cast<size_t>(i) % cores.size()], &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  };
  use_threads(static_cast<int64_t>(cores.size()));
#ifdef _OPENMP
#pragma omp parallel num_threads(static_cast<int>(cores.size()))
  bind(omp_get_thread_num());
#else
  bind(0);
#endif
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_bind_team, BindTeam);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_choose_form, ChooseForm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_chosen_forms, ChosenForms);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_timing_calls, TimingCalls);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_timing_kernels, TimingKernels);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_packed_keys, PackedKeys);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_conv2d, Conv2d);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_linear, Linear);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_product, Product);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_concat, Concat);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_softmax, Softmax);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_pool2d, Pool2d);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(paragraph_vendor_layer_norm, LayerNorm);
