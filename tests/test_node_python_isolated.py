"""Every Python that the roles and playbooks start on a node starts isolated: ``-I`` (no working directory, no
PYTHON* variables, no user site on sys.path), or ``-P`` where it must import the job's shipped trainer (its folder
given explicitly, as PYTHONPATH). A node's Python runs in the login user's home, where a stray ``json.py`` would
otherwise be imported first (tests/cluster/test_node_python_isolated.py runs one).

The roles' YAML (tasks, vars, defaults, templates) and the playbooks are read as text: an interpreter (a word that
names a python) followed by ``-c``, ``-m`` or a ``.py`` script, with only flags between, is an invocation, and it
must carry -I or -P among those flags. The controller's own Python (the repository's code, by design) is the one
exception, named in CONTROLLER with its reason.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Interpreters that run on the controller, where the repository's trainer package is meant to be imported.
CONTROLLER = {
    "ansible_playbook_python": "Ansible's own Python on the controller (the repository's trainer package)",
    "ddp_config_controller_python": "the controller's Python (defaults to ansible_playbook_python)",
    "cluster_check_controller_python": "the controller's Python (defaults to ansible_playbook_python)",
    "python_env_wheelhouse_build_python": "pip download on the controller (delegate_to: localhost)",
}
ISOLATING = {"-I", "-P"}
# A word: a quoted string whole (a Jinja expression in quotes), else a run of anything but separators.
WORD = re.compile(r"""'[^'\n]*'|"[^"\n]*"|[^\s,\[\]()'"]+""")
NOISE = {"-", "+", "{{", "}}", "|", "quote", ">-", "|-", "~"}  # list markers, Jinja's braces and quote filter


def words(text: str) -> list[str]:
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))  # prose says python -m
    found = (w.strip("'\"").strip() for w in WORD.findall(code))
    return [w for w in found if w and w not in NOISE]


def invocations(text: str) -> list[tuple[str, list[str], str]]:
    """(interpreter, the flags before what it runs, what it runs: -c, -m or the script) of every Python started."""
    seq = words(text)
    found = []
    for i, word in enumerate(seq):
        if word not in ("-c", "-m") and not word.rstrip("} ").endswith(".py"):
            continue
        j = i - 1
        while j >= 0 and re.fullmatch(r"-[A-Za-z]+", seq[j]) and seq[j] not in ("-c", "-m"):
            j -= 1  # flags such as -I, -P, -S, -u
        if j >= 0 and "python" in seq[j].lower() and not seq[j].rstrip("} ").endswith(".py"):
            found.append((seq[j], seq[j + 1 : i], word))
    return found


def node_side(interpreter: str) -> bool:
    return not any(name in interpreter for name in CONTROLLER)


def sources() -> list[Path]:
    roles = REPO / "roles"
    return sorted([*roles.glob("*/tasks/*.yml"), *roles.glob("*/vars/*.yml"), *roles.glob("*/defaults/*.yml"),
                   *roles.glob("*/handlers/*.yml"), *roles.glob("*/templates/*"), *(REPO / "playbooks").glob("*.yml"),
                   *REPO.glob("*.yml")])


def test_the_scanner_finds_an_invocation_in_every_form_and_its_flags() -> None:
    forms = {
        '    argv: ["{{ x_python }}", -m, venv, "{{ d }}"]': ("{{ x_python }}", [], "-m"),
        "      - \"{{ y_python | regex_replace('^~', home) }}\"\n      - -I\n      - -c\n": (
            "{{ y_python | regex_replace('^~', home) }}", ["-I"], "-c"),
        "  {{ [z_python, '-P', '-S', '-c', lookup('file', 'a.py')] }}": ("z_python", ["-P", "-S"], "-c"),
        "    cmd: >-\n      {{ w_python | quote }} -m pip download": ("w_python", [], "-m"),
        '    argv: ["{{ v_python }}", "{{ d }}/codeship.py", x]': ("{{ v_python }}", [], "{{ d }}/codeship.py"),
    }
    for text, expected in forms.items():
        assert invocations(text) == [expected], text
    assert invocations("argv: [bash, -c, 'python3 x']\nargv: [ssh, -m, hmac-sha2-256]") == []


def test_every_node_side_python_of_the_roles_and_playbooks_is_isolated() -> None:
    seen, open_ = 0, []
    for path in sources():
        for interpreter, flags, runs in invocations(path.read_text()):
            if not node_side(interpreter):
                continue
            seen += 1
            if not ISOLATING & set(flags):
                open_.append(f"{path.relative_to(REPO)}: {interpreter} {' '.join(flags)} {runs[:40]}")
    assert open_ == [], "node-side Python without -I (or -P):\n" + "\n".join(open_)
    assert seen >= 15, f"only {seen} node-side invocations found: the scanner no longer reads the roles"
