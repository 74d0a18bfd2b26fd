"""The small network end to end, without RTL: description, training, graph passes,
quantization, the INT8 reference, placement and buffer planning (and, on the model backend,
the NPU programs).

Everything is seeded; random tests print their seed.
"""

import json

import numpy as np
import pytest

from hw.config import MAX_K, NPUConfig
from sw import backend, codec
from sw.compiler import Conv2dGeometry, plan_conv2d
from sw.errors import NPUTypeError, NPUValueError
from sw.nn.demo import DemoMismatch, run_demo
from sw.nn.graph import (Argmax, BatchNorm, Conv2D, Dense, Flatten, MaxPool2D, Network, ReLU,
                         Softmax, im2col)
from sw.nn.memory import BufferPlan, TensorLife, overlaps, plan_buffers
from sw.nn.passes import (flatten_as_view, fold_batchnorm, fuse_activations,
                          hwc_order_of_chw, prepare)
from sw.ir.grouping import HostStep, schedule
from sw.ir.placement import place as place_graph
from sw.nn.lower import network_graph
from sw.nn.program import (LOWERINGS, activation_buffers,
                           build_fused_program, build_layer_program, program_traffic)
from sw.nn.quantize import QParams, quantize_network, quantize_weights, unfuse_relu
from sw.nn.reference import conv2d_int32, dense_int32, predict, run_reference
from sw.nn.runtime import run_network
from sw.nn.train import (_forward_backward, _training_layers, accuracy, digits_network,
                         train_digits)
from sw.quant import requantize


TRAIN_SEED = 0


def place(qnet):
    """The graph core's placement of a quantized network."""
    return place_graph(network_graph(qnet))


def npu_groups(qnet):
    """The NPU groups of a quantized network's run (the core's grouper)."""
    graph = network_graph(qnet)
    return [step for step in schedule(graph, place_graph(graph))
            if not isinstance(step, HostStep)]


@pytest.fixture(scope="module")
def trained():
    """The seeds' network trained on the digits split (a few seconds)."""
    print(f"training seed {TRAIN_SEED}")
    network, data, log = train_digits(TRAIN_SEED)
    qnet = quantize_network(network, data.x_train)
    return network, data, log, qnet


def random_network(rng, conv2_bias=True):
    """The seeds' architecture in float64 with random (not trained) BatchNorm statistics."""
    network = digits_network(rng)
    for layer in network.layers:
        for attribute in ("weight", "bias"):
            value = getattr(layer, attribute, None)
            if value is not None:
                setattr(layer, attribute, value.astype(np.float64))
    if conv2_bias:
        network["conv2"].bias = rng.standard_normal(16)
    bn = network["bn2"]
    bn.gamma = rng.uniform(0.5, 2.0, 16)
    bn.beta = rng.standard_normal(16)
    bn.mean = rng.standard_normal(16)
    bn.var = rng.uniform(0.1, 3.0, 16)
    return network


# -- description and training -------------------------------------------------------------

def test_im2col_matches_direct_convolution():
    seed = 11
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 7, 6, 3))
    weight = rng.standard_normal((3, 3, 3, 5))
    for stride, padding in ((1, 1), (2, 1), (2, 0), (1, 2)):
        layer = Conv2D("c", weight, stride=stride, padding=padding)
        y = layer.forward(x)
        padded = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
        expected = np.zeros_like(y)
        for i in range(y.shape[1]):
            for j in range(y.shape[2]):
                window = padded[:, i * stride:i * stride + 3, j * stride:j * stride + 3]
                expected[:, i, j] = np.einsum("bhwc,hwco->bo", window, weight)
        np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)
        assert y.shape[1:] == layer.output_shape((7, 6, 3))


def test_network_rejects_bad_descriptions():
    rng = np.random.default_rng(0)
    with pytest.raises(NPUTypeError, match="weight must hold floats"):
        Conv2D("c", np.zeros((3, 3, 1, 2), np.int8))
    with pytest.raises(NPUValueError, match="bias must have 2 values"):
        Conv2D("c", np.zeros((3, 3, 1, 2)), np.zeros(3))
    with pytest.raises(NPUValueError, match="stride must be a positive integer"):
        Conv2D("c", np.zeros((3, 3, 1, 2)), stride=0)
    with pytest.raises(NPUValueError, match="activation must be one of"):
        Dense("d", np.zeros((4, 2)), activation="tanh")
    with pytest.raises(NPUValueError, match="takes 2 input channels, not 1"):
        Network((8, 8, 1), [Conv2D("c", rng.standard_normal((3, 3, 2, 4)))])
    with pytest.raises(NPUValueError, match="flatten first"):
        Network((2, 2, 1), [Dense("d", np.zeros((4, 2)))])
    with pytest.raises(NPUValueError, match="repeated: \\['r'\\]"):
        Network((2, 2, 1), [ReLU("r"), ReLU("r")])


