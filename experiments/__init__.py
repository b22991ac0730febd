"""Benchmarks and baselines only, each run as `eqsat bench NAME` (experiments/benchmarks.py, declared
under the `eqsat.benchmarks` entry points). They import eqsat; eqsat never imports them."""
