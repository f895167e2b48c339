"""Where a compiled step spends its time: a device profile grouped by model part.

:func:`profile_step` runs a jitted function a few times under ``jax.profiler`` (the
trace is kept for TensorBoard's profile plugin or Perfetto), reads the XSpace back
with ``jax.profiler.ProfileData``, and attributes each executed HLO op's time to
the part of the model that emitted it. The attribution uses the ``op_name``
metadata XLA keeps on every instruction: JAX's name stack, e.g.
``jit(train_step_fn)/transpose(jvp(XLMRForMaskedLM))/encoder/.../attention/query/
dot_general`` (``transpose(...)`` marks the backward pass). Works on CPU, GPU and
TPU; on accelerators only device-side op events are counted.

Imports neither TensorFlow nor seqio.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import time
from collections.abc import Callable
from typing import Any

import jax

# (component, pattern) in priority order: the first pattern found in an op's name
# stack names its component. Dropout-mask generation is listed first because it runs
# inside every other scope.
COMPONENTS: tuple[tuple[str, str], ...] = (
    # jax.random.bits has no scope of its own: its threefry rounds show as while /
    # xor / shift ops directly under the Dropout module.
    ("dropout masks (PRNG)",
     r"_bernoulli|_uniform|threefry|random_bits|rng_bit_generator|random_fold_in|"
     r"random_split|random_wrap|iota_2x32|"
     r"[Dd]ropout(_\d+)?/(while|xor|shift_left|shift_right_logical|or|add|slice)\b"),
    ("attention: q/k/v/out projections", r"/attention/(query|key|value|out)/"),
    ("attention: scores, softmax, dropout", r"/attention/|dot_product_attention"),
    ("MLP: wi, GELU, wo", r"/layers(_\d+)?/(wi|wo)/|/layers(_\d+)?/(erf|gelu)"),
    ("layer: residual, LayerNorm, dropout", r"/layers(_\d+)?/"),
    ("LM head: gather, dense, vocabulary projection", r"/lm_head/|take_along_axis|attend"),
    ("embeddings: look-up, LayerNorm", r"/embeddings/"),
    ("encoder: layer loop, other", r"XLMRForMaskedLM\)+/encoder/"),
    ("loss: log-softmax, cross-entropy", r"jvp\(\)|jvp\(jit\((log_softmax|_one_hot)"),
    # Outside value_and_grad: AdamW, clipping, the norms reported as metrics.
    ("optimizer: AdamW, clipping, norms", r"^jit\([^/]*\)/[^/]*$"),
)
# Ops without a name stack: mostly the zero-initialised buffers scan stacks per-layer
# values into, and copies XLA inserts.
OTHER = "other (buffer initialisation, copies)"


def component_of(op_name: str) -> str:
    """The model part an HLO op belongs to, from its JAX name stack."""
    for name, pattern in COMPONENTS:
        if re.search(pattern, op_name):
            return name
    return OTHER


def pass_of(op_name: str) -> str:
    """'backward' for ops JAX's transpose emitted, 'forward' inside jvp, else '-'."""
    if "transpose(" in op_name:
        return "backward"
    if "jvp(" in op_name:
        return "forward"
    return "-"


_INSTRUCTION = re.compile(
    r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?metadata=\{[^}]*?op_name="((?:[^"\\]|\\.)*)"', re.M
)


def hlo_op_names(hlo_text: str) -> dict[str, str]:
    """Maps each HLO instruction name to its ``op_name`` metadata (JAX's name stack)."""
    return {m.group(1): m.group(2) for m in _INSTRUCTION.finditer(hlo_text)}


def _exclusive_times(events: list[tuple[int, int, str]]) -> dict[str, int]:
    """Self time per op of one timeline line: nested events are subtracted from their
    parents (a ``while`` op contains the ops of its body on the same line)."""
    out: dict[str, int] = {}
    stack: list[list[Any]] = []  # [end_ns, name, child_ns, duration_ns]

    def close(item):
        _, name, child, dur = item
        out[name] = out.get(name, 0) + max(0, dur - child)

    for start, dur, name in sorted(events, key=lambda e: (e[0], -e[1])):
        while stack and stack[-1][0] <= start:
            close(stack.pop())
        if stack:
            stack[-1][2] += dur
        stack.append([start + dur, name, 0, dur])
    while stack:
        close(stack.pop())
    return out


