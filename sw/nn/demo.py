"""``npu demo digits``: the seeds' small CNN, trained, quantized, compiled and run on the NPU.

:func:`run_demo` trains the network on scikit-learn's digits (float, numpy), quantizes it
(BatchNorm folded, ReLU fused, INT8 with calibration), places its operators, and runs the
whole test split through the NPU in batches, three ways (one program per layer with an
unfused ReLU on the CPU; fused Conv + ReLU, one program per layer; every NPU layer in one
program), plus the one-program form with the kernel-row convolution lowering. Every NPU
output is compared with the INT8 reference bit for bit. The report goes to ``docs/demo.md``
when asked for.
"""

import time
from pathlib import Path

import numpy as np

from hw.config import NPUConfig
from ..errors import NPUError, NPUTypeError
from ..ir.placement import place
from .lower import network_graph
from .quantize import quantize_network
from .reference import run_reference
from .runtime import run_network
from .train import accuracy, train_digits


__all__ = ["run_demo", "DemoMismatch", "STAGES"]


#: ``(key, mode, lowering, description)`` of the rows of the stage table.
STAGES = (
    ("a", "layers_unfused", "taps",
     "one program per layer, host round trips, ReLU as a separate CPU pass"),
    ("b", "layers", "taps",
     "Conv + ReLU fused into the requantization clamp, still one program per layer"),
    ("c", "fused", "taps",
     "every NPU layer in ONE program: activations stay in planned DRAM buffers"),
    ("c'", "fused", "kernel_rows",
     "as (c), convolutions lowered with one weight matrix per kernel row"),
)


class DemoMismatch(NPUError, AssertionError):
    """The NPU's outputs differ from the INT8 reference."""


def _timed(function, *args, **kwargs):
    started = time.perf_counter()
    value = function(*args, **kwargs)
    return value, time.perf_counter() - started


