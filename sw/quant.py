"""The integer requantization of the output path, as a numpy reference.

Per output channel ``j`` with multiplier ``M[j]`` (INT32) and shift ``S[j]`` (-31 .. 31,
positive = right shift), output zero point ``Z`` and clamp ``[lo, hi]``, an INT32 accumulator
value ``acc`` becomes the INT8::

    left  = max(-S, 0)                  right = max(S, 0)
    x     = saturate_int32(acc * 2**left)
    h     = SaturatingRoundingDoublingHighMul(x, M)
    r     = RoundingDivideByPOT(h, right)
    y     = clamp(r + Z, lo, hi)

with gemmlowp's definitions::

    SaturatingRoundingDoublingHighMul(a, b):
        if a == b == -2**31: return 2**31 - 1
        ab    = a * b                                  (64-bit)
        nudge = 2**30 if ab >= 0 else 1 - 2**30
        return (ab + nudge) / 2**31                    (division truncating toward zero)

    RoundingDivideByPOT(x, e):
        mask      = 2**e - 1
        remainder = x & mask
        threshold = (mask >> 1) + (1 if x < 0 else 0)
        return (x >> e) + (1 if remainder > threshold else 0)   (arithmetic shift)

This is TFLite's ``MultiplyByQuantizedMultiplier`` with our sign convention for the shift and
a saturating left shift. The hardware (``hw/requant.py``) implements the same formula;
``docs/quantization.md`` states it for users.

The float mode (:func:`requantize_float`; the same block, its own stages in
``hw/requant_float.py``) is onnxruntime's CPU requantization instead (MLAS
``MlasRequantizeOutput``), with a float32 scale per channel::

    f = float32(acc)                          (round to nearest even)
    f = float32(f * scale)                    (round to nearest even)
    f = min(max(f, float32(lo - Z)), float32(hi - Z))
    y = round_half_to_even(f) + Z
"""

import math

import numpy as np

from .errors import NPUTypeError, NPUValueError


__all__ = ["INT32_MIN", "INT32_MAX", "requantize", "requantize_float", "quantize_multiplier"]


INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1


def _saturating_rounding_doubling_high_mul(a, b):
    a = a.astype(np.int64)
    b = b.astype(np.int64)
    overflow = (a == INT32_MIN) & (b == INT32_MIN)
    # |a * b| <= 2**62, so the product and the nudge fit an int64.
    ab = a * b
    nudged = ab + np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    # Truncating division by 2**31: numpy's // floors, so correct the negative quotients.
    quotient = np.where(nudged >= 0, nudged >> 31, -((-nudged) >> 31))
    return np.where(overflow, INT32_MAX, quotient)


