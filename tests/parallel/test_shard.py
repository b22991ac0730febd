"""Plans run on 8 emulated JAX CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8):
outputs and gradients equal the single-device program, every distribution op's collective equals
its registry semantics, and the compiled program communicates what the planner predicted."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")

if jax.device_count() < 8:
    pytest.skip("needs 8 JAX devices: set XLA_FLAGS=--xla_force_host_platform_device_count=8", allow_module_level=True)

from eqsat.ir import GraphBuilder
from eqsat.models import PARALLEL_MODELS, build_parallel_model
from eqsat.models.parallel_cases import (
    cnn,
    gpt,
    mlp_bottleneck,
    unity_mlp,
)
from eqsat.parallel.mesh import parse_mesh
from eqsat.parallel.planner import (
    plan_graph,
    plan_report,
    random_plans,
    saturate_and_price,
    step_products,
)
from jax_backend.checks import check_on_devices
from jax_backend.shard import compiled_collectives, compiled_copy_bytes, compiled_rendezvous, shard_plan


def _op_programs() -> list[tuple[str, object]]:
    """One tiny depth-0 program per distribution op, over mesh axis 1 of a 2x4 mesh."""
    programs = []
    for name, build in {
        "partition+combine": lambda b, x: b.apply("combine", [b.apply("partition", [x], {"dim": -1, "axis": 1, "parts": 4})[0]], {"dim": -1, "axis": 1}),
        "replicate+reduce": lambda b, x: b.apply("reduce", [b.apply("replicate", [x], {"axis": 1, "parts": 4})[0]], {"axis": 1}),
        "all_reduce": lambda b, x: b.apply("combine", [b.apply("all_reduce", [b.apply("partition", [x], {"dim": -2, "axis": 1, "parts": 4})[0]], {"axis": 1})[0]], {"dim": -2, "axis": 1}),
        "all_gather": lambda b, x: b.apply("combine", [b.apply("all_gather", [b.apply("partition", [x], {"dim": -1, "axis": 1, "parts": 4})[0]], {"dim": -1, "axis": 1})[0]], {"dim": -2, "axis": 1}),
        "reduce_scatter": lambda b, x: b.apply("combine", [b.apply("reduce_scatter", [b.apply("replicate", [x], {"axis": 1, "parts": 4})[0]], {"dim": -1, "axis": 1})[0]], {"dim": -1, "axis": 1}),
        "all_to_all": lambda b, x: b.apply("combine", [b.apply("all_to_all", [b.apply("partition", [x], {"dim": -2, "axis": 1, "parts": 4})[0]], {"split_dim": -1, "concat_dim": -2, "axis": 1})[0]], {"dim": -1, "axis": 1}),
    }.items():
        b = GraphBuilder()
        x = b.matmul(b.input("x", (8, 8)), b.weight("w", (8, 8)))  # a computed value: gradients flow through
        programs.append((name, b.build([build(b, x)[0]])))
    return programs


@pytest.mark.parametrize("name,graph", _op_programs(), ids=[n for n, _ in _op_programs()])
def test_each_distribution_op_on_devices_equals_its_semantics(name: str, graph: object) -> None:
    mesh = parse_mesh("2x4")
    program = shard_plan(graph, mesh)  # type: ignore[arg-type]
    values = graph.random_inputs(0)  # type: ignore[attr-defined]
    out = program.fn(*program.place(values))[0]
    ref = graph.evaluate({k: v.astype(np.float64) for k, v in values.items()})[0]  # type: ignore[attr-defined]
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mesh", ["2", pytest.param("8", marks=pytest.mark.slow), "2x4",
                                  pytest.param("4x2", marks=pytest.mark.slow)])
def test_unity_mlp_plan_on_devices(mesh: str) -> None:
    graph = unity_mlp(64, 256, 1024, 256)
    result = plan_graph(graph, parse_mesh(mesh))
    check = check_on_devices(graph, result.plan, result.mesh)
    assert check["outputs_ok"] and check["gradients_ok"]
    assert check["measured_comm_bytes"] == pytest.approx(result.report.comm_bytes("forward"), rel=0.05)
    assert check["measured_collectives"] == sorted(c.kind for _, c in result.report.collectives if c.phase == "forward")


@pytest.mark.parametrize("mesh", ["8", pytest.param("2x4", marks=pytest.mark.slow)])
def test_batched_gpt_block_megatron_by_hand_compiles_to_two_all_reduces(mesh: str) -> None:
    """Megatron by hand on x (B, T, d): heads split through the reshapes, transposes and the merged
    (B*H) attention products lower to per-device programs whose forward is its two all-reduces."""
    from eqsat.commands.parallel import hand_plan

    graph = gpt(1, d=32, heads=8, seq=8, batch=2)
    result = hand_plan("gpt-block", graph, parse_mesh(mesh))
    check = check_on_devices(graph, result.plan, result.mesh)
    assert check["numerics_ok"]
    assert check["measured_collectives"] == ["all-reduce", "all-reduce"]
    assert check["measured_step_comm_bytes"] == pytest.approx(result.report.comm_bytes(None), rel=0.05)


@pytest.mark.slow  # ~20 s: compiles and runs random plans on 8 devices (bench parallel runs 20 per case)
def test_random_plans_on_devices() -> None:
    """Plans of every shape the rules allow (random extractions) run equal to the program."""
    graph = gpt(1, d=32, heads=4, seq=8, batch=2)
    mesh = parse_mesh("2x4")
    pe = saturate_and_price(graph, mesh)
    for plan in random_plans(pe, 4, seed=5):
        check = check_on_devices(graph, plan, mesh)
        assert check["numerics_ok"]
        assert check["measured_comm_bytes"] == pytest.approx(plan_report(plan, pe.model).comm_bytes("forward"), rel=0.05)


def test_tuple_collectives_count_per_element() -> None:
    text = ("%ar = (f32[128,64]{1,0}, f32[128,64]{1,0}) all-reduce(%a, %b), channel_id=1, "
            "replica_groups=mesh['a0'=8] {'a0'}, to_apply=%sum\n"
            "%rs = f32[4,8]{1,0} reduce-scatter(%c), replica_groups={{0,1},{2,3}}, dimensions={0}")
    found = compiled_collectives(text)
    assert [c.kind for c in found] == ["all-reduce", "all-reduce", "reduce-scatter"]
    assert [c.bytes for c in found] == [32768.0, 32768.0, 2 * 128.0]



def test_collectives_in_a_loop_count_once_per_trip() -> None:
    """A while body's collective runs its known trip count times a step (nested loops multiply);
    one outside any loop, or in a loop whose trip count XLA does not know, once."""
    from jax_backend.shard import loop_runs

    text = """HloModule m