def run_demo(sim="verilator", batch=64, out="docs/demo.md", *, config=None, seed=0,
             check=True):
    """Train, quantize, compile and run the digits network; optionally write the report.

    Parameters
    ----------
    sim : str
        Backend for the NPU programs: ``"verilator"`` (default), ``"icarus"`` or ``"model"``
        (no cycle counts).
    batch : int
        Test images per program.
    out : str or pathlib.Path or None
        Where to write the Markdown report; ``None`` writes nothing.
    config : hw.config.NPUConfig, optional
        Default ``NPUConfig()`` (8x8).
    seed : int
        Seeds the weight initialization and the shuffling of training.
    check : bool
        Raise :class:`DemoMismatch` (after writing the report) if any NPU output differs
        from the INT8 reference.

    Returns
    -------
    dict
        Plain values (JSON-serializable): accuracies, placements, per-layer figures, the
        buffer plan, the stage table and ``bit_exact``.
    """
    if config is None:
        config = NPUConfig()
    if not isinstance(config, NPUConfig):
        raise NPUTypeError(f"config must be an NPUConfig, not {config!r}")
    (network, data, log), train_seconds = _timed(train_digits, seed)
    float_predictions, float_seconds = _timed(network.forward, data.x_test)
    float_accuracy = accuracy(float_predictions, data.y_test)

    qnet = quantize_network(network, data.x_train)
    reference, reference_seconds = _timed(run_reference, qnet, data.x_test)
    logits_name = qnet.logits_op.name
    reference_classes = np.argmax(reference[logits_name], axis=-1)
    int8_accuracy = accuracy(reference_classes, data.y_test)
    placements = place(network_graph(qnet, len(data.x_test)))

    stages, mismatches = [], []
    runs = {}
    cache = {}      # a byte-identical DRAM image is simulated once
    for key, mode, lowering, description in STAGES:
        result, seconds = _timed(run_network, qnet, data.x_test, config=config, sim=sim,
                                 batch=batch, mode=mode, lowering=lowering, cache=cache)
        runs[key] = result
        exact = bool(np.array_equal(result.logits, reference[logits_name]))
        for name, value in result.layer_outputs.items():
            exact &= bool(np.array_equal(value, reference[name]))
        if not exact:
            mismatches.append(key)
        utilization = result.utilization(config)
        images = len(data.x_test)
        stages.append({
            "stage": key, "mode": mode, "lowering": lowering, "description": description,
            "programs": result.programs, "programs_per_batch": result.programs // result.batches,
            "simulated_programs": result.simulated,
            "cycles": result.cycles,
            "cycles_per_image": None if result.cycles is None else result.cycles / images,
            "utilization": utilization, "instructions": result.instructions,
            "host_transfers": result.host_transfers,
            "host_transfers_per_batch": result.host_transfers // result.batches,
            "host_bytes_written": result.host_bytes_written,
            "host_bytes_read": result.host_bytes_read, "cpu_passes": result.cpu_passes,
            "host_seconds": result.host_seconds, "seconds": seconds, "bit_exact": exact,
            "dram_bytes_read": sum(entry["read"] for entry in result.traffic.values()),
            "dram_bytes_written": sum(entry["written"] for entry in result.traffic.values()),
            "program_bytes": sum(entry["program"] for entry in result.traffic.values()),
        })

    npu_classes = runs["c"].outputs.get("argmax", np.argmax(runs["c"].logits, axis=-1))
    layers = []
    for op in qnet.gemm_ops():
        plan_b, plan_c = runs["b"].plans[op.name], runs["c"].plans[op.name]
        plan_k = runs["c'"].plans[op.name]
        cycles = runs["b"].layer_cycles.get(op.name)
        macs = op.macs(len(data.x_test))
        layers.append({
            "name": op.name, "kind": op.kind, "sources": list(op.sources),
            "m_per_batch": plan_b.m, "k": op.k, "n": op.n, "macs": macs,
            "weight_tiles": plan_c.weight_tiles, "tile_fill": plan_c.tile_fill,
            "schedule": plan_c.schedule,
            "weight_tiles_kernel_rows": plan_k.weight_tiles,
            "tile_fill_kernel_rows": plan_k.tile_fill,
            "cycles": cycles,
            "utilization": None if cycles is None else macs / (cycles * config.rows
                                                                * config.cols),
            "dram_layer_programs": runs["b"].traffic[op.name],
            "dram_one_program": runs["c"].traffic[op.name],
        })

    buffer_plan = runs["c"].buffer_plan
    buffers = []
    for index, (offset, size) in enumerate(zip(buffer_plan.buffer_offsets,
                                               buffer_plan.buffer_sizes)):
        buffers.append({"offset": offset, "bytes": size, "tensors": [
            {"name": life.name, "bytes": life.bytes, "first": life.first, "last": life.last,
             "pinned": life.pinned}
            for life in buffer_plan.lives if buffer_plan.buffer_of[life.name] == index]})

    summary = {
        "config": config.name, "sim": sim, "batch": batch, "seed": seed,
        "train_images": len(data.x_train), "test_images": len(data.x_test),
        "train_seconds": train_seconds, "train_epochs": log.epochs,
        "final_loss": log.losses[-1],
        "float_accuracy": float_accuracy, "int8_accuracy": int8_accuracy,
        "npu_accuracy": accuracy(npu_classes, data.y_test),
        "bit_exact": not mismatches, "mismatched_stages": mismatches,
        "cpu_float_seconds": float_seconds, "cpu_int8_reference_seconds": reference_seconds,
        "notes": list(qnet.notes),
        "placements": [{"op": p.node, "kind": p.op_type, "device": p.device,
                        "reason": p.reason, "sources": list(p.sources)} for p in placements],
        "quantization": [{"name": op.name, "input_scale": op.input.scale,
                          "input_zero_point": op.input.zero_point,
                          "output_scale": op.output.scale,
                          "output_zero_point": op.output.zero_point,
                          "act_min": op.act_min, "act_max": op.act_max,
                          "shifts": [int(s) for s in op.shift]} for op in qnet.gemm_ops()],
        "layers": layers,
        "buffers": {"batch": batch, "arena_bytes": buffer_plan.total_bytes,
                    "without_reuse_bytes": buffer_plan.naive_bytes, "buffers": buffers},
        "stages": stages,
    }
    if out is not None:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_markdown(summary))
        summary["report"] = str(path)
    if check and mismatches:
        raise DemoMismatch(f"NPU outputs differ from the INT8 reference in stage(s) "
                           f"{', '.join(mismatches)} ({sim}, {config.name})")
    return summary


