"""Unit tests of :class:`hw.controller.streamer.Streamer`, on a real memory as its scratchpad
read port: activation rows in order with the weight commit on a MATMUL's first row, two
writeback slots, results into the right accumulator rows, LOAD_ACC's writes passed through,
and its assertion that no LOAD_ACC write meets a result."""

from collections import deque

import numpy as np
import pytest

from controller_blocks import CONFIG, WithReadMemory, offer
from hw.controller.streamer import Streamer
from hw.isa import Opcode, decode, encode
from sim.amaranth_sim import run_simulation


R, C = CONFIG.rows, CONFIG.cols


def matmul(spad_addr, acc_addr, rows, accumulate, k_width=0, n_width=0):
    return encode(Opcode.MATMUL, spad_addr=spad_addr, acc_addr=acc_addr, rows=rows,
                  accumulate=accumulate, k_width=k_width, n_width=n_width)


def simulate(body, seed=0x5EED):
    rng = np.random.default_rng(seed)
    spad = [int.from_bytes(rng.bytes(CONFIG.spad_row_bytes), "little")
            for _ in range(CONFIG.spad_depth)]
    dut = Streamer(CONFIG)
    harness = WithReadMemory(dut, dut.spad, shape=8 * CONFIG.spad_row_bytes,
                             depth=CONFIG.spad_depth, init=spad)

    async def testbench(ctx):
        await body(ctx, dut, spad, rng)

    run_simulation(harness, testbench)


def act_row(ctx, dut):
    """``(lanes as bytes, commit)`` on ``act``, or ``None``."""
    if not ctx.get(dut.act.valid):
        return None
    return ctx.get(dut.act.payload.lanes).as_bits(), ctx.get(dut.act.payload.commit)


@pytest.mark.parametrize("pending", [0, 1])
def test_stream_rows(pending):
    """MATMUL at cycle 0: rows ``spad_addr ..`` in ``busy`` in cycles 1-4 but read a cycle
    ahead, in 0-3 (two cycles of read latency), on ``act`` in 2-5, the first with ``commit``
    when weights were pending; ``free`` again on the last row; each row's useful MACs
    (``macs``) two cycles after it, in 3-6. While free the port reads the head's first row."""
    async def body(ctx, dut, spad, rng):
        ctx.set(dut.commit.pending, pending)
        offer(ctx, dut.issue.cmd, matmul(3, 2, 4, 1, k_width=1))
        trace = []
        for cycle in range(8):
            status = ctx.get(dut.issue.status)
            trace.append((ctx.get(dut.commit.take), status.busy, status.free,
                           ctx.get(dut.spad.en) and ctx.get(dut.spad.addr), act_row(ctx, dut),
                           status.macs))
            await ctx.tick()
            ctx.set(dut.issue.cmd.valid, 0)
            if cycle == 0:
                status = ctx.get(dut.issue.status)
                assert (status.spad.lo, status.spad.hi) == (3, 3 + 4)
        lanes = [spad[a] & ((1 << 8 * R) - 1) for a in range(3, 7)]
        assert trace == [
            (1, 0, 1, 3, None, 0), (0, 1, 0, 4, None, 0),
            (0, 1, 0, 5, (lanes[0], pending), 0), (0, 1, 0, 6, (lanes[1], 0), 1 * C),
            (0, 1, 1, 3, (lanes[2], 0), 1 * C), (0, 0, 1, 3, (lanes[3], 0), 1 * C),
            (0, 0, 1, 3, None, 1 * C), (0, 0, 1, 3, None, 0)]
        assert ctx.get(dut.issue.status.drained) == 0        # its results are still to come
    simulate(body)


def test_load_acc_meets_result_assert_fires():
    """Mutant environment: a LOAD_ACC write in the cycle of a result. (A MATMUL is queued,
    so the write port's choice finds the LOAD_ACC row out of place too, in the same cycle.)"""
    async def body(ctx, dut, spad, rng):
        offer(ctx, dut.issue.cmd, matmul(0, 0, 1, 0))
        await ctx.tick()
        ctx.set(dut.issue.cmd.valid, 0)
        await ctx.tick()                 # the write port's choice follows a cycle late
        ctx.set(dut.result.valid, 1)
        ctx.set(dut.load_acc.en, 1)
        await ctx.tick()
        await ctx.tick()
    with pytest.raises(AssertionError,
                       match="LOAD_ACC met a result|a LOAD_ACC row with a MATMUL queued"):
        simulate(body)


def test_write_port_choice_asserts_fire():
    """Mutant environments: a result of the array with no MATMUL queued, and a LOAD_ACC row
    while one is; the write port would take the other side's row."""
    async def result_alone(ctx, dut, spad, rng):
        ctx.set(dut.result.valid, 1)
        await ctx.tick()
        await ctx.tick()
    with pytest.raises(AssertionError, match="a result of the array with no MATMUL queued"):
        simulate(result_alone)

    async def load_behind_matmul(ctx, dut, spad, rng):
        offer(ctx, dut.issue.cmd, matmul(0, 0, 1, 0))
        await ctx.tick()
        ctx.set(dut.issue.cmd.valid, 0)
        await ctx.tick()
        ctx.set(dut.load_acc.en, 1)
        await ctx.tick()
        await ctx.tick()
    with pytest.raises(AssertionError, match="a LOAD_ACC row with a MATMUL queued"):
        simulate(load_behind_matmul)


