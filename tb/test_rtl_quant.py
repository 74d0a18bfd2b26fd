"""Quantized GEMMs and convolutions on the generated Verilog, bit-exact against the numpy
references (``sw.driver.reference_qgemm``, ``sw.conv.reference_conv2d``).

Set ``NPU_SEED`` to reproduce a run; every failure message carries the seed.
"""

import os

import numpy as np
import pytest

from hw.config import NPUConfig
from quant_cases import float_ties, random_conv_problem, random_qgemm_problem
from sw.conv import conv2d_batch, reference_conv2d
from sw.driver import qgemm_batch, reference_qgemm


pytestmark = pytest.mark.rtl

SIMULATORS = ["verilator", "icarus"]
BASE_SEED = int(os.environ.get("NPU_SEED", "4"))
FULL = os.environ.get("NPU_FULL") == "1"


@pytest.mark.parametrize("config_name", ["3x5", "4x4"])
@pytest.mark.parametrize("sim", SIMULATORS)
def test_qgemm(sim, config_name):
    config = NPUConfig.from_name(config_name)
    seed = BASE_SEED + sum(map(ord, sim + config_name))
    rng = np.random.default_rng(seed)
    shapes = [(1, 1, 1), (7, 13, 11), (20, 3 * config.rows + 1, 2 * config.cols + 1)]
    shapes += [tuple(int(v) for v in rng.integers(1, 30, 3)) for _ in range(4)]
    problems = [random_qgemm_problem(rng, m, k, n) for m, k, n in shapes]
    results = qgemm_batch(problems, config=config, sim=sim)
    for (m, k, n), problem, result in zip(shapes, problems, results):
        want = reference_qgemm(**problem)
        assert result.y.dtype == np.int8
        assert np.array_equal(result.y, want), f"{m}x{k}x{n} on {config_name}, seed {seed}"


# (batch, height, width, C_in, C_out, kernel, stride, padding)
CONVS = [
    (1, 5, 6, 3, 4, 3, 1, 1),
    (2, 7, 5, 5, 6, 3, 2, 1),
    (1, 6, 6, 4, 3, 1, 1, 0),
    (1, 9, 8, 2, 5, 5, 2, 2),
    (1, 4, 7, 6, 2, (1, 3), 1, (0, 0, 1, 1)),
    (1, 6, 6, 3, 3, 3, 1, 0),
]


@pytest.mark.parametrize("sim, lowering", [(sim, "taps") for sim in SIMULATORS] +
                         [(sim, "kernel_rows") for sim in ["verilator"] +
                          (["icarus"] if FULL else [])])
def test_conv2d(sim, lowering):
    config = NPUConfig.from_name("4x4")
    seed = BASE_SEED + sum(map(ord, sim))
    rng = np.random.default_rng(seed)
    problems = [random_conv_problem(rng, *shape) for shape in CONVS]
    results = conv2d_batch(problems, config=config, sim=sim, lowering=lowering)
    for shape, problem, result in zip(CONVS, problems, results):
        want = reference_conv2d(**problem)
        assert result.y.shape == want.shape
        assert np.array_equal(result.y, want), \
            f"conv {shape} under {sim}, lowering {lowering}, seed {seed}"


@pytest.mark.parametrize("sim", ["verilator"] + (["icarus"] if FULL else []))
def test_seeds_pointwise_layer(sim):
    """Seeds section 4.1: a 1x1 convolution, C_in = C_out = 100 on a 56 x 56 map, on 16x16
    (with the 128-bit bus that feeds it a row per cycle, the build tb/test_timing.py has).
    Icarus (``NPU_FULL=1``) runs the same layer on a 14 x 14 map: the whole map took it
    more than 15 minutes, the critical path of ``make test-full``."""
    config = NPUConfig.from_name("16x16", bus_width=128)
    rng = np.random.default_rng(BASE_SEED)
    side = 56 if sim == "verilator" else 14
    problem = random_conv_problem(rng, 1, side, side, 100, 100, 1)
    result = conv2d_batch([problem], config=config, sim=sim)[0]
    want = reference_conv2d(**problem)
    assert result.y.shape == (1, side, side, 100)
    assert np.array_equal(result.y, want), f"seed {BASE_SEED}"
    assert result.cycles > 0
    print(f"pointwise {side}x{side}x100 -> 100 on 16x16 under {sim}: {result.cycles} cycles")


