"""The float-mode requantizer of the output path: onnxruntime's float32 requantization of
INT32 accumulator rows to INT8, per output channel, in integer logic."""

from amaranth.hdl import Cat, Const, Mux, Signal, signed, unsigned

from .requant import RowRequantizer


__all__ = ["FloatRequantizer"]


#: The product P of the two 24-bit significands (the accumulator's 25 bits wide, see below)
#: is below 2**48, and at least 2**46 unless the accumulator is 0: its leading one is bit
#: 46 or 47. The integer point of P (the bit worth 1) is ``142 + lz - exponent`` (``lz`` the
#: accumulator's normalising shift, ``exponent`` the scale's biased exponent). Only 10
#: integer points leave a result that is neither 0 nor saturated: bits 39 to 48.
_FIRST_POINT = 39
_POINTS = 10
_POINT_BIAS = 142


def _leading_zeros(m, value, name):
    """``(count, all_zero)`` of a vector whose width is a power of two: a tree of muxes whose
    nodes are signals (as expressions, each level would repeat the one below twice)."""
    assert len(value) & (len(value) - 1) == 0, len(value)
    if len(value) == 1:
        return ~value[0], ~value[0]
    half = len(value) // 2
    high_count, high_zero = _leading_zeros(m, value[half:], f"{name}_high")
    low_count, low_zero = _leading_zeros(m, value[:half], f"{name}_low")
    count = Signal(range(len(value) + 1), name=f"{name}_count")
    zero = Signal(name=f"{name}_zero")
    m.d.comb += [count.eq(Mux(high_zero, half + low_count, high_count)),
                 zero.eq(high_zero & low_zero)]
    return count, zero


