"""Unit tests of :class:`hw.controller.decoder.Decoder`: the operand checks in the ISA's order
(lengths, local range, DRAM range) against a Python reference written from :mod:`hw.isa`'s
text, the DRAM bounds ``[lo, hi)``, the row ranges, and the pipeline: check stage, queue of
FETCH_DEPTH words, head register."""

from collections import deque

import numpy as np
import pytest
from amaranth.hdl import Shape
from amaranth.lib import data

from controller_blocks import CONFIG, row_ranges
from error_cases import CONFIG as TABLE_CONFIG
from error_cases import (END, ERROR_PROGRAMS, load_acc, load_quant, load_spad, matmul, store,
                         store_q)
from hw.config import FETCH_DEPTH
from hw.controller.decoder import LATENCY, Decoder
from hw.controller.signatures import Kind
from hw.isa import (ErrorCode, Instruction, Opcode, argument_layout, decode, encode,
                    opcode_of)
from sim.amaranth_sim import run_simulation


KIND_FIELDS = [name for name, _ in data.Layout.cast(Kind)]


TOP = 1 << 32
DECODER_CODES = {ErrorCode.ILLEGAL_OPCODE, ErrorCode.SPAD_RANGE, ErrorCode.ACC_RANGE,
                 ErrorCode.BAD_LENGTH, ErrorCode.DRAM_RANGE}


def reference(word, config=CONFIG):
    """``(check, lo, hi)`` of ``word`` as :mod:`hw.isa` documents them."""
    opcode, f = decode(word)
    rows, cols = config.rows, config.cols
    if opcode is None:
        return ErrorCode.ILLEGAL_OPCODE, 0, 0
    if opcode == Opcode.END:
        return ErrorCode.NONE, 0, 0
    if opcode == Opcode.PRELOAD:
        bad = f["spad_addr"] + rows > config.spad_depth
        return (ErrorCode.SPAD_RANGE if bad else ErrorCode.NONE), 0, 0
    if opcode == Opcode.MATMUL:
        code = ErrorCode.NONE
        if f["rows"] == 0 or f["k_width"] > rows or f["n_width"] > cols:
            code = ErrorCode.BAD_LENGTH
        elif f["spad_addr"] + f["rows"] > config.spad_depth:
            code = ErrorCode.SPAD_RANGE
        elif f["acc_addr"] + f["rows"] > config.acc_depth:
            code = ErrorCode.ACC_RANGE
        return code, 0, 0
    lo, row_bytes = f["dram_addr"], f["row_bytes"]
    if opcode == Opcode.LOAD_QUANT:       # two rows: multipliers, then shifts one stride on
        hi = lo + f["dram_stride"] + row_bytes
        bad_length = row_bytes == 0 or row_bytes % 4 != 0 or row_bytes > 4 * cols
        local_bad, local_code = False, None
    else:
        hi = lo + (f["rows"] - 1) * f["dram_stride"] + row_bytes
        limit, depth, local_code = {
            Opcode.LOAD_SPAD: (config.spad_row_bytes, config.spad_depth, ErrorCode.SPAD_RANGE),
            Opcode.LOAD_ACC: (4 * cols, config.acc_depth, ErrorCode.ACC_RANGE),
            Opcode.STORE: (4 * cols, config.acc_depth, ErrorCode.ACC_RANGE),
            Opcode.STORE_Q: (cols, config.acc_depth, ErrorCode.ACC_RANGE),
        }[opcode]
        local = f["local_addr"] if opcode in (Opcode.LOAD_SPAD, Opcode.LOAD_ACC) \
            else f["acc_addr"]
        bad_length = (f["rows"] == 0 or row_bytes == 0 or row_bytes > limit or
                      (opcode == Opcode.STORE and row_bytes % 4 != 0))
        local_bad = local + f["rows"] > depth
    if bad_length:
        return ErrorCode.BAD_LENGTH, lo, hi
    if local_bad:
        return local_code, lo, hi
    return (ErrorCode.DRAM_RANGE if hi > TOP else ErrorCode.NONE), lo, hi


