"""The issue stage's hazard checks: for each kind of instruction, whether the head would wait
for a unit, decided a cycle ahead into flip-flops."""

from types import SimpleNamespace

from amaranth.hdl import Assert, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .load_unit import LoadStatus
from .signatures import KIND_OPCODES, UNIT_KINDS, Decoded, Issuable, NextHeadSignature
from .store_unit import StoreStatus
from .streamer import WRITEBACK_SLOTS, StreamStatus
from .weight_loader import WeightStatus


__all__ = ["Hazards", "Blocked"]


class Blocked(data.Struct):
    """What the head waits for in this cycle (for the stall counters): the load unit (or
    the DMA reader), the array (the weight loader, the streamer, the accumulator's writes),
    the store unit."""
    load:  1
    array: 1
    store: 1


def waits_of(f):
    """For each kind of instruction, the terms (load, array, store) that hold it back, from
    the flags in ``f``: an instruction waits while it would conflict with one that a unit
    still runs (scratchpad rows, accumulator rows, DRAM bytes, the shadow weights, the
    requantization state). A store starts only once no load before it can still fail."""
    return {
        "end":        (f.load_busy | f.reader_busy, f.weights_busy | ~f.drained, f.store_busy),
        "load_spad":  (f.load_busy, (f.stream_busy & f.spad_vs_stream) |
                       (f.weights_busy & f.spad_vs_weights), f.store_busy & f.bytes_vs_store),
        "load_acc":   (f.load_busy, ~f.drained, f.store_busy),
        "load_quant": (f.load_busy, 0, f.store_busy),
        "preload":    (f.load_to_spad & f.spad_vs_load, f.weights_busy, 0),
        "matmul":     (f.load_to_acc | (f.load_to_spad & f.spad_vs_load),
                       ~f.stream_free | f.stream_full | f.weights_busy,
                       f.store_busy & f.acc_vs_store),
        "store":      (f.load_busy, f.store_raw, f.store_busy),
    }


