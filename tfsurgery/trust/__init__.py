"""Trust: what a model file may make this process do, decided before anything runs.

- ``outside``: the allowlist (stateless ops, reviewed stateful ones, no op reaching files,
  servers or Python), the scan that refuses the rest (``find``, ``refuse``,
  ``find_in_saved_model``) and the ``--allow-op`` allowance;
- ``stateful_ops``: the stateful ops reviewed to stay in memory, each with its reason;
- ``provenance``: a SavedModel's checkpoint prefixes and table files proven its own;
- ``keras``: Keras files read before loading (stored Python code refused unless trusted);
- ``user_code``: the one importer of the user's own code (``--plugin``, ``--import``).
"""
