"""The accumulator memory: INT32 rows of C lanes that writes overwrite or add to."""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out


__all__ = ["AccumulatorMemory", "AccumulatorSignature"]


def AccumulatorSignature(depth, cols):
    """Ports of an :class:`AccumulatorMemory`, as the memory sees them."""
    row = data.ArrayLayout(signed(32), cols)
    return wiring.Signature({
        "write_addr":       In(range(depth)),
        "write_en":         In(1),
        "write_accumulate": In(1),
        "write_data":       In(row),
        "read_addr":        In(range(depth)),
        "read_en":          In(1),
        "read_data":        Out(row),
        "busy":             Out(1),
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
    write_addr : In(range(depth))
    write_en : In(1)
    write_accumulate : In(1)
    write_data : In(ArrayLayout(signed(32), cols))
    read_addr : In(range(depth))
    read_en : In(1)
    read_data : Out(ArrayLayout(signed(32), cols))
        Row ``read_addr`` from the cycle before; holds while ``read_en`` is low.
    busy : Out(1)
        A write is still in its second cycle.
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
        pending_addr = Signal.like(self.write_addr)
        pending_accumulate = Signal()
        pending_data = Signal(row)
        m.d.sync += [
            pending.eq(self.write_en),
            pending_addr.eq(self.write_addr),
            pending_accumulate.eq(self.write_accumulate),
            pending_data.eq(self.write_data),
        ]
        m.d.comb += [
            old.addr.eq(self.write_addr),
            old.en.eq(self.write_en),
            write.addr.eq(pending_addr),
            write.en.eq(pending),
            self.busy.eq(pending),
        ]
        for lane in range(self.cols):
            m.d.comb += write.data[lane].eq(
                pending_data[lane] + Mux(pending_accumulate, old.data[lane], 0))

        m.d.comb += [
            read.addr.eq(self.read_addr),
            read.en.eq(self.read_en),
            self.read_data.eq(read.data),
        ]
        return m
