"""Flip-flops that other flip-flops copy: a flag together with the value it takes at the next
edge, so that a copy placed by its own users can load the same value a cycle ahead (the
issue stage's decision flags, the DMA reader's beat enables)."""

from amaranth.hdl import Signal


__all__ = ["flag_with_next"]


def flag_with_next(m, name):
    """A flip-flop and what it holds from the next edge: assign the second in ``comb`` (the
    flip-flop holds otherwise), so that copies can load it."""
    flag, flag_next = Signal(name=name), Signal(name=f"{name}_next")
    m.d.comb += flag_next.eq(flag)
    m.d.sync += flag.eq(flag_next)
    return flag, flag_next
