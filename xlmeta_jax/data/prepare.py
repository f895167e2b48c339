"""CC-100's ``{lang}.txt.xz`` files to a folder a pod trains on, as one Apache Beam job.

::

  python -m xlmeta_jax.data.prepare --input='/data/cc100-xz/*.txt.xz' --output=/data/cc100 \\
      [--shard_bytes=N] [--vocab_sample_lines=N --alpha=A --seed=S] \\
      [--tokenize --vocab=PATH] [Beam options: --runner, --direct_num_workers, ...]
  # later, once the vocabulary is trained on the sample: the token cache alone
  python -m xlmeta_jax.data.prepare --output=/data/cc100 --tokenize --vocab=PATH

Each input file is read once by one worker (``.xz``, ``.gz`` or plain, local or any
file system Beam reads, ``gs://`` included), split into document-whole gzip shards
(:mod:`xlmeta_jax.data.shards`) and counted on the way. Per language the shards are
then numbered ``{lang}.txt-00000-of-000NN.gz`` (the CC-100 task's ``{lang}.txt*``),
and one worker writes ``xlmeta_corpus_stats.json``: the counts ``corpus_stats``
caches, marked as prepared, so that no host of a pod ever counts. With
``--vocab_sample_lines`` the vocabulary's alpha-sampled line sample is drawn from the
shards (the same per-language draws and lines as ``data/line_sample.py``); with
``--tokenize`` a second job writes seqio's offline token cache of the languages'
tasks (``seqio.beam_utils``), read by ``make_mlm_iterator.use_cached``. ``COMPLETED``
is written once the shards and statistics are: readers trust a folder only with it
(each task's cache has its own). A failed job removes what it wrote, and an
``--overwrite`` builds the new folder beside the old one (``OUT.prepare-new``), which
it replaces only once complete: nothing of the old folder is lost on a failure or a
Ctrl-C. The folder layout: :mod:`xlmeta_jax.data.prepared`.

Beam's own options pass through unchanged: ``--runner=DataflowRunner --project=...
--region=... --temp_location=gs://... --setup_file=./setup.py`` (workers install
this package), ``--runner=FlinkRunner``, ``--direct_num_workers=2
--direct_running_mode=multi_processing`` on one machine.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import functools
import gzip
import json
import logging
import os
import sys
import time
from collections.abc import Sequence

from xlmeta_jax import errors, files, logs
from xlmeta_jax.data import (
    beam_runs,
    folders,
    line_sample,
    prepared,
    rates,
    shards,
    text_files,
    token_cache,
    vocabulary,
)
from xlmeta_jax.data import task_names as names
from xlmeta_jax.data.corpora import Corpora
from xlmeta_jax.data.languages import check_languages

log = logging.getLogger("xlmeta_jax.prepare")

DEFAULT_SHARD_BYTES = 256 << 20


@dataclasses.dataclass(frozen=True)
class Plan:
    """One prepare job, checked: every setting and every input file is known good."""

    inputs: tuple[tuple[int, str, str], ...]  # (index, language, path), sorted by path
    output: str
    shard_bytes: int = DEFAULT_SHARD_BYTES
    max_line_bytes: int = text_files.DEFAULT_MAX_LINE_BYTES
    gzip_level: int = 1
    token_sample_lines: int = 2000
    vocab_sample_lines: int = 0
    alpha: float = 0.3
    seed: int = 0
    vocab: str | None = None
    eos_after: str = "line"
    # Only the token cache, of a folder an earlier job prepared (no --input).
    cache_only: tuple[str, ...] = ()

    @property
    def languages(self) -> list[str]:
        return sorted(self.cache_only or {lang for _, lang, _ in self.inputs})

    @property
    def temp(self) -> str:
        return folders.join(self.output, prepared.TEMP_DIR)


# --------------------------------------------------------------------------- files


# --------------------------------------------------------------------------- the plan


def _expand(patterns: Sequence[str]) -> list[str]:
    paths = []
    for pattern in patterns:
        matched = sorted(m.path for m in folders.fs().match([pattern])[0].metadata_list)
        if "://" not in pattern:
            matched = [os.path.abspath(p) for p in matched if os.path.isfile(p)]
        if not matched:
            raise text_files.CorpusError(f"--input {pattern!r} matches no file")
        paths.extend(matched)
    return sorted(set(paths))


def _output_folder(args: argparse.Namespace) -> str:
    return args.output.rstrip("/") if "://" in args.output else os.path.abspath(args.output)


def _wanted_languages(args: argparse.Namespace) -> tuple[str, ...] | None:
    """--languages, checked (None: every input's)."""
    if not args.languages:
        return None
    return check_languages([s for s in args.languages.split(",") if s], what="--languages")


def make_plan(args: argparse.Namespace) -> Plan:
    """Checks every setting and input before any work; returns the job.

    Raises:
      UserError: naming the flag, file or language that is wrong.
    """
    for flag, ok, rule in (
        ("shard_bytes", args.shard_bytes > 0, "> 0"),
        ("max_line_bytes", args.max_line_bytes > 0, "> 0"),
        ("gzip_level", 1 <= args.gzip_level <= 9, "in 1..9"),
        ("token_sample_lines", args.token_sample_lines > 0, "> 0"),
        ("vocab_sample_lines", args.vocab_sample_lines >= 0, ">= 0"),
    ):
        if not ok:
            raise errors.UsageError(f"--{flag} must be {rule}, got {getattr(args, flag)}")
    if args.vocab_sample_lines:
        rates.check_alpha(args.alpha)
    if args.tokenize and not args.vocab:
        raise errors.UsageError("--tokenize needs --vocab=PATH (the SentencePiece .model)")
    if args.vocab and not args.tokenize:
        raise errors.UsageError("--vocab is read by --tokenize only; add --tokenize")
    if args.tokenize:
        vocabulary.load_vocabulary(args.vocab)
    if not args.input:
        return _cache_only_plan(args)
    paths = _expand(args.input)
    wanted = _wanted_languages(args)
    inputs = []
    for path in paths:
        lang = shards.language_of(path)
        if wanted is None or lang in wanted:
            with folders.open_read(path) as f:
                shards.check_header(path, f.read(len(shards.XZ_MAGIC)))
            inputs.append((len(inputs), lang, path))
    if not inputs:
        raise text_files.CorpusError(f"--input matches no file of --languages={args.languages}")
    _check_one_copy(inputs)
    if wanted is not None:
        missing = sorted(set(wanted) - {lang for _, lang, _ in inputs})
        if missing:
            raise text_files.CorpusError(f"--languages: no input file for {missing}")
    if args.vocab_sample_lines and args.vocab_sample_lines < len({i[1] for i in inputs}):
        raise errors.UsageError(f"--vocab_sample_lines={args.vocab_sample_lines} is fewer "
                                f"than the {len({i[1] for i in inputs})} languages")
    output = _output_folder(args)
    if "://" not in output and os.path.exists(output) and not os.path.isdir(output):
        raise errors.UsageError(f"--output {output} is a file, not a folder")
    present = folders.entries(output)
    if present and not args.overwrite:
        raise errors.UsageError(f"--output {output} is not empty ({len(present)} entries, e.g. "
                                f"{present[0]}): choose an empty folder or pass --overwrite")
    foreign = [name for name in present if not prepared.is_own_entry(name)]
    if foreign:
        raise errors.UsageError(f"--output {output} holds files this command did not write "
                                f"(e.g. {foreign[0]}); --overwrite replaces only its own "
                                "output: choose an empty folder")
    if any(p.startswith(output.rstrip("/") + "/") for p in paths):
        raise errors.UsageError(f"--output {output} holds input files: choose another folder")
    if present:
        _check_leftovers(output)
    return Plan(inputs=tuple(inputs), output=output, shard_bytes=args.shard_bytes,
                max_line_bytes=args.max_line_bytes, gzip_level=args.gzip_level,
                token_sample_lines=args.token_sample_lines,
                vocab_sample_lines=args.vocab_sample_lines, alpha=args.alpha, seed=args.seed,
                vocab=args.vocab, eos_after=args.eos_after)


def _check_leftovers(output: str) -> None:
    """Before an ``--overwrite``: refuses to start where a killed one left the old entries
    aside, or where there is no "beside" (a bucket's root).

    ``OUT.prepare-new`` (a new folder not swapped in) is the job's own and is replaced;
    ``OUT.prepare-old`` holds the old entries only while a swap runs: found with OUT
    complete it is removed, found with OUT incomplete it is the user's data.
    """
    if "://" in output and "/" not in output.split("://", 1)[1].strip("/"):
        raise errors.UsageError(f"--output {output} is a bucket's root: --overwrite builds the "
                                "new folder beside the old one; choose a folder in the bucket")
    for suffix in (prepared.NEW_SUFFIX, prepared.OLD_SUFFIX):
        foreign = [n for n in folders.entries(output + suffix) if not prepared.is_own_entry(n)]
        if foreign:
            raise errors.UsageError(f"{output + suffix} holds files this command did not "
                                    f"write (e.g. {foreign[0]}): move it away")
    old = output + prepared.OLD_SUFFIX
    if folders.entries(old) and prepared.COMPLETED not in folders.entries(output):
        raise errors.UsageError(f"{old} holds the entries of {output} that an interrupted "
                                f"--overwrite moved aside: move them back into {output} (or "
                                "remove them), then run again")


def _check_one_copy(inputs: Sequence[tuple[int, str, str]]) -> None:
    """Refuses one text given twice (``en.txt.xz`` and its decompressed ``en.txt``, or one
    name in two folders): its language would be read twice. Parts of one language under
    other names (``sw.txt.0.xz``, ``sw.txt.1.xz``) are read in name order."""
    seen: dict[str, str] = {}
    for _, _, path in inputs:
        name = os.path.basename(path)
        for suffix in (".xz", ".gz"):
            name = name.removesuffix(suffix)
        if name in seen:
            raise text_files.CorpusError(
                f"--input gives {name.partition('.txt')[0]!r} twice: {seen[name]} and {path} "
                "hold the same text (one compressed, one not, or one name in two folders): "
                "keep one")
        seen[name] = path


def _cache_only_plan(args: argparse.Namespace) -> Plan:
    """``--tokenize`` without ``--input``: the token cache of a folder already prepared."""
    if not args.tokenize:
        raise errors.UsageError("--input is required (without it, --tokenize --vocab=PATH adds "
                                "the token cache to a folder prepared before)")
    if args.vocab_sample_lines:
        raise errors.UsageError("--vocab_sample_lines draws its sample while --input is cut "
                                "into shards: give --input")
    output = _output_folder(args)
    stats = prepared.read_stats(output)
    if stats is None:
        raise errors.UsageError(f"--output {output} is not a folder this command prepared "
                                f"(no {prepared.COMPLETED} and statistics): give --input")
    held = sorted(stats["languages"])
    wanted = _wanted_languages(args)
    if wanted is not None:
        missing = sorted(set(wanted) - set(held))
        if missing:
            raise text_files.CorpusError(f"--languages: {output} holds no shards of {missing}")
        held = sorted(wanted)
    if (prepared.OLD_CACHE_DIR in folders.entries(output)
            and prepared.CACHE_DIR not in folders.entries(output)):
        old = folders.join(output, prepared.OLD_CACHE_DIR)
        raise errors.UsageError(f"{old} holds the token cache "
                                "an interrupted --overwrite moved aside: rename it back to "
                                f"{prepared.CACHE_DIR} (or remove it), then run again")
    if prepared.CACHE_DIR in folders.entries(output) and not args.overwrite:
        raise errors.UsageError(f"--output {output} holds a token cache already "
                                f"({prepared.CACHE_DIR}/): pass --overwrite to replace it")
    return Plan(inputs=(), output=output, max_line_bytes=stats["max_line_bytes"],
                vocab=args.vocab, eos_after=args.eos_after, cache_only=tuple(held))


# --------------------------------------------------------------------------- the job


class _Split:
    """Reads one input file into temporary shards (a Beam DoFn's body, see build())."""

    def __init__(self, plan: Plan):
        self.plan = plan

    def __call__(self, item):
        from apache_beam import metrics  # noqa: PLC0415 - the beam extra

        index, lang, path = item
        plan = self.plan
        try:
            counts, pieces = shards.split_file(
                path, folders.open_read, folders.open_write,
                folders.join(plan.temp, f"{lang}-{index:05d}"),
                shard_bytes=plan.shard_bytes, max_line_bytes=plan.max_line_bytes,
                gzip_level=plan.gzip_level, head_lines=plan.token_sample_lines)
            text_files.check_usable(path, counts.lines, counts.skipped_invalid_utf8,
                                    counts.skipped_long_lines, plan.max_line_bytes)
        except text_files.CorpusError as e:
            raise beam_runs.input_error(e) from None
        for name, value in (("text_bytes", counts.text_bytes), ("lines", counts.lines),
                            ("documents", counts.documents), ("files", 1)):
            metrics.Metrics.counter("prepare", name).inc(value)
        yield lang, (index, path, dataclasses.asdict(counts),
                     [(p.path, dataclasses.asdict(p.counts), p.head) for p in pieces])


def _finalize(item, plan: Plan):
    """Numbers one language's shards, records their counts and the token sample."""
    lang, results = item
    results = sorted(results)
    pieces = [piece for _, _, _, file_pieces in results for piece in file_pieces]
    total = shards.Counts()
    for _, _, counts, _ in results:
        total.add(shards.Counts(**counts))
    files, listing, offset = {}, [], 0
    for k, (temp, counts, _) in enumerate(pieces):
        final = folders.join(plan.output, prepared.shard_name(lang, k, len(pieces)))
        folders.fs().rename([temp], [final])
        size, mtime_ns = text_files.stat(final)
        files[os.path.basename(final)] = {
            "size": size, "mtime_ns": mtime_ns, "max_line_bytes": plan.max_line_bytes,
            **counts}
        listing.append((final, offset, counts["lines"]))
        offset += counts["lines"]
    per_file = line_sample.sample_lines_per_file(plan.token_sample_lines, len(pieces))
    sample = [line for _, _, head in pieces for line in head[:per_file]]
    sample_path = folders.join(plan.output, prepared.TOKEN_SAMPLE_DIR, f"{lang}.json")
    folders.write_text(sample_path, json.dumps({
        "sample_lines": plan.token_sample_lines, "max_line_bytes": plan.max_line_bytes,
        "lines": sample}, ensure_ascii=False))
    language = {**dataclasses.asdict(total), "files": len(pieces),
                "inputs": [path for _, path, _, _ in results]}
    return {"lang": lang, "files": files, "language": language, "listing": listing}


def _write_stats(finals: list[dict], plan: Plan) -> None:
    finals = sorted(finals, key=lambda r: r["lang"])
    payload = {
        "version": 1,
        "files": {name: entry for r in finals for name, entry in sorted(r["files"].items())},
        text_files.PREPARED_KEY: {
            "languages": {r["lang"]: r["language"] for r in finals},
            "max_line_bytes": plan.max_line_bytes,
            "shard_bytes": plan.shard_bytes,
            "token_sample_lines": plan.token_sample_lines,
            "created_by": "python -m xlmeta_jax.data.prepare",
        },
    }
    folders.write_text(folders.join(plan.output, prepared.STATS_FILENAME),
                json.dumps(payload, indent=1, sort_keys=True))


def _draws(finals: list[dict], plan: Plan) -> dict:
    """line_sample's per-language draws from the prepared counts: (repeats, chosen indices)."""
    counts = {r["lang"]: r["language"]["lines"] for r in finals}
    q, out = line_sample.draw(counts, num_lines=plan.vocab_sample_lines, alpha=plan.alpha,
                              seed=plan.seed)
    meta = {"q": q, "counts": counts, "draws": {k: v[2] for k, v in out.items()},
            "alpha": plan.alpha, "seed": plan.seed, "num_lines": plan.vocab_sample_lines}
    folders.write_text(
        folders.join(plan.output, prepared.VOCAB_SAMPLE_DIR, prepared.VOCAB_SAMPLE_META),
                json.dumps(meta, indent=1, sort_keys=True))
    return {lang: (repeats, chosen.tolist()) for lang, (repeats, chosen, _) in out.items()}


def _pick(job, draws):
    """The sampled lines of one shard: (lang, (index in the language, line, times))."""
    lang, path, offset, n = job
    repeats, chosen = draws[lang]
    lo, hi = bisect.bisect_left(chosen, offset), bisect.bisect_left(chosen, offset + n)
    picked = set(chosen[lo:hi])
    lines = []
    if repeats or picked:
        with folders.open_read(path) as raw:
            data = gzip.GzipFile(fileobj=raw).read()
        # A shard holds kept paragraphs and the blank lines between documents only.
        lines = [line for line in data.split(b"\n") if line]
    for i, line in enumerate(lines):
        times = repeats + (offset + i in picked)
        if times:
            yield lang, (offset + i, line.decode("utf-8"), times)


def _write_sample(item, plan: Plan) -> None:
    lang, picked = item
    text = "".join((line + "\n") * times for _, line, times in sorted(picked))
    folders.write_text(folders.join(plan.output, prepared.VOCAB_SAMPLE_DIR, f"{lang}.txt"), text)


def build(pipeline, plan: Plan) -> None:
    """Adds the job's transforms to a ``beam.Pipeline``."""
    import apache_beam as beam  # noqa: PLC0415 - the beam extra

    split = (pipeline
             | "inputs" >> beam.Create(list(plan.inputs))
             # One worker per input file: the files are spread before the reading starts.
             | "spread" >> beam.Reshuffle()
             | "split" >> beam.FlatMap(_Split(plan)))
    finals = (split
              | "by_language" >> beam.GroupByKey()
              | "finalize" >> beam.Map(_finalize, plan=plan))
    everything = finals | "all_languages" >> beam.combiners.ToList()
    _ = everything | "write_stats" >> beam.Map(_write_stats, plan=plan)
    if plan.vocab_sample_lines:
        draws = everything | "draw" >> beam.Map(_draws, plan=plan)
        _ = (finals
             | "shards" >> beam.FlatMap(
                 lambda r: [(r["lang"], *entry) for entry in r["listing"]])
             | "spread_shards" >> beam.Reshuffle()
             | "pick" >> beam.FlatMap(_pick, draws=beam.pvalue.AsSingleton(draws))
             | "sample_by_language" >> beam.GroupByKey()
             | "write_sample" >> beam.Map(_write_sample, plan=plan))


def run(plan: Plan, beam_args: Sequence[str] = ()) -> dict:
    """Runs the job (and the token cache's with ``plan.vocab``); returns what it wrote.

    Nothing of an earlier output is lost on a failure: where ``plan.output`` holds one
    (``--overwrite``), the job writes beside it (``OUT.prepare-new``) and the new entries
    replace the old ones only once the new folder is complete (``folders.replace``). On any
    failure, Ctrl-C included, what the job wrote is removed (and the folder, where the
    job made it) and the old output is as it was. With ``plan.cache_only`` it writes the
    token cache only, into a folder an earlier job prepared, the same way: the new cache
    is written under ``.cache-new`` and replaces ``cache/`` once complete.
    """
    t0 = time.time()
    if plan.cache_only:
        cache, new, old = (folders.join(plan.output, name) for name in (
            prepared.CACHE_DIR, prepared.NEW_CACHE_DIR, prepared.OLD_CACHE_DIR))
        folders.remove(plan.output, [prepared.NEW_CACHE_DIR, prepared.OLD_CACHE_DIR])
        try:
            _tokenize(plan, beam_args, new)
        except BaseException:
            folders.remove_folder(new)
            raise
        folders.replace(cache, folders.entries(cache), new, old)
        return {"seconds": time.time() - t0, "seconds_text": 0.0,
                "languages": prepared.read_stats(plan.output)["languages"]}
    replacing = [n for n in folders.entries(plan.output) if prepared.is_own_entry(n)]
    for leftover in (prepared.NEW_SUFFIX, prepared.OLD_SUFFIX) if replacing else ():
        folders.remove_folder(plan.output + leftover)  # of a killed job (make_plan checked)
    job = (dataclasses.replace(plan, output=plan.output + prepared.NEW_SUFFIX) if replacing
           else plan)
    created = "://" not in job.output and not os.path.exists(job.output)
    for folder in (job.output, job.temp, folders.join(job.output, prepared.TOKEN_SAMPLE_DIR)):
        folders.mkdirs(folder)
    if job.vocab_sample_lines:
        folders.mkdirs(folders.join(job.output, prepared.VOCAB_SAMPLE_DIR))
    try:
        beam_runs.run(functools.partial(build, plan=job), beam_args)
        seconds_text = time.time() - t0
        folders.remove(job.output, [prepared.TEMP_DIR])
        # The shards are complete: the cache job reads them as any run does (each task's
        # cache has a COMPLETED of its own, which readers check).
        folders.write_text(folders.join(job.output, prepared.COMPLETED), "")
        if job.vocab:
            _tokenize(job, beam_args, folders.join(job.output, prepared.CACHE_DIR))
    except BaseException:
        if replacing:
            folders.remove_folder(job.output)
        else:
            folders.remove(job.output, [n for n in folders.entries(job.output)
                                        if prepared.is_own_entry(n)])
            if created and not os.listdir(job.output):
                os.rmdir(job.output)
        raise
    if replacing:
        folders.replace(plan.output, replacing, job.output, plan.output + prepared.OLD_SUFFIX)
    return {"seconds": time.time() - t0, "seconds_text": seconds_text,
            "languages": prepared.read_stats(plan.output)["languages"]}


def _tokenize(plan: Plan, beam_args: Sequence[str], cache: str) -> None:
    """The second job: seqio's token cache of every prepared language's task, into ``cache``."""
    from xlmeta_jax.data import tasks  # noqa: PLC0415 - seqio and TensorFlow, on use

    # Only the steps before the cache placeholder matter here: no token counts needed.
    tasks.register(Corpora(vocab_path=plan.vocab, cc100_dir=plan.output,
                           languages=plan.languages, count_unit="lines",
                           eos_after=plan.eos_after, max_line_bytes=plan.max_line_bytes))
    token_cache.cache_tasks([names.cc100_task(lang) for lang in plan.languages], cache,
                            beam_args=beam_args)


# --------------------------------------------------------------------------- command


def parser() -> argparse.ArgumentParser:
    p = errors.ArgumentParser(
        prog="python -m xlmeta_jax.data.prepare",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="CC-100 {lang}.txt.xz files to document-whole shards, corpus statistics, "
        "the vocabulary's line sample and seqio's token cache, on Apache Beam. Options this "
        "command does not know are Beam's (--runner, --direct_num_workers, --project, ...).",
    )
    p.add_argument("--input", action="append", type=files.path_flag("--input"),
                   help="glob of {lang}.txt.xz / .gz / plain files (repeatable; local or "
                   "gs://); without it, --tokenize adds the token cache to a prepared --output")
    p.add_argument("--output", required=True, type=files.path_flag("--output"),
                   help="the prepared folder (CC100_DIR)")
    p.add_argument("--languages", help="comma-separated CC-100 codes (default: every input)")
    p.add_argument("--shard_bytes", type=int, default=DEFAULT_SHARD_BYTES,
                   help="text bytes per shard (shards end at a document's end)")
    p.add_argument("--max_line_bytes", type=int, default=text_files.DEFAULT_MAX_LINE_BYTES,
                   help="longer lines are dropped and counted, as the reader drops them")
    p.add_argument("--gzip_level", type=int, default=1, help="the shards' gzip level (1..9)")
    p.add_argument("--token_sample_lines", type=int, default=2000,
                   help="paragraphs per language the tokens-per-byte estimate reads "
                   "(Corpora.token_sample_lines)")
    p.add_argument("--vocab_sample_lines", type=int, default=0,
                   help="draw the vocabulary's alpha-sampled sample of this many lines")
    p.add_argument("--alpha", type=float, default=0.3, help="the sample's q_l ~ n_l^alpha")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed")
    p.add_argument("--tokenize", action="store_true",
                   help="write seqio's offline token cache of every language's task")
    p.add_argument("--vocab", type=files.path_flag("--vocab"),
                   help="with --tokenize: the SentencePiece .model")
    p.add_argument("--eos_after", choices=("line", "document"), default="line",
                   help="with --tokenize: Corpora.eos_after of the runs that read the cache")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier output of this command in --output")
    errors.add_debug_flag(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m xlmeta_jax.data.prepare`` (see the module docstring)."""
    args, beam_args = parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    # The job's own lines; the libraries' info lines (Beam's per bundle, seqio's per
    # example, JAX's backend search) would drown them: their warnings and errors show.
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("xlmeta_jax").setLevel(logging.INFO)
    logs.quiet_start(import_tensorflow=args.tokenize)
    beam_runs.quiet()
    try:
        import apache_beam  # noqa: F401, PLC0415
    except ImportError:
        raise errors.UserError("Apache Beam is not installed: pip install -c constraints.txt "
                               "-e '.[beam]'") from None
    beam_runs.check_options(beam_args)
    plan = make_plan(args)
    if plan.cache_only:
        print(f"tokenizing {len(plan.languages)} prepared languages into "
              f"{folders.join(plan.output, prepared.CACHE_DIR)}", flush=True)
        result = run(plan, beam_args)
        cache = folders.join(plan.output, prepared.CACHE_DIR)
        print(f"wrote the token cache of {len(plan.languages)} languages in "
              f"{result['seconds']:.1f} s: {cache} (read it "
              "with XLING_USE_CACHED=True or make_mlm_iterator.use_cached=True)")
        return 0
    print(f"preparing {len(plan.inputs)} files of {len(plan.languages)} languages into "
          f"{plan.output}", flush=True)
    result = run(plan, beam_args)
    langs = result["languages"]
    text = sum(v["text_bytes"] for v in langs.values())
    print(f"wrote {sum(v['files'] for v in langs.values())} shards, "
          f"{sum(v['lines'] for v in langs.values())} lines, {text / 1e6:.1f} MB of text of "
          f"{len(langs)} languages in {result['seconds']:.1f} s: {plan.output} "
          f"(CC100_DIR='{plan.output}')")
    return 0


if __name__ == "__main__":
    errors.exit_with(main, prog="xlmeta_jax.data.prepare")
