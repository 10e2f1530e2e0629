// Form selection by timing in place: a kernel with several forms (`Form`) on the same buffers times
// them in its first calls (`kTrials` each), then runs the fastest (a later form only where it wins
// by `kMargin`), chosen once per key in the process (`chosen_forms`; `Fastest`, `fastest_of`); how
// many calls and kernels are still timing (`TimingCalls`, `TimingKernels`), the choices made and
// set (`ChosenForms`, `ChooseForm`), and a form forced on every kernel that has not chosen yet
// (`ForceForm`, `MostForms`: the differential fuzzer runs each form in turn), exported by
// kernels.cc.
//
// Included only by kernels.cc, the kernels' translation unit: its definitions lie in
// kernels.cc's anonymous namespace, after those of the headers it includes.
#pragma once

#include "common.h"
#include "threads.h"
#include "packing.h"
#include "aten.h"

namespace {

// timed calls per form before choosing (the first is discarded); `measure.SETTLE_RUNS` warms a
// program up past them (up to six forms: 30 calls; `TimingCalls` says how many this process's
// kernels need)
constexpr int kTrials = 4;
// a later form's median against the earlier best's: paragraph.timing.MARGIN, the one margin for
// "faster beyond noise", given by the build (native.py) as PARAGRAPH_MARGIN
#ifndef PARAGRAPH_MARGIN
#error "build with -DPARAGRAPH_MARGIN=<paragraph.timing.MARGIN>"
#endif
constexpr double kMargin = 1.0 - PARAGRAPH_MARGIN;

using Form = std::function<void()>;

// forms chosen once per (kernel, shapes, threads) in the process: executors bound later start
// with the choice (as `torch_kernels._CHOSEN`)
std::mutex chosen_mutex;
std::map<std::string, int> chosen_forms;

// the kernels alive that have not chosen their form yet (see `TimingKernels`)
std::atomic<int64_t> timing_kernels{0};

// the form every kernel that has not chosen one runs while it is at least 0 (its last where it
// has fewer), neither timed nor looked up in `chosen_forms` (see `ForceForm`)
std::atomic<int64_t> forced_form{-1};

// One kernel with several forms on the same buffers, in order of preference (the own forms
// before PyTorch's, `is_aten`, whatever their index): the first calls alternate between them,
// timed, then the fastest by median runs, a later form only where it is `kMargin` faster than
// the earlier ones (see `torch_kernels._Fastest`).
struct Fastest {
  std::vector<Form> forms;
  std::string key;
  int64_t threads;
  int chosen = -1;
  std::vector<std::vector<double>> samples;
  std::vector<bool> untimed;  // forms left out of the timing (PyTorch's, `torch_forms_timed`)
  bool timing = true;  // counted in timing_kernels until a form is chosen

  Fastest() { ++timing_kernels; }
  ~Fastest() {
    if (timing) --timing_kernels;
  }

  void operator()() {
    use_threads(threads);
    const int64_t forced = forced_form.load();
    if (forced >= 0 && chosen < 0) {  // forms are released once chosen: only before then
      forms[std::min(static_cast<size_t>(forced), forms.size() - 1)]();
      return;
    }
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
    if (samples.empty()) {
      samples.resize(forms.size());
      untimed.assign(forms.size(), false);
      if (!torch_forms_timed() && !std::all_of(forms.begin(), forms.end(), is_aten))
        for (size_t j = 0; j < forms.size(); ++j) untimed[j] = is_aten(forms[j]);
    }
    size_t i = 0;
    while (untimed[i]) ++i;  // (one form at least is timed)
    for (size_t j = i + 1; j < samples.size(); ++j)
      if (!untimed[j] && samples[j].size() < samples[i].size()) i = j;
    auto start = std::chrono::steady_clock::now();
    forms[i]();
    samples[i].push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    for (size_t j = 0; j < samples.size(); ++j)
      if (!untimed[j] && static_cast<int>(samples[j].size()) <= kTrials) return;
    // the own forms before PyTorch's, each in its order: a form of PyTorch's is chosen only
    // where it wins by the margin, as it loads libtorch (~105 MiB resident) into a process that
    // runs own forms alone otherwise (a deployed artifact's)
    std::vector<size_t> order;
    for (int aten_pass = 0; aten_pass < 2; ++aten_pass)
      for (size_t j = 0; j < forms.size(); ++j)
        if (!untimed[j] && is_aten(forms[j]) == (aten_pass == 1)) order.push_back(j);
    double best_time = 0;
    for (size_t j : order) {
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
    untimed.clear();
    sweep_packed<View>();
    if (const AtenForms* aten = aten_if_loaded()) aten->sweep_packed();
  }
};

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

// a kernel with one form, run on ``threads`` threads
ffi::Function single_form(Form form, int64_t threads) {
  return wrap([form = std::move(form), threads]() {
    use_threads(threads);
    form();
  });
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

// force form ``index`` (the last where a kernel has fewer) on every kernel that has not chosen
// its form, from its next call until called with -1: each form runs, untimed, whatever the
// timing would choose (the differential fuzzer compares every form with a reference)
void ForceForm(int64_t index) { forced_form.store(index < 0 ? -1 : index); }

// the most forms of any kernel bound in this process: the indices worth forcing
int64_t MostForms() { return most_forms.load(); }

}  // namespace
