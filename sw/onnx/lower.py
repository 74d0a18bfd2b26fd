"""Placement of an imported ONNX graph, and the lowering of its NPU operators onto
:mod:`sw.nn`'s quantized operators.

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
only (:func:`grouped_weights`; docs/onnx.md gives the mapping efficiency, ``1/g``). A ``Flatten`` between a convolution and a dense layer on the NPU is a
free view once the dense weight rows are permuted from channel-major to NHWC order.
"""

from dataclasses import dataclass, field

import numpy as np

from hw.config import MAX_K
from ..nn.passes import hwc_order_of_chw
from ..nn.quantize import QConv2D, QDense, QParams
from . import kernels as K


__all__ = ["NodePlacement", "place_graph", "NpuGroup", "npu_groups", "to_int8", "from_int8",
           "node_macs", "grouped_weights", "HOST_REASON"]


@dataclass(frozen=True)
class NodePlacement:
    """Where one node runs, and why."""
    node: str
    op_type: str
    device: str
    reason: str
    macs: int = 0


def to_int8(q):
    """An 8-bit ONNX tensor as the NPU's int8 (uint8 is shifted by -128)."""
    q = np.asarray(q)
    if q.dtype == np.uint8:
        return (q.astype(np.int16) - 128).astype(np.int8)
    return q.astype(np.int8)


def from_int8(q, dtype):
    """The inverse of :func:`to_int8` for ``dtype``."""
    if np.dtype(dtype) == np.uint8:
        return (np.asarray(q).astype(np.int16) + 128).astype(np.uint8)
    return np.asarray(q).astype(np.int8)


def _zero_point8(value):
    value = np.asarray(value)
    return int(value.reshape(-1)[0]) - (128 if value.dtype == np.uint8 else 0)


def _const(graph, node, index):
    if index >= len(node.inputs) or not node.inputs[index]:
        return None
    return graph.constants.get(node.inputs[index])


def _shape_of(shapes, tensor):
    return shapes.get(tensor)


def node_macs(node, shapes, graph):
    """Multiply-accumulates of a GEMM-like node, from the shapes seen in a run (0 for the
    others)."""
    out = shapes.get(node.outputs[0])
    if out is None:
        return 0
    if node.op_type in ("QLinearConv", "ConvInteger"):
        w = _const(graph, node, 3 if node.op_type == "QLinearConv" else 1)
        if w is None:
            return 0
        return int(np.prod(out)) * int(np.prod(w.shape[1:]))
    if node.op_type in ("QLinearMatMul", "MatMulInteger", "QGemm"):
        a = shapes.get(node.inputs[0])
        return 0 if a is None else int(np.prod(out)) * int(a[-1] if not node.attrs.get("transA")
                                                           else a[0])
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
    k = w.shape[2] * w.shape[3] * channels
    if k > MAX_K:
        return f"K = {k} exceeds MAX_K = {MAX_K}: the INT32 accumulator could overflow"
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
    k = b.shape[1] if a.get("transB", 0) else b.shape[0]
    if k > MAX_K:
        return f"K = {k} exceeds MAX_K = {MAX_K}: the INT32 accumulator could overflow"
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


def place_graph(graph, shapes):
    """One :class:`NodePlacement` per node, in order; ``shapes`` maps tensor names to the
    shapes of a run (:func:`sw.onnx.runtime.infer_shapes`)."""
    placements = []
    for node in graph.nodes:
        macs = node_macs(node, shapes, graph)
        if node.op_type == "QLinearConv":
            why_not = _conv_reason(graph, node, shapes)
            if why_not is None:
                w = _const(graph, node, 3)
                group = int(node.attrs.get("group", 1))
                kind = ("depthwise" if group == w.shape[0] and w.shape[1] == 1
                        else f"grouped (group = {group})")
                what = (f"a {kind} {w.shape[2]}x{w.shape[3]} convolution, lowered to a "
                        f"block-diagonal INT8 GEMM (1/{group} of its products are the "
                        f"group's)" if group != 1 else
                        f"a {w.shape[2]}x{w.shape[3]} convolution is an INT8 GEMM (implicit "
                        f"im2col by the strided DMA)")
                placements.append(NodePlacement(node.name, node.op_type, "npu",
                                                f"{what}; bias in the accumulator, float32 "
                                                f"requantization on the way out", macs))
                continue
        elif node.op_type in ("QLinearMatMul", "QGemm"):
            why_not = _gemm_reason(graph, node, shapes)
            if why_not is None:
                placements.append(NodePlacement(
                    node.name, node.op_type, "npu",
                    "an INT8 GEMM, one row per sample; bias in the accumulator, float32 "
                    "requantization on the way out", macs))
                continue
        else:
            why_not = None
        reason = (f"cannot run on the array: {why_not}" if why_not is not None
                  else _CPU_REASONS.get(node.op_type, HOST_REASON))
        placements.append(NodePlacement(node.name, node.op_type, "cpu", reason, macs))
    return placements


