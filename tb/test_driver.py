"""The driver, end to end on the model: random shapes bit-exact, and every bad input refused."""

import sys

import numpy as np
import pytest

from hw.config import MAX_K, NPUConfig
from hw.isa import ErrorCode
from sim.result import RunResult
from sw import backend
from sw.driver import (DRAM_GRANULE, POISON, PROGRAM_ADDR, REGION_ALIGN, ROW_PITCH,
                       GemmResult, gemm, layout_dram, reference_gemm)
from sw.errors import (BackendUnavailable, NPUError, NPURunError, NPUTypeError,
                       NPUValueError, PlanError)


def one_at_a_time(run_program):
    """A stand-in for ``backend.run_programs`` built from a one-program function."""
    return lambda config, sim, programs: [run_program(config, sim, *program)
                                          for program in programs]


CONFIG_NAMES = ["1x1", "3x5", "4x4", "8x8", "16x16"]
SEED = 20240601


def random_int8(rng, shape):
    # endpoint=True: the whole INT8 range, -128 and 127 included.
    return rng.integers(-128, 127, size=shape, dtype=np.int8, endpoint=True)


def shape_cases():
    """(config, m, k, n, seed) cases: edge shapes for every config, then random ones."""
    cases = []
    rng = np.random.default_rng(SEED)
    for config_name in CONFIG_NAMES:
        config = NPUConfig.from_name(config_name)
        rows, cols = config.rows, config.cols
        fixed = [
            (1, 1, 1),
            (7, 13, 11),                       # primes
            (1, 10 * rows + 3, 2),             # K >> R
            (3, 5, 10 * cols + 1),             # N >> C
            (600, 19, 9),                      # M >> R, C and > acc_depth (512)
            (rows, rows, cols),                # exactly one tile
        ]
        randoms = [tuple(int(value) for value in rng.integers(1, 90, size=3))
                   for _ in range(5)]
        for m, k, n in fixed + randoms:
            cases.append((config_name, m, k, n, SEED + len(cases)))
    return cases


@pytest.mark.parametrize("config_name, m, k, n, seed", shape_cases(),
                         ids=lambda value: str(value))
