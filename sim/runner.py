"""Building the NPU's Verilog for a simulator (cached) and running cocotb benches on it.

What is simulated is :class:`sim.bench_top.NPUBench`: the NPU with the AXI4 protocol checker
on its master, so every RTL test and every driver run is checked. Builds live in
``build/sim/<simulator>/<config>-<dram>-<hash>``, where the hash covers the gateware sources
and the checker, so a build is made once per configuration and simulator and reused by every
test and every driver call until ``hw/`` (or the bench's own gateware) changes; Verilator
builds with every signal public (``NPU_PUBLIC=1``) go to a folder of their own, and so do the
larger size classes of the HDL DRAM (``<config>-hdl-256m-<hash>``: :func:`run_programs`
builds the smallest of :data:`sim.dram.SIZE_CLASSES` that holds the run's largest image). A
file lock lets parallel pytest workers share one build instead of racing. Builds of older
gateware are deleted once unused for an hour (:data:`STALE_BUILD_SECONDS`).
"""

import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from hw.config import NPUConfig
from .bench_top import CLOCK_NS
from .result import RunResult
from .toolchain import setup


__all__ = ["TOPLEVEL", "PROJECT_ROOT", "BUILD_ROOT", "build", "run_cocotb", "run_program",
           "run_programs", "locked", "prune_builds"]


TOPLEVEL = "npu_bench"
PROJECT_ROOT = Path(__file__).resolve().parent.parent
BUILD_ROOT = Path(os.environ.get("NPU_BUILD_DIR", PROJECT_ROOT / "build"))
TIMESCALE = ("1ns", "1ps")

# Verilator: Amaranth's Verilog has width warnings that must not stop the build.
VERILATOR_ARGS = ["-Wno-fatal", "-Wno-lint", "-Wno-style", "-O3", "--x-assign", "fast",
                  "--x-initial", "fast"]
#: Verilator's pass that merges conditional assignments (V3MergeCond) grows quadratically
#: with the array: verilating 16x16 took 67 s, 65 of them in that pass (`--stats`), and 3.9 s
#: without it. On 8x8 all of verilating takes 8 s, and the simulation runs 2.2 times as fast
#: with the pass (512^3: 3.0 s against 6.7 s), so it is off only for arrays of more PEs.
MERGE_COND_MAX_PES = 64


def _verilator_args(config):
    """:data:`VERILATOR_ARGS` for ``config`` (see :data:`MERGE_COND_MAX_PES`)."""
    if config.rows * config.cols > MERGE_COND_MAX_PES:
        return VERILATOR_ARGS + ["-fno-merge-cond"]
    return VERILATOR_ARGS
#: Only the top level's ports are public (:func:`_visibility`), unless NPU_PUBLIC=1: every
#: signal public, as cocotb's runner makes it (for NPU_TRACE, or to poke at internals).
PUBLIC_ALL = os.environ.get("NPU_PUBLIC") == "1"


def _visibility(build_dir, ports):
    """Verilator arguments that make only the top level's ``ports`` visible to cocotb.

    cocotb's runner passes ``--public-flat-rw``, which makes every signal writable through
    VPI; ``--no-public-flat-rw`` turns that off again and a configuration file names the
    ports. Inputs are writable, outputs only readable: Verilator evaluates all the logic that
    depends on a writable signal whenever any input changes, so a writable internal signal
    drags the logic behind it into that evaluation (measured on 8x8: making every signal of
    the top module writable, as the wildcard this replaces did, left the simulation at 66,000
    cycles per second instead of ...).
    """
    if PUBLIC_ALL:
        return []
    lines = ["`verilator_config"]
    for name, direction in ports.items():
        kind = "public_flat_rw" if direction == "input" else "public_flat_rd"
        lines.append(f'{kind} -module "{TOPLEVEL}" -var "{name}"')
    config = build_dir / "public.vlt"
    config.write_text("\n".join(lines) + "\n")
    return ["--no-public-flat-rw", str(config)]


# Icarus: Yosys' Verilog starts its combinational blocks with a variable initialised in its
# declaration; under the runner's -g2012 that initialisation raises no event and the blocks
# whose inputs never change stay X. Verilog-2005 semantics (the last -g wins) restore it.
ICARUS_ARGS = ["-g2005"]


