"""Public architectures for the regression: the nine model-zoo networks the ``onnx`` package
ships as "light" copies (``onnx/backend/test/data/light/``), with seeded random weights,
quantized by onnxruntime.

The light copies keep each network's graph and drop its weights (every large weight is a
``ConstantOfShape`` of its shape). :func:`build_float` turns one into a runnable float model:

* every float parameter is drawn again from a seeded numpy ``Generator``, by its role:
  convolution and dense weights He-scaled (``N(0, 2 / fan_in)``, as
  :mod:`sw.onnx.models` does), biases ``N(0, 0.05)``, BatchNormalization scales ``N(1, 0.1)``
  and biases ``N(0, 0.05)``, the per-channel ``Mul`` / ``Add`` after a BatchNormalization
  (Caffe2's scale layer) likewise; LRN, pooling and the rest keep their attributes;
* each BatchNormalization's mean and variance are then set to the statistics of its input on
  seeded samples (a trained network's running statistics are such averages), layer by layer
  in topological order, so every normalized activation has a unit scale and the residual
  sums of ResNet grow as they do in a trained network, not exponentially;
* the input resolution is reduced (:data:`SIZES`, 32 to 64 pixels instead of 224) to keep the
  NPU's runs short: a pooling that reduced the whole map to one pixel at 224 (a "global"
  pooling written with a fixed kernel) is made to cover the whole smaller map, every
  ``Reshape`` of an activation gets the new shape (batch copied, spatial dimensions
  rescaled), and a dense layer fed by a flattened map gets weights of the new width;
* the batch dimension is symbolic (``N``), the model is upgraded from opset 9 to 13 with
  ``onnx.version_converter`` and the input of the final ``Softmax`` becomes a second graph
  output, ``logits``, so a comparison sees the logits and not only a saturated softmax.

:func:`build_quantized` then runs onnxruntime's ``quant_pre_process`` and ``quantize_static``
(per channel, ``reduce_range=True``, int8 weights; QDQ or QOperator; int8 or uint8
activations) on seeded calibration samples. :func:`zoo_model` caches both under
``build/onnx-zoo/`` keyed by everything that determines them (network, resolution, seed,
format, activation type, this module's source and the versions of onnx, onnxruntime, numpy
and sympy), so test runs build each model once. Builds are deterministic on a given machine;
onnxruntime's float kernels decide the BatchNormalization statistics (rounded to float16
precision so the last bits do not matter) and the calibration ranges, so another CPU may
round a scale differently.

``python -m sw.onnx.zoo --out DIR`` writes the set for users.
"""

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import NPUValueError


__all__ = ["ZOO", "SIZES", "FORMATS", "ACTIVATIONS", "LOGITS", "ZooModel", "light_path",
           "build_float", "preprocess", "quantize", "build_quantized", "zoo_model",
           "sample_inputs", "macs", "cache_root", "main"]


#: The networks, by the names this module uses, and their light copies' file stems.
_LIGHT = {
    "squeezenet": "light_squeezenet",
    "shufflenet": "light_shufflenet",
    "resnet50": "light_resnet50",
    "inception_v1": "light_inception_v1",
    "inception_v2": "light_inception_v2",
    "densenet121": "light_densenet121",
    "vgg19": "light_vgg19",
    "alexnet": "light_bvlc_alexnet",
    "zfnet512": "light_zfnet512",
}
ZOO = tuple(_LIGHT)

#: The default input resolution (square) of each network: its total stride, 32, where its
#: last map is one pixel, except for the three whose unpadded 3x3 poolings need a larger map
#: (:func:`build_float` refuses a size at which a window would not fit its padded input):
#: AlexNet and ZFNet (at 48 the last pooling would slide its 3x3 window over a 1x1 map) and
#: Inception v1 (a 2x2 map at 48 and 56).
SIZES = {
    "squeezenet": 32,
    "shufflenet": 32,
    "resnet50": 32,
    "inception_v1": 64,
    "inception_v2": 32,
    "densenet121": 32,
    "vgg19": 32,
    "alexnet": 64,
    "zfnet512": 64,
}

