"""The cycle model (:mod:`sw.timing`) against the RTL: every counter equal, cycle for cycle.

For each of five configurations (four array sizes, the five AXI widths) 30 GEMMs run
under Verilator in one simulation: shapes with 1s, exact tiles, ragged tiles, several
accumulator halves and blocks of A, the three GEMM schedules, and random shapes drawn from
``NPU_SEED``. The model predicts each program's cycles and all performance counters
(``hw.isa.PERF_COUNTERS``) from the compiled program alone; the test asserts that they
equal what the hardware counted, and that the results are bit-exact. The DRAM latencies
are checked against a second DRAM, the Amaranth simulator's memory model answering at once.
"""

import os

import numpy as np
import pytest

from hw.config import NPUConfig
from hw.dma import MAX_READS_OUTSTANDING
from hw.isa import PERF_COUNTERS, Opcode
from sim import amaranth_sim
from sw import codec
from sw.compiler import compile_gemm
from sw.driver import prepare_gemm, reference_gemm, run_jobs
from sw.errors import NPUValueError
from sw.timing import (MEMORIES, READ_LATENCY, WRITE_RESPONSE_LATENCY, Memory, memory_for,
                       predict, predict_gemm)


BASE_SEED = int(os.environ.get("NPU_SEED", "20261202"))
SHAPES_PER_CONFIG = 30
#: Random shapes are drawn again while the model predicts more cycles than this.
CYCLE_BUDGET = 30_000
CONFIGS = [("5x3", 32), ("8x8", 64), ("16x16", 128), ("4x4", 256), ("8x4", 512)]


def _shapes(config, rng):
    """``(m, k, n, schedule)``: fixed corner cases, then random shapes within the budget."""
    r, c = config.rows, config.cols
    half = config.acc_depth // 2
    shapes = [
        (1, 1, 1, "auto"), (r, r, c, "auto"), (r + 1, r - 1 or 1, c + 1, "auto"),
        (2 * r, 3 * r, 4 * c, "auto"),            # exact tiles, several of each
        (97, 5, 3, "auto"),                       # M much larger than the array
        (3, 9 * r + 2, 5, "auto"),                # K much larger than R
        (5, 7, 9 * c + 4, "auto"),                # N much larger than C
        (half + 3, r + 2, c + 3, "auto"),         # more than one accumulator half
        (40, 2 * r + 1, 2 * c + 1, "streaming"),
        (40, 2 * r + 1, 2 * c + 1, "resident"),
        (9, 3 * r, c + 2, "streaming"),
        (9, 3 * r, c + 2, "resident"),
    ]
    while len(shapes) < SHAPES_PER_CONFIG:
        m, k, n = (int(x) for x in rng.integers(1, 8 * max(r, c) + 1, size=3))
        if predict_gemm(config, m, k, n).cycles <= CYCLE_BUDGET:
            shapes.append((m, k, n, "auto"))
    return shapes


@pytest.mark.rtl
@pytest.mark.parametrize("name,bus_width", CONFIGS, ids=[f"{n}-{b}" for n, b in CONFIGS])
def test_model_equals_rtl_counters(name, bus_width):
    config = NPUConfig.from_name(name, bus_width=bus_width)
    seed = BASE_SEED + config.rows * 1000 + bus_width
    rng = np.random.default_rng(seed)
    shapes = _shapes(config, rng)
    pairs = [(rng.integers(-128, 128, size=(m, k), dtype=np.int8),
              rng.integers(-128, 128, size=(k, n), dtype=np.int8)) for m, k, n, _ in shapes]
    jobs = [prepare_gemm(a, b, config=config, schedule=schedule)
            for (a, b), (_, _, _, schedule) in zip(pairs, shapes)]
    results = run_jobs(jobs, config, "verilator")
    mismatches = []
    for (m, k, n, schedule), (a, b), job, result in zip(shapes, pairs, jobs, results):
        assert np.array_equal(result.c, reference_gemm(a, b)), (
            f"{m}x{k}x{n} ({schedule}) on {name}/{bus_width}: not bit-exact (seed {seed})")
        predicted = predict(config, job.program.words, job.layout.program_addr).perf
        if predicted != result.perf:
            differ = {key: (result.perf[key], predicted[key]) for key in result.perf
                      if result.perf[key] != predicted.get(key)}
            mismatches.append(f"{m}x{k}x{n} ({job.program.plan.schedule}): RTL vs model "
                              f"{differ}")
    assert not mismatches, (f"{len(mismatches)} of {len(shapes)} GEMMs on {name}/{bus_width} "
                            f"differ (seed {seed}):\n" + "\n".join(mismatches))


