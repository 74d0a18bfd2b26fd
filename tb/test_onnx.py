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
from sw.onnx.lower import _CPU_REASONS, place_graph
from sw.onnx.runtime import infer_shapes, run_model
from onnx_helpers import constant, model, run_ort

logging.getLogger("root").setLevel(logging.ERROR)     # quantize_static's advice

CONFIG = NPUConfig(8, 8)
#: (model, format, activation type) the tests quantize; the QDQ int8 residual block is the
#: one onnxruntime leaves partly in float (test_float_conv_left_by_onnxruntime_is_refused).
CASES = [(name, fmt, act) for name in ("mlp", "residual", "mobilenet")
         for fmt in models.QUANT_FORMATS for act in ("int8", "uint8")
         if (name, fmt, act) != ("residual", "qdq", "int8")]


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
        assert run.npu_macs > 0 and run.programs >= 3
        assert {p.device for p in run.placements if p.op_type.startswith("QLinearConv")} \
            <= {"npu"}


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
    placements = place_graph(graph, infer_shapes(graph, x))
    devices = {p.op_type: (p.device, p.reason) for p in placements}
    assert devices["QLinearConcat"] == ("cpu", _CPU_REASONS["QLinearConcat"])
    assert {devices[op][0] for op in ("QLinearAveragePool", "QLinearSoftmax")} == {"cpu"}


@pytest.mark.parametrize("name", ["residual", "concat_pool_softmax"])
def test_float_conv_left_by_onnxruntime_is_refused(quantized, name):
    path, _ = quantized(name, "qdq", "int8")
    with pytest.raises(NPUValueError, match=r"runs node .* \(Conv\) in float32"):
        import_model(path)


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
    got = run_model(import_model(path), inputs[0], config=CONFIG, sim="model").outputs
    np.testing.assert_array_equal(next(iter(got.values())), outputs[0])
    if name == "test_convinteger_with_padding":
        # onnxruntime refuses this case's per-channel weight zero points; the case's own
        # expected output (above) is the reference then.
        with pytest.raises(Exception, match="Non per-tensor quantization is not supported"):
            run_ort(new_model, {first: inputs[0]})
        return
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
    # The cycle model does not cover the quantized instructions: no cycles on the model.
    assert report["cycles"] is None and report["cycles_predicted"] is False
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


def test_unsupported_operator_names_the_node(tmp_path):
    nodes = [onnx.helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quant"),
             onnx.helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="dequant"),
             onnx.helper.make_node("Softmax", ["d"], ["y"], name="the_softmax")]
    m = model(nodes, [("x", np.float32, [2, 5])], [("y", np.float32, [2, 5])],
              [constant("s", np.float32(0.1)), constant("z", np.int8(0))])
    path = tmp_path / "softmax.onnx"
    onnx.save(m, path)
    with pytest.raises(NPUValueError, match=r"unsupported operator Softmax \(node 'the_softmax'\)"):
        import_model(str(path))


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
