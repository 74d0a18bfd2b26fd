"""The instruction-level model and the RTL agree on random programs, bit for bit.

Random instruction streams (every opcode, random operands, now and then one that is out of
range) run on ``sw.model`` and on the generated Verilog; the outcome (done or the error code
and its instruction) and the whole DRAM afterwards must be identical. This is what makes the
model a trustworthy stand-in for the RTL in the compiler's fast tests.
"""

import os

import numpy as np
import pytest

from hw.config import NPUConfig
from hw.isa import Opcode
from sw import codec
from sw.backend import run_programs


pytestmark = pytest.mark.rtl

DRAM_SIZE = 0x4000
PROG_ADDR = 0x100
DATA = 0x1000          # random bytes to load from
QUANT = 0x2000         # valid requantization parameter rows
OUTPUT = 0x2800        # stores land here, away from the program
BASE_SEED = int(os.environ.get("NPU_SEED", "7"))


def random_program(config, rng, length):
    r, c = config.rows, config.cols
    words = []
    for _ in range(length):
        wild = rng.random() < 0.04          # an operand that may be out of range
        op = rng.choice([Opcode.LOAD_SPAD, Opcode.LOAD_ACC, Opcode.PRELOAD, Opcode.MATMUL,
                         Opcode.STORE, Opcode.LOAD_QUANT, Opcode.STORE_Q],
                        p=[0.22, 0.1, 0.12, 0.22, 0.12, 0.08, 0.14])
        rows = int(rng.integers(1, 6))
        if op in (Opcode.LOAD_SPAD, Opcode.LOAD_ACC):
            width = config.spad_row_bytes if op == Opcode.LOAD_SPAD else config.acc_row_bytes
            depth = config.spad_depth if op == Opcode.LOAD_SPAD else config.acc_depth
            fields = dict(local_addr=int(rng.integers(0, depth - rows + 1)), rows=rows,
                          row_bytes=int(rng.integers(1, width + 1)),
                          dram_addr=DATA + int(rng.integers(0, 0x800)),
                          dram_stride=int(rng.integers(0, 40)))
            if wild:
                fields["dram_addr"] = DRAM_SIZE - int(rng.integers(0, 8))
        elif op == Opcode.PRELOAD:
            fields = dict(spad_addr=int(rng.integers(0, config.spad_depth - r + 1 + wild)))
        elif op == Opcode.MATMUL:
            fields = dict(spad_addr=int(rng.integers(0, config.spad_depth - rows + 1)),
                          acc_addr=int(rng.integers(0, config.acc_depth - rows + 1 + wild)),
                          rows=rows, accumulate=int(rng.integers(0, 2)))
        elif op == Opcode.LOAD_QUANT:
            fields = dict(dram_addr=QUANT, dram_stride=4 * c,
                          row_bytes=4 * int(rng.integers(1, c + 1)),
                          zero_point=int(rng.integers(-128, 128)),
                          act_min=int(rng.integers(-128, 0)), act_max=int(rng.integers(0, 128)))
            if wild:
                fields["act_min"], fields["act_max"] = 10, 9
        else:
            lanes = c if op == Opcode.STORE_Q else 4 * c
            fields = dict(acc_addr=int(rng.integers(0, config.acc_depth - rows + 1)),
                          rows=rows, row_bytes=int(rng.integers(1, lanes + 1)),
                          dram_addr=OUTPUT + int(rng.integers(0, 0x400)),
                          dram_stride=int(rng.integers(0, 70)))
            if op == Opcode.STORE:
                fields["row_bytes"] = 4 * -(-fields["row_bytes"] // 4)
            if wild:
                fields["row_bytes"] += 1 + 3 * (op == Opcode.STORE)
        words.append(codec.encode(op, **fields))
    words.append(codec.encode(Opcode.END))
    return words


def dram_image(config, rng, words):
    dram = np.zeros(DRAM_SIZE, np.uint8)
    dram[DATA:QUANT] = rng.integers(0, 256, QUANT - DATA, dtype=np.uint8)
    c = config.cols
    multipliers = rng.integers(-(1 << 31), 1 << 31, c, dtype=np.int64).astype("<i4")
    shifts = rng.integers(-31, 32, c).astype("<i4")
    dram[QUANT:QUANT + 4 * c] = multipliers.view(np.uint8)
    dram[QUANT + 4 * c:QUANT + 8 * c] = shifts.view(np.uint8)
    program = codec.pack_words(words)
    dram[PROG_ADDR:PROG_ADDR + len(program)] = np.frombuffer(program, np.uint8)
    return dram


@pytest.mark.parametrize("sim", ["verilator", "icarus"])
@pytest.mark.parametrize("config", [NPUConfig(rows=2, cols=3, spad_depth=32, acc_depth=16,
                                              bus_width=32),
                                    NPUConfig(rows=4, cols=4, spad_depth=64, acc_depth=16,
                                              bus_width=128)],
                         ids=["2x3-bus32", "4x4-bus128"])
def test_model_matches_rtl(sim, config):
    seed = BASE_SEED + config.rows * 100 + (sim == "icarus")
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    count = 12 if sim == "verilator" else 6
    programs = []
    for _ in range(count):
        words = random_program(config, rng, int(rng.integers(5, 40)))
        programs.append((dram_image(config, rng, words), PROG_ADDR, len(words)))
    rtl = run_programs(config, sim, programs)
    # Each RTL program met the scratchpad, accumulator and weights its predecessor left: the
    # model runs the same sequence on one machine.
    from sw.model import ModelNPU
    model = ModelNPU(config)
    for index, ((dram, prog_addr, prog_len), got) in enumerate(zip(programs, rtl)):
        want = model.run(dram, prog_addr, prog_len, reset=False) if index else \
            model.run(dram, prog_addr, prog_len)
        context = f"program {index} (seed {seed}, {sim}, {config.name})"
        assert (got.done, got.error_code, got.error_pc) == \
            (want.done, want.error_code, want.error_pc), context
        assert got.instructions == want.instructions, context
        assert np.array_equal(got.dram, want.dram), \
            f"{context}: DRAM differs at {np.flatnonzero(got.dram != want.dram)[:8]}"
