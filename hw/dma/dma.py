"""The DMA engine: an AXI4 master moving 2-D strided blocks between DRAM and local rows, its
reader on the read channels and its writer on the write channels."""

from amaranth.hdl import Module, ResetInserter, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..axi import AXI4Signature
from .bursts import BlockCommand, ReadCommand, next_burst, row_geometry
from .reader import DMAReader
from .writer import DMAWriter


__all__ = ["DMA"]


class DMA(wiring.Component):
    """AXI4 master with a block reader (DRAM -> rows) and a block writer (rows -> DRAM).

    Rows may start at any byte address: the reader fetches the bus-aligned beats that cover a
    row and rotates each beat into place, the writer shifts each row onto the bus and masks
    it with ``wstrb``. Every burst is INCR with full-width beats, at most 256 beats long, and
    never crosses a 4 KiB boundary. The reader issues addresses ahead of the data it receives
    (at most :data:`MAX_READS_OUTSTANDING` bursts outstanding); the writer sends a burst's
    data only after its address.

    The slave's answers are checked, and a broken one ends the command in the same error as
    a SLVERR or DECERR response, never in a hang: ``rlast`` must be high exactly on the last
    beat of each read burst (as asked with ``arlen``), and an R beat must belong to a burst
    asked for. On a framing error the reader sends no more addresses, takes the beats of the
    bursts it has asked for (a burst ends at its ``rlast`` or at its last beat asked,
    whichever comes first; ``rready`` stays high, so a longer burst's extra beats are taken
    too), and then ends the command. A write response while no write burst awaits one is
    not counted (the count of outstanding responses never wraps) and, during a write
    command, ends that command with ``write_error``; with the writer idle it is ignored.

    Parameters
    ----------
    data_width : int
        AXI data width in bits (:data:`hw.config.BUS_WIDTHS`: 32 to 512).
    read_row_bytes : int
        Width of a row delivered by the reader; bytes past ``row_bytes`` read as zero.
    write_row_bytes : int
        Width of a row accepted by the writer.

    Attributes
    ----------
    bus : Out(AXI4Signature)
        The AXI4 master.
    read_cmd : In(stream.Signature(ReadCommand))
        Read a block; accepted when the reader is idle. ``rows`` and ``row_bytes`` are
        non-zero and ``row_bytes <= read_row_bytes`` (the controller checks); ``beats`` is
        the first row's on the bus (:func:`~hw.dma.bursts.row_beats`, asserted).
    read_row : Out(stream.Signature(8 * read_row_bytes, always_ready=True))
        The rows of the block, in order.
    read_done, read_error : Out(1)
        ``read_done`` pulses once all rows of a command have been delivered, or once the
        bursts asked for are drained after a framing error; ``read_error`` is then high if
        any beat was answered SLVERR or DECERR or a burst's framing was wrong. Rows from the
        one with the error on are not delivered.
    write_cmd : In(stream.Signature(BlockCommand))
        Write a block; accepted when the writer is idle.
    write_row : In(stream.Signature(8 * write_row_bytes))
        The rows to write, in order, offered only once their command is taken and no more
        than it has: the writer takes a row whenever its one-row buffer is empty.
    write_done, write_error : Out(1)
        ``write_done`` pulses once every write response has come back; ``write_error`` is
        then high if one was SLVERR or DECERR or a response came that no burst awaited.
    idle : Out(1)
        No command is running and nothing is outstanding on the bus.
    soft_reset : In(1)
        Resets the reader and the writer from the next cycle, each through its own
        registered copy (``core_reset_reader``, ``core_reset_writer``: one flip-flop for
        both reached every register of the DMA, by routes of up to 11 ns on the 85F). The
        ``sync`` domain's reset resets them at once, as before.
    """
    def __init__(self, *, data_width, read_row_bytes, write_row_bytes, addr_width=32):
        self.data_width = data_width
        self.addr_width = addr_width
        self.bus_bytes = data_width // 8
        self.read_row_bytes = read_row_bytes
        self.write_row_bytes = write_row_bytes
        super().__init__({
            "bus":         Out(AXI4Signature(addr_width=addr_width, data_width=data_width)),
            "read_cmd":    In(stream.Signature(ReadCommand)),
            "read_row":    Out(stream.Signature(8 * read_row_bytes, always_ready=True)),
            "read_done":   Out(1),
            "read_error":  Out(1),
            "write_cmd":   In(stream.Signature(BlockCommand)),
            "write_row":   In(stream.Signature(8 * write_row_bytes)),
            "write_done":  Out(1),
            "write_error": Out(1),
            "idle":        Out(1),
            "soft_reset":  In(1),
        })

    def _row_geometry(self, m, addr, row_bytes, name):
        """Aligned first beat address, byte offset and beat count of a row
        (:func:`hw.dma.bursts.row_geometry`)."""
        return row_geometry(self.bus_bytes, m, addr, row_bytes, name)

    def _next_burst(self, m, beat_addr, beats_left, name):
        """The next burst of a row (:func:`hw.dma.bursts.next_burst`); formal/ mutants
        override it, and the reader and writer call it."""
        return next_burst(self.bus_bytes, m, beat_addr, beats_left, name)

    def elaborate(self, platform):
        m = Module()

        def half(name, component):
            reset = Signal(name=f"core_reset_{name}")
            m.d.sync += reset.eq(self.soft_reset)
            m.submodules[name] = ResetInserter(reset)(component)
            return component

        reader = half("reader", DMAReader(
            data_width=self.data_width, row_bytes=self.read_row_bytes,
            addr_width=self.addr_width, geometry=self))
        writer = half("writer", DMAWriter(
            data_width=self.data_width, row_bytes=self.write_row_bytes,
            addr_width=self.addr_width, geometry=self))
        # The two halves of the AXI4 master: each channel's members, in their direction.
        for half in (reader.bus, writer.bus):
            for name, member in half.signature.members.items():
                ours, theirs = getattr(self.bus, name), getattr(half, name)
                m.d.comb += ours.eq(theirs) if member.flow == Out else theirs.eq(ours)
        wiring.connect(m, wiring.flipped(self.read_cmd), reader.cmd)
        wiring.connect(m, reader.row, wiring.flipped(self.read_row))
        wiring.connect(m, wiring.flipped(self.write_cmd), writer.cmd)
        wiring.connect(m, wiring.flipped(self.write_row), writer.row)
        m.d.comb += [
            self.read_done.eq(reader.done),
            self.read_error.eq(reader.error),
            self.write_done.eq(writer.done),
            self.write_error.eq(writer.error),
            self.idle.eq(reader.idle & writer.idle),
        ]
        return m
