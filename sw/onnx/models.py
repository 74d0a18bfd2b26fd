"""Float ONNX models built by the project (nothing downloaded), and their quantization by
onnxruntime's own ``quantize_static``.

Each builder takes a numpy ``Generator`` and returns ``(onnx.ModelProto, input shape without
the batch)``; the weights are seeded random numbers scaled like a trained layer's (He
initialization), except :func:`digits_cnn`, which exports the project's trained digits
network (:mod:`sw.nn.train`). Inputs are NCHW float32 with a symbolic batch dimension.
"""

import numpy as np

from ..errors import NPUValueError


__all__ = ["MODELS", "mlp", "residual_block", "mobilenet_block", "concat_pool_softmax",
           "grouped_block", "matmul_bias", "digits_cnn", "build",
           "quantize", "QUANT_FORMATS", "CALIBRATION_BATCH", "calibration_data"]


#: ``quantize_static``'s formats, by the names the CLI and the tests use.
QUANT_FORMATS = ("qdq", "qoperator")


def _helpers():
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    return onnx, TensorProto, helper, numpy_helper


def _he(rng, shape, fan_in):
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def _model(nodes, initializers, input_shape, output_shape):
    onnx, TensorProto, helper, numpy_helper = _helpers()
    graph = helper.make_graph(
        nodes, "npu_test_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *input_shape])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", *output_shape])],
        [numpy_helper.from_array(np.asarray(value), name) for name, value in initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="npu")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _node(op, inputs, outputs, **attrs):
    return _helpers()[2].make_node(op, inputs, outputs, **attrs)


def mlp(rng, features=64, hidden=(48, 32), classes=10):
    """Gemm -> Relu -> Gemm -> Relu -> Gemm on ``features`` inputs."""
    nodes, inits, previous, width = [], [], "x", features
    sizes = list(hidden) + [classes]
    for index, size in enumerate(sizes):
        w, b = f"w{index}", f"b{index}"
        inits += [(w, _he(rng, (size, width), width)),
                  (b, (rng.standard_normal(size) * 0.1).astype(np.float32))]
        out = "y" if index == len(sizes) - 1 else f"h{index}"
        nodes.append(_node("Gemm", [previous, w, b], [out], transB=1))
        if index < len(sizes) - 1:
            nodes.append(_node("Relu", [out], [f"r{index}"]))
            previous = f"r{index}"
        width = size
    return _model(nodes, inits, (features,), (classes,)), (features,)


def residual_block(rng, channels=8, size=8):
    """Conv3x3 -> Relu -> Conv3x3, added to the block's input (after a first Conv), Relu,
    GlobalAveragePool."""
    inits = [("w0", _he(rng, (channels, 3, 3, 3), 27)),
             ("b0", (rng.standard_normal(channels) * 0.1).astype(np.float32)),
             ("w1", _he(rng, (channels, channels, 3, 3), 9 * channels)),
             ("b1", (rng.standard_normal(channels) * 0.1).astype(np.float32)),
             ("w2", _he(rng, (channels, channels, 3, 3), 9 * channels)),
             ("b2", (rng.standard_normal(channels) * 0.1).astype(np.float32))]
    pads = dict(pads=[1, 1, 1, 1])
    nodes = [_node("Conv", ["x", "w0", "b0"], ["c0"], **pads), _node("Relu", ["c0"], ["r0"]),
             _node("Conv", ["r0", "w1", "b1"], ["c1"], **pads), _node("Relu", ["c1"], ["r1"]),
             _node("Conv", ["r1", "w2", "b2"], ["c2"], **pads),
             _node("Add", ["c2", "r0"], ["s"]), _node("Relu", ["s"], ["sr"]),
             _node("GlobalAveragePool", ["sr"], ["y"])]
    return _model(nodes, inits, (3, size, size), (channels, 1, 1)), (3, size, size)


