"""Progress of long work: one log type (`Log`), the ``paragraph`` logger, and bars.

Every progress line goes to a `Log` (a callable taking one line). The Python API's default is
`info`: the ``paragraph`` logger at INFO (`logging`), so an application decides what is shown.
Where nothing configured logging (neither the root logger nor ``paragraph`` has a handler) and
stderr is a terminal, paragraph shows the lines there itself and draws long loops as tqdm bars
(`console`); once logging is configured, paragraph prints nothing of its own. The CLI passes
its own `Log` (lines on stdout). `Progress` reports a loop's progress through a `Log` as
throttled lines, or as a bar where the console shows them.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

Log = Callable[[str], object]  # receives one progress line
LOGGER = logging.getLogger("paragraph")


def quiet(_line: str) -> None:
    """A `Log` that drops every line."""


def info(line: str) -> None:
    """The Python API's default `Log`: the ``paragraph`` logger at INFO (see the module
    docstring; on an unconfigured terminal, shown on stderr)."""
    console()
    LOGGER.info(line.strip("\n"))


class _Console(logging.Handler):
    """paragraph's own handler on an unconfigured terminal: lines on stderr, written so that
    a bar being drawn stays whole."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm  # only when drawing on a terminal

        tqdm.write(self.format(record), file=sys.stderr)


_CONSOLE = _Console(logging.INFO)


def console() -> bool:
    """Whether paragraph shows its lines and bars itself (an unconfigured terminal), attaching
    or detaching its handler as logging's configuration now says."""
    ours = _CONSOLE in LOGGER.handlers
    configured = bool(logging.getLogger().handlers) or any(
        h is not _CONSOLE for h in LOGGER.handlers)
    wanted = not configured and sys.stderr.isatty()
    if wanted and not ours:
        LOGGER.addHandler(_CONSOLE)
        if LOGGER.level == logging.NOTSET:
            LOGGER.setLevel(logging.INFO)
        LOGGER.propagate = False
    elif ours and not wanted:
        LOGGER.removeHandler(_CONSOLE)
        LOGGER.propagate = True
    return wanted


def bar(done: int, total: int, width: int = 20) -> str:
    """``[#####               ]`` for ``done`` of ``total``."""
    filled = width * done // total if total > 0 else width
    return "[" + "#" * filled + " " * (width - filled) + "]"


class Progress:
    """Report ``done`` of ``total`` through ``say`` as ``  LABEL [###   ] done/total: detail``
    at each quarter, at the end, and at least every ``every`` seconds in between (so a long
    step shows it is alive without a line per item), or as a tqdm bar where ``say`` is `info`
    and the console shows it; ``say`` None, or fewer than ``least`` items (too quick to need
    it), reports nothing."""

    def __init__(self, say: Log | None, label: str, total: int,
                 every: float = 10.0, least: int = 1) -> None:
        self.say, self.label, self.total, self.every = say, label, total, every
        if total < least:
            self.say = None
        self.start = self.last = time.monotonic()
        self._bar: Any = None
        if self.say is info and total > 0 and console():
            from tqdm import tqdm  # only when drawing on a terminal

            self._bar = tqdm(total=total, desc=label, file=sys.stderr, leave=False)

    def update(self, done: int, detail: str = "") -> None:
        """``done`` items of ``total`` are finished; ``detail`` says what stands now."""
        if self.say is None or self.total <= 0 or done <= 0:
            return
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
            if detail:
                self._bar.set_postfix_str(detail, refresh=False)
            if done >= self.total:
                self.close()
            return
        now = time.monotonic()
        quarter = 4 * done // self.total > 4 * (done - 1) // self.total
        if done >= self.total or quarter or now - self.last >= self.every:
            self.last = now
            tail = f": {detail}" if detail else ""
            self.say(f"  {self.label} {bar(done, self.total)} {done}/{self.total}{tail}, "
                     f"{now - self.start:.0f} s")

    def close(self) -> None:
        """Take a bar off the terminal (lines need nothing)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
