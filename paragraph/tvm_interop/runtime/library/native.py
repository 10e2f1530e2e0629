"""The CPU vendor kernels in C++ (``cpp/``): convolutions, products (with a constant matrix or
of two activations), concatenations, pools, softmax and layer norm bound once to TVM's buffers
as TVM FFI functions (PyTorch's oneDNN and MKL calls, and paragraph's own forms where those are
faster, chosen per shape by timing), which the native stream runner calls without the GIL.

Two libraries: the kernels' (``kernels.cc`` and a header per family, TVM FFI's headers only),
which Python loads, and the ATen library (``aten_forms.cc``, which links libtorch_cpu), which
the kernels' library loads only when a kernel first runs a form of PyTorch's (``cpp/aten.h``):
a process whose kernels all chose own forms (a deployed artifact's) never maps libtorch_cpu,
~105 MiB resident. Built on first use with the system C++ compiler (the ATen library against
PyTorch's headers; about 30 s), cached under `paragraph.files.cache_dir`. Without a compiler or
PyTorch's headers, or with ``PARAGRAPH_NATIVE=0`` or ``PARAGRAPH_NATIVE_VENDOR=0``, `bind`
returns None and the executor binds the Python kernels of `runtime` (same results)."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import tvm
import tvm_ffi

from paragraph.errors import ParagraphError, reraise_interrupt
from paragraph.files import cache_dir
from paragraph.timing import MARGIN
from paragraph.tvm_interop.runtime.library import torch_kernels
from paragraph.tvm_interop.runtime.library.names import POOLS, VendorOp, is_vendor_name
from paragraph.tvm_interop.runtime.native import build_library

CPP = Path(__file__).parent / "cpp"  # the kernels' folder: kernels.cc and its headers
SOURCE = CPP / "kernels.cc"  # the kernels' translation unit: it includes the headers beside it
ATEN_SOURCE = CPP / "aten_forms.cc"  # the ATen library's (a revision before it had none)
SUFFIXES = (".cc", ".h")  # the files of the folder that make the kernels
_lock = threading.Lock()
_state: dict[str, Any] = {}
_binding = threading.local()  # .module: the module `bind` uses on this thread (`using`)


class KernelShapeError(ParagraphError, ValueError):
    """A C++ vendor kernel refused the tensors it was bound to: a shape that does not follow
    from the others and the call's parameters (the message names the entry point and the
    mismatch). A ValueError too, as TVM FFI raises the C++ kernels' refusals."""


# the one margin for "faster beyond noise" (`paragraph.timing.MARGIN`): a kernel's later form
# must beat the earlier best by it (forms.h); part of the library's name and revision
_MARGIN_FLAG = f"-DPARAGRAPH_MARGIN={MARGIN!r}"


