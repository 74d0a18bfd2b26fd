"""Unit tests of :class:`hw.controller.fetcher.Fetcher`: batches of ``FETCH_BURST``
instructions, the high and low water rules, sharing the DMA reader with the load unit,
failed fetches, halt, the refetch after a store over the program, and its queue assertion;
the decoder's side (its stage, queue, head register and ``taken``) is played by the bench."""

from collections import deque

import pytest

from controller_blocks import CONFIG, READ_ROW_BYTES, command_of
from hw.config import FETCH_BURST, FETCH_DEPTH, FETCH_HIGH_WATER, FETCH_LOW_WATER
from hw.controller.fetcher import Fetcher
from hw.dma import row_beats
from hw.isa import INSTR_BYTES
from sim.amaranth_sim import run_simulation


PROG_ADDR = 0x1000
LOAD_CMD = (0x4000, 3, 5, 7)
LOAD_BEATS = row_beats(CONFIG.bus_bytes, LOAD_CMD[0], LOAD_CMD[2])
LOAD_EXTRA = {"beats": LOAD_BEATS, "next_addr": LOAD_CMD[0] + LOAD_CMD[3]}


def word_at(addr):
    """The DRAM word at ``addr``: distinct for every address, never zero."""
    return ((addr * 0x9E37_79B9_7F4A_7C15) | 1) & ((1 << 128) - 1)


