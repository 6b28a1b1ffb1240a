"""One function's refusals and calls, each with the conditions on the path that reaches it.

Walking a body in order, every `raise` and `assert` becomes a Point whose conditions are the
`if` tests around it (with their polarity), and an early exit counts for what follows it:

    def check(view):
        if view.quantization != "nvfp4_online":
            return {}                                      # after this: quantization == nvfp4_online
        if not get_platform().is_sm100:
            raise ValueError("... SM100/SM103 GPUs.")      # Point(conds=[not (quant != ...),
                                                           #              not get_platform().is_sm100])

Calls are kept the same way, so a refusal inside a function called only when a backend is
selected inherits that selection. Local variables are kept as the expressions assigned to
them (`major, minor = torch.cuda.get_device_capability()`), evaluated only when needed.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any, Callable

from moelab.audit.values import Frame, Lazy
from moelab.audit.source import Module, Symbol, import_map, last_name


@dataclass(eq=False)  # hashed by identity: one scope per walked function
class Scope:
    """A function's module, own imports, aliases and local assignments (in walk order)."""

    module: Module
    func: ast.AST | None
    cls: Symbol | None
    imports: dict
    aliases: dict
    assigns: list[tuple[str, ast.expr, int | None]] = field(default_factory=list)

    def frame(self, upto: int) -> Frame:
        """The locals visible after the first `upto` assignments, bound lazily."""
        frame = Frame(self.module, self.imports, {}, self.cls, self.aliases)
        for name, expr, item in self.assigns[:upto]:
            frame.locals[name] = Lazy(expr, frame.child(), item)  # sees what was bound before it
        return frame


@dataclass(frozen=True)
class Pred:
    """A condition the source states as a function rather than an `if` test: an experts class's
    `_supports_current_device()`, a `@supported_compute_capability([100, 103])` list."""

    text: str
    fn: Callable[[Any, tuple[str, str] | None], Any]  # (evaluator, selection) -> value
    leaves: tuple = ()  # (expr, frame) pairs worth naming when the value is unknown


@dataclass(frozen=True)
class Cond:
    test: ast.expr | Pred
    positive: bool
    scope: Scope | None = None
    upto: int = 0
    # `not C` after `if C: raise ...`: the launch got past an earlier refusal; unknown counts as passed
    past_refusal: bool = False


@dataclass
class Point:
    """A place where the engine refuses: raise, assert, or a support predicate that says no."""

    kind: str  # raise | assert | support | floor | arch_list
    module: Module
    node: ast.AST
    conds: tuple[Cond, ...]
    message: str | None = None
    owner: str = ""  # Class.function the point is in

    @property
    def where(self) -> str:
        return self.module.where(self.node)


@dataclass(frozen=True)
class Site:
    """A call (or a class named in a `return`) with the conditions under which it happens."""

    node: ast.expr
    conds: tuple[Cond, ...]
    scope: Scope


@dataclass
class Body:
    scope: Scope
    points: list[Point] = field(default_factory=list)
    sites: list[Site] = field(default_factory=list)


def functions(module: Module):
    """(function node, enclosing class symbol or None) for every def in a module, nested too."""
    def visit(body, cls):
        for n in body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield n, cls
                yield from visit(n.body, None)
            elif isinstance(n, ast.ClassDef):
                yield from visit(n.body, Symbol(module, n))
            elif isinstance(n, (ast.If, ast.Try)):
                yield from visit(n.body, cls)
                yield from visit(getattr(n, "orelse", []), cls)
    yield from visit(module.tree.body, None)


def message_of(node: ast.AST) -> str | None:
    """The literal text of a raise or assert message (f-string parts joined)."""
    msg = node.msg if isinstance(node, ast.Assert) else (node.exc.args[0] if isinstance(node.exc, ast.Call)
                                                           and node.exc.args else None)
    parts = []
    for n in ast.walk(msg) if msg is not None else []:
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            parts.append(n.value)
        elif isinstance(n, ast.FormattedValue):
            parts.append("{...}")
    text = " ".join("".join(parts).split())
    return text[:300] or None


