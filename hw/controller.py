"""The controller: fetches the program from DRAM and runs it, one instruction at a time."""

from amaranth.hdl import Cat, Module, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .accumulator import AccumulatorSignature
from .dma import BlockCommand
from .isa import INSTR_BITS, INSTR_BYTES, ErrorCode, Instruction, Opcode
from .requant import Requantizer
from .scratchpad import ScratchpadSignature
from .systolic import ActivationRow


__all__ = ["Controller"]


class Controller(wiring.Component):
    """Runs a compiled instruction stream (:mod:`hw.isa`) on the array, memories and DMA.

    On ``start`` the controller checks the program registers, then fetches instruction
    ``pc`` from ``prog_addr + 16 * pc`` through the DMA reader, checks its operands and runs
    it to completion before fetching the next. Every check that fails, and every bus error,
    ends the program in the error state with an :class:`ErrorCode` and the failing ``pc``;
    every state waits only on handshakes that the DMA and the bus must finish, so no program
    can hang the controller.

    Parameters
    ----------
    config : NPUConfig

    Attributes
    ----------
    start : In(1)
        Start the program. While busy, it ends the running program with ``START_BUSY``
        before its next instruction.
    prog_addr, prog_len : In(32)
    busy, done, error : Out(1)
    error_code : Out(8)
    error_pc, pc : Out(32)
    cycles : Out(64)
        Cycles from ``start`` to done or error.
    read_cmd, read_row, read_done, read_error : to the DMA reader
    write_cmd, write_row, write_done, write_error : to the DMA writer
    spad : In(ScratchpadSignature)
    acc : In(AccumulatorSignature)
    act, weight : Out(stream) to the array; result : In(stream) from it
    """
    def __init__(self, config, *, read_row_bytes):
        self.config = config
        self.read_row_bytes = read_row_bytes
        rows, cols = config.rows, config.cols
        super().__init__({
            "start":       In(1),
            "prog_addr":   In(32),
            "prog_len":    In(32),
            "busy":        Out(1),
            "done":        Out(1),
            "error":       Out(1),
            "error_code":  Out(8),
            "error_pc":    Out(32),
            "pc":          Out(32),
            "cycles":      Out(64),
            "read_cmd":    Out(stream.Signature(BlockCommand)),
            "read_row":    In(stream.Signature(8 * read_row_bytes, always_ready=True)),
            "read_done":   In(1),
            "read_error":  In(1),
            "write_cmd":   Out(stream.Signature(BlockCommand)),
            "write_row":   Out(stream.Signature(8 * config.acc_row_bytes)),
            "write_done":  In(1),
            "write_error": In(1),
            "spad":        In(ScratchpadSignature(config.spad_depth, config.spad_row_bytes)),
            "acc":         In(AccumulatorSignature(config.acc_depth, cols)),
            "act":         Out(stream.Signature(ActivationRow(rows), always_ready=True)),
            "weight":      Out(stream.Signature(data.ArrayLayout(signed(8), cols),
                                                always_ready=True)),
            "result":      In(stream.Signature(data.ArrayLayout(signed(32), cols),
                                               always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        config = self.config
        rows, cols = config.rows, config.cols

        instr = Signal(Instruction)
        opcode = instr.opcode
        load, store, quant = instr.args.load, instr.args.store, instr.args.quant
        preload, matmul = instr.args.preload, instr.args.matmul

        # The output path's requantization state (LOAD_QUANT sets it, STORE_Q uses it) and
        # the requantizer between the accumulator and the DMA writer.
        m.submodules.requant = requant = Requantizer(cols)
        lanes32 = data.ArrayLayout(signed(32), cols)
        multipliers = Signal(lanes32)
        shifts = Signal(data.ArrayLayout(signed(6), cols))
        zero_point = Signal(signed(9))
        act_min = Signal(signed(8), init=-128)
        act_max = Signal(signed(8), init=127)
        staged_multipliers = Signal(lanes32)
        staged_shifts = Signal(lanes32)
        m.d.comb += [
            requant.acc.eq(self.acc.read_data),
            requant.multiplier.eq(multipliers),
            requant.shift.eq(shifts),
            requant.zero_point.eq(zero_point),
            requant.act_min.eq(act_min),
            requant.act_max.eq(act_max),
        ]
        shift_out_of_range = Signal()
        m.d.comb += shift_out_of_range.eq(
            Cat(*[(lane < -31) | (lane > 31) for lane in staged_shifts]).any())

        count = Signal(17)         # rows issued by the current instruction
        out_count = Signal(17)     # matmul results written to the accumulator
        commit_pending = Signal()  # a PRELOAD's weights wait for the next MATMUL
        weight_read = Signal()     # a PRELOAD read was issued in the previous cycle
        act_read = Signal()        # a MATMUL read was issued in the previous cycle
        act_commit = Signal()

        # The operand checks of the instruction being decoded.
        def dram_end(args):
            # Byte after the last one the block touches; more than 32 bits means it wraps.
            return args.dram_addr + (args.rows - 1) * args.dram_stride + args.row_bytes

        dram_overflow = Signal()
        with m.Switch(opcode):
            with m.Case(Opcode.LOAD_SPAD, Opcode.LOAD_ACC):
                m.d.comb += dram_overflow.eq(dram_end(load) > (1 << 32))
            with m.Case(Opcode.STORE, Opcode.STORE_Q):
                m.d.comb += dram_overflow.eq(dram_end(store) > (1 << 32))
            with m.Case(Opcode.LOAD_QUANT):
                m.d.comb += dram_overflow.eq(
                    quant.dram_addr + quant.dram_stride + quant.row_bytes > (1 << 32))

        def fail(code):
            m.d.sync += [self.error_code.eq(code), self.error_pc.eq(self.pc)]
            m.next = "ERROR"

        with m.If(self.busy):
            m.d.sync += self.cycles.eq(self.cycles + 1)

        # A start while busy is a host error: the running program ends with START_BUSY at
        # its next instruction boundary (every instruction finishes in bounded time).
        start_while_busy = Signal()
        with m.If(self.start & self.busy):
            m.d.sync += start_while_busy.eq(1)
        with m.If(~self.busy):
            m.d.sync += start_while_busy.eq(0)

        m.d.sync += [weight_read.eq(0), act_read.eq(0)]
        m.d.comb += [
            self.weight.valid.eq(weight_read),
            self.weight.payload.eq(self.spad.read_data[:8 * cols]),
            self.act.valid.eq(act_read),
            self.act.payload.lanes.eq(self.spad.read_data[:8 * rows]),
            self.act.payload.commit.eq(act_commit),
        ]

        with m.FSM(name="control"):
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [
                        self.done.eq(0), self.error.eq(0), self.error_code.eq(0),
                        self.error_pc.eq(0), self.pc.eq(0), self.cycles.eq(1),
                        self.busy.eq(1),
                    ]
                    with m.If((self.prog_addr[:4] != 0) | (self.prog_len == 0) |
                              (self.prog_addr + self.prog_len * INSTR_BYTES > (1 << 32))):
                        m.d.sync += self.error_code.eq(ErrorCode.PROGRAM)
                        m.next = "ERROR"
                    with m.Else():
                        m.next = "FETCH"

            with m.State("FETCH"):
                with m.If(start_while_busy):
                    fail(ErrorCode.START_BUSY)
                with m.Elif(self.pc == self.prog_len):
                    fail(ErrorCode.PROGRAM)
                with m.Else():
                    m.d.comb += [
                        self.read_cmd.valid.eq(1),
                        self.read_cmd.payload.addr.eq(self.prog_addr + self.pc * INSTR_BYTES),
                        self.read_cmd.payload.rows.eq(1),
                        self.read_cmd.payload.row_bytes.eq(INSTR_BYTES),
                        self.read_cmd.payload.stride.eq(0),
                    ]
                    with m.If(self.read_cmd.ready):
                        m.next = "FETCH_WAIT"

            with m.State("FETCH_WAIT"):
                with m.If(self.read_row.valid):
                    m.d.sync += instr.eq(self.read_row.payload[:INSTR_BITS])
                with m.If(self.read_done):
                    with m.If(self.read_error):
                        fail(ErrorCode.BUS_READ)
                    with m.Else():
                        m.next = "DECODE"

            with m.State("DECODE"):
                m.d.sync += [count.eq(0), out_count.eq(0)]
                with m.Switch(opcode):
                    with m.Case(Opcode.END):
                        m.d.sync += [self.busy.eq(0), self.done.eq(1)]
                        m.next = "IDLE"
                    with m.Case(Opcode.LOAD_SPAD):
                        with m.If((load.rows == 0) | (load.row_bytes == 0) |
                                  (load.row_bytes > config.spad_row_bytes)):
                            fail(ErrorCode.BAD_LENGTH)
                        with m.Elif(load.local_addr + load.rows > config.spad_depth):
                            fail(ErrorCode.SPAD_RANGE)
                        with m.Elif(dram_overflow):
                            fail(ErrorCode.DRAM_RANGE)
                        with m.Else():
                            m.next = "LOAD"
                    with m.Case(Opcode.LOAD_ACC):
                        with m.If((load.rows == 0) | (load.row_bytes == 0) |
                                  (load.row_bytes > config.acc_row_bytes)):
                            fail(ErrorCode.BAD_LENGTH)
                        with m.Elif(load.local_addr + load.rows > config.acc_depth):
                            fail(ErrorCode.ACC_RANGE)
                        with m.Elif(dram_overflow):
                            fail(ErrorCode.DRAM_RANGE)
                        with m.Else():
                            m.next = "LOAD"
                    with m.Case(Opcode.PRELOAD):
                        with m.If(preload.spad_addr + rows > config.spad_depth):
                            fail(ErrorCode.SPAD_RANGE)
                        with m.Else():
                            m.next = "PRELOAD"
                    with m.Case(Opcode.MATMUL):
                        with m.If(matmul.rows == 0):
                            fail(ErrorCode.BAD_LENGTH)
                        with m.Elif(matmul.spad_addr + matmul.rows > config.spad_depth):
                            fail(ErrorCode.SPAD_RANGE)
                        with m.Elif(matmul.acc_addr + matmul.rows > config.acc_depth):
                            fail(ErrorCode.ACC_RANGE)
                        with m.Else():
                            m.next = "MATMUL"
                    with m.Case(Opcode.STORE):
                        with m.If((store.rows == 0) | (store.row_bytes == 0) |
                                  (store.row_bytes[:2] != 0) |
                                  (store.row_bytes > config.acc_row_bytes)):
                            fail(ErrorCode.BAD_LENGTH)
                        with m.Elif(store.acc_addr + store.rows > config.acc_depth):
                            fail(ErrorCode.ACC_RANGE)
                        with m.Elif(dram_overflow):
                            fail(ErrorCode.DRAM_RANGE)
                        with m.Else():
                            m.next = "STORE"
                    with m.Case(Opcode.STORE_Q):
                        with m.If((store.rows == 0) | (store.row_bytes == 0) |
                                  (store.row_bytes > cols)):
                            fail(ErrorCode.BAD_LENGTH)
                        with m.Elif(store.acc_addr + store.rows > config.acc_depth):
                            fail(ErrorCode.ACC_RANGE)
                        with m.Elif(dram_overflow):
                            fail(ErrorCode.DRAM_RANGE)
                        with m.Else():
                            m.next = "STORE"
                    with m.Case(Opcode.LOAD_QUANT):
                        with m.If((quant.row_bytes == 0) | (quant.row_bytes[:2] != 0) |
                                  (quant.row_bytes > config.acc_row_bytes)):
                            fail(ErrorCode.BAD_LENGTH)
                        with m.Elif(dram_overflow):
                            fail(ErrorCode.DRAM_RANGE)
                        with m.Else():
                            m.next = "QUANT"
                    with m.Default():
                        fail(ErrorCode.ILLEGAL_OPCODE)

            # DRAM -> scratchpad or accumulator rows.
            with m.State("LOAD"):
                m.d.comb += [
                    self.read_cmd.valid.eq(1),
                    self.read_cmd.payload.addr.eq(load.dram_addr),
                    self.read_cmd.payload.rows.eq(load.rows),
                    self.read_cmd.payload.row_bytes.eq(load.row_bytes),
                    self.read_cmd.payload.stride.eq(load.dram_stride),
                ]
                with m.If(self.read_cmd.ready):
                    m.next = "LOAD_WAIT"

            with m.State("LOAD_WAIT"):
                to_spad = opcode == Opcode.LOAD_SPAD
                m.d.comb += [
                    self.spad.write_addr.eq(load.local_addr + count),
                    self.spad.write_data.eq(self.read_row.payload),
                    self.spad.write_en.eq(self.read_row.valid & to_spad),
                    self.acc.write_addr.eq(load.local_addr + count),
                    self.acc.write_data.eq(self.read_row.payload),
                    self.acc.write_accumulate.eq(0),
                    self.acc.write_en.eq(self.read_row.valid & ~to_spad),
                ]
                with m.If(self.read_row.valid):
                    m.d.sync += count.eq(count + 1)
                with m.If(self.read_done):
                    with m.If(self.read_error):
                        fail(ErrorCode.BUS_READ)
                    with m.Else():
                        m.next = "NEXT"

            # Scratchpad rows spad_addr+R-1 down to spad_addr -> shadow weights.
            with m.State("PRELOAD"):
                m.d.comb += [
                    self.spad.read_addr.eq(preload.spad_addr + rows - 1 - count),
                    self.spad.read_en.eq(1),
                ]
                m.d.sync += [weight_read.eq(1), count.eq(count + 1)]
                with m.If(count == rows - 1):
                    m.d.sync += commit_pending.eq(1)
                    m.next = "NEXT"

            # Stream scratchpad rows through the array; results go to the accumulator.
            with m.State("MATMUL"):
                with m.If(count != matmul.rows):
                    m.d.comb += [
                        self.spad.read_addr.eq(matmul.spad_addr + count),
                        self.spad.read_en.eq(1),
                    ]
                    m.d.sync += [
                        act_read.eq(1),
                        act_commit.eq(commit_pending & (count == 0)),
                        commit_pending.eq(0),
                        count.eq(count + 1),
                    ]
                m.d.comb += [
                    self.acc.write_addr.eq(matmul.acc_addr + out_count),
                    self.acc.write_data.eq(self.result.payload),
                    self.acc.write_accumulate.eq(matmul.accumulate),
                    self.acc.write_en.eq(self.result.valid),
                ]
                with m.If(self.result.valid):
                    m.d.sync += out_count.eq(out_count + 1)
                    with m.If(out_count == matmul.rows - 1):
                        m.next = "NEXT"

            # Accumulator rows -> DRAM.
            with m.State("STORE"):
                m.d.comb += [
                    self.write_cmd.valid.eq(1),
                    self.write_cmd.payload.addr.eq(store.dram_addr),
                    self.write_cmd.payload.rows.eq(store.rows),
                    self.write_cmd.payload.row_bytes.eq(store.row_bytes),
                    self.write_cmd.payload.stride.eq(store.dram_stride),
                ]
                with m.If(self.write_cmd.ready):
                    m.next = "STORE_READ"

            with m.State("STORE_READ"):
                m.d.comb += [
                    self.acc.read_addr.eq(store.acc_addr + count),
                    self.acc.read_en.eq(1),
                ]
                with m.If(opcode == Opcode.STORE_Q):
                    m.next = "REQUANTIZE"
                with m.Else():
                    m.next = "STORE_ROW"

            # STORE_Q: the row read in STORE_READ goes through the two-stage requantizer.
            with m.State("REQUANTIZE"):
                m.d.comb += requant.valid.eq(1)
                m.next = "REQUANTIZE_WAIT"

            with m.State("REQUANTIZE_WAIT"):
                m.next = "STORE_ROW"

            with m.State("STORE_ROW"):
                m.d.comb += self.write_row.valid.eq(1)
                with m.If(opcode == Opcode.STORE_Q):
                    m.d.comb += self.write_row.payload.eq(requant.result)
                with m.Else():
                    m.d.comb += self.write_row.payload.eq(self.acc.read_data)
                with m.If(self.write_row.ready):
                    m.d.sync += count.eq(count + 1)
                    with m.If(count == store.rows - 1):
                        m.next = "STORE_WAIT"
                    with m.Else():
                        m.next = "STORE_READ"

            with m.State("STORE_WAIT"):
                with m.If(self.write_done):
                    with m.If(self.write_error):
                        fail(ErrorCode.BUS_WRITE)
                    with m.Else():
                        m.next = "NEXT"

            # LOAD_QUANT: two DRAM rows (multipliers, shifts) into staging, checked, then kept.
            with m.State("QUANT"):
                m.d.comb += [
                    self.read_cmd.valid.eq(1),
                    self.read_cmd.payload.addr.eq(quant.dram_addr),
                    self.read_cmd.payload.rows.eq(2),
                    self.read_cmd.payload.row_bytes.eq(quant.row_bytes),
                    self.read_cmd.payload.stride.eq(quant.dram_stride),
                ]
                with m.If(self.read_cmd.ready):
                    m.next = "QUANT_WAIT"

            with m.State("QUANT_WAIT"):
                with m.If(self.read_row.valid):
                    m.d.sync += count.eq(count + 1)
                    with m.If(count == 0):
                        m.d.sync += staged_multipliers.eq(self.read_row.payload)
                    with m.Else():
                        m.d.sync += staged_shifts.eq(self.read_row.payload)
                with m.If(self.read_done):
                    with m.If(self.read_error):
                        fail(ErrorCode.BUS_READ)
                    with m.Else():
                        m.next = "QUANT_CHECK"

            with m.State("QUANT_CHECK"):
                with m.If((quant.zero_point < -128) | (quant.zero_point > 127) |
                          (quant.act_min > quant.act_max) | shift_out_of_range):
                    fail(ErrorCode.QUANT)
                with m.Else():
                    m.d.sync += [
                        multipliers.eq(staged_multipliers),
                        zero_point.eq(quant.zero_point),
                        act_min.eq(quant.act_min),
                        act_max.eq(quant.act_max),
                    ]
                    for lane in range(cols):
                        m.d.sync += shifts[lane].eq(staged_shifts[lane])
                    m.next = "NEXT"

            with m.State("NEXT"):
                # The last accumulator write of the instruction lands in this cycle at most.
                with m.If(~self.acc.busy):
                    m.d.sync += self.pc.eq(self.pc + 1)
                    m.next = "FETCH"

            with m.State("ERROR"):
                m.d.sync += [self.busy.eq(0), self.error.eq(1)]
                m.next = "IDLE"

        return m
