"""paragraph: graph substitution and inter-operator parallelism for Apache TVM (Relax)."""

from paragraph.errors import GraphError, ModelLoadError, ParagraphError, UnsupportedModelError
from paragraph.graph import Graph, GraphBuilder, Node, TensorRef, TensorType

__version__ = "0.1.0"

__all__ = ["Graph", "GraphBuilder", "Node", "TensorRef", "TensorType", "ParagraphError",
           "UnsupportedModelError", "ModelLoadError", "GraphError", "__version__"]
