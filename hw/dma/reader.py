"""The DMA's reader: 2-D strided blocks from DRAM into rows, on the AXI4 read channels."""

from amaranth.hdl import Assert, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..axi import AXI4ReadSignature, Burst, Resp
from ..copies import flag_with_next
from .bursts import MAX_READS_OUTSTANDING, ReadCommand, ceil_div, geometry_for
from .length_queue import LengthQueue


__all__ = ["DMAReader"]


class DMAReader(wiring.Component):
    """Reads blocks (:class:`~hw.dma.bursts.ReadCommand`) into rows of ``row_bytes``.

    It walks a block's rows and bursts on the address channel ahead of the data, at most
    :data:`~hw.dma.bursts.MAX_READS_OUTSTANDING` bursts outstanding, and puts each beat
    into place in the row as it arrives; bytes past ``row_bytes`` read as zero. ``rlast``
    is checked against each burst's ``arlen``; see :class:`~hw.dma.DMA` for what a broken
    slave gets.

    Attributes
    ----------
    bus : Out(AXI4ReadSignature)
    cmd : In(stream.Signature(ReadCommand))
        Accepted when the reader is idle; its ``beats`` must be its first row's (asserted).
    row : Out(stream.Signature(8 * row_bytes, always_ready=True))
    done, error : Out(1)
        As ``read_done`` and ``read_error`` of :class:`~hw.dma.DMA`.
    idle : Out(1)
        No command runs and no burst is outstanding.
    """
    def __init__(self, *, data_width, row_bytes, addr_width=32, geometry=None):
        self.data_width = data_width
        self.bus_bytes = data_width // 8
        self.row_bytes = row_bytes
        self._row_geometry, self._next_burst = geometry_for(self.bus_bytes, geometry)
        super().__init__({
            "bus":   Out(AXI4ReadSignature(addr_width=addr_width, data_width=data_width)),
            "cmd":   In(stream.Signature(ReadCommand)),
            "row":   Out(stream.Signature(8 * row_bytes, always_ready=True)),
            "done":  Out(1),
            "error": Out(1),
            "idle":  Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        bus_bytes = self.bus_bytes
        lg = bus_bytes.bit_length() - 1
        m.d.comb += [bus.arsize.eq(lg), bus.arburst.eq(Burst.INCR), bus.arid.eq(0)]

        read_words = ceil_div(self.row_bytes + bus_bytes - 1, bus_bytes)

        # What a command loads before any use of it has no reset: the reader's reset copy
        # (DMA.soft_reset) drives only its state (its flags, the burst count, the queue), not
        # some two hundred flip-flops over the DMA (routes of 6 to 7.5 ns on the 85F).
        ar_active = Signal()
        ar_row_addr = Signal(32, reset_less=True)
        # The next row's address, in a register: the command brings its first (``next_addr``,
        # made by the requester), each row end adds the stride to it (the sum after the
        # stride's register, then the row's geometry, into the burst registers was a path
        # of the 8x8; a sum after the requesters' arbiter was one too).
        ar_next_row = Signal(32, reset_less=True)
        ar_rows_left = Signal(16, reset_less=True)
        ar_beat_addr = Signal(32, reset_less=True)
        # Beats left of the row: at most read_words, as a command's row_bytes is at most
        # row_bytes (the DMA's contract, asserted), so the burst's 256-beat cap folds away
        # whenever a row fits in 256 beats, and the 4 KiB sum is as short as the row.
        ar_beats_left = Signal(range(read_words + 1), reset_less=True)
        r_active = Signal()
        # The byte offset of the row being received, one copy per byte lane of the beat
        # (``offset_lane_<l>``, kept apart on the FPGA): each lane's rotation and wrap come
        # from its own copy, not all from one register by routes across the row's bytes.
        r_offsets = [Signal(range(bus_bytes), name=f"offset_lane_{lane}", reset_less=True)
                     for lane in range(bus_bytes)]
        r_rows_left = Signal(16, reset_less=True)
        r_error = Signal()
        # A framing error: drain the bursts asked for, then end.
        r_abort, r_abort_next = flag_with_next(m, "r_abort")
        r_burst_beat = Signal(8)    # beat within the burst at the head of read_lengths
        row_bytes = Signal(16, reset_less=True)
        stride = Signal(32, reset_less=True)
        # The row as it is assembled: each beat goes into place as it arrives (rotated by
        # the row's offset into two neighbouring words of the row), masked with the bytes
        # of the command's rows; bytes no beat covers stay zero, as the row is cleared after
        # the reader has been idle (not at the command, whose acceptance would then enable
        # every one of these flip-flops). The row leaves from these flip-flops: no shifter
        # and no comparison after them.
        row_words = ceil_div(self.row_bytes, bus_bytes)
        row = Signal(data.ArrayLayout(8, row_words * bus_bytes), reset_less=True)
        # The bytes of the command's rows, from its registered row_bytes in the cycle after
        # the command (no enable, and no path from the command's source): the first beat
        # comes at least a cycle after the first address, which leaves the cycle after that.
        byte_mask = Signal(self.row_bytes, reset_less=True)
        # One-hot: the beat of the row that arrives next.
        beat_is = Signal(read_words, reset_less=True)
        # The data side's start, a cycle after the command: the command's handshake (late in
        # its cycle: the fetcher's grant) enables only these few flip-flops by the command's
        # source, and the next cycle loads the data side's registers from them (the offset's
        # copies lie by their byte lanes: the handshake's route to them was the 8x8's longest
        # path). The first beat comes at least a cycle after the first address, which is
        # offered in the cycle after the command: the data side is not read before then.
        r_start = Signal()
        r_start_offset = Signal(range(bus_bytes), reset_less=True)
        r_start_rows = Signal(16, reset_less=True)
        emit = Signal()
        emit_last = Signal(reset_less=True)

        m.d.comb += [self.idle.eq(~ar_active & ~r_active & ~emit), self.cmd.ready.eq(self.idle)]

        cmd = self.cmd.payload
        m.d.sync += Assert(~self.cmd.valid | (cmd.row_bytes <= self.row_bytes),
                           "a DMA read command with rows wider than the reader's")
        first_aligned, _, first_beats = self._row_geometry(m, cmd.addr, cmd.row_bytes, "rd_first")
        m.d.sync += Assert(~self.cmd.valid | ((cmd.beats == first_beats) &
                                              (cmd.next_addr == (cmd.addr + cmd.stride)[:32])),
                           "a DMA read command whose beats or next row are not its own")
        with m.If(self.cmd.valid & self.cmd.ready):
            m.d.comb += r_abort_next.eq(0)
            m.d.sync += [
                ar_active.eq(1), ar_row_addr.eq(cmd.addr), ar_next_row.eq(cmd.next_addr),
                ar_rows_left.eq(cmd.rows),
                ar_beat_addr.eq(first_aligned), ar_beats_left.eq(cmd.beats),
                r_active.eq(1),
                r_start_rows.eq(cmd.rows), r_start_offset.eq(cmd.addr[:lg]),
                r_error.eq(0),
                row_bytes.eq(cmd.row_bytes), stride.eq(cmd.stride),
            ]
        m.d.sync += r_start.eq(self.cmd.valid & self.cmd.ready)
        with m.If(r_start):
            m.d.sync += [
                r_rows_left.eq(r_start_rows),
                *[r_offset.eq(r_start_offset) for r_offset in r_offsets],
                beat_is.eq(1),
            ]

        # The arlen of every burst asked for and not yet received, oldest first, and whether
        # it ends its row: its depth bounds the reads outstanding. The data side ends a row
        # at the last beat asked of a burst that ends one, so its row end is an 8-bit
        # equality, not the row's beat count summed again from its offset and length.
        lengths = LengthQueue(MAX_READS_OUTSTANDING)
        head_len = lengths.head[:8]
        head_ends_row = lengths.head[8]

        # Address side: walks the rows and their bursts, ahead of the data.
        m.d.sync += Assert(~ar_active | (ar_next_row == (ar_row_addr + stride)[:32]),
                           "DMA reader: the next row's address out of step")
        ar_next_aligned, _, ar_next_beats = self._row_geometry(m, ar_next_row, row_bytes,
                                                               "rd_next")
        ar_len, ar_len_minus_one, ar_last, ar_after_addr, ar_after_left = self._next_burst(
            m, ar_beat_addr, ar_beats_left, "rd")
        m.d.comb += [
            bus.araddr.eq(ar_beat_addr),
            bus.arlen.eq(ar_len_minus_one),
            # The queue only fills at a handshake, so an address offered stays offered.
            bus.arvalid.eq(ar_active & lengths.w_rdy),
            lengths.w_en.eq(bus.arvalid & bus.arready),
            lengths.w_data.eq(Cat(ar_len_minus_one, ar_last)),
        ]
        with m.If(bus.arvalid & bus.arready):
            m.d.sync += [
                ar_beat_addr.eq(ar_after_addr),
                ar_beats_left.eq(ar_after_left),
            ]
            with m.If(ar_last):
                m.d.sync += [
                    ar_rows_left.eq(ar_rows_left - 1),
                    ar_row_addr.eq(ar_next_row), ar_next_row.eq(ar_next_row + stride),
                    ar_beat_addr.eq(ar_next_aligned),
                    ar_beats_left.eq(ar_next_beats),
                ]
                with m.If(ar_rows_left == 1):
                    m.d.sync += ar_active.eq(0)
            with m.If(r_abort):
                m.d.sync += ar_active.eq(0)
        with m.Elif(r_active & r_abort & ~bus.arvalid):
            # After a framing error no more addresses; one offered goes first (AXI A3.2.1).
            m.d.sync += ar_active.eq(0)

        # Framing: each beat against the head of read_lengths. A burst ends at its rlast or
        # at its last beat asked, whichever comes first, so a broken slave is drained too.
        r_fire = bus.rvalid & bus.rready
        m.d.sync += Assert(~r_start | ~(r_fire & lengths.r_rdy),
                           "the DMA reader took a beat in the cycle of its data side's start")
        # Whether the beat that comes next is the last asked of the head's burst, in a
        # flip-flop made from the next head and beat count (the queue's read and this
        # comparison, before the row end's enables, were the 4x4's longest paths).
        asked_last = Signal()
        burst_end = r_fire & lengths.r_rdy & (bus.rlast | asked_last)
        m.d.comb += [
            # Never low: every beat is taken at once (see MAX_READS_OUTSTANDING), and a beat
            # no burst asked for is dropped rather than left to block the channel.
            bus.rready.eq(1),
            lengths.r_en.eq(burst_end),
        ]
        beat_next = Signal.like(r_burst_beat)
        m.d.comb += beat_next.eq(r_burst_beat)
        with m.If(r_fire & lengths.r_rdy):
            m.d.comb += beat_next.eq(r_burst_beat + 1)
            with m.If(burst_end):
                m.d.comb += beat_next.eq(0)
        # And whether that beat ends a row (with a burst to frame it), for the row's end.
        # A burst asked for now that goes to the head at this edge (its first beat is then
        # the next) is one beat when the row has one left or it is the last before 4 KiB,
        # and it ends its row in the first case: two comparisons of the address side's
        # registers, not the burst length's sums and the queue's choice after them (those
        # were the 8x8's and the 4x4's longest paths). Asserted equal to its entry.
        one_left = ar_beats_left == 1
        one_beat = one_left | (ar_beat_addr[lg:12] == (4096 >> lg) - 1)
        m.d.sync += Assert(~lengths.w_to_head |
                           ((beat_next == 0) & (one_beat == (ar_len_minus_one == 0)) &
                            (one_left == (one_beat & ar_last))),
                           "the DMA reader's one-beat burst terms out of step")
        row_end = Signal()
        last_next = beat_next == lengths.head_next[:8]
        m.d.sync += [r_burst_beat.eq(beat_next),
                     asked_last.eq(Mux(lengths.w_to_head, one_beat, last_next)),
                     row_end.eq(Mux(lengths.w_to_head, one_left,
                                    lengths.r_rdy_next & last_next & lengths.head_next[8]))]
        m.d.sync += Assert(row_end == (lengths.r_rdy & asked_last & head_ends_row),
                           "the DMA reader's row_end out of step")
        m.d.sync += [
            Assert(~lengths.r_rdy | (asked_last == (r_burst_beat == head_len)),
                   "the DMA reader's asked_last out of step"),
            # (Each burst's end clears the count, and a beat is counted only with a burst.)
            Assert(lengths.r_rdy | (r_burst_beat == 0), "the DMA reader's beat count left over"),
        ]
        with m.If(r_active & r_fire & (~lengths.r_rdy | (bus.rlast != asked_last))):
            m.d.comb += r_abort_next.eq(1)
            m.d.sync += r_error.eq(1)
        drained = Signal()
        m.d.comb += drained.eq(r_active & r_abort & ~ar_active & ~lengths.r_rdy)
        with m.If(drained):
            m.d.sync += r_active.eq(0)

        # Data side: walks the same rows, collecting each row's beats into the buffer; of
        # a row's address it needs only the offset, whose next value is a sum of lg bits.
        # Row byte j is byte offset + j of the row's beats: lane l of the rotated beat k
        # is row byte k * bus_bytes + l, or one word lower where the rotation wrapped.
        rdata = data.ArrayLayout(8, bus_bytes)(bus.rdata)
        rotated = Signal(data.ArrayLayout(8, bus_bytes))
        wrapped = Signal(bus_bytes)
        for lane, r_offset in enumerate(r_offsets):
            with m.Switch(r_offset):
                for offset in range(bus_bytes):
                    with m.Case(offset):
                        m.d.comb += [rotated[lane].eq(rdata[(lane + offset) % bus_bytes]),
                                     wrapped[lane].eq(lane + offset >= bus_bytes)]
        m.d.sync += Assert(Cat(*[r_offset == r_offsets[0] for r_offset in r_offsets]).all(),
                           "the DMA reader's offset copies differ")
        m.d.sync += emit.eq(0)
        for byte in range(self.row_bytes):
            m.d.sync += byte_mask[byte].eq(byte < row_bytes)
        # The clear is a cycle late, from copies of ``idle`` registered once per word of the
        # row (``clear_word_<w>``, kept apart on the FPGA): ``idle``'s logic and one route to
        # every byte of the row were a group of the 8x8's failing paths. For a command taken
        # in a cycle the reader is idle, the row is cleared at the end of the next cycle,
        # before its first beat can come; no row is emitted while ``idle``.
        for word in range(row_words):
            clear = Signal(name=f"clear_word_{word}")
            m.d.sync += clear.eq(self.idle)
            with m.If(clear):
                m.d.sync += [row[word * bus_bytes + lane].eq(0) for lane in range(bus_bytes)]
        # A beat is taken into the row under copies, one per word of the row
        # (``beat_word_<w>``, kept apart on the FPGA), of ``lengths.r_rdy & ~r_abort``,
        # loaded with their next values: the burst queue's flag, by the queue, had routes of
        # 5 ns into the row's enables (groups of 142 and 16 failing paths on two runs).
        taking = r_fire & lengths.r_rdy & ~r_abort
        word_taking = []
        for word in range(row_words):
            copy = Signal(name=f"beat_word_{word}")
            m.d.sync += copy.eq(lengths.r_rdy_next & ~r_abort_next)
            m.d.sync += Assert(copy == (lengths.r_rdy & ~r_abort),
                               "the DMA reader's beat copies out of step")
            word_taking.append(r_fire & copy)
        for beat in range(read_words):
            for lane in range(bus_bytes):
                # From this beat, or (wrapped lanes) from the beat after.
                for word, lanes in ((beat, ~wrapped[lane]), (beat - 1, wrapped[lane])):
                    byte = word * bus_bytes + lane
                    if 0 <= byte < self.row_bytes:
                        with m.If(word_taking[word] & beat_is[beat] & lanes):
                            m.d.sync += row[byte].eq(
                                rotated[lane] & byte_mask[byte].replicate(8))
        with m.If(taking):
            with m.If((bus.rresp == Resp.SLVERR) | (bus.rresp == Resp.DECERR)):
                m.d.sync += r_error.eq(1)
            m.d.sync += beat_is.eq(beat_is << 1)
            with m.If(row_end):
                m.d.sync += [
                    emit.eq(1),
                    emit_last.eq(r_rows_left == 1),
                    beat_is.eq(1),
                    r_rows_left.eq(r_rows_left - 1),
                    *[r_offset.eq(r_offset + stride[:lg]) for r_offset in r_offsets],
                ]
                with m.If(r_rows_left == 1):
                    m.d.sync += r_active.eq(0)

        m.d.comb += [
            self.row.payload.eq(row.as_value()[:8 * self.row_bytes]),
            self.row.valid.eq(emit & ~r_error),
            self.done.eq((emit & emit_last) | drained),
            self.error.eq(r_error),
        ]
        m.submodules.read_lengths = lengths
        return m
