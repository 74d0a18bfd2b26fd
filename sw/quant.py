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
"""

import math

import numpy as np


__all__ = ["INT32_MIN", "INT32_MAX", "requantize", "quantize_multiplier"]


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
