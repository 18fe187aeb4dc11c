"""No two product modules (nor two benchmark modules) import each other, directly or
around a loop: every import statement counts (top level, inside a function, under
TYPE_CHECKING), so a cycle cannot hide behind a lazy import. Read with ast; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "frontend", "tokenizer_worker", "detok_worker", "scheduler_worker")


def module_name(path: Path, root: Path = REPO) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str], root: Path = REPO) -> set[str]:
    """The product modules that `path` imports (a `from pkg import name` that names a
    submodule counts as importing it)."""
    here = module_name(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        out.update(n for n in names if n in modules)
    out.discard(here)
    return out


def product_graph(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    files = [p for pkg in packages for p in (root / pkg).rglob("*.py")]
    files.append(root / "launch.py")
    modules = {module_name(p, root) for p in files}
    return {module_name(p, root): imports_of(p, modules, root) for p in files}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import loop (its modules in order, the first repeated at the end), or None.
    A package importing its own submodule (`common.messages` -> `common.messages.base`)
    is a loop only if the submodule imports the package back."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return [*path[path.index(n) :], n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_finder_sees_a_lazy_import_loop(tmp_path):
    graph = {"a.worker": {"a.endpoints"}, "a.endpoints": {"a.worker"}, "a.other": set()}
    assert find_cycle(graph) == ["a.endpoints", "a.worker", "a.endpoints"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    pkg = tmp_path / "x"
    pkg.mkdir()
    (pkg / "w.py").write_text("def f():\n    from x.e import E\n")  # a lazy import
    (pkg / "e.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import w\n"
    )
    graph = {m: imports_of(pkg / f"{m[2:]}.py", {"x.w", "x.e"}, tmp_path) for m in ("x.w", "x.e")}
    assert graph == {"x.w": {"x.e"}, "x.e": {"x.w"}} and find_cycle(graph)


def test_product_packages_have_no_import_cycle():
    graph = product_graph()
    assert "tokenizer_worker.worker" in graph and len(graph) > 50
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_benchmarks_have_no_import_cycle():
    graph = product_graph(packages=(*PACKAGES, "benchmarks"))
    assert "benchmarks.serving.runner" in graph and "benchmarks.serving.workers" in graph
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])
