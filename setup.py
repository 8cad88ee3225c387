from pathlib import Path

from setuptools import setup

# tfsurgery's subpackages, by job (docs/house.md).
SUBPACKAGES = ["tfsurgery.cli", "tfsurgery.graph", "tfsurgery.training", "tfsurgery.trust",
               "tfsurgery.verify", "tfsurgery.export", "tfsurgery.int8", "tfsurgery.int8.backends",
               "tfsurgery.bench"]

setup(
    name="tfsurgery",
    version="0.1.0",
    description="TensorFlow graph surgery for inference: training switches, dropout and tf.cond "
                "branches removed, batch norm folded, ONNX export — verified numerically.",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # One installed package: the repository's transforms/ and models/ folders install inside it.
    packages=["tfsurgery", *SUBPACKAGES, "tfsurgery.transforms", "tfsurgery.models"],
    package_dir={"tfsurgery": "tfsurgery",
                 **{name: name.replace(".", "/") for name in SUBPACKAGES},
                 "tfsurgery.transforms": "transforms",
                 "tfsurgery.models": "models"},
    install_requires=[
        "tensorflow>=2.21,<2.22",
        "numpy",
        "tf2onnx>=1.17",
        "onnx>=1.17",
        "onnxruntime>=1.20",
        # --tflite: the LiteRT interpreter (tf.lite.Interpreter is deprecated). 2.3.0 installs
        # beside tensorflow 2.21 without changing tensorflow, numpy or protobuf.
        "ai-edge-litert>=2.3",
        # --onnx-fusions: onnxruntime's transformer fusions (FusionSkipLayerNormalization) run its
        # symbolic shape inference, which needs sympy; onnxruntime 1.32 no longer installs it.
        "sympy",
        # the int8 gate's confidence bound (scipy.stats.beta); it came only with the test extra
        "scipy",
    ],
    extras_require={
        # scikit-learn: real data for the int8 tests, shipped inside its wheel (load_digits;
        # load_sample_images, which needs pillow to read its two JPEG photos).
        # openvino + nncf: so CI runs the OpenVINO tests (they skip where it is missing); both
        # install beside tensorflow 2.21 and numpy 2 without changing either (docs/openvino.md).
        # ray: so CI runs batch --engine ray on a local instance (issue 41); `pip install
        # --dry-run` adds only ray, filelock and msgpack beside tensorflow 2.21 (docs/batch.md).
        # keras-hub + transformers: the transformer tests build real BERT/GPT-2/ViT layers from
        # configs (random weights, no downloads); both install beside tensorflow 2.21 without
        # changing tensorflow, numpy or protobuf (`pip install --dry-run`).
        "test": ["pytest", "hypothesis", "tf_keras>=2.21,<2.22", "graphviz", "graphviz-pure",
                 "scikit-learn", "pillow", "openvino>=2026.0", "nncf>=3.0", "ray>=2.9",
                 "keras-hub>=0.32,<0.33", "transformers>=4.46,<4.47"],
        # --picture: DOT text, and a self-contained `dot` when Graphviz itself is not installed.
        "picture": ["graphviz", "graphviz-pure"],
        # --openvino DIR/: OpenVINO's converter and CPU runtime; --quantize int8 with it: NNCF.
        "openvino": ["openvino>=2026.0", "nncf>=3.0"],
        # batch --engine ray (also in "test", so CI runs it; docs/batch.md).
        "ray": ["ray>=2.9"],
    },
    entry_points={"console_scripts": ["tfsurgery=tfsurgery.cli:main"]},
)
