"""cluster_firewall_rules: admit only the cluster's addresses to some TCP ports of this node, with nftables or
iptables, whichever the node has (roles/cluster_firewall).

    state=present  addresses: the IPv4 and IPv6 addresses (or networks) admitted; ports: "29500-29599", "29500" or
                   "ephemeral" (the kernel's net.ipv4.ip_local_port_range, read here); backend: auto (nft when the
                   node has it, else iptables and ip6tables), nftables or iptables.
    state=absent   the rules are removed (nothing else of the node's firewall is touched).

A guard, not an opening: only new TCP connections to the guarded ports are looked at, and the only verdict of these
rules is to refuse (a TCP reset) one that comes from neither the loopback interface nor an admitted address. Whatever
else they see goes on to the node's own rules unjudged (nftables: the chain returns to its base chain, which accepts
only as far as this table goes; iptables: the chain RETURNs to INPUT after its jump), so a site's own rule that drops
a port from some host still drops it. Connections this node opened (their replies) are not new. Both address families
are guarded, so a port listening on every address is not open over IPv6 either.

Idempotent: the rules carry a digest of what they say, and nothing changes when the kernel holds those (changed
false). They are the kernel's until the node reboots. Needs root (become). Returns backend, ports (as guarded) and
addresses.
"""

from __future__ import annotations

import hashlib
import ipaddress
import shutil
import subprocess
from typing import Any

from ansible.module_utils.basic import AnsibleModule

NAME = "vidcluster"  # the nftables table, the iptables chain (upper case)
CHAIN = NAME.upper()
EPHEMERAL = "/proc/sys/net/ipv4/ip_local_port_range"


class FirewallError(Exception):
    """Rules that cannot be installed or removed; the message says why."""


def run(argv: list[str], stdin: str = "", check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise FirewallError(f"{' '.join(argv[:3])}: {(done.stderr or done.stdout).strip()}")
    return done


def port_ranges(ports: list[str]) -> list[tuple[int, int]]:
    """(first, last) of each port, range or "ephemeral"."""
    ranges = []
    for port in ports:
        if port == "ephemeral":
            with open(EPHEMERAL) as f:
                first, last = (int(n) for n in f.read().split())
        else:
            first, last = _range(port)
        if not 0 < first <= last < 65536:
            raise FirewallError(f"port {port!r}: not a TCP port or range (1-65535)")
        ranges.append((first, last))
    return sorted(set(ranges))


def _range(port: str) -> tuple[int, int]:
    first, sep, last = port.partition("-")
    try:
        return int(first), int(last if sep else first)
    except ValueError:
        raise FirewallError(f"port {port!r}: not a TCP port, a range a-b or 'ephemeral'") from None


def networks(addresses: list[str]) -> tuple[list[str], list[str]]:
    """The admitted IPv4 and IPv6 networks, as the tools write them (a single address without its /32 or /128)."""
    v4, v6 = [], []
    for text in addresses:
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise FirewallError(f"{text!r} is not an IP address or network") from None
        written = str(net.network_address) if net.prefixlen == net.max_prefixlen else str(net)
        (v4 if net.version == 4 else v6).append(written)
    return sorted(set(v4)), sorted(set(v6))


class Nftables:
    """One table of its own, inet (both families): replaced in one transaction, deleted whole."""

    def __init__(self, ranges: list[tuple[int, int]], v4: list[str], v6: list[str]) -> None:
        ports = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges)
        body = f"""
  set cluster4 {{
    type ipv4_addr; flags interval;{self._elements(v4)}
  }}
  set cluster6 {{
    type ipv6_addr; flags interval;{self._elements(v6)}
  }}
  chain input {{
    type filter hook input priority filter; policy accept;
    tcp dport {{ {ports} }} ct state new jump guarded
  }}
  chain guarded {{
    iifname "lo" return
    ip saddr @cluster4 return
    ip6 saddr @cluster6 return
    meta l4proto tcp reject with tcp reset
  }}
"""
        self.marker = f"{NAME} {hashlib.sha256(body.encode()).hexdigest()[:16]}"
        self.ruleset = f'table inet {NAME} {{\n  comment "{self.marker}"{body}}}\n'

    @staticmethod
    def _elements(items: list[str]) -> str:
        return f"\n    elements = {{ {', '.join(items)} }}" if items else ""

    def live(self) -> str:
        done = run(["nft", "list", "table", "inet", NAME], check=False)
        return done.stdout if done.returncode == 0 else ""

    def present(self) -> bool:
        if f'comment "{self.marker}"' in self.live():
            return False
        # Declared (empty) first, so the delete cannot fail, then replaced: one transaction.
        run(["nft", "-f", "-"], stdin=f"table inet {NAME}\ndelete table inet {NAME}\n{self.ruleset}")
        return True

    def absent(self) -> bool:
        if not self.live():
            return False
        run(["nft", "delete", "table", "inet", NAME])
        return True