def test_model_predicts_what_the_driver_runs():
    """predict_gemm compiles exactly the program the driver runs."""
    config = NPUConfig.from_name("4x4", bus_width=32)
    rng = np.random.default_rng(BASE_SEED)
    a = rng.integers(-128, 128, size=(9, 10), dtype=np.int8)
    b = rng.integers(-128, 128, size=(10, 11), dtype=np.int8)
    job = prepare_gemm(a, b, config=config)
    assert (predict_gemm(config, 9, 10, 11)
            == predict(config, job.program.words, job.layout.program_addr))
    assert (predict_gemm(config, 9, 10, 11, read_latency=5, write_response_latency=4)
            == predict(config, job.program.words, job.layout.program_addr, read_latency=5,
                       write_response_latency=4))


def test_model_counts_what_it_must():
    """Counters that follow from the program alone: rows streamed, MACs, instructions,
    bytes written (row geometry on the bus)."""
    config = NPUConfig.from_name("8x8", bus_width=64)
    m, k, n = 20, 12, 10
    job = prepare_gemm(np.ones((m, k), np.int8), np.ones((k, n), np.int8), config=config)
    perf = predict(config, job.program.words, job.layout.program_addr).perf
    assert list(perf) == [*PERF_COUNTERS, "cycles"]
    matmuls = [codec.decode(word)[1] for word in job.program.words
               if codec.decode(word)[0] is Opcode.MATMUL]
    assert perf["array_rows"] == sum(f["rows"] for f in matmuls)
    assert perf["useful_macs"] == m * k * n
    assert perf["instructions"] == len(job.program.words)
    stalls = sum(perf[key] for key in ("stall_fetch", "stall_load", "stall_store",
                                       "stall_array"))
    assert stalls + perf["instructions"] <= perf["cycles"]


def test_model_takes_the_dram_latencies():
    """A STORE and END: the one fetch waits for the first read beat (stall_fetch), END for the
    last write response (stall_store), so each extra cycle of latency is one more cycle."""
    config = NPUConfig.from_name("4x4")
    words = [codec.encode(Opcode.STORE, acc_addr=0, rows=2, row_bytes=16, dram_addr=0x1000,
                          dram_stride=16),
             codec.encode(Opcode.END)]
    base = predict(config, words, 0x40)
    assert base == predict(config, words, 0x40, read_latency=READ_LATENCY,
                           write_response_latency=WRITE_RESPONSE_LATENCY)
    # Two cycles more than before the decoder checked words on their way into the queue, one
    # more (END's wait for the store) since the DMA writer takes every row into its buffer
    # before it loads it: the first row of a STORE starts a cycle later, and three more
    # (stall_fetch) since the decoder registers its input, the queue reads through a
    # register and the DRAM range's sum has a stage of its own.
    assert (base.cycles, base.perf["stall_fetch"], base.perf["stall_store"]) == (28, 13, 12)
    for extra in (1, 5):
        slow_read = predict(config, words, 0x40, read_latency=READ_LATENCY + extra)
        assert slow_read.perf == dict(base.perf, cycles=base.cycles + extra,
                                      stall_fetch=base.perf["stall_fetch"] + extra)
        slow_write = predict(config, words, 0x40,
                             write_response_latency=WRITE_RESPONSE_LATENCY + extra)
        assert slow_write.perf == dict(base.perf, cycles=base.cycles + extra,
                                       stall_store=base.perf["stall_store"] + extra)
    for keyword, value, match in (("read_latency", 1, "read_latency must be a whole number "
                                   "of cycles, at least 2, not 1"),
                                  ("write_response_latency", 0, "at least 1, not 0"),
                                  ("read_latency", 3.0, "at least 2, not 3.0")):
        with pytest.raises(NPUValueError, match=match):
            predict(config, words, 0x40, **{keyword: value})


@pytest.mark.parametrize("name, bus_width, shape", [
    ("3x5", 128, (9, 11, 17)), ("4x4", 32, (16, 16, 16))])
def test_model_equals_the_amaranth_npu_with_an_instant_dram(name, bus_width, shape):
    """A second DRAM: the whole NPU in Amaranth's simulator with a memory model that accepts
    and answers at once (first beat two cycles after the grant, response one cycle after the
    last beat) takes the cycles of the model with read_latency=2, write_response_latency=1."""
    config = NPUConfig.from_name(name, bus_width=bus_width)
    program = compile_gemm(config, *shape, a_addr=0x10000, b_addr=0x20000, c_addr=0x30000)
    (outcome,), _ = amaranth_sim.run_jobs(
        [amaranth_sim.Job(program.words, prog_addr=0x1000)], config=config, seed=1,
        timeout_cycles=10_000, ready_probability=1.0, max_latency=0)
    assert outcome.cycles == predict(config, program.words, 0x1000, read_latency=2,
                                     write_response_latency=1).cycles


