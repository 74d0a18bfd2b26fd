"""The GEMM tiler: plans, the instructions it emits, and what it refuses."""

import itertools

import numpy as np
import pytest

from hw.config import NPUConfig
from hw.isa import Opcode
from sw import codec
from sw.compiler import Plan, Program, compile_gemm, plan_gemm
from sw.errors import NPUTypeError, NPUValueError, PlanError
from sw.model import ModelNPU


A_ADDR, B_ADDR, C_ADDR = 0x10000, 0x20000, 0x40000


def compile_at(config, m, k, n, schedule="auto"):
    return compile_gemm(config, m, k, n, a_addr=A_ADDR, b_addr=B_ADDR, c_addr=C_ADDR,
                        schedule=schedule)


def decoded(program):
    return [codec.decode(word) for word in program.words]


def of(program, opcode):
    return [fields for op, fields in decoded(program) if op is opcode]


def run_on_model(config, program, a, b):
    """Run a compiled program with A, B and C at the compile addresses; return C."""
    m, k = a.shape
    n = b.shape[1]
    prog_addr = 0x100
    dram = np.zeros(C_ADDR + 4 * m * n + 64, dtype=np.uint8)
    image = np.frombuffer(program.bytes, dtype=np.uint8)
    assert prog_addr + image.size <= A_ADDR
    dram[prog_addr:prog_addr + image.size] = image
    dram[A_ADDR:A_ADDR + a.size] = a.view(np.uint8).reshape(-1)
    dram[B_ADDR:B_ADDR + b.size] = b.view(np.uint8).reshape(-1)
    result = ModelNPU(config).run(dram, prog_addr, len(program))
    assert result.done, result
    assert result.instructions == len(program)
    return result.dram[C_ADDR:C_ADDR + 4 * m * n].view("<i4").reshape(m, n)


# Plans ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("config_name, m, k, n, k_tiles, n_tiles", [
    ("8x8", 1, 1, 1, 1, 1),
    ("8x8", 16, 8, 8, 1, 1),
    ("8x8", 5, 9, 17, 2, 3),
    ("3x5", 7, 10, 11, 4, 3),
    ("1x1", 2, 3, 4, 3, 4),
    ("16x16", 33, 100, 31, 7, 2),
])
def test_weight_tiles(config_name, m, k, n, k_tiles, n_tiles):
    plan = plan_gemm(NPUConfig.from_name(config_name), m, k, n)
    assert (plan.k_tiles, plan.n_tiles) == (k_tiles, n_tiles)
    assert plan.weight_tiles == k_tiles * n_tiles
    assert plan.weight_loads == plan.weight_tiles * plan.m_blocks
    assert plan.macs == m * k * n


def test_seed_example_tile_fill():
    # seeds section 4.1: a 100x100 layer on a 64x64 array is 4 tiles, 10000 / 16384 full.
    plan = plan_gemm(NPUConfig(rows=64, cols=64), 3136, 100, 100)
    assert plan.weight_tiles == 4
    assert plan.tile_fill == 10_000 / 16_384
    assert plan_gemm(NPUConfig(rows=64, cols=64), 3136, 128, 128).tile_fill == 1.0


def test_plan_matches_emitted_program():
    for config_name, (m, k, n), schedule in itertools.product(
            ["1x1", "3x5", "8x8"], [(1, 1, 1), (9, 17, 6), (40, 3, 23)],
            ["auto", "resident", "streaming"]):
        config = NPUConfig.from_name(config_name)
        planned = plan_gemm(config, m, k, n, schedule=schedule)
        program = compile_at(config, m, k, n, schedule)
        assert isinstance(program, Program) and isinstance(program.plan, Plan)
        assert program.plan == planned
        assert planned.instructions == len(program) == len(program.words)
        assert len(program.bytes) == 16 * len(program)
        assert codec.unpack_words(program.bytes) == program.words
        assert decoded(program)[-1] == (Opcode.END, {})
        loads = of(program, Opcode.LOAD_SPAD)
        stores = of(program, Opcode.STORE)
        assert planned.dram_bytes_read == sum(f["rows"] * f["row_bytes"] for f in loads)
        assert planned.dram_bytes_written == sum(f["rows"] * f["row_bytes"] for f in stores)
        assert planned.dram_bytes_written == 4 * m * n
        assert len(of(program, Opcode.PRELOAD)) == planned.weight_loads


