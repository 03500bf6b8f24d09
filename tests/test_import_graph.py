"""No import cycle in tpumon, and data flows one way, down the layers of :data:`LAYERS`:
sources -> detector -> diagnosis -> state -> store, notifiers, metrics, web -> agent ->
client, CLI. Checked statically over the source (no import runs), for
every import a module makes: when it loads (top level, ``try`` and ``if`` included) and
inside its functions (a lazy import closes a circle as surely, once it runs);
``if TYPE_CHECKING:`` blocks left out, since they never run.

Two levels: modules (``tpumon.notify.alerts``), and the units under ``tpumon``
(``tpumon.notify``, ``tpumon.state``): a unit that imports another which imports it back
is a knot even when no two modules close the loop (the poll state once carried the
notifier's health while the notifier read the poll state)."""

from __future__ import annotations

import ast
import gc
from pathlib import Path
from typing import Iterator

import pytest

import tpumon

ROOT = Path(tpumon.__file__).parent

#: tpumon's units from the bottom up: a unit imports only units of layers below its own
#: (docs/architecture.md). A new package goes in here, or test_every_unit_has_a_layer fails.
LAYERS: list[set[str]] = [
    {"tpumon", "tpumon.instrument"},  # the version; the reporters (standard library only)
    {"tpumon.common"},  # configuration, records, units, text: what every layer shares
    {"tpumon.podresources", "tpumon.trace"},  # generated protos; the trace file format
    {"tpumon.sources"},  # polling: plain records out
    {"tpumon.detect"},  # the leak detector: pure computation
    {"tpumon.diagnose"},  # processes, job ends, snapshots asked for
    {"tpumon.state"},  # the poll state, published whole
    {"tpumon.store"},  # readers of the poll state ...
    {"tpumon.notify"},
    {"tpumon.metrics"},  # ... which reads the store's and the notifiers' health
    {"tpumon.web"},  # ... which serves metrics
    {"tpumon.sim", "tpumon.report"},  # the simulator (its fake agents serve web's status)
    {"tpumon.agent"},  # the daemon: wires all of the above
    {"tpumon.client"},  # asks agents over HTTP
    {"tpumon.cli"},
    {"tpumon.__main__"},
]

#: What reads the poll state: the poll state imports none of them.
READERS_OF_STATE = {"tpumon.notify", "tpumon.store", "tpumon.metrics", "tpumon.web",
                    "tpumon.sim", "tpumon.report", "tpumon.agent", "tpumon.client", "tpumon.cli"}


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its __init__.py)."""
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _all_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, outside ``if TYPE_CHECKING:`` blocks."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _all_imports(node.orelse)
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(node, field, ()):
                    yield from _all_imports([child] if isinstance(child, ast.stmt)
                                            else child.body)


def _is_type_checking(test: ast.expr) -> bool:
    name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", "")
    return name == "TYPE_CHECKING"


def _load_time_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", "")
            if name != "TYPE_CHECKING":
                yield from _load_time_imports(node.body)
            yield from _load_time_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody,
                          *(h.body for h in node.handlers)):
                yield from _load_time_imports(block)


def _imported_names(module: str, is_package: bool, node: ast.Import | ast.ImportFrom
                    ) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the module's package, up level - 1
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def parse(source: str) -> ast.Module:
    """ast.parse, with the garbage collector off while it runs, and once more on CPython
    3.11's spurious "AST constructor recursion depth mismatch" (a SystemError, fixed in
    3.11.9: gh-106905), which a collection running finalizers mid-parse can raise."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        try:
            return ast.parse(source)
        except SystemError:
            return ast.parse(source)
    finally:
        if enabled:
            gc.enable()