def test_gradients_match_finite_differences():
    seed = 5
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    network = random_network(rng)
    layers = _training_layers(network)
    x = rng.random((4, 8, 8, 1))
    labels = rng.integers(0, 10, 4)
    bn = network["bn2"]

    def loss_and_grads():
        saved = bn.mean.copy(), bn.var.copy()   # training updates the running statistics
        loss, grads = _forward_backward(layers, x, labels)
        bn.mean[...], bn.var[...] = saved
        return loss, grads

    _, grads = loss_and_grads()
    assert set(grads) == {("conv1", "weight"), ("conv1", "bias"), ("conv2", "weight"),
                          ("conv2", "bias"), ("bn2", "gamma"), ("bn2", "beta"),
                          ("dense", "weight"), ("dense", "bias")}
    step = 1e-6
    for (name, attribute), grad in grads.items():
        parameter = getattr(network[name], attribute)
        for _ in range(3):
            index = tuple(int(rng.integers(0, extent)) for extent in parameter.shape)
            original = parameter[index]
            parameter[index] = original + step
            plus, _ = loss_and_grads()
            parameter[index] = original - step
            minus, _ = loss_and_grads()
            parameter[index] = original
            numeric = (plus - minus) / (2 * step)
            assert abs(numeric - grad[index]) <= 1e-6 + 1e-5 * abs(numeric), \
                (name, attribute, index, numeric, grad[index])


def test_training_is_deterministic():
    first, _, log_a = train_digits(3, epochs=1)
    second, _, log_b = train_digits(3, epochs=1)
    assert log_a.losses == log_b.losses
    for a, b in zip(first.layers, second.layers):
        for attribute in ("weight", "bias", "gamma", "beta", "mean", "var"):
            if getattr(a, attribute, None) is not None:
                assert np.array_equal(getattr(a, attribute), getattr(b, attribute))


def test_float_accuracy(trained):
    network, data, log, _ = trained
    float_accuracy = accuracy(network.forward(data.x_test), data.y_test)
    print(f"float test accuracy {float_accuracy:.4f}, trained in {log.seconds:.1f} s")
    assert len(data.x_test) == 450 and len(data.x_train) == 1347
    assert float_accuracy >= 0.95


# -- graph passes ---------------------------------------------------------------------------

@pytest.mark.parametrize("conv2_bias", [True, False])
def test_batchnorm_folding_is_exact_in_float(conv2_bias):
    seed = 21 + conv2_bias
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    network = random_network(rng, conv2_bias=conv2_bias)
    folded, notes = fold_batchnorm(network)
    assert [layer.name for layer in folded.layers] == \
        ["conv1", "relu1", "conv2", "relu2", "flatten", "dense", "softmax", "argmax"]
    assert notes and "bn2 folded into conv2" in notes[0]
    x = rng.random((6, 8, 8, 1))
    before = network.forward(x, stop="bn2")
    after = folded.forward(x, stop="conv2")
    # The same function in float64: only the order of the roundings differs.
    np.testing.assert_allclose(after, before, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(folded.forward(x, stop="dense"),
                               network.forward(x, stop="dense"), rtol=1e-12, atol=1e-12)


def test_batchnorm_after_activation_is_not_folded():
    rng = np.random.default_rng(0)
    network = Network((4, 4, 1), [
        Conv2D("c", rng.standard_normal((3, 3, 1, 2)), padding=1, activation="relu"),
        BatchNorm("bn", np.ones(2), np.zeros(2), np.zeros(2), np.ones(2)),
    ])
    folded, notes = fold_batchnorm(network)
    assert [layer.name for layer in folded.layers] == ["c", "bn"] and notes == []
    with pytest.raises(NPUValueError, match="BatchNorm must follow a Conv2D or Dense"):
        quantize_network(network, rng.random((4, 4, 4, 1)))


def test_flatten_permutation():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 5, 6))
    perm = hwc_order_of_chw(4, 5, 6)
    chw = Flatten("f", order="CHW").forward(x)
    hwc = Flatten("f", order="HWC").forward(x)
    assert np.array_equal(hwc, chw[:, perm])
    assert np.array_equal(hwc, x.reshape(3, -1))     # the HWC flatten is the memory order


