"""Verify: the original and the result run on the same inputs, and where they part.

- ``check``: ``verify`` — the procedure and its verdict (``Verification``);
- ``samples``: the user's own input values; ``reference``: the original's outputs to compare to;
- ``runs``: running a graph with a deadline; ``sensitivity``: can the check see a changed weight;
- ``localize``: the first tensor where two graphs part; ``compare``: two graphs or artefacts.
"""
