"""The on-chip test harness that stands between the NPU's AXI ports and a handful of pins.

The NPU has a few hundred port bits (a 64-bit AXI4 master, an AXI4-Lite slave); an
out-of-context build that made each a pin would not fit most ECP5 packages and would time
the pads instead of the design. :class:`ScanHarness` keeps every port bit alive and
registered with four pins:

* every NPU input is a bit of a shift register fed from ``scan_in`` (one bit per cycle),
  copied every cycle into a register of its own (``scan_input_update``, a boundary scan's
  update stage), so each input comes straight from a flip-flop that nothing else ties
  down, as from a registered AXI interconnect;
* every NPU output is registered every cycle (``scan_output_hold``), copied from there into a
  shift register while ``scan_capture`` is high and shifted out through ``scan_out``
  otherwise, so each output ends at a flip-flop with no logic before it.

The chains' flip-flops sit in a row, each beside the next; the update and hold registers are
free to sit by the NPU's logic, and the routes between the two carry no logic. (With the
chain's bits driving the NPU themselves, routes of 6.5 ns from the chain into the host's
registers were the 8x8's worst path on one placement: docs/fpga-timing.md, table: harness
update register.)
* ``rst`` is registered once and becomes the ``sync`` domain's reset, asynchronous to assert
  and released on a clock edge (``async_reset``): a synchronous reset would be one net from
  one flip-flop to the reset input of every flip-flop of the NPU, and the slowest net of the
  build, where on a real FPGA a reset is held for cycles and distributed as a tree. nextpnr
  does not time it (as it does not time any asynchronous reset).

Nothing is constant and everything is observable, so synthesis can remove no logic, and all
timing paths of the NPU start and end at flip-flops of one clock: nextpnr's Fmax is the NPU's.
"""

from amaranth.hdl import (Cat, ClockDomain, ClockSignal, Const, Instance, Module, ResetSignal,
                          Signal)
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.top import top_ports


__all__ = ["ScanHarness", "RESET_DCC_85F"]


#: nextpnr's name of the DCC the harness's reset goes through on the LFE5U-85F.
RESET_DCC_85F = "X67/Y0/TDCC1"


class ScanHarness(wiring.Component):
    """Scan-chain wrapper of any component whose ports :func:`hw.top.top_ports` can list.

    Parameters
    ----------
    design : wiring.Component
        The design under test (an :class:`hw.top.NPU`).
    own_clock : bool
        Make the ``sync`` domain from the ``clk`` and ``rst`` ports (out of context); without
        it (on a board) the platform supplies ``sync`` and those ports do not exist.

    Attributes
    ----------
    clk : In(1)
        The clock of the ``sync`` domain (``own_clock`` only).
    rst : In(1)
        Reset, registered once, then the ``sync`` domain's synchronous reset (``own_clock``
        only).
    scan_in : In(1)
        Serial input of the input shift register.
    scan_capture : In(1)
        Capture all outputs (high) or shift them out (low).
    scan_out : Out(1)
        Serial output of the output shift register.
    """
    def __init__(self, design, *, own_clock=True):
        if not isinstance(design, wiring.Component):
            raise TypeError(f"design must be a wiring.Component, not {design!r}")
        self.design = design
        self.own_clock = own_clock
        # Constant members (the ready of an always-ready stream) are no ports at all.
        ports = [(value, direction) for value, direction in top_ports(design).values()
                 if not isinstance(value, Const)]
        self.inputs = [value for value, direction in ports if direction == "input"]
        self.outputs = [value for value, direction in ports if direction == "output"]
        members = {"clk": In(1), "rst": In(1)} if own_clock else {}
        super().__init__({**members, "scan_in": In(1), "scan_capture": In(1),
                          "scan_out": Out(1)})

    @property
    def input_bits(self):
        return sum(len(value) for value in self.inputs)

    @property
    def output_bits(self):
        return sum(len(value) for value in self.outputs)

    def elaborate(self, platform):
        m = Module()
        if self.own_clock:
            m.domains.sync = ClockDomain("sync", async_reset=True)
            reset = Signal(reset_less=True, name="rst_registered")
            m.d.sync += reset.eq(self.rst)
            if getattr(platform, "family", None) == "ecp5":
                # The reset reaches every flip-flop: put it on a global network, as a clock.
                # On the 85F its DCCA is locked on TDCC1: nextpnr puts a free DCCA on the first
                # DCC it finds, and from TDCC0 some placements could not route the reset's
                # flip-flop to it ("Failed to route arc 0.0 of net 'rst_registered'", four
                # runs so far; the 4x4 seed 4 that failed so routed with the lock:
                # docs/fpga-timing.md, table: reset DCCA locked). The other devices' DCCs are
                # elsewhere: left free.
                global_reset = Signal(name="rst_global")
                locked = ({"a_BEL": RESET_DCC_85F}
                          if getattr(platform, "device", None) == "LFE5U-85F" else {})
                m.submodules.reset_buffer = Instance("DCCA", i_CLKI=reset, i_CE=Const(1),
                                                     o_CLKO=global_reset, **locked)
                reset = global_reset
            m.d.comb += [ClockSignal("sync").eq(self.clk), ResetSignal("sync").eq(reset)]

        m.submodules.design = self.design

        # The chains need no reset: whatever they hold is scanned in or captured.
        input_chain = Signal(self.input_bits, name="scan_input_chain", reset_less=True)
        m.d.sync += input_chain.eq(Cat(self.scan_in, input_chain[:-1]))
        input_update = Signal(self.input_bits, name="scan_input_update", reset_less=True)
        m.d.sync += input_update.eq(input_chain)
        m.d.comb += Cat(*self.inputs).eq(input_update)

        output_hold = Signal(self.output_bits, name="scan_output_hold", reset_less=True)
        m.d.sync += output_hold.eq(Cat(*self.outputs))
        output_chain = Signal(self.output_bits, name="scan_output_chain", reset_less=True)
        with m.If(self.scan_capture):
            m.d.sync += output_chain.eq(output_hold)
        with m.Else():
            m.d.sync += output_chain.eq(output_chain[1:])
        m.d.comb += self.scan_out.eq(output_chain[0])
        return m