def test_summary_mentions_the_numbers():
    plan = plan_gemm(NPUConfig.from_name("8x8"), 20, 100, 30)
    text = plan.summary()
    for number in (plan.weight_tiles, plan.k_tiles, plan.n_tiles, plan.instructions):
        assert str(number) in text


# Emitted instructions -------------------------------------------------------------------------

def test_loop_order_and_accumulate_flags():
    config = NPUConfig.from_name("4x4")
    program = compile_at(config, 6, 10, 9, schedule="streaming")   # 3 k-tiles x 3 n-tiles
    body = [op for op, _ in decoded(program)]
    per_k_tile = [Opcode.LOAD_SPAD, Opcode.PRELOAD, Opcode.LOAD_SPAD, Opcode.MATMUL]
    per_n_tile = per_k_tile * 3 + [Opcode.STORE]
    assert body == per_n_tile * 3 + [Opcode.END]
    matmuls = of(program, Opcode.MATMUL)
    assert [f["accumulate"] for f in matmuls] == [0, 1, 1] * 3
    assert all(f["rows"] == 6 and f["acc_addr"] == 0 for f in matmuls)


def test_resident_loads_a_once_per_m_block():
    config = NPUConfig.from_name("4x4")
    program = compile_at(config, 6, 10, 9, schedule="resident")
    assert program.plan.schedule == "resident"
    ops = [op for op, _ in decoded(program)]
    # The three k-slices of A first, then per (n-tile, k-tile) a weight load + PRELOAD + MATMUL.
    assert ops[:3] == [Opcode.LOAD_SPAD] * 3
    assert ops[3:] == ([Opcode.LOAD_SPAD, Opcode.PRELOAD, Opcode.MATMUL] * 3
                       + [Opcode.STORE]) * 3 + [Opcode.END]
    a_loads = of(program, Opcode.LOAD_SPAD)[:3]
    assert [f["local_addr"] for f in a_loads] == [4, 10, 16]
    assert [f["row_bytes"] for f in a_loads] == [4, 4, 2]         # ragged last k-slice
    assert [f["dram_addr"] for f in a_loads] == [A_ADDR, A_ADDR + 4, A_ADDR + 8]
    assert all(f["dram_stride"] == 10 and f["rows"] == 6 for f in a_loads)
    matmuls = of(program, Opcode.MATMUL)
    assert [f["spad_addr"] for f in matmuls] == [4, 10, 16] * 3
    assert [f["accumulate"] for f in matmuls] == [0, 1, 1] * 3
    assert program.plan.spad_rows_used == 4 + 3 * 6


def test_ragged_edges():
    config = NPUConfig.from_name("4x4")
    m, k, n = 3, 10, 9
    program = compile_at(config, m, k, n, schedule="streaming")
    loads = of(program, Opcode.LOAD_SPAD)
    weight_loads, activation_loads = loads[0::2], loads[1::2]
    # k-tiles of 4, 4, 2 rows of B; n-tiles of 4, 4, 1 columns.
    assert [f["rows"] for f in weight_loads] == [4, 4, 2] * 3
    assert [f["row_bytes"] for f in weight_loads] == [4] * 6 + [1] * 3
    assert [f["dram_addr"] for f in weight_loads] == [
        B_ADDR + k_start * n + n_start for n_start in (0, 4, 8) for k_start in (0, 4, 8)]
    assert all(f["dram_stride"] == n and f["local_addr"] == 0 for f in weight_loads)
    assert [f["row_bytes"] for f in activation_loads] == [4, 4, 2] * 3
    assert all(f["local_addr"] == 4 and f["rows"] == m for f in activation_loads)
    stores = of(program, Opcode.STORE)
    assert [f["row_bytes"] for f in stores] == [16, 16, 4]
    assert [f["dram_addr"] for f in stores] == [C_ADDR, C_ADDR + 16, C_ADDR + 32]
    assert all(f["dram_stride"] == 4 * n for f in stores)
    assert all(f["spad_addr"] == 0 for f in of(program, Opcode.PRELOAD))


