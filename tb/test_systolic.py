"""Unit tests of :class:`hw.systolic.SystolicArray`: skew, alignment, latency and weight
double-buffering, starting with the seeds' section 1.2 trace."""

import gc

import numpy as np
import pytest

from hw.systolic import SystolicArray
from sim.amaranth_sim import run_simulation


def _simulate(dut, schedule, extra_cycles, *, garbage_rng=None):
    """Drive ``schedule`` (one ``(act_row, commit, weight_row)`` per cycle, ``None`` for no
    transfer) and return ``trace``: ``trace[n]`` is ``(south, result_valid, result_row)`` read
    after tick ``n`` (``trace[0]`` before the first tick). Entry ``s`` of the schedule is
    applied after ``s`` ticks.

    Idle ``act`` cycles carry random lanes and commit flags from ``garbage_rng`` when given:
    the array must ignore whatever is on an invalid stream.
    """
    rows, cols = dut.rows, dut.cols
    trace = []

    def observe(ctx):
        trace.append(([ctx.get(dut.south[j]) for j in range(cols)],
                      ctx.get(dut.result.valid),
                      [ctx.get(dut.result.payload[j]) for j in range(cols)]))

    async def testbench(ctx):
        observe(ctx)
        for act, commit, weight in list(schedule) + [(None, 0, None)] * extra_cycles:
            if act is not None:
                ctx.set(dut.act.payload.lanes, [int(a) for a in act])
                ctx.set(dut.act.payload.commit, commit)
                ctx.set(dut.act.valid, 1)
            else:
                if garbage_rng is not None:
                    ctx.set(dut.act.payload.lanes,
                            [int(a) for a in garbage_rng.integers(-128, 128, size=rows)])
                    ctx.set(dut.act.payload.commit, int(garbage_rng.integers(0, 2)))
                ctx.set(dut.act.valid, 0)
            if weight is not None:
                ctx.set(dut.weight.payload, [int(w) for w in weight])
                ctx.set(dut.weight.valid, 1)
            else:
                if garbage_rng is not None:
                    ctx.set(dut.weight.payload,
                            [int(w) for w in garbage_rng.integers(-128, 128, size=cols)])
                ctx.set(dut.weight.valid, 0)
            await ctx.tick()
            observe(ctx)

    run_simulation(dut, testbench)
    return trace


def _preload(weights):
    """Schedule entries that shift a weight tile in: row R-1 first, row 0 last."""
    return [(None, 0, weights[i]) for i in reversed(range(len(weights)))]


def _check_results(trace, input_ticks, expected, latency, context):
    """Each expected row leaves ``result`` exactly ``latency`` ticks after its input (applied
    after ``input_ticks[k]`` ticks), and ``result.valid`` is low after every other tick."""
    output_ticks = {tick + latency: row for tick, row in zip(input_ticks, expected)}
    for tick, (_, valid, payload) in enumerate(trace):
        if tick in output_ticks:
            want = [int(v) for v in output_ticks[tick]]
            assert valid == 1, f"{context}: no result after tick {tick}"
            assert payload == want, f"{context}: after tick {tick}, result {payload} != {want}"
        else:
            assert valid == 0, f"{context}: spurious result {payload} after tick {tick}"


def test_seeds_trace_2x2():
    """Seeds section 1.2: W = [[1, 2], [3, 4]], X streamed column by column (A = X^T).

    The first activation is on ``act`` before the first tick (cycle 1); after tick c the
    south edge shows Y[1,1] = 26 in cycle 2, Y[1,2] = 30 and Y[2,1] = 38 in cycle 3, and
    Y[2,2] = 44 in cycle 4, each in its column, zero elsewhere.
    """
    dut = SystolicArray(2, 2)
    weights = [[1, 2], [3, 4]]
    schedule = _preload(weights) + [([5, 7], 1, None), ([6, 8], 0, None)]
    trace = _simulate(dut, schedule, extra_cycles=4)
    after_preload = trace[len(weights):]   # after_preload[c]: after the c-th tick from cycle 1
    south = {c: after_preload[c][0] for c in range(1, 6)}
    assert south == {
        1: [0, 0],
        2: [26, 0],    # Y[1,1] in column 0
        3: [30, 38],   # Y[1,2] in column 0, Y[2,1] in column 1
        4: [0, 44],    # Y[2,2] in column 1
        5: [0, 0],
    }, south
    # Aligned: rows [26, 38] and [30, 44], latency = R + C - 1 = 3 ticks after each input.
    assert dut.latency == 3
    results = {c: after_preload[c][2] for c in range(1, 6) if after_preload[c][1]}
    assert results == {3: [26, 38], 4: [30, 44]}, results
    first_input_tick = len(weights)   # the first activation is applied after the preload ticks
    _check_results(trace, [first_input_tick, first_input_tick + 1], [[26, 38], [30, 44]],
                   dut.latency, "seeds trace")


