"""The controller: fetches the program ahead, issues it in order to four units that overlap.

Block diagram of the controller (see docs/architecture.md, "Overlap")::

    DMA reader --> fetcher --> instruction queue --> issue (checks, hazards)
                                                       |
              +------------------+--------------------+-------------------+
              v                  v                    v                   v
         load unit        weight loader          streamer            store unit
     LOAD_SPAD/ACC/QUANT     PRELOAD              MATMUL           STORE, STORE_Q
     DMA reader ->        scratchpad port B    scratchpad port A    accumulator port 2
     scratchpad/acc       -> shadow weights    -> array -> acc      -> DMA writer
"""

from amaranth.hdl import Cat, Module, Mux, ResetInserter, Signal, signed
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from .accumulator import AccumulatorSignature
from .config import FETCH_BURST, FETCH_DEPTH, FETCH_HIGH_WATER, FETCH_LOW_WATER
from .dma import BlockCommand
from .isa import INSTR_BITS, INSTR_BYTES, ErrorCode, Instruction, Opcode
from .requant import Requantizer
from .scratchpad import ScratchpadSignature
from .systolic import ActivationRow


__all__ = ["Controller", "PerfCounters"]


class PerfCounters(data.Struct):
    """The performance counters (``hw.isa.Reg.PERF_*``), 32 bits each, cleared at start."""
    array_rows:    32   #: activation rows streamed into the array (R x C MAC slots each)
    useful_macs:   32   #: MACs on real operands: rows x the MATMUL's ``k_width x n_width``
    stall_fetch:   32   #: issue cycles with no instruction fetched yet
    stall_load:    32   #: issue cycles waiting for the load unit
    stall_store:   32   #: issue cycles waiting for the store unit
    stall_array:   32   #: issue cycles waiting for the array (streamer, weights, drain)
    instructions:  32   #: instructions issued (END included)


