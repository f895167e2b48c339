"""The model: the encoder network, the masked-LM contract, losses, optimizer, sharding.

Pure JAX/Flax/optax; no gin, no TensorFlow, nothing above it in the package:

* ``network``      — the XLM-R encoder (Flax) and its sizes (``get_config``);
* ``mlm``          — the masked-LM batch contract and masking settings (``Masking``);
* ``losses``       — masked cross-entropy and accuracy;
* ``optimizer``    — AdamW with XLM-R's schedule (``OptimizerConfig``);
* ``partitioning`` — the device mesh, logical axis rules and shardings.
"""