%inner (p: f32[4]) -> f32[4] {
  %ar = f32[4]{0} all-reduce(%p), channel_id=1, replica_groups={{0,1}}, to_apply=%sum
}

%outer (q: f32[4]) -> f32[4] {
  %w = f32[4]{0} while(%q), condition=%c, body=%inner, backend_config={"known_trip_count":{"n":"3"}}
  %ag = f32[8]{0} all-gather(%q), channel_id=2, replica_groups={{0,1}}, dimensions={0}
}

%unknown (r: f32[4]) -> f32[4] {
  %ar2 = f32[2]{0} all-reduce(%r), channel_id=3, replica_groups={{0,1}}, to_apply=%sum
}

ENTRY %main (x: f32[4]) -> f32[4] {
  %w1 = f32[4]{0} while(%x), condition=%c, body=%outer, backend_config={"known_trip_count":{"n":"2"}}
  %w2 = f32[4]{0} while(%x), condition=%c, body=%unknown
  %ar3 = f32[1]{0} all-reduce(%x), channel_id=4, replica_groups={{0,1}}, to_apply=%sum
}
"""
    assert {k: loop_runs(text)[k] for k in ("main", "outer", "inner", "unknown")} == {
        "main": 1, "outer": 2, "inner": 6, "unknown": 1}
    found = compiled_collectives(text)
    assert sorted((c.kind, c.bytes) for c in found) == sorted(
        [("all-reduce", 16.0)] * 6 + [("all-gather", 32.0)] * 2 + [("all-reduce", 8.0), ("all-reduce", 4.0)])


def test_a_scanned_layer_stacks_gradient_sync_counts_every_layer() -> None:
    """Data parallel over a `lax.scan` of 3 layers all-reduces each layer's gradient inside the
    backward loop: compiled, a step moves all 3 layers' gradients, not one's."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    layers, d = 3, 32

    def loss(ws: Any, x: Any) -> Any:
        h, _ = jax.lax.scan(lambda h, w: (jax.numpy.tanh(h @ w), None), x, ws)
        return jax.numpy.sum(h * h)

    jm = jax.make_mesh((len(jax.devices()),), ("x",))
    fn = jax.jit(jax.grad(loss), in_shardings=(NamedSharding(jm, P()), NamedSharding(jm, P("x"))),
                 out_shardings=NamedSharding(jm, P()))
    text = fn.lower(jax.ShapeDtypeStruct((layers, d, d), jax.numpy.float32),
                    jax.ShapeDtypeStruct((8 * len(jax.devices()), d), jax.numpy.float32)).compile().as_text()
    found = compiled_collectives(text)
    if len(jax.devices()) > 1:
        assert sum(c.bytes for c in found) == layers * d * d * 4


