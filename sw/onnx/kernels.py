"""onnxruntime's quantized CPU kernels, in numpy, bit for bit.

Every function here computes what onnxruntime's CPU execution provider computes for one
operator on x86-64, down to the float32 rounding of each step, so that the NPU's output
(whose requantization follows the same arithmetic) and the host's fallback operators can be
compared with onnxruntime for equality, not closeness. The arithmetic of each kernel comes
from onnxruntime's source (MLAS, ``onnxruntime/core/mlas/lib``) and is confirmed against
onnxruntime itself by ``tb/test_onnx_kernels.py``:

* ``QuantizeLinear``: ``x / scale`` in float32 (a division, not a multiplication by the
  reciprocal), clamped to ``[qmin - zp, qmax - zp]``, rounded half to even, ``+ zp``;
* ``DequantizeLinear``: ``float32(q - zp) * scale``;
* the requantization of an INT32 accumulator (``MlasRequantizeOutput``, used by
  QLinearConv, QLinearMatMul and QGemm): ``float32(acc) * scale`` in float32, clamped,
  rounded half to even, ``+ zp``; the per-channel ``scale`` is ``x_scale * w_scale / y_scale``
  evaluated left to right in float32;
* ``QLinearAdd`` (AVX2 kernel): two fused multiply-adds in float32 on top of a fixed part
  ``zc - (r_a * za + r_b * zb)`` with ``r = scale / c_scale``, rounded half to even and
  saturated;
* ``QLinearConcat``: each input through a 256-entry table, ``QuantizeLinear(x_scale *
  float32(q - x_zp))`` at the output's scale (a plain copy when scale and zero point equal
  the output's);
* ``QLinearAveragePool``: the inputs dequantized, each window's valid pixels summed in
  float32 in row-major order, divided by the pixel count in float32, then
  ``nearbyintf(avg / y_scale + y_zp)`` saturated (two float32 roundings before the
  rounding half to even);
* ``QLinearSoftmax``: a 256-entry float32 table of ``exp`` (computed in float64), summed in
  float32 left to right, and ``nearbyint(e * floorf(1 / y_scale) / sum) + y_zp`` in float64,
  saturated.

Tensors are in ONNX's own layouts (NCHW) and dtypes (uint8 or int8 activations).
"""

import functools
import math

import numpy as np

from ..errors import NPUValueError
from ..quant import requantize_float


__all__ = ["fma32", "quantize_linear", "dequantize_linear", "requantize_output",
           "requant_scale", "conv_int32", "qlinear_conv", "conv_integer", "matmul_int32",
           "qlinear_matmul", "matmul_integer", "qgemm", "qlinear_add", "max_pool",
           "qtype_range", "qlinear_global_average_pool", "qlinear_concat",
           "qlinear_average_pool", "qlinear_softmax"]


def qtype_range(dtype):
    """``(lowest, highest)`` of an 8-bit quantized dtype."""
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def fma32(a, b, c):
    """``a * b + c`` rounded once to float32 (a fused multiply-add), for float32 arrays.

    The product of two float32 values is exact in float64; the float64 sum may round, but
    only a sum that lands exactly halfway between two float32 values can then round the
    wrong way, and the sum's rounding error (recovered exactly by Knuth's two-sum) says
    which way the exact value lies.
    """
    a, b, c = (np.asarray(v, dtype=np.float32) for v in (a, b, c))
    product = a.astype(np.float64) * b.astype(np.float64)
    total = product + c.astype(np.float64)
    # two-sum: total + error == product + c exactly.
    virtual = total - product
    error = (product - (total - virtual)) + (c.astype(np.float64) - virtual)
    rounded = total.astype(np.float32)
    # Halfway cases of the float64 sum between float32 neighbours: settle them by the error.
    low = np.nextafter(rounded, np.float32(-np.inf))
    high = np.nextafter(rounded, np.float32(np.inf))
    wide = rounded.astype(np.float64)
    below = (wide - low.astype(np.float64)) / 2 + low.astype(np.float64)
    above = (high.astype(np.float64) - wide) / 2 + wide
    # A tie went to `rounded` (the even one) but the exact value lies on the other side.
    result = np.where((total == below) & (error < 0), low, rounded)
    result = np.where((total == above) & (error > 0), high, result)
    return result.astype(np.float32)


