

def __getattr__(name: str):  # noqa: ANN202 - lazy re-exports, so `import eqsat` never imports JAX
    """`eqsat.optimize` and `eqsat.explain` come from jax_backend, imported on first use."""
    if name == "optimize":
        from jax_backend.decorator import optimize

        return optimize
    if name == "explain":
        from jax_backend.explain import explain

        return explain
    raise AttributeError(f"module 'eqsat' has no attribute '{name}'")
