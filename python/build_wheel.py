"""Builds bagua's wheel without meson-python: for a Python that lacks it (the GPU machine's venv
has Meson but no meson-python and no network), and as CI's cross-check of the meson-python wheel.

    python python/build_wheel.py -o DIST [--builddir DIR] [-Dopt=value ...] [--native-file=F]

Does what meson-python does with pyproject.toml: configures the Meson project with
meson-python's -Ddebug=false -Doptimization=2, the setup arguments of [tool.meson-python.args]
and then the extra -D and --native-file= arguments given here, and this Python as
the interpreter, builds, runs `meson install --destdir`, and packs the installed files into
DIST/bagua-<version>-<tag>.whl by their install location: {py_platlib}/{py_purelib} at the
wheel's root, {bindir} as its scripts. Anything installed elsewhere is an error (naming the
file). The version comes from meson.build (as pyproject.toml's dynamic version does); the tag is
this interpreter's (cp312-cp312-linux_x86_64, ...). An existing --builddir is reconfigured and
reused, so an unchanged build is not compiled again.

Exit status 0 with the wheel's path on stdout; 1 with the reason on stderr.
"""

import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fail(message):
    print("build_wheel.py: " + message, file=sys.stderr)
    sys.exit(1)


def load_pyproject():
    try:
        import tomllib  # Python >= 3.11
    except ImportError:
        try:
            import tomli as tomllib
        except ImportError:
            fail("reading pyproject.toml needs tomllib (Python >= 3.11) or tomli")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def tool_env():
    """The environment for Meson and ninja: this interpreter's bin folder first on PATH, so that a
    venv's own meson and ninja (pip packages) are found before the system's, or at all."""
    env = dict(os.environ)
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def find_tool(name, env):
    path = shutil.which(name, path=env["PATH"])
    if path is None:
        fail("{} not found next to {} or on PATH (pip install {}, or apt-get install {})".format(
            name, sys.executable, name, "meson" if name == "meson" else "ninja-build"))
    return path


def run(cmd, log, env):
    print("+ " + " ".join(cmd), file=log, flush=True)
    r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    if r.returncode != 0:
        fail("{} failed with exit status {}".format(" ".join(cmd), r.returncode))


def wheel_tag():
    impl = "cp" if sys.implementation.name == "cpython" else sys.implementation.name
    py = "{}{}{}".format(impl, sys.version_info[0], sys.version_info[1])
    soabi = sysconfig.get_config_var("SOABI") or ""
    m = re.match(r"cpython-(\d+)", soabi)
    abi = "cp" + m.group(1) if m else py
    plat = re.sub(r"[-.]", "_", sysconfig.get_platform())
    return "{}-{}-{}".format(py, abi, plat)


def record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "{},sha256={},{}".format(arcname, digest, len(data))


def main():
    parser = argparse.ArgumentParser(description="Build bagua's wheel with Meson alone.")
    parser.add_argument("-o", "--outdir", required=True, help="folder for the .whl")
    parser.add_argument("--builddir", help="Meson build folder to use (reused if it exists)")
    parser.add_argument("--log", help="write Meson's and ninja's output here (default: stderr)")
    args, extra = parser.parse_known_args()
    bad = [a for a in extra if not (a.startswith("-D") or a.startswith("--native-file="))]
    if bad:
        fail("unknown arguments {} (extra Meson options are -Dname=value and "
             "--native-file=FILE)".format(bad))

    project = load_pyproject()
    meta = project["project"]
    setup_args = project.get("tool", {}).get("meson-python", {}).get("args", {}).get("setup", [])
    log = open(args.log, "w") if args.log else sys.stderr
    scratch = tempfile.mkdtemp(prefix="bagua-wheel-")
    try:
        build = os.path.abspath(args.builddir or os.path.join(scratch, "build"))
        # Beside the build folder, so that a reused one still finds it when Meson reconfigures.
        native = build.rstrip(os.sep) + ".native.ini"
        with open(native, "w") as f:
            f.write("[binaries]\npython = '{}'\n".format(sys.executable))
        env = tool_env()
        meson, ninja = find_tool("meson", env), find_tool("ninja", env)
        cmd = [meson, "setup", build, ROOT, "--native-file", native, "--prefix", sys.base_prefix]
        if os.path.exists(os.path.join(build, "meson-private", "coredata.dat")):
            cmd.insert(2, "--reconfigure")
        # meson-python's own arguments come first, as it passes them (so a build folder that
        # meson-python configured is reused as it is).
        run(cmd + ["-Ddebug=false", "-Doptimization=2"] + setup_args + extra, log, env)
        run([ninja, "-C", build], log, env)
        dest = os.path.join(scratch, "destdir")
        run([meson, "install", "-C", build, "--no-rebuild", "--destdir", dest], log, env)

        with open(os.path.join(build, "meson-info", "intro-install_plan.json")) as f:
            plan = json.load(f)
        with open(os.path.join(build, "meson-info", "intro-installed.json")) as f:
            installed = json.load(f)
        with open(os.path.join(build, "meson-info", "intro-projectinfo.json")) as f:
            version = json.load(f)["version"]
        name = meta["name"]
        data_dir = "{}-{}.data".format(name, version)
        files = {}  # arcname -> installed file
        for entries in plan.values():
            for origin, details in entries.items():
                where = details["destination"]
                top, _, rest = where.partition("/")
                if top in ("{py_platlib}", "{py_purelib}", "{moduledir_shared}"):
                    arcname = rest
                elif top == "{bindir}":
                    arcname = data_dir + "/scripts/" + rest
                else:
                    fail("{} is installed to {}, which has no place in a wheel".format(
                        origin, where))
                path = installed[origin]
                files[arcname] = os.path.join(dest, os.path.relpath(path, os.sep))
        if not files:
            fail("the build installs nothing (was it configured with -Dwheel=true?)")

        tag = wheel_tag()
        dist_info = "{}-{}.dist-info".format(name, version)
        metadata = ["Metadata-Version: 2.1", "Name: " + name, "Version: " + version]
        if "description" in meta:
            metadata.append("Summary: " + meta["description"])
        if "requires-python" in meta:
            metadata.append("Requires-Python: " + meta["requires-python"])
        if "text" in meta.get("license", {}):
            metadata.append("License: " + meta["license"]["text"])
        metadata += ["Requires-Dist: " + d for d in meta.get("dependencies", [])]
        wheel_info = ["Wheel-Version: 1.0", "Generator: bagua python/build_wheel.py",
                      "Root-Is-Purelib: false", "Tag: " + tag]

        os.makedirs(args.outdir, exist_ok=True)
        out = os.path.join(args.outdir, "{}-{}-{}.whl".format(name, version, tag))
        record = []
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as whl:
            for arcname in sorted(files):
                path = files[arcname]
                with open(path, "rb") as f:
                    data = f.read()
                info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
                info.external_attr = (os.stat(path).st_mode & 0o777 | 0o100000) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                whl.writestr(info, data)
                record.append(record_line(arcname, data))
            for fname, lines in (("METADATA", metadata), ("WHEEL", wheel_info)):
                data = ("\n".join(lines) + "\n").encode()
                whl.writestr(dist_info + "/" + fname, data)
                record.append(record_line(dist_info + "/" + fname, data))
            record.append(dist_info + "/RECORD,,")
            whl.writestr(dist_info + "/RECORD", "\n".join(record) + "\n")
        print(out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if log is not sys.stderr:
            log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
