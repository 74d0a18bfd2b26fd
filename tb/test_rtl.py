"""The generated Verilog under Verilator and Icarus, through cocotb, with real AXI models.

Each (simulator, config) builds once (cached in ``build/sim``) and runs its GEMMs in one
simulation, one program after another without a reset, checked bit-exactly against numpy.
Set ``NPU_SEED`` to reproduce a run; the seed of every case is in its failure message.
"""

import os

import numpy as np
import pytest

from hw.config import NPUConfig
from sim.runner import run_cocotb
from sw.driver import gemm_batch, reference_gemm


pytestmark = pytest.mark.rtl

SIMULATORS = ["verilator", "icarus"]
CONFIGS = ["3x5", "4x4", "8x8"]
BASE_SEED = int(os.environ.get("NPU_SEED", "20261202"))


def _shapes(config, sim, rng):
    """Shapes with 1s, primes, K >> R, N >> C, M >> both, and random ones."""
    r, c = config.rows, config.cols
    shapes = [
        (1, 1, 1), (1, 2 * r + 1, 1), (2, 1, 2 * c + 3), (7, 13, 11),
        (3, 9 * r + 2, 5),          # K much larger than R
        (5, 7, 9 * c + 4),          # N much larger than C
        (97, 5, 3),                 # M much larger than R and C
        (r, r, c), (r + 1, r + 1, c + 1),
    ]
    limit = 24 if sim == "icarus" else 60
    for _ in range(2 if sim == "icarus" else 4):
        shapes.append(tuple(int(v) for v in rng.integers(1, limit, size=3)))
    return shapes


def _operands(m, k, n, rng, case):
    if case == 0:
        # The corner of the INT8 range: every product is (-128) * (-128).
        return np.full((m, k), -128, np.int8), np.full((k, n), -128, np.int8)
    return (rng.integers(-128, 128, size=(m, k), dtype=np.int8),
            rng.integers(-128, 128, size=(k, n), dtype=np.int8))


@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("sim", SIMULATORS)
def test_gemms_bit_exact(sim, config_name):
    config = NPUConfig.from_name(config_name)
    seed = BASE_SEED + sum(map(ord, sim + config_name))
    print(f"seed {seed} (NPU_SEED={BASE_SEED})")
    rng = np.random.default_rng(seed)
    shapes = _shapes(config, sim, rng)
    pairs = [_operands(m, k, n, rng, case) for case, (m, k, n) in enumerate(shapes)]
    results = gemm_batch(pairs, config=config, sim=sim)
    for (m, k, n), (a, b), result in zip(shapes, pairs, results):
        expected = reference_gemm(a, b)
        assert result.c.dtype == np.int32
        assert np.array_equal(result.c, expected), (
            f"{m}x{k}x{n} on {config_name} under {sim} differs (seed {seed})")
        assert result.cycles > 0


@pytest.mark.parametrize("sim", SIMULATORS)
def test_top_level(sim):
    run_cocotb(NPUConfig(rows=2, cols=3, spad_depth=64, acc_depth=16), sim, "tb.cocotb_top")
