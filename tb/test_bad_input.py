"""Bad input, tried as a new user would (issue 51, point 6): each ends in a one-line
``npu: error: ...`` on stderr, exit status 2, no traceback and nothing written; and the two
fixes that make real models go through ``--calibrate`` (the input's own name, a fixed batch).

Everything runs in-process through :func:`sw.cli.main`, on the model backend."""

import json
import logging
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hw.config import MAX_K
from sw.cli import main
from sw.onnx import models

logging.getLogger("root").setLevel(logging.ERROR)     # quantize_static's advice


def run_cli(capsys, *argv):
    status = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def assert_one_line_error(status, out, err, match, expected_status=2):
    assert status == expected_status, err
    assert out == ""
    assert err.startswith("npu: error: ") and err.endswith("\n"), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    assert match in err, err


def snapshot(folder):
    """``{name: bytes}`` of every file in ``folder``: the same before and after a refused
    command means nothing was written or changed."""
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if path.is_file()}


def refused(capsys, folder, argv, match):
    """Run ``argv``, require a one-line error with ``match``, and that ``folder`` is as it
    was."""
    before = snapshot(folder)
    status, out, err = run_cli(capsys, *argv)
    assert_one_line_error(status, out, err, match)
    assert snapshot(folder) == before
    return err


def int8(shape, seed=0):
    return np.random.default_rng(seed).integers(-128, 128, size=shape, dtype=np.int8)


@pytest.fixture(scope="module")
def mlp_model(tmp_path_factory):
    """The quantized MLP test model (one output) and its input shape."""
    float_model, shape = models.build("mlp", seed=0)
    path = tmp_path_factory.mktemp("mlp") / "mlp.onnx"
    models.quantize(float_model, path, models.calibration_data(shape, seed=1))
    return str(path), shape