def test_tuple_all_to_all_is_one_collective_per_group() -> None:
    """XLA's CPU backend lowers one array all-to-all as a tuple of one chunk per peer (no
    `dimensions=`): that is one all-to-all of the chunks' total bytes, not group-size of them."""
    chunks = ", ".join(["f32[1,16]{1,0}"] * 4)
    text = (f"%a2a = ({chunks}) all-to-all(%s0, %s1, %s2, %s3), channel_id=1, "
            "replica_groups=mesh['a0'=2,'a1'=4] {'a1'}\n"
            "%arr = f32[8,16]{1,0} all-to-all(%x), replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}")
    found = compiled_collectives(text)
    assert [(c.kind, c.bytes) for c in found] == [("all-to-all", 256.0), ("all-to-all", 512.0)]


def test_compiled_all_to_all_counts_once() -> None:
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    jm = jax.make_mesh((8,), ("x",))
    fn = jax.jit(jax.shard_map(lambda a: jax.lax.all_to_all(a, "x", 0, 1, tiled=True), mesh=jm,
                               in_specs=P("x"), out_specs=P("x")))
    x = jax.device_put(jax.numpy.ones((64, 16), jax.numpy.float32), NamedSharding(jm, P("x")))
    found = compiled_collectives(fn.lower(x).compile().as_text())
    assert [c.kind for c in found] == ["all-to-all"]
    assert found[0].bytes == 8 * 16 * 4.0

@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(PARALLEL_MODELS))
@pytest.mark.parametrize("mesh", ["8", "2x4", "4x2"])
def test_twenty_random_plans_per_case_and_mesh(model: str, mesh: str) -> None:
    graph = build_parallel_model(model)
    m = parse_mesh(mesh)
    pe = saturate_and_price(graph, m)
    for plan in random_plans(pe, 20, seed=0):
        assert check_on_devices(graph, plan, m)["numerics_ok"]


@pytest.mark.parametrize("mesh_spec", ["8", pytest.param("2x4", marks=pytest.mark.slow)])
def test_predicted_step_memory_within_15pct_on_small_plans(mesh_spec: str) -> None:
    """The simulated step memory of the found plan and of random plans is what XLA allocates for
    the training step (memory_analysis: arguments + outputs + temporaries) within 15%, and the ILP
    row's value bounds it from above."""
    from jax_backend.checks import reference_gradients

    graph = gpt(1, d=32, heads=4, seq=8, batch=2)
    mesh = parse_mesh(mesh_spec)
    pe = saturate_and_price(graph, mesh)
    reference = reference_gradients(graph)
    for plan in [plan_graph(graph, mesh, time_limit=3.0).plan, *random_plans(pe, 2, seed=5)]:
        report = plan_report(plan, pe.model)
        measured = check_on_devices(graph, plan, mesh, reference=reference)["measured_mem_bytes"]
        assert abs(report.mem_bytes - measured) <= 0.15 * measured
        assert report.mem_bytes <= report.mem_bound_bytes


SMALL_MEMORY_CASES = {
    "bottleneck": lambda: mlp_bottleneck(batch=256, d=16, hidden=512, narrow=1),  # a fused relu's product
    "cnn": lambda: cnn(batch=8, channels=4, size=8, classes=4),  # a conv's relaid operands, zero pads
}


@pytest.mark.parametrize("case", sorted(SMALL_MEMORY_CASES))
def test_predicted_step_memory_within_15pct_on_relu_and_conv_plans(case: str) -> None:
    """What XLA keeps beyond the values themselves: the product under a fused relu (its
    derivative's mask) next to the relu's output, a convolution's operands relaid channels-last,
    and the zeros a partition's gradient is padded into, made at the start of the step."""
    from jax_backend.checks import reference_gradients

    graph = SMALL_MEMORY_CASES[case]()
    mesh = parse_mesh("8")
    pe = saturate_and_price(graph, mesh)
    reference = reference_gradients(graph)
    for plan in [plan_graph(graph, mesh, time_limit=3.0, priced=pe).plan, *random_plans(pe, 2, seed=5)]:
        report = plan_report(plan, pe.model)
        measured = check_on_devices(graph, plan, mesh, reference=reference)["measured_mem_bytes"]
        assert abs(report.mem_bytes - measured) <= 0.15 * measured
        assert report.mem_bytes <= report.mem_bound_bytes


