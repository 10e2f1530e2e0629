"""Split lone convolutions across streams that would otherwise idle.

A convolution that no other operator can run beside (`paragraph.dag.lone`: Inception's stem,
for one) leaves all streams but one idle, however well the streams are scheduled. The verified
library rule ``split-conv-2`` / ``split-conv-4`` (`paragraph.rules.parametric.SplitConv`: TASO
axiom 39 and the element-wise axioms read backwards, the IOS merge inverted) turns it, with the
per-channel element-wise chain after it, into ``parts`` convolutions on slices of the output
channels and a concat; the parts are independent kernels that the schedule puts on different
streams. Only convolutions with a real share of the model's work are split (the concat and the
hand-off cost a little); whether the split program runs faster is then measured end to end
(`paragraph.planner`), as AutoGraph confirms its substitutions.
"""

from __future__ import annotations

from paragraph.dag import lone
from paragraph.errors import ParagraphError
from paragraph.graph import Graph, Node
from paragraph.progress import Log
from paragraph.rules.library import default_library
from paragraph.rules.parametric import SplitConv
from paragraph.schedule import kernel_ids, producers

MIN_SHARE = 0.02  # a convolution below 2% of the model's convolution FLOPs is not split


def conv_flops(graph: Graph, node: Node) -> float:
    """Multiply-adds times two of a conv2d node."""
    w = graph.type_of(node.inputs[1]).shape  # OIHW: I is per group already
    n, _, oh, ow = node.type.shape
    return 2.0 * n * w[0] * oh * ow * w[1] * w[2] * w[3]


def split_rule(parts: int) -> SplitConv:
    """The library's ``split-conv-<parts>`` (2 or 4): the only way a split reaches a program."""
    rule_id = f"split-conv-{parts}"
    if parts not in (2, 4):
        raise ParagraphError(f"convolutions split into 2 or 4 parts ({rule_id} is no rule)")
    return default_library().get_as(rule_id, SplitConv)


def split_lone_convs(graph: Graph, parts: int, *, min_share: float = MIN_SHARE,
                     log: Log | None = None) -> tuple[Graph, list[str]]:
    """``graph`` (an operator graph, NCHW) with every lone convolution of at least
    ``min_share`` of the convolution FLOPs split into ``parts`` along its output channels
    (`split_rule`); also what was split, as ``"<rule id>: <convolution name>"``."""
    rule = split_rule(parts)
    convs = [n for n in graph.nodes if n.kind == "conv2d"]
    total = sum(conv_flops(graph, n) for n in convs)
    heavy = [n.id for n in convs if conv_flops(graph, n) >= min_share * total]
    if heavy:
        operators = kernel_ids(graph)
        alone = lone(operators, {k: producers(graph, k) for k in operators})
        heavy = [c for c in heavy if c in alone]
    done = []
    for conv in heavy:
        match = next((m for m in rule.find(graph) if m.nodes[0] == conv), None)
        new = None if match is None else rule.rewrite(graph, match)
        if new is None:
            continue
        name = graph[conv].name or f"conv{conv}"
        done.append(f"{rule.id}: {name}")
        if log is not None:
            n = graph[conv]
            log(f"  split {name} ({conv_flops(graph, n) / 1e6:.0f} MFLOP, "
                f"{n.type.shape[1]} channels) into {parts} on output channels")
        graph = new
    graph.validate()
    return graph, done
