"""Post-training quantization of a prepared network, and the quantized operators.

The scheme (TFLite's, with this project's requantization in :mod:`sw.quant`):

* activations: asymmetric per-tensor INT8, ``real = scale * (q - zero_point)``, the range
  taken from calibration data and widened to include 0 (so that 0 and the zero padding are
  exact); a ReLU output has ``min = 0``, hence ``zero_point = -128``;
* weights: symmetric per output channel, ``real = weight_scale[c] * q`` with ``q`` in
  -127 .. 127;
* biases: INT32 with scale ``input_scale * weight_scale[c]``;
* requantization of the INT32 accumulator per output channel with
  ``multiplier, shift = quantize_multiplier(input_scale * weight_scale[c] / output_scale)``,
  then the output zero point and the clamp ``[act_min, act_max]``; a fused ReLU is
  ``act_min = output zero_point``.

The NPU multiplies the raw INT8 activations, zero points included. Because
``sum((x - zx) * w) = sum(x * w) - zx * sum(w)``, the correction ``-zx * sum(w[:, c])`` is
folded into the bias once (:attr:`QConv2D.acc_bias`), and the convolution's padding holds the
input zero point (real 0), so the border needs no special case: the accumulator preloaded
with ``acc_bias`` and the plain INT8 GEMM give exactly ``sum((x - zx) * w) + bias``.
"""

from dataclasses import dataclass, replace

import numpy as np

from ..errors import NPUValueError
from ..quant import INT32_MAX, INT32_MIN, quantize_multiplier
from .graph import Argmax, Conv2D, Dense, Flatten, MaxPool2D, ReLU, Softmax
from .passes import prepare


__all__ = ["QParams", "QuantizeInput", "QConv2D", "QDense", "QReLU", "QFlatten", "QMaxPool",
           "QSoftmax", "QArgmax", "QuantizedNetwork", "quantize_network", "quantize_weights",
           "unfuse_relu", "NPU_KINDS"]


#: Operator kinds that compute an INT8 GEMM and so can run on the array.
NPU_KINDS = ("conv2d", "dense")


@dataclass(frozen=True)
class QParams:
    """Affine INT8 quantization: ``real = scale * (q - zero_point)``."""
    scale: float
    zero_point: int

    def __post_init__(self):
        if not (np.isfinite(self.scale) and self.scale > 0):
            raise NPUValueError(f"scale must be a positive finite number, not {self.scale!r}")
        if not -128 <= self.zero_point <= 127:
            raise NPUValueError(f"zero_point must be within -128 .. 127, "
                                f"not {self.zero_point!r}")

    @classmethod
    def from_range(cls, low, high):
        """Parameters covering ``[min(low, 0), max(high, 0)]`` with 256 levels."""
        low, high = min(float(low), 0.0), max(float(high), 0.0)
        if high == low:
            return cls(scale=1.0, zero_point=0)
        scale = (high - low) / 255.0
        zero_point = int(np.clip(round(-128 - low / scale), -128, 127))
        return cls(scale=scale, zero_point=zero_point)

    def quantize(self, x):
        """Float array -> INT8 (round half to even, saturate)."""
        q = np.round(np.asarray(x, dtype=np.float64) / self.scale) + self.zero_point
        return np.clip(q, -128, 127).astype(np.int8)

    def dequantize(self, q):
        return self.scale * (np.asarray(q, dtype=np.float64) - self.zero_point)


def quantize_weights(weight):
    """Symmetric per-output-channel INT8 (the last axis is the output channel).

    Returns ``(q, scale)``: ``q`` int8 in -127 .. 127 of the shape of ``weight``, ``scale``
    float64 of shape ``(out_channels,)``. An all-zero channel gets scale 1.
    """
    weight = np.asarray(weight, dtype=np.float64)
    peak = np.abs(weight.reshape(-1, weight.shape[-1])).max(axis=0)
    scale = np.where(peak > 0, peak / 127.0, 1.0)
    q = np.clip(np.round(weight / scale), -127, 127).astype(np.int8)
    return q, scale


def _quantize_bias(name, bias, input_scale, weight_scale, channels):
    if bias is None:
        return np.zeros(channels, dtype=np.int32)
    q = np.round(np.asarray(bias, dtype=np.float64) / (input_scale * weight_scale))
    if np.any(q < INT32_MIN) or np.any(q > INT32_MAX):
        raise NPUValueError(f"{name}: a bias does not fit INT32 at scale input_scale * "
                            f"weight_scale")
    return q.astype(np.int32)


def _requant_parameters(name, input_scale, weight_scale, output_scale):
    multipliers, shifts = [], []
    for channel_scale in weight_scale:
        multiplier, shift = quantize_multiplier(input_scale * channel_scale / output_scale)
        multipliers.append(multiplier)
        shifts.append(shift)
    return np.array(multipliers, dtype=np.int32), np.array(shifts, dtype=np.int32)


