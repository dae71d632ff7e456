"""Inference server configs (TGIS-style model configs) and their plan-time rules.

A suite declares an axis as model configs with ``axis_kinds: {config: inference_model_config}``;
the suite loader then validates every value of that axis here, so an impossible config
(flash attention on a CPU, a 2-shard config with 1 GPU) is rejected when the suite is
loaded, before any machine is provisioned, with the field path and what is allowed.

The fields and defaults follow tgis-tester's ``ModelConfig`` (``dtype_str`` is accepted as
the seed's spelling of ``dtype``). Only pydantic is imported: this runs at DAG parse time.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, PositiveInt, ValidationError

Framework = Literal[
    "hf_transformers",
    "hf_custom_tp",
    "hf_accelerate",
    "hf_optimum_ort",
    "hf_optimum_bt",
    "tgis_native",
]
Dtype = Literal["float32", "float16", "bfloat16"]
MigProfile = Literal["mig_1g_10gb", "mig_2g_20gb", "mig_3g_40gb"]
HALF_DTYPES = ("float16", "bfloat16")
DTYPE_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class MigGpu(_Model):
    """A MIG slice request, e.g. ``{mig_1g_10gb: 1}`` (exactly one profile)."""

    mig_1g_10gb: PositiveInt | None = None
    mig_2g_20gb: PositiveInt | None = None
    mig_3g_40gb: PositiveInt | None = None

    def profile(self) -> tuple[str, int]:
        set_ = [(k, v) for k, v in self.model_dump().items() if v is not None]
        if len(set_) != 1:
            raise ValueError(
                "resources.gpu: a MIG request names exactly one profile "
                f"(allowed: {', '.join(MigProfile.__args__)}), got {len(set_)}"
            )
        return set_[0]


class ConfigResources(_Model):
    """Worker resources. ``gpu: null`` means CPU-only (the worker hides every GPU)."""

    request_cpu: Annotated[float, Field(gt=0)] = Field(
        4, validation_alias=AliasChoices("request_cpu", "cpu")
    )
    request_memory_gb: Annotated[float, Field(gt=0)] = Field(
        32, validation_alias=AliasChoices("request_memory_gb", "memory")
    )
    limit_cpu: Annotated[float, Field(gt=0)] = 8
    limit_memory_gb: Annotated[float, Field(gt=0)] = 128
    gpu: PositiveInt | MigGpu | None = 1


class ModelConfig(_Model):
    """One server config of a model (one worker per model x config)."""

    deployment_framework: Framework
    dtype: Dtype = Field("float16", validation_alias=AliasChoices("dtype", "dtype_str"))
    num_shard: PositiveInt = 1
    flash_attention: bool = False
    pt2_compile: bool = False
    quantize: Literal["gptq", "bitsandbytes"] | None = None
    max_batch_size: PositiveInt = 12
    max_concurrent_requests: PositiveInt = 64
    max_sequence_length: PositiveInt = 2048
    max_new_tokens: PositiveInt = 1024
    resources: ConfigResources = ConfigResources()

    # -- derived -----------------------------------------------------------------------------
    @property
    def cpu_only(self) -> bool:
        return self.resources.gpu is None

    @property
    def mig(self) -> tuple[str, int] | None:
        g = self.resources.gpu
        return g.profile() if isinstance(g, MigGpu) else None

    def short_name(self) -> str:
        """``tgis_native|f16|sharded(2)|flash``: what the plan table and reports show."""
        parts = [self.deployment_framework, DTYPE_SHORT[self.dtype]]
        if self.num_shard > 1:
            parts.append(f"sharded({self.num_shard})")
        if self.flash_attention:
            parts.append("flash")
        if self.pt2_compile:
            parts.append("pt2")
        if self.quantize:
            parts.append(self.quantize)
        if self.cpu_only:
            parts.append("cpu")
        elif self.mig:
            parts.append(f"mig({self.mig[0].removeprefix('mig_')})")
        return "|".join(parts)

    def rule_violations(self) -> list[tuple[str, str]]:
        """The seed's cross-field rules: (field path, what is wrong and what is allowed)."""
        out: list[tuple[str, str]] = []
        gpu = self.resources.gpu
        if self.flash_attention:
            if self.cpu_only:
                out.append(
                    (
                        "flash_attention",
                        "flash attention needs a GPU (resources.gpu is null: CPU-only); "
                        "set resources.gpu or flash_attention: false",
                    )
                )
            if self.dtype not in HALF_DTYPES:
                out.append(
                    (
                        "flash_attention",
                        f"flash attention needs dtype float16 or bfloat16 (got {self.dtype})",
                    )
                )
            if self.deployment_framework != "tgis_native":
                out.append(
                    (
                        "flash_attention",
                        "flash attention needs deployment_framework tgis_native "
                        f"(got {self.deployment_framework})",
                    )
                )
        if self.pt2_compile and self.deployment_framework != "hf_transformers":
            out.append(
                (
                    "pt2_compile",
                    "pt2_compile needs deployment_framework hf_transformers "
                    f"(got {self.deployment_framework})",
                )
            )
        if self.cpu_only and self.dtype != "float32":
            out.append(
                (
                    "dtype",
                    f"a CPU-only config (resources.gpu: null) needs dtype float32 "
                    f"(got {self.dtype})",
                )
            )
        if isinstance(gpu, MigGpu):
            try:
                gpu.profile()
            except ValueError as e:
                out.append(("resources.gpu", str(e).removeprefix("resources.gpu: ")))
        if self.num_shard > 1:
            if isinstance(gpu, MigGpu):
                out.append(
                    (
                        "num_shard",
                        f"a sharded config (num_shard {self.num_shard}) cannot use MIG slices: "
                        f"set resources.gpu: {self.num_shard}",
                    )
                )
            elif gpu != self.num_shard:
                out.append(
                    (
                        "num_shard",
                        f"a sharded config needs resources.gpu == num_shard "
                        f"(num_shard {self.num_shard}, resources.gpu {gpu})",
                    )
                )
        return out

    def cell_env(self) -> dict[str, str]:
        """Environment every cell of this config gets: CPU-only configs hide every GPU."""
        return {"CUDA_VISIBLE_DEVICES": "-1"} if self.cpu_only else {}