def op_times_from_xspace(path: str, module_prefix: str) -> tuple[dict[str, int], str]:
    """Self time (ns) of every HLO op of modules named ``module_prefix*`` in a trace.

    Device planes (``/device:...``) are used when they hold op events (GPU, TPU);
    otherwise the host's XLA executor threads (CPU).

    Returns:
      ``({hlo_op: ns}, source)`` where ``source`` names the planes read.
    """
    data = jax.profiler.ProfileData.from_file(path)
    per_source: dict[str, list[dict[str, int]]] = {"device": [], "host": []}
    for plane in data.planes:
        kind = "device" if plane.name.startswith("/device:") else "host"
        for line in plane.lines:
            events = []
            for ev in line.events:
                stats = dict((k, v) for k, v in ev.stats if k is not None)
                op, module = stats.get("hlo_op"), stats.get("hlo_module")
                if module is not None and not str(module).startswith(module_prefix):
                    continue
                if op is None and kind == "device" and ev.duration_ns > 0:
                    # A kernel without the op annotation: XLA names fusion kernels
                    # after their instruction (see ``breakdown``); only this step
                    # runs while tracing.
                    op = ev.name
                if op and (module is not None or kind == "device"):
                    events.append((int(ev.start_ns), int(ev.duration_ns), str(op)))
            if events:
                per_source[kind].append(_exclusive_times(events))
    source = "device" if per_source["device"] else "host"
    if source == "host" and jax.default_backend() != "cpu":
        source = "host (no device op events: these are launch times, not kernel times)"
    totals: dict[str, int] = {}
    for line_times in per_source[source]:
        for op, ns in line_times.items():
            totals[op] = totals.get(op, 0) + ns
    return totals, f"{source} op events"


@dataclasses.dataclass
class Breakdown:
    """Per-component time of one profiled step (milliseconds per step)."""

    # (component, forward ms, backward ms, other-pass ms, total ms) per component,
    # largest first.
    rows: list[tuple[str, float, float, float, float]]
    # Sum of all attributed op time per step, ms.
    total_ms: float
    # Wall time per step while profiling, ms (ops overlap with gaps on accelerators).
    wall_ms: float
    # Which timeline was read.
    source: str
    # Directory holding the trace (open with TensorBoard's profile plugin or Perfetto).
    trace_dir: str
    # The ten most expensive single ops: (ms per step, hlo op, component, op_name).
    top_ops: list[tuple[float, str, str, str]]

    def format(self) -> str:
        lines = [
            f"profile ({self.source}; trace in {self.trace_dir}): op time "
            f"{self.total_ms:.2f} ms/step vs wall {self.wall_ms:.2f} ms/step",
            f"{'component':<47} {'fwd ms':>8} {'bwd ms':>8} {'other':>8} {'total':>8} "
            f"{'share':>6}",
        ]
        for name, fwd, bwd, rest, total in self.rows:
            share = total / self.total_ms if self.total_ms else 0.0
            lines.append(
                f"{name:<47} {fwd:8.2f} {bwd:8.2f} {rest:8.2f} {total:8.2f} {share:6.1%}"
            )
        lines.append("top ops:")
        for ms, op, comp, op_name in self.top_ops:
            lines.append(f"  {ms:8.3f} ms  {op:<24} {comp:<30.30}  {op_name[-70:]}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def breakdown(op_ns: dict[str, int], names: dict[str, str], steps: int) -> tuple[
        list[tuple[str, float, float, float, float]], float, list]:
    """Groups per-op times (summed over ``steps``) by component and pass, ms per step."""
    table: dict[str, list[float]] = {}
    ops = []
    # GPU kernels are named after their instruction with '.' and '-' made '_'.
    sanitized = {re.sub(r"[.\-]", "_", k): v for k, v in names.items()}
    for op, ns in op_ns.items():
        op_name = names.get(op) or sanitized.get(op, "")
        comp = component_of(op_name) if op_name else OTHER
        ms = ns / 1e6 / steps
        col = {"forward": 0, "backward": 1}.get(pass_of(op_name), 2)
        row = table.setdefault(comp, [0.0, 0.0, 0.0])
        row[col] += ms
        ops.append((ms, op, comp, op_name))
    rows = sorted(
        ((c, f, b, o, f + b + o) for c, (f, b, o) in table.items()), key=lambda r: -r[4]
    )
    ops.sort(key=lambda t: -t[0])
    return rows, sum(r[4] for r in rows), ops[:10]


def profile_step(
    run: Callable[[int], None],
    compiled_text: str,
    trace_dir: str,
    *,
    steps: int = 3,
) -> Breakdown:
    """Profiles ``run(steps)`` (which must block until its steps finish).

    Args:
      run: runs that many steps of the compiled function and waits for them.
      compiled_text: ``Compiled.as_text()`` of that function: its HLO module name
        selects the trace's events, its metadata maps ops to name stacks.
      trace_dir: where the trace is written (created; an existing trace is kept
        beside the new one).
      steps: steps inside the trace.

    Returns:
      The :class:`Breakdown`.
    """
    module_name = re.match(r"HloModule\s+([\w.\-]+)", compiled_text).group(1)
    os.makedirs(trace_dir, exist_ok=True)
    before = set(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))
    with jax.profiler.trace(trace_dir):
        t0 = time.perf_counter()
        run(steps)
        wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    new = sorted(
        set(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)) - before
    )
    if not new:
        raise RuntimeError(f"profiling: no .xplane.pb trace was written under {trace_dir}")
    op_ns, source = op_times_from_xspace(new[-1], module_name)
    if not op_ns:
        raise RuntimeError(
            f"profiling: the trace {new[-1]} holds no op events of module {module_name!r}"
        )
    rows, total, top = breakdown(op_ns, hlo_op_names(compiled_text), steps)
    return Breakdown(rows=rows, total_ms=total, wall_ms=wall_ms, source=source,
                     trace_dir=os.path.dirname(new[-1]), top_ops=top)