class FloatRequantizer(RowRequantizer):
    """onnxruntime's requantization (MLAS ``MlasRequantizeOutput``) of one accumulator row,
    :attr:`latency` cycles deep, from integer logic only.

    For each lane ``j`` with the float32 ``scale[j]``::

        f = float32(acc)                          round to nearest even
        f = float32(f * scale[j])                 round to nearest even
        y = clamp(round_half_to_even(f) + zero_point, act_min, act_max)

    (clamping before the rounding, as MLAS does, gives the same: the bounds are integers).
    ``float32(acc)`` is ``t * 2**(8 - lz)``: ``lz`` normalises ``|acc|`` to bit 31 and ``t``
    is its top 24 bits rounded to nearest even, 25 bits wide because the rounding may carry
    out (and a negative power of two normalises one bit further, to ``2**24``). With the
    scale's significand ``s`` (24 bits, the hidden one included) the exact product
    ``P = t * s`` is below ``2**48`` and at least ``2**46``, so the float32 product keeps
    P's top 24 bits from bit 46 or 47, rounded to nearest even. Only a product below 256 in
    magnitude needs that rounding and the integer one exactly: from 256 on every clamp
    saturates (the bounds minus the zero point are within -255 .. 255), below 0.5 every
    result is the zero point. So the block finds the integer point in P and takes the
    integer part, the half bit, and what the float32 rounding does to them, from a window of
    P's bits; a subnormal or zero scale (below ``2**-126``, so a product below ``2**-95``)
    and an infinite one fall out of the window as 0 and as saturated.

    Stages (each holds at most one wide shift, multiply or add; the narrow ones are named):

    1. ``|acc|``, and beside it the leading zeros of ``acc ^ sign`` (those of ``|acc| - 1``
       for a negative value, one too many for a power of two);
    2. the normalising shift into 33 bits, and the integer point's position (9 bits);
    3. to 5. ``t * s``'s four partial products
       (:meth:`~hw.requant.RowRequantizer._partial_product`: operands, product, and its
       copy), from stage 2's registers; beside them the rounding of ``t`` (an increment
       ``i``);
    6. the middle partial products summed; ``i * s`` added to the outer ones
       (``(t + i) * s = t * s + i * s``, so the rounding needs no stage of its own);
       the integer point decoded (one-hot), and the saturation tests;
    7. ``P``;
    8. the window: the integer part and half bit at the integer point, for each integer
       point whether the bits between them and the float32 rounding position are all ones
       or any one, and the float32 rounding increment at bit 23 or 24;
    9. those tests of the integer point chosen;
    10. the rounding decisions, ``zero_point +- |y|`` in one adder with the round-up as its
        carry-in, and beside it the clamp, as comparisons of the magnitude with the bounds
        (precomputed from the zero point and clamp, one register per lane).

    The row timing and :attr:`latency` are :class:`~hw.requant.Requantizer`'s (the frame of
    :class:`~hw.requant.RowRequantizer`), so the store unit waits the same in both modes: a
    row given with ``valid`` in cycle ``t`` is on ``result`` from cycle ``t + latency`` until
    the next valid row has gone through. ``scale``, ``zero_point`` and the clamp bounds must
    hold while a row is in flight and from :attr:`setup` cycles before it on (each lane
    copies them first).

    Parameters
    ----------
    cols, dsp
        Lanes per row, and MULT18X18D or not: as for :class:`~hw.requant.Requantizer`.

    Attributes
    ----------
    valid : In(1)
    acc : In(ArrayLayout(signed(32), cols))
    scale : In(ArrayLayout(unsigned(32), cols))
        IEEE-754 binary32 bit patterns. NaN and infinity are not for this block (the load
        unit refuses them): an exponent of 255 saturates.
    zero_point : In(signed(9))
        Within -128 .. 127 (the controller checks).
    act_min, act_max : In(signed(8))
    result_valid : Out(1)
    result : Out(ArrayLayout(signed(8), cols))
    """
    def __init__(self, cols, *, dsp=True):
        super().__init__(cols, {"scale": unsigned(32)}, dsp=dsp)

    def _lanes(self, m, on_dsp):
        return [self._lane(m, lane, on_dsp) for lane in range(self.cols)]

    def _lane(self, m, lane, on_dsp):
        """The stages of one lane; returns the clamped value, to register as the result."""
        stage, delayed = self._lane_registers(m, lane)
        params = self._params[lane]
        zero_point, act_min, act_max = (params[name] for name in ("zero_point", "act_min",
                                                                  "act_max"))
        # The clamp as bounds on the magnitude |y| of the rounded product, for a positive
        # and a negative product (y + zero_point > act_max: |y| > act_max - zero_point, or
        # |y| < zero_point - act_max), from the lane's copies of the parameters; they are
        # static while rows are in flight, so a register costs nothing but a cycle after
        # LOAD_QUANT (stage 10 reads them, long after the copies' setup).
        # The lower bounds also less one, for a round-up (|y| < bound is integer < bound - 1).
        bounds = {name: stage(value, signed(10), f"bound_{name}") for name, value in [
            ("above_positive", act_max - zero_point),
            ("below_positive", act_min - zero_point),
            ("below_positive_up", act_min - zero_point - 1),
            ("above_negative", zero_point - act_min),
            ("below_negative", zero_point - act_max),
            ("below_negative_up", zero_point - act_max - 1)]}

        acc = self._acc_in[lane]
        scale = params["scale"]
        exponent = scale[23:31]
        negative_scale = scale[31]

        # 1: the magnitude (2**31 for INT32_MIN fits 32 unsigned bits) and, from acc alone,
        # the leading zeros of |acc| or of |acc| - 1.
        negative = acc[31]
        magnitude_1 = stage(Mux(negative, -acc, acc), unsigned(32), "magnitude_1")
        ones_complement = Signal(32, name=f"ones_complement_{lane}")
        m.d.comb += ones_complement.eq(acc.as_unsigned() ^ negative.replicate(32))
        zeros, _ = _leading_zeros(m, ones_complement, f"zeros_{lane}")
        zeros_1 = stage(zeros, unsigned(6), "zeros_1")
        sign_1 = stage(negative ^ negative_scale, 1, "sign_1")

        # 2: normalise: bit 31 set, or bit 32 alone (a power of two shifted one too far).
        normal_2 = stage((magnitude_1 << zeros_1)[:33], unsigned(33), "normal_2")
        # The scale's significand, the hidden one unless the scale is zero or subnormal.
        significand_2 = stage(Cat(scale[:23], exponent != 0), unsigned(24), "significand_2")
        point_2 = stage(_POINT_BIAS + zeros_1 - exponent, signed(10), "point_2")
        sign_2 = stage(sign_1, 1, "sign_2")

        # 3 to 5: t * s from stage 2's registers; the rounding of t to nearest even beside
        # it.
        truncated = normal_2[8:]
        round_up = normal_2[7] & (normal_2[:7].any() | normal_2[8])
        products = self._partial_products(m, lane, on_dsp, truncated, significand_2)
        rounding_5 = delayed(Mux(round_up, significand_2, 0), unsigned(24), "rounding",
                             (3, 4, 5))
        point_5 = delayed(point_2, signed(10), "point", (3, 4, 5))
        sign_5 = delayed(sign_2, 1, "sign", (3, 4, 5))

        # 6: the middle sum, and the outer products plus the rounding's i * s.
        middle_6 = stage(products["low_high"] + products["high_low"], unsigned(26),
                         "middle_6")
        outer = Cat(products["low_low"], products["high_high"][:16])
        outer_6 = stage(outer + rounding_5, unsigned(48), "outer_6")
        select_6 = stage(Cat(point_5 == _FIRST_POINT + index for index in range(_POINTS)),
                         _POINTS, "select_6")
        # |f| >= 256 (saturated): the point at most 8 bits below P's leading one.
        saturate_46_6 = stage(point_5 <= 46 - 8, 1, "saturate_46_6")
        saturate_47_6 = stage(point_5 <= 47 - 8, 1, "saturate_47_6")
        sign_6 = stage(sign_5, 1, "sign_6")

        # 7: P.
        product_7 = stage(outer_6 + (middle_6 << 16), unsigned(48), "product_7")
        select_7 = stage(select_6, _POINTS, "select_7")
        saturate_46_7 = stage(saturate_46_6, 1, "saturate_46_7")
        saturate_47_7 = stage(saturate_47_6, 1, "saturate_47_7")
        sign_7 = stage(sign_6, 1, "sign_7")

        # 8 and 9: the window. The float32 product keeps P[24:48] (top = 47) or P[23:47];
        # below its last bit lie the float rounding's round bit and sticky bits. `twice` is
        # floor(2 |P * 2**-point|) (integer part and half bit); the bits from the float's last
        # bit up to below the half bit are `middle`: a float round-up carries through them
        # into the half bit only if they are all ones. Stage 8 tests them for every integer
        # point, stage 9 picks the chosen point's tests.
        product = product_7
        top = product[47]
        window = [(select_7[index], _FIRST_POINT + index) for index in range(_POINTS)]
        twice = _or_all([Mux(chosen, product[point - 1:point + 8], 0)
                         for chosen, point in window])
        float_round_up = Mux(top, product[23] & (product[:23].any() | product[24]),
                             product[22] & (product[:22].any() | product[23]))
        any_8 = stage(Cat(chosen & product[24:point - 1].any() for chosen, point in window),
                      _POINTS, "any_8")
        all_8 = stage(Cat(chosen & product[24:point - 1].all() for chosen, point in window),
                      _POINTS, "all_8")
        below_8 = stage(product[23], 1, "below_8")      # P[23]: the float's last bit or not
        top_8 = stage(top, 1, "top_8")
        twice_8 = stage(twice, 9, "twice_8")
        float_up_8 = stage(float_round_up, 1, "float_up_8")
        # Below bit 47, a product with its leading one at bit 46 is non-zero: an accumulator
        # of 0 (P = 0) is not saturated by a large scale.
        saturate_8 = stage(Mux(top, saturate_47_7, saturate_46_7 & product[46]), 1,
                           "saturate_8")
        sign_8 = stage(sign_7, 1, "sign_8")

        any_9 = stage(any_8.any() | (~top_8 & below_8), 1, "any_9")
        all_9 = stage(all_8.any() & (top_8 | below_8), 1, "all_9")
        twice_9 = stage(twice_8, 9, "twice_9")
        float_up_9 = stage(float_up_8, 1, "float_up_9")
        saturate_9 = stage(saturate_8, 1, "saturate_9")
        sign_9 = stage(sign_8, 1, "sign_9")

        # 10: |y| = twice // 2 + up.
        integer = twice_9[1:]
        up = Signal(name=f"up_{lane}")
        m.d.comb += up.eq(self._rounds_up(twice_9, any_9, all_9, float_up_9))
        # zero_point + |y|, or zero_point - |y| = zero_point + ~integer + (1 - up), as one
        # adder with the carry in: (2a + c) + (2b + c) = 2 (a + b + c).
        wide = Cat(integer, Const(0, 3)).as_signed()
        carry_in = up ^ sign_9
        doubled = (Cat(carry_in, Mux(sign_9, ~wide, wide)).as_signed() +
                   Cat(carry_in, zero_point).as_signed())
        unclamped = doubled[1:].as_signed()
        # Beside it the clamp, from the magnitude: |y| > bound is integer > bound without a
        # round-up and integer >= bound with one; |y| < bound is integer < bound - up.
        above = Mux(sign_9, bounds["above_negative"], bounds["above_positive"])
        below = Mux(sign_9, bounds["below_negative"], bounds["below_positive"])
        below_up = Mux(sign_9, bounds["below_negative_up"], bounds["below_positive_up"])
        magnitude = Cat(integer, Const(0, 2)).as_signed()
        too_big = saturate_9 | Mux(up, magnitude >= above, magnitude > above)
        too_small = Mux(up, magnitude < below_up, magnitude < below)
        clamped = Signal(signed(8), name=f"clamped_{lane}")
        with m.If(too_big):
            m.d.comb += clamped.eq(Mux(sign_9, act_min, act_max))
        with m.Elif(too_small):
            m.d.comb += clamped.eq(Mux(sign_9, act_max, act_min))
        with m.Else():
            m.d.comb += clamped.eq(unclamped)
        return clamped

    @staticmethod
    def _rounds_up(twice, middle_any, middle_all, float_up):
        """Whether ``|y|`` is ``twice // 2 + 1``: round half to even of the float32 product.

        A float round-up that carries through the middle bits into the half bit leaves
        nothing below it: a tie (round to even) if the half bit was clear, the next integer
        (up) if it was set. Otherwise the bits below the half bit are non-zero if any middle
        bit is or the float rounded up into them. (A method, so that a test can break it.)
        """
        carry = float_up & middle_all
        return Mux(carry, twice[0] | twice[1], twice[0] & (middle_any | float_up | twice[1]))

    def _partial_products(self, m, lane, on_dsp, truncated, significand):
        """The four partial products of ``t * s`` (25 x 24 bits, unsigned), three cycles
        late, split at bit 16 of each operand, as :class:`~hw.requant.Requantizer` splits
        its own."""
        def halves(value):
            return {"low": Cat(value[:16], Const(0, 1)).as_signed(),
                    "high": Cat(value[16:], Const(0, 1)).as_signed()}
        halves_t, halves_s = halves(truncated), halves(significand)
        products = {}
        for name, a, b, width in [
                ("low_low", halves_t["low"], halves_s["low"], 32),
                ("low_high", halves_t["low"], halves_s["high"], 24),
                ("high_low", halves_t["high"], halves_s["low"], 25),
                ("high_high", halves_t["high"], halves_s["high"], 17)]:
            products[name] = self._partial_product(m, a, b, unsigned(width),
                                                   f"{name}_{lane}", on_dsp)
        return products


def _or_all(values):
    result = values[0]
    for value in values[1:]:
        result = result | value
    return result
