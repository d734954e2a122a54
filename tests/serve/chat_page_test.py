#!/usr/bin/env python3
"""The chat page `sparrow serve` answers GET / with, in headless Chromium driven through Selenium: a server started
with an API key on a free port over a model; the page loads without the key; a message typed and sent with Enter
streams its reply in several chunks, and that reply (and the next turn's, which carries the history) equals the
non-streamed reply to the same conversation at temperature 0; with no key typed, sending shows the server's 401 in
the page.

Needs Debian's chromium and chromium-driver and the selenium package (scripts/setup installs them). Without them
it exits 77, which ctest reports as a skip; under CI (CI=true) their absence is a failure.

Usage: chat_page_test.py SPARROW_BINARY MODEL.gguf   (ctest passes both)
"""
import json
import os
import shutil
import sys
import tempfile
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_process import tiny_model_server  # noqa: E402

KEY = "test-key"
MAX_TOKENS = 12
SKIP = 77  # ctest's SKIP_RETURN_CODE for this test (CMakeLists.txt)


def missing_tools():
    """What this test lacks to drive a browser, or None."""
    missing = [f"{tool} (Debian package {package})" for tool, package in
               (("chromium", "chromium"), ("chromedriver", "chromium-driver")) if not shutil.which(tool)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium Python package")
    return ", ".join(missing) if missing else None


class ChatPage(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        binary, model = sys.argv[1], sys.argv[2]
        cls.server = tiny_model_server(binary, model, KEY)
        cls.addClassCleanup(cls.stop_server)  # cleanups run even when setUpClass fails, last added first
        cls.base = cls.server.base_url

        # The browser's profile lives in the build tree's scratch folder when ctest names one.
        scratch = os.environ.get("SPARROW_TEST_TMPDIR") or None
        if scratch:
            os.makedirs(scratch, exist_ok=True)
        cls.profile = tempfile.TemporaryDirectory(prefix="sparrow-chromium-", dir=scratch)
        cls.addClassCleanup(cls.profile.cleanup)
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium")
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", f"--user-data-dir={cls.profile.name}"):
            options.add_argument(arg)
        # An explicit driver keeps Selenium from looking for one on the network.
        cls.driver = webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")), options=options)
        cls.addClassCleanup(cls.driver.quit)
        cls.driver.set_page_load_timeout(30)

    @classmethod
    def stop_server(cls):
        cls.server_exit = cls.server.stop()

    def whole_reply(self, messages):
        """The non-streamed reply to a conversation at temperature 0, through the API."""
        body = json.dumps({"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}).encode()
        request = urllib.request.Request(f"{self.base}/v1/chat/completions", data=body, method="POST",
                                         headers={"Content-Type": "application/json",
                                                  "Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(request, timeout=60) as r:
            return json.load(r)["choices"][0]["message"]["content"]

    def open_page(self, query=""):
        """Loads the page with no API key stored."""
        self.driver.get(f"{self.base}/{query}")
        self.driver.execute_script("localStorage.clear()")
        self.driver.refresh()
        self.assertEqual(self.driver.find_element("id", "api-key").get_attribute("value"), "")

    def last_reply(self):
        """The last assistant message's state, text and chunk count once it is no longer streaming."""
        from selenium.webdriver.support.ui import WebDriverWait
        script = """const m = [...document.querySelectorAll('.assistant')].pop();
                    return m && m.dataset.state !== 'streaming'
                        ? {state: m.dataset.state, text: m.textContent, chunks: Number(m.dataset.chunks)} : null;"""
        return WebDriverWait(self.driver, 60).until(lambda d: d.execute_script(script))

    def test_page_loads_without_key(self):
        with urllib.request.urlopen(f"{self.base}/", timeout=10) as r:
            self.assertEqual(r.headers["Content-Type"], "text/html; charset=utf-8")
            self.assertIn("<title>Sparrow chat</title>", r.read().decode())
        with self.assertRaises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{self.base}/v1/models", timeout=10)
        self.assertEqual(refused.exception.code, 401)

    def test_streamed_reply_equals_whole(self):
        from selenium.webdriver.common.keys import Keys
        self.open_page(f"?temperature=0&max_tokens={MAX_TOKENS}")
        self.driver.find_element("id", "api-key").send_keys(KEY)
        box = self.driver.find_element("id", "input")
        conversation = []
        for text in ("Tell me a story", "And then?"):
            box.send_keys(text, Keys.ENTER)
            reply = self.last_reply()
            conversation.append({"role": "user", "content": text})
            self.assertEqual(reply["state"], "done", reply)
            self.assertNotEqual(reply["text"], "")
            self.assertGreater(reply["chunks"], 1, "the reply came in one piece, not streamed")
            self.assertEqual(reply["text"], self.whole_reply(conversation))
            conversation.append({"role": "assistant", "content": reply["text"]})
        self.assertEqual(box.get_attribute("value"), "")
        self.assertEqual(self.driver.execute_script("return localStorage.getItem('sparrow.apiKey')"), KEY)
        self.assertEqual(self.driver.find_elements("css selector", ".error"), [])

    def test_missing_key_shows_error(self):
        from selenium.webdriver.support.ui import WebDriverWait
        self.open_page()
        self.driver.find_element("id", "input").send_keys("Hi")
        self.driver.find_element("id", "send").click()
        error = WebDriverWait(self.driver, 30).until(lambda d: d.find_elements("css selector", ".error"))[0]
        self.assertIn("401", error.text)
        self.assertIn("API key", error.text)
        self.assertEqual(self.driver.find_elements("css selector", ".assistant"), [])
        self.assertTrue(self.driver.find_element("id", "send").is_enabled())
        self.assertEqual(self.driver.find_element("id", "input").get_attribute("value"), "Hi")  # back, to resend


if __name__ == "__main__":
    missing = missing_tools()
    if missing:
        if os.environ.get("CI") == "true":
            print(f"error: not installed: {missing}; under CI the chat page test must run (scripts/setup installs "
                  "them)", file=sys.stderr)
            sys.exit(1)
        print(f"skipped: not installed: {missing} (scripts/setup installs them)", file=sys.stderr)
        sys.exit(SKIP)
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(ChatPage)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    exit_code = getattr(ChatPage, "server_exit", None)
    if exit_code != 0:
        print(f"the server exited with {exit_code} after SIGTERM", file=sys.stderr)
    sys.exit(0 if result.wasSuccessful() and exit_code == 0 else 1)
