r"""Our encoder and masked-LM loss as a t5x model, for ``python -m t5x.train``.

t5x's trainer, partitioner and checkpointer drive the same network
(``xlmeta_jax.model.network.masked_lm``: either family), loss (:mod:`xlmeta_jax.model.losses`),
optimizer (:mod:`xlmeta_jax.model.optimizer`) and seqio tasks (``tasks``) as our own
trainer; gin/meta.gin and gin/xlmr.gin wire them up:

  python -m t5x.train --gin_file=gin/meta.gin --gin.MODEL_DIR="'/runs/meta'" ...

* :class:`MaskedLMModel` — a ``t5x.models.BaseModel``. Its initial variables carry a
  ``params_axes`` collection (the only place t5x reads partitioning from) built from
  the logical names the network boxes every parameter with, so t5x's
  ``PjitPartitioner`` maps them to its ``('data', 'model')`` mesh by its own
  ``logical_axis_rules``.
* :class:`MLMFeatureConverter` — feeds the tasks' masked blocks through unchanged:
  the positions chosen by 80/10/10 masking and their weights come from the task
  (seqio's ``EncoderFeatureConverter`` would weight only ``inputs == <mask>``,
  dropping the 10% random and 10% kept positions from the loss).
* :class:`MeshPartitioner` — t5x's ``PjitPartitioner`` with an explicit
  ``(data, model)`` mesh shape on any backend (t5x's CPU mesh puts one process's
  devices all on ``model``).
* :class:`MaskedLMTrainer` — t5x's ``Trainer`` whose gradient accumulation
  (``num_microbatches``) normalises the loss over the whole batch, as our trainer's.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import clu.metrics as clu_metrics
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import seqio
import tensorflow as tf
from flax.linen import partitioning as flax_partitioning
from jax.sharding import Mesh
from t5x import metrics as t5x_metrics
from t5x import models as t5x_models
from t5x import optimizers as t5x_optimizers
from t5x import partitioning as t5x_partitioning
from t5x import trainer as t5x_trainer

from xlmeta_jax import errors
from xlmeta_jax.data.vocabulary import MASK_ID
from xlmeta_jax.model import losses, mlm, network, optimizer, partitioning
from xlmeta_jax.pretrain import step

# Logical names of our network that t5x's standard rules do not name (position tables).
ADDITIONAL_LOGICAL_AXIS_RULES = (("abspos", None),)


# ============================================================================
# Feature converter.
# ============================================================================


class PackedRowsError(errors.UserError, ValueError):
    """A task of rows packed from whole documents, which t5x's trainer does not read."""


