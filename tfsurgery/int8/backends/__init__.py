"""One module per int8 runtime: ``onnx`` (onnxruntime), ``tflite`` (LiteRT), ``openvino`` (NNCF)."""
