"""``npu bench`` (``make bench``): the utilization sweep from the hardware's counters, and
simulator speed.

Runs GEMMs under Verilator, reads the cycle and performance counters, and writes
``docs/performance.md`` (shape, config, RTL cycles, the cycle model's prediction
(:mod:`sw.timing`), utilization, the mapping ceiling, SCALE-Sim's weight-stationary figure)
and ``docs/utilization.png`` (utilization against M). The sweep runs on the HDL DRAM
(``NPU_DRAM=hdl``, ``sim/hdl/npu_axi_dram.v``).

It then measures simulated cycles per wall-clock second of GEMMs on 8x8 under Verilator and
Icarus, each on both DRAM models (the HDL DRAM and cocotbext-axi's Python models,
``NPU_DRAM=cocotbext``), and in Amaranth's simulator; and the whole command
``npu gemm --m 512 --k 512 --n 512 --config 8x8 --sim verilator`` as a user runs it. The
report compares the figures with the targets of issue 15.

    npu bench [--quick] [--out docs/performance.md] [--no-speed]
    python -m sw.bench [--quick] [--out docs/performance.md] [--no-speed]

Every GEMM is checked bit-exactly against numpy; a mismatch stops the benchmark
(:class:`BenchMismatch`). So does a cycle model that disagrees with a counter of the RTL, and
a timed ``npu gemm`` that fails.

The speed of the instruction-level model (:mod:`sw.model`) on public networks is measured
apart, because one instruction at a time the model takes most of a minute per network at
224x224:

    python -m sw.bench model [--networks inception_v2,resnet50] [--sizes 0,224]
                             [--out docs/performance.md]

runs each network of the model zoo (:mod:`sw.onnx.zoo`; size 0: its default resolution)
through :func:`sw.onnx.runtime.run_model` on ``--sim model``, keeps the NPU programs it ran,
and runs each of them on the model one instruction at a time (``ModelNPU(config,
batched=False)``, the model as it was) and by windows (the default), one after the other in
this process; both must leave the same DRAM. It writes the section "Instruction-level model
speed" of the report (:data:`MODEL_SECTION`), which :func:`write_report` keeps.
"""

import contextlib
import datetime
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hw.config import NPUConfig
from .compiler import compile_gemm, scalesim_cycles
from .driver import gemm_batch, prepare_gemm, run_jobs
from .reference import reference_gemm
from .errors import BackendUnavailable, NPUError
from .timing import predict_gemm


__all__ = ["BenchMismatch", "SWEEP", "QUICK_SWEEP", "SPEED_RUNS", "SPEED_COMMAND", "TARGETS",
           "Speeds", "run_sweep", "plot", "simulator_speed", "rtl_speed", "amaranth_speed",
           "command_speed", "targets", "write_report", "run", "main",
           "MODEL_SECTION", "MODEL_NETWORKS", "MODEL_SIZES", "model_speed",
           "write_model_speed", "model_main"]


class BenchMismatch(NPUError, AssertionError):
    """A GEMM of the benchmark was not bit-exact, the cycle model disagreed with the RTL, or
    the timed ``npu gemm`` command failed."""


SEED = 20261202

#: (config name, bus width, [(M, K, N), ...]): the sweep.
SWEEP = [
    ("4x4", 64, [(m, 64, 64) for m in (16, 64, 256)]),
    ("8x8", 64, [(m, 256, 256) for m in (16, 64, 128, 256)] + [(64, 100, 100)]),
    ("16x16", 128, [(m, 256, 256) for m in (16, 64, 128, 256)] + [(3136, 100, 100)]),
]
QUICK_SWEEP = [
    ("4x4", 64, [(16, 64, 64), (64, 64, 64)]),
    ("8x8", 64, [(64, 100, 100)]),
]


def _operands(rng, m, k, n):
    return (rng.integers(-128, 128, size=(m, k), dtype=np.int8),
            rng.integers(-128, 128, size=(k, n), dtype=np.int8))