@pytest.mark.parametrize("name, bus_width, shape", [
    ("4x4", 128, (9, 11, 6)), ("2x3", 32, (5, 7, 4))])
def test_model_equals_the_amaranth_npu_with_a_slow_dram(name, bus_width, shape):
    """A DRAM whose round trip is longer than the reads the DMA keeps outstanding
    (MAX_READS_OUTSTANDING): one-beat bursts (4x4 on 128 bits: every row and instruction) wait
    for a free slot, and the model counts those cycles too."""
    config = NPUConfig.from_name(name, bus_width=bus_width)
    program = compile_gemm(config, *shape, a_addr=0x10000, b_addr=0x20000, c_addr=0x30000)
    extra = MAX_READS_OUTSTANDING + 3
    (outcome,), _ = amaranth_sim.run_jobs(
        [amaranth_sim.Job(program.words, prog_addr=0x1000)], config=config, seed=2,
        timeout_cycles=20_000, ready_probability=1.0, max_latency=0, read_latency=extra)
    slow = predict(config, program.words, 0x1000, read_latency=2 + extra,
                   write_response_latency=1)
    assert outcome.cycles == slow.cycles


def test_model_rejects_what_it_cannot_run():
    """Every opcode is modelled (the quantized ones: tb/test_timing_quant.py); an illegal one
    ends a program in an error, which the model does not cover, and so does a program
    without END."""
    config = NPUConfig.from_name("4x4")
    end = codec.encode(Opcode.END)
    with pytest.raises(NPUValueError, match="instruction 1 is an illegal opcode"):
        predict(config, [end, 0, end], 0x40)
    with pytest.raises(NPUValueError, match="ends in END"):
        predict(config, [], 0x40)


# The memory's bandwidth (sw.timing.Memory) ---------------------------------------------------

MEMORY_SHAPES = [("2x2", 64, (16, 16, 16)), ("4x4", 32, (9, 10, 11)), ("3x5", 128, (20, 7, 9)),
                 ("8x8", 64, (40, 17, 33))]


@pytest.mark.parametrize("name, bus_width, shape", MEMORY_SHAPES)
def test_sim_memory_is_the_default(name, bus_width, shape):
    """The "sim" preset, a Memory with its figures and the old keywords all predict the very
    same cycles and counters (the model's RTL-exact path unchanged)."""
    config = NPUConfig.from_name(name, bus_width=bus_width)
    default = predict_gemm(config, *shape)
    assert memory_for("sim", config) == Memory("sim", READ_LATENCY, WRITE_RESPONSE_LATENCY, 1, 1)
    for same in (predict_gemm(config, *shape, memory="sim"),
                 predict_gemm(config, *shape, memory=Memory("mine")),
                 predict_gemm(config, *shape, read_latency=READ_LATENCY,
                              write_response_latency=WRITE_RESPONSE_LATENCY)):
        assert same == default


@pytest.mark.parametrize("name, bus_width, shape", MEMORY_SHAPES)
def test_slower_beats_never_predict_fewer_cycles(name, bus_width, shape):
    """Read or write beats further apart: never fewer cycles, and more at 9 cycles a beat than
    at one (a writer that sends one-beat rows leaves two cycles between them anyway, so an
    interval of 2 may change nothing); the counters of what moved unchanged (the same
    program moves the same bytes)."""
    config = NPUConfig.from_name(name, bus_width=bus_width)
    moved = ("array_rows", "useful_macs", "instructions", "read_bytes", "write_bytes")
    base = predict_gemm(config, *shape)
    for field in ("read_beat_cycles", "write_beat_cycles"):
        previous = base
        for interval in (2, 3, 5, 9):
            timing = predict_gemm(config, *shape, memory=Memory("slow", **{field: interval}))
            assert timing.cycles >= previous.cycles, (field, interval)
            assert ({key: timing.perf[key] for key in moved}
                    == {key: previous.perf[key] for key in moved})
            previous = timing
        assert previous.cycles > base.cycles, field


def _one_store_of_four_beats():
    """4x4 on a 32-bit bus: a STORE of one 16-byte row (four beats, one burst), then END."""
    words = [codec.encode(Opcode.STORE, acc_addr=0, rows=1, row_bytes=16, dram_addr=0x1000,
                          dram_stride=16),
             codec.encode(Opcode.END)]
    return NPUConfig.from_name("4x4", bus_width=32), words


