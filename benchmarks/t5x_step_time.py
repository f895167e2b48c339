r"""Training step time under t5x's trainer against our own: same model, batch and devices.

  python -m benchmarks.t5x_step_time --size=small --batch=32 --length=128

Both sides train the same encoder (``network.get_config(size)``), AdamW and masked-LM
loss on the same synthetic batch, data-parallel over every device: ours through
``step.make_step_functions``' jitted step, t5x's through ``t5x.trainer.Trainer.train``
(its step plus its per-step metric bookkeeping, as ``python -m t5x.train`` runs it).
After compiling, blocks of ``--steps`` steps alternate between the two in one process,
so that load on the machine weighs on both alike; the median block gives ms/step.
Prints both and the ratio t5x / ours.
"""

from __future__ import annotations

import statistics
import time

import jax
import numpy as np
from jax.sharding import NamedSharding

from xlmeta_jax import errors
from xlmeta_jax.data import feeding
from xlmeta_jax.interop.t5x import model as t5x_model
from xlmeta_jax.model import mlm, network, partitioning
from xlmeta_jax.model.optimizer import OptimizerConfig
from xlmeta_jax.pretrain import step


def measure(size: str, batch: int, length: int, steps: int, rounds: int,
            dtype: str | None = None) -> dict:
    """Median ms/step of both trainers; see the module docstring."""
    from t5x import trainer as t5x_trainer  # noqa: PLC0415 - optional: t5x only for this
    from t5x import utils as t5x_utils  # noqa: PLC0415 - optional: t5x only for this

    overrides = {"dtype": dtype} if dtype else {}
    cfg = network.get_config(size, pad_token_id=0, **overrides)
    opt = OptimizerConfig(total_steps=1_000_000, warmup_steps=10)
    host = feeding.mlm_batch(np.random.default_rng(0), batch, length, cfg.vocab_size)
    host = {k: host[k] for k in mlm.STEP_FEATURES}

    # Ours.
    mesh = partitioning.create_mesh(data=-1)
    fns = step.make_step_functions(cfg, opt, mesh)
    ours_batch = jax.device_put(host, fns.batch_sharding)
    state = fns.init(jax.random.key(0))

    # t5x's.
    model = t5x_model.MaskedLMModel(cfg, t5x_model.adamw(opt))
    partitioner = t5x_model.MeshPartitioner(mesh_shape=(-1, 1))
    shapes = {k: v.shape for k, v in host.items()}
    types = {k: v.dtype for k, v in host.items()}
    init = t5x_utils.TrainStateInitializer(
        model.optimizer_def, model.get_initial_variables, shapes, partitioner, types)
    trainer = t5x_trainer.Trainer(
        model, init.from_scratch(jax.random.PRNGKey(0)), partitioner, eval_names=[],
        summary_dir=None, train_state_axes=init.train_state_axes, rng=jax.random.PRNGKey(1),
        learning_rate_fn=t5x_model.learning_rate(opt), num_microbatches=None)
    t5x_batch = jax.device_put(
        host, NamedSharding(partitioner.mesh, partitioner.data_partition_spec))

    done = {"ours": 0, "t5x": 0}

    def run_ours(n):
        nonlocal state
        for _ in range(n):
            state, metrics = fns.train_step_jit(state, ours_batch, fns.seed_arg())
        jax.block_until_ready((state, metrics))

    def run_t5x(n):
        summary = trainer.train(iter([t5x_batch] * n), n, start_step=done["t5x"])
        summary.result()
        jax.block_until_ready(trainer.train_state.params)

    runners = {"ours": run_ours, "t5x": run_t5x}
    times = {"ours": [], "t5x": []}
    for name, run in runners.items():  # compile and warm up
        run(2)
        done[name] += 2
    for _ in range(rounds):
        for name, run in runners.items():
            start = time.perf_counter()
            run(steps)
            times[name].append((time.perf_counter() - start) / steps * 1e3)
            done[name] += steps
    ms = {name: statistics.median(t) for name, t in times.items()}
    return {
        "size": size, "batch": batch, "length": length, "devices": jax.device_count(),
        "backend": jax.default_backend(), "ms_per_step": ms,
        "ratio_t5x_over_ours": ms["t5x"] / ms["ours"], "blocks": times,
    }


def main(argv=None) -> dict:
    """Command line; prints the report."""
    parser = errors.ArgumentParser(prog="benchmarks.t5x_step_time",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="small", help="network.get_config size")
    parser.add_argument("--batch", type=int, default=32, help="global batch (sequences)")
    parser.add_argument("--length", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=5, help="timed blocks per trainer")
    parser.add_argument("--dtype", default=None, help="activation dtype (default: the size's)")
    args = parser.parse_args(argv)
    try:
        import t5x.trainer  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"t5x_step_time needs t5x ({e.name} is missing); "
                         "see docs/t5x.md") from None
    report = measure(args.size, args.batch, args.length, args.steps, args.rounds, args.dtype)
    ms = report["ms_per_step"]
    print(f"{report['size']} model, batch {report['batch']} x {report['length']} tokens, "
          f"{report['devices']} {report['backend']} device(s): ours {ms['ours']:.1f} ms/step, "
          f"t5x {ms['t5x']:.1f} ms/step, t5x / ours = {report['ratio_t5x_over_ours']:.3f}")
    return report


if __name__ == "__main__":
    errors.exit_with(main, prog="benchmarks.t5x_step_time")
