"""Quantized 2-D convolution lowered onto the array without im2col, on the model backend."""

import numpy as np
import pytest

from hw.config import MAX_K, NPUConfig
from hw.isa import Opcode, QuantMode
from quant_cases import random_conv_problem, random_int8, random_requantization
from sw import codec
from sw.compiler import (LOWERINGS, SCHEDULES, Conv2dGeometry, compile_conv2d,
                         compile_depthwise_conv2d, depthwise_weights, plan_conv2d,
                         plan_depthwise_conv2d)
from sw.conv import conv2d, conv2d_batch, padded_input, prepare_conv2d, reference_conv2d
from sw.driver import POISON, QuantResult, fold_zero_point, qgemm
from sw.errors import NPUTypeError, NPUValueError, PlanError
from sw.model import ModelNPU
from sw.quant import requantize, requantize_float


SEED = 20240919


def check(problem, config, **options):
    result = conv2d(**problem, config=config, **options)
    expected = reference_conv2d(**problem)
    assert isinstance(result, QuantResult)
    assert result.y.dtype == np.int8 and result.y.shape == expected.shape
    assert np.array_equal(result.y, expected)
    assert result.instructions == result.plan.instructions
    return result


# Bit-exact on many shapes ---------------------------------------------------------------------

CASES = [
    # (config, batch, height, width, in_channels, out_channels, kernel, stride, padding)
    ("4x4", 1, 5, 5, 3, 2, 3, 1, 1),
    ("4x4", 2, 7, 9, 5, 6, 3, 1, 1),
    ("4x4", 1, 8, 8, 4, 4, 3, 2, 1),
    ("3x5", 1, 11, 10, 13, 7, 5, 2, 2),
    ("3x5", 2, 6, 7, 7, 11, 5, 1, 2),
    ("3x5", 1, 9, 9, 3, 4, 3, 2, 0),
    ("8x8", 1, 12, 11, 19, 21, 3, 1, 0),
    ("8x8", 3, 5, 4, 9, 17, 1, 1, 0),
    ("8x8", 1, 9, 13, 10, 3, 1, 2, 0),
    ("8x8", 1, 6, 6, 5, 5, 1, 1, 2),                       # 1x1 with padding: border only
    ("1x1", 1, 4, 5, 3, 2, 3, 2, 1),
    ("16x16", 1, 10, 10, 33, 20, 3, 1, 1),
    ("2x3", 2, 6, 5, 2, 5, (3, 1), 1, (1, 1, 0, 0)),       # KH != KW, padding per side
    ("4x4", 1, 7, 8, 6, 5, (1, 5), 2, (0, 1, 2, 1)),
    ("4x4", 1, 8, 8, 5, 3, 3, 2, (0, 1, 0, 1)),            # TFLite's SAME for stride 2
    ("5x3", 1, 3, 3, 7, 4, 5, 1, 2),                       # kernel larger than the input
    ("4x4", 1, 4, 4, 4, 4, 5, 3, 2),                       # stride larger than 2
]


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("case", CASES, ids=lambda case: "-".join(map(str, case)))
def test_shapes_bit_exact(case, lowering):
    config_name, batch, height, width, in_channels, out_channels, kernel, stride, padding = \
        case
    seed = SEED + CASES.index(case)
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    problem = random_conv_problem(rng, batch, height, width, in_channels, out_channels, kernel,
                                  stride, padding)
    before = {name: np.copy(value) for name, value in problem.items()}
    result = check(problem, NPUConfig.from_name(config_name), lowering=lowering)
    assert result.y.size < 20 or len(np.unique(result.y)) > 8
    kernel_height, kernel_width = problem["w"].shape[:2]
    # One GEMM per kernel tap, or per kernel row of KW * C_in.
    assert (result.plan.taps, result.plan.k_tap) == (
        (kernel_height * kernel_width, in_channels) if lowering == "taps" else
        (kernel_height, kernel_width * in_channels))
    for name, value in problem.items():
        assert np.array_equal(value, before[name]), name


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("case", CASES[::3], ids=lambda case: "-".join(map(str, case)))
def test_float_mode_shapes_bit_exact(case, lowering):
    """The float mode (``scale=``) on every third shape: onnxruntime's requantization."""
    config_name, batch, height, width, in_channels, out_channels, kernel, stride, padding = \
        case
    seed = SEED + 1000 + CASES.index(case)
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    problem = random_conv_problem(rng, batch, height, width, in_channels, out_channels, kernel,
                                  stride, padding, float_mode=True)
    result = check(problem, NPUConfig.from_name(config_name), lowering=lowering)
    assert result.y.size < 20 or len(np.unique(result.y)) > 8
    job = prepare_conv2d(**problem, config=NPUConfig.from_name(config_name), lowering=lowering)
    loads = [fields for op, fields in map(codec.decode, job.program.words)
             if op is Opcode.LOAD_QUANT]
    assert loads and all(fields["mode"] == QuantMode.FLOAT for fields in loads)
    quant = job.dram[job.layout.span("quant")]
    assert np.array_equal(quant[:4 * out_channels].view("<f4"), problem["scale"])
    assert not quant[4 * out_channels:].any()


