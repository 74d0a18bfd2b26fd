"""Unit tests of :class:`hw.pe.PE`: the multiply-accumulate, the shadow weight and the commit."""

import gc

import numpy as np
import pytest

from hw.pe import PE
from sim.amaranth_sim import run_simulation, wrap32


INT8_EDGES = (-128, -127, -1, 0, 1, 2, 127)


async def _mac(ctx, dut, a, psum, *, commit=0):
    """Present one activation and partial sum for a cycle; returns the registered psum_out."""
    ctx.set(dut.a_in, a)
    ctx.set(dut.psum_in, psum)
    ctx.set(dut.commit_in, commit)
    await ctx.tick()
    ctx.set(dut.commit_in, 0)
    return ctx.get(dut.psum_out)


async def _shift(ctx, dut, weight):
    ctx.set(dut.w_in, weight)
    ctx.set(dut.w_shift, 1)
    await ctx.tick()
    ctx.set(dut.w_shift, 0)


def test_mac_full_int8_range():
    """psum_out = psum_in + w * a for every activation against the INT8 edge weights, and for
    random weights, activations and partial sums (INT32 wrap-around included)."""
    seed = 0x9E01
    rng = np.random.default_rng(seed)
    dut = PE()

    async def testbench(ctx):
        for weight in INT8_EDGES:
            await _shift(ctx, dut, weight)
            for a in range(-128, 128):
                psum = int(rng.integers(-2**31, 2**31))
                # The first activation commits the weight: it is used in that very cycle.
                got = await _mac(ctx, dut, a, psum, commit=(a == -128))
                assert got == wrap32(psum + weight * a), \
                    f"w={weight} a={a} psum={psum}: psum_out={got}"
        # The extreme products, exactly.
        for weight, a, expected in ((-128, -128, 16384), (-128, 127, -16256),
                                    (127, -128, -16256), (127, 127, 16129)):
            await _shift(ctx, dut, weight)
            assert await _mac(ctx, dut, a, 0, commit=1) == expected
            assert await _mac(ctx, dut, a, 2**31 - 1) == wrap32(2**31 - 1 + expected)
            assert await _mac(ctx, dut, a, -2**31) == wrap32(-2**31 + expected)
        for _ in range(300):
            weight, a = (int(v) for v in rng.integers(-128, 128, size=2))
            psum = int(rng.integers(-2**31, 2**31))
            await _shift(ctx, dut, weight)
            got = await _mac(ctx, dut, a, psum, commit=1)
            assert got == wrap32(psum + weight * a), \
                f"seed {seed}: w={weight} a={a} psum={psum}: psum_out={got}"

    run_simulation(dut, testbench)


def test_shadow_shift_keeps_active_weight():
    """Shifting new shadow weights through the PE leaves the active weight in use, and w_out
    forwards the shifted weight one cycle later."""
    dut = PE()

    async def testbench(ctx):
        await _shift(ctx, dut, 7)
        assert await _mac(ctx, dut, 3, 100, commit=1) == 121
        # Shift a stream of other weights through while multiplying.
        for step, weight in enumerate((-128, 5, 127, -3, 0, 99)):
            ctx.set(dut.w_in, weight)
            ctx.set(dut.w_shift, 1)
            got = await _mac(ctx, dut, -11, step)
            assert got == step + 7 * -11, f"step {step}: active weight disturbed ({got})"
            assert ctx.get(dut.w_out) == weight, f"step {step}: w_out={ctx.get(dut.w_out)}"
        ctx.set(dut.w_shift, 0)
        # Without w_shift the shadow weight holds.
        ctx.set(dut.w_in, 55)
        for _ in range(3):
            assert await _mac(ctx, dut, 2, 0) == 14
            assert ctx.get(dut.w_out) == 99

    run_simulation(dut, testbench)


