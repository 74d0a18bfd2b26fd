"""Unit tests of :class:`hw.controller.error_arbiter.ErrorArbiter`: the earliest error in
program order from the order of issue (age bits), ties to the first source, the pending
error's source kept only while recording, and the assertion that the order of issue and the
pcs agree."""

import pytest

from hw.controller.error_arbiter import FAULT_SOURCES, ErrorArbiter
from sim.amaranth_sim import run_simulation


NONE = {"valid": 0, "code": 0, "pc": 0}


def arbitrate(steps):
    """Run the arbiter over ``steps``: each ``(issued, pending, faults, record)`` with
    ``issued`` one of None, "load", "store" (in the cycle before), ``pending`` a
    ``(code, pc)`` or None, ``faults`` {source: (code, pc)}. Returns ``first`` of each step
    as ``(code, pc)`` or None."""
    dut = ErrorArbiter()
    seen = []

    async def testbench(ctx):
        for issued, pending, faults, record in steps:
            ctx.set(dut.load_issued, issued == "load")
            ctx.set(dut.store_issued, issued == "store")
            await ctx.tick()
            ctx.set(dut.load_issued, 0)
            ctx.set(dut.store_issued, 0)
            ctx.set(dut.pending, NONE if pending is None else
                    {"valid": 1, "code": pending[0], "pc": pending[1]})
            ctx.set(dut.faults, [{"valid": 1, "code": faults[name][0], "pc": faults[name][1]}
                                 if name in faults else NONE for name in FAULT_SOURCES])
            ctx.set(dut.record, record)
            first = ctx.get(dut.first)
            seen.append((first.code, first.pc) if first.valid else None)
        await ctx.tick()             # the assertions are checked at the edge
    run_simulation(dut, testbench)
    return seen


def test_earliest_by_order_of_issue():
    # A load issued at pc 2, then a store at pc 3: the load's fault is the older.
    assert arbitrate([("load", None, {}, 1),
                      ("store", None, {"load": (7, 2), "store": (9, 3)}, 1)]) == [None, (7, 2)]
    # The store issued before the load: the store's.
    assert arbitrate([("store", None, {}, 1),
                      ("load", None, {"load": (7, 3), "store": (9, 2)}, 1)]) == [None, (9, 2)]


def test_units_before_the_issue_stage_and_ties_to_the_first_source():
    assert arbitrate([("store", None, {"issue": (4, 6), "store": (9, 5)}, 1)]) == [(9, 5)]
    assert arbitrate([(None, (1, 3), {"store": (9, 3)}, 1)]) == [(1, 3)]


@pytest.mark.parametrize("first, later, expected", [
    ("store", {"load": (7, 2)}, (7, 2)),     # the load, issued before the store, is older
    ("load", {"store": (7, 5)}, (9, 4)),     # the store, issued after the load, is newer
])
def test_pending_keeps_its_source(first, later, expected):
    # One unit's fault (pc 4) becomes pending and stays a cycle alone; then the other unit
    # faults.
    other = "load" if first == "store" else "store"
    issued = [other, first] if first == "store" else [first, other]
    steps = [(issued[0], None, {}, 1), (issued[1], None, {first: (9, 4)}, 1),
             (None, (9, 4), {}, 1), (None, (9, 4), later, 1)]
    assert arbitrate(steps) == [None, (9, 4), (9, 4), expected]


def test_order_that_contradicts_the_pcs_fails_the_assertion():
    # The store issued last but its pc is below the load's: no program makes this.
    with pytest.raises(AssertionError, match="error candidates 3 and 2 out of order"):
        arbitrate([("load", None, {}, 1), ("store", None, {"load": (7, 5), "store": (9, 2)}, 1)])
