"""What a class or function of the source declares about the GPUs it runs on, as gate Points.

    @supported_compute_capability([100, 103, 107])      -> arch list: refused outside 100, 103, 107
    def _trtllm_gemm_fp4_requirement(...): ...
    @backend_requirement({"trtllm": _trtllm_gemm_fp4_requirement, ...})
    def mm_fp4(..., backend): ...                        -> the same, only when backend is "trtllm"
    class TrtLlmNvFp4Experts:
        def _supports_current_device(): ...              -> support predicate: refused where false
    class Fp8Config:
        def get_min_capability(cls): return 89           -> floor: refused below 8.9

Which decorator and method names mean this is profile data (engines/sources/*.yaml).
"""
from __future__ import annotations

import ast
from typing import Callable

from moelab.audit.profile import Profile
from moelab.audit.refs import norm
from moelab.audit.source import SourceIndex, Symbol, last_name, lookup
from moelab.audit.values import U, ClassRef, Fn, Frame
from moelab.audit.walk import Cond, Point, Pred


class Declarations:
    def __init__(self, index: SourceIndex, profiles: list[Profile], evaluator: Callable) -> None:
        self.index, self.evaluator = index, evaluator
        self.arch_lists = {n for p in profiles for n in p.arch_lists}
        self.links = {n for p in profiles for n in p.requirement_links}
        self.support = [m for p in profiles for m in p.support_methods]
        self.cap_preds = [m for p in profiles for m in p.capability_predicates]
        self.floors = [m for p in profiles for m in p.min_capability]

    def class_points(self, cls: Symbol) -> list[Point]:
        """Support predicates of a class: `_supports_current_device()`, `supports_compute_capability(c)`."""
        out = []
        for name in self.support + self.cap_preds:
            m = lookup(self.index, cls, name)
            if m is None or not isinstance(m.node, ast.FunctionDef):
                continue
            with_cap = name in self.cap_preds

            def fn(ev, _sel, m=m, with_cap=with_cap):
                ev.touched += with_cap  # handed the capability: its answer is about the arch
                return ev.invoke(Fn(m, this=ClassRef(cls)), (ev.cap,) if with_cap else (), {})
            pred = Pred(f"{cls.node.name}.{name}()", fn, _return_leaves(m))
            out.append(Point("support", m.module, m.node, (Cond(pred, False),),
                             f"{cls.node.name}.{name}() decides", f"{cls.node.name}.{name}"))
        return out

    def decorator_points(self, sym: Symbol) -> list[Point]:
        """`@supported_compute_capability([100, 103])` on a function, or on the checks that
        `@backend_requirement({...}, common_check=...)` names."""
        out = []
        for d in getattr(sym.node, "decorator_list", []):
            if not isinstance(d, ast.Call):
                continue
            dname = last_name(d.func)
            if dname in self.arch_lists:
                ccs = self._ints(d.args[0], sym) if d.args else None
                if ccs:
                    out.append(Point("arch_list", sym.module, d, (Cond(_in_list(ccs), False),),
                                     f"{sym.node.name} runs on compute capability {ccs}", sym.node.name))
            elif dname in self.links:
                checks = {}
                if d.args and isinstance(d.args[0], ast.Dict):
                    checks = {k.value: v for k, v in zip(d.args[0].keys, d.args[0].values)
                              if isinstance(k, ast.Constant) and isinstance(k.value, str)}
                common = next((k.value for k in d.keywords if k.arg == "common_check"), None)
                for label, check in [*checks.items(), ("", common)]:
                    if check is None:
                        continue
                    t = self.index.resolve(sym.module.name, check.id) if isinstance(check, ast.Name) else None
                    if t is not None and isinstance(t.node, ast.FunctionDef):
                        for q in self.decorator_points(t):
                            if label:  # only for the backend whose key this is
                                q = Point(q.kind, q.module, q.node, (Cond(_for_backend(label, sym), True), *q.conds),
                                          f"{sym.node.name}(backend={label!r}): {q.message}", q.owner)
                            out.append(q)
        return out

    def _ints(self, e: ast.expr, sym: Symbol) -> list[int] | None:
        ev = self.evaluator(None, "sm_90")
        v = ev.value(e, Frame(sym.module))
        if isinstance(v, (list, tuple, set, frozenset)) and v and all(isinstance(x, int) for x in v):
            return sorted(v)
        return None

    def floor_points(self, cls: Symbol) -> list[Point]:
        out = []
        for name in self.floors:
            m = lookup(self.index, cls, name)
            if m is None or not isinstance(m.node, ast.FunctionDef):
                continue

            def fn(ev, _sel, m=m):
                low = ev.invoke(Fn(m, this=ClassRef(cls)), (), {})
                if not isinstance(low, int):
                    return U
                ev.touched += 1
                return ev.cap.to_int() >= low
            low = self.evaluator(None, "sm_90").invoke(Fn(m, this=ClassRef(cls)), (), {})
            out.append(Point("floor", m.module, m.node, (Cond(Pred(f"{cls.node.name}.{name}()", fn), False),),
                             f"{cls.node.name}.{name}() = {low if isinstance(low, int) else '?'}: refused on a "
                             "GPU below it", f"{cls.node.name}.{name}"))
        return out


def _in_list(ccs: list[int]) -> Pred:
    def fn(ev, _sel):
        ev.touched += 1
        return ev.cap.to_int() in ccs
    return Pred(f"capability in {ccs}", fn)


def _for_backend(label: str, sym: Symbol) -> Pred:
    """True when the selected value is this check's backend: "cudnn" for flashinfer_cudnn."""
    lib = sym.module.name.split(".")[0]

    def fn(_ev, sel):
        if sel is None:
            return U
        def bare(x: str) -> str:
            return norm(x).replace("_", "")
        v = bare(sel[1])
        return v == bare(label) or v == bare(lib) + bare(label)
    return Pred(f"backend {label!r}", fn)


def _return_leaves(m: Symbol) -> tuple:
    body = [s for s in m.node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    ret = body[-1].value if body and isinstance(body[-1], ast.Return) else None
    return (ret,) if ret is not None else ()