def test_prepare_keeps_the_function():
    seed = 31
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    network = random_network(rng)
    prepared = prepare(network)
    assert [layer.name for layer in prepared.network.layers] == \
        ["conv1", "conv2", "flatten", "dense", "softmax", "argmax"]
    assert prepared.network["conv1"].activation == "relu"
    assert prepared.network["conv2"].activation == "relu"
    assert prepared.network["flatten"].is_view
    assert prepared.sources["conv2"] == ("conv2", "bn2", "relu2")
    assert prepared.sources["conv1"] == ("conv1", "relu1")
    x = rng.random((5, 8, 8, 1))
    np.testing.assert_allclose(prepared.network.forward(x, stop="dense"),
                               network.forward(x, stop="dense"), rtol=1e-12, atol=1e-12)
    # fuse and view alone, in the other order, give the same function too.
    viewed, _ = flatten_as_view(fuse_activations(network)[0])
    np.testing.assert_allclose(viewed.forward(x), network.forward(x))


# -- quantization and the INT8 reference ----------------------------------------------------

def test_qparams():
    relu_range = QParams.from_range(0.0, 2.55)
    assert relu_range.zero_point == -128 and relu_range.scale == pytest.approx(0.01)
    symmetric = QParams.from_range(-1.0, 1.0)
    assert symmetric.quantize(0.0) == symmetric.zero_point   # real 0 is exact
    assert QParams.from_range(0.5, 2.0).quantize(0.0) == -128   # the range includes 0
    q = np.arange(-128, 128, dtype=np.int8)
    assert np.array_equal(symmetric.quantize(symmetric.dequantize(q)), q)
    with pytest.raises(NPUValueError, match="zero_point must be within"):
        QParams(1.0, 128)


def test_weight_quantization_is_symmetric_per_channel():
    seed = 41
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((3, 3, 4, 5)) * np.array([1e-3, 1.0, 10.0, 0.1, 0.0])
    q, scale = quantize_weights(weight)
    assert q.dtype == np.int8 and q.min() >= -127
    assert np.array_equal(np.abs(q).reshape(-1, 5).max(axis=0), [127, 127, 127, 127, 0])
    assert np.all(np.abs(q * scale - weight) <= scale / 2 + 1e-15)


def test_quantized_layers_close_to_float(trained):
    """Each GEMM layer, fed the dequantized INT8 input, is within a few output LSBs of the
    float layer on the same input (the clamp at the calibrated range adds a little)."""
    network, data, _, qnet = trained
    float_net = prepare(network).network
    outputs = run_reference(qnet, data.x_test)
    previous, previous_qparams = outputs["quantize"], qnet["quantize"].output
    for op in qnet.gemm_ops():
        x = previous_qparams.dequantize(previous)
        if op.kind == "dense":
            x = x.reshape(len(x), -1)
        expected = float_net[op.name].forward(x)
        error = np.abs(op.output.dequantize(outputs[op.name]) - expected) / op.output.scale
        print(f"{op.name}: error max {error.max():.2f} LSB, mean {error.mean():.3f} LSB")
        assert error.max() < 4 and error.mean() < 0.5
        previous, previous_qparams = outputs[op.name], op.output


def test_int8_accuracy_close_to_float(trained):
    network, data, _, qnet = trained
    float_accuracy = accuracy(network.forward(data.x_test), data.y_test)
    logits, classes = predict(qnet, data.x_test)
    int8_accuracy = accuracy(classes, data.y_test)
    print(f"float {float_accuracy:.4f}, int8 reference {int8_accuracy:.4f}")
    assert logits.dtype == np.int8 and logits.shape == (450, 10)
    assert abs(int8_accuracy - float_accuracy) <= 0.02
    # Softmax then argmax (the network's own tail) agrees with argmax of the INT8 logits.
    assert np.array_equal(run_reference(qnet, data.x_test)["argmax"], classes)


