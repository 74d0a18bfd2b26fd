"""Faults injected into the NPU top level, run by ``tb/test_faults.py`` under both simulators.

Every fault must end in a defined state, within a bound of cycles: an error status with its
code and the index of the failing instruction, ``irq`` high, nothing written outside the
destination of the stores that ran, and the next program bit-exact. ``NPU_SEED`` picks the
faults; ``NPU_BACKPRESSURE`` (set by some of the pytest cases) adds random stalls.
"""

import os
import random

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiResp

from hw.isa import INSTR_BYTES, Control, ErrorCode, Opcode, Reg, Status, encode
from sim.bench import TB, config_from_env
from sim.bench_top import dram_from_env
from sw import codec
from sw.driver import prepare_gemm, reference_gemm
from tb.error_cases import CONFIG as TABLE_CONFIG
from tb.error_cases import END, ERROR_PROGRAMS, PROG_ADDR


DRAM_SIZE = 0x10000
SEED = int(os.environ.get("NPU_SEED", "31337"))
FULL = os.environ.get("NPU_FULL") == "1"
#: Bound on any program here: far above the longest (a GEMM of a few thousand cycles, slowed
#: down by back-pressure).
TIMEOUT = 200_000
#: A load that every config accepts.
GOOD = encode(Opcode.LOAD_SPAD, local_addr=0, rows=1, row_bytes=1, dram_addr=0x2000,
              dram_stride=0)


def rng_for(name):
    seed = f"{SEED}/{name}"
    cocotb.log.info("random choices of %s: NPU_SEED=%d", name, SEED)
    return random.Random(seed)


class Gemm:
    """A small GEMM compiled for the simulated config, its DRAM image and its expected C."""
    def __init__(self, config, rng, m, k, n):
        a = np.array([[rng.randint(-128, 127) for _ in range(k)] for _ in range(m)], np.int8)
        b = np.array([[rng.randint(-128, 127) for _ in range(n)] for _ in range(k)], np.int8)
        self.job = prepare_gemm(a, b, config=config)
        self.layout = self.job.layout
        self.expected = reference_gemm(a, b)
        self.words = self.job.program.words
        assert self.layout.size <= DRAM_SIZE

    def load(self, tb):
        tb.dram.write(0, self.job.dram.tobytes())

    def c(self, tb):
        layout = self.layout
        data = tb.dram.read(layout.c_addr, layout.c_bytes)
        return np.frombuffer(bytes(data), "<i4").reshape(self.expected.shape)

    async def run(self, tb):
        return await tb.run_program(self.layout.program_addr, len(self.words), TIMEOUT)

    async def run_exact(self, tb, context):
        """Run from a fresh image; the result must be done and bit-exact."""
        self.load(tb)
        outcome = await self.run(tb)
        assert outcome.done, f"{context}: the GEMM ended {outcome}"
        got = self.c(tb)
        assert np.array_equal(got, self.expected), \
            f"{context}: C differs at {np.argwhere(got != self.expected)[:4].tolist()}"
        return outcome


def _beats(start, length, bus_bytes):
    """The bus-aligned beats that cover ``[start, start + length)``, as one byte range."""
    first = start - start % bus_bytes
    end = start + length
    return first, end + (-end) % bus_bytes


def accesses(words, prog_addr, bus_bytes):
    """Per instruction: the byte ranges it reads (whole beats, fetch first) and writes."""
    per_instruction = []
    for pc, word in enumerate(words):
        reads = [_beats(prog_addr + INSTR_BYTES * pc, INSTR_BYTES, bus_bytes)]
        writes = []
        opcode, fields = codec.decode(word)
        if opcode in (Opcode.LOAD_SPAD, Opcode.LOAD_ACC):
            reads += [_beats(fields["dram_addr"] + row * fields["dram_stride"],
                             fields["row_bytes"], bus_bytes) for row in range(fields["rows"])]
        elif opcode == Opcode.LOAD_QUANT:
            reads += [_beats(fields["dram_addr"] + row * fields["dram_stride"],
                             fields["row_bytes"], bus_bytes) for row in range(2)]
        elif opcode in (Opcode.STORE, Opcode.STORE_Q):
            writes += [(fields["dram_addr"] + row * fields["dram_stride"],
                        fields["dram_addr"] + row * fields["dram_stride"] + fields["row_bytes"])
                       for row in range(fields["rows"])]
        per_instruction.append((reads, writes))
    return per_instruction


