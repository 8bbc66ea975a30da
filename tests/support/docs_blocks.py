"""The fenced code blocks of the project's markdown, and the ``docs-test`` markers that say how each is tested.

Pure: markdown text in, blocks and problems out (no files run, nothing started).
``tests/docs/test_docs.py`` runs what this finds.

A block is classified by its info string:

* ``sh``, ``bash``, ``shell``: commands, run one after another in one shell
  session (``docs_runner.run_commands``);
* ``console``: ``$ command`` lines, each followed by the output it shows
  (``...`` matches any lines);
* ``python``: a program, run with the project's interpreter;
* ``toml``: a config file, loaded through tiered's own loader and served;
* ``json``, ``text`` or no info string: an example of something tiered
  produces; it must name that real thing (``shape NAME``) to be compared
  with it, or be a usage synopsis (``synopsis``), or be skipped with a reason.

A block that cannot run here is marked, in the markdown, right before its
fence (blank lines may separate them), with one-line HTML comments that do
not render::

    <!-- docs-test: skip (needs an AWS account) -->
    <!-- docs-test: setup certificate, jwks -->
    <!-- docs-test: replace "OLD" "NEW" (why the test runs something else) -->
    <!-- docs-test: command 2 exits 2 with "choose --auth" -->
    <!-- docs-test: shape usage-log-line -->
    <!-- docs-test: synopsis -->
    <!-- docs-test: config only (why it is not served) -->

A block nobody can classify, a marker that does not belong to a block, or a
marker that does not apply to its block's kind is a problem: the test fails,
so a new block is made runnable or consciously skipped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

# What is checked: every fenced block of these files (globs relative to the repository root).
DOC_GLOBS = ("README.md", "docs/*.md", "terraform/README.md")

SHELL_INFOS = frozenset({"sh", "bash", "shell"})
EXAMPLE_INFOS = frozenset({"json", "text", ""})


@dataclass(frozen=True)
class Skip:
    reason: str


@dataclass(frozen=True)
class Setup:
    names: tuple[str, ...]


@dataclass(frozen=True)
class Replace:
    old: str
    new: str
    reason: str


@dataclass(frozen=True)
class ExpectExit:
    command: int  # 1-based, in the order the block's commands run
    code: int
    text: str | None  # must appear in the command's stderr or stdout


@dataclass(frozen=True)
class Shape:
    name: str


@dataclass(frozen=True)
class Synopsis:
    pass


@dataclass(frozen=True)
class ConfigOnly:
    reason: str


Directive = Skip | Setup | Replace | ExpectExit | Shape | Synopsis | ConfigOnly
D = TypeVar("D", Skip, Setup, Replace, ExpectExit, Shape, Synopsis, ConfigOnly)


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    info: str  # the info string's first word, lower case ("" when there is none)
    text: str  # the content, the fence's indentation removed
    directives: tuple[Directive, ...] = ()

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def of(self, kind: type[D]) -> list[D]:
        return [d for d in self.directives if isinstance(d, kind)]


@dataclass(frozen=True)
class Problem:
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass
class Document:
    path: str
    blocks: list[Block] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)  # markers that belong to no block, bad markers


_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<body>.*?)\s*-->\s*$")
_QUOTED = r'"(?:[^"\\]|\\.)*"'
_DIRECTIVES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"skip \((?P<reason>.+)\)"), "skip"),
    (re.compile(r"setup (?P<names>[\w-]+(?:\s*,\s*[\w-]+)*)"), "setup"),
    (re.compile(rf"replace (?P<old>{_QUOTED}) (?P<new>{_QUOTED}) \((?P<reason>.+)\)"), "replace"),
    (re.compile(rf"command (?P<command>\d+) exits (?P<code>\d+)(?: with (?P<text>{_QUOTED}))?"), "exit"),
    (re.compile(r"shape (?P<name>[\w-]+)"), "shape"),
    (re.compile(r"synopsis"), "synopsis"),
    (re.compile(r"config only \((?P<reason>.+)\)"), "config-only"),
]


def parse_directive(body: str) -> Directive:
    """One marker's directive; ``ValueError`` says what is wrong with it."""
    for pattern, kind in _DIRECTIVES:
        m = pattern.fullmatch(body)
        if m is None:
            continue
        if kind == "skip":
            return Skip(m["reason"].strip())
        if kind == "setup":
            return Setup(tuple(name.strip() for name in m["names"].split(",")))
        if kind == "replace":
            return Replace(json.loads(m["old"]), json.loads(m["new"]), m["reason"].strip())
        if kind == "exit":
            return ExpectExit(int(m["command"]), int(m["code"]), json.loads(m["text"]) if m["text"] else None)
        if kind == "shape":
            return Shape(m["name"])
        if kind == "synopsis":
            return Synopsis()
        return ConfigOnly(m["reason"].strip())
    raise ValueError(
        f"unknown docs-test marker {body!r} (one of: skip (REASON), setup NAME[, NAME], "
        'replace "OLD" "NEW" (REASON), command K exits N [with "TEXT"], shape NAME, synopsis, '
        "config only (REASON))"
    )


