"""`npu trace`: the seeds' 2x2 trace, as simulated on the real array."""

from sim.trace import format_trace, simulate_trace


def test_outputs_leave_in_the_seeds_cycles():
    events, outputs, results = simulate_trace()
    # outputs[c]: (j, t, Y[j, t]) computed by the bottom PE in cycle c.
    assert outputs == {2: [(1, 1, 26)], 3: [(1, 2, 30), (2, 1, 38)], 4: [(2, 2, 44)]}
    assert results == [[26, 38], [30, 44]]
    # Cycle 2 of the seeds: PE(2,1) gets west 7 and north 5 and computes 5 + 3x7.
    assert (2, 1, 7, 5, 3, 26) in events[2]
    assert (2, 2, 8, 12, 4, 44) in events[4]
    assert [pe[:2] for pe in events[1]] == [(1, 1)]


def test_text_is_in_the_seeds_form():
    text = format_trace()
    assert "PE(2,1): west_in=7, north_in=5  ->  psum = 5 + 3x7 = 26" in text
    assert ">>> Y[j=2, t=2] = 44 leaves the south edge <<<" in text
    assert "Y = [[26, 30], [38, 44]]" in text
