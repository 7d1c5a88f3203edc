#!/usr/bin/env python3
"""An OTLP/HTTP receiver for epode-sidecar's tests, decoding with the official schema
(the `opentelemetry-proto` package): what the sidecar and the instrumented Python server
export, kept in memory and shown as JSON, with faults to inject.

  $D/py/bin/python tests/peers/otlp_receiver.py [--port 0]
  prints "READY <port>", then serves on 127.0.0.1:
    POST /v1/traces   ExportTraceServiceRequest (application/x-protobuf), answered as the
                      current mode says
    POST /v1/metrics  ExportMetricsServiceRequest, the same
    GET  /spans       every span received: {traceId, spanId, parentSpanId, name, kind,
                      attributes, events, links, status, resource, raw}; `raw` is the
                      request's bytes as hex (a test greps it for values it sent)
    GET  /metrics     every metric received: {name, unit, scope, kind, monotonic, temporality,
                      points: [{attributes, count, value, startNs, bucketCounts, bounds,
                      exemplars: [{traceId, spanId, value}]}]}
    GET  /metrics-raw each metrics request's bytes as hex
    GET  /stats       {"requests": N, "traces": N, "metrics": N}
    POST /mode/<m>    ok (200), 500, 429 (Retry-After: 1), hang (never answers), drop
                      (closes the connection)
"""

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

LOCK = threading.Lock()
SPANS = []
METRICS = []
METRICS_RAW = []
STATS = {"requests": 0, "traces": 0, "metrics": 0}
MODE = {"mode": "ok"}


def any_value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind) if kind else None


def attrs(kvs):
    return {kv.key: any_value(kv.value) for kv in kvs}


def span_json(span, resource, raw):
    return {
        "traceId": span.trace_id.hex(),
        "spanId": span.span_id.hex(),
        "parentSpanId": span.parent_span_id.hex(),
        "name": span.name,
        "kind": Span.SpanKind.Name(span.kind),
        "attributes": attrs(span.attributes),
        "events": [{"name": e.name, "attributes": attrs(e.attributes)} for e in span.events],
        "links": [{"traceId": l.trace_id.hex(), "spanId": l.span_id.hex(), "attributes": attrs(l.attributes)} for l in span.links],
        "status": {"code": Status.StatusCode.Name(span.status.code), "message": span.status.message},
        "startNs": span.start_time_unix_nano,
        "endNs": span.end_time_unix_nano,
        "resource": resource,
        "raw": raw,
    }


def metric_json(m, scope):
    d = MessageToDict(m)
    points = []
    kind = next((k for k in ("histogram", "sum", "gauge", "exponentialHistogram") if k in d), None)
    data = d.get(kind, {}) if kind else {}
    raw_points = list(getattr(m, m.WhichOneof("data")).data_points) if m.WhichOneof("data") else []
    for p, raw in zip(data.get("dataPoints", []), raw_points):
        value = p.get("asDouble", p.get("asInt"))
        points.append({
            "attributes": {a["key"]: next(iter(a["value"].values())) for a in p.get("attributes", [])},
            "count": int(p.get("count", 0)),
            "value": None if value is None else float(value),
            "startNs": int(p.get("startTimeUnixNano", 0)),
            "bucketCounts": [int(c) for c in p.get("bucketCounts", [])],
            "bounds": p.get("explicitBounds", []),
            "exemplars": [
                {"traceId": e.trace_id.hex(), "spanId": e.span_id.hex(), "value": e.as_double}
                for e in getattr(raw, "exemplars", [])
            ],
        })
    return {
        "name": m.name,
        "unit": m.unit,
        "scope": scope,
        "kind": kind,
        "monotonic": data.get("isMonotonic", False),
        "temporality": data.get("aggregationTemporality"),
        "points": points,
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def answer(self, status, body=b"", ctype="application/x-protobuf", extra=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        with LOCK:
            if self.path == "/spans":
                body = json.dumps(SPANS)
            elif self.path == "/metrics":
                body = json.dumps(METRICS)
            elif self.path == "/metrics-raw":
                body = json.dumps(METRICS_RAW)
            elif self.path == "/stats":
                body = json.dumps(STATS)
            else:
                return self.answer(404, b"{}", "application/json")
        self.answer(200, body.encode(), "application/json")

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(n)
        if self.path.startswith("/mode/"):
            MODE["mode"] = self.path[len("/mode/"):]
            return self.answer(200, b"{}", "application/json")
        with LOCK:
            STATS["requests"] += 1
        mode = MODE["mode"]
        if mode == "hang":
            time.sleep(3600)
            return
        if mode == "drop":
            self.close_connection = True
            self.connection.close()
            return
        if mode == "500":
            return self.answer(500, b"broken", "text/plain")
        if mode == "429":
            return self.answer(429, b"slow down", "text/plain", [("Retry-After", "1")])
        if self.path == "/v1/traces":
            req = ExportTraceServiceRequest()
            req.ParseFromString(data)
            with LOCK:
                for rs in req.resource_spans:
                    resource = attrs(rs.resource.attributes)
                    for ss in rs.scope_spans:
                        for span in ss.spans:
                            SPANS.append(span_json(span, resource, data.hex()))
                            STATS["traces"] += 1
            return self.answer(200, ExportTraceServiceResponse().SerializeToString())
        if self.path == "/v1/metrics":
            req = ExportMetricsServiceRequest()
            req.ParseFromString(data)
            with LOCK:
                for rm in req.resource_metrics:
                    for sm in rm.scope_metrics:
                        for m in sm.metrics:
                            METRICS.append(metric_json(m, sm.scope.name))
                STATS["metrics"] += 1
                METRICS_RAW.append(data.hex())
            return self.answer(200, ExportMetricsServiceResponse().SerializeToString())
        self.answer(404, b"", "text/plain")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"READY {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
