"""A real OTLP/HTTP trace receiver for the tests: decodes each
ExportTraceServiceRequest with the `opentelemetry-proto` package and prints
one JSON line per span on stdout. Prints `listening PORT` first (it binds
port 0)."""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


class Receiver(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1/traces":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for rs in request.resource_spans:
            resource = attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for span in ss.spans:
                    line = {
                        "content_type": self.headers.get("Content-Type"),
                        "resource": resource,
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "name": span.name,
                        "kind": span.kind,
                        "attributes": attributes(span.attributes),
                        "links": [
                            {"trace_id": l.trace_id.hex(), "span_id": l.span_id.hex()}
                            for l in span.links
                        ],
                        "start": span.start_time_unix_nano,
                        "end": span.end_time_unix_nano,
                    }
                    print(json.dumps(line), flush=True)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
print(f"listening {server.server_address[1]}", flush=True)
try:
    server.serve_forever()
except KeyboardInterrupt:
    sys.exit(0)
