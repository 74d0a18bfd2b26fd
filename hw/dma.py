"""The DMA engine: an AXI4 master moving 2-D strided blocks between DRAM and local rows."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from .axi import AXI4Signature, Burst, Resp


__all__ = ["BlockCommand", "DMA", "MAX_READS_OUTSTANDING"]


#: Read bursts the reader has asked for (AR accepted) and not yet received in full, at most.
#: The reader takes every R beat the cycle it comes (``rready`` is never low: a row leaves its
#: one-row buffer the cycle after its last beat, to a consumer that is always ready), so its
#: buffer needs no bound to be safe; the bound is the depth of the queue of burst lengths that
#: the ``rlast`` check compares against, and what a slave must be able to queue. Eight keeps
#: the R channel busy with one-beat bursts (instruction fetch on a bus of 128 bits or more,
#: narrow rows) while a read's round trip, address accepted to first beat, is at most seven
#: cycles, and it is the simulated DRAM's read queue depth (``AR_DEPTH`` in
#: sim/hdl/npu_axi_dram.v), so that DRAM never holds an address back.
MAX_READS_OUTSTANDING = 8


class BlockCommand(data.Struct):
    """A 2-D strided block: row ``r`` is ``row_bytes`` bytes at ``addr + r * stride``."""
    addr:      32
    rows:      16
    row_bytes: 16
    stride:    32


def _ceil_div(a, b):
    return -(-a // b)


class DMA(wiring.Component):
    """AXI4 master with a block reader (DRAM -> rows) and a block writer (rows -> DRAM).

    Rows may start at any byte address: the reader fetches the bus-aligned beats that cover a
    row and shifts it into place, the writer shifts each row onto the bus and masks it with
    ``wstrb``. Every burst is INCR with full-width beats, at most 256 beats long, and never
    crosses a 4 KiB boundary. The reader issues addresses ahead of the data it receives
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
    read_cmd : In(stream.Signature(BlockCommand))
        Read a block; accepted when the reader is idle. ``rows`` and ``row_bytes`` are
        non-zero and ``row_bytes <= read_row_bytes`` (the controller checks).
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
        The rows to write, in order.
    write_done, write_error : Out(1)
        ``write_done`` pulses once every write response has come back; ``write_error`` is
        then high if one was SLVERR or DECERR or a response came that no burst awaited.
    idle : Out(1)
        No command is running and nothing is outstanding on the bus.
    """
    def __init__(self, *, data_width, read_row_bytes, write_row_bytes, addr_width=32):
        self.data_width = data_width
        self.bus_bytes = data_width // 8
        self.read_row_bytes = read_row_bytes
        self.write_row_bytes = write_row_bytes
        super().__init__({
            "bus":         Out(AXI4Signature(addr_width=addr_width, data_width=data_width)),
            "read_cmd":    In(stream.Signature(BlockCommand)),
            "read_row":    Out(stream.Signature(8 * read_row_bytes, always_ready=True)),
            "read_done":   Out(1),
            "read_error":  Out(1),
            "write_cmd":   In(stream.Signature(BlockCommand)),
            "write_row":   In(stream.Signature(8 * write_row_bytes)),
            "write_done":  Out(1),
            "write_error": Out(1),
            "idle":        Out(1),
        })

    def _row_geometry(self, m, addr, row_bytes, name):
        """Aligned first beat address, byte offset and beat count of a row."""
        lg = self.bus_bytes.bit_length() - 1
        offset = Signal(range(self.bus_bytes), name=f"{name}_offset")
        beats = Signal(17, name=f"{name}_beats")
        m.d.comb += [
            offset.eq(addr[:lg]),
            beats.eq((offset + row_bytes + self.bus_bytes - 1) >> lg),
        ]
        aligned = Cat(Const(0, lg), addr[lg:])
        return aligned, offset, beats

    def _next_burst(self, m, beat_addr, beats_left, name):
        """The next burst of a row at the bus-aligned ``beat_addr`` with ``beats_left`` beats
        to go: the rest of the row, cut at 4 KiB and at 256 beats.

        Returns ``(length, length_minus_one, last, next_addr, next_left)``: the burst's beats
        (and the AXI ``len`` field), whether it ends the row, and the beat address and beats
        left after it. Each of the three possible
        lengths has its own sums, formed from the registers side by side; only the choice
        between them waits for the comparison (one carry chain), not another sum after it.
        """
        lg = self.bus_bytes.bit_length() - 1
        page = 4096 >> lg                    # beats in 4 KiB
        into_page = beat_addr[lg:12]         # beats of this 4 KiB before beat_addr
        to_boundary = Signal(range(page + 1), name=f"{name}_to_4k")
        m.d.comb += to_boundary.eq(page - into_page)
        # beats_left <= to_boundary, i.e. beats_left + into_page <= page (a power of two).
        reach = Signal(18, name=f"{name}_reach")
        m.d.comb += reach.eq(beats_left + into_page)
        within_page = ((reach >> (12 - lg)) == 0) | (reach == page)
        within_cap = ((beats_left >> 8) == 0) | (beats_left == 256)
        last = Signal(name=f"{name}_burst_last")
        page_first = Signal(name=f"{name}_burst_to_4k")     # else cut at 256 beats
        m.d.comb += [last.eq(within_page & within_cap),
                     page_first.eq(into_page >= page - 256)]     # to_boundary <= 256

        length = Signal(range(257), name=f"{name}_burst_len")
        length_minus_one = Signal(8, name=f"{name}_burst_len_minus_one")
        next_addr = Signal(32, name=f"{name}_next_beat_addr")
        next_left = Signal(17, name=f"{name}_next_beats_left")
        # The three ends: the row's, the next 4 KiB boundary, 256 beats on.
        row_end = (beat_addr + (beats_left << lg))[:32]
        page_end = Cat(Const(0, 12), beat_addr[12:] + 1)
        cap_end = (beat_addr + (256 << lg))[:32]
        with m.If(last):
            m.d.comb += [length.eq(beats_left), length_minus_one.eq(beats_left - 1),
                         next_addr.eq(row_end), next_left.eq(0)]
        with m.Elif(page_first):
            # to_boundary - 1 = (page - 1) - into_page; beats_left - to_boundary =
            # beats_left + (into_page - page), and into_page - page is into_page with a
            # sign bit on top.
            m.d.comb += [length.eq(to_boundary), length_minus_one.eq(~into_page),
                         next_addr.eq(page_end),
                         next_left.eq(beats_left + Cat(into_page, Const(1, 1)).as_signed())]
        with m.Else():
            m.d.comb += [length.eq(256), length_minus_one.eq(255), next_addr.eq(cap_end),
                         next_left.eq(beats_left - 256)]
        return length, length_minus_one, last, next_addr, next_left

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        bus_bytes = self.bus_bytes
        lg = bus_bytes.bit_length() - 1

        m.d.comb += [
            bus.arsize.eq(lg), bus.arburst.eq(Burst.INCR), bus.arid.eq(0),
            bus.awsize.eq(lg), bus.awburst.eq(Burst.INCR), bus.awid.eq(0),
        ]

        # ---------------------------------------------------------------- reader
        read_words = _ceil_div(self.read_row_bytes + bus_bytes - 1, bus_bytes)

        ar_active = Signal()
        ar_row_addr = Signal(32)
        ar_rows_left = Signal(16)
        ar_beat_addr = Signal(32)
        ar_beats_left = Signal(17)
        r_active = Signal()
        r_row_addr = Signal(32)
        r_rows_left = Signal(16)
        r_beat = Signal(17)
        r_error = Signal()
        r_abort = Signal()          # a framing error: drain the bursts asked for, then end
        r_burst_beat = Signal(8)    # beat within the burst at the head of read_lengths
        row_bytes = Signal(16)
        stride = Signal(32)
        buffer = Signal(data.ArrayLayout(self.data_width, read_words))
        emit = Signal()
        emit_last = Signal()
        emit_offset = Signal(range(bus_bytes))

        m.d.comb += self.read_cmd.ready.eq(~ar_active & ~r_active & ~emit)

        cmd = self.read_cmd.payload
        first_aligned, _, first_beats = self._row_geometry(m, cmd.addr, cmd.row_bytes, "rd_first")
        with m.If(self.read_cmd.valid & self.read_cmd.ready):
            m.d.sync += [
                ar_active.eq(1), ar_row_addr.eq(cmd.addr), ar_rows_left.eq(cmd.rows),
                ar_beat_addr.eq(first_aligned), ar_beats_left.eq(first_beats),
                r_active.eq(1), r_row_addr.eq(cmd.addr), r_rows_left.eq(cmd.rows),
                r_beat.eq(0), r_error.eq(0), r_abort.eq(0), r_burst_beat.eq(0),
                row_bytes.eq(cmd.row_bytes), stride.eq(cmd.stride),
            ]

        # The arlen of every burst asked for and not yet received, oldest first: its depth
        # bounds the reads outstanding.
        m.submodules.read_lengths = lengths = fifo.SyncFIFO(width=8,
                                                            depth=MAX_READS_OUTSTANDING)

        # Address side: walks the rows and their bursts, ahead of the data.
        ar_next_row = ar_row_addr + stride
        ar_next_aligned, _, ar_next_beats = self._row_geometry(m, ar_next_row[:32], row_bytes,
                                                               "rd_next")
        ar_len, ar_len_minus_one, ar_last, ar_after_addr, ar_after_left = self._next_burst(
            m, ar_beat_addr, ar_beats_left, "rd")
        m.d.comb += [
            bus.araddr.eq(ar_beat_addr),
            bus.arlen.eq(ar_len_minus_one),
            # The queue only fills at a handshake, so an address offered stays offered.
            bus.arvalid.eq(ar_active & lengths.w_rdy),
            lengths.w_en.eq(bus.arvalid & bus.arready),
            lengths.w_data.eq(ar_len_minus_one),
        ]
        with m.If(bus.arvalid & bus.arready):
            m.d.sync += [
                ar_beat_addr.eq(ar_after_addr),
                ar_beats_left.eq(ar_after_left),
            ]
            with m.If(ar_last):
                m.d.sync += [
                    ar_rows_left.eq(ar_rows_left - 1),
                    ar_row_addr.eq(ar_next_row),
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
        asked_last = Signal()
        m.d.comb += asked_last.eq(r_burst_beat == lengths.r_data)
        burst_end = r_fire & lengths.r_rdy & (bus.rlast | asked_last)
        m.d.comb += [
            # Never low: every beat is taken at once (see MAX_READS_OUTSTANDING), and a beat
            # no burst asked for is dropped rather than left to block the channel.
            bus.rready.eq(1),
            lengths.r_en.eq(burst_end),
        ]
        with m.If(r_fire & lengths.r_rdy):
            m.d.sync += r_burst_beat.eq(r_burst_beat + 1)
            with m.If(burst_end):
                m.d.sync += r_burst_beat.eq(0)
        with m.If(r_active & r_fire & (~lengths.r_rdy | (bus.rlast != asked_last))):
            m.d.sync += [r_abort.eq(1), r_error.eq(1)]
        drained = Signal()
        m.d.comb += drained.eq(r_active & r_abort & ~ar_active & ~lengths.r_rdy)
        with m.If(drained):
            m.d.sync += r_active.eq(0)

        # Data side: walks the same rows, collecting each row's beats into the buffer.
        _, r_offset, r_beats = self._row_geometry(m, r_row_addr, row_bytes, "rd_data")
        m.d.sync += emit.eq(0)
        with m.If(r_fire & lengths.r_rdy & ~r_abort):
            m.d.sync += buffer[r_beat].eq(bus.rdata)
            with m.If((bus.rresp == Resp.SLVERR) | (bus.rresp == Resp.DECERR)):
                m.d.sync += r_error.eq(1)
            m.d.sync += r_beat.eq(r_beat + 1)
            with m.If(r_beat == r_beats - 1):
                m.d.sync += [
                    emit.eq(1),
                    emit_offset.eq(r_offset),
                    emit_last.eq(r_rows_left == 1),
                    r_beat.eq(0),
                    r_rows_left.eq(r_rows_left - 1),
                    r_row_addr.eq(r_row_addr + stride),
                ]
                with m.If(r_rows_left == 1):
                    m.d.sync += r_active.eq(0)

        shifted = Signal(8 * self.read_row_bytes)
        m.d.comb += shifted.eq(buffer.as_value() >> (emit_offset * 8))
        for byte in range(self.read_row_bytes):
            with m.If(byte < row_bytes):
                m.d.comb += self.read_row.payload[8 * byte:8 * byte + 8].eq(
                    shifted[8 * byte:8 * byte + 8])
        m.d.comb += [
            self.read_row.valid.eq(emit & ~r_error),
            self.read_done.eq((emit & emit_last) | drained),
            self.read_error.eq(r_error),
        ]

        # ---------------------------------------------------------------- writer
        write_words = _ceil_div(self.write_row_bytes + bus_bytes - 1, bus_bytes)
        w_row_addr = Signal(32)
        w_rows_left = Signal(16)
        w_row_bytes = Signal(16)
        w_stride = Signal(32)
        w_beat_addr = Signal(32)
        w_beats_left = Signal(17)
        w_beat = Signal(17)          # beat within the row
        w_burst_beat = Signal(9)     # beat within the burst
        w_burst_len = Signal(range(257))
        w_data = Signal(data.ArrayLayout(self.data_width, write_words))
        w_strb = Signal(data.ArrayLayout(bus_bytes, write_words))
        w_outstanding = Signal(20)   # bursts whose last beat went, awaiting their response
        w_error = Signal()

        # A row waiting while the row before it is written: the next row's address goes out
        # right after the last beat of the one before, without a cycle to take the row.
        next_row = Signal(8 * self.write_row_bytes)
        next_valid = Signal()

        wcmd = self.write_cmd.payload
        # The row to load: the buffered one, else the one offered; at the address of the row
        # the writer is at (in ROW) or of the next one (at the end of a row, in DATA).
        load_addr = Signal(32)
        w_next_row = Signal(32)
        m.d.comb += w_next_row.eq(w_row_addr + w_stride)
        load_row = Signal(8 * self.write_row_bytes)
        m.d.comb += load_row.eq(Mux(next_valid, next_row, self.write_row.payload))
        w_aligned, w_offset, w_beats = self._row_geometry(m, load_addr, w_row_bytes, "wr")
        w_len, w_len_minus_one, _, w_after_addr, w_after_left = self._next_burst(
            m, w_beat_addr, w_beats_left, "wr")

        byte_mask = Signal(self.write_row_bytes)
        for byte in range(self.write_row_bytes):
            m.d.comb += byte_mask[byte].eq(byte < w_row_bytes)

        # A burst awaits its response from its last W beat on (a response before it is as
        # spurious as one with no burst at all); a spurious one is not counted.
        burst_sent = bus.wvalid & bus.wready & bus.wlast
        b_fire = bus.bvalid & bus.bready
        b_awaited = w_outstanding != 0
        m.d.comb += bus.bready.eq(1)
        with m.If(burst_sent & ~(b_fire & b_awaited)):
            m.d.sync += w_outstanding.eq(w_outstanding + 1)
        with m.Elif(b_fire & b_awaited & ~burst_sent):
            m.d.sync += w_outstanding.eq(w_outstanding - 1)
        with m.If(b_fire & ((bus.bresp == Resp.SLVERR) | (bus.bresp == Resp.DECERR))):
            m.d.sync += w_error.eq(1)
        m.d.comb += self.write_error.eq(w_error)

        m.d.comb += [
            bus.awaddr.eq(w_beat_addr),
            bus.awlen.eq(w_len_minus_one),
            bus.wdata.eq(w_data[w_beat]),
            bus.wstrb.eq(w_strb[w_beat]),
            bus.wlast.eq(w_burst_beat == w_burst_len - 1),
        ]

        def load():
            # Start writing load_row, at load_addr: it is shifted onto the bus beats.
            m.d.sync += [
                w_data.eq(load_row << (w_offset * 8)),
                w_strb.eq(byte_mask << w_offset),
                w_beat_addr.eq(w_aligned),
                w_beats_left.eq(w_beats),
                w_beat.eq(0),
                next_valid.eq(0),
            ]
            m.next = "ADDRESS"

        with m.FSM(name="writer") as writer_fsm:
            with m.State("IDLE"):
                m.d.comb += self.write_cmd.ready.eq(1)
                with m.If(self.write_cmd.valid):
                    m.d.sync += [
                        w_row_addr.eq(wcmd.addr), w_rows_left.eq(wcmd.rows),
                        w_row_bytes.eq(wcmd.row_bytes), w_stride.eq(wcmd.stride),
                        w_error.eq(0),
                    ]
                    m.next = "ROW"
            with m.State("ROW"):
                m.d.comb += [self.write_row.ready.eq(~next_valid), load_addr.eq(w_row_addr)]
                with m.If(next_valid | self.write_row.valid):
                    load()
            with m.State("ADDRESS"):
                m.d.comb += [bus.awvalid.eq(1), self.write_row.ready.eq(~next_valid)]
                m.d.sync += w_burst_len.eq(w_len)
                with m.If(bus.awready):
                    m.d.sync += [
                        w_beat_addr.eq(w_after_addr),
                        w_beats_left.eq(w_after_left),
                        w_burst_beat.eq(0),
                    ]
                    m.next = "DATA"
            with m.State("DATA"):
                m.d.comb += [bus.wvalid.eq(1), self.write_row.ready.eq(~next_valid),
                             load_addr.eq(w_next_row)]
                with m.If(bus.wready):
                    m.d.sync += [
                        w_beat.eq(w_beat + 1),
                        w_burst_beat.eq(w_burst_beat + 1),
                    ]
                    with m.If(bus.wlast):
                        with m.If(w_beats_left != 0):
                            m.next = "ADDRESS"
                        with m.Elif(w_rows_left == 1):
                            m.next = "RESPONSES"
                        with m.Else():
                            m.d.sync += [
                                w_rows_left.eq(w_rows_left - 1),
                                w_row_addr.eq(w_next_row),
                            ]
                            with m.If(next_valid):
                                load()
                            with m.Else():
                                m.next = "ROW"
            with m.State("RESPONSES"):
                with m.If(w_outstanding == 0):
                    m.d.comb += self.write_done.eq(1)
                    m.next = "IDLE"

        with m.If(b_fire & ~b_awaited & ~writer_fsm.ongoing("IDLE")):
            m.d.sync += w_error.eq(1)

        # The row offered while one is being written waits in next_row.
        with m.If(self.write_row.valid & self.write_row.ready &
                  ~writer_fsm.ongoing("ROW")):
            m.d.sync += [next_row.eq(self.write_row.payload), next_valid.eq(1)]

        m.d.comb += self.idle.eq(~ar_active & ~r_active & ~emit &
                                 writer_fsm.ongoing("IDLE") & (w_outstanding == 0))
        return m
