"""The device stays in its room (backends/): no module of the engine outside it branches on a
device's kind (a comparison with "cuda" / "cpu" or its ranks' collectives "nccl" / "gloo",
`torch.cuda`, `.is_cuda`), no model reads the C++ kernels' ISA or the decode attention's
name (it asks its op set: `one_call_decode`), and backends/ imports nothing that imports it
back (it sits below the runner, the loader and the models). Read with ast; nothing is
imported."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_import_cycles import product_graph

REPO = Path(__file__).resolve().parents[2]
ENGINE = REPO / "scheduler_worker"
ROOM = "scheduler_worker.backends"
KINDS = {"cuda", "cpu", "nccl", "gloo"}  # a device's kind, or its ranks' collectives

# file (under scheduler_worker/) -> why it may test a device's kind; none needs to today
ALLOWED: dict[str, str] = {}


def device_branches(source: str, path: str = "<src>", models: bool = False) -> list[str]:
    """Each place in `source` that tests a device's kind: "line: what"."""
    found: list[tuple[int, str]] = []

    def kind_const(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in KINDS
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(kind_const(e) for e in node.elts)
        return False

    for node in ast.walk(ast.parse(source, path)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Compare) and any(
            kind_const(x) for x in (node.left, *node.comparators)
        ):
            found.append((line, "compares with a device kind"))
        elif isinstance(node, ast.Attribute):
            base = node.value
            if node.attr == "cuda" and isinstance(base, ast.Name) and base.id == "torch":
                found.append((line, "torch.cuda"))
            elif node.attr in ("is_cuda", "is_cpu"):
                found.append((line, f".{node.attr}"))
            elif models and node.attr in ("kernel_isa", "decode_kernel"):
                found.append((line, f"a model reads the kernels' choice ({node.attr})"))
    return [f"{line}: {what}" for line, what in sorted(found)]


def test_the_scan_sees_each_kind_of_device_branch():
    src = (
        "import torch\n"
        "def f(t, device, ops):\n"
        "    if device.type == 'cuda': pass\n"
        "    if t.device.type in ('cpu', 'meta'): pass\n"
        "    if t.is_cuda: pass\n"
        "    torch.cuda.synchronize()\n"
        "    if group.backend == 'gloo': pass\n"
        "    return ops.kernel_isa, meta.decode_kernel\n"
    )
    assert [f.split(":")[0] for f in device_branches(src, models=True)] == [
        "3", "4", "5", "6", "7", "8", "8",
    ]  # fmt: skip
    assert device_branches(src)[-1] == "7: compares with a device kind"  # kernel_isa: models/
    fine = "def g(w, device):\n    return w.device.type != 'meta' and device.index == 0\n"
    assert device_branches(fine, models=True) == []


def test_no_device_branch_outside_backends():
    found: dict[str, list[str]] = {}
    for path in sorted(ENGINE.rglob("*.py")):
        rel = path.relative_to(ENGINE).as_posix()
        if rel.startswith("backends/") or rel in ALLOWED:
            continue
        hits = device_branches(path.read_text(), str(path), models=rel.startswith("models/"))
        if hits:
            found[rel] = hits
    assert not found, (
        f"device branches outside backends/ (ask a Backend, or backends/device.py): {found}"
    )
    assert len(list(ENGINE.rglob("*.py"))) > 50  # the scan saw the engine


def by_folder(graph: dict[str, set[str]], top: str = "scheduler_worker") -> dict[str, set[str]]:
    """The import graph with each subpackage of `top` as one node (quant.linear and
    quant.fp8 are scheduler_worker.quant): a folder is a room of its own."""

    def unit(m: str) -> str:
        parts = m.split(".")
        return ".".join(parts[:2]) if parts[0] == top else m

    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        out.setdefault(unit(m), set()).update(unit(n) for n in targets)
    for u, targets in out.items():
        targets.discard(u)
    return out


def upward_imports(graph: dict[str, set[str]], room: str = ROOM) -> list[str]:
    """Each import "m -> n" of `room` (a module of it, or the folder itself) whose target
    n (outside it) reaches the room again through its own imports."""

    def inside(m: str) -> bool:
        return m == room or m.startswith(room + ".")

    def reaches_room(start: str) -> bool:
        seen, todo = {start}, [start]
        while todo:
            for n in graph.get(todo.pop(), ()):
                if inside(n):
                    return True
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return False

    return sorted(
        f"{m} -> {n}"
        for m in graph
        if inside(m)
        for n in graph[m]
        if not inside(n) and reaches_room(n)
    )


def test_the_import_check_sees_an_upward_import():
    graph = {
        "x.backends.cpu": {"x.loader", "x.backends.ops", "x.kv_pool", "x.quant.linear"},
        "x.backends.ops": {"x.attention"},
        "x.loader": {"x.models"},
        "x.models": {"x.backends.ops"},
        "x.quant.linear": set(),
        "x.quant.fp8": {"x.backends.ops"},
        "x.attention": set(),
        "x.kv_pool": set(),
    }
    assert upward_imports(graph, "x.backends") == ["x.backends.cpu -> x.loader"]
    graph["x.backends.cpu"].discard("x.loader")
    assert upward_imports(graph, "x.backends") == []
    # a folder that another of its modules ties to backends/ is above it too
    assert upward_imports(by_folder(graph, "x"), "x.backends") == ["x.backends -> x.quant"]


def test_backends_import_nothing_above_them():
    """backends/ imports no module, nor any module of a folder, that reaches backends/
    again: the room sits below everything that uses it (the loader, the models, quant/,
    the runner)."""
    graph = product_graph()
    assert sum(m.startswith(ROOM) for m in graph) > 10 and "scheduler_worker.loader" in graph
    assert not upward_imports(graph), upward_imports(graph)
    folders = by_folder(graph)
    assert ROOM in folders and "scheduler_worker.quant" in folders
    assert not upward_imports(folders), upward_imports(folders)
