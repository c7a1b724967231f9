"""The job description the launcher hands the renderer (`python -m trainer.node_config --job`) is strict: a key it does
not know, at the top or nested, a value of the wrong kind, a node name that is not one folder name: each refused in
one line naming it, before any file is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainer.config import ConfigError
from trainer.node_config import JobSpec, main
from trainer.runtime.job.straggler import Rules, Treatment
from trainer.runtime.plan import Restarts, Watch

EXPERIMENT = {"CONFIG": {"DATA": {"NUM_CLASSES": 2}, "MODEL": {"NAME": "i3d_tiny"}}}
NODES = [{"name": "n0", "ip": "10.9.0.10", "gpus": 0, "home": "/home/a", "iface": "eth0"},
         {"name": "n1", "ip": "10.9.0.11", "gpus": 0, "home": "/home/b", "iface": "eth0", "devices": None}]
DESCRIBED = {"job_id": "k400-a", "port": 29500, "nodes": NODES, "watch": {"heartbeat_timeout": 20},
             "restarts": {"max_restarts": 5, "node_wait": 60}, "extra_env": {"NCCL_DEBUG": "INFO"}}


def render(tmp_path: Path, described: Any, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    (tmp_path / "exp.yaml").write_text(json.dumps(EXPERIMENT))
    (tmp_path / "job.json").write_text(json.dumps(described))
    code = main(["--config-file", str(tmp_path / "exp.yaml"), "--job", str(tmp_path / "job.json"),
                 "--out-dir", str(tmp_path / "out")])
    return code, capsys.readouterr().err


def with_node(index: int, **change: Any) -> dict[str, Any]:
    nodes = [dict(node) for node in NODES]
    nodes[index].update(change)
    return {**DESCRIBED, "nodes": nodes}


def test_a_correct_description_renders_with_its_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = render(tmp_path, DESCRIBED, capsys)
    assert code == 0, err
    plan = json.loads((tmp_path / "out" / "n1.plan.json").read_text())
    assert plan["restarts"] == {"max_restarts": 5, "node_wait": 60.0, "in_place": True, "min_nodes": None}
    assert plan["watch"] == {"heartbeat_timeout": 20.0, "startup_timeout": 300.0, "stop_grace": 15.0,
                             "hang_factor": 10.0}


@pytest.mark.parametrize(("described", "said"), [
    # The case: max_restarts at the top instead of under restarts was ignored (the job kept 3 restarts).
    ({**DESCRIBED, "max_restarts": 5}, "unknown max_restarts (did you mean restarts?)"),
    ({**DESCRIBED, "gpu_count": 2}, "unknown gpu_count (known: job_id, port, nodes, spares"),
    ({**DESCRIBED, "restart": {"max_restarts": 5}}, "unknown restart (did you mean restarts?)"),
    ({**DESCRIBED, "watch": {"heartbeat_timout": 5}}, "watch: unknown heartbeat_timout "
                                                      "(did you mean heartbeat_timeout?)"),
    (with_node(1, hmoe="/home/b"), "nodes[1]: unknown hmoe (did you mean home?)"),
    ({**DESCRIBED, "port": "29500"}, "port: expected int, got str '29500'"),
    ({**DESCRIBED, "restarts": {"max_restarts": 2.5}}, "restarts: max_restarts: expected int, got float '2.5'"),
    ({**DESCRIBED, "restarts": {"in_place": "false"}}, "restarts: in_place: expected bool, got str 'false'"),
    ({**DESCRIBED, "watch": []}, "watch: expected an object, got list"),
    ({**DESCRIBED, "watch": {"hang_factor": 1.5}}, "watch: hang_factor 1.5 is below 2 (a slower step would be taken "
     "for a hang)"),
    ({**DESCRIBED, "weights_table": "yes"}, "weights_table: expected bool, got str 'yes'"),
    ({**DESCRIBED, "restarts": {"min_nodes": 3}}, "restarts: min_nodes 3 must be between 1 and the job's 2 trainers"),
    ({**DESCRIBED, "restarts": {"min_nodes": 0}}, "restarts: min_nodes 0 must be between 1 and the job's 2 trainers"),
    ({**DESCRIBED, "restarts": {"min_nodes": "1"}}, "restarts: min_nodes: expected int, got str '1'"),
    ({k: v for k, v in DESCRIBED.items() if k != "port"}, "missing port"),
    (with_node(0, name="../x"), "nodes[0]: name '../x': use letters, digits"),
    (with_node(1, name="node 1"), "nodes[1]: name 'node 1': use letters, digits"),
    (with_node(1, name="n0"), "node n0 is listed more than once"),
    (with_node(0, devices=["0"]), "nodes[0]: devices[0]: expected int, got str '0'"),
    ([NODES], "expected an object, got list"),
])  # fmt: skip
def test_a_wrong_key_or_value_is_refused_by_name_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], described: Any, said: str) -> None:
    code, err = render(tmp_path, described, capsys)
    assert code == 2
    assert err.startswith("error: job description: ") and said in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_what_a_description_leaves_out_takes_the_documented_defaults() -> None:
    spec = JobSpec.from_json({"job_id": "k400-a", "port": 29500, "nodes": [NODES[0]]})
    assert (spec.spares, spec.cpu_workers, spec.timeout_seconds, spec.resume, spec.overrides, spec.extra_env,
            spec.code_version, spec.omp_num_threads, spec.weights_table) == ((), 1, 0, "auto", None, None, "dev", 0,
                                                                             False)
    assert (spec.jobs_dir, spec.code_root, spec.env_path) == ("~/vidcluster/jobs", "~/vidcluster/code",
                                                              "~/vidcluster/venv")
    assert spec.watch == Watch(heartbeat_timeout=60.0, startup_timeout=300.0, stop_grace=15.0, hang_factor=10.0)
    assert spec.restarts == Restarts(max_restarts=3, node_wait=300.0, in_place=True)
    assert spec.stragglers == Rules(threshold=0.7, window=300.0, action=Treatment.AUTO, cooldown=1800.0)
    partial = JobSpec.from_json({**DESCRIBED, "watch": {"stop_grace": 5}, "restarts": {"in_place": False}})
    assert partial.watch == Watch(stop_grace=5.0) and partial.restarts == Restarts(in_place=False)
    (node,) = spec.nodes
    assert (node.iface, node.devices, node.device_ids) == ("eth0", None, ())


def test_the_values_given_are_the_values_read() -> None:
    spec = JobSpec.from_json({**DESCRIBED, "stragglers": {"threshold": 0.5, "action": "report"},
                              "nodes": [{**NODES[0], "gpus": 2, "devices": [3, 1]}], "overrides": {"A": {"B": 1}}})
    assert spec.stragglers == Rules(threshold=0.5, action=Treatment.REPORT)
    assert spec.nodes[0].device_ids == (3, 1) and spec.overrides == {"A": {"B": 1}}
    assert spec.extra_env == {"NCCL_DEBUG": "INFO"} and spec.watch.heartbeat_timeout == 20.0
    assert JobSpec.from_json({**DESCRIBED, "watch": {"hang_factor": 2}}).watch.hang_factor == 2.0


@pytest.mark.parametrize(("described", "said"), [
    (with_node(0, ip=None), "job description: nodes[0]: ip: expected str, got NoneType"),
    ({**DESCRIBED, "nodes": [{"name": "n0", "gpus": 0, "home": "/h"}]}, "job description: nodes[0]: missing ip"),
    ({**DESCRIBED, "watch": {"stop_grace": True}}, "job description: watch: stop_grace: expected float, got bool"),
    ({**DESCRIBED, "stragglers": {"action": "sometimes"}}, "job description: stragglers: action: 'sometimes' is not "
     "one of auto, replace, drop, report, off"),
    ({**DESCRIBED, "stragglers": {"treshold": 0.5}}, "job description: stragglers: unknown treshold (did you mean "
     "threshold?)"),
    ({**DESCRIBED, "extra_env": {"NCCL_DEBUG": 1}}, "job description: extra_env: NCCL_DEBUG: expected str, got int"),
    ({**DESCRIBED, "watch": {"hang_factor": 1.99}}, "job description: watch: hang_factor 1.99 is below 2"),
    ({**DESCRIBED, "spares": [NODES[1]]}, "job description: node n1 is listed more than once"),
    ({**DESCRIBED, "cpu_workers": 1.0}, "job description: cpu_workers: expected int, got float"),
    ({**DESCRIBED, "job_id": "a b"}, "job id 'a b': use letters"),
])  # fmt: skip
def test_a_description_read_directly_is_refused_naming_the_fault(described: Any, said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        JobSpec.from_json(described)
    assert str(refused.value).startswith(said), refused.value
