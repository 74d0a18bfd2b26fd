"""Unit tests of :class:`hw.controller.store_unit.StoreUnit`, on a real memory as its
accumulator read port: STORE's rows two cycles each (READ, ROW), STORE_Q's streamed through the
requantizer of the state's mode and a queue (checked against :func:`sw.quant.requantize` and
:func:`sw.quant.requantize_float`), halt, BUS_WRITE, the status."""

import numpy as np
import pytest
from amaranth.hdl import signed
from amaranth.lib import data

from controller_blocks import CONFIG, WithReadMemory, command_of, offer, pack, unpack
from error_cases import store, store_q
from hw.bram import READ_LATENCY
from hw.controller.store_unit import StoreUnit
from hw.isa import ErrorCode, QuantMode
from hw.requant import INT32_MAX, INT32_MIN, Requantizer
from sw.quant import quantize_multiplier, requantize, requantize_float
from sim.amaranth_sim import run_simulation


C = CONFIG.cols
PC = 9


def when(valid, value):
    return value if valid else None


def cycles_of(trace, key):
    """``{cycle: value}`` of the cycles in which ``key`` was valid."""
    return {cycle: t[key] for cycle, t in enumerate(trace) if t[key] is not None}


def run_store(word, *, lo=0, hi=0, quant=None, cmd_ready_at=1, row_stall=(), done_after=2,
              error=False, halt=(), cycles=40, seed=0x570E):
    """Issue ``word`` at cycle 0 (after ``quant``, a requantization state, if given) and play
    the writer: the command taken in ``cmd_ready_at``, ``row.ready`` low in the cycles of
    ``row_stall``, ``done`` (with ``error``) ``done_after`` cycles after the last row,
    ``halt`` high in its cycles. Returns the accumulator and the per-cycle trace."""
    rng = np.random.default_rng(seed)
    acc = [[int(v) for v in rng.integers(INT32_MIN, INT32_MAX + 1, size=C, dtype=np.int64)]
           for _ in range(CONFIG.acc_depth)]
    acc[0][:2] = [INT32_MIN, INT32_MAX]
    dut = StoreUnit(CONFIG)
    harness = WithReadMemory(dut, dut.acc, shape=data.ArrayLayout(signed(32), C),
                             depth=CONFIG.acc_depth, init=acc)
    trace = []

    async def testbench(ctx):
        if quant is not None:
            # The state takes a LOAD_QUANT from the third cycle after a reset (asserted).
            await ctx.tick().repeat(2)
            ctx.set(dut.quant.payload, quant)
            ctx.set(dut.quant.valid, 1)
            await ctx.tick()
            ctx.set(dut.quant.valid, 0)
        offer(ctx, dut.issue.cmd, word, pc=PC, lo=lo, hi=hi)
        done_at, rows_taken = None, 0
        for cycle in range(cycles):
            ctx.set(dut.issue.halt, cycle in halt)
            ctx.set(dut.writer.cmd.ready, cycle >= cmd_ready_at)
            ctx.set(dut.writer.row.ready, cycle not in row_stall)
            ctx.set(dut.writer.done, cycle == done_at)
            ctx.set(dut.writer.error, error and cycle == done_at)
            status, fault = ctx.get(dut.issue.status), ctx.get(dut.issue.fault)
            row = when(ctx.get(dut.writer.row.valid), ctx.get(dut.writer.row.payload))
            trace.append({
                "busy": status.busy,
                "status": (status.acc.lo, status.acc.hi, status.lo, status.hi),
                "cmd": when(ctx.get(dut.writer.cmd.valid), command_of(ctx, dut.writer.cmd)),
                "read": when(ctx.get(dut.acc.en), ctx.get(dut.acc.addr)),
                "row": row,
                "fault": when(fault.valid, (ErrorCode(fault.code), fault.pc)),
            })
            if row is not None and cycle not in row_stall:
                rows_taken += 1
                if rows_taken == status.acc.hi - status.acc.lo:
                    done_at = cycle + done_after
            await ctx.tick()
            ctx.set(dut.issue.cmd.valid, 0)

    run_simulation(harness, testbench)
    return acc, trace


def test_store_rows():
    """Command in cycle 1; each row READ then ROW (two cycles), each read a cycle ahead (as
    the command is taken, then as the row before is handed over: two cycles of read
    latency), a stalled ROW holds its row;
    busy until the writer's ``done``; the status holds the instruction's rows and bytes."""
    lo, hi = 0x5000, 0x5000 + 2 * 20 + 12
    acc, trace = run_store(store(2, 3, 12, 0x5000, 20), lo=lo, hi=hi, row_stall=(5, 6))
    assert cycles_of(trace, "cmd") == {1: (0x5000, 3, 12, 20)}
    assert cycles_of(trace, "read") == {1: 2, 3: 3, 7: 4}
    rows = {3: acc[2], 5: acc[3], 6: acc[3], 7: acc[3], 9: acc[4]}
    assert cycles_of(trace, "row") == {c: pack(row, 4) for c, row in rows.items()}
    assert [t["busy"] for t in trace[:13]] == [0] + [1] * 11 + [0]       # done in cycle 11
    assert all(t["status"] == (2, 2 + 3, lo, hi) for t in trace[1:])
    assert not cycles_of(trace, "fault")


