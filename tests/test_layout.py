"""The package layout: one subpackage per stage or concern, imports only running down the
pipeline, and no import cycle anywhere inside graphsync/ (lazy imports inside functions count:
they are cycles all the same, only deferred). Reads the source; imports nothing."""
import ast
import pathlib

import pytest

pytestmark = pytest.mark.plumbing   # tiers.py: no kernel of its own

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "graphsync"

# Bottom to top: a module may import from its own level and the levels below it.
LEVELS = [
    ("graphsync.errors", "graphsync.stats", "graphsync.graph"),   # shared arithmetic, TensorFlow primitives
    ("graphsync.match",),           # find candidates
    ("graphsync.batch_axis",),      # the batch axis traced
    ("graphsync.towers",),          # find towers
    ("graphsync.plan",),            # pair and plan (frozen data)
    ("graphsync.between_graph",),   # worker processes: the process group, meeting, heartbeat
    ("graphsync.exchange",),        # how statistics cross devices
    ("graphsync.splice",),          # every edit
    ("graphsync.report", "graphsync.rewrite", "graphsync.hook"),   # the in-graph entry points
    ("graphsync.autosync",),        # graphsync run
    ("graphsync.io",),              # saved graphs
    ("graphsync.verification",),    # graphsync verify
    ("graphsync", "graphsync.__main__"),   # the façade
]


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str, path: pathlib.Path, known: set) -> set:
    """The graphsync modules `name` imports, anywhere in its body."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:   # a module of the package, else a name its façade offers
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in found if m in known and m != name}


def _graph() -> dict:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _level(name: str) -> int:
    best = None
    for i, prefixes in enumerate(LEVELS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (i, len(prefix))
    assert best is not None, f"{name} belongs to no level of tests/test_layout.py's LEVELS"
    return best[0]


def _cycles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    assert _cycles(_graph()) == []


def test_a_cycle_is_found():
    """The check itself: a made-up back edge is reported."""
    graph = _graph()
    graph["graphsync.graph.tf_private"] = graph["graphsync.graph.tf_private"] | {"graphsync.rewrite"}
    assert _cycles(graph)


def test_imports_run_down_the_pipeline():
    upward = [f"{name} → {imported}" for name, imports in _graph().items() for imported in imports
              if _level(imported) > _level(name)
              and not (name == "graphsync" or imported.startswith(name + "."))]   # a façade names its own modules
    assert upward == []


def test_the_top_level_holds_only_entry_points_and_shared_arithmetic():
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == ["__init__", "__main__", "errors", "hook", "report", "requirements", "rewrite", "stats"]
