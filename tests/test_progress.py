"""Progress through `logging` (the ``paragraph`` logger), paragraph's own lines and bars only on
an unconfigured terminal, and throttled lines for any other log."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from paragraph import progress
from paragraph.progress import LOGGER, Progress, console, info


@pytest.fixture
def unconfigured(monkeypatch):
    """A function that takes every handler off the root logger and ``paragraph`` (as in a
    plain script: called in the test body, after pytest's own capture handlers are on);
    restored after the test."""
    root = logging.getLogger()
    saved = (LOGGER.level, LOGGER.propagate)

    def clear() -> None:
        monkeypatch.setattr(root, "handlers", [])
        monkeypatch.setattr(LOGGER, "handlers", [])

    yield clear
    LOGGER.setLevel(saved[0])
    LOGGER.propagate = saved[1]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_api_reports_through_the_paragraph_logger(caplog):
    with caplog.at_level(logging.INFO, logger="paragraph"):
        info("  critical-path: kernel times")
    assert [r.getMessage() for r in caplog.records] == ["  critical-path: kernel times"]
    assert caplog.records[0].name == "paragraph"


def test_an_unconfigured_terminal_shows_lines_and_bars(unconfigured, monkeypatch):
    unconfigured()
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert console()  # paragraph shows its own lines
    info("searching")
    bar = Progress(info, "IOS parts", 4)
    assert bar._bar is not None  # a tqdm bar, not lines
    for i in range(4):
        bar.update(i + 1, f"{i} states")
    assert bar._bar is None  # taken off the terminal at the end
    assert "searching" in terminal.getvalue()


def test_configured_logging_decides_and_paragraph_prints_nothing_of_its_own(unconfigured,
                                                                             monkeypatch):
    unconfigured()
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert console()
    handler = logging.StreamHandler(io.StringIO())
    logging.getLogger().addHandler(handler)  # the application configures logging
    try:
        assert not console()
        assert progress._CONSOLE not in LOGGER.handlers and LOGGER.propagate
        assert Progress(info, "parts", 4)._bar is None
    finally:
        logging.getLogger().removeHandler(handler)


def test_not_a_terminal_no_bar(unconfigured, monkeypatch):
    unconfigured()
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not console()
    assert Progress(info, "parts", 4)._bar is None


def test_another_log_gets_throttled_lines():
    lines: list[str] = []
    bar = Progress(lines.append, "IOS parts", 8)
    for i in range(8):
        bar.update(i + 1)
    assert len(lines) == 4  # each quarter, the last at the end
    assert lines[-1].startswith("  IOS parts [####################] 8/8")
    said: list[str] = []
    few = Progress(said.append, "few", 2, least=3)  # too quick to need it
    few.update(1)
    few.update(2)
    assert said == []
