"""ONNX import end to end: the project's test models, quantized by onnxruntime's
quantize_static in both formats, run through ``sw.onnx`` and compared with onnxruntime bit
for bit; ONNX's own backend test cases; the CLI; the errors."""

import json
import logging

import numpy as np
import onnx
import pytest

from hw.config import NPUConfig
from sw.cli import main
from sw.errors import NPUError, NPUTypeError, NPUValueError
from sw.onnx import models
from sw.onnx.graph import import_model
from sw.ir.placement import place
from sw.onnx.lower import _CPU_REASONS, to_graph
from sw.onnx.runtime import infer_shapes, run_model
from onnx_helpers import constant, model, run_ort

logging.getLogger("root").setLevel(logging.ERROR)     # quantize_static's advice

CONFIG = NPUConfig(8, 8)
#: (model, format, activation type) the tests quantize; in the QDQ int8 residual block
#: onnxruntime leaves some convolutions in float (test_float_conv_left_by_onnxruntime_runs_on_
#: the_host).
CASES = [(name, fmt, act) for name in ("mlp", "residual", "mobilenet")
         for fmt in models.QUANT_FORMATS for act in ("int8", "uint8")]


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    folder = tmp_path_factory.mktemp("onnx")
    cache = {}

    def get(name, fmt, act, seed=0):
        key = (name, fmt, act, seed)
        if key not in cache:
            float_model, shape = models.build(name, seed)
            path = folder / f"{name}_{fmt}_{act}_{seed}.onnx"
            models.quantize(float_model, path, models.calibration_data(shape, seed=seed + 1),
                            fmt=fmt, activation_type=act)
            cache[key] = (str(path), shape)
        return cache[key]
    return get


def _onnxruntime(path, x):
    import onnxruntime
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


@pytest.mark.parametrize("name,fmt,act", CASES)
@pytest.mark.parametrize("sim", ["cpu", "model"])
def test_model_equals_onnxruntime(quantized, name, fmt, act, sim):
    path, shape = quantized(name, fmt, act)
    x = models.calibration_data(shape, samples=48, seed=11)      # a test set, not calibration
    expected = _onnxruntime(path, x)
    run = run_model(import_model(path), x, config=CONFIG, sim=sim, batch=16)
    got = run.outputs["y"]
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    if sim == "model":
        assert run.npu_macs > 0 and run.programs >= (2 if (name, act) == ("residual", "int8")
                                                     and fmt == "qdq" else 3)
        assert {p.device for p in run.placements if p.op_type.startswith("QLinearConv")} \
            <= {"npu"}
    else:
        assert run.npu_macs == 0 and run.programs == 0 and len(run.partitions) == 1


@pytest.mark.parametrize("fmt,act", [("qdq", "uint8"), ("qoperator", "int8"),
                                     ("qoperator", "uint8")])
@pytest.mark.parametrize("sim", ["cpu", "model"])
def test_concat_pool_softmax_equals_onnxruntime(quantized, fmt, act, sim):
    """Two convolutions concatenated, AveragePool, Gemm, Softmax: onnxruntime runs them as
    QLinearConcat (one input copied, one through a table), QLinearAveragePool and
    QLinearSoftmax, and the host's kernels (with the convolutions and the Gemm on the NPU's
    model, or on the host) equal it on every sample."""
    path, shape = quantized("concat_pool_softmax", fmt, act)
    graph = import_model(path)
    ops = {node.op_type for node in graph.nodes}
    assert {"QLinearConcat", "QLinearAveragePool", "QLinearSoftmax"} <= ops
    x = models.calibration_data(shape, samples=64, seed=11)
    expected = _onnxruntime(path, x)
    run = run_model(graph, x, config=CONFIG, sim=sim)
    got = run.outputs["y"]
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    assert len(np.unique(got)) > 20                  # probabilities, not one saturated value
    placements = place(to_graph(graph, infer_shapes(graph, x)))
    devices = {p.op_type: (p.device, p.reason) for p in placements}
    assert devices["QLinearConcat"] == ("cpu", _CPU_REASONS["QLinearConcat"])
    assert {devices[op][0] for op in ("QLinearAveragePool", "QLinearSoftmax")} == {"cpu"}


@pytest.mark.parametrize("name", ["residual", "concat_pool_softmax"])
def test_float_conv_left_by_onnxruntime_runs_on_the_host(quantized, name):
    """QDQ with int8 activations: onnxruntime leaves some convolutions in float32; they run
    on the host, in onnxruntime's partitions, the quantized ones on the NPU."""
    path, shape = quantized(name, "qdq", "int8")
    graph = import_model(path)
    x = models.calibration_data(shape, samples=12, seed=5)
    run = run_model(graph, x, config=CONFIG, sim="model")
    np.testing.assert_array_equal(run.outputs["y"], _onnxruntime(path, x))
    floats = [p for p in run.placements if p.op_type == "Conv"]
    assert floats and {(p.device, p.reason) for p in floats} == {("cpu", _CPU_REASONS["Conv"])}
    assert run.partitions and all(partition.runner is not None
                                  for partition in run.partitions)