class Hazards(wiring.Component):
    """Compares the head with what each unit holds, a cycle ahead.

    Each comparison of the head with a unit's rows or bytes is made in the cycle before,
    into a flip-flop, between the next head (the decoder's front entry if the head takes
    it, else this head) and what the unit's registers will hold (the head's, if they follow
    it, else their own). From the same comparisons and the units' flags after the next edge
    (``ahead``), both ways, ``ready`` is made a cycle ahead too: for each kind, the flags
    as they will be if the head issues now and if it does not, with ``issue`` choosing
    between them last. The issue decision is then the head's kind (``issuable``) and these
    flip-flops, two LUT levels, not the terms below (asserted equal to them).

    Attributes
    ----------
    head : In(Decoded)
    head_valid : In(1)
    next_head : In(NextHeadSignature())
    load, weights, stream, store : In(...)
        The units' status.
    reader_busy : In(1)
        The DMA reader is busy (END waits for it; not in ``ready``).
    issue : In(1)
        The head issues in this cycle.
    running : In(1)
    ready : Out(Issuable)
        From flip-flops: a head of this kind would wait for none of its units, but for the
        terms of ``late``.
    late : Out(Issuable)
        The terms ``ready`` leaves out, each a LUT of flip-flops: END waits for the DMA
        reader and the array's drain, ``LOAD_ACC`` for the drain, a store for the writes in
        the accumulator's pipeline that its first read would miss.
    blocked : Out(Blocked)
        What the head, of its own kind, waits for in this cycle.
    """
    def __init__(self):
        super().__init__({
            "head":        In(Decoded),
            "head_valid":  In(1),
            "next_head":   In(NextHeadSignature()),
            "load":        In(LoadStatus),
            "weights":     In(WeightStatus),
            "stream":      In(StreamStatus),
            "store":       In(StoreStatus),
            "reader_busy": In(1),
            "issue":       In(1),
            "running":     In(1),
            "ready":       Out(Issuable),
            "blocked":     Out(Blocked),
            "late":        Out(Issuable),
        })

    def elaborate(self, platform):
        m = Module()
        head, next_head = self.head, self.next_head
        load, weights, stream_, store = self.load, self.weights, self.stream, self.store
        # Whether the head register takes the front entry at the next edge, if the head
        # does not issue now and if it does (``next_head.load`` is one of the two).
        loads = {"idle": next_head.front & ~self.head_valid, "taken": next_head.front}

        def compared(name, compare, ours, theirs, follows=None):
            """The comparison of the next head with ``theirs`` (or with the head, if the
            unit's registers follow it), into a flip-flop; and its value after the next
            edge, both ways."""
            entry, now = ours(next_head.entry_copy), ours(next_head.head_copy)
            if follows is None:
                with_entry, with_head = compare(entry, theirs), compare(now, theirs)
            else:
                with_entry = Mux(follows, compare(entry, now), compare(entry, theirs))
                with_head = Mux(follows, compare(now, now), compare(now, theirs))
            flag = Signal(name=f"{name}_ahead")
            m.d.sync += flag.eq(Mux(next_head.load, with_entry, with_head))
            return flag, {way: Mux(take, with_entry, with_head) for way, take in loads.items()}

        def overlaps(a, b):              # [lo, hi) ranges, as (lo, hi) pairs
            return (a[0] < b[1]) & (b[0] < a[1])

        def holds(a, b):                 # a [lo, hi) range holds row b[0]
            return (a[0] <= b[0]) & (b[0] < a[1])

        def spad_of(entry):
            return (entry.spad.lo, entry.spad.hi)

        def acc_of(entry):
            return (entry.acc.lo, entry.acc.hi)

        def bytes_of(entry):
            return (entry.lo, entry.hi)

        def pair(rows):
            return (rows.lo, rows.hi)

        flags = {
            "spad_vs_stream": compared("spad_vs_stream", overlaps, spad_of,
                                       pair(stream_.spad), stream_.follows),
            "spad_vs_weights": compared("spad_vs_weights", overlaps, spad_of,
                                        pair(weights.spad), weights.follows),
            "spad_vs_load": compared("spad_vs_load", overlaps, spad_of, pair(load.spad),
                                     load.follows),
            "acc_vs_store": compared("acc_vs_store", overlaps, acc_of, pair(store.acc),
                                     store.follows),
            "bytes_vs_store": compared("bytes_vs_store", overlaps, bytes_of,
                                       (store.lo, store.hi), store.follows),
        }

        # A store reads accumulator rows: it waits for MATMULs that still write any of them,
        # and for the writes of its rows that its first read, in the cycle after the issue,
        # would miss: those in the accumulator's pipeline one and two cycles after their
        # acceptance (next cycle, this cycle's write and the first of them). Each of those
        # is a flip-flop (``unseen_hit_<i>``): the write's valid flag and the comparison,
        # made a cycle ahead both ways and chosen by the decision; the valid flags of the
        # accumulator's stages sit by its block RAM, across the die, and the array's result
        # (the next write's) by the array, so they reach only these, not ``ready``.
        slots = [compared(f"acc_vs_slot{i}", overlaps, acc_of, pair(stream_.writes[i].acc),
                          stream_.slot_follows[i]) for i in range(WRITEBACK_SLOTS)]
        unseen_next = [stream_.writing, stream_.unseen[0]]
        assert len(unseen_next) == len(stream_.unseen)
        unseen_hits = []
        for i, write in enumerate(unseen_next):
            hit, hit_ways = compared(f"acc_vs_unseen{i}", holds, acc_of, (write.addr,))
            unseen_hit = Signal(name=f"unseen_hit_{i}")
            m.d.sync += unseen_hit.eq(write.valid & Mux(self.issue, hit_ways["taken"],
                                                        hit_ways["idle"]))
            m.d.sync += Assert(~self.running | (unseen_hit == (stream_.unseen[i].valid & hit)),
                               f"issue stage: unseen write {i}'s flag out of step")
            unseen_hits.append(unseen_hit)

        # The flags now, and after the next edge both ways: a unit takes a command only if
        # the head issues and is of its kind.
        units = {"load": load, "weights": weights, "stream": stream_, "store": store}
        unit_flags = {   # the unit's flag: its name in waits_of
            "load":    {"busy": "load_busy", "to_spad": "load_to_spad",
                        "to_acc": "load_to_acc"},
            "weights": {"busy": "weights_busy"},
            "stream":  {"busy": "stream_busy", "free": "stream_free", "full": "stream_full",
                        "drained": "drained", "in_use": "in_use"},
            "store":   {"busy": "store_busy"},
        }
        now = SimpleNamespace(reader_busy=self.reader_busy,
                              in_use=Cat(*[write.valid for write in stream_.writes]),
                              **{name: flag for name, (flag, _) in flags.items()})
        ways = {way: SimpleNamespace(reader_busy=0, **{
            name: nexts[way] for name, (_, nexts) in flags.items()}) for way in loads}
        for unit_name, names in unit_flags.items():
            unit = units[unit_name]
            takes = Cat(*[head.kind[kind] for kind in UNIT_KINDS[unit_name]]).any()
            for name, key in names.items():
                if name != "in_use":
                    setattr(now, key, unit[name])
                setattr(ways["idle"], key, unit.ahead.idle[name])
                setattr(ways["taken"], key, Mux(takes, unit.ahead.taken[name],
                                                unit.ahead.idle[name]))
        # ``ready`` leaves out the terms whose sources lie far from here (the DMA reader's
        # busy flag, the streamer's ``drained``, the writes in the accumulator's pipeline):
        # ``late`` has them, per kind, from their own flip-flops.
        late_now = {"end": self.reader_busy | ~now.drained, "load_acc": ~now.drained,
                    "store": Cat(*unseen_hits).any()}
        now.store_raw = Cat(*[now.in_use[i] & flag for i, (flag, _) in enumerate(slots)]).any()
        for way, f in ways.items():
            f.drained = Const(1)
            f.store_raw = Cat(*[f.in_use[i] & nexts[way] for i, (_, nexts) in enumerate(slots)]
                              ).any()
        early_now = SimpleNamespace(**{**vars(now), "reader_busy": 0, "drained": Const(1)})
        now.store_raw = now.store_raw | late_now["store"]

        waits = waits_of(now)
        assert waits.keys() == KIND_OPCODES.keys()
        for i, name in enumerate(data.Layout.cast(Blocked).members):
            m.d.comb += self.blocked[name].eq(Cat(*[head.kind[kind] & terms[i]
                                                    for kind, terms in waits.items()]).any())

        # ``ready`` from its value after the next edge, both ways, the decision choosing.
        nexts = {way: waits_of(f) for way, f in ways.items()}
        # Asserted, with ``late``, equal to the terms for a head of its kind (the only
        # ``ready`` that counts), but in the first cycle after a reset.
        warm = Signal()
        m.d.sync += warm.eq(1)
        for kind, terms in waits_of(early_now).items():
            ready_if = {way: ~Cat(*nexts[way][kind]).any() for way in ways}
            m.d.sync += self.ready[kind].eq(Mux(self.issue, ready_if["taken"],
                                                ready_if["idle"]))
            m.d.comb += self.late[kind].eq(late_now.get(kind, 0))
            m.d.sync += Assert(~(warm & self.head_valid & head.kind[kind]) |
                               (self.ready[kind] == ~Cat(*terms).any()),
                               f"issue stage: ready for {kind} out of step")
            m.d.sync += Assert(~(warm & self.head_valid & head.kind[kind]) |
                               ((self.ready[kind] & ~self.late[kind]) ==
                                ~Cat(*waits[kind]).any()),
                               f"issue stage: ready and late for {kind} out of step")
        return m