def import_graph(lazy: bool = False) -> dict[str, set[str]]:
    """Module -> the tpumon modules it imports when loaded, or with ``lazy`` at all
    (packages on the way included, as Python runs their __init__ first; a module's own
    packages left out)."""
    known = modules()
    graph: dict[str, set[str]] = {}
    found = _all_imports if lazy else _load_time_imports
    for module, path in known.items():
        deps = set()
        for node in found(parse(path.read_text()).body):
            for name in _imported_names(module, path.name == "__init__.py", node):
                parts = name.split(".")
                for i in range(1, len(parts) + 1):
                    dep = ".".join(parts[:i])
                    if dep in known and dep != module and not module.startswith(dep + "."):
                        deps.add(dep)
        graph[module] = deps
    return graph


def units(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between tpumon's units (its subpackages and top-level modules)."""
    def unit(module: str) -> str:
        return ".".join(module.split(".")[:2])

    out: dict[str, set[str]] = {}
    for module, deps in graph.items():
        out.setdefault(unit(module), set()).update(
            unit(d) for d in deps if unit(d) != unit(module))
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_checker_finds_a_cycle():
    """The check can fail: a loop three deep, and one between units."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = {"tpumon.notify.alerts": {"tpumon.state"}, "tpumon.notify.health": set(),
             "tpumon.state": {"tpumon.notify.health"}}
    assert cycles(graph) == []
    assert cycles(units(graph)) == [["tpumon.notify", "tpumon.state"]]


def test_the_graph_sees_tpumons_imports():
    graph = import_graph()
    assert "tpumon.state" in graph["tpumon.agent.loop"]
    assert "tpumon.notify.alerts" in graph["tpumon.agent.loop"]
    assert "tpumon.notify" in graph["tpumon.agent.loop"]  # its package's __init__ runs first


def layer_of(unit: str) -> int | None:
    return next((i for i, layer in enumerate(LAYERS) if unit in layer), None)


def upward(unit_graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every import of a unit from its own layer or one above it."""
    found = []
    for unit, deps in sorted(unit_graph.items()):
        level = layer_of(unit)
        for dep in sorted(deps):
            dep_level = layer_of(dep)
            if level is not None and dep_level is not None and dep_level >= level:
                found.append((unit, dep))
    return found


def test_the_checker_finds_an_upward_import():
    graph = {"tpumon.sources.reports": {"tpumon.diagnose.processes"},
             "tpumon.diagnose.processes": {"tpumon.sources.reports"}}
    assert upward(units(graph)) == [("tpumon.sources", "tpumon.diagnose")]
    assert upward({"tpumon.store": {"tpumon.state"}, "tpumon.sim": {"tpumon.report"}}) == [
        ("tpumon.sim", "tpumon.report")]


def test_every_unit_has_a_layer():
    unplaced = sorted(u for u in units(import_graph()) if layer_of(u) is None)
    assert not unplaced, f"units in no layer of LAYERS: {unplaced}"


@pytest.mark.slow
def test_no_import_runs_up_the_layers():
    """Imports inside functions counted: a lazy import up the layers is a circle waiting."""
    found = upward(units(import_graph(lazy=True)))
    assert not found, f"imports from a unit's own layer or above: {found}"


@pytest.mark.parametrize("level", ["modules", "units"])
@pytest.mark.slow
def test_no_import_cycle(level):
    graph = import_graph(lazy=True)
    found = cycles(graph if level == "modules" else units(graph))
    assert not found, f"import cycles between {level}: {found}"


def test_the_checker_sees_imports_inside_functions():
    tree = parse("import os\nif TYPE_CHECKING:\n    import tpumon.a\n"
                 "def f():\n    try:\n        from tpumon import b\n    except E:\n"
                 "        import tpumon.c\n    with x:\n        import tpumon.d\n")
    names = sorted(n for node in _all_imports(tree.body)
                   for n in _imported_names("tpumon.m", False, node))
    assert names == ["os", "tpumon", "tpumon.b", "tpumon.c", "tpumon.d"]


def test_the_poll_state_imports_none_of_its_readers():
    """sources -> detector -> state -> readers: the state knows nothing of who reads it."""
    state = units(import_graph())["tpumon.state"]
    assert not state & READERS_OF_STATE, sorted(state & READERS_OF_STATE)