FORMATS = ("qdq", "qoperator")
ACTIVATIONS = ("int8", "uint8")
#: The name of the extra graph output that holds the final Softmax's input.
LOGITS = "logits"
#: Samples for the BatchNormalization statistics and for quantize_static's calibration.
BN_SAMPLES = 16
CALIBRATION_SAMPLES = 16
_OPSET = 13
_IR_VERSION = 8


def light_path(name):
    """The light copy of ``name`` in the installed ``onnx`` package."""
    import onnx
    if name not in _LIGHT:
        raise NPUValueError(f"no network {name!r} in the zoo; networks: {', '.join(ZOO)}")
    path = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light" / \
        f"{_LIGHT[name]}.onnx"
    if not path.is_file():
        raise NPUValueError(f"the onnx package ({onnx.__version__}) has no light model "
                            f"{path.name} (looked in {path.parent})")
    return path


# -- shapes ------------------------------------------------------------------------------------

def _dims(value_info):
    shape = value_info.type.tensor_type.shape
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                 for d in shape.dim)


def _shapes(model):
    """``{tensor: shape}`` by onnx's shape inference (strict: an impossible shape raises)."""
    from onnx import shape_inference
    inferred = shape_inference.infer_shapes(model, strict_mode=True)
    graph = inferred.graph
    return {v.name: _dims(v) for v in
            list(graph.value_info) + list(graph.input) + list(graph.output)}


def macs(model, shapes=None):
    """Multiply-accumulates of one sample through the Conv, Gemm and MatMul nodes of a float
    model (``{node name or output: MACs}``, in graph order)."""
    shapes = shapes or _shapes(model)
    inits = {i.name: tuple(i.dims) for i in model.graph.initializer}
    result = {}
    for node in model.graph.node:
        out = shapes.get(node.output[0]) if node.output else None
        if not out or any(not isinstance(d, int) for d in out[1:]):
            continue
        per_sample = int(np.prod(out[1:], dtype=np.int64))
        weight = None
        if len(node.input) > 1:
            weight = inits.get(node.input[1]) or shapes.get(node.input[1])
        if node.op_type == "Conv" and weight:
            result[node.name or node.output[0]] = per_sample * int(np.prod(weight[1:]))
        elif node.op_type in ("Gemm", "MatMul") and weight:
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            k = weight[-1] if trans_b else weight[-2]
            result[node.name or node.output[0]] = per_sample * int(k)
    return result


# -- the float model ---------------------------------------------------------------------------

def _consumers(graph):
    found = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            found.setdefault(name, []).append((node, index))
    return found


def _attr(node, name, default=None):
    from onnx import helper
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def _set_attr(node, name, value):
    from onnx import helper
    for index, attr in enumerate(node.attribute):
        if attr.name == name:
            del node.attribute[index]
            break
    node.attribute.append(helper.make_attribute(name, value))


def _role(name, consumers, inits, seen=None):
    """``(op_type, input index, node, shape)`` of the node that uses parameter ``name``,
    looking through the ``Unsqueeze`` and ``Reshape`` that Caffe2's exports put before some
    (``shape``: the one a Reshape gives it, else None)."""
    from onnx import numpy_helper
    uses = consumers.get(name, [])
    if len(uses) != 1:
        raise NPUValueError(f"parameter {name!r} has {len(uses)} consumers, not one")
    node, index = uses[0]
    if node.op_type in ("Unsqueeze", "Reshape") and index == 0:
        if node.op_type == "Reshape" and node.input[1] in inits:
            seen = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[1]]))
        return _role(node.output[0], consumers, inits, seen)
    return node.op_type, index, node, seen


