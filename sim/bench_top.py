"""The top level of every RTL simulation: the NPU, its DRAM, and the AXI4 protocol checker.

Its ports are ``clk``, ``rst``, ``irq``, ``s_axil_*``, the checker's report
(``axi_check_error``, ``axi_check_rule``, ``axi_check_addr``, ``axi_check_cycle``; see
:class:`sim.axi_checker.AXI4Checker`), which the cocotb bench watches, and, by the DRAM the
build is for (:data:`DRAM_MODELS`):

* ``hdl``: the DRAM's controls ``dram_*`` (:class:`sim.dram.DramControlSignature`); the
  NPU's AXI4 master goes to the DRAM in the simulated hardware (:class:`sim.dram.HDLDram`);
* ``cocotbext``: the NPU's AXI4 master on ``m_axi_*``, where the bench's second, independent
  DRAM model (cocotbext-axi) answers.

The checker watches the master either way.

Why the reset goes through a flip-flop: Amaranth writes every register's reset into the
combinational logic that computes its next value, and Verilator evaluates all logic that
depends on a top-level input each time an input changes, so with ``rst`` a top-level input
the whole design was evaluated twice a cycle, on both clock edges (measured: three quarters of
the run time). Registered inside, the reset reaches the design one cycle later, and its logic
runs once, on the rising edge. For the same reason the ``hdl`` build has no ``m_axi_*``
inputs at all.
"""

import os

from amaranth.hdl import ClockDomain, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.config import NPUConfig
from hw.top import NPU, convert, enforce_assertions, top_ports
from .axi_checker import AXI4Checker, Rule
from .dram import DramControlSignature, HDLDram


__all__ = ["CLOCK_NS", "DRAM_MODELS", "dram_from_env", "backpressure_from_env", "NPUBench",
           "generate_bench_verilog"]


#: The clock period of every simulation, in ns.
CLOCK_NS = 10

#: The DRAM models a bench is built for; the first is the default.
DRAM_MODELS = ("hdl", "cocotbext")


def dram_from_env():
    """The DRAM model named by ``NPU_DRAM`` (:data:`DRAM_MODELS`; unset or empty: ``hdl``)."""
    value = os.environ.get("NPU_DRAM", "").strip() or DRAM_MODELS[0]
    if value not in DRAM_MODELS:
        raise ValueError(f"NPU_DRAM must be one of {', '.join(DRAM_MODELS)}, not {value!r}")
    return value


def backpressure_from_env():
    """The seed in ``NPU_BACKPRESSURE`` (:class:`sim.bench.Backpressure`), or ``None`` when it
    is unset or empty. Here, beside :func:`dram_from_env`, so that the ``npu`` command can
    check both before it runs anything, without importing cocotb."""
    value = os.environ.get("NPU_BACKPRESSURE", "").strip()
    if not value:
        return None
    try:
        return int(value, 0)
    except ValueError:
        raise ValueError(f"NPU_BACKPRESSURE must be an integer seed, not {value!r}") from None