def _hits(ranges, start, end):
    return any(lo < end and start < hi for lo, hi in ranges)


def expected_fault(per_instruction, start, end, kind):
    """``(error code, pc)`` of a fault on ``[start, end)`` for ``kind`` (read or write) of a
    straight-line program, or ``None`` if the program never touches it."""
    for pc, (reads, writes) in enumerate(per_instruction):
        if kind == "read" and _hits(reads, start, end):
            return ErrorCode.BUS_READ, pc
        if kind == "write" and _hits(writes, start, end):
            return ErrorCode.BUS_WRITE, pc
    return None


def _merged(ranges):
    """``[lo, hi)`` ranges joined where they touch or overlap, in order."""
    merged = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return merged


def assert_writes_inside(writes, allowed, context):
    """Every byte written lies inside ``allowed``. ``writes`` may be single writes (the
    cocotbext DRAM's log) or runs of written bytes (the HDL DRAM's), so a run may span
    destinations that touch."""
    allowed = _merged(allowed)
    for address, length in writes:
        assert any(lo <= address and address + length <= hi for lo, hi in allowed), \
            f"{context}: a write of {length} bytes at {address:#x} lies outside the stores' " \
            f"destination"


def touched(per_instruction, kind, base, size):
    """The byte ranges of ``[base, base + size)`` that the program reads (``kind`` "read")
    or writes: where a fault changes what it does."""
    index = 0 if kind == "read" else 1
    spans = [(max(lo, base), min(hi, base + size))
             for accessed in per_instruction for lo, hi in accessed[index]
             if lo < base + size and base < hi]
    return _merged(spans)


