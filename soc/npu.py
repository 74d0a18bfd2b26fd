"""The NPU's generated Verilog as a module of a LiteX SoC.

The NPU is built by Amaranth (:func:`hw.top.generate_verilog`) and enters the Migen world as
an ``Instance`` of its top module ``npu_top``: its AXI4 master becomes a LiteX
:class:`~litex.soc.interconnect.axi.AXIInterface` (for LiteDRAM's AXI front end), its
AXI4-Lite slave a :class:`~litex.soc.interconnect.axi.AXILiteInterface` (for the SoC's bus,
which converts it to Wishbone), and ``irq`` a signal.
"""

from pathlib import Path

from migen import ClockSignal, Instance, ResetSignal, Signal

from litex.gen import LiteXModule
from litex.soc.interconnect.axi import AXIInterface, AXILiteInterface

from hw.config import NPUConfig
from hw.top import generate_verilog


__all__ = ["NPUCore", "TOP_NAME", "REGISTER_SPAN"]


#: The Verilog module name of the NPU inside the SoC.
TOP_NAME = "npu_top"
#: Bytes of the SoC's address space the NPU's registers take (its AXI4-Lite port has 8
#: address bits: :class:`hw.isa.Reg`).
REGISTER_SPAN = 0x100


class NPUCore(LiteXModule):
    """The NPU as a LiteX module.

    Parameters
    ----------
    platform : litex.build.generic_platform.GenericPlatform
        The SoC's platform: the NPU's Verilog is added to its sources.
    config : hw.config.NPUConfig
        The NPU to build.
    build_dir : path-like
        Where the Verilog is written (``npu_<config>.v``).
    clock_domain : str
        The Migen clock domain the NPU runs in (its ``clk`` and ``rst``).

    Attributes
    ----------
    axi : AXIInterface
        The NPU's AXI4 master (``config.bus_width`` data bits, 32 address bits, one ID bit),
        in ``clock_domain``.
    axil : AXILiteInterface
        The NPU's register slave (32 data bits; the SoC's 32-bit byte address, of which the
        NPU sees the low 8 bits), in ``clock_domain``.
    irq : Signal
        The NPU's interrupt.
    """
    def __init__(self, platform, config, build_dir, *, clock_domain="sys"):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        self.config = config
        self.axi = AXIInterface(data_width=config.bus_width, address_width=config.addr_width,
                                id_width=1)
        self.axil = AXILiteInterface(data_width=32, address_width=32)
        self.irq = Signal()

        build_dir = Path(build_dir)
        build_dir.mkdir(parents=True, exist_ok=True)
        verilog = build_dir / f"npu_{config.name}.v"
        text = generate_verilog(config, name=TOP_NAME)
        if not verilog.exists() or verilog.read_text() != text:
            verilog.write_text(text)
        platform.add_source(str(verilog))

        axi, axil = self.axi, self.axil
        ports = dict(
            i_clk=ClockSignal(clock_domain),
            i_rst=ResetSignal(clock_domain),
            o_irq=self.irq,
        )
        # AXI4 master: the NPU drives the address and write data channels and takes the
        # responses.
        for channel in ("aw", "ar"):
            endpoint = getattr(axi, channel)
            ports.update({
                f"o_m_axi_{channel}id":    endpoint.id,
                f"o_m_axi_{channel}addr":  endpoint.addr,
                f"o_m_axi_{channel}len":   endpoint.len,
                f"o_m_axi_{channel}size":  endpoint.size,
                f"o_m_axi_{channel}burst": endpoint.burst,
                f"o_m_axi_{channel}lock":  endpoint.lock,
                f"o_m_axi_{channel}cache": endpoint.cache,
                f"o_m_axi_{channel}prot":  endpoint.prot,
                f"o_m_axi_{channel}valid": endpoint.valid,
                f"i_m_axi_{channel}ready": endpoint.ready,
            })
        ports.update({
            "o_m_axi_wdata":  axi.w.data,
            "o_m_axi_wstrb":  axi.w.strb,
            "o_m_axi_wlast":  axi.w.last,
            "o_m_axi_wvalid": axi.w.valid,
            "i_m_axi_wready": axi.w.ready,
            "i_m_axi_bid":    axi.b.id,
            "i_m_axi_bresp":  axi.b.resp,
            "i_m_axi_bvalid": axi.b.valid,
            "o_m_axi_bready": axi.b.ready,
            "i_m_axi_rid":    axi.r.id,
            "i_m_axi_rdata":  axi.r.data,
            "i_m_axi_rresp":  axi.r.resp,
            "i_m_axi_rlast":  axi.r.last,
            "i_m_axi_rvalid": axi.r.valid,
            "o_m_axi_rready": axi.r.ready,
        })
        # AXI4-Lite slave: the SoC's bus drives addresses and write data.
        offset = slice(0, 8)
        ports.update({
            "i_s_axil_awaddr":  axil.aw.addr[offset],
            "i_s_axil_awprot":  0,
            "i_s_axil_awvalid": axil.aw.valid,
            "o_s_axil_awready": axil.aw.ready,
            "i_s_axil_wdata":   axil.w.data,
            "i_s_axil_wstrb":   axil.w.strb,
            "i_s_axil_wvalid":  axil.w.valid,
            "o_s_axil_wready":  axil.w.ready,
            "o_s_axil_bresp":   axil.b.resp,
            "o_s_axil_bvalid":  axil.b.valid,
            "i_s_axil_bready":  axil.b.ready,
            "i_s_axil_araddr":  axil.ar.addr[offset],
            "i_s_axil_arprot":  0,
            "i_s_axil_arvalid": axil.ar.valid,
            "o_s_axil_arready": axil.ar.ready,
            "o_s_axil_rdata":   axil.r.data,
            "o_s_axil_rresp":   axil.r.resp,
            "o_s_axil_rvalid":  axil.r.valid,
            "i_s_axil_rready":  axil.r.ready,
        })
        self.specials += Instance(TOP_NAME, name="npu", **ports)