def _per_axis(value, ndim, axis):
    """A per-tensor scalar or a per-channel vector, shaped to broadcast along ``axis``."""
    value = np.asarray(value)
    if value.ndim == 0 or value.size == 1:
        return value.reshape(())
    shape = [1] * ndim
    shape[axis] = value.size
    return value.reshape(shape)


def quantize_linear(x, scale, zero_point, dtype=None, axis=1):
    """ONNX ``QuantizeLinear`` as onnxruntime computes it (float32 ``x``)."""
    x = np.asarray(x, dtype=np.float32)
    dtype = np.dtype(dtype if dtype is not None else np.asarray(zero_point).dtype)
    lowest, highest = qtype_range(dtype)
    scale = _per_axis(np.asarray(scale, dtype=np.float32), x.ndim, axis)
    zp = _per_axis(np.asarray(zero_point, dtype=np.int32), x.ndim, axis)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        value = x / scale
    value = np.minimum(np.maximum(value, (lowest - zp).astype(np.float32)),
                       (highest - zp).astype(np.float32))
    return (np.rint(value).astype(np.int32) + zp).astype(dtype)


def dequantize_linear(q, scale, zero_point=0, axis=1):
    """ONNX ``DequantizeLinear`` as onnxruntime computes it: ``float32(q - zp) * scale``."""
    q = np.asarray(q)
    scale = _per_axis(np.asarray(scale, dtype=np.float32), q.ndim, axis)
    zp = _per_axis(np.asarray(zero_point, dtype=np.int32), q.ndim, axis)
    return ((q.astype(np.int32) - zp).astype(np.float32) * scale).astype(np.float32)


def requant_scale(x_scale, w_scale, y_scale):
    """The float32 requantization scale ``x_scale * w_scale / y_scale`` (per channel when
    ``w_scale`` is), evaluated left to right in float32 as onnxruntime's kernels do."""
    x_scale = np.float32(np.asarray(x_scale, dtype=np.float32).reshape(()))
    y_scale = np.float32(np.asarray(y_scale, dtype=np.float32).reshape(()))
    w_scale = np.asarray(w_scale, dtype=np.float32).reshape(-1)
    return ((x_scale * w_scale) / y_scale).astype(np.float32)


def requantize_output(acc, scale, zero_point, dtype, axis=-1):
    """INT32 accumulators to 8 bits as ``MlasRequantizeOutput`` does.

    ``float32(acc)`` (round to nearest even), times ``scale`` in float32, clamped to
    ``[qmin - zp, qmax - zp]``, rounded half to even, plus ``zp``: the requantizer's float32
    mode, :func:`sw.quant.requantize_float`, on int8 (a uint8 tensor is its int8 form
    shifted by 128, zero point included, which leaves every step the same). ``scale`` is a
    scalar or one value per index of ``axis``.
    """
    acc = np.asarray(acc, dtype=np.int32)
    zp = int(np.asarray(zero_point).reshape(()))
    shift = 128 if np.dtype(dtype) == np.uint8 else 0
    scale = np.asarray(scale, dtype=np.float32)
    moved = np.moveaxis(acc, axis, -1) if acc.ndim else acc.reshape(1)
    if scale.size > 1:
        scale = scale.reshape(-1)
    else:
        scale = np.float32(scale.reshape(()))
    y = requantize_float(moved, scale, zp - shift, -128, 127)
    y = np.moveaxis(y, -1, axis) if acc.ndim else y.reshape(())
    return (y.astype(np.int16) + shift).astype(dtype)


def _pads_of(attrs, spatial):
    pads = list(attrs.get("pads", [0] * (2 * spatial)))
    return pads[:spatial], pads[spatial:]


