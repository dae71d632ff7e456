"""Model configs of inference suites: every seed rule rejected at load (plan) time, short names."""

from __future__ import annotations

import textwrap

import pytest

from accelmatrix.inference.configs import normalize, parse_config
from accelmatrix.spec.loader import SuiteError, load_suite
from accelmatrix.spec.plan import expand

NATIVE_F16 = {"deployment_framework": "tgis_native", "dtype": "float16"}


@pytest.mark.parametrize(
    ("value", "short"),
    [
        (
            {"deployment_framework": "hf_transformers", "dtype_str": "float32"},
            "hf_transformers|f32",
        ),
        (
            {**NATIVE_F16, "num_shard": 2, "flash_attention": True, "resources": {"gpu": 2}},
            "tgis_native|f16|sharded(2)|flash",
        ),
        (
            {
                "deployment_framework": "hf_transformers",
                "dtype": "float32",
                "pt2_compile": True,
                "resources": {"gpu": None},
            },
            "hf_transformers|f32|pt2|cpu",
        ),
        (
            {
                "deployment_framework": "hf_custom_tp",
                "dtype": "bfloat16",
                "resources": {"gpu": {"mig_1g_10gb": 1}},
            },
            "hf_custom_tp|bf16|mig(1g_10gb)",
        ),
    ],
)
def test_short_names(value, short):
    assert parse_config(value, "axes.config.x").short_name() == short


def test_normalize_fills_defaults_and_derived_fields():
    v = normalize(
        {
            "deployment_framework": "hf_transformers",
            "dtype": "float32",
            "resources": {"gpu": None, "cpu": 2},
        },
        "axes.config.base",
    )
    assert v["num_shard"] == 1 and v["max_new_tokens"] == 1024
    assert v["resources"]["request_cpu"] == 2 and v["resources"]["gpu"] is None
    assert v["cpu_only"] is True and v["gpus"] == 0
    assert '"dtype": "float32"' in v["json"]


@pytest.mark.parametrize(
    ("value", "path", "words"),
    [
        # flash attention needs a GPU, fp16/bf16 and the native framework
        (
            {**NATIVE_F16, "dtype": "float32", "flash_attention": True, "resources": {"gpu": None}},
            "flash_attention",
            "needs a GPU",
        ),
        (
            {**NATIVE_F16, "dtype": "float32", "flash_attention": True},
            "flash_attention",
            "float16 or bfloat16 (got float32)",
        ),
        (
            {**NATIVE_F16, "deployment_framework": "hf_transformers", "flash_attention": True},
            "flash_attention",
            "tgis_native (got hf_transformers)",
        ),
        # pt2_compile needs hf_transformers
        ({**NATIVE_F16, "pt2_compile": True}, "pt2_compile", "hf_transformers (got tgis_native)"),
        # CPU-only needs float32
        ({**NATIVE_F16, "resources": {"gpu": None}}, "dtype", "needs dtype float32 (got float16)"),
        # sharded needs non-MIG gpu == num_shard
        ({**NATIVE_F16, "num_shard": 2}, "num_shard", "resources.gpu == num_shard"),
        (
            {**NATIVE_F16, "num_shard": 2, "resources": {"gpu": {"mig_1g_10gb": 2}}},
            "num_shard",
            "cannot use MIG",
        ),
        # field-level errors name the field and the allowed values
        ({**NATIVE_F16, "dtype": "float8"}, "dtype", "'float32', 'float16' or 'bfloat16'"),
        ({**NATIVE_F16, "flash_attn": True}, "flash_attn", "allowed: deployment_framework"),
        ({**NATIVE_F16, "resources": {"gpu": {"mig_9g": 1}}}, "resources.gpu", "mig_1g_10gb"),
        ({"dtype": "float32"}, "deployment_framework", "Field required"),
    ],
)
def test_rules_name_the_field_and_what_is_allowed(value, path, words):
    with pytest.raises(ValueError) as e:
        parse_config(value, "axes.config.bad")
    assert f"axes.config.bad.{path}" in str(e.value)
    assert words in str(e.value)


SUITE = """
axes:
  model: {tiny-gen: {name: tiny-gen}}
  config:
    base: {deployment_framework: hf_transformers, dtype: float32, resources: {gpu: null}}
    other: %s
axis_kinds: {config: inference_model_config}
machines: {cpu: {backend: local}}
workload:
  env: {CUDA_VISIBLE_DEVICES: "0"}
  run: ["${python}", "-c", "pass", "${axis.config.dtype}", "${axis.config.short_name}"]
"""


def _write(tmp_path, other: str):
    p = tmp_path / "inf.yaml"
    p.write_text(textwrap.dedent(SUITE % other))
    return p


def test_invalid_config_rejected_when_the_suite_loads(tmp_path):
    p = _write(tmp_path, "{deployment_framework: tgis_native, num_shard: 2, resources: {gpu: 1}}")
    with pytest.raises(SuiteError) as e:
        load_suite(p)
    msg = str(e.value)
    assert str(p) in msg
    assert "axes.config.other.num_shard: a sharded config needs resources.gpu == num_shard" in msg
    assert "num_shard 2, resources.gpu 1" in msg


def test_unknown_axis_kind_target(tmp_path):
    p = tmp_path / "inf.yaml"
    p.write_text(
        textwrap.dedent(SUITE % "{deployment_framework: tgis_native}").replace(
            "axis_kinds: {config:", "axis_kinds: {cfg:"
        )
    )
    with pytest.raises(SuiteError, match="axis_kinds: no axis named 'cfg'"):
        load_suite(p)


def test_plan_renders_defaults_hides_gpus_and_shows_short_names(tmp_path):
    suite = load_suite(
        _write(tmp_path, "{deployment_framework: tgis_native, flash_attention: true}")
    )
    plan = expand(suite, "inf")
    cells = {c.axes["config"]: c for c in plan.cells}
    # dtype defaulted to float16: usable as a placeholder although the YAML never set it
    assert cells["other"].workload.run[3:] == ["float16", "tgis_native|f16|flash"]
    # CPU-only hides GPUs, even against the suite's own env; GPU configs keep the suite's
    assert cells["base"].workload.env["CUDA_VISIBLE_DEVICES"] == "-1"
    assert cells["other"].workload.env["CUDA_VISIBLE_DEVICES"] == "0"
    table = plan.table()
    assert "[config hf_transformers|f32|cpu]" in table
    assert "[config tgis_native|f16|flash]" in table


def test_shipped_inference_suite_validates():
    from accelmatrix import settings

    suite = load_suite(settings.include_dir() / "suites" / "inference.yaml")
    plan = expand(suite, "inference")
    assert len(plan.cells) == 6 and len(plan.excluded) == 2
    assert suite.machines["cpu-local"].pool_slots == 2  # max parallel workers
    assert suite.machines["tpu-v5e"].backend == "tpu-vm"