@contextlib.contextmanager
def _dram(model):
    """``NPU_DRAM=model`` and no ``NPU_BACKPRESSURE`` in this process's environment (which
    :func:`sim.runner.run_programs` reads) inside the block, the caller's values after it."""
    saved = {name: os.environ.get(name) for name in ("NPU_DRAM", "NPU_BACKPRESSURE")}
    os.environ["NPU_DRAM"] = model
    os.environ.pop("NPU_BACKPRESSURE", None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_sweep(sweep):
    """The GEMMs of ``sweep`` under Verilator on the HDL DRAM, one simulation per config."""
    rng = np.random.default_rng(SEED)
    rows = []
    for name, bus_width, shapes in sweep:
        config = NPUConfig.from_name(name, bus_width=bus_width)
        pairs = [_operands(rng, *shape) for shape in shapes]
        print(f"{name} ({bus_width}-bit): {len(shapes)} GEMMs under Verilator", flush=True)
        with _dram("hdl"):
            results = gemm_batch(pairs, config=config, sim="verilator")
        for (m, k, n), (a, b), result in zip(shapes, pairs, results):
            if not np.array_equal(result.c, reference_gemm(a, b)):
                raise BenchMismatch(f"{m}x{k}x{n} on {name}: not bit-exact (seed {SEED})")
            pes = config.rows * config.cols
            plan = result.plan
            scalesim = scalesim_cycles(config, m, k, n)
            model = predict_gemm(config, m, k, n)
            if model.perf != result.perf:
                raise BenchMismatch(f"{m}x{k}x{n} on {name}: the cycle model predicts "
                                    f"{model.perf}, the RTL counted {result.perf}")
            rows.append(dict(
                m=m, k=k, n=n, config=name, bus=bus_width, cycles=result.cycles,
                model=model.cycles,
                utilization=m * k * n / (result.cycles * pes),
                ceiling=plan.mapping_efficiency, scalesim=scalesim,
                scalesim_utilization=m * k * n / (scalesim * pes), perf=result.perf))
    return rows


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.0))
    for name, bus, _ in SWEEP:
        points = sorted((r["m"], r["utilization"]) for r in rows
                        if r["config"] == name and r["k"] == r["n"] and r["k"] in (64, 256))
        if points:
            axes.plot(*zip(*points), marker="o", label=f"{name}, {bus}-bit bus (RTL)")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("M (rows of A), K = N = 64 on 4x4, 256 otherwise")
    axes.set_ylabel("utilization (hardware counters)")
    axes.set_ylim(0, 1.02)
    axes.grid(True, alpha=0.3)
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


#: ``(simulator, DRAM model, (shorter GEMM, longer GEMM))``: the GEMMs whose simulator speed
#: is measured on 8x8, each pair in one build of its own. Verilator on the HDL DRAM runs the
#: steady state of issue 15 (512^3 over 256^3); on cocotbext-axi's it runs the old figures
#: (64x256x256 and 256^3, 20-40 s for the latter). Icarus runs the small shapes of old on
#: both: on this design it simulates a few hundred cycles per second whatever the DRAM (the
#: HDL DRAM was measured at 215 cycles/s on a busy machine), far from issue 15's 20,000.
SPEED_RUNS = [
    ("verilator", "hdl", ((256, 256, 256), (512, 512, 512))),
    ("verilator", "cocotbext", ((64, 256, 256), (256, 256, 256))),
    ("icarus", "hdl", ((8, 64, 64), (64, 64, 64))),
    ("icarus", "cocotbext", ((8, 64, 64), (64, 64, 64))),
]
#: Rows of A in the Amaranth simulator's two GEMMs (K = N = 32).
AMARANTH_SPEED_ROWS = (8, 32)
#: The command whose end-to-end speed issue 15 names, timed as a subprocess (HDL DRAM).
SPEED_COMMAND = ("gemm", "--m", "512", "--k", "512", "--n", "512", "--config", "8x8",
                 "--sim", "verilator")
#: The figures to reach of issue 15, in simulated cycles per wall-clock second:
#: ``(what, (simulator, DRAM model) or "command", "end to end" or "steady", target)``.
TARGETS = [
    ("Verilator end to end (the whole `npu gemm` 512^3 command)", "command", "end to end",
     300_000),
    ("Verilator steady state (512^3 over 256^3, HDL DRAM)", ("verilator", "hdl"), "steady",
     500_000),
    ("Icarus steady state (HDL DRAM)", ("icarus", "hdl"), "steady", 20_000),
]


@dataclass(frozen=True)
class Speeds:
    """What :func:`simulator_speed` measured.

    Attributes
    ----------
    gemms : list
        ``[(simulator, DRAM model, [((m, k, n), cycles, wall seconds), ...]), ...]``, the
        shorter GEMM first; the DRAM model ``python`` for Amaranth's simulator.
    command : tuple or None
        ``(argv, cycles, wall seconds)`` of :data:`SPEED_COMMAND`, or ``None`` if not run.
    """
    gemms: list
    command: tuple = None