def conv_int32(x, w, *, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1,
               pad_value=0):
    """An integer NCHW convolution into INT32: ``x`` (N, C, H, W) and ``w`` (M, C/group,
    kh, kw) already hold ``q - zero_point`` as int32; the border holds ``pad_value``."""
    x = np.asarray(x, dtype=np.int64)
    w = np.asarray(w, dtype=np.int64)
    batch, channels, height, width = x.shape
    out_channels, group_channels, kernel_h, kernel_w = w.shape
    top, left, bottom, right = pads[0], pads[1], pads[2], pads[3]
    x = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=pad_value)
    dh, dw = dilations
    sh, sw = strides
    out_h = (height + top + bottom - dh * (kernel_h - 1) - 1) // sh + 1
    out_w = (width + left + right - dw * (kernel_w - 1) - 1) // sw + 1
    per_group = out_channels // group
    out = np.zeros((batch, out_channels, out_h, out_w), dtype=np.int64)
    for g in range(group):
        xg = x[:, g * group_channels:(g + 1) * group_channels]
        wg = w[g * per_group:(g + 1) * per_group]
        for i in range(kernel_h):
            for j in range(kernel_w):
                patch = xg[:, :, i * dh:i * dh + sh * (out_h - 1) + 1:sh,
                           j * dw:j * dw + sw * (out_w - 1) + 1:sw]
                out[:, g * per_group:(g + 1) * per_group] += np.einsum(
                    "nchw,mc->nmhw", patch, wg[:, :, i, j])
    return _wrap_int32(out)


def _wrap_int32(value):
    return np.asarray(value, dtype=np.int64).astype(np.uint32).view(np.int32) \
        if np.asarray(value).ndim else np.int32(np.uint32(np.int64(value) & 0xFFFFFFFF))


def _conv_attributes(attrs, spatial=2):
    begin, end = _pads_of(attrs, spatial)
    return dict(strides=tuple(attrs.get("strides", [1] * spatial)),
                pads=tuple(begin + end), dilations=tuple(attrs.get("dilations", [1] * spatial)),
                group=int(attrs.get("group", 1)))


def _check_zero_points(name, zero_point, what):
    zero_point = np.asarray(zero_point)
    if zero_point.size > 1 and np.any(zero_point != zero_point.reshape(-1)[0]):
        raise NPUValueError(f"{name}: per-channel {what} zero points are not supported")
    return int(zero_point.reshape(-1)[0]) if zero_point.size else 0


def _zero_point_free_weights(w, w_zp):
    """``w - w_zp`` as int32, the zero point per tensor or per output channel."""
    w = np.asarray(w, np.int32)
    w_zp = np.asarray(w_zp if w_zp is not None else 0, np.int32).reshape(-1)
    return w - (w_zp.reshape(-1, 1, 1, 1) if w_zp.size > 1 else int(w_zp[0]) if w_zp.size else 0)


def qlinear_conv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias=None, attrs=None,
                 name="QLinearConv"):
    """ONNX ``QLinearConv``: the INT32 convolution of the zero-point-free operands, plus
    the bias, requantized per output channel."""
    attrs = attrs or {}
    xz = _check_zero_points(name, x_zp, "input")
    acc = conv_int32(np.asarray(x, np.int32) - xz, _zero_point_free_weights(w, w_zp),
                     **_conv_attributes(attrs))
    if bias is not None:
        acc = _wrap_int32(acc.astype(np.int64) + np.asarray(bias, np.int64).reshape(1, -1, 1, 1))
    scale = requant_scale(x_scale, w_scale, y_scale)
    return requantize_output(acc, scale, y_zp, np.asarray(y_zp).dtype, axis=1)


def conv_integer(x, w, x_zp=0, w_zp=0, attrs=None, name="ConvInteger"):
    """ONNX ``ConvInteger``: the INT32 convolution of ``x - x_zp`` and ``w - w_zp``."""
    xz = _check_zero_points(name, x_zp, "input")
    return conv_int32(np.asarray(x, np.int32) - xz, _zero_point_free_weights(w, w_zp),
                      **_conv_attributes(attrs or {}))


