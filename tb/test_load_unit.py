"""Unit tests of :class:`hw.controller.load_unit.LoadUnit`: an issued load becomes one DMA
read command; its rows go to the scratchpad or accumulator rows it names; ``LOAD_QUANT``
stages two rows and checks them with its operands: each lane a cycle after the last one, the
verdict a cycle later."""

import numpy as np
import pytest

from controller_blocks import CONFIG, READ_ROW_BYTES, command_of, offer, pack
from error_cases import load_acc, load_quant, load_spad
from hw.controller.load_unit import LoadUnit
from hw.dma import row_beats
from hw.isa import ErrorCode, QuantMode
from sim.amaranth_sim import run_simulation


PC = 7
SEED = 0x10AD


def run_load(word, *, accept_at=3, row_cycles=(6, 7, 9), payloads=None, done_at=None,
             error=False, cycles=14):
    """Issue ``word`` in cycle 0 and play the reader: the command taken in ``accept_at``,
    rows (``payloads``) in ``row_cycles``, ``done`` (with ``error``) in ``done_at``, by
    default with the last row. Returns what the unit showed in every cycle."""
    dut = LoadUnit(CONFIG, read_row_bytes=READ_ROW_BYTES)
    done_at = row_cycles[-1] if done_at is None else done_at
    trace = []

    async def testbench(ctx):
        offer(ctx, dut.issue.cmd, word, pc=PC)
        for cycle in range(cycles):
            ctx.set(dut.reader.cmd.ready, cycle == accept_at)
            row = cycle in row_cycles
            ctx.set(dut.reader.row.valid, row)
            if row:
                ctx.set(dut.reader.row.payload, payloads[row_cycles.index(cycle)])
            ctx.set(dut.reader.done, cycle == done_at)
            ctx.set(dut.reader.error, error and cycle == done_at)
            status, fault = ctx.get(dut.issue.status), ctx.get(dut.issue.fault)
            quant = ctx.get(dut.quant.payload)
            if ctx.get(dut.reader.cmd.valid):       # what the reader asserts, made by the unit
                addr, _, row_bytes, stride = command_of(ctx, dut.reader.cmd)
                assert ctx.get(dut.reader.cmd.payload.beats) == \
                    row_beats(CONFIG.bus_bytes, addr, row_bytes)
                assert ctx.get(dut.reader.cmd.payload.next_addr) == (addr + stride) % (1 << 32)
            trace.append({
                "busy": (status.busy, status.to_spad, status.to_acc),
                "local": (status.spad.lo, status.spad.hi),
                "cmd": ctx.get(dut.reader.cmd.valid) and command_of(ctx, dut.reader.cmd),
                "spad": ctx.get(dut.spad.en) and (ctx.get(dut.spad.addr),
                                                   ctx.get(dut.spad.data)),
                "acc": ctx.get(dut.acc.en) and (ctx.get(dut.acc.addr),
                                                 ctx.get(dut.acc.data).as_bits(),
                                                 ctx.get(dut.acc.accumulate)),
                "fault": fault.valid and (ErrorCode(fault.code), fault.pc),
                "quant": ctx.get(dut.quant.valid) and (
                    list(quant.multiplier), list(quant.shift), quant.zero_point,
                    quant.act_min, quant.act_max, quant.mode),
            })
            await ctx.tick()
            ctx.set(dut.issue.cmd.valid, 0)

    run_simulation(dut, testbench)
    return trace


def column(trace, key):
    return [cycle[key] for cycle in trace]


def random_rows(count):
    rng = np.random.default_rng(SEED)
    return [int.from_bytes(rng.bytes(READ_ROW_BYTES), "little") for _ in range(count)]


@pytest.mark.parametrize("to_acc", [False, True])
def test_load_rows(to_acc):
    """The command from the cycle after the issue until it is taken, once; each row into
    local row ``local_addr + r``: to the accumulator in the cycle it comes, to the
    scratchpad from registers in the cycle after; idle the cycle after ``done`` (as the
    last row is written to the scratchpad)."""
    payloads = random_rows(3)
    word = (load_acc(5, 3, 12, 0x2000, 16) if to_acc else load_spad(5, 3, 3, 0x2000, 16))
    trace = run_load(word, payloads=payloads)
    command = (0x2000, 3, 12 if to_acc else 3, 16)
    assert column(trace, "cmd") == [0, command, command, command] + [0] * 10
    assert column(trace, "busy") == [(0, 0, 0)] + [(1, not to_acc, to_acc)] * 9 + \
        [(0, 0, 0)] * 4
    # The scratchpad rows it writes, from the command's ``spad`` (empty for a LOAD_ACC).
    assert trace[1]["local"] == ((0, 0) if to_acc else (5, 8))
    writes = {6: 0, 7: 1, 9: 2}
    if to_acc:
        expected = [writes.get(c) is not None and (5 + writes[c], payloads[writes[c]] &
                                                   ((1 << 96) - 1), 0) for c in range(14)]
        assert column(trace, "acc") == expected
        assert not any(column(trace, "spad"))
    else:
        expected = [writes.get(c - 1) is not None and (5 + writes[c - 1],
                                                       payloads[writes[c - 1]] & 0xFF_FFFF)
                    for c in range(14)]
        assert column(trace, "spad") == expected
        assert not any(column(trace, "acc"))
    assert not any(column(trace, "fault")) and not any(column(trace, "quant"))


