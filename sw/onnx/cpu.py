"""The host's side of an ONNX model: one numpy kernel per operator, onnxruntime's arithmetic
(:mod:`sw.onnx.kernels`)."""

import numpy as np

from ..errors import NPUValueError
from . import kernels as K


__all__ = ["run_node"]


def _optional(values, node, index):
    if index < len(node.inputs) and node.inputs[index]:
        return values[node.inputs[index]]
    return None


def _reshape(x, shape, allowzero=0):
    shape = [int(v) for v in np.asarray(shape).reshape(-1)]
    if not allowzero:
        shape = [x.shape[i] if v == 0 else v for i, v in enumerate(shape)]
    return x.reshape(shape)


def _flatten(x, axis=1):
    axis = axis % x.ndim if x.ndim else 0
    return x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)


def _axes(node, values, x):
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]]
    value = _optional(values, node, 1)
    return None if value is None else [int(a) for a in np.asarray(value).reshape(-1)]


def _squeeze(node, values, x):
    axes = _axes(node, values, x)
    return np.squeeze(x, axis=None if axes is None else tuple(a % x.ndim for a in axes))


def _unsqueeze(node, values, x):
    axes = sorted(a % (x.ndim + len(_axes(node, values, x))) for a in _axes(node, values, x))
    for axis in axes:
        x = np.expand_dims(x, axis)
    return x


def _zero_point(zero_point, like):
    """An optional zero point: absent means 0 of the tensor's dtype."""
    return np.zeros((), np.asarray(like).dtype) if zero_point is None else zero_point


def run_node(node, values):
    """The outputs (a list) of ``node`` with its inputs taken from ``values`` (a dict of
    tensor name -> array, constants included)."""
    op, a = node.op_type, node.attrs
    x = _optional(values, node, 0)
    v = [_optional(values, node, i) for i in range(len(node.inputs))]
    if op == "QuantizeLinear":
        zp = v[2] if len(v) > 2 and v[2] is not None else np.uint8(0)
        return [K.quantize_linear(x, v[1], zp, np.asarray(zp).dtype, a.get("axis", 1))]
    if op == "DequantizeLinear":
        zp = v[2] if len(v) > 2 and v[2] is not None else 0
        return [K.dequantize_linear(x, v[1], zp, a.get("axis", 1))]
    if op == "QLinearConv":
        return [K.qlinear_conv(*v[:8], v[8] if len(v) > 8 else None, a, name=node.name)]
    if op == "ConvInteger":
        return [K.conv_integer(x, v[1], *(v[2:4] + [0, 0])[:2], attrs=a, name=node.name)]
    if op == "QLinearMatMul":
        return [K.qlinear_matmul(*v[:8])]
    if op == "MatMulInteger":
        zps = [z if z is not None else 0 for z in (v[2:4] + [None, None])[:2]]
        return [K.matmul_integer(x, v[1], *zps)]
    if op == "QGemm":
        extra = (v + [None] * 9)[6:9]
        return [K.qgemm(*v[:6], c=extra[0], y_scale=extra[1], y_zp=extra[2],
                        trans_a=a.get("transA", 0), trans_b=a.get("transB", 0),
                        alpha=a.get("alpha", 1.0))]
    if op == "QLinearAdd":
        zc = v[7] if len(v) > 7 and v[7] is not None else np.zeros((), x.dtype)
        return [K.qlinear_add(*v[:7], zc)]
    if op == "QLinearConcat":
        tensors = [(v[i], v[i + 1], _zero_point(v[i + 2], v[i])) for i in range(2, len(v), 3)]
        return [K.qlinear_concat(v[0], _zero_point(v[1], tensors[0][0]), tensors, a["axis"],
                                 name=node.name)]
    if op == "QLinearAveragePool":
        return [K.qlinear_average_pool(x, v[1], _zero_point(v[2], x), v[3],
                                       _zero_point(_optional(values, node, 4), x), a,
                                       name=node.name)]
    if op == "QLinearSoftmax":
        opset = a["opset"]
        return [K.qlinear_softmax(x, v[1], v[2], v[3], _zero_point(_optional(values, node, 4), x),
                                  a.get("axis", -1 if opset >= 13 else 1), opset,
                                  name=node.name)]
    if op == "QLinearGlobalAveragePool":
        return [K.qlinear_global_average_pool(*v[:5], channels_last=a.get("channels_last", 0))]
    if op == "MaxPool":
        if len(node.outputs) > 1 and node.outputs[1]:
            raise NPUValueError(f"MaxPool (node {node.name!r}): the Indices output is not "
                                f"supported")
        return [K.max_pool(x, a)]
    if op == "Flatten":
        return [_flatten(x, a.get("axis", 1))]
    if op == "Reshape":
        return [_reshape(x, v[1], a.get("allowzero", 0))]
    if op == "Transpose":
        return [np.transpose(x, a.get("perm"))]
    if op == "Identity":
        return [x]
    if op == "Relu":
        return [np.maximum(x, np.zeros((), x.dtype))]
    if op == "Add":
        return [(x + v[1]).astype(np.result_type(x, v[1]))]
    if op == "Concat":
        return [np.concatenate(v, axis=a["axis"])]
    if op == "Squeeze":
        return [_squeeze(node, values, x)]
    if op == "Unsqueeze":
        return [_unsqueeze(node, values, x)]
    raise NPUValueError(f"unsupported operator {op} (node {node.name!r})")
