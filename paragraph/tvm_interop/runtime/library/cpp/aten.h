// The ATen library as the kernels see it: its path, given by Python at load
// (`SetAtenLibrary`, exported by kernels.cc), the library loaded on first need (`aten`), and a
// form of it at its place among a kernel's forms, made on its first call (`deferred`). A process
// whose kernels run only own forms never maps libtorch_cpu (~105 MiB resident: a deployed
// artifact's chosen forms); one that times every form (a fresh build) loads it at the first
// call of such a form.
//
// Included only by kernels.cc, the kernels' translation unit: its definitions lie in
// kernels.cc's anonymous namespace, after those of the headers it includes.
#pragma once

#include <dlfcn.h>

#include "common.h"
#include "aten_forms.h"

namespace {

std::mutex aten_mutex;
std::string aten_path;                     // where Python said the ATen library lies
std::atomic<const AtenForms*> aten_table{nullptr};  // its forms, once loaded

// the ATen library's path (native.py gives it once the kernels are loaded)
void SetAtenLibrary(ffi::String path) {
  std::lock_guard<std::mutex> lock(aten_mutex);
  aten_path = std::string(path);
}

// the ATen library's forms, the library loaded on the first call (with its own symbols: a
// second build's beside it, `native.variant`, keeps its own)
const AtenForms& aten() {
  if (const AtenForms* table = aten_table.load()) return *table;
  std::lock_guard<std::mutex> lock(aten_mutex);
  if (const AtenForms* table = aten_table.load()) return *table;
  if (aten_path.empty())
    TVM_FFI_THROW(RuntimeError) << "paragraph's vendor kernels were not given their ATen library "
                                   "(paragraph_vendor_set_aten_library)";
  void* handle = dlopen(aten_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr)
    TVM_FFI_THROW(RuntimeError) << "paragraph's ATen library " << aten_path
                                << " did not load: " << dlerror();
  using Entry = const void* (*)(int64_t, int64_t);
  auto entry = reinterpret_cast<Entry>(dlsym(handle, "paragraph_aten_forms"));
  const void* table = entry ? entry(kAtenFormsVersion, sizeof(AtenForms)) : nullptr;
  if (table == nullptr)
    TVM_FFI_THROW(RuntimeError) << "paragraph's ATen library " << aten_path
                                << " is of another build than the kernels";
  aten_table.store(static_cast<const AtenForms*>(table));
  return *aten_table.load();
}

// the ATen library's forms where it is loaded already, else null (nothing loads it)
const AtenForms* aten_if_loaded() { return aten_table.load(); }

// A form of the ATen library's, made on its first call: its index among the kernel's forms
// stays where it was (an artifact's choices name forms by index), and a kernel that never runs
// it never loads the library. Copies share the one form made. A type of its own, so that
// `Fastest` tells PyTorch's forms from the own ones (`is_aten`).
struct DeferredAten {
  std::function<Form(const AtenForms&)> make;
  std::shared_ptr<Form> made;
  void operator()() const {
    if (!*made) *made = make(aten());
    (*made)();
  }
};

Form deferred(std::function<Form(const AtenForms&)> make) {
  return DeferredAten{std::move(make), std::make_shared<Form>()};
}

bool is_aten(const Form& form) { return form.target<DeferredAten>() != nullptr; }

// whether a kernel's timing may choose one of PyTorch's forms where it has an own one: not
// with PARAGRAPH_TORCH_FORMS=0 (read once), so that a program built so runs, and its artifact
// loads, without libtorch (~105 MiB resident) wherever an own form exists, at the speed the
// own forms have there (docs/performance.md, memory)
inline bool torch_forms_timed() {
  static const bool ok = [] {
    const char* value = std::getenv("PARAGRAPH_TORCH_FORMS");
    return !(value && std::string(value) == "0");
  }();
  return ok;
}

}  // namespace
