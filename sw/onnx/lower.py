"""An imported ONNX graph as the graph core's :class:`sw.ir.graph.Graph`: its NPU operators
lowered onto :mod:`sw.nn`'s quantized operators, the others with the reason onnxruntime runs
them on the host (the core places, groups and runs them: :mod:`sw.ir`).

The array computes INT8 x INT8 products summed into INT32, then requantizes them on the way
out. ``QLinearConv``, ``QLinearMatMul`` and ``QGemm`` are exactly that when their weights are
constants with a zero point of 0; each becomes a :class:`~sw.nn.quantize.QConv2D` or
:class:`~sw.nn.quantize.QDense` in NHWC with:

* activations in INT8: a uint8 tensor ``q`` with zero point ``z`` is the int8 tensor
  ``q - 128`` with zero point ``z - 128`` (the same real values, the same arithmetic);
* the bias and the input zero point folded into the accumulator's start value
  (:attr:`~sw.nn.quantize.QConv2D.acc_bias`), the border padded with the input zero point;
* the float32 requantization scale of onnxruntime, ``x_scale * w_scale / y_scale``
  (:func:`sw.onnx.kernels.requant_scale`), used by the requantizer's float32 mode.

A grouped convolution (``group = g``; depthwise is ``g == channels``) becomes a convolution
whose weight is block-diagonal: the input channels of group ``i`` meet its output channels
only (:func:`grouped_weights`; docs/onnx.md gives the mapping efficiency, ``1/g``). A
``Flatten`` between a convolution and a dense layer on the NPU is a free view (a ``"CHW"``
view: the core permutes the dense weight rows from channel-major to NHWC order).
"""

import numpy as np

from ..nn.quantize import QConv2D, QDense, QParams
from . import kernels as K


__all__ = ["to_graph", "lower_node", "node_macs", "grouped_weights", "HOST_REASON"]


def _zero_point8(value):
    value = np.asarray(value)
    return int(value.reshape(-1)[0]) - (128 if value.dtype == np.uint8 else 0)


def _const(graph, node, index):
    if index >= len(node.inputs) or not node.inputs[index]:
        return None
    return graph.constants.get(node.inputs[index])


#: Where each GEMM-like operator's weight (a convolution) or second operand is.
_CONVS = {"QLinearConv": 3, "ConvInteger": 1, "Conv": 1, "ConvTranspose": 1}
_MATMULS = ("QLinearMatMul", "MatMulInteger", "QGemm", "MatMul", "Gemm")


def node_macs(node, shapes, graph):
    """Multiply-accumulates of a GEMM-like node, quantized or float, from the shapes seen
    in a run (0 for the others)."""
    out = shapes.get(node.outputs[0]) if node.outputs else None
    if out is None:
        return 0
    if node.op_type in _CONVS:
        index = _CONVS[node.op_type]
        w = shapes.get(node.inputs[index]) if index < len(node.inputs) else None
        if w is None:
            return 0
        if node.op_type == "ConvTranspose":     # each input pixel meets every kernel tap
            x = shapes.get(node.inputs[0])
            return 0 if x is None else int(np.prod(x)) * int(np.prod(w[1:]))
        return int(np.prod(out)) * int(np.prod(w[1:]))
    if node.op_type in _MATMULS:
        a = shapes.get(node.inputs[0])
        if a is None:
            return 0
        return int(np.prod(out)) * int(a[0] if node.attrs.get("transA") else a[-1])
    return 0


def _conv_reason(graph, node, shapes):
    """``None`` when the convolution maps onto the array, else why not."""
    a = node.attrs
    w = _const(graph, node, 3)
    needed = [1, 2, 3, 4, 5, 6, 7]
    if w is None or any(_const(graph, node, i) is None for i in needed):
        return "its weights, scales or zero points are not constants"
    if _const(graph, node, 8) is None and len(node.inputs) > 8 and node.inputs[8]:
        return "its bias is not a constant"
    if np.any(_const(graph, node, 5) != 0):
        return "its weight zero point is not 0 (the array has no weight offset)"
    if w.ndim != 4:
        return f"it is a {w.ndim - 2}-D convolution (the NPU runs 2-D ones)"
    if any(d != 1 for d in a.get("dilations", [1, 1])):
        return "it is dilated"
    pads = list(a.get("pads", [0, 0, 0, 0]))
    if len(set(pads)) != 1:
        return f"its padding {pads} is not the same on every side"
    strides = list(a.get("strides", [1, 1]))
    if strides[0] != strides[1]:
        return f"its strides {strides} differ between height and width"
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return "it uses auto_pad"
    group = int(a.get("group", 1))
    channels = shapes.get(node.inputs[0], (None, None))[1]
    if channels != w.shape[1] * group or w.shape[0] % group:
        return (f"its weight {tuple(w.shape)} does not match {channels} input channels in "
                f"{group} groups")
    return None