def test_reference_is_the_zero_point_formula(trained):
    """Accumulating raw INT8 inputs over a zero-point border plus ``acc_bias`` equals the
    textbook ``sum((x - zx) * w) + bias`` with a zero border, exactly."""
    _, data, _, qnet = trained
    outputs = run_reference(qnet, data.x_test[:50])
    x = outputs["quantize"]
    for op in qnet.gemm_ops():
        if op.kind == "conv2d":
            centred = x.astype(np.int64) - op.input.zero_point
            kernel_h, kernel_w = op.kernel
            columns = im2col(centred, kernel_h, kernel_w, op.stride, op.padding, pad_value=0)
            acc = conv2d_int32(x, op)
        else:
            columns = x.reshape(len(x), -1).astype(np.int64) - op.input.zero_point
            acc = dense_int32(x.reshape(len(x), -1), op)
        textbook = columns @ op.gemm_weight.astype(np.int64) + op.bias
        assert np.array_equal(acc, textbook)
        assert np.array_equal(requantize(acc, op.multiplier, op.shift, op.output.zero_point,
                                         op.act_min, op.act_max), outputs[op.name])
        x = outputs[op.name]


def test_quantized_network_structure(trained):
    _, _, _, qnet = trained
    assert [op.name for op in qnet.ops] == \
        ["quantize", "conv1", "conv2", "flatten", "dense", "softmax", "argmax"]
    conv1, conv2, dense = qnet["conv1"], qnet["conv2"], qnet["dense"]
    for op in (conv1, conv2):
        assert op.relu and op.act_min == op.output.zero_point == -128 and op.act_max == 127
    assert not dense.relu and dense.act_min == -128
    assert conv2.sources == ("conv2", "bn2", "relu2")
    assert (conv1.k, conv1.n, conv2.k, conv2.n, dense.k, dense.n) == (9, 8, 72, 16, 256, 10)
    assert conv1.gemm_rows(10) == 640 and conv2.gemm_rows(10) == 160 and dense.gemm_rows(10) == 10
    for op in qnet.gemm_ops():
        assert op.weight.dtype == np.int8 and op.bias.dtype == np.int32
        assert op.multiplier.dtype == np.int32 and np.all(np.abs(op.shift) <= 31)
        assert op.input is qnet.ops[qnet.ops.index(op) - 1 - (op.kind == "dense")].output


def test_unfused_relu_gives_identical_outputs(trained):
    _, data, _, qnet = trained
    unfused = unfuse_relu(qnet)
    assert [op.name for op in unfused.ops] == ["quantize", "conv1", "conv1.relu", "conv2",
                                               "conv2.relu", "flatten", "dense", "softmax",
                                               "argmax"]
    assert unfused["conv1"].act_min == -128 and not unfused["conv1"].relu
    assert unfused["conv2"].sources == ("conv2", "bn2")
    assert unfused["conv2.relu"].sources == ("relu2",)
    fused_out = run_reference(qnet, data.x_test)
    unfused_out = run_reference(unfused, data.x_test)
    for name in ("conv1", "conv2", "dense"):
        key = f"{name}.relu" if name != "dense" else name
        assert np.array_equal(unfused_out[key], fused_out[name])


def test_maxpool_on_int8_commutes_with_quantization():
    seed = 51
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    network = Network((6, 6, 1), [
        Conv2D("c", rng.standard_normal((3, 3, 1, 4)), rng.standard_normal(4), padding=1,
               activation="relu"),
        MaxPool2D("pool", 2), Flatten("f"), Dense("d", rng.standard_normal((36, 3))),
        Softmax("s"), Argmax("a")])
    x = rng.random((8, 6, 6, 1))
    qnet = quantize_network(network, x)
    outputs = run_reference(qnet, x)
    assert np.array_equal(outputs["pool"], MaxPool2D("p", 2).forward(outputs["c"]))
    placements = {p.node: p.device for p in place(qnet)}
    assert placements == {"quantize": "cpu", "c": "npu", "pool": "cpu", "f": "cpu",
                          "d": "npu", "s": "cpu", "a": "cpu"}


# -- placement --------------------------------------------------------------------------------