def simulator_speed(runs=None, command=SPEED_COMMAND):
    """Simulated cycles per wall-clock second on 8x8, for each simulator and DRAM model of
    ``runs`` (:data:`SPEED_RUNS` by default; see :func:`rtl_speed`), in Amaranth's simulator,
    and of the whole ``npu`` ``command`` (:func:`command_speed`; ``None``: not run).

    End to end is the longer GEMM's cycles over its wall time; steady state is the extra
    cycles of the longer GEMM over the simulator's extra time (:func:`rtl_speed`), which
    leaves the start and the program's compilation out."""
    config = NPUConfig.from_name("8x8")
    rng = np.random.default_rng(SEED)
    gemms = []
    for sim, dram, shapes in (SPEED_RUNS if runs is None else runs):
        print(f"simulator speed: {sim} on the {dram} DRAM, "
              f"{', '.join('x'.join(map(str, shape)) for shape in shapes)}", flush=True)
        gemms.append((sim, dram, rtl_speed(config, sim, dram,
                                           [_operands(rng, *shape) for shape in shapes])))
    gemms.append(("amaranth", "python",
                  [amaranth_speed(config, rng, m) for m in AMARANTH_SPEED_ROWS]))
    measured = None
    if command is not None:
        print(f"simulator speed: npu {' '.join(command)}", flush=True)
        measured = command_speed(command)
    return Speeds(gemms, measured)


def rtl_speed(config, sim, dram, pairs):
    """Each GEMM of ``pairs = [(A, B), ...]`` in a ``gemm_batch`` call of its own on the RTL
    simulator ``sim`` with the DRAM model ``dram``, timed whole (Python's compilation, the
    simulator's start, loading and dumping DRAM included; the check against numpy after the
    clock stops), after an untimed run of the first that builds (or finds the cached build)
    and warms up.

    Returns ``[((m, k, n), cycles, seconds, simulator seconds), ...]``, the last the time of
    the simulation alone (its start, loading DRAM, the run, the dump: everything but the
    program's compilation in Python and the check); a result that is not bit-exact raises
    :class:`BenchMismatch`."""
    timed = []
    with _dram(dram):
        gemm_batch(pairs[:1], config=config, sim=sim)
        for a, b in pairs:
            start = time.perf_counter()
            jobs = [prepare_gemm(a, b, config=config)]
            simulation = time.perf_counter()
            (result,) = run_jobs(jobs, config, sim)
            simulated = time.perf_counter() - simulation
            wall = time.perf_counter() - start
            (m, k), n = a.shape, b.shape[1]
            if not np.array_equal(result.c, reference_gemm(a, b)):
                raise BenchMismatch(f"{m}x{k}x{n} on {config.name} ({sim}, {dram} DRAM): "
                                    f"not bit-exact (seed {SEED})")
            timed.append(((m, k, n), result.cycles, wall, simulated))
    return timed


def _npu_command():
    """The ``npu`` entry point next to this Python, or this Python calling it."""
    npu = Path(sys.executable).with_name("npu")
    if npu.is_file() and os.access(npu, os.X_OK):
        return [str(npu)]
    return [sys.executable, "-c", "import sys; from sw.cli import main; sys.exit(main())"]


def command_speed(argv=SPEED_COMMAND):
    """The wall time of ``npu *argv`` (a ``gemm`` printing ``cycles:`` and ``bit-exact:``) in
    a fresh process on the HDL DRAM, after one untimed run of the same that builds (or finds
    the cached build) and warms up: ``(argv, cycles, seconds)``.

    A command that fails or is not bit-exact raises :class:`BenchMismatch`."""
    argv = tuple(argv)
    command = _npu_command() + list(argv)
    environment = dict(os.environ, NPU_DRAM="hdl")
    environment.pop("NPU_BACKPRESSURE", None)
    project = Path(__file__).resolve().parent.parent

    def once():
        start = time.perf_counter()
        done = subprocess.run(command, cwd=project, env=environment, capture_output=True,
                              text=True)
        wall = time.perf_counter() - start
        cycles = re.search(r"^cycles: (\d+)\s*$", done.stdout, re.MULTILINE)
        if done.returncode != 0 or cycles is None or \
                not re.search(r"^bit-exact: yes$", done.stdout, re.MULTILINE):
            tail = " ".join((done.stderr.strip() or done.stdout.strip()).splitlines()[-3:])
            raise BenchMismatch(f"npu {' '.join(argv)} exited with {done.returncode} "
                                f"(not bit-exact, or no cycles printed): {tail}")
        return int(cycles.group(1)), wall

    once()
    cycles, wall = once()
    return (argv, cycles, wall)