def matmul_int32(a, b):
    """INT32 product of integer matrices (numpy broadcasting of the batch dimensions),
    wrapping as two's complement like the hardware and onnxruntime's INT32 accumulators."""
    return _wrap_int32(np.matmul(np.asarray(a, np.int64), np.asarray(b, np.int64)))


def _column_zero_point(b_zp, columns):
    b_zp = np.asarray(b_zp, dtype=np.int32).reshape(-1)
    return b_zp if b_zp.size > 1 else np.full(columns, b_zp[0] if b_zp.size else 0, np.int32)


def matmul_integer(a, b, a_zp=0, b_zp=0):
    """ONNX ``MatMulInteger``: ``(a - a_zp) @ (b - b_zp)`` in INT32 (``b_zp`` per column
    or per tensor)."""
    b = np.asarray(b, np.int32)
    az = int(np.asarray(a_zp).reshape(-1)[0]) if np.asarray(a_zp).size else 0
    return matmul_int32(np.asarray(a, np.int32) - az, b - _column_zero_point(b_zp, b.shape[-1]))


def qlinear_matmul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
    """ONNX ``QLinearMatMul``: ``matmul_integer`` requantized (per column of ``b`` when
    its scale is per column)."""
    acc = matmul_integer(a, b, a_zp, b_zp)
    scale = requant_scale(a_scale, b_scale, y_scale)
    return requantize_output(acc, scale, y_zp, np.asarray(y_zp).dtype, axis=-1)


def qgemm(a, a_scale, a_zp, b, b_scale, b_zp, c=None, y_scale=None, y_zp=None, *,
          trans_a=0, trans_b=0, alpha=1.0):
    """onnxruntime's ``QGemm`` (com.microsoft) with a quantized output: ``alpha * A' @ B'
    + C`` where ``C`` is INT32 at scale ``a_scale * b_scale``; the requantization scale is
    ``alpha * a_scale * b_scale / y_scale`` in float32."""
    a = np.asarray(a)
    b = np.asarray(b)
    if trans_a:
        a = a.T
    if trans_b:
        b = b.T
    acc = matmul_integer(a, b, a_zp, b_zp)
    if c is not None:
        acc = _wrap_int32(acc.astype(np.int64) + np.asarray(c, np.int64))
    if y_scale is None:
        raise NPUValueError("QGemm with a float output (no y_scale) is not supported")
    scale = requant_scale(np.float32(alpha) * np.float32(np.asarray(a_scale).reshape(())),
                          b_scale, y_scale)
    return requantize_output(acc, scale, y_zp, np.asarray(y_zp).dtype, axis=-1)


def qlinear_add(a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp):
    """onnxruntime's ``QLinearAdd`` (com.microsoft), its AVX2 kernel: per element
    ``fma(a, r_a, fma(b, r_b, fixed))`` in float32, rounded half to even, saturated; with
    ``r = scale / c_scale`` and ``fixed = zc - (r_a * za + r_b * zb)``. A scalar operand is
    folded into ``fixed`` with a separate multiply and add, as the kernel does."""
    a = np.asarray(a)
    b = np.asarray(b)
    dtype = a.dtype
    lowest, highest = qtype_range(dtype)
    f32 = np.float32
    ratio_a = f32(f32(np.asarray(a_scale).reshape(())) / f32(np.asarray(c_scale).reshape(())))
    ratio_b = f32(f32(np.asarray(b_scale).reshape(())) / f32(np.asarray(c_scale).reshape(())))
    za, zb, zc = (int(np.asarray(z).reshape(())) for z in (a_zp, b_zp, c_zp))
    fixed = f32(f32(zc) - fma32(ratio_a, f32(za), ratio_b * f32(zb)))
    if a.size == 1 and b.size != 1:
        fixed = f32(fixed + f32(f32(a.reshape(())) * ratio_a))
        value = fma32(b.astype(f32), ratio_b, fixed)
        shape = b.shape
    elif b.size == 1 and a.size != 1:
        fixed = f32(fixed + f32(f32(b.reshape(())) * ratio_b))
        value = fma32(a.astype(f32), ratio_a, fixed)
        shape = a.shape
    else:
        if a.shape != b.shape:
            raise NPUValueError(f"QLinearAdd: broadcasting {a.shape} with {b.shape} is not "
                                f"supported (same shapes or a scalar only)")
        value = fma32(a.astype(f32), ratio_a, fma32(b.astype(f32), ratio_b, fixed))
        shape = a.shape
    rounded = np.rint(value).astype(np.int64)
    return np.clip(rounded, lowest, highest).astype(dtype).reshape(shape)


