"""Tests of the bus watchdog: :class:`hw.watchdog.BusWatchdog` alone, and in
:class:`hw.top.NPU` with a slave that stops answering (:class:`sim.amaranth_sim.AXI4MemoryModel`'s
``silent_reads``, ``silent_writes``, ``hold_reads``, ``hold_responses``).

Every stalled program must end with ``BUS_TIMEOUT`` at the oldest instruction waiting on the
bus, its ``irq`` ``WATCHDOG`` + 3 edges after the slave's last answer (plus the few cycles the
master may wait on itself before it waits on the slave); a start before the soft reset ends at
once; the soft reset does not wait for the slave, and the next program is bit-exact. A watchdog that never expires (a mutant) makes these tests hang, and they say so.
"""

import numpy as np
import pytest

from error_cases import CONFIG, END, PROG_ADDR, load_spad, store
from hw.axi import AXI4Signature
from hw.isa import (WATCHDOG_RESET, Control, ErrorCode, Irq, Opcode, Reg, Status,
                    opcode_of)
from hw.top import NPU
from hw.watchdog import BusWatchdog
from sim.amaranth_sim import AXI4MemoryModel, axil_read, axil_write, run_simulation
from test_controller import expected_result_bytes, gemm_job


LIMIT = 200          # cycles: the watchdog's limit in the NPU tests
TIMEOUT = 5000       # cycles: far more than any program here needs, LIMIT included


class WatchdogNeverExpires(BusWatchdog):
    """Mutant: the watchdog counts but never expires (a limit compare that is never true)."""
    def _expires(self, stalled, waited):
        return 0


# ---------------------------------------------------------------------- the block alone
_MEMBERS = AXI4Signature(addr_width=32, data_width=64).members


def _watchdog_run(trace, limit):
    """Drive ``trace`` (one dict of bus inputs per cycle, ``idle`` too; missing: 0) into a
    watchdog with ``limit``; returns ``expired`` after each cycle's edge."""
    dut = BusWatchdog(addr_width=32, data_width=64)
    expired = []

    async def testbench(ctx):
        ctx.set(dut.limit, limit)
        for values in trace:
            for name in list(_MEMBERS) + ["idle"]:
                port = dut.idle if name == "idle" else getattr(dut.bus, name)
                ctx.set(port, values.get(name, 1 if name in ("rready", "bready") else 0))
            await ctx.tick()
            expired.append(ctx.get(dut.expired))

    run_simulation(dut, testbench)
    return expired


def _first(expired):
    return expired.index(1) + 1 if 1 in expired else None


AR_WAITING = {"arvalid": 1}


@pytest.mark.parametrize("limit", [1, 2, 7, 100])
def test_expires_after_limit_cycles_of_an_address_not_taken(limit):
    """The limit-th cycle of ``arvalid`` without ``arready`` sets ``expired`` at its edge."""
    assert _first(_watchdog_run([AR_WAITING] * (limit + 3), limit)) == limit


@pytest.mark.parametrize("channel", ["aw", "w"])
def test_write_channels_count(channel):
    assert _first(_watchdog_run([{f"{channel}valid": 1}] * 20, 10)) == 10


def test_a_read_burst_with_no_beat_counts():
    """An address taken, no R beat: the wait starts in the next cycle; a beat restarts
    the count, the last beat ends the wait (nothing owed, nothing counted)."""
    taken = {"arvalid": 1, "arready": 1}
    beat = {"rvalid": 1}
    last = {"rvalid": 1, "rlast": 1}
    assert _first(_watchdog_run([taken] + [{}] * 12, 10)) == 11
    assert _first(_watchdog_run([taken] + [{}] * 9 + [beat] + [{}] * 12, 10)) == 21
    assert _first(_watchdog_run([taken] + [{}] * 9 + [last] + [{}] * 30, 10)) is None


def test_a_write_response_due_counts_only_after_the_last_beat():
    """AW taken and the master not offering its data: not the slave's fault, no count. The
    last W beat taken: the response is due, and its absence counts; a B ends it."""
    aw = {"awvalid": 1, "awready": 1}
    last_w = {"wvalid": 1, "wready": 1, "wlast": 1}
    assert _first(_watchdog_run([aw] + [{}] * 30, 10)) is None
    assert _first(_watchdog_run([aw, last_w] + [{}] * 12, 10)) == 12
    assert _first(_watchdog_run([aw, last_w] + [{}] * 5 + [{"bvalid": 1}] + [{}] * 30,
                                10)) is None


