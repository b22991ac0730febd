"""`eqsat extract FILE... --extractor NAME --time-limit S`: one result row per file."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from typing import Any

from eqsat.extract.egraph_data import load_egraph
from eqsat.extract.registry import EXTRACTORS, extract
from eqsat.extract.selection import check_selection


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="E-graph JSON files")
    parser.add_argument("--extractor", default="ilp", choices=sorted(EXTRACTORS), help="strategy (default: ilp)")
    parser.add_argument("--time-limit", type=float, default=60.0, metavar="S", help="seconds per file, load included")


def run(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    for path in args.files:
        start = time.perf_counter()
        egraph = load_egraph(path)
        # the selection is validated and re-costed after the solver stops: keep time for that
        reserve = min(2.0, max(0.2, 0.02 * args.time_limit))
        left = max(0.1, args.time_limit - (time.perf_counter() - start) - reserve)
        sel = extract(egraph, args.extractor, left)
        yield {
            "file": str(path),
            "extractor": args.extractor,
            "cost": sel.dag_cost,
            "lower_bound": sel.lower_bound,
            "status": str(sel.status),
            "seconds": time.perf_counter() - start,
            "valid": not check_selection(egraph, sel),
            "nodes": egraph.n_nodes,
            "classes": egraph.n_classes,
            "chosen": int((sel.choice >= 0).sum()),
            "tree_cost": sel.tree_cost,
        }
