"""Unit tests of :class:`hw.controller.issue.IssueStage`, its units' statuses played as plain
values: start checks, latched program registers, one hazard per row of its table, stall
attribution, START_BUSY, the error arbiter and the stop, soft reset."""

import pytest
from amaranth.hdl import ResetInserter, Signal

from controller_blocks import CONFIG, row_ranges, span
from error_cases import END, load_acc, load_quant, load_spad, matmul, preload, store, store_q
from hw.controller.signatures import KIND_OPCODES
from hw.controller.issue import IssueStage
from hw.isa import ErrorCode, Instruction, Opcode, decode
from sim.amaranth_sim import run_simulation


PROG_ADDR, PROG_LEN = 0x100, 1000
R = CONFIG.rows
IDLE = {
    "load": {}, "weights": {}, "store": {},
    "stream": {"free": 1, "drained": 1},
}
UNIT_OF = {Opcode.LOAD_SPAD: "load", Opcode.LOAD_ACC: "load", Opcode.LOAD_QUANT: "load",
           Opcode.PRELOAD: "weights", Opcode.MATMUL: "stream", Opcode.STORE: "store",
           Opcode.STORE_Q: "store"}
COUNTERS = ("stall_fetch", "stall_load", "stall_store", "stall_array", "instructions")


def set_status(ctx, dut, **statuses):
    """Every unit's status idle, but for ``unit={field: value}`` in ``statuses``; a
    ``fetch`` entry sets ``reader_busy`` and ``refetch``."""
    fetch = statuses.pop("fetch", {})
    for unit, idle in IDLE.items():
        status = {**idle, **statuses.get(unit, {})}
        if unit == "stream" and "in_use_after" not in status:
            # The slots in use stay as they are at the next edge (whether a MATMUL issues).
            in_use = sum(write.get("valid", 0) << i
                         for i, write in enumerate(status.get("writes", [])))
            status["in_use_after"] = [in_use, in_use]
        ctx.set(getattr(dut, unit).status, status)
    ctx.set(dut.fetch.reader_busy, fetch.get("reader_busy", 0))
    ctx.set(dut.fetch.refetch, fetch.get("refetch", 0))


def decoded(word, *, check=0, bus_error=0, lo=0, hi=0):
    """The :class:`~hw.controller.signatures.Decoded` payload of ``word``, with its row ranges
    (:func:`row_ranges`)."""
    spad, acc = row_ranges(word)
    instr = Instruction.from_bits(word)
    kind = {name: int(instr.opcode in [op.value for op in opcodes])
            for name, opcodes in KIND_OPCODES.items()}
    kind["faulty"] = int(bool(check or bus_error))
    return {"instr": instr, "lo": lo, "hi": hi, "spad": spad, "acc": acc,
            "written_spad_hi": spad["hi"] if kind["load_spad"] else 0,
            "read_acc_hi": acc["hi"] if kind["store"] else 0,
            "check": check, "bus_error": bus_error, "kind": kind}


def dram_bytes(word):
    """DRAM bytes ``[lo, hi)`` for ``word`` in the hazard cases: (0, 0) for the kinds that
    touch none, as the decoder gives them."""
    if decode(word)[0] in (Opcode.END, Opcode.PRELOAD, Opcode.MATMUL):
        return 0, 0
    return (0x2000, 0x2006) if word == LOAD_SPAD else (0x10, 0x14)


def set_head(ctx, dut, word, *, valid=1, **fields):
    """The decoder's head: ``word`` (:func:`decoded`), kept at the next edge, with the
    decoder's copies of what it holds (``end_at_head``, ``issuable``)."""
    payload = decoded(word, **fields)
    ctx.set(dut.decoded.payload, payload)
    ctx.set(dut.decoded.valid, valid)
    ctx.set(dut.next_head.load_if_issued, 0)
    ctx.set(dut.next_head.load_if_held, 0)
    ctx.set(dut.next_head.end_at_head, valid and word == END)
    kind = payload["kind"]
    ctx.set(dut.next_head.issuable, {name: int(valid and not kind["faulty"] and kind[name])
                                     for name in KIND_OPCODES})


def load_entry(ctx, dut, entry, *, head_valid):
    """The decoder's front entry ``entry``, which the head takes at the next edge (if it
    issues, or if it holds nothing: ``head_valid`` False)."""
    ctx.set(dut.next_head.entry, entry)
    ctx.set(dut.next_head.load_if_issued, 1)
    ctx.set(dut.next_head.load_if_held, int(not head_valid))


