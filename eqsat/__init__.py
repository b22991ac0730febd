"""eqsat: equality saturation for tensor programs.

Importing `eqsat` is cheap: the egglog stage and the JAX backend (`eqsat.optimize`, `eqsat.explain`)
load on first use.
"""
def __getattr__(name: str):
    """`eqsat.optimize` and `eqsat.explain` come from jax_backend, imported on first use."""
    if name == "optimize":
        from jax_backend.decorator import optimize

        return optimize
    if name == "explain":
        from jax_backend.explain import explain

        return explain
    if name in _EQSAT_EXPORTS:  # the egglog stage, imported on first use (egglog is heavy)
        import importlib

        return getattr(importlib.import_module(_EQSAT_EXPORTS[name]), name)
    raise AttributeError(f"module 'eqsat' has no attribute '{name}'")


_EQSAT_EXPORTS = {
    "TensorEGraph": "eqsat.egraph", "decode": "eqsat.egraph",
    "Limits": "eqsat.saturate", "SaturationReport": "eqsat.saturate", "saturate": "eqsat.saturate",
    "optimize_graph": "eqsat.pipeline", "OptimizationResult": "eqsat.pipeline", "select_rules": "eqsat.rulesets",
}
