"""Everything that touches TVM: importers, the Relax <-> graph round trip, kernel programs
(`kernels`), vendor kernels (`vendor`), MetaSchedule tuning (`tune`), measurement and the cost
database (`measure`), the concurrency-safe memory plan (`memory`) and the executor."""

from paragraph.tvm_interop.importers import load, prepare
from paragraph.tvm_interop.relax_graph import from_relax, random_inputs, to_relax

__all__ = ["from_relax", "to_relax", "random_inputs", "load", "prepare"]
