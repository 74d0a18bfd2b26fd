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
from hw.isa import ErrorCode, Opcode
from sim.runner import run_programs as run_rtl_programs
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
    from sw.model import ModelNPU
    probe = ModelNPU(config)
    for _ in range(count):
        words = random_program(config, rng, int(rng.integers(5, 40)))
        programs.append((dram_image(config, rng, words), PROG_ADDR, len(words)))
        if not probe.run(programs[-1][0], PROG_ADDR, len(words), reset=False).done:
            # After an error the local state is not part of the contract: set it again.
            resync = resync_program(config)
            image = dram_image(config, rng, resync)
            image[ZEROS:ZEROS + 0x200] = 0
            programs.append((image, PROG_ADDR, len(resync)))
            probe.run(image, PROG_ADDR, len(resync), reset=False)
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


# ---------------------------------------------------------------------- random words
# Instruction streams of random 128-bit words: whatever they hold, the controller ends each in
# done or an error within the cycle bound of tb/cycle_bound.py, exactly as the model does.

ZEROS = 0x3000          # a zeroed block the resynchronising program loads from


def _plausible(config, rng, opcode, name):
    """A value the field could mean for ``opcode``: mostly in range, now and then just past
    a limit (a memory's last row, a row's width, the end of the DRAM, the top of 4 GiB)."""
    edge = rng.random() < 0.15
    if name in ("local_addr", "spad_addr", "acc_addr"):
        depth = config.acc_depth if name == "acc_addr" or opcode == Opcode.LOAD_ACC \
            else config.spad_depth
        return depth - int(rng.integers(0, 3)) if edge else int(rng.integers(0, depth // 2))
    if name == "rows":
        return int(rng.integers(0, 3)) if edge else int(rng.integers(1, 9))
    if name == "row_bytes":
        width = {Opcode.LOAD_SPAD: config.spad_row_bytes, Opcode.STORE_Q: config.cols}.get(
            opcode, config.acc_row_bytes)
        value = int(rng.integers(1, width + 1))
        if opcode in (Opcode.STORE, Opcode.LOAD_QUANT) and not edge:
            value = 4 * -(-value // 4)
        return width + int(rng.integers(0, 5)) if edge else value
    if name == "dram_addr":
        if edge:
            return int(rng.choice([DRAM_SIZE - int(rng.integers(0, 24)),
                                   (1 << 32) - int(rng.integers(1, 64))]))
        return int(rng.integers(DATA, DRAM_SIZE - 0x200))
    if name == "dram_stride":
        return int(rng.choice([0x1000_0000, 0x8000_0000])) if edge \
            else int(rng.integers(0, 48))
    if name == "zero_point":
        return int(rng.integers(-130, 130)) if edge else int(rng.integers(-128, 128))
    if name == "act_min":
        return int(rng.integers(-128, 128)) if edge else int(rng.integers(-128, 0))
    if name == "act_max":
        return int(rng.integers(-128, 128)) if edge else int(rng.integers(0, 128))
    return int(rng.integers(0, 2))


def random_word(config, rng):
    """Random bits; half the time with a legal opcode, and then mostly with operands that
    pass some or all of the checks, so that instructions get past decode and move data."""
    word = int.from_bytes(rng.bytes(16), "little")
    if rng.random() < 0.3:
        return word
    opcode = Opcode(int(rng.choice([op.value for op in Opcode])))
    word = (word & ~0xFF) | opcode.value
    if rng.random() < 0.2:
        return word
    for spec in codec.FIELDS[opcode]:
        if rng.random() < 0.9:
            value = _plausible(config, rng, opcode, spec.name) & spec.mask
            word = (word & ~(spec.mask << spec.offset)) | (value << spec.offset)
    return word


def resync_program(config):
    """Zero every scratchpad and accumulator row, the weights and the requantization state,
    in the RTL and the model alike. After an error the local state is not part of the
    contract (docs/architecture.md): a load that fails part-way has delivered rows, and
    instructions after a failing load or store may have run on the local memories."""
    return [codec.encode(Opcode.LOAD_SPAD, local_addr=0, rows=config.spad_depth,
                         row_bytes=config.spad_row_bytes, dram_addr=ZEROS, dram_stride=0),
            codec.encode(Opcode.LOAD_ACC, local_addr=0, rows=config.acc_depth,
                         row_bytes=config.acc_row_bytes, dram_addr=ZEROS, dram_stride=0),
            codec.encode(Opcode.PRELOAD, spad_addr=0),
            codec.encode(Opcode.MATMUL, spad_addr=0, acc_addr=0, rows=1, accumulate=0),
            codec.encode(Opcode.LOAD_QUANT, dram_addr=ZEROS, dram_stride=0,
                         row_bytes=4 * config.cols, zero_point=0, act_min=-128, act_max=127),
            codec.encode(Opcode.END)]


def _image(config, rng, words):
    dram = dram_image(config, rng, [codec.encode(Opcode.END)])
    dram[ZEROS:ZEROS + 0x200] = 0
    program = codec.pack_words(words)
    dram[PROG_ADDR:PROG_ADDR + len(program)] = np.frombuffer(program, np.uint8)
    return dram


def _word_at(dram, pc):
    start = PROG_ADDR + 16 * pc
    return int.from_bytes(dram[start:start + 16].tobytes(), "little")


def _store_block(word):
    """``[start, end)`` of the DRAM a store may have written before it failed."""
    _, fields = codec.decode(word)
    end = fields["dram_addr"] + (fields["rows"] - 1) * fields["dram_stride"] + \
        fields["row_bytes"]
    return fields["dram_addr"], min(end, DRAM_SIZE)


DIFFERENTIAL_CONFIGS = [NPUConfig(rows=2, cols=3, spad_depth=32, acc_depth=16, bus_width=32),
                        NPUConfig(rows=4, cols=4, spad_depth=64, acc_depth=16, bus_width=128)]
# (simulator, config index, back-pressure seed); the second group runs with NPU_FULL=1.
RANDOM_WORD_CASES = [("verilator", 0, None), ("icarus", 1, None)]
RANDOM_WORD_FULL_CASES = [("verilator", 1, None), ("verilator", 0, 3), ("verilator", 1, 4),
                          ("icarus", 0, None), ("icarus", 1, 5)]
if os.environ.get("NPU_FULL") == "1":
    RANDOM_WORD_CASES += RANDOM_WORD_FULL_CASES


@pytest.mark.parametrize("sim, config_index, backpressure", RANDOM_WORD_CASES,
                         ids=[f"{sim}-{DIFFERENTIAL_CONFIGS[index].name}"
                              f"-bus{DIFFERENTIAL_CONFIGS[index].bus_width}"
                              + (f"-bp{bp}" if bp is not None else "")
                              for sim, index, bp in RANDOM_WORD_CASES])
def test_random_words(sim, config_index, backpressure, monkeypatch, request):
    """Random 128-bit words never hang the controller: every program ends in done or an
    error within its cycle bound, with the model's outcome and the model's DRAM."""
    from cycle_bound import WAIT, WAIT_BACKPRESSURE, instruction_bound, program_bound
    from sw.model import ModelNPU

    config = DIFFERENTIAL_CONFIGS[config_index]
    seed = BASE_SEED + 1000 + 10 * config_index + (sim == "icarus") + \
        100 * (backpressure or 0)
    print(f"seed {seed}")
    full = " NPU_FULL=1" if (sim, config_index, backpressure) in RANDOM_WORD_FULL_CASES else ""
    command = (f"NPU_SEED={BASE_SEED}{full} .venv/bin/pytest "
               f"'tb/test_differential.py::{request.node.name}'")
    if backpressure is not None:
        monkeypatch.setenv("NPU_BACKPRESSURE", str(backpressure))
    wait = WAIT if backpressure is None else WAIT_BACKPRESSURE
    rng = np.random.default_rng(seed)
    count = {"verilator": 300, "icarus": 60}[sim]

    # The model runs first. After a program that failed part-way through a load, a program
    # that zeroes the local memories follows, so that both sides start the next one alike.
    model = ModelNPU(config)
    programs, wants, bounds, listings = [], [], [], []

    def add(dram, prog_len, words):
        want = model.run(dram, PROG_ADDR, prog_len, reset=not programs)
        fetched = min(prog_len, len(words) + 1)
        words_fetched = [_word_at(want.dram, pc) for pc in range(fetched)]
        if words_fetched != (words + [0])[:fetched]:
            # The program stored over itself: any word may have been fetched.
            longest = max(instruction_bound(config, word, wait)
                          for word in words + words_fetched)
            bound = (fetched + 1) * longest
        else:
            bound = program_bound(config, words_fetched, wait) + \
                instruction_bound(config, 0, wait)
        programs.append((dram, PROG_ADDR, prog_len))
        wants.append(want)
        bounds.append(bound)
        listings.append(words)
        return want

    for _ in range(count):
        words = [random_word(config, rng) for _ in range(int(rng.integers(1, 17)))]
        if rng.random() < 0.5:
            words.append(codec.encode(Opcode.END))
        prog_len = int(rng.choice([len(words), int(rng.integers(0, len(words) + 3))]))
        want = add(_image(config, rng, words), prog_len, words)
        if not want.done:
            resync = resync_program(config)
            add(_image(config, rng, resync), len(resync), resync)

    try:
        rtl = run_rtl_programs(config, sim, programs,
                               timeout_cycles=[bound + 200 for bound in bounds])
    except AssertionError as error:
        raise AssertionError(f"{error}\nreproduce: {command}") from None
    ratios = []
    for index, (words, want, got, bound) in enumerate(zip(listings, wants, rtl, bounds)):
        context = (f"program {index} (seed {seed}, {sim}, {config.name}): "
                   f"{[hex(word) for word in words]}\nreproduce: {command}")
        assert (got.done, got.error_code, got.error_pc) == \
            (want.done, want.error_code, want.error_pc), \
            f"{context}\nRTL {got.error_code.name} at {got.error_pc}, model " \
            f"{want.error_code.name} at {want.error_pc}"
        assert got.instructions == want.instructions, context
        assert got.cycles <= bound, f"{context}: {got.cycles} cycles, bound {bound}"
        ratios.append(got.cycles / bound)
        differs = got.dram != want.dram
        if want.error_code == ErrorCode.BUS_WRITE:
            start, end = _store_block(_word_at(want.dram, want.error_pc))
            differs[start:end] = False
        assert not differs.any(), f"{context}: DRAM differs at {np.flatnonzero(differs)[:8]}"
    outcomes = [want.error_code.name for want in wants]
    print(f"{len(programs)} programs: " + ", ".join(
        f"{name} {outcomes.count(name)}" for name in sorted(set(outcomes))) +
        f"; cycles at most {max(ratios):.0%} of the bound")


# ---------------------------------------------------------------------- directed programs
# Paths that random programs and compiled GEMMs hardly ever take (found by `make coverage`):
# each program runs on the RTL and on the model, and its result is also checked by hand.

INT32_MIN = -(1 << 31)


def _directed_programs(config):
    """``(name, words, data, check)``: ``data`` is ``{address: bytes}`` to place in DRAM and
    ``check(result)`` the outcome by hand."""
    r, c = config.rows, config.cols
    acc_row = 4 * c
    end = codec.encode(Opcode.END)
    illegal = 0xFF                              # opcode 0xFF, every operand zero
    rng = np.random.default_rng(BASE_SEED + 77)
    programs = []

    def store_over(pc):
        return codec.encode(Opcode.STORE, acc_addr=0, rows=1, row_bytes=acc_row,
                            dram_addr=PROG_ADDR + 16 * pc, dram_stride=0)

    def load_acc_row(addr):
        return codec.encode(Opcode.LOAD_ACC, local_addr=0, rows=1, row_bytes=acc_row,
                            dram_addr=addr, dram_stride=0)

    def gemm(weight_row, act_rows, acc_addr):
        """Weights into scratchpad rows ``weight_row..``, PRELOAD, one MATMUL per activation
        row in ``act_rows`` (the first overwrites accumulator row ``acc_addr``, the others
        add to it, each right behind the one before), STORE to OUTPUT. Returns the program,
        its data and the row it must store."""
        weights = rng.integers(-128, 128, size=(r, c), dtype=np.int8)
        acts = rng.integers(-128, 128, size=(len(act_rows), r), dtype=np.int8)
        words = [codec.encode(Opcode.LOAD_SPAD, local_addr=weight_row, rows=r, row_bytes=c,
                              dram_addr=DATA, dram_stride=c),
                 codec.encode(Opcode.LOAD_SPAD, local_addr=act_rows[0], rows=len(act_rows),
                              row_bytes=r, dram_addr=DATA + 0x400, dram_stride=r),
                 codec.encode(Opcode.PRELOAD, spad_addr=weight_row)]
        words += [codec.encode(Opcode.MATMUL, spad_addr=row, acc_addr=acc_addr, rows=1,
                               accumulate=int(index > 0))
                  for index, row in enumerate(act_rows)]
        words += [codec.encode(Opcode.STORE, acc_addr=acc_addr, rows=1, row_bytes=acc_row,
                               dram_addr=OUTPUT, dram_stride=0), end]
        want = (acts.astype(np.int64) @ weights.astype(np.int64)).sum(axis=0).astype("<i4")

        def check(result):
            assert result.done, result
            got = np.frombuffer(result.dram[OUTPUT:OUTPUT + acc_row].tobytes(), "<i4")
            assert np.array_equal(got, want), (got, want)
        return words, {DATA: weights.tobytes(), DATA + 0x400: acts.tobytes()}, check

    # INT32_MIN times the multiplier INT32_MIN: the doubling high multiply saturates to
    # INT32_MAX (TFLite's SaturatingRoundingDoublingHighMul), then clamps to 127, with a
    # clamp from -128 and then from 0 (ReLU). (First, so that the programs after it take the
    # saturation away again.)
    def saturated(result):
        assert result.done, result
        assert result.dram[OUTPUT:OUTPUT + c].tolist() == [127] * c, result.dram[OUTPUT:]
        assert result.dram[OUTPUT + 16:OUTPUT + 16 + c].tolist() == [127] * c
    minimum = np.full(c, INT32_MIN, "<i4").tobytes()
    programs.append(("requantization saturates", [load_acc_row(DATA)] + [
        word
        for act_min, offset in [(-128, 0), (0, 16)]
        for word in [
            codec.encode(Opcode.LOAD_QUANT, dram_addr=QUANT, dram_stride=acc_row,
                         row_bytes=acc_row, zero_point=0, act_min=act_min, act_max=127),
            codec.encode(Opcode.STORE_Q, acc_addr=0, rows=1, row_bytes=c,
                         dram_addr=OUTPUT + offset, dram_stride=0)]] + [end],
        {DATA: minimum, QUANT: minimum + bytes(acc_row)}, saturated))

    # A store over instructions the fetcher has already read: they are read again. Word 2 is
    # illegal until the store makes its first bytes those of END; then an END the store
    # zeroes becomes opcode 0.
    def done_after_three(result):
        assert result.done and result.instructions == 3, result
    programs.append(("store over a fetched illegal word makes it END",
                     [load_acc_row(DATA), store_over(2), illegal, end],
                     {DATA: end.to_bytes(16, "little")[:acc_row]}, done_after_three))

    def illegal_at_two(result):
        assert (result.error_code, result.error_pc) == (ErrorCode.ILLEGAL_OPCODE, 2), result
    programs.append(("store of zeros over a fetched END",
                     [load_acc_row(DATA), store_over(2), end],
                     {DATA: bytes(acc_row)}, illegal_at_two))

    # A store to the top MiB of the address space, outside the DRAM: every high bit of the
    # write address (the tests' DRAMs are small), answered SLVERR.
    def bus_write_at_one(result):
        assert (result.error_code, result.error_pc) == (ErrorCode.BUS_WRITE, 1), result
    programs.append(("a store near 4 GiB", [
        load_acc_row(DATA),
        codec.encode(Opcode.STORE, acc_addr=0, rows=1, row_bytes=acc_row,
                     dram_addr=0xFFF0_0000, dram_stride=0),
        end], {DATA: bytes(acc_row)}, bus_write_at_one))

    # Weights, activations and results at the last rows of the memories: every address bit
    # of both scratchpad read ports and the accumulator (the compiler keeps the weights in
    # the first 2R rows).
    last = config.spad_depth - r
    programs.append(("the last rows of the memories",
                     *gemm(last, [last - 2, last - 1], config.acc_depth - 1)))

    # Two MATMULs into one accumulator row, the second right behind the first: the
    # accumulator's second write reads the row its first write has not stored yet.
    programs.append(("two MATMULs into one row, back to back", *gemm(0, [r, r + 1], 0)))
    return programs


DIRECTED_CONFIGS = [DIFFERENTIAL_CONFIGS[0], NPUConfig.from_name("5x3", bus_width=32)]


@pytest.mark.parametrize("sim", ["verilator", "icarus"])
@pytest.mark.parametrize("config", DIRECTED_CONFIGS,
                         ids=[f"{config.name}-s{config.spad_depth}-bus{config.bus_width}"
                              for config in DIRECTED_CONFIGS])
def test_directed_programs(sim, config):
    from sw.model import ModelNPU
    programs = _directed_programs(config)
    images = []
    for name, words, data, check in programs:
        dram = np.zeros(DRAM_SIZE, np.uint8)
        for address, values in data.items():
            dram[address:address + len(values)] = np.frombuffer(values, np.uint8)
        program = codec.pack_words(words)
        dram[PROG_ADDR:PROG_ADDR + len(program)] = np.frombuffer(program, np.uint8)
        images.append((dram, PROG_ADDR, len(words)))
    rtl = run_rtl_programs(config, sim, images)
    for (name, words, data, check), image, got in zip(programs, images, rtl):
        want = ModelNPU(config).run(*image)
        check(want)
        check(got)
        assert (got.done, got.error_code, got.error_pc, got.instructions) == \
            (want.done, want.error_code, want.error_pc, want.instructions), name
        assert np.array_equal(got.dram, want.dram), \
            f"{name}: DRAM differs at {np.flatnonzero(got.dram != want.dram)[:8]}"


# ---------------------------------------------------------------------- byte offsets
# The DMA reader rotates each beat by its row's byte offset in the bus word (one case per
# offset, hw/dma/reader.py). Compiled programs never load from an offset that is not a
# multiple of 4 on the 256- and 512-bit builds: the driver starts every row of A and B 16
# bytes apart in 64-byte aligned regions (sw/driver.py's ROW_PITCH and REGION_ALIGN), a
# tile's slice of a row starts at a multiple of R or C (4 or 8 on the 4x4 and 8x4 arrays,
# whatever the GEMM's shape), and every other operand is INT32. The random programs above
# load from any offset, but on 32- and 128-bit buses.

OFFSET_CONFIGS = [NPUConfig.from_name("4x4", bus_width=256),
                  NPUConfig.from_name("8x4", bus_width=512)]


@pytest.mark.parametrize("config", OFFSET_CONFIGS,
                         ids=[f"{config.name}-bus{config.bus_width}"
                              for config in OFFSET_CONFIGS])
def test_loads_at_every_byte_offset(config):
    """LOAD_ACC rows from every byte offset of the bus word on the widest buses, stored back
    with STORE: each row exactly its DRAM bytes, zero past its row_bytes, on the RTL (under
    Verilator) and on the model. One block of a row per offset, its stride (a bus word plus
    7, odd) moving each row's offset on by 7; then one single-row block per start offset, of
    1 to 4C bytes, so that rows at the end of the word, of one and of two beats, wrap into
    the next beat. For `make coverage`: the reader's rotation at every offset of these
    builds."""
    from sw.model import ModelNPU
    bus_bytes, acc_row = config.bus_bytes, config.acc_row_bytes
    seed = BASE_SEED + 300 + config.bus_width
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    sweep, starts, output, size = 0x1000, 0x3000, 0x5000, 0x6000
    stride = bus_bytes + 7
    # (DRAM address, row_bytes) of accumulator row r, r < 2 * bus_bytes.
    rows = [(sweep + 3 + row * stride, acc_row) for row in range(bus_bytes)]
    rows += [(starts + offset * (bus_bytes + 1), 1 + offset % acc_row)
             for offset in range(bus_bytes)]
    assert sorted(address % bus_bytes for address, _ in rows[:bus_bytes]) == \
        list(range(bus_bytes))
    words = [codec.encode(Opcode.LOAD_ACC, local_addr=0, rows=bus_bytes, row_bytes=acc_row,
                          dram_addr=rows[0][0], dram_stride=stride)]
    words += [codec.encode(Opcode.LOAD_ACC, local_addr=row, rows=1, row_bytes=row_bytes,
                           dram_addr=address, dram_stride=0)
              for row, (address, row_bytes) in enumerate(rows) if row >= bus_bytes]
    words += [codec.encode(Opcode.STORE, acc_addr=0, rows=len(rows), row_bytes=acc_row,
                           dram_addr=output, dram_stride=acc_row),
              codec.encode(Opcode.END)]
    dram = np.zeros(size, np.uint8)
    dram[sweep:output] = rng.integers(0, 256, output - sweep, dtype=np.uint8)
    program = codec.pack_words(words)
    assert PROG_ADDR + len(program) <= sweep
    dram[PROG_ADDR:PROG_ADDR + len(program)] = np.frombuffer(program, np.uint8)

    want = np.zeros((len(rows), acc_row), np.uint8)
    for row, (address, row_bytes) in enumerate(rows):
        want[row, :row_bytes] = dram[address:address + row_bytes]
    got = run_rtl_programs(config, "verilator", [(dram, PROG_ADDR, len(words))])[0]
    model = ModelNPU(config).run(dram, PROG_ADDR, len(words))
    for name, result in (("RTL", got), ("model", model)):
        assert result.done, f"{name}: {result} (seed {seed})"
        stored = result.dram[output:output + want.size].reshape(want.shape)
        wrong = [(row, hex(address), address % bus_bytes)
                 for row, (address, _) in enumerate(rows)
                 if not np.array_equal(stored[row], want[row])]
        assert not wrong, (f"{name} on {config.name}/{config.bus_width}: rows (row, address, "
                           f"offset) {wrong[:8]} differ (seed {seed})")
    assert np.array_equal(got.dram, model.dram), \
        f"DRAM differs at {np.flatnonzero(got.dram != model.dram)[:8]} (seed {seed})"
