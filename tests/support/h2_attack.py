"""Raw HTTP/2 attacks for tests/hostile_clients.rs, with the `h2` library
set to send whatever it is given (no header validation or normalization).

  h2_attack.py requests PORT    < [{"id", "headers": [[name, value], ...]}]
      one connection per attack (h2c prior knowledge); prints one JSON line
      per attack: {"id", "status", "x_app", "reset", "goaway", "error"}
  h2_attack.py streams PORT N PATH
      opens N streams at once on one connection, never ending them; prints
      {"refused": [...stream ids reset with REFUSED_STREAM], "answered": k}
  h2_attack.py rapid-reset PORT N PATH
      N times: HEADERS then RST_STREAM(CANCEL) at once; prints
      {"sent": n, "goaway": code or null, "closed": bool}
  h2_attack.py never-read PORT CONNS N PATH
      CONNS connections, each advertising 2^31-1 flow-control windows and
      opening N streams of PATH, then reading nothing more; prints
      {"opened": k} once every request is sent, and closes them all when
      its stdin closes
"""
import json
import socket
import sys
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions


def connect(port):
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    config = h2.config.H2Configuration(
        client_side=True,
        header_encoding="utf-8",
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
        validate_inbound_headers=False,
    )
    conn = h2.connection.H2Connection(config=config)
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    return sock, conn


def pump(sock, conn, until, limit=5.0):
    """Reads events until `until(event)` is true, the peer closes, or `limit`."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except socket.timeout:
            return "timeout"
        except OSError:
            return "closed"
        if not data:
            return "closed"
        try:
            events = conn.receive_data(data)
        except h2.exceptions.ProtocolError as e:
            return "protocol error: %s" % e
        out = conn.data_to_send()
        if out:
            try:
                sock.sendall(out)
            except OSError:
                return "closed"
        for ev in events:
            if until(ev):
                return None
    return "timeout"


def one_request(port, attack):
    result = {"id": attack["id"], "status": None, "x_app": None,
              "reset": None, "goaway": None, "error": None}
    sock, conn = connect(port)
    try:
        headers = [tuple(h) for h in attack["headers"]]
        conn.send_headers(1, headers, end_stream=True)
        sock.sendall(conn.data_to_send())

        def until(ev):
            if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == 1:
                hs = dict(ev.headers)
                result["status"] = int(hs.get(":status", 0))
                result["x_app"] = hs.get("x-app")
            elif isinstance(ev, h2.events.StreamReset) and ev.stream_id == 1:
                result["reset"] = int(ev.error_code)
                return True
            elif isinstance(ev, h2.events.ConnectionTerminated):
                result["goaway"] = int(ev.error_code)
                return True
            elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id == 1:
                return True
            return False

        result["error"] = pump(sock, conn, until)
    except (h2.exceptions.ProtocolError, OSError) as e:
        result["error"] = "client: %s" % e
    finally:
        sock.close()
    return result


def requests(port):
    for attack in json.load(sys.stdin):
        print(json.dumps(one_request(port, attack)), flush=True)


def base_headers(path):
    return [(":method", "GET"), (":scheme", "http"),
            (":authority", "gw.test"), (":path", path)]


def streams(port, n, path):
    sock, conn = connect(port)
    refused, answered = [], [0]
    ids = []
    for i in range(n):
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, base_headers("%s/%d" % (path, i)), end_stream=False)
        ids.append(sid)
    sock.sendall(conn.data_to_send())

    def until(ev):
        if isinstance(ev, h2.events.StreamReset) and ev.error_code == 7:
            refused.append(ev.stream_id)
        if isinstance(ev, h2.events.ResponseReceived):
            answered[0] += 1
        return len(refused) + answered[0] >= n

    err = pump(sock, conn, until, limit=3.0)
    print(json.dumps({"refused": refused, "answered": answered[0], "error": err}))
    sock.close()


def rapid_reset(port, n, path):
    sock, conn = connect(port)
    sent = 0
    closed = False
    goaway = [None]
    try:
        for i in range(n):
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, base_headers("%s/%d" % (path, i)), end_stream=True)
            conn.reset_stream(sid, error_code=8)  # CANCEL
            sock.sendall(conn.data_to_send())
            sent += 1
    except (OSError, h2.exceptions.ProtocolError):
        closed = True

    def until(ev):
        if isinstance(ev, h2.events.ConnectionTerminated):
            goaway[0] = int(ev.error_code)
            return True
        return False

    err = pump(sock, conn, until, limit=3.0)
    closed = closed or err == "closed"
    print(json.dumps({"sent": sent, "goaway": goaway[0], "closed": closed}))
    sock.close()


def never_read(port, conns, n, path):
    socks = []
    for _ in range(conns):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        conn = h2.connection.H2Connection(config=config)
        conn.local_settings = h2.settings.Settings(
            client=True,
            initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1},
        )
        conn.initiate_connection()
        conn.increment_flow_control_window(2**31 - 1 - 65535)
        for i in range(n):
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, base_headers(path), end_stream=True)
        sock.sendall(conn.data_to_send())
        # The server's SETTINGS must be acknowledged for the windows to hold.
        sock.settimeout(2)
        try:
            data = sock.recv(65536)
            conn.receive_data(data)
            sock.sendall(conn.data_to_send())
        except (OSError, h2.exceptions.ProtocolError):
            pass
        socks.append(sock)
    print(json.dumps({"opened": conns * n}), flush=True)
    sys.stdin.read()
    for sock in socks:
        sock.close()


if __name__ == "__main__":
    import h2.settings  # noqa: F401  (streams() pokes at the settings)
    mode, port = sys.argv[1], int(sys.argv[2])
    if mode == "requests":
        requests(port)
    elif mode == "streams":
        streams(port, int(sys.argv[3]), sys.argv[4])
    elif mode == "never-read":
        never_read(port, int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        rapid_reset(port, int(sys.argv[3]), sys.argv[4])
