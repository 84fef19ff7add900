"""What build time and run time share about an engine: the file (plan and Ultralytics header), its
sidecar JSON (what it was built from, for which TensorRT and GPU) and the TensorRT logger.

The builder (:mod:`edgert.builder`) writes these, the runtime (:mod:`edgert.backends.tensorrt`) reads them;
nothing here imports either, so the runtime never imports the builder.
"""
