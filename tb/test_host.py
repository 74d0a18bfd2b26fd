"""Unit tests of :class:`hw.host.HostInterface`: the AXI4-Lite register file."""

import pytest

from hw.axi import Resp
from hw.config import NPUConfig
from hw.host import HostInterface
from hw.isa import (MAGIC, VERSION, WATCHDOG_RESET, Control, ErrorCode, Irq, Opcode, Reg,
                    Status, encode)
from sim.amaranth_sim import AXI4MemoryModel, axil_read, axil_write, run_simulation


CONFIG = NPUConfig(rows=3, cols=5, spad_depth=48, acc_depth=24, bus_width=128)


def _pulse_monitor(dut, pulses):
    """A process that records the cycle of every edge at which start / soft_reset is high."""
    async def process(ctx):
        cycle = 0
        async for _, _, start, soft_reset in ctx.tick().sample(dut.ctrl.start, dut.ctrl.soft_reset):
            cycle += 1
            if start:
                pulses["start"].append(cycle)
            if soft_reset:
                pulses["soft_reset"].append(cycle)
    return process


def test_identification_registers():
    dut = HostInterface(CONFIG)

    async def testbench(ctx):
        expected = {
            Reg.MAGIC: MAGIC,
            Reg.VERSION: VERSION,
            Reg.SHAPE: 3 | 5 << 16,
            Reg.SPAD_DEPTH: 48,
            Reg.ACC_DEPTH: 24,
            Reg.BUS_WIDTH: 128,
        }
        for reg, value in expected.items():
            got = await axil_read(ctx, dut.bus, reg)
            assert got == value, f"{reg.name} reads {got:#x}, expected {value:#x}"
        # Unmapped offsets read zero (and answer OKAY, which axil_read checks).
        for offset in (0x18, 0x1C, 0x40, 0xFC):
            assert await axil_read(ctx, dut.bus, offset) == 0, f"offset {offset:#x}"
        # Writes to read-only and unmapped registers change nothing.
        for offset in (Reg.MAGIC, Reg.SHAPE, 0x40):
            assert await axil_write(ctx, dut.bus, offset, 0xFFFF_FFFF) == Resp.OKAY.value
        assert await axil_read(ctx, dut.bus, Reg.MAGIC) == MAGIC
        assert await axil_read(ctx, dut.bus, Reg.SHAPE) == 3 | 5 << 16

    run_simulation(dut, testbench)


def test_program_registers_read_back():
    dut = HostInterface(CONFIG)

    async def testbench(ctx):
        assert await axil_read(ctx, dut.bus, Reg.PROG_ADDR) == 0
        assert await axil_write(ctx, dut.bus, Reg.PROG_ADDR, 0x8765_4320) == Resp.OKAY.value
        assert await axil_write(ctx, dut.bus, Reg.PROG_LEN, 0x0001_2345,
                                aw_delay=3) == Resp.OKAY.value   # data before address
        assert await axil_read(ctx, dut.bus, Reg.PROG_ADDR) == 0x8765_4320
        assert await axil_read(ctx, dut.bus, Reg.PROG_LEN) == 0x0001_2345
        assert ctx.get(dut.ctrl.prog_addr) == 0x8765_4320
        assert ctx.get(dut.ctrl.prog_len) == 0x0001_2345
        # Byte strobes: only the enabled bytes change.
        await axil_write(ctx, dut.bus, Reg.PROG_ADDR, 0xAABB_CCDD, strobe=0b0101, w_delay=2)
        assert await axil_read(ctx, dut.bus, Reg.PROG_ADDR) == 0x87BB_43DD
        await axil_write(ctx, dut.bus, Reg.PROG_LEN, 0xFFFF_FFFF, strobe=0b1000)
        assert await axil_read(ctx, dut.bus, Reg.PROG_LEN) == 0xFF01_2345

    run_simulation(dut, testbench)