def max_pool(x, attrs):
    """ONNX ``MaxPool`` on an integer NCHW tensor (the border never wins)."""
    x = np.asarray(x)
    kernel_h, kernel_w = attrs["kernel_shape"]
    sh, sw = attrs.get("strides", [1, 1])
    begin, end = _pads_of(attrs, 2)
    if attrs.get("ceil_mode", 0) or any(d != 1 for d in attrs.get("dilations", [1, 1])):
        raise NPUValueError("MaxPool: ceil_mode and dilations are not supported")
    lowest = np.iinfo(x.dtype).min
    padded = np.pad(x, ((0, 0), (0, 0), (begin[0], end[0]), (begin[1], end[1])),
                    constant_values=lowest)
    out_h = (padded.shape[2] - kernel_h) // sh + 1
    out_w = (padded.shape[3] - kernel_w) // sw + 1
    out = np.full(x.shape[:2] + (out_h, out_w), lowest, dtype=x.dtype)
    for i in range(kernel_h):
        for j in range(kernel_w):
            out = np.maximum(out, padded[:, :, i:i + sh * (out_h - 1) + 1:sh,
                                         j:j + sw * (out_w - 1) + 1:sw])
    return out


def qlinear_global_average_pool(x, x_scale, x_zp, y_scale, y_zp, channels_last=0):
    """onnxruntime's ``QLinearGlobalAveragePool`` (com.microsoft): the INT32 sum of each
    channel's ``n`` pixels minus ``n * x_zp``, requantized (:func:`requantize_output`) with
    the float32 scale ``x_scale / (y_scale * n)``."""
    x = np.asarray(x)
    spatial = tuple(range(1, x.ndim - 1)) if channels_last else tuple(range(2, x.ndim))
    count = int(np.prod([x.shape[axis] for axis in spatial]))
    acc = x.astype(np.int64).sum(axis=spatial, keepdims=True) \
        - int(np.asarray(x_zp).reshape(())) * count
    f = np.float32
    scale = f(f(np.asarray(x_scale).reshape(())) /
              f(f(np.asarray(y_scale).reshape(())) * f(count)))
    return requantize_output(_wrap_int32(acc), scale, y_zp, x.dtype)


def _scalar(value, what, name):
    value = np.asarray(value)
    if value.size != 1:
        raise NPUValueError(f"{name}: {what} must be a scalar, not of shape {value.shape}")
    return value.reshape(())


def qlinear_concat(y_scale, y_zp, inputs, axis, name="QLinearConcat"):
    """onnxruntime's ``QLinearConcat`` (com.microsoft, ``qlinear_concat.cc``): ``inputs`` is
    a list of ``(x, x_scale, x_zp)``. An input whose scale and zero point equal the
    output's is copied; any other goes through a 256-entry table built as
    ``QlinearBuildLookupTable`` does: ``MlasQuantizeLinear(x_scale * float32(q - x_zp))`` at
    ``(y_scale, y_zp)``, i.e. :func:`quantize_linear` of :func:`dequantize_linear` (a float32
    product, a float32 division, clamp, round half to even)."""
    y_scale = np.float32(_scalar(y_scale, "y_scale", name))
    y_zp = _scalar(y_zp, "y_zero_point", name)
    dtype = y_zp.dtype
    codes = np.arange(256, dtype=np.uint8).view(dtype)       # the table's index is the byte
    if not inputs:
        raise NPUValueError(f"{name}: no input tensors")
    rank = np.ndim(inputs[0][0])
    if not -rank <= int(axis) < rank:
        raise NPUValueError(f"{name}: axis {axis} is out of range for inputs of rank {rank}")
    parts = []
    for index, (x, x_scale, x_zp) in enumerate(inputs):
        x = np.asarray(x)
        x_scale = np.float32(_scalar(x_scale, f"input {index}'s scale", name))
        x_zp = _scalar(x_zp, f"input {index}'s zero point", name)
        if x.dtype != dtype or x_zp.dtype != dtype:
            raise NPUValueError(f"{name}: input {index} is {x.dtype} with a {x_zp.dtype} zero "
                                f"point, the output {dtype}")
        if x_scale == y_scale and x_zp == y_zp:
            parts.append(x)
            continue
        table = quantize_linear(dequantize_linear(codes, x_scale, x_zp), y_scale, y_zp, dtype)
        parts.append(table[x.view(np.uint8)])
    return np.concatenate(parts, axis=int(axis))


