#!/usr/bin/env python3
"""Batched decode keeps each request's text: N greedy completions of different prompts and
lengths, first one at a time (each decodes alone), then all at once (they share batched
passes), through `strata-run serve`; prints how many match and the server's batch
counters. Exit status 1 if any differs.

    python3 batch_check.py http://127.0.0.1:18080 N

Standard library only.
"""
import http.client
import json
import sys
import threading
import urllib.parse

url, n = sys.argv[1], int(sys.argv[2])
host = urllib.parse.urlparse(url)


def complete(i):
    conn = http.client.HTTPConnection(host.hostname, host.port, timeout=600)
    body = json.dumps({"prompt": f"Request {i}: " + "the story goes on " * (i % 5 + 1),
                       "max_tokens": 24 + 5 * i, "temperature": 0, "cache_prompt": False})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    return json.loads(conn.getresponse().read())["choices"][0]["text"]


def metric(name):
    conn = http.client.HTTPConnection(host.hostname, host.port, timeout=60)
    conn.request("GET", "/metrics")
    for line in conn.getresponse().read().decode().splitlines():
        if line.startswith(f"strata_{name} "):
            return float(line.split()[-1])
    return float("nan")


alone = [complete(i) for i in range(n)]
together = [None] * n


def run(i):
    together[i] = complete(i)


threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
same = sum(a == b for a, b in zip(alone, together))
batches, seqs = metric("decode_batches_total"), metric("decode_batched_sequences_total")
print(f"batched text = alone: {same} of {n}; {batches:.0f} batched passes, "
      f"{seqs / max(batches, 1):.2f} sequences a pass")
for i, (a, b) in enumerate(zip(alone, together)):
    if a != b:
        print(f"  request {i} differs:\n    alone:    {a!r}\n    together: {b!r}")
sys.exit(0 if same == n else 1)