def test_write_beats_at_the_interval():
    """One STORE of one row of four beats (4x4 on 32 bits, one burst): each beat after the
    first is accepted ``write_beat_cycles`` after the one before, so END's wait for the store
    grows by three times the interval less one."""
    config, words = _one_store_of_four_beats()
    base = predict(config, words, 0x40)
    for interval in (2, 5):
        slow = predict(config, words, 0x40, memory=Memory("w", write_beat_cycles=interval))
        assert slow.perf == dict(base.perf, cycles=base.cycles + 3 * (interval - 1),
                                 stall_store=base.perf["stall_store"] + 3 * (interval - 1))


def test_read_beats_at_the_interval():
    """The fetch of a STORE and END (4x4 on 32 bits: two rows of four beats, one burst): END
    is whole after the eighth beat, seven intervals after the first, which comes when it
    did (the interval spaces beats, it does not delay a command's first), so the fetch's
    stall grows by seven times the interval less one."""
    config, words = _one_store_of_four_beats()
    base = predict(config, words, 0x40)
    for interval in (2, 5):
        slow = predict(config, words, 0x40, memory=Memory("r", read_beat_cycles=interval))
        assert slow.perf["stall_fetch"] == base.perf["stall_fetch"] + 7 * (interval - 1)


@pytest.mark.parametrize("name, bus_width, shape", MEMORY_SHAPES)
def test_a_shared_bus_never_predicts_fewer_cycles(name, bus_width, shape):
    """Reads and writes on one bus, then a turnaround between them: never fewer cycles than
    the channels apart, and the same bytes read."""
    config = NPUConfig.from_name(name, bus_width=bus_width)
    for beat in (1, 5):
        apart = predict_gemm(config, *shape, memory=Memory("apart", 20, 8, beat, beat))
        shared = predict_gemm(config, *shape, memory=Memory("one", 20, 8, beat, beat, True))
        turning = predict_gemm(config, *shape, memory=Memory("turn", 20, 8, beat, beat, True, 16))
        assert apart.cycles <= shared.cycles <= turning.cycles
        assert shared.perf["read_bytes"] == apart.perf["read_bytes"]


def test_ulx3s_memory_from_the_bus_width():
    """LiteDRAM's down-converter turns a beat into bus_width / 16 SDRAM commands and takes a
    cycle to accept the next; both directions."""
    for bus_width, beat in ((32, 3), (64, 5), (128, 9), (512, 33)):
        memory = memory_for("ulx3s", NPUConfig.from_name("2x2", bus_width=bus_width))
        assert (memory.read_beat_cycles, memory.write_beat_cycles) == (beat, beat)
    assert set(MEMORIES) == {"sim", "ulx3s"}
    assert memory_for("ulx3s", NPUConfig.from_name("2x2")).shared_bus
    with pytest.raises(NPUValueError, match="memory must be a Memory or one of sim, ulx3s, "
                                            "not 'sdram'"):
        predict_gemm(NPUConfig.from_name("2x2"), 2, 2, 2, memory="sdram")
    with pytest.raises(NPUValueError, match="read_beat_cycles must be a whole number of "
                                            "cycles, at least 1, not 0"):
        Memory("bad", read_beat_cycles=0)
    with pytest.raises(NPUValueError, match="read_latency .* at least 2, not 1"):
        Memory("bad", read_latency=1)
    with pytest.raises(NPUValueError, match="turnaround_cycles .* at least 0, not -1"):
        Memory("bad", turnaround_cycles=-1)
    with pytest.raises(NPUValueError, match="shared_bus must be True or False, not 1"):
        Memory("bad", shared_bus=1)


#: GEMMs measured on the simulated SoC (soc/simulation.py; docs/board.md has the
#: commands): the CYCLES register, two runs each (refresh moves them by a few cycles).
ULX3S_MEASURED = {("2x2", (16, 16, 16)): (6560, 6561), ("4x4", (16, 16, 16)): (2508, 2522),
                  ("4x4", (24, 40, 20)): (7130,)}
#: The "ulx3s" preset's error on those is at most 1.7% (docs/board.md's table; refresh
#: alone moves a run by about 1%); on GEMMs that store while they load, more (64^3: up to 12%).
ULX3S_TOLERANCE = 0.03


@pytest.mark.parametrize("name, shape", list(ULX3S_MEASURED), ids=str)
def test_ulx3s_memory_near_the_simulated_soc(name, shape):
    """The preset against the simulated SoC's figures, kept here so that a change to the
    model or the preset that moves them shows without running the SoC."""
    config = NPUConfig.from_name(name)
    predicted = predict_gemm(config, *shape, memory="ulx3s").cycles
    for measured in ULX3S_MEASURED[name, shape]:
        assert abs(predicted / measured - 1) <= ULX3S_TOLERANCE, (predicted, measured)
