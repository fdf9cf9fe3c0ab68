#!/usr/bin/env python3
"""SSE upstream and SSE client for scripts/bench (python3 asyncio, stdlib only).

server: every GET whose path ends in /events gets a chunked text/event-stream
        response that stays open. A first comment `: open` is sent at once;
        after that the server emits `data: <CLOCK_MONOTONIC ns>` events at a
        fixed total rate, round-robin over the open streams. Any other path
        answers 200 "ok".
client: opens N streams to a URL (bounded connect concurrency), prints
        `OPEN <n> <seconds>` once all are open (or the ramp times out), then
        for HOLD seconds records, for every event received, now - timestamp
        (both CLOCK_MONOTONIC, so comparable across processes), and prints one
        JSON line with the percentiles and how many streams were still open.

  sse.py server --port P --rate EVENTS_PER_S
  sse.py client --url http://127.0.0.1:P/r/events --streams N --hold S
"""

import argparse
import asyncio
import json
import re
import resource
import socket
import sys
import time


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for want in (1 << 20, 262144, 131072, 65536, hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(want, hard)))
            return
        except (ValueError, OSError):
            continue


# --------------------------------------------------------------------------- server

class Server:
    def __init__(self, rate):
        self.rate = rate
        self.streams = []  # writers
        self.sent = 0

    async def handle(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line = head.split(b"\r\n", 1)[0].decode("latin-1")
                parts = line.split(" ")
                path = parts[1] if len(parts) > 1 else "/"
                if path.split("?", 1)[0].endswith("/events"):
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
                        + chunk(b": open\n\n")
                    )
                    await writer.drain()
                    self.streams.append(writer)
                    # Hold until the peer goes away.
                    await reader.read()
                    return
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Type: text/plain\r\n\r\nok\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            try:
                writer.close()
            except Exception:
                pass

    async def emit(self):
        start = time.monotonic()
        idx = 0
        while True:
            await asyncio.sleep(0.001)
            due = int((time.monotonic() - start) * self.rate)
            n = due - self.sent
            if n <= 0:
                continue
            if not self.streams:
                self.sent = due
                continue
            # Drop closed streams now and then.
            if idx >= len(self.streams):
                self.streams = [w for w in self.streams if not w.is_closing()]
                idx = 0
                if not self.streams:
                    continue
            for _ in range(min(n, 10000)):
                if idx >= len(self.streams):
                    idx = 0
                w = self.streams[idx]
                idx += 1
                if w.is_closing():
                    continue
                w.write(chunk(b"data: %d\n\n" % time.monotonic_ns()))
            self.sent = due


def chunk(data):
    return b"%x\r\n%s\r\n" % (len(data), data)


async def serve(args):
    srv = Server(args.rate)
    server = await asyncio.start_server(srv.handle, "127.0.0.1", args.port, backlog=4096, limit=1 << 16)
    asyncio.get_running_loop().create_task(srv.emit())
    async with server:
        await server.serve_forever()


# --------------------------------------------------------------------------- client

EVENT = re.compile(rb"data: (\d+)\n\n")


