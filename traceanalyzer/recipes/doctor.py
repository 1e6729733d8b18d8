"""``recipe doctor``: match the installed stack to a hook variant, or refuse with the reason."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from traceanalyzer.recipes.model import Recipe
from traceanalyzer.recipes.seams import DirSource, HookVariant, SourceReader, missing_seams
from traceanalyzer.recipes.versions import Environment, version_tuple

__all__ = ["Verdict", "diagnose", "variant_for_version"]


@dataclass
class Verdict:
    """``variant`` is set when the recipe can run; ``problems`` say why not."""

    recipe: str
    variant: str | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.variant is not None and not self.problems

    def as_dict(self) -> dict[str, Any]:
        fields = asdict(self)
        return {"recipe": fields.pop("recipe"), "ok": self.ok, **fields}


def variant_for_version(recipe: Recipe, version: str) -> HookVariant | None:
    """The variant whose version range holds ``version`` (used when sources are not readable)."""
    v = version_tuple(version)
    for variant in recipe.variants:
        lo = version_tuple(variant.min_version)
        hi = version_tuple(variant.max_version) if variant.max_version else None
        if v >= lo and (hi is None or v < hi):
            return variant
    return None


def _supported_text(recipe: Recipe) -> str:
    lo = min(recipe.variants, key=lambda v: version_tuple(v.min_version)).min_version
    return f"vllm-ascend >= {lo} (tested: {', '.join(sorted(recipe.supported, key=version_tuple))})"


def diagnose(
    recipe: Recipe,
    env: Environment,
    ascend_src: SourceReader | None = None,
    vllm_src: SourceReader | None = None,
) -> Verdict:
    """Pick ``recipe``'s hook variant for ``env``.

    The installed sources decide (every seam of the variant must exist); versions are only the
    fallback when the sources cannot be read, and name the supported range in messages.
    """
    verdict = Verdict(recipe.name)
    versions = env.versions
    for key, why in (
        ("vllm", "vLLM is not installed"),
        ("vllm-ascend", "vllm-ascend is not installed"),
        ("torch_npu", "torch_npu is not installed (the hooks profile with torch_npu.profiler)"),
    ):
        if not versions.get(key):
            verdict.problems.append(why)
    if recipe.name == "mooncake-store-transfer" and not versions.get("mooncake"):
        verdict.problems.append(
            "Mooncake is not installed (pip install mooncake-transfer-engine-npu)"
        )
    va = versions.get("vllm-ascend")
    if va:
        if ascend_src is None and env.roots.get("vllm-ascend"):
            ascend_src = DirSource(env.roots["vllm-ascend"])  # type: ignore[arg-type]
        chosen: HookVariant | None = None
        reasons: list[str] = []
        if ascend_src is not None:
            for variant in recipe.variants:
                missing = missing_seams(ascend_src, variant.seams)
                if not missing:
                    chosen = variant
                    break
                reasons.append(f"variant {variant.name}: " + "; ".join(missing))
        else:
            chosen = variant_for_version(recipe, va)
            verdict.notes.append("vllm-ascend sources not found; picked the variant by version")
        if chosen is None:
            verdict.problems.append(
                f"vllm-ascend {va} matches no hook variant of {recipe.name} "
                f"(supported: {_supported_text(recipe)}). " + " | ".join(reasons)
            )
        else:
            verdict.variant = chosen.name
            by_version = variant_for_version(recipe, va)
            if by_version is None or by_version.name != chosen.name:
                verdict.notes.append(
                    f"vllm-ascend {va} is outside the tested range of variant {chosen.name}; "
                    "its seams are present, so it should work"
                )
    if versions.get("vllm"):
        if vllm_src is None and env.roots.get("vllm"):
            vllm_src = DirSource(env.roots["vllm"])  # type: ignore[arg-type]
        if vllm_src is not None:
            missing = missing_seams(vllm_src, recipe.vllm_seams)
            if missing:
                verdict.problems.append(f"vLLM {versions['vllm']} lacks: " + "; ".join(missing))
            off = (
                f"not in vLLM {versions['vllm']} (iterations then come from the Python tracer's "
                "functions or the device's bursts)"
            )
            for label, seam in recipe.evidence:
                state = off if missing_seams(vllm_src, (seam,)) else "on"
                verdict.notes.append(f"evidence: {label}: {state}")
        if va and version_tuple(versions["vllm"])[:2] != version_tuple(va)[:2]:
            verdict.notes.append(
                f"vLLM {versions['vllm']} and vllm-ascend {va} differ in minor version; "
                "vllm-ascend releases pair with the same vLLM version"
            )
    cann = versions.get("cann")
    if cann is None:
        verdict.notes.append(
            "CANN toolkit not found (set ASCEND_TOOLKIT_HOME or source set_env.sh)"
        )
    elif recipe.cann_note is not None and (note := recipe.cann_note(cann)):
        verdict.notes.append(note)
    return verdict
