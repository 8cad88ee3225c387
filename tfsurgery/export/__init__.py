"""Export: one module per format, and the writer that checks every artefact, then writes all or
none.

- ``writer``: ``Targets`` and ``write`` (the requested formats, checked, staged, published);
- ``onnx`` (tf2onnx, checked in onnxruntime; ``onnx_tidy``, ``tensor_list_loops`` prepare it),
  ``savedmodel``, ``tflite``, ``openvino``;
- ``artefacts``: the record of what was written and how it was checked, staging, deadlines.
"""