def parse_markdown(path: str, text: str) -> Document:
    """Every fenced block of one markdown file, with the markers right before it."""
    doc = Document(path)
    lines = text.splitlines()
    pending: list[tuple[int, Directive]] = []  # markers waiting for their block
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = _MARKER.match(line)
        if marker is not None:
            try:
                pending.append((i + 1, parse_directive(marker["body"])))
            except ValueError as exc:
                doc.problems.append(Problem(path, i + 1, str(exc)))
            i += 1
            continue
        if "docs-test" in line and "<!--" in line:
            doc.problems.append(
                Problem(path, i + 1, "a docs-test marker must be one whole line: <!-- docs-test: ... -->")
            )
        fence = _FENCE.match(line)
        if fence is None:
            if line.strip() and pending:
                doc.problems.append(
                    Problem(path, pending[0][0], "docs-test marker not followed by a fenced code block")
                )
                pending = []
            i += 1
            continue
        indent, mark = len(fence["indent"]), fence["fence"]
        info = fence["info"].strip().split(maxsplit=1)
        closing = re.compile(rf"^ *{re.escape(mark[0])}{{{len(mark)},}}\s*$")
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not closing.match(lines[j]):
            content = lines[j]
            strip = min(indent, len(content) - len(content.lstrip(" ")))
            body.append(content[strip:])
            j += 1
        doc.blocks.append(
            Block(
                path,
                i + 1,
                info[0].lower() if info else "",
                "\n".join(body) + ("\n" if body else ""),
                tuple(d for _, d in pending),
            )
        )
        pending = []
        i = j + 1
    if pending:
        doc.problems.append(
            Problem(path, pending[0][0], "docs-test marker not followed by a fenced code block")
        )
    return doc


def doc_files(root: Path) -> list[Path]:
    """The markdown files whose blocks are checked, in a stable order."""
    found: list[Path] = []
    for pattern in DOC_GLOBS:
        found.extend(sorted(root.glob(pattern)))
    return found


def load_documents(root: Path) -> list[Document]:
    return [parse_markdown(p.relative_to(root).as_posix(), p.read_text()) for p in doc_files(root)]


# --------------------------------------------------------------------------- classification

# Which markers apply to which kind of block.
_ALLOWED: dict[str, tuple[type, ...]] = {
    "commands": (Setup, Replace, ExpectExit),
    "console": (Setup, Replace),
    "program": (Setup, Replace),
    "config": (Replace, ConfigOnly),
    "example": (Shape,),
    "synopsis": (Synopsis,),
    "skip": (Skip,),
}


def classify(block: Block) -> str:
    """The block's kind (a key of ``_ALLOWED``); ``ValueError`` says why it has none."""
    kinds = {type(d) for d in block.directives}
    if Skip in kinds:
        kind = "skip"
        if not block.of(Skip)[0].reason:
            raise ValueError("a skipped block needs a reason: <!-- docs-test: skip (REASON) -->")
    elif Synopsis in kinds:
        kind = "synopsis"
    elif block.info in SHELL_INFOS:
        kind = "commands"
    elif block.info == "console":
        kind = "console"
    elif block.info in ("python", "py"):
        kind = "program"
    elif block.info == "toml":
        kind = "config"
    elif block.info in EXAMPLE_INFOS and Shape in kinds:
        kind = "example"
    elif block.info in EXAMPLE_INFOS:
        shown = f"```{block.info}" if block.info else "a block without an info string"
        raise ValueError(
            f"{shown} is not run: name the real thing it shows (<!-- docs-test: shape NAME -->), mark it as a "
            "usage synopsis (<!-- docs-test: synopsis -->), or say why it is not checked "
            "(<!-- docs-test: skip (REASON) -->)"
        )
    else:
        raise ValueError(
            f"cannot classify ```{block.info}: make it one of sh/bash/console/python/toml/json/text, "
            "or mark it <!-- docs-test: skip (REASON) -->"
        )
    wrong = sorted({type(d).__name__ for d in block.directives if not isinstance(d, _ALLOWED[kind])})
    if wrong:
        raise ValueError(f"marker(s) {', '.join(wrong)} do not apply to a {kind} block")
    return kind


# --------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class Command:
    line: int  # 1-based line in the markdown file
    text: str  # one logical command line: continuations joined, as the shell reads it


def split_commands(block: Block) -> list[Command]:
    """A shell block's commands: one per logical line; blank lines and comment-only lines dropped."""
    commands: list[Command] = []
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        start = i
        text = lines[i]
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text + "\n" + lines[i]
        i += 1
        stripped = text.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if "<<" in stripped.split("#", 1)[0]:
            raise ValueError(f"{block.path}:{block.line + 1 + start}: here-documents are not supported here")
        commands.append(Command(block.line + 1 + start, text))
    return commands


@dataclass(frozen=True)
class ConsoleStep:
    line: int
    command: str
    output: tuple[str, ...]  # the lines shown after it; "..." matches any number of lines


def split_console(block: Block) -> list[ConsoleStep]:
    """A console block's ``$ command`` lines, each with the output lines shown after it."""
    steps: list[ConsoleStep] = []
    current: tuple[int, str] | None = None
    output: list[str] = []
    for offset, line in enumerate(block.text.splitlines()):
        if line.startswith("$ "):
            if current is not None:
                steps.append(ConsoleStep(current[0], current[1], tuple(output)))
            current, output = (block.line + 1 + offset, line[2:]), []
        elif current is None:
            if line.strip():
                raise ValueError(
                    f"{block.path}:{block.line + 1 + offset}: console output before any $ command"
                )
        else:
            output.append(line)
    if current is not None:
        while output and not output[-1].strip():
            output.pop()
        steps.append(ConsoleStep(current[0], current[1], tuple(output)))
    return steps


def output_matches(shown: tuple[str, ...], actual: str) -> bool:
    """Whether the output lines shown (``...`` = any lines, trailing spaces ignored) are what ran printed."""
    pattern = "".join(
        r"(?:.*\n)*?" if line.strip() == "..." else re.escape(line.rstrip()) + r"[ \t]*\n" for line in shown
    )
    text = "".join(line.rstrip() + "\n" for line in actual.splitlines())
    return re.fullmatch(pattern, text) is not None
