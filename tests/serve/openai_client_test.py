#!/usr/bin/env python3
"""`sparrow serve` as OpenAI's own Python client and curl see it: a server started on a free port over a model,
then chat and text completions (whole and streamed), the model list, an API key, and a bad request, each through
the official `openai` package; a streamed reply through curl; SIGTERM stops it cleanly.

Usage: openai_client_test.py SPARROW_BINARY MODEL.gguf   (ctest passes both)
"""
import os
import subprocess
import sys
import unittest

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_process import tiny_model_server  # noqa: E402

KEY = "test-key"


class Serve(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        binary, model = sys.argv[1], sys.argv[2]
        cls.server = tiny_model_server(binary, model, KEY)
        cls.port = cls.server.port
        cls.client = openai.OpenAI(base_url=f"http://127.0.0.1:{cls.port}/v1", api_key=KEY, max_retries=0)

    @classmethod
    def tearDownClass(cls):
        cls.assert_exit = cls.server.stop()

    def test_chat_whole(self):
        r = self.client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=6, temperature=0)
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertIsInstance(r.choices[0].message.content, str)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 6)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + 6)

    def test_chat_streamed_equals_whole(self):
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story"}]
        whole = self.client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
        text, finish = "", None
        for chunk in self.client.chat.completions.create(model="tiny", messages=messages, max_tokens=8,
                                                         temperature=0, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        self.assertEqual(text, whole.choices[0].message.content)
        self.assertEqual(finish, "length")

    def test_completion_and_models(self):
        r = self.client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=4, temperature=0)
        self.assertEqual(r.usage.completion_tokens, 4)
        self.assertIsInstance(r.choices[0].text, str)
        self.assertEqual([m.id for m in self.client.models.list()], ["tiny"])

    def test_refusals(self):
        wrong = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="wrong", max_retries=0)
        with self.assertRaises(openai.AuthenticationError):
            wrong.models.list()
        with self.assertRaises(openai.BadRequestError):
            self.client.chat.completions.create(model="tiny", messages=[], max_tokens=2)
        with self.assertRaises(openai.NotFoundError):
            self.client.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": "x"}])

    def test_curl_stream(self):
        body = '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"temperature":0,"stream":true}'
        out = subprocess.run(["curl", "-sN", "-H", f"Authorization: Bearer {KEY}", "-H",
                              "Content-Type: application/json", f"http://127.0.0.1:{self.port}/v1/chat/completions",
                              "-d", body], capture_output=True, text=True, timeout=60, check=True).stdout
        self.assertTrue(out.startswith("data: {"), out)
        self.assertTrue(out.rstrip().endswith("data: [DONE]"), out)
        self.assertEqual(out.count("chat.completion.chunk"), 4)  # three tokens and the finish


if __name__ == "__main__":
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(Serve)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    exit_code = getattr(Serve, "assert_exit", None)
    if exit_code != 0:
        print(f"the server exited with {exit_code} after SIGTERM", file=sys.stderr)
    sys.exit(0 if result.wasSuccessful() and exit_code == 0 else 1)
