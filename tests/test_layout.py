"""The package layout's rules, read from the sources (docs/ARCHITECTURE.md, "Packages by role"):
no import cycle between tokenfair's modules (function-level imports included), no private name
imported from another tokenfair module, and the pure core imports no torch, HTTP or wall clock."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PURE_PACKAGES = ("tokenfair.core", "tokenfair.sched", "tokenfair.runtime", "tokenfair.sim")
IMPURE = ("torch", "fastapi", "httpx", "starlette", "uvicorn", "redis", "asyncio", "datetime")
# the pure core may time its own run (a result's wall seconds), never decide on the wall clock
ALLOWED_TIME = {"perf_counter"}


def modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for p in (SRC / "tokenfair").rglob("*.py"):
        parts = p.relative_to(SRC).with_suffix("").parts
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return out


def imports(name: str, path: Path, is_pkg: bool):
    """(imported module, imported names, line) for every import in the file, nested ones too."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                target = node.module or ""
            else:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            yield target, [a.name for a in node.names], node.lineno


def graph() -> dict[str, set[str]]:
    mods = modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, (path, is_pkg) in mods.items():
        for target, names, _ in imports(m, path, is_pkg):
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in mods]
            edges[m].update(subs or ([target] if target in mods else []))
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_no_private_name_imported_from_another_module():
    mods = modules()
    bad = []
    for m, (path, is_pkg) in mods.items():
        for target, names, line in imports(m, path, is_pkg):
            if target.startswith("tokenfair") and target != "tokenfair._core":
                bad += [f"{path.relative_to(SRC)}:{line} {target}.{n}" for n in names
                        if n.startswith("_") and n != "__version__"]
    assert bad == []


@pytest.mark.parametrize("package", PURE_PACKAGES)
def test_the_pure_core_imports_no_torch_or_http(package):
    mods = modules()
    bad = []
    for m, (path, is_pkg) in mods.items():
        if m == package or m.startswith(package + "."):
            bad += [f"{m}:{line} {target}" for target, _, line in imports(m, path, is_pkg)
                    if target.split(".")[0] in IMPURE]
    assert bad == []


@pytest.mark.parametrize("package", PURE_PACKAGES)
def test_the_pure_core_reads_no_wall_clock(package):
    bad = []
    for m, (path, _) in modules().items():
        if m == package or m.startswith(package + "."):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                        and node.value.id == "time" and node.attr not in ALLOWED_TIME:
                    bad.append(f"{m}:{node.lineno} time.{node.attr}")
                if isinstance(node, ast.ImportFrom) and node.module == "time":
                    bad.append(f"{m}:{node.lineno} from time import ...")
    assert bad == []
