"""The INT8 reference executor: exact integer arithmetic in numpy.

Each GEMM operator computes what the NPU computes, in the same way: the INT8 input (a
convolution's border padded with the input zero point), an INT32 product with the INT8
weights, plus the accumulator bias :attr:`~sw.nn.quantize.QConv2D.acc_bias`, requantized by
:func:`sw.quant.requantize`. The NPU's INT8 outputs must equal these bit for bit. The
accumulators come from the project's one GEMM and convolution reference,
:mod:`sw.reference`, and wrap on INT32 overflow as the hardware does.
"""

import numpy as np

from ..errors import NPUTypeError, NPUValueError
from ..quant import requantize
from .. import reference


__all__ = ["conv2d_int32", "dense_int32", "run_op", "run_reference", "predict"]


def _check_int8(name, x):
    if not isinstance(x, np.ndarray) or x.dtype != np.int8:
        raise NPUTypeError(f"{name} must be an int8 numpy array, not "
                           f"{getattr(x, 'dtype', type(x).__name__)}")


def conv2d_int32(x, op):
    """INT32 accumulators of a :class:`~sw.nn.quantize.QConv2D` on the INT8 NHWC batch ``x``:
    ``im2col(x, border = input zero point) @ weight + acc_bias``."""
    _check_int8("x", x)
    return reference.conv2d_int32(x, op.weight, op.acc_bias, stride=op.stride,
                                  padding=op.padding, pad_value=op.input.zero_point)


def dense_int32(x, op):
    """INT32 accumulators of a :class:`~sw.nn.quantize.QDense` on ``x`` (batch x features)."""
    _check_int8("x", x)
    return reference.gemm_int32(x, op.gemm_weight, op.acc_bias)


def run_op(op, x):
    """Apply one quantized operator to its input."""
    if op.kind == "quantize":
        return op.output.quantize(x)
    if op.kind in ("conv2d", "dense"):
        acc = conv2d_int32(x, op) if op.kind == "conv2d" else dense_int32(x, op)
        if op.scale is not None:
            from ..quant import requantize_float
            return requantize_float(acc, op.scale, op.output.zero_point, op.act_min,
                                    op.act_max)
        return requantize(acc, op.multiplier, op.shift, op.output.zero_point,
                          op.act_min, op.act_max)
    if op.kind == "relu":
        return np.maximum(x, np.int8(op.zero_point))
    if op.kind == "flatten":
        return x.reshape(x.shape[0], -1)
    if op.kind == "maxpool":
        batch, height, width, channels = x.shape
        s = op.size
        x = x[:, :height // s * s, :width // s * s]
        return x.reshape(batch, height // s, s, width // s, s, channels).max(axis=(2, 4))
    if op.kind == "softmax":
        logits = op.input.dequantize(x)
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    if op.kind == "argmax":
        return np.argmax(x, axis=-1)
    raise NPUValueError(f"unknown operator kind {op.kind!r} ({op.name})")


def run_reference(qnet, x, *, start=None):
    """Run the quantized network on a batch; ``{op name: output}`` of every operator.

    ``x`` is the float input, or (with ``start`` naming an operator) that operator's input.
    """
    outputs = {}
    running = start is None
    for op in qnet.ops:
        if not running:
            running = op.name == start
            if not running:
                continue
        x = run_op(op, x)
        outputs[op.name] = x
    if not running:
        raise KeyError(f"no operator named {start!r}")
    return outputs


def predict(qnet, x):
    """``(int8 logits, classes)`` of the float batch ``x`` through the INT8 reference."""
    outputs = run_reference(qnet, x)
    logits = outputs[qnet.logits_op.name]
    return logits, np.argmax(logits, axis=-1)
