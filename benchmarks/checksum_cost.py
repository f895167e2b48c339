"""What the checkpoint checksums cost: a save and a read with and without them, in one process.

    python -m benchmarks.checksum_cost --gin_file=models/small.gin --repeats=3

Builds the trainer's train state of the model (parameters, AdamW moments, step) on this
host's devices, then times each of these ``--repeats`` times (the median is printed):

* ``save``: :meth:`PhaseCheckpoints.save` and ``wait``, the record of checksums included;
* ``record``: :func:`checksums.record` alone, what a save adds;
* ``read``: :func:`checkpoints.restore_items` of every entry, verification included;
* ``verify``: :func:`checksums.damaged` on the restored state alone, what a read adds;

and prints ``record / save`` and ``verify / read``: the checksums' share of a save and of
a read on the same machine.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time

import jax

from xlmeta_jax import errors
from xlmeta_jax.model import partitioning
from xlmeta_jax.model.optimizer import OptimizerConfig
from xlmeta_jax.pretrain import checkpoints, checksums, step
from xlmeta_jax.tools import bench


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(cfg, *, repeats: int, work_dir: str) -> dict:
    """Times save, record, read and verify of the train state of ``cfg``."""
    mesh = partitioning.create_mesh(-1, 1, 1)
    fns = step.make_step_functions(cfg, OptimizerConfig(warmup_steps=1, total_steps=10), mesh)
    state = jax.block_until_ready(fns.init(jax.random.key(0)))
    entries = {"params": state.params, "opt_state": state.opt_state, "step": state.step}
    n_values = sum(x.size for x in jax.tree.leaves(entries))
    nbytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(entries))
    record = checksums.record(state)  # compiles the checksum program once, untimed

    saved = [0]

    def save():
        ckpt = checkpoints.PhaseCheckpoints(f"{work_dir}/phase", save_interval_steps=1,
                                            max_to_keep=1, async_save=False)
        saved[0] += 1
        ckpt.save(saved[0], state, None, {}, force=True)
        ckpt.wait()
        ckpt.close()

    out = {"values": n_values, "bytes": nbytes}
    out["save"] = _median_seconds(save, repeats)
    out["record"] = _median_seconds(lambda: checksums.record(state), repeats)
    last = f"{work_dir}/phase/{saved[0]}"
    abstract = {k: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                               sharding=x.sharding), v)
                for k, v in entries.items()}
    restored = checkpoints.restore_items(last, abstract)
    out["read"] = _median_seconds(lambda: checkpoints.restore_items(last, abstract), repeats)
    assert checksums.damaged(record, restored) == []
    out["verify"] = _median_seconds(lambda: checksums.damaged(record, restored), repeats)
    return out


def format_report(cfg, r: dict) -> str:
    return "\n".join([
        f"model: {cfg.num_layers} layers x {cfg.hidden_size}, vocab {cfg.vocab_size}; train "
        f"state {r['values'] / 1e6:.1f}M values, {r['bytes'] / 2**20:.0f} MiB; "
        f"{jax.device_count()} x {jax.devices()[0].platform}",
        f"  save   {r['save']:8.3f} s   record  {r['record']:8.3f} s   "
        f"record / save  {r['record'] / r['save']:6.1%}",
        f"  read   {r['read']:8.3f} s   verify  {r['verify']:8.3f} s   "
        f"verify / read  {r['verify'] / r['read']:6.1%}",
    ])


def main(argv: list[str] | None = None) -> dict:
    """Entry point of ``python -m benchmarks.checksum_cost``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    flags = bench._gin_cli().parse_gin_flags(argv)
    parser = errors.ArgumentParser(
        prog="python -m benchmarks.checksum_cost",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Time a checkpoint's save and read with the checksums' share of each.",
        epilog="example: python -m benchmarks.checksum_cost "
               "--gin_file=models/small.gin --repeats=3",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (median)")
    parser.add_argument("--work_dir", default=None,
                        help="where the checkpoints are written (default: a temporary folder)")
    errors.add_debug_flag(parser)
    args = parser.parse_args(flags.remaining)
    cfg = bench.model_from_gin(flags.gin_files, flags.bindings, flags.search_paths)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="checksum_cost.")
    try:
        r = measure(cfg, repeats=args.repeats, work_dir=work_dir)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work_dir, ignore_errors=True)
    print(format_report(cfg, r))
    return r


if __name__ == "__main__":
    errors.exit_with(main, prog="benchmarks.checksum_cost")
