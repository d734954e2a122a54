#!/usr/bin/env python3
"""The installed libsparrow.so as an embedding host sees it: loaded with ctypes, every function used declared with
its argtypes and restype, every struct of sparrow.h mirrored field by field (docs/embedding.md). Nothing here is
Sparrow's own code: results are checked against the sparrow binary (built from the static library, not from this
install) and against argmax and top-k computed in Python from the logits read through the API.

Usage: ctypes_host_test.py LIBSPARROW_SO MODEL.gguf SPARROW_BINARY WORK_DIR   (ctest passes them)
"""
import array
import ctypes
import math
import re
import shutil
import subprocess
import sys
import unittest
from ctypes import POINTER, c_char_p, c_float, c_int, c_int32, c_uint64, c_void_p, c_size_t
from pathlib import Path

PROMPT = "The capital of France is"
N_GREEDY = 8
INT32_MIN = -(2**31)


# ---- sparrow.h, as a host declares it ----
class Model(ctypes.Structure):  # opaque handles: pointers to these
    pass


class Context(ctypes.Structure):
    pass


class Sampler(ctypes.Structure):
    pass


class Batch(ctypes.Structure):
    pass


token = c_int32
ProgressFn = ctypes.CFUNCTYPE(None, c_float, c_void_p)


class ModelParams(ctypes.Structure):
    _fields_ = [("device", c_char_p), ("n_gpu_layers", c_int32), ("progress", ProgressFn),
                ("progress_user", c_void_p), ("key_transforms", c_char_p)]


class ContextParams(ctypes.Structure):
    _fields_ = [("n_ctx", c_int32), ("n_threads", c_int32), ("n_batch", c_int32), ("cache_type_k", c_char_p),
                ("cache_type_v", c_char_p), ("kv_layers", c_char_p), ("kv_center_keys", c_int32),
                ("decode_graphs", c_int32), ("kv_bits", c_float), ("kv_balance_keys", c_int32),
                ("kv_sinks", c_int32), ("kv_window", c_int32), ("kv_protected_type", c_char_p)]


class SamplerParams(ctypes.Structure):
    _fields_ = [("temperature", c_float), ("top_k", c_int32), ("top_p", c_float), ("min_p", c_float),
                ("seed", c_uint64)]


class SeqStep(ctypes.Structure):
    _fields_ = [("seq", c_int32), ("tokens", POINTER(token)), ("n_tokens", c_int32)]


