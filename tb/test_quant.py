"""The requantization reference (``sw.quant``) against an independent scalar implementation.

``scalar_requantize`` below is written from gemmlowp's and TFLite's definitions, one Python
integer at a time (Python integers never overflow, so every saturation is explicit), without
calling ``sw.quant``. The numpy implementation must agree with it bit for bit.

The float mode's reference (``requantize_float``) is checked the same way against
``scalar_requantize_float``, IEEE-754 binary32 arithmetic on exact fractions, and against
onnxruntime itself: a QLinearMatMul whose accumulators are the edge values (a MatMulInteger
beside it shows that they are).
"""

import itertools
import math
import os
from fractions import Fraction

import numpy as np
import pytest

from quant_cases import (FLOAT_EDGE_ACCS, FLOAT_EDGE_SCALES, double_rounded,
                         half_integer_products)
from sw.errors import NPUTypeError, NPUValueError
from sw.quant import INT32_MAX, INT32_MIN, quantize_multiplier, requantize, requantize_float


SEED = 20240917


# The independent scalar model -----------------------------------------------------------------

def saturating_rounding_doubling_high_mul(a, b):
    """gemmlowp's SaturatingRoundingDoublingHighMul on two INT32 values."""
    if a == b == -(1 << 31):
        return (1 << 31) - 1
    product = a * b
    nudge = (1 << 30) if product >= 0 else 1 - (1 << 30)
    nudged = product + nudge
    # C++ integer division truncates toward zero.
    magnitude = abs(nudged) // (1 << 31)
    return magnitude if nudged >= 0 else -magnitude


def rounding_divide_by_power_of_two(x, exponent):
    """gemmlowp's RoundingDivideByPOT: x / 2**exponent, rounded half away from zero."""
    assert 0 <= exponent <= 31
    mask = (1 << exponent) - 1
    remainder = x & mask                      # the low bits of x's two's complement form
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if remainder > threshold else 0)


def saturate_int32(value):
    return max(-(1 << 31), min((1 << 31) - 1, value))


def multiply_by_quantized_multiplier(x, multiplier, tflite_shift):
    """TFLite's MultiplyByQuantizedMultiplier (TFLite's sign: positive = left shift), with the
    left shift saturating instead of overflowing."""
    left_shift = tflite_shift if tflite_shift > 0 else 0
    right_shift = -tflite_shift if tflite_shift < 0 else 0
    shifted = saturate_int32(x * (1 << left_shift))
    return rounding_divide_by_power_of_two(
        saturating_rounding_doubling_high_mul(shifted, multiplier), right_shift)


def scalar_requantize(acc, multiplier, shift, zero_point, act_min, act_max):
    """One output value; ``shift`` in this project's convention (positive = right shift)."""
    value = multiply_by_quantized_multiplier(acc, multiplier, -shift) + zero_point
    return max(act_min, min(act_max, value))


def requantize_each(acc, multiplier, shift, zero_point, act_min, act_max):
    """``sw.quant.requantize`` on a flat list of (acc, multiplier, shift) triples, as a list."""
    result = requantize(np.array(acc, dtype=np.int32).reshape(1, -1),
                        np.array(multiplier, dtype=np.int32),
                        np.array(shift, dtype=np.int32), zero_point, act_min, act_max)
    assert result.dtype == np.int8 and result.shape == (1, len(acc))
    return result[0].tolist()


# The scalar model itself, on values worked out by hand ----------------------------------------

@pytest.mark.parametrize("a, b, expected", [
    (0, 0, 0),
    (1 << 30, 1 << 30, 1 << 29),               # 0.5 * 0.5 = 0.25 of 2**31
    (INT32_MIN, INT32_MIN, INT32_MAX),         # the one overflow
    (INT32_MIN, INT32_MAX, -INT32_MAX),
    (3, 1 << 30, 2),                           # 1.5 rounds up
    (-3, 1 << 30, -1),                         # -1.5: the nudge 1 - 2**30 makes it -1
    (-5, 1 << 30, -2),                         # -2.5 -> -2
    (1, 1 << 30, 1),                           # 0.5 -> 1
    (-1, 1 << 30, 0),                          # -0.5 -> 0
    (100, 1 << 30, 50),
])
def test_scalar_high_mul_by_hand(a, b, expected):
    assert saturating_rounding_doubling_high_mul(a, b) == expected