def test_float_reference_against_a_scalar_loop():
    seed = SEED + 650
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    problem = random_conv_problem(rng, 1, 4, 5, 3, 4, 3, 1, 1, float_mode=True)
    expected = reference_conv2d(**problem)
    padded = padded_input(problem["x"], 1, problem["in_zero_point"]).astype(np.int64) - \
        problem["in_zero_point"]
    for oh, ow, co in np.ndindex(expected.shape[1:]):
        acc = int(problem["bias"][co]) + int(
            (padded[0, oh:oh + 3, ow:ow + 3, :] * problem["w"][:, :, :, co]).sum())
        y = requantize_float(np.array([acc], np.int32), problem["scale"][co:co + 1],
                             problem["out_zero_point"], problem["act_min"],
                             problem["act_max"])[0]
        assert expected[0, oh, ow, co] == y, (oh, ow, co)


@pytest.mark.parametrize("schedule", ["resident", "streaming"])
@pytest.mark.parametrize("config", [
    NPUConfig(rows=4, cols=4, spad_depth=64, acc_depth=16),
    NPUConfig(rows=2, cols=3, spad_depth=5, acc_depth=3),
    NPUConfig(rows=1, cols=1, spad_depth=2, acc_depth=1),
], ids=["4x4-small", "2x3-tiny", "1x1-tiny"])
def test_schedules_and_small_memories(config, schedule):
    # Blocks smaller than an output row, and blocks of several output rows.
    seed = SEED + 100
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    problem = random_conv_problem(rng, 2, 5, 7, 3, 4, 3, 1, 1)
    try:
        result = check(problem, config, schedule=schedule)
    except PlanError:
        assert schedule == "resident"
        return
    assert result.plan.schedule == schedule
    assert result.plan.m_blocks > 1


def test_output_row_longer_than_the_accumulator():
    seed = SEED + 200
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    config = NPUConfig(rows=4, cols=4, spad_depth=128, acc_depth=8)
    result = check(random_conv_problem(rng, 1, 3, 21, 3, 5, 3, 1, 1), config)
    # Blocks of 8 pixels, cut across image rows of 21.
    assert result.plan.block_rows == 8 and result.plan.m_blocks == 8


@pytest.mark.parametrize("in_zero_point", [-128, 0, 127])
def test_input_zero_point_pads(in_zero_point):
    seed = SEED + 300
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    check(random_conv_problem(rng, 1, 6, 6, 3, 4, 3, 1, 2, in_zero_point=in_zero_point),
          NPUConfig.from_name("4x4"))


