"""Trust: what a model file may make this process do, decided before anything runs.

- ``outside``: the ops that act outside the graph (files, servers, callbacks), the scan that
  refuses them (``refuse_outside_ops``, ``scan_saved_model``) and the ``--allow-op`` allowance;
- ``keras``: Keras files read before loading (stored Python code refused unless trusted);
- ``user_code``: the one importer of the user's own code (``--plugin``, ``--import``).
"""