@pytest.mark.parametrize("fmt", models.QUANT_FORMATS)
@pytest.mark.parametrize("act", ["int8", "uint8"])
def test_grouped_convolutions_run_on_the_array(quantized, fmt, act):
    """Convolutions in 2 groups (AlexNet's kind): block-diagonal GEMMs on the NPU, equal to
    onnxruntime; the MACs counted are the graph's own."""
    path, shape = quantized("grouped", fmt, act)
    x = models.calibration_data(shape, samples=10, seed=12)
    run = run_model(import_model(path), x, config=CONFIG, sim="model", batch=4)
    np.testing.assert_array_equal(run.outputs["y"], _onnxruntime(path, x))
    grouped = [p for p in run.placements if "grouped (group = 2)" in p.reason]
    assert len(grouped) == 2 and {p.device for p in grouped} == {"npu"}
    # 8x8 images: 16 outputs x 4 inputs x 3x3 and 8 outputs x 8 inputs x 1x1 per pixel.
    assert [p.macs for p in grouped] == [10 * 64 * 16 * 4 * 9, 10 * 64 * 8 * 8]
    assert run.cpu_macs == 0 and run.npu_share == 1.0


@pytest.mark.parametrize("fmt", models.QUANT_FORMATS)
def test_matmul_then_bias_add(fmt, tmp_path):
    """``MatMul`` + ``Add`` of a (33,) bias: quantized as it is, the MatMuls run on the NPU
    and onnxruntime adds the bias with broadcasting (QLinearAdd, its own rounding); after
    onnxruntime's ``quant_pre_process`` the pair is one Gemm, one GEMM with bias on the NPU."""
    from onnxruntime.quantization.shape_inference import quant_pre_process
    float_model, shape = models.build("matmul_bias", seed=2)
    source = tmp_path / "float.onnx"
    onnx.save(float_model, source)
    quant_pre_process(str(source), str(tmp_path / "pre.onnx"))
    x = models.calibration_data(shape, samples=7, seed=13)
    for start, fused in [(source, False), (tmp_path / "pre.onnx", True)]:
        path = str(tmp_path / f"{fmt}_{fused}.onnx")
        models.quantize(str(start), path, models.calibration_data(shape, seed=3), fmt=fmt)
        run = run_model(import_model(path), x, config=CONFIG, sim="model")
        np.testing.assert_array_equal(run.outputs["y"], _onnxruntime(path, x))
        npu = [p.op_type for p in run.placements if p.device == "npu"]
        assert npu == (["QGemm", "QGemm"] if fused else ["QLinearMatMul", "QLinearMatMul"])
        assert len(run.groups) == (1 if fused else 2) and run.npu_share == 1.0


def test_unseen_models_equal_onnxruntime(tmp_path):
    """Models the other tests never saw: new seeds and sizes."""
    for seed, (name, kwargs) in enumerate([("mlp", dict(features=40, hidden=(24,))),
                                           ("mobilenet", dict(channels=4, expanded=12, size=6)),
                                           ("residual", dict(channels=6, size=6))], start=20):
        rng = np.random.default_rng(seed)
        float_model, shape = models.MODELS[name](rng, **kwargs)
        path = str(tmp_path / f"{name}.onnx")
        models.quantize(float_model, path, models.calibration_data(shape, seed=seed),
                        fmt="qoperator", activation_type="uint8")
        x = models.calibration_data(shape, samples=10, seed=seed + 100)
        got = run_model(import_model(path), x, config=CONFIG, sim="model").outputs["y"]
        np.testing.assert_array_equal(got, _onnxruntime(path, x), err_msg=f"{name} seed {seed}")


BACKEND_CASES = ["test_qlinearconv", "test_qlinearmatmul_2D_uint8_float32",
                 "test_qlinearmatmul_2D_int8_float32", "test_qlinearmatmul_3D_uint8_float32",
                 "test_qlinearmatmul_3D_int8_float32", "test_matmulinteger",
                 "test_convinteger_without_padding", "test_convinteger_with_padding"]


def _backend_case(name):
    from onnx.backend.test.case.node import collect_testcases
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in collect_testcases(None):
            if case.name == name:
                return case
    raise LookupError(name)


