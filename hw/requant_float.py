"""The float mode of the requantizer (:class:`~hw.requant.Requantizer`): onnxruntime's
requantization (MLAS ``MlasRequantizeOutput``) of INT32 accumulators to INT8, per output
channel, from integer logic only. For each lane ``j`` with the float32 ``scale[j]``::

    f = float32(acc)                          round to nearest even
    f = float32(f * scale[j])                 round to nearest even
    y = clamp(round_half_to_even(f) + zero_point, act_min, act_max)

(clamping before the rounding, as MLAS does, gives the same: the bounds are integers).
``float32(acc)`` is ``t * 2**(8 - lz)``: ``lz`` normalises ``|acc|`` to bit 31 and ``t`` is
its top 24 bits rounded to nearest even, 25 bits wide because the rounding may carry out
(and a negative power of two normalises one bit further, to ``2**24``). With the scale's
significand ``s`` (24 bits, the hidden one included) the exact product ``P = t * s`` is
below ``2**48`` and at least ``2**46``, so the float32 product keeps P's top 24 bits from
bit 46 or 47, rounded to nearest even. Only a product below 256 in magnitude needs that
rounding and the integer one exactly: from 256 on every clamp saturates (the bounds minus
the zero point are within -255 .. 255), below 0.5 every result is the zero point. So the
lane finds the integer point in P and takes the integer part, the half bit, and what the
float32 rounding does to them, from a window of P's bits; a subnormal or zero scale (below
``2**-126``, so a product below ``2**-95``) and an infinite one fall out of the window as 0
and as saturated.

The requantizer's stages 1 to 7, which both modes share, make ``|acc|``, its leading zeros,
``t`` (normalised by the shifter both modes share), the integer point's position, the round
to nearest even of ``t`` (an increment ``i``, added as ``i * s`` to the outer partial
products: ``(t + i) * s = t * s + i * s``) and ``P``, on the same partial products as the
fixed-point mode. This module has the leading-zero count and the float mode's own stages
(:func:`float_stages`): the integer point decoded and the saturation tests beside stages 6
and 7, then

8. the window: the integer part and half bit at the integer point, whether the bits
   between them and the float32 rounding position are all ones or any one (P's bits 24 up,
   picked by a mask made from the point beside stages 6 and 7), and the float32 rounding
   increment at bit 23 or 24;
9. those tests with bit 23 when it is one of those bits;
    Beside them, for both rounding decisions, ``zero_point +- |y|`` (one adder each, the
    round-up as its carry-in) and the clamp, as comparisons of the magnitude with the
    bounds (precomputed from the zero point and clamp, one register per lane);
10. the rounding decision, and the sum and clamp it picks.
"""

from amaranth.hdl import Cat, Const, Mux, Signal, signed


__all__ = ["POINT_BIAS", "clamp_bounds", "leading_zeros", "eighths_decode", "float_stages",
           "rounds_up"]


#: The product P of the two 24-bit significands (the accumulator's 25 bits wide, see above)
#: is below 2**48, and at least 2**46 unless the accumulator is 0: its leading one is bit
#: 46 or 47. The integer point of P (the bit worth 1) is ``142 + lz - exponent`` (``lz`` the
#: accumulator's normalising shift, ``exponent`` the scale's biased exponent). Only 10
#: integer points leave a result that is neither 0 nor saturated: bits 39 to 48.
FIRST_POINT = 39
POINTS = 10
POINT_BIAS = 142


def leading_zeros(m, value, name):
    """``(count, all_zero)`` of a vector whose width is a power of two: a tree of muxes whose
    nodes are signals (as expressions, each level would repeat the one below twice)."""
    assert len(value) & (len(value) - 1) == 0, len(value)
    if len(value) == 1:
        return ~value[0], ~value[0]
    half = len(value) // 2
    high_count, high_zero = leading_zeros(m, value[half:], f"{name}_high")
    low_count, low_zero = leading_zeros(m, value[:half], f"{name}_low")
    count = Signal(range(len(value) + 1), name=f"{name}_count")
    zero = Signal(name=f"{name}_zero")
    m.d.comb += [count.eq(Mux(high_zero, half + low_count, high_count)),
                 zero.eq(high_zero & low_zero)]
    return count, zero