def parse_config(value: Any, where: str) -> ModelConfig:
    """Validate one axis value; raise ValueError naming ``where.<field>`` for every problem."""
    if not isinstance(value, dict):
        raise ValueError(
            f"{where}: a model config is a mapping (deployment_framework, dtype, ...), "
            f"got {type(value).__name__}"
        )
    raw = {k: v for k, v in value.items() if k not in DERIVED_FIELDS}
    try:
        cfg = ModelConfig.model_validate(raw)
    except ValidationError as e:
        problems = []
        for err in e.errors(include_url=False):
            loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = f"unknown field (allowed: {', '.join(_allowed(err['loc'][:-1]))})"
            elif err["type"] != "missing" and "input" in err:
                msg += f" (got {err['input']!r})"
            problems.append(f"{where}.{loc}: {msg}")
        raise ValueError("; ".join(problems)) from None
    violations = cfg.rule_violations()
    if violations:
        raise ValueError("; ".join(f"{where}.{path}: {msg}" for path, msg in violations))
    return cfg


def _allowed(loc: tuple[Any, ...]) -> list[str]:
    if loc[:1] == ("resources",):
        if loc[1:2] == ("gpu",):
            return list(MigGpu.model_fields)
        return list(ConfigResources.model_fields)
    return list(ModelConfig.model_fields)


# Fields the validator adds to each axis value, usable as ${axis.config.FIELD} placeholders.
DERIVED_FIELDS = ("short_name", "gpus", "cpu_only", "json")


def normalize(value: Any, where: str) -> dict[str, Any]:
    """The axis value with defaults filled in and the derived fields added."""
    cfg = parse_config(value, where)
    out = cfg.model_dump(mode="json")
    gpu = cfg.resources.gpu
    out["short_name"] = cfg.short_name()
    out["gpus"] = 0 if gpu is None else (gpu if isinstance(gpu, int) else cfg.mig[1])  # type: ignore[index]
    out["cpu_only"] = cfg.cpu_only
    # The whole config as one argv element for the server (`--config-json ${axis.config.json}`).
    out["json"] = json.dumps(cfg.model_dump(mode="json"), sort_keys=True)
    return out


def describe(value: dict[str, Any]) -> str:
    """Plan-table text for a normalized value."""
    return f"config {value.get('short_name', '?')}"


def cell_env(value: dict[str, Any]) -> dict[str, str]:
    """Env for a cell from a normalized value (see ModelConfig.cell_env)."""
    return {"CUDA_VISIBLE_DEVICES": "-1"} if value.get("cpu_only") else {}
