#!/usr/bin/python
"""Ansible module: from this node, open an SSH session to every target and classify each failure."""

from __future__ import annotations

import errno
import os
import random
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

try:
    import paramiko

    PARAMIKO_ERROR: str | None = None
except ImportError as exc:  # reported by main() with the interpreter's path
    PARAMIKO_ERROR = str(exc)


DOCUMENTATION = r"""
---
module: vidcluster_ssh_probe
short_description: Probe SSH logins from this node to other nodes and classify failures
description:
  - Connects from the node it runs on to every target with paramiko, using one private key and the user's
    known_hosts file with a reject policy (an unknown host key is a failure, never accepted).
  - Probes the targets in a rotated order starting after C(first) (each node starts with a different target), at
    most C(workers) at a time, so every sshd sees about C(workers) new connections at once whatever the cluster size,
    well below OpenSSH's default MaxStartups (10:30:100).
  - A failure that can be passing (timeout, refused, unreachable, a reset) is tried once more after C(retry_pause)
    seconds before it is reported. A login that works but takes more than C(slow) seconds is reported as C(slow).
  - Authenticates and runs C(true) on the target. Never changes anything; always reports C(changed=false).
  - Each result carries a reason code (C(ok), C(slow), C(timeout), C(unreachable), C(refused), C(unknown_host_key),
    C(changed_host_key), C(auth_refused), C(no_key), C(error)) and the exception text.
  - Needs paramiko in the interpreter that runs the module (the node's training environment has it).
options:
  targets:
    description: Hosts to probe.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Inventory name (only used in the results).
        type: str
        required: true
      host:
        description: Address to connect to.
        type: str
        required: true
      port:
        description: SSH port.
        type: int
        default: 22
  user:
    description: Login user on the targets.
    type: str
    required: true
  key_file:
    description: Private key to authenticate with (no agent, no other keys).
    type: path
    required: true
  known_hosts:
    description: known_hosts file with the targets' host keys.
    type: path
    default: ~/.ssh/known_hosts
  timeout:
    description: Seconds for the TCP connect, the banner and authentication, each.
    type: float
    default: 10
  workers:
    description: Connections at a time from this node.
    type: int
    default: 4
  first:
    description: Index in C(targets) of the first target to probe (the list is rotated to start there).
    type: int
    default: 0
  retry_pause:
    description: Seconds before a failure that can be passing is tried again (0 = no retry).
    type: float
    default: 2
  slow:
    description: Seconds above which a working login is reported as C(slow).
    type: float
    default: 5
author:
  - VidCluster
"""

EXAMPLES = r"""
- name: Probe every node from this node
  vidcluster_ssh_probe:
    targets:
      - {name: node0, host: 192.0.2.10}
      - {name: node1, host: 192.0.2.11}
    user: trainer
    key_file: ~/.ssh/vidcluster_rsa
  vars:
    ansible_python_interpreter: ~/vidcluster/venv/bin/python
"""

RETURN = r"""
results:
  description: One entry per target, in the order given.
  returned: always
  type: list
  elements: dict
  contains:
    name: {description: Target inventory name., type: str}
    host: {description: Address connected to., type: str}
    ok: {description: Whether login and C(true) succeeded (C(slow) ones too)., type: bool}
    reason: {description: Reason code (C(ok) or C(slow) on success)., type: str}
    detail: {description: Exception text (of the retry when there was one), empty on success., type: str}
    seconds: {description: Time the (last) probe took., type: float}
    attempts: {description: 1, or 2 when a passing failure was retried., type: int}
"""

def classify(exc: BaseException) -> str:
    """Map an exception from connect/authenticate to a reason code."""
    if isinstance(exc, paramiko.BadHostKeyException):
        return "changed_host_key"
    if isinstance(exc, paramiko.AuthenticationException):
        return "auth_refused"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        codes = {getattr(e, "errno", None) for e in exc.errors.values()}
        return "refused" if codes == {errno.ECONNREFUSED} else "unreachable"
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timeout"
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
        return "unknown_host_key"
    if isinstance(exc, paramiko.SSHException) and "banner" in str(exc).lower():
        return "timeout"
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT):
        return "unreachable"
    return "error"


# Failures that can be passing (a busy sshd dropping a connection, a slow network) get one more try.
PASSING = ("timeout", "refused", "unreachable", "error")