def _draw(rng, role, shape):
    """A parameter of ``shape`` for its role (see the module's docstring)."""
    op, index, node, seen = role
    shape = tuple(int(d) for d in shape)
    normal = rng.standard_normal(shape)
    if (op == "Conv" and index == 1) or (op == "Gemm" and index == 1):
        used = seen or shape            # the shape the node sees
        if op == "Gemm" and not _attr(node, "transB", 0):
            fan_in = used[0]
        else:
            fan_in = int(np.prod(used[1:])) if len(used) > 1 else 1
        value = normal * np.sqrt(2.0 / fan_in)
    elif (op in ("Conv", "Gemm") and index == 2) or op == "Add":
        value = normal * 0.05
    elif op == "Mul" or (op == "BatchNormalization" and index == 1):
        value = 1.0 + normal * 0.1
    elif op == "BatchNormalization" and index == 2:
        value = normal * 0.05
    elif op == "BatchNormalization" and index == 3:
        value = np.zeros(shape)              # running mean and variance: set from data later
    elif op == "BatchNormalization" and index == 4:
        value = np.ones(shape)
    else:
        raise NPUValueError(f"no rule to draw an input {index} of {op} (node {node.name!r})")
    return value.astype(np.float32)


def _rescaled_target(original_in, original_target, new_in, node):
    """The new shape constant of an activation ``Reshape``: the batch copied (``0``), a
    flattening to 2-D as ``[0, -1]``, the dimensions it shares at the end with its input
    (the spatial ones) rescaled, the rest unchanged."""
    target = [int(d) for d in original_target]
    if original_target[0] != original_in[0]:
        raise NPUValueError(f"Reshape {node.name!r} changes the batch dimension")
    if len(target) == 2:
        return [0, -1]
    suffix = 0
    while suffix < min(len(original_in), len(target)) - 1 and \
            original_in[len(original_in) - 1 - suffix] == target[len(target) - 1 - suffix]:
        suffix += 1
    new = [0] + target[1:len(target) - suffix] + \
        [int(d) for d in new_in[len(new_in) - suffix:]]
    if int(np.prod(new[1:])) != int(np.prod(new_in[1:])):
        raise NPUValueError(f"cannot rescale Reshape {node.name!r} from {original_in} -> "
                            f"{original_target} to an input {new_in}")
    return new


def _resize(model, size):
    """Set the light model's input to ``size`` x ``size`` and adapt the shape-dependent nodes
    (in place); returns the name of the data input."""
    from onnx import numpy_helper
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    data = [v for v in graph.input if v.name not in inits]
    if len(data) != 1:
        raise NPUValueError(f"expected one data input, found {[v.name for v in data]}")
    original = _shapes(model)
    dims = data[0].type.tensor_type.shape.dim
    if len(dims) != 4:
        raise NPUValueError(f"expected an NCHW input, found {len(dims)} dimensions")
    dims[2].dim_value = size
    dims[3].dim_value = size
    for value in graph.output:
        value.type.tensor_type.ClearField("shape")
    del graph.value_info[:]
    weights = set(inits)
    for node in graph.node:
        if node.op_type == "ConstantOfShape":
            weights.add(node.output[0])
    for node in graph.node:
        if node.op_type == "Reshape" and node.input[0] not in weights:
            shapes = _shapes_until(model, node)
            target = inits[node.input[1]]
            new = _rescaled_target(original[node.input[0]], numpy_helper.to_array(target),
                                   shapes[node.input[0]], node)
            target.CopyFrom(numpy_helper.from_array(np.array(new, np.int64), target.name))
        elif node.op_type in ("AveragePool", "MaxPool"):
            before, after = original[node.input[0]], original[node.output[0]]
            if all(d == 1 for d in after[2:]) and any(d > 1 for d in before[2:]):
                # A global pooling with a fixed kernel: make it cover the new map.
                shapes = _shapes_until(model, node)
                _set_attr(node, "kernel_shape", [int(d) for d in shapes[node.input[0]][2:]])
                _set_attr(node, "strides", [1] * (len(before) - 2))
                _set_attr(node, "pads", [0] * (2 * (len(before) - 2)))
    # Dense layers fed by a flattened map: the weight's width follows the new map.
    shapes = _shapes_until(model, None)
    cos = {n.output[0]: n for n in graph.node if n.op_type == "ConstantOfShape"}
    for node in graph.node:
        if node.op_type != "Gemm" or node.input[1] not in cos:
            continue
        width = shapes[node.input[0]][1]
        shape_init = inits[cos[node.input[1]].input[0]]
        shape = numpy_helper.to_array(shape_init).copy()
        axis = 1 if _attr(node, "transB", 0) else 0
        if shape[axis] != width:
            shape[axis] = width
            shape_init.CopyFrom(numpy_helper.from_array(shape.astype(np.int64),
                                                        shape_init.name))
    shapes = _shapes(model)         # every shape consistent now, or raise
    for node in graph.node:
        if node.op_type not in ("Conv", "MaxPool", "AveragePool"):
            continue
        spatial = shapes[node.input[0]][2:]
        kernel = _attr(node, "kernel_shape") or shapes[node.input[1]][2:]
        pads = _attr(node, "pads") or [0] * (2 * len(spatial))
        for axis, (extent, window) in enumerate(zip(spatial, kernel)):
            if extent + pads[axis] + pads[axis + len(spatial)] < window:
                raise NPUValueError(f"{node.op_type} {node.name!r} would slide a "
                                    f"{'x'.join(map(str, kernel))} window over a "
                                    f"{'x'.join(map(str, spatial))} map")
    return data[0].name


