"""The layering of ``runtime/src/haze`` (docs/architecture.md), checked on the source.

Every module belongs to a layer, and a module imports only its own layer and the layers
below it: never upward, and never a haze module inside a function (an import that has to
hide in a function is a cycle waiting to happen). Only optional third-party clients are
imported lazily. Imports under ``if TYPE_CHECKING:`` are annotations, not imports, and
are left out. The module graph also has no cycle at all, so import order never matters.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"

#: Lowest first. A module's layer is the longest prefix of its dotted name listed here.
LAYERS: list[tuple[str, ...]] = [
    ("haze._kernel",),
    ("haze.contracts",),
    ("haze.drivers", "haze.stores", "haze.database", "haze._failed"),
    ("haze._jobs", "haze.transactions"),
    ("haze._engine",),
    ("haze._orchestration", "haze._workflows"),
    ("haze._runners",),
    ("haze._app",),
    # The public facades, and the public paths of kernel modules users import from.
    ("haze.api", "haze.testing", "haze.errors", "haze.ids", "haze.crypto", "haze.otel"),
    ("haze.cli", "haze.build", "haze.integrations", "haze.dashboard"),
    ("haze",),
]


def layer_of(module: str) -> int:
    best, rank = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    assert rank >= 0, f"{module} is in no layer: add it to LAYERS and docs/architecture.md"
    return rank


def modules() -> Iterator[tuple[str, pathlib.Path]]:
    for path in sorted(SRC.joinpath("haze").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def imports(module: str, path: pathlib.Path) -> Iterator[tuple[str, int, bool]]:
    """(imported haze module, line, inside a function) for each import in ``path``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def targets(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        base = node.module or ""
        if node.level:
            parent = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*parent, *([base] if base else [])])
        if base == "haze":  # `from haze import testing` names submodules or re-exports
            return [
                f"haze.{a.name}"
                if (SRC / "haze" / a.name).exists() or (SRC / "haze" / f"{a.name}.py").exists()
                else "haze"
                for a in node.names
            ]
        return [base]

    def walk(node: ast.AST, in_function: bool) -> Iterator[tuple[str, int, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from (
                    x for x in walk(ast.Module(body=child.orelse, type_ignores=[]), in_function)
                )
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in targets(child):
                    if target == "haze" or target.startswith("haze."):
                        yield target, child.lineno, in_function
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            yield from walk(child, inner)

    yield from walk(ast.parse(path.read_text()), False)


ALL = list(modules())


def test_every_module_has_a_layer() -> None:
    for module, _ in ALL:
        layer_of(module)


def test_no_upward_import() -> None:
    wrong = [
        f"{path.relative_to(SRC)}:{line} {module} ({layer_of(module)}) imports {target} "
        f"({layer_of(target)})"
        for module, path in ALL
        for target, line, _ in imports(module, path)
        if layer_of(target) > layer_of(module)
    ]
    assert not wrong, "upward imports:\n" + "\n".join(wrong)


def test_no_haze_import_inside_a_function() -> None:
    wrong = [
        f"{path.relative_to(SRC)}:{line} imports {target} inside a function"
        for module, path in ALL
        for target, line, inside in imports(module, path)
        if inside
    ]
    assert not wrong, "\n".join(wrong)


def test_the_module_graph_has_no_cycle() -> None:
    known = {m for m, _ in ALL}
    graph: dict[str, set[str]] = {m: set() for m in known}
    for module, path in ALL:
        for target, _, inside in imports(module, path):
            # `import haze.a.b` runs haze/__init__ and haze/a/__init__ too, but those
            # package inits are the top of the graph, so the edge that matters is to b.
            if not inside and target in known and target != module:
                graph[module].add(target)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_no_function_longer_than_sixty_lines() -> None:
    long = [
        f"{path.relative_to(SRC)}:{node.lineno} {node.name} is "
        f"{node.end_lineno - node.lineno + 1} lines"  # type: ignore[operator]
        for _, path in ALL
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > 60  # type: ignore[operator]
    ]
    assert not long, "\n".join(long)