def test_the_seeds_pointwise_layer():
    # Seeds section 4.1: a 1x1 convolution, C_in = C_out = 100, 56x56, here on 16x16.
    seed = SEED + 400
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    config = NPUConfig.from_name("16x16")
    problem = random_conv_problem(rng, 1, 56, 56, 100, 100, 1)
    result = check(problem, config)
    plan = result.plan
    assert (plan.m, plan.k, plan.n, plan.taps) == (3136, 100, 100, 1)
    assert (plan.k_tiles, plan.n_tiles, plan.weight_tiles) == (7, 7, 49)
    assert plan.tile_fill == 10_000 / (49 * 256)
    # A 1x1 convolution with stride 1 and no padding reads its input as one GEMM: one
    # activation load per (m-block, k-tile) at most, and one STORE_Q per (m-block, n-tile).
    program = compile_conv2d(config, Conv2dGeometry(1, 56, 56, 100, 100, 1, 1),
                             x_addr=0, w_addr=0x100000, bias_addr=0x200000,
                             quant_addr=0x200200, y_addr=0x300000, out_zero_point=0,
                             act_min=-128, act_max=127, schedule=plan.schedule)
    ops = [codec.decode(word)[0] for word in program.words]
    assert ops.count(Opcode.STORE_Q) == plan.m_blocks * plan.n_tiles
    weight_loads = plan.weight_loads
    assert ops.count(Opcode.LOAD_SPAD) - weight_loads <= plan.m_blocks * plan.k_tiles * (
        1 if plan.schedule == "resident" else plan.n_tiles)
    assert plan.instructions < 2500
    # It equals the same layer as a quantized GEMM on the flattened pixels.
    as_gemm = qgemm(problem["x"].reshape(3136, 100), problem["w"].reshape(100, 100),
                    problem["bias"], problem["multiplier"], problem["shift"],
                    out_zero_point=problem["out_zero_point"], act_min=problem["act_min"],
                    act_max=problem["act_max"], a_zero_point=problem["in_zero_point"],
                    config=config)
    assert np.array_equal(as_gemm.y.reshape(1, 56, 56, 100), result.y)


def test_batch():
    seed = SEED + 500
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    problems = [random_conv_problem(rng, 1, 5, 5, 2, 3, 3, 1, 1),
                random_conv_problem(rng, 2, 4, 6, 5, 2, 1, 2, 0)]
    results = conv2d_batch(problems, config=NPUConfig.from_name("2x2"))
    for problem, result in zip(problems, results):
        assert np.array_equal(result.y, reference_conv2d(**problem))


# The reference --------------------------------------------------------------------------------

def test_reference_against_a_scalar_loop():
    seed = SEED + 600
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    problem = random_conv_problem(rng, 2, 5, 4, 3, 2, (3, 2), 2, (1, 0, 2, 1))
    x, w, bias = problem["x"], problem["w"], problem["bias"]
    zero_point = problem["in_zero_point"]
    expected = reference_conv2d(**problem)
    batch, height, width, in_channels = x.shape
    kernel_height, kernel_width, _, out_channels = w.shape
    top, left, stride = 1, 2, 2
    out_height = (height + 1 - kernel_height) // stride + 1
    out_width = (width + 3 - kernel_width) // stride + 1
    assert expected.shape == (batch, out_height, out_width, out_channels)
    for b in range(batch):
        for oh in range(out_height):
            for ow in range(out_width):
                for co in range(out_channels):
                    acc = int(bias[co])
                    for kh in range(kernel_height):
                        for kw in range(kernel_width):
                            ih, iw = oh * stride + kh - top, ow * stride + kw - left
                            for ci in range(in_channels):
                                inside = 0 <= ih < height and 0 <= iw < width
                                value = int(x[b, ih, iw, ci]) if inside else zero_point
                                acc += (value - zero_point) * int(w[kh, kw, ci, co])
                    y = requantize(np.array([[acc]]), problem["multiplier"][co],
                                   problem["shift"][co], problem["out_zero_point"],
                                   problem["act_min"], problem["act_max"])[0, 0]
                    assert expected[b, oh, ow, co] == y, (b, oh, ow, co)


def test_padded_input():
    x = np.arange(12, dtype=np.int8).reshape(1, 2, 2, 3)
    buffer = padded_input(x, (1, 0, 2, 1), -5, pixel_stride=4)
    assert buffer.shape == (1, 3, 5, 4) and buffer.dtype == np.int8
    assert np.array_equal(buffer[0, 1:, 2:4, :3], x[0])
    mask = np.ones(buffer.shape, dtype=bool)
    mask[0, 1:, 2:4, :3] = False
    assert np.all(buffer[mask] == -5)
    with pytest.raises(NPUValueError, match="pixel_stride must be at least the 3"):
        padded_input(x, 1, 0, pixel_stride=2)
    with pytest.raises(NPUValueError, match="zero_point must be within"):
        padded_input(x, 1, 128)
    with pytest.raises(NPUTypeError, match="x must have dtype int8"):
        padded_input(x.astype(np.int16), 1, 0)


# The program ----------------------------------------------------------------------------------

