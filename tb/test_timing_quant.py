"""The cycle model (:mod:`sw.timing`) on quantized programs against the RTL: every counter
equal, cycle for cycle, for programs with ``LOAD_ACC``, ``LOAD_QUANT`` and ``STORE_Q``.

For each configuration one Verilator simulation runs the programs of quantized GEMMs (both
requantization modes, the resident and streaming schedules, more output rows than the
``STORE_Q`` queue holds, several N-tiles and so several ``LOAD_QUANT``), convolutions (the
``taps`` and ``kernel_rows`` lowerings, padding, strides, a batch), depthwise convolutions
(block-diagonal, zero tiles skipped) and the digits CNN's fused program (``sw.nn``, both
lowerings). The model predicts each program's cycles and all performance counters
(``hw.isa.PERF_COUNTERS``) from its words alone; the test asserts that they equal what the
hardware counted. Random programs of every opcode on small memories (test_differential's)
put instructions that wait for each other back to back. The ONNX test models run through
:func:`sw.onnx.runtime.run_model` on Verilator and on the instruction-level model: the
cycles and counters the model reports (the cycle model's) equal the RTL's, program by
program.

``make test`` runs two configurations (4x4 on a 64-bit bus, 5x3 on a 32-bit bus: rows of
several beats), 20 random programs on each of two small configurations and each ONNX test
model in one quantization format; ``NPU_FULL=1`` adds five configurations, more random
shapes and programs, the layer-by-layer programs, and both formats.
"""

import json
import logging
import os

import numpy as np
import pytest

from hw.config import NPUConfig
from hw.controller.store_unit import StoreUnit
from hw.isa import Opcode, QuantMode
from quant_cases import random_conv_problem, random_int8, random_qgemm_problem
from sw import backend, codec
from sw.compiler import Conv2dGeometry, compile_depthwise_conv2d, plan_depthwise_conv2d
from sw.conv import prepare_conv2d
from sw.driver import layout_regions, prepare_qgemm
from sw.timing import QUANT_CHECK_CYCLES, predict


BASE_SEED = int(os.environ.get("NPU_SEED", "20261211"))
FULL = os.environ.get("NPU_FULL") == "1"
CONFIGS = [("4x4", 64), ("5x3", 32)]
FULL_CONFIGS = [("8x8", 64), ("16x16", 128), ("4x4", 256), ("8x4", 512), ("1x1", 128)]
RUN_CONFIGS = CONFIGS + (FULL_CONFIGS if FULL else [])
#: Random GEMM shapes per configuration (more with NPU_FULL=1).
RANDOM_GEMMS = 12 if FULL else 3


# (batch, height, width, C_in, C_out, kernel, stride, padding)
CONVS = [
    (1, 5, 6, 3, 4, 3, 1, 1),
    (2, 7, 5, 5, 6, 3, 2, 1),
    (1, 6, 6, 4, 3, 1, 1, 0),
    (1, 9, 8, 2, 5, 5, 2, 2),
    (1, 4, 7, 6, 2, (1, 3), 1, (0, 0, 1, 1)),
]
# (batch, height, width, channels, kernel, stride, padding)
DEPTHWISE = [(1, 6, 6, 9, 3, 1, 1), (2, 7, 5, 5, 3, 2, 1)]


def _job_program(label, job):
    return label, job.dram, job.layout.program_addr, job.program.words


def _depthwise_program(config, rng, shape, lowering, quant_mode):
    """A depthwise convolution's program in a zeroed DRAM image: its timing does not depend
    on the data, and zero multipliers, shifts or scales are a valid requantization state."""
    batch, height, width, channels, kernel, stride, padding = shape
    geometry = Conv2dGeometry(batch, height, width, channels, channels, kernel, kernel,
                              stride, padding)
    weights = random_int8(rng, (kernel, kernel, channels))
    plan = plan_depthwise_conv2d(config, geometry, weights, lowering=lowering)
    layout = layout_regions(plan.instructions, [
        ("x", geometry.input_bytes), ("w", geometry.weight_bytes), ("bias", 4 * channels),
        ("quant", 8 * channels), ("y", geometry.output_bytes)])
    program = compile_depthwise_conv2d(
        config, geometry, weights, x_addr=layout.addr("x"), w_addr=layout.addr("w"),
        bias_addr=layout.addr("bias"), quant_addr=layout.addr("quant"),
        y_addr=layout.addr("y"), out_zero_point=0, act_min=-128, act_max=127,
        lowering=lowering, quant_mode=quant_mode, plan=plan)
    dram = np.zeros(layout.size, dtype=np.uint8)
    dram[layout.program_addr:layout.program_addr + layout.program_bytes] = \
        np.frombuffer(program.bytes, dtype=np.uint8)
    return (f"depthwise {shape} {lowering} {quant_mode.name}", dram, layout.program_addr,
            program.words)


