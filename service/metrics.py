"""Prometheus metrics in the text exposition format (no client library needed).

Counters and histograms live in this process (each replica exports its own, as Prometheus
expects); the queue gauges are read from the database at scrape time, so every replica
reports the same, true queue.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Iterable, Sequence

LabelValues = tuple[str, ...]


def _labels(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    escaped = (str(v).replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n") for v in values)
    return "{" + ",".join(f'{n}="{v}"' for n, v in zip(names, escaped, strict=True)) + "}"


class Counter:
    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()):
        self.name, self.help, self.labelnames = name, help_text, tuple(labels)
        self._values: dict[LabelValues, float] = defaultdict(float)
        self._lock = threading.Lock()

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        with self._lock:
            self._values[tuple(labels)] += amount

    def value(self, *labels: str) -> float:
        return self._values.get(tuple(labels), 0.0)

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} counter"
        with self._lock:
            items = sorted(self._values.items())
        for labels, value in items:
            yield f"{self.name}{_labels(self.labelnames, labels)} {value}"


class Histogram:
    def __init__(self, name: str, help_text: str, labels: Sequence[str], buckets: Sequence[float]):
        self.name, self.help, self.labelnames = name, help_text, tuple(labels)
        self.buckets = tuple(sorted(buckets))
        self._counts: dict[LabelValues, list[int]] = {}
        self._sums: dict[LabelValues, float] = defaultdict(float)
        self._lock = threading.Lock()

    def observe(self, value: float, *labels: str) -> None:
        key = tuple(labels)
        with self._lock:
            counts = self._counts.setdefault(key, [0] * (len(self.buckets) + 1))
            counts[bisect.bisect_left(self.buckets, value)] += 1
            self._sums[key] += value

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        with self._lock:
            items = sorted((k, list(v), self._sums[k]) for k, v in self._counts.items())
        names = (*self.labelnames, "le")
        for labels, counts, total in items:
            running = 0
            for bound, count in zip(self.buckets, counts, strict=False):
                running += count
                yield f"{self.name}_bucket{_labels(names, (*labels, repr(bound)))} {running}"
            running += counts[-1]
            yield f"{self.name}_bucket{_labels(names, (*labels, '+Inf'))} {running}"
            yield f"{self.name}_sum{_labels(self.labelnames, labels)} {total}"
            yield f"{self.name}_count{_labels(self.labelnames, labels)} {running}"


def gauge_lines(name: str, help_text: str, labels: Sequence[str], rows: Iterable) -> list[str]:
    """A gauge family from (label values..., value) rows."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    for *values, value in rows:
        lines.append(f"{name}{_labels(labels, values)} {float(value)}")
    return lines


class Metrics:
    """The service's own counters."""

    def __init__(self) -> None:
        self.leases = Counter("pipetune_jobs_leased_total", "Jobs handed to workers", ["gpu"])
        self.results = Counter(
            "pipetune_results_total", "Results posted by workers", ["status", "accepted"]
        )
        self.lease_expiries = Counter(
            "pipetune_lease_expiries_total", "Leases that expired without a result", ["outcome"]
        )
        self.batches = Counter("pipetune_batches_enqueued_total", "Proposal batches enqueued")
        self.tasks_finished = Counter(
            "pipetune_tasks_finished_total", "Tasks that reached an end state", ["state"]
        )
        self.request_seconds = Histogram(
            "pipetune_http_request_duration_seconds",
            "HTTP request latency by route",
            ["method", "route", "status"],
            [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
        )

    def render(self, gauges: list[str]) -> str:
        lines: list[str] = []
        for family in (
            self.leases,
            self.results,
            self.lease_expiries,
            self.batches,
            self.tasks_finished,
            self.request_seconds,
        ):
            lines.extend(family.render())
        lines.extend(gauges)
        return "\n".join(lines) + "\n"
