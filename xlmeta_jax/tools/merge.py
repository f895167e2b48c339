"""``python -m xlmeta_jax.tools.merge``: merge checkpoints of one model (linear or TIES).

  python -m xlmeta_jax.tools.merge --checkpoints=runs/a/stage3,runs/b/stage3 \\
    --method=ties --base=runs/a/stage2 --density=0.2 --output=runs/merged

Each path is a MODEL_DIR, a phase directory or a step directory, as fine-tuning takes
them. The output is a parameters checkpoint (a phase directory with step 0, with
checksums) that ``python -m xlmeta_jax.finetune``, ``python -m xlmeta_jax.hf to_hf`` and
the trainer's INITIAL_CHECKPOINT_PATH read. The merge: :mod:`xlmeta_jax.pretrain.merging`.
"""

from __future__ import annotations

from xlmeta_jax import errors, files
from xlmeta_jax.pretrain import merging


def _parser():
    p = errors.ArgumentParser(prog="python -m xlmeta_jax.tools.merge",
                              description="Merge checkpoints of one model: linear averaging "
                              "or TIES merging (Yadav et al., 2023) against a base.")
    p.add_argument("--checkpoints", required=True,
                   help="two or more checkpoints, separated by commas")
    p.add_argument("--method", default="linear", help=f"one of {merging.METHODS}")
    p.add_argument("--base", default=None, type=files.path_flag("--base"),
                   help="ties: the checkpoint task vectors are "
                   "taken against")
    p.add_argument("--density", type=float, default=None,
                   help="ties: share of each task vector's largest magnitudes kept (0.2)")
    p.add_argument("--scaling", type=float, default=None,
                   help="ties: factor of the merged task vector (lambda; 1)")
    p.add_argument("--trim", default=None,
                   help="ties: 'model' (default): the TIES authors' code, bit for bit: each "
                   "model's whole task vector keeps its density share of largest magnitudes; "
                   "'tensor': mergekit's ties: each tensor keeps exactly int(density x size) "
                   "entries per model, a zero sign sum elects +, and --weights weight the "
                   "task vectors")
    p.add_argument("--weights", default=None,
                   help="linear, and ties with --trim=tensor: one weight per checkpoint, "
                   "separated by commas")
    p.add_argument("--output", required=True, type=files.path_flag("--output"),
                   help="a new folder for the merged checkpoint")
    errors.add_debug_flag(p)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m xlmeta_jax.tools.merge``."""
    args = _parser().parse_args(argv)
    paths = [files.user_path(p, "--checkpoints") for p in args.checkpoints.split(",") if p]
    weights = None
    if args.weights:
        try:
            weights = [float(w) for w in args.weights.split(",")]
        except ValueError:
            raise merging.MergeError(f"--weights={args.weights!r} is not a list of numbers "
                                     "separated by commas") from None
    out = merging.merge(paths, args.output, method=args.method, base=args.base,
                        density=args.density, scaling=args.scaling, weights=weights,
                        trim=args.trim)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    errors.exit_with(main, prog="xlmeta_jax.tools.merge")