def _gemm_reason(graph, node, shapes):
    a = node.attrs
    if node.op_type == "QGemm":
        if a.get("transA", 0):
            return "its A operand is transposed"
        if len(node.inputs) < 8 or not node.inputs[7]:
            return "its output is float (no y_scale): the requantizer makes 8-bit outputs"
        constant = [1, 2, 3, 4, 5, 7, 8]
    else:
        constant = [1, 2, 3, 4, 5, 6, 7]
    if any(_const(graph, node, i) is None for i in constant if i < len(node.inputs)):
        return "its weights, scales or zero points are not constants"
    if node.op_type == "QGemm" and len(node.inputs) > 6 and node.inputs[6] \
            and _const(graph, node, 6) is None:
        return "its C operand is not a constant"
    b = _const(graph, node, 3)
    if b.ndim != 2:
        return "its weight is not a matrix"
    if np.any(_const(graph, node, 5) != 0):
        return "its weight zero point is not 0 (the array has no weight offset)"
    shape = shapes.get(node.inputs[0])
    if shape is None or len(shape) != 2:
        return "its input is not a matrix"
    return None


_CPU_REASONS = {
    "QuantizeLinear": "float to 8-bit conversion of the model's input: the array has no float "
                      "datapath",
    "DequantizeLinear": "8-bit to float conversion of an output: no float datapath",
    "QLinearAdd": "an elementwise sum of two tensors: the array only reduces products",
    "QLinearGlobalAveragePool": "a mean over each channel's pixels: a reduction the array "
                                "could do only with a weight per pixel; cheap on the host",
    "QLinearConcat": "joins tensors, requantizing each through a 256-entry table: no "
                     "multiply-accumulate",
    "QLinearAveragePool": "a float32 mean over windows, as onnxruntime computes it: no "
                          "float datapath on the array",
    "QLinearSoftmax": "exponentials from a float table and a float division: no float "
                      "datapath on the array",
    "MaxPool": "a max over windows: no multiply-accumulate the array can stream",
    "Flatten": "a reshape: moves no values",
    "Reshape": "a reshape: moves no values",
    "Transpose": "a layout change: moves values, computes nothing",
    "Squeeze": "a reshape: moves no values",
    "Unsqueeze": "a reshape: moves no values",
    "Identity": "copies its input",
    "Concat": "joins tensors: moves values, computes nothing",
    "Relu": "a float elementwise max: no float datapath",
    "Add": "a float elementwise sum: no float datapath",
    "MatMulInteger": "its INT32 output is not requantized: the output path always stores "
                     "through the requantizer in this runtime",
    "ConvInteger": "its INT32 output is not requantized: the output path always stores "
                   "through the requantizer in this runtime",
}
for _op in ("Conv", "MatMul", "Gemm", "ConvTranspose"):
    _CPU_REASONS[_op] = ("onnxruntime left it in float32, not fused into a quantized operator: "
                         "no float datapath on the array")

#: Why a node without a lowering runs on the host.
HOST_REASON = "no lowering to the array: onnxruntime runs it"


def _note(node, weight):
    """What the placer says after its reason for a lowered convolution."""
    group = int(node.attrs.get("group", 1))
    if group == 1:
        return ""
    kind = ("depthwise" if group == weight.shape[0] and weight.shape[1] == 1
            else f"grouped (group = {group})")
    return (f"a {kind} {weight.shape[2]}x{weight.shape[3]} convolution, lowered to a "
            f"block-diagonal weight (1/{group} of the array's products are the group's)")


def _is_flatten_view(node, shapes):
    if node.op_type == "Flatten":
        return node.attrs.get("axis", 1) == 1
    if node.op_type == "Reshape":
        src, dst = shapes.get(node.inputs[0]), shapes.get(node.outputs[0])
        return src is not None and dst is not None and len(dst) == 2 and dst[0] == src[0]
    return False


def to_graph(graph, shapes):
    """The :class:`sw.ir.graph.Graph` of an imported ONNX graph: ``QLinearConv``,
    ``QLinearMatMul`` and ``QGemm`` nodes lowered where they map onto the array, every
    other node with the reason the host runs it (in onnxruntime); ``shapes`` maps tensor
    names to the shapes of a run (:func:`sw.onnx.runtime.infer_shapes`)."""
    from ..ir.graph import Graph, Op
    ops = []
    for node in graph.nodes:
        op = Op(node.name, node.op_type, tuple(node.inputs), tuple(node.outputs),
                macs=node_macs(node, shapes, graph), sources=(node.name,), payload=node,
                reason=_CPU_REASONS.get(node.op_type, HOST_REASON))
        why_not = None
        if node.op_type == "QLinearConv":
            why_not = _conv_reason(graph, node, shapes)
        elif node.op_type in ("QLinearMatMul", "QGemm"):
            why_not = _gemm_reason(graph, node, shapes)
        elif _is_flatten_view(node, shapes):
            op.view = "CHW"
        if node.op_type in ("QLinearConv", "QLinearMatMul", "QGemm"):
            if why_not is None:
                op.lowered = lower_node(graph, node, shapes)
                y_zp = _const(graph, node, 8 if node.op_type == "QGemm" else 7)
                # An absent output zero point means uint8 (ONNX's default for QLinear*).
                op.dtype = np.uint8 if y_zp is None else np.asarray(y_zp).dtype
                if node.op_type == "QLinearConv":
                    op.note = _note(node, _const(graph, node, 3))
            op.why_not = why_not
        ops.append(op)
    return Graph(ops=ops, inputs=[name for name, _, _ in graph.inputs],
                 outputs=[name for name, _, _ in graph.outputs], layout="NCHW",
                 constants=frozenset(graph.constants))


