"""Model importers: ONNX files, torch modules and programs, Relax modules -> one Relax form.

`load` turns any accepted model source into a Relax `IRModule` whose ``main`` is one dataflow
block over static shapes with its weights bound as constants; `prepare` is the normalisation every
loaded module goes through (and that the CLI applies to zoo modules too): batch norm decomposed
for inference, weight parameters bound, constants folded, dead bindings removed, and the result
checked against what `paragraph.tvm_interop.frontend.relax_graph.from_relax` accepts.

torch and onnx are imported only when a source needs them, so this module imports without them.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.ir.expr import Constant as _ConstBase

from paragraph.errors import ModelLoadError, ModelTooLargeError, UnsupportedModelError
from paragraph.machine import total_memory
from paragraph.tvm_interop.frontend import onnx_converters
from paragraph.tvm_interop.frontend.layout_free import full_rank_constants, unflatten_norms
from paragraph.tvm_interop.frontend.mutator import ModuleMutator
from paragraph.tvm_interop.frontend.onnx_shapes import fold_shape_computations
from paragraph.tvm_interop.frontend.relax_graph import from_relax

__all__ = ["load", "prepare", "ACCEPTED_SOURCES"]

ACCEPTED_SOURCES = ("a path to an .onnx (or torch.export .pt2) file, a torch.nn.Module (with "
                    "example_inputs or input_shapes), a torch.export.ExportedProgram, or a "
                    "tvm.IRModule")
_EXTENSIONS = {".onnx": "ONNX", ".pt2": "torch.export"}

Shape = Sequence[int]
InputShapes = Mapping[str, Shape] | Sequence[Shape] | None


# TVM's TOPI operators are tagged through a process-wide scope (``te.tag.TagScope._current``, a
# class attribute): two threads that build TE computations at once (a frontend's converters,
# LegalizeOps, FoldConstant) fail with "nested op_tag is not allowed". Importing, preparing
# and legalizing hold this lock; the rest of a build runs in parallel.
TE_LOCK = threading.RLock()


# ---------------------------------------------------------------------------- public API
def load(source: Any, input_shapes: InputShapes = None, *,
         example_inputs: Sequence[Any] | None = None) -> tvm.IRModule:
    """Import ``source`` as a prepared Relax module (see `prepare`).

    ``source`` is a path to an ``.onnx`` file (or a ``.pt2`` file written by
    ``torch.export.save``), a ``torch.nn.Module``, a ``torch.export.ExportedProgram`` or a
    ``tvm.IRModule``. ``input_shapes`` ({input name: shape} or a list of shapes in input order)
    fixes the dynamic dimensions of ONNX inputs, binds the symbolic dimensions of exported
    programs and Relax modules, and for a torch module stands in for ``example_inputs`` (seeded
    random float32 tensors of those shapes). Raises `ModelLoadError` when the source cannot be
    read and `UnsupportedModelError` when it holds something paragraph or TVM cannot represent.
    """
    with TE_LOCK:
        return prepare(_import(source, input_shapes, example_inputs))


def prepare(mod: tvm.IRModule) -> tvm.IRModule:
    """Normalise a Relax module into the form the rest of paragraph expects, and check it.

    Refuses first (`ModelTooLargeError`) a model that cannot fit this machine's memory
    (`_check_memory`). Decomposes batch norm for inference, binds ``main``'s weight parameters
    when the module
    carries their values (the frontends' ``params`` attribute; parameters without values stay
    inputs), gives ``take`` (an embedding's Gather) a mode that cannot read out of bounds
    (`_SafeTake`), folds constant subexpressions, canonicalises bindings and removes dead
    code. Raises `UnsupportedModelError` naming the variable or construct when ``main`` is not
    one dataflow block over static tensor shapes (symbolic dimensions, control flow, several
    blocks).
    """
    with TE_LOCK:
        return _prepare(mod)


def _prepare(mod: tvm.IRModule) -> tvm.IRModule:
    _require_main(mod)
    _check_memory(mod)  # before folding makes the constants the model declares
    mod = _bind_weight_params(mod)
    mod = _SafeTake(mod).transform()
    mod = relax.transform.DecomposeOpsForInference()(mod)
    mod = _fold_constants(mod)
    mod = full_rank_constants(unflatten_norms(mod))
    mod = _SharedConstants(mod).transform()
    mod = relax.transform.CanonicalizeBindings()(mod)
    mod = relax.transform.DeadCodeElimination()(mod)
    _check_supported(mod)
    return mod


# ---------------------------------------------------------------------------- dispatch
def _import(source: Any, input_shapes: InputShapes, example_inputs: Any) -> tvm.IRModule:
    if isinstance(source, tvm.IRModule):
        return _bind_input_shapes(source, input_shapes)
    if isinstance(source, (str, os.PathLike)):
        return _load_file(Path(source), input_shapes)
    # A torch object can only exist if torch is already imported: no need to import it here.
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(source, torch.export.ExportedProgram):
            return _from_exported_program(source, input_shapes)
        if isinstance(source, torch.nn.Module):
            return _from_torch_module(source, input_shapes, example_inputs)
    raise ModelLoadError(f"cannot load a {type(source).__module__}.{type(source).__qualname__}: "
                         f"paragraph loads {ACCEPTED_SOURCES}")


def _require(module: str, extra: str) -> Any:
    """Import an optional dependency, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ModelLoadError(f"this model needs {extra} ({exc}); install it with "
                             f"`pip install paragraph[{extra}]`") from None


def _load_file(path: Path, input_shapes: InputShapes) -> tvm.IRModule:
    if path.is_dir():
        raise ModelLoadError(f"{path} is a directory, not a model file")
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file")
    kind = _EXTENSIONS.get(path.suffix.lower())
    if kind is None:
        known = ", ".join(f"{ext} ({name})" for ext, name in _EXTENSIONS.items())
        raise ModelLoadError(f"{path}: unknown model file extension {path.suffix!r}; "
                             f"paragraph reads {known}")
    if kind == "ONNX":
        return _from_onnx_file(path, input_shapes)
    return _from_pt2_file(path, input_shapes)


# ---------------------------------------------------------------------------- ONNX
def _from_onnx_file(path: Path, input_shapes: InputShapes) -> tvm.IRModule:
    """TVM's ONNX frontend, after two workarounds of its gaps: the model's shape computations
    are folded into constants first (`onnx_shapes`: TVM leaves sizes computed from ``Shape``
    dynamic, which fails ShuffleNetV2 and Swin), and paragraph's converters stand in for some of
    TVM's (`onnx_converters`: ``Clip`` as one ``relax.clip``, ``LSTM`` and ``GRU``, which TVM
    lacks)."""
    onnx = _require("onnx", "onnx")
    model = _read_onnx(onnx, path)
    shape_dict = _onnx_shape_dict(model, input_shapes, path)
    frontend = _require("tvm.relax.frontend.onnx", "onnx")
    fold_shape_computations(model, shape_dict)
    try:
        with onnx_converters.installed(frontend.onnx_frontend):
            return frontend.from_onnx(model, shape_dict=shape_dict, keep_params_in_input=False)
    except UnsupportedModelError as exc:  # from paragraph's converters
        raise UnsupportedModelError(f"{path}: {exc}") from None
    except tvm.error.OpNotImplemented as exc:
        raise UnsupportedModelError(f"{path}: TVM's ONNX frontend cannot convert it: "
                                    f"{_first_line(exc)}") from None
    except Exception as exc:  # the frontend raises anything from ValueError to TVMError
        raise UnsupportedModelError(f"{path}: TVM's ONNX frontend failed: "
                                    f"{type(exc).__name__}: {_first_line(exc)}") from exc


def _read_onnx(onnx: Any, path: Path) -> Any:
    """``onnx.load`` with every failure (protobuf, I/O) turned into a `ModelLoadError`."""
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # DecodeError, OSError, onnx's own errors: all mean "unreadable"
        raise ModelLoadError(f"{path} is not a readable ONNX file: {type(exc).__name__}: "
                             f"{_first_line(exc)}") from None
    # protobuf is lenient: some garbage parses into an empty or nonsensical ModelProto.
    if not model.HasField("graph") or model.ir_version <= 0:
        raise ModelLoadError(f"{path} is not an ONNX model (no graph or no IR version)")
    if model.ir_version < 3:
        raise ModelLoadError(f"{path} has ONNX IR version {model.ir_version}; TVM needs 3 or "
                             "later (re-export it with a recent exporter)")
    return model


def _onnx_shape_dict(model: Any, input_shapes: InputShapes, path: Path) -> dict[str, list[int]]:
    """The frontend's ``shape_dict``: the given shapes, after checking every input is static."""
    initializers = {t.name for t in model.graph.initializer}  # old exporters list weights too
    inputs = [i for i in model.graph.input if i.name not in initializers]
    given = _shapes_by_name(input_shapes, [i.name for i in inputs], str(path))
    for info in inputs:
        dims = _onnx_dims(info)
        if info.name in given:
            if dims is not None and len(dims) != len(given[info.name]):
                raise ModelLoadError(f"{path}: input_shapes gives {info.name!r} the shape "
                                     f"{given[info.name]}, but the input has rank {len(dims)}")
        elif dims is None or not all(isinstance(d, int) for d in dims):
            raise UnsupportedModelError(_dynamic_onnx_input_message(path, info.name, dims))
    return given


def _onnx_dims(info: Any) -> list[int | str] | None:
    """An ONNX input's dims: ints, ``dim_param`` names or '?'; None when the rank is unknown."""
    tensor_type = info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
            for d in tensor_type.shape.dim]


