"""The house rules, checked from the source: the layers (`LAYERS`, bottom up) import only their
own layer and those below it, with the imports under ``TYPE_CHECKING`` counted too; the import
graph has no cycle, hidden under ``TYPE_CHECKING`` or not; imports inside functions only defer
optional or slow dependencies (and say why); and the pure core (graph IR, operator specs,
schedules, rules, the graph algorithms) runs without TVM."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "paragraph"
# the TVM-facing modules (and the face above them); everything else is the pure core
TVM_FACING = ("paragraph.tvm_interop", "paragraph.models", "paragraph.planner",
              "paragraph.deploy", "paragraph.transform",
              "paragraph.bench", "paragraph.cli", "paragraph.timeline", "paragraph.__main__")
# what a function may import for itself: optional extras, slow imports few callers need, and
# TVM's compiler side, which a process that only loads artifacts leaves out (`paragraph.lean`:
# TVM's runtime alone; the planner, the search and the artifact writer import the compiler)
DEFERRED = ("torch", "onnx", "onnxruntime", "matplotlib", "scipy", "cuda", "tqdm", "tvm",
            "paragraph.planner", "paragraph.passes", "paragraph.tvm_interop.build")
# bottom up: a module may import its own layer and the layers below it, nothing above (the
# data flows up this list: a model is imported, built, run and measured, then planned, then
# handed to the user). The pure core is every module no other layer names.
LAYERS = (
    ("core", ()),  # the graph IR, operators, schedules, timing, files, machine, progress
    ("rules", ("paragraph.rules",)),  # the verified rule library
    ("passes", ("paragraph.passes",)),  # the graph algorithms and the search
    ("frontend", ("paragraph.tvm_interop.frontend", "paragraph.models")),  # models in
    ("runtime", ("paragraph.tvm_interop.runtime",)),  # running a program; the kernel library
    ("measure", ("paragraph.tvm_interop.measure",)),  # timing kernels, the cost database
    ("build", ("paragraph.tvm_interop.build",)),  # lowering, kernel sources, programs
    ("meter", ("paragraph.tvm_interop.meter",)),  # measuring programs, here or remote
    ("tune", ("paragraph.tvm_interop.tune",)),  # MetaSchedule
    ("planner", ("paragraph.planner",)),  # every decision made by measurement
    ("face", ("paragraph.deploy", "paragraph.transform", "paragraph.bench",
              "paragraph.timeline", "paragraph.cli", "paragraph.__main__")),
)


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str, typing: bool = False) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement of module ``name`` that runs (with ``typing``, also those under
    ``TYPE_CHECKING``), with whether it sits inside a function."""
    tree = ast.parse(MODULES[name].read_text())
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            statement(child, in_function)

    def statement(child: ast.AST, in_function: bool) -> None:
        if isinstance(child, ast.If) and _is_type_checking(child):
            for other in ([*child.body, *child.orelse] if typing else child.orelse):
                statement(other, in_function)
            return
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            found.append((child, in_function))
        visit(child, in_function or isinstance(child, (ast.FunctionDef,
                                                        ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


def _targets(name: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement loads (the submodule where a name is one)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
    return subs + ([base] if len(subs) < len(node.names) else [])


def _graph(typing: bool = False) -> dict[str, set[str]]:
    """Module -> the modules it imports (with ``typing``, under ``TYPE_CHECKING`` too)."""
    return {name: {t for node, _ in _imports(name, typing) for t in _targets(name, node)
                   if t in MODULES and t != name} for name in MODULES}


def layer(name: str) -> int:
    """The index in `LAYERS` of module ``name``'s layer (the package ``paragraph.tvm_interop``
    itself re-exports the frontend)."""
    if name == "paragraph.tvm_interop":
        return 3
    for i, (_, prefixes) in reversed(list(enumerate(LAYERS))):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return i
    return 0


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a layer above its own."""
    return sorted(f"{a} ({LAYERS[layer(a)][0]}) imports {b} ({LAYERS[layer(b)][0]})"
                  for a, targets in graph.items() for b in targets if layer(b) > layer(a))


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (found := visit(w)) is not None:
                return found
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)) is not None:
            return found
    return None


def test_the_import_graph_has_no_cycle_even_under_type_checking():
    graph = _graph(typing=True)
    assert len(graph) > 40 and "paragraph.planner" in graph["paragraph.cli"]
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_imports_point_down_the_layers():
    upward = _upward(_graph(typing=True))
    assert not upward, "imports from a layer above:\n" + "\n".join(upward)


def test_the_direction_check_finds_an_upward_import():
    assert layer("paragraph.graph") == 0 and layer("paragraph.tvm_interop.runtime.executor") \
        < layer("paragraph.tvm_interop.build.program") < layer("paragraph.planner.ios")
    graph = {"paragraph.tvm_interop.runtime.executor": {"paragraph.tvm_interop.build.program"},
             "paragraph.planner.ios": {"paragraph.graph"}}
    assert _upward(graph) == ["paragraph.tvm_interop.runtime.executor (runtime) imports "
                              "paragraph.tvm_interop.build.program (build)"]
    # an import only a type checker follows counts: it is a dependency all the same
    typed, run = (_graph(typing)["paragraph.tvm_interop.measure.device"] for typing in (True,
                                                                                     False))
    assert "paragraph.tvm_interop.runtime.executor" in typed - run


def test_every_module_is_in_a_layer_the_architecture_names():
    """ARCHITECTURE.md names every module (a package is named through its modules), as
    `` `x/y/z` `` or `` `x.y.z` `` with any leading packages left out."""
    text = (PACKAGE.parent / "ARCHITECTURE.md").read_text()
    missing = []
    for name, path in MODULES.items():
        if path.name in ("__init__.py", "__main__.py"):
            continue
        parts = name.split(".")[1:]
        forms = {sep.join(parts[i:]) for i in range(len(parts)) for sep in "./"}
        if not any(f"`{form}`" in text for form in forms):
            missing.append(name)
    assert not missing, "modules ARCHITECTURE.md does not name:\n" + "\n".join(missing)


def test_imports_inside_functions_only_defer_optional_or_slow_dependencies():
    offenders = []
    for name, path in MODULES.items():
        lines = path.read_text().splitlines()
        for node, in_function in _imports(name):
            if not in_function:
                continue
            what = _targets(name, node)
            deferred = all(any(t == d or t.startswith(d + ".") for d in DEFERRED) for t in what)
            said = "#" in lines[node.lineno - 1] or lines[node.lineno - 2].strip().startswith("#")
            if not (deferred and said):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} "
                                 f"{', '.join(what)}{'' if said else ' (no reason given)'}")
    assert not offenders, "imports inside functions:\n" + "\n".join(offenders)


PURE = sorted(n for n in MODULES if not n.startswith(TVM_FACING))


def test_the_pure_core_is_what_it_should_be():
    for name in ("paragraph", "paragraph.graph", "paragraph.ops", "paragraph.schedule",
                 "paragraph.rules.library", "paragraph.passes.schedule", "paragraph.passes.ios",
                 "paragraph.passes.split", "paragraph.dag", "paragraph.timing"):
        assert name in PURE


def test_the_pure_core_runs_without_tvm():
    """Every pure module imports, and its algorithms run, with TVM, TVM FFI and PyTorch
    made unimportable."""
    script = textwrap.dedent(f"""
        import importlib, sys
        BLOCKED = ("tvm", "tvm_ffi", "torch", "onnx", "onnxruntime")

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"{{name}} is blocked in this test")
                return None

        sys.meta_path.insert(0, Block())
        for name in {PURE!r}:
            importlib.import_module(name)

        import numpy as np
        from paragraph import GraphBuilder, TensorRef
        from paragraph.interpret import run_graph
        from paragraph.passes.ios import IOSOptions, search
        from paragraph.passes.schedule import ALGORITHMS, make_schedule
        from paragraph.passes.split import split_lone_convs
        from paragraph.rules import load_library, rewrites

        rng = np.random.default_rng(0)
        b = GraphBuilder()
        x = b.input((1, 3, 8, 8))
        y = b.op("conv2d", [x, b.weight(rng.standard_normal((8, 3, 3, 3)).astype("f4"))],
                 {{"padding": 1}})
        y = b.op("relu", [y.out])
        a = b.op("conv2d", [y.out, b.weight(rng.standard_normal((4, 8, 1, 1)).astype("f4"))])
        c = b.op("conv2d", [y.out, b.weight(rng.standard_normal((4, 8, 3, 3)).astype("f4"))],
                 {{"padding": 1}})
        graph = b.build([b.op("concat", [a.out, c.out], {{"axis": 1}}).out])
        k = GraphBuilder()  # a kernel graph: a stem, two branches, a join
        t = k.type_of(k.input((4,)))
        stem = k.op("kernel", [TensorRef(0)], {{"flops": 2.0}}, outputs=[t])
        left = k.op("kernel", [stem.out], {{"flops": 1.0}}, outputs=[t])
        right = k.op("kernel", [stem.out], {{"flops": 1.0}}, outputs=[t])
        kernels = k.build([k.op("kernel", [left.out, right.out], {{"flops": 1.0}},
                                outputs=[t]).out])
        for name in ALGORITHMS:
            make_schedule(name, kernels, cores=2).validate(kernels)
        stages = search(kernels, IOSOptions(s=2),
                        lambda groups, strategy: max(map(len, groups)))
        assert sorted(k for st in stages for g in st.groups for k in g) == [1, 2, 3, 4]
        assert any(len(st.groups) == 2 for st in stages)  # the branches side by side
        split, done = split_lone_convs(graph, 2, min_share=0.0)
        inputs = [rng.standard_normal((1, 3, 8, 8)).astype("f4")]
        assert np.allclose(run_graph(split, inputs)[0], run_graph(graph, inputs)[0], atol=1e-4)
        assert any(True for _ in rewrites(graph, load_library().for_search()))
        loaded = [m for m in BLOCKED if m in sys.modules]
        assert not loaded, loaded
        print("pure", len({PURE!r}), done)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "pure" in run.stdout and "split-conv-2" in run.stdout
