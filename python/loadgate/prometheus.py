"""A ``prometheus_client`` collector for loadgate, for services that already
expose their metrics with that library (``pip install prometheus_client``).

loadgate renders its own metrics (``Monitor.metrics_text()``,
``AdmissionGate.metrics_text()``) from plain atomics at scrape time; this
collector parses that text into ``prometheus_client`` metric families on each
collection, so the names, labels and values are exactly the core's::

    from loadgate.prometheus import register
    register(monitor, gate)          # into prometheus_client's default REGISTRY

Give each gate of one process its own ``metrics_prefix`` so that their
families do not collide.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional, Protocol

try:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry
except ImportError as exc:  # pragma: no cover - exercised without the package
    raise ImportError(
        "loadgate.prometheus needs prometheus_client: pip install prometheus_client"
    ) from exc

__all__ = ["LoadgateCollector", "register"]


class MetricsSource(Protocol):
    """Anything with loadgate's ``metrics_text()``: a Monitor or an AdmissionGate."""

    def metrics_text(self) -> str: ...


class LoadgateCollector(Collector):
    """Collects the metrics of loadgate monitors and gates."""

    def __init__(self, *sources: MetricsSource) -> None:
        for source in sources:
            if not callable(getattr(source, "metrics_text", None)):
                raise TypeError(
                    f"{type(source).__name__} has no metrics_text(): pass Monitors and AdmissionGates"
                )
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        for source in self.sources:
            yield from text_string_to_metric_families(source.metrics_text())

    def describe(self) -> Iterable[Metric]:
        # The families of a live gate or monitor are known only at scrape
        # time (models come and go), so duplicate checks happen per scrape.
        return []


def register(
    *sources: MetricsSource, registry: Optional[CollectorRegistry] = None
) -> LoadgateCollector:
    """Registers a :class:`LoadgateCollector` for `sources` with `registry`
    (``prometheus_client.REGISTRY`` by default) and returns it."""
    collector = LoadgateCollector(*sources)
    (REGISTRY if registry is None else registry).register(collector)
    return collector
