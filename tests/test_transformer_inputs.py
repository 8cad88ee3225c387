"""Transformers optimize without --samples: token ids within their embedding table, segment ids
within theirs, padding masks 0/1 with a valid prefix per row — read from the graph, said in the
report, and overridden by the user's own values (issue 40 item 3)."""
import numpy as np
import pytest

from tfsurgery import api
from tfsurgery.models import transformers
from tfsurgery.verify import runs, token_inputs

import oracle

SMALL = dict(layers=1, hidden=16, heads=2, seq=8, vocab=50)


@pytest.fixture(scope="module")
def bert():
    """A BERT-style encoder with [None, None] token inputs given as a dict."""
    return transformers.frozen("bert", dynamic=True, **SMALL)


def _optimized(built, feeds=None):
    return api.optimize(built.graph_def, interface=api.Interface(
        inputs=built.inputs, outputs=built.outputs, feeds=feeds))


def _assert_prefix_mask(mask):
    assert set(np.unique(mask)) <= {0, 1}
    assert (mask.sum(axis=-1) >= 1).all()                        # a valid position per row
    # one contiguous valid window per row: right-padded, left-padded or both
    assert (np.abs(np.diff(mask, axis=-1)).sum(axis=-1) <= 2).all()


def test_bert_optimizes_without_samples(bert):
    """Before: random ids 0..9 fell outside the 2-row segment table and TensorFlow refused to
    run the original. Now every input fits, the original runs in a plain session (the oracle)
    on the verifier's feeds, and the result matches it."""
    result = _optimized(bert)
    feeds = result.verification.feeds
    ids, segments, mask = feeds["token_ids"], feeds["segment_ids"], feeds["padding_mask"]
    assert ids.min() >= 0 and ids.max() < SMALL["vocab"] and len(np.unique(ids)) > 2
    assert set(np.unique(segments)) == {0, 1}
    _assert_prefix_mask(mask)
    assert mask.all(axis=-1)[0] and not mask.all()               # one row full, one padded
    expected = oracle.run(bert.graph_def, feeds, bert.outputs)
    actual = oracle.run(result.graph_def, feeds, result.outputs)
    for e, a in zip(expected, actual):
        assert np.abs(e - a).max() <= 1e-4 * np.abs(e).max()
    notes = "\n".join(result.verification.notes())
    assert f"input 'token_ids': ids in [0, {SMALL['vocab']})" in notes
    assert "input 'segment_ids': ids in [0, 2)" in notes
    assert "input 'padding_mask': 0/1 with a valid window per row" in notes and "Softmax" in notes
    assert result.verification.passed


def test_the_padding_mask_is_seen(bert):
    """The mask found is the attention's: changing a padded token's id changes nothing at the
    valid positions of its row, and changing a valid one does (oracle runs)."""
    feeds = runs.make_feeds(bert.graph_def, bert.inputs, seed=3)
    mask = feeds["padding_mask"]
    row = int(np.argmin(mask.sum(axis=-1)))
    length = int(mask[row].sum())
    assert length < mask.shape[1]
    sequence = bert.outputs[0]
    base = oracle.run(bert.graph_def, feeds, [sequence])[0]
    padded = {k: v.copy() for k, v in feeds.items()}
    padded["token_ids"][row, length] = (padded["token_ids"][row, length] + 1) % SMALL["vocab"]
    moved = oracle.run(bert.graph_def, padded, [sequence])[0]
    assert np.array_equal(moved[row, :length], base[row, :length])
    valid = {k: v.copy() for k, v in feeds.items()}
    valid["token_ids"][row, 0] = (valid["token_ids"][row, 0] + 1) % SMALL["vocab"]
    assert not np.allclose(oracle.run(bert.graph_def, valid, [sequence])[0][row, :length],
                           base[row, :length])


def test_list_inputs_and_a_causal_model():
    """GPT-2-style, inputs given as a list: ids and mask found the same way; a float input
    (ViT's image) is left to the random floats."""
    gpt2 = transformers.frozen("gpt2", as_dict=False, **SMALL)
    found = token_inputs.find(gpt2.graph_def, gpt2.inputs)
    assert found["token_ids"].kind == "ids" and found["token_ids"].rows == SMALL["vocab"]
    assert found["padding_mask"].kind == "mask"
    vit = transformers.frozen("vit", layers=1, hidden=16, heads=2, seq=4)
    assert token_inputs.find(vit.graph_def, vit.inputs) == {}


def test_given_values_win(bert):
    """The user's values are fed as given (here a mask with a fully padded first row, which
    the generator never makes); the other inputs are still found."""
    mask = np.zeros((2, 8), np.int32)
    mask[1, :5] = 1
    result = _optimized(bert, feeds={"padding_mask": mask})
    feeds = result.verification.feeds
    assert np.array_equal(feeds["padding_mask"], mask)
    assert feeds["segment_ids"].max() < 2
    notes = "\n".join(result.verification.notes())
    assert "input 'padding_mask'" not in notes and "input 'token_ids'" in notes


def test_prefixes_cover_every_row():
    rng = np.random.default_rng(0)
    mask = token_inputs.valid_prefixes(rng, (64, 5))
    _assert_prefix_mask(mask)
    assert set(mask.sum(axis=-1)) == {1, 2, 3, 4, 5}
    assert not mask[1:, 0].all() and not mask[1:, -1].all()      # left and right padding
    pair = token_inputs.valid_prefixes(rng, (2, 16))
    assert pair[0].all() and pair[1, 0] == 0 and pair[1, -1] == 0   # two rows: both sides


def test_samples_override_and_the_json_report_says_what_was_chosen(bert, tmp_path):
    """CLI: --samples gives the token ids (rows of ids < 5) and the mask; only segment_ids is
    left to the graph-read generator, and the JSON report's verification notes say so."""
    import json
    from tfsurgery.cli import main
    model = tmp_path / "bert.pb"
    model.write_bytes(bert.graph_def.SerializeToString())
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 5, (3, 2, 8)).astype(np.int32)          # three rows, each a batch
    mask = np.ones((3, 2, 8), np.int32)
    mask[:, 1, 4:] = 0
    np.savez(tmp_path / "rows.npz", token_ids=ids, padding_mask=mask)
    assert main(["optimize", str(model), "-o", str(tmp_path / "lean.pb"), "-q", "--samples",
                 str(tmp_path / "rows.npz"), "--report-json", str(tmp_path / "r.json")]) == 0
    notes = "\n".join(json.loads((tmp_path / "r.json").read_text())["verification"]["notes"])
    assert "input 'segment_ids': ids in [0, 2)" in notes
    assert "input 'token_ids'" not in notes and "input 'padding_mask'" not in notes
