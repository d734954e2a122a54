"""`sparrow serve` (or llama-server) as a test or benchmark starts it: on a free port, its address read from what
it prints, stopped with SIGTERM. Shared by the tests in tests/serve/ and by scripts/bench-serve."""
import re
import signal
import subprocess
import threading
import time
import urllib.request

# `sparrow serve` says "... on http://127.0.0.1:PORT"; llama-server "... listening on http://127.0.0.1:PORT".
LISTENING = re.compile(r"on http://127\.0\.0\.1:(\d+)")


class ServerProcess:
    """A server started from argv, which must contain its port option (0 for a free port where supported)."""

    def __init__(self, argv, env=None, ready_timeout=300):
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.log = []
        deadline = time.monotonic() + ready_timeout
        for line in self.proc.stderr:
            self.log.append(line)
            found = LISTENING.search(line)
            if found:
                self.port = int(found.group(1))
                break
            if time.monotonic() > deadline:
                break
        else:
            self.proc.wait(timeout=30)
        if not hasattr(self, "port"):
            self.stop()
            raise RuntimeError("the server did not say where it listens:\n" + "".join(self.log[-20:]))
        # Keep reading stderr so a chatty server never blocks on a full pipe.
        threading.Thread(target=lambda: [self.log.append(l) for l in self.proc.stderr], daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.port}"

    def wait_healthy(self, timeout=300):
        """Until /health answers 200 (llama-server answers 503 while it loads the model)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except Exception:
                pass
            time.sleep(0.2)
        raise RuntimeError("the server never became healthy")

    def stop(self, timeout=30):
        """SIGTERM, then the exit status (SIGKILL after timeout, returning None)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        return self.proc.returncode


def tiny_model_server(binary, model, api_key):
    """The server the serve tests talk to: the tiny model of ctest's CApiFromC.MakeModel, 2 slots of 256 tokens,
    an API key, the model named "tiny"."""
    return ServerProcess([binary, "serve", "-m", model, "--port", "0", "--parallel", "2", "-c", "256",
                          "--api-key", api_key, "--alias", "tiny"])
