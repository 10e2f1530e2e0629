// The OpenMP threads of the kernels: the calling thread's team size (`use_threads`), a team's
// parallel region (`parallel`), rows split evenly where the work is worth a region (`split_rows`),
// a grid of panels x tiles split into equal shares (`panel_share`), and a stream's team bound to
// its CPUs (`BindTeam`, exported by kernels.cc).
//
// Included only by kernels.cc, the kernels' translation unit: its definitions lie in
// kernels.cc's anonymous namespace, after those of the headers it includes.
#pragma once

#include "common.h"

namespace {

// the calling thread's OpenMP team size for the regions that follow: OpenMP's own (the runtime
// PyTorch's libgomp is, where both are loaded: native.py links this library so), which the ATen
// forms read too (they set MKL's count besides: aten_forms.cc)
void use_threads(int64_t n) {
#ifdef _OPENMP
  if (omp_get_max_threads() != n) omp_set_num_threads(static_cast<int>(n));
#else
  (void)n;
#endif
}

// share(t, nt) for each thread t of a team of ``threads`` OpenMP threads (nt as OpenMP gave);
// share(0, 1) on the calling thread alone for one thread or a build without OpenMP (the
// `library.native` build warned)
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
