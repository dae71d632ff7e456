"""Tests that need an accelerator: run by the nightly and on-demand tiers only."""

import os

import pytest

from ci_sample import mean

HAS_ACCELERATOR = bool(os.environ.get("TPU_NAME") or os.environ.get("CUDA_VISIBLE_DEVICES"))


@pytest.mark.accelerator
def test_mean_matches_on_host():
    # The host half of a device-vs-host comparison: runs everywhere.
    assert mean([0.5] * 1024) == 0.5


@pytest.mark.accelerator
@pytest.mark.skipif(not HAS_ACCELERATOR, reason="no accelerator visible")
def test_mean_on_device():
    assert mean([1.0] * 8) == 1.0
