"""The graph IR: structural hash, derived views, rewriting, validation, dot export."""

import numpy as np
import pytest

from paragraph import GraphBuilder, GraphError, Node, TensorRef
from paragraph.graph import Graph
from paragraph.interpret import run_graph


def branchy(seed: int = 0, *, relu_first: bool = True, order_flip: bool = False,
            names: str = "") -> Graph:
    """x -> conv a, conv b (independent) -> add -> relu; optional node-order and name changes."""
    rng = np.random.default_rng(seed)
    wa = rng.standard_normal((4, 3, 3, 3)).astype("float32")
    wb = rng.standard_normal((4, 3, 1, 1)).astype("float32")
    b = GraphBuilder()
    x = b.input((1, 3, 8, 8), name=names + "x")
    conv = {"padding": (1, 1, 1, 1)}
    if order_flip:
        wb_ref = b.weight(wb, name=names + "wb")
        cb = b.op("conv2d", [x, wb_ref], name=names + "cb").out
        wa_ref = b.weight(wa, name=names + "wa")
        ca = b.op("conv2d", [x, wa_ref], conv, name=names + "ca").out
    else:
        wa_ref = b.weight(wa, name=names + "wa")
        ca = b.op("conv2d", [x, wa_ref], conv, name=names + "ca").out
        wb_ref = b.weight(wb, name=names + "wb")
        cb = b.op("conv2d", [x, wb_ref], name=names + "cb").out
    if relu_first:
        ca = b.op("relu", [ca]).out
    s = b.op("add", [ca, cb], name=names + "sum").out
    return b.build([b.op("sigmoid", [s]).out])


def test_hash_ignores_ids_and_names():
    g1, g2 = branchy(), branchy(order_flip=True, names="other_")
    assert [n.id for n in g1] != [n.id for n in g2] or [n.name for n in g1] != [
        n.name for n in g2]
    assert g1.structural_hash() == g2.structural_hash()
    assert g1 == g2


@pytest.mark.parametrize("change", ["op", "attr", "weight", "shape", "wiring", "extra node"])
def test_hash_changes_with_structure(change):
    base = branchy()
    if change == "op":
        n = next(n for n in base if n.kind == "sigmoid")
        other = base.replace_subgraph([n.id], [n.replace(id=base.next_id, kind="tanh")],
                                      {n.out: TensorRef(base.next_id)})
    elif change == "attr":
        n = next(n for n in base if n.kind == "add")
        other = base.replace_subgraph([n.id], [n.replace(id=base.next_id, kind="multiply")],
                                      {n.out: TensorRef(base.next_id)})
    elif change == "weight":
        other = branchy(seed=1)
    elif change == "shape":
        b = GraphBuilder()
        x = b.input((1, 3, 8, 9))
        other = b.build([b.op("relu", [x]).out])
        b2 = GraphBuilder()
        x2 = b2.input((1, 3, 8, 8))
        base = b2.build([b2.op("relu", [x2]).out])
    elif change == "wiring":
        add = next(n for n in base if n.kind == "add")
        other = base.replace_subgraph(
            [add.id], [add.replace(id=base.next_id, inputs=add.inputs[::-1])],
            {add.out: TensorRef(base.next_id)})
    else:
        relu = next(n for n in base if n.kind == "relu")
        extra = Node(id=base.next_id, kind="relu", inputs=(relu.out,), outputs=relu.outputs)
        add = next(n for n in base if n.kind == "add")
        other = base.replace_subgraph(
            [add.id], [extra, add.replace(id=base.next_id + 1,
                                          inputs=(extra.out, add.inputs[1]))],
            {add.out: TensorRef(base.next_id + 1)})
    other.validate()
    assert other.structural_hash() != base.structural_hash()


def test_conv_attribute_change_changes_hash():
    def one(stride):
        b = GraphBuilder()
        x = b.input((1, 3, 8, 8))
        w = b.weight(np.ones((2, 3, 3, 3), "float32"))
        return b.build([b.op("conv2d", [x, w], {"strides": (stride, stride)}).out])
    assert one(1).structural_hash() != one(2).structural_hash()
    assert one(1).structural_hash() == one(1).structural_hash()


def test_input_position_matters_but_not_name():
    def two(swap):
        b = GraphBuilder()
        x, y = b.input((2, 2), name="x"), b.input((2, 2), name="y")
        return b.build([b.op("subtract", [y, x] if swap else [x, y]).out])
    assert two(False) != two(True)


