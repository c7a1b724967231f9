#!/usr/bin/env python3
"""Check every command the docs show: the playbook, module or script it names exists, with the options it uses.

    .venv/bin/python scripts/check_docs_commands.py                # README.md and docs/*.md; exit 1 listing problems
    .venv/bin/python scripts/check_docs_commands.py FILE.md ...    # those pages only

A command is a line of a code block, or an inline code span, that runs `ansible-playbook`, a playbook (`X.yml -e ...`),
a Python module (`python -m M`, also under torchrun or srun), a Python file or a script of the repository. Checked:
- a playbook exists (in the folder a `cd` before it in the block went to, or the repository's root); each `-e NAME=`
  is a variable the playbooks or roles know: a role's default or argument spec, or a name the playbook that runs
  (with the playbooks it imports) or a role's template expression reads; ansible-playbook's own options are real;
- a module of the repository has a file it runs (`M.py` or `M/__main__.py`), another module is installed; a file
  exists;
- a path of the repository a page names in code (`trainer/engine.py`, `roles/stage_data`) exists, or is one that runs
  write (ignored by git: `inventory/hosts.yml`);
- every `--option` of the repository's Python entries is one its code names (a string literal of its module or of the
  repository modules it imports: its argparse options and the words it reads from argv), of a shell script one its text
  names. Other programs' options (torchrun's, srun's) are theirs and not checked.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
PYTHONS = {"python", "python3", "python3.11", "python3.12"}
# lines of a block in these languages are not shell commands
NOT_SHELL = {"yaml", "yml", "json", "text", "python", "ini", "toml"}
_FENCE = re.compile(r"^(\s*)```+\s*([\w-]*)")
_INLINE = re.compile(r"`([^`]+)`")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_JINJA = re.compile(r"\{\{(.*?)\}\}|\{%(.*?)%\}", re.S)
_SEPARATORS = {"&&", "||", ";", "|"}
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, where PyYAML has it: the roles are many files
# a path of the repository as the pages write it in code: its top folder, then the rest
_REPO_PATH = re.compile(r"(?:trainer|roles|playbooks|scripts|bench|tests|inventory|configs|collections|docs)/[\w./-]*")
_DOTTED = re.compile(r"(?:trainer|bench)(?:\.\w+)+")


@dataclass
class Command:
    """One command as the page shows it: where, its words, and the folder it runs in (relative to the repository)."""

    where: str
    words: list[str]
    cwd: Path = field(default=REPO)


@dataclass(frozen=True)
class _CodeLine:
    number: int
    block: int  # which fenced block of the page
    language: str
    text: str


def _blocks(text: str) -> tuple[list[_CodeLine], list[tuple[int, str]]]:
    """Every fenced code line; (first line number, text) of every paragraph of prose around them."""
    code: list[_CodeLine] = []
    prose: list[tuple[int, str]] = []
    language: str | None = None
    block = 0
    paragraph: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        fence = _FENCE.match(line)
        if fence and language is None:
            language, block = fence.group(2).lower(), block + 1
        elif fence:
            language = None
        elif language is not None:
            code.append(_CodeLine(number, block, language, line))
            continue
        if fence or not line.strip():
            if paragraph:
                prose.append((start, " ".join(paragraph)))
            paragraph = []
            continue
        if not paragraph:
            start = number
        paragraph.append(line.strip())
    if paragraph:
        prose.append((start, " ".join(paragraph)))
    return code, prose


def _joined(lines: list[_CodeLine]) -> list[_CodeLine]:
    """Code lines with their backslash continuations joined."""
    out: list[_CodeLine] = []
    for line in lines:
        previous = out[-1] if out else None
        if previous and previous.block == line.block and previous.text.rstrip().endswith("\\"):
            out[-1] = replace(previous, text=previous.text.rstrip()[:-1] + " " + line.text.strip())
        else:
            out.append(line)
    return out


def _words(line: str) -> list[str] | None:
    """The line's words as the shell splits them, comments dropped; None when it is not shell (unbalanced quotes)."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    # optional parts shown as [-e job_id=k400-a]
    return [word.strip("[]") for word in words if word.strip("[]")]


