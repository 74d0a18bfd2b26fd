"""Public architectures: the nine model-zoo networks of the ``onnx`` package's light copies,
with seeded random weights at a reduced resolution, quantized by onnxruntime in QDQ and
QOperator with int8 and uint8 activations (:mod:`sw.onnx.zoo`), run through ``sw.onnx`` on the
NPU's instruction-level model and compared with onnxruntime bit for bit, every output (the
network's own and its logits, the final Softmax's input).

``make test`` runs three cheap cases (:data:`CHEAP`); ``NPU_FULL=1`` (``make test-full``) runs
all 36, and two networks on Verilator. The models are built once and cached under
``build/onnx-zoo/`` (a first full run builds them all: about 4 minutes on 2 cores). Each test
prints its input seed and what the build measured; a failure prints the command that reruns
it.
"""

import json
import os
import time
import zlib

import numpy as np
import onnx
import pytest

from hw.config import NPUConfig
from sw.errors import NPUValueError
from sw.onnx import zoo
from sw.onnx.graph import import_model
from sw.onnx.runtime import run_model


FULL = os.environ.get("NPU_FULL") == "1"
SEED = int(os.environ.get("NPU_SEED", "51"))         # the test inputs' seed (not the weights')
CONFIG = NPUConfig(8, 8)
#: Cases in ``make test``: small networks, both formats, both activation types, a residual
#: network with grouped convolutions and channel shuffles (ShuffleNet), Inception's branches.
CHEAP = {("squeezenet", "qdq", "int8"), ("shufflenet", "qoperator", "uint8"),
         ("inception_v2", "qdq", "uint8")}
#: Networks below this many MACs run two samples (the symbolic batch), the others one: the
#: model backend takes about a minute per sample of AlexNet, whose dense layers run with M = 1.
BATCH_2_MACS = 10_000_000

CASES = [pytest.param(name, fmt, act, id=f"{name}-{fmt}-{act}",
                      marks=() if FULL or (name, fmt, act) in CHEAP else
                      pytest.mark.skip(reason="NPU_FULL=1 (make test-full) runs it"))
         for name in zoo.ZOO for fmt in zoo.FORMATS for act in zoo.ACTIVATIONS]


def _onnxruntime(path, x):
    import onnxruntime
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    started = time.perf_counter()
    outputs = session.run(None, {session.get_inputs()[0].name: x})
    seconds = time.perf_counter() - started
    return dict(zip([o.name for o in session.get_outputs()], outputs)), seconds


def _inputs(model, name, fmt, act):
    """Seeded inputs: one seed per case, derived from NPU_SEED and the case's name."""
    batch = 2 if model.info["macs"] < BATCH_2_MACS else 1
    seed = SEED * 1000 + zlib.crc32(f"{name}-{fmt}-{act}".encode()) % 1000
    return zoo.sample_inputs(model.input_shape, batch, seed), seed


def _compare(run, expected, label):
    """Every output equal to onnxruntime's, in dtype, shape and value; one message naming
    each output that differs."""
    assert list(run.outputs) == list(expected), label
    problems = []
    for output, want in expected.items():
        got = run.outputs[output]
        if got.dtype != want.dtype or got.shape != want.shape:
            problems.append(f"{output}: {got.dtype} {got.shape}, onnxruntime {want.dtype} "
                            f"{want.shape}")
        elif not np.array_equal(got, want):
            differ = got != want
            problems.append(f"{output}: {np.count_nonzero(differ)} of {want.size} values "
                            f"differ (largest difference "
                            f"{np.max(np.abs(got[differ] - want[differ]))})")
    assert not problems, f"{label}: " + "; ".join(problems)
    for output, want in expected.items():
        np.testing.assert_array_equal(run.outputs[output], want)


