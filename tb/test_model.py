"""The instruction-level model: every instruction's semantics and every error code."""

import numpy as np
import pytest

from hw.config import NPUConfig
from hw.isa import ErrorCode, Opcode, QuantMode
from sim.result import RunResult
from sw import codec
from sw.backend import run_program
from sw.errors import NPUTypeError, NPUValueError
from sw.model import ModelNPU


#: 2 rows x 3 cols: scratchpad rows of 3 bytes (wider than R), accumulator rows of 12 bytes.
WIDE = NPUConfig(rows=2, cols=3, spad_depth=8, acc_depth=4)
#: 3 rows x 2 cols: scratchpad rows wider than C.
TALL = NPUConfig(rows=3, cols=2, spad_depth=8, acc_depth=4)

PROG_ADDR = 0x800
DRAM_SIZE = 0x1000


def end():
    return (Opcode.END, {})


def load_spad(local_addr, rows, row_bytes, dram_addr, dram_stride=None):
    return (Opcode.LOAD_SPAD, dict(local_addr=local_addr, rows=rows, row_bytes=row_bytes,
                                   dram_addr=dram_addr,
                                   dram_stride=row_bytes if dram_stride is None
                                   else dram_stride))


def load_acc(local_addr, rows, row_bytes, dram_addr, dram_stride=None):
    opcode, fields = load_spad(local_addr, rows, row_bytes, dram_addr, dram_stride)
    return (Opcode.LOAD_ACC, fields)


def preload(spad_addr):
    return (Opcode.PRELOAD, dict(spad_addr=spad_addr))


def matmul(spad_addr, acc_addr, rows, accumulate=0):
    return (Opcode.MATMUL, dict(spad_addr=spad_addr, acc_addr=acc_addr, rows=rows,
                                accumulate=accumulate))


def store(acc_addr, rows, row_bytes, dram_addr, dram_stride=None):
    return (Opcode.STORE, dict(acc_addr=acc_addr, rows=rows, row_bytes=row_bytes,
                               dram_addr=dram_addr,
                               dram_stride=row_bytes if dram_stride is None else dram_stride))


def make_dram(instructions, data=(), size=DRAM_SIZE, prog_addr=PROG_ADDR):
    dram = np.zeros(size, dtype=np.uint8)
    image = codec.pack_words(codec.encode(opcode, **fields) for opcode, fields in instructions)
    dram[prog_addr:prog_addr + len(image)] = np.frombuffer(image, dtype=np.uint8)
    for addr, values in data:
        values = np.asarray(values)
        raw = values.astype(values.dtype.newbyteorder("<")).view(np.uint8).reshape(-1)
        dram[addr:addr + raw.size] = raw
    return dram


def run(config, instructions, data=(), size=DRAM_SIZE, prog_addr=PROG_ADDR, prog_len=None):
    """Run on a fresh model; returns (model, result) so tests can look inside."""
    dram = make_dram(instructions, data, size, prog_addr)
    model = ModelNPU(config)
    if prog_len is None:
        prog_len = len(instructions)
    return model, model.run(dram, prog_addr, prog_len)


def assert_done(result, instructions):
    assert (result.done, result.error_code, result.error_pc) == (True, ErrorCode.NONE, 0)
    assert result.instructions == instructions
    assert result.cycles is None


def assert_error(result, error_code, error_pc):
    assert (result.done, result.error_code, result.error_pc) == (False, error_code, error_pc)
    assert result.instructions == error_pc


def int8(values):
    return np.array(values, dtype=np.int8)


# Program control ------------------------------------------------------------------------------

def test_end_only():
    dram = make_dram([end()])
    before = dram.copy()
    result = ModelNPU(WIDE).run(dram, PROG_ADDR, 1)
    assert isinstance(result, RunResult)
    assert_done(result, 1)
    assert np.array_equal(result.dram, before)
    assert np.array_equal(dram, before)  # the caller's DRAM is not modified
    assert result.dram is not dram


def test_program_stops_at_end_before_prog_len():
    _, result = run(WIDE, [preload(0), end(), (Opcode.END, {})], prog_len=100)
    assert_done(result, 2)


def test_unaligned_program_address():
    for prog_addr in (PROG_ADDR + 1, PROG_ADDR + 8, PROG_ADDR - 4):
        dram = make_dram([end()], prog_addr=PROG_ADDR)
        assert_error(ModelNPU(WIDE).run(dram, prog_addr, 1), ErrorCode.PROGRAM, 0)


def test_zero_program_length():
    _, result = run(WIDE, [end()], prog_len=0)
    assert_error(result, ErrorCode.PROGRAM, 0)


def test_no_end_within_length():
    _, result = run(WIDE, [preload(0), preload(0), preload(0), end()], prog_len=3)
    assert_error(result, ErrorCode.PROGRAM, 3)


def test_fetch_outside_dram():
    dram = make_dram([])
    assert_error(ModelNPU(WIDE).run(dram, DRAM_SIZE, 1), ErrorCode.BUS_READ, 0)
    assert_error(ModelNPU(WIDE).run(dram, 0xFFFF_FFF0, 4), ErrorCode.BUS_READ, 0)
    # The last 16 bytes of DRAM hold PRELOADs, the fetch after them falls off the end.
    _, result = run(WIDE, [preload(0)], prog_addr=DRAM_SIZE - 16, prog_len=5)
    assert_error(result, ErrorCode.BUS_READ, 1)


@pytest.mark.parametrize("raw_opcode", [0x00, 0x09, 0x80, 0xFF])
def test_illegal_opcode(raw_opcode):
    dram = make_dram([preload(0), preload(0)])
    dram[PROG_ADDR + 16] = raw_opcode
    assert_error(ModelNPU(WIDE).run(dram, PROG_ADDR, 3), ErrorCode.ILLEGAL_OPCODE, 1)


def test_fetch_sees_stores_over_the_program():
    # The STORE writes the zeros of accumulator row 0 over the instruction after it.
    next_instruction = PROG_ADDR + 16
    _, result = run(WIDE, [store(0, 1, 12, next_instruction), end(), end()])
    assert_error(result, ErrorCode.ILLEGAL_OPCODE, 1)


def test_run_starts_from_reset():
    model = ModelNPU(WIDE)
    dram = make_dram([load_spad(0, 2, 3, 0), preload(0), end()], data=[(0, int8(range(1, 7)))])
    assert model.run(dram, PROG_ADDR, 3).done
    assert model.spad.any() and model.weights.any()
    assert model.run(make_dram([end()]), PROG_ADDR, 1).done
    assert not model.spad.any() and not model.weights.any() and not model.acc.any()


def test_run_arguments_checked():
    model = ModelNPU(WIDE)
    with pytest.raises(NPUTypeError, match="uint8"):
        model.run(np.zeros(64, dtype=np.int8), 0, 1)
    with pytest.raises(NPUTypeError, match="uint8"):
        model.run(np.zeros((8, 8), dtype=np.uint8), 0, 1)
    with pytest.raises(NPUTypeError):
        model.run(bytes(64), 0, 1)
    with pytest.raises(NPUValueError, match="prog_addr"):
        model.run(np.zeros(64, dtype=np.uint8), -16, 1)
    with pytest.raises(NPUValueError, match="prog_len"):
        model.run(np.zeros(64, dtype=np.uint8), 0, 1 << 32)
    with pytest.raises(NPUTypeError, match="NPUConfig"):
        ModelNPU("8x8")


def test_backend_dispatch():
    dram = make_dram([end()])
    result = run_program(WIDE, "model", dram, PROG_ADDR, 1)
    assert_done(result, 1)
    with pytest.raises(NPUValueError, match="verilator, icarus, model"):
        run_program(WIDE, "spice", dram, PROG_ADDR, 1)


# LOAD_SPAD / LOAD_ACC -------------------------------------------------------------------------

