"""``npu stack`` (sw/stack.py): the seeds' optimization stack on the digits CNN and a small
test model, on the model backend with few timed runs (the figures themselves are
docs/stack.md's, written by ``make stack``)."""

import json
import tempfile

import numpy as np
import onnx
import pytest

from hw.config import NPUConfig
from sw.cli import main
from sw.onnx import models
from sw.onnx.graph import import_model
from sw.onnx.runtime import run_model
from sw.profile import ECP5_FMAX_MHZ as FMAX_MHZ, measured_clock_mhz
from sw.stack import (NOISE, SEEDS_STACK, STEPS, builtin_model, file_model,
                      link_bytes_per_second, markdown, run_stack)


CONFIG = NPUConfig.from_name("8x8")
KEYS = ["fp32", "int8", "fusion", "memory", "layout", "npu", "npu_fused"]


def onnxruntime_outputs(path, x):
    """The quantized model on onnxruntime with its default session options (as
    ``npu onnx --check`` runs it)."""
    import onnxruntime
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(None, {session.get_inputs()[0].name: x})))


@pytest.fixture(scope="module")
def digits():
    with builtin_model("digits") as model:
        result = run_stack(model, config=CONFIG, repeat=3, warmup=1)
        expected = onnxruntime_outputs(model.quantized_path, model.x)
        graph = import_model(model.quantized_path)
        cycles = {key: run_model(graph, model.x, config=CONFIG, sim="model", batch=1,
                                 fuse=fuse).cycles
                  for key, fuse in (("npu", False), ("npu_fused", True))}
        yield result, expected, cycles


def test_steps_in_the_seeds_order(digits):
    result, _, _ = digits
    assert [step["key"] for step in result.steps] == KEYS == [s.key for s in STEPS]
    assert [step["step"] for step in result.steps] == list(range(1, 8))
    assert [step["seeds_stage"] for step in result.steps] == [s[0] for s in SEEDS_STACK]
    assert [step["source"] for step in result.steps] == ["measured"] * 5 + ["modelled"] * 2
    levels = [step["session"]["graph_optimization_level"] for step in result.steps[:5]]
    assert levels == ["ORT_DISABLE_ALL", "ORT_DISABLE_ALL", "ORT_ENABLE_EXTENDED",
                      "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL"]
    assert [step["session"]["enable_cpu_mem_arena"] for step in result.steps[:5]] \
        == [False, False, False, True, True]
    assert all(step["session"]["intra_op_num_threads"] == 1 for step in result.steps[:5])
    assert result.steps[0]["session"]["model"] == "float"


def test_speedups_and_verdicts(digits):
    result, _, _ = digits
    baseline = result.steps[0]["seconds"]
    for index, step in enumerate(result.steps):
        assert step["seconds"] > 0
        assert step["speedup"] == baseline / step["seconds"]
        if step["source"] == "measured":
            assert step["seconds"] == step["timing"]["median"]
            assert step["timing"]["runs"] == 3
        if index == 0:
            assert step["verdict"] == "baseline"
            continue
        ratio = result.steps[index - 1]["seconds"] / step["seconds"]
        assert step["speedup_over_previous"] == ratio
        expected = ("faster" if ratio > 1 + NOISE else "slower" if ratio < 1 - NOISE
                    else "no measurable change")
        assert step["verdict"] == expected
        assert step["why"]


def test_npu_figures_are_cycles_at_the_clock(digits):
    """NPU time = exact cycles / the measured Fmax, plus the activations' bytes over the
    link (the 64-bit bus at that clock), plus the measured host parts; nothing else."""
    result, _, cycles = digits
    assert result.clock_mhz == FMAX_MHZ["8x8"] == 124.7
    assert result.link_bytes_per_second == 8 * 124.7e6
    for key in ("npu", "npu_fused"):
        npu = result.step(key)["npu"]
        assert npu["cycles"] == cycles[key] == sum(npu["cycle_counts"])
        assert npu["cycles_from"] == "cycle model"
        assert npu["npu_seconds"] == npu["cycles"] / (124.7 * 1e6)
        assert npu["transfer_seconds"] == npu["transfer_bytes"] / (8 * 124.7e6)
        host = npu["host_partition_seconds"] + npu["conversion_seconds"]
        assert result.step(key)["seconds"] == npu["npu_seconds"] + npu["transfer_seconds"] \
            + host
        assert npu["seconds_without_transfers"] == npu["npu_seconds"] + host
        assert npu["npu_macs"] == 25_600 and npu["host_macs"] == 0
    # Layer by layer: 1x8x8 in, conv 8x8x8 out; conv in, 16x4x4 out; dense in, 10 out.
    unfused = result.step("npu")["npu"]
    assert unfused["programs"] == 3 and unfused["host_partitions"] == 3
    assert unfused["transfers"] == [[64, 512], [512, 256], [256, 10]]
    assert unfused["transfer_bytes"] == 1_610
    # Chained: the image in, the logits out; the Flatten between is a view in the program.
    fused = result.step("npu_fused")["npu"]
    assert fused["programs"] == 1 and fused["host_partitions"] == 2
    assert fused["transfers"] == [[64, 10]]
    assert fused["groups"] == [["QLinearConv_1", "QLinearConv_2", "Flatten_3", "QGemm_4"]]


