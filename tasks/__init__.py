"""seqio Tasks and Mixtures of the project; importing this package registers them.

Names: :mod:`tasks.names`. Corpus locations are gin-configured when a dataset is
built (see docs/data.md), so importing before parsing gin is fine.
"""

from tasks import pretraining  # noqa: F401  (registers the pretraining tasks)