def test_one_load_per_output_row_tap_and_k_tile():
    # A 3x3, stride 2, padding 1 convolution: check every activation load against the
    # formula base + ((b * Hp + oh * s + kh) * Wp + kw) * C_in + k0, stride s * C_in.
    config = NPUConfig(rows=4, cols=4, spad_depth=512, acc_depth=64)
    geometry = Conv2dGeometry(batch=2, height=7, width=6, in_channels=6, out_channels=5,
                              kernel_height=3, kernel_width=3, stride=2, padding=1)
    assert (geometry.padded_height, geometry.padded_width) == (9, 8)
    assert (geometry.out_height, geometry.out_width) == (4, 3)
    x_addr = 0x1000
    program = compile_conv2d(config, geometry, x_addr=x_addr, w_addr=0x2000,
                             bias_addr=0x3000, quant_addr=0x3100, y_addr=0x4000,
                             out_zero_point=0, act_min=-128, act_max=127,
                             schedule="streaming")
    assert program.plan.m_blocks == 1 and program.plan.block_rows == 24
    loads = [fields for op, fields in map(codec.decode, program.words)
             if op is Opcode.LOAD_SPAD and fields["local_addr"] >= config.rows]
    expected = []
    for n_start in (0, 4):
        for kh in range(3):
            for kw in range(3):
                for k0 in (0, 4):
                    for b in range(2):
                        for oh in range(4):
                            expected.append(dict(
                                local_addr=config.rows + (b * 4 + oh) * 3, rows=3,
                                row_bytes=min(4, 6 - k0),
                                dram_addr=x_addr + ((b * 9 + oh * 2 + kh) * 8 + kw) * 6 + k0,
                                dram_stride=2 * 6))
    assert loads == expected
    weights = [fields for op, fields in map(codec.decode, program.words)
               if op is Opcode.LOAD_SPAD and fields["local_addr"] == 0]
    assert weights[:3] == [dict(local_addr=0, rows=4, row_bytes=4, dram_addr=0x2000,
                                dram_stride=5),
                           dict(local_addr=0, rows=2, row_bytes=4, dram_addr=0x2000 + 4 * 5,
                                dram_stride=5),
                           dict(local_addr=0, rows=4, row_bytes=4,
                                dram_addr=0x2000 + 6 * 5, dram_stride=5)]
    stores = [fields for op, fields in map(codec.decode, program.words)
              if op is Opcode.STORE_Q]
    # No output padding: the whole output is one run per n-tile.
    assert stores == [dict(acc_addr=0, rows=24, row_bytes=4, dram_addr=0x4000, dram_stride=5),
                      dict(acc_addr=0, rows=24, row_bytes=1, dram_addr=0x4004,
                           dram_stride=5)]
    assert program.addresses == dict(x_addr=x_addr, w_addr=0x2000, bias_addr=0x3000,
                                     quant_addr=0x3100, y_addr=0x4000)


def test_plan_matches_program_for_every_schedule():
    config = NPUConfig(rows=3, cols=5, spad_depth=200, acc_depth=20)
    geometry = Conv2dGeometry(batch=2, height=6, width=7, in_channels=7, out_channels=6,
                              kernel_height=3, kernel_width=3, stride=1, padding=1,
                              out_padding=(1, 2, 0, 3), out_pixel_stride=8)
    with pytest.raises(PlanError, match="overlap schedule is for plain GEMMs"):
        plan_conv2d(config, geometry, schedule="overlap")
    for schedule in set(SCHEDULES) - {"overlap"}:
        plan = plan_conv2d(config, geometry, schedule=schedule)
        program = compile_conv2d(config, geometry, x_addr=0, w_addr=0x1000, bias_addr=0x2000,
                                 quant_addr=0x2100, y_addr=0x3000, out_zero_point=1,
                                 act_min=-128, act_max=127, schedule=schedule)
        assert program.plan == plan and len(program) == plan.instructions
        stores = [fields for op, fields in map(codec.decode, program.words)
                  if op is Opcode.STORE_Q]
        assert plan.dram_bytes_written == sum(f["rows"] * f["row_bytes"] for f in stores) \
            == geometry.m * 6
        # Output padding: the rows of an image row are contiguous, the next one is not.
        assert all(f["rows"] <= geometry.out_width and f["dram_stride"] == 8 for f in stores)