class _GemmOp:
    """What QConv2D and QDense share: an INT8 GEMM, a bias and the requantization."""

    @property
    def gemm_weight(self):
        """The ``K x N`` INT8 matrix the array multiplies (HWIO rows for a convolution)."""
        return self.weight.reshape(-1, self.weight.shape[-1])

    @property
    def k(self):
        return self.gemm_weight.shape[0]

    @property
    def n(self):
        return self.gemm_weight.shape[1]

    @property
    def acc_bias(self):
        """``bias - input_zero_point * sum_k(weight[k, c])``, int32: the accumulator's
        initial value, so that the GEMM on raw INT8 activations gives
        ``sum((x - zx) * w) + bias``."""
        correction = self.input.zero_point * self.gemm_weight.astype(np.int64).sum(axis=0)
        value = self.bias.astype(np.int64) - correction
        if np.any(value < INT32_MIN) or np.any(value > INT32_MAX):
            raise NPUValueError(f"{self.name}: the bias with the zero-point correction "
                                f"does not fit INT32")
        return value.astype(np.int32)

    @property
    def clamp(self):
        return self.act_min, self.act_max

    def gemm_rows(self, batch):
        """Rows of the GEMM (M) for ``batch`` samples."""
        return batch * int(np.prod(self.output_shape[:-1]))

    def macs(self, batch):
        return self.gemm_rows(batch) * self.k * self.n


@dataclass(frozen=True, eq=False)
class QuantizeInput:
    """CPU: float input -> INT8."""
    name: str
    output: QParams
    input_shape: tuple
    output_shape: tuple
    sources: tuple = ()
    kind = "quantize"


@dataclass(frozen=True, eq=False)
class QConv2D(_GemmOp):
    """A quantized convolution (with folded BatchNorm and fused ReLU, if any).

    Attributes
    ----------
    weight : numpy.ndarray
        int8, ``(kernel_h, kernel_w, in_channels, out_channels)``.
    bias : numpy.ndarray
        int32, ``(out_channels,)``, scale ``input.scale * weight_scale``.
    weight_scale : numpy.ndarray
        float64, per output channel.
    multiplier, shift : numpy.ndarray
        int32 per output channel, for :func:`sw.quant.requantize` (the fixed-point mode);
        ``None`` when ``scale`` is given.
    act_min, act_max : int
        The output clamp; ``act_min == output.zero_point`` when ``relu``.
    scale : numpy.ndarray or None
        float32 per output channel: the requantizer's float32 mode (onnxruntime's
        arithmetic, :func:`sw.onnx.kernels.requantize_output`) instead of the fixed point.
    """
    name: str
    sources: tuple
    weight: np.ndarray
    bias: np.ndarray
    weight_scale: np.ndarray
    stride: int
    padding: int
    input: QParams
    output: QParams
    multiplier: np.ndarray
    shift: np.ndarray
    act_min: int
    act_max: int
    relu: bool
    input_shape: tuple
    output_shape: tuple
    scale: np.ndarray = None
    kind = "conv2d"

    @property
    def kernel(self):
        return self.weight.shape[:2]


@dataclass(frozen=True, eq=False)
class QDense(_GemmOp):
    """A quantized fully connected layer; ``weight`` is int8 ``(in_features, out_features)``
    with rows in the order of the flattened NHWC input."""
    name: str
    sources: tuple
    weight: np.ndarray
    bias: np.ndarray
    weight_scale: np.ndarray
    input: QParams
    output: QParams
    multiplier: np.ndarray
    shift: np.ndarray
    act_min: int
    act_max: int
    relu: bool
    input_shape: tuple
    output_shape: tuple
    scale: np.ndarray = None
    kind = "dense"


@dataclass(frozen=True, eq=False)
class QReLU:
    """CPU: ``max(q, zero_point)`` on INT8 (only in the unfused form, see :func:`unfuse_relu`)."""
    name: str
    sources: tuple
    zero_point: int
    input_shape: tuple
    output_shape: tuple
    kind = "relu"


@dataclass(frozen=True, eq=False)
class QFlatten:
    """``(h, w, c) -> (h*w*c,)`` in NHWC order: a view, no data moves."""
    name: str
    sources: tuple
    input_shape: tuple
    output_shape: tuple
    kind = "flatten"


@dataclass(frozen=True, eq=False)
class QMaxPool:
    """CPU: max pooling on INT8 (exact: the quantization is monotone)."""
    name: str
    sources: tuple
    size: int
    input_shape: tuple
    output_shape: tuple
    kind = "maxpool"


@dataclass(frozen=True, eq=False)
class QSoftmax:
    """CPU: dequantize the INT8 logits with ``input`` and take the float softmax."""
    name: str
    sources: tuple
    input: QParams
    input_shape: tuple
    output_shape: tuple
    kind = "softmax"


@dataclass(frozen=True, eq=False)
class QArgmax:
    """CPU: index of the largest value (first on a tie)."""
    name: str
    sources: tuple
    input_shape: tuple
    output_shape: tuple
    kind = "argmax"