def _pool_output_size(size, stride, kernel, pad_head, pad_tail, ceil_mode, name):
    """onnxruntime's ``PoolAttributes::ComputeOutputSize``: ``numerator / stride + 1`` in
    C's integer division (truncated toward 0); with ``ceil_mode`` the quotient is ceiled in
    float32 and a last window starting past the head padding and the image is dropped (ONNX
    pull request 5741)."""
    numerator = size + pad_head + pad_tail - (kernel - 1) - 1
    quotient = abs(numerator) // stride
    out = (quotient if numerator >= 0 else -quotient) + 1
    if ceil_mode:
        out = int(np.ceil(np.float32(np.float32(numerator) / np.float32(stride)))) + 1
        if (out - 1) * stride >= size + pad_head:
            out -= 1
    if out < 0:
        raise NPUValueError(f"{name}: a kernel of {kernel} with pads {pad_head}, {pad_tail} "
                            f"does not fit an image of {size}")
    return out


def _nearbyint_to_int32(value):
    """``static_cast<int32_t>(std::nearbyintf(value))`` on x86-64: round half to even; a NaN
    or a value outside int32 becomes INT32_MIN (cvttss2si's "integer indefinite")."""
    rounded = np.rint(value.astype(np.float64))
    bad = ~((rounded >= -2.0 ** 31) & (rounded < 2.0 ** 31))
    return np.where(bad, -2.0 ** 31, rounded).astype(np.int64)