def test_chained_layers_through_a_padded_buffer():
    # Layer 1 writes into the interior of layer 2's padded input buffer; the two programs
    # are concatenated into one, and nothing is copied between them.
    seed = SEED + 700
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    config = NPUConfig.from_name("4x4")
    first = random_conv_problem(rng, 1, 9, 8, 3, 6, 3, 2, 1)
    hidden = reference_conv2d(**first)
    _, height, width, channels = hidden.shape
    bias, multiplier, shift, out_zero_point, act_min, act_max = random_requantization(
        rng, 5, 3 * 3 * channels)
    second = dict(w=random_int8(rng, (3, 3, channels, 5)), bias=bias, multiplier=multiplier,
                  shift=shift, stride=1, padding=1, in_zero_point=first["out_zero_point"],
                  out_zero_point=out_zero_point, act_min=act_min, act_max=act_max)
    expected = reference_conv2d(hidden, **second)

    geometry_1 = Conv2dGeometry(1, 9, 8, 3, channels, 3, 3, stride=2, padding=1,
                                out_padding=1)
    geometry_2 = Conv2dGeometry(1, height, width, channels, 5, 3, 3, stride=1, padding=1)
    assert geometry_1.output_bytes == geometry_2.input_bytes
    regions = dict(x1=0x8000, w1=0x9000, b1=0xA000, q1=0xA100, h=0xB000, w2=0xC000,
                   b2=0xD000, q2=0xD100, y=0xE000)
    layer_1 = compile_conv2d(config, geometry_1, x_addr=regions["x1"], w_addr=regions["w1"],
                             bias_addr=regions["b1"], quant_addr=regions["q1"],
                             y_addr=regions["h"], out_zero_point=first["out_zero_point"],
                             act_min=first["act_min"], act_max=first["act_max"])
    layer_2 = compile_conv2d(config, geometry_2, x_addr=regions["h"], w_addr=regions["w2"],
                             bias_addr=regions["b2"], quant_addr=regions["q2"],
                             y_addr=regions["y"], out_zero_point=out_zero_point,
                             act_min=act_min, act_max=act_max)
    words = layer_1.body + layer_2.body + [codec.encode(Opcode.END)]
    assert len(words) == len(layer_1) + len(layer_2) - 1
    assert len(words) * 16 <= regions["x1"]

    dram = np.zeros(0x10000, dtype=np.uint8)
    image = codec.pack_words(words)
    dram[:len(image)] = np.frombuffer(image, dtype=np.uint8)

    def put(name, array):
        raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        dram[regions[name]:regions[name] + raw.size] = raw

    put("x1", padded_input(first["x"], 1, first["in_zero_point"]))
    put("w1", first["w"])
    put("b1", fold_zero_point(first["bias"], first["w"].astype(np.int64).sum((0, 1, 2)),
                              first["in_zero_point"], "b1"))
    put("q1", np.concatenate([first["multiplier"], first["shift"]]))
    # The hidden buffer's border is written once, with layer 2's input zero point.
    put("h", np.full((1, height + 2, width + 2, channels), second["in_zero_point"], np.int8))
    put("w2", second["w"])
    put("b2", fold_zero_point(bias, second["w"].astype(np.int64).sum((0, 1, 2)),
                              second["in_zero_point"], "b2"))
    put("q2", np.concatenate([multiplier, shift]))
    put("y", np.full(expected.size, POISON, np.uint8))

    result = ModelNPU(config).run(dram, 0, len(words))
    assert result.done, result
    y = result.dram[regions["y"]:regions["y"] + expected.size].view(np.int8)
    assert np.array_equal(y.reshape(expected.shape), expected)
    buffer = result.dram[regions["h"]:regions["h"] + geometry_2.input_bytes].view(np.int8)
    assert np.array_equal(buffer.reshape(1, height + 2, width + 2, channels),
                          padded_input(hidden, 1, second["in_zero_point"]))


