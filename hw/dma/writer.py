"""The DMA's writer: rows to 2-D strided blocks in DRAM, on the AXI4 write channels."""

from amaranth.hdl import Assert, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..axi import AXI4WriteSignature, Burst, Resp
from .bursts import BlockCommand, ceil_div, geometry_for


__all__ = ["DMAWriter"]


class DMAWriter(wiring.Component):
    """Writes rows of ``row_bytes`` to blocks (:class:`~hw.dma.bursts.BlockCommand`).

    Each row is shifted onto the bus beats and masked with ``wstrb``; a burst's data goes
    only after its address; the command ends when every response is back. Every row goes
    into a one-row buffer first and is loaded onto the beats only from there, so the row's
    producer ends at flip-flops, and ``row.ready`` is the buffer's empty flag. A row taken
    while the one before is written sends its address right after the other's last beat; a
    row that finds the writer waiting starts a cycle after it is taken. Rows are offered
    only once their command is taken, and no more than it has (asserted).

    Attributes
    ----------
    bus : Out(AXI4WriteSignature)
    cmd : In(stream.Signature(BlockCommand))
        Accepted when the writer is idle.
    row : In(stream.Signature(8 * row_bytes))
        Accepted whenever the buffer is empty; offered only while a command wants rows.
    done, error : Out(1)
        As ``write_done`` and ``write_error`` of :class:`~hw.dma.DMA`.
    idle : Out(1)
        No command runs and no response is awaited.
    """
    def __init__(self, *, data_width, row_bytes, addr_width=32, geometry=None):
        self.data_width = data_width
        self.bus_bytes = data_width // 8
        self.row_bytes = row_bytes
        self._row_geometry, self._next_burst = geometry_for(self.bus_bytes, geometry)
        super().__init__({
            "bus":   Out(AXI4WriteSignature(addr_width=addr_width, data_width=data_width)),
            "cmd":   In(stream.Signature(BlockCommand)),
            "row":   In(stream.Signature(8 * row_bytes)),
            "done":  Out(1),
            "error": Out(1),
            "idle":  Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        bus_bytes = self.bus_bytes
        lg = bus_bytes.bit_length() - 1
        m.d.comb += [bus.awsize.eq(lg), bus.awburst.eq(Burst.INCR), bus.awid.eq(0)]

        write_words = ceil_div(self.row_bytes + bus_bytes - 1, bus_bytes)
        # The address of the row the writer loads next, and the one after it (plus
        # w_stride), each set a row ahead (with the command, then as a row is loaded), so
        # that the shift of a row onto the beats (by the address's low bits) comes from
        # flip-flops. (Its beat count, a short sum of these flip-flops, is not registered a
        # row ahead as well: that doubled the time of formal/'s DMA proof at depth 20.)
        w_row_addr = Signal(32)
        w_next_row = Signal(32)
        w_rows_left = Signal(16)
        w_final_row = Signal()       # w_rows_left == 1
        w_row_bytes = Signal(16)
        w_stride = Signal(32)
        w_beat_addr = Signal(32)
        w_beats_left = Signal(range(write_words + 1))      # as the reader's ar_beats_left
        # The burst on W: beats after the current one, whether it is the last beat, and
        # whether another burst of the row follows (all set at its address, so that the end
        # of a burst, and the choice to load the next row, come from flip-flops).
        w_burst_left = Signal(8)
        w_last_beat = Signal()
        w_more_bursts = Signal()
        # The row's beats, the one on W at the bottom: each beat shifts them down a word.
        # (No reset on the data: it is loaded with each row, and wvalid says when it counts.)
        w_data = Signal(data.ArrayLayout(self.data_width, write_words), reset_less=True)
        w_strb = Signal(data.ArrayLayout(bus_bytes, write_words))
        w_outstanding = Signal(20)   # bursts whose last beat went, awaiting their response
        w_none_outstanding = Signal(init=1)     # w_outstanding == 0, kept beside it
        w_error = Signal()
        # The state machine is in IDLE, kept beside it: cmd.ready from a flip-flop.
        w_idle = Signal(init=1)

        # Every row goes through this buffer, and the writer loads only from it: the row's
        # producer (the store unit: the accumulator's read data, or the requantizer's result)
        # ends at these flip-flops, and row.ready is the buffer's empty flag, with no logic of
        # the writer before it. While a row is written the next one waits here, so its
        # address goes out right after the last beat of the one before; a row that finds the
        # writer waiting in ROW is loaded a cycle after it is taken. The row is shifted onto
        # its beats (and its strobes made) as it is taken: w_row_addr is then already its
        # address (rows come only while the command wants them, and the row before left the
        # buffer first), so loading it into w_data, late in a cycle that waits for wready,
        # is a plain copy.
        next_row = Signal(data.ArrayLayout(self.data_width, write_words), reset_less=True)
        next_strb = Signal(data.ArrayLayout(bus_bytes, write_words))
        next_valid = Signal()
        m.d.comb += [self.row.ready.eq(~next_valid), self.cmd.ready.eq(w_idle)]

        wcmd = self.cmd.payload
        m.d.sync += Assert(~self.cmd.valid | (wcmd.row_bytes <= self.row_bytes),
                           "a DMA write command with rows wider than the writer's")
        w_aligned, w_offset, w_beats = self._row_geometry(m, w_row_addr, w_row_bytes, "wr")
        w_len, w_len_minus_one, w_burst_ends_row, w_after_addr, w_after_left = \
            self._next_burst(m, w_beat_addr, w_beats_left, "wr")

        byte_mask = Signal(self.row_bytes)      # the bytes of a row, set with the command

        # A burst awaits its response from its last W beat on (a response before it is as
        # spurious as one with no burst at all); a spurious one is not counted.
        burst_sent = bus.wvalid & bus.wready & bus.wlast
        b_fire = bus.bvalid & bus.bready
        b_awaited = ~w_none_outstanding
        m.d.comb += bus.bready.eq(1)
        with m.If(burst_sent & ~(b_fire & b_awaited)):
            m.d.sync += [w_outstanding.eq(w_outstanding + 1), w_none_outstanding.eq(0)]
        with m.Elif(b_fire & b_awaited & ~burst_sent):
            m.d.sync += [w_outstanding.eq(w_outstanding - 1),
                         w_none_outstanding.eq(w_outstanding == 1)]
        with m.If(b_fire & ((bus.bresp == Resp.SLVERR) | (bus.bresp == Resp.DECERR))):
            m.d.sync += w_error.eq(1)
        m.d.comb += self.error.eq(w_error)

        m.d.comb += [
            bus.awaddr.eq(w_beat_addr),
            bus.awlen.eq(w_len_minus_one),
            bus.wdata.eq(w_data[0]),
            bus.wstrb.eq(w_strb[0]),
            bus.wlast.eq(w_last_beat),
        ]

        load_row = Signal()          # the buffered row goes onto the beats at this edge

        def load():
            # Start writing the buffered row (already shifted onto the beats) at w_row_addr,
            # and move on to the row after it: its registers are loaded below, under copies
            # of the states (``state_word_<write_words>_*``).
            m.d.comb += load_row.eq(1)
            m.next = "ADDRESS"

        with m.FSM(name="writer") as writer_fsm:
            with m.State("IDLE"):
                with m.If(self.cmd.valid):
                    m.d.sync += [
                        w_row_addr.eq(wcmd.addr), w_next_row.eq(wcmd.addr + wcmd.stride),
                        w_rows_left.eq(wcmd.rows), w_final_row.eq(wcmd.rows == 1),
                        w_row_bytes.eq(wcmd.row_bytes), w_stride.eq(wcmd.stride),
                        w_error.eq(0), w_idle.eq(0),
                    ]
                    for byte in range(self.row_bytes):
                        m.d.sync += byte_mask[byte].eq(byte < wcmd.row_bytes)
                    m.next = "ROW"
            with m.State("ROW"):
                with m.If(next_valid):
                    load()
            with m.State("ADDRESS"):
                m.d.comb += bus.awvalid.eq(1)
                with m.If(bus.awready):
                    m.d.sync += [
                        w_beat_addr.eq(w_after_addr),
                        w_beats_left.eq(w_after_left),
                        w_burst_left.eq(w_len_minus_one),
                        w_last_beat.eq(w_len_minus_one == 0),
                        w_more_bursts.eq(~w_burst_ends_row),
                    ]
                    m.next = "DATA"
            with m.State("DATA"):
                m.d.comb += bus.wvalid.eq(1)
                with m.If(bus.wready):
                    m.d.sync += [
                        w_burst_left.eq(w_burst_left - 1),
                        w_last_beat.eq(w_burst_left == 1),
                    ]
                    with m.If(w_last_beat):
                        with m.If(w_more_bursts):
                            m.next = "ADDRESS"
                        with m.Elif(w_final_row):
                            m.next = "RESPONSES"
                        with m.Else():
                            m.d.sync += [
                                w_rows_left.eq(w_rows_left - 1),
                                w_final_row.eq(w_rows_left == 2),
                            ]
                            with m.If(next_valid):
                                load()
                            with m.Else():
                                m.next = "ROW"
            with m.State("RESPONSES"):
                with m.If(w_none_outstanding):
                    m.d.comb += self.done.eq(1)
                    m.d.sync += w_idle.eq(1)
                    m.next = "IDLE"

        # The beats' words, each under its own copies of the two states that move them
        # (``state_word_<k>_row`` / ``_data``, kept apart on the FPGA): a beat on W shifts
        # them down a word, and a row loads them from the buffer. The enables of all of
        # them came from the one state register, by routes across the die. A last set of
        # copies loads the row's address registers (their enables from the state register
        # were groups of 32 failing paths on the 4x4).
        last_of_row = Signal()       # a beat on W now ends the row, and not the command
        m.d.comb += last_of_row.eq(w_last_beat & ~w_more_bursts & ~w_final_row)
        enter_row = ((writer_fsm.ongoing("IDLE") & self.cmd.valid) |
                     (writer_fsm.ongoing("DATA") & bus.wready & last_of_row & ~next_valid))
        leave_row = writer_fsm.ongoing("ROW") & next_valid
        enter_data = writer_fsm.ongoing("ADDRESS") & bus.awready
        leave_data = writer_fsm.ongoing("DATA") & bus.wready & w_last_beat
        for k in range(write_words + 1):
            in_row = Signal(name=f"state_word_{k}_row")
            in_data = Signal(name=f"state_word_{k}_data")
            # The buffer's full flag and the row's offset, copied likewise: the word of the
            # buffer takes its part of the row, shifted by its copy of the offset, when its
            # copy of the flag says the buffer is empty.
            full = Signal(name=f"state_word_{k}_full")
            # last_of_row, kept in a flip-flop per word: set where its terms are, valid in
            # DATA (the only state that reads it; asserted).
            row_ends = Signal(name=f"state_word_{k}_row_ends")
            with m.If(enter_data):
                m.d.sync += row_ends.eq((w_len_minus_one == 0) & w_burst_ends_row &
                                        ~w_final_row)
            with m.If(writer_fsm.ongoing("DATA") & bus.wready):
                m.d.sync += row_ends.eq((w_burst_left == 1) & ~w_more_bursts & ~w_final_row)
            m.d.sync += Assert(~writer_fsm.ongoing("DATA") | (row_ends == last_of_row),
                               "the DMA writer's row end copy out of step")
            # This copy's load_row (asserted equal).
            loads = Signal(name=f"loads_{k}")
            m.d.comb += loads.eq((in_row & full) | (in_data & bus.wready & row_ends & full))
            m.d.sync += Assert(loads == load_row, "the DMA writer's load copy out of step")
            with m.If(self.row.valid & ~full):
                m.d.sync += full.eq(1)
            with m.If(loads):
                m.d.sync += full.eq(0)
            m.d.sync += Assert(full == next_valid, "the DMA writer's buffer copies out of step")
            with m.If(enter_row):
                m.d.sync += in_row.eq(1)
            with m.If(leave_row):
                m.d.sync += in_row.eq(0)
            with m.If(enter_data):
                m.d.sync += in_data.eq(1)
            with m.If(leave_data):
                m.d.sync += in_data.eq(0)
            m.d.sync += Assert((in_row == writer_fsm.ongoing("ROW")) &
                               (in_data == writer_fsm.ongoing("DATA")),
                               "the DMA writer's state copies out of step")
            if k == write_words:
                with m.If(loads):
                    m.d.sync += [
                        w_beat_addr.eq(w_aligned),
                        w_beats_left.eq(w_beats),
                        next_valid.eq(0),
                        w_row_addr.eq(w_next_row),
                        w_next_row.eq(w_next_row + w_stride),
                    ]
                continue
            offset = Signal.like(w_offset, name=f"state_word_{k}_offset")
            with m.If(self.row.valid & ~full):
                m.d.sync += [
                    next_row[k].eq((self.row.payload << (offset * 8))[k * self.data_width:
                                                                       (k + 1) * self.data_width]),
                    next_strb[k].eq((byte_mask << offset)[k * bus_bytes:(k + 1) * bus_bytes]),
                ]
            with m.If(w_idle & self.cmd.valid):
                m.d.sync += offset.eq(wcmd.addr[:len(offset)])
            with m.If(loads):
                m.d.sync += offset.eq(w_next_row[:len(offset)])
            m.d.sync += Assert(offset == w_offset, "the DMA writer's offset copy out of step")
            with m.If(in_data & bus.wready):
                if k + 1 < write_words:
                    m.d.sync += [w_data[k].eq(w_data[k + 1]), w_strb[k].eq(w_strb[k + 1])]
                else:
                    m.d.sync += [w_data[k].eq(0), w_strb[k].eq(0)]
            with m.If(loads):
                m.d.sync += [w_data[k].eq(next_row[k]), w_strb[k].eq(next_strb[k])]

        with m.If(b_fire & ~b_awaited & ~w_idle):
            m.d.sync += w_error.eq(1)

        # row.ready does not look at the state: a row is taken whenever the buffer is empty
        # (and loaded only from a full one, so the two never meet in a cycle). That is safe
        # because rows come only while the command wants them: not before it is taken, none
        # past its last, so in IDLE and RESPONSES no row is offered or buffered, and none
        # leaks into the next command.
        with m.If(self.row.valid & ~next_valid):
            m.d.sync += next_valid.eq(1)
        wants_rows = (writer_fsm.ongoing("ROW") | writer_fsm.ongoing("ADDRESS") |
                      writer_fsm.ongoing("DATA"))
        m.d.sync += [
            Assert(wants_rows | ~(self.row.valid | next_valid),
                   "a row offered to the DMA writer with no command that wants it"),
            Assert(w_idle == writer_fsm.ongoing("IDLE"), "the DMA writer's w_idle is wrong"),
        ]
        m.d.comb += self.idle.eq(w_idle & w_none_outstanding)
        return m
