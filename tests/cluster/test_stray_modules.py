"""A stray module in a node's login folder never runs in the roles' node-side Python (they start it with -I; see
tests/test_node_python_isolated.py for every invocation): playbooks/environment.yml, whose python -c steps import json
in that folder, on the private-home cluster with a json.py planted in every node's home.
Run: .venv/bin/python -m pytest -n 0 tests/cluster/test_stray_modules.py  (root).
"""

from __future__ import annotations

import subprocess

from tests.cluster.conftest import REPO, VENV_BIN, LocalCluster, playbook_env

MARKER = "stray-json-ran"
STRAY = f"import pathlib\npathlib.Path(__file__).with_name({MARKER!r}).write_text('imported')\n"


def test_a_stray_json_py_in_the_login_folder_is_never_imported(private_cluster: tuple[LocalCluster, str]) -> None:
    cluster, _ = private_cluster
    strays = [node.home / "json.py" for node in cluster.nodes]
    markers = [node.home / MARKER for node in cluster.nodes]
    try:
        for stray in strays:
            stray.write_text(STRAY)
        # The plant works: a task's python -c without -I, as Ansible runs it on the node, imports it.
        subprocess.run([str(VENV_BIN / "ansible"), "-i", str(cluster.inventory), cluster.nodes[0].name, "-m",
                        "ansible.builtin.command", "-a", "python3 -c 'import json'"],
                       cwd=REPO, env=playbook_env(), capture_output=True, text=True, timeout=120, check=False)
        assert markers[0].read_text() == "imported"
        markers[0].unlink()

        play = cluster.playbook("playbooks/environment.yml", check=False)
        assert [marker for marker in markers if marker.exists()] == []
        assert play.returncode == 0, play.stdout[-3000:]
    finally:
        for path in (*strays, *markers):
            path.unlink(missing_ok=True)
