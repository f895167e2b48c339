"""The seqio evaluation Tasks yield the same examples as the readers."""

import pytest

from xlmeta_jax.evaluation import readers

seqio = pytest.importorskip("seqio")


def test_tasks_registered_and_match_readers(shared_data, monkeypatch):
    monkeypatch.setattr(readers, "DEFAULT_DATA_DIR", shared_data)
    from tasks import finetune as eval_tasks

    assert eval_tasks.NAMES["tydiqa"]["sw"] == "xlmeta_eval_tydiqa_sw"
    for by_lang in eval_tasks.NAMES.values():
        for name in by_lang.values():
            assert name in seqio.TaskRegistry.names()

    qa = seqio.get_mixture_or_task("xlmeta_eval_tydiqa_sw")
    first = next(qa.get_dataset(None, split="validation", shuffle=False).as_numpy_iterator())
    gold = readers.load_eval("tydiqa", "sw", shared_data)[0]
    assert first["id"].decode() == gold.id
    assert [a.decode() for a in first["answers"]] == list(gold.answers)
    assert list(first["answer_starts"]) == list(gold.answer_starts)

    train = seqio.get_mixture_or_task("xlmeta_eval_xnli_en").get_dataset(
        None, split="train", shuffle=False
    )
    assert sum(1 for _ in train) == len(readers.load_train("xnli", shared_data))

    tags = seqio.get_mixture_or_task("xlmeta_eval_udpos_ko")
    ex = next(tags.get_dataset(None, split="validation", shuffle=False).as_numpy_iterator())
    gold = readers.load_eval("udpos", "ko", shared_data)[0]
    assert [t.decode() for t in ex["tags"]] == list(gold.tags)
    with pytest.raises(ValueError, match="train"):
        tags.get_dataset(None, split="train")
