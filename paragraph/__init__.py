"""paragraph: graph substitution and inter-operator parallelism for Apache TVM (Relax)."""

import os

from paragraph.machine import cpu_count

# TVM sizes its CPU thread pool to half the logical CPUs on x86 (to skip SMT siblings); on cloud
# machines whose vCPUs are all there is, that idles half the machine and caps every schedule's
# per-stream thread count. Use every CPU this process may run on, unless the user chose.
os.environ.setdefault("TVM_NUM_THREADS", str(cpu_count()))

from paragraph.errors import GraphError, ModelLoadError, ParagraphError, UnsupportedModelError
from paragraph.graph import Graph, GraphBuilder, Node, TensorRef, TensorType

__version__ = "0.1.0"

__all__ = ["Graph", "GraphBuilder", "Node", "TensorRef", "TensorType", "ParagraphError",
           "UnsupportedModelError", "ModelLoadError", "GraphError", "__version__"]
