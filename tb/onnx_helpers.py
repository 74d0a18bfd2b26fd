"""Small ONNX graphs for the tests: one node or a few, built with ``onnx.helper`` and run
with onnxruntime (CPU execution provider, default session options)."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


ELEM_TYPE = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8,
             np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32}


def constant(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def model(nodes, inputs, outputs, initializers, *, opset=13, microsoft=False):
    """A model from nodes; ``inputs`` and ``outputs`` are ``[(name, dtype, shape)]``."""
    def info(name, dtype, shape):
        return helper.make_tensor_value_info(name, ELEM_TYPE[np.dtype(dtype)], shape)
    graph = helper.make_graph(nodes, "test", [info(*i) for i in inputs],
                              [info(*o) for o in outputs], initializers)
    opsets = [helper.make_opsetid("", opset)]
    if microsoft:
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    result = helper.make_model(graph, opset_imports=opsets)
    result.ir_version = 8
    if all(shape is not None for _, _, shape in list(inputs) + list(outputs)):
        onnx.checker.check_model(result)
    return result


def run_ort(onnx_model, feeds):
    import onnxruntime
    session = onnxruntime.InferenceSession(onnx_model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return session.run(None, feeds)