@pytest.mark.parametrize("x, exponent, expected", [
    (5, 1, 3), (-5, 1, -3), (4, 1, 2), (-4, 1, -2), (7, 2, 2), (-7, 2, -2), (6, 2, 2),
    (-6, 2, -2), (5, 2, 1), (-5, 2, -1), (123, 0, 123), (INT32_MIN, 31, -1),
    (INT32_MAX, 31, 1), ((1 << 30) - 1, 31, 0), (1 << 30, 31, 1), (-(1 << 30), 31, -1),
])
def test_scalar_divide_by_hand(x, exponent, expected):
    assert rounding_divide_by_power_of_two(x, exponent) == expected


def test_scalar_model_is_close_to_the_real_product():
    # Away from saturation, the result is the real product rounded, within one step.
    seed = SEED
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    for _ in range(2000):
        acc = int(rng.integers(-(1 << 20), 1 << 20))
        multiplier = int(rng.integers(1 << 30, 1 << 31))
        shift = int(rng.integers(-8, 20))
        real = acc * multiplier / 2.0 ** (31 + shift)
        got = multiply_by_quantized_multiplier(acc, multiplier, -shift)
        assert abs(got - real) <= 1, (acc, multiplier, shift)


# sw.quant.requantize against the scalar model -------------------------------------------------

ACC_EDGES = [INT32_MIN, INT32_MIN + 1, -(1 << 30) - 1, -(1 << 30), -65536, -257, -3, -2, -1,
             0, 1, 2, 3, 255, 65535, 1 << 30, (1 << 30) + 1, INT32_MAX - 1, INT32_MAX]
MULTIPLIER_EDGES = [INT32_MIN, INT32_MIN + 1, -(1 << 30), -1, 0, 1, 2, 1 << 29, 1 << 30,
                    (1 << 30) + 1, 1518500250, INT32_MAX - 1, INT32_MAX]


def test_edge_values_every_shift():
    triples = list(itertools.product(ACC_EDGES, MULTIPLIER_EDGES, range(-31, 32)))
    accs, multipliers, shifts = (list(column) for column in zip(*triples))
    got = requantize_each(accs, multipliers, shifts, 0, -128, 127)
    expected = [scalar_requantize(*triple, 0, -128, 127) for triple in triples]
    assert got == expected


def test_stages_at_full_int32_precision():
    # Through the public function most edge values end up clamped to -128 or 127. The two
    # gemmlowp stages are therefore also compared on their own, before any clamp (the only
    # place these tests look at sw.quant's private helpers).
    from sw.quant import _rounding_divide_by_pot, _saturating_rounding_doubling_high_mul
    pairs = list(itertools.product(ACC_EDGES, MULTIPLIER_EDGES))
    a = np.array([pair[0] for pair in pairs], dtype=np.int64)
    b = np.array([pair[1] for pair in pairs], dtype=np.int64)
    high = _saturating_rounding_doubling_high_mul(a, b)
    assert high.tolist() == [saturating_rounding_doubling_high_mul(*pair) for pair in pairs]
    values = np.array(ACC_EDGES, dtype=np.int64)
    for exponent in range(32):
        got = _rounding_divide_by_pot(values, np.int64(exponent))
        assert got.tolist() == [rounding_divide_by_power_of_two(int(value), exponent)
                                for value in ACC_EDGES], exponent


def test_random_values():
    seed = SEED + 1
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    for trial in range(40):
        count = 500
        # Alternate full-range accumulators with small ones, so the clamp does not hide the
        # rounding.
        bound = 1 << 31 if trial % 2 else 1 << int(rng.integers(8, 24))
        accs = rng.integers(-bound, bound, count, dtype=np.int64).clip(INT32_MIN, INT32_MAX)
        multipliers = rng.integers(INT32_MIN, INT32_MAX, count, dtype=np.int64, endpoint=True)
        if trial % 4 == 0:
            multipliers = rng.integers(1 << 30, 1 << 31, count, dtype=np.int64)
        shifts = rng.integers(-31, 31, count, endpoint=True)
        zero_point = int(rng.integers(-128, 128))
        act_min, act_max = sorted(int(value) for value in rng.integers(-128, 128, 2))
        got = requantize_each(accs.tolist(), multipliers.tolist(), shifts.tolist(),
                              zero_point, act_min, act_max)
        expected = [scalar_requantize(int(acc), int(multiplier), int(shift), zero_point,
                                      act_min, act_max)
                    for acc, multiplier, shift in zip(accs, multipliers, shifts)]
        assert got == expected, f"trial {trial}"