def test_channel_slices_of_wider_tensors():
    # Read channels 2..4 of a 7-channel tensor, write channels 3..6 of a 9-channel one (a
    # concatenation), leaving the other channels alone.
    seed = SEED + 800
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    config = NPUConfig.from_name("2x2")
    problem = random_conv_problem(rng, 1, 5, 4, 3, 4, 3, 1, 1)
    expected = reference_conv2d(**problem)
    wide_input = padded_input(random_int8(rng, (1, 5, 4, 7)), 1, 0)
    wide_input[:, :, :, 2:5] = padded_input(problem["x"], 1, problem["in_zero_point"])
    geometry = Conv2dGeometry(1, 5, 4, 3, 4, 3, 3, stride=1, padding=1, in_pixel_stride=7,
                              out_pixel_stride=9)
    program = compile_conv2d(config, geometry, x_addr=0x1000 + 2, w_addr=0x2000,
                             bias_addr=0x3000, quant_addr=0x3100, y_addr=0x4000 + 3,
                             out_zero_point=problem["out_zero_point"],
                             act_min=problem["act_min"], act_max=problem["act_max"])
    dram = np.zeros(0x5000, dtype=np.uint8)
    dram[:len(program) * 16] = np.frombuffer(program.bytes, dtype=np.uint8)
    dram[0x1000:0x1000 + wide_input.size] = wide_input.view(np.uint8).reshape(-1)
    dram[0x2000:0x2000 + problem["w"].size] = problem["w"].view(np.uint8).reshape(-1)
    folded = fold_zero_point(problem["bias"], problem["w"].astype(np.int64).sum((0, 1, 2)),
                             problem["in_zero_point"], "bias")
    dram[0x3000:0x3010] = folded.view(np.uint8)
    dram[0x3100:0x3120] = np.concatenate([problem["multiplier"],
                                          problem["shift"]]).view(np.uint8)
    dram[0x4000:0x4000 + 20 * 9] = POISON
    result = ModelNPU(config).run(dram, 0, len(program))
    assert result.done, result
    output = result.dram[0x4000:0x4000 + 20 * 9].view(np.int8).reshape(1, 5, 4, 9)
    assert np.array_equal(output[..., 3:7], expected)
    assert np.all(output[..., :3].view(np.uint8) == POISON)
    assert np.all(output[..., 7:].view(np.uint8) == POISON)


# Geometry and bad input -----------------------------------------------------------------------

def test_geometry():
    geometry = Conv2dGeometry(batch=2, height=10, width=12, in_channels=3, out_channels=8,
                              kernel_height=3, kernel_width=5, stride=2,
                              padding=(1, 2, 0, 3), out_padding=1)
    assert geometry.padding == (1, 2, 0, 3) and geometry.out_padding == (1, 1, 1, 1)
    assert (geometry.padded_height, geometry.padded_width) == (13, 15)
    assert (geometry.out_height, geometry.out_width) == (6, 6)
    assert (geometry.out_buffer_height, geometry.out_buffer_width) == (8, 8)
    assert (geometry.m, geometry.k, geometry.taps) == (72, 45, 15)
    assert geometry.input_bytes == 2 * 13 * 15 * 3
    assert geometry.output_bytes == 2 * 8 * 8 * 8
    assert geometry.weight_bytes == 45 * 8


