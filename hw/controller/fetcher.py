"""The fetcher: reads the program ahead for the decoder and its instruction queue, sharing
the DMA reader with the load unit."""

from amaranth.hdl import Assert, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import FETCH_BURST, FETCH_DEPTH, FETCH_HIGH_WATER, FETCH_LOW_WATER
from ..isa import INSTR_BYTES, Instruction
from ..copies import flag_with_next
from ..dma import row_beats
from .signatures import ReaderSignature, status_copy


__all__ = ["Fetcher", "FetchControlSignature", "FetchedWord", "WordsSignature"]


class FetchedWord(data.Struct):
    """A fetched instruction word, or the error entry a failed fetch leaves in its place
    (``bus_error``)."""
    instr:     Instruction
    bus_error: 1


def WordsSignature():
    """From the fetcher to the decoder, as the fetcher sees it: the fetched words, one a
    cycle at most, never stalled (``word``); ``ahead``, what ``word.payload.instr`` holds
    from the next edge (the decoder's multipliers register their operands from it);
    ``flush``, drop every word not yet issued (a start, or a refetch); ``taken``, a word left
    the instruction queue for the issue stage. The fetcher counts the words between (at
    most :data:`~hw.config.FETCH_DEPTH`)."""
    return wiring.Signature({
        "word":  Out(stream.Signature(FetchedWord, always_ready=True)),
        "ahead": Out(Instruction),
        "flush": Out(1),
        "taken": In(1),
    })


def FetchControlSignature():
    """The link from the issue stage to the fetcher, as the issue stage sees it.

    ``begin`` (a start): empty the queue and fetch from the first instruction of the program
    at ``prog_addr`` (``prog_len`` instructions; both read only in the cycle of ``begin``).
    ``enable``: fetching is allowed this cycle.
    ``store_issued`` with the store's DRAM bytes ``[store_lo, store_hi)``: when they overlap
    the program, the fetcher drops what it fetched once ``store_busy`` falls and refetches
    from ``pc`` (``refetch`` is high until then). ``halt``: grant the reader to nobody.
    """
    return wiring.Signature({
        "begin":        Out(1),
        "enable":       Out(1),
        "halt":         Out(1),
        "prog_addr":    Out(32),
        "prog_len":     Out(32),
        "pc":           Out(32),
        "store_issued": Out(1),
        "store_lo":     Out(32),
        "store_hi":     Out(33),
        "store_busy":   Out(1),
        "refetch":      In(1),
        "reader_busy":  In(1),
    })


