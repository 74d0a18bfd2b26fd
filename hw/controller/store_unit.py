"""The store unit: ``STORE`` and ``STORE_Q``, from the accumulator's read port through the
requantizer to the DMA writer."""

from amaranth.hdl import Assert, Cat, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import ReadPort
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..bram import READ_LATENCY
from ..isa import ErrorCode, Opcode
from ..requant import Requantizer
from .signatures import QuantState, RowRange, UnitSignature, WriterSignature, status_copy


__all__ = ["StoreUnit", "StoreStatus"]


class StoreStatus(data.Struct):
    """What the store unit holds, for the issue stage's hazard checks."""
    busy: 1
    acc:  RowRange      #: the accumulator rows it reads
    lo:   32            #: it writes DRAM bytes [lo, hi)
    hi:   33
    follows: 1          #: its ranges take the issue stage's head's at the next edge


class StoreUnit(wiring.Component):
    """Writes accumulator rows to DRAM: as INT32 (``STORE``) or requantized to INT8
    (``STORE_Q``, through :class:`~hw.requant.Requantizer` in the mode and with the state the
    last ``LOAD_QUANT`` set).

    ``STORE`` moves one row at a time: read it, hand it to the DMA writer. The accumulator's
    read takes two cycles (:data:`hw.bram.READ_LATENCY`), so each row is read a cycle ahead:
    the first as the writer takes the command, each next one in the cycle the row before is
    handed over (two cycles a row).

    ``STORE_Q`` streams: a row is read in every cycle while fewer than
    :attr:`QUEUE_DEPTH` rows are between the read and the writer, each goes through the
    requantizer (``Requantizer.latency`` cycles in either mode) into a queue, and the
    queue hands rows to the writer as it takes them. The queue is deep enough for every row
    of the round trip (:attr:`ROUND_TRIP` cycles from a read to the row at the writer), so
    rows follow each other in every cycle while the writer takes them: a ``STORE_Q`` of
    ``n`` rows hands its last row over ``ROUND_TRIP + n - 1`` cycles after the command.
    After the last row, either instruction waits for the writer's response.

    Attributes
    ----------
    issue : In(UnitSignature(StoreStatus, fault=True, halt=True))
        From the cycle after ``halt`` rises, no new DMA command starts.
    acc : In(ReadPort.Signature)
        The accumulator's read port.
    quant : In(stream.Signature(QuantState(cols), always_ready=True))
        A new requantization state.
    writer : Out(WriterSignature)
        The DMA writer.
    """
    #: Cycles from a ``STORE_Q`` row's read to the row at the writer: the accumulator's
    #: read, the requantizer, and the queue (a write, then its buffered read).
    ROUND_TRIP = READ_LATENCY + Requantizer.latency + 2
    #: Rows the ``STORE_Q`` queue holds: a power of two (whether a row may be read is one
    #: bit of the count in flight) above the round trip.
    QUEUE_DEPTH = 1 << ROUND_TRIP.bit_length()

    def __init__(self, config):
        self.config = config
        cols = config.cols
        super().__init__({
            "issue":  In(UnitSignature(StoreStatus, fault=True, halt=True)),
            "acc":    In(ReadPort.Signature(addr_width=ceil_log2(config.acc_depth),
                                            shape=data.ArrayLayout(signed(32), cols))),
            "quant":  In(stream.Signature(QuantState(cols), always_ready=True)),
            "writer": Out(WriterSignature(8 * config.acc_row_bytes)),
        })

    def elaborate(self, platform):
        m = Module()
        cols = self.config.cols
        cmd, status, fault = self.issue.cmd, self.issue.status, self.issue.fault
        writer = self.writer

        # The requantization state: until the first LOAD_QUANT, multipliers 0 and no clamp.
        # It is reset a cycle after the rest of the unit, by copies of the reset, one per
        # lane and one for the rest (``core_reset_state_*``, kept apart on the FPGA): the
        # state sits by the requantizer's lanes, and one reset flip-flop of the unit drove
        # all its bits across the die. Nothing reads or sets the state in the two cycles
        # after a reset (the unit is idle until a program starts; asserted).
        defaults = QuantState(cols).const({"act_min": -128, "act_max": 127})
        state = Signal(QuantState(cols), init=defaults, reset_less=True)
        just_reset = Signal(init=1)          # the unit's reset sets it, the next cycle clears
        m.d.sync += just_reset.eq(0)
        parts = [(f"lane_{lane}", ("multiplier", lane), ("shift", lane)) for lane in range(cols)]
        parts.append(("scalars", ("mode",), ("zero_point",), ("act_min",), ("act_max",)))
        for name, *fields in parts:
            reset = Signal(init=1, name=f"core_reset_state_{name}")
            m.d.sync += reset.eq(just_reset)
            with m.If(reset):
                for path in fields:
                    target, value = state, defaults
                    for key in path:
                        target, value = target[key], value[key]
                    m.d.sync += target.eq(value)
            m.d.sync += Assert(~(reset & self.quant.valid),
                               "store unit: a LOAD_QUANT's state within two cycles of a reset")
        with m.If(self.quant.valid):
            m.d.sync += state.eq(self.quant.payload)
        m.submodules.requant = requant = Requantizer(cols)
        m.d.comb += [
            requant.acc.eq(self.acc.data),
            requant.mode.eq(state.mode),
            requant.multiplier.eq(state.multiplier),
            requant.shift.eq(state.shift),
            requant.zero_point.eq(state.zero_point),
            requant.act_min.eq(state.act_min),
            requant.act_max.eq(state.act_max),
        ]

        op = Signal(8)
        acc = Signal(RowRange)
        read_addr = Signal.like(self.acc.addr)     # the row read next
        rows = Signal(16)
        row_bytes = Signal(16)
        addr = Signal(32)
        stride = Signal(32)
        pc = Signal(32)
        # Rows still to hand over after the one in ROW, and whether it is the last: kept
        # in flip-flops, so that the next read's decision (into the accumulator's block RAM,
        # across the die) waits for no compare of a count.
        rows_after = Signal(16)
        last = Signal()
        # STORE_Q reads ahead of the rows handed over: the reads still to make after the
        # command's, and whether none is left.
        reads_after = Signal(16)
        reads_done = Signal()
        quantized_op = Signal()          # op == STORE_Q, in a flip-flop
        lo = Signal(32)
        hi = Signal(33)
        # While idle, the registers follow the instruction at the issue stage's head, so
        # that the issue decision enables only the state machine, not these flip-flops.
        idle = Signal()
        with m.If(idle):
            store = cmd.payload.instr.args.store
            m.d.sync += [
                op.eq(cmd.payload.instr.opcode), acc.eq(cmd.payload.acc),
                read_addr.eq(cmd.payload.acc.lo),
                rows.eq(store.rows), row_bytes.eq(store.row_bytes), addr.eq(store.dram_addr),
                stride.eq(store.dram_stride), pc.eq(cmd.payload.pc),
                rows_after.eq(store.rows - 1), last.eq(store.rows == 1),
                reads_after.eq(store.rows - 1), reads_done.eq(store.rows == 1),
                quantized_op.eq(cmd.payload.instr.opcode == Opcode.STORE_Q),
                lo.eq(cmd.payload.lo), hi.eq(cmd.payload.hi),
            ]
        m.d.comb += [
            status.acc.eq(acc),
            status.lo.eq(lo),
            status.hi.eq(hi),
            fault.pc.eq(pc),
            writer.cmd.payload.addr.eq(addr),
            writer.cmd.payload.rows.eq(rows),
            writer.cmd.payload.row_bytes.eq(row_bytes),
            writer.cmd.payload.stride.eq(stride),
            self.acc.addr.eq(read_addr),
        ]

        # STORE_Q's rows go through a queue, which takes the requantizer's rows. The row to
        # the writer is chosen per 32-bit lane of the row (the accumulator's lane, or four
        # requantized bytes from the queue) by copies of the select, one per lane
        # (``select_lane_<lane>_quantized``, kept apart on the FPGA by fpga/flow.py's
        # KEEP_APART): one flip-flop of the opcode drove every bit of the row, by routes of
        # 5 ns across the die. The copies follow a cycle late, long before a row passes them.
        #
        # The queue is a SyncFIFOBuffered built by hand: a SyncFIFO one row shallower (its
        # memory read without a register) and a read register, ``queued``, loaded as
        # SyncFIFOBuffered loads its own, but without a reset (``queued_valid`` says whether
        # it holds a row): the core reset reached the enables of SyncFIFOBuffered's read
        # register, by a route of 7 ns on one 8x8 placement (a group of 119 failing paths).
        m.submodules.queue = queue = SyncFIFO(width=8 * cols, depth=self.QUEUE_DEPTH - 1)
        queued = Signal(8 * cols, reset_less=True)
        queued_valid = Signal()
        queued_taken = Signal()
        m.d.comb += queue.r_en.eq(~queued_valid | queued_taken)
        with m.If(queue.r_rdy & queue.r_en):
            m.d.sync += [queued.eq(queue.r_data), queued_valid.eq(1)]
        with m.Elif(queued_taken):
            m.d.sync += queued_valid.eq(0)
        row_out, selects = [], []
        for lane in range(cols):
            quantized = Signal(name=f"select_lane_{lane}_quantized")
            m.d.sync += quantized.eq(op == Opcode.STORE_Q)
            selects.append(quantized)
            requantized = queued[32 * lane:32 * lane + 32] if 4 * lane < cols else 0
            row_out.append(Mux(quantized, requantized, self.acc.data[lane])[:32])
        m.d.comb += [
            writer.row.payload.eq(Cat(*row_out)),
            queue.w_en.eq(requant.result_valid),
            queue.w_data.eq(requant.result),
        ]

        read = Signal()
        m.d.comb += self.acc.en.eq(read)     # the read port holds its row between reads
        with m.If(read):
            m.d.sync += read_addr.eq(read_addr + 1)
        # STORE_Q: each row read reaches the requantizer READ_LATENCY cycles later; rows
        # read and not yet handed over (``in_flight``) stay below the queue's depth.
        quantized_read = Signal()
        arriving = quantized_read
        for stage in range(READ_LATENCY):
            registered = Signal(name=f"quantized_read_{stage + 1}")
            m.d.sync += registered.eq(arriving)
            arriving = registered
        m.d.comb += requant.valid.eq(arriving)
        in_flight = Signal(range(self.QUEUE_DEPTH + 1))
        handed = Signal()
        m.d.sync += in_flight.eq(in_flight + quantized_read - handed)
        room = ~in_flight[-1]                # in_flight < QUEUE_DEPTH, a power of two
        m.d.comb += [queued_taken.eq(writer.row.ready),
                     handed.eq(queued_valid & writer.row.ready)]
        m.d.sync += [
            Assert(~(queue.w_en & ~queue.w_rdy), "store unit: the STORE_Q queue overflowed"),
            Assert(in_flight <= self.QUEUE_DEPTH, "store unit: STORE_Q rows beyond the queue"),
        ]
        # The soft reset's halt, registered here: the issue stage's flip-flop drives logic
        # spread over the die, and this one only the writer's command (a command may still
        # start in the halt's first cycle; it ends on the bus like any command in flight).
        halt = Signal()
        m.d.sync += halt.eq(self.issue.halt)
        with m.FSM(name="store") as fsm:
            with m.State("IDLE"):
                with m.If(cmd.valid):
                    m.next = "COMMAND"
            with m.State("COMMAND"):
                # The first row is read as the writer takes the command.
                m.d.comb += writer.cmd.valid.eq(~halt)
                with m.If(writer.cmd.valid & writer.cmd.ready):
                    m.d.comb += [read.eq(1), quantized_read.eq(quantized_op)]
                    with m.If(quantized_op):
                        m.next = "STREAM"
                    with m.Else():
                        m.next = "READ"
            with m.State("STREAM"):
                # STORE_Q: read while rows are left and the queue has room for them; hand
                # the queue's rows over as the writer takes them.
                m.d.sync += Assert(Cat(*selects).all(),
                                   "store unit: the STORE_Q selects out of step")
                with m.If(~reads_done & room):
                    m.d.comb += [read.eq(1), quantized_read.eq(1)]
                    m.d.sync += [reads_after.eq(reads_after - 1),
                                 reads_done.eq(reads_after == 1)]
                with m.If(handed):
                    m.d.sync += [rows_after.eq(rows_after - 1), last.eq(rows_after == 1)]
                    with m.If(last):
                        m.next = "WAIT"
            with m.State("READ"):            # the row's data arrives in the next state
                m.next = "ROW"
            with m.State("ROW"):
                m.d.sync += Assert(~Cat(*selects).any(),
                                   "store unit: the STORE selects out of step")
                with m.If(writer.row.ready):
                    m.d.sync += [rows_after.eq(rows_after - 1), last.eq(rows_after == 1)]
                    with m.If(last):
                        m.next = "WAIT"
                    with m.Else():
                        m.d.comb += read.eq(1)
                        m.next = "READ"
            with m.State("WAIT"):
                # A failed write is reported from the state register, a cycle later.
                with m.If(writer.done):
                    with m.If(writer.error):
                        m.next = "FAILED"
                    with m.Else():
                        m.next = "IDLE"
            with m.State("FAILED"):
                m.d.comb += [fault.valid.eq(1), fault.code.eq(ErrorCode.BUS_WRITE)]
                m.next = "IDLE"
        # ROW kept in a flip-flop beside the state: the row's valid goes to the DMA writer's
        # buffer (its enables) from a flip-flop, not from a decode of the state register.
        # STORE_Q's rows are valid from the queue's flip-flop (it holds rows only then).
        in_row = Signal()
        with m.If(fsm.ongoing("READ")):
            m.d.sync += in_row.eq(1)
        with m.If(fsm.ongoing("ROW") & writer.row.ready):
            m.d.sync += in_row.eq(0)
        m.d.comb += writer.row.valid.eq(in_row | queued_valid)
        m.d.sync += [
            Assert(in_row == fsm.ongoing("ROW"), "store unit: ROW out of step"),
            Assert(~queued_valid | fsm.ongoing("STREAM"),
                   "store unit: a STORE_Q row left over"),
        ]
        # Idle kept in a flip-flop beside the state (the issue stage decides from it): left
        # with the command, entered with the transitions into IDLE above.
        # The issue stage reads a copy of it (``status_copy``, the same two transitions).
        idle_reg = Signal(init=1)
        leaves = fsm.ongoing("IDLE") & cmd.valid
        enters = (fsm.ongoing("WAIT") & writer.done & ~writer.error) | fsm.ongoing("FAILED")
        with m.If(leaves):
            m.d.sync += idle_reg.eq(0)
        with m.If(enters):
            m.d.sync += idle_reg.eq(1)
        status_busy = status_copy(m, "store_busy", ~idle_reg,
                                  Mux(enters, 0, Mux(leaves, 1, ~idle_reg)), init=0)
        m.d.sync += Assert(idle_reg == fsm.ongoing("IDLE"), "store unit: idle out of step")
        # The requantizer copies the state into each lane first: a row must not reach it
        # before the copies hold the state the last LOAD_QUANT set (Requantizer.setup).
        quant_age = Signal(range(Requantizer.setup + 1), init=Requantizer.setup)
        with m.If(self.quant.valid):
            m.d.sync += quant_age.eq(0)
        with m.Elif(quant_age != Requantizer.setup):
            m.d.sync += quant_age.eq(quant_age + 1)
        m.d.sync += Assert(~requant.valid | (quant_age == Requantizer.setup),
                           "store unit: a STORE_Q row before the requantizer's copies of "
                           "the state")
        m.d.comb += [idle.eq(idle_reg), status.busy.eq(status_busy), status.follows.eq(idle)]
        return m
