"""Int8: compute in 8-bit integers, as a mode of each export.

- ``config``: the request checked before any work (missing files, too few gate rows) and the
  entry points the API calls (``export_int8``, ``export_tflite_int8``, ``export_openvino_int8``);
- ``options``: ``Int8Config``, every option besides the rows, checked when made;
- ``loop``: choose (static, mixed, dynamic), time every mode, gate and write, for one backend;
- ``measures``: agreement / SQNR / accuracy and the gate's confidence bound;
- ``rows``: the calibration, selection and gate rows and the float reference on them;
- ``kinds``: each output's kind read from the graph (class scores or values);
- ``target``: the CPU (one description) and what it makes fast;
- ``speed``: is the int8 artefact faster than its float twin (interleaved runs);
- ``bench``: float against int8-weight latency;
- ``equalize``: cross-layer equalization and bias correction;
- ``backends/``: ``onnx`` (onnxruntime's quantization), ``tflite`` (TFLiteConverter),
  ``openvino`` (NNCF).
"""
