"""Random operands for the quantized GEMM and convolution tests (shared by their test files).

The requantization parameters are drawn so that the outputs spread over the INT8 range (with
some clamping at both ends), so that a wrong rounding or a wrong channel cannot hide behind
saturated outputs.
"""

import numpy as np

from sw.quant import quantize_multiplier


__all__ = ["random_int8", "random_requantization", "random_qgemm_problem",
           "random_conv_problem"]


def random_int8(rng, shape):
    # endpoint=True: the whole INT8 range, -128 and 127 included.
    return rng.integers(-128, 127, size=shape, dtype=np.int8, endpoint=True)


def random_requantization(rng, channels, k):
    """``(bias, multiplier, shift, out_zero_point, act_min, act_max)`` for ``channels``
    outputs of ``k``-long full-range INT8 dot products."""
    # A sum of k products of two uniform INT8 values has a spread of about 74 * 74 * sqrt(k).
    spread = 74.0 * 74.0 * np.sqrt(k)
    bias = rng.integers(-int(spread), int(spread), size=channels, endpoint=True).astype(
        np.int32)
    scales = 40.0 / spread * rng.uniform(0.5, 2.0, size=channels)
    pairs = [quantize_multiplier(float(scale)) for scale in scales]
    multiplier = np.array([pair[0] for pair in pairs], dtype=np.int32)
    shift = np.array([pair[1] for pair in pairs], dtype=np.int32)
    out_zero_point = int(rng.integers(-20, 21))
    act_min = int(rng.integers(-128, -90))
    act_max = int(rng.integers(90, 128))
    return bias, multiplier, shift, out_zero_point, act_min, act_max


def random_qgemm_problem(rng, m, k, n, a_zero_point=None):
    """The keyword arguments of :func:`sw.driver.qgemm` for a random ``(m x k) @ (k x n)``."""
    bias, multiplier, shift, out_zero_point, act_min, act_max = random_requantization(
        rng, n, k)
    if a_zero_point is None:
        a_zero_point = int(rng.integers(-128, 128))
    return dict(A=random_int8(rng, (m, k)), B=random_int8(rng, (k, n)), bias=bias,
                multiplier=multiplier, shift=shift, out_zero_point=out_zero_point,
                act_min=act_min, act_max=act_max, a_zero_point=a_zero_point)


def random_conv_problem(rng, batch, height, width, in_channels, out_channels, kernel,
                        stride=1, padding=0, in_zero_point=None):
    """The keyword arguments of :func:`sw.conv.conv2d`; ``kernel`` is an int or (KH, KW)."""
    kernel_height, kernel_width = (kernel, kernel) if np.isscalar(kernel) else kernel
    bias, multiplier, shift, out_zero_point, act_min, act_max = random_requantization(
        rng, out_channels, kernel_height * kernel_width * in_channels)
    if in_zero_point is None:
        in_zero_point = int(rng.integers(-128, 128))
    return dict(x=random_int8(rng, (batch, height, width, in_channels)),
                w=random_int8(rng, (kernel_height, kernel_width, in_channels, out_channels)),
                bias=bias, multiplier=multiplier, shift=shift, stride=stride, padding=padding,
                in_zero_point=in_zero_point, out_zero_point=out_zero_point, act_min=act_min,
                act_max=act_max)