def clear_head(ctx, dut):
    """No head (the decoder's head register empty)."""
    ctx.set(dut.decoded.valid, 0)
    ctx.set(dut.next_head.end_at_head, 0)
    ctx.set(dut.next_head.issuable, {name: 0 for name in KIND_OPCODES})


async def start(ctx, dut, prog_addr=PROG_ADDR, prog_len=PROG_LEN):
    """The host's start, as soon as :class:`hw.host.Host` can pulse it: the program
    registers written (if they change) three cycles before it. Returns ``fetch.begin`` in the
    cycle after the pulse (the run's first), after that cycle's edge."""
    if (ctx.get(dut.host.prog_addr), ctx.get(dut.host.prog_len)) != (prog_addr, prog_len):
        ctx.set(dut.host.prog_addr, prog_addr)
        ctx.set(dut.host.prog_len, prog_len)
        await ctx.tick().repeat(3)
    ctx.set(dut.host.start, 1)
    assert ctx.get(dut.fetch.begin) == 0
    await ctx.tick()
    ctx.set(dut.host.start, 0)
    begin = ctx.get(dut.fetch.begin)
    await ctx.tick()
    return begin


async def issue_preloads(ctx, dut, count):
    """Issue ``count`` instructions that conflict with nothing: ``pc`` moves on by
    ``count``."""
    set_head(ctx, dut, preload(0))
    for _ in range(count):
        assert ctx.get(dut.decoded.ready)
        await ctx.tick()
    clear_head(ctx, dut)


def counters(ctx, dut):
    return {name: ctx.get(getattr(dut.host.perf, name)) for name in COUNTERS}


def simulate(body):
    dut = IssueStage(CONFIG)

    async def testbench(ctx):
        set_status(ctx, dut)
        await body(ctx, dut)

    run_simulation(dut, testbench)


@pytest.mark.parametrize("prog_addr, prog_len, runs", [
    (0x100, 4, True), (0x108, 4, False), (0x100, 0, False), ((1 << 32) - 64, 4, True),
    ((1 << 32) - 64, 5, False), (0xFFFF_FFF0, 0x1000_0000, False)])
def test_start_checks(prog_addr, prog_len, runs):
    """An unaligned address, a length of 0 or a program past 4 GiB end in PROGRAM at once,
    and the stage does not run."""
    async def body(ctx, dut):
        assert ctx.get(dut.host.busy) == 0
        assert await start(ctx, dut, prog_addr, prog_len) == 1      # fetch.begin
        for _ in range(2):
            assert ctx.get(dut.host.busy) == runs
            assert ctx.get(dut.fetch.enable) == runs
            assert ctx.get(dut.host.error) == (not runs)
            assert ctx.get(dut.host.error_code) == (0 if runs else ErrorCode.PROGRAM.value)
            assert (ctx.get(dut.host.error_pc), ctx.get(dut.host.pc)) == (0, 0)
            await ctx.tick()
    simulate(body)


@pytest.mark.parametrize("wait", [0, 1, 2])
def test_program_registers_changed_with_a_start(wait):
    """Program registers that change in the cycle of a start (the host's change three cycles
    before at the soonest) stop the simulation: the stage's check of its copies would not
    hold them yet. A cycle before is enough."""
    async def body(ctx, dut):
        ctx.set(dut.host.prog_len, 5)
        for _ in range(wait):
            await ctx.tick()
        ctx.set(dut.host.start, 1)
        await ctx.tick()
        ctx.set(dut.host.start, 0)
        await ctx.tick()
        assert (ctx.get(dut.host.busy), ctx.get(dut.fetch.prog_len)) == (1, 5)
    if wait == 0:
        with pytest.raises(AssertionError, match="changed in the cycle of a start"):
            simulate(body)
    else:
        simulate(body)


