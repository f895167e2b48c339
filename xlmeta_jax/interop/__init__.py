"""Other ecosystems: Hugging Face weights and tokenizers, and t5x's trainer.

* ``hf``  — ``layout`` (parameter names and shapes both ways), ``tokenizer`` (the
  SentencePiece model as an XLM-R tokenizer), ``convert`` (``load_hf``, ``to_hf``,
  ``to_flax``);
* ``t5x`` — ``model`` (our encoder as a t5x ``BaseModel``), ``phases`` (phase 2 starts
  from phase 1's t5x checkpoint), ``checks`` (our trainer's checks before t5x starts).
"""
