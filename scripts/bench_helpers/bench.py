#!/usr/bin/env python3
"""The rolegate benchmark (driven by scripts/bench, which installs the tools
and builds the binaries first). Writes docs/benchmarks.md.

Sections:
  1. request path: direct / rolegate holder / rolegate forwarded / nginx 1 hop /
     nginx 2 hops / HAProxy 1 hop; 1 KiB and 64 KiB; saturation (wrk) and a
     fixed moderate rate (openloop, open-loop, coordinated-omission corrected)
  2. SSE: N concurrent streams through the forwarded path; gateway RSS per
     stream and event delivery latency while they are open
  3. handover (SIGTERM) and failover (kill -9), PostgreSQL store
  4. store cost: 10 instances, 1 / 64 / 1024 roles, store calls per instance
     per tick and server CPU, on PostgreSQL, Redis and etcd
  5. footprint: idle RSS with 1024 roles, binary size

Every process this script starts is recorded and stopped on exit (also on
Ctrl-C / SIGTERM). Everything listens on 127.0.0.1 only.
"""

import argparse
import http.client
import json
import os
import platform
import random
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg):
    print("[bench %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http_get(host, port, path, timeout=2.0, conn=None):
    """GET; returns (status, body bytes). With `conn`, reuses that connection."""
    own = conn is None
    c = conn or http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        if own:
            c.close()


def try_get(host, port, path, timeout=1.0):
    try:
        return http_get(host, port, path, timeout)
    except (OSError, http.client.HTTPException):
        return None, b""


def wait_until(what, fn, timeout, interval=0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(interval)
    raise RuntimeError("timed out after %.1fs waiting for %s" % (timeout, what))


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_ticks(pid):
    """utime + stime of one process, in clock ticks (0 if gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except OSError:
        return 0


def children_of(ppid):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == ppid:
                out.append(int(d))
        except OSError:
            continue
    return out


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def spread(xs):
    xs = [x for x in xs if x is not None]
    return (min(xs), max(xs)) if xs else (None, None)


def pctl(sorted_xs, p):
    if not sorted_xs:
        return None
    k = max(1, min(len(sorted_xs), int(-(-p / 100.0 * len(sorted_xs) // 1))))
    return sorted_xs[k - 1]


def fmt_num(v, digits=0):
    if v is None:
        return "–"
    if digits == 0:
        return "{:,}".format(int(round(v)))
    return ("{:,.%df}" % digits).format(v)


def fmt_us(v):
    """Microseconds, shown as µs below 1 ms, else ms."""
    if v is None:
        return "–"
    if v < 1000:
        return "%.0f µs" % v
    if v < 100000:
        return "%.2f ms" % (v / 1000.0)
    return "%.0f ms" % (v / 1000.0)


def fmt_ms(v):
    if v is None:
        return "–"
    return "%.1f ms" % v if v < 100 else "%.0f ms" % v


def fmt_ratio(v):
    return "–" if v is None else "%.2f×" % v


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


# ---------------------------------------------------------------------------
# Processes


class Procs:
    """Every child this script starts, so all of them can be stopped."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.live = []  # (name, Popen)

    def spawn(self, name, argv, cpu=None, env=None, stdout=None):
        logf = open(os.path.join(self.workdir, name + ".log"), "ab")
        cmd = (["taskset", "-c", cpu] if cpu is not None else []) + argv
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        p = subprocess.Popen(cmd, stdout=stdout if stdout is not None else logf, stderr=logf,
                             stdin=subprocess.DEVNULL, env=full_env, cwd=self.workdir)
        logf.close()
        self.live.append((name, p))
        return p

    def stop(self, p, sig=signal.SIGTERM, timeout=5.0):
        if p.poll() is None:
            try:
                p.send_signal(sig)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.live = [(n, q) for (n, q) in self.live if q is not p]

    def stop_all(self):
        for _, p in list(self.live):
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5
        for _, p in list(self.live):
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    pass
        self.live = []

    def check_alive(self, p, name):
        if p.poll() is not None:
            tail = ""
            try:
                with open(os.path.join(self.workdir, name + ".log"), "rb") as f:
                    tail = f.read()[-2000:].decode("utf-8", "replace")
            except OSError:
                pass
            raise RuntimeError("%s exited with %s:\n%s" % (name, p.returncode, tail))


# ---------------------------------------------------------------------------
# Config writers


NGINX_COMMON = """worker_processes 1;
daemon off;
master_process on;
user root;
pid {dir}/{name}.pid;
error_log {dir}/{name}.error.log warn;
events {{ worker_connections 16384; }}
http {{
  access_log off;
  client_body_temp_path {dir}/tmp-{name}/body;
  proxy_temp_path {dir}/tmp-{name}/proxy;
  fastcgi_temp_path {dir}/tmp-{name}/fastcgi;
  uwsgi_temp_path {dir}/tmp-{name}/uwsgi;
  scgi_temp_path {dir}/tmp-{name}/scgi;
  keepalive_requests 1000000;
  keepalive_timeout 120s;
  tcp_nodelay on;
{body}
}}
"""


def nginx_upstream_conf(d, name, port):
    body = """  sendfile on;
  open_file_cache max=64;
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    root {dir}/www;
    default_type application/octet-stream;
    # handover section: /gwA/... answers "A <token>", so a poller sees which
    # gateway's upstream served the request and under which lease token.
    location ~ ^/gw(\\w+)/ {{
      default_type text/plain;
      return 200 "$1 $http_x_rolegate_token\\n";
    }}
  }}""".format(port=port, dir=d)
    return NGINX_COMMON.format(dir=d, name=name, body=body)


def nginx_proxy_conf(d, name, port, to_port):
    body = """  upstream next {{
    server 127.0.0.1:{to};
    keepalive 256;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
  }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{
      proxy_pass http://next;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
      # Enough memory buffers for a 64 KiB answer: never a temp file.
      proxy_buffer_size 16k;
      proxy_buffers 8 16k;
    }}
  }}""".format(port=port, to=to_port)
    return NGINX_COMMON.format(dir=d, name=name, body=body)


def haproxy_conf(d, port, to_port):
    return """global
  nbthread 1
  maxconn 8000
  pidfile {dir}/haproxy.pid
defaults
  mode http
  timeout connect 2s
  timeout client 60s
  timeout server 60s
  timeout http-keep-alive 120s
  option http-keep-alive
  option forwardfor
  http-reuse always
  maxconn 8000
frontend fe
  bind 127.0.0.1:{port}
  default_backend be
backend be
  server up 127.0.0.1:{to} maxconn 10000
""".format(dir=d, port=port, to=to_port)


def rolegate_conf(name, port, admin, upstream, store_kind, store_url, table="rolegate_role_leases",
                  roles=("bench",), partition=0, timings=("15s", "5s", "2s"), route=True,
                  drain="2s", peer_protocol=None, close_after_body=False, hold_timeout=None):
    lines = [
        "instance:",
        "  name: %s" % name,
        "  advertise: http://127.0.0.1:%d" % port,
        "listen: 127.0.0.1:%d" % port,
        "admin_listen: 127.0.0.1:%d" % admin,
        "upstream:",
        "  url: %s" % upstream,
        "  close_after_body: %s" % ("true" if close_after_body else "false"),
        "store:",
        "  kind: %s" % store_kind,
        "  url: %s" % store_url,
        "  table: %s" % table,
        "lease:",
        "  duration: %s" % timings[0],
        "  renew_interval: %s" % timings[1],
        "  safety_margin: %s" % timings[2],
    ]
    if roles:
        lines.append("roles:")
        lines += ["  - name: %s" % r for r in roles]
    if partition:
        lines += ["partitions:", "  - name: p", "    count: %d" % partition]
    if route and roles:
        lines += ["routes:", "  - prefixes: [/r]", "    role: %s" % roles[0]]
    elif route and partition:
        lines += ["routes:", "  - prefixes: [/p]", "    partition: p", "    key: { path_segment: last }"]
    lines += ["shutdown:", "  drain_timeout: %s" % drain]
    if peer_protocol:
        lines += ["peers:", "  protocol: %s" % peer_protocol]
    if hold_timeout:
        lines += ["proxy:", "  hold_timeout: %s" % hold_timeout]
    return "\n".join(lines) + "\n"


WRK_POST_LUA = """
wrk.method = "POST"
wrk.body = string.rep("x", 1024)
wrk.headers["Content-Type"] = "application/octet-stream"
"""

WRK_LUA = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d,"p50":%.1f,"p90":%.1f,"p99":%.1f,"p999":%.1f,"max":%.1f}\\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9), latency.max))
end
"""


# ---------------------------------------------------------------------------


class Bench:
    def __init__(self, args):
        self.a = args
        self.quick = args.quick
        self.workdir = tempfile.mkdtemp(prefix="rolegate-bench.")
        os.chmod(self.workdir, 0o755)
        self.procs = Procs(self.workdir)
        self.bin = args.rolegate
        self.openloop = args.openloop
        ncpu = os.cpu_count() or 1
        self.cpu_gen = "0"
        self.cpu_srv = "1" if ncpu >= 2 else "0"
        self.results = {"quick": self.quick, "sections": {}, "notes": []}
        self.section_times = {}
        self.pg = None
        self.server_dirs = []  # etcd data directories, removed on exit
        self.rg_env = {"TOKIO_WORKER_THREADS": "1", "RUST_LOG": "warn"}
        self.rng = random.Random(6)

    # -- helpers ----------------------------------------------------------------

    def write(self, name, text):
        path = os.path.join(self.workdir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def start_rolegate(self, name, conf_text, env=None, cpu=None, args=(), bin=None):
        path = self.write(name + ".yaml", conf_text)
        e = dict(self.rg_env)
        if env:
            e.update(env)
        p = self.procs.spawn(name, [bin or self.bin, "run", "--config", path] + list(args),
                             cpu=cpu or self.cpu_srv, env=e)
        return p

    def wait_ready(self, p, name, admin, timeout=20):
        def ok():
            self.procs.check_alive(p, name)
            st, _ = try_get("127.0.0.1", admin, "/readyz", 0.5)
            return st == 200
        wait_until("%s /readyz" % name, ok, timeout, 0.005)

    def leases(self, admin, timeout=2.0):
        st, body = http_get("127.0.0.1", admin, "/leases", timeout)
        if st != 200:
            raise RuntimeError("/leases answered %s" % st)
        return json.loads(body)

    def held_count(self, admin):
        try:
            return sum(1 for r in self.leases(admin)["roles"] if r["held_here"])
        except (OSError, http.client.HTTPException, ValueError, RuntimeError):
            return -1

    def start_nginx(self, name, conf, cpu=None):
        for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            os.makedirs(os.path.join(self.workdir, "tmp-" + name, sub), exist_ok=True)
        path = self.write(name + ".conf", conf)
        return self.procs.spawn(name, ["nginx", "-c", path, "-p", self.workdir + "/"], cpu=cpu or self.cpu_srv)

    def wait_port(self, port, name, p=None, timeout=10):
        def ok():
            if p is not None:
                self.procs.check_alive(p, name)
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                return True
            except OSError:
                return False
        wait_until("%s on port %d" % (name, port), ok, timeout, 0.01)

    # -- PostgreSQL -------------------------------------------------------------

    def start_pg(self):
        if self.pg:
            return self.pg
        bins = sorted([d for d in os.listdir("/usr/lib/postgresql")], key=lambda v: [int(x) for x in re.findall(r"\d+", v)])
        pg_bin = "/usr/lib/postgresql/%s/bin" % bins[-1]
        d = tempfile.mkdtemp(prefix="rolegate-bench-pg.")
        os.chmod(d, 0o755)
        shutil.chown(d, "postgres", "postgres")
        port = free_port()
        run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run(run_as + [pg_bin + "/initdb", "-A", "trust", "-U", "postgres", "-D", d + "/data"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pg = {"bin": pg_bin, "dir": d, "port": port, "run_as": run_as,
                   "url": "postgres://postgres@127.0.0.1:%d/postgres" % port}
        # Started through pg_ctl (it daemonizes), pinned to the server core.
        subprocess.run(["taskset", "-c", self.cpu_srv] + run_as + [
            pg_bin + "/pg_ctl", "-D", d + "/data", "-l", d + "/server.log", "-o",
            "-p %d -k /tmp -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300" % port,
            "-w", "start"], check=True, stdout=subprocess.DEVNULL)
        with open(d + "/data/postmaster.pid") as f:
            self.pg["pid"] = int(f.readline())
        return self.pg

    def stop_pg(self):
        if not self.pg:
            return
        subprocess.run(self.pg["run_as"] + [self.pg["bin"] + "/pg_ctl", "-D", self.pg["dir"] + "/data",
                                            "-m", "immediate", "-w", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(self.pg["dir"], ignore_errors=True)
        self.pg = None

    def psql(self, sql):
        out = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(self.pg["port"]), "-U", "postgres",
                              "-d", "postgres", "-Atqc", sql], capture_output=True, text=True, timeout=20)
        if out.returncode != 0:
            raise RuntimeError("psql failed: " + out.stderr)
        return out.stdout.strip()

    def pg_cpu_ticks(self):
        pid = self.pg["pid"]
        return cpu_ticks(pid) + sum(cpu_ticks(c) for c in children_of(pid))

    # -- Redis and etcd (plain child processes, pinned to the server core) -------

    def start_redis(self):
        port = free_port()
        p = self.procs.spawn("redis", ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                       "--save", "", "--appendonly", "no"], cpu=self.cpu_srv)

        def pong():
            self.procs.check_alive(p, "redis")
            try:
                with socket.create_connection(("127.0.0.1", port), 0.5) as c:
                    c.sendall(b"PING\r\n")
                    return c.recv(64).startswith(b"+PONG")
            except OSError:
                return False
        wait_until("redis-server PONG", pong, 15, 0.02)
        return {"proc": p, "pid": p.pid, "port": port, "url": "redis://127.0.0.1:%d" % port}

    def start_etcd(self):
        # Data on tmpfs when there is one: etcd 3.4 has no switch to turn fsync off, and
        # PostgreSQL runs with fsync=off and Redis without persistence here.
        shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        d = tempfile.mkdtemp(prefix="rolegate-bench-etcd.", dir=shm)
        self.server_dirs.append(d)
        port = free_port()
        peer = free_port()
        for _ in range(20):
            if peer != port:
                break
            peer = free_port()
        client, peer_url = "http://127.0.0.1:%d" % port, "http://127.0.0.1:%d" % peer
        p = self.procs.spawn("etcd", [
            "etcd", "--name", "b", "--data-dir", d + "/data",
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", "b=" + peer_url, "--logger", "zap", "--log-level", "warn"], cpu=self.cpu_srv)

        def healthy():
            self.procs.check_alive(p, "etcd")
            st, body = try_get("127.0.0.1", port, "/health", 0.5)
            return st == 200 and b'"true"' in body
        wait_until("etcd /health", healthy, 30, 0.05)
        return {"proc": p, "pid": p.pid, "port": port, "url": client, "dir": d}

    def stop_server(self, srv):
        self.procs.stop(srv["proc"])
        if srv.get("dir"):
            shutil.rmtree(srv["dir"], ignore_errors=True)
            self.server_dirs = [x for x in self.server_dirs if x != srv["dir"]]

    # -- section 1: request path ------------------------------------------------

    def wrk(self, url, seconds, conns, cpu=None, post_1k=False):
        lua = os.path.join(self.workdir, "report-post.lua" if post_1k else "report.lua")
        if not os.path.exists(lua):
            self.write(os.path.basename(lua), (WRK_POST_LUA if post_1k else "") + WRK_LUA)
        out = subprocess.run(["taskset", "-c", cpu or self.cpu_gen, "wrk", "-t1", "-c%d" % conns, "-d%ds" % seconds,
                              "--timeout", "5s", "-s", lua, url], capture_output=True, text=True,
                             timeout=seconds + 30)
        m = re.search(r"WRKJSON (\{.*\})", out.stdout)
        if not m:
            raise RuntimeError("wrk printed no result:\n%s\n%s" % (out.stdout, out.stderr))
        r = json.loads(m.group(1))
        r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
        r["errors"] = r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"]
        return r

    def openloop_run(self, url, rate, seconds, warmup):
        out = subprocess.run(["taskset", "-c", self.cpu_gen, self.openloop, "--url", url, "--rate", str(rate),
                              "--duration", str(seconds), "--warmup", str(warmup), "--connections", "64"],
                             capture_output=True, text=True, timeout=seconds + warmup + 30)
        if out.returncode != 0:
            raise RuntimeError("openloop failed: " + out.stderr)
        return json.loads(out.stdout)

    def section_request_path(self):
        q = self.quick
        rounds = self.a.rounds or (2 if q else 3)
        sat_s = 1 if q else 3
        ol_s = 1.0 if q else 3.0
        ol_warm = 0.25 if q else 0.5
        conns = 64
        d = self.workdir
        www = os.path.join(d, "www", "r")
        os.makedirs(www, exist_ok=True)
        sizes = {"1 KiB": 1024, "64 KiB": 65536}
        for label, n in sizes.items():
            with open(os.path.join(www, str(n // 1024) + "k"), "wb") as f:
                f.write((b"0123456789abcdef" * (n // 16 + 1))[:n])

        up = free_port()
        p_up = self.start_nginx("upstream", nginx_upstream_conf(d, "upstream", up))
        self.wait_port(up, "upstream", p_up)

        ports = {k: free_port() for k in ("holder", "holder_admin", "fwd", "fwd_admin", "ng1", "ng2a", "ng2b", "ha")}
        db = "sqlite://%s/req-leases.db" % d
        upstream_url = "http://127.0.0.1:%d" % up
        p_h = self.start_rolegate("rg-holder", rolegate_conf("holder", ports["holder"], ports["holder_admin"],
                                                              upstream_url, "sqlite", db))
        self.wait_ready(p_h, "rg-holder", ports["holder_admin"])
        wait_until("holder holds `bench`", lambda: self.held_count(ports["holder_admin"]) == 1, 20)
        p_f = self.start_rolegate("rg-forwarder", rolegate_conf("forwarder", ports["fwd"], ports["fwd_admin"],
                                                                 upstream_url, "sqlite", db))
        self.wait_ready(p_f, "rg-forwarder", ports["fwd_admin"])

        p1 = self.start_nginx("nginx-1hop", nginx_proxy_conf(d, "nginx-1hop", ports["ng1"], up))
        p2b = self.start_nginx("nginx-2hop-b", nginx_proxy_conf(d, "nginx-2hop-b", ports["ng2b"], up))
        p2a = self.start_nginx("nginx-2hop-a", nginx_proxy_conf(d, "nginx-2hop-a", ports["ng2a"], ports["ng2b"]))
        hcfg = self.write("haproxy.cfg", haproxy_conf(d, ports["ha"], up))
        chk = subprocess.run(["haproxy", "-c", "-f", hcfg], capture_output=True, text=True)
        if chk.returncode != 0:
            raise RuntimeError("haproxy config refused: " + chk.stdout + chk.stderr)
        p_ha = self.procs.spawn("haproxy", ["haproxy", "-db", "-f", hcfg], cpu=self.cpu_srv)
        for port, name, p in ((ports["ng1"], "nginx-1hop", p1), (ports["ng2a"], "nginx-2hop-a", p2a),
                              (ports["ng2b"], "nginx-2hop-b", p2b), (ports["ha"], "haproxy", p_ha)):
            self.wait_port(port, name, p)

        # The processes of each contender's proxy (not the shared upstream),
        # for CPU time per request.
        cpu_pids = {
            "direct": [], "rolegate holder": [p_h.pid], "rolegate forwarded": [p_f.pid, p_h.pid],
            "nginx 1 hop": [p1.pid], "nginx 2 hops": [p2a.pid, p2b.pid], "HAProxy 1 hop": [p_ha.pid],
        }
        # --compare BIN=LABEL (repeatable): other rolegate builds as more
        # contenders, each with its own holder and forwarder on a store of
        # their own, interleaved with the others in every round.
        compared = []
        for i, spec in enumerate(self.a.compare):
            cbin, _, label = spec.partition("=")
            label = label or "compared %d" % (i + 1)
            cports = {k: free_port() for k in ("holder", "holder_admin", "fwd", "fwd_admin")}
            cdb = "sqlite://%s/req-leases-compare-%d.db" % (d, i)
            p_ch = self.start_rolegate("rg-compare-%d-holder" % i, rolegate_conf(
                "compare-%d-holder" % i, cports["holder"], cports["holder_admin"], upstream_url, "sqlite", cdb),
                bin=cbin)
            self.wait_ready(p_ch, "rg-compare-%d-holder" % i, cports["holder_admin"])
            wait_until("%s holder holds `bench`" % label, lambda: self.held_count(cports["holder_admin"]) == 1, 20)
            p_cf = self.start_rolegate("rg-compare-%d-forwarder" % i, rolegate_conf(
                "compare-%d-forwarder" % i, cports["fwd"], cports["fwd_admin"], upstream_url, "sqlite", cdb),
                bin=cbin)
            self.wait_ready(p_cf, "rg-compare-%d-forwarder" % i, cports["fwd_admin"])
            cpu_pids[label + " holder"] = [p_ch.pid]
            cpu_pids[label + " forwarded"] = [p_cf.pid, p_ch.pid]
            compared += [(label + " holder", 1, cports["holder"]), (label + " forwarded", 2, cports["fwd"])]
            self.results["notes"].append("`%s holder` and `%s forwarded` run %s (--compare)." % (label, label, cbin))

        def proxy_ticks(name):
            return sum(cpu_ticks(p) + sum(cpu_ticks(c) for c in children_of(p)) for p in cpu_pids[name])

        def up_ticks():
            return cpu_ticks(p_up.pid) + sum(cpu_ticks(c) for c in children_of(p_up.pid))

        contenders = [
            ("direct", 0, up),
            ("rolegate holder", 1, ports["holder"]),
            ("rolegate forwarded", 2, ports["fwd"]),
            ("nginx 1 hop", 1, ports["ng1"]),
            ("nginx 2 hops", 2, ports["ng2a"]),
            ("HAProxy 1 hop", 1, ports["ha"]),
        ] + compared
        # Sanity: every contender answers both sizes with the right length, and
        # the rolegate paths reach the upstream as the holder.
        for name, _, port in contenders:
            for n in sizes.values():
                st, body = http_get("127.0.0.1", port, "/r/%dk" % (n // 1024))
                if st != 200 or len(body) != n:
                    raise RuntimeError("%s: /r/%dk answered %s with %d bytes" % (name, n // 1024, st, len(body)))
        self.results["request_path_processes"] = {
            "rolegate holder": [p_h.pid], "rolegate forwarded": [p_f.pid, p_h.pid]}

        log("request path: warm-up")
        for name, _, port in contenders:
            for n in sizes.values():
                self.wrk("http://127.0.0.1:%d/r/%dk" % (port, n // 1024), 1, conns)
        rss0 = {"holder": rss_kib(p_h.pid), "forwarder": rss_kib(p_f.pid)}

        sat = {(c[0], s): [] for c in contenders for s in sizes}
        for rnd in range(rounds):
            order = contenders[rnd % len(contenders):] + contenders[:rnd % len(contenders)]
            if rnd % 2:
                order = order[::-1]
            for size in sizes:
                for name, _, port in order:
                    url = "http://127.0.0.1:%d/r/%dk" % (port, sizes[size] // 1024)
                    c0, u0 = proxy_ticks(name), up_ticks()
                    r = self.wrk(url, sat_s, conns)
                    c1, u1 = proxy_ticks(name), up_ticks()
                    r["proxy_cpu_us_per_req"] = (c1 - c0) / CLK_TCK * 1e6 / max(1, r["requests"])
                    r["upstream_cpu_us_per_req"] = (u1 - u0) / CLK_TCK * 1e6 / max(1, r["requests"])
                    sat[(name, size)].append(r)
                    log("saturation round %d %-19s %-6s %9.0f req/s p99 %s errors %d" % (
                        rnd + 1, name, size, r["rps"], fmt_us(r["p99"]), r["errors"]))
                    for p, n in ((p_h, "rg-holder"), (p_f, "rg-forwarder")):
                        self.procs.check_alive(p, n)

        rates = {}
        for size in sizes:
            slowest = min(med([r["rps"] for r in sat[(c[0], size)]]) for c in contenders)
            rate = self.a.rate or slowest * 0.4
            mag = 10 ** max(0, len(str(int(rate))) - 2)
            rates[size] = max(100, int(rate // mag * mag))
        fixed = {(c[0], s): [] for c in contenders for s in sizes}
        for rnd in range(rounds):
            order = contenders[rnd % len(contenders):] + contenders[:rnd % len(contenders)]
            if rnd % 2:
                order = order[::-1]
            for size in sizes:
                for name, _, port in order:
                    url = "http://127.0.0.1:%d/r/%dk" % (port, sizes[size] // 1024)
                    r = self.openloop_run(url, rates[size], ol_s, ol_warm)
                    fixed[(name, size)].append(r)
                    log("fixed rate %d/s round %d %-19s %-6s p50 %s p99 %s p99.9 %s errors %d unsent %d" % (
                        rates[size], rnd + 1, name, size, fmt_us(r["p50_us"]), fmt_us(r["p99_us"]),
                        fmt_us(r["p999_us"]), r["errors"] + r["non2xx"], r["unsent"]))

        # Gateway memory after all that traffic, with /metrics never scraped.
        rss1 = {"holder": rss_kib(p_h.pid), "forwarder": rss_kib(p_f.pid)}
        served = {
            "holder": sum(r["requests"] for k, v in sat.items() if k[0].startswith("rolegate") for r in v)
            + sum(r["completed"] for k, v in fixed.items() if k[0].startswith("rolegate") for r in v),
            "forwarder": sum(r["requests"] for k, v in sat.items() if k[0] == "rolegate forwarded" for r in v)
            + sum(r["completed"] for k, v in fixed.items() if k[0] == "rolegate forwarded" for r in v),
        }
        http_get("127.0.0.1", ports["holder_admin"], "/metrics", 10)
        http_get("127.0.0.1", ports["fwd_admin"], "/metrics", 10)
        for p in (p_f, p_h, p1, p2a, p2b, p_ha, p_up):
            self.procs.stop(p)
        for name, p in list(self.procs.live):
            if name.startswith("rg-compare"):
                self.procs.stop(p)
        self.results["sections"]["request_path"] = {
            "gateway_rss_kib_before": rss0, "gateway_rss_kib_after": rss1, "gateway_requests": served,
            "rounds": rounds, "sat_seconds": sat_s, "fixed_seconds": ol_s, "fixed_warmup": ol_warm,
            "wrk_connections": conns, "rates": rates, "sizes": list(sizes),
            "contenders": [(c[0], c[1]) for c in contenders],
            "sat": {"%s|%s" % k: v for k, v in sat.items()},
            "fixed": {"%s|%s" % k: v for k, v in fixed.items()},
        }

    # -- section 2: SSE ---------------------------------------------------------

    def section_sse(self):
        requested = self.a.streams or 10000
        # Each gateway holds two descriptors per stream (client side and peer
        # side); a process can have at most RLIMIT_NOFILE of them, and a
        # gateway fits proxy.max_connections to a third of it, less 64 (a
        # client connection may hold two upstream descriptors). Streams
        # beyond that would wait in the listen backlog.
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        n = min(requested, (nofile - 300) // 2, (nofile - 64) // 3 - 5)
        if n < requested:
            self.results["notes"].append(
                "SSE: %d streams instead of %d: the open-file limit is %d per process and could not be "
                "raised (no CAP_SYS_RESOURCE here), and a gateway serves at most a third of it, less 64, "
                "as connections (`proxy.max_connections` is fitted to that)."
                % (n, requested, nofile))
        hold = 3.0 if self.quick else 10.0
        rate = 1000 if self.quick else 2000
        d = self.workdir
        sse_port = free_port()
        ports = {k: free_port() for k in ("h", "ha", "f", "fa")}
        p_sse = self.procs.spawn("sse-upstream", [sys.executable, os.path.join(HERE, "sse.py"), "server",
                                                  "--port", str(sse_port), "--rate", str(rate)], cpu=self.cpu_srv)
        self.wait_port(sse_port, "sse-upstream", p_sse)
        db = "sqlite://%s/sse-leases.db" % d
        up = "http://127.0.0.1:%d" % sse_port
        p_h = self.start_rolegate("sse-holder", rolegate_conf("sse-holder", ports["h"], ports["ha"], up, "sqlite", db))
        self.wait_ready(p_h, "sse-holder", ports["ha"])
        wait_until("sse holder holds", lambda: self.held_count(ports["ha"]) == 1, 20)
        p_f = self.start_rolegate("sse-forwarder", rolegate_conf("sse-fwd", ports["f"], ports["fa"], up, "sqlite", db))
        self.wait_ready(p_f, "sse-forwarder", ports["fa"])
        # One stream end to end, so both gateways have paid their one-time costs.
        st, _ = http_get("127.0.0.1", ports["f"], "/r/healthz")
        if st != 200:
            raise RuntimeError("SSE path check answered %s" % st)
        time.sleep(1.0)
        before = {"forwarder": rss_kib(p_f.pid), "holder": rss_kib(p_h.pid)}
        cpu_before = {"forwarder": cpu_ticks(p_f.pid), "holder": cpu_ticks(p_h.pid)}
        log("SSE: opening %d streams through the forwarded path" % n)
        client = self.procs.spawn("sse-client", [sys.executable, os.path.join(HERE, "sse.py"), "client",
                                                 "--url", "http://127.0.0.1:%d/r/events" % ports["f"],
                                                 "--streams", str(n), "--hold", str(hold), "--settle", "1",
                                                 "--spread", "--ramp-timeout", "90"],
                                  cpu=self.cpu_gen, stdout=subprocess.PIPE)
        opened_line = client.stdout.readline().decode().split()
        if not opened_line or opened_line[0] != "OPEN":
            raise RuntimeError("SSE client printed %r" % opened_line)
        opened, ramp_s, failed = int(opened_line[1]), float(opened_line[2]), int(opened_line[3])
        time.sleep(0.5)
        during = {"forwarder": rss_kib(p_f.pid), "holder": rss_kib(p_h.pid)}
        open_gauge = {"forwarder": self.metric(ports["fa"], "rolegate_open_streams"),
                      "holder": self.metric(ports["ha"], "rolegate_open_streams")}
        t_hold0 = time.monotonic()
        cpu_hold0 = {"forwarder": cpu_ticks(p_f.pid), "holder": cpu_ticks(p_h.pid)}
        result_line = client.stdout.readline().decode()
        t_hold = time.monotonic() - t_hold0
        cpu_hold = {k: (cpu_ticks(p.pid) - cpu_hold0[k]) / CLK_TCK for k, p in (("forwarder", p_f), ("holder", p_h))}
        during_end = {"forwarder": rss_kib(p_f.pid), "holder": rss_kib(p_h.pid)}
        if not result_line.startswith("RESULT "):
            raise RuntimeError("SSE client printed %r" % result_line)
        res = json.loads(result_line[len("RESULT "):])
        client.wait(30)
        self.procs.stop(client)
        time.sleep(2.0)
        after = {"forwarder": rss_kib(p_f.pid), "holder": rss_kib(p_h.pid)}
        open_after = {"forwarder": self.metric(ports["fa"], "rolegate_open_streams"),
                      "holder": self.metric(ports["ha"], "rolegate_open_streams")}
        outcomes = self.metric(ports["fa"], "rolegate_proxy_requests_total")
        for p in (p_f, p_h, p_sse):
            self.procs.stop(p)
        res.update({"open_gauge": open_gauge, "open_gauge_after": open_after, "forwarder_outcomes": outcomes,
                    "requested": requested, "nofile": nofile, "rss_before_kib": before, "rss_open_kib": during, "rss_open_end_kib": during_end,
                    "rss_after_close_kib": after, "opened_reported": opened, "ramp_s": ramp_s,
                    "failed": failed, "event_rate": rate, "hold_s": hold,
                    "cpu_during_hold_s": cpu_hold, "hold_wall_s": t_hold,
                    "per_stream_kib": {k: (during[k] - before[k]) / max(1, opened) for k in before}})
        self.results["sections"]["sse"] = res
        log("SSE: %d open, RSS per stream forwarder %.1f KiB holder %.1f KiB, event p99 %s" % (
            opened, res["per_stream_kib"]["forwarder"], res["per_stream_kib"]["holder"], fmt_us(res["p99_us"])))

    # -- section 3: handover / failover -----------------------------------------

    def section_handover(self):
        n = self.a.transitions or (10 if self.quick else 100)
        timings = ("1s", "250ms", "250ms")
        bound_ms = 1000 + 250
        # Covers a crash: duration + renew interval + 1 s.
        hold = "2250ms"
        pg = self.start_pg()
        d = self.workdir
        up = free_port()
        p_up = self.start_nginx("ho-upstream", nginx_upstream_conf(d, "ho-upstream", up))
        self.wait_port(up, "ho-upstream", p_up)
        slots = {s: {"port": free_port(), "admin": free_port(), "p": None, "gen": 0} for s in ("A", "B")}

        def conf(s):
            return rolegate_conf("ho-%s%d" % (s, slots[s]["gen"]), slots[s]["port"], slots[s]["admin"],
                                 "http://127.0.0.1:%d/gw%s" % (up, s), "postgres", pg["url"],
                                 table="bench_handover", timings=timings, drain="1s", hold_timeout=hold)

        def start(s):
            slots[s]["gen"] += 1
            name = "ho-%s" % s
            slots[s]["p"] = self.start_rolegate(name, conf(s))
            self.wait_ready(slots[s]["p"], name, slots[s]["admin"])

        def served_by(s):
            """Who serves /r/who through gateway `s` (a slot name, or None)."""
            st, body = try_get("127.0.0.1", slots[s]["port"], "/r/who", 1.0)
            return body.decode().split()[0] if st == 200 and body else None

        start("A")
        wait_until("A holds", lambda: self.held_count(slots["A"]["admin"]) == 1, 20)
        start("B")
        wait_until("B forwards to A", lambda: served_by("B") == "A", 10)
        holder = "A"
        out = {}
        for kind, sig in (("graceful", signal.SIGTERM), ("crash", signal.SIGKILL)):
            times, failures, lease_times, errors_seen, slowest = [], 0, [], [], []
            in_flight_seen, other_failed = [], []
            for i in range(n):
                other = "B" if holder == "A" else "A"
                # Precondition: the other gateway forwards to the holder.
                wait_until("%s forwards to %s" % (other, holder), lambda: served_by(other) == holder, 10)
                # A random phase against the holder's renewals, so the crash
                # case samples the whole range the lease can have left.
                time.sleep(0.05 + self.rng.uniform(0, 0.25))
                conn = http.client.HTTPConnection("127.0.0.1", slots[other]["port"], timeout=5)
                p = slots[holder]["p"]
                limit = 5.0 if kind == "graceful" else bound_ms / 1000.0 + 3.0
                t0 = time.monotonic()
                os.kill(p.pid, sig)
                done, errs, longest, in_flight = None, 0, 0.0, 0
                while time.monotonic() - t0 < limit:
                    sent = time.monotonic()
                    try:
                        conn.request("GET", "/r/who")
                        r = conn.getresponse()
                        body = r.read()
                        longest = max(longest, time.monotonic() - sent)
                        if r.status == 200 and body.decode().split()[0] == other:
                            done = time.monotonic()
                            break
                        if r.status != 200:
                            errs += 1
                            # A reset after the request reached the dying
                            # holder: it may have run, so it is never re-sent.
                            if b'"reason":"holder-unreachable"' in body:
                                in_flight += 1
                    except (OSError, http.client.HTTPException):
                        errs += 1
                        conn.close()
                        conn = http.client.HTTPConnection("127.0.0.1", slots[other]["port"], timeout=5)
                    time.sleep(0.002)
                conn.close()
                in_flight_seen.append(in_flight)
                other_failed.append(errs - in_flight)
                if done is None:
                    failures += 1
                else:
                    times.append((done - t0) * 1000.0)
                errors_seen.append(errs)
                slowest.append(longest * 1000.0)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
                self.procs.stop(p)
                if done is None:
                    # Make sure someone holds before going on.
                    wait_until("%s holds" % other, lambda: self.held_count(slots[other]["admin"]) == 1, 10)
                start(holder)  # the old holder comes back as a new identity, watching
                holder = other
                if (i + 1) % max(1, n // 5) == 0:
                    log("%s: %d/%d transitions, median so far %s" % (kind, i + 1, n, fmt_ms(med(times))))
            s = sorted(times)
            sl = sorted(slowest)
            out[kind] = {"n": n, "ok": len(times), "failed": failures,
                         "p50_ms": pctl(s, 50), "p90_ms": pctl(s, 90), "p99_ms": pctl(s, 99),
                         "min_ms": s[0] if s else None, "max_ms": s[-1] if s else None,
                         "median_failed_requests": med(errors_seen), "max_failed_requests": max(errors_seen or [0]),
                         "slowest_p50_ms": pctl(sl, 50), "slowest_p99_ms": pctl(sl, 99),
                         "slowest_max_ms": sl[-1] if sl else None,
                         "max_in_flight": max(in_flight_seen or [0]),
                         "transitions_with_in_flight": sum(1 for x in in_flight_seen if x),
                         "max_other_failed": max(other_failed or [0])}
            log("%s: p50 %s p99 %s (%d/%d), failed requests max %d, slowest request p99 %s" % (
                kind, fmt_ms(out[kind]["p50_ms"]), fmt_ms(out[kind]["p99_ms"]), len(times), n,
                out[kind]["max_failed_requests"], fmt_ms(out[kind]["slowest_p99_ms"])))
        for s in slots.values():
            if s["p"] is not None:
                self.procs.stop(s["p"])
        out["balance"] = self.balance_moves_under_load(pg, up, timings, hold, max(4, n // 5))
        self.procs.stop(p_up)
        out.update({"timings": {"duration": timings[0], "renew_interval": timings[1], "safety_margin": timings[2]},
                    "bound_ms": bound_ms, "store": "postgres", "hold_timeout": hold})
        self.results["sections"]["handover"] = out

    def balance_moves_under_load(self, pg, up, timings, hold, rounds):
        """A 4-role partition on gateways A and B: B leaves (SIGTERM, its roles
        move to A) and joins again (balance moves two roles back), `rounds`
        times each, while a poller sends `GET /p/<key>` over eight keys through
        A every 2 ms. Per transition: requests that failed, and the slowest."""
        ports = {s: (free_port(), free_port()) for s in ("A", "B")}
        gen = {"A": 0, "B": 0}

        def start(s):
            gen[s] += 1
            port, admin = ports[s]
            c = rolegate_conf("bal-%s%d" % (s, gen[s]), port, admin, "http://127.0.0.1:%d/gw%s" % (up, s),
                              "postgres", pg["url"], table="bench_balance_moves", roles=(), partition=4,
                              timings=timings, drain="1s", hold_timeout=hold)
            p = self.start_rolegate("bal-%s" % s, c)
            self.wait_ready(p, "bal-%s" % s, admin)
            return p

        def held(s):
            return self.held_count(ports[s][1])

        stats = {"lock": threading.Lock(), "ok": 0, "failed": 0, "slowest": 0.0}
        stop = threading.Event()

        def poll():
            conn = http.client.HTTPConnection("127.0.0.1", ports["A"][0], timeout=5)
            i = 0
            while not stop.is_set():
                i += 1
                sent = time.monotonic()
                ok = False
                try:
                    conn.request("GET", "/p/key-%d" % (i % 8))
                    r = conn.getresponse()
                    r.read()
                    ok = r.status == 200
                except (OSError, http.client.HTTPException):
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", ports["A"][0], timeout=5)
                with stats["lock"]:
                    stats["ok" if ok else "failed"] += 1
                    stats["slowest"] = max(stats["slowest"], time.monotonic() - sent)
                time.sleep(0.002)
            conn.close()

        def take():
            with stats["lock"]:
                v = (stats["ok"], stats["failed"], stats["slowest"] * 1000.0)
                stats.update({"ok": 0, "failed": 0, "slowest": 0.0})
            return v

        p_a = start("A")
        wait_until("A holds the partition", lambda: held("A") == 4, 20)
        p_b = start("B")
        wait_until("the partition spreads 2/2", lambda: held("A") == 2 and held("B") == 2, 30)
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        per = {"leave": [], "join": []}
        try:
            for _ in range(rounds):
                time.sleep(0.3)
                take()
                t0 = time.monotonic()
                p_b.send_signal(signal.SIGTERM)
                p_b.wait(15)
                self.procs.stop(p_b)
                wait_until("A holds all 4", lambda: held("A") == 4, 15)
                ok, failed, slowest = take()
                per["leave"].append({"ms": (time.monotonic() - t0) * 1000.0, "requests": ok + failed,
                                     "failed": failed, "slowest_ms": slowest})
                t0 = time.monotonic()
                p_b = start("B")
                wait_until("B takes its share", lambda: held("B") == 2 and held("A") == 2, 30)
                ok, failed, slowest = take()
                per["join"].append({"ms": (time.monotonic() - t0) * 1000.0, "requests": ok + failed,
                                    "failed": failed, "slowest_ms": slowest})
        finally:
            stop.set()
            poller.join(10)
            for p in (p_a, p_b):
                self.procs.stop(p)
        out = {"rounds": rounds}
        for kind, rows in per.items():
            sl = sorted(r["slowest_ms"] for r in rows)
            out[kind] = {"n": len(rows), "requests": sum(r["requests"] for r in rows),
                         "failed_max": max(r["failed"] for r in rows), "failed_total": sum(r["failed"] for r in rows),
                         "slowest_p50_ms": pctl(sl, 50), "slowest_max_ms": sl[-1],
                         "transition_p50_ms": pctl(sorted(r["ms"] for r in rows), 50)}
            log("balance %s: %d transitions, %d requests, failed max %d, slowest request max %s" % (
                kind, len(rows), out[kind]["requests"], out[kind]["failed_max"], fmt_ms(sl[-1])))
        return out

    # -- section 4: store cost --------------------------------------------------

    def metric(self, admin, name):
        """{labels: value} of one metric from a gateway's /metrics."""
        try:
            _, body = http_get("127.0.0.1", admin, "/metrics", 5)
        except (OSError, http.client.HTTPException):
            return {}
        out = {}
        for line in body.decode().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                key, _, val = line.rpartition(" ")
                out[key[len(name):] or "{}"] = float(val)
        return out

    def metrics_counts(self, admin):
        st, body = http_get("127.0.0.1", admin, "/metrics", 5)
        counts = {}
        for line in body.decode().splitlines():
            m = re.match(r'rolegate_store_round_trip_seconds_count\{op="(\w+)"\}\s+([0-9.e+]+)', line)
            if m:
                counts[m.group(1)] = counts.get(m.group(1), 0) + float(m.group(2))
        return counts

    STORES = (("postgres", "PostgreSQL"), ("redis", "Redis"), ("etcd", "etcd"))

    def section_store(self):
        instances = 10
        window = 3.0 if self.quick else 10.0
        # The same timings on every store; etcd grants whole-second TTLs of at least 2 s.
        timings = ("3s", "1s", "500ms")
        up = free_port()
        p_up = self.start_nginx("st-upstream", nginx_upstream_conf(self.workdir, "st-upstream", up))
        self.wait_port(up, "st-upstream", p_up)
        out = {"instances": instances, "window_s": window,
               "timings": {"duration": timings[0], "renew_interval": timings[1], "safety_margin": timings[2]},
               "order": [k for k, _ in self.STORES], "stores": {}}
        for kind, label in self.STORES:
            log("store cost on %s" % label)
            try:
                out["stores"][kind] = self.store_cost(kind, up, instances, window, timings)
            except Exception as e:  # noqa: BLE001 - reported per store; the other stores still run
                log("store cost on %s FAILED: %s" % (label, e))
                out["stores"][kind] = {"error": str(e)}
        self.procs.stop(p_up)
        failed = [k for k in out["order"] if "error" in out["stores"][k]]
        if failed:
            out["failed_stores"] = failed
        self.results["sections"]["store"] = out

    def store_cost(self, kind, up, instances, window, timings):
        """One store: a fresh server (PostgreSQL is shared with section 3), then for
        1, 64 and 1024 roles ten gateways, store calls per tick and server CPU."""
        srv = None
        if kind == "postgres":
            pg = self.start_pg()
            url, server_ticks = pg["url"], self.pg_cpu_ticks
        elif kind == "redis":
            srv = self.start_redis()
            url, server_ticks = srv["url"], (lambda: cpu_ticks(srv["pid"]))
        else:
            srv = self.start_etcd()
            url, server_ticks = srv["url"], (lambda: cpu_ticks(srv["pid"]))
        res = {"timings": {"duration": timings[0], "renew_interval": timings[1], "safety_margin": timings[2]},
               "rows": []}
        gws = []
        try:
            for count in (1, 64, 1024):
                table = "bench_cost_%d" % count
                gws = []
                for i in range(instances):
                    port, admin = free_port(), free_port()
                    name = "st-%s-%d-%d" % (kind, count, i)
                    p = self.start_rolegate(name, rolegate_conf(name, port, admin, "http://127.0.0.1:%d" % up,
                                                                kind, url, table=table, roles=(),
                                                                partition=count, timings=timings, route=False,
                                                                drain="1s"))
                    gws.append((name, p, admin))
                    self.wait_ready(p, name, admin, 30)
                    if i == 0:
                        # The first instance takes every role; the others watch.
                        wait_until("first instance holds %d roles" % count,
                                   lambda: self.held_count(admin) == count, 30, 0.05)
                time.sleep(1.0 if self.quick else 2.0)
                m0 = [self.metrics_counts(a) for _, _, a in gws]
                if kind == "postgres":
                    tx0 = int(self.psql("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = 'postgres'"))
                g0 = [cpu_ticks(p.pid) for _, p, _ in gws]
                c0, t0 = server_ticks(), time.monotonic()
                time.sleep(window)
                c1, t1 = server_ticks(), time.monotonic()
                g1 = [cpu_ticks(p.pid) for _, p, _ in gws]
                m1 = [self.metrics_counts(a) for _, _, a in gws]
                if kind == "postgres":
                    # Stats are flushed by idle backends at most once a second: wait for them.
                    time.sleep(1.2)
                    tx1 = int(self.psql("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = 'postgres'"))
                held = [self.held_count(a) for _, _, a in gws]
                per = []
                for i in range(instances):
                    ops = {k: m1[i].get(k, 0) - m0[i].get(k, 0) for k in set(m0[i]) | set(m1[i])}
                    ticks = ops.get("snapshot", 0)
                    total = sum(ops.values())
                    per.append({"ops": ops, "ticks": ticks, "rt_per_tick": total / ticks if ticks else None,
                                "held": held[i], "cpu_s": (g1[i] - g0[i]) / CLK_TCK})
                elapsed = t1 - t0
                ticks_all = sum(x["ticks"] for x in per)
                rt_all = sum(sum(x["ops"].values()) for x in per)
                row = {
                    "roles": count, "elapsed_s": elapsed,
                    "holder_rt_per_tick": per[0]["rt_per_tick"],
                    "watcher_rt_per_tick": med([x["rt_per_tick"] for x in per[1:]]),
                    "mean_rt_per_tick": rt_all / ticks_all if ticks_all else None,
                    "ticks_per_instance": med([x["ticks"] for x in per]),
                    "server_cpu_s": (c1 - c0) / CLK_TCK,
                    "server_cpu_pct": 100.0 * (c1 - c0) / CLK_TCK / elapsed,
                    "gateway_cpu_pct_holder": 100.0 * per[0]["cpu_s"] / elapsed,
                    "gateway_cpu_pct_watcher": 100.0 * med([x["cpu_s"] for x in per[1:]]) / elapsed,
                    "held_by_first": held[0], "held_elsewhere": sum(h for h in held[1:] if h > 0),
                    "per_instance": per,
                }
                if kind == "postgres":
                    row["pg_cpu_s"], row["pg_cpu_pct"] = row["server_cpu_s"], row["server_cpu_pct"]
                    row["pg_xacts"] = tx1 - tx0 - 1
                    # Approximate: idle backends flush their stats at most once a second.
                    row["pg_xacts_per_instance_tick"] = row["pg_xacts"] / ticks_all if ticks_all else None
                res["rows"].append(row)
                log("store cost %s %4d roles: holder %.2f calls/tick, watchers %.2f calls/tick, server CPU %.1f%% of a core" % (
                    kind, count, row["holder_rt_per_tick"] or -1, row["watcher_rt_per_tick"] or -1,
                    row["server_cpu_pct"]))
                for _, p, _ in gws:
                    p.send_signal(signal.SIGTERM)
                for _, p, _ in gws:
                    self.procs.stop(p)
                gws = []
        finally:
            for _, p, _ in gws:
                self.procs.stop(p)
            if srv is not None:
                self.stop_server(srv)
        return res

    # -- section 5: footprint ---------------------------------------------------

    def section_footprint(self):
        up = free_port()
        p_up = self.start_nginx("fp-upstream", nginx_upstream_conf(self.workdir, "fp-upstream", up))
        self.wait_port(up, "fp-upstream", p_up)
        out = {"binary_bytes": os.path.getsize(self.bin), "binary": self.bin}
        try:
            out["binary_file"] = subprocess.run(["file", "-b", self.bin], capture_output=True, text=True).stdout.strip()
        except OSError:
            pass
        for label, env in (("1 worker thread", {"TOKIO_WORKER_THREADS": "1"}),
                           ("default workers", {"TOKIO_WORKER_THREADS": ""})):
            port, admin = free_port(), free_port()
            name = "fp-%s" % ("w1" if "1" in label else "wd")
            e = dict(env)
            if not e["TOKIO_WORKER_THREADS"]:
                e = {"TOKIO_WORKER_THREADS": str(os.cpu_count() or 1)}
            p = self.start_rolegate(name, rolegate_conf(name, port, admin, "http://127.0.0.1:%d" % up, "sqlite",
                                                        "sqlite://%s/%s.db" % (self.workdir, name), roles=(),
                                                        partition=1024, route=True), env=e)
            self.wait_ready(p, name, admin)
            wait_until("%s holds 1024 roles" % name, lambda: self.held_count(admin) == 1024, 30, 0.05)
            # One request on the partition route, then idle.
            http_get("127.0.0.1", port, "/p/device-7")
            time.sleep(2.0)
            out[label] = {"rss_kib": rss_kib(p.pid), "threads": e["TOKIO_WORKER_THREADS"]}
            self.procs.stop(p)
        self.procs.stop(p_up)
        self.results["sections"]["footprint"] = out

    # -- driver ---------------------------------------------------------------

    def section_peer_hop(self):
        """The forwarded path over an HTTP/1.1 hop (pooled connections) against
        an HTTP/2 hop (one multiplexed connection per peer): one holder, two
        forwarders that differ only in `peers.protocol`, the same upstream."""
        q = self.quick
        rounds = self.a.rounds or (2 if q else 3)
        secs = 1 if q else 3
        conns = 64
        d = self.workdir
        www = os.path.join(d, "www", "r")
        os.makedirs(www, exist_ok=True)
        sizes = {"1 KiB": 1024, "64 KiB": 65536}
        for n in sizes.values():
            with open(os.path.join(www, str(n // 1024) + "k"), "wb") as f:
                f.write((b"0123456789abcdef" * (n // 16 + 1))[:n])
        up = free_port()
        p_up = self.start_nginx("upstream-hop", nginx_upstream_conf(d, "upstream-hop", up))
        self.wait_port(up, "upstream-hop", p_up)
        upstream_url = "http://127.0.0.1:%d" % up
        db = "sqlite://%s/hop-leases.db" % d
        ports = {k: free_port() for k in ("h", "ha", "f1", "f1a", "f2", "f2a")}
        p_h = self.start_rolegate("hop-holder", rolegate_conf("holder", ports["h"], ports["ha"], upstream_url,
                                                               "sqlite", db))
        self.wait_ready(p_h, "hop-holder", ports["ha"])
        wait_until("holder holds `bench`", lambda: self.held_count(ports["ha"]) == 1, 20)
        forwarders = {}
        for name, key, proto in (("HTTP/1.1 hop", "f1", "http1"), ("HTTP/2 hop", "f2", "h2")):
            p = self.start_rolegate("hop-" + proto, rolegate_conf(
                "fwd-" + proto, ports[key], ports[key + "a"], upstream_url, "sqlite", db, peer_protocol=proto))
            self.wait_ready(p, "hop-" + proto, ports[key + "a"])
            forwarders[name] = (p, ports[key])
        for name, (p, port) in forwarders.items():
            for n in sizes.values():
                st, body = http_get("127.0.0.1", port, "/r/%dk" % (n // 1024))
                if st != 200 or len(body) != n:
                    raise RuntimeError("%s: /r/%dk answered %s" % (name, n // 1024, st))
                self.wrk("http://127.0.0.1:%d/r/%dk" % (port, n // 1024), 1, conns)

        def ticks(pids):
            return sum(cpu_ticks(x) for x in pids)

        def hop_connections(pid):
            """Connections from process `pid` to the holder's port."""
            out = subprocess.run(["ss", "-Htnp", "state", "established", "( dport = :%d )" % ports["h"]],
                                 capture_output=True, text=True)
            return len([l for l in out.stdout.splitlines() if "pid=%d," % pid in l])

        runs = {"%s|%s" % (n, s): [] for n in forwarders for s in sizes}
        for rnd in range(rounds):
            order = list(forwarders.items())
            if rnd % 2:
                order = order[::-1]
            for size, n in sizes.items():
                for name, (p, port) in order:
                    pids = [p.pid, p_h.pid]
                    c0 = ticks(pids)
                    # Hop connections are counted mid-run: a client
                    # connection's own hop connection closes with it.
                    seen = []
                    sampler = threading.Timer(secs / 2.0, lambda: seen.append(hop_connections(p.pid)))
                    sampler.start()
                    r = self.wrk("http://127.0.0.1:%d/r/%dk" % (port, n // 1024), secs, conns)
                    sampler.join()
                    c1 = ticks(pids)
                    r["cpu_us_per_req"] = (c1 - c0) / CLK_TCK * 1e6 / max(1, r["requests"])
                    r["hop_connections"] = max(seen + [hop_connections(p.pid)])
                    runs["%s|%s" % (name, size)].append(r)
                    log("peer hop round %d %-13s %-6s %9.0f req/s p99 %s cpu %.1f us/req, %d hop conns" % (
                        rnd + 1, name, size, r["rps"], fmt_us(r["p99"]), r["cpu_us_per_req"],
                        r["hop_connections"]))
                    self.procs.check_alive(p_h, "hop-holder")
        for p, _ in forwarders.values():
            self.procs.stop(p)
        self.procs.stop(p_h)
        self.procs.stop(p_up)
        self.results["sections"]["peer_hop"] = {
            "rounds": rounds, "seconds": secs, "connections": conns, "sizes": list(sizes),
            "contenders": list(forwarders), "runs": runs}

    def section_body_close(self):
        """`upstream.close_after_body`: a 1 KiB POST through a holder gateway
        with and without it, the same nginx upstream (which answers without
        reading the body, as `return 200` does), interleaved rounds. The
        requests go to the routed prefix `/r` (the holder path, with the role
        and token headers); `upstream.url` ends in `/gwX`, so nginx sees
        `/gwX/r/post` and its `return 200` location answers `X <token>`."""
        q = self.quick
        rounds = self.a.rounds or (2 if q else 3)
        secs = 1 if q else 3
        conns = 64
        d = self.workdir
        up = free_port()
        p_up = self.start_nginx("upstream-post", nginx_upstream_conf(d, "upstream-post", up))
        self.wait_port(up, "upstream-post", p_up)
        upstream_url = "http://127.0.0.1:%d/gwX" % up
        gateways = {}
        for name, close in (("keep-alive (default)", False), ("close_after_body: true", True)):
            key = "close" if close else "keep"
            port, admin = free_port(), free_port()
            db = "sqlite://%s/post-%s.db" % (d, key)
            p = self.start_rolegate("post-" + key, rolegate_conf(
                "post-" + key, port, admin, upstream_url, "sqlite", db, close_after_body=close))
            self.wait_ready(p, "post-" + key, admin)
            wait_until("%s holds `bench`" % name, lambda a=admin: self.held_count(a) == 1, 20)
            gateways[name] = (p, port)
            # One POST first: it must take the holder path (nginx echoes the
            # lease token the gateway adds) and be answered 200.
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                c.request("POST", "/r/post", body=b"x" * 1024,
                          headers={"Content-Type": "application/octet-stream"})
                resp = c.getresponse()
                st, body = resp.status, resp.read()
            finally:
                c.close()
            if st != 200 or not re.match(rb"X \d+\n$", body):
                raise RuntimeError("%s: POST /r/post answered %s %r" % (name, st, body[:200]))
            self.wrk("http://127.0.0.1:%d/r/post" % port, 1, conns, post_1k=True)
        runs = {name: [] for name in gateways}
        for rnd in range(rounds):
            order = list(gateways.items())
            if rnd % 2:
                order = order[::-1]
            for name, (p, port) in order:
                c0 = cpu_ticks(p.pid)
                r = self.wrk("http://127.0.0.1:%d/r/post" % port, secs, conns, post_1k=True)
                r["cpu_us_per_req"] = (cpu_ticks(p.pid) - c0) / CLK_TCK * 1e6 / max(1, r["requests"])
                runs[name].append(r)
                log("POST 1 KiB round %d %-22s %9.0f req/s p99 %s cpu %.1f us/req errors %d" % (
                    rnd + 1, name, r["rps"], fmt_us(r["p99"]), r["cpu_us_per_req"], r["errors"]))
        for p, _ in gateways.values():
            self.procs.stop(p)
        self.procs.stop(p_up)
        self.results["sections"]["body_close"] = {
            "rounds": rounds, "seconds": secs, "connections": conns, "contenders": list(gateways),
            "runs": runs}

    def section_multicore(self):
        """Two request threads against two nginx workers: every process may
        run on every core (the load generator too, on a 2-core machine)."""
        q = self.quick
        rounds = self.a.rounds or (2 if q else 3)
        secs = 1 if q else 3
        d = self.workdir
        ncpu = os.cpu_count() or 1
        cpus = "0-%d" % (ncpu - 1)
        www = os.path.join(d, "www", "r")
        os.makedirs(www, exist_ok=True)
        with open(os.path.join(www, "1k"), "wb") as f:
            f.write((b"0123456789abcdef" * 64)[:1024])
        two = lambda conf: conf.replace("worker_processes 1;", "worker_processes 2;")  # noqa: E731
        up = free_port()
        p_up = self.start_nginx("mc-upstream", two(nginx_upstream_conf(d, "mc-upstream", up)), cpu=cpus)
        self.wait_port(up, "mc-upstream", p_up)
        ports = {k: free_port() for k in ("w1", "w1a", "w2", "w2a", "ng")}
        db = "sqlite://%s/mc-leases.db" % d
        upstream = "http://127.0.0.1:%d" % up
        contenders = []
        for key, workers in (("w1", 1), ("w2", 2)):
            name = "rolegate holder, %d worker%s" % (workers, "s" if workers > 1 else "")
            p = self.start_rolegate("mc-" + key, rolegate_conf("mc-" + key, ports[key], ports[key + "a"], upstream,
                                                               "sqlite", db, roles=("bench-%s" % key,)),
                                    cpu=cpus, args=("--workers", str(workers)))
            self.wait_ready(p, "mc-" + key, ports[key + "a"])
            wait_until(name + " holds its role", lambda k=key: self.held_count(ports[k + "a"]) == 1, 20)
            contenders.append((name, ports[key], [p.pid]))
        p_ng = self.start_nginx("mc-nginx", two(nginx_proxy_conf(d, "mc-nginx", ports["ng"], up)), cpu=cpus)
        self.wait_port(ports["ng"], "mc-nginx", p_ng)
        contenders.append(("nginx 1 hop, 2 workers", ports["ng"], [p_ng.pid] + children_of(p_ng.pid)))
        runs = {c[0]: [] for c in contenders}
        for rnd in range(rounds):
            order = contenders if rnd % 2 == 0 else contenders[::-1]
            for name, port, pids in order:
                url = "http://127.0.0.1:%d/r/1k" % port
                c0 = sum(cpu_ticks(x) for x in pids)
                r = self.wrk(url, secs, 64, cpu=cpus)
                c1 = sum(cpu_ticks(x) for x in pids)
                r["cpu_us_per_req"] = (c1 - c0) / CLK_TCK * 1e6 / max(1, r["requests"])
                runs[name].append(r)
                log("multicore round %d %-28s %9.0f req/s cpu %.1f us/req" % (
                    rnd + 1, name, r["rps"], r["cpu_us_per_req"]))
        self.procs.stop_all()
        self.results["sections"]["multicore"] = {"rounds": rounds, "seconds": secs, "cpus": ncpu,
                                                 "contenders": [c[0] for c in contenders], "runs": runs}

    def section_profile(self):
        """perf samples of the holder under load (flame graph, top functions),
        and system calls per request of each 1-hop contender."""
        import perf_profile as prof_mod
        q = self.quick
        secs = 3 if q else 8
        d = self.workdir
        www = os.path.join(d, "www", "r")
        os.makedirs(www, exist_ok=True)
        with open(os.path.join(www, "1k"), "wb") as f:
            f.write((b"0123456789abcdef" * 64)[:1024])
        up = free_port()
        p_up = self.start_nginx("upstream-prof", nginx_upstream_conf(d, "upstream-prof", up))
        self.wait_port(up, "upstream-prof", p_up)
        ports = {k: free_port() for k in ("h", "ha", "ng1", "ha1")}
        p_h = self.start_rolegate("prof-holder", rolegate_conf(
            "holder", ports["h"], ports["ha"], "http://127.0.0.1:%d" % up, "sqlite",
            "sqlite://%s/prof-leases.db" % d))
        self.wait_ready(p_h, "prof-holder", ports["ha"])
        wait_until("holder holds `bench`", lambda: self.held_count(ports["ha"]) == 1, 20)
        p_ng = self.start_nginx("prof-nginx", nginx_proxy_conf(d, "prof-nginx", ports["ng1"], up))
        hcfg = self.write("prof-haproxy.cfg", haproxy_conf(d, ports["ha1"], up))
        p_ha = self.procs.spawn("prof-haproxy", ["haproxy", "-db", "-f", hcfg], cpu=self.cpu_srv)
        for port, name, p in ((ports["ng1"], "prof-nginx", p_ng), (ports["ha1"], "prof-haproxy", p_ha)):
            self.wait_port(port, name, p)
        url = "http://127.0.0.1:%d/r/1k" % ports["h"]
        self.wrk(url, 1, 64)
        data = os.path.join(d, "perf.data")
        rec = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", "499",
                                "--call-graph", "dwarf,16384", "-p", str(p_h.pid), "-o", data,
                                "--", "sleep", str(secs)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.3)
        self.wrk(url, secs, 64)
        _, err = rec.communicate(timeout=secs + 60)
        if rec.returncode != 0:
            raise RuntimeError("perf record failed: " + err.decode(errors="replace")[-400:])
        folded = prof_mod.collapse(data)
        prof_mod.flamegraph(folded, prof_mod.SVG_FILE)
        top, areas, samples = prof_mod.tops(folded)
        strace_s = 2
        sys_counts = {}
        for name, port, pids in (("rolegate holder", ports["h"], [p_h.pid]),
                                 ("nginx 1 hop", ports["ng1"], [p_ng.pid] + children_of(p_ng.pid)),
                                 ("HAProxy 1 hop", ports["ha1"], [p_ha.pid])):
            u = "http://127.0.0.1:%d/r/1k" % port
            calls, r = prof_mod.syscalls(pids, lambda u=u: self.wrk(u, strace_s, 8))
            sys_counts[name] = {"requests": r["requests"], "calls": calls}
            log("syscalls %-16s %d requests, %.2f per request" % (
                name, r["requests"], sum(calls.values()) / max(1, r["requests"])))
        for p in (p_ha, p_ng, p_h, p_up):
            self.procs.stop(p)
        self.results["sections"]["profile"] = {
            "seconds": secs, "samples": samples, "top": top, "areas": areas,
            "strace_seconds": strace_s, "syscalls": sys_counts}

    def cargo_bench(self, bench, section):
        """Runs `benches/<bench>.rs` against a throwaway PostgreSQL and keeps its JSON."""
        pg = self.start_pg()
        out = os.path.join(self.workdir, bench + ".json")
        cmd = ["cargo", "bench", "--quiet", "--bench", bench, "--", "--pg", pg["url"], "--json", out]
        if self.quick:
            cmd.append("--quick")
        log("running " + " ".join(cmd[:5]))
        subprocess.run(cmd, check=True, cwd=ROOT)
        with open(out) as f:
            self.results["sections"][section] = json.load(f)

    def section_work(self):
        """Leased work rows on PostgreSQL: claims/s beside FOR UPDATE SKIP LOCKED,
        claim latency as the completed history grows (benches/work_rows.rs)."""
        self.cargo_bench("work_rows", "work")

    def section_balance(self):
        """Partition balance on PostgreSQL: time to balance after a join, and
        the gap per graceful move (benches/balance.rs)."""
        self.cargo_bench("balance", "balance")

    def run(self):
        t_all = time.monotonic()
        sections = [("request_path", self.section_request_path), ("sse", self.section_sse),
                    ("handover", self.section_handover), ("store", self.section_store),
                    ("footprint", self.section_footprint), ("work", self.section_work),
                    ("balance", self.section_balance), ("peer_hop", self.section_peer_hop),
                    ("body_close", self.section_body_close),
                    ("profile", self.section_profile), ("multicore", self.section_multicore)]
        only = set(self.a.only.split(",")) if self.a.only else None
        for name, fn in sections:
            if only and name not in only:
                continue
            log("== %s" % name)
            t = time.monotonic()
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - reported in the document
                log("section %s FAILED: %s" % (name, e))
                self.results["sections"][name] = {"error": str(e)}
                self.procs.stop_all()
            self.section_times[name] = time.monotonic() - t
        self.results["section_times"] = self.section_times
        self.results["total_s"] = time.monotonic() - t_all

    def cleanup(self):
        self.procs.stop_all()
        self.stop_pg()
        for d in self.server_dirs:
            shutil.rmtree(d, ignore_errors=True)
        self.server_dirs = []
        if not self.a.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)
        else:
            log("kept %s" % self.workdir)


def cpu_activity(seconds=1.0):
    """Busy share of each CPU over `seconds`, and the processes that used the
    most CPU meanwhile (to show what else competes with the benchmark)."""
    def per_cpu():
        out = {}
        with open("/proc/stat") as f:
            for line in f:
                if re.match(r"cpu\d+ ", line):
                    v = [int(x) for x in line.split()[1:]]
                    out[line.split()[0]] = (sum(v) - v[3] - v[4], sum(v))
        return out

    def procs():
        out = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open("/proc/%s/stat" % d) as f:
                        st = f.read()
                    name = st[st.index("(") + 1:st.rindex(")")]
                    fields = st.rsplit(")", 1)[1].split()
                    out[int(d)] = (name, int(fields[11]) + int(fields[12]))
                except (OSError, ValueError):
                    continue
        return out
    a, pa = per_cpu(), procs()
    time.sleep(seconds)
    b, pb = per_cpu(), procs()
    busy = {k: 100.0 * (b[k][0] - a[k][0]) / max(1, b[k][1] - a[k][1]) for k in b if k in a}
    top = sorted(((pb[p][1] - pa[p][1], pb[p][0]) for p in pb if p in pa and p != os.getpid()), reverse=True)
    top = [(name, 100.0 * t / CLK_TCK / seconds) for t, name in top[:5] if t > 0]
    return {"busy_pct": busy, "top": top}


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for want in (1 << 20, 262144, 131072, 65536):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(want, hard)))
            return want
        except (ValueError, OSError):
            continue
    return soft


def write_page(report, res, args):
    """Writes the results into the page at args.out. A run of only marked
    sections (report.MARKED) rewrites just those, between their markers;
    any other run rewrites the page, keeping the marked sections it did not
    measure. A failed section keeps its text; the failure is in the log."""
    import sections
    ran = set(res["sections"])
    if ran and ran <= set(report.MARKED):
        for name in report.MARKED:
            body = report.render_section(res, name, args)
            if body is not None:
                sections.replace_section(args.out, name, body)
                log("wrote section %s of %s" % (name, args.out))
        log("--only %s: the rest of %s left as it is" % (args.only or ",".join(sorted(ran)), args.out))
        return
    # The marked sections this run did not measure come from the page as
    # it is (from docs/benchmarks.md when --out names a new file).
    previous = ""
    for path in (args.out, sections.PAGE):
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                previous = f.read()
            break
    text = report.render(res, args, previous)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    log("wrote %s (sections took %.0f s)" % (args.out, res.get("total_s", 0)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rolegate", required=True)
    ap.add_argument("--openloop", required=True)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    ap.add_argument("--json", default=None, help="also write the raw results here")
    ap.add_argument("--only", default=None, help="comma list: request_path,sse,handover,store,footprint,work,balance,peer_hop,body_close,profile,multicore")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--rate", type=float, default=None, help="fixed rate for section 1 (default: 40%% of the slowest)")
    ap.add_argument("--streams", type=int, default=None)
    ap.add_argument("--transitions", type=int, default=None)
    ap.add_argument("--command", default="scripts/bench")
    ap.add_argument("--build-seconds", type=float, default=None)
    ap.add_argument("--started", type=float, default=None, help="unix time the wrapper started")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, configs)")
    ap.add_argument("--compare", action="append", default=[], metavar="BIN=LABEL",
                    help="request path: also measure this rolegate binary under LABEL, interleaved "
                         "(e.g. another build); repeatable")
    ap.add_argument("--render-only", default=None, metavar="JSON",
                    help="only rewrite the document from a results file written by --json")
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    import report  # noqa: E402
    if args.render_only:
        with open(args.render_only) as f:
            res = json.load(f)
        write_page(report, res, args)
        return 0
    nofile = raise_nofile()
    b = Bench(args)

    def on_signal(signum, _frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    load_before = os.getloadavg()
    b.results["activity_before"] = cpu_activity(1.0)
    try:
        b.run()
    finally:
        b.cleanup()
    b.results["activity_after"] = cpu_activity(1.0)
    b.results["nofile"] = nofile
    b.results["load_before"] = load_before
    b.results["load_after"] = os.getloadavg()
    # The raw results are always saved first, so a rendering problem loses nothing.
    raw = args.json or os.path.join(tempfile.gettempdir(), "rolegate-bench-results.json")
    with open(raw, "w") as f:
        json.dump(b.results, f, indent=1, default=str)
    log("raw results in %s (re-render with --render-only %s)" % (raw, raw))
    write_page(report, b.results, args)
    failed = [k for k, v in b.results["sections"].items() if "error" in v or v.get("failed_stores")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