def test_load_spad_strided_and_zero_filled():
    data = np.arange(1, 65, dtype=np.uint8)
    model, result = run(WIDE, [
        load_spad(2, 3, 3, 0x100, 3),       # three full rows
        load_spad(3, 2, 2, 0x110, 7),       # overwrite rows 3..4 with 2 bytes each
        load_spad(7, 1, 1, 0x120, 0),       # the last row
        end(),
    ], data=[(0x100, data)])
    assert_done(result, 4)
    expected = np.zeros((8, 3), dtype=np.uint8)
    expected[2] = data[0:3]
    expected[3] = [data[16], data[17], 0]
    expected[4] = [data[23], data[24], 0]
    expected[7] = [data[32], 0, 0]
    assert np.array_equal(model.spad, expected)


def test_load_spad_stride_zero_and_overlapping_rows():
    data = np.arange(10, 20, dtype=np.uint8)
    model, result = run(WIDE, [load_spad(0, 3, 3, 0x100, 0), load_spad(3, 3, 3, 0x100, 1),
                               end()], data=[(0x100, data)])
    assert_done(result, 3)
    assert np.array_equal(model.spad[:3], np.tile(data[:3], (3, 1)))
    assert np.array_equal(model.spad[3:6], [data[0:3], data[1:4], data[2:5]])


def test_load_acc_little_endian_lanes_and_zero_fill():
    values = np.array([[1, -2, 0x12345678], [-(1 << 31), (1 << 31) - 1, 7]], dtype="<i4")
    model, result = run(WIDE, [
        load_acc(0, 2, 12, 0x100),
        load_acc(1, 1, 5, 0x100),           # a row that ends inside lane 1
        end(),
    ], data=[(0x100, values)])
    assert_done(result, 3)
    assert np.array_equal(model.acc[0], values[0])
    assert model.acc[1].tolist() == [1, -2 & 0xFF, 0]


def test_load_acc_round_trip_through_store():
    values = np.array([[5, -6, 7], [-8, 9, -10], [11, 12, 13]], dtype="<i4")
    _, result = run(WIDE, [load_acc(1, 3, 12, 0x100), store(1, 3, 12, 0x200, 16), end()],
                    data=[(0x100, values)])
    assert_done(result, 3)
    stored = result.dram[0x200:0x200 + 48].view("<i4").reshape(3, 4)
    assert np.array_equal(stored[:, :3], values)
    assert not stored[:, 3].any()


# PRELOAD / MATMUL -----------------------------------------------------------------------------

def matmul_program(config, weights, activations):
    """Load weights (R x C) and activations (T x R) and run one MATMUL into acc row 0."""
    rows = activations.shape[0]
    program = [
        load_spad(0, config.rows, config.cols, 0x100),
        preload(0),
        load_spad(config.rows, rows, config.rows, 0x200),
        matmul(config.rows, 0, rows),
        store(0, rows, 4 * config.cols, 0x300),
        end(),
    ]
    return program, [(0x100, weights), (0x200, activations)]


@pytest.mark.parametrize("config", [WIDE, TALL], ids=["2x3", "3x2"])
def test_matmul_against_numpy(config):
    seed = 7
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    weights = rng.integers(-128, 127, (config.rows, config.cols), dtype=np.int8, endpoint=True)
    activations = rng.integers(-128, 127, (4, config.rows), dtype=np.int8, endpoint=True)
    weights[0, 0] = activations[0, 0] = -128
    program, data = matmul_program(config, weights, activations)
    model, result = run(config, program, data)
    assert_done(result, 6)
    expected = activations.astype(np.int32) @ weights.astype(np.int32)
    stored = result.dram[0x300:0x300 + 4 * expected.size].view("<i4").reshape(expected.shape)
    assert np.array_equal(stored, expected)
    assert np.array_equal(model.weights, weights)


def test_matmul_ignores_lanes_outside_the_array():
    # WIDE: scratchpad rows are 3 bytes, but activations use lanes 0..1 only.
    # TALL: weight rows are 3 bytes, but weights use lanes 0..1 only.
    rng = np.random.default_rng(11)
    for config in (WIDE, TALL):
        width = config.spad_row_bytes
        weights = rng.integers(-128, 128, (config.rows, width), dtype=np.int8)
        activations = rng.integers(-128, 128, (2, width), dtype=np.int8)
        model, result = run(config, [
            load_spad(0, config.rows, width, 0x100), preload(0),
            load_spad(4, 2, width, 0x200), matmul(4, 1, 2), end(),
        ], data=[(0x100, weights), (0x200, activations)])
        assert_done(result, 5)
        expected = (activations[:, :config.rows].astype(np.int32)
                    @ weights[:, :config.cols].astype(np.int32))
        assert np.array_equal(model.acc[1:3], expected)


def test_matmul_overwrite_and_accumulate_with_wraparound():
    weights = int8([[1, 1, 1], [0, 0, 0]])
    activations = int8([[100, 0], [-100, 0], [1, 0]])
    start = np.array([[(1 << 31) - 50] * 3, [-(1 << 31) + 10] * 3, [40] * 3], dtype="<i4")
    model, result = run(WIDE, [
        load_spad(0, 2, 3, 0x100), preload(0), load_spad(2, 3, 2, 0x200),
        load_acc(0, 3, 12, 0x300),
        matmul(2, 0, 2, accumulate=1),      # rows 0..1 add and wrap around
        matmul(4, 2, 1, accumulate=0),      # row 2 is overwritten
        end(),
    ], data=[(0x100, weights), (0x200, activations), (0x300, start)])
    assert_done(result, 7)
    assert model.acc[0].tolist() == [-(1 << 31) + 50] * 3
    assert model.acc[1].tolist() == [(1 << 31) - 90] * 3
    assert model.acc[2].tolist() == [1] * 3


def test_weights_never_preloaded_are_zero():
    model, result = run(WIDE, [
        load_acc(0, 1, 12, 0x100), load_spad(0, 2, 2, 0x200),
        matmul(0, 0, 1, accumulate=0), end(),
    ], data=[(0x100, np.array([9, 9, 9], dtype="<i4")), (0x200, int8([1, 2, 3, 4]))])
    assert_done(result, 4)
    assert not model.acc.any()


def test_preload_takes_a_snapshot():
    # Reloading the weight rows after PRELOAD must not change the weights in the array.
    model, result = run(WIDE, [
        load_spad(0, 2, 3, 0x100), preload(0), load_spad(0, 2, 3, 0x200),
        load_spad(4, 1, 2, 0x300), matmul(4, 0, 1), end(),
    ], data=[(0x100, int8([1, 2, 3, 4, 5, 6])), (0x200, int8([9] * 6)),
             (0x300, int8([1, 1]))])
    assert_done(result, 6)
    assert model.acc[0].tolist() == [5, 7, 9]


# STORE ----------------------------------------------------------------------------------------

def test_store_prefix_and_stride_leave_other_bytes_alone():
    values = np.array([[1, 2, 3], [4, 5, 6]], dtype="<i4")
    dram_before = make_dram([load_acc(0, 2, 12, 0x100), store(0, 2, 8, 0x200, 10), end()],
                            data=[(0x100, values), (0x200, np.full(32, 0xEE, np.uint8))])
    result = ModelNPU(WIDE).run(dram_before, PROG_ADDR, 3)
    assert_done(result, 3)
    expected = np.full(32, 0xEE, dtype=np.uint8)
    expected[0:8] = values[0, :2].view(np.uint8)
    expected[10:18] = values[1, :2].view(np.uint8)
    assert np.array_equal(result.dram[0x200:0x220], expected)
    # Nothing else in the DRAM changed.
    changed = np.flatnonzero(result.dram != dram_before)
    assert changed.min() >= 0x200 and changed.max() < 0x220


