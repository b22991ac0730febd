"""Names a person recognises for captured values: the user's argument names and pytree key paths
(`x`, `params['Dense_0']['kernel']`) for the program's inputs, and where every other graph leaf
comes from (a constant, an opaque equation, an earlier graph).

Display only: IR leaves keep their `graph_leaf_name` (`v3`), which lowering, hashing and the
decision cache key on; reports carry a mapping from those names to these.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jax_backend.capture import LoopStep, OpaqueStep, Program, Step, graph_leaf_name

__all__ = ["argument_names", "traced_leaf_names", "value_names"]


def argument_names(fun: Callable[..., Any], n_positional: int) -> list[str]:
    """The parameter name of each of `n_positional` positional arguments (`args[k]` past a
    `*args` parameter's start, `arg{i}` where the signature cannot be read or has no such slot)."""
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = [p.name for p in params
                  if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    star = next((p.name for p in params if p.kind == inspect.Parameter.VAR_POSITIONAL), None)
    names = []
    for i in range(n_positional):
        if i < len(positional):
            names.append(positional[i])
        elif star is not None:
            names.append(f"{star}[{i - len(positional)}]")
        else:
            names.append(f"arg{i}")
    return names


def traced_leaf_names(fun: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any],
                      static: Collection[int | str], traced: Callable[[Any], bool]) -> tuple[str, ...]:
    """The name of every leaf of `(args, kwargs)` that `traced` accepts, in `jax.tree_util` order
    (the flat arguments a capture sees), the arguments in `static` (positions and names) left out
    as the decorator leaves them out: `params['Dense_0']['kernel']`, `self.linear.weight`, `x`."""
    dyn_args = tuple(None if i in static else a for i, a in enumerate(args))
    dyn_kwargs = {k: v for k, v in kwargs.items() if k not in static}
    arg_names = argument_names(fun, len(args))
    names: list[str] = []
    try:
        flat = jax.tree_util.tree_flatten_with_path((dyn_args, dyn_kwargs))[0]
    except Exception:  # noqa: BLE001 - names are for reading only: none rather than a failed call
        return ()
    for path, leaf in flat:
        if not traced(leaf):
            continue
        where, rest = path[1], tuple(path[2:])
        base = arg_names[where.idx] if isinstance(where, jax.tree_util.SequenceKey) else str(getattr(where, "key", where))
        names.append(base + jax.tree_util.keystr(rest))
    return tuple(names)


def value_names(program: Program, input_names: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """(graph leaf name, display name) for every leaf of the program's graphs: an input by the
    user's name (when `input_names` has one per input), a scalar constant by its value, any other
    value by what made it (`cumsum#12`, `graph0#7`, `scan#30`, `const#5`)."""
    made_by: dict[int, str] = {}
    graph_no = 0

    def walk(steps: Sequence[Step]) -> None:
        nonlocal graph_no
        for s in steps:
            if isinstance(s, (OpaqueStep, LoopStep)):
                made_by.update((o, s.name) for o in s.outputs)
            if isinstance(s, LoopStep):
                made_by.update((i, f"{s.name} body in") for i in s.body_inputs)
                walk(s.body)
            elif not isinstance(s, OpaqueStep):
                made_by.update((o, f"graph{graph_no}") for o in s.outputs)
                graph_no += 1

    walk(program.steps)
    named = len(input_names) == program.n_inputs
    out: dict[str, str] = {}
    for step in program.graphs:
        for vid in step.inputs:
            if named and vid < program.n_inputs:
                label = input_names[vid]
            elif vid in program.consts:
                label = _const_name(program.consts[vid], vid)
            elif vid in made_by:
                label = f"{made_by[vid]}#{vid}"
            else:
                label = graph_leaf_name(vid)
            out[graph_leaf_name(vid)] = label
    return tuple(out.items())


def _const_name(value: Any, vid: int) -> str:
    """A scalar constant by its value (`2.0`); an array constant by its id."""
    try:
        arr = np.asarray(value)
    except Exception:  # noqa: BLE001 - a traced constant has no value to show
        return f"const#{vid}"
    return f"{arr.item():g}" if arr.size == 1 and arr.dtype.kind in "fiub" else f"const#{vid}"
