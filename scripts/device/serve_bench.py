#!/usr/bin/env python3
"""Aggregate decode speed of `strata-run serve` with N concurrent streaming clients.

    python3 serve_bench.py http://127.0.0.1:8080 CLIENTS MAX_TOKENS

Each client streams a plain completion (temperature 0, a different prompt each) with
usage included; the figure is all completion tokens (counted by the server) over the
wall time from the first request to the last [DONE]. The second figure is the decode
rate alone, as llama-batched-bench's S_TG counts it (no prompts, no first tokens): from
the server's inter-token gaps during the run (/metrics), clients x gaps / their summed
length, where every client decodes at once. Then the clients' mean time to first token,
from the server's histogram (the synthetic packs' tokens are mostly text-less, so a
client sees few chunks). Standard library only.
"""
import http.client
import json
import sys
import threading
import time
import urllib.parse

url, clients, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
host = urllib.parse.urlparse(url)
results = [None] * clients


def client(i):
    conn = http.client.HTTPConnection(host.hostname, host.port, timeout=600)
    body = json.dumps({
        "prompt": f"Story {i}: Once upon a time, in a land far away,",
        "max_tokens": max_tokens, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
    })
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    tokens = 0
    for line in resp:
        line = line.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    results[i] = tokens


def histograms():
    """(count, summed seconds) of the server's inter-token gaps so far, then of its times
    to first token."""
    conn = http.client.HTTPConnection(host.hostname, host.port, timeout=60)
    conn.request("GET", "/metrics")
    found = {}
    for line in conn.getresponse().read().decode().splitlines():
        for name in ("inter_token_latency", "time_to_first_token"):
            for key in ("count", "sum"):
                if line.startswith(f"strata_{name}_seconds_{key} "):
                    found[name, key] = float(line.split()[-1])
    get = lambda name: (found.get((name, "count"), 0.0), found.get((name, "sum"), 0.0))
    return get("inter_token_latency") + get("time_to_first_token")


before = histograms()
start = time.time()
threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.time() - start
total = sum(r or 0 for r in results)
after = histograms()
count, seconds = after[0] - before[0], after[1] - before[1]
decode = f"{clients * count / seconds:.1f} t/s" if seconds > 0 else "n/a"
firsts, waited = after[2] - before[2], after[3] - before[3]
first = f"; first token {1000 * waited / firsts:.0f} ms mean" if firsts > 0 else ""
print(f"{clients} clients: {total} tokens in {wall:.2f} s = {total / wall:.1f} t/s aggregate; decoding {decode}{first}")
