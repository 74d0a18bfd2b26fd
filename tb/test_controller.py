"""Unit tests of :class:`hw.controller.Controller`, run inside :class:`hw.top.NPU`
(:func:`sim.amaranth_sim.run_jobs`).

The DRAM is :class:`sim.amaranth_sim.AXI4MemoryModel` on ``m_axi`` (random stalls and latency,
bus rules checked), and the tests play the host on ``s_axil``. Every program must end with
``irq`` high within a bounded number of cycles: done with the exact result in DRAM, or an
error with the right :class:`ErrorCode` and ``ERROR_PC``.
"""

from functools import partial

import numpy as np
import pytest

from error_cases import (CONFIG, END, ERROR_PROGRAMS, GOOD_LOAD, PROG_ADDR, load_acc,
                         load_quant, load_spad, matmul, preload, store)
from hw.axi import Resp
from hw.config import NPUConfig
from hw.isa import INSTR_BYTES, ErrorCode, Opcode, QuantMode, Status
from sim import amaranth_sim
from sim.amaranth_sim import wrap32


TIMEOUT = 5000   # cycles: far more than any program here needs

# The table's defaults: its program address, its config, a short timeout.
Job = partial(amaranth_sim.Job, prog_addr=PROG_ADDR)
run_jobs = partial(amaranth_sim.run_jobs, config=CONFIG, timeout_cycles=TIMEOUT)


def assert_done(outcome, context=""):
    assert outcome.status == Status.DONE, f"{context}: {outcome}"
    assert outcome.irq == 1, f"{context}: irq low"
    assert outcome.cycles > 0


def assert_error(outcome, code, error_pc, context=""):
    assert outcome.status == Status.ERROR | code.value << Status.CODE_SHIFT, \
        f"{context}: STATUS {outcome.status:#x} ({outcome.code.name}), expected {code.name}"
    assert outcome.error_pc == error_pc, \
        f"{context}: ERROR_PC {outcome.error_pc}, expected {error_pc}"
    assert outcome.irq == 1, f"{context}: irq low"


# ---------------------------------------------------------------------- a tiny GEMM
W_ADDR, A_ADDR, BIAS_ADDR, Y_ADDR = 0x1000, 0x1100, 0x1200, 0x2004


def gemm_job(config, rng, *, bias, M=4):
    """A tiny GEMM for an R x C array, with K = 2R and N = C:

    rows 0..M-1 of Y (INT32) = [bias +] A (M x K, INT8) @ W (K x N, INT8), two K-tiles
    accumulated in the accumulator; rows M..2M-1 = A[:, R:2R] @ W[R:2R], a third MATMUL that
    reuses the active weights without a PRELOAD. Y is stored with an unaligned start and an
    odd stride. Returns ``(job, expected Y, Y stride)``.
    """
    R, C = config.rows, config.cols
    K, N = 2 * R, C
    weights = rng.integers(-128, 128, size=(K, N), dtype=np.int64)
    acts = rng.integers(-128, 128, size=(M, K), dtype=np.int64)
    weights[0, 0] = acts[0, 0] = -128
    acts[1, 0] = 127
    bias_values = rng.integers(-2**31, 2**31, size=(M, N), dtype=np.int64)
    expected = np.concatenate([acts @ weights + (bias_values if bias else 0),
                               acts[:, R:] @ weights[R:]])
    expected = [[wrap32(int(v)) for v in row] for row in expected]
    y_stride = 4 * N + 5
    tile0, tile1 = K, K + M                         # scratchpad rows of the two A tiles
    words = [
        load_spad(0, K, N, W_ADDR, N),              # weight rows k = 0..K-1 -> spad 0..K-1
        load_spad(tile0, M, R, A_ADDR, K),          # A[:, 0:R]
        load_spad(tile1, M, R, A_ADDR + R, K),      # A[:, R:2R]
    ]
    if bias:
        words.append(load_acc(0, M, 4 * N, BIAS_ADDR, 4 * N))
    words += [
        preload(0),
        matmul(tile0, 0, M, accumulate=int(bias)),
        preload(R),
        matmul(tile1, 0, M, accumulate=1),
        matmul(tile1, M, M, accumulate=0),          # the weights stay active
        store(0, 2 * M, 4 * N, Y_ADDR, y_stride),
        END,
    ]
    data = [
        (W_ADDR, weights.astype(np.int8).tobytes()),
        (A_ADDR, acts.astype(np.int8).tobytes()),
        (BIAS_ADDR, bias_values.astype("<i4").tobytes()),
    ]
    return Job(words, data=data, prog_len=len(words) + 3), expected, y_stride


