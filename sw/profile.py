"""How fast a model runs, layer by layer: the per-node profile of a run, a roofline and a bar
chart (``npu onnx MODEL --input X.npy --profile report.md``).

Every NPU figure is exact: cycles and counters come from the cycle model
(:mod:`sw.timing`, equal to the RTL's cycle for cycle), split per operator at the cycle each
operator's first instruction issues (so the cycles before the first issue are the first
operator's, and the operators of one program add up to its ``CYCLES``). Time is cycles at a
clock: by default the median Fmax the whole NPU reached on ECP5 (:data:`ECP5_FMAX_MHZ`,
docs/fpga.md). Host figures are measured: each onnxruntime partition's wall-clock time in
this run.

Per NPU operator: MACs (the graph's), cycles, array utilization (``MACs / (cycles x R x
C)``), stall cycles by cause (the issue stage waiting on a load, a store, the array, the
fetcher), DRAM bytes read and written, arithmetic intensity (``2 x MACs / DRAM bytes``,
operations per byte) and time. The roofline puts each NPU operator at its intensity and
achieved GOPS under the array's compute ceiling (``2 x R x C x f``) and its bus's bandwidth
ceiling (one beat of ``bus_bytes`` per cycle).
"""

import os

from .errors import NPUValueError


__all__ = ["ECP5_FMAX_MHZ", "FMAX_SOURCE", "measured_clock_mhz", "clock_for", "profile",
           "write_report"]

#: Fmax in MHz of the whole NPU on ECP5 (LFE5U-85F, speed grade 6) for each config with its
#: default memories and bus: nextpnr-ecp5's post-route estimate, the median of seeds 1 to 4
#: (:data:`FMAX_SOURCE`). The one table: ``npu onnx --profile`` and ``npu stack`` clock with it.
ECP5_FMAX_MHZ = {"4x4": 125.5, "8x8": 124.7}
#: Where :data:`ECP5_FMAX_MHZ` comes from.
FMAX_SOURCE = ("docs/fpga.md, 'The whole NPU' (make fpga-report, 2026-12-07): nextpnr-ecp5's "
               "post-route Fmax on LFE5U-85F, median of seeds 1-4")

_STALLS = ("stall_load", "stall_store", "stall_array", "stall_fetch")


def measured_clock_mhz(config):
    """The measured Fmax (:data:`ECP5_FMAX_MHZ`) of ``config``, or None when it has none (a
    config never placed and routed, or one with other than its default memories and bus)."""
    from hw.config import NPUConfig
    if config.name not in ECP5_FMAX_MHZ or config != NPUConfig.from_name(config.name):
        return None
    return ECP5_FMAX_MHZ[config.name]


def clock_for(config, clock_mhz=None):
    """``(MHz, where it comes from)`` for ``config``: ``clock_mhz`` if given, else its
    measured Fmax, else (said so) the lowest measured NPU's."""
    if clock_mhz is not None:
        if not clock_mhz > 0:
            raise NPUValueError(f"--clock-mhz must be positive, not {clock_mhz}")
        return float(clock_mhz), "given (--clock-mhz)"
    measured = measured_clock_mhz(config)
    if measured is not None:
        return measured, f"the {config.name} NPU's median Fmax on the LFE5U-85F (docs/fpga.md)"
    lowest = min(ECP5_FMAX_MHZ.values())
    return lowest, (f"no Fmax measured for {config.name}: the lowest measured NPU's "
                    f"({lowest} MHz, docs/fpga.md)")


def _delta(after, before):
    return {name: after[name] - before.get(name, 0) for name in after}


def _operator_counters(config, group_run):
    """``{operator name: counters}`` of a group's programs, summed over its batches."""
    from .ir.runner import predict_image
    timings = group_run.timings or [predict_image(config, image)
                                    for image in group_run.images]
    totals = {}
    for image, timing in zip(group_run.images, timings):
        order = sorted(image.spans.items(), key=lambda item: item[1][0])
        for index, (name, (first, _)) in enumerate(order):
            start = timing.marks[first] if index else {}
            if index + 1 < len(order):
                end = timing.marks[order[index + 1][1][0]]
            else:
                end = timing.perf
            counters = _delta(end, start)
            entry = totals.setdefault(name, dict.fromkeys(counters, 0))
            for key, value in counters.items():
                entry[key] += value
    return totals


def profile(run, config, *, clock_mhz=None):
    """The profile of a run (:class:`sw.ir.runner.GraphRun`): a dict with ``clock_mhz``,
    ``clock_source``, ``nodes`` (one row per node: NPU operators with their figures, host
    partitions with their measured time) and ``totals``."""
    from .ir.grouping import HostStep
    mhz, source = clock_for(config, clock_mhz)
    placements = {p.node: p for p in run.placements}
    counters = {}
    for group_run in run.group_runs:
        counters.update(_operator_counters(config, group_run))
    rows, npu_cycles, host_seconds = [], 0, 0.0
    group_runs = iter(run.group_runs)
    for index, step in enumerate(run.steps):
        if isinstance(step, HostStep):
            seconds = run.host_seconds.get(index, 0.0)
            host_seconds += seconds
            rows.append({"node": ", ".join(step.names), "device": "host",
                         "op_type": "onnxruntime partition" if len(step.nodes) > 1
                         else step.nodes[0].op_type,
                         "macs": sum(placements[name].macs for name in step.names),
                         "seconds": seconds})
            continue
        next(group_runs)
        for node in step.nodes:
            if node.name not in counters:            # a view inside the program
                continue
            c = counters[node.name]
            macs = placements[node.name].macs
            dram = c["read_bytes"] + c["write_bytes"]
            cycles = c["cycles"]
            npu_cycles += cycles
            rows.append({
                "node": node.name, "device": "npu", "op_type": node.op_type, "macs": macs,
                "cycles": cycles,
                "utilization": macs / (cycles * config.rows * config.cols) if cycles else 0.0,
                "stalls": {name: c[name] for name in _STALLS},
                "read_bytes": c["read_bytes"], "write_bytes": c["write_bytes"],
                "intensity": 2 * macs / dram if dram else None,
                "seconds": cycles / (mhz * 1e6),
                "gops": 2 * macs / (cycles / (mhz * 1e6)) / 1e9 if cycles else 0.0})
    npu_seconds = npu_cycles / (mhz * 1e6)
    return {"config": config.name, "clock_mhz": mhz, "clock_source": source,
            "peak_gops": 2 * config.rows * config.cols * mhz / 1e3,
            "bus_gbps": config.bus_bytes * mhz / 1e3,
            "nodes": rows,
            "totals": {"npu_cycles": npu_cycles, "npu_seconds": npu_seconds,
                       "host_seconds": host_seconds, "seconds": npu_seconds + host_seconds,
                       "npu_macs": run.npu_macs, "host_macs": run.cpu_macs,
                       "npu_share": run.npu_share}}


