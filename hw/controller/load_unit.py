"""The load unit: ``LOAD_SPAD``, ``LOAD_ACC`` and ``LOAD_QUANT``, on the DMA reader."""

from amaranth.hdl import Assert, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import WritePort
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..accumulator import AccumulatorWriteSignature
from ..dma import row_beats
from ..isa import ErrorCode, Opcode, QuantMode
from .signatures import (QuantState, ReaderSignature, RowRange, UnitSignature,
                         status_copy)


__all__ = ["LoadUnit", "LoadStatus"]


class LoadStatus(data.Struct):
    """What the load unit holds, for the issue stage's hazard checks."""
    busy:    1
    to_spad: 1          #: a LOAD_SPAD into the rows ``spad``
    to_acc:  1          #: a LOAD_ACC (it writes through the streamer's share of the port)
    spad:    RowRange
    follows: 1          #: its ranges take the issue stage's head's at the next edge


class LoadUnit(wiring.Component):
    """Moves a 2-D DRAM block into scratchpad or accumulator rows, or the requantization
    state into a staging register.

    A ``LOAD_QUANT`` reads two rows (multipliers, then shifts; in float mode scales, then a
    reserved row); a cycle after its last row the unit checks them, each lane into a flag,
    and a cycle later those with the operands (zero point, clamp; shift range, or finite
    scales and a zero reserved row), and either raises ``QUANT``, leaving the old state, or
    hands the new state to the store unit (``quant``) in the cycle after.

    Attributes
    ----------
    issue : In(UnitSignature(LoadStatus, fault=True))
    reader : Out(ReaderSignature)
        The load unit's share of the DMA reader.
    spad : In(WritePort.Signature)
        The scratchpad's write port.
    acc : In(AccumulatorWriteSignature)
        The accumulator's write port, as the streamer shares it.
    quant : Out(stream.Signature(QuantState(cols), always_ready=True))
        Valid for a cycle when a ``LOAD_QUANT`` succeeds, the cycle after its check.
    """
    def __init__(self, config, *, read_row_bytes):
        self.config = config
        super().__init__({
            "issue":  In(UnitSignature(LoadStatus, fault=True)),
            "reader": Out(ReaderSignature(8 * read_row_bytes)),
            "spad":   In(WritePort.Signature(addr_width=ceil_log2(config.spad_depth),
                                             shape=8 * config.spad_row_bytes)),
            "acc":    In(AccumulatorWriteSignature(config.acc_depth, config.cols)),
            "quant":  Out(stream.Signature(QuantState(config.cols), always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        cols = self.config.cols
        bus_bytes = self.config.bus_bytes
        cmd, status, fault = self.issue.cmd, self.issue.status, self.issue.fault
        reader = self.reader

        busy = Signal()
        sent = Signal()              # the DMA command went out
        check = Signal()             # LOAD_QUANT: check the staged state in this cycle
        # The operands have no reset: while the unit is idle (as after a reset) they follow
        # the head in every cycle, and nothing reads them until it is busy. The core reset
        # (ResetInserter in the controller) then drives only the unit's state flags, not
        # some 250 flip-flops by routes of 5.6 ns (a group of the 8x8's failing paths).
        local = Signal(16, reset_less=True)
        spad = Signal(RowRange, reset_less=True)
        rows = Signal(16, reset_less=True)
        row_bytes = Signal(16, reset_less=True)
        addr = Signal(32, reset_less=True)
        stride = Signal(32, reset_less=True)
        next_addr = Signal(32, reset_less=True)   # addr + stride (ReadCommand)
        # The first row's beats on the bus, for the reader's command (ReadCommand), summed
        # as the registers follow the head.
        beats = Signal(17, reset_less=True)
        pc = Signal(32, reset_less=True)
        count = Signal(17, reset_less=True)
        # ``local + count`` in a flip-flop of its own, the accumulator row written now: the
        # sum reached the issue stage's hazard flags (through the streamer's write port).
        row_addr = Signal(16, reset_less=True)
        zero_point = Signal(signed(15), reset_less=True)
        mode = Signal(QuantMode, reset_less=True)
        act_min = Signal(signed(8), reset_less=True)
        act_max = Signal(signed(8), reset_less=True)
        lanes32 = data.ArrayLayout(signed(32), cols)
        # (No reset on the staged rows: a check reads them only after both have come.)
        staged_multipliers = Signal(lanes32, reset_less=True)
        staged_shifts = Signal(lanes32, reset_less=True)

        # The opcode, decoded as the registers follow the head: the kinds the issue stage
        # asks about, and what each row arriving does.
        op_spad = Signal(reset_less=True)
        op_acc = Signal(reset_less=True)
        op_quant = Signal(reset_less=True)
        m.d.comb += [
            status.spad.eq(spad),
            status.follows.eq(~busy),
            fault.pc.eq(pc),
        ]

        # While idle, the registers follow the instruction at the issue stage's head, so
        # that the issue decision enables only ``busy``, not the operands' flip-flops.
        issued = cmd.payload.instr
        with m.If(cmd.valid):
            m.d.sync += busy.eq(1)
        with m.If(~busy):
            m.d.sync += [sent.eq(0), op_spad.eq(issued.opcode == Opcode.LOAD_SPAD),
                         op_acc.eq(issued.opcode == Opcode.LOAD_ACC),
                         op_quant.eq(issued.opcode == Opcode.LOAD_QUANT), pc.eq(cmd.payload.pc),
                         count.eq(0), spad.eq(cmd.payload.spad), row_addr.eq(local)]
            with m.If(issued.opcode == Opcode.LOAD_QUANT):
                quant = issued.args.quant
                m.d.sync += [
                    rows.eq(2), row_bytes.eq(quant.row_bytes), addr.eq(quant.dram_addr),
                    beats.eq(row_beats(bus_bytes, quant.dram_addr, quant.row_bytes)),
                    stride.eq(quant.dram_stride), zero_point.eq(quant.zero_point),
                    next_addr.eq(quant.dram_addr + quant.dram_stride),
                    mode.eq(quant.mode), act_min.eq(quant.act_min), act_max.eq(quant.act_max),
                ]
            with m.Else():
                load = issued.args.load
                m.d.sync += [
                    local.eq(load.local_addr), row_addr.eq(load.local_addr), rows.eq(load.rows),
                    row_bytes.eq(load.row_bytes), addr.eq(load.dram_addr),
                    beats.eq(row_beats(bus_bytes, load.dram_addr, load.row_bytes)),
                    stride.eq(load.dram_stride), next_addr.eq(load.dram_addr + load.dram_stride),
                ]

        # The command is offered from a flip-flop (``busy & ~sent``, loaded with its next
        # value: set as the load issues, cleared as the reader takes it), so that the
        # fetcher's grant, and the reader's enables after it, wait for no logic here (the
        # unit's flags into the grant were a group of three runs). Nothing is offered
        # during a LOAD_QUANT's check: it comes after the reader's ``done``, once ``sent``.
        offered = Signal(name="load_cmd_offered")
        with m.If(~busy):
            m.d.sync += offered.eq(cmd.valid)
        with m.Elif(reader.cmd.ready):
            m.d.sync += offered.eq(0)
        m.d.sync += Assert(offered == (busy & ~sent & ~check),
                           "load unit: the command's offer out of step")
        m.d.comb += [
            reader.cmd.valid.eq(offered),
            reader.cmd.payload.addr.eq(addr),
            reader.cmd.payload.rows.eq(rows),
            reader.cmd.payload.row_bytes.eq(row_bytes),
            reader.cmd.payload.stride.eq(stride),
            reader.cmd.payload.beats.eq(beats),
            reader.cmd.payload.next_addr.eq(next_addr),
        ]
        with m.If(reader.cmd.valid & reader.cmd.ready):
            m.d.sync += sent.eq(1)

        with m.If(reader.row.valid):
            m.d.sync += [count.eq(count + 1), row_addr.eq(row_addr + 1)]
        m.d.sync += Assert(row_addr == (local + count)[:16], "load unit: row_addr out of step")
        # LOAD_QUANT's two rows, multipliers then shifts, pass through a register (``row``,
        # no enable: the reader's row flip-flops sit by the memories, the stages by the
        # requantizer's lanes, and a route between them was a long path) and then through
        # the two stages as through a shift register, whose enable (a copy per lane, kept
        # apart on the FPGA) does not wait for a compare of the count. At the check, the
        # cycle after the last row, the shifts are still in ``row`` and the multipliers in
        # the first stage: the check reads them there, and they move into place at its edge.
        row = Signal(lanes32, reset_less=True)
        m.d.sync += row.eq(reader.row.payload)
        takes = [Signal(name=f"stage_lane_{lane}_take") for lane in range(cols)]
        for lane, take in enumerate(takes):
            m.d.sync += take.eq(reader.row.valid & op_quant)
            with m.If(take):
                m.d.sync += [staged_shifts[lane].eq(row[lane]),
                             staged_multipliers[lane].eq(staged_shifts[lane])]
        m.d.sync += Assert(~check | takes[0],
                           "load unit: LOAD_QUANT checked without its last row")
        # A scratchpad row is written from registers, a cycle after it arrives: the
        # reader's row flip-flops then stay by the reader, and these by the block RAMs.
        # The last row is written in the cycle after ``done``, when the unit is idle: the
        # scratchpad's reads are transparent, so a MATMUL or PRELOAD issued then reads it.
        m.d.sync += [
            self.spad.addr.eq(local + count),
            self.spad.data.eq(reader.row.payload),
            self.spad.en.eq(reader.row.valid & op_spad),
        ]
        m.d.comb += [
            self.acc.addr.eq(row_addr),
            self.acc.data.eq(reader.row.payload),
            self.acc.accumulate.eq(0),
            self.acc.en.eq(reader.row.valid & op_acc),
        ]

        # A failed read is reported from a flip-flop, a cycle after the reader's ``done``
        # (the unit stays busy for it): the fault goes on to the issue stage's arbiter.
        read_failed = Signal()
        m.d.sync += read_failed.eq(0)
        with m.If(read_failed):
            m.d.sync += busy.eq(0)
        with m.If(reader.done):
            with m.If(reader.error):
                m.d.sync += read_failed.eq(1)
            with m.Elif(op_quant):
                m.d.sync += check.eq(1)
            with m.Else():
                m.d.sync += busy.eq(0)

        # The operands are checked from their registers (below): a zero point within
        # -128 .. 127 has bits 7 and up all equal to its sign. The rows are checked bit by bit:
        # a shift is within -31 .. 31 when bits 5 and up all equal its sign and it is not
        # -32; in float mode row 1 is reserved (all zero) and no scale of row 0 has an
        # exponent of all ones (NaN or infinity). The verdict is registered, and a good state
        # goes to the store unit from there, a cycle after the check (a STORE_Q issued after
        # the load reads it much later), so that no comparison drives the enable of the store
        # unit's state register.
        # (From the operands' registers, which hold them from the issue on: the check comes
        # cycles later. From the head, the comparisons were a long path.)
        # Two flags, each from one comparison (their OR after the clamp's carry chain, by a
        # long route to the flip-flop, was a path of the 8x8); the verdict ORs them.
        zero_point_bad, clamp_bad = Signal(), Signal()
        high = zero_point[7:]
        m.d.sync += [zero_point_bad.eq((high != 0) & (high != (1 << len(high)) - 1)),
                     clamp_bad.eq(act_min > act_max)]
        checked_shifts, checked_multipliers = row, staged_shifts    # see ``row`` above
        # Each lane's verdict goes into a flip-flop of its own in the cycle of the check; the
        # cycle after, their OR with the operands' makes the verdict (the reduction of every
        # lane's bits to one flag in one cycle, after the route from ``row``, was a group of
        # the failing paths on both configs).
        float_mode = mode == QuantMode.FLOAT
        lane_bad = Signal(cols, name="quant_lane_bad")
        lanes_checked = Signal()
        # The verdict, registered a cycle after that, ends the instruction in the next: a
        # fault from a flip-flop, or the state delivered.
        deliver = Signal()
        judged = Signal()
        rejected = Signal()
        m.d.sync += [deliver.eq(0), judged.eq(0), lanes_checked.eq(0)]
        with m.If(check):
            m.d.sync += [check.eq(0), lanes_checked.eq(1)]
            for lane, (shift, multiplier) in enumerate(zip(checked_shifts,
                                                           checked_multipliers)):
                shift_out_of_range = (((shift[5:] != 0) & (shift[5:] != (1 << 27) - 1)) |
                                      (shift[:6] == 0b100000))
                not_finite = multiplier[23:31].all()
                m.d.sync += lane_bad[lane].eq(Mux(float_mode, not_finite | (shift != 0),
                                                  shift_out_of_range))
        with m.If(lanes_checked):
            m.d.sync += [judged.eq(1),
                         rejected.eq(zero_point_bad | clamp_bad | lane_bad.any())]
        with m.If(judged):
            m.d.sync += busy.eq(0)
            with m.If(~rejected):
                m.d.sync += deliver.eq(1)
        # The fault, from flip-flops of its own loaded beside ``read_failed`` and the verdict
        # (asserted): ``judged & rejected`` and the code's choice after them went on through
        # the error arbiter into the stop registers (19 endpoints of an 8x8 run).
        fault_valid = Signal(name="load_fault_valid")
        fault_quant = Signal(name="load_fault_quant")
        quant_fails = lanes_checked & (zero_point_bad | clamp_bad | lane_bad.any())
        m.d.sync += [fault_valid.eq((reader.done & reader.error) | quant_fails),
                     fault_quant.eq(quant_fails)]
        m.d.sync += Assert((fault_valid == (read_failed | (judged & rejected))) &
                           (~fault_quant | (judged & rejected)),
                           "load unit: the fault's flip-flops out of step")
        m.d.comb += [fault.valid.eq(fault_valid),
                     fault.code.eq(Mux(fault_quant, ErrorCode.QUANT, ErrorCode.BUS_READ))]
        # The issue stage's copies of ``busy`` and the kinds it asks about (``status_copy``):
        # set as a load issues (only while idle), cleared by the ends above.
        ends = read_failed | (reader.done & ~reader.error & ~op_quant) | judged
        busy_next = Mux(busy, ~ends, cmd.valid)
        m.d.comb += [
            status.busy.eq(status_copy(m, "load_busy", busy, busy_next)),
            status.to_spad.eq(status_copy(
                m, "load_to_spad", busy & op_spad,
                busy_next & Mux(busy, op_spad, issued.opcode == Opcode.LOAD_SPAD))),
            status.to_acc.eq(status_copy(
                m, "load_to_acc", busy & op_acc,
                busy_next & Mux(busy, op_acc, issued.opcode == Opcode.LOAD_ACC))),
        ]
        m.d.comb += [
            self.quant.valid.eq(deliver),
            self.quant.payload.mode.eq(mode),
            self.quant.payload.multiplier.eq(staged_multipliers),
            self.quant.payload.zero_point.eq(zero_point),
            self.quant.payload.act_min.eq(act_min),
            self.quant.payload.act_max.eq(act_max),
        ]
        for lane in range(cols):
            m.d.comb += self.quant.payload.shift[lane].eq(staged_shifts[lane])
        return m
