"""The cluster_key role's controller half, run on this machine alone: the key pair it keeps and the retired keys it
hands the trust role. The mesh itself (keys on real nodes, rotation end to end) is tests/cluster/test_ssh_mesh.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.cluster.conftest import local_play

ROOT = Path(__file__).resolve().parent.parent
COMMENT = "vidcluster-cluster-key test"


def key_pair(with_text: str) -> tuple[bytes, str]:
    """An ed25519 key pair (OpenSSH private key, public line) whose public key's base64 holds ``with_text``."""
    while True:
        key = Ed25519PrivateKey.generate()
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        if with_text in public.decode().split()[1]:
            private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                        serialization.NoEncryption())
            return private, f"{public.decode()} {COMMENT}"


def retired_keys(tmp_path: Path) -> list[str]:
    """Run the role's controller tasks on this machine; the retired public keys they hand the trust role."""
    out = tmp_path / "retired.json"
    play = [{"hosts": "node0", "gather_facts": False,
             "vars": {"cluster_key_type": "ed25519", "cluster_key_comment": COMMENT,
                      "cluster_key_controller_dir": str(tmp_path / "keys")},
             "tasks": [{"ansible.builtin.include_role": {"name": "cluster_key", "tasks_from": "generate.yml"}},
                       {"ansible.builtin.copy": {"content": "{{ cluster_key_retired | to_json }}", "dest": str(out),
                                                 "mode": "0600"}}]}]
    result = local_play(tmp_path, play)
    assert result.returncode == 0, result.stdout[-3000:]
    return json.loads(out.read_text())


def test_a_key_whose_base64_reads_as_a_pattern_is_matched_as_text(tmp_path: Path) -> None:
    # Base64 has '+': a key taken as a regular expression fails ('multiple repeat' on '++', about one RSA 4096 key
    # in six) or fails to match itself. The current key is never among the retired ones it hands on.
    private, public = key_pair("++")
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    (keys / "cluster_key").write_bytes(private)
    (keys / "cluster_key").chmod(0o600)
    (keys / "cluster_key.pub").write_text(public + "\n")
    _, older = key_pair("")
    (keys / "retired.pub").write_text(f"{older}\n{public}\n")
    assert retired_keys(tmp_path) == [older]
    # the role kept the key pair it found (no rotation asked)
    assert (keys / "cluster_key.pub").read_text().split()[:2] == public.split()[:2]
    assert base64.b64decode(public.split()[1])  # a real key, not a made-up string
