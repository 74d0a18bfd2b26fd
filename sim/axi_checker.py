"""A passive AXI4 protocol checker for the NPU's AXI4 master, built into every RTL simulation.

The checker is gateware, not a cocotb coroutine: :class:`sim.bench_top.NPUBench` puts it next
to :class:`hw.top.NPU`, so it looks at every cycle for free. A Python
coroutine that samples the AXI4 master every cycle made a GEMM batch under Verilator 22%
slower reading only the ten valid/ready signals and 86% slower reading the payloads too
(docs/verification.md); this costs nothing measurable. The bench (:class:`sim.bench.AxiCheck`)
sleeps on ``axi_check_error`` and fails the test with the rule, the address and the cycle.

It checks what the AXI4 specification (AMBA AXI and ACE, issue H, A3.2) requires of a
manager and what the NPU's DMA promises beyond it, and the slave model's answers:

* AR, AW and W hold ``valid`` and their payload until the handshake;
* every burst is INCR, of the full bus width, bus-aligned and inside one 4 KiB page
  (``len`` is 8 bits wide, so at most 256 beats);
* W data only for a burst whose AW was accepted at an earlier edge (the DMA sends the
  address first), ``wlast`` exactly on the last beat;
* R beats only for an accepted AR and ``rlast`` on its last beat; B only after a burst's
  last W beat;
* while ``irq`` is high (a program has ended) nothing is outstanding and no ``valid`` is up,
  unless the NPU's bus watchdog expired (``bus_timeout``): then the program ended because the
  slave did not answer, with its transactions outstanding by definition. When ``bus_timeout``
  falls (the soft reset after it) the NPU abandons them: the checker forgets its outstanding
  bursts and lets the ``valid`` s held without a handshake drop in that cycle.
"""

from amaranth.hdl import Cat, Module, ResetInserter, Signal, Value
from amaranth.lib import enum, fifo, wiring
from amaranth.lib.wiring import In, Out

from hw.axi import AXI4Signature, Burst


__all__ = ["Rule", "RULE_TEXT", "AXI4Checker"]


class Rule(enum.Enum, shape=8):
    """The first rule a trace broke (``axi_check_rule``)."""
    NONE              = 0
    AR_UNSTABLE       = 1
    AW_UNSTABLE       = 2
    W_UNSTABLE        = 3
    AR_NOT_INCR       = 4
    AW_NOT_INCR       = 5
    AR_NOT_FULL_WIDTH = 6
    AW_NOT_FULL_WIDTH = 7
    AR_UNALIGNED      = 8
    AW_UNALIGNED      = 9
    AR_CROSSES_4K     = 10
    AW_CROSSES_4K     = 11
    W_BEFORE_AW       = 12
    WLAST_EARLY       = 13
    WLAST_MISSING     = 14
    R_UNEXPECTED      = 15
    RLAST_WRONG       = 16
    B_UNEXPECTED      = 17
    BUSY_AT_IRQ       = 18
    CHECKER_OVERFLOW  = 19


#: What each rule means, for the failure message.
RULE_TEXT = {
    Rule.AR_UNSTABLE:       "AR valid dropped or its payload changed before arready",
    Rule.AW_UNSTABLE:       "AW valid dropped or its payload changed before awready",
    Rule.W_UNSTABLE:        "W valid dropped or its payload changed before wready",
    Rule.AR_NOT_INCR:       "read burst type is not INCR",
    Rule.AW_NOT_INCR:       "write burst type is not INCR",
    Rule.AR_NOT_FULL_WIDTH: "arsize is not the full bus width",
    Rule.AW_NOT_FULL_WIDTH: "awsize is not the full bus width",
    Rule.AR_UNALIGNED:      "araddr is not aligned to the bus width",
    Rule.AW_UNALIGNED:      "awaddr is not aligned to the bus width",
    Rule.AR_CROSSES_4K:     "read burst crosses a 4 KiB boundary",
    Rule.AW_CROSSES_4K:     "write burst crosses a 4 KiB boundary",
    Rule.W_BEFORE_AW:       "W beat offered before its AW was accepted",
    Rule.WLAST_EARLY:       "wlast before the last beat of the burst",
    Rule.WLAST_MISSING:     "no wlast on the last beat of the burst",
    Rule.R_UNEXPECTED:      "R beat with no read burst outstanding (slave)",
    Rule.RLAST_WRONG:       "rlast not on the last beat of the read burst (slave)",
    Rule.B_UNEXPECTED:      "write response before the burst's last W beat (slave)",
    Rule.BUSY_AT_IRQ:       "a transaction is outstanding or a valid is up while irq is high",
    Rule.CHECKER_OVERFLOW:  "more than 16 bursts outstanding (the checker's own limit)",
}


