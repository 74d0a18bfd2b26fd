"""The intermediate graph: operators between named tensors, each with its NPU lowering or the
reason it has none."""

from dataclasses import dataclass, field

import numpy as np


__all__ = ["Op", "Graph", "LAYOUTS", "VIEW_ORDERS"]

#: Activation layouts a front end hands over: ``"NHWC"`` (:mod:`sw.nn`) or ``"NCHW"`` (ONNX).
LAYOUTS = ("NHWC", "NCHW")

#: Orders of a flatten view: ``"HWC"`` (the dense weight rows already follow the NPU's NHWC
#: layout) or ``"CHW"`` (they follow a channel-major flatten and are permuted when the view
#: is passed through inside an NPU program).
VIEW_ORDERS = ("HWC", "CHW")


@dataclass
class Op:
    """One operator of the graph.

    Attributes
    ----------
    name, op_type : str
        The operator's name and type as its front end calls them.
    inputs, outputs : tuple of str
        Tensor names; ``inputs[0]`` is the activation an NPU operator reads.
    lowered : sw.nn.quantize.QConv2D or QDense or None
        The operator as the NPU computes it, when the front end could lower it.
    why_not : str or None
        For an operator that computes a GEMM but could not be lowered: why.
    reason : str
        For an operator with no lowering: why the host runs it.
    view : str or None
        For a flatten that moves no values: its order, one of :data:`VIEW_ORDERS`; an NPU
        program may pass through it from a convolution to a dense layer.
    macs : int
        Multiply-accumulates of the whole batch (0 for the operators without products).
    sources : tuple of str
        The float layers the operator computes.
    note : str
        Said after the placer's reason for an NPU operator (how the front end lowered it).
    dtype : numpy dtype
        Of an NPU operator's output as the front end holds it (int8, or uint8 that the NPU
        holds shifted by -128).
    payload : object
        The front end's own operator (what its host runs).
    """
    name: str
    op_type: str
    inputs: tuple
    outputs: tuple
    lowered: object = None
    why_not: str = None
    reason: str = ""
    view: str = None
    macs: int = 0
    sources: tuple = ()
    note: str = ""
    dtype: object = np.int8
    payload: object = field(default=None, repr=False)


@dataclass
class Graph:
    """Operators in an order where every input is computed before it is used.

    ``inputs`` and ``outputs`` name the graph's tensors; ``constants`` those that hold the
    same value in every run; ``layout`` is how the front end holds activations
    (:data:`LAYOUTS`).
    """
    ops: list
    inputs: list
    outputs: list
    layout: str = "NHWC"
    constants: frozenset = frozenset()

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, not {self.layout!r}")
        for op in self.ops:
            if op.view is not None and op.view not in VIEW_ORDERS:
                raise ValueError(f"{op.name}: view must be one of {VIEW_ORDERS}, not "
                                 f"{op.view!r}")
        self._consumers = {}
        for op in self.ops:
            for name in op.inputs:
                self._consumers.setdefault(name, []).append(op)

    def consumers(self, tensor):
        """The operators that read ``tensor``, in order."""
        return self._consumers.get(tensor, [])

    def single_consumer(self, tensor):
        """The one operator that reads ``tensor``, or None (several, none, or a graph
        output)."""
        readers = self.consumers(tensor)
        return readers[0] if len(readers) == 1 and tensor not in self.outputs else None