def _shapes_until(model, node):
    """Shapes of the tensors computed before ``node`` (inference on the graph's prefix: the
    shape constants after it are not adapted to the new size yet); of the whole model when
    ``node`` is None."""
    from onnx import shape_inference
    if node is None:
        return _shapes(model)
    prefix = type(model)()
    prefix.CopyFrom(model)
    stop = [n.name for n in model.graph.node].index(node.name)
    del prefix.graph.node[stop:]
    del prefix.graph.output[:]
    inferred = shape_inference.infer_shapes(prefix, strict_mode=True)
    return {v.name: _dims(v) for v in
            list(inferred.graph.value_info) + list(inferred.graph.input)}


def _materialize(model, rng, data_name):
    """Replace every weight (a ConstantOfShape of its shape, or a float initializer) with
    seeded random values; drop the initializers from the graph's inputs."""
    from onnx import TensorProto, numpy_helper
    graph = model.graph
    consumers = _consumers(graph)
    inits = {i.name: i for i in graph.initializer}
    new_inits, keep_nodes = {}, []
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = numpy_helper.to_array(inits[node.input[0]])
            name = node.output[0]
            new_inits[name] = _draw(rng, _role(name, consumers, inits), shape)
        else:
            keep_nodes.append(node)
    for init in graph.initializer:
        if init.data_type == TensorProto.FLOAT and init.name not in new_inits \
                and init.name in consumers:         # (a few light copies keep unused ones)
            new_inits[init.name] = _draw(rng, _role(init.name, consumers, inits), init.dims)
    used = {name for node in keep_nodes for name in node.input}
    kept = [i for i in graph.initializer if i.data_type != TensorProto.FLOAT and i.name in used]
    del graph.node[:]
    graph.node.extend(keep_nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    graph.initializer.extend(numpy_helper.from_array(value, name)
                             for name, value in new_inits.items())
    data = [v for v in graph.input if v.name == data_name]
    del graph.input[:]
    graph.input.extend(data)


def _symbolic_batch(model):
    """The batch dimension of the input and outputs becomes ``N`` (every Reshape already
    copies it)."""
    graph = model.graph
    for value in list(graph.input) + list(graph.output):
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].Clear()
            dims[0].dim_param = "N"
    del graph.value_info[:]


def _add_logits(model):
    """Rename the final Softmax's input to :data:`LOGITS` and make it a graph output
    (after the model's own outputs); returns whether the model has a final Softmax."""
    from onnx import helper, TensorProto
    graph = model.graph
    producers = {o: n for n in graph.node for o in n.output}
    node = producers.get(graph.output[0].name)
    while node is not None and node.op_type in ("Reshape", "Flatten", "Identity"):
        node = producers.get(node.input[0])
    if node is None or node.op_type != "Softmax":
        return False
    old = node.input[0]
    for other in graph.node:
        other.input[:] = [LOGITS if name == old else name for name in other.input]
        other.output[:] = [LOGITS if name == old else name for name in other.output]
    graph.output.append(helper.make_tensor_value_info(LOGITS, TensorProto.FLOAT, None))
    return True


