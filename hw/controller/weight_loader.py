"""The weight loader: ``PRELOAD``, from the scratchpad's second read port into the array's
shadow weights."""

from amaranth.hdl import Assert, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import ReadPort
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .signatures import CommitSignature, RowRange, UnitSignature, status_copy


__all__ = ["WeightLoader", "WeightStatus"]


class WeightStatus(data.Struct):
    """What the weight loader holds, for the issue stage's hazard checks."""
    busy: 1
    spad: RowRange      #: the scratchpad rows it reads
    follows: 1          #: its ranges take the issue stage's head's at the next edge


class WeightLoader(wiring.Component):
    """Shifts R weight rows into the shadow registers, the last row first, one per cycle.

    The shadow weights of a tile are complete after R rows (``commit.pending``); the next
    ``MATMUL`` commits them. PE(i, j) takes its shadow weight i + j cycles after that
    MATMUL's first row enters the array (:mod:`hw.systolic`), so the next tile waits
    R + C - 1 cycles (``guard``) before it starts to shift.

    Attributes
    ----------
    issue : In(UnitSignature(WeightStatus))
    spad : In(ReadPort.Signature)
        The scratchpad's weight read port.
    weight : Out(stream.Signature(ArrayLayout(signed(8), cols), always_ready=True))
        To the array's shadow weights.
    commit : Out(CommitSignature())
    """
    def __init__(self, config):
        self.config = config
        super().__init__({
            "issue":  In(UnitSignature(WeightStatus)),
            "spad":   In(ReadPort.Signature(addr_width=ceil_log2(config.spad_depth),
                                            shape=8 * config.spad_row_bytes)),
            "weight": Out(stream.Signature(data.ArrayLayout(signed(8), config.cols),
                                           always_ready=True)),
            "commit": Out(CommitSignature()),
        })

    def elaborate(self, platform):
        m = Module()
        rows, cols = self.config.rows, self.config.cols
        cmd, status = self.issue.cmd, self.issue.status

        busy = Signal()
        spad = Signal(RowRange)
        read_addr = Signal.like(self.spad.addr)     # the row read next: last row first
        count = Signal(range(rows + 1))
        pending = Signal()           # shadow weights wait for the next MATMUL
        guard = Signal(range(rows + cols + 1))
        read = Signal()              # a row was read in the cycle before: here in the next
        arrive = Signal()
        m.d.comb += [status.spad.eq(spad), status.follows.eq(~busy),
                     self.commit.pending.eq(pending)]

        # While idle, the registers follow the instruction at the issue stage's head, so
        # that the issue decision enables only ``busy``, not the operands' flip-flops.
        with m.If(~busy):
            m.d.sync += [spad.eq(cmd.payload.spad), read_addr.eq(cmd.payload.spad.hi - 1),
                         count.eq(0)]
        with m.If(cmd.valid):
            m.d.sync += busy.eq(1)

        # ``guard == 0`` kept in a flip-flop beside the count, so that the read's enable
        # (into the scratchpad's block RAM, across the die) waits for no comparison; the
        # address is the register itself (it does not matter while the port is not enabled).
        # ``commit.take`` (a MATMUL's issue) comes late in the cycle: it only chooses between
        # next values formed without it (no enable made of it).
        guard_zero = Signal(init=1)
        fresh = self.commit.take & pending
        m.d.sync += [guard.eq(Mux(fresh, rows + cols - 1, guard - ~guard_zero)),
                     guard_zero.eq(~fresh & (guard_zero | (guard == 1)))]
        m.d.sync += Assert(guard_zero == (guard == 0), "weight loader: guard_zero out of step")

        m.d.sync += [read.eq(0), arrive.eq(read)]
        m.d.comb += [self.spad.en.eq(busy & guard_zero), self.spad.addr.eq(read_addr)]
        with m.If(busy & guard_zero):
            m.d.sync += [read.eq(1), count.eq(count + 1), read_addr.eq(read_addr - 1)]
            with m.If(count == rows - 1):
                m.d.sync += busy.eq(0)
        m.d.sync += pending.eq(~self.commit.take &
                               (pending | (busy & guard_zero & (count == rows - 1))))
        # The issue stage's copy of ``busy``: set as a PRELOAD issues (only while idle),
        # cleared as the last row is read.
        m.d.comb += status.busy.eq(status_copy(
            m, "weights_busy", busy,
            Mux(busy, ~(guard_zero & (count == rows - 1)), cmd.valid)))
        m.d.comb += [
            self.weight.valid.eq(arrive),
            self.weight.payload.eq(self.spad.data[:8 * cols]),
        ]
        return m
