"""A real gRPC server and client (Python grpcio) for tests/grpc.rs.

  grpc_rig.py serve PORT NAME        serve rg.Test and rg.Local on 127.0.0.1:PORT
  grpc_rig.py call TARGET CASE       run one case against TARGET, print JSON

Messages are raw bytes (no .proto): every handler is registered with
grpcio's generic handlers and identity (de)serializers.
"""
import json
import queue
import sys
import time
from concurrent import futures

import grpc


def serve(port, name):
    def unary(req, ctx):
        md = dict(ctx.invocation_metadata())
        return json.dumps({
            "app": name,
            "echo": req.decode(),
            "role": md.get("x-rolegate-role"),
            "remaining": ctx.time_remaining(),
        }).encode()

    def stream(req, ctx):
        n, gap = req.decode().split(",")
        for i in range(int(n)):
            yield json.dumps({"app": name, "i": i, "sent": time.time()}).encode()
            time.sleep(float(gap))

    def bidi(requests, ctx):
        for m in requests:
            yield (name + ":" + m.decode()).encode()

    def fail(req, ctx):
        ctx.set_trailing_metadata((("x-detail", "kept-" + name),))
        ctx.abort(grpc.StatusCode.NOT_FOUND, "no such thing at " + name)

    def slow(req, ctx):
        time.sleep(float(req.decode()))
        return b"late"

    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Stream": grpc.unary_stream_rpc_method_handler(stream),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
        "Fail": grpc.unary_unary_rpc_method_handler(fail),
        "Slow": grpc.unary_unary_rpc_method_handler(slow),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((
        grpc.method_handlers_generic_handler("rg.Test", handlers),
        grpc.method_handlers_generic_handler("rg.Local", handlers),
    ))
    bound = server.add_insecure_port("127.0.0.1:%d" % port)
    if bound == 0:
        sys.exit("cannot bind 127.0.0.1:%d" % port)
    server.start()
    # The bound port (port 0 asks the kernel for a free one).
    print(bound, flush=True)
    server.wait_for_termination()


def error(e):
    return {
        "code": e.code().name,
        "details": e.details(),
        "trailers": dict(e.trailing_metadata() or ()),
    }


def call(target, case):
    channel = grpc.insecure_channel(target)
    started = time.monotonic()
    out = {}
    try:
        if case == "unary":
            reply = channel.unary_unary("/rg.Test/Unary")(b"hello", timeout=5)
            out = json.loads(reply)
        elif case == "local":
            out = json.loads(channel.unary_unary("/rg.Local/Unary")(b"hi", timeout=5))
        elif case == "stream":
            got = []
            for m in channel.unary_stream("/rg.Test/Stream")(b"5,0.4", timeout=20):
                msg = json.loads(m)
                msg["received"] = time.time()
                got.append(msg)
            out = {"messages": got}
        elif case == "bidi":
            out = {"replies": bidi(channel)}
        elif case == "fail":
            channel.unary_unary("/rg.Test/Fail")(b"", timeout=5)
        elif case == "deadline":
            out = {"remaining": json.loads(
                channel.unary_unary("/rg.Test/Unary")(b"d", timeout=4))["remaining"]}
            channel.unary_unary("/rg.Test/Slow")(b"3", timeout=0.5)
        elif case == "gone":
            channel.unary_unary("/rg.Test/Unary")(b"x", timeout=15)
        else:
            sys.exit("unknown case " + case)
    except grpc.RpcError as e:
        out["error"] = error(e)
    out["elapsed"] = time.monotonic() - started
    print(json.dumps(out), flush=True)


def bidi(channel):
    """Ping-pong: each message is sent only after the previous reply came
    back, so the exchange cannot pass unless both directions stream."""
    outbox = queue.Queue()

    def requests():
        while True:
            m = outbox.get()
            if m is None:
                return
            yield m

    replies = []
    outbox.put(b"m0")
    for reply in channel.stream_stream("/rg.Test/Bidi")(requests(), timeout=15):
        replies.append(reply.decode())
        if len(replies) == 4:
            outbox.put(None)
        else:
            outbox.put(("m%d" % len(replies)).encode())
    return replies


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]), sys.argv[3])
    else:
        call(sys.argv[2], sys.argv[3])
