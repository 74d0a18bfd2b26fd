"""One weight-stationary processing element."""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out


__all__ = ["PE"]


class PE(wiring.Component):
    """Weight-stationary INT8 multiply-accumulate cell with a shadow weight register.

    Every cycle the PE computes ``psum_out <= psum_in + weight * a_in`` and forwards the
    activation east (``a_out <= a_in``); both outputs are registered, so a value reaches the
    neighbour one cycle later, exactly as in the seeds' section 1.2 trace.

    The *shadow* weight is loaded from the north (``w_in``, shifted south through ``w_out``
    while ``w_shift`` is high) without disturbing the *active* weight. ``commit_in`` travels
    east with the activation it belongs to: in the cycle it is high the PE computes with the
    shadow weight and makes it the active one, so the new weights take effect exactly on the
    wavefront of the first activation of the next tile.

    Attributes
    ----------
    a_in : In(signed(8))
        Activation from the west.
    a_out : Out(signed(8))
        Activation to the east, one cycle later.
    commit_in, commit_out : In(1), Out(1)
        Weight commit flag, travelling with the activation.
    psum_in : In(signed(32))
        Partial sum from the north.
    psum_out : Out(signed(32))
        Partial sum to the south: ``psum_in + weight * a_in`` from the previous cycle.
    w_in, w_out : In(signed(8)), Out(signed(8))
        Shadow weight shift chain, north to south.
    w_shift : In(1)
        Shift the shadow weight chain by one PE.
    """
    a_in: In(signed(8))
    a_out: Out(signed(8))
    commit_in: In(1)
    commit_out: Out(1)
    psum_in: In(signed(32))
    psum_out: Out(signed(32))
    w_in: In(signed(8))
    w_out: Out(signed(8))
    w_shift: In(1)

    def elaborate(self, platform):
        m = Module()

        active = Signal(signed(8))
        weight = Mux(self.commit_in, self.w_out, active)

        m.d.sync += [
            self.a_out.eq(self.a_in),
            self.commit_out.eq(self.commit_in),
            self.psum_out.eq(self.psum_in + weight * self.a_in),
        ]
        with m.If(self.commit_in):
            m.d.sync += active.eq(self.w_out)
        with m.If(self.w_shift):
            m.d.sync += self.w_out.eq(self.w_in)

        return m
