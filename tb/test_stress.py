"""A randomized GEMM regression on the generated Verilog, bit-exact against numpy.

Each case is one simulator, one NPU configuration and one AXI data width: it draws its shapes
(1 .. 300 in each dimension, log-uniform so that most are small, within a budget of
simulated cycles) and its operands (the full INT8 range, and special matrices: all -128,
all 127, zeros, identity, one-hot, the extremes of the range, sparse), compiles each GEMM
with the driver (``sw.driver.prepare_gemm``, with the "auto" or the "streaming" schedule)
and runs them all in one simulation, one after another without a reset, as
``sw.driver.gemm_batch`` does. Every GEMM must be bit-exact, leave the DRAM outside C
untouched and end within the cycle bound of ``tb/cycle_bound.py``; some cases run with
random back-pressure on every AXI channel (``NPU_BACKPRESSURE``).

``make test`` runs the cases marked fast; ``NPU_FULL=1`` (``make test-full``) runs all of
them, more than 1,000 GEMMs. A failure prints the one command that reruns its case.
"""

import math
import os
import time
import zlib
from dataclasses import dataclass

import numpy as np
import pytest

from cycle_bound import (WAIT, WAIT_BACKPRESSURE, gemm_cycles_estimate, instruction_bound,
                         program_bound)
from hw.config import NPUConfig
from sim.runner import run_programs
from sw.compiler import plan_gemm
from sw.driver import prepare_gemm, reference_gemm


pytestmark = pytest.mark.rtl

BASE_SEED = int(os.environ.get("NPU_SEED", "20261203"))
FULL = os.environ.get("NPU_FULL") == "1"
MAX_DIM = 300


@dataclass(frozen=True)
class Case:
    """One simulation: ``gemms`` GEMMs whose estimated cycles add up to at most ``budget``."""
    sim: str
    config: NPUConfig
    gemms: int
    budget: int
    max_dim: int = MAX_DIM
    backpressure: bool = False
    fast: bool = False          # also in `make test`

    @property
    def name(self):
        memories = "" if (self.config.spad_depth, self.config.acc_depth) == (2048, 512) \
            else f"-s{self.config.spad_depth}a{self.config.acc_depth}"
        return (f"{self.sim}-{self.config.name}-{self.config.bus_width}{memories}"
                + ("-bp" if self.backpressure else ""))

    @property
    def seed(self):
        return BASE_SEED + zlib.crc32(self.name.encode()) % 1_000_000


def _config(name, bus_width, **memories):
    return NPUConfig.from_name(name, bus_width=bus_width, **memories)


# The fast cases reuse configurations that other RTL tests build anyway.
CASES = [
    Case("verilator", _config("8x8", 64), gemms=30, budget=250_000, fast=True),
    Case("verilator", _config("4x4", 128), gemms=16, budget=50_000, backpressure=True,
         fast=True),
    Case("icarus", _config("2x3", 32, spad_depth=32, acc_depth=16), gemms=8, budget=8_000,
         max_dim=40, fast=True),
    # Verilator: every array shape, each at two of the three bus widths; small memories on
    # 2x3 force many blocks of A and the streaming schedule.
    Case("verilator", _config("1x1", 32), gemms=90, budget=1_500_000),
    Case("verilator", _config("1x1", 128), gemms=60, budget=600_000, backpressure=True),
    Case("verilator", _config("2x3", 32, spad_depth=32, acc_depth=16), gemms=90,
         budget=1_500_000),
    Case("verilator", _config("2x3", 64, spad_depth=64, acc_depth=16), gemms=60,
         budget=600_000, backpressure=True),
    Case("verilator", _config("4x4", 64), gemms=90, budget=1_500_000),
    Case("verilator", _config("4x4", 128), gemms=90, budget=1_500_000),
    Case("verilator", _config("5x7", 32), gemms=90, budget=1_500_000),
    Case("verilator", _config("5x7", 128), gemms=60, budget=600_000, backpressure=True),
    Case("verilator", _config("8x8", 128), gemms=90, budget=1_500_000),
    Case("verilator", _config("8x8", 32), gemms=60, budget=600_000, backpressure=True),
    Case("verilator", _config("16x16", 64), gemms=90, budget=1_500_000),
    Case("verilator", _config("16x16", 32), gemms=60, budget=600_000, backpressure=True),
    # Icarus, about 50 times slower: fewer and smaller GEMMs.
    Case("icarus", _config("1x1", 64), gemms=15, budget=30_000, max_dim=60),
    Case("icarus", _config("4x4", 128), gemms=15, budget=30_000, max_dim=80),
    Case("icarus", _config("5x7", 32), gemms=15, budget=30_000, max_dim=80),
    Case("icarus", _config("16x16", 64), gemms=10, budget=20_000, max_dim=80,
         backpressure=True),
]
SELECTED = [case for case in CASES if FULL or case.fast]