def test_m_split_when_m_exceeds_acc_depth():
    config = NPUConfig(rows=2, cols=2, spad_depth=64, acc_depth=4)
    m, k, n = 10, 3, 3
    program = compile_at(config, m, k, n, schedule="resident")
    plan = program.plan
    assert (plan.m_blocks, plan.block_rows, plan.acc_rows_used) == (3, 4, 4)
    stores = of(program, Opcode.STORE)
    assert [f["rows"] for f in stores] == [4, 4, 4, 4, 2, 2]
    assert [f["dram_addr"] for f in stores] == [
        C_ADDR + 4 * n * m_start + 4 * n_start for m_start in (0, 4, 8) for n_start in (0, 2)]
    assert max(f["acc_addr"] + f["rows"] for f in of(program, Opcode.MATMUL)) <= 4
    seed = 5
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    assert np.array_equal(run_on_model(config, program, a, b),
                          a.astype(np.int32) @ b.astype(np.int32))


def test_m_split_by_scratchpad():
    # acc_depth is large, but only 6 scratchpad rows are free next to the 2-row weight tile.
    config = NPUConfig(rows=2, cols=2, spad_depth=8, acc_depth=512)
    plan = plan_gemm(config, 20, 3, 3, schedule="streaming")
    assert (plan.m_blocks, plan.block_rows, plan.spad_rows_used) == (4, 6, 8)
    plan = plan_gemm(config, 20, 3, 3, schedule="resident")       # 2 k-tiles per row of A
    assert (plan.m_blocks, plan.block_rows, plan.spad_rows_used) == (7, 3, 8)


def test_auto_falls_back_to_streaming_for_long_k():
    # With one accumulator row the overlap schedule cannot ping-pong, so "auto" chooses
    # between the resident and streaming schedules.
    config = NPUConfig(rows=4, cols=4, spad_depth=68, acc_depth=1)
    with pytest.raises(PlanError, match="overlap schedule needs"):
        plan_gemm(config, 8, 8, 8, schedule="overlap")
    # 64 free rows: K = 1000 is 250 k-tiles, so not even one row of A can stay resident.
    assert plan_gemm(config, 8, 1000, 8).schedule == "streaming"
    with pytest.raises(PlanError, match="resident schedule needs 250 scratchpad rows"):
        plan_gemm(config, 8, 1000, 8, schedule="resident")
    # Short K with many n-tiles: keeping A resident saves its reloads.
    plan = plan_gemm(config, 8, 8, 64)
    assert plan.schedule == "resident"
    streaming = plan_gemm(config, 8, 8, 64, schedule="streaming")
    assert plan.dram_bytes_read < streaming.dram_bytes_read


@pytest.mark.parametrize("schedule", ["resident", "streaming"])
@pytest.mark.parametrize("config", [
    NPUConfig(rows=1, cols=1, spad_depth=2, acc_depth=1),
    NPUConfig(rows=3, cols=5, spad_depth=7, acc_depth=3),
    NPUConfig(rows=4, cols=2, spad_depth=16, acc_depth=5),
], ids=["1x1-tiny", "3x5-tiny", "4x2-small"])
def test_tiny_memories_still_exact(config, schedule):
    seed = 99
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    m, k, n = 7, 5, 6
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    try:
        program = compile_at(config, m, k, n, schedule)
    except PlanError:
        assert schedule == "resident"
        return
    assert np.array_equal(run_on_model(config, program, a, b),
                          a.astype(np.int32) @ b.astype(np.int32))


