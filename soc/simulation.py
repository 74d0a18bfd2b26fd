"""The whole SoC under Verilator: the NPU, LiteDRAM with its SDRAM model, the UART bridge.

LiteX's simulation builder (``litex.build.sim``, what ``litex_sim`` uses) Verilates the SoC
with the same gateware as the board; only the pads differ: the clock comes from the
simulator's clocker, the SDRAM chip is LiteDRAM's ``SDRAMPHYModel`` (the ULX3S's chip, with its
timings at the board's clock) and the UART pads are a byte stream that LiteX's ``serial2tcp``
module puts on a TCP port. The host connects to ``socket://127.0.0.1:<port>`` with the very
client that talks to the board's USB serial port (:mod:`sw.board`), so the only thing that
differs from the board is the wire.

Builds are cached in ``build/soc-sim/<config>-<hash>`` (the hash covers ``hw/`` and ``soc/``),
made once per configuration under a file lock that parallel test workers share.
"""

import hashlib
import os
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from hw.config import NPUConfig
from sim.runner import locked, prune_builds
from .memory_map import SDRAM_DATA_WIDTH, SDRAM_MODULE


__all__ = ["SIM_CLK_FREQ", "SimulatedSoC", "build", "sdram_module", "SoCSimError"]


PROJECT_ROOT = Path(__file__).resolve().parent.parent
BUILD_ROOT = Path(os.environ.get("NPU_BUILD_DIR", PROJECT_ROOT / "build")) / "soc-sim"

#: The simulated SoC's clock in Hz, the ULX3S build's (:data:`soc.ulx3s.SYS_CLK_FREQ`), so
#: that LiteDRAM's timings in cycles are the board's.
SIM_CLK_FREQ = 50_000_000
#: The UART bridge's timeout is 100 ms of this clock: in simulation, 100 M cycles, so that a
#: slow host never looks like a dropped byte.
SIM_UART_CLK_FREQ = 1_000_000_000
#: Seconds to wait for the simulated SoC to open its TCP port.
START_SECONDS = 60


class SoCSimError(RuntimeError):
    """The simulated SoC could not be built or started (the message says why)."""


def sdram_module(clk_freq):
    """LiteDRAM's model of the ULX3S's SDRAM chip at ``clk_freq`` (single data rate)."""
    from litedram import modules
    return getattr(modules, SDRAM_MODULE)(clk_freq, "1:1")


#: The files of soc/ that the simulated SoC is built from.
GATEWARE_SOURCES = ("__init__.py", "memory_map.py", "npu.py", "soc.py", "simulation.py")


