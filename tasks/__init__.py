"""seqio Tasks and Mixtures of the project; importing this package registers them.

Names: :mod:`tasks.names` (pretraining) and ``tasks.finetune.NAMES`` (evaluation).
Corpus locations are gin-configured when a dataset is built (see docs/data.md),
so importing before parsing gin is fine.
"""

# Importing registers the zero-shot evaluation and the pretraining tasks.
from tasks import finetune, pretraining  # noqa: F401