# Rejections -----------------------------------------------------------------------------------

def test_rejects_scratchpad_without_room_for_activations():
    config = NPUConfig(rows=8, cols=8, spad_depth=8)
    with pytest.raises(PlanError, match="weight tile of 8 rows plus one activation row"):
        plan_gemm(config, 1, 1, 1)
    with pytest.raises(PlanError):
        compile_at(config, 1, 1, 1)


@pytest.mark.parametrize("name, value, error", [
    ("m", 0, NPUValueError), ("k", -3, NPUValueError), ("n", 2.0, NPUTypeError),
    ("m", True, NPUTypeError), ("k", "4", NPUTypeError),
])
def test_rejects_bad_dimensions(name, value, error):
    shape = dict(m=2, k=2, n=2)
    shape[name] = value
    with pytest.raises(error, match=f"^{name} must"):
        plan_gemm(NPUConfig(), **shape)


def test_rejects_bad_schedule_and_config():
    with pytest.raises(NPUValueError, match="schedule"):
        plan_gemm(NPUConfig(), 2, 2, 2, schedule="fastest")
    with pytest.raises(NPUTypeError, match="NPUConfig"):
        plan_gemm("8x8", 2, 2, 2)


def test_rejects_addresses_outside_32_bits():
    config = NPUConfig()
    with pytest.raises(PlanError, match="c_addr"):
        compile_gemm(config, 4, 4, 4, a_addr=0, b_addr=0x100, c_addr=(1 << 32) - 32)
    with pytest.raises(PlanError, match="a_addr"):
        compile_gemm(config, 4, 4, 4, a_addr=-1, b_addr=0x100, c_addr=0x200)
    with pytest.raises(NPUTypeError, match="b_addr"):
        compile_gemm(config, 4, 4, 4, a_addr=0, b_addr=None, c_addr=0x200)
    # Exactly at the top of the address space is fine.
    compile_gemm(config, 4, 4, 4, a_addr=0, b_addr=0x100, c_addr=(1 << 32) - 64)


def test_padded_row_strides():
    """Rows of A and B ``a_stride`` / ``b_stride`` bytes apart: every load uses them; a stride
    shorter than the row is refused."""
    config = NPUConfig.from_name("4x4")
    program = compile_gemm(config, 6, 5, 7, a_addr=0x1000, b_addr=0x2000, c_addr=0x3000,
                           a_stride=16, b_stride=32)
    loads = [fields for opcode, fields in map(codec.decode, program.words)
             if opcode is Opcode.LOAD_SPAD]
    assert {f["dram_stride"] for f in loads if f["dram_addr"] < 0x2000} == {16}
    assert {f["dram_stride"] for f in loads if 0x2000 <= f["dram_addr"] < 0x3000} == {32}
    with pytest.raises(PlanError, match="a_stride must be at least k"):
        compile_gemm(config, 6, 5, 7, a_addr=0x1000, b_addr=0x2000, c_addr=0x3000, a_stride=4)
    with pytest.raises(PlanError, match="b_stride at least n"):
        compile_gemm(config, 6, 5, 7, a_addr=0x1000, b_addr=0x2000, c_addr=0x3000, b_stride=6)


# Strided runs (the quantized layers' DMA instructions) ----------------------------------------