class Client:
    def __init__(self, args):
        self.args = args
        m = re.match(r"http://([^/:]+):(\d+)(/.*)", args.url)
        if not m:
            sys.exit("bad --url")
        self.host, self.port, self.path = m.group(1), int(m.group(2)), m.group(3)
        self.opened = 0
        self.failed = 0
        self.retried = 0
        self.dropped = 0
        self.reasons = {}
        self.open_now = 0
        self.measuring = False
        self.latencies = []
        self.events_total = 0
        self.stop = asyncio.Event()
        self.tasks = []

    async def one(self, i, sem, ready):
        """Opens stream i (up to 3 attempts) and reads it until stopped."""
        for attempt in range(3):
            err = await self.attempt(i, sem, ready, last=attempt == 2)
            if err is None:
                return
            self.retried += 1
            await asyncio.sleep(0.1)

    async def attempt(self, i, sem, ready, last):
        writer = None
        opened = False
        try:
            async with sem:
                # Spread source addresses over 127.0.0.0/8 so 10k+ streams never
                # run out of ephemeral ports towards one destination.
                src = ("127.0.%d.%d" % (1 + (i // 250) % 250, 1 + i % 250), 0) if self.args.spread else None
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port, local_addr=src, limit=1 << 16), 10)
                writer.write(("GET %s HTTP/1.1\r\nHost: %s:%d\r\nAccept: text/event-stream\r\n\r\n"
                              % (self.path, self.host, self.port)).encode())
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                if b" 200 " not in head.split(b"\r\n", 1)[0]:
                    body = b""
                    try:
                        body = await asyncio.wait_for(reader.read(600), 1)
                    except (asyncio.TimeoutError, OSError):
                        pass
                    m = re.search(rb'"reason":"([a-z-]+)"', body)
                    reason = m.group(1).decode() if m else head.split(b"\r\n", 1)[0].decode("latin-1")
                    self.reasons[reason] = self.reasons.get(reason, 0) + 1
                    raise ConnectionError("status " + reason)
                buf = b""
                while b": open" not in buf:
                    data = await asyncio.wait_for(reader.read(4096), 10)
                    if not data:
                        raise ConnectionError("closed before the first event")
                    buf += data
            opened = True
            self.opened += 1
            self.open_now += 1
            if self.opened + self.failed >= self.args.streams:
                ready.set()
            tail = b""
            while not self.stop.is_set():
                data = await reader.read(65536)
                if not data:
                    break
                now = time.monotonic_ns()
                buf = tail + data
                end = 0
                for m in EVENT.finditer(buf):
                    self.events_total += 1
                    if self.measuring:
                        self.latencies.append(now - int(m.group(1)))
                    end = m.end()
                tail = buf[end:][-512:]
            self.open_now -= 1
            return None
        except (asyncio.TimeoutError, ConnectionError, OSError, asyncio.IncompleteReadError) as e:
            if opened:
                self.open_now -= 1
                self.dropped += 1
                return None
            if self.retried + self.failed < 5:
                print("stream %d attempt failed: %r" % (i, e), file=sys.stderr, flush=True)
            if last:
                self.failed += 1
                if self.opened + self.failed >= self.args.streams:
                    ready.set()
                return None
            return e
        finally:
            if writer is not None:
                try:
                    writer.close()
                except Exception:
                    pass

    async def run(self):
        sem = asyncio.Semaphore(self.args.concurrency)
        ready = asyncio.Event()
        t0 = time.monotonic()
        for i in range(self.args.streams):
            self.tasks.append(asyncio.get_running_loop().create_task(self.one(i, sem, ready)))
        try:
            await asyncio.wait_for(ready.wait(), self.args.ramp_timeout)
        except asyncio.TimeoutError:
            pass
        ramp = time.monotonic() - t0
        print("OPEN %d %.3f %d" % (self.opened, ramp, self.failed), flush=True)
        # The orchestrator reads RSS now; give it a moment before measuring.
        await asyncio.sleep(self.args.settle)
        self.measuring = True
        await asyncio.sleep(self.args.hold)
        self.measuring = False
        still_open = self.open_now
        lat = sorted(self.latencies)

        def pct(p):
            if not lat:
                return None
            k = max(1, min(len(lat), int(-(-p / 100.0 * len(lat) // 1))))
            return lat[k - 1] / 1000.0

        result = {
            "streams": self.args.streams, "opened": self.opened, "failed": self.failed,
            "still_open": still_open, "ramp_s": round(ramp, 3), "events": len(lat),
            "retried": self.retried, "dropped": self.dropped, "non200_reasons": self.reasons,
            "p50_us": pct(50), "p90_us": pct(90), "p99_us": pct(99), "p999_us": pct(99.9),
            "max_us": lat[-1] / 1000.0 if lat else None,
        }
        print("RESULT " + json.dumps(result), flush=True)
        self.stop.set()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("server")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--rate", type=float, default=1000.0)
    c = sub.add_parser("client")
    c.add_argument("--url", required=True)
    c.add_argument("--streams", type=int, default=10000)
    c.add_argument("--hold", type=float, default=10.0)
    c.add_argument("--settle", type=float, default=1.0)
    c.add_argument("--concurrency", type=int, default=256)
    c.add_argument("--ramp-timeout", type=float, default=60.0)
    c.add_argument("--spread", action="store_true", help="spread source addresses over 127.0.x.y")
    args = ap.parse_args()
    raise_nofile()
    if args.cmd == "server":
        asyncio.run(serve(args))
    else:
        asyncio.run(Client(args).run())


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