FUNCTIONS = {  # name: (restype, argtypes)
    "sparrow_last_error": (c_char_p, []),
    "sparrow_version": (c_char_p, []),
    "sparrow_model_default_params": (ModelParams, []),
    "sparrow_model_load_with_params": (POINTER(Model), [c_char_p, ModelParams]),
    "sparrow_model_load": (POINTER(Model), [c_char_p, ProgressFn, c_void_p]),
    "sparrow_model_free": (None, [POINTER(Model)]),
    "sparrow_model_describe": (c_char_p, [POINTER(Model)]),
    "sparrow_model_n_vocab": (c_int32, [POINTER(Model)]),
    "sparrow_tokenize": (c_int32, [POINTER(Model), c_char_p, c_int32, c_int, c_int, POINTER(token), c_int32]),
    "sparrow_token_to_piece": (c_int32, [POINTER(Model), token, c_int, c_char_p, c_int32]),
    "sparrow_token_bos": (token, [POINTER(Model)]),
    "sparrow_chat_format": (c_int32, [POINTER(Model), POINTER(c_char_p), POINTER(c_char_p), c_int32, c_int,
                                      c_char_p, c_int32]),
    "sparrow_context_default_params": (ContextParams, []),
    "sparrow_context_new": (POINTER(Context), [POINTER(Model), ContextParams]),
    "sparrow_context_free": (None, [POINTER(Context)]),
    "sparrow_context_n_past": (c_int32, [POINTER(Context)]),
    "sparrow_context_kv_bytes": (c_size_t, [POINTER(Context)]),
    "sparrow_decode": (c_int, [POINTER(Context), POINTER(token), c_int32, c_int]),
    "sparrow_get_logits": (POINTER(c_float), [POINTER(Context), c_int32]),
    "sparrow_batch_new": (POINTER(Batch), [POINTER(Model), ContextParams, c_int32]),
    "sparrow_batch_free": (None, [POINTER(Batch)]),
    "sparrow_seq_open": (c_int32, [POINTER(Batch)]),
    "sparrow_seq_close": (c_int, [POINTER(Batch), c_int32]),
    "sparrow_seq_n_past": (c_int32, [POINTER(Batch), c_int32]),
    "sparrow_batch_decode": (c_int, [POINTER(Batch), POINTER(SeqStep), c_int32]),
    "sparrow_seq_logits": (POINTER(c_float), [POINTER(Batch), c_int32]),
    "sparrow_sampler_default_params": (SamplerParams, []),
    "sparrow_sampler_new": (POINTER(Sampler), [SamplerParams]),
    "sparrow_sampler_free": (None, [POINTER(Sampler)]),
    "sparrow_sample": (token, [POINTER(Sampler), POINTER(c_float), c_int32]),
    "sparrow_sample_next": (token, [POINTER(Context), POINTER(Sampler)]),
    "sparrow_seq_sample": (token, [POINTER(Batch), c_int32, POINTER(Sampler)]),
    "sparrow_sample_greedy": (token, [POINTER(c_float), c_int32]),
}


def load_library(path):
    lib = ctypes.CDLL(str(path))
    for name, (restype, argtypes) in FUNCTIONS.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes
    return lib


def token_array(ids):
    return (token * len(ids))(*ids)


def argmax(values):
    """The index of the largest value, the lowest on ties (sparrow_sample_greedy's rule)."""
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


