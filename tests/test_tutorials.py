"""The tutorials run as written (reduced models) and say what they claim."""

import runpy
from pathlib import Path

TUTORIALS = Path(__file__).resolve().parent.parent / "tutorials"


def test_quickstart(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PARAGRAPH_CACHE_DIR", str(tmp_path))
    runpy.run_path(str(TUTORIALS / "quickstart.py"))["main"]()
    out = capsys.readouterr().out
    assert "kernels after TVM's fusion" in out
    for name in ("sequential", "wavefront", "opara", "nimble", "critical-path", "TVM VM",
                 "ios-both"):
        assert name in out