def _fill_output_shapes(model):
    """Output shapes from inference, batch ``N``."""
    shapes = _shapes(model)
    for value in model.graph.output:
        value.type.tensor_type.ClearField("shape")
        dims = shapes[value.name]
        value.type.tensor_type.shape.SetInParent()
        for d in dims:
            dim = value.type.tensor_type.shape.dim.add()
            if isinstance(d, int):
                dim.dim_value = d
            elif d:
                dim.dim_param = d
    del model.graph.value_info[:]


def _session(model_bytes, *, threads=1, optimize=True):
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(model_bytes, options,
                                        providers=["CPUExecutionProvider"])


def _calibrate_batchnorms(model, samples):
    """Set each BatchNormalization's mean and variance to its input's statistics on
    ``samples`` (per channel, over the batch and the map), layer after layer: one run of the
    model sets every BatchNormalization whose upstream ones are all set."""
    from onnx import helper, numpy_helper, TensorProto
    graph = model.graph
    bns = [n for n in graph.node if n.op_type == "BatchNormalization"]
    if not bns:
        return 0
    producers = {o: n for n in graph.node for o in n.output}
    upstream_memo = {}

    def upstream(tensor):
        """BatchNormalization nodes feeding ``tensor`` (iteratively: graphs are deep)."""
        if tensor in upstream_memo:
            return upstream_memo[tensor]
        stack = [tensor]
        while stack:
            name = stack[-1]
            node = producers.get(name)
            if node is None:
                upstream_memo[name] = frozenset()
                stack.pop()
                continue
            missing = [i for i in node.input if i and i not in upstream_memo]
            if missing:
                stack.extend(missing)
                continue
            found = set()
            for i in node.input:
                if i:
                    found |= upstream_memo[i]
            if node.op_type == "BatchNormalization":
                found.add(node.name or node.output[0])
            upstream_memo[name] = frozenset(found)
            stack.pop()
        return upstream_memo[tensor]

    keys = [bn.name or bn.output[0] for bn in bns]
    needs = {key: upstream(bn.input[0]) for key, bn in zip(keys, bns)}
    probe = type(model)()
    probe.CopyFrom(model)
    stats = {}                  # the mean and variance initializers, fed at every run
    inits = {i.name: i for i in probe.graph.initializer}
    for bn in bns:
        for name in bn.input[3:5]:
            stats[name] = numpy_helper.to_array(inits[name]).copy()
            probe.graph.input.append(helper.make_tensor_value_info(
                name, TensorProto.FLOAT, list(inits[name].dims)))
    del probe.graph.output[:]
    for bn in bns:
        probe.graph.output.append(helper.make_tensor_value_info(bn.input[0],
                                                                TensorProto.FLOAT, None))
    session = _session(probe.SerializeToString(), optimize=False)
    data_name = session.get_inputs()[0].name
    done, rounds = set(), 0
    while len(done) < len(bns):
        outputs = session.run(None, {data_name: samples, **stats})
        rounds += 1
        ready = [i for i, key in enumerate(keys) if key not in done and needs[key] <= done]
        if not ready:
            raise NPUValueError("BatchNormalization statistics: a cycle in the graph")
        for i in ready:
            x = outputs[i].astype(np.float64)
            axes = (0,) + tuple(range(2, x.ndim))
            # float16 precision: the statistics do not depend on the CPU's last bits.
            mean = x.mean(axis=axes).astype(np.float16).astype(np.float32)
            var = np.maximum(x.var(axis=axes), 1e-2).astype(np.float16).astype(np.float32)
            stats[bns[i].input[3]], stats[bns[i].input[4]] = mean, var
        done |= {keys[i] for i in ready}
    for init in graph.initializer:
        if init.name in stats:
            init.CopyFrom(numpy_helper.from_array(stats[init.name].astype(np.float32),
                                                  init.name))
    return rounds


def _seeds(seed):
    """Independent generators for the weights, the BatchNormalization samples, the
    calibration samples and the test inputs of ``seed``."""
    return [np.random.default_rng([seed, stream]) for stream in range(4)]


