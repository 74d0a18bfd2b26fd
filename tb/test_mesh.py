"""Unit tests of :class:`hw.mesh.Mesh`: the bare PE grid, with the skew driven by hand."""

import numpy as np
import pytest

from hw.mesh import Mesh
from sim.amaranth_sim import run_simulation


@pytest.mark.parametrize("rows, cols, seed", [(1, 1, 1), (2, 3, 2), (3, 2, 3), (4, 4, 4)])
def test_skewed_stream_times_weights(rows, cols, seed):
    """Activation row t, fed to mesh row i in cycle t + i, leaves column j as
    sum_i a[t, i] * w[i, j] after tick t + rows + j, and the south edge is zero otherwise."""
    rng = np.random.default_rng(seed)
    length = 6
    weights = rng.integers(-128, 128, size=(rows, cols))
    acts = rng.integers(-128, 128, size=(length, rows))
    acts[0] = -128
    weights[0, 0] = -128
    expected = acts @ weights
    dut = Mesh(rows, cols)

    async def testbench(ctx):
        # Shadow weights: the row shifted in first ends up at the bottom.
        ctx.set(dut.weight_shift, 1)
        for i in reversed(range(rows)):
            ctx.set(dut.north_weight, [int(w) for w in weights[i]])
            await ctx.tick()
        ctx.set(dut.weight_shift, 0)
        for cycle in range(length + rows + cols + 2):
            for i in range(rows):
                t = cycle - i
                valid = 0 <= t < length
                ctx.set(dut.west[i], int(acts[t, i]) if valid else 0)
                ctx.set(dut.west_commit[i], int(t == 0))
            await ctx.tick()
            for j in range(cols):
                t = cycle + 1 - rows - j
                want = int(expected[t, j]) if 0 <= t < length else 0
                got = ctx.get(dut.south[j])
                assert got == want, \
                    f"seed {seed}: after tick {cycle + 1}, south[{j}] = {got}, expected {want}"

    run_simulation(dut, testbench)
