"""Per-device work read from compiled HLO (``jaxrl_llm/train/compile/hlo_cost.py``): loop trip
counts applied (a scanned layer counts L times, as its unrolled twin does), and the decode
loop's per-device FLOPs split over ``data`` (issue 30 item 4), on 8 forced CPU devices."""

import jax
import jax.numpy as jnp
import pytest

from jaxrl_llm import models
from jaxrl_llm.parallel.topology import Topology
from jaxrl_llm.train.compile.aot import compile_preset
from jaxrl_llm.train.compile.hlo_cost import collective_hops, hlo_cost

L, B, D = 5, 24, 40  # odd, distinct sizes


def _layer(h, w):
    return jnp.tanh(h @ w)


def scanned(x, ws):
    return jax.lax.scan(lambda h, w: (_layer(h, w), None), x, ws)[0].sum()


def unrolled(x, ws):
    h = x
    for i in range(L):
        h = _layer(h, ws[i])
    return h.sum()


def fori(x, ws):
    return jax.lax.fori_loop(0, L, lambda i, h: _layer(h, ws[i]), x).sum()


ARGS = (jax.ShapeDtypeStruct((B, D), jnp.float32), jax.ShapeDtypeStruct((L, D, D), jnp.float32))


def _cost(fn):
    compiled = jax.jit(fn).lower(*ARGS).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return hlo_cost(compiled.as_text()), cost


@pytest.mark.parametrize("loop", [scanned, fori], ids=["scan", "fori_loop"])
def test_loop_counts_its_trip_count_times(loop):
    looped, xla = _cost(loop)
    flat, _ = _cost(unrolled)
    # the unrolled twin: L matmuls [B, D] x [D, D], 2·B·D·D each
    assert flat.flops == flat.flops_once == 2 * B * D * D * L and flat.trip_counts == ()
    assert looped.trip_counts == (L,) and looped.unknown_loops == 0
    assert looped.flops == flat.flops
    # counted once per loop body, as XLA's cost analysis counts it: its flops (which add the
    # elementwise tanh and sum, B·D·L + ... at most) are the matmuls of one layer plus a little
    assert looped.flops_once == looped.flops / L
    assert looped.flops_once <= xla["flops"] <= looped.flops_once * 1.1
    # HBM bytes scale by the loop too (the body's traffic L times, the rest once) and count
    # once per body they are XLA's "bytes accessed" (within 10%: our count reads a fusion
    # operand once per fusion)
    assert looped.hbm_bytes > 0.8 * L * (looped.hbm_bytes_once - 2 * B * D * 4)
    assert looped.hbm_bytes_once == pytest.approx(xla["bytes accessed"], rel=0.1)


def test_gradient_of_a_scan_counts_both_loops():
    looped, _ = _cost(jax.grad(scanned, argnums=1))
    flat, _ = _cost(jax.grad(unrolled, argnums=1))
    # forward 2·B·D·D and backward 2 × that (input and weight gradients) per layer; unrolled,
    # XLA drops the first layer's input gradient (x is not differentiated), the scan's body
    # computes it every time
    assert looped.trip_counts == (L, L)
    assert looped.flops == 3 * 2 * B * D * D * L
    assert flat.flops == (3 * L - 1) * 2 * B * D * D


TINY = models.ModelConfig(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=80,
    num_layers=2,
    num_heads=3,
    num_kv_heads=1,
    head_dim=16,
)


def _decode(data: int):
    devices = tuple(jax.devices()[:data])
    # the compile path on CPU devices: a "slice" of `data` forced CPU devices
    cpu = Topology(
        name=f"cpu:{data}",
        generation="v5e",
        chips=data,
        devices=devices,
        hbm_bytes_per_device=2**34,
    )
    report = compile_preset(
        TINY, "grpo", cpu, data=data, batch_size=8, group_size=2, seq_len=48, prompt_len=16
    )
    return {p.name: p for p in report.programs}["decode"]