def _coverage(sim, stage):
    """Verilator arguments for coverage (``NPU_COVERAGE=1``, see ``sim/coverage.py``).

    ``stage`` is ``"build"`` (line and toggle coverage, in a build folder of its own, whose
    Verilog keeps Amaranth's ``src`` attributes) or ``"run"``: the simulation writes its
    counts to a file of its own in ``build/coverage/``, named after the pytest test that ran
    it, so they outlive the run folder, which :func:`run_programs` deletes.
    """
    if sim != "verilator" or os.environ.get("NPU_COVERAGE") != "1":
        return []
    if stage == "build":
        return ["--coverage-line", "--coverage-toggle"]
    folder = BUILD_ROOT / "coverage"
    folder.mkdir(parents=True, exist_ok=True)
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" (")[0]
    name = re.sub(r"[^\w.=-]+", "_", test)[-100:].strip("_")
    handle, path = tempfile.mkstemp(prefix=f"run-{name}-" if name else "run-", suffix=".dat",
                                    dir=folder)
    os.close(handle)
    return [f"+verilator+coverage+file+{path}"]


#: The simulated gateware besides ``hw/``.
BENCH_SOURCES = ("sim/axi_checker.py", "sim/bench_top.py", "sim/dram.py",
                 "sim/hdl/npu_axi_dram.v", "sim/verilator/main.cpp")

#: The files with cocotb tests (whose asserts cocotb rewrites for better messages).
COCOTB_TEST_FILES = "cocotb_*.py job.py"

#: Arguments of the make that compiles the Verilated model.
VERILATOR_MAKE_ARGS = os.environ.get("NPU_VERILATOR_MAKE", "OPT_FAST=-O2").split()


def _objcache():
    """The make argument that compiles through ccache, if it is installed (Verilator's
    ``OBJCACHE``), with its cache in ``build/ccache``. Every build compiles Verilator's
    runtime (``verilated.cpp``, ``verilated_vpi.cpp``...) and the main loop, the same for
    every configuration: 14 of the 28 s of a 2x2 build, compiled by the first build only.
    ``NPU_CCACHE=0`` turns it off."""
    ccache = shutil.which("ccache")
    if ccache is None or os.environ.get("NPU_CCACHE") == "0":
        return []
    return [f"OBJCACHE=env CCACHE_DIR={BUILD_ROOT / 'ccache'} {ccache}"]

#: The Verilator build's main loop, which toggles the clock in C++ (see the file).
VERILATOR_MAIN = PROJECT_ROOT / "sim" / "verilator" / "main.cpp"


def _get_runner(sim):
    """cocotb's runner for ``sim``; for Verilator, one that builds :data:`VERILATOR_MAIN`
    instead of cocotb's own main loop (the only difference)."""
    from cocotb_tools.runner import Verilator, get_runner
    if sim != "verilator":
        return get_runner(sim)

    class _Verilator(Verilator):
        def _build_command(self):
            commands = super()._build_command()
            commands[0] = [str(VERILATOR_MAIN) if str(arg).endswith("verilator.cpp") else arg
                           for arg in commands[0]]
            commands[1] = list(commands[1]) + VERILATOR_MAKE_ARGS + _objcache()
            return commands
    return _Verilator()