@dataclass(frozen=True, eq=False)
class QuantizedNetwork:
    """The quantized operator chain, in execution order (the first op is the input
    quantization), and the graph-pass notes that produced it."""
    input_shape: tuple
    ops: tuple
    notes: tuple = ()

    def __getitem__(self, name):
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(f"no operator named {name!r}; operators: {[op.name for op in self.ops]}")

    @property
    def input_qparams(self):
        return self.ops[0].output

    @property
    def logits_op(self):
        """The last GEMM operator: its INT8 output is what the NPU must match."""
        return [op for op in self.ops if op.kind in NPU_KINDS][-1]

    def gemm_ops(self):
        return [op for op in self.ops if op.kind in NPU_KINDS]


def _quantize_gemm_layer(layer, sources, input_qparams, output_range, input_shape,
                         output_shape):
    output_qparams = QParams.from_range(*output_range)
    weight_q, weight_scale = quantize_weights(layer.weight)
    channels = weight_q.shape[-1]
    bias_q = _quantize_bias(layer.name, layer.bias, input_qparams.scale, weight_scale,
                            channels)
    multiplier, shift = _requant_parameters(layer.name, input_qparams.scale, weight_scale,
                                            output_qparams.scale)
    relu = layer.activation == "relu"
    common = dict(name=layer.name, sources=sources, weight=weight_q, bias=bias_q,
                  weight_scale=weight_scale, input=input_qparams, output=output_qparams,
                  multiplier=multiplier, shift=shift,
                  act_min=output_qparams.zero_point if relu else -128, act_max=127,
                  relu=relu, input_shape=input_shape, output_shape=output_shape)
    if isinstance(layer, Conv2D):
        return QConv2D(stride=layer.stride, padding=layer.padding, **common)
    return QDense(**common)


def quantize_network(network, calibration):
    """Prepare (fold, fuse, view) and quantize ``network`` with calibration images.

    Parameters
    ----------
    network : sw.nn.graph.Network
        The trained float network; not modified.
    calibration : numpy.ndarray
        Float NHWC images that set the activation ranges (training data, not test data).

    Returns
    -------
    QuantizedNetwork
    """
    prepared = prepare(network)
    float_net = prepared.network
    calibration = np.asarray(calibration, dtype=np.float64)
    outputs = float_net.trace(calibration)

    input_qparams = QParams.from_range(calibration.min(), calibration.max())
    ops = [QuantizeInput(name="quantize", output=input_qparams,
                         input_shape=float_net.input_shape, output_shape=float_net.input_shape)]
    current = input_qparams     # quantization of the tensor flowing into the next layer
    for layer, input_shape, output_shape in float_net.shapes():
        sources = prepared.sources[layer.name]
        if isinstance(layer, (Conv2D, Dense)):
            output = outputs[layer.name]
            op = _quantize_gemm_layer(layer, sources, current, (output.min(), output.max()),
                                      input_shape, output_shape)
            current = op.output
        elif isinstance(layer, Flatten):
            if not layer.is_view:
                raise NPUValueError(f"{layer.name}: a channel-major flatten that no Dense "
                                    f"consumes cannot be made a view")
            op = QFlatten(layer.name, sources, input_shape, output_shape)
        elif isinstance(layer, ReLU):
            # A ReLU that could not be fused: clamp at the zero point on the CPU.
            op = QReLU(layer.name, sources, current.zero_point, input_shape, output_shape)
        elif isinstance(layer, MaxPool2D):
            op = QMaxPool(layer.name, sources, layer.size, input_shape, output_shape)
        elif isinstance(layer, Softmax):
            op = QSoftmax(layer.name, sources, current, input_shape, output_shape)
        elif isinstance(layer, Argmax):
            op = QArgmax(layer.name, sources, input_shape, output_shape)
        else:
            raise NPUValueError(f"{layer.name}: {type(layer).__name__} cannot be quantized "
                                f"(a BatchNorm must follow a Conv2D or Dense to be folded)")
        ops.append(op)
    return QuantizedNetwork(input_shape=float_net.input_shape, ops=tuple(ops),
                            notes=prepared.notes)


def unfuse_relu(qnet):
    """The same network with every fused ReLU split back out as a CPU :class:`QReLU`.

    The GEMM then clamps to the full -128 .. 127 and the ReLU takes ``max(q, zero_point)``;
    since ``-128 <= zero_point``, ``max(clamp(v, -128, 127), zp) == clamp(v, zp, 127)``, so
    the outputs are identical: only the work is split differently.
    """
    ops = []
    for op in qnet.ops:
        if op.kind in NPU_KINDS and op.relu:
            ops.append(replace(op, relu=False, act_min=-128, sources=op.sources[:-1]))
            ops.append(QReLU(f"{op.name}.relu", op.sources[-1:], op.output.zero_point,
                             op.output_shape, op.output_shape))
        else:
            ops.append(op)
    return QuantizedNetwork(input_shape=qnet.input_shape, ops=tuple(ops), notes=qnet.notes)