def test_decode_flops_per_device_split_over_data():
    assert len(jax.devices()) >= 8, "tests/conftest.py forces 8 CPU devices"
    one, eight = _decode(1), _decode(8)
    # 8 prompts x G=2 = 16 rows, 32 decode steps: each of 8 devices decodes 2 rows
    assert one.unknown_loops == eight.unknown_loops == 1  # the data-dependent while_loop
    assert 32 in one.trip_counts and 32 in eight.trip_counts
    assert eight.hlo_flops == pytest.approx(one.hlo_flops / 8, rel=0.02)
    # the model FLOPs: 2·N per generated token over the devices
    assert eight.model_flops == pytest.approx(one.model_flops / 8)
    assert one.hlo_flops == pytest.approx(one.model_flops, rel=0.5)


# The shape of a scan as the TPU compiler leaves it (no known_trip_count): the condition
# compares the counter with a constant, the body adds 1, the loop starts from a constant.
_TPU_LOOP = """HloModule scan

%body (p: (s32[], f32[8,16], f32[16,16])) -> (s32[], f32[8,16], f32[16,16]) {
  %p = (s32[]{:T(128)}, f32[8,16]{1,0}, f32[16,16]{1,0}) parameter(0)
  %i = s32[]{:T(128)} get-tuple-element(%p), index=0
  %h = f32[8,16]{1,0} get-tuple-element(%p), index=1
  %w = f32[16,16]{1,0} get-tuple-element(%p), index=2
  %one = s32[]{:T(128)} constant(1)
  %next = s32[]{:T(128)} add(%i, %one)
  %dot = f32[8,16]{1,0} dot(%h, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (s32[]{:T(128)}, f32[8,16]{1,0}, f32[16,16]{1,0}) tuple(%next, %dot, %w)
}

%cond (c: (s32[], f32[8,16], f32[16,16])) -> pred[] {
  %limit = s32[]{:T(128)} constant(LIMIT)
  %c = (s32[]{:T(128)}, f32[8,16]{1,0}, f32[16,16]{1,0}) parameter(0)
  %j = s32[]{:T(128)} get-tuple-element(%c), index=0
  ROOT %lt = pred[]{:T(512)} compare(%j, %limit), direction=LT
}

ENTRY %main (x: f32[8,16], w: f32[16,16]) -> f32[8,16] {
  %x = f32[8,16]{1,0} parameter(0)
  %w0 = f32[16,16]{1,0} parameter(1)
  %start = s32[]{:T(128)} constant(START)
  %init = (s32[]{:T(128)}, f32[8,16]{1,0}, f32[16,16]{1,0}) tuple(%start, %x, %w0)
  %loop = (s32[]{:T(128)}, f32[8,16]{1,0}, f32[16,16]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[8,16]{1,0} get-tuple-element(%loop), index=1
}
"""


@pytest.mark.parametrize("start, limit, trips", [(0, 7, 7), (2, 7, 5), (0, 0, 0)])
def test_trip_count_from_the_loop_condition(start, limit, trips):
    text = _TPU_LOOP.replace("START", str(start)).replace("LIMIT", str(limit))
    cost = hlo_cost(text)
    assert cost.trip_counts == (trips,) and cost.unknown_loops == 0
    assert cost.flops == trips * 2 * 8 * 16 * 16 and cost.flops_once == 2 * 8 * 16 * 16


def test_loop_without_a_count_takes_the_given_bound():
    # a data-dependent condition (the sampler's: stop when every row is done)
    text = _TPU_LOOP.replace("START", "0").replace("constant(LIMIT)", "parameter(1)")
    cost = hlo_cost(text, unknown_trips=11)
    assert cost.unknown_loops == 1 and cost.trip_counts == (11,)
    assert cost.flops == 11 * 2 * 8 * 16 * 16


_GATHER = """HloModule g

ENTRY %main (p: bf16[8,16]) -> bf16[32,16] {
  %p = bf16[8,16]{1,0} parameter(0)
  ROOT %ag = bf16[32,16]{1,0} all-gather(%p), channel_id=1, GROUPS, dimensions={0}
}
"""