def test_placement_and_reasons(trained):
    _, _, _, qnet = trained
    placements = place(qnet)
    by_name = {p.node: p for p in placements}
    assert [p.node for p in placements] == [op.name for op in qnet.ops]
    assert {name: p.device for name, p in by_name.items()} == {
        "quantize": "cpu", "conv1": "npu", "conv2": "npu", "flatten": "cpu", "dense": "npu",
        "softmax": "cpu", "argmax": "cpu"}
    assert "implicit im2col" in by_name["conv1"].reason
    assert "ReLU in the requantization clamp (act_min = -128)" in by_name["conv1"].reason
    assert "conv2 + bn2 + relu2 in one pass" in by_name["conv2"].reason
    assert "K = 72 by N = 16" in by_name["conv2"].reason
    assert "K = 256 by N = 10" in by_name["dense"].reason
    assert "ReLU" not in by_name["dense"].reason
    assert "free view" in by_name["flatten"].reason
    assert "float" in by_name["softmax"].reason
    assert "not a matmul" in by_name["argmax"].reason
    unfused = {p.node: p for p in place(unfuse_relu(qnet))}
    assert unfused["conv1.relu"].device == "cpu" and "unfused" in unfused["conv1.relu"].reason


def test_placement_sends_an_overlong_reduction_to_the_cpu():
    rng = np.random.default_rng(2)
    features = MAX_K + 1
    network = Network((1, features, 1), [Flatten("f"),
                                          Dense("d", rng.standard_normal((features, 2)) * 1e-3)])
    qnet = quantize_network(network, rng.random((2, 1, features, 1)))
    dense = {p.node: p for p in place(qnet)}["d"]
    assert dense.device == "cpu" and "exceeds MAX_K" in dense.reason


# -- buffer planning --------------------------------------------------------------------------

def test_buffer_planner_reuses_dead_buffers():
    # The one-program chain of the digits network at batch 8: the padded conv inputs hold a
    # host-written zero-point border, so they live from step 0.
    lives = [TensorLife("input", 8 * 100, 0, 1), TensorLife("conv1", 8 * 800, 0, 2),
             TensorLife("conv2", 8 * 256, 2, 3), TensorLife("dense", 8 * 10, 3, 4)]
    plan = plan_buffers(lives, alignment=64)
    print(plan.summary())
    assert plan.buffer_of == {"input": 1, "conv1": 0, "conv2": 1, "dense": 0}
    assert plan.buffer_sizes == (6400, 2048)
    assert plan.total_bytes == 8448 < plan.naive_bytes == 6400 + 832 + 2048 + 128
    assert plan.reused == {0: ["conv1", "dense"], 1: ["input", "conv2"]}
    assert plan.conflicts() == []

    # Pinned, conv1's buffer keeps its border for the next batch: dense needs its own bytes.
    lives[1] = TensorLife("conv1", 8 * 800, 0, 2, pinned=True)
    plan = plan_buffers(lives, alignment=64)
    assert plan.buffer_of == {"input": 1, "conv1": 0, "conv2": 1, "dense": 2}
    assert plan.reused == {1: ["input", "conv2"]}
    assert plan.buffer_sizes == (6400, 2048, 128) and plan.conflicts() == []


@pytest.mark.parametrize("seed", range(20))
def test_buffer_planner_never_overlaps_live_buffers(seed):
    print(f"seed {seed}")
    rng = np.random.default_rng(1000 + seed)
    lives = []
    for index in range(int(rng.integers(1, 30))):
        first = int(rng.integers(0, 20))
        lives.append(TensorLife(f"t{index}", int(rng.integers(1, 5000)), first,
                                first + int(rng.integers(0, 6)),
                                pinned=bool(rng.random() < 0.2)))
    plan = plan_buffers(lives, alignment=int(rng.choice([1, 16, 64])))
    for a in lives:
        assert plan.offset(a.name) % plan.alignment == 0
        assert plan.offset(a.name) + a.bytes <= plan.total_bytes
        for b in lives:
            if a is not b and overlaps(a, b):
                a_start, b_start = plan.offset(a.name), plan.offset(b.name)
                assert a_start + a.bytes <= b_start or b_start + b.bytes <= a_start
    # Greedy colouring in order of first use is optimal in the number of buffers: as many
    # as the most tensors live at one step.
    most_live = max(sum(life.first <= step <= (float("inf") if life.pinned else life.last)
                        for life in lives)
                    for step in range(0, 26))
    assert len(plan.buffer_sizes) == most_live
    assert plan.total_bytes <= plan.naive_bytes


