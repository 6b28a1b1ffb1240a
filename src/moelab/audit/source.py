"""An installed package's Python source, parsed on demand and never imported.

`locate(python, packages)` asks an interpreter (any: this one, a venv's, a scratch folder's)
where its packages live and which distributions and versions they belong to, without importing
them. `SourceIndex` then parses a module the first time something asks for it and answers
"what does the name X mean in module M": a function, a class, a module-level value, or another
module, following `import` / `from ... import` and package re-exports.

    idx = SourceIndex({"sglang": Path(".../site-packages/sglang")})
    idx.resolve("sglang.srt.arg_groups.moe_hook", "is_sm100_supported")
    # -> Symbol(module=<sglang.srt.utils.common>, node=<Assign is_sm100_supported = lru_cache(...)(...)>)
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

# Asked of the target interpreter; find_spec on a top-level name locates without importing.
_LOCATE = r"""
import importlib.metadata as m, importlib.util, json, sys
dists = m.packages_distributions()
out = {}
for name in sys.argv[1:]:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        continue
    version = None
    for d in dists.get(name, []):
        try:
            version = (d, m.version(d))
            break
        except m.PackageNotFoundError:
            pass
    out[name] = {"path": list(spec.submodule_search_locations)[0], "dist": version}
print(json.dumps({"python": sys.executable, "packages": out}))
"""


@dataclass(frozen=True)
class Package:
    name: str  # import name
    path: Path
    dist: str | None  # distribution name, e.g. flashinfer-python
    version: str | None


def locate(python: str, packages: list[str], timeout_s: float = 60) -> dict[str, Package]:
    """Where `python` would import each of `packages` from; absent ones are left out."""
    try:
        out = subprocess.run([python, "-c", _LOCATE, *packages], capture_output=True, text=True,
                             timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"cannot run {python}: {e}") from None
    if out.returncode != 0:
        raise RuntimeError(f"{python} could not list its packages: {out.stderr.strip()[-300:]}")
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    return {name: Package(name=name, path=Path(p["path"]), dist=(p["dist"] or [None])[0],
                          version=(p["dist"] or [None, None])[1])
            for name, p in doc["packages"].items()}


@dataclass
class Module:
    name: str
    path: Path
    root: Path  # the directory paths are reported relative to (site-packages)
    text: str = field(repr=False)
    tree: ast.Module = field(repr=False)
    is_package: bool = False
    defs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef] = field(default_factory=dict, repr=False)
    values: dict[str, ast.expr] = field(default_factory=dict, repr=False)  # NAME = expr at module level (last one)
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict, repr=False)  # local -> (module, attr)
    star: list[str] = field(default_factory=list, repr=False)  # modules of `from X import *`
    _dicts: dict[str, list[tuple[ast.expr, ast.expr]]] | None = field(default=None, repr=False)
    _lines: list[str] | None = field(default=None, repr=False)

    @property
    def dict_entries(self) -> dict[str, list[tuple[ast.expr, ast.expr]]]:
        """Dict registries anywhere in the module: NAME = {...}, NAME: T = {...}, NAME.update({...})."""
        if self._dicts is None:
            self._dicts = {}
            for n in ast.walk(self.tree):
                target, value = None, None
                if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
                    target, value = n.targets[0].id, n.value
                elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                    target, value = n.target.id, n.value
                elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "update"
                      and isinstance(n.func.value, ast.Name) and n.args):
                    target, value = n.func.value.id, n.args[0]
                if target and isinstance(value, ast.Dict):
                    self._dicts.setdefault(target, []).extend(
                        (k, v) for k, v in zip(value.keys, value.values) if k is not None)
        return self._dicts

    @property
    def rel(self) -> str:
        return str(self.path.relative_to(self.root))

    def where(self, node: ast.AST) -> str:
        return f"{self.rel}:{getattr(node, 'lineno', 0)}"

    def segment(self, node: ast.AST, limit: int = 160) -> str:
        """The source text of a node on one line (ast.get_source_segment re-splits the file)."""
        if self._lines is None:
            self._lines = self.text.splitlines()
        try:
            first, last = node.lineno - 1, node.end_lineno - 1
            rows = [r.encode() for r in self._lines[first:last + 1]]
            rows[-1] = rows[-1][: node.end_col_offset]
            rows[0] = rows[0][node.col_offset:]
            s = " ".join(b" ".join(rows).decode(errors="replace").split())
        except (AttributeError, IndexError, TypeError):
            s = ast.unparse(node)
        return s if len(s) <= limit else s[: limit - 3] + "..."


def last_name(node: ast.AST | None) -> str | None:
    """The last identifier of a name, attribute, call or subscript: get_moe_runner_backend() -> that."""
    if isinstance(node, ast.Call):
        return last_name(node.func)
    if isinstance(node, ast.Subscript):
        return last_name(node.value)
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def import_map(body, module_name: str, is_package: bool) -> tuple[dict[str, tuple[str, str | None]], list[str]]:
    """Local name -> (module, attribute or None for a module) for the imports among `body`
    (walked to any depth, so the imports inside a function count for that function)."""
    out, star = {}, []
    base = module_name if is_package else module_name.rpartition(".")[0]
    for node in body:
        for n in ast.walk(node) if not isinstance(node, ast.Module) else _top_level(node.body):
            if isinstance(n, ast.Import):
                for a in n.names:
                    if a.asname:
                        out[a.asname] = (a.name, None)
                    else:
                        top = a.name.split(".")[0]
                        out[top] = (top, None)
            elif isinstance(n, ast.ImportFrom):
                if n.level:
                    parts = base.split(".")
                    parent = ".".join(parts[: len(parts) - (n.level - 1)]) if n.level > 1 else base
                    mod = f"{parent}.{n.module}" if n.module else parent
                else:
                    mod = n.module or ""
                for a in n.names:
                    if a.name == "*":
                        star.append(mod)
                    else:
                        out[a.asname or a.name] = (mod, a.name)
    return out, star


def _index(mod: Module) -> None:
    imports, star = import_map([mod.tree], mod.name, mod.is_package)
    mod.imports, mod.star = imports, star
    for node in _top_level(mod.tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            mod.defs[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in t.elts if isinstance(t, ast.Tuple) else [t]:
                    if isinstance(name, ast.Name):
                        mod.values[name.id] = node.value


def _top_level(body):
    """Module-level statements, including those under `if`/`try` (platform-dependent definitions).
    A `try` body comes after its handlers, so `HAVE_X = True` wins over the except's `False`:
    the audit asks about an installation whose dependencies import."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            for h in node.handlers:
                yield from _top_level(h.body)
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)


