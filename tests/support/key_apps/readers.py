"""What Tomcat's and Rack's accessors read, reproduced exactly:

- Tomcat's getParameter: query pairs, then body pairs; a pair with a
  malformed escape is dropped; the first value wins.
- Rack's params: body pairs over query pairs.
- Rack::Utils.unescape of a raw path segment (`+` as a space), as an app that
  splits PATH_INFO does; and the segment as sent.

Prints its port, then answers each request with JSON of those readings and
the X-Rolegate-Role it got.
"""
import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote_plus

MALFORMED = re.compile(r"%(?![0-9a-fA-F]{2})")


def pairs(text):
    for pair in text.split("&"):
        if not pair:
            continue
        name, _, value = pair.partition("=")
        yield name, value


def tomcat_parameter(query, body, name):
    for source in (query, body):
        for k, v in pairs(source):
            if MALFORMED.search(k) or MALFORMED.search(v):
                continue  # Tomcat drops the pair and goes on
            if unquote_plus(k) == name:
                return unquote_plus(v)
    return None


def rack_params(query, body, name):
    found = None
    for source in (query, body):  # the body's value wins
        for k, v in pairs(source):
            if unquote_plus(k) == name:
                found = unquote_plus(v)
    return found


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.answer()

    def do_POST(self):
        self.answer()

    def answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode("latin-1") if length else ""
        if "x-www-form-urlencoded" not in (self.headers.get("Content-Type") or ""):
            body = ""
        path, _, query = self.path.partition("?")
        segments = path.split("/")
        raw = segments[2] if len(segments) > 2 else ""
        out = json.dumps({
            "tomcat": tomcat_parameter(query, body, "id"),
            "rack": rack_params(query, body, "id"),
            "segment_unescaped": unquote_plus(raw),
            "segment_raw": raw,
            "role": self.headers.get("X-Rolegate-Role"),
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