def _source_hash():
    digest = hashlib.sha256()
    # hw/ and the SoC's gateware with its simulated pads; not the board targets (ulx3s.py).
    sources = sorted((PROJECT_ROOT / "hw").rglob("*.py")) + [
        PROJECT_ROOT / "soc" / name for name in GATEWARE_SOURCES]
    for source in sources:
        digest.update(str(source.relative_to(PROJECT_ROOT)).encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()[:12]


def build_dir(config):
    """The folder of ``config``'s simulated SoC build."""
    return BUILD_ROOT / f"{config.key()}-{_source_hash()}"


@contextmanager
def _quiet(stream):
    """LiteX's prints and log records go to ``stream`` while the block runs."""
    import contextlib
    import logging
    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = [handler]
    try:
        with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
            yield
    finally:
        root.handlers = saved


def _make_soc(config, folder):
    from litex.build.generic_platform import Pins, Subsignal
    from litex.build.sim import SimPlatform
    from litex.soc.cores.uart import RS232PHYModel
    from litex.soc.integration.common import get_mem_data  # noqa: F401 (LiteX's own import)
    from litedram.phy.model import SDRAMPHYModel
    from migen.genlib.io import CRG

    from .soc import NPUSoC

    io = [
        ("sys_clk", 0, Pins(1)),
        ("sys_rst", 0, Pins(1)),
        ("serial", 0,
            Subsignal("source_valid", Pins(1)),
            Subsignal("source_ready", Pins(1)),
            Subsignal("source_data",  Pins(8)),
            Subsignal("sink_valid",   Pins(1)),
            Subsignal("sink_ready",   Pins(1)),
            Subsignal("sink_data",    Pins(8))),
    ]
    platform = SimPlatform("SIM", io)
    module = sdram_module(SIM_CLK_FREQ)
    sdram_phy = SDRAMPHYModel(module=module, data_width=SDRAM_DATA_WIDTH, clk_freq=SIM_CLK_FREQ)

    class SimNPUSoC(NPUSoC):
        def __init__(self):
            self.crg = CRG(platform.request("sys_clk"))
            NPUSoC.__init__(self, platform, config, sys_clk_freq=SIM_CLK_FREQ,
                            build_dir=folder / "npu", sdram_phy=sdram_phy,
                            sdram_module=module, uart_clk_freq=SIM_UART_CLK_FREQ,
                            uart_phy=RS232PHYModel(platform.request("serial")))
    return SimNPUSoC()


def _sim_config(port):
    from litex.build.sim.config import SimConfig
    sim_config = SimConfig()
    sim_config.add_clocker("sys_clk", freq_hz=SIM_CLK_FREQ)
    sim_config.add_module("serial2tcp", "serial", args={"port": port})
    return sim_config


def build(config):
    """Build ``config``'s simulated SoC unless it is built; returns its gateware folder (with
    ``obj_dir/Vsim``)."""
    if not isinstance(config, NPUConfig):
        raise TypeError(f"config must be an NPUConfig, not {config!r}")
    folder = build_dir(config)
    gateware = folder / "gateware"
    with locked(folder.with_name(folder.name + ".lock")):
        if (folder / "build.ok").exists():
            (folder / "build.ok").touch()
            return gateware
        prune_builds(BUILD_ROOT, _source_hash())
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        from litex.soc.integration.builder import Builder
        from sim.toolchain import setup_verilator
        setup_verilator()
        # LiteX reports every step on the terminal: to a log of the build instead.
        with open(folder / "litex.log", "w") as report, _quiet(report):
            soc = _make_soc(config, folder)
            builder = Builder(soc, output_dir=str(folder), compile_software=False,
                              csr_csv=str(folder / "csr.csv"))
            # LiteX's simulation toolchain writes the sources and the build script here; it
            # only compiles when it also runs, so the script is run below.
            builder.build(sim_config=_sim_config(1234), run=False, interactive=False,
                          opt_level="O2")
        from .soc import write_host_description
        write_host_description(soc, folder)
        log = folder / "build.log"
        with open(log, "w") as output:
            result = subprocess.run(["bash", "build_sim.sh"], cwd=gateware, stdout=output,
                                    stderr=subprocess.STDOUT)
        if result.returncode != 0 or not (gateware / "obj_dir" / "Vsim").exists():
            tail = log.read_text().splitlines()[-15:]
            raise SoCSimError(f"building the simulated SoC for {config.name} failed "
                              f"(see {log}):\n" + "\n".join(tail))
        (folder / "build.ok").write_text(config.to_json())
    return gateware


def _listening(port):
    """Whether a TCP socket listens on ``port`` (Linux: ``/proc/net/tcp``, state 0A)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "0A":
            return True
    return False


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class SimulatedSoC:
    """The simulated SoC for ``config``, running while the ``with`` block runs.

    ``with SimulatedSoC(config) as soc:`` builds it if needed, starts the Verilated SoC on a
    free TCP port and waits until the port answers; ``soc.url`` is the address for
    :class:`sw.board.BoardLink` (``socket://127.0.0.1:<port>``). Leaving the block stops it.

    Attributes
    ----------
    url : str
    dram_size : int
        Bytes of SDRAM in the SoC.
    log : pathlib.Path
        What the simulation printed.
    """
    def __init__(self, config):
        self.config = config
        self.url = None
        self.process = None
        self.log = None

    def __enter__(self):
        gateware = build(self.config)
        # One run folder per simulation, so that parallel ones do not share sim_config.js.
        run = Path(os.environ.get("TMPDIR", "/tmp")) / f"npu-soc-{os.getpid()}-{id(self)}"
        shutil.rmtree(run, ignore_errors=True)
        run.mkdir(parents=True)
        # The simulation loads its modules (modules/*.so) and memory contents (*.init) from
        # its working folder.
        for entry in gateware.iterdir():
            if entry.name != "sim_config.js":
                (run / entry.name).symlink_to(entry)
        port = _free_port()
        (run / "sim_config.js").write_text(_sim_config(port).get_json())
        self.run_dir = run
        self.log = run / "sim.log"
        self._log_file = open(self.log, "w")
        self.process = subprocess.Popen([str(gateware / "obj_dir" / "Vsim")], cwd=run,
                                        stdin=subprocess.DEVNULL, stdout=self._log_file,
                                        stderr=subprocess.STDOUT)
        # Wait for the port to listen without connecting to it: serial2tcp keeps one session,
        # and a probing connection closed while the host's is accepted frees the host's.
        deadline = time.monotonic() + START_SECONDS
        while not _listening(port):
            if self.process.poll() is not None:
                self._stop()
                raise SoCSimError(f"the simulated SoC stopped at start (exit "
                                  f"{self.process.returncode}); see {self.log}")
            if time.monotonic() > deadline:
                self._stop()
                raise SoCSimError(f"the simulated SoC did not open port {port} within "
                                  f"{START_SECONDS} s; see {self.log}")
            time.sleep(0.05)
        self.url = f"socket://127.0.0.1:{port}"
        self.description = gateware.parent / "soc.json"
        return self

    def _stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log_file.close()

    def __exit__(self, exc_type, exc, traceback):
        self._stop()
        if exc_type is None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        elif exc is not None and exc.args:
            # What the simulation printed may say why; its folder stays.
            exc.args = (f"{exc.args[0]} (the simulated SoC's log: {self.log})",) + exc.args[1:]
        return False