def amaranth_speed(config, rng, m, k=32, n=32):
    """One ``m x k x n`` GEMM on the whole NPU in Amaranth's simulator, with the DRAM answering
    at once (:func:`sim.amaranth_sim.run_jobs`): ``((m, k, n), cycles, seconds)``."""
    from sim.amaranth_sim import Job, run_jobs

    a, b = _operands(rng, m, k, n)
    a_addr, b_addr, c_addr = 0x10000, 0x20000, 0x30000
    program = compile_gemm(config, m, k, n, a_addr=a_addr, b_addr=b_addr, c_addr=c_addr)
    job = Job(program.words, prog_addr=0x1000,
              data=[(a_addr, a.tobytes()), (b_addr, b.tobytes())])
    start = time.perf_counter()
    (outcome,), model = run_jobs([job], config=config, seed=SEED, timeout_cycles=1 << 20,
                                 ready_probability=1.0, max_latency=0)
    wall = time.perf_counter() - start
    c = np.frombuffer(bytes(model.peek(c_addr, 4 * m * n)), dtype="<i4").reshape(m, n)
    if not np.array_equal(c, reference_gemm(a, b)):
        raise BenchMismatch(f"{m}x{k}x{n} in Amaranth's simulator: not bit-exact "
                            f"(seed {SEED})")
    return ((m, k, n), outcome.cycles, wall)


def _simulator_seconds(run):
    """The simulation's own time of a timed GEMM (:func:`rtl_speed`), else its whole time."""
    return run[3] if len(run) > 3 else run[2]


def _rates(runs):
    """``(end to end, steady state)`` cycles per second of ``[short, long]`` timed GEMMs: end
    to end over the longer GEMM's whole time, the steady state over the simulator's extra
    time (:func:`_simulator_seconds`); ``None`` where the longer GEMM did not take longer
    (no figure to give)."""
    short, long = runs
    long_cycles, short_cycles = long[1], short[1]
    long_sim, short_sim = _simulator_seconds(long), _simulator_seconds(short)
    steady = None
    if long_sim > short_sim and long_cycles > short_cycles:
        steady = (long_cycles - short_cycles) / (long_sim - short_sim)
    return long_cycles / long[2], steady


def _verdict(measured, target):
    if measured is None:
        return "not measured"
    if measured >= target:
        return "reached"
    return f"not reached ({int(100 * measured / target)}% of the target)"


def targets(speeds):
    """The figures of :data:`TARGETS` in ``speeds`` (a :class:`Speeds`):
    ``[(what, target, measured cycles per second or None, verdict), ...]``."""
    rates = {(sim, dram): _rates(runs) for sim, dram, runs in speeds.gemms}
    verdicts = []
    for what, source, kind, target in TARGETS:
        if source == "command":
            measured = None if speeds.command is None \
                else speeds.command[1] / speeds.command[2]
        else:
            pair = rates.get(source)
            measured = None if pair is None else pair[kind == "steady"]
        verdicts.append((what, target, measured, _verdict(measured, target)))
    return verdicts


def _shape(shape):
    return "x".join(map(str, shape))