def eighths_decode(stage, value, eighths, suffix=""):
    """Tests of ``value`` against constants, in two cycles: ``value`` is 8 h + l, and the
    first cycle registers the decodes of h (h > k, h == k, for k in ``eighths``) and of l
    (l >= j, l == j), each named ``<decode><suffix>`` through ``stage``; then each test is
    one LUT of three of them: ``equals(c)`` is h == c // 8 and l == c % 8, ``at_least(c)``
    is h > c // 8, or h == c // 8 and l >= c % 8. (From the value in one cycle, ABC chained
    such nested comparisons through seven LUTs.) Returns ``(at_least, equals)``."""
    high, low = value[3:], value[:3]
    if value.shape().signed:
        high = high.as_signed()
        top = None
    else:
        top = (1 << len(high)) - 1
    # (Comparisons whose outcome is constant are written as constants: Verilator's lint
    # warns of constant comparisons.)
    high_above = stage(Cat(*(Const(0, 1) if k == top else high > k for k in eighths)),
                       len(eighths), f"high_above{suffix}")
    high_is = stage(Cat(high == k for k in eighths), len(eighths), f"high_is{suffix}")
    low_from = stage(Cat(Const(1, 1), *(low >= j for j in range(1, 8))), 8,
                     f"low_from{suffix}")
    low_is = stage(Cat(low == j for j in range(8)), 8, f"low_is{suffix}")

    def at_least(c):
        k = (c >> 3) - eighths.start
        return high_above[k] | (high_is[k] & low_from[c & 7])

    def equals(c):
        return high_is[(c >> 3) - eighths.start] & low_is[c & 7]
    return at_least, equals


def clamp_bounds(stage, params):
    """The clamp as bounds on what is added to the zero point, from the lane's copies of the
    parameters (``params``), each in a register made by ``stage``: for the fixed mode's
    value and the float mode's positive magnitude (y + zero_point > act_max: y > act_max -
    zero_point), and for the float mode's negative one (|y| < zero_point - act_max). They
    are static while rows are in flight, so a register costs nothing but a cycle after
    LOAD_QUANT (stage 9 reads them, long after the copies' setup)."""
    zero_point, act_min, act_max = (params[name] for name in ("zero_point", "act_min",
                                                              "act_max"))
    return {name: stage(value, signed(10), f"bound_{name}") for name, value in [
        ("above_positive", act_max - zero_point),
        ("below_positive", act_min - zero_point),
        ("above_negative", zero_point - act_min),
        ("below_negative", zero_point - act_max)]}


