"""Running quantized ONNX models on the NPU (``npu onnx``): import, placement, execution.

See ``docs/onnx.md``.
"""
