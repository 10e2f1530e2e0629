"""Timing kernels on the device and remembering it: the SQLite cost database (`costdb`) and the
device timing primitives (`device`: a kernel alone or in sequence, hand-offs, peaks)."""
