"""One known cause of a slower (or faster) run, injected into ``serving``: the truth ``diff``'s
explanation is tested against (``tests/test_diff_explain.py``).

Each knob changes one thing and leaves the rest of the run as it was (the defaults change
nothing, so a scenario's bytes for a seed stay the same):

- ``slow_op`` / ``slow_factor``: every kernel of one op type (``MatMulV2``) runs ``slow_factor``
  times as long (a slower kernel in a new CANN or torch_npu);
- ``step_syncs`` / ``step_sync_us``: that many ``.item()`` synchronisations after every
  forward, each followed by ``step_sync_us`` of host work before the next launch (a new sync
  in the model runner);
- ``add_norm``: ``separate`` puts a post-attention RmsNorm after the residual Add,
  ``fused`` runs both as one ``AddRmsNorm`` kernel in their place (a fused kernel);
- ``env``: ``KEY=VALUE,KEY2=VALUE2`` in the process environment profiler_metadata.json records
  (a settings change).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from traceanalyzer.synth import ops
from traceanalyzer.synth.ops import KernelSpec
from traceanalyzer.synth.scenarios.timeline import Timeline

KNOBS = {
    "slow_op": "",
    "slow_factor": 1.0,
    "step_syncs": 0,
    "step_sync_us": 100.0,
    "add_norm": "",
    "env": "",
}
HELP = (
    "; one cause for diff: slow_op=TYPE slow_factor=F, step_syncs=N step_sync_us, "
    "add_norm=separate|fused, env=KEY=VALUE,..."
)
ADD_NORM = ("", "separate", "fused")
RESIDUAL_ADD = "Add"  # the op type the post-attention norm follows
POST_NORM = ops.DECODE_LAYER[0]  # the layer's RmsNorm
# one kernel for both, a little faster than the two (one read of the hidden state)
ADD_RMS_NORM = ops.aclnn_kernel("AddRmsNorm", "AddRmsNorm", "AddRmsNorm", "AI_VECTOR_CORE", 5.0)


def layer(knobs: dict, base: tuple[KernelSpec, ...] = ops.DECODE_LAYER) -> list[KernelSpec]:
    """One decoder layer's kernels with the cause the knobs inject."""
    mode = knobs.get("add_norm", "")
    if mode not in ADD_NORM:
        raise ValueError(f"add_norm must be one of {ADD_NORM[1:]} (or empty), not {mode!r}")
    out: list[KernelSpec] = []
    for spec in base:
        if spec.op_type == RESIDUAL_ADD and mode == "separate":
            out += [spec, replace(POST_NORM, shapes=spec.shapes)]
        elif spec.op_type == RESIDUAL_ADD and mode == "fused":
            out.append(replace(ADD_RMS_NORM, shapes=spec.shapes))
        else:
            out.append(spec)
    slow, factor = knobs.get("slow_op", ""), float(knobs.get("slow_factor", 1.0))
    return [replace(s, dur_us=s.dur_us * factor) if s.op_type == slow else s for s in out]


def after_forward(tl: Timeline, t: int, knobs: dict) -> int:
    """The synchronisations the knobs add after a forward; returns the host time after them."""
    for _ in range(int(knobs.get("step_syncs", 0))):
        t = ops.item_sync(tl.rw, tl.rng, tl.dev, t, float(knobs.get("step_sync_us", 100.0)))
    return t


def environment(knobs: dict) -> dict[str, str]:
    """The ``env`` knob's variables."""
    pairs = [p for p in str(knobs.get("env", "")).split(",") if p.strip()]
    if any("=" not in p for p in pairs):
        raise ValueError(f"env must be KEY=VALUE pairs separated by commas, not {knobs['env']!r}")
    return {k.strip(): v.strip() for k, v in (p.split("=", 1) for p in pairs)}


def with_causes(run: Callable[[Timeline, dict], None]) -> Callable[[Timeline, dict], None]:
    """``run`` with the ``env`` knob's variables in the recorded environment."""

    def caused(tl: Timeline, knobs: dict) -> None:
        # a new dict: the rank's config may share the scenario's default one
        tl.rw.cfg.env = {**tl.rw.cfg.env, **environment(knobs)}
        run(tl, knobs)

    return caused