@pytest.mark.parametrize("runs, merged", [
    ([], []),
    ([(0, 3, 100, 10)], [(0, 3, 100, 10)]),
    ([(0, 1, 100, 7)], [(0, 1, 100, 0)]),                        # one row: stride 0
    # Runs that continue one another become one.
    ([(0, 3, 100, 10), (3, 2, 130, 10)], [(0, 5, 100, 10)]),
    ([(0, 3, 100, 10), (3, 1, 130, 99)], [(0, 4, 100, 10)]),
    ([(0, 1, 100, 0), (1, 1, 105, 0), (2, 1, 110, 0)], [(0, 3, 100, 5)]),
    ([(0, 1, 100, 0), (1, 4, 103, 3)], [(0, 5, 100, 3)]),
    # Runs that do not: a gap in the addresses, another stride, or a gap in the rows.
    ([(0, 3, 100, 10), (3, 2, 131, 10)], [(0, 3, 100, 10), (3, 2, 131, 10)]),
    ([(0, 3, 100, 10), (3, 2, 130, 5)], [(0, 3, 100, 10), (3, 2, 130, 5)]),
    ([(0, 3, 100, 10), (4, 2, 130, 10)], [(0, 3, 100, 10), (4, 2, 130, 10)]),
    ([(0, 1, 100, 0), (1, 4, 103, 4)], [(0, 1, 100, 0), (1, 4, 103, 4)]),
    # Never a zero or negative stride between distinct rows.
    ([(0, 1, 100, 0), (1, 1, 100, 0)], [(0, 1, 100, 0), (1, 1, 100, 0)]),
    ([(0, 1, 100, 0), (1, 1, 90, 0)], [(0, 1, 100, 0), (1, 1, 90, 0)]),
])
def test_merge_runs(runs, merged):
    from sw.compiler import merge_runs
    assert merge_runs(runs) == merged


def test_program_body_drops_end():
    program = compile_at(NPUConfig.from_name("4x4"), 3, 3, 3)
    assert program.body == program.words[:-1]
    assert codec.decode(program.words[-1]) == (Opcode.END, {})


# The programs are word-for-word those of before the compiler became a package -----------------

#: sha256 (first 16 hex digits) of the programs of :func:`golden_programs`, by family and
#: config, computed on the tree before ``sw/compiler.py`` was split into ``sw/compiler/``.
GOLDEN = {
    "8x8": {"gemm": "4993e0b38fd22797", "qgemm": "17361f263ed6bc94", "conv": "354c54dbe89fde44",
            "depthwise": "25c92ba57f4798be"},
    "4x4": {"gemm": "3838d02c3a921105", "qgemm": "23b8f2b55eb16726", "conv": "27a0c999ca22c126",
            "depthwise": "a252adaa79ec7353"},
}


def golden_programs(config):
    """``{family: [program, ...]}``: GEMMs of every schedule, quantized GEMMs of both modes,
    convolutions of both lowerings, with fixed addresses."""
    from hw.isa import QuantMode
    from sw.compiler import compile_qgemm
    from sw.compiler import Conv2dGeometry, compile_conv2d
    quant_addresses = dict(bias_addr=0x50000, quant_addr=0x60000, y_addr=0x70000)
    families = {"gemm": [], "qgemm": [], "conv": [], "depthwise": []}
    for schedule in ("auto", "overlap", "resident", "streaming"):
        for m, k, n in ((37, 50, 23), (200, 17, 70), (5, 9, 3)):
            families["gemm"].append(compile_gemm(
                config, m, k, n, a_addr=0x1000, b_addr=0x40000, c_addr=0x80000,
                schedule=schedule))
        families["gemm"].append(compile_gemm(
            config, 30, 40, 50, a_addr=0x1000, b_addr=0x40000, c_addr=0x80000,
            schedule=schedule, a_stride=48, b_stride=64))
    channels = 12
    block_diagonal = ((np.arange(9 * channels * channels).reshape(3, 3, channels, channels)
                       % 7 + 1).astype(np.int8) * np.eye(channels, dtype=np.int8))
    for schedule in ("auto", "resident", "streaming"):
        for (m, k, n), mode in itertools.product(((37, 50, 23), (300, 17, 9)), QuantMode):
            families["qgemm"].append(compile_qgemm(
                config, m, k, n, a_addr=0x1000, b_addr=0x40000, **quant_addresses,
                out_zero_point=-3, act_min=-100, act_max=120, schedule=schedule,
                quant_mode=mode))
        families["qgemm"].append(compile_qgemm(
            config, 20, 30, 10, a_addr=0x1000, b_addr=0x40000, **quant_addresses,
            out_zero_point=0, act_min=-128, act_max=127, y_stride=16, schedule=schedule))
        conv_operands = dict(x_addr=0x1000, w_addr=0x40000, **quant_addresses,
                             out_zero_point=1, act_min=-128, act_max=127, schedule=schedule)
        for geometry, lowerings in (
                (Conv2dGeometry(2, 6, 5, 3, 7, 3, 3, padding=1), ("taps", "kernel_rows")),
                (Conv2dGeometry(1, 9, 9, 12, 5, 3, 3, stride=2, padding=(1, 0, 0, 1),
                                out_padding=1), ("taps", "kernel_rows")),
                (Conv2dGeometry(1, 4, 4, 16, 16, 1, 1, in_pixel_stride=20,
                                out_pixel_stride=24), ("taps",))):
            for lowering in lowerings:
                families["conv"].append(compile_conv2d(config, geometry, **conv_operands,
                                                       lowering=lowering))
        geometry = Conv2dGeometry(2, 6, 5, channels, channels, 3, 3, padding=1)
        for lowering in ("taps", "kernel_rows"):
            families["depthwise"].append(compile_conv2d(
                config, geometry, **conv_operands, lowering=lowering, weights=block_diagonal))
    return families


