"""Property set 1: one :class:`hw.pe.PE` against its documented behaviour."""

from amaranth.asserts import AnySeq
from amaranth.hdl import (Assert, Assume, Cover, Elaboratable, Module, Mux, ResetSignal, Signal,
                          signed)

from hw.pe import PE


__all__ = ["PEProperties"]


class PEProperties(Elaboratable):
    """Every input of a PE is free in every cycle; a reference model written from the
    :class:`~hw.pe.PE` docstring tracks the shadow and active weights, and the PE must match it:

    * ``w_out`` is the shadow weight: it takes ``w_in`` in a cycle with ``w_shift`` high and
      holds otherwise;
    * ``psum_out == psum_in + weight * a_in`` of the previous cycle, wrapping at 32 bits, where
      ``weight`` is the shadow weight in a cycle with ``commit_in`` high and the active weight
      otherwise; a commit makes the shadow weight the active one;
    * ``a_out`` and ``commit_out`` are ``a_in`` and ``commit_in`` one cycle later.

    Parameters
    ----------
    pe : PE, optional
        The design under proof; a fresh :class:`~hw.pe.PE` by default (the mutation tests pass
        a broken one).
    """
    def __init__(self, pe=None):
        self.pe = PE() if pe is None else pe

    def elaborate(self, platform):
        m = Module()
        m.submodules.pe = pe = self.pe

        # Reset gives the initial state again, which the proof starts from anyway.
        m.d.comb += Assume(~ResetSignal())
        for port in (pe.a_in, pe.commit_in, pe.psum_in, pe.w_in, pe.w_shift):
            m.d.comb += port.eq(AnySeq(port.shape()))

        # Reference model.
        shadow = Signal(signed(8))
        active = Signal(signed(8))
        weight = Signal(signed(8))
        m.d.comb += weight.eq(Mux(pe.commit_in, shadow, active))
        with m.If(pe.w_shift):
            m.d.sync += shadow.eq(pe.w_in)
        with m.If(pe.commit_in):
            m.d.sync += active.eq(shadow)

        # The previous cycle's inputs and the sum they must produce.
        past_valid = Signal()
        past_a = Signal(signed(8))
        past_commit = Signal()
        expected_psum = Signal(signed(32))
        m.d.sync += [
            past_valid.eq(1),
            past_a.eq(pe.a_in),
            past_commit.eq(pe.commit_in),
            expected_psum.eq(pe.psum_in + weight * pe.a_in),   # truncated to INT32
        ]

        m.d.comb += Assert(pe.w_out == shadow)
        with m.If(past_valid):
            m.d.comb += [
                Assert(pe.psum_out == expected_psum),
                Assert(pe.a_out == past_a),
                Assert(pe.commit_out == past_commit),
            ]

        # Non-vacuity: a weight shifted in, committed, and then overwritten in the shadow
        # register while the committed one keeps computing.
        committed_then_shifted = Signal()
        with m.If(pe.commit_in & (shadow != 0)):
            m.d.sync += committed_then_shifted.eq(1)
        m.d.comb += Cover(committed_then_shifted & (shadow != active) & (active != 0) &
                          (pe.a_in == -128) & (pe.psum_out < 0))
        return m
