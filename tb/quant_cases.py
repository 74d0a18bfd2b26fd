"""Random operands for the quantized GEMM and convolution tests (shared by their test files),
and the edge values of the float requantization mode.

The requantization parameters are drawn so that the outputs spread over the INT8 range (with
some clamping at both ends), so that a wrong rounding or a wrong channel cannot hide behind
saturated outputs. ``float_mode=True`` draws float32 scales (``scale=``, with ``multiplier``
and ``shift`` None) instead of multipliers and shifts.
"""

from fractions import Fraction

import numpy as np

from sw.quant import INT32_MAX, INT32_MIN, quantize_multiplier


__all__ = ["random_int8", "random_requantization", "random_qgemm_problem",
           "random_conv_problem", "FLOAT_EDGE_ACCS", "FLOAT_EDGE_SCALES",
           "half_integer_products", "float_ties", "double_rounded"]


#: Accumulators for the float mode: small odd values (ties after a scale of 0.5), those where
#: float32(acc) rounds (|acc| >= 2**24: ties to even both ways, and not ties), the INT32 ends.
FLOAT_EDGE_ACCS = [
    0, 1, -1, 2, -2, 3, -3, 5, -5, 7, -7, 127, 128, 255, 256, 257, 511, -511, 1000, -1000,
    (1 << 24) - 1, 1 << 24, (1 << 24) + 1, (1 << 24) + 2, (1 << 24) + 3, -((1 << 24) + 1),
    -((1 << 24) + 3), (1 << 25) + 1, (1 << 25) + 2, (1 << 25) + 3, (1 << 25) + 6,
    -((1 << 25) + 6), 12345678, -12345678, 33554435, INT32_MAX, INT32_MAX - 64, INT32_MAX - 191,
    INT32_MIN, INT32_MIN + 1, INT32_MIN + 64, 1 << 30, -(1 << 30),
]

#: Scales for the float mode: exact ties (0.5, 1.5, 0.75, 2**-24 * 2.5 with the roundings
#: of float32(acc)), the smallest and largest normal float32, subnormals, zeros, negatives,
#: and scales whose products overflow to infinity.
FLOAT_EDGE_SCALES = np.array([
    0.5, 1.0, 1.5, 0.75, 3.0, -0.5, -1.5, 0.1, 1 / 3, 2.0 ** -8, 2.0 ** -24, 2.5 * 2.0 ** -24,
    3 * 2.0 ** -25, 127.5 * 2.0 ** -24, 2.0 ** -31, 255.5 * 2.0 ** -31, -1.5 * 2.0 ** -24,
    2.0 ** -126, 2.0 ** -130, 1e-45, -1e-45, 0.0, -0.0, 1e30, -3.4028235e38, 255.0,
], dtype=np.float32)


def half_integer_products(accs, halves, neighbours=3):
    """``(acc, scale)`` pairs whose float32 product ``float32(float32(acc) * scale)`` is exactly
    one of ``halves`` (half integers): the scales within ``neighbours`` float32 steps of
    ``half / acc``. Most of them are ties only after the float32 rounding of the product
    (the exact product is a little above or below), where rounding the exact product instead
    would give the other integer."""
    pairs = []
    for acc in accs:
        as_float = np.float32(np.float64(acc))
        for half in halves:
            closest = np.float32(half / float(as_float))
            candidates = [closest]
            for direction in (np.inf, -np.inf):
                scale = closest
                for _ in range(neighbours):
                    scale = np.nextafter(scale, np.float32(direction))
                    candidates.append(scale)
            for scale in candidates:
                if as_float * scale == np.float32(half):
                    pairs.append((int(acc), scale))
    return pairs


def float_ties():
    """``(acc, scale)`` pairs whose float32 product is a half integer: exact ties of both
    parities, ties made by the rounding of float32(acc) (|acc| >= 2**24), and ties made
    only by the float32 rounding of the product (where the exact product rounds the other
    way: up to the tie, its rounding carries into the half bit)."""
    halves = [0.5, 1.5, 2.5, 3.5, 100.5, 127.5, 128.5, 254.5, 255.5]
    halves += [-half for half in halves]
    accs = [1, 3, 7, 11, 13, 99, 1001, 12347, 1234567, 98765431, (1 << 24) + 1,
            (1 << 24) + 3, (1 << 25) + 6, INT32_MAX, INT32_MIN, -3, -13,
            -1234567, -((1 << 24) + 3)]
    return half_integer_products(accs, halves)


