"""The data files the package reads at run time (rule files) are declared package data, so an
installed wheel loads and verifies its rules outside the checkout."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_rule_file_is_package_data() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    base = ROOT / "eqsat"
    shipped = {p for pattern in declared["eqsat"] for p in base.glob(pattern)}
    rules = set(base.rglob("*.rules"))
    assert base / "rewrites" / "library" / "parallel.rules" in rules
    assert rules <= shipped, f"not declared package data: {sorted(str(p.relative_to(ROOT)) for p in rules - shipped)}"