def sources(folder: Path = CPP) -> dict[str, bytes]:
    """The C++ kernels' files in ``folder`` (``kernels.cc``, ``aten_forms.cc`` and their
    headers): name -> text, by name. What `revision`, the cached libraries' name and `variant`
    take: every file of it."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())
            if p.is_file() and p.suffix in SUFFIXES and not p.name.startswith(".")}


def _serialized(files: Mapping[str, bytes]) -> bytes:
    """``files`` as one text to hash: each file's name, length and text, by name (so that moving
    code between files, or renaming one, changes it)."""
    return b"".join(name.encode() + b"\0" + str(len(files[name])).encode() + b"\0" + files[name]
                    for name in sorted(files))


@functools.cache
def revision() -> str:
    """Which implementation of the CPU vendor kernels this process runs: the C++ kernels'
    (every file of ``cpp/``) and the Python kernels' source, hashed (``n``: the C++ ones, ``o``:
    the C++ ones with PyTorch's forms untimed, `torch_forms_timed`; ``p``: the Python ones).
    Vendor kernel costs are cached under it: a change to how a vendor kernel runs (packed
    weights shared between calls made the SRU's products 1.7x faster) voids their old
    times."""
    text = (_serialized(sources()) + Path(__file__).with_name("torch_kernels.py").read_bytes()
            + _MARGIN_FLAG.encode())
    # PARAGRAPH_TORCH_FORMS=0 (`torch_forms_timed`, aten.h) changes which forms kernels run
    kind = "p" if _switched_off() else ("o" if not torch_forms_timed() else "n")
    return kind + hashlib.blake2b(text, digest_size=6).hexdigest()


def torch_forms_timed() -> bool:
    """Whether the C++ kernels' timing may choose PyTorch's forms (oneDNN, MKL) where a kernel
    has an own form: not with ``PARAGRAPH_TORCH_FORMS=0``, which keeps libtorch (~105 MiB
    resident) out of a process, and a loaded artifact built so, wherever own forms exist."""
    return os.environ.get("PARAGRAPH_TORCH_FORMS") != "0"


def _switched_off() -> bool:
    """``PARAGRAPH_NATIVE=0`` or ``PARAGRAPH_NATIVE_VENDOR=0``: the Python kernels run."""
    return "0" in (os.environ.get("PARAGRAPH_NATIVE", "1"),
                   os.environ.get("PARAGRAPH_NATIVE_VENDOR", "1"))


def _torch_version() -> str:
    """The installed PyTorch's version, read without importing it (1.7 s and about 120 MiB
    that a process running a loaded artifact need not pay: the library links libtorch
    itself). Raises ImportError where PyTorch is not installed."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        raise ImportError("PyTorch is not installed (the torch extra)") from None


def _library_path(files: Mapping[str, bytes] | None = None,
                  kind: str = "vendor_kernels") -> Path:
    """Where the library built from ``files`` (this folder's: `sources`) is cached: named by
    a hash of every file, TVM FFI's and PyTorch's versions (a header's change builds anew)."""
    key = hashlib.sha256(_serialized(sources() if files is None else files)
                         + tvm_ffi.__version__.encode() + _torch_version().encode()
                         + _MARGIN_FLAG.encode())
    return cache_dir() / "native" / f"{kind}-{key.hexdigest()[:16]}.so"


def _aten_path(kernels: Path) -> Path:
    """Where the ATen library of the kernels' library ``kernels`` lies: beside it, named by the
    same hash (one build's pair)."""
    return kernels.with_name(kernels.name.replace("vendor_", "vendor_aten_", 1))


def _two_libraries(folder: Path) -> bool:
    """Whether ``folder``'s revision splits the kernels from the ATen library (an older one
    built one library that linked libtorch itself)."""
    return (folder / ATEN_SOURCE.name).exists()


