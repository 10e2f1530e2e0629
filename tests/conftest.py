"""Settings and fixtures for the whole suite."""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Tests assert that measured costs are cached; on a shared CI machine another process can hold
# a core at any moment, and the cost database would then (rightly) not keep the times. The
# test of that behaviour unsets this.
os.environ.setdefault("PARAGRAPH_CACHE_UNDER_LOAD", "1")

# The suite's own cache: what it times while it holds the cores (and keeps even under load,
# above) must not become the user's cost database, which `paragraph run` and `build` plan
# from. The native libraries, keyed by their sources, are shared with the user's cache, so they
# are built once.
if "PARAGRAPH_CACHE_DIR" not in os.environ:
    _user = Path.home() / ".cache" / "paragraph"
    _suite = Path(tempfile.mkdtemp(prefix="paragraph-tests-"))
    (_user / "native").mkdir(parents=True, exist_ok=True)
    (_suite / "native").symlink_to(_user / "native", target_is_directory=True)
    os.environ["PARAGRAPH_CACHE_DIR"] = str(_suite)
    atexit.register(shutil.rmtree, _suite, ignore_errors=True)


def with_native_libraries(cache: Path) -> Path:
    """``cache`` (a new cache directory) holding the native libraries this process has built
    for these sources (the stream runner, the C++ kernels): a fresh cache means an empty cost
    database and no proofs, not compiling the C++ kernels again (about a minute on 2 cores)."""
    from paragraph.tvm_interop.runtime import native
    from paragraph.tvm_interop.runtime.library import native as kernels

    # each library where this process loaded it, whatever cache the test has set since
    # (test_vendor.py gives every test a private one)
    built = [native._state.get("path") or native.library_path()]
    if kernels.module() is not None:  # built (or found) in this process
        built += kernels.library_files()  # the kernels' and the ATen library
    (cache / "native").mkdir(parents=True, exist_ok=True)
    for lib in built:
        to = cache / "native" / lib.name
        if lib.is_file() and not (to.exists() and to.samefile(lib)):
            shutil.copy2(lib, to)
    return cache


def zoo_for_schedules() -> list[str]:
    """The zoo's models for the tests that compile each one to run it under every schedule or
    kernel source, or to trace its kernels: all but NASNet-A large, whose reduced form repeats
    NASNet-A mobile's cells and kernels (six normal cells a stack against four) and took
    about 110 s of the suite there; test_models, the round trip and the rule tests still
    compile and run it."""
    from paragraph import models

    return [n for n in models.list() if n != "nasnet_a_large"]


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A cache directory of the test's own, set as ``$PARAGRAPH_CACHE_DIR``, with the native
    libraries in it (`with_native_libraries`)."""
    fresh = with_native_libraries(tmp_path / "cache")
    monkeypatch.setenv("PARAGRAPH_CACHE_DIR", str(fresh))
    return fresh


@pytest.fixture
def unwritable_dir(tmp_path):
    """A directory path nothing can be written into: mode 0555, or, for root (whom modes do
    not stop), a path under a regular file (every create there fails with ENOTDIR, for root
    too). Reading from it works in the first case only."""
    if os.geteuid() != 0:
        ro = tmp_path / "read-only"
        ro.mkdir()
        ro.chmod(0o555)
        yield ro
        ro.chmod(0o755)  # so pytest can remove it
        return
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    yield blocker / "read-only"


@pytest.fixture(params=["native", "python"])
def stream_runner(request, monkeypatch):
    """Run the test with the native stream runner, then with the Python one."""
    from paragraph.tvm_interop.runtime import native

    if request.param == "python":
        monkeypatch.setenv("PARAGRAPH_NATIVE", "0")
    elif native.runner() is None:
        pytest.skip(f"no native stream runner: {native.unavailable_reason()}")
    return request.param
