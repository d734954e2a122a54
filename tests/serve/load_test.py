#!/usr/bin/env python3
"""`sparrow serve` on the default model under load: 32 streamed chat requests at once, 16 decoding together in
the parallel slots and 16 waiting in the queue, each asking for 24 tokens. Every one must finish with text, a finish reason and [DONE], and the
server must still answer and stop cleanly afterwards. Bounded: 32 requests, 24 tokens each, a 10-minute cap.

Usage: load_test.py SPARROW_BINARY   (ctest passes it; the default model as scripts/sparrow_resources.py finds
it; without it the test is skipped with exit code 77, and under CI=true it fails)
"""
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts"))
from serve_process import ServerProcess  # noqa: E402
import serve_load  # noqa: E402

REQUESTS, PARALLEL, MAX_TOKENS = 32, 16, 24


def default_model():
    resources = os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "sparrow_resources.py")
    found = subprocess.run([sys.executable, resources, "model"], capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else None


class LoadOnTheDefaultModel(unittest.TestCase):
    def test_32_concurrent_streams_all_finish(self):
        server = ServerProcess([sys.argv[1], "serve", "-m", MODEL, "--port", "0", "--parallel", str(PARALLEL),
                                "-c", "512", "-t", "2"])
        try:
            results, summary = serve_load.run_load(server.base_url, REQUESTS, REQUESTS, MAX_TOKENS, timeout=600)
            self.assertEqual(summary["failures"], 0, summary["errors"])
            for r in results:
                self.assertGreater(r["tokens"], 0)
                self.assertLessEqual(r["tokens"], MAX_TOKENS)
                self.assertIsNotNone(r["ttft_s"])
            print(f"{REQUESTS} streams: {summary['completion_tokens']} tokens in {summary['wall_s']:.1f} s, "
                  f"{summary['tokens_per_s']:.1f} tokens/s, TTFT p95 {summary['ttft_p95_s']:.2f} s")
            server.wait_healthy(timeout=10)
        finally:
            self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    MODEL = default_model()
    if not MODEL or not os.path.isfile(MODEL):
        if os.environ.get("CI") == "true":
            sys.exit("error: the default model is not installed (scripts/setup installs it)")
        print("skipped: the default model is not installed (scripts/setup installs it)")
        sys.exit(77)
    unittest.main(argv=sys.argv[:1])
