"""Issue 41 item 1, as its "done when" states it: on a random-weight Keras MobileNetV2 at full
width and size (alpha 1.0, 224×224: ReLU6 saturates inside it, 53 weight layers), a user's
transform that scales one kernel by 1.05 after the default pipeline is caught, and the unmutated
model passes with default options — also with batch norms folded, where the check compares what
fold-batch-norm declares each folded conv stands for. A sample of kernels (the first conv, a
middle one, the last conv) keeps it fast; the tests' own oracle (plain TF sessions) confirms
each mutation is real: the outputs move, or where they barely do, the batch norm after the conv."""
import numpy as np
import pytest

from tfsurgery import api, pipeline
from tfsurgery.errors import CannotVerify, VerificationFailed
from models import keras_models

import oracle
from test_blind_spots import _first_common_after, kernels, scale_one_kernel

TOLERANCE = 1e-4
SAMPLE = (0, 26, 51)            # of the 53 kernels: Conv1, a middle one, the last conv (Conv_1)


@pytest.fixture(scope="module")
def mobilenet():
    """``keras.applications.MobileNetV2(weights=None)`` at alpha 1.0, 224×224: weights, biases
    and batch-norm statistics randomised, frozen."""
    return keras_models.keras_application("MobileNetV2", input_size=224, alpha=1.0)


@pytest.fixture
def users(monkeypatch):
    monkeypatch.setattr(pipeline, "USER", {})
    monkeypatch.setattr(api, "_localize", lambda *args: None)      # the verdict, not where


def optimize(model, transforms=None):
    source = api.Source(model.graph_def, "mobilenet_v2", inputs=model.inputs,
                        outputs=model.outputs)
    return api.optimize(source, transforms) if transforms else api.optimize(source)


@pytest.mark.parametrize("bn_fold", [False, True])
def test_the_unmutated_model_passes_with_default_options(mobilenet, bn_fold):
    result = optimize(mobilenet, ["default", "fold-batch-norm"] if bn_fold else None)
    check = result.verification
    assert check.passed and not check.blind, check.failure()
    found = check.watching.sensitivity
    assert found.layers == 53 and found.probed >= 3 and found.sees     # a spread sample, seen
    assert len(check.intermediate) > 50          # every corresponding intermediate compared
    if bn_fold:          # the folded convs, compared with the batch norm's scaled tensor
        declared = result.reports.correspondence
        assert len(declared) >= 45
        compared = {e.name for e in check.intermediate}
        assert sum(name in compared for name in declared) == len(declared)
    oracle.assert_same_outputs(mobilenet.graph_def, result.graph_def, mobilenet.inputs,
                               mobilenet.outputs, rtol=TOLERANCE)


@pytest.mark.parametrize("index", SAMPLE)
def test_a_kernel_times_1_05_is_caught(mobilenet, users, index):
    layer = kernels(mobilenet.graph_def)[index]
    with pytest.raises(VerificationFailed) as failed:
        optimize(mobilenet, ["default", scale_one_kernel(f"scale-{index}", layer)])
    assert not isinstance(failed.value, CannotVerify)
    assert not failed.value.verification.passed
    # the oracle: the mutation is real — the outputs move, or the tensor after the layer does
    original, mutated = mobilenet.graph_def, failed.value.result.graph_def
    feeds = oracle.random_feeds(original, mobilenet.inputs, seed=0)
    after_layer = _first_common_after(original, mutated, layer)
    before = oracle.run(original, feeds, mobilenet.outputs + [after_layer])
    after = oracle.run(mutated, feeds, mobilenet.outputs + [after_layer])
    moved = [oracle.relative_error(b, a) for b, a in zip(before, after)]
    assert max(moved) > 10 * TOLERANCE, moved


def test_a_kernel_times_1_05_after_folding_is_caught(mobilenet, users):
    layer = kernels(mobilenet.graph_def)[SAMPLE[1]]
    with pytest.raises(VerificationFailed) as failed:
        optimize(mobilenet, ["default", "fold-batch-norm", scale_one_kernel("scale-fold", layer)])
    assert not isinstance(failed.value, CannotVerify)
    original, mutated = mobilenet.graph_def, failed.value.result.graph_def
    feeds = oracle.random_feeds(original, mobilenet.inputs, seed=0)
    after_layer = _first_common_after(original, mutated, layer)
    before, after = (oracle.run(g, feeds, [after_layer])[0] for g in (original, mutated))
    assert oracle.relative_error(before, after) > 10 * TOLERANCE
    assert np.isfinite(failed.value.verification.max_error)


# ---------------------------------------------------------------- issue 49: with preprocessing
MEAN, SCALE = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)     # RGB, fed BGR uint8


def _preprocessed(model, transforms):
    source = api.Source(model.graph_def, "mobilenet_v2", inputs=model.inputs,
                        outputs=model.outputs)
    request = api.requested_preprocessing(dtype="uint8", reverse=(None, True),
                                          mean=",".join(map(str, MEAN)),
                                          scale=",".join(map(str, SCALE)))
    return api.optimize(source, transforms, options=api.RunOptions(preprocess=request))


def _bgr_model_input(raw):
    return ((raw[..., ::-1].astype(np.float64) - MEAN) / SCALE).astype(np.float32)


def test_uint8_bgr_preprocessing_passes_by_default_comparing_the_intermediates(mobilenet):
    """Issue 49: with the preprocessing folded in, the run stopped at "cannot verify ... Conv1
    ... 0 intermediate tensors". The original is fed the preprocessed rows, the result their
    raw values, and the same intermediate tensors are compared as without preprocessing."""
    result = _preprocessed(mobilenet, ["default", "fold-batch-norm"])
    check = result.verification
    assert check.passed and not check.blind, check.failure()
    assert len(check.intermediate) > 50
    raw = np.random.default_rng(1).integers(0, 256, (2, 224, 224, 3)).astype(np.uint8)
    expected = oracle.run(mobilenet.graph_def, {mobilenet.inputs[0]: _bgr_model_input(raw)},
                          mobilenet.outputs)[0]
    actual = oracle.run(result.graph_def, {mobilenet.inputs[0]: raw}, mobilenet.outputs)[0]
    assert oracle.relative_error(expected, actual) <= TOLERANCE


def test_conv1_times_1_05_with_preprocessing_is_caught(mobilenet, users):
    layer = kernels(mobilenet.graph_def)[0]
    with pytest.raises(VerificationFailed) as failed:
        _preprocessed(mobilenet, ["default", "fold-batch-norm",
                                  scale_one_kernel("scale-conv1-preprocessed", layer)])
    assert not isinstance(failed.value, CannotVerify)
    raw = np.random.default_rng(2).integers(0, 256, (2, 224, 224, 3)).astype(np.uint8)
    expected = oracle.run(mobilenet.graph_def, {mobilenet.inputs[0]: _bgr_model_input(raw)},
                          mobilenet.outputs)[0]
    actual = oracle.run(failed.value.result.graph_def, {mobilenet.inputs[0]: raw},
                        mobilenet.outputs)[0]
    assert oracle.relative_error(expected, actual) > 0      # real, however small at the output