@pytest.mark.parametrize("changes, error, match", [
    (dict(batch=0), NPUValueError, "batch must be a positive integer, not 0"),
    (dict(stride=0), NPUValueError, "stride must be a positive integer"),
    (dict(kernel_height=2.0), NPUTypeError, "kernel_height must be an integer"),
    (dict(padding=-1), NPUValueError, "padding must not be negative"),
    (dict(padding=(1, 1)), NPUValueError, r"padding must be an integer or \(top, bottom"),
    (dict(out_padding=(0, 0, 0, -2)), NPUValueError, "out_padding must not be negative"),
    (dict(kernel_height=9), NPUValueError, "kernel does not fit the padded 6x6 input"),
    (dict(in_pixel_stride=2), NPUValueError, "in_pixel_stride must be at least the 3"),
    (dict(out_pixel_stride=3), NPUValueError, "out_pixel_stride must be at least the 4"),
    (dict(in_channels=MAX_K // 9 + 1, in_pixel_stride=None), NPUValueError, "MAX_K"),
])
def test_geometry_rejects(changes, error, match):
    arguments = dict(batch=1, height=6, width=6, in_channels=3, out_channels=4,
                     kernel_height=3, kernel_width=3)
    arguments.update(changes)
    with pytest.raises(error, match=match):
        Conv2dGeometry(**arguments)


def good_problem():
    return dict(x=np.ones((1, 4, 4, 3), np.int8), w=np.ones((3, 3, 3, 2), np.int8),
                bias=np.zeros(2, np.int32), multiplier=np.full(2, 1 << 30, np.int32),
                shift=np.zeros(2, np.int32), stride=1, padding=1, in_zero_point=0,
                out_zero_point=0, act_min=-128, act_max=127)


@pytest.mark.parametrize("changes, error, match", [
    (dict(x=np.ones((1, 4, 4, 3), np.float32)), NPUTypeError, "x must have dtype int8"),
    (dict(x=np.ones((4, 4, 3), np.int8)), NPUValueError, "x must be an NHWC tensor"),
    (dict(w=np.ones((3, 3, 3), np.int8)), NPUValueError, "w must be an HWIO weight tensor"),
    (dict(w=np.ones((3, 3, 3, 2), np.int16)), NPUTypeError, "w must have dtype int8"),
    (dict(w=np.ones((3, 3, 4, 2), np.int8)), NPUValueError, "input channels differ"),
    (dict(bias=np.zeros(3, np.int32)), NPUValueError, r"bias must have shape \(2,\)"),
    (dict(shift=np.array([0, 40], np.int32)), NPUValueError, r"shift\[1\] = 40"),
    (dict(in_zero_point=-129), NPUValueError, "in_zero_point must be within"),
    (dict(out_zero_point=300), NPUValueError, "out_zero_point must be within"),
    (dict(act_min=5, act_max=4), NPUValueError, "act_min must not exceed act_max"),
    (dict(stride=0), NPUValueError, "stride must be a positive integer"),
    (dict(padding=-2), NPUValueError, "padding must not be negative"),
    (dict(padding=0, w=np.ones((5, 5, 3, 2), np.int8)), NPUValueError,
     "kernel does not fit"),
    (dict(scale=np.ones(2, np.float32)), NPUValueError, "not both"),
    (dict(multiplier=None, shift=None), NPUValueError, "or scale"),
    (dict(multiplier=None, shift=None, scale=np.ones(2, np.float16)), NPUTypeError,
     "scale must be a numpy array of float32"),
    (dict(multiplier=None, shift=None, scale=np.array([np.nan, 1], np.float32)),
     NPUValueError, "scale must be finite"),
])
def test_conv2d_rejects(changes, error, match):
    problem = dict(good_problem(), **changes)
    with pytest.raises(error, match=match):
        conv2d(**problem)
    with pytest.raises(error, match=match):
        reference_conv2d(**problem)


def test_rejects_folded_bias_outside_int32():
    problem = good_problem()
    problem.update(w=np.full((3, 3, 3, 2), -128, np.int8), in_zero_point=-128,
                   bias=np.array([-(1 << 31) + 5, 0], np.int32))
    with pytest.raises(NPUValueError, match="does not fit INT32: channel 0"):
        conv2d(**problem)


def test_kernel_rows_lowering():
    # The same convolution and weights, 3 GEMMs of K = 3 * 2 instead of 9 of K = 2: on 8 rows
    # the weight tiles are 6/8 full instead of 2/8, and the program is shorter.
    seed = SEED + 900
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    config = NPUConfig.from_name("8x8")
    problem = random_conv_problem(rng, 2, 9, 7, 2, 8, 3, 2, (1, 0, 2, 1))
    taps = check(problem, config)
    rows = check(problem, config, lowering="kernel_rows")
    assert np.array_equal(taps.y, rows.y)
    assert (taps.plan.weight_tiles, taps.plan.tile_fill) == (9, 2 / 8)
    assert (rows.plan.weight_tiles, rows.plan.tile_fill) == (3, 6 / 8)
    assert rows.instructions < taps.instructions


@pytest.mark.parametrize("lowering, geometry, match", [
    ("rows", {}, r"lowering must be one of \('taps', 'kernel_rows'\), not 'rows'"),
    ("kernel_rows", dict(in_pixel_stride=4), "needs packed input pixels: in_pixel_stride 4 "
                                             "is not in_channels 3"),
])
def test_rejects_bad_lowering(lowering, geometry, match):
    config = NPUConfig.from_name("4x4")
    geometry = Conv2dGeometry(1, 4, 4, 3, 2, 3, 3, padding=1, **geometry)
    with pytest.raises(NPUValueError, match=match):
        plan_conv2d(config, geometry, lowering=lowering)
    with pytest.raises(NPUValueError, match=match):
        compile_conv2d(config, geometry, x_addr=0, w_addr=0, bias_addr=0, quant_addr=0,
                       y_addr=0, out_zero_point=0, act_min=-128, act_max=127,
                       lowering=lowering)
    if lowering == "rows":           # conv2d's input is always packed
        with pytest.raises(NPUValueError, match=match):
            conv2d(**good_problem(), lowering=lowering)


def test_rejects_bad_compile_arguments():
    config = NPUConfig.from_name("4x4")
    with pytest.raises(NPUTypeError, match="Conv2dGeometry"):
        plan_conv2d(config, (1, 4, 4, 3, 2, 3, 3))
    geometry = Conv2dGeometry(1, 4, 4, 3, 2, 3, 3, padding=1)
    with pytest.raises(PlanError, match="x_addr"):
        compile_conv2d(config, geometry, x_addr=(1 << 32) - 10, w_addr=0, bias_addr=0,
                       quant_addr=0, y_addr=0, out_zero_point=0, act_min=-128, act_max=127)


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_all_zero_weight_tiles_are_skipped(lowering):
    """A depthwise convolution as a block-diagonal one: the compiler skips the weight tiles
    that are all zero (no load, PRELOAD or MATMUL), and the result is still exact."""
    seed = SEED + 900
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    channels = 12
    problem = random_conv_problem(rng, 2, 6, 5, channels, channels, 3, 1, 1)
    problem["w"] = problem["w"] * np.eye(channels, dtype=np.int8)     # block-diagonal HWIO
    config = NPUConfig.from_name("4x4")
    result = check(problem, config, lowering=lowering)
    geometry = Conv2dGeometry(batch=2, height=6, width=5, in_channels=channels,
                              out_channels=channels, kernel_height=3, kernel_width=3,
                              padding=1)
    dense = plan_conv2d(config, geometry, lowering=lowering)
    assert result.plan.weight_loads < dense.weight_loads
    if lowering == "taps":
        # Per tap, only the k-tile on the diagonal of each n-tile: 3 of 9 tiles.
        assert result.plan.weight_loads * 3 == dense.weight_loads


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_depthwise_entry_point_is_the_block_diagonal_convolution(lowering):
    """plan/compile_depthwise_conv2d build the block-diagonal HWIO weights themselves: the
    program is word for word that of compile_conv2d given those weights."""
    seed = SEED + 950
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    channels = 12
    weights = rng.integers(-128, 128, (3, 3, channels), dtype=np.int8)
    block_diagonal = depthwise_weights(weights)
    assert block_diagonal.shape == (3, 3, channels, channels)
    for c in range(channels):
        assert np.array_equal(block_diagonal[:, :, c, c], weights[:, :, c])
    assert not np.any(block_diagonal * (1 - np.eye(channels, dtype=np.int8)))
    config = NPUConfig.from_name("4x4")
    geometry = Conv2dGeometry(batch=1, height=6, width=5, in_channels=channels,
                              out_channels=channels, kernel_height=3, kernel_width=3,
                              padding=1)
    operands = dict(x_addr=0x1000, w_addr=0x40000, bias_addr=0x50000, quant_addr=0x60000,
                    y_addr=0x70000, out_zero_point=0, act_min=-128, act_max=127,
                    lowering=lowering)
    plan = plan_depthwise_conv2d(config, geometry, weights, lowering=lowering)
    assert plan == plan_conv2d(config, geometry, lowering=lowering, weights=block_diagonal)
    depthwise = compile_depthwise_conv2d(config, geometry, weights, plan=plan, **operands)
    dense = compile_conv2d(config, geometry, weights=block_diagonal, **operands)
    assert depthwise.words == dense.words and depthwise.plan == dense.plan == plan
    with pytest.raises(NPUValueError, match="in_channels == out_channels"):
        plan_depthwise_conv2d(config, geometry, weights[:, :, :5])
    with pytest.raises(NPUTypeError, match="depthwise weights"):
        plan_depthwise_conv2d(config, geometry, weights.astype(np.int16))
