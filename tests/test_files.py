"""Atomic writes: the old file survives a failed write; permissions follow the umask."""

import os

import pytest

from paragraph.files import atomic_write_bytes, atomic_write_json


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
