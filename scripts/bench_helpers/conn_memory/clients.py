# N client connections to the gateway: each sends one request (a 1 KiB GET
# kept alive, or an SSE stream) and then stays open. Prints when all are up,
# then waits for stdin to close.
import asyncio, sys, resource
_s, _h = resource.getrlimit(resource.RLIMIT_NOFILE); resource.setrlimit(resource.RLIMIT_NOFILE, (_h, _h))
port, n, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
conns = []
async def one(i):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    path = "/maintenance/sse" if kind == "sse" else "/maintenance/x"
    w.write(f"GET {path}?c={i} HTTP/1.1\r\nHost: g\r\n\r\n".encode())
    await w.drain()
    head = await r.readuntil(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0], head
    if kind == "sse":
        await r.readuntil(b"tick\n\n")
    else:
        await r.readexactly(1024)
    conns.append((r, w))
async def main():
    for start in range(0, n, 500):
        await asyncio.gather(*(one(i) for i in range(start, min(n, start + 500))))
    print("up", len(conns), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
asyncio.run(main())
