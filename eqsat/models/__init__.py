"""Every named model, one registry: `lookup(name, family)` → `ModelEntry`, one `UnknownModelError`.

Families: "tensat" (`MODELS`: Tensat's and TASO's models, what `eqsat optimize` and `eqsat bench
tensat` build), "parallel" (the cases `eqsat parallel` plans, `eqsat.models.parallel_cases`) and
"jax" (the JAX target programs of `eqsat bench jax`, `eqsat.models.jax_programs`, imported on
lookup: they import JAX). `build_model` and `build_parallel_model` are the two lookups that return
a `Graph`.

NasRNN is built here with the `GraphBuilder` (BERT, ResNeXt-50 and NasNet-A in
`eqsat/models/tensat.py`), following the cell Tensat benchmarks (5 steps,
hidden size 512; each step makes eight `x·W + h·U` pairs and mixes them through sigmoid, tanh and
relu gates). The five TASO models (Inception-v3, VGG-19, SqueezeNet, MobileNet-v2, BTS) are read
from Tensat's `.model` files in the shared data directory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any

from eqsat.errors import EqsatError, GraphFormatError
from eqsat.ir import Graph, GraphBuilder, Tensor
from eqsat.paths import tensat_models_dir
from eqsat.taso import load_taso_model
from eqsat.models.parallel_cases import PARALLEL_MODELS
from eqsat.models.tensat import bert, nasneta, resnext50

__all__ = ["FAMILIES", "MODELS", "PARALLEL_MODELS", "ModelEntry", "UnknownModelError", "build_model",
           "build_parallel_model", "lookup", "nasrnn"]


class UnknownModelError(EqsatError):
    """A model name that the registry does not define."""


def _nas_cell(b: GraphBuilder, x: Tensor, h: Tensor, step: int, hidden: int) -> Tensor:
    """One NasRNN step: eight x·W + h·U pairs, gated pairwise, then reduced through tanh."""
    pairs = []
    for k in range(8):
        w = b.weight(f"w{step}_{k}", (x.shape[1], hidden))
        u = b.weight(f"u{step}_{k}", (h.shape[1], hidden))
        pairs.append(b.matmul(x, w) + b.matmul(h, u))
    t = pairs
    m0 = b.relu(t[0]) + b.sigmoid(t[3])
    m1 = b.sigmoid(t[1]) + b.tanh(t[2])
    m2 = b.sigmoid(t[4]) * b.tanh(t[5])
    m3 = b.sigmoid(t[6]) * b.relu(t[7])
    m4 = b.sigmoid(m1) + b.tanh(m2)
    m5 = b.tanh(m0) * b.tanh(m3)
    m6 = b.tanh(m4) * b.tanh(m5)
    return b.tanh(m6)


def nasrnn(steps: int = 5, hidden: int = 512, batch: int = 1) -> Graph:
    """NasRNN unrolled for `steps`; inputs x0..x{steps-1} and the initial state h0, output the last state."""
    b = GraphBuilder()
    h = b.input("h0", (batch, hidden))
    for step in range(steps):
        x = b.input(f"x{step}", (batch, hidden))
        h = _nas_cell(b, x, h, step, hidden)
    return b.build([h])


def _taso(file_name: str) -> Graph:
    path = tensat_models_dir() / file_name
    if not path.exists():
        raise GraphFormatError(f"{path}: TASO model file not found (set EQSAT_DATA to the shared data directory)")
    return load_taso_model(path)


@dataclass(frozen=True)
class ModelEntry[T]:
    """How to build one named model (a `Graph`; a `JaxProgram` in the "jax" family), and what it is."""

    build: Callable[[], T]
    description: str


MODELS: Mapping[str, ModelEntry[Graph]] = MappingProxyType({
    "nasrnn": ModelEntry(nasrnn, "NasRNN, 5 steps, hidden 512 (Tensat's benchmark)"),
    "nasrnn-small": ModelEntry(partial(nasrnn, steps=2, hidden=64), "NasRNN, 2 steps, hidden 64 (for tests)"),
    "inceptionv3": ModelEntry(partial(_taso, "inceptionv3.model"), "Inception-v3 (TASO .model)"),
    "vgg": ModelEntry(partial(_taso, "vgg.model"), "VGG-19 (TASO .model)"),
    "squeezenet": ModelEntry(partial(_taso, "squeezenet.model"), "SqueezeNet (TASO .model)"),
    "mobilenetv2": ModelEntry(partial(_taso, "mobilenetv2.model"), "MobileNet-v2 (TASO .model)"),
    "bert": ModelEntry(bert, "BERT, 8 attention layers, sequence 64, hidden 1024, 16 heads (Tensat's)"),
    "resnext50": ModelEntry(resnext50, "ResNeXt-50, 32 groups, 224x224 (Tensat's)"),
    "nasneta": ModelEntry(nasneta, "NasNet-A, 3 x (5 normal + 1 reduction) cells, 224x224 (Tensat's)"),
    "bert-small": ModelEntry(partial(bert, seq=8, hidden=64, layers=2, heads=8), "BERT, 2 layers, hidden 64 (for tests)"),
    "resnext-small": ModelEntry(partial(resnext50, image=32, groups=4, stages=((1, 16), (1, 32))),
                                "ResNeXt, 2 blocks, 32x32, 4 groups (for tests)"),
    "nasneta-small": ModelEntry(partial(nasneta, image=32, stacks=1, normal_cells=2, channels=8),
                                "NasNet-A, 2 normal + 1 reduction cell, 32x32 (for tests)"),
    "bts": ModelEntry(partial(_taso, "bts.model"), "BERT-like transformer block stack (TASO .model)"),
})


def build_model(name: str) -> Graph:
    """The graph of model `name`, or a `.model` / Graph JSON file given by path."""
    entry = MODELS.get(name)
    if entry is not None:
        return entry.build()
    path = Path(name)
    if path.suffix == ".model" and path.exists():
        return load_taso_model(path)
    if path.suffix == ".json" and path.exists():
        return Graph.load(path)
    raise UnknownModelError(f"unknown model {name!r}; known models: {', '.join(MODELS)} "
                            "(or a path to a .model or Graph .json file)")


FAMILIES = ("tensat", "parallel", "jax")


def _jax_programs() -> Mapping[str, ModelEntry[Any]]:
    from eqsat.models.jax_programs import PROGRAMS

    return {p.name: ModelEntry(partial(_given, p), "JAX target program" if p.target else "JAX program (extra)")
            for p in PROGRAMS}


def _given[T](value: T) -> T:
    return value


def _family(family: str) -> Mapping[str, ModelEntry[Any]]:
    if family == "tensat":
        return MODELS
    if family == "parallel":
        return {name: ModelEntry(build, (build.__doc__ or name).splitlines()[0]) for name, build in PARALLEL_MODELS.items()}
    if family == "jax":
        return _jax_programs()
    raise UnknownModelError(f"unknown model family '{family}'; known families: {', '.join(FAMILIES)}")


def lookup(name: str, family: str = "tensat") -> ModelEntry[Any]:
    """The entry of model `name` in `family`; an unknown name is an `UnknownModelError` that lists the known ones."""
    table = _family(family)
    entry = table.get(name)
    if entry is None:
        raise UnknownModelError(f"unknown model {name!r}; known models: {', '.join(table)}")
    return entry


def build_parallel_model(name: str) -> Graph:
    """The graph of the parallel case `name` (`eqsat parallel MODEL`)."""
    graph: Graph = lookup(name, "parallel").build()
    return graph