def grouped_weights(weight, group):
    """The HWIO weights (``KH x KW x C x M``) of a convolution in ``group`` groups whose ONNX
    weight is ``weight`` (``M x C/group x KH x KW``): block-diagonal, input channel block
    ``g`` meets output channel block ``g`` only (a depthwise convolution is the case
    ``group == C == M``). With ``group == 1`` it is the plain transpose."""
    out_channels, per_group, kh, kw = weight.shape
    hwio = np.zeros((kh, kw, per_group * group, out_channels), np.int8)
    block = out_channels // group
    for g in range(group):
        hwio[:, :, g * per_group:(g + 1) * per_group, g * block:(g + 1) * block] = \
            weight[g * block:(g + 1) * block].transpose(2, 3, 1, 0)
    return hwio


def lower_node(graph, node, shapes):
    """The :class:`~sw.nn.quantize.QConv2D` or :class:`~sw.nn.quantize.QDense` of an NPU
    node, with ``scale`` (float32 per output channel) for the float32 requantizer."""
    c = [_const(graph, node, i) for i in range(len(node.inputs))]
    if node.op_type == "QLinearConv":
        x_scale, x_zp, w, w_scale, _, y_scale, y_zp = c[1:8]
        bias = c[8] if len(c) > 8 and c[8] is not None else np.zeros(w.shape[0], np.int32)
        _, channels, height, width = shapes[node.inputs[0]]
        _, out_channels, out_h, out_w = shapes[node.outputs[0]]
        hwio = grouped_weights(w, int(node.attrs.get("group", 1)))
        scale = K.requant_scale(x_scale, w_scale, y_scale)
        scale = np.broadcast_to(scale, (out_channels,)).astype(np.float32)
        return QConv2D(name=node.name, sources=(node.name,), weight=hwio,
                       bias=np.asarray(bias, np.int32), weight_scale=scale.astype(np.float64),
                       stride=int(node.attrs.get("strides", [1, 1])[0]),
                       padding=int(node.attrs.get("pads", [0])[0]),
                       input=QParams(float(x_scale), _zero_point8(x_zp)),
                       output=QParams(float(y_scale), _zero_point8(y_zp)),
                       multiplier=None, shift=None, act_min=-128, act_max=127, relu=False,
                       input_shape=(height, width, channels),
                       output_shape=(out_h, out_w, out_channels), scale=scale)
    if node.op_type == "QGemm":
        a_scale, a_zp, b, b_scale, _ = c[1:6]
        bias, y_scale, y_zp = c[6] if len(c) > 6 else None, c[7], c[8] if len(c) > 8 else None
        if y_zp is None:
            y_zp = np.zeros((), np.asarray(graph.constants.get(node.inputs[2], 0)).dtype)
        if node.attrs.get("transB", 0):
            b = b.T
        a_scale = np.float32(node.attrs.get("alpha", 1.0)) * np.float32(np.asarray(a_scale)
                                                                         .reshape(()))
    else:
        a_scale, a_zp, b, b_scale, _, y_scale, y_zp = c[1:8]
        bias = None
    k, n = b.shape
    bias = np.zeros(n, np.int32) if bias is None else np.broadcast_to(
        np.asarray(bias, np.int32).reshape(-1), (n,)).astype(np.int32)
    scale = np.broadcast_to(K.requant_scale(a_scale, b_scale, y_scale), (n,)).astype(np.float32)
    return QDense(name=node.name, sources=(node.name,), weight=np.ascontiguousarray(b, np.int8),
                  bias=bias, weight_scale=scale.astype(np.float64),
                  input=QParams(float(np.asarray(a_scale).reshape(())), _zero_point8(a_zp)),
                  output=QParams(float(np.asarray(y_scale).reshape(())), _zero_point8(y_zp)),
                  multiplier=None, shift=None, act_min=-128, act_max=127, relu=False,
                  input_shape=(k,), output_shape=(n,), scale=scale)
