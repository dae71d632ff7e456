"""Golden cases: skip rules, stream variants, the three strategies, the server and the recorder.

The workload modules under include/workloads/inference/ are stdlib scripts (they run
without accelmatrix); they are imported here by path and exercised against a real server
process on 127.0.0.1.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accelmatrix.contracts.check_verdicts import CellOutputs
from accelmatrix.evaluation.check_plan import CheckPlan
from accelmatrix.evaluation.checks.inference import plan_golden_cases
from accelmatrix.spec.checks.inference import GoldenCasesCheck

ROOT = Path(__file__).resolve().parents[1]
WL = ROOT / "include" / "workloads" / "inference"
sys.path.insert(0, str(WL))

import golden  # noqa: E402
import tinylm  # noqa: E402
from client import call  # noqa: E402

F32 = json.dumps({"dtype": "float32", "num_shard": 1})
BF16_2 = json.dumps({"dtype": "bfloat16", "num_shard": 2})


@pytest.fixture
def server(tmp_path):
    """Start server.py with a config; yields the port. Stopped by PID."""
    procs = []

    def start(model: str = "tiny-gen", config: str = F32) -> int:
        pf = tmp_path / f"port-{len(procs)}"
        p = subprocess.Popen(  # noqa: S603
            [
                sys.executable,
                str(WL / "server.py"),
                "--model",
                model,
                "--config-json",
                config,
                "--port-file",
                str(pf),
            ],
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        procs.append(p)
        for _ in range(200):
            if pf.exists():
                return int(pf.read_text())
            time.sleep(0.02)
        raise AssertionError("server did not start")

    yield start
    for p in procs:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=10)


GEN = {
    "name": "g",
    "request": {
        "params": {
            "stopping": {"max_new_tokens": 10},
            "response": {"generated_tokens": True, "token_logprobs": True},
        },
        "requests": [{"text": "the quick brown fox"}, {"text": "tell me about the river"}],
    },
}


def test_plan_cases_skip_rules_and_stream_variants():
    cases = [
        {**GEN, "name": "a"},
        {**GEN, "name": "b", "single_shard_only": True},
        {**GEN, "name": "c", "skip_check": True},
        {"name": "e", "request": {"texts": ["x"]}, "response": {}},
    ]
    one = golden.plan_cases(cases, num_shard=1, stream=True)
    assert [p.id for p in one] == ["a", "a[stream]", "b", "b[stream]", "c", "c[stream]", "e"]
    assert all(p.skip_reason is None for p in one)
    assert [p.check for p in one if p.name == "c"] == [False, False]
    two = golden.plan_cases(cases, num_shard=2, stream=False)
    assert [(p.id, p.skip_reason) for p in two if p.skip_reason] == [
        ("b", "single_shard_only (num_shard 2)")
    ]


def test_case_file_errors_name_file_and_case(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("- {name: x, request: {}, response: {}, error: {code: A, message: b}}\n")
    with pytest.raises(golden.CaseFileError, match=r"c.yaml: case 'x': give either"):
        golden.load_cases(p)
    p.write_text("- {name: x, request: {}, reponse: {}}\n")
    with pytest.raises(golden.CaseFileError, match=r"unknown field\(s\) \['reponse'\]"):
        golden.load_cases(p)


def test_streaming_assembles_the_unary_response(server):
    port = server()
    unary = call(port, GEN, "unary")["response"]
    stream = call(port, GEN, "stream")["response"]
    assert unary == stream  # same text, counts, stop reason and tokens


def test_approximate_tolerates_dtype_noise_but_exact_text_does_not_need_it(server):
    golden_resp = call(server(config=F32), GEN)["response"]
    bf16 = call(server(config=BF16_2), GEN)
    case = {**GEN, "response": golden_resp}
    diffs = [
        abs(a["logprob"] - b["logprob"])
        for ra, rb in zip(golden_resp["responses"], bf16["response"]["responses"], strict=True)
        for a, b in zip(ra["tokens"], rb["tokens"], strict=True)
    ]
    assert max(diffs) > 0  # bfloat16 really differs ...
    assert (
        golden.compare(case, bf16, strategy="approximate", epsilon=0.05) is None
    )  # ... within 0.05
    assert "logprob" in golden.compare(case, bf16, strategy="approximate", epsilon=1e-6)
    assert golden.compare(case, bf16, strategy="exact") is None  # exact compares the text


def test_a_golden_response_that_differs_names_the_first_difference(server):
    actual = call(server(), GEN)
    bad = copy.deepcopy({**GEN, "response": actual["response"]})
    bad["response"]["responses"][1]["text"] = "something else"
    assert golden.compare(bad, actual, strategy="exact") == (
        f"responses[1].text: expected 'something else', got {actual['response']['responses'][1]['text']!r}"
    )
    bad = copy.deepcopy({**GEN, "response": actual["response"]})
    bad["response"]["responses"][0]["generatedTokenCount"] += 1
    assert "responses[0].generatedTokenCount: expected" in golden.compare(
        bad, actual, strategy="approximate"
    )
    bad = copy.deepcopy({**GEN, "response": actual["response"]})
    bad["response"]["responses"][0]["tokens"][0]["logprob"] -= 0.5
    msg = golden.compare(bad, actual, strategy="approximate", epsilon=0.01)
    assert msg.startswith("responses[0].tokens[0].logprob:") and "> epsilon 0.01" in msg


def test_expected_error_code_and_message(server):
    port = server()
    case = {
        "name": "e",
        "request": {"params": {"stopping": {"max_new_tokens": 5000}}, "requests": [{"text": "hi"}]},
    }
    actual = call(port, case)
    assert actual == {
        "error": {"code": "INVALID_ARGUMENT", "message": "max_new_tokens must be <= 1024"}
    }
    assert call(port, case, "stream") == actual
    ok = {**case, "error": dict(actual["error"])}
    assert golden.compare(ok, actual, strategy="approximate") is None
    wrong = {**case, "error": {"code": "RESOURCE_EXHAUSTED", "message": actual["error"]["message"]}}
    assert golden.compare(wrong, actual, strategy="approximate") == (
        "error code: expected RESOURCE_EXHAUSTED, got INVALID_ARGUMENT "
        "('max_new_tokens must be <= 1024')"
    )
    assert "expected error" in golden.compare(wrong, call(port, GEN), strategy="exact")


def test_embedding_similarity(server):
    case = {"name": "e", "request": {"texts": ["the sky is blue", "a red river"]}}
    f32 = call(server("tiny-embed"), case)
    f16 = call(server("tiny-embed", json.dumps({"dtype": "float16"})), case)
    assert f32 != f16  # rounded differently
    assert golden.compare({**case, "response": f32["response"]}, f16, strategy="embedding") is None
    other = call(server("tiny-embed"), {"name": "o", "request": {"texts": ["zzz qqq", "kkk"]}})
    msg = golden.compare({**case, "response": other["response"]}, f32, strategy="embedding")
    assert msg.startswith("embeddings[0]: cosine similarity") and "< threshold 0.9" in msg


def test_dtype_rounding():
    x = -1.2345678
    assert tinylm.round_dtype(x, "float16") != tinylm.round_dtype(x, "float32")
    assert abs(tinylm.round_dtype(x, "bfloat16") - x) < 0.01


def test_recorder_replays_against_the_base_config(tmp_path):
    src = tmp_path / "in.yaml"
    src.write_text(
        "- {name: g, single_shard_only: true, request: {params: {stopping: {max_new_tokens: 5}},"
        " requests: [{text: hello there}]}}\n"
        "- {name: bad, request: {params: {stopping: {max_new_tokens: 2, min_new_tokens: 3}},"
        " requests: [{text: hi}]}, response: {responses: [{text: stale}]}}\n"
    )
    out = tmp_path / "out.yaml"
    subprocess.run(  # noqa: S603
        [
            sys.executable,
            str(WL / "record.py"),
            "--model",
            "tiny-gen",
            "--config-json",
            F32,
            "--cases",
            str(src),
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    cases = golden.load_cases(out)  # recorded files are valid case files
    assert cases[0]["single_shard_only"] is True  # flags and requests are kept
    cfg = tinylm.ServerConfig()
    assert cases[0]["response"] == tinylm.generate("tiny-gen", cases[0]["request"], cfg)
    # a refused request is recorded as the expected error; the stale response is gone
    assert "response" not in cases[1]
    assert cases[1]["error"] == {
        "code": "INVALID_ARGUMENT",
        "message": "min_new_tokens must be <= max_new_tokens",
    }


def test_record_command_takes_the_base_config_from_the_suite(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins")}
    out = tmp_path / "gen.yaml"
    r = subprocess.run(  # noqa: S603
        [
            sys.executable,
            "-m",
            "accelmatrix.inference",
            "record",
            "--suite",
            str(ROOT / "include" / "suites" / "inference.yaml"),
            "--model",
            "tiny-gen",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "against config base (hf_transformers|f32|cpu)" in r.stdout
    # The shipped golden file is exactly what the base config answers today.
    shipped = golden.load_cases(WL / "cases" / "tiny-gen.yaml")
    assert golden.load_cases(out) == shipped


def _outputs(tmp_path, rows):
    out = tmp_path / "files" / "out"
    out.mkdir(parents=True)
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return CellOutputs(files_dir=tmp_path / "files", log_path=tmp_path / "x.log", status=None)


class _Inp:
    def __init__(self, outputs):
        self.outputs = outputs


def _plan(check, outputs):
    p = CheckPlan(index=0, name="g", prefix="c00", type="golden_cases", expected="", observed="")
    plan_golden_cases(check, p, _Inp(outputs))
    return p


def test_golden_cases_check_names_failing_cases(tmp_path):
    rows = [
        {"name": "a", "id": "a", "status": "passed", "passed": True, "reason": ""},
        {
            "name": "b",
            "id": "b[stream]",
            "status": "failed",
            "passed": False,
            "reason": "responses[0].text: expected 'x', got 'y'",
        },
        {
            "name": "c",
            "id": "c",
            "status": "skipped",
            "passed": True,
            "reason": "single_shard_only",
        },
    ]
    p = _plan(GoldenCasesCheck(), _outputs(tmp_path, rows))
    assert p.columns == {"c00__failed_cases": 1, "c00__ran_cases": 2}
    assert (
        p.failure
        == "1 of 2 golden case(s) failed: b[stream]: responses[0].text: expected 'x', got 'y'"
    )
    assert p.expectations[0].max_value == 0
    assert p.observed == "1 passed, 1 failed, 0 unchecked, 1 skipped"


def test_golden_cases_check_without_results(tmp_path):
    p = _plan(GoldenCasesCheck(), CellOutputs(tmp_path, tmp_path / "x.log", None))
    assert p.columns["c00__failed_cases"] is None  # null fails the expectation
    assert "does not exist" in p.failure
