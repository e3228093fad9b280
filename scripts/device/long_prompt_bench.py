#!/usr/bin/env python3
"""Decode gaps while a long prompt is read: STREAMS streaming greedy completions decode
(MAX tokens each); after a second one more request sends a prompt of about LONG tokens
(a byte-level pack: one token a byte) and asks for one token, and while it is read a
client sends short prompts (about 70 tokens, one token asked), one after another. Prints the
long request's time to first token, the short requests' time to first token (median and
99th percentile, nearest rank), and the gaps between the decoding requests' tokens before
the long prompt arrived and while it was read, from the server's inter-token latency
histogram (/metrics; the streamed text of a random pack is mostly held back as partial
UTF-8, so the client sees few of its tokens): the median's bucket and the largest gap's
bucket. The server needs STREAMS + 2 slots. Standard library only.

    python3 long_prompt_bench.py http://127.0.0.1:18080 STREAMS LONG MAX
"""
import http.client
import json
import sys
import threading
import time
import urllib.parse

url, streams, long_tokens, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
host = urllib.parse.urlparse(url)
NAME = "strata_inter_token_latency_seconds_bucket"


def request(body):
    conn = http.client.HTTPConnection(host.hostname, host.port, timeout=600)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    return conn.getresponse().read()


def histogram():
    """Cumulative counts by upper bound (seconds) of the inter-token latency buckets."""
    conn = http.client.HTTPConnection(host.hostname, host.port, timeout=60)
    conn.request("GET", "/metrics")
    out = []
    for line in conn.getresponse().read().decode().splitlines():
        if line.startswith(NAME):
            le = line.split('le="')[1].split('"')[0]
            out.append((float("inf") if le == "+Inf" else float(le), int(float(line.split()[-1]))))
    return out


def summary(a, b):
    """(median bucket bound, largest non-empty bucket bound, count) of the gaps between two snapshots."""
    counts = [(le, nb - na) for (le, na), (_, nb) in zip(a, b)]
    total = counts[-1][1]
    median = next((le for le, n in counts if n >= total / 2), float("nan"))
    largest = next((le for le, n in counts if n >= total), float("nan"))
    return median, largest, total


threads = [threading.Thread(target=request, args=({"prompt": f"Stream {i}: once upon a time", "max_tokens": max_tokens,
                                                    "temperature": 0, "stream": True},)) for i in range(streams)]
for t in threads:
    t.start()
time.sleep(0.5)
h0 = histogram()
time.sleep(0.5)
h1 = histogram()
done = threading.Event()
short = []


def short_requests():
    """Short prompts one after another while the long one is read: the times to first
    token of those sent before it was read whole."""
    i = 0
    while not done.is_set():
        t0 = time.time()
        request({"prompt": f"Short {i}: " + "tale " * 12, "max_tokens": 1, "temperature": 0, "cache_prompt": False})
        short.append(time.time() - t0)
        i += 1


start = time.time()
prompt = ("word " * (long_tokens // 5 + 1))[:long_tokens]
shorts = threading.Thread(target=short_requests)
shorts.start()
reply = json.loads(request({"prompt": prompt, "max_tokens": 1, "temperature": 0, "cache_prompt": False}))
end = time.time()
done.set()
h2 = histogram()
shorts.join()
for t in threads:
    t.join()
(bm, bx, bn), (dm, dx, dn) = summary(h0, h1), summary(h1, h2)
ms = lambda s: f"{1e3 * s:.1f} ms" if s != float("inf") else "inf"
rank = lambda p: sorted(short)[max(0, -(-len(short) * p // 100) - 1)] if short else float("nan")
# The gaps while the long prompt was read, bucket by bucket (upper bound: count).
read_gaps = [(le, nb - na) for (le, na), (_, nb) in zip(h1, h2)]
print("gaps while read by bucket: " + ", ".join(f"<={ms(le)}: {n - m}" for (le, n), (_, m) in zip(read_gaps, [(0, 0)] + read_gaps) if n > m))
print(f"long prompt {reply.get('usage', {}).get('prompt_tokens')} tokens: ttft {1e3 * (end - start):.0f} ms; "
      f"short prompts meanwhile ({len(short)}): ttft p50 {ms(rank(50))}, p99 {ms(rank(99))}; gaps before ({bn}): median <= {ms(bm)}, largest <= {ms(bx)}; while read ({dn}): median <= {ms(dm)}, "
      f"largest <= {ms(dx)}")
