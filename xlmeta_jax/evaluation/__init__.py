"""Zero-shot cross-lingual evaluation: scorers, data readers, tokenisation, heads.

Nothing in this package imports TensorFlow or seqio at module import time; the SeqIO
task registrations live in ``tasks/finetune.py``.
"""
