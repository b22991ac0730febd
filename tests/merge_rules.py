"""The merge tests' rule set: `eqsat optimize`'s candidate rules that can match a graph, with those
proved only on tested shapes opted in explicitly (the merges have no proof for all shapes yet;
issue 27: the default set no longer trusts them)."""

from __future__ import annotations

import warnings

from eqsat.egraph import encoded_signatures
from eqsat.ir import Graph
from eqsat.rewrites.rule import Rule
from eqsat.rulesets import candidate_rules, select_rules


def bench_rules(graph: Graph) -> list[Rule]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return list(select_rules(candidate_rules(), encoded_signatures(graph), trust_tested=True).trusted)