def test_control_pulses_once():
    """A CONTROL write gives exactly one one-cycle pulse of start or soft_reset, even while
    the master keeps the next write waiting; a write with wstrb[0] low gives none."""
    dut = HostInterface(CONFIG)
    pulses = {"start": [], "soft_reset": []}

    async def testbench(ctx):
        await axil_write(ctx, dut.bus, Reg.CONTROL, Control.START)
        assert len(pulses["start"]) == 1 and pulses["soft_reset"] == []
        await axil_write(ctx, dut.bus, Reg.CONTROL, Control.SOFT_RESET, w_delay=4)
        assert len(pulses["start"]) == 1 and len(pulses["soft_reset"]) == 1
        await axil_write(ctx, dut.bus, Reg.CONTROL, Control.START, strobe=0b1110)
        await axil_write(ctx, dut.bus, Reg.CONTROL, 0)
        await axil_write(ctx, dut.bus, Reg.PROG_ADDR, Control.START)
        assert len(pulses["start"]) == 1 and len(pulses["soft_reset"]) == 1
        # Master holds bready low: no second pulse while the response waits.
        ctx.set(dut.bus.awaddr, Reg.CONTROL)
        ctx.set(dut.bus.wdata, Control.START)
        ctx.set(dut.bus.wstrb, 0xF)
        ctx.set(dut.bus.awvalid, 1)
        ctx.set(dut.bus.wvalid, 1)
        ctx.set(dut.bus.bready, 0)
        await ctx.tick()
        ctx.set(dut.bus.awvalid, 0)
        ctx.set(dut.bus.wvalid, 0)
        await ctx.tick()          # the pulse was in the cycle before: the response two after
        assert ctx.get(dut.bus.bvalid) == 0
        for _ in range(5):
            await ctx.tick()
            assert ctx.get(dut.bus.bvalid) == 1
        ctx.set(dut.bus.bready, 1)
        await ctx.tick()
        assert ctx.get(dut.bus.bvalid) == 0
        await ctx.tick()
        assert len(pulses["start"]) == 2 and len(pulses["soft_reset"]) == 1

    run_simulation(dut, testbench, processes=[_pulse_monitor(dut, pulses)])


def test_status_registers_follow_inputs():
    dut = HostInterface(CONFIG)

    async def testbench(ctx):
        ctx.set(dut.ctrl.busy, 1)
        ctx.set(dut.ctrl.error_code, 0xA5)
        ctx.set(dut.ctrl.error_pc, 0x1234_5678)
        ctx.set(dut.ctrl.pc, 0x0BAD_CAFE)
        ctx.set(dut.ctrl.cycles, 0x0123_4567_89AB_CDEF)
        assert await axil_read(ctx, dut.bus, Reg.STATUS) == 0xA501
        ctx.set(dut.ctrl.busy, 0)
        ctx.set(dut.ctrl.done, 1)
        assert await axil_read(ctx, dut.bus, Reg.STATUS) == 0xA502
        ctx.set(dut.ctrl.done, 0)
        ctx.set(dut.ctrl.error, 1)
        assert await axil_read(ctx, dut.bus, Reg.STATUS) == 0xA504
        assert await axil_read(ctx, dut.bus, Reg.ERROR_PC) == 0x1234_5678
        assert await axil_read(ctx, dut.bus, Reg.PC) == 0x0BAD_CAFE
        assert await axil_read(ctx, dut.bus, Reg.CYCLES_LO) == 0x89AB_CDEF
        assert await axil_read(ctx, dut.bus, Reg.CYCLES_HI) == 0x0123_4567
        # The read data holds while the master keeps rready low.
        ctx.set(dut.bus.araddr, Reg.MAGIC)
        ctx.set(dut.bus.arvalid, 1)
        ctx.set(dut.bus.rready, 0)
        await ctx.tick()
        ctx.set(dut.bus.arvalid, 0)
        ctx.set(dut.bus.araddr, Reg.PC)
        await ctx.tick()
        for _ in range(4):
            await ctx.tick()
            assert (ctx.get(dut.bus.rvalid), ctx.get(dut.bus.rdata)) == (1, MAGIC)
            assert ctx.get(dut.bus.arready) == 0
        ctx.set(dut.bus.rready, 1)
        await ctx.tick()
        assert ctx.get(dut.bus.rvalid) == 0
        assert await axil_read(ctx, dut.bus, Reg.PC) == 0x0BAD_CAFE

    run_simulation(dut, testbench)