def test_random_shapes_bit_exact(config_name, m, k, n, seed):
    print(f"seed {seed}: {m}x{k} @ {k}x{n} on {config_name}")
    rng = np.random.default_rng(seed)
    a, b = random_int8(rng, (m, k)), random_int8(rng, (k, n))
    a_before, b_before = a.copy(), b.copy()
    result = gemm(a, b, NPUConfig.from_name(config_name), sim="model")
    assert isinstance(result, GemmResult)
    assert result.c.dtype == np.int32 and result.c.shape == (m, n)
    assert np.array_equal(result.c, reference_gemm(a, b))
    assert np.array_equal(a, a_before) and np.array_equal(b, b_before)
    assert result.instructions == result.plan.instructions
    assert result.cycles is None and result.utilization is None
    assert result.weight_tiles == -(-k // result.config.rows) * -(-n // result.config.cols)


def test_at_least_fifty_shapes():
    assert len(shape_cases()) >= 50


@pytest.mark.parametrize("config_name", CONFIG_NAMES)
def test_int8_extremes(config_name):
    config = NPUConfig.from_name(config_name)
    m, k, n = 9, 2 * config.rows + 1, 2 * config.cols + 1
    all_min = np.full((m, k), -128, dtype=np.int8)
    # -128 * -128 everywhere: the largest products.
    result = gemm(all_min, np.full((k, n), -128, dtype=np.int8), config)
    assert np.all(result.c == 16384 * k)
    # -128 * 127 everywhere: the most negative products.
    result = gemm(all_min, np.full((k, n), 127, dtype=np.int8), config)
    assert np.all(result.c == -128 * 127 * k)
    # A checkerboard of both extremes.
    extremes = np.where(np.indices((k, n)).sum(axis=0) % 2, -128, 127).astype(np.int8)
    result = gemm(all_min, extremes, config)
    assert np.array_equal(result.c, reference_gemm(all_min, extremes))


@pytest.mark.parametrize("config_name, m, n", [("1x1", 1, 1), ("4x4", 2, 3), ("8x8", 3, 5)])
def test_max_k_all_minus_128(config_name, m, n):
    # The largest sum that must not overflow: 131071 * 16384 = 2_147_467_264.
    a = np.full((m, MAX_K), -128, dtype=np.int8)
    b = np.full((MAX_K, n), -128, dtype=np.int8)
    result = gemm(a, b, NPUConfig.from_name(config_name))
    assert np.all(result.c == MAX_K * 16384)
    assert result.c.max() == 2_147_467_264


def test_max_k_random():
    seed = SEED + 1000
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    a, b = random_int8(rng, (2, MAX_K)), random_int8(rng, (MAX_K, 9))
    result = gemm(a, b, NPUConfig.from_name("8x8"))
    assert np.array_equal(result.c, reference_gemm(a, b))


@pytest.mark.parametrize("schedule", ["resident", "streaming"])
def test_schedules_agree(schedule):
    seed = SEED + 2000
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    a, b = random_int8(rng, (45, 37)), random_int8(rng, (37, 29))
    config = NPUConfig(rows=4, cols=4, spad_depth=64, acc_depth=16)
    result = gemm(a, b, config, schedule=schedule)
    assert result.plan.schedule == schedule
    assert np.array_equal(result.c, reference_gemm(a, b))


def test_non_contiguous_inputs():
    seed = SEED + 3000
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    a = random_int8(rng, (20, 30))[:, ::2]
    b = np.asfortranarray(random_int8(rng, (15, 7)))
    assert np.array_equal(gemm(a, b).c, reference_gemm(a, b))
    assert np.array_equal(gemm(b.T, a.T).c, reference_gemm(b.T, a.T))


def test_default_config_is_8x8():
    a = np.ones((2, 3), dtype=np.int8)
    result = gemm(a, np.ones((3, 4), dtype=np.int8))
    assert result.config == NPUConfig()
    assert result.sim == "model"
    assert np.all(result.c == 3)


# DRAM layout ----------------------------------------------------------------------------------

def test_dram_layout(monkeypatch):
    # A stand-in RTL backend: records what the driver hands over, runs the model, and reports
    # a cycle count so that the utilization can be checked.
    seen = {}
    run_on_model = backend.run_program

    def fake_run_program(config, sim, dram, prog_addr, prog_len):
        seen.update(dram=dram.copy(), prog_addr=prog_addr, prog_len=prog_len, sim=sim)
        result = run_on_model(config, "model", dram, prog_addr, prog_len)
        result.cycles = 1000
        return result

    monkeypatch.setattr(backend, "run_programs", one_at_a_time(fake_run_program))
    a = np.arange(-50, 50, dtype=np.int8).reshape(10, 10)
    b = np.arange(0, 30, dtype=np.int8).reshape(10, 3)
    result = gemm(a, b, NPUConfig.from_name("4x4"), sim="verilator")
    layout = result.layout
    dram = seen["dram"]
    assert seen["sim"] == "verilator"
    assert seen["prog_addr"] == layout.program_addr == PROGRAM_ADDR != 0
    assert seen["prog_len"] == result.plan.instructions
    assert layout.program_bytes == 16 * result.plan.instructions
    for addr in (layout.program_addr, layout.a_addr, layout.b_addr, layout.c_addr):
        assert addr % REGION_ALIGN == 0
    # Rows of A and B are padded to ROW_PITCH bytes (zeros); C is not.
    assert (layout.a_stride, layout.b_stride) == (16, 16) == (ROW_PITCH, ROW_PITCH)
    assert (layout.a_bytes, layout.b_bytes) == (10 * 16, 10 * 16)
    assert (layout.program_addr + layout.program_bytes <= layout.a_addr
            < layout.a_addr + layout.a_bytes <= layout.b_addr
            < layout.b_addr + layout.b_bytes <= layout.c_addr)
    assert dram.size == layout.size and layout.size % DRAM_GRANULE == 0
    assert layout.size >= layout.c_addr + 4 * 30
    assert not dram[:PROGRAM_ADDR].any()
    a_rows = dram[layout.a_addr:layout.a_addr + layout.a_bytes].reshape(10, 16)
    b_rows = dram[layout.b_addr:layout.b_addr + layout.b_bytes].reshape(10, 16)
    assert np.array_equal(a_rows[:, :10].view(np.int8), a) and not a_rows[:, 10:].any()
    assert np.array_equal(b_rows[:, :3].view(np.int8), b) and not b_rows[:, 3:].any()
    assert np.all(dram[layout.c_addr:layout.c_addr + 120] == POISON)
    # Cycles from the backend give the utilization.
    assert result.cycles == 1000
    assert result.macs == 10 * 10 * 3
    assert result.utilization == 300 / (1000 * 16)
    assert np.array_equal(result.c, reference_gemm(a, b))


def test_layout_too_big_for_32_bits():
    with pytest.raises(NPUValueError, match="4 GiB"):
        layout_dram(70_000, 70_000, 1, 10)


# Bad input ------------------------------------------------------------------------------------

GOOD_A = np.ones((2, 3), dtype=np.int8)
GOOD_B = np.ones((3, 4), dtype=np.int8)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16, np.int32, np.int64,
                                   np.uint8, np.bool_])
@pytest.mark.parametrize("which", ["A", "B"])
def test_rejects_non_int8(which, dtype):
    a = GOOD_A.astype(dtype) if which == "A" else GOOD_A
    b = GOOD_B.astype(dtype) if which == "B" else GOOD_B
    with pytest.raises(NPUTypeError, match=f"{which} must have dtype int8, not "
                                           f"{np.dtype(dtype).name}"):
        gemm(a, b)


