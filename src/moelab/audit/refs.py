"""Where the source tests which backend a flag selected: the atoms of a backend condition.

An atom is an expression that is true exactly when the flag holds one of a set of values:

    server_args.moe_runner_backend == "flashinfer_trtllm"      --moe-runner-backend in {flashinfer_trtllm}
    prefill_backend not in ("fa3", "fa4")                      --attention-backend not in {fa3, fa4}
    backend == NvFp4MoeBackend.VLLM_CUTLASS                    --moe-backend in {cutlass} (via a mapping dict)
    get_moe_runner_backend().is_flashinfer_trtllm()            --moe-runner-backend in {flashinfer_trtllm}

A name holds a flag when it is one of the flag's `holders` (profile), or ends in `_<holder>`,
the longest holder winning (`fp4_gemm_runner_backend` is --fp4-gemm-backend, not
--moe-runner-backend's `runner_backend`). An Enum class belongs to the flag whose choices its
members cover best (at least half of them); its `is_x()` predicate methods are found by reading
their `return self == Enum.X` bodies.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from moelab.audit.profile import FlagSource
from moelab.audit.source import Module, SourceIndex, last_name


def norm(v: str) -> str:
    return v.strip().lower().replace("-", "_")


@dataclass(frozen=True)
class Atom:
    flag: str
    values: frozenset[str] | None  # normalized values; None: a value this audit cannot name
    negate: bool = False
    relevant: bool = True  # names at least one of the flag's choices (or excludes some)

    def holds(self, flag: str, value: str):
        """True/False when the selection is (flag, value); None when this atom is about another flag."""
        if flag != self.flag:
            return None
        if self.values is None:
            return None
        return (norm(value) in self.values) != self.negate


@dataclass
class Flag:
    name: str  # --moe-runner-backend
    source: FlagSource
    choices: dict[str, str]  # normalized -> as the engine spells it


@dataclass
class References:
    flags: dict[str, Flag]
    others: dict[str, frozenset[str]] = field(default_factory=dict)  # flags not audited: their choices
    enums: dict[str, tuple[str, dict[str, str]]] = field(default_factory=dict)  # class -> (flag, member -> value)
    predicates: dict[str, list[tuple[str, frozenset[str]]]] = field(default_factory=dict)  # method -> [(flag, values)]

    # -- building ------------------------------------------------------------------------------
    @classmethod
    def build(cls, flags: dict[str, Flag], modules: list[Module],
              others: dict[str, frozenset[str]] | None = None) -> "References":
        """From the modules that define Enum classes (and their mapping dicts, predicates);
        `others` are the engine's other flags with choices, so a value they share is no clue."""
        refs = cls(flags, others or {})
        classes = [c for m in modules for c in _classes(m.tree.body)]
        enum_names = set()
        for c in classes:
            if _enum_members(c):
                enum_names.add(c.name)
            refs._bind_enum(c)
        for m in modules:
            if any(f"{e}." in m.text for e in enum_names):
                refs._mapping_dicts(m, enum_names)
        for c in classes:
            refs._predicates(c)
        return refs

    def needles(self) -> re.Pattern:
        """A pattern every module that can test a flag matches (to skip parsing the others)."""
        words = {h for f in self.flags.values() for h in f.source.holders} | set(self.enums) | set(self.predicates)
        return re.compile("|".join(sorted(map(re.escape, words), key=len, reverse=True)))

    def _bind_enum(self, c: ast.ClassDef) -> None:
        members = _enum_members(c)
        if len(members) < 2:
            return
        explicit = [f for f in self.flags.values() if (f.source.class_enum or "").rpartition(".")[2] == c.name]
        if explicit:
            self.enums[c.name] = (explicit[0].name, {m: norm(m) for m in members})
            return
        best, best_cov, tie = None, 0.0, False
        for f in self.flags.values():
            # every member stands for a value: the choice it names, else its own (never selected)
            values = {m: norm(v) if v is not None and norm(v) in f.choices else norm(m) for m, v in members.items()}
            hits = sum(1 for v in values.values() if v in f.choices)
            cov = hits / len(members)
            if hits >= 2 and cov >= 0.5:
                if cov > best_cov:
                    best, best_cov, tie = (f.name, values), cov, False
                elif cov == best_cov:
                    tie = True
        if best and not tie:
            self.enums[c.name] = best

    def _mapping_dicts(self, m: Module, enum_names: set[str]) -> None:
        """{"cutlass": NvFp4MoeBackend.VLLM_CUTLASS, ...}: the member stands for the key's value."""
        for n in ast.walk(m.tree):
            if not isinstance(n, ast.Dict):
                continue
            pairs = [(k.value, v) for k, v in zip(n.keys, n.values)
                     if isinstance(k, ast.Constant) and isinstance(k.value, str) and isinstance(v, ast.Attribute)
                     and isinstance(v.value, ast.Name) and v.value.id in enum_names]
            for f in self.flags.values():
                hits = [(norm(k), v) for k, v in pairs if norm(k) in f.choices]
                if len(hits) < 2:
                    continue
                for k, v in hits:
                    cname = v.value.id
                    flag, mem = self.enums.get(cname, (f.name, {}))
                    if flag == f.name and mem.get(v.attr) not in f.choices:
                        mem[v.attr] = k  # VLLM_CUTLASS stands for "cutlass"
                        self.enums[cname] = (flag, mem)

    def _predicates(self, c: ast.ClassDef) -> None:
        for fn in c.body:
            if not (isinstance(fn, ast.FunctionDef) and fn.name.startswith("is_") and len(fn.args.args) == 1):
                continue
            body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
                continue
            hit = self._self_test(body[0].value)
            if hit:
                self.predicates.setdefault(fn.name, []).append(hit)

    def _self_test(self, e: ast.expr) -> tuple[str, frozenset[str]] | None:
        """`self == E.X`, `self.value in (E.X.value, E.Y.value)` -> (flag, values)."""
        if not (isinstance(e, ast.Compare) and len(e.ops) == 1 and isinstance(e.ops[0], (ast.Eq, ast.Is, ast.In))):
            return None
        left = e.left.value if isinstance(e.left, ast.Attribute) and e.left.attr == "value" else e.left
        if not (isinstance(left, ast.Name) and left.id == "self"):
            return None
        got = self._members(e.comparators[0])
        return got if got and got[1] else None

    # -- reading conditions --------------------------------------------------------------------
    def holder_flag(self, name: str | None) -> str | None:
        """The flag a variable/attribute/getter name holds, by the longest matching holder; None
        when a longer match is another flag's own name (prefill_attention_backend is the
        --prefill-attention-backend flag, not --attention-backend's `attention_backend`)."""
        if not name:
            return None
        best, size = None, 0
        for f in self.flags.values():
            for h in f.source.holders:
                if (name == h or name.endswith("_" + h)) and len(h) > size:
                    best, size = f.name, len(h)
        for other in self.others:
            dest = other.lstrip("-").replace("-", "_")
            if (name == dest or name.endswith("_" + dest)) and len(dest) > size:
                return None
        return best

    def _members(self, e: ast.expr) -> tuple[str, frozenset[str]] | None:
        """E.X / E.X.value / a tuple of them -> (flag, values) when E is a flag's enum."""
        elts = e.elts if isinstance(e, (ast.Tuple, ast.List, ast.Set)) else [e]
        flag, values = None, set()
        for x in elts:
            if isinstance(x, ast.Attribute) and x.attr == "value":
                x = x.value
            if not (isinstance(x, ast.Attribute) and isinstance(x.value, ast.Name) and x.value.id in self.enums):
                return None
            f, mem = self.enums[x.value.id]
            if flag not in (None, f):
                return None
            flag = f
            values.add(mem.get(x.attr, norm(x.attr)))
        return (flag, frozenset(values)) if flag else None

    def enum_flag(self, annotation: ast.expr | None) -> str | None:
        """The flag of a parameter annotated with one of the flags' enums."""
        name = last_name(annotation) if annotation is not None else None
        return self.enums[name][0] if name in self.enums else None

    def atom(self, node: ast.AST, module: Module, index: SourceIndex, imports: dict, aliases: dict) -> Atom | None:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args:
            return self._predicate_call(node, aliases)
        if not (isinstance(node, ast.Compare) and len(node.ops) == 1):
            return None
        op, left, right = node.ops[0], node.left, node.comparators[0]
        negate = isinstance(op, (ast.NotEq, ast.IsNot, ast.NotIn))
        if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)) \
                and isinstance(left, ast.Constant) and isinstance(left.value, str):
            # "trtllm_mha" in (prefill_backend, decode_backend)
            flags = {self.flag_of(e, aliases) for e in right.elts}
            if len(flags) == 1 and None not in flags:
                return self._string_atom(flags.pop(), [left.value], negate)
            return None
        sides = [(left, right)] if isinstance(op, (ast.In, ast.NotIn)) else [(left, right), (right, left)]
        for a, b in sides:
            mem = self._members(b)
            if mem:
                return self._atom(mem[0], mem[1], negate)
            strings = _strings(b, module, index, imports)
            if strings is None:
                continue
            flag = self.flag_of(a, aliases) or self._unique_flag(a, strings)
            if flag is not None:
                return self._string_atom(flag, strings, negate)
        return None

    def flag_of(self, e: ast.expr, aliases: dict) -> str | None:
        if isinstance(e, ast.Name) and e.id in aliases:
            return aliases[e.id]
        return self.holder_flag(last_name(e))

    def _unique_flag(self, e: ast.expr, strings: list[str]) -> str | None:
        """A `*backend*` name compared with values that only one flag has among its choices."""
        name = last_name(e) or ""
        if "backend" not in name or not strings:
            return None
        owners = {f.name for f in self.flags.values() for s in strings if norm(s) in f.choices}
        owners |= {name for name, choices in self.others.items() for s in strings if norm(s) in choices}
        return owners.pop() if len(owners) == 1 and owners <= set(self.flags) else None

    def _string_atom(self, flag: str, strings: list[str], negate: bool) -> Atom:
        return self._atom(flag, frozenset(norm(s) for s in strings), negate)

    def _atom(self, flag: str, values: frozenset[str], negate: bool) -> Atom:
        """An atom; it is relevant when it names one of the flag's choices."""
        return Atom(flag, values, negate, relevant=bool(values & set(self.flags[flag].choices)))

    def _predicate_call(self, node: ast.Call, aliases: dict) -> Atom | None:
        cands = self.predicates.get(node.func.attr)
        if not cands:
            return None
        flag = self.flag_of(node.func.value, aliases)
        pick = [c for c in cands if c[0] == flag] if flag else cands
        flags = {c[0] for c in pick}
        if len(flags) != 1:
            return None
        if len(pick) != 1:
            return Atom(flags.pop(), None, relevant=False)
        return self._atom(pick[0][0], pick[0][1], False)