def _dynamic_onnx_input_message(path: Path, name: str, dims: list[int | str] | None) -> str:
    shown = "unknown rank" if dims is None else f"dims {dims}"
    example = (1, 3, 224, 224) if dims is None else tuple(
        d if isinstance(d, int) else 1 for d in dims)
    return (f"{path}: ONNX input {name!r} is dynamic ({shown}); paragraph needs static shapes. "
            f"Fix them with input_shapes, e.g. load({str(path)!r}, "
            f"input_shapes={{{name!r}: {example}}})")


# ---------------------------------------------------------------------------- torch
def _from_pt2_file(path: Path, input_shapes: InputShapes) -> tvm.IRModule:
    torch = _require("torch", "torch")
    try:
        program = torch.export.load(str(path))
    except Exception as exc:
        raise ModelLoadError(f"{path} is not a readable torch.export file: "
                             f"{type(exc).__name__}: {_first_line(exc)}") from None
    return _from_exported_program(program, input_shapes)


def _from_torch_module(module: Any, input_shapes: InputShapes,
                       example_inputs: Any) -> tvm.IRModule:
    torch = _require("torch", "torch")
    args = _example_args(torch, input_shapes, example_inputs, type(module).__name__)
    was_training = module.training
    try:
        program = torch.export.export(module.eval(), args)
    except Exception as exc:
        raise UnsupportedModelError(f"torch.export cannot export {type(module).__name__}: "
                                    f"{type(exc).__name__}: {_first_line(exc)}") from exc
    finally:
        module.train(was_training)  # leave the caller's module as we found it
    return _from_exported_program(program, None)


