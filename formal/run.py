"""Run every proof, every cover and every mutant, and print one line per check.

    python -m formal                 all proofs at full depth, covers, mutants
    python -m formal --quick         the subset that tb/test_formal.py runs
    python -m formal --big           also the default 8x8 array (about five minutes)
    python -m formal -k systolic     only checks whose name contains "systolic"

A proof line reads ``PASS`` when every assert holds to the given depth, a cover line ``PASS``
when every cover is reached within it. A mutant line reads ``CAUGHT`` when the proof fails on
the deliberately broken design, as it must, and ``MISSED`` when it does not. The exit code is 0
only if every line is ``PASS`` or ``CAUGHT``. Work files (RTLIL, SMT-LIB2, logs, the
counterexample ``trace.vcd``) go to ``build/formal/<check>/``.
"""

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from . import mutants
from .dma_props import BurstSplitProperties, DMAProperties
from .engine import available_solver, prove
from .fetcher_props import FetcherProperties
from .pe_props import PEProperties
from .systolic_props import SystolicProperties


__all__ = ["Check", "CHECKS", "select", "run_check", "main"]


@dataclass(frozen=True)
class Check:
    """One solver run: a property set on a design, in BMC or cover mode, to a depth.

    ``quick_depth`` is the depth of the fast subset (``None``: not in it). ``expect`` is
    ``"FAIL"`` for a mutant, whose proof must fail, and must fail on an assert whose source
    line contains ``failure``: a mutant caught for another reason is not counted as caught.
    """
    name: str
    build: Callable[[], object]
    depth: int
    quick_depth: Optional[int] = None
    mode: str = "bmc"
    expect: str = "PASS"
    failure: Optional[str] = None
    big: bool = False


def _systolic(rows, cols, array=None):
    return lambda: SystolicProperties(rows, cols, array() if array else None)


def _array_mutant(cls, rows, cols):
    return lambda: cls(rows, cols)


def _array_with_pe(pe_class, rows, cols, row, col):
    return lambda: mutants.ArrayWithPE(rows, cols, pe_class, row=row, col=col)


CHECKS = [
    # 1. PE
    Check("pe", lambda: PEProperties(), depth=24, quick_depth=12),
    Check("pe", lambda: PEProperties(), depth=8, quick_depth=8, mode="cover"),
    # 2. SystolicArray (the least depth that shows a W2 result is 4R + 2C - 2)
    Check("systolic_2x2", _systolic(2, 2), depth=24, quick_depth=12),
    Check("systolic_2x3", _systolic(2, 3), depth=24, quick_depth=12),
    Check("systolic_3x2", _systolic(3, 2), depth=24),
    Check("systolic_3x3", _systolic(3, 3), depth=24),
    Check("systolic_4x4", _systolic(4, 4), depth=28),
    Check("systolic_8x8", _systolic(8, 8), depth=48, big=True),
    Check("systolic_2x2", _systolic(2, 2), depth=12, quick_depth=12, mode="cover"),
    Check("systolic_3x3", _systolic(3, 3), depth=16, mode="cover"),
    # 3. DMA
    Check("dma_burst_split_32", lambda: BurstSplitProperties(32), depth=1, quick_depth=1),
    Check("dma_burst_split_64", lambda: BurstSplitProperties(64), depth=1, quick_depth=1),
    Check("dma_burst_split_128", lambda: BurstSplitProperties(128), depth=1, quick_depth=1),
    # A 3-bit beat count (a row of up to 7 beats): the page test without a sum.
    Check("dma_burst_split_64x3", lambda: BurstSplitProperties(64, count_bits=3), depth=1,
          quick_depth=1),
    Check("dma_axi", lambda: DMAProperties(), depth=30, quick_depth=12),
    Check("dma_axi", lambda: DMAProperties(), depth=12, quick_depth=12, mode="cover"),
    # 4. The controller's instruction queue never overflows (the least depth that fills it,
    # and that catches the mutant, is 24).
    Check("fetcher_queue", lambda: FetcherProperties(), depth=24, quick_depth=24),
    Check("fetcher_queue", lambda: FetcherProperties(), depth=24, quick_depth=24, mode="cover"),
    # The unmutated copies that the mutants are made from must pass, or a caught mutant
    # could be a difference between the copy and the real block.
    Check("copy:pe", lambda: PEProperties(mutants._PEVariant()), depth=12, quick_depth=12),
    Check("copy:systolic_2x3", _systolic(2, 3, lambda: mutants._ArrayVariant(2, 3)),
          depth=12, quick_depth=12),
    # Mutants: every proof must be able to fail.
    Check("mutant:pe_unsigned_activation",
          lambda: PEProperties(mutants.PEUnsignedActivation()),
          depth=12, quick_depth=12, expect="FAIL", failure="pe.psum_out == expected_psum"),
    Check("mutant:pe_late_commit", lambda: PEProperties(mutants.PELateCommit()),
          depth=12, quick_depth=12, expect="FAIL", failure="pe.psum_out == expected_psum"),
    Check("mutant:systolic_missing_skew_register",
          _systolic(2, 3, _array_mutant(mutants.ArrayMissingSkewRegister, 2, 3)),
          depth=12, quick_depth=12, expect="FAIL", failure="delayed_row"),
    Check("mutant:systolic_short_alignment",
          _systolic(2, 3, _array_mutant(mutants.ArrayShortAlignment, 2, 3)),
          depth=12, quick_depth=12, expect="FAIL",
          failure="array.result.payload[j] == delayed_row"),
    Check("mutant:systolic_pe_unsigned_activation",
          _systolic(2, 3, _array_with_pe(mutants.PEUnsignedActivation, 2, 3, 1, 2)),
          depth=12, quick_depth=12, expect="FAIL", failure="delayed_row"),
    Check("mutant:systolic_pe_late_commit",
          _systolic(2, 3, _array_with_pe(mutants.PELateCommit, 2, 3, 1, 0)),
          depth=12, quick_depth=12, expect="FAIL", failure="delayed_row"),
    Check("mutant:dma_burst_split_ignores_4k",
          lambda: BurstSplitProperties(32, mutants.DMAIgnores4K),
          depth=1, quick_depth=1, expect="FAIL", failure="<= 4096"),
    Check("mutant:dma_axi_ignores_4k", lambda: DMAProperties(dma_class=mutants.DMAIgnores4K),
          depth=12, quick_depth=12, expect="FAIL", failure="<= 4096"),
    Check("mutant:dma_axi_drops_arvalid", lambda: DMAProperties(dma_class=mutants.DMADropsARValid),
          depth=12, quick_depth=12, expect="FAIL", failure="bus.arvalid, bus.arready"),
    Check("mutant:dma_axi_unstable_wdata",
          lambda: DMAProperties(dma_class=mutants.DMAUnstableWData),
          depth=12, quick_depth=12, expect="FAIL", failure="bus.wvalid, bus.wready"),
    Check("mutant:fetcher_queue_high_water_plus_one",
          lambda: FetcherProperties(mutants.FetcherHighWaterPlusOne),
          depth=24, quick_depth=24, expect="FAIL", failure="held + word_in - words.taken"),
    Check("mutant:dma_axi_wlast_stuck", lambda: DMAProperties(dma_class=mutants.DMAWLastStuck),
          depth=12, quick_depth=12, expect="FAIL",
          failure="bus.wlast == (beats_sent == burst_len)"),
]


