"""The checks of the host's numpy operands, shared by :mod:`sw.driver`, :mod:`sw.conv` and
:mod:`sw.reference`: each refuses a bad operand with an error that names it."""

import numpy as np

from hw.config import MAX_K, NPUConfig
from hw.isa import QuantMode
from . import backend
from .compiler import Conv2dGeometry
from .errors import NPUTypeError, NPUValueError


__all__ = ["check_config", "check_config_and_sim", "check_int", "check_int8_array",
           "check_channel_vector", "check_requantization", "check_matrix",
           "check_gemm_operands", "check_qgemm_operands", "check_conv2d_operands"]


def check_config(config):
    """The config (``NPUConfig()`` for ``None``), after checking its type."""
    if config is None:
        config = NPUConfig()
    if not isinstance(config, NPUConfig):
        raise NPUTypeError(f"config must be an NPUConfig, not {config!r}")
    return config


def check_config_and_sim(config, sim):
    """The config (``NPUConfig()`` for ``None``), after checking it and ``sim``."""
    config = check_config(config)
    if sim not in backend.SIMULATORS:
        raise NPUValueError(f"sim must be one of {', '.join(backend.SIMULATORS)}, "
                            f"not {sim!r}")
    return config


def check_int(name, value, low, high):
    """``value`` as a Python int within ``low .. high``; bools and floats are refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise NPUTypeError(f"{name} must be an integer, not {value!r}")
    value = int(value)
    if not low <= value <= high:
        raise NPUValueError(f"{name} must be within {low} .. {high}, not {value}")
    return value


def check_int8_array(name, array, ndim, what):
    """Refuse anything but a non-empty ``ndim``-dimensional int8 numpy array."""
    if not isinstance(array, np.ndarray):
        raise NPUTypeError(f"{name} must be a numpy array of int8, not {type(array).__name__}")
    if array.dtype != np.int8:
        raise NPUTypeError(f"{name} must have dtype int8, not {array.dtype}; quantize it "
                           f"explicitly (the NPU computes INT8 x INT8 only)")
    if array.ndim != ndim:
        raise NPUValueError(f"{name} must be {what} ({ndim} dimensions), not of shape "
                            f"{array.shape}")
    if array.size == 0:
        raise NPUValueError(f"{name} must not be empty, but its shape is {array.shape}")


def check_channel_vector(name, vector, channels, what):
    """Refuse anything but an int32 numpy array of shape ``(channels,)``."""
    if not isinstance(vector, np.ndarray):
        raise NPUTypeError(f"{name} must be a numpy array of int32, not "
                           f"{type(vector).__name__}")
    if vector.dtype != np.int32:
        raise NPUTypeError(f"{name} must have dtype int32, not {vector.dtype}")
    if vector.shape != (channels,):
        raise NPUValueError(f"{name} must have shape ({channels},), one value per {what}, "
                            f"not {vector.shape}")


def check_requantization(multiplier, shift, out_zero_point, act_min, act_max, channels,
                         what, scale=None):
    """Check the requantization operands: the per-channel multipliers and shifts, or (float
    mode) the float32 scales, exactly one of the two; and the output zero point and clamp.
    Return ``(quant_mode, out_zero_point, act_min, act_max)``."""
    given = [name for name, value in (("multiplier", multiplier), ("shift", shift))
             if value is not None]
    if scale is not None:
        if given:
            raise NPUValueError(f"give either multiplier and shift or scale, not both: scale "
                                f"and {' and '.join(given)} were given")
        quant_mode = QuantMode.FLOAT
        if not isinstance(scale, np.ndarray) or scale.dtype != np.float32:
            raise NPUTypeError(f"scale must be a numpy array of float32 (one per {what}), not "
                               f"{getattr(scale, 'dtype', type(scale).__name__)}")
        if scale.shape != (channels,):
            raise NPUValueError(f"scale must have shape ({channels},), one value per {what}, "
                                f"not {scale.shape}")
        bad = np.flatnonzero(~np.isfinite(scale))
        if bad.size:
            raise NPUValueError(f"scale must be finite, but scale[{bad[0]}] = {scale[bad[0]]}")
    else:
        if len(given) < 2:
            raise NPUValueError(f"give multiplier and shift (the fixed-point requantization) "
                                f"or scale (the float one); only "
                                f"{' and '.join(given) or 'neither'} was given")
        quant_mode = QuantMode.FIXED
        check_channel_vector("multiplier", multiplier, channels, what)
        check_channel_vector("shift", shift, channels, what)
        bad = np.flatnonzero((shift < -31) | (shift > 31))
        if bad.size:
            raise NPUValueError(f"shift must be within -31 .. 31, but shift[{bad[0]}] = "
                                f"{shift[bad[0]]}")
    out_zero_point = check_int("out_zero_point", out_zero_point, -128, 127)
    act_min = check_int("act_min", act_min, -128, 127)
    act_max = check_int("act_max", act_max, -128, 127)
    if act_min > act_max:
        raise NPUValueError(f"act_min must not exceed act_max, but act_min = {act_min} and "
                            f"act_max = {act_max}")
    return quant_mode, out_zero_point, act_min, act_max



def check_matrix(name, matrix):
    if not isinstance(matrix, np.ndarray):
        raise NPUTypeError(f"{name} must be a numpy array of int8, not {type(matrix).__name__}")
    if matrix.dtype != np.int8:
        # Casting would silently clip or round; the caller must quantize explicitly.
        raise NPUTypeError(f"{name} must have dtype int8, not {matrix.dtype}; quantize it "
                           f"explicitly (the NPU computes INT8 x INT8 only)")
    if matrix.ndim != 2:
        raise NPUValueError(f"{name} must be two-dimensional, not of shape {matrix.shape}")
    if matrix.size == 0:
        raise NPUValueError(f"{name} must not be empty, but its shape is {matrix.shape}")


def check_gemm_operands(A, B):
    """Refuse anything but int8 matrices A and B that can be multiplied on the NPU."""
    check_matrix("A", A)
    check_matrix("B", B)
    if A.shape[1] != B.shape[0]:
        raise NPUValueError(f"inner dimensions differ: A is {A.shape[0]}x{A.shape[1]} and B is "
                            f"{B.shape[0]}x{B.shape[1]} (A's columns must equal B's rows)")
    if A.shape[1] > MAX_K:
        raise NPUValueError(f"K = {A.shape[1]} is larger than MAX_K = {MAX_K}: a longer INT8 "
                            f"dot product could overflow the INT32 accumulator")



def check_qgemm_operands(A, B, bias, multiplier, shift, scale, out_zero_point, act_min,
                         act_max, a_zero_point):
    """Check the operands of :func:`sw.driver.qgemm`; return ``(quant_mode, out_zero_point,
    act_min, act_max, a_zero_point)``."""
    check_gemm_operands(A, B)
    n = B.shape[1]
    check_channel_vector("bias", bias, n, "column of B")
    quant_mode, out_zero_point, act_min, act_max = check_requantization(
        multiplier, shift, out_zero_point, act_min, act_max, n, "column of B", scale)
    a_zero_point = check_int("a_zero_point", a_zero_point, -128, 127)
    return quant_mode, out_zero_point, act_min, act_max, a_zero_point



def check_conv2d_operands(x, w, bias, multiplier, shift, scale, stride, padding,
                          in_zero_point, out_zero_point, act_min, act_max):
    """Check the operands of :func:`sw.conv.conv2d`; return ``(geometry, quant_mode,
    in_zero_point, out_zero_point, act_min, act_max)``."""
    check_int8_array("x", x, 4, "an NHWC tensor")
    check_int8_array("w", w, 4, "an HWIO weight tensor")
    if w.shape[2] != x.shape[3]:
        raise NPUValueError(f"input channels differ: x has {x.shape[3]} (shape {x.shape}) and "
                            f"w has {w.shape[2]} (shape {w.shape}, HWIO)")
    out_channels = w.shape[3]
    check_channel_vector("bias", bias, out_channels, "output channel")
    quant_mode, out_zero_point, act_min, act_max = check_requantization(
        multiplier, shift, out_zero_point, act_min, act_max, out_channels, "output channel",
        scale)
    in_zero_point = check_int("in_zero_point", in_zero_point, -128, 127)
    batch, height, width, in_channels = x.shape
    geometry = Conv2dGeometry(batch=batch, height=height, width=width,
                              in_channels=in_channels, out_channels=out_channels,
                              kernel_height=w.shape[0], kernel_width=w.shape[1],
                              stride=stride, padding=padding)
    return geometry, quant_mode, in_zero_point, out_zero_point, act_min, act_max