class MLMFeatureConverter(seqio.FeatureConverter):
    """Passes the tasks' masked blocks to the model as they are.

    Task features: ``inputs`` and ``targets`` of length L (``task_feature_lengths =
    {'inputs': L, 'targets': L}``, the ``sequence_length`` our tasks take), plus the
    ``mlm_*`` slots the task's masking wrote. Model features (``mlm.STEP_FEATURES``):
    ``inputs`` [L] and ``mlm_positions``, ``mlm_targets``, ``mlm_weights`` [P], the
    slots of ``masking`` (``mlm.max_predictions(L, MASK_RATE)``), the tasks' own. Every
    selected position — masked, randomly replaced or kept — carries weight 1, as our
    trainer's loss has it. Blocks are packed by the tasks (RoBERTa's FULL-SENTENCES), so
    ``pack`` must be False. t5x builds it from ``MaskedLMModel.FEATURE_CONVERTER_CLS``,
    which carries the model's ``masking``.
    """

    TASK_FEATURES = {
        "inputs": seqio.FeatureConverter.FeatureSpec(dtype=tf.int32),
        "targets": seqio.FeatureConverter.FeatureSpec(dtype=tf.int32),
    }
    # What the train step reads (mlm.STEP_FEATURES).
    MODEL_FEATURES = {
        name: seqio.FeatureConverter.FeatureSpec(
            dtype=tf.float32 if name == "mlm_weights" else tf.int32)
        for name in mlm.STEP_FEATURES
    }
    PACKING_FEATURE_DTYPES = {}

    def __init__(self, pack: bool = False, masking: mlm.Masking = mlm.DEFAULT_MASKING,
                 **kwargs):
        if pack:
            raise ValueError(
                "MLMFeatureConverter: the MLM tasks pack blocks themselves; set "
                "DatasetConfig.pack = False"
            )
        super().__init__(pack=False, **kwargs)
        self.masking = masking

    def _convert_features(
        self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]
    ) -> tf.data.Dataset:
        packed = [k for k in mlm.PACKED_FEATURES if k in ds.element_spec]
        if packed:
            raise PackedRowsError(
                "t5x's MaskedLMModel reads fairseq blocks, but the task's rows are packed from "
                "whole documents (Corpora.packing='documents', features "
                f"{packed}): train them with python -m xlmeta_jax.train, or set "
                "packing='blocks'")
        missing = [k for k in self.MODEL_FEATURES if k not in ds.element_spec]
        if missing:
            raise ValueError(
                f"MLMFeatureConverter: the dataset has no {missing}; it must come from an "
                "MLM task (xlmeta_jax/data/task_names.py) whose last preprocessor masks the blocks"
            )
        slots = int(ds.element_spec["mlm_positions"].shape[-1])
        length = int(task_feature_lengths["inputs"])
        if slots != mlm.max_predictions(length, self.masking.rate):
            raise mlm.MaskingError(
                f"the task's blocks of {length} tokens carry {slots} prediction slots, but "
                f"MaskedLMModel.masking.rate={self.masking.rate} gives "
                f"{mlm.max_predictions(length, self.masking.rate)}: bind both from MASK_RATE "
                "(gin/pretrain.gin)")
        return ds.map(
            lambda ex: {k: ex[k] for k in self.MODEL_FEATURES},
            num_parallel_calls=tf.data.AUTOTUNE,
        )

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict:
        length = int(task_feature_lengths["inputs"])
        slots = mlm.max_predictions(length, self.masking.rate)
        return {
            "inputs": length,
            "mlm_positions": slots,
            "mlm_targets": slots,
            "mlm_weights": slots,
        }


# ============================================================================
# Model.
# ============================================================================


def params_axes(boxed_params) -> dict:
    """t5x's ``params_axes`` collection from the network's logical boxes.

    Args:
      boxed_params: the ``params`` collection as ``init`` returns it (every leaf
        an ``nn.LogicallyPartitioned``).

    Returns:
      For every parameter ``.../name``, ``.../name_axes`` holding
      ``flax.linen.partitioning.AxisMetadata(names=...)``.

    Raises:
      ValueError: naming parameters without logical axis names (t5x could not
        place them).
    """
    flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(boxed_params))
    axes, unnamed = {}, []
    for path, leaf in flat.items():
        names = getattr(leaf, "names", None)
        if names is None or len(names) != np.ndim(nn.unbox(leaf)):
            unnamed.append("/".join(path))
            continue
        axes[(*path[:-1], f"{path[-1]}_axes")] = flax_partitioning.AxisMetadata(
            names=tuple(names)
        )
    if unnamed:
        raise ValueError(f"parameters without logical axis names: {unnamed}")
    return flax.traverse_util.unflatten_dict(axes)


