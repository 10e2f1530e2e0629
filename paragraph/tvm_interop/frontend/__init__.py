"""Models in: importers (ONNX, PyTorch, Relax; `prepare`: static Relax, weights as constants)
and the Relax <-> operator graph round trip (`relax_graph`)."""