def test_read_data_three_cycles_after_the_address():
    """The address is taken at its handshake (a master that changes ``araddr`` after it
    reads the register it asked for), the data comes three cycles later (the address
    registered, then the group's word, then the word), and no next address is taken
    before the data has been."""
    dut = HostInterface(CONFIG)

    async def testbench(ctx):
        ctx.set(dut.bus.rready, 1)
        ctx.set(dut.bus.araddr, Reg.MAGIC)
        ctx.set(dut.bus.arvalid, 1)
        _, _, arready = await ctx.tick().sample(dut.bus.arready)
        assert arready                                    # taken at this edge
        ctx.set(dut.bus.araddr, Reg.SHAPE)                # the next address, offered at once
        waited = 0
        while True:
            _, _, arready, rvalid, rdata = await ctx.tick().sample(
                dut.bus.arready, dut.bus.rvalid, dut.bus.rdata)
            waited += 1
            assert not arready, f"a second address taken {waited} cycles after the first"
            if rvalid:
                break
        assert (waited, rdata) == (3, MAGIC), (waited, hex(rdata))

    run_simulation(dut, testbench)


# ---------------------------------------------------------------------- interrupts
class AcknowledgeOnZero(HostInterface):
    """Mutant: a write of ``IRQ_PENDING`` clears the bits written with 0."""
    def _acknowledge(self, pending, written):
        return pending & written


class IrqIgnoresEnable(HostInterface):
    """Mutant: ``irq`` is any pending bit, enabled or not."""
    def _irq(self, pending, enable):
        return pending.any()


def check_interrupt_registers(host_class=HostInterface):
    """``irq`` is ``IRQ_PENDING & IRQ_ENABLE``: an end sets its bit (done or error), a masked
    one still shows as pending, a write clears only the bits written with 1, and a run's
    start, a soft reset and the core reset clear them all."""
    dut = host_class(CONFIG)

    async def end(ctx, done, error):
        ctx.set(dut.ctrl.done, done)
        ctx.set(dut.ctrl.error, error)
        ctx.set(dut.ctrl.ended, 1)
        await ctx.tick()
        ctx.set(dut.ctrl.ended, 0)

    async def pulse(ctx, port):
        ctx.set(port, 1)
        await ctx.tick()
        ctx.set(port, 0)

    async def testbench(ctx):
        bus = dut.bus
        assert await axil_read(ctx, bus, Reg.IRQ_ENABLE) == Irq.ALL
        assert await axil_read(ctx, bus, Reg.IRQ_PENDING) == 0
        assert ctx.get(dut.irq) == 0
        ctx.set(dut.ctrl.done, 1)           # done alone does not interrupt: its end does
        await ctx.tick()
        assert ctx.get(dut.irq) == 0
        await end(ctx, 1, 0)
        assert ctx.get(dut.irq) == 1        # in the cycle after the end
        assert await axil_read(ctx, bus, Reg.IRQ_PENDING) == Irq.DONE
        await axil_write(ctx, bus, Reg.IRQ_ENABLE, 0)
        assert ctx.get(dut.irq) == 0
        assert await axil_read(ctx, bus, Reg.IRQ_PENDING) == Irq.DONE   # masked, pending
        await axil_write(ctx, bus, Reg.IRQ_ENABLE, 0xFFFF_FFF0 | Irq.ERROR)
        assert await axil_read(ctx, bus, Reg.IRQ_ENABLE) == Irq.ERROR   # two bits only
        assert ctx.get(dut.irq) == 0
        await end(ctx, 0, 1)
        assert ctx.get(dut.irq) == 1
        assert await axil_read(ctx, bus, Reg.IRQ_PENDING) == Irq.ALL
        await axil_write(ctx, bus, Reg.IRQ_PENDING, Irq.ERROR)           # acknowledge
        assert ctx.get(dut.irq) == 0
        assert await axil_read(ctx, bus, Reg.IRQ_PENDING) == Irq.DONE
        await axil_write(ctx, bus, Reg.IRQ_PENDING, 0)
        await axil_write(ctx, bus, Reg.IRQ_PENDING, Irq.ERROR, strobe=0b1110)
        assert await axil_read(ctx, bus, Reg.IRQ_PENDING) == Irq.DONE
        await axil_write(ctx, bus, Reg.IRQ_ENABLE, Irq.ALL)
        assert ctx.get(dut.irq) == 1
        await pulse(ctx, dut.ctrl.started)
        assert (ctx.get(dut.irq), await axil_read(ctx, bus, Reg.IRQ_PENDING)) == (0, 0)
        await end(ctx, 0, 1)
        await axil_write(ctx, bus, Reg.CONTROL, Control.SOFT_RESET)
        assert (ctx.get(dut.irq), await axil_read(ctx, bus, Reg.IRQ_PENDING)) == (0, 0)
        await end(ctx, 1, 0)
        await pulse(ctx, dut.core_reset)
        assert (ctx.get(dut.irq), await axil_read(ctx, bus, Reg.IRQ_PENDING)) == (0, 0)
        # An end in the cycle of a start belongs to the run before: the start wins.
        ctx.set(dut.ctrl.started, 1)
        await end(ctx, 1, 0)
        ctx.set(dut.ctrl.started, 0)
        assert await axil_read(ctx, bus, Reg.IRQ_PENDING) == 0
        # The watchdog's limit: its reset value, written and read back.
        assert await axil_read(ctx, bus, Reg.WATCHDOG) == WATCHDOG_RESET
        await axil_write(ctx, bus, Reg.WATCHDOG, 0x8000_0001)
        assert await axil_read(ctx, bus, Reg.WATCHDOG) == 0x8000_0001
        assert ctx.get(dut.watchdog_limit) == 0x8000_0001

    run_simulation(dut, testbench)