def _example_args(torch: Any, input_shapes: InputShapes, example_inputs: Any,
                  what: str) -> tuple[Any, ...]:
    if example_inputs is not None:
        if isinstance(example_inputs, torch.Tensor):
            return (example_inputs,)
        return tuple(example_inputs)
    if input_shapes is None:
        raise ModelLoadError(f"loading the torch module {what} needs example_inputs (a tuple of "
                             "tensors) or input_shapes (a list of shapes)")
    generator = torch.Generator().manual_seed(0)
    return tuple(torch.randn(tuple(s), generator=generator, dtype=torch.float32)
                 for s in _shape_list(input_shapes))


def _from_exported_program(program: Any, input_shapes: InputShapes) -> tvm.IRModule:
    frontend = _require("tvm.relax.frontend.torch", "torch")
    try:
        # unwrap_unit_return_tuple: a one-tensor model returns the tensor, not a 1-tuple.
        mod = frontend.from_exported_program(program, keep_params_as_input=False,
                                             unwrap_unit_return_tuple=True)
    except AssertionError as exc:  # how the frontend reports ops missing from its table
        raise UnsupportedModelError(f"TVM's PyTorch frontend cannot convert the program: "
                                    f"{_first_line(exc)}") from None
    except Exception as exc:
        raise UnsupportedModelError(f"TVM's PyTorch frontend failed: {type(exc).__name__}: "
                                    f"{_first_line(exc)}") from exc
    return _bind_input_shapes(mod, input_shapes)