def test_program_registers_latched_at_start():
    """The fetcher takes the program in the cycle of ``begin`` (and keeps it:
    tb/test_fetcher.py's ``registers_moved``); the stage keeps the length for the check of
    the program's end: a host write of PROG_LEN during the run changes neither."""
    async def body(ctx, dut):
        ctx.set(dut.host.prog_addr, 0x200)
        ctx.set(dut.host.prog_len, 3)
        await ctx.tick().repeat(3)
        ctx.set(dut.host.start, 1)
        await ctx.tick()
        ctx.set(dut.host.start, 0)
        assert (ctx.get(dut.fetch.begin), ctx.get(dut.fetch.prog_addr),
                ctx.get(dut.fetch.prog_len)) == (1, 0x200, 3)
        await ctx.tick()
        ctx.set(dut.host.prog_addr, 0x400)
        ctx.set(dut.host.prog_len, 9)
        await issue_preloads(ctx, dut, 3)
        set_head(ctx, dut, preload(0))         # past the program's end: not issued
        assert ctx.get(dut.decoded.ready) == 0
        await ctx.tick().repeat(2)
        clear_head(ctx, dut)
        assert (ctx.get(dut.host.error), ctx.get(dut.host.error_code),
                ctx.get(dut.host.error_pc)) == (1, ErrorCode.PROGRAM.value, 3)
        await start(ctx, dut)          # now the registers are 0x100 and 1000
        assert (ctx.get(dut.fetch.prog_addr), ctx.get(dut.fetch.prog_len)) == (0x100, 1000)
    simulate(body)


LOAD_SPAD = load_spad(4, 2, 3, 0x2000, 3)          # spad [4, 6), DRAM [0x2000, 0x2006)
MATMUL = matmul(4, 2, 3, 0)                        # spad [4, 7), acc [2, 5)
STORE = store(2, 3, 8, 0x3000, 8)                  # acc [2, 5)
# The units' rows as RowRange values: span(first, rows) is [first, first + rows).
WRITES = lambda first, second: {"writes": [first, second]}   # noqa: E731


def UNSEEN(stage, row):
    """The streamer's status with one accumulator write of ``row`` in flight, in ``stage``
    (0: accepted in the cycle before, 1: two cycles before) when checked (``then``), a
    stage earlier in the cycle before (``writing`` for stage 0), earlier still in the
    cycles before that (``lead``), a stage later in the cycle after (``after``): the write
    moves down the pipeline as in the accumulator (the issue stage keeps copies of the
    stages' valid flags, asserted equal). Every address is ``row``."""
    def status(where):
        unseen = [{"valid": int(i == where), "addr": row} for i in range(2)]
        return {"drained": 0, "unseen": unseen, "writing": {"valid": int(where < 0),
                                                            "addr": row}}
    return {"lead": [{"stream": status(where)} for where in range(-1, stage - 1)],
            "stream": status(stage - 1), "then": {"stream": status(stage)},
            "after": {"stream": status(stage + 1)}}