def small_gemm(tb, rng):
    config = tb.config
    # Several m-blocks on a small accumulator, several k- and n-tiles everywhere.
    return Gemm(config, rng, m=min(2 * config.acc_depth // 3 + 3, 20), k=3 * config.rows + 1,
                n=2 * config.cols + 1)


@cocotb.test()
async def bus_faults_in_a_gemm(dut):
    """SLVERR or DECERR on an instruction fetch, a load of A or B, or a store of C, at a
    random address: the error names the instruction that touched it, and nothing is written
    outside C; after each, the same GEMM runs bit-exactly."""
    tb = TB(dut, DRAM_SIZE)
    await tb.reset()
    rng = rng_for("bus_faults_in_a_gemm")
    gemm = small_gemm(tb, rng)
    layout = gemm.layout
    bus_bytes = tb.config.bus_bytes
    clean = await gemm.run_exact(tb, "before any fault")
    per_instruction = accesses(gemm.words, layout.program_addr, bus_bytes)
    regions = {
        "fetch": ("read", layout.program_addr, layout.program_bytes),
        "A": ("read", layout.a_addr, layout.a_bytes),
        "B": ("read", layout.b_addr, layout.b_bytes),
        "C": ("write", layout.c_addr, layout.c_bytes),
    }
    cases = 24 if FULL else 8
    for case in range(cases):
        region = ["fetch", "A", "B", "C"][case % 4]
        kind, base, size = regions[region]
        # Only where an instruction reads (or writes) the region: row padding is never
        # fetched, and a fault there would change nothing.
        lo, hi = rng.choice(touched(per_instruction, kind, base, size))
        start = rng.randrange(lo, hi)
        end = start + rng.randint(1, bus_bytes)
        resp = rng.choice([AxiResp.SLVERR, AxiResp.DECERR])
        context = f"case {case}: {resp.name} on {kind}s of [{start:#x}, {end:#x}) in {region}"
        want = expected_fault(per_instruction, start, end, kind)
        assert want is not None, context

        gemm.load(tb)
        tb.dram.inject_fault(start, end, read=kind == "read", write=kind == "write",
                             resp=resp)
        tb.dram.record_writes()
        outcome = await gemm.run(tb)
        tb.dram.clear_faults()
        assert (outcome.error, outcome.error_code, outcome.error_pc) == (True, *want), \
            f"{context}: {outcome}, expected {want[0].name} at {want[1]}"
        assert dut.irq.value == 1, f"{context}: irq low"
        stores = [span for _, writes in per_instruction[:want[1] + 1] for span in writes]
        assert_writes_inside(tb.dram.writes, stores, context)

        again = await gemm.run_exact(tb, f"{context}, run again without the fault")
        if tb.backpressure is None:
            assert again.cycles == clean.cycles, f"{context}: {again.cycles} cycles after " \
                                                 f"the fault, {clean.cycles} before"


@cocotb.skipif(config_from_env() != TABLE_CONFIG,
               reason="the table is written for error_cases.CONFIG")
@cocotb.test()
async def error_table(dut):
    """The controller tests' table of bad programs (tb/error_cases.py) on the RTL: each ends
    in its error code at its instruction, with irq, without writing anything."""
    tb = TB(dut, DRAM_SIZE)
    await tb.reset()
    for name, words, prog_len, code, error_pc in ERROR_PROGRAMS:
        prog_addr = 0xFFFF_FFF0 if name == "program_past_4g" else PROG_ADDR
        if prog_addr < DRAM_SIZE:
            tb.dram.write(prog_addr, b"".join(w.to_bytes(INSTR_BYTES, "little") for w in words))
        tb.dram.record_writes()
        outcome = await tb.run_program(prog_addr, len(words) if prog_len is None else prog_len,
                                       TIMEOUT)
        assert (outcome.error, outcome.error_code, outcome.error_pc) == (True, code, error_pc), \
            f"{name}: {outcome}, expected {code.name} at {error_pc}"
        assert dut.irq.value == 1, f"{name}: irq low"
        assert tb.dram.writes == [], f"{name} wrote {tb.dram.writes}"


def _illegal_word(rng, opcode):
    return rng.getrandbits(120) << 8 | opcode


@cocotb.test()
async def illegal_opcodes(dut):
    """Every opcode byte that is not an instruction, with random operand bits, at a random
    place in a program: ILLEGAL_OPCODE at that instruction."""
    tb = TB(dut, DRAM_SIZE)
    await tb.reset()
    rng = rng_for("illegal_opcodes")
    legal = {opcode.value for opcode in Opcode}
    illegal = [value for value in range(256) if value not in legal]
    if not FULL and "icarus" in cocotb.SIM_NAME.lower():
        illegal = [0, 0x09, 0x7F, 0x80, 0xFF] + rng.sample(illegal, 16)
    for opcode in illegal:
        position = rng.randrange(4)
        words = [GOOD] * position + [_illegal_word(rng, opcode)] + [END]
        tb.dram.write(PROG_ADDR, b"".join(w.to_bytes(INSTR_BYTES, "little") for w in words))
        outcome = await tb.run_program(PROG_ADDR, len(words), TIMEOUT)
        assert (outcome.error_code, outcome.error_pc) == (ErrorCode.ILLEGAL_OPCODE, position), \
            f"opcode {opcode:#04x} at {position}: {outcome}"
        assert dut.irq.value == 1


@cocotb.test()
async def range_and_length_limits(dut):
    """For every instruction that names local rows, the last legal row runs and one row past
    it fails with its range error; zero-length and oversized transfers fail with BAD_LENGTH,
    blocks past the top of the address space with DRAM_RANGE."""
    tb = TB(dut, DRAM_SIZE)
    await tb.reset()
    config = tb.config
    spad, acc = config.spad_depth, config.acc_depth
    spad_bytes, acc_bytes, cols = config.spad_row_bytes, config.acc_row_bytes, config.cols
    data, out = 0x4000, 0x8000

    def load_spad(local_addr, rows, row_bytes=1, dram_addr=data, stride=1):
        return encode(Opcode.LOAD_SPAD, local_addr=local_addr, rows=rows, row_bytes=row_bytes,
                      dram_addr=dram_addr, dram_stride=stride)

    def load_acc(local_addr, rows, row_bytes=4, dram_addr=data, stride=4):
        return encode(Opcode.LOAD_ACC, local_addr=local_addr, rows=rows, row_bytes=row_bytes,
                      dram_addr=dram_addr, dram_stride=stride)

    def matmul(spad_addr, acc_addr, rows):
        return encode(Opcode.MATMUL, spad_addr=spad_addr, acc_addr=acc_addr, rows=rows,
                      accumulate=1)

    def store(acc_addr, rows, row_bytes=4, opcode=Opcode.STORE, dram_addr=out, stride=None):
        return encode(opcode, acc_addr=acc_addr, rows=rows, row_bytes=row_bytes,
                      dram_addr=dram_addr,
                      dram_stride=row_bytes if stride is None else stride)

    def quant(row_bytes):
        return encode(Opcode.LOAD_QUANT, dram_addr=data, dram_stride=4 * cols,
                      row_bytes=row_bytes, zero_point=0, act_min=-128, act_max=127)

    last_row = min(8, spad)
    cases = [
        # (words, error code or None for done); every program ends with END.
        ([load_spad(spad - last_row, last_row)], None),
        ([load_spad(spad - last_row, last_row + 1)], ErrorCode.SPAD_RANGE),
        ([load_spad(0xFFFF, 2)], ErrorCode.SPAD_RANGE),
        ([load_spad(0, spad, spad_bytes, stride=spad_bytes)], None),      # the longest load
        ([load_acc(acc - 1, 1, acc_bytes)], None),
        ([load_acc(acc - 1, 2)], ErrorCode.ACC_RANGE),
        ([encode(Opcode.PRELOAD, spad_addr=spad - config.rows)], None),
        ([encode(Opcode.PRELOAD, spad_addr=spad - config.rows + 1)], ErrorCode.SPAD_RANGE),
        ([matmul(spad - 1, acc - 1, 1)], None),
        ([matmul(spad - 1, 0, 2)], ErrorCode.SPAD_RANGE),
        ([matmul(0, acc - 1, 2)], ErrorCode.ACC_RANGE),
        ([matmul(0, 0xFFFF, 1)], ErrorCode.ACC_RANGE),
        ([store(acc - 1, 1, acc_bytes)], None),
        ([store(acc - 1, 2)], ErrorCode.ACC_RANGE),
        ([store(acc - 1, 1, cols, Opcode.STORE_Q)], None),
        ([store(acc - 1, 2, 1, Opcode.STORE_Q)], ErrorCode.ACC_RANGE),
        # Zero-length and oversized transfers.
        ([load_spad(0, 0)], ErrorCode.BAD_LENGTH),
        ([load_spad(0, 1, 0)], ErrorCode.BAD_LENGTH),
        ([load_spad(0, 1, spad_bytes + 1)], ErrorCode.BAD_LENGTH),
        ([load_spad(0, 1, 0xFFFF)], ErrorCode.BAD_LENGTH),
        ([load_acc(0, 0)], ErrorCode.BAD_LENGTH),
        ([load_acc(0, 1, acc_bytes + 1)], ErrorCode.BAD_LENGTH),
        ([matmul(0, 0, 0)], ErrorCode.BAD_LENGTH),
        ([store(0, 0)], ErrorCode.BAD_LENGTH),
        ([store(0, 1, 0)], ErrorCode.BAD_LENGTH),
        ([store(0, 1, 2)], ErrorCode.BAD_LENGTH),
        ([store(0, 1, acc_bytes + 4)], ErrorCode.BAD_LENGTH),
        ([store(0, 1, 0, Opcode.STORE_Q)], ErrorCode.BAD_LENGTH),
        ([store(0, 1, cols + 1, Opcode.STORE_Q)], ErrorCode.BAD_LENGTH),
        ([quant(0)], ErrorCode.BAD_LENGTH),
        ([quant(4 * cols + 4)], ErrorCode.BAD_LENGTH),
        ([quant(2)], ErrorCode.BAD_LENGTH),
        # Blocks that run past the top of the 32-bit address space, and past the DRAM.
        ([load_spad(0, 2, 1, dram_addr=0xFFFF_FFFF, stride=1)], ErrorCode.DRAM_RANGE),
        ([load_spad(0, 3, 1, dram_addr=0x1000, stride=0x8000_0000)], ErrorCode.DRAM_RANGE),
        ([store(0, 2, 4, dram_addr=0xFFFF_FFF8, stride=8)], ErrorCode.DRAM_RANGE),
        ([load_spad(0, 2, 1, dram_addr=DRAM_SIZE - 1, stride=1)], ErrorCode.BUS_READ),
        ([load_spad(0, 1, 1, dram_addr=0xFFFF_FFFF, stride=0)], ErrorCode.BUS_READ),
        ([store(0, 2, 4, dram_addr=DRAM_SIZE - 4, stride=4)], ErrorCode.BUS_WRITE),
    ]
    for index, (words, code) in enumerate(cases):
        words = [GOOD] + words + [END]
        tb.dram.write(PROG_ADDR, b"".join(w.to_bytes(INSTR_BYTES, "little") for w in words))
        tb.dram.record_writes()
        outcome = await tb.run_program(PROG_ADDR, len(words), TIMEOUT)
        context = f"case {index} ({codec.decode(words[1])[0].name})"
        if code is None:
            assert outcome.done, f"{context}: {outcome}, expected done"
        else:
            assert (outcome.error_code, outcome.error_pc) == (code, 1), \
                f"{context}: {outcome}, expected {code.name} at 1"
            if code != ErrorCode.BUS_WRITE:
                assert tb.dram.writes == [], f"{context} wrote {tb.dram.writes}"
        assert dut.irq.value == 1
        outside = [(a, n) for a, n in tb.dram.writes if not out <= a < out + 0x1000
                   and not DRAM_SIZE - 4 <= a]
        assert outside == [], f"{context}: writes outside the destination: {outside}"


@cocotb.test()
async def program_address_faults(dut):
    """A program address that is not 16-byte aligned ends in PROGRAM before any fetch; one
    outside the DRAM, or a program that runs off its end, in BUS_READ at that instruction;
    one whose length reaches past 4 GiB in PROGRAM."""
    tb = TB(dut, DRAM_SIZE)
    await tb.reset()
    tb.dram.write(PROG_ADDR, b"".join(w.to_bytes(INSTR_BYTES, "little") for w in [END] * 2))
    tb.dram.write(DRAM_SIZE - 32, b"".join(w.to_bytes(INSTR_BYTES, "little")
                                           for w in [GOOD, GOOD]))
    cases = [(PROG_ADDR + offset, 1, ErrorCode.PROGRAM, 0) for offset in range(1, 16)]
    cases += [
        (DRAM_SIZE, 1, ErrorCode.BUS_READ, 0),
        (0x8000_0000, 4, ErrorCode.BUS_READ, 0),
        (DRAM_SIZE - 32, 5, ErrorCode.BUS_READ, 2),        # runs off the end of the DRAM
        (DRAM_SIZE - 32, 2, ErrorCode.PROGRAM, 2),         # no END within PROG_LEN
        (0xFFFF_FFF0, 2, ErrorCode.PROGRAM, 0),            # reaches past 4 GiB
        (PROG_ADDR, 0, ErrorCode.PROGRAM, 0),
        (PROG_ADDR, 0xFFFF_FFFF, ErrorCode.PROGRAM, 0),
    ]
    for prog_addr, prog_len, code, error_pc in cases:
        outcome = await tb.run_program(prog_addr, prog_len, TIMEOUT)
        assert (outcome.error_code, outcome.error_pc) == (code, error_pc), \
            f"program at {prog_addr:#x}, length {prog_len}: {outcome}"
        assert dut.irq.value == 1
    outcome = await tb.run_program(PROG_ADDR, 1, TIMEOUT)
    assert outcome.done, outcome


async def _wait_not_busy(tb, context, polls=2000):
    for _ in range(polls):
        if not (await tb.read_reg(Reg.STATUS)) & Status.BUSY:
            return
    raise AssertionError(f"{context}: still busy {polls} STATUS reads after a soft reset")


@cocotb.test()
async def soft_reset_mid_program(dut):
    """A soft reset at a random cycle of a running GEMM stops it: STATUS 0, irq low, no
    write after the reset has taken effect; then the same GEMM runs bit-exactly."""
    tb = TB(dut, DRAM_SIZE)
    await tb.reset()
    rng = rng_for("soft_reset_mid_program")
    gemm = small_gemm(tb, rng)
    clean = await gemm.run_exact(tb, "before any soft reset")
    for case in range(12 if FULL else 5):
        delay = rng.randrange(1, clean.cycles)
        context = f"soft reset {delay} cycles after start"
        gemm.load(tb)
        tb.dram.record_writes()
        await tb.start(gemm.layout.program_addr, len(gemm.words))
        await ClockCycles(dut.clk, delay)
        await tb.write_reg(Reg.CONTROL, Control.SOFT_RESET)
        await _wait_not_busy(tb, context)
        await tb.dram.fetch()
        writes = list(tb.dram.writes)
        await ClockCycles(dut.clk, 200)
        status = await tb.read_reg(Reg.STATUS)
        assert status == 0, f"{context}: STATUS {status:#x}"
        assert dut.irq.value == 0, f"{context}: irq high after the soft reset"
        await tb.dram.fetch()
        assert tb.dram.writes == writes, f"{context}: writes after the soft reset"
        assert_writes_inside(tb.dram.writes, [(gemm.layout.c_addr,
                                               gemm.layout.c_addr + gemm.layout.c_bytes)],
                             context)
        await gemm.run_exact(tb, f"{context}, the GEMM after it")


@cocotb.test()
async def start_while_busy_in_a_gemm(dut):
    """A second start at a random moment of a running GEMM ends it with START_BUSY before its
    next instruction (``ERROR_PC`` = the instructions issued, 0 if none has): no bus transaction is cut (the checker would say), nothing is written
    outside C, and the GEMM then runs bit-exactly."""
    tb = TB(dut, DRAM_SIZE)
    await tb.reset()
    rng = rng_for("start_while_busy_in_a_gemm")
    gemm = small_gemm(tb, rng)
    clean = await gemm.run_exact(tb, "without a second start")
    c_region = [(gemm.layout.c_addr, gemm.layout.c_addr + gemm.layout.c_bytes)]
    for case in range(8 if FULL else 3):
        delay = rng.randrange(1, clean.cycles * 3 // 4)
        context = f"start again {delay} cycles after the first"
        gemm.load(tb)
        tb.dram.record_writes()
        await tb.start(gemm.layout.program_addr, len(gemm.words))
        await ClockCycles(dut.clk, delay)
        assert (await tb.read_reg(Reg.STATUS)) & Status.BUSY, f"{context}: not busy"
        await tb.write_reg(Reg.CONTROL, Control.START)
        await tb.wait_irq(TIMEOUT)
        outcome = await tb.outcome()
        assert outcome.error_code == ErrorCode.START_BUSY, f"{context}: {outcome}"
        # ERROR_PC is the instruction the program stopped before (the register map): the
        # number issued so far, 0 when the second start came before the first issued (a
        # delay shorter than the fetch, which the draw allows).
        assert 0 <= outcome.error_pc < len(gemm.words), f"{context}: {outcome}"
        assert outcome.error_pc == outcome.perf["instructions"], \
            f"{context}: {outcome}, {outcome.perf['instructions']} instructions issued"
        assert_writes_inside(tb.dram.writes, c_region, context)
        await gemm.run_exact(tb, f"{context}, the GEMM after it")


@cocotb.test()
async def program_registers_written_while_busy(dut):
    """A host that writes PROG_ADDR and PROG_LEN for its next program while the current one
    runs (without starting it) must not disturb the running program: the controller latched
    them at start. The registers read back the new values, and the next start runs them."""
    tb = TB(dut, DRAM_SIZE)
    await tb.reset()
    rng = rng_for("program_registers_written_while_busy")
    gemm = small_gemm(tb, rng)
    clean = await gemm.run_exact(tb, "alone")
    gemm.load(tb)
    other = DRAM_SIZE - 16
    tb.dram.write(other, END.to_bytes(INSTR_BYTES, "little"))
    await tb.start(gemm.layout.program_addr, len(gemm.words))
    await ClockCycles(dut.clk, clean.cycles // 3)
    assert (await tb.read_reg(Reg.STATUS)) & Status.BUSY
    await tb.write_reg(Reg.PROG_ADDR, other)
    await tb.write_reg(Reg.PROG_LEN, 1)
    await tb.wait_irq(TIMEOUT)
    outcome = await tb.outcome()
    assert outcome.done and outcome.pc == len(gemm.words) - 1, \
        f"the running GEMM ended {outcome} at PC {outcome.pc}; its END is at " \
        f"{len(gemm.words) - 1}"
    assert np.array_equal(gemm.c(tb), gemm.expected), "C differs"
    assert await tb.read_reg(Reg.PROG_ADDR) == other
    assert await tb.read_reg(Reg.PROG_LEN) == 1
    await tb.write_reg(Reg.CONTROL, Control.START)
    await tb.wait_irq(TIMEOUT)
    outcome = await tb.outcome()
    assert outcome.done and outcome.pc == 0 and outcome.perf["instructions"] == 1, \
        f"the program at PROG_ADDR {other:#x} (one END) ended {outcome}"


@cocotb.test()
async def protocol_violation_is_reported(dut):
    """The protocol checker's report reaches the test: a write response that the DRAM model
    sends with no write outstanding is a violation (B_UNEXPECTED)."""
    tb = TB(dut, DRAM_SIZE)
    await tb.reset()
    tb.axi_check.stop()
    assert tb.axi_check.violation() is None
    await tb.dram.send_bad_write_response()
    message = await tb.axi_check.wait_violation(timeout_cycles=100)
    assert "B_UNEXPECTED" in message and "write response" in message, message
    await RisingEdge(dut.clk)


#: The watchdog's limit in :func:`bus_timeout_then_soft_reset`, in cycles.
WATCHDOG_LIMIT = 300


@cocotb.skipif(dram_from_env() != "cocotbext",
               reason="needs a DRAM that can stop answering (cocotbext-axi's; "
                      "tb/test_faults.py::test_bus_timeout_on_the_rtl runs it with one)")
@cocotb.test()
async def bus_timeout_then_soft_reset(dut):
    """A DRAM that stops taking read addresses (cocotbext-axi's, paused; the HDL DRAM cannot
    stall for ever, so the test is skipped with it, as cocotb reports): the GEMM's first fetch gets no
    answer and the program ends with BUS_TIMEOUT at instruction 0 within the watchdog's
    limit and a few cycles, the checker excusing the address left outstanding; a start
    before the soft reset ends at once; the soft reset goes ahead, and the GEMM then runs
    bit-exactly."""
    tb = TB(dut, DRAM_SIZE)
    await tb.reset()
    rng = rng_for("bus_timeout_then_soft_reset")
    gemm = small_gemm(tb, rng)
    assert await tb.read_reg(Reg.WATCHDOG) == 1 << 20
    await tb.write_reg(Reg.WATCHDOG, WATCHDOG_LIMIT)
    assert await tb.read_reg(Reg.WATCHDOG) == WATCHDOG_LIMIT
    gemm.load(tb)
    ar_channel = tb.dram.read_if.ar_channel
    ar_channel.pause = True
    await tb.start(gemm.layout.program_addr, len(gemm.words))
    # The start's write response comes before the first fetch's address: the bound counts
    # from here.
    await tb.wait_irq(WATCHDOG_LIMIT + 20)
    outcome = await tb.outcome()
    assert outcome.error_code == ErrorCode.BUS_TIMEOUT and outcome.error_pc == 0, outcome
    assert await tb.read_reg(Reg.IRQ_PENDING) == 2
    await tb.write_reg(Reg.CONTROL, Control.START)
    await tb.wait_irq(100)
    assert (await tb.outcome()).error_code == ErrorCode.BUS_TIMEOUT
    await tb.write_reg(Reg.CONTROL, Control.SOFT_RESET)
    await _wait_not_busy(tb, "the soft reset after a bus timeout")
    assert await tb.read_reg(Reg.STATUS) == 0 and dut.irq.value == 0
    ar_channel.pause = False
    await gemm.run_exact(tb, "the GEMM after the bus timeout's soft reset")
