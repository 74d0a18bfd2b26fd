"""The requantizer's float mode: bit-exact against the numpy reference of the float mode
(``sw.quant.requantize_float``, itself checked against onnxruntime in ``tb/test_quant.py``)
on the hard cases, on random values, and on a broken design that the tests must catch.

Set ``NPU_SEED`` to rerun the random cases with another seed; failures carry the seed.
"""

import os

import numpy as np
import pytest

from hw.isa import QuantMode
from hw.requant import Requantizer
from quant_cases import FLOAT_EDGE_ACCS, FLOAT_EDGE_SCALES, double_rounded, float_ties
from sim.amaranth_sim import run_simulation
from sw.quant import requantize_float


BASE_SEED = int(os.environ.get("NPU_SEED", "17"))


LANES = 8


def _set_scales(ctx, dut, scale):
    """Float mode, with ``scale`` (float32, one per lane) as the lanes' multipliers."""
    ctx.set(dut.mode, QuantMode.FLOAT)
    bits = np.asarray(scale, np.float32).view(np.int32)
    ctx.set(dut.multiplier, [int(value) for value in bits])


def _run(batches, design=Requantizer):
    """Push each batch ``(rows, scale, zero_point, act_min, act_max)`` (rows of ``LANES``
    INT32 values, ``LANES`` scales) through one block, the rows of a batch back to back; the
    parameters change only when the pipeline is empty. Returns the INT8 rows of every
    batch. Each row must come out exactly ``latency`` cycles after it went in."""
    dut = design(LANES)
    latency = dut.latency
    outputs = []

    async def testbench(ctx):
        for rows, scale, zero_point, act_min, act_max in batches:
            _set_scales(ctx, dut, scale)
            ctx.set(dut.zero_point, zero_point)
            ctx.set(dut.act_min, act_min)
            ctx.set(dut.act_max, act_max)
            await ctx.tick().repeat(dut.setup)     # the lanes copy the parameters
            outputs.append([])
            for cycle, row in enumerate(list(rows) + [None] * latency):
                ctx.set(dut.valid, row is not None)
                if row is not None:
                    ctx.set(dut.acc, [int(value) for value in row])
                await ctx.tick()
                assert ctx.get(dut.result_valid) == (0 <= cycle + 1 - latency < len(rows))
                if ctx.get(dut.result_valid):
                    outputs[-1].append([int(value) for value in ctx.get(dut.result)])

    run_simulation(dut, testbench)
    return [np.array(rows, dtype=np.int8) for rows in outputs]


def _batches(accs, scales, clamps):
    """Every accumulator of ``accs`` (rows of lane values) with the scales of ``scales``
    (one per lane) cut into batches of ``LANES`` lanes, for each ``(zero_point, act_min,
    act_max)`` of ``clamps``."""
    accs = np.asarray(accs, dtype=np.int32)
    scales = np.asarray(scales, dtype=np.float32)
    padding = -len(scales) % LANES
    accs = np.pad(accs, ((0, 0), (0, padding)))
    scales = np.pad(scales, (0, padding))
    return [(accs[:, lane:lane + LANES], scales[lane:lane + LANES], *clamp)
            for clamp in clamps for lane in range(0, len(scales), LANES)]


def _check(batches, design=Requantizer, context=""):
    """Every batch's rows equal :func:`requantize_float`'s."""
    wrong = []
    for (rows, scale, *clamp), got in zip(batches, _run(batches, design)):
        want = requantize_float(rows, scale, *clamp)
        wrong += [f"acc {rows[r, c]} * scale {scale[c]!r} with (zero point, min, max) "
                  f"{tuple(clamp)} -> {got[r, c]} not {want[r, c]}"
                  for r, c in np.argwhere(got != want)]
    assert not wrong, f"{context} {len(wrong)} wrong, first " + "; ".join(wrong[:4])


# Every edge accumulator times every edge scale (one scale per lane), for clamps and zero
# points at both ends.
CLAMPS = [(0, -128, 127), (-128, -128, 127), (127, -128, 127), (5, 5, 127), (-3, -10, 6),
          (-128, 127, 127), (127, -128, -128)]


def test_edges():
    rows = [[acc] * len(FLOAT_EDGE_SCALES) for acc in FLOAT_EDGE_ACCS]
    _check(_batches(rows, FLOAT_EDGE_SCALES, CLAMPS))


def test_ties_and_double_rounding():
    pairs = float_ties()
    exact = [pair for pair in pairs if not double_rounded(*pair)]
    rounded = [pair for pair in pairs if double_rounded(*pair)]
    assert len(exact) >= 20 and len(rounded) >= 100, (len(exact), len(rounded))
    # One lane per pair, every lane given its own accumulator in row 0; the later rows move
    # each lane's accumulator by one, off the tie.
    accs, scales = zip(*pairs)
    rows = [list(accs), [acc + 1 for acc in accs], [acc - 1 for acc in accs]]
    rows = np.clip(np.array(rows, dtype=np.int64), -(1 << 31), (1 << 31) - 1)
    _check(_batches(rows, scales, [(0, -128, 127), (-128, -128, 127), (127, -128, 127)]))