def test_quantized_steps_equal_onnxruntime(digits):
    """Every INT8 step's output is onnxruntime's quantized model's bit for bit: the NPU steps
    through the runtime, the host steps at every optimization level (at ORT_DISABLE_ALL
    onnxruntime's float path between DequantizeLinear and QuantizeLinear gives the same
    bits on this model too)."""
    result, expected, _ = digits
    for key in KEYS[1:]:
        outputs = result.outputs[key]
        assert outputs.keys() == expected.keys()
        for name, value in expected.items():
            assert outputs[name].dtype == value.dtype
            np.testing.assert_array_equal(outputs[name], value, err_msg=key)
        assert result.step(key)["outputs"]["equal_to_int8_reference"], key
        assert result.step(key)["outputs"]["max_abs_diff_int8_reference"] == 0.0
    fp32 = result.step("fp32")["outputs"]
    assert not fp32["equal_to_int8_reference"] and fp32["max_abs_diff_fp32"] == 0.0
    assert 0 < fp32["max_abs_diff_int8_reference"] < 1


def test_markdown_has_the_seeds_table_beside(digits):
    result, _, _ = digits
    text = markdown([result], command="npu stack digits")
    assert "| 6 | Eliminated CPU/NPU transfers | Lesson 5, Part 2 — runtime scheduling | 7 ms |" \
        in text
    assert "## digits" in text and "## Findings" in text
    # Each model row has the seeds' stage beside it.
    assert "| 7 | CPU/NPU crossings removed |" in text and "| 6: 7 ms (14.3x) |" in text
    assert text.count("| 1 | FP32 on the host |") == 1
    assert "124.7 MHz" in text and "997.6 MB/s" in text


def test_a_model_file_with_its_clock_and_link():
    """A user's float model quantized with --calibrate's samples, on 4x4 at a given clock
    and link (4x4 has a measured Fmax too, but the given one wins)."""
    float_model, shape = models.mlp(np.random.default_rng(0))
    config = NPUConfig.from_name("4x4")
    x = models.calibration_data(shape, samples=1, seed=5)
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/mlp.onnx"
        onnx.save(float_model, path)
        with file_model(path, x, calibration=models.calibration_data(shape)) as model:
            result = run_stack(model, config=config, clock_mhz=100.0, link_bytes=1e6,
                               repeat=2, warmup=0)
            expected = onnxruntime_outputs(model.quantized_path, x)
    assert result.clock_source == "given (--clock-mhz)"
    for key in ("npu", "npu_fused"):
        npu = result.step(key)["npu"]
        assert npu["npu_seconds"] == npu["cycles"] / 1e8
        assert npu["transfer_seconds"] == npu["transfer_bytes"] / 1e6
        np.testing.assert_array_equal(result.outputs[key]["y"], expected["y"])
    assert result.step("npu")["npu"]["transfers"] == [[64, 48], [48, 32], [32, 10]]
    assert result.step("npu_fused")["npu"]["transfers"] == [[64, 10]]


def test_measured_clock():
    assert measured_clock_mhz(NPUConfig.from_name("8x8")) == 124.7
    assert measured_clock_mhz(NPUConfig.from_name("4x4")) == 125.5
    assert measured_clock_mhz(NPUConfig.from_name("16x16")) is None
    # The Fmax was measured with the default memories and bus only.
    assert measured_clock_mhz(NPUConfig.from_name("8x8", spad_depth=1024)) is None
    assert measured_clock_mhz(NPUConfig.from_name("8x8", bus_width=128)) is None
    assert link_bytes_per_second(NPUConfig.from_name("16x16"), 100.0) == 16 * 100e6