class MaskedLMModel(t5x_models.BaseModel):
    """``network.masked_lm(config)`` (either family) trained with ``losses.mlm_loss_and_metrics``.

    ``loss_fn`` is our trainer's loss: the mean cross-entropy over the batch's
    selected positions (LM head applied only there). That mean is per batch, so
    t5x's own gradient accumulation (which sums the microbatches' gradients of
    ``loss_fn``) would weight each microbatch's mean equally; train with
    :class:`MaskedLMTrainer` for ``num_microbatches`` > 1.
    """

    FEATURE_CONVERTER_CLS = MLMFeatureConverter

    def __init__(
        self,
        config: network.EncoderConfig,
        optimizer_def: t5x_optimizers.OptimizerDefType,
        mask_id: int = MASK_ID,
        masking: mlm.Masking = mlm.DEFAULT_MASKING,
    ):
        """Args:
        config: encoder sizes and numerics (gin/models/*.gin).
        optimizer_def: e.g. :func:`adamw` (our AdamW and schedule).
        mask_id: id of ``<mask>``; ``predict_batch`` fills these positions.
        masking: the tasks' masking (gin/t5x/run.gin binds MASK_RATE's): the prediction
          slots of the feature converter's shapes and of ``predict_batch``.
        """
        if not isinstance(config, network.EncoderConfig):
            raise TypeError(f"MaskedLMModel.config must be an EncoderConfig, got {config!r}")
        if not isinstance(masking, mlm.Masking):
            raise TypeError(f"MaskedLMModel.masking must be an mlm.Masking, got {masking!r}")
        super().__init__(optimizer_def=optimizer_def)
        self.masking = masking
        # t5x builds its converter from this attribute, as its own models set it per instance.
        self.FEATURE_CONVERTER_CLS = functools.partial(MLMFeatureConverter, masking=masking)
        if network.resolve_attention_impl(config.attention_impl, config.dtype) == "splash":
            # t5x partitions under its own mesh context, in which the splash kernel's
            # shard_map finds no mesh (the kernel would run on gathered arrays): t5x's
            # runs attend on XLA's path on a TPU (docs/performance.md).
            config = config.replace(attention_impl="xla")
        self.config = config
        self.module = network.masked_lm(config)
        self.mask_id = int(mask_id)

    # ------------------------------------------------------------------ init
    def get_initial_variables(
        self,
        rng: jax.Array,
        input_shapes: Mapping[str, Any],
        input_types: Mapping[str, Any] | None = None,
    ) -> dict:
        """``params`` (unboxed) and ``params_axes`` (logical names) of the network.

        Parameter shapes do not depend on the batch, so a one-row block initialises
        them (the same values ``step.make_step_functions`` draws for a key).
        """
        del input_types
        length = min(8, int(input_shapes["inputs"][-1]))
        ids = jnp.full((1, length), self.config.pad_token_id + 1, jnp.int32)
        variables = self.module.init(rng, ids, deterministic=True)
        return {
            "params": nn.unbox(variables["params"]),
            "params_axes": params_axes(variables["params"]),
        }

    # ------------------------------------------------------------------ loss
    def loss_fn(self, params, batch: Mapping[str, jax.Array], dropout_rng):
        """Our trainer's MLM loss (dropout when ``dropout_rng`` is given) and metrics."""
        training = dropout_rng is not None
        loss, metrics = losses.mlm_loss_and_metrics(
            self.module,
            params,
            batch,
            rngs={"dropout": dropout_rng} if training else None,
            deterministic=not training,
        )
        return loss, _summary_metrics(loss, metrics, batch)

    # ------------------------------------------------------------ inference
    def predict_batch_with_aux(self, params, batch: Mapping[str, jax.Array], rng=None):
        """Fill-mask: ``inputs`` with every ``<mask>`` replaced by the model's top token.

        The LM head runs at the first ``P`` ``<mask>`` positions of each row (P: the
        slots of ``masking``, as in training); masks beyond those stay unfilled.

        Returns:
          ``(filled [batch, length], aux)``; ``aux['log_probs']`` [batch, length] is the
          log-probability of each filled-in token (0 where nothing was filled).
        """
        del rng
        inputs = jnp.asarray(batch["inputs"])
        masked = inputs == self.mask_id
        slots = min(inputs.shape[1], mlm.max_predictions(inputs.shape[1], self.masking.rate))
        # The masked positions first (stable: in order); the head runs only there.
        positions = jnp.argsort(~masked, axis=1, stable=True)[:, :slots].astype(jnp.int32)
        logits = self.module.apply(
            {"params": params}, inputs, mlm_positions=positions, deterministic=True
        )
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        best = jnp.argmax(log_probs, axis=-1).astype(inputs.dtype)
        best_lp = jnp.max(log_probs, axis=-1)
        is_mask = jnp.take_along_axis(masked, positions, axis=1)
        rows = jnp.arange(inputs.shape[0])[:, None]
        filled = inputs.at[rows, positions].set(jnp.where(is_mask, best, inputs[rows, positions]))
        scores = jnp.zeros(inputs.shape, jnp.float32).at[rows, positions].add(
            jnp.where(is_mask, best_lp, 0.0)
        )
        return filled, {"log_probs": scores}

    def score_batch(self, params, batch: Mapping[str, jax.Array],
                    return_intermediates: bool = False):
        """Sum over each row's selected positions of ``log p(original token | inputs)``.

        Returns:
          [batch] scores; with ``return_intermediates`` also
          ``{'mlm_log_probs': [batch, slots]}`` (0 in unused slots).
        """
        logits = self.module.apply(
            {"params": params}, batch["inputs"], mlm_positions=batch["mlm_positions"],
            deterministic=True,
        )
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        target_lp = jnp.take_along_axis(
            log_probs, batch["mlm_targets"][..., None].astype(jnp.int32), axis=-1
        )[..., 0]
        per_slot = target_lp * batch["mlm_weights"].astype(jnp.float32)
        scores = per_slot.sum(axis=-1)
        if return_intermediates:
            return scores, {"mlm_log_probs": per_slot}
        return scores