def test_store_overlapping_rows_later_row_wins():
    values = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]], dtype="<i4")
    _, result = run(WIDE, [load_acc(0, 3, 12, 0x100), store(0, 3, 12, 0x200, 4), end()],
                    data=[(0x100, values)])
    assert_done(result, 3)
    assert result.dram[0x200:0x200 + 20].view("<i4").tolist() == [1, 4, 7, 8, 9]
    _, result = run(WIDE, [load_acc(0, 3, 12, 0x100), store(0, 3, 8, 0x200, 0), end()],
                    data=[(0x100, values)])
    assert result.dram[0x200:0x208].view("<i4").tolist() == [7, 8]


def test_random_strided_dma_against_row_loop():
    seed = 2024
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    config = NPUConfig(rows=4, cols=4, spad_depth=16, acc_depth=16)
    source = rng.integers(0, 256, 0x400, dtype=np.uint8)
    for _ in range(30):
        rows = int(rng.integers(1, 9))
        spad_bytes = int(rng.integers(1, 5))
        store_bytes = 4 * int(rng.integers(1, 5))
        load_stride, store_stride = (int(stride) for stride in rng.integers(0, 40, 2))
        program = [load_acc(2, rows, 16, 0x000, 16), load_spad(3, rows, spad_bytes, 0x0,
                                                               load_stride),
                   store(2, rows, store_bytes, 0x500, store_stride), end()]
        model, result = run(config, program, data=[(0, source)], size=0x800, prog_addr=0x700)
        assert_done(result, 4)
        for row in range(rows):
            start = row * load_stride
            assert np.array_equal(model.spad[3 + row, :spad_bytes],
                                  source[start:start + spad_bytes])
            assert not model.spad[3 + row, spad_bytes:].any()
        expected = np.zeros(0x200, dtype=np.uint8)
        for row in range(rows):
            start = row * store_stride
            expected[start:start + store_bytes] = source[16 * row:16 * row + store_bytes]
        assert np.array_equal(result.dram[0x500:0x700], expected)


# Errors ---------------------------------------------------------------------------------------

LOAD_ERROR_CASES = [
    # (local_addr, rows, row_bytes, dram_addr, dram_stride, error)
    (0, 0, 1, 0, 1, ErrorCode.BAD_LENGTH),
    (0, 1, 0, 0, 1, ErrorCode.BAD_LENGTH),
    (0, 0, 1, 0xFFFF_FFFF, 1 << 31, ErrorCode.BAD_LENGTH),      # before the DRAM check
    (7, 2, 1, 0, 1, "range"),
    (8, 1, 1, 0, 1, "range"),
    (65535, 65535, 1, 0xFFFF_FFFF, 9, "range"),                 # before the DRAM check
    (0, 1, 2, 0xFFFF_FFFF, 0, ErrorCode.DRAM_RANGE),
    (0, 3, 1, 0x8000_0000, 0x4000_0000, ErrorCode.DRAM_RANGE),
    (0, 1, 1, DRAM_SIZE, 0, ErrorCode.BUS_READ),
    (0, 2, 1, DRAM_SIZE - 2, 2, ErrorCode.BUS_READ),
    (0, 1, 1, 0xFFFF_FFFF, 0, ErrorCode.BUS_READ),              # ends exactly at 2**32
]


@pytest.mark.parametrize("case", LOAD_ERROR_CASES)
@pytest.mark.parametrize("opcode", [Opcode.LOAD_SPAD, Opcode.LOAD_ACC],
                         ids=lambda opcode: opcode.name)
def test_load_errors(opcode, case):
    *fields, error = case
    local_addr, rows, row_bytes, dram_addr, dram_stride = fields
    if error == "range":
        error = ErrorCode.SPAD_RANGE if opcode is Opcode.LOAD_SPAD else ErrorCode.ACC_RANGE
    instruction = (opcode, dict(local_addr=local_addr, rows=rows, row_bytes=row_bytes,
                                dram_addr=dram_addr, dram_stride=dram_stride))
    _, result = run(WIDE, [preload(0), preload(0), instruction, end()])
    assert_error(result, error, 2)


@pytest.mark.parametrize("opcode, width, range_error, depth", [
    (Opcode.LOAD_SPAD, WIDE.spad_row_bytes, ErrorCode.SPAD_RANGE, WIDE.spad_depth),
    (Opcode.LOAD_ACC, WIDE.acc_row_bytes, ErrorCode.ACC_RANGE, WIDE.acc_depth),
], ids=["LOAD_SPAD", "LOAD_ACC"])
def test_load_limits(opcode, width, range_error, depth):
    def load(local_addr, rows, row_bytes, dram_addr=0):
        return (opcode, dict(local_addr=local_addr, rows=rows, row_bytes=row_bytes,
                             dram_addr=dram_addr, dram_stride=row_bytes))
    # Exactly at every limit: fine.
    _, result = run(WIDE, [load(0, depth, width), load(depth - 1, 1, width, DRAM_SIZE - width),
                           end()])
    assert_done(result, 3)
    _, result = run(WIDE, [load(0, 1, width + 1), end()])
    assert_error(result, ErrorCode.BAD_LENGTH, 0)
    _, result = run(WIDE, [load(1, depth, width), end()])
    assert_error(result, range_error, 0)


def test_preload_range():
    config = WIDE  # spad_depth 8, R = 2: the last legal weight base is row 6
    _, result = run(config, [preload(6), end()])
    assert_done(result, 2)
    _, result = run(config, [preload(0), preload(7), end()])
    assert_error(result, ErrorCode.SPAD_RANGE, 1)
    _, result = run(config, [preload(65535), end()])
    assert_error(result, ErrorCode.SPAD_RANGE, 0)


@pytest.mark.parametrize("fields, error", [
    (dict(spad_addr=0, acc_addr=0, rows=0), ErrorCode.BAD_LENGTH),
    (dict(spad_addr=99, acc_addr=99, rows=0), ErrorCode.BAD_LENGTH),
    (dict(spad_addr=7, acc_addr=0, rows=2), ErrorCode.SPAD_RANGE),
    (dict(spad_addr=0, acc_addr=0, rows=9), ErrorCode.SPAD_RANGE),
    (dict(spad_addr=9, acc_addr=9, rows=1), ErrorCode.SPAD_RANGE),
    (dict(spad_addr=0, acc_addr=3, rows=2), ErrorCode.ACC_RANGE),
    (dict(spad_addr=0, acc_addr=0, rows=5), ErrorCode.ACC_RANGE),
    (dict(spad_addr=4, acc_addr=0, rows=4), None),
])
def test_matmul_errors(fields, error):
    _, result = run(WIDE, [preload(0), (Opcode.MATMUL, dict(fields, accumulate=1)), end()])
    if error is None:
        assert_done(result, 3)
    else:
        assert_error(result, error, 1)


@pytest.mark.parametrize("fields, error", [
    (dict(acc_addr=0, rows=0, row_bytes=4, dram_addr=0), ErrorCode.BAD_LENGTH),
    (dict(acc_addr=0, rows=1, row_bytes=0, dram_addr=0), ErrorCode.BAD_LENGTH),
    (dict(acc_addr=0, rows=1, row_bytes=6, dram_addr=0), ErrorCode.BAD_LENGTH),
    (dict(acc_addr=0, rows=1, row_bytes=16, dram_addr=0), ErrorCode.BAD_LENGTH),
    (dict(acc_addr=9, rows=1, row_bytes=5, dram_addr=0xFFFF_FFFF), ErrorCode.BAD_LENGTH),
    (dict(acc_addr=3, rows=2, row_bytes=4, dram_addr=0), ErrorCode.ACC_RANGE),
    (dict(acc_addr=4, rows=1, row_bytes=4, dram_addr=0xFFFF_FFFF), ErrorCode.ACC_RANGE),
    (dict(acc_addr=0, rows=1, row_bytes=8, dram_addr=0xFFFF_FFFC), ErrorCode.DRAM_RANGE),
    (dict(acc_addr=0, rows=2, row_bytes=4, dram_addr=0, dram_stride=0xFFFF_FFFD),
     ErrorCode.DRAM_RANGE),
    (dict(acc_addr=0, rows=1, row_bytes=4, dram_addr=DRAM_SIZE - 2), ErrorCode.BUS_WRITE),
    (dict(acc_addr=0, rows=4, row_bytes=12, dram_addr=DRAM_SIZE - 40, dram_stride=12),
     ErrorCode.BUS_WRITE),
    (dict(acc_addr=0, rows=4, row_bytes=12, dram_addr=DRAM_SIZE - 48, dram_stride=12), None),
])
def test_store_errors(fields, error):
    fields = dict(dict(dram_stride=fields["row_bytes"]), **fields)
    dram = make_dram([load_acc(0, 4, 12, 0x100), (Opcode.STORE, fields), end()],
                     data=[(0x100, np.arange(1, 13, dtype="<i4"))])
    result = ModelNPU(WIDE).run(dram, PROG_ADDR, 3)
    if error is None:
        assert_done(result, 3)
        assert np.array_equal(result.dram[-48:].view("<i4"), np.arange(1, 13))
    else:
        assert_error(result, error, 1)
        # The model moves nothing in a failing STORE.
        assert np.array_equal(result.dram, dram)