def read_result(model, rows, cols, stride):
    return [[int.from_bytes(model.peek(Y_ADDR + r * stride + 4 * c, 4), "little",
                            signed=True) for c in range(cols)] for r in range(rows)]


def expected_result_bytes(expected, stride):
    written = {}
    for r, row in enumerate(expected):
        for c, value in enumerate(row):
            for b, byte in enumerate((value & 0xFFFF_FFFF).to_bytes(4, "little")):
                written[Y_ADDR + r * stride + 4 * c + b] = byte
    return written


@pytest.mark.parametrize("rows, cols, bus_width, bias, full_rate", [
    (2, 2, 64, False, False), (2, 2, 64, True, False), (2, 2, 32, True, False),
    (2, 2, 128, False, False), (2, 2, 64, True, True), (2, 3, 64, True, False),
    (3, 2, 32, False, True),
])
def test_gemm_program(rows, cols, bus_width, bias, full_rate):
    """The GEMM program runs to done, with exactly Y written to DRAM and nothing else;
    ``full_rate``: the DRAM accepts and answers everything at once."""
    config = NPUConfig(rows=rows, cols=cols, spad_depth=16, acc_depth=8, bus_width=bus_width)
    seed = 0xC0DE + 16 * rows + 4 * cols + bus_width + 2 * bias + full_rate
    rng = np.random.default_rng(seed)
    job, expected, y_stride = gemm_job(config, rng, bias=bias)
    timing = dict(ready_probability=1.0, max_latency=0) if full_rate else {}
    (outcome,), model = run_jobs([job], seed=seed, config=config, **timing)
    assert outcome.running_status == Status.BUSY, f"seed {seed}: STATUS while running"
    assert_done(outcome, f"seed {seed}")
    assert outcome.pc == len(job.words) - 1, "PC should rest on END"
    assert read_result(model, len(expected), cols, y_stride) == expected, f"seed {seed}"
    # The STORE wrote exactly Y and nothing else.
    assert outcome.written == expected_result_bytes(expected, y_stride), f"seed {seed}"


def test_partial_rows_are_zero_filled():
    """LOAD_SPAD and LOAD_ACC with row_bytes short of a full row zero the rest of the row,
    over whatever an earlier load left there."""
    seed = 0xC0E0
    rng = np.random.default_rng(seed)
    garbage_addr, w_addr, a_addr, bias_addr = 0x1800, 0x1000, 0x1100, 0x1200
    garbage = bytes(int(v) for v in rng.integers(1, 256, size=64))   # no zero byte
    weights = rng.integers(-128, 128, size=(4, 2), dtype=np.int64)
    acts = rng.integers(-128, 128, size=(3, 2), dtype=np.int64)
    bias = rng.integers(-2**31, 2**31, size=3, dtype=np.int64)
    words = [
        load_spad(0, 12, 2, garbage_addr, 2),       # dirty every row used below
        load_acc(0, 6, 8, garbage_addr, 8),
        load_spad(0, 1, 2, w_addr, 2),              # weight row 0: both lanes
        load_spad(1, 1, 1, w_addr + 2, 2),          # weight row 1: lane 0, lane 1 zeroed
        load_spad(2, 2, 2, w_addr + 4, 2),          # second tile: full rows
        load_spad(4, 3, 2, a_addr, 2),              # activations: full rows
        load_spad(8, 3, 1, a_addr, 2),              # activations: lane 0 only
        load_acc(0, 3, 4, bias_addr, 4),            # bias in lane 0, lane 1 zeroed
        preload(0),
        matmul(4, 0, 3, accumulate=1),
        preload(2),
        matmul(8, 3, 3, accumulate=0),
        store(0, 6, 8, Y_ADDR, 8),
        END,
    ]
    data = [(garbage_addr, garbage), (w_addr, weights.astype(np.int8).tobytes()),
            (a_addr, acts.astype(np.int8).tobytes()), (bias_addr, bias.astype("<i4").tobytes())]
    first_tile = weights[:2].copy()
    first_tile[1, 1] = 0
    acts_lane0 = acts.copy()
    acts_lane0[:, 1] = 0
    expected = np.concatenate([acts @ first_tile + np.stack([bias, np.zeros(3, np.int64)], 1),
                               acts_lane0 @ weights[2:]])
    expected = [[wrap32(int(v)) for v in row] for row in expected]
    (outcome,), model = run_jobs([Job(words, data=data)], seed=seed)
    assert_done(outcome, f"seed {seed}")
    assert read_result(model, 6, 2, 8) == expected, f"seed {seed}"