# (word, statuses, the blocker: None when it issues, or the counter that counts the stall)
HAZARDS = [
    (END, {}, None), (END, {"load": {"busy": 1}}, "load"),
    (END, {"fetch": {"reader_busy": 1}}, "load"), (END, {"weights": {"busy": 1}}, "array"),
    (END, {"stream": {"drained": 0}}, "array"), (END, {"store": {"busy": 1}}, "store"),
    (END, {"load": {"busy": 1}, "store": {"busy": 1}, "weights": {"busy": 1}}, "load"),
    (END, {"store": {"busy": 1}, "stream": {"drained": 0}}, "store"),
    (LOAD_SPAD, {"load": {"busy": 1}}, "load"),
    (LOAD_SPAD, {"stream": {"busy": 1, "free": 0, "spad": span(6, 2)}}, None),
    (LOAD_SPAD, {"stream": {"busy": 1, "free": 0, "spad": span(5, 2)}}, "array"),
    (LOAD_SPAD, {"stream": {"busy": 0, "spad": span(5, 2)}}, None),
    (LOAD_SPAD, {"weights": {"busy": 1, "spad": span(6, R)}}, None),
    (LOAD_SPAD, {"weights": {"busy": 1, "spad": span(3, R)}}, "array"),
    (LOAD_SPAD, {"weights": {"busy": 1, "spad": span(2, R)}}, None),
    (LOAD_SPAD, {"store": {"busy": 1, "lo": 0x2006, "hi": 0x2100}}, None),
    (LOAD_SPAD, {"store": {"busy": 1, "lo": 0x1F00, "hi": 0x2000}}, None),
    (LOAD_SPAD, {"store": {"busy": 1, "lo": 0x1F00, "hi": 0x2001}}, "store"),
    (LOAD_SPAD, {"store": {"busy": 1, "lo": 0x2005, "hi": 0x2100}}, "store"),
    (LOAD_SPAD, {"store": {"busy": 0, "lo": 0x1F00, "hi": 0x2100}}, None),
    (load_acc(0, 1, 4, 0x10, 4), {"load": {"busy": 1}}, "load"),
    (load_acc(0, 1, 4, 0x10, 4), {"stream": {"drained": 0}}, "array"),
    (load_acc(0, 1, 4, 0x10, 4), {"store": {"busy": 1, "lo": 0x9000, "hi": 0x9010}}, "store"),
    (load_quant(4), {"load": {"busy": 1}}, "load"),
    (load_quant(4), {"store": {"busy": 1}}, "store"),
    (load_quant(4), {"weights": {"busy": 1}, "stream": {"drained": 0, "busy": 1}}, None),
    (preload(4), {"load": {"busy": 1, "to_spad": 1, "spad": span(6, 2)}}, None),
    (preload(4), {"load": {"busy": 1, "to_spad": 1, "spad": span(5, 1)}}, "load"),
    (preload(4), {"load": {"busy": 1, "to_spad": 1, "spad": span(3, 2)}}, "load"),
    (preload(4), {"load": {"busy": 1, "to_spad": 1, "spad": span(2, 2)}}, None),
    (preload(4), {"load": {"busy": 1, "to_acc": 1, "spad": span(4, 2)}}, None),
    (preload(4), {"weights": {"busy": 1}}, "array"),
    (preload(4), {"store": {"busy": 1}, "stream": {"busy": 1, "drained": 0}}, None),
    (MATMUL, {"load": {"busy": 1, "to_acc": 1, "spad": span(7, 0)}}, "load"),
    (MATMUL, {"load": {"busy": 1, "to_spad": 1, "spad": span(7, 2)}}, None),
    (MATMUL, {"load": {"busy": 1, "to_spad": 1, "spad": span(6, 1)}}, "load"),
    (MATMUL, {"stream": {"free": 0, "busy": 1}}, "array"),
    (MATMUL, {"stream": {"full": 1}}, "array"),
    (MATMUL, {"weights": {"busy": 1}}, "array"),
    (MATMUL, {"stream": {"busy": 1, "drained": 0}}, None),    # free: streams right behind
    (MATMUL, {"store": {"busy": 1, "acc": span(5, 3)}}, None),
    (MATMUL, {"store": {"busy": 1, "acc": span(4, 1)}}, "store"),
    (MATMUL, {"store": {"busy": 0, "acc": span(4, 1)}}, None),
    (STORE, {"load": {"busy": 1}}, "load"),
    (STORE, {"store": {"busy": 1}}, "store"),
    (STORE, {"stream": WRITES({"valid": 1, "acc": span(5, 2), "rows": 2}, {})}, None),
    (STORE, {"stream": WRITES({}, {"valid": 1, "acc": span(4, 1), "rows": 1})}, "array"),
    (STORE, {"stream": WRITES({"valid": 1, "acc": span(0, 3), "rows": 3}, {})}, "array"),
    (STORE, {"stream": WRITES({"valid": 0, "acc": span(2, 3), "rows": 3}, {})}, None),
    (store_q(2, 3, 3, 0x3000, 3), {"stream": WRITES({}, {"valid": 1, "acc": span(1, 2),
                                                          "rows": 2})}, "array"),
    (store_q(2, 3, 3, 0x3000, 3), {"stream": {"busy": 1, "drained": 0}}, None),
    # An accumulator write in flight that the store's first read would miss, in its rows
    # [2, 5) (the statuses hold in the cycle before too, so ``writing`` is the next s1).
    (STORE, UNSEEN(0, 4), "array"), (STORE, UNSEEN(1, 2), "array"),
    (store_q(2, 3, 3, 0x3000, 3), UNSEEN(0, 3), "array"),
    (STORE, UNSEEN(0, 5), None), (STORE, UNSEEN(1, 1), None),
    (MATMUL, UNSEEN(0, 4), None),
]