def run_decoder(words, *, config=CONFIG, bus_errors=None, seed=None):
    """Stream ``words`` through a decoder, playing the fetcher (a word offered on
    ``words.word`` for one cycle, never stalled, only while at most FETCH_DEPTH words are
    delivered and not ``taken``) and the issue stage (``decoded.ready``); with ``seed``, words
    come and ``ready`` is high at random, with long stretches of ``ready`` low that fill the
    queue. Returns ``(word, lo, hi, check, bus_error, spad, acc)`` for every word, in the
    order they left, and checks on every cycle the handshake against a model of the
    pipeline: a word offered in cycle t is at the queue's front from t + LATENCY; ``taken``
    exactly when the queue holds a word and the head register is empty or its word leaves;
    the head in ``decoded`` the cycle after."""
    dut = Decoder(config)
    rng = np.random.default_rng(seed)
    bus_errors = bus_errors or [0] * len(words)
    out = []

    async def testbench(ctx):
        offered, taken, held, fullest = 0, 0, None, 0
        pipeline = deque()            # cycles in which the words not yet taken were offered
        head = False                  # the model's head register holds a word
        for cycle in range(20 * len(words) + 20):
            stalled = seed is not None and (cycle // 50) % 3 == 1
            offering = (offered < len(words) and offered - taken < FETCH_DEPTH and
                        (seed is None or rng.random() < 0.7))
            ctx.set(dut.words.word.valid, offering)
            if offering:
                ctx.set(dut.words.word.payload, {
                    "instr": Instruction.from_bits(words[offered]),
                    "bus_error": bus_errors[offered]})
            ready = seed is None or (not stalled and rng.random() < 0.6)
            ctx.set(dut.decoded.ready, ready)
            valid = ctx.get(dut.decoded.valid)
            payload = ctx.get(dut.decoded.payload)
            record = (payload.instr.as_bits(), payload.lo, payload.hi, payload.check,
                      payload.bus_error, (payload.spad.lo, payload.spad.hi),
                      (payload.acc.lo, payload.acc.hi),
                      (payload.written_spad_hi, payload.read_acc_hi),
                      {name: getattr(payload.kind, name) for name in KIND_FIELDS})
            context = f"seed {seed} cycle {cycle}"
            assert valid == head, f"{context}: decoded.valid"
            if held is not None:
                assert record == held, f"{context}: not held"
            in_queue = bool(pipeline) and pipeline[0] <= cycle - LATENCY
            take = in_queue and (not head or ready)
            assert ctx.get(dut.words.taken) == take, f"{context}: taken"
            if valid and ready:
                out.append(record)
            held = record if valid and not ready else None
            if len(out) == len(words):
                # The stalls filled the queue up to the fetcher's limit.
                assert seed is None or fullest == FETCH_DEPTH, f"seed {seed}: {fullest}"
                return
            await ctx.tick()
            if offering:
                pipeline.append(cycle)
                offered += 1
                fullest = max(fullest, offered - taken)
            if take:
                pipeline.popleft()
                taken += 1
            head = take or (head and not ready)
        raise AssertionError(f"seed {seed}: {len(out)} of {len(words)} words decoded")

    run_simulation(dut, testbench)
    return out


def assert_decoded(word, record, context, bus_error=0):
    code, lo, hi = reference(word)
    spad, acc = row_ranges(word)
    got_word, got_lo, got_hi, got_check, got_bus_error, got_spad, got_acc, got_ends, \
        got_kind = record
    assert (got_word, got_bus_error) == (word, bus_error), context
    assert ErrorCode(got_check) == code, f"{context}: {ErrorCode(got_check).name}, " \
        f"expected {code.name}"
    assert got_lo == lo, f"{context}: lo {got_lo:#x}, expected {lo:#x}"
    if code == ErrorCode.NONE:
        assert got_hi == hi, f"{context}: hi {got_hi:#x}, expected {hi:#x}"
    assert (got_spad, got_acc) == ((spad["lo"], spad["hi"]), (acc["lo"], acc["hi"])), \
        f"{context}: spad {got_spad}, acc {got_acc}"
    # The issue stage's flags, written out here rather than from KIND_OPCODES.
    opcode = opcode_of(word)
    expected_kind = {
        "end": opcode is Opcode.END, "load_spad": opcode is Opcode.LOAD_SPAD,
        "load_acc": opcode is Opcode.LOAD_ACC, "load_quant": opcode is Opcode.LOAD_QUANT,
        "preload": opcode is Opcode.PRELOAD, "matmul": opcode is Opcode.MATMUL,
        "store": opcode in (Opcode.STORE, Opcode.STORE_Q),
        "faulty": bool(bus_error) or code != ErrorCode.NONE,
    }
    assert got_kind == {name: int(flag) for name, flag in expected_kind.items()}, \
        f"{context}: kind {got_kind}"
    # The ends compared with the streamer's rows: a LOAD_SPAD's scratchpad rows, a store's
    # accumulator rows, 0 for every other kind.
    assert got_ends == (spad["hi"] if expected_kind["load_spad"] else 0,
                        acc["hi"] if expected_kind["store"] else 0), f"{context}: {got_ends}"


def test_register_stage():
    """A word offered in cycle t leaves the queue (``taken``) in t + LATENCY (5) and is in
    ``decoded`` in t + 6 (input register, three check stages, queue, its read register, head
    register), with
    its bounds and row ranges; the next
    is taken only in the cycle the held one leaves; ``flush`` drops the held word and the
    words in the stage, in the queue and on ``word`` in that cycle; ``bus_error`` passes
    through."""
    dut = Decoder(CONFIG)
    first, second, third = load_spad(0, 1, 1, 0x100, 0), store(0, 1, 4, 0x200, 4), END

    def fetched(ctx, word, bus_error=0):
        ctx.set(dut.words.word.payload, {"instr": Instruction.from_bits(word),
                                         "bus_error": bus_error})
        ctx.set(dut.words.word.valid, 1)

    def held(ctx):
        return ctx.get(dut.decoded.valid) and ctx.get(dut.decoded.payload.instr).as_bits()

    def taken(ctx):
        return ctx.get(dut.words.taken)

    async def tick(ctx, cycles=1):
        for _ in range(cycles):
            await ctx.tick()
            ctx.set(dut.words.word.valid, 0)          # a word is on ``word`` for one cycle

    async def testbench(ctx):
        fetched(ctx, first)
        for _ in range(5):                            # cycles 0 to 4
            assert (taken(ctx), ctx.get(dut.decoded.valid)) == (0, 0)
            await tick(ctx)
        assert (taken(ctx), ctx.get(dut.decoded.valid)) == (1, 0)   # cycle 5: out of the queue
        await tick(ctx)
        assert held(ctx) == first                                   # cycle 6
        payload = ctx.get(dut.decoded.payload)
        assert (payload.lo, payload.hi) == (0x100, 0x101)
        assert ((payload.spad.lo, payload.spad.hi), (payload.acc.lo, payload.acc.hi)) == \
            ((0, 1), (0, 0))
        fetched(ctx, second)
        for _ in range(5):            # not ready: the first stays, the second waits in the queue
            assert taken(ctx) == 0
            await tick(ctx)
            assert held(ctx) == first
        ctx.set(dut.decoded.ready, 1)
        assert taken(ctx) == 1                          # taken as the first one leaves
        await tick(ctx)
        assert held(ctx) == second and taken(ctx) == 0
        payload = ctx.get(dut.decoded.payload)
        assert ((payload.spad.lo, payload.spad.hi), (payload.acc.lo, payload.acc.hi)) == \
            ((0, 0), (0, 1))
        await tick(ctx)
        assert ctx.get(dut.decoded.valid) == 0
        ctx.set(dut.decoded.ready, 0)
        fetched(ctx, third)
        await tick(ctx, 6)
        assert held(ctx) == third
        # Words in the queue, in the stages, on ``word``: the flush drops them all.
        fetched(ctx, first)
        await tick(ctx)
        fetched(ctx, second)
        await tick(ctx)
        fetched(ctx, first)
        ctx.set(dut.words.flush, 1)
        assert taken(ctx) == 0
        await tick(ctx)
        assert ctx.get(dut.decoded.valid) == 0            # flushed, not issued
        ctx.set(dut.words.flush, 0)
        for _ in range(6):                                # ...and nothing else comes
            assert (taken(ctx), ctx.get(dut.decoded.valid)) == (0, 0)
            await tick(ctx)
        fetched(ctx, 0, bus_error=1)
        await tick(ctx, 6)
        assert held(ctx) == 0
        assert ctx.get(dut.decoded.payload.bus_error) == 1
        assert ctx.get(dut.decoded.payload.check) == ErrorCode.ILLEGAL_OPCODE.value
        fetched(ctx, first, bus_error=0)
        ctx.set(dut.decoded.ready, 1)
        await tick(ctx, 6)
        assert held(ctx) == first and ctx.get(dut.decoded.payload.bus_error) == 0

    run_simulation(dut, testbench)


BOUNDS = [
    # LOAD_SPAD, R=2 C=3: row_bytes at most 3. 0xFFFF_FFF0 + 13 + 3 is exactly 2**32.
    ("load_spad_ends_at_top", load_spad(0, 2, 3, 0xFFFF_FFF0, 13)),
    ("load_spad_one_past", load_spad(0, 2, 3, 0xFFFF_FFF0, 14)),
    ("load_spad_stride_0", load_spad(0, 9, 3, 0xFFFF_FFFD, 0)),
    ("load_spad_huge_product", load_spad(0, 16, 1, 0, 0xFFFF_FFFF)),
    ("load_spad_wraps_to_low", load_spad(0, 2, 3, 0x10, 0xFFFF_FFF0)),
    ("load_acc_ends_at_top", load_acc(0, 1, 12, TOP - 12, 0xFFFF_FFFF)),
    ("load_acc_one_past", load_acc(0, 1, 12, TOP - 11, 0)),
    ("store_ends_at_top", store(0, 2, 8, 0xFFFF_FFF0, 8)),
    ("store_one_past", store(0, 2, 8, 0xFFFF_FFF0, 9)),
    ("store_q_ends_at_top", store_q(0, 8, 3, TOP - 3 - 7 * 100, 100)),
    ("store_q_one_past", store_q(0, 8, 3, TOP - 2 - 7 * 100, 100)),
    ("load_quant_ends_at_top", load_quant(8, dram_addr=0xFFFF_FF00, dram_stride=0xF8)),
    ("load_quant_one_past", load_quant(8, dram_addr=0xFFFF_FF00, dram_stride=0xF9)),
    ("load_quant_stride_wraps", load_quant(4, dram_addr=0x10, dram_stride=0xFFFF_FFF0)),
    ("load_quant_low", load_quant(12, dram_addr=0x1234, dram_stride=0x40)),
    # Check order: lengths before local range before DRAM range.
    ("length_before_local", load_spad(15, 2, 4, TOP - 1, 9)),
    ("local_before_dram", load_spad(15, 2, 3, TOP - 1, 9)),
    ("store_unaligned_bytes", store(9, 1, 6, TOP - 1, 0)),
    ("store_q_acc_before_dram", store_q(7, 2, 3, TOP - 1, 0)),
    ("load_quant_length_before_dram", load_quant(6, dram_addr=TOP - 1)),
    ("matmul_length_before_spad", matmul(15, 7, 0, 0)),
    ("matmul_spad_before_acc", matmul(15, 7, 2, 1)),
    ("matmul_k_too_wide", encode(Opcode.MATMUL, spad_addr=0, acc_addr=0, rows=1, accumulate=0,
                                 k_width=3, n_width=3)),
    ("matmul_n_too_wide", encode(Opcode.MATMUL, spad_addr=0, acc_addr=0, rows=1, accumulate=0,
                                 k_width=2, n_width=4)),
    ("matmul_full_widths", encode(Opcode.MATMUL, spad_addr=14, acc_addr=6, rows=2,
                                  accumulate=1, k_width=2, n_width=3)),
    ("preload_last_tile", encode(Opcode.PRELOAD, spad_addr=14)),
    ("preload_past_end", encode(Opcode.PRELOAD, spad_addr=15)),
    ("end", encode(Opcode.END)),
    ("opcode_zero", 0),
    ("opcode_ff", 0xFF | 0x1234 << 40),
]


def test_bounds_and_check_order():
    """Each case's check, ``lo`` and (when it passes) ``hi`` are the reference's; the block
    ending exactly at 2**32 passes with ``hi = 2**32``, one byte more is DRAM_RANGE."""
    names, words = zip(*BOUNDS)
    records = run_decoder(list(words))
    for name, word, record in zip(names, words, records):
        assert_decoded(word, record, name)
    by_name = dict(zip(names, records))
    assert by_name["load_spad_ends_at_top"][2:4] == (TOP, 0)
    assert by_name["load_acc_ends_at_top"][1:4] == (TOP - 12, TOP, 0)
    assert by_name["load_quant_ends_at_top"][1:4] == (0xFFFF_FF00, TOP, 0)
    for name in ("load_spad_one_past", "store_one_past", "load_quant_one_past",
                 "load_quant_stride_wraps", "load_spad_wraps_to_low"):
        assert by_name[name][3] == ErrorCode.DRAM_RANGE.value, name


@pytest.mark.parametrize("name, words, code, pc",
                         [case[:2] + case[3:] for case in ERROR_PROGRAMS
                          if case[3] in DECODER_CODES],
                         ids=[case[0] for case in ERROR_PROGRAMS if case[3] in DECODER_CODES])
def test_error_table(name, words, code, pc):
    """The failing instruction of each decoder error of ``tb/error_cases.py`` (2x2)."""
    (record,) = run_decoder([words[pc]], config=TABLE_CONFIG)
    assert ErrorCode(record[3]) == code, name


def random_word(rng):
    """A random instruction, its fields mostly around the limits of :data:`CONFIG` (and its
    DRAM block's end often within a byte of 2**32), with a random reserved byte; one in ten
    has an illegal opcode and random operand bits."""
    if rng.random() < 0.1:
        illegal = [v for v in range(256) if v not in {op.value for op in Opcode}]
        return int(rng.choice(illegal)) | int(rng.integers(0, 1 << 62)) << 16
    opcode = Opcode(int(rng.integers(1, 9)))
    fields = {}
    for name, field in argument_layout(opcode) or ():
        width = field.width
        if rng.random() < 0.05:
            value = int(rng.integers(0, 1 << width))       # anything, often far out
        elif name in ("local_addr", "acc_addr", "spad_addr"):
            value = int(rng.integers(0, 17))
        elif name == "rows":
            value = int(rng.integers(0, 10))
        elif name == "row_bytes":
            limit = {Opcode.LOAD_SPAD: CONFIG.spad_row_bytes,
                     Opcode.STORE_Q: CONFIG.cols}.get(opcode, CONFIG.acc_row_bytes)
            value = int(rng.integers(0, limit + 2))
            if opcode in (Opcode.STORE, Opcode.LOAD_QUANT) and rng.random() < 0.7:
                value -= value % 4
        elif name in ("k_width", "n_width"):
            value = int(rng.integers(0, 5))
        elif name == "dram_stride":
            value = int(rng.choice([0, int(rng.integers(1, 64)), 0xFFFF_FFFF,
                                    int(rng.integers(0, 1 << 32))]))
        else:
            value = int(rng.integers(0, 1 << width))
        if Shape.cast(field.shape).signed:
            value -= (1 << width) if value >> (width - 1) else 0
        fields[name] = value
    if "dram_addr" in fields and rng.random() < 0.6:
        # Place the block's end around 2**32: one byte under, exactly at, one byte over.
        span = fields["dram_stride"] + fields["row_bytes"] if opcode == Opcode.LOAD_QUANT \
            else (max(fields["rows"], 1) - 1) * fields["dram_stride"] + fields["row_bytes"]
        addr = TOP - span + int(rng.integers(-1, 2))
        if 0 <= addr < TOP:
            fields["dram_addr"] = addr
    return encode(opcode, **fields) | int(rng.integers(0, 256)) << 8


@pytest.mark.parametrize("seed", [0xDEC0, 0xDEC1])
def test_random_against_reference(seed):
    """Random instructions (a few with ``bus_error``), random ``valid`` and ``ready`` (with
    stretches that fill the queue): every word leaves once, in order, with the reference's
    check, bounds and row ranges and its ``bus_error``; the handshake holds on every
    cycle."""
    rng = np.random.default_rng(seed)
    words = [random_word(rng) for _ in range(300)]
    bus_errors = [int(rng.random() < 0.05) for _ in words]
    records = run_decoder(words, bus_errors=bus_errors, seed=seed)
    for index, (word, record) in enumerate(zip(words, records)):
        assert_decoded(word, record, f"seed {seed} word {index} ({word:#034x})",
                       bus_errors[index])
    codes = {ErrorCode(record[3]) for record in records}
    assert codes == DECODER_CODES | {ErrorCode.NONE}, f"seed {seed}: only {codes}"
