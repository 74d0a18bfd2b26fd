"""The accumulator memory: INT32 rows of C lanes that writes overwrite or add to."""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory, ReadPort
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2


__all__ = ["AccumulatorMemory", "AccumulatorSignature", "AccumulatorWriteSignature"]


def AccumulatorWriteSignature(depth, cols):
    """The accumulator's write port, as the memory sees it: a row that overwrites or adds
    to row ``addr``; ``busy`` while a write is in its second cycle."""
    return wiring.Signature({
        "addr":       In(ceil_log2(depth)),
        "en":         In(1),
        "accumulate": In(1),
        "data":       In(data.ArrayLayout(signed(32), cols)),
        "busy":       Out(1),
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

    A write accepted in cycle ``t`` reads the old row in cycle ``t`` and writes
    ``new`` (``accumulate = 0``) or ``old + new`` (``accumulate = 1``, lane-wise, wrapping) in
    cycle ``t + 1``. The read-modify-write read port is transparent to the write port, so
    back-to-back accumulations into the same row see each other. A K that exceeds R is thus
    reduced on chip, one K-tile after another.

    Attributes
    ----------
    write : AccumulatorWriteSignature
        ``addr``, ``en``, ``accumulate``, ``data`` in; ``busy``: a write is still in its
        second cycle.
    read : ReadPort.Signature
        ``data`` is row ``addr`` from the cycle before; it holds while ``en`` is low.
    """
    def __init__(self, *, depth, cols):
        self.depth = depth
        self.cols = cols
        super().__init__(AccumulatorSignature(depth, cols))

    def elaborate(self, platform):
        m = Module()
        row = data.ArrayLayout(signed(32), self.cols)
        m.submodules.memory = memory = Memory(shape=row, depth=self.depth, init=[])
        write = memory.write_port()
        old = memory.read_port(domain="sync", transparent_for=(write,))
        read = memory.read_port(domain="sync")

        # Stage 0: read the old row. Stage 1: write new or old + new.
        pending = Signal()
        pending_addr = Signal.like(self.write.addr)
        pending_accumulate = Signal()
        pending_data = Signal(row)
        m.d.sync += [
            pending.eq(self.write.en),
            pending_addr.eq(self.write.addr),
            pending_accumulate.eq(self.write.accumulate),
            pending_data.eq(self.write.data),
        ]
        m.d.comb += [
            old.addr.eq(self.write.addr),
            old.en.eq(self.write.en),
            write.addr.eq(pending_addr),
            write.en.eq(pending),
            self.write.busy.eq(pending),
        ]
        for lane in range(self.cols):
            m.d.comb += write.data[lane].eq(
                pending_data[lane] + Mux(pending_accumulate, old.data[lane], 0))

        wiring.connect(m, wiring.flipped(self.read), read)
        return m