def qlinear_average_pool(x, x_scale, x_zp, y_scale, y_zp, attrs, name="QLinearAveragePool"):
    """onnxruntime's ``QLinearAveragePool`` (com.microsoft, ``contrib_ops/cpu/qlinear_pool.cc``)
    on a 1-D, 2-D or 3-D pooling, NCHW or ``channels_last``.

    A pooling whose kernel covers the whole image with no padding is onnxruntime's global
    average pool (:func:`qlinear_global_average_pool`, INT32 sums). Any other: the input is
    dequantized (``x_scale * float32(q - x_zp)``), each window's pixels inside the image are
    summed in float32 starting from 0 in row-major order, the sum is divided by the count
    (the kernel's size with ``count_include_pad``, else the pixels inside the image, as
    onnxruntime clamps the window) converted to float32, and quantized as
    ``nearbyintf(avg / y_scale + float32(y_zp))`` (a division and an addition, each rounded
    to float32; round half to even), converted to int32 and saturated. The output size is
    onnxruntime's (:func:`_pool_output_size`).
    """
    x = np.asarray(x)
    dtype = x.dtype
    lowest, highest = qtype_range(dtype)
    kernel = [int(k) for k in attrs["kernel_shape"]]
    spatial = len(kernel)
    if not 1 <= spatial <= 3 or x.ndim != spatial + 2:
        raise NPUValueError(f"{name}: kernel_shape {kernel} on an input of shape {x.shape} is "
                            f"not supported (1-D to 3-D pooling of an N, C, spatial... input)")
    auto_pad = attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad not in ("NOTSET", "VALID"):
        raise NPUValueError(f"{name}: auto_pad {auto_pad} is not supported (NOTSET or VALID)")
    if any(int(d) != 1 for d in attrs.get("dilations", [1] * spatial)):
        raise NPUValueError(f"{name}: dilations {list(attrs['dilations'])} are not supported")
    strides = [int(s) for s in attrs.get("strides", [1] * spatial)]
    pads = [int(p) for p in attrs.get("pads", [0] * (2 * spatial))] if auto_pad == "NOTSET" \
        else [0] * (2 * spatial)
    if any(pads[d] >= kernel[d] or pads[d + spatial] >= kernel[d] for d in range(spatial)):
        raise NPUValueError(f"{name}: pads {pads} must be smaller than the kernel {kernel}")
    ceil_mode = int(attrs.get("ceil_mode", 0))
    include_pad = bool(attrs.get("count_include_pad", 0))
    channels_last = int(attrs.get("channels_last", 0))
    if channels_last:
        x = np.moveaxis(x, -1, 1)
    x_scale = np.float32(_scalar(x_scale, "x_scale", name))
    x_zp = _scalar(x_zp, "x_zero_point", name)
    y_scale = np.float32(_scalar(y_scale, "y_scale", name))
    image = list(x.shape[2:])
    if image == kernel and not any(pads):
        out = qlinear_global_average_pool(x, x_scale, x_zp, y_scale, y_zp)
        return np.moveaxis(out, 1, -1) if channels_last else out

    values = dequantize_linear(x, x_scale, x_zp)
    outputs = [_pool_output_size(image[d], strides[d], kernel[d], pads[d], pads[d + spatial],
                                 ceil_mode, name) for d in range(spatial)]
    # Zeros around the image, enough for every window: adding +0.0 leaves a float32 sum
    # as it is, so the sum over a padded window equals onnxruntime's over its valid pixels.
    tails = [max(0, (outputs[d] - 1) * strides[d] - pads[d] + kernel[d] - image[d])
             for d in range(spatial)]
    padded = np.pad(values, [(0, 0), (0, 0)] + [(pads[d], tails[d]) for d in range(spatial)])
    total = np.zeros(x.shape[:2] + tuple(outputs), np.float32)
    for offsets in np.ndindex(*kernel):
        window = tuple(slice(o, o + strides[d] * (outputs[d] - 1) + 1, strides[d])
                       for d, o in enumerate(offsets))
        total = (total + padded[(Ellipsis,) + window]).astype(np.float32)
    if include_pad:
        count = np.float32(np.prod(kernel))
    else:
        count = np.ones(outputs, np.int64)
        for d in range(spatial):
            start = np.arange(outputs[d]) * strides[d] - pads[d]
            extent = np.minimum(start + kernel[d], image[d]) - np.maximum(start, 0)
            shape = [1] * spatial
            shape[d] = outputs[d]
            count = count * extent.reshape(shape)
        count = count.astype(np.float32)
    zero_point = np.float32(int(_scalar(y_zp, "y_zero_point", name)))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        average = (total / count).astype(np.float32)
        value = ((average / y_scale).astype(np.float32) + zero_point).astype(np.float32)
    out = np.clip(_nearbyint_to_int32(value), lowest, highest).astype(dtype)
    return np.moveaxis(out, 1, -1) if channels_last else out


def _libm_logf():
    """The C library's ``logf`` (what onnxruntime calls), else ``log`` rounded to float32."""
    import ctypes
    import ctypes.util
    try:
        libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        logf = libm.logf
    except (OSError, AttributeError):
        return lambda value: np.float32(math.log(value))
    logf.restype, logf.argtypes = ctypes.c_float, [ctypes.c_float]
    return lambda value: np.float32(logf(value))


_LOGF = _libm_logf()