class Iptables:
    """A chain of its own in the filter table of iptables and of ip6tables, jumped to from INPUT for new connections
    to the guarded ports; its first rule (a comment) carries the digest."""

    def __init__(self, ranges: list[tuple[int, int]], v4: list[str], v6: list[str]) -> None:
        ports = ",".join(f"{a}:{b}" if a != b else str(a) for a, b in ranges)
        if len(ranges) > 15:
            raise FirewallError(f"{len(ranges)} port ranges: iptables' multiport takes 15 at most")
        self.jump = ["-p", "tcp", "-m", "multiport", "--dports", ports, "-m", "conntrack", "--ctstate", "NEW", "-j",
                     CHAIN]
        # RETURN, never ACCEPT: INPUT goes on after the jump, so the node's own later rules still decide.
        self.rules = {tool: [["-i", "lo", "-j", "RETURN"], *(["-s", net, "-j", "RETURN"] for net in nets),
                             ["-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"]]
                      for tool, nets in (("iptables", v4), ("ip6tables", v6))}
        text = repr((self.jump, self.rules))
        self.marker = f"{NAME} {hashlib.sha256(text.encode()).hexdigest()[:16]}"

    def _holds(self, tool: str) -> bool:
        chain = run([tool, "-S", CHAIN], check=False)
        jump = run([tool, "-C", "INPUT", *self.jump], check=False)
        return chain.returncode == 0 and f'"{self.marker}"' in chain.stdout and jump.returncode == 0

    def _remove(self, tool: str) -> bool:
        found = run([tool, "-S", "INPUT"], check=False).stdout.splitlines()
        jumps = [line.split()[2:] for line in found if line.startswith("-A INPUT ") and line.endswith(f"-j {CHAIN}")]
        for jump in jumps:
            run([tool, "-D", "INPUT", *jump])
        exists = run([tool, "-S", CHAIN], check=False).returncode == 0
        if exists:
            run([tool, "-F", CHAIN])
            run([tool, "-X", CHAIN])
        return exists or bool(jumps)

    def present(self) -> bool:
        changed = False
        for tool, rules in self.rules.items():
            if self._holds(tool):
                continue
            self._remove(tool)
            run([tool, "-N", CHAIN])
            for rule in [["-m", "comment", "--comment", self.marker], *rules]:
                run([tool, "-A", CHAIN, *rule])
            run([tool, "-I", "INPUT", "1", *self.jump])
            changed = True
        return changed

    def absent(self) -> bool:
        return any([self._remove(tool) for tool in self.rules])


def backend(name: str, ranges: list[tuple[int, int]], v4: list[str], v6: list[str]) -> Nftables | Iptables:
    if name == "auto":
        name = "nftables" if shutil.which("nft") else "iptables" if shutil.which("iptables") else ""
    if name == "nftables" and shutil.which("nft"):
        return Nftables(ranges, v4, v6)
    if name == "iptables" and shutil.which("iptables") and shutil.which("ip6tables"):
        return Iptables(ranges, v4, v6)
    raise FirewallError(f"this node has no {name or 'nft nor iptables'}: install nftables (Debian and Ubuntu: "
                        "apt-get install nftables)")


def main() -> None:
    module = AnsibleModule(argument_spec={
        "state": {"type": "str", "default": "present", "choices": ["present", "absent"]},
        "addresses": {"type": "list", "elements": "str", "default": []},
        "ports": {"type": "list", "elements": "str", "default": []},
        "backend": {"type": "str", "default": "auto", "choices": ["auto", "nftables", "iptables"]},
    })  # fmt: skip
    p: dict[str, Any] = module.params
    try:
        ranges = port_ranges(p["ports"]) if p["state"] == "present" else []
        v4, v6 = networks(p["addresses"])
        if p["state"] == "present" and not ranges:
            raise FirewallError("no port to guard")
        rules = backend(p["backend"], ranges, v4, v6)
        changed = rules.present() if p["state"] == "present" else rules.absent()
    except (FirewallError, OSError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=changed, backend=type(rules).__name__.lower(),
                     ports=[f"{a}-{b}" for a, b in ranges], addresses=v4 + v6)


if __name__ == "__main__":
    main()