# ------------------------------------------------------------------------------- operands
def _matrix(rng, kind, rows, cols):
    if kind == "random":
        return rng.integers(-128, 128, size=(rows, cols), dtype=np.int8)
    if kind == "extremes":
        return rng.choice(np.array([-128, -127, -1, 0, 1, 126, 127], np.int8), (rows, cols))
    if kind == "all_-128":
        return np.full((rows, cols), -128, np.int8)
    if kind == "all_127":
        return np.full((rows, cols), 127, np.int8)
    if kind == "zeros":
        return np.zeros((rows, cols), np.int8)
    if kind == "identity":
        return np.eye(rows, cols, dtype=np.int8)
    if kind == "one_hot":
        matrix = np.zeros((rows, cols), np.int8)
        matrix[rng.integers(rows), rng.integers(cols)] = rng.choice([-128, 127, 1, -1])
        return matrix
    if kind == "sparse":
        values = rng.integers(-128, 128, size=(rows, cols), dtype=np.int8)
        return np.where(rng.random((rows, cols)) < 0.1, values, 0).astype(np.int8)
    raise ValueError(f"unknown matrix kind {kind!r}")


SPECIAL = ["extremes", "all_-128", "all_127", "zeros", "identity", "one_hot", "sparse"]
#: The first GEMMs of every case: the corners of the arithmetic, then the special matrices.
FIRST_PAIRS = [("all_-128", "all_-128"), ("all_127", "all_-128"), ("all_127", "all_127"),
               ("identity", "random"), ("random", "identity"), ("one_hot", "random"),
               ("random", "one_hot"), ("zeros", "random"), ("extremes", "extremes"),
               ("sparse", "all_-128")]


def _kind(rng):
    return "random" if rng.random() < 0.6 else str(rng.choice(SPECIAL))


# ------------------------------------------------------------------------------- shapes
def _estimate(config, m, k, n, schedule):
    return gemm_cycles_estimate(plan_gemm(config, m, k, n, schedule=schedule),
                                config.bus_bytes)