@functools.lru_cache(maxsize=64)
def _softmax_exp_table(x_scale, reduce_len):
    """onnxruntime's 256-entry exp table of ``QLinearSoftmax``, indexed by ``255 - (max -
    x)``: ``float32(exp((i - 255 + shift) * x_scale))`` in float64 (the C library's
    ``exp``), with ``shift = max(0, logf(FLT_MAX / reduce_len) - 5) / x_scale`` keeping the
    float32 sum of ``reduce_len`` terms finite."""
    largest = np.finfo(np.float32).max
    shift = float(_LOGF(np.float32(largest / np.float32(reduce_len))))
    shift = max(0.0, shift - 5.0) / float(x_scale)
    return np.array([math.exp((float(i) - 255.0 + shift) * float(x_scale))
                     for i in range(256)], dtype=np.float64).astype(np.float32)


def qlinear_softmax(x, x_scale, x_zp, y_scale, y_zp, axis=-1, opset=13, name="QLinearSoftmax"):
    """onnxruntime's ``QLinearSoftmax`` (com.microsoft, ``qlinear_softmax.cc``), uint8 or int8.

    Rows are the ``axis`` dimension (``opset >= 13``) or everything from ``axis`` on
    (older opsets). Per row: ``e = table[255 - (max - x)]`` (:func:`_softmax_exp_table`;
    ``x_zp`` cancels out and is not used), ``sum`` = the float32 sum of ``e`` left to right,
    and each output ``clamp(nearbyint(double(e) * Y / double(sum)) + y_zp)`` in float64
    (round half to even) with ``Y = floorf(1.0f / y_scale)`` in float32 (so
    ``y_scale = 1/255`` gives ``Y = 254``, not 255). This is onnxruntime 1.32's x86-64 code as
    compiled (read from its machine code: ``addss`` for the sum, ``mulsd``/``divsd`` and
    ``nearbyint`` for the output, the clamp to the dtype's range); older releases did the
    last step in float32 and wrapped int8 outputs above 127.
    """
    x = np.asarray(x)
    dtype = x.dtype
    if dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
        raise NPUValueError(f"{name}: the input must be uint8 or int8, not {dtype}")
    if x.ndim == 0:
        raise NPUValueError(f"{name}: the input must have at least one dimension")
    lowest, highest = qtype_range(dtype)
    axis = int(axis)
    if not -x.ndim <= axis < x.ndim:
        raise NPUValueError(f"{name}: axis {axis} is out of range for an input of rank {x.ndim}")
    axis %= x.ndim
    if x.size == 0:
        return x.copy()
    if int(opset) >= 13:
        rows = np.moveaxis(x, axis, -1)
        shape = rows.shape
        rows = rows.reshape(-1, shape[-1])
    else:
        rows = x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)
    reduce_len = rows.shape[1]
    x_scale = np.float32(_scalar(x_scale, "x_scale", name))
    y_scale = np.float32(_scalar(y_scale, "y_scale", name))
    for what, scale in (("x_scale", x_scale), ("y_scale", y_scale)):
        if not (np.isfinite(scale) and scale > 0):
            raise NPUValueError(f"{name}: {what} must be positive and finite, not {scale}")
    table = _softmax_exp_table(x_scale, reduce_len)
    with np.errstate(over="ignore"):
        factor = np.floor(np.float32(1) / y_scale)
    # Where 1.0f / y_scale overflows float32 (a subnormal y_scale) onnxruntime's code takes
    # floor(1.0 / y_scale) in float64 instead.
    factor = float(factor) if np.isfinite(factor) else math.floor(1.0 / float(y_scale))
    zero_point = int(_scalar(y_zp, "y_zero_point", name))
    codes = rows.astype(np.int64)
    exps = table[255 - (codes.max(axis=1, keepdims=True) - codes)]
    total = np.zeros(len(rows), np.float32)
    for column in range(reduce_len):        # float32, left to right, as the kernel adds
        total = (total + exps[:, column]).astype(np.float32)
    # The sum holds the row's maximum, table[255] >= 1, so it is never 0 (the kernel would
    # leave the row unwritten) and the quotient is finite.
    value = np.rint(exps.astype(np.float64) * factor / total[:, None].astype(np.float64))
    out = np.clip(value + zero_point, lowest, highest).astype(dtype)
    if int(opset) >= 13:
        return np.moveaxis(out.reshape(shape), -1, axis)
    return out.reshape(x.shape)