@pytest.mark.parametrize("name,fmt,act", CASES)
def test_zoo_equals_onnxruntime(name, fmt, act, request, record_property):
    full = "" if (name, fmt, act) in CHEAP else "NPU_FULL=1 "
    print(f"reproduce: {full}NPU_SEED={SEED} .venv/bin/pytest "
          f"'tb/test_onnx_zoo.py::{request.node.name}'")
    model = zoo.zoo_model(name, fmt=fmt, activation=act)
    x, seed = _inputs(model, name, fmt, act)
    info = model.info
    print(f"{name} {fmt} {act}: {info['input_name']} {'x'.join(map(str, model.input_shape))}, "
          f"{info['macs']:,} MACs per sample, float built in {info['float_build_seconds']} s, "
          f"quantized in {info['build_seconds']} s, onnxruntime {info['ort_run_seconds']} s "
          f"per sample; inputs: sample_inputs(shape, {len(x)}, seed={seed}); ops "
          f"{json.dumps(info['ops'])}")
    record_property("zoo", json.dumps(dict(info, input_seed=seed, batch=len(x))))
    expected, _ = _onnxruntime(model.path, x)
    assert zoo.LOGITS in expected or name == "densenet121"      # DenseNet ends in its logits
    started = time.perf_counter()
    run = run_model(import_model(model.path), x, config=CONFIG, sim="model")
    seconds = time.perf_counter() - started
    share = run.npu_macs / (len(x) * info["macs"])      # of the float model's MACs
    print(f"run_model: {seconds:.1f} s, NPU {run.npu_macs:,} MACs ({share:.1%} of the "
          f"network's), CPU {run.cpu_macs:,} MACs, {run.programs} programs")
    record_property("run", json.dumps({"seconds": round(seconds, 2), "npu_macs": run.npu_macs,
                                       "cpu_macs": run.cpu_macs, "npu_share": round(share, 4),
                                       "programs": run.programs}))
    _compare(run, expected, f"{name} {fmt} {act} seed {seed}")
    assert run.npu_macs > 0


@pytest.mark.rtl
@pytest.mark.skipif(not FULL, reason="NPU_FULL=1 (make test-full) runs it")
@pytest.mark.parametrize("name,fmt,act", [("squeezenet", "qoperator", "uint8"),
                                          ("shufflenet", "qdq", "int8")])
def test_zoo_on_verilator(name, fmt, act):
    """Two networks through the generated Verilog under Verilator: equal to onnxruntime, and
    the cycle model's cycles and counters (``--sim model``) equal to the RTL's, program by
    program."""
    model = zoo.zoo_model(name, fmt=fmt, activation=act)
    x = zoo.sample_inputs(model.input_shape, 1, SEED)
    expected, _ = _onnxruntime(model.path, x)
    graph = import_model(model.path)
    run = run_model(graph, x, config=CONFIG, sim="verilator")
    print(f"{name} {fmt} {act} on Verilator: {run.cycles} cycles, {run.programs} programs")
    _compare(run, expected, f"{name} {fmt} {act} on verilator")
    assert run.npu_macs > 0 and run.cycles > 0
    predicted = run_model(graph, x, config=CONFIG, sim="model")
    assert predicted.cycles_predicted
    assert predicted.cycle_counts == run.cycle_counts
    assert predicted.counters == run.counters


# -- the builder -------------------------------------------------------------------------------

def test_zoo_names_and_sizes():
    assert zoo.ZOO == ("squeezenet", "shufflenet", "resnet50", "inception_v1", "inception_v2",
                       "densenet121", "vgg19", "alexnet", "zfnet512")
    assert set(zoo.SIZES) == set(zoo.ZOO)
    for name in zoo.ZOO:
        assert zoo.light_path(name).is_file()


