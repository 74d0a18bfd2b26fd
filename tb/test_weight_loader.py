"""Unit tests of :class:`hw.controller.weight_loader.WeightLoader`, on a real memory as its
scratchpad read port: R rows read last first, one a cycle, onto the weight stream;
``commit.pending`` after the last; R + C - 1 cycles of guard after ``commit.take``."""

import numpy as np
import pytest

from controller_blocks import CONFIG, WithReadMemory, offer, unpack
from error_cases import preload
from hw.bram import READ_LATENCY
from hw.config import NPUConfig
from hw.controller.weight_loader import WeightLoader
from sim.amaranth_sim import run_simulation


CONFIGS = [CONFIG, NPUConfig(rows=4, cols=2, spad_depth=16, acc_depth=8, bus_width=64)]


def run_loader(config, events, cycles, seed):
    """Run a weight loader over a random scratchpad; ``events`` maps a cycle to
    ``("preload", spad_addr)`` or ``("take",)``. Returns the scratchpad rows and, per cycle,
    ``(busy, read address or None, weight row or None, pending)``."""
    rng = np.random.default_rng(seed)
    row_bytes = config.spad_row_bytes
    rows = [int.from_bytes(rng.bytes(row_bytes), "little") for _ in range(config.spad_depth)]
    dut = WeightLoader(config)
    harness = WithReadMemory(dut, dut.spad, shape=8 * row_bytes, depth=config.spad_depth,
                             init=rows)
    trace = []

    async def testbench(ctx):
        for cycle in range(cycles):
            event = events.get(cycle, ())
            ctx.set(dut.issue.cmd.valid, 0)
            if event[:1] == ("preload",):
                offer(ctx, dut.issue.cmd, preload(event[1]), config=config)
            ctx.set(dut.commit.take, event == ("take",))
            trace.append((
                ctx.get(dut.issue.status.busy),
                ctx.get(dut.spad.addr) if ctx.get(dut.spad.en) else None,
                ctx.get(dut.weight.payload).as_bits() if ctx.get(dut.weight.valid) else None,
                ctx.get(dut.commit.pending)))
            await ctx.tick()
            if event[:1] == ("preload",):
                spad = ctx.get(dut.issue.status.spad)
                assert (spad.lo, spad.hi) == (event[1], event[1] + config.rows)

    run_simulation(harness, testbench)
    return rows, trace


def weight_row(config, spad_row):
    """The weight row of a scratchpad row: its first C bytes."""
    return spad_row & ((1 << 8 * config.cols) - 1)


def expected_tile(config, rows, spad_addr, first_read, cycles):
    """Reads from ``first_read`` on, the last row first; each row on ``weight``
    :data:`hw.bram.READ_LATENCY` cycles after its read."""
    reads = [None] * cycles
    weights = [None] * cycles
    for i in range(config.rows):
        reads[first_read + i] = spad_addr + config.rows - 1 - i
        weights[first_read + i + READ_LATENCY] = weight_row(config, rows[spad_addr + config.rows - 1 - i])
    return reads, weights


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_preload(config):
    R = config.rows
    cycles = R + 7
    rows, trace = run_loader(config, {0: ("preload", 5)}, cycles, seed=0x3E16 + R)
    reads, weights = expected_tile(config, rows, 5, 1, cycles)
    assert [t[1] for t in trace] == reads
    assert [t[2] for t in trace] == weights, f"seed {0x3E16 + R}"
    assert [t[0] for t in trace] == [0] + [1] * R + [0] * 6
    assert [t[3] for t in trace] == [0] * (R + 1) + [1] * 6       # after the last read
    lanes = unpack(trace[1 + READ_LATENCY][2], config.cols, 1)
    assert lanes == unpack(rows[5 + R - 1], config.cols, 1)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("second_at", [6, 15])
def test_guard_after_take(config, second_at):
    """``take`` at cycle 5 clears ``pending``; the next tile reads nothing before cycle
    5 + R + C (R + C - 1 cycles of guard), and at once when issued later than that."""
    R, C = config.rows, config.cols
    cycles = second_at + R + C + R + 4
    events = {0: ("preload", 0), 5: ("take",), second_at: ("preload", 8)}
    rows, trace = run_loader(config, events, cycles, seed=0x3E20)
    assert [t[3] for t in trace][R + 1:7] == [1] * (5 - R) + [0]
    first_read = max(5 + R + C, second_at + 1)
    first_tile, _ = expected_tile(config, rows, 0, 1, cycles)
    second_tile, weights = expected_tile(config, rows, 8, first_read, cycles)
    assert [t[1] for t in trace] == [a if a is not None else b
                                     for a, b in zip(first_tile, second_tile)]
    assert [t[2] for t in trace][first_read:] == weights[first_read:]
    assert [t[3] for t in trace][first_read + R:] == [1] * (cycles - first_read - R)


def test_take_without_pending_sets_no_guard():
    config = CONFIG
    rows, trace = run_loader(config, {0: ("take",), 1: ("preload", 3)}, 8, seed=0x3E30)
    assert [t[1] for t in trace] == [None, None, 4, 3, None, None, None, None]