def test_cli_json_and_markdown(tmp_path, capsys):
    target = tmp_path / "stack.md"
    status = main(["stack", "digits", "--repeat", "2", "--warmup", "0", "--json",
                   "--markdown", str(target)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    report = json.loads(captured.out)
    assert set(report) == {"seeds", "seeds_source", "steps", "noise", "machine", "models"}
    assert [row["latency_ms"] for row in report["seeds"]] == [100, 70, 60, 55, 35, 10, 7]
    assert [row["key"] for row in report["steps"]] == KEYS
    (model,) = report["models"]
    assert set(model) == {"model", "description", "float_model", "quantized_model",
                          "quantization", "input", "config", "bus_width", "clock_mhz",
                          "clock_source", "link_bytes_per_second", "link_source", "timing",
                          "facts", "steps", "reference"}
    assert model["model"] == "digits" and model["config"] == "8x8"
    assert model["input"] == {"shape": [1, 1, 8, 8], "dtype": "float32",
                              "source": model["input"]["source"]}
    assert model["timing"]["repeat"] == 2 and model["timing"]["threads"] == 1
    step_keys = {"step", "key", "title", "seeds_stage", "definition", "source", "seconds",
                 "how", "outputs", "speedup", "speedup_over_previous", "verdict", "why"}
    for step in model["steps"]:
        extra = {"timing", "session"} if step["source"] == "measured" else {"npu"}
        assert set(step) == step_keys | extra, step["key"]
    text = target.read_text()
    assert text.startswith("# The optimization stack on real networks")
    assert "npu stack digits --repeat 2 --warmup 0 --markdown" in text


@pytest.mark.parametrize("argv, match", [
    (["stack", "lenet"], "lenet: no such model file, nor a built-in model (digits, squeezenet"),
    (["stack", "digits", "--config", "3x3"], "no measured Fmax for config 3x3"),
    (["stack", "digits", "--clock-mhz", "0"], "(--clock-mhz) must be positive, not 0 MHz"),
    (["stack", "digits", "--calibrate", "x.npy"], "are for a model file"),
    (["stack", "digits", "squeezenet", "--input", "x.npy"], "--input goes with one MODEL"),
    (["stack", "digits", "--size", "64"], "--size is for the zoo's networks only"),
])
def test_bad_input(capsys, argv, match):
    status = main(argv)
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""
    assert captured.err.startswith("npu: error: ") and captured.err.count("\n") == 1
    assert match in captured.err


def test_a_model_file_needs_its_quantization_and_an_input(capsys, tmp_path):
    float_model, shape = models.mlp(np.random.default_rng(0))
    path = str(tmp_path / "mlp.onnx")
    onnx.save(float_model, path)
    data = str(tmp_path / "data.npy")
    np.save(data, models.calibration_data(shape))
    for argv, match in [([path], "needs its quantized form (--quantized Q.onnx)"),
                        ([path, "--calibrate", data], "needs --input X.npy"),
                        ([path, "--calibrate", data, "--quantized", path],
                         "--quantized or --calibrate, not both"),
                        ([path, "digits", "--calibrate", data], "a model file is run alone")]:
        assert main(["stack", *argv]) == 2
        assert match in capsys.readouterr().err
    x = str(tmp_path / "x.npy")
    np.save(x, models.calibration_data(shape, samples=1, seed=5))
    assert main(["stack", path, "--calibrate", data, "--input", x, "--config", "4x4",
                 "--repeat", "2", "--warmup", "0", "--json"]) == 0
    (model,) = json.loads(capsys.readouterr().out)["models"]
    assert model["model"] == "mlp" and model["clock_mhz"] == 125.5
    assert model["input"]["source"] == f"--input {x}"
    equal = [step["outputs"]["equal_to_int8_reference"] for step in model["steps"]]
    assert equal[0] is False and equal[2:] == [True] * 5


@pytest.mark.rtl
def test_the_rtl_counts_the_same_cycles(digits):
    """The NPU steps' cycles from the generated Verilog under Verilator equal the cycle
    model's (and so do the outputs)."""
    result, expected, _ = digits
    with builtin_model("digits") as model:
        rtl = run_stack(model, config=CONFIG, repeat=1, warmup=0, sim="verilator")
    for key in ("npu", "npu_fused"):
        assert rtl.step(key)["npu"]["cycles_from"] == "verilator"
        assert rtl.step(key)["npu"]["cycle_counts"] == result.step(key)["npu"]["cycle_counts"]
        np.testing.assert_array_equal(rtl.outputs[key]["y"], expected["y"])
