"""A residual CNN written anew (not a built-in case): stem conv, two 3x3 convs with a residual add, a strided conv, a dense head as a VALID conv."""
import json
from eqsat.ir import GraphBuilder
b = GraphBuilder()
x = b.input("x", (32, 3, 16, 16))
h = b.conv2d(x, b.weight("stem", (24, 3, 3, 3)), act=2)
r = b.conv2d(h, b.weight("a", (24, 24, 3, 3)), act=2)
r = b.conv2d(r, b.weight("b", (24, 24, 3, 3)))
h = b.apply("relu", [b.ewadd(h, r)], {})[0]
h = b.conv2d(h, b.weight("down", (48, 24, 3, 3)), stride=(2, 2), act=2)
out = b.conv2d(h, b.weight("head", (10, 48, 8, 8)), pad=1)
json.dump(b.build([out]).to_json(), open("/work/wt/s18/new/rescnn.json", "w"))