def _network_programs(config, rng):
    """The digits CNN (random weights, calibrated on random images) as sw.nn builds it: its
    fused program in both lowerings and, with NPU_FULL=1, its layer-by-layer programs."""
    from sw.ir.grouping import HostStep, schedule
    from sw.ir.placement import place
    from sw.nn.lower import network_graph
    from sw.nn.program import LOWERINGS, build_fused_program, build_layer_program
    from sw.nn.quantize import quantize_network
    from sw.nn.reference import run_reference
    from sw.nn.train import digits_network
    network = digits_network(rng)
    qnet = quantize_network(network, rng.standard_normal((16, 8, 8, 1)).astype(np.float32))
    graph = network_graph(qnet)
    (group,) = [step for step in schedule(graph, place(graph))
                if not isinstance(step, HostStep)]
    values = run_reference(qnet, rng.standard_normal((3, 8, 8, 1)).astype(np.float32))
    programs = []
    for lowering in LOWERINGS:
        image = build_fused_program(config, group.ops, values["quantize"], lowering=lowering)
        programs.append((f"digits fused {lowering}", image.dram, image.program_addr,
                         image.words))
    if FULL:
        inputs = ["quantize"] + [op.name for op in group.ops[:-1]]
        for op, source in zip(group.ops, inputs):
            image = build_layer_program(config, op, values[source])
            programs.append((f"digits layer {op.name}", image.dram, image.program_addr,
                             image.words))
    return programs


def _programs(config, rng):
    """``(label, dram, program_addr, words)`` of the quantized programs compared."""
    r, c = config.rows, config.cols
    queue = StoreUnit.QUEUE_DEPTH
    shapes = [
        (1, 1, 1, "auto"), (r, r, c, "auto"),
        (2 * r + 1, 3 * r + 2, 2 * c + 1, "auto"),   # ragged tiles, several N-tiles
        (3 * queue, r + 1, c, "auto"),              # more STORE_Q rows than its queue
        (40, 2 * r + 1, 2 * c + 1, "resident"),
        (40, 2 * r + 1, 2 * c + 1, "streaming"),
    ]
    shapes += [(*(int(v) for v in rng.integers(1, 6 * max(r, c) + 1, 3)), "auto")
               for _ in range(RANDOM_GEMMS)]
    programs = []
    for index, (m, k, n, schedule) in enumerate(shapes):
        float_mode = index % 2 == 1
        problem = random_qgemm_problem(rng, m, k, n, float_mode=float_mode)
        programs.append(_job_program(
            f"qgemm {m}x{k}x{n} {schedule} {'float' if float_mode else 'fixed'}",
            prepare_qgemm(**problem, config=config, schedule=schedule)))
    for index, shape in enumerate(CONVS):
        for lowering in ("taps", "kernel_rows"):
            float_mode = (index + (lowering == "taps")) % 2 == 1
            problem = random_conv_problem(rng, *shape, float_mode=float_mode)
            programs.append(_job_program(f"conv {shape} {lowering}",
                                         prepare_conv2d(**problem, config=config,
                                                        lowering=lowering)))
    problem = random_conv_problem(rng, *CONVS[0])
    problem["w"][...] = 0                     # every tile skipped: LOAD_ACC, then STORE_Q
    programs.append(_job_program("conv of zero weights", prepare_conv2d(**problem,
                                                                       config=config)))
    for shape in DEPTHWISE:
        for lowering, mode in (("taps", QuantMode.FIXED), ("kernel_rows", QuantMode.FLOAT)):
            programs.append(_depthwise_program(config, rng, shape, lowering, mode))
    programs += _network_programs(config, rng)
    return programs


def _compare(config, programs, results, what):
    mismatches = []
    for (label, _, prog_addr, words), result in zip(programs, results):
        assert result.done, f"{label}: {result.error_code} at {result.error_pc} ({what})"
        predicted = predict(config, words, prog_addr).perf
        if predicted != result.perf:
            differ = {key: (result.perf[key], predicted[key]) for key in result.perf
                      if result.perf[key] != predicted.get(key)}
            mismatches.append(f"{label} ({len(words)} instructions): RTL vs model {differ}")
    assert not mismatches, (f"{len(mismatches)} of {len(programs)} programs on {what} "
                            f"differ:\n" + "\n".join(mismatches))