# LOAD_QUANT / STORE_Q -------------------------------------------------------------------------

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def load_quant(dram_addr, row_bytes, zero_point=0, act_min=-128, act_max=127,
               dram_stride=None, mode=QuantMode.FIXED):
    return (Opcode.LOAD_QUANT, dict(dram_addr=dram_addr,
                                    dram_stride=0x40 if dram_stride is None else dram_stride,
                                    row_bytes=row_bytes, zero_point=zero_point,
                                    act_min=act_min, act_max=act_max, mode=mode))


def store_q(acc_addr, rows, row_bytes, dram_addr, dram_stride=None):
    return (Opcode.STORE_Q, dict(acc_addr=acc_addr, rows=rows, row_bytes=row_bytes,
                                 dram_addr=dram_addr,
                                 dram_stride=row_bytes if dram_stride is None
                                 else dram_stride))


def quant_rows(multipliers, shifts):
    """The two LOAD_QUANT rows at 0x300 (multipliers) and 0x340 (shifts)."""
    return [(0x300, np.array(multipliers, dtype="<i4")), (0x340, np.array(shifts, dtype="<i4"))]


def test_quant_reset_state():
    model = ModelNPU(WIDE)
    assert model.multipliers.tolist() == [0, 0, 0] and model.shifts.tolist() == [0, 0, 0]
    assert (model.zero_point, model.act_min, model.act_max) == (0, -128, 127)
    # With multipliers 0 every output is the zero point, 0.
    values = np.array([[INT32_MAX, INT32_MIN, 12345]] * 2, dtype="<i4")
    dram = make_dram([load_acc(0, 2, 12, 0x100), store_q(0, 2, 3, 0x200), end()],
                     data=[(0x100, values), (0x200, np.full(6, 0xEE, np.uint8))])
    result = model.run(dram, PROG_ADDR, 3)
    assert_done(result, 3)
    assert not result.dram[0x200:0x206].any()


def float_rows(scales, reserved=(0, 0, 0)):
    """The two float-mode LOAD_QUANT rows at 0x300 (float32 scales) and 0x340 (reserved)."""
    return [(0x300, np.array(scales, dtype="<f4")), (0x340, np.array(reserved, dtype="<i4"))]


@pytest.mark.parametrize("mode", list(QuantMode))
@pytest.mark.parametrize("config", [WIDE, TALL], ids=["2x3", "3x2"])
def test_store_q_against_the_references(config, mode):
    """STORE_Q is requantize (fixed point) or requantize_float (float mode) of the
    accumulator rows with the state LOAD_QUANT loaded."""
    from sw.quant import requantize, requantize_float
    seed = 31 + mode
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    cols = config.cols
    for trial in range(20):
        acc = rng.integers(INT32_MIN, INT32_MAX, (4, cols), dtype=np.int64, endpoint=True)
        if mode is QuantMode.FLOAT:
            acc >>= rng.integers(0, 32, (4, cols))         # every magnitude
        acc[0, 0], acc[1, 0] = INT32_MIN, INT32_MAX
        acc = acc.astype("<i4")
        if mode is QuantMode.FLOAT:
            scales = (rng.uniform(-1, 1, cols) * 2.0 ** rng.integers(-30, 0, cols)).astype(
                "<f4")
            rows = float_rows(scales, [0] * cols)
        else:
            multipliers = rng.integers(INT32_MIN, INT32_MAX, cols, dtype=np.int64,
                                       endpoint=True)
            multipliers[0] = INT32_MIN if trial % 2 else INT32_MAX
            shifts = rng.integers(-31, 31, cols, endpoint=True)
            rows = quant_rows(multipliers, shifts)
        zero_point = int(rng.integers(-128, 128))
        act_min, act_max = sorted(int(value) for value in rng.integers(-128, 128, 2))
        model, result = run(config, [
            load_acc(0, 4, 4 * cols, 0x100),
            load_quant(0x300, 4 * cols, zero_point, act_min, act_max, mode=mode),
            store_q(0, 4, cols, 0x200),
            end(),
        ], data=[(0x100, acc)] + rows)
        assert_done(result, 4)
        assert model.quant_mode is mode
        assert (model.zero_point, model.act_min, model.act_max) == (zero_point, act_min,
                                                                     act_max)
        if mode is QuantMode.FLOAT:
            assert model.multipliers.view("<f4").tolist() == scales.tolist()
            expected = requantize_float(acc, scales, zero_point, act_min, act_max)
        else:
            assert model.multipliers.tolist() == multipliers.tolist()
            assert model.shifts.tolist() == shifts.tolist()
            expected = requantize(acc, multipliers, shifts, zero_point, act_min, act_max)
        stored = result.dram[0x200:0x200 + 4 * cols].view(np.int8).reshape(4, cols)
        assert np.array_equal(stored, expected)


def test_load_quant_partial_row_zeroes_the_other_lanes():
    # Lane 2's multiplier and shift lie past row_bytes (8): they read as 0, whatever the DRAM
    # holds (here a shift of 99 that would otherwise be a QUANT error).
    acc = np.array([[1000, -1000, 1000]], dtype="<i4")
    model, result = run(WIDE, [
        load_acc(0, 1, 12, 0x100),
        load_quant(0x300, 8, zero_point=5),
        store_q(0, 1, 3, 0x200),
        end(),
    ], data=[(0x100, acc)] + quant_rows([1 << 30, 1 << 30, 1 << 30], [1, 0, 99]))
    assert_done(result, 4)
    assert model.multipliers.tolist() == [1 << 30, 1 << 30, 0]
    assert model.shifts.tolist() == [1, 0, 0]
    # 1000 * 0.5 / 2 = 250 -> clamp(255) = 127; -1000 * 0.5 = -500 -> -495 -> -128; lane 2: 5.
    assert result.dram[0x200:0x203].view(np.int8).tolist() == [127, -128, 5]


def test_load_quant_stride_zero_and_overlap():
    # Stride 0: multipliers and shifts come from the same bytes.
    model, result = run(WIDE, [load_quant(0x300, 12, dram_stride=0), end()],
                        data=quant_rows([3, -7, 31], [0, 0, 0]))
    assert_done(result, 2)
    assert model.multipliers.tolist() == [3, -7, 31] == model.shifts.tolist()
    # Stride 4: the shift row starts at the second multiplier.
    model, result = run(WIDE, [load_quant(0x300, 12, dram_stride=4), end()],
                        data=[(0x300, np.array([5, 6, 7, -8], dtype="<i4"))])
    assert_done(result, 2)
    assert model.multipliers.tolist() == [5, 6, 7] and model.shifts.tolist() == [6, 7, -8]


