"""The accumulator memory: INT32 rows of C lanes that writes overwrite or add to."""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.memory import ReadPort
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .bram import READ_LATENCY, RegisteredMemory


__all__ = ["AccumulatorMemory", "AccumulatorSignature", "AccumulatorWriteSignature",
           "AccWrite", "WRITE_LATENCY"]


#: Cycles from a write's acceptance to the edge that writes its row: the old row's read
#: (:data:`hw.bram.READ_LATENCY`), then the add into a register that the block RAM writes.
WRITE_LATENCY = READ_LATENCY + 1


class AccWrite(data.Struct):
    """A write into the accumulator: whether there is one, and its row (16 bits, as a
    :class:`~hw.controller.signatures.RowRange`'s)."""
    valid: 1
    addr:  16


def AccumulatorWriteSignature(depth, cols):
    """The accumulator's write port, as the memory sees it: a row that overwrites or adds
    to row ``addr``. ``busy`` while an accepted write has not reached the block RAM;
    ``unseen``: the writes (accepted one and two cycles before) that a read started in the
    next cycle would not see."""
    return wiring.Signature({
        "addr":       In(ceil_log2(depth)),
        "en":         In(1),
        "accumulate": In(1),
        "data":       In(data.ArrayLayout(signed(32), cols)),
        "busy":       Out(1),
        "unseen":     Out(data.ArrayLayout(AccWrite, READ_LATENCY)),
    })


def AccumulatorSignature(depth, cols):
    """Ports of an :class:`AccumulatorMemory`, as the memory sees them: the read-modify-write
    port and Amaranth's own read port signature (its ``en`` is 1 when left undriven)."""
    return wiring.Signature({
        "write": Out(AccumulatorWriteSignature(depth, cols)),
        "read":  Out(ReadPort.Signature(addr_width=ceil_log2(depth),
                                        shape=data.ArrayLayout(signed(32), cols))),
    })


class AccumulatorMemory(wiring.Component):
    """``depth`` rows of ``cols`` INT32 lanes; each write overwrites or accumulates.

    A write accepted in cycle ``t`` reads the old row in cycle ``t`` (on a
    :class:`~hw.bram.RegisteredMemory`, so the row is there in ``t + 2``), adds it to the new
    row in ``t + 2`` (``accumulate = 1``, lane-wise, wrapping; ``accumulate = 0``
    overwrites) into a register, and writes that register to the block RAM in ``t + 3``
    (:data:`WRITE_LATENCY`). The three writes before it, whose rows its read may have
    missed, are forwarded: back-to-back accumulations into one row see each other. A K that
    exceeds R is thus reduced on chip, one K-tile after another.

    The forwarding selects are compared a cycle ahead, so the cycle of the add holds a
    four-way mux and a 32-bit add after the block RAM's output register, nothing more.

    Attributes
    ----------
    write : AccumulatorWriteSignature
        ``addr``, ``en``, ``accumulate``, ``data`` in; ``busy``: a write has not reached
        the block RAM; ``unseen``: the writes in s1 and s2, which a read started in the next
        cycle would miss.
    read : ReadPort.Signature
        ``data`` is row ``addr`` from two cycles before; it holds while ``en`` is low.
        Reads see the writes that reached the block RAM before them.
    """
    def __init__(self, *, depth, cols):
        self.depth = depth
        self.cols = cols
        super().__init__(AccumulatorSignature(depth, cols))

    def elaborate(self, platform):
        m = Module()
        row = data.ArrayLayout(signed(32), self.cols)
        m.submodules.memory = memory = RegisteredMemory(shape=row, depth=self.depth,
                                                        read_ports=("old", "read"))
        wiring.connect(m, wiring.flipped(self.read), memory.read)
        assert READ_LATENCY == 2, "the forwarding below covers a two-cycle read"

        # s0: the write is accepted and its old row read. s1, s2: the read; in s2 the sum.
        # S: the sum, written to the block RAM in this cycle. H1, H2: the two written before.
        stage = data.StructLayout({"valid": 1, "addr": ceil_log2(self.depth), "accumulate": 1})
        s1, s2, S, H1, H2 = (Signal(stage, name=n) for n in ("s1", "s2", "S", "H1", "H2"))
        # The rows in flight have no reset: their stages' valid flags say which are real.
        d1, d2, dS, dH1, dH2 = (Signal(row, name=f"{n}_data", reset_less=True)
                                for n in ("s1", "s2", "S", "H1", "H2"))
        m.d.comb += [memory.old.addr.eq(self.write.addr), memory.old.en.eq(self.write.en)]
        m.d.sync += [
            s1.valid.eq(self.write.en), s1.addr.eq(self.write.addr),
            s1.accumulate.eq(self.write.accumulate), d1.eq(self.write.data),
            s2.eq(s1), d2.eq(d1),
            H1.eq(S), dH1.eq(dS), H2.eq(H1), dH2.eq(dH1),
        ]
        # In s1, which of the rows that will be in S, H1 and H2 in s2 are this one's.
        from_S, from_H1, from_H2 = Signal(), Signal(), Signal()
        m.d.sync += [
            from_S.eq(s2.valid & (s2.addr == s1.addr)),
            from_H1.eq(S.valid & (S.addr == s1.addr)),
            from_H2.eq(H1.valid & (H1.addr == s1.addr)),
        ]
        base = Signal(row)
        m.d.comb += base.eq(Mux(from_S, dS, Mux(from_H1, dH1, Mux(from_H2, dH2,
                                                                     memory.old.data))))
        m.d.sync += S.eq(s2)
        for lane in range(self.cols):
            m.d.sync += dS[lane].eq(d2[lane] + Mux(s2.accumulate, base[lane], 0))
        m.d.comb += [
            memory.write.addr.eq(S.addr),
            memory.write.data.eq(dS),
            memory.write.en.eq(S.valid),
            self.write.busy.eq(s1.valid | s2.valid | S.valid),
            self.write.unseen[0].valid.eq(s1.valid), self.write.unseen[0].addr.eq(s1.addr),
            self.write.unseen[1].valid.eq(s2.valid), self.write.unseen[1].addr.eq(s2.addr),
        ]
        return m