@dataclass(frozen=True)
class Symbol:
    """What a name means: a def/class node, a module-level value, or a whole module (node None)."""

    module: Module
    node: ast.AST | None


class SourceIndex:
    def __init__(self, roots: dict[str, Path]) -> None:
        self.roots = roots  # top-level package -> its directory
        self._modules: dict[str, Module | None] = {}
        self._texts: dict[str, str] = {}
        self.parsed = 0

    def path_of(self, name: str) -> tuple[Path, bool] | None:
        top, _, rest = name.partition(".")
        root = self.roots.get(top)
        if root is None:
            return None
        base = root.joinpath(*rest.split(".")) if rest else root
        if (base / "__init__.py").is_file():
            return base / "__init__.py", True
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py"), False
        if base.is_dir():  # a namespace package (no __init__.py)
            return base / "__init__.py", True
        return None

    def module(self, name: str) -> Module | None:
        if name in self._modules:
            return self._modules[name]
        found = self.path_of(name)
        mod = None
        if found:
            path, is_pkg = found
            text = self.text(name)
            try:
                tree = ast.parse(text)
            except (SyntaxError, ValueError):
                tree = None
            if tree is not None:
                mod = Module(name=name, path=path, root=self.roots[name.split(".")[0]].parent, text=text,
                             tree=tree, is_package=is_pkg)
                _index(mod)
                self.parsed += 1
        self._modules[name] = mod
        return mod

    def names_under(self, prefix: str) -> list[str]:
        """The module names of a (sub)package, without parsing anything."""
        found = self.path_of(prefix)
        if not found:
            return []
        path, is_pkg = found
        if not is_pkg:
            return [prefix]
        out = []
        for p in sorted(path.parent.rglob("*.py")):
            parts = list(p.relative_to(path.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if all(x.isidentifier() for x in parts):
                out.append(".".join([prefix, *parts]))
        return out

    def text(self, name: str) -> str:
        """A module's source text (read once; empty when absent)."""
        if name not in self._texts:
            found = self.path_of(name)
            try:
                self._texts[name] = found[0].read_text(encoding="utf-8", errors="replace") if found else ""
            except OSError:
                self._texts[name] = ""
        return self._texts[name]

    def modules_under(self, prefix: str, needles: re.Pattern | None = None):
        """The parsed modules of a (sub)package, only those whose text matches `needles` if given."""
        for name in self.names_under(prefix):
            if needles is not None and not needles.search(self.text(name)):
                continue
            m = self.module(name)
            if m is not None:
                yield m

    def resolve(self, module: str, name: str, local: dict[str, tuple[str, str | None]] | None = None,
                depth: int = 0) -> Symbol | None:
        """What `name` means inside `module` (with a function's own imports in `local`)."""
        if depth > 12:
            return None
        mod = self.module(module)
        target = (local or {}).get(name)
        if target is None and mod is not None:
            if name in mod.defs:
                return Symbol(mod, mod.defs[name])
            if name in mod.values:
                return Symbol(mod, mod.values[name])
            target = mod.imports.get(name)
        if target is not None:
            src, attr = target
            if attr is None:
                m = self.module(src)
                return Symbol(m, None) if m else None
            sub = self.module(f"{src}.{attr}")
            if sub is not None and attr not in getattr(self.module(src), "defs", {}):
                return Symbol(sub, None)
            return self.resolve(src, attr, None, depth + 1)
        if mod is not None:
            for s in mod.star:
                hit = self.resolve(s, name, None, depth + 1)
                if hit:
                    return hit
        return None

    def resolve_dotted(self, dotted: str) -> Symbol | None:
        """'pkg.mod.Class' or 'pkg.mod.NAME' -> its symbol (the longest module prefix wins)."""
        parts = dotted.split(".")
        for i in range(len(parts) - 1, 0, -1):
            if self.module(".".join(parts[:i])) is not None:
                sym = self.resolve(".".join(parts[:i]), parts[i])
                for attr in parts[i + 1:]:
                    if sym is None or not isinstance(sym.node, ast.ClassDef):
                        return None
                    sym = member(sym, attr)
                return sym
        return None


def member(cls: Symbol, name: str) -> Symbol | None:
    """A method or class attribute defined directly in a class body."""
    for n in cls.node.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name:
            return Symbol(cls.module, n)
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
            return Symbol(cls.module, n.value)
    return None


def bases(index: SourceIndex, cls: Symbol) -> list[Symbol]:
    """The classes a class derives from, where the index can resolve them."""
    out = []
    for b in cls.node.bases:
        sym = None
        if isinstance(b, ast.Name):
            sym = index.resolve(cls.module.name, b.id)
        elif isinstance(b, ast.Attribute) and isinstance(b.value, ast.Name):
            mod = index.resolve(cls.module.name, b.value.id)
            sym = index.resolve(mod.module.name, b.attr) if mod and mod.node is None else None
        if sym is not None and isinstance(sym.node, ast.ClassDef):
            out.append(sym)
    return out


def lookup(index: SourceIndex, cls: Symbol, name: str, depth: int = 0) -> Symbol | None:
    """A class member, searched in the class and then its bases (in order)."""
    hit = member(cls, name)
    if hit is not None or depth > 8:
        return hit
    for b in bases(index, cls):
        hit = lookup(index, b, name, depth + 1)
        if hit is not None:
            return hit
    return None
