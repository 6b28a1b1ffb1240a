"""Find the architecture gates of every backend choice: refusals tied to a selection and an arch.

A Point (walk.py) is a gate of `--flag value` when its conditions test that flag and depend on
the GPU's capability. Points are found three ways:

1. directly: the conditions around a raise/assert test the flag (`if backend == "hpc_ops"` ...);
2. reached: a call made only under such a condition, or a function registered for the value
   (`@register_attention_backend("fa3")`), is followed up to DEPTH calls deep, and the refusals
   and support predicates found there inherit the path's conditions;
3. declared: a registry maps the value to a class (`{"fp8": Fp8Config}`, an Enum naming
   "vllm.v1.attention.backends.flash_attn.FlashAttentionBackend"), and the class says where it
   runs (`get_min_capability()`, `supports_compute_capability(capability)`).

Each gate is then evaluated for each arch with the flag set to the value (evaluate.py): True
means the source refuses there, False that this gate lets it through, UNKNOWN that it refuses
only under further conditions (named in `when`).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

from moelab.audit.declared import Declarations
from moelab.audit.evaluate import Evaluator
from moelab.audit.profile import Profile
from moelab.audit.refs import References, norm
from moelab.audit.source import SourceIndex, Symbol, import_map, last_name, lookup
from moelab.audit.values import ARCHS, U, Frame, truth
from moelab.audit.walk import Body, Cond, Point, Pred, Site, functions, walk

DEPTH = 3  # calls followed from a backend's region, inside the engine ...
LIBRARY_DEPTH = 4  # ... and then inside a library it dispatches to (thin wrappers around JIT modules)
MAX_REACHED = 400  # points kept from one root (a guard against following a whole framework)


@dataclass
class Candidate:
    point: Point
    chain: tuple[Cond, ...]  # conditions from the root down to the point's own function
    via: tuple[str, ...]  # file:line of the calls that led to the point
    selects: dict[str, frozenset[str]]  # flag -> the values the path selects (those it may gate)
    depth: int = 0
    context: str = ""  # module, class and function of the root, for the weight formats it is about

    def model(self, model_code: list[str]) -> str | None:
        """The model the code is for, when it lies in the engine's per-model modules."""
        for name in (self.point.module.name, self.context.split(" ")[0]):
            if any(name == m or name.startswith(m + ".") for m in model_code):
                return f"{self.point.module.name.rpartition('.')[2]}: {self.point.owner or '?'}"
        return None

    @property
    def formats(self) -> frozenset[str]:
        """Weight formats the code is specific to, by its names (ModelOptNvFp4FusedMoEMethod: nvfp4)."""
        root_module, _, names = self.context.partition(" ")
        return formats_in(f"{root_module.rpartition('.')[2]} {names} {self.point.module.name.rpartition('.')[2]} "
                          f"{self.point.owner}")


@dataclass
class Gate:
    """One gate of one backend value, evaluated on every arch."""

    flag: str
    value: str
    candidate: Candidate
    archs: dict[str, object]  # arch -> True (refused) / False (let through) / U (conditional)
    when: dict[str, list[str]] = field(default_factory=dict)  # arch -> conditions still unknown there


