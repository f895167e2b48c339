"""Pretraining: the one linear trainer both phases run through, and what it leans on.

* ``trainer``     — ``train(...)``: phases in order, init/resume, the loop, logging;
* ``checks``      — the configuration checks made before anything is read or compiled;
* ``step``        — the jitted train/eval steps (gradient accumulation included);
* ``checkpoints`` — Orbax checkpoints of a phase, their metadata and the run layout;
* ``checksums``   — per-array checksums that make a damaged checkpoint refused;
* ``synthetic``   — the synthetic batch stream (benchmarks, tests, data-free runs);
* ``run_dir``     — the run directory's lock and the stored-config check on rerun;
* ``signals``     — Ctrl-C / SIGTERM: stop at a step boundary with a checkpoint;
* ``flops``, ``hardware`` — FLOPs per step and the accelerators' peaks (MFU).
"""