def test_hazards():
    """Each row of the hazard table in both ways (overlapping by one row or byte, or just
    apart); a blocked instruction counts one stall in the counter of its first blocker (load
    before store before array); an issued one goes to its unit alone with its pc, lo, hi and
    row ranges.

    The comparisons are registered a cycle ahead: each case's statuses are set a cycle
    before its check, with the head either already there (even cases) or loaded from the
    decoder's ``next_head`` at that edge (odd cases, over an instruction it never
    compares with)."""
    async def body(ctx, dut):
        await start(ctx, dut)
        for index, (word, statuses, blocker) in enumerate(HAZARDS):
            context = f"case {index}: {decode(word)[0].name} {statuses}"
            then, after = statuses.get("then", {}), statuses.get("after", {})
            for lead in statuses.get("lead", []):      # with no head to issue
                set_status(ctx, dut, **{unit: dict(fields) for unit, fields in lead.items()})
                set_head(ctx, dut, END, valid=0)
                await ctx.tick()
            set_status(ctx, dut, **{unit: dict(fields) for unit, fields in statuses.items()
                                    if unit not in ("lead", "then", "after")})
            lo, hi = dram_bytes(word)
            if index % 2:
                set_head(ctx, dut, END, valid=0)
                load_entry(ctx, dut, decoded(word, lo=lo, hi=hi), head_valid=False)
            else:
                set_head(ctx, dut, word, lo=lo, hi=hi, valid=0)
            await ctx.tick()
            if then:
                set_status(ctx, dut, **{unit: dict(fields) for unit, fields in then.items()})
            set_head(ctx, dut, word, lo=lo, hi=hi)
            pc = ctx.get(dut.host.pc)
            assert ctx.get(dut.decoded.ready) == (blocker is None), context
            for unit in IDLE:
                expected = blocker is None and UNIT_OF.get(decode(word)[0]) == unit
                assert ctx.get(getattr(dut, unit).cmd.valid) == expected, f"{context}: {unit}"
                if expected:
                    payload = ctx.get(getattr(dut, unit).cmd.payload)
                    spad, acc = row_ranges(word)
                    assert (payload.instr.as_bits(), payload.pc, payload.lo, payload.hi,
                            (payload.spad.lo, payload.spad.hi),
                            (payload.acc.lo, payload.acc.hi)) == \
                        (word, pc, lo, hi, (spad["lo"], spad["hi"]),
                         (acc["lo"], acc["hi"])), context
            await ctx.tick()
            # The counters count a cycle late: the case's count comes at the next edge, in
            # a cycle with no head to issue (and for the write to move on).
            before = counters(ctx, dut)
            if after:
                set_status(ctx, dut, **{unit: dict(fields) for unit, fields in after.items()})
            set_head(ctx, dut, END, valid=0)
            await ctx.tick()
            delta = {k: v - before[k] for k, v in counters(ctx, dut).items() if v != before[k]}
            assert delta == ({"instructions": 1} if blocker is None
                             else {f"stall_{blocker}": 1}), context
            if blocker is None and word == END:
                assert ctx.get(dut.host.done) == 1, context
                await start(ctx, dut)
    simulate(body)


# (unit, its statuses in the cycle of the first instruction's issue and after, the first
# instruction, the second, the counter of the second's stall)
JUST_BEFORE = [
    ("stream", ({"free": 1, "follows": 1, "spad": span(12, 2)},
                {"busy": 1, "drained": 0, "spad": span(4, 3)}), MATMUL, LOAD_SPAD, "array"),
    ("weights", ({"follows": 1, "spad": span(12, R)}, {"busy": 1, "spad": span(4, R)}),
     preload(4), LOAD_SPAD, "array"),
    ("load", ({"follows": 1, "spad": span(12, 2)}, {"busy": 1, "to_spad": 1,
                                                    "spad": span(4, 2)}),
     LOAD_SPAD, preload(5), "load"),
    ("store", ({"follows": 1, "acc": span(12, 1)}, {"busy": 1, "acc": span(2, 3)}),
     STORE, MATMUL, "store"),
    ("store", ({"follows": 1, "lo": 0x9000, "hi": 0x9010}, {"busy": 1, "lo": 0x2000,
                                                            "hi": 0x2006}),
     STORE, LOAD_SPAD, "store"),
    # The MATMUL goes to the slot that follows the head (in use from the next edge if it
    # issues: ``in_use_after`` [held, issued]).
    ("stream", ({"free": 1, "follows": 1, "slot_follows": 1, "in_use_after": [0, 1]},
                {"busy": 1, "drained": 0, "writes": [{"valid": 1, "acc": span(2, 3),
                                                      "rows": 3}, {}]}),
     MATMUL, STORE, "array"),
]


