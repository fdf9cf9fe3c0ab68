# Upstream for the memory measurement: HTTP/1.1 keep-alive, 1 KiB answers,
# /maintenance/sse streams a chunked event every 5 s.
import asyncio, sys, resource
_s, _h = resource.getrlimit(resource.RLIMIT_NOFILE); resource.setrlimit(resource.RLIMIT_NOFILE, (_h, _h))
BODY = b"x" * 1024
async def handle(r, w):
    try:
        while True:
            head = await r.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1]
            if path.startswith(b"/maintenance/sse"):
                w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                while True:
                    ev = b"data: tick\n\n"
                    w.write(b"%x\r\n%s\r\n" % (len(ev), ev))
                    await w.drain()
                    await asyncio.sleep(5)
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1024\r\n\r\n" + BODY)
            await w.drain()
    except Exception:
        pass
    finally:
        w.close()
async def main():
    s = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=8192)
    print(s.sockets[0].getsockname()[1], flush=True)
    await s.serve_forever()
asyncio.run(main())