@pytest.mark.rtl
@pytest.mark.parametrize("name,bus_width", RUN_CONFIGS,
                         ids=[f"{n}-{b}" for n, b in RUN_CONFIGS])
def test_model_equals_rtl_on_quantized_programs(name, bus_width):
    config = NPUConfig.from_name(name, bus_width=bus_width)
    seed = BASE_SEED + config.rows * 1000 + config.cols * 10 + bus_width
    programs = _programs(config, np.random.default_rng(seed))
    opcodes = {codec.decode(word)[0] for _, _, _, words in programs for word in words}
    assert {Opcode.LOAD_ACC, Opcode.LOAD_QUANT, Opcode.STORE_Q} <= opcodes
    results = backend.run_programs(config, "verilator",
                                   [(dram, addr, len(words)) for _, dram, addr, words in programs])
    _compare(config, programs, results, f"{name}/{bus_width} (seed {seed})")
    print(f"{len(programs)} programs on {name}/{bus_width}, "
          f"{sum(result.cycles for result in results):,} cycles: the model's counters equal")


# Random programs: every opcode, dense hazards ------------------------------------------------

#: test_differential's configurations (built for it): small memories, so that random
#: instructions often touch the same rows and bytes.
RANDOM_CONFIGS = [NPUConfig(rows=2, cols=3, spad_depth=32, acc_depth=16, bus_width=32),
                  NPUConfig(rows=4, cols=4, spad_depth=64, acc_depth=16, bus_width=128)]
RANDOM_PROGRAMS = 60 if FULL else 20


def _random_programs(config, rng, count):
    """``count`` of test_differential's random programs that run without error, each with a
    MATMUL after its last PRELOAD: the RTL runs them one after the other without a reset,
    and a weight tile left waiting for its MATMUL would carry its commit into the next."""
    from sw.model import ModelNPU
    from test_differential import PROG_ADDR, dram_image, random_program
    programs = []
    while len(programs) < count:
        words = random_program(config, rng, int(rng.integers(5, 40)))
        kinds = [codec.decode(word)[0] for word in words]
        if Opcode.PRELOAD in kinds and Opcode.MATMUL not in kinds[
                len(kinds) - kinds[::-1].index(Opcode.PRELOAD):]:
            words.insert(-1, codec.encode(Opcode.MATMUL, spad_addr=0, acc_addr=0, rows=1,
                                          accumulate=0))
        dram = dram_image(config, rng, words)
        if ModelNPU(config).run(dram, PROG_ADDR, len(words)).done:
            programs.append((f"random program {len(programs)}", dram, PROG_ADDR, words))
    return programs


@pytest.mark.rtl
@pytest.mark.parametrize("config", RANDOM_CONFIGS, ids=["2x3-bus32", "4x4-bus128"])
def test_model_equals_rtl_on_random_programs(config):
    """Random instruction streams of every opcode on small memories (test_differential's):
    loads into rows a MATMUL reads, stores of rows a MATMUL or LOAD_ACC just wrote, loads of
    bytes a store writes, LOAD_QUANT and STORE_Q back to back."""
    seed = BASE_SEED + 7 * config.rows + config.bus_width
    programs = _random_programs(config, np.random.default_rng(seed), RANDOM_PROGRAMS)
    results = backend.run_programs(config, "verilator",
                                   [(dram, addr, len(words)) for _, dram, addr, words in programs])
    _compare(config, programs, results, f"{config.name} (seed {seed})")


# ONNX test models: run_model on the model equals run_model on the RTL -------------------------

ONNX_CASES = [("mlp", "qdq"), ("residual", "qoperator"), ("mobilenet", "qdq"),
              ("concat_pool_softmax", "qoperator"), ("grouped", "qdq"),
              ("matmul_bias", "qoperator"), ("digits", "qdq")]
if FULL:
    ONNX_CASES += [(name, "qoperator" if fmt == "qdq" else "qdq") for name, fmt in ONNX_CASES]


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory):
    from sw.onnx import models
    logging.getLogger("root").setLevel(logging.ERROR)       # quantize_static's advice
    folder = tmp_path_factory.mktemp("timing_onnx")
    floats = {}

    def get(name, fmt):
        if name not in floats:
            floats[name] = models.build(name, seed=0)
        float_model, shape = floats[name]
        path = folder / f"{name}_{fmt}.onnx"
        if not path.exists():
            models.quantize(float_model, path, models.calibration_data(shape, seed=1), fmt=fmt)
        return str(path), shape
    return get


