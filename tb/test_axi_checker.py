"""Unit tests of :class:`sim.axi_checker.AXI4Checker`: synthetic bus traces, good and bad.

The checker runs in every RTL simulation; these traces show that it stays quiet on a legal
trace (stalls, back-to-back bursts, a burst that ends exactly on a 4 KiB boundary) and that
each broken rule is reported as that rule, with the burst's address and the cycle.
"""

import pytest

from hw.axi import Burst
from hw.config import BUS_WIDTHS
from sim.amaranth_sim import run_simulation
from sim.axi_checker import AXI4Checker, Rule


WIDTH = 64          # bytes per beat: 8, so arsize = 3
SIZE = 3


def ar(addr, length, ready=1, burst=Burst.INCR.value, size=SIZE):
    return dict(arvalid=1, araddr=addr, arlen=length, arsize=size, arburst=burst,
                arready=ready)


def aw(addr, length, ready=1, burst=Burst.INCR.value, size=SIZE):
    return dict(awvalid=1, awaddr=addr, awlen=length, awsize=size, awburst=burst,
                awready=ready)


def w(data, last, ready=1, strb=0xFF):
    return dict(wvalid=1, wdata=data, wstrb=strb, wlast=last, wready=ready)


def r(last, ready=1):
    return dict(rvalid=1, rlast=last, rready=ready, rdata=0x1234)


def b(ready=1):
    return dict(bvalid=1, bready=ready)


def merge(*cycles):
    merged = {}
    for cycle in cycles:
        merged.update(cycle)
    return merged


def run_trace(trace, width=WIDTH):
    """Drive ``trace`` (one dict of bus values per cycle; ``irq`` too) into a checker of a
    ``width``-bit bus; return ``(error, rule, addr, cycle)`` after the last cycle."""
    dut = AXI4Checker(data_width=width)
    names = list(dut.bus.signature.members)
    report = {}

    async def testbench(ctx):
        for values in trace:
            for name in names:
                ctx.set(getattr(dut.bus, name), values.get(name, 0))
            ctx.set(dut.irq, values.get("irq", 0))
            ctx.set(dut.bus_timeout, values.get("bus_timeout", 0))
            await ctx.tick()
        for name in names:
            ctx.set(getattr(dut.bus, name), 0)
        await ctx.tick()
        report.update(error=ctx.get(dut.error), rule=Rule(ctx.get(dut.rule)),
                      addr=ctx.get(dut.addr), cycle=ctx.get(dut.cycle))

    run_simulation(dut, testbench)
    return report["error"], report["rule"], report["addr"], report["cycle"]


GOOD_TRACE = [
    ar(0x1000, 1, ready=0), ar(0x1000, 1, ready=0), ar(0x1000, 1),   # stalled, then taken
    {}, r(0), merge(r(1, ready=0)), r(1),                               # R beat stalled
    ar(0xFF8, 0), r(1),                                                 # ends exactly at 4 KiB
    ar(0x800, 255), *[r(0) for _ in range(255)], r(1),                 # 256 beats, 2 KiB
    aw(0x2000, 2, ready=0), aw(0x2000, 2),
    w(0xA, 0, ready=0), w(0xA, 0), w(0xB, 0), {}, w(0xC, 1), b(),
    aw(0x3000, 0), w(0xD, 1), merge(aw(0x3008, 0), b()), w(0xE, 1), {}, b(),
    {"irq": 1}, {"irq": 1},
]


def test_legal_trace_passes():
    error, rule, _, _ = run_trace(GOOD_TRACE)
    assert (error, rule) == (0, Rule.NONE)


