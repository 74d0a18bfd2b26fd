"""``npu onnx --plan``: where each operator runs, the NPU programs, and the DRAM they need,
without running anything.

Each NPU group runs as one program per ``--batch`` samples, each program in a DRAM image of
its own: the program, the group's weights, biases and requantization parameters, and its
activation arena (:func:`sw.nn.program.layout_fused_program`, the very layout the run
builds; its plans are counted, not emitted, so a network of tens of millions of
instructions is planned in seconds). The report gives every program's DRAM, the largest
(what the backend must hold) and the sum over the run's programs, and checks the largest
against what ``--sim`` holds (:func:`sw.backend.dram_capacity`): a program that does not fit
ends the plan with a one-line error.
"""

from ..errors import NPUValueError


__all__ = ["plan_report", "print_plan", "check_fits"]


def plan_report(graph, x, config, *, batch=None, sim="model"):
    """The plan of running ``graph`` on the batch ``x`` with ``--batch`` ``batch`` (default:
    all of ``x`` in one program per group) on ``sim``, as a JSON-ready dict."""
    from .. import backend
    from ..ir.grouping import NpuGroup, schedule
    from ..ir.placement import place
    from ..nn.program import layout_fused_program
    from .lower import to_graph
    from .runtime import infer_shapes
    shapes = infer_shapes(graph, x)
    core = to_graph(graph, shapes)
    placements = place(core)
    groups = [step for step in schedule(core, placements) if isinstance(step, NpuGroup)]
    samples = len(x)
    per_program = samples if batch is None else min(batch, samples)
    runs = -(-samples // per_program)
    report = {"placements": [p.__dict__ for p in placements], "groups": [],
              "samples": samples, "batch": per_program}
    for group in groups:
        layout = layout_fused_program(config, group.ops, per_program)
        regions = {name: {"addr": addr, "bytes": size}
                   for name, (addr, size) in sorted(layout.regions.items(),
                                                    key=lambda item: item[1][0])}
        report["groups"].append({
            "nodes": [node.name for node in group.nodes], "input": group.input,
            "output": group.output, "instructions": layout.instructions,
            "programs": runs, "dram_bytes": layout.dram_bytes, "regions": regions})
    sizes = [group["dram_bytes"] for group in report["groups"]]
    largest = max(range(len(sizes)), key=sizes.__getitem__) if sizes else None
    report["dram"] = {
        "largest_program": sizes[largest] if sizes else 0,
        "largest_group": largest,
        "all_programs": sum(size * runs for size in sizes),
        "sim": sim,
        "capacity": backend.dram_capacity(config, sim),
    }
    report["dram"]["fits"] = report["dram"]["largest_program"] <= report["dram"]["capacity"]
    return report


def check_fits(report):
    """Raise :class:`~sw.errors.NPUValueError` (one line) when the largest program of
    ``report`` does not fit the DRAM of its ``sim``."""
    dram = report["dram"]
    if not dram["fits"]:
        raise NPUValueError(
            f"NPU group {dram['largest_group']} needs {dram['largest_program']:,} bytes of "
            f"DRAM (program and data), more than the {dram['capacity']:,} of --sim "
            f"{dram['sim']}")


def _size(nbytes):
    """``nbytes`` in readable binary units: 16.0 MiB, 4.0 GiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.1f} {unit}"
    return f"{nbytes} B"


def print_plan(report):
    """Print ``report`` (:func:`plan_report`) for a reader."""
    print(f"placement (batch {report['samples']}):")
    for p in report["placements"]:
        print(f"  {p['node']:<28} {p['op_type']:<16} {p['device'].upper():<4} {p['reason']}")
    for index, group in enumerate(report["groups"]):
        print(f"NPU group {index}: {' -> '.join(group['nodes'])}  "
              f"({group['instructions']:,} instructions, {group['dram_bytes']:,} bytes of "
              f"DRAM)")
        for name, region in group["regions"].items():
            print(f"  0x{region['addr']:08x} {region['bytes']:>11,} B  {name}")
    dram = report["dram"]
    if not report["groups"]:
        print("DRAM: no NPU program")
        return
    programs = sum(group["programs"] for group in report["groups"])
    print(f"DRAM: {dram['largest_program']:,} bytes ({_size(dram['largest_program'])}) for "
          f"the largest program (group {dram['largest_group']}, {report['batch']} "
          f"sample{'s' if report['batch'] != 1 else ''}); {dram['all_programs']:,} bytes "
          f"({_size(dram['all_programs'])}) over all {programs} program"
          f"{'s' if programs != 1 else ''}; --sim {dram['sim']} holds "
          f"{dram['capacity']:,} ({_size(dram['capacity'])})")
