"""`eqsat extract FILE... --extractor NAME --time-limit S`: one result row per file."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from typing import Any

from eqsat.errors import ExtractionError
from eqsat.extract.egraph_data import load_egraph
from eqsat.extract.registry import EXTRACTORS, extract
from eqsat.extract.selection import check_selection


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="E-graph JSON files")
    parser.add_argument("--extractor", default="ilp", choices=sorted(EXTRACTORS), help="strategy (default: ilp)")
    parser.add_argument("--time-limit", type=float, default=60.0, metavar="S", help="seconds per file, load included")
    parser.add_argument("--memory-limit", type=float, default=8.0, metavar="GIB",
                        help="memory limit in GiB (default 8): a strategy estimated to need more is refused, "
                             "and the address space is capped so an overrun is an error, not an OOM kill")


def cap_address_space(limit_bytes: int) -> None:
    """Lower this process's address-space limit to `limit_bytes` (never raise it), so that an
    allocation past it is a MemoryError here instead of the kernel killing the machine's jobs."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or limit_bytes < soft:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes if hard == resource.RLIM_INFINITY else min(limit_bytes, hard), hard))


def run(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    if not args.time_limit >= 0:
        raise ExtractionError(f"--time-limit must be a non-negative number of seconds, not {args.time_limit}")
    if not args.memory_limit > 0:
        raise ExtractionError(f"--memory-limit must be a positive number of GiB, not {args.memory_limit}")
    memory_limit = int(min(args.memory_limit, 1 << 20) * 2**30)
    if getattr(args, "whole_process", False):
        cap_address_space(memory_limit)
    for path in args.files:
        start = time.perf_counter()
        egraph = load_egraph(path)
        # the selection is validated and re-costed after the solver stops: keep time for that
        reserve = min(2.0, max(0.2, 0.02 * args.time_limit))
        left = max(0.1, args.time_limit - (time.perf_counter() - start) - reserve)
        sel = extract(egraph, args.extractor, left, memory_limit=memory_limit)
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