def double_rounded(acc, scale):
    """Whether the exact product ``float32(acc) * scale`` differs from the float32 one (which
    may have overflowed to infinity)."""
    as_float = np.float32(np.float64(acc))
    with np.errstate(over="ignore", under="ignore"):
        product = as_float * np.float32(scale)
    return (not np.isfinite(product)
            or Fraction(float(as_float)) * Fraction(float(scale)) != Fraction(float(product)))


def random_int8(rng, shape):
    # endpoint=True: the whole INT8 range, -128 and 127 included.
    return rng.integers(-128, 127, size=shape, dtype=np.int8, endpoint=True)


def random_requantization(rng, channels, k, float_mode=False):
    """``(bias, multiplier, shift, out_zero_point, act_min, act_max)`` for ``channels``
    outputs of ``k``-long full-range INT8 dot products; with ``float_mode``, ``(bias, scale,
    out_zero_point, act_min, act_max)`` with float32 scales, some of them negative."""
    # A sum of k products of two uniform INT8 values has a spread of about 74 * 74 * sqrt(k).
    spread = 74.0 * 74.0 * np.sqrt(k)
    bias = rng.integers(-int(spread), int(spread), size=channels, endpoint=True).astype(
        np.int32)
    scales = 40.0 / spread * rng.uniform(0.5, 2.0, size=channels)
    if float_mode:
        signs = np.where(rng.random(channels) < 0.2, -1.0, 1.0)
        out_zero_point = int(rng.integers(-20, 21))
        return (bias, (signs * scales).astype(np.float32), out_zero_point,
                int(rng.integers(-128, -90)), int(rng.integers(90, 128)))
    pairs = [quantize_multiplier(float(scale)) for scale in scales]
    multiplier = np.array([pair[0] for pair in pairs], dtype=np.int32)
    shift = np.array([pair[1] for pair in pairs], dtype=np.int32)
    out_zero_point = int(rng.integers(-20, 21))
    act_min = int(rng.integers(-128, -90))
    act_max = int(rng.integers(90, 128))
    return bias, multiplier, shift, out_zero_point, act_min, act_max


def _requantization_arguments(rng, channels, k, float_mode):
    """The requantization keywords of :func:`sw.driver.qgemm` and :func:`sw.conv.conv2d`."""
    if float_mode:
        bias, scale, out_zero_point, act_min, act_max = random_requantization(
            rng, channels, k, float_mode=True)
        multiplier = shift = None
    else:
        bias, multiplier, shift, out_zero_point, act_min, act_max = random_requantization(
            rng, channels, k)
        scale = None
    arguments = dict(bias=bias, multiplier=multiplier, shift=shift,
                     out_zero_point=out_zero_point, act_min=act_min, act_max=act_max)
    if float_mode:
        arguments["scale"] = scale
    return arguments


def random_qgemm_problem(rng, m, k, n, a_zero_point=None, float_mode=False):
    """The keyword arguments of :func:`sw.driver.qgemm` for a random ``(m x k) @ (k x n)``."""
    requantization = _requantization_arguments(rng, n, k, float_mode)
    if a_zero_point is None:
        a_zero_point = int(rng.integers(-128, 128))
    return dict(A=random_int8(rng, (m, k)), B=random_int8(rng, (k, n)), **requantization,
                a_zero_point=a_zero_point)


def random_conv_problem(rng, batch, height, width, in_channels, out_channels, kernel,
                        stride=1, padding=0, in_zero_point=None, float_mode=False):
    """The keyword arguments of :func:`sw.conv.conv2d`; ``kernel`` is an int or (KH, KW)."""
    kernel_height, kernel_width = (kernel, kernel) if np.isscalar(kernel) else kernel
    requantization = _requantization_arguments(
        rng, out_channels, kernel_height * kernel_width * in_channels, float_mode)
    if in_zero_point is None:
        in_zero_point = int(rng.integers(-128, 128))
    return dict(x=random_int8(rng, (batch, height, width, in_channels)),
                w=random_int8(rng, (kernel_height, kernel_width, in_channels, out_channels)),
                stride=stride, padding=padding, in_zero_point=in_zero_point, **requantization)