def _split(words: list[str]) -> list[list[str]]:
    """A line's commands, split at && || ; and |."""
    commands: list[list[str]] = [[]]
    for word in words:
        if word in _SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(word)
    return [command for command in commands if command]


def _runs_a_file(words: list[str], i: int) -> bool:
    """Whether words[i] (a .sh or .py) is run: after bash/sh, or first and in the repository's scripts/ or bench/
    (a path in prose, `files/node_check.py`, is not a command)."""
    if i > 0:
        return Path(words[i - 1]).name in {"bash", "sh"}
    return words[i].startswith(("scripts/", "bench/", "./scripts/"))


def _names_an_entry(words: list[str]) -> bool:
    for i, word in enumerate(words):
        base = Path(word).name
        if base == "ansible-playbook" and len(words) > i + 1:  # `ansible-playbook` alone names the program
            return True
        if (base in PYTHONS and i + 1 < len(words)) or (base == "torchrun" and "-m" in words):
            return True
        if word.endswith((".sh", ".py")) and _runs_a_file(words, i):
            return True
        if i == 0 and word.endswith(".yml") and any(w.startswith("-") for w in words[1:]):
            return True
    return False


def commands_in(page: Path) -> list[Command]:
    """Every command a page shows that names a playbook, a Python module or file, or a script."""
    where_prefix = page.relative_to(REPO) if page.is_relative_to(REPO) else page
    code, prose = _blocks(page.read_text())
    found: list[Command] = []
    cwd, block = REPO, 0
    for line in _joined(code):
        if line.block != block:
            cwd, block = REPO, line.block  # each block starts in the repository's root
        words = _words(line.text) if line.language not in NOT_SHELL else None
        for command in _split(words or []):
            if command[0] == "cd" and len(command) == 2:
                cwd = (cwd / command[1]).resolve()
            elif _names_an_entry(command):
                found.append(Command(f"{where_prefix}:{line.number}", command, cwd))
    for number, paragraph in prose:
        for span in _INLINE.findall(paragraph):
            words = _words(span)
            if words and _names_an_entry(words):
                found += [Command(f"{where_prefix}:{number}", command) for command in _split(words)]
    return found


# ---- what is real --------------------------------------------------------------------------------------------------


@functools.cache
def ansible_playbook_options() -> frozenset[str]:
    """ansible-playbook's own options, from its --help."""
    program = Path(sys.executable).with_name("ansible-playbook")
    text = subprocess.run([str(program), "--help"], capture_output=True, text=True, check=True, timeout=60).stdout
    return frozenset(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text))


def _load(text: str) -> object:
    return yaml.load(text, Loader=_LOADER)


def _yaml_files(folder: Path) -> list[Path]:
    return sorted(path for path in folder.rglob("*") if path.suffix in {".yml", ".yaml"} and path.is_file())


@functools.cache
def role_variables() -> frozenset[str]:
    """Every role's defaults and argument-spec options, and every name a role's or collection's expression reads."""
    names: set[str] = set()
    for role in sorted((REPO / "roles").iterdir()):
        defaults = role / "defaults" / "main.yml"
        if defaults.is_file():
            names |= set(_load(defaults.read_text()) or {})
        spec = role / "meta" / "argument_specs.yml"
        if spec.is_file():
            for entry in (_load(spec.read_text()) or {}).get("argument_specs", {}).values():
                names |= set((entry or {}).get("options") or {})
    for path in _yaml_files(REPO / "roles") + _yaml_files(REPO / "collections"):
        for match in _JINJA.finditer(path.read_text()):
            names |= set(_IDENTIFIER.findall(match.group(1) or match.group(2)))
    return frozenset(names)


def _imported_playbooks(playbook: Path) -> list[Path]:
    """The playbook and every playbook it imports, transitively."""
    seen: list[Path] = []
    todo = [playbook]
    while todo:
        current = todo.pop()
        if current in seen or not current.is_file():
            continue
        seen.append(current)
        for play in _load(current.read_text()) or []:
            target = play.get("ansible.builtin.import_playbook") or play.get("import_playbook")
            if target:
                todo.append((current.parent / str(target)).resolve())
    return seen