def test_buffer_plan_conflicts_are_detected():
    lives = (TensorLife("a", 100, 0, 2), TensorLife("b", 100, 1, 3))
    bad = BufferPlan(lives=lives, buffer_of={"a": 0, "b": 0}, buffer_sizes=(128,),
                     buffer_offsets=(0,), alignment=64)
    assert bad.conflicts() == [("a", "b")]
    lives = (TensorLife("a", 100, 0, 0, pinned=True), TensorLife("b", 100, 1, 1))
    bad = BufferPlan(lives=lives, buffer_of={"a": 0, "b": 0}, buffer_sizes=(128,),
                     buffer_offsets=(0,), alignment=64)
    assert bad.conflicts() == [("a", "b")]
    assert plan_buffers(lives).buffer_of == {"a": 0, "b": 1}
    with pytest.raises(NPUValueError, match="first <= last"):
        TensorLife("c", 10, 3, 2)
    with pytest.raises(NPUValueError, match="names must be unique"):
        plan_buffers([TensorLife("a", 1, 0, 0), TensorLife("a", 1, 1, 1)])


# -- NPU programs on the model backend --------------------------------------------------------


def run_model(config, image):
    result = backend.run_programs(config, "model", [image.run_args()])[0]
    assert result.done, (result.error_code, result.error_pc)
    return result


@pytest.mark.parametrize("config_name", ["8x8", "4x4", "3x5", "16x16"])
@pytest.mark.parametrize("lowering", LOWERINGS)
def test_one_program_is_bit_exact(trained, config_name, lowering):
    _, data, _, qnet = trained
    config = NPUConfig.from_name(config_name)
    graph = network_graph(qnet)
    steps = schedule(graph, place_graph(graph))
    assert [step.names for step in steps] == [["quantize"], ["conv1", "conv2", "flatten",
                                                             "dense"], ["softmax", "argmax"]]
    group = steps[1]
    assert [op.name for op in group.ops] == ["conv1", "conv2", "dense"]
    x = data.x_test[:37]                     # not a multiple of anything
    reference = run_reference(qnet, x)
    image = build_fused_program(config, group.ops, reference["quantize"], lowering=lowering)
    assert sum(codec_opcode(word) == "END" for word in image.words) == 1   # ONE program
    result = run_model(config, image)
    assert np.array_equal(image.read(result.dram).reshape(37, 10), reference["dense"])
    # The intermediate activations never left DRAM, and they are right there too.
    assert np.array_equal(image.read(result.dram, "conv1"), reference["conv1"])
    assert np.array_equal(image.read(result.dram, "conv2"), reference["conv2"])
    # The pinned border of conv2's padded input is intact after the run.
    addr, size = image.regions["conv1"]
    buffer = image.buffers["conv1"]
    border = result.dram[addr:addr + size][buffer.border_mask()].view(np.int8)
    assert border.size == buffer.border_bytes and np.all(border == buffer.zero_point)


def codec_opcode(word):
    return codec.decode(word)[0].name


def test_layer_programs_are_bit_exact(trained):
    _, data, _, qnet = trained
    config = NPUConfig()
    reference = run_reference(qnet, data.x_test[:20])
    unfused = run_reference(unfuse_relu(qnet), data.x_test[:20])
    x = reference["quantize"]
    (group,) = npu_groups(qnet)
    for op in group.ops:
        image = build_layer_program(config, op, x)
        output = image.read(run_model(config, image).dram)
        assert np.array_equal(output.reshape(reference[op.name].shape), reference[op.name])
        # Unfused: the GEMM clamps at -128 only; its output is the reference's pre-ReLU.
        raw = build_layer_program(config, op, x, act_min=-128)
        raw_output = raw.read(run_model(config, raw).dram).reshape(reference[op.name].shape)
        assert np.array_equal(raw_output, unfused[op.name])
        x = output