def test_any_answer_restarts_the_count():
    """R beats of an earlier burst while the next address waits: the slave is answering."""
    trace = [{"arvalid": 1, "arready": 1}] + [{"arvalid": 1, "rvalid": 1}] * 30
    assert _first(_watchdog_run(trace, 10)) is None
    trace = [{"arvalid": 1}] * 9 + [{"arvalid": 1, "arready": 1}] + [{"arvalid": 1}] * 12
    assert _first(_watchdog_run(trace, 10)) == 20


def test_limit_zero_and_idle_turn_it_off():
    assert _first(_watchdog_run([AR_WAITING] * 50, 0)) is None
    assert _first(_watchdog_run([{"arvalid": 1, "idle": 1}] * 50, 3)) is None
    # idle forgets what was owed: the DMA's own view wins over a slave's broken framing.
    trace = [{"arvalid": 1, "arready": 1}, {"idle": 1}] + [{}] * 20
    assert _first(_watchdog_run(trace, 5)) is None


def test_expired_holds_until_reset():
    expired = _watchdog_run([AR_WAITING] * 5 + [{"arvalid": 1, "arready": 1}] + [{}] * 5, 5)
    assert expired == [0] * 4 + [1] * 7


# ---------------------------------------------------------------------- in the NPU
def _stalled_program(case):
    """``(words, data, model settings, expected ERROR_PC)`` of a program whose slave stops
    answering at one of its transactions."""
    rng = np.random.default_rng(sum(case.encode()))
    good = load_spad(0, 2, 2, 0x1000, 2)
    if case == "fetch_address":
        return [good, END], [], {"silent_reads": [(PROG_ADDR, PROG_ADDR + 0x100)]}, 0
    if case == "fetch_data":
        return [good, END], [], {"hold_reads": True}, 0
    if case == "load_address":
        # The second load's block never gets its address taken; the fetch of the program
        # went before it.
        return ([good, load_spad(4, 2, 2, 0x3000, 8), END], [],
                {"silent_reads": [(0x3000, 0x3100)]}, 1)
    job, _, _ = gemm_job(CONFIG, rng, bias=False)
    first_store = next(pc for pc, word in enumerate(job.words)
                       if opcode_of(word) in (Opcode.STORE, Opcode.STORE_Q))
    if case == "store_address":
        return job.words, job.data, {"silent_writes": [(0, 1 << 32)]}, first_store
    if case == "store_response":
        return job.words, job.data, {"hold_responses": True}, first_store
    raise ValueError(case)


CASES = ["fetch_address", "fetch_data", "load_address", "store_address", "store_response"]


