"""Everything that touches TVM: importers, the Relax <-> graph round trip (`relax_graph`),
lowering to the kernel graph (`lowering`), kernel programs (`kernels`), vendor kernels
(`vendor/`: names, runtime, dispatch pass, auto selection), MetaSchedule tuning (`tune`),
worker threads (`threads`) and the native stream runner (`native`), measurement and the cost
database (`measure`), IOS's stage meter (`stages`), the concurrency-safe memory plan
(`memory`), the executor and the TVM VM baseline (`vm`)."""

from paragraph.tvm_interop.frontend.importers import load, prepare
from paragraph.tvm_interop.frontend.relax_graph import from_relax, random_inputs, to_relax

__all__ = ["from_relax", "to_relax", "random_inputs", "load", "prepare"]