def test_soft_reset_then_program():
    """A soft reset while idle (also after an error) clears STATUS and irq, and programs run
    fine afterwards."""
    seed = 0xC0F0
    rng = np.random.default_rng(seed)
    first, first_expected, y_stride = gemm_job(CONFIG, rng, bias=True)
    first.soft_reset_before = True
    failing = Job([END], prog_addr=PROG_ADDR + 8)
    second, second_expected, _ = gemm_job(CONFIG, rng, bias=False)
    second.soft_reset_before = True
    jobs = [first, failing, second]
    outcomes, model = run_jobs(jobs, seed=seed)
    assert_done(outcomes[0], f"seed {seed}: first")
    assert outcomes[0].written == expected_result_bytes(first_expected, y_stride)
    assert_error(outcomes[1], ErrorCode.PROGRAM, 0, f"seed {seed}: unaligned")
    assert outcomes[1].written == {}
    assert_done(outcomes[2], f"seed {seed}: after the soft reset")
    assert outcomes[2].written == expected_result_bytes(second_expected, y_stride)
    assert read_result(model, len(second_expected), CONFIG.cols, y_stride) == \
        second_expected, f"seed {seed}"


@pytest.mark.parametrize("cycles", [0, 37, 90, 151])
def test_soft_reset_while_busy(cycles):
    """A soft reset in the middle of a program stops it (STATUS and irq clear, once the bus
    is quiet), and the next program runs fine."""
    seed = 0xC0F8 + cycles
    rng = np.random.default_rng(seed)
    interrupted, _, _ = gemm_job(CONFIG, rng, bias=True)
    interrupted.soft_reset_after = cycles
    job, expected, y_stride = gemm_job(CONFIG, rng, bias=False)
    outcomes, _ = run_jobs([interrupted, job], seed=seed)
    assert (outcomes[0].status, outcomes[0].irq) == (0, 0), f"seed {seed}: {outcomes[0]}"
    assert_done(outcomes[1], f"seed {seed}: after the soft reset")
    assert outcomes[1].written == expected_result_bytes(expected, y_stride), f"seed {seed}"


@pytest.mark.parametrize("reset_after", [30, 70])
def test_soft_reset_starts_no_new_bus_transaction(reset_after):
    """A soft reset stops the units from starting DMA commands: only the command in flight
    ends on the bus, then the core resets. Here a STORE of 64 rows runs while 40 loads (to other
    DRAM bytes) follow it; before, the loads kept starting until the DMA happened to be idle
    for a cycle, after the STORE (36 and 32 read bursts after the reset, measured)."""
    seed = 0xC0FB + reset_after
    config = NPUConfig(rows=2, cols=2, spad_depth=16, acc_depth=64, bus_width=64)
    rows = 64
    loads = [load_spad(4 * (i % 4), 4, 2, 0x1000 + 64 * i, 16) for i in range(40)]
    job = Job([store(0, rows, 8, 0x4000, 8)] + loads + [END],
              data=[(0x1000, bytes(range(256)) * 16)], soft_reset_after=reset_after)
    after, expected, y_stride = gemm_job(config, np.random.default_rng(seed), bias=False)
    outcomes, _ = run_jobs([job, after], config=config, seed=seed, max_latency=8)
    reads, writes = outcomes[0].reset_bursts
    # At most the command in flight: a load of 4 rows, a fetch of one burst, or the STORE.
    assert reads <= 4 and writes <= rows, \
        f"seed {seed}: {reads} read and {writes} write bursts after the soft reset"
    assert (outcomes[0].status, outcomes[0].irq) == (0, 0), f"seed {seed}: {outcomes[0]}"
    assert_done(outcomes[1], f"seed {seed}: after the soft reset")
    assert outcomes[1].written == expected_result_bytes(expected, y_stride), f"seed {seed}"