@pytest.mark.parametrize("seed", [0x57E0, 0x57E1, 0x57E2])
def test_random_against_model(seed):
    """MATMULs issued whenever the issue stage could (``free`` and not ``full``), results
    and LOAD_ACC writes (while no MATMUL is queued) at random: every cycle's scratchpad read, activation row, status,
    writeback slots and accumulator write match a model of two slots."""
    async def body(ctx, dut, spad, rng):
        reads = deque()           # (spad row, commit) still to read, the current one first
        last_read = None
        head_row = 0              # the first row of the instruction offered last
        slots = deque()           # [acc_addr, rows, accumulate, results written]
        macs = 0
        row_macs = next_macs = 0
        issued = loads = 0
        # The accumulator's pipeline as the streamer sees it (its write port is the only
        # one): the writes taken one and two cycles ago (``unseen``, s1 and s2) and three
        # ago (being written, S); busy while any is there.
        pipeline = deque([(0, 0)] * 3)    # (valid, addr) of s1, s2, S
        # The write port's choice is made from the MATMULs queued a cycle before: results
        # come only with one queued then (the array's latency is longer), LOAD_ACC rows only
        # with none then.
        queued_before = False
        for cycle in range(400):
            context = f"seed {seed} cycle {cycle}"
            queued_now = bool(slots)
            issue = rng.random() < 0.4 and len(reads) <= 1 and len(slots) < 2 and issued < 40
            pending = int(rng.random() < 0.5)
            ctx.set(dut.commit.pending, pending)
            ctx.set(dut.issue.cmd.valid, 0)
            if issue:
                rows = int(rng.integers(1, 5))
                k, n = int(rng.integers(0, R + 1)), int(rng.integers(0, C + 1))
                word = matmul(int(rng.integers(0, CONFIG.spad_depth - rows + 1)),
                              int(rng.integers(0, CONFIG.acc_depth - rows + 1)), rows,
                              int(rng.integers(0, 2)), k, n)
                offer(ctx, dut.issue.cmd, word)
            owed = sum(slot[1] - slot[3] for slot in slots)
            result = owed > 0 and queued_before and rng.random() < 0.5
            data = [int(v) for v in rng.integers(-2**31, 2**31, size=C)]
            ctx.set(dut.result.valid, result)
            ctx.set(dut.result.payload, data)
            # LOAD_ACC rows only while no MATMUL is queued, as the issue stage orders them.
            load = not result and not slots and not queued_before and rng.random() < 0.3
            loads += load
            load_write = (int(rng.integers(0, CONFIG.acc_depth)), int(rng.integers(0, 2)),
                          [int(v) for v in rng.integers(-2**31, 2**31, size=C)])
            ctx.set(dut.load_acc.en, load)
            ctx.set(dut.load_acc.addr, load_write[0])
            ctx.set(dut.load_acc.accumulate, load_write[1])
            ctx.set(dut.load_acc.data, load_write[2])
            acc_busy = int(any(valid for valid, _ in pipeline))
            acc_unseen = [{"valid": valid, "addr": addr} for valid, addr in list(pipeline)[:2]]
            ctx.set(dut.acc.busy, acc_busy)
            ctx.set(dut.acc.unseen, acc_unseen)

            status = ctx.get(dut.issue.status)
            assert ctx.get(dut.commit.take) == issue, context
            assert status.busy == bool(reads), context
            assert status.free == (len(reads) <= 1), context
            assert status.full == (len(slots) == 2), context
            assert status.drained == (not reads and not slots and not acc_busy), context
            if issue:
                head_row = decode(word)[1]["spad_addr"]
            assert status.macs == row_macs, context      # the MACs of the row 2 cycles ago
            # The port reads a cycle ahead: the next row, or the head's first while free.
            assert ctx.get(dut.spad.en) == 1, context
            assert ctx.get(dut.spad.addr) == (reads[1][0] if len(reads) > 1 else head_row), \
                context
            assert act_row(ctx, dut) == last_read, context
            valid_slots = sorted((w.acc.lo, w.acc.hi, w.rows, w.accumulate)
                                 for w in status.writes if w.valid)
            assert valid_slots == sorted((s[0], s[0] + s[1], s[1], s[2]) for s in slots), \
                context
            assert ctx.get(dut.load_acc.busy) == acc_busy, context
            for port in (ctx.get(dut.load_acc.unseen), status.unseen):
                assert [(w.valid, w.addr) for w in port] == \
                    [(w["valid"], w["addr"]) for w in acc_unseen], context
            assert (status.writing.valid, status.writing.addr) == \
                (ctx.get(dut.acc.en), ctx.get(dut.acc.addr)), context
            write = (ctx.get(dut.acc.en), ctx.get(dut.acc.addr), ctx.get(dut.acc.accumulate),
                     list(ctx.get(dut.acc.data)))
            if result:
                head = slots[0]
                assert write == (1, head[0] + head[3], head[2], data), context
                head[3] += 1
                if head[3] == head[1]:
                    slots.popleft()
            elif load:
                assert write == (1, *load_write), context
            else:
                assert write[0] == 0, context

            pipeline.pop()
            pipeline.appendleft((write[0], write[1] if write[0] else 0))
            await ctx.tick()
            queued_before = queued_now
            last_read = None
            row_macs, next_macs = next_macs, (macs if reads else 0)
            if reads:
                row, commit = reads.popleft()
                last_read = (spad[row] & ((1 << 8 * R) - 1), commit)
            if issue:
                issued += 1
                f = decode(word)[1]
                reads.extend((f["spad_addr"] + t, int(pending and t == 0))
                             for t in range(f["rows"]))
                slots.append([f["acc_addr"], f["rows"], f["accumulate"], 0])
                macs = (f["k_width"] or R) * (f["n_width"] or C)
        assert issued >= 30, f"seed {seed}: only {issued} MATMULs issued"
        assert loads >= 10, f"seed {seed}: only {loads} LOAD_ACC rows"
    simulate(body, seed)
