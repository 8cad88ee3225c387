"""Int8: compute in 8-bit integers, as a mode of each export.

- ``config``: the request (thresholds, calibration, equalization) and the entry points the API
  calls (``export_int8``, ``export_tflite_int8``);
- ``loop``: calibrate, quantize, gate and search for one backend;
- ``target``: the CPU (one description) and what it makes fast;
- ``speed``: is the int8 artefact faster than its float twin (interleaved runs);
- ``bench``: float against int8-weight latency;
- ``equalize``: cross-layer equalization and bias correction;
- ``backends/``: ``onnx`` (onnxruntime's quantization), ``tflite`` (TFLiteConverter),
  ``openvino`` (NNCF).
"""
