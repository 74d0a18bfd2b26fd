"""The requantizer of the output path: INT32 accumulator rows to INT8, per output channel
(TFLite's fixed-point arithmetic; ``hw/requant_float.py`` is the float mode's), and the frame
both requantizers share."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .pe import dsp_pes, mult18x18d


__all__ = ["RowRequantizer", "Requantizer", "INT32_MIN", "INT32_MAX"]


INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1


class RowRequantizer(wiring.Component):
    """What both requantizers share: their ports (``valid``, ``acc``, the per-lane
    ``parameters`` of the subclass, ``zero_point``, ``act_min``, ``act_max``,
    ``result_valid``, ``result``), the row's valid flag through :attr:`latency` registers, and
    the result register, which holds a row until the next valid one. A subclass computes
    each lane in :meth:`_lanes`.

    Parameters
    ----------
    cols : int
        Lanes per row.
    parameters : dict
        The per-lane input members: name -> shape of one lane.
    dsp : bool
        On ECP5, put the partial products on MULT18X18D (default, unless the platform has
        run out of them: ``npu_dsp_pes``). Without, the same registers are built around a
        plain ``*``.
    """
    #: Cycles from ``valid`` to the row on ``result``, in both modes: the store unit waits
    #: this long for every ``STORE_Q`` row. The first is the input register (``acc`` as it
    #: comes from the accumulator's block RAM, registered before any logic: the route from
    #: the block RAM to the requantizers' DSPs was the whole NPU's longest path), then the
    #: subclass's stages, three of them around each partial product
    #: (:meth:`_partial_product`).
    latency = 11

    #: Cycles the parameters must be set before a row's ``valid`` (and held while it is in
    #: flight): each lane first copies them into registers of its own, so that the one
    #: state register of the store unit reaches every lane by a route with no logic on it
    #: (a lane's copy sits by its DSPs; from the state register to a lane's first stage, two
    #: routes of 7 ns with the left shift's setup between them were the NPU's longest path).
    setup = 2

    def __init__(self, cols, parameters, *, dsp=True):
        if not isinstance(cols, int) or isinstance(cols, bool) or cols < 1:
            raise ValueError(f"cols must be a positive integer, not {cols!r}")
        self.cols = cols
        self.dsp = bool(dsp)
        self._parameter_names = tuple(parameters) + ("zero_point", "act_min", "act_max")
        super().__init__({
            "valid":        In(1),
            "acc":          In(data.ArrayLayout(signed(32), cols)),
            **{name: In(data.ArrayLayout(shape, cols)) for name, shape in parameters.items()},
            "zero_point":   In(signed(9)),
            "act_min":      In(signed(8)),
            "act_max":      In(signed(8)),
            "result_valid": Out(1),
            "result":       Out(data.ArrayLayout(signed(8), cols)),
        })

    def elaborate(self, platform):
        m = Module()
        on_dsp = (self.dsp and getattr(platform, "family", None) == "ecp5"
                  and dsp_pes(platform) is None)

        # Only the row's valid flag and the result are held; the stages in between run
        # every cycle (as the MULT18X18D's registers do).
        valid = self.valid
        self._acc_in = Signal.like(self.acc, name="acc_in", reset_less=True)
        m.d.sync += self._acc_in.eq(self.acc)
        for stage in range(1, self.latency):
            registered = Signal(name=f"valid_{stage}")
            m.d.sync += registered.eq(valid)
            valid = registered
        m.d.sync += self.result_valid.eq(valid)

        # Each lane's copy of the parameters (``param_lane_<lane>_<name>``; the FPGA flow
        # keeps the copies of the shared ones apart: fpga/flow.py's KEEP_APART).
        self._params = []
        for lane in range(self.cols):
            copies = {}
            for name in self._parameter_names:
                value = getattr(self, name)
                if isinstance(value.shape(), data.ArrayLayout):
                    value = value[lane]
                copies[name] = Signal(value.shape(), name=f"param_lane_{lane}_{name}",
                                      reset_less=True)
                m.d.sync += copies[name].eq(value)
            self._params.append(copies)

        for lane, result in enumerate(self._lanes(m, on_dsp)):
            with m.If(valid):
                m.d.sync += self.result[lane].eq(result)
        return m

    def _lanes(self, m, on_dsp):
        """Every lane's clamped value, from the registers of stage ``latency - 1``; a lane
        reads its parameters from ``self._params[lane]``."""
        raise NotImplementedError

    @staticmethod
    def _lane_registers(m, lane):
        """The registers a lane's stages are made of: ``stage(value, shape, name)`` is
        ``value`` registered in ``<name>_<lane>`` (no reset: only values in flight), and
        ``delayed(value, shape, name, stages)`` passes ``value`` through one such register
        per stage number (``<name>_<number>_<lane>``)."""
        def stage(value, shape, name):
            registered = Signal(shape, name=f"{name}_{lane}", reset_less=True)
            m.d.sync += registered.eq(value)
            return registered

        def delayed(value, shape, name, stages):
            for number in stages:
                value = stage(value, shape, f"{name}_{number}")
            return value

        return stage, delayed

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


class Requantizer(RowRequantizer):
    """TFLite/gemmlowp integer requantization of one accumulator row, :attr:`latency` cycles
    deep.

    For each lane ``j`` (``S = shift[j]``, positive = right shift, ``M = multiplier[j]``)::

        x = saturate_int32(acc * 2**max(-S, 0))
        h = SaturatingRoundingDoublingHighMul(x, M)
        r = RoundingDivideByPOT(h, max(S, 0))
        y = clamp(r + zero_point, act_min, act_max)

    (see :mod:`sw.quant` for the definitions; ``docs/quantization.md`` for users). Each
    stage has at most one wide shift, multiply, add or clamp, so that none is a long path:

    1. the left shift, and beside it whether its result fits 32 bits (one comparison);
    2. ``x``: the shifted value or, if it does not fit, the saturated one;
    3. to 5. the four 16 x 16 partial products of ``x * M``
       (:meth:`~RowRequantizer._partial_product`: operands, product, and its copy);
    6. the middle partial products summed, the rounding nudge added to the outer ones;
    7. ``h = (x * M + 2**30) >> 31``: that is the truncating division of the nudged product
       for either sign (for a negative one, ``trunc(n / d) = floor((n + d - 1) / d)`` turns
       the nudge ``1 - 2**30`` into ``2**30``); ``INT32_MAX`` when both are ``INT32_MIN``;
    8. the rounding right shift and its round-up decision (from the remainder's top bit and
       the bits below it, selected by masks made from the shift in stage 7);
    9. the round-up and the zero point added (one carry chain);
    10. the clamp.

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
        On ECP5, put the partial products on MULT18X18D (default, unless the platform has
        run out of them: ``npu_dsp_pes``). Without, the same registers are built around a
        plain ``*``.

    Attributes
    ----------
    valid : In(1)
    acc : In(ArrayLayout(signed(32), cols))
    multiplier : In(ArrayLayout(signed(32), cols))
    shift : In(ArrayLayout(signed(6), cols))
        Within -31 .. 31 (the controller checks).
    zero_point : In(signed(9))
    act_min, act_max : In(signed(8))
    result_valid : Out(1)
    result : Out(ArrayLayout(signed(8), cols))
    """
    def __init__(self, cols, *, dsp=True):
        super().__init__(cols, {"multiplier": signed(32), "shift": signed(6)}, dsp=dsp)

    def _lanes(self, m, on_dsp):
        return [self._lane(m, lane, on_dsp) for lane in range(self.cols)]

    def _lane(self, m, lane, on_dsp):
        """The stages of one lane; returns the clamped value, to register as the result."""
        stage, delayed = self._lane_registers(m, lane)
        acc = self._acc_in[lane]
        params = self._params[lane]
        multiplier = params["multiplier"]
        shift = params["shift"]

        # 1: the left shift, and whether it saturates. The product fits 32 bits when the
        # bits shifted past the sign (bits 31 - left and up) are all sign bits: when acc
        # with its sign bits cleared (acc ^ its sign) is below 2**(31 - left). The shift and
        # that bound are registered once (``shift`` holds while rows are in flight, like
        # ``multiplier``), so the check is one comparison beside the shifter, not a second
        # shifter before it; the choice between them is the next stage's.
        left = Signal(range(32), name=f"left_{lane}", reset_less=True)
        fits_below = Signal(unsigned(32), name=f"fits_below_{lane}", reset_less=True)
        left_next = Mux(shift < 0, -shift, 0)[:5]
        m.d.sync += [left.eq(left_next),
                     fits_below.eq(Const(1 << 31, unsigned(32)) >> left_next)]
        magnitude = Signal(unsigned(32), name=f"magnitude_{lane}")
        m.d.comb += magnitude.eq(acc.as_unsigned() ^ acc[31].replicate(32))
        shifted_1 = stage((acc << left)[:32], signed(32), "shifted_1")
        fits_1 = stage(magnitude < fits_below, 1, "fits_1")
        negative_1 = stage(acc[31], 1, "negative_1")
        right_1 = stage(Mux(shift > 0, shift, 0)[:5], unsigned(5), "right_1")

        # 2: x.
        x_2 = stage(Mux(fits_1, shifted_1, Mux(negative_1, INT32_MIN, INT32_MAX)),
                    signed(32), "x_2")
        right_2 = stage(right_1, unsigned(5), "right_2")

        # 3 to 5: x * M = high_high << 32 + (low_high + high_low) << 16 + low_low, from
        # 17-bit signed operands (a low half is unsigned: a zero bit on top), from stage 2's
        # registers.
        def halves(value):
            return {"low": Cat(value[:16], Const(0, 1)).as_signed(),
                    "high": value[16:].as_signed()}

        halves_x, halves_m = halves(x_2), halves(multiplier)
        operands = {"x_low": halves_x["low"], "x_high": halves_x["high"],
                    "m_low": halves_m["low"], "m_high": halves_m["high"]}
        products = {}
        for name, (a, b), shape in [
                ("low_low", ("x_low", "m_low"), unsigned(32)),
                ("low_high", ("x_low", "m_high"), signed(32)),
                ("high_low", ("x_high", "m_low"), signed(32)),
                ("high_high", ("x_high", "m_high"), signed(32))]:
            products[name] = self._partial_product(m, operands[a], operands[b], shape,
                                                   f"{name}_{lane}", on_dsp)
        overflow_5 = delayed((x_2 == INT32_MIN) & (multiplier == INT32_MIN), 1, "overflow",
                             (3, 4, 5))
        right_5 = delayed(right_2, unsigned(5), "right", (3, 4, 5))

        # 6: the middle sum; the nudge 2**30 added to the outer products (bits 30 and up).
        middle_6 = stage(products["low_high"] + products["high_low"], signed(33), "middle_6")
        outer = Cat(products["low_low"], products["high_high"])
        outer_6 = stage(Cat(outer[:30], outer[30:].as_signed() + 1), signed(64), "outer_6")
        overflow_6 = stage(overflow_5, 1, "overflow_6")
        right_6 = stage(right_5, unsigned(5), "right_6")
        # RoundingDivideByPOT's mask and threshold halves, from the shift alone.
        mask = Signal(unsigned(31), name=f"mask_{lane}")
        m.d.comb += mask.eq((Const(1, unsigned(32)) << right_5) - 1)
        mask_6 = stage(mask, unsigned(31), "mask_6")

        # 7: h = (x * M + 2**30) >> 31; the low 16 bits take no part in the sum.
        nudged = Signal(signed(48), name=f"nudged_{lane}")
        m.d.comb += nudged.eq(outer_6[16:].as_signed() + middle_6)
        high_7 = stage(Mux(overflow_6, INT32_MAX, nudged[15:47].as_signed()), signed(32),
                       "high_7")
        right_7 = stage(right_6, unsigned(5), "right_7")
        # The remainder's top bit (bit right - 1; none for a shift of 0) and the bits below.
        top_7 = stage(mask_6 ^ (mask_6 >> 1), unsigned(31), "top_7")
        below_7 = stage(mask_6 >> 1, unsigned(30), "below_7")

        # 8: rounding right shift; round up when the remainder (high & mask) is above the
        # threshold (mask >> 1) + (high < 0), that is: when its top bit is set and, for a
        # negative high, a bit below it too. Two AND-OR trees, no carry chain (the sum and
        # comparison of a 31-bit remainder were the 8x8's largest group of failing paths).
        negative = high_7 < 0
        top_set = (high_7[:31] & top_7).any()
        below_set = (high_7[:30] & below_7).any()
        shifted_8 = stage(high_7 >> right_7, signed(32), "shifted_8")
        round_up_8 = stage(top_set & (~negative | below_set), 1, "round_up_8")

        # 9: shifted + zero point + round-up, as one adder with the round-up as carry in:
        # (2a + c) + (2b + c) = 2 (a + b + c).
        doubled = (Cat(round_up_8, shifted_8).as_signed() +
                   Cat(round_up_8, params["zero_point"]).as_signed())
        with_zero_point_9 = stage(doubled[1:].as_signed(), signed(33), "with_zero_point_9")

        # 10: the clamp.
        clamped = Signal(signed(8), name=f"clamped_{lane}")
        with m.If(with_zero_point_9 < params["act_min"]):
            m.d.comb += clamped.eq(params["act_min"])
        with m.Elif(with_zero_point_9 > params["act_max"]):
            m.d.comb += clamped.eq(params["act_max"])
        with m.Else():
            m.d.comb += clamped.eq(with_zero_point_9)
        return clamped