def test_every_zero_point():
    seed = SEED + 2
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    accs = rng.integers(-5000, 5000, 64).tolist() + [INT32_MIN, INT32_MAX, 0]
    multipliers = rng.integers(1 << 30, 1 << 31, len(accs)).tolist()
    shifts = rng.integers(0, 8, len(accs)).tolist()
    for zero_point in range(-128, 128):
        got = requantize_each(accs, multipliers, shifts, zero_point, -128, 127)
        expected = [scalar_requantize(acc, multiplier, shift, zero_point, -128, 127)
                    for acc, multiplier, shift in zip(accs, multipliers, shifts)]
        assert got == expected, f"zero point {zero_point}"


def test_every_clamp():
    # One accumulator per possible pre-clamp value -128 .. 127 (and beyond), identity scale:
    # multiplier 2**30 with shift -1 is exactly x.
    accs = list(range(-140, 141))
    multipliers = [1 << 30] * len(accs)
    shifts = [-1] * len(accs)
    assert [scalar_requantize(acc, 1 << 30, -1, 0, -128, 127) for acc in accs] == \
        [max(-128, min(127, acc)) for acc in accs]
    for act_min in range(-128, 128):
        for act_max in itertools.chain(range(act_min, 128, 7), [127]):
            got = requantize_each(accs, multipliers, shifts, 0, act_min, act_max)
            expected = [max(act_min, min(act_max, acc)) for acc in accs]
            assert got == expected, (act_min, act_max)
    # act_min == act_max pins every output.
    assert set(requantize_each(accs, multipliers, shifts, 0, 9, 9)) == {9}


def test_per_channel_broadcast_and_shapes():
    seed = SEED + 3
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    acc = rng.integers(-100_000, 100_000, (3, 4, 5)).astype(np.int32)
    multipliers = rng.integers(1 << 30, 1 << 31, 5).astype(np.int32)
    shifts = rng.integers(0, 12, 5).astype(np.int32)
    got = requantize(acc, multipliers, shifts, -7, -100, 90)
    assert got.shape == acc.shape and got.dtype == np.int8
    for index in np.ndindex(acc.shape):
        channel = index[-1]
        assert got[index] == scalar_requantize(int(acc[index]), int(multipliers[channel]),
                                               int(shifts[channel]), -7, -100, 90)
    # Scalars are per-tensor parameters.
    per_tensor = requantize(acc, int(multipliers[0]), int(shifts[0]), 0, -128, 127)
    assert np.array_equal(per_tensor, requantize(acc, np.full(5, multipliers[0]),
                                                 np.full(5, shifts[0]), 0, -128, 127))


@pytest.mark.parametrize("arguments, match", [
    ((0, 1, 32, 0, -128, 127), "shifts"),
    ((0, 1, -32, 0, -128, 127), "shifts"),
    ((0, 1, 0, 128, -128, 127), "zero_point"),
    ((0, 1, 0, -129, -128, 127), "zero_point"),
    ((0, 1, 0, 0, 5, 4), "act_min"),
    ((0, 1, 0, 0, -129, 127), "act_min"),
    ((0, 1, 0, 0, -128, 128), "act_max"),
])
def test_requantize_rejects_bad_parameters(arguments, match):
    acc, multiplier, shift, *rest = arguments
    with pytest.raises(ValueError, match=match):
        requantize(np.array([[acc]], dtype=np.int32), multiplier, shift, *rest)


# quantize_multiplier --------------------------------------------------------------------------

@pytest.mark.parametrize("real, expected", [
    (0.0, (0, 0)),
    (0.5, (1 << 30, 0)),
    (1.0, (1 << 30, -1)),
    (0.25, (1 << 30, 1)),
    (0.75, (3 << 29, 0)),
    (1 - 2.0 ** -40, (1 << 30, -1)),         # rounds up to 2**31: renormalised
    (2.0 ** -32, (1 << 30, 31)),             # the smallest shift-31 multiplier
    (2.0 ** -33, (0, 0)),                    # below the output's resolution
    (2.0 ** 30, (1 << 30, -31)),             # the largest left shift
])
def test_quantize_multiplier_values(real, expected):
    assert quantize_multiplier(real) == expected