@pytest.mark.parametrize("sim", ["verilator"] + (["icarus"] if FULL else []))
def test_float_mode(sim):
    """onnxruntime's requantization (LOAD_QUANT's float mode, ``scale=``): GEMMs and
    convolutions in one run, a fixed-point GEMM among them, bit-exact against
    ``requantize_float``'s references."""
    from sw.conv import prepare_conv2d
    from sw.driver import prepare_qgemm, run_jobs
    config = NPUConfig.from_name("4x4")
    seed = BASE_SEED + 17
    rng = np.random.default_rng(seed)
    gemms = [random_qgemm_problem(rng, m, k, n, float_mode=True)
             for m, k, n in [(1, 1, 1), (9, 13, 11), (20, 9, 5)]]
    gemms.insert(1, random_qgemm_problem(rng, 7, 6, 5))
    convs = [random_conv_problem(rng, *shape, float_mode=True) for shape in CONVS[:3]]
    jobs = ([prepare_qgemm(**problem, config=config) for problem in gemms] +
            [prepare_conv2d(**problem, config=config) for problem in convs])
    results = run_jobs(jobs, config, sim)
    wants = [reference_qgemm(**problem) for problem in gemms] + \
        [reference_conv2d(**problem) for problem in convs]
    for index, (result, want) in enumerate(zip(results, wants)):
        assert np.array_equal(result.y, want), f"job {index} under {sim}, seed {seed}"


def test_quantized_layers_on_1x1():
    """Quantized GEMMs on the 1x1 array under Verilator, in both modes: no other RTL test runs
    LOAD_QUANT and STORE_Q there, and on one lane their Verilog is its own (the store unit's
    streaming state and row select, the load unit's float check). The last GEMM's columns
    are :func:`float_ties`, each pair's accumulator as the bias and its scale, in three
    rows (A = 0, 1, -1, B all ones: acc, acc + 1, acc - 1); among them products that are a
    half integer only after their float32 rounding, which carries into the half bit (the
    requantizer's ``rounds_up`` takes its other arm; random scales never got there).
    Bit-exact against ``reference_qgemm``. For `make coverage`."""
    config = NPUConfig.from_name("1x1", bus_width=128)
    seed = BASE_SEED + 11
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    accs, scales = zip(*float_ties())
    ties = dict(A=np.array([[0], [1], [-1]], dtype=np.int8),
                B=np.ones((1, len(accs)), dtype=np.int8),
                bias=np.array(accs, dtype=np.int32), scale=np.array(scales, dtype=np.float32),
                out_zero_point=0, act_min=-128, act_max=127, a_zero_point=0)
    problems = [random_qgemm_problem(rng, 5, 3, 4),
                random_qgemm_problem(rng, 4, 6, 3, float_mode=True), ties]
    results = qgemm_batch(problems, config=config, sim="verilator")
    for index, (problem, result) in enumerate(zip(problems, results)):
        want = reference_qgemm(**problem)
        wrong = np.argwhere(result.y != want)
        assert not len(wrong), (f"problem {index} on 1x1, seed {seed}: {len(wrong)} outputs "
                                f"wrong, first at {wrong[0].tolist()}")


@pytest.fixture(scope="module")
def digits_network():
    from sw.nn.quantize import quantize_network
    from sw.nn.train import train_digits
    network, data, _ = train_digits(0)
    return data, quantize_network(network, data.x_train)


@pytest.mark.parametrize("sim", SIMULATORS)
def test_digits_network_one_program(sim, digits_network):
    """The seeds' network, every NPU layer in one program, equals the INT8 reference."""
    from sw.nn.reference import run_reference
    from sw.nn.runtime import run_network
    data, qnet = digits_network
    images = data.x_test[:24 if sim == "verilator" else 6]
    result = run_network(qnet, images, config=NPUConfig.from_name("8x8"), sim=sim,
                         batch=len(images), mode="fused")
    reference = run_reference(qnet, images)
    assert result.programs == 1
    assert np.array_equal(result.logits, reference["dense"])
    assert result.cycles > 0
