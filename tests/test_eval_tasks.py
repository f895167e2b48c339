"""The task registry: every task object answers the Task interface, one gin file per task,
and the evaluation package's structure (no gin, no name dispatch, no import cycles)."""

import ast
import inspect
import pathlib

import pytest

from xlmeta_jax import errors
from xlmeta_jax.evaluation import models, tasks
from xlmeta_jax.evaluation.tasks.base import FineTunedTask, Task

REPO = pathlib.Path(__file__).resolve().parents[1]
EVALUATION = REPO / "xlmeta_jax" / "evaluation"


def test_registry_names_are_the_finetune_gin_files():
    from xlmeta_jax.evaluation import embedding_config as embedding_run

    # embeddings.gin is the contrastive run, which the command dispatches on its task name.
    gin_tasks = {p.stem for p in (REPO / "gin" / "finetune").glob("*.gin")} - {
        "base", "demo", embedding_run.TASK}
    assert set(tasks.names()) == gin_tasks
    assert embedding_run.TASK not in tasks.names()
    text = (REPO / "gin" / "finetune" / f"{embedding_run.TASK}.gin").read_text()
    assert f"finetune.task = '{embedding_run.TASK}'" in text
    for name in tasks.names():
        text = (REPO / "gin" / "finetune" / f"{name}.gin").read_text()
        assert f"finetune.task = '{name}'" in text


def test_unknown_task_is_a_one_line_user_error():
    with pytest.raises(errors.UserError) as e:
        tasks.get("squad")
    assert "\n" not in str(e.value) and "unknown task 'squad'" in str(e.value)


@pytest.mark.parametrize("name", tasks.names())
def test_every_task_answers_the_interface(name):
    task = tasks.get(name)
    assert isinstance(task, Task) and task.name == name
    assert task.languages and len(set(task.languages)) == len(task.languages)
    assert isinstance(task.metric, str) and task.metric
    train, select, evaluate = task.local_data
    assert evaluate and isinstance(task.local_differences, tuple)
    assert task.check_languages(None) == task.languages
    assert task.check_languages([task.languages[0]]) == (task.languages[0],)
    assert set(task.tfds_languages) <= set(task.languages)
    prov = task.provenance("local", "/data", {}, None)
    assert prov["eval_data"] == evaluate and prov["differences"] == list(task.local_differences)
    # Nothing abstract left: every method the loop calls is implemented.
    assert not inspect.isabstract(type(task))
    if task.fine_tunes:
        assert isinstance(task, FineTunedTask)
        assert task.head in models.HEADS and train is not None
        assert task.num_labels >= 2 and task.schedule_offset in (0, 1)
        for method in ("load_train", "load_select", "load_eval", "tfds_train", "tfds_select",
                       "tfds_eval", "features", "score", "selection_score"):
            assert callable(getattr(task, method)), method
        assert task.selection_score({task.selection_metric: 1.5}) == 1.5
    else:
        assert train is None and select is None
        assert task.pooling in ("mean", "cls")
        assert 0 <= task.xtreme_layer(12) < 12 and 0 <= task.xtreme_layer(24) < 24
        assert callable(task.evaluate) and callable(task.read)


def _modules():
    return sorted(EVALUATION.rglob("*.py"))


def test_evaluation_package_structure():
    """No gin, no dispatch on task names or kinds outside the task objects, no import
    inside a function but an optional heavy dependency, modules under 600 lines."""
    graph = {}
    for path in _modules():
        text = path.read_text()
        rel = path.relative_to(REPO).as_posix()
        assert len(text.splitlines()) <= 500, rel
        tree = ast.parse(text)
        module = rel[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            assert not any(n == "gin" or n.startswith("gin.") for n in names), rel
            deps |= {n for n in names if n.startswith("xlmeta_jax.evaluation") and n != module}
        graph[module] = deps
        for func in (n for n in ast.walk(tree)
                     if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
            for node in ast.walk(func):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    line = text.splitlines()[node.lineno - 1]
                    assert "noqa: PLC0415" in line and " - " in line, f"{rel}:{node.lineno}"
        if "/tasks/" not in rel:
            for name in (*tasks.names(), "classification", "qa", "tagging", "retrieval"):
                assert f'== "{name}"' not in text and f"== '{name}'" not in text, (rel, name)
    # No import cycles between evaluation modules (a package imports its submodules).
    def visit(module, stack):
        assert module not in stack, " -> ".join([*stack, module])
        for dep in graph.get(module, ()):
            if dep in graph and not module.startswith(dep + "."):
                visit(dep, [*stack, module])

    for module in graph:
        visit(module, [])