class CtypesHost(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.lib = load_library(LIBRARY)
        lib = cls.lib
        # The reference: what the sparrow binary prints and writes for the prompt.
        shutil.rmtree(WORK, ignore_errors=True)
        WORK.mkdir(parents=True)
        out = subprocess.run([CLI, "logits", "-m", MODEL, "-p", PROMPT, "-o", WORK / "logits.bin", "-n",
                              str(N_GREEDY)], capture_output=True, text=True, check=True).stdout
        cls.cli_tokens = [int(t) for t in re.search(r"^tokens: (.*)$", out, re.M).group(1).split()]
        cls.cli_greedy = [int(t) for t in re.search(r"^greedy: (.*)$", out, re.M).group(1).split()]
        cls.cli_logits = array.array("f")
        with open(WORK / "logits.bin", "rb") as f:
            cls.cli_logits.frombytes(f.read())
        cls.cli_version = subprocess.run([CLI, "--version"], capture_output=True, text=True,
                                         check=True).stdout.strip()

        # Loaded with a progress callback, as a host showing a progress bar would.
        cls.progress = []
        cls.progress_fn = ProgressFn(lambda fraction, user: cls.progress.append(fraction))
        params = lib.sparrow_model_default_params()
        params.progress = cls.progress_fn
        cls.model = lib.sparrow_model_load_with_params(str(MODEL).encode(), params)
        if not cls.model:
            raise RuntimeError(f"cannot load {MODEL}: {lib.sparrow_last_error().decode()}")
        cls.n_vocab = lib.sparrow_model_n_vocab(cls.model)

    @classmethod
    def tearDownClass(cls):
        cls.lib.sparrow_model_free(cls.model)
        shutil.rmtree(WORK, ignore_errors=True)

    # ---- helpers that free what they make when the test ends ----
    def new_context(self, n_ctx=64):
        params = self.lib.sparrow_context_default_params()
        params.n_ctx = n_ctx
        ctx = self.lib.sparrow_context_new(self.model, params)
        self.assertTrue(ctx, self.lib.sparrow_last_error())
        self.addCleanup(self.lib.sparrow_context_free, ctx)
        return ctx

    def new_sampler(self, temperature=0.0, top_k=0, seed=0):
        params = self.lib.sparrow_sampler_default_params()
        params.temperature, params.top_k, params.seed = temperature, top_k, seed
        sampler = self.lib.sparrow_sampler_new(params)
        self.assertTrue(sampler)
        self.addCleanup(self.lib.sparrow_sampler_free, sampler)
        return sampler

    def tokenize(self, text, add_bos=1, parse_special=1):
        data = text.encode()
        needed = -self.lib.sparrow_tokenize(self.model, data, len(data), add_bos, parse_special, None, 0)
        self.assertGreater(needed, 0, "capacity 0 answers -(count needed)")
        ids = (token * needed)()
        self.assertEqual(self.lib.sparrow_tokenize(self.model, data, len(data), add_bos, parse_special, ids, needed),
                         needed)
        return list(ids)

    def piece(self, token_id, render_special=0):
        buffer = ctypes.create_string_buffer(64)
        n = self.lib.sparrow_token_to_piece(self.model, token_id, render_special, buffer, len(buffer))
        self.assertGreaterEqual(n, 0, self.lib.sparrow_last_error())
        return buffer.raw[:n]

    def greedy_alone(self, prompt, n):
        """n greedy tokens after prompt, the prompt alone in a context."""
        ctx = self.new_context()
        greedy = self.new_sampler()
        self.assertEqual(self.lib.sparrow_decode(ctx, token_array(prompt), len(prompt), 0), 0)
        out = []
        for _ in range(n):
            out.append(self.lib.sparrow_sample_next(ctx, greedy))
            self.assertEqual(self.lib.sparrow_decode(ctx, token_array(out[-1:]), 1, 0), 0)
        return out

    # ---- the tests ----
    def test_version_matches_binary_and_package(self):
        version = self.lib.sparrow_version().decode()
        self.assertEqual(version, self.cli_version)
        pc = (LIBRARY.parent / "pkgconfig/sparrow.pc").read_text()
        self.assertEqual(re.search(r"^Version: (.*)$", pc, re.M).group(1), version)

    def test_structs_mirror_the_header(self):
        # The defaults sparrow.h documents, read through the mirrored layouts: a field out of place reads garbage.
        c = self.lib.sparrow_context_default_params()
        self.assertEqual((c.n_ctx, c.n_threads, c.n_batch), (0, 0, 512))
        self.assertEqual((c.cache_type_k, c.cache_type_v, c.kv_layers), (b"auto", b"auto", None))
        self.assertEqual((c.kv_center_keys, c.decode_graphs, c.kv_bits, c.kv_balance_keys), (-1, 1, 0.0, -1))
        self.assertEqual((c.kv_sinks, c.kv_window, c.kv_protected_type), (0, 0, b"f16"))
        m = self.lib.sparrow_model_default_params()
        self.assertEqual((m.device, m.n_gpu_layers, m.progress_user, m.key_transforms), (b"cpu", 0, None, None))

    def test_load_reports_progress_per_layer(self):
        n_layers = int(re.search(r"(\d+) layers", self.lib.sparrow_model_describe(self.model).decode()).group(1))
        self.assertEqual(self.progress, [c_float((i + 1) / n_layers).value for i in range(n_layers)])  # float32

    def test_tokenize_as_the_binary_does(self):
        ids = self.tokenize(PROMPT)
        self.assertEqual(ids, self.cli_tokens)
        self.assertEqual(ids[0], self.lib.sparrow_token_bos(self.model))
        self.assertEqual(b"".join(self.piece(t) for t in ids[1:]).decode(), PROMPT)
        self.assertEqual(self.n_vocab * len(ids), len(self.cli_logits))

    def test_decode_logits_and_greedy(self):
        ctx = self.new_context()
        ids = self.cli_tokens
        self.assertEqual(self.lib.sparrow_decode(ctx, token_array(ids), len(ids), 1), 0)
        self.assertEqual(self.lib.sparrow_context_n_past(ctx), len(ids))
        self.assertGreater(self.lib.sparrow_context_kv_bytes(ctx), 0)
        greedy = self.new_sampler()
        for i in range(len(ids)):
            pointer = self.lib.sparrow_get_logits(ctx, i)
            logits = pointer[:self.n_vocab]
            self.assertTrue(all(math.isfinite(v) for v in logits), f"position {i}")
            reference = self.cli_logits[i * self.n_vocab:(i + 1) * self.n_vocab]
            scale = max(abs(v) for v in reference)
            difference = max(abs(a - b) for a, b in zip(logits, reference))
            self.assertLessEqual(difference, 1e-5 * scale, f"position {i}: the binary's logits")
            best = argmax(logits)
            self.assertEqual(self.lib.sparrow_sample_greedy(pointer, self.n_vocab), best)
            self.assertEqual(self.lib.sparrow_sample(greedy, pointer, self.n_vocab), best)
        # The continuation, sampled on the context's device: the binary's greedy tokens.
        continuation = []
        for _ in range(N_GREEDY):
            continuation.append(self.lib.sparrow_sample_next(ctx, greedy))
            self.assertEqual(self.lib.sparrow_decode(ctx, token_array(continuation[-1:]), 1, 0), 0)
        self.assertEqual(continuation, self.cli_greedy)

    def test_sampling_draws_within_top_k_and_repeats_by_seed(self):
        ctx = self.new_context()
        ids = self.cli_tokens
        self.assertEqual(self.lib.sparrow_decode(ctx, token_array(ids), len(ids), 0), 0)
        pointer = self.lib.sparrow_get_logits(ctx, -1)
        logits = pointer[:self.n_vocab]
        top = set(sorted(range(self.n_vocab), key=lambda i: (-logits[i], i))[:5])

        def draws(seed, n=24):
            sampler = self.new_sampler(temperature=1.5, top_k=5, seed=seed)
            return [self.lib.sparrow_sample(sampler, pointer, self.n_vocab) for _ in range(n)]

        first = draws(7)
        self.assertTrue(set(first) <= top, f"{set(first) - top} outside the top 5")
        self.assertGreater(len(set(first)), 1, "temperature 1.5 over 5 tokens draws more than one")
        self.assertEqual(draws(7), first, "the same seed draws the same tokens")
        # On the context's device: the same first draw as sparrow_sample on its logits.
        sampler = self.new_sampler(temperature=1.5, top_k=5, seed=7)
        self.assertEqual(self.lib.sparrow_sample_next(ctx, sampler), first[0])
        one = self.new_sampler(temperature=1.5, top_k=1, seed=3)
        self.assertEqual(self.lib.sparrow_sample(one, pointer, self.n_vocab), argmax(logits), "top_k 1 is greedy")

    def test_chat_format(self):
        roles = (c_char_p * 3)(b"system", b"user", b"assistant")
        contents = (c_char_p * 3)(b"Be brief.", b"Hi", b"Hello!")
        needed = -self.lib.sparrow_chat_format(self.model, roles, contents, 3, 1, None, 0)
        buffer = ctypes.create_string_buffer(needed)
        self.assertEqual(self.lib.sparrow_chat_format(self.model, roles, contents, 3, 1, buffer, needed), needed)
        # Gemma 4's turn markers (the tiny model is a Gemma 4).
        expected = ("<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello!<turn|>\n"
                    "<|turn>model\n")
        self.assertEqual(buffer.raw[:needed].decode(), expected)
        # Its markers are single special tokens when parsed as such.
        ids = self.tokenize(expected, add_bos=0, parse_special=1)
        self.assertEqual(ids[0], self.lib.sparrow_token_bos(self.model))
        self.assertEqual(self.piece(ids[1], render_special=1), b"<|turn>")

        bad = (c_char_p * 1)(b"robot")
        self.assertEqual(self.lib.sparrow_chat_format(self.model, bad, contents, 1, 1, None, 0), INT32_MIN)
        self.assertIn("robot", self.lib.sparrow_last_error().decode())

    def test_batch_of_two_continues_each_as_alone(self):
        prompts = [self.cli_tokens, self.tokenize("Paris is a city in")]
        n_steps = 4
        params = self.lib.sparrow_context_default_params()
        params.n_ctx = 64
        batch = self.lib.sparrow_batch_new(self.model, params, 2)
        self.assertTrue(batch, self.lib.sparrow_last_error())
        self.addCleanup(self.lib.sparrow_batch_free, batch)
        seqs = [self.lib.sparrow_seq_open(batch) for _ in prompts]
        self.assertTrue(all(s >= 0 for s in seqs), self.lib.sparrow_last_error())
        self.assertEqual(self.lib.sparrow_seq_open(batch), -1, "a third sequence in a batch of two")

        greedy = self.new_sampler()
        continuations = [[] for _ in prompts]
        inputs = [token_array(p) for p in prompts]  # kept alive while the steps point at them
        for step in range(n_steps):
            steps = (SeqStep * 2)(*[SeqStep(s, inputs[i], len(inputs[i])) for i, s in enumerate(seqs)])
            self.assertEqual(self.lib.sparrow_batch_decode(batch, steps, 2), 0, self.lib.sparrow_last_error())
            for i, s in enumerate(seqs):
                self.assertTrue(self.lib.sparrow_seq_logits(batch, s))
                continuations[i].append(self.lib.sparrow_seq_sample(batch, s, greedy))
            inputs = [token_array(c[-1:]) for c in continuations]
        for i, s in enumerate(seqs):
            self.assertEqual(self.lib.sparrow_seq_n_past(batch, s), len(prompts[i]) + n_steps - 1)
            self.assertEqual(continuations[i], self.greedy_alone(prompts[i], n_steps), f"sequence {i}")
        self.assertEqual(continuations[0], self.cli_greedy[:n_steps])
        for s in seqs:
            self.assertEqual(self.lib.sparrow_seq_close(batch, s), 0)
        self.assertEqual(self.lib.sparrow_seq_close(batch, seqs[0]), -1, "closing twice")

    def test_errors_return_codes_and_say_why(self):
        missing = WORK / "no-such-model.gguf"
        self.assertFalse(self.lib.sparrow_model_load(str(missing).encode(), ProgressFn(), None))
        self.assertIn(str(missing), self.lib.sparrow_last_error().decode())

        ctx = self.new_context()
        self.assertEqual(self.lib.sparrow_decode(ctx, token_array(self.cli_tokens[:2]), 2, 0), 0)
        for bad in (self.n_vocab, -1):
            self.assertEqual(self.lib.sparrow_decode(ctx, token_array([bad]), 1, 0), -1, f"token {bad}")
            self.assertNotEqual(self.lib.sparrow_last_error(), b"")
            self.assertEqual(self.lib.sparrow_context_n_past(ctx), 2, "a refused decode changes nothing")
        self.assertEqual(self.lib.sparrow_token_to_piece(self.model, self.n_vocab, 0, None, 0), INT32_MIN)
        self.assertIn(str(self.n_vocab), self.lib.sparrow_last_error().decode())
        # Still usable after the refusals.
        self.assertEqual(self.lib.sparrow_decode(ctx, token_array(self.cli_tokens[2:]), len(self.cli_tokens) - 2, 0),
                         0)
        self.assertEqual(self.lib.sparrow_sample_greedy(self.lib.sparrow_get_logits(ctx, -1), self.n_vocab),
                         self.cli_greedy[0])


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    LIBRARY, MODEL, CLI, WORK = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    unittest.main(argv=sys.argv[:1], verbosity=2)