def _speed_lines(speeds):
    lines = [
        "",
        "## Simulator speed",
        "",
        "Simulated cycles per wall-clock second on 8x8, the old and the new DRAM side by side "
        "in one run. The DRAM column says what answered the NPU's AXI4 master: `hdl`, the "
        "AXI4 slave memory inside the simulated hardware (sim/hdl/npu_axi_dram.v, loaded and "
        "dumped with `$readmemh`/`$writememh`; the Python bench sleeps until the NPU's "
        "interrupt); `cocotbext`, cocotbext-axi's AXI4 slave models in Python, woken by the "
        "cocotb bench (sim/bench.py) for every beat on the bus (`NPU_DRAM=cocotbext`, the "
        "model of old); `python`, the AXI4 memory model of sim/amaranth_sim.py, answering "
        "at once, which Amaranth's simulator runs with the controller, DMA and memories. "
        "Verilator and Icarus run the same cocotb bench and the AXI4 protocol checker on "
        "either DRAM; under "
        "Verilator the clock is made by the C++ main loop (sim/verilator/main.cpp).",
        "",
        "End to end: the whole `gemm_batch` call of the longer GEMM (the program's "
        "compilation in Python, the simulator's start, loading DRAM, the run, reading the "
        "result back), after a warm-up run of the shorter GEMM on the same cached build. "
        "Steady state: the extra cycles of the longer GEMM over the simulator's extra time "
        "(in brackets under wall time: the simulation alone, from the simulator's start to "
        "its DRAM dump read back, without the program's compilation in Python, which grows "
        "with the GEMM and is in the end-to-end figure), which leaves the start and the "
        "fixed costs out. Every GEMM was bit-exact. One run each on "
        "the shared 2-core machine: expect a spread.",
        "",
        "| simulator | DRAM | GEMMs | cycles | wall time | end to end (longer GEMM) "
        "| steady state |",
        "|---|---|---|---|---|---|---|",
    ]
    by_shape = {}
    for sim, dram, runs in speeds.gemms:
        (short, short_cycles, short_wall, *_), (long, long_cycles, long_wall, *_) = runs
        end_to_end, steady = _rates(runs)
        walls = f"{short_wall:.1f} s, {long_wall:.1f} s"
        if all(len(run) > 3 for run in runs):
            walls += (f" (simulator {_simulator_seconds(runs[0]):.1f} s, "
                      f"{_simulator_seconds(runs[1]):.1f} s)")
        lines.append(
            f"| {sim} | {dram} | {_shape(short)}, {_shape(long)} | "
            f"{short_cycles:,}, {long_cycles:,} | {walls} | "
            f"{end_to_end:,.0f} | {'n/a' if steady is None else f'{steady:,.0f}'} |")
        if sim != "amaranth":   # its DRAM answers at once: other cycles by design
            for shape, cycles, *_ in runs:
                by_shape.setdefault(shape, {})[f"{sim}/{dram}"] = cycles
    repeated = {shape: runs for shape, runs in by_shape.items() if len(runs) > 1}
    if repeated:
        equal = [shape for shape, runs in repeated.items() if len(set(runs.values())) == 1]
        differ = [shape for shape in repeated if shape not in equal]
        text = ""
        if equal:
            text += ("The RTL cycle counts of a GEMM run on several simulators or DRAM models "
                     "are equal: " + "; ".join(
                         f"{_shape(shape)} {next(iter(repeated[shape].values())):,} cycles on "
                         f"{', '.join(repeated[shape])}" for shape in equal) + ". ")
        if differ:
            text += ("They differ for " + "; ".join(
                f"{_shape(shape)} (" + ", ".join(
                    f"{cycles:,} on {where}" for where, cycles in repeated[shape].items())
                + ")" for shape in differ) + ", against tb/test_dram_models.py. ")
        lines += ["", text.strip()]
    if speeds.command is not None:
        argv, cycles, wall = speeds.command
        lines += [
            "",
            f"The whole command `npu {' '.join(argv)}`, as a user runs it (a new "
            "Python process: imports, the program's compilation, the simulator's start on "
            "the HDL DRAM, the GEMM, the check against numpy; the build cached, after one "
            f"warm-up run of the same command): {cycles:,} cycles in {wall:.1f} s, "
            f"{cycles / wall:,.0f} cycles/s end to end.",
        ]
    lines += [
        "",
        "The targets of issue 15 are at least 300,000 cycles/s end to end for the whole "
        "`npu gemm --m 512 --k 512 --n 512 --config 8x8 --sim verilator` (build cached) and "
        "at least 500,000 in the steady state (512^3 over 256^3) under Verilator, and at "
        "least 20,000 in the steady state under Icarus; measured in this run:",
        "",
    ]
    for what, target, measured, verdict in targets(speeds):
        if measured is None:
            lines.append(f"* {what}, target {target:,}: {verdict}.")
        else:
            lines.append(f"* {what}: {measured:,.0f} cycles/s against {target:,}: {verdict}.")
    return lines


def _simulator_bullet(speeds):
    """The "What limits the figures" bullet on simulator speed, with the measured figures."""
    text = "* Simulator speed: the HDL DRAM removes the per-beat Python"
    rates = {} if speeds is None else \
        {(sim, dram): _rates(runs) for sim, dram, runs in speeds.gemms}
    new, old = rates.get(("verilator", "hdl")), rates.get(("verilator", "cocotbext"))
    if new is not None and old is not None and None not in (new[1], old[1]):
        text += (f" (under Verilator {new[1]:,.0f} cycles/s in the steady state, against "
                 f"{old[1]:,.0f} with cocotbext-axi's DRAM, {new[1] / old[1]:.0f} times "
                 "as many)")
    text += (". What remains is the Verilated design's own evaluation (about 70% of the "
             "simulator's time in a perf profile of the 512^3 run, of which the AXI4 "
             "protocol checker about 18%) and cocotb's VPI callbacks (about 17%). The "
             "program's compilation in Python (about 1.9 s for 512^3) and the simulator's "
             "start (about 2 s) weigh on the end-to-end figure")
    if speeds is not None and speeds.command is not None:
        _, cycles, wall = speeds.command
        text += (f": the whole `npu gemm` 512^3 command took {wall:.1f} s for {cycles:,} "
                 f"cycles, {cycles / wall:,.0f} cycles/s")
    return text + ". (The profile's shares were measured once with perf, not by this run.)"