@pytest.mark.parametrize("unit, statuses, first, second, blocker", JUST_BEFORE)
def test_hazard_with_the_instruction_issued_just_before(unit, statuses, first, second,
                                                        blocker):
    """A unit that follows the head takes the rows of the instruction issued in that cycle:
    the comparison made a cycle ahead uses those (the head's), not the unit's rows of that
    cycle, so an instruction over them right behind waits (for each kind of hazard flag)."""
    lo, hi = dram_bytes(second)

    async def body(ctx, dut):
        await start(ctx, dut)
        set_status(ctx, dut, **{unit: statuses[0]})
        set_head(ctx, dut, first, lo=lo, hi=hi)           # (a store's DRAM bytes the second's)
        load_entry(ctx, dut, decoded(second, lo=lo, hi=hi), head_valid=True)
        assert ctx.get(getattr(dut, unit).cmd.valid) == 1
        await ctx.tick()
        set_status(ctx, dut, **{unit: statuses[1]})
        set_head(ctx, dut, second, lo=lo, hi=hi)
        assert ctx.get(dut.decoded.ready) == 0
        await ctx.tick()
        before = counters(ctx, dut)[f"stall_{blocker}"]     # the stall counts a cycle late
        await ctx.tick()
        assert counters(ctx, dut)[f"stall_{blocker}"] == before + 1
    simulate(body)


def test_counters_and_refetch():
    """No head: a fetch stall a cycle; while ``refetch`` nothing issues or counts; a busy
    streamer counts its rows and their useful MACs; ``cycles`` counts from 1 at start."""
    async def body(ctx, dut):
        await start(ctx, dut)
        await ctx.tick().repeat(4)
        set_status(ctx, dut, fetch={"refetch": 1}, stream={"busy": 1, "macs": 6})
        set_head(ctx, dut, preload(0))
        assert ctx.get(dut.decoded.ready) == 0
        await ctx.tick().repeat(3)
        assert counters(ctx, dut) == {"stall_fetch": 4, "stall_load": 0, "stall_store": 0,
                                      "stall_array": 0, "instructions": 0}
        assert ctx.get(dut.host.perf.array_rows) == 3
        assert ctx.get(dut.host.perf.useful_macs) == 18
        assert ctx.get(dut.host.cycles) == 8
    simulate(body)


def test_start_while_busy():
    """A start while running: the heads of its cycle and the next (in which the stage sees
    it) still issue, the one after does not; START_BUSY at its pc once idle; the fetcher is
    not told to begin (it keeps the program it took at the first start)."""
    async def body(ctx, dut):
        await start(ctx, dut, 0x200, 50)
        await issue_preloads(ctx, dut, 3)
        set_head(ctx, dut, preload(0))
        ctx.set(dut.host.prog_addr, 0x800)
        assert await start(ctx, dut, 0x800, 50) == 0                # no fetch.begin
        assert (ctx.get(dut.host.pc), ctx.get(dut.decoded.ready)) == (5, 0)
        assert ctx.get(dut.fetch.enable) == 1
        await ctx.tick()
        assert ctx.get(dut.fetch.enable) == 0                       # stopping
        assert (ctx.get(dut.host.busy), ctx.get(dut.host.error)) == (1, 0)
        await ctx.tick()
        assert (ctx.get(dut.host.busy), ctx.get(dut.host.error)) == (0, 1)
        assert ctx.get(dut.host.error_code) == ErrorCode.START_BUSY.value
        assert ctx.get(dut.host.error_pc) == 5
        assert ctx.get(dut.fetch.begin) == 0
    simulate(body)


