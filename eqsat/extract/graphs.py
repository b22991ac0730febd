"""Small graph algorithms on integer adjacency lists (faster than building networkx graphs)."""

from __future__ import annotations

from collections.abc import Sequence


def strongly_connected(adj: Sequence[Sequence[int]]) -> list[int]:
    """Component id per vertex (Tarjan, iterative); ids are in reverse topological order."""
    n = len(adj)
    index = [-1] * n
    low = [0] * n
    comp = [-1] * n
    on_stack = [False] * n
    stack: list[int] = []
    counter = 0
    n_comp = 0
    for root in range(n):
        if index[root] >= 0:
            continue
        work: list[tuple[int, int]] = [(root, 0)]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = True
        while work:
            v, i = work[-1]
            kids = adj[v]
            if i < len(kids):
                work[-1] = (v, i + 1)
                w = kids[i]
                if index[w] < 0:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack[w] = True
                    work.append((w, 0))
                elif on_stack[w] and index[w] < low[v]:
                    low[v] = index[w]
                continue
            work.pop()
            if work:
                u = work[-1][0]
                if low[v] < low[u]:
                    low[u] = low[v]
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp[w] = n_comp
                    if w == v:
                        break
                n_comp += 1
    return comp


def cyclic_vertices(adj: Sequence[Sequence[int]]) -> set[int]:
    """Vertices on some cycle (a non-trivial strongly connected component, or a self-loop)."""
    comp = strongly_connected(adj)
    size: dict[int, int] = {}
    for c in comp:
        size[c] = size.get(c, 0) + 1
    return {v for v, c in enumerate(comp) if size[c] > 1 or v in adj[v]}