def run_stalled(case, watchdog_class=BusWatchdog):
    """Run the stalled program of ``case`` with the watchdog at :data:`LIMIT`, check its
    end, a start before the soft reset, the soft reset and a GEMM after it. Raises
    ``AssertionError`` (``no irq``) if the program does not end."""
    seed = sum(case.encode()) + 7
    words, data, stall, error_pc = _stalled_program(case)
    dut = NPU(CONFIG)
    if watchdog_class is not BusWatchdog:
        dut.watchdog._MustUse__silence = True
        dut.watchdog = watchdog_class(addr_width=CONFIG.addr_width,
                                      data_width=CONFIG.bus_width)
    model = AXI4MemoryModel(dut.m_axi, data_width=CONFIG.bus_width, seed=seed)
    rng = np.random.default_rng(seed)
    after, expected, y_stride = gemm_job(CONFIG, rng, bias=True)
    answers = []     # cycles with a handshake on m_axi
    irq_cycles = []  # the first cycle with irq high

    async def monitor(ctx):
        bus = dut.m_axi
        cycle = 0
        pairs = [(bus.arvalid, bus.arready), (bus.awvalid, bus.awready),
                 (bus.wvalid, bus.wready), (bus.rvalid, bus.rready), (bus.bvalid, bus.bready)]
        async for _, _, *values in ctx.tick().sample(*[s for pair in pairs for s in pair]):
            cycle += 1
            if any(values[i] and values[i + 1] for i in range(0, len(values), 2)):
                answers.append(cycle)

    async def wait_irq(ctx, what):
        for cycle in range(TIMEOUT):
            _, _, irq = await ctx.tick().sample(dut.irq)
            if irq:
                return
        raise AssertionError(f"{case}: no irq within {TIMEOUT} cycles ({what})")

    async def host(ctx):
        bus = dut.s_axil
        assert await axil_read(ctx, bus, Reg.WATCHDOG) == WATCHDOG_RESET
        await axil_write(ctx, bus, Reg.WATCHDOG, LIMIT)
        assert await axil_read(ctx, bus, Reg.WATCHDOG) == LIMIT
        model.load(PROG_ADDR, b"".join(word.to_bytes(16, "little") for word in words))
        for addr, block in data:
            model.load(addr, block)
        for name, value in stall.items():
            setattr(model, name, value)
        await axil_write(ctx, bus, Reg.PROG_ADDR, PROG_ADDR)
        await axil_write(ctx, bus, Reg.PROG_LEN, len(words))
        await axil_write(ctx, bus, Reg.CONTROL, Control.START)
        await wait_irq(ctx, "the stalled program")
        irq_cycle = irq_cycles[0]
        ended = max([0] + [cycle for cycle in answers if cycle < irq_cycle])
        status = await axil_read(ctx, bus, Reg.STATUS)
        assert status == Status.ERROR | ErrorCode.BUS_TIMEOUT.value << Status.CODE_SHIFT, \
            f"{case}: STATUS {status:#x}"
        assert await axil_read(ctx, bus, Reg.ERROR_PC) == error_pc, case
        assert await axil_read(ctx, bus, Reg.IRQ_PENDING) == Irq.ERROR
        assert ctx.get(dut.irq) == 1
        # Both monitors sample at edges: the limit's cycles of waiting, an edge for
        # ``expired``, one for the issue stage's error and one for the pending bit (the
        # first case's bound, with no answer at all, starts at the simulation's start).
        # The master may wait on itself between the slave's last answer and the first
        # cycle it waits on the slave (a store's rows: 21 cycles here), never longer.
        assert LIMIT + 3 <= irq_cycle - ended <= LIMIT + 3 + 30, \
            f"{case}: irq {irq_cycle - ended} cycles after the slave's last answer"
        if case in ("fetch_data", "store_response"):
            # Nothing else moves: exactly the bound.
            assert irq_cycle - ended == LIMIT + 3, case
        # A start before the soft reset ends at once.
        await axil_write(ctx, bus, Reg.CONTROL, Control.START)
        await wait_irq(ctx, "a start before the soft reset")
        assert await axil_read(ctx, bus, Reg.STATUS) == \
            Status.ERROR | ErrorCode.BUS_TIMEOUT.value << Status.CODE_SHIFT
        assert await axil_read(ctx, bus, Reg.ERROR_PC) == 0
        # The soft reset goes ahead although the slave never answered.
        await axil_write(ctx, bus, Reg.CONTROL, Control.SOFT_RESET)
        for _ in range(3):
            await ctx.tick()
        assert await axil_read(ctx, bus, Reg.STATUS) == 0
        assert ctx.get(dut.irq) == 0
        assert await axil_read(ctx, bus, Reg.IRQ_PENDING) == 0
        assert await axil_read(ctx, bus, Reg.WATCHDOG) == LIMIT    # a host register
        # The slave (or its interconnect) forgets what it owed; the next program is exact.
        model.forget()
        model.silent_reads, model.silent_writes = [], []
        model.hold_reads = model.hold_responses = False
        await ctx.tick()
        model.load(PROG_ADDR, b"".join(word.to_bytes(16, "little") for word in after.words))
        for addr, block in after.data:
            model.load(addr, block)
        model.written = {}
        await axil_write(ctx, bus, Reg.PROG_LEN, after.prog_len)
        await axil_write(ctx, bus, Reg.CONTROL, Control.START)
        await wait_irq(ctx, "the program after the soft reset")
        assert await axil_read(ctx, bus, Reg.STATUS) == Status.DONE, case
        assert model.written == expected_result_bytes(expected, y_stride), case

    async def irq_monitor(ctx):
        cycle = 0
        async for _, _, irq in ctx.tick().sample(dut.irq):
            cycle += 1
            if irq and not irq_cycles:
                irq_cycles.append(cycle)

    run_simulation(dut, host, processes=[model.process, monitor, irq_monitor])


@pytest.mark.parametrize("case", CASES)
def test_a_slave_that_stops_answering_ends_the_program(case):
    run_stalled(case)


@pytest.mark.parametrize("case", ["fetch_data", "store_address"])
def test_the_tests_catch_a_watchdog_that_never_expires(case):
    with pytest.raises(AssertionError, match="no irq within"):
        run_stalled(case, WatchdogNeverExpires)
