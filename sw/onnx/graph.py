"""Reading a quantized ONNX model into the graph the NPU's runtime executes.

A model in either of the formats ``onnxruntime.quantization.quantize_static`` writes (QDQ,
its default, or QOperator) is first given to onnxruntime's own graph optimizer at the level
``ORT_ENABLE_EXTENDED``: that is where onnxruntime fuses ``DequantizeLinear -> Conv ->
QuantizeLinear`` into ``QLinearConv`` (and likewise MatMul, Gemm, Add, ...) and converts int8
activations to uint8 where its x86 kernels want them. Importing the graph onnxruntime will
actually run, instead of re-deriving its fusion rules, is what makes the NPU's result equal
to onnxruntime's bit for bit: every tensor the NPU and the host compute is one that
onnxruntime also computes, with the same quantization. (The NCHWc and NHWC layout rewrites
of the next level, ``ORT_ENABLE_ALL``, only move the same values.)

Every operator onnxruntime runs is accepted: the runtime (:mod:`sw.onnx.runtime`) gives the
NPU the nodes it can run and runs the rest, in partitions, on onnxruntime itself, as an
execution provider would. Each :class:`Node` keeps its ``NodeProto`` for that.
"""

import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import NPUTypeError, NPUValueError, first_line


__all__ = ["Node", "Graph", "load_model", "import_model", "QUANTIZED_OPS"]


#: Operators that mark a model as quantized.
QUANTIZED_OPS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "MatMulInteger",
    "ConvInteger", "QGemm", "QLinearAdd", "QLinearMul", "QLinearConcat",
    "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearSoftmax", "DynamicQuantizeLinear"})


@dataclass
class Node:
    """One operator: ``inputs`` and ``outputs`` are tensor names ("" for an absent
    optional input)."""
    name: str
    op_type: str
    inputs: list
    outputs: list
    attrs: dict = field(default_factory=dict)
    domain: str = ""
    proto: object = field(default=None, repr=False, compare=False)    # onnx.NodeProto


@dataclass
class Graph:
    """A model as the runtime sees it.

    Attributes
    ----------
    nodes : list of Node
        In an order where every input is computed before it is used.
    constants : dict
        ``{tensor name: numpy array}`` of the initializers and ``Constant`` nodes.
    inputs, outputs : list
        ``[(name, numpy dtype, shape)]``; a symbolic dimension is a string.
    path : str
        Where the model came from.
    opsets : dict
        ``{domain: version}`` of the model (onnxruntime's subgraphs are built with them).
    ir_version : int
    """
    nodes: list
    constants: dict
    inputs: list
    outputs: list
    path: str = ""
    opsets: dict = field(default_factory=dict)
    ir_version: int = 8

    def consumers(self, tensor):
        return [node for node in self.nodes if tensor in node.inputs]

    def producer(self, tensor):
        for node in self.nodes:
            if tensor in node.outputs:
                return node
        return None


def _onnx():
    import onnx
    return onnx


def load_model(path):
    """``onnx.ModelProto`` of ``path``, checked; a clear error for a missing, unreadable or
    malformed file."""
    onnx = _onnx()
    if not isinstance(path, (str, os.PathLike)):
        raise NPUTypeError(f"the model must be a file path, not {type(path).__name__}")
    if not os.path.isfile(path):
        raise NPUValueError(f"{path}: no such model file")
    try:
        model = onnx.load(os.fspath(path))
    except Exception as error:      # protobuf's DecodeError and friends
        raise NPUValueError(f"{path}: not a readable ONNX model "
                            f"({type(error).__name__}: {first_line(error)})") from None
    try:
        onnx.checker.check_model(model)
    except Exception as error:
        raise NPUValueError(f"{path}: malformed ONNX model: {first_line(error)}") from None
    return model




def _optimize(model, path):
    """The graph onnxruntime runs, at ``ORT_ENABLE_EXTENDED`` (see the module docstring)."""
    import tempfile
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory() as folder:
        target = os.path.join(folder, "optimized.onnx")
        options.optimized_model_filepath = target
        try:
            onnxruntime.InferenceSession(model.SerializeToString(), options,
                                         providers=["CPUExecutionProvider"])
        except Exception as error:
            raise NPUValueError(f"{path}: onnxruntime cannot load the model: "
                                f"{first_line(error)}") from None
        return _onnx().load(target)


def _value_info(value):
    from onnx.helper import tensor_dtype_to_np_dtype
    tensor = value.type.tensor_type
    try:
        dtype = tensor_dtype_to_np_dtype(tensor.elem_type) if tensor.elem_type else None
    except KeyError:
        dtype = None
    shape = tuple(dim.dim_param or (dim.dim_value if dim.HasField("dim_value") else "?")
                  for dim in tensor.shape.dim)
    return value.name, (np.dtype(dtype) if dtype else None), shape


def _attributes(node):
    from onnx import helper
    return {attr.name: helper.get_attribute_value(attr) for attr in node.attribute}


def import_model(path, *, model=None):
    """The runtime's :class:`Graph` of the quantized model at ``path``.

    Raises
    ------
    NPUValueError
        For a file that is not a valid ONNX model, a model with no quantization (quantize it
        first, or give ``--calibrate``), or a model onnxruntime itself cannot load (the
        message gives onnxruntime's reason, which names the operator and its node).
    """
    from onnx import numpy_helper
    model = load_model(path) if model is None else model
    ops = {node.op_type for node in model.graph.node}
    if not ops & QUANTIZED_OPS:
        raise NPUValueError(f"{path}: the model has no quantization (no QuantizeLinear, "
                            f"QLinear* or *Integer operator): quantize it with "
                            f"onnxruntime.quantization.quantize_static, or give --calibrate "
                            f"DATA.npy")
    optimized = _optimize(model, path)
    constants = {init.name: numpy_helper.to_array(init) for init in optimized.graph.initializer}
    nodes = []
    for index, proto in enumerate(optimized.graph.node):
        attrs = _attributes(proto)
        if proto.op_type == "Constant" and proto.domain in ("", "ai.onnx"):
            constants[proto.output[0]] = numpy_helper.to_array(attrs["value"])
            continue
        name = proto.name or f"{proto.op_type}_{index}"
        nodes.append(Node(name, proto.op_type, list(proto.input), list(proto.output), attrs,
                          proto.domain, proto))
    initializers = set(constants)
    inputs = [_value_info(v) for v in optimized.graph.input if v.name not in initializers]
    outputs = [_value_info(v) for v in optimized.graph.output]
    return Graph(nodes=nodes, constants=constants, inputs=inputs, outputs=outputs,
                 path=os.fspath(path),
                 opsets={op.domain: op.version for op in optimized.opset_import},
                 ir_version=optimized.ir_version)
