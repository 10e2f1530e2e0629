"""Render a profiled run as a timeline PNG: one row per stream, one bar per kernel."""

from __future__ import annotations

import os
from collections.abc import Mapping

from paragraph.graph import Graph


def plot_timeline(timeline: Mapping[int, tuple[int, int, int]], graph: Graph,
                  path: str | os.PathLike, title: str = "") -> None:
    """Write ``timeline`` (kernel -> (stream, start ns, end ns), as an executor's profiled run
    records it) to ``path`` as a PNG; bars are labelled with the kernel's function name where
    they are wide enough."""
    import matplotlib  # slow to import, and only `paragraph inspect` draws

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt  # after choosing the backend

    if not timeline:
        raise ValueError("the timeline is empty: run the executor with profile=True first")
    t0 = min(start for _, start, _ in timeline.values())
    span = max(end for _, _, end in timeline.values()) - t0
    streams = sorted({s for s, _, _ in timeline.values()})
    fig, ax = plt.subplots(figsize=(14, 1.0 + 0.45 * len(streams)))
    colors = plt.get_cmap("tab20").colors  # type: ignore[attr-defined]  # a ListedColormap
    for k, (s, start, end) in sorted(timeline.items()):
        x, width = (start - t0) / 1e6, max(end - start, 1) / 1e6
        ax.broken_barh([(x, width)], (s - 0.4, 0.8), facecolors=colors[k % len(colors)],
                       edgecolor="black", linewidth=0.3)
        if width > span / 1e6 / 40:
            name = graph[k].attrs.get("func", graph[k].kind).removeprefix("fused_")
            ax.text(x + width / 2, s, name[:24], ha="center", va="center", fontsize=6,
                    clip_on=True)
    ax.set_yticks(streams)
    ax.set_yticklabels([f"stream {s}" for s in streams])
    ax.invert_yaxis()
    ax.set_xlabel("time since the first kernel started (ms)")
    ax.set_title(title or "paragraph executor timeline", fontsize=9)
    ax.set_xlim(0, span / 1e6 * 1.01)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
