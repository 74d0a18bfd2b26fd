"""The exact results the NPU must return, computed plainly with numpy: the one reference of
GEMM and convolution in the project. :func:`sw.driver.gemm`, :func:`sw.driver.qgemm`,
:func:`sw.conv.conv2d` (re-exported from those modules) and the quantized networks'
operators (:mod:`sw.nn.reference`, which the ONNX front end lowers to) are checked against it.

INT32 overflow: every sum is taken in INT64 and then wrapped to INT32 with two's complement
(:func:`wrap_int32`), because that is what the hardware's accumulator does. A model whose
sums leave the INT32 range is wrong on the NPU and in this reference alike, in the same way;
the compiler keeps K at most :data:`hw.config.MAX_K`, where INT8 x INT8 products cannot
overflow, and only a bias can push a sum out of range."""

import numpy as np

from hw.config import MAX_K
from .operands import check_conv2d_operands, check_qgemm_operands
from .quant import requantize, requantize_float


__all__ = ["INT32_MIN", "INT32_MAX", "wrap_int32", "gemm_int32", "conv2d_int32",
           "reference_requantize", "reference_gemm", "reference_qgemm", "reference_conv2d"]


INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1


def wrap_int32(values):
    """INT64 values reduced to INT32 with two's complement wrap-around, as the accumulator."""
    return ((np.asarray(values, dtype=np.int64) - INT32_MIN) % (1 << 32) + INT32_MIN).astype(
        np.int32)



def gemm_int32(a, b, bias=None, a_zero_point=0):
    """The accumulators of ``(a - a_zero_point) @ b + bias`` (wrapped to INT32)."""
    acc = (np.asarray(a).astype(np.int64) - a_zero_point) @ np.asarray(b).astype(np.int64)
    if bias is not None:
        acc += np.asarray(bias).astype(np.int64)
    return wrap_int32(acc)


def conv2d_int32(x, w, bias=None, *, stride=1, padding=0, pad_value=0, in_zero_point=0):
    """The accumulators of a 2-D convolution (wrapped to INT32), as the array sums them.

    ``x`` is ``batch x H x W x C`` (NHWC), ``w`` is ``KH x KW x C x C_out`` (HWIO); the
    border is ``padding`` pixels (an int, or ``(top, bottom, left, right)``) of
    ``pad_value``, and ``in_zero_point`` is subtracted from every input (the border
    included) before the products.
    """
    x = np.asarray(x)
    w = np.asarray(w)
    top, bottom, left, right = (padding,) * 4 if np.isscalar(padding) else padding
    padded = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)),
                    constant_values=pad_value)
    centred = padded.astype(np.int64) - in_zero_point
    kernel_h, kernel_w = w.shape[:2]
    out_h = (padded.shape[1] - kernel_h) // stride + 1
    out_w = (padded.shape[2] - kernel_w) // stride + 1
    acc = np.zeros((x.shape[0], out_h, out_w, w.shape[3]), dtype=np.int64)
    for kh in range(kernel_h):
        for kw in range(kernel_w):
            window = centred[:, kh:kh + stride * (out_h - 1) + 1:stride,
                             kw:kw + stride * (out_w - 1) + 1:stride, :]
            acc += window @ w[kh, kw].astype(np.int64)
    if bias is not None:
        acc += np.asarray(bias).astype(np.int64)
    return wrap_int32(acc)


def reference_requantize(acc, multiplier, shift, scale, out_zero_point, act_min, act_max):
    """:func:`sw.quant.requantize`, or :func:`sw.quant.requantize_float` if ``scale`` is
    given, of checked operands."""
    if scale is not None:
        return requantize_float(acc, scale, out_zero_point, act_min, act_max)
    return requantize(acc, multiplier, shift, out_zero_point, act_min, act_max)



def reference_gemm(A, B):
    """The exact product the NPU must return: ``A.astype(int32) @ B.astype(int32)``.

    Up to :data:`hw.config.MAX_K` it is computed in float64 by BLAS: every partial sum is an
    integer below 2^31, exact in float64 whatever the order of the additions, and numpy's
    integer matmul (no BLAS) took 0.2 s of the 512^3 ``npu gemm`` against 0.01 s."""
    if A.ndim == 2 and A.shape[1] <= MAX_K and A.dtype == B.dtype == np.int8:
        return (A.astype(np.float64) @ B.astype(np.float64)).astype(np.int32)
    return A.astype(np.int32) @ B.astype(np.int32)


def reference_qgemm(A, B, bias, multiplier=None, shift=None, *, scale=None, out_zero_point,
                    act_min, act_max, a_zero_point=0):
    """The exact result :func:`sw.driver.qgemm` must return.

    ``requantize((A - a_zero_point) @ B + bias)``, with the sum taken in INT64 and then
    wrapped to INT32 as the accumulator wraps (a sum that does not fit INT32 is an overflow
    in the hardware and in TFLite alike; the NPU wraps around, and so does this reference).
    It equals ``requantize(A @ B + (bias - a_zero_point * B.sum(axis=0)))``, the folded form
    the NPU computes, because the two sums are the same integers. ``requantize`` is
    :func:`sw.quant.requantize`, or :func:`sw.quant.requantize_float` given ``scale``.
    """
    _, out_zero_point, act_min, act_max, a_zero_point = check_qgemm_operands(
        A, B, bias, multiplier, shift, scale, out_zero_point, act_min, act_max, a_zero_point)
    return reference_requantize(gemm_int32(A, B, bias, a_zero_point), multiplier, shift, scale,
                                out_zero_point, act_min, act_max)


def reference_conv2d(x, w, bias, multiplier=None, shift=None, *, scale=None, stride=1,
                     padding=0, in_zero_point=0, out_zero_point, act_min, act_max):
    """The exact result :func:`sw.conv.conv2d` must return, computed plainly with numpy.

    The input is padded with ``in_zero_point``, the zero point subtracted, every tap's
    products summed with the bias in INT64 and wrapped to INT32 (as the accumulator wraps),
    then requantized per output channel with :func:`sw.quant.requantize` (or, given
    ``scale``, :func:`sw.quant.requantize_float`).

    Returns
    -------
    numpy.ndarray
        ``int8``, ``batch x OH x OW x C_out``.
    """
    geometry, _, in_zero_point, out_zero_point, act_min, act_max = check_conv2d_operands(
        x, w, bias, multiplier, shift, scale, stride, padding, in_zero_point, out_zero_point,
        act_min, act_max)
    acc = conv2d_int32(x, w, bias, stride=geometry.stride, padding=geometry.padding,
                       pad_value=in_zero_point, in_zero_point=in_zero_point)
    return reference_requantize(acc, multiplier, shift, scale, out_zero_point, act_min,
                                act_max)