def digest(programs):
    import hashlib
    return hashlib.sha256(b"".join(program.bytes for program in programs)).hexdigest()[:16]


@pytest.mark.parametrize("config_name", ["8x8", "4x4"])
def test_programs_are_unchanged(config_name):
    families = golden_programs(NPUConfig.from_name(config_name))
    assert {family: digest(programs) for family, programs in families.items()} == \
        GOLDEN[config_name]


def test_compile_reuses_a_given_plan():
    """``compile_*(plan=...)`` emits the program of that plan without planning again, and
    refuses a plan made for another layer or schedule."""
    from unittest import mock
    from sw.compiler import compile_qgemm, gemm, plan_qgemm, quantized
    config = NPUConfig.from_name("4x4")
    plan = plan_gemm(config, 20, 9, 7, schedule="streaming")
    with mock.patch.object(gemm, "plan_gemm", side_effect=AssertionError("planned twice")):
        program = compile_gemm(config, 20, 9, 7, a_addr=A_ADDR, b_addr=B_ADDR, c_addr=C_ADDR,
                               plan=plan)
    assert program.plan == plan
    assert program.words == compile_at(config, 20, 9, 7, schedule="streaming").words
    qplan = plan_qgemm(config, 20, 9, 7)
    quant_operands = dict(a_addr=A_ADDR, b_addr=B_ADDR, bias_addr=C_ADDR, quant_addr=C_ADDR + 64,
                          y_addr=C_ADDR + 128, out_zero_point=0, act_min=-128, act_max=127)
    with mock.patch.object(quantized, "plan_quantized",
                           side_effect=AssertionError("planned twice")):
        program = compile_qgemm(config, 20, 9, 7, **quant_operands, plan=qplan)
    assert program.plan == qplan
    with pytest.raises(NPUValueError, match=r"plan was made for .* not \('4x4', 20, 9, 8, 1\)"):
        compile_gemm(config, 20, 9, 8, a_addr=A_ADDR, b_addr=B_ADDR, c_addr=C_ADDR, plan=plan)
    with pytest.raises(NPUValueError, match="streaming schedule, but schedule 'resident'"):
        compile_gemm(config, 20, 9, 7, a_addr=A_ADDR, b_addr=B_ADDR, c_addr=C_ADDR,
                     schedule="resident", plan=plan)
    with pytest.raises(NPUTypeError, match="plan must be a Plan"):
        compile_qgemm(config, 20, 9, 7, **quant_operands, plan="resident")


# Planning counts what emission emits, without emitting it (issue 51: a real network's plan
# in seconds) ---------------------------------------------------------------------------------