# (name, trace, rule, address reported, cycle of the violation)
BAD_TRACES = [
    ("ar_payload_changes", [ar(0x1000, 1, ready=0), ar(0x1008, 1)], Rule.AR_UNSTABLE,
     0x1008, 1),
    ("ar_valid_drops", [ar(0x1000, 1, ready=0), {}], Rule.AR_UNSTABLE, 0, 1),
    ("aw_len_changes", [aw(0x2000, 1, ready=0), aw(0x2000, 2)], Rule.AW_UNSTABLE, 0x2000, 1),
    ("w_data_changes", [aw(0x2000, 1), w(0x1, 0, ready=0), w(0x2, 0)], Rule.W_UNSTABLE,
     0x2000, 2),
    ("w_valid_drops", [aw(0x2000, 1), w(0x1, 0, ready=0), {}], Rule.W_UNSTABLE, 0x2000, 2),
    ("ar_fixed_burst", [ar(0x1000, 3, burst=Burst.FIXED.value)], Rule.AR_NOT_INCR, 0x1000, 0),
    ("aw_wrap_burst", [aw(0x1000, 3, burst=Burst.WRAP.value)], Rule.AW_NOT_INCR, 0x1000, 0),
    ("ar_narrow", [ar(0x1000, 0, size=2)], Rule.AR_NOT_FULL_WIDTH, 0x1000, 0),
    ("aw_narrow", [aw(0x1000, 0, size=1)], Rule.AW_NOT_FULL_WIDTH, 0x1000, 0),
    ("ar_unaligned", [ar(0x1004, 0)], Rule.AR_UNALIGNED, 0x1004, 0),
    ("aw_unaligned", [aw(0x1001, 0)], Rule.AW_UNALIGNED, 0x1001, 0),
    ("ar_crosses_4k", [ar(0xFF8, 1)], Rule.AR_CROSSES_4K, 0xFF8, 0),
    ("ar_256_beats_cross", [ar(0x808, 255)], Rule.AR_CROSSES_4K, 0x808, 0),
    ("aw_crosses_4k", [{}, aw(0x1FF0, 2)], Rule.AW_CROSSES_4K, 0x1FF0, 1),
    ("w_without_aw", [w(0x1, 1)], Rule.W_BEFORE_AW, 0, 0),
    ("w_with_its_aw", [merge(aw(0x2000, 0), w(0x1, 1))], Rule.W_BEFORE_AW, 0, 0),
    ("wlast_early", [aw(0x2000, 2), w(1, 0), w(2, 1)], Rule.WLAST_EARLY, 0x2000, 2),
    ("wlast_missing", [aw(0x2000, 1), w(1, 0), w(2, 0)], Rule.WLAST_MISSING, 0x2000, 2),
    ("r_without_ar", [r(1)], Rule.R_UNEXPECTED, 0, 0),
    ("rlast_early", [ar(0x1000, 2), r(0), r(1)], Rule.RLAST_WRONG, 0x1000, 2),
    ("rlast_missing", [ar(0x1000, 0), r(0)], Rule.RLAST_WRONG, 0x1000, 1),
    ("b_before_last_w", [aw(0x2000, 1), w(1, 0), b()], Rule.B_UNEXPECTED, 0, 2),
    ("b_without_write", [b()], Rule.B_UNEXPECTED, 0, 0),
    ("irq_with_read_outstanding", [ar(0x1000, 0), {"irq": 1}], Rule.BUSY_AT_IRQ, 0, 1),
    ("irq_with_response_due", [aw(0x2000, 0), w(1, 1), {"irq": 1}], Rule.BUSY_AT_IRQ, 0, 2),
    ("irq_with_valid_up", [merge(ar(0x1000, 0, ready=0), {"irq": 1})], Rule.BUSY_AT_IRQ, 0,
     0),
    ("seventeen_reads", [ar(0x1000 + 8 * i, 0) for i in range(17)], Rule.CHECKER_OVERFLOW, 0,
     16),
]


@pytest.mark.parametrize("name, trace, rule, addr, cycle", BAD_TRACES,
                         ids=[entry[0] for entry in BAD_TRACES])
def test_violation_is_reported(name, trace, rule, addr, cycle):
    error, got_rule, got_addr, got_cycle = run_trace(trace)
    assert error == 1, f"{name}: no violation reported"
    assert (got_rule, got_addr, got_cycle) == (rule, addr, cycle), name


TIMED_OUT = {"bus_timeout": 1}

