"""The host's part of an ONNX model, run by onnxruntime itself.

The runtime works as an onnxruntime execution provider does: the NPU claims the nodes it
runs (:func:`sw.onnx.lower.place_graph`), and every other node runs on onnxruntime's CPU
execution provider, in *partitions*: the host nodes between two NPU programs, in the graph's
order, cut out as a model of their own (:class:`HostPartition`) whose inputs are the tensors
they read from outside (8-bit tensors with their scales and zero points as constants, or
float ones) and whose outputs are the tensors read after them. Each partition is one
``InferenceSession``, built once and run on the whole batch, so any operator onnxruntime
runs is supported with onnxruntime's exact semantics, and nothing of it is re-implemented
here.

The partitions are made from the graph onnxruntime optimized at ``ORT_ENABLE_EXTENDED``
(:mod:`sw.onnx.graph`) and run with onnxruntime's default session options, as the whole
model does when onnxruntime runs it alone: the same nodes, the same kernels.
"""

from dataclasses import dataclass, field

import numpy as np

from ..errors import NPUValueError


__all__ = ["HostPartition", "probe", "host_partitions"]


def _first_line(error):
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def _value_info(name, dtype, rank):
    """A tensor's type for a partition's boundary: its dtype and rank; every dimension left
    open, so that any batch size runs."""
    from onnx import helper
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return helper.make_tensor_value_info(name, elem, [None] * rank if rank is not None
                                         else None)


def _model(graph, nodes, inputs, outputs, types):
    """A ModelProto of ``nodes`` with the graph's constants they use as initializers;
    ``types`` maps a boundary tensor to ``(dtype, rank)``."""
    from onnx import helper, numpy_helper
    used = {name for node in nodes for name in node.inputs}
    initializers = [numpy_helper.from_array(np.asarray(graph.constants[name]), name)
                    for name in sorted(used) if name in graph.constants]
    body = helper.make_graph(
        [node.proto for node in nodes], "host_partition",
        [_value_info(name, *types[name]) for name in inputs],
        [_value_info(name, *types[name]) for name in outputs], initializers)
    model = helper.make_model(body, opset_imports=[helper.make_opsetid(domain, version)
                                                   for domain, version in graph.opsets.items()])
    model.ir_version = graph.ir_version
    return model


def _session(model, what, *, optimize=True):
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        return onnxruntime.InferenceSession(model.SerializeToString(), options,
                                            providers=["CPUExecutionProvider"])
    except Exception as error:
        raise NPUValueError(f"onnxruntime cannot run {what}: {_first_line(error)}") from None


def probe(graph, x):
    """``{tensor: (dtype, shape)}`` of every tensor the graph computes, from one onnxruntime
    run of ``x`` with every node's output made an output of the model (optimizations off:
    the graph is already the one onnxruntime runs)."""
    from onnx import helper
    name = graph.inputs[0][0]
    produced = [out for node in graph.nodes for out in node.outputs if out]
    model = _model(graph, graph.nodes, [name], [], {name: (x.dtype, x.ndim)})
    for out in produced:
        model.graph.output.append(helper.ValueInfoProto(name=out))
    session = _session(model, f"{graph.path or 'the model'}", optimize=False)
    try:
        values = session.run(produced, {name: x})
    except Exception as error:
        raise NPUValueError(f"onnxruntime failed on {graph.path or 'the model'}: "
                            f"{_first_line(error)}") from None
    result = {name: (x.dtype, x.shape)}
    for out, value in zip(produced, values):
        value = np.asarray(value)
        result[out] = (value.dtype, value.shape)
    return result


@dataclass
class HostPartition:
    """Host nodes that run as one onnxruntime session, between two NPU programs."""
    nodes: list
    inputs: list = field(default_factory=list)      # tensors read from before it
    outputs: list = field(default_factory=list)     # tensors read after it, or the graph's
    session: object = field(default=None, repr=False)

    @property
    def names(self):
        return [node.name for node in self.nodes]

    def build(self, graph, types):
        """Make the session (once)."""
        if self.session is None:
            model = _model(graph, self.nodes, self.inputs, self.outputs, types)
            first, last = self.nodes[0].name, self.nodes[-1].name
            self.session = _session(model, f"the host nodes {first!r} to {last!r}")
        return self.session

    def run(self, values):
        """Run on ``values`` (``{tensor: array}``); the outputs are added to it."""
        feed = {name: values[name] for name in self.inputs}
        try:
            results = self.session.run(self.outputs, feed)
        except Exception as error:
            raise NPUValueError(f"onnxruntime failed on the host nodes {self.nodes[0].name!r} "
                                f"to {self.nodes[-1].name!r}: {_first_line(error)}") from None
        values.update(zip(self.outputs, results))


def host_partitions(graph, steps):
    """Fill in each partition's boundary: ``steps`` is the run's order, a list of
    :class:`HostPartition` and NPU groups (anything with ``input`` and ``output``)."""
    graph_outputs = {name for name, _, _ in graph.outputs}
    reads = {}                         # tensor -> indices of the steps that read it
    for index, step in enumerate(steps):
        names = ([name for node in step.nodes for name in node.inputs]
                 if isinstance(step, HostPartition) else [step.input])
        for name in names:
            reads.setdefault(name, set()).add(index)
    for index, step in enumerate(steps):
        if not isinstance(step, HostPartition):
            continue
        made = [out for node in step.nodes for out in node.outputs if out]
        inside = set(made)
        step.inputs = list(dict.fromkeys(
            name for node in step.nodes for name in node.inputs
            if name and name not in inside and name not in graph.constants))
        step.outputs = [name for name in made if name in graph_outputs
                        or reads.get(name, set()) - {index}]
    return steps
