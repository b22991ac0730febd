"""JAX backend: lower eqsat `Graph`s to JAX functions (capture and Pallas kernels build on this).
Importing it registers its cost models ("measured", timed with JAX; "merge"; "xla", calibrated;
"parallel-calibrated", a mesh's measured links) in `eqsat.cost`'s registry."""

import jax_backend.calibrate  # registers the "xla" cost model
import jax_backend.parallel_calibrate  # registers the "parallel-calibrated" cost model
import jax_backend.measured_cost  # noqa: F401 - registers the "measured" and "merge" cost models
from jax_backend.lower import LOWERINGS, lower_node, to_jax, to_jax_positional

__all__ = ["LOWERINGS", "lower_node", "to_jax", "to_jax_positional"]
