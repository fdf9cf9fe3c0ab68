"""A small Flask app for tests/hostile_clients.rs: an app as frameworks ship
it, with a real decoding router, put behind a rolegate gateway and attacked.

    python flask_app.py PORTFILE LOGFILE NAME [werkzeug|wsgiref|gunicorn]

The server binds a free port (port 0) and writes it to PORTFILE once it
listens.

Every handler appends one JSON line to LOGFILE before it answers 200: the
route that ran, its decoded params, the X-Rolegate-Role/-Token headers as
seen through `request.headers` and as the WSGI environ keys
HTTP_X_ROLEGATE_ROLE/HTTP_X_ROLEGATE_TOKEN, and every header. Every response
carries `X-App: NAME`, so a test can tell which instance answered.

`werkzeug` (the default) is Werkzeug's threaded development server.
`wsgiref` is the standard library's WSGI server, threaded here; it turns a
header spelled `X_Rolegate_Role` into HTTP_X_ROLEGATE_ROLE exactly as it does
`X-Rolegate-Role` (CGI-style servers merge `_` and `-`), which Werkzeug 3
no longer does: the underscore look-alike attack needs a server that merges.
`gunicorn` is gunicorn with its defaults (one worker, threads): it takes a
`SCRIPT_NAME` header from 127.0.0.1 (its default `forwarded_allow_ips`,
where a sidecar gateway connects from) and strips it from PATH_INFO.
"""

import json
import os
import socket
import sys
import threading

from flask import Flask, request

PORT_FILE = sys.argv[1]
LOG_PATH = sys.argv[2]
NAME = sys.argv[3]
SERVER = sys.argv[4] if len(sys.argv) > 4 else "werkzeug"

ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"]

app = Flask(__name__)
_lock = threading.Lock()


def record(route, **params):
    env = request.environ
    entry = {
        "app": NAME,
        "route": route,
        "params": {k: str(v) for k, v in params.items()},
        "method": request.method,
        "uri": env.get("RAW_URI") or env.get("REQUEST_URI") or request.full_path,
        "path_info": env.get("PATH_INFO"),
        "attack": request.headers.get("X-Attack"),
        "role": request.headers.get("X-Rolegate-Role"),
        "token": request.headers.get("X-Rolegate-Token"),
        "environ_role": env.get("HTTP_X_ROLEGATE_ROLE"),
        "environ_token": env.get("HTTP_X_ROLEGATE_TOKEN"),
        "headers": [[k, v] for k, v in request.headers.items()],
        "environ_http": {k: str(v) for k, v in env.items() if k.startswith("HTTP_")},
    }
    line = json.dumps(entry)
    with _lock:
        with open(LOG_PATH, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    return f"{NAME} {route}\n"


@app.after_request
def tag(response):
    response.headers["X-App"] = NAME
    return response


@app.route("/healthz")
def healthz():
    return "ok\n"


@app.route("/maintenance", methods=ALL_METHODS)
def maintenance_root():
    return record("maintenance_root")


@app.route("/maintenance/<path:rest>", methods=ALL_METHODS)
def maintenance(rest):
    return record("maintenance", rest=rest)


@app.route("/orders/<oid>", methods=ALL_METHODS)
def orders(oid):
    return record("orders", oid=oid)


@app.route("/device-api", methods=ALL_METHODS)
def device_api():
    # A missing `id` is Flask's own 400, before anything is recorded.
    device = request.args["id"]
    return record("device_api", id=device)


@app.route("/", defaults={"anything": ""}, methods=ALL_METHODS)
@app.route("/<path:anything>", methods=ALL_METHODS)
def catch_all(anything):
    return record("fallback", anything=anything)


def report_port(port):
    """Writes the bound port to PORT_FILE, whole or not at all."""
    with open(PORT_FILE + ".tmp", "w") as f:
        f.write(str(port))
    os.rename(PORT_FILE + ".tmp", PORT_FILE)


def serve_wsgiref():
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class Threading(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    server = make_server("127.0.0.1", 0, app, server_class=Threading, handler_class=Quiet)
    report_port(server.server_port)
    server.serve_forever()


def serve_werkzeug():
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, app, threaded=True)
    report_port(server.server_port)
    server.serve_forever()


def serve_gunicorn():
    from gunicorn.app.base import BaseApplication

    # gunicorn binds no port 0 it could report: it serves a socket bound
    # here, passed by descriptor (inherited by its worker).
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.set_inheritable(True)
    report_port(sock.getsockname()[1])

    class Server(BaseApplication):
        def load_config(self):
            self.cfg.set("bind", f"fd://{sock.fileno()}")
            self.cfg.set("workers", 1)
            self.cfg.set("threads", 8)
            self.cfg.set("worker_class", "gthread")
            self.cfg.set("loglevel", "warning")

        def load(self):
            return app

    Server().run()


if __name__ == "__main__":
    if SERVER == "wsgiref":
        serve_wsgiref()
    elif SERVER == "werkzeug":
        serve_werkzeug()
    elif SERVER == "gunicorn":
        serve_gunicorn()
    else:
        sys.exit(f"unknown server {SERVER!r}: werkzeug, wsgiref or gunicorn")
