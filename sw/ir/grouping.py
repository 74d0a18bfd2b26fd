"""The run's steps: NPU groups, each ONE program, and the host steps between them.

An NPU group is a chain of NPU operators in which each one's output is read by the next one
only (through at most one free flatten view from a convolution to a dense layer) and by
nothing else, not even the graph's outputs: its intermediate activations never leave the
NPU's DRAM. With ``fuse=False`` every NPU operator is a group of its own (one program per
layer, as the demo's layer-by-layer stages run). The host operators between two groups, in
the graph's order, form one host step.
"""

from dataclasses import dataclass, field, replace

import numpy as np

from ..nn.passes import hwc_order_of_chw


__all__ = ["NpuGroup", "HostStep", "schedule"]


@dataclass
class NpuGroup:
    """NPU operators that run as one program.

    Attributes
    ----------
    nodes : list of sw.ir.graph.Op
        The group's operators, views included, in order.
    ops : list
        Their lowerings (QConv2D / QDense), a dense one's rows permuted to NHWC order behind
        a ``"CHW"`` view.
    input, output : str
        The tensor the first reads and the one the last writes.
    dtype : numpy dtype
        The output's dtype as the front end holds it.
    """
    nodes: list
    ops: list = field(default_factory=list)
    input: str = ""
    output: str = ""
    dtype: object = np.int8

    @property
    def names(self):
        return [node.name for node in self.nodes]


@dataclass
class HostStep:
    """Host operators run one after the other between two NPU groups."""
    nodes: list
    inputs: list = field(default_factory=list)      # tensors read from before it
    outputs: list = field(default_factory=list)     # tensors read after it, or the graph's
    runner: object = field(default=None, repr=False)    # the front end's, once made

    @property
    def names(self):
        return [node.name for node in self.nodes]


def _chain(graph, first, device, fuse):
    """The group that starts at ``first``."""
    group = NpuGroup(nodes=[first], input=first.inputs[0])
    current = first
    while fuse:
        following = graph.single_consumer(current.outputs[0])
        view = None
        if (following is not None and following.view is not None
                and current.lowered.kind == "conv2d"):
            view, following = following, graph.single_consumer(following.outputs[0])
            if following is None or following.lowered is None \
                    or following.lowered.kind != "dense":
                break
        if (following is None or device.get(following.name) != "npu"
                or following.inputs[0] != (view or current).outputs[0]):
            break
        if view is not None:
            group.nodes.append(view)
        group.nodes.append(following)
        current = following
    group.output = current.outputs[0]
    group.dtype = current.dtype
    previous, view = None, None
    for node in group.nodes:
        if node.view is not None:
            view = node
            continue
        op = node.lowered
        if view is not None and view.view == "CHW":
            height, width, channels = previous.output_shape
            op = replace(op, weight=op.weight[hwc_order_of_chw(height, width, channels)],
                         sources=op.sources + ("flatten view: rows permuted to NHWC order",))
        group.ops.append(op)
        previous, view = op, None
    return group


def schedule(graph, placements, *, fuse=True):
    """The steps of a run of ``graph`` (NpuGroup and HostStep, in order), with each host
    step's boundary filled in."""
    device = {p.node: p.device for p in placements}
    steps, host, inside = [], [], set()
    for op in graph.ops:
        if op.name in inside:
            continue
        if device[op.name] == "npu":
            if host:
                steps.append(HostStep(host))
                host = []
            group = _chain(graph, op, device, fuse)
            inside.update(group.names)
            steps.append(group)
        else:
            host.append(op)
    if host:
        steps.append(HostStep(host))
    _boundaries(graph, steps)
    return steps


def _boundaries(graph, steps):
    """Each host step's inputs (read from before it) and outputs (read after it)."""
    reads = {}
    for index, step in enumerate(steps):
        names = ([name for node in step.nodes for name in node.inputs]
                 if isinstance(step, HostStep) else [step.input])
        for name in names:
            reads.setdefault(name, set()).add(index)
    for index, step in enumerate(steps):
        if not isinstance(step, HostStep):
            continue
        made = [out for node in step.nodes for out in node.outputs if out]
        inside = set(made)
        step.inputs = list(dict.fromkeys(
            name for node in step.nodes for name in node.inputs
            if name and name not in inside and name not in graph.constants))
        step.outputs = [name for name in made if name in graph.outputs
                        or reads.get(name, set()) - {index}]