@pytest.mark.parametrize(
    "groups",
    [
        "replica_groups={{0,1,2,3},{4,5,6,7}}",
        "replica_groups=[2,4]<=[8]",
        "replica_groups=mesh['data'=2,'fsdp'=4] {'fsdp'}",
    ],
)
def test_all_gather_sends_n_minus_one_shards(groups):
    # groups of 4: each device sends its 8 x 16 bf16 shard (256 bytes) to the 3 others
    cost = hlo_cost(_GATHER.replace("GROUPS", groups), num_devices=8)
    assert cost.collectives == {"all-gather": 3 * 256} and cost.collective_bytes == 768


def test_collectives_of_a_sharded_program_on_8_devices():
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(jax.devices()[:8], ("d",))
    x = jax.ShapeDtypeStruct(
        (64, 40), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec("d"))
    )
    whole = NamedSharding(mesh, PartitionSpec())
    summed = jax.jit(lambda x: x.sum(0), out_shardings=whole).lower(x).compile()
    # each device's partial sum, f32[40] = 160 bytes, all-reduced: 2 · 7/8 · 160 (ring)
    assert hlo_cost(summed.as_text(), num_devices=8).collectives == {"all-reduce": 280.0}
    gathered = jax.jit(lambda x: x, out_shardings=whole).lower(x).compile()
    # each device's 8 rows (1280 bytes) to the 7 others
    assert hlo_cost(gathered.as_text(), num_devices=8).collectives == {"all-gather": 7 * 1280}


# A batched matmul as the TPU compiler writes it: the batch dimension (4) as a window of 4
# over a spatial dimension of 1, padded 3 on each side, so each output position meets one
# real input element: 2 · (128 · 32 output batch x features) · 128 input features · 4 pairs.
_CONV = """HloModule conv

ENTRY %main (x: bf16[128,128,1], k: bf16[128,4,32]) -> bf16[128,4,32] {
  %x = bf16[128,128,1]{2,1,0} parameter(0)
  %k = bf16[128,4,32]{2,1,0} parameter(1)
  ROOT %c = bf16[128,4,32]{2,1,0} convolution(%x, %k), window={size=4 pad=3_3 rhs_reversal=1}, dim_labels=bf0_i0o->b0f
}
"""


def test_padded_window_convolution_counts_real_pairs_only():
    assert hlo_cost(_CONV).flops == 2 * 128 * 32 * 128 * 4
    plain = _CONV.replace(" pad=3_3 rhs_reversal=1", "").replace(
        "bf16[128,128,1]", "bf16[128,128,4]"
    )
    plain = plain.replace("bf16[128,4,32]{2,1,0} convolution", "bf16[128,1,32]{2,1,0} convolution")
    # unpadded: one output position, 4 kernel positions on 4 real inputs
    assert hlo_cost(plain).flops == 2 * 128 * 32 * 128 * 4


# One layer's weights sliced out of the stacked [4, 16, 16] array inside a nested fusion
# (the layer scan's read): the fusion reads a quarter of it, 4 · 16 · 16 / 4 floats.
_NESTED = """HloModule nested

%slice (s0: f32[4,16,16], s1: s32[]) -> f32[16,16] {
  %s0 = f32[4,16,16]{2,1,0} parameter(0)
  %s1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  %ds = f32[1,16,16]{2,1,0} dynamic-slice(%s0, %s1, %zero, %zero), dynamic_slice_sizes={1,16,16}
  ROOT %b = f32[16,16]{1,0} bitcast(%ds)
}

%outer (p0: f32[4,16,16], p1: s32[], p2: f32[8,16]) -> f32[8,16] {
  %p0 = f32[4,16,16]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %p2 = f32[8,16]{1,0} parameter(2)
  %w = f32[16,16]{1,0} fusion(%p0, %p1), kind=kLoop, calls=%slice
  ROOT %d = f32[8,16]{1,0} dot(%p2, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (ws: f32[4,16,16], i: s32[], x: f32[8,16]) -> f32[8,16] {
  %ws = f32[4,16,16]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %x = f32[8,16]{1,0} parameter(2)
  ROOT %f = f32[8,16]{1,0} fusion(%ws, %i, %x), kind=kOutput, calls=%outer
}
"""