def _percent(value):
    return "-" if value is None else f"{100 * value:.1f}%"


def _count(value):
    return "-" if value is None else f"{value:,}"


def _markdown(s):
    lines = []
    add = lines.append
    images = s["test_images"]
    add("# Demo: the digits network, end to end")
    add("")
    if s["sim"] == "model":
        cycles_note = ("The instruction-level model counts no cycles, so the cycle columns "
                       "are empty; run with `--sim verilator` for them.")
    else:
        cycles_note = (f"Cycles are `RunResult.cycles` from the RTL under {s['sim']} (clock "
                       "cycles from start to done of each program), summed; nothing here is "
                       "estimated.")
    add(f"Generated by `npu demo digits` (`sw.nn.demo.run_demo`): config {s['config']}, "
        f"simulator `{s['sim']}`, batches of {s['batch']} images, seed {s['seed']}. "
        f"{cycles_note}")
    add("")
    add("The network is the seeds' section 5 example, Conv -> ReLU -> Conv -> BatchNorm -> "
        "ReLU -> GEMM, on scikit-learn's 8x8 digits (`load_digits`, "
        f"{s['train_images']} training and {images} test images, stratified "
        "`train_test_split(test_size=0.25, random_state=0)`):")
    add("")
    add("```")
    add("input 8x8x1 -> conv1 3x3 1->8 pad 1 (+bias) -> relu1")
    add("            -> conv2 3x3 8->16 stride 2 pad 1 -> bn2 -> relu2")
    add("            -> flatten 4x4x16 = 256 -> dense 256->10 -> softmax -> argmax")
    add("```")
    add("")
    add("## Accuracy")
    add("")
    add("| | test accuracy |")
    add("|---|---|")
    add(f"| float32 (numpy, trained in {s['train_seconds']:.1f} s, {s['train_epochs']} epochs "
        f"of Adam, final loss {s['final_loss']:.4f}) | {_percent(s['float_accuracy'])} |")
    add(f"| INT8 reference (numpy, exact integers) | {_percent(s['int8_accuracy'])} |")
    add(f"| NPU (`{s['sim']}`) | {_percent(s['npu_accuracy'])} |")
    add("")
    verdict = ("equal to the INT8 reference's bit for bit, in every stage below"
               if s["bit_exact"] else
               f"**NOT** equal to the INT8 reference in stage(s) "
               f"{', '.join(s['mismatched_stages'])}")
    add(f"The NPU's INT8 logits for all {images} test images are {verdict} (the layer-by-"
        f"layer stages compare every layer's output too).")
    add("")
    add("Training is deterministic for a seed on one machine; a different BLAS build or "
        "thread count sums the float32 products in another order, which can change the "
        "trained weights in their last bits and so the figures below slightly.")
    add("")
    add("## Compilation")
    add("")
    for note in s["notes"]:
        add(f"* {note}.")
    add("")
    add("Quantization: weights symmetric per output channel (INT8, -127..127), activations "
        "asymmetric per tensor (ranges from the training images), biases INT32 at scale "
        "`input_scale * weight_scale`, requantization per channel by `sw.quant.requantize`:")
    add("")
    add("| layer | input scale / zero point | output scale / zero point | clamp | shifts |")
    add("|---|---|---|---|---|")
    for q in s["quantization"]:
        add(f"| {q['name']} | {q['input_scale']:.5f} / {q['input_zero_point']} | "
            f"{q['output_scale']:.5f} / {q['output_zero_point']} | {q['act_min']} .. "
            f"{q['act_max']} | {min(q['shifts'])} .. {max(q['shifts'])} |")
    add("")
    add("## Placement")
    add("")
    add("| operator | computes | device | why |")
    add("|---|---|---|---|")
    for p in s["placements"]:
        add(f"| {p['op']} | {' + '.join(p['sources']) or '-'} | {p['device'].upper()} | "
            f"{p['reason']} |")
    add("")
    add("## Per layer")
    add("")
    add(f"Cycles and DRAM traffic over the whole test split ({images} images). Cycles per "
        "layer come from stage (b), where each layer is its own program; utilization is "
        f"useful MACs / (cycles x {s['config']} PEs). DRAM bytes are what the layer's DMA "
        "instructions move (loads / stores) and its instruction bytes.")
    add("")
    add("| layer | GEMM per batch (M x K x N) | MACs | weight tiles (tile fill) | same, "
        "kernel rows (c') | cycles (b) | utilization | DRAM read / written / program, (b) | "
        "same, (c) |")
    add("|---|---|---|---|---|---|---|---|---|")
    for layer in s["layers"]:
        b, c = layer["dram_layer_programs"], layer["dram_one_program"]
        add(f"| {layer['name']} | {layer['m_per_batch']} x {layer['k']} x {layer['n']} | "
            f"{_count(layer['macs'])} | {layer['weight_tiles']} ({_percent(layer['tile_fill'])})"
            f" | {layer['weight_tiles_kernel_rows']} "
            f"({_percent(layer['tile_fill_kernel_rows'])})"
            f" | {_count(layer['cycles'])} | {_percent(layer['utilization'])} | "
            f"{_count(b['read'])} / {_count(b['written'])} / {_count(b['program'])} | "
            f"{_count(c['read'])} / {_count(c['written'])} / {_count(c['program'])} |")
    add("")
    add("## Activation buffers of the one-program form")
    add("")
    plan = s["buffers"]
    add(f"Planned by greedy interval colouring for a batch of {plan['batch']}: steps are "
        "0 = host writes the input, 1.. = the NPU layers, last = host reads the logits. A "
        "padded buffer's zero-point border is written by the host before the program, so "
        "it lives from step 0, and it is *pinned* (never handed to a later tensor) so that "
        "the border written once at set-up stays valid for every batch. The input buffer "
        "is rewritten whole for every batch, so a later tensor may reuse it.")
    add("")
    add("| buffer | offset | bytes | tensors (bytes, live steps) |")
    add("|---|---|---|---|")
    for index, buffer in enumerate(plan["buffers"]):
        tensors = ", ".join(
            f"{t['name']} ({t['bytes']:,}, {t['first']}..{'end' if t['pinned'] else t['last']})"
            for t in buffer["tensors"])
        add(f"| {index} | {buffer['offset']:#x} | {buffer['bytes']:,} | {tensors} |")
    add("")
    add(f"Arena: {plan['arena_bytes']:,} bytes, against {plan['without_reuse_bytes']:,} "
        "with one buffer per tensor.")
    add("")
    add("## Stages")
    add("")
    add("In the spirit of the seeds' section 5 table, measured in cycles and host transfers "
        f"over the {images} test images. A host transfer is one copy between host memory "
        "and NPU DRAM in a steady-state runtime (weights, biases, requantization parameters "
        "and pinned borders are written once at set-up and not counted). Every stage's "
        "logits are compared with the INT8 reference.")
    add("")
    add("| stage | what | programs (per batch) | NPU cycles | cycles / image | utilization "
        "| host transfers (per batch) | host bytes written / read | CPU passes | bit-exact |")
    add("|---|---|---|---|---|---|---|---|---|---|")
    for stage in s["stages"]:
        per_image = "-" if stage["cycles_per_image"] is None else \
            f"{stage['cycles_per_image']:,.0f}"
        add(f"| ({stage['stage']}) | {stage['description']} | {stage['programs']} "
            f"({stage['programs_per_batch']}) | {_count(stage['cycles'])} | {per_image} | "
            f"{_percent(stage['utilization'])} | {stage['host_transfers']} "
            f"({stage['host_transfers_per_batch']}) | {stage['host_bytes_written']:,} / "
            f"{stage['host_bytes_read']:,} | {stage['cpu_passes']} | "
            f"{'yes' if stage['bit_exact'] else 'NO'} |")
    add("")
    by_key = {stage["stage"]: stage for stage in s["stages"]}
    a, b, c, k = by_key["a"], by_key["b"], by_key["c"], by_key["c'"]
    add("What the rows show:")
    add("")
    # (b) runs after (a) and shares its cache: no simulation means identical DRAM images.
    same_programs = b["simulated_programs"] == 0
    add(f"* (a) -> (b): the fused ReLU is the requantization clamp (`act_min` = output zero "
        f"point), so it costs the array nothing; fusing removes the {a['cpu_passes']} "
        "separate CPU passes over the activations. "
        + ("Here the ReLU outputs' zero point is -128, so the clamp of (a) already stops "
           "where the ReLU would, and the DRAM images of (a) and (b) (programs and data) are "
           "byte for byte the same: same cycles." if same_programs else
           "The NPU programs differ only in the clamp's lower end."))
    if c["cycles"] is not None and b["cycles"] is not None:
        extra = {layer["name"]: (layer["dram_one_program"]["program"]
                                 - layer["dram_layer_programs"]["program"]) // 16
                 for layer in s["layers"]}
        grown = {name: count for name, count in extra.items() if count > 0}
        why = ""
        if grown:
            why = (" The one program is not faster on the array: "
                   + ", ".join(f"{name} needs {count:,} more instructions"
                               for name, count in grown.items())
                   + " in all, because it writes into the interior of the next layer's "
                     "padded buffer, where its output rows break at every image row (one "
                     "`STORE_Q` per image row instead of one per block of plain NHWC rows).")
        add(f"* (b) -> (c): one program instead of {b['programs_per_batch']} per batch: "
            f"{b['host_transfers_per_batch']} host transfers per batch become "
            f"{c['host_transfers_per_batch']} (input in, logits out), and the host moves "
            f"{c['host_bytes_written'] + c['host_bytes_read']:,} bytes instead of "
            f"{b['host_bytes_written'] + b['host_bytes_read']:,}, with no host work and no "
            f"synchronisation between layers. The NPU cycles are "
            f"{c['cycles'] / b['cycles']:.3f}x those of (b).{why} What (c) removes is the "
            "host's side of the round trips, which the NPU's cycle counter does not see.")
        fills = ", ".join(
            f"{layer['name']} {_percent(layer['tile_fill'])} -> "
            f"{_percent(layer['tile_fill_kernel_rows'])}"
            for layer in s["layers"] if layer["kind"] == "conv2d")
        same_traffic = (c["dram_bytes_read"], c["dram_bytes_written"]) == \
            (k["dram_bytes_read"], k["dram_bytes_written"])
        add(f"* (c) -> (c'): a compiler decision at the instruction level (seeds, section "
            f"4.4). A convolution with few input channels leaves most of the array's rows "
            f"idle when each kernel tap is its own weight matrix; taking a whole kernel row "
            f"as one matrix (its neighbouring pixels are adjacent bytes in NHWC) multiplies "
            f"the reduction per tile by the kernel width. Tile fill {fills}; cycles "
            f"{c['cycles']:,} -> {k['cycles']:,} ({k['cycles'] / c['cycles']:.2f}x)"
            + (", on the same DRAM data traffic." if same_traffic else "."))
    reused = [stage for stage in s["stages"] if stage["simulated_programs"] < stage["programs"]]
    for stage in reused:
        add(f"* ({stage['stage']}): {stage['programs'] - stage['simulated_programs']} of its "
            f"{stage['programs']} programs had a DRAM image (instructions, constants and "
            "inputs) byte for byte equal to one simulated for an earlier row, so that run's "
            "result was reused instead of simulating it again.")
    add("")
    if c["cycles"] is not None:
        add("Utilization stays low because this NPU runs one instruction at a time: every "
            "strided load, weight preload and store waits for the previous one, and a 1- or "
            "8-channel convolution moves little data per instruction (see the per-layer "
            "table).")
        add("")
    add(f"For scale, on the host CPU (numpy, this machine): the float32 network takes "
        f"{1000 * s['cpu_float_seconds']:.1f} ms for the {images} test images and the exact "
        f"INT8 reference {1000 * s['cpu_int8_reference_seconds']:.1f} ms. These are "
        "wall-clock times of Python, not comparable with simulated NPU cycles.")
    add("")
    add("## Reproduce")
    add("")
    add("```sh")
    add(f"npu demo digits --sim {s['sim']} --batch {s['batch']}    # rewrites docs/demo.md")
    add("```")
    add("")
    add("or from Python: `from sw.nn.demo import run_demo; run_demo(sim=\"verilator\", "
        f"batch={s['batch']})`.")
    add("")
    return "\n".join(lines)
