"""Running documentation blocks as a reader would: a workspace per block, the standard substitutions, then
commands, programs and config files for real.

The reader's machine, as the tests build it for each block (``Workspace``):

* a fresh temporary working directory, and on ``PATH`` first: ``tiered``
  (the real command through this interpreter; ``docs_tiered.py``: it never
  binds an address off loopback), ``python3``/``python`` (this interpreter),
  and ``curl`` with ``--fail-with-body --silent --show-error`` and a time
  limit, so an HTTP error fails the command as it would fail a script;
* ``/etc/tiered/`` and ``/var/lib/tiered`` moved under the workspace: the
  admin token file ``/etc/tiered/admin-token`` holds the document server's
  admin token, ``/var/lib/tiered`` is an empty data dir no server holds;
* the documented address (``localhost:4437``, ``127.0.0.1:4437``, and the
  service name in ``http://tiered:4437``) is the document's server, a
  ``tiered serve`` on a free loopback port with that admin token (started by
  the test only for documents whose blocks use it); ``TIERED_ADMIN_TOKEN=...``
  is that token;
* each ``tiered serve`` command runs on its own free port and data dir
  (``TIERED_PORT``, ``TIERED_DATA_DIR``; flags and ``--config`` files the
  docs give still win): it runs in the background until it logs
  ``tiered listening on``, stays up while the rest of the block runs, and
  must exit 0 on SIGTERM at the end;
* no ``TIERED_*`` variable of the test's own environment leaks in (nor pytest's about this run).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.docs_blocks import Block, Command, ExpectExit, Replace
from tiered.core.config import Config, load_config

ROOT = Path(__file__).resolve().parent.parent.parent
TIERED_SHIM = Path(__file__).with_name("docs_tiered.py")
PYTHON_DRIVER = Path(__file__).with_name("docs_python.py")

DOCUMENTED_ADDRESS = re.compile(r"\b(?:localhost|127\.0\.0\.1|tiered):4437\b")
LISTENING = re.compile(r"tiered listening on (https?://[^\s\"]+)")
_SERVE = re.compile(
    r"^(?P<assign>(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*)(?P<rest>tiered\s+serve\b.*?)\s*&?\s*$", re.S
)
START_TIMEOUT_S = 90.0  # the machine may be loaded: a deadline, not an expectation
COMMAND_TIMEOUT_S = 240.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Workspace:
    """Everything one block runs in; see the module docstring."""

    root: Path
    admin_token: str
    server_address: str | None = None  # host:port of the document's server, when the block uses it
    env: dict[str, str] = field(default_factory=dict)

    @property
    def cwd(self) -> Path:
        return self.root / "work"

    @property
    def etc(self) -> Path:
        return self.root / "etc" / "tiered"

    @property
    def data_dir(self) -> Path:
        return self.root / "var" / "lib" / "tiered"

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def out(self) -> Path:
        return self.root / "out"

    @property
    def server_url(self) -> str:
        assert self.server_address is not None, "this block does not use the document's server"
        return f"http://{self.server_address}"


def _script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def make_workspace(root: Path, admin_token: str, server_address: str | None = None) -> Workspace:
    ws = Workspace(root, admin_token, server_address)
    for directory in (ws.cwd, ws.etc, ws.data_dir, ws.bin, ws.out):
        directory.mkdir(parents=True, exist_ok=True)
    (ws.etc / "admin-token").write_text(admin_token + "\n")
    python = shlex.quote(sys.executable)
    _script(ws.bin / "tiered", f'exec {python} {shlex.quote(str(TIERED_SHIM))} "$@"')
    for name in ("python3", "python"):
        _script(ws.bin / name, f'exec {python} "$@"')
    curl = shutil.which("curl")
    if curl is not None:
        _script(
            ws.bin / "curl",
            f'exec {shlex.quote(curl)} --fail-with-body --silent --show-error --max-time 60 "$@"',
        )
    # The reader's environment: none of the test run's own settings (tiered's, or pytest's about this run).
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TIERED_", "PYTEST_XDIST_")) and k != "PYTEST_CURRENT_TEST"
    }
    env["PATH"] = f"{ws.bin}{os.pathsep}{env.get('PATH', '')}"
    env["DOCS_REPO"] = str(ROOT)
    env["DOCS_ADMIN_TOKEN"] = admin_token
    if server_address is not None:
        env["DOCS_URL"] = f"http://{server_address}"
    ws.env = env
    return ws


def require_tool(name: str) -> None:
    """Skip without a tool the docs use, except under CI (``CI=true``), where a skip would hide a missing install."""
    if shutil.which(name) is not None:
        return
    import pytest

    if os.environ.get("CI") == "true":
        pytest.fail(f"{name} is required under CI to run the docs' commands", pytrace=False)
    pytest.skip(f"{name} is not installed: the docs' commands that use it cannot run")


def new_token() -> str:
    return secrets.token_urlsafe(24)


# --------------------------------------------------------------------------- substitutions


def needs_server(text: str) -> bool:
    """Whether a block talks to the documented address (and so to the document's server)."""
    return DOCUMENTED_ADDRESS.search(text) is not None


def apply_replacements(block: Block) -> str:
    """The block's text with its ``replace`` markers applied; a marker whose text is gone is an error."""
    text = block.text
    for rep in block.of(Replace):
        if rep.old not in text:
            raise AssertionError(f"{block.where}: docs-test replace marker: {rep.old!r} is not in the block")
        text = text.replace(rep.old, rep.new)
    return text


def substitute(text: str, ws: Workspace, *, toml: bool = False) -> str:
    """The standard substitutions (module docstring): paths, the documented address, the admin token."""
    if ws.server_address is not None:
        text = DOCUMENTED_ADDRESS.sub(ws.server_address, text)
    text = re.sub(r"(?<![\w./-])/etc/tiered/", f"{ws.etc}/", text)
    text = re.sub(r"(?<![\w./-])/var/lib/tiered\b", str(ws.data_dir), text)
    text = text.replace("TIERED_ADMIN_TOKEN=...", f"TIERED_ADMIN_TOKEN={ws.admin_token}")
    if toml:
        text = re.sub(r"(?m)^(\s*port\s*=\s*)\d+", lambda m: f"{m[1]}{free_port()}", text)
    return text


# --------------------------------------------------------------------------- commands


@dataclass
class CommandResult:
    command: Command
    text: str  # as run, after substitutions
    server: bool
    rc: int | None = None  # None: a server still running (or one that never answered)
    stdout: str = ""
    stderr: str = ""
    url: str | None = None  # a server's URL, from its "tiered listening on" line
    proc: subprocess.Popen[bytes] | None = None

    def describe(self) -> str:
        return (
            f"line {self.command.line}: {self.text.strip()}\n  exit code: {self.rc}"
            + (f", URL {self.url}" if self.url else "")
            + f"\n  stdout: {_tail(self.stdout)}\n  stderr: {_tail(self.stderr)}"
        )


def _tail(output: str) -> str:
    return output[-3000:].rstrip() or "(empty)"


class Session:
    """One shell session across a block's commands: exported variables and the directory carry over."""

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.env_file = ws.out / "session.env"
        self.cwd_file = ws.out / "session.cwd"
        self.env_file.write_text("")
        self.cwd_file.write_text(str(ws.cwd))
        self.results: list[CommandResult] = []

    def _prologue(self) -> str:
        return (
            f'. {shlex.quote(str(self.env_file))}\ncd "$(cat {shlex.quote(str(self.cwd_file))})" || exit 97\n'
        )

    def run(self, command: Command, text: str) -> CommandResult:
        serve = _SERVE.match(text.strip())
        if serve is not None:
            return self._start_server(command, text, serve["assign"], serve["rest"])
        if re.search(r"(?<![&|])&\s*(#.*)?$", text.strip()):
            raise AssertionError(f"line {command.line}: only `tiered serve` may run in the background here")
        if re.search(r"\btiered\s+serve\b", text.split(" #", 1)[0]):
            # It would never end: the harness runs a server only as a command of its own.
            raise AssertionError(f"line {command.line}: `tiered serve` must be a command of its own here")
        script = (
            self._prologue()
            + "{ "
            + text
            + "\n}\n__docs_rc=$?\n"
            + f"export -p > {shlex.quote(str(self.env_file))}\npwd > {shlex.quote(str(self.cwd_file))}\n"
            + "exit $__docs_rc\n"
        )
        result = CommandResult(command, text, server=False)
        try:
            done = subprocess.run(
                ["bash", "-c", script],
                capture_output=True,
                env=self.ws.env,
                cwd=self.ws.cwd,
                timeout=COMMAND_TIMEOUT_S,
                start_new_session=True,
            )
            result.rc, result.stdout, result.stderr = (
                done.returncode,
                done.stdout.decode(errors="replace"),
                done.stderr.decode(errors="replace"),
            )
        except subprocess.TimeoutExpired as exc:
            result.stderr = f"(timed out after {exc.timeout} s)"
        self.results.append(result)
        return result

    def _start_server(self, command: Command, text: str, assign: str, rest: str) -> CommandResult:
        index = len(self.results) + 1
        out, err = self.ws.out / f"serve-{index}.out", self.ws.out / f"serve-{index}.err"
        defaults = ""
        if "--config" not in rest:
            data = self.ws.root / f"serve-{index}-data"
            defaults = f"export TIERED_PORT={free_port()} TIERED_DATA_DIR={shlex.quote(str(data))}\n"
        script = self._prologue() + defaults + f"{assign}exec {rest}\n"
        result = CommandResult(command, text, server=True)
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            result.proc = subprocess.Popen(
                ["bash", "-c", script], stdout=stdout, stderr=stderr, env=self.ws.env, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            exited = result.proc.poll()
            logged = err.read_text(errors="replace") + out.read_text(errors="replace")
            found = LISTENING.search(logged)
            if found is not None:
                result.url = found[1]
                break
            if exited is not None:
                result.rc = exited
                break
            time.sleep(0.05)
        result.stdout, result.stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        self.results.append(result)
        return result

    def stop_servers(self) -> None:
        """SIGTERM every server still running and record how it exited (a clean stop is 0)."""
        for result in self.results:
            proc = result.proc
            if proc is None or proc.poll() is not None:
                if proc is not None and result.rc is None:
                    result.rc = proc.returncode
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                result.rc = proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
                result.stderr += "\n(did not stop within 60 s of SIGTERM: killed)"
                result.rc = None
                continue
            index = self.results.index(result) + 1
            result.stdout = (self.ws.out / f"serve-{index}.out").read_text(errors="replace")
            result.stderr = (self.ws.out / f"serve-{index}.err").read_text(errors="replace")


def command_failures(results: list[CommandResult], expected: list[ExpectExit]) -> list[str]:
    """What went wrong: a command that did not exit as expected (0 unless a marker says otherwise)."""
    by_index = {e.command: e for e in expected}
    failures = [
        f"marker expects command {i}, the block has {len(results)}" for i in by_index if i > len(results)
    ]
    for index, result in enumerate(results, 1):
        exp = by_index.get(index)
        if result.server and exp is None:
            if result.url is None:
                failures.append(f"command {index} did not start serving:\n{result.describe()}")
            elif result.rc != 0:
                failures.append(f"command {index} did not exit 0 on SIGTERM:\n{result.describe()}")
            continue
        code = exp.code if exp is not None else 0
        if result.server and result.url is not None:
            failures.append(
                f"command {index} should have exited {code} but started serving:\n{result.describe()}"
            )
        elif result.rc != code:
            failures.append(f"command {index} exited {result.rc}, expected {code}:\n{result.describe()}")
        elif exp is not None and exp.text is not None and exp.text not in result.stdout + result.stderr:
            failures.append(f"command {index} did not say {exp.text!r}:\n{result.describe()}")
    return failures


# --------------------------------------------------------------------------- programs and configs


def run_program(block: Block, source: str, ws: Workspace, prelude: str) -> subprocess.CompletedProcess[str]:
    """Run a python block with this interpreter (``docs_python.py``): the setup's prelude, then the block."""
    job = ws.out / "program.json"
    job.write_text(
        json.dumps({"source": source, "filename": block.path, "line": block.line + 1, "prelude": prelude})
    )
    return subprocess.run(
        [sys.executable, str(PYTHON_DRIVER), str(job)],
        capture_output=True,
        text=True,
        env=ws.env,
        cwd=ws.cwd,
        timeout=COMMAND_TIMEOUT_S,
    )


def load_documented_config(text: str, ws: Workspace) -> tuple[Path, Config]:
    """Write a toml block where the docs keep it and load it through tiered's loader, as ``serve`` does."""
    path = ws.etc / "tiered.toml"
    path.write_text(text)
    config = load_config(str(path), env={})
    problem = config.exposure_problem()
    assert problem is None, f"tiered serve --config would refuse to start: {problem}"
    return path, config


# --------------------------------------------------------------------------- synopses


def synopsis_problems(text: str) -> list[str]:
    """Every ``--flag`` a usage synopsis gives for a ``tiered`` command is an option of that command."""
    import argparse

    from tiered.cli.main import build_parser

    def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    problems: list[str] = []
    logical = re.sub(r"\\\n\s*", " ", text)
    found = False
    for line in logical.splitlines():
        words = line.replace("[", " ").replace("]", " ").split()
        if not words or words[0] != "tiered":
            continue
        found = True
        parser, name = build_parser(), ["tiered"]
        for word in words[1:]:
            nested = subcommands(parser)
            if word not in nested:
                break
            parser = nested[word]
            name.append(word)
        known = set(parser._option_string_actions)
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line):
            if flag not in known:
                problems.append(f"{' '.join(name)} has no option {flag}")
    if not found:
        problems.append("a synopsis must show a tiered command")
    return problems
