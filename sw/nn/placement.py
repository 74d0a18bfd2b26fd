"""Operator placement: which operators run on the NPU and which on the CPU, and why.

The array computes one thing: INT8 x INT8 products summed into INT32, followed on the way out
by the per-channel requantization and clamp. A convolution (by im2col) and a dense layer are
exactly that, with their bias preloaded into the accumulator, a folded BatchNorm inside the
weights and a fused ReLU inside the clamp. Everything else has no mapping onto the array's
fixed wiring (seeds, section 4.3) and runs on the host CPU; the reason says what it lacks.
"""

from dataclasses import dataclass

from hw.config import MAX_K, NPUConfig
from ..errors import NPUTypeError


__all__ = ["Placement", "place", "DEVICES"]


#: Where an operator can run.
DEVICES = ("npu", "cpu")


@dataclass(frozen=True)
class Placement:
    """Where one operator runs.

    Attributes
    ----------
    op : str
        Operator name.
    kind : str
        Operator kind (``"conv2d"``, ``"dense"``, ``"softmax"``, ...).
    device : str
        ``"npu"`` or ``"cpu"``.
    reason : str
        Why, in one sentence.
    sources : tuple of str
        The float layers the operator computes.
    """
    op: str
    kind: str
    device: str
    reason: str
    sources: tuple = ()


def _gemm_placement(op, config):
    fused = []
    if len(op.sources) > 1:
        fused.append(f"computes {' + '.join(op.sources)} in one pass")
    if op.relu:
        fused.append(f"ReLU in the requantization clamp (act_min = {op.act_min})")
    if op.k > MAX_K:
        return Placement(op.name, op.kind, "cpu",
                         f"K = {op.k} exceeds MAX_K = {MAX_K}: the INT32 accumulator could "
                         f"overflow", op.sources)
    if op.kind == "conv2d":
        kernel_h, kernel_w = op.kernel
        what = (f"a {kernel_h}x{kernel_w} convolution is an INT8 GEMM, K = {op.k} by N = "
                f"{op.n}, one row per output pixel (implicit im2col: the strided DMA gathers "
                f"each kernel tap's pixels from the padded NHWC input)")
    else:
        what = f"a dense layer is an INT8 GEMM, K = {op.k} by N = {op.n}, one row per sample"
    reason = (f"{what}: the reduction the array computes natively; bias preloaded into "
              f"the accumulator")
    if fused:
        reason += "; " + "; ".join(fused)
    return Placement(op.name, op.kind, "npu", reason, op.sources)


_CPU_REASONS = {
    "quantize": "float to INT8 conversion of the host's input: the array has no float "
                "datapath; the host does it while writing the input into DRAM",
    "relu": "an elementwise max(q, zero point) left unfused: the array has no elementwise "
            "unit, so it is a separate pass over the tensor on the host",
    "flatten": "a reshape with no arithmetic: the dense weight rows are in NHWC order, so "
               "it is a free view of the same DRAM bytes and nothing runs",
    "maxpool": "a max over windows: no multiply-accumulate, so no GEMM the array can stream",
    "softmax": "exponentials and a division in float: the array only multiplies and adds "
               "INT8 into INT32",
    "argmax": "a data-dependent compare-and-select reduction, not a matmul",
}


def place(qnet, config):
    """Place every operator of ``qnet`` (a :class:`~sw.nn.quantize.QuantizedNetwork`).

    Returns
    -------
    tuple of Placement
        One per operator, in execution order.
    """
    if not isinstance(config, NPUConfig):
        raise NPUTypeError(f"config must be an NPUConfig, not {config!r}")
    placements = []
    for op in qnet.ops:
        if op.kind in ("conv2d", "dense"):
            placements.append(_gemm_placement(op, config))
        elif op.kind in _CPU_REASONS:
            placements.append(Placement(op.name, op.kind, "cpu", _CPU_REASONS[op.kind],
                                        op.sources))
        else:
            placements.append(Placement(op.name, op.kind, "cpu",
                                        "no lowering to the array exists for this operator",
                                        op.sources))
    return tuple(placements)