def _rounding_divide_by_pot(x, exponent):
    mask = (np.int64(1) << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def requantize(acc, multiplier, shift, zero_point, act_min, act_max):
    """Requantize INT32 accumulators to INT8, per output channel (the last axis).

    Parameters
    ----------
    acc : array of int32, shape (..., N)
    multiplier, shift : arrays of int32, shape (N,) (or scalars, per tensor)
    zero_point, act_min, act_max : int
        Output zero point and clamp, all within -128 .. 127, ``act_min <= act_max``.

    Returns
    -------
    numpy.ndarray of int8, the shape of ``acc``.
    """
    acc = np.asarray(acc, dtype=np.int64)
    multiplier = np.broadcast_to(np.asarray(multiplier, dtype=np.int64), acc.shape[-1:])
    shift = np.broadcast_to(np.asarray(shift, dtype=np.int64), acc.shape[-1:])
    if np.any(np.abs(shift) > 31):
        raise ValueError(f"shifts must be within -31 .. 31, not {shift[np.abs(shift) > 31]}")
    if not -128 <= act_min <= act_max <= 127:
        raise ValueError(f"need -128 <= act_min <= act_max <= 127, not {act_min}, {act_max}")
    if not -128 <= zero_point <= 127:
        raise ValueError(f"zero_point must be within -128 .. 127, not {zero_point}")
    left = np.maximum(-shift, 0)
    right = np.maximum(shift, 0)
    x = np.clip(acc * (np.int64(1) << left), INT32_MIN, INT32_MAX)
    high = _saturating_rounding_doubling_high_mul(x, multiplier)
    rounded = _rounding_divide_by_pot(high, right)
    return np.clip(rounded + zero_point, act_min, act_max).astype(np.int8)


def _check_int(name, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise NPUTypeError(f"{name} must be an integer, not {value!r}")
    if not -128 <= value <= 127:
        raise NPUValueError(f"{name} must be within -128 .. 127, not {value}")
    return int(value)


def requantize_float(acc, scale, zero_point, act_min, act_max):
    """Requantize INT32 accumulators to INT8 as onnxruntime's CPU kernels do, per output
    channel (the last axis): float32 arithmetic, rounding half to even.

    Parameters
    ----------
    acc : array of int32, shape (..., N)
    scale : numpy.float32 or array of float32, shape (N,)
        Finite; zero, negative and subnormal scales are taken as they are.
    zero_point, act_min, act_max : int
        Output zero point and clamp, all within -128 .. 127, ``act_min <= act_max``.

    Returns
    -------
    numpy.ndarray of int8, the shape of ``acc``.
    """
    acc = np.asarray(acc)
    if acc.dtype != np.int32:
        raise NPUTypeError(f"acc must have dtype int32, not {acc.dtype}")
    if getattr(scale, "dtype", None) != np.float32:
        raise NPUTypeError(f"scale must be float32 (a numpy.float32 or a float32 array), not "
                           f"{getattr(scale, 'dtype', type(scale).__name__)}; a float64 scale "
                           f"would be rounded silently")
    scale = np.asarray(scale)
    if scale.ndim > 1 or (scale.ndim == 1 and acc.shape[-1:] != scale.shape):
        raise NPUValueError(f"scale must be a scalar or have shape {acc.shape[-1:]} (one per "
                            f"channel of acc), not {scale.shape}")
    if not np.all(np.isfinite(scale)):
        bad = np.flatnonzero(~np.isfinite(np.atleast_1d(scale)))[0]
        raise NPUValueError(f"scale must be finite, but scale[{bad}] = "
                            f"{np.atleast_1d(scale)[bad]}")
    zero_point = _check_int("zero_point", zero_point)
    act_min, act_max = _check_int("act_min", act_min), _check_int("act_max", act_max)
    if act_min > act_max:
        raise NPUValueError(f"act_min must not exceed act_max, not {act_min} > {act_max}")
    # int32 -> float64 is exact, so float64 -> float32 is the one rounding (to nearest even).
    value = acc.astype(np.float64).astype(np.float32)
    with np.errstate(over="ignore", under="ignore"):
        value = value * scale                         # float32 * float32, rounded once
    value = np.minimum(np.maximum(value, np.float32(act_min - zero_point)),
                       np.float32(act_max - zero_point))
    return (np.rint(value).astype(np.int32) + zero_point).astype(np.int8)


def quantize_multiplier(real_multiplier):
    """TFLite's ``QuantizeMultiplier``: ``real ~= M * 2**(-31 - S)`` with ``M`` in
    ``[2**30, 2**31)``; returns ``(M, S)`` in this project's convention (positive S = right
    shift). A multiplier of 0 gives ``(0, 0)``."""
    if real_multiplier < 0:
        raise ValueError(f"real_multiplier must not be negative, not {real_multiplier}")
    if real_multiplier == 0:
        return 0, 0
    fraction, exponent = math.frexp(real_multiplier)     # real = fraction * 2**exponent
    quantized = round(fraction * (1 << 31))
    if quantized == 1 << 31:
        quantized //= 2
        exponent += 1
    shift = -exponent
    if shift > 31:
        return 0, 0                                      # smaller than the INT32 output LSB
    if shift < -31:
        raise ValueError(f"real_multiplier {real_multiplier} is too large to represent")
    return quantized, shift