def test_store_q_prefix_stride_and_overlap():
    # Multiplier 2**30 with shift -1 is the identity on small values.
    acc = np.array([[1, 2, 3], [4, 5, 6], [-7, -8, -9]], dtype="<i4")
    data = [(0x100, acc), (0x200, np.full(32, 0xEE, np.uint8))] + \
        quant_rows([1 << 30] * 3, [-1] * 3)
    dram_before = make_dram([load_acc(0, 3, 12, 0x100), load_quant(0x300, 12),
                             store_q(0, 3, 2, 0x200, 5), end()], data=data)
    result = ModelNPU(WIDE).run(dram_before, PROG_ADDR, 4)
    assert_done(result, 4)
    expected = np.full(32, 0xEE, dtype=np.uint8)
    expected[[0, 1, 5, 6, 10, 11]] = np.array([1, 2, 4, 5, -7, -8], dtype=np.int8).view(
        np.uint8)
    assert np.array_equal(result.dram[0x200:0x220], expected)
    changed = np.flatnonzero(result.dram != dram_before)
    assert changed.min() >= 0x200 and changed.max() < 0x220
    # Overlapping rows (stride 1 < row_bytes 3): the later row wins.
    _, result = run(WIDE, [load_acc(0, 3, 12, 0x100), load_quant(0x300, 12),
                           store_q(0, 3, 3, 0x200, 1), end()], data=data)
    assert result.dram[0x200:0x205].view(np.int8).tolist() == [1, 4, -7, -8, -9]


def test_store_q_full_width_on_acc_depth_rows():
    # Every lane, every accumulator row: row_bytes = C and rows = acc_depth are legal.
    acc = np.arange(12, dtype="<i4").reshape(4, 3) - 6
    _, result = run(WIDE, [load_acc(0, 4, 12, 0x100), load_quant(0x300, 12, zero_point=-3),
                           store_q(0, 4, 3, 0x200), end()],
                    data=[(0x100, acc)] + quant_rows([1 << 30] * 3, [-1] * 3))
    assert_done(result, 4)
    assert np.array_equal(result.dram[0x200:0x20C].view(np.int8), acc.ravel() - 3)


def test_load_quant_state_survives_later_stores_and_loads():
    # STORE_Q, LOAD_ACC and MATMUL do not touch the requantization state.
    acc = np.array([[10, 20, 30]], dtype="<i4")
    model, result = run(WIDE, [
        load_quant(0x300, 12, zero_point=1, act_min=-5, act_max=25),
        load_acc(0, 1, 12, 0x100), store_q(0, 1, 3, 0x200),
        load_acc(0, 1, 12, 0x100), store_q(0, 1, 3, 0x210), end(),
    ], data=[(0x100, acc)] + quant_rows([1 << 30] * 3, [-1] * 3))
    assert_done(result, 6)
    assert result.dram[0x200:0x203].view(np.int8).tolist() == [11, 21, 25]
    assert result.dram[0x210:0x213].view(np.int8).tolist() == [11, 21, 25]


LOAD_QUANT_ERROR_CASES = [
    # (dram_addr, dram_stride, row_bytes, zero_point, act_min, act_max, shifts, error)
    (0x300, 0x40, 0, 0, -128, 127, None, ErrorCode.BAD_LENGTH),
    (0x300, 0x40, 6, 0, -128, 127, None, ErrorCode.BAD_LENGTH),
    (0x300, 0x40, 16, 0, -128, 127, None, ErrorCode.BAD_LENGTH),          # above 4 C = 12
    (0xFFFF_FFFF, 0xFFFF_FFFF, 2, 500, 5, 4, None, ErrorCode.BAD_LENGTH),  # before the rest
    (0xFFFF_FFF8, 0, 12, 0, -128, 127, None, ErrorCode.DRAM_RANGE),
    (0x300, 0xFFFF_FD00 - 12 + 1, 12, 0, -128, 127, None, ErrorCode.DRAM_RANGE),
    (0xFFFF_FFF0, 5, 12, 999, 1, 0, None, ErrorCode.DRAM_RANGE),           # before QUANT
    (0x300, 0xFFFF_FD00 - 12, 12, 0, -128, 127, None, ErrorCode.BUS_READ),  # ends at 2**32
    (DRAM_SIZE - 12, 0, 12, 0, -128, 127, None, None),                     # the last bytes
    (DRAM_SIZE - 12, 4, 12, 0, -128, 127, None, ErrorCode.BUS_READ),
    (DRAM_SIZE - 8, 0, 12, -200, 3, 2, None, ErrorCode.BUS_READ),          # before QUANT
    (0x300, 0x40, 12, 128, -128, 127, None, ErrorCode.QUANT),
    (0x300, 0x40, 12, -129, -128, 127, None, ErrorCode.QUANT),
    (0x300, 0x40, 12, -16384, -128, 127, None, ErrorCode.QUANT),       # the field's minimum
    (0x300, 0x40, 12, 127, -128, 127, None, None),
    (0x300, 0x40, 12, -128, -128, 127, None, None),
    (0x300, 0x40, 12, 0, 1, 0, None, ErrorCode.QUANT),
    (0x300, 0x40, 12, 0, 127, -128, None, ErrorCode.QUANT),
    (0x300, 0x40, 12, 0, 7, 7, None, None),
    (0x300, 0x40, 12, 0, -128, 127, [0, 0, 32], ErrorCode.QUANT),
    (0x300, 0x40, 12, 0, -128, 127, [-32, 0, 0], ErrorCode.QUANT),
    (0x300, 0x40, 12, 0, -128, 127, [INT32_MIN, 0, 0], ErrorCode.QUANT),
    (0x300, 0x40, 12, 0, -128, 127, [31, -31, 0], None),
    (0x300, 0x40, 8, 0, -128, 127, [31, -31, 32], None),                   # lane 2 not read
]


@pytest.mark.parametrize("case", LOAD_QUANT_ERROR_CASES)
def test_load_quant_errors(case):
    *fields, shifts, error = case
    dram_addr, dram_stride, row_bytes, zero_point, act_min, act_max = fields
    good = dict(multipliers=[111, 222, 333], shifts=[1, 2, 3])
    bad_shifts = [0, 0, 0] if shifts is None else shifts
    data = [(0x380, np.array(good["multipliers"] + good["shifts"], dtype="<i4"))] + \
        quant_rows([7, 8, 9], bad_shifts)
    model, result = run(WIDE, [
        load_quant(0x380, 12, zero_point=-9, act_min=-100, act_max=100, dram_stride=12),
        load_quant(dram_addr, row_bytes, zero_point, act_min, act_max, dram_stride),
        end(),
    ], data=data)
    if error is None:
        assert_done(result, 3)
        assert (model.zero_point, model.act_min, model.act_max) == (zero_point, act_min,
                                                                     act_max)
    else:
        assert_error(result, error, 1)
        # A failing LOAD_QUANT leaves the state of the one before it.
        assert model.multipliers.tolist() == good["multipliers"]
        assert model.shifts.tolist() == good["shifts"]
        assert (model.zero_point, model.act_min, model.act_max) == (-9, -100, 100)


def test_quant_mode_switches_per_load_quant():
    # The same accumulators, scale 0.25 in float mode (ties to even) and multiplier 2**30 with
    # shift 1 in fixed-point mode (RoundingDivideByPOT: ties away from zero), alternately.
    acc = np.array([[10, -10, 14]], dtype="<i4")
    program = [load_acc(0, 1, 12, 0x100),
               load_quant(0x300, 12, mode=QuantMode.FLOAT), store_q(0, 1, 3, 0x200),
               load_quant(0x380, 12, dram_stride=12), store_q(0, 1, 3, 0x210),
               load_quant(0x300, 12, mode=QuantMode.FLOAT), store_q(0, 1, 3, 0x220), end()]
    data = [(0x100, acc), (0x380, np.array([1 << 30] * 3 + [1] * 3, "<i4"))] + \
        float_rows([0.25] * 3)
    model, result = run(WIDE, program, data=data)
    assert_done(result, 8)
    assert result.dram[0x200:0x203].view(np.int8).tolist() == [2, -2, 4]
    assert result.dram[0x210:0x213].view(np.int8).tolist() == [3, -3, 4]
    assert result.dram[0x220:0x223].view(np.int8).tolist() == [2, -2, 4]