def test_clamp_at_its_edges():
    """Every result from -210 to 210 before the clamp, on both sides of each bound, with
    and without a round-up (a product of .75 rounds up, of .25 not, of .5 to even) and of
    either sign, for clamps whose bounds less the zero point lie in that range: the lane
    compares the integer part with the bounds before the rounding decision."""
    scales = [1.0, 0.25, 0.25, -1.0, -0.25, -0.25, 0.5, -0.5]
    rows = [[y, 4 * y + 3, 4 * y + 1, y, 4 * y + 3, 4 * y + 1, 2 * y + 1, 2 * y + 1]
            for y in range(-210, 211)]
    _check(_batches(rows, scales, [(-3, -10, 6), (100, -100, 50), (-60, -128, 100)]))


def _random_case(rng, rows, cols):
    """Accumulators of every magnitude; scales from 2**-40 to 2**6, some negative, some
    subnormal or zero, so that most results are neither 0 nor saturated."""
    magnitude = rng.integers(0, 32, size=(rows, cols))
    acc = (rng.integers(-(1 << 31), 1 << 31, size=(rows, cols)) >> magnitude).astype(np.int32)
    scale = rng.uniform(0.5, 1.0, size=cols) * 2.0 ** rng.integers(-40, 7, size=cols)
    scale *= np.where(rng.random(cols) < 0.3, -1.0, 1.0)
    scale[rng.random(cols) < 0.1] = 1e-40                    # subnormal
    zero_point = int(rng.integers(-128, 128))
    act_min = int(rng.integers(-128, 128))
    act_max = int(rng.integers(act_min, 128))
    return acc, scale.astype(np.float32), zero_point, act_min, act_max


@pytest.mark.parametrize("offset", range(3))
def test_random(offset):
    seed = BASE_SEED + offset
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    acc, scale, zero_point, act_min, act_max = _random_case(rng, 60, LANES)
    # Scale the accumulators so that |acc * scale| is mostly within 0 .. 300.
    target = rng.uniform(0, 300, size=acc.shape) * np.where(acc < 0, -1, 1)
    steered = np.clip(np.round(target / np.where(scale == 0, 1, np.abs(scale)).astype(
        np.float64)), -(1 << 31), (1 << 31) - 1).astype(np.int32)
    rows = np.concatenate([acc, steered])
    _check([(rows, scale, zero_point, act_min, act_max)], context=f"seed {seed}:")


def test_result_holds_until_the_next_row():
    """The store unit reads the result as long as the DMA writer makes it wait."""
    dut = Requantizer(2)
    scale = np.array([0.25, -0.25], dtype=np.float32)

    async def testbench(ctx):
        _set_scales(ctx, dut, scale)
        ctx.set(dut.act_min, -128)
        ctx.set(dut.act_max, 127)
        await ctx.tick().repeat(Requantizer.setup)
        ctx.set(dut.acc, [10, 10])
        ctx.set(dut.valid, 1)
        await ctx.tick()
        ctx.set(dut.valid, 0)
        ctx.set(dut.acc, [1 << 20, 1 << 20])
        await ctx.tick().repeat(Requantizer.latency + 20)
        assert [int(v) for v in ctx.get(dut.result)] == [2, -2]      # 2.5 and -2.5 to even
        assert not ctx.get(dut.result_valid)

    run_simulation(dut, testbench)



class RoundsHalfUp(Requantizer):
    """A broken design: the integer rounding takes ties away from zero (as gemmlowp does),
    not to even."""
    @staticmethod
    def _rounds_up(twice, middle_any, middle_all, float_up):
        return (float_up & middle_all) | twice[0]


class DropsTheFloatCarry(Requantizer):
    """A broken design: the float32 rounding of the product never carries into the half
    bit, so a product just below a tie (or just below x.5 + 0.5) rounds as if it had not
    been rounded to 24 bits."""
    @staticmethod
    def _rounds_up(twice, middle_any, middle_all, float_up):
        return twice[0] & (middle_any | float_up | twice[1])


@pytest.mark.parametrize("design", [RoundsHalfUp, DropsTheFloatCarry])
def test_the_tests_catch_a_broken_rounding(design):
    """The ties fail on each mutant (and pass on the real block)."""
    accs, scales = zip(*float_ties())
    batches = _batches([accs], scales, [(0, -128, 127)])
    _check(batches)
    with pytest.raises(AssertionError, match="wrong, first"):
        _check(batches, design=design)