@pytest.mark.parametrize("rows, cols, seed", [
    (3, 5, 11), (5, 3, 12), (1, 1, 13), (4, 4, 14), (2, 3, 15),
])
def test_random_tile_with_bubbles(rows, cols, seed):
    """A random full-range INT8 tile, streamed with random idle cycles that carry garbage:
    every result row is exact and leaves exactly ``latency`` ticks after its input."""
    rng = np.random.default_rng(seed)
    length = 9
    weights = rng.integers(-128, 128, size=(rows, cols))
    acts = rng.integers(-128, 128, size=(length, rows))
    weights[0, 0] = acts[0, 0] = -128
    acts[1, 0] = 127
    schedule = _preload(weights)
    input_ticks = []
    for t in range(length):
        while rng.random() < 0.3:
            schedule.append((None, 0, None))
        input_ticks.append(len(schedule))
        schedule.append((acts[t], int(t == 0), None))
    dut = SystolicArray(rows, cols)
    trace = _simulate(dut, schedule, dut.latency + 2, garbage_rng=rng)
    _check_results(trace, input_ticks, acts @ weights, dut.latency,
                   f"{rows}x{cols} seed {seed}")


@pytest.mark.parametrize("rows, cols, seed", [
    (2, 2, 21), (3, 5, 22), (5, 3, 23), (1, 1, 24), (4, 4, 25),
])
def test_back_to_back_tiles(rows, cols, seed):
    """Three tiles streamed without a gap: the next tile's weights are shifted into the
    shadow registers during the last R rows of the current tile (as soon as the current
    commit wavefront has passed the last PE), and commit rides with the next tile's first
    row. Every result of every tile is exact."""
    rng = np.random.default_rng(seed)
    tiles = 3
    # The shift may start once PE(R-1, C-1) has committed (R + C - 2 cycles after the first
    # row) and takes R cycles, so a tile needs at least 2R + C - 2 rows; the first is tight.
    shortest = 2 * rows + cols - 2
    lengths = [shortest] + [shortest + int(rng.integers(0, 3)) for _ in range(tiles - 1)]
    weights = [rng.integers(-128, 128, size=(rows, cols)) for _ in range(tiles)]
    acts = [rng.integers(-128, 128, size=(length, rows)) for length in lengths]
    schedule = _preload(weights[0])
    input_ticks = []
    for k in range(tiles):
        shift_from = lengths[k] - rows   # shift the next tile's weights in the last R rows
        for t in range(lengths[k]):
            weight = None
            if k + 1 < tiles and t >= shift_from:
                weight = weights[k + 1][rows - 1 - (t - shift_from)]
            input_ticks.append(len(schedule))
            schedule.append((acts[k][t], int(t == 0), weight))
    dut = SystolicArray(rows, cols)
    trace = _simulate(dut, schedule, dut.latency + 2)
    expected = np.concatenate([a @ w for a, w in zip(acts, weights)])
    _check_results(trace, input_ticks, expected, dut.latency,
                   f"{rows}x{cols} seed {seed}, tile lengths {lengths}")