@pytest.mark.rtl
@pytest.mark.parametrize("name,fmt", ONNX_CASES, ids=[f"{n}-{f}" for n, f in ONNX_CASES])
def test_onnx_model_cycles_equal_rtl(onnx_model, name, fmt):
    """``run_model`` on the model reports the cycle model's cycles and counters (predicted),
    equal to those the RTL counts, for every program of the model's NPU groups."""
    from sw.onnx import models
    from sw.onnx.graph import import_model
    from sw.onnx.runtime import run_model
    config = NPUConfig.from_name("4x4")
    path, shape = onnx_model(name, fmt)
    graph = import_model(path)
    x = models.calibration_data(shape, samples=2, seed=17)
    rtl = run_model(graph, x, config=config, sim="verilator")
    model = run_model(graph, x, config=config, sim="model")
    np.testing.assert_array_equal(model.outputs["y"], rtl.outputs["y"])
    assert model.cycles_predicted and not rtl.cycles_predicted
    assert rtl.programs >= 1 and model.cycle_counts == rtl.cycle_counts, (name, fmt)
    assert model.counters == rtl.counters
    assert model.cycles == rtl.cycles > 0
    programs = [(f"{name} {fmt} group {index}", None, image.program_addr, image.words)
                for index, group in enumerate(rtl.group_runs) for image in group.images]
    _compare(config, programs, [result for group in rtl.group_runs for result in group.results],
             f"{name} ({fmt}) on 4x4")


def test_onnx_json_reports_predicted_cycles(onnx_model, tmp_path, capsys):
    """``npu onnx --sim model --json`` gives the cycle model's cycles, marked predicted."""
    from sw.cli import main
    from sw.onnx import models
    path, shape = onnx_model("mobilenet", "qdq")
    x = tmp_path / "x.npy"
    np.save(x, models.calibration_data(shape, samples=2, seed=3))
    assert main(["onnx", path, "--input", str(x), "--config", "4x4", "--sim", "model",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cycles_predicted"] is True and report["cycles"] > 0
    assert report["cycles"] == report["counters"]["cycles"]
    assert report["counters"]["useful_macs"] >= report["npu_macs"] > 0


# What follows from the hardware's structure, without the RTL -----------------------------------

def _load_then_store_q(config, load):
    """``load`` (a LOAD_QUANT, or a LOAD_SPAD of the same beats), then a STORE_Q and END."""
    return [load,
            codec.encode(Opcode.STORE_Q, acc_addr=0, rows=3, row_bytes=config.cols,
                         dram_addr=0x2000, dram_stride=64),
            codec.encode(Opcode.END)]


def test_load_quant_holds_the_load_unit_for_its_check():
    """A LOAD_QUANT is a load of two rows that then checks them for QUANT_CHECK_CYCLES: a
    STORE_Q behind it (which waits for the load unit) issues that many cycles later than
    behind a LOAD_SPAD of the same two rows' beats, and nothing else changes."""
    config = NPUConfig.from_name("1x1", bus_width=64)
    quant = predict(config, _load_then_store_q(config, codec.encode(
        Opcode.LOAD_QUANT, dram_addr=0x1000, dram_stride=64, row_bytes=4, zero_point=0,
        act_min=-128, act_max=127)), 0x40)
    spad = predict(config, _load_then_store_q(config, codec.encode(
        Opcode.LOAD_SPAD, local_addr=0, rows=2, row_bytes=1, dram_addr=0x1000,
        dram_stride=64)), 0x40)
    assert quant.perf == dict(spad.perf, cycles=spad.cycles + QUANT_CHECK_CYCLES,
                              stall_load=spad.perf["stall_load"] + QUANT_CHECK_CYCLES)


def test_store_q_streams_through_its_queue():
    """STORE_Q rows on a 512-bit bus, where the writer takes a row every two cycles: a store
    of many rows costs two cycles a row more, and the counters of what moved are the rows'
    (one beat each, the command's bytes written)."""
    config = NPUConfig.from_name("4x4", bus_width=512)

    def store(rows):
        return predict(config, [codec.encode(Opcode.STORE_Q, acc_addr=0, rows=rows,
                                             row_bytes=4, dram_addr=0x2000, dram_stride=64),
                                codec.encode(Opcode.END)], 0x40)
    many, more = store(4 * StoreUnit.QUEUE_DEPTH), store(4 * StoreUnit.QUEUE_DEPTH + 10)
    assert more.cycles - many.cycles == 2 * 10
    assert more.perf["write_bytes"] - many.perf["write_bytes"] == 10 * 64
