"""cocotb tests of the NPU top level that talk to its registers directly.

Run by ``tb/test_rtl.py`` through :func:`sim.runner.run_cocotb`, under Verilator and Icarus.
GEMMs go through the driver (``sim.job``); these tests cover what the driver does not see.
"""

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles

from hw.isa import MAGIC, VERSION, Control, ErrorCode, Opcode, Reg, Status, encode
from sim.bench import TB


PROG_ADDR = 0x100
DRAM_SIZE = 0x4000


def write_program(tb, words, addr=PROG_ADDR):
    tb.dram.write(addr, b"".join(word.to_bytes(16, "little") for word in words))


@cocotb.test()
async def identification(dut):
    """The registers report exactly the configuration the Verilog was built for."""
    tb = TB(dut, DRAM_SIZE)
    await tb.reset()
    config = tb.config
    assert await tb.read_reg(Reg.MAGIC) == MAGIC
    assert await tb.read_reg(Reg.VERSION) == VERSION
    assert await tb.read_reg(Reg.SHAPE) == config.rows | (config.cols << 16)
    assert await tb.read_reg(Reg.SPAD_DEPTH) == config.spad_depth
    assert await tb.read_reg(Reg.ACC_DEPTH) == config.acc_depth
    assert await tb.read_reg(Reg.BUS_WIDTH) == config.bus_width
    assert await tb.read_reg(Reg.STATUS) == 0
    assert dut.irq.value == 0


@cocotb.test()
async def errors_end_with_status_and_irq(dut):
    """Each bad program ends in its error code, at its instruction, with the interrupt."""
    tb = TB(dut, DRAM_SIZE)
    await tb.reset()
    config = tb.config
    load_ok = encode(Opcode.LOAD_SPAD, local_addr=0, rows=1, row_bytes=1,
                     dram_addr=0x2000, dram_stride=0)
    cases = [
        ([load_ok, 0], ErrorCode.ILLEGAL_OPCODE, 1),
        ([load_ok, load_ok, encode(Opcode.END) | 0x7F], ErrorCode.ILLEGAL_OPCODE, 2),
        ([encode(Opcode.LOAD_SPAD, local_addr=config.spad_depth - 1, rows=2, row_bytes=1,
                 dram_addr=0x2000, dram_stride=1)], ErrorCode.SPAD_RANGE, 0),
        ([encode(Opcode.MATMUL, spad_addr=0, acc_addr=config.acc_depth, rows=1,
                 accumulate=0)], ErrorCode.ACC_RANGE, 0),
        ([encode(Opcode.STORE, acc_addr=0, rows=1, row_bytes=3, dram_addr=0x2000,
                 dram_stride=0)], ErrorCode.BAD_LENGTH, 0),
        ([encode(Opcode.LOAD_SPAD, local_addr=0, rows=0, row_bytes=1, dram_addr=0x2000,
                 dram_stride=0)], ErrorCode.BAD_LENGTH, 0),
        ([encode(Opcode.LOAD_ACC, local_addr=0, rows=2, row_bytes=4, dram_addr=0xFFFF_FFFC,
                 dram_stride=4)], ErrorCode.DRAM_RANGE, 0),
        ([load_ok, load_ok], ErrorCode.PROGRAM, 2),
    ]
    for words, code, pc in cases:
        write_program(tb, words)
        outcome = await tb.run_program(PROG_ADDR, len(words), timeout_cycles=10_000)
        assert outcome.error and not outcome.done, outcome
        assert outcome.error_code == code, f"{words}: {outcome}"
        assert outcome.error_pc == pc, f"{words}: {outcome}"
        assert dut.irq.value == 1

    # A program address that is not 16-byte aligned, and a program of length zero.
    for addr, length in [(PROG_ADDR + 8, 1), (PROG_ADDR, 0)]:
        outcome = await tb.run_program(addr, length, timeout_cycles=1_000)
        assert outcome.error_code == ErrorCode.PROGRAM, outcome
        assert outcome.error_pc == 0


@cocotb.test()
async def soft_reset_then_run(dut):
    """After a soft reset in the middle of a program, the next program runs normally."""
    tb = TB(dut, DRAM_SIZE)
    await tb.reset()
    long_load = encode(Opcode.LOAD_SPAD, local_addr=0, rows=min(64, tb.config.spad_depth),
                       row_bytes=1, dram_addr=0x2000, dram_stride=16)
    write_program(tb, [long_load] * 8 + [encode(Opcode.END)])
    await tb.start(PROG_ADDR, 9)
    await ClockCycles(dut.clk, 40)
    assert (await tb.read_reg(Reg.STATUS)) & Status.BUSY
    await tb.write_reg(Reg.CONTROL, Control.SOFT_RESET)
    for _ in range(2000):
        if not (await tb.read_reg(Reg.STATUS)) & Status.BUSY:
            break
    status = await tb.read_reg(Reg.STATUS)
    assert status == 0, f"STATUS after soft reset is {status:#x}"

    write_program(tb, [encode(Opcode.END)])
    outcome = await tb.run_program(PROG_ADDR, 1, timeout_cycles=1_000)
    assert outcome.done and outcome.error_code == ErrorCode.NONE, outcome
    assert outcome.instructions == 1