@pytest.mark.slow
@pytest.mark.parametrize("model", ["unity-mlp", "mlp16", "gpt-block", "dlrm", "mlp-bottleneck", "cnn"])
@pytest.mark.parametrize("mesh_spec", ["8", "2x4", "4x2"])
def test_predicted_step_memory_within_15pct(model: str, mesh_spec: str) -> None:
    """The plan's predicted per-device memory is what XLA allocates for its training step, so the
    ILP's memory budget means something on the devices."""
    graph = build_parallel_model(model)
    mesh = parse_mesh(mesh_spec)
    res = plan_graph(graph, mesh, time_limit=3.0)
    measured = check_on_devices(graph, res.plan, mesh)["measured_mem_bytes"]
    assert abs(res.report.mem_bytes - measured) <= 0.15 * measured


@pytest.mark.parametrize("case", ["conv", pytest.param("gpt", marks=pytest.mark.slow)])
def test_compiled_step_recomputes_no_product(case: str) -> None:
    """XLA's training step runs exactly the plan's products (each forward one, one more per operand
    taking a gradient): nothing rematerialized, for the extracted plan and random ones."""
    from jax_backend.checks import reference_gradients

    graph = cnn(batch=2, channels=8, size=8, classes=8) if case == "conv" else gpt(1, d=32, heads=8, seq=8, batch=2)
    mesh = parse_mesh("2x4")
    pe = saturate_and_price(graph, mesh)
    reference = reference_gradients(graph)
    for plan in [plan_graph(graph, mesh, time_limit=3.0, priced=pe).plan, *random_plans(pe, 2, seed=7)]:
        measured = check_on_devices(graph, plan, mesh, reference=reference)["measured_step_contractions"]
        assert measured == plan_report(plan, pe.model).contractions