C = ErrorCode
# Faults by cycle at pc 5 (the issue stage's: the head's check) and from the load and store
# units ((code, pc)), while both units are busy; then the error the program stops with.
# Instructions 0-4 issued before are preloads, but a load and a store at the units' pcs:
# the arbiter orders the units by which was issued last.
ARBITER = [
    ("lowest_pc_load", [{"issue": C.SPAD_RANGE, "load": (C.BUS_READ, 3),
                         "store": (C.BUS_WRITE, 4)}], (C.BUS_READ, 3)),
    ("lowest_pc_store", [{"issue": C.ACC_RANGE, "load": (C.QUANT, 4),
                          "store": (C.BUS_WRITE, 2)}], (C.BUS_WRITE, 2)),
    ("issue_alone", [{"issue": C.ACC_RANGE}], (C.ACC_RANGE, 5)),
    # A unit's instruction is older than the head's (its pc is lower: the stage asserts
    # it), so the stage's own fault loses to any unit's.
    ("store_before_issue", [{"issue": C.DRAM_RANGE, "store": (C.BUS_WRITE, 4)}],
     (C.BUS_WRITE, 4)),
    ("pending_issue_beaten", [{"issue": C.DRAM_RANGE}, {"store": (C.BUS_WRITE, 1)}],
     (C.BUS_WRITE, 1)),
    ("pending_beaten", [{"store": (C.BUS_WRITE, 4)}, {}, {"load": (C.QUANT, 2)}],
     (C.QUANT, 2)),
    ("pending_kept", [{"load": (C.BUS_READ, 3)}, {"store": (C.BUS_WRITE, 4)}],
     (C.BUS_READ, 3)),
    ("pending_store_kept", [{"store": (C.BUS_WRITE, 1)}, {"load": (C.BUS_READ, 3)}],
     (C.BUS_WRITE, 1)),
    ("pending_wins_tie", [{"store": (C.BUS_WRITE, 3)}, {"store": (C.QUANT, 3)}],
     (C.BUS_WRITE, 3)),
]


@pytest.mark.parametrize("name, cycles, expected", ARBITER, ids=[a[0] for a in ARBITER])
def test_error_arbiter(name, cycles, expected, issued=None):
    """``issued``: {pc: unit} issued before, if not at the pcs of the units' faults."""
    if issued is None:
        issued = {fault[1]: unit for faults in cycles for unit, fault in faults.items()
                  if unit != "issue"}
    words = {"load": load_spad(0, 1, 4, 0x1000, 4), "store": store(0, 1, 4, 0x2000, 4)}

    async def body(ctx, dut):
        await start(ctx, dut)
        for pc in range(5):
            word = words[issued[pc]] if pc in issued else preload(0)
            set_head(ctx, dut, word)
            assert ctx.get(dut.decoded.ready) and ctx.get(dut.host.pc) == pc, name
            await ctx.tick()
        for faults in cycles:
            set_status(ctx, dut, load={"busy": 1}, store={"busy": 1})
            set_head(ctx, dut, preload(0), check=faults.get("issue", C.NONE).value,
                     valid="issue" in faults)
            for unit in ("load", "store"):
                code, pc = faults.get(unit, (C.NONE, 0))
                ctx.set(getattr(dut, unit).fault, {"valid": unit in faults,
                                                   "code": code.value, "pc": pc})
            await ctx.tick()
            ctx.set(dut.load.fault.valid, 0)
            ctx.set(dut.store.fault.valid, 0)
            clear_head(ctx, dut)
            assert (ctx.get(dut.host.busy), ctx.get(dut.fetch.enable)) == (1, 0), name
        set_status(ctx, dut)
        await ctx.tick()
        assert ctx.get(dut.host.error) == 1 and ctx.get(dut.host.busy) == 0, name
        assert (C(ctx.get(dut.host.error_code)), ctx.get(dut.host.error_pc)) == expected
    simulate(body)


@pytest.mark.parametrize("name, faults, issued, message", [
    # No program makes these: the arbiter orders by issue, and asserts that the pcs agree.
    ("store_at_the_head", {"issue": C.DRAM_RANGE, "store": (C.BUS_WRITE, 5)}, {}, "3 and 1"),
    ("store_not_the_one_issued", {"load": (C.BUS_READ, 3), "store": (C.BUS_WRITE, 2)},
     {2: "load", 3: "store"}, "3 and 2"),
])
def test_error_arbiter_asserts_the_order(name, faults, issued, message):
    """A fault whose pc does not match the order of issue (a unit's at the head's pc, a
    store older than the load issued before it) fails the stage's assertion rather than
    passing unnoticed."""
    with pytest.raises(AssertionError, match=f"error candidates {message} out of order"):
        test_error_arbiter(name, [faults], None, issued)


@pytest.mark.parametrize("holding", [
    {"load": {"busy": 1}}, {"weights": {"busy": 1}}, {"stream": {"drained": 0}},
    {"store": {"busy": 1}}, {"fetch": {"reader_busy": 1}}, {"fetch": {"refetch": 1}}])