@pytest.mark.parametrize("error", [False, True])
def test_bus_write_fault(error):
    """``done`` with ``error``: BUS_WRITE with the pc in the cycle after (from the state
    register), busy until then, idle after it; without error, idle after ``done``."""
    _, trace = run_store(store(0, 1, 4, 0x100, 4), done_after=3, error=error)
    assert cycles_of(trace, "fault") == ({7: (ErrorCode.BUS_WRITE, PC)} if error else {})
    busy_cycles = 7 if error else 6
    assert [t["busy"] for t in trace[:9]] == [0] + [1] * busy_cycles + [0] * (8 - busy_cycles)


def test_halt_holds_the_command():
    """From the cycle after ``halt`` rises to the cycle it falls (the unit registers it),
    no command; once taken, halt stops no row."""
    _, trace = run_store(store(0, 2, 8, 0x100, 8), halt=(*range(0, 6), 8, 9))
    assert cycles_of(trace, "cmd") == {7: (0x100, 2, 8, 8)}
    assert list(cycles_of(trace, "row")) == [9, 11]


def quant_state(multipliers, shifts, zero_point, act_min, act_max, mode=QuantMode.FIXED):
    return {"multiplier": multipliers, "shift": shifts, "zero_point": zero_point,
            "act_min": act_min, "act_max": act_max, "mode": mode}


def float_state(scales, zero_point, act_min, act_max):
    bits = [int(value) for value in np.array(scales, np.float32).view(np.int32)]
    return quant_state(bits, [0] * len(scales), zero_point, act_min, act_max, QuantMode.FLOAT)


def requantize_state(acc, state):
    """The reference requantization of ``acc`` with a ``quant_state``."""
    clamp = state["zero_point"], state["act_min"], state["act_max"]
    if state["mode"] is QuantMode.FLOAT:
        scales = np.array(state["multiplier"], np.int32).view(np.float32)
        return requantize_float(np.array(acc, np.int32), scales, *clamp)
    return requantize(acc, state["multiplier"], state["shift"], *clamp)


M, S = zip(*(quantize_multiplier(x) for x in (0.0123, 3.5, 0.5)))
STATES = [
    None,                                                         # never loaded: all zero
    quant_state(list(M), list(S), 3, -100, 110),
    quant_state([INT32_MAX, INT32_MIN, 1 << 30], [-31, 31, -4], -128, -128, 127),
    quant_state([INT32_MIN, 1 << 30, 12345], [0, 30, 1], 127, -5, -5),
    float_state([2.0 ** -25, -3e-9, 1.5e-8], 3, -100, 110),
    float_state([1e-45, 2.0 ** -31, -1e30], -128, -128, 127),
]


@pytest.mark.parametrize("state", STATES)
def test_store_q(state):
    """STORE_Q streams: a read in every cycle from the command's, each row at the writer
    StoreUnit.ROUND_TRIP cycles after its read; the row is the reference requantization of
    the accumulator row, in the low C bytes, in either mode."""
    trip = StoreUnit.ROUND_TRIP
    assert trip == READ_LATENCY + Requantizer.latency + 2
    acc, trace = run_store(store_q(5, 3, 3, 0x200, 3), quant=state, cycles=trip + 10)
    assert cycles_of(trace, "read") == {1 + r: 5 + r for r in range(3)}
    reference = state or quant_state([0] * C, [0] * C, 0, -128, 127)
    expected = {1 + trip + r: pack(requantize_state(acc[5 + r], reference), 1)
                for r in range(3)}
    rows = cycles_of(trace, "row")
    assert rows == expected, {c: unpack(v, C, 1) for c, v in rows.items()}
    if state is None:
        assert set(rows.values()) == {0}


@pytest.mark.parametrize("seed", [7, 8])
def test_store_q_stalled_writer(seed):
    """With the writer taking rows at random (a third of the cycles), a STORE_Q of more rows
    than its queue holds: no row lost, doubled or out of order, and never more rows read
    than handed over plus StoreUnit.QUEUE_DEPTH (the queue would overflow: asserted)."""
    rng = np.random.default_rng(seed)
    print(f"seed {seed}")
    rows_n = 2 * StoreUnit.QUEUE_DEPTH + 3
    cycles = 4 * rows_n + StoreUnit.ROUND_TRIP + 20
    stall = tuple(c for c in range(cycles) if rng.random() < 2 / 3)
    state = STATES[1]
    acc, trace = run_store(store_q(1, rows_n, 3, 0x200, 3), quant=state, row_stall=stall,
                           cycles=cycles)
    reads = cycles_of(trace, "read")
    depth = CONFIG.acc_depth        # the read address wraps
    assert list(reads.values()) == [(1 + r) % depth for r in range(rows_n)]
    taken = [row for cycle, row in cycles_of(trace, "row").items() if cycle not in stall]
    assert taken == [pack(requantize_state(acc[(1 + r) % depth], state), 1)
                     for r in range(rows_n)]
    handed = 0
    for cycle, t in enumerate(trace):
        if cycle in reads:
            assert sum(1 for c in reads if c <= cycle) <= handed + StoreUnit.QUEUE_DEPTH
        if t["row"] is not None and cycle not in stall:
            handed += 1
