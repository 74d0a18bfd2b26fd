"""The host interface: an AXI4-Lite slave holding the NPU's registers."""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .axi import AXI4LiteSignature, Resp
from .controller import HostLinkSignature
from .isa import MAGIC, VERSION, WATCHDOG_RESET, Control, Irq, Reg, Status


__all__ = ["HostInterface"]


class HostInterface(wiring.Component):
    """AXI4-Lite register file: identification, configuration, control, status, cycles,
    interrupt and watchdog.

    The register map is :class:`hw.isa.Reg`. Reads of unmapped offsets return zero, writes to
    them are ignored; both answer OKAY so that probing software does not fault.

    Parameters
    ----------
    config : NPUConfig
        Reported in the identification registers.

    Attributes
    ----------
    bus : In(AXI4LiteSignature(addr_width=8))
        The slave port.
    ctrl : In(HostLinkSignature())
        To the controller: ``start`` and ``soft_reset`` are one-cycle pulses in the cycle
        after the write of ``CONTROL`` is taken (its response comes two cycles after them);
        ``prog_addr`` and ``prog_len`` the program registers (a write while busy changes them
        for the next start only: the controller latched them at start); the status, counters
        and performance counters come back.
    read_bytes, write_bytes : In(32)
        The bus traffic counters (``Reg.PERF_READ_BYTES``, ``Reg.PERF_WRITE_BYTES``).
    core_reset : In(1)
        The NPU's core reset (:class:`hw.top.NPU`): clears ``IRQ_PENDING``, as a soft reset
        cleared ``done`` and ``error``. The host's registers are not reset by it.
    irq : Out(1)
        ``IRQ_PENDING & IRQ_ENABLE`` is not zero (from flip-flops, through one LUT).
        ``IRQ_PENDING`` gets :attr:`Irq.DONE` or :attr:`Irq.ERROR` a cycle after the
        controller's ``ended``, so ``irq`` rises a cycle after ``done`` or ``error``; it is
        cleared a cycle after ``started`` (before the response of the write of the start,
        as ``done`` and ``error`` are), after a write of ``CONTROL`` asking for a soft reset
        and after the core reset. A write of ``IRQ_PENDING`` clears the bits written with 1
        (an end in the same cycle still sets its bit).
    watchdog_limit : Out(32)
        ``Reg.WATCHDOG``: to :class:`hw.watchdog.BusWatchdog`.
    """
    def __init__(self, config):
        self.config = config
        super().__init__({
            "bus":        In(AXI4LiteSignature(addr_width=8)),
            "ctrl":       In(HostLinkSignature()),
            "read_bytes": In(32),
            "write_bytes": In(32),
            "core_reset": In(1),
            "irq":        Out(1),
            "watchdog_limit": Out(32, init=WATCHDOG_RESET),
        })

    def elaborate(self, platform):
        m = Module()
        written, soft_reset = self._writes(m)
        irq_enable = self._program_registers(m, written)
        irq_pending = self._interrupts(m, written, soft_reset, irq_enable)
        self._reads(m, irq_enable, irq_pending)
        return m

    def _writes(self, m):
        """The write channels and CONTROL's pulses; returns the write taken (its flag and
        its address, data and strobes registered in every cycle) and the soft reset pulse."""
        bus = self.bus
        ctrl = self.ctrl
        # Writes: take address and data together, answer, then accept the next.
        # CONTROL's pulses come from flip-flops, in the cycle after the write is taken, and
        # the controller registers them once more (the host sits by the bus port, the
        # controller's run state across the die); the response comes two cycles after the
        # pulses: once the master has it, the write has taken effect (a start has made the NPU
        # busy and lowered irq). So a write is taken at most every four cycles, and a
        # program register's write (in effect two cycles after it is taken: below) still
        # three cycles before the start after it.
        write_taken = Signal()
        write_held = Signal()
        write_ack = Signal()
        start = Signal()
        soft_reset = Signal()
        m.d.sync += [start.eq(0), soft_reset.eq(0), write_taken.eq(0),
                     write_held.eq(write_taken)]
        m.d.comb += [ctrl.start.eq(start), ctrl.soft_reset.eq(soft_reset)]
        idle = ~write_taken & ~write_held & ~write_ack
        m.d.comb += [
            bus.awready.eq(bus.awvalid & bus.wvalid & idle),
            bus.wready.eq(bus.awvalid & bus.wvalid & idle),
            bus.bvalid.eq(write_ack),
            bus.bresp.eq(Resp.OKAY),
        ]
        with m.If(bus.bvalid & bus.bready):
            m.d.sync += write_ack.eq(0)
        with m.If(write_held):
            m.d.sync += write_ack.eq(1)
        with m.If(bus.awready):
            m.d.sync += write_taken.eq(1)
            with m.Switch(bus.awaddr[2:8]):
                with m.Case(Reg.CONTROL >> 2):
                    with m.If(bus.wstrb[0]):
                        m.d.sync += [
                            start.eq((bus.wdata & Control.START).any()),
                            soft_reset.eq((bus.wdata & Control.SOFT_RESET).any()),
                        ]

        # The program registers take a write in the cycle after it is taken, from the
        # write's address, data and strobes registered in every cycle (no enable, so no
        # logic before them): their 64 flip-flops sit by the fetcher, which latches them at
        # start, and the decode and strobes into their enables from the bus's registers, by
        # routes across the die, were the 8x8's worst path on one placement. The response
        # still comes after they have changed.
        taken_addr = Signal.like(bus.awaddr[2:8], reset_less=True)
        taken_data = Signal.like(bus.wdata, reset_less=True)
        taken_strb = Signal.like(bus.wstrb, reset_less=True)
        m.d.sync += [taken_addr.eq(bus.awaddr[2:8]), taken_data.eq(bus.wdata),
                     taken_strb.eq(bus.wstrb)]
        return (write_taken, taken_addr, taken_data, taken_strb), soft_reset

    def _program_registers(self, m, written):
        """The read-write registers, written the cycle after the write is taken; returns
        ``IRQ_ENABLE``."""
        ctrl = self.ctrl
        write_taken, taken_addr, taken_data, taken_strb = written
        irq_enable = Signal(Irq.ALL.bit_length(), init=Irq.ALL)
        for reg, value in ((Reg.PROG_ADDR, ctrl.prog_addr), (Reg.PROG_LEN, ctrl.prog_len),
                           (Reg.WATCHDOG, self.watchdog_limit), (Reg.IRQ_ENABLE, irq_enable)):
            for lane in range((len(value) + 7) // 8):
                with m.If(write_taken & (taken_addr == reg >> 2) & taken_strb[lane]):
                    m.d.sync += value[8 * lane:8 * lane + 8].eq(
                        taken_data[8 * lane:8 * lane + 8])
        return irq_enable

    def _interrupts(self, m, written, soft_reset, irq_enable):
        """``IRQ_PENDING`` and ``irq``; returns ``IRQ_PENDING``."""
        ctrl = self.ctrl
        write_taken, taken_addr, taken_data, taken_strb = written
        # Pending interrupts: set by the end of a program, cleared by the host (write one to
        # clear), by a run's start and by a soft reset. Only the bits of the end itself
        # (``done`` or ``error``) are set, so a clear in the same cycle loses no end; a start
        # wins over an end in its cycle (that end belongs to the run before, which the host
        # has started over).
        irq_pending = Signal.like(irq_enable, init=0)
        acknowledged = Mux(write_taken & (taken_addr == Reg.IRQ_PENDING >> 2) & taken_strb[0],
                           self._acknowledge(irq_pending, taken_data[:len(irq_pending)]),
                           irq_pending)
        ending = Mux(ctrl.ended, Cat(ctrl.done, ctrl.error), 0)
        m.d.sync += irq_pending.eq(acknowledged | ending)
        with m.If(ctrl.started | soft_reset | self.core_reset):
            m.d.sync += irq_pending.eq(0)
        m.d.comb += self.irq.eq(self._irq(irq_pending, irq_enable))
        assert Irq.DONE == 1 << 0 and Irq.ERROR == 1 << 1   # the order of Cat above
        return irq_pending

    def _reads(self, m, irq_enable, irq_pending):
        """The read channels and the register map's two-level multiplexer."""
        bus = self.bus
        config = self.config
        ctrl = self.ctrl
        # Reads: one at a time, the address registered, then the data in two steps: each
        # group of eight registers (by the address's upper bits) picks its word by the
        # lower bits into a register, and the group's word is picked from those. The
        # multiplexer starts from the host's own flip-flops, not from the bus's (a route into
        # its decode was a group of an 8x8's failing paths), and its 26 sources, most from
        # the issue stage's counters across the die, reach flip-flops of their group's
        # after two LUT levels (the whole map into ``read_data`` in one cycle was the 4x4's
        # worst path on one placement). Three cycles from the address to the data.
        read_pending = Signal()
        read_grouped = Signal()
        read_addr = Signal.like(bus.araddr[2:8], reset_less=True)
        read_valid = Signal()
        read_data = Signal(32)
        m.d.comb += [
            bus.arready.eq(~read_pending & ~read_grouped & ~read_valid),
            bus.rvalid.eq(read_valid),
            bus.rdata.eq(read_data),
            bus.rresp.eq(Resp.OKAY),
        ]
        with m.If(bus.rvalid & bus.rready):
            m.d.sync += read_valid.eq(0)
        m.d.sync += [read_pending.eq(0), read_grouped.eq(read_pending)]
        with m.If(bus.arvalid & bus.arready):
            m.d.sync += [read_pending.eq(1), read_addr.eq(bus.araddr[2:8])]
        registers = {
            Reg.MAGIC:      MAGIC,
            Reg.VERSION:    VERSION,
            Reg.SHAPE:      config.rows | (config.cols << 16),
            Reg.SPAD_DEPTH: config.spad_depth,
            Reg.ACC_DEPTH:  config.acc_depth,
            Reg.BUS_WIDTH:  config.bus_width,
            Reg.STATUS:     (Mux(ctrl.busy, Status.BUSY, 0) | Mux(ctrl.done, Status.DONE, 0) |
                             Mux(ctrl.error, Status.ERROR, 0) |
                             (ctrl.error_code << Status.CODE_SHIFT)),
            Reg.ERROR_PC:   ctrl.error_pc,
            Reg.PC:         ctrl.pc,
            Reg.PROG_ADDR:  ctrl.prog_addr,
            Reg.PROG_LEN:   ctrl.prog_len,
            Reg.CYCLES_LO:  ctrl.cycles[:32],
            Reg.CYCLES_HI:  ctrl.cycles[32:],
            Reg.PERF_ARRAY_ROWS:   ctrl.perf.array_rows,
            Reg.PERF_USEFUL_MACS:  ctrl.perf.useful_macs,
            Reg.PERF_STALL_FETCH:  ctrl.perf.stall_fetch,
            Reg.PERF_STALL_LOAD:   ctrl.perf.stall_load,
            Reg.PERF_STALL_STORE:  ctrl.perf.stall_store,
            Reg.PERF_STALL_ARRAY:  ctrl.perf.stall_array,
            Reg.PERF_INSTRUCTIONS: ctrl.perf.instructions,
            Reg.PERF_READ_BYTES:   self.read_bytes,
            Reg.PERF_WRITE_BYTES:  self.write_bytes,
            Reg.IRQ_ENABLE:  irq_enable,
            Reg.IRQ_PENDING: irq_pending,
            Reg.WATCHDOG:    self.watchdog_limit,
        }
        groups = {}
        for offset, value in registers.items():
            groups.setdefault(offset >> 5, {})[(offset >> 2) & 7] = value
        group_words = {group: Signal(32, name=f"read_group_{group}") for group in groups}
        with m.If(read_pending):
            for group, members in groups.items():
                m.d.sync += group_words[group].eq(0)
                with m.Switch(read_addr[:3]):
                    for index, value in members.items():
                        with m.Case(index):
                            m.d.sync += group_words[group].eq(value)
        with m.If(read_grouped):
            m.d.sync += [read_valid.eq(1), read_data.eq(0)]
            with m.Switch(read_addr[3:]):
                for group, word in group_words.items():
                    with m.Case(group):
                        m.d.sync += read_data.eq(word)

    # Hooks (tests break them in mutants).
    def _acknowledge(self, pending, written):
        """``IRQ_PENDING`` after a write of ``written``: the bits written with 1 cleared."""
        return pending & ~written

    def _irq(self, pending, enable):
        """The interrupt line: a pending bit that is enabled."""
        return (pending & enable).any()
