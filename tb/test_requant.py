"""Requantizer: bit-exact against the numpy reference (sw.quant) over edge and random values."""

import numpy as np
import pytest

from hw.isa import QuantMode
from hw.requant import INT32_MAX, INT32_MIN, Requantizer
from sim.amaranth_sim import run_simulation
from sw.quant import requantize, requantize_float


def _run(cols, rows, multiplier, shift, zero_point, act_min, act_max):
    """Push ``rows`` through the requantizer back to back; return the INT8 rows. Each row
    must come out exactly ``Requantizer.latency`` cycles after it went in."""
    dut = Requantizer(cols)
    latency = Requantizer.latency
    outputs = []

    async def testbench(ctx):
        ctx.set(dut.multiplier, [int(v) for v in multiplier])
        ctx.set(dut.shift, [int(v) for v in shift])
        ctx.set(dut.zero_point, zero_point)
        ctx.set(dut.act_min, act_min)
        ctx.set(dut.act_max, act_max)
        await ctx.tick().repeat(Requantizer.setup)     # the lanes copy the parameters
        for cycle, row in enumerate(list(rows) + [None] * latency):
            ctx.set(dut.valid, row is not None)
            if row is not None:
                ctx.set(dut.acc, [int(v) for v in row])
            await ctx.tick()
            # After this tick it is cycle + 1: the row of cycle + 1 - latency is out.
            assert ctx.get(dut.result_valid) == (0 <= cycle + 1 - latency < len(rows)), cycle
            if ctx.get(dut.result_valid):
                outputs.append([int(v) for v in ctx.get(dut.result)])

    run_simulation(dut, testbench)
    return np.array(outputs, dtype=np.int8)


EDGES = [0, 1, -1, 2, -2, 1000, -1000, INT32_MAX, INT32_MIN, INT32_MAX - 1, INT32_MIN + 1,
         1 << 30, -(1 << 30), 12345678, -12345678]


@pytest.mark.parametrize("shift", [-31, -17, -3, -1, 0, 1, 2, 7, 15, 30, 31])
def test_edges_per_shift(shift):
    multipliers = [INT32_MIN, INT32_MAX, 1 << 30, 1, -1, 0, 1518500250, -1518500250]
    cols = len(multipliers)
    rows = [[acc] * cols for acc in EDGES]
    for zero_point, act_min, act_max in [(0, -128, 127), (-128, -128, 127), (127, -128, 127),
                                         (5, 5, 127), (-3, -10, 6)]:
        got = _run(cols, rows, multipliers, [shift] * cols, zero_point, act_min, act_max)
        want = requantize(np.array(rows, np.int32), np.array(multipliers, np.int32),
                          np.full(cols, shift, np.int32), zero_point, act_min, act_max)
        assert np.array_equal(got, want), (shift, zero_point, act_min, act_max, got, want)


@pytest.mark.parametrize("first", [1, 9, 17, 25])
def test_round_up_at_every_right_shift(first):
    """Each right shift S (a lane each) with h = SaturatingRoundingDoublingHighMul(x, M) at
    its rounding edges: h = k 2**S + 2**(S - 1) + d for small k and d, both signs, and
    -2**(S - 1) + 2**j for every j < S - 1 (x = 2h with M = 2**30 gives h exactly). The
    round-up reads the remainder's top bit and, for a negative h, the bits below it,
    through masks made from S: each of S's 31 values picks its own bits."""
    shifts = list(range(first, min(first + 8, 32)))
    cols = len(shifts)
    limit = (1 << 30) - 1
    columns = []
    for shift in shifts:
        values = []
        for k in (0, 1, 3):
            for d in (-2, -1, 0, 1, 2):
                for sign in (1, -1):
                    h = sign * (k * (1 << shift) + (1 << (shift - 1)) + d)
                    values.append(max(-limit, min(limit, h)))
        # A negative h whose remainder is its top bit and one bit j below it: the round-up
        # then rests on mask bit j alone.
        values += [-(1 << (shift - 1)) + (1 << j) for j in range(shift - 1)]
        columns.append(values)
    depth = max(len(values) for values in columns)
    rows = np.array([values + [0] * (depth - len(values)) for values in columns],
                    dtype=np.int64).T * 2
    multipliers = [1 << 30] * cols
    got = _run(cols, rows, multipliers, shifts, 0, -128, 127)
    want = requantize(rows.astype(np.int32), np.array(multipliers, np.int32),
                      np.array(shifts, np.int32), 0, -128, 127)
    assert np.array_equal(got, want), (shifts, np.argwhere(got != want))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random(seed):
    rng = np.random.default_rng(seed)
    cols = 5
    multiplier = rng.integers(INT32_MIN, INT32_MAX, size=cols, endpoint=True, dtype=np.int64)
    shift = rng.integers(-31, 32, size=cols)
    # Accumulators of every magnitude, not just full-scale ones.
    magnitude = rng.integers(0, 32, size=(40, cols))
    rows = (rng.integers(-(1 << 31), 1 << 31, size=(40, cols)) >> magnitude).astype(np.int32)
    zero_point = int(rng.integers(-128, 128))
    act_min = int(rng.integers(-128, 128))
    act_max = int(rng.integers(act_min, 128))
    got = _run(cols, rows, multiplier, shift, zero_point, act_min, act_max)
    want = requantize(rows, multiplier.astype(np.int32), shift.astype(np.int32), zero_point,
                      act_min, act_max)
    assert np.array_equal(got, want), f"seed {seed}"