@dataclass
class NpuGroup:
    """NPU nodes that run as one program: each consumes the previous one's output (through
    at most a free Flatten view), and only the last one's output leaves the NPU."""
    nodes: list                       # the ONNX nodes (GEMMs and the views between them)
    ops: list = field(default_factory=list)     # their sw.nn operators
    input: str = ""                   # the tensor the first reads
    output: str = ""                  # the tensor the last writes
    output_dtype: object = None
    output_kind: str = ""             # "conv2d" or "dense"


def _single_consumer(graph, tensor):
    consumers = graph.consumers(tensor)
    outputs = {name for name, _, _ in graph.outputs}
    return consumers[0] if len(consumers) == 1 and tensor not in outputs else None


def _is_flatten_view(node, shapes):
    if node.op_type == "Flatten":
        return node.attrs.get("axis", 1) == 1
    if node.op_type == "Reshape":
        src, dst = shapes.get(node.inputs[0]), shapes.get(node.outputs[0])
        return src is not None and dst is not None and len(dst) == 2 and dst[0] == src[0]
    return False


def npu_groups(graph, placements, shapes):
    """The NPU groups of the graph, in order: ``{first node name: NpuGroup}`` and the set of
    every node name inside a group."""
    device = {p.node: p.device for p in placements}
    groups, inside = {}, set()
    for node in graph.nodes:
        if device[node.name] != "npu" or node.name in inside:
            continue
        group = NpuGroup(nodes=[node], input=node.inputs[0])
        current = node
        while True:
            nxt = _single_consumer(graph, current.outputs[0])
            if nxt is None:
                break
            view = None
            if (_is_flatten_view(nxt, shapes) and current.op_type == "QLinearConv"):
                view = nxt
                nxt = _single_consumer(graph, view.outputs[0])
                if nxt is None or nxt.op_type == "QLinearConv":
                    break
            if nxt is None or device.get(nxt.name) != "npu" or nxt.inputs[0] != (
                    view.outputs[0] if view else current.outputs[0]):
                break
            if view is not None:
                group.nodes.append(view)
            group.nodes.append(nxt)
            current = nxt
        group.output = current.outputs[0]
        group.ops = _lower_group(graph, group, shapes)
        group.output_kind = group.ops[-1].kind
        y_zp = _const(graph, current, 8 if current.op_type == "QGemm" else 7)
        # An absent output zero point means uint8 (ONNX's default for the QLinear operators).
        group.output_dtype = np.uint8 if y_zp is None else np.asarray(y_zp).dtype
        groups[node.name] = group
        inside.update(n.name for n in group.nodes)
    return groups, inside


def _lower_group(graph, group, shapes):
    ops, previous = [], None
    for node in group.nodes:
        if node.op_type in ("Flatten", "Reshape"):
            continue
        op = lower_node(graph, node, shapes)
        if previous is not None and previous.kind == "conv2d" and op.kind == "dense":
            height, width, channels = previous.output_shape
            op = _permuted_dense(op, hwc_order_of_chw(height, width, channels))
        ops.append(op)
        previous = op
    return ops


def _permuted_dense(op, perm):
    from dataclasses import replace
    return replace(op, weight=op.weight[perm],
                   sources=op.sources + ("flatten view: rows permuted to NHWC order",))


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