class Bench:
    """Plays the DMA reader (``latency`` cycles from a command to its first row, a row a
    cycle, ``done`` with the last row), the decoder and the issue stage around a fetcher, one
    cycle per :meth:`step`, keeping what the fetcher did and the count of words it must hold.

    The decoder is modelled as :mod:`hw.controller.decoder` builds it: a word on
    ``words.word`` in cycle t is in the queue from t + 2; it leaves the queue (``taken``)
    when the head register is empty or its word is popped (by the issue stage) in that
    cycle, and is the head from the next cycle; ``flush`` drops the stage, the queue and the
    head. ``held`` is what the fetcher counts: the words delivered by the reader (or their
    error entries) not yet ``taken``; the head register's word is not among them.

    ``fail_after`` (``load_fail_after``): the next fetch (load) command ends in a bus error
    after that many rows.
    ``extra_rows``: a broken reader that delivers more rows than asked.
    """
    def __init__(self, ctx, dut, *, prog_len, latency=2, extra_rows=0):
        self.ctx, self.dut = ctx, dut
        self.latency, self.extra_rows = latency, extra_rows
        self.busy = None             # [addr, rows, stride, delivered, wait, is_load, fail]
        self.fail_after = self.load_fail_after = None
        self.commands = []           # (cycle, (addr, rows, row_bytes, stride), is_load)
        self.popped, self.load_rows, self.cycle = [], [], 0
        self.held = self.fetch_pc = 0
        self.word = None             # the word the fetcher must put on ``words.word`` now
        self.pipeline = deque()      # (cycle on ``words.word``, word): the stage and the queue
        self.head = None             # the decoder's head register
        self.ready_from = 0          # the reader refuses commands before this cycle
        ctx.set(dut.control.prog_addr, PROG_ADDR)
        ctx.set(dut.control.prog_len, prog_len)
        ctx.set(dut.control.enable, 1)

    async def step(self, *, pop=False):
        """One cycle, the issue stage popping the head if ``pop``; returns
        ``reader.cmd.valid`` and ``flush`` of this cycle."""
        ctx, dut, busy = self.ctx, self.dut, self.busy
        row = done = error = False
        if busy is not None and busy[4] == 0:
            rows = busy[1] + (0 if busy[5] else self.extra_rows)
            if busy[6] is not None and busy[3] == busy[6]:
                done = error = True
            else:
                row, done = True, busy[3] == rows - 1
        ctx.set(dut.reader.cmd.ready, busy is None and self.cycle >= self.ready_from)
        ctx.set(dut.reader.row.valid, row)
        if row:
            ctx.set(dut.reader.row.payload, word_at(busy[0] + busy[3] * busy[2]))
        ctx.set(dut.reader.done, done)
        ctx.set(dut.reader.error, error)
        if pop:
            assert self.head is not None, f"cycle {self.cycle}: pop from an empty queue"
            self.popped.append(self.head)
        take = (bool(self.pipeline) and self.pipeline[0][0] <= self.cycle - 2 and
                (self.head is None or pop))
        ctx.set(dut.words.taken, take)
        cmd_valid, flush = ctx.get(dut.reader.cmd.valid), ctx.get(dut.words.flush)
        is_load = ctx.get(dut.load.cmd.ready) == 1
        command = command_of(ctx, dut.reader.cmd)
        if cmd_valid:        # a fetch's beats from the fetcher, a load's from the load unit
            assert ctx.get(dut.reader.cmd.payload.beats) == row_beats(
                CONFIG.bus_bytes, command[0], command[2]), f"cycle {self.cycle}"
            assert ctx.get(dut.reader.cmd.payload.next_addr) == command[0] + command[3], \
                f"cycle {self.cycle}"
        assert ctx.get(dut.load.row.valid) == (row and busy[5]), f"cycle {self.cycle}"
        assert ctx.get(dut.load.done) == (done and busy[5]), f"cycle {self.cycle}"
        assert ctx.get(dut.load.error) == error, f"cycle {self.cycle}"
        if row and busy[5]:
            self.load_rows.append(ctx.get(dut.load.row.payload))
        # Each fetched row (or error entry) on ``words.word`` in the next cycle, once.
        word_valid = ctx.get(dut.words.word.valid)
        assert word_valid == (self.word is not None), f"cycle {self.cycle}: words.word"
        if word_valid:
            payload = ctx.get(dut.words.word.payload)
            word = (payload.instr.as_bits(), payload.bus_error)
            assert word[1] == self.word[1] and (word[1] or word == self.word), \
                f"cycle {self.cycle}: {word} for {self.word}"
        await ctx.tick()
        self.cycle += 1
        fetched = (row or error) and not busy[5]
        if flush:
            self.held, self.word = 0, None
            self.pipeline.clear()
            self.head = None
        else:
            self.held += fetched - take
            assert self.held <= FETCH_DEPTH, f"cycle {self.cycle - 1}: held {self.held}"
            if take:
                self.head = self.pipeline.popleft()[1]
            elif pop:
                self.head = None
            if word_valid:
                self.pipeline.append((self.cycle - 1, word))
            self.word = None
            if fetched:
                self.word = ((word_at(busy[0] + busy[3] * busy[2]), 0) if row
                             else (None, 1))
        if busy is not None:
            busy[3] += row
            busy[4] = max(busy[4] - 1, 0)
            if done:
                self.busy = None
        if cmd_valid and ctx.get(dut.reader.cmd.ready):
            self.commands.append((self.cycle - 1, command, is_load))
            self.busy = [command[0], command[1], command[3], 0, self.latency, is_load,
                         self.load_fail_after if is_load else self.fail_after]
        return cmd_valid, flush

    async def run(self, cycles, **kwargs):
        for _ in range(cycles):
            await self.step(**kwargs)

    def empty(self):
        """Nothing on ``words.word``, none held, nothing in the decoder."""
        return (self.ctx.get(self.dut.words.word.valid) == 0 and self.held == 0 and
                not self.pipeline and self.head is None)

    def popped_words(self):
        return list(self.popped)


def fetch_cmd(first, rows):
    return (PROG_ADDR + first * INSTR_BYTES, rows, INSTR_BYTES, INSTR_BYTES)


def program(first, count):
    return [(word_at(PROG_ADDR + i * INSTR_BYTES), 0) for i in range(first, first + count)]