FLOAT_LOAD_QUANT_CASES = [
    # (row_bytes, scales, reserved row, error)
    (12, [0.5, -2.0, 1e-45], [0, 0, 0], None),
    (12, [0.0, -0.0, 3.4028235e38], [0, 0, 0], None),
    (12, [0.5, np.inf, 1.0], [0, 0, 0], ErrorCode.QUANT),
    (12, [0.5, 1.0, -np.inf], [0, 0, 0], ErrorCode.QUANT),
    (12, [np.nan, 1.0, 1.0], [0, 0, 0], ErrorCode.QUANT),
    (8, [0.5, 1.0, np.nan], [0, 0, 0], None),                     # lane 2 not read
    (12, [0.5, 1.0, 1.0], [0, 0, 1], ErrorCode.QUANT),            # row 1 is reserved
    (12, [0.5, 1.0, 1.0], [INT32_MIN, 0, 0], ErrorCode.QUANT),
    (8, [0.5, 1.0, 1.0], [0, 0, 7], None),                        # lane 2 not read
]


@pytest.mark.parametrize("case", FLOAT_LOAD_QUANT_CASES)
def test_load_quant_float_errors(case):
    row_bytes, scales, reserved, error = case
    model, result = run(WIDE, [
        load_quant(0x380, 12, zero_point=-9, act_min=-100, act_max=100, dram_stride=12),
        load_quant(0x300, row_bytes, 4, -50, 50, mode=QuantMode.FLOAT),
        end(),
    ], data=[(0x380, np.array([111, 222, 333, 1, 2, 3], dtype="<i4"))] +
        float_rows(scales, reserved))
    if error is None:
        assert_done(result, 3)
        lanes = row_bytes // 4
        assert model.quant_mode is QuantMode.FLOAT
        assert model.multipliers.view("<f4")[:lanes].tolist() == \
            np.array(scales[:lanes], "<f4").tolist()
        assert not model.multipliers[lanes:].any() and not model.shifts.any()
        assert (model.zero_point, model.act_min, model.act_max) == (4, -50, 50)
    else:
        assert_error(result, error, 1)
        assert model.quant_mode is QuantMode.FIXED
        assert model.multipliers.tolist() == [111, 222, 333]
        assert (model.zero_point, model.act_min, model.act_max) == (-9, -100, 100)


@pytest.mark.parametrize("fields, error", [
    (dict(acc_addr=0, rows=0, row_bytes=1, dram_addr=0), ErrorCode.BAD_LENGTH),
    (dict(acc_addr=0, rows=1, row_bytes=0, dram_addr=0), ErrorCode.BAD_LENGTH),
    (dict(acc_addr=0, rows=1, row_bytes=4, dram_addr=0), ErrorCode.BAD_LENGTH),   # > C = 3
    (dict(acc_addr=9, rows=1, row_bytes=5, dram_addr=0xFFFF_FFFF), ErrorCode.BAD_LENGTH),
    (dict(acc_addr=3, rows=2, row_bytes=1, dram_addr=0), ErrorCode.ACC_RANGE),
    (dict(acc_addr=4, rows=1, row_bytes=1, dram_addr=0xFFFF_FFFF), ErrorCode.ACC_RANGE),
    (dict(acc_addr=0, rows=1, row_bytes=3, dram_addr=0xFFFF_FFFE), ErrorCode.DRAM_RANGE),
    (dict(acc_addr=0, rows=2, row_bytes=2, dram_addr=0, dram_stride=0xFFFF_FFFF),
     ErrorCode.DRAM_RANGE),
    (dict(acc_addr=0, rows=2, row_bytes=1, dram_addr=0, dram_stride=0xFFFF_FFFF),
     ErrorCode.BUS_WRITE),                                          # ends exactly at 2**32
    (dict(acc_addr=0, rows=1, row_bytes=3, dram_addr=0xFFFF_FFFD), ErrorCode.BUS_WRITE),
    (dict(acc_addr=0, rows=1, row_bytes=2, dram_addr=DRAM_SIZE - 1), ErrorCode.BUS_WRITE),
    (dict(acc_addr=0, rows=4, row_bytes=3, dram_addr=DRAM_SIZE - 11, dram_stride=3),
     ErrorCode.BUS_WRITE),
    (dict(acc_addr=0, rows=4, row_bytes=3, dram_addr=DRAM_SIZE - 12, dram_stride=3), None),
    (dict(acc_addr=1, rows=1, row_bytes=1, dram_addr=DRAM_SIZE - 1), None),
])
def test_store_q_errors(fields, error):
    fields = dict(dict(dram_stride=fields["row_bytes"]), **fields)
    dram = make_dram([load_acc(0, 4, 12, 0x100), load_quant(0x300, 12),
                      (Opcode.STORE_Q, fields), end()],
                     data=[(0x100, np.arange(1, 13, dtype="<i4"))] +
                     quant_rows([1 << 30] * 3, [-1] * 3))
    result = ModelNPU(WIDE).run(dram, PROG_ADDR, 4)
    if error is None:
        assert_done(result, 4)
        rows, row_bytes = fields["rows"], fields["row_bytes"]
        stored = result.dram[fields["dram_addr"]:][:rows * row_bytes].view(np.int8)
        expected = np.arange(1, 13).reshape(4, 3)[fields["acc_addr"]:][:rows, :row_bytes]
        assert np.array_equal(stored, expected.ravel())
    else:
        assert_error(result, error, 2)
        assert np.array_equal(result.dram, dram)


def test_run_without_reset_keeps_the_state():
    model = ModelNPU(WIDE)
    first = make_dram([load_spad(0, 2, 3, 0x100), preload(0), load_acc(1, 1, 12, 0x200),
                       load_quant(0x300, 12, zero_point=4), end()],
                      data=[(0x100, int8(range(1, 7))), (0x200, np.array([7, 8, 9], "<i4"))]
                      + quant_rows([1 << 30] * 3, [-1] * 3))
    assert model.run(first, PROG_ADDR, 5).done
    # The second program only multiplies and stores: it sees the weights, the accumulator row
    # and the requantization state the first one left.
    second = make_dram([load_spad(4, 1, 2, 0x100), matmul(4, 1, 1, accumulate=1),
                        store_q(1, 1, 3, 0x400), end()], data=[(0x100, int8([1, 1]))])
    result = model.run(second, PROG_ADDR, 4, reset=False)
    assert_done(result, 4)
    assert result.dram[0x400:0x403].view(np.int8).tolist() == [7 + 5 + 4, 8 + 7 + 4, 9 + 9 + 4]
    # With the reset (the default), the same program sees zero weights and the reset state.
    result = model.run(second, PROG_ADDR, 4)
    assert result.dram[0x400:0x403].view(np.int8).tolist() == [0, 0, 0]
    assert (model.zero_point, model.act_min, model.act_max) == (0, -128, 127)


# Windows against one instruction at a time ------------------------------------------------------
# ModelNPU runs windows of instructions as array operations (sw/model_window.py); with
# batched=False it runs one instruction at a time through the handlers, as the model always
# did: the specification. Random programs, built to reach every path of the windows (loads over
# rows other instructions read, chains of MATMULs, stores that later loads read back, stores
# over the program, failures part-way, both requantization modes), must leave both with the
# same result, DRAM and state, bit for bit.

WINDOW_DRAM = 0x8000
WINDOW_PROG = 0x5000
QUANT_FIXED = 0x4000        # LOAD_QUANT rows: fixed point at +0 and +0x100, float at +0x200
QUANT_FLOAT = 0x4200        # and +0x300


