"""The requantizer of the output path: INT32 accumulator rows to INT8, per output channel."""

from amaranth.hdl import Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out


__all__ = ["Requantizer", "INT32_MIN", "INT32_MAX"]


INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1


class Requantizer(wiring.Component):
    """TFLite/gemmlowp integer requantization of one accumulator row, two cycles deep.

    For each lane ``j`` (``S = shift[j]``, positive = right shift, ``M = multiplier[j]``)::

        x = saturate_int32(acc * 2**max(-S, 0))
        h = SaturatingRoundingDoublingHighMul(x, M)
        r = RoundingDivideByPOT(h, max(S, 0))
        y = clamp(r + zero_point, act_min, act_max)

    (see :mod:`sw.quant` for the definitions; ``docs/quantization.md`` for users). Stage 1
    registers the shifted accumulator times the multiplier; stage 2 rounds, adds the zero
    point and clamps. A row given with ``valid`` in cycle ``t`` is on ``result`` from cycle
    ``t + 2`` until the next valid row has gone through.

    Parameters
    ----------
    cols : int
        Lanes per row.

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
    def __init__(self, cols):
        self.cols = cols
        super().__init__({
            "valid":        In(1),
            "acc":          In(data.ArrayLayout(signed(32), cols)),
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

        stage1_valid = Signal()
        m.d.sync += [stage1_valid.eq(self.valid), self.result_valid.eq(stage1_valid)]

        for lane in range(self.cols):
            acc = self.acc[lane]
            multiplier = self.multiplier[lane]
            shift = self.shift[lane]

            # Stage 1: saturating left shift, then the 64-bit product.
            left = Signal(range(32), name=f"left_{lane}")
            m.d.comb += left.eq(Mux(shift < 0, -shift, 0))
            widened = Signal(signed(64), name=f"widened_{lane}")
            m.d.comb += widened.eq(acc << left)
            x = Signal(signed(32), name=f"x_{lane}")
            with m.If(widened > INT32_MAX):
                m.d.comb += x.eq(INT32_MAX)
            with m.Elif(widened < INT32_MIN):
                m.d.comb += x.eq(INT32_MIN)
            with m.Else():
                m.d.comb += x.eq(widened)

            product = Signal(signed(64), name=f"product_{lane}")
            overflow = Signal(name=f"overflow_{lane}")
            right = Signal(range(32), name=f"right_{lane}")
            with m.If(self.valid):
                m.d.sync += [
                    product.eq(x * multiplier),
                    overflow.eq((x == INT32_MIN) & (multiplier == INT32_MIN)),
                    right.eq(Mux(shift > 0, shift, 0)),
                ]

            # Stage 2: rounding doubling high multiply, rounding right shift, zero point, clamp.
            nudged = Signal(signed(65), name=f"nudged_{lane}")
            m.d.comb += nudged.eq(product + Mux(product >= 0, 1 << 30, 1 - (1 << 30)))
            # Division by 2**31 truncating toward zero: floor, plus one for a negative
            # dividend with a remainder.
            floor = nudged >> 31
            inexact = nudged[:31] != 0
            high = Signal(signed(32), name=f"high_{lane}")
            m.d.comb += high.eq(Mux(overflow, INT32_MAX,
                                    floor + ((nudged < 0) & inexact)))

            mask = Signal(unsigned(32), name=f"mask_{lane}")
            m.d.comb += mask.eq((Const(1, unsigned(33)) << right) - 1)
            remainder = high.as_unsigned() & mask
            threshold = (mask >> 1) + (high < 0)
            rounded = Signal(signed(33), name=f"rounded_{lane}")
            m.d.comb += rounded.eq((high >> right) + (remainder > threshold))

            shifted_zero = Signal(signed(34), name=f"with_zero_point_{lane}")
            m.d.comb += shifted_zero.eq(rounded + self.zero_point)
            clamped = Signal(signed(8), name=f"clamped_{lane}")
            with m.If(shifted_zero < self.act_min):
                m.d.comb += clamped.eq(self.act_min)
            with m.Elif(shifted_zero > self.act_max):
                m.d.comb += clamped.eq(self.act_max)
            with m.Else():
                m.d.comb += clamped.eq(shifted_zero)
            with m.If(stage1_valid):
                m.d.sync += self.result[lane].eq(clamped)

        return m
