"""Evaluate a piece of engine source for one GPU architecture, without running it.

A small abstract interpreter over `ast`: the GPU capability is known (the arch under audit),
the toolkit is a current CUDA one, and everything else (model, environment variables, other
flags) is UNKNOWN. Booleans follow Kleene's three-valued logic, so `is_sm100 and kv == "fp8"`
is False on sm_90 and UNKNOWN on sm_100. Helpers are followed into their bodies a few calls
deep (`is_sm100_supported = lru_cache(...)(partial(_check_cuda_device_version, [10], ...))`
becomes `get_device_sm() // 10 in [10] and <cuda version> >= (12, 8)`).

    ev = Evaluator(index, profiles, ARCHS["sm_120"])
    ev.truth(ev.expr(ast.parse("torch.cuda.get_device_capability()[0] >= 10", mode="eval").body, frame))
    # -> True, and ev.touched > 0: the answer depended on the arch.
"""
from __future__ import annotations

import ast
from typing import Any, Callable

from moelab.audit.profile import Profile
from moelab.audit.source import SourceIndex, Symbol, import_map, last_name, lookup
from moelab.audit.values import (
    ASSUMED_CALLS, ASSUMED_VALUES, BINARY_OPS, BUILTINS, RAISES, STR_METHODS, TYPES, U, assign, Bound, Cap,
    ClassRef, compare, DictGet, dotted, Facts, Fn, Frame, hashable, Lazy, merge, ModRef, probes_a_package,
    same, truth,
)

MAX_DEPTH = 5  # helper calls followed into their bodies
MAX_STEPS = 4000  # statements interpreted for one top-level evaluation


