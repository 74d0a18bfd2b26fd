"""The arithmetic of onnxruntime's quantized kernels that the NPU reproduces, in numpy.

The host's part of a model runs on onnxruntime itself (:mod:`sw.onnx.host`); what is left
here is what the NPU's own datapath must equal bit for bit, on x86-64: the requantization
of an INT32 accumulator in QLinearConv, QLinearMatMul and QGemm (``MlasRequantizeOutput``,
``onnxruntime/core/mlas/lib``): ``float32(acc) * scale`` in float32, clamped, rounded half to
even, ``+ zp``, where the per-channel ``scale`` is ``x_scale * w_scale / y_scale`` evaluated
left to right in float32. ``tb/test_onnx_kernels.py`` confirms both against onnxruntime.
"""

import numpy as np

from ..quant import requantize_float


__all__ = ["qtype_range", "requant_scale", "requantize_output"]


def qtype_range(dtype):
    """``(lowest, highest)`` of an 8-bit quantized dtype."""
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


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