def test_buffers_and_plan_of_the_one_program(trained):
    _, _, _, qnet = trained
    config = NPUConfig()
    (chain,) = npu_groups(qnet)
    buffers = activation_buffers(chain.ops, 8)
    assert {name: (b.padded_height, b.padded_width, b.channels, b.padding, b.zero_point)
            for name, b in buffers.items()} == {
        "input": (10, 10, 1, 1, -128), "conv1": (10, 10, 8, 1, -128),
        "conv2": (4, 4, 16, 0, 0), "dense": (1, 1, 10, 0, 0)}
    x = np.zeros((8, 8, 8, 1), np.int8)
    image = build_fused_program(config, chain.ops, x)
    plan = image.buffer_plan
    assert plan.conflicts() == []
    assert plan.reused == {1: ["input", "conv2"]}
    assert [life.pinned for life in plan.lives] == [False, True, False, False]
    assert plan.total_bytes < plan.naive_bytes
    # The dense layer reads conv2's NHWC output where conv2 wrote it: the flatten is free.
    dense_reads = [fields for opcode, fields in map(decode_word, image.words)
                   if opcode == "LOAD_SPAD" and fields["dram_stride"] == 256]
    conv2_addr = image.regions["conv2"][0]
    assert dense_reads and all(conv2_addr <= f["dram_addr"] < conv2_addr + 8 * 256
                               for f in dense_reads)
    with pytest.raises(NPUValueError, match=r"must have shape \(8, 8, 8, 1\), not \(8, 64\)"):
        build_fused_program(config, chain.ops, x.reshape(8, 64))
    # Every operator's plan counts what the words move.
    traffic = program_traffic(image.words)
    assert traffic["read"] == sum(p.dram_bytes_read for p in image.plans.values())
    assert traffic["written"] == sum(p.dram_bytes_written for p in image.plans.values())


def decode_word(word):
    opcode, fields = codec.decode(word)
    return opcode.name, fields


def test_kernel_row_lowering_uses_fewer_weight_tiles(trained):
    _, _, _, qnet = trained
    config = NPUConfig()
    conv1 = qnet["conv1"]
    buffers = activation_buffers((conv1, qnet["conv2"]), 4)
    # conv1 of the digits network on a batch of 4: 8x8x1 in, 3x3 kernel, 8 channels out,
    # into conv2's buffer with its border of 1.
    assert (conv1.kernel, conv1.padding, conv1.stride, conv1.n) == ((3, 3), 1, 1, 8)
    assert (buffers["input"].padding, buffers["conv1"].padding) == (1, 1)
    geometry = Conv2dGeometry(4, 8, 8, 1, 8, 3, 3, padding=1, out_padding=1)
    rows = plan_conv2d(config, geometry, lowering="kernel_rows")
    taps = plan_conv2d(config, geometry)
    assert (taps.weight_tiles, taps.tile_fill) == (9, 1 / 8)
    assert (rows.weight_tiles, rows.tile_fill) == (3, 3 / 8)
    assert rows.instructions < taps.instructions


def test_a_cpu_operator_inside_the_chain_splits_it():
    """A max-pool between a convolution and a dense layer runs on the host: two NPU
    programs per batch, the result still the INT8 reference's."""
    rng = np.random.default_rng(7)
    network = Network((4, 4, 1), [
        Conv2D("c", rng.standard_normal((3, 3, 1, 4)), padding=1, activation="relu"),
        MaxPool2D("pool", 2), Flatten("f"), Dense("d", rng.standard_normal((16, 3)))])
    x = rng.random((6, 4, 4, 1))
    qnet = quantize_network(network, x)
    assert [group.names for group in npu_groups(qnet)] == [["c"], ["d"]]
    result = run_network(qnet, x, config=NPUConfig(), batch=4)
    assert result.programs == 4 and result.batches == 2
    np.testing.assert_array_equal(result.logits, run_reference(qnet, x)["d"])


