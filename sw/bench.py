"""``npu bench`` (``make bench``): the utilization sweep from the hardware's counters, and
simulator speed.

Runs GEMMs under Verilator, reads the cycle and performance counters, and writes
``docs/performance.md`` (shape, config, RTL cycles, the cycle model's prediction
(:mod:`sw.timing`), utilization, the mapping ceiling, SCALE-Sim's weight-stationary figure)
and ``docs/utilization.png`` (utilization against M). It then measures simulated cycles per
wall-clock second of a compute-bound GEMM under Verilator, Icarus and Amaranth's simulator.

    npu bench [--quick] [--out docs/performance.md] [--no-speed]
    python -m sw.bench [--quick] [--out docs/performance.md] [--no-speed]

Every GEMM is checked bit-exactly against numpy; a mismatch stops the benchmark
(:class:`BenchMismatch`). So does a cycle model that disagrees with a counter of the RTL.
"""

import datetime
import sys
import time

import numpy as np

from hw.config import NPUConfig
from .compiler import compile_gemm, scalesim_cycles
from .driver import gemm_batch, reference_gemm
from .errors import BackendUnavailable, NPUError
from .timing import predict_gemm


__all__ = ["BenchMismatch", "SWEEP", "QUICK_SWEEP", "run_sweep", "plot", "simulator_speed",
           "rtl_speed", "amaranth_speed", "write_report", "run", "main"]


class BenchMismatch(NPUError, AssertionError):
    """A GEMM of the benchmark was not bit-exact, or the cycle model disagreed with the RTL."""


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


def run_sweep(sweep):
    rng = np.random.default_rng(SEED)
    rows = []
    for name, bus_width, shapes in sweep:
        config = NPUConfig.from_name(name, bus_width=bus_width)
        pairs = [_operands(rng, *shape) for shape in shapes]
        print(f"{name} ({bus_width}-bit): {len(shapes)} GEMMs under Verilator", flush=True)
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


#: The GEMMs whose simulator speed is measured on 8x8, a short and a long one each: Icarus
#: runs far slower, so it gets smaller ones.
SPEED_SHAPES = {
    "verilator": ((64, 256, 256), (256, 256, 256)),
    "icarus": ((8, 64, 64), (64, 64, 64)),
}
#: Rows of A in the Amaranth simulator's two GEMMs (K = N = 32).
AMARANTH_SPEED_ROWS = (8, 32)


def simulator_speed():
    """Simulated cycles per wall-clock second of GEMMs on 8x8: end to end (the cached
    simulator build excluded; its start and the test bench included), and in the steady
    state (the difference of a long and a short run, so without the start).

    Returns ``[(simulator, [((m, k, n), cycles, wall seconds), ...]), ...]``, the short run
    first."""
    config = NPUConfig.from_name("8x8")
    rng = np.random.default_rng(SEED)
    speeds = [(sim, [rtl_speed(config, sim, _operands(rng, *shape)) for shape in shapes])
              for sim, shapes in SPEED_SHAPES.items()]
    speeds.append(("amaranth", [amaranth_speed(config, rng, m) for m in AMARANTH_SPEED_ROWS]))
    return speeds


def rtl_speed(config, sim, pair):
    """One GEMM of ``pair = (A, B)`` on the RTL simulator ``sim``, timed after a first run
    that builds (or finds the cached build) and warms up: ``((m, k, n), cycles, seconds)``."""
    gemm_batch([pair], config=config, sim=sim)
    start = time.perf_counter()
    (result,) = gemm_batch([pair], config=config, sim=sim)
    wall = time.perf_counter() - start
    a, b = pair
    return ((*a.shape, b.shape[1]), result.cycles, wall)


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


def write_report(rows, speeds, path, plot_path):
    lines = [
        "# Performance",
        "",
        "Written by `make bench` (`npu bench`) on "
        f"{datetime.date.today().isoformat()}; seed {SEED}. Every figure comes from the "
        "hardware's own counters in Verilator simulation (`CYCLES` and `PERF_*`: start to "
        "done, instruction fetch and DMA included), with cocotbext-axi's AXI4 slave models "
        "as DRAM (`sim/bench.py`) and no back-pressure; every GEMM was bit-exact.",
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
    speed_lines = [
        "",
        "## Simulator speed",
        "",
        "Simulated cycles per wall-clock second on 8x8. End to end: one GEMM, the "
        "simulator's start, the bench loading DRAM and reading the result included, the "
        "cached build excluded. Steady state: the extra cycles of the longer GEMM over its "
        "extra wall time, which leaves the start out. Verilator and Icarus run the cocotb "
        "bench with cocotbext-axi's AXI4 slave models as DRAM (sim/bench.py); Amaranth's "
        "simulator runs the controller, DMA and memories with the Python AXI4 memory model of "
        "sim/amaranth_sim.py. One run each on the shared 2-core machine: expect a spread.",
        "",
        "| simulator | GEMMs | cycles | wall time | end to end (longer GEMM) | steady state |",
        "|---|---|---|---|---|---|",
    ]
    for sim, ((short, short_cycles, short_wall), (long, long_cycles, long_wall)) in speeds:
        steady = (long_cycles - short_cycles) / max(long_wall - short_wall, 1e-9)
        speed_lines.append(
            f"| {sim} | {'x'.join(map(str, short))}, {'x'.join(map(str, long))} | "
            f"{short_cycles:,}, {long_cycles:,} | {short_wall:.1f} s, {long_wall:.1f} s | "
            f"{long_cycles / long_wall:,.0f} | {steady:,.0f} |")
    if speeds:
        lines += speed_lines
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
        "* Simulator speed: under Verilator the cocotb bench is woken for every beat on the "
        "bus (cocotbext-axi's DRAM model runs in Python), which bounds a DMA-heavy GEMM to "
        "tens of thousands of cycles per second; only the top level is public "
        "(sim/public.vlt), which helps by about a quarter. An HDL DRAM model in the bench "
        "would lift it.",
        "",
    ]
    path.write_text("\n".join(lines))


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
    speeds = simulator_speed() if speed else []
    write_report(rows, speeds, out, plot_path)
    print(f"wrote {out} and {plot_path}")


def main(argv=None):
    """``python -m sw.bench [...]``: the same as ``npu bench [...]``."""
    from .cli import main as cli_main
    return cli_main(["bench", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
