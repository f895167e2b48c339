"""gin's view of the model side of a run: the encoder and the optimizer settings.

gin/models/*.gin bind ``xlmeta_jax.network.get_config`` and gin/pretrain.gin binds
``xlmeta_jax.optimizer.OptimizerConfig``; both entry points read them — our trainer
(``python -m xlmeta_jax.train``) and t5x's (``python -m t5x.train``, through
``xlmeta_jax.t5x_model``). The model is always ``network.get_config(size,
field=...)``: a binding of ``EncoderConfig`` itself would be a second, silently
ignored way to configure it. This module registers only these, so a t5x config that
imports it has no second ``train`` next to t5x's own (``--gin.train.X`` stays
unambiguous).
"""

import gin

from xlmeta_jax import network
from xlmeta_jax.optimizer import OptimizerConfig

get_config = gin.external_configurable(
    network.get_config, name="get_config", module="xlmeta_jax.network"
)
OptimizerConfig = gin.external_configurable(OptimizerConfig, module="xlmeta_jax.optimizer")
