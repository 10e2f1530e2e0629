"""The substitution generator (TASO section 2.3, algorithm 1) with pruning (section 2.5).

Stages, each printed with its count and time (as TASO table 2.3):

1. **enumerate** every graph of up to ``k`` operators over a domain's inputs, constants and
   operators, depth first, skipping duplicated computation (an operator repeated on the same
   inputs, or a tensor equal to one the graph already has; the latter is fingerprinted but not
   extended). Each graph is fingerprinted on integer tensors: a symmetric hash over the hashes
   of its outputs (tensors no operator reads), so the order of outputs does not matter.
2. **test**: in each bucket of equal fingerprints, the smallest graph is paired with every
   other, and the pair is kept if both compute the same outputs (up to a permutation, which
   gives the output map) on random float inputs in [-1, 1] within 1e-5.
3. **input renaming**: pairs equal up to renaming inputs, or a specialisation of another pair
   by identifying two inputs, are dropped, keeping the most general.
4. **common subgraph**: a pair whose graphs share an operator on the same inputs (replaced by a
   fresh input) or end in the same operator (removed) is covered by that more general pair;
   it is dropped once z3 verifies the general one (decided before z3 runs, to save its time).
5. **verify**: z3 proves each remaining pair from the axioms (a small resource budget, then
   four times it for the few that need more); then each concrete parameter is tried as a
   variable, so a rule covers every stride, padding, activation, groups, axis z3 allows.

Pairs are normalised on the way: output pairs computed identically on both sides are dropped
(a common subgraph holding an output), pairs that are parallel compositions are split, and
pairs whose constants take no shape from their use are dropped.

Two domains are enumerated separately: matrices (matmul, transpose, ...) and NCHW images with
kernels (conv, pooling, enlarge, ...). A graph mixing them would be disconnected: its
substitutions are compositions of smaller ones, so nothing is lost. Enumeration follows a
canonical operator order (independent neighbours sorted by a structural hash) and tries one
operand order of ewadd and ewmul, which the matcher treats as commutative.
"""

from __future__ import annotations

import hashlib
import itertools
import multiprocessing
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, ItemsView, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from paragraph.progress import Log
from paragraph.rules.match import usable
from paragraph.rules.rule import (
    PInput,
    POp,
    Ref,
    Rule,
    check_numeric,
    infer_side,
    template_metas,
)
from paragraph.rules.specs import (
    NONE,
    OPS,
    RELU,
    SAME,
    VALID,
    Meta,
    Params,
    ShapeError,
    compute,
    constant_value,
    infer,
)
from paragraph.rules.verify import Prover, z3_version

COMMUTATIVE = frozenset({"ewadd", "ewmul"})
TOLERANCE = 1e-5

Dim = str | int  # a symbolic dimension ("N") or a fixed size
# an enumerated graph: (choice index, input tensor indices) per operator, tensors numbered
# inputs first, then each operator's outputs; ((-1, inputs),) is a graph of bare inputs
EncodedGraph = tuple[tuple[int, tuple[int, ...]], ...]
RuleKey = tuple[tuple[Any, ...], ...]  # `pair_key`, `canonical_key`


@dataclass(frozen=True)
class Choice:
    """An operator with fixed parameters that the generator may add (groups: from shapes)."""

    op: str
    params: tuple[tuple[str, int], ...] = ()
    shape: tuple[Dim, ...] | None = None  # constants: their shape in this domain


@dataclass(frozen=True)
class InputSpec:
    name: str
    dims: tuple[Dim, ...]
    role: str  # "data", "kernel", "scalar"


@dataclass(frozen=True)
class Domain:
    """A family of graphs: typed inputs (symbolic dims with fingerprint values) and operators."""

    name: str
    inputs: tuple[InputSpec, ...]
    dims: dict[str, int]
    choices: tuple[Choice, ...]

    def shape(self, dims: Sequence[Dim], values: Mapping[str, int] | None = None
              ) -> tuple[int, ...]:
        values = values or self.dims
        return tuple(d if isinstance(d, int) else values[d] for d in dims)


def _p(**kw: int) -> tuple[tuple[str, int], ...]:
    return tuple(kw.items())


def matrix_domain() -> Domain:
    """Matrices x (M x N), weights (N x N) and a scalar; matmul, transpose and friends."""
    ins = (InputSpec("x1", ("M", "N"), "data"), InputSpec("x2", ("M", "N"), "data"),
           InputSpec("w1", ("N", "N"), "data"), InputSpec("w2", ("N", "N"), "data"),
           InputSpec("w3", ("N", "N"), "data"), InputSpec("s", (), "scalar"))
    choices = [Choice("matmul"), Choice("ewadd"), Choice("ewmul"), Choice("smul"),
               Choice("relu"), Choice("transpose"),
               Choice("concat", _p(axis=-2)), Choice("concat", _p(axis=-1)),
               Choice("split", _p(axis=-2)), Choice("split", _p(axis=-1)),
               Choice("i_matmul", (), ("N", "N")), Choice("ones", (), ("M", "N"))]
    return Domain("matrix", ins, {"M": 3, "N": 4}, tuple(choices))


