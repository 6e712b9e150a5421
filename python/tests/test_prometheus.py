"""The prometheus_client collector."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import loadgate
from loadgate.prometheus import LoadgateCollector, register


def test_collector_exposes_core_metrics() -> None:
    monitor = loadgate.Monitor()
    monitor.add_worker("m", 1)
    gate = loadgate.AdmissionGate(1, 0)
    held = gate.try_admit()
    with pytest.raises(loadgate.AtCapacity):
        gate.admit_blocking()
    registry = CollectorRegistry()
    collector = register(monitor, gate, registry=registry)
    assert isinstance(collector, LoadgateCollector)
    text = generate_latest(registry).decode()
    assert 'dynamo_frontend_model_workers{model="m"} 1.0' in text
    assert "dynamo_engine_request 1.0" in text
    assert "dynamo_rejection_request_total 1.0" in text
    assert 'dynamo_request_queue_wait_seconds_bucket{le="+Inf"} 0.0' in text
    assert registry.get_sample_value("dynamo_request_queue", {}) == 0
    monitor.add_worker("m", 2)  # collected fresh on every scrape
    assert registry.get_sample_value("dynamo_frontend_model_workers", {"model": "m"}) == 2
    assert held is not None
    held.release()


def test_collector_bad_input() -> None:
    with pytest.raises(TypeError, match="metrics_text"):
        LoadgateCollector(object())  # type: ignore[arg-type]