def simulate(body, *, prog_len, **kwargs):
    dut = Fetcher(read_row_bytes=READ_ROW_BYTES, bus_bytes=CONFIG.bus_bytes)

    async def testbench(ctx):
        bench = Bench(ctx, dut, prog_len=prog_len, **kwargs)
        ctx.set(dut.control.begin, 1)
        ctx.set(dut.control.enable, 0)
        await bench.step()
        ctx.set(dut.control.begin, 0)
        ctx.set(dut.control.enable, 1)
        await body(ctx, dut, bench)

    run_simulation(dut, testbench)


def test_batches_and_high_water():
    """A batch is asked for exactly while the reader is idle and the fetcher holds at most
    FETCH_HIGH_WATER words; the last batch is the rest of the program."""
    async def body(ctx, dut, bench):
        for cycle in range(80):
            pop = cycle >= 30 and bench.head is not None
            asked = sum(command[1] for _, command, _ in bench.commands)
            wants = bench.busy is None and asked < 20 and bench.held <= FETCH_HIGH_WATER
            cmd_valid, _ = await bench.step(pop=pop)
            assert cmd_valid == wants, f"cycle {bench.cycle - 1}: held {bench.held}"
        # Rows come 3 cycles after a command; the first word leaves the count for the
        # decoder's head register in cycle 7, so 7 are held after the first batch and 15
        # after the second; the 7th pop (from cycle 31 on) leaves 8 held.
        assert [(c, cmd) for c, cmd, _ in bench.commands] == [
            (1, fetch_cmd(0, 8)), (12, fetch_cmd(8, 8)), (38, fetch_cmd(16, 4))]
        assert bench.popped_words() == program(0, 20)
        assert bench.empty()
    assert FETCH_DEPTH == 16 and FETCH_BURST == 8 and FETCH_HIGH_WATER == 8
    simulate(body, prog_len=20)


async def fill_one_batch(ctx, dut, bench):
    """One batch into the decoder, fetching off after its command: its first word in the
    head register, the other FETCH_BURST - 1 held."""
    await bench.step()
    ctx.set(dut.control.enable, 0)
    await bench.run(12)
    assert bench.held == FETCH_BURST - 1 and bench.head is not None and bench.busy is None


@pytest.mark.parametrize("level", [FETCH_LOW_WATER, FETCH_LOW_WATER - 1])
def test_arbitration_with_load(level):
    """The load unit's command goes first unless the fetcher holds fewer than
    FETCH_LOW_WATER words; its rows go to ``load``, not to the decoder, and its bus error
    stops no fetching."""
    async def body(ctx, dut, bench):
        await fill_one_batch(ctx, dut, bench)
        await bench.run(FETCH_BURST - 1 - level, pop=True)
        assert bench.held == level
        ctx.set(dut.control.enable, 1)
        ctx.set(dut.load.cmd.valid, 1)
        for name, value in zip(("addr", "rows", "row_bytes", "stride"), LOAD_CMD):
            ctx.set(getattr(dut.load.cmd.payload, name), value)
        for name, value in LOAD_EXTRA.items():
            ctx.set(getattr(dut.load.cmd.payload, name), value)
        bench.fail_after = None
        for _ in range(40):
            await bench.step()
            if bench.commands[-1][2]:
                ctx.set(dut.load.cmd.valid, 0)
        kinds = [(cmd, is_load) for _, cmd, is_load in bench.commands[1:]]
        if level >= FETCH_LOW_WATER:
            assert kinds == [(LOAD_CMD, True), (fetch_cmd(8, 8), False)]
        else:
            assert kinds == [(fetch_cmd(8, 8), False), (LOAD_CMD, True)]
        assert bench.load_rows == [word_at(0x4000 + 7 * r) for r in range(3)]
        await bench.run(bench.held + 1, pop=True)         # the held words and the head
        assert bench.popped_words() == program(0, 16)
    simulate(body, prog_len=32)


