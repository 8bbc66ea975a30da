"""Docs that run as written: every code block of README.md, docs/*.md and terraform/README.md is run or checked.

``tests/support/docs_blocks.py`` finds the blocks and classifies them by info string and
``docs-test`` markers; this module runs each one as its own test (so a failure
names the file and line):

* commands (``sh``/``bash``) run in one shell session, on the reader's
  machine as ``tests/support/docs_runner.py`` builds it (a temporary directory, ``tiered``
  through this interpreter, the documented address pointing at a server on
  a free loopback port); each must exit 0 unless a marker says otherwise,
  and ``tiered serve`` commands must start serving and stop cleanly;
* python blocks run as programs, with the setups' stubs and checks
  (``tests/support/docs_setups.py``);
* toml blocks load through tiered's config loader, and are served with
  ``tiered serve --config`` unless marked ``config only`` with a reason;
* json and text examples are compared with what a real server produces
  (``tests/support/docs_examples.py``); usage synopses are checked against the argument
  parser;
* a block marked ``skip`` is reported as skipped with its reason; a block
  that is neither runnable nor marked fails.

Servers are shared per document (one ``tiered serve`` for the blocks of one
file that use the documented address) and the examples' scenario runs at
most once per log format, so the whole module takes about a minute.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.docs_blocks import (
    Block,
    Command,
    ConfigOnly,
    Document,
    ExpectExit,
    Setup,
    Shape,
    Skip,
    classify,
    load_documents,
    output_matches,
    parse_markdown,
    split_commands,
    split_console,
)
from tests.support.docs_examples import SHAPES, RealThings, example_problems, infer, line_pattern, validate
from tests.support.docs_runner import (
    ROOT,
    Session,
    Workspace,
    apply_replacements,
    command_failures,
    load_documented_config,
    make_workspace,
    needs_server,
    new_token,
    require_tool,
    run_program,
    substitute,
    synopsis_problems,
)
from tests.support.docs_setups import SETUPS, DocSetup, setups_named
from tests.support.server_process import ServerProcess

DOCUMENTS = load_documents(ROOT)
BLOCKS = [block for doc in DOCUMENTS for block in doc.blocks]


class DocServers:
    """One ``tiered serve`` per document whose blocks use the documented address, started on first use."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.token = new_token()
        self.token_file = directory / "admin-token"
        self.token_file.write_text(self.token)
        self.servers: dict[str, ServerProcess] = {}

    def address(self, document: str) -> str:
        if document not in self.servers:
            name = document.replace("/", "-")
            srv = ServerProcess(
                self.directory / name,
                *("--admin-token-file", str(self.token_file)),
                # Live reads in the docs (curl ... live=sse) end soon, as on a server with short timeouts.
                *("--long-poll-timeout-s", "1", "--sse-max-connection-s", "1"),
            )
            self.servers[document] = srv.start(timeout=90)
        return f"127.0.0.1:{self.servers[document].port}"

    def stop(self) -> None:
        for srv in self.servers.values():
            srv.stop()


@pytest.fixture(scope="session")
def doc_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocServers]:
    servers = DocServers(tmp_path_factory.mktemp("doc-servers"))
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture(scope="session")
def real_things(tmp_path_factory: pytest.TempPathFactory) -> RealThings:
    return RealThings(tmp_path_factory.mktemp("doc-examples"))