def _clock_env(sim):
    """The environment that has :data:`VERILATOR_MAIN` make the clock: its half period in
    simulation steps (the timescale's precision, 1 ps)."""
    if sim != "verilator":
        return {}
    return {"NPU_CLOCK_HALF_STEPS": str(CLOCK_NS * 1000 // 2)}


def _gateware_hash():
    """A hash of what a build is made from: the gateware sources and the build's arguments."""
    digest = hashlib.sha256()
    sources = sorted((PROJECT_ROOT / "hw").rglob("*.py"))      # with hw/controller/, hw/dma/
    sources += [PROJECT_ROOT / name for name in BENCH_SOURCES]
    for source in sources:
        digest.update(str(source.relative_to(PROJECT_ROOT)).encode())
        digest.update(source.read_bytes())
    digest.update(repr((VERILATOR_ARGS, MERGE_COND_MAX_PES, VERILATOR_MAKE_ARGS,
                        ICARUS_ARGS)).encode())
    return digest.hexdigest()[:12]


@contextmanager
def locked(path):
    """Hold an exclusive lock on the file ``path`` (made if missing) while the block runs:
    parallel test workers share one build instead of racing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


#: Builds of other gateware (another hash) unused for this long are deleted when a build of
#: the current gateware is made: every change to ``hw/`` makes a new set of builds, and a
#: long-lived checkout kept them all (37 GB of them, on one). The hour spares the builds of
#: another checkout that shares ``NPU_BUILD_DIR`` while it is in use.
STALE_BUILD_SECONDS = 3600
_BUILD_NAME = re.compile(r"-(?P<hash>[0-9a-f]{12})(-public)?(-coverage)?(\.lock)?$")


def _prune(sim, keep_hash, *, now=None, stale_seconds=STALE_BUILD_SECONDS):
    """Delete the builds for ``sim`` of gateware other than ``keep_hash`` last used (their
    ``build.ok`` touched, :func:`build`) more than ``stale_seconds`` ago, with their lock
    files; a build whose lock is held (being made) is left. Returns the folders deleted."""
    return prune_builds(BUILD_ROOT / "sim" / sim, keep_hash, now=now,
                        stale_seconds=stale_seconds)


def prune_builds(folder, keep_hash, *, now=None, stale_seconds=STALE_BUILD_SECONDS):
    """Delete the builds in ``folder`` (``<name>-<hash>`` with a ``build.ok`` and a lock file
    beside them) of a hash other than ``keep_hash`` unused for ``stale_seconds``, unless their
    lock is held. Returns the folders deleted. The simulated SoC's builds use it too."""
    now = time.time() if now is None else now
    deleted = []
    for path in sorted(Path(folder).glob("*")):
        match = _BUILD_NAME.search(path.name)
        if not path.is_dir() or match is None or match["hash"] == keep_hash:
            continue
        stamp = path / "build.ok"
        used = stamp.stat().st_mtime if stamp.exists() else path.stat().st_mtime
        if now - used < stale_seconds:
            continue
        lock_path = path.with_name(path.name + ".lock")
        with open(lock_path, "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            shutil.rmtree(path, ignore_errors=True)
            lock_path.unlink(missing_ok=True)
        deleted.append(path)
    return deleted


def _size_tag(dram_bytes):
    """The build folder's tag of a DRAM size class: none for the default one, else
    ``-64m``, ``-256m``, ``-1g``, ``-4g``."""
    from .dram import DRAM_BYTES
    if dram_bytes == DRAM_BYTES:
        return ""
    if dram_bytes % (1 << 30) == 0:
        return f"-{dram_bytes >> 30}g"
    return f"-{dram_bytes >> 20}m"


def _build_dir(config, sim, dram, dram_bytes):
    public = "-public" if sim == "verilator" and PUBLIC_ALL else ""
    coverage = "-coverage" if _coverage(sim, "build") else ""
    size = _size_tag(dram_bytes) if dram == "hdl" else ""
    return (BUILD_ROOT / "sim" / sim /
            f"{config.key()}-{dram}{size}-{_gateware_hash()}{public}{coverage}")


def _dram_bytes(dram, dram_bytes):
    """The size class of the ``hdl`` DRAM to build (``None``: the default, the smallest);
    the other DRAM model is not part of the build and takes any size."""
    from .dram import DRAM_BYTES, SIZE_CLASSES
    if dram_bytes is None or dram != "hdl":
        return DRAM_BYTES
    if dram_bytes not in SIZE_CLASSES:
        raise ValueError(f"dram_bytes must be one of {SIZE_CLASSES}, not {dram_bytes!r}")
    return dram_bytes


def build(config, sim, dram=None, dram_bytes=None):
    """Generate the Verilog for ``config`` with the DRAM model ``dram`` (by default
    :func:`sim.bench_top.dram_from_env`) and build it for ``sim``, unless already built.
    ``dram_bytes`` is the size class of the ``hdl`` DRAM (:data:`sim.dram.SIZE_CLASSES`;
    by default the smallest, :data:`sim.dram.DRAM_BYTES`): each class is a build of its own.

    Returns the build directory.
    """
    from .bench_top import generate_bench_verilog
    from .dram import VERILOG_SOURCE

    setup(sim)
    from .bench_top import dram_from_env
    dram = dram or dram_from_env()
    dram_bytes = _dram_bytes(dram, dram_bytes)
    build_dir = _build_dir(config, sim, dram, dram_bytes)
    stamp = build_dir / "build.ok"
    with locked(build_dir.with_name(build_dir.name + ".lock")):
        if stamp.exists():
            os.utime(stamp)                  # last used: older gateware's are pruned by it
            return build_dir
        _prune(sim, _gateware_hash())
        build_dir.mkdir(parents=True, exist_ok=True)
        source = build_dir / f"{TOPLEVEL}.v"
        text, ports = generate_bench_verilog(config, name=TOPLEVEL, dram=dram,
                                             dram_bytes=dram_bytes,
                                             emit_src=bool(_coverage(sim, "build")))
        source.write_text(text)
        runner = _get_runner(sim)
        runner.build(
            sources=[source] + ([VERILOG_SOURCE] if dram == "hdl" else []),
            hdl_toplevel=TOPLEVEL,
            build_dir=build_dir,
            build_args=(_verilator_args(config) + _visibility(build_dir, ports)
                        + _coverage(sim, "build")
                        if sim == "verilator"
                        else ICARUS_ARGS),
            timescale=TIMESCALE,
            always=True,
            log_file=build_dir / "build.log",
        )
        stamp.write_text(json.dumps({"config": config.key(), "sim": sim, "dram": dram,
                                     "dram_bytes": dram_bytes}))
    return build_dir


def run_cocotb(config, sim, test_module, *, testcase=None, extra_env=None, test_dir=None,
               waves=None, dram=None, dram_bytes=None):
    """Run the cocotb ``test_module`` against the NPU built for ``config`` on ``sim`` with
    the DRAM model ``dram`` (by default :func:`sim.bench_top.dram_from_env`) of the size
    class ``dram_bytes`` (see :func:`build`).

    The bench finds the configuration in ``NPU_CONFIG`` (JSON), the DRAM model in
    ``NPU_DRAM`` and the size of the ``hdl`` one in ``NPU_DRAM_BYTES``
    (:func:`sim.dram.capacity_from_env`). Raises ``AssertionError`` if any cocotb test
    failed.
    """
    from cocotb_tools.runner import get_results

    from .bench_top import dram_from_env
    from .dram import CAPACITY_ENV
    dram = dram or dram_from_env()
    dram_bytes = _dram_bytes(dram, dram_bytes)
    build_dir = build(config, sim, dram, dram_bytes)
    if waves is None:
        waves = os.environ.get("WAVES", "0") == "1"
    env = {
        "NPU_CONFIG": config.to_json(),
        "NPU_DRAM": dram,
        CAPACITY_ENV: str(dram_bytes),
        # cocotb rewrites the asserts of every module it imports (numpy's, Amaranth's...)
        # unless told which: parsing them all again cost 2 s of every simulation's start.
        "COCOTB_REWRITE_ASSERTION_FILES": COCOTB_TEST_FILES,
        **_clock_env(sim),
    }
    # The runner gives the simulator's Python this process's sys.path as PYTHONPATH (it
    # overwrites any PYTHONPATH in extra_env), so the project root must be on it for the
    # bench to import tb.* and sim.*: `.venv/bin/pytest` puts only tb/ there, not the root.
    if str(PROJECT_ROOT) not in sys.path:
        sys.path.append(str(PROJECT_ROOT))
    env.update(extra_env or {})
    runner = _get_runner(sim)
    if test_dir is None:
        runs = BUILD_ROOT / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        test_dir = Path(tempfile.mkdtemp(prefix=f"npu-{sim}-", dir=runs))
    results = Path(test_dir) / "results.xml"
    try:
        runner.test(
            test_module=test_module,
            hdl_toplevel=TOPLEVEL,
            hdl_toplevel_lang="verilog",
            testcase=testcase,
            build_dir=build_dir,
            test_dir=test_dir,
            results_xml=results,
            extra_env=env,
            timescale=TIMESCALE if sim == "icarus" else None,
            waves=waves,
            plusargs=_coverage(sim, "run"),
            log_file=Path(test_dir) / "sim.log",
        )
    except SystemExit as exit:
        # Under pytest the runner exits on a failed test; the messages are in the results.
        if not results.exists():
            raise AssertionError(f"the {sim} simulation ended abnormally (exit status "
                                 f"{exit.code}); log: {Path(test_dir) / 'sim.log'}") from None
    tests, failures = get_results(results)
    if failures:
        reasons = "".join(f"\n  {name}: {message}" for name, message in _failures(results))
        raise AssertionError(f"{failures} of {tests} cocotb tests failed under {sim}; "
                             f"log: {Path(test_dir) / 'sim.log'}{reasons}")
    return Path(test_dir)


def _failures(results_xml):
    """``(test name, message)`` of every failed test in a cocotb results file."""
    from xml.etree import ElementTree
    found = []
    for case in ElementTree.parse(results_xml).getroot().iter("testcase"):
        for outcome in list(case.iter("failure")) + list(case.iter("error")):
            found.append((case.get("name"), outcome.get("message") or outcome.text or "?"))
    return found


def run_programs(config, sim, programs, *, timeout_cycles=None):
    """Run several programs, one after the other, in one simulation of the RTL.

    Each program is ``(dram, prog_addr, prog_len)``; its ``dram`` (``uint8``) is written into
    the DRAM model before it starts (the rest of the DRAM is zeroed), the bench starts the
    NPU over AXI4-Lite, sleeps until the interrupt and reads the status. The NPU is not reset
    between programs, so each one meets the scratchpad and accumulator its predecessor left.
    ``timeout_cycles`` bounds each program (one number for all, or a list with one per
    program); a program that does not end within it fails the run, naming the program.
    ``NPU_BACKPRESSURE=<seed>`` in the environment turns on random back-pressure
    (:class:`sim.bench.Backpressure`).
    The ``hdl`` DRAM is built in the smallest size class that holds the largest image
    (:func:`sim.dram.size_class`): up to the 4 GiB the NPU's addresses reach.
    Returns one :class:`sim.result.RunResult` per program, holding its DRAM after the run.
    """
    from hw.isa import ErrorCode
    from .dram import size_class

    if not isinstance(config, NPUConfig):
        raise TypeError(f"config must be an NPUConfig, not {config!r}")
    (BUILD_ROOT / "runs").mkdir(parents=True, exist_ok=True)
    # The job folder is kept when the run fails, so that its log can be read.
    job = Path(tempfile.mkdtemp(prefix=f"npu-job-{sim}-", dir=BUILD_ROOT / "runs"))
    programs = list(programs)
    if timeout_cycles is None or isinstance(timeout_cycles, int):
        timeout_cycles = [timeout_cycles] * len(programs)
    if len(timeout_cycles) != len(programs):
        raise ValueError(f"timeout_cycles must give one bound per program ({len(programs)}), "
                         f"not {len(timeout_cycles)}")
    specs = []
    for index, ((dram, prog_addr, prog_len), timeout) in enumerate(zip(programs,
                                                                       timeout_cycles)):
        np.save(job / f"dram_in_{index}.npy", np.ascontiguousarray(dram, dtype=np.uint8))
        specs.append({"prog_addr": int(prog_addr), "prog_len": int(prog_len),
                      "timeout_cycles": None if timeout is None else int(timeout)})
    (job / "job.json").write_text(json.dumps({"programs": specs}))
    largest = max((len(dram) for dram, _, _ in programs), default=0)
    run_cocotb(config, sim, "sim.job", extra_env={"NPU_JOB": str(job)}, test_dir=job,
               dram_bytes=size_class(largest))
    results = []
    for index, outcome in enumerate(json.loads((job / "result.json").read_text())):
        results.append(RunResult(
            done=outcome["done"],
            error_code=ErrorCode(outcome["error_code"]),
            error_pc=outcome["error_pc"],
            cycles=outcome["cycles"],
            instructions=outcome["instructions"],
            dram=np.load(job / f"dram_out_{index}.npy"),
            perf=outcome.get("perf"),
        ))
    shutil.rmtree(job)
    return results


def run_program(config, sim, dram, prog_addr, prog_len, *, timeout_cycles=None):
    """Run one program on the RTL: the driver's ``verilator`` and ``icarus`` backends.

    See :func:`run_programs`.
    """
    return run_programs(config, sim, [(dram, prog_addr, prog_len)],
                        timeout_cycles=timeout_cycles)[0]
