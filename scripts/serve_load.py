#!/usr/bin/env python3
"""Concurrent streaming chat requests against an OpenAI-compatible server (`sparrow serve`, llama-server), with
the numbers a serving benchmark reports: total generated tokens per second, time to first token and the time
between tokens, per request and in percentiles. The load test (tests/serve/load_test.py) and the serving
benchmark (scripts/bench-serve) both send their load through this one module.

    serve_load.py http://127.0.0.1:8080 --requests 32 --concurrency 32 --max-tokens 32   (prints JSON)
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse

# Questions of about the same length, so that every request of a run asks for similar work.
PROMPTS = [
    "Write two sentences about the history of the printing press.",
    "Explain in a few sentences why the sky looks blue during the day.",
    "Describe a quiet morning in a small fishing village.",
    "Give three practical tips for learning to play the guitar.",
    "What are the main differences between a lake and a pond?",
    "Summarize the plot of a story about a lost dog finding its way home.",
    "Explain what a compiler does, for someone who has never programmed.",
    "List a few reasons why people keep houseplants.",
]


def stream_chat(base_url, prompt, max_tokens, timeout, api_key=None, model=None):
    """One streamed chat completion (model: the name to ask for; None: the server's one model). Returns a dict: ok, error, text, tokens, ttft_s, token_times_s, total_s."""
    url = urllib.parse.urlparse(base_url)
    request = {"messages": [{"role": "user", "content": prompt}], "stream": True, "max_tokens": max_tokens,
               "temperature": 0, "stream_options": {"include_usage": True}}
    if model:
        request["model"] = model
    body = json.dumps(request)
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    result = {"ok": False, "error": None, "text": "", "tokens": 0, "ttft_s": None, "token_times_s": [],
              "total_s": None, "finish_reason": None}
    start = time.monotonic()
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", body, headers)
        response = conn.getresponse()
        if response.status != 200:
            result["error"] = f"HTTP {response.status}: {response.read()[:300]!r}"
            return result
        chunks, usage_tokens, done = 0, None, False
        for raw in response:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            if event.get("usage"):
                usage_tokens = event["usage"].get("completion_tokens")
            for choice in event.get("choices", []):
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece:
                    now = time.monotonic() - start
                    if result["ttft_s"] is None:
                        result["ttft_s"] = now
                    result["token_times_s"].append(now)
                    result["text"] += piece
                    chunks += 1
                if choice.get("finish_reason"):
                    result["finish_reason"] = choice["finish_reason"]
        result["total_s"] = time.monotonic() - start
        result["tokens"] = usage_tokens if usage_tokens is not None else chunks
        if not done:
            result["error"] = "the stream ended without [DONE]"
        elif not result["text"]:
            result["error"] = "an empty reply"
        elif result["finish_reason"] not in ("stop", "length"):
            result["error"] = f"finish_reason {result['finish_reason']!r}"
        else:
            result["ok"] = True
    except Exception as e:  # a failed request is counted, never fatal to the run
        result["error"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return result


def percentile(values, p):
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def run_load(base_url, requests, concurrency, max_tokens, timeout=600, api_key=None, model=None):
    """Sends `requests` streamed chats, at most `concurrency` at a time; returns the per-request results and a
    summary (failures, tokens/s over the wall time, p50/p95 time to first token and inter-token latency)."""
    results = [None] * requests
    next_index = [0]
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                i = next_index[0]
                if i >= requests:
                    return
                next_index[0] += 1
            results[i] = stream_chat(base_url, PROMPTS[i % len(PROMPTS)], max_tokens, timeout, api_key, model)

    start = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(min(concurrency, requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    ok = [r for r in results if r["ok"]]
    gaps = [b - a for r in ok for a, b in zip(r["token_times_s"], r["token_times_s"][1:])]
    ttfts = [r["ttft_s"] for r in ok]
    tokens = sum(r["tokens"] for r in ok)
    summary = {
        "requests": requests, "concurrency": concurrency, "max_tokens": max_tokens,
        "failures": len(results) - len(ok),
        "errors": sorted({r["error"] for r in results if not r["ok"]}),
        "wall_s": wall, "completion_tokens": tokens, "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "ttft_p50_s": percentile(ttfts, 50), "ttft_p95_s": percentile(ttfts, 95),
        "itl_p50_s": percentile(gaps, 50), "itl_p95_s": percentile(gaps, 95),
        "mean_tokens_per_request": statistics.mean([r["tokens"] for r in ok]) if ok else 0.0,
    }
    return results, summary


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base_url")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--api-key")
    args = parser.parse_args()
    _, summary = run_load(args.base_url, args.requests, args.concurrency, args.max_tokens, args.timeout,
                          args.api_key)
    json.dump(summary, sys.stdout, indent=2)
    print()
    return 0 if summary["failures"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