def random_gathers(seed, count):
    """``count`` random quantized layers (GEMMs and convolutions of both lowerings, some with
    known weights that have all-zero tiles) with a config and a block size each."""
    import random
    from sw.compiler import Conv2dGeometry, ConvGather, GemmGather
    rng = random.Random(seed)
    weights_rng = np.random.default_rng(seed)
    for _ in range(count):
        config = NPUConfig.from_name(rng.choice(["1x1", "2x2", "3x5", "4x4", "8x8"]),
                                     spad_depth=rng.choice([16, 40, 2048]),
                                     acc_depth=rng.choice([8, 33, 512]))
        if rng.random() < 0.4:
            gather = GemmGather(rng.randint(1, 80), rng.randint(1, 40), rng.randint(1, 30))
        else:
            kh, kw = rng.randint(1, 3), rng.randint(1, 3)
            geometry = Conv2dGeometry(
                rng.randint(1, 3), rng.randint(kh, 9), rng.randint(kw, 9), rng.randint(1, 12),
                rng.randint(1, 12), kh, kw, stride=rng.randint(1, 2),
                padding=tuple(rng.randint(0, 1) for _ in range(4)),
                out_padding=rng.randint(0, 1))
            gather = ConvGather(geometry, rng.choice(["taps", "kernel_rows"]))
        if rng.random() < 0.5:
            weights = weights_rng.integers(-3, 3, (gather.taps, gather.k_tap, gather.n))
            weights[weights_rng.random(weights.shape) < rng.random()] = 0
            gather.know_weights(weights.astype(np.int8))
        schedule = rng.choice(["resident", "streaming"])
        slices = gather.taps * -(-gather.k_tap // config.rows)
        capacity = config.spad_depth - config.rows
        most = capacity // slices if schedule == "resident" else capacity
        if most < 1:
            continue
        yield config, gather, schedule, rng.randint(1, min(most, config.acc_depth, gather.m))


def test_counted_plan_is_the_dry_emission():
    """The plan's counts (:func:`sw.compiler.quantized._count_quantized`, which walks the
    m-blocks only) equal those of emitting the program without encoding it, count by count."""
    from sw.compiler.emitter import Emitter
    from sw.compiler.quantized import _count_quantized, _emit_quantized
    checked = 0
    for config, gather, schedule, block_rows in random_gathers(seed=51, count=300):
        dry = Emitter(config, dry=True)
        _emit_quantized(dry, config, gather, schedule, block_rows, (0,) * 5, 0, -128, 127)
        counted = _count_quantized(config, gather, schedule, block_rows)
        names = ("instructions", "bytes_read", "bytes_written", "spad_rows_used",
                 "acc_rows_used", "weight_loads")
        assert {name: getattr(counted, name) for name in names} == \
            {name: getattr(dry, name) for name in names}, (config, gather, schedule, block_rows)
        assert all(type(getattr(counted, name)) is int for name in names)
        checked += 1
    assert checked > 200


def test_nonzero_tiles_answer_as_tile_is_zero():
    for config, gather, _, _ in random_gathers(seed=7, count=40):
        rows, cols = config.rows, config.cols
        table = gather.nonzero_tiles(rows, cols)
        for tap, k_tile, n_tile in itertools.product(*map(range, table.shape)):
            k, n = k_tile * rows, n_tile * cols
            assert table[tap, k_tile, n_tile] == (not gather.tile_is_zero(
                tap, k, k + rows, n, n + cols))


def test_batched_encoding_is_the_codec_s():
    """The emitter encodes in batches with numpy: every program is word for word what
    encoding one instruction at a time with :func:`sw.codec.encode` gives."""
    from unittest import mock
    from sw.compiler import emitter
    config = NPUConfig.from_name("4x4")
    batched = golden_programs(config)
    with mock.patch.object(emitter, "encode_rows", emitter._encode_each), \
            mock.patch.object(emitter, "BATCH", 7):
        one_by_one = golden_programs(config)
    for family, programs in batched.items():
        assert [p.words for p in programs] == [p.words for p in one_by_one[family]], family
        assert all(type(word) is int for p in programs for word in p.words)


def test_batched_encoding_keeps_the_codec_s_errors():
    from hw.isa import QuantMode
    from sw.compiler.emitter import Emitter
    config = NPUConfig.from_name("4x4")
    extremes = Emitter(config)
    extremes.load_spad(0xFFFF, 0xFFFF, 0xFFFF, 0xFFFF_FFFF, 0xFFFF_FFFF)
    extremes.load_quant(0xFFFF_FFFF, 0, 0xFFFF, -(1 << 14), -128, 127, QuantMode.FLOAT)
    extremes.matmul(1, 2, 3, True, k_width=511, n_width=0)
    extremes.end()
    assert extremes.words == [
        codec.encode(Opcode.LOAD_SPAD, local_addr=0xFFFF, rows=0xFFFF, row_bytes=0xFFFF,
                     dram_addr=0xFFFF_FFFF, dram_stride=0xFFFF_FFFF),
        codec.encode(Opcode.LOAD_QUANT, dram_addr=0xFFFF_FFFF, dram_stride=0,
                     row_bytes=0xFFFF, zero_point=-(1 << 14), act_min=-128, act_max=127,
                     mode=QuantMode.FLOAT),
        codec.encode(Opcode.MATMUL, spad_addr=1, acc_addr=2, rows=3, accumulate=1,
                     k_width=511),
        codec.encode(Opcode.END)]
    too_far = Emitter(config)
    too_far.preload(3)
    too_far.load_acc(0, 1, 4, 1 << 32, 0)
    with pytest.raises(NPUValueError, match=r"LOAD_ACC field dram_addr must be in "
                                            r"0\.\.4294967295 \(32 bits\), not 4294967296"):
        too_far.words
    not_int = Emitter(config)
    not_int.store(0, 1.5, 4, 0, 0)
    with pytest.raises(NPUTypeError, match="STORE field rows must be an integer"):
        not_int.words


#: sha256 (first 16 hex digits) of :func:`larger_programs`, computed on the tree before the
#: plan was counted and the words encoded in batches (issue 51): the same programs.
GOLDEN_LARGER = {"8x8": "5280c8667345e805", "16x16": "6b528eeaef50721c"}


def larger_programs(config):
    """Convolutions of hundreds of m-blocks (two images, padding, stride 2; with and without
    weights whose all-zero tiles are skipped) and a GEMM of long K, in every schedule: 200,983
    instructions on 8x8."""
    from hw.isa import QuantMode
    from sw.compiler import Conv2dGeometry, compile_conv2d, compile_qgemm
    quant = dict(bias_addr=0x500000, quant_addr=0x600000, y_addr=0x700000, out_zero_point=2,
                 act_min=-120, act_max=127)
    weights = np.random.default_rng(51).integers(-8, 8, (3, 3, 48, 40)).astype(np.int8)
    weights[:, :, :16, :] = 0
    programs = []
    for schedule in ("auto", "resident", "streaming"):
        for geometry in (Conv2dGeometry(2, 20, 18, 48, 40, 3, 3, padding=1, out_padding=1),
                         Conv2dGeometry(1, 23, 23, 48, 40, 3, 3, stride=2)):
            for known in (None, weights):
                programs.append(compile_conv2d(config, geometry, x_addr=0x1000, w_addr=0x400000,
                                               weights=known, schedule=schedule,
                                               quant_mode=QuantMode.FLOAT, **quant))
        programs.append(compile_qgemm(config, 3, 2000, 300, a_addr=0x1000, b_addr=0x10000,
                                      schedule=schedule, **quant))
    return programs


@pytest.mark.parametrize("config_name", sorted(GOLDEN_LARGER))
def test_larger_programs_are_unchanged(config_name):
    assert digest(larger_programs(NPUConfig.from_name(config_name))) == \
        GOLDEN_LARGER[config_name]
