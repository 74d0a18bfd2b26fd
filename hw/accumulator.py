"""The accumulator memory: INT32 rows of C lanes that writes overwrite or add to."""

from amaranth.hdl import Assert, Cat, Module, Signal, signed
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

    The forwarding selects are compared two cycles ahead (at the write's acceptance) and
    chosen one-hot a cycle ahead, one copy per byte of a lane, so the cycle of the add holds
    a four-way AND-OR and a 32-bit add after the block RAM's output register, nothing more.

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
        # The old row is read in every cycle, whether a write is taken or not (s2 reads it
        # only for a write): the write's valid flag, from across the die (the array's
        # result), reaches no block RAM pin.
        m.d.comb += [memory.old.addr.eq(self.write.addr), memory.old.en.eq(1)]
        m.d.sync += [
            s1.valid.eq(self.write.en), s1.addr.eq(self.write.addr),
            s1.accumulate.eq(self.write.accumulate), d1.eq(self.write.data),
            s2.eq(s1), d2.eq(d1),
            H1.eq(S), dH1.eq(dS), H2.eq(H1), dH2.eq(dH1),
        ]
        # In s1, which of the rows that will be in S, H1 and H2 in s2 are this one's: the
        # newest of them, else the block RAM's, is what s2 adds to (none when it
        # overwrites). One-hot, so that s2 ANDs and ORs the four rows. The address
        # comparisons are made in s0, with the rows that will be in s2, S and H1 in s1 (the
        # stages advance every cycle), into flip-flops: in s1 only the one-hot choice is
        # left before the picks' copies (the comparisons there, into the copies, were a
        # group of a hundred failing paths on the 8x8).
        from_S, from_H1, from_H2 = (Signal(name=f"from_{n}") for n in ("S", "H1", "H2"))
        m.d.sync += [
            from_S.eq(s1.valid & (s1.addr == self.write.addr)),
            from_H1.eq(s2.valid & (s2.addr == self.write.addr)),
            from_H2.eq(S.valid & (S.addr == self.write.addr)),
        ]
        m.d.sync += Assert(~s1.valid | ((from_S == (s2.valid & (s2.addr == s1.addr))) &
                                        (from_H1 == (S.valid & (S.addr == s1.addr))) &
                                        (from_H2 == (H1.valid & (H1.addr == s1.addr)))),
                           "accumulator: a forwarding comparison out of step")
        adds = s1.accumulate
        picks = Cat(adds & from_S, adds & ~from_S & from_H1,
                    adds & ~from_S & ~from_H1 & from_H2,
                    adds & ~from_S & ~from_H1 & ~from_H2)
        m.d.sync += S.eq(s2)
        for lane in range(self.cols):
            # One copy of the picks per byte of a lane (each drives 4 x 8 inputs, not
            # 4 x 32 x cols; one per lane, with routes of 6.9 ns to the lane's 128, was a
            # group of the 8x8's failing paths): equal by design, and kept apart in
            # synthesis by their name (fpga/flow.py).
            rows = (dS[lane], dH1[lane], dH2[lane], memory.old.data[lane])
            pieces = []
            for quarter in range(4):
                pick = Signal(4, name=f"forward_lane_{lane}_{quarter}")
                m.d.sync += pick.eq(picks)
                piece = 0
                for i, value in enumerate(rows):
                    piece = piece | (value.as_unsigned()[8 * quarter:8 * quarter + 8] &
                                     pick[i].replicate(8))
                pieces.append(piece)
            m.d.sync += dS[lane].eq(d2[lane] + Cat(*pieces).as_signed())
        m.d.comb += [
            memory.write.addr.eq(S.addr),
            memory.write.data.eq(dS),
            memory.write.en.eq(S.valid),
            self.write.busy.eq(s1.valid | s2.valid | S.valid),
            self.write.unseen[0].valid.eq(s1.valid), self.write.unseen[0].addr.eq(s1.addr),
            self.write.unseen[1].valid.eq(s2.valid), self.write.unseen[1].addr.eq(s2.addr),
        ]
        return m