def _random_stream(rng, rows, cols, length):
    """A random schedule as the controller may drive it: bubbles with garbage, commits, and
    weight shifts anywhere but in the ``rows + cols - 2`` cycles after a committing row."""
    schedule, quiet_until = [], -1
    for cycle in range(length):
        act = weight = None
        commit = 0
        if rng.random() < 0.7:
            act = rng.integers(-128, 128, size=rows)
            commit = int(rng.random() < 0.15)
            if commit:
                quiet_until = cycle + rows + cols - 2
        if cycle > quiet_until and rng.random() < 0.4:
            weight = rng.integers(-128, 128, size=cols)
        schedule.append((act, commit, weight))
    return schedule


@pytest.mark.parametrize("rows, cols, seed", [
    (1, 2, 31), (2, 2, 32), (3, 5, 33), (5, 3, 34), (4, 4, 35), (8, 8, 36), (2, 7, 37),
])
def test_pipelined_mac_matches_plain_array(rows, cols, seed):
    """Every product pipeline the alignment has room for (1 to min(4, C - 1) stages) gives
    exactly the plain array's ``result`` stream, cycle by cycle, valid and payload, for a
    random stream with bubbles, garbage, commits and weight shifts."""
    rng = np.random.default_rng(seed)
    schedule = _random_stream(rng, rows, cols, 120)
    reference = _simulate(SystolicArray(rows, cols), schedule, rows + cols + 4,
                          garbage_rng=np.random.default_rng(seed))
    for pipeline in range(1, min(4, cols - 1) + 1):
        dut = SystolicArray(rows, cols, mac_pipeline=pipeline)
        assert dut.latency == rows + cols - 1
        trace = _simulate(dut, schedule, rows + cols + 4,
                          garbage_rng=np.random.default_rng(seed))
        for tick, ((_, want_valid, want), (_, valid, payload)) in enumerate(
                zip(reference, trace)):
            assert (valid, payload) == (want_valid, want), \
                f"{rows}x{cols} seed {seed}, L={pipeline}, after tick {tick}"


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_mac_pipeline_needs_alignment_slack():
    with pytest.raises(ValueError, match="from 0 to cols - 1 = 2, not 3"):
        SystolicArray(4, 3, mac_pipeline=3)
    gc.collect()   # the half-built array warns when collected; collect it here, filtered


@pytest.mark.parametrize("mac_pipeline", [0, 3])
def test_soft_reset_clears_weights_and_rows_in_flight(mac_pipeline):
    """``soft_reset`` (registered once per PE row and once for the valid flags) resets the
    active and shadow weights of every row and drops a row in flight, one cycle later, as
    the domain's reset would."""
    rows, cols = 3, 4
    rng = np.random.default_rng(0x50F7)
    weights = rng.integers(-128, 128, size=(rows, cols))
    x = rng.integers(-128, 128, size=rows)
    dut = SystolicArray(rows, cols, mac_pipeline=mac_pipeline)
    results = []

    async def testbench(ctx):
        async def send(row, commit, extra=None):
            ctx.set(dut.act.payload.lanes, [int(a) for a in row])
            ctx.set(dut.act.payload.commit, commit)
            ctx.set(dut.act.valid, 1)
            await ctx.tick()
            ctx.set(dut.act.valid, 0)
            if extra is not None:
                ctx.set(extra, 1)
                await ctx.tick()
                ctx.set(extra, 0)
            for _ in range(dut.latency + 4):
                if ctx.get(dut.result.valid):
                    results.append([int(v) for v in ctx.get(dut.result.payload)])
                await ctx.tick()
            results.append(None)

        for i in reversed(range(rows)):
            ctx.set(dut.weight.payload, [int(w) for w in weights[i]])
            ctx.set(dut.weight.valid, 1)
            await ctx.tick()
        ctx.set(dut.weight.valid, 0)
        await send(x, 1)                             # commits the tile
        ctx.set(dut.weight.payload, [int(w) for w in weights[0]])
        ctx.set(dut.weight.valid, 1)                 # a shadow row, reset before use
        await ctx.tick()
        ctx.set(dut.weight.valid, 0)
        await send(x, 0, extra=dut.soft_reset)       # in flight at the reset: dropped
        await send(x, 0)                             # the active weights are zero
        await send(x, 1)                             # so are the shadow weights

    run_simulation(dut, testbench)
    assert results == [(x @ weights).tolist(), None, None, [0] * cols, None,
                       [0] * cols, None]