def test_recomputed_products_are_counted() -> None:
    """The check can fail: under `jax.checkpoint` the backward recomputes the layer's product
    (forward 2 products, backward 2; one more when rematerialized)."""
    import jax.numpy as jnp

    from jax_backend.shard import compiled_contractions

    def layer(w: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.tanh(x @ w)

    def count(layer_fn: object) -> int:
        def loss(w: jax.Array, x: jax.Array, r: jax.Array) -> jax.Array:
            return jnp.sum(layer_fn(w, x) @ r)  # type: ignore[operator]

        args = jnp.ones((16, 4)), jnp.ones((8, 16)), jnp.ones((4, 3))
        return compiled_contractions(jax.jit(jax.value_and_grad(loss)).lower(*args).compile().as_text())

    assert count(layer) == 4
    assert count(jax.checkpoint(layer)) == 5


@pytest.mark.parametrize(("a", "b"), [((8, 8, 8), (8, 8, 1)), ((8, 8, 8), (8, 8, 4)), ((8, 1), (1, 8)),
                                      ((4, 8, 16), (16, 1)), ((1, 16), (16, 8))])
def test_step_products_match_the_compiled_gradient(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    """A product that sums over a dimension of size 1 is compiled as a multiply, not a dot: the
    expected count follows (a random 2x4 GPT plan with a 1-wide head split found this)."""
    import jax.numpy as jnp

    from jax_backend.shard import compiled_contractions

    def loss(x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.sum(jnp.tanh(jnp.matmul(x, y)))

    text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(jnp.ones(a), jnp.ones(b)).compile().as_text()
    assert compiled_contractions(text) == step_products("matmul", [a, b], [True, True])


def test_rendezvous_count_a_combined_tuple_once_and_a_loop_per_trip() -> None:
    """Every device waits at each collective operation: a tuple all-reduce XLA combined from two
    of the plan's counts once (`compiled_collectives` counts both elements), one in a loop body
    once per trip, an async pair once."""
    text = ("%body (p: f32[4]) -> f32[4] {\n"
            "  %ar = f32[4]{0} all-reduce(%p), replica_groups={{0,1}}, to_apply=%add\n}\n"
            "ENTRY %main (x: f32[4], y: f32[8]) -> f32[4] {\n"
            "  %t = (f32[4]{0}, f32[8]{0}) all-reduce(%x, %y), replica_groups={{0,1}}, to_apply=%add\n"
            "  %s = f32[8]{0} all-gather-start(%x), replica_groups={{0,1}}, dimensions={0}\n"
            "  %d = f32[8]{0} all-gather-done(%s)\n"
            '  %w = f32[4]{0} while(%x), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}\n}\n')
    assert len(compiled_collectives(text)) == 2 + 1 + 3
    assert compiled_rendezvous(text) == 1 + 1 + 3


def test_copy_bytes_sum_every_copy_result() -> None:
    text = ("  %c0 = f32[512,256]{0,1} copy(%p0), metadata={op_name=\"x\"}\n"
            "  ROOT %c1 = bf16[8,4]{1,0} copy(%p1)\n"
            "  %n = f32[9]{0} negate(%c0)\n")
    assert compiled_copy_bytes(text) == 512 * 256 * 4 + 8 * 4 * 2
    assert compiled_copy_bytes("%n = f32[9]{0} negate(%x)") == 0.0


_SLICED = """HloModule m

%fused (param_0: f32[16,512], param_1: f32[512,128], param_2: u32[]) -> f32[16,512] {
  %param_1 = f32[512,128]{1,0} parameter(1)
  %zero = s32[] constant(0)
  %param_2 = u32[] parameter(2)
  %rank = s32[] convert(%param_2)
  %width = s32[] constant(16)
  %offset = s32[] multiply(%rank, %width)
  %ds = f32[512,16]{1,0} dynamic-slice(%param_1, %zero, %offset), dynamic_slice_sizes={512,16}
  %t = f32[16,512]{0,1} transpose(%ds), dimensions={1,0}
  %param_0 = f32[16,512]{1,0} parameter(0)
  ROOT %add = f32[16,512]{1,0} add(%t, %param_0)
}

ENTRY %main (a: f32[512,128], b: f32[128], m: f32[16,512]) -> (f32[16,512], f32[128]) {
  %a = f32[512,128]{1,0} parameter(0)
  %b = f32[128]{0} parameter(1)
  %m = f32[16,512]{1,0} parameter(2)
  %pid = u32[] partition-id()
  %ar = (f32[512,128]{1,0}, f32[128]{0}) all-reduce(%a, %b), channel_id=1, replica_groups=mesh['x'=8] {'x'}, to_apply=%sum
  %g0 = f32[512,128]{1,0} get-tuple-element(%ar), index=0
  %g1 = f32[128]{0} get-tuple-element(%ar), index=1
  %upd = f32[16,512]{1,0} fusion(%m, %g0, %pid), kind=kLoop, calls=%fused
  ROOT %out = (f32[16,512]{1,0}, f32[128]{0}) tuple(%upd, %g1)
}
"""


def test_an_all_reduce_every_use_of_which_keeps_the_devices_slice_is_a_reduce_scatter_on_the_wire() -> None:
    """GSPMD writes a reduce-scatter as all-reduce + dynamic-slice at the partition id (XLA's CPU
    backend runs it so): such an element counts its buffer as before and sends a reduce-scatter's
    (n-1)/n of it; an element used whole (or sliced at a fixed offset, or not 1/n) an all-reduce's 2(n-1)/n."""
    from eqsat.parallel.timemodel import wire_bytes
    from jax_backend.shard import sliced_all_reduces

    assert sliced_all_reduces(_SLICED) == {("ar", 0)}
    big, small = compiled_collectives(_SLICED)
    assert (big.sliced, small.sliced) == (True, False) and big.group_size == 8
    assert big.bytes == 512 * 128 * 4 and big.wire_bytes == pytest.approx(7 / 8 * big.bytes)
    assert small.wire_bytes == pytest.approx(wire_bytes("all-reduce", 8, 128 * 4)) == pytest.approx(2 * 7 / 8 * 512)
    assert sliced_all_reduces(_SLICED.replace("fusion(%m, %g0, %pid)", "fusion(%m, %g0, %c)")) == set()  # no rank
    assert sliced_all_reduces(_SLICED.replace("dynamic_slice_sizes={512,16}", "").replace(
        "f32[512,16]{1,0} dynamic-slice", "f32[512,32]{1,0} dynamic-slice")) == set()  # 1/4, not 1/8
    whole = _SLICED.replace("ROOT %out = (f32[16,512]{1,0}, f32[128]{0}) tuple(%upd, %g1)",
                            "ROOT %out = (f32[16,512]{1,0}, f32[512,128]{1,0}) tuple(%upd, %g0)")
    assert sliced_all_reduces(whole) == set()  # also returned whole


def test_a_collective_permute_sends_its_buffer_once() -> None:
    text = "%cp = f32[64]{0} collective-permute(%a), channel_id=1, source_target_pairs={{0,1},{1,0}}"
    (cp,) = compiled_collectives(text)
    assert cp.bytes == 256 and cp.wire_bytes == 256