def select(*, quick=False, big=False, pattern=None):
    """The checks to run, each with the depth to run it at: ``[(check, depth), ...]``."""
    chosen = []
    for check in CHECKS:
        if pattern is not None and pattern not in check.name:
            continue
        if quick:
            if check.quick_depth is not None:
                chosen.append((check, check.quick_depth))
        elif big or not check.big:
            chosen.append((check, check.depth))
    return chosen


def _workdir_name(check, depth):
    return f"{check.name.replace(':', '_')}_{check.mode}_{depth}"


def run_check(check, depth, *, workroot, solver=None):
    """Run one check; returns the :class:`~formal.engine.ProofResult` and whether it came out
    as expected (a proof or cover passes, a mutant fails)."""
    result = prove(check.name, check.build(), depth=depth, mode=check.mode, solver=solver,
                   workdir=Path(workroot) / _workdir_name(check, depth))
    ok = result.status == check.expect
    if check.failure is not None:
        ok = ok and any(check.failure in failed for failed in result.failed)
    return result, ok


def _line(check, result, ok):
    if check.expect == "FAIL":
        verdict = "CAUGHT" if ok else "MISSED"
    else:
        verdict = result.status
    where = ""
    if result.failed and (check.expect == "FAIL" or not ok):
        where = "  " + "; ".join(result.failed)
    elif not ok:
        where = f"  see {result.workdir}"
    return (f"{verdict:7} {check.name:40} {check.mode:5} depth {result.depth:3} "
            f"{result.seconds:7.1f} s{where}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m formal", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="the fast subset that tb/test_formal.py runs")
    parser.add_argument("--big", action="store_true", help="also the slow 8x8 array proof")
    parser.add_argument("-k", dest="pattern", help="only checks whose name contains this")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                        help="checks run at once (default: one per core)")
    parser.add_argument("--workdir", default="build/formal",
                        help="where the work files go (default: build/formal)")
    args = parser.parse_args(argv)

    solver = available_solver()
    chosen = select(quick=args.quick, big=args.big, pattern=args.pattern)
    if not chosen:
        parser.error(f"no check matches {args.pattern!r}")
    print(f"{len(chosen)} checks, solver {solver}, {args.jobs} at once", flush=True)

    start = time.monotonic()
    failures = 0
    # Threads are enough: the work is done by the Yosys and solver subprocesses.
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_check, check, depth, workroot=args.workdir, solver=solver)
                   for check, depth in chosen]
        for (check, _), future in zip(chosen, futures):
            result, ok = future.result()
            failures += not ok
            print(_line(check, result, ok), flush=True)
    print(f"{len(chosen) - failures} passed, {failures} failed "
          f"({time.monotonic() - start:.1f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
