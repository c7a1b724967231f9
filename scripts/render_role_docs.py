#!/usr/bin/env python3
"""Render roles/<name>/README.md from roles/<name>/meta/argument_specs.yml (the spec is the one source).

    .venv/bin/python scripts/render_role_docs.py           # write every role's README.md
    .venv/bin/python scripts/render_role_docs.py --check   # exit 1 listing the READMEs that are stale

The README carries the entry points with their descriptions, one variables table per entry point (defaults as
written in the spec) and an example quoted from the playbook in playbooks/ that uses the role.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
REGENERATE = ".venv/bin/python scripts/render_role_docs.py"

# Ansible's documentation markup: C(code), O(option), V(value), M(module) -> code; I() italic; B() bold; U() link.
_MARKUP = re.compile(r"`[^`]*`|\b([COVMIBU])\(([^)]*)\)")


def _escape(text: str, in_table: bool) -> str:
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("|", "\\|") if in_table else text


def _code(text: str, in_table: bool = False) -> str:
    if in_table:
        text = text.replace("|", "\\|")
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" or text.startswith(" ") or text.endswith(" ") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def inline(text: str, in_table: bool = False) -> str:
    """Markdown of one description text: Ansible markup converted, HTML-significant characters escaped."""
    out: list[str] = []
    pos = 0
    for match in _MARKUP.finditer(text):
        out.append(_escape(text[pos : match.start()], in_table))
        kind, arg = match.group(1), match.group(2)
        if kind is None:
            out.append(_code(match.group(0)[1:-1], in_table))
        elif kind in "COVM":
            out.append(_code(arg, in_table))
        elif kind == "I":
            out.append(f"*{_escape(arg, in_table)}*")
        elif kind == "B":
            out.append(f"**{_escape(arg, in_table)}**")
        else:
            out.append(f"<{arg}>")
        pos = match.end()
    out.append(_escape(text[pos:], in_table))
    return "".join(out)


def _paragraphs(description: str | list[str] | None) -> list[str]:
    if description is None:
        return []
    items = [description] if isinstance(description, str) else description
    return [" ".join(str(item).split()) for item in items]


def show_default(value: Any) -> str:
    """The default as the spec writes it: strings bare unless YAML would read them as something else."""
    if isinstance(value, str):
        try:
            plain = value != "" and yaml.safe_load(value) == value
        except yaml.YAMLError:
            plain = False
        if not plain:
            return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return str(value)
    return yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False).strip()


def _type(option: dict[str, Any]) -> str:
    kind = str(option.get("type", "str"))
    if kind == "list" and "elements" in option:
        kind = f"list of {option['elements']}"
    return kind


def _rows(options: dict[str, Any], role_defaults: dict[str, Any], prefix: str = "") -> list[str]:
    rows: list[str] = []
    for name, option in options.items():
        option = option or {}
        if "default" in option:
            default = _code(show_default(option["default"]), in_table=True)
        elif option.get("required"):
            default = "**required**"
        elif not prefix and name in role_defaults:
            default = "*(defaults/main.yml)*"
        else:
            default = ""
        description = " ".join(inline(p, in_table=True) for p in _paragraphs(option.get("description")))
        if option.get("choices"):
            choices = ", ".join(_code(show_default(c), in_table=True) for c in option["choices"])
            description = f"{description} Choices: {choices}.".strip()
        rows.append(f"| {_code(prefix + name)} | {_type(option)} | {default} | {description} |")
        if option.get("options"):
            rows.extend(_rows(option["options"], role_defaults, prefix=f"{prefix}{name}."))
    return rows


def _example(role: str, playbooks_dir: Path) -> tuple[str, str]:
    """(source, YAML) of the first play in playbooks/ that uses the role: play header and its role lines."""
    use = re.compile(rf"^\s*(- )?(role|name):\s*['\"]?{re.escape(role)}['\"]?\s*$")
    for playbook in sorted(playbooks_dir.glob("*.yml")):
        lines = playbook.read_text().splitlines()
        for index, line in enumerate(lines):
            match = use.match(line)
            if not match:
                continue
            if match.group(2) == "name":
                # `name: <role>` counts under include_role/import_role only; quote the enclosing task.
                if index == 0 or not re.match(r"^\s*(ansible\.builtin\.)?(include|import)_role:", lines[index - 1]):
                    continue
                start = next(i for i in range(index - 1, -1, -1) if re.match(r"^\s*- ", lines[i]))
            else:
                start = index
            return _quote(lines, start, playbook)
    return "", f"- hosts: all\n  roles:\n    - {role}\n"


def _quote(lines: list[str], start: int, playbook: Path) -> tuple[str, str]:
    item_indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > item_indent):
        end += 1
    while not lines[end - 1].strip():
        end -= 1
    play = max(i for i in range(start + 1) if lines[i].startswith("- "))
    header = [lines[play]] + [line for line in lines[play + 1 : start] if re.match(r"^  (hosts|roles|tasks):", line)]
    source = playbook.relative_to(playbook.parent.parent).as_posix()
    return source, "\n".join([*header, *lines[start:end]]) + "\n"


def render(role_dir: Path, playbooks_dir: Path) -> str:
    """README.md text of one role."""
    role = role_dir.name
    spec = yaml.safe_load((role_dir / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    defaults_file = role_dir / "defaults" / "main.yml"
    role_defaults = (yaml.safe_load(defaults_file.read_text()) or {}) if defaults_file.is_file() else {}
    entries = sorted(spec, key=lambda name: name != "main")  # main first, the others in the spec's order

    out = [f"# Role `{role}`", ""]
    main = spec.get("main", {})
    if main.get("short_description"):
        out += [inline(" ".join(str(main["short_description"]).split())), ""]
    if main.get("description"):
        out += [f"- {inline(p)}" for p in _paragraphs(main["description"])] + [""]

    others = [name for name in entries if name != "main"]
    if others:
        out += ["## Entry points", ""]
        for name in entries:
            how = "`roles: [" + role + "]`" if name == "main" else f"`tasks_from: {name}.yml`"
            short = inline(" ".join(str(spec[name].get("short_description", "")).split()))
            out.append(f"- **{name}** ({how}): {short}")
            out += [f"  - {inline(p)}" for p in _paragraphs(spec[name].get("description")) if name != "main"]
        out.append("")

    out += ["## Variables", ""]
    for name in entries:
        if others:
            out += [f"### Entry point `{name}`", ""]
        options = spec[name].get("options") or {}
        if not options:
            out += ["No variables.", ""]
            continue
        out += ["| Name | Type | Default | Description |", "| --- | --- | --- | --- |"]
        out += [*_rows(options, role_defaults), ""]

    source, example = _example(role, playbooks_dir)
    out += ["## Example", ""]
    out += [f"From `{source}`:" if source else "A minimal play:", "", "```yaml", example.rstrip("\n"), "```", ""]
    out += [
        "---",
        "",
        "Generated from `meta/argument_specs.yml` by `scripts/render_role_docs.py`; do not edit by hand.",
        f"Regenerate with `{REGENERATE}`.",
        "",
    ]
    return "\n".join(out)


def role_dirs(root: Path = REPO) -> list[Path]:
    return sorted(path.parent.parent for path in (root / "roles").glob("*/meta/argument_specs.yml"))


def check(root: Path = REPO) -> list[Path]:
    """READMEs that are missing or differ from what the specs render."""
    return [
        role_dir / "README.md"
        for role_dir in role_dirs(root)
        if not (role_dir / "README.md").is_file()
        or (role_dir / "README.md").read_text() != render(role_dir, root / "playbooks")
    ]


def write(root: Path = REPO) -> list[Path]:
    """Write every stale README; returns the files written."""
    stale = check(root)
    for readme in stale:
        readme.write_text(render(readme.parent, root / "playbooks"))
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="list stale READMEs and exit 1 instead of writing")
    args = parser.parse_args(argv)
    if args.check:
        stale = check()
        for readme in stale:
            print(f"stale: {readme.relative_to(REPO)} (regenerate with {REGENERATE})", file=sys.stderr)
        return 1 if stale else 0
    for readme in write():
        print(f"wrote {readme.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