def image_domain() -> Domain:
    """NCHW images, 3x3 and 1x1 kernels and a scalar; conv, pooling, enlarge and friends."""
    ins = (InputSpec("i1", ("B", "C", "H", "W"), "data"),
           InputSpec("i2", ("B", "C", "H", "W"), "data"),
           InputSpec("k1", ("C", "C", 3, 3), "kernel"), InputSpec("k2", ("C", "C", 3, 3), "kernel"),
           InputSpec("k3", ("C", "C", 1, 1), "kernel"), InputSpec("s", (), "scalar"))
    pool = _p(kh=3, kw=3, stride=1, pad=SAME)
    choices = [Choice("conv2d", _p(stride=1, pad=SAME, act=NONE)),
               Choice("conv2d", _p(stride=1, pad=SAME, act=RELU)),
               Choice("pool_avg", pool), Choice("pool_max", pool),
               Choice("ewadd"), Choice("ewmul"), Choice("smul"), Choice("relu"),
               Choice("concat", _p(axis=-4)), Choice("concat", _p(axis=-3)),
               Choice("split", _p(axis=-4)), Choice("split", _p(axis=-3)),
               Choice("enlarge", _p(kh=3, kw=3)),
               Choice("c_pool", _p(kh=3, kw=3), ("C", 1, 3, 3)),
               Choice("i_conv", _p(kh=3, kw=3), ("C", "C", 3, 3)),
               Choice("ones", (), ("B", "C", "H", "W"))]
    return Domain("image", ins, {"B": 2, "C": 4, "H": 4, "W": 4}, tuple(choices))


DOMAINS: dict[str, Callable[[], Domain]] = {"matrix": matrix_domain, "image": image_domain}


# ---------------------------------------------------------------------------- values
def _inputs(domain: Domain, mode: str, seed: int,
            values: Mapping[str, int] | None = None) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    for spec in domain.inputs:
        shape = domain.shape(spec.dims, values)
        if mode == "int":
            out.append(rng.integers(-2**20, 2**20, shape, dtype=np.int64))
        else:
            out.append(rng.uniform(-1, 1, shape))
    return out


def _params(choice: Choice, metas: Sequence[Meta]) -> Params:
    p = dict(choice.params)
    if choice.op == "conv2d":
        x, w = metas
        if x.rank != 4 or w.rank != 4 or w.shape[1] == 0 or x.shape[1] % w.shape[1]:
            raise ShapeError("conv2d channels")
        p["groups"] = x.shape[1] // w.shape[1]
    return p


def _content_hash(value: np.ndarray, meta: Meta) -> int:
    h = hashlib.blake2b(value.tobytes(), digest_size=8)
    h.update(repr((meta.shape, meta.trees)).encode())
    return int.from_bytes(h.digest(), "little")


