"""The fresh-bytes probe at several totals per device (32 buffers each), on the 2x4 mesh's 8 CPU devices, all busy
(stop 47, before the calibration measured it by size):

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python docs/data/parallel_spearman/s20/fresh_probe_by_size.py 2,4,8
"""

import json
import sys
import time

from eqsat.parallel.mesh import parse_mesh
from jax_backend import parallel_calibrate as pc
from jax_backend.shard import jax_mesh


def main(totals_mib: str) -> None:
    jm = jax_mesh(parse_mesh("2x4"))
    rates = {}
    for total in (int(x) for x in totals_mib.split(",")):
        t = time.perf_counter()
        pc.FRESH_REPEATS = 5
        rate = pc._fresh_rate(jm, 4.0, total * 2**20)
        rates[total] = rate * 1e9
        print(f"{total} MiB per device: {rate * 1e9:.3f} ns/B ({time.perf_counter() - t:.1f} s)", flush=True)
    print(json.dumps(rates))


if __name__ == "__main__":
    main(sys.argv[1])
