"""The requantizer of the output path: INT32 accumulator rows to INT8, per output channel,
in either mode of ``LOAD_QUANT`` (TFLite's fixed-point arithmetic, or onnxruntime's float32
one: ``hw/requant_float.py`` holds the float mode's own stages), on one set of lanes."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .isa import QuantMode
from .pe import mult18x18d
from .requant_float import (POINT_BIAS, clamp_bounds, eighths_decode, float_stages,
                            leading_zeros, rounds_up)


__all__ = ["Requantizer", "INT32_MIN", "INT32_MAX"]


INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1


class Requantizer(wiring.Component):
    """Requantization of one accumulator row, :attr:`latency` cycles deep, in the mode
    ``mode`` names; both modes share each lane's shifter, partial products and sums.

    Fixed-point mode (TFLite/gemmlowp), for each lane ``j`` (``S = shift[j]``, positive =
    right shift, ``M = multiplier[j]``)::

        x = saturate_int32(acc * 2**max(-S, 0))
        h = SaturatingRoundingDoublingHighMul(x, M)
        r = RoundingDivideByPOT(h, max(S, 0))
        y = clamp(r + zero_point, act_min, act_max)

    (see :mod:`sw.quant` for the definitions; ``docs/quantization.md`` for users). Float
    mode (onnxruntime's MLAS ``MlasRequantizeOutput``), with ``multiplier[j]`` the bit
    pattern of the float32 scale ``s`` and ``shift[j]`` 0::

        f = float32(float32(acc) * s)             each rounded to nearest even
        y = clamp(round_half_to_even(f) + zero_point, act_min, act_max)

    from integer logic only (``hw/requant_float.py`` explains how). Each stage has at most
    one wide shift, multiply, add or clamp, so that none is a long path:

    1. fixed: ``acc``, and whether its left shift fits 32 bits (one comparison with a
       bound made from the shift); float: ``|acc|``, and the leading zeros of ``acc ^ sign``
       (those of ``|acc| - 1`` for a negative value, one too many for a power of two);
    2. the shift: fixed, ``x`` (the shifted value, or the saturated one); float, ``|acc|``
       normalised, its top 25 bits ``t`` in ``x``'s place (one shifter: the fixed value is
       shifted 8 bits further, so both take the same 32 bits of its output) and the integer
       point's position in the coming product;
    3. to 5. the four 16 x 16 partial products of ``x`` and the lane's factor (``M``, or the
       scale's significand; :meth:`_partial_product`: operands, product, and its copy);
       beside them the addend of stage 6: fixed, the rounding nudge ``2**30``; float, the
       round-to-nearest-even increment ``i`` of ``t`` times the significand
       (``(t + i) * s = t * s + i * s``, so that rounding needs no stage of its own);
    6. the middle partial products summed, the addend added to the outer ones;
    7. the product (fixed: ``h = (x * M + 2**30) >> 31`` is its bits 31 to 62, for either
       sign: for a negative product ``trunc(n / d) = floor((n + d - 1) / d)`` turns the nudge
       ``1 - 2**30`` into ``2**30``; ``INT32_MAX`` when both are ``INT32_MIN``);
    8. to 10. each mode's rounding, zero point and clamp, from the product:
       fixed, (8) the rounding right shift and its round-up (the remainder's top bit and the
       bits below it, picked by masks made from the shift once per lane: two AND-OR trees,
       no carry chain), (9) round-up and zero point in one adder and beside it the
       clamp's comparisons, of the shifted value against bounds less the zero point, (10)
       the clamp; float,
       :func:`~hw.requant_float.float_stages`. The mode's result is picked into the result
       register.

    A row given with ``valid`` in cycle ``t`` is on ``result`` from cycle ``t + latency``
    until the next valid row has gone through; rows may follow each other in every cycle.
    The parameters are copied into each lane (:attr:`setup`), then read by the stages:
    they hold while a row is in flight and are set at least :attr:`setup` cycles before it
    (the controller changes them only in ``LOAD_QUANT``, which waits for the store unit,
    whose ``STORE_Q`` rows start cycles later).

    Parameters
    ----------
    cols : int
        Lanes per row.
    dsp : bool
        On ECP5, put the partial products on MULT18X18D (default, also when the platform
        gives the PEs fewer DSPs than they are: ``npu_dsp_pes``). Without, the same
        registers are built around a plain ``*``.

    Attributes
    ----------
    valid : In(1)
    acc : In(ArrayLayout(signed(32), cols))
    mode : In(QuantMode)
    multiplier : In(ArrayLayout(signed(32), cols))
        Fixed: ``M``. Float: the scale's IEEE-754 binary32 bit pattern; NaN and infinity
        are not for this block (the load unit refuses them): an exponent of 255 saturates.
    shift : In(ArrayLayout(signed(6), cols))
        Fixed: within -31 .. 31 (the controller checks). Float: not read.
    zero_point : In(signed(9))
        Within -128 .. 127.
    act_min, act_max : In(signed(8))
    result_valid : Out(1)
    result : Out(ArrayLayout(signed(8), cols))
    """
    #: Cycles from ``valid`` to the row on ``result``, in both modes: the store unit waits
    #: this long for every ``STORE_Q`` row. The first is the input register (``acc`` as it
    #: comes from the accumulator's block RAM, registered before any logic: the route from
    #: the block RAM to the requantizers' DSPs was the whole NPU's longest path), then the
    #: ten stages.
    latency = 11

    #: Cycles the parameters must be set before a row's ``valid`` (and held while it is in
    #: flight): each lane first copies them into registers of its own, so that the one
    #: state register of the store unit reaches every lane by a route with no logic on it
    #: (a lane's copy sits by its DSPs; from the state register to a lane's first stage, two
    #: routes of 7 ns with the left shift's setup between them were the NPU's longest path),
    #: and makes what the stages need of them (bounds, its factor) in the next cycle; the
    #: fixed mode's masks, read by stage 8 only, take two cycles more.
    setup = 2

    _PARAMETERS = ("mode", "multiplier", "shift", "zero_point", "act_min", "act_max")

    def __init__(self, cols, *, dsp=True):
        if not isinstance(cols, int) or isinstance(cols, bool) or cols < 1:
            raise ValueError(f"cols must be a positive integer, not {cols!r}")
        self.cols = cols
        self.dsp = bool(dsp)
        super().__init__({
            "valid":        In(1),
            "acc":          In(data.ArrayLayout(signed(32), cols)),
            "mode":         In(QuantMode),
            "multiplier":   In(data.ArrayLayout(signed(32), cols)),
            "shift":        In(data.ArrayLayout(signed(6), cols)),
            "zero_point":   In(signed(9)),
            "act_min":      In(signed(8)),
            "act_max":      In(signed(8)),
            "result_valid": Out(1),
            "result":       Out(data.ArrayLayout(signed(8), cols)),
        })

    def elaborate(self, platform):
        m = Module()
        # A platform's DSP budget (``npu_dsp_pes``) limits only the PEs: these products
        # would be 18 x 18 LUT multipliers, each many times an 8-bit PE's.
        on_dsp = self.dsp and getattr(platform, "family", None) == "ecp5"

        # Only the row's valid flag and the result are held; the stages in between run
        # every cycle (as the MULT18X18D's registers do). The held result has no reset
        # (``result_valid`` says whether it is one): the core reset's route to its
        # flip-flops was the 8x8's longest path on one placement.
        valid = self.valid
        acc_in = Signal.like(self.acc, name="acc_in", reset_less=True)
        m.d.sync += acc_in.eq(self.acc)
        for stage in range(1, self.latency):
            registered = Signal(name=f"valid_{stage}")
            m.d.sync += registered.eq(valid)
            valid = registered
        m.d.sync += self.result_valid.eq(valid)
        held = Signal.like(self.result, name="held_result", reset_less=True)
        m.d.comb += self.result.eq(held)

        for lane in range(self.cols):
            # The lane's copy of the parameters (``param_lane_<lane>_<name>``; the FPGA flow
            # keeps the copies of the shared ones apart: fpga/flow.py's KEEP_APART).
            params = {}
            for name in self._PARAMETERS:
                value = getattr(self, name)
                if isinstance(value.shape(), data.ArrayLayout):
                    value = value[lane]
                params[name] = Signal(value.shape(), name=f"param_lane_{lane}_{name}",
                                      reset_less=True)
                m.d.sync += params[name].eq(value)
            result = self._lane(m, lane, on_dsp, acc_in[lane], params)
            with m.If(valid):
                m.d.sync += held[lane].eq(result)
        return m

    def _lane(self, m, lane, on_dsp, acc, params):
        """The stages of one lane; returns the clamped value of the lane's mode."""
        def stage(value, shape, name):
            """``value`` registered in ``<name>_<lane>`` (no reset: values in flight, or
            made from the parameters, which hold while rows are in flight)."""
            registered = Signal(shape, name=f"{name}_{lane}", reset_less=True)
            m.d.sync += registered.eq(value)
            return registered

        def delayed(value, shape, name, stages):
            for number in stages:
                value = stage(value, shape, f"{name}_{number}")
            return value

        floating = params["mode"] == QuantMode.FLOAT
        multiplier = params["multiplier"]
        shift = params["shift"]
        exponent = multiplier[23:31]

        # From the parameters, once (a cycle after the copies): the fixed mode's left shift
        # (8 more: see stage 2) and the bound below which a shifted value fits 32 bits, its
        # right shift and the masks of its remainder's top bit and the bits below it; the
        # factor of the partial products (float: the significand, the hidden one unless the
        # scale is zero or subnormal) and the addend of stage 6 (fixed: the nudge; float:
        # the significand, added when t rounds up).
        left = Mux(~floating & (shift < 0), -shift, 0)[:5]
        right = Mux(shift > 0, shift, 0)[:5]
        left_8 = stage(left + 8, unsigned(6), "left_8")
        fits_below = stage(Const(1 << 31, unsigned(32)) >> left, unsigned(32), "fits_below")
        # The right shift in five flip-flops for each quarter of stage 8's shifter (each
        # drives the multiplexers of 8 of its 32 outputs) and five more for the masks, which
        # take two more cycles: the shift's decode (``eighths_decode``), then each mask bit in
        # one LUT. (From the shift in one cycle, Yosys chained the 30 comparisons through
        # seven LUTs after a route of 5 ns: 77 failing endpoints of the 8x8; as an OR of the
        # top bits above, into a 30-input OR.) Stage 8 reads them, long after the
        # parameters' setup.
        rights = [Signal(unsigned(5), name=f"param_lane_{lane}_right_{quarter}",
                         reset_less=True) for quarter in range(5)]
        m.d.sync += [copy.eq(right) for copy in rights]
        right, right_masks = rights[:4], rights[4]
        at_least, equals = eighths_decode(stage, right_masks, range(4))
        top = stage(Cat(equals(bit + 1) for bit in range(31)), unsigned(31), "top")
        below = stage(Cat(at_least(bit + 2) for bit in range(30)), unsigned(30), "below")
        significand = Cat(multiplier[:23], exponent != 0)
        factor = stage(Mux(floating, significand, multiplier), signed(32), "factor")
        addend = stage(Mux(floating, significand, 1 << 30), unsigned(31), "addend")

        # 1: fixed, acc and whether its left shift fits: when the bits shifted past the
        # sign (bits 31 - left and up) are all sign bits, that is when acc with its sign
        # bits cleared is below 2**(31 - left). Float, |acc| (2**31 for INT32_MIN fits 32
        # unsigned bits) and the normalising shift. Both from acc's ones' complement.
        negative = acc[31]
        ones_complement = Signal(32, name=f"ones_complement_{lane}")
        m.d.comb += ones_complement.eq(acc.as_unsigned() ^ negative.replicate(32))
        zeros, _ = leading_zeros(m, ones_complement, f"zeros_{lane}")
        value_1 = stage(Mux(floating & negative, -acc, acc), unsigned(32), "value_1")
        amount_1 = stage(Mux(floating, zeros, left_8), unsigned(6), "amount_1")
        saturate_1 = stage(~floating & ~(ones_complement < fits_below), 1, "saturate_1")
        negative_1 = stage(negative, 1, "negative_1")
        sign_1 = stage(negative ^ multiplier[31], 1, "sign_1")

        # 2: one shifter. Float: |acc| << zeros has its leading one at bit 31 (or 32) and
        # t is its bits 8 to 32; fixed: acc << (left + 8), bits 8 to 39, is acc << left.
        shifted = Signal(40, name=f"shifted_{lane}")
        m.d.comb += shifted.eq((value_1 << amount_1)[:40])
        x_2 = stage(Mux(saturate_1, Mux(negative_1, INT32_MIN, INT32_MAX), shifted[8:]),
                    signed(32), "x_2")
        low_2 = stage(shifted[:8], unsigned(8), "low_2")           # float: below t
        point_2 = stage(POINT_BIAS + amount_1 - exponent, signed(10), "point_2")
        sign_2 = stage(sign_1, 1, "sign_2")

        # 3 to 5: x * factor = high_high << 32 + (low_high + high_low) << 16 + low_low,
        # from 17-bit signed operands (a low half is unsigned: a zero bit on top; float's
        # t and significand have zeros on top, so their high halves are positive).
        def halves(value):
            return {"low": Cat(value[:16], Const(0, 1)).as_signed(),
                    "high": value[16:].as_signed()}

        halves_x, halves_f = halves(x_2), halves(factor)
        products = {}
        for name, a, b, shape in [
                ("low_low", halves_x["low"], halves_f["low"], unsigned(32)),
                ("low_high", halves_x["low"], halves_f["high"], signed(32)),
                ("high_low", halves_x["high"], halves_f["low"], signed(32)),
                ("high_high", halves_x["high"], halves_f["high"], signed(32))]:
            products[name] = self._partial_product(m, a, b, shape, f"{name}_{lane}", on_dsp)
        # Float: t rounded to nearest even (the bits of |acc| below t are low_2); whether
        # stage 6 adds the lane's addend (fixed: always).
        round_up = low_2[7] & (low_2[:7].any() | x_2[0])
        add_5 = delayed(~floating | round_up, 1, "add", (3, 4, 5))
        overflow_5 = delayed((x_2 == INT32_MIN) & (factor == INT32_MIN), 1, "overflow",
                             (3, 4, 5))
        point_4 = delayed(point_2, signed(10), "point", (3, 4))
        sign_5 = delayed(sign_2, 1, "sign", (3, 4, 5))

        # 6: the middle sum; the addend added to the outer products.
        middle_6 = stage(products["low_high"] + products["high_low"], signed(33), "middle_6")
        outer_6 = stage(Cat(products["low_low"], products["high_high"]) +
                        Mux(add_5, addend, 0), unsigned(64), "outer_6")
        overflow_6 = stage(overflow_5, 1, "overflow_6")

        # 7: the product; the low 16 bits take no part in the sum. Fixed reads bits 31 up
        # (h), float bits 0 to 47 (P).
        sum_ = Signal(48, name=f"sum_{lane}")
        m.d.comb += sum_.eq(outer_6[16:].as_signed() + middle_6)
        product_7 = stage(Cat(outer_6[:16], sum_[:15],
                              Mux(overflow_6, INT32_MAX, sum_[15:47])), unsigned(63),
                          "product_7")

        bounds = clamp_bounds(stage, params)
        fixed = self._fixed_stages(m, lane, stage, product_7[31:].as_signed(), right, top,
                                   below, params, bounds)
        float_ = float_stages(m, lane, stage, delayed, point_4, sign_5, product_7[:48],
                              params, bounds, self._rounds_up)
        return Mux(floating, float_, fixed)

    @staticmethod
    def _fixed_stages(m, lane, stage, high_7, right, top, below, params, bounds):
        """Stages 8 to 10 of the fixed-point mode, from ``h`` in stage 7's register: the
        lane's clamped value. ``right`` is the right shift's four copies, one per quarter
        of the shifted value; ``bounds`` the lane's clamp bounds (``clamp_bounds``)."""
        # 8: rounding right shift; round up when the remainder (high & mask) is above the
        # threshold (mask >> 1) + (high < 0), that is: when its top bit is set and, for a
        # negative high, a bit below it too. Two AND-OR trees, no carry chain (the sum and
        # comparison of a 31-bit remainder were the 8x8's largest group of failing paths).
        negative = high_7 < 0
        top_set = (high_7[:31] & top).any()
        below_set = (high_7[:30] & below).any()
        shifted_8 = stage(Cat((high_7 >> right[quarter])[8 * quarter:8 * quarter + 8]
                              for quarter in range(4)), signed(32), "shifted_8")
        round_up_8 = stage(top_set & (~negative | below_set), 1, "round_up_8")

        # 9: shifted + zero point + round-up, as one adder with the round-up as carry in:
        # (2a + c) + (2b + c) = 2 (a + b + c); where no clamp applies it is within act_min
        # .. act_max, so its low 8 bits are all of it. Beside it the clamp, from the
        # shifted value alone against the bounds less the zero point (y + zero_point <
        # act_min is y < act_min - zero_point), the round-up left out: with it, a shifted
        # value one below the lower bound or at the upper one lands on the bound, which the
        # clamp gives too (act_min <= act_max: LOAD_QUANT refuses others). No comparison
        # follows the adder (the sum's, in stage 10, were a group of the 8x8's failing
        # paths).
        doubled = (Cat(round_up_8, shifted_8).as_signed() +
                   Cat(round_up_8, params["zero_point"]).as_signed())
        with_zero_point_9 = stage(doubled[1:9], signed(8), "with_zero_point_9")
        too_small_9 = stage(shifted_8 < bounds["below_positive"], 1, "too_small_9")
        too_big_9 = stage(shifted_8 >= bounds["above_positive"], 1, "too_big_9")

        # 10: the clamp.
        clamped = Signal(signed(8), name=f"clamped_fixed_{lane}")
        with m.If(too_small_9):
            m.d.comb += clamped.eq(params["act_min"])
        with m.Elif(too_big_9):
            m.d.comb += clamped.eq(params["act_max"])
        with m.Else():
            m.d.comb += clamped.eq(with_zero_point_9)
        return clamped

    #: The float mode's integer rounding (a class attribute, so that a test can break it).
    _rounds_up = staticmethod(rounds_up)

    @staticmethod
    def _partial_product(m, a, b, shape, name, on_dsp):
        """``a * b`` (signed operands of up to 18 bits; give an unsigned one a zero bit on
        top) three cycles after ``a`` and ``b``: their registers, the product's, and a copy
        of the product in the fabric. On ECP5 the first two are the MULT18X18D's input and
        output registers (submodule ``multiplier_<name>``), so that no logic shares a cycle
        with the routes to and from the DSP: the DSPs sit in a few rows of the die, and
        those routes alone took 6.4 ns (into the DSP) and 8.5 ns (out of it, to the adder of
        the middle products) on the 85F. The fabric's copy (``<name>_product``) is free to
        sit between the DSP and the adders."""
        product = Signal(shape, name=f"{name}_dsp", reset_less=True)
        if on_dsp:
            mult18x18d(m, a, b, product, registered_inputs=True, name=f"multiplier_{name}")
        else:
            a_in = Signal(a.shape(), name=f"{name}_a", reset_less=True)
            b_in = Signal(b.shape(), name=f"{name}_b", reset_less=True)
            m.d.sync += [a_in.eq(a), b_in.eq(b), product.eq(a_in * b_in)]
        copy = Signal(shape, name=f"{name}_product", reset_less=True)
        m.d.sync += copy.eq(product)
        return copy