def _summary_metrics(loss, metrics: Mapping[str, jax.Array], batch) -> dict:
    """t5x metrics (clu) from our loss' metrics: averaged as t5x's base models do."""
    inputs = batch["inputs"]
    num_examples = jnp.array(inputs.shape[0])
    num_tokens = jnp.array(inputs.size)
    n = metrics["num_predictions"]
    return {
        "loss": t5x_metrics.AveragePerStep(total=loss),
        "accuracy": clu_metrics.Average(total=metrics["accuracy"] * n, count=n),
        "mlm/predictions_per_step": t5x_metrics.AveragePerStep(total=n),
        "timing/seqs_per_second": t5x_metrics.TimeRate.from_model_output(
            numerator=num_examples
        ),
        "timing/steps_per_second": t5x_metrics.StepsPerTime.from_model_output(),
        "timing/seconds": t5x_metrics.Time(),
        "timing/seqs": t5x_metrics.Sum(num_examples),
        "timing/tokens_per_second": t5x_metrics.TimeRate.from_model_output(
            numerator=num_tokens
        ),
    }


# ============================================================================
# Optimizer and partitioner for gin.
# ============================================================================


def adamw(config: optimizer.OptimizerConfig) -> t5x_optimizers.OptaxWrapper:
    """Our AdamW, clipping and learning-rate schedule (``optimizer.make_optimizer``)."""
    return t5x_optimizers.OptaxWrapper(optimizer.make_optimizer(config))


def learning_rate(config: optimizer.OptimizerConfig):
    """The schedule :func:`adamw` follows, for t5x's ``Trainer.learning_rate_fn`` (logged)."""
    return optimizer.learning_rate_schedule(config)


def logical_axis_rules(
    activation_partitioning_dims: int = 1, parameter_partitioning_dims: int = 1
) -> list:
    """t5x's standard rules plus the names only our network uses."""
    return t5x_partitioning.standard_logical_axis_rules(
        activation_partitioning_dims,
        parameter_partitioning_dims,
        additional_rules=ADDITIONAL_LOGICAL_AXIS_RULES,
    )


