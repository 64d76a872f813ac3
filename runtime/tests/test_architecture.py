"""The layering of ``runtime/src/haze`` (docs/architecture.md), checked on the source.

Every module belongs to a layer, and a module imports only its own layer and the layers
below it: never upward, and never a haze module inside a function (an import that has to
hide in a function is a cycle waiting to happen). Only optional third-party clients are
imported lazily. An import under ``if TYPE_CHECKING:`` counts as an import for the
layering (a lower layer that names ``App`` for a type still depends on it); only the
cycle check leaves it out, since it never runs. The module graph has no cycle at all, so
import order never matters.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"

#: Lowest first. A module's layer is the longest prefix of its dotted name listed here.
LAYERS: list[tuple[str, ...]] = [
    ("haze._base",),
    ("haze.contracts",),
    ("haze.drivers", "haze.stores", "haze.connectors", "haze._failed", "haze.offload"),
    ("haze._jobs", "haze.transactions"),
    ("haze._engine",),
    ("haze._orchestration", "haze._workflows"),
    ("haze._workers",),
    ("haze._app",),
    # The public facades, and the public paths of kernel modules users import from.
    (
        "haze.api",
        "haze.testing",
        "haze.errors",
        "haze.ids",
        "haze.crypto",
        "haze.otel",
        "haze.driver_api",
    ),
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


def imports(
    module: str, path: pathlib.Path, *, typing_only: bool = False
) -> Iterator[tuple[str, int, bool]]:
    """(imported haze module, line, inside a function) for each import in ``path``; with
    ``typing_only`` the imports under ``if TYPE_CHECKING:`` too."""
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
                body = [*child.body, *child.orelse] if typing_only else child.orelse
                yield from walk(ast.Module(body=body, type_ignores=[]), in_function)
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
        for target, line, _ in imports(module, path, typing_only=True)
        if layer_of(target) > layer_of(module)
    ]
    assert not wrong, "upward imports:\n" + "\n".join(wrong)


def test_an_import_under_type_checking_counts(tmp_path: pathlib.Path) -> None:
    """The upward-import check sees an annotation-only import as the import it is."""
    source = tmp_path / "dispatcher.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from haze._app.app import App\n"
        "else:\n"
        "    from haze._base import errors\n"
    )
    found = [t for t, _, _ in imports("haze._engine.dispatcher", source, typing_only=True)]
    assert found == ["haze._app.app", "haze._base"]
    assert [t for t, _, _ in imports("haze._engine.dispatcher", source)] == ["haze._base"]


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


def test_no_layer_below_the_app_names_it_even_in_a_string() -> None:
    """``importlib.import_module("haze._app.app")`` is an upward import the import check
    cannot see: the layers below the app get what they need handed down instead."""
    app_layer = layer_of("haze._app")
    wrong = [
        f"{path.relative_to(SRC)}:{node.lineno} names {node.value!r}"
        for module, path in ALL
        if layer_of(module) < app_layer
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("haze._app")
    ]
    assert not wrong, "\n".join(wrong)


def test_the_apps_private_attributes_are_read_only_by_the_app() -> None:
    """Other modules read an App through its AppView (``open_drivers()``, ``implicit``)."""
    private = {"_drivers", "_implicit"}
    wrong = [
        f"{path.relative_to(SRC)}:{node.lineno} reads .{node.attr}"
        for module, path in ALL
        if not module.startswith("haze._app")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in private
    ]
    assert not wrong, "\n".join(wrong)


#: The adapters and the infrastructure package: they build on haze's public names only
#: (``haze``, ``haze.driver_api``, ``haze.contracts``, ...), never on a private module.
OUTSIDE = [
    SRC.parents[1] / "adapters" / "cloudflare" / "src",
    SRC.parents[1] / "adapters" / "lambda" / "src",
    SRC.parents[1] / "infra" / "src",
]


def private_imports(path: pathlib.Path) -> Iterator[tuple[int, str]]:
    """(line, module) for each import of a private haze module in ``path``, wherever it
    is: at the top, inside a function or under ``if TYPE_CHECKING:``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            base = node.module or ""
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "haze" and any(p.startswith("_") for p in parts[1:]):
                yield node.lineno, name
                break


def test_the_adapters_and_infra_import_no_private_haze_module() -> None:
    wrong = [
        f"{path.relative_to(SRC.parents[1])}:{line} imports {name}"
        for root in OUTSIDE
        for path in sorted(root.rglob("*.py"))
        for line, name in private_imports(path)
    ]
    assert not wrong, "use haze.driver_api (or another public path):\n" + "\n".join(wrong)


# ----------------------------------------------------------------------------- size and parsers