def test_fusion_reads_the_slice_it_takes_of_a_stacked_operand():
    # the slice (16 · 16 floats) + the index (4 bytes) + x (8 · 16) + the result (8 · 16)
    assert hlo_cost(_NESTED).hbm_bytes == 4 * (16 * 16 + 1 + 8 * 16 + 8 * 16)
    assert hlo_cost(_NESTED).flops == 2 * 8 * 16 * 16


def test_all_gather_hops_and_calls():
    # a ring over 4 devices passes 3 steps; one collective call
    cost = hlo_cost(_GATHER.replace("GROUPS", "replica_groups=[2,4]<=[8]"), num_devices=8)
    assert cost.collective_calls == 1 and cost.collective_hops == 3
    assert collective_hops("all-reduce", 8) == 14 and collective_hops("all-gather", 1) == 0
    assert collective_hops("collective-permute", 2) == 1


# a layer's slice copied out of a stacked cache (a dynamic-slice fusion, as XLA:TPU leaves it
# before the attention reads it), an in-place write of one token (not a copy) and an eviction
# of an on-chip buffer back to HBM (an asynchronous copy, counted as a copy); the prefetch
# into on-chip memory reads HBM but is no copy
_COPIES = """HloModule c

%slice_it (a: bf16[4,8,16], i: s32[]) -> bf16[1,8,16] {
  %a = bf16[4,8,16]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %z = s32[] constant(0)
  ROOT %s = bf16[1,8,16]{2,1,0} dynamic-slice(%a, %i, %z, %z), dynamic_slice_sizes={1,8,16}
}

%write_it (a: bf16[4,8,16], u: bf16[1,1,16], i: s32[]) -> bf16[4,8,16] {
  %a = bf16[4,8,16]{2,1,0} parameter(0)
  %u = bf16[1,1,16]{2,1,0} parameter(1)
  %i = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %w = bf16[4,8,16]{2,1,0} dynamic-update-slice(%a, %u, %i, %z, %z)
}

ENTRY %main (a: bf16[4,8,16], u: bf16[1,1,16], i: s32[], b: bf16[8,16]) -> bf16[1,8,16] {
  %a = bf16[4,8,16]{2,1,0} parameter(0)
  %u = bf16[1,1,16]{2,1,0} parameter(1)
  %i = s32[] parameter(2)
  %b = bf16[8,16]{1,0} parameter(3)
  %pre = (bf16[8,16]{1,0:S(1)}, bf16[8,16]{1,0}, u32[]) copy-start(%b)
  %on = bf16[8,16]{1,0:S(1)} copy-done(%pre)
  %ev = (bf16[8,16]{1,0}, bf16[8,16]{1,0:S(1)}, u32[]) copy-start(%on)
  %back = bf16[8,16]{1,0} copy-done(%ev)
  %w = bf16[4,8,16]{2,1,0} fusion(%a, %u, %i), kind=kLoop, calls=%write_it
  ROOT %s = bf16[1,8,16]{2,1,0} fusion(%w, %i), kind=kLoop, calls=%slice_it
}
"""


def test_copies_are_reported_apart():
    cost = hlo_cost(_COPIES)
    layer = 8 * 16 * 2  # one layer's slice, bf16
    token = 16 * 2
    slice_copy = layer + 4 + layer  # reads the slice (and the index), writes it
    write = 2 * token + 4 + token  # in place: the update read and written, the update operand
    prefetch = 8 * 16 * 2  # reads b from HBM into on-chip memory
    eviction = 8 * 16 * 2  # writes it back
    assert cost.copy_bytes == slice_copy + eviction
    assert cost.hbm_bytes == slice_copy + write + prefetch + eviction