# ---------------------------------------------------------------------- error paths
# The table of error programs is in error_cases.py, which the RTL fault tests share.

@pytest.mark.parametrize("name, words, prog_len, code, error_pc",
                         ERROR_PROGRAMS, ids=[entry[0] for entry in ERROR_PROGRAMS])
def test_error_path(name, words, prog_len, code, error_pc):
    """The program stops with the error bit, the code and the failing instruction's index,
    irq goes high, and the machine runs the next program (an END) fine."""
    seed = sum(name.encode())
    jobs = [Job(words, prog_len=prog_len, prog_addr=0xFFFF_FFF0 if name == "program_past_4g"
                else PROG_ADDR),
            Job([END])]
    outcomes, _ = run_jobs(jobs, seed=seed)
    assert_error(outcomes[0], code, error_pc, name)
    assert_done(outcomes[1], f"{name}: the next program")


@pytest.mark.parametrize("shift", [32, -32, 0x7FFF_FFFF, -0x8000_0000])
def test_load_quant_shift_out_of_range(shift):
    """A shift lane outside -31 .. 31 ends in QUANT; the lanes in range do not."""
    shifts = np.array([31, shift], dtype="<i4").tobytes()
    jobs = [Job([load_quant(8, dram_addr=0x1000, dram_stride=8), END],
                data=[(0x1000, bytes(8)), (0x1008, shifts)]),
            Job([load_quant(8, dram_addr=0x1000, dram_stride=8), END],
                data=[(0x1008, np.array([31, -31], dtype="<i4").tobytes())])]
    outcomes, _ = run_jobs(jobs, seed=abs(shift) % 1000)
    assert_error(outcomes[0], ErrorCode.QUANT, 0, f"shift {shift}")
    assert_done(outcomes[1], "shifts 31 and -31")


@pytest.mark.parametrize("scales, reserved", [
    ([1.0, np.inf], [0, 0]), ([np.nan, 1.0], [0, 0]), ([1.0, 1.0], [0, 5])])
def test_load_quant_float_checks(scales, reserved):
    """In float mode a NaN or infinite scale, or a non-zero lane of the reserved row 1,
    ends in QUANT; finite scales (a subnormal one too) with a zero row 1 do not."""
    def rows(scales, reserved):
        return [(0x1000, np.array(scales, dtype="<f4").tobytes()),
                (0x1008, np.array(reserved, dtype="<i4").tobytes())]
    word = load_quant(8, dram_addr=0x1000, dram_stride=8, mode=QuantMode.FLOAT)
    jobs = [Job([word, END], data=rows(scales, reserved)),
            Job([word, END], data=rows([-3.4028235e38, 1e-45], [0, 0]))]
    outcomes, _ = run_jobs(jobs, seed=len(scales) + sum(reserved))
    assert_error(outcomes[0], ErrorCode.QUANT, 0, f"scales {scales}, row 1 {reserved}")
    assert_done(outcomes[1], "finite scales")


def test_unaligned_program_address():
    for prog_addr in (PROG_ADDR + 4, PROG_ADDR + 1, PROG_ADDR + 8):
        outcomes, _ = run_jobs([Job([END], prog_addr=prog_addr)], seed=prog_addr)
        assert_error(outcomes[0], ErrorCode.PROGRAM, 0, f"prog_addr {prog_addr:#x}")