def test_commit_takes_effect_in_its_own_cycle():
    """The cycle with commit_in computes with the shadow weight; the cycle before still
    uses the old active weight, and the shadow weight stays active afterwards."""
    dut = PE()

    async def testbench(ctx):
        await _shift(ctx, dut, -5)
        assert await _mac(ctx, dut, 9, 0, commit=1) == -45
        await _shift(ctx, dut, 12)
        assert await _mac(ctx, dut, 9, 1) == 1 - 45          # old weight, shadow is 12
        assert await _mac(ctx, dut, 9, 1, commit=1) == 1 + 108  # new weight, same cycle
        assert await _mac(ctx, dut, -128, 0) == -1536           # and it stays active
        # Commit while shifting: the shadow weight before the shift is the one committed.
        await _shift(ctx, dut, -128)
        ctx.set(dut.w_in, 3)
        ctx.set(dut.w_shift, 1)
        assert await _mac(ctx, dut, 2, 0, commit=1) == -256
        ctx.set(dut.w_shift, 0)
        assert ctx.get(dut.w_out) == 3
        assert await _mac(ctx, dut, 2, 0) == -256

    run_simulation(dut, testbench)


def test_activation_and_commit_forwarding():
    """a_out and commit_out repeat a_in and commit_in one cycle later."""
    seed = 0x9E02
    rng = np.random.default_rng(seed)
    dut = PE()

    async def testbench(ctx):
        previous = (0, 0)
        assert (ctx.get(dut.a_out), ctx.get(dut.commit_out)) == previous
        for _ in range(64):
            a, commit = int(rng.integers(-128, 128)), int(rng.integers(0, 2))
            ctx.set(dut.a_in, a)
            ctx.set(dut.commit_in, commit)
            # Registered: nothing shows before the edge.
            assert (ctx.get(dut.a_out), ctx.get(dut.commit_out)) == previous, f"seed {seed}"
            await ctx.tick()
            assert (ctx.get(dut.a_out), ctx.get(dut.commit_out)) == (a, commit), f"seed {seed}"
            previous = (a, commit)

    run_simulation(dut, testbench)


@pytest.mark.parametrize("mac_pipeline", [1, 2, 3, 4])
def test_pipelined_product(mac_pipeline):
    """With ``mac_pipeline = L`` the product of cycle x (weight chosen by that cycle's commit)
    is added to the partial sum of cycle x + L: random activations, partial sums, commits and
    shifts, checked cycle by cycle. A pipelined PE gets its shadow shifts a cycle late from
    the mesh, so a commit takes the shadow value being shifted in, if any."""
    seed = 0x9E10 + mac_pipeline
    rng = np.random.default_rng(seed)
    dut = PE(mac_pipeline)

    async def testbench(ctx):
        active = shadow = 0
        products = [0] * mac_pipeline   # products[k]: due k + 1 cycles from now
        for cycle in range(400):
            a, psum = int(rng.integers(-128, 128)), int(rng.integers(-2**31, 2**31))
            commit, shift = int(rng.random() < 0.2), int(rng.random() < 0.3)
            w_in = int(rng.integers(-128, 128))
            for port, value in ((dut.a_in, a), (dut.psum_in, psum), (dut.commit_in, commit),
                                (dut.w_shift, shift), (dut.w_in, w_in)):
                ctx.set(port, value)
            weight = (w_in if shift else shadow) if commit else active
            due = products.pop(0)
            products.append(weight * a)
            await ctx.tick()
            active = weight
            if shift:
                shadow = w_in
            got = ctx.get(dut.psum_out)
            assert got == wrap32(psum + due), \
                f"seed {seed}, L={mac_pipeline}, cycle {cycle}: psum_out {got}"
            assert ctx.get(dut.w_out) == shadow, f"seed {seed}, cycle {cycle}"
            assert ctx.get(dut.a_out) == a, f"seed {seed}, cycle {cycle}"

    run_simulation(dut, testbench)


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_mac_pipeline_bounds():
    with pytest.raises(ValueError, match="mac_pipeline must be an integer from 0 to 4, not 5"):
        PE(5)
    gc.collect()   # the half-built PE warns when collected; collect it here, filtered