def float_stages(m, lane, stage, delayed, point_4, sign_5, product_7, params, bounds,
                 rounds_up):
    """The float mode's stages of lane ``lane`` of ``m``: from the integer point's position
    in stage 4's registers, the sign in stage 5's and ``P`` in stage 7's, the clamped value
    (stage 10, to register as the result). ``stage`` and ``delayed`` make the lane's
    registers (as in :class:`~hw.requant.Requantizer`); ``params`` are the lane's copies of
    the parameters, ``bounds`` its :func:`clamp_bounds`; ``rounds_up`` is :func:`rounds_up`
    or a test's broken one."""
    zero_point, act_min, act_max = (params[name] for name in ("zero_point", "act_min",
                                                              "act_max"))

    # 5: the point decoded (``eighths_decode``, for the eighths the tests below meet), so
    # that in stage 6 each test of the point is one LUT (the mask's nested comparisons in
    # one cycle were 4 failing endpoints of an 8x8 run).
    at_least, equals = eighths_decode(stage, point_4,
                                      range(24 >> 3, (FIRST_POINT + POINTS) // 8 + 1), "_5")

    # 6 and 7 (beside the partial sums): the integer point one-hot, and whether |f| >= 256
    # (saturated): the point at most 8 bits below P's leading one.
    select_7 = delayed(Cat(equals(FIRST_POINT + index) for index in range(POINTS)),
                       POINTS, "select", (6, 7))
    saturate_46_7 = delayed(~at_least(46 - 8 + 1), 1, "saturate_46", (6, 7))
    saturate_47_7 = delayed(~at_least(47 - 8 + 1), 1, "saturate_47", (6, 7))
    sign_7 = delayed(sign_5, 1, "sign", (6, 7))
    # Beside them the middle bits' mask at that point (P's bits 24 to point - 2), so that
    # stage 8 tests the point's middle bits alone: one AND-OR of 23 bits each. Outside the
    # window nothing reads the tests: above it `twice` is 0 and so is the round-up (the
    # result is the zero point), below it the result saturates.
    middle_mask_7 = delayed(Cat(at_least(bit + 2) for bit in range(24, 47)), 23,
                            "middle_mask", (6, 7))

    # 8 and 9: the window. The float32 product keeps P[24:48] (top = 47) or P[23:47];
    # below its last bit lie the float rounding's round bit and sticky bits. `twice` is
    # floor(2 |P * 2**-point|) (integer part and half bit); the bits from the float's last
    # bit up to below the half bit are `middle`: a float round-up carries through them
    # into the half bit only if they are all ones. Stage 8 tests those of P's bits 24 up
    # (by the mask), stage 9 adds bit 23 when it is one of them.
    product = product_7
    top = product[47]
    window = [(select_7[index], FIRST_POINT + index) for index in range(POINTS)]
    twice = _or_all([Mux(chosen, product[point - 1:point + 8], 0)
                     for chosen, point in window])
    float_round_up = Mux(top, product[23] & (product[:23].any() | product[24]),
                         product[22] & (product[:22].any() | product[23]))
    middle = product[24:47]
    any_8 = stage((middle & middle_mask_7).any(), 1, "any_8")
    all_8 = stage((middle | ~middle_mask_7).all(), 1, "all_8")
    below_8 = stage(product[23], 1, "below_8")      # P[23]: the float's last bit or not
    top_8 = stage(top, 1, "top_8")
    twice_8 = stage(twice, 9, "twice_8")
    float_up_8 = stage(float_round_up, 1, "float_up_8")
    # Below bit 47, a product with its leading one at bit 46 is non-zero: an accumulator
    # of 0 (P = 0) is not saturated by a large scale.
    saturate_8 = stage(Mux(top, saturate_47_7, saturate_46_7 & product[46]), 1,
                       "saturate_8")
    sign_8 = stage(sign_7, 1, "sign_8")

    any_9 = stage(any_8 | (~top_8 & below_8), 1, "any_9")
    all_9 = stage(all_8 & (top_8 | below_8), 1, "all_9")
    twice_9 = stage(twice_8[:2], 2, "twice_9")       # stage 10 reads only the low two
    float_up_9 = stage(float_up_8, 1, "float_up_9")
    sign_9 = stage(sign_8, 1, "sign_9")
    # Beside them, all that needs no round-up decision: zero_point + |y|, or zero_point -
    # |y| = zero_point + ~integer + (1 - up), for either decision, as one adder with the
    # carry in ((2a + c) + (2b + c) = 2 (a + b + c)); and the clamp, from the integer part
    # alone: |y| > bound is integer >= bound and |y| < bound is integer < bound, the
    # round-up left out: with it, an integer part at the upper bound or one below the lower
    # one lands on the bound, which the clamp gives too (act_min <= act_max: LOAD_QUANT
    # refuses others). (In stage 10, after the decision, the adder and the comparisons'
    # carry chains were 64 failing endpoints of the 8x8.) Where no clamp applies the value
    # is within act_min .. act_max: its low 8 bits are all of it.
    integer = twice_8[1:]
    wide = Cat(integer, Const(0, 3)).as_signed()
    sums_9 = []
    for up in (0, 1):
        carry_in = up ^ sign_8
        doubled = (Cat(carry_in, Mux(sign_8, ~wide, wide)).as_signed() +
                   Cat(carry_in, zero_point).as_signed())
        sums_9.append(stage(doubled[1:9], signed(8), f"unclamped_{up}_9"))
    above = Mux(sign_8, bounds["above_negative"], bounds["above_positive"])
    below = Mux(sign_8, bounds["below_negative"], bounds["below_positive"])
    magnitude = Cat(integer, Const(0, 2)).as_signed()
    too_big_9 = stage(saturate_8 | (magnitude >= above), 1, "too_big_9")
    too_small_9 = stage(magnitude < below, 1, "too_small_9")

    # 10: |y| = twice // 2 + up; the sum it picks, or the clamp.
    up = Signal(name=f"up_{lane}")
    m.d.comb += up.eq(rounds_up(twice_9, any_9, all_9, float_up_9))
    clamped = Signal(signed(8), name=f"clamped_float_{lane}")
    with m.If(too_big_9):
        m.d.comb += clamped.eq(Mux(sign_9, act_min, act_max))
    with m.Elif(too_small_9):
        m.d.comb += clamped.eq(Mux(sign_9, act_max, act_min))
    with m.Else():
        m.d.comb += clamped.eq(Mux(up, sums_9[1], sums_9[0]))
    return clamped


def rounds_up(twice, middle_any, middle_all, float_up):
    """Whether ``|y|`` is ``twice // 2 + 1``: round half to even of the float32 product.

    A float round-up that carries through the middle bits into the half bit leaves
    nothing below it: a tie (round to even) if the half bit was clear, the next integer
    (up) if it was set. Otherwise the bits below the half bit are non-zero if any middle
    bit is or the float rounded up into them. (:class:`~hw.requant.Requantizer` calls it as
    its ``_rounds_up``, so that a test can break it.)
    """
    carry = float_up & middle_all
    return Mux(carry, twice[0] | twice[1], twice[0] & (middle_any | float_up | twice[1]))


def _or_all(values):
    result = values[0]
    for value in values[1:]:
        result = result | value
    return result
