"""What a parametric rule is, and the registry its declarations fill.

A rule's schema is a `ParametricRule` subclass that carries its library description as class
data (``SCHEMA = Schema(...)``, registered when the class is defined); each rule paragraph
ships is one instance of a schema (id, name, paper, parameters), registered by a `ship`
decorator on the class. `paragraph.rules.parametric` derives ``SCHEMAS``, ``DESCRIPTIONS``
and ``all_parametric()`` from this registry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, TypeVar

import numpy as np

from paragraph.graph import Graph
from paragraph.rules.axioms import Hypothesis
from paragraph.rules.match import Match
from paragraph.rules.specs import Term

# a proof obligation: its description, lhs[i] == rhs[i] for all i, under the hypotheses
Obligation = tuple[str, list[Term], list[Term], tuple[Hypothesis, ...]]
R = TypeVar("R", bound="ParametricRule")


@dataclass(frozen=True)
class Schema:
    """A schema's name and its description in the library: what it matches (``source``),
    what it builds (``target``), under which ``constraints``, and which of its values replace
    which (``outputs``)."""

    name: str
    source: str
    target: str
    constraints: tuple[str, ...]
    outputs: str

    def description(self) -> dict[str, Any]:
        """The description as a library entry writes it (``DESCRIPTIONS[name]``)."""
        return {"source": self.source, "target": self.target,
                "constraints": list(self.constraints), "outputs": self.outputs}


# the registry: schema classes by name in the order they were defined, shipped rules by
# their position in `shipped`
_SCHEMAS: dict[str, type[ParametricRule]] = {}
_SHIPPED: dict[int, ParametricRule] = {}


@dataclass(frozen=True)
class ParametricRule:
    """Base class: id, name, the paper it implements; subclasses find, rewrite, prove.

    A subclass that sets ``SCHEMA`` is a schema and joins the registry as it is defined."""

    id: str
    name: str
    paper: str
    schema: str

    origin = "parametric"
    SCHEMA: ClassVar[Schema]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "SCHEMA" not in cls.__dict__:
            return
        name = cls.SCHEMA.name
        if name in _SCHEMAS:
            raise ValueError(f"schema {name!r} declared twice: {_SCHEMAS[name].__qualname__} "
                             f"and {cls.__qualname__}")
        _SCHEMAS[name] = cls

    def find(self, graph: Graph) -> list[Match]:
        raise NotImplementedError

    def rewrite(self, graph: Graph, match: Match) -> Graph | None:
        raise NotImplementedError

    def obligations(self) -> list[Obligation]:
        raise NotImplementedError

    def hint(self) -> tuple[str, ...]:
        """Axioms z3 tries first (a small set proves faster and more surely than all)."""
        return ()

    def example(self, rng: np.random.Generator) -> Graph:
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        return {}


def ship(position: int, rule_id: str, name: str, paper: str,
         **params: Any) -> Callable[[type[R]], type[R]]:
    """Class decorator: paragraph ships the rule ``rule_id`` of this schema with ``params``.

    ``position`` is the rule's place in ``all_parametric()``, which is the order of the
    library file and the order a search tries the rules in: a new rule takes the next free
    one, so that no shipped rule moves. Duplicate ids or positions raise at import."""
    def deco(cls: type[R]) -> type[R]:
        if "SCHEMA" not in cls.__dict__:
            raise TypeError(f"{cls.__qualname__} ships {rule_id!r} but declares no SCHEMA")
        if position in _SHIPPED:
            raise ValueError(f"{rule_id!r} and {_SHIPPED[position].id!r} both at position "
                             f"{position}")
        if any(r.id == rule_id for r in _SHIPPED.values()):
            raise ValueError(f"rule id {rule_id!r} shipped twice")
        _SHIPPED[position] = cls(rule_id, name, paper, cls.SCHEMA.name, **params)
        return cls
    return deco


def shipped() -> list[ParametricRule]:
    """Every shipped rule, by position (which must run 0, 1, ... without a gap)."""
    order = sorted(_SHIPPED)
    if order != list(range(len(order))):
        raise ValueError(f"shipped rules must take positions 0..{len(order) - 1}, got {order}")
    return [_SHIPPED[p] for p in order]


def schemas(families: Sequence[ModuleType]) -> dict[str, type[ParametricRule]]:
    """Every schema by name: the families' in the order given, each family's in the order
    its module defines them. A schema outside these families raises."""
    names = [f.__name__ for f in families]
    strays = [c.__qualname__ for c in _SCHEMAS.values() if c.__module__ not in names]
    if strays:
        raise ValueError(f"schemas {strays} belong to no family in {names}")
    return {n: c for f in names for n, c in _SCHEMAS.items() if c.__module__ == f}
