"""The quantized GEMM: compiler, driver and reference, on the model backend (and in the float
mode also on the whole NPU in Amaranth's simulator)."""

import numpy as np
import pytest

from hw.config import MAX_K, NPUConfig
from hw.isa import ErrorCode, Opcode, QuantMode
from quant_cases import random_conv_problem, random_int8, random_qgemm_problem
from sim.result import RunResult
from sw import backend, codec
from sw.compiler import Plan, Program, compile_qgemm, plan_qgemm
from sw.driver import (POISON, PROGRAM_ADDR, REGION_ALIGN, DRAM_GRANULE, QuantResult,
                       fold_zero_point, prepare_gemm, prepare_qgemm, qgemm, qgemm_batch,
                       reference_gemm, reference_qgemm, run_jobs, wrap_int32)
from sw.errors import NPURunError, NPUTypeError, NPUValueError, PlanError
from sw.quant import INT32_MAX, INT32_MIN, requantize


SEED = 20240918
CONFIG_NAMES = ["1x1", "3x5", "4x4", "8x8", "16x16"]


def one_at_a_time(run_program):
    """A stand-in for ``backend.run_programs`` built from a one-program function."""
    return lambda config, sim, programs: [run_program(config, sim, *program)
                                          for program in programs]


def check(problem, config, **options):
    """Run one problem on the model and compare it with the reference, bit for bit."""
    result = qgemm(**problem, config=config, **options)
    expected = reference_qgemm(**problem)
    assert isinstance(result, QuantResult)
    assert result.y.dtype == np.int8 and result.y.shape == expected.shape
    assert np.array_equal(result.y, expected)
    assert result.instructions == result.plan.instructions
    return result


# Bit-exact on random shapes -------------------------------------------------------------------

def shape_cases():
    cases = []
    rng = np.random.default_rng(SEED)
    for config_name in CONFIG_NAMES:
        config = NPUConfig.from_name(config_name)
        rows, cols = config.rows, config.cols
        fixed = [(1, 1, 1), (7, 13, 11), (3, 4 * rows + 3, 2 * cols + 1), (600, 9, cols)]
        randoms = [tuple(int(value) for value in rng.integers(1, 60, size=3))
                   for _ in range(2)]
        for m, k, n in fixed + randoms:
            cases.append((config_name, m, k, n, SEED + len(cases)))
    return cases


@pytest.mark.parametrize("config_name, m, k, n, seed", shape_cases(),
                         ids=lambda value: str(value))
def test_random_shapes_bit_exact(config_name, m, k, n, seed):
    print(f"seed {seed}: {m}x{k} @ {k}x{n} on {config_name}")
    rng = np.random.default_rng(seed)
    problem = random_qgemm_problem(rng, m, k, n)
    before = {name: np.copy(value) for name, value in problem.items()}
    result = check(problem, NPUConfig.from_name(config_name))
    # The outputs are spread over the range, not stuck at the clamp.
    assert m * n < 20 or len(np.unique(result.y)) > 10
    for name, value in problem.items():
        assert np.array_equal(value, before[name]), name   # the inputs are not modified
    assert result.cycles is None and result.utilization is None


@pytest.mark.parametrize("a_zero_point", [-128, -1, 0, 1, 127])
def test_input_zero_points(a_zero_point):
    seed = SEED + 100 + a_zero_point
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    check(random_qgemm_problem(rng, 19, 21, 13, a_zero_point=a_zero_point),
          NPUConfig.from_name("4x4"))