@functools.cache
def playbook_variables(playbook: Path) -> frozenset[str]:
    """The variables a playbook run knows: every name its playbooks write, and those of the roles."""
    names = set(role_variables())
    for path in _imported_playbooks(playbook):
        names |= set(_IDENTIFIER.findall(path.read_text()))
    return frozenset(names)


def _module_file(module: str, root: Path = REPO) -> Path | None:
    """The file `python -m module` runs from the repository, or None when the repository has no such module."""
    path = root.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__main__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _imports(source: Path) -> tuple[Path, ...]:
    """The repository's Python files a file imports (absolute and relative imports)."""
    tree = _tree(source)
    package = source.parent.relative_to(REPO).parts
    files: list[Path] = []
    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            stem = ".".join([*base, *(node.module.split(".") if node.module else [])])
            modules = [stem] + [f"{stem}.{alias.name}" for alias in node.names]
        for module in modules:
            path = REPO.joinpath(*module.split("."))
            for candidate in (path.with_suffix(".py"), path / "__init__.py"):
                if module and candidate.is_file():
                    files.append(candidate)
    return tuple(files)


@functools.cache
def _tree(source: Path) -> ast.Module:
    return ast.parse(source.read_text(), filename=str(source))


@functools.cache
def _strings(source: Path) -> frozenset[str]:
    """Every string literal of a Python file."""
    return frozenset(
        node.value for node in ast.walk(_tree(source)) if isinstance(node, ast.Constant) and isinstance(node.value, str)
    )


@functools.cache
def python_options(entry: Path) -> frozenset[str]:
    """The option-like string literals (`--name`) of an entry file and of every repository module it imports."""
    options: set[str] = set()
    seen: set[Path] = set()
    todo = [entry]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        strings = _strings(current)
        options |= {text.split("=", 1)[0] for text in strings if text.startswith("--")}
        # a module named by a string runs too (a dispatch table: {"predict": "trainer.predict"})
        todo += [path for text in strings if _DOTTED.fullmatch(text) and (path := _module_file(text)) is not None]
        todo += _imports(current)
    return frozenset(options)