def _window_word(config, rng, previous_matmul, pc, edge):
    """One instruction word: mostly within range (edge: the chance of each field being past a
    limit), now and then a random word."""
    R, C = config.rows, config.cols
    spad_bytes, acc_bytes = config.spad_row_bytes, config.acc_row_bytes

    def chance(p=edge):
        return rng.random() < p

    def rows(limit=9):
        return 0 if chance() else int(rng.integers(1, limit))

    def local(depth, count):
        if chance():
            return max(0, depth - int(rng.integers(0, count + 1)))
        return int(rng.integers(0, max(1, depth - count + 1)))

    def dram_addr():
        if chance():
            return int(rng.choice([WINDOW_DRAM - int(rng.integers(0, 40)), (1 << 32) - 8]))
        if rng.random() < 0.1:          # over the program, ahead of this instruction
            return WINDOW_PROG + 16 * (pc + int(rng.integers(1, 6))) + int(rng.integers(0, 16))
        return int(rng.integers(0, 0x3000))

    def stride(row_bytes):
        return int(rng.choice([row_bytes, row_bytes, 0, int(rng.integers(0, 64)),
                               row_bytes + int(rng.integers(0, 8))]))

    kind = rng.choice(["ls", "pr", "mm", "la", "st", "sq", "lq", "raw"],
                      p=[0.27, 0.12, 0.3, 0.06, 0.07, 0.08, 0.08, 0.02])
    if kind == "raw":
        return int.from_bytes(rng.bytes(16), "little")
    if kind in ("ls", "la"):
        depth, width = (config.spad_depth, spad_bytes) if kind == "ls" \
            else (config.acc_depth, acc_bytes)
        count = rows()
        row_bytes = width + 1 if chance() else int(rng.integers(1, width + 1))
        if rng.random() < 0.5:
            row_bytes = width
        step = stride(row_bytes)
        addr = dram_addr()
        if rng.random() < 0.05:         # the block ends at the DRAM's last byte
            addr = max(0, WINDOW_DRAM - row_bytes - step * max(count - 1, 0))
        return codec.encode(Opcode.LOAD_SPAD if kind == "ls" else Opcode.LOAD_ACC,
                            local_addr=local(depth, count), rows=count, row_bytes=row_bytes,
                            dram_addr=addr, dram_stride=step)
    if kind == "pr":
        return codec.encode(Opcode.PRELOAD, spad_addr=local(config.spad_depth, R))
    if kind == "mm":
        if previous_matmul is not None and rng.random() < 0.5:
            acc_addr, count = previous_matmul           # the next MATMUL of a chain
            accumulate = 1
        else:
            count = rows()
            acc_addr, accumulate = local(config.acc_depth, count), int(rng.integers(0, 2))
        return codec.encode(Opcode.MATMUL, spad_addr=local(config.spad_depth, count),
                            acc_addr=acc_addr, rows=count, accumulate=accumulate,
                            k_width=R + 1 if chance() else int(rng.integers(0, R + 1)),
                            n_width=C + 1 if chance() else int(rng.integers(0, C + 1)))
    if kind in ("st", "sq"):
        count = rows()
        if kind == "st":
            row_bytes = 4 * int(rng.integers(1, C + 1))
            if chance():
                row_bytes = int(rng.choice([row_bytes - 1, acc_bytes + 4]))
        else:
            row_bytes = C + 1 if chance() else int(rng.integers(1, C + 1))
        return codec.encode(Opcode.STORE if kind == "st" else Opcode.STORE_Q,
                            acc_addr=local(config.acc_depth, count), rows=count,
                            row_bytes=row_bytes, dram_addr=dram_addr(),
                            dram_stride=stride(row_bytes))
    mode = int(rng.integers(0, 2))
    row_bytes = 4 * int(rng.integers(1, C + 1))
    addr = QUANT_FLOAT if mode else QUANT_FIXED
    if chance(2 * edge):
        addr = dram_addr()              # anything: as often as not a QUANT error
    zero_point = int(rng.integers(-140, 140)) if chance() else int(rng.integers(-128, 128))
    act_min, act_max = sorted(int(value) for value in rng.integers(-128, 128, 2))
    if chance() and act_min > -128:
        act_min, act_max = act_max, act_min - 1
    return codec.encode(Opcode.LOAD_QUANT, dram_addr=addr, dram_stride=0x100,
                        row_bytes=acc_bytes + 4 if chance() else row_bytes,
                        zero_point=zero_point, mode=mode, act_min=act_min, act_max=act_max)


def _window_image(config, rng, length, edge):
    """A DRAM image with a random program of ``length`` words (and END) at WINDOW_PROG."""
    dram = np.frombuffer(rng.bytes(WINDOW_DRAM), dtype=np.uint8).copy()
    C = config.cols
    fixed = np.zeros((2, 0x100), dtype=np.uint8)
    fixed[0, :4 * C] = rng.integers(-(1 << 31), 1 << 31, C).astype("<i4").view(np.uint8)
    fixed[1, :4 * C] = rng.integers(-31, 32, C).astype("<i4").view(np.uint8)
    dram[QUANT_FIXED:QUANT_FIXED + 0x200] = fixed.reshape(-1)
    floats = np.zeros((2, 0x100), dtype=np.uint8)
    floats[0, :4 * C] = (rng.standard_normal(C) * 0.01).astype("<f4").view(np.uint8)
    dram[QUANT_FLOAT:QUANT_FLOAT + 0x200] = floats.reshape(-1)
    words, previous = [], None
    for pc in range(length):
        word = _window_word(config, rng, previous, pc, edge)
        opcode, fields = codec.decode(word)
        previous = (fields["acc_addr"], fields["rows"]) if opcode is Opcode.MATMUL else \
            previous if opcode in (Opcode.LOAD_SPAD, Opcode.PRELOAD) else None
        words.append(word)
    words.append(codec.encode(Opcode.END))
    image = np.frombuffer(codec.pack_words(words), dtype=np.uint8)
    dram[WINDOW_PROG:WINDOW_PROG + image.size] = image
    dram[WINDOW_PROG + image.size:] = 0
    return dram


def _state(model):
    return (model.spad.copy(), model.acc.copy(), model.weights.copy(), model.quant_mode,
            model.multipliers.copy(), model.shifts.copy(), model.zero_point, model.act_min,
            model.act_max)


def _same_run(config, dram, prog_len, context, batched_model, stepped_model, reset=True):
    want = stepped_model.run(dram, WINDOW_PROG, prog_len, reset=reset)
    got = batched_model.run(dram, WINDOW_PROG, prog_len, reset=reset)
    assert (got.done, got.error_code, got.error_pc, got.instructions) == \
        (want.done, want.error_code, want.error_pc, want.instructions), context
    assert np.array_equal(got.dram, want.dram), \
        f"{context}: DRAM differs at {np.flatnonzero(got.dram != want.dram)[:8]}"
    for name, a, b in zip(("spad", "acc", "weights", "quant_mode", "multipliers", "shifts",
                           "zero_point", "act_min", "act_max"),
                          _state(batched_model), _state(stepped_model)):
        assert np.array_equal(a, b), f"{context}: {name} differs"
    return want


def _eager(config):
    """A model that runs every run of two or more instructions as a window."""
    model = ModelNPU(config)
    model.MIN_WINDOW, model.STEP_AFTER_SHORT = 2, 0
    return model


@pytest.mark.parametrize("config", [
    WIDE, TALL, NPUConfig(rows=4, cols=4, spad_depth=64, acc_depth=32),
    NPUConfig(rows=8, cols=3, spad_depth=40, acc_depth=24),
    NPUConfig(rows=1, cols=1, spad_depth=16, acc_depth=8)], ids=lambda c: c.name)
@pytest.mark.parametrize("edge", [0.0, 0.01, 0.05])
def test_windows_match_one_instruction_at_a_time(config, edge):
    seed = [config.rows, config.cols, config.spad_depth, int(edge * 100)]
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    outcomes = set()
    for index in range(25):
        length = int(rng.integers(20, 300))
        dram = _window_image(config, rng, length, edge)
        prog_len = length + 1 if rng.random() < 0.9 else int(rng.integers(1, length + 1))
        result = _same_run(config, dram, prog_len, f"program {index}", _eager(config),
                           ModelNPU(config, batched=False))
        outcomes.add(result.error_code)
    if edge == 0.05:
        assert len(outcomes) > 3, outcomes      # the programs end in many different ways


