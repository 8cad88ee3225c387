"""The transforms, one module each, listed once here in the order they run.

``PIPELINE`` is that order; a plain run uses the transforms marked ``default`` (``fold-batch-norm``
is added by ``--bn-fold``). To add a transform: write its module, mark its function with
``@transform("name")``, and put it in ``PIPELINE`` where it belongs.
"""
from tfsurgery.transforms import (add_preprocessing, flatten_atrous_conv, fold_affine_into_linear,
                                  fold_batch_norm, fold_constants, fold_pad_into_conv,
                                  freeze_placeholder_defaults, freeze_training_flags,
                                  materialize_shapes, merge_duplicates, prune, remove_augmentation,
                                  remove_dropout,
                                  remove_identity, remove_noop_shape_ops,
                                  remove_switch_merge, simplify_algebra, simplify_arithmetic,
                                  strip_debug, to_nhwc, use_moving_statistics)
from tfsurgery.transforms import (equalize_cross_layer, erfc_as_erf, float16_weights,
                                  inline_functions, int8_weights)
from tfsurgery.transforms import (fuse_attention, fuse_embed_layer_norm, fuse_gelu,
                                  fuse_layer_norm)
from tfsurgery.transforms import canonical_attention, canonical_masks, canonical_norm

PIPELINE = (
    add_preprocessing.add_preprocessing,
    freeze_training_flags.freeze_training_flags,
    freeze_placeholder_defaults.freeze_placeholder_defaults,
    inline_functions.inline_functions,
    strip_debug.strip_debug,
    remove_switch_merge.remove_switch_merge,
    remove_dropout.remove_dropout,
    # after dropout: a draw still meeting the data before any learned layer is augmentation
    remove_augmentation.remove_augmentation,
    # a BatchNorm in training mode (served with the augmentation's training=True): its moving
    # statistics, read off the update it would apply (before prune drops that update)
    use_moving_statistics.use_moving_statistics,
    remove_identity.remove_identity,
    materialize_shapes.materialize_shapes,     # its constants are folded next
    fold_constants.fold_constants,
    remove_noop_shape_ops.remove_noop_shape_ops,
    simplify_arithmetic.simplify_arithmetic,
    simplify_algebra.simplify_algebra,
    # not by default: the ONNX exporter's (ONNX has no Erfc); by name, the .pb's too
    erfc_as_erf.erfc_as_erf,
    # before BN folding: the batch norm after a BatchToSpaceND then follows the dilated conv
    flatten_atrous_conv.flatten_atrous_conv,
    fold_batch_norm.fold_batch_norm,
    fold_affine_into_linear.fold_affine_into_linear,
    fold_pad_into_conv.fold_pad_into_conv,
    # after the folds (they read either layout), before merging: --layout NHWC
    to_nhwc.to_nhwc,
    # after every fold: two convs of one input merged first would share one output, and a shared
    # output blocks the fold of each conv's own batch norm or scale. The folds repeat in the
    # fixpoint rounds, so what a merge exposes to them (a BN now behind a shared conv) is done.
    merge_duplicates.merge_duplicates,
    prune.prune,
    # only for int8 (--int8-equalize): balances weight ranges before calibration
    equalize_cross_layer.equalize_cross_layer,
    float16_weights.float16_weights,
    int8_weights.int8_weights,
)

# Proven on the TensorFlow graph, spliced into the ONNX export as onnxruntime's fused kernels
# (tfsurgery.export.onnx_fusion); the TensorFlow graph keeps its ops for Grappler's remapper.
# The embedding's LayerNorm is the embedding fusion's: the first to claim a tensor makes it.
ONNX_FUSIONS = (fuse_embed_layer_norm, fuse_layer_norm, fuse_gelu, fuse_attention)
# Before they match: each function's spellings rewritten to the one they know, on the export's
# private copy (canonical_forms; one rule file per family, its RULES appended here in order).
CANONICAL_RULES = (*canonical_norm.RULES, *canonical_attention.RULES, *canonical_masks.RULES)

REGISTRY = {fn.transform_name: fn for fn in PIPELINE}
ORDER = tuple(REGISTRY)
DEFAULT_TRANSFORMS = tuple(name for name, fn in REGISTRY.items() if fn.default)