def test_run_network_modes_agree(trained):
    _, data, _, qnet = trained
    config = NPUConfig.from_name("4x4")
    x = data.x_test[:50]
    reference = run_reference(qnet, x)
    results = {mode: run_network(qnet, x, config=config, sim="model", batch=16, mode=mode)
               for mode in ("layers_unfused", "layers", "fused")}
    for mode, result in results.items():
        assert np.array_equal(result.logits, reference["dense"]), mode
        assert np.array_equal(result.outputs["argmax"], reference["argmax"]), mode
        assert result.batches == 4 and result.cycles is None
        assert result.macs == sum(op.macs(50) for op in qnet.gemm_ops())
    for name in ("conv1", "conv2", "dense"):
        assert np.array_equal(results["layers"].layer_outputs[name], reference[name])
    fused, layers, unfused = results["fused"], results["layers"], results["layers_unfused"]
    assert (fused.programs, layers.programs, unfused.programs) == (4, 12, 12)
    assert (fused.host_transfers, layers.host_transfers) == (8, 24)
    assert (unfused.cpu_passes, layers.cpu_passes, fused.cpu_passes) == (8, 0, 0)
    # Fused: the whole padded input in (its bytes are reused by conv2), the logits out.
    assert fused.host_bytes_written == 50 * 100 and fused.host_bytes_read == 50 * 10
    # Per layer: each input interior in, each output out.
    assert layers.host_bytes_written == 50 * (64 + 512 + 256)
    assert layers.host_bytes_read == 50 * (512 + 256 + 10)
    cache = {}
    first = run_network(qnet, x, config=config, batch=16, mode="layers", cache=cache)
    again = run_network(qnet, x, config=config, batch=16, mode="layers", cache=cache)
    assert (first.simulated, again.simulated, len(cache)) == (12, 0, 12)
    assert np.array_equal(again.logits, first.logits)
    with pytest.raises(NPUValueError, match="mode must be one of"):
        run_network(qnet, x, config=config, mode="eager")
    with pytest.raises(NPUValueError, match="lowering must be one of"):
        run_network(qnet, x, config=config, lowering="winograd")


def test_demo_on_the_model(tmp_path):
    report = tmp_path / "demo.md"
    summary = run_demo(sim="model", batch=128, out=report)
    print({key: summary[key] for key in ("float_accuracy", "int8_accuracy", "npu_accuracy")})
    assert summary["bit_exact"] and summary["mismatched_stages"] == []
    assert summary["npu_accuracy"] == summary["int8_accuracy"]
    assert summary["float_accuracy"] >= 0.95
    assert abs(summary["int8_accuracy"] - summary["float_accuracy"]) <= 0.02
    assert [stage["stage"] for stage in summary["stages"]] == ["a", "b", "c", "c'"]
    assert [stage["programs_per_batch"] for stage in summary["stages"]] == [3, 3, 1, 1]
    assert [stage["host_transfers_per_batch"] for stage in summary["stages"]] == [6, 6, 2, 2]
    # (b)'s DRAM images equal (a)'s (the ReLU zero point is -128): reused, not run again.
    assert [(stage["programs"], stage["simulated_programs"]) for stage in summary["stages"]] \
        == [(12, 12), (12, 0), (4, 4), (4, 4)]
    text = report.read_text()
    assert summary["report"] == str(report)
    assert "| NPU (`model`) | " in text and "bit for bit" in text and "**NOT**" not in text
    json.dumps(summary)                     # plain values only


def test_demo_reports_a_mismatch(tmp_path, monkeypatch):
    real = backend.run_programs

    def corrupting(config, sim, programs):
        results = real(config, sim, programs)
        results[-1].dram[:] = results[-1].dram ^ 1    # every byte, the logits included
        return results

    monkeypatch.setattr(backend, "run_programs", corrupting)
    report = tmp_path / "demo.md"
    with pytest.raises(DemoMismatch, match="stage\\(s\\) a, b, c, c'"):
        run_demo(sim="model", batch=256, out=report)
    assert "**NOT** equal to the INT8 reference" in report.read_text()


def test_reference_wraps_on_int32_overflow_as_the_accumulator(trained):
    """One reference, one overflow behaviour: a dense operator whose sums leave INT32 wraps
    in sw.nn.reference exactly as sw.reference (and the hardware, tb/test_qgemm.py) do."""
    from dataclasses import replace
    from sw.reference import INT32_MAX, gemm_int32, wrap_int32
    _, _, _, qnet = trained
    op = next(op for op in qnet.gemm_ops() if op.kind == "dense")
    op = replace(op, bias=np.full(op.n, INT32_MAX - 10, np.int32), input=replace(
        op.input, zero_point=0))
    x = np.tile(np.where(op.gemm_weight[:, 0] < 0, -127, 127).astype(np.int8), (2, 1))
    exact = x.astype(np.int64) @ op.gemm_weight.astype(np.int64) + op.bias.astype(np.int64)
    assert exact.max() > INT32_MAX                                  # it does overflow
    got = dense_int32(x, op)
    np.testing.assert_array_equal(got, wrap_int32(exact))
    np.testing.assert_array_equal(got, gemm_int32(x, op.gemm_weight, op.bias))
