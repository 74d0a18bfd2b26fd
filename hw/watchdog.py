"""The bus watchdog: notices an AXI4 slave that stops answering the NPU's master."""

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .axi import AXI4Signature


__all__ = ["BusWatchdog"]


class BusWatchdog(wiring.Component):
    """Counts the cycles in which the master waits on its slave and nothing moves.

    The master waits on the slave in a cycle when a ``valid`` of its own is up without its
    ``ready`` (AR, AW, W), when a read burst is outstanding (its address taken, its ``rlast``
    beat not yet) and no R beat is offered, or when a write burst's response is due (its
    last W beat taken, its B not yet) and no B is offered. Any handshake on any of the five
    channels is an answer and starts the count again, as does a cycle with nothing awaited;
    so does ``idle`` (the DMA's own view: no command and nothing outstanding), which also
    forgets the outstanding counts, so that a slave that broke the protocol (a burst
    longer than asked, an extra response, which the DMA ends in an error of its own) leaves
    nothing stale for the next run. ``expired`` rises in the cycle after the ``limit``-th
    consecutive cycle of waiting with no answer (``limit`` cycles after the first), and
    stays high until reset (the core reset, :class:`hw.top.NPU`). A ``limit`` of zero turns
    the watchdog off.

    The read and write counts follow the DMA's order: it sends a burst's W beats only after
    its AW was taken, so a response is due from its last W beat on.

    Attributes
    ----------
    bus : In(AXI4Signature)
        The master's signals, watched only (every member an input).
    idle : In(1)
        The DMA has nothing running and nothing outstanding.
    limit : In(32)
        Cycles of waiting with no answer that make the watchdog expire; 0: never.
    expired : Out(1)
        The slave did not answer for ``limit`` cycles; high until reset.
    """
    def __init__(self, *, addr_width, data_width):
        members = AXI4Signature(addr_width=addr_width, data_width=data_width).members
        super().__init__({
            "bus":     In(wiring.Signature({name: In(member.shape)
                                            for name, member in members.items()})),
            "idle":    In(1),
            "limit":   In(32),
            "expired": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        ar_fire = bus.arvalid & bus.arready
        aw_fire = bus.awvalid & bus.awready
        w_fire = bus.wvalid & bus.wready
        r_fire = bus.rvalid & bus.rready
        b_fire = bus.bvalid & bus.bready

        # Outstanding read bursts and due write responses (the DMA keeps at most a few of
        # either; 16 bits never wrap, and a count never goes below zero).
        reads_owed = Signal(16)
        responses_owed = Signal(16)
        read_ended = r_fire & bus.rlast & (reads_owed != 0)
        response_ended = b_fire & (responses_owed != 0)
        write_ended = w_fire & bus.wlast
        with m.If(self.idle):
            m.d.sync += [reads_owed.eq(0), responses_owed.eq(0)]
        with m.Else():
            m.d.sync += [reads_owed.eq(reads_owed + ar_fire - read_ended),
                         responses_owed.eq(responses_owed + write_ended - response_ended)]

        waiting = ((bus.arvalid & ~bus.arready) | (bus.awvalid & ~bus.awready) |
                   (bus.wvalid & ~bus.wready) | ((reads_owed != 0) & ~bus.rvalid) |
                   ((responses_owed != 0) & ~bus.bvalid))
        answered = ar_fire | aw_fire | w_fire | r_fire | b_fire
        # The cycles waited before this one; in the cycle that completes ``limit`` of them,
        # ``expired`` is set at the edge.
        waited = Signal(32)
        stalled = waiting & ~answered & ~self.idle
        with m.If(~stalled):
            m.d.sync += waited.eq(0)
        with m.Elif(~self.expired):
            m.d.sync += waited.eq(waited + 1)
        with m.If(self._expires(stalled, waited)):
            m.d.sync += self.expired.eq(1)
        return m

    def _expires(self, stalled, waited):
        """Whether this cycle completes the limit (a hook: tests break it in a mutant)."""
        return stalled & (self.limit != 0) & (waited + 1 >= self.limit)
