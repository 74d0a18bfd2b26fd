"""The SoC around the NPU, the same on the board and in simulation.

LiteX builds it (``SoCMini``: no CPU; the host drives everything through the UART bridge):

```
 host (USB serial / TCP) -> UARTBone -> Wishbone main bus -+-> NPU registers (AXI4-Lite, NPU_BASE)
                                                           +-> LiteDRAM (main_ram, DRAM_BASE)
                                                           +-> LiteX CSRs (identifier, LiteDRAM)
 NPU AXI4 master -> LiteDRAMAXI2Native -> LiteDRAM crossbar port (bus width of the NPU) -> SDRAM
```

The NPU sees the SoC's address map: its AXI4 master reaches the SDRAM at :data:`DRAM_BASE`,
where the host writes programs and operands (the backend relocates the compiler's programs
there: :func:`sw.board.relocate`). The main bus reaches LiteDRAM without LiteX's L2 cache
(``l2_cache_size=0``): the NPU's port bypasses the main bus, so a cache there would hold the
host's writes back from the NPU.

Why LiteX: it is the well-kept SoC builder of the open ECP5 world, with an SDRAM controller
(LiteDRAM, with the ULX3S's SDRAM and a simulation model of it), the UART bridge and its host
client (``CommUART``, ``litex_server``/``RemoteClient``), and a simulation builder that
Verilates the whole SoC with the same gateware as the board.
"""

from migen import ClockDomainsRenamer

from litex.soc.cores import uart
from litex.soc.integration.soc import SoCRegion
from litex.soc.integration.soc_core import SoCMini

from .memory_map import DRAM_BASE, DRAM_SIZE, NPU_BASE
from .npu import NPUCore, REGISTER_SPAN


__all__ = ["NPUSoC", "NPU_BASE", "DRAM_BASE", "IDENT", "host_description",
           "write_host_description"]


#: The SoC's identifier string (LiteX's ``identifier_mem`` CSR), followed by the NPU's config.
IDENT = "npu-soc"


class NPUSoC(SoCMini):
    """A LiteX SoC with the NPU, LiteDRAM and a UART bridge.

    The platform's clock and reset generator (``self.crg``) must be made by the caller before
    this constructor runs, as LiteX's targets do.

    Parameters
    ----------
    platform : litex.build.generic_platform.GenericPlatform
    config : hw.config.NPUConfig
        The NPU.
    sys_clk_freq : float
        The system clock in Hz (LiteDRAM's timings are computed for it).
    build_dir : path-like
        Where the NPU's Verilog is written.
    uart_phy : LiteXModule
        The UART PHY of the host link (``RS232PHY`` on a board, ``RS232PHYModel`` in
        simulation).
    sdram_phy, sdram_module :
        LiteDRAM's PHY and SDRAM module.
    uart_clk_freq : float, optional
        The clock the UART bridge's 100 ms timeout is counted in (default ``sys_clk_freq``).
    npu_clock_domain : str
        The clock domain of the NPU ("sys", or another domain the CRG makes: LiteDRAM's port
        then crosses to it, and the registers cross through an AXI4-Lite clock-domain
        crossing).
    """
    def __init__(self, platform, config, *, sys_clk_freq, build_dir, uart_phy, sdram_phy,
                 sdram_module, uart_clk_freq=None, npu_clock_domain="sys"):
        SoCMini.__init__(self, platform, sys_clk_freq,
                         ident=f"{IDENT} {config.name}", ident_version=False)
        self.npu_config = config   # LiteX's SoC has a `config` of its own

        # Host link: LiteX's UART bridge, a Wishbone master on the main bus.
        self.uartbone_phy = uart_phy
        self.uartbone = uart.UARTBone(phy=uart_phy, clk_freq=uart_clk_freq or sys_clk_freq,
                                      address_width=self.bus.address_width)
        self.bus.add_master(name="uartbone", master=self.uartbone.wishbone)

        # SDRAM through LiteDRAM, with no cache between the host and the NPU.
        self.sdrphy = sdram_phy
        self.add_sdram("sdram", phy=sdram_phy, module=sdram_module, origin=DRAM_BASE,
                       l2_cache_size=0)
        self.dram_size = self.bus.regions["main_ram"].size
        if self.dram_size != DRAM_SIZE:
            raise ValueError(f"the SDRAM holds {self.dram_size} bytes, but the host's address "
                             f"map (soc.memory_map.DRAM_SIZE) says {DRAM_SIZE}")

        # The NPU: its master on a LiteDRAM port of its own bus width, its registers on the
        # main bus.
        from litedram.frontend.axi import LiteDRAMAXI2Native
        self.npu = npu = NPUCore(platform, config, build_dir, clock_domain=npu_clock_domain)
        port = self.sdram.crossbar.get_port(data_width=config.bus_width,
                                            clock_domain=npu_clock_domain)
        axi2native = LiteDRAMAXI2Native(axi=npu.axi, port=port, base_address=DRAM_BASE)
        if npu_clock_domain != "sys":
            axi2native = ClockDomainsRenamer(npu_clock_domain)(axi2native)
        self.npu_axi2native = axi2native
        registers = npu.axil
        if npu_clock_domain != "sys":
            from litex.soc.interconnect.axi import AXILiteClockDomainCrossing, AXILiteInterface
            registers = AXILiteInterface(data_width=32, address_width=32)
            self.npu_register_cdc = AXILiteClockDomainCrossing(
                registers, npu.axil, cd_from="sys", cd_to=npu_clock_domain)
        self.bus.add_slave(name="npu", slave=registers,
                           region=SoCRegion(origin=NPU_BASE, size=max(REGISTER_SPAN, 0x1000),
                                            cached=False))


