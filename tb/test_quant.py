"""The requantization reference (``sw.quant``) against an independent scalar implementation.

``scalar_requantize`` below is written from gemmlowp's and TFLite's definitions, one Python
integer at a time (Python integers never overflow, so every saturation is explicit), without
calling ``sw.quant``. The numpy implementation must agree with it bit for bit.
"""

import itertools
import math

import numpy as np
import pytest

from sw.quant import INT32_MAX, INT32_MIN, quantize_multiplier, requantize


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
