"""The generated Verilog under Verilator and Icarus, through cocotb, with real AXI models.

Each (simulator, config) builds once (cached in ``build/sim``) and runs its GEMMs in one
simulation, one program after another without a reset, checked bit-exactly against numpy.
Set ``NPU_SEED`` to reproduce a run; the seed of every case is in its failure message.
"""

import json
import os

import numpy as np
import pytest

from hw.config import NPUConfig
from sim.runner import run_cocotb
from sw import cli
from sw.driver import gemm, gemm_batch, reference_gemm


pytestmark = pytest.mark.rtl

SIMULATORS = ["verilator", "icarus"]
#: (name, bus width): a non-square array, and every AXI data width.
CONFIGS = [("3x5", 32), ("4x4", 64), ("8x8", 64), ("5x3", 32), ("4x4", 128)]
BASE_SEED = int(os.environ.get("NPU_SEED", "20261202"))
FULL = os.environ.get("NPU_FULL") == "1"


def _shapes(config, sim, rng, count):
    """Shapes with 1s, primes, K >> R, N >> C, M >> both, and random ones."""
    r, c = config.rows, config.cols
    shapes = [
        (1, 1, 1), (1, 2 * r + 1, 1), (2, 1, 2 * c + 3), (7, 13, 11),
        (3, 9 * r + 2, 5),          # K much larger than R
        (5, 7, 9 * c + 4),          # N much larger than C
        (97, 5, 3),                 # M much larger than R and C
        (r, r, c), (r + 1, r + 1, c + 1),
    ]
    limit = 24 if sim == "icarus" else 70
    for _ in range(count):
        shapes.append(tuple(int(v) for v in rng.integers(1, limit, size=3)))
    return shapes


def _operands(m, k, n, rng, case):
    if case == 0:
        # The corner of the INT8 range: every product is (-128) * (-128).
        return np.full((m, k), -128, np.int8), np.full((k, n), -128, np.int8)
    return (rng.integers(-128, 128, size=(m, k), dtype=np.int8),
            rng.integers(-128, 128, size=(k, n), dtype=np.int8))


@pytest.mark.parametrize("config_name, bus_width", CONFIGS)
@pytest.mark.parametrize("sim", SIMULATORS)
def test_gemms_bit_exact(sim, config_name, bus_width):
    config = NPUConfig.from_name(config_name, bus_width=bus_width)
    seed = BASE_SEED + sum(map(ord, f"{sim}{config_name}{bus_width}"))
    print(f"seed {seed} (NPU_SEED={BASE_SEED})")
    rng = np.random.default_rng(seed)
    # 100 random shapes under Verilator and 40 under Icarus (which is ~50x slower), times 4
    # with NPU_FULL=1, on top of the 9 chosen shapes per config.
    random_shapes = {"verilator": 20, "icarus": 8}[sim] * (4 if FULL else 1)
    shapes = _shapes(config, sim, rng, random_shapes)
    pairs = [_operands(m, k, n, rng, case) for case, (m, k, n) in enumerate(shapes)]
    results = gemm_batch(pairs, config=config, sim=sim)
    for (m, k, n), (a, b), result in zip(shapes, pairs, results):
        expected = reference_gemm(a, b)
        assert result.c.dtype == np.int32
        assert np.array_equal(result.c, expected), (
            f"{m}x{k}x{n} on {config_name} ({bus_width}-bit bus) under {sim} differs "
            f"(seed {seed}; reproduce: NPU_SEED={BASE_SEED} .venv/bin/pytest "
            f"'tb/test_rtl.py::test_gemms_bit_exact[{sim}-{config_name}-{bus_width}]')")
        assert result.cycles > 0


@pytest.mark.parametrize("sim", SIMULATORS)
def test_top_level(sim):
    run_cocotb(NPUConfig(rows=2, cols=3, spad_depth=64, acc_depth=16), sim, "tb.cocotb_top")