# ---------------------------------------------------------------------------- input shapes
def _shape_list(input_shapes: InputShapes) -> list[tuple[int, ...]]:
    """Shapes in input order; a dict gives its values in order, a flat int tuple is one shape."""
    shapes: list[Any]
    if input_shapes is None:
        return []
    if isinstance(input_shapes, Mapping):
        shapes = list(input_shapes.values())
    elif all(isinstance(d, int) for d in input_shapes):
        shapes = [input_shapes]
    else:
        shapes = list(input_shapes)
    return [tuple(int(d) for d in s) for s in shapes]


def _shapes_by_name(input_shapes: InputShapes, names: list[str],
                    where: str) -> dict[str, list[int]]:
    if input_shapes is None:
        return {}
    if isinstance(input_shapes, Mapping):
        unknown = [n for n in input_shapes if n not in names]
        if unknown:
            raise ModelLoadError(f"{where}: input_shapes names {unknown}, which are not inputs; "
                                 f"the inputs are {names}")
        return {n: [int(d) for d in s] for n, s in input_shapes.items()}
    shapes = _shape_list(input_shapes)
    if len(shapes) > len(names):
        raise ModelLoadError(f"{where}: input_shapes gives {len(shapes)} shapes for "
                             f"{len(names)} inputs {names}")
    return {n: list(s) for n, s in zip(names, shapes, strict=False)}


def _bind_input_shapes(mod: tvm.IRModule, input_shapes: InputShapes) -> tvm.IRModule:
    """Bind the symbolic dimensions of ``main``'s inputs to the sizes ``input_shapes`` gives."""
    if input_shapes is None:
        return mod
    _require_main(mod)
    params = list(mod["main"].params)
    given = _shapes_by_name(input_shapes, [p.name for p in params], "the Relax module")
    binding: dict[Any, int] = {}
    for param in params:
        if param.name in given:
            binding.update(_dim_binding(param, given[param.name]))
    return relax.transform.BindSymbolicVars(binding, "main")(mod) if binding else mod


def _dim_binding(param: relax.Var, shape: list[int]) -> dict[Any, int]:
    ty = param.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return {}
    dims = list(ty.shape.values)
    if len(dims) != len(shape):
        raise ModelLoadError(f"input_shapes gives {param.name!r} the shape {tuple(shape)}, but "
                             f"the input has rank {len(dims)}")
    for d, size in zip(dims, shape, strict=True):
        if isinstance(d, tvm.tirx.IntImm) and int(d.value) != size:
            raise ModelLoadError(f"input_shapes gives {param.name!r} the shape {tuple(shape)}, "
                                 f"but the input has the static shape {ty.shape}")
    return {d: size for d, size in zip(dims, shape, strict=True) if isinstance(d, tvm.tirx.Var)}


# ---------------------------------------------------------------------------- prepare steps
def _require_main(mod: tvm.IRModule) -> None:
    names = [gv.name_hint for gv in mod.functions]
    if "main" not in names or not isinstance(mod["main"], relax.Function):
        raise UnsupportedModelError(f"the module has no Relax function 'main' (it has {names})")