@cache
def _stable(*parts: Hashable) -> int:
    """A hash that is the same in every process (Python randomises str and bytes hashes)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


# ---------------------------------------------------------------------------- enumeration
_EnumOp = tuple[int, tuple[int, ...], int]  # (choice index, input tensor indices, struct hash)


@dataclass
class _Tensor:
    value: np.ndarray
    meta: Meta
    content: int
    struct: int
    role: str
    producer: int  # op index, -1 for an input
    constant: bool = False


@dataclass
class Enumeration:
    """What step 1 produced: fingerprint buckets (graphs as tuples of (choice, inputs))."""

    buckets: dict[int, list[EncodedGraph]]
    graphs: int
    seconds: float
    duplicate_outputs: int = 0


def enumerate_graphs(domain: Domain, k: int, seed: int = 0) -> Enumeration:
    """TASO algorithm 1, step 1: fingerprint every graph of up to ``k`` operators (and the
    graphs of one or two bare inputs, the targets of rules such as ``T(T(x)) = x``)."""
    start = time.perf_counter()
    values = _inputs(domain, "int", seed)
    tensors: list[_Tensor] = []
    for i, (spec, v) in enumerate(zip(domain.inputs, values, strict=True)):
        meta = Meta(v.shape)
        tensors.append(_Tensor(v, meta, _content_hash(v, meta), hash((-1, i)), spec.role, -1))
    buckets: dict[int, list[EncodedGraph]] = defaultdict(list)
    counter = {"graphs": 0, "dup": 0}
    ops: list[_EnumOp] = []  # (choice index, input tensor indices, op struct hash)
    op_keys: set[tuple[int, tuple[int, ...]]] = set()
    consumers = [0] * len(tensors)
    contents = {t.content: i for i, t in enumerate(tensors)}
    n_in = len(tensors)

    def record(duplicate: bool = False) -> None:
        outs = [i for i in range(n_in, len(tensors)) if consumers[i] == 0]
        if duplicate and not all(contents.get(tensors[i].content, n_in) < n_in for i in outs):
            return  # a graph recomputing a tensor: only "this computes an input" is a rule
        if not outs or any(tensors[i].constant for i in outs):
            return
        if not _connected(ops, [t.producer for t in tensors]):
            return
        fp = hash(tuple(sorted(tensors[i].content for i in outs)))
        buckets[fp].append(tuple((c, ins) for c, ins, _ in ops))
        counter["graphs"] += 1

    for i in range(n_in):  # identity graphs: a rule's target may be one input ...
        if tensors[i].role != "scalar":
            buckets[hash((tensors[i].content,))].append(((-1, (i,)),))
    for i, j in itertools.combinations(range(n_in), 2):  # ... or two (split of concat)
        if "scalar" not in (tensors[i].role, tensors[j].role):
            buckets[hash(tuple(sorted((tensors[i].content, tensors[j].content))))].append(
                ((-1, (i, j)),))

    def candidates() -> Iterator[tuple[int, tuple[int, ...]]]:
        for ci, choice in enumerate(domain.choices):
            spec = OPS[choice.op]
            n = len(tensors)
            if spec.arity == 0:
                yield ci, ()
            elif spec.arity == 1:
                for a in range(n):
                    yield ci, (a,)
            elif choice.op in COMMUTATIVE:
                for a, b in itertools.combinations(range(n), 2):
                    if tensors[a].struct > tensors[b].struct:
                        a, b = b, a
                    yield ci, (a, b)
            else:
                for a in range(n):
                    for b in range(n):
                        if a != b:
                            yield ci, (a, b)

    def allowed(choice: Choice, ins: tuple[int, ...]) -> bool:
        roles = [tensors[i].role for i in ins]
        if choice.op == "conv2d":  # data in, kernel as weights (TASO: no input weight as data)
            return roles[0] == "data"
        if choice.op == "enlarge":  # TASO: enlarge reads input (weight) kernels it grows
            k = tensors[ins[0]]
            return (k.producer < 0 and roles[0] == "kernel"
                    and k.meta.shape[2:] != (dict(choice.params)["kh"], dict(choice.params)["kw"]))
        if choice.op in ("pool_avg", "pool_max"):
            return roles[0] == "data"
        if choice.op == "smul":
            return roles[1] == "scalar"
        return "scalar" not in roles

    def dfs(depth: int) -> None:
        record()
        if depth == k:
            return
        last = ops[-1] if ops else None
        for ci, ins in candidates():
            choice = domain.choices[ci]
            key = (ci, ins)
            if key in op_keys or not allowed(choice, ins):
                continue
            spec = OPS[choice.op]
            struct = hash((ci,) + tuple(tensors[i].struct for i in ins))
            if last is not None and struct < last[2]:
                last_outs = [t for t in range(n_in, len(tensors))
                             if tensors[t].producer == len(ops) - 1]
                if not any(i in last_outs for i in ins):
                    continue  # not the canonical order of independent operators
            metas = [tensors[i].meta for i in ins]
            try:
                params = _params(choice, metas)
                if spec.constant:
                    assert choice.shape is not None  # a constant's choice gives its shape
                    out_metas = [Meta(domain.shape(choice.shape))]
                    outs = [constant_value(choice.op, out_metas[0].shape, "int")]
                else:
                    out_metas = infer(choice.op, params, metas)
                    outs = compute(choice.op, params, [tensors[i].value for i in ins], metas,
                                   "int")
            except ShapeError:
                continue
            role = _role(choice, tensors, ins)
            new = [_Tensor(v, m, _content_hash(v, m), hash((struct, j)), role, len(ops),
                           spec.constant)
                   for j, (v, m) in enumerate(zip(outs, out_metas, strict=True))]
            duplicate = any(t.content in contents for t in new) or (
                len(new) == 2 and new[0].content == new[1].content)
            ops.append((ci, ins, struct))
            op_keys.add(key)
            for i in ins:
                consumers[i] += 1
            for t in new:
                tensors.append(t)
                consumers.append(0)
            if duplicate:
                counter["dup"] += 1
                record(duplicate=True)
            else:
                for j, t in enumerate(new):
                    contents[t.content] = len(tensors) - len(new) + j
                dfs(depth + 1)
                for t in new:
                    contents.pop(t.content, None)
            for _ in new:
                tensors.pop()
                consumers.pop()
            for i in ins:
                consumers[i] -= 1
            op_keys.discard(key)
            ops.pop()

    dfs(0)
    return Enumeration(dict(buckets), counter["graphs"], time.perf_counter() - start,
                       counter["dup"])


def _role(choice: Choice, tensors: Sequence[_Tensor], ins: tuple[int, ...]) -> str:
    if choice.op in ("enlarge", "c_pool", "i_conv"):
        return "kernel"
    if not ins:
        return "data"
    return tensors[ins[0]].role


def _connected(ops: Sequence[_EnumOp], producers: Sequence[int]) -> bool:
    """Whether the operators form one component (an op joins the producers of its inputs
    and every op reading the same input tensor)."""
    if len(ops) <= 1:
        return True
    parent = list(range(len(ops)))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    reader: dict[int, int] = {}
    for j, (_, ins, _) in enumerate(ops):
        for t in ins:
            if producers[t] >= 0:
                parent[find(j)] = find(producers[t])
            if t in reader:
                parent[find(j)] = find(reader[t])
            reader[t] = j
    return len({find(j) for j in range(len(ops))}) == 1


# ---------------------------------------------------------------------------- decoding
@dataclass
class Candidate:
    """A pair of equivalent graphs: ``graph`` (source) and ``rep`` (the bucket's smallest)."""

    graph: EncodedGraph
    rep: EncodedGraph
    rule: Rule | None = None
    key: RuleKey = ()


def _rule_of(c: Candidate) -> Rule:
    """The rule of candidate ``c`` (`test_candidates` gives every candidate one)."""
    assert c.rule is not None
    return c.rule


def _evaluate(domain: Domain, graph: EncodedGraph, inputs: Sequence[np.ndarray], mode: str
              ) -> tuple[list[np.ndarray], list[Meta], list[Params], list[int], list[int]]:
    """Values, metas and op params of every tensor of an encoded graph; and its outputs."""
    values = list(inputs)
    metas = [Meta(v.shape) for v in inputs]
    params_of: list[Params] = []
    consumed: set[int] = set()
    producer = [-1] * len(values)
    if graph and graph[0][0] == -1:
        return values, metas, [], list(graph[0][1]), producer
    for j, (ci, ins) in enumerate(graph):
        choice = domain.choices[ci]
        spec = OPS[choice.op]
        in_metas = [metas[i] for i in ins]
        p = _params(choice, in_metas)
        if spec.constant:
            assert choice.shape is not None  # a constant's choice gives its shape
            shape = domain.shape(choice.shape, {d: v for d, v in _dim_values(domain, inputs)})
            outs, out_metas = [constant_value(choice.op, shape, mode)], [Meta(shape)]
        else:
            out_metas = infer(choice.op, p, in_metas)
            outs = compute(choice.op, p, [values[i] for i in ins], in_metas, mode)
        params_of.append(p)
        consumed.update(ins)
        for v, m in zip(outs, out_metas, strict=True):
            values.append(v)
            metas.append(m)
            producer.append(j)
    outputs = [t for t in range(len(inputs), len(values)) if t not in consumed]
    return values, metas, params_of, outputs, producer


def _dim_values(domain: Domain, inputs: Sequence[np.ndarray]) -> ItemsView[str, int]:
    seen: dict[str, int] = {}
    for spec, v in zip(domain.inputs, inputs, strict=True):
        for d, n in zip(spec.dims, v.shape, strict=True):
            if isinstance(d, str):
                seen[d] = n
    return seen.items()


def _side(domain: Domain, graph: EncodedGraph, inputs: Sequence[np.ndarray],
          used: dict[int, int]) -> tuple[tuple[POp, ...], list[Ref]]:
    """Rule ops of an encoded graph; ``used`` maps pool input index -> rule input index."""
    _, _, params_of, outputs, producer = _evaluate(domain, graph, inputs, "int")
    if graph[0][0] == -1:
        return (), [(used[t], 0) for t in outputs]
    n = len(used)
    ref: dict[int, Ref] = {i: (r, 0) for i, r in used.items()}
    ops: list[POp] = []
    t = len(inputs)
    for j, (ci, ins) in enumerate(graph):
        choice = domain.choices[ci]
        ops.append(POp(choice.op, tuple(params_of[j].items()) if OPS[choice.op].params else (),
                       tuple(ref[i] for i in ins)))
        for out in range(OPS[choice.op].n_out):
            ref[t] = (n + j, out)
            t += 1
    # order params as the operator declares them
    ops = [POp(o.op, tuple((k, dict(o.params)[k]) for k in OPS[o.op].params), o.inputs)
           for o in ops]
    return tuple(ops), [ref[t] for t in outputs]


def _used_inputs(graph: EncodedGraph, n_in: int) -> set[int]:
    if graph[0][0] == -1:
        return set(graph[0][1])
    return {i for _, ins in graph for i in ins if i < n_in}


def _match_outputs(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> list[int] | None:
    """For each array of ``a`` the index of an equal one in ``b`` (a bijection), or None."""
    if len(a) != len(b):
        return None
    taken: set[int] = set()
    mapping: list[int] = []
    for u in a:
        for j, v in enumerate(b):
            if j not in taken and u.shape == v.shape and np.allclose(u, v, rtol=TOLERANCE,
                                                                     atol=TOLERANCE):
                taken.add(j)
                mapping.append(j)
                break
        else:
            return None
    return mapping


def test_candidates(domain: Domain, enum: Enumeration, seed: int = 1) -> list[Candidate]:
    """Step 2: pair each bucket's smallest graph with the others; keep pairs equal on floats."""
    n_in = len(domain.inputs)
    floats = _inputs(domain, "float", seed)
    out: list[Candidate] = []
    for graphs in enum.buckets.values():
        if len(graphs) < 2:
            continue
        rep = min(graphs, key=lambda g: (0 if g[0][0] == -1 else len(g), g))
        rep_vals = _evaluate(domain, rep, floats, "float")
        rep_outs = [rep_vals[0][t] for t in rep_vals[3]]
        for g in graphs:
            if g is rep:
                continue
            vals = _evaluate(domain, g, floats, "float")
            mapping = _match_outputs([vals[0][t] for t in vals[3]], rep_outs)
            if mapping is None:
                continue
            used = sorted(_used_inputs(g, n_in) | _used_inputs(rep, n_in))
            index = {i: r for r, i in enumerate(used)}
            ints = _inputs(domain, "int", 0)
            src_ops, src_outs = _side(domain, g, ints, index)
            tgt_ops, tgt_outs = _side(domain, rep, ints, index)
            rule = Rule(id="", name="", inputs=tuple(
                PInput(domain.inputs[i].name, domain.inputs[i].dims) for i in used),
                source=src_ops, target=tgt_ops,
                outputs=tuple((s, tgt_outs[m]) for s, m in zip(src_outs, mapping, strict=True)),
                origin="generated")
            pruned = drop_identical_outputs(rule)
            if pruned is None:
                continue
            for part in components(pruned):
                if shape_checkable(part, domain.dims):
                    out.append(Candidate(g, rep, part))
    return out


def drop_identical_outputs(rule: Rule) -> Rule | None:
    """The rule without output pairs computed identically on both sides (a common subgraph
    that contains an output: the rest is the substitution), or None if nothing remains."""
    n = len(rule.inputs)
    hs, ht = _side_hashes(rule.source, range(n), n), _side_hashes(rule.target, range(n), n)
    keep = tuple((s, t) for s, t in rule.outputs if hs[s] != ht[t])
    if len(keep) == len(rule.outputs):
        return rule
    if not keep:
        return None
    return _drop_dead(Rule(rule.id, rule.name, rule.inputs, rule.source, rule.target, keep,
                           rule.constraints, rule.origin))


# ---------------------------------------------------------------------------- renaming
def _side_hashes(ops: Sequence[POp], labels: Sequence[int], n: int) -> dict[Ref, int]:
    """Structural hash of every tensor a side defines, inputs labelled by ``labels``."""
    h: dict[Ref, int] = {(i, 0): hash((-1, labels[i])) for i in range(n)}
    for j, o in enumerate(ops):
        args = [h[r] for r in o.inputs]
        if o.op in COMMUTATIVE:
            args.sort()
        base = hash((_stable(o.op, o.params), tuple(args)))
        for out in range(OPS[o.op].n_out):
            h[(n + j, out)] = hash((base, out))
    return h


def pair_key(rule: Rule, labels: Sequence[int] | None = None) -> RuleKey:
    """A key equal for rules equal up to the input labelling ``labels`` (default: identity)
    and to the order of their operators; the two sides are unordered."""
    n = len(rule.inputs)
    labels = list(range(n)) if labels is None else labels
    hs, ht = _side_hashes(rule.source, labels, n), _side_hashes(rule.target, labels, n)
    src = tuple(sorted(v for k, v in hs.items() if k[0] >= n))
    tgt = tuple(sorted(v for k, v in ht.items() if k[0] >= n))
    outs = tuple(sorted(tuple(sorted((hs[s], ht[t]))) for s, t in rule.outputs))
    return tuple(sorted((src, tgt))) + (outs,)


def _signature(rule: Rule, i: int, base: Sequence[int], ranked: bool = True
               ) -> tuple[int, tuple[tuple[Any, ...], ...], tuple[str, ...]]:
    """What does not change under renaming: the rank of input class ``i`` and its uses."""
    n = len(rule.inputs)

    def mine(r: Ref) -> bool:
        return r[0] < n and r[1] == 0 and base[r[0]] == i

    uses: list[tuple[str, str, tuple[tuple[str, Any], ...], int]] = []
    for side, ops in (("s", rule.source), ("t", rule.target)):
        for o in ops:
            for pos, r in enumerate(o.inputs):
                if mine(r):
                    uses.append((side, o.op, o.params, 0 if o.op in COMMUTATIVE else pos))
    outs = [side for s, t in rule.outputs for side, r in (("s", s), ("t", t)) if mine(r)]
    return (rule.inputs[i].rank if ranked else 0, tuple(sorted(uses)), tuple(sorted(outs)))


def canonical_key(rule: Rule, merge: tuple[int, int] | None = None,
                  ranked: bool = True) -> RuleKey:
    """`pair_key` minimised over input renamings (inputs of equal rank and use signature);
    ``merge=(a, b)`` first identifies input b with a (a specialisation). ``ranked=False``
    ignores ranks (rules are rank-agnostic: the same rule found on matrices and images)."""
    n = len(rule.inputs)
    base = list(range(n))
    if merge is not None:
        base[merge[1]] = merge[0]
    sigs: dict[tuple[int, tuple[tuple[Any, ...], ...], tuple[str, ...]], list[int]] = {}
    for i in set(base):
        sig = _signature(rule, i, base, ranked)
        if sig[1] or sig[2]:  # an unused input has no label
            sigs.setdefault(sig, []).append(i)
    groups = [sigs[s] for s in sorted(sigs)]
    best: RuleKey | None = None
    for perm in itertools.product(*(itertools.permutations(g) for g in groups)):
        order = [i for g in perm for i in g]
        label = {i: r for r, i in enumerate(order)}
        key = pair_key(rule, [label.get(base[i], -1) for i in range(n)])
        if best is None or key < best:
            best = key
    assert best is not None  # the product of the (non-empty) groups' permutations is not empty
    return best


def _generality(rule: Rule) -> tuple[int, int]:
    dims = {d for i in rule.inputs for d in i.dims if isinstance(d, str)}
    return (-len(dims), -len(rule.inputs))


def _to_fresh(ops: Sequence[POp], old: tuple[int, int], n: int) -> tuple[POp, ...]:
    """Ops reading input ``n`` (a fresh one) instead of ``old``; op refs shift by one."""
    return tuple(POp(o.op, o.params, tuple(
        (n, 0) if r == old else ((r[0] + 1, r[1]) if r[0] >= n else r) for r in o.inputs))
        for o in ops)


def prune_renaming(cands: list[Candidate]) -> list[Candidate]:
    """Step 3: drop pairs equal to another up to renaming inputs, and specialisations of
    another pair by identifying two inputs of the same rank; keep the most general."""
    cands = sorted(cands, key=lambda c: _generality(_rule_of(c)))
    by_key: dict[RuleKey, Candidate] = {}
    for c in cands:
        c.key = canonical_key(_rule_of(c))
        by_key.setdefault(c.key, c)
    special: set[RuleKey] = set()
    for c in by_key.values():
        rule = _rule_of(c)
        n = len(rule.inputs)
        for a, b in itertools.combinations(range(n), 2):
            if rule.inputs[a].rank == rule.inputs[b].rank:
                k = canonical_key(rule, (a, b))
                if k != c.key and k in by_key:
                    special.add(k)
    return [c for k, c in by_key.items() if k not in special]


# ---------------------------------------------------------------------------- verification
# Axioms that hold only for one value of a parameter: a proof using them will not generalise
# that parameter, so the generator does not spend a z3 timeout trying.
_PINNED = {"groups": {"25", "39", "40"}, "pad": {"21", "25"}, "stride": {"25"},
           "act": {"18", "19", "20", "22", "24", "25", "40", "z2"}}
_GENERAL = ("stride", "pad", "act", "groups", "axis", "kh", "kw")


def _with_params(rule: Rule, subst: dict[tuple[str, int], str]) -> Rule:
    def side(ops: Sequence[POp]) -> tuple[POp, ...]:
        return tuple(POp(o.op, tuple((k, subst.get((k, v), v) if isinstance(v, int) else v)
                                     for k, v in o.params), o.inputs) for o in ops)
    names: dict[str, list[str]] = {}
    for (k, _), name in subst.items():
        names.setdefault(k, []).append(name)
    cons = tuple(("ne", a, b) for group in names.values() for a, b in
                 itertools.combinations(sorted(group), 2))
    return Rule(rule.id, rule.name, rule.inputs, side(rule.source), side(rule.target),
                rule.outputs, rule.constraints + cons, rule.origin)


_ALTERNATIVES = {"stride": (1, 2), "pad": (SAME, VALID), "act": (NONE, RELU),
                 "axis": (-1, -2, -3, -4), "kh": (1, 3, 5), "kw": (1, 3, 5), "groups": ()}


def generalise(rule: Rule, prover: Prover, axioms_used: Sequence[str],
               dims: dict[str, int]) -> tuple[Rule, tuple[str, ...]]:
    """Replace each concrete parameter value by a variable where z3 proves the rule still
    holds (every stride, padding, ... at once); returns the rule and its proof's axioms.

    A generalisation is first tried numerically on the other values of the parameter; one
    that fails there costs no z3 call. ``prover`` should have a small rlimit: the proof of a
    valid generalisation is the proof of the rule, found in milliseconds.
    """
    values = sorted({(k, v) for o in rule.source + rule.target for k, v in o.params
                     if k in _GENERAL and isinstance(v, int)})
    subst: dict[tuple[str, int], str] = {}
    used = tuple(axioms_used)
    for k, v in values:
        if _PINNED.get(k, set()) & set(used):
            continue
        name = f"?{k}{sum(1 for kk, _ in subst if kk == k)}"
        trial = {**subst, (k, v): name}
        candidate = _with_params(rule, trial)
        fixed = {n: val for (kk, val), n in subst.items()}
        if any(check_numeric(candidate, dims, {**fixed, name: alt}) is False
               for alt in _ALTERNATIVES.get(k, ()) if alt != v):
            continue
        proof = prover.prove_rule(candidate, use_cache=False)
        if proof.status == "verified":
            subst, used = trial, proof.axioms
    return (_with_params(rule, subst) if subst else rule), used


def _drop_dead(rule: Rule) -> Rule | None:
    """Remove mapped outputs equal on both sides (the same input), then operators nothing
    mapped depends on (per side) and unused inputs; None if no output is left."""
    n = len(rule.inputs)
    outputs = tuple(p for p in rule.outputs if not (p[0] == p[1] and p[0][0] < n))
    if not outputs:
        return None
    sides: dict[str, list[int]] = {}
    for which, idx in (("source", 0), ("target", 1)):
        ops = rule.side(which)
        live: set[int] = set()
        stack = [pair[idx][0] for pair in outputs]
        while stack:
            node = stack.pop()
            if node >= n and node not in live:
                live.add(node)
                stack.extend(r[0] for r in ops[node - n].inputs)
        sides[which] = sorted(live)
    used_inputs = sorted({r[0] for which in sides for node in sides[which]
                          for r in rule.side(which)[node - n].inputs if r[0] < n}
                         | {pair[i][0] for pair in outputs for i in (0, 1) if pair[i][0] < n})
    in_map = {old: new for new, old in enumerate(used_inputs)}
    remaps: dict[str, dict[int, int]] = {}
    new_sides: dict[str, tuple[POp, ...]] = {}
    for which in ("source", "target"):
        m = dict(in_map)
        m.update({old: len(used_inputs) + j for j, old in enumerate(sides[which])})
        remaps[which] = m
        new_sides[which] = tuple(
            POp(o.op, o.params, tuple((m[r[0]], r[1]) for r in o.inputs))
            for o in (rule.side(which)[node - n] for node in sides[which]))
    outputs = tuple(((remaps["source"][s[0]], s[1]), (remaps["target"][t[0]], t[1]))
                    for s, t in outputs)
    return Rule(rule.id, rule.name, tuple(rule.inputs[i] for i in used_inputs),
                new_sides["source"], new_sides["target"], outputs, rule.constraints,
                rule.origin)


def components(rule: Rule) -> list[Rule]:
    """Split a rule whose output pairs fall into groups sharing no operator (on either side)
    into one rule per group: it is their parallel composition, so nothing is lost."""
    n = len(rule.inputs)

    def ops_of(which: str, ref: Ref) -> set[int]:
        ops, stack = rule.side(which), [ref[0]]
        seen: set[int] = set()
        while stack:
            node = stack.pop()
            if node >= n and node not in seen:
                seen.add(node)
                stack.extend(r[0] for r in ops[node - n].inputs)
        return seen

    groups: list[tuple[set[int], set[int], list[tuple[Ref, Ref]]]] = []
    for pair in rule.outputs:
        src, tgt = ops_of("source", pair[0]), ops_of("target", pair[1])
        joined = [g for g in groups if g[0] & src or g[1] & tgt]
        for g in joined:
            groups.remove(g)
            src, tgt = src | g[0], tgt | g[1]
        groups.append((src, tgt, [p for g in joined for p in g[2]] + [pair]))
    if len(groups) == 1:
        return [rule]
    out: list[Rule] = []
    for _, _, pairs in groups:
        part = _drop_dead(Rule(rule.id, rule.name, rule.inputs, rule.source, rule.target,
                               tuple(pairs), rule.constraints, rule.origin))
        if part is not None:
            out.append(part)
    return out


def shape_checkable(rule: Rule, dims: dict[str, int]) -> bool:
    """Whether both sides infer shapes on the rule's templates (a constant whose shape its use
    does not determine, as in ``smul(ones, s)``, makes a rule unusable)."""
    metas = template_metas(rule, dims)
    try:
        infer_side(rule, "source", metas, {})
        infer_side(rule, "target", metas, {})
    except ShapeError:
        return False
    return True


def common_generalisations(rule: Rule, dims: dict[str, int]) -> list[Rule]:
    """TASO section 2.5, common subgraph: the more general rules obtained by (a) replacing an
    operator both sides compute on the same inputs by a fresh input, or (b) removing the
    operator that produces every output on both sides (its inputs become the outputs)."""
    n = len(rule.inputs)
    hs, ht = _side_hashes(rule.source, range(n), n), _side_hashes(rule.target, range(n), n)
    try:
        metas = infer_side(rule, "source", template_metas(rule, dims), {})
    except ShapeError:  # a constant whose shape its use does not give: no generalisation
        return []
    out: list[Rule] = []
    # (a) a common single-output operator read by other operators
    by_hash_t = {h: ref for ref, h in ht.items() if ref[0] >= n}
    mapped = {s for s, _ in rule.outputs} | {t for _, t in rule.outputs}
    for ref, h in hs.items():
        if ref[0] < n or ref not in hs or h not in by_hash_t:
            continue
        tref = by_hash_t[h]
        if OPS[rule.source[ref[0] - n].op].n_out != 1 or ref in mapped or tref in mapped:
            continue
        inputs = rule.inputs + (PInput(f"c{len(out)}", metas[ref].shape),)
        shifted = Rule(rule.id, rule.name, inputs, _to_fresh(rule.source, ref, n),
                       _to_fresh(rule.target, tref, n),
                       tuple(((s[0] + (s[0] >= n), s[1]), (t[0] + (t[0] >= n), t[1]))
                             for s, t in rule.outputs), rule.constraints, rule.origin)
        reduced = _drop_dead(shifted)
        reduced = reduced and drop_identical_outputs(reduced)
        if reduced is not None:
            out.append(reduced)
    # (b) the same operator on top of every output
    tops: list[tuple[POp, POp]] = []
    for s, t in rule.outputs:
        if s[0] < n or t[0] < n:
            break
        so, to = rule.source[s[0] - n], rule.target[t[0] - n]
        if so.op != to.op or so.params != to.params or s[1] != t[1]:
            break
        tops.append((so, to))
    else:
        pairs = tuple(dict.fromkeys((a, b) for so, to in tops
                                    for a, b in zip(so.inputs, to.inputs, strict=True)))
        if pairs:
            reduced = _drop_dead(Rule(rule.id, rule.name, rule.inputs, rule.source,
                                      rule.target, pairs, rule.constraints, rule.origin))
            reduced = reduced and drop_identical_outputs(reduced)
            if reduced is not None:
                out.append(reduced)
    return out


def subsumers(rule: Rule, dims: dict[str, int], keys: set[RuleKey]) -> list[RuleKey]:
    """Keys (in ``keys``) of the common-subgraph generalisations of ``rule``."""
    own = canonical_key(rule)
    found: list[RuleKey] = []
    for g in common_generalisations(rule, dims):
        k = canonical_key(g)
        if k != own and k in keys:
            found.append(k)
    return found


# ---------------------------------------------------------------------------- driver
@dataclass
class Report:
    """Counts after each stage (TASO table 2.3) and the surviving rules."""

    k: int
    stages: list[tuple[str, int, float]] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    unproved: list[Rule] = field(default_factory=list)

    def add(self, stage: str, count: int, seconds: float) -> None:
        self.stages.append((stage, count, seconds))


def run_domain(domain_name: str, k: int, rlimit: int = 500_000, gen_rlimit: int = 300_000,
               log: Log = print) -> Report:
    """Generate, test, prune and verify the substitutions of one domain (stages 1-5).

    Common-subgraph pruning is decided before z3 runs (to save its time) and applied after:
    a pair is dropped only if a generalisation of it is verified; otherwise it is verified
    itself.
    """
    domain = DOMAINS[domain_name]()
    report = Report(k)

    cpu = [time.process_time()]

    def stage(name: str, count: int, start: float) -> None:
        took = time.perf_counter() - start
        report.add(name, count, took)
        now = time.process_time()
        log(f"  [{domain_name}] {name:<30} {count:>7}  ({took:.1f} s, cpu {now - cpu[0]:.1f} s)")
        cpu[0] = now

    t = time.perf_counter()
    enum = enumerate_graphs(domain, k)
    stage("graphs enumerated", enum.graphs, t)
    t = time.perf_counter()
    cands = test_candidates(domain, enum)
    stage("candidates (equal on floats)", len(cands), t)
    t = time.perf_counter()
    cands = prune_renaming(cands)
    stage("after input renaming", len(cands), t)
    t = time.perf_counter()
    keys = {c.key for c in cands}
    covered = {c.key: subsumers(_rule_of(c), domain.dims, keys) for c in cands}
    stage("after common subgraph", sum(not v for v in covered.values()), t)
    t = time.perf_counter()
    prover, patient = Prover(rlimit=rlimit), Prover(rlimit=4 * rlimit)
    status: dict[RuleKey, tuple[bool, tuple[str, ...]]] = {}  # verified?, axioms used

    def verify(c: Candidate) -> bool:
        # most proofs need a few thousand z3 steps; the rest get four times the budget
        # (z3's search order depends on global term ids, so a borderline proof can need it)
        if c.key not in status:
            proof = prover.prove_rule(_rule_of(c), use_cache=False)
            if proof.status == "unknown":
                proof = patient.prove_rule(_rule_of(c), use_cache=False)
            status[c.key] = (proof.status == "verified", proof.axioms)
        return status[c.key][0]

    by_key = {c.key: c for c in cands}
    verified: list[Candidate] = []
    for i, c in enumerate(sorted(cands, key=lambda c: len(covered[c.key]))):
        if i and i % 500 == 0:
            log(f"  [{domain_name}]   ... {i} of {len(cands)} checked "
                f"({time.perf_counter() - t:.0f} s)")
        if covered[c.key] and any(verify(by_key[g]) for g in covered[c.key]):
            continue  # pruned: a more general rule is verified
        if verify(c):
            verified.append(c)
        else:
            report.unproved.append(_rule_of(c))
    stage("verified by z3 (kept)", len(verified), t)
    t = time.perf_counter()
    general: dict[RuleKey, Rule] = {}
    quick = Prover(rlimit=gen_rlimit)
    for c in verified:
        rule, used = generalise(_rule_of(c), quick, status[c.key][1], domain.dims)
        rule = Rule(rule.id, rule.name, rule.inputs, rule.source, rule.target, rule.outputs,
                    rule.constraints, rule.origin,
                    {"status": "verified", "axioms": list(used), "z3": z3_version()})
        general.setdefault(canonical_key(rule), rule)
    report.rules = list(general.values())
    stage("parameters generalised", len(report.rules), t)
    return report


def _run_domain_job(args: tuple[str, int, int, Log | None]) -> Report:
    name, k, rlimit, log = args
    return run_domain(name, k, rlimit, log=log or print)


def generate(k: int = 3, domains: Sequence[str] = ("matrix", "image"), workers: int = 2,
             rlimit: int = 500_000, log: Log = print) -> Report:
    """TASO's generator over every domain (one process per domain, up to ``workers``).

    Returns the combined report: per-stage counts summed over domains (the time of a stage is
    the longest domain's), and the rules, deduplicated across domains, with ids.
    """
    start = time.perf_counter()
    parallel = workers > 1 and len(domains) > 1
    jobs = [(d, k, rlimit, None if parallel else log) for d in domains]
    if parallel:
        with multiprocessing.get_context("fork").Pool(min(workers, len(jobs))) as pool:
            reports = pool.map(_run_domain_job, jobs)
    else:
        reports = [_run_domain_job(j) for j in jobs]
    total = Report(k)
    for i, (name, _, _) in enumerate(reports[0].stages):  # noqa: B007
        total.add(name, sum(r.stages[i][1] for r in reports),
                  max(r.stages[i][2] for r in reports))
    seen: dict[RuleKey, Rule] = {}
    for r in reports:
        for rule in r.rules:
            # a rule neither side of which binds every variable of the other cannot rewrite
            if usable(rule) or usable(rule.reversed()):
                seen.setdefault(canonical_key(rule, ranked=False), rule)
        total.unproved.extend(r.unproved)
    total.rules = [_named(rule, k) for rule in seen.values()]
    total.add("across domains, applicable", len(total.rules), time.perf_counter() - start)
    return total


def _named(rule: Rule, k: int) -> Rule:
    """The rule with a stable id (from its content) and a readable name."""
    digest = hashlib.sha256(rule.formula_key().encode()).hexdigest()[:8]
    src = "+".join(o.op for o in rule.source if not OPS[o.op].constant) or "id"
    tgt = "+".join(o.op for o in rule.target if not OPS[o.op].constant) or "id"
    return Rule(f"taso-{digest}", f"{src} -> {tgt}", rule.inputs, rule.source, rule.target,
                rule.outputs, rule.constraints, "generated",
                {**(rule.proof or {}), "generator": {"k": k}})