# --------------------------------------------------------------------------- the docs


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: d.path)
def test_markers_belong_to_blocks(document: Document) -> None:
    assert not document.problems, "\n".join(map(str, document.problems))


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.where)
def test_block(block: Block, tmp_path: Path, doc_servers: DocServers, real_things: RealThings) -> None:
    try:
        kind = classify(block)
    except ValueError as exc:
        pytest.fail(f"{block.where}: {exc}", pytrace=False)
    if kind == "skip":
        pytest.skip(f"{block.where}: {block.of(Skip)[0].reason}")
    if kind == "example":
        problems = example_problems(block.of(Shape)[0].name, block.text, real_things)
        assert not problems, f"{block.where}: the example differs from the real thing:\n" + "\n".join(
            problems
        )
        return
    if kind == "synopsis":
        problems = synopsis_problems(block.text)
        assert not problems, f"{block.where}: " + "; ".join(problems)
        return
    text = apply_replacements(block)
    server = doc_servers.address(block.path) if needs_server(text) else None
    ws = make_workspace(tmp_path, doc_servers.token, server)
    setups = setups_named(tuple(name for s in block.of(Setup) for name in s.names))
    if "curl" in text:
        require_tool("curl")
    for setup in setups:
        if setup.prepare is not None:
            setup.prepare(ws)
    if kind == "commands":
        run_command_block(dataclasses.replace(block, text=text), ws, setups)
    elif kind == "console":
        run_console_block(dataclasses.replace(block, text=text), ws)
    elif kind == "program":
        proc = run_program(block, substitute(text, ws), ws, "\n".join(s.prelude for s in setups))
        assert proc.returncode == 0, (
            f"{block.where}: the program failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    else:
        assert kind == "config"
        run_config_block(block, substitute(text, ws, toml=True), ws)


def run_command_block(block: Block, ws: Workspace, setups: list[DocSetup]) -> None:
    session = Session(ws)
    after_error: AssertionError | None = None
    try:
        for command in split_commands(block):
            session.run(command, substitute(command.text, ws))
        try:
            for setup in setups:
                if setup.after is not None:
                    setup.after(ws, session.results)
        except AssertionError as exc:
            after_error = exc
    finally:
        session.stop_servers()
    failures = command_failures(session.results, block.of(ExpectExit))
    assert not failures, f"{block.where}:\n" + "\n".join(failures)
    if after_error is not None:
        raise AssertionError(f"{block.where}: {after_error}") from after_error


def run_console_block(block: Block, ws: Workspace) -> None:
    session = Session(ws)
    try:
        for step in split_console(block):
            result = session.run(Command(step.line, step.command), substitute(step.command, ws))
            assert result.rc == 0, f"{block.where}: {result.describe()}"
            assert output_matches(step.output, result.stdout), (
                f"line {step.line}: the output is not what the docs show:\n{result.stdout}"
            )
    finally:
        session.stop_servers()
    failures = command_failures([r for r in session.results if r.server], [])
    assert not failures, f"{block.where}:\n" + "\n".join(failures)


def run_config_block(block: Block, text: str, ws: Workspace) -> None:
    path, _ = load_documented_config(text, ws)
    if block.of(ConfigOnly):
        return  # loaded and checked as serve checks it; not served, for the marker's reason
    session = Session(ws)
    try:
        session.run(Command(block.line, f"tiered serve --config {path}"), f"tiered serve --config {path}")
    finally:
        session.stop_servers()
    failures = command_failures(session.results, [])
    assert not failures, f"{block.where}: tiered serve --config with this file:\n" + "\n".join(failures)


def test_every_setup_and_shape_is_used() -> None:
    """A setup or a real thing no block names is dead weight (or a marker was lost in a merge)."""
    used_setups = {name for b in BLOCKS for s in b.of(Setup) for name in s.names}
    used_shapes = {s.name for b in BLOCKS for s in b.of(Shape)}
    assert set(SETUPS) - used_setups == set()
    assert set(SHAPES) - used_shapes == set()


# --------------------------------------------------------------------------- the harness itself


def _doc(markdown: str) -> list[Block]:
    doc = parse_markdown("x.md", textwrap.dedent(markdown))
    assert not doc.problems, doc.problems
    return doc.blocks


def test_unmarked_blocks_that_cannot_run_fail() -> None:
    blocks = _doc(
        """
        ```yaml
        a: 1
        ```
        ```json
        {"a": 1}
        ```
        ```
        some output
        ```
        ```text
        a log line
        ```
        """
    )
    for block in blocks:
        with pytest.raises(ValueError):
            classify(block)


def test_markers_classify_and_are_checked() -> None:
    blocks = _doc(
        """
        <!-- docs-test: skip (needs an AWS account) -->
        ```sh
        terraform apply
        ```
        <!-- docs-test: setup certificate, jwks -->

        <!-- docs-test: command 2 exits 2 with "choose --auth" -->
        ```bash
        tiered serve
        ```
        <!-- docs-test: shape usage-log-line -->
          ```json
          {"a": 1}
          ```
        <!-- docs-test: shape usage-log-line -->
        ```sh
        echo
        ```
        """
    )
    assert classify(blocks[0]) == "skip" and blocks[0].of(Skip)[0].reason == "needs an AWS account"
    assert classify(blocks[1]) == "commands"
    assert blocks[1].of(Setup)[0].names == ("certificate", "jwks")
    assert blocks[1].of(ExpectExit) == [ExpectExit(2, 2, "choose --auth")]
    assert classify(blocks[2]) == "example" and blocks[2].text == '{"a": 1}\n'
    with pytest.raises(ValueError, match="do not apply"):
        classify(blocks[3])


def test_stray_and_unknown_markers_are_problems() -> None:
    doc = parse_markdown(
        "x.md",
        "<!-- docs-test: skip (why) -->\nSome text.\n\n<!-- docs-test: run it please -->\n```sh\ntrue\n```\n",
    )
    messages = [p.message for p in doc.problems]
    assert len(messages) == 2
    assert "not followed by a fenced code block" in messages[0]
    assert "unknown docs-test marker" in messages[1]


def test_commands_are_logical_lines() -> None:
    (block,) = _doc(
        """
        ```sh
        # a comment
        echo one   # trailing
        echo two \\
            three

        echo four
        ```
        """
    )
    assert [c.text for c in split_commands(block)] == [
        "echo one   # trailing",
        "echo two \\\n    three",
        "echo four",
    ]
    assert [c.line for c in split_commands(block)] == [4, 5, 8]


def test_a_session_carries_exports_and_reports_each_failure(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, "token")
    session = Session(ws)
    for i, text in enumerate(
        ["export GREETING=hi && cd /", 'test "$GREETING" = hi && test "$PWD" = /', "false"]
    ):
        session.run(Command(i + 1, text), text)
    assert [r.rc for r in session.results] == [0, 0, 1]
    failures = command_failures(session.results, [])
    assert len(failures) == 1 and failures[0].startswith("command 3 exited 1, expected 0")
    assert command_failures(session.results, [ExpectExit(3, 1, None)]) == []
    assert command_failures(session.results, [ExpectExit(3, 1, None), ExpectExit(4, 0, None)]) == [
        "marker expects command 4, the block has 3"
    ]


def test_a_server_command_must_serve_and_stop_cleanly(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, "token")
    session = Session(ws)
    try:
        serving = session.run(Command(1, "tiered serve"), "tiered serve")
        refused = session.run(Command(2, "tiered serve --host 0.0.0.0"), "tiered serve --host 0.0.0.0")
    finally:
        session.stop_servers()
    assert serving.url is not None and serving.url.startswith("http://127.0.0.1:") and serving.rc == 0
    assert refused.url is None and refused.rc == 2 and "choose --auth" in refused.stderr
    assert command_failures(session.results, [ExpectExit(2, 2, "choose --auth")]) == []
    assert len(command_failures(session.results, [])) == 1


def test_substitutions_point_the_docs_at_the_test(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, "secret", "127.0.0.1:5555")
    text = "TIERED_ADMIN_TOKEN=... tiered gc --url http://tiered:4437 --data-dir /var/lib/tiered\ncurl localhost:4437/x"
    assert substitute(text, ws) == (
        f"TIERED_ADMIN_TOKEN=secret tiered gc --url http://127.0.0.1:5555 --data-dir {ws.data_dir}\n"
        "curl 127.0.0.1:5555/x"
    )
    assert substitute("admin_token_file = '/etc/tiered/admin-token'", ws) == (
        f"admin_token_file = '{ws.etc}/admin-token'"
    )
    assert "port = 4437" not in substitute("port = 4437\n", ws, toml=True)


def test_console_output_matching() -> None:
    assert output_matches(("hello", "..."), "hello\nmore\nlines\n")
    assert output_matches(("a", "...", "z"), "a\nz\n")
    assert not output_matches(("hello",), "hello\nmore\n")
    (block,) = _doc("```console\n$ echo hi\nhi\n$ true\n```\n")
    steps = split_console(block)
    assert [(s.command, s.output) for s in steps] == [("echo hi", ("hi",)), ("true", ())]


def test_json_examples_are_validated_against_samples() -> None:
    schema = infer([{"a": 1, "b": [{"c": "x"}], "d": 0.5}, {"a": 2, "b": [], "d": 1.5, "e": None}])
    assert validate({"a": 3, "b": [{"c": "y"}], "d": 2}, schema) == []
    assert validate({"a": 3, "b": [{"c": "y"}], "d": 2, "e": None}, schema) == []
    assert validate({"a": "3", "b": [], "d": 1.0}, schema) == ["$.a: string here, the real thing has integer"]
    assert validate({"b": [], "d": 1.0}, schema) == ["$: the real thing always has 'a', the example does not"]
    assert validate({"a": 1, "b": [], "d": 1.0, "f": 1}, schema) == ["$: the real thing never has 'f'"]
    assert validate({"a": 1, "b": [{"c": "x", "g": 1}], "d": 1.0}, schema) == [
        "$.b[0]: the real thing never has 'g'"
    ]
    empty = infer([{"l": []}])
    assert validate({"l": [1]}, empty) == ["$.l[0]: no real sample had an element here to compare with"]


def test_log_line_templates() -> None:
    pattern = line_pattern(
        "2026-12-03 06:02:47,005 WARNING tiered.access: request failed method=POST status=503 request_id=myreq-3"
    )
    assert pattern.fullmatch(
        "2027-01-01 00:00:00,123 WARNING tiered.access: request failed method=GET status=500 request_id=x-1"
    )
    assert not pattern.fullmatch(
        "2027-01-01 00:00:00,123 WARNING tiered.access: request failed method=GET request_id=x-1"
    )
    skip = line_pattern(
        "group 'billing': moved from 0000000000000000_0000000000000300 to x, 600 bytes skipped"
    )
    assert skip.fullmatch("group 'g-1': moved from 0000000000000001_0000000000000000 to x, 7 bytes skipped")
    assert not skip.fullmatch("group 'g-1': moved from 1 to x, 7 bytes skipped")


def test_synopsis_flags_are_checked() -> None:
    assert synopsis_problems("tiered cluster take-over --shard N [--to NODE] [--dry-run]") == []
    assert synopsis_problems("tiered gc --url U --dry-run") == []
    assert synopsis_problems("tiered cluster take-over --shard N [--force]") == [
        "tiered cluster take-over has no option --force"
    ]
    assert synopsis_problems("some other command --x") == ["a synopsis must show a tiered command"]


def test_a_console_block_runs_and_its_output_is_compared(tmp_path: Path) -> None:
    (shown,) = _doc("```console\n$ export WHO=docs\n$ echo hello $WHO; echo more\nhello docs\n...\n```\n")
    run_console_block(shown, make_workspace(tmp_path / "right", "token"))
    (wrong,) = _doc("```console\n$ echo hello\ngoodbye\n```\n")
    with pytest.raises(AssertionError, match="not what the docs show"):
        run_console_block(wrong, make_workspace(tmp_path / "wrong", "token"))