@pytest.mark.parametrize("name", BACKEND_CASES)
def test_onnx_backend_cases(name, tmp_path):
    """ONNX's own node test cases with every input but the first made a constant; the result
    equals the case's expected output, and onnxruntime's wherever onnxruntime runs the case."""
    case = _backend_case(name)
    inputs, outputs = case.data_sets[0]
    graph = case.model.graph
    first = graph.input[0].name
    constants = [onnx.numpy_helper.from_array(np.asarray(value), proto.name)
                 for proto, value in zip(graph.input[1:], inputs[1:])]
    new_graph = onnx.helper.make_graph(list(graph.node), graph.name, [graph.input[0]],
                                       list(graph.output), constants)
    new_model = onnx.helper.make_model(new_graph, opset_imports=case.model.opset_import)
    new_model.ir_version = case.model.ir_version
    path = str(tmp_path / f"{name}.onnx")
    onnx.save(new_model, path)
    if name == "test_convinteger_with_padding":
        # onnxruntime refuses this case's per-channel weight zero points, and so does the
        # runtime, whose host nodes run on onnxruntime: one line, onnxruntime's reason.
        with pytest.raises(Exception, match="Non per-tensor quantization is not supported"):
            run_ort(new_model, {first: inputs[0]})
        with pytest.raises(NPUValueError, match=r"^onnxruntime failed on .*Non per-tensor"):
            run_model(import_model(path), inputs[0], config=CONFIG, sim="model")
        return
    got = run_model(import_model(path), inputs[0], config=CONFIG, sim="model").outputs
    np.testing.assert_array_equal(next(iter(got.values())), outputs[0])
    np.testing.assert_array_equal(run_ort(new_model, {first: inputs[0]})[0], outputs[0])


def test_cli_check_json_and_plan(quantized, tmp_path, capsys):
    path, shape = quantized("mobilenet", "qdq", "uint8")
    x = tmp_path / "x.npy"
    np.save(x, models.calibration_data(shape, samples=5, seed=3))
    out = tmp_path / "y.npy"
    assert main(["onnx", path, "--input", str(x), "--out", str(out), "--sim", "model",
                 "--check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is True and report["check"] == {"y": True}
    assert report["npu_macs"] > 0 and report["programs"] == 1
    assert report["npu_share"] == report["npu_macs"] / (report["npu_macs"] + report["cpu_macs"])
    assert len(report["host_partitions"]) == 2         # the input's quantize, the output's
    # On the model the cycles come from the cycle model (exact: tb/test_timing_quant.py).
    assert report["cycles"] > 0 and report["cycles_predicted"] is True
    devices = {p["node"]: p["device"] for p in report["placements"]}
    assert sorted(set(devices.values())) == ["cpu", "npu"]
    np.testing.assert_array_equal(np.load(out), _onnxruntime(path, np.load(x)))

    assert main(["onnx", path, "--plan"]) == 0
    text = capsys.readouterr().out
    assert "NPU group 0:" in text and "depthwise 3x3" in text and ".quant" in text


def test_cli_calibrate_quantizes_a_float_model(tmp_path, capsys):
    float_model, shape = models.build("mlp", seed=3)
    path = tmp_path / "float.onnx"
    onnx.save(float_model, path)
    data = tmp_path / "data.npy"
    np.save(data, models.calibration_data(shape, seed=4))
    assert main(["onnx", str(path), "--input", str(data), "--calibrate", str(data),
                 "--check"]) == 0
    assert "equal to onnxruntime" in capsys.readouterr().out


def _error_of(argv, capsys):
    status = main(argv)
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1, err
    return err


def test_clear_errors(quantized, tmp_path, capsys):
    path, shape = quantized("mlp", "qdq", "int8")
    x = tmp_path / "x.npy"
    np.save(x, models.calibration_data(shape, samples=2))
    assert "no such model file" in _error_of(["onnx", str(tmp_path / "none.onnx"),
                                              "--input", str(x)], capsys)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x08\x07garbage that is not a protobuf\xff\xff")
    assert "junk.onnx" in _error_of(["onnx", str(junk), "--input", str(x)], capsys)

    float_model, _ = models.build("mlp")
    float_path = tmp_path / "float.onnx"
    onnx.save(float_model, float_path)
    assert "has no quantization" in _error_of(["onnx", str(float_path), "--input", str(x)],
                                              capsys)

    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((2, 63), np.float32))
    assert "has shape Nx64, not 2x63" in _error_of(["onnx", path, "--input", str(wrong)],
                                                  capsys)
    np.save(wrong, np.zeros((2, 64), np.float64))
    assert "takes float32, not float64" in _error_of(["onnx", path, "--input", str(wrong)],
                                                     capsys)


def _quantized_then(op, tmp_path, domain=""):
    nodes = [onnx.helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quant"),
             onnx.helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="dequant"),
             onnx.helper.make_node(op, ["d"], ["y"], name=f"the_{op.lower()}", domain=domain)]
    if domain:
        info = [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [2, 5])
                for name in "xy"]
        m = onnx.helper.make_model(
            onnx.helper.make_graph(nodes, "test", info[:1], info[1:],
                                   [constant("s", np.float32(0.1)), constant("z", np.int8(0))]),
            opset_imports=[onnx.helper.make_opsetid("", 13),
                           onnx.helper.make_opsetid(domain, 1)])
        m.ir_version = 8
    else:
        m = model(nodes, [("x", np.float32, [2, 5])], [("y", np.float32, [2, 5])],
                  [constant("s", np.float32(0.1)), constant("z", np.int8(0))])
    path = tmp_path / f"{op}.onnx"
    onnx.save(m, path)
    return str(path)


