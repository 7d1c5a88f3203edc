#!/usr/bin/env python3
"""Parses a /metrics exposition read from stdin with the official Prometheus Python client
(`prometheus-client`): `openmetrics` (its OpenMetrics 1.0 parser, which checks the format
strictly, `# EOF` included) or `prometheus` (its text format parser), named by the first
argument. Prints one JSON object: {"families": {name: type}, "samples": [{name, labels,
value, exemplar: {labels, value} | null}]}; a parse error exits 1 with the error.
"""
import json
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
from prometheus_client.parser import text_string_to_metric_families as prometheus


def main():
    fmt = sys.argv[1]
    text = sys.stdin.read()
    parse = openmetrics if fmt == "openmetrics" else prometheus
    try:
        families = list(parse(text))
    except Exception as e:  # the parser's own error, for the test to show
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    out = {"families": {}, "samples": []}
    for f in families:
        out["families"][f.name] = f.type
        for s in f.samples:
            e = s.exemplar
            out["samples"].append({
                "name": s.name,
                "labels": s.labels,
                "value": s.value,
                "exemplar": None if e is None else {"labels": e.labels, "value": e.value},
            })
    print(json.dumps(out))


if __name__ == "__main__":
    main()
