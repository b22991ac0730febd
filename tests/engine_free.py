"""What a GPU machine without the search's engines runs (`eqsat judge`, `eqsat calibrate`): a Python
prelude that makes importing egglog, z3 or highspy fail, for tests that run code in a subprocess."""

from __future__ import annotations

BLOCK_SEARCH_ENGINES = (
    "import sys, importlib.abc\n"
    "class Block(importlib.abc.MetaPathFinder):\n"
    "    def find_spec(self, name, path, target=None):\n"
    "        if name.split('.')[0] in ('egglog', 'z3', 'highspy'):\n"
    "            raise ModuleNotFoundError(name, name=name)\n"
    "sys.meta_path.insert(0, Block())\n"
)
