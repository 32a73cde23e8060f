"""A scrape target served by the official Python client (Debian's python3-prometheus-client):
one registry with every metric type, in OpenMetrics when the scraper asks for it and in the
text format 0.0.4 otherwise. Values do not move after start.

    /usr/bin/python3 openmetrics-target.py PORT
"""
import sys
import time

from prometheus_client import (CollectorRegistry, Counter, Enum, Gauge, Histogram, Info,
                               Summary, start_http_server)
from prometheus_client.core import GaugeHistogramMetricFamily

registry = CollectorRegistry()
jobs = Counter("jobs", "Jobs done.", ["queue"], registry=registry)
jobs.labels("a").inc(3)
jobs.labels("b").inc(1, exemplar={"trace_id": "abc"})
Gauge("temp_celsius", 'A "temperature"\\n.', unit="celsius", registry=registry).set(21.5)
latency = Histogram("latency_seconds", "Latency.", ["path"], buckets=[0.1, 1],
                    registry=registry)
latency.labels("/a").observe(0.05)
latency.labels("/a").observe(0.5)
latency.labels("/b").observe(3)
Summary("size_bytes", "Sizes.", registry=registry).observe(10)
Info("build", "Build info.", registry=registry).info({"version": "1.2", "commit": "x"})
Enum("state", "State.", states=["up", "down"], registry=registry).state("up")


class Depth:
    """A gauge histogram, which only a custom collector can produce."""

    def collect(self):
        yield GaugeHistogramMetricFamily("queue_depth", "Depth.",
                                         buckets=[("1", 2), ("+Inf", 5)], gsum_value=7)


registry.register(Depth())
start_http_server(int(sys.argv[1]), addr="127.0.0.1", registry=registry)
while True:
    time.sleep(3600)