def _plots(report, stem):
    """The roofline and the per-operator bar chart, as PNG files next to ``stem``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    npu = [row for row in report["nodes"] if row["device"] == "npu"]
    roofline, bars = f"{stem}.roofline.png", f"{stem}.layers.png"

    figure, axes = plt.subplots(figsize=(7, 5))
    peak, bandwidth = report["peak_gops"], report["bus_gbps"]
    points = [row for row in npu if row["intensity"]]
    low = min([0.1] + [row["intensity"] / 2 for row in points])
    high = max([100.0] + [row["intensity"] * 2 for row in points])
    ridge = peak / bandwidth
    axes.loglog([low, ridge, high], [bandwidth * low, peak, peak], color="black",
                label=f"ceilings: {peak:.1f} GOPS, {bandwidth:.2f} GB/s")
    axes.scatter([row["intensity"] for row in points], [row["gops"] for row in points],
                 color="tab:blue", zorder=3, label="NPU operators")
    for row in points:
        axes.annotate(row["node"][:18], (row["intensity"], row["gops"]), fontsize=6,
                      xytext=(3, 3), textcoords="offset points")
    axes.set_xlabel("arithmetic intensity (operations per DRAM byte)")
    axes.set_ylabel("GOPS")
    axes.set_title(f"roofline, {report['config']} at {report['clock_mhz']} MHz")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(roofline, dpi=120)
    plt.close(figure)

    figure, axes = plt.subplots(figsize=(8, max(3, 0.3 * len(npu) + 1)))
    names = [row["node"][:28] for row in npu]
    left = [0] * len(npu)
    parts = [("other", [row["cycles"] - sum(row["stalls"].values()) for row in npu])]
    parts += [(name, [row["stalls"][name] for row in npu]) for name in _STALLS]
    for label, values in parts:
        axes.barh(names, values, left=left, label=label)
        left = [a + b for a, b in zip(left, values)]
    axes.invert_yaxis()
    axes.set_xlabel("cycles")
    axes.set_title("cycles per NPU operator, with the issue stage's stalls by cause")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(bars, dpi=120)
    plt.close(figure)
    return roofline, bars


def _count(value):
    return "-" if value is None else f"{value:,}"


def write_report(report, path, *, title):
    """The profile as Markdown at ``path``, with the two plots beside it."""
    stem = os.path.splitext(os.fspath(path))[0]
    roofline, bars = _plots(report, stem)
    t = report["totals"]
    lines = [f"# Profile: {title}", "",
             f"{report['config']} NPU at **{report['clock_mhz']} MHz** ({report['clock_source']}); "
             f"peak {report['peak_gops']:.1f} GOPS, bus {report['bus_gbps']:.2f} GB/s. "
             f"NPU figures are the cycle model's (exact, equal to the RTL's), host figures "
             f"are measured with onnxruntime in this run.", "",
             f"* NPU: {t['npu_cycles']:,} cycles, {1e3 * t['npu_seconds']:.3f} ms; "
             f"{t['npu_share']:.1%} of the {t['npu_macs'] + t['host_macs']:,} MACs",
             f"* host: {1e3 * t['host_seconds']:.3f} ms measured", "",
             "| node | where | op | MACs | cycles | utilization | stalls load / store / array "
             "/ fetch | DRAM read / written | ops per byte | time (ms) |",
             "|---|---|---|---:|---:|---:|---|---|---:|---:|"]
    for row in report["nodes"]:
        if row["device"] == "npu":
            s = row["stalls"]
            lines.append(
                f"| {row['node']} | NPU | {row['op_type']} | {row['macs']:,} | "
                f"{row['cycles']:,} | {row['utilization']:.1%} | {s['stall_load']:,} / "
                f"{s['stall_store']:,} / {s['stall_array']:,} / {s['stall_fetch']:,} | "
                f"{row['read_bytes']:,} / {row['write_bytes']:,} | "
                f"{'-' if row['intensity'] is None else format(row['intensity'], '.1f')} | "
                f"{1e3 * row['seconds']:.4f} |")
        else:
            lines.append(f"| {row['node']} | host | {row['op_type']} | {_count(row['macs'])} "
                         f"| - | - | - | - | - | {1e3 * row['seconds']:.4f} |")
    lines += ["", f"![roofline]({os.path.basename(roofline)})", "",
              f"![cycles per operator]({os.path.basename(bars)})", ""]
    with open(path, "w") as handle:
        handle.write("\n".join(lines))
    return [os.fspath(path), roofline, bars]