def test_quantize_multiplier_random_reals():
    seed = SEED + 4
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    for real in np.exp(rng.uniform(math.log(2.0 ** -32), math.log(2.0 ** 30), 2000)):
        real = float(real)
        multiplier, shift = quantize_multiplier(real)
        assert 1 << 30 <= multiplier < 1 << 31
        assert -31 <= shift <= 31
        represented = multiplier * 2.0 ** (-31 - shift)
        assert abs(represented - real) <= real * 2.0 ** -31, real


def test_quantize_multiplier_drives_requantize():
    # The usual use: a float scale in (0, 1) turned into (M, S), applied to an accumulator, is
    # the float product rounded to within one step.
    seed = SEED + 5
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    for scale in rng.uniform(1e-5, 1.0, 200):
        multiplier, shift = quantize_multiplier(float(scale))
        accs = rng.integers(-20_000, 20_000, 50).astype(np.int32)
        got = requantize(accs.reshape(1, -1), multiplier, shift, 0, -128, 127)[0]
        real = np.clip(accs * scale, -128, 127)
        assert np.all(np.abs(got - real) <= 1), scale


@pytest.mark.parametrize("real, error", [(-0.5, "negative"), (2.0 ** 31, "too large"),
                                         (1e12, "too large")])
def test_quantize_multiplier_rejects(real, error):
    with pytest.raises(ValueError, match=error):
        quantize_multiplier(real)


# requantize_float: onnxruntime's float32 arithmetic ----------------------------------------

def round_to_float32(value):
    """The binary32 number nearest to the fraction ``value`` (ties to even), subnormals
    included; ``math.inf`` (signed) past the largest finite one."""
    if value == 0:
        return Fraction(0)
    magnitude = abs(value)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:
        exponent -= 1                                  # now 2**exponent <= magnitude
    step = Fraction(2) ** (max(exponent, -126) - 23)  # the spacing of binary32 there
    rounded = round(magnitude / step) * step          # round() on a Fraction: half to even
    if rounded >= Fraction(2) ** 128:
        rounded = math.inf
    return rounded if value > 0 else -rounded


def scalar_requantize_float(acc, scale, zero_point, act_min, act_max):
    """MLAS ``MlasRequantizeOutput`` on one value, written from IEEE 754: int32 to float,
    multiply, clamp to the bounds minus the zero point, convert with round half to even."""
    product = round_to_float32(round_to_float32(Fraction(acc)) * Fraction(float(scale)))
    clamped = min(max(product, act_min - zero_point), act_max - zero_point)
    return round(clamped) + zero_point


def _ties():
    halves = [0.5, 1.5, 2.5, 3.5, 100.5, 127.5, 128.5, 254.5]
    halves += [-half for half in halves]
    return half_integer_products([1, 3, 7, 11, 13, 99, 1001, 12347, 1234567, 98765431,
                                  (1 << 24) + 1, (1 << 24) + 3, -3, -13, -1234567], halves)


def test_round_to_float32_by_hand():
    assert round_to_float32(Fraction((1 << 24) + 1)) == 1 << 24            # tie to even
    assert round_to_float32(Fraction((1 << 24) + 3)) == (1 << 24) + 4      # tie to even
    assert round_to_float32(Fraction(-(1 << 25) - 3)) == -(1 << 25) - 4
    assert round_to_float32(Fraction(1, 3)) == Fraction(float(np.float32(1 / 3)))
    assert round_to_float32(Fraction(2) ** -149 * Fraction(3, 2)) == Fraction(2) ** -148
    assert round_to_float32(Fraction(2) ** -150) == 0                      # tie to even: 0
    assert round_to_float32(Fraction(2) ** 128) == math.inf