@pytest.mark.parametrize("sim", SIMULATORS)
def test_cli_gemm_json(sim, capsys):
    """The acceptance command: 37 x 83 x 29 on 4x4 is bit-exact, with the cycle counter."""
    status = cli.main(["gemm", "--m", "37", "--k", "83", "--n", "29", "--config", "4x4",
                       "--sim", sim, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 0
    assert report["bit_exact"] is True
    assert (report["m"], report["k"], report["n"]) == (37, 83, 29)
    assert (report["rows"], report["cols"], report["sim"]) == (4, 4, sim)
    assert report["macs"] == 37 * 83 * 29
    assert report["weight_tiles"] == 21 * 8
    assert report["utilization"] == report["macs"] / (report["cycles"] * 16)


def test_cli_gemm_files(tmp_path):
    """`npu gemm --a A.npy --b B.npy --out C.npy` writes exactly A @ B."""
    rng = np.random.default_rng(BASE_SEED)
    a = rng.integers(-128, 128, size=(19, 23), dtype=np.int8)
    b = rng.integers(-128, 128, size=(23, 6), dtype=np.int8)
    a[0, :] = -128
    b[:, 0] = -128
    np.save(tmp_path / "A.npy", a)
    np.save(tmp_path / "B.npy", b)
    status = cli.main(["gemm", "--a", str(tmp_path / "A.npy"), "--b", str(tmp_path / "B.npy"),
                       "--out", str(tmp_path / "C.npy"), "--config", "4x4",
                       "--sim", "verilator"])
    assert status == 0
    c = np.load(tmp_path / "C.npy")
    assert c.dtype == np.int32
    assert np.array_equal(c, a.astype(np.int32) @ b.astype(np.int32))


def test_same_cycles_on_both_simulators():
    """Cycle counts are a property of the RTL, not of the simulator."""
    rng = np.random.default_rng(BASE_SEED)
    a = rng.integers(-128, 128, size=(11, 10), dtype=np.int8)
    b = rng.integers(-128, 128, size=(10, 7), dtype=np.int8)
    config = NPUConfig.from_name("3x5", bus_width=32)
    cycles = {sim: gemm_batch([(a, b)], config=config, sim=sim)[0].cycles
              for sim in SIMULATORS}
    assert cycles["verilator"] == cycles["icarus"]


def test_largest_k_does_not_overflow():
    """K = MAX_K with every operand -128: the INT32 accumulators reach 2,147,467,264."""
    from hw.config import MAX_K
    a = np.full((2, MAX_K), -128, np.int8)
    b = np.full((MAX_K, 3), -128, np.int8)
    config = NPUConfig.from_name("8x8", bus_width=128)  # a build tb/test_dram_models.py has
    result = gemm_batch([(a, b)], config=config, sim="verilator")[0]
    assert np.array_equal(result.c, np.full((2, 3), MAX_K * 128 * 128, np.int32))


@pytest.mark.rtl
def test_overlap_keeps_the_array_busy():
    """256^3 on 8x8 with a 64-bit bus: the hardware's own counters, start to done (fetch and
    DMA included), show at least 97% of the MAC slots doing useful work."""
    config = NPUConfig.from_name("8x8")
    rng = np.random.default_rng(BASE_SEED)
    print(f"seed {BASE_SEED}")
    a = rng.integers(-128, 128, size=(256, 256), dtype=np.int8)
    b = rng.integers(-128, 128, size=(256, 256), dtype=np.int8)
    result = gemm(a, b, config=config, sim="verilator")
    assert np.array_equal(result.c, reference_gemm(a, b))
    perf = result.perf
    assert perf["cycles"] == result.cycles
    assert perf["useful_macs"] == 256 ** 3
    # 32 k-tiles x 32 n-tiles x 256 rows, every row of every weight tile streamed once.
    assert perf["array_rows"] == 32 * 32 * 256
    assert perf["instructions"] == result.instructions == result.plan.instructions
    assert perf["write_bytes"] == 4 * 256 * 256
    assert perf["read_bytes"] >= 256 * 256 * 2 + 16 * result.plan.instructions
    assert perf["useful_macs"] / (result.cycles * 64) >= 0.97, perf


def test_build_hash_covers_every_gateware_file(tmp_path, monkeypatch):
    """A simulator build is reused only while no file of ``hw/`` changed, in its subpackages
    too (``hw/controller/``, ``hw/dma/``): a stale build would run the old RTL."""
    from sim import runner
    (tmp_path / "hw" / "controller").mkdir(parents=True)
    top, nested = tmp_path / "hw" / "top.py", tmp_path / "hw" / "controller" / "issue.py"
    top.write_text("a = 1\n")
    nested.write_text("b = 1\n")
    monkeypatch.setattr(runner, "PROJECT_ROOT", tmp_path)
    monkeypatch.setattr(runner, "BENCH_SOURCES", [])
    before = runner._gateware_hash()
    nested.write_text("b = 2\n")
    assert runner._gateware_hash() != before
    nested.write_text("b = 1\n")
    assert runner._gateware_hash() == before


def test_old_builds_are_pruned(tmp_path, monkeypatch):
    """Making a build deletes the builds of other gateware unused for an hour (with their
    locks), and keeps the current gateware's, recent ones and one being made."""
    import fcntl
    from sim import runner
    monkeypatch.setattr(runner, "BUILD_ROOT", tmp_path)
    folder = tmp_path / "sim" / "verilator"
    now = 1_000_000.0

    def made(name, used):
        path = folder / name
        path.mkdir(parents=True)
        (path / "build.ok").write_text("{}")
        os.utime(path / "build.ok", (used, used))
        (folder / f"{name}.lock").write_text("")
        return path

    current = made("8x8_s1024-hdl-aaaaaaaaaaaa", now - 7200)
    old = made("8x8_s1024-hdl-bbbbbbbbbbbb", now - 7200)
    old_public = made("4x4_s512-python-cccccccccccc-public", now - 3601)
    recent = made("8x8_s1024-hdl-dddddddddddd", now - 60)
    building = made("2x2_s64-hdl-eeeeeeeeeeee", now - 7200)
    other = folder / "notes"
    other.mkdir()
    with open(folder / f"{building.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        deleted = runner._prune("verilator", "aaaaaaaaaaaa", now=now)
    assert sorted(deleted) == sorted([old, old_public])
    assert sorted(path.name for path in folder.iterdir()) == sorted(
        [current.name, current.name + ".lock", recent.name, recent.name + ".lock",
         building.name, building.name + ".lock", "notes"])