def test_interrupt_registers():
    check_interrupt_registers()


@pytest.mark.parametrize("mutant", [AcknowledgeOnZero, IrqIgnoresEnable],
                         ids=lambda mutant: mutant.__name__)
def test_interrupt_test_catches_a_mutant(mutant):
    with pytest.raises(AssertionError):
        check_interrupt_registers(mutant)


def test_interrupts_of_the_npu():
    """In the NPU: an END's interrupt is acknowledged without touching STATUS; a masked
    error still shows as pending, and raises irq once enabled; a start clears it."""
    from hw.top import NPU

    config = NPUConfig(rows=2, cols=2, spad_depth=16, acc_depth=8, bus_width=64)
    dut = NPU(config)
    model = AXI4MemoryModel(dut.m_axi, data_width=64, seed=5)
    model.load(0x100, encode(Opcode.END).to_bytes(16, "little"))

    async def wait(ctx, cycles=200):
        for _ in range(cycles):
            await ctx.tick()

    async def testbench(ctx):
        bus = dut.s_axil
        await axil_write(ctx, bus, Reg.PROG_ADDR, 0x100)
        await axil_write(ctx, bus, Reg.PROG_LEN, 1)
        await axil_write(ctx, bus, Reg.CONTROL, Control.START)
        await wait(ctx)
        assert ctx.get(dut.irq) == 1
        assert await axil_read(ctx, bus, Reg.IRQ_PENDING) == Irq.DONE
        await axil_write(ctx, bus, Reg.IRQ_PENDING, Irq.ALL)
        assert ctx.get(dut.irq) == 0
        assert await axil_read(ctx, bus, Reg.STATUS) == Status.DONE
        await axil_write(ctx, bus, Reg.IRQ_ENABLE, Irq.DONE)
        await axil_write(ctx, bus, Reg.PROG_LEN, 0)                 # PROGRAM error at start
        await axil_write(ctx, bus, Reg.CONTROL, Control.START)
        await wait(ctx, 10)
        assert ctx.get(dut.irq) == 0
        assert await axil_read(ctx, bus, Reg.STATUS) == \
            Status.ERROR | ErrorCode.PROGRAM.value << Status.CODE_SHIFT
        assert await axil_read(ctx, bus, Reg.IRQ_PENDING) == Irq.ERROR
        await axil_write(ctx, bus, Reg.IRQ_ENABLE, Irq.ALL)
        assert ctx.get(dut.irq) == 1
        await axil_write(ctx, bus, Reg.PROG_LEN, 1)
        await axil_write(ctx, bus, Reg.CONTROL, Control.START)      # clears it at once
        assert ctx.get(dut.irq) == 0
        assert await axil_read(ctx, bus, Reg.STATUS) & Status.BUSY
        await wait(ctx)
        assert await axil_read(ctx, bus, Reg.IRQ_PENDING) == Irq.DONE
        assert ctx.get(dut.irq) == 1

    run_simulation(dut, testbench, processes=[model.process])
