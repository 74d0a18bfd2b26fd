"""Unit tests of :class:`hw.controller.hazards.Hazards` alone: its ``ready`` flags, decided a
cycle ahead from the units' flags after the next edge (``ahead``), with ``late``, against
its own hazard terms of the cycle they are for (``blocked``), under random unit statuses
that keep the units' contract. The terms themselves, row by row of the hazard table, are
tb/test_issue.py's."""

import numpy as np
import pytest

from hw.controller.hazards import Hazards
from hw.controller.signatures import KIND_OPCODES, UNIT_KINDS
from sim.amaranth_sim import run_simulation


KINDS = tuple(KIND_OPCODES)
UNITS = ("load", "weights", "stream", "store")
SLOTS = 2


def rows(rng, top=12):
    """A random [lo, hi) range of rows (often empty or overlapping others)."""
    lo = int(rng.integers(0, top))
    return {"lo": lo, "hi": lo + int(rng.integers(0, 4))}


def head(rng):
    kind = {name: 0 for name in KINDS}
    kind[KINDS[int(rng.integers(0, len(KINDS)))]] = 1
    byte = int(rng.integers(0, 64))
    return {"kind": kind, "spad": rows(rng), "acc": rows(rng), "lo": byte,
            "hi": byte + int(rng.integers(0, 16))}


def flags(rng, unit):
    """A unit's flags (those of its ``ahead``), at random: each holds an instruction back
    in one cycle out of four."""
    bit = lambda: int(rng.integers(0, 4) == 0)   # noqa: E731
    return {"load": lambda: {"busy": bit(), "to_spad": bit(), "to_acc": bit()},
            "weights": lambda: {"busy": bit()},
            "stream": lambda: {"busy": bit(), "free": 1 - bit(), "full": bit(),
                               "drained": 1 - bit(), "in_use": bit() | bit() << 1},
            "store": lambda: {"busy": bit()}}[unit]()


def write(rng):
    return {"valid": int(rng.integers(0, 2)), "addr": int(rng.integers(0, 12))}


def next_status(rng, unit, status, now_head, unit_flags):
    """The unit's status after an edge: ``unit_flags``, and its ranges the head's where they
    follow it, else its own; the accumulator's writes move down its pipeline."""
    follow = lambda name, yes: now_head[name] if yes else status[name]    # noqa: E731
    new = {**status, **{k: v for k, v in unit_flags.items() if k != "in_use"},
           "follows": int(rng.integers(0, 2))}
    if unit in ("load", "weights", "stream"):
        new["spad"] = follow("spad", status["follows"])
    if unit == "store":
        new.update(acc=follow("acc", status["follows"]), lo=follow("lo", status["follows"]),
                   hi=follow("hi", status["follows"]))
    if unit == "stream":
        new["writes"] = [
            {"valid": (unit_flags["in_use"] >> i) & 1,
             "acc": now_head["acc"] if status["slot_follows"] >> i & 1 else write_["acc"]}
            for i, write_ in enumerate(status["writes"])]
        new["slot_follows"] = int(rng.integers(0, 1 << SLOTS))
        new["unseen"] = [status["writing"], status["unseen"][0]]
        new["writing"] = write(rng)
    return new


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_ready_a_cycle_ahead(seed):
    """Every cycle, for the head's kind: ``ready`` (made in the cycle before, from both ways
    and the decision) and not ``late`` exactly when the head waits for nothing
    (``blocked``). The block also asserts it (``Assert``)."""
    rng = np.random.default_rng(seed)
    dut = Hazards()
    checked = {kind: [0, 0] for kind in KINDS}      # kind: [ready, blocked] cycles

    async def testbench(ctx):
        now_head, head_valid = head(rng), 1
        statuses = {unit: {"spad": rows(rng), "follows": 1, **flags(rng, unit)}
                    for unit in UNITS}
        statuses["store"].update(acc=statuses["store"].pop("spad"), lo=0, hi=0)
        del statuses["stream"]["in_use"]
        statuses["stream"].update(
            writes=[{"valid": 0, "acc": rows(rng)} for _ in range(SLOTS)], slot_follows=0,
            writing=write(rng), unseen=[write(rng), write(rng)])
        for cycle in range(1000):
            context = f"seed {seed}, cycle {cycle}"
            entry, front, issue = head(rng), int(rng.integers(0, 2)), int(rng.integers(0, 2))
            load = front & (1 - head_valid | issue)
            reader_busy = int(rng.integers(0, 4) == 0)
            ctx.set(dut.head, now_head)
            ctx.set(dut.next_head.head_copy, now_head)
            ctx.set(dut.head_valid, head_valid)
            ctx.set(dut.next_head.entry, entry)
            ctx.set(dut.next_head.entry_copy, entry)
            ctx.set(dut.next_head.front, front)
            ctx.set(dut.next_head.load, load)
            ctx.set(dut.issue, issue)
            ctx.set(dut.running, cycle >= 1)     # the copies of the unseen writes' flags
            ctx.set(dut.reader_busy, reader_busy)
            after = {}
            for unit, status in statuses.items():
                takes = issue & any(now_head["kind"][kind] for kind in UNIT_KINDS[unit])
                chosen, other = flags(rng, unit), flags(rng, unit)
                ahead = {"taken": chosen, "idle": other} if takes else \
                    {"taken": other, "idle": chosen}
                ctx.set(getattr(dut, unit), {**status, "ahead": ahead})
                after[unit] = next_status(rng, unit, status, now_head, chosen)
            kind = next(k for k in KINDS if now_head["kind"][k])
            if cycle >= 2 and head_valid:
                ready = ctx.get(dut.ready[kind]) & (1 - ctx.get(dut.late[kind]))
                blocked = ctx.get(dut.blocked.as_value())
                assert ready == (blocked == 0), f"{context}: {kind}"
                checked[kind][ready] += 1
            await ctx.tick()
            statuses = after
            head_valid = load | (head_valid & (1 - issue))
            now_head = entry if load else now_head
        print(f"seed {seed}: (waits, issues) checked per kind: {checked}")
        assert all(waits and issues for waits, issues in checked.values()), checked

    run_simulation(dut, testbench)