@cocotb.test()
async def bus_errors(dut):
    """Reads and writes outside DRAM are answered SLVERR and end in BUS_READ / BUS_WRITE."""
    tb = TB(dut, DRAM_SIZE)
    await tb.reset()
    cases = [
        ([encode(Opcode.LOAD_SPAD, local_addr=0, rows=2, row_bytes=1,
                 dram_addr=DRAM_SIZE - 1, dram_stride=1)], ErrorCode.BUS_READ, 0),
        ([encode(Opcode.END)], ErrorCode.BUS_READ, 0),   # fetched from outside DRAM
        ([encode(Opcode.STORE, acc_addr=0, rows=1, row_bytes=4, dram_addr=DRAM_SIZE,
                 dram_stride=0)], ErrorCode.BUS_WRITE, 0),
    ]
    for index, (words, code, pc) in enumerate(cases):
        addr = DRAM_SIZE + 0x100 if index == 1 else PROG_ADDR
        if index != 1:
            write_program(tb, words, addr)
        outcome = await tb.run_program(addr, len(words), timeout_cycles=10_000)
        assert outcome.error_code == code and outcome.error_pc == pc, f"{words}: {outcome}"
    # The last byte of DRAM is still readable, and a normal program still runs.
    write_program(tb, [encode(Opcode.LOAD_SPAD, local_addr=0, rows=1, row_bytes=1,
                              dram_addr=DRAM_SIZE - 1, dram_stride=0), encode(Opcode.END)])
    outcome = await tb.run_program(PROG_ADDR, 2, timeout_cycles=10_000)
    assert outcome.done, outcome


@cocotb.test()
async def start_while_busy(dut):
    """A second start while a program runs ends it with START_BUSY at an instruction
    boundary; the next program then runs normally."""
    tb = TB(dut, DRAM_SIZE)
    await tb.reset()
    load = encode(Opcode.LOAD_SPAD, local_addr=0, rows=min(32, tb.config.spad_depth),
                  row_bytes=1, dram_addr=0x2000, dram_stride=16)
    write_program(tb, [load] * 8 + [encode(Opcode.END)])
    await tb.start(PROG_ADDR, 9)
    await ClockCycles(dut.clk, 30)
    await tb.write_reg(Reg.CONTROL, Control.START)
    await tb.wait_irq(10_000)
    outcome = await tb.outcome()
    assert outcome.error_code == ErrorCode.START_BUSY, outcome
    assert 1 <= outcome.error_pc < 9, outcome

    write_program(tb, [encode(Opcode.END)])
    outcome = await tb.run_program(PROG_ADDR, 1, timeout_cycles=1_000)
    assert outcome.done, outcome


@cocotb.test()
async def program_registers_by_byte(dut):
    """PROG_ADDR and PROG_LEN read back what was written, byte lanes by their strobes; a
    write to CONTROL without its low byte's strobe neither starts nor resets."""
    tb = TB(dut, DRAM_SIZE)
    await tb.reset()
    for reg in (Reg.PROG_ADDR, Reg.PROG_LEN):
        for value in (0xFFFF_FFFF, 0, 0x12345678):          # every bit both ways
            await tb.write_reg(reg, value)
            assert await tb.read_reg(reg) == value, f"{reg.name} = {value:#x}"
        value = 0x12345678
        for lane, byte in enumerate([0xA1, 0xB2, 0xC3, 0xD4]):
            await tb.host.write(reg + lane, bytes([byte]))        # wstrb = 1 << lane
            value = (value & ~(0xFF << 8 * lane)) | byte << 8 * lane
            got = await tb.read_reg(reg)
            assert got == value, f"{reg.name} after byte {lane}: {got:#x}, expected {value:#x}"

    write_program(tb, [encode(Opcode.END)])
    await tb.write_reg(Reg.PROG_ADDR, PROG_ADDR)
    await tb.write_reg(Reg.PROG_LEN, 1)
    await tb.host.write(Reg.CONTROL + 1, bytes([Control.START | Control.SOFT_RESET]))
    await ClockCycles(dut.clk, 20)
    assert await tb.read_reg(Reg.STATUS) == 0
    assert dut.irq.value == 0
    outcome = await tb.run_program(PROG_ADDR, 1, timeout_cycles=1_000)
    assert outcome.done, outcome