def _build(torch: Any, out: Path, folder: Path = CPP) -> None:
    """Compile ``folder``'s ``kernels.cc`` (its headers found beside it) to ``out`` and, where
    the folder has one, ``aten_forms.cc`` to the ATen library beside it (`_aten_path`), that
    one first: the kernels' library, which `module` looks for, is written last."""
    from torch.utils import cpp_extension  # optional (the torch extra), slow to import

    lib = Path(torch.__file__).parent / "lib"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    # the folder on the quoted include path only (-iquote, not -I): a header of its own named
    # as a system one (threads.h is C11's) must not stand in for it in an #include <...>; both
    # libraries with PyTorch's C++ ABI, so that the types of aten_forms.h pass between them
    flags = (f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-w", f"-iquote{folder}", _MARGIN_FLAG)
    aten = functools.partial(build_library, folder / ATEN_SOURCE.name, _aten_path(out),
                             includes=tuple(cpp_extension.include_paths()),
                             libs=(f"-L{lib}", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{lib}"))
    # the kernels' library links no libtorch; its rpath is PyTorch's lib folder all the same,
    # for the libgomp.so.1 PyTorch ships there: one OpenMP runtime for both libraries (and
    # torch), so a calling thread has one team, whichever runs
    kernels = functools.partial(build_library, folder / SOURCE.name, out,
                                libs=(f"-Wl,-rpath,{lib}", "-ldl"))
    if not _two_libraries(folder):  # an older revision: one library that links libtorch
        kernels = functools.partial(build_library, folder / SOURCE.name, out,
                                    includes=tuple(cpp_extension.include_paths()),
                                    libs=(f"-L{lib}", "-ltorch_cpu", "-lc10",
                                          f"-Wl,-rpath,{lib}"))

    def build(with_flags: tuple[str, ...]) -> None:
        if _two_libraries(folder):
            aten(flags=with_flags)
        kernels(flags=with_flags)

    try:
        # OpenMP for the own kernels' threads: the runtime already loaded is PyTorch's libgomp
        # (same soname), so its kernels and torch's share one pool per calling thread
        build((*flags, "-fopenmp"))
    except RuntimeError as exc:  # a compiler without OpenMP: the own GEMM runs on one thread
        said = str(exc).partition("failed:\n")[2].lower()  # the compiler's words, not the command
        if "openmp" not in said and "omp" not in said:
            raise
        warnings.warn(f"building paragraph's C++ vendor kernels without OpenMP ({exc}); their "
                      "own GEMM runs on one thread", RuntimeWarning, stacklevel=2)
        build(flags)


def _load(path: Path) -> Any:
    """The kernels' library at ``path`` loaded (a library of its own: a second path is a second
    library, with its own state), told where its ATen library lies where it has one."""
    m = tvm_ffi.load_module(str(path))
    aten = _aten_path(path)
    if aten.exists():  # (an older revision's single library has none)
        m["paragraph_vendor_set_aten_library"](str(aten))
    return m


def module() -> Any:
    """The loaded kernels module, built on first use; None when unavailable (`reason`)."""
    if _switched_off():
        return None
    with _lock:
        if "module" not in _state:
            _state["module"], _state["reason"] = None, None
            try:
                path = _library_path()
                if not (path.exists() and _aten_path(path).exists()):
                    import torch  # the ATen library links this PyTorch (its headers)

                    _build(torch, path)
                _state["module"] = _load(path)
                _state["path"] = path  # where it was built: a subprocess can load it too
            except Exception as exc:  # the Python kernels work: warn once, go on
                reraise_interrupt(exc)  # but a Ctrl+C TVM disguised stops (not a fallback)
                _state["reason"] = f"{type(exc).__name__}: {exc}"
                warnings.warn("paragraph's C++ vendor kernels are unavailable, so vendor calls "
                              f"run through Python (same results): {_state['reason']}",
                              RuntimeWarning, stacklevel=2)
        return _state["module"]


def bind_team(cpus: list[int]) -> bool:
    """Bind the calling thread's OpenMP team (its torch and C++ vendor kernels' threads) one
    thread per CPU of ``cpus``, this thread on the first; False where the C++ kernels are
    unavailable (nothing bound)."""
    m = module()
    if m is None:
        return False
    m["paragraph_vendor_bind_team"](cpus)
    return True


def library_files() -> list[Path]:
    """The files of the kernels this process loaded (the kernels' library and its ATen
    library), to copy into another cache; none where it loaded none."""
    path = _state.get("path")
    if path is None:
        return []
    return [p for p in (_aten_path(path), path) if p.is_file()]


def loaded() -> Any:
    """The kernels module if this process has loaded it already, else None (never builds or
    loads it: for helpers that only pay where vendor kernels run anyway)."""
    return _state.get("module")


def copy_bytes(dst: int, src: int, nbytes: int, threads: int) -> bool:
    """Copy ``nbytes`` from address ``src`` to ``dst`` over the calling thread's OpenMP team
    of ``threads`` (the team its vendor kernels run on); False, copying nothing, where the
    kernels module is not loaded."""
    m = loaded()
    if m is None:
        return False
    m["paragraph_vendor_copy_bytes"](dst, src, nbytes, threads)
    return True


def timing_kernels() -> int | None:
    """How many C++ vendor kernels bound and alive in this process have not yet chosen their
    form (each times its forms in its first calls); None where the C++ kernels are unavailable
    (the Python kernels' choices are not counted)."""
    m = module()
    return None if m is None else int(m["paragraph_vendor_timing_kernels"]())


def timing_calls() -> int:
    """How many calls the C++ vendor kernels bound so far in this process may spend timing
    their forms before each runs its chosen one (the most forms of any, each timed its trials);
    0 where the C++ kernels are unavailable."""
    m = module()
    return 0 if m is None else int(m["paragraph_vendor_timing_calls"]())


@contextmanager
def forced_form(index: int) -> Iterator[int]:
    """Inside the block, every vendor kernel that has not chosen its form yet (one bound
    inside, or before and not called since) runs form ``index`` of its forms, in their order
    of preference (its last where it has fewer), untimed: the C++ kernels' (`module`'s) and the
    Python kernels' (`torch_kernels.forced_variant`). Yields how many forms the kernels bound
    so far in this process have at most (1 without the C++ kernels): the differential fuzzer
    (``benchmarks/fuzz.py``) runs each in turn against a reference."""
    m = module()
    if m is not None:
        m["paragraph_vendor_force_form"](index)
    try:
        with torch_kernels.forced_variant(index):
            yield int(m["paragraph_vendor_most_forms"]()) if m is not None else 1
    finally:
        if m is not None:
            m["paragraph_vendor_force_form"](-1)


def most_forms() -> int:
    """The most forms of any C++ vendor kernel bound in this process (1 without them): the
    indices `forced_form` can usefully take."""
    m = module()
    return 1 if m is None else int(m["paragraph_vendor_most_forms"]())


def chosen_forms() -> dict[str, int]:
    """The form each C++ kernel key of this process has chosen (`Fastest` in forms.h); empty
    where the kernels are not loaded (nothing is built or loaded to ask)."""
    m = _state.get("module")
    if m is None:
        return {}
    pairs = (str(c).rsplit("=", 1) for c in m["paragraph_vendor_chosen_forms"]())
    return {key: int(index) for key, index in pairs}


def choose_forms(forms: Mapping[str, int]) -> None:
    """Choose ``forms`` (key -> form index, as `chosen_forms` gives them: an artifact's, chosen
    when it was built) for the C++ kernels of those keys bound from now on: each then runs and
    packs that form only, untimed (an index past a kernel's forms is ignored). Nothing where
    the C++ kernels are unavailable."""
    m = module() if forms else None
    if m is None:
        return
    choose = m["paragraph_vendor_choose_form"]
    for key, index in forms.items():
        choose(key, index)


def reason() -> str | None:
    """Why `module` returned None (None when it is available or not tried yet)."""
    return _state.get("reason")


def variant(files: Mapping[str, bytes]) -> Any:
    """The C++ vendor kernels built from ``files`` (file name -> text: the whole ``cpp/``
    folder of another revision, as `sources` reads this one, or a single ``kernels.cc`` of a
    revision before the headers; one library that links libtorch where the files have no
    ``aten_forms.cc``) and loaded as a library of their own beside `module`'s, with its own
    state (chosen forms, packed weights; its own ATen library too): for comparing a kernel
    change in one process (`benchmarks/ab.py`), where separate processes of the same code
    differed by up to 10% on the shared VM. Built once per set of files, in a folder of their
    own (an interrupted build leaves nothing); raises where they cannot be built."""
    import torch  # the libraries are built against this PyTorch

    if SOURCE.name not in files:
        raise ValueError(f"the kernels' files have no {SOURCE.name}: {sorted(files)}")
    for name in files:  # written into one folder: plain names only
        if Path(name).name != name or name.startswith("."):
            raise ValueError(f"not a file name of the kernels' folder: {name!r}")
    path = _library_path(files, "vendor_variant")
    two = ATEN_SOURCE.name in files  # (an older revision: one library, which links libtorch)
    if not (path.exists() and (not two or _aten_path(path).exists())):
        # this source's libraries: the ones this process loaded, else where they would be cached
        loaded = _state.get("path")
        main = loaded if loaded is not None and loaded.exists() else _library_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            if dict(files) == sources() and main.exists() and _aten_path(main).exists():
                # this source: copies, the ATen library's first (a variant of its own state)
                for source, target in ((_aten_path(main), _aten_path(path)), (main, path)):
                    copy = Path(tmp) / target.name
                    shutil.copyfile(source, copy)
                    os.replace(copy, target)
            else:  # `build_library` writes each library atomically
                folder = Path(tmp) / "cpp"
                folder.mkdir()
                for name, text in files.items():
                    (folder / name).write_bytes(text)
                _build(torch, path, folder)
    # files of their own: loaded as second libraries, not the ones `module` holds
    return _load(path)


@contextmanager
def using(kernels: Any) -> Iterator[None]:
    """Inside the block, `bind` on this thread binds the kernels of ``kernels`` (a `variant`)
    rather than `module`'s: an executor made there runs that build of the kernels."""
    before = getattr(_binding, "module", None)
    _binding.module = kernels
    try:
        yield
    finally:
        _binding.module = before


def bind(name: str, args: tuple, threads: int) -> Any:
    """The C++ kernel for vendor function ``name`` on TVM tensors ``args`` (inputs then the
    output, as the vendor call takes them) with ``threads`` threads, as a TVM FFI function of
    no arguments; None where there is no C++ form (NCHW or GPU tensors) or the module is
    unavailable. Raises `KernelShapeError` where the C++ kernel refuses the tensors (checks.h:
    every shape against the others and the call's parameters)."""
    if not is_vendor_name(name):  # a packed function registered elsewhere
        return None
    op = VendorOp.from_name(name)
    if any(a.device.dlpack_device_type() != tvm.cpu().dlpack_device_type() for a in args):
        return None
    m = getattr(_binding, "module", None) or module()
    if m is None:
        return None
    try:
        return _bound(m, op, args, threads)
    except ValueError as e:  # TVM FFI's form of the C++ checks' ValueError
        raise KernelShapeError(f"{name}: {e}") from None


def _bound(m: Any, op: VendorOp, args: tuple, threads: int) -> Any:
    """`bind`'s call of the C++ entry point of ``op`` in module ``m``."""
    act = op.act or ""
    if op.kind == "concat":
        return m["paragraph_vendor_concat"](args[-1], list(args[:-1]), op.axis, act, threads)
    if op.kind == "softmax":
        return m["paragraph_vendor_softmax"](args[-1], args[0], op.axis, op.scale,
                                             threads)
    if op.kind in POOLS:
        scale, shift = (args[1], args[2]) if op.bias else (None, None)
        return m["paragraph_vendor_pool2d"](args[-1], args[0], [*op.window, *op.stride, *op.pads],
                                            op.kind == "max_pool2d", op.include_pad, scale,
                                            shift, op.act == "relu", threads)
    if op.kind == "layer_norm":
        return m["paragraph_vendor_layer_norm"](args[-1], args[0], args[1], args[2],
                                                args[3] if op.residual else None, op.eps,
                                                threads)
    bias = args[2] if op.bias else None
    if op.kind == "conv2d":
        if op.layout not in ("NHWC", "NCHW2NHWC"):
            return None
        res = args[2 + op.bias] if op.residual else None
        params = [*op.stride, *op.padding, *op.dilation, op.groups]
        return m["paragraph_vendor_conv2d"](args[-1], args[0], args[1], bias, res, params,
                                            op.layout, act, threads)
    if op.kind == "matmul" and op.weight and len(args[1].shape) == 2:
        return m["paragraph_vendor_linear"](args[-1], args[0], args[1], bias, act, threads)
    # products of two activations (attention), and a constant matrix of another rank
    return m["paragraph_vendor_product"](args[-1], args[0], args[1], bias, act, threads)