class Auditor:
    def __init__(self, index: SourceIndex, profiles: list[Profile], refs: References, scan: list) -> None:
        self.index, self.profiles, self.refs, self.scan = index, profiles, refs, scan
        self.engine = profiles[0].packages[0]  # the engine's own package; the others are libraries
        self.majors = {k: v for p in profiles for k, v in p.arch_major_calls.items()}
        self.model_code = [m for p in profiles for m in p.model_code]
        self._bodies: dict[int, Body] = {}
        self._atoms: dict[int, object] = {}
        self._evs: dict = {}
        self._sensitive: dict[int, bool] = {}
        self._reach: dict = {}
        self.decl = Declarations(index, profiles, self.evaluator)

    # -- walking -------------------------------------------------------------------------------
    def body(self, sym: Symbol, cls: Symbol | None = None) -> Body:
        key = id(sym.node)
        if key not in self._bodies:
            self._bodies[key] = walk(sym.node, sym.module, cls, self.refs.flag_of, self.majors,
                                     self.refs.enum_flag)
        return self._bodies[key]

    def atom(self, node: ast.AST, frame: Frame):
        key = id(node)
        if key not in self._atoms:
            self._atoms[key] = self.refs.atom(node, frame.module, self.index, frame.imports, frame.aliases) \
                if isinstance(node, (ast.Compare, ast.Call)) else None
        return self._atoms[key]

    def selects(self, conds: tuple[Cond, ...]) -> dict[str, frozenset[str]]:
        """Flag -> values a path selects: atoms that hold with the path's polarity and name the
        value (`backend == "x"` under `if`, `not (backend != "x")` after an early return), not
        those that merely exclude others (`backend not in ("marlin",)`)."""
        out: dict[str, set[str]] = {}
        for c in conds:
            if isinstance(c.test, Pred) or c.scope is None:
                continue
            frame = Frame(c.scope.module, c.scope.imports, {}, c.scope.cls, c.scope.aliases)
            for a, positive in self._polar(c.test, c.positive, frame):
                if positive and a.relevant and a.values:
                    out.setdefault(a.flag, set()).update(a.values & set(self.refs.flags[a.flag].choices))
        return {f: frozenset(v) for f, v in out.items() if v}

    def _polar(self, e: ast.expr, positive: bool, frame: Frame):
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
            yield from self._polar(e.operand, not positive, frame)
        elif isinstance(e, ast.BoolOp):
            for v in e.values:
                yield from self._polar(v, positive, frame)
        else:
            a = self.atom(e, frame)
            if a is not None:
                yield a, positive != a.negate

    # -- evaluation ----------------------------------------------------------------------------
    def evaluator(self, sel: tuple[str, str] | None, arch: str) -> Evaluator:
        key = (sel, arch)
        if key not in self._evs:
            def hook(node, frame, sel=sel):
                a = self.atom(node, frame)
                if a is None:
                    return None
                held = a.holds(*sel) if sel else None
                return U if held is None else held
            self._evs[key] = Evaluator(self.index, self.profiles, ARCHS[arch], hook)
        return self._evs[key]

    def conj(self, ev: Evaluator, conds, sel) -> tuple[object, list[str]]:
        """Kleene AND of the conditions, and the source of those left unknown."""
        out, unknown = True, []
        for c in conds:
            if isinstance(c.test, Pred):
                v = truth(c.test.fn(ev, sel))
            else:
                v = truth(ev.value(c.test, c.scope.frame(c.upto)))
            if v is not U and not c.positive:
                v = not v
            if v is False:
                return False, []
            if v is U and not c.past_refusal:
                out = U
                unknown.append(c)
        return out, unknown

    def sensitive(self, p: Point) -> bool:
        """Whether a point's own conditions depend on the arch (no backend selected)."""
        key = id(p)
        if key not in self._sensitive:
            vals, touched = set(), 0
            for arch in ARCHS:
                ev = self.evaluator(None, arch)
                before = ev.touched
                vals.add(repr(self.conj(ev, p.conds, None)[0]))
                touched += ev.touched - before
            self._sensitive[key] = touched > 0 and (len(vals) > 1 or p.kind != "raise" and p.kind != "assert")
        return self._sensitive[key]

    def gate(self, cand: Candidate, flag: str, value: str) -> Gate | None:
        """The point evaluated on every arch for `flag == value`, or None when it is no arch gate
        of that value: never refusing it, not depending on the arch, or refusing only for a
        reason of its own (a shape assert) on a path that an arch test merely leads to."""
        sel = (flag, value)
        if norm(value) not in cand.selects.get(flag, ()):
            return None
        archs, when, touched, deciding = {}, {}, 0, 0
        conds = (*cand.chain, *cand.point.conds)
        for arch in ARCHS:
            ev = self.evaluator(sel, arch)
            before = ev.touched
            v, unknown = self.conj(ev, conds, sel)
            touched += ev.touched - before
            before = ev.touched
            self.conj(ev, conds[-1:], sel)  # the refusal's own test
            deciding += ev.touched - before
            archs[arch] = v
            if v is U:
                when[arch] = [cond_text(c) for c in unknown]
        declared = cand.point.kind not in ("raise", "assert")  # support predicates, floors, arch lists
        if touched == 0 or not declared and (all(v is False for v in archs.values())
                                              or len({repr(v) for v in archs.values()}) == 1):
            return None
        if not declared and deciding == 0 and not any(v is True for v in archs.values()):
            return None
        return Gate(flag, value, cand, archs, when)

    # -- finding candidates ----------------------------------------------------------------------
    def candidates(self):
        """Every point that may gate some flag's value, with how it was found."""
        for mod in self.scan:
            for fn, cls in functions(mod):
                body = self.body(Symbol(mod, fn), cls)
                ctx = f"{mod.name} {cls.node.name if cls else ''} {fn.name}"
                for p in body.points:
                    sel = self.selects(p.conds)
                    if sel and self.sensitive(p):
                        yield Candidate(p, (), (), sel, context=ctx)
                regions: dict[tuple, list[Site]] = {}
                for s in body.sites:
                    if s.conds:
                        regions.setdefault(s.conds, []).append(s)
                for conds, sites in regions.items():
                    sel = self.selects(conds)
                    if not sel:
                        continue
                    for s in sites:
                        for t in self.targets(s):
                            for chain, via, p, depth in self.reach(t, DEPTH - 1, LIBRARY_DEPTH):
                                yield Candidate(p, (*conds, *chain), (mod.where(s.node), *via), sel, depth + 1, ctx)
                for flag, value in self.registrations(mod, fn):
                    for chain, via, p, depth in self.reach(Symbol(mod, fn), DEPTH - 1, LIBRARY_DEPTH):
                        yield Candidate(p, chain, (mod.where(fn), *via), {flag: frozenset([norm(value)])}, depth, ctx)
                yield from self.passed_on(body, mod, ctx)
        yield from self.declared()

    def passed_on(self, body: Body, mod, ctx: str):
        """A flag's value handed to a library call as `backend=` (SGLang's fp4_gemm passes
        get_fp4_gemm_runner_backend().get_flashinfer_backend() to flashinfer.mm_fp4): the
        callee's per-backend checks (`@backend_requirement({...})`) gate the flag's values."""
        for s in body.sites:
            if not isinstance(s.node, ast.Call):
                continue
            kw = next((k.value for k in s.node.keywords if k.arg == "backend"), None)
            flag = self._derived_flag(kw, body.scope) if kw is not None else None
            if flag is None:
                continue
            for t in self.targets(s):
                for p in self.decl.decorator_points(t):
                    yield Candidate(p, s.conds, (mod.where(s.node),), {flag: frozenset(self.refs.flags[flag].choices)},
                                    1, ctx)

    def _derived_flag(self, e: ast.expr, scope, depth: int = 0) -> str | None:
        """The flag an expression is computed from: a holder, an alias, or a local assigned from one."""
        for n in ast.walk(e):
            name = n.id if isinstance(n, ast.Name) else None
            flag = self.refs.flag_of(n, scope.aliases) if isinstance(n, (ast.Name, ast.Attribute, ast.Call)) else None
            if flag:
                return flag
            if name and depth < 2:
                for target, value, _ in reversed(scope.assigns):
                    if target == name:
                        return self._derived_flag(value, scope, depth + 1)
        return None

    def registrations(self, mod, fn) -> list[tuple[str, str]]:
        """`@register_x("value")` decorators: the flag from the parameter or the decorator's name."""
        out = []
        for d in getattr(fn, "decorator_list", []):
            if not isinstance(d, ast.Call):
                continue
            dname = last_name(d.func)
            sym = self.index.resolve(mod.name, dname) if isinstance(d.func, ast.Name) else None
            params = [a.arg for a in sym.node.args.args] if sym and isinstance(sym.node, ast.FunctionDef) else []
            named = [(params[i] if i < len(params) else None, a) for i, a in enumerate(d.args)]
            named += [(k.arg, k.value) for k in d.keywords]
            for pname, a in named:
                if not (isinstance(a, ast.Constant) and isinstance(a.value, str)):
                    continue
                flag = self.refs.holder_flag(pname) or self.refs.holder_flag(dname)
                if flag and norm(a.value) in self.refs.flags[flag].choices:
                    out.append((flag, a.value))
        return out

    def targets(self, site: Site) -> list[Symbol]:
        """The functions and classes of the source a call (or a named class) resolves to."""
        node = site.node.func if isinstance(site.node, ast.Call) else site.node
        sc = site.scope
        sym = None
        if isinstance(node, ast.Name):
            sym = self.index.resolve(sc.module.name, node.id, sc.imports)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in ("self", "cls") and sc.cls is not None:
                sym = lookup(self.index, sc.cls, node.attr)
            else:
                base = self.index.resolve(sc.module.name, node.value.id, sc.imports)
                if base is not None and base.node is None:
                    sym = self.index.resolve(base.module.name, node.attr)
                elif base is not None and isinstance(base.node, ast.ClassDef):
                    sym = lookup(self.index, base, node.attr)
        if sym is None or not isinstance(sym.node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return []
        if isinstance(site.node, ast.Name) and not isinstance(sym.node, ast.ClassDef):
            return []  # a bare name in a return: only a class counts
        return [sym]

    def reach(self, sym: Symbol, depth: int, lib_depth: int) -> list[tuple[tuple, tuple, Point, int]]:
        """(conditions, via, point, depth) for the gates in a function or class and its callees:
        `depth` more calls inside the engine, `lib_depth` more inside its libraries."""
        key = (id(sym.node), depth, lib_depth)
        if key in self._reach:
            return self._reach[key]
        self._reach[key] = []  # recursion guard
        out: list = []
        if isinstance(sym.node, ast.ClassDef):
            out += [((), (), p, 0) for p in self.decl.class_points(sym)]
            init = lookup(self.index, sym, "__init__")
            if init is not None:
                out += self.reach(Symbol(init.module, init.node), depth, lib_depth)
        else:
            cls = self._enclosing(sym)
            body = self.body(sym, cls)
            out += [((), (), p, 0) for p in body.points if self.sensitive(p)]
            out += [((), (), p, 0) for p in self.decl.decorator_points(sym)]
            for s in body.sites:
                for t in self.targets(s):
                    in_lib = t.module.name.split(".")[0] != self.engine
                    if t.node is sym.node or (lib_depth if in_lib else depth) <= 0:
                        continue
                    for chain, via, p, d in self.reach(t, depth - (not in_lib), lib_depth - in_lib):
                        out.append(((*s.conds, *chain), (sym.module.where(s.node), *via), p, d + 1))
        self._reach[key] = out[:MAX_REACHED]  # a guard against following a whole framework
        return self._reach[key]

    def _enclosing(self, sym: Symbol) -> Symbol | None:
        """The class a method belongs to (per module, computed once)."""
        key = ("classes", sym.module.name)
        if key not in self._reach:
            self._reach[key] = {id(fn): cls for fn, cls in functions(sym.module)}
        return self._reach[key].get(id(sym.node))

    # -- declared support ------------------------------------------------------------------------
    def declared(self):
        """Registries (value -> class) and class enums (member -> class path) of the flags."""
        for flag in self.refs.flags.values():
            for reg in flag.source.registries:
                modname, _, var = reg.rpartition(".")
                mod = self.index.module(modname)
                if mod is None:
                    continue
                imports, _ = import_map([n for n in ast.walk(mod.tree) if isinstance(n, (ast.Import, ast.ImportFrom))],
                                        mod.name, mod.is_package)
                for k, v in mod.dict_entries.get(var, []):
                    if not (isinstance(k, ast.Constant) and isinstance(k.value, str) and isinstance(v, ast.Name)
                            and norm(k.value) in flag.choices):
                        continue
                    cls = self.index.resolve(mod.name, v.id, imports)
                    if cls is None or not isinstance(cls.node, ast.ClassDef):
                        continue
                    for p in [*self.decl.floor_points(cls), *self.decl.class_points(cls)]:
                        yield Candidate(p, (), (mod.where(k),), {flag.name: frozenset([norm(k.value)])})
            if flag.source.class_enum:
                enum = self.index.resolve_dotted(flag.source.class_enum)
                if enum is None or not isinstance(enum.node, ast.ClassDef):
                    continue
                for s in enum.node.body:
                    if not (isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name)):
                        continue
                    path = s.value.value if isinstance(s.value, ast.Constant) else None
                    cls = self.index.resolve_dotted(path) if isinstance(path, str) else None
                    if cls is None or not isinstance(cls.node, ast.ClassDef):
                        continue
                    for p in self.decl.class_points(cls):
                        yield Candidate(p, (), (enum.module.where(s),), {flag.name: frozenset([norm(s.targets[0].id)])})

_FORMATS = (("mxfp4", "mxfp4"), ("mxfp8", "mxfp8"), ("nvfp4", "nvfp4"), ("fp4", "nvfp4"), ("fp8", "fp8"),
            ("w4a16", "int4"), ("wna16", "int4"), ("int4", "int4"), ("awq", "int4"), ("gptq", "int4"))


def formats_in(names: str) -> frozenset[str]:
    """Weight formats named in identifiers: "ModelOptNvFp4FusedMoEMethod" -> {nvfp4}."""
    text = names.lower()
    found = set()
    for token, fmt in _FORMATS:
        if token in text:
            found.add(fmt)
            text = text.replace(token, " ")  # mxfp4 is not also fp4
    return frozenset(found)


def cond_text(c: Cond) -> str:
    text = c.test.text if isinstance(c.test, Pred) else c.scope.module.segment(c.test, 120)
    return text if c.positive else f"not ({text})"