def _classes(body):
    for n in body:
        if isinstance(n, ast.ClassDef):
            yield n
            yield from _classes(n.body)
        elif isinstance(n, (ast.If, ast.Try)):
            yield from _classes(n.body)


def _strings(e: ast.expr, module: Module, index: SourceIndex, imports: dict, depth: int = 0) -> list[str] | None:
    """The string constants an expression is, or names (a module-level list/set/tuple)."""
    if isinstance(e, ast.Constant) and isinstance(e.value, str):
        return [e.value]
    if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
        out = []
        for x in e.elts:
            got = _strings(x, module, index, imports, depth)
            if got is None:
                return None
            out += got
        return out
    if isinstance(e, ast.Name) and depth < 3:
        sym = index.resolve(module.name, e.id, imports)
        if sym is not None and isinstance(sym.node, (ast.Tuple, ast.List, ast.Set)):
            return _strings(sym.node, sym.module, index, {}, depth + 1)
    if isinstance(e, ast.Call) and last_name(e.func) in ("set", "frozenset", "tuple", "list") and len(e.args) == 1:
        return _strings(e.args[0], module, index, imports, depth)
    return None


def _enum_members(c: ast.ClassDef) -> dict[str, str | None]:
    if not any("Enum" in (ast.unparse(b)) for b in c.bases):
        return {}
    out = {}
    for s in c.body:
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
            v = s.value
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                out[s.targets[0].id] = v.value
            elif isinstance(v, ast.Call) and last_name(v.func) == "auto":
                out[s.targets[0].id] = None
    return out
