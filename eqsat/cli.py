"""The `eqsat` command: a table from subcommand name to the module that implements it.

Each command module defines `add_arguments(parser)` and `run(args) -> Iterable[dict]`. With `--json`
every result dict is printed as one JSON object per line on stdout; without it, as a table. Logs
and progress go to stderr. Errors from the `EqsatError` hierarchy print as one line, exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import signal
import sys
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from eqsat.errors import EqsatError
from eqsat.interrupt import ending_handler

COMMANDS: Mapping[str, tuple[str, str]] = MappingProxyType({
    "extract": ("eqsat.extract.command", "extract the best term from E-graph JSON files"),
    "rules": ("eqsat.commands.rules", "verify, synthesize or time (discover) rewrite rules"),
    "optimize": ("eqsat.commands.optimize", "optimize a model end to end"),
    "bench": ("eqsat.commands.bench", "run a named benchmark (eqsat bench --help lists them)"),
    "parallel": ("eqsat.commands.parallel", "plan a model on a device mesh: algebra and sharding from one ILP"),
    "calibrate": ("eqsat.commands.calibrate", "measure this device for the xla cost model (cached)"),
    "judge": ("eqsat.commands.judge", "run saved plans (eqsat optimize --save-graphs) on this device; keep the faster"),
})


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def emit(results: Iterable[dict[str, Any]], as_json: bool) -> None:
    """Print results as JSON lines or as one rich table (nested values summarised)."""
    if as_json:
        for row in results:
            print(json.dumps(_jsonable(row)), flush=True)
        return
    from rich.console import Console
    from rich.table import Table

    rows = list(results)
    if not rows:
        return
    table = Table()
    keys = [k for k in rows[0] if not isinstance(rows[0][k], (list, dict))]
    for key in keys:
        table.add_column(key)
    for row in rows:
        table.add_row(*(f"{row.get(k):.6g}" if isinstance(row.get(k), float) else str(row.get(k)) for k in keys))
    Console().print(table)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or, with `only`, of that one alone: a command imports only
    what it needs (`eqsat judge` runs where egglog and z3 are not installed)."""
    parser = argparse.ArgumentParser(prog="eqsat", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        if only is not None and name != only:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # that stage is not built yet
            raise
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--json", action="store_true", help="print one JSON object per result on stdout")
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; `argv` None means a real command line, which owns the whole process (a
    command may then cap its memory: `args.whole_process`)."""
    words = sys.argv[1:] if argv is None else argv
    first = next((w for w in words if not w.startswith("-")), None)
    args = build_parser(first if first in COMMANDS else None).parse_args(argv)
    args.whole_process = argv is None
    if args.whole_process:
        signal.signal(signal.SIGINT, ending_handler(args.command))
    try:
        emit(args._module.run(args), args.json)
    except EqsatError as exc:
        print(f"eqsat {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"eqsat {args.command}: error: out of memory (see --memory-limit where the command has it)",
              file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`| head`): nothing left to say, and nowhere to say it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        if not args.whole_process:  # the handler has said it already
            print(f"eqsat {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
