"""The shipped rule library: every rule verified by z3 and numerically checked; the loader
rejects corrupt, edited or unverified entries; the ``paragraph rules`` verbs."""

import json

import pytest

from paragraph.cli import main
from paragraph.errors import RuleLibraryError
from paragraph.rules.library import LIBRARY_PATH, load_library, verify_library
from paragraph.rules.match import usable

LIB = load_library()


def test_shipped_library_has_both_sources():
    assert len(LIB.rules) >= 300 and len(LIB.parametric) == 15
    ids = [r.id for r in LIB.all()]
    assert len(ids) == len(set(ids))
    assert LIB.meta["generator"]["k"] == 3
    assert all(r.proof["status"] == "verified" for r in LIB.rules)
    # every rule can be applied in at least one direction
    assert all(usable(r) or usable(r.reversed()) for r in LIB.rules)


def test_every_shipped_rule_is_proved_by_z3_and_holds_on_random_shapes(tmp_path, monkeypatch):
    # no proof cache: z3 proves every rule again, two processes at once
    monkeypatch.setenv("PARAGRAPH_CACHE_DIR", str(tmp_path))
    results = verify_library(log=lambda _m: None, workers=2)
    assert len(results) == len(LIB.rules) + len(LIB.parametric)
    assert {k: v for k, v in results.items() if v != "ok"} == {}


def _write(tmp_path, data):
    path = tmp_path / "lib.json"
    path.write_text(json.dumps(data))
    return path


def _small(n=3):
    data = json.loads(LIBRARY_PATH.read_text())
    data["rules"] = data["rules"][:n] + [e for e in data["rules"] if e["origin"] ==
                                         "parametric"][:1]
    return data


def test_loader_accepts_a_subset(tmp_path):
    lib = load_library(_write(tmp_path, _small()))
    assert len(lib.rules) == 3 and len(lib.parametric) == 1


def test_loader_rejects_an_edited_rule(tmp_path):
    data = _small()
    data["rules"][1]["outputs"][0][1] = [0, 0]  # map the output to an input instead
    path = _write(tmp_path, data)
    with pytest.raises(RuleLibraryError, match=f"{path}: rule {data['rules'][1]['id']}: "
                       "content hash mismatch"):
        load_library(path)


def test_loader_rejects_an_unverified_rule(tmp_path):
    from paragraph.rules.library import _entry_hash

    data = _small()
    entry = data["rules"][0]
    entry["proof"]["status"] = "unknown"
    entry["hash"] = _entry_hash(entry)  # a well-formed entry, but not proved
    with pytest.raises(RuleLibraryError, match="proof status is 'unknown'"):
        load_library(_write(tmp_path, data))


def test_loader_rejects_bad_files(tmp_path):
    with pytest.raises(RuleLibraryError, match="no such rule library"):
        load_library(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(RuleLibraryError, match="not a readable JSON"):
        load_library(bad)
    data = _small()
    data["version"] = 99
    with pytest.raises(RuleLibraryError, match="version 99"):
        load_library(_write(tmp_path, data))
    data = _small()
    data["rules"].append(dict(data["rules"][0]))
    with pytest.raises(RuleLibraryError, match="duplicate id"):
        load_library(_write(tmp_path, data))


def test_cli_list_show_verify(tmp_path, capsys):
    path = _write(tmp_path, _small())
    assert main(["rules", "list", "--file", str(path)]) == 0
    out = capsys.readouterr().out
    assert "4 rules (3 generated, 1 parametric)" in out
    rid = _small()["rules"][0]["id"]
    assert main(["rules", "show", rid, "--file", str(path)]) == 0
    assert "=>" in capsys.readouterr().out
    assert main(["rules", "verify", str(path)]) == 0
    assert "4 of 4 rules verified" in capsys.readouterr().out
    assert main(["rules", "show", "no-such-rule", "--file", str(path)]) == 2
