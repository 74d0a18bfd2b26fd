"""Unit tests of :class:`hw.dma.length_queue.LengthQueue` (the DMA reader's queue of the
bursts it asked for): random pushes and pops against a Python deque, cycle by cycle."""

from collections import deque

import numpy as np
import pytest

from hw.dma.length_queue import LengthQueue
from sim.amaranth_sim import run_simulation


@pytest.mark.parametrize("depth, push_probability, seed", [
    (8, 0.5, 0x1E0), (8, 0.8, 0x1E1), (2, 0.5, 0x1E2), (1, 0.6, 0x1E3)])
def test_against_a_deque(depth, push_probability, seed):
    """In every cycle: ``r_rdy``, ``w_rdy`` and ``head`` as the deque's, and ``r_rdy_next``
    as the deque after the cycle's pop and push; when it is not empty then, its head is the
    value pushed now (``w_to_head``), else ``head_next``."""
    rng = np.random.default_rng(seed)
    dut = LengthQueue(depth)
    model = deque()

    async def testbench(ctx):
        for cycle in range(600):
            push = bool(rng.random() < push_probability)
            pop = bool(rng.random() < 0.5)
            value = int(rng.integers(0, 512))
            ctx.set(dut.w_en, push)
            ctx.set(dut.w_data, value)
            ctx.set(dut.r_en, pop)
            context = f"seed {seed:#x}, cycle {cycle}"
            assert ctx.get(dut.r_rdy) == bool(model), context
            assert ctx.get(dut.w_rdy) == (len(model) < depth), context
            if model:
                assert ctx.get(dut.head) == model[0], context
            room = len(model) < depth          # a push is taken only when not full
            if pop and model:
                model.popleft()
            to_head = push and room and not model
            if push and room:
                model.append(value)
            assert ctx.get(dut.r_rdy_next) == bool(model), context
            assert ctx.get(dut.w_to_head) == to_head, context
            if model and not to_head:
                assert ctx.get(dut.head_next) == model[0], context
            await ctx.tick()
    run_simulation(dut, testbench)
