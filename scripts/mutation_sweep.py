#!/usr/bin/env python
"""Mutation sweep: ``python scripts/mutation_sweep.py MODEL`` mutates each weight layer of
MODEL's optimized graph ×1.05 through a user's transform after the default pipeline and counts
what verification catches (caught / total, listing the misses). Exit 0 when every mutation was
caught and the unmutated model passes, 1 otherwise, 2 on bad input (one line).

MODEL: a frozen .pb/.pbtxt, a SavedModel directory or a .keras/.h5 file (as ``tfsurgery``
takes it), or ``demo`` (the article CNN)."""
import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a .pb/.pbtxt, SavedModel directory, .keras/.h5, or demo")
    parser.add_argument("--factor", type=float, default=1.05,
                        help="each mutation: one weight layer times this (default 1.05)")
    parser.add_argument("--channel", action="store_true",
                        help="mutate one output channel (the last) of each kernel instead")
    parser.add_argument("--all-weights", action="store_true",
                        help="also mutate biases and normalization scales, not only kernels "
                             "and embedding tables")
    parser.add_argument("--limit", type=int, default=None,
                        help="at most this many layers, spread from the first to the last")
    parser.add_argument("--inputs", default=None, help="comma-separated input names")
    parser.add_argument("--outputs", default=None, help="comma-separated output names")
    args = parser.parse_args(argv)
    from benchmarks.mutation_sweep import sweep
    from tfsurgery import api
    from tfsurgery.errors import InputError
    try:
        if args.model == "demo":
            source = api.demo()
        else:
            source = api.load(args.model)
        if args.inputs or args.outputs:
            source = dataclasses.replace(
                source, inputs=args.inputs.split(",") if args.inputs else source.inputs,
                outputs=args.outputs.split(",") if args.outputs else source.outputs)
        found = sweep(source, source.label, factor=args.factor, channel=args.channel,
                      all_weights=args.all_weights, limit=args.limit)
    except (InputError, OSError) as error:
        print(f"mutation_sweep: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2
    print(found.line())
    return 0 if found.unmutated_passed and not found.misses and found.outcomes else 1


if __name__ == "__main__":
    sys.exit(main())