REPO = SRC.parents[1]
#: The source trees held to the house rules: the runtime, each adapter and the infra.
SOURCE_TREES = [SRC, *sorted(REPO.glob("adapters/*/src")), REPO / "infra" / "src"]
MAX_MODULE_LINES = 600


def source_files() -> Iterator[pathlib.Path]:
    for tree in SOURCE_TREES:
        yield from sorted(tree.rglob("*.py"))


def test_the_trees_checked_are_there() -> None:
    assert len(SOURCE_TREES) >= 4, SOURCE_TREES  # runtime, two adapters, infra
    assert all(tree.is_dir() for tree in SOURCE_TREES), SOURCE_TREES


def test_no_module_longer_than_six_hundred_lines() -> None:
    long = [
        f"{path.relative_to(REPO)} is {n} lines"
        for path in source_files()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, (
        f"modules over {MAX_MODULE_LINES} lines (split by what a reader looks for):\n"
        + "\n".join(long)
    )


#: The one module that parses a message's JSON: ``decode`` (a ``Message``, checked),
#: ``envelope_of`` (the object, unchecked) and the helpers that rewrite a body.
ENVELOPE_PARSER = SRC / "haze" / "_base" / "message.py"
_JSON_MODULES = {"json", "_json", "orjson", "ujson", "simplejson", "rapidjson"}


def _is_json_decoder(func: ast.expr) -> bool:
    """``json.loads``/``json.load`` (or another JSON library's), or a bare ``loads``."""
    if isinstance(func, ast.Attribute) and func.attr in ("loads", "load", "decode"):
        value = func.value
        if isinstance(value, ast.Name) and value.id in _JSON_MODULES:
            return True
        # msgspec.json.decode
        return isinstance(value, ast.Attribute) and value.attr == "json" and func.attr == "decode"
    return isinstance(func, ast.Name) and func.id == "loads"


def _is_message_body(arg: ast.expr) -> bool:
    """A message body: a local named ``body`` or ``..._body``, or another object's
    ``.body`` (``job.body``, ``record.body``). A class reading its own ``self.body`` (an
    HTTP response) holds no message."""
    while isinstance(arg, ast.Call) and arg.args:  # str(body), bytes(job.body)
        arg = arg.args[0]
    if isinstance(arg, ast.Name):
        return arg.id == "body" or arg.id.endswith("_body")
    if isinstance(arg, ast.Attribute) and (arg.attr == "body" or arg.attr.endswith("_body")):
        return not (isinstance(arg.value, ast.Name) and arg.value.id == "self")
    return False


def _encoded_here(scope: ast.AST) -> set[str]:
    """Names ``scope`` assigns a ``json.dumps(...)`` to: a value it encoded itself and
    reads back (a round trip), not a message body."""
    return {
        target.id
        for node in ast.walk(scope)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute)
        and node.value.func.attr == "dumps"
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _innermost_function(tree: ast.Module, line: int) -> ast.AST:
    """The function whose body holds ``line`` most closely (the module when none)."""
    around = [
        node
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.lineno <= line <= (node.end_lineno or node.lineno)
    ]
    return max(around, key=lambda node: node.lineno) if around else tree


def second_envelope_parsers(path: pathlib.Path) -> list[str]:
    """Where ``path`` runs a JSON decoder on a message body itself (not on a value the
    same function encoded)."""
    if path == ENVELOPE_PARSER:
        return []
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and _is_json_decoder(node.func)
            and node.args
            and _is_message_body(node.args[0])
        ):
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Name) and arg.id in _encoded_here(
            _innermost_function(tree, node.lineno)
        ):
            continue
        found.append(f"{path.relative_to(REPO)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_the_envelope_rule_sees_a_second_parser(tmp_path: pathlib.Path) -> None:
    sample = tmp_path / "driver.py"
    sample.write_text(
        "import json\n"
        "def a(body): return json.loads(body)\n"
        "def b(job): return json.loads(job.body)\n"
        "def c(raw_body): return json.loads(str(raw_body))\n"
        "def d(self): return json.loads(self.body)\n"  # an HTTP response's own body
        "def e(text): return json.loads(text)\n"
        "def f(v):\n    body = json.dumps(v)\n    return json.loads(body)\n"  # a round trip
    )
    found = [line.split(" ", 1)[0].rsplit(":", 1)[1] for line in _relative(sample)]
    assert found == ["2", "3", "4"]


def _relative(path: pathlib.Path) -> list[str]:
    global REPO
    saved, REPO = REPO, path.parent
    try:
        return second_envelope_parsers(path)
    finally:
        REPO = saved


def test_one_envelope_parser() -> None:
    found = [hit for path in source_files() for hit in second_envelope_parsers(path)]
    assert not found, (
        "a message body is parsed outside haze._base.message (use decode or envelope_of, "
        "or Reserved.delivered for a delivered message):\n" + "\n".join(found)
    )
