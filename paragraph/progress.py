"""Progress of long loops (the search's pieces, kernels measured, IOS parts) as throttled lines
with a bar: at each quarter, at the end, and at least every ``every`` seconds in between, so a
long step shows it is alive without a line per item (a leaf: no imports from paragraph)."""

from __future__ import annotations

import time
from collections.abc import Callable


def bar(done: int, total: int, width: int = 20) -> str:
    """``[#####               ]`` for ``done`` of ``total``."""
    filled = width * done // total if total > 0 else width
    return "[" + "#" * filled + " " * (width - filled) + "]"


class Progress:
    """Report ``done`` of ``total`` through ``say`` as ``  LABEL [###   ] done/total: detail``,
    throttled (see the module docstring); ``say`` None, or fewer than ``least`` items (too
    quick to need it), reports nothing."""

    def __init__(self, say: Callable[[str], object] | None, label: str, total: int,
                 every: float = 10.0, least: int = 1) -> None:
        self.say, self.label, self.total, self.every = say, label, total, every
        if total < least:
            self.say = None
        self.start = self.last = time.monotonic()

    def update(self, done: int, detail: str = "") -> None:
        """``done`` items of ``total`` are finished; ``detail`` says what stands now."""
        if self.say is None or self.total <= 0 or done <= 0:
            return
        now = time.monotonic()
        quarter = 4 * done // self.total > 4 * (done - 1) // self.total
        if done >= self.total or quarter or now - self.last >= self.every:
            self.last = now
            tail = f": {detail}" if detail else ""
            self.say(f"  {self.label} {bar(done, self.total)} {done}/{self.total}{tail}, "
                     f"{now - self.start:.0f} s")
