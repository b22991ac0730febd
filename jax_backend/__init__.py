"""JAX backend: lower eqsat `Graph`s to JAX functions (capture and Pallas kernels build on this)."""

from jax_backend.lower import LOWERINGS, lower_node, to_jax, to_jax_positional

__all__ = ["LOWERINGS", "lower_node", "to_jax", "to_jax_positional"]
