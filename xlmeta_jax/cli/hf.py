"""``python -m xlmeta_jax.hf``: Hugging Face weights to and from our checkpoints.

``to_hf`` writes a ``transformers`` folder of either family (XLM-R or ModernBERT:
config.json, model.safetensors, the tokenizer) from a pretraining checkpoint; ``to_flax``
reads one (safetensors, or a PyTorch pickle with ``--allow_pickle``) into a parameters
checkpoint that fine-tuning and pretraining take as ``init``. Both print the parity line
of the two networks on the converted weights. The conversion itself:
:mod:`xlmeta_jax.interop.hf.convert`.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from xlmeta_jax import errors, files
from xlmeta_jax.interop.hf.convert import to_flax, to_hf
from xlmeta_jax.pretrain import loading


def _help_epilog(subparsers: Mapping[str, argparse.ArgumentParser]) -> str:
    """Every sub-command's flags in the top-level ``--help`` (argparse lists only names)."""
    parts = [f"--- {name} ---\n{p.format_help()}" for name, p in subparsers.items()]
    parts.append(
        "examples:\n"
        "  python -m xlmeta_jax.hf to_flax --hf_path=xlm-roberta-base_dir --output=runs/xlmr_flax\n"
        "  python -m xlmeta_jax.hf to_hf --checkpoint=runs/demo --output=runs/demo_hf\n"
        "(no gin files; --debug shows the traceback of an error)"
    )
    return "\n".join(parts)


def _parser() -> argparse.ArgumentParser:
    parser = errors.ArgumentParser(
        prog="python -m xlmeta_jax.hf",
        description="Convert XLM-R masked-LM weights between Hugging Face and xlmeta_jax.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = to_flax_parser = sub.add_parser("to_flax",
                                        help="HF save_pretrained dir -> our checkpoint (Orbax)")
    p.add_argument("--hf_path", required=True, type=files.path_flag("--hf_path"),
                   help="save_pretrained dir or weights file")
    p.add_argument("--output", required=True, type=files.path_flag("--output"),
                   help="new output dir: a phase directory with step 0, as the trainer writes")
    p.add_argument("--scan_layers", action="store_true",
                   help="write the scanned layout (one 'layers' subtree with a layer axis)")
    p.add_argument("--allow_pickle", action="store_true",
                   help="permit pytorch_model.bin (pickle) weights; only for trusted files")
    p = to_hf_parser = sub.add_parser("to_hf", help="our checkpoint -> HF save_pretrained dir")
    p.add_argument("--checkpoint", required=True, type=files.path_flag("--checkpoint"),
                   help="dir written by to_flax, or a pretraining MODEL_DIR / phase / step dir "
                   "(a MODEL_DIR: its last phase's final step; the step exported is printed)")
    p.add_argument("--output", required=True, type=files.path_flag("--output"),
                   help="new output dir (config.json, model.safetensors, tokenizer files)")
    p.add_argument("--vocab_path", default=None, type=files.path_flag("--vocab_path"),
                   help="the model's SentencePiece .model (default: the one the checkpoint "
                   "records)")
    for p in (to_flax_parser, to_hf_parser):
        errors.add_debug_flag(p)
    parser.epilog = _help_epilog({"to_flax": to_flax_parser, "to_hf": to_hf_parser})
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m xlmeta_jax.hf``."""
    args = _parser().parse_args(argv)
    if args.command == "to_flax":
        out = to_flax(args.hf_path, args.output, scan_layers=args.scan_layers, report=print,
                      allow_pickle=args.allow_pickle)
    else:
        # A MODEL_DIR or phase names no step: say which one is exported.
        print(f"exporting {loading.find_step_dir(args.checkpoint)}")
        out = to_hf(args.checkpoint, args.output, vocab_path=args.vocab_path, report=print)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    errors.exit_with(main, prog="xlmeta_jax.hf")