class Controller(wiring.Component):
    """Runs a compiled instruction stream (:mod:`hw.isa`) on the array, memories and DMA.

    On ``start`` the controller checks the program registers. A fetcher then reads the
    program ahead into a queue, :data:`~hw.config.FETCH_BURST` instructions per DMA command.
    The issue stage takes instructions in program order, checks their operands and hands each
    to one of four units, which then run side by side:

    * the load unit (``LOAD_SPAD``, ``LOAD_ACC``, ``LOAD_QUANT``) on the DMA reader, which
      it shares with the fetcher;
    * the weight loader (``PRELOAD``) on the scratchpad's second read port, filling the
      shadow weights while the array computes with the active ones;
    * the streamer (``MATMUL``) on the first read port, with up to two ``MATMUL`` s in the
      array: the next streams in right behind the last row of the one before;
    * the store unit (``STORE``, ``STORE_Q``) on the accumulator's second read port and the
      DMA writer.

    The issue stage holds an instruction back while it would conflict with one that a unit
    still runs (hazards on scratchpad rows, accumulator rows, DRAM bytes, the shadow weights
    and the requantization state), so every program computes exactly what it computes when
    run one instruction at a time (:mod:`sw.model`). The DRAM sees the same writes, in the
    same order, as well: a store starts only once no load before it can still fail, and a
    store over the program itself makes the fetcher read the rest of it again.

    Errors are precise: a failing operand check, bus error or host ``START_BUSY`` ends the
    program with the code and index of the first failing instruction in program order,
    after the instructions before it have completed; no store after it has started.

    Parameters
    ----------
    config : NPUConfig
    read_row_bytes : int
        Width of the DMA reader's rows.

    Attributes
    ----------
    start : In(1)
        Start the program. While busy, it ends the running program with ``START_BUSY``
        before its next instruction is issued.
    prog_addr, prog_len : In(32)
    busy, done, error : Out(1)
    error_code : Out(8)
    error_pc, pc : Out(32)
        The failing instruction's index; the index of the instruction at the issue stage.
    cycles : Out(64)
        Cycles from ``start`` to done or error.
    perf : Out(PerfCounters)
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
            "perf":        Out(PerfCounters),
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

        # ------------------------------------------------------------ requantization state
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

        # ------------------------------------------------------------ run state, errors
        running = Signal()          # between start and done/error
        m.d.comb += self.busy.eq(running)
        with m.If(running):
            m.d.sync += self.cycles.eq(self.cycles + 1)

        start_while_busy = Signal()
        with m.If(self.start & running):
            m.d.sync += start_while_busy.eq(1)
        with m.If(~running):
            m.d.sync += start_while_busy.eq(0)

        # The first error in program order wins; the program stops once the units are idle.
        stopping = Signal()
        stop_code = Signal(8)
        stop_pc = Signal(32)
        raises = []                 # (condition, code, pc), collected from every unit

        def raise_error(condition, code, pc):
            # Called inside the m.If that raises: the flag is driven under those conditions.
            flag = Signal(name=f"raise_{len(raises)}")
            m.d.comb += flag.eq(condition)
            raises.append((flag, code, pc))

        # ------------------------------------------------------------ instruction queue
        iq_flush = Signal()
        iq = fifo.SyncFIFO(width=INSTR_BITS + 1, depth=FETCH_DEPTH)
        m.submodules.iq = ResetInserter(iq_flush)(iq)

        fetch_pc = Signal(32)        # index of the next instruction the fetcher delivers
        fetch_stop = Signal()        # a fetch failed: the queue ends in its error entry
        refetch = Signal()           # a store over the program: refetch after it

        # ------------------------------------------------------------ DMA reader arbiter
        reader_busy = Signal()
        reader_is_load = Signal()    # the command in the reader is the load unit's

        # ------------------------------------------------------------ unit state
        # Load unit.
        ld_busy = Signal()
        ld_sent = Signal()
        ld_check = Signal()          # LOAD_QUANT: check the staged state next cycle
        ld_op = Signal(8)
        ld_local = Signal(16)
        ld_rows = Signal(16)
        ld_row_bytes = Signal(16)
        ld_addr = Signal(32)
        ld_stride = Signal(32)
        ld_pc = Signal(32)
        ld_count = Signal(17)
        ld_zero_point = Signal(signed(16))
        ld_act_min = Signal(signed(8))
        ld_act_max = Signal(signed(8))
        ld_to_spad = Signal()
        ld_to_acc = Signal()
        m.d.comb += [
            ld_to_spad.eq(ld_busy & (ld_op == Opcode.LOAD_SPAD)),
            ld_to_acc.eq(ld_busy & (ld_op == Opcode.LOAD_ACC)),
        ]

        # Weight loader.
        wl_busy = Signal()
        wl_addr = Signal(16)
        wl_count = Signal(range(rows + 1))
        commit_pending = Signal()    # shadow weights wait for the next MATMUL
        # Cycles until the shadow weights may shift again: PE(i, j) takes its shadow weight
        # i + j cycles after the committing row enters the array (hw/systolic.py).
        guard = Signal(range(rows + cols + 1))
        weight_read = Signal()

        # Streamer and the MATMULs whose results are still in the array.
        st_busy = Signal()
        st_spad = Signal(16)
        st_rows = Signal(16)
        st_count = Signal(16)
        st_commit = Signal()
        st_macs = Signal(32)         # k_width * n_width of the streaming MATMUL
        act_read = Signal()
        act_commit = Signal()
        # The MATMULs whose results are still to be written: two slots, oldest at wb_head.
        writeback = data.StructLayout({"acc_addr": 16, "rows": 16, "accumulate": 1})
        wb_slots = [Signal(writeback, name=f"wb_slot_{i}") for i in range(2)]
        wb_head_index = Signal()
        wb_count = Signal(range(3))
        wb_push = Signal()
        wb_pop = Signal()
        wb_head = Signal(writeback)
        m.d.comb += wb_head.eq(Mux(wb_head_index, wb_slots[1], wb_slots[0]))
        wb_valid = [Signal(name=f"wb_valid_{i}") for i in range(2)]
        for i in range(2):
            # Slot i is in use when it is the head and the queue is not empty, or the tail.
            m.d.comb += wb_valid[i].eq(((wb_head_index == i) & (wb_count >= 1)) |
                                       ((wb_head_index != i) & (wb_count == 2)))
        out_count = Signal(16)

        # Store unit.
        sd_start = Signal()
        sd_busy = Signal()
        sd_op = Signal(8)
        sd_acc = Signal(16)
        sd_rows = Signal(16)
        sd_row_bytes = Signal(16)
        sd_addr = Signal(32)
        sd_stride = Signal(32)
        sd_pc = Signal(32)
        sd_count = Signal(16)
        sd_lo = Signal(34)           # DRAM bytes [sd_lo, sd_hi) the store may write
        sd_hi = Signal(34)

        # ------------------------------------------------------------ decode stage
        # The instruction at the queue's head is decoded (DRAM bounds, operand checks) into
        # registers, a cycle before the issue stage looks at it: the bounds' multiply and the
        # checks' carry chains do not share a cycle with the hazard checks and the issue.
        fetched = Signal(Instruction)
        m.d.comb += fetched.eq(iq.r_data[:INSTR_BITS])
        opcode = fetched.opcode
        load, store, quant = fetched.args.load, fetched.args.store, fetched.args.quant
        preload, matmul = fetched.args.preload, fetched.args.matmul

        # The byte after the last one a 2-D block touches is addr + (rows - 1) * stride +
        # row_bytes (more than 32 bits: it wraps). It is summed as rows * stride + base, with
        # base = addr + row_bytes - stride formed beside the multiplier, so that the product
        # starts right at the queue's output and only one carry chain follows it; the DRAM
        # range check compares the product with 2**32 - base, beside that last sum (equal to
        # next_hi > 2**32 whenever rows > 0; a block of 0 rows stops on BAD_LENGTH first).
        product = Signal(48)         # rows x stride of a block; 0 for LOAD_QUANT
        base = Signal(signed(35))
        next_lo = Signal(50)
        next_hi = Signal(50)
        with m.Switch(opcode):
            with m.Case(Opcode.LOAD_SPAD, Opcode.LOAD_ACC):
                m.d.comb += [next_lo.eq(load.dram_addr),
                             product.eq(load.rows * load.dram_stride),
                             base.eq(load.dram_addr + load.row_bytes - load.dram_stride)]
            with m.Case(Opcode.STORE, Opcode.STORE_Q):
                m.d.comb += [next_lo.eq(store.dram_addr),
                             product.eq(store.rows * store.dram_stride),
                             base.eq(store.dram_addr + store.row_bytes - store.dram_stride)]
            with m.Case(Opcode.LOAD_QUANT):
                m.d.comb += [next_lo.eq(quant.dram_addr),
                             base.eq(quant.dram_addr + quant.dram_stride + quant.row_bytes)]
        m.d.comb += next_hi.eq(product + base)
        dram_limit = Signal(signed(35))
        m.d.comb += dram_limit.eq((1 << 32) - base)
        dram_overflow = product > dram_limit      # next_hi > 2**32

        # Operand checks, in the order the ISA documents them: lengths, local range, DRAM.
        next_check = Signal(8)

        def checks(bad_length, local_range=None, range_code=None, dram=False):
            with m.If(bad_length):
                m.d.comb += next_check.eq(ErrorCode.BAD_LENGTH)
            if local_range is not None:
                with m.Elif(local_range):
                    m.d.comb += next_check.eq(range_code)
            if dram:
                with m.Elif(dram_overflow):
                    m.d.comb += next_check.eq(ErrorCode.DRAM_RANGE)

        def bad_block(args, row_limit):
            return (args.rows == 0) | (args.row_bytes == 0) | (args.row_bytes > row_limit)

        with m.Switch(opcode):
            with m.Case(Opcode.END):
                pass
            with m.Case(Opcode.LOAD_SPAD):
                checks(bad_block(load, config.spad_row_bytes),
                       load.local_addr + load.rows > config.spad_depth, ErrorCode.SPAD_RANGE,
                       dram=True)
            with m.Case(Opcode.LOAD_ACC):
                checks(bad_block(load, config.acc_row_bytes),
                       load.local_addr + load.rows > config.acc_depth, ErrorCode.ACC_RANGE,
                       dram=True)
            with m.Case(Opcode.PRELOAD):
                checks(0, preload.spad_addr + rows > config.spad_depth, ErrorCode.SPAD_RANGE)
            with m.Case(Opcode.MATMUL):
                with m.If((matmul.rows == 0) | (matmul.k_width > rows) |
                          (matmul.n_width > cols)):
                    m.d.comb += next_check.eq(ErrorCode.BAD_LENGTH)
                with m.Elif(matmul.spad_addr + matmul.rows > config.spad_depth):
                    m.d.comb += next_check.eq(ErrorCode.SPAD_RANGE)
                with m.Elif(matmul.acc_addr + matmul.rows > config.acc_depth):
                    m.d.comb += next_check.eq(ErrorCode.ACC_RANGE)
            with m.Case(Opcode.STORE):
                checks(bad_block(store, config.acc_row_bytes) | (store.row_bytes[:2] != 0),
                       store.acc_addr + store.rows > config.acc_depth, ErrorCode.ACC_RANGE,
                       dram=True)
            with m.Case(Opcode.STORE_Q):
                checks(bad_block(store, cols),
                       store.acc_addr + store.rows > config.acc_depth, ErrorCode.ACC_RANGE,
                       dram=True)
            with m.Case(Opcode.LOAD_QUANT):
                checks((quant.row_bytes == 0) | (quant.row_bytes[:2] != 0) |
                       (quant.row_bytes > config.acc_row_bytes), dram=True)
            with m.Default():
                m.d.comb += next_check.eq(ErrorCode.ILLEGAL_OPCODE)

        dec_valid = Signal()
        instr = Signal(Instruction)
        head_lo = Signal(50)
        head_hi = Signal(50)
        check = Signal(8)
        head_fetch_error = Signal()
        opcode = instr.opcode
        load, store, quant = instr.args.load, instr.args.store, instr.args.quant
        preload, matmul = instr.args.preload, instr.args.matmul

        # ------------------------------------------------------------ hazards
        def overlap(a, a_rows, b, b_rows):
            return (a < b + b_rows) & (b < a + a_rows)

        # What each unit holds, as the issue stage sees it.
        st_free = ~st_busy | (st_count == st_rows - 1)   # reading its last row this cycle
        array_drained = ~st_busy & (wb_count == 0) & ~self.acc.busy
        # A store reads accumulator rows: it waits for MATMULs that still write any of them.
        # A write still in the accumulator's second stage (``acc.busy``) lands before the
        # store's first read, two cycles after the issue: the store need not wait for it, so
        # it goes while the results of other rows stream in.
        store_raw = Signal()
        m.d.comb += store_raw.eq(Cat(*[
            wb_valid[i] & overlap(store.acc_addr, store.rows,
                                  wb_slots[i].acc_addr, wb_slots[i].rows)
            for i in range(2)]).any())
        store_dram_hazard = sd_busy & (head_lo < sd_hi) & (sd_lo < head_hi)

        blocked_load = Signal()      # why the head waits, for the stall counters
        blocked_store = Signal()
        blocked_array = Signal()
        with m.Switch(opcode):
            with m.Case(Opcode.END):
                m.d.comb += [
                    blocked_load.eq(ld_busy | reader_busy),
                    blocked_array.eq(wl_busy | ~array_drained),
                    blocked_store.eq(sd_busy),
                ]
            with m.Case(Opcode.LOAD_SPAD):
                m.d.comb += [
                    blocked_load.eq(ld_busy),
                    blocked_array.eq(
                        (st_busy & overlap(load.local_addr, load.rows, st_spad, st_rows)) |
                        (wl_busy & overlap(load.local_addr, load.rows, wl_addr, rows))),
                    blocked_store.eq(store_dram_hazard),
                ]
            with m.Case(Opcode.LOAD_ACC):
                m.d.comb += [
                    blocked_load.eq(ld_busy),
                    blocked_array.eq(~array_drained),
                    blocked_store.eq(sd_busy),
                ]
            with m.Case(Opcode.LOAD_QUANT):
                m.d.comb += [
                    blocked_load.eq(ld_busy),
                    blocked_store.eq(sd_busy),
                ]
            with m.Case(Opcode.PRELOAD):
                m.d.comb += [
                    blocked_load.eq(ld_to_spad &
                                    overlap(preload.spad_addr, rows, ld_local, ld_rows)),
                    blocked_array.eq(wl_busy),
                ]
            with m.Case(Opcode.MATMUL):
                m.d.comb += [
                    blocked_load.eq(ld_to_acc |
                                    (ld_to_spad & overlap(matmul.spad_addr, matmul.rows,
                                                          ld_local, ld_rows))),
                    blocked_array.eq(~st_free | (wb_count == 2) | wl_busy),
                    blocked_store.eq(sd_busy & overlap(matmul.acc_addr, matmul.rows,
                                                       sd_acc, sd_rows)),
                ]
            with m.Case(Opcode.STORE, Opcode.STORE_Q):
                m.d.comb += [
                    blocked_load.eq(ld_busy),       # no load before a store may still fail
                    blocked_array.eq(store_raw),
                    blocked_store.eq(sd_busy),
                ]

        # ------------------------------------------------------------ issue stage
        prog_end = Signal(34)
        m.d.comb += prog_end.eq(self.prog_addr + self.prog_len * INSTR_BYTES)
        issue = Signal()
        can_issue = ~(blocked_load | blocked_store | blocked_array)

        with m.If(running & ~stopping & ~refetch):
            with m.If(start_while_busy):
                raise_error(1, ErrorCode.START_BUSY, self.pc)
            with m.Elif(self.pc == self.prog_len):
                raise_error(1, ErrorCode.PROGRAM, self.pc)
            with m.Elif(~dec_valid):
                m.d.sync += self.perf.stall_fetch.eq(self.perf.stall_fetch + 1)
            with m.Elif(head_fetch_error):
                raise_error(1, ErrorCode.BUS_READ, self.pc)
            with m.Elif(check != 0):
                raise_error(1, check, self.pc)
            with m.Elif(~can_issue):
                with m.If(blocked_load):
                    m.d.sync += self.perf.stall_load.eq(self.perf.stall_load + 1)
                with m.Elif(blocked_store):
                    m.d.sync += self.perf.stall_store.eq(self.perf.stall_store + 1)
                with m.Else():
                    m.d.sync += self.perf.stall_array.eq(self.perf.stall_array + 1)
            with m.Else():
                m.d.comb += issue.eq(1)

        with m.If(issue):
            m.d.sync += [dec_valid.eq(0),
                         self.perf.instructions.eq(self.perf.instructions + 1)]
            with m.If(opcode != Opcode.END):
                m.d.sync += self.pc.eq(self.pc + 1)
            with m.Switch(opcode):
                with m.Case(Opcode.END):
                    m.d.sync += [running.eq(0), self.done.eq(1)]
                with m.Case(Opcode.LOAD_SPAD, Opcode.LOAD_ACC, Opcode.LOAD_QUANT):
                    m.d.sync += [
                        ld_busy.eq(1), ld_sent.eq(0), ld_op.eq(opcode), ld_pc.eq(self.pc),
                        ld_count.eq(0),
                    ]
                    with m.If(opcode == Opcode.LOAD_QUANT):
                        m.d.sync += [
                            ld_rows.eq(2), ld_row_bytes.eq(quant.row_bytes),
                            ld_addr.eq(quant.dram_addr), ld_stride.eq(quant.dram_stride),
                            ld_zero_point.eq(quant.zero_point), ld_act_min.eq(quant.act_min),
                            ld_act_max.eq(quant.act_max),
                        ]
                    with m.Else():
                        m.d.sync += [
                            ld_local.eq(load.local_addr), ld_rows.eq(load.rows),
                            ld_row_bytes.eq(load.row_bytes), ld_addr.eq(load.dram_addr),
                            ld_stride.eq(load.dram_stride),
                        ]
                with m.Case(Opcode.PRELOAD):
                    m.d.sync += [wl_busy.eq(1), wl_addr.eq(preload.spad_addr),
                                 wl_count.eq(0)]
                with m.Case(Opcode.MATMUL):
                    m.d.comb += wb_push.eq(1)
                    with m.If(wb_head_index ^ (wb_count == 1)):
                        m.d.sync += wb_slots[1].eq(Cat(matmul.acc_addr, matmul.rows,
                                                       matmul.accumulate))
                    with m.Else():
                        m.d.sync += wb_slots[0].eq(Cat(matmul.acc_addr, matmul.rows,
                                                       matmul.accumulate))
                    # The streamer's registers are set below, after its own updates.
                with m.Case(Opcode.STORE, Opcode.STORE_Q):
                    m.d.comb += sd_start.eq(1)
                    m.d.sync += [
                        sd_op.eq(opcode), sd_acc.eq(store.acc_addr), sd_rows.eq(store.rows),
                        sd_row_bytes.eq(store.row_bytes), sd_addr.eq(store.dram_addr),
                        sd_stride.eq(store.dram_stride), sd_pc.eq(self.pc), sd_count.eq(0),
                        sd_lo.eq(head_lo), sd_hi.eq(head_hi),
                    ]
                    with m.If((head_lo < prog_end) & (self.prog_addr < head_hi)):
                        m.d.sync += refetch.eq(1)

        # The decode stage takes the next instruction as the issue stage frees it.
        with m.If(iq.r_rdy & (~dec_valid | issue)):
            m.d.comb += iq.r_en.eq(1)
            m.d.sync += [
                dec_valid.eq(1), instr.eq(fetched), head_lo.eq(next_lo), head_hi.eq(next_hi),
                check.eq(next_check), head_fetch_error.eq(iq.r_data[INSTR_BITS]),
            ]

        # ------------------------------------------------------------ fetcher
        fetch_rows = Signal(range(FETCH_BURST + 1))
        with m.If(self.prog_len - fetch_pc >= FETCH_BURST):
            m.d.comb += fetch_rows.eq(FETCH_BURST)
        with m.Else():
            m.d.comb += fetch_rows.eq(self.prog_len - fetch_pc)
        end_issuing = issue & (opcode == Opcode.END)
        fetch_want = (running & ~stopping & ~refetch & ~fetch_stop & ~end_issuing &
                      (fetch_pc != self.prog_len) & (iq.level <= FETCH_HIGH_WATER))
        load_want = ld_busy & ~ld_sent & ~ld_check
        grant_fetch = Signal()
        grant_load = Signal()
        with m.If(~reader_busy):
            with m.If(fetch_want & (~load_want | (iq.level < FETCH_LOW_WATER))):
                m.d.comb += grant_fetch.eq(1)
            with m.Elif(load_want):
                m.d.comb += grant_load.eq(1)
        with m.If(grant_fetch):
            m.d.comb += [
                self.read_cmd.valid.eq(1),
                self.read_cmd.payload.addr.eq(self.prog_addr + fetch_pc * INSTR_BYTES),
                self.read_cmd.payload.rows.eq(fetch_rows),
                self.read_cmd.payload.row_bytes.eq(INSTR_BYTES),
                self.read_cmd.payload.stride.eq(INSTR_BYTES),
            ]
        with m.Elif(grant_load):
            m.d.comb += [
                self.read_cmd.valid.eq(1),
                self.read_cmd.payload.addr.eq(ld_addr),
                self.read_cmd.payload.rows.eq(ld_rows),
                self.read_cmd.payload.row_bytes.eq(ld_row_bytes),
                self.read_cmd.payload.stride.eq(ld_stride),
            ]
        with m.If(self.read_cmd.valid & self.read_cmd.ready):
            m.d.sync += [reader_busy.eq(1), reader_is_load.eq(grant_load)]
            with m.If(grant_load):
                m.d.sync += ld_sent.eq(1)
        with m.If(self.read_done):
            m.d.sync += reader_busy.eq(0)

        # Fetched words go to the queue; a failed fetch leaves an error entry in its place.
        fetching = reader_busy & ~reader_is_load
        with m.If(fetching & self.read_row.valid):
            m.d.comb += [iq.w_en.eq(1), iq.w_data.eq(self.read_row.payload[:INSTR_BITS])]
            m.d.sync += fetch_pc.eq(fetch_pc + 1)
        with m.If(fetching & self.read_done & self.read_error):
            m.d.comb += [iq.w_en.eq(1), iq.w_data.eq(1 << INSTR_BITS)]
            m.d.sync += fetch_stop.eq(1)

        # After a store over the program: drop what was fetched, read on from the next one.
        with m.If(refetch & ~sd_busy & ~reader_busy):
            m.d.comb += iq_flush.eq(1)
            m.d.sync += [refetch.eq(0), fetch_pc.eq(self.pc), fetch_stop.eq(0),
                         dec_valid.eq(0)]

        # ------------------------------------------------------------ load unit
        loading = reader_busy & reader_is_load
        with m.If(loading & self.read_row.valid):
            m.d.sync += ld_count.eq(ld_count + 1)
            with m.If(ld_op == Opcode.LOAD_QUANT):
                with m.If(ld_count == 0):
                    m.d.sync += staged_multipliers.eq(self.read_row.payload)
                with m.Else():
                    m.d.sync += staged_shifts.eq(self.read_row.payload)
        m.d.comb += [
            self.spad.write_addr.eq(ld_local + ld_count),
            self.spad.write_data.eq(self.read_row.payload),
            self.spad.write_en.eq(loading & self.read_row.valid & (ld_op == Opcode.LOAD_SPAD)),
        ]
        with m.If(loading & self.read_done):
            with m.If(self.read_error):
                raise_error(1, ErrorCode.BUS_READ, ld_pc)
                m.d.sync += ld_busy.eq(0)
            with m.Elif(ld_op == Opcode.LOAD_QUANT):
                m.d.sync += ld_check.eq(1)
            with m.Else():
                m.d.sync += ld_busy.eq(0)
        with m.If(ld_check):
            m.d.sync += [ld_check.eq(0), ld_busy.eq(0)]
            with m.If((ld_zero_point < -128) | (ld_zero_point > 127) |
                      (ld_act_min > ld_act_max) | shift_out_of_range):
                raise_error(1, ErrorCode.QUANT, ld_pc)
            with m.Else():
                m.d.sync += [
                    multipliers.eq(staged_multipliers),
                    zero_point.eq(ld_zero_point),
                    act_min.eq(ld_act_min),
                    act_max.eq(ld_act_max),
                ]
                for lane in range(cols):
                    m.d.sync += shifts[lane].eq(staged_shifts[lane])

        # ------------------------------------------------------------ weight loader
        with m.If(guard != 0):
            m.d.sync += guard.eq(guard - 1)
        with m.If(issue & (opcode == Opcode.MATMUL) & commit_pending):
            m.d.sync += guard.eq(rows + cols - 1)
        m.d.sync += weight_read.eq(0)
        with m.If(wl_busy & (guard == 0)):
            m.d.comb += [
                self.spad.weight_addr.eq(wl_addr + rows - 1 - wl_count),
                self.spad.weight_en.eq(1),
            ]
            m.d.sync += [weight_read.eq(1), wl_count.eq(wl_count + 1)]
            with m.If(wl_count == rows - 1):
                m.d.sync += [wl_busy.eq(0), commit_pending.eq(1)]
        m.d.comb += [
            self.weight.valid.eq(weight_read),
            self.weight.payload.eq(self.spad.weight_data[:8 * cols]),
        ]

        # ------------------------------------------------------------ streamer
        m.d.sync += act_read.eq(0)
        with m.If(st_busy):
            m.d.comb += [
                self.spad.read_addr.eq(st_spad + st_count),
                self.spad.read_en.eq(1),
            ]
            m.d.sync += [
                act_read.eq(1),
                act_commit.eq(st_commit & (st_count == 0)),
                st_count.eq(st_count + 1),
                self.perf.array_rows.eq(self.perf.array_rows + 1),
                self.perf.useful_macs.eq(self.perf.useful_macs + st_macs),
            ]
            with m.If(st_count == st_rows - 1):
                m.d.sync += st_busy.eq(0)
        # A MATMUL issued while the last row of the one before is read streams right behind.
        with m.If(issue & (opcode == Opcode.MATMUL)):
            m.d.sync += [
                st_busy.eq(1), st_spad.eq(matmul.spad_addr), st_rows.eq(matmul.rows),
                st_count.eq(0), st_commit.eq(commit_pending), commit_pending.eq(0),
                st_macs.eq(Mux(matmul.k_width == 0, rows, matmul.k_width) *
                           Mux(matmul.n_width == 0, cols, matmul.n_width)),
            ]
        m.d.comb += [
            self.act.valid.eq(act_read),
            self.act.payload.lanes.eq(self.spad.read_data[:8 * rows]),
            self.act.payload.commit.eq(act_commit),
        ]

        # Results leave the array in order: each goes to the oldest MATMUL's next row. The
        # accumulator's write port is the load unit's otherwise (LOAD_ACC waits for a drain).
        with m.If(self.result.valid):
            m.d.comb += [
                self.acc.write_addr.eq(wb_head.acc_addr + out_count),
                self.acc.write_data.eq(self.result.payload),
                self.acc.write_accumulate.eq(wb_head.accumulate),
                self.acc.write_en.eq(1),
            ]
            m.d.sync += out_count.eq(out_count + 1)
            with m.If(out_count == wb_head.rows - 1):
                m.d.comb += wb_pop.eq(1)
                m.d.sync += [out_count.eq(0), wb_head_index.eq(~wb_head_index)]
        with m.Else():
            m.d.comb += [
                self.acc.write_addr.eq(ld_local + ld_count),
                self.acc.write_data.eq(self.read_row.payload),
                self.acc.write_accumulate.eq(0),
                self.acc.write_en.eq(loading & self.read_row.valid &
                                     (ld_op == Opcode.LOAD_ACC)),
            ]

        with m.If(wb_push & ~wb_pop):
            m.d.sync += wb_count.eq(wb_count + 1)
        with m.Elif(wb_pop & ~wb_push):
            m.d.sync += wb_count.eq(wb_count - 1)

        # ------------------------------------------------------------ store unit
        m.d.comb += [
            self.write_cmd.payload.addr.eq(sd_addr),
            self.write_cmd.payload.rows.eq(sd_rows),
            self.write_cmd.payload.row_bytes.eq(sd_row_bytes),
            self.write_cmd.payload.stride.eq(sd_stride),
            self.acc.read_addr.eq(sd_acc + sd_count),
        ]
        assert Requantizer.latency >= 2, "REQUANTIZE and at least one REQUANTIZE_WAIT"
        requant_wait = Signal(range(Requantizer.latency - 1))
        with m.FSM(name="store") as store_fsm:
            with m.State("IDLE"):
                with m.If(sd_start):
                    m.next = "COMMAND"
            with m.State("COMMAND"):
                m.d.comb += self.write_cmd.valid.eq(1)
                with m.If(self.write_cmd.ready):
                    m.next = "READ"
            with m.State("READ"):
                m.d.comb += self.acc.read_en.eq(1)
                with m.If(sd_op == Opcode.STORE_Q):
                    m.next = "REQUANTIZE"
                with m.Else():
                    m.next = "ROW"
            # STORE_Q: the row read in READ goes through the requantizer's pipeline; its
            # result is there Requantizer.latency cycles after REQUANTIZE.
            with m.State("REQUANTIZE"):
                m.d.comb += requant.valid.eq(1)
                m.d.sync += requant_wait.eq(Requantizer.latency - 2)
                m.next = "REQUANTIZE_WAIT"
            with m.State("REQUANTIZE_WAIT"):
                m.d.sync += requant_wait.eq(requant_wait - 1)
                with m.If(requant_wait == 0):
                    m.next = "ROW"
            with m.State("ROW"):
                m.d.comb += self.write_row.valid.eq(1)
                with m.If(sd_op == Opcode.STORE_Q):
                    m.d.comb += self.write_row.payload.eq(requant.result)
                with m.Else():
                    m.d.comb += self.write_row.payload.eq(self.acc.read_data)
                with m.If(self.write_row.ready):
                    m.d.sync += sd_count.eq(sd_count + 1)
                    with m.If(sd_count == sd_rows - 1):
                        m.next = "WAIT"
                    with m.Else():
                        m.next = "READ"
            with m.State("WAIT"):
                with m.If(self.write_done):
                    raise_error(self.write_error, ErrorCode.BUS_WRITE, sd_pc)
                    m.next = "IDLE"
        m.d.comb += sd_busy.eq(~store_fsm.ongoing("IDLE"))

        # ------------------------------------------------------------ start, stop
        all_idle = (~ld_busy & ~wl_busy & array_drained & ~sd_busy & ~reader_busy &
                    ~refetch)

        # The earliest error in program order among the pending one and this cycle's: the
        # lowest pc, the first in this order on a tie (what comparing them one after the
        # other gives). Raises of one pc that follow each other are one candidate, the first
        # of them winning; the candidates' pcs are compared pairwise, side by side, so that
        # the comparisons do not form a chain.
        candidates = [(stopping, stop_code, stop_pc)]
        for condition, code, pc in raises:
            last_valid, last_code, last_pc = candidates[-1]
            if len(candidates) > 1 and pc is last_pc:
                candidates[-1] = (last_valid | condition, Mux(last_valid, last_code, code), pc)
            else:
                candidates.append((condition, code, pc))
        below = {}                  # below[a, b]: pc of a < pc of b, for a > b
        for a, (_, _, pc_a) in enumerate(candidates):
            for b, (_, _, pc_b) in enumerate(candidates[:a]):
                below[a, b] = Signal(name=f"error_pc_below_{a}_{b}")
                m.d.comb += below[a, b].eq(pc_a < pc_b)
        best_valid, best_code, best_pc = 0, 0, 0
        for k, (valid_k, code_k, pc_k) in reversed(list(enumerate(candidates))):
            beaten_by = [candidates[j][0] & ~below[k, j] for j in range(k)]       # pc_j <= pc_k
            beaten_by += [candidates[j][0] & below[j, k] for j in range(k + 1, len(candidates))]
            wins = Signal(name=f"error_candidate_{k}_wins")
            m.d.comb += wins.eq(valid_k & ~Cat(*beaten_by).any())
            best_valid = wins | best_valid
            best_code = Mux(wins, code_k, best_code)
            best_pc = Mux(wins, pc_k, best_pc)
        with m.If(running):
            m.d.sync += [stopping.eq(best_valid), stop_code.eq(best_code),
                         stop_pc.eq(best_pc)]
        with m.If(running & stopping & all_idle):
            m.d.sync += [
                running.eq(0), stopping.eq(0), self.error.eq(1),
                self.error_code.eq(stop_code), self.error_pc.eq(stop_pc),
            ]

        with m.If(~running & self.start):
            m.d.comb += iq_flush.eq(1)
            m.d.sync += [
                self.done.eq(0), self.error.eq(0), self.error_code.eq(0),
                self.error_pc.eq(0), self.pc.eq(0), self.cycles.eq(1),
                fetch_pc.eq(0), fetch_stop.eq(0), refetch.eq(0), stopping.eq(0),
                dec_valid.eq(0),
                self.perf.eq(0),
            ]
            with m.If((self.prog_addr[:4] != 0) | (self.prog_len == 0) |
                      (self.prog_addr + self.prog_len * INSTR_BYTES > (1 << 32))):
                m.d.sync += [self.error.eq(1), self.error_code.eq(ErrorCode.PROGRAM)]
            with m.Else():
                m.d.sync += running.eq(1)

        return m