@pytest.mark.parametrize("acc, scale, zero_point, act_min, act_max, expected", [
    (5, 0.5, 0, -128, 127, 2),                    # 2.5: to even
    (7, 0.5, 0, -128, 127, 4),                    # 3.5: to even
    (-5, 0.5, 0, -128, 127, -2),
    (-7, 0.5, 3, -128, 127, 3 - 4),
    ((1 << 24) + 1, 2.5 * 2.0 ** -24, 0, -128, 127, 2),   # float32(acc) = 2**24: 2.5
    ((1 << 24) + 3, 2.5 * 2.0 ** -24, 0, -128, 127, 3),   # 2**24 + 4: 2.5000006
    (3, float(np.nextafter(np.float32(2.5 / 3), np.float32(1))), 0, -128, 127, 2),
    (INT32_MIN, 2.0 ** -31 * 100, 0, -128, 127, -100),
    (INT32_MAX, 2.0 ** -31 * 100, 0, -128, 127, 100),     # float32(2**31 - 1) = 2**31
    (1000, 1e30, 0, -128, 127, 127),                        # overflows to inf
    (1000, -3.4028235e38, -5, -100, 50, -100),
    (12345, 1e-45, 7, -128, 127, 7),                        # subnormal scale
    (0, 1e30, -128, -128, 127, -128),
    (300, 0.5, 0, 5, 100, 100),
    (-300, 0.5, 0, 5, 100, 5),
])
def test_requantize_float_by_hand(acc, scale, zero_point, act_min, act_max, expected):
    got = requantize_float(np.array([acc], np.int32), np.array([scale], np.float32),
                           zero_point, act_min, act_max)
    assert got.dtype == np.int8 and got.tolist() == [expected]
    assert scalar_requantize_float(acc, np.float32(scale), zero_point, act_min,
                                   act_max) == expected


def test_requantize_float_against_the_scalar_model():
    seed = SEED + 6
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    pairs = [(acc, scale) for acc in FLOAT_EDGE_ACCS for scale in FLOAT_EDGE_SCALES]
    pairs += _ties()
    magnitude = rng.integers(0, 32, 300)
    accs = rng.integers(INT32_MIN, INT32_MAX, 300, endpoint=True) >> magnitude
    scales = (rng.uniform(0.5, 1, 300) * 2.0 ** rng.integers(-40, 6, 300)
              * rng.choice([-1, 1], 300)).astype(np.float32)
    pairs += list(zip(accs.tolist(), scales))
    assert sum(double_rounded(*pair) for pair in pairs) >= 100
    for zero_point, act_min, act_max in [(0, -128, 127), (-128, -128, 127), (127, -128, 127),
                                         (-3, -10, 6)]:
        accs = np.array([acc for acc, _ in pairs], np.int32)
        scales = np.array([scale for _, scale in pairs], np.float32)
        got = [int(requantize_float(np.array([acc], np.int32), np.array([scale], np.float32),
                                    zero_point, act_min, act_max)[0])
               for acc, scale in zip(accs, scales)]
        want = [scalar_requantize_float(int(acc), scale, zero_point, act_min, act_max)
                for acc, scale in zip(accs, scales)]
        assert got == want, next((pair, g, w) for pair, g, w in zip(pairs, got, want) if g != w)


def test_requantize_float_per_channel_and_shapes():
    acc = np.arange(-30, 30, dtype=np.int32).reshape(2, 3, 10)
    scale = np.linspace(-2, 2, 10).astype(np.float32)
    got = requantize_float(acc, scale, 1, -128, 127)
    assert got.shape == acc.shape and got.dtype == np.int8
    for index in np.ndindex(acc.shape):
        assert got[index] == scalar_requantize_float(int(acc[index]), scale[index[-1]], 1,
                                                     -128, 127)
    per_tensor = requantize_float(acc, np.float32(0.5), 0, -128, 127)
    assert np.array_equal(per_tensor, requantize_float(acc, np.full(10, 0.5, np.float32), 0,
                                                       -128, 127))


@pytest.mark.parametrize("scale, error, match", [
    (np.array([0.5, 0.5]), NPUTypeError, "scale must be float32"),
    (0.5, NPUTypeError, "scale must be float32"),
    (np.array([0.5, np.nan], np.float32), NPUValueError, r"scale\[1\] = nan"),
    (np.array([np.inf, 1], np.float32), NPUValueError, r"scale\[0\] = inf"),
    (np.array([0.5, 0.5, 0.5], np.float32), NPUValueError, r"shape \(2,\)"),
])
def test_requantize_float_rejects_bad_scales(scale, error, match):
    with pytest.raises(error, match=match):
        requantize_float(np.zeros((1, 2), np.int32), scale, 0, -128, 127)


@pytest.mark.parametrize("arguments, error, match", [
    ((128, -128, 127), NPUValueError, "zero_point"),
    ((-129, -128, 127), NPUValueError, "zero_point"),
    ((0.0, -128, 127), NPUTypeError, "zero_point must be an integer"),
    ((0, 5, 4), NPUValueError, "act_min must not exceed act_max"),
    ((0, -129, 127), NPUValueError, "act_min"),
    ((0, -128, 128), NPUValueError, "act_max"),
])
def test_requantize_float_rejects_bad_operands(arguments, error, match):
    with pytest.raises(error, match=match):
        requantize_float(np.zeros((1, 1), np.int32), np.float32(1), *arguments)