def test_windows_without_reset_match():
    config = NPUConfig(rows=4, cols=3, spad_depth=48, acc_depth=24)
    print("seed 7")
    rng = np.random.default_rng(7)
    batched, stepped = _eager(config), ModelNPU(config, batched=False)
    for index in range(20):
        dram = _window_image(config, rng, int(rng.integers(20, 200)), 0.01)
        _same_run(config, dram, 1 << 20, f"program {index}", batched, stepped, reset=index == 0)


def test_windows_with_many_shapes_of_chains():
    """More than 32 shapes of MATMUL chains (rows x length) in one window: they are rounded up
    to powers of two, with padding rows and zero weights, and give the same results."""
    config = NPUConfig(rows=2, cols=3, spad_depth=128, acc_depth=128)
    rng = np.random.default_rng(11)
    program = [load_spad(0, 128, 3, 0x1000), load_acc(0, 128, 12, 0x2000)]
    acc_addr = 0
    for rows in range(1, 16):
        for length in range(1, 4):
            for step in range(length):
                program += [preload(int(rng.integers(0, 120))),
                            matmul(int(rng.integers(0, 128 - rows)), acc_addr % (128 - rows),
                                   rows, accumulate=int(step > 0 or rng.random() < 0.5))]
            acc_addr += rows
    program += [store(0, 128, 12, 0x3000), end()]
    data = [(0x1000, np.frombuffer(rng.bytes(384), np.int8)),
            (0x2000, rng.integers(-(1 << 31), 1 << 31, 384).astype("<i4"))]
    dram = make_dram(program, data=data, size=0x4000, prog_addr=0x100)
    want = ModelNPU(config, batched=False).run(dram, 0x100, len(program))
    got = _eager(config).run(dram, 0x100, len(program))
    assert want.done and got.done
    assert np.array_equal(got.dram, want.dram)


@pytest.mark.parametrize("config", [NPUConfig(rows=128, cols=4, spad_depth=512, acc_depth=16),
                                    NPUConfig(rows=256, cols=2, spad_depth=512, acc_depth=8)],
                         ids=lambda c: c.name)
def test_windows_long_chains_are_exact(config):
    """A chain of MATMULs whose reduction (rows x chain length) is far past 2**24 / 128**2, on
    -128 everywhere and on random values, added to accumulators near the INT32 limits: the
    sum wraps exactly as the accumulator does."""
    R, C = config.rows, config.cols
    rng = np.random.default_rng(R)
    for values in ("extreme", "random"):
        data = np.full(2 * R * config.spad_row_bytes, 0x80, dtype=np.uint8) \
            if values == "extreme" else \
            np.frombuffer(rng.bytes(2 * R * config.spad_row_bytes), dtype=np.uint8).copy()
        bias = np.array([(1 << 31) - 5, -(1 << 31) + 3] * C, dtype="<i4")[:4 * C]
        program = [load_acc(0, 4, 4 * C, 0x100, 0),
                   load_spad(0, 2 * R, config.spad_row_bytes, 0x2000)]
        for step in range(12):
            program += [preload(R * (step % 2)),
                        matmul(R * ((step + 1) % 2), 0, 4, accumulate=1)]
        program += [store(0, 4, 4 * C, 0x200), end()]
        dram = make_dram(program, data=[(0x100, bias), (0x2000, data)], size=0x2000 + data.size)
        model = ModelNPU(config)
        model.MIN_WINDOW = 2
        want = ModelNPU(config, batched=False).run(dram, PROG_ADDR, len(program))
        got = model.run(dram, PROG_ADDR, len(program))
        assert want.done and got.done
        assert np.array_equal(got.dram, want.dram), values


@pytest.mark.parametrize("name", ["residual", "concat_pool_softmax", "grouped", "mobilenet"])
def test_windows_on_compiled_networks(name, tmp_path, monkeypatch):
    """Quantized networks through the ONNX runtime (the compiler's own loads, chains of
    MATMULs, requantizing stores and fused layers): every program gives the same DRAM both
    ways, and the network's output equals onnxruntime's."""
    from sw.onnx.graph import import_model
    from sw.onnx.models import build, calibration_data, quantize
    from sw.onnx.runtime import run_model
    float_model, shape = build(name)
    path = tmp_path / f"{name}.onnx"
    quantize(float_model, path, calibration_data(shape))
    original = ModelNPU.run
    programs = []

    def both_ways(self, dram, prog_addr, prog_len, *, reset=True):
        got = original(self, dram, prog_addr, prog_len, reset=reset)
        want = original(ModelNPU(self.config, batched=False), dram, prog_addr, prog_len)
        assert (got.done, got.error_code, got.instructions) == \
            (want.done, want.error_code, want.instructions)
        assert np.array_equal(got.dram, want.dram)
        programs.append(prog_len)
        return got

    monkeypatch.setattr(ModelNPU, "run", both_ways)
    x = calibration_data(shape, samples=3, seed=5)
    graph = import_model(str(path))
    for config in (NPUConfig(rows=4, cols=4), NPUConfig(rows=8, cols=8)):
        got = run_model(graph, x, config=config, sim="model")
        want = run_model(graph, x, config=config, sim="cpu")
        for a, b in zip(got.outputs.values(), want.outputs.values()):
            assert np.array_equal(a, b)
    assert programs


# The speed measurement (python -m sw.bench model) -------------------------------------------------

def test_model_speed_measures_both_ways_on_a_zoo_network(capsys):
    from sw.bench import model_speed
    row = model_speed("squeezenet")
    assert (row["network"], row["size"], row["config"]) == ("squeezenet", 32, "8x8")
    assert row["programs"] >= 1 and row["instructions"] > 10_000
    assert row["stepped"] > 0 and row["windows"] > 0
    assert row["run_model"] >= row["backend"] > 0 and row["cycle_model"] >= 0
    assert "squeezenet 32x32" in capsys.readouterr().out


def test_model_speed_section_is_written_once_and_kept_by_make_bench(tmp_path):
    from sw import bench
    out = tmp_path / "performance.md"
    row = dict(network="inception_v2", size=224, config="8x8", programs=30,
               instructions=3_775_149, stepped=47.0, windows=2.1, run_model=60.0,
               backend=2.5, cycle_model=40.0)
    bench.write_model_speed([row], out, "python -m sw.bench model")
    text = out.read_text()
    assert text.startswith("# Performance") and text.count(bench.MODEL_SECTION) == 1
    assert "| inception_v2 | 224x224 | 30 | 3,775,149 | 47.0 s | 2.10 s | 22.4x |" in text
    assert "`python -m sw.bench model`" in text
    # make bench writes the rest of the report again and keeps the section as it was.
    bench.write_report([], None, out, tmp_path / "utilization.png")
    again = out.read_text()
    assert again.count(bench.MODEL_SECTION) == 1 and again.endswith(
        text[text.index(bench.MODEL_SECTION):])
    assert "## What limits the figures" in again
    # Measured again, the section is replaced, not repeated.
    bench.write_model_speed([dict(row, stepped=40.0)], out, "python -m sw.bench model")
    last = out.read_text()
    assert last.count(bench.MODEL_SECTION) == 1 and "| 40.0 s | 2.10 s | 19.0x |" in last
    assert "## What limits the figures" in last


def test_python_m_sw_bench_model(tmp_path, capsys):
    from sw.bench import main
    out = tmp_path / "performance.md"
    assert main(["model", "--networks", "squeezenet", "--sizes", "0", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| squeezenet | 32x32 |" in text
    assert "`python -m sw.bench model --networks squeezenet --sizes 0`" in text
    with pytest.raises(SystemExit):
        main(["model", "--sizes", "big", "--out", str(out)])