def test_topological_views_and_critical_path():
    g = branchy()
    order = g.topological_order()
    pos = {nid: i for i, nid in enumerate(order)}
    for n in g:
        assert all(pos[r.node] < pos[n.id] for r in n.inputs)
    sig = next(n for n in g if n.kind == "sigmoid")
    assert set(g.ancestors(sig.id)) == {n.id for n in g if n.id != sig.id}
    x = g[g.inputs[0]]
    assert g.descendants(x.id) == {n.id for n in g.operators}
    ca = next(n for n in g if n.name == "ca")
    cb = next(n for n in g if n.name == "cb")
    cost = {n.id: 1.0 for n in g.operators}
    cost[cb.id] = 5.0
    length, path = g.longest_path(cost)
    assert length == 5.0 + 1 + 1
    assert path[0] == x.id and cb.id in path and path[-1] == sig.id
    cost[ca.id] = 10.0
    length, path = g.longest_path(cost)
    assert length == 10 + 1 + 1 + 1 and ca.id in path


def test_replace_subgraph_rewrites_and_keeps_semantics():
    g = branchy()
    relu = next(n for n in g if n.kind == "relu")
    # relu(x) == x * (x > 0) would need a compare op; use relu(relu(x)) == relu(x) instead
    r1 = Node(id=g.next_id, kind="relu", inputs=relu.inputs, outputs=relu.outputs)
    r2 = Node(id=g.next_id + 1, kind="relu", inputs=(r1.out,), outputs=relu.outputs)
    g2 = g.replace_subgraph([relu.id], [r1, r2], {relu.out: r2.out})
    g2.validate()
    assert len(g2) == len(g) + 1
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype("float32")
    np.testing.assert_allclose(run_graph(g, [x])[0], run_graph(g2, [x])[0], rtol=1e-6)


def test_replace_subgraph_errors():
    g = branchy()
    relu = next(n for n in g if n.kind == "relu")
    add = next(n for n in g if n.kind == "add")
    with pytest.raises(GraphError, match="still read"):
        g.replace_subgraph([relu.id], [], {})
    # a rewrite that feeds the add's output back into its own input makes a cycle
    loop = Node(id=g.next_id, kind="relu", inputs=(add.out,), outputs=relu.outputs)
    with pytest.raises(GraphError, match="cycle"):
        g.replace_subgraph([relu.id], [loop], {relu.out: loop.out})
    with pytest.raises(GraphError, match="already used"):
        g.replace_subgraph([], [relu.replace(inputs=())], {})


def test_validate_catches_inconsistent_types():
    g = branchy()
    ca = next(n for n in g if n.name == "ca")
    bad = Graph([ca.replace(outputs=(ca.type.__class__((1, 4, 7, 7)),)) if n.id == ca.id else n
                 for n in g], g.outputs)
    with pytest.raises(GraphError, match="outputs should be"):
        bad.validate()
    b = GraphBuilder()
    x = b.input((1, 3, 8, 8))
    w = b.weight(np.ones((4, 5, 3, 3), "float32"))
    with pytest.raises(ValueError, match="input channels"):
        b.op("conv2d", [x, w])


def test_validate_catches_bad_order_and_refs():
    g = branchy()
    nodes = list(g.nodes)
    with pytest.raises(GraphError, match="precede"):
        Graph(nodes[::-1], g.outputs).validate()
    with pytest.raises(GraphError, match="no such output"):
        relu = next(n for n in g if n.kind == "relu")
        Graph([n.replace(inputs=(TensorRef(relu.inputs[0].node, 3),)) if n.id == relu.id else n
               for n in nodes], g.outputs).validate()
    with pytest.raises(GraphError, match="duplicate"):
        Graph(nodes + [nodes[0]], g.outputs)


def test_dead_nodes_and_dot():
    g = branchy()
    relu = next(n for n in g if n.kind == "relu")
    dead = Node(id=g.next_id, kind="tanh", inputs=(relu.out,), outputs=relu.outputs)
    g2 = Graph(list(g.nodes) + [dead], g.outputs)
    g2.validate()
    assert g2 != g and g2.without_dead_nodes() == g
    dot = g.to_dot()
    assert dot.startswith("digraph") and "conv2d" in dot and "weight" not in dot
    # x->ca, x->cb, ca->relu, relu->add, cb->add, add->sigmoid, sigmoid->output
    assert dot.count("->") == 7
    assert "weight" in g.to_dot(show_weights=True)


def test_graph_is_immutable():
    g = branchy()
    with pytest.raises(AttributeError):
        g.nodes[0].kind = "relu"
    with pytest.raises(TypeError):
        g.nodes[1].attrs["x"] = 1
