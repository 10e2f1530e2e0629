"""Split lone convolutions across streams that would otherwise idle.

A convolution that no other operator can run beside (every operator is its ancestor or its
descendant: Inception's stem, for one) leaves all streams but one idle, however well the
streams are scheduled. The verified rule `paragraph.rules.parametric.SplitConv` (TASO axiom 39
and the element-wise axioms read backwards, the IOS merge inverted) turns it, with the
per-channel element-wise chain after it, into ``parts`` convolutions on slices of the output
channels and a concat; the parts are independent kernels that the schedule puts on different
streams. Only convolutions with a real share of the model's work are split (the concat and the
hand-off cost a little); whether the split program runs faster is then measured end to end
(`paragraph.passes.ios.plan_schedule`), as AutoGraph confirms its substitutions.
"""

from __future__ import annotations

from collections.abc import Callable

from paragraph.graph import Graph, Node

MIN_SHARE = 0.02  # a convolution below 2% of the model's convolution FLOPs is not split


def conv_flops(graph: Graph, node: Node) -> float:
    """Multiply-adds times two of a conv2d node."""
    w = graph.type_of(node.inputs[1]).shape  # OIHW: I is per group already
    n, _, oh, ow = node.type.shape
    return 2.0 * n * w[0] * oh * ow * w[1] * w[2] * w[3]


def is_lone(graph: Graph, node_id: int) -> bool:
    """Whether nothing can run beside ``node_id``: every other operator is its ancestor or its
    descendant."""
    related = graph.ancestors(node_id) | graph.descendants(node_id) | {node_id}
    return all(n.id in related for n in graph.nodes if not n.is_source)


def split_lone_convs(graph: Graph, parts: int, *, min_share: float = MIN_SHARE,
                     log: Callable[[str], None] | None = None) -> tuple[Graph, list[str]]:
    """``graph`` (an operator graph, NCHW) with every lone convolution of at least
    ``min_share`` of the convolution FLOPs split into ``parts`` along its output channels
    (`SplitConv`); also the names of the split convolutions."""
    from paragraph.rules.parametric import SplitConv

    rule = SplitConv("split-conv", "", "", "split_conv", parts)
    convs = [n for n in graph.nodes if n.kind == "conv2d"]
    total = sum(conv_flops(graph, n) for n in convs)
    chosen = [n.id for n in convs
              if conv_flops(graph, n) >= min_share * total and is_lone(graph, n.id)]
    names = []
    for conv in chosen:
        match = next((m for m in rule.find(graph) if m.nodes[0] == conv), None)
        new = None if match is None else rule.rewrite(graph, match)
        if new is None:
            continue
        names.append(graph[conv].name or f"conv{conv}")
        if log is not None:
            n = graph[conv]
            log(f"  split {names[-1]} ({conv_flops(graph, n) / 1e6:.0f} MFLOP, "
                f"{n.type.shape[1]} channels) into {parts} on output channels")
        graph = new
    graph.validate()
    return graph, names


def split_program(program, parts: int, *, tuning_db=None, min_share: float = MIN_SHARE,
                  log: Callable[[str], None] | None = None):
    """``program`` (a `KernelProgram`) rebuilt from its model with its lone convolutions
    split (`split_lone_convs`), or None when there are none to split (or the program does not
    keep the model it was built from)."""
    from paragraph.tvm_interop.importers import prepare
    from paragraph.tvm_interop.kernels import KernelProgram
    from paragraph.tvm_interop.relax_graph import from_relax, to_relax

    source = program.source
    if source is None or parts < 2:
        return None
    ops = source if isinstance(source, Graph) else from_relax(prepare(source))
    split, names = split_lone_convs(ops, parts, min_share=min_share, log=log)
    if not names:
        return None
    rebuilt = KernelProgram.build(to_relax(split), program.target, device=program.device,
                                  tuning_db=tuning_db, kernels=program.kernel_source)
    rebuilt.split = names
    return rebuilt