def _monitor_signature(data_width):
    """Every member of the AXI4 manager interface, as an input."""
    members = AXI4Signature(addr_width=32, data_width=data_width).members
    return wiring.Signature({name: In(member.shape) for name, member in members.items()})


_AR_PAYLOAD = ("araddr", "arlen", "arsize", "arburst", "arid", "arlock", "arcache", "arprot")
_AW_PAYLOAD = ("awaddr", "awlen", "awsize", "awburst", "awid", "awlock", "awcache", "awprot")
_W_PAYLOAD = ("wdata", "wstrb", "wlast")


class AXI4Checker(wiring.Component):
    """Watches an AXI4 manager interface and the ``irq`` that says a program has ended.

    Parameters
    ----------
    data_width : int
        One of :data:`hw.config.BUS_WIDTHS` (32 to 512).
    depth : int
        Outstanding bursts tracked per direction; more is reported as ``CHECKER_OVERFLOW``.

    Attributes
    ----------
    bus : In(every AXI4 signal)
        The interface, observed only.
    irq : In(1)
    bus_timeout : In(1)
        The NPU's bus watchdog expired (:attr:`hw.top.NPU.watchdog`): ``BUSY_AT_IRQ`` does
        not apply; when it falls, what is outstanding is forgotten (see the module's text).
    disable : In(32)
        A mask of rules not to report, bit ``Rule.X.value`` for rule ``X`` (registered: it
        takes effect a cycle later). Only for showing that a test catches a checker with a rule
        missing (a mutant); zero otherwise.
    error : Out(1)
        High from the first violation until reset.
    rule : Out(Rule)
        The first rule broken (the lowest-numbered one when several break in one cycle).
    addr : Out(32)
        The address of the burst concerned (the AR or AW address, or the head burst's).
    cycle : Out(32)
        Clock cycles since reset at the violation.
    """
    def __init__(self, *, data_width, depth=16):
        self.data_width = data_width
        self.depth = depth
        super().__init__({
            "bus":   In(_monitor_signature(data_width)),
            "irq":   In(1),
            "bus_timeout": In(1),
            "disable": In(32),
            "error": Out(1),
            "rule":  Out(Rule),
            "addr":  Out(32),
            "cycle": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        bus_bytes = self.data_width // 8
        size = bus_bytes.bit_length() - 1

        cycle = Signal(32)
        m.d.sync += cycle.eq(cycle + 1)

        ar_fire = bus.arvalid & bus.arready
        aw_fire = bus.awvalid & bus.awready
        w_fire = bus.wvalid & bus.wready
        r_fire = bus.rvalid & bus.rready
        b_fire = bus.bvalid & bus.bready

        # The cycle the watchdog's expiry ends: the NPU abandons its transactions.
        timed_out = Signal()
        m.d.sync += timed_out.eq(self.bus_timeout)
        abandon = timed_out & ~self.bus_timeout

        # Bursts accepted and not finished, in order: len in bits 0..7, address above.
        reads = fifo.SyncFIFO(width=40, depth=self.depth)
        writes = fifo.SyncFIFO(width=40, depth=self.depth)
        m.submodules.reads = ResetInserter(abandon)(reads)
        m.submodules.writes = ResetInserter(abandon)(writes)
        r_beat = Signal(8)
        w_beat = Signal(8)
        responses_due = Signal(16)      # bursts whose last W beat went, awaiting their B
        read_len, read_addr = reads.r_data[:8], reads.r_data[8:]
        write_len, write_addr = writes.r_data[:8], writes.r_data[8:]
        r_last_due = r_beat == read_len
        w_last_due = w_beat == write_len

        m.d.comb += [
            reads.w_data.eq(Value.cast(bus.arlen) | (bus.araddr << 8)),
            reads.w_en.eq(ar_fire),
            reads.r_en.eq(r_fire & r_last_due),
            writes.w_data.eq(Value.cast(bus.awlen) | (bus.awaddr << 8)),
            writes.w_en.eq(aw_fire),
            writes.r_en.eq(w_fire & w_last_due),
        ]
        with m.If(r_fire & reads.r_rdy):
            m.d.sync += r_beat.eq(r_beat + 1)
            with m.If(r_last_due):
                m.d.sync += r_beat.eq(0)
        with m.If(w_fire & writes.r_rdy):
            m.d.sync += w_beat.eq(w_beat + 1)
            with m.If(w_last_due):
                m.d.sync += w_beat.eq(0)
        completed = w_fire & writes.r_rdy & w_last_due
        with m.If(completed & ~b_fire):
            m.d.sync += responses_due.eq(responses_due + 1)
        with m.Elif(b_fire & ~completed & (responses_due != 0)):
            m.d.sync += responses_due.eq(responses_due - 1)
        with m.If(abandon):
            m.d.sync += [r_beat.eq(0), w_beat.eq(0), responses_due.eq(0)]

        # The payload a stalled channel offered at the previous edge.
        def held(channel, valid, ready, names):
            stalled = Signal(name=f"{channel}_stalled")
            payload = Signal(sum(len(Value.cast(getattr(bus, name))) for name in names),
                             name=f"{channel}_held")
            now = Cat(*(getattr(bus, name) for name in names))
            m.d.sync += [stalled.eq(valid & ~ready), payload.eq(now)]
            return stalled & ~abandon & (~valid | (now != payload))

        def burst_rules(prefix, addr, length, burst_size, burst_type):
            beats = length + 1
            return [
                (burst_type != Burst.INCR, f"{prefix}_NOT_INCR"),
                (burst_size != size, f"{prefix}_NOT_FULL_WIDTH"),
                (addr[:size] != 0, f"{prefix}_UNALIGNED"),
                (addr[:12] + (beats << size) > 4096, f"{prefix}_CROSSES_4K"),
            ]

        checks = [
            (held("ar", bus.arvalid, bus.arready, _AR_PAYLOAD), "AR_UNSTABLE", bus.araddr),
            (held("aw", bus.awvalid, bus.awready, _AW_PAYLOAD), "AW_UNSTABLE", bus.awaddr),
            (held("w", bus.wvalid, bus.wready, _W_PAYLOAD), "W_UNSTABLE", write_addr),
        ]
        for condition, name in burst_rules("AR", bus.araddr, bus.arlen, bus.arsize,
                                           bus.arburst):
            checks.append((bus.arvalid & condition, name, bus.araddr))
        for condition, name in burst_rules("AW", bus.awaddr, bus.awlen, bus.awsize,
                                           bus.awburst):
            checks.append((bus.awvalid & condition, name, bus.awaddr))
        idle = (~reads.r_rdy & ~writes.r_rdy & (responses_due == 0) &
                ~bus.arvalid & ~bus.awvalid & ~bus.wvalid)
        checks += [
            (bus.wvalid & ~writes.r_rdy, "W_BEFORE_AW", 0),
            (w_fire & writes.r_rdy & bus.wlast & ~w_last_due, "WLAST_EARLY", write_addr),
            (w_fire & writes.r_rdy & ~bus.wlast & w_last_due, "WLAST_MISSING", write_addr),
            (r_fire & ~reads.r_rdy, "R_UNEXPECTED", 0),
            (r_fire & reads.r_rdy & (bus.rlast != r_last_due), "RLAST_WRONG", read_addr),
            (b_fire & (responses_due == 0), "B_UNEXPECTED", 0),
            (self.irq & ~idle & ~self.bus_timeout, "BUSY_AT_IRQ", 0),
            ((ar_fire & ~reads.w_rdy) | (aw_fire & ~writes.w_rdy) |
             (completed & (responses_due == 0xFFFF)), "CHECKER_OVERFLOW", 0),
        ]
        checks.sort(key=lambda check: Rule[check[1]].value)
        disabled = Signal(32)
        m.d.sync += disabled.eq(self.disable)
        checks = [(condition & ~disabled.bit_select(Rule[name].value, 1), name, addr)
                  for condition, name, addr in checks]

        with m.If(~self.error):
            for index, (condition, name, addr) in enumerate(checks):
                with (m.If if index == 0 else m.Elif)(condition):
                    m.d.sync += [self.error.eq(1), self.rule.eq(Rule[name]),
                                 self.addr.eq(addr), self.cycle.eq(cycle)]
        return m
