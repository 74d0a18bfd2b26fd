"""The top level of every RTL simulation: the NPU and the AXI4 protocol checker on its master.

Its ports are the NPU's (``clk``, ``rst``, ``irq``, ``m_axi_*``, ``s_axil_*``) plus the
checker's report, ``axi_check_error``, ``axi_check_rule``, ``axi_check_addr`` and
``axi_check_cycle`` (see :class:`sim.axi_checker.AXI4Checker`), which the cocotb bench watches.
"""

from amaranth.back import verilog
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from hw.config import NPUConfig
from hw.top import NPU, top_ports
from .axi_checker import AXI4Checker, Rule


__all__ = ["NPUBench", "generate_bench_verilog"]


class NPUBench(wiring.Component):
    """:class:`hw.top.NPU` with an :class:`AXI4Checker` watching ``m_axi`` and ``irq``.

    Parameters
    ----------
    config : NPUConfig

    Attributes
    ----------
    m_axi, s_axil, irq
        The NPU's ports, passed through.
    axi_check_error : Out(1)
    axi_check_rule : Out(Rule)
    axi_check_addr, axi_check_cycle : Out(32)
        The checker's report.
    """
    def __init__(self, config):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        self.config = config
        self.npu = NPU(config)
        members = dict(self.npu.signature.members)
        members.update({
            "axi_check_error": Out(1),
            "axi_check_rule":  Out(Rule),
            "axi_check_addr":  Out(32),
            "axi_check_cycle": Out(32),
        })
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        npu = m.submodules.npu = self.npu
        checker = m.submodules.axi_check = AXI4Checker(data_width=self.config.bus_width)
        wiring.connect(m, wiring.flipped(self.m_axi), npu.m_axi)
        wiring.connect(m, wiring.flipped(self.s_axil), npu.s_axil)
        for name in npu.m_axi.signature.members:
            m.d.comb += getattr(checker.bus, name).eq(getattr(npu.m_axi, name))
        m.d.comb += [
            self.irq.eq(npu.irq),
            checker.irq.eq(npu.irq),
            self.axi_check_error.eq(checker.error),
            self.axi_check_rule.eq(checker.rule),
            self.axi_check_addr.eq(checker.addr),
            self.axi_check_cycle.eq(checker.cycle),
        ]
        return m


def generate_bench_verilog(config, *, name):
    """Verilog text of :class:`NPUBench` for ``config``, top module ``name``."""
    bench = NPUBench(config)
    return verilog.convert(bench, name=name, ports=top_ports(bench), emit_src=False)
