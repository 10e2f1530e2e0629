"""Atomic writes: the old file survives a failed write; permissions follow the umask."""

import os

import pytest

from paragraph.files import atomic_write_bytes, atomic_write_json
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