def test_stops_only_when_idle(holding):
    """A fault of the head (bus error, before its check) stops the program only in the
    cycle after the last unit went idle."""
    async def body(ctx, dut):
        await start(ctx, dut)
        await issue_preloads(ctx, dut, 2)
        set_head(ctx, dut, preload(0), bus_error=1, check=C.SPAD_RANGE.value)
        await ctx.tick()
        clear_head(ctx, dut)
        set_status(ctx, dut, **holding)
        for _ in range(5):
            await ctx.tick()
            assert (ctx.get(dut.host.busy), ctx.get(dut.host.error)) == (1, 0)
        set_status(ctx, dut)
        await ctx.tick()
        assert (ctx.get(dut.host.busy), ctx.get(dut.host.error)) == (0, 1)
        assert (C(ctx.get(dut.host.error_code)), ctx.get(dut.host.error_pc)) == (C.BUS_READ, 2)
    simulate(body)


def test_program_without_end():
    async def body(ctx, dut):
        await start(ctx, dut, PROG_ADDR, 2)
        await issue_preloads(ctx, dut, 2)
        set_head(ctx, dut, preload(0))
        assert ctx.get(dut.decoded.ready) == 0
        await ctx.tick().repeat(2)
        assert (C(ctx.get(dut.host.error_code)), ctx.get(dut.host.error_pc)) == (C.PROGRAM, 2)
    simulate(body)


def test_soft_reset():
    """A soft reset makes the stage busy and halts the fetcher and the store unit; a start
    then is ignored."""
    async def body(ctx, dut):
        ctx.set(dut.host.soft_reset, 1)
        await ctx.tick()
        ctx.set(dut.host.soft_reset, 0)
        for _ in range(3):
            assert ctx.get(dut.soft_reset_pending) == 1 and ctx.get(dut.host.busy) == 1
            assert ctx.get(dut.store.halt) == 1 and ctx.get(dut.fetch.halt) == 1
            await ctx.tick()
        assert await start(ctx, dut, 0x300, 4) == 0
        await ctx.tick()
        assert (ctx.get(dut.fetch.enable), ctx.get(dut.fetch.begin), ctx.get(dut.host.error),
                ctx.get(dut.host.done)) == (0, 0, 0, 0)
    simulate(body)


def test_counters_clear_after_a_reset():
    """The core reset clears the cycle and performance counters: in the cycle after it, from
    the stage's own flip-flop (``core_reset_counters``), so they read 0 from the second
    cycle after it on."""
    dut = IssueStage(CONFIG)
    reset = Signal()

    async def testbench(ctx):
        set_status(ctx, dut)
        await start(ctx, dut)
        await issue_preloads(ctx, dut, 3)
        set_head(ctx, dut, END, valid=0)
        await ctx.tick()
        assert ctx.get(dut.host.perf.instructions) == 3 and ctx.get(dut.host.cycles) == 5
        await ctx.tick()                 # that cycle's stall counts a cycle late
        assert ctx.get(dut.host.perf.stall_fetch) == 1 and ctx.get(dut.host.cycles) == 6
        ctx.set(reset, 1)
        await ctx.tick()
        ctx.set(reset, 0)
        await ctx.tick()
        for _ in range(3):
            assert ctx.get(dut.host.cycles) == 0
            assert ctx.get(dut.host.perf.as_value()) == 0
            await ctx.tick()

    run_simulation(ResetInserter(reset)(dut), testbench)


def test_no_fetch_with_end_at_the_head():
    """Fetching is enabled while the program runs, but not once END is at the head (the
    decoder's flag), even while END waits for a unit: it is the program's last word."""
    async def body(ctx, dut):
        await start(ctx, dut)
        await issue_preloads(ctx, dut, 2)
        assert ctx.get(dut.fetch.enable) == 1
        set_status(ctx, dut, load={"busy": 1})
        set_head(ctx, dut, END)
        for _ in range(3):
            assert (ctx.get(dut.fetch.enable), ctx.get(dut.decoded.ready)) == (0, 0)
            await ctx.tick()
        set_status(ctx, dut)
        assert ctx.get(dut.decoded.ready) == 1
        await ctx.tick()
        assert (ctx.get(dut.host.done), ctx.get(dut.fetch.enable)) == (1, 0)
    simulate(body)
