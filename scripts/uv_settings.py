"""pip's install settings as uv's environment (scripts/bootstrap.sh): uv does not read pip's configuration, so the
indexes, wheel folders, constraints, certificate and network settings pip is configured with (a site's mirror, a local
wheelhouse) are handed to uv, one VAR=value per line. A setting that changes what pip installs and has no counterpart
here is refused by name, never dropped. Standard library only: it runs before anything is installed.

    python scripts/uv_settings.py PIP
"""

from __future__ import annotations

import ast
import subprocess
import sys

# pip's setting -> uv's variable; a list setting's entries joined by the separator uv expects (None: one value)
PASSED = {
    "index-url": ("UV_DEFAULT_INDEX", None),
    "extra-index-url": ("UV_EXTRA_INDEX_URL", " "),
    "find-links": ("UV_FIND_LINKS", ","),
    "constraint": ("UV_CONSTRAINT", " "),
    "cert": ("SSL_CERT_FILE", None),
    "trusted-host": ("UV_INSECURE_HOST", " "),
    "default-timeout": ("UV_HTTP_TIMEOUT", None),
    "timeout": ("UV_HTTP_TIMEOUT", None),
    "proxy": ("HTTPS_PROXY", None),
}
# pip's own output and checks: nothing uv installs depends on them
PIP_ONLY = {"disable-pip-version-check", "quiet", "verbose", "no-color", "progress-bar", "root-user-action",
            "no-cache-dir", "cache-dir", "require-virtualenv", "no-input", "retries", "break-system-packages"}


def pip_settings(pip: str) -> dict[str, str]:
    """pip's settings as it reads them: ``pip config list`` prints "<scope>.<key>=<repr>"; environment variables
    (scope ":env:") win over files."""
    listed = subprocess.run([pip, "config", "list"], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in sorted(listed.splitlines(), key=lambda line: line.startswith(":env:")):
        name, _, value = line.partition("=")
        found[name.rpartition(".")[2]] = str(ast.literal_eval(value))
    return found


def uv_environment(settings: dict[str, str]) -> list[str]:
    unknown = sorted(set(settings) - set(PASSED) - PIP_ONLY)
    if unknown:
        raise SystemExit(f"bootstrap: pip's setting(s) {', '.join(unknown)} have no uv counterpart in "
                         "scripts/uv_settings.py: remove them from pip's configuration, or add them there")
    lines = [f"{var}={settings[key] if sep is None else sep.join(settings[key].split())}"
             for key, (var, sep) in PASSED.items() if settings.get(key)]
    return [*lines, "UV_INDEX_STRATEGY=unsafe-best-match"]  # every index weighed, as pip does


if __name__ == "__main__":
    print("\n".join(uv_environment(pip_settings(sys.argv[1]))))