class Evaluator:
    """Values of expressions for one arch. `hook(node, frame)` may answer a node first (the
    backend selection under audit); `touched` counts the reads of the GPU capability."""

    def __init__(self, index: SourceIndex, profiles: list[Profile], cap: Cap,
                 hook: Callable[[ast.AST, Frame], Any] | None = None) -> None:
        self.index, self.cap, self.hook = index, cap, hook
        self.touched = 0
        self.steps = 0
        self.depth = 0
        self._memo: dict = {}
        self._values: dict = {}
        self.cap_calls = {"get_device_capability", "get_device_properties"}
        self.int_calls: set[str] = set()
        self.cap_types: set[str] = set()
        self.assumed = dict(ASSUMED_CALLS)
        self.receivers: dict[str, str] = {}
        self.facts: dict[str, Any] = {}
        for p in profiles:
            self.cap_calls |= set(p.capability)
            self.int_calls |= set(p.capability_int)
            self.cap_types |= set(p.capability_types)
            self.assumed.update(p.assume)
            self.receivers.update(p.receivers)
            self.facts.update({f.accessor: f for f in p.facts})

    # -- entry points --------------------------------------------------------------------------
    def value(self, node: ast.AST, frame: Frame):
        self.steps = 0
        return self.expr(node, frame)

    # -- expressions ---------------------------------------------------------------------------
    def expr(self, node: ast.AST, frame: Frame):  # noqa: C901 (one dispatch over node types)
        if self.hook is not None:
            hit = self.hook(node, frame)
            if hit is not None:
                return hit
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self.name(node.id, frame)
        if isinstance(node, ast.Attribute):
            return self.attribute(node, frame)
        if isinstance(node, ast.Call):
            return self.call(node, frame)
        if isinstance(node, ast.BoolOp):
            return self.boolop(node, frame)
        if isinstance(node, ast.UnaryOp):
            v = self.expr(node.operand, frame)
            if isinstance(node.op, ast.Not):
                t = truth(v)
                return U if t is U else not t
            if isinstance(node.op, ast.USub) and isinstance(v, (int, float)):
                return -v
            return U
        if isinstance(node, ast.Compare):
            return self.compare(node, frame)
        if isinstance(node, ast.BinOp):
            a, b = self.expr(node.left, frame), self.expr(node.right, frame)
            op = BINARY_OPS.get(type(node.op))
            if op is None or a is U or b is U:
                return U
            try:
                return op(a, b)
            except Exception:
                return U
        if isinstance(node, ast.IfExp):
            t = truth(self.expr(node.test, frame))
            if t is U:
                a, b = self.expr(node.body, frame), self.expr(node.orelse, frame)
                return a if same(a, b) else U
            return self.expr(node.body if t else node.orelse, frame)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            vals = [self.expr(e, frame) for e in node.elts if not isinstance(e, ast.Starred)]
            if any(isinstance(e, ast.Starred) for e in node.elts):
                return U
            return tuple(vals) if isinstance(node, ast.Tuple) else vals if isinstance(node, ast.List) else \
                (frozenset(vals) if all(hashable(v) for v in vals) else vals)
        if isinstance(node, ast.Dict):
            out = {}
            for k, v in zip(node.keys, node.values):
                kv = self.expr(k, frame) if k is not None else U
                if kv is U or not hashable(kv):
                    return U
                out[kv] = self.expr(v, frame)
            return out
        if isinstance(node, ast.Subscript):
            base, idx = self.expr(node.value, frame), self.expr(node.slice, frame)
            if base is U or idx is U:
                return U
            try:
                return base[idx]
            except Exception:
                return U
        if isinstance(node, ast.Slice):
            parts = [self.expr(p, frame) if p is not None else None for p in (node.lower, node.upper, node.step)]
            return U if any(p is U for p in parts) else slice(*parts)
        if isinstance(node, ast.NamedExpr):
            return self.expr(node.value, frame)
        return U

    def boolop(self, node: ast.BoolOp, frame: Frame):
        is_and = isinstance(node.op, ast.And)
        result, unknown = None, False
        for e in node.values:
            v = self.expr(e, frame)
            t = truth(v)
            if t is U:
                unknown = True
                continue
            if t is (not is_and):  # a False in `and`, a True in `or`, decides
                return v
            result = v
        return U if unknown else result

    def compare(self, node: ast.Compare, frame: Frame):
        left = self.expr(node.left, frame)
        out = True
        for op, right_node in zip(node.ops, node.comparators):
            right = self.expr(right_node, frame)
            r = compare(op, left, right)
            if r is U:
                out = U
            elif not r:
                return False
            left = right
        return out

    def name(self, name: str, frame: Frame):
        if name in frame.locals:
            v = frame.locals[name]
            if isinstance(v, Lazy):
                v = self.expr(v.expr, v.frame)
                if v is not U and (lz := frame.locals[name]).item is not None:
                    try:
                        v = v[lz.item]
                    except Exception:
                        v = U
            return v
        if name in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[name]
        if name in self.receivers:
            sym = self.index.resolve_dotted(self.receivers[name])
            return ClassRef(sym) if sym is not None and isinstance(sym.node, ast.ClassDef) else U
        sym = self.index.resolve(frame.module.name, name, frame.imports)
        if sym is None:
            return BUILTINS.get(name, U)
        return self.symbol(sym)

    def symbol(self, sym: Symbol):
        node = sym.node
        if node is None:
            return ModRef(sym.module)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return Fn(sym)
        if isinstance(node, ast.ClassDef):
            return ClassRef(sym)
        key = (sym.module.name, id(node))
        if key not in self._values:  # a module-level value, evaluated once per arch
            self._values[key] = U  # (guards against a value defined in terms of itself)
            self._values[key] = self.expr(node, Frame(sym.module))
        return self._values[key]

    def attribute(self, node: ast.Attribute, frame: Frame):
        d = dotted(node)
        if d in ASSUMED_VALUES:
            return ASSUMED_VALUES[d]
        obj = self.expr(node.value, frame)
        if obj is U:
            return U
        if isinstance(obj, Cap):
            if node.attr in ("major", "minor"):
                self.touched += 1
                return getattr(obj, node.attr)
            if node.attr == "to_int":
                return Bound(obj.to_int)
            return U
        if isinstance(obj, ModRef):
            sym = self.index.resolve(obj.module.name, node.attr)
            return self.symbol(sym) if sym is not None else U
        if isinstance(obj, ClassRef):
            sym = lookup(self.index, obj.sym, node.attr)
            if sym is None:
                return U
            v = self.symbol(sym)
            return Fn(v.sym, this=obj) if isinstance(v, Fn) else v
        if isinstance(obj, Facts):
            return self.fact(obj.table, node.attr)
        if isinstance(obj, str) and node.attr in STR_METHODS:
            return Bound(lambda *a: getattr(obj, node.attr)(*a))
        if isinstance(obj, dict) and node.attr == "get":
            return DictGet(obj)
        return U

    def fact(self, table, name: str):
        for t in table.tables:
            mod, _, var = t.rpartition(".")
            m = self.index.module(mod)
            for k, v in (m.dict_entries.get(var, []) if m else []):
                if isinstance(k, ast.Constant) and k.value == name and isinstance(v, ast.Constant):
                    prim = self.primitive(v.value)
                    if prim is not None:
                        return prim
                    sym = self.index.resolve(table.probe_module, v.value)
                    return self.invoke(self.symbol(sym), (), {}) if sym is not None else U
        return U

    # -- calls ---------------------------------------------------------------------------------
    def primitive(self, fname: str | None):
        """The value of a call to a capability helper or an assumed probe, by its name; else None."""
        if fname in self.cap_calls:
            self.touched += 1
            return self.cap
        if fname in self.int_calls:
            self.touched += 1
            return self.cap.to_int()
        if fname in self.assumed:
            return self.assumed[fname]
        if fname and probes_a_package(fname):
            return True  # has_flashinfer_trtllm_fused_moe(), is_flashinfer_available(): installed
        return None

    def call(self, node: ast.Call, frame: Frame):
        fname = last_name(node.func)
        prim = self.primitive(fname)
        if prim is not None:
            return prim
        if fname in self.cap_types:
            args = [self.expr(a, frame) for a in node.args]
            kw = {k.arg: self.expr(k.value, frame) for k in node.keywords}
            major = args[0] if args else kw.get("major")
            minor = args[1] if len(args) > 1 else kw.get("minor")
            return Cap(major, minor) if isinstance(major, int) and isinstance(minor, int) else U
        if fname in self.facts and isinstance(node.func, ast.Name):
            return Facts(self.facts[fname])
        if fname in ("lru_cache", "cache", "wraps") and len(node.args) == 1 and not node.keywords:
            return self.expr(node.args[0], frame)
        if isinstance(node.func, ast.Call) and last_name(node.func.func) in ("lru_cache", "cache", "wraps"):
            return self.expr(node.args[0], frame) if node.args else U
        if fname == "partial" and node.args:
            f = self.expr(node.args[0], frame)
            if not isinstance(f, Fn):
                return U
            return Fn(f.sym, tuple(self.expr(a, frame) for a in node.args[1:]),
                      tuple((k.arg, self.expr(k.value, frame)) for k in node.keywords if k.arg), f.this)
        if fname == "isinstance" and len(node.args) == 2:
            v = self.expr(node.args[0], frame)
            names = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            types = tuple(TYPES[n.id] for n in names if isinstance(n, ast.Name) and n.id in TYPES)
            if v is U or len(types) != len(names):
                return U
            return isinstance(v, types) if not isinstance(v, Cap) else tuple in types
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            return U
        f = self.expr(node.func, frame)
        args = tuple(self.expr(a, frame) for a in node.args)
        kwargs = {k.arg: self.expr(k.value, frame) for k in node.keywords}
        return self.invoke(f, args, kwargs)

    def invoke(self, f, args: tuple, kwargs: dict):
        if isinstance(f, DictGet):
            default = args[1] if len(args) > 1 else None
            if not f.d:
                return default  # an empty registry has nothing for any key
            if not args or args[0] is U or not hashable(args[0]):
                return U
            return f.d.get(args[0], default)
        if isinstance(f, Bound):
            if any(a is U for a in args) or kwargs:
                return U
            try:
                return f.fn(*args)
            except Exception:
                return U
        if callable(f) and not isinstance(f, (Fn, ClassRef)) and f in BUILTINS.values():
            if any(a is U for a in args) or kwargs:
                return U
            try:
                return f(*args)
            except Exception:
                return U
        if not isinstance(f, Fn) or self.depth >= MAX_DEPTH:
            return U
        node = f.sym.node
        args = f.args + args
        kwargs = {**dict(f.kwargs), **kwargs}
        try:
            key = (id(node), args, tuple(sorted(kwargs.items())), id(f.this))
            hash(key)
        except TypeError:
            key = None
        if key is not None and key in self._memo:
            return self._memo[key]
        if key is not None:
            self._memo[key] = U  # recursion guard
        frame = self.bind(f, args, kwargs)
        self.depth += 1
        try:
            out = self.block(node.body, frame)
        finally:
            self.depth -= 1
        out = U if out is None or out is RAISES else out
        if key is not None:
            self._memo[key] = out
        return out

    def bind(self, f: Fn, args: tuple, kwargs: dict) -> Frame:
        node = f.sym.node
        imports, _ = import_map([node], f.sym.module.name, f.sym.module.is_package)
        cls = f.this.sym if isinstance(f.this, ClassRef) else None
        frame = Frame(f.sym.module, imports, {}, cls)
        params = [*node.args.posonlyargs, *node.args.args]
        is_static = any(last_name(d) == "staticmethod" for d in node.decorator_list)
        if f.this is not None and params and not is_static:
            frame.locals[params[0].arg] = f.this
            params = params[1:]
        defaults = node.args.defaults
        first_default = len(params) - len(defaults)
        for i, p in enumerate(params):
            if i < len(args):
                frame.locals[p.arg] = args[i]
            elif p.arg in kwargs:
                frame.locals[p.arg] = kwargs[p.arg]
            elif i >= first_default:
                frame.locals[p.arg] = Lazy(defaults[i - first_default], Frame(f.sym.module))
            else:
                frame.locals[p.arg] = U
        for p, d in zip(node.args.kwonlyargs, node.args.kw_defaults):
            frame.locals[p.arg] = kwargs.get(p.arg, Lazy(d, Frame(f.sym.module)) if d is not None else U)
        return frame

    # -- statements (a helper's body) ------------------------------------------------------------
    def block(self, stmts: list[ast.stmt], frame: Frame):
        """The value a statement list returns: a value, RAISES, or None (falls through)."""
        for i, s in enumerate(stmts):
            self.steps += 1
            if self.steps > MAX_STEPS:
                return U
            if isinstance(s, ast.Return):
                return self.expr(s.value, frame) if s.value is not None else None
            if isinstance(s, ast.Raise):
                return RAISES
            if isinstance(s, ast.If):
                t = truth(self.expr(s.test, frame))
                if t is U:  # both ways, each with the rest of the block
                    a = self.block([*s.body, *stmts[i + 1:]], frame.child())
                    b = self.block([*s.orelse, *stmts[i + 1:]], frame.child())
                    return merge(a, b)
                r = self.block(s.body if t else s.orelse, frame)
                if r is not None:
                    return r
            elif isinstance(s, (ast.Assign, ast.AnnAssign)):
                if s.value is not None:
                    for t in s.targets if isinstance(s, ast.Assign) else [s.target]:
                        assign(t, s.value, frame)
            elif isinstance(s, ast.AugAssign) and isinstance(s.target, ast.Name):
                frame.locals[s.target.id] = U
            elif isinstance(s, (ast.Try, ast.With)):
                body = [*s.body, *getattr(s, "orelse", []), *getattr(s, "finalbody", [])]
                r = self.block(body, frame)
                if r is not None:
                    return r
            elif isinstance(s, (ast.For, ast.While, ast.AsyncFor)):
                if any(isinstance(n, ast.Return) for n in ast.walk(s)):
                    return U
                for n in ast.walk(s):
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                        frame.locals[n.id] = U
            elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
                frame.locals[s.name] = Fn(Symbol(frame.module, s))
            elif isinstance(s, ast.Match):
                return U
        return None


