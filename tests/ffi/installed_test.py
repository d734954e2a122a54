#!/usr/bin/env python3
"""The installed libsparrow.so as an embedder's build finds it (the ctest cases InstalledLibrary.*, one mode each):

  install        cmake --install into PREFIX (a folder of the build tree), replacing an earlier install
  contents       the files an install holds; the library exports exactly the functions of sparrow/sparrow.h and
                 needs nothing of the build tree (RUNPATH, NEEDED, paths written into the package files)
  pkg-config     tests/ffi/consumer.c built with `pkg-config --cflags --libs sparrow`, then run
  cmake-package  the same program built by tests/ffi/cmake_consumer/ through find_package(Sparrow), then run

Both consumers run the tiny model and must print the prompt's tokens and greedy continuation that the sparrow
binary (built from the static library, not from the install) prints for it with `sparrow logits`.

Usage: installed_test.py MODE --prefix P --libdir lib --work DIR --cli SPARROW --model M.gguf [mode options]
(CMakeLists.txt passes them.)
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

PROMPT = "The capital of France is"
N_GREEDY = 8


def fail(message):
    sys.exit(f"FAILED: {message}")


def run(command, env=None, cwd=None):
    """Runs a command; its stdout, or the failure with its output."""
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=env, cwd=cwd)
    if result.returncode != 0:
        fail(f"{' '.join(map(str, command))} exited {result.returncode}\n{result.stdout}{result.stderr}")
    return result.stdout


def without_loader_paths():
    """The environment with no LD_LIBRARY_PATH, so that a program finds libsparrow.so only as it was built to."""
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    return env


def install(args):
    prefix = Path(args.prefix)
    shutil.rmtree(prefix, ignore_errors=True)
    result = subprocess.run([args.cmake, "--install", args.build, "--prefix", prefix], capture_output=True, text=True)
    if result.returncode != 0:
        fail(f"cmake --install failed (is the sparrow_shared target built?)\n{result.stdout}{result.stderr}")
    print(result.stdout, end="")


def header_functions(header):
    """The functions sparrow.h declares: a name followed by its parameter list (not the progress callback type)."""
    return set(re.findall(r"\b(sparrow_\w+)\s*\(", Path(header).read_text()))


def dynamic_entries(library):
    """readelf -d's entries as (tag, value): ('NEEDED', 'libc.so.6'), ('RUNPATH', '/a:/b'), ..."""
    entries = []
    for line in run(["readelf", "-d", library]).splitlines():
        found = re.match(r"\s*0x[0-9a-f]+\s+\((\w+)\)\s+.*?\[(.*)\]", line)
        if found:
            entries.append((found.group(1), found.group(2)))
    return entries


def contents(args):
    prefix, lib = Path(args.prefix), Path(args.prefix) / args.libdir
    expected = [lib / "libsparrow.so", lib / "pkgconfig/sparrow.pc", prefix / "include/sparrow/sparrow.h"] + [
        lib / "cmake/Sparrow" / name
        for name in ("SparrowConfig.cmake", "SparrowConfigVersion.cmake", "SparrowTargets.cmake")]
    missing = [str(p) for p in expected if not p.is_file()]
    if missing:
        fail(f"not installed: {', '.join(missing)}")
    source_header = Path(args.source) / "include/sparrow/sparrow.h"
    if (prefix / "include/sparrow/sparrow.h").read_bytes() != source_header.read_bytes():
        fail("the installed sparrow.h differs from include/sparrow/sparrow.h")

    # The development link names the soname, which names the versioned file.
    if os.readlink(lib / "libsparrow.so") != "libsparrow.so.0":
        fail(f"libsparrow.so links to {os.readlink(lib / 'libsparrow.so')}, not libsparrow.so.0")
    entries = dynamic_entries(lib / "libsparrow.so")
    if ("SONAME", "libsparrow.so.0") not in entries:
        fail(f"SONAME is not libsparrow.so.0: {entries}")

    # Exported: exactly the header's functions. Anything else (C++ internals, the standard library's template
    # instances, Highway, the CUDA runtime) could collide with an embedder's own copies.
    exported = set()
    for line in run(["nm", "-D", "--defined-only", lib / "libsparrow.so"]).splitlines():
        exported.add(line.split()[-1])
    declared = header_functions(source_header)
    if exported - declared:
        fail(f"exported but not in sparrow.h: {sorted(exported - declared)[:20]} "
             f"({len(exported - declared)} symbols)")
    if declared - exported:
        fail(f"declared in sparrow.h but not exported: {sorted(declared - exported)}")
    print(f"exports: the {len(declared)} functions of sparrow.h, nothing else")

    # Nothing of the build or source tree: not in the search path, not among the libraries loaded, not written
    # into the package files.
    trees = [str(Path(args.work).parent), str(Path(args.source))]
    for tag, value in entries:
        if tag in ("RPATH", "RUNPATH"):
            for folder in value.split(":"):
                if folder == "" or not (folder.startswith("/") or folder.startswith("$ORIGIN")):
                    fail(f"{tag} {value!r} has a relative or empty entry (the working folder at run time)")
                if any(folder.startswith(t) for t in trees):
                    fail(f"{tag} {value!r} points into the build or source tree")
    loaded = run(["ldd", lib / "libsparrow.so"], env=without_loader_paths())
    if "not found" in loaded:
        fail(f"a NEEDED library is not found:\n{loaded}")
    for line in loaded.splitlines():
        if any(t in line for t in trees):
            fail(f"a library comes from the build or source tree: {line.strip()}")
    for path in list((lib / "cmake/Sparrow").iterdir()) + [lib / "pkgconfig/sparrow.pc"]:
        if any(t in path.read_text() for t in trees):
            fail(f"{path} names the build or source tree")
    print(f"needed: {', '.join(v for t, v in entries if t == 'NEEDED')}; "
          f"runpath: {', '.join(v for t, v in entries if t in ('RPATH', 'RUNPATH')) or 'none'}")