def sample_inputs(shape, batch, seed=0, *, stream=3):
    """Seeded float32 NCHW samples ``N(0, 1)`` of ``shape`` (without the batch); stream 3
    of ``seed`` is the test inputs', independent of the weights and the calibration."""
    rng = np.random.default_rng([seed, stream])
    return rng.standard_normal((batch, *shape)).astype(np.float32)


def build_float(name, *, seed=0, size=None):
    """The float model of network ``name`` at ``size`` x ``size`` (:data:`SIZES` by default)
    with weights drawn from ``seed``.

    Returns
    -------
    (onnx.ModelProto, tuple)
        The model (opset 13, batch ``N``, outputs: the network's own, then :data:`LOGITS`
        when it ends in a Softmax) and its input's shape without the batch.
    """
    import onnx
    from onnx import version_converter
    path = light_path(name)
    size = SIZES[name] if size is None else size
    if not isinstance(size, int) or isinstance(size, bool) or size < 8:
        raise NPUValueError(f"size must be an integer of at least 8, not {size!r}")
    model = onnx.load(path)
    for index, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{index}"
    try:
        data = _resize(model, size)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError,
            NPUValueError) as error:
        first = str(error).strip().splitlines()[0]
        raise NPUValueError(f"{name} does not fit {size}x{size}: {first}") from None
    weights_rng, bn_rng, _, _ = _seeds(seed)
    _materialize(model, weights_rng, data)
    model.ir_version = _IR_VERSION
    model = version_converter.convert_version(model, _OPSET)
    model.ir_version = _IR_VERSION
    model.producer_name = "npu sw.onnx.zoo"
    model.producer_version = ""
    model.graph.name = f"{name}_{size}"
    _symbolic_batch(model)
    _add_logits(model)
    _fill_output_shapes(model)
    onnx.checker.check_model(model, full_check=True)
    shape = tuple(int(d) for d in _dims(next(v for v in model.graph.input
                                               if v.name == data))[1:])
    _calibrate_batchnorms(model, bn_rng.standard_normal((BN_SAMPLES, *shape))
                          .astype(np.float32))
    return model, shape


# -- quantization ------------------------------------------------------------------------------

def _check_choice(value, choices, what):
    if value not in choices:
        raise NPUValueError(f"{what} must be one of {', '.join(choices)}, not {value!r}")


def _calibration_reader(input_name, samples, batch=8):
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{input_name: samples[i:i + batch]}
                                 for i in range(0, len(samples), batch)])

        def get_next(self):
            return next(self.batches, None)
    return Reader()


@contextlib.contextmanager
def quiet():
    """quantize_static's advice goes to the root logger; keep it out of the tests' output."""
    import logging
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def preprocess(float_model, path):
    """onnxruntime's ``quant_pre_process`` with its defaults (symbolic shape inference, which
    needs sympy; the basic graph optimizations: BatchNormalization folded into the Conv
    before it, Dropout removed, constants folded; onnx's shape inference) of the model file
    ``float_model`` into ``path``."""
    from onnxruntime.quantization.shape_inference import quant_pre_process
    with quiet():
        quant_pre_process(os.fspath(float_model), os.fspath(path))
    return path