def write_report(rows, speeds, path, plot_path):
    """Write the report of the sweep's ``rows`` (:func:`run_sweep`) and ``speeds`` (a
    :class:`Speeds`, or ``None`` for none) to ``path``, the plot at ``plot_path`` linked."""
    lines = [
        "# Performance",
        "",
        "Written by `make bench` (`npu bench`) on "
        f"{datetime.date.today().isoformat()}; seed {SEED}. Every figure comes from the "
        "hardware's own counters in Verilator simulation (`CYCLES` and `PERF_*`: start to "
        "done, instruction fetch and DMA included). The sweep runs on the HDL DRAM "
        "(sim/hdl/npu_axi_dram.v, an AXI4 slave memory in the simulated hardware, "
        "`NPU_DRAM=hdl`), which tb/test_dram_models.py holds equal, cycle for cycle, to "
        "cocotbext-axi's AXI4 slave models; no back-pressure; every GEMM was bit-exact.",
        "",
        "Utilization = M * K * N / (cycles * R * C). The mapping ceiling is the useful share "
        "of the weight tiles' PE-cells (seeds section 4.1). SCALE-Sim's weight-stationary "
        "model does not overlap tiles: cycles = ceil(K/R) * ceil(N/C) * (2R + C + M - 2). "
        "The model column is `npu plan`'s prediction (`sw.timing`, from the compiled "
        "program alone); the benchmark stops if it differs from any counter of the RTL, so "
        "every row below is also a check of the model.",
        "",
        "| M x K x N | config | bus | RTL cycles | model cycles | utilization | mapping ceiling "
        "| share of ceiling | SCALE-Sim cycles | SCALE-Sim util. |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['m']} x {r['k']} x {r['n']} | {r['config']} | {r['bus']} | "
            f"{r['cycles']:,} | {r['model']:,} | {r['utilization']:.1%} | {r['ceiling']:.1%} | "
            f"{r['utilization'] / r['ceiling']:.1%} | {r['scalesim']:,} | "
            f"{r['scalesim_utilization']:.1%} |")
    lines += [
        "",
        f"![utilization against M]({plot_path.name})",
        "",
        "Counters of each run (stall cycles are issue-stage cycles, by the first unit that "
        "held the instruction back):",
        "",
        "| M x K x N | config | array rows | useful MACs | stall fetch | stall load | "
        "stall store | stall array | instructions | bytes read | bytes written |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r["perf"]
        lines.append(
            f"| {r['m']} x {r['k']} x {r['n']} | {r['config']} | {p['array_rows']:,} | "
            f"{p['useful_macs']:,} | {p['stall_fetch']:,} | {p['stall_load']:,} | "
            f"{p['stall_store']:,} | {p['stall_array']:,} | {p['instructions']:,} | "
            f"{p['read_bytes']:,} | {p['write_bytes']:,} |")
    if speeds is not None:
        lines += _speed_lines(speeds)
    lines += [
        "",
        "## What limits the figures",
        "",
        "* Small M: fill and drain (R + C - 1 cycles per MATMUL pair that cannot overlap) and "
        "the first loads, before any MATMUL can start, are a large share of a short program.",
        "* The last unit's stores: nothing is left to overlap them with (on 16x16, 1,244 "
        "cycles of 256 x 256 x 256 and 861 of 3136 x 100 x 100, from the cycle model).",
        "* The DMA writer moves a row in its beats plus one cycle and every row is one burst, "
        "even where rows are contiguous in DRAM; the reader likewise issues a burst per row.",
        _simulator_bullet(speeds),
        "",
    ]
    kept = _model_section(path)
    path.write_text("\n".join(lines) + (f"\n{kept}" if kept else ""))


def run(out, *, quick=False, speed=True):
    """The whole benchmark: the sweep (:data:`QUICK_SWEEP` if ``quick``), its plot next to
    ``out`` (a :class:`pathlib.Path`), the simulator speeds unless ``speed`` is false, and
    the report in ``out``."""
    try:
        import matplotlib   # noqa: F401  (asked for now, not after minutes of simulation)
    except ModuleNotFoundError:
        raise BackendUnavailable("npu bench draws its plot with matplotlib, which is not "
                                 "installed: pip install -e '.[bench]' (make bench does)") \
            from None
    rows = run_sweep(QUICK_SWEEP if quick else SWEEP)
    plot_path = out.with_name("utilization.png")
    plot(rows, plot_path)
    speeds = simulator_speed() if speed else None
    write_report(rows, speeds, out, plot_path)
    print(f"wrote {out} and {plot_path}")


# -- the instruction-level model's speed ------------------------------------------------------

#: The heading of the report's section on the model's speed (written by :func:`model_main`).
MODEL_SECTION = "## Instruction-level model speed"
#: The networks and input sizes :func:`model_main` measures by default (size 0: the zoo's own
#: reduced resolution, 32 pixels for these two; 224: the networks' own).
MODEL_NETWORKS = ("inception_v2", "resnet50")
MODEL_SIZES = (0, 224)


def _model_section(path):
    """The model-speed section of the report at ``path`` (to the end of the file), or ''."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return ""
    start = text.find(MODEL_SECTION)
    return text[start:] if start >= 0 else ""


@contextlib.contextmanager
def _kept_programs():
    """Inside the block, collect every ``(config, dram, prog_addr, prog_len)`` handed to
    :func:`sw.backend.run_programs` (in ``kept["programs"]``) and time those calls and those
    of the cycle model, :func:`sw.timing.predict` (seconds in ``kept["backend"]`` and
    ``kept["cycle_model"]``)."""
    from . import backend, timing
    kept = {"programs": [], "backend": 0.0, "cycle_model": 0.0}
    originals = backend.run_programs, timing.predict

    def keeping(config, sim, programs):
        programs = list(programs)
        kept["programs"].extend((config, dram.copy(), addr, length)
                                for dram, addr, length in programs)
        started = time.perf_counter()
        try:
            return originals[0](config, sim, programs)
        finally:
            kept["backend"] += time.perf_counter() - started

    def predicting(*args, **kwargs):
        started = time.perf_counter()
        try:
            return originals[1](*args, **kwargs)
        finally:
            kept["cycle_model"] += time.perf_counter() - started

    backend.run_programs, timing.predict = keeping, predicting
    try:
        yield kept
    finally:
        backend.run_programs, timing.predict = originals


def model_speed(name, size=0, *, config=None, batch=1, progress=print):
    """Time the instruction-level model on the zoo network ``name`` at ``size`` (0: the zoo's
    default): the NPU programs of one :func:`sw.onnx.runtime.run_model` run of a seeded
    sample, each run one instruction at a time and by windows, one after the other.

    Returns a dict: ``network``, ``size``, ``config``, ``programs``, ``instructions``,
    ``stepped`` and ``windows`` (seconds of :meth:`sw.model.ModelNPU.run`, summed over the
    programs), ``run_model`` (seconds of the whole :func:`run_model` call, windows, with the
    host's part on onnxruntime), of which ``backend`` (the programs on the model) and
    ``cycle_model`` (:func:`sw.timing.predict`, the cycles the run reports).

    Raises
    ------
    BenchMismatch
        If a program does not leave the same result and DRAM both ways.
    """
    from .model import ModelNPU
    from .onnx.graph import import_model
    from .onnx.runtime import run_model
    from .onnx.zoo import sample_inputs, zoo_model
    config = config or NPUConfig(8, 8)
    zoo = zoo_model(name, size=size or None)
    graph = import_model(str(zoo.path))
    x = sample_inputs(zoo.input_shape, batch)
    with _kept_programs() as kept:
        started = time.perf_counter()
        run_model(graph, x, config=config, sim="model")
        whole = time.perf_counter() - started
    programs = kept["programs"]
    stepped = windows = 0.0
    instructions = 0
    for index, (program_config, dram, prog_addr, prog_len) in enumerate(programs):
        started = time.perf_counter()
        want = ModelNPU(program_config, batched=False).run(dram, prog_addr, prog_len)
        middle = time.perf_counter()
        got = ModelNPU(program_config).run(dram, prog_addr, prog_len)
        windows += time.perf_counter() - middle
        stepped += middle - started
        if (got.done, got.error_code, got.error_pc, got.instructions) != \
                (want.done, want.error_code, want.error_pc, want.instructions) \
                or not np.array_equal(got.dram, want.dram):
            raise BenchMismatch(f"{name} at {zoo.size}: program {index} differs between the "
                                f"model's windows and one instruction at a time")
        instructions += want.instructions
    row = dict(network=name, size=zoo.size, config=config.name, programs=len(programs),
               instructions=instructions, stepped=stepped, windows=windows, run_model=whole,
               backend=kept["backend"], cycle_model=kept["cycle_model"])
    progress(f"{name} {zoo.size}x{zoo.size}: {len(programs)} programs, {instructions:,} "
             f"instructions: one at a time {stepped:.1f} s, windows {windows:.2f} s "
             f"({stepped / windows:.1f}x)")
    return row


def _model_lines(rows, command):
    lines = [
        MODEL_SECTION,
        "",
        f"Written by `{command}` on {datetime.date.today().isoformat()} (a 2-core machine "
        "shared with other jobs: expect a spread of tens of percent between runs; the two "
        "columns of a row were measured in the same run, program after program, so a busy "
        "spell slows both). Each network of the model zoo (`sw.onnx.zoo`: the onnx package's "
        "light copies with seeded weights, quantized by onnxruntime, QDQ, int8) ran through "
        "`sw.onnx.runtime.run_model` on `--sim model` (8x8, one sample); the NPU programs of "
        "that run were then run again, each on the model one instruction at a time (as the "
        "model ran before the windows: `ModelNPU(config, batched=False)`, the specification) "
        "and by windows (the default), and both left the same DRAM, bit for bit. The times "
        "are `ModelNPU.run`'s, summed over the programs.",
        "",
        "| network | input | programs | instructions | one at a time | windows | speed-up "
        "| instructions/s (one at a time, windows) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['network']} | {r['size']}x{r['size']} | {r['programs']} | "
            f"{r['instructions']:,} | {r['stepped']:.1f} s | {r['windows']:.2f} s | "
            f"{r['stepped'] / r['windows']:.1f}x | {r['instructions'] / r['stepped']:,.0f}, "
            f"{r['instructions'] / r['windows']:,.0f} |")
    lines += [
        "",
        "The whole `run_model` call of the same run, with windows: the program images "
        "built by `sw.nn.program`, the programs run on the model, the host's part on "
        "onnxruntime, and the cycles the run reports, from the cycle model "
        "(`sw.timing.predict`):",
        "",
        "| network | input | whole run_model | programs on the model | cycle model |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['network']} | {r['size']}x{r['size']} | {r['run_model']:.1f} s | "
            f"{r['backend']:.2f} s | {r['cycle_model']:.1f} s |")
    lines += [
        "",
        "Where the time went one instruction at a time: to Python around each instruction, "
        "not to arithmetic. In a cProfile of the model alone on Inception v2 at 224x224 "
        "(3.78 M instructions, 63 s under the profiler; measured once, not by this run): "
        "LOAD_SPAD 35% (of it numpy's `as_strided` for the strided DRAM view 17%), decoding "
        "each word (`sw.codec.decode`) 20%, the fetch-and-dispatch loop itself 19%, MATMUL "
        "14% (a float64 product of at most 28 x 8 by 8 x 8 per instruction), PRELOAD 4%; "
        "ResNet-50 at 32x32 alike (decode 21%, loop 21%, LOAD_SPAD 30%, MATMUL 15%).",
        "",
        "How: the program is decoded into numpy columns once, and run a window of up to "
        "65,536 instructions at a time (`sw/model_window.py`). A window ends before a load "
        "that may read what a store of the window wrote, after a store that may write over "
        "the program, and before a failing instruction; within it, the scratchpad's rows are "
        "traced from each read back to the load that wrote them (in segments, sorted by "
        "numpy's radix sort), each chain of MATMULs into the same accumulator rows is one "
        "float32 product in blocks of at most 1,024 terms (exact: every partial sum at most "
        "2**24), chains that read the same "
        "activations share it, and the accumulator's sets, additions and reads are resolved "
        "with one wrapping INT32 cumulative sum. BLAS runs on one thread inside a run "
        "(threadpoolctl): on a busy machine a second thread made the many small products "
        "several times slower. tb/test_model.py compares the two ways on random programs "
        "(hazards, stores over the program, failures part-way) and on compiled networks.",
        "",
    ]
    return "\n".join(lines)


def write_model_speed(rows, path, command):
    """Replace (or add) the model-speed section of the report at ``path``."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        text = "# Performance\n"
    start = text.find(MODEL_SECTION)
    if start >= 0:
        text = text[:start]
    path.write_text(text.rstrip("\n") + "\n\n" + _model_lines(rows, command))


def model_main(argv):
    """``python -m sw.bench model [...]``: :func:`model_speed` on each network and size, the
    section written to ``--out``."""
    import argparse
    parser = argparse.ArgumentParser(
        prog="python -m sw.bench model",
        description="The instruction-level model's speed on public networks: one "
                    "instruction at a time against windows, side by side.")
    parser.add_argument("--networks", default=",".join(MODEL_NETWORKS),
                        help="zoo networks, comma-separated (default: %(default)s)")
    parser.add_argument("--sizes", default=",".join(map(str, MODEL_SIZES)),
                        help="input sizes, comma-separated; 0 is the zoo's default "
                             "(default: %(default)s)")
    parser.add_argument("--out", default="docs/performance.md", metavar="FILE",
                        help="the report whose section is written (default: %(default)s)")
    arguments = parser.parse_args(argv)
    try:
        sizes = [int(size) for size in arguments.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes takes integers, not {arguments.sizes!r}")
    rows = [model_speed(name, size) for size in sizes
            for name in arguments.networks.split(",")]
    command = "python -m sw.bench model " + " ".join(
        f"--{name} {value}" for name, value in (("networks", arguments.networks),
                                                ("sizes", arguments.sizes))
        if value != parser.get_default(name))
    write_model_speed(rows, Path(arguments.out), command.strip())
    print(f"wrote {arguments.out}")
    return 0


def main(argv=None):
    """``python -m sw.bench [...]``: the same as ``npu bench [...]``; ``python -m sw.bench
    model [...]``: :func:`model_main`."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["model"]:
        return model_main(argv[1:])
    from .cli import main as cli_main
    return cli_main(["bench", *argv])


if __name__ == "__main__":
    sys.exit(main())