def test_load_bus_error_stays_the_load_units():
    """A load command's bus error reaches ``load`` (its rows before it too), leaves no error
    entry in the queue and stops no fetching."""
    async def body(ctx, dut, bench):
        await fill_one_batch(ctx, dut, bench)
        bench.load_fail_after = 1
        ctx.set(dut.load.cmd.valid, 1)
        ctx.set(dut.load.cmd.payload, {**dict(zip(("addr", "rows", "row_bytes", "stride"),
                                                  LOAD_CMD)), **LOAD_EXTRA})
        await bench.step()
        ctx.set(dut.load.cmd.valid, 0)
        await bench.run(10)
        ctx.set(dut.control.enable, 1)
        await bench.run(14)
        assert [(cmd, is_load) for _, cmd, is_load in bench.commands] == [
            (fetch_cmd(0, 8), False), (LOAD_CMD, True), (fetch_cmd(8, 8), False)]
        assert bench.load_rows == [word_at(0x4000)]
        await bench.run(16, pop=True)
        assert bench.popped_words() == program(0, 16)
    simulate(body, prog_len=32)


def test_failed_fetch_and_begin():
    """A failed fetch leaves the rows before it and an error entry, then fetches nothing
    more; ``begin`` empties the queue and starts again from the first instruction."""
    async def body(ctx, dut, bench):
        bench.fail_after = 3
        await bench.run(20)
        assert [cmd for _, cmd, _ in bench.commands] == [fetch_cmd(0, 8)]
        await bench.run(4, pop=True)
        # The error entry's instruction bits are the last word's: the fetcher's output
        # register keeps them (the issue stage looks at bus_error first).
        assert bench.popped_words() == program(0, 3) + [(program(2, 1)[0][0], 1)]
        await bench.run(30)
        assert len(bench.commands) == 1 and bench.empty()
        bench.fail_after = None
        ctx.set(dut.control.begin, 1)
        _, flush = await bench.step()
        assert flush == 1
        ctx.set(dut.control.begin, 0)
        begin = bench.cycle - 1
        await bench.run(12)
        assert bench.commands[1:] == [(begin + 1, fetch_cmd(0, 8), False),
                                      (begin + 12, fetch_cmd(8, 8), False)]
        await bench.run(8, pop=True)
        assert bench.popped_words()[4:] == program(0, 8)
    simulate(body, prog_len=32)


def test_begin_mid_program_flushes():
    async def body(ctx, dut, bench):
        await bench.run(30)
        assert bench.held == 15 and bench.head is not None        # 16 words fetched
        ctx.set(dut.control.begin, 1)
        ctx.set(dut.control.prog_addr, PROG_ADDR + 0x100)
        _, flush = await bench.step()
        assert flush == 1 and bench.empty()
        ctx.set(dut.control.begin, 0)
        await bench.run(2)
        assert bench.commands[-1][1] == (PROG_ADDR + 0x100, 8, 16, 16)
    simulate(body, prog_len=32)


def test_halt_grants_nothing():
    async def body(ctx, dut, bench):
        ctx.set(dut.control.halt, 1)
        ctx.set(dut.load.cmd.valid, 1)
        for _ in range(10):
            cmd_valid, _ = await bench.step()
            assert cmd_valid == 0 and ctx.get(dut.load.cmd.ready) == 0
        ctx.set(dut.control.halt, 0)
        cmd_valid, _ = await bench.step()
        assert cmd_valid == 1 and bench.commands == [(11, fetch_cmd(0, 8), False)]
    simulate(body, prog_len=32)


# (store_lo, store_hi) against the program [0x1000, 0x1140) of 20 instructions.
OVERLAPS = [((0x1140, 0x1200), False), ((0x0F00, 0x1000), False),
            ((0x113F, 0x1140), True), ((0x0FFF, 0x1001), True), ((0, 1 << 32), True)]


