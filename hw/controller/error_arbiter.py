"""The error arbiter: of the errors raised, the first in program order, by age bits."""

from amaranth.hdl import Assert, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .signatures import Fault


__all__ = ["ErrorArbiter", "FAULT_SOURCES"]


#: Where this cycle's faults come from, in the order of ``ErrorArbiter.faults``.
FAULT_SOURCES = ("issue", "load", "store")


class ErrorArbiter(wiring.Component):
    """The earliest error in program order among the pending one and this cycle's: the lowest
    pc, the first in the order (pending, then :data:`FAULT_SOURCES`) on a tie.

    Their order comes from age bits, not pc compares (the 32-bit compares of the units' pcs
    were the 8x8's longest paths, into the stop pc): pcs only grow in a run, so the unit
    issued last holds the higher pc (``store_newer``); the issue stage's own fault is the
    youngest (its pc is the head's, it comes only while no error is pending); the pending
    one's order is its source's (``stop_from_*``, kept while ``record``), and nothing issues
    while it is pending. Each order is asserted equal to the pcs' compare.

    Attributes
    ----------
    pending : In(Fault)
        The error held (the issue stage's, while it stops).
    faults : In(ArrayLayout(Fault, 3))
        This cycle's, from :data:`FAULT_SOURCES`.
    load_issued, store_issued : In(1)
        An instruction issues to the load or the store unit (not both).
    record : In(1)
        ``first`` becomes the pending error at the next edge: keep its source.
    first : Out(Fault)
        The earliest of them (``valid`` if any is).
    store_newer : Out(1)
        Of the load unit's and the store unit's instructions, the store unit's was issued
        last (for the issue stage's bus timeout).
    """
    def __init__(self):
        super().__init__({
            "pending":      In(Fault),
            "faults":       In(data.ArrayLayout(Fault, len(FAULT_SOURCES))),
            "load_issued":  In(1),
            "store_issued": In(1),
            "record":       In(1),
            "first":        Out(Fault),
            "store_newer":  Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        candidates = [self.pending] + [self.faults[k] for k in range(len(FAULT_SOURCES))]
        store_newer = self.store_newer
        with m.If(self.store_issued | self.load_issued):
            m.d.sync += store_newer.eq(self.store_issued)
        m.d.sync += Assert(~(self.store_issued & self.load_issued),
                           "error arbiter: a load and a store issued together")
        stop_from = [Signal(name=f"stop_from_{name}") for name in FAULT_SOURCES]
        below = {(1, 0): Const(0), (2, 1): Const(1), (3, 1): Const(1),     # pc_a < pc_b
                 (2, 0): stop_from[0] | (stop_from[2] & store_newer),
                 (3, 0): stop_from[0] | (stop_from[1] & ~store_newer),
                 (3, 2): ~store_newer}
        for (a, b), a_below_b in below.items():
            m.d.sync += Assert(~(candidates[a].valid & candidates[b].valid) |
                               (a_below_b == (candidates[a].pc < candidates[b].pc)),
                               f"error arbiter: error candidates {a} and {b} out of order")
        m.d.sync += Assert(~(self.faults[0].valid & self.pending.valid),
                           "error arbiter: the issue stage's fault while one is pending")
        # At most one candidate wins: its code and pc are an AND-OR of all, not a mux chain.
        code, pc, wins = 0, 0, []
        for k, candidate in enumerate(candidates):
            beaten_by = [candidates[j].valid & ~below[k, j] for j in range(k)]    # pc_j <= pc_k
            beaten_by += [candidates[j].valid & below[j, k]
                          for j in range(k + 1, len(candidates))]
            wins.append(Signal(name=f"error_candidate_{k}_wins"))
            m.d.comb += wins[k].eq(candidate.valid & ~Cat(*beaten_by).any())
            code = code | Mux(wins[k], candidate.code, 0)
            pc = pc | Mux(wins[k], candidate.pc, 0)
        m.d.comb += [
            self.first.valid.eq(Cat(*[candidate.valid for candidate in candidates]).any()),
            self.first.code.eq(code),
            self.first.pc.eq(pc),
        ]
        with m.If(self.record):
            for k, source in enumerate(stop_from, start=1):
                m.d.sync += source.eq((wins[0] & source) | wins[k])
        return m