def _draw_shapes(case, rng):
    """``(m, k, n, schedule)`` for every GEMM: log-uniform dimensions, a few chosen ones
    first, each GEMM shrunk (largest dimension halved) until it fits its share of the
    budget. Returns the shapes and their estimated cycles."""
    config, top = case.config, case.max_dim
    chosen = [(1, 1, 1), (top, 1, 1), (1, top, 1), (1, 1, top),
              (config.rows, config.rows, config.cols),
              (config.rows + 1, 2 * config.rows + 1, config.cols + 1), (top, top, top)]
    shapes, spent = [], 0
    for index in range(case.gemms):
        if index < len(chosen):
            dims = list(chosen[index])
        else:
            dims = [min(top, int(math.exp(rng.uniform(0, math.log(top + 1))))) for _ in range(3)]
        schedule = "streaming" if rng.random() < 0.25 else "auto"
        left = case.budget - spent
        cap = min(left, 4 * left / (case.gemms - index))
        while (cost := _estimate(config, *dims, schedule)) > cap and max(dims) > 1:
            largest = dims.index(max(dims))
            dims[largest] = max(1, dims[largest] // 2)
        shapes.append((*dims, schedule))
        spent += cost
    return shapes, spent


# ------------------------------------------------------------------------------- the test
@pytest.mark.parametrize("case", SELECTED, ids=[case.name for case in SELECTED])
def test_random_gemms(case, monkeypatch, request):
    config = case.config
    full = "" if case.fast else " NPU_FULL=1"
    command = (f"NPU_SEED={BASE_SEED}{full} .venv/bin/pytest "
               f"'tb/test_stress.py::{request.node.name}'")
    print(f"case {case.name}: seed {case.seed} (NPU_SEED={BASE_SEED}); reproduce: {command}")
    wait = WAIT
    if case.backpressure:
        monkeypatch.setenv("NPU_BACKPRESSURE", str(case.seed))
        wait = WAIT_BACKPRESSURE
    rng = np.random.default_rng(case.seed)
    shapes, estimate = _draw_shapes(case, rng)

    gemms = []
    for index, (m, k, n, schedule) in enumerate(shapes):
        operand_rng = np.random.default_rng([case.seed, index])
        kinds = FIRST_PAIRS[index] if index < len(FIRST_PAIRS) else (_kind(rng), _kind(rng))
        a = _matrix(operand_rng, kinds[0], m, k)
        b = _matrix(operand_rng, kinds[1], k, n)
        job = prepare_gemm(a, b, config=config, schedule=schedule)
        bound = program_bound(config, job.program.words, wait) + instruction_bound(config, 0,
                                                                                    wait)
        gemms.append((job, a, b, kinds, schedule, bound))
        print(f"  gemm {index}: {m}x{k}x{n}, A {kinds[0]}, B {kinds[1]}, "
              f"{job.program.plan.schedule}, {len(job.program)} instructions")

    started = time.perf_counter()
    try:
        results = run_programs(config, case.sim,
                               [(job.dram, job.layout.program_addr, len(job.program))
                                for job, *_ in gemms],
                               timeout_cycles=[bound + 1000 for *_, bound in gemms])
    except AssertionError as error:
        raise AssertionError(f"{error}\nreproduce: {command}") from None
    seconds = time.perf_counter() - started

    cycles = macs = 0
    for index, ((job, a, b, kinds, schedule, bound), result) in enumerate(zip(gemms,
                                                                               results)):
        m, k, n = a.shape[0], a.shape[1], b.shape[1]
        where = (f"gemm {index} of {len(gemms)}: {m}x{k}x{n}, A {kinds[0]}, B {kinds[1]}, "
                 f"{schedule} schedule, on {config.name} ({config.bus_width}-bit bus) under "
                 f"{case.sim}{' with back-pressure' if case.backpressure else ''}; "
                 f"seed {case.seed}\nreproduce: {command}")
        assert result.done, f"{where}: stopped with {result.error_code.name} at " \
                            f"instruction {result.error_pc}"
        c = job.finish(result, config, case.sim).c
        expected = reference_gemm(a, b)
        wrong = np.argwhere(c != expected)
        assert wrong.size == 0, (f"{where}: C differs in {len(wrong)} elements, first at "
                                 f"{wrong[:4].tolist()}")
        layout = job.layout
        untouched = np.ones(len(job.dram), bool)
        untouched[layout.c_addr:layout.c_addr + layout.c_bytes] = False
        moved = np.flatnonzero((result.dram != job.dram) & untouched)
        assert moved.size == 0, f"{where}: DRAM outside C changed at {moved[:8].tolist()}"
        assert result.cycles <= bound, f"{where}: {result.cycles} cycles, bound {bound}"
        assert result.instructions == len(job.program), where
        cycles += result.cycles
        macs += m * k * n
    print(f"case {case.name}: {len(gemms)} GEMMs, {macs} MACs, {cycles} cycles "
          f"(estimated {estimate}), {seconds:.1f} s of simulation "
          f"({cycles / seconds:.0f} cycles/s)")