def test_extreme_requantization_parameters():
    # Multipliers and shifts at their limits, all zero points, every kind of clamp.
    seed = SEED + 200
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    m, k, n = 9, 11, 70
    config = NPUConfig.from_name("8x8")
    a, b = random_int8(rng, (m, k)), random_int8(rng, (k, n))
    multiplier = rng.integers(INT32_MIN, INT32_MAX, n, endpoint=True).astype(np.int32)
    multiplier[:6] = [INT32_MIN, INT32_MAX, 0, 1, -1, 1 << 30]
    shift = np.resize(np.arange(-31, 32), n).astype(np.int32)
    bias = rng.integers(INT32_MIN // 2, INT32_MAX // 2, n).astype(np.int32)
    bias[:4] = [INT32_MIN + 10_000_000, INT32_MAX - 10_000_000, 0, -1]
    for out_zero_point, act_min, act_max in [(0, -128, 127), (-128, -128, 127),
                                             (127, -128, 127), (5, -3, 3), (0, 7, 7),
                                             (-60, -128, -100), (60, 100, 127)]:
        check(dict(A=a, B=b, bias=bias, multiplier=multiplier, shift=shift,
                   out_zero_point=out_zero_point, act_min=act_min, act_max=act_max,
                   a_zero_point=int(rng.integers(-128, 128))), config)


def test_identity_requantization_gives_the_clamped_sum():
    # Multiplier 2**30 with shift -1 is exactly x: Y is the clamped INT32 sum.
    seed = SEED + 300
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    a = rng.integers(-3, 4, (30, 10), dtype=np.int8)
    b = rng.integers(-3, 4, (10, 12), dtype=np.int8)
    bias = rng.integers(-20, 21, 12).astype(np.int32)
    ones = np.full(12, 1 << 30, dtype=np.int32)
    minus_one = np.full(12, -1, dtype=np.int32)
    result = qgemm(a, b, bias, ones, minus_one, out_zero_point=0, act_min=-128, act_max=127,
                   a_zero_point=2, config=NPUConfig.from_name("4x4"))
    exact = (a.astype(np.int32) - 2) @ b.astype(np.int32) + bias
    assert np.abs(exact).max() < 128
    assert np.array_equal(result.y, exact)


def test_accumulator_wraps_like_the_reference():
    # bias + A @ B runs past INT32_MAX: the accumulator wraps around, and the reference too.
    k, n = 200, 3
    a = np.full((2, k), 127, dtype=np.int8)
    b = np.full((k, n), 127, dtype=np.int8)
    bias = np.full(n, INT32_MAX - 1000, dtype=np.int32)
    multiplier = np.full(n, 1 << 30, dtype=np.int32)
    shift = np.full(n, 24, dtype=np.int32)
    problem = dict(A=a, B=b, bias=bias, multiplier=multiplier, shift=shift,
                   out_zero_point=0, act_min=-128, act_max=127)
    expected = reference_qgemm(**problem)
    wrapped = INT32_MAX - 1000 + 127 * 127 * k - (1 << 32)
    assert expected[0, 0] == requantize(np.array([[wrapped]]), 1 << 30, 24, 0, -128, 127)
    assert expected[0, 0] < 0
    check(problem, NPUConfig.from_name("4x4"))


def test_reference_equals_the_folded_form():
    # (A - za) @ B + bias and A @ B + (bias - za * B.sum(axis=0)) are the same integers.
    seed = SEED + 400
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    for _ in range(20):
        m, k, n = (int(value) for value in rng.integers(1, 40, 3))
        problem = random_qgemm_problem(rng, m, k, n)
        folded = fold_zero_point(problem["bias"], problem["B"].astype(np.int64).sum(axis=0),
                                 problem["a_zero_point"], "folded")
        acc = problem["A"].astype(np.int64) @ problem["B"].astype(np.int64) + folded
        folded_form = requantize(wrap_int32(acc), problem["multiplier"], problem["shift"],
                                 problem["out_zero_point"], problem["act_min"],
                                 problem["act_max"])
        assert np.array_equal(reference_qgemm(**problem), folded_form)


def test_reference_against_a_scalar_loop():
    seed = SEED + 500
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    problem = random_qgemm_problem(rng, 4, 6, 5)
    expected = reference_qgemm(**problem)
    for i in range(4):
        for j in range(5):
            acc = int(problem["bias"][j]) + sum(
                (int(problem["A"][i, t]) - problem["a_zero_point"]) * int(problem["B"][t, j])
                for t in range(6))
            value = requantize(np.array([[acc]]), problem["multiplier"][j],
                               problem["shift"][j], problem["out_zero_point"],
                               problem["act_min"], problem["act_max"])[0, 0]
            assert expected[i, j] == value


@pytest.mark.parametrize("schedule", ["resident", "streaming"])
def test_schedules_agree(schedule):
    seed = SEED + 600
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    config = NPUConfig(rows=4, cols=4, spad_depth=64, acc_depth=16)
    result = check(random_qgemm_problem(rng, 45, 37, 29), config, schedule=schedule)
    assert result.plan.schedule == schedule
    assert result.plan.m_blocks > 1


@pytest.mark.parametrize("config", [
    NPUConfig(rows=1, cols=1, spad_depth=2, acc_depth=1),
    NPUConfig(rows=3, cols=5, spad_depth=7, acc_depth=3),
    NPUConfig(rows=4, cols=2, spad_depth=16, acc_depth=5),
], ids=["1x1-tiny", "3x5-tiny", "4x2-small"])
def test_tiny_memories_still_exact(config):
    seed = SEED + 700
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    check(random_qgemm_problem(rng, 7, 5, 6), config)


def test_max_k():
    seed = SEED + 800
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    check(random_qgemm_problem(rng, 2, MAX_K, 3), NPUConfig.from_name("16x16"))


def test_non_contiguous_inputs():
    seed = SEED + 900
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    problem = random_qgemm_problem(rng, 20, 15, 7)
    problem["A"] = random_int8(rng, (20, 30))[:, ::2]
    problem["B"] = np.asfortranarray(problem["B"])
    problem["bias"] = np.repeat(problem["bias"], 2)[::2]
    check(problem, NPUConfig.from_name("4x4"))


# The program ----------------------------------------------------------------------------------

ADDRESSES = dict(a_addr=0x10000, b_addr=0x20000, bias_addr=0x30000, quant_addr=0x30100,
                 y_addr=0x40000)


def compile_at(config, m, k, n, schedule="auto", **quant):
    quant = dict(dict(out_zero_point=-5, act_min=-100, act_max=100), **quant)
    return compile_qgemm(config, m, k, n, **ADDRESSES, **quant, schedule=schedule)


def decoded(program):
    return [codec.decode(word) for word in program.words]


def of(program, opcode):
    return [fields for op, fields in decoded(program) if op is opcode]


def test_streaming_program_shape():
    config = NPUConfig.from_name("4x4")
    m, k, n = 6, 10, 9                                 # 3 k-tiles x 3 n-tiles
    program = compile_at(config, m, k, n, schedule="streaming")
    assert isinstance(program, Program) and isinstance(program.plan, Plan)
    ops = [op for op, _ in decoded(program)]
    per_k_tile = [Opcode.LOAD_SPAD, Opcode.PRELOAD, Opcode.LOAD_SPAD, Opcode.MATMUL]
    per_n_tile = [Opcode.LOAD_ACC] + per_k_tile * 3 + [Opcode.LOAD_QUANT, Opcode.STORE_Q]
    assert ops == per_n_tile * 3 + [Opcode.END]
    assert program.body == program.words[:-1]
    # The bias row is replicated into every accumulator row by a zero stride.
    assert of(program, Opcode.LOAD_ACC) == [
        dict(local_addr=0, rows=m, row_bytes=4 * width, dram_addr=ADDRESSES["bias_addr"]
             + 4 * n_start, dram_stride=0) for n_start, width in ((0, 4), (4, 4), (8, 1))]
    assert all(f["accumulate"] == 1 and f["rows"] == m for f in of(program, Opcode.MATMUL))
    # Multipliers and shifts of an n-tile: lanes n_start.. of two rows 4 N bytes apart.
    assert of(program, Opcode.LOAD_QUANT) == [
        dict(dram_addr=ADDRESSES["quant_addr"] + 4 * n_start, dram_stride=4 * n,
             row_bytes=4 * width, zero_point=-5, mode=QuantMode.FIXED, act_min=-100,
             act_max=100)
        for n_start, width in ((0, 4), (4, 4), (8, 1))]
    assert of(program, Opcode.STORE_Q) == [
        dict(acc_addr=0, rows=m, row_bytes=width, dram_addr=ADDRESSES["y_addr"] + n_start,
             dram_stride=n) for n_start, width in ((0, 4), (4, 4), (8, 1))]
    assert program.addresses == ADDRESSES


def test_one_n_tile_loads_the_quantization_once():
    config = NPUConfig(rows=4, cols=4, spad_depth=64, acc_depth=4)
    program = compile_at(config, 10, 5, 3, schedule="streaming")
    ops = [op for op, _ in decoded(program)]
    assert ops[0] is Opcode.LOAD_QUANT and ops.count(Opcode.LOAD_QUANT) == 1
    assert program.plan.m_blocks == 3
    assert [f["rows"] for f in of(program, Opcode.STORE_Q)] == [4, 4, 2]
    assert [f["dram_addr"] for f in of(program, Opcode.STORE_Q)] == [
        ADDRESSES["y_addr"] + 3 * row for row in (0, 4, 8)]


def test_plan_matches_program():
    for config_name in ("1x1", "3x5", "8x8"):
        for m, k, n in [(1, 1, 1), (9, 17, 6), (40, 3, 23)]:
            for schedule in ("auto", "resident", "streaming"):
                config = NPUConfig.from_name(config_name)
                plan = plan_qgemm(config, m, k, n, schedule=schedule)
                program = compile_at(config, m, k, n, schedule)
                assert program.plan == plan
                assert plan.instructions == len(program)
                reads = sum(f["rows"] * f["row_bytes"] for op in (Opcode.LOAD_SPAD,
                                                                   Opcode.LOAD_ACC)
                            for f in of(program, op))
                reads += sum(2 * f["row_bytes"] for f in of(program, Opcode.LOAD_QUANT))
                assert plan.dram_bytes_read == reads
                assert plan.dram_bytes_written == m * n
                assert (plan.m, plan.k, plan.n, plan.taps) == (m, k, n, 1)
                assert plan.macs == m * k * n
                assert len(of(program, Opcode.PRELOAD)) == plan.weight_loads
                assert str(plan.weight_tiles) in plan.summary()


def test_compile_rejects_bad_operands():
    config = NPUConfig.from_name("4x4")
    with pytest.raises(NPUValueError, match="out_zero_point"):
        compile_at(config, 2, 2, 2, out_zero_point=128)
    with pytest.raises(NPUValueError, match="act_min must not exceed act_max"):
        compile_at(config, 2, 2, 2, act_min=3, act_max=2)
    with pytest.raises(NPUTypeError, match="act_max"):
        compile_at(config, 2, 2, 2, act_max=1.5)
    with pytest.raises(PlanError, match="y_addr"):
        compile_qgemm(config, 4, 4, 4, **dict(ADDRESSES, y_addr=(1 << 32) - 8),
                      out_zero_point=0, act_min=-128, act_max=127)
    with pytest.raises(PlanError, match="cannot hold a weight tile"):
        plan_qgemm(NPUConfig(rows=4, cols=4, spad_depth=4), 1, 1, 1)
    with pytest.raises(NPUValueError, match="^m must"):
        plan_qgemm(config, 0, 1, 1)


# The float mode (scale=) ---------------------------------------------------------------------

@pytest.mark.parametrize("config_name", ["1x1", "3x5", "8x8"])
def test_float_mode_random_shapes_bit_exact(config_name):
    seed = SEED + 2000 + CONFIG_NAMES.index(config_name)
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    config = NPUConfig.from_name(config_name)
    for m, k, n in [(1, 1, 1), (7, 13, 11), (20, 3 * config.rows + 1, 2 * config.cols + 1)]:
        problem = random_qgemm_problem(rng, m, k, n, float_mode=True)
        assert problem["multiplier"] is None and problem["shift"] is None
        result = check(problem, config)
        assert m * n < 20 or len(np.unique(result.y)) > 10


def test_float_mode_differs_from_the_fixed_point_mode_on_ties():
    # acc = 5 * column sum: scale 0.5 gives exact ties; onnxruntime rounds them to even,
    # TFLite's RoundingDivideByPOT away from zero.
    problem = dict(A=np.ones((1, 3), np.int8), B=np.array([[1, -1, 3, -3]] * 3, np.int8),
                   bias=np.array([2, -2, -4, 4], np.int32), out_zero_point=0, act_min=-128,
                   act_max=127)                     # accumulators 5, -5, 5, -5
    floating = qgemm(**problem, scale=np.full(4, 0.5, np.float32)).y
    fixed = qgemm(**problem, multiplier=np.full(4, 1 << 30, np.int32),
                  shift=np.zeros(4, np.int32)).y
    assert floating.tolist() == [[2, -2, 2, -2]]
    assert fixed.tolist() == [[3, -2, 3, -2]]      # SaturatingRoundingDoublingHighMul


def test_float_mode_program_and_quant_region():
    config = NPUConfig.from_name("4x4")
    program = compile_at(config, 5, 6, 9, quant_mode=QuantMode.FLOAT)
    loads = of(program, Opcode.LOAD_QUANT)
    assert len(loads) == 3 and all(f["mode"] == QuantMode.FLOAT for f in loads)
    assert all(f["mode"] == QuantMode.FIXED for f in of(compile_at(config, 5, 6, 9),
                                                         Opcode.LOAD_QUANT))
    # The rest of the program is the fixed-point mode's, word for word.
    fixed = compile_at(config, 5, 6, 9)
    assert [op for op, _ in decoded(program)] == [op for op, _ in decoded(fixed)]
    rng = np.random.default_rng(SEED + 2100)
    problem = random_qgemm_problem(rng, 5, 6, 9, float_mode=True)
    job = prepare_qgemm(**problem, config=config)
    region = job.dram[job.layout.span("quant")]
    assert np.array_equal(region[:36].view("<f4"), problem["scale"])
    assert not region[36:].any()


def test_compile_rejects_a_bad_quant_mode():
    with pytest.raises(NPUValueError, match="quant_mode must be one of"):
        compile_at(NPUConfig.from_name("4x4"), 2, 2, 2, quant_mode=2)


def run_on_amaranth(jobs, config, seed):
    """Run prepared jobs on the whole NPU in Amaranth's simulator (``sim.amaranth_sim``,
    with random bus stalls) and return each job's output region."""
    from sim import amaranth_sim
    runs = [amaranth_sim.Job(job.program.words, prog_addr=job.layout.program_addr,
                             data=[(0, job.dram.tobytes())]) for job in jobs]
    outcomes, _ = amaranth_sim.run_jobs(runs, config=config, seed=seed, timeout_cycles=200_000)
    outputs = []
    for job, outcome in zip(jobs, outcomes):
        assert outcome.code is ErrorCode.NONE, (outcome.code, outcome.error_pc)
        start, stop = job.layout.regions["y"][0], sum(job.layout.regions["y"])
        outputs.append(np.array([outcome.written[addr] for addr in range(start, stop)],
                                np.uint8).view(np.int8))
    return outputs


def test_float_mode_on_the_amaranth_simulator():
    """STORE_Q through the controller and the requantizer's float mode: GEMMs and a
    convolution in float mode, with a fixed-point GEMM between them on the same NPU (the
    mode is per LOAD_QUANT), bit-exact against the references."""
    from sw.conv import prepare_conv2d, reference_conv2d
    seed = SEED + 2200
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    config = NPUConfig.from_name("4x4")
    problems = [random_qgemm_problem(rng, 6, 9, 7, float_mode=True),
                random_qgemm_problem(rng, 5, 4, 6),
                random_qgemm_problem(rng, 3, 5, 4, float_mode=True)]
    # Exact ties, both parities, and the clamps: A = 1, so the accumulators are the bias.
    ties = dict(A=np.ones((1, 1), np.int8), B=np.zeros((1, 4), np.int8),
                bias=np.array([5, -5, 7, 1 << 24 | 1], np.int32),
                scale=np.array([0.5, 0.5, 0.5, 2.5 * 2.0 ** -24], np.float32),
                out_zero_point=-128, act_min=-128, act_max=127)
    problems.append(ties)
    convolution = random_conv_problem(rng, 1, 5, 4, 3, 5, 3, padding=1, float_mode=True)
    jobs = [prepare_qgemm(**problem, config=config) for problem in problems]
    jobs.append(prepare_conv2d(**convolution, config=config))
    outputs = run_on_amaranth(jobs, config, seed)
    for problem, y in zip(problems, outputs):
        assert np.array_equal(y, reference_qgemm(**problem).ravel())
    # 2.5 -> 2, -2.5 -> -2 (clamped), 3.5 -> 4, float32(2**24 + 1) * 2.5 * 2**-24 = 2.5 -> 2.
    assert outputs[3].tolist() == [-126, -128, -124, -126]
    assert np.array_equal(outputs[4], reference_conv2d(**convolution).ravel())


# The driver: layout, batches, backends --------------------------------------------------------

def test_dram_layout(monkeypatch):
    seen = {}
    run_on_model = backend.run_program

    def fake_run_program(config, sim, dram, prog_addr, prog_len):
        seen.update(dram=dram.copy(), prog_addr=prog_addr, prog_len=prog_len, sim=sim)
        result = run_on_model(config, "model", dram, prog_addr, prog_len)
        result.cycles = 2000
        return result

    monkeypatch.setattr(backend, "run_programs", one_at_a_time(fake_run_program))
    seed = SEED + 1000
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    problem = random_qgemm_problem(rng, 10, 10, 3)
    result = qgemm(**problem, config=NPUConfig.from_name("4x4"), sim="verilator")
    layout = result.layout
    dram = seen["dram"]
    assert seen["sim"] == "verilator"
    assert seen["prog_addr"] == layout.program_addr == PROGRAM_ADDR
    assert seen["prog_len"] == result.plan.instructions
    assert not dram[:PROGRAM_ADDR].any()
    assert list(layout.regions) == ["a", "b", "bias", "quant", "y"]
    previous_end = layout.program_addr + layout.program_bytes
    for name, (addr, size) in layout.regions.items():
        assert addr % REGION_ALIGN == 0 and addr >= previous_end
        previous_end = addr + size
    assert dram.size == layout.size and layout.size % DRAM_GRANULE == 0
    assert np.array_equal(dram[layout.span("a")].view(np.int8), problem["A"].ravel())
    assert np.array_equal(dram[layout.span("b")].view(np.int8), problem["B"].ravel())
    folded = problem["bias"] - problem["a_zero_point"] * problem["B"].astype(np.int32).sum(0)
    assert np.array_equal(dram[layout.span("bias")].view("<i4"), folded)
    assert np.array_equal(dram[layout.span("quant")].view("<i4"),
                          np.concatenate([problem["multiplier"], problem["shift"]]))
    assert layout.regions["y"][1] == 30 and np.all(dram[layout.span("y")] == POISON)
    assert result.cycles == 2000
    assert result.utilization == 300 / (2000 * 16)
    assert np.array_equal(result.y, reference_qgemm(**problem))


def test_batch_runs_once(monkeypatch):
    calls = []
    run_programs = backend.run_programs

    def recording_run_programs(config, sim, programs):
        calls.append(len(programs))
        return run_programs(config, "model", programs)

    monkeypatch.setattr(backend, "run_programs", recording_run_programs)
    seed = SEED + 1100
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    problems = [random_qgemm_problem(rng, m, k, n) for m, k, n in [(3, 4, 5), (9, 2, 17),
                                                                   (1, 30, 1)]]
    results = qgemm_batch(problems, config=NPUConfig.from_name("3x5"), sim="icarus")
    assert calls == [3]
    for problem, result in zip(problems, results):
        assert result.sim == "icarus"
        assert np.array_equal(result.y, reference_qgemm(**problem))


def test_mixed_jobs_in_one_run():
    from sw.conv import prepare_conv2d, reference_conv2d
    from quant_cases import random_conv_problem
    seed = SEED + 1200
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    config = NPUConfig.from_name("4x4")
    a, b = random_int8(rng, (5, 6)), random_int8(rng, (6, 7))
    quantized = random_qgemm_problem(rng, 8, 9, 10)
    convolution = random_conv_problem(rng, 1, 5, 6, 3, 4, 3, padding=1)
    jobs = [prepare_gemm(a, b, config=config), prepare_qgemm(**quantized, config=config),
            prepare_conv2d(**convolution, config=config)]
    gemm_result, qgemm_result, conv_result = run_jobs(jobs, config, "model")
    assert np.array_equal(gemm_result.c, reference_gemm(a, b))
    assert np.array_equal(qgemm_result.y, reference_qgemm(**quantized))
    assert np.array_equal(conv_result.y, reference_conv2d(**convolution))


def test_program_error_is_reported(monkeypatch):
    def failing_run_program(config, sim, dram, prog_addr, prog_len):
        return RunResult(done=False, error_code=ErrorCode.QUANT, error_pc=4, cycles=None,
                         instructions=4, dram=dram.copy())

    monkeypatch.setattr(backend, "run_programs", one_at_a_time(failing_run_program))
    rng = np.random.default_rng(0)
    with pytest.raises(NPURunError, match="QUANT at instruction 4") as caught:
        qgemm(**random_qgemm_problem(rng, 2, 2, 2))
    assert caught.value.error_code is ErrorCode.QUANT


# Bad input ------------------------------------------------------------------------------------

def good_problem():
    return dict(A=np.ones((2, 3), np.int8), B=np.ones((3, 4), np.int8),
                bias=np.zeros(4, np.int32), multiplier=np.full(4, 1 << 30, np.int32),
                shift=np.zeros(4, np.int32), out_zero_point=0, act_min=-128, act_max=127,
                a_zero_point=0)


@pytest.mark.parametrize("changes, error, match", [
    (dict(A=np.ones((2, 3), np.float32)), NPUTypeError, "A must have dtype int8, not float32"),
    (dict(B=np.ones((3, 4), np.uint8)), NPUTypeError, "B must have dtype int8, not uint8"),
    (dict(A=[[1, 2, 3]]), NPUTypeError, "A must be a numpy array"),
    (dict(B=np.ones((4, 4), np.int8)), NPUValueError, "A is 2x3 and B is 4x4"),
    (dict(A=np.ones((0, 3), np.int8)), NPUValueError, "must not be empty"),
    (dict(bias=np.zeros(4, np.int64)), NPUTypeError, "bias must have dtype int32, not int64"),
    (dict(bias=np.zeros(3, np.int32)), NPUValueError, r"bias must have shape \(4,\)"),
    (dict(bias=np.zeros((1, 4), np.int32)), NPUValueError, r"bias must have shape \(4,\)"),
    (dict(bias=[0, 0, 0, 0]), NPUTypeError, "bias must be a numpy array of int32"),
    (dict(multiplier=np.ones(4, np.float64)), NPUTypeError,
     "multiplier must have dtype int32"),
    (dict(multiplier=np.ones(5, np.int32)), NPUValueError, "multiplier must have shape"),
    (dict(shift=np.ones(4, np.int8)), NPUTypeError, "shift must have dtype int32"),
    (dict(shift=np.array([0, 0, 32, 0], np.int32)), NPUValueError,
     r"shift must be within -31 .. 31, but shift\[2\] = 32"),
    (dict(shift=np.array([-32, 0, 0, 0], np.int32)), NPUValueError, r"shift\[0\] = -32"),
    (dict(out_zero_point=128), NPUValueError, "out_zero_point must be within -128 .. 127"),
    (dict(out_zero_point=-129), NPUValueError, "out_zero_point"),
    (dict(out_zero_point=1.0), NPUTypeError, "out_zero_point must be an integer"),
    (dict(a_zero_point=200), NPUValueError, "a_zero_point must be within -128 .. 127"),
    (dict(a_zero_point=True), NPUTypeError, "a_zero_point must be an integer"),
    (dict(act_min=-129), NPUValueError, "act_min must be within"),
    (dict(act_max=128), NPUValueError, "act_max must be within"),
    (dict(act_min=10, act_max=9), NPUValueError,
     "act_min must not exceed act_max, but act_min = 10 and act_max = 9"),
    # Exactly one of multiplier and shift (fixed point) or scale (float mode).
    (dict(scale=np.ones(4, np.float32)), NPUValueError,
     "either multiplier and shift or scale, not both: scale and multiplier and shift"),
    (dict(multiplier=None), NPUValueError, "only shift was given"),
    (dict(multiplier=None, shift=None), NPUValueError, "only neither was given"),
    (dict(multiplier=None, shift=None, scale=np.ones(4)), NPUTypeError,
     "scale must be a numpy array of float32"),
    (dict(multiplier=None, shift=None, scale=[1.0] * 4), NPUTypeError,
     "scale must be a numpy array of float32"),
    (dict(multiplier=None, shift=None, scale=np.ones(3, np.float32)), NPUValueError,
     r"scale must have shape \(4,\)"),
    (dict(multiplier=None, shift=None, scale=np.array([1, 1, np.nan, 1], np.float32)),
     NPUValueError, r"scale\[2\] = nan"),
    (dict(multiplier=None, shift=None, scale=np.array([1, -np.inf, 1, 1], np.float32)),
     NPUValueError, r"scale\[1\] = -inf"),
])
def test_rejects_bad_operands(changes, error, match):
    problem = dict(good_problem(), **changes)
    with pytest.raises(error, match=match):
        qgemm(**problem)
    with pytest.raises(error, match=match):
        reference_qgemm(**problem)


def test_rejects_k_above_max_k():
    problem = good_problem()
    problem.update(A=np.ones((1, MAX_K + 1), np.int8), B=np.ones((MAX_K + 1, 4), np.int8))
    with pytest.raises(NPUValueError, match="MAX_K"):
        qgemm(**problem)


def test_rejects_folded_bias_outside_int32():
    # -(-128) * (a column sum of 127 * 3) pushes a bias near INT32_MAX over the top.
    problem = good_problem()
    problem.update(B=np.full((3, 4), 127, np.int8), a_zero_point=-128,
                   bias=np.array([0, INT32_MAX - 100, 0, 0], np.int32))
    with pytest.raises(NPUValueError, match="does not fit INT32: channel 1"):
        qgemm(**problem)
    problem["a_zero_point"] = 0
    qgemm(**problem)                         # without the zero point it fits


def test_rejects_bad_sim_and_config():
    with pytest.raises(NPUValueError, match="sim must be one of"):
        qgemm(**good_problem(), sim="spice")
    with pytest.raises(NPUTypeError, match="config must be an NPUConfig"):
        qgemm(**good_problem(), config="8x8")
    with pytest.raises(TypeError, match="missing"):
        qgemm_batch([dict(A=np.ones((2, 3), np.int8))])