#: LiteDRAM's DFI flags by the names its init sequences use (``litedram.init.cmds``;
#: ``litex/soc/software/liblitedram/sdram.h``).
_DFII_FLAGS = {"DFII_CONTROL_SEL": 0x01, "DFII_CONTROL_CKE": 0x02, "DFII_CONTROL_ODT": 0x04,
               "DFII_CONTROL_RESET_N": 0x08, "DFII_COMMAND_CS": 0x01, "DFII_COMMAND_WE": 0x02,
               "DFII_COMMAND_CAS": 0x04, "DFII_COMMAND_RAS": 0x08}
#: The DFI registers the host needs to initialise the SDRAM (LiteX CSR names).
_DFII_REGISTERS = ("sdram_dfii_control", "sdram_dfii_pi0_command",
                   "sdram_dfii_pi0_command_issue", "sdram_dfii_pi0_address",
                   "sdram_dfii_pi0_baddress")


def host_description(soc, csr_csv):
    """What the host needs to know of a built SoC (a JSON-able dict): the NPU's config and the
    address map, and how to initialise its SDRAM without a CPU: the DFI registers' addresses
    (from LiteX's ``csr.csv`` of the build) and LiteDRAM's own init sequence for the chip,
    which LiteX's BIOS would otherwise run (``sdram_init``)."""
    from litedram.init import get_sdram_phy_init_sequence

    addresses = {}
    for line in open(csr_csv):
        kind, name, address, *_ = line.strip().split(",") + [""] * 3
        if kind == "csr_register" and name in _DFII_REGISTERS:
            addresses[name.removeprefix("sdram_dfii_")] = int(address, 0)
    missing = [name for name in _DFII_REGISTERS if name.removeprefix("sdram_dfii_")
               not in addresses]
    if missing:
        raise ValueError(f"{csr_csv} has no {', '.join(missing)}")
    settings = soc.sdram.controller.settings
    sequence, _ = get_sdram_phy_init_sequence(settings.phy, settings.timing)
    steps = []
    for comment, address, bank, flags, delay in sequence:
        value = 0
        for flag in flags.split("|"):
            value |= _DFII_FLAGS[flag]
        kind = "control" if flags.startswith("DFII_CONTROL") else "command"
        steps.append({"comment": comment, "address": address, "bank": bank, kind: value,
                      "delay_us": delay})
    return {
        "config": soc.npu_config.to_json(), "npu_base": NPU_BASE, "dram_base": DRAM_BASE,
        "dram_size": soc.dram_size, "sys_clk_freq": soc.sys_clk_freq,
        "dfii": addresses,
        "dfii_software": _DFII_FLAGS["DFII_CONTROL_CKE"] | _DFII_FLAGS["DFII_CONTROL_ODT"] |
        _DFII_FLAGS["DFII_CONTROL_RESET_N"],
        "dfii_hardware": _DFII_FLAGS["DFII_CONTROL_SEL"],
        "sdram_init": steps,
    }


def write_host_description(soc, folder):
    """Write :func:`host_description` of a built SoC to ``folder/soc.json`` (beside LiteX's
    ``csr.csv``, which the build wrote there); returns the path."""
    import json
    from pathlib import Path
    folder = Path(folder)
    path = folder / "soc.json"
    path.write_text(json.dumps(host_description(soc, folder / "csr.csv"), indent=1) + "\n")
    return path