class NPUBench(wiring.Component):
    """:class:`hw.top.NPU` with its DRAM and an :class:`AXI4Checker` watching its AXI4 master
    and ``irq``.

    Parameters
    ----------
    config : NPUConfig
    dram : str
        ``"hdl"``: the DRAM in the simulated hardware; ``"cocotbext"``: the master on the
        ``m_axi_*`` ports for the bench's model.
    dram_bytes : int, optional
        Size of the ``hdl`` DRAM (:data:`sim.dram.DRAM_BYTES`).

    Attributes
    ----------
    clk, rst : In(1)
        The clock, and a synchronous reset that takes effect one cycle later.
    s_axil, irq
        The NPU's ports, passed through.
    m_axi : Out(AXI4Signature)
        The NPU's master (``cocotbext`` only).
    dram : In(DramControlSignature)
        The DRAM's controls (``hdl`` only).
    axi_check_disable : In(32)
        Rules the checker does not report (:attr:`AXI4Checker.disable`; mutants only).
    axi_check_error : Out(1)
    axi_check_rule : Out(Rule)
    axi_check_addr, axi_check_cycle : Out(32)
        The checker's report.
    bench_sleep : In(1)
        Set by the bench while its Python sleeps until ``bench_wake``: Verilator's main loop
        (``sim/verilator/main.cpp``) then runs the clock without calling into cocotb at all
        until ``bench_wake`` rises or a cocotb timer falls due. No gateware reads it.
    bench_wake : Out(1)
        ``irq`` or ``axi_check_error``: what a sleeping bench waits for.
    """
    def __init__(self, config, *, dram=DRAM_MODELS[0], dram_bytes=None):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        if dram not in DRAM_MODELS:
            raise ValueError(f"dram must be one of {', '.join(DRAM_MODELS)}, not {dram!r}")
        self.config = config
        self.dram_kind = dram
        self.npu = NPU(config)
        members = {
            "clk":             In(1),
            "rst":             In(1),
            "s_axil":          self.npu.signature.members["s_axil"],
            "irq":             Out(1),
            "axi_check_disable": In(32),
            "axi_check_error": Out(1),
            "axi_check_rule":  Out(Rule),
            "axi_check_addr":  Out(32),
            "axi_check_cycle": Out(32),
            "bench_sleep":     In(1),
            "bench_wake":      Out(1),
        }
        if dram == "hdl":
            self.dram_model = HDLDram(data_width=config.bus_width,
                                      addr_width=config.addr_width,
                                      **({} if dram_bytes is None else {"size": dram_bytes}))
            members["dram"] = In(DramControlSignature())
        else:
            members["m_axi"] = self.npu.signature.members["m_axi"]
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        # The reset through a flip-flop (see the module's docstring).
        m.domains.sync = sync = ClockDomain("sync", local=True)
        m.domains.raw = raw = ClockDomain("raw", local=True, reset_less=True)
        reset = Signal(init=1)
        m.d.comb += [sync.clk.eq(self.clk), raw.clk.eq(self.clk), sync.rst.eq(reset)]
        m.d.raw += reset.eq(self.rst)

        npu = m.submodules.npu = self.npu
        checker = m.submodules.axi_check = AXI4Checker(data_width=self.config.bus_width)
        wiring.connect(m, wiring.flipped(self.s_axil), npu.s_axil)
        if self.dram_kind == "hdl":
            dram = m.submodules.dram = self.dram_model
            wiring.connect(m, npu.m_axi, dram.bus)
            wiring.connect(m, wiring.flipped(self.dram), dram.control)
        else:
            wiring.connect(m, wiring.flipped(self.m_axi), npu.m_axi)
        for name in npu.m_axi.signature.members:
            m.d.comb += getattr(checker.bus, name).eq(getattr(npu.m_axi, name))
        m.d.comb += [
            self.irq.eq(npu.irq),
            checker.irq.eq(npu.irq),
            checker.bus_timeout.eq(npu.watchdog.expired),
            checker.disable.eq(self.axi_check_disable),
            self.axi_check_error.eq(checker.error),
            self.axi_check_rule.eq(checker.rule),
            self.axi_check_addr.eq(checker.addr),
            self.axi_check_cycle.eq(checker.cycle),
            self.bench_wake.eq(npu.irq | checker.error),
        ]
        return m


def generate_bench_verilog(config, *, name, dram=DRAM_MODELS[0], dram_bytes=None,
                           emit_src=False):
    """Verilog text of :class:`NPUBench` for ``config`` and ``dram``, top module ``name``
    (for ``hdl``, the DRAM's own Verilog, :data:`sim.dram.VERILOG_SOURCE`, is compiled beside
    it), and its ports: name -> ``"input"`` or ``"output"``. With ``emit_src``, every signal,
    process and operator carries the Amaranth line it comes from (``(* src = ... *)``; the
    coverage build, which ``sim/coverage.py`` maps back to ``hw/`` with them)."""
    bench = NPUBench(config, dram=dram, dram_bytes=dram_bytes)
    text = convert(bench, name=name, emit_src=emit_src)
    return enforce_assertions(text), {port: direction
                                      for port, (_, direction) in top_ports(bench).items()}

