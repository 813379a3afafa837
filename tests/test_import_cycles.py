"""No import circles in `trainer`, `components` and `pipelines`: between modules, and between packages.

The graph is built statically (`ast`, nothing is imported): one node per module, one edge A -> B for
every `import`/`from ... import` statement in A that names B or something in B. The rule:

- every import statement counts, wherever it is: at module level, inside a function, under
  `if TYPE_CHECKING:`. An import moved into a function makes start-up cheaper, not the dependency
  go away: an interface that imports its implementation lazily is still the circle we forbid (the
  factory belongs above both);
- `from package import name` is an edge to `package.name` when that is a module, else to `package`
  (`import a.b.c` likewise to the longest of `a.b.c`, `a.b`, `a` that is one of our modules);
  relative imports are resolved against the importing module;
- importing `a.b.c` is not also an edge to the packages `a` and `a.b` (Python runs their
  `__init__` first, but a package that re-exports its own modules is not a circle);
- only modules inside the three packages are nodes; everything else (torch, kfp, ...) is ignored.

A strongly connected component of more than one module is a circle; the failure names one cycle in
it with the file and line of each import.

Packages: the same graph with each module replaced by its unit, the first two parts of its name
(`trainer.rollout.engines` -> `trainer.rollout`, `trainer.errors` stays itself), so that the folders
under `trainer/`, `components/` and `pipelines/` form a layering with no circle either: a package
that imports another's module is above it. (How a sub-package sits in its parent, a factory above
its implementations, is the module rule's business.) `PENDING_PACKAGE_EDGES` lists the imports that
still close a circle between packages, each with the change that removes it; the test fails when
another circle appears and when a listed import is gone, so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("trainer", "components", "pipelines")
# (importing package, imported package): the change that removes the import. Removing these from the package
# graph leaves no circle; each is still there (issue 46, "The house, round three").
PENDING_PACKAGE_EDGES: dict[tuple[str, str], str] = {}

Edges = dict[str, dict[str, str]]  # module -> {imported module: "path:line" of the first such import}


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Every module of `packages` under `root`, by dotted name (a package by its `__init__.py`)."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imported_names(module: str, path: Path) -> list[tuple[str, int]]:
    """The dotted names each import statement of `module` may refer to, with its line."""
    is_package = path.name == "__init__.py"
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: drop the module itself (unless a package), then one part per extra dot
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return names


def import_graph(root: Path, packages: tuple[str, ...]) -> Edges:
    """The module graph of `packages` under the rule in this file's docstring."""
    modules = module_files(root, packages)
    graph: Edges = {}
    for module, path in modules.items():
        edges: dict[str, str] = {}
        for name, line in imported_names(module, path):
            target = name
            while target and target not in modules:  # `a.b.function` -> `a.b`; `torch.nn` -> nothing
                target = target.rpartition(".")[0]
            if target and target != module:
                edges.setdefault(target, f"{path.relative_to(root)}:{line}")
        graph[module] = edges
    return graph


def circles(graph: Edges) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
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
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(graph[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def describe(graph: Edges, component: list[str]) -> str:
    """One cycle through `component`, each step with the import that makes it: `a -> b (a.py:3) -> a (b.py:9)`."""
    members = set(component)
    start = component[0]
    path, seen = [start], {start}
    while True:  # walk inside the component until a module repeats: that is a cycle
        node = next(n for n in graph[path[-1]] if n in members)
        if node in seen:
            cycle = path[path.index(node):] + [node]
            break
        path.append(node)
        seen.add(node)
    steps = [cycle[0]] + [f"{b} ({graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(steps)


def test_trainer_components_and_pipelines_have_no_import_circles():
    graph = import_graph(ROOT, PACKAGES)
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(describe(graph, c) for c in found)


def package_graph(graph: Edges, depth: int = 2) -> Edges:
    """`graph` with each module replaced by the first `depth` parts of its name (see the module docstring)."""
    packages: Edges = {}
    for module, edges in graph.items():
        unit = ".".join(module.split(".")[:depth])
        own = packages.setdefault(unit, {})
        for target, where in edges.items():
            target_unit = ".".join(target.split(".")[:depth])
            if target_unit != unit:
                own.setdefault(target_unit, where)
    return packages


def test_packages_have_no_import_circles_beyond_the_pending_ones():
    packages = package_graph(import_graph(ROOT, PACKAGES))
    gone = [f"{a} -> {b}" for a, b in PENDING_PACKAGE_EDGES if b not in packages.get(a, {})]
    assert not gone, "no longer imported, drop from PENDING_PACKAGE_EDGES: " + ", ".join(gone)
    remaining = {a: {b: where for b, where in edges.items() if (a, b) not in PENDING_PACKAGE_EDGES}
                 for a, edges in packages.items()}
    found = circles(remaining)
    assert not found, "import circles between packages:\n" + "\n".join(describe(remaining, c) for c in found)


def test_the_check_names_a_circle_with_its_imports(tmp_path):
    """A lazy import inside a function closes the circle too, and the message says where each import is."""
    package = tmp_path / "shop"
    package.mkdir()
    (package / "__init__.py").write_text("from shop.base import Store\n")  # re-export: not a circle
    (package / "base.py").write_text("class Store: ...\n\ndef get_store():\n    from shop.local import Local\n"
                                     "    return Local()\n")
    (package / "local.py").write_text("from . import base\n\nclass Local(base.Store): ...\n")
    (package / "free.py").write_text("import shop\nfrom shop.base import get_store\n")
    graph = import_graph(tmp_path, ("shop",))
    assert circles(graph) == [["shop.base", "shop.local"]]
    assert describe(graph, ["shop.base", "shop.local"]) == \
        "shop.base -> shop.local (shop/base.py:4) -> shop.base (shop/local.py:1)"


def test_the_package_check_sees_a_circle_the_modules_do_not_have(tmp_path):
    """`shop.orders` imports `shop.stock`'s module and `shop.stock` another of `shop.orders`'s: no module circle,
    a package one."""
    for package in ("shop", "shop/orders", "shop/stock"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "shop/orders/cart.py").write_text("from shop.stock.levels import level\n")
    (tmp_path / "shop/orders/prices.py").write_text("PRICES = {}\n")
    (tmp_path / "shop/stock/levels.py").write_text("from shop.orders.prices import PRICES\n\ndef level(): ...\n")
    graph = import_graph(tmp_path, ("shop",))
    assert circles(graph) == []
    packages = package_graph(graph)
    assert circles(packages) == [["shop.orders", "shop.stock"]]
    assert describe(packages, ["shop.orders", "shop.stock"]) == \
        "shop.orders -> shop.stock (shop/orders/cart.py:1) -> shop.orders (shop/stock/levels.py:1)"
