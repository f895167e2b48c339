"""Pretraining: the one linear trainer every phase runs through, and what it leans on.

* ``trainer``     — ``train(...)``: phases in order, init/resume, the loop, logging;
* ``phases``      — ``Phase`` and ``Merge``: what a phase reads, for how long, and how;
* ``checks``      — the configuration checks made before anything is read or compiled;
* ``step``        — the jitted train/eval steps (gradient accumulation included);
* ``checkpoints`` — Orbax checkpoints of a phase, their metadata and the run layout;
* ``checksums``   — per-array checksums that make a damaged checkpoint refused;
* ``loading``     — what a checkpoint path names, its parameters (fine-tuning, export),
  and a phase's starting state (an earlier phase's checkpoint, initial parameters);
* ``merging``     — checkpoint merging (linear, TIES);
* ``run_dir``     — the run directory's lock and the stored-config check on rerun;
* ``signals``     — Ctrl-C / SIGTERM: stop at a step boundary with a checkpoint;
* ``progress``    — progress lines, TensorBoard scalars and the run's summary;
* ``hardware``    — FLOPs per step, the accelerators' peaks (MFU), TPU slice names.
"""
