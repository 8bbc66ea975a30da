"""The shape of the code, checked: the rules docs/architecture.md states, in one place.

- **Layers.** Imports run one way only: cli -> cluster -> api -> engine (+ gc) -> storage -> core.
  A module may import modules of its own layer and of the layers below it, never above, and
  packages import each other in no cycle (within a layer too: a cycle is two packages that
  cannot be read, tested or changed apart). Every import counts: at module level, inside
  functions, and under ``if TYPE_CHECKING:`` (an import that runs late, or only for mypy, still
  ties two packages together for a reader and for the type checker). In storage, ``tiered.hot``
  and ``tiered.cold`` import nothing of each other (hot is a true leaf); ``tiered_client``, the
  Python client shipped beside the server, imports nothing of the server.
- **No module cycles.** No module imports itself back at import time (the imports that run when
  a module is imported: module level, outside ``if TYPE_CHECKING:``).
- **A core that speaks no HTTP.** Below the api layer (and the cluster's own modules, and the
  SSE framing of the api), nothing imports an HTTP library or names a status code or an HTTP
  header: refusals are codes. Named exceptions are the HTTP clients (``NO_HTTP_EXCEPT``).
- **One clock, one error mapper.** Only ``tiered/core/clock.py`` reads the time; only
  ``tiered/api/kit/errors.py`` maps codes to statuses.
- **Small functions.** No function is over ``MAX_FUNCTION_LINES`` lines, but those of
  ``LONG_FUNCTIONS``, each with the reason it is still long (an entry is dropped once its
  function is short).

For cycles between packages, a *package* is a module's own package, except that each module
directly in a layer's root (``tiered/engine/engine.py``, ``tiered/engine/codec.py``,
``tiered/api/app.py``, ``tiered/cluster/server.py``...) counts as a package of its own.

``python tests/test_architecture.py`` lists every import that breaks the layers, by layer
pair, and the modules with the most of them.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections import Counter
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------- the code


@cache
def package_dirs() -> dict[str, Path]:
    """Each top-level package and its folder, as setuptools maps them (pyproject's package-dir)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {package: ROOT / folder for package, folder in config["tool"]["setuptools"]["package-dir"].items()}


@cache
def modules() -> dict[str, Path]:
    """Every module by its dotted name (``tiered.hot.log`` is ``hot/log.py``)."""
    out: dict[str, Path] = {}
    for package, directory in package_dirs().items():
        for path in sorted(directory.rglob("*.py")):
            parts = [p for p in path.relative_to(directory).with_suffix("").parts if p != "__init__"]
            out.setdefault(".".join([package, *parts]), path)
    return out


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run when the module is imported: module level, into ``if``/``try``
    blocks, but not into functions, classes' methods or ``if TYPE_CHECKING:``."""
    for node in body:
        if isinstance(node, ast.If):
            if not _is_type_checking(node):
                yield from _import_time_statements(node.body)
                yield from _import_time_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _import_time_statements(block)
        else:
            yield node


def imports(name: str, path: Path, known: set[str], *, import_time: bool = False) -> set[str]:
    """The modules ``name`` imports: wherever the import statement is, or (``import_time``) those
    that run when it is imported. ``from m import x`` is ``m.x`` if that is a module, else ``m``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    statements = _import_time_statements(tree(path).body) if import_time else ast.walk(tree(path))
    found: set[str] = set()

    def closest(module: str) -> str:
        while module and module not in known:
            module = module.rpartition(".")[0]
        return module

    for node in statements:
        if isinstance(node, ast.Import):
            found.update(closest(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                found.add(closest(f"{module}.{alias.name}"))
    return {m for m in found if m and m != name}


# ---------------------------------------------------------------------------------------- layers

# Lowest first. A module belongs to the layer of the longest package prefix it matches.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("tiered.core",)),
    ("storage", ("tiered.hot", "tiered.cold")),
    ("engine", ("tiered.engine", "tiered.gc")),
    ("api", ("tiered.api",)),
    ("cluster", ("tiered.cluster",)),
    ("cli", ("tiered.cli",)),
]
# Packages of one layer that import nothing of each other.
SIBLINGS = [("tiered.hot", "tiered.cold")]
# Packages outside the layers that import nothing of the server.
STANDALONE = ("tiered_client",)
# Packages whose own modules are each a package of their own for the cycle check.
SPLIT = ("tiered.engine", "tiered.api", "tiered.cluster", "tiered.cli", "tiered.cold")


def layer_of(name: str) -> tuple[int, str] | None:
    """(rank, package) of the longest layer package ``name`` is in."""
    best: tuple[int, str] | None = None
    for rank, (_, packages) in enumerate(LAYERS):
        for package in packages:
            if (name == package or name.startswith(package + ".")) and (
                best is None or len(package) > len(best[1])
            ):
                best = (rank, package)
    return best


def _standalone(name: str) -> str | None:
    return next((p for p in STANDALONE if name == p or name.startswith(p + ".")), None)


def package_of(name: str, path: Path) -> str:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return name if package in SPLIT else package


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


class Violation(NamedTuple):
    importer: str  # a module; for a cycle, a package
    imported: str
    why: str
    via: tuple[str, ...] = ()  # for a cycle, the imports that make the package depend on the other


def violations() -> list[Violation]:
    """Every module import against the layers, and every package dependency in a cycle, sorted."""
    mods = modules()
    known = set(mods)
    out: list[Violation] = []
    edges: list[tuple[str, str]] = []
    for name, path in sorted(mods.items()):
        source = layer_of(name)
        for target in sorted(imports(name, path, known)):
            edges.append((name, target))
            if _standalone(name):
                if not _standalone(target):
                    out.append(Violation(name, target, f"{_standalone(name)} imports the server"))
                continue
            into = layer_of(target)
            if source is None or into is None:
                continue  # unplaced modules fail test_every_module_has_a_layer
            if into[0] > source[0]:
                out.append(Violation(name, target, f"{LAYERS[source[0]][0]} -> {LAYERS[into[0]][0]}"))
            elif {source[1], into[1]} in [set(pair) for pair in SIBLINGS] and source[1] != into[1]:
                out.append(Violation(name, target, f"{source[1]} -> {into[1]} (siblings)"))
    unit = {name: package_of(name, path) for name, path in mods.items()}
    via: dict[tuple[str, str], list[str]] = {}
    for src, dst in edges:
        if unit[src] != unit[dst]:
            via.setdefault((unit[src], unit[dst]), []).append(f"{src} -> {dst}")
    graph: dict[str, set[str]] = {}
    for src, dst in via:
        graph.setdefault(src, set()).add(dst)
    for component in cycles(graph):
        label = "package cycle: " + ", ".join(sorted(component))
        for (src, dst), imports_ in sorted(via.items()):
            if src in component and dst in component:
                out.append(Violation(src, dst, label, tuple(imports_)))
    return sorted(out)


def report(found: list[Violation]) -> str:
    lines = [
        f"{len(found)} violations: module imports that go up a layer "
        "(cli -> cluster -> api -> engine -> storage -> core), package dependencies in a cycle"
    ]
    by_kind = Counter(v.why for v in found)
    for why, count in sorted(by_kind.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"\n  {why}: {count}")
        for v in found:
            if v.why == why:
                lines.append(
                    f"    {v.importer} -> {v.imported}" + (f"   via {', '.join(v.via)}" if v.via else "")
                )
    top = Counter(v.importer for v in found).most_common(8)
    lines.append("\n  importers with the most: " + ", ".join(f"{src} ({n})" for src, n in top))
    top_targets = Counter(v.imported for v in found).most_common(8)
    lines.append("  imported the most: " + ", ".join(f"{dst} ({n})" for dst, n in top_targets))
    return "\n".join(lines)


def test_every_module_has_a_layer() -> None:
    unplaced = [n for n in modules() if n != "tiered" and layer_of(n) is None and not _standalone(n)]
    assert not unplaced, f"modules in no layer (add their package to LAYERS): {unplaced}"


def test_imports_follow_the_layers() -> None:
    found = violations()
    assert not found, report(found)


# ---------------------------------------------------------------------------------------- module cycles


def test_no_import_cycles() -> None:
    """No module is imported again while it is being imported (import-time imports only)."""
    mods = modules()
    known = set(mods)
    graph = {name: imports(name, path, known, import_time=True) for name, path in mods.items()}
    for name in list(graph):  # importing a submodule runs its package's __init__ first
        parent = name.rpartition(".")[0]
        if parent in graph:
            graph[name].add(parent)
    for name in graph:  # a package importing its own submodule is no cycle
        graph[name] = {m for m in graph[name] if not m.startswith(name + ".")}
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(a_cycle(graph, c)) for c in found)


def a_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One shortest cycle through the first module of a strongly connected ``component``."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    return sorted(component)


# ---------------------------------------------------------------------------------------- HTTP

# Modules below the api layer (and of the cluster) that do speak HTTP, and why.
NO_HTTP_EXCEPT = {
    "tiered.core.errors": "the code table notes each code's status and headers, which api/kit/errors.py sets",
    "tiered.core.config": "settings' help tells the operator what clients get (503 + Retry-After)",
    "tiered.cold.objects.s3": "the S3 client: its transport (aiohttp, under aiobotocore) fails with aiohttp's errors",
    "tiered.engine.subscriptions.delivery": "the webhook sender, an HTTP client",
    "tiered.cluster.gateway.forward": "sends a request on to the node serving its shard",
}
# Pure modules of the api layer held to the same rule.
NO_HTTP_ALSO = (
    "tiered.api.routes.sse",
)  # SSE framing: the read path decides what to send, this how it looks


def _below_api_or_cluster(name: str) -> bool:
    layer = layer_of(name)
    return layer is not None and (LAYERS[layer[0]][0] in ("core", "storage", "engine", "cluster"))


def test_the_core_speaks_no_http() -> None:
    """State machines, the journal, storage, background jobs and the cluster's protocol import no HTTP
    library, name no status code and set no HTTP header: refusals are codes (TieredError(ErrorCode.X))."""
    mods = modules()
    assert set(NO_HTTP_EXCEPT) | set(NO_HTTP_ALSO) <= set(mods), "a named module is gone: update the lists"
    checked = [
        (name, path)
        for name, path in mods.items()
        if (_below_api_or_cluster(name) and name not in NO_HTTP_EXCEPT) or name in NO_HTTP_ALSO
    ]
    assert len(checked) > 100
    speaking = []
    for name, path in checked:
        text = path.read_text()
        if re.search(r"^\s*(import|from) (aiohttp|granian)\b", text, re.M):
            speaking.append(f"{name} imports an HTTP library")
        if re.search(r"Error\(\s*[1-5]\d\d\b", text):
            speaking.append(f"{name} raises a status")
        if "Retry-After" in text or "WWW-Authenticate" in text:
            speaking.append(f"{name} names an HTTP header")
    assert not speaking, "\n".join(speaking)


# ---------------------------------------------------------------------------------------- clock, errors


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


# ---------------------------------------------------------------------------------------- function length

MAX_FUNCTION_LINES = 120
# Functions still longer, each with the reason (module:qualified name). Remove an entry when its
# function is short: the test fails on an entry that is no longer needed.
LONG_FUNCTIONS = {}


def functions() -> Iterator[tuple[str, int]]:
    """Every function and method (nested ones too) as ``module:qualified.name``, and its length in
    lines (from ``def`` to its last line, docstring and comments included)."""

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qualified = f"{prefix}{child.name}"
                assert child.end_lineno is not None
                yield qualified, child.end_lineno - child.lineno + 1
                yield from visit(child, qualified + ".")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")
            else:
                yield from visit(child, prefix)

    for name, path in modules().items():
        for qualified, length in visit(tree(path), ""):
            yield f"{name}:{qualified}", length


def test_no_function_is_over_the_line_limit() -> None:
    lengths = dict(functions())
    assert len(lengths) > 1000
    too_long = {f: n for f, n in lengths.items() if n > MAX_FUNCTION_LINES and f not in LONG_FUNCTIONS}
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines (split them): " + ", ".join(
        f"{f} ({n})" for f, n in sorted(too_long.items(), key=lambda kv: -kv[1])
    )
    stale = [f for f in LONG_FUNCTIONS if lengths.get(f, 0) <= MAX_FUNCTION_LINES]
    assert not stale, (
        f"no longer over {MAX_FUNCTION_LINES} lines (or gone): remove from LONG_FUNCTIONS: {stale}"
    )


if __name__ == "__main__":
    print(report(violations()))
    sys.exit(0)


def test_every_package_is_in_the_distribution() -> None:
    """A package left out of pyproject's list is missing from the wheel (and so from every deployed node)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(project["packages"])
    dirs = {"tiered": ROOT / "tiered", **{f"tiered.{name}": ROOT / name for name in ("hot", "cold", "gc")}}
    found = set()
    for prefix, top in dirs.items():
        for init in top.rglob("__init__.py"):
            rel = init.parent.relative_to(top).parts
            found.add(".".join((prefix, *rel)) if rel else prefix)
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
