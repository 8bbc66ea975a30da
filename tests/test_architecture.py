"""The shape of the code, checked: no import cycles, a core that speaks no HTTP, one clock, one error mapper.

Module-level imports only (``if TYPE_CHECKING:`` blocks and imports inside
functions are not edges: they do not run at import time).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "tiered": ROOT / "tiered",
    "tiered.hot": ROOT / "hot",
    "tiered.cold": ROOT / "cold",
    "tiered.gc": ROOT / "gc",
}


def modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package, directory in PACKAGES.items():
        for path in directory.rglob("*.py"):
            rel = path.relative_to(directory).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([package, *parts])
            if directory == ROOT / "tiered" and parts and parts[0] in ("hot", "cold", "gc"):
                continue
            out[name] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def module_imports(name: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text())
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and _is_type_checking(node):
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                found.add(mod)
                for alias in node.names:
                    found.add(f"{mod}.{alias.name}")
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))

    visit(tree.body)
    return {m for m in found if m in known and m != name}


def test_no_import_cycles() -> None:
    mods = modules()
    known = set(mods)
    graph = {name: module_imports(name, path, known) for name, path in mods.items()}
    # Importing a submodule runs its package's __init__ first.
    for name in list(graph):
        parent = name.rpartition(".")[0]
        if parent in graph and parent != name:
            graph[name].add(parent)
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def dfs(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt.startswith(node + "."):
                continue  # a package importing its own submodule
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                dfs(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            dfs(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_core_speaks_no_http() -> None:
    """State machines, the journal and background jobs import no HTTP library and name no status code."""
    core = [
        p
        for name, p in modules().items()
        if name.startswith(
            (
                "tiered.engine.streams",
                "tiered.engine.journal",
                "tiered.engine.codec",
                "tiered.engine.groups",
                "tiered.engine.subscriptions",
                "tiered.gc",
                "tiered.cluster",
                "tiered.engine.auth",
                "tiered.engine.tenants",
            )
        )
        and not name.endswith((".http", ".client", ".delivery", ".forward", ".shard_router"))
    ]
    assert len(core) > 20
    for path in core:
        text = path.read_text()
        assert not re.search(r"^\s*(import|from) (aiohttp|granian)", text, re.M), path
        # Refusals are codes (TieredError(ErrorCode.X, ...)), never a status and never headers.
        assert not re.search(r"Error\(\s*[1-5]\d\d\b", text), path
        assert "Retry-After" not in text and "WWW-Authenticate" not in text, path


def test_one_clock_and_one_error_mapper() -> None:
    for name, path in modules().items():
        text = path.read_text()
        if name != "tiered.core.clock":
            assert not re.search(r"\btime\.time\(\)|\btime\.monotonic\(\)", text) or name in (
                "tiered.cold.objects.localdir",  # staging files are judged by the file system's own clock
            ), f"{name} reads the clock itself"
        if name != "tiered.api.kit.errors":
            assert "STATUS[" not in text, name


def test_no_untyped_service_parameters() -> None:
    for name, path in modules().items():
        assert "not imported: it imports us" not in path.read_text(), name
