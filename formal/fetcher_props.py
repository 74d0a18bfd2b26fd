"""Property set 4: the instruction queue of the controller never overflows.

The fetcher (:class:`hw.controller.fetcher.Fetcher`) asks for a batch of instructions only
while the words it holds (in the decoder's stages and queue) leave room for all of it. Its
own ``Assert`` (``held`` never above :data:`~hw.config.FETCH_DEPTH`) and the one here (the
queue, modelled as the decoder fills and drains it, never above its depth) are proved with
everything around the fetcher free.
"""

from amaranth.asserts import AnyConst, AnySeq
from amaranth.hdl import Assert, Assume, Cover, Elaboratable, Module, Signal

from hw.config import FETCH_BURST, FETCH_DEPTH
from hw.controller.fetcher import Fetcher


__all__ = ["FetcherProperties"]


class FetcherProperties(Elaboratable):
    """The fetcher with a free environment:

    * the issue stage's controls (``begin``, ``enable``, ``halt``, ``pc`` up to ``prog_len``,
      stores over the program and ``store_busy``) are ``AnySeq``; the program
      (``prog_addr``, ``prog_len`` up to 64 instructions) is ``AnyConst``;
    * the DMA reader takes a command as soon as it is idle (as :class:`hw.dma.DMA`'s reader
      does from the cycle after its ``done``; the fetcher relies on it and asserts it), then
      delivers the rows it asked for, at most one a cycle, at any pace, and ends with ``done`` on the last
      one, or earlier with ``error`` (a bus error ends a command early);
    * the load unit offers any command (held until taken, at least one row);
    * the decoder: a word enters its queue two cycles after the fetcher delivers it (one
      cycle in the fetcher's register, one in the decoder's stage), and the issue stage takes
      the queue's head whenever it likes (``taken``); ``flush`` empties it all.

    In every cycle the modelled queue holds at most :data:`~hw.config.FETCH_DEPTH` words.

    Parameters
    ----------
    fetcher_class : type, optional
        :class:`Fetcher` or a subclass of it (the mutation tests pass broken ones).
    """
    def __init__(self, fetcher_class=Fetcher):
        self.fetcher = fetcher_class(read_row_bytes=16, bus_bytes=8)

    def elaborate(self, platform):
        m = Module()
        m.submodules.fetcher = fetcher = self.fetcher
        control, reader, load, words = fetcher.control, fetcher.reader, fetcher.load, fetcher.words

        prog_len = AnyConst(7)
        m.d.comb += [
            control.begin.eq(AnySeq(1)),
            control.enable.eq(AnySeq(1)),
            control.halt.eq(AnySeq(1)),
            control.prog_addr.eq(AnyConst(28) << 4),
            control.prog_len.eq(prog_len),
            control.pc.eq(AnySeq(7)),
            control.store_issued.eq(AnySeq(1)),
            control.store_lo.eq(AnySeq(32)),
            control.store_hi.eq(AnySeq(33)),
            control.store_busy.eq(AnySeq(1)),
        ]
        # The issue stage's pc never passes the program's length (PROGRAM error there).
        m.d.comb += Assume((prog_len <= 64) & (control.pc <= prog_len))

        # The load unit: any command, held until taken.
        load_valid = Signal()
        load_rows = Signal(16)
        m.d.comb += [load_valid.eq(AnySeq(1)), load_rows.eq(AnySeq(16))]
        m.d.comb += [load.cmd.valid.eq(load_valid), load.cmd.payload.rows.eq(load_rows)]
        m.d.comb += Assume(~load_valid | (load_rows >= 1))
        load_waiting = Signal()
        last_load_rows = Signal(16)
        m.d.sync += [load_waiting.eq(load_valid & ~load.cmd.ready), last_load_rows.eq(load_rows)]
        with m.If(load_waiting):
            m.d.comb += Assume(load_valid & (load_rows == last_load_rows))

        # The DMA reader.
        rows_left = Signal(16)
        row = Signal()
        error = Signal()
        m.d.comb += [reader.cmd.ready.eq(rows_left == 0),
                     row.eq(AnySeq(1) & (rows_left != 0)), error.eq(AnySeq(1) & (rows_left != 0))]
        m.d.comb += [
            reader.row.valid.eq(row & ~error),
            reader.row.payload.eq(AnySeq(128)),
            reader.done.eq(((rows_left == 1) & row) | error),
            reader.error.eq(error),
        ]
        with m.If(reader.done):
            m.d.sync += rows_left.eq(0)
        with m.Elif(row):
            m.d.sync += rows_left.eq(rows_left - 1)
        with m.If(reader.cmd.valid & reader.cmd.ready):
            m.d.sync += rows_left.eq(reader.cmd.payload.rows)
            m.d.comb += Assume(reader.cmd.payload.rows >= 1)

        # The decoder: its stage, its queue, the issue stage taking the head.
        staged = Signal()
        queued = Signal(range(2 * FETCH_DEPTH + 2))
        taken = Signal()
        m.d.comb += [taken.eq(AnySeq(1) & (queued != 0)), words.taken.eq(taken)]
        m.d.sync += [staged.eq(words.word.valid), queued.eq(queued + staged - taken)]
        with m.If(words.flush):
            m.d.sync += [staged.eq(0), queued.eq(0)]
        m.d.comb += Assert(queued <= FETCH_DEPTH)
        m.d.comb += Cover(queued == FETCH_DEPTH)
        m.d.comb += Cover((queued == FETCH_BURST) & load_valid)
        return m