def two_output_model(path, features=12, hidden=16, classes=5):
    """A quantized Gemm -> Relu -> Gemm whose hidden activation is a second graph output."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(models._he(rng, (hidden, features), features), "w0"),
             numpy_helper.from_array(models._he(rng, (classes, hidden), hidden), "w1")]
    nodes = [helper.make_node("Gemm", ["x", "w0"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["hidden"]),
             helper.make_node("Gemm", ["hidden", "w1"], ["logits"], transB=1)]
    graph = helper.make_graph(
        nodes, "two_outputs", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             ["N", features])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["N", hidden]),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    models.quantize(model, path, rng.standard_normal((16, features)).astype(np.float32))
    return str(path), (features,)


def fixed_batch_float_model(batch=1, size=16, channels=8, classes=10):
    """A float Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm whose input is named
    ``data_0`` with a fixed batch (``batch`` x 3 x size x size), as the model zoo's are."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(models._he(rng, (channels, 3, 3, 3), 27), "conv_w"),
             numpy_helper.from_array((rng.standard_normal(channels) * 0.1).astype(np.float32),
                                     "conv_b"),
             numpy_helper.from_array(models._he(rng, (classes, channels), channels), "fc_w"),
             numpy_helper.from_array((rng.standard_normal(classes) * 0.1).astype(np.float32),
                                     "fc_b")]
    nodes = [helper.make_node("Conv", ["data_0", "conv_w", "conv_b"], ["conv"],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv"], ["relu"]),
             helper.make_node("GlobalAveragePool", ["relu"], ["pool"]),
             helper.make_node("Flatten", ["pool"], ["flat"]),
             helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["prob"], transB=1)]
    graph = helper.make_graph(
        nodes, "fixed_batch",
        [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [batch, 3, size, size])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [batch, classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model, (3, size, size)


# npu plan: the limits of npu gemm, before planning --------------------------------------------

@pytest.mark.parametrize("m, k, n, match", [
    (1_000_000_000, 64, 64, "more than the 4 GiB a 32-bit address reaches"),
    (10, MAX_K + 1, 64, f"larger than MAX_K = {MAX_K}"),
    (200_000, 200_000, 1, f"larger than MAX_K = {MAX_K}"),
])
def test_plan_refuses_what_gemm_refuses(capsys, tmp_path, m, k, n, match):
    sizes = ["--m", m, "--k", k, "--n", n]
    plan_error = refused(capsys, tmp_path, ["plan", *sizes], match)
    # npu gemm's random mode: the same message, before A and B are drawn.
    gemm_error = refused(capsys, tmp_path, ["gemm", *sizes, "--sim", "model"], match)
    assert plan_error == gemm_error


def test_plan_at_the_limit_still_plans(capsys):
    status, out, err = run_cli(capsys, "plan", "--m", 1, "--k", MAX_K, "--n", 1, "--json")
    assert status == 0, err
    assert json.loads(out)["k"] == MAX_K


def test_random_qgemm_too_large(capsys, tmp_path):
    refused(capsys, tmp_path, ["qgemm", "--m", 100_000, "--k", 100_000, "--n", 100,
                               "--sim", "model"], "more than the 4 GiB")


# --out: never an input, the name written is the name reported ---------------------------------

def test_gemm_out_is_not_an_input(capsys, tmp_path):
    a, b = tmp_path / "A.npy", tmp_path / "B.npy"
    np.save(a, int8((4, 3)))
    np.save(b, int8((3, 2), seed=1))
    argv = ["gemm", "--a", a, "--b", b, "--sim", "model"]
    refused(capsys, tmp_path, [*argv, "--out", a], "is the input file --a")
    # Another spelling of the same file, and a name that numpy.save completes to it.
    refused(capsys, tmp_path, [*argv, "--out", tmp_path / "." / "B.npy"],
            "is the input file --b")
    refused(capsys, tmp_path, [*argv, "--out", tmp_path / "B"], "is the input file --b")
    os.symlink(a, tmp_path / "link.npy")
    refused(capsys, tmp_path, [*argv, "--out", tmp_path / "link.npy"], "is the input file --a")


def test_qgemm_out_is_not_an_input(capsys, tmp_path):
    files = {"a": int8((4, 3)), "b": int8((3, 2), seed=1),
             "bias": np.zeros(2, np.int32), "multiplier": np.full(2, 1 << 30, np.int32),
             "shift": np.full(2, 8, np.int32)}
    argv = ["qgemm", "--sim", "model", "--out-zero-point", 0, "--act-min", -128,
            "--act-max", 127]
    for option, value in files.items():
        np.save(tmp_path / f"{option}.npy", value)
        argv += [f"--{option}", tmp_path / f"{option}.npy"]
    refused(capsys, tmp_path, [*argv, "--out", tmp_path / "bias.npy"],
            "is the input file --bias")


def test_onnx_out_is_not_an_input(capsys, tmp_path, mlp_model):
    path, shape = mlp_model
    x = tmp_path / "x.npy"
    np.save(x, models.calibration_data(shape, samples=2, seed=3))
    refused(capsys, tmp_path, ["onnx", path, "--input", x, "--out", x],
            "is the input file --input")


def test_out_without_suffix_is_reported_as_written(capsys, tmp_path):
    """numpy.save's rule: ``--out C`` writes ``C.npy``; the report names that file."""
    status, out, err = run_cli(capsys, "gemm", "--m", 3, "--k", 4, "--n", 5, "--sim", "model",
                               "--out", tmp_path / "C", "--json")
    assert status == 0, err
    report = json.loads(out)
    assert report["out"] == str(tmp_path / "C.npy")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["C.npy"]
    assert np.load(tmp_path / "C.npy").shape == (3, 5)


def test_out_with_the_wrong_kind_of_name(capsys, tmp_path, mlp_model):
    path, shape = mlp_model
    x = tmp_path / "x.npy"
    np.save(x, models.calibration_data(shape, samples=2, seed=3))
    refused(capsys, tmp_path, ["gemm", "--m", 2, "--k", 2, "--n", 2, "--sim", "model",
                               "--out", tmp_path / "C.npz"], "give a name ending in .npy")
    refused(capsys, tmp_path, ["onnx", path, "--input", x, "--out", tmp_path / "y.npz"],
            "the model has one output, written to a .npy file")


def test_two_outputs_go_to_one_npz(capsys, tmp_path):
    """With several outputs ``--out`` names an .npz archive (``Y`` writes ``Y.npz``, as
    numpy.savez does); ``Y.npy`` is refused, where it used to write ``Y.npy.npz``."""
    path, shape = two_output_model(tmp_path / "two.onnx")
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(4).standard_normal((3, *shape)).astype(np.float32))
    refused(capsys, tmp_path, ["onnx", path, "--input", x, "--out", tmp_path / "Y.npy"],
            "the model has 2 outputs (hidden, logits), written to a .npz file; give a name "
            "ending in .npz")
    for given, written in (("Y.npz", "Y.npz"), ("Z", "Z.npz")):
        status, out, err = run_cli(capsys, "onnx", path, "--input", x, "--out",
                                   tmp_path / given, "--json", "--check")
        assert status == 0, err
        report = json.loads(out)
        assert report["out"] == str(tmp_path / written) and report["passed"]
        with np.load(tmp_path / written) as archive:
            assert sorted(archive.files) == ["hidden", "logits"]
            assert archive["logits"].shape == (3, 5)
    assert not (tmp_path / "Y.npy").exists() and not (tmp_path / "Y.npy.npz").exists()


def test_out_into_a_missing_directory_runs_nothing(capsys, tmp_path, mlp_model,
                                                   monkeypatch):
    from sw import driver
    from sw.onnx import runtime

    def must_not_run(*args, **kwargs):
        raise AssertionError("ran although --out cannot be written")
    monkeypatch.setattr(driver, "gemm", must_not_run)
    monkeypatch.setattr(runtime, "run_model", must_not_run)
    path, shape = mlp_model
    x = tmp_path / "x.npy"
    np.save(x, models.calibration_data(shape, samples=2, seed=3))
    missing = tmp_path / "no" / "such"
    refused(capsys, tmp_path, ["onnx", path, "--input", x, "--out", missing / "y.npy"],
            "no such directory")
    refused(capsys, tmp_path, ["gemm", "--m", 2, "--k", 2, "--n", 2, "--sim", "model",
                               "--out", missing / "c.npy"], "no such directory")
    (tmp_path / "c.npy").mkdir()
    refused(capsys, tmp_path, ["gemm", "--m", 2, "--k", 2, "--n", 2, "--sim", "model",
                               "--out", tmp_path / "c.npy"], "is a directory")
    assert not missing.exists()


# tracebacks that are one-line errors now -------------------------------------------------------

def huge_header(path, shape, dtype="|i1", data=b"\x00" * 16):
    """A .npy file whose header claims ``shape`` over a few bytes of data."""
    with open(path, "wb") as file:
        np.lib.format.write_array_header_1_0(
            file, {"descr": dtype, "fortran_order": False, "shape": shape})
        file.write(data)


def test_npy_header_claiming_a_huge_shape(capsys, tmp_path, mlp_model):
    huge = tmp_path / "huge.npy"
    huge_header(huge, (1 << 40, 1 << 20))
    good = tmp_path / "b.npy"
    np.save(good, int8((3, 2)))
    refused(capsys, tmp_path, ["gemm", "--a", huge, "--b", good, "--sim", "model"],
            f"--a {huge}: not a valid .npy file: its header claims 1099511627776x1048576 "
            f"int8")
    path, _ = mlp_model
    huge_header(huge, (1 << 30, 64), "<f4")
    refused(capsys, tmp_path, ["onnx", path, "--input", huge],
            "holds 16 bytes of data (truncated or damaged)")
    # One byte short: a truncated file, not only an absurd one.
    np.save(good, int8((3, 2)))
    good.write_bytes(good.read_bytes()[:-1])
    refused(capsys, tmp_path, ["gemm", "--a", good, "--b", good, "--sim", "model"],
            "(6 bytes), but the file holds 5 bytes")


def test_npy_with_a_broken_header(capsys, tmp_path):
    broken = tmp_path / "broken.npy"
    broken.write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': nonsense")
    refused(capsys, tmp_path, ["gemm", "--a", broken, "--b", broken, "--sim", "model"],
            "not a valid .npy file")


@pytest.mark.parametrize("batch", ["0", "-5", "two"])
def test_onnx_batch_must_be_positive(capsys, tmp_path, mlp_model, batch):
    path, shape = mlp_model
    x = tmp_path / "x.npy"
    np.save(x, models.calibration_data(shape, samples=2, seed=3))
    refused(capsys, tmp_path, ["onnx", path, "--input", x, "--batch", batch,
                               "--out", tmp_path / "y.npy"], "argument --batch")


@pytest.mark.parametrize("name, value, match", [
    ("NPU_DRAM", "bogus", "NPU_DRAM must be one of hdl, cocotbext, not 'bogus'"),
    ("NPU_BACKPRESSURE", "abc", "NPU_BACKPRESSURE must be an integer seed, not 'abc'"),
])
def test_bad_simulation_environment(capsys, tmp_path, monkeypatch, name, value, match):
    monkeypatch.setenv(name, value)
    refused(capsys, tmp_path, ["gemm", "--m", 2, "--k", 2, "--n", 2, "--sim", "model",
                               "--out", tmp_path / "c.npy"], match)
    refused(capsys, tmp_path, ["plan", "--m", 2, "--k", 2, "--n", 2], match)


def test_good_simulation_environment_passes(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("NPU_DRAM", "cocotbext")
    monkeypatch.setenv("NPU_BACKPRESSURE", "0x2a")
    status, _, err = run_cli(capsys, "gemm", "--m", 2, "--k", 2, "--n", 2, "--sim", "model")
    assert status == 0, err


# NaN in a float input --------------------------------------------------------------------------

def test_nan_input_follows_onnxruntime(capsys, tmp_path, mlp_model):
    # Relies on the host's partitions running on onnxruntime itself (issue 51, point 1): the
    # QuantizeLinear that meets the NaN is onnxruntime's, so its result is onnxruntime's.
    path, shape = mlp_model
    x = models.calibration_data(shape, samples=4, seed=3)
    x[0, 3] = np.nan
    x[2, :] = np.nan
    x[3, 5] = -np.nan
    nan = tmp_path / "nan.npy"
    np.save(nan, x)
    status, out, err = run_cli(capsys, "onnx", path, "--input", nan, "--check", "--json")
    assert status == 0, err
    report = json.loads(out)
    assert report["passed"] is True and all(report["check"].values())


# --calibrate on a model-zoo-like model: its input's name, a fixed batch ------------------------

def test_calibrate_a_fixed_batch_model_named_data_0(capsys, tmp_path):
    float_model, shape = fixed_batch_float_model(batch=1)
    path = tmp_path / "float.onnx"
    onnx.save(float_model, path)
    rng = np.random.default_rng(6)
    data, x = tmp_path / "data.npy", tmp_path / "x.npy"
    np.save(data, rng.standard_normal((21, *shape)).astype(np.float32))
    np.save(x, rng.standard_normal((1, *shape)).astype(np.float32))
    status, out, err = run_cli(capsys, "onnx", path, "--calibrate", data, "--input", x,
                               "--check", "--json")
    assert status == 0, err
    report = json.loads(out)
    assert report["passed"] is True and report["check"] == {"prob": True}
    assert report["npu_macs"] > 0


def test_quantize_feeds_whole_fixed_batches(tmp_path, monkeypatch):
    """A model with a fixed batch of 2 gets the samples two at a time under the input's own
    name; the odd one out is not used."""
    from onnxruntime import quantization
    fed = []

    def spy(source, target, reader, **options):
        fed.extend({name: value.shape for name, value in batch.items()}
                   for batch in iter(reader.get_next, None))
    monkeypatch.setattr(quantization, "quantize_static", spy)
    float_model, shape = fixed_batch_float_model(batch=2)
    models.quantize(float_model, tmp_path / "q.onnx",
                    np.zeros((7, *shape), np.float32))
    assert fed == [{"data_0": (2, *shape)}] * 3


@pytest.mark.parametrize("samples, sample_shape, match", [
    (1, (3, 16, 16), "takes 2 samples at a time, but there are only 1"),
    (4, (3, 8, 8), "the samples (4x3x8x8) do not fit the model's input 'data_0' "
                   "(2x3x16x16, batch first)"),
    (0, (3, 16, 16), "hold no sample"),
])
def test_calibrate_data_that_do_not_fit(capsys, tmp_path, samples, sample_shape, match):
    float_model, shape = fixed_batch_float_model(batch=2)
    path = tmp_path / "float.onnx"
    onnx.save(float_model, path)
    data, x = tmp_path / "data.npy", tmp_path / "x.npy"
    np.save(data, np.zeros((samples, *sample_shape), np.float32))
    np.save(x, np.zeros((2, *shape), np.float32))
    err = refused(capsys, tmp_path, ["onnx", path, "--calibrate", data, "--input", x,
                                     "--out", tmp_path / "y.npy"], match)
    assert f"--calibrate {data}: " in err


def test_errors_after_calibration_name_the_users_model(capsys, tmp_path):
    """A float model with nothing to quantize: the error comes after quantize_static wrote
    its result into a temporary folder, and names the user's file, not the deleted one."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "relu.onnx"
    onnx.save(model, path)
    x = tmp_path / "x.npy"
    np.save(x, np.ones((3, 4), np.float32))
    err = refused(capsys, tmp_path, ["onnx", path, "--calibrate", x, "--input", x],
                  f"{path}: ")
    assert "quantized.onnx" not in err and "/tmp" not in err.replace(str(tmp_path), "")


def test_out_of_memory_is_one_line(capsys, tmp_path, monkeypatch):
    """Sizes within the NPU's limits can still be more than the machine holds."""
    from sw import driver

    def exhausted(*args, **kwargs):
        raise MemoryError
    monkeypatch.setattr(driver, "gemm", exhausted)
    refused(capsys, tmp_path, ["gemm", "--m", 2, "--k", 2, "--n", 2, "--sim", "model",
                               "--out", tmp_path / "c.npy"], "not enough memory")