def test_rejects_non_arrays():
    with pytest.raises(NPUTypeError, match="A must be a numpy array of int8, not list"):
        gemm([[1, 2, 3]], GOOD_B)
    with pytest.raises(TypeError):   # NPUTypeError is a TypeError
        gemm(GOOD_A, 3)


@pytest.mark.parametrize("shape", [(3,), (1, 2, 3), ()])
def test_rejects_not_two_dimensional(shape):
    with pytest.raises(NPUValueError, match="A must be two-dimensional"):
        gemm(np.zeros(shape, dtype=np.int8), GOOD_B)


@pytest.mark.parametrize("a_shape, b_shape", [((0, 3), (3, 4)), ((2, 3), (3, 0)),
                                              ((2, 0), (0, 4))])
def test_rejects_empty(a_shape, b_shape):
    with pytest.raises(NPUValueError, match="must not be empty"):
        gemm(np.zeros(a_shape, dtype=np.int8), np.zeros(b_shape, dtype=np.int8))


def test_rejects_mismatched_k():
    with pytest.raises(NPUValueError, match=r"A is 2x3 and B is 4x5"):
        gemm(GOOD_A, np.ones((4, 5), dtype=np.int8))


def test_rejects_k_above_max_k():
    with pytest.raises(NPUValueError, match="131072.*MAX_K = 131071.*overflow"):
        gemm(np.ones((1, MAX_K + 1), dtype=np.int8), np.ones((MAX_K + 1, 1), dtype=np.int8))


def test_rejects_bad_sim_and_config():
    with pytest.raises(NPUValueError, match="sim must be one of verilator, icarus, model"):
        gemm(GOOD_A, GOOD_B, sim="spice")
    with pytest.raises(NPUTypeError, match="config must be an NPUConfig"):
        gemm(GOOD_A, GOOD_B, config="8x8")


def test_rejects_unplaceable_config():
    with pytest.raises(PlanError, match="cannot hold a weight tile"):
        gemm(GOOD_A, GOOD_B, config=NPUConfig(rows=4, cols=4, spad_depth=4))


def test_errors_share_one_base():
    for error in (NPUTypeError, NPUValueError, PlanError, NPURunError, BackendUnavailable):
        assert issubclass(error, NPUError)


def test_program_error_is_reported(monkeypatch):
    def failing_run_program(config, sim, dram, prog_addr, prog_len):
        return RunResult(done=False, error_code=ErrorCode.BUS_WRITE, error_pc=7, cycles=55,
                         instructions=7, dram=dram.copy())

    monkeypatch.setattr(backend, "run_programs", one_at_a_time(failing_run_program))
    with pytest.raises(NPURunError, match="BUS_WRITE at instruction 7") as caught:
        gemm(GOOD_A, GOOD_B)
    assert caught.value.error_code is ErrorCode.BUS_WRITE
    assert caught.value.error_pc == 7


def test_missing_rtl_backend(monkeypatch):
    # None in sys.modules makes the import fail, as if sim.runner were not installed.
    monkeypatch.setitem(sys.modules, "sim.runner", None)
    with pytest.raises(BackendUnavailable, match="sim.runner"):
        gemm(GOOD_A, GOOD_B, sim="icarus")


def test_missing_simulator(monkeypatch):
    """A simulator that is not installed is BackendUnavailable, saying how to install it."""
    from sim import toolchain
    monkeypatch.setattr(toolchain.shutil, "which", lambda name: None)
    with pytest.raises(BackendUnavailable, match="Icarus Verilog is not installed: run 'sudo "
                                                 "apt-get install -y iverilog'"):
        gemm(GOOD_A, GOOD_B, sim="icarus")


def test_reference_gemm_equals_integer_matmul():
    """reference_gemm's float64 path is exact: the extremes at MAX_K and random shapes equal
    numpy's int32 matmul (seed printed)."""
    from hw.config import MAX_K
    from sw.driver import reference_gemm
    for value in (-128, 127):
        a = np.full((2, MAX_K), value, np.int8)
        b = np.full((MAX_K, 3), -128, np.int8)
        assert np.array_equal(reference_gemm(a, b), a.astype(np.int32) @ b.astype(np.int32))
    seed = 1203
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    for _ in range(20):
        m, k, n = (int(x) for x in rng.integers(1, 200, size=3))
        a = rng.integers(-128, 128, size=(m, k), dtype=np.int8)
        b = rng.integers(-128, 128, size=(k, n), dtype=np.int8)
        want = a.astype(np.int32) @ b.astype(np.int32)
        got = reference_gemm(a, b)
        assert got.dtype == np.int32 and np.array_equal(got, want), f"{m}x{k}x{n}"