def _bind_weight_params(mod: tvm.IRModule) -> tvm.IRModule:
    """Bind the trailing parameters whose values the frontends left in ``main``'s attributes."""
    func = mod["main"]
    attrs = func.attrs or {}
    if "params" not in attrs or "num_input" not in attrs:
        return mod  # weights without values (or none at all): they stay inputs
    weights = list(func.params)[int(attrs["num_input"]):]
    values = list(attrs["params"])
    if len(weights) != len(values):
        return mod
    mod = relax.transform.BindParams("main", dict(zip(weights, values, strict=True)))(mod)
    mod = mod.clone()  # never update a module the caller may still hold
    mod["main"] = mod["main"].without_attr("params")  # the values now live in the constants
    return mod


def _check_supported(mod: tvm.IRModule) -> None:
    """Raise unless ``main`` is what `from_relax` accepts; name control flow explicitly first."""
    body = mod["main"].body
    for block in body.blocks:
        for binding in block.bindings:
            if isinstance(binding.value, relax.If):
                raise UnsupportedModelError(
                    f"control flow: {binding.var.name!r} is bound to an if/else (relax.If); "
                    "paragraph needs one straight-line dataflow block")
    if isinstance(body.body, relax.If):
        raise UnsupportedModelError("control flow: main returns an if/else (relax.If); "
                                    "paragraph needs one straight-line dataflow block")
    graph = from_relax(mod)  # symbolic shapes, several dataflow blocks, non-tensor values, ...
    if not graph.operators:  # an executor with no kernel to run has no stream to run it on
        raise UnsupportedModelError("the model computes nothing: main has no operator (it "
                                    "returns its inputs or constants as they are); there is "
                                    "nothing to compile")


def _check_memory(mod: tvm.IRModule) -> None:
    """Raise `ModelTooLargeError` when ``main`` cannot run in this machine's memory: a run
    holds its inputs, weights and outputs and, at some point, its largest other tensor, so
    their sum is a lower bound of what any plan allocates. Checked on the declared types,
    before anything of that size is made (folding a huge ``ConstantOfShape`` would allocate it;
    past the machine's memory the kernel's OOM killer, not an error, ends the process)."""
    have = total_memory()
    if have is None:
        return
    func = mod["main"]
    if not isinstance(func.body, relax.SeqExpr):  # not normalised: `_check_supported` says so
        return
    held = sum(_type_bytes(p.ty) for p in func.params)  # inputs and weight parameters
    largest, name = 0, ""
    ret = func.body.body
    outputs = [f for f in (ret.fields if isinstance(ret, relax.Tuple) else [ret])
               if isinstance(f, relax.Var)]
    held += _type_bytes(ret.ty)
    constants: set[int] = set()  # each constant once, by its object (weights are shared)
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            for arg in [value, *(value.args if isinstance(value, relax.Call) else ())]:
                for c in (arg.fields if isinstance(arg, relax.Tuple) else [arg]):
                    if isinstance(c, _ConstBase) and c.__chandle__() not in constants:
                        constants.add(c.__chandle__())
                        held += _type_bytes(c.ty)
            size = _type_bytes(binding.var.ty)
            if not isinstance(value, _ConstBase) and size > largest \
                    and not any(binding.var.same_as(o) for o in outputs):
                largest, name = size, binding.var.name
    need = held + largest
    if need > have:
        raise ModelTooLargeError(
            f"the model needs at least {need / 2**30:.1f} GiB (its inputs, weights and outputs "
            f"{held / 2**30:.1f} GiB" + (f", its tensor {name!r} {largest / 2**30:.1f} GiB"
                                         if largest else "")
            + f"); this machine has {have / 2**30:.1f} GiB of memory")