def reference_output(args, work):
    """What the sparrow binary prints for the prompt: its version, the prompt's tokens, the greedy tokens."""
    version = run([args.cli, "--version"]).strip()
    out = run([args.cli, "logits", "-m", args.model, "-p", PROMPT, "-o", work / "logits.bin", "-n", N_GREEDY])
    lines = {line.split(":")[0]: line for line in out.splitlines() if line.startswith(("tokens:", "greedy:"))}
    return [f"version: {version}", lines["tokens"], lines["greedy"]]


def check_consumer(args, binary, work):
    lib = (Path(args.prefix) / args.libdir).resolve()
    env = without_loader_paths()
    # The program loads the installed library, found through the path it was linked with.
    resolved = re.search(r"libsparrow\.so\.0 => (\S+)", run(["ldd", binary], env=env))
    if not resolved or Path(resolved.group(1)).resolve().parent != lib:
        fail(f"{binary} does not load libsparrow.so.0 from {lib}: {resolved.group(0) if resolved else 'absent'}")
    got = run([binary, args.model, PROMPT, N_GREEDY], env=env).splitlines()
    expected = reference_output(args, work)
    if got != expected:
        fail("the consumer's output differs from the sparrow binary's:\n  got:      " + "\n            ".join(got) +
             "\n  expected: " + "\n            ".join(expected))
    print("\n".join(got))
    print(f"matches `sparrow logits -n {N_GREEDY}` for {PROMPT!r}")


def pkg_config(args, work):
    lib = Path(args.prefix) / args.libdir
    env = dict(os.environ, PKG_CONFIG_PATH=str(lib / "pkgconfig"))
    version = run(["pkg-config", "--modversion", "sparrow"], env=env).strip()
    flags = run(["pkg-config", "--cflags", "--libs", "sparrow"], env=env).split()
    libdir = run(["pkg-config", "--variable=libdir", "sparrow"], env=env).strip()
    if Path(libdir).resolve() != lib.resolve():
        fail(f"pkg-config's libdir {libdir} is not the installed {lib}")
    print(f"pkg-config: sparrow {version}: {' '.join(flags)}")
    binary = work / "consumer"
    # Strict C11: the header must compile cleanly as C, as an FFI generator or a C host sees it.
    run([args.c_compiler, "-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Werror",
         Path(__file__).parent / "consumer.c", "-o", binary, *flags, f"-Wl,-rpath,{libdir}"])
    check_consumer(args, binary, work)


def cmake_package(args, work):
    build = work / "build"
    run([args.cmake, "-S", Path(__file__).parent / "cmake_consumer", "-B", build, "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_C_COMPILER={args.c_compiler}", f"-DCMAKE_PREFIX_PATH={Path(args.prefix).resolve()}"])
    run([args.cmake, "--build", build])
    check_consumer(args, build / "consumer", work)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["install", "contents", "pkg-config", "cmake-package"])
    for option in ("--prefix", "--libdir", "--work", "--cli", "--model"):
        parser.add_argument(option, required=True)
    for option in ("--cmake", "--build", "--source", "--c-compiler"):
        parser.add_argument(option)
    args = parser.parse_args()
    if args.mode == "install":
        install(args)
        return
    if args.mode == "contents":
        contents(args)
        return
    work = Path(args.work) / args.mode
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    {"pkg-config": pkg_config, "cmake-package": cmake_package}[args.mode](args, work)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