QUANT_OK = dict(zero_point=-128, act_min=-3, act_max=-3)
MULTIPLIERS = [0x7FFF_FFFF, -(1 << 31), 12345]


@pytest.mark.parametrize("operands, shifts, ok", [
    (QUANT_OK, [-31, 31, 0], True),
    (dict(zero_point=127, act_min=-128, act_max=127), [5, -5, 1], True),
    (dict(zero_point=128, act_min=-128, act_max=127), [0, 0, 0], False),
    (dict(zero_point=-129, act_min=-128, act_max=127), [0, 0, 0], False),
    (dict(zero_point=0, act_min=5, act_max=4), [0, 0, 0], False),
    (QUANT_OK, [0, 0, 32], False),
    (QUANT_OK, [-32, 0, 0], False),
    (QUANT_OK, [0, 64, 0], False),          # 64 would read as 0 in six bits
    (QUANT_OK, [0, 0, -(1 << 31)], False),
])
def test_load_quant(operands, shifts, ok):
    """Two rows from ``dram_addr`` and one stride on; the rows are checked lane by lane in
    the cycle after the last one, the lanes' verdicts with the operands' in the next, and
    that verdict, registered, ends the instruction in the cycle after: QUANT with the
    instruction's pc or, a cycle later, the new state on ``quant`` (for that one cycle)."""
    word = load_quant(12, dram_addr=0x3000, dram_stride=0x40, **operands)
    payloads = [pack(MULTIPLIERS, 4), pack(shifts, 4)]
    trace = run_load(word, row_cycles=(6, 8), payloads=payloads)
    assert trace[1]["cmd"] == (0x3000, 2, 12, 0x40)
    assert column(trace, "busy")[1:13] == [(1, 0, 0)] * 11 + [(0, 0, 0)]
    state = (MULTIPLIERS, shifts, operands["zero_point"], operands["act_min"],
             operands["act_max"], QuantMode.FIXED)
    assert column(trace, "quant") == [0] * 12 + [state if ok else 0] + [0] * 1
    assert column(trace, "fault") == [0] * 11 + [0 if ok else (ErrorCode.QUANT, PC)] + [0] * 2
    assert not any(column(trace, "spad")) and not any(column(trace, "acc"))


def float_bits(*values):
    return [int(bits) for bits in np.array(values, np.float32).view(np.int32)]


@pytest.mark.parametrize("operands, scales, reserved, ok", [
    (QUANT_OK, float_bits(0.5, -1e-45, 3.4028235e38), [0, 0, 0], True),
    (dict(zero_point=127, act_min=-128, act_max=127), float_bits(0, -0.0, 1), [0, 0, 0], True),
    (dict(zero_point=128, act_min=-128, act_max=127), float_bits(1, 1, 1), [0, 0, 0], False),
    (dict(zero_point=0, act_min=5, act_max=4), float_bits(1, 1, 1), [0, 0, 0], False),
    (QUANT_OK, float_bits(1, np.inf, 1), [0, 0, 0], False),
    (QUANT_OK, float_bits(-np.inf, 1, 1), [0, 0, 0], False),
    (QUANT_OK, float_bits(1, 1, np.nan), [0, 0, 0], False),
    (QUANT_OK, [1, 1, 0x7F80_0001], [0, 0, 0], False),        # a signalling NaN
    (QUANT_OK, float_bits(1, 1, 1), [0, 1, 0], False),         # row 1 is reserved
    (QUANT_OK, float_bits(1, 1, 1), [0, 0, -(1 << 31)], False),
    (QUANT_OK, float_bits(1, 1, 1), [0, 0, 1 << 6], False),    # not only the shifts' 6 bits
])
def test_load_quant_float(operands, scales, reserved, ok):
    """In float mode the scales are checked for NaN and infinity and row 1 for zero; the
    state carries the mode."""
    word = load_quant(12, dram_addr=0x3000, dram_stride=0x40, mode=QuantMode.FLOAT,
                      **operands)
    trace = run_load(word, row_cycles=(6, 8), payloads=[pack(scales, 4), pack(reserved, 4)])
    state = (scales, [0, 0, 0], operands["zero_point"], operands["act_min"],
             operands["act_max"], QuantMode.FLOAT)
    assert column(trace, "quant") == [0] * 12 + [state if ok else 0] + [0] * 1
    assert column(trace, "fault") == [0] * 11 + [0 if ok else (ErrorCode.QUANT, PC)] + [0] * 2


@pytest.mark.parametrize("word", [load_spad(0, 4, 3, 0x100, 3),
                                  load_quant(12, dram_addr=0x3000, dram_stride=0x40)])
def test_bus_read_fault(word):
    """A bus error at ``done``: BUS_READ with the pc in the cycle after (from a flip-flop),
    busy until then, idle after it; a LOAD_QUANT that failed so checks nothing and sets no
    state."""
    trace = run_load(word, row_cycles=(6,), payloads=random_rows(1), done_at=9, error=True)
    assert column(trace, "fault") == [0] * 10 + [(ErrorCode.BUS_READ, PC)] + [0] * 3
    assert [busy[0] for busy in column(trace, "busy")] == [0] + [1] * 10 + [0] * 3
    assert not any(column(trace, "quant"))

