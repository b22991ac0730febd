"""The ceiling benchmark's hand-written rewrites compute what their programs compute: a ceiling
measured on wrong rewrites would mean nothing."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from eqsat.models.jax_programs import PROGRAMS
from experiments.bench_ceiling import VARIANTS, _close

CASES = [(p, v) for p in PROGRAMS if p.name in VARIANTS for v in VARIANTS[p.name]]


def test_every_target_program_has_variants() -> None:
    assert {p.name for p in PROGRAMS if p.target} == set(VARIANTS)


@pytest.mark.parametrize(("prog", "variant"), CASES, ids=[f"{p.name}:{v.__name__}" for p, v in CASES])
def test_variant_equals_its_program(prog, variant) -> None:
    args = prog.make_args(1)
    want = np.asarray(jax.jit(prog.fn)(*args))
    got = np.asarray(jax.jit(prog.bound(variant))(*args))
    ok, err = _close(got, want)  # the check the benchmark applies
    assert ok, err