class MeshPartitioner(t5x_partitioning.PjitPartitioner):
    """``PjitPartitioner`` on an explicit ``(data, model)`` mesh of all devices.

    t5x derives its mesh from the accelerator topology (``num_partitions`` or
    ``model_parallel_submesh`` on TPU, NVLink on GPU) and on CPU puts each process's
    devices on ``model``. This partitioner lays the devices out as
    ``mesh_shape = (data, model)`` instead (one entry may be -1), on any backend;
    everything else (rules, data layout, pjit) is t5x's.
    """

    def __init__(self, mesh_shape: Sequence[int] = (-1, 1), **kwargs):
        shape = partitioning.resolve_shape(mesh_shape, ("data", "model"))
        self._mesh_shape = shape
        kwargs.setdefault("logical_axis_rules", logical_axis_rules())
        super().__init__(num_partitions=shape[1], **kwargs)

    @functools.cached_property
    def mesh(self) -> Mesh:
        devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
        return Mesh(np.asarray(devices, dtype=object).reshape(self._mesh_shape),
                    ("data", "model"))


# ============================================================================
# Trainer.
# ============================================================================


class MaskedLMTrainer(t5x_trainer.Trainer):
    """t5x's ``Trainer``; with ``num_microbatches`` > 1 the batch-mean loss stays exact.

    t5x accumulates microbatches by summing the gradients of ``model.loss_fn`` on
    each, i.e. of each microbatch's own mean: the loss would then be a mean of
    microbatch means, and its scale would grow with the number of microbatches.
    This trainer accumulates as our trainer's step does
    (``step.accumulated_grads``): the gradients of the microbatches' summed
    cross-entropy, divided once by the masked tokens of the whole batch, with
    dropout from ``fold_in(step rng, i)`` for microbatch ``i``. The update is then
    t5x's (``trainer.apply_grads``). Without microbatches it is t5x's ``Trainer``
    unchanged. The train step is built where t5x's trainers build theirs (t5x's own
    MoE trainer overrides the same method).
    """

    def __init__(self, model: MaskedLMModel, train_state, partitioner, eval_names,
                 summary_dir, train_state_axes, rng, learning_rate_fn, num_microbatches,
                 weight_metrics_computer=None):
        """Args: those of ``t5x.trainer.Trainer``; ``model`` is a :class:`MaskedLMModel`."""
        if not isinstance(model, MaskedLMModel):
            raise TypeError(f"MaskedLMTrainer trains a MaskedLMModel, got {type(model).__name__}")
        super().__init__(
            model=model, train_state=train_state, partitioner=partitioner,
            eval_names=eval_names, summary_dir=summary_dir, train_state_axes=train_state_axes,
            rng=rng, learning_rate_fn=learning_rate_fn, num_microbatches=num_microbatches,
            weight_metrics_computer=weight_metrics_computer,
        )
        # Our own references to what the accumulated step needs.
        self.mlm_model = model
        self.microbatches = step.check_microbatches(num_microbatches or 1)
        self.mlm_partitioner = partitioner
        self.mlm_state_axes = train_state_axes
        self.mlm_rng = rng
        self.mlm_learning_rate_fn = learning_rate_fn
        self.mlm_weight_metrics = weight_metrics_computer

    @functools.cached_property
    def _partitioned_train_step(self):
        if self.microbatches == 1:
            return super()._partitioned_train_step
        module = self.mlm_model.module
        partitioner = self.mlm_partitioner
        rows = jax.sharding.NamedSharding(partitioner.mesh, partitioner.data_partition_spec)

        def sums_fn(params, batch, key):
            return losses.mlm_sums(module, params, batch, rngs={"dropout": key},
                                   deterministic=False)

        def train_step(train_state, batch):
            # t5x's step rng (BaseTrainer: fold_in(rng, step)).
            dropout_rng = jax.random.fold_in(self.mlm_rng, train_state.step)
            grads, sums = step.accumulated_grads(
                sums_fn, train_state.params, batch, dropout_rng,
                microbatches=self.microbatches, rows_sharding=rows)
            loss, metrics = losses.loss_from_sums(*sums)
            return t5x_trainer.apply_grads(
                train_state, grads, _summary_metrics(loss, metrics, batch),
                self.mlm_learning_rate_fn(train_state.step), self.mlm_weight_metrics)

        return partitioner.partition(
            train_step,
            in_axis_resources=(self.mlm_state_axes, partitioner.data_partition_spec),
            out_axis_resources=(self.mlm_state_axes, None),
            donate_argnums=(0,),
        )
