"""The seeds' 2x2 worked trace (section 1.2), produced by simulating the real array.

Cycle convention: cycle 1 is the clock period in which the first activation is on the west
edge of PE(1,1). During cycle ``c`` every PE adds ``weight * west_in`` to ``north_in``
combinationally; the rising edge that ends cycle ``c`` stores the sum in the PE's psum
register, which is the PE's south output from then on. "Y appears at the south edge in cycle
``c``" means the bottom PE computed it during cycle ``c`` (it is readable right after the
``c``-th edge).
"""

from amaranth.sim import Simulator

from hw.systolic import SystolicArray


__all__ = ["SEED_WEIGHTS", "SEED_ACTIVATIONS", "simulate_trace", "format_trace"]


#: W[i][j] is held in PE(i+1, j+1); row i is the reduction axis.
SEED_WEIGHTS = [[1, 2], [3, 4]]
#: X[i][t]: row i of X streams into array row i, one column per time step.
SEED_ACTIVATIONS = [[5, 6], [7, 8]]


def simulate_trace(weights=SEED_WEIGHTS, activations=SEED_ACTIVATIONS):
    """Run the array on ``Y = W^T X`` and record, per cycle, what every PE saw and did.

    Returns ``(events, outputs, results)``: ``events[c]`` lists ``(i, j, west_in, north_in,
    weight, psum)`` for the PEs that held data in cycle ``c`` (1-based indices, as the seeds
    write them); ``outputs[c]`` lists ``(j, t, value)`` for each ``Y[j, t]`` leaving the south
    edge in cycle ``c``; ``results`` are the aligned result rows (``Y[:, t]`` for each t).
    """
    rows, cols = len(weights), len(weights[0])
    steps = len(activations[0])
    dut = SystolicArray(rows, cols)
    pes = dut.mesh.pes
    events, outputs, results = {}, {}, []
    last_cycle = steps + rows + cols - 2

    async def testbench(ctx):
        for row in reversed(weights):
            ctx.set(dut.weight.valid, 1)
            ctx.set(dut.weight.payload, row)
            await ctx.tick()
        ctx.set(dut.weight.valid, 0)

        for cycle in range(1, last_cycle + dut.latency + 1):
            t_in = cycle - 1
            ctx.set(dut.act.valid, t_in < steps)
            if t_in < steps:
                ctx.set(dut.act.payload.lanes, [activations[i][t_in] for i in range(rows)])
                ctx.set(dut.act.payload.commit, t_in == 0)
            # The data a PE holds in this cycle: activation t entered row i at cycle t+1+i.
            seen = []
            for i in range(rows):
                for j in range(cols):
                    t = cycle - 1 - i - j
                    if 0 <= t < steps:
                        seen.append((i, j, t, ctx.get(pes[i][j].a_in),
                                     ctx.get(pes[i][j].psum_in)))
            result_valid = ctx.get(dut.result.valid)
            result = [int(v) for v in ctx.get(dut.result.payload)]
            await ctx.tick()
            if result_valid:
                results.append(result)
            if cycle <= last_cycle:
                events[cycle] = []
                for i, j, t, west, north in seen:
                    psum = ctx.get(pes[i][j].psum_out)
                    events[cycle].append((i + 1, j + 1, west, north, weights[i][j], psum))
                    if i == rows - 1:
                        outputs.setdefault(cycle, []).append((j + 1, t + 1, psum))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    return events, outputs, results


def format_trace():
    """The trace as text, in the form of the seeds' section 1.2."""
    events, outputs, results = simulate_trace()
    rows, cols = len(SEED_WEIGHTS), len(SEED_WEIGHTS[0])
    lines = ["Weight-stationary 2x2 array, Y = W^T X (simulated with Amaranth)", "",
             "Weights loaded once, before cycle 1:"]
    for i in range(rows):
        lines.append("  " + "        ".join(f"PE({i + 1},{j + 1}): w{i + 1}{j + 1} = "
                                           f"{SEED_WEIGHTS[i][j]}" for j in range(cols)))
    lines += ["", "X streams in from the west, row i delayed i-1 cycles:"]
    steps = len(SEED_ACTIVATIONS[0])
    width = steps + rows - 1
    lines.append("  cycle:        " + "".join(f"{c:>5}" for c in range(1, width + 1)))
    for i in range(rows):
        cells = []
        for c in range(1, width + 1):
            t = c - 1 - i
            cells.append(f"{SEED_ACTIVATIONS[i][t]:>5}" if 0 <= t < steps else "    -")
        lines.append(f"  row {i + 1} west-in:" + "".join(cells))
    for cycle in sorted(events):
        lines += ["", f"Cycle {cycle}"]
        busy = {(i, j) for i, j, *_ in events[cycle]}
        for i, j, west, north, weight, psum in events[cycle]:
            lines.append(f"  PE({i},{j}): west_in={west}, north_in={north}  ->  "
                         f"psum = {north} + {weight}x{west} = {psum}")
        for i in range(1, rows + 1):
            for j in range(1, cols + 1):
                if (i, j) not in busy:
                    lines.append(f"  PE({i},{j}): idle")
        for j, t, value in outputs.get(cycle, []):
            lines.append(f"  >>> Y[j={j}, t={t}] = {value} leaves the south edge <<<")
    lines += ["", "Aligned rows leaving the array (one per time step t): " +
              ", ".join(str(r) for r in results)]
    y = [[results[t][j] for t in range(len(results))] for j in range(cols)]
    lines.append(f"Y = {y}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_trace())
