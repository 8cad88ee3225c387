"""--samples: the user's own input values, one feed per row, refused in one line when they
cannot be fed."""
import numpy as np
import pytest
import tensorflow as tf

from tfsurgery.verify import samples
from tfsurgery.errors import InputError


def graph_with(*placeholders):
    graph = tf.Graph()
    with graph.as_default():
        for name, dtype, shape in placeholders:
            tf.compat.v1.placeholder(dtype, shape, name=name)
    return graph.as_graph_def()


@pytest.fixture(scope="module")
def specs():
    graph_def = graph_with(("images", tf.float32, [None, 8, 8, 3]), ("scope/ids", tf.int32, [4]),
                           ("any", tf.float32, None))
    return samples.input_specs(graph_def, ["images", "scope/ids:0", "any"])


def test_npz_rows_of_samples_and_batches(tmp_path, specs):
    rng = np.random.default_rng(3)
    images = rng.standard_normal((5, 8, 8, 3))          # five samples: each a batch of one
    ids = rng.integers(0, 9, size=(5, 4))                # rank 1 + 1: five whole feeds
    np.savez(tmp_path / "s.npz", images=images, **{"scope/ids": ids})
    loaded = samples.load(tmp_path / "s.npz", specs)
    assert loaded.rows == 5 and set(loaded.inputs) == {"images", "scope/ids:0"}
    row = loaded.row(2)
    assert row["images"].shape == (1, 8, 8, 3) and row["images"].dtype == np.float32
    np.testing.assert_array_equal(row["images"][0], images[2].astype(np.float32))
    np.testing.assert_array_equal(row["scope/ids:0"], ids[2])
    assert row["scope/ids:0"].dtype == np.int32
    assert len(list(loaded.feeds())) == 5


def test_directory_of_npy_with_sub_paths(tmp_path, specs):
    (tmp_path / "scope").mkdir()
    np.save(tmp_path / "scope" / "ids__0.npy", np.arange(12).reshape(3, 4))
    np.save(tmp_path / "images.npy", np.zeros((3, 2, 8, 8, 3), np.float32))   # batches of two
    loaded = samples.load(tmp_path, specs)
    assert loaded.rows == 3 and loaded.row(0)["images"].shape == (2, 8, 8, 3)


def test_split_holds_back_a_seeded_part(tmp_path, specs):
    np.savez(tmp_path / "s.npz", images=np.arange(40 * 192, dtype=np.float32).reshape(40, 8, 8, 3))
    loaded = samples.load(tmp_path / "s.npz", specs)
    calibrate, check = loaded.split(0.25)
    assert (calibrate.rows, check.rows) == (30, 10)
    seen = {float(a[0, 0, 0]) for part in (calibrate, check) for a in part.arrays["images"]}
    assert len(seen) == 40                                   # every row in exactly one part
    assert samples.load(tmp_path / "s.npz", specs).split(0.25)[1].arrays["images"].tobytes() == \
        check.arrays["images"].tobytes()                     # seeded
    with pytest.raises(InputError, match="too few"):
        loaded.take(range(8)).split(0.25)


@pytest.mark.parametrize("arrays, message", [
    ({"imgs": np.zeros((2, 8, 8, 3))}, "'imgs' is not an input"),
    ({"images": np.zeros((2, 8, 8, 4))}, r"input 'images': a row is shaped \[1, 8, 8, 4\]"),
    ({"images": np.zeros((2, 8, 3))}, "fits neither"),
    ({"images": np.full((2, 8, 8, 3), np.nan)}, "NaN or infinite"),
    ({"scope/ids": np.zeros((2, 4), np.float32)}, "float32 values cannot be fed to a int32"),
    ({"scope/ids": np.full((2, 4), 2 ** 40)}, "outside int32's range"),
    ({"images": np.zeros((2, 8, 8, 3)), "scope/ids": np.zeros((3, 4), np.int32)},
     "same number of rows"),
    ({"images": np.zeros((0, 8, 8, 3))}, "no rows"),
    ({"images": np.float32(1)}, "scalar holds no rows"),
])
def test_bad_samples_one_line(tmp_path, specs, arrays, message):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(InputError, match=message) as caught:
        samples.load(tmp_path / "bad.npz", specs)
    assert "\n" not in str(caught.value) and "bad.npz" in str(caught.value)


def test_unreadable_or_missing(tmp_path, specs):
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    for path in (tmp_path / "junk.npz", tmp_path / "missing.npz", tmp_path / "one.npy"):
        if path.name == "one.npy":
            np.save(path, np.zeros(3))
        with pytest.raises(InputError):
            samples.load(path, specs)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no arrays"):
        samples.load(tmp_path / "empty", specs)