def walk(fn: ast.AST, module: Module, cls: Symbol | None, flag_of: Callable[[ast.expr, dict], str | None],
         arch_major_calls: dict[str, str] | None = None,
         annotated: Callable[[ast.expr | None], str | None] = lambda a: None) -> Body:
    imports, _ = import_map([fn], module.name, module.is_package)
    # parameters that hold a flag: `backend: Fp8GemmRunnerBackend`
    args = getattr(fn, "args", None)
    aliases: dict[str, str] = {a.arg: f for a in (args.args + args.kwonlyargs if args else [])
                               if (f := annotated(a.annotation))}
    scope = Scope(module, fn, cls, imports, aliases)
    body = Body(scope)
    owner = ".".join(n for n in (cls.node.name if cls else "", getattr(fn, "name", "")) if n)
    majors = arch_major_calls or {}

    def cond(test: ast.expr, positive: bool, past_refusal: bool = False) -> Cond:
        return Cond(test, positive, scope, len(scope.assigns), past_refusal)

    def sites(expr: ast.AST, conds: tuple) -> None:
        for n in ast.walk(expr):
            if isinstance(n, ast.Call):
                body.sites.append(Site(n, conds, scope))
                name = last_name(n.func)
                if name in majors:
                    kw = next((k.value for k in n.keywords if k.arg == majors[name]), None)
                    got = [e.value for e in getattr(kw, "elts", []) if isinstance(e, ast.Constant)]
                    if got and all(isinstance(v, int) for v in got):
                        body.points.append(Point("arch_list", module, n, (*conds, Cond(_majors(got), False)),
                                                 f"built only for compute capability {'.x, '.join(map(str, got))}.x",
                                                 owner))

    def assign(target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, ast.Name):
            scope.assigns.append((target.id, value, None))
            flag = flag_of(value, aliases)
            if flag:
                aliases[target.id] = flag
        elif isinstance(target, (ast.Tuple, ast.List)):
            for i, t in enumerate(target.elts):
                if isinstance(t, ast.Name):
                    if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
                        scope.assigns.append((t.id, value.elts[i], None))
                    else:
                        scope.assigns.append((t.id, value, i))

    def block(stmts, conds: tuple) -> str | None:
        """Walk a statement list: "raise" or "leave" (return/continue/break) when it always
        ends that way, None when it can fall through."""
        for s in stmts:
            if isinstance(s, ast.If):
                left_body = block(s.body, (*conds, cond(s.test, True)))
                left_else = block(s.orelse, (*conds, cond(s.test, False)))
                if left_body and left_else:
                    return "raise" if left_body == left_else == "raise" else "leave"
                if left_body:
                    conds = (*conds, cond(s.test, False, left_body == "raise"))
                elif left_else:
                    conds = (*conds, cond(s.test, True, left_else == "raise"))
            elif isinstance(s, ast.Raise):
                if s.exc is not None:
                    sites(s.exc, conds)
                    body.points.append(Point("raise", module, s, conds, message_of(s), owner))
                return "raise"
            elif isinstance(s, ast.Assert):
                body.points.append(Point("assert", module, s, (*conds, cond(s.test, False)), message_of(s), owner))
                conds = (*conds, cond(s.test, True, True))
            elif isinstance(s, ast.Return):
                if s.value is not None:
                    sites(s.value, conds)
                    for n in ast.walk(s.value):  # `return [TrtLlmNvFp4Experts, ...]`: classes named
                        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                            body.sites.append(Site(n, conds, scope))
                return "leave"
            elif isinstance(s, (ast.Continue, ast.Break)):
                return "leave"
            elif isinstance(s, (ast.Assign, ast.AnnAssign)):
                if s.value is not None:
                    sites(s.value, conds)
                    for t in s.targets if isinstance(s, ast.Assign) else [s.target]:
                        assign(t, s.value)
            elif isinstance(s, (ast.Expr, ast.AugAssign)):
                sites(s.value, conds)
            elif isinstance(s, (ast.With, ast.AsyncWith)):
                for item in s.items:
                    sites(item.context_expr, conds)
                left = block(s.body, conds)
                if left:
                    return left
            elif isinstance(s, ast.Try):
                left = block([*s.body, *s.orelse], conds)
                if left:
                    return left
                block(s.finalbody, conds)
            elif isinstance(s, (ast.For, ast.AsyncFor)):
                sites(s.iter, conds)
                block(s.body, conds)
            elif isinstance(s, ast.While):
                block(s.body, (*conds, cond(s.test, True)))
        return None

    block(getattr(fn, "body", []), ())
    return body


def _majors(majors: list[int]) -> Pred:
    def fn(ev, _sel):
        ev.touched += 1
        return ev.cap.major in majors
    return Pred(f"major in {majors}", fn)