def test_result_holds_until_the_next_row():
    """The store unit reads the result as long as the DMA writer makes it wait."""
    dut = Requantizer(2)
    acc = [[1 << 20, -(1 << 20)], [3, -3]]

    async def testbench(ctx):
        ctx.set(dut.multiplier, [1 << 30, 1 << 30])
        ctx.set(dut.shift, [4, 4])
        ctx.set(dut.act_min, -128)
        ctx.set(dut.act_max, 127)
        await ctx.tick().repeat(Requantizer.setup)
        ctx.set(dut.acc, acc[0])
        ctx.set(dut.valid, 1)
        await ctx.tick()
        ctx.set(dut.valid, 0)
        ctx.set(dut.acc, acc[1])
        await ctx.tick().repeat(Requantizer.latency + 20)
        want = requantize(np.array(acc[:1], np.int32), np.array([1 << 30] * 2, np.int32),
                          np.array([4, 4], np.int32), 0, -128, 127)
        assert [int(v) for v in ctx.get(dut.result)] == want[0].tolist() == [127, -128]
        assert not ctx.get(dut.result_valid)

    run_simulation(dut, testbench)


def test_modes_alternate():
    """One block in both modes, as the store unit uses it: fixed-point rows, then float
    rows, then fixed-point rows again, each batch after a new state (held from
    ``Requantizer.setup`` cycles before it), every row bit-exact."""
    rng = np.random.default_rng(7)
    cols = 4
    dut = Requantizer(cols)
    rows = (rng.integers(-(1 << 31), 1 << 31, size=(12, cols))
            >> rng.integers(0, 32, size=(12, cols))).astype(np.int32)
    multiplier = rng.integers(INT32_MIN, INT32_MAX, size=cols, endpoint=True).astype(np.int32)
    shift = rng.integers(-31, 32, size=cols).astype(np.int32)
    scale = (rng.uniform(0.5, 1.0, size=cols) * 2.0 ** rng.integers(-30, -10, size=cols)
             * np.where(rng.random(cols) < 0.5, -1, 1)).astype(np.float32)
    batches = [(QuantMode.FIXED, multiplier, shift, (3, -100, 100)),
               (QuantMode.FLOAT, scale.view(np.int32), np.zeros(cols, np.int32),
                (-5, -128, 90)),
               (QuantMode.FIXED, multiplier, -shift, (0, -128, 127))]
    outputs = []

    async def testbench(ctx):
        for mode, row_0, row_1, (zero_point, act_min, act_max) in batches:
            ctx.set(dut.mode, mode)
            ctx.set(dut.multiplier, [int(v) for v in row_0])
            ctx.set(dut.shift, [int(v) for v in row_1])
            ctx.set(dut.zero_point, zero_point)
            ctx.set(dut.act_min, act_min)
            ctx.set(dut.act_max, act_max)
            await ctx.tick().repeat(Requantizer.setup)
            outputs.append([])
            for cycle, row in enumerate(list(rows) + [None] * Requantizer.latency):
                ctx.set(dut.valid, row is not None)
                if row is not None:
                    ctx.set(dut.acc, [int(v) for v in row])
                await ctx.tick()
                if ctx.get(dut.result_valid):
                    outputs[-1].append([int(v) for v in ctx.get(dut.result)])

    run_simulation(dut, testbench)
    for (mode, row_0, row_1, clamp), got in zip(batches, outputs):
        if mode == QuantMode.FIXED:
            want = requantize(rows, row_0, row_1, *clamp)
        else:
            want = requantize_float(rows, row_0.view(np.float32), *clamp)
        assert len(got) == len(rows) and np.array_equal(np.array(got, np.int8), want), (
            mode, got, want)
