"""The value domain of the audit's evaluator: UNKNOWN, the GPU capability, what a name can mean.

Python values stand for themselves; `U` (UNKNOWN) is anything the audit cannot know (a model's
config, an environment variable). `Cap` is the GPU's compute capability and compares like the
tuple torch returns, so `Cap(12, 0) >= (10, 0)` and `Cap(12, 0)[0] == 12` hold. Comparisons and
`in` follow Kleene's logic: `U in [9, 10]` is U, `10 in [U, 10]` is True.
"""
from __future__ import annotations

import ast
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from moelab.audit.source import Module, Symbol

class _Unknown:
    _inst = None

    def __new__(cls):
        if cls._inst is None:
            cls._inst = super().__new__(cls)
        return cls._inst

    def __repr__(self) -> str:
        return "UNKNOWN"


U = _Unknown()


class Cap(NamedTuple):
    """The GPU's compute capability; compares like the (major, minor) tuple torch returns."""

    major: int
    minor: int

    def to_int(self) -> int:
        return self.major * 10 + self.minor

    @property
    def name(self) -> str:
        return f"sm_{self.to_int()}"


ARCHS = {c.name: c for c in (Cap(8, 0), Cap(8, 9), Cap(9, 0), Cap(10, 0), Cap(10, 3), Cap(12, 0), Cap(12, 1))}

# A current CUDA machine with the engine's dependencies installed (the audit's question is the
# arch, not the toolkit, the vendor or a missing package).
ASSUMED_CALLS = {"is_cuda": True, "is_cuda_alike": True, "is_hip": False, "is_rocm": False, "is_npu": False,
                 "is_xpu": False, "is_cpu": False, "is_musa": False, "is_mps": False, "is_tpu": False,
                 "is_hpu": False, "is_out_of_tree": False, "is_available": True}
ASSUMED_VALUES = {"torch.version.cuda": "13.0", "torch.version.hip": None}
RAISES = object()  # a path that ends in `raise`: it has no value
BUILTINS = {"len": len, "int": int, "str": str, "tuple": tuple, "list": list, "set": set, "frozenset": frozenset,
             "bool": bool, "min": min, "max": max, "any": any, "all": all, "abs": abs, "sorted": sorted,
             "map": lambda f, xs: [f(x) for x in xs]}
STR_METHODS = {"split", "startswith", "endswith", "strip", "lower", "upper", "replace", "isdigit", "partition"}
TYPES = {"tuple": tuple, "int": int, "str": str, "list": list, "dict": dict, "float": float, "bool": bool}
_CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
        ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not}
BINARY_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod, ast.Div: operator.truediv}

@dataclass(frozen=True)
class Fn:
    """A function of the source, maybe with bound arguments (functools.partial) or a receiver."""

    sym: Symbol
    args: tuple = ()
    kwargs: tuple = ()
    this: Any = None  # bound self/cls


@dataclass(frozen=True)
class ClassRef:
    sym: Symbol


@dataclass(frozen=True)
class ModRef:
    module: Module


@dataclass(frozen=True)
class Facts:
    """The object an accessor returns (SGLang's get_platform()); its attributes are probes."""

    table: Any  # profile.FactTable


@dataclass
class Lazy:
    """A local variable bound to an expression, evaluated when read."""

    expr: ast.expr
    frame: "Frame"
    item: int | None = None  # the i-th element of a tuple assignment


@dataclass
class Frame:
    module: Module
    imports: dict = field(default_factory=dict)  # a function's own imports
    locals: dict = field(default_factory=dict)
    cls: Symbol | None = None
    aliases: dict = field(default_factory=dict)  # local name -> the flag it holds (refs.References)

    def child(self) -> "Frame":
        return Frame(self.module, self.imports, dict(self.locals), self.cls, self.aliases)


def truth(v) -> bool | _Unknown:
    if v is U:
        return U
    if isinstance(v, (Fn, ClassRef, ModRef, Facts, Cap)):
        return True
    try:
        return bool(v)
    except Exception:
        return U


def dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None



@dataclass(frozen=True)
class Bound:
    fn: Callable[[], Any]


@dataclass(frozen=True, eq=False)
class DictGet:
    d: dict


def probes_a_package(name: str) -> bool:
    """has_deep_gemm(), is_flashinfer_available(): the audit asks about a full installation."""
    if "capab" in name or "device" in name:
        return False
    return name.startswith("has_") or name.startswith("is_") and name.endswith("_available")


def assign(target: ast.expr, value: ast.expr, frame: Frame) -> None:
    if isinstance(target, ast.Name):
        frame.locals[target.id] = Lazy(value, frame.child())
    elif isinstance(target, (ast.Tuple, ast.List)):
        snapshot = frame.child()
        for i, t in enumerate(target.elts):
            if isinstance(t, ast.Name):
                if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
                    frame.locals[t.id] = Lazy(value.elts[i], snapshot)
                else:
                    frame.locals[t.id] = Lazy(value, snapshot, item=i)


def merge(a, b):
    if a is RAISES:
        return b
    if b is RAISES:
        return a
    return a if same(a, b) else U


def same(a, b) -> bool:
    if a is U or b is U:
        return False
    try:
        return type(a) is type(b) and a == b
    except Exception:
        return False


def hashable(v) -> bool:
    try:
        hash(v)
        return True
    except TypeError:
        return False


def compare(op: ast.cmpop, a, b):
    if isinstance(op, (ast.Is, ast.IsNot)) and (a is None or b is None) and (a is not U and b is not U):
        same = a is b
        return same if isinstance(op, ast.Is) else not same
    if isinstance(op, (ast.In, ast.NotIn)):
        if a is U or b is U or not isinstance(b, (tuple, list, set, frozenset, dict, str)):
            return U
        if isinstance(b, str):
            r = a in b if isinstance(a, str) else U
        else:
            items = list(b)
            hit = any(x is not U and _same_num(a, x) for x in items)
            r = True if hit else (U if any(x is U for x in items) else False)
        return r if r is U or isinstance(op, ast.In) else not r
    if a is U or b is U:
        return U
    if isinstance(a, (Fn, ClassRef, ModRef, Facts)) or isinstance(b, (Fn, ClassRef, ModRef, Facts)):
        return U
    try:
        return bool(_CMP[type(op)](a, b))
    except Exception:
        return U


def _same_num(a, b) -> bool:
    try:
        return a == b
    except Exception:
        return False

