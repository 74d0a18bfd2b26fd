"""The compiler: tiles GEMMs, quantized GEMMs and convolutions onto the fixed R x C
weight-stationary array.

* :mod:`sw.compiler.plan`: the one :class:`Plan` and :class:`Program` types, :data:`SCHEDULES`;
* :mod:`sw.compiler.emitter`: the one instruction :class:`Emitter`;
* :mod:`sw.compiler.gemm`: the plain GEMM schedules (overlap, resident, streaming);
* :mod:`sw.compiler.quantized`: the quantized core (:class:`RowGather`);
* :mod:`sw.compiler.conv`: convolutions lowered onto that core, depthwise ones included;
* :mod:`sw.compiler.checks`: the argument checks they share.

Every ``compile_*`` function takes the plan its ``plan_*`` function made (``plan=``), so a
caller that sizes DRAM from the plan does not plan twice.
"""

from .checks import (as_int, check_padding, check_positive, check_quant_mode, check_quant_operands,
                     check_region)
from .conv import (LOWERINGS, Conv2dGeometry, ConvGather, check_lowering, compile_conv2d,
                   compile_depthwise_conv2d, depthwise_weights, plan_conv2d,
                   plan_depthwise_conv2d)
from .emitter import Emitter
from .gemm import compile_gemm, plan_gemm, scalesim_cycles
from .plan import SCHEDULES, Plan, Program
from .quantized import (GemmGather, RowGather, compile_gathered, compile_qgemm,
                        compile_quantized, merge_runs, plan_qgemm, plan_quantized)


__all__ = ["SCHEDULES", "Plan", "Program", "Emitter", "plan_gemm", "compile_gemm",
           "scalesim_cycles", "RowGather", "GemmGather", "merge_runs", "plan_quantized",
           "compile_quantized", "compile_gathered", "plan_qgemm", "compile_qgemm",
           "Conv2dGeometry", "ConvGather", "LOWERINGS", "check_lowering", "plan_conv2d",
           "compile_conv2d", "depthwise_weights", "plan_depthwise_conv2d",
           "compile_depthwise_conv2d", "as_int", "check_positive", "check_region", "check_padding",
           "check_quant_operands", "check_quant_mode"]
