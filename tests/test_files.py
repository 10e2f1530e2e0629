"""Atomic writes: the old file survives a failed write; permissions follow the umask."""

import os
import sys
import threading

import pytest

from paragraph.errors import FileWriteError, ParagraphError
from paragraph.files import atomic_write_bytes, atomic_write_json, current_umask
from paragraph.progress import Progress, bar


def test_atomic_write_replaces_and_keeps_permissions(tmp_path):
    path = tmp_path / "sub" / "out.json"
    atomic_write_json(path, {"a": 1})
    assert path.read_text().strip() == '{\n  "a": 1\n}'
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"new"


def test_failed_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "out.json"
    atomic_write_bytes(path, b"old")
    with pytest.raises(TypeError):
        atomic_write_json(path, {"not serialisable": object()})
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary left behind


def test_progress_lines_are_throttled_with_a_bar():
    assert bar(5, 20, width=4) == "[#   ]" and bar(0, 0, width=2) == "[##]"
    lines: list[str] = []
    p = Progress(lines.append, "pieces", 100, every=3600)
    for i in range(1, 101):
        p.update(i, f"{i} done")
    assert len(lines) == 4  # the quarters, the last at the end
    assert lines[-1].startswith("  pieces [####################] 100/100: 100 done, ")
    quiet: list[str] = []
    Progress(quiet.append, "few", 3, least=8).update(3)
    assert quiet == []


def test_the_umask_is_read_without_being_changed_from_many_threads(tmp_path):
    """Writers on several threads while others create files plainly: every plain file gets
    0666 less the umask (setting the umask to 0 for a moment, as reading it with `os.umask`
    does, gave a plain file 0666 now and then), and every written file the same."""
    old_umask = os.umask(0o027)  # one no thread can mistake for 0
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show
    try:
        expected = 0o666 & ~0o027
        assert current_umask(tmp_path) == 0o027
        bad: list[str] = []

        def write(i: int) -> None:
            for j in range(300):
                path = tmp_path / f"w{i}-{j % 5}"
                atomic_write_bytes(path, b"x")
                if path.stat().st_mode & 0o777 != expected:
                    bad.append(f"written {path.name}: {path.stat().st_mode & 0o777:o}")

        def create(i: int) -> None:
            for j in range(1500):
                path = tmp_path / f"p{i}-{j}"
                with open(path, "wb"):
                    pass
                if path.stat().st_mode & 0o777 != expected:
                    bad.append(f"plain {path.name}: {path.stat().st_mode & 0o777:o}")
                path.unlink()

        threads = [threading.Thread(target=write, args=(i,)) for i in range(3)]
        threads += [threading.Thread(target=create, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not bad, bad[:5]
        assert os.umask(0o027) == 0o027  # nobody changed it
    finally:
        sys.setswitchinterval(old_interval)
        os.umask(old_umask)


def test_the_umask_probe_works_without_proc(tmp_path, monkeypatch):
    """Where /proc/self/status is missing, a probe file in the directory tells the umask and
    is removed."""
    import builtins

    real_open = builtins.open

    def no_proc(file, *args, **kwargs):
        if str(file).startswith("/proc/"):
            raise FileNotFoundError(2, "No such file or directory", str(file))
        return real_open(file, *args, **kwargs)

    old = os.umask(0o077)
    try:
        monkeypatch.setattr(builtins, "open", no_proc)
        assert current_umask(tmp_path) == 0o066  # the bits a 0666 file can lose
        assert list(tmp_path.iterdir()) == []
    finally:
        os.umask(old)


def test_a_write_that_fails_is_one_line_naming_the_file(tmp_path):
    """A path under a regular file cannot be written by anyone, root included: the error is
    a `FileWriteError` (a `ParagraphError` and an `OSError`) saying which file and why."""
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    target = blocker / "sub" / "out.json"
    with pytest.raises(FileWriteError) as info:
        atomic_write_json(target, {"a": 1})
    assert isinstance(info.value, ParagraphError) and isinstance(info.value, OSError)
    assert str(info.value) == f"cannot write {target}: Not a directory"
    assert info.value.errno is not None and info.value.filename == str(target)
