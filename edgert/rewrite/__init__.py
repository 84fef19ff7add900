"""ONNX-to-ONNX rewrites: FP16 conversion, batch-dimension changes.

Each rewrite takes an ONNX model and returns a new one that ONNX Runtime, TensorRT and TensorRT-RTX all
accept, and checks its outputs against the original where that can be done. These run at build time (the
``edgert convert`` command) but import nothing of the builder, so the runtime may use them too (a batched
pipeline rewrites a batch-1 model in memory).
"""
