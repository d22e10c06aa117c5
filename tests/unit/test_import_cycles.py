"""No import cycle between metaq's modules: a cycle is a seam in the wrong place (two modules that cannot be
read, tested or replaced one without the other). Imports under ``if TYPE_CHECKING`` count: a module that
needs another's types to be written is tied to it all the same; the way out is a Protocol of what it
needs, declared on its own side (as :class:`metaq.broker.connections.Connection` is).

Import-linter's contracts work on packages (its acyclic_siblings contract squashes a package's modules
into one); this asks grimp, which import-linter is built on, for the graph of modules itself.
"""

from __future__ import annotations

import grimp


def module_graph() -> dict[str, set[str]]:
    graph = grimp.build_graph("metaq", cache_dir=None)
    edges: dict[str, set[str]] = {module: set() for module in graph.modules}
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            if imported in edges and imported != importer:
                edges[importer].add(imported)
    return edges


def strongly_connected(edges: dict[str, set[str]]) -> list[set[str]]:
    """The groups of modules that import each other, directly or not (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
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
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)
    return groups


def test_strongly_connected_finds_a_cycle_and_only_the_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"a"}}
    assert strongly_connected(edges) == [{"a", "b", "c"}]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules() -> None:
    edges = module_graph()
    assert edges.get("metaq.broker.core"), "the graph of metaq was not read"
    found = strongly_connected(edges)
    described = ["; ".join(f"{a} -> {b}" for a in sorted(group) for b in sorted(edges[a] & group)) for group in found]
    assert not found, "import cycles between modules:\n" + "\n".join(described)
