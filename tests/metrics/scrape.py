"""Reading a service's /metrics over HTTP, as Prometheus does."""

from __future__ import annotations

import urllib.request
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

SCRAPE_TIMEOUT_S = 10.0


class Samples(dict):
    """{(sample name, ((label, value), ...)): value} of one scrape."""

    def value(self, name: str, **labels: str) -> float:
        """The sample's value; 0 for a labelled child not created yet (a counter that has not moved)."""
        return self.get((name, tuple(sorted(labels.items()))), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """The sum over the samples of `name` whose labels include `labels`."""
        return sum(v for (n, ls), v in self.items() if n == name and labels.items() <= dict(ls).items())

    def names(self) -> set[str]:
        return {n for n, _ in self}


def samples_of(text: str) -> Samples:
    out = Samples()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        return samples_of(response.read().decode())


def delta(before: Mapping, after: Samples, name: str, **labels: str) -> float:
    return after.total(name, **labels) - before.total(name, **labels)