class Fetcher(wiring.Component):
    """Reads the program, :data:`~hw.config.FETCH_BURST` instructions per DMA command, for
    the decoder and its queue of :data:`~hw.config.FETCH_DEPTH` entries.

    Each fetched word goes out from a register, the cycle after the DMA delivered it. The
    fetcher counts the words it delivered that have not left the queue (``held``: the
    decoder's pipeline and queue) and asks for a batch while all of it fits (``held`` at
    most :data:`~hw.config.FETCH_HIGH_WATER`). The DMA reader is shared: the load unit's
    command goes first unless few words are held (below :data:`~hw.config.FETCH_LOW_WATER`),
    and the rows of the load unit's commands go to it (``load``).

    Parameters
    ----------
    read_row_bytes : int
        The DMA reader's row.
    bus_bytes : int
        The AXI4 data bus's width in bytes: a fetch command's first row's beats (every one
        of its rows has as many: the instructions are aligned to their size).

    Attributes
    ----------
    control : In(FetchControlSignature())
    reader : Out(ReaderSignature)
        To the DMA reader.
    load : In(ReaderSignature)
        The load unit's share of the reader.
    words : Out(WordsSignature())
        To the decoder.
    """
    #: The most words held when a batch is asked for (a class attribute so that
    #: ``formal/`` can break it in a mutant).
    high_water = FETCH_HIGH_WATER

    def __init__(self, *, read_row_bytes, bus_bytes):
        self.read_row_bytes = read_row_bytes
        self.bus_bytes = bus_bytes
        super().__init__({
            "control": In(FetchControlSignature()),
            "reader":  Out(ReaderSignature(8 * read_row_bytes)),
            "load":    In(ReaderSignature(8 * read_row_bytes)),
            "words":   Out(WordsSignature()),
        })

    def elaborate(self, platform):
        m = Module()
        control, reader, load = self.control, self.reader, self.load

        words = self.words
        held = Signal(range(FETCH_DEPTH + 1))   # words delivered, not yet out of the queue
        word_in = Signal()
        # The issue stage asks for a batch only while it fits: the queue cannot overflow.
        m.d.sync += Assert(held + word_in - words.taken <= FETCH_DEPTH,
                           "instruction queue overflow")
        m.d.sync += held.eq(held + word_in - words.taken)
        # ``held`` as a thermometer (bit i: held > i), shifted as words come and go: the
        # arbiter's watermarks are single bits of it, not compares of the count after its
        # adder (the count's compares before the grant were paths into the reader).
        held_above = Signal(FETCH_DEPTH)
        with m.If(word_in & ~words.taken):
            m.d.sync += held_above.eq(Cat(1, held_above[:-1]))
        with m.If(words.taken & ~word_in):
            m.d.sync += held_above.eq(held_above[1:])
        m.d.sync += Assert(held_above == Cat(*[held > i for i in range(FETCH_DEPTH)]),
                           "fetcher: the held thermometer out of step")

        # The next fetch, kept in registers as the fetcher moves on, so that no sum or
        # comparison lies between the grant and the reader: the DRAM address of the next
        # instruction it delivers, and the instructions left from it to the program's end.
        fetch_addr = Signal(32)
        fetch_left = Signal(32)
        fetch_left_next = Signal(32)
        fetch_more = Signal()        # fetch_left != 0
        fetch_full = Signal()        # fetch_left >= FETCH_BURST
        # Its flags are set beside each change of the count, from what it changes from (a
        # word in: fetch_left != 1; the subtraction then the comparisons, after the reader's
        # row, were a long path); asserted.
        m.d.comb += fetch_left_next.eq(fetch_left)
        m.d.sync += fetch_left.eq(fetch_left_next)
        m.d.sync += Assert((fetch_more == (fetch_left != 0)) &
                           (fetch_full == (fetch_left >= FETCH_BURST)),
                           "fetcher: the fetch count's flags out of step")
        fetch_stop = Signal()        # a fetch failed: the queue ends in its error entry
        # A store over the program: refetch after it.
        refetch, refetch_next = flag_with_next(m, "refetch")
        reader_busy = Signal()
        reader_is_load = Signal()    # the command in the reader is the load unit's
        # The issue stage reads a copy of its own (its decision's first input).
        m.d.comb += control.refetch.eq(status_copy(m, "refetch", refetch, refetch_next))

        # The program (its address, length and end) in registers of the fetcher's own,
        # loaded at ``begin``: the checks and sums of a run start from flip-flops (the sum
        # from the host's registers and the compares after it were the NPU's longest path;
        # later, the issue stage's choice between the host's registers and its own, whose
        # select comes from ``running``, was the 4x4's). The issue stage issues no store in
        # the cycle of ``begin`` (it has nothing fetched yet), so the check below never sees
        # them stale. That is the issue stage's promise, not the fetcher's (its formal proof
        # leaves ``store_issued`` free), so no Assert here.
        program_addr = Signal(32)
        program_len = Signal(32)
        prog_end = Signal(34)
        with m.If(control.begin):
            m.d.sync += [program_addr.eq(control.prog_addr), program_len.eq(control.prog_len),
                         prog_end.eq(control.prog_addr + control.prog_len * INSTR_BYTES)]
        with m.If(control.store_issued & (control.store_lo < prog_end) &
                  (program_addr < control.store_hi)):
            m.d.comb += refetch_next.eq(1)

        # ------------------------------------------------------------ reader arbiter
        fetch_rows = Signal(range(FETCH_BURST + 1))
        m.d.comb += fetch_rows.eq(Mux(fetch_full, FETCH_BURST, fetch_left))
        fetch_want = (control.enable & ~refetch & ~fetch_stop &
                      fetch_more & ~held_above[self.high_water])
        grant_fetch = Signal()
        grant_load = Signal()
        # The reader is idle from the cycle after its ``done`` (and after a reset), so a
        # command offered while ``reader_busy`` is low is taken at once: the fetcher does not
        # wait for the reader's ``cmd.ready``, which comes from flip-flops placed by the DMA,
        # far away (a path of 19 ns on the 85F). Asserted below.
        m.d.comb += control.reader_busy.eq(reader_busy)
        with m.If(~reader_busy & ~control.halt):
            with m.If(fetch_want & (~load.cmd.valid | ~held_above[FETCH_LOW_WATER - 1])):
                m.d.comb += grant_fetch.eq(1)
            with m.Elif(load.cmd.valid):
                m.d.comb += grant_load.eq(1)
        m.d.comb += reader.cmd.valid.eq(grant_fetch | grant_load)
        with m.If(grant_fetch):
            m.d.comb += [
                reader.cmd.payload.addr.eq(fetch_addr),
                reader.cmd.payload.rows.eq(fetch_rows),
                reader.cmd.payload.row_bytes.eq(INSTR_BYTES),
                reader.cmd.payload.stride.eq(INSTR_BYTES),
                # An instruction's beats, at any address aligned to its size.
                reader.cmd.payload.beats.eq(row_beats(self.bus_bytes, 0, INSTR_BYTES)),
                reader.cmd.payload.next_addr.eq(fetch_addr + INSTR_BYTES),
            ]
        with m.Else():
            m.d.comb += reader.cmd.payload.eq(load.cmd.payload)
        m.d.comb += load.cmd.ready.eq(grant_load)
        m.d.sync += Assert(~reader.cmd.valid | reader.cmd.ready,
                           "the DMA reader is busy while the fetcher counts it idle")
        with m.If(reader.cmd.valid):
            m.d.sync += [reader_busy.eq(1), reader_is_load.eq(grant_load)]
        with m.If(reader.done):
            m.d.sync += reader_busy.eq(0)

        # ------------------------------------------------------------ rows to their user
        loading = reader_busy & reader_is_load
        m.d.comb += [
            load.row.valid.eq(loading & reader.row.valid),
            load.row.payload.eq(reader.row.payload),
            load.done.eq(loading & reader.done),
            load.error.eq(reader.error),
        ]
        # Fetched words go out from a register; a failed fetch leaves an error entry. The
        # word's register takes the reader's row in every cycle (no enable: the row's valid
        # flag, from the reader's error flag across the die, reached all its flip-flops);
        # it is read only with ``valid``.
        fetching = reader_busy & ~reader_is_load
        m.d.sync += [words.word.valid.eq(word_in), words.word.payload.bus_error.eq(0),
                     words.word.payload.instr.eq(reader.row.payload)]
        m.d.comb += words.ahead.eq(reader.row.payload)
        with m.If(fetching & reader.row.valid):
            m.d.comb += word_in.eq(1)
            m.d.comb += fetch_left_next.eq(fetch_left - 1)
            m.d.sync += [fetch_addr.eq(fetch_addr + INSTR_BYTES),
                         fetch_more.eq(fetch_left != 1),
                         fetch_full.eq(fetch_left >= FETCH_BURST + 1)]
        with m.If(fetching & reader.done & reader.error):
            m.d.comb += word_in.eq(1)
            m.d.sync += [fetch_stop.eq(1), words.word.payload.bus_error.eq(1)]

        # After a store over the program: drop what was fetched, read on from pc. Where to
        # and how much is made from pc a cycle ahead, in registers (pc's route from the issue
        # stage and the subtraction were the 4x4's longest path): the issue stage issues
        # nothing while ``refetch`` is high, and the store keeps ``store_busy`` high in the
        # cycle after its issue, the one cycle in which pc differs from the cycle before
        # (the issue stage's promise, asserted there).
        refetch_addr = Signal(32)
        refetch_left = Signal(32)
        refetch_more = Signal()
        refetch_full = Signal()
        m.d.sync += [refetch_addr.eq(program_addr + control.pc * INSTR_BYTES),
                     refetch_left.eq(program_len - control.pc),
                     refetch_more.eq(program_len != control.pc),
                     refetch_full.eq(program_len >= control.pc + FETCH_BURST)]
        with m.If(refetch & ~control.store_busy & ~reader_busy):
            m.d.comb += words.flush.eq(1)
            m.d.comb += refetch_next.eq(0)
            m.d.sync += [fetch_stop.eq(0), fetch_addr.eq(refetch_addr),
                         fetch_more.eq(refetch_more), fetch_full.eq(refetch_full)]
            m.d.comb += fetch_left_next.eq(refetch_left)

        # (``fetch_more`` and ``fetch_full`` from the length itself, beside the other
        # choices: ``begin`` comes late in its cycle.)
        with m.If(control.begin):
            m.d.comb += words.flush.eq(1)
            m.d.comb += fetch_left_next.eq(control.prog_len)
            m.d.comb += refetch_next.eq(0)
            m.d.sync += [fetch_addr.eq(control.prog_addr), fetch_stop.eq(0),
                         fetch_more.eq(control.prog_len != 0),
                         fetch_full.eq(control.prog_len >= FETCH_BURST)]
        with m.If(words.flush):
            m.d.sync += [held.eq(0), held_above.eq(0), words.word.valid.eq(0)]
        return m
