"""Operator placement: which operators run on the NPU and which on the host, and why.

The array computes one thing: INT8 x INT8 products summed into INT32, followed on the way out
by the per-channel requantization and clamp. A convolution (by implicit im2col) and a dense
layer are exactly that, with their bias preloaded into the accumulator, a folded BatchNorm
inside the weights and a fused ReLU inside the clamp. Everything else has no mapping onto
the array's fixed wiring (seeds, section 4.3) and runs on the host; its reason says what it
lacks.
"""

from dataclasses import dataclass

from hw.config import MAX_K


__all__ = ["Placement", "place", "DEVICES"]


#: Where an operator can run.
DEVICES = ("npu", "cpu")


@dataclass(frozen=True)
class Placement:
    """Where one operator runs.

    Attributes
    ----------
    node, op_type : str
        The operator's name and type.
    device : str
        ``"npu"`` or ``"cpu"`` (the host).
    reason : str
        Why, in one sentence.
    macs : int
        Multiply-accumulates of the batch.
    sources : tuple of str
        The float layers the operator computes.
    """
    node: str
    op_type: str
    device: str
    reason: str
    macs: int = 0
    sources: tuple = ()


def _lowered_placement(op):
    """``(device, reason)`` of an operator with a lowering: the NPU, unless its K is too
    deep for the accumulator."""
    lowered = op.lowered
    if lowered.k > MAX_K:
        return "cpu", (f"cannot run on the array: K = {lowered.k} exceeds MAX_K = {MAX_K}: "
                       f"the INT32 accumulator could overflow")
    if lowered.kind == "conv2d":
        kernel_h, kernel_w = lowered.kernel
        what = (f"a {kernel_h}x{kernel_w} convolution is an INT8 GEMM, K = {lowered.k} by N = "
                f"{lowered.n}, one row per output pixel (implicit im2col: the strided DMA "
                f"gathers each kernel tap's pixels from the padded NHWC input)")
    else:
        what = (f"a dense layer is an INT8 GEMM, K = {lowered.k} by N = {lowered.n}, one row "
                f"per sample")
    fused = []
    if len(lowered.sources) > 1:
        fused.append(f"computes {' + '.join(lowered.sources)} in one pass")
    if lowered.relu:
        fused.append(f"ReLU in the requantization clamp (act_min = {lowered.act_min})")
    if lowered.scale is not None:
        fused.append("float32 requantization on the way out")
    if op.note:
        fused.append(op.note)
    reason = (f"{what}: the reduction the array computes natively; bias preloaded into the "
              f"accumulator")
    return "npu", reason + "".join(f"; {part}" for part in fused)


def place(graph):
    """One :class:`Placement` per operator of ``graph`` (a :class:`sw.ir.graph.Graph`), in
    order."""
    placements = []
    for op in graph.ops:
        device, reason = "cpu", op.reason
        if op.lowered is not None:
            device, reason = _lowered_placement(op)
        elif op.why_not is not None:
            reason = f"cannot run on the array: {op.why_not}"
        placements.append(Placement(op.name, op.op_type, device, reason, op.macs, op.sources))
    return placements
