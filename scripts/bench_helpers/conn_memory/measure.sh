#!/bin/bash
# Resident memory per client connection of one gateway (one worker) with
# N connections open on the holder path: KIND idle (each sent one 1 KiB GET
# and stays open, past the 4 s idle close of kept app connections) or sse
# (each holds a stream open). Usage: measure.sh BINARY idle|sse [N]
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$1; KIND=$2; N=${3:-5000}
d=$(mktemp -d /tmp/rg-conn-memory.XXXX)
python3 -u "$HERE/upstream.py" > $d/up.port & UP=$!
sleep 1
cat > $d/rg.yaml <<Y
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
upstream: { url: "http://127.0.0.1:$(cat $d/up.port)" }
store: { kind: sqlite, url: "sqlite://$d/l.db" }
lease: { duration: 3s, renew_interval: 1s, safety_margin: 1s }
roles: [ { name: maintenance } ]
routes: [ { prefixes: [/maintenance], role: maintenance } ]
proxy: { max_connections: 20000, idle_timeout: 300s }
Y

RUST_LOG=info $BIN run --workers 1 --config $d/rg.yaml > $d/gw.log 2>&1 & GW=$!
for _ in $(seq 100); do grep -q "listen=" $d/gw.log 2>/dev/null && break; sleep 0.1; done
sleep 3
PORT=$(grep -o 'listen=127.0.0.1:[0-9]*' $d/gw.log | head -1 | cut -d: -f2)
# warm: a few requests
for _ in 1 2 3; do curl -s -o /dev/null http://127.0.0.1:$PORT/maintenance/w; done
sleep 1
before=$(awk '/VmRSS/{print $2}' /proc/$GW/status)
mkfifo $d/hold
python3 -u "$HERE/clients.py" $PORT $N $KIND < $d/hold > $d/clients.out 2>&1 & CL=$!
exec 3> $d/hold
for _ in $(seq 600); do grep -q "^up" $d/clients.out && break; sleep 0.1; done
sleep 6   # past the 4 s idle close of kept app connections (keep-alive case)
after=$(awk '/VmRSS/{print $2}' /proc/$GW/status)
echo "$KIND $(cat $d/clients.out | head -1) rss_before=${before}KiB rss_after=${after}KiB per_conn=$(python3 -c "print(f'{($after-$before)/$N:.2f}')")KiB"
exec 3>&-
kill $CL $GW $UP 2>/dev/null; wait 2>/dev/null
rm -rf $d