def test_float_build_is_deterministic_and_has_logits():
    """Twice the same bytes; another seed, other weights; the logits are the final Softmax's
    input, the batch is symbolic."""
    import onnxruntime
    first, shape = zoo.build_float("squeezenet", seed=3)
    second, _ = zoo.build_float("squeezenet", seed=3)
    other, _ = zoo.build_float("squeezenet", seed=4)
    assert shape == (3, 32, 32)
    assert first.SerializeToString() == second.SerializeToString()
    assert first.SerializeToString() != other.SerializeToString()
    assert [o.name for o in first.graph.output] == ["softmaxout_1", zoo.LOGITS]
    assert first.opset_import[0].version == 13
    assert first.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    session = onnxruntime.InferenceSession(first.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    probabilities, logits = session.run(None, {"data_0": zoo.sample_inputs(shape, 3)})
    assert logits.shape == (3, 1000) and probabilities.shape == (3, 1000, 1, 1)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(probabilities[:, :, 0, 0], e / e.sum(axis=1, keepdims=True),
                               rtol=1e-5, atol=1e-7)
    assert 0.3 < logits.std() < 30          # neither vanishing nor exploding


def test_quantized_build_is_deterministic(tmp_path):
    paths = [tmp_path / f"{i}.onnx" for i in range(2)]
    for path in paths:
        zoo.build_quantized("squeezenet", path, fmt="qoperator", activation="uint8", seed=3)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    ops = {n.op_type for n in onnx.load(str(paths[0])).graph.node}
    assert "QLinearConv" in ops and "Conv" not in ops


def test_reduced_resolution_adapts_the_shape_dependent_nodes():
    """AlexNet at 64x64: the dense layer after the last pooling gets weights of the new
    width and its Reshape copies the batch; ResNet-50's final 7x7 pooling covers the whole
    smaller map; BatchNormalization statistics come from the data."""
    from onnx import numpy_helper
    model, shape = zoo.build_float("alexnet")
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    gemms = [n for n in model.graph.node if n.op_type == "Gemm"]
    assert inits[gemms[0].input[1]].shape == (4096, 256)        # 256 x 1 x 1 at 64, not 9216
    reshape = next(n for n in model.graph.node if n.op_type == "Reshape")
    assert list(inits[reshape.input[1]]) == [0, -1]
    model, _ = zoo.build_float("resnet50")
    pool = next(n for n in model.graph.node if n.op_type == "AveragePool")
    assert [a.ints for a in pool.attribute if a.name == "kernel_shape"][0] == [1, 1]
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    bn = next(n for n in model.graph.node if n.op_type == "BatchNormalization")
    assert inits[bn.input[4]].min() > 0 and not np.all(inits[bn.input[4]] == 1)


def test_too_small_a_resolution_is_refused():
    with pytest.raises(NPUValueError, match="alexnet does not fit 32x32"):
        zoo.build_float("alexnet", size=32)
    with pytest.raises(NPUValueError, match="no network 'lenet'"):
        zoo.build_float("lenet")
    with pytest.raises(NPUValueError, match="fmt must be one of"):
        zoo.zoo_model("squeezenet", fmt="qop")


def test_command_writes_the_set(tmp_path, capsys):
    assert zoo.main(["--out", str(tmp_path), "--networks", "squeezenet", "--formats", "float",
                     "qoperator", "--activations", "uint8"]) == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["manifest.json", "squeezenet_32_float.onnx",
                       "squeezenet_32_qoperator-uint8.onnx"]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [m["fmt"] for m in manifest] == ["float", "qoperator"]
    assert manifest[1]["outputs"] == ["softmaxout_1", zoo.LOGITS]
    assert "squeezenet_32_qoperator-uint8.onnx" in capsys.readouterr().out


def test_calibrate_a_public_float_model(tmp_path, capsys):
    """``npu onnx FLOAT.onnx --calibrate`` on a public architecture (SqueezeNet, input
    ``data_0``): quantized by onnxruntime with the model's own input name, run on the NPU and
    equal to onnxruntime's run of the same quantized model."""
    from sw.cli import main
    model, shape = zoo.build_float("squeezenet", seed=0)
    path = tmp_path / "squeezenet.onnx"
    onnx.save(model, path)
    data, x = tmp_path / "data.npy", tmp_path / "x.npy"
    np.save(data, zoo.sample_inputs(shape, 8, SEED))
    np.save(x, zoo.sample_inputs(shape, 2, SEED + 1))
    assert main(["onnx", str(path), "--calibrate", str(data), "--input", str(x), "--check",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is True and set(report["check"]) == {"softmaxout_1", zoo.LOGITS}
    assert all(report["check"].values()) and report["npu_macs"] > 0
