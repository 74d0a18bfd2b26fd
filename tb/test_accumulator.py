"""Unit tests of :class:`hw.accumulator.AccumulatorMemory`: overwrite, accumulate, INT32
wrap-around and back-to-back read-modify-writes of one row."""

import numpy as np

from hw.accumulator import WRITE_LATENCY, AccumulatorMemory
from hw.bram import READ_LATENCY
from sim.amaranth_sim import run_simulation, wrap32


INT32_MIN, INT32_MAX = -2**31, 2**31 - 1


def _run_writes(dut, writes, *, check_busy=True):
    """Apply ``writes`` (one ``(addr, accumulate, row)`` or ``None`` per cycle), let them
    settle, and return every row read back through the read port."""
    rows = []

    async def testbench(ctx):
        history = [None] * WRITE_LATENCY         # rows written in the cycles before, newest first
        for write in writes:
            if write is None:
                ctx.set(dut.write.en, 0)
            else:
                addr, accumulate, row = write
                ctx.set(dut.write.addr, addr)
                ctx.set(dut.write.accumulate, accumulate)
                ctx.set(dut.write.data, [int(v) for v in row])
                ctx.set(dut.write.en, 1)
            if check_busy:
                # busy: a write of the last WRITE_LATENCY cycles has not reached the block
                # RAM; unseen: the last two, which a read next cycle would miss.
                assert ctx.get(dut.write.busy) == any(row is not None for row in history)
                unseen = ctx.get(dut.write.unseen)
                assert [entry.addr if entry.valid else None for entry in unseen] == \
                    history[:READ_LATENCY]
            history = [None if write is None else write[0]] + history[:-1]
            await ctx.tick()
        ctx.set(dut.write.en, 0)
        for _ in range(WRITE_LATENCY):
            await ctx.tick()
        assert ctx.get(dut.write.busy) == 0
        ctx.set(dut.read.en, 1)
        for addr in range(dut.depth + READ_LATENCY):
            ctx.set(dut.read.addr, addr % dut.depth)
            await ctx.tick()
            if addr >= READ_LATENCY - 1 and len(rows) < dut.depth:
                rows.append([ctx.get(dut.read.data[lane]) for lane in range(dut.cols)])

    run_simulation(dut, testbench)
    return rows


def _model(depth, cols, writes):
    rows = [[0] * cols for _ in range(depth)]
    for write in writes:
        if write is not None:
            addr, accumulate, row = write
            rows[addr] = [wrap32((old if accumulate else 0) + int(new))
                          for old, new in zip(rows[addr], row)]
    return rows


def test_overwrite_and_accumulate():
    dut = AccumulatorMemory(depth=4, cols=3)
    writes = [
        (2, 0, [1, 2, 3]), None, None,
        (2, 1, [10, -20, 30]), None, None,     # 11, -18, 33
        (1, 1, [7, 8, 9]), None,               # accumulate onto the reset value 0
        (3, 0, [-5, 6, -7]), None,
        (3, 0, [100, 200, 300]), None,         # overwrite replaces, whatever was there
        (0, 1, [1, 1, 1]), None,
        (0, 0, [4, 4, 4]), None,
    ]
    assert _run_writes(dut, writes) == [
        [4, 4, 4], [7, 8, 9], [11, -18, 33], [100, 200, 300],
    ]


def test_int32_wraparound():
    dut = AccumulatorMemory(depth=2, cols=4)
    writes = [
        (0, 0, [INT32_MAX, INT32_MIN, -1, INT32_MAX]), None, None,
        (0, 1, [1, -1, 1, INT32_MAX]), None, None,
        (1, 0, [INT32_MIN, INT32_MIN, 0, 5]), None, None,
        (1, 1, [INT32_MIN, -1, INT32_MIN, -6]), None, None,
    ]
    assert _run_writes(dut, writes) == [
        [INT32_MIN, INT32_MAX, 0, -2],
        [0, INT32_MAX, INT32_MIN, -1],
    ]


def test_back_to_back_accumulates_into_one_row():
    """Writes in consecutive cycles to the same row see each other (the writes still in
    the pipeline are forwarded to the read-modify-write): no update is lost."""
    dut = AccumulatorMemory(depth=4, cols=2)
    writes = [
        (1, 0, [5, -5]),          # overwrite, then accumulate right behind it
        (1, 1, [1, 2]),
        (1, 1, [10, 20]),
        (1, 1, [100, 200]),
        (2, 1, [3, 3]),           # another row in between: rows 1, 2, 1, 2
        (1, 1, [1000, 2000]),
        (2, 1, [4, 4]),
        (1, 0, [-9, 9]),          # overwrite right after an accumulate of the same row
        (1, 1, [INT32_MAX, INT32_MIN]),
        (1, 1, [INT32_MAX, INT32_MIN]),
    ]
    got = _run_writes(dut, writes)
    assert got == _model(4, 2, writes)
    assert got[1] == [wrap32(-9 + 2 * INT32_MAX), wrap32(9 + 2 * INT32_MIN)]
    assert got[2] == [7, 7]


def test_random_write_sequence():
    """A random mix of overwrites and accumulates to few rows, with and without gaps."""
    seed = 0xACC1
    rng = np.random.default_rng(seed)
    depth, cols = 4, 3
    writes = []
    for _ in range(200):
        if rng.random() < 0.25:
            writes.append(None)
            continue
        writes.append((int(rng.integers(0, depth)), int(rng.random() < 0.7),
                       rng.integers(INT32_MIN, INT32_MAX + 1, size=cols, dtype=np.int64)))
    dut = AccumulatorMemory(depth=depth, cols=cols)
    got = _run_writes(dut, writes)
    assert got == _model(depth, cols, writes), f"seed {seed}"