def _installed_module(module: str) -> bool:
    """Whether another package's module is installed, found without importing it (torch imports for seconds)."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None:
        return False
    if not rest:
        return True
    for location in spec.submodule_search_locations or []:
        path = Path(location).joinpath(*rest)
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            return True
    return False


# ---- the checks ------------------------------------------------------------------------------------------------


def _extra_vars(value: str) -> list[str]:
    """The variable names of one -e value: NAME=VALUE pairs, or a JSON/YAML mapping; @file names none."""
    if value.startswith("@"):
        return []
    if value.lstrip().startswith("{"):
        mapping = _load(value)
        return list(mapping) if isinstance(mapping, dict) else [value]
    return [pair.split("=", 1)[0] for pair in value.split()]


def _option_name(word: str) -> str:
    return word.split("=", 1)[0]


def _check_playbook(command: Command, start: int) -> list[str]:
    """Problems of `[ansible-playbook] PLAYBOOK -e ...` whose playbook word is at `start` or after its options."""
    words = command.words
    playbook_word = next((w for w in words[start:] if w.endswith(".yml") and not w.startswith("-")), None)
    if playbook_word is None:
        return [f"{command.where}: ansible-playbook without a playbook: {' '.join(words)}"]
    candidates = [command.cwd / playbook_word, REPO / playbook_word]
    playbook = next((path for path in candidates if path.is_file()), None)
    if playbook is None:
        return [f"{command.where}: no playbook {playbook_word} (in {command.cwd.relative_to(REPO) or '.'})"]
    problems: list[str] = []
    known = playbook_variables(playbook.resolve())
    options = ansible_playbook_options()
    for i, word in enumerate(words):
        if word in {"-e", "--extra-vars"} and i + 1 < len(words):
            try:
                names = _extra_vars(words[i + 1])
            except yaml.YAMLError as exc:
                problems.append(f"{command.where}: -e {words[i + 1]} is not YAML/JSON: {exc}")
                continue
            problems += [
                f"{command.where}: -e {name}: no role or playbook of {playbook_word} knows this variable"
                for name in names
                if name not in known
            ]
        elif word.startswith("-") and words[i - 1] not in {"-e", "--extra-vars"} and _option_name(word) not in options:
            problems.append(f"{command.where}: ansible-playbook has no option {word}")
    return problems


def _check_python(command: Command, options_from: int, entry: Path, what: str) -> list[str]:
    known = python_options(entry)
    return [
        f"{command.where}: {what} has no option {_option_name(word)}"
        for word in command.words[options_from:]
        if word.startswith("--") and _option_name(word) not in known
    ]


def _check_module(command: Command, at: int) -> list[str]:
    """`-m MODULE` at index `at`."""
    if at + 1 >= len(command.words):
        return [f"{command.where}: -m without a module"]
    module = command.words[at + 1]
    entry = _module_file(module)
    if entry is not None:
        return _check_python(command, at + 2, entry, f"python -m {module}")
    if (REPO / module.split(".")[0]).is_dir() or not _installed_module(module):
        return [f"{command.where}: no module {module} (python -m {module})"]
    return []  # another package's module: its options are its own


def _check_file(command: Command, at: int) -> list[str]:
    """A script or Python file named at index `at`."""
    word = command.words[at]
    path = next((p for p in (command.cwd / word, REPO / word) if p.is_file()), None)
    if path is None:
        return [f"{command.where}: no file {word} (in {command.cwd.relative_to(REPO) or '.'})"]
    if path.suffix == ".py":
        return _check_python(command, at + 1, path, word)
    text = path.read_text()
    return [
        f"{command.where}: {word} has no option {_option_name(w)}"
        for w in command.words[at + 1 :]
        if w.startswith("--") and _option_name(w) not in text
    ]


def check_command(command: Command) -> list[str]:
    """Problems of one command (empty: it names what exists, with options it accepts)."""
    words = command.words
    for i, word in enumerate(words):
        base = Path(word).name
        if base == "ansible-playbook":
            return _check_playbook(command, i + 1)
        if i == 0 and word.endswith(".yml"):
            return _check_playbook(command, 0)
        if base in PYTHONS or base == "torchrun":
            for j in range(i + 1, len(words)):
                if words[j] == "-m":
                    return _check_module(command, j)
                if words[j].endswith(".py"):
                    return _check_file(command, j)
            continue
        if word.endswith((".sh", ".py")):
            return _check_file(command, i)
    return []


def missing_paths(pages: list[Path]) -> list[str]:
    """Paths of the repository the pages name in inline code that are not there (a moved module, a renamed role)."""
    named = [
        (page, span)
        for page in pages
        for span in _INLINE.findall(page.read_text())
        if _REPO_PATH.fullmatch(span) and not (REPO / span).exists()
    ]
    if not named:
        return []
    # files that runs write (the demo's inventory) are named but not committed: git ignores them
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"],
        input="\n".join(span for _, span in named),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    ).stdout.split()
    where = {page: page.relative_to(REPO) if page.is_relative_to(REPO) else page for page, _ in named}
    return [f"{where[page]}: no {span} in the repository" for page, span in named if span not in ignored]


def default_pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def check_pages(pages: list[Path]) -> tuple[int, list[str]]:
    """(commands checked, problems) of the pages."""
    commands = [command for page in pages for command in commands_in(page)]
    return len(commands), [problem for command in commands for problem in check_command(command)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pages", nargs="*", type=Path, help="Markdown pages (default: README.md and docs/)")
    args = parser.parse_args(argv)
    pages = [page.resolve() for page in args.pages] or default_pages()
    count, problems = check_pages(pages)
    problems += missing_paths(pages)
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"{count} command(s) checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