def test_any_operator_onnxruntime_runs_is_supported(tmp_path):
    """Operators with no kernel of the project's own (Softmax, Sum, LRN-like ones) run on
    onnxruntime with its exact semantics."""
    path = _quantized_then("Softmax", tmp_path)
    x = np.random.default_rng(7).standard_normal((2, 5)).astype(np.float32)
    run = run_model(import_model(path), x, config=CONFIG, sim="model")
    np.testing.assert_array_equal(run.outputs["y"], _onnxruntime(path, x))
    assert [p.device for p in run.placements] == ["cpu"] * len(run.placements)


def test_operator_onnxruntime_cannot_run_names_the_node(tmp_path):
    path = _quantized_then("Frobnicate", tmp_path, domain="com.example")
    with pytest.raises(NPUValueError, match=r"onnxruntime cannot load the model: .*Frobnicate"):
        import_model(path)


def test_run_model_rejects_bad_input(quantized):
    path, shape = quantized("mlp", "qdq", "int8")
    graph = import_model(path)
    with pytest.raises(NPUTypeError, match="takes float32"):
        run_model(graph, np.zeros((1, 64), np.int8), config=CONFIG, sim="cpu")
    with pytest.raises(NPUValueError, match="holds no sample"):
        run_model(graph, np.zeros((0, 64), np.float32), config=CONFIG, sim="cpu")
    with pytest.raises(NPUError, match="sim must be one of"):
        run_model(graph, np.zeros((1, 64), np.float32), config=CONFIG, sim="gpu")


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from sw.nn.train import train_digits
    network, data, _ = train_digits(seed=0)
    float_model, _ = models.digits_cnn(network=network)
    folder = tmp_path_factory.mktemp("digits")
    x_train = data.x_train.transpose(0, 3, 1, 2).astype(np.float32)
    paths = {}
    for fmt in models.QUANT_FORMATS:
        paths[fmt] = str(folder / f"digits_{fmt}.onnx")
        models.quantize(float_model, paths[fmt], x_train[:200], fmt=fmt)
    return paths, data.x_test.transpose(0, 3, 1, 2).astype(np.float32), data.y_test


@pytest.mark.parametrize("fmt", models.QUANT_FORMATS)
def test_digits_cnn_whole_test_set(digits, fmt):
    """The digits CNN exported to ONNX, on the instruction-level model over the whole test
    set: equal to onnxruntime, and as accurate as the float model (docs/onnx.md)."""
    paths, x_test, y_test = digits
    expected = _onnxruntime(paths[fmt], x_test)
    run = run_model(import_model(paths[fmt]), x_test, config=CONFIG, sim="model")
    np.testing.assert_array_equal(run.outputs["y"], expected)
    assert [p.device for p in run.placements if p.op_type in ("QLinearConv", "QGemm")] \
        == ["npu"] * 3
    assert len(run.groups) == 1                 # conv -> conv -> flatten view -> dense
    assert np.mean(expected.argmax(axis=1) == y_test) == pytest.approx(0.9756, abs=5e-4)


@pytest.mark.rtl
@pytest.mark.parametrize("sim", ["verilator", "icarus"])
def test_models_on_the_rtl(quantized, digits, sim):
    """A batch of each test model through the generated Verilog: equal to onnxruntime."""
    config = NPUConfig.from_name("4x4")
    paths, x_test, _ = digits
    run = run_model(import_model(paths["qdq"]), x_test[:4], config=config, sim=sim)
    np.testing.assert_array_equal(run.outputs["y"], _onnxruntime(paths["qdq"], x_test[:4]))
    for name, fmt, act in [("mobilenet", "qdq", "uint8"), ("residual", "qoperator", "int8"),
                           ("mlp", "qdq", "int8"), ("concat_pool_softmax", "qoperator", "uint8")]:
        path, shape = quantized(name, fmt, act)
        x = models.calibration_data(shape, samples=3, seed=17)
        run = run_model(import_model(path), x, config=config, sim=sim)
        np.testing.assert_array_equal(run.outputs["y"], _onnxruntime(path, x),
                                      err_msg=f"{name} {fmt} {act} on {sim}")
        assert run.cycles > 0 and run.programs >= 1
