"""The Terraform module in terraform/, parsed with python-hcl2 (no terraform binary, no providers).

Shared by the offline module checks (``tests/deploy/test_terraform.py``) and by the IAM tests
(``tests/deploy/test_iam_policy.py``), which render the instance role's S3 policy from the
HCL and enforce it on moto: one parser, so the two cannot read the HCL apart.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hcl2

TERRAFORM = Path(__file__).resolve().parent.parent.parent / "terraform"


def unquote(value: str) -> str:
    # python-hcl2 >= 7 keeps the quotes of string literals ("\"x\""); older versions do not.
    if len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        return value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return value


def norm(node: Any) -> Any:
    """python-hcl2 output without its metadata keys and literal quotes, whatever its version."""
    if isinstance(node, dict):
        return {
            unquote(k): norm(v)
            for k, v in node.items()
            if not (isinstance(k, str) and k.startswith("__") and k.endswith("__"))
        }
    if isinstance(node, list):
        return [norm(v) for v in node]
    if isinstance(node, str):
        return unquote(node)
    return node


class Module:
    """The blocks of every .tf file in one directory, merged."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files = sorted(directory.glob("*.tf"))
        self.raw: dict[str, dict[str, Any]] = {}
        self.variables: dict[str, dict[str, Any]] = {}
        self.locals: dict[str, Any] = {}
        self.outputs: dict[str, dict[str, Any]] = {}
        self.modules: dict[str, dict[str, Any]] = {}
        self.resources: dict[tuple[str, str], dict[str, Any]] = {}
        self.data: dict[tuple[str, str], dict[str, Any]] = {}
        self.ephemeral: dict[tuple[str, str], dict[str, Any]] = {}
        self.terraform: list[dict[str, Any]] = []
        self.providers: list[dict[str, Any]] = []
        for path in self.files:
            with path.open() as f:
                parsed = norm(hcl2.load(f))
            self.raw[path.name] = parsed
            for block in parsed.get("variable", []):
                self.variables.update(block)
            for block in parsed.get("locals", []):
                for name, value in block.items():
                    assert name not in self.locals, f"local.{name} declared twice"
                    self.locals[name] = value
            for block in parsed.get("output", []):
                self.outputs.update(block)
            for block in parsed.get("module", []):
                self.modules.update(block)
            for kind, target in (
                ("resource", self.resources),
                ("data", self.data),
                ("ephemeral", self.ephemeral),
            ):
                for block in parsed.get(kind, []):
                    for rtype, named in block.items():
                        for rname, body in named.items():
                            assert (rtype, rname) not in target, f"{kind} {rtype}.{rname} declared twice"
                            target[(rtype, rname)] = body
            self.terraform += parsed.get("terraform", [])
            self.providers += parsed.get("provider", [])

    def resource(self, rtype: str, name: str) -> dict[str, Any]:
        assert (rtype, name) in self.resources, f"resource {rtype}.{name} is not declared"
        return self.resources[(rtype, name)]

    def resources_of(self, rtype: str) -> dict[str, dict[str, Any]]:
        return {name: body for (t, name), body in self.resources.items() if t == rtype}

    def strings(self, *, skip_variable_blocks: bool = False) -> Iterator[str]:
        for parsed in self.raw.values():
            for kind, body in parsed.items():
                if skip_variable_blocks and kind == "variable":
                    continue
                yield from strings(body)

    def resolve(self, value: Any) -> Any:
        """A `${local.x}` expression replaced by the local's value (recursively)."""
        if isinstance(value, str):
            m = re.fullmatch(r"\$\{local\.([A-Za-z_][\w-]*)\}", value)
            if m:
                return self.resolve(self.locals[m.group(1)])
        return value


def strings(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)
    elif isinstance(node, str):
        yield node


def blocks(body: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """A nested block's instances (hcl2 gives a list of dicts)."""
    value = body.get(name, [])
    return value if isinstance(value, list) else [value]


def one(body: dict[str, Any], name: str) -> dict[str, Any]:
    found = blocks(body, name)
    assert len(found) == 1, f"expected one {name} block, found {len(found)}"
    return found[0]


def statements(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Static and dynamic statements of an aws_iam_policy_document."""
    found = list(blocks(doc, "statement"))
    for dynamic in blocks(doc, "dynamic"):
        for label, body in dynamic.items():
            if label == "statement":
                found += blocks(body, "content")
    return found


def as_list(module: Module, value: Any) -> list[Any]:
    value = module.resolve(value)
    assert isinstance(value, list), f"expected a list, got {value!r}"
    return [module.resolve(v) for v in value]


# ---------------------------------------------------------------- rendering a policy document

_INTERPOLATION = re.compile(r"\$\{([^}]+)\}")


def render_policy(module: Module, document: str, refs: dict[str, str]) -> dict[str, Any]:
    """The JSON policy ``data.aws_iam_policy_document.<document>`` would produce.

    ``refs`` gives a value to every ``${...}`` expression other than ``local.*``
    (e.g. ``{"var.s3_prefix": "p", "aws_s3_bucket.cold.arn": "arn:aws:s3:::b"}``);
    an expression without one fails, so the rendering cannot drift from the HCL
    silently. Dynamic statements (the optional KMS grants, ``for_each`` over a
    variable that is empty by default) are left out, as with their defaults.
    """
    doc = module.data[("aws_iam_policy_document", document)]
    return {
        "Version": "2012-10-17",
        "Statement": [_render_statement(module, body, refs) for body in blocks(doc, "statement")],
    }


def _render_statement(module: Module, body: dict[str, Any], refs: dict[str, str]) -> dict[str, Any]:
    unknown = set(body) - {"sid", "effect", "actions", "resources", "condition"}
    assert not unknown, f"statement {body.get('sid')}: cannot render {sorted(unknown)}"
    statement: dict[str, Any] = {}
    if "sid" in body:
        statement["Sid"] = body["sid"]
    statement["Effect"] = body.get("effect", "Allow")
    statement["Action"] = sorted(_interpolate(module, a, refs) for a in as_list(module, body["actions"]))
    statement["Resource"] = [_interpolate(module, r, refs) for r in as_list(module, body["resources"])]
    conditions: dict[str, dict[str, list[str]]] = {}
    for condition in blocks(body, "condition"):
        values = [_interpolate(module, v, refs) for v in as_list(module, condition["values"])]
        conditions.setdefault(condition["test"], {})[condition["variable"]] = values
    if conditions:
        statement["Condition"] = conditions
    return statement


def _interpolate(module: Module, value: Any, refs: dict[str, str]) -> str:
    value = module.resolve(value)
    assert isinstance(value, str), f"cannot render {value!r} as a string"

    def substitute(m: re.Match[str]) -> str:
        expression = m.group(1)
        assert expression in refs, f"no value for ${{{expression}}}: pass it in refs"
        return refs[expression]

    return _INTERPOLATION.sub(substitute, value)


def policy_json(policy: dict[str, Any]) -> str:
    """The policy as the JSON text IAM takes."""
    return json.dumps(policy, indent=2, sort_keys=True)
