"""The NPU top level: host registers, controller, DMA, memories and the systolic array."""

import re

from amaranth.back import verilog
from amaranth.hdl import Module, ResetInserter, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .accumulator import AccumulatorMemory
from .axi import AXI4LiteSignature, AXI4Signature
from .config import NPUConfig
from .controller import Controller
from .dma import DMA
from .host import HostInterface
from .isa import INSTR_BYTES
from .scratchpad import Scratchpad
from .systolic import SystolicArray
from .watchdog import BusWatchdog


__all__ = ["ASSERTION_FAILED", "NPU", "convert", "enforce_assertions", "generate_verilog",
           "reader_row_bytes", "top_ports"]


def reader_row_bytes(config):
    """Width of the DMA reader's rows: the widest row a load moves, or an instruction."""
    return max(config.dma_row_bytes, INSTR_BYTES)


class NPU(wiring.Component):
    """The whole NPU.

    Parameters
    ----------
    config : NPUConfig

    Attributes
    ----------
    m_axi : Out(AXI4Signature)
        AXI4 master to DRAM: instruction fetch and the DMA.
    s_axil : In(AXI4LiteSignature)
        AXI4-Lite slave with the host registers (:class:`hw.isa.Reg`).
    irq : Out(1)
        High while an end of a program (done or error) is pending and enabled
        (``Reg.IRQ_PENDING & Reg.IRQ_ENABLE``): after reset, from the end of a program
        until the next start, soft reset or acknowledge.

    The bus watchdog (:attr:`watchdog`, :class:`hw.watchdog.BusWatchdog`) is made here, so
    that a simulation's protocol checker can see when it expired.
    """
    def __init__(self, config=None):
        if config is None:
            config = NPUConfig()
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        self.config = config
        self.watchdog = BusWatchdog(addr_width=config.addr_width, data_width=config.bus_width)
        super().__init__({
            "m_axi":  Out(AXI4Signature(addr_width=config.addr_width,
                                        data_width=config.bus_width)),
            "s_axil": In(AXI4LiteSignature(addr_width=8)),
            "irq":    Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        config = self.config
        read_row_bytes = reader_row_bytes(config)

        m.submodules.host = host = HostInterface(config)
        wiring.connect(m, wiring.flipped(self.s_axil), host.bus)

        # A soft reset stops the units from starting bus transactions (the controller's
        # soft_reset_pending) and waits until the DMA has nothing outstanding, so that no
        # transaction is cut in half; then, a cycle later, it resets every block but the
        # host registers (for two cycles: the pending flag is among what it resets). After
        # the bus watchdog expired it does not wait: the slave will not answer, and the
        # transactions outstanding are abandoned (the slave, or the interconnect, must have
        # forgotten them too before the next program: docs/architecture.md).
        controller = Controller(config, read_row_bytes=read_row_bytes)
        dma = DMA(data_width=config.bus_width, read_row_bytes=read_row_bytes,
                  write_row_bytes=config.acc_row_bytes, addr_width=config.addr_width)
        scratchpad = Scratchpad(depth=config.spad_depth, row_bytes=config.spad_row_bytes)
        accumulator = AccumulatorMemory(depth=config.acc_depth, cols=config.cols)
        array = SystolicArray(config.rows, config.cols)

        # The core reset is registered (as a sum of the DMA's state it made every flip-flop
        # it reaches a long path), one copy per block, so that each copy reaches only its
        # block's flip-flops: nextpnr routes it in the fabric like any net (it puts only
        # clocks on global nets). The controller, the DMA and the array make their own
        # copies, one per block of the controller, one each for the DMA's reader and writer
        # and one per PE row (Controller.soft_reset, DMA.soft_reset,
        # SystolicArray.soft_reset). The copies are equal by design; fpga/flow.py keeps them
        # apart in synthesis by their name (KEEP_APART).
        watchdog = self.watchdog
        soft_reset = controller.soft_reset_pending & (dma.idle | watchdog.expired)

        def core(name, block):
            reset = Signal(name=f"core_reset_{name}")
            m.d.sync += reset.eq(soft_reset)
            m.submodules[name] = ResetInserter(reset)(block)

        m.submodules.controller = controller
        m.d.comb += controller.soft_reset.eq(soft_reset)
        m.submodules.dma = dma
        m.d.comb += dma.soft_reset.eq(soft_reset)
        m.submodules.scratchpad = scratchpad
        core("accumulator", accumulator)
        m.submodules.array = array
        m.d.comb += array.soft_reset.eq(soft_reset)
        core("watchdog", watchdog)
        for name in self.m_axi.signature.members:
            m.d.comb += getattr(watchdog.bus, name).eq(getattr(self.m_axi, name))
        m.d.comb += [watchdog.idle.eq(dma.idle), watchdog.limit.eq(host.watchdog_limit),
                     controller.bus_timeout.eq(watchdog.expired),
                     host.core_reset.eq(soft_reset)]

        read_bytes, write_bytes = self._traffic_counters(m, host, controller)

        wiring.connect(m, host.ctrl, controller.host)
        wiring.connect(m, wiring.flipped(self.m_axi), dma.bus)
        wiring.connect(m, controller.reader.cmd, dma.read_cmd)
        wiring.connect(m, dma.read_row, controller.reader.row)
        wiring.connect(m, controller.writer.cmd, dma.write_cmd)
        wiring.connect(m, controller.writer.row, dma.write_row)
        wiring.connect(m, controller.spad, scratchpad)
        wiring.connect(m, controller.acc, accumulator)
        wiring.connect(m, controller.act, array.act)
        wiring.connect(m, controller.weight, array.weight)
        wiring.connect(m, array.result, controller.result)
        m.d.comb += [
            controller.reader.done.eq(dma.read_done),
            controller.reader.error.eq(dma.read_error),
            controller.writer.done.eq(dma.write_done),
            controller.writer.error.eq(dma.write_error),
            host.read_bytes.eq(read_bytes),
            host.write_bytes.eq(write_bytes),
            self.irq.eq(host.irq),
        ]
        return m


    def _traffic_counters(self, m, host, controller):
        """The bus traffic counters: data beats on the AXI4 master, in bytes, from start to
        done or error (``Reg.PERF_READ_BYTES``, ``Reg.PERF_WRITE_BYTES``)."""
        read_bytes = Signal(32)
        write_bytes = Signal(32)
        bus_bytes = self.config.bus_bytes
        with m.If(host.ctrl.start & ~controller.host.busy):
            m.d.sync += [read_bytes.eq(0), write_bytes.eq(0)]
        with m.Elif(controller.host.busy):
            with m.If(self.m_axi.rvalid & self.m_axi.rready):
                m.d.sync += read_bytes.eq(read_bytes + bus_bytes)
            with m.If(self.m_axi.wvalid & self.m_axi.wready):
                m.d.sync += write_bytes.eq(write_bytes + bus_bytes)
        return read_bytes, write_bytes


def top_ports(component):
    """Top-level ports of ``component`` named the AXI way (``m_axi_awaddr``, ``s_axil_rdata``,
    ``irq``): name -> ``(value, "input" or "output")``, by the member's flow."""
    ports = {}
    for path, member, value in component.signature.flatten(component):
        name = "_".join(str(part) for part in path)
        ports[name] = (Value.cast(value), "output" if member.flow == Out else "input")
    return ports


def convert(component, *, name, emit_src=False, **kwargs):
    """``amaranth.back.verilog.convert`` of ``component`` with its ports named by
    :func:`top_ports`. Amaranth's public ``ports=`` form leaves each direction to inference
    (an input is what nothing inside drives); an output member that nothing drives would
    become an input, so the directions written are checked against the members' flows."""
    ports = top_ports(component)
    text = verilog.convert(component, name=name, emit_src=emit_src, **kwargs,
                           ports={port: (value, None) for port, (value, _) in ports.items()})
    module = text[text.index(f"module {name}("):]
    module = module[:module.index("endmodule")]
    declared = {port: direction for direction, port in re.findall(
        r"^\s*(input|output)\s+(?:signed\s+)?(?:\[[^\]]*\]\s*)?\\?([\w$.]+)\s*;",
        module, re.M)}
    for port, (_, direction) in ports.items():
        if port in declared and declared[port] != direction:
            raise ValueError(f"port {port} of {name} would be an {declared[port]}, but its "
                             f"member is an {direction}: nothing drives it")
    return text


# Yosys writes an Amaranth ``Assert`` as ``if (!c) $write(message); assert (c);`` in a clocked
# block, inside ``if (1'h1) begin ... end`` when the assertion is not under an ``If``: an
# immediate assertion of SystemVerilog, which Verilog-2005 tools (Icarus in that mode) do not
# know and Verilator checks only with --assert. The message's ``$write``, if any, and the
# always-true ``if`` around them go with it.
_ASSERTION = re.compile(r"^(?P<open>(?P<outer>\s*)if \(1'h1\) begin\n)?"
                        r"(?P<message>\s*if \(!.*\)\n\s*\$write\(.*\);\n)?"
                        r"(?P<indent>\s*)assert \((?P<condition>.*)\);"
                        r"(?(open)\n(?P=outer)end)$", re.MULTILINE)

#: What a failing assertion prints (then the simulation stops).
ASSERTION_FAILED = " -- assertion failed at"


def _assertion_check(match):
    indent, outer = match["indent"], match["outer"] or match["indent"]
    check = (f"{indent}`ifndef SYNTHESIS\n{match['message'] or ''}"
             f"{indent}if (!({match['condition']})) begin $display(\"{ASSERTION_FAILED} %0t\", "
             f"$time); $finish; end\n"
             f"{indent}`endif")
    if match["open"]:
        check = f"{match['open']}{check}\n{outer}end"
    # Only a broken design takes these branches: they are no coverage points (the mutant
    # tests show each kind fires).
    return f"{outer}/* verilator coverage_off */\n{check}\n{outer}/* verilator coverage_on */"


def enforce_assertions(text):
    """Verilog ``text`` with every immediate assertion made a Verilog-2005 check that every
    simulator runs: when it fails, the simulation prints its message, the time and stops
    (``$finish``). Synthesis (which defines ``SYNTHESIS``) leaves all of it out, message
    included: a ``$write`` left to Yosys is a ``$print`` cell, which keeps the assertion's
    logic in the netlist. Verilator's line coverage leaves the check and the always-true
    ``if`` around it out (``coverage_off``): they are false by construction."""
    return _ASSERTION.sub(_assertion_check, text)


def generate_verilog(config, *, name="npu_top"):
    """Verilog text of the NPU for ``config``: ports ``clk``, ``rst``, ``irq``, ``m_axi_*``,
    ``s_axil_*``."""
    return enforce_assertions(convert(NPU(config), name=name))