def test_requantize_float_rejects_a_wider_accumulator():
    with pytest.raises(NPUTypeError, match="acc must have dtype int32"):
        requantize_float(np.zeros((1, 1), np.int64), np.float32(1), 0, -128, 127)


# onnxruntime: accumulator i of a QLinearMatMul with constant weights is 64 * S_i + r_i, the
# sum of A's row i times weight rows of 64 and a last weight row of 1; scale_A = scale_Y = 1
# makes its output scale exactly scale_B (per column). Products of 127 * 64 keep clear of the
# int16 saturation of AVX2's u8 x s8 pair sums.
_UNIT = 64


def _onnx_session(accs, scales):
    onnx = pytest.importorskip("onnx")
    onnxruntime = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper
    terms = max(abs(acc) for acc in accs) // (_UNIT * 127) + 2
    weights = np.zeros((terms + 1, len(scales)), np.int8)
    weights[:terms], weights[terms] = _UNIT, 1
    activations = np.zeros((len(accs), terms + 1), np.int8)
    for row, acc in enumerate(accs):
        units = round(acc / _UNIT)
        full, rest = divmod(abs(units), 127)
        sign = 1 if units >= 0 else -1
        activations[row, :full] = 127 * sign
        activations[row, full] = rest * sign
        activations[row, terms] = acc - _UNIT * units
    initializers = [
        numpy_helper.from_array(weights, "B"),
        numpy_helper.from_array(np.float32(1), "a_scale"),
        numpy_helper.from_array(np.int8(0), "a_zero_point"),
        numpy_helper.from_array(np.asarray(scales, np.float32), "b_scale"),
        numpy_helper.from_array(np.zeros(len(scales), np.int8), "b_zero_point"),
        numpy_helper.from_array(np.float32(1), "y_scale")]
    nodes = [helper.make_node("QLinearMatMul", ["A", "a_scale", "a_zero_point", "B", "b_scale",
                                                "b_zero_point", "y_scale", "y_zero_point"],
                              ["Y"]),
             helper.make_node("MatMulInteger", ["A", "B"], ["ACC"])]
    graph = helper.make_graph(
        nodes, "requantize", [helper.make_tensor_value_info("A", TensorProto.INT8, [None, None]),
                              helper.make_tensor_value_info("y_zero_point", TensorProto.INT8,
                                                            [])],
        [helper.make_tensor_value_info("Y", TensorProto.INT8, [None, len(scales)]),
         helper.make_tensor_value_info("ACC", TensorProto.INT32, [None, len(scales)])],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return session, activations


def _compare_with_onnxruntime(accs, scales):
    session, activations = _onnx_session(accs, scales)
    for zero_point in (-128, -1, 0, 5, 127):
        y, acc = session.run(None, {"A": activations,
                                    "y_zero_point": np.array(zero_point, np.int8)})
        assert np.array_equal(acc, np.repeat(np.array(accs, np.int32)[:, None], len(scales), 1))
        want = requantize_float(acc, np.asarray(scales, np.float32), zero_point, -128, 127)
        wrong = np.argwhere(y != want)
        assert not wrong.size, [(accs[r], scales[c], zero_point, y[r, c], want[r, c])
                                for r, c in wrong[:5]]


def test_requantize_float_equals_onnxruntime_on_the_edges():
    _compare_with_onnxruntime(FLOAT_EDGE_ACCS, FLOAT_EDGE_SCALES)


def test_requantize_float_equals_onnxruntime_on_ties():
    pairs = _ties()
    assert sum(double_rounded(*pair) for pair in pairs) >= 100
    _compare_with_onnxruntime(sorted({acc for acc, _ in pairs}),
                              np.array([scale for _, scale in pairs], np.float32))


def test_requantize_float_equals_onnxruntime_on_random_values():
    seed = int(os.environ.get("NPU_SEED", SEED + 7))
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    magnitude = rng.integers(0, 32, 60)
    accs = (rng.integers(INT32_MIN, INT32_MAX, 60, endpoint=True) >> magnitude).tolist()
    scales = (rng.uniform(0.5, 1, 24) * 2.0 ** rng.integers(-36, 4, 24)
              * rng.choice([-1, 1], 24)).astype(np.float32)
    _compare_with_onnxruntime(accs, scales)