def probe_once(target: dict[str, Any], user: str, pkey: paramiko.PKey, known_hosts: str,
               timeout: float) -> dict[str, Any]:
    start = time.monotonic()
    result = {"name": target["name"], "host": target["host"], "ok": False, "reason": "ok", "detail": ""}
    client = paramiko.SSHClient()
    try:
        if os.path.exists(known_hosts):
            client.load_host_keys(known_hosts)
        # Never trust an unknown key: that would defeat the check.
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(target["host"], port=target["port"], username=user, pkey=pkey,
                       look_for_keys=False, allow_agent=False, timeout=timeout, banner_timeout=timeout,
                       auth_timeout=timeout)
        _, stdout, _ = client.exec_command("true", timeout=timeout)
        status = stdout.channel.recv_exit_status()
        result["ok"] = status == 0
        if status != 0:
            result.update(reason="error", detail=f"'true' exited {status}")
    except Exception as exc:  # every failure becomes a classified result, never a module crash
        reason = classify(exc)
        if reason == "error" and time.monotonic() - start >= timeout * 0.9:
            reason = "timeout"  # the session died while we waited (e.g. "No existing session" after a silent server)
        result.update(reason=reason, detail=f"{type(exc).__name__}: {exc}")
    finally:
        client.close()
    result["seconds"] = round(time.monotonic() - start, 3)
    return result


def probe(target: dict[str, Any], user: str, pkey: paramiko.PKey, known_hosts: str, timeout: float,
          retry_pause: float, slow: float) -> dict[str, Any]:
    """One pair: a try, and one more after a pause when the failure can be passing; 'slow' when it works slowly."""
    result = probe_once(target, user, pkey, known_hosts, timeout)
    attempts = 1
    if result["reason"] in PASSING and retry_pause > 0:
        time.sleep(retry_pause * random.uniform(1.0, 1.5))  # jitter: the retries of many nodes do not line up
        result = probe_once(target, user, pkey, known_hosts, timeout)
        attempts = 2
    if result["ok"] and result["seconds"] > slow:
        result.update(reason="slow", detail=f"login took {result['seconds']:.1f} s")
    result["attempts"] = attempts
    return result


def rotated(targets: list[dict[str, Any]], first: int) -> list[dict[str, Any]]:
    """The targets starting at index ``first``: each node begins with a different peer."""
    if not targets:
        return []
    first %= len(targets)
    return targets[first:] + targets[:first]


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "targets": {"type": "list", "elements": "dict", "required": True, "options": {
                "name": {"type": "str", "required": True},
                "host": {"type": "str", "required": True},
                "port": {"type": "int", "default": 22},
            }},
            "user": {"type": "str", "required": True},
            "key_file": {"type": "path", "required": True, "no_log": False},
            "known_hosts": {"type": "path", "default": "~/.ssh/known_hosts"},
            "timeout": {"type": "float", "default": 10.0},
            "workers": {"type": "int", "default": 4},
            "first": {"type": "int", "default": 0},
            "retry_pause": {"type": "float", "default": 2.0},
            "slow": {"type": "float", "default": 5.0},
        },
        supports_check_mode=True,
    )
    if PARAMIKO_ERROR is not None:
        module.fail_json(msg=missing_required_lib("paramiko") + f" (interpreter: {sys.executable})",
                         exception=PARAMIKO_ERROR)
    params = module.params
    try:
        # Loaded once here: given a file name, paramiko tries every key class and, when the server refuses the
        # key, reports the last class's parse error instead of the refusal.
        pkey = paramiko.PKey.from_path(params["key_file"])
    except (OSError, paramiko.SSHException) as exc:
        results = [{"name": t["name"], "host": t["host"], "ok": False, "reason": "no_key",
                    "detail": f"cannot load {params['key_file']}: {exc}", "seconds": 0.0} for t in params["targets"]]
        module.exit_json(changed=False, results=results)
    order = rotated(params["targets"], params["first"])
    with ThreadPoolExecutor(max_workers=max(1, params["workers"])) as pool:
        results = list(pool.map(
            lambda t: probe(t, params["user"], pkey, params["known_hosts"], params["timeout"], params["retry_pause"],
                            params["slow"]),
            order))
    module.exit_json(changed=False, results=results)


if __name__ == "__main__":
    main()