def _type_bytes(ty: Any) -> int:
    """Bytes of a value of Relax type ``ty`` (a tensor or a tuple of them); 0 for a shape
    not known here (symbolic: refused later, by `_check_supported`)."""
    if isinstance(ty, relax.TupleType):
        return sum(_type_bytes(f) for f in ty.fields)
    dims = _static_dims(ty)
    if dims is None or ty.dtype is None or str(ty.dtype) in ("", "void"):
        return 0
    return int(np.prod(dims, dtype=object)) * tvm_ffi.dtype(str(ty.dtype)).itemsize


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@relax.expr_functor.mutator
class _SharedConstants(ModuleMutator):
    """Tensor constants of equal dtype, shape and bytes made one object. Exporters write a
    weight used in several places once per use (the zoo SRU's ONNX export: 30 matrices of
    4 MB, 3 distinct, unrolled over its time steps); as one constant it is one buffer in
    memory, one packed form, and stays in cache between its uses (the SRU ran 3.4 ms with
    the copies, 0.95 ms with them shared)."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.seen: dict[tuple, _ConstBase] = {}

    def visit_generic_const_(self, const: _ConstBase) -> relax.Expr:  # noqa: D102
        if not isinstance(const.ty, relax.TensorType):
            return const
        arr = const.value.numpy()
        if arr.nbytes < 1024:  # small constants: not worth hashing, nothing to share
            return const
        key = (str(arr.dtype), arr.shape, hashlib.blake2b(arr.tobytes(), digest_size=16).digest())
        return self.seen.setdefault(key, const)


@relax.expr_functor.mutator
class _SafeTake(ModuleMutator):
    """``relax.take`` in a mode that never reads out of bounds: TVM's "fast" mode reads an
    index out of range without a check (a segfault or a wrong answer, and a warning from TVM
    for every such kernel it builds, constant folding's included). paragraph refuses such
    inputs before a run (`paragraph.inputs.check_index_ranges`); the guard behind that check
    is "clip", or "wrap" where the indices are ONNX's Gather normalisation
    ``where(i < 0, i + n, i)`` of the axis's ``n`` entries: "wrap" reads the same entry for
    every i in [-n, n) and takes i as it is, so the normalisation, a kernel of its own in
    every run (the token-id encoder's only element-wise kernel), goes."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: D102
        call = self.visit_expr_post_order(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.take"):
            return call
        x, indices = call.args
        axis = call.attrs.axis
        shape = x.ty.shape if isinstance(x.ty, relax.TensorType) else None
        wrapped = None
        if shape is not None and len(shape) > 0 and (axis is not None or len(shape) == 1):
            dim = shape[int(axis) % len(shape)] if axis is not None else shape[0]
            if isinstance(dim, tvm.tirx.IntImm):  # not a symbolic dimension
                wrapped = self._normalised(indices, int(dim))
        if wrapped is not None:
            return relax.op.take(x, wrapped, axis, mode="wrap")
        if call.attrs.mode == "fast":
            return relax.op.take(x, indices, axis, mode="clip")
        return call

    def _bound(self, expr: relax.Expr, op: str) -> relax.Call | None:
        """The call of ``op`` that the variable ``expr`` is bound to, else None."""
        value = self.lookup_binding(expr) if isinstance(expr, relax.Var) else expr
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) \
                and value.op.name == op:
            return value
        return None

    def _normalised(self, indices: relax.Expr, extent: int) -> relax.Expr | None:
        """``i`` where ``indices`` is ``where(i < 0, i + extent, i)``, else None."""
        where = self._bound(indices, "relax.where")
        if where is None:
            return None
        cond, shifted, i = where.args
        less, add = self._bound(cond, "relax.less"), self._bound(shifted, "relax.add")
        if less is None or add is None or not less.args[0].same_as(i) \
                or _int_const(less.args[1]) != 0:
            return None
        a, b = add.args
        n = _int_const(b) if a.same_as(i) else _int_const(a) if b.same_as(i) else None
        return i if n == extent else None


def _int_const(expr: relax.Expr) -> int | None:
    """The value of a one-element integer constant, else None."""
    if not _is_constant(expr):
        return None
    arr = expr.value.numpy()
    if arr.size != 1 or arr.dtype.kind not in "iu":
        return None
    return int(arr.reshape(-1)[0])


# ---------------------------------------------------------------------------- constant folding
def _fold_constants(mod: tvm.IRModule) -> tvm.IRModule:
    """Fold constant subexpressions: common ops with numpy, anything else with FoldConstant.

    relax.transform.FoldConstant compiles and runs one kernel per distinct op signature it folds
    (about 20 s for the batch-norm constants of Inception-v3; 37 kernels for the Gather index
    normalisation of ViT-B/16), so the ops importers and batch-norm decomposition leave on
    weights are folded with numpy first, and FoldConstant folds what remains.
    """
    folder = _NumpyFolder(mod)
    mod = folder.transform()
    # FoldConstant also turns static shape computations into constants, which the numpy
    # folder leaves; with nothing left to compile it costs milliseconds
    return relax.transform.FoldConstant()(mod)


def _elementwise(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray | None]:
    """An arithmetic folder that leaves integer maths (TVM's rounding rules) to FoldConstant."""
    def fold(out: relax.TensorType, attrs: Any, *args: Any) -> np.ndarray | None:
        return fn(*args) if str(out.dtype).startswith(("float", "bfloat")) else None
    return fold


def _exact(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray | None]:
    """A folder for operations numpy computes exactly as TVM does in every dtype: comparisons,
    selection, and integer addition, subtraction and multiplication (both wrap around)."""
    def fold(out: relax.TensorType, attrs: Any, *args: Any) -> np.ndarray | None:
        if len({a.dtype for a in args if isinstance(a, np.ndarray) and a.dtype != bool}) > 1:
            return None  # mixed operand types: TVM's promotion rules, not numpy's
        return fn(*args)
    return fold


def _taken(out: relax.TensorType, attrs: Any, x: np.ndarray, idx: np.ndarray
           ) -> np.ndarray | None:
    mode = str(attrs.mode)
    if mode not in ("wrap", "clip") or attrs.axis is None:
        return None  # "fast" reads out of bounds where numpy would raise: TVM's to decide
    return np.take(x, idx, axis=int(attrs.axis), mode="wrap" if mode == "wrap" else "clip")


def _shape_tensor(out: relax.TensorType, attrs: Any, shape: tuple[int, ...]) -> np.ndarray:
    return np.array(shape, dtype=str(out.dtype))


def _reshaped(out: relax.TensorType, attrs: Any, x: np.ndarray, *rest: Any) -> np.ndarray:
    # reshape, expand_dims, squeeze, flatten only move dimensions: the output type has the shape.
    return x.reshape(_static_dims(out))


def _transposed(out: relax.TensorType, attrs: Any, x: np.ndarray) -> np.ndarray:
    axes = None if attrs.axes is None else [int(a) for a in attrs.axes]
    return np.ascontiguousarray(np.transpose(x, axes))


def _broadcast(out: relax.TensorType, attrs: Any, x: np.ndarray, *rest: Any) -> np.ndarray:
    dims = _static_dims(out)
    assert dims is not None  # folding only reaches static shapes
    return np.ascontiguousarray(np.broadcast_to(x, dims))


def _concatenated(out: relax.TensorType, attrs: Any, xs: list[np.ndarray]) -> np.ndarray | None:
    return None if attrs.axis is None else np.concatenate(xs, axis=int(attrs.axis))


def _cast(out: relax.TensorType, attrs: Any, x: np.ndarray) -> np.ndarray:
    return x  # _NumpyFolder casts every result to the output dtype


_NUMPY_FOLDERS: dict[str, Callable[..., np.ndarray | None]] = {
    "relax.reshape": _reshaped, "relax.expand_dims": _reshaped, "relax.squeeze": _reshaped,
    "relax.flatten": _reshaped, "relax.permute_dims": _transposed,
    "relax.broadcast_to": _broadcast, "relax.concat": _concatenated, "relax.astype": _cast,
    "relax.add": _exact(np.add), "relax.subtract": _exact(np.subtract),
    "relax.multiply": _exact(np.multiply), "relax.divide": _elementwise(np.divide),
    "relax.power": _elementwise(np.power), "relax.maximum": _elementwise(np.maximum),
    "relax.minimum": _elementwise(np.minimum), "relax.sqrt": _elementwise(np.sqrt),
    "relax.rsqrt": _elementwise(lambda x: 1 / np.sqrt(x)), "relax.exp": _elementwise(np.exp),
    "relax.negative": _elementwise(np.negative),
    # exact in every dtype: the index normalisation of Gather (ViT, Swin: 37 of them, each a
    # kernel FoldConstant compiled) is integer `where(less(i, 0), add(i, n), i)` on constants
    "relax.less": _exact(np.less), "relax.less_equal": _exact(np.less_equal),
    "relax.greater": _exact(np.greater), "relax.greater_equal": _exact(np.greater_equal),
    "relax.equal": _exact(np.equal), "relax.not_equal": _exact(np.not_equal),
    "relax.where": _exact(np.where),
    "relax.take": _taken, "relax.shape_to_tensor": _shape_tensor,
}


def _static_dims(ty: Any) -> tuple[int, ...] | None:
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    dims = list(ty.shape.values)
    if not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return tuple(int(d.value) for d in dims)


@relax.expr_functor.mutator
class _NumpyFolder(ModuleMutator):
    """Replaces calls of `_NUMPY_FOLDERS` ops on constants by their value, computed with numpy.

    Counts the constant calls it could not fold in ``left_over`` (for FoldConstant).
    """

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.left_over = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not isinstance(call.op, tvm.ir.Op):
            return call
        if call.op.name == "relax.shape_of":  # a static shape is a constant
            dims = _static_dims(call.args[0].ty)
            return call if dims is None else relax.ShapeExpr(list(dims))
        resolved = [self.resolve(a) for a in call.args]
        if not all(_is_constant(a) for a in resolved):
            return call  # checked before converting so that weights are not copied for nothing
        args = [_constant_value(a) for a in resolved]
        folded = self.fold_call(call, args)
        if folded is None:
            if any(isinstance(a, (np.ndarray, list)) for a in args):
                self.left_over += 1
            return call
        return folded

    def fold_call(self, call: relax.Call, args: list[Any]) -> relax.Constant | None:
        folder = _NUMPY_FOLDERS.get(call.op.name)
        out = call.ty
        dims = _static_dims(out)
        if folder is None or dims is None:
            return None
        with np.errstate(all="ignore"):  # inf/nan are legitimate folded values
            value = folder(out, call.attrs, *args)
        if value is None or value.shape != dims:
            return None
        return relax.const(np.asarray(value, dtype=str(out.dtype)), str(out.dtype))

    def resolve(self, arg: relax.Expr) -> relax.Expr:
        """The value a dataflow variable is bound to (constants are bound, not inlined, here)."""
        if isinstance(arg, relax.Var):
            bound = self.lookup_binding(arg)
            return arg if bound is None else bound
        if isinstance(arg, relax.Tuple):
            return relax.Tuple([self.resolve(f) for f in arg.fields])
        return arg


def _is_constant(arg: relax.Expr) -> bool:
    if isinstance(arg, relax.Tuple):
        return all(_is_constant(f) for f in arg.fields)
    if isinstance(arg, relax.ShapeExpr):
        return all(isinstance(d, tvm.tirx.IntImm) for d in arg.values)
    return isinstance(arg, _ConstBase) and isinstance(arg.ty, relax.TensorType)


def _constant_value(arg: relax.Expr) -> Any:
    """A constant argument as a numpy array, a shape tuple or a list of arrays (a tuple)."""
    if isinstance(arg, relax.Tuple):
        return [_constant_value(f) for f in arg.fields]
    if isinstance(arg, relax.ShapeExpr):
        return tuple(int(d.value) for d in arg.values)
    return arg.value.numpy()