def quantize(source, path, input_name, calibration, *, fmt="qdq", activation="int8"):
    """onnxruntime's ``quantize_static`` of the model at ``source`` into ``path``: per
    channel, ``reduce_range=True``, int8 weights, ``fmt`` and ``activation`` as given,
    MinMax calibration on ``calibration`` (float32, batch first)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    _check_choice(fmt, FORMATS, "fmt")
    _check_choice(activation, ACTIVATIONS, "activation")
    types = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
    with quiet():
        quantize_static(os.fspath(source), os.fspath(path),
                        _calibration_reader(input_name, calibration),
                        quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
                        per_channel=True, reduce_range=True,
                        activation_type=types[activation], weight_type=QuantType.QInt8)
    return path


def build_quantized(name, path, *, fmt="qdq", activation="int8", seed=0, size=None,
                    float_model=None):
    """Build network ``name`` (:func:`build_float`), pre-process and quantize it into the
    file ``path``; returns ``(path, input shape without the batch)``. ``float_model``, a
    ``(ModelProto, shape)`` from :func:`build_float` with the same arguments, saves
    building it again."""
    import tempfile
    import onnx
    _check_choice(fmt, FORMATS, "fmt")
    _check_choice(activation, ACTIVATIONS, "activation")
    model, shape = float_model or build_float(name, seed=seed, size=size)
    calibration = _seeds(seed)[2].standard_normal((CALIBRATION_SAMPLES, *shape)) \
        .astype(np.float32)
    input_name = model.graph.input[0].name
    with tempfile.TemporaryDirectory(prefix="npu-zoo-") as folder:
        source = Path(folder) / "float.onnx"
        onnx.save(model, source)
        prepared = preprocess(source, Path(folder) / "prepared.onnx")
        quantize(prepared, path, input_name, calibration, fmt=fmt, activation=activation)
    return path, shape


# -- the cache ---------------------------------------------------------------------------------

def cache_root():
    """``build/onnx-zoo`` of the project (``$NPU_BUILD_DIR/onnx-zoo`` when set)."""
    project = Path(__file__).resolve().parent.parent.parent
    return Path(os.environ.get("NPU_BUILD_DIR", project / "build")) / "onnx-zoo"


def _fingerprint():
    """What, besides the arguments, determines a model: this module's source and the
    versions of onnx, onnxruntime, numpy and sympy (quant_pre_process's shape inference)."""
    import onnx
    import onnxruntime
    digest = hashlib.sha256(Path(__file__).read_bytes())
    try:
        from importlib.metadata import version
        sympy = version("sympy")
    except Exception:       # quant_pre_process will say it is missing
        sympy = None
    digest.update(f"onnx {onnx.__version__} onnxruntime {onnxruntime.__version__} "
                  f"numpy {np.__version__} sympy {sympy}".encode())
    return digest.hexdigest()[:12]


@dataclass
class ZooModel:
    """A cached model of the zoo (:func:`zoo_model`)."""
    name: str
    size: int
    seed: int
    fmt: str                    # "float" for the float model
    activation: str | None
    path: Path
    input_name: str
    input_shape: tuple          # without the batch
    outputs: list               # names, in the graph's order
    info: dict = field(default_factory=dict)


@contextlib.contextmanager
def _locked(folder):
    import fcntl
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _ops(path):
    import onnx
    model = onnx.load(os.fspath(path), load_external_data=False)
    return dict(sorted(Counter(n.op_type for n in model.graph.node).items()))


def _timed_run(path, input_name, shape):
    """Seconds to create onnxruntime's session (default options) and to run one sample."""
    import onnxruntime
    started = time.perf_counter()
    session = onnxruntime.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    created = time.perf_counter()
    session.run(None, {input_name: sample_inputs(shape, 1)})
    return round(created - started, 3), round(time.perf_counter() - created, 3)


def zoo_model(name, *, fmt="qdq", activation="int8", seed=0, size=None, root=None):
    """The model of network ``name`` (``fmt="float"`` for the float one, else quantized as
    :func:`build_quantized` does), built on first use and cached under
    :func:`cache_root` ``/<name>-<size>-s<seed>-<fingerprint>/<fmt>-<activation>.onnx``
    with an ``.json`` of what the build measured; several processes may ask at once (a
    lock per folder)."""
    import onnx
    if name not in _LIGHT:
        raise NPUValueError(f"no network {name!r} in the zoo; networks: {', '.join(ZOO)}")
    size = SIZES[name] if size is None else size
    if fmt != "float":
        _check_choice(fmt, FORMATS, "fmt")
        _check_choice(activation, ACTIVATIONS, "activation")
    folder = Path(root or cache_root()) / f"{name}-{size}-s{seed}-{_fingerprint()}"
    stem = "float" if fmt == "float" else f"{fmt}-{activation}"
    path, meta = folder / f"{stem}.onnx", folder / f"{stem}.json"
    with _locked(folder):
        if not (path.is_file() and meta.is_file()):
            float_path, float_meta = folder / "float.onnx", folder / "float.json"
            if not (float_path.is_file() and float_meta.is_file()):
                started = time.perf_counter()
                model, shape = build_float(name, seed=seed, size=size)
                seconds = time.perf_counter() - started
                _atomic_save(float_path, model.SerializeToString())
                per_node = macs(model)
                info = {"name": name, "size": size, "seed": seed, "fmt": "float",
                        "activation": None, "input_name": model.graph.input[0].name,
                        "input_shape": list(shape),
                        "outputs": [o.name for o in model.graph.output],
                        "macs": int(sum(per_node.values())),
                        "parameters": int(sum(int(np.prod(i.dims))
                                              for i in model.graph.initializer)),
                        "build_seconds": round(seconds, 3), "ops": _ops(float_path)}
                info["ort_session_seconds"], info["ort_run_seconds"] = _timed_run(
                    float_path, info["input_name"], shape)
                _atomic_save(float_meta, json.dumps(info, indent=1).encode())
            float_info = json.loads(float_meta.read_text())
            if fmt != "float":
                started = time.perf_counter()
                model = onnx.load(os.fspath(float_path))
                shape = tuple(float_info["input_shape"])
                temporary = path.with_suffix(f".tmp{os.getpid()}")
                try:
                    build_quantized(name, temporary, fmt=fmt, activation=activation,
                                    seed=seed, size=size, float_model=(model, shape))
                    os.replace(temporary, path)
                finally:
                    temporary.unlink(missing_ok=True)
                info = dict(float_info, fmt=fmt, activation=activation,
                            build_seconds=round(time.perf_counter() - started, 3),
                            float_build_seconds=float_info["build_seconds"],
                            ops=_ops(path), file_bytes=path.stat().st_size)
                info["outputs"] = [o.name for o in onnx.load(
                    os.fspath(path), load_external_data=False).graph.output]
                info["ort_session_seconds"], info["ort_run_seconds"] = _timed_run(
                    path, info["input_name"], shape)
                _atomic_save(meta, json.dumps(info, indent=1).encode())
    info = json.loads(meta.read_text())
    return ZooModel(name=name, size=size, seed=seed, fmt=fmt,
                    activation=None if fmt == "float" else activation, path=path,
                    input_name=info["input_name"], input_shape=tuple(info["input_shape"]),
                    outputs=list(info["outputs"]), info=info)


def _atomic_save(path, data):
    temporary = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    temporary.write_bytes(data)
    os.replace(temporary, path)


# -- python -m sw.onnx.zoo ---------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m sw.onnx.zoo",
        description="Write the public model set: the onnx package's light model-zoo networks "
                    "with seeded random weights at a reduced resolution, float and quantized "
                    "by onnxruntime (per channel, reduce_range, int8 weights).")
    parser.add_argument("--out", required=True, help="folder to write the models into")
    parser.add_argument("--networks", nargs="+", default=list(ZOO), choices=ZOO,
                        metavar="NAME", help=f"default: all ({', '.join(ZOO)})")
    parser.add_argument("--formats", nargs="+", default=list(FORMATS),
                        choices=("float",) + FORMATS)
    parser.add_argument("--activations", nargs="+", default=list(ACTIVATIONS),
                        choices=ACTIVATIONS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", type=int, default=None,
                        help="input resolution (square); default: each network's own "
                             "(" + ", ".join(f"{k} {v}" for k, v in SIZES.items()) + ")")
    args = parser.parse_args(argv)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        parser.error(f"cannot create {out}: {error.strerror}")
    manifest = []
    for name in args.networks:
        variants = [("float", None)] if "float" in args.formats else []
        variants += [(fmt, act) for fmt in args.formats if fmt != "float"
                     for act in args.activations]
        for fmt, act in variants:
            try:
                model = zoo_model(name, fmt=fmt, activation=act or "int8", seed=args.seed,
                                  size=args.size)
            except NPUValueError as error:
                print(f"python -m sw.onnx.zoo: error: {error}", file=sys.stderr)
                return 2
            target = out / f"{name}_{model.size}_{model.path.stem}.onnx"
            target.write_bytes(model.path.read_bytes())
            manifest.append(dict(model.info, file=target.name))
            print(f"{target}  {model.info['macs']:,} MACs  input "
                  f"{model.input_name} {'x'.join(map(str, model.input_shape))}  outputs "
                  f"{', '.join(model.outputs)}")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