@pytest.mark.parametrize("moved", [False, True], ids=["", "registers_moved"])
@pytest.mark.parametrize("store, overlaps", OVERLAPS)
def test_refetch_after_store(store, overlaps, moved):
    """A store over the program: fetching stops; once the store and the reader are idle,
    the queue is emptied (``flush``) and fetching starts again at ``pc``. With ``moved``,
    ``prog_addr`` and ``prog_len`` change after ``begin`` (the issue stage hands on the
    host's registers, which the host may write during a run): the fetcher read them only
    at ``begin``, so nothing changes."""
    async def body(ctx, dut, bench):
        if moved:
            ctx.set(dut.control.prog_addr, 0x8000_0000)
            ctx.set(dut.control.prog_len, 3)
        await bench.run(5)               # the first batch is in flight
        ctx.set(dut.control.store_issued, 1)
        ctx.set(dut.control.store_lo, store[0])
        ctx.set(dut.control.store_hi, store[1])
        ctx.set(dut.control.store_busy, 1)
        ctx.set(dut.control.pc, 5)
        await bench.step()
        ctx.set(dut.control.store_issued, 0)
        assert ctx.get(dut.control.refetch) == overlaps
        for _ in range(30):
            wants = not overlaps and bench.busy is None and bench.held <= FETCH_HIGH_WATER
            cmd_valid, flush = await bench.step()
            assert (cmd_valid, flush) == (wants, 0), f"cycle {bench.cycle - 1}"
        assert len(bench.commands) == (1 if overlaps else 2)
        ctx.set(dut.control.store_busy, 0)
        _, flush = await bench.step()
        assert flush == overlaps and ctx.get(dut.control.refetch) == 0
        if overlaps:
            assert bench.empty()
            await bench.step()
            assert bench.commands[-1][1] == fetch_cmd(5, 8)
            await bench.run(12)
            await bench.run(8, pop=True)
            assert bench.popped_words() == program(5, 8)
    simulate(body, prog_len=20)


def test_refetch_waits_for_the_reader():
    """The store ends while a batch is still coming: the flush waits for the reader's
    ``done`` (cycle 11) and comes in the next cycle, the command from ``pc`` right after."""
    async def body(ctx, dut, bench):
        await bench.run(5)
        ctx.set(dut.control.store_issued, 1)
        ctx.set(dut.control.store_lo, PROG_ADDR)
        ctx.set(dut.control.store_hi, PROG_ADDR + 4)
        ctx.set(dut.control.pc, 2)
        flushes = []
        for cycle in range(6, 14):
            ctx.set(dut.control.store_busy, cycle == 7)
            flushes.append((await bench.step())[1])
            ctx.set(dut.control.store_issued, 0)
        assert flushes == [0] * 6 + [1, 0]
        assert bench.commands[-1] == (13, fetch_cmd(2, 8), False)
    simulate(body, prog_len=20)


def test_reader_not_ready_assert_fires():
    """Mutant: a reader that is not ready for a command while the fetcher counts it idle.
    The fetcher takes a command as accepted in the cycle it offers it (the DMA reader is
    idle from the cycle after its ``done``, so its ``cmd.ready``, a long path on the FPGA,
    is not waited for); its assertion stops a simulation where that does not hold."""
    async def body(ctx, dut, bench):
        await fill_one_batch(ctx, dut, bench)
        bench.ready_from = bench.cycle + 4
        ctx.set(dut.control.enable, 1)
        for _ in range(6):
            await bench.step()
    with pytest.raises(AssertionError, match="the DMA reader is busy while the fetcher"):
        simulate(body, prog_len=32)


@pytest.mark.parametrize("extra", [1, 2])
def test_queue_overflow_assert_fires(extra):
    """Mutant: a reader that delivers more rows than asked. FETCH_DEPTH + 1 rows for a batch
    still fit (the decoder's head register takes the first word, the other FETCH_DEPTH are
    held); FETCH_DEPTH + 2 would overflow the queue, and the fetcher's assertion stops the
    simulation."""
    async def body(ctx, dut, bench):
        await bench.run(60)
        assert bench.held == FETCH_DEPTH and bench.head is not None
    extra_rows = FETCH_DEPTH - FETCH_BURST + extra
    if extra == 1:
        simulate(body, prog_len=64, extra_rows=extra_rows)
    else:
        with pytest.raises(AssertionError, match="instruction queue overflow"):
            simulate(body, prog_len=64, extra_rows=extra_rows)
