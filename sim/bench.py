"""The cocotb test bench of the NPU top level: DRAM, host and clock around the DUT.

In the shape of cocotbext-axi's and taxi's benches: a :class:`TB` owns the clock, the reset
and the bus models (cocotbext-axi's slave models as DRAM on ``m_axi_*``, ``AxiLiteMaster`` as the host on
``s_axil_*``), and the tests are plain ``async def`` functions that use it.
"""

import json
import logging
import os

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, with_timeout
from cocotbext.axi import AxiBus, AxiLiteBus, AxiLiteMaster, AxiSlaveRead, AxiSlaveWrite
from cocotbext.axi.memory import Memory

from hw.config import NPUConfig
from hw.isa import MAGIC, Control, ErrorCode, Reg, Status


__all__ = ["TB", "Dram", "ProgramOutcome", "config_from_env"]


CLOCK_NS = 10


def config_from_env():
    """The :class:`NPUConfig` the runner built this simulation for."""
    return NPUConfig(**json.loads(os.environ["NPU_CONFIG"]))


class _DramRead(AxiSlaveRead):
    async def _read(self, address, length):
        # cocotbext-axi answers SLVERR for a beat whose read raises.
        if address + length > self.target.size:
            raise IndexError(f"read of {length} bytes at {address:#x} is outside DRAM")
        return self.target.read(address, length)


class _DramWrite(AxiSlaveWrite):
    async def _write(self, address, data):
        if address + len(data) > self.target.size:
            raise IndexError(f"write of {len(data)} bytes at {address:#x} is outside DRAM")
        self.target.write(address, data)


class Dram(Memory):
    """DRAM behind an AXI4 slave: cocotbext-axi's slave models over a :class:`Memory`.

    Unlike ``AxiRam``, which wraps addresses around its size, a beat outside the DRAM is
    answered SLVERR, as a real interconnect answers an unmapped address with an error.
    """
    def __init__(self, bus, clock, reset, size):
        super().__init__(size)
        self.write_if = _DramWrite(bus.write, clock, reset, target=self)
        self.read_if = _DramRead(bus.read, clock, reset, target=self)


class ProgramOutcome:
    """Status registers read back after a program ended."""
    def __init__(self, status, error_pc, pc, cycles):
        self.status = status
        self.done = bool(status & Status.DONE)
        self.error = bool(status & Status.ERROR)
        self.error_code = ErrorCode((status >> Status.CODE_SHIFT) & 0xFF)
        self.error_pc = error_pc
        self.pc = pc
        self.cycles = cycles

    @property
    def instructions(self):
        """Instructions completed: through END when done, before the failing one otherwise."""
        return self.pc + 1 if self.done else self.error_pc

    def __repr__(self):
        return (f"ProgramOutcome(done={self.done}, error={self.error_code.name}, "
                f"error_pc={self.error_pc}, cycles={self.cycles})")


class TB:
    """Clock, reset, DRAM and host around the NPU top level.

    Parameters
    ----------
    dut : cocotb handle of ``npu_top``
    dram_size : int
        Bytes of DRAM behind the AXI4 master; accesses beyond it are answered DECERR.
    """
    def __init__(self, dut, dram_size):
        self.dut = dut
        self.config = config_from_env()
        self.log = logging.getLogger("cocotb.tb")
        self.log.setLevel(logging.INFO)
        # Icarus leaves undriven inputs at Z; every input is driven from time zero.
        dut.rst.value = 1
        self.clock = Clock(dut.clk, CLOCK_NS, unit="ns")
        self.clock.start()
        self.dram = Dram(AxiBus.from_prefix(dut, "m_axi"), dut.clk, dut.rst, size=dram_size)
        self.host = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.clk, dut.rst)

    async def reset(self):
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 4)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 2)
        magic = await self.host.read_dword(Reg.MAGIC)
        assert magic == MAGIC, f"MAGIC reads {magic:#x}, expected {MAGIC:#x}"

    async def read_reg(self, reg):
        return await self.host.read_dword(reg)

    async def write_reg(self, reg, value):
        await self.host.write_dword(reg, value)

    async def start(self, prog_addr, prog_len):
        await self.write_reg(Reg.PROG_ADDR, prog_addr)
        await self.write_reg(Reg.PROG_LEN, prog_len)
        await self.write_reg(Reg.CONTROL, Control.START)

    async def wait_irq(self, timeout_cycles):
        """Sleep until the interrupt; Python does nothing while the hardware runs."""
        if not self.dut.irq.value:
            await with_timeout(RisingEdge(self.dut.irq), timeout_cycles * CLOCK_NS, "ns")

    async def outcome(self):
        status = await self.read_reg(Reg.STATUS)
        error_pc = await self.read_reg(Reg.ERROR_PC)
        pc = await self.read_reg(Reg.PC)
        cycles = await self.read_reg(Reg.CYCLES_LO)
        cycles |= (await self.read_reg(Reg.CYCLES_HI)) << 32
        return ProgramOutcome(status, error_pc, pc, cycles)

    async def run_program(self, prog_addr, prog_len, timeout_cycles=10_000_000):
        await self.start(prog_addr, prog_len)
        await self.wait_irq(timeout_cycles)
        outcome = await self.outcome()
        self.log.info("program at %#x: %r", prog_addr, outcome)
        return outcome
