"""An app on the standard library's http.server (HTTP/1.1, a thread per
connection) whose router has the three behaviours the gateway must not be
fooled by:

- it decodes the path and then splits off `?`/`#`, and folds case beyond
  ASCII: `/maintenance` through Python's `re.IGNORECASE` (`ı`, `İ` -> `i`,
  `ſ` -> `s`), `/tasks` through `str.lower()` (the Kelvin sign -> `k`, as
  JavaScript's `toLowerCase` does);
- `/status/{code}` (anywhere in the path) answers the status the client
  picks, 101 included, and
  keeps reading requests on the connection afterwards, as raw Node, Express
  and aiohttp do;
- no handler reads the request body, so a body's bytes are read as the next
  request on the connection (http.server does this; most servers drain or
  close).

Usage: raw_app.py PORT_FILE LOG_FILE NAME. Binds 127.0.0.1 port 0 and writes
the port to PORT_FILE; appends one JSON line per executed request to LOG_FILE.
"""

import json
import os
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

PORT_FILE, LOG_FILE, NAME = sys.argv[1], sys.argv[2], sys.argv[3]
LOCK = threading.Lock()
MAINTENANCE = re.compile(r"^/(?i:maintenance)(/.*)?$")


def route_of(raw_path):
    # Decode first, then split: `%3F` ends the path here.
    path = re.split(r"[?#]", unquote(raw_path, errors="surrogateescape"), maxsplit=1)[0]
    if MAINTENANCE.match(path):
        return "maintenance"
    lowered = path.lower()
    if lowered == "/tasks" or lowered.startswith("/tasks/"):
        return "tasks"
    if path.startswith("/status/"):
        return "status"
    if path == "/healthz":
        return "healthz"
    return "fallback"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def handle_any(self):
        route = route_of(self.path)
        if route != "healthz":
            with LOCK, open(LOG_FILE, "a") as f:
                f.write(json.dumps({
                    "app": NAME,
                    "route": route,
                    "method": self.command,
                    "uri": self.path,
                    "attack": self.headers.get("X-Attack"),
                    "role": self.headers.get("X-Rolegate-Role"),
                    "token": self.headers.get("X-Rolegate-Token"),
                }) + "\n")
        # `/status/{code}` anywhere in the path picks the answer's status.
        status = re.search(r"/status/(\d{3})", self.path)
        code = int(status.group(1)) if status else 200
        self.send_response(code)
        if code == 101:
            self.send_header("Upgrade", self.headers.get("Upgrade", "websocket"))
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            # Keep reading requests on this connection afterwards.
            return
        if code in (204, 304):
            self.end_headers()
            return
        body = f"{NAME} {route}\n".encode()
        self.send_header("X-App", NAME)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_OPTIONS = do_PATCH = do_HEAD = handle_any

    def __getattr__(self, name):
        # Any other method (`get`, extension methods) routes the same way.
        if name.startswith("do_"):
            return self.handle_any
        raise AttributeError(name)


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
with open(PORT_FILE + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(PORT_FILE + ".tmp", PORT_FILE)
server.serve_forever()