def test_program_ending_at_4g_runs():
    """The last 16 bytes of the address space hold a valid program (no false DRAM_RANGE),
    and a load that ends exactly at 2**32 is legal."""
    words = [load_spad(0, 1, 2, 0xFFFF_FFFE, 0), END]
    outcomes, _ = run_jobs([Job(words, prog_addr=0xFFFF_FFE0)], seed=7)
    assert_done(outcomes[0], "program at the top of DRAM")


@pytest.mark.parametrize("resp", [Resp.SLVERR, Resp.DECERR])
def test_bus_read_error_on_fetch(resp):
    """Instruction 2 is answered with an error: BUS_READ at PC 2."""
    bad = PROG_ADDR + 2 * INSTR_BYTES
    jobs = [Job([GOOD_LOAD, GOOD_LOAD, END, END]), Job([END], prog_addr=0x400)]
    outcomes, _ = run_jobs(jobs, seed=0xBE00 + resp.value,
                           read_errors=[(bad, bad + INSTR_BYTES, resp)])
    assert_error(outcomes[0], ErrorCode.BUS_READ, 2, resp.name)
    assert_done(outcomes[1], f"{resp.name}: the next program")


@pytest.mark.parametrize("opcode", [Opcode.LOAD_SPAD, Opcode.LOAD_ACC])
def test_bus_read_error_on_load(opcode):
    """The middle row of a load is answered SLVERR: BUS_READ at the load's PC."""
    load = load_spad if opcode == Opcode.LOAD_SPAD else load_acc
    words = [GOOD_LOAD, load(0, 3, 2, 0x3000, 0x100), END]
    jobs = [Job(words), Job([GOOD_LOAD, END])]
    outcomes, _ = run_jobs(jobs, seed=0xBE10 + opcode.value,
                           read_errors=[(0x3100, 0x3108, Resp.SLVERR)])
    assert_error(outcomes[0], ErrorCode.BUS_READ, 1, opcode.name)
    assert_done(outcomes[1], f"{opcode.name}: the next program")


@pytest.mark.parametrize("resp", [Resp.SLVERR, Resp.DECERR])
def test_bus_write_error_on_store(resp):
    """A store row answered with an error: BUS_WRITE at the store's PC."""
    words = [GOOD_LOAD, GOOD_LOAD, store(0, 3, 8, 0x4000, 0x40), END]
    jobs = [Job(words), Job([store(0, 1, 4, 0x5000, 0), END])]
    outcomes, _ = run_jobs(jobs, seed=0xBE20 + resp.value,
                           write_errors=[(0x4040, 0x4048, resp)])
    assert_error(outcomes[0], ErrorCode.BUS_WRITE, 2, resp.name)
    # Rows 0 and 2 (accumulator rows never written: zero) still went out; row 1 was refused.
    assert outcomes[0].written == {addr: 0 for row in (0, 2)
                                   for addr in range(0x4000 + 0x40 * row, 0x4008 + 0x40 * row)}
    assert_done(outcomes[1], f"{resp.name}: the next program")


@pytest.mark.parametrize("target", [2, 3, 5])
def test_store_over_the_program_refetches(target):
    """A STORE that writes over instructions the fetcher already read: the fetcher refetches
    from the pc after the store, so the new words run. The program loads an END's 16 bytes
    into the accumulator (two rows of two INT32 lanes) and stores them over instruction
    ``target``, an illegal opcode (0) that would end the program in ILLEGAL_OPCODE; the
    instructions between are PRELOADs, which change nothing in DRAM."""
    source = 0x1000
    words = [load_acc(0, 2, 8, source, 8),
             store(0, 2, 8, PROG_ADDR + target * INSTR_BYTES, 8)]
    words += [preload(0)] * (target - len(words)) + [0, END]
    replacement = END.to_bytes(INSTR_BYTES, "little")
    seed = 0xC0F0 + target
    (outcome,), model = run_jobs([Job(words, data=[(source, replacement)])], seed=seed)
    assert_done(outcome, f"seed {seed}")
    assert outcome.pc == target
    assert outcome.written == {PROG_ADDR + target * INSTR_BYTES + i: byte
                               for i, byte in enumerate(replacement)}