# After the bus watchdog expired, irq comes with the transactions outstanding; when it falls
# (the soft reset), the NPU abandons them: a valid held drops, the slave forgets its bursts.
TIMEOUT_TRACES = [
    ("read_outstanding", [ar(0x1000, 0), TIMED_OUT, merge(TIMED_OUT, {"irq": 1}),
                          merge(TIMED_OUT, {"irq": 1})]),
    ("valid_held", [ar(0x1000, 0, ready=0), merge(ar(0x1000, 0, ready=0), TIMED_OUT),
                    merge(ar(0x1000, 0, ready=0), TIMED_OUT, {"irq": 1}),
                    {}, ar(0x1008, 0), r(1)]),                 # dropped, forgotten
    ("abandoned", [aw(0x2000, 1), w(1, 0, ready=0), merge(w(1, 0, ready=0), TIMED_OUT),
                   merge(w(1, 0, ready=0), TIMED_OUT, {"irq": 1}),
                   {},                                         # the soft reset drops wvalid
                   ar(0x1000, 0), r(1), aw(0x3000, 0), w(2, 1), b(), {"irq": 1}]),
]


@pytest.mark.parametrize("name, trace", TIMEOUT_TRACES, ids=[t[0] for t in TIMEOUT_TRACES])
def test_bus_timeout_excuses_what_it_abandons(name, trace):
    assert run_trace(trace)[:2] == (0, Rule.NONE), name


def test_busy_at_irq_still_fires_without_the_timeout():
    """Only the watchdog's expiry excuses irq with something outstanding: the same trace
    without it, and after its expiry was forgotten, is reported."""
    error, rule, _, cycle = run_trace([ar(0x1000, 0), {}, {"irq": 1}])
    assert (error, rule, cycle) == (1, Rule.BUSY_AT_IRQ, 2)
    error, rule, _, cycle = run_trace([TIMED_OUT, {}, ar(0x1000, 0), {"irq": 1}])
    assert (error, rule, cycle) == (1, Rule.BUSY_AT_IRQ, 3)
    # A valid dropped without a handshake while the watchdog has not expired (nor just
    # ended its expiry) is still unstable.
    error, rule, _, cycle = run_trace([TIMED_OUT, {}, ar(0x1000, 0, ready=0), {}])
    assert (error, rule, cycle) == (1, Rule.AR_UNSTABLE, 3)


def test_first_violation_is_kept():
    """A later violation does not overwrite the first report."""
    error, rule, addr, cycle = run_trace([ar(0x1004, 0), {}, w(1, 1), ar(0xFF8, 3)])
    assert (error, rule, addr, cycle) == (1, Rule.AR_UNALIGNED, 0x1004, 0)


def test_every_rule_has_a_trace():
    covered = {entry[2] for entry in BAD_TRACES}
    assert covered == set(Rule) - {Rule.NONE}


def _width_traces(width):
    """Legal and broken bursts at ``width`` bits: (name, trace, rule, address reported)."""
    size = (width // 8).bit_length() - 1
    bus_bytes = width // 8
    beats = min(256, 4096 // bus_bytes)            # a whole 4 KiB page, or 256 beats
    full = (1 << bus_bytes) - 1
    last_page = 0x3000 + 4096 - 2 * bus_bytes      # two beats up to a 4 KiB boundary
    good = [ar(0x1000, beats - 1, size=size), *[r(0) for _ in range(beats - 1)], r(1),
            ar(last_page, 1, size=size), r(0), r(1),
            aw(0x2000, 1, size=size), w(1 << (width - 1), 0, strb=full),
            w(1, 1, strb=full >> 1), b()]
    return [
        ("legal", good, Rule.NONE, 0),
        ("ar_narrow", [ar(0x1000, 0, size=size - 1)], Rule.AR_NOT_FULL_WIDTH, 0x1000),
        ("aw_unaligned", [aw(0x1000 + bus_bytes // 2, 0, size=size)], Rule.AW_UNALIGNED,
         0x1000 + bus_bytes // 2),
        ("ar_crosses_4k", [ar(last_page, 2, size=size)], Rule.AR_CROSSES_4K, last_page),
    ]


@pytest.mark.parametrize("width", BUS_WIDTHS)
def test_every_bus_width(width):
    """The width-dependent rules (full-width size, alignment, 4 KiB) at every bus width the
    NPU can be built with, up to 512 bits (64 strobe bits)."""
    for name, trace, rule, addr in _width_traces(width):
        error, got_rule, got_addr, _ = run_trace(trace, width)
        assert (error, got_rule) == (int(rule != Rule.NONE), rule), f"{width} bits: {name}"
        if rule != Rule.NONE:
            assert got_addr == addr, f"{width} bits: {name}"
