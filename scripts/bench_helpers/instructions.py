#!/usr/bin/env python3
"""Instructions per request on the holder path, counted by callgrind.

usage: scripts/bench_helpers/instructions.py BINARY LABEL [N] [1k|64k]

Starts nginx (a 1 KiB and a 64 KiB file) and BINARY as the holder gateway
(embedded SQLite store, one role routed at /r, one worker thread, leases
long enough that no renewal falls in the window) under valgrind's
callgrind with instrumentation off; sends 300 warm-up requests on one
keep-alive connection, then counts the instructions of N more (default
2000), on the request thread alone. Instruction counts do not depend on what else the machine runs, so
two builds compare within about 1 % where wall-clock rounds spread by tens
of percent. Files go to /tmp/cg/LABEL."""
import http.client, os, socket, subprocess, sys, time, glob, re, shutil

binary, label = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
size = sys.argv[4] if len(sys.argv) > 4 else "1k"
d = "/tmp/cg/" + label
shutil.rmtree(d, ignore_errors=True)
os.makedirs(d + "/www/r")
with open(d + "/www/r/1k", "wb") as f: f.write(b"x" * 1024)
with open(d + "/www/r/64k", "wb") as f: f.write(b"x" * 65536)

def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
up, gw, adm = port(), port(), port()
for sub in ["body", "proxy", "fastcgi", "uwsgi", "scgi"]:
    os.makedirs("%s/tmp-up/%s" % (d, sub), exist_ok=True)
open(d + "/nginx.conf", "w").write("""worker_processes 1; daemon off; master_process off; pid %s/up.pid;
error_log %s/up.err warn; events { worker_connections 1024; }
http { access_log off; client_body_temp_path %s/tmp-up/body; proxy_temp_path %s/tmp-up/proxy;
fastcgi_temp_path %s/tmp-up/fastcgi; uwsgi_temp_path %s/tmp-up/uwsgi; scgi_temp_path %s/tmp-up/scgi;
keepalive_requests 1000000; keepalive_timeout 120s; sendfile on;
server { listen 127.0.0.1:%d; root %s/www; default_type application/octet-stream; } }
""" % (d, d, d, d, d, d, d, up, d))
nginx = subprocess.Popen(["nginx", "-c", d + "/nginx.conf", "-p", d])
open(d + "/rg.yaml", "w").write("""instance:
  name: cg
  advertise: http://127.0.0.1:%d
listen: 127.0.0.1:%d
admin_listen: 127.0.0.1:%d
upstream:
  url: http://127.0.0.1:%d
store:
  kind: sqlite
  url: sqlite://%s/leases.db
lease:
  duration: 120s
  renew_interval: 40s
  safety_margin: 10s
roles:
  - name: bench
routes:
  - prefixes: [/r]
    role: bench
""" % (gw, gw, adm, up, d))
env = dict(os.environ, TOKIO_WORKER_THREADS="1", RUST_LOG="warn")
out = d + "/callgrind.out"
rg = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                       "--callgrind-out-file=" + out, "--separate-threads=yes", binary, "run", "--config", d + "/rg.yaml"],
                      env=env, stdout=open(d + "/rg.log", "w"), stderr=subprocess.STDOUT)
try:
    deadline = time.time() + 120
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", gw, timeout=5)
            c.request("GET", "/r/" + size); r = c.getresponse(); r.read()
            if r.status == 200 and r.getheader("x-rolegate-holder") is None or r.status == 200:
                break
        except Exception:
            pass
        if time.time() > deadline: raise SystemExit("gateway did not serve /r")
        time.sleep(0.5)
    c = http.client.HTTPConnection("127.0.0.1", gw, timeout=30)
    for _ in range(300):
        c.request("GET", "/r/" + size); r = c.getresponse(); r.read(); assert r.status == 200
    subprocess.run(["callgrind_control", "-i", "on", str(rg.pid)], check=True, stdout=subprocess.DEVNULL)
    t = time.time()
    for _ in range(n):
        c.request("GET", "/r/" + size); r = c.getresponse(); r.read(); assert r.status == 200, r.status
    subprocess.run(["callgrind_control", "-i", "off", str(rg.pid)], check=True, stdout=subprocess.DEVNULL)
    took = time.time() - t
finally:
    rg.terminate(); rg.wait(); nginx.terminate(); nginx.wait()
# One file per thread: the request worker (one tokio worker thread) does
# every request's work and the most instructions; the other threads (the
# control runtime, the store's, blocking pools) run on timers, so what they
# count grows with the wall time valgrind takes, not with the requests.
threads = []
for f in glob.glob(out + "*"):
    counts = [int(line.split()[1]) for line in open(f, errors="replace")
              if line.startswith(("totals:", "summary:"))]
    threads.append(max(counts, default=0))
worker = max(threads) if threads else 0
print("%s %s: %d requests, %.1f M instructions on the request thread (%.1f M in all), "
      "%.0f instructions/request (%.1f s)"
      % (label, size, n, worker / 1e6, sum(threads) / 1e6, worker / n, took))
