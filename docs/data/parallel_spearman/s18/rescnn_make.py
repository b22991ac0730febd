"""A residual CNN written anew for stop 45 (not a built-in case): a stem conv, two 3x3 convs around a
residual add, a strided conv, and a dense head written as an 8x8 VALID conv. Writes `rescnn.json`
beside this file (the Graph JSON `eqsat parallel --graph` reads)."""

import json
from pathlib import Path

from eqsat.ir import GraphBuilder

b = GraphBuilder()
x = b.input("x", (32, 3, 16, 16))
h = b.conv2d(x, b.weight("stem", (24, 3, 3, 3)), act=2)
r = b.conv2d(h, b.weight("a", (24, 24, 3, 3)), act=2)
r = b.conv2d(r, b.weight("b", (24, 24, 3, 3)))
h = b.apply("relu", [b.ewadd(h, r)], {})[0]
h = b.conv2d(h, b.weight("down", (48, 24, 3, 3)), stride=(2, 2), act=2)
out = b.conv2d(h, b.weight("head", (10, 48, 8, 8)), pad=1)
Path(__file__).with_name("rescnn.json").write_text(json.dumps(b.build([out]).to_json()))