def mobilenet_block(rng, channels=8, expanded=16, size=8):
    """A MobileNet-style block: Conv1x1 (expand) -> Relu -> depthwise Conv3x3 -> Relu ->
    Conv1x1 (project), then MaxPool 2x2."""
    inits = [("w0", _he(rng, (expanded, channels, 1, 1), channels)),
             ("b0", (rng.standard_normal(expanded) * 0.1).astype(np.float32)),
             ("wd", _he(rng, (expanded, 1, 3, 3), 9)),
             ("bd", (rng.standard_normal(expanded) * 0.1).astype(np.float32)),
             ("w1", _he(rng, (channels, expanded, 1, 1), expanded)),
             ("b1", (rng.standard_normal(channels) * 0.1).astype(np.float32))]
    nodes = [_node("Conv", ["x", "w0", "b0"], ["e"]), _node("Relu", ["e"], ["er"]),
             _node("Conv", ["er", "wd", "bd"], ["d"], group=expanded, pads=[1, 1, 1, 1]),
             _node("Relu", ["d"], ["dr"]), _node("Conv", ["dr", "w1", "b1"], ["p"]),
             _node("MaxPool", ["p"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    half = size // 2
    return _model(nodes, inits, (channels, size, size), (channels, half, half)), \
        (channels, size, size)


def concat_pool_softmax(rng, channels=3, branch=4, size=8, classes=10):
    """Two convolutions of the same input (3x3 and 1x1, each with Relu) concatenated on the
    channels, AveragePool 2x2, Flatten, Gemm, Softmax: a model whose quantized form has
    ``QLinearConcat``, ``QLinearAveragePool`` and ``QLinearSoftmax`` on the host."""
    half = size // 2
    features = 2 * branch * half * half
    # Non-zero biases everywhere: a zero bias trips a constant-deduplication quirk of
    # onnxruntime's optimizer.
    inits = [("w0", _he(rng, (branch, channels, 3, 3), 9 * channels)),
             ("b0", (rng.standard_normal(branch) * 0.1).astype(np.float32)),
             ("w1", _he(rng, (branch, channels, 1, 1), channels)),
             ("b1", (rng.standard_normal(branch) * 0.1).astype(np.float32)),
             ("wd", _he(rng, (classes, features), features)),
             ("bd", (rng.standard_normal(classes) * 0.1).astype(np.float32))]
    nodes = [_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             _node("Relu", ["c0"], ["r0"]),
             _node("Conv", ["x", "w1", "b1"], ["c1"]), _node("Relu", ["c1"], ["r1"]),
             _node("Concat", ["r0", "r1"], ["cat"], axis=1),
             _node("AveragePool", ["cat"], ["pool"], kernel_shape=[2, 2], strides=[2, 2]),
             _node("Flatten", ["pool"], ["flat"]),
             _node("Gemm", ["flat", "wd", "bd"], ["logits"], transB=1),
             _node("Softmax", ["logits"], ["y"], axis=-1)]
    return _model(nodes, inits, (channels, size, size), (classes,)), (channels, size, size)


def grouped_block(rng, channels=8, size=8, group=2, classes=10):
    """Convolutions in groups, as AlexNet's (group 2) and ShuffleNet's (group 4): a 3x3
    Conv -> Relu -> a 3x3 Conv in ``group`` groups -> Relu -> a 1x1 Conv in ``group``
    groups, GlobalAveragePool, Flatten, Gemm."""
    inits = [("w0", _he(rng, (channels, 3, 3, 3), 27)),
             ("b0", (rng.standard_normal(channels) * 0.1).astype(np.float32)),
             ("w1", _he(rng, (2 * channels, channels // group, 3, 3), 9 * channels // group)),
             ("b1", (rng.standard_normal(2 * channels) * 0.1).astype(np.float32)),
             ("w2", _he(rng, (channels, 2 * channels // group, 1, 1), 2 * channels // group)),
             ("b2", (rng.standard_normal(channels) * 0.1).astype(np.float32)),
             ("wd", _he(rng, (classes, channels), channels)),
             ("bd", (rng.standard_normal(classes) * 0.1).astype(np.float32))]
    nodes = [_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             _node("Relu", ["c0"], ["r0"]),
             _node("Conv", ["r0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], group=group),
             _node("Relu", ["c1"], ["r1"]),
             _node("Conv", ["r1", "w2", "b2"], ["c2"], group=group),
             _node("Relu", ["c2"], ["r2"]), _node("GlobalAveragePool", ["r2"], ["g"]),
             _node("Flatten", ["g"], ["f"]), _node("Gemm", ["f", "wd", "bd"], ["y"], transB=1)]
    return _model(nodes, inits, (3, size, size), (classes,)), (3, size, size)


def matmul_bias(rng, features=24, classes=33):
    """``MatMul`` then an ``Add`` of a bias vector (broadcast from ``(classes,)``), then Relu
    and a second MatMul + Add: a GEMM with bias written as two nodes, as many exporters do."""
    inits = [("w0", _he(rng, (features, classes), features)),
             ("b0", (rng.standard_normal(classes) * 0.1).astype(np.float32)),
             ("w1", _he(rng, (classes, classes), classes)),
             ("b1", (rng.standard_normal(classes) * 0.1).astype(np.float32))]
    nodes = [_node("MatMul", ["x", "w0"], ["m0"]), _node("Add", ["m0", "b0"], ["a0"]),
             _node("Relu", ["a0"], ["r0"]), _node("MatMul", ["r0", "w1"], ["m1"]),
             _node("Add", ["m1", "b1"], ["y"])]
    return _model(nodes, inits, (features,), (classes,)), (features,)


def digits_cnn(rng=None, *, network=None):
    """The project's digits CNN (conv-relu-conv-bn-relu-flatten-dense), trained by
    :func:`sw.nn.train.train_digits` (seed 0) unless ``network`` is given, with its
    BatchNorm folded (:func:`sw.nn.passes.prepare`); logits out."""
    from ..nn.graph import Conv2D, Dense, Flatten, ReLU
    from ..nn.passes import prepare
    if network is None:
        from ..nn.train import train_digits
        network = train_digits(seed=0)[0]
    net = prepare(network).network
    nodes, inits, previous = [], [], "x"
    for index, layer in enumerate(net.layers):
        out = f"t{index}"
        if isinstance(layer, Conv2D):
            inits += [(f"{layer.name}.w", np.ascontiguousarray(
                          layer.weight.transpose(3, 2, 0, 1)).astype(np.float32)),
                      (f"{layer.name}.b", (layer.bias if layer.bias is not None else
                                           np.zeros(layer.weight.shape[-1])).astype(np.float32))]
            p = layer.padding
            nodes.append(_node("Conv", [previous, f"{layer.name}.w", f"{layer.name}.b"], [out],
                               pads=[p] * 4, strides=[layer.stride] * 2))
            if layer.activation == "relu":
                nodes.append(_node("Relu", [out], [out + "r"]))
                out += "r"
        elif isinstance(layer, ReLU):
            nodes.append(_node("Relu", [previous], [out]))
        elif isinstance(layer, Flatten):
            nodes.append(_node("Flatten", [previous], [out]))
        elif isinstance(layer, Dense):
            weight = layer.weight
            if index and isinstance(net.layers[index - 1], Flatten) \
                    and net.layers[index - 1].order == "HWC":
                # The prepared network reads NHWC features; ONNX flattens NCHW.
                h, w, c = net.shapes()[index - 1][1]
                from ..nn.passes import hwc_order_of_chw
                inverse = np.argsort(hwc_order_of_chw(h, w, c))
                weight = weight[inverse]
            inits += [(f"{layer.name}.w", weight.T.astype(np.float32)),
                      (f"{layer.name}.b", layer.bias.astype(np.float32))]
            nodes.append(_node("Gemm", [previous, f"{layer.name}.w", f"{layer.name}.b"], [out],
                               transB=1))
        else:
            break       # softmax / argmax: the model's output is the logits
        previous = out
    nodes[-1].output[0] = "y"
    height, width, channels = net.input_shape
    return _model(nodes, inits, (channels, height, width), (10,)), (channels, height, width)


MODELS = {"mlp": mlp, "residual": residual_block, "mobilenet": mobilenet_block,
          "concat_pool_softmax": concat_pool_softmax, "grouped": grouped_block,
          "matmul_bias": matmul_bias, "digits": digits_cnn}


def build(name, seed=0):
    """``(float model, input shape)`` of the test model ``name`` (a key of :data:`MODELS`)."""
    if name not in MODELS:
        raise NPUValueError(f"no test model {name!r}; models: {sorted(MODELS)}")
    return MODELS[name](np.random.default_rng(seed))


def calibration_data(input_shape, samples=32, seed=1):
    """Seeded float32 NCHW samples for calibration (or a test set)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((samples, *input_shape)).astype(np.float32)


#: Samples per calibration batch for a model whose batch dimension is symbolic.
CALIBRATION_BATCH = 8


def _calibration_input(model, shape):
    """``(name, batch)`` of the one input of ``model`` (an ``onnx.ModelProto``) that
    calibration data of ``shape`` feeds: ``batch`` is the model's fixed batch size, or None
    when it is symbolic. Refuses a model with other than one input (its graph inputs that
    are not initializers), and data that hold no sample, do not fit the input or hold fewer
    samples than its fixed batch."""
    initializers = {init.name for init in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializers]
    if len(inputs) != 1:
        raise NPUValueError(f"calibration feeds one input, but the model has {len(inputs)}"
                            f"{': ' + ', '.join(v.name for v in inputs) if inputs else ''}")
    name = inputs[0].name
    if not shape or shape[0] == 0:
        raise NPUValueError(f"the calibration data hold no sample (shape {shape})")
    tensor = inputs[0].type.tensor_type
    if not tensor.HasField("shape"):
        return name, None           # no shape declared: onnxruntime checks the samples
    dims = [dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0 else None
            for dim in tensor.shape.dim]
    shown = "x".join("N" if d is None else str(d) for d in dims) or "a scalar"
    if len(shape) != len(dims) or any(d is not None and d != s
                                      for d, s in zip(dims[1:], shape[1:])):
        raise NPUValueError(f"the samples ({'x'.join(map(str, shape))}) do not fit the "
                            f"model's input {name!r} ({shown}, batch first)")
    if dims[0] is not None and shape[0] < dims[0]:
        raise NPUValueError(f"the model's input {name!r} ({shown}) takes {dims[0]} samples "
                            f"at a time, but there are only {shape[0]}")
    return name, dims[0]


def quantize(float_model, target, calibration, *, fmt="qdq", per_channel=True,
             reduce_range=True, activation_type="int8"):
    """Quantize ``float_model`` (a ModelProto or a path) into the file ``target`` with
    onnxruntime's ``quantize_static`` and ``calibration`` (float32, batch first).

    The samples go to the model's one input by its own name. A model whose batch dimension
    is a fixed integer B takes them B at a time: at least B samples are needed, and a
    remainder of fewer than B is not used; a model with a symbolic batch takes them
    :data:`CALIBRATION_BATCH` at a time.

    ``reduce_range=True`` (7-bit weights) is onnxruntime's advice for x86 CPUs without
    VNNI: their u8 x s8 kernels saturate pairs of products at 16 bits otherwise, and the
    result is then not the exact one the NPU computes (docs/onnx.md).

    Raises
    ------
    NPUValueError
        For a bad ``fmt`` or ``activation_type``, a model with other than one input, or
        calibration data whose shape does not fit the input (or that holds fewer samples
        than the fixed batch).
    """
    import os
    import tempfile
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    if fmt not in QUANT_FORMATS:
        raise NPUValueError(f"fmt must be one of {QUANT_FORMATS}, not {fmt!r}")
    types = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
    if activation_type not in types:
        raise NPUValueError(f"activation_type must be one of {sorted(types)}, not "
                            f"{activation_type!r}")
    model = float_model if isinstance(float_model, onnx.ModelProto) \
        else onnx.load(os.fspath(float_model), load_external_data=False)
    name, fixed = _calibration_input(model, np.shape(calibration))
    calibration = np.asarray(calibration, dtype=np.float32)
    batch = fixed or CALIBRATION_BATCH
    # A fixed batch takes only whole batches; a symbolic one also the last, shorter one.
    count = len(calibration) - len(calibration) % batch if fixed else len(calibration)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{name: calibration[i:i + batch]}
                                 for i in range(0, count, batch)])

        def get_next(self):
            return next(self.batches, None)

    with tempfile.TemporaryDirectory() as folder:
        source = float_model
        if not isinstance(float_model, (str, os.PathLike)):
            source = os.path.join(folder, "float.onnx")
            onnx.save(float_model, source)
        quantize_static(source, os.fspath(target), Reader(),
                        quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
                        per_channel=per_channel, reduce_range=reduce_range,
                        activation_type=types[activation_type], weight_type=QuantType.QInt8)
    return target
